//! `bazaar dev` starts a working local cluster with nothing installed by hand, writes
//! dev.env, stops cleanly on SIGTERM (taking its workloads down), and resumes the same
//! cluster when run again on the same directory.

use crate::common;

use bazaar_client::HostClient;
use bazaar_testkit::{create_request, pid_alive};
use bazaar_types::state::MachineState;
use common::*;
use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Finds a base port such that `base + 10k..base + 10k + n` for k in 0..5 (the API, proxy,
/// host listener, proxy TLS and proxy hop ports `start_dev` uses) are free for TCP and UDP
/// on loopback. Bases are picked
/// below the kernel's ephemeral range, where outgoing connections of tests running
/// alongside cannot take them in the meantime.
fn free_ports(n: u16) -> u16 {
    let free = |p: u16| {
        std::net::TcpListener::bind(("127.0.0.1", p)).is_ok()
            && std::net::UdpSocket::bind(("127.0.0.1", p)).is_ok()
    };
    for _ in 0..1000 {
        let base = bazaar_testkit::free_port(std::net::Ipv4Addr::LOCALHOST);
        if base < 31_900 && (0..n).all(|i| (0..5).all(|k| free(base + 10 * k + i))) {
            return base;
        }
    }
    panic!("no free ports");
}

/// The host ids of hosts 0, 1, 2.
async fn host_ids_in_order(base: u16, secret: &str) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..3 {
        let c = HostClient::new(&format!("http://127.0.0.1:{}", base + i), secret);
        ids.push(c.info().await.unwrap().id);
    }
    ids
}

fn start_dev(dir: &std::path::Path, base: u16, gossip: u16) -> Child {
    start_dev_with(dir, base, gossip, &[])
}

