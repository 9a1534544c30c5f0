//! A machine's whole life through the host interface: create, stop, start, restart, update,
//! destroy; its identity in the environment; the restart policy; and bad input, which gets
//! a clear 4xx and changes nothing.

use crate::common;

use bazaar_testkit::{create_request, pid_alive, process_config};
use bazaar_types::duration::GoDuration;
use bazaar_types::host::{StopRequest, UpdateRequest};
use bazaar_types::state::MachineState;
use common::*;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_create_stop_start_restart_update_destroy() {
    let agent = agent();
    let c = agent.client();
    let m = c
        .create(&create_request("web", &["sleep", "1000"]))
        .await
        .unwrap();
    assert_eq!(m.app, "web");
    assert_eq!(m.id.len(), 14);
    let m = wait_state(&c, &m.id, MachineState::Started).await;
    let pid1 = m.pid.expect("a started machine has a pid");
    assert!(pid_alive(pid1));

    c.stop(&m.id, &StopRequest::default()).await.unwrap();
    let stopped = wait_state(&c, &m.id, MachineState::Stopped).await;
    assert!(stopped.pid.is_none());
    assert!(!pid_alive(pid1), "stop ends the workload");

    c.start(&m.id).await.unwrap();
    let m2 = wait_state(&c, &m.id, MachineState::Started).await;
    let pid2 = m2.pid.unwrap();
    assert_ne!(pid1, pid2);

    c.restart(&m.id, &StopRequest::default()).await.unwrap();
    let m3 = bazaar_testkit::eventually(Duration::from_secs(20), || async {
        c.machine(&m.id)
            .await
            .ok()
            .filter(|x| x.state == MachineState::Started && x.pid != Some(pid2))
    })
    .await
    .unwrap();
    assert!(!pid_alive(pid2));

    let mut cfg = process_config(&["sleep", "2000"]);
    cfg.env.insert("VERSION".into(), "2".into());
    let updated = c
        .update(
            &m.id,
            &UpdateRequest {
                config: cfg.clone(),
                skip_launch: false,
                current_version: Some(m3.instance_id.clone()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_ne!(
        updated.instance_id, m3.instance_id,
        "an update makes a new version"
    );
    let m4 = bazaar_testkit::eventually(Duration::from_secs(20), || async {
        c.machine(&m.id)
            .await
            .ok()
            .filter(|x| x.state == MachineState::Started && x.pid != m3.pid)
    })
    .await
    .unwrap();
    assert_eq!(m4.config.env.get("VERSION").map(String::as_str), Some("2"));
    let versions = c.versions(&m.id).await.unwrap();
    assert_eq!(versions.len(), 2);
    // A stale current_version is refused with 409 and changes nothing.
    let err = c
        .update(
            &m.id,
            &UpdateRequest {
                config: cfg,
                skip_launch: false,
                current_version: Some(m3.instance_id.clone()),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(409), "{err}");
    assert_eq!(c.versions(&m.id).await.unwrap().len(), 2);

    let pid4 = m4.pid.unwrap();
    // A running machine is destroyed only with force (412 otherwise, as on Fly).
    assert_eq!(
        c.destroy(&m.id, false).await.unwrap_err().status(),
        Some(412)
    );
    c.destroy(&m.id, true).await.unwrap();
    wait_state(&c, &m.id, MachineState::Destroyed).await;
    assert!(!pid_alive(pid4));
    assert!(c.machines(Some("web"), false).await.unwrap().is_empty());
    assert_eq!(
        c.machines(Some("web"), true).await.unwrap().len(),
        1,
        "a tombstone remains"
    );
    let info = c.info().await.unwrap();
    assert_eq!(info.committed.memory_mb, 0, "destroy returns the resources");

    let kinds: Vec<String> = c
        .events(&m.id)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    for k in ["launch", "start", "exit", "update", "destroy"] {
        assert!(
            kinds.contains(&k.to_string()),
            "missing {k} event in {kinds:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workload_sees_identity_ports_and_output_is_logged() {
    let agent = agent();
    let c = agent.client();
    let mut req = create_request(
        "envapp",
        &["sh", "-c", "echo id=$BAZAAR_MACHINE_ID fly=$FLY_APP_NAME region=$FLY_REGION port=$PORT p8080=$PORT_8080; echo oops >&2; sleep 1000"],
    );
    req.config
        .services
        .push(bazaar_types::config::MachineService {
            protocol: "tcp".into(),
            internal_port: 8080,
            ..Default::default()
        });
    let m = c.create(&req).await.unwrap();
    // A root agent gives the machine an address of its own: it listens on the internal port.
    let host_port = if is_root() {
        assert!(m.host_ports.is_empty(), "{:?}", m.host_ports);
        assert!(m.private_ip.starts_with("10."), "{}", m.private_ip);
        8080
    } else {
        *m.host_ports.get(&8080).expect("the service port is mapped")
    };
    let want = format!(
        "id={} fly=envapp region=local port={host_port} p8080={host_port}",
        m.id
    );
    let logs = bazaar_testkit::eventually(Duration::from_secs(10), || async {
        c.logs(&m.id).await.ok().filter(|l| l.contains("oops"))
    })
    .await
    .unwrap();
    assert!(logs.contains(&want), "logs: {logs}");
    assert!(logs.contains("\"stream\":\"stderr\""), "logs: {logs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_escalates_to_sigkill_after_the_timeout() {
    let agent = agent();
    let c = agent.client();
    let m = c
        .create(&create_request(
            "stubborn",
            &[
                "sh",
                "-c",
                "trap '' INT TERM; while true; do sleep 0.1; done",
            ],
        ))
        .await
        .unwrap();
    wait_state(&c, &m.id, MachineState::Started).await;
    let t0 = Instant::now();
    let req = StopRequest {
        signal: None,
        timeout: Some(GoDuration(Duration::from_millis(500))),
    };
    c.stop(&m.id, &req).await.unwrap();
    wait_state(&c, &m.id, MachineState::Stopped).await;
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_secs(10),
        "took {took:?}"
    );
    let events = c.events(&m.id).await.unwrap();
    let exit = events
        .iter()
        .find(|e| e.kind == "exit")
        .expect("an exit event");
    let x = exit.request.as_ref().unwrap().exit_event.as_ref().unwrap();
    assert_eq!(x.signal, 9, "{x:?}");
    assert!(x.requested_stop);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_policy_on_failure_retries_then_stops() {
    let agent = agent();
    let c = agent.client();
    let mut req = create_request("flaky", &["sh", "-c", "echo run >> runs; exit 3"]);
    req.config.restart = Some(bazaar_types::config::RestartConfig {
        policy: bazaar_types::config::RestartPolicyKind::OnFailure,
        max_retries: Some(2),
    });
    let m = c.create(&req).await.unwrap();
    let counter = work_file(&agent, &m.id, "runs");
    // First run + 2 retries, then it stays stopped.
    bazaar_testkit::eventually(Duration::from_secs(20), || async {
        let events = c.events(&m.id).await.ok()?;
        events
            .iter()
            .any(|e| e.kind == "stop" && e.source == "flyd")
            .then_some(())
    })
    .await
    .expect("gives up after max_retries");
    assert_eq!(lines(&counter), 3);
    assert_eq!(c.machine(&m.id).await.unwrap().state, MachineState::Stopped);
    let events = c.events(&m.id).await.unwrap();
    let exits = events.iter().filter(|e| e.kind == "exit").count();
    assert_eq!(exits, 3, "{events:#?}");
    assert!(events
        .iter()
        .any(|e| e.kind == "start" && e.source == "flyd"));

    // `no`: one run, then stopped; a clean exit under on-failure is not restarted either.
    for (policy, code) in [("no", 3), ("on-failure", 0)] {
        let script = format!("echo run >> runs; exit {code}");
        let mut req = create_request("once", &["sh", "-c", &script]);
        req.config.restart =
            Some(serde_json::from_value(serde_json::json!({"policy": policy})).unwrap());
        let m = c.create(&req).await.unwrap();
        let counter = work_file(&agent, &m.id, "runs");
        wait_state(&c, &m.id, MachineState::Stopped).await;
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(lines(&counter), 1, "policy {policy}");
        assert_eq!(c.machine(&m.id).await.unwrap().state, MachineState::Stopped);
    }

    // `always` restarts even after a clean exit.
    let mut req = create_request("always", &["sh", "-c", "echo run >> runs; exit 0"]);
    req.config.restart =
        Some(serde_json::from_value(serde_json::json!({"policy": "always"})).unwrap());
    let m = c.create(&req).await.unwrap();
    let counter = work_file(&agent, &m.id, "runs");
    bazaar_testkit::eventually(Duration::from_secs(10), || async {
        (lines(&counter) >= 3).then_some(())
    })
    .await
    .unwrap();
    // A user stop wins over the policy's pending restart.
    c.stop(&m.id, &StopRequest::default()).await.unwrap();
    wait_state(&c, &m.id, MachineState::Stopped).await;
    let n = lines(&counter);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(lines(&counter), n, "no restart after a user stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_clear_errors_and_changes_nothing() {
    let agent = agent();
    let c = agent.client();
    let m = c
        .create(&create_request("good", &["sleep", "1000"]))
        .await
        .unwrap();
    wait_state(&c, &m.id, MachineState::Started).await;
    let info_before = c.info().await.unwrap();

    // Unknown machine.
    let err = c.machine("00000000000000").await.unwrap_err();
    assert_eq!(err.status(), Some(404));
    assert!(err.to_string().contains("not found"), "{err}");
    assert_eq!(c.start("../../etc").await.unwrap_err().status(), Some(404));

    // Invalid transition: start a started machine.
    let err = c.start(&m.id).await.unwrap_err();
    assert_eq!(err.status(), Some(412));
    assert!(
        err.to_string()
            .contains("cannot start machine in state started"),
        "{err}"
    );

    // Malformed JSON.
    let err = c.post_raw("/machines", "{\"app\": ").await.unwrap_err();
    assert_eq!(err.status(), Some(400));
    assert!(err.to_string().contains("invalid JSON"), "{err}");
    let err = c
        .post_raw(&format!("/machines/{}/stop", m.id), "[1,2]")
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(400));

    // Negative and absurd sizes.
    for guest in [
        serde_json::json!({"cpu_kind": "shared", "cpus": -1, "memory_mb": 256}),
        serde_json::json!({"cpu_kind": "shared", "cpus": 1, "memory_mb": -256}),
        serde_json::json!({"cpu_kind": "shared", "cpus": 1000000, "memory_mb": 256}),
        serde_json::json!({"cpu_kind": "shared", "cpus": 1, "memory_mb": 99999999999i64}),
        serde_json::json!({"cpu_kind": "quantum", "cpus": 1, "memory_mb": 256}),
    ] {
        let mut req = create_request("good", &["sleep", "1"]);
        req.config.guest = Some(serde_json::from_value(guest.clone()).unwrap());
        let err = c.create(&req).await.unwrap_err();
        assert_eq!(err.status(), Some(400), "{guest}: {err}");
    }

    // A command that does not exist.
    let err = c
        .create(&create_request("good", &["no-such-command-xyz"]))
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(400));
    assert!(
        err.to_string()
            .contains("command not found: no-such-command-xyz"),
        "{err}"
    );

    // Invalid names.
    for app in ["../x", "UP", "a b", "a\nb", ""] {
        let err = c
            .create(&create_request(app, &["sleep", "1"]))
            .await
            .unwrap_err();
        assert_eq!(err.status(), Some(400), "{app:?}");
    }

    // Unknown signal.
    let err = c
        .signal(&m.id, serde_json::json!("SIGNOPE"))
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(400));

    // No token, wrong token.
    let bad = bazaar_client::HostClient::new(&agent.url(), "wrong-token");
    assert_eq!(bad.info().await.unwrap_err().status(), Some(401));

    // Nothing changed.
    let machines = c.machines(None, true).await.unwrap();
    assert_eq!(machines.len(), 1, "{machines:#?}");
    assert_eq!(machines[0].state, MachineState::Started);
    let info_after = c.info().await.unwrap();
    assert_eq!(info_before.committed, info_after.committed);
    assert_eq!(info_after.num_reservations, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_times_out_with_408_and_signal_reaches_the_workload() {
    let agent = agent();
    let c = agent.client();
    let script = "trap 'echo usr1 >> got' USR1; while true; do sleep 0.05; done";
    let m = c
        .create(&create_request("sig", &["sh", "-c", script]))
        .await
        .unwrap();
    let out = work_file(&agent, &m.id, "got");
    wait_state(&c, &m.id, MachineState::Started).await;
    let t0 = Instant::now();
    let err = c.wait(&m.id, "stopped", 1).await.unwrap_err();
    assert_eq!(err.status(), Some(408));
    assert!(t0.elapsed() >= Duration::from_millis(900));
    // By name, then by number (as fly-go's Kill sends it); the shell coalesces a signal
    // that arrives while the same one is pending, so wait for each.
    c.signal(&m.id, serde_json::json!("SIGUSR1")).await.unwrap();
    bazaar_testkit::eventually(Duration::from_secs(5), || async {
        (lines(&out) >= 1).then_some(())
    })
    .await
    .unwrap();
    c.signal(&m.id, serde_json::json!(10)).await.unwrap();
    bazaar_testkit::eventually(Duration::from_secs(5), || async {
        (lines(&out) >= 2).then_some(())
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_stops_the_running_version_with_its_own_kill_signal() {
    let agent = agent();
    let c = agent.client();
    let stop_with = |signal: i32| {
        Some(bazaar_types::config::StopConfig {
            signal: Some(bazaar_types::signal::Signal(signal)),
            timeout: Some(GoDuration(Duration::from_secs(5))),
        })
    };
    let mut req = create_request("graceful", &["sleep", "1000"]);
    req.config.stop_config = stop_with(libc::SIGUSR1);
    let m = c.create(&req).await.unwrap();
    wait_state(&c, &m.id, MachineState::Started).await;
    // The new version asks for SIGTERM; the running one said SIGUSR1, and it is the
    // running one that gets stopped.
    let mut next = req.config.clone();
    next.stop_config = stop_with(libc::SIGTERM);
    c.update(
        &m.id,
        &UpdateRequest {
            config: next,
            skip_launch: false,
            current_version: None,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let exit = bazaar_testkit::eventually(Duration::from_secs(10), || async {
        let events = c.events(&m.id).await.ok()?;
        let exit = events.iter().find(|e| e.kind == "exit")?.clone();
        exit.request?.exit_event
    })
    .await
    .expect("the old run's exit is recorded");
    assert_eq!(exit.signal, libc::SIGUSR1, "{exit:?}");
    assert!(exit.requested_stop, "{exit:?}");
    wait_state(&c, &m.id, MachineState::Started).await;
}
