//! The accept side of every operation on an existing machine: validate a request against
//! the machine's state, record the operation durably in the same transaction as its effects
//! on the record, then hand it to the machine's actor ([`crate::actor`]) to run. Creates and
//! the market live in [`crate::market`], leases and metadata in [`crate::leases`], reads in
//! [`crate::views`]; every change is published through [`crate::publish`].

use crate::agent::Agent;
use crate::error::{capacity_error, AgentError};
use crate::leases::check_lease;
use crate::record::{MachineRecord, OpKind, Operation};
use crate::registry::ActorMsg;
use crate::store::Batch;
use bazaar_lifecycle::accept::accept;
use bazaar_types::config::MachineConfig;
use bazaar_types::event::MachineEvent;
use bazaar_types::host::{Resources, StopRequest, UpdateRequest};
use bazaar_types::ids;
use bazaar_types::machine::Machine;
use bazaar_types::signal::Signal;
use bazaar_types::state::{check_transition, MachineState};
use std::time::Duration;
use tokio::sync::mpsc::OwnedPermit;

/// Starts a machine.
pub async fn start_machine(
    agent: &Agent,
    id: &str,
    nonce: Option<&str>,
) -> Result<Machine, AgentError> {
    submit(agent, id, nonce, OpKind::Start, |rec| {
        refuse_losing_app(agent, &rec.app, &rec.app_id)?;
        Ok(None)
    })
    .await
}

/// 409 for an app that lost its name to another app of the name (both made while
/// their hosts could not hear each other, `bazaar_catalog`'s `replica::apps`): it
/// takes no new machine and starts none of its own.
pub(crate) fn refuse_losing_app(agent: &Agent, app: &str, app_id: &str) -> Result<(), AgentError> {
    let Some(winner) = agent.catalog().and_then(|c| c.lost_to(app, app_id)) else {
        return Ok(());
    };
    Err(AgentError::Conflict(winner.lost_name_message(app_id)))
}

/// Suspends a started machine: its processes are frozen; `start` resumes them.
pub async fn suspend_machine(
    agent: &Agent,
    id: &str,
    nonce: Option<&str>,
) -> Result<Machine, AgentError> {
    if !agent.driver().cgroups {
        return Err(AgentError::Invalid(
            "suspend needs cgroups: run the agent as root with isolation on".into(),
        ));
    }
    submit(agent, id, nonce, OpKind::Suspend, |_| Ok(None)).await
}

/// Stops a machine: its stop signal (or the one given), then SIGKILL after the timeout.
pub async fn stop_machine(
    agent: &Agent,
    id: &str,
    req: StopRequest,
    nonce: Option<&str>,
) -> Result<Machine, AgentError> {
    submit_with_stop(agent, id, req, nonce, |signal, timeout_ms| OpKind::Stop {
        signal,
        timeout_ms,
    })
    .await
}

/// Restarts a started machine.
pub async fn restart_machine(
    agent: &Agent,
    id: &str,
    req: StopRequest,
    nonce: Option<&str>,
) -> Result<Machine, AgentError> {
    submit_with_stop(agent, id, req, nonce, |signal, timeout_ms| {
        OpKind::Restart { signal, timeout_ms }
    })
    .await
}

/// Submits an operation that stops the workload first, with the signal and timeout of
/// the request or, failing that, of the machine's config.
async fn submit_with_stop(
    agent: &Agent,
    id: &str,
    req: StopRequest,
    nonce: Option<&str>,
    kind: fn(i32, u64) -> OpKind,
) -> Result<Machine, AgentError> {
    submit(agent, id, nonce, kind(0, 0), |rec| {
        let (signal, timeout) = stop_params(&rec.config, &req);
        Ok(Some(kind(signal.0, timeout.as_millis() as u64)))
    })
    .await
}

/// Destroys a machine: gracefully (stop first), or at once with `force`.
pub async fn destroy_machine(
    agent: &Agent,
    id: &str,
    force: bool,
    nonce: Option<&str>,
) -> Result<Machine, AgentError> {
    submit(agent, id, nonce, OpKind::Destroy { force }, |_| Ok(None)).await
}

