//! Machine operations of the Fly Machines API beyond the lifecycle, on a loopback cluster:
//! `wait` with `event_id` and `from_event_id`, `ps`, and the machine view's `image_ref`.

mod common;

use bazaar_testkit::start_cluster;
use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::path::Path;

fn process_config(cmd: &[&str]) -> Value {
    json!({"image": "process", "driver": "process", "init": {"exec": cmd},
           "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256}})
}

const SLEEPER: &[&str] = &["sh", "-c", "while true; do sleep 0.2; done"];

/// `GET .../wait` with a query; answers (status, body).
async fn wait(fly: &Fly, app: &str, id: &str, query: &str) -> (StatusCode, Value) {
    fly.get(&format!("/apps/{app}/machines/{id}/wait?{query}"))
        .await
}

/// The machine's events, newest first.
async fn events(fly: &Fly, app: &str, id: &str) -> Vec<Value> {
    let (s, v) = fly
        .get(&format!("/apps/{app}/machines/{id}/events?limit=50"))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    v.as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_answers_the_event_and_waits_past_from_event_id() {
    let agents = start_cluster(Path::new(EXE), 2, |_, _| {}).unwrap();
    let fly = Fly::new(&agents[0]);
    fly.create_app("w").await;
    let (s, m) = fly
        .post("/apps/w/machines", json!({"config": process_config(SLEEPER)}))
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let id = m["id"].as_str().unwrap().to_string();

    // The event that satisfied the wait is the start event.
    let (s, v) = wait(&fly, "w", &id, "state=started&timeout=30").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let started = v["event_id"].as_str().unwrap().to_string();
    let evs = events(&fly, "w", &id).await;
    assert_eq!(evs[0]["id"], started.as_str(), "{evs:?}");
    assert_eq!(evs[0]["status"], "started");

    // Nothing newer yet: a wait past it times out, though the machine is started.
    let (s, v) = wait(
        &fly,
        "w",
        &id,
        &format!("state=started&timeout=1&from_event_id={started}"),
    )
    .await;
    assert_eq!(s, StatusCode::REQUEST_TIMEOUT, "{v}");

    // An update: its own event does not satisfy the wait, the start after it does.
    let mut config = process_config(SLEEPER);
    config["env"] = json!({"GENERATION": "2"});
    let (s, u) = fly
        .post(&format!("/apps/w/machines/{id}"), json!({"config": config}))
        .await;
    assert_eq!(s, StatusCode::OK, "{u}");
    let (s, v) = wait(
        &fly,
        "w",
        &id,
        &format!("state=started&timeout=30&from_event_id={started}"),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let restarted = v["event_id"].as_str().unwrap().to_string();
    assert!(restarted > started, "{restarted} after {started}");
    let evs = events(&fly, "w", &id).await;
    let satisfied = evs.iter().find(|e| e["id"] == restarted.as_str()).unwrap();
    assert_eq!(satisfied["type"], "start", "{evs:?}");
    assert_eq!(satisfied["status"], "started");
    let update = evs.iter().find(|e| e["type"] == "update").unwrap();
    assert!(
        update["id"].as_str().unwrap() < restarted.as_str(),
        "the update came before: {evs:?}"
    );
    assert_eq!(v["version"], u["instance_id"], "{v} {u}");

    // Stop: the wait for stopped names the exit event.
    let (s, _) = fly
        .post(&format!("/apps/w/machines/{id}/stop"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, v) = wait(
        &fly,
        "w",
        &id,
        &format!("state=stopped&timeout=30&from_event_id={restarted}"),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let evs = events(&fly, "w", &id).await;
    assert_eq!(evs[0]["id"], v["event_id"], "{evs:?}");
    assert_eq!(evs[0]["status"], "stopped");

    // Bad input: a clear 400.
    for bad in ["nope", "../x", "01ARZ3NDEKTSV4RRFFQ69G5FA"] {
        let (s, v) = wait(
            &fly,
            "w",
            &id,
            &format!("state=stopped&timeout=1&from_event_id={bad}"),
        )
        .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}: {v}");
        assert!(
            v["error"].as_str().unwrap().contains("from_event_id"),
            "{v}"
        );
    }
}
