//! A rolling upgrade of the whole fleet under traffic (docs/INSTALL.md, "Upgrades"): every
//! agent of a 3-agent cluster is stopped and started again on a new binary (a copy of the
//! built one, with its shim beside it), one at a time, while requests go through the
//! proxies of the other agents: every one is answered (the restarting agent's proxy
//! finishes the answers it has under way and sends new hops elsewhere; the other proxies
//! go to another machine while it is down), every workload keeps its pid, and each agent
//! then runs the new binary. A soft limit of 1 spreads each proxy's four clients over
//! every machine, so the restarting host's machine is always being reached by hops.

mod proxy;

use proxy::*;
use reqwest::StatusCode;
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

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
        let stop = Arc::new(AtomicBool::new(false));
        let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let kinds = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let mut traffic = Vec::new();
        // Four clients on each of the other proxies.
        for j in (0..3).filter(|j| *j != u).flat_map(|j| [j; 4]) {
            let (http, url) = (c.http.clone(), c.agents[j].proxy_url());
            let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
            let kinds = kinds.clone();
            traffic.push(tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let answer = http
                        .get(format!("{url}/"))
                        .header("host", "roll.localhost")
                        .timeout(std::time::Duration::from_secs(10))
                        .send()
                        .await;
                    match answer {
                        Ok(r) if r.status() == StatusCode::OK => {
                            ok.fetch_add(1, Ordering::SeqCst);
                        }
                        other => {
                            failed.fetch_add(1, Ordering::SeqCst);
                            let what = match other {
                                Ok(r) => format!(
                                    "{} via proxy {j}: {}",
                                    r.status(),
                                    r.text().await.unwrap_or_default()
                                ),
                                Err(e) => format!("{e} via proxy {j}"),
                            };
                            kinds.lock().unwrap().push(what);
                        }
                    }
                }
            }));
        }
        tokio::task::block_in_place(|| {
            c.agents[u].stop().unwrap();
            c.agents[u].opts.exe = next.clone();
            c.agents[u].spawn(&[]).unwrap();
        });
        c.wait_routable(u, "roll").await;
        stop.store(true, Ordering::SeqCst);
        for t in traffic {
            t.await.unwrap();
        }
        let (ok, failed) = (ok.load(Ordering::SeqCst), failed.load(Ordering::SeqCst));
        eprintln!(
            "upgrading agent {u}: {ok} requests answered, {failed} failed {:?}",
            kinds.lock().unwrap()
        );
        assert!(ok > 0);
        assert_eq!(
            failed,
            0,
            "requests failed through the other proxies while agent {u} restarted: {:?}",
            kinds.lock().unwrap()
        );
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
