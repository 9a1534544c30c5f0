//! The typed client of the Machines API (`/v1/apps/...`), used by the CLI, deploys and the
//! test kit: apps, machines (create, update, actions, wait, leases, events, exec, logs,
//! versions, traffic), volumes and snapshots, secrets and certificates. Answers decode into
//! the wire types of `bazaar-types`; a failed call is an [`ApiError`] carrying the HTTP
//! status and the server's Fly-shaped `error` message.

use bazaar_placement::exchange::PlacementRecord;
use bazaar_types::api::{
    AddCertificateRequest, App, AppList, AuditList, BatchCreateResponse, Certificate,
    CreateAppRequest, CreateMachineRequest, LeaseResponse, MachineTraffic, MachineVersion,
    OkResponse, SecretList, StatusResponse, UpdateMachineRequest,
};
use bazaar_types::error::ErrorBody;
use bazaar_types::event::MachineEvent;
pub use bazaar_types::host::LeaseRequest;
use bazaar_types::host::{ExecResponse, WaitResponse};
use bazaar_types::machine::Machine;
use bazaar_types::volume::{CreateVolumeRequest, ExtendVolumeResponse, Volume, VolumeSnapshot};
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use std::time::Duration;

/// The lease header of a leased call.
const LEASE_NONCE: &str = "fly-machine-lease-nonce";

/// A failed Machines API call.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The server answered with an error status; `message` is its `error` (or the body).
    #[error("{message} ({status})")]
    Status {
        status: u16,
        message: String,
        /// Fly's machine-readable `status` code, when given.
        code: Option<String>,
    },
    /// The request did not complete.
    #[error("calling {url}")]
    Transport {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// The answer was not the body the call expects.
    #[error("unexpected answer from {url}: {message}")]
    Decode { url: String, message: String },
    /// The client could not be set up (its CA certificate).
    #[error("{0}")]
    Setup(String),
}

