//! What confines an image machine, end to end as root (issue 20 item 3, issue 13 item 1 for
//! image machines): its root is an unprivileged id of its own on the host (user namespace,
//! also for what it writes to its volume), it cannot make namespaces (seccomp allowlist),
//! open raw sockets (no NET_RAW) nor reach the host's listeners through its gateway, a
//! spoofed source address is dropped at the bridge, and a destroyed machine leaves no
//! cgroup, mount or runtime directory. The agent's data dir is mode 700 (root's home): the
//! machine still runs and serves through the proxy. Import archives are size-capped.

use crate::common;

use bazaar_testkit::images::{
    busybox_rootfs_layer, config_with, docker_save, ensure_packages, push_with_config, TestRegistry,
};
use bazaar_testkit::start_cluster;
use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::net::Ipv4Addr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn require_root() {
    assert!(
        is_root(),
        "image machine isolation tests need root (runc, namespaces, nftables)"
    );
    ensure_packages();
}

fn busybox_layer() -> bazaar_testkit::images::Layer {
    busybox_rootfs_layer(
        &[
            "sh", "httpd", "id", "cat", "unshare", "nc", "echo", "ls", "sleep", "arping",
        ],
        ("etc/motd", b"sandbox\n"),
    )
}

fn image_config(layer: &bazaar_testkit::images::Layer) -> Vec<u8> {
    config_with(
        &[layer],
        bazaar_image::manifest::Platform::current()
            .architecture
            .as_str(),
        json!({"Cmd": ["/bin/httpd", "-f", "-p", "8080", "-h", "/www"], "Env": ["PATH=/bin"]}),
    )
}

async fn started(fly: &Fly, agent: &bazaar_testkit::TestAgent, app: &str, id: &str) {
    let (s, w) = fly
        .get(&format!(
            "/apps/{app}/machines/{id}/wait?state=started&timeout=30"
        ))
        .await;
    if s != StatusCode::OK {
        let (_, ev) = fly.get(&format!("/apps/{app}/machines/{id}/events")).await;
        let log =
            std::fs::read_to_string(agent.data_dir.join("machines").join(id).join("output.log"))
                .unwrap_or_default();
        panic!("machine {id} never started: {w}\nevents: {ev}\nlog: {log}");
    }
}

