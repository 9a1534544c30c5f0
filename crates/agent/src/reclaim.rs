//! Oversubscription with reclamation on this host (issue 34 item 3, docs/POLICY.md
//! "Reclamation"): the I/O shell around the ledger's pure rule. With `[reclaim] enabled`,
//! every `interval` it reads each machine's cgroup ([`crate::usage`]: CPU time, memory
//! working set), turns the readings into use ([`bazaar_placement::reclaim::Meter`]) and
//! hands it to the ledger, whose services' reservations decay towards use plus a margin
//! and rise again with it (`Ledger::observe`, `Ledger::restarted`). The batch machines the
//! ledger evicts to make a grown reservation fit are stopped here, newest first, each with
//! a `reclaimed` event naming the service, unless throttling their CPU is enough
//! ([`crate::throttle`]); like a preempted machine they hold nothing
//! until they start again (`preempted_by`), and a start then needs room in the reclaimed
//! pool. The host's row then advertises the new room (`publish.rs`).
//!
//! With `[burst] enabled`, the same readings step each started shared-CPU machine's burst
//! balance (`bazaar_placement::burst`, Fly's model) and its cgroup's CPU limit is set to
//! its vCPUs or its baseline when that changes. Functions of the agent's narrow API.

use crate::agent::Agent;
use crate::error::AgentError;
use crate::record::OpKind;
use crate::store::Batch;
use crate::throttle::{CpuCaps, Planned};
use bazaar_placement::burst::Shares;
use bazaar_placement::ledger::Eviction;
use bazaar_placement::reclaim::{Meter, Reading};
use bazaar_types::event::MachineEvent;
use bazaar_types::state::{check_transition, Action, MachineState};
use std::collections::HashMap;
use std::time::Duration;

/// Starts the reclamation loop when the host reclaims.
pub(crate) fn spawn(agent: &Agent) {
    if !agent.config().reclaim.enabled && !agent.config().burst.enabled {
        return;
    }
    let agent = agent.clone();
    let shutdown = agent.shutdown_token();
    let interval = agent
        .config()
        .reclaim
        .interval
        .max(Duration::from_millis(10));
    agent.tracker().clone().spawn(async move {
        let mut meter = Meter::default();
        let mut shares = Shares::default();
        let mut caps = CpuCaps::default();
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            if agent.config().burst.enabled {
                if let Err(err) = burst_round(&agent, &mut shares, &mut caps).await {
                    tracing::warn!(error = %err, "accounting shared CPU bursts");
                }
            }
            if !agent.config().reclaim.enabled {
                continue;
            }
            if let Err(err) = round(&agent, &mut meter, &mut caps).await {
                tracing::warn!(error = %err, "measuring machines for reclamation");
            }
        }
    });
}

