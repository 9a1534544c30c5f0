//! Scheduled machines (Fly's `config.schedule`: `hourly`, `daily`, `weekly`, `monthly`): a
//! machine whose schedule is due, counted in whole intervals from its creation, is started
//! if it is not running (stopped, created or failed) and was not started since. The workload
//! does its job and exits; the next interval starts it again. Checked by the agent's
//! housekeeping loop; a machine leased by someone else is left alone until the lease ends.

use crate::agent::Agent;
use crate::record::MachineRecord;
use bazaar_types::state::MachineState;
use std::time::Duration;

/// The schedules Fly knows.
pub use bazaar_admission::SCHEDULES;

/// The interval of `schedule`, where an hour lasts `hour` (an hour, except in tests).
pub fn interval(schedule: &str, hour: Duration) -> Option<Duration> {
    let hours = match schedule {
        "hourly" => 1,
        "daily" => 24,
        "weekly" => 24 * 7,
        "monthly" => 24 * 30,
        _ => return None,
    };
    Some(hour * hours)
}

/// True if the machine's latest scheduled start (`created + k·interval`, k ≥ 1, not after
/// `now`) is later than its last start.
fn due(created_ms: u64, last_start_ms: u64, now_ms: u64, interval: Duration) -> bool {
    let every = (interval.as_millis() as u64).max(1);
    let periods = now_ms.saturating_sub(created_ms) / every;
    periods > 0 && last_start_ms < created_ms + periods * every
}

fn is_due(rec: &MachineRecord, hour: Duration, now_ms: u64) -> bool {
    let resting = matches!(
        rec.state,
        MachineState::Stopped | MachineState::Created | MachineState::Failed
    );
    let Some(every) = rec
        .config
        .schedule
        .as_deref()
        .and_then(|s| interval(s, hour))
    else {
        return false;
    };
    resting
        && rec.desired == rec.state
        && due(
            rec.created_at_ms,
            rec.run.map_or(0, |r| r.started_at_ms),
            now_ms,
            every,
        )
}

/// Starts every machine of this host whose schedule is due.
pub(crate) async fn start_due(agent: &Agent, now_ms: u64) {
    let hour = agent.config().schedule_hour;
    let due: Vec<String> = agent
        .store()
        .select(|m| is_due(m, hour, now_ms).then(|| m.id.clone()));
    for id in due {
        match agent.start_machine(&id, None).await {
            Ok(_) => tracing::info!(machine.id = %id, "started on its schedule"),
            Err(err) => tracing::debug!(machine.id = %id, error = %err, "scheduled start"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_once_per_interval_counted_from_creation() {
        let hour = Duration::from_millis(1000);
        let every = interval("hourly", hour).unwrap();
        // Created at 10 s, ran then: not due before 11 s.
        assert!(!due(10_000, 10_000, 10_999, every));
        assert!(due(10_000, 10_000, 11_000, every));
        // Started at 11.2 s for the 11 s slot: not again until 12 s.
        assert!(!due(10_000, 11_200, 11_900, every));
        assert!(due(10_000, 11_200, 12_000, every));
        // Missed slots are one start, not several.
        assert!(due(10_000, 0, 15_500, every));
        assert!(!due(10_000, 15_600, 15_900, every));
        assert_eq!(interval("weekly", hour), Some(hour * 168));
        assert_eq!(interval("every minute", hour), None);
    }
}
