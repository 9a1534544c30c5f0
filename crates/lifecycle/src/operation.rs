//! Operations: what each kind does, the steps it is made of (each idempotent, recorded
//! before the next begins, so a restarted agent resumes at the first unrecorded one), the
//! state shown while it runs and the state it leaves the machine in.

use bazaar_types::config::MachineConfig;
use bazaar_types::signal::Signal;
use bazaar_types::state::{Action, MachineState};
use serde::{Deserialize, Serialize};

/// An operation on a machine: a named sequence of steps, recorded as it goes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Operation {
    /// Host-wide, increasing: operations of one machine run in this order.
    pub id: u64,
    pub machine_id: String,
    pub kind: OpKind,
    /// Number of steps completed (and recorded).
    pub steps_done: u32,
    /// The run this operation launches, if it launches one.
    #[serde(default)]
    pub run_id: Option<u64>,
    /// Do not begin before this time (restart backoff).
    #[serde(default)]
    pub not_before_ms: u64,
    /// `user` or `flyd` (Fly's name for the host agent).
    pub source: String,
    pub created_at_ms: u64,
}

/// What an operation does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum OpKind {
    Create {
        skip_launch: bool,
    },
    Start,
    Stop {
        signal: i32,
        timeout_ms: u64,
    },
    Restart {
        signal: i32,
        timeout_ms: u64,
    },
    Update {
        skip_launch: bool,
        previous_instance_id: String,
    },
    Destroy {
        force: bool,
    },
    /// Freeze the workload (cgroup freezer); `Start` thaws it.
    Suspend,
    /// Started by the restart policy after an exit.
    PolicyRestart,
    /// Relaunch after the host came back from a shutdown.
    Relaunch,
}

/// The steps operations are made of. Each is idempotent: running it again after a crash
/// (before its completion was recorded) has the same outcome as running it once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Start the run `op.run_id` unless it is already alive (adopt) or already over.
    Launch,
    /// Send the stop signal (or SIGKILL) to the current run, if alive.
    Signal,
    /// Wait for the current run to end (SIGKILL after the timeout); record its exit.
    AwaitExit,
    /// Free resources and files; the machine becomes a tombstone.
    Release,
    /// Freeze every process of the current run.
    Freeze,
}

impl Step {
    /// The step's name, for logs and fault injection.
    pub fn name(self) -> &'static str {
        match self {
            Step::Launch => "launch",
            Step::Signal => "signal",
            Step::AwaitExit => "await_exit",
            Step::Release => "release",
            Step::Freeze => "freeze",
        }
    }
}

impl OpKind {
    /// The operation's name (`create`, `stop`, ...), for logs, events and fault injection.
    pub fn name(&self) -> &'static str {
        match self {
            OpKind::Create { .. } => "create",
            OpKind::Start => "start",
            OpKind::Stop { .. } => "stop",
            OpKind::Restart { .. } => "restart",
            OpKind::Update { .. } => "update",
            OpKind::Destroy { .. } => "destroy",
            OpKind::Suspend => "suspend",
            OpKind::PolicyRestart => "policy_restart",
            OpKind::Relaunch => "relaunch",
        }
    }

    /// The ordered steps of this kind of operation.
    pub fn steps(&self) -> &'static [Step] {
        use Step::*;
        match self {
            OpKind::Create { skip_launch: true } => &[],
            OpKind::Create { skip_launch: false } => &[Launch],
            OpKind::Start | OpKind::PolicyRestart | OpKind::Relaunch => &[Launch],
            OpKind::Stop { .. } => &[Signal, AwaitExit],
            OpKind::Restart { .. } => &[Signal, AwaitExit, Launch],
            OpKind::Update {
                skip_launch: true, ..
            } => &[Signal, AwaitExit],
            OpKind::Update {
                skip_launch: false, ..
            } => &[Signal, AwaitExit, Launch],
            OpKind::Destroy { .. } => &[Signal, AwaitExit, Release],
            OpKind::Suspend => &[Freeze],
        }
    }

    /// True if the operation launches a new run.
    pub fn launches(&self) -> bool {
        self.steps().contains(&Step::Launch)
    }

    /// The state shown while the operation runs.
    pub fn transient_state(&self) -> MachineState {
        match self {
            OpKind::Create { .. } | OpKind::Start | OpKind::PolicyRestart | OpKind::Relaunch => {
                MachineState::Starting
            }
            OpKind::Stop { .. } => MachineState::Stopping,
            OpKind::Restart { .. } => MachineState::Restarting,
            OpKind::Update { .. } => MachineState::Updating,
            OpKind::Destroy { .. } => MachineState::Destroying,
            OpKind::Suspend => MachineState::Suspending,
        }
    }

    /// The API action this operation performs, for transition checks.
    pub fn action(&self) -> Action {
        match self {
            OpKind::Create { .. } => Action::Create,
            OpKind::Start | OpKind::PolicyRestart | OpKind::Relaunch => Action::Start,
            OpKind::Stop { .. } => Action::Stop,
            OpKind::Restart { .. } => Action::Restart,
            OpKind::Update { .. } => Action::Update,
            OpKind::Destroy { force: false } => Action::Destroy,
            OpKind::Destroy { force: true } => Action::ForceDestroy,
            OpKind::Suspend => Action::Suspend,
        }
    }

    /// The stop signal and timeout for operations that stop the workload.
    pub fn stop_params(&self, config: &MachineConfig) -> (Signal, std::time::Duration) {
        let (default_signal, default_timeout) = config.stop_signal_and_timeout();
        match self {
            OpKind::Stop { signal, timeout_ms } | OpKind::Restart { signal, timeout_ms } => (
                Signal(*signal),
                std::time::Duration::from_millis(*timeout_ms),
            ),
            OpKind::Destroy { force: true } => (Signal::KILL, std::time::Duration::from_secs(5)),
            _ => (default_signal, default_timeout),
        }
    }
}

