//! TLS termination: the HTTPS listener (one thread per core with SO_REUSEPORT, as the
//! HTTP one), rustls on aws-lc-rs with TLS 1.2 and 1.3 only, the certificate picked by SNI
//! from the cluster's certificates ([`bazaar_certs::CertStore`]), ALPN `h2` and
//! `http/1.1`, session resumption by tickets (and a session cache). A name without a
//! certificate ends the handshake at once with a fatal alert.
//!
//! Behind the handshake a connection is served as a plain one is ([`h1`], handed
//! to hyper's server for HTTP/2 and the rest), its requests marked [`Https`]: they are
//! forwarded with `X-Forwarded-Proto: https` and never redirected by `force_https`.

use crate::http::handle_parts;
use crate::ingress::h1;
use crate::request::{ClientBody, Https};
use crate::shared::{Local, Shared};
use crate::wire::HEADER_READ_TIMEOUT;
use http::header::HeaderValue;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// How long a closing connection may take to take our close_notify alert.
const CLOSE_NOTIFY_TIMEOUT: Duration = Duration::from_secs(1);

impl h1::ClientStream for TlsStream<TcpStream> {
    const TLS: bool = true;
}

/// The server config: modern versions only, certificates by SNI, h2 and http/1.1,
/// resumption by tickets and by session id.
pub(crate) fn server_config(
    certs: bazaar_certs::CertStore,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(certs));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    config.ticketer = rustls::crypto::aws_lc_rs::Ticketer::new()?;
    config.session_storage = rustls::server::ServerSessionMemoryCache::new(4096);
    Ok(Arc::new(config))
}

/// Starts HTTPS thread `i`: a single-threaded runtime serving `listener` until shutdown.
pub(crate) fn spawn_server_thread(
    i: usize,
    shared: Arc<Shared>,
    listener: std::net::TcpListener,
    config: Arc<rustls::ServerConfig>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // A task of the node's tracker until the runtime, and every connection on it, is gone
    // (as the HTTP threads: `super::spawn_server_thread`).
    let running = shared.node.tasks().token();
    std::thread::Builder::new()
        .name(format!("proxy-tls-{i}"))
        .spawn(move || {
            rt.block_on(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => serve(shared.clone(), l, TlsAcceptor::from(config), shutdown).await,
                    Err(err) => tracing::error!(error = %err, "proxy TLS listener"),
                }
                super::settle(&shared).await;
            });
            drop(rt);
            drop(running);
        })?;
    Ok(())
}

async fn serve(
    shared: Arc<Shared>,
    listener: tokio::net::TcpListener,
    acceptor: TlsAcceptor,
    shutdown: CancellationToken,
) {
    let builder = super::server_builder();
    let local = Arc::new(Local(shared));
    // This thread's coarse timers and upstream pools, as on the HTTP threads.
    super::spawn_ticker(&local, &shutdown);
    super::accept_loop(
        &local.clone(),
        listener,
        "https",
        shutdown,
        move |stream, peer| {
            let local = local.clone();
            let builder = builder.clone();
            let acceptor = acceptor.clone();
            async move {
                let mut stream = match tokio::time::timeout(
                    HEADER_READ_TIMEOUT,
                    acceptor.accept(stream),
                )
                .await
                {
                    Ok(Ok(s)) => s,
                    Ok(Err(err)) => {
                        tracing::debug!(error = %err, %peer, "TLS handshake");
                        return;
                    }
                    Err(_) => return,
                };
                let peer_ip = HeaderValue::from_str(&peer.ip().to_string())
                    .unwrap_or_else(|_| HeaderValue::from_static("unknown"));
                // HTTP/2 goes straight to hyper; HTTP/1.1 to the plain server first.
                let read = if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
                    bytes::Bytes::new()
                } else {
                    match h1::serve(&mut stream, &local, &peer_ip).await {
                        h1::Outcome::Closed => {
                            // close_notify, so the client knows the answer was not cut short.
                            let _ =
                                tokio::time::timeout(CLOSE_NOTIFY_TIMEOUT, stream.shutdown()).await;
                            return;
                        }
                        h1::Outcome::HandOff(read) => read,
                    }
                };
                let svc =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let local = local.clone();
                        let peer_ip = peer_ip.clone();
                        async move {
                            let (mut parts, body) = req.into_parts();
                            parts.extensions.insert(Https);
                            Ok::<_, Infallible>(
                                handle_parts(local, &peer_ip, parts, ClientBody::Hyper(body)).await,
                            )
                        }
                    });
                let io = h1::Rewind::new(read, stream);
                if let Err(err) = builder
                    .serve_connection_with_upgrades(TokioIo::new(io), svc)
                    .await
                {
                    tracing::debug!(error = %err, %peer, "proxy TLS connection");
                }
            }
        },
    )
    .await;
}
