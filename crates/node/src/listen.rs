//! The accept loop of a host's own listeners (the API port, plain or HTTPS, and the host
//! listener) and the admission that keeps strangers from exhausting them.
//!
//! Every connection is counted against [`Limits::max_connections`] (at most half the
//! process's open-file limit: [`Limits::within_open_files`], so the proxy and the store
//! always have descriptors left) and, until a request on it carries a credential the host
//! accepts ([`Admitted::trust`]), against [`Limits::max_untrusted_per_source`] for its source
//! address. A connection over either cap makes room by closing the oldest connection not yet
//! trusted (of its source, or of all): a flood of idle connections costs an authenticated
//! caller at most one eviction and never locks it out. Only when every slot is trusted is a
//! new connection refused. How long a request head (a TLS handshake too) may take is the
//! serving code's, from [`Limits::head_timeout`]: hyper's header read timeout, which also
//! closes a kept-alive connection idle that long.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How many connections a host's listeners hold, and for how long a request head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once on every listener sharing an [`Admission`].
    pub max_connections: usize,
    /// Connections from one source address that have carried no accepted credential yet.
    pub max_untrusted_per_source: usize,
    /// Longest a request head (or a TLS handshake) may take, and a kept-alive connection
    /// may idle.
    pub head_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: 16_384,
            max_untrusted_per_source: 256,
            head_timeout: Duration::from_secs(10),
        }
    }
}

impl Limits {
    /// These limits with `max_connections` at most half of `open_files` (the process's
    /// limit on open files): the other half is kept for the proxy, the store, the catalog
    /// and the machines' supervision.
    pub fn within_open_files(mut self, open_files: u64) -> Limits {
        let half = usize::try_from(open_files / 2).unwrap_or(usize::MAX);
        self.max_connections = self.max_connections.min(half).max(1);
        self.max_untrusted_per_source = self.max_untrusted_per_source.max(1);
        self
    }
}

/// The connections of one or more listeners, and the rule of who gets a place.
#[derive(Debug)]
pub struct Admission {
    limits: Limits,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Connections counted now.
    open: usize,
    /// The number the next connection gets (older connections have smaller ones).
    next: u64,
    /// Connections not trusted yet, oldest first: their source and what closes them.
    untrusted: BTreeMap<u64, (IpAddr, CancellationToken)>,
    /// The same connections by source.
    by_source: HashMap<IpAddr, BTreeSet<u64>>,
}

impl State {
    /// Closes untrusted connection `seq`: it stops counting now (its socket closes as its
    /// task sees the token).
    fn evict(&mut self, seq: u64) {
        if let Some((source, closed)) = self.untrusted.remove(&seq) {
            self.forget_source(source, seq);
            self.open -= 1;
            closed.cancel();
        }
    }

    fn forget_source(&mut self, source: IpAddr, seq: u64) {
        if let Some(set) = self.by_source.get_mut(&source) {
            set.remove(&seq);
            if set.is_empty() {
                self.by_source.remove(&source);
            }
        }
    }
}

