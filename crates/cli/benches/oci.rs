//! Image machine benchmark (issue 7), as root: create→started of a machine from a registry
//! image through the host interface, cold (pull + unpack + rootfs + network + runc: every
//! sample is a new image) and warm (image cached), p50/p99; warm machines per second (16 in
//! flight); and in the same run the floor: `runc run` of the same bundle until runc has
//! created the container (its `--pid-file`), the moment the agent calls the machine started.
//!
//! Run: `cargo bench -p bazaar --bench oci` (prints a Markdown table for
//! docs/benchmarks/image-machines.md).
//! `BAZAAR_BENCH_EXE` runs another `bazaar` executable (to compare builds in one sitting).

use bazaar_testkit::images::{
    busybox_rootfs_layer, config_with, ensure_packages, push_with_config, TestRegistry,
};
use bazaar_testkit::{AgentOptions, TestAgent};
use bazaar_types::host::ClaimRequest;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_bazaar");
const COLD: usize = 10;
const WARM: usize = 100;
const RATE: usize = 150;
const FLOOR: usize = 50;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn request(image: &str) -> ClaimRequest {
    serde_json::from_value(serde_json::json!({
        "app": "bench",
        "config": {
            "image": image,
            "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256},
            "services": [{"protocol": "tcp", "internal_port": 8080,
                          "ports": [{"port": 80, "handlers": ["http"]}]}],
        },
    }))
    .expect("claim request")
}

async fn push(registry: &TestRegistry, repo: &str) -> String {
    let reg = bazaar_image::Registry::new(&registry.host, bazaar_image::Auth::Anonymous, true)
        .expect("registry");
    let layer = busybox_rootfs_layer(&["sh", "httpd"], ("etc/repo", repo.as_bytes()));
    let config = config_with(
        &[&layer],
        bazaar_image::manifest::Platform::current()
            .architecture
            .as_str(),
        serde_json::json!({"Entrypoint": ["/bin/httpd", "-f", "-p"], "Cmd": ["8080"],
                           "Env": ["PATH=/bin"], "WorkingDir": "/www"}),
    );
    push_with_config(&reg, repo, "1", &[&layer], &config).await;
    format!("{}/{repo}:1", registry.host)
}

/// `runc run` of `bundle` (a copy of a machine's, in its own cgroup) until its pid file
/// appears; the container is then killed and deleted.
fn runc_floor(bundle_config: &Path, n: usize) -> Vec<Duration> {
    let dir = tempfile::tempdir().expect("tempdir");
    let bundle = dir.path().join("bundle");
    std::fs::create_dir_all(&bundle).unwrap();
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bundle_config).unwrap()).unwrap();
    let root = dir.path().join("state");
    let mut times = Vec::new();
    for i in 0..n {
        let id = format!("floor{i}");
        config["linux"]["cgroupsPath"] = serde_json::json!(format!("/bazaar-bench-floor/{id}"));
        std::fs::write(bundle.join("config.json"), config.to_string()).unwrap();
        let pid_file = dir.path().join(format!("{id}.pid"));
        let t0 = Instant::now();
        let mut child = std::process::Command::new("runc")
            .arg("--root")
            .arg(&root)
            .args(["run", "--pid-file"])
            .arg(&pid_file)
            .arg("--bundle")
            .arg(&bundle)
            .arg(&id)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("runc");
        while !std::fs::read_to_string(&pid_file).is_ok_and(|s| !s.trim().is_empty()) {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "runc floor: no pid file"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        times.push(t0.elapsed());
        let _ = std::process::Command::new("runc")
            .arg("--root")
            .arg(&root)
            .args(["kill", &id, "KILL"])
            .status();
        let _ = child.wait();
        let _ = std::process::Command::new("runc")
            .arg("--root")
            .arg(&root)
            .args(["delete", "-f", &id])
            .status();
        for hierarchy in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
            let _ = std::fs::remove_dir(hierarchy.path().join("bazaar-bench-floor").join(&id));
        }
    }
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        let _ = std::fs::remove_dir(hierarchy.path().join("bazaar-bench-floor"));
    }
    times.sort();
    times
}

fn bundle_of(agent: &TestAgent, id: &str) -> PathBuf {
    let runs = agent.data_dir.join("machines").join(id).join("runs");
    let run = std::fs::read_dir(&runs).unwrap().flatten().next().unwrap();
    run.path().join("bundle").join("config.json")
}

