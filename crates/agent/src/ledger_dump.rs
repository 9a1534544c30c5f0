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
    /// Sum of the open (unclaimed) reservations.
    pub reserved: Resources,
}

pub fn routes() -> Router<Agent> {
    Router::new().route("/ledger", get(ledger))
}

async fn ledger(State(agent): State<Agent>) -> Json<LedgerDump> {
    let ledger = agent.write_lock().await;
    Json(LedgerDump {
        host_id: agent.host_id().to_string(),
        capacity: ledger.capacity(),
        committed: ledger.commitments().clone(),
        reserved: ledger.reserved(),
    })
}
