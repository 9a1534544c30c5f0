//! The Machines API router in process (`tower::ServiceExt::oneshot`, no HTTP server) on
//! malformed input: bad JSON, a field of the wrong type, a missing app, a bad machine id,
//! no or an invalid token. Each gets the right 4xx with Fly's `{"error": ...}` body, and
//! none of them creates anything.

use axum::http::{Method, StatusCode};
use axum::Router;
use bazaar_testkit::in_process::{oneshot, InProcessAgent};
use bazaar_testkit::TEST_SECRET;
use serde_json::{json, Value};

/// How a request authenticates.
#[derive(Clone, Copy)]
enum Token<'a> {
    None,
    Bearer(&'a str),
}

/// Sends one request through `router`; answers the status and the JSON body.
async fn call(
    router: &Router,
    method: Method,
    path: &str,
    token: Token<'_>,
    body: Option<&str>,
) -> (StatusCode, Value) {
    let token = match token {
        Token::None => None,
        Token::Bearer(t) => Some(t),
    };
    oneshot(router, method, path, token, body).await
}

/// Asserts a Fly-shaped error: `status`, and an `error` string containing `says`.
#[track_caller]
fn assert_error(got: (StatusCode, Value), status: StatusCode, says: &str) {
    let (s, v) = got;
    assert_eq!(s, status, "{v}");
    let error = v["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error: {v}"));
    assert!(error.contains(says), "{error:?} does not say {says:?}");
}

/// The Machines API's token (an org token of the test key).
fn auth() -> Token<'static> {
    Token::Bearer(bazaar_testkit::api_token())
}

/// The catalog view's credential.
const SECRET: Token = Token::Bearer(TEST_SECRET);

fn machine(config: Value) -> String {
    json!({ "config": config }).to_string()
}

fn sleeper() -> Value {
    json!({"image": "process", "driver": "process", "init": {"exec": ["sleep", "1"]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_machines_api_requests_get_fly_shaped_4xx_and_change_nothing() {
    let node = InProcessAgent::start().await.unwrap();
    let api = bazaar_api::router(node.node());
    let (s, v) = call(
        &api,
        Method::POST,
        "/v1/apps",
        auth(),
        Some(r#"{"app_name": "web", "org_slug": "personal"}"#),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let create = "/v1/apps/web/machines";

    // Bad JSON: cut short, not an object, not JSON at all.
    for body in [r#"{"config": "#, "[1, 2]", "config: {}"] {
        let got = call(&api, Method::POST, create, auth(), Some(body)).await;
        assert_eq!(got.0, StatusCode::BAD_REQUEST, "{body}: {}", got.1);
        assert!(got.1["error"].is_string(), "{body}: {}", got.1);
    }
    assert_error(
        call(&api, Method::POST, create, auth(), Some(r#"{"config": "#)).await,
        StatusCode::BAD_REQUEST,
        "invalid JSON",
    );
    // A known field of the wrong type.
    let mut cpus = sleeper();
    cpus["guest"] = json!({"cpu_kind": "shared", "cpus": "many", "memory_mb": 256});
    let mut exec = sleeper();
    exec["init"]["exec"] = json!("sleep 1");
    let mut services = sleeper();
    services["services"] = json!({"internal_port": 8080});
    for config in [cpus, exec, services] {
        let got = call(
            &api,
            Method::POST,
            create,
            auth(),
            Some(&machine(config.clone())),
        )
        .await;
        assert_eq!(got.0, StatusCode::BAD_REQUEST, "{config}: {}", got.1);
        assert!(got.1["error"].is_string(), "{}", got.1);
    }
    assert_error(
        call(&api, Method::POST, create, auth(), Some(r#"{"config": 5}"#)).await,
        StatusCode::BAD_REQUEST,
        "invalid type",
    );
    // A missing app, and a name that could not be one.
    for app in ["nope", "UPPER", "..%2Fetc"] {
        assert_error(
            call(
                &api,
                Method::POST,
                &format!("/v1/apps/{app}/machines"),
                auth(),
                Some(&machine(sleeper())),
            )
            .await,
            StatusCode::NOT_FOUND,
            "not found",
        );
        assert_error(
            call(
                &api,
                Method::GET,
                &format!("/v1/apps/{app}/machines"),
                auth(),
                None,
            )
            .await,
            StatusCode::NOT_FOUND,
            "not found",
        );
    }
    // A bad machine id (wrong shape, a path escape), and a well-formed unknown one.
    for id in [
        "xyz",
        "..%2F..%2Fhost",
        "0123456789abcdef0",
        "00000000000000",
    ] {
        for (method, path) in [
            (Method::GET, format!("/v1/apps/web/machines/{id}")),
            (Method::POST, format!("/v1/apps/web/machines/{id}/stop")),
            (Method::DELETE, format!("/v1/apps/web/machines/{id}")),
        ] {
            let body = (method == Method::POST).then_some("{}");
            assert_error(
                call(&api, method, &path, auth(), body).await,
                StatusCode::NOT_FOUND,
                "not found",
            );
        }
    }
    // No token, an invalid one, and the wrong scheme.
    for token in [Token::None, Token::Bearer("not-a-token"), Token::Bearer("")] {
        for (method, path, body) in [
            (Method::GET, "/v1/apps", None),
            (Method::POST, create, Some(machine(sleeper()))),
            (Method::GET, "/v1/apps/web/machines/00000000000000", None),
        ] {
            let (s, v) = call(&api, method, path, token, body.as_deref()).await;
            assert!(
                s == StatusCode::UNAUTHORIZED || s == StatusCode::FORBIDDEN,
                "{path}: {s} {v}"
            );
            assert!(v["error"].is_string(), "{v}");
        }
    }
    assert_error(
        call(&api, Method::GET, "/v1/apps", Token::None, None).await,
        StatusCode::UNAUTHORIZED,
        "",
    );

    // The catalog view takes the cluster secret; an undocumented machine call is no route.
    for path in [
        "/v1/catalog/hosts",
        "/v1/catalog/machines",
        "/v1/catalog/digest",
    ] {
        for token in [Token::None, Token::Bearer("not-the-secret")] {
            assert_error(
                call(&api, Method::GET, path, token, None).await,
                StatusCode::UNAUTHORIZED,
                "unauthorized",
            );
        }
        let (s, v) = call(&api, Method::GET, path, SECRET, None).await;
        assert_eq!(s, StatusCode::OK, "{path}: {v}");
    }
    let (s, v) = call(
        &api,
        Method::GET,
        "/v1/catalog/machines?app=web&include_deleted=true",
        SECRET,
        None,
    )
    .await;
    assert_eq!((s, v), (StatusCode::OK, json!([])));
    let (s, _) = call(
        &api,
        Method::POST,
        "/v1/apps/web/machines/00000000000000/no-such-call",
        auth(),
        Some("{}"),
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    // A metadata key that a URL would resolve away is not forwarded.
    for key in ["..", "%2e%2E", "."] {
        assert_error(
            call(
                &api,
                Method::DELETE,
                &format!("/v1/apps/web/machines/00000000000000/metadata/{key}"),
                auth(),
                None,
            )
            .await,
            StatusCode::NOT_FOUND,
            "no such endpoint",
        );
    }

    // Nothing was created.
    let (s, v) = call(&api, Method::GET, create, auth(), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v, json!([]));
    let (s, v) = call(
        &api,
        Method::GET,
        "/v1/apps?org_slug=personal",
        auth(),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["total_apps"], 1, "{v}");
    node.stop().await;
}
