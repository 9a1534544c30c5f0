//! The placement round's latency with a placement policy and with preemption, against the
//! plain round, in one run on a three-host loopback cluster (issue 34; BENCHMARKS.md,
//! docs/benchmarks/placement.md). Ignored by default (a measurement, not a check):
//! `cargo nextest run -p bazaar --test e2e_api placement_latency:: --run-ignored only --no-capture`.
//! Machines are created with `skip_launch` (the round is what is timed, not a launch) and
//! destroyed after each create, so every create finds the same cluster.

use crate::common;

use bazaar_testkit::{start_cluster, Fly};
use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};

const N: usize = 40;

fn body(priority: &str, placement: Option<Value>) -> Value {
    let mut config = process_config(&["sleep", "1000"]);
    config["priority"] = json!(priority);
    if let Some(p) = placement {
        config["placement"] = p;
    }
    json!({"config": config, "region": "local", "skip_launch": true})
}

async fn create(fly: &Fly, b: Value) -> (String, Value) {
    let (s, m) = fly.post("/apps/lat/machines", b).await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let id = m["id"].as_str().unwrap().to_string();
    let (s, p) = fly.get(&format!("/apps/lat/machines/{id}/placement")).await;
    assert_eq!(s, StatusCode::OK, "{p}");
    (id, p)
}

async fn destroy(fly: &Fly, id: &str) {
    let (s, v) = fly
        .delete(&format!("/apps/lat/machines/{id}?force=true"))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = fly
        .get(&format!(
            "/apps/lat/machines/{id}/wait?state=destroyed&timeout=30"
        ))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
}

/// A batch machine, once some host has room again (its destroy reaches the catalog).
async fn refill(fly: &Fly) -> String {
    bazaar_testkit::eventually(std::time::Duration::from_secs(10), || async {
        let (s, m) = fly.post("/apps/lat/machines", body("batch", None)).await;
        (s == StatusCode::OK).then(|| m["id"].as_str().unwrap().to_string())
    })
    .await
    .expect("room for a batch machine")
}

fn pct(mut v: Vec<u64>, p: f64) -> f64 {
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --run-ignored only --no-capture"]
async fn placement_round_latency_plain_constrained_and_preempting() {
    let agents = start_cluster(std::path::Path::new(EXE), 3, |i, o| {
        o.memory_mb = 512;
        for l in [
            format!("disk={}", ["nvme", "ssd", "nvme"][i]),
            format!("zone={i}"),
        ] {
            o.extra_args.extend(["--label".to_string(), l]);
        }
    })
    .unwrap();
    let fly = Fly::new(&agents[0]);
    wait_for_hosts(&fly, 3).await;
    let (s, v) = fly.post("/apps", json!({"app_name": "lat"})).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let policy = json!({
        "constraints": [{"label": "disk", "value": "nvme"}, {"label": "zone", "op": "exists"}],
        "affinities": [{"label": "zone", "value": "0", "weight": 50}],
        "spread": {"by": "label:zone"}
    });
    let mut rows = Vec::new();
    for (name, placement) in [("plain", None), ("constraints", Some(policy))] {
        let (mut round, mut total) = (Vec::new(), Vec::new());
        for _ in 0..N {
            let (id, p) = create(&fly, body("default", placement.clone())).await;
            round.push(p["rounds"][0]["elapsed_us"].as_u64().unwrap());
            total.push(p["elapsed_us"].as_u64().unwrap());
            destroy(&fly, &id).await;
        }
        rows.push((name, round, total));
    }
    // Every slot taken by batch machines; each critical create preempts one.
    let mut batch = Vec::new();
    for _ in 0..6 {
        batch.push(refill(&fly).await);
    }
    let (mut round, mut total) = (Vec::new(), Vec::new());
    for _ in 0..N {
        let (id, p) = create(&fly, body("critical", None)).await;
        let rounds = p["rounds"].as_array().unwrap();
        let last = rounds.last().unwrap();
        assert!(
            last["asked"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a["victims"].as_array().is_some_and(|v| !v.is_empty())),
            "placed by preemption: {p}"
        );
        round.push(last["elapsed_us"].as_u64().unwrap());
        total.push(p["elapsed_us"].as_u64().unwrap());
        // Put the cluster back: the critical machine and its victim go, a batch refills.
        let victim = batch
            .iter()
            .position(|b| p["reason"].as_str().unwrap().contains(b.as_str()))
            .expect("the reason names the victim");
        let victim = batch.remove(victim);
        destroy(&fly, &id).await;
        destroy(&fly, &victim).await;
        batch.push(refill(&fly).await);
    }
    rows.push(("preemption", round, total));
    println!(
        "| placement ({N} creates each) | round p50 | round p99 | whole placement p50 | p99 |"
    );
    println!("|---|---|---|---|---|");
    for (name, round, total) in rows {
        println!(
            "| {name} | {:.2} ms | {:.2} ms | {:.2} ms | {:.2} ms |",
            pct(round.clone(), 0.5),
            pct(round, 0.99),
            pct(total.clone(), 0.5),
            pct(total, 0.99)
        );
    }
    for b in &batch {
        destroy(&fly, b).await;
    }
    drop(agents);
}