/// One measurement of every machine this host holds, and the batch machines it evicts
/// stopped.
pub(crate) async fn round(
    agent: &Agent,
    meter: &mut Meter,
    caps: &mut CpuCaps,
) -> Result<(), AgentError> {
    let targets: Vec<(String, bool, Option<String>)> = agent
        .store()
        .machines()?
        .into_iter()
        .filter(|m| m.state != MachineState::Destroyed)
        .map(|m| {
            let started = agent.current_state(&m) == MachineState::Started;
            let cgroup = agent.driver().machine_cgroup(&m.id, m.config.runs_image());
            (m.id, started, cgroup)
        })
        .collect();
    let cgroups: HashMap<String, Option<String>> = targets
        .iter()
        .map(|(id, _, cgroup)| (id.clone(), cgroup.clone()))
        .collect();
    let probe = agent.usage_probe().clone();
    let samples = tokio::task::spawn_blocking(move || {
        targets
            .into_iter()
            .map(|(id, started, cgroup)| {
                let sample = started
                    .then(|| probe.sample(&id, cgroup.as_deref()))
                    .flatten()
                    .map(|s| (s.cpu_usec, s.memory_bytes.div_ceil(1 << 20)));
                (id, started, sample)
            })
            .collect::<Vec<_>>()
    })
    .await?;
    let now_us = agent.now_ms().saturating_mul(1000);
    let mut ledger = agent.write_lock().await;
    for (id, started, sample) in &samples {
        match meter.read(id, *started, *sample, now_us) {
            Reading::Nothing => {}
            Reading::Restarted => ledger.restarted(id),
            Reading::Use(used) => ledger.observe(id, used),
        }
    }
    ledger.rebalance_batch_cpu();
    meter.retain(|id| samples.iter().any(|(m, _, _)| m == id));
    let evicted = ledger.take_evictions();
    let mut stops = Vec::new();
    for e in &evicted {
        match mark_reclaimed(agent, e).await {
            Ok(stop) => stops.push(stop),
            Err(err) => {
                tracing::warn!(machine.id = %e.machine_id, error = %err, "stopping a reclaimed batch machine")
            }
        }
    }
    // A machine marked as holding nothing (reclaimed or preempted) that still runs with no
    // stop queued (its actor was busy when it was marked) is stopped now.
    for (id, started, _) in &samples {
        if !*started || evicted.iter().any(|e| e.machine_id == *id) {
            continue;
        }
        let Ok(mut rec) = agent.load_live(id) else {
            continue;
        };
        if rec.preempted_by.is_none() {
            continue;
        }
        let mut b = Batch::default();
        if let Some(stop) = queue_stop(agent, &mut rec, &mut b) {
            rec.displaced_running = true;
            b.machine(&rec);
            match agent.commit(b).await {
                Ok(()) => stops.push((rec, Some(stop))),
                Err(err) => {
                    tracing::warn!(machine.id = %id, error = %err, "stopping a reclaimed machine")
                }
            }
        }
    }
    // The batch machines left, throttled or not (the ledger's share).
    let plan: Vec<Planned> = samples
        .iter()
        .filter(|(id, started, _)| *started && ledger.in_batch_pool(id))
        .map(|(id, _, _)| Planned {
            id: id.clone(),
            cpus: ledger.committed_to(id).map_or(1, |r| r.cpus),
            limit: ledger.batch_cpu_limit(id),
            cgroup: cgroups.get(id).cloned().flatten(),
        })
        .collect();
    let share = ledger.batch_cpu_share();
    let for_machine = ledger.throttled_for().map(str::to_string);
    drop(ledger);
    crate::throttle::apply(agent, caps, plan, share, for_machine).await;
    for (rec, stop) in stops {
        tracing::info!(machine.id = %rec.id, "batch machine stopped: its room was reclaimed");
        if let Some((op, place)) = stop {
            crate::operations::enqueue(agent, &rec, op, place).await?;
        }
        agent.publish(&rec);
    }
    crate::publish::publish_host(agent).await;
    Ok(())
}

/// A shared machine read: id, vCPUs, started, cgroup, CPU time (µs).
type SharedReading = (String, u32, bool, Option<String>, Option<u64>);

