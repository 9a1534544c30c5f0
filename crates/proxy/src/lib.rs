//! The edge proxy (Fly's fly-proxy), served by every agent. It routes HTTP/1.1 and HTTP/2
//! requests for `<app>.<domain>` to the app's machines, deciding from the local catalog
//! alone ([`table`], rebuilt from the catalog's change stream).
//!
//! - Balancing ([`balance`]): started, healthy, uncordoned machines only; nearest first,
//!   least loaded by in-flight requests, above the soft limit only when all are, never above
//!   the hard limit; a request nothing can take waits (bounded), then gets a 503.
//! - Two hops, as on Fly: a machine of this host is reached directly; a machine of another
//!   host through that host's proxy (`proxy_addr` label of its host record; over mTLS to
//!   its hop listener, `proxy_hop_addr`, when both hosts have certificates: `hop_tls.rs`), which counts
//!   every request its machines serve, so hard limits and drains hold cluster-wide. A hop
//!   that could not deliver answers with `bazaar-proxy-retry`, and the first proxy tries
//!   another machine.
//! - Upstream HTTP/1.1: a request made ready to send (`request.rs`: body buffered when
//!   small, hop-by-hop headers left out) is exchanged directly on a pooled socket in its own
//!   task when its body is empty or buffered (`h1/`); streamed bodies and upgrades go
//!   through hyper's client (`pool.rs`).
//! - Retries: a request whose body is replayable (empty or buffered, ≤ 64 KiB) goes to
//!   another machine after a refused connection (any method) or a failed exchange
//!   (idempotent methods).
//! - Scale from zero and to zero (`scale.rs`): autostart wakes the nearest stopped machine
//!   through its owning agent, shared by concurrent requests; autostop drains and stops idle
//!   machines down to `min_machines_running`.
//! - WebSockets and other upgraded connections (`upgrade.rs`), spliced once the machine
//!   switches protocols.
//! - Raw TCP services (`tcp.rs`) and Prometheus metrics ([`metrics`], `/metrics`).
//! - HTTPS (`tls.rs`): TLS terminated with the certificate of the SNI name, from the
//!   cluster's certificates per app hostname (`bazaar_certs`); requests to an app's own
//!   hostname route to the app; ACME HTTP-01 challenges are answered by every proxy
//!   (`certs.rs`); `force_https` redirects plain HTTP.
//!
//! Entry point: [`Proxy::start`].

pub mod balance;
mod body;
mod certs;
mod h1;
mod hop_tls;
mod http;
pub mod metrics;
mod pool;
mod request;
mod scale;
pub mod table;
mod tcp;
mod timer;
mod tls;
mod upgrade;

/// The HTTP/1.1 decoders of the fast path, for fuzzing and differential tests.
pub use h1::{
    decode_chunked_body, parse_head, read_request_head, AnswerHead, Chunk, Framing, RequestHead,
};

use bazaar_node::NodeHandle;
use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use table::{Load, Table};
use tokio::sync::{watch, Notify};

/// Longest time a request is held while its machine is woken.
pub const WAKE_TIMEOUT: Duration = Duration::from_secs(15);

/// The proxy of one agent, cheap to clone.
#[derive(Debug, Clone)]
pub struct Proxy(Arc<Shared>);

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

/// Wall-clock milliseconds from the kernel's coarse clock: a few milliseconds of
/// resolution, and no hardware clock read (which costs more in a VM). For idle times, skip
/// windows and request ids, read several times per request.
pub(crate) fn coarse_now_ms() -> u64 {
    coarse_ms(libc::CLOCK_REALTIME_COARSE).unwrap_or_else(bazaar_types::now_ms)
}

/// Milliseconds of the kernel's coarse monotonic clock (as cheap as [`coarse_now_ms`], and
/// never stepped): for the proxy's timeouts.
pub(crate) fn coarse_monotonic_ms() -> u64 {
    coarse_ms(libc::CLOCK_MONOTONIC_COARSE).unwrap_or_else(|| {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        START
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_millis() as u64
    })
}

fn coarse_ms(clock: libc::clockid_t) -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec it is given.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000)
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

    fn rebuild(&self) {
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

    /// A request ended: wakes the requests waiting for a slot, if any.
    pub(crate) fn request_ended(&self) {
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.slot_freed.notify_waiters();
        }
    }
}

