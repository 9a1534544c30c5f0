//! The runtimes side by side (issue 33), as root, in one sitting on one agent: for
//! `process`, `runc` and `gvisor` machines, create→started through the host interface
//! (p50/p99, the image cached, each machine destroyed before the next; the runtimes take
//! turns round by round so that a change of load on the host falls on all of them), and the
//! memory a running machine costs the host: the proportional set size (PSS, shared pages
//! split between their users) of every process in its cgroup (its workload, and what runs
//! it: `runc run`, or runsc's sandbox, gofer and `runsc run`), averaged over `KEPT` machines
//! of each runtime running together.
//!
//! `microvm` machines join them when a guest kernel is there (`BAZAAR_VM_KERNEL`, as
//! `scripts/test` sets it; the guest init from `scripts/vminit` or `BAZAAR_VMINIT`), under
//! TCG on a host without hardware KVM, with fewer starts (`VM_PER_ROUND`, `VM_KEPT`): for
//! them "started" is QEMU running (its pid file), so the table also gives create→serving,
//! the first answer of the machine's httpd on its address, for every runtime.
//!
//! Run: `cargo bench -p bazaar --bench runtimes` (prints a Markdown table for
//! docs/benchmarks/runtimes.md; `BAZAAR_BENCH_RUNTIMES=microvm,runc` runs only those). `BAZAAR_BENCH_ROUNDS` (default 3) × `PER_ROUND` starts per
//! runtime.

use bazaar_testkit::images::{
    busybox_rootfs_layer, config_with, ensure_packages, push_with_config, TestRegistry,
};
use bazaar_testkit::{AgentOptions, TestAgent};
use bazaar_types::host::ClaimRequest;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_bazaar");
const PER_ROUND: usize = 10;
const KEPT: usize = 8;
const VM_PER_ROUND: usize = 3;
const VM_KEPT: usize = 2;

/// The guest kernel and init of microVM machines, when this host has them.
fn microvm_files() -> Option<(PathBuf, PathBuf)> {
    let kernel = PathBuf::from(std::env::var_os("BAZAAR_VM_KERNEL")?);
    let init = match std::env::var_os("BAZAAR_VMINIT") {
        Some(p) => PathBuf::from(p),
        None => {
            let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
            let out = std::process::Command::new(root.join("scripts/vminit"))
                .output()
                .ok()?;
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        }
    };
    (kernel.is_file() && init.is_file()).then_some((kernel, init))
}

