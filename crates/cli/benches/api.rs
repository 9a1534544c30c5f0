//! Machines API benchmark (issue 4), on 3 local agents: create→started latency through
//! `POST /v1/apps/{app}/machines` + `wait` (p50/p99), creates/s sustained over 1,000
//! creates, and the placement round alone (bids asked → winner chosen, from the placement
//! records).
//!
//! Run: `cargo bench -p bazaar --bench api` (prints a Markdown table for BENCHMARKS.md).
//! `BAZAAR_BENCH_MACHINES` changes the create count (default 1000). `BAZAAR_BENCH_MTLS=1`
//! gives the hosts a cluster CA and certificates: calls between hosts go over mTLS.

use bazaar_testkit::{start_cluster, TEST_SECRET};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_bazaar");

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[(((sorted.len() as f64) - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

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
    let mtls = std::env::var("BAZAAR_BENCH_MTLS").is_ok_and(|v| v == "1");
    let ca_dir = tempfile::tempdir().unwrap();
    let ca_host = format!(
        "127.0.0.1:{}",
        bazaar_testkit::free_port(std::net::Ipv4Addr::LOCALHOST)
    );
    let ca = mtls.then(|| bazaar_pki::ClusterCa::init(ca_dir.path()).unwrap());
    let agents = start_cluster(std::path::Path::new(EXE), 3, |i, o| {
        o.memory_mb = (total as u64 + 10) * 256;
        o.cpus = total as u32 + 10;
        match (&ca, i) {
            (Some(_), 0) => o.extra_args.extend([
                "--cluster-ca".to_string(),
                ca_dir.path().display().to_string(),
                "--host-listen".into(),
                ca_host.clone(),
            ]),
            (Some(ca), _) => {
                let token = ca.new_join_token(Duration::from_secs(600)).unwrap();
                o.extra_args.extend([
                    "--join-token".to_string(),
                    token.to_string(),
                    "--join-addr".into(),
                    ca_host.clone(),
                    "--host-listen".into(),
                    "127.0.0.1:0".into(),
                ]);
            }
            (None, _) => {}
        }
    })
    .expect("cluster");
    println!(
        "hosts talk over {}",
        if mtls {
            "mTLS"
        } else {
            "plain HTTP with the cluster secret"
        }
    );
    let base = agents[0].url();
    let http = reqwest::Client::new();
    let body = json!({"config": {"image": "process", "driver": "process", "init": {"exec": ["sleep", "1000"]}, "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256}}, "region": "local"});
    let (lat, rate, rounds) = rt.block_on(async {
        http.post(format!("{base}/v1/apps"))
            .bearer_auth(TEST_SECRET)
            .json(&json!({"app_name": "bench"}))
            .send()
            .await
            .unwrap();
        // Wait until every node sees every host.
        loop {
            let r: Value = http
                .get(format!("{base}/v1/platform/regions"))
                .bearer_auth(TEST_SECRET)
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
                .bearer_auth(TEST_SECRET)
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
                .bearer_auth(TEST_SECRET)
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
                .bearer_auth(TEST_SECRET)
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
    });
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
    drop(agents);
}
