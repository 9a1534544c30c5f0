//! Edge proxy benchmark (issues 5 and 17), in one run on one local agent: wrk against a
//! backend machine directly, through bazaar's proxy, through nginx and through HAProxy
//! configured as reverse proxies with upstream keep-alive to the same backend
//! (requests/s, p50/p99, each proxy's CPU time per request); HTTPS keep-alive and a new TLS
//! connection per request through nginx and, when this build's agent has an HTTPS listener
//! (`--proxy-tls-listen`), through bazaar's proxy; then the wake-from-stopped latency (stop
//! the machine, time the first request through the proxy; the backend binds in well under
//! 5 ms).
//!
//! nginx and HAProxy do the same work to each request as bazaar's proxy: X-Forwarded-For,
//! X-Forwarded-Proto and a request id sent to the machine, the request id returned to the
//! client. nginx also runs with X-Forwarded-For only, shown beside. The HTTPS rows use one
//! self-signed ECDSA P-256 certificate for `bench.localhost` (given to bazaar with `bazaar
//! certs add --cert --key`) and hold wrk to TLS 1.3, TLS_AES_128_GCM_SHA256 and X25519.
//!
//! Run: `cargo bench -p bazaar --bench proxy` (installs Debian's wrk, nginx and haproxy
//! with apt-get when missing; prints Markdown tables for docs/benchmarks/proxy.md).
//! `BAZAAR_BENCH_SECS` (default 3) sets each wrk run's length, `BAZAAR_BENCH_CONNS`
//! (default 64) its connections, `BAZAAR_BENCH_WAKES` (default 40) the number of wake-ups,
//! `BAZAAR_BENCH_ISOLATE` (set: the backend is an isolated machine, reached by every proxy
//! at its private address behind its veth, issue 36; unset: a root machine on loopback),
//! `BAZAAR_BENCH_ROUNDS` (default 12) the interleaved rounds (every other one in
//! reverse order), `BAZAAR_BENCH_PIN` (set: every proxy on CPU 0, wrk and the backend on
//! CPU 1), `BAZAAR_BENCH_EXE` another
//! build of bazaar to run as the agent (a before/after). Reported: the median run of
//! each path, and, round by round, bazaar against nginx and HAProxy (the throughput ratio,
//! and whose p99 is lower) with the median of those ratios and the load average before
//! each round: the machine may be shared, and a pair run back to back sees the same
//! conditions.
//!
//! The backend is this benchmark's own executable started as a machine with
//! `BAZAAR_BENCH_BACKEND=1`: a hyper HTTP/1.1 server answering 13 bytes on `$PORT`.

mod proxy_peers;

use bazaar_testkit::{api_token, start_cluster};
use proxy_peers::{
    bazaar_add_cert, bazaar_has_tls, ensure_packages, loadavg, millis, pin, pinned, sbin,
    start_haproxy, wrk, Load, Tls, WrkResult, CLIENT_CPU, PROXY_CPU, TLS_HOST,
};
use serde_json::{json, Value};
use std::process::Command;
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_bazaar");

/// The agent binary: this build's, or `BAZAAR_BENCH_EXE` (another build of bazaar, such
/// as the one a change started from, for a before/after in the same conditions).
fn agent_exe() -> std::path::PathBuf {
    std::env::var_os("BAZAAR_BENCH_EXE").map_or_else(|| EXE.into(), Into::into)
}

