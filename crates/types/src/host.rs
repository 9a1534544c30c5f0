//! The host-to-host interface: what an exchange (the API on any node) sends to the agent
//! that owns or may own a machine. Served under `/host/v1`, authenticated with the cluster
//! secret. See DESIGN.md "The market".

use crate::config::MachineConfig;
use crate::guest::Size;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Resources, as counted by a host's ledger.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Resources {
    pub cpus: u32,
    pub memory_mb: u64,
}

impl From<Size> for Resources {
    fn from(s: Size) -> Self {
        Resources {
            cpus: s.cpus,
            memory_mb: s.memory_mb,
        }
    }
}

/// The host label prefix saying why a host cannot run machines of a driver:
/// `cannot_run_<driver>` = what it lacks (`cannot_run_oci` = `runc (package runc)`). A host
/// publishes one for each driver it cannot run; the exchange asks it for no such machine.
pub const CANNOT_RUN_LABEL: &str = "cannot_run_";

/// The host label naming the platform gVisor machines run on there (`ptrace`, `kvm`,
/// `systrap`: chosen when the agent starts), on a host that runs them.
pub const GVISOR_PLATFORM_LABEL: &str = "gvisor_platform";

/// The host label advertising the room a host with reclamation on offers `batch` machines
/// (capacity minus its services' decaying reservations and its batch machines:
/// docs/POLICY.md "Reclamation"), as `CPUS/MEMORY_MB` (`3/2048`). Absent: batch machines
/// are held against capacity by requests there, like any other.
pub const BATCH_FREE_LABEL: &str = "bazaar_batch_free";

/// The host label of a host whose machine network has no address left (every machine of an
/// isolating host takes one of its subnet's: 8,189 in the default /19), saying so; the
/// exchange asks it for no machine until the label goes.
pub const NETWORK_FULL_LABEL: &str = "bazaar_network_full";

/// Why a host with `labels` takes no machine for want of addresses, if it says so
/// ([`NETWORK_FULL_LABEL`]).
pub fn network_full(labels: &std::collections::BTreeMap<String, String>) -> Option<&str> {
    labels.get(NETWORK_FULL_LABEL).map(String::as_str)
}

/// The batch room a host with `labels` advertises ([`BATCH_FREE_LABEL`]).
pub fn batch_free(labels: &std::collections::BTreeMap<String, String>) -> Option<Resources> {
    let (cpus, memory_mb) = labels.get(BATCH_FREE_LABEL)?.split_once('/')?;
    Some(Resources {
        cpus: cpus.parse().ok()?,
        memory_mb: memory_mb.parse().ok()?,
    })
}

/// The label of a host that cannot run `driver` machines.
pub fn cannot_run_label(driver: &str) -> String {
    format!("{CANNOT_RUN_LABEL}{driver}")
}

/// Why a host with `labels` cannot run `driver` machines, if it cannot.
pub fn cannot_run<'a>(
    labels: &'a std::collections::BTreeMap<String, String>,
    driver: &str,
) -> Option<&'a str> {
    labels.get(&cannot_run_label(driver)).map(String::as_str)
}

/// Every driver a host with `labels` cannot run, with why: `(driver, reason)`.
pub fn cannot_run_any(
    labels: &std::collections::BTreeMap<String, String>,
) -> impl Iterator<Item = (&str, &str)> {
    labels.iter().filter_map(|(k, v)| {
        k.strip_prefix(CANNOT_RUN_LABEL)
            .map(|driver| (driver, v.as_str()))
    })
}

/// A request for a bid: "could you host a machine of this size?"
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BidRequest {
    /// The exchange's id for this placement (for the record and for logs).
    #[serde(default)]
    pub placement_id: String,
    pub cpus: u32,
    pub memory_mb: u64,
    /// How long the reservation should be held, in ms (bounded by the host).
    #[serde(default)]
    pub ttl_ms: Option<u64>,
    /// The machine's driver (`process`, `oci`): a host that cannot run it refuses.
    /// `None`: not said (any host may bid).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// The machine's priority class (`config.priority`; absent: `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<crate::priority::Priority>,
    /// A preemption bid may be made: a host without room names the lower-class machines it
    /// would stop (docs/POLICY.md). Asked only when no host had room.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub preempt: bool,
}

/// A machine a host would stop for a preemption bid (and what preemption's rule weighs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Victim {
    pub machine_id: String,
    pub priority: crate::priority::Priority,
    pub resources: Resources,
    pub created_at_ms: u64,
}

/// A host's answer to a bid request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum BidResponse {
    /// The host holds the resources until `expires_at_ms` unless claimed or released.
    Bid {
        host_id: String,
        reservation_id: String,
        /// Higher is better. The default policy spreads: the fraction of the host left free.
        score: f64,
        expires_at_ms: u64,
        free: Resources,
        /// A preemption bid: the machines the host stops when it is claimed.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        victims: Vec<Victim>,
    },
    /// The host cannot (or will not) take it. `retryable`: only other exchanges'
    /// reservations stand in the way, so asking again shortly may succeed.
    Refusal {
        host_id: String,
        reason: String,
        #[serde(default)]
        retryable: bool,
    },
}

