//! The agent shell on tokio's paused clock: the real agent (store, ledger, actors, its
//! loops) in-process with the test kit's fake driver, its clock tokio's ([`Clock::tokio`]),
//! so leases expire, backoffs pass and kill timeouts fire in no real time: each test takes
//! milliseconds. A crash is a panic at an operation's step boundary ([`CrashPoint`]), after
//! which a new agent opens the same data dir with the same runs, as after a real crash.
//! The root tests in `crates/cli/tests` keep what only real processes and the kernel show.

use bazaar_agent::clock::Clock;
use bazaar_agent::error::AgentError;
use bazaar_agent::fault::CrashPoint;
use bazaar_agent::leases;
use bazaar_agent::{boot, market, operations, Agent, AgentConfig, Seams};
use bazaar_testkit::fake_driver::{FakeDriver, SIGKILL, SIGTERM};
use bazaar_types::host::{BidRequest, BidResponse, ClaimRequest, StopRequest};
use bazaar_types::state::MachineState;
use serde_json::{json, Value};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Long past any backoff (at most 10 s): what has not happened by then will not.
const LATER: Duration = Duration::from_secs(60);

/// A host: its data dir, its runs (which outlive an agent, as shims do) and its clock.
struct Host {
    driver: Arc<FakeDriver>,
    dir: tempfile::TempDir,
    clock: Clock,
}

impl Host {
    fn new() -> Host {
        Host {
            driver: FakeDriver::new(),
            dir: tempfile::tempdir().unwrap(),
            clock: Clock::tokio(),
        }
    }

    async fn start(&self) -> Agent {
        self.start_with(None).await
    }

    async fn start_with(&self, crash: Option<Arc<CrashPoint>>) -> Agent {
        let config = AgentConfig {
            data_dir: self.dir.path().join("data"),
            isolate: false,
            cpus: Some(4),
            memory_mb: Some(4096),
            ..AgentConfig::default()
        };
        let seams = Seams {
            driver: Some(self.driver.clone()),
            clock: self.clock,
            crash,
            usage: None,
        };
        boot::start_in_process(config, seams).await.unwrap()
    }
}

/// `fut`, which must finish within an hour of the paused clock (a stuck agent fails the
/// test at once: the idle clock jumps to the deadline).
async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(3600), fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: not within an hour"),
    }
}

/// Creates a process machine with `config` merged into a minimal one; returns its id.
async fn create_with(agent: &Agent, config: Value) -> String {
    let mut base = json!({"init": {"exec": ["/bin/sh", "-c", "sleep 1000"]}});
    for (k, v) in config.as_object().unwrap() {
        base[k] = v.clone();
    }
    let req: ClaimRequest =
        serde_json::from_value(json!({"app": "paused", "config": base})).unwrap();
    market::create(agent, req).await.unwrap().id
}

async fn create(agent: &Agent, policy: &str) -> String {
    create_with(agent, json!({"restart": {"policy": policy}})).await
}

async fn wait_for(agent: &Agent, id: &str, state: MachineState) {
    let waited = agent
        .wait(id, &[state], Duration::from_secs(60), None, None)
        .await;
    let now = agent.machine(id).await.map(|m| m.state);
    assert!(waited.is_ok(), "{id} never became {state}: it is {now:?}");
}

async fn state(agent: &Agent, id: &str) -> MachineState {
    agent.machine(id).await.unwrap().state
}

fn stop_request(timeout: Option<&str>) -> StopRequest {
    serde_json::from_value(json!({"signal": "SIGTERM", "timeout": timeout})).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_lease_not_renewed_ends_at_its_ttl_and_another_holder_can_take_it() {
    let host = Host::new();
    let agent = host.start().await;
    let id = create(&agent, "no").await;
    wait_for(&agent, &id, MachineState::Started).await;

    let (a, created) = leases::lease_acquire(&agent, &id, 30, "a", None)
        .await
        .unwrap();
    assert!(created);
    let taken = leases::lease_acquire(&agent, &id, 30, "b", None).await;
    assert!(matches!(taken, Err(AgentError::Conflict(_))), "{taken:?}");
    let stop = operations::stop_machine(&agent, &id, stop_request(None), None).await;
    assert!(matches!(stop, Err(AgentError::Conflict(_))), "{stop:?}");

    // Renewed by its holder at 20 s, it lasts until 50 s.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let (renewed, created) = leases::lease_acquire(&agent, &id, 30, "a", Some(&a.nonce))
        .await
        .unwrap();
    assert!(!created);
    assert_eq!(renewed.nonce, a.nonce);
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert!(
        leases::lease_get(&agent, &id).await.unwrap().is_some(),
        "at 49 s"
    );
    let taken = leases::lease_acquire(&agent, &id, 30, "b", None).await;
    assert!(matches!(taken, Err(AgentError::Conflict(_))), "{taken:?}");

    // Not renewed again, it has ended at 51 s: another holder takes the machine.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        leases::lease_get(&agent, &id).await.unwrap().is_none(),
        "at 51 s"
    );
    let (b, created) = leases::lease_acquire(&agent, &id, 30, "b", None)
        .await
        .unwrap();
    assert!(created);
    assert_ne!(b.nonce, a.nonce);
    let stop = operations::stop_machine(&agent, &id, stop_request(None), Some(&a.nonce)).await;
    assert!(
        matches!(stop, Err(AgentError::Conflict(_))),
        "the old holder: {stop:?}"
    );
    operations::stop_machine(&agent, &id, stop_request(None), Some(&b.nonce))
        .await
        .unwrap();
    wait_for(&agent, &id, MachineState::Stopped).await;
    boot::shutdown(&agent).await;
}

