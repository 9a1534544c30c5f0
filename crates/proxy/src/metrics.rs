//! The proxy's Prometheus metrics (prometheus-client), served as text at `/metrics` on the
//! agent's API listener.

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;
use std::cell::RefCell;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Labels: the app.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AppLabel {
    pub app: String,
}

/// Labels: the app and the response status code.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabels {
    pub app: String,
    pub status: u16,
}

/// Labels: the app and a kind (of error, of wake result, of autostop action).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub app: String,
    pub kind: &'static str,
}

/// How many cells a per-thread metric has: each thread adds to its own cell (on its own
/// cache line), and reading sums them. Every request of every proxy thread counts itself
/// and records its latency; with one shared atomic per metric, the two cores of a small
/// host pass those cache lines back and forth on every request.
const SHARDS: usize = 8;

/// A value on a cache line of its own.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded<T>(T);

/// The calling thread's cell (threads beyond `SHARDS` share cells, which stays exact).
fn shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    SHARD.with(|s| *s)
}

/// A counter kept per thread (`SHARDS`), encoded as one Prometheus counter.
#[derive(Debug, Clone, Default)]
pub struct ShardedCounter(Arc<[Padded<AtomicU64>; SHARDS]>);

impl ShardedCounter {
    pub fn inc(&self) {
        self.0[shard()].0.fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.iter().map(|c| c.0.load(Ordering::Relaxed)).sum()
    }
}

