//! One task per machine runs that machine's operations, one at a time, in order. Each step
//! of an operation is idempotent, and its completion is recorded (with its effects on the
//! machine record and events) in one durable transaction before the next step begins; a
//! restarted agent resumes each operation from its first unrecorded step. The actor also
//! watches the running workload and applies the restart policy when it exits on its own.

use crate::agent::Agent;
use crate::metrics::Outcome;
use crate::record::{MachineRecord, OpKind, Operation, Step};
use crate::registry::ActorMsg;
use crate::store::Batch;
use bazaar_lifecycle::exit::{after_exit, AfterExit};
use bazaar_lifecycle::operation::final_state;
use bazaar_runtime::Run;
use bazaar_shim::ExitRecord;
use bazaar_types::event::{EventRequest, ExitEvent, MachineEvent};
use bazaar_types::rfc3339;
use bazaar_types::state::MachineState;
use std::collections::VecDeque;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

mod steps;
use steps::StepOutcome;

/// Starts the actor of `rec` with its unfinished operations.
pub fn spawn_actor(
    agent: &Agent,
    rec: MachineRecord,
    ops: Vec<Operation>,
    run: Option<Box<dyn Run>>,
) {
    let rx = agent.actors().register(&rec.id);
    let actor = Actor {
        agent: agent.clone(),
        id: rec.id.clone(),
        queue: ops.into_iter().collect(),
        run,
        rx,
    };
    agent.tracker().spawn(actor.run(rec));
}

struct Actor {
    agent: Agent,
    id: String,
    queue: VecDeque<Operation>,
    /// The live run, if any.
    run: Option<Box<dyn Run>>,
    rx: mpsc::Receiver<ActorMsg>,
}

/// An exit to record.
struct Exit {
    run_id: u64,
    record: ExitRecord,
}

impl Actor {
    async fn run(mut self, rec: MachineRecord) {
        let shutdown = self.agent.shutdown_token();
        tokio::select! {
            () = shutdown.cancelled() => {}
            () = self.main(rec) => {}
        }
        // Stop routing new operations here; they are durable and resume on restart.
        self.agent
            .actors()
            .retire(&self.id, shutdown.is_cancelled());
    }

    async fn main(&mut self, rec: MachineRecord) {
        if let Err(err) = self.recover(rec).await {
            tracing::error!(machine.id = %self.id, error = %err, "recovering machine");
        }
        loop {
            while let Ok(msg) = self.rx.try_recv() {
                self.accept(msg);
            }
            self.drop_superseded_policy_ops().await;
            if let Some(op) = self.queue.front().cloned() {
                let wait = self.agent.clock().until(op.not_before_ms);
                if !wait.is_zero() {
                    let woke = tokio::select! {
                        msg = self.rx.recv() => Some(msg),
                        () = tokio::time::sleep(wait) => None,
                    };
                    match woke {
                        Some(Some(msg)) => self.accept(msg),
                        Some(None) => return,
                        None => {}
                    }
                    continue;
                }
                let done = self.execute(op).await;
                self.queue.pop_front();
                if let Some(MachineState::Destroyed) = done {
                    // Any operation queued behind a destroy refers to a gone machine.
                    self.queue.clear();
                    self.agent.actors().remove(&self.id);
                    return;
                }
                continue;
            }
            match self.run.take() {
                Some(handle) => {
                    let woke = tokio::select! {
                        msg = self.rx.recv() => Some(msg),
                        () = handle.wait() => None,
                    };
                    match woke {
                        Some(Some(msg)) => {
                            self.run = Some(handle);
                            self.accept(msg);
                        }
                        Some(None) => return,
                        None => self.on_unrequested_exit(handle.run_id()).await,
                    }
                }
                None => match self.rx.recv().await {
                    Some(msg) => self.accept(msg),
                    None => return,
                },
            }
        }
    }

    fn accept(&mut self, msg: ActorMsg) {
        match msg {
            ActorMsg::Op(op) => self.queue.push_back(op),
        }
    }

