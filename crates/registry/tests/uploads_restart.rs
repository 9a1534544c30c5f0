//! A chunked upload cut by a restart of the agent goes on where its bytes end: the registry
//! of a new agent over the same store (the store reopened, as a restart does) answers the
//! upload's range, takes the next chunk after it and adopts the whole blob; an upload it
//! finished or cancelled leaves nothing on disk.

use axum::body::Body;
use axum::http::{header, HeaderMap, Method, Request, StatusCode};
use bazaar_auth::Scope;
use bazaar_image::{Digest, ImageStore, StoreOptions};
use bazaar_registry::RegistryConfig;
use bazaar_testkit::in_process::InProcessAgent;
use std::path::Path;
use tower::ServiceExt;

/// The registry of `agent` over the store at `root`, opened afresh.
fn registry(agent: &InProcessAgent, root: &Path) -> axum::Router {
    let store = ImageStore::open(root, StoreOptions::default()).unwrap();
    bazaar_registry::router(agent.node(), store, RegistryConfig::default())
}

async fn call(
    router: &axum::Router,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (StatusCode, HeaderMap) {
    let token = bazaar_testkit::tokens::mint(&Scope {
        apps: ["web".to_string()].into(),
        ..Scope::default()
    });
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_LENGTH, body.len());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Body::from(body.to_vec())).unwrap();
    let resp = router.clone().oneshot(req).await.unwrap();
    (resp.status(), resp.headers().clone())
}

#[tokio::test]
async fn a_chunked_upload_goes_on_after_a_restart_where_its_bytes_end() {
    let agent = InProcessAgent::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("images");
    let data = b"the first half|the second half".to_vec();
    let digest = Digest::of(&data);

    let before = registry(&agent, &root);
    let (s, h) = call(&before, Method::POST, "/v2/web/blobs/uploads/", &[], b"").await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let upload = h[header::LOCATION].to_str().unwrap().to_string();
    let (s, _) = call(
        &before,
        Method::PATCH,
        &upload,
        &[("content-range", "0-14")],
        &data[..15],
    )
    .await;
    assert_eq!(s, StatusCode::ACCEPTED);
    drop(before);

    // The agent restarts: a new registry over the same store.
    let after = registry(&agent, &root);
    let (s, h) = call(&after, Method::GET, &upload, &[], b"").await;
    assert_eq!(s, StatusCode::NO_CONTENT, "the upload is known");
    assert_eq!(h[header::RANGE], "0-14", "where its bytes end");
    let (s, _) = call(
        &after,
        Method::PATCH,
        &upload,
        &[("content-range", "15-29")],
        &data[15..],
    )
    .await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let (s, _) = call(
        &after,
        Method::PUT,
        &format!("{upload}?digest={digest}"),
        &[],
        b"",
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, h) = call(
        &after,
        Method::HEAD,
        &format!("/v2/web/blobs/{digest}"),
        &[],
        b"",
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(h[header::CONTENT_LENGTH], "30");

    // A cancelled upload is gone after a restart, and nothing of either is left.
    let (_, h) = call(&after, Method::POST, "/v2/web/blobs/uploads/", &[], b"").await;
    let cancelled = h[header::LOCATION].to_str().unwrap().to_string();
    let (s, _) = call(&after, Method::DELETE, &cancelled, &[], b"").await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let again = registry(&agent, &root);
    for gone in [&upload, &cancelled] {
        let (s, _) = call(&again, Method::GET, gone, &[], b"").await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{gone}");
    }
    let left: Vec<_> = std::fs::read_dir(root.join("uploads"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
    agent.stop().await;
}
