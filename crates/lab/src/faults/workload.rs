//! The fault runner's traffic threads: the workload clients (creates, updates, stops,
//! starts and destroys through one node, each call recorded with its outcome), the proxy
//! requests to the web app and the ledger samples.

use super::{get_json, proxy_get, Node, Shared, CALL_TIMEOUT};
use crate::history::{Call, LedgerSample, Op, Outcome, ProxySample, Resources};
use crate::wire::{request, Reply};
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// One workload client: creates machines of `app` through node `n` (up to `live`), and
/// updates, stops, starts and destroys the ones it made, until told to stop. `token` is
/// an API token of the lab. Its machines are of class `priority` (`config.priority`) when
/// given.
pub(super) fn workload(
    client: usize,
    n: &Node,
    sh: &Shared,
    token: &str,
    app: &str,
    live: usize,
    priority: Option<&str>,
) {
    let mut mine: Vec<String> = Vec::new();
    let mut made = 0;
    while !sh.stop.load(Ordering::SeqCst) {
        let roll: u32 = rand::random::<u32>() % 100;
        let op = if mine.is_empty() || (mine.len() < live && roll < 50) {
            made += 1;
            Op::Create {
                app: app.into(),
                tag: format!("c{client}-{made}"),
            }
        } else {
            let id = mine[rand::random::<u32>() as usize % mine.len()].clone();
            let app = app.to_string();
            match roll % 4 {
                0 => Op::Update { app, id },
                1 => Op::Stop { app, id },
                2 => Op::Start { app, id },
                _ => Op::Destroy { app, id },
            }
        };
        let start_ms = sh.now_ms();
        let (method, path, body) = match &op {
            Op::Create { tag, .. } => (
                "POST",
                format!("/v1/apps/{app}/machines"),
                Some(json!({"name": tag, "config": load_config(0, priority)})),
            ),
            Op::Update { id, .. } => (
                "POST",
                format!("/v1/apps/{app}/machines/{id}"),
                Some(json!({"config": load_config(start_ms, priority)})),
            ),
            Op::Stop { id, .. } => ("POST", format!("/v1/apps/{app}/machines/{id}/stop"), None),
            Op::Start { id, .. } => ("POST", format!("/v1/apps/{app}/machines/{id}/start"), None),
            Op::Destroy { id, .. } => (
                "DELETE",
                format!("/v1/apps/{app}/machines/{id}?force=true"),
                None,
            ),
        };
        let reply = request(
            n.api,
            method,
            &path,
            None,
            token,
            body.map(|b| b.to_string()).as_deref(),
            CALL_TIMEOUT,
        );
        let outcome = outcome(reply);
        match (&op, &outcome) {
            (Op::Create { .. }, Outcome::Ok { id: Some(id), .. }) => mine.push(id.clone()),
            (Op::Destroy { id, .. }, Outcome::Ok { .. }) => mine.retain(|m| m != id),
            _ => {}
        }
        let call = Call {
            client,
            node: n.name.clone(),
            op,
            start_ms,
            end_ms: sh.now_ms(),
            outcome,
        };
        sh.calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(call);
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A workload machine: a process that sleeps, 256 MB; `version` makes each update differ.
fn load_config(version: u64, priority: Option<&str>) -> Value {
    let mut config = json!({
        "image": "process", "driver": "process",
        "init": {"exec": ["sleep", "100000"]},
        "env": {"LOAD_VERSION": version.to_string()},
        "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256},
    });
    if let Some(p) = priority {
        config["priority"] = json!(p);
    }
    config
}

fn outcome(reply: Reply) -> Outcome {
    match reply {
        Reply::Answer(s, body) if (200..300).contains(&s) => {
            let v: Value = serde_json::from_str(&body).unwrap_or_default();
            Outcome::Ok {
                id: v["id"].as_str().map(str::to_string),
                host_id: v["host_id"].as_str().map(str::to_string),
            }
        }
        Reply::Answer(s, body) if (400..500).contains(&s) => Outcome::Failed {
            status: s,
            error: error_text(&body),
        },
        Reply::Answer(s, body) => Outcome::Indeterminate {
            why: format!("{s} {}", error_text(&body)),
        },
        Reply::NotSent(e) => Outcome::Failed {
            status: 0,
            error: e,
        },
        Reply::Lost(e) => Outcome::Indeterminate { why: e },
    }
}

fn error_text(body: &str) -> String {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_string))
        .unwrap_or_else(|| body.chars().take(200).collect())
}

/// GETs `/` of the web app through `n`'s proxy, one request after another.
pub(super) fn proxy_traffic(n: &Node, sh: &Shared) {
    while !sh.stop.load(Ordering::SeqCst) {
        let at_ms = sh.now_ms();
        let status = proxy_get(n);
        sh.proxy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ProxySample {
                at_ms,
                proxy: n.name.clone(),
                status,
            });
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub(super) fn sample_ledger(n: &Node, sh: &Shared, secret: &str) {
    while !sh.stop.load(Ordering::SeqCst) {
        if let Some(s) = ledger(n, secret, sh.now_ms()) {
            sh.ledgers.lock().unwrap_or_else(|e| e.into_inner()).push(s);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `GET /host/v1/ledger` of `n`.
pub(super) fn ledger(n: &Node, secret: &str, at_ms: u64) -> Option<LedgerSample> {
    let v = get_json(n.api, "/host/v1/ledger", secret)?;
    let res = |r: &Value| Resources {
        cpus: r["cpus"].as_u64().unwrap_or_default() as u32,
        memory_mb: r["memory_mb"].as_u64().unwrap_or_default(),
    };
    Some(LedgerSample {
        at_ms,
        host: n.name.clone(),
        capacity: res(&v["capacity"]),
        committed: v["committed"]
            .as_object()?
            .iter()
            .map(|(id, r)| (id.clone(), res(r)))
            .collect(),
        reserved: res(&v["reserved"]),
        batch: v["batch"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|id| Some(id.as_str()?.to_string()))
                    .collect()
            })
            .unwrap_or_default(),
        displaced: v["displaced"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|id| Some(id.as_str()?.to_string()))
                    .collect()
            })
            .unwrap_or_default(),
        batch_held: v["reclaim"]["batch_held"].as_object().map(|o| {
            (
                o["millicpus"].as_u64().unwrap_or_default(),
                o["memory_mb"].as_u64().unwrap_or_default(),
            )
        }),
    })
}
