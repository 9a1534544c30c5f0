//! Every `/ui` answer carries the page policy (no inline script or style, no framing),
//! `nosniff` and `no-referrer`: pages, assets and errors alike. The dashboard's router on
//! an agent in the test's own process.

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use bazaar_testkit::in_process::InProcessAgent;
use tower::ServiceExt;

#[tokio::test]
async fn every_answer_carries_the_security_headers() {
    let agent = InProcessAgent::start().await.unwrap();
    let ui = bazaar_dashboard::router(agent.node(), axum::Router::new());
    let requests = [
        (Method::GET, "/ui/", "", StatusCode::OK),
        (Method::GET, "/ui/signin", "", StatusCode::OK),
        (Method::GET, "/ui/assets/dashboard.js", "", StatusCode::OK),
        (Method::GET, "/ui/assets/nope.js", "", StatusCode::NOT_FOUND),
        (Method::GET, "/ui/events", "", StatusCode::UNAUTHORIZED),
        (Method::POST, "/ui/session", "{", StatusCode::BAD_REQUEST),
    ];
    for (method, path, body, want) in requests {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .body(Body::from(body))
            .unwrap();
        let resp = ui.clone().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), want, "{path}");
        let h = resp.headers();
        let csp = h[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
        assert_eq!(csp, bazaar_dashboard::shell::CONTENT_SECURITY_POLICY);
        for directive in [
            "script-src 'self';",
            "style-src 'self';",
            "frame-ancestors 'none'",
        ] {
            assert!(csp.contains(directive), "{path}: {csp}");
        }
        assert!(!csp.contains("unsafe-inline"), "{csp}");
        assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff", "{path}");
        assert_eq!(h[header::REFERRER_POLICY], "no-referrer", "{path}");
    }
    agent.stop().await;
}
