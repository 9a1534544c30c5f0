//! gVisor machines end to end, as root (issue 33 item 2): a machine with
//! `config.runtime = "gvisor"`, made from an image in the local registry (Debian's
//! `docker-registry` on loopback), runs under `runsc` on the platform the host found at start
//! (published in its host row): it serves through the proxy on its own address, resolves
//! another machine of its app by `.internal` (and, like a runc machine, cannot connect to
//! a machine of the same host directly), writes to its volume, answers
//! `exec` from inside gVisor's kernel, gets its stop signal, is stopped, started, restarted
//! and re-adopted after the agent's kill -9, and leaves nothing behind when destroyed. The
//! escapes the isolation tests probe (host files, other apps, host listeners, `/proc/kcore`,
//! `unshare`, raw sockets) are tried from inside and refused.

use crate::common;

use bazaar_testkit::images::{
    busybox_rootfs_layer, config_with, ensure_packages, push_with_config, TestRegistry,
};
use bazaar_testkit::start_cluster;
use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

/// What the machine's own first process does before it serves: the escapes that only the
/// machine's processes are held from (the bundle's seccomp list is applied by the Sentry to
/// them; `runsc exec` runs commands without it), written down for the test to read; then it
/// serves, and says so when its stop signal comes.
const PROBE_AND_SERVE: &str = "for f in -U -n; do unshare $f true 2>>/tmp/probes; \
     echo unshare$f=$? >>/tmp/probes; done; \
     trap 'echo got its stop signal; exit 0' INT TERM; httpd -f -p 8080 -h /www & wait";

async fn push_image(registry: &TestRegistry) -> String {
    let reg =
        bazaar_image::Registry::new(&registry.host, bazaar_image::Auth::Anonymous, true).unwrap();
    let layer = busybox_rootfs_layer(
        &[
            "sh", "httpd", "cat", "id", "nc", "printf", "echo", "ls", "sleep", "unshare", "arping",
            "nslookup", "dmesg", "wc", "head", "dd",
        ],
        ("etc/motd", b"gvisor\n"),
    );
    let config = config_with(
        &[&layer],
        bazaar_image::manifest::Platform::current()
            .architecture
            .as_str(),
        json!({"Cmd": ["/bin/sh", "-c", PROBE_AND_SERVE], "Env": ["PATH=/bin"]}),
    );
    push_with_config(&reg, "gv", "1", &[&layer], &config).await;
    format!("{}/gv:1", registry.host)
}

fn config(image: &str, runtime: &str) -> Value {
    json!({
        "image": image,
        "runtime": runtime,
        "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256},
        "services": [{"protocol": "tcp", "internal_port": 8080,
                      "ports": [{"port": 80, "handlers": ["http"]}]}],
    })
}

async fn create(fly: &Fly, app: &str, config: Value) -> (String, Ipv4Addr) {
    let (s, m) = fly
        .post(&format!("/apps/{app}/machines"), json!({"config": config}))
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let ip = m["private_ip"].as_str().unwrap().parse().unwrap();
    (m["id"].as_str().unwrap().to_string(), ip)
}

/// Waits until the machine is `state`; otherwise fails with its events and its log.
async fn reaches(fly: &Fly, data_dir: &Path, app: &str, id: &str, state: &str) {
    let (s, w) = fly
        .get(&format!(
            "/apps/{app}/machines/{id}/wait?state={state}&timeout=30"
        ))
        .await;
    if s != StatusCode::OK {
        let (_, ev) = fly.get(&format!("/apps/{app}/machines/{id}/events")).await;
        panic!(
            "machine {id} never {state}: {w}\nevents: {ev}\nlog: {}",
            log(data_dir, id)
        );
    }
}

fn log(data_dir: &Path, id: &str) -> String {
    std::fs::read_to_string(data_dir.join("machines").join(id).join("output.log"))
        .unwrap_or_default()
}

/// Runs `cmd` with `sh -c` in the machine once exec answers (retried for a while, as
/// after a restart); its stdout.
async fn sh(fly: &Fly, app: &str, id: &str, cmd: &str) -> String {
    let v = bazaar_testkit::eventually(Duration::from_secs(20), || async {
        let (s, v) = fly
            .post(
                &format!("/apps/{app}/machines/{id}/exec"),
                json!({"command": ["/bin/sh", "-c", cmd], "timeout": 20}),
            )
            .await;
        (s == StatusCode::OK).then_some(v)
    })
    .await
    .unwrap_or_else(|_| panic!("exec {cmd:?} never answered 200"));
    v["stdout"].as_str().unwrap_or_default().to_string()
}

