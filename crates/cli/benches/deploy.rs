//! Deploy benchmark (issue 6), on 3 local agents: time to deploy 10, 50 and 100 machines
//! from zero until every one is started with its HTTP health check passing, and a rolling
//! update of 50 (one at a time, then 10 at a time). The workload is a small Python HTTP
//! server; deploys go through `bazaar_deploy` exactly as `bazaar deploy` runs them.
//!
//! Run: `cargo bench -p bazaar --bench deploy` (prints a Markdown table for
//! docs/benchmarks/deploys.md).

use bazaar_deploy::api::Client;
use bazaar_deploy::config::MaxUnavailable;
use bazaar_deploy::ops::{deploy, Initial, Settings};
use bazaar_deploy::progress::Silent;
use bazaar_testkit::{api_token, start_cluster};
use std::sync::Arc;
use std::time::Duration;

const EXE: &str = env!("CARGO_BIN_EXE_bazaar");

const BACKEND: &str = r#"
import http.server, os, signal, socketserver, threading
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 2
    def do_GET(self):
        body = os.environ.get("VERSION", "?").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
srv = S(("0.0.0.0", int(os.environ["PORT"])), H)
signal.signal(signal.SIGINT, lambda *_: threading.Thread(target=srv.shutdown).start())
srv.serve_forever()
"#;

fn config(app: &str, version: u32) -> bazaar_deploy::config::AppConfig {
    let text = format!(
        r#"app = "{app}"
[build]
  driver = "process"
[processes]
  app = "python3 -c 'import os; exec(os.environ[\"BACKEND_PY\"])'"
[env]
  VERSION = "{version}"
  BACKEND_PY = '''{BACKEND}'''
[http_service]
  internal_port = 8080
  [[http_service.checks]]
    path = "/"
    interval = "250ms"
    timeout = "2s"
[[restart]]
  policy = "no"
[deploy]
  wait_timeout = "120s"
"#
    );
    bazaar_deploy::config::parse("bench.toml", &text)
        .expect("config")
        .config
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let agents = start_cluster(std::path::Path::new(EXE), 3, |_, o| {
        o.cpus = 400;
        o.memory_mb = 400 * 256;
    })
    .expect("cluster");
    let client = Client::new(&agents[0].url(), api_token());
    let mut rows: Vec<(String, Duration, String)> = Vec::new();
    rt.block_on(async {
        // Every node must know every host first.
        bazaar_testkit::eventually(Duration::from_secs(20), || async {
            let r = client
                .call(reqwest::Method::GET, "/platform/regions", None, None)
                .await
                .ok()?;
            (r["regions"][0]["hosts"] == 3).then_some(())
        })
        .await
        .expect("3 hosts");
        let settings = Settings::default();
        for n in [10usize, 50, 100] {
            let app = format!("bench{n}");
            let initial = Initial {
                count: Some(n),
                regions: Vec::new(),
            };
            let out = deploy(
                &client,
                &config(&app, 1),
                &initial,
                &settings,
                Arc::new(Silent),
            )
            .await
            .expect("deploy");
            let r = out.report.expect("report");
            assert!(r.ok, "{r:?}");
            assert_eq!(r.created.len(), n);
            rows.push((
                format!("deploy {n} machines from zero (started + healthy)"),
                Duration::from_secs_f64(r.seconds),
                loadavg(),
            ));
            eprintln!("{:?}", rows.last().unwrap());
        }
        for (k, at_once) in [(2u32, 1usize), (3, 10)] {
            let s = Settings {
                max_unavailable: Some(MaxUnavailable::Count(at_once)),
                ..Settings::default()
            };
            let out = deploy(
                &client,
                &config("bench50", k),
                &Initial::default(),
                &s,
                Arc::new(Silent),
            )
            .await
            .expect("deploy");
            let r = out.report.expect("report");
            assert!(r.ok, "{r:?}");
            assert_eq!(r.updated.len(), 50);
            rows.push((
                format!("rolling update of 50, max_unavailable {at_once}"),
                Duration::from_secs_f64(r.seconds),
                loadavg(),
            ));
            eprintln!("{:?}", rows.last().unwrap());
        }
    });
    println!("| deploy (3 local agents, drain until no request is in flight, check interval 250 ms) | time | load avg (1/5/15 min) after |");
    println!("|---|---|---|");
    for (what, d, load) in rows {
        println!("| {what} | {:.2} s | {load} |", d.as_secs_f64());
    }
}
