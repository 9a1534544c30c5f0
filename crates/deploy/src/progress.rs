//! What a deploy reports while it works. The CLI draws it (spinner and bar on a terminal,
//! plain lines otherwise, nothing with `--json`); tests and benchmarks may ignore it.

/// One thing that happened.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// A phase begins, with how many machine steps it has.
    Phase { name: String, total: usize },
    /// Something happened to a machine.
    Machine {
        id: String,
        region: String,
        message: String,
    },
    /// One machine step of the phase is done.
    Advance,
    /// A general note (a failure, the rollback starting, ...).
    Note { message: String },
}

/// Receives events; must be cheap (it is called from the deploy's tasks).
pub trait Progress: Send + Sync + std::fmt::Debug {
    fn event(&self, e: Event);
}

/// Drops every event.
#[derive(Debug, Clone, Copy, Default)]
pub struct Silent;

impl Progress for Silent {
    fn event(&self, _: Event) {}
}
