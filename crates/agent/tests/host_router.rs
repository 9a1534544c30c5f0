//! The host interface router (`/host/v1`) in process
//! (`tower::ServiceExt::oneshot`, no HTTP server) on malformed input: bad JSON, a field of
//! the wrong type, a bad machine id, no or an invalid token, a Machines API token where
//! only the cluster secret goes, an unknown path, a wrong method. Each gets the right 4xx
//! with Fly's `{"error": ...}` body, and none of them creates anything.

use axum::http::{Method, StatusCode};
use axum::Router;
use bazaar_testkit::in_process::{oneshot as call, InProcessAgent};
use bazaar_testkit::TEST_SECRET;
use serde_json::{json, Value};

/// The host interface as `run_agent` serves it (wrong methods answered in Fly's shape).
fn host_router(node: &InProcessAgent) -> Router {
    bazaar_agent::http::router(node.agent.clone()).layer(axum::middleware::map_response(
        bazaar_agent::http::fly_shaped_errors,
    ))
}

/// Asserts `status` and a Fly-shaped body: `{"error": "<string>"}`.
#[track_caller]
fn assert_error(got: (StatusCode, Value), status: StatusCode) {
    let (s, v) = got;
    assert_eq!(s, status, "{v}");
    assert!(v["error"].is_string(), "not Fly's error shape: {v}");
}

const SECRET: Option<&str> = Some(TEST_SECRET);

fn create(config: Value) -> String {
    json!({"app": "web", "config": config}).to_string()
}

fn sleeper() -> Value {
    json!({"image": "process", "driver": "process", "init": {"exec": ["sleep", "1"]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_host_interface_requests_get_fly_shaped_4xx_and_change_nothing() {
    let node = InProcessAgent::start().await.unwrap();
    let host = host_router(&node);
    let machines = "/host/v1/machines";

    // Bad JSON.
    for body in [r#"{"app": "web", "config": "#, "[]", "not json"] {
        assert_error(
            call(&host, Method::POST, machines, SECRET, Some(body)).await,
            StatusCode::BAD_REQUEST,
        );
    }
    // Fields of the wrong type, and a required one missing.
    let mut cpus = sleeper();
    cpus["guest"] = json!({"cpu_kind": "shared", "cpus": "many", "memory_mb": 256});
    let mut exec = sleeper();
    exec["init"]["exec"] = json!(7);
    for body in [
        create(cpus),
        create(exec),
        json!({"app": 5, "config": sleeper()}).to_string(),
        json!({"config": sleeper()}).to_string(),
    ] {
        assert_error(
            call(&host, Method::POST, machines, SECRET, Some(&body)).await,
            StatusCode::BAD_REQUEST,
        );
    }
    assert_error(
        call(
            &host,
            Method::POST,
            "/host/v1/bids",
            SECRET,
            Some(r#"{"cpus": "x"}"#),
        )
        .await,
        StatusCode::BAD_REQUEST,
    );
    // A bad machine id, and a well-formed unknown one.
    for id in ["xyz", "..%2F..%2Fetc", "00000000000000"] {
        for (method, path) in [
            (Method::GET, format!("{machines}/{id}")),
            (Method::POST, format!("{machines}/{id}/stop")),
            (Method::DELETE, format!("{machines}/{id}")),
        ] {
            let body = (method == Method::POST).then_some("{}");
            let (s, v) = call(&host, method, &path, SECRET, body).await;
            assert!(
                s == StatusCode::NOT_FOUND || s == StatusCode::BAD_REQUEST,
                "{path}: {s} {v}"
            );
            assert!(v["error"].is_string(), "{path}: {v}");
        }
    }
    // No token, an invalid one.
    for token in [None, Some("not-the-secret"), Some("")] {
        for (method, path, body) in [
            (Method::GET, "/host/v1/info", None),
            (Method::POST, machines, Some(create(sleeper()))),
        ] {
            assert_error(
                call(&host, method, path, token, body.as_deref()).await,
                StatusCode::UNAUTHORIZED,
            );
        }
    }
    // An unknown endpoint, a wrong method.
    assert_error(
        call(&host, Method::GET, "/host/v1/nothing-here", SECRET, None).await,
        StatusCode::NOT_FOUND,
    );
    let (s, v) = call(&host, Method::PATCH, machines, SECRET, None).await;
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED, "{v}");
    assert_eq!(v, json!({"error": "method not allowed"}));

    // Nothing was created.
    let (s, v) = call(&host, Method::GET, machines, SECRET, None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v, json!([]), "{v}");
    node.stop().await;
}

/// A call forwarded with the app's secrets version (the API node saw `secrets set`) that
/// this host's catalog has not received is refused with a retryable 503 after a short wait,
/// rather than starting a machine without those secrets; nothing is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_needing_secrets_this_host_lacks_is_refused_and_creates_nothing() {
    use axum::body::Body;
    use axum::http::{header, Request};
    let node = InProcessAgent::start().await.unwrap();
    let host = host_router(&node);
    let machines = "/host/v1/machines";
    let with_version = |version: &str| {
        Request::builder()
            .method(Method::POST)
            .uri(machines)
            .header(header::AUTHORIZATION, format!("Bearer {TEST_SECRET}"))
            .header(header::CONTENT_TYPE, "application/json")
            .header(bazaar_node::secrets::SECRETS_VERSION_HEADER, version)
            .body(Body::from(create(sleeper())))
            .unwrap()
    };
    let resp = tower::ServiceExt::oneshot(host.clone(), with_version("3 web"))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(resp.headers()[header::RETRY_AFTER], "1");
    let (s, v) = call(&host, Method::GET, machines, SECRET, None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v, json!([]), "a refused call created {v}");
    node.stop().await;
}
