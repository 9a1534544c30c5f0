//! What isolation costs a machine start (issue 36): create→started through the Machines
//! API on 3 local agents (cluster secret between hosts), isolated process machines (user
//! and network namespace, private root, seccomp, veth) against the same build with
//! `--no-isolate --allow-root-machines`, in interleaved rounds (A B B A ...): p50 and p99
//! of sequential creates, creates/s with 32 in flight, and for isolated machines the
//! median of each launch step their start events recorded (`machine explain --timing`).
//!
//! Run as root: `cargo bench -p bazaar --bench isolated_starts` (prints Markdown tables for
//! docs/benchmarks/isolation.md). `BAZAAR_BENCH_MACHINES` sets the creates per round
//! (default 300: a third sequential, the rest 32 in flight), `BAZAAR_BENCH_ROUNDS` the
//! rounds of each kind (default 3), `BAZAAR_BENCH_EXE` another `bazaar` build, and
//! `BAZAAR_BENCH_BEFORE=<bazaar>` adds isolated rounds of that build (an earlier commit,
//! with `bazaar-shim` beside it) to the interleaving, for before/after in one sitting;
//! `BAZAAR_BENCH_TMPFS=1` runs it with the data directories and `/run` state on tmpfs
//! mounts (see `Tmpfs`).

use bazaar_testkit::{api_token, start_plain_cluster, TestAgent};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_bazaar");

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[(((sorted.len() as f64) - 1.0) * p).round() as usize]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One round: create→started ms (sorted), creates/s, and each launch step's ms per machine.
struct Round {
    lat: Vec<f64>,
    /// Create answered (placed and claimed, before the launch), ms, sorted.
    answered: Vec<f64>,
    rate: f64,
    steps: BTreeMap<String, Vec<f64>>,
    order: Vec<String>,
}

