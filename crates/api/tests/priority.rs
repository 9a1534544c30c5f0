//! `config.priority` (issue 34, docs/POLICY.md) on an agent in the test's own process: a
//! named class is taken and echoed back, a machine without one is `default` (the key left
//! out), and any other value is refused with a 400 naming it, making no machine.

use axum::http::{Method, StatusCode};
use bazaar_testkit::api_token;
use bazaar_testkit::in_process::{oneshot, InProcessAgent};
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_priority_class_is_kept_and_an_unknown_one_refused_with_400() {
    let mut node = InProcessAgent::start().await.unwrap();
    let api = bazaar_api::router(node.node());
    node.serve(api.clone());
    let body = json!({"app_name": "prio", "org_slug": "personal"}).to_string();
    let (s, v) = oneshot(
        &api,
        Method::POST,
        "/v1/apps",
        Some(api_token()),
        Some(&body),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let create = |priority: Option<&str>| {
        let mut config = json!({"driver": "process", "init": {"exec": ["sleep", "100"]}});
        if let Some(p) = priority {
            config["priority"] = json!(p);
        }
        json!({"config": config, "skip_launch": true}).to_string()
    };
    let path = "/v1/apps/prio/machines";

    let (s, v) = oneshot(
        &api,
        Method::POST,
        path,
        Some(api_token()),
        Some(&create(Some("batch"))),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["config"]["priority"], "batch", "{v}");
    let (s, v) = oneshot(
        &api,
        Method::POST,
        path,
        Some(api_token()),
        Some(&create(None)),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert!(v["config"].get("priority").is_none(), "{v}");

    let (s, v) = oneshot(
        &api,
        Method::POST,
        path,
        Some(api_token()),
        Some(&create(Some("urgent"))),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let error = v["error"]
        .as_str()
        .unwrap_or_else(|| panic!("not Fly's error shape: {v}"));
    assert!(
        error.contains("urgent") && error.contains("critical"),
        "{error}"
    );

    let (s, v): (StatusCode, Value) =
        oneshot(&api, Method::GET, path, Some(api_token()), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        v.as_array().unwrap().len(),
        2,
        "the refused create made nothing: {v}"
    );
    node.stop().await;
}
