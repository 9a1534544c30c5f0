//! `bazaar lab` (root): a fleet of agents in network namespaces. Hosts find each other and
//! place machines that serve through any proxy; a partition splits the catalog, writes
//! work on both sides and every catalog agrees after `heal`; freeze/thaw, kill/restart
//! (workloads keep their pids), upgrade to another binary, crash (power loss) and a full
//! disk; one-way partitions drop one direction only, loss a share of packets; `down` leaves no namespace, link, mount, loop device or process.

use crate::common;
use crate::lab_support;

use bazaar_lab::Lab;
use common::{is_root, EXE};
use lab_support::{until, LabApi as Api, TestLab};
use reqwest::{Method, StatusCode};
use serde_json::json;
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// What these tests ask a host's API besides plain calls.
impl Api {
    /// Host address → status, as this host's catalog sees them (`None`: no answer).
    async fn catalog(&self) -> Option<HashMap<String, String>> {
        let (s, v) = self.get("/v1/catalog/hosts").await;
        (s == StatusCode::OK).then(|| {
            v.as_array()
                .unwrap()
                .iter()
                .map(|h| {
                    let addr = h["api_addr"].as_str().unwrap();
                    let ip = addr.split(':').next().unwrap().to_string();
                    (ip, h["status"].as_str().unwrap().to_string())
                })
                .collect()
        })
    }
}

/// The inode of a network namespace: the same for two processes in the same one.
fn netns_inode(path: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().ino()
}

/// The lab host whose agent started workload `pid` (its shim is the agent's child; a
/// process machine of a root agent has a network namespace of its own, made by that host's
/// agent on that host's bridge, so the workload's own namespace is not the host's).
fn host_of_workload(lab: &bazaar_lab::Lab, pid: u32) -> bazaar_lab::plan::HostPlan {
    let parent = |p: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
        let after = &stat[stat.rfind(')')? + 2..];
        after.split(' ').nth(1)?.parse().ok()
    };
    let mut p = pid;
    for _ in 0..8 {
        if let Some(h) = lab
            .plan()
            .hosts
            .iter()
            .find(|h| lab.agent(h).is_some_and(|a| a.pid == p))
        {
            return h.clone();
        }
        p = parent(p).unwrap_or_else(|| panic!("no lab agent above workload {pid}"));
    }
    panic!("no lab agent above workload {pid}");
}

/// The pid of the workload whose environment holds `LAB_MARK=<mark>`.
fn workload_pid(mark: &str) -> Option<u32> {
    let needle = format!("LAB_MARK={mark}\0");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        (String::from_utf8_lossy(&env).contains(&needle)
            && String::from_utf8_lossy(&cmd).contains("http.server"))
        .then_some(pid)
    })
}

