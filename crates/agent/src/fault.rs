//! Fault injection for crash tests: `BAZAAR_CRASH_AT=<op>:<boundary>` makes the agent
//! SIGKILL itself right after boundary `<boundary>` of the first operation named `<op>`
//! (`0` = the operation was accepted, `k` = its k-th step was recorded). Tests use it to
//! kill the agent at every step boundary and check that the operation still completes
//! exactly once after a restart. Unset, it costs one branch per step.

use std::sync::atomic::{AtomicBool, Ordering};

/// Where to crash, read once from the environment.
#[derive(Debug)]
pub struct CrashPoint {
    target: Option<(String, u32)>,
    fired: AtomicBool,
}

impl CrashPoint {
    /// Reads `BAZAAR_CRASH_AT`.
    pub fn from_env() -> CrashPoint {
        let target = std::env::var("BAZAAR_CRASH_AT").ok().and_then(|v| {
            let (op, k) = v.split_once(':')?;
            Some((op.to_string(), k.parse().ok()?))
        });
        CrashPoint {
            target,
            fired: AtomicBool::new(false),
        }
    }

    /// Called at every boundary; kills the process with SIGKILL when it matches.
    pub fn at(&self, op: &str, boundary: u32) {
        let Some((t_op, t_k)) = &self.target else {
            return;
        };
        if t_op == op && *t_k == boundary && !self.fired.swap(true, Ordering::SeqCst) {
            tracing::warn!(op, boundary, "fault injection: killing the agent");
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL)
                .ok();
            // SIGKILL is not deliverable late; never continue past this point.
            std::process::abort();
        }
    }
}
