//! Helpers shared by the agent tests.
#![allow(dead_code)]

use bazaar_client::HostClient;
use bazaar_testkit::{AgentOptions, TestAgent};
use bazaar_types::machine::Machine;
use bazaar_types::state::MachineState;
use std::time::Duration;

use bazaar_testkit::TEST_SECRET;
use reqwest::{Client, Method, StatusCode};
use serde_json::{json, Value};

pub const EXE: &str = env!("CARGO_BIN_EXE_bazaar");

pub fn agent() -> TestAgent {
    TestAgent::start(AgentOptions::new(EXE)).expect("agent starts")
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Waits until the machine is in `state`.
pub async fn wait_state(client: &HostClient, id: &str, state: MachineState) -> Machine {
    let result = bazaar_testkit::eventually(Duration::from_secs(20), || async {
        client.machine(id).await.ok().filter(|m| m.state == state)
    })
    .await;
    match result {
        Ok(m) => m,
        Err(_) => {
            let m = client.machine(id).await;
            panic!("machine {id} never reached {state}; now: {m:#?}");
        }
    }
}

/// A world-writable scratch directory (workloads run as nobody).
pub fn scratch() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("bazaar-scratch-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

/// Counts lines of a file (0 if missing).
pub fn lines(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

#[derive(Debug)]
/// A Fly Machines API client for tests (`/v1` of one agent, with the test secret).
pub struct Fly {
    base: String,
    http: Client,
}

impl Fly {
    pub fn new(agent: &TestAgent) -> Fly {
        Fly {
            base: format!("{}/v1", agent.url()),
            http: Client::new(),
        }
    }

    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(TEST_SECRET)
            .timeout(Duration::from_secs(60));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status();
        let text = resp.text().await.unwrap();
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

    pub async fn create_app(&self, app: &str) {
        let (s, v) = self
            .post("/apps", json!({"app_name": app, "org_slug": "personal"}))
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
    }

    pub async fn wait_state(&self, app: &str, id: &str, state: &str) {
        let (s, v) = self
            .get(&format!(
                "/apps/{app}/machines/{id}/wait?state={state}&timeout=30"
            ))
            .await;
        assert_eq!(s, StatusCode::OK, "machine {id} never {state}: {v}");
    }
}
