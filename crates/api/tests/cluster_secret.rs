//! The cluster secret is not an API token (issue 31, item 8): every Machines API route
//! answers it 401 in Fly's error shape, saying how to get a token, and changes nothing;
//! it still opens the catalog view and the host interface, which API tokens do not; and
//! an app delete that one node hands to the node that wrote the app's record goes through
//! the host-level route (`DELETE /v1/catalog/apps/{app}`), never the Machines API. On an
//! agent in the test's own process, its host interface served on loopback.

use axum::http::{Method, StatusCode};
use bazaar_testkit::in_process::{oneshot, InProcessAgent};
use bazaar_testkit::{api_token, TEST_SECRET};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_machines_api_refuses_the_cluster_secret_and_changes_nothing() {
    let mut node = InProcessAgent::start().await.unwrap();
    let api = bazaar_api::router(node.node());
    node.serve(api.clone());
    let admin = Some(api_token());
    let (s, v) = oneshot(
        &api,
        Method::POST,
        "/v1/apps",
        admin,
        Some(r#"{"app_name": "web", "org_slug": "personal"}"#),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let sleeper = json!({"skip_launch": true, "config": {"driver": "process",
        "init": {"exec": ["sleep", "60"]}}})
    .to_string();
    let (s, m) = oneshot(
        &api,
        Method::POST,
        "/v1/apps/web/machines",
        admin,
        Some(&sleeper),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let id = m["id"].as_str().unwrap().to_string();

    let machine = format!("/v1/apps/web/machines/{id}");
    let stop = format!("{machine}/stop");
    let calls: Vec<(Method, &str, Option<&str>)> = vec![
        (Method::GET, "/v1/apps", None),
        (
            Method::POST,
            "/v1/apps",
            Some(r#"{"app_name": "other", "org_slug": "personal"}"#),
        ),
        (Method::GET, "/v1/apps/web", None),
        (Method::DELETE, "/v1/apps/web", None),
        (Method::GET, "/v1/apps/web/machines", None),
        (Method::POST, "/v1/apps/web/machines", Some(&sleeper)),
        (Method::GET, &machine, None),
        (Method::POST, &stop, Some("{}")),
        (Method::DELETE, &machine, None),
        (Method::GET, "/v1/apps/web/secrets", None),
        (
            Method::POST,
            "/v1/apps/web/secrets/DB",
            Some(r#"{"value": "x"}"#),
        ),
        (Method::GET, "/v1/apps/web/volumes", None),
        (Method::GET, "/v1/apps/web/audit", None),
        (Method::GET, "/v1/orgs/personal/machines", None),
        (Method::GET, "/v1/platform/regions", None),
    ];
    for (method, path, body) in calls {
        let (s, v) = oneshot(&api, method.clone(), path, Some(TEST_SECRET), body).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{method} {path}: {v}");
        let error = v["error"].as_str().unwrap_or_else(|| panic!("{v}"));
        assert!(
            error.contains("the cluster secret is not an API token")
                && error.contains("bazaar token create"),
            "{method} {path}: {error}"
        );
    }
    // Fly's other scheme is refused alike.
    let req = axum::http::Request::builder()
        .uri("/v1/apps")
        .header("authorization", format!("FlyV1 {TEST_SECRET}"))
        .body(axum::body::Body::empty())
        .unwrap();
    let (s, v) = bazaar_testkit::in_process::send(&api, req).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{v}");

    // Nothing changed: one app, its machine as it was made.
    let (_, apps) = oneshot(&api, Method::GET, "/v1/apps?org_slug=personal", admin, None).await;
    assert_eq!(apps["total_apps"], 1, "{apps}");
    let (s, m) = oneshot(&api, Method::GET, &machine, admin, None).await;
    assert_eq!(s, StatusCode::OK, "{m}");
    assert_eq!(m["state"], "created", "{m}");

    // The catalog view and the host interface take the secret, not the API token.
    let (s, v) = oneshot(
        &api,
        Method::GET,
        "/v1/catalog/hosts",
        Some(TEST_SECRET),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = oneshot(&api, Method::GET, "/v1/catalog/hosts", admin, None).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    let host = node.host_router();
    let (s, v) = oneshot(&host, Method::GET, "/host/v1/info", Some(TEST_SECRET), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = oneshot(&host, Method::GET, "/host/v1/info", admin, None).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");

    // The owner's route of an app delete: a host credential only.
    let owner_delete = "/v1/catalog/apps/web";
    let (s, v) = oneshot(&api, Method::DELETE, owner_delete, admin, None).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    let (s, v) = oneshot(&api, Method::DELETE, owner_delete, Some(TEST_SECRET), None).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let (s, v) = oneshot(&api, Method::GET, "/v1/apps/web", admin, None).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    node.stop().await;
}
