//! The machine as the agent stores it: the durable truth of the host about each machine
//! (everything else, the ledger and the catalog rows, derives from it), and how an actor's
//! work merges with what the accept side changed meanwhile.

use bazaar_types::config::MachineConfig;
use bazaar_types::host::Resources;
use bazaar_types::state::MachineState;
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
    /// `0..65536` are host ids `uid_base..`, the runtime's `idranges`).
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
    /// Stopped by preemption for this machine (the agent's `preempt.rs`): the machine holds
    /// no commitment in the ledger until it starts again, which commits it first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempted_by: Option<String>,
    /// It was running when it was displaced (preempted or reclaimed): its host re-places
    /// it on another host when its config allows (`bazaar_types::replacement::
    /// re_placed_when_displaced`); one stopped by hand before stays where it is.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub displaced_running: bool,
    // How the exchange placed the machine is stored apart (`Store::placement`).
}

impl MachineRecord {
    /// The actor read `before`, worked on it into `self`, and the stored record is now
    /// `stored`: takes from `stored` what the accept side changed meanwhile (it owns the
    /// config and version, name, resources, ports, cordon, lease, preemption and, when a new
    /// operation was queued, the desired state and run ids), keeping the actor's own
    /// fields (state, run, exits, restarts). Events are renumbered by the caller.
    pub fn merge_accepted(&mut self, before: &MachineRecord, stored: &MachineRecord) {
        if stored.instance_id != before.instance_id || stored.config != before.config {
            self.config = stored.config.clone();
            self.instance_id = stored.instance_id.clone();
        }
        if stored.resources != before.resources {
            self.resources = stored.resources;
        }
        if stored.preempted_by != before.preempted_by {
            self.preempted_by = stored.preempted_by.clone();
        }
        if stored.displaced_running != before.displaced_running {
            self.displaced_running = stored.displaced_running;
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A created machine, as the market records it.
    pub(crate) fn record() -> MachineRecord {
        MachineRecord {
            id: "d891234a567b89".into(),
            name: "quiet-river".into(),
            app: "web".into(),
            app_id: "app_1".into(),
            region: "local".into(),
            state: MachineState::Created,
            desired: MachineState::Created,
            instance_id: "01V1".into(),
            config: MachineConfig::default(),
            resources: Resources::default(),
            created_at_ms: 1,
            updated_at_ms: 1,
            cordoned: false,
            host_ports: BTreeMap::new(),
            private_ip: None,
            uid: None,
            uid_base: None,
            run: None,
            next_run_id: 1,
            exit_handled_run: 0,
            policy_restarts: Vec::new(),
            restart_count: 0,
            host_shutdown_run: None,
            next_event_seq: 1,
            last_event_id: "01E1".into(),
            last_event_status: "created".into(),
            destroyed_at_ms: None,
            lease: None,
            image_ref: None,
            epoch: 0,
            preempted_by: None,
            displaced_running: false,
        }
    }

    #[test]
    fn the_actor_keeps_its_own_fields_and_takes_what_the_accept_side_changed() {
        let before = record();
        // The actor launched a run meanwhile.
        let mut worked = before.clone();
        worked.state = MachineState::Started;
        worked.run = Some(RunInfo {
            run_id: 1,
            shim_pid: 10,
            workload_pid: 11,
            started_at_ms: 5,
        });
        worked.next_run_id = 2;
        worked.next_event_seq = 3;
        worked.last_event_id = "01E3".into();
        worked.last_event_status = "started".into();
        worked.updated_at_ms = 5;
        worked.restart_count = 1;
        // The accept side updated the config, renamed, cordoned, leased, queued a stop.
        let mut stored = before.clone();
        stored.instance_id = "01V2".into();
        stored.config.auto_destroy = true;
        stored.name = "loud-river".into();
        stored.cordoned = true;
        stored.resources.memory_mb = 512;
        stored.host_ports.insert(8080, 30001);
        stored.private_ip = Some("172.19.0.5".parse().unwrap());
        stored.uid = Some(70001);
        stored.uid_base = Some(200_000);
        stored.lease = Some(bazaar_types::machine::Lease {
            nonce: "n".into(),
            expires_at: 100,
            owner: "api".into(),
            description: String::new(),
            version: "01V2".into(),
        });
        stored.desired = MachineState::Stopped;
        stored.next_run_id = 4;
        stored.next_event_seq = 2;
        stored.last_event_id = "01E2".into();
        stored.updated_at_ms = 9;
        stored.preempted_by = Some("m2".into());

        let mut merged = worked.clone();
        merged.merge_accepted(&before, &stored);
        assert_eq!(merged.preempted_by.as_deref(), Some("m2"));
        assert_eq!(merged.instance_id, "01V2");
        assert!(merged.config.auto_destroy);
        assert_eq!(merged.name, "loud-river");
        assert!(merged.cordoned);
        assert_eq!(merged.resources.memory_mb, 512);
        assert_eq!(merged.host_ports, stored.host_ports);
        assert_eq!(merged.private_ip, stored.private_ip);
        assert_eq!(merged.uid, Some(70001));
        assert_eq!(merged.uid_base, Some(200_000));
        assert_eq!(merged.lease, stored.lease);
        assert_eq!(merged.desired, MachineState::Stopped);
        assert_eq!(merged.next_run_id, 4, "run ids never go back");
        // Both sides added events: the actor's 2 and the accept side's 1.
        assert_eq!(merged.next_event_seq, 4);
        assert_eq!(merged.last_event_id, "01E3", "the newest event wins");
        assert_eq!(merged.last_event_status, "started");
        assert_eq!(merged.updated_at_ms, 9);
        // The actor's own fields are its own.
        assert_eq!(merged.state, MachineState::Started);
        assert_eq!(merged.run, worked.run);
        assert_eq!(merged.restart_count, 1);
    }

    #[test]
    fn a_new_config_or_a_new_version_alone_is_taken() {
        let before = record();
        let mut config_only = before.clone();
        config_only.config.auto_destroy = true;
        let mut merged = before.clone();
        merged.merge_accepted(&before, &config_only);
        assert!(merged.config.auto_destroy, "a config changed in place");

        let mut version_only = before.clone();
        version_only.instance_id = "01V9".into();
        let mut merged = before.clone();
        merged.merge_accepted(&before, &version_only);
        assert_eq!(
            merged.instance_id, "01V9",
            "a new version of the same config"
        );
    }

    #[test]
    fn nothing_changed_on_the_accept_side_leaves_the_actors_work_alone() {
        let before = record();
        let mut worked = before.clone();
        worked.state = MachineState::Stopped;
        worked.desired = MachineState::Stopped;
        worked.next_run_id = 3;
        worked.next_event_seq = 5;
        worked.last_event_id = "01E5".into();
        worked.last_event_status = "stopped".into();
        worked.cordoned = true;
        worked.updated_at_ms = 20;
        let mut merged = worked.clone();
        merged.merge_accepted(&before, &before);
        assert_eq!(merged.desired, MachineState::Stopped);
        assert_eq!(merged.next_run_id, 3);
        assert_eq!(merged.next_event_seq, 5);
        assert_eq!(merged.last_event_id, "01E5");
        assert_eq!(merged.last_event_status, "stopped");
        assert!(merged.cordoned);
        assert_eq!(merged.updated_at_ms, 20);
        // Fields the accept side did not touch are the actor's copy's, even where that
        // copy differs (every one the merge would otherwise take from the store).
        let mut own = worked.clone();
        own.instance_id = "01V7".into();
        own.config.auto_destroy = true;
        own.last_event_status = "mine".into();
        let mut merged = own.clone();
        let mut same_event = before.clone();
        same_event.last_event_id = own.last_event_id.clone();
        merged.merge_accepted(&before, &same_event);
        assert_eq!(merged.instance_id, "01V7");
        assert!(merged.config.auto_destroy);
        assert_eq!(
            merged.last_event_status, "mine",
            "the same newest event keeps the actor's status"
        );
        // An accept side with an older event does not roll the newest back.
        let mut stored = before.clone();
        stored.last_event_id = "01E0".into();
        stored.last_event_status = "old".into();
        let mut merged = worked.clone();
        merged.merge_accepted(&before, &stored);
        assert_eq!(merged.last_event_status, "stopped");
    }
}
