//! A host leaves nothing on the machine when it goes: `bazaar dev` with image machines and
//! volumes, stopped with SIGINT, leaves no network namespace, link, nftables table, mount,
//! loop device, cgroup or process of its hosts (and resumes from its data afterwards); after
//! `kill -9` of `dev` and of every agent, `bazaar host reset --data-dir` removes every trace
//! of each host, its data included. Run as root (CI does); fails otherwise.

use crate::common;

use bazaar_testkit::images::{busybox_rootfs_layer, config_with, push_with_config, TestRegistry};
use common::*;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const HOSTS: usize = 2;

/// A base port with `base..base + HOSTS` and `base + 10..` free on loopback (API and proxy).
fn free_ports() -> u16 {
    let free = |p: u16| {
        std::net::TcpListener::bind(("127.0.0.1", p)).is_ok()
            && std::net::UdpSocket::bind(("127.0.0.1", p)).is_ok()
    };
    for _ in 0..1000 {
        let base = bazaar_testkit::free_port(std::net::Ipv4Addr::LOCALHOST);
        let n = HOSTS as u16;
        if base < 31_900 && (0..n).all(|i| free(base + i) && free(base + 10 + i)) {
            return base;
        }
    }
    panic!("no free ports");
}

fn start_dev(dir: &Path, base: u16, gossip: u16) -> Child {
    Command::new(EXE)
        .args(["dev", "--hosts", &HOSTS.to_string(), "--memory-mb", "4096"])
        .arg("--data-dir")
        .arg(dir)
        .args(["--gossip-port", &gossip.to_string()])
        .args(["--base-port", &base.to_string()])
        .args(["--proxy-port", &(base + 10).to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

fn read_env(dir: &Path) -> HashMap<String, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(text) = std::fs::read_to_string(dir.join("dev.env")) {
            let env: HashMap<String, String> = text
                .lines()
                .filter_map(|l| l.split_once('=').map(|(k, v)| (k.into(), v.into())))
                .collect();
            if env.contains_key("BAZAAR_TOKEN") {
                return env;
            }
        }
        assert!(Instant::now() < deadline, "dev.env never appeared");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `bazaar <args>` against the dev cluster; panics unless it succeeds. Returns stdout.
fn cli(env: &HashMap<String, String>, args: &[&str]) -> String {
    let out = Command::new(EXE)
        .args(args)
        .env("BAZAAR_API_URL", &env["BAZAAR_API_URL"])
        .env("BAZAAR_TOKEN", &env["BAZAAR_TOKEN"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bazaar {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// When a test fails midway, stops the dev cluster it left (its `dev` and agents, found by
/// `agent.pid` and the dev process of the data dir) and removes what they made on the host.
struct CleanUpOnFailure(PathBuf);

impl Drop for CleanUpOnFailure {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let needle = format!("--data-dir {}", self.0.display());
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmd)
                .replace('\0', " ")
                .contains(&needle)
            {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            }
        }
        for i in 0..HOSTS {
            let host_dir = self.0.join(format!("host-{i}"));
            if let Ok(pid) = std::fs::read_to_string(host_dir.join("agent.pid")) {
                let _ = Command::new("kill").args(["-9", pid.trim()]).status();
            }
            std::thread::sleep(Duration::from_millis(100));
            let id = bazaar_agent::cleanup::host_id_of(&host_dir).ok().flatten();
            bazaar_agent::cleanup::release_host(&host_dir, id.as_deref());
        }
    }
}

/// What one host of the cluster is known by on the machine.
#[derive(Debug)]
struct Host {
    dir: PathBuf,
    id: String,
    bridge: String,
}

impl Host {
    fn read(dir: PathBuf, id: String) -> Host {
        let bridge = bazaar_agent::network::bridge_name(&id);
        Host { dir, id, bridge }
    }
}

fn run_text(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(out.status.success(), "{program} {args:?} failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The processes (pid, command line) whose mount namespace has a mount below `under`:
/// what holds a loop device after the host's own mount is gone.
fn mounted_in(under: &str) -> Vec<(String, String)> {
    let mut holders = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(mountinfo) = std::fs::read_to_string(e.path().join("mountinfo")) else {
            continue;
        };
        if mountinfo.contains(under) {
            let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            holders.push((e.file_name().to_string_lossy().into_owned(), cmdline));
        }
    }
    holders
}

/// Every trace of `hosts` on this machine, one line each (empty when there is none).
fn traces(hosts: &[Host], cluster_dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let root = std::fs::canonicalize(cluster_dir).unwrap_or(cluster_dir.to_path_buf());
    let under = format!("{}/", root.display());
    for line in run_text("ip", &["netns", "list"]).lines() {
        if hosts
            .iter()
            .any(|h| line.starts_with(&format!("{}-", h.bridge)))
        {
            found.push(format!("netns {line}"));
        }
    }
    for line in run_text("ip", &["-o", "link", "show"]).lines() {
        let name = line.split(": ").nth(1).unwrap_or("");
        let name = name.split('@').next().unwrap_or("");
        if hosts.iter().any(|h| {
            name == h.bridge
                || name.starts_with(&format!("{}-", h.bridge))
                || name.starts_with(&format!("b{}", &h.bridge[3..]))
        }) {
            found.push(format!("link {name}"));
        }
    }
    for line in run_text("nft", &["list", "tables"]).lines() {
        if hosts
            .iter()
            .any(|h| line.ends_with(&format!("bazaar_{}", h.bridge.replace('-', "_"))))
        {
            found.push(format!("nft {line}"));
        }
    }
    for line in std::fs::read_to_string("/proc/mounts").unwrap().lines() {
        if line
            .split(' ')
            .nth(1)
            .is_some_and(|t| t.starts_with(&under))
        {
            found.push(format!("mount {line}"));
        }
    }
    for line in run_text("losetup", &["-a"]).lines() {
        if !line.contains(&under) {
            continue;
        }
        // Detached (autoclear) but still held by a copy of its mount in the mount namespace
        // of a process that is not the cluster's (another test's workload): the kernel
        // frees it when that process exits. Anything else is a leak.
        let device = line
            .split(':')
            .next()
            .unwrap_or("")
            .trim_start_matches("/dev/");
        let autoclear = std::fs::read_to_string(format!("/sys/block/{device}/loop/autoclear"))
            .is_ok_and(|a| a.trim() == "1");
        let holders = mounted_in(&under);
        if !autoclear || holders.iter().any(|(_, cmdline)| cmdline.contains(&under)) {
            found.push(format!("loop {line} (mounted in {holders:?})"));
        }
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    for line in mountinfo.lines().filter(|l| l.contains(" - cgroup")) {
        let mount_point = line.split(' ').nth(4).unwrap();
        for h in hosts {
            let cg = Path::new(mount_point).join("bazaar").join(&h.id);
            if cg.exists() {
                found.push(format!("cgroup {}", cg.display()));
            }
        }
    }
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(&under) && cmdline.contains(EXE) {
            found.push(format!("process {cmdline}"));
        }
    }
    found
}

/// The traces of `hosts` once they are gone, or those left after 30 s. A loop device can
/// outlive its unmount for a moment: it is detached (autoclear) once no mount namespace
/// holds a copy of its mount, such as one a process of another test made meanwhile.
async fn gone(hosts: &[Host], cluster_dir: &Path) -> Vec<String> {
    let cleared = bazaar_testkit::eventually(Duration::from_secs(30), || async {
        traces(hosts, cluster_dir).is_empty().then_some(())
    })
    .await;
    match cleared {
        Ok(()) => Vec::new(),
        Err(_) => traces(hosts, cluster_dir),
    }
}

/// Starts the cluster's workloads: an image machine with a volume, one without, and a
/// process machine. Returns the image machine with the volume.
async fn start_workloads(env: &HashMap<String, String>, image: &str) -> String {
    cli(env, &["apps", "create", "keep"]);
    let http = reqwest::Client::new();
    let api = &env["BAZAAR_API_URL"];
    let call = |method: reqwest::Method, path: &str, body: Value| {
        http.request(method, format!("{api}/v1{path}"))
            .bearer_auth(&env["BAZAAR_TOKEN"])
            .json(&body)
            .send()
    };
    let v: Value = call(
        reqwest::Method::POST,
        "/apps/keep/volumes",
        json!({"name": "data", "size_gb": 1}),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let volume = v["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"))
        .to_string();
    let config = json!({"image": image, "init": {"exec": ["/bin/sleep", "1000"]},
                        "mounts": [{"volume": volume, "path": "/data"}]});
    let m: Value = call(
        reqwest::Method::POST,
        "/apps/keep/machines",
        json!({"config": config}),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let id = m["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{m}"))
        .to_string();
    let waited = call(
        reqwest::Method::GET,
        &format!("/apps/keep/machines/{id}/wait?state=started&timeout=60"),
        json!({}),
    )
    .await
    .unwrap();
    assert!(
        waited.status().is_success(),
        "{}",
        waited.text().await.unwrap()
    );
    cli(
        env,
        &[
            "machine",
            "run",
            "-a",
            "keep",
            "--image",
            image,
            "--",
            "/bin/sleep",
            "1000",
        ],
    );
    cli(
        env,
        &["machine", "run", "-a", "keep", "--", "sleep", "1000"],
    );
    id
}

fn signal_and_wait(mut child: Child, sig: i32) {
    bazaar_testkit::signal(child.id() as i32, sig);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(
                sig == libc::SIGKILL || status.success(),
                "dev exited with {status}"
            );
            return;
        }
        assert!(Instant::now() < deadline, "dev did not stop");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The pids of the agents whose data dir is below `dir`.
fn agent_pids(dir: &Path) -> Vec<i32> {
    let needle = dir.display().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse::<i32>().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            (args.get(1).map(String::as_str) == Some("agent")
                && args.iter().any(|a| a.starts_with(&needle)))
            .then_some(pid)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_or_reset_host_leaves_nothing_on_the_machine() {
    assert!(is_root(), "this test needs root (CI runs as root)");
    let registry = TestRegistry::start(None);
    let reg =
        bazaar_image::Registry::new(&registry.host, bazaar_image::Auth::Anonymous, true).unwrap();
    let layer = busybox_rootfs_layer(&["sh", "sleep"], ("etc/motd", b"cleanup\n"));
    let arch = bazaar_image::manifest::Platform::current().architecture;
    let config = config_with(
        &[&layer],
        arch.as_str(),
        json!({"Cmd": ["/bin/sleep", "1000"]}),
    );
    push_with_config(&reg, "sleeper", "1", &[&layer], &config).await;
    let image = format!("{}/sleeper:1", registry.host);

    let tmp = tempfile::tempdir().unwrap();
    let dir = std::fs::canonicalize(tmp.path()).unwrap().join("cluster");
    let _cleanup = CleanUpOnFailure(dir.clone());
    let base = free_ports();
    let gossip = loop {
        let g = free_ports();
        if g.abs_diff(base) > 20 {
            break g;
        }
    };
    let dev = start_dev(&dir, base, gossip);
    let env = read_env(&dir);
    let with_volume = start_workloads(&env, &image).await;
    let mut hosts = Vec::new();
    for i in 0..HOSTS {
        let url = format!("http://127.0.0.1:{}", base + i as u16);
        let info = bazaar_client::HostClient::new(&url, &env["BAZAAR_CLUSTER_SECRET"])
            .info()
            .await
            .unwrap();
        hosts.push(Host::read(dir.join(format!("host-{i}")), info.id));
    }
    // The cluster secret is not on any agent's command line (ps shows those).
    let secret = &env["BAZAAR_CLUSTER_SECRET"];
    for pid in agent_pids(&dir) {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        assert!(
            !String::from_utf8_lossy(&cmdline).contains(secret.as_str()),
            "the secret shows in ps"
        );
    }
    let before = traces(&hosts, &dir);
    for kind in ["netns", "link", "nft", "mount", "loop", "cgroup", "process"] {
        assert!(
            before.iter().any(|t| t.starts_with(kind)),
            "a running cluster has a {kind}: {before:#?}"
        );
    }

    // Ctrl-C: every trace goes, the data stays.
    signal_and_wait(dev, libc::SIGINT);
    assert_eq!(
        gone(&hosts, &dir).await,
        Vec::<String>::new(),
        "left after SIGINT"
    );

    // The data is enough to resume: the machine with its volume runs again.
    let dev = start_dev(&dir, base, gossip);
    let env = read_env(&dir);
    let state = bazaar_testkit::eventually(Duration::from_secs(60), || async {
        let out = Command::new(EXE)
            .args(["machine", "status", "-a", "keep", &with_volume, "--json"])
            .env("BAZAAR_API_URL", &env["BAZAAR_API_URL"])
            .env("BAZAAR_TOKEN", &env["BAZAAR_TOKEN"])
            .output()
            .ok()?;
        let m: Value = serde_json::from_slice(&out.stdout).ok()?;
        (m["state"] == "started").then_some(m)
    })
    .await;
    assert!(
        state.is_ok(),
        "the machine did not come back after a resume"
    );

    // kill -9 of dev and of every agent: workloads, mounts and network stay behind...
    signal_and_wait(dev, libc::SIGKILL);
    let pids = agent_pids(&dir);
    assert_eq!(pids.len(), HOSTS, "agents of the cluster: {pids:?}");
    for pid in pids {
        bazaar_testkit::signal(pid, libc::SIGKILL);
    }
    let _ = bazaar_testkit::eventually(Duration::from_secs(10), || async {
        agent_pids(&dir).is_empty().then_some(())
    })
    .await;
    let left = traces(&hosts, &dir);
    assert!(
        left.iter().any(|t| t.starts_with("mount")) && left.iter().any(|t| t.starts_with("netns")),
        "{left:#?}"
    );

    // ... until `bazaar host reset` of each host.
    for h in &hosts {
        let out = Command::new(EXE)
            .args(["host", "reset", "--data-dir"])
            .arg(&h.dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "reset {}: {}",
            h.dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            std::fs::read_dir(&h.dir).unwrap().count(),
            0,
            "the data dir is emptied"
        );
    }
    assert_eq!(
        gone(&hosts, &dir).await,
        Vec::<String>::new(),
        "left after reset"
    );
}

#[test]
fn reset_refuses_a_running_host_and_a_directory_that_is_not_one() {
    let agent = agent();
    let out = Command::new(EXE)
        .args(["host", "reset", "--data-dir"])
        .arg(&agent.data_dir)
        .output()
        .unwrap();
    assert!(!out.status.success(), "reset a running host");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("still running"), "{stderr}");
    assert!(
        agent.data_dir.join("agent.redb").exists(),
        "nothing is deleted"
    );

    // Nor a directory that is not a host's data dir (a dev cluster's, say).
    let other = tempfile::tempdir().unwrap();
    std::fs::write(other.path().join("precious"), b"keep").unwrap();
    let out = Command::new(EXE)
        .args(["host", "reset", "--data-dir"])
        .arg(other.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not a host's data dir"), "{stderr}");
    assert!(other.path().join("precious").exists(), "nothing is deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_started_again_removes_what_its_killed_run_left() {
    assert!(is_root(), "this test needs root (CI runs as root)");
    let registry = TestRegistry::start(None);
    let reg =
        bazaar_image::Registry::new(&registry.host, bazaar_image::Auth::Anonymous, true).unwrap();
    let layer = busybox_rootfs_layer(&["sh", "sleep"], ("etc/motd", b"restart\n"));
    let arch = bazaar_image::manifest::Platform::current().architecture;
    let config = config_with(
        &[&layer],
        arch.as_str(),
        json!({"Cmd": ["/bin/sleep", "1000"]}),
    );
    push_with_config(&reg, "sleeper", "1", &[&layer], &config).await;
    let image = format!("{}/sleeper:1", registry.host);

    let mut agent = agent();
    let fly = Fly::new(&agent);
    fly.create_app("left").await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (status, m) = fly
            .post(
                "/apps/left/machines",
                json!({"config": {"image": image, "init": {"exec": ["/bin/sleep", "1000"]}}}),
            )
            .await;
        assert!(status.is_success(), "{m}");
        let id = m["id"].as_str().unwrap().to_string();
        fly.wait_state("left", &id, "started").await;
        ids.push(id);
    }
    let (kept, destroyed) = ids.split_first().unwrap();
    for id in destroyed {
        let (status, v) = fly
            .delete(&format!("/apps/left/machines/{id}?force=true"))
            .await;
        assert!(status.is_success(), "{v}");
        fly.wait_state("left", id, "destroyed").await;
    }
    let (status, v) = fly
        .post(&format!("/apps/left/machines/{kept}/stop"), json!({}))
        .await;
    assert!(status.is_success(), "{v}");
    fly.wait_state("left", kept, "stopped").await;

    let info = agent.client().info().await.unwrap();
    let bridge = bazaar_agent::network::bridge_name(&info.id);
    let namespaces = || -> Vec<String> {
        run_text("ip", &["netns", "list"])
            .lines()
            .filter_map(|l| l.split(' ').next())
            .filter(|n| n.starts_with(&format!("{bridge}-")))
            .map(str::to_string)
            .collect()
    };
    // The kept machine's namespace is named after its address's index in the subnet.
    let (_, m) = fly.get(&format!("/apps/left/machines/{kept}")).await;
    let ip: std::net::Ipv4Addr = m["private_ip"].as_str().unwrap().parse().unwrap();
    let network = std::fs::read_to_string(agent.data_dir.join("network")).unwrap();
    let base: std::net::Ipv4Addr = network.split('/').next().unwrap().parse().unwrap();
    let kept_ns = format!("{bridge}-{}", u32::from(ip) - u32::from(base));
    // A namespace no machine holds, as a run killed between deleting a machine and its
    // namespace leaves.
    let stray = format!("{bridge}-200");
    run_text("ip", &["netns", "add", &stray]);
    let rootfs = agent
        .data_dir
        .join("machines")
        .join(kept)
        .join("layer/rootfs");
    let mounted = || {
        let target = rootfs.display().to_string();
        std::fs::read_to_string("/proc/mounts")
            .unwrap()
            .lines()
            .any(|l| l.split(' ').nth(1) == Some(target.as_str()))
    };
    assert!(namespaces().contains(&kept_ns), "{:?}", namespaces());
    assert!(mounted(), "the stopped machine's root is mounted");

    agent.kill9();
    agent.spawn(&[]).unwrap();
    // The stray namespace and the stale root go; the stopped machine keeps its address's
    // namespace, and at most four more are kept ahead.
    let settled = bazaar_testkit::eventually(Duration::from_secs(20), || async {
        let now = namespaces();
        (!now.contains(&stray) && now.contains(&kept_ns) && now.len() <= 5 && !mounted())
            .then_some(())
    })
    .await;
    assert!(
        settled.is_ok(),
        "after the restart: namespaces {:?}, root mounted: {}",
        namespaces(),
        mounted()
    );
    // The machine starts again on a fresh root.
    let (status, v) = fly
        .post(&format!("/apps/left/machines/{kept}/start"), json!({}))
        .await;
    assert!(status.is_success(), "{v}");
    fly.wait_state("left", kept, "started").await;
    assert!(mounted());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_secret_comes_from_a_file_not_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("secret");
    std::fs::write(&secret_file, "from-a-file-0123456789\n").unwrap();
    let mut opts = bazaar_testkit::AgentOptions::new(EXE);
    opts.extra_args = vec![
        "--cluster-secret-file".into(),
        secret_file.display().to_string(),
    ];
    let agent = bazaar_testkit::TestAgent::start(opts).unwrap();
    let with = |secret: &str| bazaar_client::HostClient::new(&agent.url(), secret);
    assert!(with("from-a-file-0123456789").info().await.is_ok());
    // The file wins over the environment the test kit sets.
    assert!(with(bazaar_testkit::TEST_SECRET).info().await.is_err());
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", agent.pid().unwrap())).unwrap();
    assert!(!String::from_utf8_lossy(&cmdline).contains("from-a-file"));
}
