//! A fake [`MachineDriver`] for running the real agent in-process (its store, ledger and
//! actors; `bazaar_agent::boot::start_in_process`): launches make in-memory runs that record the signals
//! they get and end when told to, so no shim, no runc and nothing on the host is needed.
//! Runs outlive the agent that launched them, as shims do: an agent started again on the
//! same data dir with the same driver finds and re-adopts them.

use async_trait::async_trait;
use bazaar_runtime::launch_error::LaunchError;
use bazaar_runtime::{LaunchReport, MachineDriver, Run, RunFound, Workload};
use bazaar_shim::{ExitRecord, ShimError};
use bazaar_types::event::MachineEvent;
use bazaar_types::now_ms;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{watch, Semaphore};

pub const SIGKILL: i32 = 9;
pub const SIGTERM: i32 = 15;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One fake run: it records the signals it gets and ends on any it does not ignore.
#[derive(Debug)]
pub struct FakeRun {
    run_id: u64,
    ignored: Vec<i32>,
    signals: Mutex<Vec<i32>>,
    exit: Mutex<Option<ExitRecord>>,
    over: watch::Sender<bool>,
}

impl FakeRun {
    /// The workload ends (once): with `exit_code`, or killed by `signal`.
    pub fn end(&self, exit_code: Option<i32>, signal: Option<i32>) {
        let mut exit = lock(&self.exit);
        if exit.is_none() {
            *exit = Some(ExitRecord {
                run_id: self.run_id,
                exit_code,
                signal,
                oom_killed: false,
                exited_at_ms: now_ms(),
                error: None,
            });
        }
        self.over.send_replace(true);
    }

    /// The signals it was sent, in order.
    pub fn signals(&self) -> Vec<i32> {
        lock(&self.signals).clone()
    }

    /// True once it ended.
    pub fn is_over(&self) -> bool {
        *self.over.borrow()
    }

    /// Waits until it ends.
    pub async fn ended(&self) {
        let mut over = self.over.subscribe();
        let _ = over.wait_for(|over| *over).await;
    }
}

/// What the agent holds of a [`FakeRun`].
#[derive(Debug)]
struct Handle(Arc<FakeRun>);

#[async_trait]
impl Run for Handle {
    fn run_id(&self) -> u64 {
        self.0.run_id
    }
    fn shim_pid(&self) -> i32 {
        1000 + self.0.run_id as i32
    }
    fn workload_pid(&self) -> i32 {
        2000 + self.0.run_id as i32
    }
    fn signal(&self, signal: i32) -> Result<(), ShimError> {
        lock(&self.0.signals).push(signal);
        if !self.0.ignored.contains(&signal) {
            self.0.end(None, Some(signal));
        }
        Ok(())
    }
    fn kill(&self) -> Result<(), ShimError> {
        self.signal(SIGKILL)
    }
    fn freeze(&self) -> Result<(), ShimError> {
        Ok(())
    }
    fn thaw(&self) -> Result<(), ShimError> {
        Ok(())
    }
    async fn wait(&self) {
        self.0.ended().await;
    }
}

/// Launches [`FakeRun`]s. Settings apply to the launches after them.
#[derive(Debug, Default)]
pub struct FakeDriver {
    runs: Mutex<HashMap<(String, u64), Arc<FakeRun>>>,
    /// Counts launches, for [`FakeDriver::launched`].
    launches: watch::Sender<u64>,
    fail_launch: Mutex<Option<LaunchError>>,
    gate: Mutex<Option<Arc<Semaphore>>>,
    ignore: Mutex<Vec<i32>>,
    destroyed: Mutex<Vec<String>>,
}

impl FakeDriver {
    pub fn new() -> Arc<FakeDriver> {
        Arc::new(FakeDriver::default())
    }

    /// Run `run_id` of machine `id`, if it was launched.
    pub fn run(&self, id: &str, run_id: u64) -> Option<Arc<FakeRun>> {
        lock(&self.runs).get(&(id.to_owned(), run_id)).cloned()
    }

    /// How many runs of machine `id` were launched.
    pub fn launches(&self, id: &str) -> usize {
        lock(&self.runs).keys().filter(|(m, _)| m == id).count()
    }

    /// Waits until machine `id` has had `n` launches; returns the newest run.
    pub async fn launched(&self, id: &str, n: usize) -> Arc<FakeRun> {
        let mut rx = self.launches.subscribe();
        loop {
            if self.launches(id) >= n {
                let runs = lock(&self.runs);
                let newest = runs
                    .iter()
                    .filter(|((m, _), _)| m == id)
                    .max_by_key(|((_, r), _)| *r);
                return newest.map(|(_, run)| run.clone()).unwrap();
            }
            rx.changed().await.unwrap();
        }
    }

    /// Launches fail with `err` (`None`: they succeed again).
    pub fn fail_launches(&self, err: Option<LaunchError>) {
        *lock(&self.fail_launch) = err;
    }

    /// Each launch waits for a permit of `gate`.
    pub fn gate_launches(&self, gate: Arc<Semaphore>) {
        *lock(&self.gate) = Some(gate);
    }

    /// New runs ignore `signal` (a workload that does not stop on SIGTERM).
    pub fn ignore_signal(&self, signal: i32) {
        lock(&self.ignore).push(signal);
    }

    /// The machines destroyed, in order.
    pub fn destroyed(&self) -> Vec<String> {
        lock(&self.destroyed).clone()
    }
}

#[async_trait]
impl MachineDriver for FakeDriver {
    async fn launch(
        &self,
        machine: &Workload<'_>,
        run_id: u64,
        _secret_env: &[(String, String)],
        report: &mut LaunchReport,
    ) -> Result<Box<dyn Run>, LaunchError> {
        report
            .events
            .push(MachineEvent::new("launch", "created", "flyd"));
        let gate = lock(&self.gate).clone();
        if let Some(gate) = gate {
            gate.acquire().await.unwrap().forget();
        }
        if let Some(err) = lock(&self.fail_launch).clone() {
            return Err(err);
        }
        let run = Arc::new(FakeRun {
            run_id,
            ignored: lock(&self.ignore).clone(),
            signals: Mutex::default(),
            exit: Mutex::default(),
            over: watch::Sender::new(false),
        });
        // Idempotent, as the real launch: a run that exists is the one returned.
        let run = lock(&self.runs)
            .entry((machine.id.to_owned(), run_id))
            .or_insert(run)
            .clone();
        self.launches.send_modify(|n| *n += 1);
        Ok(Box::new(Handle(run)))
    }

    async fn find_run(&self, id: &str, run_id: u64) -> RunFound {
        match self.run(id, run_id) {
            Some(run) if run.is_over() => RunFound::Ended,
            Some(run) => RunFound::Alive(Box::new(Handle(run))),
            None => RunFound::None,
        }
    }

    fn adopt(&self, id: &str, run_id: u64) -> Result<Option<Box<dyn Run>>, ShimError> {
        Ok(self
            .run(id, run_id)
            .filter(|run| !run.is_over())
            .map(|run| Box::new(Handle(run)) as Box<dyn Run>))
    }

    fn exit_record(&self, id: &str, run_id: u64) -> Option<ExitRecord> {
        self.run(id, run_id)?.exit.lock().unwrap().clone()
    }

    async fn destroy(&self, id: &str) {
        lock(&self.destroyed).push(id.to_owned());
    }
}