fn main() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "isolation needs root");
    let _tmpfs = (std::env::var("BAZAAR_BENCH_TMPFS").as_deref() == Ok("1")).then(Tmpfs::mount);
    let total = env_or("BAZAAR_BENCH_MACHINES", 300);
    let rounds = env_or("BAZAAR_BENCH_ROUNDS", 3);
    let sequential = (total / 3).max(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let exe = std::env::var_os("BAZAAR_BENCH_EXE")
        .map_or_else(|| std::path::PathBuf::from(EXE), std::path::PathBuf::from);
    let before = std::env::var_os("BAZAAR_BENCH_BEFORE").map(std::path::PathBuf::from);
    // Kinds: 0 --no-isolate, 1 isolated, 2 isolated, the build before.
    let kinds: Vec<usize> = if before.is_some() {
        vec![1, 0, 2]
    } else {
        vec![1, 0]
    };
    let order: Vec<usize> = (0..rounds)
        .flat_map(|r| {
            let mut k = kinds.clone();
            if r % 2 == 1 {
                k.reverse();
            }
            k
        })
        .collect();
    let names = ["--no-isolate", "isolated", "isolated, before"];
    let mut by_kind: [Vec<Round>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    println!(
        "| round | load (1 min) | machines | create→started p50 | p99 | create answered p50 | creates/s (32 in flight) |"
    );
    println!("|---|---:|---|---:|---:|---:|---:|");
    for (i, kind) in order.iter().copied().enumerate() {
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let load = load.split_whitespace().next().unwrap_or("?").to_string();
        let exe = if kind == 2 {
            before.as_ref().unwrap()
        } else {
            &exe
        };
        let r = measure(&rt, exe, kind != 0, total, sequential);
        println!(
            "| {i} | {load} | {} | {:.2} ms | {:.2} ms | {:.2} ms | {:.0} |",
            names[kind],
            pct(&r.lat, 0.5),
            pct(&r.lat, 0.99),
            pct(&r.answered, 0.5),
            r.rate
        );
        by_kind[kind].push(r);
    }
    let p = |kind: usize, q: f64| median(by_kind[kind].iter().map(|r| pct(&r.lat, q)).collect());
    let rate = |kind: usize| median(by_kind[kind].iter().map(|r| r.rate).collect());
    println!("\n## Isolated vs --no-isolate, medians of {rounds} interleaved rounds each\n");
    println!("{total} creates per round through 3 agents' Machines API: {sequential} one at a time, the rest 32 in flight.\n");
    println!("| machines | create→started p50 | p99 | creates/s |");
    println!("|---|---:|---:|---:|");
    for kind in [1, 0, 2].into_iter().filter(|k| kinds.contains(k)) {
        println!(
            "| {} | {:.2} ms | {:.2} ms | {:.0} |",
            names[kind],
            p(kind, 0.5),
            p(kind, 0.99),
            rate(kind)
        );
    }
    println!(
        "| isolated / --no-isolate | ×{:.2} | ×{:.2} | ÷{:.2} |",
        p(1, 0.5) / p(0, 0.5),
        p(1, 0.99) / p(0, 0.99),
        rate(0) / rate(1)
    );
    if kinds.contains(&2) {
        println!(
            "| isolated, before / --no-isolate | ×{:.2} | ×{:.2} | ÷{:.2} |",
            p(2, 0.5) / p(0, 0.5),
            p(2, 0.99) / p(0, 0.99),
            rate(0) / rate(2)
        );
    }
    for kind in [1, 2, 0].into_iter().filter(|k| kinds.contains(k)) {
        let name = names[kind];
        let Some(first) = by_kind[kind].first() else {
            continue;
        };
        println!("\n## Where a start's time goes, {name} (start events, sequential creates)\n");
        println!("| step | p50 ms | p90 ms |");
        println!("|---|---:|---:|");
        for step in &first.order {
            let mut all: Vec<f64> = by_kind[kind]
                .iter()
                .flat_map(|r| r.steps.get(step).cloned().unwrap_or_default())
                .collect();
            all.sort_by(f64::total_cmp);
            println!("| {step} | {:.2} | {:.2} |", pct(&all, 0.5), pct(&all, 0.9));
        }
    }
}

/// `BAZAAR_BENCH_TMPFS=1`: the agents' data directories (`TMPDIR`), `/run/bazaar` and
/// `/run/netns` on tmpfs mounts made for the run and removed after it, as on a server whose
/// `/run` is a tmpfs and whose data disk does not make new files slow (the development VM's
/// root ext4 has no journal, and its inode allocator then checks every recently deleted
/// inode it passes: docs/benchmarks/isolation.md). Refused while another agent's machines
/// hold namespaces or uids on this host (the mounts would hide them).
struct Tmpfs {
    mounts: Vec<std::path::PathBuf>,
}

impl Tmpfs {
    fn mount() -> Tmpfs {
        let busy = |dir: &str| std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some());
        assert!(
            !busy("/run/netns") && !busy("/run/bazaar/uids") && !busy("/run/bazaar/netns-ready"),
            "BAZAAR_BENCH_TMPFS: other machines hold namespaces or uids on this host"
        );
        let data = std::env::temp_dir().join(format!("bazaar-bench-tmpfs-{}", std::process::id()));
        let mut tmpfs = Tmpfs { mounts: Vec::new() };
        for (dir, options) in [
            (data.as_path(), "size=8g"),
            (std::path::Path::new("/run/bazaar"), "size=64m,mode=755"),
            (std::path::Path::new("/run/netns"), "size=64m"),
        ] {
            std::fs::create_dir_all(dir).unwrap();
            let ok = std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", options, "tmpfs"])
                .arg(dir)
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "mounting a tmpfs on {}", dir.display());
            tmpfs.mounts.push(dir.to_path_buf());
        }
        // `ip netns` and the agent bind namespaces below it: mounts there must propagate.
        let shared = std::process::Command::new("mount")
            .args(["--make-shared", "/run/netns"])
            .status();
        assert!(shared.is_ok_and(|s| s.success()));
        // SAFETY: no other thread runs yet (the runtime is built after this).
        unsafe { std::env::set_var("TMPDIR", &data) };
        tmpfs
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        for dir in self.mounts.iter().rev() {
            let _ = std::process::Command::new("umount")
                .arg("--lazy")
                .arg(dir)
                .status();
        }
        if let Some(data) = self.mounts.first() {
            let _ = std::fs::remove_dir(data);
        }
    }
}

async fn get(http: reqwest::Client, url: String) -> Value {
    call(http.get(&url)).await
}

