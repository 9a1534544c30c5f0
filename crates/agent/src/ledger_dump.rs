//! `GET /host/v1/ledger` (cluster secret only): this host's ledger as it is now, its
//! capacity, what every machine holds and the open reservations, read under the ledger
//! lock so the numbers belong together. Fault suites sample it to check that no host ever
//! promises more than it has (`bazaar_lab::check`).

use crate::agent::Agent;
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use bazaar_types::host::Resources;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The body of `GET /host/v1/ledger`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LedgerDump {
    pub host_id: String,
    pub capacity: Resources,
    /// Resources committed to each machine, by machine id.
    pub committed: BTreeMap<String, Resources>,
    /// Sum of the open (unclaimed) reservations held against capacity by requests.
    pub reserved: Resources,
    /// With reclamation on: the machines of `committed` held in the batch pool (not
    /// against capacity by requests), and the reclaimed pool's figures.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub batch: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaim: Option<ReclaimDump>,
    /// Machines this host keeps (not destroyed) that hold nothing in the ledger: displaced
    /// by preemption or reclamation until they start again (or move to another host), and
    /// batch machines evicted that the next measurement stops.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub displaced: Vec<String>,
}

/// The reclaimed pool of a host's ledger (docs/POLICY.md "Reclamation"), in millicpus and
/// MiB: `batch_held` (services' reservations + batch machines, their CPU at its throttled
/// share, + open batch bids) never
/// passes the capacity while any batch machine or bid is held.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReclaimDump {
    pub reservations: UseDump,
    pub batch_held: UseDump,
    pub batch_room: UseDump,
    /// The share of its CPU request each batch machine keeps, per mille (1000: none is
    /// throttled; `batch_held` counts their CPU at it).
    #[serde(default = "whole")]
    pub batch_cpu_share: u64,
}

fn whole() -> u64 {
    1000
}

/// An amount in millicpus and MiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UseDump {
    pub millicpus: u64,
    pub memory_mb: u64,
}

impl From<bazaar_placement::ledger::Use> for UseDump {
    fn from(u: bazaar_placement::ledger::Use) -> UseDump {
        UseDump {
            millicpus: u.millicpus,
            memory_mb: u.memory_mb,
        }
    }
}

/// The ledger as it is now (the caller holds its lock).
pub fn dump(host_id: &str, ledger: &bazaar_placement::Ledger) -> LedgerDump {
    LedgerDump {
        host_id: host_id.to_string(),
        capacity: ledger.capacity(),
        committed: ledger.commitments().clone(),
        reserved: ledger.reserved(),
        batch: ledger
            .commitments()
            .keys()
            .filter(|id| ledger.in_batch_pool(id))
            .cloned()
            .collect(),
        displaced: Vec::new(),
        reclaim: ledger.reclaiming().then(|| ReclaimDump {
            reservations: ledger.service_reservations().into(),
            batch_held: ledger.batch_held().into(),
            batch_room: ledger.batch_room().into(),
            batch_cpu_share: ledger.batch_cpu_share(),
        }),
    }
}

pub fn routes() -> Router<Agent> {
    Router::new().route("/ledger", get(ledger))
}

async fn ledger(State(agent): State<Agent>) -> Json<LedgerDump> {
    Json(current(&agent).await)
}

/// Host `agent`'s ledger now, read under its lock.
pub async fn current(agent: &Agent) -> LedgerDump {
    let ledger = agent.write_lock().await;
    let mut d = dump(agent.host_id(), &ledger);
    d.displaced = agent.store().select(|m| {
        (m.state != bazaar_types::state::MachineState::Destroyed
            && m.preempted_by.is_some()
            && !ledger.commitments().contains_key(&m.id))
        .then(|| m.id.clone())
    });
    d.displaced.extend(ledger.pending_evictions());
    d
}
