//! Where a pull may connect (issue 31, item 6): an image reference naming a loopback
//! registry (by address or by name) is refused before any connection unless the store
//! allows loopback registries; a registry's redirect to an address it may not reach is not
//! followed; and a failed pull never carries the answer's body, only an OCI error code.

mod common;

use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use bazaar_image::{Auth, Error, ImageStore, Reference, StoreOptions};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A listener on `ip` that counts the connections made to it (and closes them).
async fn counting_listener(ip: &str) -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            seen.fetch_add(1, Ordering::SeqCst);
            drop(stream);
        }
    });
    (addr, count)
}

/// Serves `app` on loopback; its `host:port`.
async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

async fn pull(store: &ImageStore, reference: &str) -> Error {
    let reference: Reference = reference.parse().unwrap();
    store
        .pull(&reference, &Auth::Anonymous, &|_| {})
        .await
        .expect_err("the pull fails")
}

#[tokio::test]
async fn loopback_registries_are_not_reached_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(dir.path(), StoreOptions::default()).unwrap();
    let (addr, connections) = counting_listener("127.0.0.1").await;
    let port = addr.rsplit(':').next().unwrap();
    // By address, and by a name that resolves to loopback.
    for registry in [addr.clone(), format!("localhost:{port}")] {
        let err = pull(&store, &format!("{registry}/app:v1"))
            .await
            .to_string();
        assert!(err.contains("--insecure-registry"), "{err}");
    }
    assert_eq!(connections.load(Ordering::SeqCst), 0, "nothing reached it");

    // Allowed: the registry is reached (and closes the connection at once).
    let allowed = ImageStore::open(dir.path(), common::loopback_store()).unwrap();
    let err = pull(&allowed, &format!("{addr}/app:v1")).await;
    assert!(matches!(err, Error::Http { .. }), "{err}");
    assert!(connections.load(Ordering::SeqCst) >= 1);
}

#[tokio::test]
async fn redirects_to_addresses_the_store_may_not_reach_are_not_followed() {
    let (target, connections) = counting_listener("127.0.0.2").await;
    let location = format!("http://{target}/secret");
    let registry = serve(Router::new().route(
        "/v2/app/manifests/v1",
        get(move || {
            let location = location.clone();
            async move { (StatusCode::FOUND, [(header::LOCATION, location)]).into_response() }
        }),
    ))
    .await;
    // This registry (by its address) is allowed; 127.0.0.2 is not.
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(
        dir.path(),
        StoreOptions {
            insecure_registries: vec![registry.clone()],
            ..StoreOptions::default()
        },
    )
    .unwrap();
    let err = pull(&store, &format!("{registry}/app:v1"))
        .await
        .to_string();
    assert!(err.contains("127.0.0.2"), "{err}");
    assert_eq!(connections.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_failed_pull_carries_no_answer_body() {
    let registry = serve(
        Router::new()
            .route(
                "/v2/app/manifests/v1",
                get(|| async {
                    (
                        StatusCode::NOT_FOUND,
                        r#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"root:x:0:0:secret"}]}"#,
                    )
                }),
            )
            .route(
                "/v2/other/manifests/v1",
                get(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "root:x:0:0:secret") }),
            ),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(dir.path(), common::loopback_store()).unwrap();
    let err = pull(&store, &format!("{registry}/app:v1"))
        .await
        .to_string();
    assert!(err.contains("404: MANIFEST_UNKNOWN"), "{err}");
    assert!(!err.contains("secret"), "{err}");
    let err = pull(&store, &format!("{registry}/other:v1"))
        .await
        .to_string();
    assert!(err.contains("500"), "{err}");
    assert!(!err.contains("secret"), "{err}");
}
