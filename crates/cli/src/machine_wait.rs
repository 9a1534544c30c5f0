//! Waiting for a machine the user just started (`bazaar machine run`, `start`, `restart`,
//! `update`), as `fly machine run` does: until it is `started` and stays so for a short
//! settle window, with a progress line on a terminal. A machine that fails to launch (a pull
//! error, a command that cannot run), stops, or exits within the window (also when its
//! restart policy starts it again) is a failure: the caller gets an error that says why (the
//! exit event's error or exit code) and ends with the last lines of the machine's log. The
//! machine is left as it is, for inspection. A job that exits with code 0 and is not
//! started again did what it was asked: that is not a failure.

use crate::api_cmd::{s, Conn};
use serde_json::Value;
use std::collections::HashSet;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// How long a machine must stay started before the command says it runs. A workload that
/// exits at once (a bad command line, a missing file) does so well within this.
const SETTLE: Duration = Duration::from_millis(1500);
/// How long to wait for `started` (image pulls included).
const START_LIMIT: Duration = Duration::from_secs(300);
/// Lines of the machine's log shown with a failure.
const LOG_LINES: usize = 10;

/// The ids of the events a machine has now: what happens after an action is what is not
/// in this set.
pub(crate) async fn seen_events(c: &Conn, app: &str, id: &str) -> anyhow::Result<HashSet<String>> {
    let m = c
        .call(
            reqwest::Method::GET,
            &format!("/apps/{app}/machines/{id}"),
            None,
        )
        .await?;
    Ok(event_ids(&m))
}

fn event_ids(m: &Value) -> HashSet<String> {
    m["events"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| s(&e["id"]))
        .collect()
}

/// Waits until machine `id` runs (see the module doc); events in `seen` happened before the
/// action. Returns the machine as last read.
pub(crate) async fn until_running(
    c: &Conn,
    app: &str,
    id: &str,
    seen: &HashSet<String>,
) -> anyhow::Result<Value> {
    let progress = Progress::new(id);
    let begun = Instant::now();
    let mut started_at: Option<Instant> = None;
    let mut pause = Duration::from_millis(20);
    let path = format!("/apps/{app}/machines/{id}");
    loop {
        let m = c.call(reqwest::Method::GET, &path, None).await?;
        let state = s(&m["state"]);
        let new_events: Vec<&Value> = m["events"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| !seen.contains(&s(&e["id"])))
            .collect();
        match verdict(&state, &new_events) {
            Verdict::Failed(reason) => {
                progress.clear();
                let log = log_tail(c, app, id).await;
                anyhow::bail!("machine {id} failed: {reason}{log}");
            }
            Verdict::Finished => {
                progress.clear();
                return Ok(m);
            }
            Verdict::Pending => {}
        }
        if state == "started" {
            let since = *started_at.get_or_insert_with(Instant::now);
            if since.elapsed() >= SETTLE {
                progress.clear();
                return Ok(m);
            }
        } else {
            started_at = None;
        }
        if begun.elapsed() > START_LIMIT {
            progress.clear();
            anyhow::bail!(
                "machine {id} did not start within {} s (state {state}); see `bazaar machine status -a {app} {id}`",
                START_LIMIT.as_secs()
            );
        }
        progress.show(&state, &new_events, begun.elapsed());
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// What the machine's state and the events since the action (newest first) say.
#[derive(Debug, PartialEq)]
enum Verdict {
    /// Not started yet, or started and no exit so far.
    Pending,
    /// It ran its job and exited with code 0, and is not started again.
    Finished,
    /// Why it counts as failed.
    Failed(String),
}

fn verdict(state: &str, new_events: &[&Value]) -> Verdict {
    let exits: Vec<&Value> = new_events
        .iter()
        .copied()
        .filter(|e| e["type"] == "exit")
        .filter(|e| e["request"]["exit_event"]["requested_stop"] != true)
        .collect();
    let exited = matches!(
        state,
        "stopped" | "failed" | "launch_failed" | "destroyed" | "destroying"
    );
    let Some(last) = exits.first() else {
        return match exited {
            true => Verdict::Failed(format!("it is {state}")),
            false => Verdict::Pending,
        };
    };
    let exit = &last["request"]["exit_event"];
    let code = exit["exit_code"].as_i64().unwrap_or(-1);
    let restarting = exit["restarting"] == true || exits.len() > 1;
    if code == 0 && exit["error"].is_null() && !restarting {
        return Verdict::Finished;
    }
    let mut reason = if let Some(err) = exit["error"].as_str() {
        err.to_string()
    } else if exit["oom_killed"] == true {
        "out of memory: killed by the kernel at the machine's memory limit".to_string()
    } else if exit["signal"].as_i64().is_some_and(|sig| sig > 0) {
        format!("killed by signal {}", exit["signal"])
    } else {
        format!("exited with code {code}")
    };
    if exits.len() > 1 {
        reason += &format!(" ({} exits since it was started)", exits.len());
    }
    if !exited {
        reason += &format!("; it is {state}");
    }
    Verdict::Failed(reason)
}

/// The last lines of the machine's log, as a block to append to an error ("" if none).
async fn log_tail(c: &Conn, app: &str, id: &str) -> String {
    let Ok(v) = c
        .call(
            reqwest::Method::GET,
            &format!("/apps/{app}/machines/{id}/logs?follow=false"),
            None,
        )
        .await
    else {
        return String::new();
    };
    // The log is JSON lines ({ts, stream, line}); a single line parses as one object.
    let lines: Vec<String> = match &v {
        Value::String(text) => text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                serde_json::from_str::<Value>(l)
                    .map(|j| s(&j["line"]))
                    .unwrap_or_else(|_| l.to_string())
            })
            .collect(),
        Value::Object(_) => vec![s(&v["line"])],
        _ => Vec::new(),
    };
    if lines.is_empty() {
        return String::new();
    }
    let tail = &lines[lines.len().saturating_sub(LOG_LINES)..];
    format!("\nlast lines of its log:\n  {}", tail.join("\n  "))
}

