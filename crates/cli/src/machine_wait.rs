//! Waiting for a machine the user just started (`bazaar machine run`, `start`, `restart`,
//! `update`), as `fly machine run` does: until it is `started` and stays so for a short
//! settle window, with a progress line on a terminal. A machine that fails to launch (a pull
//! error, a command that cannot run), stops, or exits within the window (also when its
//! restart policy starts it again) is a failure: the caller gets an error that says why (the
//! exit event's error or exit code) and ends with the last lines of the machine's log. The
//! machine is left as it is, for inspection. A job that exits with code 0 and is not
//! started again did what it was asked: that is not a failure.

use bazaar_client::FlyClient;
use bazaar_types::event::{ExitEvent, MachineEvent};
use bazaar_types::machine::{LogLine, Machine};
use bazaar_types::state::MachineState;
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
pub(crate) async fn seen_events(
    api: &FlyClient,
    app: &str,
    id: &str,
) -> anyhow::Result<HashSet<String>> {
    let m = api.machine(app, id).await?;
    Ok(m.events.into_iter().map(|e| e.id).collect())
}

/// Waits until machine `id` runs (see the module doc); events in `seen` happened before the
/// action. Returns the machine as last read.
pub(crate) async fn until_running(
    api: &FlyClient,
    app: &str,
    id: &str,
    seen: &HashSet<String>,
) -> anyhow::Result<Machine> {
    let progress = Progress::new(id);
    let begun = Instant::now();
    let mut started_at: Option<Instant> = None;
    let mut pause = Duration::from_millis(20);
    loop {
        let m = api.machine(app, id).await?;
        let state = m.state;
        let new_events: Vec<&MachineEvent> =
            m.events.iter().filter(|e| !seen.contains(&e.id)).collect();
        match verdict(state, &new_events) {
            Verdict::Failed(reason) => {
                progress.clear();
                let log = log_tail(api, app, id).await;
                anyhow::bail!("machine {id} failed: {reason}{log}");
            }
            Verdict::Finished => {
                progress.clear();
                return Ok(m);
            }
            Verdict::Running => {
                let since = *started_at.get_or_insert_with(Instant::now);
                if since.elapsed() >= SETTLE {
                    progress.clear();
                    return Ok(m);
                }
            }
            Verdict::Pending => {}
        }
        if state != MachineState::Started {
            started_at = None;
        }
        if begun.elapsed() > START_LIMIT {
            progress.clear();
            anyhow::bail!(
                "machine {id} did not start within {} s (state {state}); see `bazaar machine status -a {app} {id}`",
                START_LIMIT.as_secs()
            );
        }
        progress.show(state, &new_events, begun.elapsed());
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// What the machine's state and the events since the action (newest first) say.
#[derive(Debug, PartialEq)]
enum Verdict {
    /// The action has not launched the machine yet (a restart or an update may still be
    /// stopping it, or be between its stop and its start).
    Pending,
    /// Started by the action, and no exit so far: it runs once it stays so for [`SETTLE`].
    Running,
    /// It ran its job and exited with code 0, and is not started again.
    Finished,
    /// Why it counts as failed.
    Failed(String),
}

/// Every action waited for ends by launching the machine, which records a `start` event (or,
/// when the launch fails, an exit that says why). Until that event, the machine's state is
/// the action under way, not its outcome: a restart or an update stops the machine first
/// (an exit left out here, being requested), so `stopped` is expected between its stop and
/// its start, and `started` may still be the run from before the action.
fn verdict(state: MachineState, new_events: &[&MachineEvent]) -> Verdict {
    let launched = new_events.iter().any(|e| e.kind == "start");
    let exits: Vec<&ExitEvent> = new_events
        .iter()
        .filter(|e| e.kind == "exit")
        .filter_map(|e| e.request.as_ref()?.exit_event.as_ref())
        .filter(|x| !x.requested_stop)
        .collect();
    let exited = matches!(
        state,
        MachineState::Stopped
            | MachineState::Failed
            | MachineState::LaunchFailed
            | MachineState::Destroyed
            | MachineState::Destroying
    );
    let Some(exit) = exits.first() else {
        return match state {
            // Stopped by someone after the action started it.
            MachineState::Stopped if launched => Verdict::Failed(format!("it is {state}")),
            // Between the action's stop and its start.
            MachineState::Stopped => Verdict::Pending,
            _ if exited => Verdict::Failed(format!("it is {state}")),
            MachineState::Started if launched => Verdict::Running,
            _ => Verdict::Pending,
        };
    };
    let code = exit.exit_code;
    let restarting = exit.restarting || exits.len() > 1;
    if code == 0 && exit.error.is_none() && !restarting {
        return Verdict::Finished;
    }
    let mut reason = if let Some(err) = &exit.error {
        err.clone()
    } else if exit.oom_killed {
        "out of memory: killed by the kernel at the machine's memory limit".to_string()
    } else if exit.signal > 0 {
        format!("killed by signal {}", exit.signal)
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
async fn log_tail(api: &FlyClient, app: &str, id: &str) -> String {
    let Ok(resp) = api.logs(app, id, false).await else {
        return String::new();
    };
    let Ok(text) = resp.text().await else {
        return String::new();
    };
    // The log is JSON lines ({ts, stream, line}).
    let lines: Vec<String> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str::<LogLine>(l)
                .map(|j| j.line)
                .unwrap_or_else(|_| l.to_string())
        })
        .collect();
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

    fn show(&self, state: MachineState, new_events: &[&MachineEvent], elapsed: Duration) {
        if !self.on {
            return;
        }
        let doing = match new_events.first() {
            Some(e) if e.kind == "pull" => "image pulled, booting",
            _ if state == MachineState::Started => "started, checking that it stays up",
            _ if matches!(state, MachineState::Starting | MachineState::Created) => {
                "pulling its image or booting"
            }
            _ => state.as_str(),
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
    use serde_json::{json, Value};

    fn event(v: Value) -> MachineEvent {
        let mut v = v;
        for (k, d) in [
            ("id", json!("e")),
            ("source", json!("flyd")),
            ("timestamp", json!(0)),
            ("status", json!("")),
        ] {
            v.as_object_mut().unwrap().entry(k).or_insert(d);
        }
        serde_json::from_value(v).expect("an event")
    }

    fn exit(code: i64, restarting: bool, error: Option<&str>) -> MachineEvent {
        event(
            json!({"type": "exit", "status": "stopped", "request": {"exit_event": {
            "exit_code": code, "restarting": restarting, "requested_stop": false, "error": error,
            "exited_at": ""}}}),
        )
    }

    #[test]
    fn exits_after_the_action_are_failures_unless_the_job_just_finished() {
        use MachineState::*;
        let failed = |v: Verdict, what: &str| match v {
            Verdict::Failed(reason) => assert!(reason.contains(what), "{reason}"),
            other => panic!("{other:?}, expected a failure saying {what:?}"),
        };
        let start = event(json!({"type": "start", "status": "started"}));
        assert_eq!(verdict(Starting, &[]), Verdict::Pending);
        assert_eq!(verdict(Started, &[&start]), Verdict::Running);
        let e3 = exit(3, true, None);
        failed(verdict(Started, &[&e3, &start]), "exited with code 3");
        let pull = exit(-1, false, Some("pulling x: no such host"));
        failed(verdict(Failed, &[&pull]), "no such host");
        let done = exit(0, false, None);
        assert_eq!(verdict(Stopped, &[&done, &start]), Verdict::Finished);
        let again = exit(0, true, None);
        failed(verdict(Started, &[&again, &start]), "exited with code 0");
        failed(verdict(Stopped, &[&start]), "stopped");
        let stop = event(json!({"type": "exit", "request": {"exit_event": {
            "exit_code": 143, "requested_stop": true, "exited_at": ""}}}));
        assert_eq!(verdict(Started, &[&start, &stop]), Verdict::Running);
    }

    #[test]
    fn a_restart_is_waited_for_through_its_own_stop_until_its_start() {
        use MachineState::*;
        // What `machine restart` polls, in order: the old run still shown, the transient
        // state, the stop (its exit requested, so left out), and only then the new start.
        let stop = event(
            json!({"type": "exit", "status": "stopped", "request": {"exit_event": {
            "exit_code": 143, "requested_stop": true, "exited_at": ""}}}),
        );
        let start = event(json!({"type": "start", "status": "started"}));
        assert_eq!(verdict(Started, &[]), Verdict::Pending);
        assert_eq!(verdict(Restarting, &[]), Verdict::Pending);
        assert_eq!(verdict(Stopped, &[&stop]), Verdict::Pending);
        assert_eq!(verdict(Stopped, &[]), Verdict::Pending);
        assert_eq!(verdict(Starting, &[&stop]), Verdict::Pending);
        assert_eq!(verdict(Started, &[&start, &stop]), Verdict::Running);
        // Stopped again after its start, with no exit of its own: someone stopped it.
        match verdict(Stopped, &[&stop, &start, &stop]) {
            Verdict::Failed(reason) => assert_eq!(reason, "it is stopped"),
            other => panic!("{other:?}"),
        }
        // A launch that fails says why, start event or not.
        let failed = exit(-1, false, Some("exec: no such file"));
        match verdict(Failed, &[&failed, &stop]) {
            Verdict::Failed(reason) => assert!(reason.contains("no such file"), "{reason}"),
            other => panic!("{other:?}"),
        }
        // A machine destroyed meanwhile is not waited for.
        assert!(matches!(verdict(Destroyed, &[&stop]), Verdict::Failed(_)));
    }
}
