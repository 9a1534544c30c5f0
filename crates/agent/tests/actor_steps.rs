//! The actor's steps against a fake driver: the operations a user asks for and the agent's
//! own restarts, run through the real agent (store, ledger, actors, events) with no shim,
//! no runc and nothing made on the host; the agent does not isolate, so no root is needed.

use async_trait::async_trait;
use bazaar_agent::{Agent, AgentConfig};
use bazaar_runtime::launch_error::{LaunchError, LaunchStep};
use bazaar_runtime::{LaunchReport, MachineDriver, Run, RunFound, Workload};
use bazaar_shim::{ExitRecord, ShimError};
use bazaar_types::event::MachineEvent;
use bazaar_types::failure::FailureKind;
use bazaar_types::host::{ClaimRequest, StopRequest};
use bazaar_types::now_ms;
use bazaar_types::state::MachineState;
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

const SIGKILL: i32 = 9;
const SIGTERM: i32 = 15;

/// One fake run: it records the signals it gets and ends on any it does not ignore.
#[derive(Debug)]
struct RunState {
    run_id: u64,
    ignored: Vec<i32>,
    signals: Mutex<Vec<i32>>,
    exit: Mutex<Option<ExitRecord>>,
    over: watch::Sender<bool>,
}

impl RunState {
    /// The workload ends (once): with `exit_code`, or killed by `signal`.
    fn end(&self, exit_code: Option<i32>, signal: Option<i32>) {
        let mut exit = self.exit.lock().unwrap();
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

    fn signals(&self) -> Vec<i32> {
        self.signals.lock().unwrap().clone()
    }
}

#[derive(Debug)]
struct FakeRun(Arc<RunState>);

#[async_trait]
impl Run for FakeRun {
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
        self.0.signals.lock().unwrap().push(signal);
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
        let mut over = self.0.over.subscribe();
        let _ = over.wait_for(|over| *over).await;
    }
}

/// Launches fake runs; `fail_launch` makes the next launches fail with that error, `gate`
/// holds each launch until it has a permit.
#[derive(Debug, Default)]
struct FakeDriver {
    runs: Mutex<HashMap<(String, u64), Arc<RunState>>>,
    fail_launch: Mutex<Option<LaunchError>>,
    gate: Mutex<Option<Arc<tokio::sync::Semaphore>>>,
    /// Signals new runs ignore (a workload that does not stop on SIGTERM).
    ignore: Mutex<Vec<i32>>,
    destroyed: Mutex<Vec<String>>,
}

impl FakeDriver {
    fn run(&self, id: &str, run_id: u64) -> Option<Arc<RunState>> {
        self.runs
            .lock()
            .unwrap()
            .get(&(id.to_owned(), run_id))
            .cloned()
    }

    fn launches(&self, id: &str) -> usize {
        let runs = self.runs.lock().unwrap();
        runs.keys().filter(|(m, _)| m == id).count()
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
        let gate = self.gate.lock().unwrap().clone();
        if let Some(gate) = gate {
            gate.acquire().await.unwrap().forget();
        }
        if let Some(err) = self.fail_launch.lock().unwrap().clone() {
            return Err(err);
        }
        let state = Arc::new(RunState {
            run_id,
            ignored: self.ignore.lock().unwrap().clone(),
            signals: Mutex::default(),
            exit: Mutex::default(),
            over: watch::Sender::new(false),
        });
        self.runs
            .lock()
            .unwrap()
            .insert((machine.id.to_owned(), run_id), state.clone());
        Ok(Box::new(FakeRun(state)))
    }

    async fn find_run(&self, id: &str, run_id: u64) -> RunFound {
        match self.run(id, run_id) {
            Some(run) if *run.over.borrow() => RunFound::Ended,
            Some(run) => RunFound::Alive(Box::new(FakeRun(run))),
            None => RunFound::None,
        }
    }

    fn adopt(&self, id: &str, run_id: u64) -> Result<Option<Box<dyn Run>>, ShimError> {
        Ok(self
            .run(id, run_id)
            .filter(|run| !*run.over.borrow())
            .map(|run| Box::new(FakeRun(run)) as Box<dyn Run>))
    }

