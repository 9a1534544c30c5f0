//! The actor's steps against a fake driver: the operations a user asks for and the agent's
//! own restarts, run through the real agent (store, ledger, actors, events) with no shim,
//! no runc and nothing made on the host; the agent does not isolate, so no root is needed.
//! On tokio's paused clock, as `paused_clock.rs` (which has the restart policies and the
//! stop's kill timeout).

use bazaar_agent::clock::Clock;
use bazaar_agent::{boot, market, operations, Agent, AgentConfig, Seams};
use bazaar_runtime::launch_error::{LaunchError, LaunchStep};
use bazaar_testkit::fake_driver::{FakeDriver, SIGTERM};
use bazaar_types::event::MachineEvent;
use bazaar_types::failure::FailureKind;
use bazaar_types::host::{ClaimRequest, StopRequest};
use bazaar_types::state::MachineState;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

async fn start_agent(driver: &Arc<FakeDriver>) -> (Agent, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let config = AgentConfig {
        data_dir: dir.path().join("data"),
        isolate: false,
        ..AgentConfig::default()
    };
    let seams = Seams {
        driver: Some(driver.clone()),
        clock: Clock::tokio(),
        crash: None,
        usage: None,
    };
    let agent = boot::start_in_process(config, seams).await.unwrap();
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
    market::create(agent, req).await.unwrap().id
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

#[tokio::test(start_paused = true)]
async fn create_start_stop_destroy_go_through_the_driver() {
    let driver = FakeDriver::new();
    let (agent, _dir) = start_agent(&driver).await;
    let id = create(&agent, "no").await;
    wait_for(&agent, &id, MachineState::Started).await;
    let first = driver.run(&id, 1).expect("run 1 launched");

    operations::stop_machine(&agent, &id, stop_request("SIGTERM", "5s"), None)
        .await
        .unwrap();
    wait_for(&agent, &id, MachineState::Stopped).await;
    assert_eq!(first.signals(), vec![SIGTERM]);

    operations::start_machine(&agent, &id, None).await.unwrap();
    wait_for(&agent, &id, MachineState::Started).await;
    assert_eq!(driver.launches(&id), 2, "a start launches a new run");

    operations::destroy_machine(&agent, &id, true, None)
        .await
        .unwrap();
    wait_for(&agent, &id, MachineState::Destroyed).await;
    assert_eq!(driver.destroyed(), vec![id.clone()]);
    let second = driver.run(&id, 2).unwrap();
    assert!(second.is_over(), "destroy stopped the run first");

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
    boot::shutdown(&agent).await;
}

#[tokio::test(start_paused = true)]
async fn a_launch_that_fails_leaves_the_machine_failed_with_the_error() {
    let driver = FakeDriver::new();
    driver.fail_launches(Some(LaunchError::new(
        LaunchStep::Image,
        FailureKind::NotFound,
        "image not found: nope:latest",
    )));
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
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(
        agent.machine(&id).await.unwrap().state,
        MachineState::Failed
    );
    boot::shutdown(&agent).await;
}

#[tokio::test(start_paused = true)]
async fn a_wait_for_started_is_answered_with_the_kind_of_the_launch_failure() {
    let driver = FakeDriver::new();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    driver.gate_launches(gate.clone());
    driver.fail_launches(Some(LaunchError::new(
        LaunchStep::WorkDisk,
        FailureKind::NoSpace,
        "making the machine's 64 MB work disk: No space left on device (os error 28)",
    )));
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
    boot::shutdown(&agent).await;
}
