//! Standbys (Fly's `config.standbys`): a stopped (or never started) machine that names
//! other machines in `standbys` is started when the host of one of them is declared dead.
//! Each agent watches the catalog (its change stream, and a periodic look in case a change
//! was missed) for its own standbys. A standby is started once per death of its primary's
//! host: when that host comes back, a later death triggers it again. A host must stay
//! dead for [`CONFIRM`] before its standbys start, so that a brief misreading of the
//! membership (a host just joining) never starts one.

use crate::agent::Agent;
use bazaar_catalog::HostStatus;
use bazaar_types::machine::Machine;
use bazaar_types::state::MachineState;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// Looks at least this often, whatever the change stream says.
const PERIOD: Duration = Duration::from_millis(250);
/// How long a host must have been seen dead before its standbys start.
pub const CONFIRM: Duration = Duration::from_secs(1);

/// Starts the standby watcher of this agent (call once the catalog is attached).
pub fn spawn(agent: &Agent) {
    let agent = agent.clone();
    agent.tracker().clone().spawn(async move {
        let Some(catalog) = agent.catalog().cloned() else {
            return;
        };
        let mut changes = catalog.subscribe();
        let shutdown = agent.shutdown_token();
        // (standby, primary's host) pairs already acted on while that host is dead.
        let mut fired: HashSet<(String, String)> = HashSet::new();
        let mut dead_since: HashMap<String, Instant> = HashMap::new();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = changes.recv() => {}
                () = tokio::time::sleep(PERIOD) => {}
            }
            check(&agent, &catalog, &mut fired, &mut dead_since).await;
        }
    });
}

async fn check(
    agent: &Agent,
    catalog: &bazaar_catalog::Catalog,
    fired: &mut HashSet<(String, String)>,
    dead_since: &mut HashMap<String, Instant>,
) {
    let now = Instant::now();
    let dead: HashSet<String> = catalog
        .hosts()
        .into_iter()
        .filter(|h| h.status == HostStatus::Dead)
        .map(|h| h.record.id)
        .collect();
    dead_since.retain(|h, _| dead.contains(h));
    for h in &dead {
        dead_since.entry(h.clone()).or_insert(now);
    }
    // Forget pairs whose host is no longer dead.
    fired.retain(|(_, host)| dead.contains(host));
    if !dead_since
        .values()
        .any(|t| now.duration_since(*t) >= CONFIRM)
    {
        // No host has been dead long enough: nothing can fire.
        return;
    }
    let mut machines: Vec<Machine> = agent.store().select(|m| {
        (m.state != MachineState::Destroyed && !m.config.standbys.is_empty())
            .then(|| agent.view(m, Vec::new()))
    });
    machines.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
    for m in machines {
        if m.config.standbys.is_empty()
            || !matches!(m.state, MachineState::Stopped | MachineState::Created)
        {
            continue;
        }
        for primary in &m.config.standbys {
            let Some(view) = catalog.machine(primary) else {
                continue;
            };
            let host = view.record.host_id.clone();
            if host == agent.host_id() {
                continue;
            }
            let dead = dead_since
                .get(&host)
                .is_some_and(|t| now.duration_since(*t) >= CONFIRM);
            if !dead || fired.contains(&(m.id.clone(), host.clone())) {
                continue;
            }
            fired.insert((m.id.clone(), host.clone()));
            match crate::operations::start_machine(agent, &m.id, None).await {
                Ok(_) => tracing::info!(
                    machine.id = %m.id, primary = %primary, host = %host,
                    "standby: primary's host is dead, starting"
                ),
                Err(err) => tracing::warn!(
                    machine.id = %m.id, primary = %primary, error = %err,
                    "standby: could not start"
                ),
            }
            break;
        }
    }
}