/// Ends the newest run of `id` (its `n`-th launch) with `exit_code`, then returns how long
/// (on the paused clock) until the next launch.
async fn fail_and_time_relaunch(host: &Host, id: &str, n: usize, exit_code: i32) -> Duration {
    let run = within("launch", host.driver.launched(id, n)).await;
    let t0 = Instant::now();
    run.end(Some(exit_code), None);
    within("relaunch", host.driver.launched(id, n + 1)).await;
    t0.elapsed()
}

#[tokio::test(start_paused = true)]
async fn on_failure_restarts_with_a_doubling_backoff_up_to_max_retries() {
    let host = Host::new();
    let agent = host.start().await;
    let id = create_with(
        &agent,
        json!({"restart": {"policy": "on-failure", "max_retries": 2}}),
    )
    .await;
    wait_for(&agent, &id, MachineState::Started).await;
    for (n, backoff_ms) in [(1, 100), (2, 200)] {
        let waited = fail_and_time_relaunch(&host, &id, n, 1).await;
        let backoff = Duration::from_millis(backoff_ms);
        assert!(
            waited >= backoff && waited < backoff * 2,
            "restart {n} after {waited:?}, not {backoff:?}"
        );
    }
    wait_for(&agent, &id, MachineState::Started).await;
    // The third failure is one more than max_retries: the machine stays stopped.
    within("launch", host.driver.launched(&id, 3))
        .await
        .end(Some(1), None);
    wait_for(&agent, &id, MachineState::Stopped).await;
    tokio::time::sleep(LATER).await;
    assert_eq!(host.driver.launches(&id), 3);
    assert_eq!(state(&agent, &id).await, MachineState::Stopped);
    let machine = agent.machine(&id).await.unwrap();
    assert_eq!(machine.state, MachineState::Stopped);
    boot::shutdown(&agent).await;
}

#[tokio::test(start_paused = true)]
async fn always_restarts_a_clean_exit_too_and_no_restarts_nothing() {
    let host = Host::new();
    let agent = host.start().await;
    let always = create(&agent, "always").await;
    let no = create(&agent, "no").await;
    wait_for(&agent, &always, MachineState::Started).await;
    wait_for(&agent, &no, MachineState::Started).await;
    // `always` ignores the exit code and the retry count; the backoff doubles.
    for (n, backoff_ms) in [(1, 100), (2, 200), (3, 400), (4, 800)] {
        let waited = fail_and_time_relaunch(&host, &always, n, 0).await;
        let backoff = Duration::from_millis(backoff_ms);
        assert!(
            waited >= backoff && waited < backoff * 2,
            "restart {n} after {waited:?}, not {backoff:?}"
        );
    }
    wait_for(&agent, &always, MachineState::Started).await;

    // `no`: a failed run stays failed, a minute later too.
    within("launch", host.driver.launched(&no, 1))
        .await
        .end(Some(1), None);
    wait_for(&agent, &no, MachineState::Stopped).await;
    tokio::time::sleep(LATER).await;
    assert_eq!(host.driver.launches(&no), 1);
    assert_eq!(state(&agent, &no).await, MachineState::Stopped);
    boot::shutdown(&agent).await;
}