    fn exit_record(&self, id: &str, run_id: u64) -> Option<ExitRecord> {
        self.run(id, run_id)?.exit.lock().unwrap().clone()
    }

    async fn destroy(&self, id: &str) {
        self.destroyed.lock().unwrap().push(id.to_owned());
    }
}

async fn start_agent(driver: &Arc<FakeDriver>) -> (Agent, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let config = AgentConfig {
        data_dir: dir.path().join("data"),
        isolate: false,
        ..AgentConfig::default()
    };
    let agent = Agent::start_with_driver(config, Some(driver.clone()))
        .await
        .unwrap();
    (agent, dir)
}

/// Creates a process machine with restart policy `policy`; returns its id.
async fn create(agent: &Agent, policy: &str) -> String {
    let req: ClaimRequest = serde_json::from_value(json!({
        "app": "steps",
        "config": {
            "init": {"exec": ["/bin/sh", "-c", "sleep 1000"]},
            "restart": {"policy": policy},
        },
    }))
    .unwrap();
    agent.create(req).await.unwrap().id
}

async fn wait_for(agent: &Agent, id: &str, state: MachineState) {
    let waited = agent
        .wait(id, &[state], Duration::from_secs(10), None, None)
        .await;
    let now = agent.machine(id).await.map(|m| m.state);
    assert!(waited.is_ok(), "{id} never became {state}: it is {now:?}");
}

async fn events(agent: &Agent, id: &str) -> Vec<MachineEvent> {
    agent.events(id, 100).await.unwrap()
}

fn stop_request(signal: &str, timeout: &str) -> StopRequest {
    serde_json::from_value(json!({"signal": signal, "timeout": timeout})).unwrap()
}

#[tokio::test]
async fn create_start_stop_destroy_go_through_the_driver() {
    let driver = Arc::new(FakeDriver::default());
    let (agent, _dir) = start_agent(&driver).await;
    let id = create(&agent, "no").await;
    wait_for(&agent, &id, MachineState::Started).await;
    let first = driver.run(&id, 1).expect("run 1 launched");

    agent
        .stop_machine(&id, stop_request("SIGTERM", "5s"), None)
        .await
        .unwrap();
    wait_for(&agent, &id, MachineState::Stopped).await;
    assert_eq!(first.signals(), vec![SIGTERM]);

    agent.start_machine(&id, None).await.unwrap();
    wait_for(&agent, &id, MachineState::Started).await;
    assert_eq!(driver.launches(&id), 2, "a start launches a new run");

    agent.destroy_machine(&id, true, None).await.unwrap();
    wait_for(&agent, &id, MachineState::Destroyed).await;
    assert_eq!(*driver.destroyed.lock().unwrap(), vec![id.clone()]);
    let second = driver.run(&id, 2).unwrap();
    assert!(*second.over.borrow(), "destroy stopped the run first");

    let kinds: Vec<(String, String)> = events(&agent, &id)
        .await
        .into_iter()
        .map(|e| (e.kind, e.status))
        .collect();
    for expected in [
        ("launch", "created"),
        ("start", "started"),
        ("exit", "stopped"),
        ("destroy", "destroyed"),
    ] {
        assert!(
            kinds.contains(&(expected.0.into(), expected.1.into())),
            "{expected:?} not in {kinds:?}"
        );
    }
    agent.shutdown().await;
}

#[tokio::test]
async fn a_launch_that_fails_leaves_the_machine_failed_with_the_error() {
    let driver = Arc::new(FakeDriver::default());
    *driver.fail_launch.lock().unwrap() = Some(LaunchError::new(
        LaunchStep::Image,
        FailureKind::NotFound,
        "image not found: nope:latest",
    ));
    let (agent, _dir) = start_agent(&driver).await;
    let id = create(&agent, "always").await;
    wait_for(&agent, &id, MachineState::Failed).await;

    let exit = events(&agent, &id)
        .await
        .into_iter()
        .find(|e| e.kind == "exit")
        .expect("an exit event");
    assert_eq!(exit.status, "failed");
    let request = exit.request.unwrap();
    let error = request.exit_event.unwrap().error;
    assert_eq!(error.as_deref(), Some("image not found: nope:latest"));
    // The event says what kind of failure it was, at which step, and that trying again
    // would not help.
    let failure = request.failure.expect("the failure's kind");
    assert_eq!(failure.kind, FailureKind::NotFound);
    assert_eq!(failure.step, "image");
    assert!(!failure.retryable);
    // A launch failure is not an exit the restart policy retries.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        agent.machine(&id).await.unwrap().state,
        MachineState::Failed
    );
    agent.shutdown().await;
}

