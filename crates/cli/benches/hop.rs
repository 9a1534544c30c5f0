//! The proxy hop between hosts (issue 15), with and without mTLS, in one run: two 2-host
//! clusters on loopback, one with a cluster CA (hops over mTLS to the owner's hop
//! listener) and one without (hops with the cluster secret, plain HTTP). In each, the
//! backend machine runs on host 1 and wrk sends through host 0's proxy, so every request
//! takes the hop. Rounds alternate the two clusters (the machine is shared with other
//! work: the load average is printed per round); reported are the medians: requests/s
//! with 64 connections, and latency p50/p99 with one connection.
//!
//! Run: `cargo bench -p bazaar --bench hop`. `BAZAAR_BENCH_SECS` (default 5) sets each
//! wrk run's length, `BAZAAR_BENCH_ROUNDS` (default 3) the rounds. Needs wrk (installed by
//! `cargo bench -p bazaar --bench proxy`, or `apt-get install wrk`).
//!
//! The backend is this benchmark's own executable started as a machine with
//! `BAZAAR_BENCH_BACKEND=1`: a hyper HTTP/1.1 server answering 13 bytes on `$PORT`.

use bazaar_testkit::{start_cluster, start_plain_cluster, TestAgent, TEST_SECRET};
use serde_json::json;
use std::process::Command;
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_bazaar");

