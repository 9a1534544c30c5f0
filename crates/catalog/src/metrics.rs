//! The catalog's Prometheus metrics (docs/METRICS.md): rows by kind, hosts by status, sync
//! rounds and failures, gossip datagrams in and out. Counters are the node's own atomics
//! (`node::Counters`, counted where the traffic happens); gauges are read from the replica
//! when scraped, so nothing is added to gossip or sync. Also the small text writer the
//! agent's metrics use ([`Exposition`]).

use crate::replica::Kind;
use crate::{Catalog, HostStatus};
use std::fmt::{Display, Write};
use std::sync::atomic::{AtomicU64, Ordering};

/// Metrics in the OpenMetrics text format (what `/metrics` serves: the proxy's, the agent's
/// and the catalog's; the one metrics writer of the binary), written family by family; the
/// caller ends the whole text with `# EOF`.
#[derive(Debug, Default)]
pub struct Exposition(String);

impl Exposition {
    /// Starts a family: its `HELP` and `TYPE` lines (`kind`: counter, gauge, histogram). A
    /// counter's samples are named `<family>_total`; `name` may say either.
    pub fn family(&mut self, name: &str, kind: &str, help: &str) {
        let family = match kind {
            "counter" => name.strip_suffix("_total").unwrap_or(name),
            _ => name,
        };
        let _ = writeln!(self.0, "# HELP {family} {help}\n# TYPE {family} {kind}");
    }

    /// One sample of the current family; label values are escaped (`\\`, `\"`, `\n`).
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl Display) {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let _ = write!(self.0, "{k}=\"");
                for c in v.chars() {
                    match c {
                        '\\' => self.0.push_str("\\\\"),
                        '"' => self.0.push_str("\\\""),
                        '\n' => self.0.push_str("\\n"),
                        c => self.0.push(c),
                    }
                }
                self.0.push('"');
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {value}");
    }

    /// A family of one unlabelled sample.
    pub fn single(&mut self, name: &str, kind: &str, help: &str, value: impl Display) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Host => "host",
        Kind::Machine => "machine",
        Kind::App => "app",
        Kind::Volume => "volume",
        Kind::Secret => "secret",
        Kind::Certificate => "certificate",
        Kind::Challenge => "challenge",
        Kind::Quota => "quota",
    }
}

const KINDS: [Kind; 8] = [
    Kind::Host,
    Kind::Machine,
    Kind::App,
    Kind::Volume,
    Kind::Secret,
    Kind::Certificate,
    Kind::Challenge,
    Kind::Quota,
];

const STATUSES: [HostStatus; 4] = [
    HostStatus::Alive,
    HostStatus::Suspect,
    HostStatus::Dead,
    HostStatus::Left,
];

impl Catalog {
    /// This node's metrics, appended to `out`.
    pub fn encode_metrics(&self, out: &mut Exposition) {
        let shared = self.shared();
        let (rows, tombstones, hosts) = {
            let st = shared.read();
            let mut rows = [0u64; KINDS.len()];
            let mut tombstones = [0u64; KINDS.len()];
            for row in st.replica.rows() {
                let i = KINDS.iter().position(|k| *k == row.kind()).unwrap_or(0);
                if row.deleted {
                    tombstones[i] += 1;
                } else {
                    rows[i] += 1;
                }
            }
            let mut hosts = [0u64; STATUSES.len()];
            for (_, m) in st.members.iter() {
                if let Some(i) = STATUSES.iter().position(|s| *s == m.status) {
                    hosts[i] += 1;
                }
            }
            (rows, tombstones, hosts)
        };
        let name = "bazaar_catalog_rows";
        out.family(name, "gauge", "Live rows in this node's replica, by kind");
        for (kind, n) in KINDS.iter().zip(rows) {
            out.sample(name, &[("kind", kind_name(*kind))], n);
        }
        let name = "bazaar_catalog_tombstones";
        out.family(name, "gauge", "Tombstones in this node's replica, by kind");
        for (kind, n) in KINDS.iter().zip(tombstones) {
            out.sample(name, &[("kind", kind_name(*kind))], n);
        }
        let name = "bazaar_catalog_hosts";
        out.family(
            name,
            "gauge",
            "Hosts as this node's failure detector sees them, by status",
        );
        for (status, n) in STATUSES.iter().zip(hosts) {
            out.sample(name, &[("status", status.as_str())], n);
        }
        let c = &shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        out.single(
            "bazaar_catalog_sync_rounds_total",
            "counter",
            "Anti-entropy exchanges this node started (hint pulls included)",
            get(&c.syncs),
        );
        out.single(
            "bazaar_catalog_sync_failures_total",
            "counter",
            "Anti-entropy exchanges this node started that failed or timed out",
            get(&c.syncs_failed),
        );
        let name = "bazaar_catalog_gossip_datagrams_total";
        out.family(name, "counter", "Gossip datagrams, by direction");
        out.sample(name, &[("direction", "in")], get(&c.udp_packets_received));
        out.sample(name, &[("direction", "out")], get(&c.udp_packets_sent));
        let name = "bazaar_catalog_gossip_bytes_total";
        out.family(name, "counter", "Gossip bytes, by direction");
        out.sample(name, &[("direction", "in")], get(&c.udp_bytes_received));
        out.sample(name, &[("direction", "out")], get(&c.udp_bytes_sent));
        out.single(
            "bazaar_catalog_rejected_total",
            "counter",
            "Datagrams and frames dropped for failing authentication, freshness or decoding",
            get(&c.rejected),
        );
        out.single(
            "bazaar_catalog_rows_refused_total",
            "counter",
            "Rows refused because their owner's signature did not verify",
            get(&c.rows_refused),
        );
        out.single(
            "bazaar_catalog_rows_merged_total",
            "counter",
            "Rows from peers that changed the replica",
            get(&c.rows_merged),
        );
        let name = "bazaar_catalog_queue_dropped_total";
        out.family(
            name,
            "counter",
            "Items dropped because their bounded queue was full, by queue",
        );
        out.sample(name, &[("queue", "broadcast")], get(&c.broadcasts_dropped));
        out.sample(name, &[("queue", "pull")], get(&c.pulls_dropped));
        out.sample(name, &[("queue", "change")], get(&c.changes_dropped));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_written_with_their_labels() {
        let mut out = Exposition::default();
        out.family("x_total", "counter", "Things");
        out.sample("x_total", &[("kind", "a"), ("outcome", "ok")], 3);
        out.single("y", "gauge", "One", 1.5);
        out.sample("z", &[("app", "a\"b\\c\nd")], 1);
        assert_eq!(
            out.into_string(),
            "# HELP x Things\n# TYPE x counter\nx_total{kind=\"a\",outcome=\"ok\"} 3\n\
             # HELP y One\n# TYPE y gauge\ny 1.5\nz{app=\"a\\\"b\\\\c\\nd\"} 1\n"
        );
    }
}
