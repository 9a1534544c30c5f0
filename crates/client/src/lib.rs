//! HTTP clients of a bazaar agent: [`HostClient`] for its host interface (`/host/v1`), used
//! by the CLI, the test kit and the benchmarks, and [`fly::FlyClient`] for its Machines API
//! (`/v1`), used by the CLI, deploys and the test kit. Errors carry the server's Fly-shaped
//! message.
#![forbid(unsafe_code)]

pub mod fly;

pub use fly::{ApiError, FlyClient, FlyOptions};

use bazaar_types::api::{CatalogHost, CatalogMachine};
use bazaar_types::error::ErrorBody;
use bazaar_types::event::MachineEvent;
use bazaar_types::host::{
    BidRequest, BidResponse, ClaimRequest, GossipKeyChange, GossipKeys, HostInfo, ImageSummary,
    PruneReport, PullLine, StopRequest, UpdateRequest, WaitResponse,
};
use bazaar_types::machine::Machine;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::time::Duration;

/// A failed call.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with an error status.
    #[error("{status}: {message}")]
    Status {
        status: u16,
        message: String,
        code: Option<String>,
    },
    /// The request did not complete.
    #[error("request to {url} failed: {source}")]
    Transport {
        url: String,
        #[source]
        source: reqwest::Error,
    },
}

impl ClientError {
    /// The HTTP status, if the server answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Status { status, .. } => Some(*status),
            ClientError::Transport { .. } => None,
        }
    }
}

/// A client for one agent.
#[derive(Debug, Clone)]
pub struct HostClient {
    base: String,
    token: String,
    http: reqwest::Client,
}

impl HostClient {
    /// A client for the agent at `base` (e.g. `http://127.0.0.1:4280`).
    pub fn new(base: &str, token: &str) -> HostClient {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(64)
            // Agents close connections idle for their head timeout (10 s).
            .pool_idle_timeout(Duration::from_secs(5))
            .build()
            .unwrap_or_default();
        HostClient {
            base: base.trim_end_matches('/').to_string(),
            token: token.to_string(),
            http,
        }
    }

    /// A client for the agent at `base` calling through `http` (one the caller keeps: with
    /// the roots to trust for an agent serving HTTPS, and no whole-request timeout, which a
    /// pull's stream of progress lines may outlast).
    pub fn with_http(base: &str, token: &str, http: reqwest::Client) -> HostClient {
        HostClient {
            base: base.trim_end_matches('/').to_string(),
            token: token.to_string(),
            http,
        }
    }

    /// A client for another agent at `base`, with this one's token and HTTP client.
    pub fn for_base(&self, base: &str) -> HostClient {
        HostClient::with_http(base, &self.token, self.http.clone())
    }

