//! Reads of this host's machines: the Machines API view of a record, lists, events,
//! versions, logs, placement records, and `wait` for a state: methods of `Reader`, the
//! parts of the agent they read, to which the agent's own read methods delegate.

use crate::checks::CheckResults;
use crate::clock::Clock;
use crate::driver::Driver;
use crate::error::AgentError;
use crate::record::MachineRecord;
use crate::store::Store;
use crate::sync::lock;
use bazaar_types::config::MachineConfig;
use bazaar_types::event::MachineEvent;
use bazaar_types::host::WaitResponse;
use bazaar_types::machine::Machine;
use bazaar_types::state::MachineState;
use bazaar_types::{ids, rfc3339};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::watch;

/// A machine's live state, published to waiters.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub state: MachineState,
    pub instance_id: String,
    /// The newest event's id and the status it recorded.
    pub event_id: String,
    pub event_status: String,
}

/// What the reads need of the agent's parts (`Agent::reader` lends them); a change is
/// published through it too ([`Reader::publish`]: the live state and the catalog row).
pub(crate) struct Reader<'a> {
    pub store: &'a Store,
    pub live: &'a Mutex<HashMap<String, watch::Sender<Snapshot>>>,
    pub transient: &'a Mutex<HashMap<String, MachineState>>,
    pub checks: &'a CheckResults,
    pub driver: &'a Driver,
    pub host_id: &'a str,
    pub clock: Clock,
    /// The catalog, once attached, and the address process machines' host ports are on.
    pub catalog: Option<&'a bazaar_catalog::Catalog>,
    pub api_ip: std::net::IpAddr,
}

/// Longest wait a client may ask for (Fly's limit).
pub const MAX_WAIT: Duration = Duration::from_secs(60);

/// What `GET .../wait` waits for, read from its query: `state` repeated or comma-separated
/// (`settled`: any resting state; default `started`), `timeout` in seconds or a Go duration
/// (default and at most 60 s), `version` (or `instance_id`) a config version, and
/// `from_event_id` an event id. A value that cannot be one of these is a 400, never a wait
/// that can only time out.
#[derive(Debug, Clone, PartialEq)]
pub struct WaitQuery {
    pub states: Vec<MachineState>,
    pub timeout: Duration,
    pub version: Option<String>,
    pub from_event_id: Option<String>,
}

impl WaitQuery {
    /// Reads the query's `(name, value)` pairs; unknown names are ignored.
    pub fn parse(params: &[(String, String)]) -> Result<WaitQuery, AgentError> {
        let mut q = WaitQuery {
            states: Vec::new(),
            timeout: MAX_WAIT,
            version: None,
            from_event_id: None,
        };
        for (k, v) in params {
            match k.as_str() {
                "state" => {
                    for s in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                        if s == "settled" {
                            q.states.extend([
                                MachineState::Created,
                                MachineState::Started,
                                MachineState::Stopped,
                                MachineState::Suspended,
                                MachineState::Failed,
                                MachineState::Destroyed,
                            ]);
                        } else {
                            q.states.push(MachineState::parse(s).ok_or_else(|| {
                                AgentError::Invalid(format!("invalid state {s:?} to wait for"))
                            })?);
                        }
                    }
                }
                "timeout" => {
                    q.timeout = bazaar_types::duration::parse_go_duration(v)
                        .map_err(|e| AgentError::Invalid(format!("invalid timeout: {e}")))?;
                    if q.timeout > MAX_WAIT {
                        return Err(AgentError::Invalid(format!(
                            "timeout {v:?} is too long: a wait lasts at most {} seconds (wait again to wait longer)",
                            MAX_WAIT.as_secs()
                        )));
                    }
                }
                "instance_id" | "version" => {
                    if !ids::is_valid_instance_id(v) {
                        return Err(AgentError::Invalid(format!(
                            "{k} {v:?} is not a machine version (a 26-character ULID, the machine's instance_id)"
                        )));
                    }
                    q.version = Some(v.clone());
                }
                "from_event_id" => {
                    if !bazaar_types::event::is_valid_event_id(v) {
                        return Err(AgentError::Invalid(format!(
                            "from_event_id {v:?} is not an event id (a ULID from the machine's events)"
                        )));
                    }
                    q.from_event_id = Some(v.clone());
                }
                _ => {}
            }
        }
        if q.states.is_empty() {
            q.states.push(MachineState::Started);
        }
        Ok(q)
    }
}

