//! Lab benchmark (issue 14, acceptance 4): a fleet of real agents, each in a network
//! namespace of its own (`bazaar lab`), 50 by default. Measures, and prints as a Markdown
//! table for docs/benchmarks/lab.md:
//!
//! - propagation: an app created through one host's API (a catalog row published on that
//!   host) until every other host's API finds it (`GET /v1/apps/{app}` answers from the
//!   local catalog; each host polled every 20 ms until it does, so ±20 ms). The changes
//!   are spread over the hosts, one at a time;
//! - a partition of 10 hosts from the rest for 30 s, a change on each side, then `heal`:
//!   time from the end of `heal` until every host's catalog digest is the same and every
//!   host lists all hosts alive (digests and host lists polled every 100 ms);
//! - creates/s: process machines (`sleep`) created through 5 API nodes at once, placed
//!   anywhere by the market (`region: any`; a create answers once the owner stored it),
//!   first on fresh hosts, then again on hosts that already run machines;
//! - agent memory (RSS) per host, idle and with the machines.
//!
//! Run as root: `cargo bench -p bazaar --bench lab`. Environment: `BAZAAR_LAB_HOSTS` (50),
//! `BAZAAR_LAB_CHANGES` (60), `BAZAAR_LAB_PARTITION_SECS` (30), `BAZAAR_LAB_CREATES` (250, twice).
//! The lab is taken down at the end, also when the bench fails.

