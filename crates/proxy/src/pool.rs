//! Upstream HTTP/1.1 connections of one proxy thread for requests the fast path
//! ([`crate::h1`]) does not take (streamed bodies, upgrades): a small keep-alive pool per
//! machine address, held by the thread itself (no lock, no shared state), over hyper's
//! `client::conn::http1`. hyper-util's pooled `Client` costs a mutex on a pool shared by
//! every clone, a spawned task per request to return the connection once it is idle again,
//! and formatting and parsing an absolute URI per request; none of it is needed when each
//! proxy thread owns its connections.

use crate::body::ReqBody;
use crate::hop_tls::{SendError, Upstream};
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustc_hash::FxHashMap;
use std::cell::RefCell;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio_util::task::TaskTracker;

/// Idle connections older than this are closed.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Most connections kept per address.
const MAX_PER_ADDR: usize = 1024;

struct Conn {
    tx: SendRequest<ReqBody>,
    /// When it was last handed back (idle since then, once ready).
    since: Instant,
}

thread_local! {
    static POOL: RefCell<FxHashMap<SocketAddr, Vec<Conn>>> = RefCell::new(FxHashMap::default());
}

/// A ready connection to `addr` from this thread's pool, dropping closed and expired ones.
fn checkout(addr: SocketAddr) -> Option<SendRequest<ReqBody>> {
    POOL.with(|p| {
        let mut pool = p.borrow_mut();
        let conns = pool.get_mut(&addr)?;
        let mut i = conns.len();
        while i > 0 {
            i -= 1;
            let c = &conns[i];
            if c.tx.is_closed() {
                conns.swap_remove(i);
            } else if c.tx.is_ready() {
                let c = conns.swap_remove(i);
                if c.since.elapsed() < IDLE_TIMEOUT {
                    return Some(c.tx);
                }
            }
        }
        None
    })
}

/// Hands a connection back once its response head arrived (it serves the next request
/// once the response body has been read; [`checkout`] skips it until then).
fn checkin(addr: SocketAddr, tx: SendRequest<ReqBody>) {
    if tx.is_closed() {
        return;
    }
    POOL.with(|p| {
        let mut pool = p.borrow_mut();
        let conns = pool.entry(addr).or_default();
        if conns.len() < MAX_PER_ADDR {
            conns.push(Conn {
                tx,
                since: Instant::now(),
            });
        }
    });
}

/// Closes this thread's idle connections that expired, of both clients (run now and then).
pub(crate) fn sweep() {
    crate::h1::sweep();
    POOL.with(|p| {
        let mut pool = p.borrow_mut();
        pool.retain(|_, conns| {
            conns.retain(|c| {
                let expired = c.tx.is_ready() && c.since.elapsed() >= IDLE_TIMEOUT;
                !c.tx.is_closed() && !expired
            });
            !conns.is_empty()
        });
    });
}

/// A new connection to `up`, its connection task spawned on this thread through `tasks`
/// (the node's tracker).
async fn connect(up: Upstream<'_>, tasks: &TaskTracker) -> Result<SendRequest<ReqBody>, SendError> {
    let addr = up.addr;
    let stream = crate::hop_tls::connect(up).await?;
    let (tx, conn) = hyper::client::conn::http1::Builder::new()
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|err| SendError::Connect(err.to_string()))?;
    tasks.spawn(async move {
        if let Err(err) = conn.with_upgrades().await {
            tracing::debug!(error = %err, %addr, "upstream connection");
        }
    });
    Ok(tx)
}

/// Sends `req` (origin-form URI, `Host` set) to `up` over a pooled connection, or a new
/// one (its connection task tracked by `tasks`). A request a reused connection could not
/// take (it closed meanwhile) is sent on another.
pub(crate) async fn send(
    up: Upstream<'_>,
    mut req: Request<ReqBody>,
    tasks: &TaskTracker,
) -> Result<Response<Incoming>, SendError> {
    let addr = up.addr;
    loop {
        let (mut tx, reused) = match checkout(addr) {
            Some(tx) => (tx, true),
            None => (connect(up, tasks).await?, false),
        };
        match tx.try_send_request(req).await {
            Ok(resp) => {
                checkin(addr, tx);
                return Ok(resp);
            }
            Err(mut err) => match err.take_message() {
                Some(r) if reused => req = r,
                Some(_) => return Err(SendError::Connect(err.into_error().to_string())),
                None => return Err(SendError::Request(err.into_error().to_string())),
            },
        }
    }
}
