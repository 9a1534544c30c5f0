//! The guardian (root, on the lab): a host with machines that opted in to re-placement is
//! crashed; once it has been dead for `--replace-after`, the same machines (same ids, a
//! higher epoch) run on the other hosts of its region and serve through the proxy, each
//! exactly once although two hosts could decide; machines that did not opt in, that
//! mount a volume or that were not started stay where they were. When the crashed host
//! comes back it never relaunches its old copies, destroys them, and every catalog lists
//! each machine once. Bad opt-ins are refused with 400.

use crate::lab_support;

use bazaar_lab::Lab;
use lab_support::{until, until_seen, LabApi as Node, TestLab};
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const DEAD_AFTER_MS: u64 = 2000;
const REPLACE_AFTER_MS: u64 = 3000;
const KEY: &str = "bazaar_replace_on_host_failure";

/// What these tests ask a lab host's API.
impl Node {
    /// The catalog rows of `app` as this node lists them (one per machine id).
    async fn rows(&self, app: &str) -> Option<Vec<Value>> {
        let (s, v) = self.get(&format!("/v1/catalog/machines?app={app}")).await;
        (s == StatusCode::OK).then(|| v.as_array().unwrap().clone())
    }

    /// The ids the Machines API lists for `app`.
    async fn listed(&self, app: &str) -> Option<Vec<String>> {
        let (s, v) = self.get(&format!("/v1/apps/{app}/machines")).await;
        (s == StatusCode::OK).then(|| {
            let mut ids: Vec<String> = v
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["id"].as_str().unwrap().to_string())
                .collect();
            ids.sort();
            ids
        })
    }
}

fn config(mark: &str, opted_in: Option<&str>) -> Value {
    let mut c = json!({
        "image": "process", "driver": "process",
        "init": {"exec": ["sh", "-c", "cd / && exec python3 -m http.server $PORT"]},
        "env": {"LAB_MARK": mark},
        "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256},
        "services": [{"internal_port": 8080, "protocol": "tcp"}],
    });
    if let Some(v) = opted_in {
        c["metadata"] = json!({ KEY: v });
    }
    c
}

/// Pids of the workloads whose environment holds `LAB_MARK=<mark>`.
fn workload_pids(mark: &str) -> Vec<u32> {
    let needle = format!("LAB_MARK={mark}\0");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            (String::from_utf8_lossy(&env).contains(&needle)
                && String::from_utf8_lossy(&cmd).contains("http.server"))
            .then_some(pid)
        })
        .collect()
}

/// The lab host whose agent started workload `pid` (an ancestor of it).
fn host_of_workload(lab: &Lab, pid: u32) -> String {
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
            return h.name.clone();
        }
        p = parent(p).unwrap_or_else(|| panic!("no lab agent above workload {pid}"));
    }
    panic!("no lab agent above workload {pid}");
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

