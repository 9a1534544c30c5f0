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
    /// bazaar extension: a launch that failed says of what kind, at which step, and
    /// whether trying again may succeed (`bazaar_types::failure`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<crate::failure::Failure>,
    /// bazaar extension: where a start's time went, step by step in the order they ran
    /// (`bazaar machine explain --timing`; `bazaar_runtime::timing` names the steps).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timing: Vec<StepTiming>,
}

/// One step of a launch and the milliseconds it took (from the end of the step before).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StepTiming {
    pub step: String,
    pub ms: f64,
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

/// A new event id: a ULID, strictly increasing within this process (so ids order events
/// even within one millisecond, and `wait?from_event_id=` can compare them).
pub fn next_event_id() -> String {
    static IDS: std::sync::Mutex<Option<ulid::Generator>> = std::sync::Mutex::new(None);
    let mut gen = IDS.lock().unwrap_or_else(|p| p.into_inner());
    gen.get_or_insert_with(ulid::Generator::new)
        .generate()
        .unwrap_or_else(|_| ulid::Ulid::new())
        .to_string()
}

/// True when `id` is an event id (a ULID in its canonical spelling).
pub fn is_valid_event_id(id: &str) -> bool {
    ulid::Ulid::from_string(id).is_ok_and(|u| u.to_string() == id)
}

impl MachineEvent {
    /// A new event happening now.
    pub fn new(kind: &str, status: &str, source: &str) -> MachineEvent {
        MachineEvent {
            id: next_event_id(),
            kind: kind.into(),
            status: status.into(),
            source: source.into(),
            timestamp: crate::now_ms(),
            request: None,
        }
    }

    /// Adds where a launch's time went.
    pub fn with_timing(mut self, timing: Vec<StepTiming>) -> MachineEvent {
        if !timing.is_empty() {
            self.request.get_or_insert_with(Default::default).timing = timing;
        }
        self
    }

    /// Adds a reason.
    pub fn with_reason(mut self, reason: impl Into<String>) -> MachineEvent {
        self.request.get_or_insert_with(Default::default).reason = Some(reason.into());
        self
    }
}