fn start_dev_with(dir: &std::path::Path, base: u16, gossip: u16, extra: &[&str]) -> Child {
    Command::new(EXE)
        .args([
            "dev",
            "--hosts",
            "3",
            "--regions",
            "ams,ord",
            "--memory-mb",
            "4096",
            "--data-dir",
        ])
        .arg(dir)
        .arg("--gossip-port")
        .arg(gossip.to_string())
        .args([
            "--base-port",
            &base.to_string(),
            "--proxy-port",
            &(base + 10).to_string(),
            "--host-port",
            &(base + 20).to_string(),
            "--proxy-tls-port",
            &(base + 30).to_string(),
            "--proxy-hop-port",
            &(base + 40).to_string(),
        ])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

fn read_env(dir: &std::path::Path) -> HashMap<String, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(text) = std::fs::read_to_string(dir.join("dev.env")) {
            let env: HashMap<String, String> = text
                .lines()
                .filter_map(|l| {
                    l.split_once('=')
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                })
                .collect();
            if env.len() >= 3 {
                return env;
            }
        }
        assert!(Instant::now() < deadline, "dev.env never appeared");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn stop_dev(mut child: Child) {
    bazaar_testkit::signal(child.id() as i32, libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "dev exited with {status}");
            return;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("dev did not stop on SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_starts_three_hosts_stops_cleanly_and_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cluster");
    let base = free_ports(3);
    let gossip = loop {
        let g = free_ports(3);
        if g.abs_diff(base) > 20 {
            break g;
        }
    };
    let dev = start_dev(&dir, base, gossip);
    let env = read_env(&dir);
    assert_eq!(env["BAZAAR_API_URL"], format!("http://127.0.0.1:{base}"));
    assert!(env.contains_key("BAZAAR_PROXY_URL"));
    assert_eq!(
        env["BAZAAR_PROXY_TLS_URL"],
        format!("https://127.0.0.1:{}", base + 30)
    );
    let token = env["BAZAAR_TOKEN"].clone();
    assert!(token.len() >= 32);

    let secret = env["BAZAAR_CLUSTER_SECRET"].clone();
    // The host interface is the cluster's: the API token is refused there.
    let refused = HostClient::new(&env["BAZAAR_API_URL"], &token).info().await;
    assert_eq!(refused.unwrap_err().status(), Some(403));

    // Three hosts, each answering with the cluster secret, in the regions asked for.
    let mut host_ids = Vec::new();
    let mut regions = Vec::new();
    for i in 0..3 {
        let c = HostClient::new(&format!("http://127.0.0.1:{}", base + i), &secret);
        let info = c.info().await.unwrap();
        host_ids.push(info.id);
        regions.push(info.region);
    }
    host_ids.sort();
    host_ids.dedup();
    assert_eq!(host_ids.len(), 3, "three distinct hosts");
    assert_eq!(regions, vec!["ams", "ord", "ams"]);
    // dev made the cluster's CA; every host has a certificate of it (host 0 issued its own,
    // the others joined with tokens).
    assert!(dir.join("ca").join("ca.crt").exists());
    for (i, id) in host_ids_in_order(base, &secret).await.iter().enumerate() {
        let tls = dir.join(format!("host-{i}")).join("tls");
        assert!(
            bazaar_pki::HostIdentity::load(&tls, id).unwrap().is_some(),
            "host {i} has a certificate"
        );
    }

    // Every listener is on dev's port plan, the proxy's hop listener too (no port the
    // kernel picks): host i's on base + 40 + i, published in its host row.
    let c = HostClient::new(&env["BAZAAR_API_URL"], &secret);
    for (i, id) in host_ids_in_order(base, &secret).await.iter().enumerate() {
        let want = format!("127.0.0.1:{}", base + 40 + i as u16);
        let hop = bazaar_testkit::eventually(Duration::from_secs(10), || async {
            let hosts = c.catalog_hosts().await.ok()?;
            let h = hosts.into_iter().find(|h| &h.id == id)?;
            h.labels.get("proxy_hop_addr").cloned()
        })
        .await
        .ok();
        assert_eq!(
            hop.as_deref(),
            Some(want.as_str()),
            "host {i}'s hop listener"
        );
    }
    let m = c
        .create(&create_request("devapp", &["sleep", "1000"]))
        .await
        .unwrap();
    let pid = wait_state(&c, &m.id, MachineState::Started)
        .await
        .pid
        .unwrap();

    stop_dev(dev);
    assert!(!pid_alive(pid), "stopping dev stops its workloads");

    // Resume: same hosts, the machine comes back started.
    let dev = start_dev(&dir, base, gossip);
    let env2 = read_env(&dir);
    assert_eq!(env2["BAZAAR_TOKEN"], token, "same token after resume");
    let c = HostClient::new(&env2["BAZAAR_API_URL"], &secret);
    let back = bazaar_testkit::eventually(Duration::from_secs(20), || async {
        let x = c.machine(&m.id).await.ok()?;
        (x.state == MachineState::Started && x.pid.is_some_and(|p| p != pid)).then_some(x)
    })
    .await
    .expect("the machine is relaunched when the cluster resumes");
    let new_pid = back.pid.unwrap();
    stop_dev(dev);
    assert!(!pid_alive(new_pid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_with_api_tls_serves_https_and_dev_env_points_the_cli_at_it() {
    let dir = tempfile::tempdir().unwrap();
    let base = free_ports(3);
    let gossip = free_ports(3);
    let dev = start_dev_with(dir.path(), base, gossip, &["--api-tls"]);
    let env = read_env(dir.path());
    let api_url = &env["BAZAAR_API_URL"];
    assert_eq!(api_url, &format!("https://127.0.0.1:{base}"));
    let ca_cert = &env["BAZAAR_CA_CERT"];
    assert!(std::path::Path::new(ca_cert).exists(), "{ca_cert}");
    // The CLI with dev.env as it is: every host's API, over HTTPS.
    for i in 0..3 {
        let out = Command::new(EXE)
            .args(["apps", "create", &format!("tls{i}")])
            .env("BAZAAR_API_URL", format!("https://127.0.0.1:{}", base + i))
            .env("BAZAAR_TOKEN", &env["BAZAAR_TOKEN"])
            .env("BAZAAR_CA_CERT", ca_cert)
            .output()
            .unwrap();
        assert!(out.status.success(), "host {i}: {out:?}");
    }
    // Plain HTTP is refused.
    let r = reqwest::get(format!("http://127.0.0.1:{base}/v1/apps"))
        .await
        .unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::BAD_REQUEST);
    stop_dev(dev);
}
