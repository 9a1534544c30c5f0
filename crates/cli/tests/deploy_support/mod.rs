//! Helpers of the deploy tests: a 3-agent, 2-region cluster, an app config file written
//! per release, the `bazaar` CLI run against it, and a bounded load generator through the
//! proxies.
#![allow(dead_code)]

use bazaar_testkit::{start_cluster, Fly, TestAgent};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const EXE: &str = env!("CARGO_BIN_EXE_bazaar");

/// The workload: answers its release (`$VERSION`) and machine id; `/healthz` answers 200,
/// or 500 when `$HEALTHY` is 0. On SIGINT it stops accepting and finishes what it serves.
pub const BACKEND: &str = r#"
import http.server, json, os, signal, socketserver, sys, threading, time
V = os.environ.get("VERSION", "?")
MID = os.environ.get("FLY_MACHINE_ID", "?")
HEALTHY = os.environ.get("HEALTHY", "1") == "1"

class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 2  # idle keep-alive connections do not hold up a stop for long
    def do_GET(self):
        if self.path == "/healthz":
            code, body = (200, b"ok") if HEALTHY else (500, b"sick")
        else:
            code, body = 200, json.dumps({"version": V, "machine": MID}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass

class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 256

srv = S(("0.0.0.0", int(os.environ["PORT"])), H)
def stop(*_):
    threading.Thread(target=srv.shutdown).start()
signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGTERM, stop)
print("serving version", V, flush=True)
srv.serve_forever()
srv.server_close()
time.sleep(0.3)  # requests in flight finish
print("stopped version", V, flush=True)
"#;

pub struct Env {
    pub agents: Vec<TestAgent>,
    pub dir: tempfile::TempDir,
    pub http: reqwest::Client,
    /// The Machines API of agent 0.
    pub fly: Fly,
}

