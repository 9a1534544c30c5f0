//! Internal DNS benchmark (issue 16): answers per second and latency (p50/p99) from one
//! host's resolver, on one root agent with 20 started process machines of one app. A load
//! generator of `BAZAAR_BENCH_DNS_CONCURRENCY` (default 64) outstanding questions, each
//! on its own loopback UDP socket, asks `web.internal` and `<id>.vm.web.internal` in turn
//! for `BAZAAR_BENCH_SECONDS` (default 10) seconds.
//!
//! Run: `cargo bench -p bazaar --bench dns` (prints a Markdown table for docs/benchmarks/dns.md).

use bazaar_dns::client::{question, reply};
use bazaar_dns::proto::rr::RecordType;
use bazaar_testkit::{free_port, start_cluster, Fly};
use serde_json::json;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_bazaar");
const MACHINES: usize = 20;

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[(((sorted.len() as f64) - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One closed-loop asker: a question, its answer, the next; latencies of the answers.
async fn asker(server: SocketAddr, names: Vec<String>, until: Instant) -> (Vec<Duration>, usize) {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    socket.connect(server).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let (mut lat, mut bad) = (Vec::new(), 0);
    let mut id: u16 = rand::random();
    for name in names.iter().cycle() {
        if Instant::now() >= until {
            break;
        }
        id = id.wrapping_add(1);
        let q = question(id, name, RecordType::A).unwrap();
        let t0 = Instant::now();
        socket.send(&q).await.unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(2), async {
            loop {
                let n = socket.recv(&mut buf).await.unwrap();
                // The id is the first two bytes; the answer counts below are checked once.
                if buf[..2] == id.to_be_bytes() {
                    return n;
                }
            }
        })
        .await;
        match answer {
            Ok(n) if lat.is_empty() => {
                let (_, r) = reply(&buf[..n]).unwrap();
                assert!(!r.addresses.is_empty(), "{name}: {r:?}");
                lat.push(t0.elapsed());
            }
            Ok(_) => lat.push(t0.elapsed()),
            Err(_) => bad += 1,
        }
    }
    (lat, bad)
}

fn main() {
    let concurrency = env_or("BAZAAR_BENCH_DNS_CONCURRENCY", 64) as usize;
    let seconds = env_or("BAZAAR_BENCH_SECONDS", 10);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dns = SocketAddr::from(([127, 0, 0, 1], free_port(Ipv4Addr::LOCALHOST)));
    let agents = start_cluster(std::path::Path::new(EXE), 1, |_, o| {
        o.extra_args.extend([
            "--dns-listen".into(),
            dns.to_string(),
            // Nothing is forwarded in this benchmark; never outside loopback anyway.
            "--dns-upstream".into(),
            "127.0.0.1:9".into(),
        ]);
    })
    .unwrap();
    rt.block_on(async {
        let fly = Fly::new(&agents[0]);
        fly.create_app("web").await;
        let mut ids = Vec::new();
        for _ in 0..MACHINES {
            let (s, m) = fly
                .post(
                    "/apps/web/machines",
                    json!({"config": {"image": "process", "driver": "process",
                                      "init": {"exec": ["sleep", "3600"]}}}),
                )
                .await;
            assert!(s.is_success(), "{m}");
            let id = m["id"].as_str().unwrap().to_string();
            fly.wait_state("web", &id, "started").await;
            ids.push(id);
        }
        // Every machine in the answer (the catalog row carries its address).
        bazaar_testkit::eventually(Duration::from_secs(10), || async {
            let r = bazaar_dns::client::ask(dns, "web.internal", RecordType::A, Duration::from_secs(2))
                .await
                .ok()?;
            (r.addresses.len() == MACHINES).then_some(())
        })
        .await
        .expect("web.internal lists every machine (is the agent root?)");
        let mut names = vec!["web.internal".to_string()];
        names.extend(ids.iter().map(|id| format!("{id}.vm.web.internal")));
        let start = Instant::now();
        let until = start + Duration::from_secs(seconds);
        let tasks: Vec<_> = (0..concurrency)
            .map(|i| {
                let mut names = names.clone();
                let shift = i % names.len();
                names.rotate_left(shift);
                tokio::spawn(asker(dns, names, until))
            })
            .collect();
        let (mut lat, mut lost) = (Vec::new(), 0);
        for t in tasks {
            let (l, b) = t.await.unwrap();
            lat.extend(l);
            lost += b;
        }
        let elapsed = start.elapsed();
        lat.sort();
        println!("| measure | value |");
        println!("|---|---|");
        println!(
            "| answers/s ({concurrency} outstanding, {seconds} s, {MACHINES} machines) | **{:.0}** |",
            lat.len() as f64 / elapsed.as_secs_f64()
        );
        println!("| latency p50 | {} |", ms(pct(&lat, 0.5)));
        println!("| latency p99 | {} |", ms(pct(&lat, 0.99)));
        println!("| unanswered within 2 s | {lost} of {} |", lat.len() + lost);
        println!("| load average after | {} |", loadavg());
    });
}
