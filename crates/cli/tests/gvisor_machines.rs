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

use crate::sandbox_support::*;
use bazaar_testkit::images::{ensure_packages, TestRegistry};
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

/// A gVisor sandbox starts in a fraction of a second.
const PATIENCE: Patience = Patience {
    wait_secs: 30,
    exec: Duration::from_secs(20),
    exec_timeout_secs: 20,
    serve: Duration::from_secs(20),
};

async fn push_image(registry: &TestRegistry) -> String {
    let applets = [
        "sh", "httpd", "cat", "id", "nc", "printf", "echo", "ls", "sleep", "unshare", "arping",
        "nslookup", "dmesg", "wc", "head", "dd",
    ];
    push_busybox(registry, "gv", &applets, b"gvisor\n", PROBE_AND_SERVE).await
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
        reaches(&fly, &data_dir, PATIENCE, (app, m), "started").await;
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
        PATIENCE,
        ("web", &id),
        "dmesg | head -3; id -u; echo $FLY_PRIVATE_IP",
    )
    .await;
    assert!(out.contains("gVisor"), "not gVisor's kernel: {out}");
    assert!(out.ends_with(&format!("\n0\n{ip}\n")), "{out}");
    let host_version = std::fs::read_to_string("/proc/version").unwrap();
    let version = sh(&fly, PATIENCE, ("web", &id), "cat /proc/version").await;
    assert_ne!(version, host_version, "the host's kernel answered");

    // Served through the proxy (both machines of the app answer the same page).
    assert_eq!(
        served(&agent.proxy_url(), PATIENCE, "web").await,
        "hello from the image\n"
    );

    // The other machine of its app by name, through the internal DNS on its gateway.
    let out = sh(
        &fly,
        PATIENCE,
        ("web", &id),
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
        let out = sh(&fly, PATIENCE, ("web", &id), &fetch(ip)).await;
        out.contains("hello from the image").then_some(out)
    })
    .await;
    assert!(own.is_ok(), "its own address never answered from inside");
    let out = sh(&fly, PATIENCE, ("web", &id), &fetch(peer_ip)).await;
    assert!(!out.contains("hello"), "reached the peer directly: {out}");
    let out = sh(&fly, PATIENCE, ("web", &peer), &fetch(ip)).await;
    assert!(
        !out.contains("hello"),
        "the peer reached it directly: {out}"
    );

    // Its volume, through the gofer: what it writes is on the host's volume.
    sh(&fly, PATIENCE, ("web", &id), "echo kept > /data/x").await;
    let on_host = data_dir.join("volumes").join(&vol_id).join("mnt/x");
    assert_eq!(std::fs::read_to_string(&on_host).unwrap(), "kept\n");

    // Escapes, refused. Another app's machine:
    let out = sh(&fly, PATIENCE, ("web", &id), &fetch(stranger_ip)).await;
    assert!(!out.contains("hello"), "reached another app: {out}");
    // A host file (it has only its image's root):
    let secret =
        HostFile(std::env::temp_dir().join(format!("bazaar-gvisor-{}", std::process::id())));
    std::fs::write(&secret.0, "host secret\n").unwrap();
    let out = sh(
        &fly,
        PATIENCE,
        ("web", &id),
        &format!("cat {} 2>&1; ls /", secret.0.display()),
    )
    .await;
    assert!(!out.contains("host secret"), "{out}");
    assert!(!out.contains("machines") && !out.contains("home"), "{out}");
    // The kernel's memory:
    let out = sh(
        &fly,
        PATIENCE,
        ("web", &id),
        "cat /proc/kcore 2>/dev/null | wc -c",
    )
    .await;
    assert_eq!(out.trim(), "0", "{out}");
    // New namespaces (the machine's own processes, under the bundle's seccomp list):
    let probes = sh(&fly, PATIENCE, ("web", &id), "cat /tmp/probes").await;
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
        PATIENCE,
        ("web", &id),
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
        PATIENCE,
        ("web", &id),
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
    reaches(&fly, &data_dir, PATIENCE, ("web", &id), "stopped").await;
    assert!(
        log(&data_dir, &id).contains("got its stop signal"),
        "{}",
        log(&data_dir, &id)
    );
    // Started again: the volume kept its data, the rest starts from the image.
    sh(&fly, PATIENCE, ("web", &peer), "true").await;
    let (s, v) = fly
        .post(&format!("/apps/web/machines/{id}/start"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    reaches(&fly, &data_dir, PATIENCE, ("web", &id), "started").await;
    assert_eq!(
        sh(&fly, PATIENCE, ("web", &id), "cat /data/x").await,
        "kept\n"
    );
    // Restarted.
    let (s, v) = fly
        .post(&format!("/apps/web/machines/{id}/restart"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    reaches(&fly, &data_dir, PATIENCE, ("web", &id), "started").await;

    // Suspended where gVisor allows it (its cgroup frozen), and resumed.
    let (s, v) = fly
        .post(&format!("/apps/web/machines/{id}/suspend"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    reaches(&fly, &data_dir, PATIENCE, ("web", &id), "suspended").await;
    let (s, v) = fly
        .post(&format!("/apps/web/machines/{id}/start"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    reaches(&fly, &data_dir, PATIENCE, ("web", &id), "started").await;

    // The agent killed with -9 and restarted: the same run is adopted again.
    sh(&fly, PATIENCE, ("web", &id), "echo alive > /tmp/marker").await;
    let before = run_dir(&id);
    agents[0].kill9();
    agents[0].restart().unwrap();
    let agent = &agents[0];
    let fly = Fly::new(agent);
    assert_eq!(
        sh(&fly, PATIENCE, ("web", &id), "cat /tmp/marker").await,
        "alive\n"
    );
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
