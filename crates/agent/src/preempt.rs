//! Preemption on the host (issue 34 item 1, docs/POLICY.md): a bid from a host without room
//! that names the lower-class machines it would stop (`bazaar_placement::preemption`'s
//! rule), held as a `Preemption` in the ledger; its claim stops the victims, each with a
//! `preempted` event naming the preemptor, moves what each held into the bid as it stops,
//! and commits the new machine. A preempted machine holds no commitment until it starts
//! again (the start commits it first, or is refused for capacity), so its resources are the
//! preemptor's; the record's `preempted_by` says so across restarts of the agent. The open
//! bids are the agent's part [`crate::preemptions`]; these functions use the agent's
//! narrow API.

use crate::agent::Agent;
use crate::error::AgentError;
use crate::record::OpKind;
use crate::store::Batch;
use bazaar_placement::preemption::{choose_victims, Preemption};
use bazaar_placement::Ledger;
use bazaar_types::event::MachineEvent;
use bazaar_types::host::{BidRequest, BidResponse, ClaimRequest, Resources, Victim};
use bazaar_types::machine::Machine;
use bazaar_types::priority::Priority;
use bazaar_types::state::{check_transition, Action, MachineState};
use std::time::Duration;

/// How long a claim waits for a victim to stop beyond its own stop timeout.
const STOP_MARGIN: Duration = Duration::from_secs(10);

/// A preemption bid for `want`, which the ledger has no room for: the victims the rule
/// chooses among this host's machines of a lower class than `req.priority` (not those
/// already preempted or named by another open bid), or a refusal.
pub(crate) fn preemption_bid(
    agent: &Agent,
    ledger: &mut Ledger,
    req: &BidRequest,
    id: String,
    want: Resources,
    expires_at_ms: u64,
) -> Result<BidResponse, AgentError> {
    let priority = req.priority.unwrap_or_default();
    // Bids never claimed nor released (the exchange went away) end at their expiry.
    let named = agent.preemptions().expire(ledger, agent.now_ms());
    let running: Vec<Victim> = agent
        .store()
        .machines()?
        .into_iter()
        .filter(|m| m.state != MachineState::Destroyed && m.preempted_by.is_none())
        .filter(|m| !named.contains(&m.id))
        // A batch machine on reclaimed room holds nothing services are placed against.
        .filter(|m| !ledger.in_batch_pool(&m.id))
        .map(|m| Victim {
            priority: m.config.priority(),
            machine_id: m.id,
            resources: m.resources,
            created_at_ms: m.created_at_ms,
        })
        .collect();
    let victims = match choose_victims(ledger.free(), want, priority, &running) {
        Some(v) if !v.is_empty() => v,
        _ => {
            return Ok(BidResponse::Refusal {
                host_id: agent.host_id().to_string(),
                reason: format!(
                    "no room, and stopping every machine below class {priority} here would not make room"
                ),
                retryable: false,
            })
        }
    };
    let ids: Vec<String> = victims.iter().map(|v| v.machine_id.clone()).collect();
    let p = Preemption::reserve(ledger, &id, want, ids, expires_at_ms)
        .map_err(|e| AgentError::Internal(e.to_string()))?;
    // The share of the host left free once the victims are gone and the machine is in.
    let freed = victims.iter().fold(ledger.free(), |f, v| Resources {
        cpus: f.cpus + v.resources.cpus,
        memory_mb: f.memory_mb + v.resources.memory_mb,
    });
    let cap = ledger.capacity();
    let score = freed.memory_mb.saturating_sub(want.memory_mb) as f64 / cap.memory_mb.max(1) as f64;
    agent.preemptions().insert(id.clone(), p);
    Ok(BidResponse::Bid {
        host_id: agent.host_id().to_string(),
        reservation_id: id,
        score,
        expires_at_ms,
        free: ledger.free(),
        victims,
    })
}

