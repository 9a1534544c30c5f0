//! Helpers shared by the proxy tests: a cluster, apps and machines through the Machines
//! API, and a Python backend (`tests/proxy/backend.py`) that reports the concurrency it saw.
#![allow(dead_code)]

use bazaar_testkit::{start_cluster, AgentOptions, Fly, TestAgent};
use reqwest::{Client, Method, StatusCode};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;

pub const EXE: &str = env!("CARGO_BIN_EXE_bazaar");
const BACKEND: &str = include_str!("backend.py");

pub struct Cluster {
    pub agents: Vec<TestAgent>,
    /// The Machines API of agent 0.
    pub fly: Fly,
    /// For requests through the proxies.
    pub http: Client,
}

impl Cluster {
    /// `n` agents; `args` are extra agent flags.
    pub fn start(n: usize, args: &[&str]) -> Cluster {
        Cluster::start_with(n, |_, o| {
            o.extra_args.extend(args.iter().map(|s| s.to_string()));
        })
    }

    /// `n` agents, each configured by `configure` (by index).
    pub fn start_with(n: usize, configure: impl FnMut(usize, &mut AgentOptions)) -> Cluster {
        let agents =
            start_cluster(std::path::Path::new(EXE), n, configure).expect("cluster starts");
        Cluster {
            fly: Fly::new(&agents[0]),
            agents,
            http: Client::builder()
                .pool_max_idle_per_host(64)
                .build()
                .unwrap(),
        }
    }

    /// The Machines API of agent 0.
    pub async fn api(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        self.fly.call(method, path, body).await
    }

    pub async fn create_app(&self, app: &str) {
        self.fly.create_app(app).await
    }

    /// Creates a machine running the backend with `service` (merged over internal port
    /// 8080); waits until it is started. `env` adds environment variables.
    pub async fn create_machine(&self, app: &str, service: Value, env: Value) -> String {
        let mut svc = json!({"internal_port": 8080, "protocol": "tcp"});
        if let (Some(base), Some(extra)) = (svc.as_object_mut(), service.as_object()) {
            for (k, v) in extra {
                base.insert(k.clone(), v.clone());
            }
        }
        let mut envs = json!({});
        if let (Some(base), Some(extra)) = (envs.as_object_mut(), env.as_object()) {
            for (k, v) in extra {
                base.insert(k.clone(), v.clone());
            }
        }
        let config = json!({
            "image": "process", "driver": "process",
            // The source itself: a machine sees none of the host's files but its programs.
            "init": {"exec": ["python3", "-c", BACKEND]},
            "env": envs,
            "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256},
            "restart": {"policy": "no"},
            "services": [svc],
        });
        let (s, m) = self
            .api(
                Method::POST,
                &format!("/apps/{app}/machines"),
                Some(json!({"config": config})),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{m}");
        let id = m["id"].as_str().unwrap().to_string();
        self.wait_state(app, &id, "started").await;
        id
    }

    /// A file in machine `id`'s working directory, on whichever agent has it.
    pub fn work_file(&self, id: &str, name: &str) -> PathBuf {
        let dirs = self
            .agents
            .iter()
            .map(|a| a.data_dir.join("machines").join(id));
        let dir = dirs
            .clone()
            .find(|d| d.exists())
            .expect("the machine's directory");
        dir.join("work").join(name)
    }

    pub async fn wait_state(&self, app: &str, id: &str, state: &str) {
        self.fly.wait_state(app, id, state).await
    }

    pub async fn machine(&self, app: &str, id: &str) -> Value {
        self.api(Method::GET, &format!("/apps/{app}/machines/{id}"), None)
            .await
            .1
    }

    /// GET through agent `i`'s proxy with `Host: <app>.localhost`.
    pub async fn get(
        &self,
        i: usize,
        app: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> (StatusCode, reqwest::header::HeaderMap, String) {
        let mut req = self
            .http
            .get(format!("{}{path}", self.agents[i].proxy_url()))
            .header("host", format!("{app}.localhost"))
            .timeout(Duration::from_secs(30));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        match req.send().await {
            Ok(resp) => {
                let status = resp.status();
                let headers = resp.headers().clone();
                let body = resp.text().await.unwrap_or_default();
                (status, headers, body)
            }
            Err(err) => (
                StatusCode::from_u16(599).unwrap(),
                Default::default(),
                err.to_string(),
            ),
        }
    }

    /// Waits until agent `i`'s proxy answers 200 for the app.
    pub async fn wait_routable(&self, i: usize, app: &str) {
        bazaar_testkit::eventually(Duration::from_secs(20), || async {
            let (s, _, _) = self.get(i, app, "/", &[]).await;
            (s == StatusCode::OK).then_some(())
        })
        .await
        .unwrap_or_else(|_| panic!("{app} never routable through proxy {i}"));
    }

    /// `/metrics` of agent `i`, scraped with a bearer token as Prometheus would.
    pub async fn metrics(&self, i: usize) -> String {
        self.http
            .get(format!("{}/metrics", self.agents[i].url()))
            .bearer_auth(bazaar_testkit::TEST_SECRET)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

/// The machine id in a backend answer.
pub fn machine_of(body: &str) -> String {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v["machine"].as_str().map(str::to_string))
        .unwrap_or_default()
}
