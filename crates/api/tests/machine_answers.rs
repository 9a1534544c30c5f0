//! What the Machines API answers about machines (issue 32 items 5-8), on an agent in the
//! test's own process whose host interface is served on loopback: size limits on a
//! config's metadata, env and files; immutable names; `wait` refusing what could only time
//! out; `updated_at` moving on cordon; a deleted app's machines gone; and every 4xx, bad
//! path and query parameters included, in Fly's JSON error shape.

use axum::http::{Method, StatusCode};
use axum::Router;
use bazaar_testkit::in_process::{oneshot, InProcessAgent};
use serde_json::{json, Value};

/// The Machines API's org token.
fn org() -> Option<&'static str> {
    Some(bazaar_testkit::api_token())
}

/// An agent serving its host interface and Machines API, with app `app`.
async fn agent_with_app(app: &str) -> (InProcessAgent, Router) {
    let mut node = InProcessAgent::start().await.unwrap();
    let api = bazaar_api::router(node.node());
    node.serve(api.clone());
    create_app(&api, app).await;
    (node, api)
}

async fn create_app(api: &Router, app: &str) {
    let body = json!({"app_name": app, "org_slug": "personal"}).to_string();
    let (s, v) = oneshot(api, Method::POST, "/v1/apps", org(), Some(&body)).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
}

fn sleeper() -> Value {
    json!({"driver": "process", "init": {"exec": ["sleep", "100"]}})
}

/// A machine of `app` made from `config` (not started): the machine.
async fn machine(api: &Router, app: &str, config: Value) -> Value {
    let body = json!({"config": config, "skip_launch": true, "name": "m-one"}).to_string();
    let path = format!("/v1/apps/{app}/machines");
    let (s, m) = oneshot(api, Method::POST, &path, org(), Some(&body)).await;
    assert_eq!(s, StatusCode::OK, "{m}");
    m
}