/// Replaces a machine's config with a new version and relaunches it (unless
/// `skip_launch`).
pub async fn update_machine(
    agent: &Agent,
    id: &str,
    req: UpdateRequest,
    nonce: Option<&str>,
) -> Result<Machine, AgentError> {
    let resources = validate_config(&req.config)?;
    let mut ledger = agent.write_lock().await;
    let mut rec = agent.load_live(id)?;
    refuse_moving(agent, id)?;
    check_lease(&rec, nonce, agent.now_ms())?;
    if let Some(expected) = &req.current_version {
        if *expected != rec.instance_id {
            return Err(AgentError::Conflict(format!(
                "current_version {expected} does not match the machine's version {}",
                rec.instance_id
            )));
        }
    }
    if bazaar_types::volume::mount_of(&req.config) != bazaar_types::volume::mount_of(&rec.config) {
        return Err(AgentError::Invalid(
            "config.mounts cannot be changed by an update; create a new machine".into(),
        ));
    }
    if let Some(region) = req.region.as_deref().filter(|r| !r.is_empty()) {
        if region != rec.region {
            return Err(AgentError::Invalid(format!(
                "region {region}: an update cannot move machine {id} out of {}; a machine stays on its host (its id, volume and state live there). Create a machine in {region} with this config and destroy this one",
                rec.region
            )));
        }
    }
    if let Some(name) = req.name.as_deref().filter(|n| !n.is_empty()) {
        if name != rec.name {
            return Err(AgentError::Invalid(format!(
                "name {name:?}: a machine's name cannot be changed by an update (it is {:?}); create a machine with the new name",
                rec.name
            )));
        }
    }
    if let Some(ttl) = req.lease_ttl {
        crate::leases::new_lease(&rec, ttl, "", None, agent.now_ms())?;
    }
    // The caller holds the lease (checked above) or there is none: a lease_ttl refreshes
    // it under the same nonce, or takes a new one.
    let held_nonce = rec
        .lease
        .as_ref()
        .filter(|l| l.expires_at * 1000 > agent.now_ms())
        .map(|l| l.nonce.clone());
    let kind = OpKind::Update {
        skip_launch: req.skip_launch,
        previous_instance_id: rec.instance_id.clone(),
    };
    let desired = check_transition(rec.desired, kind.action())?;
    let place = agent.actors().reserve(id)?;
    let previous_resources = rec.resources;
    // A preempted machine that an update launches takes its resources again first.
    let was_preempted = rec.preempted_by.is_some() && !req.skip_launch;
    // A change of class between `batch` and the others moves the machine between the
    // ledger's pools (when the host reclaims).
    let previous_pool = crate::agent::pool_of(&rec.config);
    let pool = crate::agent::pool_of(&req.config);
    if resources != previous_resources || was_preempted || pool != previous_pool {
        ledger
            .commit_in(id, resources, pool)
            .map_err(capacity_error)?;
    }
    if was_preempted {
        rec.preempted_by = None;
        rec.displaced_running = false;
    }
    let undo = |ledger: &mut bazaar_placement::Ledger| {
        if was_preempted {
            ledger.uncommit(id);
        } else {
            ledger.restore_in(id, previous_resources, previous_pool);
        }
    };
    let previous = rec.clone();
    rec.config = req.config.clone();
    rec.resources = resources;
    rec.instance_id = ids::new_instance_id();
    rec.desired = if req.skip_launch {
        MachineState::Stopped
    } else {
        desired
    };
    rec.updated_at_ms = agent.now_ms();
    if req.skip_service_registration {
        rec.cordoned = true;
    }
    if let Some(ttl) = req.lease_ttl {
        rec.lease = Some(crate::leases::new_lease(
            &rec,
            ttl,
            "",
            held_nonce.as_deref(),
            agent.now_ms(),
        )?);
    }
    if let Err(err) = agent
        .assign_ports(&mut rec)
        .and_then(|()| agent.assign_user(&mut rec))
    {
        undo(&mut ledger);
        return Err(err);
    }
    let op = agent.new_op(&mut rec, kind, "user");
    let mut b = Batch::default();
    b.version(id, &rec.instance_id, &rec.config)
        .event(&mut rec, MachineEvent::new("update", "updating", "user"));
    b.machine(&rec).op(&op);
    if let Err(err) = agent.commit(b).await {
        undo(&mut ledger);
        return Err(err);
    }
    let freed: Vec<u16> = previous
        .host_ports
        .values()
        .filter(|p| !rec.host_ports.values().any(|q| q == *p))
        .copied()
        .collect();
    agent.release_host_ports(&freed);
    drop(ledger);
    let mut machine = enqueue(agent, &rec, op, place).await?;
    if req.lease_ttl.is_some() {
        machine.nonce = rec.lease.as_ref().map(|l| l.nonce.clone());
    }
    Ok(machine)
}

/// Sends a signal to a started machine's workload (not an operation: nothing to resume).
pub async fn signal_machine(
    agent: &Agent,
    id: &str,
    signal: Signal,
    nonce: Option<&str>,
) -> Result<(), AgentError> {
    let rec = agent.load_live(id)?;
    check_lease(&rec, nonce, agent.now_ms())?;
    let state = agent.current_state(&rec);
    check_transition(state, bazaar_types::state::Action::Signal)?;
    let run = rec
        .run
        .filter(|r| r.run_id > rec.exit_handled_run)
        .ok_or_else(|| AgentError::Conflict(format!("machine {id} has no running process")))?;
    let handle = agent
        .machine_driver()
        .adopt(id, run.run_id)
        .map_err(|e| AgentError::Internal(e.to_string()))?
        .ok_or_else(|| AgentError::Conflict(format!("machine {id} has no running process")))?;
    handle
        .signal(signal.0)
        .map_err(|e| AgentError::Internal(e.to_string()))
}

