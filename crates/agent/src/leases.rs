//! Leases (Fly's exclusive-change tokens, checked by every mutation), cordons and machine
//! metadata: the agent's side. The rules are the pure core's (`bazaar_lifecycle::lease`);
//! this module loads the record, applies them under the agent's write lock and commits,
//! through the agent's narrow API (functions the host interface calls).

use crate::agent::Agent;
use crate::error::AgentError;
use crate::record::{AsWorkload, MachineRecord};
use crate::store::Batch;
use bazaar_lifecycle::lease::{self, LeaseRequest};
use bazaar_types::ids;
use bazaar_types::state::check_transition;
use std::collections::BTreeMap;

/// Takes or refreshes the lease. Refreshing needs the current nonce; another holder's
/// unexpired lease is a conflict. Returns the lease and whether it is new.
pub async fn lease_acquire(
    agent: &Agent,
    id: &str,
    ttl: u64,
    description: &str,
    nonce: Option<&str>,
) -> Result<(bazaar_types::machine::Lease, bool), AgentError> {
    let _guard = agent.write_lock().await;
    let mut rec = agent.load_live(id)?;
    let req = LeaseRequest {
        ttl,
        description,
        nonce,
    };
    let (lease, created) = lease::acquire(
        id,
        &rec.instance_id,
        rec.lease.as_ref(),
        req,
        agent.now_ms(),
        || ids::new_secret(6),
    )
    .map_err(AgentError::from)?;
    rec.lease = Some(lease.clone());
    let mut b = Batch::default();
    b.machine(&rec);
    agent.commit(b).await?;
    Ok((lease, created))
}

/// The current lease, if one is held.
pub async fn lease_get(
    agent: &Agent,
    id: &str,
) -> Result<Option<bazaar_types::machine::Lease>, AgentError> {
    let rec = agent.load_live(id)?;
    Ok(lease::held(rec.lease.as_ref(), agent.now_ms()).cloned())
}

/// Releases the lease; the nonce must match.
pub async fn lease_release(agent: &Agent, id: &str, nonce: Option<&str>) -> Result<(), AgentError> {
    let _guard = agent.write_lock().await;
    let mut rec = agent.load_live(id)?;
    lease::release(id, rec.lease.as_ref(), nonce, agent.now_ms()).map_err(AgentError::from)?;
    rec.lease = None;
    let mut b = Batch::default();
    b.machine(&rec);
    agent.commit(b).await
}

/// Cordons (no new traffic from the proxy) or uncordons a machine.
pub async fn cordon(
    agent: &Agent,
    id: &str,
    cordoned: bool,
    nonce: Option<&str>,
) -> Result<(), AgentError> {
    let _guard = agent.write_lock().await;
    let mut rec = agent.load_live(id)?;
    check_lease(&rec, nonce, agent.now_ms())?;
    rec.cordoned = cordoned;
    save_and_publish(agent, &mut rec).await
}

/// A machine's metadata.
pub async fn metadata(agent: &Agent, id: &str) -> Result<BTreeMap<String, String>, AgentError> {
    Ok(agent.load_live(id)?.config.metadata)
}

/// Sets or removes metadata keys (a `None` or empty value removes the key). With
/// `machine_version`, refuses (412) unless the machine is at that version.
pub async fn metadata_update(
    agent: &Agent,
    id: &str,
    changes: BTreeMap<String, Option<String>>,
    machine_version: Option<&str>,
    nonce: Option<&str>,
) -> Result<(), AgentError> {
    for key in changes.keys() {
        lease::validate_metadata_key(key).map_err(AgentError::from)?;
    }
    let _guard = agent.write_lock().await;
    let mut rec = agent.load_live(id)?;
    check_lease(&rec, nonce, agent.now_ms())?;
    if let Some(v) = machine_version {
        if v != rec.instance_id {
            return Err(AgentError::Precondition(format!(
                "machine version is {}, not {v}",
                rec.instance_id
            )));
        }
    }
    for (k, v) in changes {
        match v.filter(|v| !v.is_empty()) {
            Some(v) => rec.config.metadata.insert(k, v),
            None => rec.config.metadata.remove(&k),
        };
    }
    bazaar_types::limits::check_config(&rec.config).map_err(AgentError::Invalid)?;
    bazaar_types::replacement::validate(&rec.config).map_err(AgentError::Invalid)?;
    save_and_publish(agent, &mut rec).await
}

/// Runs a command in a started machine's context.
pub async fn exec(
    agent: &Agent,
    id: &str,
    req: bazaar_types::host::ExecRequest,
) -> Result<bazaar_types::host::ExecResponse, AgentError> {
    let rec = agent.load_live(id)?;
    check_transition(agent.current_state(&rec), bazaar_types::state::Action::Exec)?;
    let run = rec
        .run
        .filter(|r| r.run_id > rec.exit_handled_run && r.workload_pid > 0)
        .ok_or_else(|| AgentError::Conflict(format!("machine {id} has no running process")))?;
    let spec = agent.driver().spec(&rec.workload(), run.run_id);
    let target = crate::exec::ExecTarget {
        shim_exec: agent.driver().isolate.then(|| {
            let driver = &agent.driver();
            (driver.exe.clone(), driver.run_dir(&rec.id, run.run_id))
        }),
        env: spec.env,
        workdir: spec.workdir,
        runc_exec: agent
            .driver()
            .exec_argv(&rec.workload(), run.run_id, &crate::exec::argv(&req)?),
    };
    Ok(crate::exec::run(&target, &req).await?)
}

/// How the machine was placed, if it went through the market.
pub async fn placement(agent: &Agent, id: &str) -> Result<Option<serde_json::Value>, AgentError> {
    if agent.store().machine(id)?.is_none() {
        return Err(AgentError::MachineNotFound(id.into()));
    }
    Ok(agent.store().placement(id)?)
}

/// The machine's log file, for streaming.
pub fn log_path(agent: &Agent, id: &str) -> std::path::PathBuf {
    agent.driver().log_path(id)
}

/// A new lease of `ttl` seconds for the caller of a create or an update (the core's
/// [`lease::new_lease`] at this machine's version, at `now` in unix ms).
pub(crate) fn new_lease(
    rec: &MachineRecord,
    ttl: u64,
    description: &str,
    keep_nonce: Option<&str>,
    now: u64,
) -> Result<bazaar_types::machine::Lease, AgentError> {
    lease::new_lease(
        &rec.instance_id,
        rec.lease.as_ref(),
        ttl,
        description,
        keep_nonce,
        now,
        || ids::new_secret(6),
    )
    .map_err(AgentError::from)
}

/// Refuses a mutation of a leased machine unless `nonce` is the lease's (at `now`, unix ms).
pub(crate) fn check_lease(
    rec: &MachineRecord,
    nonce: Option<&str>,
    now: u64,
) -> Result<(), AgentError> {
    lease::check(&rec.id, rec.lease.as_ref(), nonce, now).map_err(AgentError::from)
}

/// Stamps a changed record, stores it and publishes it (the caller holds the write lock).
async fn save_and_publish(agent: &Agent, rec: &mut MachineRecord) -> Result<(), AgentError> {
    rec.updated_at_ms = agent.now_ms();
    let mut b = Batch::default();
    b.machine(rec);
    agent.commit(b).await?;
    agent.publish(rec);
    Ok(())
}
