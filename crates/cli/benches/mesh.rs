//! Mesh benchmark (issue 16, acceptance 2): machine → machine across two lab hosts, TCP
//! throughput and request latency, on three paths in one run:
//!
//! - **mesh**: the client machine on h1, the server machine on h2, through both hosts'
//!   WireGuard device (boringtun, userspace);
//! - **plain**: the same two machines, the route to the other host's prefix replaced by one
//!   via the other host's lab address (veth and bridge, routed, no encryption), then put
//!   back;
//! - **loopback**: client and server in the server machine itself (127.0.0.1).
//!
//! Throughput: `curl` downloads a 256 MiB file from `python3 -m http.server` (best of 3).
//! Latency: 200 sequential `GET` of a small file, curl's `time_total` (p50, p99).
//! Prints a Markdown table for docs/benchmarks/mesh.md. Run as root:
//! `cargo bench -p bazaar --bench mesh`. The lab is taken down at the end.

use bazaar_lab::{AgentSettings, Lab, UpOptions};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const EXE: &str = env!("CARGO_BIN_EXE_bazaar");
const BIG_MIB: u32 = 256;
const REQUESTS: usize = 200;

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

struct Api {
    http: reqwest::Client,
    url: String,
    token: String,
}

impl Api {
    async fn post(&self, path: &str, body: Value) -> Value {
        let resp = self
            .http
            .post(format!("{}{path}", self.url))
            .bearer_auth(&self.token)
            .json(&body)
            .timeout(Duration::from_secs(300))
            .send()
            .await
            .expect("the API answers");
        assert!(resp.status().is_success(), "{path}: {}", resp.status());
        resp.json().await.unwrap_or(Value::Null)
    }

    async fn get(&self, path: &str) -> Value {
        let resp = self
            .http
            .get(format!("{}{path}", self.url))
            .bearer_auth(&self.token)
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .expect("the API answers");
        resp.json().await.unwrap_or(Value::Null)
    }

    /// A started machine of app `bench` in `region` running `script`: (id, private ip).
    async fn machine(&self, region: &str, script: &str) -> (String, String) {
        let config = json!({
            "image": "process", "driver": "process",
            "init": {"exec": ["sh", "-c", script]},
            "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 1024},
        });
        let m = self
            .post(
                "/v1/apps/bench/machines",
                json!({"config": config, "region": region}),
            )
            .await;
        let id = m["id"].as_str().expect("a machine id").to_string();
        self.get(&format!(
            "/v1/apps/bench/machines/{id}/wait?state=started&timeout=60"
        ))
        .await;
        let m = self.get(&format!("/v1/apps/bench/machines/{id}")).await;
        (id, m["private_ip"].as_str().unwrap().to_string())
    }

    /// Runs `script` in machine `id`; its stdout (panics unless it exits 0).
    async fn sh(&self, id: &str, script: &str) -> String {
        let v = self
            .post(
                &format!("/v1/apps/bench/machines/{id}/exec"),
                json!({"command": ["sh", "-c", script], "timeout": 240}),
            )
            .await;
        assert_eq!(v["exit_code"], 0, "{script}: {v}");
        v["stdout"].as_str().unwrap_or_default().to_string()
    }
}

struct PathResult {
    mib_s: f64,
    p50_ms: f64,
    p99_ms: f64,
}

/// Throughput (best of 3 downloads) and latency from machine `id` to `host`.
async fn measure(api: &Api, id: &str, host: &str) -> PathResult {
    let mut best = 0.0f64;
    for _ in 0..3 {
        let out = api
            .sh(
                id,
                &format!("curl -sS -o /dev/null -w '%{{speed_download}}' http://{host}:8080/big"),
            )
            .await;
        let bytes_s: f64 = out.trim().parse().expect("curl's speed");
        best = best.max(bytes_s / (1024.0 * 1024.0));
    }
    let out = api
        .sh(
            id,
            &format!(
                "for i in $(seq {REQUESTS}); do curl -sS -o /dev/null -w '%{{time_total}}\\n' http://{host}:8080/small; done"
            ),
        )
        .await;
    let mut times: Vec<f64> = out
        .lines()
        .filter_map(|l| l.trim().parse::<f64>().ok())
        .map(|s| s * 1e3)
        .collect();
    assert_eq!(times.len(), REQUESTS, "{out}");
    times.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| times[((times.len() as f64 - 1.0) * p).round() as usize];
    PathResult {
        mib_s: best,
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
    }
}

