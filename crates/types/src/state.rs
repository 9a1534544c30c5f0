//! Machine states (Fly Machines API, reference/fly.md §2.6) and the single place where an
//! operation is checked against the state a machine is in.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A machine's state, as reported to clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MachineState {
    Creating,
    Created,
    Starting,
    Started,
    Stopping,
    Stopped,
    Restarting,
    Suspending,
    Suspended,
    Updating,
    Replacing,
    Destroying,
    Destroyed,
    Failed,
    LaunchFailed,
}

impl MachineState {
    /// The API name (`started`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Creating => "creating",
            Self::Created => "created",
            Self::Starting => "starting",
            Self::Started => "started",
            Self::Stopping => "stopping",
            Self::Stopped => "stopped",
            Self::Restarting => "restarting",
            Self::Suspending => "suspending",
            Self::Suspended => "suspended",
            Self::Updating => "updating",
            Self::Replacing => "replacing",
            Self::Destroying => "destroying",
            Self::Destroyed => "destroyed",
            Self::Failed => "failed",
            Self::LaunchFailed => "launch_failed",
        }
    }

    /// Parses an API name.
    pub fn parse(text: &str) -> Option<MachineState> {
        serde_json::from_value(serde_json::Value::String(text.to_string())).ok()
    }

    /// True for states a machine rests in (not in the middle of an operation).
    pub fn is_settled(self) -> bool {
        matches!(
            self,
            Self::Created
                | Self::Started
                | Self::Stopped
                | Self::Suspended
                | Self::Destroyed
                | Self::Failed
        )
    }

    /// True when the machine's workload may be running.
    pub fn is_running(self) -> bool {
        matches!(
            self,
            Self::Started | Self::Starting | Self::Restarting | Self::Stopping | Self::Suspending
        )
    }
}

impl fmt::Display for MachineState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a client (or the agent itself) asks of a machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Create,
    Start,
    Stop,
    Restart,
    Suspend,
    Update,
    Destroy,
    ForceDestroy,
    Signal,
    Exec,
}

impl Action {
    /// The API verb, for error messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Create => "create",
            Self::Start => "start",
            Self::Stop => "stop",
            Self::Restart => "restart",
            Self::Suspend => "suspend",
            Self::Update => "update",
            Self::Destroy => "destroy",
            Self::ForceDestroy => "destroy",
            Self::Signal => "signal",
            Self::Exec => "exec",
        }
    }
}

/// An action refused in the machine's state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot {action} machine in state {state}{hint}", action = .action.as_str())]
pub struct TransitionError {
    pub action: Action,
    pub state: MachineState,
    pub hint: &'static str,
}

/// Checks that `action` may be applied to a machine that is (or, once its queued operations
/// finish, will be) in `state`, and returns the state the machine settles in afterwards.
///
/// This is the one place these rules live: the agent checks every accepted operation here.
pub fn check_transition(
    state: MachineState,
    action: Action,
) -> Result<MachineState, TransitionError> {
    use Action as A;
    use MachineState as S;
    let refuse = |hint: &'static str| {
        Err(TransitionError {
            action,
            state,
            hint,
        })
    };
    if state == S::Destroyed {
        return refuse("");
    }
    match action {
        A::Create => refuse(": machine already exists"),
        A::Start => match state {
            S::Created | S::Stopped | S::Suspended | S::Failed => Ok(S::Started),
            S::Started => refuse(": already started"),
            _ => refuse(""),
        },
        A::Stop => match state {
            S::Started | S::Suspended => Ok(S::Stopped),
            S::Stopped | S::Created | S::Failed => refuse(": not started"),
            _ => refuse(""),
        },
        A::Restart => match state {
            S::Started => Ok(S::Started),
            _ => refuse(": only a started machine can be restarted"),
        },
        A::Suspend => match state {
            S::Started => Ok(S::Suspended),
            _ => refuse(": only a started machine can be suspended"),
        },
        A::Signal | A::Exec => match state {
            S::Started => Ok(S::Started),
            _ => refuse(": machine is not started"),
        },
        A::Update => match state {
            S::Created | S::Started | S::Stopped | S::Suspended | S::Failed => Ok(S::Started),
            _ => refuse(""),
        },
        // As on Fly: only a machine that is not running may be destroyed without `force`.
        A::Destroy => match state {
            S::Created | S::Stopped | S::Failed => Ok(S::Destroyed),
            _ => refuse(": stop it first, or destroy it with force=true"),
        },
        A::ForceDestroy => Ok(S::Destroyed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Action as A;
    use MachineState as S;

    #[test]
    fn legal_transitions() {
        assert_eq!(check_transition(S::Created, A::Start), Ok(S::Started));
        assert_eq!(check_transition(S::Stopped, A::Start), Ok(S::Started));
        assert_eq!(check_transition(S::Started, A::Stop), Ok(S::Stopped));
        assert_eq!(check_transition(S::Started, A::Restart), Ok(S::Started));
        assert_eq!(check_transition(S::Stopped, A::Destroy), Ok(S::Destroyed));
        for running in [S::Started, S::Starting, S::Suspended] {
            assert!(check_transition(running, A::Destroy).is_err());
            assert_eq!(check_transition(running, A::ForceDestroy), Ok(S::Destroyed));
        }
        assert_eq!(
            check_transition(S::Started, A::ForceDestroy),
            Ok(S::Destroyed)
        );
    }

    #[test]
    fn illegal_transitions_say_why() {
        let err = check_transition(S::Stopped, A::Stop).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot stop machine in state stopped: not started"
        );
        assert!(check_transition(S::Destroyed, A::Start).is_err());
        assert!(check_transition(S::Destroyed, A::ForceDestroy).is_err());
        assert!(check_transition(S::Stopped, A::Restart).is_err());
        assert!(check_transition(S::Started, A::Start).is_err());
    }

    #[test]
    fn names_round_trip() {
        for s in [S::Started, S::LaunchFailed, S::Destroyed] {
            assert_eq!(MachineState::parse(s.as_str()), Some(s));
        }
        assert_eq!(MachineState::parse("bogus"), None);
    }
}
