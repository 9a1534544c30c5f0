//! Edge proxy benchmark (issue 5), in one run on one local agent: wrk against a backend
//! machine directly, through bazaar's proxy, and through nginx configured as a reverse
//! proxy with upstream keepalive to the same backend (requests/s, p50/p99); then the
//! wake-from-stopped latency (stop the machine, time the first request through the proxy;
//! the backend binds in well under 5 ms).
//!
//! nginx runs in two configurations. The one bazaar is compared with does the same work
//! to each request as bazaar's proxy: X-Forwarded-For, X-Forwarded-Proto and a request id
//! sent to the machine, the request id returned to the client. The other sets only
//! X-Forwarded-For, and its numbers are shown beside.
//!
//! Run: `cargo bench -p bazaar --bench proxy` (installs Debian's wrk and nginx with apt-get
//! when missing; prints Markdown tables for BENCHMARKS.md). `BAZAAR_BENCH_SECS` (default
//! 5) sets each wrk run's length, `BAZAAR_BENCH_CONNS` (default 64) its connections,
//! `BAZAAR_BENCH_WAKES` (default 40) the number of wake-ups, `BAZAAR_BENCH_ROUNDS`
//! (default 8) the interleaved rounds. Reported: the median run of each path, and, round
//! by round, bazaar against nginx (the throughput ratio, and whose p99 is lower) with the
//! median of those ratios: the machine may be shared, and a pair run back to back sees the
//! same conditions.
//!
//! The backend is this benchmark's own executable started as a machine with
//! `BAZAAR_BENCH_BACKEND=1`: a hyper HTTP/1.1 server answering 13 bytes on `$PORT`.

use bazaar_testkit::{start_cluster, TEST_SECRET};
use serde_json::{json, Value};
use std::process::Command;
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_bazaar");