fn prefix22(ip: &str) -> String {
    let ip: std::net::Ipv4Addr = ip.parse().unwrap();
    let base = std::net::Ipv4Addr::from(u32::from(ip) & !0x3ff);
    format!("{base}/22")
}

fn ip_in(netns: &str, args: &str) {
    let status = Command::new("ip")
        .args(["-n", netns])
        .args(args.split_whitespace())
        .status()
        .unwrap();
    assert!(status.success(), "ip -n {netns} {args}");
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    assert!(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() } == 0,
        "the mesh bench needs root (bazaar lab)"
    );
    let dir = tempfile::Builder::new()
        .prefix("bazaar-mesh-bench-")
        .tempdir()
        .unwrap();
    let down = Down(dir.path().to_path_buf());
    let lab = Lab::up(UpOptions {
        dir: dir.path().to_path_buf(),
        hosts: 2,
        regions: vec!["ams".into(), "ord".into()],
        subnet: None,
        exe: EXE.into(),
        small_disk: false,
        agent: AgentSettings {
            memory_mb: Some(4096),
            ..AgentSettings::default()
        },
    })
    .expect("lab up");
    lab.wait_converged(Duration::from_secs(60))
        .expect("the lab converges");
    let (h1, h2) = (lab.host("h1").unwrap(), lab.host("h2").unwrap());
    let api = Api {
        http: reqwest::Client::new(),
        url: lab.api_url(&h1),
        token: lab.token().to_string(),
    };
    api.post(
        "/v1/apps",
        json!({"app_name": "bench", "org_slug": "personal"}),
    )
    .await;
    let (server, server_ip) = api
        .machine(
            "ord",
            &format!(
                "dd if=/dev/zero of=big bs=1M count={BIG_MIB} 2>/dev/null; echo ok > small; \
                 exec python3 -m http.server --bind 0.0.0.0 8080"
            ),
        )
        .await;
    let (client, client_ip) = api.machine("ams", "exec sleep 100000").await;
    // The server is ready once it answers on loopback.
    for _ in 0..100 {
        let v = api
            .post(
                &format!("/v1/apps/bench/machines/{server}/exec"),
                json!({"command": ["curl", "-sf", "http://127.0.0.1:8080/small"], "timeout": 5}),
            )
            .await;
        if v["exit_code"] == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Warm the mesh (handshake) before measuring.
    api.sh(
        &client,
        &format!("for i in $(seq 50); do curl -sf -m 2 http://{server_ip}:8080/small && exit 0; sleep 0.2; done; exit 1"),
    )
    .await;

    let mesh = measure(&api, &client, &server_ip).await;

    // The same machines, routed over the lab's veths and bridge without the mesh.
    let (a_prefix, b_prefix) = (prefix22(&client_ip), prefix22(&server_ip));
    ip_in(
        &h1.netns,
        &format!("route replace {b_prefix} via {}", h2.addr),
    );
    ip_in(
        &h2.netns,
        &format!("route replace {a_prefix} via {}", h1.addr),
    );
    let plain = measure(&api, &client, &server_ip).await;
    let wg = |h: &bazaar_lab::plan::HostPlan| {
        let id = lab.state().hosts[h.index - 1].host_id.clone().unwrap();
        format!("wg-{}", &bazaar_agent::network::bridge_name(&id)[3..])
    };
    ip_in(
        &h1.netns,
        &format!("route replace {b_prefix} dev {}", wg(&h1)),
    );
    ip_in(
        &h2.netns,
        &format!("route replace {a_prefix} dev {}", wg(&h2)),
    );

    let loopback = measure(&api, &server, "127.0.0.1").await;

    let load = load();
    println!("| path | throughput | ratio to plain | latency p50 | p99 |");
    println!("|---|---|---|---|---|");
    for (name, r) in [
        ("mesh (boringtun, userspace)", &mesh),
        ("plain (veth + bridge, routed)", &plain),
        ("loopback (in the machine)", &loopback),
    ] {
        println!(
            "| {name} | {:.0} MiB/s | {:.0} % | {:.2} ms | {:.2} ms |",
            r.mib_s,
            100.0 * r.mib_s / plain.mib_s,
            r.p50_ms,
            r.p99_ms
        );
    }
    println!("\nload average after the run: {load}");
    drop(lab);
    drop(down);
}
