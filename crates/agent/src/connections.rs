//! The agent's router served on the connections its listeners admit
//! ([`bazaar_node::listen`]): the plain API port (`boot.rs`), HTTPS on it (`api_tls.rs`)
//! and the host listener (`host_tls.rs`) share one HTTP/1.1 server setting (hyper's
//! header read timeout from `request_head_timeout`, heads of at most 64 KiB, as the
//! proxy's), and the peer's address and the connection's handle ([`Connection`]) on every
//! request. A part below the agent (it knows nothing of it); `boot.rs` has the layer that
//! trusts a connection once a request on it carries a token the agent accepts.

use crate::config::AgentConfig;
use axum::extract::{ConnectInfo, Request};
use axum::Router;
use bazaar_node::listen::{Admitted, Limits};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite};

/// The largest request head read.
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// The connection a request came on (a request extension).
#[derive(Debug, Clone)]
pub struct Connection(pub Arc<Admitted>);

/// The limits of the agent's listeners: the config's, with the total at most half of the
/// open files this process may hold (read after `boot::raise_fd_limit`).
pub fn limits(config: &AgentConfig) -> Limits {
    let open_files = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    Limits {
        max_connections: config.max_connections,
        max_untrusted_per_source: config.max_connections_per_source,
        head_timeout: config.request_head_timeout,
    }
    .within_open_files(open_files)
}

/// Serves `router` on `io` (a connection from `peer` that `conn` counts) until the client
/// closes it, a request head takes longer than `limits.head_timeout`, or it idles that long
/// between requests. `extend` adds extensions of its own to each request (the host
/// listener: the peer host).
pub async fn serve<I>(
    io: I,
    peer: SocketAddr,
    conn: Arc<Admitted>,
    router: Router,
    limits: Limits,
    extend: impl Fn(&mut Request<Incoming>) + Send + Sync + 'static,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        extend(&mut req);
        // The peer's address, for the audit record (as `axum::serve` gives it).
        req.extensions_mut().insert(ConnectInfo(peer));
        req.extensions_mut().insert(Connection(conn.clone()));
        let mut router = router.clone();
        async move {
            use tower::Service;
            router.call(req.map(axum::body::Body::new)).await
        }
    });
    if let Err(err) = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.head_timeout)
        .max_buf_size(MAX_HEAD_BYTES)
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades()
        .await
    {
        tracing::debug!(error = %err, %peer, "connection");
    }
}
