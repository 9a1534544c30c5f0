//! Leases, cordons, metadata, suspend/resume and exec on the host interface (the owning
//! host's side of the Machines API).

use crate::common;

use bazaar_testkit::{create_request, pid_alive};
use bazaar_types::host::StopRequest;
use bazaar_types::state::MachineState;
use common::*;
use reqwest::Method;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_guard_mutations_and_answer_in_the_wrapped_form() {
    let agent = agent();
    let c = agent.client();
    let m = c
        .create(&create_request("lease", &["sleep", "1000"]))
        .await
        .unwrap();
    wait_state(&c, &m.id, MachineState::Started).await;
    let lease = c.lease(&m.id, 30, None).await.unwrap();
    assert_eq!(lease["status"], "success");
    let nonce = lease["data"]["nonce"].as_str().unwrap().to_string();
    assert_eq!(nonce.len(), 12);
    // Someone else cannot take it or mutate the machine.
    assert_eq!(
        c.lease(&m.id, 30, None).await.unwrap_err().status(),
        Some(409)
    );
    let err = c.stop(&m.id, &StopRequest::default()).await.unwrap_err();
    assert_eq!(err.status(), Some(409));
    assert!(err.to_string().contains("lease currently held"), "{err}");
    let wrong: Result<serde_json::Value, _> = c
        .with_nonce(
            Method::POST,
            &format!("/machines/{}/cordon", m.id),
            Some("000000000000"),
            None,
        )
        .await;
    assert_eq!(wrong.unwrap_err().status(), Some(409));
    assert_eq!(
        c.machine(&m.id).await.unwrap().state,
        MachineState::Started,
        "nothing changed"
    );
    // The holder can: refresh, cordon, stop.
    let refreshed = c.lease(&m.id, 60, Some(&nonce)).await.unwrap();
    assert_eq!(refreshed["data"]["nonce"], nonce.as_str());
    let _: serde_json::Value = c
        .with_nonce(
            Method::POST,
            &format!("/machines/{}/cordon", m.id),
            Some(&nonce),
            None,
        )
        .await
        .unwrap();
    assert!(c.machine(&m.id).await.unwrap().cordoned);
    let got: serde_json::Value = c
        .with_nonce(
            Method::GET,
            &format!("/machines/{}/lease", m.id),
            None,
            None,
        )
        .await
        .unwrap();
    // The host interface answers only hosts and operators: the nonce is there, and the
    // Machines API leaves it out for a caller that may not use leases.
    assert_eq!(got["data"]["nonce"], nonce.as_str(), "{got}");
    assert!(got["data"]["expires_at"].as_u64().is_some(), "{got}");
    let _: serde_json::Value = c
        .with_nonce(
            Method::POST,
            &format!("/machines/{}/stop", m.id),
            Some(&nonce),
            Some(serde_json::json!({})),
        )
        .await
        .unwrap();
    wait_state(&c, &m.id, MachineState::Stopped).await;
    // Release needs the nonce; then anyone may mutate again.
    let missing: Result<serde_json::Value, _> = c
        .with_nonce(
            Method::DELETE,
            &format!("/machines/{}/lease", m.id),
            None,
            None,
        )
        .await;
    assert_eq!(missing.unwrap_err().status(), Some(400));
    let _: serde_json::Value = c
        .with_nonce(
            Method::DELETE,
            &format!("/machines/{}/lease", m.id),
            Some(&nonce),
            None,
        )
        .await
        .unwrap();
    let none: Result<serde_json::Value, _> = c
        .with_nonce(
            Method::GET,
            &format!("/machines/{}/lease", m.id),
            None,
            None,
        )
        .await;
    assert_eq!(none.unwrap_err().status(), Some(404));
    c.start(&m.id).await.unwrap();
    wait_state(&c, &m.id, MachineState::Started).await;
    // A lease taken at create time comes back as the machine's nonce; it expires by itself.
    // (4 s: a create on a loaded 2-core CI machine has taken over 1 s.)
    let mut req = create_request("lease", &["sleep", "1000"]);
    req.lease_ttl = Some(4);
    let leased = c.create(&req).await.unwrap();
    assert!(leased.nonce.is_some());
    assert_eq!(
        c.stop(&leased.id, &StopRequest::default())
            .await
            .unwrap_err()
            .status(),
        Some(409)
    );
    tokio::time::sleep(Duration::from_millis(4100)).await;
    wait_state(&c, &leased.id, MachineState::Started).await;
    c.stop(&leased.id, &StopRequest::default()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_get_set_delete_and_bulk_with_version_check() {
    let agent = agent();
    let c = agent.client();
    let m = c
        .create(&create_request("meta", &["sleep", "1000"]))
        .await
        .unwrap();
    let path = format!("/machines/{}/metadata", m.id);
    let _: serde_json::Value = c
        .with_nonce(
            Method::POST,
            &format!("{path}/role"),
            None,
            Some(serde_json::json!({"value": "primary"})),
        )
        .await
        .unwrap();
    let v: serde_json::Value = c
        .with_nonce(Method::GET, &format!("{path}/role"), None, None)
        .await
        .unwrap();
    assert_eq!(v["value"], "primary");
    let _: serde_json::Value = c
        .with_nonce(
            Method::PATCH,
            &path,
            None,
            Some(serde_json::json!({"metadata": {"a": "1", "role": null}})),
        )
        .await
        .unwrap();
    let all: serde_json::Value = c.with_nonce(Method::GET, &path, None, None).await.unwrap();
    assert_eq!(all, serde_json::json!({"a": "1"}));
    let stale: Result<serde_json::Value, _> = c
        .with_nonce(
            Method::PUT,
            &path,
            None,
            Some(serde_json::json!({"metadata": {"b": "2"}, "machine_version": "01STALE"})),
        )
        .await;
    assert_eq!(stale.unwrap_err().status(), Some(412));
    let bad: Result<serde_json::Value, _> = c
        .with_nonce(
            Method::POST,
            &format!("{path}/bad%20key"),
            None,
            Some(serde_json::json!({"value": "x"})),
        )
        .await;
    assert_eq!(bad.unwrap_err().status(), Some(400));
    let _: serde_json::Value = c
        .with_nonce(Method::DELETE, &format!("{path}/a"), None, None)
        .await
        .unwrap();
    let gone: Result<serde_json::Value, _> = c
        .with_nonce(Method::GET, &format!("{path}/a"), None, None)
        .await;
    assert_eq!(gone.unwrap_err().status(), Some(404));
    assert!(c.machine(&m.id).await.unwrap().config.metadata.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspend_freezes_and_start_resumes_the_same_process() {
    if !bazaar_testkit::can_run(is_root(), "root (the freezer needs cgroups)") {
        return;
    }
    let agent = agent();
    let c = agent.client();
    let script = "while true; do echo t >> ticks; sleep 0.05; done";
    let m = c
        .create(&create_request("susp", &["sh", "-c", script]))
        .await
        .unwrap();
    let pid = wait_state(&c, &m.id, MachineState::Started)
        .await
        .pid
        .unwrap();
    let ticks = work_file(&agent, &m.id, "ticks");
    c.suspend(&m.id).await.unwrap();
    wait_state(&c, &m.id, MachineState::Suspended).await;
    let n = lines(&ticks);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(lines(&ticks), n, "a suspended machine does not run");
    assert!(pid_alive(pid));
    c.start(&m.id).await.unwrap();
    let resumed = wait_state(&c, &m.id, MachineState::Started).await;
    assert_eq!(resumed.pid, Some(pid), "resume keeps the process");
    bazaar_testkit::eventually(Duration::from_secs(5), || async {
        (lines(&ticks) > n).then_some(())
    })
    .await
    .expect("it runs again");
    // Stopping a suspended machine works too.
    c.suspend(&m.id).await.unwrap();
    wait_state(&c, &m.id, MachineState::Suspended).await;
    c.stop(&m.id, &StopRequest::default()).await.unwrap();
    wait_state(&c, &m.id, MachineState::Stopped).await;
    assert!(!pid_alive(pid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_runs_inside_the_machine() {
    let agent = agent();
    let c = agent.client();
    let m = c
        .create(&create_request("exec", &["sleep", "1000"]))
        .await
        .unwrap();
    let pid = wait_state(&c, &m.id, MachineState::Started)
        .await
        .pid
        .unwrap();
    let r = c
        .exec(
            &m.id,
            &[
                "sh",
                "-c",
                "echo $FLY_MACHINE_ID; id -u; cat /proc/self/cgroup; echo err >&2; exit 7",
            ],
        )
        .await
        .unwrap();
    assert_eq!(r.exit_code, 7);
    let mut out = r.stdout.lines();
    assert_eq!(out.next(), Some(m.id.as_str()));
    if bazaar_testkit::can_run(is_root(), "root (the workload's own uid)") {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let uid = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().next())
            .unwrap()
            .to_string();
        assert_ne!(uid, "0");
        assert_eq!(out.next(), Some(uid.as_str()), "runs as the machine's user");
        assert!(
            out.any(|l| l.contains(":memory:") && l.contains(&m.id)),
            "runs in the machine's cgroup: {}",
            r.stdout
        );
        let ps = c
            .exec(&m.id, &["sh", "-c", "ls /proc | grep -c '^[0-9]'"])
            .await
            .unwrap();
        let n: usize = ps.stdout.trim().parse().unwrap();
        assert!(n < 10, "sees only the machine's processes, got {n}");
    }
    assert_eq!(r.stderr.trim(), "err");
    let err = c.exec(&m.id, &[]).await.unwrap_err();
    assert_eq!(err.status(), Some(400));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_made_while_an_operation_runs_are_kept() {
    let agent = agent();
    let c = agent.client();
    let m = c
        .create(&create_request(
            "slowstop",
            &[
                "sh",
                "-c",
                "trap '' INT TERM; while true; do sleep 0.1; done",
            ],
        ))
        .await
        .unwrap();
    wait_state(&c, &m.id, MachineState::Started).await;
    // The stop waits 1.5 s for an exit that never comes, then kills: meanwhile the
    // machine gets metadata and a cordon, which must outlive the stop's own writes.
    let req = StopRequest {
        signal: None,
        timeout: Some(bazaar_types::duration::GoDuration(Duration::from_millis(
            1500,
        ))),
    };
    c.stop(&m.id, &req).await.unwrap();
    let path = format!("/machines/{}/metadata/owner", m.id);
    let _: serde_json::Value = c
        .with_nonce(
            Method::POST,
            &path,
            None,
            Some(serde_json::json!({"value": "team-a"})),
        )
        .await
        .unwrap();
    let _: serde_json::Value = c
        .with_nonce(
            Method::POST,
            &format!("/machines/{}/cordon", m.id),
            None,
            None,
        )
        .await
        .unwrap();
    wait_state(&c, &m.id, MachineState::Stopped).await;
    let after = c.machine(&m.id).await.unwrap();
    assert_eq!(
        after.config.metadata.get("owner").map(String::as_str),
        Some("team-a"),
        "metadata set during the stop survives it"
    );
    assert!(after.cordoned, "the cordon set during the stop survives it");
    // Events from both sides are all kept, each under its own number.
    let kinds: Vec<String> = c
        .events(&m.id)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert!(kinds.iter().any(|k| k == "exit"), "{kinds:?}");
    assert!(kinds.iter().any(|k| k == "launch"), "{kinds:?}");
}
