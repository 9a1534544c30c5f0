//! The host's side of the market and machine creation: bids (reservations in the ledger),
//! releases, claims that turn a reservation into a machine, and direct creates. A create is
//! validated and written in one transaction with its first operation before it is answered
//! ([`crate::create`] builds both).

use crate::agent::Agent;
use crate::error::capacity_error;
use crate::error::AgentError;
use bazaar_placement::LedgerError;
use bazaar_types::host::{BidRequest, BidResponse, ClaimRequest, Resources};
use bazaar_types::ids;
use bazaar_types::machine::Machine;
use std::time::Duration;

/// Answers a bid request from exact local state: a reservation and a score, or a
/// refusal with the reason.
pub async fn bid(agent: &Agent, req: BidRequest) -> Result<BidResponse, AgentError> {
    if req.memory_mb == 0 || req.cpus == 0 {
        return Err(AgentError::Invalid(
            "a bid needs cpus and memory_mb greater than zero".into(),
        ));
    }
    if agent.is_shutting_down() {
        return Ok(BidResponse::Refusal {
            host_id: agent.host_id().to_string(),
            reason: "host is shutting down".into(),
            retryable: false,
        });
    }
    if let Some((driver, why)) = req
        .driver
        .as_deref()
        .and_then(|d| Some((d, agent.cannot_run(d)?)))
    {
        return Ok(BidResponse::Refusal {
            host_id: agent.host_id().to_string(),
            reason: format!("cannot run {driver} machines: missing {why}"),
            retryable: false,
        });
    }
    if let Some(why) = agent.network_full() {
        return Ok(BidResponse::Refusal {
            host_id: agent.host_id().to_string(),
            reason: why,
            retryable: false,
        });
    }
    let ttl =
        Duration::from_millis(req.ttl_ms.unwrap_or(u64::MAX)).min(agent.config().reservation_ttl);
    let want = Resources {
        cpus: req.cpus,
        memory_mb: req.memory_mb,
    };
    let id = ids::new_reservation_id();
    let expires_at_ms = agent.now_ms() + ttl.as_millis() as u64;
    let mut ledger = agent.write_lock().await;
    // Open reservations live in memory only: losing them in a crash is the same as
    // their expiry, which the exchange handles (the claim fails, the next offer is
    // taken). Claimed ones are persisted with the machine they became.
    let pool = bazaar_placement::ledger::Pool::for_priority(req.priority.unwrap_or_default());
    match ledger.reserve_in(&id, want, expires_at_ms, pool) {
        Ok((_, score)) => Ok(BidResponse::Bid {
            host_id: agent.host_id().to_string(),
            reservation_id: id,
            score,
            expires_at_ms,
            free: ledger.free(),
            victims: Vec::new(),
        }),
        Err(err) if req.preempt && !matches!(err, LedgerError::Draining) => {
            crate::preempt::preemption_bid(agent, &mut ledger, &req, id, want, expires_at_ms)
        }
        Err(err) => Ok(BidResponse::Refusal {
            host_id: agent.host_id().to_string(),
            reason: err.to_string(),
            retryable: !matches!(err, LedgerError::Draining)
                && ledger.fits_without_reservations(want),
        }),
    }
}

/// Returns an unclaimed reservation.
pub async fn release(agent: &Agent, reservation_id: &str) -> Result<(), AgentError> {
    let mut ledger = agent.write_lock().await;
    if agent.preemptions().release(&mut ledger, reservation_id) {
        return Ok(());
    }
    match ledger.reservation(reservation_id) {
        None => return Err(AgentError::ReservationNotFound(reservation_id.into())),
        Some(r) if r.claimed_by.is_some() => {
            return Err(AgentError::Conflict(format!(
                "reservation {reservation_id} was claimed and cannot be released"
            )))
        }
        Some(_) => {}
    }
    ledger.release(reservation_id);
    Ok(())
}

/// Turns a reservation into a machine. Idempotent: claiming a reservation again returns
/// the machine it became.
pub async fn claim(
    agent: &Agent,
    reservation_id: &str,
    req: ClaimRequest,
) -> Result<Machine, AgentError> {
    // Fault injection: a host that dies between its bid and the claim.
    agent.crash_at("claim", 0);
    if agent.preemptions().contains(reservation_id) {
        return crate::preempt::claim_preemption(agent, reservation_id, req).await;
    }
    let mut ledger = agent.write_lock().await;
    let reservation = ledger
        .reservation(reservation_id)
        .cloned()
        .ok_or_else(|| AgentError::ReservationNotFound(reservation_id.into()))?;
    if let Some(existing) = &reservation.claimed_by {
        if req.machine_id.as_deref().is_some_and(|m| m != existing) {
            return Err(AgentError::Conflict(format!(
                "reservation {reservation_id} was already claimed by machine {existing}"
            )));
        }
        drop(ledger);
        return agent.machine(existing).await;
    }
    let (rec, op, mut batch) = crate::create::prepare(agent, &req)?;
    if rec.resources != reservation.resources {
        agent.release_ports(&rec);
        return Err(AgentError::Invalid(format!(
            "the machine needs {} cpus / {} MB but reservation {reservation_id} holds {} cpus / {} MB",
            rec.resources.cpus,
            rec.resources.memory_mb,
            reservation.resources.cpus,
            reservation.resources.memory_mb
        )));
    }
    ledger
        .claim(reservation_id, &rec.id)
        .map_err(|e| AgentError::Conflict(e.to_string()))?;
    let mut claimed = reservation.clone();
    claimed.claimed_by = Some(rec.id.clone());
    batch.reservation(&claimed);
    if let Err(err) = agent.commit(batch).await {
        ledger.uncommit(&rec.id);
        ledger.restore_reservation(reservation);
        agent.release_ports(&rec);
        return Err(err);
    }
    drop(ledger);
    Ok(crate::create::accepted(agent, rec, op).await)
}

/// Creates a machine here directly (a reservation and its claim in one step).
pub async fn create(agent: &Agent, req: ClaimRequest) -> Result<Machine, AgentError> {
    let mut ledger = agent.write_lock().await;
    if let Some(id) = &req.machine_id {
        if agent.store().machine(id)?.is_some() {
            drop(ledger);
            return agent.machine(id).await;
        }
    }
    if agent.draining_flag() {
        return Err(AgentError::Conflict(crate::drain::REFUSAL.into()));
    }
    let (rec, op, batch) = crate::create::prepare(agent, &req)?;
    let pool = crate::agent::pool_of(&rec.config);
    if let Err(err) = ledger.commit_in(&rec.id, rec.resources, pool) {
        agent.release_ports(&rec);
        return Err(capacity_error(err));
    }
    if let Err(err) = agent.commit(batch).await {
        ledger.uncommit(&rec.id);
        agent.release_ports(&rec);
        return Err(err);
    }
    drop(ledger);
    Ok(crate::create::accepted(agent, rec, op).await)
}
