//! The Machines API of one agent for tests and benchmarks, authenticated with the test
//! org token ([`crate::tokens::admin`]; the cluster secret is not an API token): the typed
//! client ([`Fly::client`]), and raw calls that answer
//! `(status, body)`, the body parsed as JSON (a body that is not JSON comes back as a JSON
//! string), so a test can assert on both. Both go through [`FlyClient`].

use crate::TestAgent;
use bazaar_client::FlyClient;
use reqwest::{Client, Method, StatusCode};
use serde_json::Value;
use std::time::Duration;

/// The Machines API of one agent.
#[derive(Debug, Clone)]
pub struct Fly {
    /// `http://<agent>/v1`.
    pub base: String,
    /// The typed client of the same API.
    pub client: FlyClient,
}

impl Fly {
    /// The API of `agent`.
    pub fn new(agent: &TestAgent) -> Fly {
        let http = Client::builder()
            .timeout(Duration::from_secs(60))
            // Agents close connections idle for their head timeout (10 s).
            .pool_idle_timeout(Duration::from_secs(5))
            .build()
            .expect("an HTTP client");
        Fly::with_client(agent, http)
    }

    /// The API of `agent`, called through `http` (a client the test already keeps).
    pub fn with_client(agent: &TestAgent, http: Client) -> Fly {
        Fly {
            base: format!("{}/v1", agent.url()),
            client: FlyClient::with_http(&agent.url(), crate::tokens::admin(), http),
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
        let (status, body) = self
            .client
            .raw(method, path, body.as_ref(), nonce)
            .await
            .expect("the API answers");
        let status = StatusCode::from_u16(status).expect("an HTTP status");
        let text = String::from_utf8_lossy(&body).into_owned();
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

    /// Creates app `app`; panics unless the API creates it.
    pub async fn create_app(&self, app: &str) {
        if let Err(e) = self.client.create_app(app, "personal").await {
            panic!("creating app {app}: {e}");
        }
    }

    /// Waits (at most 30 s) until machine `id` is in `state`; panics otherwise.
    pub async fn wait_state(&self, app: &str, id: &str, state: &str) {
        let waited = self
            .client
            .wait(app, id, state, None, Duration::from_secs(30))
            .await;
        if let Err(e) = waited {
            panic!("machine {id} never {state}: {e}");
        }
    }
}