    /// A restart the policy scheduled but that has not begun is dropped as soon as anything
    /// else is queued: what a user asks for wins over the agent's own plan.
    async fn drop_superseded_policy_ops(&mut self) {
        if self.queue.len() < 2 {
            return;
        }
        let mut dropped = Vec::new();
        let metrics = &self.agent.metrics();
        let last = self.queue.len() - 1;
        let mut i = 0;
        self.queue.retain(|op| {
            let keep = !(i < last && op.kind == OpKind::PolicyRestart && op.steps_done == 0);
            if !keep {
                dropped.push(op.id);
                metrics.operation(&op.kind, Outcome::Superseded);
            }
            i += 1;
            keep
        });
        if !dropped.is_empty() {
            let mut b = Batch::default();
            for id in dropped {
                b.delete_op(id);
            }
            if let Err(err) = self.agent.commit(b).await {
                tracing::warn!(machine.id = %self.id, error = %err, "dropping policy restart");
            }
        }
    }

    fn load(&self) -> Option<MachineRecord> {
        match self.agent.store().machine(&self.id) {
            Ok(rec) => rec,
            Err(err) => {
                tracing::error!(machine.id = %self.id, error = %err, "reading machine");
                None
            }
        }
    }

    fn set_transient(&self, state: Option<MachineState>) {
        self.agent.set_operation_state(&self.id, state);
    }

    /// On start: re-adopt the live run, or record how it ended while the agent was away.
    async fn recover(&mut self, rec: MachineRecord) -> Result<(), String> {
        let Some(run) = rec.run.filter(|r| r.run_id > rec.exit_handled_run) else {
            return Ok(());
        };
        if self.run.is_some() {
            // Re-adopted by the agent on start.
            return Ok(());
        }
        // The run ended while we were away. If the next operation stops the machine, its
        // AwaitExit step records the exit; otherwise it is an exit of its own.
        let next_step = self.queue.front().and_then(Operation::next_step);
        if matches!(next_step, Some(Step::Signal) | Some(Step::AwaitExit)) {
            return Ok(());
        }
        self.on_unrequested_exit(run.run_id).await;
        Ok(())
    }

    fn exit_of(&self, run_id: u64) -> Exit {
        let record = self
            .agent
            .machine_driver()
            .exit_record(&self.id, run_id)
            .unwrap_or_else(|| ExitRecord {
                run_id,
                exit_code: None,
                signal: Some(9),
                oom_killed: false,
                exited_at_ms: self.agent.now_ms(),
                error: Some("the machine's supervisor (shim) was lost".into()),
            });
        Exit { run_id, record }
    }

    /// The workload exited without being asked to: record it once, then apply the restart
    /// policy (or relaunch after a host shutdown).
    async fn on_unrequested_exit(&mut self, run_id: u64) {
        let Some(mut rec) = self.load() else { return };
        if rec.exit_handled_run >= run_id {
            return;
        }
        let before = rec.clone();
        let exit = self.exit_of(run_id);
        let failed = exit.record.exit_code != Some(0);
        let now = self.agent.now_ms();
        let restart_count = rec.restart_count;
        let after = after_exit(&mut rec, run_id, failed, self.queue.is_empty(), now);
        let mut b = Batch::default();
        let restarting = after.restarting();
        let mut event = exit_event(&exit, false, restarting);
        if let Some(req) = event.request.as_mut() {
            req.restart_count = Some(restart_count);
        }
        b.event(&mut rec, event);
        // A full disk the housekeeping loop has not reported yet (`disk_watch.rs`).
        let full = self.agent.machine_driver().disk_full(&self.id);
        if let Some(full) = full.filter(|_| self.agent.full_disks().saw(&self.id, true)) {
            b.event(
                &mut rec,
                MachineEvent::new("disk_full", "stopped", "flyd").with_reason(full),
            );
        }
        let new_op = match after {
            AfterExit::AlreadyHandled => return,
            AfterExit::Queue {
                kind,
                not_before_ms,
            } => {
                if restarting {
                    tracing::info!(
                        machine.id = %self.id,
                        delay_ms = not_before_ms.saturating_sub(now),
                        exit_code = ?exit.record.exit_code,
                        signal = ?exit.record.signal,
                        oom = exit.record.oom_killed,
                        "workload exited, restarting"
                    );
                }
                Some(self.agent.begin_op(&mut rec, kind, "flyd", not_before_ms))
            }
            AfterExit::Stop { reason } => {
                b.event(
                    &mut rec,
                    MachineEvent::new("stop", "stopped", "flyd").with_reason(reason),
                );
                tracing::info!(machine.id = %self.id, reason, "workload exited");
                None
            }
        };
        if let Some(op) = &new_op {
            b.op(op);
        }
        b.machine(&rec);
        self.record(&before, &mut rec, b, "recording exit").await;
        self.agent.publish(&rec);
        if let Some(op) = new_op {
            self.queue.push_back(op);
        }
    }

