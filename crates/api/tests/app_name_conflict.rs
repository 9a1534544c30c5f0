//! Two organizations that create one app name at once (issue 31, item 7), on an agent in
//! the test's own process whose catalog is joined by a second catalog node (another host)
//! that made the same name earlier, as both sides of a partition do: once the rows meet,
//! the earlier app is the app of the name; the agent's own app lost it and is told so
//! (listed `name_conflict`, 409 naming the rule and the winner for a call that names it by
//! id, 409 on starting its machine, which is no longer listed as the app's), and nothing of
//! the winner changes.

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use bazaar_catalog::{AppRecord, Catalog, CatalogConfig, HostRecord};
use bazaar_testkit::in_process::{oneshot, send, InProcessAgent};
use bazaar_testkit::{api_token, TEST_SECRET};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// A call that names the app it means by id (`bazaar-app-id`).
async fn call_as(
    api: &Router,
    method: Method,
    path: &str,
    app_id: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header(header::AUTHORIZATION, format!("Bearer {}", api_token()))
        .header("bazaar-app-id", app_id)
        .header(header::CONTENT_TYPE, "application/json");
    let body = body.map(|b| Body::from(b.to_string())).unwrap_or_default();
    send(api, req.body(body).unwrap()).await
}

/// A second host's catalog joined to `seed`, holding an app `name` of `org` created at
/// `created_at_ms`.
async fn other_host_with_app(seed: &Catalog, name: &str, org: &str, created_at_ms: u64) -> Catalog {
    let mut config = CatalogConfig::new(
        "h_other",
        "local",
        "127.0.0.1:0".parse().unwrap(),
        TEST_SECRET,
    );
    config.seeds = vec![seed.local_addr()];
    config.anti_entropy_interval = Duration::from_millis(200);
    let other = Catalog::start(config).await.unwrap();
    other.publish_host(HostRecord {
        id: "h_other".into(),
        region: "local".into(),
        // No API here: the agent under test must never be sent a machine for this host.
        api_addr: "127.0.0.1:9".into(),
        ..Default::default()
    });
    other.publish_app(AppRecord {
        id: "app_00000000000000b0".into(),
        name: name.into(),
        org_slug: org.into(),
        created_at_ms,
        created_by_host: "h_other".into(),
    });
    other
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_app_that_lost_its_name_is_told_and_takes_no_machines() {
    let mut node = InProcessAgent::start().await.unwrap();
    let api = bazaar_api::router(node.node());
    node.serve(api.clone());

    // This side of the partition: org-a makes race2 and a machine in it.
    let body = json!({"app_name": "race2", "org_slug": "org-a"}).to_string();
    let (s, a) = oneshot(
        &api,
        Method::POST,
        "/v1/apps",
        Some(api_token()),
        Some(&body),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{a}");
    let (lost_id, created) = (
        a["id"].as_str().unwrap().to_string(),
        a["created_at"].clone(),
    );
    let config = json!({"driver": "process", "init": {"exec": ["sleep", "100"]}});
    let machine = json!({"config": config, "skip_launch": true});
    let (s, m) = call_as(
        &api,
        Method::POST,
        "/v1/apps/race2/machines",
        &lost_id,
        Some(machine.clone()),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let loser_machine = m["id"].as_str().unwrap().to_string();

    // The other side made race2 for org-b a second earlier; the partition heals.
    let created_ms = node.catalog.app("race2").unwrap().created_at_ms;
    let other = other_host_with_app(&node.catalog, "race2", "org-b", created_ms - 1000).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while node.catalog.lost_to("race2", &lost_id).is_none() {
        assert!(
            Instant::now() < deadline,
            "the other host's app never arrived"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Every reader names the earlier app the app of the name.
    let (s, app) = oneshot(&api, Method::GET, "/v1/apps/race2", Some(api_token()), None).await;
    assert_eq!(s, StatusCode::OK, "{app}");
    assert_eq!(app["id"], "app_00000000000000b0");
    assert_eq!(app["organization"]["slug"], "org-b");
    assert_eq!(
        app["status"], "pending",
        "the loser's machine is not the winner's"
    );

    // The loser's organization sees its app marked.
    let (s, list) = oneshot(
        &api,
        Method::GET,
        "/v1/apps?org_slug=org-a",
        Some(api_token()),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{list}");
    assert_eq!(list["apps"][0]["id"], lost_id.as_str(), "{list}");
    assert_eq!(list["apps"][0]["status"], "name_conflict", "{list}");
    assert_eq!(list["apps"][0]["created_at"], created);
    assert_eq!(list["apps"][0]["machine_count"], 1, "{list}");
    let (_, all) = oneshot(&api, Method::GET, "/v1/apps", Some(api_token()), None).await;
    assert_eq!(all["total_apps"], 2, "both rows, the app first: {all}");
    assert_eq!(all["apps"][0]["status"], "pending");

    // Its calls answer 409 naming the rule and the winner; nothing is created.
    for (method, path, body) in [
        (
            Method::POST,
            "/v1/apps/race2/machines",
            Some(machine.clone()),
        ),
        (Method::GET, "/v1/apps/race2", None),
    ] {
        let (s, v) = call_as(&api, method, path, &lost_id, body).await;
        assert_eq!(s, StatusCode::CONFLICT, "{v}");
        let error = v["error"].as_str().unwrap();
        assert!(
            error.contains("org-b") && error.contains("created first"),
            "{error}"
        );
    }
    // A new app of the name still answers name_taken at once.
    let (s, v) = oneshot(
        &api,
        Method::POST,
        "/v1/apps",
        Some(api_token()),
        Some(&body),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");

    // Its machine is not the app's, and its owner refuses to start it.
    let (s, list) = oneshot(
        &api,
        Method::GET,
        "/v1/apps/race2/machines",
        Some(api_token()),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{list}");
    assert_eq!(
        list,
        json!([]),
        "the loser's machine listed as the winner's"
    );
    let start = format!("/v1/apps/race2/machines/{loser_machine}/start");
    let (s, v) = oneshot(&api, Method::POST, &start, Some(api_token()), None).await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("lost its name"),
        "{v}"
    );
    assert!(node.catalog.losing_app_ids().contains(&lost_id));

    // The winner's calls are untouched; the loser can still destroy what it made.
    let (s, v) = call_as(
        &api,
        Method::GET,
        "/v1/apps/race2",
        "app_00000000000000b0",
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = call_as(
        &api,
        Method::GET,
        "/v1/apps/race2",
        "app_00000000000000c0",
        None,
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "an id of no app of the name: {v}");
    let (s, v) = call_as(&api, Method::GET, "/v1/apps/race2", "race2", None).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "not an app id: {v}");
    let destroy = format!("/v1/apps/race2/machines/{loser_machine}?force=true");
    let (s, v) = oneshot(&api, Method::DELETE, &destroy, Some(api_token()), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");

    other.kill().await;
    node.stop().await;
}
