//! Layer distribution (issue 38 item 6), as root: an image with one large layer of
//! incompressible bytes starts a machine on each of N−1 hosts at once, pulled two ways in
//! one sitting: **peer to peer** from the cluster's registry (pushed to host 0's `/v2`, run
//! as `registry.bazaar.internal/bench@...`: each host fetches each blob from a peer that
//! has it) and **all from one host** (Debian's `docker-registry` on loopback, the central
//! registry every host pulls from). The time is from the first create to the last machine
//! started; the pull events say which host served the peer-to-peer layers.
//!
//! Then **deploy from source to serving** on the same cluster: an app directory (a
//! Dockerfile `FROM` the test kit's Debian base, mirrored into the cluster's registry with
//! `bazaar image push`, `COPY` of busybox-static and a page, `CMD` the base's shell running
//! busybox's httpd and exiting on the stop signal, as a well-behaved app does: httpd as PID
//! 1 ignores SIGINT, and every replacement would wait out the 5 s `kill_timeout`) through `bazaar deploy` (buildah builds it and pushes it to host 0),
//! timed from the command's start until host 0's proxy serves the new page: once with an
//! empty buildah storage (the base pulled, every layer built and pushed: not cached) and
//! then after a one-line change (only the page's layer built and pushed: cached), and a
//! one-line change again with the storage emptied first (not cached). The bench
//! uses a buildah storage of its own (`CONTAINERS_STORAGE_CONF`), so nothing of the
//! operator's is used or left.
//!
//! Run: `cargo bench -p bazaar --bench registry` (prints Markdown tables for
//! docs/benchmarks/registry.md). `BAZAAR_BENCH_HOSTS` (default 5) and
//! `BAZAAR_BENCH_LAYER_MB` (default 64) change the size; `BAZAAR_BENCH_VERBOSE` shows each
//! deploy's output with the time of each line. `BAZAAR_BENCH_LAB=N` runs only the peer-to-peer
//! distribution, on a `bazaar lab` of N hosts in network namespaces (`registry/lab.rs`).

use bazaar_testkit::images::{
    busybox_rootfs_layer, config_with, ensure_packages, layer, push_with_config, Entry, Layer,
    TestRegistry,
};
use bazaar_testkit::{start_cluster, Fly};
use serde_json::json;
use std::time::{Duration, Instant};

#[path = "registry/lab.rs"]
mod lab;