fn main() {
    if std::env::var_os("BAZAAR_BENCH_BACKEND").is_some() {
        backend();
        return;
    }
    let secs: u64 = env_or("BAZAAR_BENCH_SECS", 5);
    let conns: u64 = env_or("BAZAAR_BENCH_CONNS", 64);
    let wakes: usize = env_or("BAZAAR_BENCH_WAKES", 40);
    let rounds: usize = env_or("BAZAAR_BENCH_ROUNDS", 8);
    ensure_tools();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let agents = start_cluster(std::path::Path::new(EXE), 1, |_, o| {
        o.isolate = false;
        o.extra_args
            .extend(["--autostop-idle-ms".into(), "3600000".into()]);
    })
    .expect("agent");
    let agent = &agents[0];
    let base = agent.url();
    let proxy = agent.proxy_addr();
    let http = reqwest::Client::new();
    let me = std::env::current_exe().unwrap().display().to_string();
    let api = |m: reqwest::Method, path: String, body: Option<Value>| {
        let mut r = http
            .request(m, format!("{base}/v1{path}"))
            .bearer_auth(TEST_SECRET);
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
    let machine = |autostart: bool| {
        json!({"config": {
            "image": "process", "driver": "process",
            "init": {"exec": [me.clone()]},
            "env": {"BAZAAR_BENCH_BACKEND": "1"},
            "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256},
            "restart": {"policy": "no"},
            "services": [{"internal_port": 8080, "protocol": "tcp", "autostart": autostart,
                "concurrency": {"type": "requests", "soft_limit": 10000}}],
        }})
    };
    let (backend_port, wake_id) = rt.block_on(async {
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
        let port = m["host_ports"]["8080"].as_u64().expect("host port") as u16;
        let w = api(
            reqwest::Method::POST,
            "/apps/wake/machines".into(),
            Some(machine(true)),
        )
        .await;
        (port, w["id"].as_str().unwrap().to_string())
    });
    let direct = format!("127.0.0.1:{backend_port}");
    wait_ok(&rt, &format!("http://{direct}/"), None);
    wait_ok(&rt, &format!("http://{proxy}/"), Some("bench.localhost"));
    let nginx_dir = tempfile::tempdir().unwrap();
    let (nginx_port, nginx_plain_port) = (free_port(), free_port());
    let mut nginx = start_nginx(nginx_dir.path(), nginx_port, nginx_plain_port, &direct);
    wait_ok(&rt, &format!("http://127.0.0.1:{nginx_port}/"), None);
    wait_ok(&rt, &format!("http://127.0.0.1:{nginx_plain_port}/"), None);

    let runs = [
        ("direct to the backend", format!("http://{direct}/"), None),
        (
            "through bazaar's proxy",
            format!("http://{proxy}/"),
            Some("bench.localhost"),
        ),
        (
            "through nginx (keepalive upstream, bazaar's headers)",
            format!("http://127.0.0.1:{nginx_port}/"),
            None,
        ),
        (
            "through nginx (keepalive upstream, X-Forwarded-For only)",
            format!("http://127.0.0.1:{nginx_plain_port}/"),
            None,
        ),
    ];
    // Warm-up, then `rounds` interleaved runs of each; the median run of each path is
    // reported (the machine may be shared, so interleaving spreads any noise evenly).
    for (_, url, host) in &runs {
        wrk(url, *host, 2, conns);
    }
    let mut all: Vec<Vec<WrkResult>> = runs.iter().map(|_| Vec::new()).collect();
    // CPU time each proxy used per request: the agent's process (its proxy threads; the
    // rest of it idles) and nginx's workers.
    let mut cpu_per_request: [Vec<f64>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    let agent_pid = agents[0].pid().expect("agent running");
    let nginx_pids = children(nginx.id());
    for round in 0..rounds {
        for (k, (name, url, host)) in runs.iter().enumerate() {
            let pids = match k {
                1 => vec![agent_pid],
                2 | 3 => nginx_pids.clone(),
                _ => Vec::new(),
            };
            let before = cpu_seconds(&pids);
            let r = wrk(url, *host, secs, conns);
            let used = cpu_seconds(&pids) - before;
            if k > 0 {
                cpu_per_request[k - 1].push(used * 1e6 / (r.rps * secs as f64));
            }
            eprintln!("round {round}: {name}: {r:?}, cpu {used:.2} s");
            all[k].push(r);
        }
    }
    // Round by round: bazaar (run 1) against nginx doing the same (run 2), and against the
    // plainer nginx (run 3).
    let pairs: Vec<(f64, f64, f64, f64)> = (0..rounds)
        .map(|i| {
            let (b, n, plain) = (&all[1][i], &all[2][i], &all[3][i]);
            (
                b.rps / n.rps,
                millis(&b.p99),
                millis(&n.p99),
                b.rps / plain.rps,
            )
        })
        .collect();
    let mut rows = Vec::new();
    for ((name, _, _), mut rs) in runs.iter().zip(all) {
        rs.sort_by(|a, b| a.rps.total_cmp(&b.rps));
        rows.push((name, rs.swap_remove(rs.len() / 2)));
    }
    // SIGTERM to the master takes its workers down too (SIGKILL would orphan them).
    // SAFETY: kill(2) with plain integers.
    unsafe {
        libc::kill(nginx.id() as i32, libc::SIGTERM);
    }
    let _ = nginx.wait();

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

    println!("\n| path | requests/s | p50 | p99 |\n|---|---:|---:|---:|");
    for (name, r) in &rows {
        println!("| {name} | {:.0} | {} | {} |", r.rps, r.p50, r.p99);
    }
    let (b, n, plain) = (&rows[1].1, &rows[2].1, &rows[3].1);
    println!(
        "\nbazaar / nginx throughput: {:.2}× (against nginx with X-Forwarded-For only: {:.2}×); wrk: {secs} s, {conns} connections, 2 threads, GET of 13 bytes; median of {rounds} interleaved runs",
        b.rps / n.rps,
        b.rps / plain.rps
    );
    println!("\n| round | bazaar / nginx req/s | p99 bazaar | p99 nginx | bazaar / nginx (XFF only) |\n|---:|---:|---:|---:|---:|");
    for (k, (ratio, pb, pn, plain)) in pairs.iter().enumerate() {
        println!("| {k} | {ratio:.3}× | {pb:.2} ms | {pn:.2} ms | {plain:.3}× |");
    }
    let mut ratios: Vec<f64> = pairs.iter().map(|p| p.0).collect();
    ratios.sort_by(f64::total_cmp);
    let p99_not_worse = pairs.iter().filter(|p| p.1 <= p.2).count();
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (cpu_b, cpu_n, cpu_plain) = (
        median(&mut cpu_per_request[0]),
        median(&mut cpu_per_request[1]),
        median(&mut cpu_per_request[2]),
    );
    println!(
        "\nCPU time per request (median round): bazaar's proxy {cpu_b:.1} µs, nginx {cpu_n:.1} µs ({:.2}×), nginx with X-Forwarded-For only {cpu_plain:.1} µs ({:.2}×)",
        cpu_b / cpu_n,
        cpu_b / cpu_plain
    );
    let mut plain_ratios: Vec<f64> = pairs.iter().map(|p| p.3).collect();
    println!(
        "\nround by round: median throughput ratio {:.3}× (from {:.3}× to {:.3}×; against nginx with X-Forwarded-For only {:.3}×); bazaar's p99 at or below nginx's in {p99_not_worse} of {rounds} rounds",
        ratios[ratios.len() / 2],
        ratios[0],
        ratios[ratios.len() - 1],
        median(&mut plain_ratios),
    );
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

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Installs Debian's wrk and nginx when missing.
fn ensure_tools() {
    let missing: Vec<&str> = [("wrk", "wrk"), ("nginx", "nginx")]
        .into_iter()
        .filter(|(bin, _)| {
            !Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "command -v {bin} >/dev/null || test -x /usr/sbin/{bin}"
                ))
                .status()
                .is_ok_and(|s| s.success())
        })
        .map(|(_, pkg)| pkg)
        .collect();
    if missing.is_empty() {
        return;
    }
    eprintln!("installing {missing:?} with apt-get");
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq {}",
            missing.join(" ")
        ))
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "could not install {missing:?}");
}