/// Turns a reservation into a machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ClaimRequest {
    pub app: String,
    /// The id of the app as the asking node's catalog has it: the owner refuses (409) an
    /// app that lost its name to another app of the name, and the machine carries it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub app_id: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub region: Option<String>,
    pub config: MachineConfig,
    #[serde(default)]
    pub skip_launch: bool,
    /// The machine id the exchange chose, so a retried claim is idempotent.
    #[serde(default)]
    pub machine_id: Option<String>,
    /// Take a lease of this many seconds on the new machine (its nonce is returned).
    #[serde(default)]
    pub lease_ttl: Option<u64>,
    /// Create cordoned (Fly's `skip_service_registration`).
    #[serde(default)]
    pub skip_service_registration: bool,
    /// The exchange's record of how this machine was placed (kept by the owner, shown by
    /// `explain`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<serde_json::Value>,
    /// The ownership epoch of the machine (0 for a new one): a re-placement of machine
    /// `machine_id` after its host died claims it with the epoch above the last one, and
    /// the copy with the highest epoch is the machine (see `replacement`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub epoch: u64,
    /// Why this copy is made: set when the machine was displaced from another host
    /// (preempted, or its reclaimed room taken back) and is re-placed here, which the new
    /// copy records as its `replaced` event (docs/POLICY.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub displaced_from: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A direct create on this host (reserve + claim in one call).
pub type CreateRequest = ClaimRequest;

/// A host's description of itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HostInfo {
    pub id: String,
    pub region: String,
    pub api_addr: String,
    pub capacity: Resources,
    pub committed: Resources,
    pub reserved: Resources,
    pub free: Resources,
    pub num_machines: usize,
    pub num_reservations: usize,
    pub version: String,
    /// Drained (`bazaar host drain`): it takes no new machines.
    #[serde(default)]
    pub draining: bool,
}

/// Body of `PUT /host/v1/drain`: drain the host (it bids for and creates no new machine)
/// or take it back into the market.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DrainRequest {
    pub draining: bool,
}

/// Body of `POST /host/v1/machines/{id}/stop` (and the Fly stop endpoint).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StopRequest {
    #[serde(default)]
    pub signal: Option<crate::signal::Signal>,
    #[serde(default)]
    pub timeout: Option<crate::duration::GoDuration>,
}

/// Body of `POST /host/v1/machines/{id}/signal`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SignalRequest {
    pub signal: crate::signal::Signal,
}

/// Body of an update: the whole new config.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct UpdateRequest {
    pub config: MachineConfig,
    #[serde(default)]
    pub skip_launch: bool,
    /// The expected current `instance_id`; a mismatch is refused with 409.
    #[serde(default)]
    pub current_version: Option<String>,
    /// Must be the machine's name if given (a name is immutable, as on Fly); another name is
    /// refused with 400.
    #[serde(default)]
    pub name: Option<String>,
    /// Must be the machine's region if given: a machine does not move (as on Fly, where
    /// region is immutable on update); another region is refused with 400.
    #[serde(default)]
    pub region: Option<String>,
    /// Take (or, with the nonce, refresh) a lease of this many seconds with the update; its
    /// nonce is returned.
    #[serde(default)]
    pub lease_ttl: Option<u64>,
    /// Cordon the machine with the update: it restarts out of its services' rotation until
    /// uncordoned (false leaves the cordon as it is).
    #[serde(default)]
    pub skip_service_registration: bool,
}

/// Answer of `wait`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WaitResponse {
    pub ok: bool,
    pub state: String,
    pub version: String,
    /// The event that left the machine in `state` (the newest when the wait was satisfied).
    #[serde(default)]
    pub event_id: String,
}

/// Body of `POST .../lease` (`ttl` may also come in the query).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LeaseRequest {
    #[serde(default)]
    pub ttl: Option<u64>,
    #[serde(default)]
    pub description: Option<String>,
}

/// Body of `POST .../exec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ExecRequest {
    /// The argv to run.
    #[serde(default)]
    pub command: Vec<String>,
    /// Deprecated: a command line, split on whitespace.
    #[serde(default)]
    pub cmd: Option<String>,
    /// Seconds (default 30, at most 300).
    #[serde(default)]
    pub timeout: Option<u64>,
    #[serde(default)]
    pub stdin: Option<String>,
}

/// Answer of `exec`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ExecResponse {
    pub exit_code: i32,
    pub exit_signal: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Body of `PUT/PATCH .../metadata`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MetadataUpdate {
    /// Keys to set; `null` or `""` removes the key.
    pub metadata: std::collections::BTreeMap<String, Option<String>>,
    /// Refuse (412) unless the machine is at this version.
    #[serde(default)]
    pub machine_version: Option<String>,
}

