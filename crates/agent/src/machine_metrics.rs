//! Machines' own metrics (Fly's `config.metrics`: `{port, path}`). The agent that owns a
//! started machine scrapes its page every [`INTERVAL`] ([`RETRY`] after a failure) on the machine's own address (on
//! loopback for a process machine without one), over plain HTTP/1.0, within [`TIMEOUT`] and
//! at most [`MAX_BYTES`], and keeps the last samples in memory. They are served with the
//! agent's metrics at `GET /metrics`, each sample with `app` and `machine` labels
//! (docs/METRICS.md), plus `bazaar_machine_metrics_up` per machine. A machine's page is
//! untrusted: lines that are not well-formed Prometheus text are dropped, and so are names
//! of bazaar's own families (`bazaar_*`); its own `app` and `machine` labels become
//! `exported_app` and `exported_machine`.
//!
//! This is a part (`MachineMetrics` in the agent's state); its loop is in [`crate::boot`].

use crate::sync::lock;
use bazaar_catalog::metrics::Exposition;
use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Time between two scrapes of a machine.
pub const INTERVAL: Duration = Duration::from_secs(15);
/// Time before a failed scrape is tried again (a machine just started may not listen yet).
pub const RETRY: Duration = Duration::from_secs(3);
/// Time a scrape may take, connecting included.
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// The largest answer read (headers included); a larger page fails the scrape.
pub const MAX_BYTES: usize = 512 * 1024;
/// The most samples kept of one machine; the rest are dropped.
pub const MAX_SAMPLES: usize = 10_000;

/// What is scraped of one started machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    pub id: String,
    pub app: String,
    /// `ip:port`.
    pub addr: String,
    pub path: String,
}

/// One sample of a machine's page: its name, labels (values escaped as written back) and
/// value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

#[derive(Debug)]
struct Scraped {
    target: Target,
    /// When the next scrape is due; `None` while one runs.
    next_due: Option<Instant>,
    up: bool,
    samples: Vec<Sample>,
}

/// The last samples of this host's machines that ask to be scraped.
#[derive(Debug, Default)]
pub struct MachineMetrics(Mutex<BTreeMap<String, Scraped>>);

impl MachineMetrics {
    /// Brings the scrape list in line with `targets` (this host's started machines with
    /// `config.metrics`) and starts the scrapes that are due, each a task of `tracker`
    /// given up at `stop`. A machine that is no longer a target loses its samples.
    pub(crate) fn schedule(
        self: &std::sync::Arc<Self>,
        targets: Vec<Target>,
        (tracker, stop): (&TaskTracker, &CancellationToken),
    ) {
        let now = Instant::now();
        let mut due = Vec::new();
        {
            let mut scraped = lock(&self.0);
            let ids: HashSet<&str> = targets.iter().map(|t| t.id.as_str()).collect();
            scraped.retain(|id, _| ids.contains(id.as_str()));
            for target in targets {
                let entry = scraped.entry(target.id.clone()).or_insert_with(|| Scraped {
                    target: target.clone(),
                    next_due: Some(now),
                    up: false,
                    samples: Vec::new(),
                });
                if entry.target != target {
                    // A new config: the old endpoint's samples say nothing of it.
                    *entry = Scraped {
                        target: target.clone(),
                        next_due: Some(now),
                        up: false,
                        samples: Vec::new(),
                    };
                }
                if entry.next_due.is_some_and(|at| at <= now) {
                    entry.next_due = None;
                    due.push(target);
                }
            }
        }
        for target in due {
            let (me, stop) = (self.clone(), stop.clone());
            tracker.spawn(async move {
                let result = tokio::select! {
                    () = stop.cancelled() => return,
                    r = tokio::time::timeout(TIMEOUT, scrape(&target.addr, &target.path)) => r,
                };
                let samples = match result {
                    Ok(Ok(text)) => Some(parse(&text)),
                    Ok(Err(why)) => {
                        tracing::debug!(machine = %target.id, %why, "metrics scrape failed");
                        None
                    }
                    Err(_) => {
                        tracing::debug!(machine = %target.id, "metrics scrape timed out");
                        None
                    }
                };
                let mut scraped = lock(&me.0);
                if let Some(entry) = scraped.get_mut(&target.id).filter(|e| e.target == target) {
                    let wait = if samples.is_some() { INTERVAL } else { RETRY };
                    entry.next_due = Some(Instant::now() + wait);
                    entry.up = samples.is_some();
                    entry.samples = samples.unwrap_or_default();
                }
            });
        }
    }

