//! Signing in to the dashboard takes an API token, never the cluster secret (issue 31,
//! item 8): the secret is refused with 401 in Fly's error shape, saying it is not an API
//! token, and sets no cookie. The dashboard's router on an agent in the test's own process.

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use bazaar_testkit::in_process::InProcessAgent;
use bazaar_testkit::{api_token, TEST_SECRET};
use tower::ServiceExt;

#[tokio::test]
async fn the_cluster_secret_does_not_sign_in() {
    let agent = InProcessAgent::start().await.unwrap();
    let ui = bazaar_dashboard::router(agent.node(), axum::Router::new());
    let sign_in = |token: &str| {
        Request::builder()
            .method(Method::POST)
            .uri("/ui/session")
            .body(Body::from(
                serde_json::json!({ "token": token }).to_string(),
            ))
            .unwrap()
    };
    let resp = ui.clone().oneshot(sign_in(TEST_SECRET)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert!(resp.headers().get(header::SET_COOKIE).is_none());
    let body = axum::body::to_bytes(resp.into_body(), 1 << 16)
        .await
        .unwrap();
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let error = body["error"].as_str().unwrap_or_else(|| panic!("{body}"));
    assert!(
        error.contains("the cluster secret is not an API token"),
        "{error}"
    );
    // An org token signs in.
    let resp = ui.clone().oneshot(sign_in(api_token())).await.unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    assert!(resp.headers().get(header::SET_COOKIE).is_some());
    agent.stop().await;
}