const EXE: &str = env!("CARGO_BIN_EXE_bazaar");

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `mb` MiB of xorshift bytes (gzip cannot shrink them), different for each `seed`.
fn noise(mb: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(mb << 20);
    while out.len() < mb << 20 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

/// The image's layers (busybox with `sleep`, and the data) and config; `tag` makes every
/// layer new.
fn image(mb: usize, tag: &str, seed: u64) -> (Vec<Layer>, Vec<u8>) {
    let base = busybox_rootfs_layer(&["sh", "sleep"], ("etc/bench", tag.as_bytes()));
    let data = layer(vec![
        Entry::Dir("data/"),
        Entry::File("data/blob".into(), noise(mb, seed), 0o644),
    ]);
    let arch = bazaar_image::manifest::Platform::current().architecture;
    let config = config_with(
        &[&base, &data],
        &arch,
        json!({"Cmd": ["/bin/sleep", "1000"]}),
    );
    (vec![base, data], config)
}

/// Creates a machine of `image` on each host 1..n at once; answers the time until the
/// last one started and each one's pull event.
async fn distribute(fly: &Fly, image: &str, n: usize) -> (Duration, Vec<String>) {
    let t0 = Instant::now();
    let creates = (1..n).map(|i| async move {
        let body = json!({"config": {
            "image": image,
            "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256},
            "placement": {"constraints": [{"label": "n", "op": "=", "value": i.to_string()}]},
        }});
        let (s, m) = fly.post("/apps/bench/machines", body).await;
        assert!(s.is_success(), "create on host {i}: {m}");
        let id = m["id"].as_str().unwrap().to_string();
        let path = format!("/apps/bench/machines/{id}/wait?state=started&timeout=60");
        for _ in 0..5 {
            let (s, w) = fly.get(&path).await;
            if s.is_success() {
                return id;
            }
            assert_eq!(s.as_u16(), 408, "machine on host {i}: {w}");
        }
        panic!("machine on host {i} did not start in 5 minutes")
    });
    let ids = futures_util::future::join_all(creates).await;
    let took = t0.elapsed();
    let mut pulls = Vec::new();
    for id in ids {
        let (_, events) = fly.get(&format!("/apps/bench/machines/{id}/events")).await;
        pulls.push(pull_reason(&events));
    }
    (took, pulls)
}

/// What a machine's pull event says (which host served each layer), else all its events.
fn pull_reason(events: &serde_json::Value) -> String {
    events
        .as_array()
        .and_then(|e| e.iter().find(|e| e["type"] == "pull"))
        .map(|e| {
            e["request"]["reason"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .unwrap_or_else(|| events.to_string())
}

async fn run() {
    let n = env_or("BAZAAR_BENCH_HOSTS", 5).max(2);
    let mb = env_or("BAZAAR_BENCH_LAYER_MB", 64);
    ensure_packages();
    let on_lab = env_or("BAZAAR_BENCH_LAB", 0);
    if on_lab > 0 {
        let (layers, config) = image(mb, "lab", 3);
        let (took, pulls) = lab::distribution(EXE, on_lab.max(2), &layers, &config).await;
        let total_mb = (layers.iter().map(|l| l.blob.len()).sum::<usize>() as f64) / 1048576.0;
        println!("| lab hosts pulling | image | peer to peer |");
        println!("|---:|---:|---:|");
        println!(
            "| {} | {total_mb:.1} MiB | {:.2} s |",
            on_lab.max(2) - 1,
            took.as_secs_f64()
        );
        println!();
        for (i, p) in pulls.iter().enumerate() {
            println!("h{}: {p}", i + 2);
        }
        return;
    }
    let central = TestRegistry::start(None);
    let agents = start_cluster(std::path::Path::new(EXE), n, |i, o| {
        o.extra_args
            .extend(["--label".to_string(), format!("n={i}")]);
    })
    .expect("agents start");
    let fly = Fly::new(&agents[0]);
    bazaar_testkit::eventually(Duration::from_secs(30), || async {
        let (_, r) = fly.get("/platform/regions").await;
        (r["regions"][0]["hosts"] == n).then_some(())
    })
    .await
    .expect("every host in the region");
    fly.create_app("bench").await;

    // Peer to peer: pushed to host 0.
    let host0 = agents[0].url().trim_start_matches("http://").to_string();
    let auth = bazaar_image::Auth::Basic {
        username: "x".into(),
        password: bazaar_testkit::api_token().into(),
    };
    let cluster = bazaar_image::Registry::new(&host0, auth, true).expect("registry client");
    let (layers, config) = image(mb, "p2p", 1);
    let refs: Vec<&Layer> = layers.iter().collect();
    let digest = push_with_config(&cluster, "bench", "p2p", &refs, &config).await;
    let (p2p, pulls) =
        distribute(&fly, &format!("registry.bazaar.internal/bench@{digest}"), n).await;

    // All from one host: the central registry.
    let anon = bazaar_image::Registry::new(&central.host, bazaar_image::Auth::Anonymous, true)
        .expect("registry client");
    let (layers, config) = image(mb, "central", 2);
    let refs: Vec<&Layer> = layers.iter().collect();
    let digest = push_with_config(&anon, "bench", "central", &refs, &config).await;
    let (one, _) = distribute(&fly, &format!("{}/bench@{digest}", central.host), n).await;

    let total_mb = (layers.iter().map(|l| l.blob.len()).sum::<usize>() as f64) / 1048576.0;
    println!("| hosts pulling | image | peer to peer | all from one host |");
    println!("|---:|---:|---:|---:|");
    println!(
        "| {} | {total_mb:.1} MiB | {:.2} s | {:.2} s |",
        n - 1,
        p2p.as_secs_f64(),
        one.as_secs_f64()
    );
    println!();
    for (i, p) in pulls.iter().enumerate() {
        println!("host {}: {p}", i + 1);
    }
    println!();
    deploy_from_source(&fly, &agents[0]).await;
}

/// `bazaar deploy` from a Dockerfile to serving through `agent`'s proxy, not cached and
/// cached (see the module doc).
async fn deploy_from_source(fly: &Fly, agent: &bazaar_testkit::TestAgent) {
    fly.create_app("built").await;
    let token = bazaar_testkit::api_token();
    let work = tempfile::tempdir().expect("temporary directory");
    // A buildah storage of the bench's own: the first build finds nothing cached.
    let storage = work.path().join("storage");
    let storage_conf = work.path().join("storage.conf");
    std::fs::write(
        &storage_conf,
        format!(
            "[storage]\ndriver = \"overlay\"\ngraphroot = \"{0}/graph\"\nrunroot = \"{0}/run\"\n",
            storage.display()
        ),
    )
    .expect("storage.conf");
    bazaar_testkit::debian_base::push_debian_base(
        std::path::Path::new(EXE),
        &agent.url(),
        token,
        "built/debian:bookworm",
    );
    let app = work.path().join("app");
    std::fs::create_dir_all(app.join("www")).expect("app directory");
    std::fs::copy("/bin/busybox", app.join("busybox")).expect("busybox-static");
    std::fs::write(
        app.join("Dockerfile"),
        "FROM registry.bazaar.internal/built/debian:bookworm\n\
         COPY busybox /bin/busybox-static\nCOPY www /www\n\
         CMD [\"/bin/sh\", \"-c\", \"trap 'exit 0' INT TERM; /bin/busybox-static httpd -f -p 8080 -h /www & wait\"]\n",
    )
    .expect("Dockerfile");
    std::fs::write(
        app.join("fly.toml"),
        "app = \"built\"\n[build]\n[http_service]\n  internal_port = 8080\n",
    )
    .expect("fly.toml");
    let proxy = agent.proxy_url();
    let http = reqwest::Client::new();
    let wipe = || {
        let _ = std::process::Command::new("buildah")
            .args(["rmi", "--all", "--force"])
            .env("CONTAINERS_STORAGE_CONF", &storage_conf)
            .output();
    };
    let mut rows = Vec::new();
    let runs = [
        (
            "first deploy (a new machine), not cached",
            "release one\n",
            false,
        ),
        (
            "one-line change (a machine replaced), cached",
            "release two\n",
            false,
        ),
        (
            "one-line change (a machine replaced), not cached",
            "release three\n",
            true,
        ),
    ];
    for (what, page, empty_storage) in runs {
        if empty_storage {
            wipe();
        }
        std::fs::write(app.join("www/index.html"), page).expect("page");
        let t0 = Instant::now();
        let mut child = std::process::Command::new(EXE)
            .args(["deploy", "-c"])
            .arg(app.join("fly.toml"))
            .args(["--count", "1"])
            .env("BAZAAR_API_URL", agent.url())
            .env("BAZAAR_TOKEN", token)
            .env("CONTAINERS_STORAGE_CONF", &storage_conf)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("bazaar deploy");
        let stderr = child.stderr.take().expect("piped");
        // The command runs on a thread of its own while the proxy is polled from the start.
        let deploy = tokio::task::spawn_blocking(move || {
            let mut pushed = None;
            let mut said = String::new();
            for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)) {
                let line = line.expect("stderr");
                if line.starts_with("pushed ") {
                    pushed = Some(t0.elapsed());
                }
                said.push_str(&format!("{:6.2} s  {line}\n", t0.elapsed().as_secs_f64()));
            }
            assert!(
                child.wait().expect("wait").success(),
                "bazaar deploy: {said}"
            );
            if std::env::var_os("BAZAAR_BENCH_VERBOSE").is_some() {
                eprint!("{said}");
            }
            (
                pushed.expect("bazaar deploy says what it pushed"),
                t0.elapsed(),
            )
        });
        bazaar_testkit::eventually(Duration::from_secs(120), || async {
            let r = http
                .get(&proxy)
                .header("host", "built.localhost")
                .send()
                .await
                .ok()?;
            (r.text().await.ok()? == page).then_some(())
        })
        .await
        .expect("the new page served");
        let serving = t0.elapsed();
        let (pushed, deployed) = deploy.await.expect("the deploy thread");
        rows.push((what, pushed, serving, deployed));
    }
    // Empties the bench's storage (its overlay mounts too) before the directory goes.
    wipe();
    println!("| deploy from source | built and pushed | serving the new page | `bazaar deploy` returned |");
    println!("|---|---:|---:|---:|");
    for (what, pushed, serving, deployed) in rows {
        println!(
            "| {what} | {:.2} s | {:.2} s | {:.2} s |",
            pushed.as_secs_f64(),
            serving.as_secs_f64(),
            deployed.as_secs_f64()
        );
    }
}

fn main() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("registry bench: needs root (image machines); skipped");
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(run());
}