/// Waits until the machine's httpd answers on its address (at once for a machine
/// without one).
async fn serving(ip: &str) {
    if ip.is_empty() {
        return;
    }
    let url = format!("http://{ip}:8080/");
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    let t0 = Instant::now();
    loop {
        let answer = client
            .get(&url)
            .timeout(Duration::from_secs(2))
            .send()
            .await;
        // Any answer of its httpd (a process machine's serves a directory without an index).
        if answer.is_ok() {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "{url} never answered"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// A machine of `runtime` serving busybox's httpd on 8080 (an image machine from the
/// registry's image; a process machine runs the host's busybox).
fn request(runtime: &str, image: &str) -> ClaimRequest {
    let mut config = serde_json::json!({
        "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256},
        "services": [{"protocol": "tcp", "internal_port": 8080,
                      "ports": [{"port": 80, "handlers": ["http"]}]}],
    });
    if runtime == "process" {
        config["init"] = serde_json::json!({"exec": ["/bin/busybox", "httpd", "-f", "-p", "8080", "-h", "/tmp"]});
    } else {
        config["image"] = serde_json::json!(image);
        config["runtime"] = serde_json::json!(runtime);
    }
    serde_json::from_value(serde_json::json!({"app": "bench", "config": config}))
        .expect("claim request")
}

async fn push(registry: &TestRegistry) -> String {
    let reg = bazaar_image::Registry::new(&registry.host, bazaar_image::Auth::Anonymous, true)
        .expect("registry");
    let layer = busybox_rootfs_layer(&["sh", "httpd"], ("etc/repo", b"runtimes"));
    let config = config_with(
        &[&layer],
        bazaar_image::manifest::Platform::current()
            .architecture
            .as_str(),
        serde_json::json!({"Entrypoint": ["/bin/httpd", "-f", "-p"], "Cmd": ["8080"],
                           "Env": ["PATH=/bin"], "WorkingDir": "/www"}),
    );
    push_with_config(&reg, "runtimes", "1", &[&layer], &config).await;
    format!("{}/runtimes:1", registry.host)
}

/// The PSS (KiB) of every process in cgroup `rel` and below it, in the first hierarchy
/// that has it (the memory controller's on cgroup v1, the unified one on v2).
fn cgroup_pss_kib(rel: &str) -> u64 {
    let dir = [
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup/unified",
        "/sys/fs/cgroup",
    ]
    .iter()
    .map(|root| Path::new(root).join(rel))
    .find(|d| d.join("cgroup.procs").exists())
    .unwrap_or_else(|| panic!("no cgroup {rel}"));
    let mut pids = Vec::new();
    collect_pids(&dir, &mut pids);
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok())
        .filter_map(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Pss:"))?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

fn collect_pids(dir: &PathBuf, out: &mut Vec<u32>) {
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    out.extend(procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
    for sub in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if sub.path().is_dir() {
            collect_pids(&sub.path(), out);
        }
    }
}

fn main() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("the runtimes benchmark needs root");
        return;
    }
    ensure_packages();
    let rounds: usize = std::env::var("BAZAAR_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let registry = TestRegistry::start(None);
    let vm = microvm_files();
    let runtimes: Vec<&str> = ["process", "runc", "gvisor"]
        .into_iter()
        .chain(vm.is_some().then_some("microvm"))
        .filter(|r| {
            std::env::var("BAZAAR_BENCH_RUNTIMES")
                .map_or(true, |only| only.split(',').any(|o| o == *r))
        })
        .collect();
    let starts = |runtime: &str| {
        if runtime == "microvm" {
            VM_PER_ROUND
        } else {
            PER_ROUND
        }
    };
    let kept_of = |runtime: &str| if runtime == "microvm" { VM_KEPT } else { KEPT };
    let mut opts = AgentOptions::new(PathBuf::from(EXE));
    if let Some((kernel, init)) = &vm {
        opts.extra_args.extend([
            "--vm-kernel".to_string(),
            kernel.display().to_string(),
            "--vm-allow-tcg".to_string(),
        ]);
        opts.env
            .push(("BAZAAR_VMINIT".into(), init.display().to_string()));
    }
    opts.memory_mb = 1_000_000;
    opts.cpus = 1000;
    let agent = TestAgent::start(opts).expect("agent");
    let c = agent.client();
    let host_id = rt.block_on(c.info()).expect("info").id;

    let results = rt.block_on(async {
        let image = push(&registry).await;
        // Pulled once, and each runtime started once before timing.
        for runtime in &runtimes {
            let m = c.create(&request(runtime, &image)).await.expect("create");
            c.wait(&m.id, "started", 60).await.expect("started");
            serving(&m.private_ip).await;
            c.destroy(&m.id, true).await.unwrap();
        }
        eprintln!("each runtime started once: {runtimes:?}");
        let mut times: Vec<Vec<Duration>> = vec![Vec::new(); runtimes.len()];
        let mut serve_times: Vec<Vec<Duration>> = vec![Vec::new(); runtimes.len()];
        for _ in 0..rounds {
            for (i, runtime) in runtimes.iter().enumerate() {
                for _ in 0..starts(runtime) {
                    let t0 = Instant::now();
                    let m = c.create(&request(runtime, &image)).await.unwrap();
                    c.wait(&m.id, "started", 60).await.unwrap();
                    times[i].push(t0.elapsed());
                    serving(&m.private_ip).await;
                    serve_times[i].push(t0.elapsed());
                    c.destroy(&m.id, true).await.unwrap();
                }
            }
        }
        for (i, runtime) in runtimes.iter().enumerate() {
            let mut t = times[i].clone();
            t.sort();
            let mut st = serve_times[i].clone();
            st.sort();
            eprintln!(
                "{runtime}: started p50 {} p99 {}, serving p50 {} p99 {}",
                ms(percentile(&t, 0.5)),
                ms(percentile(&t, 0.99)),
                ms(percentile(&st, 0.5)),
                ms(percentile(&st, 0.99))
            );
        }
        // Memory: KEPT machines of each runtime running together, measured once they serve.
        let mut kept: Vec<Vec<String>> = vec![Vec::new(); runtimes.len()];
        for (i, runtime) in runtimes.iter().enumerate() {
            for _ in 0..kept_of(runtime) {
                let m = c.create(&request(runtime, &image)).await.unwrap();
                c.wait(&m.id, "started", 60).await.unwrap();
                serving(&m.private_ip).await;
                kept[i].push(m.id);
            }
        }
        // (Let each machine's server reach its idle state.)
        tokio::time::sleep(Duration::from_secs(2)).await;
        let memory: Vec<f64> = kept
            .iter()
            .map(|ids| {
                let total: u64 = ids
                    .iter()
                    .map(|id| cgroup_pss_kib(&format!("bazaar/{host_id}/{id}")))
                    .sum();
                total as f64 / ids.len() as f64 / 1024.0
            })
            .collect();
        for id in kept.into_iter().flatten() {
            c.destroy(&id, true).await.unwrap();
        }
        for t in times.iter_mut().chain(&mut serve_times) {
            t.sort();
        }
        (times, serve_times, memory)
    });
    let (times, serve_times, memory) = results;
    println!("| runtime | create→started p50 | p99 | create→serving p50 | p99 | memory per running machine (PSS) |");
    println!("|---|---|---|---|---|---|");
    for (i, runtime) in runtimes.iter().enumerate() {
        let name = match *runtime {
            "microvm" => "microvm (TCG)",
            r => r,
        };
        println!(
            "| {name} | {} | {} | {} | {} | {:.1} MiB |",
            ms(percentile(&times[i], 0.5)),
            ms(percentile(&times[i], 0.99)),
            ms(percentile(&serve_times[i], 0.5)),
            ms(percentile(&serve_times[i], 0.99)),
            memory[i]
        );
    }
    println!(
        "\n{} starts per runtime ({rounds} rounds of {PER_ROUND}; microvm {} in rounds of {VM_PER_ROUND}; runtimes in turn); memory: mean of {KEPT} machines of each running together ({VM_KEPT} microVMs)",
        rounds * PER_ROUND,
        rounds * VM_PER_ROUND
    );
}
