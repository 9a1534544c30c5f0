//! microVM machines end to end, as root (issue 33 item 3): an agent started with
//! `--vm-kernel` (the kernel of `scripts/vm-kernel`, `BAZAAR_VM_KERNEL`) and
//! `--vm-allow-tcg` says so in its host row and runs a machine with
//! `config.runtime = "microvm"`, made from an image in the local registry, in a QEMU microVM
//! under TCG: `exec` answers from the guest's kernel, the machine serves through the proxy
//! on its own address, its console is its log, its stop signal reaches its first process
//! inside the guest and the workload's exit code is the machine's, it is re-adopted after
//! the agent's kill -9, and nothing of it (QEMU, disks, tap) is left once destroyed. From
//! inside, nothing of the host is reachable (its files, its listeners, other apps'
//! machines), while the guest's root may make namespaces in its own kernel.

use crate::common;
#[path = "../../microvm/tests/support/mod.rs"]
mod support;

use crate::sandbox_support::*;
use bazaar_testkit::images::{ensure_packages, TestRegistry};
use bazaar_testkit::start_cluster;
use common::*;
use reqwest::StatusCode;
use serde_json::json;
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

/// The first process: says it booted, serves, and says so when its stop signal comes.
const SERVE: &str = "echo booted in the guest; \
     trap 'echo got its stop signal; exit 0' INT TERM; httpd -f -p 8080 -h /www & wait";

/// A microVM boots under TCG in seconds.
const PATIENCE: Patience = Patience {
    wait_secs: 60,
    exec: Duration::from_secs(90),
    exec_timeout_secs: 10,
    serve: Duration::from_secs(90),
};

async fn push_image(registry: &TestRegistry) -> String {
    let applets = [
        "sh", "httpd", "cat", "nc", "printf", "echo", "ls", "sleep", "unshare", "uname",
    ];
    push_busybox(registry, "vm", &applets, b"microvm\n", SERVE).await
}