fn main() {
    if std::env::var_os("BAZAAR_BENCH_BACKEND").is_some() {
        backend();
        return;
    }
    let secs: u64 = env_or("BAZAAR_BENCH_SECS", 3);
    let conns: u64 = env_or("BAZAAR_BENCH_CONNS", 64);
    let wakes: usize = env_or("BAZAAR_BENCH_WAKES", 40);
    let rounds: usize = env_or("BAZAAR_BENCH_ROUNDS", 12);
    ensure_packages(&[
        ("wrk", "wrk"),
        ("nginx", "nginx"),
        ("haproxy", "haproxy"),
        ("openssl", "openssl"),
    ]);
    let exe = agent_exe();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // `BAZAAR_BENCH_ISOLATE`: the backend is an isolated machine (its own user and network
    // namespace, behind its veth; every proxy reaches its private address), as users run
    // them (issue 36); otherwise the proxies alone are compared, against a backend on the
    // host's loopback.
    let isolated = std::env::var_os("BAZAAR_BENCH_ISOLATE").is_some();
    let agents = start_cluster(&exe, 1, |_, o| {
        o.extra_args
            .extend(["--autostop-idle-ms".into(), "3600000".into()]);
        if !isolated {
            // Without isolation, which a root agent allows only with root machines.
            o.isolate = false;
            o.extra_args.push("--allow-root-machines".into());
        }
    })
    .expect("agent");
    // An isolated machine sees the host's /usr, not this build's directory: the backend
    // (this executable) is copied there for the run.
    let backend_copy = isolated.then(BackendCopy::new);
    let agent = &agents[0];
    // The agent's HTTPS listener (the test kit asks for one), when this build has one.
    let bazaar_tls_port = bazaar_has_tls(&exe).then(|| {
        agent
            .proxy_tls_addr()
            .expect("the agent's HTTPS listener")
            .port()
    });
    let base = agent.url();
    let proxy = agent.proxy_addr();
    let http = reqwest::Client::new();
    let me = match &backend_copy {
        Some(copy) => copy.exe.display().to_string(),
        None => std::env::current_exe().unwrap().display().to_string(),
    };
    let api = |m: reqwest::Method, path: String, body: Option<Value>| {
        let mut r = http
            .request(m, format!("{base}/v1{path}"))
            .bearer_auth(api_token());
        if let Some(b) = body {
            r = r.json(&b);
        }
        async move {
            let resp = r.send().await.unwrap();
            let s = resp.status();
            let v: Value = resp.json().await.unwrap_or(Value::Null);
            assert!(s.is_success(), "{s}: {v}");
            v
        }
    };
    let mut backend_env = json!({"BAZAAR_BENCH_BACKEND": "1"});
    if pinned() {
        backend_env["BAZAAR_BENCH_BACKEND_CPU"] = json!(CLIENT_CPU.to_string());
    }
    let machine = |autostart: bool| {
        json!({"config": {
            "image": "process", "driver": "process",
            "init": {"exec": [me.clone()]},
            "env": backend_env.clone(),
            "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256},
            "restart": {"policy": "no"},
            "services": [{"internal_port": 8080, "protocol": "tcp", "autostart": autostart,
                "concurrency": {"type": "requests", "soft_limit": 10000}}],
        }})
    };
    let (backend, wake_id) = rt.block_on(async {
        api(
            reqwest::Method::POST,
            "/apps".into(),
            Some(json!({"app_name": "bench"})),
        )
        .await;
        api(
            reqwest::Method::POST,
            "/apps".into(),
            Some(json!({"app_name": "wake"})),
        )
        .await;
        let m = api(
            reqwest::Method::POST,
            "/apps/bench/machines".into(),
            Some(machine(false)),
        )
        .await;
        let id = m["id"].as_str().unwrap().to_string();
        api(
            reqwest::Method::GET,
            format!("/apps/bench/machines/{id}/wait?state=started&timeout=30"),
            None,
        )
        .await;
        let m = api(
            reqwest::Method::GET,
            format!("/apps/bench/machines/{id}"),
            None,
        )
        .await;
        let backend = match isolated {
            true => format!(
                "{}:8080",
                m["private_ip"].as_str().expect("a private address")
            ),
            false => format!(
                "127.0.0.1:{}",
                m["host_ports"]["8080"].as_u64().expect("host port")
            ),
        };
        let w = api(
            reqwest::Method::POST,
            "/apps/wake/machines".into(),
            Some(machine(true)),
        )
        .await;
        (backend, w["id"].as_str().unwrap().to_string())
    });
    let direct = backend;
    wait_ok(&rt, &format!("http://{direct}/"), None);
    wait_ok(&rt, &format!("http://{proxy}/"), Some("bench.localhost"));
    let peers_dir = tempfile::tempdir().unwrap();
    let tls = Tls::make(peers_dir.path());
    if let Some(port) = bazaar_tls_port {
        bazaar_add_cert(&exe, &base, api_token(), "bench", &tls);
        wait_tls_ok(&tls, port);
    }
    let nginx_ports = NginxPorts {
        like: bazaar_testkit::free_port(std::net::Ipv4Addr::LOCALHOST),
        plain: bazaar_testkit::free_port(std::net::Ipv4Addr::LOCALHOST),
        tls: bazaar_testkit::free_port(std::net::Ipv4Addr::LOCALHOST),
        tls_close: bazaar_testkit::free_port(std::net::Ipv4Addr::LOCALHOST),
    };
    let mut nginx = start_nginx(peers_dir.path(), &nginx_ports, &tls, &direct);
    let haproxy_port = bazaar_testkit::free_port(std::net::Ipv4Addr::LOCALHOST);
    let mut haproxy = start_haproxy(peers_dir.path(), haproxy_port, &direct);
    wait_ok(
        &rt,
        &format!("http://127.0.0.1:{}/", nginx_ports.like),
        None,
    );
    wait_ok(
        &rt,
        &format!("http://127.0.0.1:{}/", nginx_ports.plain),
        None,
    );
    wait_ok(&rt, &format!("http://127.0.0.1:{haproxy_port}/"), None);
    wait_tls_ok(&tls, nginx_ports.tls);

    let agent_pid = agents[0].pid().expect("agent running");
    let nginx_pids = children(nginx.id());
    if pinned() {
        for pid in nginx_pids.iter().chain([&agent_pid, &haproxy.id()]) {
            pin(*pid, PROXY_CPU);
        }
    }
    let urls = [
        format!("http://{direct}/"),
        format!("http://{proxy}/"),
        format!("http://127.0.0.1:{}/", nginx_ports.like),
        format!("http://127.0.0.1:{}/", nginx_ports.plain),
        format!("http://127.0.0.1:{haproxy_port}/"),
        format!("https://{TLS_HOST}:{}/", nginx_ports.tls),
        format!("https://{TLS_HOST}:{}/", nginx_ports.tls_close),
        format!("https://{TLS_HOST}:{}/", bazaar_tls_port.unwrap_or(0)),
    ];
    let plain = |url: usize, host: Option<&'static str>| Load {
        url: &urls[url],
        host,
        close: false,
        tls: None,
    };
    let https = |url: usize, close: bool| Load {
        url: &urls[url],
        host: None,
        close,
        tls: Some(&tls),
    };
    // The rows, in the order each round runs them (each bazaar row beside the rows it is
    // compared with); `pids`: whose CPU time is the proxy's.
    let mut runs = vec![
        Run::new(DIRECT, plain(0, None), vec![]),
        Run::new(NGINX_XFF, plain(3, None), nginx_pids.clone()),
        Run::new(NGINX, plain(2, None), nginx_pids.clone()),
        Run::new(BAZAAR, plain(1, Some(TLS_HOST)), vec![agent_pid]),
        Run::new(HAPROXY, plain(4, None), vec![haproxy.id()]),
        Run::new(NGINX_TLS, https(5, false), nginx_pids.clone()),
    ];
    if bazaar_tls_port.is_some() {
        runs.push(Run::new(BAZAAR_TLS, https(7, false), vec![agent_pid]));
        runs.push(Run::new(BAZAAR_NEW, https(7, true), vec![agent_pid]));
    }
    runs.push(Run::new(NGINX_NEW, https(6, true), nginx_pids.clone()));
    // Warm-up, then `rounds` interleaved runs of each (the machine may be shared:
    // interleaving spreads any noise evenly, and a pair run back to back sees the same).
    for run in &runs {
        wrk(run.load, 2, conns);
    }
    let mut load_per_round = Vec::new();
    for round in 0..rounds {
        load_per_round.push(loadavg());
        // Every other round in reverse order: a row and the one it is compared with are
        // run back to back, first one before, then the other.
        let mut order: Vec<usize> = (0..runs.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for &i in &order {
            let run = &mut runs[i];
            let before = cpu_seconds(&run.pids);
            let r = wrk(run.load, secs, conns);
            let used = cpu_seconds(&run.pids) - before;
            run.cpu_per_request.push(used * 1e6 / (r.rps * secs as f64));
            eprintln!(
                "round {round} (load {:.2}): {}: {:.0} req/s, p50 {}, p99 {}, cpu {used:.2} s, socket errors: {}",
                load_per_round[round],
                run.name,
                r.rps,
                r.p50,
                r.p99,
                r.errors.as_deref().unwrap_or("none")
            );
            run.results.push(r);
        }
    }
    // SIGTERM to nginx's master takes its workers down too (SIGKILL would orphan them).
    for child in [&mut nginx, &mut haproxy] {
        // SAFETY: kill(2) with plain integers.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        let _ = child.wait();
    }
    let report = Report {
        runs,
        load_per_round,
        secs,
        conns,
    };
    report.print(bazaar_tls_port.is_some());

    // Wake-from-stopped: stop, then time the first request through the proxy.
    let mut lat = Vec::new();
    rt.block_on(async {
        let fresh = || {
            reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .unwrap()
        };
        for _ in 0..wakes {
            api(
                reqwest::Method::POST,
                format!("/apps/wake/machines/{wake_id}/stop"),
                Some(json!({})),
            )
            .await;
            api(
                reqwest::Method::GET,
                format!("/apps/wake/machines/{wake_id}/wait?state=stopped&timeout=30"),
                None,
            )
            .await;
            // Let the proxy's table see the stop.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let c = fresh();
            let t0 = Instant::now();
            let r = c
                .get(format!("http://{proxy}/"))
                .header("host", "wake.localhost")
                .send()
                .await
                .unwrap();
            let status = r.status();
            let _ = r.bytes().await;
            lat.push(t0.elapsed());
            assert!(status.is_success(), "wake request: {status}");
        }
    });
    lat.sort();
    let pct = |p: f64| lat[(((lat.len() as f64) - 1.0) * p).round() as usize];

    println!(
        "\n| wake from stopped ({wakes} wake-ups) | p50 | p99 |\n|---|---:|---:|\n| first request through the proxy | {:.1} ms | {:.1} ms |",
        pct(0.5).as_secs_f64() * 1e3,
        pct(0.99).as_secs_f64() * 1e3
    );
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// nginx's ports: like for like (bazaar's header work), X-Forwarded-For only, and HTTPS
/// with bazaar's header work, kept alive and closed after each answer.
struct NginxPorts {
    like: u16,
    plain: u16,
    tls: u16,
    tls_close: u16,
}

/// nginx as a reverse proxy to `upstream` (upstream keepalive): on `ports.like` it does to
/// each request what bazaar's proxy does (X-Forwarded-For, X-Forwarded-Proto and a request
/// id, sent to the machine and returned to the client), on `ports.plain` only
/// X-Forwarded-For, and on the TLS ports the first over HTTPS ([`Tls::nginx_servers`]).
fn start_nginx(
    dir: &std::path::Path,
    ports: &NginxPorts,
    tls: &Tls,
    upstream: &str,
) -> std::process::Child {
    let conf = format!(
        r#"worker_processes 2;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    upstream backend {{
        server {upstream};
        keepalive 128;
    }}
    server {{
        listen 127.0.0.1:{like};
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto $scheme;
            proxy_set_header X-Request-Id $request_id;
            add_header X-Request-Id $request_id always;
        }}
    }}
    server {{
        listen 127.0.0.1:{plain};
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        }}
    }}
{tls_servers}
}}
"#,
        dir = dir.display(),
        like = ports.like,
        plain = ports.plain,
        tls_servers = tls.nginx_servers(ports.tls, ports.tls_close),
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf).unwrap();
    Command::new(sbin("nginx"))
        .arg("-c")
        .arg(&path)
        .arg("-p")
        .arg(dir)
        .spawn()
        .expect("nginx starts")
}