    /// Records `batch`, what a step or an exit did to `rec` (loaded as `before`), retrying
    /// with backoff until it is written: a write fails while the disk is full, and the
    /// store reopens itself, so the operation goes on once space is freed. Until then
    /// the machine stays in its transient state and later operations wait behind it.
    async fn record(
        &self,
        before: &MachineRecord,
        rec: &mut MachineRecord,
        batch: Batch,
        what: &str,
    ) {
        let mut pause = Duration::from_millis(20);
        let mut attempt = rec.clone();
        loop {
            match self
                .agent
                .commit_from_actor(before, &mut attempt, batch.clone())
                .await
            {
                Ok(()) => {
                    *rec = attempt;
                    return;
                }
                Err(err) => {
                    tracing::error!(machine.id = %self.id, what, error = %err, retry_in_ms = pause.as_millis() as u64, "recording a step failed");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                    attempt = rec.clone();
                }
            }
        }
    }

    /// Runs `op` from its first unrecorded step to the end. Returns the settled state.
    async fn execute(&mut self, mut op: Operation) -> Option<MachineState> {
        let steps = op.kind.steps();
        // Cleared once, by the operation that set it: an operation queued meanwhile has set
        // its own (`operations::enqueue`), which a second clear here would take away.
        let mut shows_transient = !steps.is_empty();
        if shows_transient {
            // Shown while the steps run (`starting`, `stopping`, ...); an operation with
            // nothing to run (a create with skip_launch) never shows one.
            self.set_transient(Some(op.kind.transient_state()));
            if let Some(rec) = self.load() {
                self.agent.publish(&rec);
            }
        }
        let mut settled = None;
        if steps.is_empty() {
            // Create with skip_launch: the accept already recorded everything.
            let mut b = Batch::default();
            b.delete_op(op.id);
            if let Err(err) = self.agent.commit(b).await {
                tracing::error!(machine.id = %self.id, error = %err, "finishing operation");
            }
            self.agent.metrics().operation(&op.kind, Outcome::Completed);
        }
        while let Some(step) = op.next_step() {
            let Some(mut rec) = self.load() else { break };
            let before = rec.clone();
            let mut b = Batch::default();
            let started = Instant::now();
            let outcome = match step {
                Step::Launch => self.step_launch(&mut rec, &op, &mut b).await,
                Step::Signal => self.step_signal(&mut rec, &op),
                Step::AwaitExit => self.step_await_exit(&mut rec, &op, &mut b).await,
                Step::Release => self.step_release(&mut rec, &mut b).await,
                Step::Freeze => self.step_freeze(&mut rec, &mut b),
            };
            let last = op.finish_step(outcome == StepOutcome::Abort);
            if last {
                b.delete_op(op.id);
                rec.state = final_state(&op.kind, rec.state);
                if self.queue.len() <= 1 {
                    rec.desired = rec.state;
                }
                settled = Some(rec.state);
            } else {
                b.op(&op);
            }
            rec.updated_at_ms = self.agent.now_ms();
            b.machine(&rec);
            self.record(&before, &mut rec, b, step.name()).await;
            let aborted = outcome == StepOutcome::Abort;
            let metrics = &self.agent.metrics();
            metrics.step(step, started.elapsed(), aborted);
            if last {
                let ended = if aborted {
                    Outcome::Aborted
                } else {
                    Outcome::Completed
                };
                metrics.operation(&op.kind, ended);
            }
            self.agent.crash_at(op.kind.name(), op.steps_done);
            if last {
                self.set_transient(None);
                shows_transient = false;
            }
            self.agent.publish(&rec);
            if last {
                break;
            }
        }
        if shows_transient {
            // The loop ended before the last step (the machine is gone).
            self.set_transient(None);
        }
        if let Some(rec) = self.load() {
            self.agent.publish(&rec);
            // A run that was adopted as already over (it ended while we were away) is
            // recorded as an exit now.
            if self.run.is_none() {
                if let Some(run) = rec.run.filter(|r| r.run_id > rec.exit_handled_run) {
                    if rec.state == MachineState::Started {
                        self.on_unrequested_exit(run.run_id).await;
                    }
                }
            }
        }
        settled
    }
}