async fn served(proxy: &str, app: &str) -> String {
    bazaar_testkit::eventually(Duration::from_secs(20), || async {
        let resp = reqwest::Client::new()
            .get(format!("{proxy}/index.html"))
            .header("host", format!("{app}.localhost"))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .ok()?;
        (resp.status() == 200).then_some(resp.text().await.ok()?)
    })
    .await
    .expect("served through the proxy")
}

/// Host processes whose command line names `needle` (runsc's sandbox, gofer and its
/// `run`, which name the machine's run directory).
fn processes_naming(needle: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(needle))
        .collect()
}

/// Removes a host file when the test ends, however it ends.
struct HostFile(std::path::PathBuf);

impl Drop for HostFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gvisor_machines_run_sandboxed_with_their_address_volume_and_lifecycle() {
    if !bazaar_testkit::can_run(is_root(), "root (image machines)") {
        return;
    }
    assert!(
        Path::new("/usr/bin/runsc").exists(),
        "gVisor tests need runsc (scripts/test installs it)"
    );
    ensure_packages();
    let registry = TestRegistry::start(None);
    let image = push_image(&registry).await;
    let mut agents = start_cluster(Path::new(EXE), 1, |_, _| {}).unwrap();
    let agent = &agents[0];
    let data_dir = agent.data_dir.clone();
    let fly = Fly::new(agent);

    // The host found a platform at start and says which; it does not refuse gVisor.
    let hosts = agent.client().catalog_hosts().await.unwrap();
    let labels = &hosts[0].labels;
    assert_eq!(
        labels.get("gvisor_platform").map(String::as_str),
        Some("ptrace"),
        "{labels:?}"
    );
    assert!(!labels.contains_key("cannot_run_gvisor"), "{labels:?}");
    // `bazaar hosts` shows it in its gvisor column.
    let out = std::process::Command::new(EXE)
        .arg("hosts")
        .env("BAZAAR_API_URL", agent.url())
        .env("BAZAAR_CLUSTER_SECRET", bazaar_testkit::TEST_SECRET)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let table = String::from_utf8(out.stdout).unwrap();
    let header = table.lines().find(|l| l.contains("host")).unwrap();
    let row = table.lines().find(|l| l.contains(&hosts[0].id)).unwrap();
    let column = |line: &str| {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let at = header
            .split('|')
            .map(str::trim)
            .position(|c| c == "gvisor")
            .unwrap_or_else(|| panic!("no gvisor column: {table}"));
        cells.get(at).map(|c| c.to_string())
    };
    assert_eq!(column(row).as_deref(), Some("ptrace"), "{table}");

    fly.create_app("web").await;
    fly.create_app("other").await;
    let (s, vol) = fly
        .post("/apps/web/volumes", json!({"name": "data", "size_gb": 1}))
        .await;
    assert_eq!(s, StatusCode::OK, "{vol}");
    let vol_id = vol["id"].as_str().unwrap().to_string();

