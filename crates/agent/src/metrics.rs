//! The agent's Prometheus metrics (docs/METRICS.md): operations by kind and outcome, actor
//! steps and their duration, store commits and their duration, machines by state. Counted
//! with plain atomics in fixed arrays (no lock, no allocation where they are counted);
//! machines by state are read from the store's in-memory records when scraped. Served with
//! the catalog's and the proxy's at `GET /metrics` on the API port.

use crate::record::{OpKind, Step};
use bazaar_catalog::metrics::Exposition;
use bazaar_types::state::MachineState;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Operation kinds, as [`OpKind::name`] says them.
const KINDS: [&str; 9] = [
    "create",
    "start",
    "stop",
    "restart",
    "update",
    "destroy",
    "suspend",
    "policy_restart",
    "relaunch",
];

/// Steps, as [`Step::name`] says them.
const STEPS: [&str; 5] = ["launch", "signal", "await_exit", "release", "freeze"];

/// How an operation or a step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Ran to its end.
    Completed,
    /// Could not go on (a launch failed): the operation was finished there.
    Aborted,
    /// Dropped before running: a later user operation superseded a policy restart.
    Superseded,
}

const OUTCOMES: [(Outcome, &str); 3] = [
    (Outcome::Completed, "completed"),
    (Outcome::Aborted, "aborted"),
    (Outcome::Superseded, "superseded"),
];

fn outcome_index(outcome: Outcome) -> usize {
    OUTCOMES
        .iter()
        .position(|(o, _)| *o == outcome)
        .unwrap_or(0)
}

/// Bucket bounds of [`Histogram`], in seconds: from 100 µs, doubling to ~52 s.
const BOUNDS: usize = 20;

fn bound(i: usize) -> f64 {
    0.000_1 * f64::from(1u32 << i)
}

/// A latency histogram kept in atomics.
#[derive(Debug, Default)]
pub struct Histogram {
    /// One more than the bounds: the last counts everything above them (`+Inf`).
    counts: [AtomicU64; BOUNDS + 1],
    sum_ns: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, took: Duration) {
        let seconds = took.as_secs_f64();
        let i = (0..BOUNDS).find(|i| seconds <= bound(*i)).unwrap_or(BOUNDS);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Writes the cumulative buckets, sum and count of `name` with `labels`.
    fn encode(&self, out: &mut Exposition, name: &str, labels: &[(&str, &str)]) {
        let bucket = format!("{name}_bucket");
        let mut total = 0;
        for (i, count) in self.counts.iter().enumerate() {
            total += count.load(Ordering::Relaxed);
            let le = if i == BOUNDS {
                "+Inf".to_string()
            } else {
                bound(i).to_string()
            };
            let mut with_le = labels.to_vec();
            with_le.push(("le", &le));
            out.sample(&bucket, &with_le, total);
        }
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        out.sample(&format!("{name}_sum"), labels, sum);
        out.sample(&format!("{name}_count"), labels, total);
    }
}

/// Store commits: how long each took, and how many failed.
#[derive(Debug, Default)]
pub struct CommitStats {
    pub duration: Histogram,
    pub failed: AtomicU64,
}

/// One step kind's runs.
#[derive(Debug, Default)]
struct StepStats {
    completed: AtomicU64,
    aborted: AtomicU64,
    duration: Histogram,
}

/// The agent's counters (the store keeps its commits' own, [`CommitStats`]).
#[derive(Debug, Default)]
pub struct AgentMetrics {
    operations: [[AtomicU64; OUTCOMES.len()]; KINDS.len()],
    steps: [StepStats; STEPS.len()],
}

impl AgentMetrics {
    /// Counts an operation of `kind` that ended with `outcome`.
    pub fn operation(&self, kind: &OpKind, outcome: Outcome) {
        if let Some(k) = KINDS.iter().position(|n| *n == kind.name()) {
            self.operations[k][outcome_index(outcome)].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts a step that ran for `took` (`aborted`: it ended its operation early).
    pub fn step(&self, step: Step, took: Duration, aborted: bool) {
        if let Some(s) = STEPS.iter().position(|n| *n == step.name()) {
            let stats = &self.steps[s];
            let counter = if aborted {
                &stats.aborted
            } else {
                &stats.completed
            };
            counter.fetch_add(1, Ordering::Relaxed);
            stats.duration.observe(took);
        }
    }

    /// Writes these counts, the store's `commits` and `machines` (the state of each, as
    /// scraped) to `out`.
    pub(crate) fn encode(
        &self,
        out: &mut Exposition,
        commits: &CommitStats,
        machines: impl IntoIterator<Item = MachineState>,
    ) {
        let m = self;
        let name = "bazaar_agent_operations_total";
        out.family(
            name,
            "counter",
            "Operations on machines that ended, by kind and outcome",
        );
        for (kind, counts) in KINDS.iter().zip(&m.operations) {
            for ((_, outcome), n) in OUTCOMES.iter().zip(counts) {
                let labels = [("kind", *kind), ("outcome", *outcome)];
                out.sample(name, &labels, n.load(Ordering::Relaxed));
            }
        }
        let name = "bazaar_agent_steps_total";
        out.family(name, "counter", "Actor steps run, by step and outcome");
        for (step, stats) in STEPS.iter().zip(&m.steps) {
            for (outcome, n) in [("completed", &stats.completed), ("aborted", &stats.aborted)] {
                let labels = [("step", *step), ("outcome", outcome)];
                out.sample(name, &labels, n.load(Ordering::Relaxed));
            }
        }
        let name = "bazaar_agent_step_duration_seconds";
        out.family(
            name,
            "histogram",
            "Time an actor step took, its commit included, by step",
        );
        for (step, stats) in STEPS.iter().zip(&m.steps) {
            stats.duration.encode(out, name, &[("step", step)]);
        }
        let name = "bazaar_agent_store_commit_duration_seconds";
        out.family(
            name,
            "histogram",
            "Time a durable store transaction took (every commit, failed ones included)",
        );
        commits.duration.encode(out, name, &[]);
        out.single(
            "bazaar_agent_store_commit_failures_total",
            "counter",
            "Store transactions that failed",
            commits.failed.load(Ordering::Relaxed),
        );
        let mut states: Vec<(MachineState, u64)> = Vec::new();
        for state in machines {
            match states.iter_mut().find(|(s, _)| *s == state) {
                Some((_, n)) => *n += 1,
                None => states.push((state, 1)),
            }
        }
        states.sort_by_key(|(s, _)| s.as_str());
        let name = "bazaar_agent_machines";
        out.family(name, "gauge", "This host's machines, by state");
        for (state, n) in states {
            out.sample(name, &[("state", state.as_str())], n);
        }
    }
}
