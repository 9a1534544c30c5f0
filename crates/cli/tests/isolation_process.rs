//! A token-holder's process machine is confined (issue 20): it runs as a uid of its own,
//! without capabilities, under the shared seccomp filter, in a private root where the
//! host's secrets, the agent's data dir and other machines' files and volumes are not to be
//! found; root is refused. The data at rest is the agent's alone, and an agent whose data
//! dir is private still runs and serves process machines (issue 13). Needs root: the tests
//! fail, not skip, without it.

use crate::common;

use bazaar_client::HostClient;
use bazaar_testkit::{create_request, AgentOptions, TestAgent};
use bazaar_types::host::ClaimRequest;
use bazaar_types::state::MachineState;
use common::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

fn root_agent(extra: &[&str]) -> TestAgent {
    root_agent_with(extra, |_| {})
}

fn root_agent_with(extra: &[&str], configure: impl FnOnce(&mut AgentOptions)) -> TestAgent {
    assert!(is_root(), "these tests need root (CI runs as root)");
    let mut opts = AgentOptions::new(EXE);
    opts.extra_args.extend(extra.iter().map(|s| s.to_string()));
    configure(&mut opts);
    TestAgent::start(opts).expect("agent starts")
}

/// Runs `sh -c script` inside machine `id`; returns (exit code, stdout + stderr).
async fn sh(c: &HostClient, id: &str, script: &str) -> (i32, String) {
    let out = c.exec(id, &["sh", "-c", script]).await.expect("exec");
    (out.exit_code, format!("{}{}", out.stdout, out.stderr))
}

/// A field of `/proc/<pid>/status` (e.g. `Uid`), first value.
fn status_field(pid: i32, name: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find(|l| l.starts_with(&format!("{name}:")))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or_default()
        .to_string()
}

