//! The accept side of an operation on an existing machine: a request is checked against the
//! machine's lease and against the state the machine will be in once its queued operations
//! have run (`desired`), and becomes an operation to record with the record's changes. A
//! launch gets the next run id here, so a run id is never handed out twice even across a
//! crash (the record and the operation are committed together).

use crate::lease::{self, LeaseError};
use crate::operation::{OpKind, Operation};
use crate::record::MachineRecord;
use bazaar_types::state::{check_transition, TransitionError};

/// Why an operation is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Another holder's lease (409), or no nonce where one is needed.
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// The machine's (desired) state does not allow it (Fly's 412 or 409).
    #[error(transparent)]
    Transition(#[from] TransitionError),
}

/// Accepts an operation of `kind` on `rec` at `now_ms` for a caller holding `nonce`, as
/// operation `op_id` from `source` (`user` or `flyd`): checks the lease and the transition
/// from the desired state, moves the desired state on, and returns the operation. The
/// caller records `rec` and the operation in one transaction.
pub fn accept(
    rec: &mut MachineRecord,
    kind: OpKind,
    nonce: Option<&str>,
    op_id: u64,
    source: &str,
    now_ms: u64,
) -> Result<Operation, Refusal> {
    lease::check(&rec.id, rec.lease.as_ref(), nonce, now_ms)?;
    rec.desired = check_transition(rec.desired, kind.action())?;
    rec.updated_at_ms = now_ms;
    Ok(begin(rec, kind, op_id, source, 0, now_ms))
}

/// A new operation of `kind` on `rec` (no checks: the agent's own operations, such as a
/// policy restart, and creates, which were checked when placed), taking the next run id
/// when it launches; it does not begin before `not_before_ms`.
pub fn begin(
    rec: &mut MachineRecord,
    kind: OpKind,
    op_id: u64,
    source: &str,
    not_before_ms: u64,
    now_ms: u64,
) -> Operation {
    let run_id = kind.launches().then(|| {
        let id = rec.next_run_id;
        rec.next_run_id += 1;
        id
    });
    Operation {
        id: op_id,
        machine_id: rec.id.clone(),
        kind,
        steps_done: 0,
        run_id,
        not_before_ms,
        source: source.into(),
        created_at_ms: now_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::tests::record;
    use bazaar_types::machine::Lease;
    use bazaar_types::state::MachineState;

    const NOW: u64 = 1_700_000_000_000;

    fn started() -> MachineRecord {
        let mut rec = record();
        rec.state = MachineState::Started;
        rec.desired = MachineState::Started;
        rec.next_run_id = 3;
        rec
    }

    fn stop() -> OpKind {
        OpKind::Stop {
            signal: 15,
            timeout_ms: 5000,
        }
    }

    #[test]
    fn an_accepted_stop_moves_the_desired_state_and_takes_no_run() {
        let mut rec = started();
        let op = accept(&mut rec, stop(), None, 42, "user", NOW).unwrap();
        assert_eq!(op.id, 42);
        assert_eq!(op.machine_id, rec.id);
        assert_eq!(op.kind, stop());
        assert_eq!(op.steps_done, 0);
        assert_eq!(op.run_id, None);
        assert_eq!(op.not_before_ms, 0);
        assert_eq!(op.source, "user");
        assert_eq!(op.created_at_ms, NOW);
        assert_eq!(rec.desired, MachineState::Stopped);
        assert_eq!(
            rec.state,
            MachineState::Started,
            "the actor moves the state"
        );
        assert_eq!(rec.updated_at_ms, NOW);
        assert_eq!(rec.next_run_id, 3);
    }

    #[test]
    fn queued_operations_are_checked_against_the_state_they_leave() {
        let mut rec = started();
        accept(&mut rec, stop(), None, 1, "user", NOW).unwrap();
        // A second stop behind the first: the machine will be stopped by then.
        let err = accept(&mut rec, stop(), None, 2, "user", NOW).unwrap_err();
        assert!(matches!(err, Refusal::Transition(_)), "{err:?}");
        assert_eq!(
            rec.desired,
            MachineState::Stopped,
            "a refusal changes nothing"
        );
        // A start behind the stop takes the next run.
        let start = accept(&mut rec, OpKind::Start, None, 3, "user", NOW).unwrap();
        assert_eq!(start.run_id, Some(3));
        assert_eq!(rec.next_run_id, 4);
        assert_eq!(rec.desired, MachineState::Started);
        let restart = OpKind::Restart {
            signal: 15,
            timeout_ms: 1,
        };
        let again = accept(&mut rec, restart, None, 4, "user", NOW).unwrap();
        assert_eq!(again.run_id, Some(4), "run ids are never handed out twice");
    }

    #[test]
    fn a_leased_machine_takes_operations_only_from_the_holder() {
        let mut rec = started();
        rec.lease = Some(Lease {
            nonce: "n1".into(),
            expires_at: NOW / 1000 + 30,
            owner: "api".into(),
            description: String::new(),
            version: rec.instance_id.clone(),
        });
        let before = rec.clone();
        let err = accept(&mut rec, stop(), Some("other"), 1, "user", NOW).unwrap_err();
        assert!(
            matches!(err, Refusal::Lease(LeaseError::Conflict(_))),
            "{err:?}"
        );
        assert_eq!(rec.desired, before.desired);
        assert_eq!(rec.updated_at_ms, before.updated_at_ms);
        assert!(accept(&mut rec, stop(), Some("n1"), 1, "user", NOW).is_ok());
        // Once the lease expired anyone may.
        let mut rec = before.clone();
        assert!(accept(&mut rec, stop(), None, 1, "user", NOW + 30_000).is_ok());
    }

    #[test]
    fn begin_takes_a_run_only_for_launching_kinds_and_keeps_its_delay() {
        let mut rec = started();
        let restart = begin(&mut rec, OpKind::PolicyRestart, 9, "flyd", NOW + 800, NOW);
        assert_eq!(restart.run_id, Some(3));
        assert_eq!(restart.not_before_ms, NOW + 800);
        assert_eq!(restart.source, "flyd");
        assert_eq!(rec.desired, MachineState::Started, "begin checks nothing");
        let destroy = begin(
            &mut rec,
            OpKind::Destroy { force: true },
            10,
            "flyd",
            0,
            NOW,
        );
        assert_eq!(destroy.run_id, None);
        assert_eq!(rec.next_run_id, 4);
    }
}