#[tokio::test(start_paused = true)]
async fn a_stop_kills_a_run_that_ignores_its_signal_after_the_kill_timeout() {
    let host = Host::new();
    host.driver.ignore_signal(SIGTERM);
    let agent = host.start().await;
    // The request's timeout, then the machine's stop_config when the request has none.
    let asked = create(&agent, "no").await;
    let configured = create_with(
        &agent,
        json!({"stop_config": {"signal": "SIGTERM", "timeout": "45s"}}),
    )
    .await;
    for (id, timeout, expected) in [(&asked, Some("30s"), 30), (&configured, None, 45)] {
        wait_for(&agent, id, MachineState::Started).await;
        let t0 = Instant::now();
        operations::stop_machine(&agent, id, stop_request(timeout), None)
            .await
            .unwrap();
        let run = host.driver.run(id, 1).unwrap();
        within("the kill", run.ended()).await;
        let waited = t0.elapsed();
        let expected = Duration::from_secs(expected);
        assert!(
            waited >= expected && waited < expected + Duration::from_secs(1),
            "{id} killed after {waited:?}, not {expected:?}"
        );
        assert_eq!(run.signals(), vec![SIGTERM, SIGKILL]);
        wait_for(&agent, id, MachineState::Stopped).await;
    }
    boot::shutdown(&agent).await;
}

