//! Throttling batch machines on reclaimed room (issue 34 item 3, docs/POLICY.md
//! "Reclamation"): the I/O shell of the ledger's rule (`Ledger::batch_cpu_limit`, over
//! `bazaar_placement::reclaim::cpu_share`). When a service's reservation grows back, the
//! ledger first lowers every batch machine's CPU to one share of its request; after each
//! measurement this writes each started batch machine's limit to its cgroup (`cpu.max`, v1
//! `cpu.cfs_quota_us`) when it changed, and records a `throttled` event when a machine is
//! first held below its request and when it gets it back. With shared CPU bursts on, the
//! lower of the two limits is written. Functions of the agent's narrow API.

use crate::agent::Agent;
use crate::store::Batch;
use bazaar_types::event::MachineEvent;
use std::collections::HashMap;

/// What this host last wrote to each machine's CPU limit, by cause.
#[derive(Debug, Default)]
pub(crate) struct CpuCaps {
    /// Batch machines held below their request: the limit in millicpus.
    throttled: HashMap<String, u64>,
    /// Shared machines' burst limits, in cores.
    burst: HashMap<String, f64>,
}

impl CpuCaps {
    /// The limit to write for a machine whose burst limit is `burst` cores: the lower of it
    /// and the machine's throttle, if any.
    pub(crate) fn with_burst(&mut self, id: &str, burst: f64) -> f64 {
        self.burst.insert(id.to_string(), burst);
        self.throttled
            .get(id)
            .map_or(burst, |m| burst.min(*m as f64 / 1000.0))
    }

    /// Forgets the burst limits of machines that are no longer there.
    pub(crate) fn retain_burst(&mut self, live: impl Fn(&str) -> bool) {
        self.burst.retain(|id, _| live(id));
    }
}

/// One started batch machine after a measurement: its id, its request in whole CPUs, its
/// limit while throttled (millicpus), and its cgroup.
pub(crate) struct Planned {
    pub id: String,
    pub cpus: u32,
    pub limit: Option<u64>,
    pub cgroup: Option<String>,
}

/// Writes the limits that changed in `plan` (the ledger's, `share` per mille, throttled for
/// service `for_machine`) and records the events.
pub(crate) async fn apply(
    agent: &Agent,
    caps: &mut CpuCaps,
    plan: Vec<Planned>,
    share: u64,
    for_machine: Option<String>,
) {
    let live: Vec<String> = plan.iter().map(|p| p.id.clone()).collect();
    caps.throttled.retain(|id, _| live.iter().any(|l| l == id));
    let mut writes = Vec::new();
    for p in plan {
        let before = caps.throttled.get(&p.id).copied();
        if before == p.limit {
            continue;
        }
        let status = match (p.limit, &for_machine) {
            (Some(limit), Some(svc)) if before.is_none() => Some(format!(
                "CPU held at {limit} millicpus ({}.{} % of its request) for machine {svc}'s reservation (reclamation)",
                share / 10,
                share % 10
            )),
            (None, _) => Some("CPU limit back to its request".to_string()),
            _ => None,
        };
        match p.limit {
            Some(limit) => caps.throttled.insert(p.id.clone(), limit),
            None => caps.throttled.remove(&p.id),
        };
        let full = f64::from(p.cpus);
        let cap = p.limit.map_or(full, |m| m as f64 / 1000.0);
        let cores = caps.burst.get(&p.id).map_or(cap, |b| cap.min(*b));
        writes.push((p.id.clone(), p.cgroup, cores));
        if let Some(status) = status {
            record(agent, &p.id, &status).await;
        }
    }
    if writes.is_empty() {
        return;
    }
    let probe = agent.usage_probe().clone();
    let _ = tokio::task::spawn_blocking(move || {
        for (id, cgroup, cores) in writes {
            if probe.limit_cpu(&id, cgroup.as_deref(), cores) {
                tracing::info!(machine.id = %id, cores, "batch machine's CPU limit (reclamation)");
            }
        }
    })
    .await;
}

/// Records a `throttled` event on machine `id`.
async fn record(agent: &Agent, id: &str, status: &str) {
    let _ledger = agent.write_lock().await;
    let Ok(mut rec) = agent.load_live(id) else {
        return;
    };
    let mut b = Batch::default();
    b.event(&mut rec, MachineEvent::new("throttled", status, "bazaar"));
    b.machine(&rec);
    if let Err(err) = agent.commit(b).await {
        tracing::warn!(machine.id = %id, error = %err, "recording a throttled event");
    }
}
