//! The Fly Machines API on a 3-agent loopback cluster under demand for capacity: a hundred
//! concurrent creates racing for sixty slots, and a batch asked for in one round and
//! spread over the hosts. The lifecycle and field spellings: `api_machines.rs`.

use crate::common;

use bazaar_testkit::{api_token, start_cluster};
use common::*;
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_concurrent_creates_fill_exactly_sixty_slots() {
    let agents =
        start_cluster(std::path::Path::new(EXE), 3, |_, o| o.memory_mb = 20 * 256).unwrap();
    let fly = Fly::new(&agents[0]);
    fly.post("/apps", json!({"app_name": "race"})).await;
    bazaar_testkit::eventually(Duration::from_secs(10), || async {
        let (_, r) = fly.get("/platform/regions").await;
        (r["regions"][0]["hosts"] == 3).then_some(())
    })
    .await
    .unwrap();
    // Every API node the creates go to knows the app.
    for agent in &agents {
        let other = Fly::new(agent);
        bazaar_testkit::eventually(Duration::from_secs(10), || async {
            let (s, _) = other.get("/apps/race").await;
            (s == StatusCode::OK).then_some(())
        })
        .await
        .expect("every node knows the app");
    }
    let mut tasks = Vec::new();
    for i in 0..100 {
        let base = agents[i % 3].url();
        tasks.push(tokio::spawn(async move {
            let r = Client::new()
                .post(format!("{base}/v1/apps/race/machines"))
                .bearer_auth(api_token())
                .json(&json!({"config": process_config(&["sleep", "1000"]), "region": "local"}))
                .send()
                .await
                .unwrap();
            let status = r.status();
            let body: Value = r.json().await.unwrap();
            (status, body)
        }));
    }
    let mut ok = 0;
    let mut full = 0;
    for t in tasks {
        let (status, body) = t.await.unwrap();
        match status {
            StatusCode::OK => ok += 1,
            StatusCode::CONFLICT if body["status"] == "insufficient_capacity" => {
                if full == 0 {
                    eprintln!("first refusal: {}", body["error"]);
                }
                full += 1
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    // Never more than the slots. Under a heavy load a host may miss a bid's deadline, and
    // the market then answers "no capacity" at once rather than wait (by design): the
    // slots left are filled one create at a time, and exactly 60 fit in all.
    assert!(ok <= 60 && ok + full == 100, "{ok} created, {full} refused");
    while ok < 60 {
        let (status, body) = fly
            .post(
                "/apps/race/machines",
                json!({"config": process_config(&["sleep", "1000"]), "region": "local"}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "slot {} of 60: {body}", ok + 1);
        ok += 1;
    }
    let (status, body) = fly
        .post(
            "/apps/race/machines",
            json!({"config": process_config(&["sleep", "1000"]), "region": "local"}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "a 61st machine: {body}");
    for a in &agents {
        let c = a.client();
        let info = c.info().await.unwrap();
        assert!(info.committed.memory_mb <= info.capacity.memory_mb);
        assert_eq!(info.committed.memory_mb, 20 * 256, "every host full");
        bazaar_testkit::eventually(Duration::from_secs(8), || async {
            (c.info().await.ok()?.num_reservations == 0).then_some(())
        })
        .await
        .expect("no leaked reservation");
        assert_eq!(c.machines(Some("race"), true).await.unwrap().len(), 20);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_asked_for_in_one_round_and_spread_over_the_hosts() {
    // A host whose bid misses the default 250 ms (a loaded 2-core CI machine) is left out of
    // the round and the spread is the others'; this test is about batch sampling and spread.
    let agents = start_cluster(std::path::Path::new(EXE), 3, |_, o| {
        o.memory_mb = 64 * 1024;
        o.extra_args
            .extend(["--bid-deadline-ms".into(), "3000".into()]);
    })
    .unwrap();
    let fly = Fly::new(&agents[0]);
    fly.post("/apps", json!({"app_name": "many"})).await;
    bazaar_testkit::eventually(Duration::from_secs(10), || async {
        let (_, r) = fly.get("/platform/regions").await;
        (r["regions"][0]["hosts"] == 3).then_some(())
    })
    .await
    .unwrap();
    let (s, v) = fly
        .post(
            "/apps/many/machines/batch",
            json!({"config": process_config(&["sleep", "1000"]), "count": 90}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["created"], 90, "every machine placed: {}", v["placement"]);
    let rounds = v["placement"]["rounds"].as_array().unwrap();
    let outcomes: Vec<String> = rounds
        .iter()
        .map(|r| {
            let mut c: std::collections::BTreeMap<String, usize> = Default::default();
            for a in r["asked"].as_array().unwrap() {
                let k = a["outcome"]
                    .as_object()
                    .map(|o| format!("{}", serde_json::Value::Object(o.clone())))
                    .unwrap_or_default();
                *c.entry(k.chars().take(90).collect()).or_default() += 1;
            }
            format!("{c:?}")
        })
        .collect();
    // Batch sampling: the first round asks for all 90 at once (d·N asks, here the whole
    // small region for every machine), rather than one round per machine; later rounds
    // only retry hosts that were too busy to answer in time.
    let first_asks = rounds[0]["asked"].as_array().unwrap().len();
    assert!(first_asks >= 90, "one round asks for all: {outcomes:#?}");
    assert!(rounds.len() <= 3, "{outcomes:#?}");
    let mut per_host: std::collections::HashMap<String, usize> = Default::default();
    for m in v["machines"].as_array().unwrap() {
        *per_host
            .entry(m["host_id"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    assert_eq!(per_host.len(), 3, "spread over every host: {per_host:?}");
    assert!(
        per_host.values().all(|&n| (20..=40).contains(&n)),
        "spread evenly: {per_host:?}"
    );
    for m in v["machines"].as_array().unwrap() {
        wait_started(&fly, "many", m["id"].as_str().unwrap()).await;
    }
}
