//! The hop listener (`--proxy-hop-listen`, published as the host label `proxy_hop_addr`):
//! other hosts' proxies bring requests and TCP connections for this host's machines here
//! over mTLS ([`crate::hop_tls`]). Its handshake refuses a client without a certificate the
//! cluster CA signed, or whose host the CA revoked; every request on an accepted connection
//! is a hop ([`crate::http::serve_hop`]).

use crate::body::reply;
use crate::hop_tls::HANDSHAKE_TIMEOUT;
use crate::http::serve_hop;
use crate::request::ClientBody;
use crate::shared::Local;
use crate::wire::{HEADER_READ_TIMEOUT, MAX_HEAD_BYTES};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// Serves the hop listener `listener` on this proxy thread until `shutdown`.
pub(super) fn spawn_listener(
    local: Arc<Local>,
    listener: std::net::TcpListener,
    shutdown: CancellationToken,
) {
    let node = local.node.clone();
    node.spawn(async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(err) => {
                tracing::error!(error = %err, "proxy hop listener");
                return;
            }
        };
        super::accept_loop(
            &local.clone(),
            listener,
            "hop",
            shutdown,
            move |stream, peer| serve_connection(local.clone(), stream, peer),
        )
        .await;
    });
}

/// One connection from another host's proxy: the handshake (a certificate the CA signed,
/// naming a host), then its hops, served by hyper (HTTP/1.1, upgrades for TCP hops).
async fn serve_connection(local: Arc<Local>, stream: TcpStream, peer: SocketAddr) {
    let Some(acceptor) = local.hop_tls.as_ref().map(|t| t.acceptor.clone()) else {
        return;
    };
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(err)) => {
            tracing::debug!(error = %err, %peer, "proxy hop handshake refused");
            return;
        }
        Err(_) => return,
    };
    // The handshake verified the chain against the CA; the certificate must also name a
    // host, and not one the CA revoked (`bazaar cluster revoke`).
    let Some(peer_host) = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(bazaar_pki::peer_host_id)
    else {
        tracing::debug!(%peer, "proxy hop from a certificate that names no host");
        return;
    };
    if local.0.catalog.is_revoked(&peer_host) {
        tracing::debug!(%peer, peer.host = %peer_host, "proxy hop from a revoked host");
        return;
    }
    let host = peer_host.clone();
    let svc = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
        let local = local.clone();
        // A connection kept open outlives a revocation: each hop asks again.
        let revoked = local.0.catalog.is_revoked(&host);
        async move {
            if revoked {
                return Ok::<_, std::convert::Infallible>(reply(
                    http::StatusCode::FORBIDDEN,
                    "bazaar proxy: hop from a revoked host",
                ));
            }
            let (parts, body) = req.into_parts();
            Ok::<_, std::convert::Infallible>(
                serve_hop(local, parts, ClientBody::Hyper(body)).await,
            )
        }
    });
    if let Err(err) = hyper::server::conn::http1::Builder::new()
        .timer(crate::timer::CoarseTimer)
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES)
        .serve_connection(TokioIo::new(tls), svc)
        .with_upgrades()
        .await
    {
        tracing::debug!(error = %err, %peer, peer.host = %peer_host, "proxy hop connection");
    }
}