fn main() {
    if std::env::var_os("BAZAAR_BENCH_BACKEND").is_some() {
        backend();
        return;
    }
    let secs: u64 = env_or("BAZAAR_BENCH_SECS", 5);
    let rounds: usize = env_or("BAZAAR_BENCH_ROUNDS", 3);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let configure = |i: usize, o: &mut bazaar_testkit::AgentOptions| {
        o.isolate = false;
        o.region = if i == 0 { "edge" } else { "own" }.into();
        o.extra_args
            .extend(["--autostop-idle-ms".into(), "3600000".into()]);
    };
    let exe = std::path::Path::new(EXE);
    let mtls = start_cluster(exe, 2, configure).expect("cluster with certificates");
    let plain = start_plain_cluster(exe, 2, configure).expect("cluster without");
    for agents in [&mtls, &plain] {
        rt.block_on(place_backend(agents));
    }
    let url = |agents: &[TestAgent]| format!("http://{}/", agents[0].proxy_addr());
    let mut results: [Vec<(f64, f64, f64)>; 2] = [Vec::new(), Vec::new()];
    println!("| round | load average (1 min) | hop | requests/s (64 conns) | p50 (1 conn) | p99 (1 conn) |");
    println!("|---|---:|---|---:|---:|---:|");
    for round in 0..rounds {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for mode in order {
            let agents = if mode == 0 { &plain } else { &mtls };
            let load = load_average();
            let busy = wrk(&url(agents), secs, 64);
            let one = wrk(&url(agents), secs, 1);
            let name = ["plain (cluster secret)", "mTLS"][mode];
            println!(
                "| {round} | {load} | {name} | {:.0} | {:.3} ms | {:.3} ms |",
                busy.rps, one.p50, one.p99
            );
            results[mode].push((busy.rps, one.p50, one.p99));
        }
    }
    let median = |mode: usize, f: fn(&(f64, f64, f64)) -> f64| {
        let mut v: Vec<f64> = results[mode].iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!("\n## Proxy hop between hosts, with and without mTLS (issue 15)\n");
    println!(
        "`cargo bench -p bazaar --bench hop`: wrk → host 0's proxy → hop → host 1's proxy → \
         machine, 2 hosts on loopback, {rounds} alternated rounds of {secs} s, medians\n"
    );
    println!("| hop | requests/s (64 conns) | p50 (1 conn) | p99 (1 conn) |");
    println!("|---|---:|---:|---:|");
    for (mode, name) in [(0, "plain HTTP + cluster secret"), (1, "mTLS")] {
        println!(
            "| {name} | {:.0} | {:.3} ms | {:.3} ms |",
            median(mode, |r| r.0),
            median(mode, |r| r.1),
            median(mode, |r| r.2)
        );
    }
    println!(
        "| mTLS / plain | {:.2} | {:.2} | {:.2} |",
        median(1, |r| r.0) / median(0, |r| r.0),
        median(1, |r| r.1) / median(0, |r| r.1),
        median(1, |r| r.2) / median(0, |r| r.2)
    );
    drop(mtls);
    drop(plain);
}

/// Creates the app and its backend machine on host 1 (region `own`), and waits until
/// host 0's proxy reaches it.
async fn place_backend(agents: &[TestAgent]) {
    let http = reqwest::Client::new();
    let base = agents[0].url();
    let me = std::env::current_exe().unwrap().display().to_string();
    let call = |path: &str, body: serde_json::Value| {
        http.post(format!("{base}/v1{path}"))
            .bearer_auth(TEST_SECRET)
            .json(&body)
            .send()
    };
    // Both hosts known to host 0 before placing.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r: serde_json::Value = http
            .get(format!("{base}/v1/platform/regions"))
            .bearer_auth(TEST_SECRET)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let hosts: u64 = r["regions"]
            .as_array()
            .map(|a| a.iter().filter_map(|r| r["hosts"].as_u64()).sum())
            .unwrap_or(0);
        if hosts == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "hosts never met: {r}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = call("/apps", json!({"app_name": "hop"})).await.unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let r = call(
        "/apps/hop/machines",
        json!({"region": "own", "config": {
            "image": "process", "driver": "process",
            "init": {"exec": [me]},
            "env": {"BAZAAR_BENCH_BACKEND": "1"},
            "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256},
            "restart": {"policy": "no"},
            "services": [{"internal_port": 8080, "protocol": "tcp", "autostart": true,
                "concurrency": {"type": "requests", "soft_limit": 10000, "hard_limit": 10000}}],
        }}),
    )
    .await
    .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ok = http
            .get(format!("http://{}/", agents[0].proxy_addr()))
            .header("host", "hop.localhost")
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ok {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the machine never answered through host 0"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .next()
        .unwrap_or("?")
        .to_string()
}

/// A wrk latency (`987.00us`, `3.07ms`, `1.20s`) in milliseconds.
fn millis(text: &str) -> f64 {
    let (number, unit) = text.split_at(
        text.find(|c: char| c.is_ascii_alphabetic())
            .unwrap_or(text.len()),
    );
    let n: f64 = number.parse().unwrap_or(f64::NAN);
    match unit {
        "us" => n / 1e3,
        "s" => n * 1e3,
        "m" => n * 60e3,
        _ => n,
    }
}

struct WrkResult {
    rps: f64,
    p50: f64,
    p99: f64,
}

fn wrk(url: &str, secs: u64, conns: u64) -> WrkResult {
    let threads = conns.clamp(1, 2);
    let out = Command::new("wrk")
        .args([
            &format!("-t{threads}"),
            &format!("-c{conns}"),
            &format!("-d{secs}s"),
            "--latency",
            "-H",
            "Host: hop.localhost",
            url,
        ])
        .output()
        .expect("wrk runs (apt-get install wrk)");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let field = |prefix: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(prefix))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or("?")
            .to_string()
    };
    let rps = field("Requests/sec:").parse().unwrap_or(0.0);
    assert!(!text.contains("Non-2xx") && rps > 0.0, "wrk {url}:\n{text}");
    WrkResult {
        rps,
        p50: millis(&field("50%")),
        p99: millis(&field("99%")),
    }
}

/// The backend machine: answers `hello, world\n` on `$PORT`.
fn backend() {
    use hyper::server::conn::http1;
    let port: u16 = std::env::var("PORT").unwrap().parse().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|_req| async {
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(
                        http_body_util::Full::new(bytes::Bytes::from_static(b"hello, world\n")),
                    ))
                });
                let _ = http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
}
