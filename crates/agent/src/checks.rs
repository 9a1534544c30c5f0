//! Service health checks (Fly's `services[].checks`), run by the agent that owns the
//! machine. Every started machine of this host is checked on its own schedule (`interval`,
//! `timeout`, `grace_period`) with a TCP connect or an HTTP request (`method`, `path`,
//! `headers`) to the service's host port. Results are kept in memory and travel in the machine's catalog row
//! (`MachineRecord.checks`, names `servicecheck-<n>-<type>-<internal port>`); the row is
//! republished only when a status changes. The proxy routes no traffic to a machine with a
//! `critical` service check; a failure inside the grace period after start is reported as
//! `warning`. As on Fly, a failing check never restarts or stops a machine.
//!
//! The agent holds the results (`CheckResults`); its check loop (in [`crate::boot`]) drives
//! a `Checker`.

use crate::sync::lock;
use bazaar_admission::check_headers as headers;
use bazaar_catalog::{Catalog, CheckRecord, MachineFilter};
use bazaar_types::config::CheckConfig;
use bazaar_types::now_ms;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Default time between two runs of a check.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);
/// Default time a check may take.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// One check of one machine, ready to run.
#[derive(Debug, Clone)]
struct Spec {
    name: String,
    kind: String,
    addr: String,
    method: String,
    path: String,
    /// Extra request headers of an HTTP check.
    headers: Vec<(String, String)>,
    interval: Duration,
    timeout: Duration,
    grace: Duration,
}

#[derive(Debug)]
struct Scheduled {
    spec: Spec,
    next_due: Instant,
    running: bool,
}

#[derive(Debug)]
struct MachineChecks {
    started_seen: Instant,
    instance_id: String,
    checks: Vec<Scheduled>,
}

/// A result of one check: the machine, its instance, the result.
type Outcome = (String, String, CheckRecord);

/// The latest health-check results of this host's machines (the agent's part; they
/// travel in the machines' catalog rows).
#[derive(Debug, Default)]
pub(crate) struct CheckResults(Mutex<HashMap<String, Vec<CheckRecord>>>);

impl CheckResults {
    /// The latest results of machine `id`, sorted by name.
    pub(crate) fn of(&self, id: &str) -> Option<Vec<CheckRecord>> {
        lock(&self.0).get(id).cloned()
    }

    /// Stores one result; true if its status changed (or it is the first).
    fn store(&self, id: &str, result: CheckRecord) -> bool {
        let mut all = lock(&self.0);
        let list = all.entry(id.to_string()).or_default();
        match list.iter_mut().find(|c| c.name == result.name) {
            Some(c) if c.status == result.status => {
                *c = result;
                false
            }
            Some(c) => {
                *c = result;
                true
            }
            None => {
                list.push(result);
                list.sort_by(|a, b| a.name.cmp(&b.name));
                true
            }
        }
    }
}

/// The check schedule of this host's started machines: which checks run when. The agent's
/// check loop calls [`Checker::schedule`] on every tick and [`Checker::record`] with every
/// result from the receiver [`Checker::new`] returns.
#[derive(Debug)]
pub(crate) struct Checker {
    machines: HashMap<String, MachineChecks>,
    tx: mpsc::Sender<Outcome>,
}

/// Results waiting for the check loop. A check has at most one run in flight, so this
/// fills only when the loop is slow (a republish waits on the store); a run then waits
/// for room rather than being lost.
const RESULTS_QUEUE: usize = 256;

impl Checker {
    /// An empty schedule, and the receiver of the results of the checks it runs.
    pub(crate) fn new() -> (Checker, mpsc::Receiver<Outcome>) {
        let (tx, rx) = mpsc::channel(RESULTS_QUEUE);
        let checker = Checker {
            machines: HashMap::new(),
            tx,
        };
        (checker, rx)
    }

