//! Kills the agent with SIGKILL at every step boundary of every operation (fault injection:
//! `BAZAAR_CRASH_AT=<op>:<k>`), restarts it, and checks that the operation completed exactly
//! once: the machine settles in the right state and its workload ran the right number of
//! times (each run appends a line to a counter file).

use crate::common;

use bazaar_testkit::{pid_alive, process_config, AgentOptions, TestAgent};
use bazaar_types::host::{ClaimRequest, StopRequest, UpdateRequest};
use bazaar_types::state::MachineState;
use common::*;
use std::time::Duration;

/// Number of step boundaries of each operation (0 = accepted, k = step k recorded).
const CASES: &[(&str, u32)] = &[
    ("create", 1),
    ("start", 1),
    ("stop", 2),
    ("restart", 3),
    ("update", 3),
    ("destroy", 3),
];

fn request(id: &str, version: &str) -> ClaimRequest {
    // In the machine's work directory (its cwd), which lasts across its runs.
    let script = format!("echo {version} >> runs; exec sleep 1000");
    let mut config = process_config(&["sh", "-c", &script]);
    config.env.insert("VERSION".into(), version.into());
    ClaimRequest {
        app: "crash".into(),
        app_id: String::new(),
        name: None,
        region: None,
        config,
        skip_launch: false,
        machine_id: Some(id.into()),
        lease_ttl: None,
        skip_service_registration: false,
        placement: None,
        epoch: 0,
        displaced_from: None,
    }
}

/// Runs operation `op` on a machine while the agent is set to die at `boundary`.
async fn crash_case(op: &str, boundary: u32) {
    // The runs are counted in a file of the work directory, read from the host: without a
    // disk of its own (`--machine-disk-mb 0`), a stopped machine's work directory stays
    // readable there (a restarted agent unmounts the disks of machines that are not running;
    // `machine_disk.rs` covers those across kill -9).
    let mut opts = AgentOptions::new(EXE);
    opts.extra_args
        .extend(["--machine-disk-mb".to_string(), "0".to_string()]);
    let mut agent = TestAgent::start(opts).expect("agent starts");
    let id = format!("c{op}{boundary}").replace('_', "");
    let id = format!(
        "{:0<14}",
        id.chars()
            .filter(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
            .collect::<String>()
    );
    let c = agent.client();
    let counter = work_file(&agent, &id, "runs");

    // Bring the machine to the state the operation starts from (without faults).
    if op != "create" {
        c.create(&request(&id, "v1")).await.unwrap();
        wait_state(&c, &id, MachineState::Started).await;
        // Started means spawned: its first line may not be written yet, and a count taken
        // before it would expect one run too few (CI saw `update:1` so).
        bazaar_testkit::eventually(Duration::from_secs(10), || async {
            (lines(&counter) == 1).then_some(())
        })
        .await
        .unwrap_or_else(|_| panic!("{op}: the first run never wrote its line"));
        if op == "start" {
            c.stop(&id, &StopRequest::default()).await.unwrap();
            wait_state(&c, &id, MachineState::Stopped).await;
        }
    }
    let runs_before = lines(&counter);
    let pid_before = c.machine(&id).await.ok().and_then(|m| m.pid);

    // Restart with the fault armed, then run the operation.
    agent.kill9();
    let at = format!("{op}:{boundary}");
    agent.spawn(&[("BAZAAR_CRASH_AT", &at)]).unwrap();
    let c = agent.client();
    let _ = match op {
        "create" => c.create(&request(&id, "v1")).await.map(|_| ()),
        "start" => c.start(&id).await.map(|_| ()),
        "stop" => c.stop(&id, &StopRequest::default()).await.map(|_| ()),
        "restart" => c.restart(&id, &StopRequest::default()).await.map(|_| ()),
        "update" => {
            let config = request(&id, "v2").config;
            c.update(
                &id,
                &UpdateRequest {
                    config,
                    skip_launch: false,
                    current_version: None,
                    ..Default::default()
                },
            )
            .await
            .map(|_| ())
        }
        "destroy" => c.destroy(&id, true).await.map(|_| ()),
        _ => unreachable!(),
    };
    agent
        .wait_exit(Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("{at}: the agent did not crash: {e}\n{}", agent.log_tail()));

    // Restart without faults: the operation must finish, once.
    agent.spawn(&[]).unwrap();
    let c = agent.client();
    let (state, runs) = match op {
        "create" => (MachineState::Started, 1),
        "start" => (MachineState::Started, runs_before + 1),
        "stop" => (MachineState::Stopped, runs_before),
        "restart" | "update" => (MachineState::Started, runs_before + 1),
        "destroy" => (MachineState::Destroyed, runs_before),
        _ => unreachable!(),
    };
    let m = wait_state(&c, &id, state).await;
    // Let anything that would wrongly run twice show itself.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The work directory goes with a destroyed machine (a wrong relaunch would make it anew).
    let counted = if op == "destroy" { 0 } else { runs };
    assert_eq!(
        lines(&counter),
        counted,
        "{at}: workload ran {} times, expected {counted}",
        lines(&counter)
    );
    let m2 = c.machine(&id).await.unwrap();
    assert_eq!(m2.state, state, "{at}: state changed after settling");
    match op {
        "stop" | "destroy" => {
            let pid = pid_before.expect("was running");
            assert!(!pid_alive(pid), "{at}: workload still alive");
        }
        _ => {
            let pid = m.pid.expect("started machine has a pid");
            assert!(pid_alive(pid), "{at}: workload not running");
            if let Some(before) = pid_before {
                if op != "start" {
                    assert_ne!(pid, before, "{at}: workload was not relaunched");
                    assert!(!pid_alive(before), "{at}: old workload survived");
                }
            }
        }
    }
    if op == "update" {
        let text = std::fs::read_to_string(&counter).unwrap();
        assert_eq!(
            text.lines().last(),
            Some("v2"),
            "{at}: the new version runs"
        );
        assert_eq!(
            c.versions(&id).await.unwrap().len(),
            2,
            "{at}: one new version"
        );
    }
    if op == "destroy" {
        assert_eq!(
            c.info().await.unwrap().committed.memory_mb,
            0,
            "{at}: resources returned"
        );
    }
    let starts = c
        .events(&id)
        .await
        .unwrap()
        .iter()
        .filter(|e| e.kind == "start")
        .count();
    assert_eq!(starts, runs, "{at}: one start event per run");
    drop(agent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_survives_a_crash_at_every_step_boundary() {
    for (op, steps) in CASES {
        for boundary in 0..=*steps {
            crash_case(op, boundary).await;
        }
    }
    let _ = TestAgent::start; // the kit's entry point, used through common::agent
}