use bazaar_lab::{AgentSettings, Lab, UpOptions};
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_bazaar");
/// Hosts behind the 5 API nodes the creates go through.
const API_NODES: usize = 5;
/// Creates in flight per API node.
const IN_FLIGHT: usize = 4;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[(((sorted.len() as f64) - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1e3)
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Takes the lab down when the bench ends, however it ends.
struct Down(PathBuf);

impl Drop for Down {
    fn drop(&mut self) {
        if self.0.join("lab.json").exists() {
            match Lab::open(&self.0).and_then(Lab::down) {
                Ok(()) => eprintln!("lab down"),
                Err(e) => eprintln!("lab down failed: {e:#}"),
            }
        }
    }
}

/// One host's API, as the bench calls it.
#[derive(Clone)]
struct Host {
    http: reqwest::Client,
    url: String,
    token: String,
    secret: String,
}

impl Host {
    async fn get(&self, path: &str, bearer: &str) -> Option<(StatusCode, Value)> {
        let resp = self
            .http
            .get(format!("{}{path}", self.url))
            .bearer_auth(bearer)
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .ok()?;
        let status = resp.status();
        Some((status, resp.json().await.unwrap_or(Value::Null)))
    }

    async fn post(&self, path: &str, body: Value) -> Option<(StatusCode, Value)> {
        let resp = self
            .http
            .post(format!("{}{path}", self.url))
            .bearer_auth(&self.token)
            .json(&body)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .ok()?;
        let status = resp.status();
        Some((status, resp.json().await.unwrap_or(Value::Null)))
    }

    async fn create_app(&self, name: &str) {
        let (s, v) = self
            .post(
                "/v1/apps",
                json!({"app_name": name, "org_slug": "personal"}),
            )
            .await
            .expect("the API answers");
        assert_eq!(s, StatusCode::CREATED, "creating app {name}: {v}");
    }

    async fn has_app(&self, name: &str) -> bool {
        matches!(self.get(&format!("/v1/apps/{name}"), &self.token).await, Some((s, _)) if s == StatusCode::OK)
    }

    async fn digest(&self) -> Option<String> {
        let (s, v) = self.get("/v1/catalog/digest", &self.secret).await?;
        (s == StatusCode::OK).then(|| v["digest"].as_str().unwrap_or_default().to_string())
    }

    async fn alive(&self) -> Option<usize> {
        let (s, v) = self.get("/v1/catalog/hosts", &self.secret).await?;
        (s == StatusCode::OK).then(|| {
            v.as_array()
                .map(|a| a.iter().filter(|h| h["status"] == "alive").count())
                .unwrap_or(0)
        })
    }
}

/// Creates `app` through `origin` and answers when each of `others` found it (`None`: not
/// within 10 s).
async fn propagate(origin: &Host, others: &[Host], app: &str) -> Vec<Option<Duration>> {
    let start = Instant::now();
    origin.create_app(app).await;
    let polls = others.iter().cloned().map(|h| {
        let app = app.to_string();
        tokio::spawn(async move {
            while start.elapsed() < Duration::from_secs(10) {
                if h.has_app(&app).await {
                    return Some(start.elapsed());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            None
        })
    });
    let mut out = Vec::new();
    for p in polls.collect::<Vec<_>>() {
        out.push(p.await.unwrap());
    }
    out
}

/// Creates `total` machines through `apis`, `IN_FLIGHT` at a time through each; answers
/// (acknowledged, failed, creates/s).
async fn create_many(apis: &[Host], body: &Value, total: usize) -> (usize, usize, f64) {
    let per_client = total.div_ceil(apis.len() * IN_FLIGHT);
    let started = Instant::now();
    let clients: Vec<_> = (0..apis.len() * IN_FLIGHT)
        .map(|c| {
            let host = apis[c % apis.len()].clone();
            let body = body.clone();
            tokio::spawn(async move {
                let (mut ok, mut failed) = (0usize, 0usize);
                for _ in 0..per_client {
                    match host.post("/v1/apps/load/machines", body.clone()).await {
                        Some((s, _)) if s.is_success() => ok += 1,
                        other => {
                            failed += 1;
                            if failed <= 3 {
                                eprintln!("create failed: {other:?}");
                            }
                        }
                    }
                }
                (ok, failed)
            })
        })
        .collect();
    let (mut ok, mut failed) = (0, 0);
    for c in clients {
        let (o, f) = c.await.expect("client task");
        ok += o;
        failed += f;
    }
    (ok, failed, ok as f64 / started.elapsed().as_secs_f64())
}

/// Runs `f` on every host at once; answers the results in order.
async fn all<T, F, Fut>(hosts: &[Host], f: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(Host) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
{
    let tasks: Vec<_> = hosts.iter().cloned().map(|h| tokio::spawn(f(h))).collect();
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.expect("poll task"));
    }
    out
}

/// When the catalogs agreed after a heal, from the start of polling.
#[derive(Debug, Default)]
struct Agreement {
    /// Every host's digest (its rows) the same.
    rows: Option<Duration>,
    /// Every host lists `n` hosts alive.
    alive: Option<Duration>,
    /// Both at once.
    both: Option<Duration>,
}

/// Polls every host until all have the same digest and list `n` hosts alive (at most
/// `within`).
async fn until_agreed(hosts: &[Host], n: usize, within: Duration) -> Agreement {
    let start = Instant::now();
    let mut seen = Agreement::default();
    while start.elapsed() < within {
        let views = all(
            hosts,
            |h| async move { (h.digest().await, h.alive().await) },
        )
        .await;
        let now = start.elapsed();
        let first = &views[0].0;
        let rows = first.is_some() && views.iter().all(|(d, _)| d == first);
        let alive = views.iter().all(|(_, a)| *a == Some(n));
        if rows {
            seen.rows.get_or_insert(now);
        }
        if alive {
            seen.alive.get_or_insert(now);
        }
        if rows && alive {
            seen.both = Some(now);
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    seen
}

fn rss_mib(lab: &Lab) -> (f64, f64) {
    let rss: Vec<u64> = lab.status().iter().filter_map(|h| h.rss_kib).collect();
    let mean = rss.iter().sum::<u64>() as f64 / rss.len().max(1) as f64 / 1024.0;
    let max = rss.iter().copied().max().unwrap_or(0) as f64 / 1024.0;
    (mean, max)
}

fn main() {
    assert!(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() } == 0,
        "the lab bench needs root (network namespaces)"
    );
    let n = env_or("BAZAAR_LAB_HOSTS", 50);
    let changes = env_or("BAZAAR_LAB_CHANGES", 60);
    let partition_secs = env_or("BAZAAR_LAB_PARTITION_SECS", 30) as u64;
    let creates = env_or("BAZAAR_LAB_CREATES", 250);
    assert!(n > 10 + API_NODES, "at least 16 hosts");
    let dir = tempfile::Builder::new()
        .prefix("bazaar-lab-bench-")
        .tempdir()
        .unwrap();
    let _down = Down(dir.path().to_path_buf());
    let load_start = load();

    let started = Instant::now();
    let mut lab = Lab::up(UpOptions {
        dir: dir.path().to_path_buf(),
        hosts: n,
        regions: vec!["a".into(), "b".into(), "c".into()],
        subnet: None,
        exe: Path::new(EXE).to_path_buf(),
        small_disk: false,
        agent: AgentSettings {
            memory_mb: Some(8192),
            cpus: Some(64),
            dead_after_ms: None,
            replace_after_ms: None,
            config: None,
        },
    })
    .expect("lab up");
    let up = started.elapsed();
    let converged = lab
        .wait_converged(Duration::from_secs(120))
        .expect("every host sees every host alive");
    eprintln!("{n} hosts up in {up:?}, converged {converged:?} later");
    let hosts: Vec<Host> = lab
        .plan()
        .hosts
        .iter()
        .map(|h| Host {
            http: reqwest::Client::new(),
            url: lab.api_url(h),
            token: lab.token().to_string(),
            secret: lab.cluster_secret().to_string(),
        })
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Let the fleet settle (host rows republished after start, first syncs) before timing.
    std::thread::sleep(Duration::from_secs(5));
    let idle = rss_mib(&lab);

    // Propagation.
    let mut every: Vec<Duration> = Vec::new();
    let mut each: Vec<Duration> = Vec::new();
    let mut missed = 0usize;
    rt.block_on(async {
        for k in 0..changes {
            let origin = k % n;
            let others: Vec<Host> = (0..n)
                .filter(|i| *i != origin)
                .map(|i| hosts[i].clone())
                .collect();
            let arrivals = propagate(&hosts[origin], &others, &format!("p{k}")).await;
            missed += arrivals.iter().filter(|a| a.is_none()).count();
            let got: Vec<Duration> = arrivals.into_iter().flatten().collect();
            if got.len() == others.len() {
                every.push(*got.iter().max().unwrap());
            }
            each.extend(got);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    every.sort();
    each.sort();
    eprintln!("propagation: {} changes, {missed} arrivals missed", changes);

    // Partition 10 hosts from the rest, a change on each side, heal.
    let names: Vec<String> = lab.plan().hosts.iter().map(|h| h.name.clone()).collect();
    let (rest, ten) = names.split_at(n - 10);
    lab.partition(ten, rest, false).expect("partition");
    std::thread::sleep(Duration::from_secs(partition_secs));
    rt.block_on(async {
        hosts[0].create_app("left").await;
        hosts[n - 1].create_app("right").await;
    });
    let heal_started = Instant::now();
    lab.heal().expect("heal");
    let heal_took = heal_started.elapsed();
    let agreed = rt.block_on(until_agreed(&hosts, n, Duration::from_secs(120)));
    eprintln!("heal applied in {heal_took:?}; agreed {agreed:?} later");

    // Creates through 5 API nodes.
    rt.block_on(hosts[0].create_app("load"));
    rt.block_on(async {
        // The app must be known to the 5 API nodes first.
        while !all(
            &hosts[..API_NODES],
            |h| async move { h.has_app("load").await },
        )
        .await
        .into_iter()
        .all(|b| b)
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let body = json!({
        "config": {
            "init": {"exec": ["sleep", "100000"]},
            "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256},
        },
        "region": "any",
    });
    // Twice: on fresh hosts (a host's first machine also sets up its machine network:
    // bridge, nftables), then on hosts that already run machines.
    let cold = rt.block_on(create_many(&hosts[..API_NODES], &body, creates));
    std::thread::sleep(Duration::from_secs(5));
    let warm = rt.block_on(create_many(&hosts[..API_NODES], &body, creates));
    let ok = cold.0 + warm.0;
    std::thread::sleep(Duration::from_secs(3));
    let busy = rss_mib(&lab);

    println!(
        "\n## Lab bench: {n} hosts, release build, load {load_start} at start, {} at end\n",
        load()
    );
    println!("| measure | value |");
    println!("|---|---:|");
    println!(
        "| `lab up` until every agent answers `/health` | {:.1} s |",
        up.as_secs_f64()
    );
    println!(
        "| then until every catalog lists all {n} alive | {:.1} s |",
        converged.as_secs_f64()
    );
    println!(
        "| propagation to each host, p50 / p99 ({} arrivals) | {} / {} |",
        each.len(),
        ms(pct(&each, 0.5)),
        ms(pct(&each, 0.99))
    );
    println!(
        "| propagation to every host, p50 / p99 / max ({} changes) | {} / {} / {} |",
        every.len(),
        ms(pct(&every, 0.5)),
        ms(pct(&every, 0.99)),
        ms(*every.last().unwrap())
    );
    println!("| arrivals not seen within 10 s | {missed} |");
    println!(
        "| {partition_secs} s partition of 10 hosts: heal applied (nftables, {n} hosts) | {:.1} s |",
        heal_took.as_secs_f64()
    );
    let secs = |d: Option<Duration>| {
        d.map_or("not within 120 s".to_string(), |d| {
            format!("{:.1} s", d.as_secs_f64())
        })
    };
    println!(
        "| then until every catalog agrees and lists all {n} alive | {} (rows first agreed {}, all alive first {}) |",
        secs(agreed.both),
        secs(agreed.rows),
        secs(agreed.alive)
    );
    for (what, (ok, failed, rate)) in [("fresh hosts", cold), ("hosts with machines", warm)] {
        println!(
            "| creates/s through {API_NODES} API nodes, {what} ({ok} ok, {failed} failed, {} in flight) | {rate:.1} |",
            API_NODES * IN_FLIGHT
        );
    }
    println!(
        "| agent RSS per host, idle: mean / max | {:.0} / {:.0} MiB |",
        idle.0, idle.1
    );
    println!(
        "| agent RSS per host with {:.0} machines each: mean / max | {:.0} / {:.0} MiB |",
        ok as f64 / n as f64,
        busy.0,
        busy.1
    );
}
