//! A machine's creation, shared by the market's claims and direct creates ([`crate::market`])
//! and preemption claims ([`crate::preempt`]): a create request validated and turned into the
//! machine's record, its first operation and the batch that records them; once that batch is
//! written, the machine published and its actor started.

use crate::actor::spawn_actor;
use crate::agent::Agent;
use crate::error::AgentError;
use crate::leases::new_lease;
use crate::operations::{refuse_losing_app, validate_config};
use crate::record::{MachineRecord, OpKind, Operation};
use crate::store::Batch;
use bazaar_types::event::MachineEvent;
use bazaar_types::host::ClaimRequest;
use bazaar_types::ids;
use bazaar_types::machine::Machine;
use bazaar_types::state::MachineState;
use std::collections::BTreeMap;

/// Validates a create request and builds the record, its first operation and the batch
/// that records them (not yet written).
pub(crate) fn prepare(
    agent: &Agent,
    req: &ClaimRequest,
) -> Result<(MachineRecord, Operation, Batch), AgentError> {
    ids::validate_name("app", &req.app).map_err(AgentError::Invalid)?;
    refuse_losing_app(agent, &req.app, &req.app_id)?;
    let name = match &req.name {
        Some(n) => {
            ids::validate_name("machine", n).map_err(AgentError::Invalid)?;
            n.clone()
        }
        None => ids::new_machine_name(),
    };
    if let Some(region) = &req.region {
        if !region.is_empty() && *region != agent.config().region {
            return Err(AgentError::Invalid(format!(
                "this host is in region {}, not {region}",
                agent.config().region
            )));
        }
    }
    let id = match &req.machine_id {
        Some(id) if ids::is_valid_machine_id(id) => id.clone(),
        Some(id) => return Err(AgentError::Invalid(format!("invalid machine id {id:?}"))),
        None => ids::new_machine_id(),
    };
    let resources = validate_config(&req.config)?;
    let driver = req.config.driver();
    if let Some(why) = agent.cannot_run(driver) {
        return Err(AgentError::Invalid(format!(
            "this host cannot run {driver} machines: missing {why}"
        )));
    }
    let now = agent.now_ms();
    let instance_id = ids::new_instance_id();
    let mut rec = MachineRecord {
        id: id.clone(),
        name,
        app: req.app.clone(),
        app_id: req.app_id.clone(),
        region: agent.config().region.clone(),
        state: MachineState::Created,
        desired: if req.skip_launch {
            MachineState::Created
        } else {
            MachineState::Started
        },
        instance_id: instance_id.clone(),
        config: req.config.clone(),
        resources,
        created_at_ms: now,
        updated_at_ms: now,
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
        last_event_id: String::new(),
        last_event_status: String::new(),
        destroyed_at_ms: None,
        lease: None,
        image_ref: None,
        epoch: req.epoch,
        preempted_by: None,
        displaced_running: false,
    };
    rec.cordoned = req.skip_service_registration;
    if let Some(ttl) = req.lease_ttl {
        rec.lease = Some(new_lease(&rec, ttl, "", None, agent.now_ms())?);
    }
    agent.assign_ports(&mut rec)?;
    if let Err(err) = agent.assign_user(&mut rec) {
        agent.release_ports(&rec);
        return Err(err);
    }
    let kind = OpKind::Create {
        skip_launch: req.skip_launch,
    };
    let op = agent.new_op(&mut rec, kind, "user");
    let mut batch = Batch::default();
    batch
        .version(&id, &instance_id, &req.config)
        .event(&mut rec, MachineEvent::new("launch", "created", "user"));
    if let Some(why) = &req.displaced_from {
        batch.event(&mut rec, MachineEvent::new("replaced", why, "bazaar"));
    }
    batch.machine(&rec).op(&op);
    if let Some(p) = &req.placement {
        batch.placement(&id, p);
    }
    if let Err(err) = crate::volumes::attach_volume(agent, &rec, &mut batch) {
        agent.release_ports(&rec);
        return Err(err);
    }
    Ok((rec, op, batch))
}

/// Once the create is written: publishes the machine, starts its actor with the create
/// operation and answers the machine as the create left it.
pub(crate) async fn accepted(agent: &Agent, rec: MachineRecord, op: Operation) -> Machine {
    agent.crash_at(op.kind.name(), 0);
    tracing::info!(machine.id = %rec.id, app = %rec.app, "machine created");
    agent.publish(&rec);
    crate::volumes::publish_attached_volume(agent, &rec);
    let mut machine = agent.view(&rec, agent.store().events(&rec.id, 20).unwrap_or_default());
    machine.nonce = rec.lease.as_ref().map(|l| l.nonce.clone());
    spawn_actor(agent, rec, vec![op], None);
    machine
}
