//! Fault injection for crash tests: `BAZAAR_CRASH_AT=<op>:<boundary>` makes the agent
//! SIGKILL itself right after boundary `<boundary>` of the first operation named `<op>`
//! (`0` = the operation was accepted, `k` = its k-th step was recorded). Tests use it to
//! kill the agent at every step boundary and check that the operation still completes
//! exactly once after a restart. Unset, it costs one branch per step. A test running the
//! agent in-process gives it [`CrashPoint::unwind_at`] instead: the task that reaches the
//! boundary panics there, so nothing after it runs, and the test starts a new agent on the
//! same data dir.

use std::sync::atomic::{AtomicBool, Ordering};

/// Where to crash, read once from the environment.
#[derive(Debug)]
pub struct CrashPoint {
    target: Option<(String, u32)>,
    fired: AtomicBool,
    /// Panic (in-process tests) instead of killing the process.
    unwind: bool,
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
            unwind: false,
        }
    }

    /// Crashes the task that reaches boundary `boundary` of operation `op` by panicking
    /// there (once): the agent's durable state is what it was at that boundary.
    pub fn unwind_at(op: &str, boundary: u32) -> CrashPoint {
        CrashPoint {
            target: Some((op.to_string(), boundary)),
            fired: AtomicBool::new(false),
            unwind: true,
        }
    }

    /// No fault injected.
    pub fn none() -> CrashPoint {
        CrashPoint {
            target: None,
            fired: AtomicBool::new(false),
            unwind: false,
        }
    }

    /// True once the crash happened.
    pub fn fired(&self) -> bool {
        self.fired.load(Ordering::SeqCst)
    }

    /// Called at every boundary; kills the process with SIGKILL when it matches.
    pub fn at(&self, op: &str, boundary: u32) {
        let Some((t_op, t_k)) = &self.target else {
            return;
        };
        if t_op == op && *t_k == boundary && !self.fired.swap(true, Ordering::SeqCst) {
            if self.unwind {
                panic!("fault injection: crash at {op}:{boundary}");
            }
            tracing::warn!(op, boundary, "fault injection: killing the agent");
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL)
                .ok();
            // SIGKILL is not deliverable late; never continue past this point.
            std::process::abort();
        }
    }
}