impl ApiError {
    /// The HTTP status, if the server answered with an error.
    pub fn status(&self) -> Option<u16> {
        match self {
            ApiError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// The HTTP status of an API error inside an `anyhow` chain, if it is one.
pub fn status_of(e: &(dyn std::error::Error + 'static)) -> Option<u16> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(api) = err.downcast_ref::<ApiError>() {
            return api.status();
        }
        cur = err.source();
    }
    None
}

/// Where an API is and how to reach it.
#[derive(Debug, Clone, Default)]
pub struct FlyOptions {
    /// A PEM bundle of extra roots to trust (the cluster CA of an agent run with
    /// `--api-tls`), besides the system's.
    pub ca_pem: Option<Vec<u8>>,
    /// A whole-request timeout (none when `None`: `logs --follow` streams for ever).
    pub timeout: Option<Duration>,
}

/// A client of one Machines API endpoint with a bearer token.
#[derive(Debug, Clone)]
pub struct FlyClient {
    base: String,
    token: String,
    http: reqwest::Client,
}

impl FlyClient {
    /// A client of `base` (e.g. `http://127.0.0.1:4280`) with a 90 s request timeout.
    pub fn new(base: &str, token: &str) -> FlyClient {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            // Agents close connections idle for their head timeout (10 s).
            .pool_idle_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(90))
            .build()
            .unwrap_or_default();
        FlyClient::with_http(base, token, http)
    }

    /// A client with `options` (trusted CA, timeout).
    pub fn with_options(
        base: &str,
        token: &str,
        options: &FlyOptions,
    ) -> Result<FlyClient, ApiError> {
        let mut builder = reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .pool_idle_timeout(Duration::from_secs(5));
        if let Some(pem) = &options.ca_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| ApiError::Setup(format!("not a PEM certificate: {e}")))?;
            builder = builder.tls_certs_merge(certs);
        }
        if let Some(t) = options.timeout {
            builder = builder.timeout(t);
        }
        let http = builder
            .build()
            .map_err(|e| ApiError::Setup(format!("HTTP client: {e}")))?;
        Ok(FlyClient::with_http(base, token, http))
    }

    /// A client calling through `http` (one the caller already keeps).
    pub fn with_http(base: &str, token: &str, http: reqwest::Client) -> FlyClient {
        FlyClient {
            base: base.trim_end_matches('/').to_string(),
            token: token.to_string(),
            http,
        }
    }

    /// The server's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The URL of `path` under `/v1`.
    pub fn url(&self, path: &str) -> String {
        format!("{}/v1{path}", self.base)
    }

    /// `method /v1{path}` with the token, an optional JSON body and lease nonce: the answer
    /// as it came (status and body), whatever the status. Reads (GET) are retried twice on
    /// connection errors, as fly-go does.
    pub async fn raw(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        nonce: Option<&str>,
    ) -> Result<(u16, bytes::Bytes), ApiError> {
        let url = self.url(path);
        let mut attempt = 0;
        loop {
            let mut req = self
                .http
                .request(method.clone(), &url)
                .bearer_auth(&self.token);
            if let Some(b) = body {
                req = req.json(b);
            }
            if let Some(n) = nonce {
                req = req.header(LEASE_NONCE, n);
            }
            let resp = match req.send().await {
                Ok(r) => r,
                Err(_) if method == Method::GET && attempt < 2 => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                Err(source) => return Err(ApiError::Transport { url, source }),
            };
            let status = resp.status().as_u16();
            let bytes = resp.bytes().await.map_err(|source| ApiError::Transport {
                url: url.clone(),
                source,
            })?;
            return Ok((status, bytes));
        }
    }

    /// `method /v1{path}`, decoded as `T`; an error status is an [`ApiError::Status`]. A body
    /// that is not JSON decodes as a JSON string.
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        nonce: Option<&str>,
    ) -> Result<T, ApiError> {
        let (status, bytes) = self.raw(method, path, body, nonce).await?;
        if !(200..300).contains(&status) {
            let (message, code) = match serde_json::from_slice::<ErrorBody>(&bytes) {
                Ok(b) => (b.error, b.status),
                Err(_) => (String::from_utf8_lossy(&bytes).into_owned(), None),
            };
            return Err(ApiError::Status {
                status,
                message,
                code,
            });
        }
        let value: Value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        serde_json::from_value(value).map_err(|e| ApiError::Decode {
            url: self.url(path),
            message: e.to_string(),
        })
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ApiError> {
        self.call(Method::GET, path, None, None).await
    }

    async fn send<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: &B,
        nonce: Option<&str>,
    ) -> Result<T, ApiError> {
        let body = serde_json::to_value(body).map_err(|e| ApiError::Decode {
            url: self.url(path),
            message: format!("encoding the request: {e}"),
        })?;
        self.call(method, path, Some(&body), nonce).await
    }

    // Apps.

    /// Creates an app in organization `org`.
    pub async fn create_app(&self, name: &str, org: &str) -> Result<App, ApiError> {
        let req = CreateAppRequest {
            app_name: name.to_string(),
            org_slug: org.to_string(),
        };
        self.send(Method::POST, "/apps", &req, None).await
    }

    /// Every app.
    pub async fn apps(&self) -> Result<AppList, ApiError> {
        self.get("/apps").await
    }

    /// One app.
    pub async fn app(&self, name: &str) -> Result<App, ApiError> {
        self.get(&format!("/apps/{name}")).await
    }

    /// Whether the app exists.
    pub async fn app_exists(&self, name: &str) -> Result<bool, ApiError> {
        match self.app(name).await {
            Ok(_) => Ok(true),
            Err(e) if e.status() == Some(404) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Destroys an app and its machines (the server's answer).
    pub async fn destroy_app(&self, name: &str) -> Result<StatusResponse, ApiError> {
        self.call(Method::DELETE, &format!("/apps/{name}"), None, None)
            .await
    }

    /// Every change made to the app through the API, oldest first.
    pub async fn audit(&self, app: &str) -> Result<AuditList, ApiError> {
        self.get(&format!("/apps/{app}/audit")).await
    }

    // Machines.

    fn machine_path(app: &str, id: &str, rest: &str) -> String {
        format!("/apps/{app}/machines/{id}{rest}")
    }

    /// The app's machines, destroyed ones excluded.
    pub async fn machines(&self, app: &str) -> Result<Vec<Machine>, ApiError> {
        self.get(&format!("/apps/{app}/machines")).await
    }

    /// The app's machines, destroyed ones the catalog still knows included (those, and the
    /// machines of hosts that do not answer, as the catalog shows them).
    pub async fn machines_including_deleted(&self, app: &str) -> Result<Vec<Machine>, ApiError> {
        self.get(&format!("/apps/{app}/machines?include_deleted=true"))
            .await
    }

    /// One machine.
    pub async fn machine(&self, app: &str, id: &str) -> Result<Machine, ApiError> {
        self.get(&Self::machine_path(app, id, "")).await
    }

    /// Creates one machine.
    pub async fn create_machine(
        &self,
        app: &str,
        req: &CreateMachineRequest,
    ) -> Result<Machine, ApiError> {
        self.send(Method::POST, &format!("/apps/{app}/machines"), req, None)
            .await
    }

    /// Creates up to `req.count` machines of one config (batch placement); a batch may place
    /// fewer than asked.
    pub async fn create_machines(
        &self,
        app: &str,
        req: &CreateMachineRequest,
    ) -> Result<BatchCreateResponse, ApiError> {
        self.send(
            Method::POST,
            &format!("/apps/{app}/machines/batch"),
            req,
            None,
        )
        .await
    }

    /// Replaces a machine's config (holding its lease when `nonce` is given).
    pub async fn update_machine(
        &self,
        app: &str,
        id: &str,
        req: &UpdateMachineRequest,
        nonce: Option<&str>,
    ) -> Result<Machine, ApiError> {
        self.send(Method::POST, &Self::machine_path(app, id, ""), req, nonce)
            .await
    }

    /// A POST to a machine's sub-resource (`start`, `stop`, `restart`, `suspend`, `cordon`,
    /// `uncordon`, ...) with `body` (`{}` when `None`): the server's answer.
    pub async fn action(
        &self,
        app: &str,
        id: &str,
        action: &str,
        body: Option<&Value>,
        nonce: Option<&str>,
    ) -> Result<Value, ApiError> {
        let empty = json!({});
        self.call(
            Method::POST,
            &Self::machine_path(app, id, &format!("/{action}")),
            Some(body.unwrap_or(&empty)),
            nonce,
        )
        .await
    }

    /// Destroys a machine (`force` kills a running one): the server's answer.
    pub async fn destroy_machine(
        &self,
        app: &str,
        id: &str,
        force: bool,
        nonce: Option<&str>,
    ) -> Result<Value, ApiError> {
        let path = Self::machine_path(app, id, &format!("?force={force}"));
        self.call(Method::DELETE, &path, None, nonce).await
    }

    /// Waits (server side, 1 to 60 s) for a state, optionally of a config version.
    pub async fn wait(
        &self,
        app: &str,
        id: &str,
        state: &str,
        version: Option<&str>,
        timeout: Duration,
    ) -> Result<WaitResponse, ApiError> {
        let secs = timeout.as_secs().clamp(1, 60);
        let mut rest = format!("/wait?state={state}&timeout={secs}");
        if let Some(v) = version {
            rest.push_str(&format!("&version={v}"));
        }
        self.get(&Self::machine_path(app, id, &rest)).await
    }

    /// Takes a lease (or, with the `nonce` of the lease held, refreshes it); the answer
    /// carries its nonce.
    pub async fn lease(
        &self,
        app: &str,
        id: &str,
        req: &LeaseRequest,
        nonce: Option<&str>,
    ) -> Result<LeaseResponse, ApiError> {
        self.send(
            Method::POST,
            &Self::machine_path(app, id, "/lease"),
            req,
            nonce,
        )
        .await
    }

    /// Releases the lease held with `nonce`.
    pub async fn release_lease(&self, app: &str, id: &str, nonce: &str) -> Result<(), ApiError> {
        let path = Self::machine_path(app, id, "/lease");
        self.call::<Value>(Method::DELETE, &path, None, Some(nonce))
            .await
            .map(drop)
    }

    /// Sets one metadata key of a machine (holding its lease when `nonce` is given).
    pub async fn set_metadata(
        &self,
        app: &str,
        id: &str,
        key: &str,
        value: &str,
        nonce: Option<&str>,
    ) -> Result<(), ApiError> {
        let path = Self::machine_path(app, id, &format!("/metadata/{key}"));
        self.call::<Value>(Method::POST, &path, Some(&json!({ "value": value })), nonce)
            .await
            .map(drop)
    }

    /// The machine's events, newest first.
    pub async fn events(&self, app: &str, id: &str) -> Result<Vec<MachineEvent>, ApiError> {
        self.get(&Self::machine_path(app, id, "/events")).await
    }

    /// Runs `command` in the machine.
    pub async fn exec(
        &self,
        app: &str,
        id: &str,
        command: &[String],
    ) -> Result<ExecResponse, ApiError> {
        let body = json!({ "command": command });
        self.call(
            Method::POST,
            &Self::machine_path(app, id, "/exec"),
            Some(&body),
            None,
        )
        .await
    }

    /// The machine's log as JSON lines (`{ts, stream, line}`): the open response, to read
    /// whole or (with `follow`) as it streams.
    pub async fn logs(
        &self,
        app: &str,
        id: &str,
        follow: bool,
    ) -> Result<reqwest::Response, ApiError> {
        let url = self.url(&Self::machine_path(
            app,
            id,
            &format!("/logs?follow={follow}"),
        ));
        let mut req = self.http.get(&url).bearer_auth(&self.token);
        if follow {
            // A followed log streams until the caller stops reading, past any timeout the
            // client was built with.
            req = req.timeout(Duration::from_secs(365 * 86_400));
        }
        let resp = req.send().await.map_err(|source| ApiError::Transport {
            url: url.clone(),
            source,
        })?;
        let status = resp.status().as_u16();
        if !(200..300).contains(&status) {
            let message = resp.text().await.unwrap_or_default();
            return Err(ApiError::Status {
                status,
                message,
                code: None,
            });
        }
        Ok(resp)
    }

    /// Why and where the market placed the machine: the exchange's record of its rounds.
    pub async fn placement(&self, app: &str, id: &str) -> Result<PlacementRecord, ApiError> {
        self.get(&Self::machine_path(app, id, "/placement")).await
    }

    /// The machine's config versions, newest first.
    pub async fn versions(&self, app: &str, id: &str) -> Result<Vec<MachineVersion>, ApiError> {
        self.get(&Self::machine_path(app, id, "/versions")).await
    }

    /// What the machine serves right now (its host's proxy counts it).
    pub async fn traffic(&self, app: &str, id: &str) -> Result<MachineTraffic, ApiError> {
        self.get(&Self::machine_path(app, id, "/traffic")).await
    }

    // Volumes.

    /// Creates (or forks, or restores) a volume.
    pub async fn create_volume(
        &self,
        app: &str,
        req: &CreateVolumeRequest,
    ) -> Result<Volume, ApiError> {
        self.send(Method::POST, &format!("/apps/{app}/volumes"), req, None)
            .await
    }

    /// The app's volumes.
    pub async fn volumes(&self, app: &str) -> Result<Vec<Volume>, ApiError> {
        self.get(&format!("/apps/{app}/volumes")).await
    }

    /// One volume.
    pub async fn volume(&self, app: &str, id: &str) -> Result<Volume, ApiError> {
        self.get(&format!("/apps/{app}/volumes/{id}")).await
    }

    /// Grows a volume to `size_gb`.
    pub async fn extend_volume(
        &self,
        app: &str,
        id: &str,
        size_gb: u64,
    ) -> Result<ExtendVolumeResponse, ApiError> {
        let body = json!({ "size_gb": size_gb });
        self.call(
            Method::PUT,
            &format!("/apps/{app}/volumes/{id}/extend"),
            Some(&body),
            None,
        )
        .await
    }

    /// Deletes a volume.
    pub async fn destroy_volume(&self, app: &str, id: &str) -> Result<Volume, ApiError> {
        self.call(
            Method::DELETE,
            &format!("/apps/{app}/volumes/{id}"),
            None,
            None,
        )
        .await
    }

    /// A volume's snapshots, oldest first.
    pub async fn snapshots(&self, app: &str, id: &str) -> Result<Vec<VolumeSnapshot>, ApiError> {
        self.get(&format!("/apps/{app}/volumes/{id}/snapshots"))
            .await
    }

    /// Takes a snapshot of a volume now.
    pub async fn create_snapshot(&self, app: &str, id: &str) -> Result<VolumeSnapshot, ApiError> {
        self.call(
            Method::POST,
            &format!("/apps/{app}/volumes/{id}/snapshots"),
            Some(&json!({})),
            None,
        )
        .await
    }

    // Secrets.

    /// The app's secrets (names and digests).
    pub async fn secrets(&self, app: &str) -> Result<SecretList, ApiError> {
        self.get(&format!("/apps/{app}/secrets")).await
    }

    /// bazaar extension: the quota of organization `org`, or of its app `app`, with what is
    /// in use as the answering node counts it.
    pub async fn quota(
        &self,
        org: &str,
        app: Option<&str>,
    ) -> Result<bazaar_types::quota::QuotaStatus, ApiError> {
        self.get(&quota_path(org, app)).await
    }

    /// bazaar extension: replaces the limits of organization `org`'s quota, or of its app
    /// `app` (a resource left out has none).
    pub async fn set_quota(
        &self,
        org: &str,
        app: Option<&str>,
        limits: &bazaar_types::quota::Limits,
    ) -> Result<bazaar_types::quota::QuotaStatus, ApiError> {
        self.send(Method::POST, &quota_path(org, app), limits, None)
            .await
    }

    /// Sets (a string) or removes (`null`) secrets in one change: the server's answer.
    pub async fn update_secrets(
        &self,
        app: &str,
        values: &serde_json::Map<String, Value>,
    ) -> Result<SecretList, ApiError> {
        let body = json!({ "values": values });
        self.call(
            Method::POST,
            &format!("/apps/{app}/secrets"),
            Some(&body),
            None,
        )
        .await
    }

    // Certificates.

    /// Attaches a hostname (issued by ACME, or the given chain and key).
    pub async fn add_certificate(
        &self,
        app: &str,
        req: &AddCertificateRequest,
    ) -> Result<Certificate, ApiError> {
        self.send(
            Method::POST,
            &format!("/apps/{app}/certificates"),
            req,
            None,
        )
        .await
    }

    /// The app's certificates.
    pub async fn certificates(&self, app: &str) -> Result<Vec<Certificate>, ApiError> {
        self.get(&format!("/apps/{app}/certificates")).await
    }

    /// One hostname's certificate.
    pub async fn certificate(&self, app: &str, hostname: &str) -> Result<Certificate, ApiError> {
        self.get(&format!("/apps/{app}/certificates/{hostname}"))
            .await
    }

    /// Detaches a hostname: the server's answer.
    pub async fn remove_certificate(
        &self,
        app: &str,
        hostname: &str,
    ) -> Result<OkResponse, ApiError> {
        self.call(
            Method::DELETE,
            &format!("/apps/{app}/certificates/{hostname}"),
            None,
            None,
        )
        .await
    }
}

fn quota_path(org: &str, app: Option<&str>) -> String {
    match app {
        Some(app) => format!("/orgs/{org}/apps/{app}/quota"),
        None => format!("/orgs/{org}/quota"),
    }
}