/// Sends `req`, again while the token check runs out of time (a debug build on a loaded
/// host: "Reached Datalog execution limits", a 401), at most 10 times.
async fn call(req: reqwest::RequestBuilder) -> Value {
    for _ in 0..10 {
        let r = req
            .try_clone()
            .unwrap()
            .bearer_auth(api_token())
            .send()
            .await
            .unwrap();
        let status = r.status();
        let body = r.text().await.unwrap_or_default();
        if status == reqwest::StatusCode::UNAUTHORIZED && body.contains("execution limits") {
            continue;
        }
        assert!(status.is_success(), "{status} {body}");
        return serde_json::from_str(&body).unwrap();
    }
    panic!("the token check ran out of time 10 times");
}

fn start_agents(exe: &std::path::Path, isolate: bool, total: usize) -> Vec<TestAgent> {
    start_plain_cluster(exe, 3, |_, o| {
        o.memory_mb = (total as u64 + 10) * 256;
        o.cpus = total as u32 + 10;
        if !isolate {
            o.isolate = false;
            o.extra_args.push("--allow-root-machines".into());
        }
    })
    .expect("cluster")
}

fn measure(
    rt: &tokio::runtime::Runtime,
    exe: &std::path::Path,
    isolate: bool,
    total: usize,
    sequential: usize,
) -> Round {
    let agents = start_agents(exe, isolate, total);
    let base = agents[0].url();
    let http = reqwest::Client::new();
    let body = json!({"config": {"image": "process", "driver": "process", "init": {"exec": ["sleep", "1000"]}, "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256}}, "region": "local"});
    rt.block_on(async {
        http.post(format!("{base}/v1/apps"))
            .bearer_auth(api_token())
            .json(&json!({"app_name": "bench"}))
            .send()
            .await
            .unwrap();
        loop {
            let r = get(http.clone(), format!("{base}/v1/platform/regions")).await;
            if r["regions"][0]["hosts"] == 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let create = |http: reqwest::Client, base: String, body: Value| async move {
            let t0 = Instant::now();
            let m = call(
                http.post(format!("{base}/v1/apps/bench/machines"))
                    .json(&body),
            )
            .await;
            let answered = t0.elapsed().as_secs_f64() * 1e3;
            let id = m["id"].as_str().expect("created").to_string();
            get(
                http,
                format!("{base}/v1/apps/bench/machines/{id}/wait?state=started&timeout=60"),
            )
            .await;
            (id, answered)
        };
        // Warm-up: the first machine sets up the host's network.
        for _ in 0..6 {
            create(http.clone(), base.clone(), body.clone()).await;
        }
        let (mut lat, mut answered) = (Vec::new(), Vec::new());
        let mut ids = Vec::new();
        for _ in 0..sequential {
            let t0 = Instant::now();
            let (id, answer_ms) = create(http.clone(), base.clone(), body.clone()).await;
            ids.push(id);
            lat.push(t0.elapsed().as_secs_f64() * 1e3);
            answered.push(answer_ms);
        }
        lat.sort_by(f64::total_cmp);
        answered.sort_by(f64::total_cmp);
        let rest = total - sequential;
        let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(32));
        let t0 = Instant::now();
        let tasks: Vec<_> = (0..rest)
            .map(|i| {
                let (http, sem, body) = (http.clone(), sem.clone(), body.clone());
                let base = agents[i % 3].url();
                tokio::spawn(async move {
                    let _p = sem.acquire().await.unwrap();
                    create(http, base, body).await
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let rate = rest as f64 / t0.elapsed().as_secs_f64();
        let (mut steps, mut order) = (BTreeMap::<String, Vec<f64>>::new(), Vec::new());
        for id in &ids {
            let events = get(
                http.clone(),
                format!("{base}/v1/apps/bench/machines/{id}/events"),
            )
            .await;
            let start = events
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["type"] == "start");
            let timing = start.and_then(|e| e["request"]["timing"].as_array().cloned());
            for s in timing.unwrap_or_default() {
                let step = s["step"].as_str().unwrap_or("?").to_string();
                if !order.contains(&step) {
                    order.push(step.clone());
                }
                steps
                    .entry(step)
                    .or_default()
                    .push(s["ms"].as_f64().unwrap_or(0.0));
            }
        }
        Round {
            lat,
            answered,
            rate,
            steps,
            order,
        }
    })
}