/// Runs operation `op` on a machine made by `setup`, crashing the agent at boundary `k`
/// (0: accepted, k: its k-th step recorded), then starts a new agent on the same data dir
/// and runs: returns the agent (which has finished the operation) and the machine.
async fn crash_and_resume(host: &Host, op: &str, k: u32) -> (Agent, String) {
    let crash = Arc::new(CrashPoint::unwind_at(op, k));
    let agent = host.start_with(Some(crash.clone())).await;
    let id = match op {
        "create" => String::new(),
        _ => {
            let id = create(&agent, "no").await;
            wait_for(&agent, &id, MachineState::Started).await;
            if op == "start" {
                operations::stop_machine(&agent, &id, stop_request(None), None)
                    .await
                    .unwrap();
                wait_for(&agent, &id, MachineState::Stopped).await;
            }
            id
        }
    };
    let call = {
        let (agent, id) = (agent.clone(), id.clone());
        let op = op.to_owned();
        tokio::spawn(async move {
            match op.as_str() {
                "create" => create(&agent, "no").await,
                "start" => operations::start_machine(&agent, &id, None)
                    .await
                    .map(|m| m.id)
                    .unwrap(),
                "stop" => operations::stop_machine(&agent, &id, stop_request(None), None)
                    .await
                    .map(|m| m.id)
                    .unwrap(),
                "restart" => operations::restart_machine(&agent, &id, stop_request(None), None)
                    .await
                    .map(|m| m.id)
                    .unwrap(),
                "destroy" => operations::destroy_machine(&agent, &id, true, None)
                    .await
                    .map(|m| m.id)
                    .unwrap(),
                other => panic!("{other}"),
            }
        })
    };
    let answered = call.await;
    if k == 0 {
        // The operation was recorded, then the agent died before answering.
        assert!(answered.unwrap_err().is_panic(), "{op}:{k} answered");
    } else {
        answered.unwrap();
        // The actor runs until it dies at the boundary; the clock moves once all is idle.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(crash.fired(), "{op}:{k} never reached");
    boot::shutdown(&agent).await;
    drop(agent);

    let agent = host.start().await;
    let id = match op {
        "create" => {
            let all = agent.machines(None, true).await.unwrap();
            assert_eq!(all.len(), 1, "{op}:{k}: {all:?}");
            all[0].id.clone()
        }
        _ => id,
    };
    (agent, id)
}

#[tokio::test(start_paused = true)]
async fn an_operation_cut_by_a_crash_at_any_step_finishes_once_after_a_restart() {
    for (op, steps) in [
        ("create", 1),
        ("start", 1),
        ("stop", 2),
        ("restart", 3),
        ("destroy", 3),
    ] {
        for k in 0..=steps {
            let host = Host::new();
            let (agent, id) = crash_and_resume(&host, op, k).await;
            let (settled, launches) = match op {
                "create" => (MachineState::Started, 1),
                "start" => (MachineState::Started, 2),
                "stop" => (MachineState::Stopped, 1),
                "restart" => (MachineState::Started, 2),
                _ => (MachineState::Destroyed, 1),
            };
            // A restart's machine is `started` before and after: its new run shows it done.
            within("the operation", host.driver.launched(&id, launches)).await;
            wait_for(&agent, &id, settled).await;
            // Once: no step that was recorded ran again, none was skipped.
            assert_eq!(host.driver.launches(&id), launches, "{op}:{k}: launches");
            if matches!(op, "stop" | "restart" | "destroy") {
                let first = host.driver.run(&id, 1).unwrap();
                // Sent once (a forced destroy kills).
                let signal = if op == "destroy" { SIGKILL } else { SIGTERM };
                assert_eq!(first.signals(), vec![signal], "{op}:{k}: signals");
                assert!(first.is_over());
            }
            let destroyed = host.driver.destroyed();
            let expected: Vec<String> = if op == "destroy" {
                vec![id.clone()]
            } else {
                vec![]
            };
            assert_eq!(destroyed, expected, "{op}:{k}: destroys");
            // Nothing is left to do: a minute later it is as it settled.
            tokio::time::sleep(LATER).await;
            assert_eq!(state(&agent, &id).await, settled, "{op}:{k}");
            assert_eq!(
                host.driver.launches(&id),
                launches,
                "{op}:{k}: launches later"
            );
            boot::shutdown(&agent).await;
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_restarted_agent_re_adopts_live_runs_and_records_runs_that_ended_meanwhile() {
    let host = Host::new();
    let agent = host.start().await;
    let live = create(&agent, "on-failure").await;
    let ended = create(&agent, "on-failure").await;
    let ended_clean = create(&agent, "on-failure").await;
    for id in [&live, &ended, &ended_clean] {
        wait_for(&agent, id, MachineState::Started).await;
    }
    boot::shutdown(&agent).await;
    drop(agent);
    // While the agent is away, two runs end: one fails, one exits cleanly.
    host.driver.run(&ended, 1).unwrap().end(Some(2), None);
    host.driver.run(&ended_clean, 1).unwrap().end(Some(0), None);

    let agent = host.start().await;
    // The live run is adopted, not launched again, and watched: its exit is seen.
    assert_eq!(state(&agent, &live).await, MachineState::Started);
    assert_eq!(host.driver.launches(&live), 1);
    // The failed one is restarted by its policy; the clean exit leaves its machine stopped.
    within("restart", host.driver.launched(&ended, 2)).await;
    wait_for(&agent, &ended, MachineState::Started).await;
    wait_for(&agent, &ended_clean, MachineState::Stopped).await;
    host.driver.run(&live, 1).unwrap().end(Some(1), None);
    within("restart", host.driver.launched(&live, 2)).await;
    wait_for(&agent, &live, MachineState::Started).await;
    tokio::time::sleep(LATER).await;
    assert_eq!(host.driver.launches(&ended_clean), 1);
    boot::shutdown(&agent).await;
}

fn bid_request(cpus: u32, memory_mb: u64, ttl_ms: u64) -> BidRequest {
    serde_json::from_value(json!({"cpus": cpus, "memory_mb": memory_mb, "ttl_ms": ttl_ms})).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_reservation_not_claimed_in_time_gives_its_capacity_back() {
    let host = Host::new();
    let agent = host.start().await;
    // The whole host (4 cpus, 4096 MB), for 3 s.
    let BidResponse::Bid {
        reservation_id,
        expires_at_ms,
        ..
    } = market::bid(&agent, bid_request(4, 4096, 3000))
        .await
        .unwrap()
    else {
        panic!("no bid on an empty host");
    };
    assert_eq!(expires_at_ms, host.clock.now_ms() + 3000);
    let refused = market::bid(&agent, bid_request(1, 256, 3000))
        .await
        .unwrap();
    assert!(
        matches!(
            refused,
            BidResponse::Refusal {
                retryable: true,
                ..
            }
        ),
        "{refused:?}"
    );

    tokio::time::sleep(Duration::from_secs(2)).await;
    let refused = market::bid(&agent, bid_request(1, 256, 3000))
        .await
        .unwrap();
    assert!(
        matches!(refused, BidResponse::Refusal { .. }),
        "at 2 s: {refused:?}"
    );

    // Past its expiry the host's housekeeping has dropped it: a claim fails, a bid fits.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let req: ClaimRequest = serde_json::from_value(json!({
        "app": "paused",
        "config": {"init": {"exec": ["/bin/true"]}, "guest": {"cpus": 4, "memory_mb": 4096}},
    }))
    .unwrap();
    let claim = market::claim(&agent, &reservation_id, req).await;
    assert!(
        matches!(claim, Err(AgentError::ReservationNotFound(_))),
        "{claim:?}"
    );
    let bid = market::bid(&agent, bid_request(4, 4096, 3000))
        .await
        .unwrap();
    assert!(
        matches!(bid, BidResponse::Bid { .. }),
        "after expiry: {bid:?}"
    );
    boot::shutdown(&agent).await;
}
