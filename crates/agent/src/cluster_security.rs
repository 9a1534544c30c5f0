//! The catalog's keys and revocations on this host (cluster secret or host certificate):
//! - `GET|POST /host/v1/gossip-keys`: the gossip keyring (`bazaar cluster gossip-key`):
//!   `install` a key (decrypts), `use` it (encrypts), `remove` an old one; kept in
//!   `DATA/gossip-keys` (0600, one hex key a line, the one in use first) and read at start.
//!   Without the file the key is derived from the cluster secret.
//! - `GET|POST /host/v1/revocations`: revocations signed by the cluster CA
//!   (`bazaar cluster revoke`); the catalog checks and spreads them. Every revocation this
//!   host learns, from here or from other hosts, is kept in `DATA/revocations.json` and
//!   given back to the catalog at start, so a restart forgets none.

use crate::agent::Agent;
use crate::error::AgentError;
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use bazaar_pki::Revocation;
use bazaar_types::host::{GossipKeyChange, GossipKeys};
use std::path::Path;

const GOSSIP_KEYS_FILE: &str = "gossip-keys";
const REVOCATIONS_FILE: &str = "revocations.json";

pub fn routes() -> Router<Agent> {
    Router::new()
        .route("/gossip-keys", get(list_keys).post(change_key))
        .route("/revocations", get(list_revocations).post(revoke))
}

/// The gossip keys kept in the data dir (empty: derive from the cluster secret).
pub fn load_gossip_keys(data_dir: &Path) -> anyhow::Result<Vec<[u8; 32]>> {
    match std::fs::read_to_string(data_dir.join(GOSSIP_KEYS_FILE)) {
        Ok(text) => text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(bazaar_catalog::keyring::parse_key)
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(anyhow::anyhow!("reading {GOSSIP_KEYS_FILE}: {e}")),
    }
}

/// The revocations kept in the data dir.
pub fn load_revocations(data_dir: &Path) -> anyhow::Result<Vec<Revocation>> {
    match std::fs::read(data_dir.join(REVOCATIONS_FILE)) {
        Ok(bytes) => Ok(serde_json::from_slice(&bytes)?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(anyhow::anyhow!("reading {REVOCATIONS_FILE}: {e}")),
    }
}

/// Writes of this module's files one at a time (they go through the same temporary name).
static WRITING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn write(path: &Path, contents: &str) -> anyhow::Result<()> {
    let _one = WRITING.lock().unwrap_or_else(|e| e.into_inner());
    crate::secrets::write_private(path, contents)
}

fn save_revocations(data_dir: &Path, revocations: &[Revocation]) -> anyhow::Result<()> {
    write(
        &data_dir.join(REVOCATIONS_FILE),
        &serde_json::to_string(revocations)?,
    )
}

/// Keeps every revocation the catalog learns in the data dir, for as long as the agent
/// runs (a revoked host's rows leave the catalog: that change is the cue).
pub fn spawn_keeper(agent: &Agent, catalog: bazaar_catalog::Catalog) {
    let data_dir = agent.config().data_dir.clone();
    let stop = agent.shutdown_token();
    let mut changes = catalog.subscribe();
    agent.tracker().clone().spawn(async move {
        let mut kept = load_revocations(&data_dir).unwrap_or_default().len();
        loop {
            let change = tokio::select! {
                _ = stop.cancelled() => return,
                change = changes.recv() => change,
            };
            let cue = match change {
                Ok(bazaar_catalog::Change::Host(id)) => catalog.is_revoked(&id),
                Ok(_) => false,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => true,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            };
            let known = catalog.revocations();
            if cue && known.len() != kept {
                match save_revocations(&data_dir, &known) {
                    Ok(()) => kept = known.len(),
                    Err(e) => tracing::warn!(error = %format!("{e:#}"), "keeping revocations"),
                }
            }
        }
    });
}

fn catalog(agent: &Agent) -> Result<&bazaar_catalog::Catalog, AgentError> {
    agent
        .catalog()
        .ok_or_else(|| AgentError::Internal("the catalog is not running yet".into()))
}

async fn list_keys(State(agent): State<Agent>) -> Result<Json<GossipKeys>, AgentError> {
    Ok(Json(GossipKeys {
        keys: catalog(&agent)?.gossip_keys(),
    }))
}

async fn change_key(
    State(agent): State<Agent>,
    body: axum::body::Bytes,
) -> Result<Json<GossipKeys>, AgentError> {
    let change: GossipKeyChange =
        bazaar_types::json::from_body(&body).map_err(AgentError::Invalid)?;
    let catalog = catalog(&agent)?;
    let done = match change.action.as_str() {
        "install" => catalog.install_gossip_key(&change.key),
        "use" => catalog.use_gossip_key(&change.key),
        "remove" => catalog.remove_gossip_key(&change.key),
        other => {
            return Err(AgentError::Invalid(format!(
                "unknown action {other:?} (install, use, remove)"
            )))
        }
    };
    done.map_err(|e| AgentError::Invalid(format!("{e:#}")))?;
    let keys = catalog.gossip_keys();
    write(
        &agent.config().data_dir.join(GOSSIP_KEYS_FILE),
        &(keys.join("\n") + "\n"),
    )
    .map_err(|e| AgentError::Internal(format!("{e:#}")))?;
    Ok(Json(GossipKeys { keys }))
}

async fn list_revocations(State(agent): State<Agent>) -> Result<Json<Vec<Revocation>>, AgentError> {
    Ok(Json(catalog(&agent)?.revocations()))
}

async fn revoke(
    State(agent): State<Agent>,
    body: axum::body::Bytes,
) -> Result<Json<Vec<Revocation>>, AgentError> {
    let revocation: Revocation = bazaar_types::json::from_body(&body)
        .map_err(|e| AgentError::Invalid(format!("revocation: {e}")))?;
    let catalog = catalog(&agent)?;
    catalog
        .revoke(&revocation)
        .map_err(|e| AgentError::Invalid(format!("{e:#}")))?;
    let known = catalog.revocations();
    save_revocations(&agent.config().data_dir, &known)
        .map_err(|e| AgentError::Internal(format!("{e:#}")))?;
    Ok(Json(known))
}
