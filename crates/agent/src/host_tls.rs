//! This host's cluster identity at run time and the host listener. At start the host takes
//! its certificate from `DATA/tls/`, or, having none, issues one from the CA it holds
//! (`--cluster-ca`) or joins with a one-time token (`--join-token`, `--join-addr`: a CSR
//! is sent, the key stays here, the CA is checked against the token's fingerprint). A task
//! renews the certificate after two thirds of its life (over mTLS with the current one);
//! new connections then use the new one, machines are not touched. The host listener
//! serves the host interface and the catalog view over mTLS: a request is let through
//! only with a certificate the CA signed (its host id goes to the handlers as
//! [`PeerHost`]), but for `/cluster/v1/join` on the CA's host, and never from a host the
//! CA revoked (the catalog knows which: `Catalog::is_revoked`). The CA also endorses each
//! host's catalog key (`/cluster/v1/endorse`, as the host its certificate names), kept in
//! `DATA/tls/row-key.endorsement`.

use crate::config::AgentConfig;
use crate::connections;
use crate::error::AgentError;
use anyhow::Context;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use bazaar_node::listen::{spawn_accept_loop, Admission, Admitted, Limits};
use bazaar_pki::{ClusterCa, HostIdentity, HostRequest, IdentityHandle, JoinToken};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use bazaar_node::host_link::{HostLink, PeerHost, HOST_ADDR_LABEL};

/// This host's identity in use.
#[derive(Clone)]
pub struct HostTls {
    host_id: String,
    /// The current key and certificate, shared by every TLS config of the host.
    pub identity: IdentityHandle,
    /// The CA certificate, PEM.
    pub ca_pem: String,
    ca: Option<Arc<ClusterCa>>,
    validity: Duration,
    dir: PathBuf,
}

impl std::fmt::Debug for HostTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostTls")
            .field("host_id", &self.host_id)
            .field("holds_ca", &self.ca.is_some())
            .finish_non_exhaustive()
    }
}

/// What a joining host sends.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct JoinRequest {
    token: String,
    host_id: String,
    csr: String,
}

/// What a renewing host sends: its host id is the one its certificate names.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RenewRequest {
    csr: String,
}

/// A certificate issued, and the CA's.
#[derive(Debug, Serialize, Deserialize)]
struct Issued {
    cert: String,
    ca: String,
}

/// Where the address of the CA's host listener is kept for renewals.
const CA_ADDR_FILE: &str = "ca.addr";

impl HostTls {
    /// The identity of `host_id` from `DATA/tls`, issued or joined for when missing.
    /// `None` when the host has no certificate and nothing to get one with.
    pub async fn establish(config: &AgentConfig, host_id: &str) -> anyhow::Result<Option<Self>> {
        let dir = config.data_dir.join("tls");
        let ca = match &config.cluster_ca {
            Some(path) => Some(Arc::new(ClusterCa::open(path)?)),
            None => None,
        };
        let identity = match HostIdentity::load(&dir, host_id)? {
            Some(identity) if identity.not_after() > SystemTime::now() => identity,
            _ => match (&ca, &config.join_token, config.join_addr) {
                (Some(ca), _, _) => {
                    let request = HostRequest::new(host_id)?;
                    let cert = ca.issue_own(host_id, &request.csr_pem, config.cert_validity)?;
                    request.into_identity(&cert, ca.cert_pem())?
                }
                (None, Some(token), Some(addr)) => {
                    let token: JoinToken = token.parse()?;
                    let identity = join(addr, &token, host_id)
                        .await
                        .with_context(|| format!("joining the cluster through {addr}"))?;
                    bazaar_pki::write_private(
                        &config.data_dir.join(CA_ADDR_FILE),
                        addr.to_string().as_bytes(),
                    )?;
                    identity
                }
                (None, Some(_), None) => anyhow::bail!("--join-token needs --join-addr"),
                (None, None, _) if dir.join(bazaar_pki::HOST_FILE).exists() => {
                    anyhow::bail!(
                        "the host certificate in {} has expired: join again with a new token",
                        dir.display()
                    )
                }
                (None, None, _) => return Ok(None),
            },
        };
        identity.save(&dir)?;
        Ok(Some(Self {
            host_id: host_id.to_string(),
            identity: IdentityHandle::new(&identity)?,
            ca_pem: identity.ca_pem().to_string(),
            ca,
            validity: config.cert_validity,
            dir,
        }))
    }