impl Env {
    /// Three agents: ams, ord, ams.
    pub fn start() -> Env {
        let regions = ["ams", "ord", "ams"];
        let agents = start_cluster(std::path::Path::new(EXE), 3, |i, o| {
            o.region = regions[i].to_string();
        })
        .expect("cluster starts");
        // Placement by region needs every host in agent 0's catalog (a loaded machine can
        // take a moment to gossip the ord host), and a host pulling an image of the
        // cluster's registry needs its peers in its own: wait until every agent knows all
        // three, on a thread of its own (the tests call this from inside their runtime).
        let flys: Vec<Fly> = agents.iter().map(Fly::new).collect();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(bazaar_testkit::eventually(
                Duration::from_secs(15),
                || async {
                    for fly in &flys {
                        let (_, r) = fly.get("/platform/regions").await;
                        let hosts: u64 = r["regions"]
                            .as_array()?
                            .iter()
                            .filter_map(|g| g["hosts"].as_u64())
                            .sum();
                        if hosts != 3 {
                            return None;
                        }
                    }
                    Some(())
                },
            ))
        })
        .join()
        .unwrap()
        .expect("every agent knows all three hosts");
        let dir = tempfile::Builder::new()
            .prefix("bazaar-deploy-")
            .tempdir()
            .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(16)
            .build()
            .unwrap();
        Env {
            fly: Fly::with_client(&agents[0], http.clone()),
            agents,
            dir,
            http,
        }
    }

    /// Writes `bazaar.toml` for `app` at `version`; `extra` is appended verbatim.
    pub fn write_config(&self, app: &str, version: u32, healthy: bool, extra: &str) -> PathBuf {
        let path = self.dir.path().join(format!("{app}-v{version}.toml"));
        let text = format!(
            r#"app = "{app}"
primary_region = "ams"
kill_signal = "SIGINT"
kill_timeout = 5

[build]
  driver = "process"

[processes]
  app = "python3 -c 'import os; exec(os.environ[\"BACKEND_PY\"])'"

[env]
  VERSION = "{version}"
  HEALTHY = "{healthy}"
  BACKEND_PY = '''{BACKEND}'''

[http_service]
  internal_port = 8080
  [[http_service.checks]]
    path = "/healthz"
    interval = "200ms"
    timeout = "1s"

[[restart]]
  policy = "no"

[deploy]
  wait_timeout = "20s"
{extra}
"#,
            healthy = if healthy { 1 } else { 0 },
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Runs the CLI with the cluster's API: (exit ok, stdout, stderr).
    pub fn cli(&self, args: &[&str]) -> (bool, String, String) {
        let out = std::process::Command::new(EXE)
            .args(args)
            .env("BAZAAR_API_URL", self.agents[0].url())
            .env("BAZAAR_TOKEN", bazaar_testkit::api_token())
            .env_remove("BAZAAR_APP")
            .current_dir(self.dir.path())
            .output()
            .expect("bazaar runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Runs the CLI with `--json` and parses what it printed.
    pub fn cli_json(&self, args: &[&str]) -> (bool, Value, String) {
        let mut a = args.to_vec();
        a.push("--json");
        let (ok, out, err) = self.cli(&a);
        let v = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {out}\nstderr: {err}"));
        (ok, v, err)
    }

    /// `GET /v1{path}` on agent 0: the answer's JSON.
    pub async fn api(&self, path: &str) -> Value {
        self.fly.get(path).await.1
    }

    /// The app's live machines.
    pub async fn machines(&self, app: &str) -> Vec<Value> {
        self.api(&format!("/apps/{app}/machines"))
            .await
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Waits until every proxy answers 200 for the app.
    pub async fn wait_routable(&self, app: &str) {
        for a in &self.agents {
            let url = a.proxy_url();
            bazaar_testkit::eventually(Duration::from_secs(20), || {
                let url = url.clone();
                async move {
                    let r = self
                        .http
                        .get(&url)
                        .header("host", format!("{app}.localhost"))
                        .send()
                        .await
                        .ok()?;
                    (r.status() == 200).then_some(())
                }
            })
            .await
            .unwrap_or_else(|_| panic!("{app} never routable through {url}"));
        }
    }
}

/// The release labels and VERSION env of the app's machines, sorted.
pub fn versions(machines: &[Value]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = machines
        .iter()
        .map(|m| {
            (
                m["config"]["metadata"]["fly_release_version"]
                    .as_str()
                    .unwrap_or("-")
                    .to_string(),
                m["config"]["env"]["VERSION"]
                    .as_str()
                    .unwrap_or("-")
                    .to_string(),
            )
        })
        .collect();
    v.sort();
    v
}

/// Machines per region.
pub fn regions(machines: &[Value]) -> std::collections::BTreeMap<String, usize> {
    let mut out = std::collections::BTreeMap::new();
    for m in machines {
        *out.entry(m["region"].as_str().unwrap_or("").to_string())
            .or_insert(0) += 1;
    }
    out
}

/// What a load run saw.
#[derive(Debug, Default)]
pub struct LoadResult {
    pub ok: u64,
    pub failed: u64,
    pub failures: Vec<String>,
    /// Releases that answered.
    pub versions: std::collections::BTreeSet<String>,
}

/// A bounded load generator: `workers` loops of GETs through the proxies (in turn) until
/// stopped, at most `max` requests or `max_time`.
pub struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    result: Arc<Mutex<LoadResult>>,
}

impl Load {
    pub fn start(env: &Env, app: &str, workers: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let result = Arc::new(Mutex::new(LoadResult::default()));
        let count = Arc::new(AtomicU64::new(0));
        let urls: Vec<String> = env.agents.iter().map(|a| a.proxy_url()).collect();
        let mut tasks = Vec::new();
        let started = Instant::now();
        for w in 0..workers {
            let (stop, result, count, urls) =
                (stop.clone(), result.clone(), count.clone(), urls.clone());
            let http = env.http.clone();
            let host = format!("{app}.localhost");
            tasks.push(tokio::spawn(async move {
                let mut i = w;
                while !stop.load(Ordering::SeqCst)
                    && count.fetch_add(1, Ordering::SeqCst) < 20_000
                    && started.elapsed() < Duration::from_secs(120)
                {
                    let url = &urls[i % urls.len()];
                    i += 1;
                    let r = http
                        .get(format!("{url}/"))
                        .header("host", &host)
                        .timeout(Duration::from_secs(15))
                        .send()
                        .await;
                    let outcome = match r {
                        Ok(r) if r.status() == 200 => match r.json::<Value>().await {
                            Ok(v) => Ok(v["version"].as_str().unwrap_or("?").to_string()),
                            Err(e) => Err(format!("body: {e}")),
                        },
                        Ok(r) => {
                            let s = r.status();
                            Err(format!("{s}: {}", r.text().await.unwrap_or_default()))
                        }
                        Err(e) => Err(format!("{e}")),
                    };
                    {
                        let mut res = result.lock().unwrap();
                        match outcome {
                            Ok(v) => {
                                res.ok += 1;
                                res.versions.insert(v);
                            }
                            Err(e) => {
                                res.failed += 1;
                                if res.failures.len() < 10 {
                                    res.failures.push(e);
                                }
                            }
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }));
        }
        Load {
            stop,
            tasks,
            result,
        }
    }

    pub async fn finish(self) -> LoadResult {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.tasks {
            t.await.unwrap();
        }
        std::mem::take(&mut *self.result.lock().unwrap())
    }
}
