//! What a fault run records, as plain data (no I/O): every call the workload made (client,
//! API node, operation, start and end, result), samples of every host's ledger and of
//! proxy requests, the fault itself (when, on which hosts), the pids of machines that must
//! survive it, and the state at the end (the owners' truth and each node's catalog).
//! [`crate::check`] judges a [`History`]; [`crate::faults`] fills one.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A call of the Machines API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// A create; `tag` is the machine's name, unique per call, so a machine found later
    /// tells which call made it (also when that call's answer was lost).
    Create {
        app: String,
        tag: String,
    },
    Update {
        app: String,
        id: String,
    },
    Stop {
        app: String,
        id: String,
    },
    Start {
        app: String,
        id: String,
    },
    Destroy {
        app: String,
        id: String,
    },
}

impl Op {
    /// The machine the call is about, when it names one.
    pub fn machine(&self) -> Option<&str> {
        match self {
            Op::Create { .. } => None,
            Op::Update { id, .. }
            | Op::Stop { id, .. }
            | Op::Start { id, .. }
            | Op::Destroy { id, .. } => Some(id),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Op::Create { .. } => "create",
            Op::Update { .. } => "update",
            Op::Stop { .. } => "stop",
            Op::Start { .. } => "start",
            Op::Destroy { .. } => "destroy",
        }
    }
}

/// How a call ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// Acknowledged (2xx); a create names the machine and its host.
    Ok {
        id: Option<String>,
        host_id: Option<String>,
    },
    /// Refused (4xx, or the request never left: connection refused): it did nothing.
    Failed { status: u16, error: String },
    /// Unknown (a timeout, a connection cut after the request was sent, a 5xx): it may or
    /// may not have taken effect.
    Indeterminate { why: String },
}

impl Outcome {
    pub fn is_ok(&self) -> bool {
        matches!(self, Outcome::Ok { .. })
    }
}

/// One call, from the client's side.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Call {
    pub client: usize,
    /// The lab host whose API was called (`h2`).
    pub node: String,
    #[serde(flatten)]
    pub op: Op,
    /// Milliseconds since the run started.
    pub start_ms: u64,
    pub end_ms: u64,
    #[serde(flatten)]
    pub outcome: Outcome,
}

impl std::fmt::Display for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match &self.op {
            Op::Create { app, tag } => format!("create {app}/{tag}"),
            other => format!("{} {}", other.name(), other.machine().unwrap_or_default()),
        };
        let result = match &self.outcome {
            Outcome::Ok { id, host_id } => format!(
                "ok {} {}",
                id.as_deref().unwrap_or(""),
                host_id
                    .as_deref()
                    .map(|h| format!("on {h}"))
                    .unwrap_or_default()
            ),
            Outcome::Failed { status, error } => format!("failed {status} {error}"),
            Outcome::Indeterminate { why } => format!("indeterminate ({why})"),
        };
        write!(
            f,
            "[{:>6}..{:>6} ms] client {} via {}: {what} -> {}",
            self.start_ms,
            self.end_ms,
            self.client,
            self.node,
            result.trim_end()
        )
    }
}

/// CPUs and memory, as a ledger counts them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    pub cpus: u32,
    pub memory_mb: u64,
}

/// One host's ledger at one moment (`GET /host/v1/ledger`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerSample {
    pub at_ms: u64,
    /// The lab host (`h1`).
    pub host: String,
    pub capacity: Resources,
    /// By machine id.
    pub committed: BTreeMap<String, Resources>,
    pub reserved: Resources,
    /// Machines of `committed` in the reclaimed pool (a host with `[reclaim]`): not held
    /// against capacity by requests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub batch: Vec<String>,
    /// The reclaimed pool's services' reservations + batch machines + open batch bids, in
    /// millicpus and MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_held: Option<(u64, u64)>,
    /// Machines the host keeps that hold nothing: displaced by preemption or reclamation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub displaced: Vec<String>,
}

/// One request through a host's proxy to the app that always has a machine on every host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxySample {
    pub at_ms: u64,
    /// The host whose proxy was asked.
    pub proxy: String,
    /// The status, `None` when nothing came back.
    pub status: Option<u16>,
}

/// The fault of a run and its timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultRecord {
    /// `partition`, `oneway-partition`, `loss`, `freeze`, `kill`, `crash`, `restart`,
    /// `upgrade`, `fill-disk`.
    pub kind: String,
    /// The hosts on each side of a partition (empty for other faults).
    pub sides: Vec<Vec<String>>,
    /// Hosts whose own API and proxy are not expected to answer during the fault (down,
    /// frozen, restarting, losing packets).
    pub impaired: Vec<String>,
    pub injected_ms: u64,
    /// When every side of a partition saw the other side gone (from then on each side
    /// must place on its own hosts); `None` for other faults, or if that never happened.
    pub split_seen_ms: Option<u64>,
    pub healed_ms: u64,
}

/// A machine as its owner or a catalog shows it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MachineView {
    pub id: String,
    pub name: String,
    pub app: String,
    pub host_id: String,
    pub state: String,
}

/// A machine whose workload must outlive the fault: its pids before and after.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PidWatch {
    pub machine: String,
    pub host: String,
    pub before: Vec<u32>,
    pub after: Vec<u32>,
}

/// What the cluster looked like once the run was over.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndState {
    /// Every machine of the run's apps that its owner holds (not destroyed), from every
    /// owner.
    pub truth: Vec<MachineView>,
    /// Each node's catalog of the run's apps at its last poll (not destroyed).
    pub catalogs: BTreeMap<String, Vec<MachineView>>,
    /// How long after the heal the workload's last operation ended (the workload runs 1 s
    /// past the heal, then its operations in flight finish).
    #[serde(default)]
    pub quiet_after_ms: u64,
    /// How long after that (the truth is still from then on) every catalog first equalled
    /// the truth; `None`: not within the time the runner waited.
    pub converged_after_ms: Option<u64>,
    /// What the catalogs still got wrong at the last poll before they agreed: a late
    /// convergence says what it waited for.
    #[serde(default)]
    pub last_disagreement: Vec<String>,
    /// The last ledger of every host, taken with the truth.
    pub ledgers: Vec<LedgerSample>,
    /// Lab host name → the ids of every machine it holds (of any app, not destroyed, and
    /// not displaced: a displaced machine holds nothing), taken with the ledgers.
    pub held: BTreeMap<String, Vec<String>>,
}

/// Everything one fault run recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    pub fault: FaultRecord,
    /// Lab host name → its agent's host id.
    pub host_ids: BTreeMap<String, String>,
    /// Apps whose machines only the workload makes (every machine there has a tag).
    pub workload_apps: Vec<String>,
    pub calls: Vec<Call>,
    pub ledgers: Vec<LedgerSample>,
    pub proxy: Vec<ProxySample>,
    pub pids: Vec<PidWatch>,
    pub end: EndState,
}