    /// The host listener's router: `routes` (the host interface) plus, on the CA's host,
    /// joins and renewals; every request but a join needs a verified peer.
    pub fn router(&self, routes: Router) -> Router {
        let cluster = Router::new()
            .route("/cluster/v1/join", post(join_handler))
            .route("/cluster/v1/renew", post(renew_handler))
            .route("/cluster/v1/endorse", post(endorse_handler))
            .route("/cluster/v1/api-cert", post(api_cert_handler))
            .with_state(self.clone());
        routes
            .merge(cluster)
            .layer(axum::middleware::from_fn(require_peer))
    }

    /// Serves `router` on `listener` over TLS until `stop` (the agent's shutdown); the
    /// accept loop is counted by `tracker`, the connections by `admission` (a connection
    /// whose peer is a host of the cluster is trusted). `catalog` tells which hosts the CA
    /// revoked.
    pub fn serve(
        &self,
        stop: CancellationToken,
        tracker: &TaskTracker,
        catalog: Option<bazaar_catalog::Catalog>,
        listener: tokio::net::TcpListener,
        admission: Arc<Admission>,
        router: Router,
    ) -> anyhow::Result<()> {
        let acceptor = tokio_rustls::TlsAcceptor::from(bazaar_pki::server_config(
            &self.identity,
            &self.ca_pem,
        )?);
        let limits = admission.limits();
        spawn_accept_loop(
            "host listener",
            listener,
            admission,
            stop,
            tracker,
            move |stream, peer_addr, conn| {
                serve_connection(
                    acceptor.clone(),
                    stream,
                    peer_addr,
                    conn,
                    router.clone(),
                    catalog.clone(),
                    limits,
                )
            },
        );
        Ok(())
    }

    /// Renews the certificate after two thirds of its life, until `stop` (the agent's
    /// shutdown), on a task counted by `tracker`.
    pub fn spawn_renewal(&self, stop: CancellationToken, tracker: &TaskTracker, data_dir: PathBuf) {
        let tls = self.clone();
        tracker.spawn(async move {
            let mut due = tls.current()?.renew_at();
            loop {
                let wait = due.duration_since(SystemTime::now()).unwrap_or_default();
                tokio::select! {
                    _ = stop.cancelled() => return Some(()),
                    _ = tokio::time::sleep(wait) => {}
                }
                match tls.renew(&data_dir).await {
                    Ok(identity) => {
                        tracing::info!(not_after = ?identity.not_after(), "host certificate renewed");
                        due = identity.renew_at();
                    }
                    Err(err) => {
                        tracing::warn!(error = %format!("{err:#}"), "renewing the host certificate");
                        due = SystemTime::now() + Duration::from_secs(1).max(tls.validity / 100);
                    }
                }
            }
        });
    }

    fn current(&self) -> Option<HostIdentity> {
        HostIdentity::load(&self.dir, &self.host_id).ok().flatten()
    }

    async fn renew(&self, data_dir: &std::path::Path) -> anyhow::Result<HostIdentity> {
        let request = HostRequest::new(&self.host_id)?;
        let issued = match &self.ca {
            Some(ca) => Issued {
                cert: ca.renew(&self.host_id, &request.csr_pem, self.validity)?,
                ca: ca.cert_pem().to_string(),
            },
            None => {
                let addr: SocketAddr = std::fs::read_to_string(data_dir.join(CA_ADDR_FILE))
                    .context("where the CA is (ca.addr)")?
                    .trim()
                    .parse()?;
                let fingerprint = bazaar_pki::ca_fingerprint(&self.ca_pem)?;
                let config = bazaar_pki::join_client_config(&fingerprint, Some(&self.identity))?;
                post_json(
                    config,
                    addr,
                    "/cluster/v1/renew",
                    &RenewRequest {
                        csr: request.csr_pem.clone(),
                    },
                )
                .await?
            }
        };
        anyhow::ensure!(
            issued.ca == self.ca_pem,
            "the CA answered with another CA certificate"
        );
        let identity = request.into_identity(&issued.cert, &issued.ca)?;
        identity.save(&self.dir)?;
        self.identity.replace(&identity)?;
        Ok(identity)
    }
}

