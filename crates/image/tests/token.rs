//! The Bearer token flow: a small token service and gate in front of the real registry
//! answers 401 with `WWW-Authenticate: Bearer realm=…,service=…,scope=…`, hands out a
//! token for good credentials, and forwards requests that carry it.

mod common;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use base64::Engine;
use bazaar_image::{Auth, Error, ImageStore};
use common::{busybox_layer, push, TestRegistry};
use std::sync::{Arc, Mutex};

const TOKEN: &str = "tok-8f3a";

struct Gate {
    me: String,
    registry: String,
    http: reqwest::Client,
    /// Query strings of token requests.
    token_requests: Mutex<Vec<String>>,
}

async fn token(State(gate): State<Arc<Gate>>, headers: HeaderMap, req: Request) -> Response {
    gate.token_requests
        .lock()
        .unwrap()
        .push(req.uri().query().unwrap_or("").to_string());
    let good = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("bob:hunter2")
    );
    if headers
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        != Some(good.as_str())
    {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    axum::Json(serde_json::json!({ "token": TOKEN })).into_response()
}

async fn forward(State(gate): State<Arc<Gate>>, req: Request) -> Response {
    let bearer = format!("Bearer {TOKEN}");
    let authorized = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        == Some(bearer.as_str());
    if !authorized {
        let repo = req
            .uri()
            .path()
            .trim_start_matches("/v2/")
            .split("/manifests/")
            .next()
            .unwrap_or("")
            .split("/blobs/")
            .next()
            .unwrap_or("")
            .to_string();
        let challenge = format!(
            r#"Bearer realm="http://{}/token",service="bazaar-test",scope="repository:{repo}:pull""#,
            gate.me
        );
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, challenge)],
        )
            .into_response();
    }
    let url = format!("http://{}{}", gate.registry, req.uri());
    let mut out = gate.http.request(req.method().clone(), url);
    if let Some(accept) = req.headers().get(header::ACCEPT) {
        out = out.header(header::ACCEPT, accept.to_str().unwrap());
    }
    let resp = out.send().await.unwrap();
    let status = resp.status().as_u16();
    let content_type = resp.headers().get(header::CONTENT_TYPE).cloned();
    let body = resp.bytes().await.unwrap();
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = StatusCode::from_u16(status).unwrap();
    if let Some(ct) = content_type {
        r.headers_mut().insert(header::CONTENT_TYPE, ct);
    }
    r
}

#[tokio::test]
async fn bearer_token_flow() {
    let reg = TestRegistry::start(None);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let me = listener.local_addr().unwrap().to_string();
    let gate = Arc::new(Gate {
        me: me.clone(),
        registry: reg.host.clone(),
        http: reqwest::Client::new(),
        token_requests: Mutex::default(),
    });
    let app = Router::new()
        .route("/token", get(token))
        .fallback(forward)
        .with_state(gate.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let store_dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(store_dir.path(), common::loopback_store()).unwrap();
    let direct = store.registry(&reg.host, Auth::Anonymous).unwrap();
    let digest = push(&direct, "test/tok", "v1", &[&busybox_layer()], "amd64").await;
    let r = format!("{me}/test/tok:v1").parse().unwrap();

    let err = store.pull(&r, &Auth::Anonymous, &|_| {}).await.unwrap_err();
    assert!(
        matches!(&err, Error::Auth { reason, .. } if reason.contains("token endpoint answered 401")),
        "{err}"
    );
    gate.token_requests.lock().unwrap().clear();

    let bob = Auth::Basic {
        username: "bob".into(),
        password: "hunter2".into(),
    };
    let image = store.pull(&r, &bob, &|_| {}).await.unwrap();
    assert_eq!(image.manifest_digest, digest);
    assert!(store
        .layer_dir(&image.layers[0].digest)
        .join("bin/busybox")
        .is_file());
    // One token for the whole pull (manifest, config, layer), for the challenge's scope.
    let requests = gate.token_requests.lock().unwrap().clone();
    assert_eq!(
        requests,
        ["service=bazaar-test&scope=repository%3Atest%2Ftok%3Apull"]
    );
}