/// A JSON object of `pairs`.
fn object(pairs: impl IntoIterator<Item = (String, Value)>) -> Value {
    Value::Object(pairs.into_iter().collect())
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_env_files_and_configs_are_capped_and_the_limit_is_named() {
    let (node, api) = agent_with_app("a1").await;
    let m = machine(&api, "a1", sleeper()).await;
    let id = m["id"].as_str().unwrap();
    let path = format!("/v1/apps/a1/machines/{id}");
    let with = |field: &str, value: Value| {
        let mut config = sleeper();
        config[field] = value;
        json!({"config": config, "skip_launch": true}).to_string()
    };
    let big = "v".repeat(4097);
    let cases = [
        (
            with("metadata", json!({"k": big})),
            "at most 4096 bytes per value",
        ),
        (
            with("metadata", object([("k".repeat(129), json!("v"))])),
            "at most 128 bytes per key",
        ),
        (
            with(
                "metadata",
                object((0..5).map(|i| (format!("k{i}"), json!("v".repeat(4000))))),
            ),
            "at most 16384 bytes per machine",
        ),
        (
            with("env", json!({"BIG": "x".repeat(32 * 1024 + 1)})),
            "at most 32768 bytes per value",
        ),
        (
            with(
                "files",
                json!([{"guest_path": "/a", "raw_value": "QUFB".repeat(70_000)}]),
            ),
            "at most 262144 bytes per machine",
        ),
        (
            with("labels", json!("x".repeat(600 * 1024))),
            "at most 524288 bytes",
        ),
    ];
    for (body, says) in &cases {
        // On create and on update alike.
        for (method, at) in [
            (Method::POST, "/v1/apps/a1/machines"),
            (Method::POST, path.as_str()),
        ] {
            assert_error(
                oneshot(&api, method, at, org(), Some(body)).await,
                StatusCode::BAD_REQUEST,
                says,
            );
        }
    }
    // Metadata set on its own is held to the same limits.
    assert_error(
        oneshot(
            &api,
            Method::POST,
            &format!("{path}/metadata/k"),
            org(),
            Some(&json!({"value": "v".repeat(4097)}).to_string()),
        )
        .await,
        StatusCode::BAD_REQUEST,
        "at most 4096 bytes per value",
    );
    for i in 0..3 {
        let (s, v) = oneshot(
            &api,
            Method::POST,
            &format!("{path}/metadata/k{i}"),
            org(),
            Some(&json!({"value": "v".repeat(4000)}).to_string()),
        )
        .await;
        assert_eq!(s, StatusCode::NO_CONTENT, "{v}");
    }
    let many = object((3..5).map(|i| (format!("k{i}"), json!("v".repeat(4000)))));
    assert_error(
        oneshot(
            &api,
            Method::PUT,
            &format!("{path}/metadata"),
            org(),
            Some(&json!({"metadata": many}).to_string()),
        )
        .await,
        StatusCode::BAD_REQUEST,
        "at most 16384 bytes per machine",
    );
    // Nothing else was made or changed: one machine, its first version, three keys.
    let (_, list) = oneshot(&api, Method::GET, "/v1/apps/a1/machines", org(), None).await;
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");
    let (_, now) = oneshot(&api, Method::GET, &path, org(), None).await;
    assert_eq!(now["instance_id"], m["instance_id"], "{now}");
    let keys: Vec<&String> = now["config"]["metadata"]
        .as_object()
        .unwrap()
        .keys()
        .collect();
    assert_eq!(keys, ["k0", "k1", "k2"]);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_keeps_the_name_and_a_wait_that_could_only_time_out_is_refused() {
    let (node, api) = agent_with_app("a1").await;
    let m = machine(&api, "a1", sleeper()).await;
    let id = m["id"].as_str().unwrap();
    let path = format!("/v1/apps/a1/machines/{id}");
    let update =
        |name: &str| json!({"config": sleeper(), "skip_launch": true, "name": name}).to_string();
    assert_error(
        oneshot(&api, Method::POST, &path, org(), Some(&update("m-two"))).await,
        StatusCode::BAD_REQUEST,
        "cannot be changed",
    );
    let (s, v) = oneshot(&api, Method::POST, &path, org(), Some(&update("m-one"))).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (_, v) = oneshot(&api, Method::GET, &path, org(), None).await;
    assert_eq!(v["name"], "m-one", "{v}");

    let version = v["instance_id"].as_str().unwrap().to_string();
    for (query, says) in [
        ("timeout=61", "at most 60 seconds"),
        ("timeout=5m", "at most 60 seconds"),
        ("version=zzz", "not a machine version"),
        ("instance_id=zzz", "not a machine version"),
        ("state=running", "invalid state"),
    ] {
        let started = std::time::Instant::now();
        assert_error(
            oneshot(
                &api,
                Method::GET,
                &format!("{path}/wait?{query}"),
                org(),
                None,
            )
            .await,
            StatusCode::BAD_REQUEST,
            says,
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "{query}"
        );
    }
    let (s, v) = oneshot(
        &api,
        Method::GET,
        &format!("{path}/wait?state=stopped,created&timeout=60&version={version}"),
        org(),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["version"], version.as_str(), "{v}");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cordon_moves_updated_at_and_a_deleted_apps_machine_is_not_found() {
    let (node, api) = agent_with_app("a1").await;
    let m = machine(&api, "a1", sleeper()).await;
    let id = m["id"].as_str().unwrap();
    let path = format!("/v1/apps/a1/machines/{id}");
    // rfc3339 to the second: a cordon a second later shows.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let (s, v) = oneshot(
        &api,
        Method::POST,
        &format!("{path}/cordon"),
        org(),
        Some("{}"),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (_, now) = oneshot(&api, Method::GET, &path, org(), None).await;
    assert_eq!(now["cordoned"], true, "{now}");
    assert!(
        now["updated_at"].as_str() > m["updated_at"].as_str(),
        "{} then {}",
        m["updated_at"],
        now["updated_at"]
    );
    let (_, list) = oneshot(
        &api,
        Method::GET,
        "/v1/apps/a1/machines?summary=true",
        org(),
        None,
    )
    .await;
    assert_eq!(list[0]["updated_at"], now["updated_at"], "{list}");
    assert_eq!(list[0]["private_ip"], now["private_ip"], "{list}");

    // A machine of an app that was deleted is not found, like the app.
    create_app(&api, "gone").await;
    let m = machine(&api, "gone", sleeper()).await;
    let id = m["id"].as_str().unwrap();
    let path = format!("/v1/apps/gone/machines/{id}");
    let (s, v) = oneshot(
        &api,
        Method::DELETE,
        &format!("{path}?force=true"),
        org(),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = oneshot(
        &api,
        Method::GET,
        &format!("{path}/wait?state=destroyed&timeout=10"),
        org(),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = oneshot(&api, Method::DELETE, "/v1/apps/gone", org(), None).await;
    assert!(s.is_success(), "{s} {v}");
    for rest in ["", "/events", "/versions", "/lease", "/metadata"] {
        assert_error(
            oneshot(&api, Method::GET, &format!("{path}{rest}"), org(), None).await,
            StatusCode::NOT_FOUND,
            "app gone not found",
        );
    }
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_path_and_query_parameters_get_fly_shaped_errors() {
    let (node, api) = agent_with_app("a1").await;
    let m = machine(&api, "a1", sleeper()).await;
    let id = m["id"].as_str().unwrap();
    let path = format!("/v1/apps/a1/machines/{id}");
    for (method, at, status) in [
        (
            Method::GET,
            format!("{path}/events?limit=many"),
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::GET,
            format!("{path}/logs?max_bytes=-1"),
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::POST,
            format!("{path}/lease?ttl=soon"),
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::GET,
            format!("{path}?include_leases=maybe"),
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::GET,
            "/v1/apps/%FF%FE/machines".into(),
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::GET,
            "/v1/no-such-thing".into(),
            StatusCode::NOT_FOUND,
        ),
        (
            Method::PATCH,
            "/v1/apps".into(),
            StatusCode::METHOD_NOT_ALLOWED,
        ),
    ] {
        let body = (method == Method::POST).then_some("{}");
        let (s, v) = oneshot(&api, method.clone(), &at, org(), body).await;
        assert_eq!(s, status, "{method} {at}: {v}");
        assert!(
            v["error"].is_string(),
            "{method} {at}: not Fly's shape: {v}"
        );
    }
    // The host interface answers the same way.
    let host = node.host_router();
    let (s, v) = oneshot(
        &host,
        Method::GET,
        &format!("/host/v1/machines/{id}/events?limit=many"),
        Some(bazaar_testkit::TEST_SECRET),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"].is_string(), "{v}");
    node.stop().await;
}
