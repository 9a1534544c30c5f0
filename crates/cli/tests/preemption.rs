//! Preemption (issue 34 item 1, docs/POLICY.md) on a real two-host cluster whose hosts are
//! full: a `critical` machine is placed by stopping a `batch` machine (the host that would
//! stop a `default` one loses the exchange), the batch machine's `preempted` event names
//! the preemptor, and its start is then refused for capacity (it gave its resources away);
//! a `batch` machine displaces nothing and a `default` one never its own or a higher class
//! (409 `insufficient_capacity`, nothing stopped); the placement record shows the preemption
//! bids.

use crate::common;

use bazaar_testkit::{start_cluster, Fly};
use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};

fn machine(priority: &str, host: Option<&str>) -> Value {
    let mut config = process_config(&["sleep", "1000"]);
    config["priority"] = json!(priority);
    if let Some(h) = host {
        config["placement"] = json!({"constraints": [{"label": "name", "value": h}]});
    }
    json!({"config": config, "region": "local"})
}

async fn create(fly: &Fly, priority: &str, host: Option<&str>) -> (StatusCode, Value) {
    fly.post("/apps/pre/machines", machine(priority, host))
        .await
}

async fn state(fly: &Fly, id: &str) -> Value {
    let (s, m) = fly.get(&format!("/apps/pre/machines/{id}")).await;
    assert_eq!(s, StatusCode::OK, "{m}");
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_critical_machine_stops_a_batch_one_never_the_reverse() {
    // Two hosts of two 256 MB machines each.
    let agents = start_cluster(std::path::Path::new(EXE), 2, |i, o| {
        o.memory_mb = 512;
        o.extra_args
            .extend(["--label".to_string(), format!("name={}", ["a", "b"][i])]);
    })
    .unwrap();
    let fly = Fly::new(&agents[0]);
    wait_for_hosts(&fly, 2).await;
    let (s, v) = fly.post("/apps", json!({"app_name": "pre"})).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    // Host a: a batch and a default machine; host b: two default machines.
    let mut ids = Vec::new();
    for (priority, host) in [
        ("batch", "a"),
        ("default", "a"),
        ("default", "b"),
        ("default", "b"),
    ] {
        let (s, m) = create(&fly, priority, Some(host)).await;
        assert_eq!(s, StatusCode::OK, "{m}");
        let id = m["id"].as_str().unwrap().to_string();
        wait_started(&fly, "pre", &id).await;
        ids.push(id);
    }
    let batch = ids[0].clone();

    // A batch machine preempts nothing.
    let (s, v) = create(&fly, "batch", None).await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["status"], "insufficient_capacity", "{v}");
    for id in &ids {
        assert_eq!(state(&fly, id).await["state"], "started", "nothing stopped");
    }

    // A critical machine: host a stops its batch machine, host b would stop a default one.
    let (s, m) = create(&fly, "critical", None).await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let critical = m["id"].as_str().unwrap().to_string();
    wait_started(&fly, "pre", &critical).await;
    let (s, v) = fly
        .get(&format!(
            "/apps/pre/machines/{batch}/wait?state=stopped&timeout=30"
        ))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let b = state(&fly, &batch).await;
    let event = b["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "preempted")
        .unwrap_or_else(|| panic!("a preempted event: {b}"));
    assert_eq!(
        event["status"],
        format!("stopped for machine {critical} (critical) by preemption")
    );
    // Now no batch machine runs: a default one displaces neither its own class nor the
    // critical one.
    let (s, v) = create(&fly, "default", None).await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["status"], "insufficient_capacity", "{v}");
    for id in ids[1..].iter().chain([&critical]) {
        assert_eq!(
            state(&fly, id).await["state"],
            "started",
            "never the reverse"
        );
    }
    // The record shows both hosts' preemption bids and the winner.
    let (s, p) = fly
        .get(&format!("/apps/pre/machines/{critical}/placement"))
        .await;
    assert_eq!(s, StatusCode::OK, "{p}");
    let bids: Vec<&Value> = p["rounds"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["asked"].as_array().unwrap())
        .filter(|a| a["outcome"] == "bid")
        .collect();
    assert_eq!(bids.len(), 2, "{p}");
    assert!(
        bids.iter()
            .any(|b| b["victims"] == json!([format!("{batch} (batch)")])),
        "{p}"
    );
    assert!(
        p["reason"].as_str().unwrap().contains(&batch),
        "the reason names the victim: {p}"
    );
    // The batch machine gave its resources to the critical one: starting it is refused.
    let (s, v) = fly
        .post(&format!("/apps/pre/machines/{batch}/start"), json!({}))
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["status"], "insufficient_capacity", "{v}");
    assert_eq!(state(&fly, &critical).await["state"], "started");
    for id in ids.iter().skip(1).chain([&critical]) {
        let (s, v) = fly
            .delete(&format!("/apps/pre/machines/{id}?force=true"))
            .await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }
    drop(agents);
}
