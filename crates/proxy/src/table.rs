//! The routing table: every app's machines as the local catalog sees them, rebuilt from the
//! catalog's change stream, with the per-machine load counters that outlive rebuilds.

use bazaar_catalog::{Catalog, MachineFilter, MachineRecord, ServiceRecord};
use bazaar_types::config::{Autostop, MachineService};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Live counters of one machine. On the owning host, `inflight` counts every request the
/// machine is serving (whichever proxy it came through); elsewhere it is this proxy's own
/// share, an estimate.
#[derive(Debug, Default)]
pub struct Load {
    pub inflight: AtomicU32,
    pub last_active_ms: AtomicU64,
    /// Autostop is taking the machine down: admit nothing new.
    pub draining: AtomicBool,
    /// A connection to it failed: skip it until then.
    pub failed_until_ms: AtomicU64,
    /// Whether the last table saw it started (to restart the idle clock on a start).
    pub was_started: AtomicBool,
    /// Its app's in-flight gauge, looked up on the first request (a request then counts
    /// itself there without cloning the handle).
    pub app_in_flight: std::sync::OnceLock<crate::metrics::ShardedGauge>,
}

impl Load {
    /// Counts one more request unless the machine is draining or at `hard`.
    pub fn try_admit(&self, hard: u32) -> bool {
        if self.draining.load(Ordering::SeqCst) {
            return false;
        }
        let ok = self
            .inflight
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < hard).then_some(n + 1)
            })
            .is_ok();
        if ok && self.draining.load(Ordering::SeqCst) {
            self.inflight.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        ok
    }

    /// Notes activity now. The clock is coarse: most requests find it already noted and
    /// leave the counter's cache line alone.
    pub fn touch(&self, now_ms: u64) {
        if self.last_active_ms.load(Ordering::Relaxed) != now_ms {
            self.last_active_ms.store(now_ms, Ordering::Relaxed);
        }
    }
}

/// A machine's state as far as routing goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteState {
    /// Started, healthy, uncordoned and its host alive.
    Ready,
    /// Stopped or suspended (can be started).
    Stopped,
    /// Being started.
    Starting,
    /// Anything else.
    Down,
}

impl RouteState {
    /// Of a machine in catalog state `state`, whose service checks pass (`healthy`),
    /// cordoned or not, on a host that is alive (`host_ok`) or not.
    pub fn of(state: &str, healthy: bool, cordoned: bool, host_ok: bool) -> RouteState {
        match state {
            "started" if healthy && !cordoned && host_ok => RouteState::Ready,
            "stopped" | "suspended" if host_ok => RouteState::Stopped,
            "starting" if host_ok => RouteState::Starting,
            _ => RouteState::Down,
        }
    }
}

/// The concurrency and scaling settings of a machine's routed service.
#[derive(Debug, Clone)]
pub struct Limits {
    pub soft: u32,
    /// `u32::MAX` for none.
    pub hard: u32,
    pub autostart: bool,
    pub autostop: Autostop,
    pub min_running: u32,
}

impl Limits {
    fn of(svc: &MachineService) -> Limits {
        let c = svc.concurrency.as_ref();
        Limits {
            soft: c.and_then(|c| c.soft_limit).unwrap_or(20).max(1),
            hard: c.and_then(|c| c.hard_limit).unwrap_or(u32::MAX).max(1),
            autostart: svc.autostart.unwrap_or(false),
            autostop: svc.autostop.unwrap_or(Autostop::Off),
            min_running: svc.min_machines_running.unwrap_or(0),
        }
    }
}

/// One machine of an app, for routing.
#[derive(Debug, Clone)]
pub struct Backend {
    pub id: String,
    pub app: String,
    pub host_id: String,
    pub state: RouteState,
    /// True when the catalog state is `started` (healthy or not).
    pub started: bool,
    pub distance: u8,
    /// Owned by this host: connect to `addr` directly.
    pub local: bool,
    /// Where the machine's service listens (on its host).
    pub addr: SocketAddr,
    /// The owning host's proxy, for machines of other hosts.
    pub hop: Option<SocketAddr>,
    /// The owning host's hop listener (mTLS), when it has a cluster certificate.
    pub hop_tls: Option<SocketAddr>,
    /// The name the owning host's certificate carries (`<host id>.hosts.bazaar.internal`).
    pub hop_name: Option<rustls::pki_types::ServerName<'static>>,
    pub limits: Limits,
    pub load: Arc<Load>,
}

