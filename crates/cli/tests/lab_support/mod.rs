//! What the lab tests (`lab.rs`, `mesh.rs`, `guardian.rs`) share: a lab in a temporary
//! directory, taken down when the test ends (passed or not, with the hosts' logs shown on
//! a failure), one lab host's API (the lab's API token on the Machines API, the cluster
//! secret on the host interface and the catalog view), and waiting for a condition.
//! Each test adds the calls it needs to [`LabApi`] in an `impl` block of its own.
#![allow(dead_code)]

use crate::common::{is_root, EXE};
use bazaar_lab::Lab;
use reqwest::{Method, StatusCode};
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// A lab in a temporary directory, taken down when the test ends (passed or not).
pub struct TestLab {
    dir: tempfile::TempDir,
    /// Which lines of the hosts' logs a failed test shows (all of the last 30 if none).
    log_lines: Option<fn(&str) -> bool>,
}

impl TestLab {
    /// `bazaar lab up --memory-mb 2048 ARGS` in a new directory `bazaar-<name>-*`; panics
    /// unless it succeeds (or when not root: the lab makes network namespaces and mounts).
    /// Answers the lab and what `up` printed.
    pub fn up(name: &str, args: &[&str]) -> (TestLab, String) {
        assert!(
            is_root(),
            "the {name} tests need root (the lab: network namespaces, mounts)"
        );
        let dir = tempfile::Builder::new()
            .prefix(&format!("bazaar-{name}-"))
            .tempdir()
            .unwrap();
        let lab = TestLab {
            dir,
            log_lines: None,
        };
        let mut all = vec!["up", "--memory-mb", "2048"];
        all.extend(args);
        let out = lab.cli(&all);
        (lab, out)
    }

    /// On a failure, show only the log lines `keep` accepts (all of them, not the last 30).
    pub fn show_log_lines(mut self, keep: fn(&str) -> bool) -> TestLab {
        self.log_lines = Some(keep);
        self
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Runs `bazaar lab --dir DIR args...`; panics unless it succeeds; answers stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = self.cli_raw(args);
        assert!(
            out.status.success(),
            "bazaar lab {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn cli_raw(&self, args: &[&str]) -> std::process::Output {
        Command::new(EXE)
            .arg("lab")
            .arg("--dir")
            .arg(self.path())
            .args(args)
            .output()
            .unwrap()
    }

    pub fn lab(&self) -> Lab {
        Lab::open(self.path()).unwrap()
    }

    /// The variables `up` wrote to `lab.env`.
    pub fn env(&self) -> HashMap<String, String> {
        std::fs::read_to_string(self.path().join("lab.env"))
            .unwrap()
            .lines()
            .filter_map(|l| l.split_once('=').map(|(k, v)| (k.into(), v.into())))
            .collect()
    }
}

impl Drop for TestLab {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for e in std::fs::read_dir(self.path().join("logs"))
                .into_iter()
                .flatten()
                .flatten()
            {
                let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                let shown = match self.log_lines {
                    Some(keep) => text.lines().filter(|l| keep(l)).collect::<Vec<_>>(),
                    None => {
                        let lines: Vec<&str> = text.lines().collect();
                        lines[lines.len().saturating_sub(30)..].to_vec()
                    }
                };
                eprintln!("--- {}\n{}", e.path().display(), shown.join("\n"));
            }
        }
        if self.path().join("lab.json").exists() {
            let _ = self.cli_raw(&["down"]);
        }
    }
}

/// The Machines API, host interface and catalog of one lab host: the lab's API token on
/// the Machines API, the cluster secret on the rest (it is not an API token).
pub struct LabApi {
    pub http: reqwest::Client,
    pub base: String,
    pub token: String,
    pub secret: String,
}

impl LabApi {
    pub fn of(lab: &Lab, host: &str) -> LabApi {
        LabApi {
            http: reqwest::Client::new(),
            base: lab.api_url(&lab.host(host).unwrap()),
            token: lab.token().to_string(),
            secret: lab.cluster_secret().to_string(),
        }
    }

    /// One call; a host that does not answer (down, partitioned) is a 503 with the error.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let host_level =
            path.starts_with("/host/") || path.starts_with("/v1/catalog/") || path == "/metrics";
        let credential = if host_level {
            &self.secret
        } else {
            &self.token
        };
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(credential)
            .timeout(Duration::from_secs(40));
        if let Some(b) = body {
            req = req.json(&b);
        }
        match req.send().await {
            Ok(resp) => {
                let status = resp.status();
                let text = resp.text().await.unwrap_or_default();
                (
                    status,
                    serde_json::from_str(&text).unwrap_or(Value::String(text)),
                )
            }
            Err(e) => (
                StatusCode::SERVICE_UNAVAILABLE,
                Value::String(e.to_string()),
            ),
        }
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.call(Method::GET, path, None).await
    }

    /// This host's catalog digest (`None`: no answer): equal on hosts that agree.
    pub async fn digest(&self) -> Option<String> {
        let (s, v) = self.get("/v1/catalog/digest").await;
        (s == StatusCode::OK).then(|| v["digest"].as_str().unwrap().to_string())
    }

    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::POST, path, Some(body)).await
    }
}

/// Polls `probe` until it is true, for at most `secs`; panics with `what` otherwise.
pub async fn until<F, Fut>(secs: u64, what: &str, mut probe: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let result = bazaar_testkit::eventually(Duration::from_secs(secs), || {
        let f = probe();
        async move { f.await.then_some(()) }
    })
    .await;
    assert!(result.is_ok(), "within {secs} s: {what}");
}

/// As [`until`], for a probe that says what it saw when it is not yet true: a timeout
/// prints the last thing seen.
#[allow(dead_code)]
pub async fn until_seen<F, Fut>(secs: u64, what: &str, mut probe: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let last = std::sync::Mutex::new(String::from("nothing yet"));
    let result = bazaar_testkit::eventually(Duration::from_secs(secs), || {
        let f = probe();
        let last = &last;
        async move {
            match f.await {
                Ok(()) => Some(()),
                Err(seen) => {
                    *last.lock().unwrap() = seen;
                    None
                }
            }
        }
    })
    .await;
    assert!(
        result.is_ok(),
        "within {secs} s: {what}; last seen: {}",
        last.lock().unwrap()
    );
}
