//! Agent benchmark (issue 2): create→started latency of a process machine through the host
//! interface (p50/p99) beside a bare fork+exec of `sleep` measured in the same run; machines
//! per second sustained over 1,000 machines; re-adoption time of 1,000 running machines after
//! a kill -9 of the agent; agent RSS with 1,000 machines; RSS of one shim; the host's CPU
//! time per machine while they are created (all processes and the kernel: run it on a
//! quiet machine).
//!
//! Run: `cargo bench -p bazaar --bench agent` (prints a Markdown table for
//! docs/benchmarks/agent.md).
//! `BAZAAR_BENCH_MACHINES` changes the machine count (default 1000);
//! `BAZAAR_BENCH_NO_ISOLATE=1` runs the workloads without namespaces and cgroups;
//! `BAZAAR_BENCH_EXE` runs another `bazaar` executable (to compare builds in one sitting).

use bazaar_testkit::{create_request, AgentOptions, TestAgent};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_bazaar");

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn rss_kib(pid: i32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// One `kB` field of `/proc/<pid>/status` (`VmRSS:`, `RssAnon:`, `RssFile:`).
fn status_kib(pid: i32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn shim_pids(data_dir: &std::path::Path) -> Vec<i32> {
    let needle = data_dir.display().to_string();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(" shim ") && cmd.contains(&needle) {
            out.push(pid);
        }
    }
    out
}

fn bare_spawn(n: usize) -> Vec<Duration> {
    let mut times = Vec::new();
    let mut children = Vec::new();
    for _ in 0..n {
        let t0 = Instant::now();
        let child = std::process::Command::new("sleep")
            .arg("1000")
            .spawn()
            .unwrap();
        times.push(t0.elapsed());
        children.push(child);
    }
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
    times.sort();
    times
}

fn main() {
    let total: usize = std::env::var("BAZAAR_BENCH_MACHINES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let latency_samples = 200.min(total);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // BAZAAR_BENCH_EXE=<path> measures another `bazaar` build (e.g. before a change).
    let exe = std::env::var_os("BAZAAR_BENCH_EXE").map_or_else(|| EXE.into(), PathBuf::from);
    let mut opts = AgentOptions::new(exe);
    // Every process machine of a root agent has an address: room for all of them.
    opts.extra_args
        .extend(["--machine-subnet".into(), "10.214.0.0/20".into()]);
    opts.memory_mb = (total as u64 + 10) * 256;
    opts.cpus = total as u32 + 10;
    // BAZAAR_BENCH_NO_ISOLATE=1 measures without namespaces and cgroups, to attribute cost.
    opts.isolate = std::env::var("BAZAAR_BENCH_NO_ISOLATE").is_err();
    if !opts.isolate {
        // A root agent runs unisolated machines only as root, when allowed.
        opts.extra_args.push("--allow-root-machines".into());
    }
    let mut agent = TestAgent::start(opts).expect("agent");
    let c = agent.client();

    let bare_before = bare_spawn(100);
    let (lat, rate, cpu_ms_per_machine) = rt.block_on(async {
        // Warm-up.
        for _ in 0..5 {
            let m = c
                .create(&create_request("warm", &["sleep", "1000"]))
                .await
                .unwrap();
            c.wait(&m.id, "started", 30).await.unwrap();
            c.destroy(&m.id, true).await.unwrap();
        }
        let mut lat = Vec::new();
        for _ in 0..latency_samples {
            let t0 = Instant::now();
            let m = c
                .create(&create_request("bench", &["sleep", "1000"]))
                .await
                .unwrap();
            c.wait(&m.id, "started", 30).await.unwrap();
            lat.push(t0.elapsed());
        }
        lat.sort();
        // Sustained: the rest, 32 at a time.
        let rest = total - latency_samples;
        let cpu_before = host_cpu_ticks();
        let t0 = Instant::now();
        let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(32));
        let mut tasks = Vec::new();
        for _ in 0..rest {
            let (c, sem) = (c.clone(), sem.clone());
            tasks.push(tokio::spawn(async move {
                let _permit = sem.acquire().await.unwrap();
                let m = c
                    .create(&create_request("bench", &["sleep", "1000"]))
                    .await
                    .unwrap();
                c.wait(&m.id, "started", 60).await.unwrap();
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let rate = rest as f64 / t0.elapsed().as_secs_f64();
        let cpu = host_cpu_ticks().saturating_sub(cpu_before);
        (lat, rate, cpu as f64 * 10.0 / rest.max(1) as f64)
    });
    let bare = bare_spawn(100);
    let mut bare_all: Vec<Duration> = bare_before.into_iter().chain(bare).collect();
    bare_all.sort();

    let agent_pid = agent.pid().unwrap() as i32;
    let agent_rss = rss_kib(agent_pid);
    // Anonymous (heap, stacks) apart from file-backed (the binary's pages it touched).
    let (agent_anon, agent_file) = (
        status_kib(agent_pid, "RssAnon:"),
        status_kib(agent_pid, "RssFile:"),
    );
    let shims = shim_pids(&agent.data_dir);
    let mut shim_rss: Vec<u64> = shims
        .iter()
        .map(|p| rss_kib(*p))
        .filter(|r| *r > 0)
        .collect();
    shim_rss.sort();
    let running = rt.block_on(async { c.machines(Some("bench"), false).await.unwrap().len() });

    // Re-adoption: kill -9, restart, time until it serves with every run re-adopted.
    agent.kill9();
    let t0 = Instant::now();
    agent.spawn(&[]).unwrap();
    let readopt = t0.elapsed();
    let check = rt.block_on(async {
        let ms = c.machines(Some("bench"), false).await.unwrap();
        ms.iter()
            .filter(|m| m.state == bazaar_types::state::MachineState::Started)
            .count()
    });
    let agent_rss_after = rss_kib(agent.pid().unwrap() as i32);

    let p50 = percentile(&lat, 0.5);
    let bare_p50 = percentile(&bare_all, 0.5);
    println!("## Agent (issue 2)\n");
    println!(
        "`cargo bench -p bazaar --bench agent` on {} ({} cores, {} MiB)\n",
        hostname(),
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        mem_mib()
    );
    println!("| measure | result | target |");
    println!("|---|---|---|");
    println!(
        "| create→started p50 (host interface, {latency_samples} sequential) | {} | ≤ 8 ms |",
        ms(p50)
    );
    println!(
        "| create→started p99 | {} | ≤ 30 ms |",
        ms(percentile(&lat, 0.99))
    );
    println!(
        "| bare fork+exec of `sleep` p50 (same run) | {} | — |",
        ms(bare_p50)
    );
    println!(
        "| ratio create→started p50 / bare spawn p50 | {:.1}× | — |",
        p50.as_secs_f64() / bare_p50.as_secs_f64()
    );
    println!(
        "| machines/s sustained ({} creates→started, 32 in flight) | {:.0} | ≥ 150 |",
        total - latency_samples,
        rate
    );
    println!(
        "| host CPU per machine in that phase (every process and the kernel) | {cpu_ms_per_machine:.1} ms | — |"
    );
    println!(
        "| re-adoption of {running} running machines (exec → serving) | {} | ≤ 1 s |",
        ms(readopt)
    );
    println!("| machines still started after re-adoption | {check} / {running} | all |");
    println!(
        "| agent RSS with {running} machines | {:.1} MiB (after restart: {:.1} MiB) | ≤ 64 MiB |",
        agent_rss as f64 / 1024.0,
        agent_rss_after as f64 / 1024.0
    );
    println!(
        "| of which anonymous / file-backed | {:.1} MiB / {:.1} MiB | |",
        agent_anon as f64 / 1024.0,
        agent_file as f64 / 1024.0
    );
    if !shim_rss.is_empty() {
        println!(
            "| shim RSS (median of {}) | {:.2} MiB (max {:.2} MiB) | ≤ 2 MiB |",
            shim_rss.len(),
            shim_rss[shim_rss.len() / 2] as f64 / 1024.0,
            *shim_rss.last().unwrap() as f64 / 1024.0
        );
    }
    drop(agent);
}

/// CPU time the whole host spent busy so far (user, nice, system, irq, softirq), in
/// clock ticks of 10 ms (`/proc/stat`'s first line).
fn host_cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq: all but idle and iowait.
    [0, 1, 2, 5, 6].iter().filter_map(|&i| fields.get(i)).sum()
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn mem_mib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0)
        / 1024
}
