//! The restart policy (Fly semantics): `no` never restarts; `always` restarts after any
//! exit; `on-failure` restarts after a non-zero exit, a signal or an OOM kill, at most
//! `max_retries` times (default 10) within a 5-minute window. Restarts back off
//! exponentially. Pure: the caller passes the clock.

use bazaar_types::config::{RestartConfig, RestartPolicyKind};
use std::time::Duration;

/// Fly counts on-failure retries within 5 minutes.
pub const RETRY_WINDOW_MS: u64 = 5 * 60 * 1000;
/// First backoff.
const BACKOFF_BASE: Duration = Duration::from_millis(100);
/// Backoff cap.
const BACKOFF_MAX: Duration = Duration::from_secs(10);

/// What to do after an exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Restart after the delay.
    Restart { delay: Duration },
    /// Leave the machine stopped, with the reason.
    Stop(&'static str),
}

/// Decides after an exit that was not requested. `failed` = non-zero exit, signal or OOM;
/// `recent` = times of earlier policy restarts.
pub fn decide(policy: RestartConfig, failed: bool, recent: &[u64], now_ms: u64) -> Decision {
    let in_window = recent
        .iter()
        .filter(|t| now_ms.saturating_sub(**t) < RETRY_WINDOW_MS)
        .count() as u32;
    let delay = BACKOFF_BASE
        .saturating_mul(1u32 << in_window.min(10))
        .min(BACKOFF_MAX);
    match policy.policy {
        RestartPolicyKind::No => Decision::Stop("restart policy is no"),
        RestartPolicyKind::Always => Decision::Restart { delay },
        RestartPolicyKind::OnFailure if !failed => Decision::Stop("exited successfully"),
        RestartPolicyKind::OnFailure => {
            if in_window >= policy.max_retries.unwrap_or(10) {
                Decision::Stop("restart policy on-failure: retries exhausted")
            } else {
                Decision::Restart { delay }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(p: RestartPolicyKind, max: Option<u32>) -> RestartConfig {
        RestartConfig {
            policy: p,
            max_retries: max,
        }
    }

    #[test]
    fn on_failure_retries_then_gives_up() {
        let p = policy(RestartPolicyKind::OnFailure, Some(3));
        let now = 1_000_000;
        assert!(matches!(
            decide(p, true, &[], now),
            Decision::Restart { .. }
        ));
        assert!(matches!(decide(p, false, &[], now), Decision::Stop(_)));
        let recent = [now - 1000, now - 2000, now - 3000];
        assert!(matches!(decide(p, true, &recent, now), Decision::Stop(_)));
        // Old restarts fall out of the window.
        let old = [now - RETRY_WINDOW_MS - 1; 3];
        assert!(matches!(
            decide(p, true, &old, now),
            Decision::Restart { .. }
        ));
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = policy(RestartPolicyKind::Always, None);
        let now = 10_000_000;
        let d0 = decide(p, false, &[], now);
        let d3 = decide(p, false, &[now - 1, now - 2, now - 3], now);
        let many: Vec<u64> = (0..20).map(|i| now - i).collect();
        let dmax = decide(p, false, &many, now);
        assert_eq!(
            d0,
            Decision::Restart {
                delay: Duration::from_millis(100)
            }
        );
        assert_eq!(
            d3,
            Decision::Restart {
                delay: Duration::from_millis(800)
            }
        );
        assert_eq!(dmax, Decision::Restart { delay: BACKOFF_MAX });
        assert!(matches!(
            decide(policy(RestartPolicyKind::No, None), true, &[], now),
            Decision::Stop(_)
        ));
    }
}