/// nginx as a reverse proxy to `upstream` on two ports: on `port` it does to each request
/// what bazaar's proxy does (X-Forwarded-For, X-Forwarded-Proto and a request id, sent to
/// the machine and returned to the client), on `plain_port` only X-Forwarded-For.
fn start_nginx(
    dir: &std::path::Path,
    port: u16,
    plain_port: u16,
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
        listen 127.0.0.1:{port};
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
        listen 127.0.0.1:{plain_port};
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        }}
    }}
}}
"#,
        dir = dir.display()
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf).unwrap();
    let bin = if std::path::Path::new("/usr/sbin/nginx").exists() {
        "/usr/sbin/nginx"
    } else {
        "nginx"
    };
    Command::new(bin)
        .arg("-c")
        .arg(&path)
        .arg("-p")
        .arg(dir)
        .spawn()
        .expect("nginx starts")
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

#[derive(Debug)]
struct WrkResult {
    rps: f64,
    p50: String,
    p99: String,
}

fn wrk(url: &str, host: Option<&str>, secs: u64, conns: u64) -> WrkResult {
    let mut cmd = Command::new("wrk");
    cmd.args([
        "-t2",
        &format!("-c{conns}"),
        &format!("-d{secs}s"),
        "--latency",
    ]);
    if let Some(h) = host {
        cmd.args(["-H", &format!("Host: {h}")]);
    }
    let out = cmd.arg(url).output().expect("wrk runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let field = |prefix: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(prefix))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or("?")
            .to_string()
    };
    let rps = field("Requests/sec:").parse().unwrap_or(0.0);
    let non2xx = text.contains("Non-2xx");
    assert!(!non2xx && rps > 0.0, "wrk {url}:\n{text}");
    WrkResult {
        rps,
        p50: field("50%"),
        p99: field("99%"),
    }
}

/// The backend machine: answers `hello, world\n` on `$PORT`.
fn backend() {
    use hyper::server::conn::http1;
    let port: u16 = std::env::var("PORT").unwrap().parse().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
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