/// Steps the burst balance of every shared-CPU machine and writes the limits that changed.
pub(crate) async fn burst_round(
    agent: &Agent,
    shares: &mut Shares,
    caps: &mut CpuCaps,
) -> Result<(), AgentError> {
    let rule = agent.config().burst.rule();
    // (id, shared vCPUs, started, cgroup)
    let targets: Vec<(String, u32, bool, Option<String>)> = agent
        .store()
        .machines()?
        .into_iter()
        .filter(|m| m.state != MachineState::Destroyed)
        .filter_map(|m| {
            let guest = match (&m.config.guest, &m.config.size) {
                (Some(g), _) => g.clone(),
                (None, Some(size)) => bazaar_types::guest::Guest::preset(size).ok()?,
                (None, None) => bazaar_types::guest::Guest::default(),
            };
            let size = guest.validate().ok()?;
            if size.performance {
                return None;
            }
            let started = agent.current_state(&m) == MachineState::Started;
            let cgroup = agent.driver().machine_cgroup(&m.id, m.config.runs_image());
            Some((m.id, size.cpus, started, cgroup))
        })
        .collect();
    let now_us = agent.now_ms().saturating_mul(1000);
    let probe = agent.usage_probe().clone();
    let read: Vec<SharedReading> = tokio::task::spawn_blocking(move || {
        targets
            .into_iter()
            .map(|(id, cpus, started, cgroup)| {
                let used = started
                    .then(|| probe.sample(&id, cgroup.as_deref()))
                    .flatten()
                    .map(|s| s.cpu_usec);
                (id, cpus, started, cgroup, used)
            })
            .collect()
    })
    .await?;
    shares.retain(|id| read.iter().any(|(m, ..)| m == id));
    caps.retain_burst(|id| read.iter().any(|(m, ..)| m == id));
    let mut writes = Vec::new();
    for (id, cpus, started, cgroup, used) in read {
        match used {
            Some(cpu_usec) if started => {
                if let Some(limit) = shares.read(&rule, &id, cpus, cpu_usec, now_us) {
                    let cores = caps.with_burst(&id, limit.cores());
                    writes.push((id, cgroup, limit, cores));
                }
            }
            _ => shares.not_running(&id, cpus),
        }
    }
    if writes.is_empty() {
        return Ok(());
    }
    let probe = agent.usage_probe().clone();
    tokio::task::spawn_blocking(move || {
        for (id, cgroup, limit, cores) in writes {
            if probe.limit_cpu(&id, cgroup.as_deref(), cores) {
                tracing::info!(machine.id = %id, ?limit, "shared CPU limit");
            }
        }
    })
    .await?;
    Ok(())
}

type Stop = (
    crate::record::MachineRecord,
    Option<(
        crate::record::Operation,
        tokio::sync::mpsc::OwnedPermit<crate::registry::ActorMsg>,
    )>,
);

/// Records that batch machine `e.machine_id` was evicted for `e.for_machine`'s
/// reservation (its event, `preempted_by`) and, when it runs, its stop operation; the
/// caller holds the write lock and enqueues the stop after.
async fn mark_reclaimed(agent: &Agent, e: &Eviction) -> Result<Stop, AgentError> {
    let mut rec = agent.load_live(&e.machine_id)?;
    let status = format!(
        "stopped for machine {}'s reservation (reclamation)",
        e.for_machine
    );
    rec.preempted_by = Some(e.for_machine.clone());
    rec.updated_at_ms = agent.now_ms();
    let mut b = Batch::default();
    b.event(&mut rec, MachineEvent::new("reclaimed", &status, "bazaar"));
    let stop = queue_stop(agent, &mut rec, &mut b);
    rec.displaced_running = agent.current_state(&rec) != MachineState::Stopped;
    b.machine(&rec);
    agent.commit(b).await?;
    Ok((rec, stop))
}

/// The stop operation of `rec` when it runs and none is queued, put in `b`; `None` also
/// when its actor cannot take one now (the next round tries again: the record says it
/// holds nothing).
fn queue_stop(
    agent: &Agent,
    rec: &mut crate::record::MachineRecord,
    b: &mut Batch,
) -> Option<(
    crate::record::Operation,
    tokio::sync::mpsc::OwnedPermit<crate::registry::ActorMsg>,
)> {
    if agent.current_state(rec) == MachineState::Stopped {
        return None;
    }
    let desired = check_transition(rec.desired, Action::Stop).ok()?;
    let place = match agent.actors().reserve(&rec.id) {
        Ok(place) => place,
        Err(err) => {
            tracing::warn!(machine.id = %rec.id, error = %err, "a reclaimed machine's stop waits for the next round");
            return None;
        }
    };
    rec.desired = desired;
    let (signal, timeout) = crate::operations::stop_params(&rec.config, &Default::default());
    let kind = OpKind::Stop {
        signal: signal.0,
        timeout_ms: timeout.as_millis() as u64,
    };
    let op = agent.new_op(rec, kind, "bazaar");
    b.op(&op);
    Some((op, place))
}
