//! The proxy's Prometheus metrics, served as text at `/metrics` on the agent's API listener
//! with the agent's and the catalog's: families of labelled counters, gauges and latency
//! histograms kept in atomics, written with the catalog's [`Exposition`] (the one metrics
//! writer of the binary).

use bazaar_catalog::metrics::Exposition;
use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

/// Labels: the app.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct AppLabel {
    pub app: String,
}

/// Labels: the app and the response status code.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct StatusLabels {
    pub app: String,
    pub status: u16,
}

/// Labels: the app and a kind (of error, of wake result, of autostop action).
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct KindLabels {
    pub app: String,
    pub kind: &'static str,
}

/// A set of labels, as `(name, value)` pairs in their order on a sample.
pub trait Labels: Clone + Hash + Eq + Ord {
    fn pairs(&self) -> Vec<(&'static str, String)>;
}

impl Labels for AppLabel {
    fn pairs(&self) -> Vec<(&'static str, String)> {
        vec![("app", self.app.clone())]
    }
}

impl Labels for StatusLabels {
    fn pairs(&self) -> Vec<(&'static str, String)> {
        vec![
            ("app", self.app.clone()),
            ("status", self.status.to_string()),
        ]
    }
}

impl Labels for KindLabels {
    fn pairs(&self) -> Vec<(&'static str, String)> {
        vec![("app", self.app.clone()), ("kind", self.kind.to_string())]
    }
}

/// A metric that writes its samples for one label set.
pub trait Metric: Clone + Default {
    /// `counter`, `gauge` or `histogram`.
    const KIND: &'static str;
    /// Writes this metric's samples of family `name` with `labels`.
    fn write(&self, out: &mut Exposition, name: &str, labels: &[(&str, &str)]);
}

/// A metric per label set, made when a label set is first asked for.
#[derive(Debug)]
pub struct Family<L, M>(Arc<RwLock<HashMap<L, M>>>);

impl<L, M> Clone for Family<L, M> {
    fn clone(&self) -> Self {
        Family(self.0.clone())
    }
}

impl<L, M> Default for Family<L, M> {
    fn default() -> Self {
        Family(Arc::default())
    }
}

impl<L: Labels, M: Metric> Family<L, M> {
    /// The metric of `labels` (a handle on it: counting through it counts in the family).
    pub fn get_or_create(&self, labels: &L) -> M {
        if let Some(m) = self.0.read().unwrap_or_else(|e| e.into_inner()).get(labels) {
            return m.clone();
        }
        let mut map = self.0.write().unwrap_or_else(|e| e.into_inner());
        map.entry(labels.clone()).or_default().clone()
    }