impl TypedMetric for ShardedCounter {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for ShardedCounter {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_counter::<NoLabelSet, _, u64>(&self.get(), None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

/// A gauge kept per thread (`SHARDS`), encoded as one Prometheus gauge (a cell may go
/// below zero when another thread takes back what this one added; the sum is exact).
#[derive(Debug, Clone, Default)]
pub struct ShardedGauge(Arc<[Padded<AtomicI64>; SHARDS]>);

impl ShardedGauge {
    pub fn inc(&self) {
        self.0[shard()].0.fetch_add(1, Ordering::Relaxed);
    }

    pub fn dec(&self) {
        self.0[shard()].0.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn get(&self) -> i64 {
        self.0.iter().map(|c| c.0.load(Ordering::Relaxed)).sum()
    }
}

impl TypedMetric for ShardedGauge {
    const TYPE: MetricType = MetricType::Gauge;
}

impl EncodeMetric for ShardedGauge {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_gauge(&self.get())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }
}

/// Bucket bounds of [`Latency`]: from 50 µs, doubling.
const LATENCY_BOUNDS: usize = 20;

/// A latency histogram (seconds; buckets from 50 µs doubling to ~26 s) that records without
/// locks and per thread (`SHARDS`): every request of every proxy thread observes one, and
/// prometheus-client's own histogram takes a mutex per observation, which makes proxy
/// threads wait on each other (and on a thread preempted while holding it).
#[derive(Debug, Clone)]
pub struct Latency(Arc<LatencyBuckets>);

#[derive(Debug)]
struct LatencyBuckets {
    bounds: [f64; LATENCY_BOUNDS],
    shards: [Padded<LatencyShard>; SHARDS],
}

#[derive(Debug, Default)]
struct LatencyShard {
    /// One more than the bounds: the last counts everything above them (`+Inf`).
    counts: [AtomicU64; LATENCY_BOUNDS + 1],
    sum_ns: AtomicU64,
}

impl Default for Latency {
    fn default() -> Self {
        Latency(Arc::new(LatencyBuckets {
            bounds: std::array::from_fn(|i| 0.000_05 * 2f64.powi(i as i32)),
            shards: Default::default(),
        }))
    }
}

impl Latency {
    /// Records one duration, in seconds.
    pub fn observe(&self, seconds: f64) {
        let b = &self.0;
        let i = b.bounds.partition_point(|bound| *bound < seconds);
        let shard = &b.shards[shard()].0;
        shard.counts[i].fetch_add(1, Ordering::Relaxed);
        shard
            .sum_ns
            .fetch_add((seconds * 1e9) as u64, Ordering::Relaxed);
    }
}

impl TypedMetric for Latency {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Latency {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let b = &self.0;
        let total = |i: usize| -> u64 {
            b.shards
                .iter()
                .map(|s| s.0.counts[i].load(Ordering::Relaxed))
                .sum()
        };
        let buckets: Vec<(f64, u64)> = b
            .bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .enumerate()
            .map(|(i, bound)| (bound, total(i)))
            .collect();
        let count = buckets.iter().map(|(_, n)| n).sum();
        let sum = b
            .shards
            .iter()
            .map(|s| s.0.sum_ns.load(Ordering::Relaxed))
            .sum::<u64>() as f64
            / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// One app's request metrics, as a proxy thread keeps them at hand.
struct AppHandles {
    latency: Latency,
    in_flight: ShardedGauge,
    /// Request counters by status.
    statuses: Vec<(u16, ShardedCounter)>,
}

thread_local! {
    /// This thread's handles on the metrics of its proxy (by [`Metrics::id`]), by app: a
    /// request looks its metrics up without taking the families' locks or allocating
    /// label sets.
    static HANDLES: RefCell<(u64, rustc_hash::FxHashMap<String, AppHandles>)> = RefCell::new((u64::MAX, rustc_hash::FxHashMap::default()));
}

/// Most apps whose handles a thread keeps.
const MAX_CACHED_APPS: usize = 4096;

/// Every metric of the proxy.
#[derive(Debug)]
pub struct Metrics {
    /// Tells proxies apart in per-thread caches.
    id: u64,
    pub registry: Registry,
    pub requests: Family<StatusLabels, ShardedCounter>,
    pub latency: Family<AppLabel, Latency>,
    pub upstream_errors: Family<KindLabels, Counter>,
    pub retries: Family<AppLabel, Counter>,
    pub in_flight: Family<AppLabel, ShardedGauge>,
    pub wakes: Family<KindLabels, Counter>,
    pub wake_latency: Family<AppLabel, Latency>,
    pub autostops: Family<KindLabels, Counter>,
    pub tcp_connections: Family<AppLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("bazaar_proxy");
        let requests = Family::<StatusLabels, ShardedCounter>::default();
        let latency = Family::<AppLabel, Latency>::default();
        let upstream_errors = Family::<KindLabels, Counter>::default();
        let retries = Family::<AppLabel, Counter>::default();
        let in_flight = Family::<AppLabel, ShardedGauge>::default();
        let wakes = Family::<KindLabels, Counter>::default();
        let wake_latency = Family::<AppLabel, Latency>::default();
        let autostops = Family::<KindLabels, Counter>::default();
        let tcp_connections = Family::<AppLabel, Counter>::default();
        registry.register(
            "requests",
            "HTTP requests answered by this proxy, by app and status",
            requests.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time from request to response head, by app",
            latency.clone(),
        );
        registry.register(
            "upstream_errors",
            "Failed attempts to reach a machine (connect, request, refused by its host)",
            upstream_errors.clone(),
        );
        registry.register(
            "retries",
            "Requests sent to another machine after a failed attempt",
            retries.clone(),
        );
        registry.register(
            "in_flight",
            "Requests being served by this host's machines",
            in_flight.clone(),
        );
        registry.register(
            "wakes",
            "Machines started by the proxy (autostart), by result",
            wakes.clone(),
        );
        registry.register(
            "wake_duration_seconds",
            "Time from a wake-up to the machine accepting connections",
            wake_latency.clone(),
        );
        registry.register(
            "autostops",
            "Idle machines stopped or suspended by the proxy",
            autostops.clone(),
        );
        registry.register(
            "tcp_connections",
            "TCP connections delivered to this host's machines, by app",
            tcp_connections.clone(),
        );
        static NEXT: AtomicU64 = AtomicU64::new(0);
        Metrics {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            registry,
            requests,
            latency,
            upstream_errors,
            retries,
            in_flight,
            wakes,
            wake_latency,
            autostops,
            tcp_connections,
        }
    }

    fn with_app<R>(&self, app: &str, f: impl FnOnce(&mut AppHandles) -> R) -> R {
        HANDLES.with(|h| {
            let (id, apps) = &mut *h.borrow_mut();
            if *id != self.id || apps.len() >= MAX_CACHED_APPS {
                *id = self.id;
                apps.clear();
            }
            if !apps.contains_key(app) {
                let label = AppLabel {
                    app: app.to_string(),
                };
                let handles = AppHandles {
                    latency: self.latency.get_or_create(&label).clone(),
                    in_flight: self.in_flight.get_or_create(&label).clone(),
                    statuses: Vec::new(),
                };
                apps.insert(app.to_string(), handles);
            }
            f(apps.get_mut(app).expect("just inserted"))
        })
    }

    /// Counts one answered request of `app` and records its latency.
    pub fn record_request(&self, app: &str, status: u16, seconds: f64) {
        self.with_app(app, |h| {
            h.latency.observe(seconds);
            match h.statuses.iter().find(|(s, _)| *s == status) {
                Some((_, c)) => {
                    c.inc();
                }
                None => {
                    let c = self
                        .requests
                        .get_or_create(&StatusLabels {
                            app: app.to_string(),
                            status,
                        })
                        .clone();
                    c.inc();
                    h.statuses.push((status, c));
                }
            }
        });
    }

    /// The gauge of `app`'s requests in flight on this host's machines.
    pub fn in_flight_of(&self, app: &str) -> ShardedGauge {
        self.with_app(app, |h| h.in_flight.clone())
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(err) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!(error = %err, "encoding metrics");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_is_encoded_as_a_cumulative_histogram() {
        let m = Metrics::new();
        let app = AppLabel { app: "web".into() };
        let h = m.latency.get_or_create(&app).clone();
        h.observe(0.000_01); // first bucket (le 5e-5)
        h.observe(0.000_05); // a bound is inclusive: still the first bucket
        h.observe(0.003); // le 0.0032
        h.observe(1000.0); // +Inf
        let text = m.encode();
        let line = |le: &str| {
            let key =
                format!("bazaar_proxy_request_duration_seconds_bucket{{le=\"{le}\",app=\"web\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(key.as_str()).map(str::to_string))
                .unwrap_or_else(|| panic!("no bucket {le} in\n{text}"))
        };
        assert_eq!(line("0.00005"), "2");
        assert_eq!(line("0.0016"), "2");
        assert_eq!(line("0.0032"), "3");
        assert_eq!(line("+Inf"), "4");
        assert!(
            text.contains("bazaar_proxy_request_duration_seconds_count{app=\"web\"} 4"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE bazaar_proxy_request_duration_seconds histogram"),
            "{text}"
        );
    }

    #[test]
    fn per_thread_cells_add_up() {
        let m = Metrics::new();
        m.record_request("web", 200, 0.001);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    m.record_request("web", 200, 0.001);
                    m.in_flight_of("web").inc();
                });
            }
        });
        m.in_flight_of("web").dec();
        let text = m.encode();
        assert!(
            text.contains("bazaar_proxy_requests_total{app=\"web\",status=\"200\"} 4"),
            "{text}"
        );
        assert!(
            text.contains("bazaar_proxy_in_flight{app=\"web\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("bazaar_proxy_request_duration_seconds_count{app=\"web\"} 4"),
            "{text}"
        );
    }
}
