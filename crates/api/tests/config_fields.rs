//! The keys a machine config may carry (issue 32 item 4), on an agent in the test's own
//! process: a key no Fly config has is refused at any depth with a 400 naming it; Fly's
//! keys bazaar does not act on are refused when set and taken at the defaults real
//! clients send; `metrics` is checked; `standbys` must name machines of the app. A refused
//! create makes no machine, a refused update changes nothing.

use axum::http::{Method, StatusCode};
use axum::Router;
use bazaar_testkit::api_token;
use bazaar_testkit::in_process::{oneshot, InProcessAgent};
use serde_json::{json, Value};

async fn agent_with_apps(apps: &[&str]) -> (InProcessAgent, Router) {
    let mut node = InProcessAgent::start().await.unwrap();
    let api = bazaar_api::router(node.node());
    node.serve(api.clone());
    for app in apps {
        let body = json!({"app_name": app, "org_slug": "personal"}).to_string();
        let (s, v) = oneshot(
            &api,
            Method::POST,
            "/v1/apps",
            Some(api_token()),
            Some(&body),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
    }
    (node, api)
}

fn sleeper() -> Value {
    json!({"driver": "process", "init": {"exec": ["sleep", "100"]}})
}

/// Creates a machine of `app` (not started) from `config`: the answer.
async fn create(api: &Router, app: &str, config: Value) -> (StatusCode, Value) {
    let body = json!({"config": config, "skip_launch": true}).to_string();
    let path = format!("/v1/apps/{app}/machines");
    oneshot(api, Method::POST, &path, Some(api_token()), Some(&body)).await
}

async fn machines(api: &Router, app: &str) -> Vec<Value> {
    let path = format!("/v1/apps/{app}/machines");
    let (s, v) = oneshot(api, Method::GET, &path, Some(api_token()), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    v.as_array().unwrap().clone()
}

#[track_caller]
fn assert_bad_request(got: (StatusCode, Value), says: &str) {
    let (s, v) = got;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let error = v["error"]
        .as_str()
        .unwrap_or_else(|| panic!("not Fly's error shape: {v}"));
    assert!(error.contains(says), "{error:?} does not say {says:?}");
}

/// `config` with `value` at the dotted `path` (objects made on the way).
fn with(mut config: Value, path: &str, value: Value) -> Value {
    let mut at = &mut config;
    for key in path.split('.') {
        at = &mut at[key];
    }
    *at = value;
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_no_fly_config_has_and_unused_keys_set_are_refused_naming_them() {
    let (node, api) = agent_with_apps(&["f1"]).await;
    let cases = [
        (
            with(sleeper(), "imag", json!("x")),
            "config.imag is not a field",
        ),
        (
            with(sleeper(), "guest.cpu", json!(2)),
            "config.guest.cpu is not a field",
        ),
        (
            with(sleeper(), "init.user_name", json!("x")),
            "config.init.user_name",
        ),
        (
            with(
                sleeper(),
                "services",
                json!([{"internal_port": 80, "ports": [{"port": 80, "handler": ["http"]}]}]),
            ),
            "config.services[0].ports[0].handler",
        ),
        (
            with(sleeper(), "restart", json!({"policy": "no", "polcy": "x"})),
            "polcy",
        ),
        (
            with(sleeper(), "containers", json!("garbage")),
            "config.containers is not supported",
        ),
        (
            with(sleeper(), "cache_drive", json!({"size_mb": 64})),
            "config.cache_drive.size_mb",
        ),
        (
            with(sleeper(), "guest", json!({"kernel_args": ["quiet"]})),
            "config.guest.kernel_args",
        ),
        (
            with(sleeper(), "guest", json!({"host_dedication_id": "d1"})),
            "config.guest.host_dedication_id",
        ),
        (
            with(sleeper(), "init.tty", json!(true)),
            "config.init.tty is not supported",
        ),
        (
            with(sleeper(), "metrics", json!({"port": 9091, "https": true})),
            "config.metrics.https",
        ),
        (
            with(sleeper(), "metrics", json!({"port": 0})),
            "config.metrics.port",
        ),
        (
            with(
                sleeper(),
                "metrics",
                json!({"port": 9091, "path": "metrics"}),
            ),
            "config.metrics.path",
        ),
        (
            with(
                sleeper(),
                "metrics",
                json!({"port": 9091, "scheme": "http"}),
            ),
            "scheme",
        ),
    ];
    for (config, says) in cases {
        assert_bad_request(create(&api, "f1", config).await, says);
    }
    assert!(
        machines(&api, "f1").await.is_empty(),
        "a refused create made a machine"
    );

    // What real clients send when these are not set is taken, and echoed.
    let defaults = json!({
        "driver": "process",
        "init": {"exec": ["sleep", "100"], "tty": false, "kernel_args": null, "swap_size_mb": 0},
        "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256, "host_dedication_id": ""},
        "dns": {"skip_registration": false}, "containers": [], "processes": null,
        "disable_machine_autostart": false, "rootfs": {"size_gb": null, "persist": ""},
        "metrics": {"port": 9091},
    });
    let (s, m) = create(&api, "f1", defaults).await;
    assert_eq!(s, StatusCode::OK, "{m}");
    assert_eq!(
        m["config"]["metrics"],
        json!({"port": 9091, "path": "/metrics"})
    );
    assert_eq!(m["config"]["dns"], json!({"skip_registration": false}));

    // An update is judged alike, and a refused one changes nothing.
    let id = m["id"].as_str().unwrap();
    let path = format!("/v1/apps/f1/machines/{id}");
    let body = json!({"config": with(sleeper(), "statics", json!([{"guest_path": "/s", "url_prefix": "/"}]))});
    let got = oneshot(
        &api,
        Method::POST,
        &path,
        Some(api_token()),
        Some(&body.to_string()),
    )
    .await;
    assert_bad_request(got, "config.statics[0].guest_path is not supported");
    let (_, after) = oneshot(&api, Method::GET, &path, Some(api_token()), None).await;
    assert_eq!(after["instance_id"], m["instance_id"], "{after}");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standbys_must_name_other_machines_of_the_app() {
    let (node, api) = agent_with_apps(&["s1", "s2"]).await;
    let (s, primary) = create(&api, "s1", sleeper()).await;
    assert_eq!(s, StatusCode::OK, "{primary}");
    let (s, elsewhere) = create(&api, "s2", sleeper()).await;
    assert_eq!(s, StatusCode::OK, "{elsewhere}");
    let (primary, elsewhere) = (
        primary["id"].as_str().unwrap(),
        elsewhere["id"].as_str().unwrap(),
    );

    for standbys in [
        json!(["d8e7f6a5b4c3d2"]),
        json!(["nope"]),
        json!([elsewhere]),
    ] {
        let config = with(sleeper(), "standbys", standbys.clone());
        assert_bad_request(create(&api, "s1", config).await, "config.standbys");
    }
    assert_eq!(machines(&api, "s1").await.len(), 1);

    let (s, standby) = create(&api, "s1", with(sleeper(), "standbys", json!([primary]))).await;
    assert_eq!(s, StatusCode::OK, "{standby}");
    assert_eq!(standby["config"]["standbys"], json!([primary]));

    // An update may not make a machine its own standby, nor name another app's.
    let id = standby["id"].as_str().unwrap();
    let path = format!("/v1/apps/s1/machines/{id}");
    for standbys in [json!([id]), json!([elsewhere])] {
        let body = json!({"config": with(sleeper(), "standbys", standbys)}).to_string();
        let got = oneshot(&api, Method::POST, &path, Some(api_token()), Some(&body)).await;
        assert_bad_request(got, "config.standbys");
    }
    node.stop().await;
}

/// A guest size given alone (a placement dry run's or a volume's `compute`) is judged as a
/// config's `guest` (found by schemathesis: `kernel_args` was taken there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compute_size_takes_only_a_guests_keys() {
    let (node, api) = agent_with_apps(&["c1"]).await;
    let body = json!({"compute": {"cpus": 1, "memory_mb": 256, "kernel_args": ["quiet"]}});
    let got = oneshot(
        &api,
        Method::POST,
        "/v1/platform/placements",
        Some(api_token()),
        Some(&body.to_string()),
    )
    .await;
    assert_bad_request(got, "compute.kernel_args is not supported");
    let body = json!({"name": "data", "compute": {"cpus": 1, "memroy_mb": 256}});
    let got = oneshot(
        &api,
        Method::POST,
        "/v1/apps/c1/volumes",
        Some(api_token()),
        Some(&body.to_string()),
    )
    .await;
    assert_bad_request(got, "compute.memroy_mb is not a field");
    let body = json!({"compute": {"cpus": 1, "memory_mb": 256}});
    let (s, v) = oneshot(
        &api,
        Method::POST,
        "/v1/platform/placements",
        Some(api_token()),
        Some(&body.to_string()),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    node.stop().await;
}

/// A list's boolean parameters are booleans (found by schemathesis: `include_deleted=c` was
/// read as false).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lists_flags_are_true_or_false() {
    let (node, api) = agent_with_apps(&["l1"]).await;
    for flag in ["include_deleted", "summary", "include_leases"] {
        let path = format!("/v1/apps/l1/machines?{flag}=c");
        assert_bad_request(
            oneshot(&api, Method::GET, &path, Some(api_token()), None).await,
            flag,
        );
        let path = format!("/v1/apps/l1/machines?{flag}=true");
        let (s, v) = oneshot(&api, Method::GET, &path, Some(api_token()), None).await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }
    node.stop().await;
}
