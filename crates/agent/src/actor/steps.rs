//! The steps an operation is made of ([`Step`](crate::record::Step)): launch a run (or
//! resume a frozen one), signal it, wait for its exit, freeze it, release what the machine
//! held. Each changes the machine record and adds events to the step's batch, which the
//! actor commits before the next step begins; each is safe to run again after a crash.

use super::{exit_event, Actor, Exit};
use crate::record::{AsWorkload, MachineRecord, OpKind, Operation, RunInfo};
use crate::store::Batch;
use bazaar_runtime::launch_error::{LaunchError, LaunchStep};
use bazaar_runtime::{LaunchReport, RunFound};
use bazaar_shim::ExitRecord;
use bazaar_types::event::MachineEvent;
use bazaar_types::failure::{Failure, FailureKind};
use bazaar_types::now_ms;
use bazaar_types::signal::Signal;
use bazaar_types::state::MachineState;
use std::time::Duration;

impl Actor {
    pub(super) async fn step_launch(
        &mut self,
        rec: &mut MachineRecord,
        op: &Operation,
        b: &mut Batch,
    ) -> StepOutcome {
        let Some(run_id) = op.run_id else {
            return StepOutcome::Abort;
        };
        // A suspended machine resumes: its frozen run is thawed, not replaced.
        if rec.state == MachineState::Suspended {
            if let Some(h) = &self.run {
                match h.thaw() {
                    Ok(()) => {
                        rec.state = MachineState::Started;
                        b.event(
                            rec,
                            MachineEvent::new("start", "started", &op.source)
                                .with_reason("resumed"),
                        );
                        return StepOutcome::Continue;
                    }
                    Err(err) => {
                        tracing::warn!(machine.id = %self.id, error = %err, "thaw failed, killing the run");
                        let _ = h.kill();
                        if let Some(h) = self.run.take() {
                            let _ = tokio::time::timeout(Duration::from_secs(10), h.wait()).await;
                        }
                    }
                }
            }
        }
        let driver = self.agent.machine_driver().clone();
        // From the operation's creation (the store write) to here: whole milliseconds.
        let queued_ms = now_ms().saturating_sub(op.created_at_ms) as f64;
        let mut timing = Vec::new();
        // Idempotence: the run may already exist (we crashed after spawning it).
        let handle = match driver.find_run(&self.id, run_id).await {
            RunFound::Alive(h) => Ok(h),
            RunFound::Ended => {
                // It started and ended while the agent was down; record the start, and the
                // exit is handled right after this operation.
                rec.run = Some(RunInfo {
                    run_id,
                    shim_pid: 0,
                    workload_pid: 0,
                    started_at_ms: now_ms(),
                });
                if let Some(exit) = driver
                    .exit_record(&self.id, run_id)
                    .filter(|e| e.error.is_some())
                {
                    // The shim recorded why the workload could not be exec'd.
                    let failure = exit.error.as_deref().map(|m| {
                        LaunchError::new(LaunchStep::Workload, bazaar_shim::kind_of_message(m), m)
                            .failure()
                    });
                    return self.launch_failed(rec, run_id, exit, failure, b);
                }
                rec.state = MachineState::Started;
                b.event(rec, MachineEvent::new("start", "started", &op.source));
                return StepOutcome::Continue;
            }
            RunFound::None => {
                // A copy claimed again on another host (re-placed while this one was
                // dead, or its claim here went unanswered) never runs again here
                // (`fence.rs`).
                if let Some(host) =
                    crate::fence::superseded_by(&self.agent, &self.id, &rec.config, rec.epoch).await
                {
                    let exit = ExitRecord {
                        run_id,
                        exit_code: None,
                        signal: None,
                        oom_killed: false,
                        exited_at_ms: now_ms(),
                        error: Some(format!(
                            "not launched: the machine was claimed again on host {host} (re-placed while this host was dead, or its claim here went unanswered)"
                        )),
                    };
                    // Not a failure of this host's launch: no kind.
                    return self.launch_failed(rec, run_id, exit, None, b);
                }
                let mut report = LaunchReport::default();
                let launched = match crate::app_secrets::app_secret_env(&self.agent, &rec.app) {
                    Ok(secret_env) => {
                        driver
                            .launch(&rec.workload(), run_id, &secret_env, &mut report)
                            .await
                    }
                    Err(err) => Err(LaunchError::new(
                        LaunchStep::Prepare,
                        FailureKind::Config,
                        err.to_string(),
                    )),
                };
                for e in report.events {
                    b.event(rec, e);
                }
                if report.image.is_some() {
                    rec.image_ref = report.image;
                }
                if !report.timing.is_empty() {
                    timing.push(bazaar_types::event::StepTiming {
                        step: "queued".into(),
                        ms: queued_ms,
                    });
                    timing.append(&mut report.timing);
                }
                launched
            }
        };
        match handle {
            Ok(h) => {
                rec.run = Some(RunInfo {
                    run_id,
                    shim_pid: h.shim_pid(),
                    workload_pid: h.workload_pid(),
                    started_at_ms: now_ms(),
                });
                rec.state = MachineState::Started;
                let mut e = MachineEvent::new("start", "started", &op.source).with_timing(timing);
                if op.kind == OpKind::PolicyRestart {
                    e = e.with_reason("restart policy");
                } else if op.kind == OpKind::Relaunch {
                    e = e.with_reason("host restarted");
                }
                b.event(rec, e);
                self.run = Some(h);
                StepOutcome::Continue
            }
            Err(err) => {
                let failure = err.failure();
                let message = err.message;
                let exit = driver.exit_record(&self.id, run_id).unwrap_or(ExitRecord {
                    run_id,
                    exit_code: None,
                    signal: None,
                    oom_killed: false,
                    exited_at_ms: now_ms(),
                    error: Some(message.clone()),
                });
                let exit = ExitRecord {
                    error: Some(exit.error.unwrap_or(message)),
                    ..exit
                };
                self.launch_failed(rec, run_id, exit, Some(failure), b)
            }
        }
    }