impl Reader<'_> {
    /// One machine (tombstones included), with its latest events, as it was at one moment.
    /// An operation's step commits its events, then the in-memory record shows the step,
    /// then (after its last step) the operation's transient state is cleared; read in the
    /// reverse order (the transient state, the record, the record's own events), what is
    /// shown existed at once. Read in that order, a restart could be shown `stopped` (the
    /// record before its launch, no transient state any more) beside its new `start` event,
    /// which `bazaar machine restart` took for a machine stopped after its start.
    pub(crate) async fn machine(&self, id: &str) -> Result<Machine, AgentError> {
        let transient = lock(self.transient).get(id).copied();
        let rec = self.record_of(id)?;
        let events = self.store.events_of(&rec, 20)?;
        Ok(self.view_as(shown_state(&rec, transient), &rec, events))
    }

    /// Machines on this host, optionally of one app.
    pub(crate) async fn machines(
        &self,
        app: Option<&str>,
        include_deleted: bool,
    ) -> Result<Vec<Machine>, AgentError> {
        // The transient states before the records, as in `machine`.
        let transient = lock(self.transient).clone();
        let mut out: Vec<Machine> = self
            .store
            .machines()?
            .into_iter()
            .filter(|m| app.is_none_or(|a| m.app == a))
            .filter(|m| include_deleted || m.state != MachineState::Destroyed)
            .map(|m| {
                let state = shown_state(&m, transient.get(&m.id).copied());
                self.view_as(state, &m, Vec::new())
            })
            .collect();
        out.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        Ok(out)
    }

    /// A machine's events, newest first.
    pub(crate) async fn events(
        &self,
        id: &str,
        limit: usize,
    ) -> Result<Vec<MachineEvent>, AgentError> {
        self.machine(id).await?;
        Ok(self.store.events(id, limit)?)
    }

    /// A machine's config versions, newest first.
    pub(crate) async fn versions(
        &self,
        id: &str,
    ) -> Result<Vec<(String, MachineConfig)>, AgentError> {
        self.machine(id).await?;
        let mut v = self.store.versions(id)?;
        v.reverse();
        Ok(v)
    }

    /// The tail of a machine's log (JSON lines), at most `max_bytes`.
    pub(crate) async fn log_tail(&self, id: &str, max_bytes: u64) -> Result<String, AgentError> {
        self.machine(id).await?;
        let path = self.driver.log_path(id);
        let data = match std::fs::read(&path) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(AgentError::Internal(e.to_string())),
        };
        let start = data.len().saturating_sub(max_bytes as usize);
        let text = String::from_utf8_lossy(&data[start..]);
        // Do not start in the middle of a line.
        let text = if start > 0 {
            text.split_once('\n').map(|(_, t)| t).unwrap_or("")
        } else {
            &text
        };
        Ok(text.to_string())
    }

    /// Waits until the machine is in one of `states` (and at `instance_id`, if given; and,
    /// with `from_event_id`, put in that state by an event newer than that one: the newest
    /// event must have recorded the state, so an `update` event alone does not satisfy a
    /// wait for `started`). Answers the newest event's id.
    pub(crate) async fn wait(
        &self,
        id: &str,
        states: &[MachineState],
        timeout: Duration,
        instance_id: Option<&str>,
        from_event_id: Option<&str>,
    ) -> Result<WaitResponse, AgentError> {
        let rec = self.record_of(id)?;
        let rx = lock(self.live).get(id).map(|tx| tx.subscribe());
        let matches = |s: &Snapshot| {
            let state_ok = states.contains(&s.state);
            state_ok
                && instance_id.is_none_or(|v| v == s.instance_id)
                && from_event_id
                    .is_none_or(|e| s.event_id.as_str() > e && s.event_status == s.state.as_str())
        };
        let Some(mut rx) = rx else {
            // A tombstone: it only ever is destroyed.
            let snap = Snapshot {
                state: self.current_state(&rec),
                instance_id: rec.instance_id.clone(),
                event_id: rec.last_event_id.clone(),
                event_status: rec.last_event_status.clone(),
            };
            if matches(&snap) {
                return Ok(WaitResponse {
                    ok: true,
                    state: snap.state.to_string(),
                    version: snap.instance_id,
                    event_id: snap.event_id,
                });
            }
            return Err(AgentError::WaitTimeout {
                id: id.into(),
                states: join_states(states),
            });
        };
        // A launch that fails while we wait for another state (or after `from_event_id`)
        // ends the wait with the failure's status (507 for a full disk, 404 for a missing
        // image, ...), not a timeout; a machine that failed before is waited on as before.
        let waits_for_failed = states.contains(&MachineState::Failed);
        let since = match from_event_id {
            Some(e) => e.to_string(),
            None => rx.borrow().event_id.clone(),
        };
        let failed_now = |s: &Snapshot| {
            !waits_for_failed && s.state == MachineState::Failed && s.event_id > since
        };
        let result =
            tokio::time::timeout(timeout, rx.wait_for(|s| matches(s) || failed_now(s))).await;
        if let Ok(Ok(snap)) = &result {
            if !matches(snap) {
                return Err(self.launch_failure(id));
            }
        }
        match result {
            Ok(Ok(snap)) => Ok(WaitResponse {
                ok: true,
                state: snap.state.to_string(),
                version: snap.instance_id.clone(),
                event_id: snap.event_id.clone(),
            }),
            _ => Err(AgentError::WaitTimeout {
                id: id.into(),
                states: join_states(states),
            }),
        }
    }

    /// Why machine `id`'s last launch failed, from its newest `exit` event.
    fn launch_failure(&self, id: &str) -> AgentError {
        let events = self.store.events(id, 16).unwrap_or_default();
        let exit = events.into_iter().find(|e| e.kind == "exit");
        let request = exit.and_then(|e| e.request).unwrap_or_default();
        let message = request
            .exit_event
            .and_then(|x| x.error)
            .unwrap_or_else(|| "the machine failed".into());
        AgentError::LaunchFailed {
            id: id.into(),
            message,
            failure: request.failure,
        }
    }

    /// The stored record of machine `id` (tombstones included), or not found.
    fn record_of(&self, id: &str) -> Result<MachineRecord, AgentError> {
        if !ids::is_valid_machine_id(id) {
            return Err(AgentError::MachineNotFound(id.into()));
        }
        self.store
            .machine(id)?
            .ok_or_else(|| AgentError::MachineNotFound(id.into()))
    }

    /// The state clients see: the running operation's state, else the recorded one.
    pub(crate) fn current_state(&self, rec: &MachineRecord) -> MachineState {
        shown_state(rec, lock(self.transient).get(&rec.id).copied())
    }

    /// Shows a record as the API's machine object.
    pub(crate) fn view(&self, rec: &MachineRecord, events: Vec<MachineEvent>) -> Machine {
        self.view_as(self.current_state(rec), rec, events)
    }

    /// Shows a record as the API's machine object in `state` (its [`shown_state`]).
    fn view_as(
        &self,
        state: MachineState,
        rec: &MachineRecord,
        events: Vec<MachineEvent>,
    ) -> Machine {
        let live_run = rec.run.filter(|r| r.run_id > rec.exit_handled_run);
        Machine {
            id: rec.id.clone(),
            name: rec.name.clone(),
            state,
            region: rec.region.clone(),
            instance_id: rec.instance_id.clone(),
            version: rec.instance_id.clone(),
            private_ip: rec
                .private_ip
                .map(|ip| ip.to_string())
                .unwrap_or_else(|| "127.0.0.1".into()),
            created_at: rfc3339(rec.created_at_ms),
            updated_at: rfc3339(rec.updated_at_ms),
            config: rec.config.clone(),
            events,
            checks: self
                .checks
                .of(&rec.id)
                .filter(|_| state == MachineState::Started)
                .map(|list| {
                    list.iter()
                        .map(|c| {
                            serde_json::json!({
                                "name": c.name,
                                "status": c.status,
                                "output": c.output,
                                "updated_at": rfc3339(c.updated_at_ms),
                            })
                        })
                        .collect()
                })
                .unwrap_or_default(),
            host_status: "ok".into(),
            cordoned: rec.cordoned,
            nonce: None,
            host_id: self.host_id.to_string(),
            app: rec.app.clone(),
            host_ports: rec.host_ports.clone(),
            pid: live_run.map(|r| r.workload_pid),
            lease: rec
                .lease
                .as_ref()
                .filter(|l| l.expires_at * 1000 > self.clock.now_ms())
                .map(Into::into),
            image_ref: rec
                .config
                .runs_image()
                .then(|| {
                    rec.image_ref
                        .clone()
                        .or_else(|| crate::oci::configured_image_ref(&rec.config.image))
                })
                .flatten(),
            incomplete_config: false,
        }
    }

    /// Publishes a machine's state to waiters and to the catalog.
    pub(crate) fn publish(&self, rec: &MachineRecord) {
        if let Some(catalog) = self.catalog {
            if rec.state == MachineState::Destroyed {
                catalog.delete_machine(&rec.id);
            } else {
                catalog.publish_machine(self.catalog_row(rec));
            }
        }
        let snap = Snapshot {
            state: self.current_state(rec),
            instance_id: rec.instance_id.clone(),
            event_id: rec.last_event_id.clone(),
            event_status: rec.last_event_status.clone(),
        };
        let mut live = lock(self.live);
        match live.get(&rec.id) {
            Some(tx) => {
                tx.send_if_modified(|s| {
                    if *s != snap {
                        *s = snap.clone();
                        true
                    } else {
                        false
                    }
                });
            }
            None => {
                live.insert(rec.id.clone(), watch::channel(snap).0);
            }
        }
    }

    /// The catalog row of a machine.
    fn catalog_row(&self, rec: &MachineRecord) -> bazaar_catalog::MachineRecord {
        // A process machine's services listen on host ports on loopback; an image
        // machine's on its own address.
        let services = rec
            .config
            .services
            .iter()
            .filter_map(|svc| {
                let (address, port) = match rec.private_ip {
                    Some(ip) => (ip.to_string(), svc.internal_port),
                    None => (
                        self.api_ip.to_string(),
                        *rec.host_ports.get(&svc.internal_port)?,
                    ),
                };
                Some(bazaar_catalog::ServiceRecord {
                    service: svc.clone(),
                    address,
                    port,
                })
            })
            .collect();
        // A displaced machine that will be re-placed elsewhere says so, with its config.
        let displaced_by = rec
            .preempted_by
            .clone()
            .filter(|_| rec.displaced_running && self.current_state(rec) == MachineState::Stopped)
            .filter(|_| bazaar_types::replacement::re_placed_when_displaced(&rec.config));
        bazaar_catalog::MachineRecord {
            id: rec.id.clone(),
            app: rec.app.clone(),
            app_id: rec.app_id.clone(),
            name: rec.name.clone(),
            region: rec.region.clone(),
            host_id: self.host_id.to_string(),
            state: self.current_state(rec).to_string(),
            instance_id: rec.instance_id.clone(),
            private_ip: rec.private_ip.map(|ip| ip.to_string()),
            services,
            checks: if self.current_state(rec) == MachineState::Started {
                self.checks.of(&rec.id).unwrap_or_default()
            } else {
                Vec::new()
            },
            cordoned: rec.cordoned,
            metadata: rec.config.metadata.clone(),
            updated_at_ms: rec.updated_at_ms,
            epoch: rec.epoch,
            resources: rec.resources,
            config: (bazaar_types::replacement::carries_config(&rec.config.metadata)
                || displaced_by.is_some())
            .then(|| Box::new(rec.config.clone())),
            displaced_by,
        }
    }
}

