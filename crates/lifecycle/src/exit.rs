//! What a workload's own exit (one the machine was not asked for) leads to, and what it
//! changes in the machine's record: the exit is handled once per run; then the machine is
//! destroyed (`auto_destroy`), relaunched (its run was stopped by a host shutdown), restarted
//! by its restart policy after a backoff, or left stopped with the reason.

use crate::operation::OpKind;
use crate::record::MachineRecord;
use crate::restart::{decide, Decision, RETRY_WINDOW_MS};
use bazaar_types::state::MachineState;

/// What to do after the exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AfterExit {
    /// The exit of this run was handled already (or the run is older): nothing to do.
    AlreadyHandled,
    /// Queue an operation of `kind` that begins no earlier than `not_before_ms`: a forced
    /// destroy (`auto_destroy`), a relaunch after a host shutdown or a policy restart.
    Queue { kind: OpKind, not_before_ms: u64 },
    /// Leave the machine stopped, for this reason.
    Stop { reason: &'static str },
}

impl AfterExit {
    /// True when the machine will run again (the exit event says `restarting`).
    pub fn restarting(&self) -> bool {
        matches!(
            self,
            AfterExit::Queue {
                kind: OpKind::PolicyRestart | OpKind::Relaunch,
                ..
            }
        )
    }
}

