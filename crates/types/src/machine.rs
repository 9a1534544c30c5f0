//! The machine object returned to clients (reference/fly.md §2.4), plus bazaar's extension
//! fields (`host_id`, `app`, `host_ports`, `exit`).

use crate::config::MachineConfig;
use crate::event::MachineEvent;
use crate::state::MachineState;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A machine as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Machine {
    pub id: String,
    pub name: String,
    pub state: MachineState,
    pub region: String,
    /// The current config version (a ULID).
    pub instance_id: String,
    /// Same as `instance_id` (newer clients read `version`).
    pub version: String,
    pub private_ip: String,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub updated_at: String,
    pub config: MachineConfig,
    #[serde(default)]
    pub events: Vec<MachineEvent>,
    #[serde(default)]
    pub checks: Vec<serde_json::Value>,
    /// `ok`, `unknown` or `unreachable`.
    pub host_status: String,
    #[serde(default)]
    pub cordoned: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
    /// bazaar extension: the host that owns the machine.
    #[serde(default)]
    pub host_id: String,
    /// bazaar extension: the app the machine belongs to.
    #[serde(default)]
    pub app: String,
    /// bazaar extension: for process machines, the host port each `internal_port` is
    /// mapped to (the address to reach is `private_ip:host_port`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub host_ports: BTreeMap<u16, u16>,
    /// bazaar extension: the host pid of the workload while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<i32>,
    /// The lease on the machine, if one is held and the client asked (`include_leases`);
    /// never its nonce.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseInfo>,
    /// The image of an image machine: as resolved by its last start (with the digest), or
    /// as its config names it until it has started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_ref: Option<ImageRef>,
    /// True when the machine is shown from the catalog only (its host did not answer):
    /// `config` then holds just its metadata.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub incomplete_config: bool,
}

/// The image a machine runs, as Fly's `image_ref`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ImageRef {
    /// Registry host, with its port if any (`docker.io`).
    pub registry: String,
    /// Repository path in the registry (`library/busybox`).
    pub repository: String,
    pub tag: String,
    /// The digest the image resolved to (`sha256:...`; empty until it has been pulled).
    pub digest: String,
    /// The image config's labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// An exclusive, time-bound write lock on a machine (reference/fly.md §2.8).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Lease {
    pub nonce: String,
    /// Unix seconds.
    pub expires_at: u64,
    pub owner: String,
    #[serde(default)]
    pub description: String,
    /// The machine version when the lease was taken.
    #[serde(default)]
    pub version: String,
}

/// A lease as anyone but its holder sees it: everything but the nonce (Fly returns the
/// nonce only to the client that acquired the lease).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LeaseInfo {
    /// Unix seconds.
    pub expires_at: u64,
    pub owner: String,
    #[serde(default)]
    pub description: String,
    /// The machine version when the lease was taken.
    #[serde(default)]
    pub version: String,
}

impl From<&Lease> for LeaseInfo {
    fn from(l: &Lease) -> LeaseInfo {
        LeaseInfo {
            expires_at: l.expires_at,
            owner: l.owner.clone(),
            description: l.description.clone(),
            version: l.version.clone(),
        }
    }
}

/// One line of a machine's log (`GET .../logs` answers JSON lines of these).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LogLine {
    /// When it was written, in milliseconds since the Unix epoch.
    #[serde(default)]
    pub ts: u64,
    /// `stdout` or `stderr`.
    #[serde(default)]
    pub stream: String,
    /// The line, without its newline.
    #[serde(default)]
    pub line: String,
}
