//! A rolling upgrade of the whole fleet under traffic (docs/INSTALL.md, "Upgrades"): every
//! agent of a 3-agent cluster is stopped and started again on a new binary (a copy of the
//! built one, with its shim beside it), one at a time, while requests go through the
//! proxies of the other agents: every one is answered (the restarting agent's proxy
//! finishes the answers it has under way and sends new hops elsewhere; the other proxies
//! go to another machine while it is down), every workload keeps its pid, and each agent
//! then runs the new binary. A soft limit of 1 spreads each proxy's four clients over
//! every machine, so the restarting host's machine is always being reached by hops. The
//! same again on `bazaar lab` hosts (network namespaces, the lab's `upgrade`).

use crate::lab_support;
use crate::proxy;

use proxy::*;
use reqwest::{Method, StatusCode};
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_agent_moves_to_a_new_binary_one_at_a_time_under_traffic() {
    let mut c = Cluster::start(3, &[]);
    c.create_app("roll").await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(
            c.create_machine(
                "roll",
                json!({"concurrency": {"type": "requests", "soft_limit": 1}}),
                json!({}),
            )
            .await,
        );
    }
    for i in 0..3 {
        c.wait_routable(i, "roll").await;
    }
    let before = pids(&c.fly, &ids).await;
    assert!(
        before.iter().all(|(s, p)| s == "started" && p.is_number()),
        "{before:?}"
    );

    let dir = tempfile::tempdir().unwrap();
    let next = dir.path().join("bazaar");
    std::fs::copy(EXE, &next).unwrap();
    let shim = std::path::Path::new(EXE).with_file_name("bazaar-shim");
    if shim.exists() {
        std::fs::copy(&shim, dir.path().join("bazaar-shim")).unwrap();
    }

    for u in 0..3 {
        // Four clients on each of the other proxies.
        let proxies = (0..3)
            .filter(|j| *j != u)
            .map(|j| (j, c.agents[j].proxy_url()))
            .collect();
        let traffic = Traffic::start(c.http.clone(), proxies, "roll.localhost");
        tokio::task::block_in_place(|| {
            c.agents[u].stop().unwrap();
            c.agents[u].opts.exe = next.clone();
            c.agents[u].spawn(&[]).unwrap();
        });
        c.wait_routable(u, "roll").await;
        traffic.stop_and_check(&format!("agent {u}")).await;
        let pid = c.agents[u].pid().unwrap();
        assert_eq!(
            std::fs::read_link(format!("/proc/{pid}/exe")).unwrap(),
            next.canonicalize().unwrap()
        );
    }
    assert_eq!(
        pids(&c.fly, &ids).await,
        before,
        "a workload was started anew"
    );
}