impl Operation {
    /// The step a (possibly resumed) operation runs next; `None` once every step is recorded.
    pub fn next_step(&self) -> Option<Step> {
        self.kind.steps().get(self.steps_done as usize).copied()
    }

    /// Records that the next step ran; true when that was the operation's last (or the step
    /// aborted it), so the operation is done.
    pub fn finish_step(&mut self, aborted: bool) -> bool {
        self.steps_done += 1;
        aborted || self.steps_done as usize >= self.kind.steps().len()
    }
}

/// The state an operation leaves the machine in, from the state its steps left (`current`):
/// a failed or destroyed machine stays so; a create without launch leaves it `created`; a
/// stop, `stopped`; an update without launch, `stopped` (or `created` for a machine never
/// started); a suspend, whatever its freeze left; the others, what their launch left.
pub fn final_state(kind: &OpKind, current: MachineState) -> MachineState {
    match (kind, current) {
        (_, MachineState::Failed) => MachineState::Failed,
        (_, MachineState::Destroyed) => MachineState::Destroyed,
        (OpKind::Create { skip_launch: true }, _) => MachineState::Created,
        (OpKind::Stop { .. }, _) => MachineState::Stopped,
        (OpKind::Suspend, s) => s,
        (
            OpKind::Update {
                skip_launch: true, ..
            },
            MachineState::Created,
        ) => MachineState::Created,
        (
            OpKind::Update {
                skip_launch: true, ..
            },
            _,
        ) => MachineState::Stopped,
        (_, s) => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bazaar_types::state::check_transition;
    use std::time::Duration;

    fn every_kind() -> Vec<OpKind> {
        vec![
            OpKind::Create { skip_launch: true },
            OpKind::Create { skip_launch: false },
            OpKind::Start,
            OpKind::Stop {
                signal: 15,
                timeout_ms: 1000,
            },
            OpKind::Restart {
                signal: 2,
                timeout_ms: 3000,
            },
            OpKind::Update {
                skip_launch: true,
                previous_instance_id: "v1".into(),
            },
            OpKind::Update {
                skip_launch: false,
                previous_instance_id: "v1".into(),
            },
            OpKind::Destroy { force: false },
            OpKind::Destroy { force: true },
            OpKind::Suspend,
            OpKind::PolicyRestart,
            OpKind::Relaunch,
        ]
    }

    fn op(kind: OpKind) -> Operation {
        Operation {
            id: 1,
            machine_id: "m".into(),
            kind,
            steps_done: 0,
            run_id: None,
            not_before_ms: 0,
            source: "user".into(),
            created_at_ms: 0,
        }
    }

    #[test]
    fn each_kind_has_its_steps_in_order() {
        use Step::*;
        let want: Vec<&[Step]> = vec![
            &[],
            &[Launch],
            &[Launch],
            &[Signal, AwaitExit],
            &[Signal, AwaitExit, Launch],
            &[Signal, AwaitExit],
            &[Signal, AwaitExit, Launch],
            &[Signal, AwaitExit, Release],
            &[Signal, AwaitExit, Release],
            &[Freeze],
            &[Launch],
            &[Launch],
        ];
        for (kind, want) in every_kind().into_iter().zip(want) {
            assert_eq!(kind.steps(), want, "{}", kind.name());
            assert_eq!(kind.launches(), want.contains(&Launch), "{}", kind.name());
        }
    }

    #[test]
    fn a_resumed_operation_goes_on_at_its_first_unrecorded_step() {
        for kind in every_kind() {
            let steps = kind.steps();
            let mut o = op(kind);
            for (i, step) in steps.iter().enumerate() {
                assert_eq!(o.next_step(), Some(*step));
                // A crash here: the same operation, read back, runs the same step again.
                let resumed: Operation =
                    serde_json::from_value(serde_json::to_value(&o).unwrap()).unwrap();
                assert_eq!(resumed.next_step(), Some(*step));
                assert_eq!(o.finish_step(false), i + 1 == steps.len());
            }
            assert_eq!(o.next_step(), None, "{}", o.kind.name());
        }
        // An aborted step ends the operation at once.
        let mut restart = op(every_kind()[4].clone());
        assert!(restart.finish_step(true));
        assert_eq!(restart.next_step(), Some(Step::AwaitExit));
    }

    #[test]
    fn names_actions_and_transient_states() {
        let names: Vec<&str> = every_kind().iter().map(|k| k.name()).collect();
        assert_eq!(
            names,
            [
                "create",
                "create",
                "start",
                "stop",
                "restart",
                "update",
                "update",
                "destroy",
                "destroy",
                "suspend",
                "policy_restart",
                "relaunch"
            ]
        );
        use MachineState as S;
        let transient: Vec<S> = every_kind().iter().map(|k| k.transient_state()).collect();
        assert_eq!(
            transient,
            [
                S::Starting,
                S::Starting,
                S::Starting,
                S::Stopping,
                S::Restarting,
                S::Updating,
                S::Updating,
                S::Destroying,
                S::Destroying,
                S::Suspending,
                S::Starting,
                S::Starting
            ]
        );
        let actions: Vec<Action> = every_kind().iter().map(|k| k.action()).collect();
        assert_eq!(
            actions,
            [
                Action::Create,
                Action::Create,
                Action::Start,
                Action::Stop,
                Action::Restart,
                Action::Update,
                Action::Update,
                Action::Destroy,
                Action::ForceDestroy,
                Action::Suspend,
                Action::Start,
                Action::Start
            ]
        );
        let steps: Vec<&str> = [
            Step::Launch,
            Step::Signal,
            Step::AwaitExit,
            Step::Release,
            Step::Freeze,
        ]
        .iter()
        .map(|s| s.name())
        .collect();
        assert_eq!(
            steps,
            ["launch", "signal", "await_exit", "release", "freeze"]
        );
    }

    #[test]
    fn a_started_machine_may_be_stopped_restarted_updated_suspended_and_force_destroyed() {
        for kind in every_kind() {
            let allowed = check_transition(MachineState::Started, kind.action()).is_ok();
            let expected = !matches!(
                kind.action(),
                Action::Create | Action::Start | Action::Destroy
            );
            assert_eq!(allowed, expected, "{}", kind.name());
        }
    }

    #[test]
    fn stop_parameters_come_from_the_request_or_the_config() {
        let config = MachineConfig::default();
        let (default_signal, default_timeout) = config.stop_signal_and_timeout();
        let stop = OpKind::Stop {
            signal: 2,
            timeout_ms: 1500,
        };
        assert_eq!(
            stop.stop_params(&config),
            (Signal(2), Duration::from_millis(1500))
        );
        let restart = OpKind::Restart {
            signal: 3,
            timeout_ms: 700,
        };
        assert_eq!(
            restart.stop_params(&config),
            (Signal(3), Duration::from_millis(700))
        );
        assert_eq!(
            OpKind::Destroy { force: true }.stop_params(&config),
            (Signal::KILL, Duration::from_secs(5))
        );
        for kind in [
            OpKind::Destroy { force: false },
            OpKind::Update {
                skip_launch: false,
                previous_instance_id: String::new(),
            },
        ] {
            assert_eq!(kind.stop_params(&config), (default_signal, default_timeout));
        }
    }

    #[test]
    fn the_state_an_operation_leaves() {
        use MachineState as S;
        let k = every_kind();
        // A failure or a destroy during the steps wins over every kind.
        for kind in &k {
            assert_eq!(final_state(kind, S::Failed), S::Failed);
            assert_eq!(final_state(kind, S::Destroyed), S::Destroyed);
        }
        assert_eq!(final_state(&k[0], S::Starting), S::Created);
        assert_eq!(final_state(&k[1], S::Started), S::Started);
        assert_eq!(final_state(&k[3], S::Started), S::Stopped);
        assert_eq!(final_state(&k[5], S::Created), S::Created);
        assert_eq!(final_state(&k[5], S::Started), S::Stopped);
        assert_eq!(final_state(&k[6], S::Started), S::Started);
        assert_eq!(final_state(&k[9], S::Suspended), S::Suspended);
        assert_eq!(final_state(&k[9], S::Started), S::Started);
        assert_eq!(final_state(&k[4], S::Started), S::Started);
    }
}
