//! How many idle isolated machines one host holds (issue 36, target 5): one root agent,
//! process machines running `sleep` (each in its own user and network namespace, with a
//! veth, a private root, seccomp and a loop-mounted work disk), created through the
//! Machines API 32 at a time up to each step of `BAZAAR_BENCH_DENSITY` (default `1000`;
//! e.g. `1000,3000,5000`). At each step: the create rate on the way there (create→started,
//! 32 in flight), the agent's RSS and its CPU while idle over 10 s, memory per machine (the
//! machines' own processes, proportional set size; the kernel's slab, stacks and page
//! tables; and the host's `MemAvailable`, all three against before the agent started), and
//! the re-adoption after `kill -9` of the agent: from the restart until its API answers
//! (it serves only once every live workload is adopted again) and until its host interface
//! lists every machine started. A second agent, in another region, takes no machine: it
//! holds the app's catalog row while the first is down.
//!
//! Run as root: `cargo bench -p bazaar --bench density` (prints Markdown tables for
//! docs/benchmarks/density.md). The host limits that bound the count are printed first.
//! Everything is removed at the end (the test kit releases the host).

use bazaar_testkit::{api_token, start_plain_cluster, TEST_SECRET};
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_bazaar");
const IN_FLIGHT: usize = 32;
/// The hard limit on open files the agent inherits (it lifts its soft limit to it): each
/// machine holds pidfds in the agent.
fn open_files_hard_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    limit.rlim_max
}

fn steps() -> Vec<usize> {
    let spec = std::env::var("BAZAAR_BENCH_DENSITY").unwrap_or_else(|_| "1000".into());
    let mut steps: Vec<usize> = spec
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .expect("BAZAAR_BENCH_DENSITY: counts, comma separated")
        })
        .collect();
    steps.sort_unstable();
    steps
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// `/proc/meminfo` in KiB by field.
fn meminfo() -> HashMap<String, u64> {
    read("/proc/meminfo")
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            Some((k.to_string(), v.split_whitespace().next()?.parse().ok()?))
        })
        .collect()
}

/// The kernel's own memory that machines add to (KiB): slab, kernel stacks, page tables.
fn kernel_kib(m: &HashMap<String, u64>) -> u64 {
    ["Slab", "KernelStack", "PageTables"]
        .iter()
        .map(|k| m.get(*k).copied().unwrap_or(0))
        .sum()
}

/// `(ppid, utime + stime in ticks)` of `pid`.
fn stat(pid: i32) -> Option<(i32, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may hold spaces and parentheses: fields follow the last ')'.
    let rest: Vec<&str> = s[s.rfind(')')? + 2..].split_whitespace().collect();
    let ppid = rest.get(1)?.parse().ok()?;
    let ticks = rest.get(11)?.parse::<u64>().ok()? + rest.get(12)?.parse::<u64>().ok()?;
    Some((ppid, ticks))
}

