//! The edge proxy (Fly's fly-proxy), served by every agent. It routes HTTP/1.1 and HTTP/2
//! requests for `<app>.<domain>` to the app's machines, deciding from the local catalog
//! alone ([`table`], rebuilt from the catalog's change stream).
//!
//! - Routing (`route.rs`, pure; the one candidate rule for HTTP and TCP) and balancing
//!   ([`balance`]): started, healthy, uncordoned machines, else one woken; nearest first,
//!   least loaded by in-flight requests, above the soft limit only when all are, never above
//!   the hard limit; a request nothing can take waits (bounded), then gets a 503.
//! - Two hops, as on Fly: a machine of this host is reached directly; a machine of another
//!   host through that host's proxy (`proxy_addr` label of its host record; over mTLS to
//!   its hop listener, `proxy_hop_addr`, when both hosts have certificates: `hop_tls.rs`, `ingress/hop.rs`), which counts
//!   every request its machines serve, so hard limits and drains hold cluster-wide. A hop
//!   that could not deliver answers with `bazaar-proxy-retry`, and the first proxy tries
//!   another machine.
//! - Upstream HTTP/1.1: a request made ready to send (`request.rs`: body buffered when
//!   small, hop-by-hop headers left out) is exchanged directly on a pooled socket in its own
//!   task when its body is empty or buffered (`h1/`); streamed bodies and upgrades go
//!   through hyper's client (`pool.rs`).
//! - Retries: a request whose body is replayable (empty or buffered, ≤ 64 KiB) goes to
//!   another machine after a refused connection or an undelivered hop (any method) or a
//!   failed exchange (idempotent methods).
//! - Shutdown (`ingress/mod.rs` `settle`): the listeners close, hops are answered
//!   `bazaar-proxy-retry`, and the HTTP answers under way get up to 4 s to finish.
//! - Scale from zero and to zero (`scale.rs`): autostart wakes the nearest stopped machine
//!   through its owning agent, shared by concurrent requests; autostop drains and stops idle
//!   machines down to `min_machines_running`.
//! - WebSockets and other upgraded connections (`upgrade.rs`), spliced once the machine
//!   switches protocols.
//! - Raw TCP services (`tcp.rs`) and Prometheus metrics ([`metrics`], `/metrics`).
//! - HTTPS (`ingress/tls.rs`): TLS terminated with the certificate of the SNI name, from the
//!   cluster's certificates per app hostname (`bazaar_certs`); requests to an app's own
//!   hostname route to the app; ACME HTTP-01 challenges are answered by every proxy
//!   (`certs.rs`); `force_https` redirects plain HTTP.
//!
//! Entry point: [`Proxy::start`].
#![forbid(unsafe_code)]

// A pipeline: ingress -> route -> upstream -> egress, driven by the request paths (`http`,
// `tcp`). Modules import downward only, never in a circle (`tests/layering.rs` checks it);
// nothing imports from this root, the composition.
//
// Ingress: the listeners (plain, TLS, hop) and the HTTP/1.1 server.
mod ingress;
// The request paths: HTTP (and the owner side of hops), raw TCP; ACME answers and
// routing by attached hostname.
mod certs;
mod http;
mod tcp;
// Route: which machine takes a request or connection (pure).
mod route;
// Upstream: the two HTTP clients, connecting (plain or mTLS), waking machines.
mod h1;
mod hop_tls;
mod pool;
mod scale;
// Egress and the request as sent: bodies, the proxy's own answers, upgrades spliced, the
// wire vocabulary (hop headers, hop-by-hop rules).
mod body;
mod request;
mod upgrade;
mod wire;
// Below every stage: the shared state, the table, the balancer, metrics, clocks.
pub mod balance;
mod clock;
pub mod metrics;
mod shared;
pub mod table;
#[cfg(test)]
mod test_node;
mod timer;

/// The HTTP/1.1 decoders of the fast path, for fuzzing and differential tests.
pub use h1::{decode_chunked_body, parse_head, AnswerHead, Chunk, Framing};
pub use ingress::h1::{read_request_head, RequestHead};
pub use scale::WAKE_TIMEOUT;

use bazaar_node::NodeHandle;
use shared::{lock, Shared};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use table::Table;
use tokio::sync::Notify;