/// Waits until an HTTPS listener on `port` answers wrk for [`TLS_HOST`].
fn wait_tls_ok(tls: &Tls, port: u16) {
    let url = format!("https://{TLS_HOST}:{port}/");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ok = std::panic::catch_unwind(|| {
            wrk(
                Load {
                    url: &url,
                    host: None,
                    close: false,
                    tls: Some(tls),
                },
                1,
                2,
            )
        });
        if ok.is_ok() {
            return;
        }
        assert!(Instant::now() < deadline, "{url} never answered");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn wait_ok(rt: &tokio::runtime::Runtime, url: &str, host: Option<&str>) {
    rt.block_on(async {
        let c = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut r = c.get(url);
            if let Some(h) = host {
                r = r.header("host", h);
            }
            if let Ok(resp) = r.send().await {
                if resp.status().is_success() {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "{url} never answered");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}

/// CPU time (user + system) used so far by the processes `pids`, in seconds.
fn cpu_seconds(pids: &[u32]) -> f64 {
    // SAFETY: sysconf with a valid name.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .map(|stat| {
            // Fields after the command (which may hold spaces): utime and stime are 14, 15.
            let rest = &stat[stat.rfind(')').map_or(0, |i| i + 2)..];
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let field = |i: usize| fields.get(i - 3).and_then(|v| v.parse::<f64>().ok());
            field(14).unwrap_or(0.0) + field(15).unwrap_or(0.0)
        })
        .sum::<f64>()
        / ticks
}

/// The child processes of `pid` (nginx's workers).
fn children(pid: u32) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let list =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        let pids: Vec<u32> = list
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        if !pids.is_empty() || Instant::now() > deadline {
            return pids;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The backend executable copied where an isolated machine sees it (below the host's
/// `/usr`, which its root shares read-only), removed when dropped.
struct BackendCopy {
    dir: std::path::PathBuf,
    exe: std::path::PathBuf,
}

impl BackendCopy {
    fn new() -> BackendCopy {
        let dir = std::path::PathBuf::from(format!(
            "/usr/local/lib/bazaar-bench-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("backend");
        std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
        BackendCopy { dir, exe }
    }
}

impl Drop for BackendCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The backend machine: answers `hello, world\n` on `$PORT`.
fn backend() {
    use hyper::server::conn::http1;
    let port: u16 = std::env::var("PORT").unwrap().parse().unwrap();
    if let Some(cpu) = std::env::var("BAZAAR_BENCH_BACKEND_CPU")
        .ok()
        .and_then(|c| c.parse().ok())
    {
        pin(std::process::id(), cpu);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        // An isolated machine listens on its private address, one on the host on loopback.
        let ip = std::env::var("BAZAAR_PRIVATE_IP").unwrap_or_else(|_| "127.0.0.1".into());
        let listener = tokio::net::TcpListener::bind((ip.as_str(), port))
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

const DIRECT: &str = "direct to the backend";
const BAZAAR: &str = "through bazaar's proxy";
const NGINX: &str = "through nginx (keepalive upstream, bazaar's headers)";
const NGINX_XFF: &str = "through nginx (keepalive upstream, X-Forwarded-For only)";
const HAPROXY: &str = "through HAProxy (http-reuse always, bazaar's headers)";
const NGINX_TLS: &str = "HTTPS keep-alive through nginx";
const BAZAAR_TLS: &str = "HTTPS keep-alive through bazaar's proxy";
const NGINX_NEW: &str =
    "HTTPS, a new TLS connection per request (requests/s = handshakes/s), nginx";
const BAZAAR_NEW: &str =
    "HTTPS, a new TLS connection per request (requests/s = handshakes/s), bazaar's proxy";

/// One row of the bench: what wrk asks for, and what each round measured.
struct Run<'a> {
    name: &'static str,
    load: Load<'a>,
    /// The proxy's processes (its CPU time per request is reported).
    pids: Vec<u32>,
    results: Vec<WrkResult>,
    cpu_per_request: Vec<f64>,
}

impl<'a> Run<'a> {
    fn new(name: &'static str, load: Load<'a>, pids: Vec<u32>) -> Run<'a> {
        Run {
            name,
            load,
            pids,
            results: Vec::new(),
            cpu_per_request: Vec::new(),
        }
    }
}

struct Report<'a> {
    runs: Vec<Run<'a>>,
    load_per_round: Vec<f64>,
    secs: u64,
    conns: u64,
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

impl Report<'_> {
    fn run(&self, name: &str) -> Option<&Run<'_>> {
        self.runs.iter().find(|r| r.name == name)
    }

    /// The median run (by throughput) of a row.
    fn median_result(&self, name: &str) -> Option<&WrkResult> {
        let run = self.run(name)?;
        let mut by_rps: Vec<&WrkResult> = run.results.iter().collect();
        by_rps.sort_by(|a, b| a.rps.total_cmp(&b.rps));
        by_rps.get(by_rps.len() / 2).copied()
    }

    /// Round by round, `a` against `b`: throughput ratios, and in how many rounds `a`'s
    /// p99 was at or below `b`'s, and the median ratio of the p99s.
    fn pairs(&self, a: &str, b: &str) -> Option<(Vec<f64>, usize, f64)> {
        let (a, b) = (self.run(a)?, self.run(b)?);
        let ratios = a
            .results
            .iter()
            .zip(&b.results)
            .map(|(x, y)| x.rps / y.rps)
            .collect();
        let p99 = a
            .results
            .iter()
            .zip(&b.results)
            .filter(|(x, y)| millis(&x.p99) <= millis(&y.p99))
            .count();
        let p99_ratios: Vec<f64> = a
            .results
            .iter()
            .zip(&b.results)
            .map(|(x, y)| millis(&x.p99) / millis(&y.p99))
            .collect();
        Some((ratios, p99, median(&p99_ratios)))
    }

    fn print(&self, bazaar_tls: bool) {
        let rounds = self.load_per_round.len();
        let (secs, conns) = (self.secs, self.conns);
        println!(
            "\nwrk -t2 -c{conns} -d{secs}s, GET of 13 bytes; median run of {rounds} interleaved rounds; load average (1 min) before the rounds: {}",
            self.load_per_round
                .iter()
                .map(|l| format!("{l:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        println!("\n| path | requests/s | p50 | p99 | proxy CPU per request |\n|---|---:|---:|---:|---:|");
        for run in &self.runs {
            let r = self.median_result(run.name).expect("row measured");
            let cpu = if run.pids.is_empty() {
                "".to_string()
            } else {
                format!("{:.1} µs", median(&run.cpu_per_request))
            };
            println!(
                "| {} | {:.0} | {} | {} | {cpu} |",
                run.name, r.rps, r.p50, r.p99
            );
        }
        if !bazaar_tls {
            println!("| {BAZAAR_TLS} | no TLS listener in this build | | | |");
            println!("| {BAZAAR_NEW} | no TLS listener in this build | | | |");
        }
        let mut compared = vec![
            ("nginx (bazaar's headers)", BAZAAR, NGINX),
            ("HAProxy (bazaar's headers)", BAZAAR, HAPROXY),
            ("nginx (X-Forwarded-For only)", BAZAAR, NGINX_XFF),
        ];
        if bazaar_tls {
            compared.push(("nginx, HTTPS keep-alive", BAZAAR_TLS, NGINX_TLS));
            compared.push(("nginx, new TLS connections", BAZAAR_NEW, NGINX_NEW));
        }
        println!("\n| bazaar against | median runs | round by round: median (range) | bazaar's p99 at or below | p99 ratio, median | CPU per request |\n|---|---:|---|---:|---:|---:|");
        for (label, a, b) in &compared {
            let (ra, rb) = (
                self.median_result(a).unwrap(),
                self.median_result(b).unwrap(),
            );
            let (mut ratios, p99, p99_ratio) = self.pairs(a, b).unwrap();
            ratios.sort_by(f64::total_cmp);
            let cpu = median(&self.run(a).unwrap().cpu_per_request)
                / median(&self.run(b).unwrap().cpu_per_request);
            println!(
                "| {label} | {:.2}× | {:.2}× ({:.2}-{:.2}) | {p99} of {rounds} rounds | {p99_ratio:.2}× | {cpu:.2}× |",
                ra.rps / rb.rps,
                median(&ratios),
                ratios[0],
                ratios[ratios.len() - 1],
            );
        }
        // Round by round: each comparison's throughput ratio, and both p99s.
        let mut header = "| round | load |".to_string();
        let mut rule = "|---:|---:|".to_string();
        for (label, _, _) in &compared {
            header += &format!(" bazaar / {label} | p99 bazaar, other |");
            rule += "---:|---|";
        }
        println!("\n{header}\n{rule}");
        for k in 0..rounds {
            let mut line = format!("| {k} | {:.2} |", self.load_per_round[k]);
            for (_, a, b) in &compared {
                let (a, b) = (
                    &self.run(a).unwrap().results[k],
                    &self.run(b).unwrap().results[k],
                );
                line += &format!(" {:.3}× | {}, {} |", a.rps / b.rps, a.p99, b.p99);
            }
            println!("{line}");
        }
    }
}
