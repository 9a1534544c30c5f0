//! HTTPS on the Machines API port (`--api-tls`). The certificate is the one given
//! (`--api-tls-cert`, `--api-tls-key`), or one of the cluster CA made for a key of this
//! host: its host name, `localhost` and its address (`HostTls::api_identity`), renewed
//! after two thirds of its life like the host certificate. Clients trust the cluster CA
//! (`BAZAAR_CA_CERT`). A plain HTTP request on the port is answered 400 and closed.

use crate::agent::Agent;
use crate::config::AgentConfig;
use crate::connections;
use crate::host_tls::HostTls;
use anyhow::Context;
use axum::Router;
use bazaar_node::listen::{spawn_accept_loop, Admission, Admitted, Limits};
use bazaar_pki::IdentityHandle;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::io::AsyncWriteExt;

/// The TLS side of the API port.
pub struct ApiTls {
    acceptor: tokio_rustls::TlsAcceptor,
}

impl std::fmt::Debug for ApiTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiTls")
    }
}

impl ApiTls {
    /// The API's TLS when `--api-tls` is on: the given certificate, or one of the cluster
    /// CA (renewed in the background while the agent runs).
    pub async fn establish(
        config: &AgentConfig,
        agent: &Agent,
        host_tls: Option<&HostTls>,
    ) -> anyhow::Result<Option<ApiTls>> {
        if !config.api_tls {
            return Ok(None);
        }
        let builder = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth();
        let mut server = match (&config.api_tls_cert, &config.api_tls_key) {
            (Some(cert), Some(key)) => {
                let chain = CertificateDer::pem_file_iter(cert)
                    .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                    .map_err(|e| anyhow::anyhow!("{}: {e:?}", cert.display()))?;
                anyhow::ensure!(!chain.is_empty(), "{} holds no certificate", cert.display());
                let key = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| anyhow::anyhow!("{}: {e:?}", key.display()))?;
                builder.with_single_cert(chain, key)?
            }
            _ => {
                let tls = host_tls.context(
                    "--api-tls needs a cluster certificate (--cluster-ca or --join-token) or \
                     --api-tls-cert and --api-tls-key",
                )?;
                let ip = config.api_listen.ip();
                let identity = tls
                    .api_identity(&config.data_dir, ip)
                    .await
                    .context("a certificate for the API from the cluster CA")?;
                let handle = IdentityHandle::new(&identity)?;
                spawn_renewal(agent, tls.clone(), handle.clone(), identity, config);
                builder.with_cert_resolver(Arc::new(handle))
            }
        };
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Some(ApiTls {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(server)),
        }))
    }

    /// Serves `app` on `listener` over TLS until the agent shuts down, its connections
    /// counted by `admission`.
    pub fn serve(
        &self,
        agent: &Agent,
        listener: tokio::net::TcpListener,
        admission: Arc<Admission>,
        app: Router,
    ) -> tokio::task::JoinHandle<()> {
        let acceptor = self.acceptor.clone();
        let limits = admission.limits();
        spawn_accept_loop(
            "API (TLS)",
            listener,
            admission,
            agent.shutdown_token(),
            agent.tracker(),
            move |stream, peer, conn| {
                serve_connection(acceptor.clone(), stream, peer, conn, app.clone(), limits)
            },
        )
    }
}

/// Renews the API certificate after two thirds of its life.
fn spawn_renewal(
    agent: &Agent,
    tls: HostTls,
    handle: IdentityHandle,
    first: bazaar_pki::HostIdentity,
    config: &AgentConfig,
) {
    let stop = agent.shutdown_token();
    let (data_dir, ip) = (config.data_dir.clone(), config.api_listen.ip());
    let retry = Duration::from_secs(1).max(config.cert_validity / 100);
    agent.tracker().clone().spawn(async move {
        let mut due = first.renew_at();
        loop {
            let wait = due.duration_since(SystemTime::now()).unwrap_or_default();
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            match tls.api_identity(&data_dir, ip).await {
                Ok(identity) if handle.replace(&identity).is_ok() => due = identity.renew_at(),
                Ok(_) => due = SystemTime::now() + retry,
                Err(err) => {
                    tracing::warn!(error = %format!("{err:#}"), "renewing the API certificate");
                    due = SystemTime::now() + retry;
                }
            }
        }
    });
}

/// One client connection: plain HTTP is answered 400; TLS is served by the API router. The
/// first byte and the handshake each have the head timeout.
async fn serve_connection(
    acceptor: tokio_rustls::TlsAcceptor,
    mut stream: tokio::net::TcpStream,
    peer: SocketAddr,
    conn: Arc<Admitted>,
    app: Router,
    limits: Limits,
) {
    // A TLS connection starts with a handshake record (0x16).
    let mut first = [0u8; 1];
    match tokio::time::timeout(limits.head_timeout, stream.peek(&mut first)).await {
        Ok(Ok(1)) if first[0] == 0x16 => {}
        Ok(Ok(1)) => {
            let body = r#"{"error":"this API is served over HTTPS"}"#;
            let answer = format!(
                "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(answer.as_bytes()).await;
            let _ = stream.shutdown().await;
            return;
        }
        _ => return,
    }
    let tls = match tokio::time::timeout(limits.head_timeout, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(err)) => {
            tracing::debug!(error = %err, %peer, "API handshake");
            return;
        }
        Err(_) => return,
    };
    connections::serve(tls, peer, conn, app, limits, |_| {}).await;
}