/// The proxy of one agent, cheap to clone.
#[derive(Debug, Clone)]
pub struct Proxy(Arc<Shared>);

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
        let tls_config = ingress::tls::server_config(certs.clone())?;
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
            closing: std::sync::atomic::AtomicBool::new(false),
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
        {
            let (shared, shutdown) = (shared.clone(), shutdown.clone());
            node.spawn(async move {
                shutdown.cancelled().await;
                shared.closing.store(true, Ordering::SeqCst);
            });
        }
        spawn_table_refresh(shared.clone(), shutdown.clone());
        let mut hop_listeners = hop_listeners.into_iter();
        for (i, listener) in listeners.into_iter().enumerate() {
            let hop = hop_listeners.next();
            ingress::spawn_server_thread(i, shared.clone(), listener, hop, shutdown.clone())?;
        }
        for (i, listener) in tls_listeners.into_iter().enumerate() {
            ingress::tls::spawn_server_thread(
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

    /// The metrics, as OpenMetrics text: the proxy's, then the agent's and its catalog's
    /// (`bazaar_node::Node::metrics_text`), then the closing `# EOF`.
    pub fn metrics_text(&self) -> String {
        let proxy = self.0.metrics.encode();
        let proxy = proxy.strip_suffix("# EOF\n").unwrap_or(&proxy);
        format!("{proxy}{}# EOF\n", self.0.node.metrics_text())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::Backend;
    use crate::test_node::{http_service, tcp_service, unused_addr, TestNode};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Reads until the peer closes (or the connection is reset); fails after `within`.
    async fn closed_within(stream: &mut tokio::net::TcpStream, within: Duration) -> bool {
        let mut buf = [0u8; 256];
        tokio::time::timeout(within, async {
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await
        .is_ok()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_cuts_open_connections_and_drains_every_proxy_task() {
        let (node, test) = TestNode::start().await;
        let proxy = Proxy::start(node.clone()).expect("the proxy starts");
        // A machine's TCP service that accepts and never answers nor closes.
        let backend = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let backend_addr = backend.local_addr().unwrap();
        let (accepted_tx, mut accepted) = tokio::sync::mpsc::channel(8);
        let held = tokio::spawn(async move {
            while let Ok((stream, _)) = backend.accept().await {
                let _ = accepted_tx.send(stream).await;
            }
        });
        let public = unused_addr().port();
        test.publish_machine("m_tcp", "started", tcp_service(public), backend_addr);

        // A raw TCP connection through the proxy (its listener comes up within a tick of
        // the table), spliced to the machine: a task on the node's multi-threaded runtime.
        let mut spliced = {
            let t0 = std::time::Instant::now();
            loop {
                if let Ok(s) = tokio::net::TcpStream::connect(("127.0.0.1", public)).await {
                    break s;
                }
                assert!(t0.elapsed() < Duration::from_secs(10), "no TCP listener");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        let upstream = tokio::time::timeout(Duration::from_secs(10), accepted.recv())
            .await
            .expect("the proxy connects to the machine")
            .unwrap();
        // An HTTP connection halfway through its request head: a task of a proxy thread.
        let mut http = tokio::net::TcpStream::connect(proxy.local_addr())
            .await
            .unwrap();
        http.write_all(b"GET / HTTP/1.1\r\nHost: web.test\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        // The threads, their tickers, both connections, the loops.
        assert!(node.tasks().len() >= 6, "{} tasks", node.tasks().len());

        let t0 = std::time::Instant::now();
        assert_eq!(node.drain(Duration::from_secs(5)).await, 0, "tasks left");
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert!(node.tasks().is_empty());
        // Drained means cut: both clients see their connection closed at once.
        assert!(closed_within(&mut spliced, Duration::from_secs(1)).await);
        assert!(closed_within(&mut http, Duration::from_secs(1)).await);
        drop(upstream);
        held.abort();
        test.catalog.kill().await;
    }

    /// Reads what the peer sends until it closes the connection; fails after `within`.
    async fn read_to_close(stream: &mut tokio::net::TcpStream, within: Duration) -> String {
        let mut out = Vec::new();
        tokio::time::timeout(within, stream.read_to_end(&mut out))
            .await
            .expect("the proxy closed the connection in time")
            .expect("read");
        String::from_utf8_lossy(&out).into_owned()
    }

    /// An agent that stops (or restarts onto a new binary, its machines running on) lets
    /// its proxy finish the answers under way: its listener closes at once, a hop another
    /// host's proxy sends on a kept connection is told to go elsewhere (not delivered), and
    /// a request a machine is still answering is answered whole. Cutting that answer was a
    /// 502 through the other hosts' proxies during rolling upgrades.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_finishes_the_answers_under_way_and_sends_hops_elsewhere() {
        let (node, test) = TestNode::start().await;
        let proxy = Proxy::start(node.clone()).expect("the proxy starts");
        // A machine that answers its first request only when told to, head and body apart.
        let machine = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let machine_addr = machine.local_addr().unwrap();
        let (got_tx, mut got) = tokio::sync::mpsc::channel(1);
        let (go_tx, go) = tokio::sync::oneshot::channel::<()>();
        let held = tokio::spawn(async move {
            let (mut s, _) = machine.accept().await.unwrap();
            let mut buf = Vec::new();
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                let mut chunk = [0u8; 1024];
                let n = s.read(&mut chunk).await.unwrap();
                assert!(n > 0, "the proxy closed the machine's connection");
                buf.extend_from_slice(&chunk[..n]);
            }
            got_tx.send(()).await.unwrap();
            go.await.unwrap();
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n")
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
            s.write_all(b"hello").await.unwrap();
            // Kept open, as a machine keeps its connections.
            let _ = s.read(&mut [0u8; 16]).await;
        });
        test.publish_machine("m1", "started", http_service(false), machine_addr);
        backend(&proxy.0, "m1");
        let addr = proxy.local_addr();
        // A connection of another host's proxy, kept open after a first hop.
        let hop = |machine: &str| {
            format!(
                "GET / HTTP/1.1\r\nHost: web.test\r\nbazaar-proxy-hop: secret\r\n\
                 bazaar-proxy-machine: {machine}\r\n\r\n"
            )
        };
        let mut kept = tokio::net::TcpStream::connect(addr).await.unwrap();
        kept.write_all(hop("m_none").as_bytes()).await.unwrap();
        let mut first = [0u8; 4096];
        let n = kept.read(&mut first).await.unwrap();
        let first = String::from_utf8_lossy(&first[..n]).into_owned();
        assert!(first.contains("bazaar-proxy-retry: failed"), "{first}");
        // A client's request, which the machine holds.
        let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: web.test\r\n\r\n")
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(10), got.recv())
            .await
            .expect("the request reaches the machine");

        let drain = tokio::spawn({
            let node = node.clone();
            async move { node.drain(Duration::from_secs(5)).await }
        });
        // The listener closes at once.
        let t0 = std::time::Instant::now();
        while tokio::net::TcpStream::connect(addr).await.is_ok()
            || !proxy.0.closing.load(Ordering::SeqCst)
        {
            assert!(t0.elapsed() < Duration::from_secs(5), "still listening");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // A hop on the kept connection: not delivered, the entry proxy goes elsewhere.
        kept.write_all(hop("m1").as_bytes()).await.unwrap();
        let answer = read_to_close(&mut kept, Duration::from_secs(5)).await;
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        assert!(answer.contains("bazaar-proxy-retry: failed"), "{answer}");
        assert!(answer.contains("connection: close"), "{answer}");
        // The answer under way is sent whole, then the connection closes.
        go_tx.send(()).unwrap();
        let answer = read_to_close(&mut client, Duration::from_secs(5)).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("\r\n\r\nhello"), "{answer}");
        assert_eq!(drain.await.unwrap(), 0, "tasks left");
        held.abort();
        test.catalog.kill().await;
    }

    /// The machine `id` of app `web` as the proxy's table has it.
    fn backend(shared: &Shared, id: &str) -> Backend {
        shared.rebuild();
        let table = shared.table();
        let b = table.apps["web"].backends.iter().find(|b| b.id == id);
        (**b.expect("the machine is routed")).clone()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_machine_at_rest_is_started_only_when_its_service_autostarts() {
        let (node, test) = TestNode::start().await;
        let proxy = Proxy::start(node.clone()).expect("the proxy starts");
        // A request waited for this machine while it was `starting` (started by someone
        // else; its service does not autostart). That start failed: it is stopped again.
        test.publish_machine("m_off", "stopped", http_service(false), unused_addr());
        let off = backend(&proxy.0, "m_off");
        let r = tokio::time::timeout(Duration::from_secs(5), scale::wake(&proxy.0, &off))
            .await
            .expect("the wake gives up at once");
        let err = r.expect_err("a machine without autostart is not started");
        assert!(err.contains("does not autostart"), "{err}");
        assert_eq!(test.starts.load(Ordering::SeqCst), 0, "started it anyway");

        // The same machine with autostart is started (the test node refuses, so the wake
        // keeps trying until its deadline).
        test.publish_machine("m_on", "stopped", http_service(true), unused_addr());
        let on = backend(&proxy.0, "m_on");
        let r = tokio::time::timeout(Duration::from_millis(500), scale::wake(&proxy.0, &on)).await;
        assert!(r.is_err(), "still waking");
        assert!(test.starts.load(Ordering::SeqCst) >= 1, "not started");
        node.drain(Duration::from_secs(5)).await;
        test.catalog.kill().await;
    }
}
