//! Scheduled machines (Fly's `config.schedule`: `hourly`, `daily`, `weekly`, `monthly`): a
//! machine whose schedule is due, counted in whole intervals from its creation, is started
//! if it is resting (stopped, created or failed, with nothing queued) and was not started
//! since. Pure: the agent's housekeeping loop passes the clock and starts what is due.

use crate::record::MachineRecord;
use bazaar_types::state::MachineState;
use std::time::Duration;

/// The schedules Fly knows.
pub const SCHEDULES: &[&str] = &["hourly", "daily", "weekly", "monthly"];

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

/// True if machine `rec` is to be started now, `now_ms`, by its schedule.
pub fn is_due(rec: &MachineRecord, hour: Duration, now_ms: u64) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::RunInfo;

    #[test]
    fn due_once_per_interval_counted_from_creation() {
        let hour = Duration::from_millis(1000);
        let every = interval("hourly", hour).unwrap();
        // Created at 10 s, ran then: not due before 11 s.
        assert!(!due(10_000, 10_000, 10_999, every));
        assert!(due(10_000, 10_000, 11_000, every));
        // Started right at its 11 s slot: that slot is done.
        assert!(!due(10_000, 11_000, 11_500, every));
        // Started at 11.2 s for the 11 s slot: not again until 12 s.
        assert!(!due(10_000, 11_200, 11_900, every));
        assert!(due(10_000, 11_200, 12_000, every));
        // Missed slots are one start, not several.
        assert!(due(10_000, 0, 15_500, every));
        assert!(!due(10_000, 15_600, 15_900, every));
        assert_eq!(interval("daily", hour), Some(hour * 24));
        assert_eq!(interval("weekly", hour), Some(hour * 168));
        assert_eq!(interval("monthly", hour), Some(hour * 720));
        assert_eq!(interval("every minute", hour), None);
        for schedule in SCHEDULES {
            assert!(interval(schedule, hour).is_some(), "{schedule}");
        }
    }

    #[test]
    fn only_a_resting_machine_with_a_schedule_and_nothing_queued_is_started() {
        let hour = Duration::from_millis(1000);
        let mut rec = crate::record::tests::record();
        rec.created_at_ms = 10_000;
        rec.state = MachineState::Stopped;
        rec.desired = MachineState::Stopped;
        rec.run = Some(RunInfo {
            run_id: 1,
            shim_pid: 1,
            workload_pid: 2,
            started_at_ms: 10_000,
        });
        assert!(!is_due(&rec, hour, 11_000), "no schedule");
        rec.config.schedule = Some("someday".into());
        assert!(!is_due(&rec, hour, 11_000), "a schedule Fly does not know");
        rec.config.schedule = Some("hourly".into());
        assert!(!is_due(&rec, hour, 10_999));
        assert!(is_due(&rec, hour, 11_000));
        for resting in [MachineState::Created, MachineState::Failed] {
            rec.state = resting;
            rec.desired = resting;
            assert!(is_due(&rec, hour, 11_000), "{resting}");
        }
        rec.desired = MachineState::Started;
        assert!(!is_due(&rec, hour, 11_000), "a start is queued");
        rec.state = MachineState::Started;
        assert!(!is_due(&rec, hour, 11_000), "it runs");
        // Never run: due from its first interval on.
        rec.state = MachineState::Created;
        rec.desired = MachineState::Created;
        rec.run = None;
        assert!(is_due(&rec, hour, 11_000));
        assert!(!is_due(&rec, hour, 10_500));
    }
}