impl Proxy {
    /// Binds the agent's `proxy_listen` address (and, with a cluster certificate, the hop
    /// listener: `data_dir/proxy-hop.addr`), writes `data_dir/proxy.addr`, publishes
    /// the address in the host record and serves until the agent shuts down. Needs the
    /// agent's catalog attached. Must be called inside the tokio runtime.
    pub fn start(node: NodeHandle) -> anyhow::Result<Proxy> {
        use anyhow::Context;
        let config = node.config().clone();
        let catalog = node
            .catalog()
            .cloned()
            .context("the proxy needs the node's catalog")?;
        // One listener per proxy thread on the same address (SO_REUSEPORT): the kernel
        // spreads connections, and each thread serves its own without handing work across.
        let threads = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .clamp(1, 16);
        let first = bind_reuseport(config.proxy_listen)
            .with_context(|| format!("binding the proxy listener on {}", config.proxy_listen))?;
        let local_addr = first.local_addr()?;
        let mut listeners = vec![first];
        for _ in 1..threads {
            listeners.push(bind_reuseport(local_addr)?);
        }
        let tls_first = bind_reuseport(config.proxy_tls_listen).with_context(|| {
            format!(
                "binding the proxy's HTTPS listener on {}",
                config.proxy_tls_listen
            )
        })?;
        let tls_addr = tls_first.local_addr()?;
        let mut tls_listeners = vec![tls_first];
        for _ in 1..threads {
            tls_listeners.push(bind_reuseport(tls_addr)?);
        }
        let certs = bazaar_certs::CertStore::start(
            catalog.clone(),
            node.cluster_secret(),
            node.shutdown_token(),
            node.tasks(),
        );
        let tls_config = tls::server_config(certs.clone())?;
        // The hop listener, when this host has a certificate: one socket per thread too.
        let hop_tls = match node.host_link() {
            Some(link) => Some(hop_tls::HopTls::new(&link.identity, &link.ca_pem)?),
            None => None,
        };
        let mut hop_listeners = Vec::new();
        if hop_tls.is_some() {
            let hop_addr = config
                .proxy_hop_listen
                .unwrap_or(SocketAddr::new(config.proxy_listen.ip(), 0));
            let first = bind_reuseport(hop_addr)
                .with_context(|| format!("binding the proxy hop listener on {hop_addr}"))?;
            let hop_addr = first.local_addr()?;
            hop_listeners.push(first);
            for _ in 1..threads {
                hop_listeners.push(bind_reuseport(hop_addr)?);
            }
        }
        let hop_addr = hop_listeners.first().map(|l| l.local_addr()).transpose()?;
        let domain = config.proxy_domain.trim_matches('.').to_ascii_lowercase();
        let shared = Arc::new(Shared {
            host_id: node.host_id().to_string(),
            region: config.region.clone(),
            domain_suffix: format!(".{domain}"),
            secret: node.cluster_secret().to_string(),
            queue_timeout: config.proxy_queue_timeout,
            autostop_idle: config.autostop_idle,
            table: RwLock::new(Arc::new(Table::default())),
            table_gen: AtomicU64::new(0),
            id: {
                static NEXT: AtomicU64 = AtomicU64::new(0);
                NEXT.fetch_add(1, Ordering::Relaxed)
            },
            loads: Mutex::new(HashMap::new()),
            slot_freed: Notify::new(),
            waiting: AtomicUsize::new(0),
            wakes: Mutex::new(HashMap::new()),
            metrics: metrics::Metrics::new(),
            local_addr,
            certs,
            tls_addr,
            hop_tls,
            catalog,
            node: node.clone(),
        });
        shared.rebuild();
        std::fs::write(config.data_dir.join("proxy.addr"), local_addr.to_string())
            .context("writing proxy.addr")?;
        std::fs::write(config.data_dir.join("proxy-tls.addr"), tls_addr.to_string())
            .context("writing proxy-tls.addr")?;
        if let Some(hop_addr) = hop_addr {
            std::fs::write(config.data_dir.join("proxy-hop.addr"), hop_addr.to_string())
                .context("writing proxy-hop.addr")?;
        }
        let shutdown = node.shutdown_token();
        spawn_table_refresh(shared.clone(), shutdown.clone());
        let mut hop_listeners = hop_listeners.into_iter();
        for (i, listener) in listeners.into_iter().enumerate() {
            let hop = hop_listeners.next();
            http::spawn_server_thread(i, shared.clone(), listener, hop, shutdown.clone())?;
        }
        for (i, listener) in tls_listeners.into_iter().enumerate() {
            tls::spawn_server_thread(
                i,
                shared.clone(),
                listener,
                tls_config.clone(),
                shutdown.clone(),
            )?;
        }
        scale::spawn_autostop(shared.clone(), shutdown.clone());
        tcp::spawn(shared.clone(), config.proxy_listen.ip(), shutdown);
        {
            let publisher = node.clone();
            node.spawn(async move { publisher.set_proxy_addrs(local_addr, hop_addr).await });
        }
        tracing::info!(proxy.addr = %local_addr, proxy.tls_addr = %tls_addr, domain = %domain, "proxy listening");
        Ok(Proxy(shared))
    }

