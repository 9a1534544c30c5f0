//! Measures what the shim costs: `ShimHandle::spawn` latency (until the workload is exec'd)
//! and the resident memory of a shim supervising `sleep 1000`, in each configuration this
//! host can run (plain; as root isolated and sandboxed; with cgroups). Prints the figures:
//! `cargo bench -p bazaar --bench shim` (docs/benchmarks/shim.md). A benchmark, not a test:
//! timings on a shared machine vary, so nothing here fails on a number.
//!
//! Both depend on the size of the `bazaar` executable the shim runs as: set
//! `BAZAAR_SHIM_PERF_EXE=target/release/bazaar` (an absolute path) to measure a release build.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bazaar_shim::{ShimHandle, ShimSpec};

/// Spawns per configuration: enough for a stable median, few enough to stay quick.
const RUNS: usize = 25;

/// A sandboxed run's seccomp filters: compiled by the shim (`None`), or read from a file
/// the agent wrote once.
type Filters<'a> = Option<&'a Path>;

fn spec(
    dir: &Path,
    isolate: bool,
    cgroup: Option<String>,
    sandbox: bool,
    filters: Filters,
) -> ShimSpec {
    ShimSpec {
        machine_id: "m-perf".into(),
        run_id: 1,
        argv: vec!["sleep".into(), "1000".into()],
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        workdir: dir.join("work"),
        // SAFETY: geteuid cannot fail.
        user: match (sandbox, unsafe { libc::geteuid() } == 0) {
            (true, _) => Some("200000:200000".into()),
            (false, root) => root.then(|| "root".into()),
        },
        hostname: "m-perf".into(),
        isolate,
        memory_mb: if cgroup.is_some() { 256 } else { 0 },
        cpus: if cgroup.is_some() { 1.0 } else { 0.0 },
        cgroup,
        log_path: dir.join("m-perf.log"),
        log_max_bytes: 1 << 20,
        sandbox: sandbox.then(|| bazaar_shim::Sandbox {
            workdir: "/work".into(),
            user_name: "machine".into(),
            seccomp: filters.map(Path::to_path_buf),
            ..Default::default()
        }),
        cgroup_layout: None,
        signal_argv: None,
    }
}

/// VmRSS of `pid` in KiB.
fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

async fn measure(label: &str, isolate: bool, cgroup: bool, sandbox: bool, filters: Filters<'_>) {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::var_os("BAZAAR_SHIM_PERF_EXE").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_bazaar")),
        PathBuf::from,
    );
    let mut latencies = Vec::with_capacity(RUNS);
    let mut rss = Vec::with_capacity(RUNS);
    for i in 0..RUNS {
        let cg = cgroup.then(|| format!("bazaar-test-{}-perf-{i}", std::process::id()));
        let spec = spec(dir.path(), isolate, cg, sandbox, filters);
        let run_dir = dir.path().join(format!("run-{i}"));
        let started = Instant::now();
        let handle = ShimHandle::spawn(&exe, &run_dir, &spec).await.unwrap();
        latencies.push(started.elapsed());
        // Let the shim settle into its event loop before sampling its memory.
        tokio::time::sleep(Duration::from_millis(20)).await;
        rss.push(rss_kib(handle.shim_pid()));
        handle.kill().unwrap();
        tokio::time::timeout(Duration::from_secs(10), handle.wait())
            .await
            .unwrap();
    }
    latencies.sort();
    rss.sort_unstable();
    let (p50, p90) = (latencies[RUNS / 2], latencies[RUNS * 9 / 10]);
    eprintln!(
        "shim {label}: spawn p50 {:.2} ms, p90 {:.2} ms; shim VmRSS median {} KiB, max {} KiB",
        p50.as_secs_f64() * 1e3,
        p90.as_secs_f64() * 1e3,
        rss[RUNS / 2],
        rss[RUNS - 1],
    );
}

#[tokio::main]
async fn main() {
    let scratch = tempfile::tempdir().unwrap();
    let file = scratch.path().join("seccomp.bpf");
    bazaar_shim::write_seccomp_filters(&file).unwrap();
    let from_file = Some(file.as_path());
    let mut configs = vec![("plain", false, false, false, None)];
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        configs.push(("isolated", true, false, false, None));
        configs.push(("sandboxed", true, false, true, None));
        configs.push((
            "sandboxed, filters from a file",
            true,
            false,
            true,
            from_file,
        ));
    }
    if bazaar_shim::cgroups_available() {
        configs.push(("cgroup", false, true, false, None));
        configs.push(("isolated+cgroup", true, true, false, None));
        configs.push(("sandboxed+cgroup", true, true, true, None));
        configs.push((
            "sandboxed+cgroup, filters from a file",
            true,
            true,
            true,
            from_file,
        ));
    }
    for (label, isolate, cgroup, sandbox, filters) in configs {
        measure(label, isolate, cgroup, sandbox, filters).await;
    }
}