/// Records in `rec` the exit of `run_id` (`failed`: a non-zero exit, a signal or an OOM
/// kill) at `now_ms` and decides what follows. `queue_empty`: no other operation waits for
/// the machine (then a stop makes `stopped` its desired state too). The caller records the
/// events and queues the operation in one transaction with `rec`.
pub fn after_exit(
    rec: &mut MachineRecord,
    run_id: u64,
    failed: bool,
    queue_empty: bool,
    now_ms: u64,
) -> AfterExit {
    if rec.exit_handled_run >= run_id {
        return AfterExit::AlreadyHandled;
    }
    rec.exit_handled_run = run_id;
    rec.state = MachineState::Stopped;
    rec.updated_at_ms = now_ms;
    rec.policy_restarts
        .retain(|t| now_ms.saturating_sub(*t) < RETRY_WINDOW_MS);
    if rec.config.auto_destroy {
        rec.desired = MachineState::Destroyed;
        return AfterExit::Queue {
            kind: OpKind::Destroy { force: true },
            not_before_ms: 0,
        };
    }
    if rec.host_shutdown_run == Some(run_id) {
        rec.host_shutdown_run = None;
        rec.desired = MachineState::Started;
        return AfterExit::Queue {
            kind: OpKind::Relaunch,
            not_before_ms: now_ms,
        };
    }
    match decide(
        rec.config.restart_policy(),
        failed,
        &rec.policy_restarts,
        now_ms,
    ) {
        Decision::Restart { delay } => {
            rec.policy_restarts.push(now_ms);
            rec.restart_count += 1;
            rec.desired = MachineState::Started;
            AfterExit::Queue {
                kind: OpKind::PolicyRestart,
                not_before_ms: now_ms + delay.as_millis() as u64,
            }
        }
        Decision::Stop(reason) => {
            if queue_empty {
                rec.desired = MachineState::Stopped;
            }
            AfterExit::Stop { reason }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::tests::record;
    use bazaar_types::config::{RestartConfig, RestartPolicyKind};

    const NOW: u64 = 1_000_000_000;

    fn with_policy(policy: RestartPolicyKind, max_retries: Option<u32>) -> MachineRecord {
        let mut rec = record();
        rec.config.restart = Some(RestartConfig {
            policy,
            max_retries,
        });
        rec.state = MachineState::Started;
        rec.desired = MachineState::Started;
        rec
    }

    #[test]
    fn an_exit_is_handled_once_per_run() {
        let mut rec = with_policy(RestartPolicyKind::Always, None);
        let first = after_exit(&mut rec, 3, true, true, NOW);
        assert!(first.restarting());
        assert_eq!(rec.exit_handled_run, 3);
        assert_eq!(rec.restart_count, 1);
        let before = rec.clone();
        for run in [3, 2] {
            assert_eq!(
                after_exit(&mut rec, run, true, true, NOW + 5),
                AfterExit::AlreadyHandled
            );
        }
        assert_eq!(rec.restart_count, before.restart_count);
        assert_eq!(rec.updated_at_ms, before.updated_at_ms);
    }

    #[test]
    fn a_policy_restart_backs_off_and_counts() {
        let mut rec = with_policy(RestartPolicyKind::OnFailure, Some(2));
        let a = after_exit(&mut rec, 1, true, true, NOW);
        assert_eq!(
            a,
            AfterExit::Queue {
                kind: OpKind::PolicyRestart,
                not_before_ms: NOW + 100
            }
        );
        assert_eq!(rec.state, MachineState::Stopped);
        assert_eq!(rec.desired, MachineState::Started);
        let b = after_exit(&mut rec, 2, true, true, NOW + 1000);
        assert_eq!(
            b,
            AfterExit::Queue {
                kind: OpKind::PolicyRestart,
                not_before_ms: NOW + 1000 + 200
            }
        );
        assert_eq!(rec.policy_restarts, vec![NOW, NOW + 1000]);
        assert_eq!(rec.restart_count, 2);
        // The third failure within the window exhausts two retries.
        let c = after_exit(&mut rec, 3, true, true, NOW + 2000);
        assert_eq!(
            c,
            AfterExit::Stop {
                reason: "restart policy on-failure: retries exhausted"
            }
        );
        assert!(!c.restarting());
        assert_eq!(rec.desired, MachineState::Stopped);
        assert_eq!(rec.restart_count, 2);
    }

    #[test]
    fn restarts_older_than_the_window_are_forgotten() {
        let mut rec = with_policy(RestartPolicyKind::OnFailure, Some(1));
        rec.policy_restarts = vec![NOW - RETRY_WINDOW_MS, NOW - 10];
        let a = after_exit(&mut rec, 1, true, true, NOW);
        assert_eq!(
            a,
            AfterExit::Stop {
                reason: "restart policy on-failure: retries exhausted"
            }
        );
        assert_eq!(rec.policy_restarts, vec![NOW - 10]);
    }

    #[test]
    fn a_clean_exit_under_on_failure_stops_and_keeps_a_queued_wish() {
        let mut rec = with_policy(RestartPolicyKind::OnFailure, None);
        let a = after_exit(&mut rec, 1, false, false, NOW);
        assert_eq!(
            a,
            AfterExit::Stop {
                reason: "exited successfully"
            }
        );
        // Another operation is queued: its desired state stands.
        assert_eq!(rec.desired, MachineState::Started);
        assert_eq!(rec.state, MachineState::Stopped);
        assert_eq!(rec.updated_at_ms, NOW);
    }

    #[test]
    fn no_policy_never_restarts() {
        let mut rec = with_policy(RestartPolicyKind::No, None);
        let a = after_exit(&mut rec, 1, true, true, NOW);
        assert_eq!(
            a,
            AfterExit::Stop {
                reason: "restart policy is no"
            }
        );
        assert_eq!(rec.restart_count, 0);
        assert!(rec.policy_restarts.is_empty());
    }

    #[test]
    fn a_run_stopped_by_a_host_shutdown_is_relaunched_at_once_whatever_the_policy() {
        let mut rec = with_policy(RestartPolicyKind::No, None);
        rec.host_shutdown_run = Some(4);
        let a = after_exit(&mut rec, 4, true, true, NOW);
        assert_eq!(
            a,
            AfterExit::Queue {
                kind: OpKind::Relaunch,
                not_before_ms: NOW
            }
        );
        assert!(a.restarting());
        assert_eq!(rec.host_shutdown_run, None);
        assert_eq!(rec.restart_count, 0, "a relaunch is not a policy restart");
        assert_eq!(rec.desired, MachineState::Started);
        // Another run's exit is the policy's again.
        rec.host_shutdown_run = Some(9);
        let b = after_exit(&mut rec, 5, true, true, NOW);
        assert!(matches!(b, AfterExit::Stop { .. }));
        assert_eq!(rec.host_shutdown_run, Some(9));
    }

    #[test]
    fn auto_destroy_destroys_after_any_exit() {
        for failed in [false, true] {
            let mut rec = with_policy(RestartPolicyKind::Always, None);
            rec.config.auto_destroy = true;
            rec.host_shutdown_run = Some(1);
            let a = after_exit(&mut rec, 1, failed, true, NOW);
            assert_eq!(
                a,
                AfterExit::Queue {
                    kind: OpKind::Destroy { force: true },
                    not_before_ms: 0
                }
            );
            assert!(!a.restarting());
            assert_eq!(rec.desired, MachineState::Destroyed);
            assert_eq!(rec.restart_count, 0);
        }
    }
}
