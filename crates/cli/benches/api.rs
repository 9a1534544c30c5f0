//! Machines API benchmark (issue 4), on 3 local agents: create→started latency through
//! `POST /v1/apps/{app}/machines` + `wait` (p50/p99), creates/s sustained over 1,000
//! creates, and the placement round alone (bids asked → winner chosen, from the placement
//! records).
//!
//! Run: `cargo bench -p bazaar --bench api` (prints Markdown tables for docs/benchmarks/api.md).
//! `BAZAAR_BENCH_MACHINES` changes the create count (default 1000). By default the run
//! alternates clusters whose hosts talk over mTLS (a cluster CA, the test kit's default)
//! and clusters whose hosts use the cluster secret over plain HTTP, `BAZAAR_BENCH_ROUNDS`
//! (default 2) rounds of each, and prints the load average per round and the medians;
//! `BAZAAR_BENCH_MTLS=1` (or `0`) measures only one kind. `BAZAAR_BENCH_EXE` runs another
//! `bazaar` executable (to compare builds in one sitting).

use bazaar_testkit::{api_token, start_cluster, start_plain_cluster};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_bazaar");

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[(((sorted.len() as f64) - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// What one cluster measured: create→started latencies (sorted), creates/s, placement
/// rounds (sorted).
type Measured = (Vec<Duration>, f64, Vec<Duration>);

fn main() {
    let total: usize = std::env::var("BAZAAR_BENCH_MACHINES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let sequential = 200.min(total);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // `1`: mTLS only, `0`: the cluster secret only, unset: both, alternated.
    let modes: Vec<bool> = match std::env::var("BAZAAR_BENCH_MTLS").as_deref() {
        Ok("1") => vec![true],
        Ok("0") => vec![false],
        _ => {
            let rounds: usize = std::env::var("BAZAAR_BENCH_ROUNDS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(2);
            (0..rounds)
                .flat_map(|r| {
                    if r % 2 == 0 {
                        [false, true]
                    } else {
                        [true, false]
                    }
                })
                .collect()
        }
    };
    let mut by_mode: [Vec<Measured>; 2] = [Vec::new(), Vec::new()];
    println!("| round | load average (1 min) | between hosts | create→started p50 | creates/s |");
    println!("|---|---:|---|---:|---:|");
    for (round, mtls) in modes.iter().enumerate() {
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let load = load.split_whitespace().next().unwrap_or("?").to_string();
        let m = measure(&rt, *mtls, total, sequential);
        println!(
            "| {round} | {load} | {} | {} | {:.0} |",
            if *mtls { "mTLS" } else { "cluster secret" },
            ms(pct(&m.0, 0.5)),
            m.1
        );
        by_mode[usize::from(*mtls)].push(m);
    }
    if by_mode.iter().all(|m| !m.is_empty()) {
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let p50 = |mode: usize| {
            median(
                &mut by_mode[mode]
                    .iter()
                    .map(|m| pct(&m.0, 0.5).as_secs_f64() * 1e3)
                    .collect(),
            )
        };
        let rate = |mode: usize| median(&mut by_mode[mode].iter().map(|m| m.1).collect());
        println!("\n## Machines API with and without mTLS between hosts (issue 15)\n");
        println!(
            "`cargo bench -p bazaar --bench api`: {} alternated rounds, medians\n",
            modes.len() / 2
        );
        println!("| between hosts | create→started p50 | creates/s |");
        println!("|---|---:|---:|");
        println!(
            "| cluster secret, plain HTTP | {:.2} ms | {:.0} |",
            p50(0),
            rate(0)
        );
        println!("| mTLS | {:.2} ms | {:.0} |", p50(1), rate(1));
        println!(
            "| mTLS / plain | {:.2} | {:.2} |\n",
            p50(1) / p50(0),
            rate(1) / rate(0)
        );
    }
    // The detailed table of the last cluster measured.
    let (lat, rate, rounds) = by_mode
        .into_iter()
        .flatten()
        .last()
        .expect("at least one round");
    println!("## Machines API (issue 4)\n");
    println!("`cargo bench -p bazaar --bench api`: 3 agents on loopback, one machine (2 cores), release build\n");
    println!("| measure | result | target |");
    println!("|---|---|---|");
    println!(
        "| create→started p50 (API create + wait, {sequential} sequential) | {} | ≤ 15 ms |",
        ms(pct(&lat, 0.5))
    );
    println!("| create→started p99 | {} | ≤ 60 ms |", ms(pct(&lat, 0.99)));
    println!(
        "| creates/s sustained ({} creates→started, 32 in flight over 3 nodes) | {:.0} | ≥ 150 |",
        total - sequential,
        rate
    );
    if !rounds.is_empty() {
        println!(
            "| placement round (bids asked → winner chosen) p50 | {} | ≤ 2 ms |",
            ms(pct(&rounds, 0.5))
        );
        println!("| placement round p99 | {} | — |", ms(pct(&rounds, 0.99)));
    }
}

fn measure(rt: &tokio::runtime::Runtime, mtls: bool, total: usize, sequential: usize) -> Measured {
    let configure = |_: usize, o: &mut bazaar_testkit::AgentOptions| {
        o.memory_mb = (total as u64 + 10) * 256;
        o.cpus = total as u32 + 10;
    };
    // BAZAAR_BENCH_EXE=<path> measures another `bazaar` build (e.g. before a change).
    let exe = std::env::var_os("BAZAAR_BENCH_EXE")
        .map_or_else(|| std::path::PathBuf::from(EXE), std::path::PathBuf::from);
    let agents = if mtls {
        start_cluster(&exe, 3, configure)
    } else {
        start_plain_cluster(&exe, 3, configure)
    }
    .expect("cluster");
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
        // Wait until every node sees every host.
        loop {
            let r: Value = http
                .get(format!("{base}/v1/platform/regions"))
                .bearer_auth(api_token())
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if r["regions"][0]["hosts"] == 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let create = |http: reqwest::Client, base: String, body: Value| async move {
            let m: Value = http
                .post(format!("{base}/v1/apps/bench/machines"))
                .bearer_auth(api_token())
                .json(&body)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let id = m["id"].as_str().expect("created").to_string();
            let r = http
                .get(format!(
                    "{base}/v1/apps/bench/machines/{id}/wait?state=started&timeout=60"
                ))
                .bearer_auth(api_token())
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success());
            id
        };
        for _ in 0..5 {
            create(http.clone(), base.clone(), body.clone()).await;
        }
        let mut lat = Vec::new();
        let mut ids = Vec::new();
        for _ in 0..sequential {
            let t0 = Instant::now();
            ids.push(create(http.clone(), base.clone(), body.clone()).await);
            lat.push(t0.elapsed());
        }
        lat.sort();
        let rest = total - sequential;
        let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(32));
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        for i in 0..rest {
            let (http, sem, body) = (http.clone(), sem.clone(), body.clone());
            // Spread the exchange work over the three nodes, as clients would.
            let base = agents[i % 3].url();
            tasks.push(tokio::spawn(async move {
                let _p = sem.acquire().await.unwrap();
                create(http, base, body).await
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let rate = rest as f64 / t0.elapsed().as_secs_f64();
        let mut rounds = Vec::new();
        for id in ids.iter().take(200) {
            let p: Value = http
                .get(format!("{base}/v1/apps/bench/machines/{id}/placement"))
                .bearer_auth(api_token())
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if let Some(us) = p["rounds"][0]["elapsed_us"].as_u64() {
                rounds.push(Duration::from_micros(us));
            }
        }
        rounds.sort();
        (lat, rate, rounds)
    })
}
