//! The proxy's Prometheus metrics (prometheus-client), served as text at `/metrics` on the
//! agent's API listener.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

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

fn latency_histogram() -> Histogram {
    // 50 µs .. ~26 s.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 20))
}

/// Every metric of the proxy.
#[derive(Debug)]
pub struct Metrics {
    pub registry: Registry,
    pub requests: Family<StatusLabels, Counter>,
    pub latency: Family<AppLabel, Histogram, fn() -> Histogram>,
    pub upstream_errors: Family<KindLabels, Counter>,
    pub retries: Family<AppLabel, Counter>,
    pub in_flight: Family<AppLabel, Gauge>,
    pub wakes: Family<KindLabels, Counter>,
    pub wake_latency: Family<AppLabel, Histogram, fn() -> Histogram>,
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
        let requests = Family::<StatusLabels, Counter>::default();
        let latency = Family::<AppLabel, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        let upstream_errors = Family::<KindLabels, Counter>::default();
        let retries = Family::<AppLabel, Counter>::default();
        let in_flight = Family::<AppLabel, Gauge>::default();
        let wakes = Family::<KindLabels, Counter>::default();
        let wake_latency = Family::<AppLabel, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
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
        Metrics {
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

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(err) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!(error = %err, "encoding metrics");
        }
        out
    }
}
