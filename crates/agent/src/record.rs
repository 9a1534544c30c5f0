//! What the agent persists about each machine and each operation. These are the durable
//! truth of the host; everything else (the ledger, the catalog rows to come) derives from
//! them.

use bazaar_types::config::MachineConfig;
use bazaar_types::host::Resources;
use bazaar_types::signal::Signal;
use bazaar_types::state::{Action, MachineState};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One machine, as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MachineRecord {
    pub id: String,
    pub name: String,
    pub app: String,
    /// The id of the app the machine was created in (`ClaimRequest::app_id`); empty for
    /// machines made before apps had ids on machines.
    #[serde(default)]
    pub app_id: String,
    pub region: String,
    /// The state the machine is in (settled, or the state of a half-done operation).
    pub state: MachineState,
    /// The state the machine will be in once every queued operation has run; new
    /// operations are validated against it.
    pub desired: MachineState,
    pub instance_id: String,
    pub config: MachineConfig,
    pub resources: Resources,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    #[serde(default)]
    pub cordoned: bool,
    /// Host port for each service `internal_port` (process driver).
    #[serde(default)]
    pub host_ports: BTreeMap<u16, u16>,
    /// The machine's own address on the host's machine network (image machines); its
    /// services are reached at `private_ip:internal_port`.
    #[serde(default)]
    pub private_ip: Option<std::net::Ipv4Addr>,
    /// The uid (and gid) a process machine runs as on a root agent (`identity.rs`).
    #[serde(default)]
    pub uid: Option<u32>,
    /// The first host id of the machine's user namespace range (image machines; its ids
    /// `0..65536` are host ids `uid_base..`, [`crate::idranges`]).
    #[serde(default)]
    pub uid_base: Option<u32>,
    /// The current (or last) run of the workload.
    #[serde(default)]
    pub run: Option<RunInfo>,
    /// Run ids are allocated when an operation that launches is accepted.
    pub next_run_id: u64,
    /// The last run whose exit has been recorded (so an exit is handled exactly once).
    #[serde(default)]
    pub exit_handled_run: u64,
    /// Times (ms) of restarts done by the restart policy, for the retry window.
    #[serde(default)]
    pub policy_restarts: Vec<u64>,
    /// Total restarts by policy.
    #[serde(default)]
    pub restart_count: u32,
    /// A run stopped because the host shut down: relaunch it when the host comes back.
    #[serde(default)]
    pub host_shutdown_run: Option<u64>,
    /// Next event sequence number.
    pub next_event_seq: u64,
    /// The id of the newest event (ids increase) and the status it left the machine in.
    #[serde(default)]
    pub last_event_id: String,
    #[serde(default)]
    pub last_event_status: String,
    /// When the machine was destroyed (tombstone).
    #[serde(default)]
    pub destroyed_at_ms: Option<u64>,
    /// The lease, if one was taken (it may have expired).
    #[serde(default)]
    pub lease: Option<bazaar_types::machine::Lease>,
    /// The image an image machine's last launch resolved.
    #[serde(default)]
    pub image_ref: Option<bazaar_types::machine::ImageRef>,
    /// The ownership epoch (0, or above the copy this one re-placed; `fence.rs`).
    #[serde(default)]
    pub epoch: u64,
    /// Stopped by preemption for this machine (`preempt.rs`): the machine holds no
    /// commitment in the ledger until it starts again, which commits it first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempted_by: Option<String>,
    // How the exchange placed the machine is stored apart (`Store::placement`).
}

impl MachineRecord {
    /// The machine as the runtime sees it (what a launch or an exec needs).
    pub fn workload(&self) -> bazaar_runtime::Workload<'_> {
        bazaar_runtime::Workload {
            id: &self.id,
            app: &self.app,
            region: &self.region,
            instance_id: &self.instance_id,
            config: &self.config,
            resources: &self.resources,
            host_ports: &self.host_ports,
            private_ip: self.private_ip,
            uid: self.uid,
            uid_base: self.uid_base,
        }
    }

    /// The actor read `before`, worked on it into `self`, and the stored record is now
    /// `stored`: takes from `stored` what the accept side changed meanwhile (it owns the
    /// config and version, name, resources, ports, cordon, lease and, when a new
    /// operation was queued, the desired state and run ids), keeping the actor's own
    /// fields (state, run, exits, restarts). Events are renumbered by the caller.
    pub fn merge_accepted(&mut self, before: &MachineRecord, stored: &MachineRecord) {
        if stored.instance_id != before.instance_id || stored.config != before.config {
            self.config = stored.config.clone();
            self.instance_id = stored.instance_id.clone();
        }
        if stored.preempted_by != before.preempted_by {
            self.preempted_by = stored.preempted_by.clone();
        }
        if stored.resources != before.resources {
            self.resources = stored.resources;
        }
        if stored.host_ports != before.host_ports {
            self.host_ports = stored.host_ports.clone();
        }
        if stored.private_ip != before.private_ip {
            self.private_ip = stored.private_ip;
        }
        if stored.name != before.name {
            self.name = stored.name.clone();
        }
        if stored.uid != before.uid {
            self.uid = stored.uid;
        }
        if stored.uid_base != before.uid_base {
            self.uid_base = stored.uid_base;
        }
        if stored.cordoned != before.cordoned {
            self.cordoned = stored.cordoned;
        }
        if stored.lease != before.lease {
            self.lease = stored.lease.clone();
        }
        if stored.desired != before.desired {
            self.desired = stored.desired;
        }
        self.next_run_id = self.next_run_id.max(stored.next_run_id);
        self.next_event_seq += stored.next_event_seq.saturating_sub(before.next_event_seq);
        if stored.last_event_id > self.last_event_id {
            self.last_event_id = stored.last_event_id.clone();
            self.last_event_status = stored.last_event_status.clone();
        }
        self.updated_at_ms = self.updated_at_ms.max(stored.updated_at_ms);
    }
}

