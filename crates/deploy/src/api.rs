//! The Machines API client deploys use: the calls flyctl makes (list, batch create, update,
//! destroy, stop, wait, leases, cordon, versions, metadata), with Fly-shaped errors turned
//! into messages.

use anyhow::Context;
use bazaar_types::config::MachineConfig;
use reqwest::Method;
use serde_json::{json, Value};
use std::time::Duration;

/// A Machines API endpoint and token.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    token: String,
    http: reqwest::Client,
}

/// An API error with its HTTP status.
#[derive(Debug)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.status)
    }
}

impl std::error::Error for ApiError {}

impl Client {
    /// A client of `base` (e.g. `http://127.0.0.1:4280`) with a bearer token.
    pub fn new(base: &str, token: &str) -> Client {
        Client {
            base: base.trim_end_matches('/').to_string(),
            token: token.to_string(),
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(64)
                .timeout(Duration::from_secs(90))
                .build()
                .unwrap_or_default(),
        }
    }

    /// One call; `nonce` is sent as `fly-machine-lease-nonce`.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        nonce: Option<&str>,
    ) -> anyhow::Result<Value> {
        let url = format!("{}/v1{path}", self.base);
        let mut attempt = 0;
        loop {
            let mut req = self
                .http
                .request(method.clone(), &url)
                .bearer_auth(&self.token);
            if let Some(b) = &body {
                req = req.json(b);
            }
            if let Some(n) = nonce {
                req = req.header("fly-machine-lease-nonce", n);
            }
            let resp = match req.send().await {
                Ok(r) => r,
                // Reads are retried on connection errors, as fly-go does.
                Err(e) if method == Method::GET && attempt < 2 => {
                    attempt += 1;
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                Err(e) => return Err(e).with_context(|| format!("calling {method} {url}")),
            };
            let status = resp.status();
            let text = resp.text().await.unwrap_or_default();
            let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text.clone()));
            if !status.is_success() {
                let message = value["error"]
                    .as_str()
                    .or(value["message"].as_str())
                    .map(str::to_string)
                    .unwrap_or(text);
                return Err(ApiError {
                    status: status.as_u16(),
                    message,
                }
                .into());
            }
            return Ok(value);
        }
    }

    /// The app exists (or not).
    pub async fn app_exists(&self, app: &str) -> anyhow::Result<bool> {
        match self
            .call(Method::GET, &format!("/apps/{app}"), None, None)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if status_of(&e) == Some(404) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Creates an app.
    pub async fn create_app(&self, app: &str) -> anyhow::Result<()> {
        self.call(
            Method::POST,
            "/apps",
            Some(json!({"app_name": app, "org_slug": "personal"})),
            None,
        )
        .await?;
        Ok(())
    }

    /// The app's machines (full objects), destroyed ones excluded.
    pub async fn machines(&self, app: &str) -> anyhow::Result<Vec<Value>> {
        let v = self
            .call(Method::GET, &format!("/apps/{app}/machines"), None, None)
            .await?;
        Ok(v.as_array().cloned().unwrap_or_default())
    }

    /// Every machine of the app the catalog still knows, destroyed ones included (summary).
    pub async fn machines_with_deleted(&self, app: &str) -> anyhow::Result<Vec<Value>> {
        let v = self
            .call(
                Method::GET,
                &format!("/apps/{app}/machines?include_deleted=true&summary=true"),
                None,
                None,
            )
            .await?;
        Ok(v.as_array().cloned().unwrap_or_default())
    }

    /// One machine.
    pub async fn machine(&self, app: &str, id: &str) -> anyhow::Result<Value> {
        self.call(
            Method::GET,
            &format!("/apps/{app}/machines/{id}"),
            None,
            None,
        )
        .await
    }

    /// The requests and connections a machine is serving right now (its host's proxy
    /// counts them).
    pub async fn in_flight(&self, app: &str, id: &str) -> anyhow::Result<u64> {
        let v = self
            .call(
                Method::GET,
                &format!("/apps/{app}/machines/{id}/traffic"),
                None,
                None,
            )
            .await?;
        v["in_flight"]
            .as_u64()
            .ok_or_else(|| anyhow::anyhow!("machine {id}: no in_flight in {v}"))
    }

    /// Creates up to `count` machines of one config in `region` (batch placement), each
    /// leased; a batch may place fewer than asked (the caller asks again for the rest).
    pub async fn create(
        &self,
        app: &str,
        config: &MachineConfig,
        region: &str,
        count: usize,
        cordoned: bool,
        lease_ttl: u64,
    ) -> anyhow::Result<Vec<Value>> {
        let v = self
            .call(
                Method::POST,
                &format!("/apps/{app}/machines/batch"),
                Some(json!({
                    "config": config,
                    "region": region,
                    "count": count,
                    "skip_service_registration": cordoned,
                    "lease_ttl": lease_ttl,
                })),
                None,
            )
            .await?;
        Ok(v["machines"].as_array().cloned().unwrap_or_default())
    }

    /// Replaces a machine's config: it restarts with it, or with `skip_launch` stays
    /// stopped.
    pub async fn update(
        &self,
        app: &str,
        id: &str,
        config: &MachineConfig,
        skip_launch: bool,
        nonce: Option<&str>,
    ) -> anyhow::Result<Value> {
        self.call(
            Method::POST,
            &format!("/apps/{app}/machines/{id}"),
            Some(json!({"config": config, "skip_launch": skip_launch})),
            nonce,
        )
        .await
    }

    /// A POST to a machine's sub-resource (`start`, `stop`, `cordon`, ...).
    pub async fn action(
        &self,
        app: &str,
        id: &str,
        action: &str,
        body: Option<Value>,
        nonce: Option<&str>,
    ) -> anyhow::Result<Value> {
        self.call(
            Method::POST,
            &format!("/apps/{app}/machines/{id}/{action}"),
            body,
            nonce,
        )
        .await
    }

    /// Destroys a machine that is not running (a running one is refused: 412).
    pub async fn destroy(&self, app: &str, id: &str, nonce: Option<&str>) -> anyhow::Result<()> {
        self.call(
            Method::DELETE,
            &format!("/apps/{app}/machines/{id}"),
            None,
            nonce,
        )
        .await?;
        Ok(())
    }

    /// Waits (server side, ≤ 60 s per call) for a state, optionally of a version.
    pub async fn wait(
        &self,
        app: &str,
        id: &str,
        state: &str,
        version: Option<&str>,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let secs = timeout.as_secs().clamp(1, 60);
        let mut path = format!("/apps/{app}/machines/{id}/wait?state={state}&timeout={secs}");
        if let Some(v) = version {
            path.push_str(&format!("&version={v}"));
        }
        self.call(Method::GET, &path, None, None).await?;
        Ok(())
    }

    /// A machine's config versions, newest first: (version, config).
    pub async fn versions(
        &self,
        app: &str,
        id: &str,
    ) -> anyhow::Result<Vec<(String, MachineConfig)>> {
        let v = self
            .call(
                Method::GET,
                &format!("/apps/{app}/machines/{id}/versions"),
                None,
                None,
            )
            .await?;
        let mut out = Vec::new();
        for e in v.as_array().into_iter().flatten() {
            let version = e["version"].as_str().unwrap_or_default().to_string();
            if let Ok(cfg) = serde_json::from_value(e["user_config"].clone()) {
                out.push((version, cfg));
            }
        }
        Ok(out)
    }
}

/// The HTTP status of an API error, if it is one.
pub fn status_of(e: &anyhow::Error) -> Option<u16> {
    e.downcast_ref::<ApiError>().map(|e| e.status)
}