    fn launch_failed(
        &mut self,
        rec: &mut MachineRecord,
        run_id: u64,
        exit: ExitRecord,
        failure: Option<Failure>,
        b: &mut Batch,
    ) -> StepOutcome {
        tracing::warn!(machine.id = %self.id, error = ?exit.error, failure = ?failure, "launch failed");
        rec.exit_handled_run = run_id;
        rec.state = MachineState::Failed;
        let mut ev = exit_event(
            &Exit {
                run_id,
                record: exit,
            },
            false,
            false,
        );
        if let Some(request) = ev.request.as_mut() {
            request.failure = failure;
        }
        b.event(rec, ev);
        StepOutcome::Abort
    }

    /// The stop signal and timeout of `op`: an update stops the workload that runs, so it
    /// uses the `kill_signal`/`kill_timeout` of the version being replaced, not the new one.
    fn stop_params(&self, rec: &MachineRecord, op: &Operation) -> (Signal, Duration) {
        if let OpKind::Update {
            previous_instance_id,
            ..
        } = &op.kind
        {
            let previous = self.agent.store().versions(&self.id).ok().and_then(|v| {
                v.into_iter()
                    .find(|(iid, _)| iid == previous_instance_id)
                    .map(|(_, config)| config)
            });
            if let Some(config) = previous {
                return op.kind.stop_params(&config);
            }
        }
        op.kind.stop_params(&rec.config)
    }

    pub(super) fn step_signal(&mut self, rec: &mut MachineRecord, op: &Operation) -> StepOutcome {
        let (signal, _) = self.stop_params(rec, op);
        if let Some(h) = &self.run {
            // A frozen process cannot act on a signal; thaw it first.
            if rec.state == MachineState::Suspended {
                if let Err(err) = h.thaw() {
                    tracing::debug!(machine.id = %self.id, error = %err, "thawing before stop");
                }
            }
            let result = if signal == Signal::KILL {
                h.kill()
            } else {
                h.signal(signal.0)
            };
            if let Err(err) = result {
                tracing::debug!(machine.id = %self.id, error = %err, "signalling run");
            }
            if matches!(rec.state, MachineState::Started | MachineState::Suspended) {
                rec.state = MachineState::Stopping;
            }
        }
        StepOutcome::Continue
    }

    pub(super) async fn step_await_exit(
        &mut self,
        rec: &mut MachineRecord,
        op: &Operation,
        b: &mut Batch,
    ) -> StepOutcome {
        let (_, timeout) = self.stop_params(rec, op);
        if let Some(h) = self.run.take() {
            if tokio::time::timeout(timeout, h.wait()).await.is_err() {
                tracing::info!(machine.id = %self.id, "stop timed out, killing");
                if let Err(err) = h.kill() {
                    tracing::warn!(machine.id = %self.id, error = %err, "killing run");
                }
                if tokio::time::timeout(Duration::from_secs(10), h.wait())
                    .await
                    .is_err()
                {
                    tracing::error!(machine.id = %self.id, "run did not die after SIGKILL");
                }
            }
        }
        if let Some(run) = rec.run.filter(|r| r.run_id > rec.exit_handled_run) {
            let exit = self.exit_of(run.run_id);
            rec.exit_handled_run = run.run_id;
            b.event(rec, exit_event(&exit, true, false));
        }
        if rec.state != MachineState::Failed && rec.state != MachineState::Created {
            rec.state = MachineState::Stopped;
        }
        StepOutcome::Continue
    }

    pub(super) async fn step_release(
        &mut self,
        rec: &mut MachineRecord,
        b: &mut Batch,
    ) -> StepOutcome {
        {
            let mut ledger = self.agent.write_lock().await;
            ledger.uncommit(&self.id);
        }
        if let Err(err) = crate::volumes::detach_volumes(&self.agent, &self.id).await {
            tracing::error!(machine.id = %self.id, error = %err, "detaching volumes");
        }
        self.agent.machine_driver().destroy(&self.id).await;
        self.agent.release_ports(rec);
        rec.state = MachineState::Destroyed;
        rec.destroyed_at_ms = Some(now_ms());
        b.event(rec, MachineEvent::new("destroy", "destroyed", "user"));
        tracing::info!(machine.id = %self.id, "machine destroyed");
        StepOutcome::Continue
    }

    pub(super) fn step_freeze(&mut self, rec: &mut MachineRecord, b: &mut Batch) -> StepOutcome {
        let Some(h) = &self.run else {
            return StepOutcome::Abort;
        };
        match h.freeze() {
            Ok(()) => {
                rec.state = MachineState::Suspended;
                b.event(rec, MachineEvent::new("suspend", "suspended", "user"));
                StepOutcome::Continue
            }
            Err(err) => {
                tracing::warn!(machine.id = %self.id, error = %err, "freeze failed");
                b.event(
                    rec,
                    MachineEvent::new("suspend", "started", "flyd")
                        .with_reason(format!("suspend failed: {err}")),
                );
                StepOutcome::Abort
            }
        }
    }
}

/// What a step came to.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum StepOutcome {
    Continue,
    /// The operation cannot go on (launch failed): finish it here.
    Abort,
}