fn exit_event(exit: &Exit, requested: bool, restarting: bool) -> MachineEvent {
    let r = &exit.record;
    let status = if r.error.is_some() {
        "failed"
    } else {
        "stopped"
    };
    let mut e = MachineEvent::new("exit", status, if requested { "user" } else { "flyd" });
    e.request = Some(EventRequest {
        exit_event: Some(ExitEvent {
            exit_code: r.exit_code.unwrap_or(if r.signal.is_some() {
                128 + r.signal.unwrap_or(0)
            } else {
                -1
            }),
            signal: r.signal.unwrap_or(0),
            oom_killed: r.oom_killed,
            requested_stop: requested,
            restarting,
            exited_at: rfc3339(r.exited_at_ms),
            error: r.error.clone(),
        }),
        restart_count: None,
        reason: if r.oom_killed {
            Some("out of memory: killed by the kernel at the machine's memory limit".into())
        } else {
            None
        },
        failure: None,
        timing: Vec::new(),
    });
    let _ = exit.run_id;
    e
}

/// Host shutdown (dev clusters): remember which run each machine had, so it is relaunched
/// when the host comes back, then stop every workload gracefully.
pub async fn stop_all_for_host_shutdown(agent: &Agent) {
    let machines = agent.store().machines().unwrap_or_default();
    let mut handles = Vec::new();
    let mut b = Batch::default();
    for mut rec in machines {
        let Some(run) = rec.run.filter(|r| r.run_id > rec.exit_handled_run) else {
            continue;
        };
        if let Ok(Some(h)) = agent.machine_driver().adopt(&rec.id, run.run_id) {
            rec.host_shutdown_run = Some(run.run_id);
            b.machine(&rec);
            let (signal, timeout) = rec.config.stop_signal_and_timeout();
            handles.push((h, signal, timeout));
        }
    }
    if handles.is_empty() {
        return;
    }
    if let Err(err) = agent.store().write(&b) {
        tracing::error!(error = %err, "recording host shutdown");
        return;
    }
    tracing::info!(num = handles.len(), "stopping workloads for host shutdown");
    let waits = handles.into_iter().map(|(h, signal, timeout)| async move {
        let _ = h.signal(signal.0);
        if tokio::time::timeout(timeout, h.wait()).await.is_err() {
            let _ = h.kill();
            let _ = tokio::time::timeout(Duration::from_secs(5), h.wait()).await;
        }
    });
    futures_join_all(waits).await;
}

async fn futures_join_all<F: std::future::Future<Output = ()> + Send + 'static>(
    futs: impl Iterator<Item = F>,
) {
    let mut set = tokio::task::JoinSet::new();
    for f in futs {
        set.spawn(f);
    }
    while set.join_next().await.is_some() {}
}
