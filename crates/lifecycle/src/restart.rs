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

    #[test]
    fn the_retry_window_is_fly_s_five_minutes() {
        assert_eq!(RETRY_WINDOW_MS, 300_000);
    }

    #[test]
    fn every_policy_after_a_clean_and_a_failed_exit() {
        let now = 50_000_000;
        let cases = [
            (RestartPolicyKind::No, false, false),
            (RestartPolicyKind::No, true, false),
            (RestartPolicyKind::Always, false, true),
            (RestartPolicyKind::Always, true, true),
            (RestartPolicyKind::OnFailure, false, false),
            (RestartPolicyKind::OnFailure, true, true),
        ];
        for (kind, failed, restarts) in cases {
            let d = decide(policy(kind, None), failed, &[], now);
            assert_eq!(
                matches!(d, Decision::Restart { .. }),
                restarts,
                "{kind:?} after failed={failed}: {d:?}"
            );
        }
        assert_eq!(
            decide(policy(RestartPolicyKind::OnFailure, None), false, &[], now),
            Decision::Stop("exited successfully")
        );
        assert_eq!(
            decide(policy(RestartPolicyKind::No, None), true, &[], now),
            Decision::Stop("restart policy is no")
        );
    }

    #[test]
    fn on_failure_allows_ten_retries_by_default_within_the_window_only() {
        let p = policy(RestartPolicyKind::OnFailure, None);
        let now = 50_000_000;
        let nine: Vec<u64> = (1..=9).map(|i| now - i).collect();
        let ten: Vec<u64> = (1..=10).map(|i| now - i).collect();
        assert!(matches!(
            decide(p, true, &nine, now),
            Decision::Restart { .. }
        ));
        assert_eq!(
            decide(p, true, &ten, now),
            Decision::Stop("restart policy on-failure: retries exhausted")
        );
        // A restart exactly one window ago no longer counts; one just inside does.
        let edge = [now - RETRY_WINDOW_MS; 10];
        assert!(matches!(
            decide(p, true, &edge, now),
            Decision::Restart { .. }
        ));
        let inside = [now - RETRY_WINDOW_MS + 1; 10];
        assert!(matches!(decide(p, true, &inside, now), Decision::Stop(_)));
        // `always` ignores the retry count: only the backoff grows.
        let always = policy(RestartPolicyKind::Always, Some(1));
        assert!(matches!(
            decide(always, true, &ten, now),
            Decision::Restart { .. }
        ));
    }

    #[test]
    fn the_backoff_doubles_per_restart_in_the_window() {
        let p = policy(RestartPolicyKind::Always, None);
        let now = 50_000_000;
        for n in 0..8u64 {
            let recent: Vec<u64> = (1..=n).map(|i| now - i).collect();
            let want = Duration::from_millis(100 << n).min(BACKOFF_MAX);
            assert_eq!(
                decide(p, true, &recent, now),
                Decision::Restart { delay: want }
            );
        }
        // Restarts outside the window do not lengthen it.
        let old = [now - RETRY_WINDOW_MS - 5; 6];
        assert_eq!(
            decide(p, true, &old, now),
            Decision::Restart {
                delay: BACKOFF_BASE
            }
        );
    }
}