/// Claims a preemption bid: stops its victims (each with a `preempted` event naming
/// the machine), waits until they have stopped, then makes the machine with what they
/// held. Victims already stopped stay stopped if the claim fails after them.
pub(crate) async fn claim_preemption(
    agent: &Agent,
    reservation_id: &str,
    req: ClaimRequest,
) -> Result<Machine, AgentError> {
    let preemptor = req
        .machine_id
        .clone()
        .ok_or_else(|| AgentError::Invalid("a preemption claim must name its machine id".into()))?;
    if agent.store().machine(&preemptor)?.is_some() {
        return agent.machine(&preemptor).await;
    }
    // Claimed: another bid's clean-up must not end it while its victims stop.
    let victims = agent
        .preemptions()
        .hold(reservation_id)
        .ok_or_else(|| AgentError::ReservationNotFound(reservation_id.into()))?;
    let class = req.config.priority();
    let result = stop_victims(agent, &victims, &preemptor, class).await;
    let mut ledger = agent.write_lock().await;
    let Some(mut p) = agent.preemptions().take(reservation_id) else {
        return Err(AgentError::ReservationNotFound(reservation_id.into()));
    };
    let stopped = match result {
        Ok(()) => victims.clone(),
        Err(err) => {
            // The victims that did stop are preempted: they hold nothing.
            for v in &victims {
                let rec = agent.load_live(v);
                if rec.is_ok_and(|r| agent.current_state(&r) == MachineState::Stopped) {
                    ledger.uncommit(v);
                }
            }
            p.release(&mut ledger);
            return Err(err);
        }
    };
    for v in &stopped {
        if let Err(e) = p.victim_stopped(&mut ledger, v) {
            p.release(&mut ledger);
            return Err(AgentError::Internal(e.to_string()));
        }
    }
    let (rec, op, batch) = match crate::create::prepare(agent, &req) {
        Ok(x) => x,
        Err(err) => {
            p.release(&mut ledger);
            return Err(err);
        }
    };
    if rec.resources != p.want {
        let want = p.want;
        p.release(&mut ledger);
        agent.release_ports(&rec);
        return Err(AgentError::Invalid(format!(
            "the machine needs {} cpus / {} MB but preemption bid {reservation_id} holds {} cpus / {} MB",
            rec.resources.cpus, rec.resources.memory_mb, want.cpus, want.memory_mb
        )));
    }
    if let Err(err) = p.claim(&mut ledger, &rec.id) {
        p.release(&mut ledger);
        agent.release_ports(&rec);
        return Err(AgentError::Conflict(err.to_string()));
    }
    if let Err(err) = agent.commit(batch).await {
        ledger.uncommit(&rec.id);
        agent.release_ports(&rec);
        return Err(err);
    }
    drop(ledger);
    tracing::info!(machine.id = %rec.id, victims = ?stopped, "machine placed by preemption");
    Ok(crate::create::accepted(agent, rec, op).await)
}

/// Marks each victim preempted by `preemptor` with its event, stops those running, and
/// waits until they have stopped.
async fn stop_victims(
    agent: &Agent,
    victims: &[String],
    preemptor: &str,
    class: Priority,
) -> Result<(), AgentError> {
    let mut waits = Vec::new();
    for v in victims {
        let ledger = agent.write_lock().await;
        let mut rec = agent.load_live(v)?;
        let status = format!("stopped for machine {preemptor} ({class}) by preemption");
        rec.preempted_by = Some(preemptor.to_string());
        rec.updated_at_ms = agent.now_ms();
        let mut b = Batch::default();
        b.event(&mut rec, MachineEvent::new("preempted", &status, "bazaar"));
        let running = agent.current_state(&rec) != MachineState::Stopped;
        let stop = match check_transition(rec.desired, Action::Stop) {
            Ok(desired) if running => {
                let place = agent.actors().reserve(v)?;
                rec.desired = desired;
                let (signal, timeout) =
                    crate::operations::stop_params(&rec.config, &Default::default());
                let kind = OpKind::Stop {
                    signal: signal.0,
                    timeout_ms: timeout.as_millis() as u64,
                };
                let op = agent.new_op(&mut rec, kind, "bazaar");
                b.op(&op);
                waits.push((v.clone(), timeout + STOP_MARGIN));
                rec.displaced_running = true;
                Some((op, place))
            }
            _ => None,
        };
        b.machine(&rec);
        agent.commit(b).await?;
        drop(ledger);
        if let Some((op, place)) = stop {
            crate::operations::enqueue(agent, &rec, op, place).await?;
        }
        agent.publish(&rec);
    }
    for (v, timeout) in waits {
        agent
            .wait(&v, &[MachineState::Stopped], timeout, None, None)
            .await?;
    }
    Ok(())
}

/// Holds displaced machine `id` for its move to another host (the API's `displaced.rs`):
/// `true` when it is still displaced here (stopped for another machine while it ran, not
/// started or destroyed since), and from now on every other operation on it is refused
/// (409) until [`end_move`] says the move failed or the fence destroys this copy once the
/// new one supersedes it; so no destroy acknowledged here is undone by the move, and no
/// start here makes a second copy.
pub(crate) async fn hold_for_move(agent: &Agent, id: &str) -> Result<bool, AgentError> {
    let _ledger = agent.write_lock().await;
    let Ok(rec) = agent.load_live(id) else {
        return Ok(false);
    };
    let displaced = rec.preempted_by.is_some()
        && rec.displaced_running
        && agent.current_state(&rec) == MachineState::Stopped
        && !agent.preemptions().moving(id);
    if displaced {
        agent.preemptions().start_move(id);
    }
    Ok(displaced)
}

/// Ends the hold of [`hold_for_move`]: a machine not `moved` is this host's again; a moved
/// one stays held until the fence destroys it.
pub(crate) fn end_move(agent: &Agent, id: &str, moved: bool) {
    if !moved {
        agent.preemptions().end_move(id);
    }
}
