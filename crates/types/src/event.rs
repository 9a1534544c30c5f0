//! Machine events, newest first in responses, as Fly reports them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One thing that happened to a machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MachineEvent {
    pub id: String,
    /// `launch`, `start`, `stop`, `exit`, `restart`, `update`, `destroy`, `suspend`, ...
    #[serde(rename = "type")]
    pub kind: String,
    /// The state the event left the machine in (or a status word such as `created`).
    pub status: String,
    /// `user` for requested changes, `flyd` for the agent's own decisions (Fly's spelling).
    pub source: String,
    /// Milliseconds since the epoch.
    pub timestamp: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<EventRequest>,
}

/// Details of an event.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct EventRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_event: Option<ExitEvent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_count: Option<u32>,
    /// bazaar extension: a human-readable reason (`restart policy on-failure`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// How a machine's process ended.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ExitEvent {
    pub exit_code: i32,
    #[serde(default)]
    pub signal: i32,
    #[serde(default)]
    pub oom_killed: bool,
    #[serde(default)]
    pub requested_stop: bool,
    #[serde(default)]
    pub restarting: bool,
    /// RFC 3339.
    pub exited_at: String,
    /// bazaar extension: why the process could not run (command not found, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl MachineEvent {
    /// A new event happening now.
    pub fn new(kind: &str, status: &str, source: &str) -> MachineEvent {
        MachineEvent {
            id: ulid::Ulid::new().to_string(),
            kind: kind.into(),
            status: status.into(),
            source: source.into(),
            timestamp: crate::now_ms(),
            request: None,
        }
    }

    /// Adds a reason.
    pub fn with_reason(mut self, reason: impl Into<String>) -> MachineEvent {
        self.request.get_or_insert_with(Default::default).reason = Some(reason.into());
        self
    }
}