/// Creates a machine of `app` in `region` serving HTTP on its service port.
async fn serve(api: &Api, app: &str, region: &str, mark: &str) -> String {
    let config = json!({
        "image": "process", "driver": "process",
        "init": {"exec": ["sh", "-c", "cd / && exec python3 -m http.server $PORT"]},
        "env": {"LAB_MARK": mark},
        "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256},
        "services": [{"internal_port": 8080, "protocol": "tcp"}],
    });
    let (s, m) = api
        .call(
            Method::POST,
            &format!("/v1/apps/{app}/machines"),
            Some(json!({"config": config, "region": region})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let id = m["id"].as_str().unwrap().to_string();
    let (s, v) = api
        .get(&format!(
            "/v1/apps/{app}/machines/{id}/wait?state=started&timeout=30"
        ))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    id
}

async fn create_app(api: &Api, app: &str) {
    let (s, v) = api
        .call(
            Method::POST,
            "/v1/apps",
            Some(json!({"app_name": app, "org_slug": "personal"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "creating {app}: {v}");
}

/// GET `/` of `app` through the proxy of `host`.
async fn through_proxy(lab: &Lab, host: &str, app: &str) -> Option<StatusCode> {
    reqwest::Client::new()
        .get(lab.proxy_url(&lab.host(host).unwrap()))
        .header("host", format!("{app}.localhost"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .ok()
        .map(|r| r.status())
}

fn ip_output(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(out.status.success(), "ip {args:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Checks that nothing of the lab is left on the machine.
fn assert_nothing_left(lab: &Lab, dir: &Path) {
    assert_eq!(lab.leftovers(), Vec::<String>::new());
    let prefix = lab.plan().netns_prefix();
    assert!(!ip_output(&["netns", "list"]).contains(&prefix));
    let links = ip_output(&["-o", "link", "show"]);
    assert!(!links.contains(&lab.plan().bridge()), "{links}");
    assert!(!links.contains(&lab.plan().veth_prefix()), "{links}");
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    assert!(!mounts.contains(&dir.display().to_string()), "{mounts}");
    let loops = Command::new("losetup").arg("-l").output().unwrap();
    assert!(!String::from_utf8_lossy(&loops.stdout).contains(&dir.display().to_string()));
    assert!(!dir.join("lab.json").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lab_fleet_places_partitions_heals_survives_kills_and_comes_down_clean() {
    let (t, out) = TestLab::up(
        "lab",
        &[
            "--dead-after-ms",
            "2000",
            "--hosts",
            "3",
            "--regions",
            "ams,ord",
            "--wait-converged",
        ],
    );
    let lab = t.lab();
    let env = t.env();
    let h1 = lab.host("h1").unwrap();
    assert!(
        out.contains(&format!("BAZAAR_API_URL=http://{}:4280", h1.addr)),
        "{out}"
    );
    assert!(
        out.contains(&t.path().join("lab.env").display().to_string()),
        "{out}"
    );
    assert_eq!(env["BAZAAR_API_URL"], lab.api_url(&h1));
    assert_eq!(env["BAZAAR_TOKEN"], lab.token());
    let addrs: Vec<String> = lab
        .plan()
        .hosts
        .iter()
        .map(|h| h.addr.to_string())
        .collect();
    let apis: Vec<Api> = ["h1", "h2", "h3"]
        .iter()
        .map(|h| Api::of(&lab, h))
        .collect();

    // Each agent runs in its own namespace, and every catalog has every host alive.
    for h in &lab.plan().hosts {
        let pid = lab.agent(h).unwrap().pid;
        assert_eq!(
            netns_inode(&format!("/proc/{pid}/ns/net")),
            netns_inode(&format!("/run/netns/{}", h.netns))
        );
    }
    for api in &apis {
        let c = api.catalog().await.unwrap();
        for a in &addrs {
            assert_eq!(c.get(a).map(String::as_str), Some("alive"), "{c:?}");
        }
    }
    // The API token of the env file is accepted too.
    let resp = reqwest::Client::new()
        .get(format!(
            "{}/v1/apps?org_slug=personal",
            env["BAZAAR_API_URL"]
        ))
        .bearer_auth(&env["BAZAAR_TOKEN"])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);

    // A machine created through host 1 lands in ord (host 2), runs in host 2's namespace
    // and serves through every proxy.
    create_app(&apis[0], "web").await;
    let id = serve(&apis[0], "web", "ord", "web-1").await;
    let pid = workload_pid("web-1").expect("the workload runs");
    assert_eq!(host_of_workload(&lab, pid).netns, lab.plan().hosts[1].netns);
    for host in ["h1", "h2", "h3"] {
        until(20, &format!("web serves through {host}"), || async {
            through_proxy(&lab, host, "web").await == Some(StatusCode::OK)
        })
        .await;
    }

    // Partition h1 from h2,h3: each side sees the other go, and writes on each side work.
    t.cli(&["partition", "h1", "/", "h2,h3"]);
    until(15, "h1 sees h2 and h3 gone, they see h1 gone", || async {
        let c1 = apis[0].catalog().await.unwrap_or_default();
        let c2 = apis[1].catalog().await.unwrap_or_default();
        c1.get(&addrs[1]).is_some_and(|s| s != "alive")
            && c1.get(&addrs[2]).is_some_and(|s| s != "alive")
            && c2.get(&addrs[0]).is_some_and(|s| s != "alive")
            && c2.get(&addrs[2]).is_some_and(|s| s == "alive")
    })
    .await;
    create_app(&apis[0], "left").await;
    create_app(&apis[1], "right").await;
    assert_ne!(apis[0].digest().await, apis[1].digest().await);
    let status = t.cli(&["status"]);
    assert!(status.contains("drops to h2,h3"), "{status}");

    // Heal: every catalog agrees, and both writes are everywhere.
    t.cli(&["heal"]);
    until(20, "every catalog agrees after heal", || async {
        let mut digests = Vec::new();
        for api in &apis {
            digests.push(api.digest().await);
        }
        digests[0].is_some() && digests.iter().all(|d| *d == digests[0])
    })
    .await;
    for api in &apis {
        for app in ["left", "right"] {
            let (s, v) = api.get(&format!("/v1/apps/{app}")).await;
            assert_eq!(s, StatusCode::OK, "{app} on {}: {v}", api.base);
        }
    }

    // Freeze h3: the others declare it gone; thaw: it is back everywhere.
    t.cli(&["freeze", "h3"]);
    assert!(t.cli(&["status"]).contains("frozen"));
    until(15, "h1 sees frozen h3 gone", || async {
        apis[0]
            .catalog()
            .await
            .is_some_and(|c| c[&addrs[2]] != "alive")
    })
    .await;
    t.cli(&["thaw", "h3"]);
    // Every catalog: a suspicion left over from the partition (its timer lost when its
    // prober rejoined under a new identity) used to keep hosts suspect for a minute.
    until(
        20,
        "every host sees every host alive after thaw",
        || async {
            for api in &apis {
                let Some(c) = api.catalog().await else {
                    return false;
                };
                if addrs
                    .iter()
                    .any(|a| c.get(a).map(String::as_str) != Some("alive"))
                {
                    return false;
                }
            }
            true
        },
    )
    .await;

    // Kill h2's agent: its workload keeps running (same pid); restart: the machine is
    // still started and serves.
    t.cli(&["kill", "h2"]);
    assert!(t.lab().agent(&lab.plan().hosts[1]).unwrap().state() == bazaar_lab::AgentState::Down);
    assert_eq!(workload_pid("web-1"), Some(pid));
    t.cli(&["restart", "h2"]);
    let (s, m) = apis[1].get(&format!("/v1/apps/web/machines/{id}")).await;
    assert_eq!(s, StatusCode::OK, "{m}");
    assert_eq!(m["state"], "started", "{m}");
    assert_eq!(workload_pid("web-1"), Some(pid));
    until(20, "web serves again through h1", || async {
        through_proxy(&lab, "h1", "web").await == Some(StatusCode::OK)
    })
    .await;

    // Upgrade h2 to another binary: the new one runs, the workload keeps its pid.
    let next = t.path().join("bazaar-next");
    std::fs::copy(EXE, &next).unwrap();
    t.cli(&["upgrade", "h2", "--binary", next.to_str().unwrap()]);
    let agent = t.lab().agent(&lab.plan().hosts[1]).unwrap();
    assert_eq!(
        std::fs::read_link(format!("/proc/{}/exe", agent.pid)).unwrap(),
        next.canonicalize().unwrap()
    );
    assert_eq!(workload_pid("web-1"), Some(pid));
    let (s, m) = apis[1].get(&format!("/v1/apps/web/machines/{id}")).await;
    assert_eq!((s, &m["state"]), (StatusCode::OK, &json!("started")), "{m}");

    // Down: nothing of the lab is left, the workload neither (the check sees what is there
    // before).
    let before = t.lab().leftovers();
    for what in ["bzlab-", "/bazaar/", "process "] {
        assert!(
            before.iter().any(|l| l.contains(what)),
            "{what}: {before:?}"
        );
    }
    t.cli(&["down"]);
    assert_nothing_left(&lab, t.path());
    assert_eq!(workload_pid("web-1"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_full_disk_loss_and_oneway_partitions() {
    let (t, _) = TestLab::up(
        "lab",
        &["--dead-after-ms", "2000", "--hosts", "2", "--small-disk"],
    );
    let lab = t.lab();
    let api = Api::of(&lab, "h1");
    create_app(&api, "db").await;
    let id = serve(&api, "db", "local", "db-1").await;
    let owner = host_of_workload(&lab, workload_pid("db-1").unwrap());
    let data = lab.data_dir(&owner);

    // The data dir is a small disk of its own; fill-disk fills it, free-disk empties it.
    let free = |p: &Path| {
        let out = Command::new("df")
            .args(["-k", "--output=avail"])
            .arg(p)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)
            .unwrap()
            .trim()
            .parse::<u64>()
            .unwrap()
    };
    assert!(free(&data) > 40 * 1024, "a fresh small disk has room");
    t.cli(&["fill-disk", &owner.name]);
    assert_eq!(free(&data), 0);
    assert!(t.cli(&["status"]).contains("disk full"));
    t.cli(&["free-disk", &owner.name]);
    assert!(free(&data) > 40 * 1024);

    // Crash: agent, shims and workload die at once; restart brings the machine back.
    let old = workload_pid("db-1").unwrap();
    t.cli(&["crash", &owner.name]);
    assert_eq!(workload_pid("db-1"), None);
    assert!(!bazaar_testkit::pid_alive(old as i32));
    t.cli(&["restart", &owner.name]);
    let api = Api::of(&lab, &owner.name);
    let (s, v) = api
        .get(&format!(
            "/v1/apps/db/machines/{id}/wait?state=started&timeout=30"
        ))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    until(20, "the workload runs again", || async {
        workload_pid("db-1").is_some()
    })
    .await;

    // One-way: UDP from h1 to h2 is dropped, from h2 to h1 goes through.
    t.cli(&["partition", "--oneway", "h1", "/", "h2"]);
    let h1 = lab.host("h1").unwrap();
    let h2 = lab.host("h2").unwrap();
    let (a1, a2) = (h1.addr.to_string(), h2.addr.to_string());
    assert_eq!(udp_received(&h1.netns, &h2.netns, &a2, 10), 0);
    assert_eq!(udp_received(&h2.netns, &h1.netns, &a1, 10), 10);
    // Loss: about 20% of what h2 sends is lost (400 datagrams: 80 expected, σ = 8).
    t.cli(&["loss", "h2", "20%"]);
    assert!(t.cli(&["status"]).contains("loss 20%"));
    let got = udp_received(&h2.netns, &h1.netns, &a1, 400);
    assert!((280..=360).contains(&got), "{got} of 400 arrived");
    // Heal ends both.
    t.cli(&["heal"]);
    assert_eq!(udp_received(&h1.netns, &h2.netns, &a2, 10), 10);
    assert_eq!(udp_received(&h2.netns, &h1.netns, &a1, 10), 10);
    let status = t.cli(&["status"]);
    assert!(
        !status.contains("loss") && !status.contains("drops"),
        "{status}"
    );

    // Bad input changes nothing.
    let out = t.cli_raw(&["freeze", "h9"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no host"));
    let out = t.cli_raw(&["loss", "h1", "120%"]);
    assert!(!out.status.success());

    t.cli(&["down"]);
    assert_nothing_left(&lab, t.path());
}

/// How many of `count` UDP datagrams sent from namespace `from` reach a listener on
/// `to_addr` in namespace `to` (a send the firewall drops on the way out fails with EPERM:
/// ignored). The test itself ends the count with a `stop` datagram from the root
/// namespace, which no lab rule touches, once the sender is done.
fn udp_received(from: &str, to: &str, to_addr: &str, count: usize) -> usize {
    let listen = format!(
        "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
         s.bind(('{to_addr}',9099))\ns.settimeout(30)\nprint('ready',flush=True)\nn=0\n\
         while s.recv(100)!=b'stop':\n    n+=1\nprint(n)\n"
    );
    let mut receiver = Command::new("ip")
        .args(["netns", "exec", to, "python3", "-c", &listen])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(receiver.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let send = format!(
        "import socket,time\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
         for _ in range({count}):\n    try:\n        s.sendto(b'hello',('{to_addr}',9099))\n    \
         except OSError:\n        pass\n    time.sleep(0.002)\n"
    );
    let sent = Command::new("ip")
        .args(["netns", "exec", from, "python3", "-c", &send])
        .status()
        .unwrap();
    assert!(sent.success());
    std::thread::sleep(Duration::from_millis(100));
    let stop = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    stop.send_to(b"stop", (to_addr, 9099)).unwrap();
    line.clear();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    receiver.wait().unwrap();
    line.trim().parse().unwrap()
}

#[test]
fn up_refuses_bad_input_and_leaves_nothing() {
    assert!(
        is_root(),
        "the lab tests need root (network namespaces, mounts)"
    );
    let dir = tempfile::Builder::new()
        .prefix("bazaar-lab-")
        .tempdir()
        .unwrap();
    let up = |args: &[&str]| {
        Command::new(EXE)
            .arg("lab")
            .arg("--dir")
            .arg(dir.path())
            .arg("up")
            .args(args)
            .output()
            .unwrap()
    };
    for (args, says) in [
        (&["--subnet", "127.0.0.0/24"][..], "already in use"),
        (
            &["--subnet", "10.250.255.252/30", "--hosts", "2"][..],
            "room for 1 hosts",
        ),
        (&["--hosts", "0"][..], "at least 1"),
        (&["--regions", "Not A Region"][..], "region"),
    ] {
        let out = up(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!dir.path().join("lab.json").exists(), "{args:?}");
    }
    let out = Command::new(EXE)
        .args(["lab", "--dir"])
        .arg(dir.path())
        .arg("status")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no lab in"));
}