fn main() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("the image benchmark needs root");
        return;
    }
    ensure_packages();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let registry = TestRegistry::start(None);
    let exe = std::env::var_os("BAZAAR_BENCH_EXE").map_or_else(|| EXE.into(), PathBuf::from);
    let mut opts = AgentOptions::new(exe);
    opts.memory_mb = 1_000_000;
    opts.cpus = 1000;
    let agent = TestAgent::start(opts).expect("agent");
    let c = agent.client();

    let (cold, warm, rate, floor_bundle, steps) = rt.block_on(async {
        let mut cold = Vec::new();
        for i in 0..COLD {
            let image = push(&registry, &format!("cold{i}")).await;
            let t0 = Instant::now();
            let m = c.create(&request(&image)).await.expect("create");
            c.wait(&m.id, "started", 60).await.expect("started");
            cold.push(t0.elapsed());
            c.destroy(&m.id, true).await.unwrap();
        }
        cold.sort();
        let image = push(&registry, "warm").await;
        // Pull it once and keep one machine's bundle for the floor.
        let first = c.create(&request(&image)).await.unwrap();
        c.wait(&first.id, "started", 60).await.unwrap();
        let floor_bundle = tempfile::NamedTempFile::new().unwrap();
        std::fs::copy(bundle_of(&agent, &first.id), floor_bundle.path()).unwrap();
        c.destroy(&first.id, true).await.unwrap();
        let mut warm = Vec::new();
        let mut steps = Steps::default();
        for _ in 0..WARM {
            let t0 = Instant::now();
            let m = c.create(&request(&image)).await.unwrap();
            c.wait(&m.id, "started", 60).await.unwrap();
            warm.push(t0.elapsed());
            steps.add(&c.events(&m.id).await.unwrap());
            c.destroy(&m.id, true).await.unwrap();
        }
        warm.sort();
        // Machines per second: RATE creates→started, 16 in flight.
        let t0 = Instant::now();
        let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(16));
        let mut tasks = Vec::new();
        for _ in 0..RATE {
            let (c, sem, image) = (c.clone(), sem.clone(), image.clone());
            tasks.push(tokio::spawn(async move {
                let _permit = sem.acquire().await.unwrap();
                let m = c.create(&request(&image)).await.unwrap();
                c.wait(&m.id, "started", 60).await.unwrap();
                m.id
            }));
        }
        let mut ids = Vec::new();
        for t in tasks {
            ids.push(t.await.unwrap());
        }
        let rate = RATE as f64 / t0.elapsed().as_secs_f64();
        for id in ids {
            c.destroy(&id, true).await.unwrap();
        }
        (cold, warm, rate, floor_bundle, steps)
    });
    // The floor runs in the destroyed first machine's place: give its bundle a namespace.
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(floor_bundle.path()).unwrap()).unwrap();
    let ns = "bz-bench-floor";
    let _ = std::process::Command::new("ip")
        .args(["netns", "add", ns])
        .status();
    config["linux"]["namespaces"] = serde_json::json!([
        {"type": "pid"}, {"type": "network", "path": format!("/run/netns/{ns}")},
        {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, {"type": "cgroup"}
    ]);
    // Its rootfs went with it: the floor gets a copy of the image's layer as a plain dir.
    let rootfs = tempfile::tempdir().unwrap();
    let store_layers = agent.data_dir.join("images");
    copy_layers(&store_layers, rootfs.path());
    config["root"]["path"] = serde_json::json!(rootfs.path());
    std::fs::write(floor_bundle.path(), config.to_string()).unwrap();
    let floor = runc_floor(floor_bundle.path(), FLOOR);
    let _ = std::process::Command::new("ip")
        .args(["netns", "delete", ns])
        .status();

    println!("| measure | p50 | p99 |");
    println!("|---|---|---|");
    println!(
        "| cold create→started (pull + unpack + start, {COLD} new images) | {} | {} |",
        ms(percentile(&cold, 0.5)),
        ms(percentile(&cold, 0.99))
    );
    println!(
        "| warm create→started ({WARM}, cached image) | {} | {} |",
        ms(percentile(&warm, 0.5)),
        ms(percentile(&warm, 0.99))
    );
    println!(
        "| floor: `runc run` of the same bundle → container created ({FLOOR}) | {} | {} |",
        ms(percentile(&floor, 0.5)),
        ms(percentile(&floor, 0.99))
    );
    println!(
        "\nwarm p50 / floor p50 = {:.2}× (target ≤ 1.2×, issue 36); warm machines/s ({RATE}, 16 in flight): {rate:.1}",
        percentile(&warm, 0.5).as_secs_f64() / percentile(&floor, 0.5).as_secs_f64()
    );
    steps.print();
}

/// The launch steps warm starts recorded (`machine explain --timing`), in the order they ran.
#[derive(Default)]
struct Steps {
    order: Vec<String>,
    ms: std::collections::HashMap<String, Vec<f64>>,
}

impl Steps {
    fn add(&mut self, events: &[bazaar_types::event::MachineEvent]) {
        let start = events.iter().find(|e| e.kind == "start");
        let timing = start.and_then(|e| e.request.as_ref()).map(|r| &r.timing);
        for s in timing.into_iter().flatten() {
            if !self.order.contains(&s.step) {
                self.order.push(s.step.clone());
            }
            self.ms.entry(s.step.clone()).or_default().push(s.ms);
        }
    }

    fn print(&self) {
        println!("\n| warm launch step | p50 | p90 |\n|---|---|---|");
        for step in &self.order {
            let mut v = self.ms[step].clone();
            v.sort_by(f64::total_cmp);
            let at = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
            println!("| {step} | {:.2} ms | {:.2} ms |", at(0.5), at(0.9));
        }
    }
}

/// Copies the unpacked layers of the store (one image's worth: the warm image's layer
/// among them) into `dest`, so the floor has the same files as the machine's root.
fn copy_layers(store: &Path, dest: &Path) {
    let layers = store.join("layers").join("sha256");
    for layer in std::fs::read_dir(&layers).unwrap().flatten() {
        let _ = std::process::Command::new("cp")
            .arg("-a")
            .arg(format!("{}/.", layer.path().display()))
            .arg(dest)
            .status();
    }
}