    /// Brings the schedule in line with `host`'s started machines in `catalog` and runs
    /// what is due (each check on a task of its own, counted by `tracker` and given up at
    /// `stop`).
    pub(crate) fn schedule(
        &mut self,
        catalog: &Catalog,
        host: &str,
        results: &CheckResults,
        (tracker, stop): (&TaskTracker, &CancellationToken),
    ) {
        let machines = &mut self.machines;
        let filter = MachineFilter {
            states: vec!["started".into()],
            ..Default::default()
        };
        let now = Instant::now();
        let mut seen = HashSet::new();
        // Only this host's machines with checks (all come from services) are copied out.
        let ours = catalog.machines_where(&filter, |m| {
            m.host_id == host && m.services.iter().any(|s| !s.service.checks.is_empty())
        });
        for view in ours {
            let m = view.record;
            seen.insert(m.id.clone());
            let stale = machines
                .get(&m.id)
                .is_some_and(|c| c.instance_id != m.instance_id);
            if stale || !machines.contains_key(&m.id) {
                if stale {
                    // A new config version: the old version's results say nothing about it
                    // (a deploy waits for the new version's checks to pass).
                    lock(&results.0).remove(&m.id);
                }
                let specs = specs(&m);
                machines.insert(
                    m.id.clone(),
                    MachineChecks {
                        started_seen: now,
                        instance_id: m.instance_id.clone(),
                        checks: specs
                            .into_iter()
                            .map(|spec| Scheduled {
                                spec,
                                next_due: now,
                                running: false,
                            })
                            .collect(),
                    },
                );
            }
        }
        let before = machines.len();
        machines.retain(|id, _| seen.contains(id));
        if machines.len() != before {
            lock(&results.0).retain(|id, _| seen.contains(id));
        }
        for (id, mc) in machines.iter_mut() {
            for sc in mc.checks.iter_mut() {
                if sc.running || sc.next_due > now {
                    continue;
                }
                sc.running = true;
                let spec = sc.spec.clone();
                let in_grace = now.duration_since(mc.started_seen) < spec.grace;
                let (tx, id, instance) = (self.tx.clone(), id.clone(), mc.instance_id.clone());
                let stop = stop.clone();
                tracker.spawn(async move {
                    let outcome = tokio::select! {
                        () = stop.cancelled() => return,
                        outcome = run_check(&spec) => outcome,
                    };
                    let status = match &outcome {
                        Ok(_) => "passing",
                        Err(_) if in_grace => "warning",
                        Err(_) => "critical",
                    };
                    let output = match outcome {
                        Ok(o) | Err(o) => o,
                    };
                    let result = (
                        id,
                        instance,
                        CheckRecord {
                            name: spec.name,
                            status: status.into(),
                            output,
                            updated_at_ms: now_ms(),
                        },
                    );
                    tokio::select! {
                        () = stop.cancelled() => {}
                        _ = tx.send(result) => {}
                    }
                });
            }
        }
    }

    /// Stores one result in `results` and schedules the check's next run; true if the
    /// machine's row should be republished (a status changed).
    pub(crate) fn record(
        &mut self,
        results: &CheckResults,
        (id, instance, result): Outcome,
    ) -> bool {
        let Some(mc) = self.machines.get_mut(&id) else {
            return false;
        };
        if mc.instance_id != instance {
            return false;
        }
        if let Some(sc) = mc.checks.iter_mut().find(|s| s.spec.name == result.name) {
            sc.running = false;
            sc.next_due = Instant::now() + sc.spec.interval;
        }
        results.store(&id, result)
    }
}

/// The checks of a machine's services, with where to reach them.
fn specs(m: &bazaar_catalog::MachineRecord) -> Vec<Spec> {
    let mut out = Vec::new();
    for svc in &m.services {
        for (i, c) in svc.service.checks.iter().enumerate() {
            out.push(spec(m, svc, i, c));
        }
    }
    out
}

fn spec(
    m: &bazaar_catalog::MachineRecord,
    svc: &bazaar_catalog::ServiceRecord,
    i: usize,
    c: &CheckConfig,
) -> Spec {
    let kind = c.kind.clone().unwrap_or_else(|| "tcp".into());
    // `port` names an internal port; find the host port it is published on.
    let port = c
        .port
        .and_then(|p| {
            m.services
                .iter()
                .find(|s| s.service.internal_port == p)
                .map(|s| s.port)
        })
        .unwrap_or(svc.port);
    Spec {
        name: format!(
            "servicecheck-{i:02}-{kind}-{}",
            c.port.unwrap_or(svc.service.internal_port)
        ),
        kind,
        addr: format!("{}:{port}", svc.address),
        method: c.method.clone().unwrap_or_else(|| "GET".into()),
        path: c.path.clone().unwrap_or_else(|| "/".into()),
        // Checked when the config was accepted.
        headers: headers(c).unwrap_or_default(),
        interval: c.interval.map(|d| d.get()).unwrap_or(DEFAULT_INTERVAL),
        timeout: c.timeout.map(|d| d.get()).unwrap_or(DEFAULT_TIMEOUT),
        grace: c.grace_period.map(|d| d.get()).unwrap_or_default(),
    }
}