/// Runs `cmd` with `sh -c` in the machine; its stdout (stderr folded in by the command).
async fn sh(fly: &Fly, app: &str, id: &str, cmd: &str) -> String {
    let (s, v) = fly
        .post(
            &format!("/apps/{app}/machines/{id}/exec"),
            json!({"command": ["/bin/sh", "-c", cmd], "timeout": 20}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "exec {cmd}: {v}");
    v["stdout"].as_str().unwrap_or_default().to_string()
}

/// The only run directory of machine `id`.
fn run_dir(data_dir: &Path, id: &str) -> PathBuf {
    let runs: Vec<PathBuf> = std::fs::read_dir(data_dir.join("machines").join(id).join("runs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    runs.into_iter().next().unwrap()
}

/// The `Uid:` or `Gid:` fields of a host process.
fn ids_of(pid: i32, field: &str) -> Vec<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .unwrap()
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect()
}

fn host_cmd(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The packets counted by the rules of an nftables table.
fn dropped_packets(family: &str, table: &str) -> u64 {
    host_cmd("nft", &["list", "table", family, table])
        .split("packets ")
        .skip(1)
        .filter_map(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_machines_are_confined_on_the_host() {
    require_root();
    let registry = TestRegistry::start(None);
    let reg =
        bazaar_image::Registry::new(&registry.host, bazaar_image::Auth::Anonymous, true).unwrap();
    let layer = busybox_layer();
    push_with_config(&reg, "sandbox", "1", &[&layer], &image_config(&layer)).await;
    let agents = start_cluster(Path::new(EXE), 1, |_, _| {}).unwrap();
    let agent = &agents[0];
    // The data dir is like root's home: nobody else may traverse it.
    std::fs::set_permissions(&agent.data_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let host_id = agent.client().info().await.unwrap().id;
    let fly = Fly::new(agent);
    fly.create_app("box").await;
    let (s, vol) = fly
        .post("/apps/box/volumes", json!({"name": "data", "size_gb": 1}))
        .await;
    assert_eq!(s, StatusCode::OK, "{vol}");
    let vol_id = vol["id"].as_str().unwrap().to_string();
    let (s, m) = fly
        .post(
            "/apps/box/machines",
            json!({"config": {
                "image": format!("{}/sandbox:1", registry.host),
                "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256},
                "mounts": [{"volume": vol_id, "path": "/data"}],
                "services": [{"protocol": "tcp", "internal_port": 8080,
                              "ports": [{"port": 80, "handlers": ["http"]}]}],
            }}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let id = m["id"].as_str().unwrap().to_string();
    started(&fly, agent, "box", &id).await;
    let ip: Ipv4Addr = m["private_ip"].as_str().unwrap().parse().unwrap();

    // Started and serving through the proxy (the proxy reaches it through the firewall).
    let served = bazaar_testkit::eventually(Duration::from_secs(15), || async {
        let resp = reqwest::Client::new()
            .get(format!("{}/index.html", agent.proxy_url()))
            .header("host", "box.localhost")
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .ok()?;
        (resp.status() == 200).then_some(resp.text().await.ok()?)
    })
    .await
    .expect("served through the proxy");
    assert_eq!(served, "hello from the image\n");

    // Root inside, an unprivileged id of its own on the host.
    assert_eq!(sh(&fly, "box", &id, "id -u; id -g").await, "0\n0\n");
    let run = run_dir(&agent.data_dir, &id);
    let pid: i32 = std::fs::read_to_string(run.join("container.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let uids = ids_of(pid, "Uid:");
    let base = uids[0];
    assert!(base >= 1 << 20, "mapped root is not a host user: {uids:?}");
    assert!(uids.iter().all(|u| *u == base), "{uids:?}");
    assert!(ids_of(pid, "Gid:").iter().all(|g| *g == base));

    // What it writes on its volume is owned by that id on the host.
    sh(&fly, "box", &id, "echo made > /data/inside").await;
    let made = agent
        .data_dir
        .join("volumes")
        .join(&vol_id)
        .join("mnt/inside");
    let meta = std::fs::metadata(&made).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (base, base), "{}", made.display());

    // No new namespaces (seccomp refuses clone/unshare with namespace flags).
    let out = sh(
        &fly,
        "box",
        &id,
        "unshare -U true 2>&1; echo rc=$?; unshare -n true 2>&1; echo rc=$?",
    )
    .await;
    assert_eq!(out.matches("rc=1").count(), 2, "{out}");
    assert_eq!(out.matches("not permitted").count(), 2, "{out}");
    // The filter is an allowlist: io_uring (and anything unlisted) is refused.
    let spec: Value =
        serde_json::from_slice(&std::fs::read(run.join("bundle/config.json")).unwrap()).unwrap();
    let seccomp = &spec["linux"]["seccomp"];
    assert_eq!(seccomp["defaultAction"], "SCMP_ACT_ERRNO", "{seccomp}");
    let allowed: Vec<&str> = seccomp["syscalls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["action"] == "SCMP_ACT_ALLOW")
        .flat_map(|r| r["names"].as_array().unwrap())
        .filter_map(Value::as_str)
        .collect();
    for call in [
        "io_uring_setup",
        "unshare",
        "setns",
        "mount",
        "bpf",
        "keyctl",
    ] {
        assert!(!allowed.contains(&call), "{call} allowed");
    }
    let caps = spec["process"]["capabilities"]["bounding"].to_string();
    assert!(
        !caps.contains("CAP_NET_RAW") && !caps.contains("CAP_MKNOD"),
        "{caps}"
    );

    // No raw sockets: it cannot forge frames (busybox arping needs a packet socket).
    let network = std::fs::read_to_string(agent.data_dir.join("network")).unwrap();
    let mut lines = network.lines();
    let subnet = lines.next().unwrap().split('/').next().unwrap();
    let bridge = lines.next().unwrap().to_string();
    let gateway = Ipv4Addr::from(u32::from(subnet.parse::<Ipv4Addr>().unwrap()) + 1);
    let out = sh(
        &fly,
        "box",
        &id,
        &format!("arping -c 1 -w 1 -I eth0 {gateway} 2>&1; echo rc=$?"),
    )
    .await;
    assert!(
        out.contains("not permitted") && !out.contains("rc=0"),
        "{out}"
    );

    // The host's listeners are out of reach through the gateway, though the host reaches
    // them.
    let listener = std::net::TcpListener::bind((gateway, 0)).unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let out = sh(
        &fly,
        "box",
        &id,
        &format!("echo hi | nc -w 2 {gateway} {port} 2>&1; echo rc=$?"),
    )
    .await;
    assert!(
        matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the machine connected to a host listener: {out}"
    );
    assert!(!out.contains("rc=0"), "{out}");
    let _control = std::net::TcpStream::connect((gateway, port)).expect("the host reaches it");
    assert!(listener.accept().is_ok(), "the listener works");

    // A spoofed source address is dropped at the bridge: the machine's namespace, given a
    // second address by the host (as a machine with NET_ADMIN could), sends from it.
    let table = format!("bazaar_{}", bridge.replace('-', "_"));
    let index = u32::from(ip) - u32::from(subnet.parse::<Ipv4Addr>().unwrap());
    let netns = format!("{bridge}-{index}");
    let sources = host_cmd("nft", &["list", "set", "bridge", &table, "sources"]);
    // (Machines have no IPv6 addresses; link-local IPv6 from them is dropped too.)
    assert!(
        host_cmd("nft", &["list", "table", "bridge", &table]).contains("ether type ip6"),
        "IPv6 from machines is not dropped"
    );
    assert!(sources.contains(&format!(". {ip}")), "{sources}");
    let spoofed = Ipv4Addr::from(u32::from(ip) + 100);
    let before = dropped_packets("bridge", &table);
    host_cmd(
        "ip",
        &[
            "-n",
            &netns,
            "addr",
            "add",
            &format!("{spoofed}/32"),
            "dev",
            "eth0",
        ],
    );
    let _ = Command::new("ip")
        .args([
            "netns", "exec", &netns, "busybox", "ping", "-c", "2", "-W", "1",
        ])
        .args(["-I", &spoofed.to_string(), &gateway.to_string()])
        .output()
        .unwrap();
    host_cmd(
        "ip",
        &[
            "-n",
            &netns,
            "addr",
            "del",
            &format!("{spoofed}/32"),
            "dev",
            "eth0",
        ],
    );
    let after = dropped_packets("bridge", &table);
    assert!(
        after > before,
        "spoofed packets not dropped ({before} → {after})"
    );
    // Its own address still works (the proxy reached it above; once more now).
    assert_eq!(sh(&fly, "box", &id, "echo ok").await, "ok\n");

    // Destroyed: no cgroup (nor its container's), rootfs mount or runtime directory left.
    let (s, v) = fly
        .delete(&format!("/apps/box/machines/{id}?force=true"))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let exposed = Path::new("/run/bazaar")
        .join(&host_id)
        .join("rootfs")
        .join(&id);
    let leftovers = || {
        let mut left: Vec<String> = std::fs::read_dir("/sys/fs/cgroup")
            .unwrap()
            .flatten()
            .map(|h| h.path().join("bazaar").join(&host_id).join(&id))
            .chain(std::iter::once(
                Path::new("/sys/fs/cgroup/bazaar").join(&host_id).join(&id),
            ))
            .filter(|p| p.exists())
            .map(|p| p.display().to_string())
            .collect();
        if exposed.exists() {
            left.push(exposed.display().to_string());
        }
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
        left.extend(
            mounts
                .lines()
                .filter(|l| l.contains(&id))
                .map(str::to_string),
        );
        left
    };
    let clean = bazaar_testkit::eventually(Duration::from_secs(15), || async {
        leftovers().is_empty().then_some(())
    })
    .await;
    assert!(clean.is_ok(), "left behind: {:?}", leftovers());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_over_the_size_cap_is_refused_with_413() {
    require_root();
    let layer = busybox_layer();
    let archive = docker_save("offline.example/big:1", &[&layer], &image_config(&layer));
    assert!(archive.len() > 1 << 20);
    let agents = start_cluster(Path::new(EXE), 1, |_, o| {
        o.extra_args
            .extend(["--max-import-bytes".to_string(), (1 << 20).to_string()]);
    })
    .unwrap();
    let http = reqwest::Client::new();
    let url = format!("{}/host/v1/images/import", agents[0].url());
    let resp = http
        .post(&url)
        .bearer_auth(bazaar_testkit::TEST_SECRET)
        .body(archive.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body: Value = resp.json().await.unwrap();
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("max-import-bytes")),
        "{body}"
    );
    // Sent without a length (chunked), it is refused once it passes the cap.
    let answer = post_chunked(agents[0].url(), "/host/v1/images/import", &archive).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("max-import-bytes"), "{answer}");
    // Nothing was imported, and nothing of the upload is left.
    let images: Value = http
        .get(format!("{}/host/v1/images", agents[0].url()))
        .bearer_auth(bazaar_testkit::TEST_SECRET)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(images, json!([]));
    let leftovers: Vec<_> = std::fs::read_dir(&agents[0].data_dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("import-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// POSTs `body` with `Transfer-Encoding: chunked` (no length announced) over a plain
/// connection; the raw answer (status line, headers, body).
async fn post_chunked(base: String, path: &str, body: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.trim_start_matches("http://").to_string();
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
        bazaar_testkit::TEST_SECRET
    );
    s.write_all(head.as_bytes()).await.unwrap();
    for chunk in body.chunks(64 << 10) {
        let mut frame = format!("{:x}\r\n", chunk.len()).into_bytes();
        frame.extend_from_slice(chunk);
        frame.extend_from_slice(b"\r\n");
        // The agent may answer and stop reading before the end.
        if s.write_all(&frame).await.is_err() {
            break;
        }
    }
    let _ = s.write_all(b"0\r\n\r\n").await;
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer).await;
    String::from_utf8_lossy(&answer).into_owned()
}
