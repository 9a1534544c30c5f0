//! The Machines API's request bodies and answers (issue 31 item 1, issue 32 items 1 and
//! 5-8), on an agent in the test's own process whose host interface is served on loopback
//! (machine calls are forwarded to it): a body is read once and authorized as read, a key
//! given twice is refused, sizes are capped, the lease's nonce goes to callers that may
//! use leases, and every refusal is Fly-shaped JSON that changes nothing.

use axum::http::{Method, StatusCode};
use axum::Router;
use bazaar_auth::Scope;
use bazaar_testkit::in_process::{oneshot, send, InProcessAgent};
use bazaar_testkit::{tokens, TEST_SECRET};
use serde_json::{json, Value};

/// The Machines API's org token.
fn org() -> Option<&'static str> {
    Some(bazaar_testkit::api_token())
}

/// An agent serving its host interface, its Machines API, and an app `a1`.
async fn agent_with_app() -> (InProcessAgent, Router) {
    let mut node = InProcessAgent::start().await.unwrap();
    let api = bazaar_api::router(node.node());
    node.serve(api.clone());
    let (s, v) = oneshot(
        &api,
        Method::POST,
        "/v1/apps",
        org(),
        Some(r#"{"app_name": "a1", "org_slug": "personal"}"#),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    (node, api)
}

/// A token for app `a1` only, without the process driver (`token create --app a1`).
fn app_token() -> String {
    tokens::mint(&Scope {
        apps: ["a1".to_string()].into(),
        process: false,
        ..Scope::default()
    })
}

fn sleeper() -> Value {
    json!({"driver": "process", "init": {"exec": ["sleep", "100"]}})
}

/// A machine of `a1` created (not started) with the org token: its id.
async fn machine(api: &Router) -> String {
    let body = json!({"config": sleeper(), "skip_launch": true}).to_string();
    let (s, m) = oneshot(
        api,
        Method::POST,
        "/v1/apps/a1/machines",
        org(),
        Some(&body),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    m["id"].as_str().unwrap().to_string()
}

/// Asserts a Fly-shaped error: `status`, and an `error` string containing `says`.
#[track_caller]
fn assert_error(got: (StatusCode, Value), status: StatusCode, says: &str) {
    let (s, v) = got;
    assert_eq!(s, status, "{v}");
    let error = v["error"]
        .as_str()
        .unwrap_or_else(|| panic!("not Fly's error shape: {v}"));
    assert!(error.contains(says), "{error:?} does not say {says:?}");
}

/// The ids of `a1`'s machines.
async fn machine_ids(api: &Router) -> Vec<String> {
    let (s, v) = oneshot(api, Method::GET, "/v1/apps/a1/machines", org(), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let mut ids: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_given_twice_is_authorized_as_the_handler_reads_it() {
    let (node, api) = agent_with_app().await;
    let id = machine(&api).await;
    let before = machine_ids(&api).await;
    let token = app_token();
    let scoped = Some(token.as_str());
    let update = format!("/v1/apps/a1/machines/{id}");
    // `driver` twice, as the issue's probe sent it: refused to a token without the
    // process driver on create, batch create and update.
    let twice = r#"{"config": {"driver": "process", "driver": "process",
                    "init": {"exec": ["sleep", "100"]}}, "skip_launch": true}"#;
    let twice_batch = r#"{"config": {"driver": "process", "driver": "process",
                    "init": {"exec": ["sleep", "100"]}}, "count": 2, "skip_launch": true}"#;
    for (method, path, body) in [
        (Method::POST, "/v1/apps/a1/machines", twice),
        (Method::POST, "/v1/apps/a1/machines/batch", twice_batch),
        (Method::POST, update.as_str(), twice),
        (Method::PUT, update.as_str(), twice),
    ] {
        assert_error(
            oneshot(&api, method.clone(), path, scoped, Some(body)).await,
            StatusCode::FORBIDDEN,
            "process driver",
        );
    }
    // Whichever of the two comes last is the one the handler would act on.
    let last_process = r#"{"config": {"driver": "oci", "image": "web:1", "driver": "process",
                          "init": {"exec": ["sleep", "100"]}}, "skip_launch": true}"#;
    assert_error(
        oneshot(
            &api,
            Method::POST,
            "/v1/apps/a1/machines",
            scoped,
            Some(last_process),
        )
        .await,
        StatusCode::FORBIDDEN,
        "process driver",
    );
    // Any body with a key given twice is refused (400), whatever the token: the driver's
    // and every other one.
    let last_oci = r#"{"config": {"driver": "process", "init": {"exec": ["sleep", "100"]},
                      "driver": "oci", "image": "web:1"}, "skip_launch": true}"#;
    for (method, path, token, body) in [
        (Method::POST, "/v1/apps/a1/machines", scoped, last_oci),
        (Method::POST, "/v1/apps/a1/machines", org(), twice),
        (
            Method::POST,
            "/v1/apps/a1/machines/batch",
            org(),
            twice_batch,
        ),
        (Method::POST, update.as_str(), org(), twice),
        (
            Method::POST,
            "/v1/apps",
            org(),
            r#"{"app_name": "b1", "app_name": "b2", "org_slug": "personal"}"#,
        ),
        (
            Method::POST,
            "/v1/apps/a1/secrets",
            org(),
            r#"{"values": {"A": "1", "A": "2"}}"#,
        ),
        (
            Method::POST,
            &format!("{update}/lease"),
            org(),
            r#"{"ttl": 30, "ttl": 3000}"#,
        ),
        (
            Method::PUT,
            &format!("{update}/metadata"),
            org(),
            r#"{"metadata": {"k": "1", "k": "2"}}"#,
        ),
        (
            Method::POST,
            &format!("{update}/stop"),
            org(),
            r#"{"signal": "SIGTERM", "signal": "SIGKILL"}"#,
        ),
        (
            Method::POST,
            "/v1/platform/placements",
            org(),
            r#"{"region": "a", "region": "b"}"#,
        ),
    ] {
        assert_error(
            oneshot(&api, method.clone(), path, token, Some(body)).await,
            StatusCode::BAD_REQUEST,
            "given more than once",
        );
    }
    // The host interface refuses them too.
    let host = node.host_router();
    assert_error(
        oneshot(
            &host,
            Method::POST,
            &format!("/host/v1/machines/{id}/metadata/k"),
            Some(TEST_SECRET),
            Some(r#"{"value": "1", "value": "2"}"#),
        )
        .await,
        StatusCode::BAD_REQUEST,
        "given more than once",
    );
    // Nothing was made or changed.
    assert_eq!(machine_ids(&api).await, before);
    let (s, v) = oneshot(&api, Method::GET, &update, org(), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["config"]["metadata"], Value::Null, "{v}");
    assert!(v["lease"].is_null(), "{v}");
    let (s, v) = oneshot(&api, Method::GET, "/v1/apps/a1/secrets", org(), None).await;
    assert_eq!((s, v), (StatusCode::OK, json!({"secrets": []})));
    // The same token creates what it may: an update that keeps the machine's config is
    // refused (a process machine), one the org token sends is taken.
    let (s, v) = oneshot(
        &api,
        Method::POST,
        &update,
        org(),
        Some(&json!({"config": sleeper(), "skip_launch": true}).to_string()),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    node.stop().await;
}

/// A token limited to the gvisor runtime (a platform hands it to a stranger): process and
/// runc machines are refused (403) through create, batch create and update, and nothing
/// changes; a gvisor machine gets past the token (and is refused by a host that cannot run
/// it, with why).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_limited_token_gets_403_for_process_and_runc_machines() {
    let (node, api) = agent_with_app().await;
    let id = machine(&api).await;
    let before = machine_ids(&api).await;
    let token = tokens::mint(&Scope {
        runtimes: ["gvisor".to_string()].into(),
        ..Scope::default()
    });
    let limited = Some(token.as_str());
    let update = format!("/v1/apps/a1/machines/{id}");
    let runc = json!({"config": {"image": "web:1"}, "skip_launch": true}).to_string();
    let runc_named =
        json!({"config": {"image": "web:1", "runtime": "runc"}, "skip_launch": true}).to_string();
    let process = json!({"config": sleeper(), "skip_launch": true}).to_string();
    let batch = json!({"config": {"image": "web:1"}, "count": 2, "skip_launch": true}).to_string();
    for (method, path, body, says) in [
        (Method::POST, "/v1/apps/a1/machines", &runc, "runc runtime"),
        (
            Method::POST,
            "/v1/apps/a1/machines",
            &runc_named,
            "runc runtime",
        ),
        (Method::POST, "/v1/apps/a1/machines", &process, "runtime"),
        (
            Method::POST,
            "/v1/apps/a1/machines/batch",
            &batch,
            "runc runtime",
        ),
        (Method::POST, update.as_str(), &runc, "runc runtime"),
        (Method::PUT, update.as_str(), &process, "runtime"),
    ] {
        assert_error(
            oneshot(&api, method.clone(), path, limited, Some(body)).await,
            StatusCode::FORBIDDEN,
            says,
        );
    }
    let gvisor =
        json!({"config": {"image": "web:1", "runtime": "gvisor"}, "skip_launch": true}).to_string();
    let (s, v) = oneshot(
        &api,
        Method::POST,
        "/v1/apps/a1/machines",
        limited,
        Some(&gvisor),
    )
    .await;
    assert_ne!(s, StatusCode::FORBIDDEN, "{v}");
    assert!(v["error"].as_str().unwrap_or("").contains("gvisor"), "{v}");
    assert_eq!(machine_ids(&api).await, before);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scoped_token_is_checked_against_the_app_the_handler_serves() {
    let (node, api) = agent_with_app().await;
    let id = machine(&api).await;
    let token = app_token();
    let scoped = Some(token.as_str());
    // `a%31` is app `a1` to the router: the token for `a1` reads it.
    let (s, v) = oneshot(&api, Method::GET, "/v1/apps/a%31/machines", scoped, None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v.as_array().map(Vec::len), Some(1), "{v}");
    let (s, v) = oneshot(
        &api,
        Method::GET,
        &format!("/v1/apps/%61%31/machines/{id}"),
        scoped,
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["id"], id.as_str());
    // And a token for another app does not, however the path spells `a1`.
    let other = tokens::mint(&Scope {
        apps: ["b1".to_string()].into(),
        ..Scope::default()
    });
    for path in ["/v1/apps/a1/machines", "/v1/apps/a%31/machines"] {
        assert_error(
            oneshot(&api, Method::GET, path, Some(&other), None).await,
            StatusCode::NOT_FOUND,
            "not found",
        );
    }
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_is_shown_with_its_nonce_to_callers_that_may_use_leases() {
    let (node, api) = agent_with_app().await;
    let id = machine(&api).await;
    let lease = format!("/v1/apps/a1/machines/{id}/lease");
    let (s, v) = oneshot(
        &api,
        Method::POST,
        &lease,
        org(),
        Some(r#"{"ttl": 120, "description": "deploy v7"}"#),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let nonce = v["data"]["nonce"].as_str().unwrap().to_string();

    // A token that may use leases sees the nonce (to release a stuck lease).
    let app = app_token();
    for token in [org(), Some(app.as_str())] {
        let (s, v) = oneshot(&api, Method::GET, &lease, token, None).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        assert_eq!(v["status"], "success", "{v}");
        assert_eq!(v["data"]["nonce"], nonce.as_str(), "{v}");
        assert_eq!(v["data"]["description"], "deploy v7", "{v}");
    }
    // A read-only token sees the lease without it.
    let read_only = tokens::mint(&Scope {
        read_only: true,
        ..Scope::default()
    });
    let (s, v) = oneshot(&api, Method::GET, &lease, Some(&read_only), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert!(v["data"].get("nonce").is_none(), "{v}");
    assert_eq!(v["data"]["description"], "deploy v7", "{v}");
    // Machine views keep it hidden.
    for path in [
        format!("/v1/apps/a1/machines/{id}?include_leases=true"),
        "/v1/apps/a1/machines?include_leases=true".to_string(),
    ] {
        let (s, v) = oneshot(&api, Method::GET, &path, org(), None).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        let text = v.to_string();
        assert!(text.contains("deploy v7"), "{path}: no lease shown: {text}");
        assert!(!text.contains(&nonce), "{path} shows the nonce: {text}");
    }

    // A refresh without a description keeps the lease's own.
    let mut refresh = http_request(Method::POST, &lease, "{}");
    refresh
        .headers_mut()
        .insert("fly-machine-lease-nonce", nonce.parse().unwrap());
    let (s, v) = send(&api, refresh).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["data"]["nonce"], nonce.as_str(), "{v}");
    assert_eq!(v["data"]["description"], "deploy v7", "{v}");
    let (_, v) = oneshot(&api, Method::GET, &lease, org(), None).await;
    assert_eq!(v["data"]["description"], "deploy v7", "{v}");
    node.stop().await;
}

/// A request with the org token and a JSON body.
fn http_request(method: Method, path: &str, body: &str) -> axum::http::Request<axum::body::Body> {
    axum::http::Request::builder()
        .method(method)
        .uri(path)
        .header(
            "authorization",
            format!("Bearer {}", bazaar_testkit::api_token()),
        )
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body.to_string()))
        .unwrap()
}
