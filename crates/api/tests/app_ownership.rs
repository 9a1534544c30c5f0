//! What an app owns belongs to its id, not its name (issue 31, items 2 and 4), on the
//! Machines API router in process and the proxy's certificate store over the same catalog:
//! a deleted app's hostnames are served by nobody and do not pass to a new app of the
//! same name (of another organization); an app cannot attach another app's name under the
//! proxy domain, nor a hostname another app holds.

use axum::http::{Method, StatusCode};
use axum::Router;
use bazaar_certs::CertStore;
use bazaar_testkit::in_process::{oneshot, InProcessAgent};
use bazaar_testkit::TEST_SECRET;
use serde_json::{json, Value};

async fn call(
    router: &Router,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let body = body.map(|b| b.to_string());
    oneshot(
        router,
        method,
        path,
        Some(bazaar_testkit::api_token()),
        body.as_deref(),
    )
    .await
}

async fn create_app(router: &Router, app: &str, org: &str) -> String {
    let (s, v) = call(
        router,
        Method::POST,
        "/v1/apps",
        Some(json!({"app_name": app, "org_slug": org})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    v["id"].as_str().unwrap().to_string()
}

/// A self-signed certificate of `hostname` and its key (PEM), and the certificate's DER.
fn pem_for(hostname: &str) -> (String, String, Vec<u8>) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec![hostname.into()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    (cert.pem(), key.serialize_pem(), cert.der().to_vec())
}

async fn add_cert(
    router: &Router,
    app: &str,
    hostname: &str,
    for_name: &str,
) -> (StatusCode, Value) {
    let (cert, key, _) = pem_for(for_name);
    call(
        router,
        Method::POST,
        &format!("/v1/apps/{app}/certificates"),
        Some(json!({"hostname": hostname, "cert": cert, "key": key})),
    )
    .await
}

/// The DER of the leaf the store serves for `hostname`.
fn served_leaf(store: &CertStore, hostname: &str) -> Option<Vec<u8>> {
    store
        .key_for(hostname)
        .map(|k| k.end_entity_cert().unwrap().as_ref().to_vec())
}

fn store_of(node: &InProcessAgent) -> (CertStore, tokio_util::sync::CancellationToken) {
    let shutdown = tokio_util::sync::CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let store = CertStore::start(node.catalog.clone(), TEST_SECRET, shutdown.clone(), &tasks);
    (store, shutdown)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_apps_hostnames_and_secrets_do_not_pass_to_a_new_app_of_its_name() {
    let node = InProcessAgent::start().await.unwrap();
    let api = bazaar_api::router(node.node());
    let (store, shutdown) = store_of(&node);
    let hostname = "shop.example.com";

    let first = create_app(&api, "shop", "alpha").await;
    let (s, v) = add_cert(&api, "shop", hostname, hostname).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = call(
        &api,
        Method::POST,
        "/v1/apps/shop/secrets",
        Some(json!({"values": {"DB_URL": "postgres://alpha"}})),
    )
    .await;
    assert!(s.is_success(), "{v}");
    store.rebuild();
    assert!(store.key_for(hostname).is_some(), "alpha's shop is served");
    assert_eq!(store.app_of(hostname).as_deref(), Some("shop"));

    let (s, v) = call(&api, Method::DELETE, "/v1/apps/shop", None).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    store.rebuild();
    assert!(
        store.key_for(hostname).is_none(),
        "a deleted app's hostname is not served"
    );
    assert_eq!(store.app_of(hostname), None, "nor routed");
    let rows = node.catalog.certificates();
    assert!(
        !bazaar_certs::current(&rows).contains_key(hostname),
        "the delete removed its hostname (a tombstone)"
    );

    // Another organization makes `shop` again: it starts empty.
    let second = create_app(&api, "shop", "beta").await;
    let (s, v) = call(&api, Method::GET, "/v1/apps/shop/certificates", None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v, json!([]), "the new shop has no certificates");
    let (s, v) = call(
        &api,
        Method::GET,
        &format!("/v1/apps/shop/certificates/{hostname}"),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    let (s, v) = call(&api, Method::GET, "/v1/apps/shop/secrets", None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["secrets"], json!([]), "{v}");
    store.rebuild();
    assert!(
        store.key_for(hostname).is_none(),
        "alpha's key is served for nobody"
    );
    assert_eq!(store.app_of(hostname), None);

    // The hostname is free: the new shop attaches it with its own certificate.
    let (cert, key, der) = pem_for(hostname);
    let (s, v) = call(
        &api,
        Method::POST,
        "/v1/apps/shop/certificates",
        Some(json!({"hostname": hostname, "cert": cert, "key": key})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    store.rebuild();
    assert_eq!(served_leaf(&store, hostname), Some(der), "beta's own key");
    assert_ne!(first, second, "a new app gets a new id");
    shutdown.cancel();
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_attaches_no_other_apps_name_under_the_app_domain_nor_its_hostnames() {
    let node = InProcessAgent::start().await.unwrap();
    let api = bazaar_api::router(node.node());
    let (store, shutdown) = store_of(&node);
    create_app(&api, "a1", "alpha").await;
    create_app(&api, "b1", "beta").await;

    // Another app's address (`<app>.<proxy domain>`, `localhost` here), or below it, or
    // the address of an app that does not exist yet.
    for name in ["a1.localhost", "www.a1.localhost", "c1.localhost"] {
        let (s, v) = add_cert(&api, "b1", name, name).await;
        assert_eq!(s, StatusCode::CONFLICT, "{name}: {v}");
        let why = v["error"].as_str().unwrap();
        assert!(
            why.contains("b1.localhost"),
            "{name}: says what b1 may attach: {why}"
        );
    }
    store.rebuild();
    assert_eq!(
        store.app_of("a1.localhost"),
        None,
        "a1's address stays a1's"
    );
    // Its own address is b1's to attach.
    let (s, v) = add_cert(&api, "b1", "b1.localhost", "b1.localhost").await;
    assert_eq!(s, StatusCode::CREATED, "{v}");

    // A hostname another app holds.
    let (s, v) = add_cert(&api, "a1", "www.example.com", "www.example.com").await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = add_cert(&api, "b1", "www.example.com", "www.example.com").await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    store.rebuild();
    assert_eq!(store.app_of("www.example.com").as_deref(), Some("a1"));
    shutdown.cancel();
    node.stop().await;
}

/// Fly's certificate paths: `POST .../certificates/{hostname}/check` answers a certificate
/// with its status (404 for a hostname the app does not have, or another app's), and
/// `POST .../certificates/acme` attaches by ACME, refused with the flag to set on a host
/// that has no ACME directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_are_checked_and_issued_on_flys_paths() {
    let node = InProcessAgent::start().await.unwrap();
    let api = bazaar_api::router(node.node());
    create_app(&api, "shop", "acme").await;
    create_app(&api, "blog", "acme").await;
    let (s, v) = add_cert(&api, "shop", "www.shop.example", "www.shop.example").await;
    assert_eq!(s, StatusCode::CREATED, "{v}");

    let check = |app: &str, hostname: &str| format!("/v1/apps/{app}/certificates/{hostname}/check");
    let (s, v) = call(&api, Method::POST, &check("shop", "www.shop.example"), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        (v["status"].clone(), v["source"].clone()),
        (json!("issued"), json!("custom"))
    );
    for (app, hostname) in [("shop", "other.example"), ("blog", "www.shop.example")] {
        let (s, v) = call(&api, Method::POST, &check(app, hostname), None).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{app} {hostname}: {v}");
        assert!(v["error"].is_string(), "{v}");
    }

    let acme = "/v1/apps/shop/certificates/acme";
    let (s, v) = call(
        &api,
        Method::POST,
        acme,
        Some(json!({"hostname": "api.shop.example"})),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("--acme-directory"),
        "{v}"
    );
    let (s, v) = call(&api, Method::POST, acme, Some(json!({}))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let (s, v) = call(&api, Method::GET, "/v1/apps/shop/certificates", None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        v.as_array().unwrap().len(),
        1,
        "nothing attached by a refusal: {v}"
    );
    node.stop().await;
}