    /// Writes the machines' samples to `out`: `bazaar_machine_metrics_up`, then every
    /// family of the machines' pages (type `unknown`), each sample labelled with its
    /// `app` and `machine`.
    pub fn encode(&self, out: &mut Exposition) {
        let scraped = lock(&self.0);
        let name = "bazaar_machine_metrics_up";
        out.family(
            name,
            "gauge",
            "Whether the last scrape of a machine's config.metrics page succeeded",
        );
        for (id, s) in scraped.iter() {
            let labels = [("app", s.target.app.as_str()), ("machine", id.as_str())];
            out.sample(name, &labels, u8::from(s.up));
        }
        let mut families: BTreeMap<&str, Vec<(&str, &str, &Sample)>> = BTreeMap::new();
        for (id, s) in scraped.iter() {
            for sample in &s.samples {
                families
                    .entry(&sample.name)
                    .or_default()
                    .push((&s.target.app, id, sample));
            }
        }
        for (name, samples) in families {
            out.family(name, "unknown", "Scraped from machines' config.metrics");
            for (app, machine, sample) in samples {
                let mut labels = vec![("app", app), ("machine", machine)];
                labels.extend(sample.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())));
                out.sample(name, &labels, Value(sample.value));
            }
        }
    }
}

/// A sample's value as the text format writes it.
struct Value(f64);

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            v if v.is_nan() => f.write_str("NaN"),
            v if v == f64::INFINITY => f.write_str("+Inf"),
            v if v == f64::NEG_INFINITY => f.write_str("-Inf"),
            v => write!(f, "{v}"),
        }
    }
}

/// Fetches `path` from `addr` over HTTP/1.0 (so the answer is neither chunked nor kept
/// open), reading at most [`MAX_BYTES`]: the body of a 200.
async fn scrape(addr: &str, path: &str) -> Result<String, String> {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connecting to {addr}: {e}"))?;
    let req = format!(
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nUser-Agent: bazaar-metrics\r\nAccept: text/plain\r\n\r\n"
    );
    stream
        .write_all(req.as_bytes())
        .await
        .map_err(|e| format!("writing: {e}"))?;
    let mut answer = Vec::new();
    (&mut stream)
        .take(MAX_BYTES as u64 + 1)
        .read_to_end(&mut answer)
        .await
        .map_err(|e| format!("reading: {e}"))?;
    if answer.len() > MAX_BYTES {
        return Err(format!("the page is larger than {MAX_BYTES} bytes"));
    }
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("not an HTTP answer")?;
    let head = String::from_utf8_lossy(&answer[..split]);
    let status = head
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .ok_or("not an HTTP answer")?;
    if status != "200" {
        return Err(format!("HTTP {status}"));
    }
    String::from_utf8(answer[split + 4..].to_vec()).map_err(|_| "the page is not UTF-8".into())
}

/// The well-formed samples of a page in the Prometheus text format (or OpenMetrics), at
/// most [`MAX_SAMPLES`]; comments, malformed lines and `bazaar_*` names are left out.
pub(crate) fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .filter_map(|l| parse_line(l.trim()))
        .filter(|s| !s.name.starts_with("bazaar_"))
        .take(MAX_SAMPLES)
        .collect()
}

fn is_name(s: &str, colons: bool) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || (colons && c == ':'))
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || (colons && c == ':'))
}

