//! Reads of this host's machines: the Machines API view of a record, lists, events,
//! versions, logs, placement records, and `wait` for a state.

use crate::agent::{Agent, Snapshot};
use crate::error::AgentError;
use crate::record::MachineRecord;
use crate::sync::lock;
use bazaar_types::config::MachineConfig;
use bazaar_types::event::MachineEvent;
use bazaar_types::host::WaitResponse;
use bazaar_types::machine::Machine;
use bazaar_types::state::MachineState;
use bazaar_types::{ids, now_ms, rfc3339};
use std::time::Duration;

impl Agent {
    /// One machine (tombstones included), with its latest events.
    pub async fn machine(&self, id: &str) -> Result<Machine, AgentError> {
        let rec = self.record_of(id)?;
        let events = self.0.store.events(id, 20)?;
        Ok(self.view(&rec, events))
    }

    /// Machines on this host, optionally of one app.
    pub async fn machines(
        &self,
        app: Option<&str>,
        include_deleted: bool,
    ) -> Result<Vec<Machine>, AgentError> {
        let mut out: Vec<Machine> = self
            .0
            .store
            .machines()?
            .into_iter()
            .filter(|m| app.is_none_or(|a| m.app == a))
            .filter(|m| include_deleted || m.state != MachineState::Destroyed)
            .map(|m| self.view(&m, Vec::new()))
            .collect();
        out.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        Ok(out)
    }

    /// A machine's events, newest first.
    pub async fn events(&self, id: &str, limit: usize) -> Result<Vec<MachineEvent>, AgentError> {
        self.machine(id).await?;
        Ok(self.0.store.events(id, limit)?)
    }

    /// A machine's config versions, newest first.
    pub async fn versions(&self, id: &str) -> Result<Vec<(String, MachineConfig)>, AgentError> {
        self.machine(id).await?;
        let mut v = self.0.store.versions(id)?;
        v.reverse();
        Ok(v)
    }

    /// The tail of a machine's log (JSON lines), at most `max_bytes`.
    pub async fn log_tail(&self, id: &str, max_bytes: u64) -> Result<String, AgentError> {
        self.machine(id).await?;
        let path = self.0.driver.log_path(id);
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
    pub async fn wait(
        &self,
        id: &str,
        states: &[MachineState],
        timeout: Duration,
        instance_id: Option<&str>,
        from_event_id: Option<&str>,
    ) -> Result<WaitResponse, AgentError> {
        let rec = self.record_of(id)?;
        let rx = lock(&self.0.live).get(id).map(|tx| tx.subscribe());
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
        let result = tokio::time::timeout(timeout, rx.wait_for(|s| matches(s))).await;
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

    /// The state clients see: the running operation's state, else the recorded one.
    /// The stored record of machine `id` (tombstones included), or not found.
    fn record_of(&self, id: &str) -> Result<MachineRecord, AgentError> {
        if !ids::is_valid_machine_id(id) {
            return Err(AgentError::MachineNotFound(id.into()));
        }
        self.0
            .store
            .machine(id)?
            .ok_or_else(|| AgentError::MachineNotFound(id.into()))
    }

    pub(crate) fn current_state(&self, rec: &MachineRecord) -> MachineState {
        if rec.state == MachineState::Destroyed {
            return rec.state;
        }
        lock(&self.0.transient)
            .get(&rec.id)
            .copied()
            .unwrap_or(rec.state)
    }

    /// Shows a record as the API's machine object.
    pub(crate) fn view(&self, rec: &MachineRecord, events: Vec<MachineEvent>) -> Machine {
        let live_run = rec.run.filter(|r| r.run_id > rec.exit_handled_run);
        Machine {
            id: rec.id.clone(),
            name: rec.name.clone(),
            state: self.current_state(rec),
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
                .0
                .checks
                .of(&rec.id)
                .filter(|_| self.current_state(rec) == MachineState::Started)
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
            host_id: self.0.host_id.clone(),
            app: rec.app.clone(),
            host_ports: rec.host_ports.clone(),
            pid: live_run.map(|r| r.workload_pid),
            lease: rec
                .lease
                .as_ref()
                .filter(|l| l.expires_at * 1000 > now_ms())
                .map(Into::into),
            image_ref: (rec.config.driver() == "oci")
                .then(|| {
                    rec.image_ref
                        .clone()
                        .or_else(|| crate::oci::configured_image_ref(&rec.config.image))
                })
                .flatten(),
            incomplete_config: false,
        }
    }
}

fn join_states(states: &[MachineState]) -> String {
    states
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(" or ")
}