/// Runs one check: `Ok(output)` when it passes, `Err(output)` when it fails.
async fn run_check(spec: &Spec) -> Result<String, String> {
    match tokio::time::timeout(spec.timeout, probe(spec)).await {
        Ok(r) => r,
        Err(_) => Err(format!("timed out after {:?}", spec.timeout)),
    }
}

async fn probe(spec: &Spec) -> Result<String, String> {
    let mut stream = tokio::net::TcpStream::connect(&spec.addr)
        .await
        .map_err(|e| format!("connecting to {}: {e}", spec.addr))?;
    if spec.kind != "http" {
        return Ok(format!("connected to {}", spec.addr));
    }
    let mut req = format!(
        "{} {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: bazaar-check\r\nConnection: close\r\n",
        spec.method, spec.path, spec.addr
    );
    for (name, value) in &spec.headers {
        req.push_str(&format!("{name}: {value}\r\n"));
    }
    req.push_str("\r\n");
    stream
        .write_all(req.as_bytes())
        .await
        .map_err(|e| format!("writing: {e}"))?;
    let mut buf = vec![0u8; 512];
    let mut len = 0;
    while len < 12 {
        let n = stream
            .read(&mut buf[len..])
            .await
            .map_err(|e| format!("reading: {e}"))?;
        if n == 0 {
            break;
        }
        len += n;
    }
    let head = String::from_utf8_lossy(&buf[..len]);
    let status = head
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| format!("not an HTTP response: {:?}", head.lines().next()))?;
    if (200..400).contains(&status) {
        Ok(format!("HTTP {status}"))
    } else {
        Err(format!("HTTP {status}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(headers: serde_json::Value) -> CheckConfig {
        let mut c = CheckConfig {
            kind: Some("http".into()),
            ..Default::default()
        };
        c.extra.insert("headers".into(), headers);
        c
    }

    #[test]
    fn headers_are_read_in_both_spellings_and_checked() {
        let fly = check(serde_json::json!([{"name": "X-A", "values": ["1", "2"]}]));
        assert_eq!(
            headers(&fly).unwrap(),
            [("X-A".into(), "1".into()), ("X-A".into(), "2".into())]
        );
        let toml = check(serde_json::json!({"Host": "example.com"}));
        assert_eq!(
            headers(&toml).unwrap(),
            [("Host".into(), "example.com".into())]
        );
        assert!(headers(&check(
            serde_json::json!([{"name": "a b", "values": ["x"]}])
        ))
        .is_err());
        assert!(headers(&check(serde_json::json!({"X": "a\r\nEvil: 1"}))).is_err());
        assert!(headers(&check(serde_json::json!("X: y"))).is_err());
    }

    /// An HTTP check sends its headers: a server that wants one fails the check without it.
    #[tokio::test]
    async fn an_http_check_sends_its_headers() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = vec![0u8; 4096];
                let n = s.read(&mut buf).await.unwrap();
                let req = String::from_utf8_lossy(&buf[..n]).to_string();
                let status = if req.contains("\r\nX-Health-Token: sesame\r\n") {
                    "200 OK"
                } else {
                    "403 Forbidden"
                };
                let _ = s
                    .write_all(format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n").as_bytes())
                    .await;
            }
        });
        let spec = |headers: Vec<(String, String)>| Spec {
            name: "c".into(),
            kind: "http".into(),
            addr: addr.clone(),
            method: "GET".into(),
            path: "/health".into(),
            headers,
            interval: DEFAULT_INTERVAL,
            timeout: DEFAULT_TIMEOUT,
            grace: Duration::ZERO,
        };
        assert_eq!(run_check(&spec(Vec::new())).await, Err("HTTP 403".into()));
        let with = headers(&check(
            serde_json::json!([{"name": "X-Health-Token", "values": ["sesame"]}]),
        ))
        .unwrap();
        assert_eq!(run_check(&spec(with)).await, Ok("HTTP 200".into()));
    }
}