fn parse_line(line: &str) -> Option<Sample> {
    let end = line
        .find(|c: char| c == '{' || c.is_ascii_whitespace())
        .unwrap_or(line.len());
    let name = &line[..end];
    if !is_name(name, true) {
        return None;
    }
    let mut rest = &line[end..];
    let mut labels = Vec::new();
    if let Some(inner) = rest.strip_prefix('{') {
        let (parsed, after) = parse_labels(inner)?;
        labels = parsed;
        rest = after;
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" | "Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v if v
            .bytes()
            .all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b)) =>
        {
            v.parse().ok()?
        }
        _ => return None,
    };
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Reads `k="v",...}` and answers the labels (values escaped again, `app` and `machine`
/// renamed `exported_*`) and what follows the `}`.
fn parse_labels(mut s: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels: Vec<(String, String)> = Vec::new();
    loop {
        s = s.trim_start();
        if let Some(after) = s.strip_prefix('}') {
            return Some((labels, after));
        }
        let eq = s.find('=')?;
        let key = s[..eq].trim();
        if !is_name(key, false) {
            return None;
        }
        s = s[eq + 1..].trim_start().strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let close = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    '\\' => value.push_str("\\\\"),
                    '"' => value.push_str("\\\""),
                    'n' => value.push_str("\\n"),
                    _ => return None,
                },
                (_, '\n') => return None,
                (_, c) => value.push(c),
            }
        };
        let key = match key {
            "app" | "machine" => format!("exported_{key}"),
            k => k.to_string(),
        };
        if labels.iter().any(|(k, _)| *k == key) {
            return None;
        }
        labels.push((key, value));
        s = s[close + 1..].trim_start();
        s = s.strip_prefix(',').unwrap_or(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn well_formed_samples_are_kept_and_the_rest_dropped() {
        let page = "# HELP hits Hits.\n# TYPE hits counter\nhits_total{path=\"/a\",code=\"200\"} 3\n\
                    up 1 1700000000000\ntemp{app=\"mine\"} -1.5e3\nbazaar_agent_machines 9\n\
                    bad name 1\nx{a=\"unterminated} 1\ny{a=\"q\\\"uote\"} +Inf\nz NaN\nw{} notanumber\n";
        let samples = parse(page);
        let names: Vec<&str> = samples.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["hits_total", "up", "temp", "y", "z"]);
        assert_eq!(
            samples[0].labels,
            [("path".into(), "/a".into()), ("code".into(), "200".into())]
        );
        assert_eq!(
            samples[2].labels,
            [("exported_app".to_string(), "mine".to_string())]
        );
        assert_eq!(samples[2].value, -1500.0);
        assert_eq!(samples[3].labels[0].1, "q\\\"uote");
    }

    #[test]
    fn samples_are_written_per_family_with_app_and_machine() {
        let metrics = MachineMetrics::default();
        for (id, page) in [
            ("m1", "hits_total 1\nup 1\n"),
            ("m2", "hits_total{x=\"y\"} 2\n"),
        ] {
            lock(&metrics.0).insert(
                id.into(),
                Scraped {
                    target: Target {
                        id: id.into(),
                        app: "web".into(),
                        addr: String::new(),
                        path: String::new(),
                    },
                    next_due: None,
                    up: true,
                    samples: parse(page),
                },
            );
        }
        let mut out = Exposition::default();
        metrics.encode(&mut out);
        let text = out.into_string();
        assert!(
            text.contains("bazaar_machine_metrics_up{app=\"web\",machine=\"m1\"} 1\n"),
            "{text}"
        );
        let family = "# TYPE hits_total unknown\nhits_total{app=\"web\",machine=\"m1\"} 1\n\
                      hits_total{app=\"web\",machine=\"m2\",x=\"y\"} 2\n";
        assert!(text.contains(family), "{text}");
        assert_eq!(text.matches("# TYPE hits_total").count(), 1, "{text}");
    }
}