fn all_pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// The host's machine processes: its shims and everything below them.
fn machine_processes(data_dir: &Path, agent: Option<u32>) -> Vec<i32> {
    let shims: Vec<i32> = bazaar_agent::cleanup::processes_of_host(data_dir)
        .into_iter()
        .filter(|p| Some(*p as u32) != agent)
        .collect();
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for pid in all_pids() {
        if let Some((ppid, _)) = stat(pid) {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut seen: HashSet<i32> = HashSet::new();
    let mut todo = shims;
    while let Some(pid) = todo.pop() {
        if seen.insert(pid) {
            todo.extend(children.get(&pid).into_iter().flatten());
        }
    }
    seen.into_iter().collect()
}

/// A field of `/proc/<pid>/smaps_rollup` or `status`, in KiB.
fn kib(pid: i32, file: &str, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/{file}"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

fn ticks_per_s() -> f64 {
    // SAFETY: sysconf takes a constant and touches no memory of ours.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

async fn call(http: &reqwest::Client, req: reqwest::RequestBuilder) -> (u16, Value) {
    let _ = http;
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
        // A debug build on a loaded host: the token check may run out of time.
        if status == reqwest::StatusCode::UNAUTHORIZED && body.contains("execution limits") {
            continue;
        }
        return (
            status.as_u16(),
            serde_json::from_str(&body).unwrap_or(Value::String(body)),
        );
    }
    panic!("the token check ran out of time 10 times");
}

/// Creates `n` machines, `IN_FLIGHT` at a time, each waited for until started. Answers
/// machines/s and the create→started times (ms, sorted), or the first error.
async fn create(http: &reqwest::Client, base: &str, n: usize) -> Result<(f64, Vec<f64>), String> {
    let body = json!({"config": {"image": "process", "driver": "process",
        "init": {"exec": ["sleep", "100000"]},
        "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256}}, "region": "local"});
    let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (http, sem, body, base) =
                (http.clone(), sem.clone(), body.clone(), base.to_string());
            tokio::spawn(async move {
                let _p = sem.acquire().await.unwrap();
                let t = Instant::now();
                let (status, m) = call(
                    &http,
                    http.post(format!("{base}/v1/apps/bench/machines"))
                        .json(&body),
                )
                .await;
                let Some(id) = m["id"].as_str().filter(|_| status < 300) else {
                    return Err(format!("create: {status} {m}"));
                };
                let url =
                    format!("{base}/v1/apps/bench/machines/{id}/wait?state=started&timeout=60");
                let (status, w) = call(&http, http.get(url)).await;
                if status >= 300 {
                    return Err(format!("{id} did not start: {status} {w}"));
                }
                Ok(t.elapsed().as_secs_f64() * 1e3)
            })
        })
        .collect();
    let mut lat = Vec::new();
    let mut first_error = None;
    for t in tasks {
        match t.await.unwrap() {
            Ok(ms) => lat.push(ms),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    let rate = lat.len() as f64 / t0.elapsed().as_secs_f64();
    if let Some(e) = first_error {
        return Err(format!("{} of {n} started; first error: {e}", lat.len()));
    }
    lat.sort_by(f64::total_cmp);
    Ok((rate, lat))
}

/// How many machines the agent itself has started (its host interface, not the catalog).
async fn started(http: &reqwest::Client, base: &str) -> usize {
    let Ok(r) = http
        .get(format!("{base}/host/v1/machines?app=bench"))
        .bearer_auth(TEST_SECRET)
        .send()
        .await
    else {
        return 0;
    };
    let list: Value = r.json().await.unwrap_or_default();
    list.as_array()
        .map_or(0, |l| l.iter().filter(|m| m["state"] == "started").count())
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted
        .get(((sorted.len() as f64 - 1.0) * p).round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
}

fn limits() {
    println!("Host limits that bound the count:\n");
    for (name, value) in [
        ("kernel.pid_max", read("/proc/sys/kernel/pid_max")),
        ("kernel.threads-max", read("/proc/sys/kernel/threads-max")),
        (
            "user.max_user_namespaces",
            read("/proc/sys/user/max_user_namespaces"),
        ),
        (
            "user.max_net_namespaces",
            read("/proc/sys/user/max_net_namespaces"),
        ),
        ("fs.nr_open", read("/proc/sys/fs/nr_open")),
        (
            "fs.inotify.max_user_instances",
            read("/proc/sys/fs/inotify/max_user_instances"),
        ),
        (
            "loop devices now",
            std::fs::read_dir("/dev")
                .map_or(0, |d| {
                    d.flatten()
                        .filter(|e| e.file_name().to_string_lossy().starts_with("loop"))
                        .count()
                })
                .to_string(),
        ),
        (
            "open files (the agent's hard limit)",
            open_files_hard_limit().to_string(),
        ),
        (
            "cores",
            std::thread::available_parallelism()
                .map_or(0, |n| n.get())
                .to_string(),
        ),
        (
            "memory",
            format!(
                "{} MiB",
                meminfo().get("MemTotal").copied().unwrap_or(0) / 1024
            ),
        ),
    ] {
        println!("- {name}: {value}");
    }
    println!();
}

fn main() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "isolation needs root");
    let steps = steps();
    let most = *steps.last().expect("at least one step");
    limits();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let before = meminfo();
    // A second agent in another region holds the catalog's app row while the first is
    // killed (a lone host's app rows live only in its catalog) and takes no machine.
    let mut agents = start_plain_cluster(Path::new(EXE), 2, |i, o| {
        o.memory_mb = (most as u64 + 10) * 256;
        o.cpus = most as u32 + 10;
        if i == 1 {
            o.region = "peer".into();
        }
    })
    .expect("agents");
    let mut agent = agents.remove(0);
    let http = reqwest::Client::new();
    let base = agent.url();
    rt.block_on(async {
        call(
            &http,
            http.post(format!("{base}/v1/apps"))
                .json(&json!({"app_name": "bench"})),
        )
        .await;
    });
    println!("| machines | creates/s (32 in flight) | create→started p50 | p99 | agent RSS | agent CPU idle (10 s) | machine processes (PSS) per machine | kernel (slab, stacks, page tables) per machine | MemAvailable drop per machine | re-adoption: API answers | all started again |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut have = 0;
    for step in steps {
        let ramp = rt.block_on(create(&http, &base, step - have));
        let (rate, lat) = match ramp {
            Ok(r) => r,
            Err(e) => {
                println!(
                    "\nstopped on the way to {step}: {e}\n\nagent log:\n{}",
                    agent.log_tail()
                );
                break;
            }
        };
        have = step;
        // Idle: let the last starts' background work (namespaces made ahead, disk syncs)
        // settle, then measure.
        std::thread::sleep(Duration::from_secs(5));
        let pid = agent.pid().expect("agent runs") as i32;
        let rss_mib = kib(pid, "status", "VmRSS") as f64 / 1024.0;
        let cpu0 = stat(pid).map_or(0, |s| s.1);
        std::thread::sleep(Duration::from_secs(10));
        let cpu = (stat(pid).map_or(0, |s| s.1) - cpu0) as f64 / ticks_per_s() / 10.0 * 100.0;
        let procs = machine_processes(&agent.data_dir, Some(pid as u32));
        let pss: u64 = procs.iter().map(|p| kib(*p, "smaps_rollup", "Pss:")).sum();
        let now = meminfo();
        let kernel = kernel_kib(&now).saturating_sub(kernel_kib(&before));
        let avail = before["MemAvailable"].saturating_sub(now["MemAvailable"]);
        let per = |k: u64| format!("{:.0} KiB", k as f64 / step as f64);
        // Re-adoption after kill -9.
        agent.kill9();
        let t0 = Instant::now();
        agent.spawn(&[]).expect("agent restarts");
        let answers = t0.elapsed().as_secs_f64();
        let all = rt.block_on(async {
            let deadline = Instant::now() + Duration::from_secs(300);
            loop {
                let n = started(&http, &agent.url()).await;
                if n >= step || Instant::now() > deadline {
                    return n;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        assert_eq!(all, step, "machines started after the restart");
        let listed = t0.elapsed().as_secs_f64();
        // The restarted host knows its app again once its catalog has synced with the peer.
        rt.block_on(async {
            while call(&http, http.get(format!("{base}/v1/apps/bench")))
                .await
                .0
                != 200
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        println!(
            "| {step} | {rate:.1} | {:.0} ms | {:.0} ms | {rss_mib:.0} MiB | {cpu:.1} % of a core | {} ({} processes) | {} | {} | {answers:.2} s | {listed:.2} s |",
            pct(&lat, 0.5),
            pct(&lat, 0.99),
            per(pss),
            procs.len(),
            per(kernel),
            per(avail),
        );
    }
    let t0 = Instant::now();
    drop(agent);
    drop(agents);
    println!(
        "\nReleased the host (machines, mounts, namespaces, cgroups) in {:.1} s.",
        t0.elapsed().as_secs_f64()
    );
}