/// Validates `kind` against the machine's desired state and queues it.
async fn submit(
    agent: &Agent,
    id: &str,
    nonce: Option<&str>,
    kind: OpKind,
    refine: impl FnOnce(&MachineRecord) -> Result<Option<OpKind>, AgentError>,
) -> Result<Machine, AgentError> {
    submit_as(agent, id, nonce, kind, refine, false).await
}

/// Refuses an operation on a displaced machine that this host is moving to another host
/// (or has moved; `preempt::hold_for_move`): the caller's catalog has not seen the move yet.
fn refuse_moving(agent: &Agent, id: &str) -> Result<(), AgentError> {
    if agent.preemptions().moving(id) {
        return Err(AgentError::Conflict(format!(
            "machine {id} was displaced here and is being moved to another host; try again"
        )));
    }
    Ok(())
}

/// Destroys this host's copy of a machine that was moved to another host (the fence),
/// which no other operation may touch while it moves.
pub(crate) async fn destroy_moved(agent: &Agent, id: &str) -> Result<Machine, AgentError> {
    let destroyed = submit_as(
        agent,
        id,
        None,
        OpKind::Destroy { force: true },
        |_| Ok(None),
        true,
    )
    .await;
    if destroyed.is_ok() {
        agent.preemptions().end_move(id);
    }
    destroyed
}

/// [`submit`], by the mover of a displaced machine when `mover`.
async fn submit_as(
    agent: &Agent,
    id: &str,
    nonce: Option<&str>,
    kind: OpKind,
    refine: impl FnOnce(&MachineRecord) -> Result<Option<OpKind>, AgentError>,
    mover: bool,
) -> Result<Machine, AgentError> {
    let mut ledger = agent.write_lock().await;
    let mut rec = agent.load_live(id)?;
    let kind = refine(&rec)?.unwrap_or(kind);
    if !mover {
        refuse_moving(agent, id)?;
    }
    // A preempted machine gave its resources away: starting it takes them again, or is
    // refused for capacity (`preempt.rs`).
    let recommit =
        rec.preempted_by.is_some() && matches!(kind.action(), bazaar_types::state::Action::Start);
    let op = accept(
        &mut rec,
        kind,
        nonce,
        agent.next_op_id(),
        "user",
        agent.now_ms(),
    )?;
    let place = agent.actors().reserve(id)?;
    if recommit {
        ledger
            .commit_in(id, rec.resources, crate::agent::pool_of(&rec.config))
            .map_err(crate::error::capacity_error)?;
        rec.preempted_by = None;
        rec.displaced_running = false;
    }
    let mut b = Batch::default();
    b.machine(&rec).op(&op);
    if let Err(err) = agent.commit(b).await {
        if recommit {
            ledger.uncommit(id);
        }
        return Err(err);
    }
    drop(ledger);
    enqueue(agent, &rec, op, place).await
}

/// Hands a recorded operation to the machine's actor, in the place `place` taken in its
/// channel before the operation was recorded.
pub(crate) async fn enqueue(
    agent: &Agent,
    rec: &MachineRecord,
    op: Operation,
    place: OwnedPermit<ActorMsg>,
) -> Result<Machine, AgentError> {
    agent.crash_at(op.kind.name(), 0);
    tracing::debug!(machine.id = %rec.id, op = op.kind.name(), "operation accepted");
    // Shown from the moment the operation is accepted (the actor may not have begun it
    // yet): a `wait` right after a restart must not find the machine still `started`
    // from before it. Set before the actor can see the operation, so that its end
    // (which clears the state) comes after this.
    if !op.kind.steps().is_empty() {
        agent.show_operation_state(&rec.id, op.kind.transient_state());
    }
    place.send(ActorMsg::Op(op));
    agent.machine(&rec.id).await
}

pub(crate) fn stop_params(config: &MachineConfig, req: &StopRequest) -> (Signal, Duration) {
    let (sig, timeout) = config.stop_signal_and_timeout();
    (
        req.signal.unwrap_or(sig),
        req.timeout
            .map(|t| t.get())
            .unwrap_or(timeout)
            .min(bazaar_types::config::MAX_STOP_TIMEOUT),
    )
}

/// Validates a config and returns the resources it needs (`bazaar_admission`).
pub fn validate_config(config: &MachineConfig) -> Result<Resources, AgentError> {
    bazaar_admission::validate(config).map_err(|refusal| match refusal {
        bazaar_admission::Refusal::Invalid(why) => AgentError::Invalid(why),
        bazaar_admission::Refusal::Capacity(why) => AgentError::Capacity(why),
    })
}