/// Network namespaces of the host that hold a microVM's tap.
fn namespaces_with_a_tap() -> Vec<String> {
    std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|ns| {
            std::process::Command::new("ip")
                .args(["-n", ns, "link", "show", "vmtap0"])
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn microvm_machines_boot_serve_stop_and_leave_nothing() {
    if !bazaar_testkit::can_run(is_root(), "root (image machines)") {
        return;
    }
    let kernel = support::kernel_path();
    let qemu = Path::new("/usr/bin/qemu-system-x86_64").exists();
    if !bazaar_testkit::can_run(
        kernel.is_file() && qemu,
        "a guest kernel (scripts/vm-kernel, or BAZAAR_VM_KERNEL) and qemu-system-x86_64",
    ) {
        return;
    }
    ensure_packages();
    let registry = TestRegistry::start(None);
    let image = push_image(&registry).await;
    let init = support::vminit();
    let mut agents = start_cluster(Path::new(EXE), 1, |_, opts| {
        opts.extra_args.extend([
            "--vm-kernel".to_string(),
            kernel.display().to_string(),
            "--vm-allow-tcg".to_string(),
        ]);
        opts.env
            .push(("BAZAAR_VMINIT".into(), init.display().to_string()));
    })
    .unwrap();
    let agent = &agents[0];
    let data_dir = agent.data_dir.clone();
    let fly = Fly::new(agent);

    // The host found QEMU, the kernel and the init at start, and says it runs microVMs
    // under TCG (this machine's /dev/kvm is not hardware's).
    let hosts = agent.client().catalog_hosts().await.unwrap();
    let labels = &hosts[0].labels;
    assert_eq!(
        labels.get("microvm_accel").map(String::as_str),
        Some("tcg"),
        "{labels:?}"
    );
    assert!(!labels.contains_key("cannot_run_microvm"), "{labels:?}");

    fly.create_app("web").await;
    fly.create_app("other").await;
    let (stranger, stranger_ip) = create(&fly, "other", config(&image, "runc")).await;
    let (id, ip) = create(&fly, "web", config(&image, "microvm")).await;
    reaches(&fly, &data_dir, PATIENCE, ("other", &stranger), "started").await;
    reaches(&fly, &data_dir, PATIENCE, ("web", &id), "started").await;
    let machine_dir = data_dir.join("machines").join(&id);
    assert!(
        processes_naming(&machine_dir.display().to_string())
            .iter()
            .any(|p| p.contains("qemu-system-x86_64") && p.contains("accel=tcg")),
        "no QEMU runs the machine"
    );

    // `exec` answers from the guest's own kernel, with the machine's address.
    let host_release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let out = sh(
        &fly,
        PATIENCE,
        ("web", &id),
        "uname -r; echo $FLY_PRIVATE_IP",
    )
    .await;
    let (release, private_ip) = out.split_once('\n').unwrap_or((&out, ""));
    assert_ne!(release, host_release.trim(), "the host's kernel answered");
    assert!(release.ends_with("-cloud-amd64"), "{out}");
    assert_eq!(private_ip.trim(), ip.to_string(), "{out}");
    // Its output on the way: exit code and stderr.
    let (s, v) = fly
        .post(
            &format!("/apps/web/machines/{id}/exec"),
            json!({"command": ["/bin/sh", "-c", "echo oops >&2; exit 3"]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        (v["exit_code"].as_i64(), v["stderr"].as_str()),
        (Some(3), Some("oops\n"))
    );

    // Served through the proxy, from the guest's address.
    assert_eq!(
        served(&agent.proxy_url(), PATIENCE, "web").await,
        "hello from the image\n"
    );
    // Its console is its log: the workload's output.
    let text = log(&data_dir, &id);
    assert!(text.contains("booted in the guest"), "{text}");

    // Escapes. A host file (the guest has only its disk):
    let secret =
        HostFile(std::env::temp_dir().join(format!("bazaar-microvm-{}", std::process::id())));
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
    // Another app's machine:
    let fetch = |ip: Ipv4Addr| {
        format!(
            "printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {ip} 8080 2>&1; echo rc=$?"
        )
    };
    let out = sh(&fly, PATIENCE, ("web", &id), &fetch(stranger_ip)).await;
    assert!(!out.contains("hello"), "reached another app: {out}");
    // The host's listeners, through the gateway:
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
    // What differs from a container: root in the guest makes namespaces in its own kernel.
    let out = sh(
        &fly,
        PATIENCE,
        ("web", &id),
        "unshare -U -n true; echo rc=$?",
    )
    .await;
    assert_eq!(out.trim(), "rc=0", "{out}");

    // Stopped: its stop signal (SIGINT, Fly's default) reaches its first process in the
    // guest, which exits 0; the guest powers off and the exit event says so.
    let (s, v) = fly
        .post(&format!("/apps/web/machines/{id}/stop"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    reaches(&fly, &data_dir, PATIENCE, ("web", &id), "stopped").await;
    let text = log(&data_dir, &id);
    assert!(text.contains("got its stop signal"), "{text}");
    assert!(text.contains("bazaar-vminit: exit 0"), "{text}");
    let (_, ev) = fly.get(&format!("/apps/web/machines/{id}/events")).await;
    let exit = ev
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "exit")
        .cloned()
        .unwrap_or_else(|| panic!("no exit event: {ev}"));
    assert_eq!(exit["request"]["exit_event"]["exit_code"], 0, "{exit}");
    assert!(processes_naming(&machine_dir.display().to_string()).is_empty());

    // A workload's own exit code is the machine's (QEMU itself exits 0 at the power-off).
    let mut seven = config(&image, "microvm");
    seven["init"] = json!({"exec": ["/bin/sh", "-c", "echo exiting; exit 7"]});
    seven["services"] = json!([]);
    seven["restart"] = json!({"policy": "no"});
    let (seven, _) = create(&fly, "other", seven).await;
    let exit = bazaar_testkit::eventually(Duration::from_secs(90), || async {
        let (_, ev) = fly
            .get(&format!("/apps/other/machines/{seven}/events"))
            .await;
        ev.as_array()?.iter().find(|e| e["type"] == "exit").cloned()
    })
    .await
    .expect("the machine exits");
    assert_eq!(exit["request"]["exit_event"]["exit_code"], 7, "{exit}");
    let (s, v) = fly
        .delete(&format!("/apps/other/machines/{seven}?force=true"))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");

    // Started again, then the agent killed with -9 and restarted: the same VM is adopted.
    let (s, v) = fly
        .post(&format!("/apps/web/machines/{id}/start"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    reaches(&fly, &data_dir, PATIENCE, ("web", &id), "started").await;
    sh(&fly, PATIENCE, ("web", &id), "echo alive > /tmp/marker").await;
    let qemu_before = processes_naming(&machine_dir.display().to_string());
    agents[0].kill9();
    agents[0].restart().unwrap();
    let agent = &agents[0];
    let fly = Fly::new(agent);
    assert_eq!(
        sh(&fly, PATIENCE, ("web", &id), "cat /tmp/marker").await,
        "alive\n"
    );
    assert_eq!(
        processes_naming(&machine_dir.display().to_string()),
        qemu_before
    );

    // Destroyed: no QEMU, cgroup, disk or tap of it is left.
    let host_id = agent.client().info().await.unwrap().id;
    let (s, v) = fly
        .delete(&format!("/apps/web/machines/{id}?force=true"))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let leftovers = || {
        let mut left: Vec<String> = std::fs::read_dir("/sys/fs/cgroup")
            .unwrap()
            .flatten()
            .map(|h| h.path().join("bazaar").join(&host_id).join(&id))
            .filter(|p| p.exists())
            .map(|p| p.display().to_string())
            .collect();
        left.extend(processes_naming(&machine_dir.display().to_string()));
        left.extend(namespaces_with_a_tap());
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