/// Joins through the CA's host at `addr`: sends a request for a key made here, trusting
/// the server only if its chain holds the CA the token pins.
async fn join(addr: SocketAddr, token: &JoinToken, host_id: &str) -> anyhow::Result<HostIdentity> {
    let request = HostRequest::new(host_id)?;
    let config = bazaar_pki::join_client_config(&token.ca_fingerprint, None)?;
    let body = JoinRequest {
        token: token.to_string(),
        host_id: host_id.to_string(),
        csr: request.csr_pem.clone(),
    };
    // The CA's host may be starting too (`bazaar dev` starts every host at once): a refused
    // connection is retried for a while; an answer, even a refusal, is final.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let issued: Issued = loop {
        match post_json(config.clone(), addr, "/cluster/v1/join", &body).await {
            Err(err)
                if tokio::time::Instant::now() < deadline
                    && err
                        .downcast_ref::<reqwest::Error>()
                        .is_some_and(reqwest::Error::is_connect) =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => break other?,
        }
    };
    anyhow::ensure!(
        bazaar_pki::ca_fingerprint(&issued.ca)? == token.ca_fingerprint,
        "the CA certificate sent is not the one the join token names"
    );
    request.into_identity(&issued.cert, &issued.ca)
}

async fn post_json<T: Serialize, R: serde::de::DeserializeOwned>(
    config: Arc<rustls::ClientConfig>,
    addr: SocketAddr,
    path: &str,
    body: &T,
) -> anyhow::Result<R> {
    let client = reqwest::Client::builder()
        .use_preconfigured_tls((*config).clone())
        .timeout(Duration::from_secs(10))
        .build()?;
    let resp = client
        .post(format!("https://{addr}{path}"))
        .json(body)
        .send()
        .await?;
    let status = resp.status();
    let text = resp.text().await?;
    anyhow::ensure!(status.is_success(), "{status}: {text}");
    Ok(serde_json::from_str(&text)?)
}

async fn serve_connection(
    acceptor: tokio_rustls::TlsAcceptor,
    stream: tokio::net::TcpStream,
    peer_addr: SocketAddr,
    conn: Arc<Admitted>,
    router: Router,
    catalog: Option<bazaar_catalog::Catalog>,
    limits: Limits,
) {
    let tls = match tokio::time::timeout(limits.head_timeout, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(err)) => {
            tracing::debug!(error = %err, "host listener handshake refused");
            return;
        }
        Err(_) => return,
    };
    let peer = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(bazaar_pki::peer_host_id)
        .map(PeerHost);
    if let (Some(peer), Some(catalog)) = (&peer, &catalog) {
        if catalog.is_revoked(&peer.0) {
            tracing::debug!(host = peer.0, "host listener: refused a revoked host");
            return;
        }
    }
    // A host of the cluster (its certificate verified): never evicted for a stranger.
    if peer.is_some() {
        conn.trust();
    }
    connections::serve(tls, peer_addr, conn, router, limits, move |req| {
        // Checked per request too: a connection opened before the host was revoked
        // carries its requests unauthenticated from then on.
        let revoked = |p: &PeerHost| catalog.as_ref().is_some_and(|c| c.is_revoked(&p.0));
        if let Some(peer) = peer.as_ref().filter(|p| !revoked(p)) {
            req.extensions_mut().insert(peer.clone());
        }
    })
    .await;
}

/// Only a verified peer gets through, but for a join (which carries its token).
async fn require_peer(req: Request, next: Next) -> Response {
    if req.extensions().get::<PeerHost>().is_some() || req.uri().path() == "/cluster/v1/join" {
        return next.run(req).await;
    }
    AgentError::Unauthorized.into_response()
}