/// The state clients see of `rec`: the running operation's (`transient`), else the recorded one.
fn shown_state(rec: &MachineRecord, transient: Option<MachineState>) -> MachineState {
    match rec.state {
        MachineState::Destroyed => rec.state,
        recorded => transient.unwrap_or(recorded),
    }
}

fn join_states(states: &[MachineState]) -> String {
    states
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(" or ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(query: &[(&str, &str)]) -> Result<WaitQuery, String> {
        let params: Vec<(String, String)> = query
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        WaitQuery::parse(&params).map_err(|e| e.to_string())
    }

    #[test]
    fn a_wait_that_could_only_time_out_is_refused() {
        let q = parse(&[]).unwrap();
        assert_eq!(
            (q.states, q.timeout),
            (vec![MachineState::Started], MAX_WAIT)
        );
        let version = ids::new_instance_id();
        let q = parse(&[
            ("state", "stopped,destroyed"),
            ("timeout", "60"),
            ("version", &version),
        ])
        .unwrap();
        assert_eq!(q.states, [MachineState::Stopped, MachineState::Destroyed]);
        assert_eq!(q.version.as_deref(), Some(version.as_str()));
        assert_eq!(parse(&[("timeout", "1m")]).unwrap().timeout, MAX_WAIT);
        for (k, v, says) in [
            ("timeout", "61", "at most 60 seconds"),
            ("timeout", "2m", "at most 60 seconds"),
            ("timeout", "soon", "invalid timeout"),
            ("version", "zzz", "not a machine version"),
            (
                "instance_id",
                "01ARZ3NDEKTSV4RRFFQ69G5FA",
                "not a machine version",
            ),
            ("state", "running", "invalid state"),
            ("from_event_id", "x", "not an event id"),
        ] {
            let err = parse(&[(k, v)]).unwrap_err();
            assert!(err.contains(says), "{k}={v}: {err}");
        }
    }
}