    // A runc machine of the same app, and one of another app, both serving.
    let (peer, peer_ip) = create(&fly, "web", config(&image, "runc")).await;
    let (stranger, stranger_ip) = create(&fly, "other", config(&image, "runc")).await;
    // The gVisor machine, with the volume.
    let mut gv_config = config(&image, "gvisor");
    gv_config["mounts"] = json!([{"volume": vol_id, "path": "/data"}]);
    let (id, ip) = create(&fly, "web", gv_config).await;
    for (app, m) in [("web", &peer), ("other", &stranger), ("web", &id)] {
        reaches(&fly, &data_dir, app, m, "started").await;
    }
    let run_dir = |id: &str| {
        let runs: Vec<_> = std::fs::read_dir(data_dir.join("machines").join(id).join("runs"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        runs.into_iter()
            .max_by_key(|r| {
                r.file_name()
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .parse::<u64>()
                    .unwrap()
            })
            .unwrap()
    };
    let bundle: Value =
        serde_json::from_slice(&std::fs::read(run_dir(&id).join("bundle/config.json")).unwrap())
            .unwrap();
    assert!(
        processes_naming(&run_dir(&id).display().to_string())
            .iter()
            .any(|p| p.contains("runsc") && p.contains("--platform=ptrace")),
        "not under runsc"
    );
    assert!(
        bundle["linux"]["namespaces"]
            .to_string()
            .contains("network"),
        "{bundle}"
    );

    // Inside gVisor's kernel, on its own address, with the image's root.
    let out = sh(
        &fly,
        "web",
        &id,
        "dmesg | head -3; id -u; echo $FLY_PRIVATE_IP",
    )
    .await;
    assert!(out.contains("gVisor"), "not gVisor's kernel: {out}");
    assert!(out.ends_with(&format!("\n0\n{ip}\n")), "{out}");
    let host_version = std::fs::read_to_string("/proc/version").unwrap();
    let version = sh(&fly, "web", &id, "cat /proc/version").await;
    assert_ne!(version, host_version, "the host's kernel answered");

    // Served through the proxy (both machines of the app answer the same page).
    assert_eq!(
        served(&agent.proxy_url(), "web").await,
        "hello from the image\n"
    );

    // The other machine of its app by name, through the internal DNS on its gateway.
    let out = sh(
        &fly,
        "web",
        &id,
        &format!("nslookup {peer}.vm.web.internal 2>&1"),
    )
    .await;
    assert!(out.contains(&peer_ip.to_string()), "{out}");
    let fetch = |ip: Ipv4Addr| {
        format!(
            "printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {ip} 8080 2>&1; echo rc=$?"
        )
    };
    // Its own address answers from inside; a machine on the same host does not, in either
    // direction, as between runc machines (bridge ports isolated: machines of one host talk
    // through the proxy, and to other hosts' machines over the mesh).
    // (Its server starts once its probes are done: until then nothing answers.)
    let own = bazaar_testkit::eventually(Duration::from_secs(20), || async {
        let out = sh(&fly, "web", &id, &fetch(ip)).await;
        out.contains("hello from the image").then_some(out)
    })
    .await;
    assert!(own.is_ok(), "its own address never answered from inside");
    let out = sh(&fly, "web", &id, &fetch(peer_ip)).await;
    assert!(!out.contains("hello"), "reached the peer directly: {out}");
    let out = sh(&fly, "web", &peer, &fetch(ip)).await;
    assert!(
        !out.contains("hello"),
        "the peer reached it directly: {out}"
    );

    // Its volume, through the gofer: what it writes is on the host's volume.
    sh(&fly, "web", &id, "echo kept > /data/x").await;
    let on_host = data_dir.join("volumes").join(&vol_id).join("mnt/x");
    assert_eq!(std::fs::read_to_string(&on_host).unwrap(), "kept\n");

    // Escapes, refused. Another app's machine:
    let out = sh(&fly, "web", &id, &fetch(stranger_ip)).await;
    assert!(!out.contains("hello"), "reached another app: {out}");
    // A host file (it has only its image's root):
    let secret =
        HostFile(std::env::temp_dir().join(format!("bazaar-gvisor-{}", std::process::id())));
    std::fs::write(&secret.0, "host secret\n").unwrap();
    let out = sh(
        &fly,
        "web",
        &id,
        &format!("cat {} 2>&1; ls /", secret.0.display()),
    )
    .await;
    assert!(!out.contains("host secret"), "{out}");
    assert!(!out.contains("machines") && !out.contains("home"), "{out}");
    // The kernel's memory:
    let out = sh(&fly, "web", &id, "cat /proc/kcore 2>/dev/null | wc -c").await;
    assert_eq!(out.trim(), "0", "{out}");
    // New namespaces (the machine's own processes, under the bundle's seccomp list):
    let probes = sh(&fly, "web", &id, "cat /tmp/probes").await;
    assert!(
        probes.contains("unshare-U=1") && probes.contains("unshare-n=1"),
        "{probes}"
    );
    // Raw sockets:
    let network = std::fs::read_to_string(data_dir.join("network")).unwrap();
    let subnet: Ipv4Addr = network
        .lines()
        .next()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let gateway = Ipv4Addr::from(u32::from(subnet) + 1);
    let out = sh(
        &fly,
        "web",
        &id,
        &format!("arping -c 1 -w 1 -I eth0 {gateway} 2>&1; echo rc=$?"),
    )
    .await;
    assert!(!out.contains("rc=0"), "{out}");
    // The host's listeners, through the gateway:
    let listener = std::net::TcpListener::bind((gateway, 0)).unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let out = sh(
        &fly,
        "web",
        &id,
        &format!("echo hi | nc -w 2 {gateway} {port} 2>&1; echo rc=$?"),
    )
    .await;
    assert!(
        matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the machine connected to a host listener: {out}"
    );
    assert!(!out.contains("rc=0"), "{out}");

    // Held to its memory as a runc machine is: 400 MB in a 256 MB machine is killed by
    // its cgroup, and the exit event says OOM.
    let mut hog = config(&image, "gvisor");
    hog["init"] =
        json!({"exec": ["/bin/dd", "if=/dev/zero", "of=/dev/null", "bs=400M", "count=1"]});
    hog["services"] = json!([]);
    hog["restart"] = json!({"policy": "no"});
    let (hog, _) = create(&fly, "other", hog).await;
    let exit = bazaar_testkit::eventually(Duration::from_secs(30), || async {
        let (_, ev) = fly.get(&format!("/apps/other/machines/{hog}/events")).await;
        ev.as_array()?.iter().find(|e| e["type"] == "exit").cloned()
    })
    .await
    .expect("the hog exits");
    assert_eq!(exit["request"]["exit_event"]["oom_killed"], true, "{exit}");

    // Stopped: its stop signal (SIGINT, Fly's default) reaches its first process (`runsc
    // run` does not forward signals: `runsc kill` delivers it).
    let (s, v) = fly
        .post(&format!("/apps/web/machines/{id}/stop"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    reaches(&fly, &data_dir, "web", &id, "stopped").await;
    assert!(
        log(&data_dir, &id).contains("got its stop signal"),
        "{}",
        log(&data_dir, &id)
    );
    // Started again: the volume kept its data, the rest starts from the image.
    sh(&fly, "web", &peer, "true").await;
    let (s, v) = fly
        .post(&format!("/apps/web/machines/{id}/start"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    reaches(&fly, &data_dir, "web", &id, "started").await;
    assert_eq!(sh(&fly, "web", &id, "cat /data/x").await, "kept\n");
    // Restarted.
    let (s, v) = fly
        .post(&format!("/apps/web/machines/{id}/restart"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    reaches(&fly, &data_dir, "web", &id, "started").await;

    // Suspended where gVisor allows it (its cgroup frozen), and resumed.
    let (s, v) = fly
        .post(&format!("/apps/web/machines/{id}/suspend"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    reaches(&fly, &data_dir, "web", &id, "suspended").await;
    let (s, v) = fly
        .post(&format!("/apps/web/machines/{id}/start"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    reaches(&fly, &data_dir, "web", &id, "started").await;

    // The agent killed with -9 and restarted: the same run is adopted again.
    sh(&fly, "web", &id, "echo alive > /tmp/marker").await;
    let before = run_dir(&id);
    agents[0].kill9();
    agents[0].restart().unwrap();
    let agent = &agents[0];
    let fly = Fly::new(agent);
    assert_eq!(sh(&fly, "web", &id, "cat /tmp/marker").await, "alive\n");
    assert_eq!(run_dir(&id), before);

    // Destroyed: no runsc process, cgroup, mount or directory of it is left.
    let host_id = agent.client().info().await.unwrap().id;
    let (s, v) = fly
        .delete(&format!("/apps/web/machines/{id}?force=true"))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let machine_dir = data_dir.join("machines").join(&id);
    let leftovers = || {
        let mut left: Vec<String> = std::fs::read_dir("/sys/fs/cgroup")
            .unwrap()
            .flatten()
            .map(|h| h.path().join("bazaar").join(&host_id).join(&id))
            .filter(|p| p.exists())
            .map(|p| p.display().to_string())
            .collect();
        left.extend(processes_naming(&machine_dir.display().to_string()));
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
        left.extend(
            mounts
                .lines()
                .filter(|l| l.contains(&id))
                .map(str::to_string),
        );
        if machine_dir.exists() {
            left.push(machine_dir.display().to_string());
        }
        left
    };
    let clean = bazaar_testkit::eventually(Duration::from_secs(15), || async {
        leftovers().is_empty().then_some(())
    })
    .await;
    assert!(clean.is_ok(), "left behind: {:?}", leftovers());
}