    /// The base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    fn url(&self, path: &str) -> String {
        format!("{}/host/v1{}", self.base, path)
    }

    /// A GET of `path` from the server's root (not under `/host/v1`).
    async fn get_root<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let url = format!("{}{path}", self.base);
        self.send(self.http.get(&url), url).await
    }

    /// Sends a prepared request with the bearer token; the answer unread.
    async fn transmit(
        &self,
        req: reqwest::RequestBuilder,
        url: &str,
    ) -> Result<reqwest::Response, ClientError> {
        req.bearer_auth(&self.token)
            .header(
                bazaar_types::host::HOST_FORMAT_HEADER,
                bazaar_types::host::HOST_FORMAT.to_string(),
            )
            .send()
            .await
            .map_err(|source| ClientError::Transport {
                url: url.to_string(),
                source,
            })
    }

    /// Sends a prepared request (bearer token added) and decodes the answer.
    pub async fn send<T: DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
        url: String,
    ) -> Result<T, ClientError> {
        let resp = self.transmit(req, &url).await?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|source| ClientError::Transport {
                url: url.clone(),
                source,
            })?;
        if !status.is_success() {
            return Err(status_error(status.as_u16(), &bytes));
        }
        let body: &[u8] = if bytes.is_empty() { b"null" } else { &bytes };
        if status == reqwest::StatusCode::NO_CONTENT {
            return serde_json::from_slice(b"null").map_err(|e| ClientError::Status {
                status: 204,
                message: format!("unexpected empty response: {e}"),
                code: None,
            });
        }
        serde_json::from_slice(body).map_err(|e| ClientError::Status {
            status: status.as_u16(),
            message: format!("unexpected response body: {e}"),
            code: None,
        })
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let url = self.url(path);
        self.send(self.http.get(&url), url).await
    }

    async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        let url = self.url(path);
        self.send(self.http.post(&url).json(body), url).await
    }

    /// The raw POST of a body (tests use it to send malformed JSON).
    pub async fn post_raw(
        &self,
        path: &str,
        body: &'static str,
    ) -> Result<serde_json::Value, ClientError> {
        let url = self.url(path);
        self.send(
            self.http
                .post(&url)
                .header("content-type", "application/json")
                .body(body),
            url,
        )
        .await
    }

    /// Host description.
    pub async fn info(&self) -> Result<HostInfo, ClientError> {
        self.get("/info").await
    }

    /// Drains the host (`draining`: it takes no new machines) or takes it back; the answer
    /// is its description after the change.
    pub async fn set_draining(&self, draining: bool) -> Result<HostInfo, ClientError> {
        let url = self.url("/drain");
        let body = serde_json::to_vec(&bazaar_types::host::DrainRequest { draining })
            .expect("a drain request serializes");
        self.send(
            self.http
                .put(&url)
                .header("content-type", "application/json")
                .body(body),
            url,
        )
        .await
    }

    /// Has the agent copy its store consistently under its data dir (`bazaar host
    /// backup`); the answer names the host and the copy's path.
    pub async fn copy_store(&self) -> Result<serde_json::Value, ClientError> {
        self.post("/backup", &serde_json::json!({})).await
    }

    /// Asks for a bid.
    pub async fn bid(&self, req: &BidRequest) -> Result<BidResponse, ClientError> {
        self.post("/bids", req).await
    }

    /// Claims a reservation.
    pub async fn claim(
        &self,
        reservation_id: &str,
        req: &ClaimRequest,
    ) -> Result<Machine, ClientError> {
        self.post(&format!("/reservations/{reservation_id}/claim"), req)
            .await
    }

    /// Releases a reservation.
    pub async fn release(&self, reservation_id: &str) -> Result<serde_json::Value, ClientError> {
        let url = self.url(&format!("/reservations/{reservation_id}"));
        self.send(self.http.delete(&url), url).await
    }

    /// Creates a machine on this host directly.
    pub async fn create(&self, req: &ClaimRequest) -> Result<Machine, ClientError> {
        self.post("/machines", req).await
    }

    /// Creates a volume on this host directly.
    pub async fn create_volume(
        &self,
        req: &bazaar_types::volume::HostVolumeCreate,
    ) -> Result<bazaar_types::volume::Volume, ClientError> {
        self.post("/volumes", req).await
    }

    /// This host's volumes (of one app, if given).
    pub async fn volumes(
        &self,
        app: Option<&str>,
    ) -> Result<Vec<bazaar_types::volume::Volume>, ClientError> {
        match app {
            Some(app) => self.get(&format!("/volumes?app={app}")).await,
            None => self.get("/volumes").await,
        }
    }

    /// One of this host's volumes.
    pub async fn volume(&self, id: &str) -> Result<bazaar_types::volume::Volume, ClientError> {
        self.get(&format!("/volumes/{id}")).await
    }

    /// A volume's snapshots, oldest first.
    pub async fn volume_snapshots(
        &self,
        id: &str,
    ) -> Result<Vec<bazaar_types::volume::VolumeSnapshot>, ClientError> {
        self.get(&format!("/volumes/{id}/snapshots")).await
    }

    /// One snapshot kept on this host, as the host keeps it.
    pub async fn snapshot(
        &self,
        id: &str,
    ) -> Result<bazaar_types::volume::HostSnapshot, ClientError> {
        self.get(&format!("/snapshots/{id}")).await
    }

    /// Deletes one of this host's volumes.
    pub async fn delete_volume(
        &self,
        id: &str,
    ) -> Result<bazaar_types::volume::Volume, ClientError> {
        let url = self.url(&format!("/volumes/{id}"));
        self.send(self.http.delete(&url), url).await
    }

    /// Lists machines.
    pub async fn machines(
        &self,
        app: Option<&str>,
        include_deleted: bool,
    ) -> Result<Vec<Machine>, ClientError> {
        self.get(&machines_query("/machines", app, include_deleted))
            .await
    }

    /// One machine.
    pub async fn machine(&self, id: &str) -> Result<Machine, ClientError> {
        self.get(&format!("/machines/{id}")).await
    }

    /// Starts a machine.
    pub async fn start(&self, id: &str) -> Result<serde_json::Value, ClientError> {
        self.post(&format!("/machines/{id}/start"), &serde_json::json!({}))
            .await
    }

    /// Stops a machine.
    pub async fn stop(
        &self,
        id: &str,
        req: &StopRequest,
    ) -> Result<serde_json::Value, ClientError> {
        self.post(&format!("/machines/{id}/stop"), req).await
    }

    /// Restarts a machine.
    pub async fn restart(
        &self,
        id: &str,
        req: &StopRequest,
    ) -> Result<serde_json::Value, ClientError> {
        self.post(&format!("/machines/{id}/restart"), req).await
    }

    /// Sends a signal (name or number).
    pub async fn signal(
        &self,
        id: &str,
        signal: serde_json::Value,
    ) -> Result<serde_json::Value, ClientError> {
        self.post(
            &format!("/machines/{id}/signal"),
            &serde_json::json!({ "signal": signal }),
        )
        .await
    }

    /// Updates a machine's config.
    pub async fn update(&self, id: &str, req: &UpdateRequest) -> Result<Machine, ClientError> {
        self.post(&format!("/machines/{id}"), req).await
    }

    /// Destroys a machine.
    pub async fn destroy(&self, id: &str, force: bool) -> Result<serde_json::Value, ClientError> {
        let url = self.url(&format!("/machines/{id}?force={force}"));
        self.send(self.http.delete(&url), url).await
    }

    /// Waits for a state (seconds).
    pub async fn wait(
        &self,
        id: &str,
        state: &str,
        timeout_secs: u64,
    ) -> Result<WaitResponse, ClientError> {
        self.get(&format!(
            "/machines/{id}/wait?state={state}&timeout={timeout_secs}"
        ))
        .await
    }

    /// Events, newest first.
    pub async fn events(&self, id: &str) -> Result<Vec<MachineEvent>, ClientError> {
        self.get(&format!("/machines/{id}/events?limit=50")).await
    }

    /// Config versions, newest first.
    pub async fn versions(&self, id: &str) -> Result<Vec<serde_json::Value>, ClientError> {
        self.get(&format!("/machines/{id}/versions")).await
    }

    /// Sends a request with an optional lease nonce header.
    pub async fn with_nonce<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        nonce: Option<&str>,
        body: Option<serde_json::Value>,
    ) -> Result<T, ClientError> {
        let url = self.url(path);
        let mut req = self.http.request(method, &url);
        if let Some(n) = nonce {
            req = req.header("fly-machine-lease-nonce", n);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        self.send(req, url).await
    }

    /// Acquires (or, with `nonce`, refreshes) a lease; returns the wrapped answer.
    pub async fn lease(
        &self,
        id: &str,
        ttl: u64,
        nonce: Option<&str>,
    ) -> Result<serde_json::Value, ClientError> {
        self.with_nonce(
            reqwest::Method::POST,
            &format!("/machines/{id}/lease"),
            nonce,
            Some(serde_json::json!({"ttl": ttl})),
        )
        .await
    }

    /// Suspends a machine.
    pub async fn suspend(&self, id: &str) -> Result<serde_json::Value, ClientError> {
        self.post(&format!("/machines/{id}/suspend"), &serde_json::json!({}))
            .await
    }

    /// Runs a command in a machine.
    pub async fn exec(
        &self,
        id: &str,
        command: &[&str],
    ) -> Result<bazaar_types::host::ExecResponse, ClientError> {
        self.post(
            &format!("/machines/{id}/exec"),
            &serde_json::json!({ "command": command }),
        )
        .await
    }

    /// The images this host keeps.
    pub async fn images(&self) -> Result<Vec<ImageSummary>, ClientError> {
        self.get("/images").await
    }

    /// Loads a `docker save` or OCI-layout archive (a tar) into this host's store; the
    /// images it held.
    pub async fn import_images(
        &self,
        archive: reqwest::Body,
    ) -> Result<Vec<ImageSummary>, ClientError> {
        let url = self.url("/images/import");
        let req = self
            .http
            .post(&url)
            .header("content-type", "application/x-tar")
            .body(archive);
        self.send(req, url).await
    }

    /// Forgets every image no machine of this host uses, and frees their layers.
    pub async fn prune_images(&self) -> Result<PruneReport, ClientError> {
        self.post("/images/prune", &serde_json::json!({})).await
    }

    /// Starts pulling `image` into this host's store; its progress comes as lines
    /// ([`ImagePull::next`]).
    pub async fn pull_image(&self, image: &str) -> Result<ImagePull, ClientError> {
        let url = self.url("/images/pull");
        let req = self
            .http
            .post(&url)
            .json(&serde_json::json!({ "image": image }));
        let resp = self.transmit(req, &url).await?;
        if !resp.status().is_success() {
            // The refusal, decoded as any other answer's.
            let status = resp.status().as_u16();
            let bytes = resp
                .bytes()
                .await
                .map_err(|source| ClientError::Transport {
                    url: url.clone(),
                    source,
                })?;
            return Err(status_error(status, &bytes));
        }
        Ok(ImagePull {
            resp,
            url,
            buf: Vec::new(),
        })
    }

    /// The gossip keyring of this host.
    pub async fn gossip_keys(&self) -> Result<GossipKeys, ClientError> {
        self.get("/gossip-keys").await
    }

    /// Changes the gossip keyring of this host; the keyring after the change.
    pub async fn change_gossip_key(
        &self,
        change: &GossipKeyChange,
    ) -> Result<GossipKeys, ClientError> {
        self.post("/gossip-keys", change).await
    }

    /// Hands this host a revocation signed by the cluster CA (`bazaar_pki::Revocation`),
    /// which its catalog spreads.
    pub async fn revoke<R: Serialize>(&self, revocation: &R) -> Result<(), ClientError> {
        let _: serde::de::IgnoredAny = self.post("/revocations", revocation).await?;
        Ok(())
    }

    /// Every host as this host's catalog sees it (`/v1/catalog/hosts`).
    pub async fn catalog_hosts(&self) -> Result<Vec<CatalogHost>, ClientError> {
        self.get_root("/v1/catalog/hosts").await
    }

    /// The machines in this host's catalog (`/v1/catalog/machines`): of one app, if given;
    /// tombstones too with `include_deleted`.
    pub async fn catalog_machines(
        &self,
        app: Option<&str>,
        include_deleted: bool,
    ) -> Result<Vec<CatalogMachine>, ClientError> {
        self.get_root(&machines_query(
            "/v1/catalog/machines",
            app,
            include_deleted,
        ))
        .await
    }

    /// The machine's log tail (JSON lines).
    pub async fn logs(&self, id: &str) -> Result<String, ClientError> {
        let url = self.url(&format!("/machines/{id}/logs"));
        let resp = self
            .http
            .get(&url)
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|source| ClientError::Transport {
                url: url.clone(),
                source,
            })?;
        let status = resp.status().as_u16();
        let text = resp
            .text()
            .await
            .map_err(|source| ClientError::Transport { url, source })?;
        if status >= 400 {
            return Err(ClientError::Status {
                status,
                message: text,
                code: None,
            });
        }
        Ok(text)
    }
}

