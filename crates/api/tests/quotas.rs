//! Quotas per org and app (issue 34, docs/POLICY.md) on an agent in the test's own process:
//! set and shown through the API, a create past a quota refused with 403 naming the quota
//! and the numbers (making nothing), an org's quota counting every app of the org, bad
//! limits refused with 400, and an app of another org not found.

use axum::http::{Method, StatusCode};
use axum::Router;
use bazaar_testkit::api_token;
use bazaar_testkit::in_process::{oneshot, InProcessAgent};
use serde_json::{json, Value};
use std::time::Duration;

async fn call(
    api: &Router,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let body = body.map(|b| b.to_string());
    oneshot(api, method, path, Some(api_token()), body.as_deref()).await
}

async fn create(api: &Router, app: &str, memory_mb: u64) -> (StatusCode, Value) {
    let config = json!({
        "driver": "process",
        "init": {"exec": ["sleep", "100"]},
        "guest": {"cpus": 1, "memory_mb": memory_mb, "cpu_kind": "shared"},
    });
    let body = json!({"config": config, "skip_launch": true});
    call(
        api,
        Method::POST,
        &format!("/v1/apps/{app}/machines"),
        Some(body),
    )
    .await
}

/// Waits until the quota shown at `path` counts `machines` machines in use.
async fn wait_usage(api: &Router, path: &str, machines: u64) {
    bazaar_testkit::eventually(Duration::from_secs(10), || async {
        let (s, v) = call(api, Method::GET, path, None).await;
        (s == StatusCode::OK && v["usage"]["machines"] == machines).then_some(())
    })
    .await
    .unwrap_or_else(|_| panic!("{path} never counted {machines} machines"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_past_a_quota_is_refused_with_403_naming_it() {
    let mut node = InProcessAgent::start().await.unwrap();
    let api = bazaar_api::router(node.node());
    node.serve(api.clone());
    for (app, org) in [("qa", "acme"), ("qb", "acme"), ("qc", "other")] {
        let body = json!({"app_name": app, "org_slug": org});
        let (s, v) = call(&api, Method::POST, "/v1/apps", Some(body)).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
    }
    let app_quota = "/v1/orgs/acme/apps/qa/quota";

    // No quota: no limits, nothing in use.
    let (s, v) = call(&api, Method::GET, app_quota, None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["limits"], json!({}), "{v}");
    assert_eq!(v["scope"], json!({"kind": "app", "name": "qa"}), "{v}");

    let (s, v) = call(&api, Method::POST, app_quota, Some(json!({"machines": 2}))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["limits"]["machines"], 2, "{v}");
    for _ in 0..2 {
        let (s, v) = create(&api, "qa", 256).await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }
    wait_usage(&api, app_quota, 2).await;
    let (s, v) = create(&api, "qa", 256).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert_eq!(
        v["error"],
        "forbidden: quota exceeded: app qa allows 2 machines, 2 in use, this request adds 1",
        "{v}"
    );
    // The other app of the org is not held by qa's quota.
    let (s, v) = create(&api, "qb", 256).await;
    assert_eq!(s, StatusCode::OK, "{v}");

    // The org's memory quota counts both apps: 3 × 256 MB in use.
    let org_quota = "/v1/orgs/acme/quota";
    let (s, v) = call(
        &api,
        Method::POST,
        org_quota,
        Some(json!({"memory_mb": 1024})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    wait_usage(&api, org_quota, 3).await;
    let (s, v) = create(&api, "qb", 512).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert_eq!(
        v["error"],
        "forbidden: quota exceeded: org acme allows 1024 memory_mb, 768 in use, this request adds 512",
        "{v}"
    );
    let (s, grown) = create(&api, "qb", 256).await;
    assert_eq!(s, StatusCode::OK, "{grown}");
    wait_usage(&api, org_quota, 4).await;
    // An update that grows a machine past the org's memory is refused too; one that keeps
    // its size is not.
    let id = grown["id"].as_str().unwrap();
    let path = format!("/v1/apps/qb/machines/{id}");
    let mut config = grown["config"].clone();
    config["guest"]["memory_mb"] = json!(512);
    let (s, v) = call(
        &api,
        Method::POST,
        &path,
        Some(json!({"config": config, "skip_launch": true})),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    assert_eq!(
        v["error"],
        "forbidden: quota exceeded: org acme allows 1024 memory_mb, 1024 in use, this request adds 256",
        "{v}"
    );
    config["guest"]["memory_mb"] = json!(256);
    config["env"] = json!({"SAME": "size"});
    let (s, v) = call(
        &api,
        Method::POST,
        &path,
        Some(json!({"config": config, "skip_launch": true})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    // Another org is not held by acme's quota.
    let (s, v) = call(&api, Method::GET, "/v1/orgs/other/quota", None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["limits"], json!({}), "{v}");
    // Lifting the app's quota lets qa create again; the refused creates made nothing.
    let (s, v) = call(&api, Method::POST, app_quota, Some(json!({}))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = call(&api, Method::GET, "/v1/apps/qa/machines", None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v.as_array().unwrap().len(), 2, "{v}");

    // Bad limits, and an app of another org.
    let (s, v) = call(&api, Method::POST, org_quota, Some(json!({"machine": 3}))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let (s, v) = call(&api, Method::POST, org_quota, Some(json!({"cpus": -1}))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let (s, v) = call(&api, Method::GET, "/v1/orgs/acme/apps/qc/quota", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    node.stop().await;
}