impl Admission {
    pub fn new(limits: Limits) -> Arc<Admission> {
        Arc::new(Admission {
            limits,
            state: Mutex::new(State::default()),
        })
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Connections counted now.
    pub fn open(&self) -> usize {
        self.lock().open
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for a new connection from `source`, made by evicting the oldest untrusted
    /// connection of that source (over its cap) or of all (over the total); `None` when
    /// every place is held by a trusted connection.
    pub fn admit(self: &Arc<Self>, source: IpAddr) -> Option<Arc<Admitted>> {
        let mut s = self.lock();
        let of_source = s.by_source.get(&source).map_or(0, BTreeSet::len);
        if of_source >= self.limits.max_untrusted_per_source {
            let oldest = s
                .by_source
                .get(&source)
                .and_then(|set| set.first().copied());
            if let Some(seq) = oldest {
                s.evict(seq);
            }
        }
        if s.open >= self.limits.max_connections {
            let oldest = s.untrusted.keys().next().copied()?;
            s.evict(oldest);
        }
        let seq = s.next;
        s.next += 1;
        s.open += 1;
        let closed = CancellationToken::new();
        s.untrusted.insert(seq, (source, closed.clone()));
        s.by_source.entry(source).or_default().insert(seq);
        Some(Arc::new(Admitted {
            admission: self.clone(),
            seq,
            source,
            closed,
            trusted: AtomicBool::new(false),
        }))
    }
}

/// One admitted connection, counted until the last handle to it is dropped.
#[derive(Debug)]
pub struct Admitted {
    admission: Arc<Admission>,
    seq: u64,
    source: IpAddr,
    closed: CancellationToken,
    trusted: AtomicBool,
}

impl Admitted {
    /// A request on this connection carried a credential the host accepts (or its TLS
    /// peer is a host of the cluster): it is never evicted, and no longer counts against
    /// its source's cap.
    pub fn trust(&self) {
        if self.trusted.swap(true, Ordering::Relaxed) {
            return;
        }
        let mut s = self.admission.lock();
        if s.untrusted.remove(&self.seq).is_some() {
            s.forget_source(self.source, self.seq);
        }
    }

    /// Whether [`Admitted::trust`] was called.
    pub fn is_trusted(&self) -> bool {
        self.trusted.load(Ordering::Relaxed)
    }

    /// Completes when the connection was evicted to make room for another.
    pub async fn evicted(&self) {
        self.closed.cancelled().await;
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut s = self.admission.lock();
        if s.untrusted.remove(&self.seq).is_some() {
            s.forget_source(self.source, self.seq);
        }
        // An evicted connection stopped counting when it was evicted.
        if !self.closed.is_cancelled() {
            s.open -= 1;
        }
    }
}

/// Accepts connections on `listener` until `stop`, on a task of `tracker`: each admitted one
/// is served by `serve` on a task of its own, also of `tracker`, which ends when `serve`
/// does, when the connection is evicted or at `stop` (so draining the tracker closes every
/// connection); one [`Admission::admit`] refuses is closed at once. An accept
/// error (out of file descriptors, say) is logged and the loop pauses briefly, then goes on.
pub fn spawn_accept_loop<F, Fut>(
    name: &'static str,
    listener: TcpListener,
    admission: Arc<Admission>,
    stop: CancellationToken,
    tracker: &TaskTracker,
    serve: F,
) -> tokio::task::JoinHandle<()>
where
    F: Fn(TcpStream, SocketAddr, Arc<Admitted>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let connections = tracker.clone();
    tracker.spawn(async move {
        loop {
            let (stream, peer) = tokio::select! {
                () = stop.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(err) => {
                        tracing::warn!(listener = name, error = %err, "accept");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let Some(conn) = admission.admit(peer.ip()) else {
                tracing::debug!(listener = name, %peer, "refused: every place is trusted");
                continue;
            };
            let _ = stream.set_nodelay(true);
            let served = serve(stream, peer, conn.clone());
            let stop = stop.clone();
            connections.spawn(async move {
                tokio::select! {
                    () = served => {}
                    () = conn.evicted() => {
                        tracing::debug!(listener = name, %peer, "evicted for a newer connection");
                    }
                    () = stop.cancelled() => {}
                }
            });
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn limits(total: usize, per_source: usize) -> Limits {
        Limits {
            max_connections: total,
            max_untrusted_per_source: per_source,
            head_timeout: Duration::from_secs(10),
        }
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
    }

    #[test]
    fn half_the_open_files_at_most() {
        let l = Limits::default().within_open_files(1024);
        assert_eq!(l.max_connections, 512);
        let l = Limits::default().within_open_files(1 << 20);
        assert_eq!(l.max_connections, Limits::default().max_connections);
    }

    #[test]
    fn over_the_total_the_oldest_untrusted_connection_makes_room() {
        let admission = Admission::new(limits(3, 10));
        let a = admission.admit(ip(1)).unwrap();
        let b = admission.admit(ip(2)).unwrap();
        let c = admission.admit(ip(3)).unwrap();
        a.trust();
        let d = admission.admit(ip(4)).unwrap();
        // `a` is trusted: `b`, the oldest untrusted, went.
        assert!(b.closed.is_cancelled());
        assert!(!a.closed.is_cancelled() && !c.closed.is_cancelled());
        assert_eq!(admission.open(), 3);
        drop(b);
        assert_eq!(admission.open(), 3, "an evicted connection counted once");
        c.trust();
        d.trust();
        assert!(admission.admit(ip(5)).is_none(), "every place is trusted");
        drop(c);
        assert!(admission.admit(ip(5)).is_some());
    }

    #[test]
    fn over_its_cap_a_source_makes_room_among_its_own() {
        let admission = Admission::new(limits(100, 2));
        let a1 = admission.admit(ip(1)).unwrap();
        let other = admission.admit(ip(2)).unwrap();
        let a2 = admission.admit(ip(1)).unwrap();
        let a3 = admission.admit(ip(1)).unwrap();
        assert!(a1.closed.is_cancelled());
        assert!(!other.closed.is_cancelled() && !a2.closed.is_cancelled());
        // A trusted connection leaves its source's count.
        a2.trust();
        let a4 = admission.admit(ip(1)).unwrap();
        assert!(!a3.closed.is_cancelled() && !a4.closed.is_cancelled());
        assert!(a2.is_trusted() && !a3.is_trusted());
        drop((a1, a2, a3, a4, other));
        assert_eq!(admission.open(), 0);
    }

    /// Real sockets: idle connections past the cap are closed oldest first, and the
    /// newest (an authenticated caller's, say) is served.
    #[tokio::test]
    async fn the_loop_closes_evicted_connections_and_serves_new_ones() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let admission = Admission::new(limits(4, 100));
        let stop = CancellationToken::new();
        let tracker = TaskTracker::new();
        // Answers one byte per byte read, forever.
        spawn_accept_loop(
            "test",
            listener,
            admission.clone(),
            stop.clone(),
            &tracker,
            |mut stream, _, _| async move {
                let mut b = [0u8; 1];
                while let Ok(1) = stream.read(&mut b).await {
                    let _ = stream.write_all(&b).await;
                }
            },
        );
        let mut idle = Vec::new();
        for _ in 0..20 {
            idle.push(TcpStream::connect(addr).await.unwrap());
        }
        let mut caller = TcpStream::connect(addr).await.unwrap();
        caller.write_all(b"x").await.unwrap();
        let mut b = [0u8; 1];
        tokio::time::timeout(Duration::from_secs(5), caller.read_exact(&mut b))
            .await
            .expect("the newest connection is served")
            .unwrap();
        // The oldest were closed (EOF), the 3 newest idle ones are open.
        let mut closed = 0;
        for s in &mut idle {
            let mut b = [0u8; 1];
            if let Ok(Ok(0)) =
                tokio::time::timeout(Duration::from_millis(200), s.read(&mut b)).await
            {
                closed += 1;
            }
        }
        assert_eq!(closed, 17);
        assert!(admission.open() <= 4);
        stop.cancel();
    }

    /// Stopping ends the connection tasks too: the tracker drains with a connection still
    /// open, and the client sees it closed.
    #[tokio::test]
    async fn stopping_closes_open_connections_and_drains_their_tasks() {
        use tokio::io::AsyncReadExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let tracker = TaskTracker::new();
        let (served_tx, mut served) = tokio::sync::mpsc::channel(1);
        spawn_accept_loop(
            "test",
            listener,
            Admission::new(limits(4, 4)),
            stop.clone(),
            &tracker,
            move |_stream, _, _| {
                let served_tx = served_tx.clone();
                async move {
                    let _ = served_tx.send(()).await;
                    // A connection that never ends on its own (holding its stream).
                    std::future::pending::<()>().await;
                    drop(_stream);
                }
            },
        );
        let mut client = TcpStream::connect(addr).await.unwrap();
        served.recv().await.expect("the connection is served");
        stop.cancel();
        tracker.close();
        tokio::time::timeout(Duration::from_secs(5), tracker.wait())
            .await
            .expect("every task of the listener ends at stop");
        let mut b = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), client.read(&mut b)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "closed: {read:?}");
    }
}