#[tokio::test]
async fn a_wait_for_started_is_answered_with_the_kind_of_the_launch_failure() {
    let driver = Arc::new(FakeDriver::default());
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    *driver.gate.lock().unwrap() = Some(gate.clone());
    *driver.fail_launch.lock().unwrap() = Some(LaunchError::new(
        LaunchStep::WorkDisk,
        FailureKind::NoSpace,
        "making the machine's 64 MB work disk: No space left on device (os error 28)",
    ));
    let (agent, _dir) = start_agent(&driver).await;
    let id = create(&agent, "no").await;
    let wait = agent.wait(
        &id,
        &[MachineState::Started],
        Duration::from_secs(10),
        None,
        None,
    );
    tokio::pin!(wait);
    // Polled once: the wait is watching before the launch goes on.
    tokio::select! {
        biased;
        _ = &mut wait => panic!("the wait ended before the launch"),
        _ = std::future::ready(()) => {}
    }
    gate.add_permits(1);
    let err = wait.await.expect_err("the launch failed");
    assert_eq!(err.status().0.as_u16(), 507, "{err}");
    assert_eq!(err.status().1, Some("no_space"));
    assert!(err.to_string().contains("No space left on device"), "{err}");
    // A wait for `failed` is answered as always.
    wait_for(&agent, &id, MachineState::Failed).await;
    agent.shutdown().await;
}

#[tokio::test]
async fn a_stop_that_times_out_kills_the_run() {
    let driver = Arc::new(FakeDriver::default());
    driver.ignore.lock().unwrap().push(SIGTERM);
    let (agent, _dir) = start_agent(&driver).await;
    let id = create(&agent, "no").await;
    wait_for(&agent, &id, MachineState::Started).await;

    let t0 = Instant::now();
    agent
        .stop_machine(&id, stop_request("SIGTERM", "300ms"), None)
        .await
        .unwrap();
    wait_for(&agent, &id, MachineState::Stopped).await;
    assert!(
        t0.elapsed() >= Duration::from_millis(300),
        "killed before its timeout"
    );
    let run = driver.run(&id, 1).unwrap();
    assert_eq!(run.signals(), vec![SIGTERM, SIGKILL]);
    let exit = events(&agent, &id)
        .await
        .into_iter()
        .find(|e| e.kind == "exit")
        .and_then(|e| e.request?.exit_event)
        .expect("an exit event");
    assert_eq!((exit.signal, exit.requested_stop), (SIGKILL, true));
    agent.shutdown().await;
}

#[tokio::test]
async fn the_restart_policy_relaunches_a_failed_run_but_not_a_clean_exit() {
    let driver = Arc::new(FakeDriver::default());
    let (agent, _dir) = start_agent(&driver).await;
    let id = create(&agent, "on-failure").await;
    wait_for(&agent, &id, MachineState::Started).await;

    // The workload fails on its own: run 2 is launched.
    driver.run(&id, 1).unwrap().end(Some(3), None);
    let deadline = Instant::now() + Duration::from_secs(10);
    while driver.run(&id, 2).is_none() {
        assert!(Instant::now() < deadline, "no restart after a failure");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    wait_for(&agent, &id, MachineState::Started).await;
    let restarted = events(&agent, &id).await.into_iter().any(|e| {
        e.kind == "start" && e.request.and_then(|r| r.reason).as_deref() == Some("restart policy")
    });
    assert!(restarted, "the start says it came from the restart policy");

    // It then exits cleanly: on-failure leaves it stopped.
    driver.run(&id, 2).unwrap().end(Some(0), None);
    wait_for(&agent, &id, MachineState::Stopped).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(driver.launches(&id), 2);
    assert_eq!(
        agent.machine(&id).await.unwrap().state,
        MachineState::Stopped
    );
    agent.shutdown().await;
}