/// The routed machines of one app.
#[derive(Debug, Default)]
pub struct AppRoute {
    /// Sorted by machine id.
    pub backends: Vec<Arc<Backend>>,
    /// Plain HTTP is redirected to HTTPS (301), as on Fly: a machine's HTTP service sets
    /// `force_https`, or serves HTTP only behind TLS (`handlers = ["tls", "http"]`).
    pub force_https: bool,
}

/// Whether an HTTP service sends plain HTTP to HTTPS.
pub fn forces_https(svc: &MachineService) -> bool {
    let http_ports = || {
        svc.ports
            .iter()
            .filter(|p| p.handlers.iter().any(|h| h == "http"))
    };
    http_ports().any(|p| p.force_https == Some(true))
        || (http_ports().next().is_some()
            && http_ports().all(|p| p.handlers.iter().any(|h| h == "tls")))
}

/// Every app. Looked up on every request, so with a fast hasher (the keys are app names
/// from the catalog; a request only looks up).
#[derive(Debug, Default)]
pub struct Table {
    pub apps: rustc_hash::FxHashMap<String, Arc<AppRoute>>,
    /// Raw TCP services by public port: the app and its machines (`addr` is the service's
    /// address on each machine's host).
    pub tcp: HashMap<u16, (String, Arc<AppRoute>)>,
}

/// Public ports of a service that carry raw TCP (no `http` handler).
pub fn tcp_ports(svc: &MachineService) -> impl Iterator<Item = u16> + '_ {
    svc.ports
        .iter()
        .filter(|p| !p.handlers.iter().any(|h| h == "http"))
        .filter_map(|p| p.port)
}

/// The service of a machine that HTTP traffic goes to: one with an `http` handler (port 80
/// first), else one without public ports (`bazaar machine run --port`).
pub fn http_service(m: &MachineRecord) -> Option<&ServiceRecord> {
    let has_http = |s: &&ServiceRecord| {
        s.service
            .ports
            .iter()
            .any(|p| p.handlers.iter().any(|h| h == "http"))
    };
    let on_80 = |s: &&ServiceRecord| {
        s.service
            .ports
            .iter()
            .any(|p| p.port == Some(80) && p.handlers.iter().any(|h| h == "http"))
    };
    m.services
        .iter()
        .find(on_80)
        .or_else(|| m.services.iter().find(has_http))
        .or_else(|| m.services.iter().find(|s| s.service.ports.is_empty()))
}

/// How a host's proxy is reached by other hosts' proxies.
struct HostHops {
    plain: Option<SocketAddr>,
    tls: Option<SocketAddr>,
    name: Option<rustls::pki_types::ServerName<'static>>,
}

