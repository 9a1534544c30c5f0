//! What a client polling a machine sees while an operation runs on it, through the real
//! agent (store, actors, reads) with the test kit's fake driver, on several threads as the
//! agent serves requests: each read is of one moment, never the record from before a step
//! beside the step's events or after the operation's transient state was cleared.
//!
//! `bazaar machine restart` (`crates/cli/src/machine_wait.rs`) once failed with "it is
//! stopped" right after the restart's start, about once in five CI runs: `GET` read the
//! record before the launch step's commit, its events after (the new `start`), and the
//! transient state after the actor had cleared it, so it showed `stopped` beside the new
//! start. Here, with the fake driver's instant runs, that read came in about one restart
//! in four. A stress test: the interleaving is between threads, where no seam reaches.

use bazaar_agent::clock::Clock;
use bazaar_agent::{boot, market, operations, AgentConfig, Seams};
use bazaar_testkit::fake_driver::FakeDriver;
use bazaar_types::host::{ClaimRequest, StopRequest};
use bazaar_types::machine::Machine;
use bazaar_types::state::MachineState;
use serde_json::json;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Restarts run (each a few store commits, fsynced).
const RESTARTS: usize = 60;
/// Tasks reading the machine during each restart.
const READERS: usize = 2;

/// What a read during a restart shows that no moment of the machine had, if anything: the
/// restart is shown `restarting` until the read that shows its new `start` event, with the
/// machine `started`.
fn inconsistency(m: &Machine, before: &HashSet<String>) -> Option<String> {
    let new: Vec<String> = m
        .events
        .iter()
        .filter(|e| !before.contains(&e.id))
        .map(|e| format!("{}:{}", e.kind, e.status))
        .collect();
    let started = new.iter().any(|e| e == "start:started");
    match m.state {
        MachineState::Restarting => None,
        MachineState::Started if started => None,
        state => Some(format!("{state} with the new events {new:?}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_machine_read_during_a_restart_is_restarting_until_it_has_started() {
    let driver = FakeDriver::new();
    let dir = tempfile::tempdir().unwrap();
    let config = AgentConfig {
        data_dir: dir.path().join("data"),
        isolate: false,
        ..AgentConfig::default()
    };
    let seams = Seams {
        driver: Some(driver.clone()),
        clock: Clock::System,
        crash: None,
        usage: None,
    };
    let agent = boot::start_in_process(config, seams).await.unwrap();
    let req: ClaimRequest = serde_json::from_value(json!({
        "app": "reads",
        "config": {"init": {"exec": ["/bin/sh", "-c", "sleep 1000"]}},
    }))
    .unwrap();
    let id = market::create(&agent, req).await.unwrap().id;
    let waited = agent.wait(
        &id,
        &[MachineState::Started],
        Duration::from_secs(10),
        None,
        None,
    );
    waited.await.unwrap();

    let seen_wrong = Arc::new(Mutex::new(Vec::new()));
    for round in 0..RESTARTS {
        let before: HashSet<String> = agent
            .machine(&id)
            .await
            .unwrap()
            .events
            .into_iter()
            .map(|e| e.id)
            .collect();
        let stop: StopRequest = serde_json::from_value(json!({})).unwrap();
        operations::restart_machine(&agent, &id, stop, None)
            .await
            .unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..READERS)
            .map(|_| {
                let (agent, id, before) = (agent.clone(), id.clone(), before.clone());
                let (done, seen_wrong) = (done.clone(), seen_wrong.clone());
                tokio::spawn(async move {
                    while !done.load(Ordering::SeqCst) {
                        let m = agent.machine(&id).await.unwrap();
                        if let Some(wrong) = inconsistency(&m, &before) {
                            seen_wrong
                                .lock()
                                .unwrap()
                                .push(format!("restart {round}: {wrong}"));
                        }
                        if m.state == MachineState::Started {
                            done.store(true, Ordering::SeqCst);
                        }
                        tokio::task::yield_now().await;
                    }
                })
            })
            .collect();
        for reader in readers {
            reader.await.unwrap();
        }
    }
    let seen_wrong = seen_wrong.lock().unwrap().clone();
    assert!(
        seen_wrong.is_empty(),
        "{} reads of {RESTARTS} restarts showed what never was, first: {:?}",
        seen_wrong.len(),
        &seen_wrong[..seen_wrong.len().min(3)]
    );
    boot::shutdown(&agent).await;
}