/// `path` with the query of a machine list: tombstones or not, one app's or all.
fn machines_query(path: &str, app: Option<&str>, include_deleted: bool) -> String {
    let mut q = format!("{path}?include_deleted={include_deleted}");
    if let Some(app) = app {
        q.push_str(&format!("&app={app}"));
    }
    q
}

/// An error answer: the Fly-shaped body's message and code, or the body as text.
fn status_error(status: u16, body: &[u8]) -> ClientError {
    let (message, code) = match serde_json::from_slice::<ErrorBody>(body) {
        Ok(b) => (b.error, b.status),
        Err(_) => (String::from_utf8_lossy(body).into_owned(), None),
    };
    ClientError::Status {
        status,
        message,
        code,
    }
}

/// An image pull under way ([`HostClient::pull_image`]).
#[derive(Debug)]
pub struct ImagePull {
    resp: reqwest::Response,
    url: String,
    buf: Vec<u8>,
}

impl ImagePull {
    /// The next progress line, as sent (newline included) and decoded; `None` once the
    /// host has said all (its last line is the image pulled, or why not).
    pub async fn next(&mut self) -> Result<Option<(String, PullLine)>, ClientError> {
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let raw: Vec<u8> = self.buf.drain(..=pos).collect();
                let line = serde_json::from_slice(&raw).map_err(|e| ClientError::Status {
                    status: self.resp.status().as_u16(),
                    message: format!("unexpected pull progress line: {e}"),
                    code: None,
                })?;
                return Ok(Some((String::from_utf8_lossy(&raw).into_owned(), line)));
            }
            let chunk = self
                .resp
                .chunk()
                .await
                .map_err(|source| ClientError::Transport {
                    url: self.url.clone(),
                    source,
                })?;
            match chunk {
                Some(chunk) => self.buf.extend_from_slice(&chunk),
                None => return Ok(None),
            }
        }
    }
}