/// The same on `bazaar lab` hosts (root: each agent in a network namespace of its own,
/// with its machines on its own bridge, hops between hosts over their addresses), through
/// the lab's own `upgrade`, one host after the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_lab_host_moves_to_a_new_binary_one_at_a_time_under_traffic() {
    let (t, _) = lab_support::TestLab::up("roll", &["--hosts", "3", "--wait-converged"]);
    let lab = t.lab();
    let hosts = ["h1", "h2", "h3"];
    let api = lab_support::LabApi::of(&lab, "h1");
    let (s, v) = api
        .call(
            Method::POST,
            "/v1/apps",
            Some(json!({"app_name": "roll", "org_slug": "personal"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let config = json!({
        "image": "process", "driver": "process",
        "init": {"exec": ["sh", "-c", "cd / && exec python3 -m http.server $PORT"]},
        "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256},
        "services": [{"internal_port": 8080, "protocol": "tcp",
                      "concurrency": {"type": "requests", "soft_limit": 1}}],
    });
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (s, m) = api
            .call(
                Method::POST,
                "/v1/apps/roll/machines",
                Some(json!({"config": config})),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{m}");
        ids.push(m["id"].as_str().unwrap().to_string());
    }
    let machines = || async {
        let mut out = Vec::new();
        for id in &ids {
            let (_, m) = api.get(&format!("/v1/apps/roll/machines/{id}")).await;
            out.push((m["state"].clone(), m["pid"].clone()));
        }
        out
    };
    let proxy = |h: &str| lab.proxy_url(&lab.host(h).unwrap());
    let serves = |h: &'static str| {
        let url = proxy(h);
        async move {
            reqwest::Client::new()
                .get(url)
                .header("host", "roll.localhost")
                .timeout(Duration::from_secs(5))
                .send()
                .await
                .is_ok_and(|r| r.status() == StatusCode::OK)
        }
    };
    lab_support::until(60, "every machine started", || async {
        machines()
            .await
            .iter()
            .all(|(s, p)| s == "started" && p.is_number())
    })
    .await;
    for h in hosts {
        lab_support::until(30, "the app serves through every proxy", || serves(h)).await;
    }
    let before = machines().await;

    let dir = tempfile::tempdir().unwrap();
    let next = dir.path().join("bazaar");
    std::fs::copy(EXE, &next).unwrap();
    let shim = std::path::Path::new(EXE).with_file_name("bazaar-shim");
    if shim.exists() {
        std::fs::copy(&shim, dir.path().join("bazaar-shim")).unwrap();
    }
    for (u, h) in hosts.iter().enumerate() {
        let proxies = hosts
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != u)
            .map(|(j, other)| (j, proxy(other)))
            .collect();
        let traffic = Traffic::start(reqwest::Client::new(), proxies, "roll.localhost");
        tokio::task::block_in_place(|| {
            t.cli(&["upgrade", h, "--binary", next.to_str().unwrap()]);
        });
        lab_support::until(30, "the upgraded host's proxy serves", || serves(h)).await;
        traffic.stop_and_check(&format!("lab host {h}")).await;
        let agent = t.lab().agent(&lab.host(h).unwrap()).unwrap();
        assert_eq!(
            std::fs::read_link(format!("/proc/{}/exe", agent.pid)).unwrap(),
            next.canonicalize().unwrap()
        );
    }
    assert_eq!(machines().await, before, "a workload was started anew");
    t.cli(&["down"]);
}

/// Requests in a loop, four clients on each proxy, counting what is answered 200 and what
/// is not (with why).
struct Traffic {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failed: Arc<Mutex<Vec<String>>>,
    clients: Vec<tokio::task::JoinHandle<()>>,
}

impl Traffic {
    /// Starts the clients on `proxies` (index, URL) for the app at `host`.
    fn start(http: reqwest::Client, proxies: Vec<(usize, String)>, host: &'static str) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(Mutex::new(Vec::new()));
        let mut clients = Vec::new();
        for (j, url) in proxies
            .into_iter()
            .flat_map(|p| [p.clone(), p.clone(), p.clone(), p])
        {
            let (http, stop, ok, failed) = (http.clone(), stop.clone(), ok.clone(), failed.clone());
            clients.push(tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let answer = http
                        .get(format!("{url}/"))
                        .header("host", host)
                        .timeout(Duration::from_secs(10))
                        .send()
                        .await;
                    match answer {
                        Ok(r) if r.status() == StatusCode::OK => {
                            ok.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok(r) => {
                            let status = r.status();
                            let text = r.text().await.unwrap_or_default();
                            failed
                                .lock()
                                .unwrap()
                                .push(format!("{status} via proxy {j}: {text}"));
                        }
                        Err(e) => failed.lock().unwrap().push(format!("{e} via proxy {j}")),
                    }
                }
            }));
        }
        Traffic {
            stop,
            ok,
            failed,
            clients,
        }
    }

    /// Stops the clients; every request was answered, and some went through.
    async fn stop_and_check(self, upgrading: &str) {
        self.stop.store(true, Ordering::SeqCst);
        for client in self.clients {
            client.await.unwrap();
        }
        let ok = self.ok.load(Ordering::SeqCst);
        let failed = self.failed.lock().unwrap();
        eprintln!(
            "upgrading {upgrading}: {ok} requests answered, {} failed {failed:?}",
            failed.len()
        );
        assert!(ok > 0);
        assert!(
            failed.is_empty(),
            "requests failed through the other proxies while {upgrading} restarted: {failed:?}"
        );
    }
}

/// Each machine's state and workload pid, as the Machines API answers.
async fn pids(
    fly: &bazaar_testkit::Fly,
    ids: &[String],
) -> Vec<(serde_json::Value, serde_json::Value)> {
    let mut pids = Vec::new();
    for id in ids {
        let (_, m) = fly.get(&format!("/apps/roll/machines/{id}")).await;
        pids.push((m["state"].clone(), m["pid"].clone()));
    }
    pids
}