    /// Where the proxy listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.0.local_addr
    }

    /// Where the proxy's HTTPS listener is.
    pub fn tls_addr(&self) -> SocketAddr {
        self.0.tls_addr
    }

    /// The metrics, as Prometheus text.
    pub fn metrics_text(&self) -> String {
        self.0.metrics.encode()
    }

    /// Routes to merge into the agent's API: `GET /metrics` (with the cluster secret as a
    /// bearer token, as a Prometheus scrape config's `authorization` gives it: the metrics
    /// name every app and its traffic), and the host-interface
    /// extension `GET /host/v1/machines/{id}/traffic` (what this host's proxy is serving on
    /// one of its machines right now; the Machines API forwards
    /// `GET /v1/apps/{app}/machines/{id}/traffic` here, and deploys wait on it to drain).
    pub fn router(&self) -> axum::Router {
        let proxy = self.clone();
        let metrics = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let proxy = proxy.clone();
                async move {
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        proxy.metrics_text(),
                    )
                }
            }),
        );
        let traffic = axum::Router::new()
            .route(
                "/host/v1/machines/{id}/traffic",
                axum::routing::get(machine_traffic),
            )
            .with_state(self.clone());
        metrics
            .merge(traffic)
            .layer(axum::middleware::from_fn_with_state(
                self.0.node.clone(),
                bazaar_node::access::require_cluster_secret,
            ))
    }

    /// Requests and connections this host's proxy is serving on machine `id` (every proxy
    /// hands requests for this host's machines to it, so this is the machine's whole load),
    /// and when it last served one.
    pub fn traffic(&self, id: &str) -> (u32, u64) {
        let loads = lock(&self.0.loads);
        let prefix = format!("{id}:");
        loads
            .iter()
            .filter(|(key, _)| *key == id || key.starts_with(&prefix))
            .fold((0, 0), |(n, last), (_, load)| {
                (
                    n + load.inflight.load(Ordering::SeqCst),
                    last.max(load.last_active_ms.load(Ordering::SeqCst)),
                )
            })
    }
}

/// `GET /host/v1/machines/{id}/traffic`.
async fn machine_traffic(
    axum::extract::State(proxy): axum::extract::State<Proxy>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    // The machine must be this host's (the agent answers 404 otherwise).
    if let Err(err) = proxy.0.node.has_machine(&id).await {
        return err.into_response();
    }
    let (in_flight, last_ms) = proxy.traffic(&id);
    axum::Json(serde_json::json!({
        "machine_id": id,
        "in_flight": in_flight,
        "last_request_at": (last_ms > 0).then(|| bazaar_types::rfc3339(last_ms)),
    }))
    .into_response()
}

/// A listening socket with SO_REUSEPORT, detached from any runtime.
fn bind_reuseport(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(true)?;
    socket.set_nodelay(true)?;
    socket.bind(addr)?;
    socket.listen(1024)?.into_std()
}

/// Rebuilds the table on every catalog change (batched), and every 2 s regardless.
fn spawn_table_refresh(shared: Arc<Shared>, shutdown: tokio_util::sync::CancellationToken) {
    let mut rx = shared.catalog.subscribe();
    shared.node.clone().spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(2));
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                r = rx.recv() => match r {
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        while rx.try_recv().is_ok() {}
                        shared.rebuild();
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                },
                _ = tick.tick() => shared.rebuild(),
            }
        }
    });
}
