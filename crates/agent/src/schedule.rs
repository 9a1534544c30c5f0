//! Scheduled machines (Fly's `config.schedule`: `hourly`, `daily`, `weekly`, `monthly`):
//! the agent's housekeeping loop starts each machine whose schedule is due
//! (`bazaar_lifecycle::schedule`: counted in whole intervals from its creation, resting and
//! not started since). The workload does its job and exits; the next interval starts it
//! again. A machine leased by someone else is left alone until the lease ends.

use crate::agent::Agent;
use bazaar_lifecycle::schedule::is_due;

/// Starts every machine of this host whose schedule is due.
pub(crate) async fn start_due(agent: &Agent, now_ms: u64) {
    let hour = agent.config().schedule_hour;
    let due: Vec<String> = agent
        .store()
        .select(|m| is_due(m, hour, now_ms).then(|| m.id.clone()));
    for id in due {
        match crate::operations::start_machine(agent, &id, None).await {
            Ok(_) => tracing::info!(machine.id = %id, "started on its schedule"),
            Err(err) => tracing::debug!(machine.id = %id, error = %err, "scheduled start"),
        }
    }
}