/// One line on stderr, rewritten in place, only when stderr is a terminal.
struct Progress {
    id: String,
    on: bool,
}

impl Progress {
    fn new(id: &str) -> Progress {
        Progress {
            id: id.to_string(),
            on: std::io::stderr().is_terminal(),
        }
    }

    fn show(&self, state: &str, new_events: &[&Value], elapsed: Duration) {
        if !self.on {
            return;
        }
        let doing = match new_events.first() {
            Some(e) if e["type"] == "pull" => "image pulled, booting",
            _ if state == "started" => "started, checking that it stays up",
            _ if state == "starting" || state == "created" => "pulling its image or booting",
            _ => state,
        };
        let mut err = std::io::stderr();
        let _ = write!(
            err,
            "\r\x1b[Kwaiting for machine {}: {doing} ({:.0} s)",
            self.id,
            elapsed.as_secs_f64()
        );
        let _ = err.flush();
    }

    fn clear(&self) {
        if self.on {
            let _ = write!(std::io::stderr(), "\r\x1b[K");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn exit(code: i64, restarting: bool, error: Option<&str>) -> Value {
        json!({"type": "exit", "status": "stopped", "request": {"exit_event": {
            "exit_code": code, "restarting": restarting, "requested_stop": false, "error": error}}})
    }

    #[test]
    fn exits_after_the_action_are_failures_unless_the_job_just_finished() {
        let failed = |v: Verdict, what: &str| match v {
            Verdict::Failed(reason) => assert!(reason.contains(what), "{reason}"),
            other => panic!("{other:?}, expected a failure saying {what:?}"),
        };
        let start = json!({"type": "start", "status": "started"});
        assert_eq!(verdict("starting", &[]), Verdict::Pending);
        assert_eq!(verdict("started", &[&start]), Verdict::Pending);
        let e3 = exit(3, true, None);
        failed(verdict("started", &[&e3, &start]), "exited with code 3");
        let pull = exit(-1, false, Some("pulling x: no such host"));
        failed(verdict("failed", &[&pull]), "no such host");
        let done = exit(0, false, None);
        assert_eq!(verdict("stopped", &[&done, &start]), Verdict::Finished);
        let again = exit(0, true, None);
        failed(verdict("started", &[&again, &start]), "exited with code 0");
        failed(verdict("stopped", &[&start]), "stopped");
        let stop = json!({"type": "exit", "request": {"exit_event": {
            "exit_code": 143, "requested_stop": true}}});
        assert_eq!(verdict("started", &[&start, &stop]), Verdict::Pending);
    }
}
