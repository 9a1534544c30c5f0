//! Preemption (issue 34 item 1, docs/POLICY.md) on a full agent in the test's own process:
//! a `critical` machine displaces a `batch` one (its `preempted` event names the
//! preemptor, and its start is then refused for capacity: it gave its resources away),
//! while a `batch` machine displaces nothing and a `default` one neither its own class nor
//! a higher one (409 `insufficient_capacity`).
//! Destroying the critical machine gives the room back to the batch machine's start.

use axum::http::{Method, StatusCode};
use bazaar_testkit::api_token;
use bazaar_testkit::in_process::{oneshot, InProcessAgent};
use serde_json::{json, Value};

fn create(priority: &str) -> String {
    json!({
        "config": {"driver": "process", "init": {"exec": ["sleep", "100"]}, "priority": priority,
                   "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256}},
        "skip_launch": true,
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_critical_machine_displaces_a_batch_one_and_never_the_reverse() {
    let mut node = InProcessAgent::start_with(|c| c.memory_mb = Some(512))
        .await
        .unwrap();
    let api = bazaar_api::router(node.node());
    node.serve(api.clone());
    let token = Some(api_token());
    let body = json!({"app_name": "pre", "org_slug": "personal"}).to_string();
    let (s, v) = oneshot(&api, Method::POST, "/v1/apps", token, Some(&body)).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let path = "/v1/apps/pre/machines";
    let mut ids = Vec::new();
    for priority in ["batch", "default"] {
        let (s, m) = oneshot(&api, Method::POST, path, token, Some(&create(priority))).await;
        assert_eq!(s, StatusCode::OK, "{m}");
        ids.push(m["id"].as_str().unwrap().to_string());
    }
    let (s, v) = oneshot(&api, Method::POST, path, token, Some(&create("batch"))).await;
    assert_eq!(s, StatusCode::CONFLICT, "batch displaces nothing: {v}");
    assert_eq!(v["status"], "insufficient_capacity", "{v}");
    let (s, m) = oneshot(&api, Method::POST, path, token, Some(&create("critical"))).await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let critical = m["id"].as_str().unwrap().to_string();
    let batch = &ids[0];
    let (s, b): (StatusCode, Value) =
        oneshot(&api, Method::GET, &format!("{path}/{batch}"), token, None).await;
    assert_eq!(s, StatusCode::OK, "{b}");
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
    let (s, p) = oneshot(
        &api,
        Method::GET,
        &format!("{path}/{critical}/placement"),
        token,
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{p}");
    let bid = p["rounds"].as_array().unwrap().last().unwrap()["asked"][0].clone();
    assert_eq!(bid["victims"], json!([format!("{batch} (batch)")]), "{p}");
    // Now no machine of a lower class is left: a default one displaces nothing (not its
    // own class, not the critical one).
    let (s, v) = oneshot(&api, Method::POST, path, token, Some(&create("default"))).await;
    assert_eq!(s, StatusCode::CONFLICT, "default displaces nothing: {v}");
    assert_eq!(v["status"], "insufficient_capacity", "{v}");
    // The default machine was not touched: no preempted event.
    let (_, d): (StatusCode, Value) = oneshot(
        &api,
        Method::GET,
        &format!("{path}/{}", ids[1]),
        token,
        None,
    )
    .await;
    assert!(
        !d["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["type"] == "preempted"),
        "{d}"
    );
    // The host's ledger: the two machines that hold resources fill it; the batch one
    // holds nothing, so starting it is refused until there is room again.
    let info = node.agent.info().await;
    assert_eq!(info.committed.memory_mb, 512, "{info:?}");
    let start = format!("{path}/{batch}/start");
    let (s, v) = oneshot(&api, Method::POST, &start, token, None).await;
    assert!(s.is_client_error(), "{s} {v}");
    let (s, v) = oneshot(
        &api,
        Method::DELETE,
        &format!("{path}/{critical}?force=true"),
        token,
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    bazaar_testkit::eventually(std::time::Duration::from_secs(10), || async {
        (node.agent.info().await.committed.memory_mb == 256).then_some(())
    })
    .await
    .expect("the destroy frees the critical machine's share");
    let (s, v) = oneshot(&api, Method::POST, &start, token, None).await;
    assert_eq!(
        s,
        StatusCode::OK,
        "with room again the batch machine starts: {v}"
    );
    assert_eq!(node.agent.info().await.committed.memory_mb, 512);
    node.stop().await;
}