/// One process of a machine (`GET .../ps`), as Fly's ProcessStat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ProcessStat {
    /// The pid as the machine sees it (in its pid namespace).
    pub pid: i32,
    /// When it started, in seconds since the Unix epoch (`ps`'s STIME).
    pub stime: u64,
    /// CPU time it has used (user and system), in milliseconds (`ps`'s TIME).
    pub rtime: u64,
    /// Its command line, arguments separated by spaces.
    pub command: String,
    /// Its working directory.
    pub directory: String,
    /// Its CPU use over its life, in percent of one CPU (`ps`'s C).
    pub cpu: u64,
    /// Resident memory, in bytes.
    pub rss: u64,
    /// The TCP sockets it listens on and the UDP sockets it has bound.
    pub listen_sockets: Vec<ListenSocket>,
}

/// A socket a machine's process listens on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ListenSocket {
    /// `tcp` or `udp`.
    pub proto: String,
    /// `ip:port` (`[ip]:port` for IPv6).
    pub address: String,
}

/// An image a host keeps, as `GET /host/v1/images` lists it (and an import or pull
/// answers it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ImageSummary {
    /// The reference it was pulled or imported as.
    pub reference: String,
    /// The manifest's digest (`sha256:...`).
    pub digest: String,
    /// How many layers it has.
    pub layers: usize,
    /// Their compressed size, in bytes.
    pub size: u64,
}

/// One line of `POST /host/v1/images/pull`'s answer (JSON lines): a layer's progress,
/// then the image pulled or why not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum PullLine {
    /// The pull failed.
    Failed { error: String },
    /// The pull is done: the image as the host keeps it.
    Pulled { image: ImageSummary },
    /// A layer's phase changed, or more of it arrived.
    Layer(LayerProgress),
}

/// Progress of one layer of a pull.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LayerProgress {
    /// Which layer (from 1), of how many.
    pub layer: u64,
    pub of: u64,
    pub digest: String,
    /// `downloading`, `unpacking`, `done`, ...
    pub phase: String,
    /// Bytes done of the phase, and in all.
    pub done: u64,
    pub total: u64,
}

/// What `POST /host/v1/images/prune` removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PruneReport {
    /// References of the images forgotten.
    pub images: Vec<String>,
    /// Unpacked layers and blobs deleted.
    pub layers: usize,
    pub blobs: usize,
    /// Bytes freed.
    pub bytes: u64,
}

/// The gossip keyring (`GET /host/v1/gossip-keys`, and a change's answer).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GossipKeys {
    /// Hex, the key in use first.
    pub keys: Vec<String>,
}

/// A change of the gossip keyring (`POST /host/v1/gossip-keys`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GossipKeyChange {
    /// `install`, `use` or `remove`.
    pub action: String,
    /// The key, 64 hex characters.
    pub key: String,
}

/// The format of the host interface this build speaks (its paths and bodies). A caller
/// says its own in [`HOST_FORMAT_HEADER`] (none: format 1, every caller before formats
/// were numbered); an agent refuses a caller of a newer format with 400 and a message that
/// says to upgrade it ([`check_host_format`]). Raised only by a change an older agent
/// would misread; docs/INSTALL.md ("Upgrades") has the rule for running two versions side
/// by side.
pub const HOST_FORMAT: u32 = 1;

/// The request header that carries the caller's [`HOST_FORMAT`].
pub const HOST_FORMAT_HEADER: &str = "bazaar-host-format";

/// Whether an agent of this build serves a caller whose [`HOST_FORMAT_HEADER`] is
/// `header` (absent: format 1): the refusal says what to do.
pub fn check_host_format(header: Option<&str>) -> Result<(), String> {
    let Some(text) = header else {
        return Ok(());
    };
    let theirs: u32 = text.trim().parse().map_err(|_| {
        format!("{HOST_FORMAT_HEADER} must be a host interface format number, got {text:?}")
    })?;
    if theirs > HOST_FORMAT {
        return Err(format!(
            "the caller speaks host interface format {theirs}, this agent (bazaar {}) only \
             {HOST_FORMAT}: upgrade this host's bazaar before the callers' (docs/INSTALL.md, \
             \"Upgrades\")",
            env!("CARGO_PKG_VERSION")
        ));
    }
    Ok(())
}

#[cfg(test)]
mod format_tests {
    use super::*;

    #[test]
    fn an_agent_serves_its_format_and_older_and_refuses_a_newer_one_saying_why() {
        assert_eq!(check_host_format(None), Ok(()));
        assert_eq!(check_host_format(Some("1")), Ok(()));
        assert_eq!(check_host_format(Some(&HOST_FORMAT.to_string())), Ok(()));
        let newer = (HOST_FORMAT + 1).to_string();
        let err = check_host_format(Some(&newer)).unwrap_err();
        assert!(err.contains(&format!("format {newer}")), "{err}");
        assert!(err.contains("upgrade this host"), "{err}");
        let err = check_host_format(Some("two")).unwrap_err();
        assert!(err.contains("format number"), "{err}");
    }
}
