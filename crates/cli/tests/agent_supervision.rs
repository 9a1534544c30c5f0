//! Workloads live under shims, not under the agent: a kill -9 of the agent leaves them
//! running and the restarted agent re-adopts them (same pids); a killed shim takes its
//! workload with it and the restart policy applies; a workload past its memory limit is
//! killed alone, with an OOM event.

use crate::common;

use bazaar_testkit::{create_request, pid_alive};
use bazaar_types::host::StopRequest;
use bazaar_types::state::MachineState;
use common::*;
use std::time::Duration;

/// The live shim of a machine's newest run, from its `shim.pid` file.
fn shim_pid(data_dir: &std::path::Path, machine_id: &str) -> i32 {
    let runs = data_dir.join("machines").join(machine_id).join("runs");
    let newest = std::fs::read_dir(&runs)
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u64>().ok()))
        .max()
        .expect("a run");
    let text = std::fs::read_to_string(runs.join(newest.to_string()).join("shim.pid")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["shim_pid"].as_i64().unwrap() as i32
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workloads_survive_agent_kill9_and_are_readopted() {
    let mut agent = agent();
    let c = agent.client();
    let mut machines = Vec::new();
    for _ in 0..5 {
        let m = c
            .create(&create_request("keep", &["sleep", "1000"]))
            .await
            .unwrap();
        machines.push(m.id);
    }
    let mut pids = Vec::new();
    for id in &machines {
        pids.push(wait_state(&c, id, MachineState::Started).await.pid.unwrap());
    }
    agent.kill9();
    for pid in &pids {
        assert!(pid_alive(*pid), "workload {pid} died with the agent");
    }
    agent.spawn(&[]).unwrap();
    let c = agent.client();
    for (id, pid) in machines.iter().zip(&pids) {
        let m = c.machine(id).await.unwrap();
        assert_eq!(m.state, MachineState::Started);
        assert_eq!(m.pid, Some(*pid), "same pid after re-adoption");
    }
    // The re-adopted machines are fully manageable.
    c.stop(&machines[0], &StopRequest::default()).await.unwrap();
    wait_state(&c, &machines[0], MachineState::Stopped).await;
    assert!(!pid_alive(pids[0]));
    c.destroy(&machines[1], true).await.unwrap();
    wait_state(&c, &machines[1], MachineState::Destroyed).await;
    assert!(!pid_alive(pids[1]));
    // And a re-adopted workload that exits is still noticed.
    bazaar_testkit::signal(pids[2], libc::SIGKILL);
    bazaar_testkit::eventually(Duration::from_secs(10), || async {
        let m = c.machine(&machines[2]).await.ok()?;
        (m.state == MachineState::Started && m.pid.is_some() && m.pid != Some(pids[2]))
            .then_some(())
    })
    .await
    .expect("restart policy relaunches a re-adopted workload that died");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_shim_kills_its_workload_and_the_restart_policy_applies() {
    let agent = agent();
    let c = agent.client();
    let m = c
        .create(&create_request("shimkill", &["sleep", "1000"]))
        .await
        .unwrap();
    let m = wait_state(&c, &m.id, MachineState::Started).await;
    let pid = m.pid.unwrap();
    let shim = shim_pid(&agent.data_dir, &m.id);
    assert!(pid_alive(shim));
    // Shims run from the small `bazaar-shim` that cargo builds beside `bazaar`.
    let exe = std::fs::read_link(format!("/proc/{shim}/exe")).unwrap();
    assert_eq!(exe.file_name().unwrap(), "bazaar-shim", "{}", exe.display());
    bazaar_testkit::signal(shim, libc::SIGKILL);
    bazaar_testkit::eventually(Duration::from_secs(5), || async {
        (!pid_alive(pid)).then_some(())
    })
    .await
    .expect("the workload dies with its shim");
    let restarted = bazaar_testkit::eventually(Duration::from_secs(10), || async {
        let x = c.machine(&m.id).await.ok()?;
        (x.state == MachineState::Started && x.pid.is_some_and(|p| p != pid)).then_some(x)
    })
    .await
    .expect("on-failure (the default) restarts it");
    assert!(pid_alive(restarted.pid.unwrap()));
    let events = c.events(&m.id).await.unwrap();
    let exit = events.iter().find(|e| e.kind == "exit").unwrap();
    let x = exit.request.as_ref().unwrap().exit_event.as_ref().unwrap();
    assert_eq!(x.signal, 9, "{x:?}");
    assert!(x.restarting);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_over_its_memory_limit_is_killed_alone_with_an_oom_event() {
    if !bazaar_testkit::can_run(is_root(), "root (cgroup limits)") {
        return;
    }
    let agent = agent();
    let c = agent.client();
    let sibling = c
        .create(&create_request("oom", &["sleep", "1000"]))
        .await
        .unwrap();
    let sibling = wait_state(&c, &sibling.id, MachineState::Started).await;
    // 256 MB limit; the workload touches 600 MB.
    let mut req = create_request(
        "oom",
        &[
            "python3",
            "-c",
            "a = b'x' * (600 * 1024 * 1024); import time; time.sleep(60)",
        ],
    );
    req.config.restart = Some(serde_json::from_value(serde_json::json!({"policy": "no"})).unwrap());
    let hog = c.create(&req).await.unwrap();
    wait_state(&c, &hog.id, MachineState::Stopped).await;
    let events = c.events(&hog.id).await.unwrap();
    let exit = events
        .iter()
        .find(|e| e.kind == "exit")
        .expect("an exit event");
    let x = exit.request.as_ref().unwrap().exit_event.as_ref().unwrap();
    assert!(x.oom_killed, "exit event says OOM: {exit:?}");
    assert_eq!(x.signal, 9);
    assert!(
        pid_alive(sibling.pid.unwrap()),
        "the sibling machine is untouched"
    );
    assert_eq!(
        c.machine(&sibling.id).await.unwrap().state,
        MachineState::Started
    );
}
