//! `PUT /host/v1/drain` (cluster secret or a host certificate): drains the host or takes it
//! back into the market (`bazaar host drain` / `undrain`). A drained host refuses every bid
//! (its ledger), every direct create (409), and its catalog row says `draining`, so every
//! exchange leaves it out with that reason (`bazaar machine explain`). Machines already on
//! it keep running: moving them is the caller's part (the CLI clones each elsewhere
//! through the market, then destroys it here). The flag is kept in the store's meta table
//! (`store::META_DRAINING`) and outlives a restart.

use crate::agent::Agent;
use crate::error::AgentError;
use crate::store::{Batch, META_DRAINING};
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::put;
use axum::{Json, Router};
use bazaar_types::host::{DrainRequest, HostInfo};

/// What a direct create on a drained host is told.
pub const REFUSAL: &str =
    "host is draining (bazaar host drain): it takes no new machines; bazaar host undrain takes it back";

pub fn routes() -> Router<Agent> {
    Router::new().route("/drain", put(drain))
}

async fn drain(State(agent): State<Agent>, body: Bytes) -> Result<Json<HostInfo>, AgentError> {
    let req: DrainRequest = bazaar_types::json::from_body(&body).map_err(|e| {
        AgentError::Invalid(format!(
            "a drain request is {{\"draining\": true}} or {{\"draining\": false}}: {e}"
        ))
    })?;
    set_draining(&agent, req.draining).await?;
    Ok(Json(agent.info().await))
}

/// Sets the flag: stored first, then the ledger (under its lock, so no bid is granted
/// after the answer), then the host row.
pub async fn set_draining(agent: &Agent, draining: bool) -> Result<(), AgentError> {
    {
        let mut ledger = agent.write_lock().await;
        let mut batch = Batch::default();
        batch.meta(META_DRAINING, if draining { "true" } else { "false" });
        agent.commit(batch).await?;
        ledger.set_draining(draining);
        agent.set_draining_flag(draining);
    }
    if draining {
        tracing::info!("host drained: it takes no new machines");
    } else {
        tracing::info!("host taken back into the market");
    }
    crate::publish::publish_host(agent).await;
    Ok(())
}