/// Creates a machine directly on the host behind `node` (the host interface), and waits
/// until it is in `state`.
async fn create_on(node: &Node, app: &str, config: Value, skip_launch: bool) -> String {
    let (s, m) = node
        .post(
            "/host/v1/machines",
            json!({"app": app, "config": config, "skip_launch": skip_launch}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let id = m["id"].as_str().unwrap().to_string();
    let state = if skip_launch { "created" } else { "started" };
    let (s, v) = node
        .get(&format!(
            "/v1/apps/{app}/machines/{id}/wait?state={state}&timeout=30"
        ))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_hosts_opted_in_machines_run_elsewhere_once_and_its_copies_stop_when_it_returns() {
    let (t, _) = TestLab::up(
        "guardian",
        &[
            "--wait-converged",
            "--hosts",
            "3",
            "--regions",
            "ams",
            "--dead-after-ms",
            &DEAD_AFTER_MS.to_string(),
            "--replace-after-ms",
            &REPLACE_AFTER_MS.to_string(),
        ],
    );
    let t = t.show_log_lines(|l| l.contains("guardian") || l.contains("fence"));
    let lab = t.lab();
    let first = Node::of(&lab, "h1");
    for app in ["keep", "plain", "vol"] {
        let (s, v) = first
            .post("/v1/apps", json!({"app_name": app, "org_slug": "personal"}))
            .await;
        assert_eq!(s, StatusCode::CREATED, "{app}: {v}");
    }

    // Bad opt-ins are refused and create nothing.
    let mut with_volume = config("bad", Some("true"));
    with_volume["mounts"] = json!([{"volume": "vol_x", "path": "/data"}]);
    for (bad, says) in [
        (config("bad", Some("yes")), "\"true\" or \"false\""),
        (with_volume, "volume"),
    ] {
        let (s, v) = first
            .post("/v1/apps/keep/machines", json!({"config": bad}))
            .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
        assert!(v["error"].as_str().unwrap().contains(says), "{v}");
    }
    assert_eq!(first.listed("keep").await, Some(vec![]));

    // A machine with a volume decides which host dies: everything else goes there too.
    let (s, vol) = first
        .post(
            "/v1/apps/vol/volumes",
            json!({"name": "data", "size_gb": 1, "region": "ams"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{vol}");
    let mut vol_config = config("vol-1", None);
    vol_config["mounts"] = json!([{"volume": vol["id"], "path": "/data"}]);
    let (s, m) = first
        .post("/v1/apps/vol/machines", json!({"config": vol_config}))
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let vol_id = m["id"].as_str().unwrap().to_string();
    until(30, "the volume machine runs", || async {
        workload_pids("vol-1").len() == 1
    })
    .await;
    let doomed = host_of_workload(&lab, workload_pids("vol-1")[0]);
    let others: Vec<String> = ["h1", "h2", "h3"]
        .iter()
        .map(|h| h.to_string())
        .filter(|h| *h != doomed)
        .collect();
    let on_doomed = Node::of(&lab, &doomed);
    let mut kept = Vec::new();
    for i in 1..=3 {
        kept.push(
            create_on(
                &on_doomed,
                "keep",
                config(&format!("keep-{i}"), Some("true")),
                false,
            )
            .await,
        );
    }
    kept.sort();
    let plain = create_on(&on_doomed, "plain", config("plain-1", None), false).await;
    let resting = create_on(&on_doomed, "keep", config("keep-rest", Some("true")), true).await;
    let mut all_kept = kept.clone();
    all_kept.push(resting.clone());
    all_kept.sort();
    let survivors: Vec<Node> = others.iter().map(|h| Node::of(&lab, h)).collect();
    until(20, "keep serves through another host", || async {
        through_proxy(&lab, &others[0], "keep").await == Some(StatusCode::OK)
    })
    .await;

    // Power loss on that host.
    let crashed_at = Instant::now();
    t.cli(&["crash", &doomed]);
    for i in 1..=3 {
        assert!(workload_pids(&format!("keep-{i}")).is_empty());
    }
    let doomed_id = {
        let rows = survivors[0].rows("keep").await.unwrap();
        rows[0]["host_id"].as_str().unwrap().to_string()
    };

    // Within dead-after + replace-after + placement, the three run elsewhere, each once,
    // with their ids, and serve through the proxy.
    until_seen(30, "the opted-in machines run on live hosts", || async {
        let Some(rows) = survivors[0].rows("keep").await else {
            return Err("no catalog rows from the first survivor".into());
        };
        let moved = rows
            .iter()
            .filter(|r| {
                r["host_status"] == "ok"
                    && r["state"] == "started"
                    && r["host_id"] != doomed_id.as_str()
            })
            .count();
        let pids: Vec<usize> = (1..=3)
            .map(|i| workload_pids(&format!("keep-{i}")).len())
            .collect();
        if moved == 3 && pids.iter().all(|n| *n == 1) {
            return Ok(());
        }
        let rows: Vec<String> = rows
            .iter()
            .map(|r| {
                format!(
                    "{} on {} ({}, host {}, epoch {})",
                    r["id"], r["host_id"], r["state"], r["host_status"], r["epoch"]
                )
            })
            .collect();
        Err(format!(
            "{moved} of 3 moved and started; workloads of keep-1..3: {pids:?}; rows: {rows:?}"
        ))
    })
    .await;
    until(20, "keep serves again through a live host", || async {
        through_proxy(&lab, &others[1], "keep").await == Some(StatusCode::OK)
    })
    .await;
    let serving_again = crashed_at.elapsed();
    eprintln!(
        "guardian: crash to serving again {} ms (dead after {DEAD_AFTER_MS} ms, replace after {REPLACE_AFTER_MS} ms)",
        serving_again.as_millis()
    );
    assert!(
        serving_again < Duration::from_millis(DEAD_AFTER_MS * 3 + REPLACE_AFTER_MS + 10_000),
        "{serving_again:?}"
    );

    // Both live hosts could have decided: still one copy each, listed once everywhere,
    // with epoch 1; the resting, the not-opted-in and the volume machines stayed.
    tokio::time::sleep(Duration::from_millis(REPLACE_AFTER_MS)).await;
    for node in &survivors {
        assert_eq!(node.listed("keep").await.unwrap(), all_kept);
        for row in node.rows("keep").await.unwrap() {
            let id = row["id"].as_str().unwrap();
            if id == resting {
                assert_eq!(row["host_id"], doomed_id.as_str(), "{row}");
                assert_eq!(row["host_status"], "unreachable", "{row}");
            } else {
                assert_eq!(row["epoch"], 1, "{row}");
                assert_eq!(row["state"], "started", "{row}");
            }
        }
        for (app, id) in [("plain", &plain), ("vol", &vol_id)] {
            let rows = node.rows(app).await.unwrap();
            assert_eq!(rows.len(), 1, "{rows:?}");
            assert_eq!(rows[0]["id"], id.as_str());
            assert_eq!(rows[0]["host_id"], doomed_id.as_str());
            assert_eq!(rows[0]["host_status"], "unreachable");
        }
    }
    for i in 1..=3 {
        assert_eq!(workload_pids(&format!("keep-{i}")).len(), 1, "keep-{i}");
    }
    assert!(workload_pids("plain-1").is_empty());
    assert!(workload_pids("vol-1").is_empty());
    assert!(workload_pids("keep-rest").is_empty());
    // Machine calls reach the live copy.
    let (s, m) = survivors[1]
        .get(&format!("/v1/apps/keep/machines/{}", kept[0]))
        .await;
    assert_eq!((s, &m["state"]), (StatusCode::OK, &json!("started")), "{m}");

    // The host returns: its copies of the re-placed machines never run again and are
    // destroyed; its other machines come back.
    t.cli(&["restart", &doomed]);
    let back = Instant::now();
    let mut all = survivors;
    all.push(Node::of(&lab, &doomed));
    while back.elapsed() < Duration::from_secs(8) {
        for i in 1..=3 {
            assert!(
                workload_pids(&format!("keep-{i}")).len() <= 1,
                "keep-{i} runs twice after its old host returned"
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    until(
        30,
        "every node lists each machine once, none of the old copies",
        || async {
            for node in &all {
                if node.listed("keep").await.as_ref() != Some(&all_kept) {
                    return false;
                }
                let Some(rows) = node.rows("keep").await else {
                    return false;
                };
                let stale = rows
                    .iter()
                    .any(|r| r["id"] != resting.as_str() && r["host_id"] == doomed_id.as_str());
                if stale {
                    return false;
                }
            }
            true
        },
    )
    .await;
    let (s, v) = all[2].get("/host/v1/machines").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let local: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["state"] != "destroyed")
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    for id in &kept {
        assert!(
            !local.contains(&id.as_str()),
            "{id} still on the old host: {v}"
        );
    }
    for i in 1..=3 {
        assert_eq!(workload_pids(&format!("keep-{i}")).len(), 1, "keep-{i}");
    }
    until(
        30,
        "the machines that stayed run again on their host",
        || async { workload_pids("plain-1").len() == 1 && workload_pids("vol-1").len() == 1 },
    )
    .await;
    until(20, "keep serves through the returned host", || async {
        through_proxy(&lab, &doomed, "keep").await == Some(StatusCode::OK)
    })
    .await;
    t.cli(&["down"]);
}