    /// Writes the family: its `HELP` and `TYPE`, then its samples ordered by labels.
    fn write(&self, out: &mut Exposition, name: &str, help: &str) {
        out.family(name, M::KIND, help);
        let map = self.0.read().unwrap_or_else(|e| e.into_inner());
        let mut entries: Vec<(&L, &M)> = map.iter().collect();
        entries.sort_by(|a, b| a.0.cmp(b.0));
        for (labels, metric) in entries {
            let pairs = labels.pairs();
            let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
            metric.write(out, name, &pairs);
        }
    }
}

/// A counter.
#[derive(Debug, Clone, Default)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    /// Adds one; answers the count before.
    pub fn inc(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl Metric for Counter {
    const KIND: &'static str = "counter";
    fn write(&self, out: &mut Exposition, name: &str, labels: &[(&str, &str)]) {
        out.sample(&format!("{name}_total"), labels, self.get());
    }
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

impl Metric for ShardedCounter {
    const KIND: &'static str = "counter";
    fn write(&self, out: &mut Exposition, name: &str, labels: &[(&str, &str)]) {
        out.sample(&format!("{name}_total"), labels, self.get());
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

impl Metric for ShardedGauge {
    const KIND: &'static str = "gauge";
    fn write(&self, out: &mut Exposition, name: &str, labels: &[(&str, &str)]) {
        out.sample(name, labels, self.get());
    }
}

/// Bucket bounds of [`Latency`]: from 50 µs, doubling.
const LATENCY_BOUNDS: usize = 20;

/// A latency histogram (seconds; buckets from 50 µs doubling to ~26 s) that records without
/// locks and per thread (`SHARDS`): every request of every proxy thread observes one, and
/// a histogram behind a mutex (as prometheus-client's) would make proxy
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

impl Metric for Latency {
    const KIND: &'static str = "histogram";
    /// `_sum` and `_count`, then the cumulative `_bucket`s (`le` first).
    fn write(&self, out: &mut Exposition, name: &str, labels: &[(&str, &str)]) {
        let b = &self.0;
        let total = |i: usize| -> u64 {
            b.shards
                .iter()
                .map(|s| s.0.counts[i].load(Ordering::Relaxed))
                .sum()
        };
        let counts: Vec<u64> = (0..=LATENCY_BOUNDS).map(total).collect();
        let sum = b
            .shards
            .iter()
            .map(|s| s.0.sum_ns.load(Ordering::Relaxed))
            .sum::<u64>() as f64
            / 1e9;
        out.sample(&format!("{name}_sum"), labels, float(sum));
        out.sample(&format!("{name}_count"), labels, counts.iter().sum::<u64>());
        let bucket = format!("{name}_bucket");
        let mut cumulative = 0;
        for (i, n) in counts.iter().enumerate() {
            cumulative += n;
            let le = match b.bounds.get(i) {
                Some(bound) => float(*bound),
                None => "+Inf".to_string(),
            };
            let mut with_le = vec![("le", le.as_str())];
            with_le.extend_from_slice(labels);
            out.sample(&bucket, &with_le, cumulative);
        }
    }
}

/// A float as OpenMetrics writes it: always with a fraction or an exponent (`1.0`).
fn float(v: f64) -> String {
    let s = v.to_string();
    if v.is_finite() && !s.contains(['.', 'e']) {
        format!("{s}.0")
    } else {
        s
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
        static NEXT: AtomicU64 = AtomicU64::new(0);
        Metrics {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            requests: Family::default(),
            latency: Family::default(),
            upstream_errors: Family::default(),
            retries: Family::default(),
            in_flight: Family::default(),
            wakes: Family::default(),
            wake_latency: Family::default(),
            autostops: Family::default(),
            tcp_connections: Family::default(),
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
                    latency: self.latency.get_or_create(&label),
                    in_flight: self.in_flight.get_or_create(&label),
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
                    let c = self.requests.get_or_create(&StatusLabels {
                        app: app.to_string(),
                        status,
                    });
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

    /// The Prometheus text exposition of every family (without the closing `# EOF`).
    pub fn encode(&self) -> String {
        let mut out = Exposition::default();
        let p = "bazaar_proxy";
        self.requests.write(
            &mut out,
            &format!("{p}_requests"),
            "HTTP requests answered by this proxy, by app and status.",
        );
        self.latency.write(
            &mut out,
            &format!("{p}_request_duration_seconds"),
            "Time from request to response head, by app.",
        );
        self.upstream_errors.write(
            &mut out,
            &format!("{p}_upstream_errors"),
            "Failed attempts to reach a machine (connect, request, refused by its host).",
        );
        self.retries.write(
            &mut out,
            &format!("{p}_retries"),
            "Requests sent to another machine after a failed attempt.",
        );
        self.in_flight.write(
            &mut out,
            &format!("{p}_in_flight"),
            "Requests being served by this host's machines.",
        );
        self.wakes.write(
            &mut out,
            &format!("{p}_wakes"),
            "Machines started by the proxy (autostart), by result.",
        );
        self.wake_latency.write(
            &mut out,
            &format!("{p}_wake_duration_seconds"),
            "Time from a wake-up to the machine accepting connections.",
        );
        self.autostops.write(
            &mut out,
            &format!("{p}_autostops"),
            "Idle machines stopped or suspended by the proxy.",
        );
        self.tcp_connections.write(
            &mut out,
            &format!("{p}_tcp_connections"),
            "TCP connections delivered to this host's machines, by app.",
        );
        out.into_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_is_encoded_as_a_cumulative_histogram() {
        let m = Metrics::new();
        let app = AppLabel { app: "web".into() };
        let h = m.latency.get_or_create(&app);
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