/// A run of the workload: one shim, one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunInfo {
    pub run_id: u64,
    pub shim_pid: i32,
    pub workload_pid: i32,
    pub started_at_ms: u64,
}

/// An operation on a machine: a named sequence of steps, recorded as it goes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Operation {
    /// Host-wide, increasing: operations of one machine run in this order.
    pub id: u64,
    pub machine_id: String,
    pub kind: OpKind,
    /// Number of steps completed (and recorded).
    pub steps_done: u32,
    /// The run this operation launches, if it launches one.
    #[serde(default)]
    pub run_id: Option<u64>,
    /// Do not begin before this time (restart backoff).
    #[serde(default)]
    pub not_before_ms: u64,
    /// `user` or `flyd` (Fly's name for the host agent).
    pub source: String,
    pub created_at_ms: u64,
}

/// What an operation does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum OpKind {
    Create {
        skip_launch: bool,
    },
    Start,
    Stop {
        signal: i32,
        timeout_ms: u64,
    },
    Restart {
        signal: i32,
        timeout_ms: u64,
    },
    Update {
        skip_launch: bool,
        previous_instance_id: String,
    },
    Destroy {
        force: bool,
    },
    /// Freeze the workload (cgroup freezer); `Start` thaws it.
    Suspend,
    /// Started by the restart policy after an exit.
    PolicyRestart,
    /// Relaunch after the host came back from a shutdown.
    Relaunch,
}

/// The steps operations are made of. Each is idempotent: running it again after a crash
/// (before its completion was recorded) has the same outcome as running it once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Start the run `op.run_id` unless it is already alive (adopt) or already over.
    Launch,
    /// Send the stop signal (or SIGKILL) to the current run, if alive.
    Signal,
    /// Wait for the current run to end (SIGKILL after the timeout); record its exit.
    AwaitExit,
    /// Free resources and files; the machine becomes a tombstone.
    Release,
    /// Freeze every process of the current run.
    Freeze,
}

impl Step {
    /// The step's name, for logs and fault injection.
    pub fn name(self) -> &'static str {
        match self {
            Step::Launch => "launch",
            Step::Signal => "signal",
            Step::AwaitExit => "await_exit",
            Step::Release => "release",
            Step::Freeze => "freeze",
        }
    }
}

impl OpKind {
    /// The operation's name (`create`, `stop`, ...), for logs, events and fault injection.
    pub fn name(&self) -> &'static str {
        match self {
            OpKind::Create { .. } => "create",
            OpKind::Start => "start",
            OpKind::Stop { .. } => "stop",
            OpKind::Restart { .. } => "restart",
            OpKind::Update { .. } => "update",
            OpKind::Destroy { .. } => "destroy",
            OpKind::Suspend => "suspend",
            OpKind::PolicyRestart => "policy_restart",
            OpKind::Relaunch => "relaunch",
        }
    }

    /// The ordered steps of this kind of operation.
    pub fn steps(&self) -> &'static [Step] {
        use Step::*;
        match self {
            OpKind::Create { skip_launch: true } => &[],
            OpKind::Create { skip_launch: false } => &[Launch],
            OpKind::Start | OpKind::PolicyRestart | OpKind::Relaunch => &[Launch],
            OpKind::Stop { .. } => &[Signal, AwaitExit],
            OpKind::Restart { .. } => &[Signal, AwaitExit, Launch],
            OpKind::Update {
                skip_launch: true, ..
            } => &[Signal, AwaitExit],
            OpKind::Update {
                skip_launch: false, ..
            } => &[Signal, AwaitExit, Launch],
            OpKind::Destroy { .. } => &[Signal, AwaitExit, Release],
            OpKind::Suspend => &[Freeze],
        }
    }

    /// True if the operation launches a new run.
    pub fn launches(&self) -> bool {
        self.steps().contains(&Step::Launch)
    }

    /// The state shown while the operation runs.
    pub fn transient_state(&self) -> MachineState {
        match self {
            OpKind::Create { .. } | OpKind::Start | OpKind::PolicyRestart | OpKind::Relaunch => {
                MachineState::Starting
            }
            OpKind::Stop { .. } => MachineState::Stopping,
            OpKind::Restart { .. } => MachineState::Restarting,
            OpKind::Update { .. } => MachineState::Updating,
            OpKind::Destroy { .. } => MachineState::Destroying,
            OpKind::Suspend => MachineState::Suspending,
        }
    }

    /// The API action this operation performs, for transition checks.
    pub fn action(&self) -> Action {
        match self {
            OpKind::Create { .. } => Action::Create,
            OpKind::Start | OpKind::PolicyRestart | OpKind::Relaunch => Action::Start,
            OpKind::Stop { .. } => Action::Stop,
            OpKind::Restart { .. } => Action::Restart,
            OpKind::Update { .. } => Action::Update,
            OpKind::Destroy { force: false } => Action::Destroy,
            OpKind::Destroy { force: true } => Action::ForceDestroy,
            OpKind::Suspend => Action::Suspend,
        }
    }

    /// The stop signal and timeout for operations that stop the workload.
    pub fn stop_params(&self, config: &MachineConfig) -> (Signal, std::time::Duration) {
        let (default_signal, default_timeout) = config.stop_signal_and_timeout();
        match self {
            OpKind::Stop { signal, timeout_ms } | OpKind::Restart { signal, timeout_ms } => (
                Signal(*signal),
                std::time::Duration::from_millis(*timeout_ms),
            ),
            OpKind::Destroy { force: true } => (Signal::KILL, std::time::Duration::from_secs(5)),
            _ => (default_signal, default_timeout),
        }
    }
}