async fn join_handler(
    State(tls): State<HostTls>,
    body: axum::body::Bytes,
) -> Result<Json<Issued>, AgentError> {
    let ca = tls.ca.clone().ok_or_else(not_the_ca)?;
    let req: JoinRequest = serde_json::from_slice(&body)
        .map_err(|e| AgentError::Invalid(format!("invalid join request: {e}")))?;
    let token: JoinToken = req
        .token
        .parse()
        .map_err(|e: anyhow::Error| AgentError::Invalid(e.to_string()))?;
    let cert = tokio::task::spawn_blocking(move || {
        ca.join(&token, &req.host_id, &req.csr, tls.validity)
            .map(|cert| Issued {
                cert,
                ca: ca.cert_pem().to_string(),
            })
    })
    .await
    .map_err(|e| AgentError::Internal(e.to_string()))?
    .map_err(|e| AgentError::Forbidden(format!("{e:#}")))?;
    Ok(Json(cert))
}

async fn renew_handler(
    State(tls): State<HostTls>,
    axum::Extension(peer): axum::Extension<PeerHost>,
    body: axum::body::Bytes,
) -> Result<Json<Issued>, AgentError> {
    let ca = tls.ca.clone().ok_or_else(not_the_ca)?;
    let req: RenewRequest = serde_json::from_slice(&body)
        .map_err(|e| AgentError::Invalid(format!("invalid renewal request: {e}")))?;
    let cert = ca
        .renew(&peer.0, &req.csr, tls.validity)
        .map_err(|e| AgentError::Forbidden(format!("{e:#}")))?;
    Ok(Json(Issued {
        cert,
        ca: ca.cert_pem().to_string(),
    }))
}

/// What a host sends to have its catalog key endorsed: the ed25519 public key, hex.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct EndorseRequest {
    row_key: String,
}

/// The CA's endorsement, base64.
#[derive(Debug, Serialize, Deserialize)]
struct Endorsed {
    endorsement: String,
}

/// Where this host keeps the CA's endorsement of its catalog key.
const ENDORSEMENT_FILE: &str = "row-key.endorsement";

impl HostTls {
    /// The revocations of the CA this host holds (none elsewhere).
    pub fn ca_revocations(&self) -> Vec<bazaar_pki::Revocation> {
        self.ca
            .as_ref()
            .map(|ca| ca.revocations())
            .unwrap_or_default()
    }

    /// The CA's endorsement of `row_key` (this host's catalog key): kept from an earlier
    /// start if it still verifies, else asked of the CA (held here, or over mTLS).
    pub async fn row_key_endorsement(
        &self,
        data_dir: &std::path::Path,
        row_key: [u8; 32],
    ) -> anyhow::Result<String> {
        let verifier = bazaar_pki::CaVerifier::new(&self.ca_pem)?;
        let path = self.dir.join(ENDORSEMENT_FILE);
        if let Ok(kept) = std::fs::read_to_string(&path) {
            if verifier.check_row_key(&self.host_id, &row_key, kept.trim()) {
                return Ok(kept.trim().to_string());
            }
        }
        let endorsement = match &self.ca {
            Some(ca) => ca.endorse_row_key(&self.host_id, &row_key)?,
            None => {
                let addr: SocketAddr = std::fs::read_to_string(data_dir.join(CA_ADDR_FILE))
                    .context("where the CA is (ca.addr)")?
                    .trim()
                    .parse()?;
                let fingerprint = bazaar_pki::ca_fingerprint(&self.ca_pem)?;
                let config = bazaar_pki::join_client_config(&fingerprint, Some(&self.identity))?;
                let body = EndorseRequest {
                    row_key: hex::encode(row_key),
                };
                let endorsed: Endorsed =
                    post_json(config, addr, "/cluster/v1/endorse", &body).await?;
                endorsed.endorsement
            }
        };
        anyhow::ensure!(
            verifier.check_row_key(&self.host_id, &row_key, &endorsement),
            "the CA's endorsement of this host's catalog key does not verify"
        );
        bazaar_pki::write_private(&path, endorsement.as_bytes())?;
        Ok(endorsement)
    }
}

