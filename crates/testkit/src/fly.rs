//! A Fly Machines API client for tests and benchmarks: `/v1` of one agent, authenticated
//! with [`TEST_SECRET`]. Every call answers `(status, body)`, the body parsed as JSON (a
//! body that is not JSON comes back as a JSON string), so a test can assert on both.

use crate::{TestAgent, TEST_SECRET};
use reqwest::{Client, Method, StatusCode};
use serde_json::Value;
use std::time::Duration;

/// The Machines API of one agent.
#[derive(Debug, Clone)]
pub struct Fly {
    /// `http://<agent>/v1`.
    pub base: String,
    pub http: Client,
}

impl Fly {
    /// The API of `agent`.
    pub fn new(agent: &TestAgent) -> Fly {
        Fly::with_client(agent, Client::new())
    }

    /// The API of `agent`, called through `http` (a client the test already keeps).
    pub fn with_client(agent: &TestAgent, http: Client) -> Fly {
        Fly {
            base: format!("{}/v1", agent.url()),
            http,
        }
    }

    /// `method path` with an optional JSON body.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        self.call_leased(method, path, body, None).await
    }

    /// As [`Fly::call`], holding the machine's lease when `nonce` is given
    /// (`fly-machine-lease-nonce`).
    pub async fn call_leased(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        nonce: Option<&str>,
    ) -> (StatusCode, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(TEST_SECRET)
            .timeout(Duration::from_secs(60));
        if let Some(n) = nonce {
            req = req.header("fly-machine-lease-nonce", n);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("the API answers");
        let status = resp.status();
        let text = resp.text().await.expect("the API's answer is read whole");
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.call(Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::POST, path, Some(body)).await
    }

    pub async fn put(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::PUT, path, Some(body)).await
    }

    pub async fn delete(&self, path: &str) -> (StatusCode, Value) {
        self.call(Method::DELETE, path, None).await
    }

    /// Creates app `app`; panics unless the API says 201.
    pub async fn create_app(&self, app: &str) {
        let (s, v) = self
            .post(
                "/apps",
                serde_json::json!({"app_name": app, "org_slug": "personal"}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "creating app {app}: {v}");
    }

    /// Waits (at most 30 s) until machine `id` is in `state`; panics otherwise.
    pub async fn wait_state(&self, app: &str, id: &str, state: &str) {
        let (s, v) = self
            .get(&format!(
                "/apps/{app}/machines/{id}/wait?state={state}&timeout=30"
            ))
            .await;
        assert_eq!(s, StatusCode::OK, "machine {id} never {state}: {v}");
    }
}
