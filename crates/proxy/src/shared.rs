//! The state every stage of the proxy reads: the routing table (and each thread's cached
//! reference to it), the machines' load counters, wake-ups in progress, waiting requests,
//! metrics, certificates and the hop's TLS. Owned by [`crate::Proxy`]; below every stage.

use crate::table::{self, Load, Table};
use crate::{hop_tls, metrics};
use bazaar_node::NodeHandle;
use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify};

pub(crate) type WakeResult = Option<Result<(), String>>;

pub(crate) struct Shared {
    pub node: NodeHandle,
    pub catalog: bazaar_catalog::Catalog,
    pub host_id: String,
    pub region: String,
    pub domain_suffix: String,
    pub secret: String,
    pub queue_timeout: Duration,
    pub autostop_idle: Duration,
    pub table: RwLock<Arc<Table>>,
    /// Bumped after every rebuild of `table`: proxy threads keep their own reference to
    /// the table and take the lock only when it changed ([`Shared::with_table`]).
    pub table_gen: AtomicU64,
    /// Tells proxies apart in per-thread caches.
    pub id: u64,
    pub loads: Mutex<HashMap<String, Arc<Load>>>,
    /// Notified when a request ends or the table changes (waiting requests look again);
    /// only while some request waits ([`Shared::wait_for_slot`]), so that ending a request
    /// touches no shared lock on the hot path.
    pub slot_freed: Notify,
    /// Requests waiting for a slot.
    pub waiting: AtomicUsize,
    /// Wake-ups in progress, by machine id: concurrent requests share one.
    pub wakes: Mutex<HashMap<String, watch::Receiver<WakeResult>>>,
    pub metrics: metrics::Metrics,
    pub local_addr: SocketAddr,
    /// The cluster's certificates per app hostname (HTTPS, and routing by hostname).
    pub certs: bazaar_certs::CertStore,
    /// Where the HTTPS listener is.
    pub tls_addr: SocketAddr,
    /// Hops over mTLS (`hop_tls.rs`), when this host has a cluster certificate.
    pub hop_tls: Option<hop_tls::HopTls>,
    /// The host is shutting down: hops are refused (the entry proxy goes elsewhere) and
    /// client connections close after their current answer, while the requests already
    /// in flight finish ([`Shared::settle`]).
    pub closing: AtomicBool,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("host_id", &self.host_id)
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

/// A proxy thread's handle on the shared state, cloned per request instead of the
/// `Arc<Shared>` itself: its reference count stays in this thread's core's cache rather
/// than bouncing between the proxy threads on every request.
pub(crate) struct Local(pub Arc<Shared>);

impl std::ops::Deref for Local {
    type Target = Arc<Shared>;
    fn deref(&self) -> &Arc<Shared> {
        &self.0
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    pub fn table(&self) -> Arc<Table> {
        self.table.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Runs `f` on the current table, through this thread's own reference to it (renewed
    /// when the table changed): no lock and no shared reference count per request. `f`
    /// must not call `with_table` again.
    pub(crate) fn with_table<R>(&self, f: impl FnOnce(&Table) -> R) -> R {
        thread_local! {
            /// (proxy id, table generation, table).
            static TABLE: RefCell<Option<(u64, u64, Arc<Table>)>> = const { RefCell::new(None) };
        }
        let gen = self.table_gen.load(Ordering::Acquire);
        TABLE.with(|cached| {
            let mut cached = cached.borrow_mut();
            let table = match &mut *cached {
                Some((id, g, t)) if *id == self.id && *g == gen => t,
                slot => &mut slot.insert((self.id, gen, self.table())).2,
            };
            f(table)
        })
    }

    pub(crate) fn rebuild(&self) {
        let t = table::build(&self.catalog, &self.host_id, &self.region, &self.loads);
        *self.table.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(t);
        self.table_gen.fetch_add(1, Ordering::AcqRel);
        self.slot_freed.notify_waiters();
    }

    /// Waits until a request ends or the table changes, or `pause` passes (a notification
    /// sent just before the wait began is only caught by the pause).
    pub(crate) async fn wait_for_slot(&self, pause: Duration) {
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(&self.waiting);
        tokio::select! {
            () = self.slot_freed.notified() => {}
            () = tokio::time::sleep(pause) => {}
        }
    }

    /// Once the host shuts down (listeners closed, `closing` set): waits, at most `grace`,
    /// until no HTTP request is in flight on any machine, so that an answer under way when
    /// the agent stops (or restarts onto a new binary) is sent whole rather than cut.
    pub(crate) async fn settle(&self, grace: Duration) {
        let until = Instant::now() + grace;
        loop {
            let busy: u64 = self
                .table()
                .apps
                .values()
                .flat_map(|route| route.backends.iter())
                .map(|b| u64::from(b.load.inflight.load(Ordering::SeqCst)))
                .sum();
            let now = Instant::now();
            if busy == 0 || now >= until {
                return;
            }
            self.wait_for_slot((until - now).min(Duration::from_millis(10)))
                .await;
        }
    }

    /// A request ended: wakes the requests waiting for a slot, if any.
    pub(crate) fn request_ended(&self) {
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.slot_freed.notify_waiters();
        }
    }
}