async fn endorse_handler(
    State(tls): State<HostTls>,
    axum::Extension(peer): axum::Extension<PeerHost>,
    body: axum::body::Bytes,
) -> Result<Json<Endorsed>, AgentError> {
    let ca = tls.ca.clone().ok_or_else(not_the_ca)?;
    let req: EndorseRequest = serde_json::from_slice(&body)
        .map_err(|e| AgentError::Invalid(format!("invalid endorsement request: {e}")))?;
    let row_key: [u8; 32] = hex::decode(&req.row_key)
        .ok()
        .and_then(|k| k.try_into().ok())
        .ok_or_else(|| AgentError::Invalid("row_key must be 64 hex characters".into()))?;
    let endorsement = ca
        .endorse_row_key(&peer.0, &row_key)
        .map_err(|e| AgentError::Forbidden(format!("{e:#}")))?;
    Ok(Json(Endorsed { endorsement }))
}

/// A host's certificate for its Machines API (`--api-tls`, `api_tls.rs`): its host name,
/// `localhost`, and the address it called from (a host cannot name another's address).
async fn api_cert_handler(
    State(tls): State<HostTls>,
    axum::Extension(peer): axum::Extension<PeerHost>,
    axum::extract::ConnectInfo(from): axum::extract::ConnectInfo<SocketAddr>,
    body: axum::body::Bytes,
) -> Result<Json<Issued>, AgentError> {
    let ca = tls.ca.clone().ok_or_else(not_the_ca)?;
    let req: RenewRequest = serde_json::from_slice(&body)
        .map_err(|e| AgentError::Invalid(format!("invalid API certificate request: {e}")))?;
    let cert = ca
        .issue_api(&peer.0, &req.csr, &[from.ip()], tls.validity)
        .map_err(|e| AgentError::Forbidden(format!("{e:#}")))?;
    Ok(Json(Issued {
        cert,
        ca: ca.cert_pem().to_string(),
    }))
}

impl HostTls {
    /// A certificate of the cluster CA for this host's Machines API, for a key made here:
    /// issued by the CA this host holds (naming `api_ip`), or asked of the CA's host over
    /// mTLS (naming the address this host calls it from).
    pub async fn api_identity(
        &self,
        data_dir: &std::path::Path,
        api_ip: std::net::IpAddr,
    ) -> anyhow::Result<HostIdentity> {
        let request = HostRequest::new(&self.host_id)?;
        let issued = match &self.ca {
            Some(ca) => Issued {
                cert: ca.issue_api(&self.host_id, &request.csr_pem, &[api_ip], self.validity)?,
                ca: ca.cert_pem().to_string(),
            },
            None => {
                let addr: SocketAddr = std::fs::read_to_string(data_dir.join(CA_ADDR_FILE))
                    .context("where the CA is (ca.addr)")?
                    .trim()
                    .parse()?;
                let fingerprint = bazaar_pki::ca_fingerprint(&self.ca_pem)?;
                let config = bazaar_pki::join_client_config(&fingerprint, Some(&self.identity))?;
                post_json(
                    config,
                    addr,
                    "/cluster/v1/api-cert",
                    &RenewRequest {
                        csr: request.csr_pem.clone(),
                    },
                )
                .await?
            }
        };
        anyhow::ensure!(
            issued.ca == self.ca_pem,
            "the CA answered with another CA certificate"
        );
        request.into_identity(&issued.cert, &issued.ca)
    }
}

fn not_the_ca() -> AgentError {
    AgentError::NotFound("this host does not hold the cluster CA".into())
}

impl HostTls {
    /// The link of this host, serving at `addr`, to the others the catalog knows.
    pub fn link(
        &self,
        addr: SocketAddr,
        catalog: bazaar_catalog::Catalog,
    ) -> anyhow::Result<HostLink> {
        HostLink::new(addr, self.identity.clone(), self.ca_pem.clone(), catalog)
    }
}
