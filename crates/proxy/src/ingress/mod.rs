//! Ingress: the proxy's listeners. Each proxy thread runs one single-threaded runtime with
//! its own SO_REUSEPORT socket of each listener: plain HTTP (here: plain HTTP/1.1 read and
//! answered by [`h1`], anything else handed to hyper's server), HTTPS ([`tls`]) and, with a
//! cluster certificate, the hop listener for other hosts' proxies ([`hop`]). Every request
//! goes on to [`crate::http::handle_parts`] (a hop to [`crate::http::serve_hop`]). Raw TCP
//! services have their own listeners ([`crate::tcp`]).

pub(crate) mod h1;
mod hop;
pub(crate) mod tls;

use crate::body::RespBody;
use crate::http::handle_parts;
use crate::request::ClientBody;
use crate::shared::{Local, Shared};
use crate::wire::{HEADER_READ_TIMEOUT, MAX_HEAD_BYTES};
use http::header::HeaderValue;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// Longest a proxy thread waits, once the host shuts down, for the HTTP requests in flight
/// to be answered (under the node's own drain bound, 5 s).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(4);

/// Starts proxy thread `i`: a single-threaded runtime serving `listener` until shutdown.
/// The thread counts as a task of the node's tracker until its runtime is gone: the
/// tasks on it (connections, spliced upgrades, upstream connections, its ticker), each
/// spawned through the tracker too, end with the runtime, which cuts what is still open.
/// So [`bazaar_node::NodeHandle::drain`] returns only once every socket of the thread is
/// closed. At shutdown the listeners close first; the HTTP requests in flight then get up
/// to [`SHUTDOWN_GRACE`] to finish ([`Shared::settle`]); raw TCP and idle connections are
/// cut with the runtime.
pub(crate) fn spawn_server_thread(
    i: usize,
    shared: Arc<Shared>,
    listener: std::net::TcpListener,
    hop_listener: Option<std::net::TcpListener>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let running = shared.node.tasks().token();
    std::thread::Builder::new()
        .name(format!("proxy-{i}"))
        .spawn(move || {
            rt.block_on(async move {
                if let Some(hop) = hop_listener {
                    let local = Arc::new(Local(shared.clone()));
                    hop::spawn_listener(local, hop, shutdown.clone());
                }
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => serve(shared.clone(), l, shutdown).await,
                    Err(err) => tracing::error!(error = %err, "proxy listener"),
                }
                settle(&shared).await;
            });
            drop(rt);
            drop(running);
        })?;
    Ok(())
}

/// After a proxy thread's listeners closed at shutdown (new connections are refused, and
/// other hosts' proxies go elsewhere): the answers under way finish before the runtime, and
/// what is still open with it, goes.
pub(crate) async fn settle(shared: &Shared) {
    shared.closing.store(true, Ordering::SeqCst);
    shared.settle(SHUTDOWN_GRACE).await;
}

/// The HTTP server of a listener's connections after [`h1`]: HTTP/1.1 with the coarse
/// head timer and limits, HTTP/2 with its stream and header limits and keep-alive pings.
pub(crate) fn server_builder() -> Arc<hyper_util::server::conn::auto::Builder<TokioExecutor>> {
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(crate::timer::CoarseTimer)
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(MAX_HEAD_BYTES as u32)
        .max_concurrent_streams(256)
        .keep_alive_interval(Some(Duration::from_secs(30)));
    Arc::new(builder)
}

/// This thread's ticker until `shutdown`: every tick wakes the requests whose head took
/// too long ([`crate::timer`]) and closes expired upstream connections.
pub(crate) fn spawn_ticker(local: &Local, shutdown: &CancellationToken) {
    let shutdown = shutdown.clone();
    local.node.spawn(async move {
        let mut tick = tokio::time::interval(crate::timer::TICK);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = tick.tick() => {
                    crate::timer::fire_expired();
                    crate::pool::sweep();
                }
            }
        }
    });
}

/// The accept loop of every proxy listener (plain, TLS, hop) until `shutdown`: each
/// connection accepted gets `TCP_NODELAY` and is served by `serve` as a task of the node's
/// tracker (an atomic add when it starts and a subtraction when it ends: no lock, nothing
/// per request), so draining the node waits for it. An accept error (out of file
/// descriptors and the like) is logged as `what` and the loop backs off 20 ms and goes on.
pub(crate) async fn accept_loop<F, Fut>(
    local: &Local,
    listener: tokio::net::TcpListener,
    what: &'static str,
    shutdown: CancellationToken,
    mut serve: F,
) where
    F: FnMut(TcpStream, SocketAddr) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let tasks = local.node.tasks().clone();
    loop {
        let (stream, peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(err) => {
                    tracing::warn!(error = %err, listener = what, "proxy accept");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        tasks.spawn(serve(stream, peer));
    }
}

async fn serve(
    shared: Arc<Shared>,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) {
    let builder = server_builder();
    let local = Arc::new(Local(shared));
    spawn_ticker(&local, &shutdown);
    accept_loop(
        &local.clone(),
        listener,
        "http",
        shutdown,
        move |stream, peer| {
            let local = local.clone();
            let builder = builder.clone();
            async move {
                // Formatted once per connection, for X-Forwarded-For.
                let peer_ip = HeaderValue::from_str(&peer.ip().to_string())
                    .unwrap_or_else(|_| HeaderValue::from_static("unknown"));
                // Plain HTTP/1.1 here; the rest of a connection that asks for more, in hyper.
                let mut stream = stream;
                let read = match h1::serve(&mut stream, &local, &peer_ip).await {
                    h1::Outcome::Closed => return,
                    h1::Outcome::HandOff(read) => read,
                };
                let svc = hyper::service::service_fn(move |req| {
                    let local = local.clone();
                    let peer_ip = peer_ip.clone();
                    async move { Ok::<_, Infallible>(handle(local, &peer_ip, req).await) }
                });
                let io = h1::Rewind::new(read, stream);
                if let Err(err) = builder
                    .serve_connection_with_upgrades(TokioIo::new(io), svc)
                    .await
                {
                    tracing::debug!(error = %err, %peer, "proxy connection");
                }
            }
        },
    )
    .await;
}

/// A request received by hyper's server.
async fn handle(
    shared: Arc<Local>,
    peer_ip: &HeaderValue,
    req: Request<Incoming>,
) -> Response<RespBody> {
    let (parts, body) = req.into_parts();
    handle_parts(shared, peer_ip, parts, ClientBody::Hyper(body)).await
}