async fn started(c: &HostClient, req: &ClaimRequest) -> (String, i32) {
    let m = c.create(req).await.expect("create");
    let pid = wait_state(c, &m.id, MachineState::Started)
        .await
        .pid
        .expect("a pid");
    (m.id, pid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_machine_is_confined_to_its_own_uid_and_root() {
    let agent = root_agent(&[]);
    let c = agent.client();
    let mut secret = create_request(
        "app-b",
        &["python3", "-m", "http.server", "--bind", "0.0.0.0", "8080"],
    );
    secret
        .config
        .env
        .insert("B_SECRET".into(), "hunter2-of-b".into());
    secret.config.services =
        vec![serde_json::from_value(serde_json::json!({"internal_port": 8080})).unwrap()];
    let (b, b_pid) = started(&c, &secret).await;
    let (a, a_pid) = started(&c, &create_request("app-a", &["sleep", "1000"])).await;

    // Its own uid, non-zero and distinct from the other machine's; no capabilities at all,
    // no_new_privs, a seccomp filter (also true of the process `exec` runs).
    let (a_uid, b_uid) = (status_field(a_pid, "Uid"), status_field(b_pid, "Uid"));
    assert_ne!(a_uid, "0");
    assert_ne!(b_uid, "0");
    assert_ne!(a_uid, b_uid, "each machine has a uid of its own");
    for field in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(status_field(a_pid, field), "0000000000000000", "{field}");
    }
    assert_eq!(status_field(a_pid, "NoNewPrivs"), "1");
    assert_eq!(status_field(a_pid, "Seccomp"), "2");
    // Its root was built in a copy of the agent's base mount namespace (made once, a few
    // mounts), not of the host's, whose mounts grow with the machines (two per address):
    // copying them and detaching the copy made every start slower as the host filled.
    let log = std::fs::read_to_string(agent.data_dir.join("agent.log")).unwrap_or_default();
    assert!(!log.contains("sandbox base"), "{log}");
    let host_mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        host_mounts
            .lines()
            .any(|l| l.contains("/sandbox-base ") && l.contains(" - nsfs ")),
        "the base mount namespace is bound on the host: {host_mounts}"
    );
    let (code, out) = sh(
        &c,
        &a,
        "id -u; grep -E '^(Cap(Eff|Bnd)|NoNewPrivs|Seccomp):' /proc/self/status; pwd",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.starts_with(&format!("{a_uid}\n")),
        "exec runs as the machine's uid: {out}"
    );
    assert!(out.contains("CapEff:\t0000000000000000"), "{out}");
    assert!(out.contains("CapBnd:\t0000000000000000"), "{out}");
    assert!(
        out.contains("NoNewPrivs:\t1") && out.contains("Seccomp:\t2"),
        "{out}"
    );
    assert!(out.trim_end().ends_with("/work"), "{out}");

    // The host's secrets, the agent's data (other apps' env and run specs) and other
    // machines' directories are not there to be read.
    let data = agent.data_dir.display().to_string();
    let b_work = agent.data_dir.join("machines").join(&b).join("work");
    for path in [
        "/etc/shadow".to_string(),
        "/root".to_string(),
        format!("{data}/agent.redb"),
        format!("{data}/machines/{b}/runs/1/spec.json"),
        b_work.display().to_string(),
    ] {
        let (code, out) = sh(&c, &a, &format!("ls -d {path} || exit 7")).await;
        assert_eq!(code, 7, "{path} is visible: {out}");
    }
    let (code, out) = sh(
        &c,
        &a,
        "grep -rsl hunter2-of-b /etc /work /tmp /proc/*/environ; ls /proc | grep -c '^[0-9]'",
    )
    .await;
    // Only its own processes are visible (init, sleep, sh, ls, grep), none of B's.
    assert_eq!(code, 0, "{out}");
    assert!(
        out.trim().parse::<u32>().is_ok_and(|n| n <= 5),
        "B's secret or processes seen from A: {out}"
    );
    // The work directory is the machine's, and its alone.
    let (code, out) = sh(&c, &a, "echo hi > note && cat note").await;
    assert_eq!((code, out.trim()), (0, "hi"));
    let a_work = agent.data_dir.join("machines").join(&a).join("work");
    let meta = std::fs::metadata(&a_work).unwrap();
    assert_eq!(meta.uid().to_string(), a_uid);
    assert_eq!(meta.mode() & 0o777, 0o700);
    // Programs of the host run (read-only) and find what they need in /etc.
    let (code, out) = sh(
        &c,
        &a,
        "python3 -c 'import pwd, os; print(pwd.getpwuid(os.getuid()).pw_name)'; touch /usr/x",
    )
    .await;
    assert_ne!(code, 0, "/usr is read-only: {out}");
    assert!(out.starts_with("machine\n"), "{out}");

    // Its own network: B's service answers at B's address (from the host, as the proxy
    // reaches it), but not to A; nor does the agent's API on the host's loopback.
    let b_ip = c.machine(&b).await.unwrap().private_ip;
    assert!(
        !b_ip.is_empty() && b_ip != "127.0.0.1",
        "B has an address: {b_ip}"
    );
    bazaar_testkit::eventually(Duration::from_secs(20), || async {
        std::net::TcpStream::connect((b_ip.as_str(), 8080)).ok()
    })
    .await
    .expect("B serves at its address");
    let api_port = agent.url().rsplit(':').next().unwrap().to_string();
    for (ip, port) in [(b_ip.as_str(), "8080"), ("127.0.0.1", api_port.as_str())] {
        let probe = format!(
            "python3 -c 'import socket, sys; s = socket.socket(); s.settimeout(2); \
             sys.exit(7 if s.connect_ex((\"{ip}\", {port})) == 0 else 0)'"
        );
        let (code, out) = sh(&c, &a, &probe).await;
        assert_eq!(code, 0, "A reached {ip}:{port}: {out}");
    }

    // New namespaces are refused by the filter (EPERM), whatever the tool.
    let (code, out) = sh(&c, &a, "unshare -U true").await;
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("Operation not permitted"), "{out}");
    // Its root (entered with chroot in a copy of the base mount namespace) cannot be
    // changed: chroot is refused by the filter too.
    let (code, out) = sh(&c, &a, "/usr/sbin/chroot / /bin/true").await;
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("Operation not permitted"), "{out}");

    // A destroyed machine leaves no cgroup directory in any hierarchy.
    c.destroy(&b, true).await.unwrap();
    wait_state(&c, &b, MachineState::Destroyed).await;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    for line in mountinfo.lines().filter(|l| l.contains(" - cgroup")) {
        let root = Path::new(line.split(' ').nth(4).unwrap()).join("bazaar");
        for host in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            let left = host.path().join(&b);
            assert!(!left.exists(), "{} left behind", left.display());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_is_refused_unless_the_operator_allows_it() {
    let agent = root_agent(&[]);
    let c = agent.client();
    for user in ["root", "0", "0:0"] {
        let mut req = create_request("rooty", &["sleep", "1000"]);
        req.config.init.as_mut().unwrap().user = Some(user.into());
        let err = c.create(&req).await.unwrap_err();
        assert_eq!(err.status(), Some(400), "init.user = {user:?}: {err}");
        assert!(err.to_string().contains("root"), "{err}");
    }
    assert!(
        c.machines(None, false).await.unwrap().is_empty(),
        "nothing was created"
    );
    // A named user is the machine's own uid under that name.
    let mut req = create_request("named", &["sleep", "1000"]);
    req.config.init.as_mut().unwrap().user = Some("www-data".into());
    let (id, pid) = started(&c, &req).await;
    assert!(status_field(pid, "Uid").parse::<u32>().unwrap() >= 200_000);
    let (code, out) = sh(&c, &id, "id -un").await;
    assert_eq!((code, out.trim()), (0, "www-data"));
    drop(agent);

    let agent = root_agent(&["--allow-root-machines"]);
    let c = agent.client();
    let mut req = create_request("rooty", &["sleep", "1000"]);
    req.config.init.as_mut().unwrap().user = Some("root".into());
    let (_, pid) = started(&c, &req).await;
    assert_eq!(status_field(pid, "Uid"), "0");
    // Still without capabilities.
    assert_eq!(status_field(pid, "CapEff"), "0000000000000000");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_and_data_at_rest_belong_to_their_owner_only() {
    let agent = root_agent(&[]);
    let c = agent.client();
    let volume = bazaar_types::volume::HostVolumeCreate {
        id: bazaar_types::volume::new_volume_id(),
        app: "vol-b".into(),
        name: "data".into(),
        size_gb: 1,
        encrypted: false,
        require_unique_zone: false,
        compute: None,
        snapshot_retention: 5,
        auto_backup_enabled: false,
        source: None,
    };
    c.create_volume(&volume).await.expect("volume");
    let mut req = create_request(
        "vol-b",
        &[
            "sh",
            "-c",
            "echo boot >> $BAZAAR_VOLUME_PATH/boots; exec sleep 1000",
        ],
    );
    req.config.mounts = vec![serde_json::json!({"volume": volume.id, "path": "/data"})];
    let (b, b_pid) = started(&c, &req).await;
    let (a, _) = started(&c, &create_request("vol-a", &["sleep", "1000"])).await;

    // B writes its volume at mounts[0].path; on the host its root is B's uid's, mode 0700.
    let (code, out) = sh(&c, &b, "echo $BAZAAR_VOLUME_PATH; cat /data/boots").await;
    assert_eq!((code, out.as_str()), (0, "/data\nboot\n"));
    let mnt = agent.data_dir.join("volumes").join(&volume.id).join("mnt");
    let meta = std::fs::metadata(&mnt).unwrap();
    assert_eq!(meta.uid().to_string(), status_field(b_pid, "Uid"));
    assert_eq!(meta.mode() & 0o777, 0o700);
    // A cannot reach it, by B's mount path or the host's.
    let (code, out) = sh(
        &c,
        &a,
        &format!("cat /data/boots || cat {}/boots || exit 7", mnt.display()),
    )
    .await;
    assert_eq!(code, 7, "{out}");

    // Data at rest: the data dir, the store and every run spec are root's alone.
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&agent.data_dir), 0o700);
    assert_eq!(mode(&agent.data_dir.join("agent.redb")), 0o600);
    let spec = agent
        .data_dir
        .join(format!("machines/{b}/runs/1/spec.json"));
    assert_eq!(mode(&spec), 0o600);
    assert_eq!(mode(&agent.data_dir.join("machines").join(&b)), 0o700);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_data_dir_runs_and_serves_process_machines() {
    // Issue 13 acceptance 1 (process half): the data dir inside a mode-700 directory.
    let agent = root_agent_with(&[], |o| o.data_subdir = Some("data".into()));
    let parent = agent.data_dir.parent().unwrap();
    std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o700)).unwrap();
    let fly = Fly::new(&agent);
    fly.create_app("private").await;
    let config = serde_json::json!({
        "image": "process", "driver": "process",
        "init": {"exec": ["sh", "-c", "echo served > index.html; exec python3 -m http.server --bind 0.0.0.0 $PORT"]},
        "services": [{"internal_port": 8080, "protocol": "tcp"}],
    });
    let (s, m) = fly
        .call(
            reqwest::Method::POST,
            "/apps/private/machines",
            Some(serde_json::json!({"config": config})),
        )
        .await;
    assert_eq!(s, reqwest::StatusCode::OK, "{m}");
    let id = m["id"].as_str().unwrap().to_string();
    fly.wait_state("private", &id, "started").await;
    let http = reqwest::Client::new();
    let body = bazaar_testkit::eventually(Duration::from_secs(20), || async {
        let resp = http
            .get(format!("{}/index.html", agent.proxy_url()))
            .header("host", "private.localhost")
            .send()
            .await
            .ok()?;
        (resp.status() == 200).then_some(resp.text().await.ok()?)
    })
    .await
    .expect("served through the proxy");
    assert_eq!(body.trim(), "served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_agent_runs_unisolated_machines_only_as_root_and_only_when_allowed() {
    assert!(is_root(), "these tests need root (CI runs as root)");
    // --no-isolate alone: refused at start, saying what to do.
    let mut opts = AgentOptions::new(EXE);
    opts.isolate = false;
    let err = TestAgent::start(opts)
        .map(|_| ())
        .expect_err("a root agent with --no-isolate alone starts");
    assert!(
        format!("{err:#}").contains("--allow-root-machines"),
        "{err:#}"
    );
    // With --allow-root-machines: a process machine starts (its work directory is in the
    // private data dir) and runs as root, without a user switch, as the flag says.
    let agent = root_agent_with(&["--allow-root-machines"], |o| o.isolate = false);
    assert_eq!(
        std::fs::metadata(&agent.data_dir)
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
    let c = agent.client();
    let (_, pid) = started(&c, &create_request("bare", &["sleep", "1000"])).await;
    assert_eq!(status_field(pid, "Uid"), "0");
}