/// Builds the table from the catalog. `loads` keeps the counters of machines across
/// rebuilds (and loses those of machines that are gone).
pub fn build(
    catalog: &Catalog,
    host_id: &str,
    region: &str,
    loads: &Mutex<HashMap<String, Arc<Load>>>,
) -> Table {
    let hosts: HashMap<String, HostHops> = catalog
        .hosts()
        .into_iter()
        .map(|h| {
            let label = |name: &str| h.record.labels.get(name).and_then(|a| a.parse().ok());
            let hops = HostHops {
                plain: label("proxy_addr"),
                tls: label(bazaar_node::host_link::PROXY_HOP_ADDR_LABEL),
                name: rustls::pki_types::ServerName::try_from(bazaar_pki::host_dns_name(
                    &h.record.id,
                ))
                .ok(),
            };
            (h.record.id, hops)
        })
        .collect();
    let mut apps: HashMap<String, AppRoute> = catalog
        .apps()
        .into_iter()
        .map(|a| (a.name, AppRoute::default()))
        .collect();
    let mut tcp: HashMap<u16, (String, AppRoute)> = HashMap::new();
    let mut loads = loads.lock().unwrap_or_else(|p| p.into_inner());
    let mut live = std::collections::HashSet::new();
    let now = crate::clock::now_ms();
    // A machine without services has nothing to route; one of an app that lost its name
    // (made on the other side of a partition) is not the app's of that name.
    let losing = catalog.losing_app_ids();
    for view in catalog.machines_where(&MachineFilter::default(), |m| {
        !m.services.is_empty() && !losing.contains(&m.app_id)
    }) {
        let m = &view.record;
        let http = http_service(m);
        let routed: Vec<(&ServiceRecord, bool, Vec<u16>)> = m
            .services
            .iter()
            .filter_map(|s| {
                let is_http = http.is_some_and(|h| std::ptr::eq(h, s));
                let ports: Vec<u16> = if is_http {
                    Vec::new()
                } else {
                    tcp_ports(&s.service).collect()
                };
                (is_http || !ports.is_empty()).then_some((s, is_http, ports))
            })
            .collect();
        if routed.is_empty() {
            continue;
        }
        let local = m.host_id == host_id;
        let healthy = m
            .checks
            .iter()
            .filter(|c| c.name.starts_with("servicecheck-"))
            .all(|c| c.status != "critical");
        let started = m.state == "started";
        let state = RouteState::of(&m.state, healthy, m.cordoned, view.host_status == "ok");
        let load = loads.entry(m.id.clone()).or_default().clone();
        if started && !load.was_started.swap(true, Ordering::SeqCst) {
            load.last_active_ms.store(now, Ordering::SeqCst);
        }
        if !started {
            load.was_started.store(false, Ordering::SeqCst);
            if m.state != "stopping" && m.state != "suspending" {
                load.draining.store(false, Ordering::SeqCst);
            }
        }
        live.insert(m.id.clone());
        let distance = if local {
            0
        } else if m.region == region {
            1
        } else {
            2
        };
        let backend = |svc: &ServiceRecord, load: Arc<Load>| {
            let ip = svc.address.parse::<std::net::IpAddr>().ok()?;
            Some(Arc::new(Backend {
                id: m.id.clone(),
                app: m.app.clone(),
                host_id: m.host_id.clone(),
                state,
                started,
                distance,
                local,
                addr: SocketAddr::new(ip, svc.port),
                hop: hosts.get(&m.host_id).and_then(|h| h.plain),
                hop_tls: hosts.get(&m.host_id).and_then(|h| h.tls),
                hop_name: hosts.get(&m.host_id).and_then(|h| h.name.clone()),
                limits: Limits::of(&svc.service),
                load,
            }))
        };
        for (svc, is_http, ports) in &routed {
            if *is_http {
                if let Some(b) = backend(svc, load.clone()) {
                    let route = apps.entry(m.app.clone()).or_default();
                    route.force_https |= forces_https(&svc.service);
                    route.backends.push(b);
                }
            }
            for port in ports {
                // Connections to a TCP service are counted on their own key.
                let key = format!("{}:{port}", m.id);
                let tload = loads.entry(key.clone()).or_default().clone();
                live.insert(key);
                let Some(b) = backend(svc, tload) else {
                    continue;
                };
                let entry = tcp
                    .entry(*port)
                    .or_insert_with(|| (m.app.clone(), AppRoute::default()));
                // One app per public port: the first by name wins.
                if entry.0 == m.app {
                    entry.1.backends.push(b);
                } else if m.app < entry.0 {
                    *entry = (m.app.clone(), AppRoute::default());
                    entry.1.backends.push(b);
                }
            }
        }
    }
    loads.retain(|id, _| live.contains(id));
    let sorted = |mut route: AppRoute| {
        route.backends.sort_by(|a, b| a.id.cmp(&b.id));
        Arc::new(route)
    };
    Table {
        apps: apps
            .into_iter()
            .map(|(name, route)| (name, sorted(route)))
            .collect(),
        tcp: tcp
            .into_iter()
            .map(|(port, (app, route))| (port, (app, sorted(route))))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bazaar_catalog::{AppRecord, CatalogConfig, HostRecord};

    /// Two apps of one name (made on both sides of a partition) meet in a catalog: only the
    /// machines of the app of the name (the earlier one) are routed under it, never the
    /// loser's, whichever host holds them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_machines_of_an_app_that_lost_its_name_are_not_routed() {
        let loopback: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
        let here = Catalog::start(CatalogConfig::new("h_here", "local", loopback, "s"))
            .await
            .unwrap();
        let mut config = CatalogConfig::new("h_there", "local", loopback, "s");
        config.seeds = vec![here.local_addr()];
        config.anti_entropy_interval = std::time::Duration::from_millis(200);
        let there = Catalog::start(config).await.unwrap();
        let app = |id: &str, host: &str, created_at_ms: u64| AppRecord {
            id: id.into(),
            name: "web".into(),
            org_slug: host.into(),
            created_at_ms,
            created_by_host: host.into(),
        };
        let machine = |id: &str, host: &str, app_id: &str| MachineRecord {
            id: id.into(),
            app: "web".into(),
            app_id: app_id.into(),
            host_id: host.into(),
            state: "started".into(),
            services: vec![ServiceRecord {
                service: crate::test_node::http_service(false),
                address: "127.0.0.1".into(),
                port: 8080,
            }],
            ..Default::default()
        };
        for (catalog, host) in [(&here, "h_here"), (&there, "h_there")] {
            catalog.publish_host(HostRecord {
                id: host.into(),
                region: "local".into(),
                ..Default::default()
            });
        }
        here.publish_app(app("app_00000000000000aa", "h_here", 200));
        here.publish_machine(machine("m-lost-here", "h_here", "app_00000000000000aa"));
        there.publish_app(app("app_00000000000000bb", "h_there", 100));
        there.publish_machine(machine("m-won", "h_there", "app_00000000000000bb"));
        there.publish_machine(machine("m-lost-there", "h_there", "app_00000000000000aa"));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while here.machines(&MachineFilter::default()).len() < 3
            || here.lost_to("web", "app_00000000000000aa").is_none()
        {
            assert!(std::time::Instant::now() < deadline, "the rows never met");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let table = build(&here, "h_here", "local", &Mutex::new(HashMap::new()));
        let routed: Vec<&str> = table.apps["web"]
            .backends
            .iter()
            .map(|b| b.id.as_str())
            .collect();
        assert_eq!(routed, ["m-won"]);
        there.kill().await;
        here.kill().await;
    }

    fn service(ports: serde_json::Value) -> MachineService {
        serde_json::from_value(serde_json::json!({
            "internal_port": 8080, "protocol": "tcp", "ports": ports,
        }))
        .unwrap()
    }

    #[test]
    fn which_services_force_https() {
        let forced = [
            serde_json::json!([{"port": 80, "handlers": ["http"], "force_https": true}]),
            serde_json::json!([{"port": 443, "handlers": ["tls", "http"]}]),
            serde_json::json!([
                {"port": 80, "handlers": ["http"], "force_https": true},
                {"port": 443, "handlers": ["tls", "http"]},
            ]),
        ];
        for ports in forced {
            assert!(forces_https(&service(ports.clone())), "{ports}");
        }
        let plain = [
            serde_json::json!([]),
            serde_json::json!([{"port": 80, "handlers": ["http"]}]),
            serde_json::json!([
                {"port": 80, "handlers": ["http"], "force_https": false},
                {"port": 443, "handlers": ["tls", "http"]},
            ]),
            serde_json::json!([{"port": 5432, "handlers": ["tls"]}]),
        ];
        for ports in plain {
            assert!(!forces_https(&service(ports.clone())), "{ports}");
        }
    }
}
