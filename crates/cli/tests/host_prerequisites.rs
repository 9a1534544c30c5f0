//! A host that lacks what a driver's machines need (issue 37 item 7): an agent whose PATH
//! has no `runc` says so at start, bids for no image machine (the API's "insufficient
//! capacity" names why), still runs process machines, and `bazaar hosts` shows the reason.

use crate::common;

use bazaar_testkit::{eventually, process_config, AgentOptions, Fly, TestAgent, TEST_SECRET};
use bazaar_types::host::{BidRequest, BidResponse};
use common::*;
use serde_json::json;
use std::time::Duration;

/// A directory of links to every program of the usual directories but `hidden`: a PATH
/// on which the agent finds everything else.
fn path_without(hidden: &str) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("bazaar-path-")
        .tempdir()
        .unwrap();
    for from in [
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ] {
        let Ok(entries) = std::fs::read_dir(from) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let link = dir.path().join(&name);
            if name != hidden && !link.exists() {
                std::os::unix::fs::symlink(entry.path(), link).unwrap();
            }
        }
    }
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_without_runc_refuses_image_machines_runs_process_ones_and_says_why() {
    if !bazaar_testkit::can_run(is_root(), "root (a sandboxing agent)") {
        return;
    }
    let path = path_without("runc");
    let mut opts = AgentOptions::new(EXE);
    opts.env
        .push(("PATH".into(), path.path().to_str().unwrap().into()));
    let agent = TestAgent::start(opts).unwrap();

    // It says at start what is missing.
    let log = agent.log_tail();
    assert!(
        log.contains("cannot run oci machines") && log.contains("runc (package runc)"),
        "{log}"
    );
    assert!(!log.contains("cannot run process machines"), "{log}");

    // Asked directly, it refuses to bid for an image machine, for good, with the reason;
    // a process machine it bids for.
    let bid = |driver: &str| BidRequest {
        placement_id: "test".into(),
        cpus: 1,
        memory_mb: 256,
        ttl_ms: Some(1000),
        driver: Some(driver.into()),
        priority: None,
        preempt: false,
    };
    match agent.client().bid(&bid("oci")).await.unwrap() {
        BidResponse::Refusal {
            reason, retryable, ..
        } => {
            assert_eq!(
                reason,
                "cannot run oci machines: missing runc (package runc)"
            );
            assert!(!retryable);
        }
        other => panic!("a host without runc bid for an image machine: {other:?}"),
    }
    assert!(matches!(
        agent.client().bid(&bid("process")).await.unwrap(),
        BidResponse::Bid { .. }
    ));

    // Through the Machines API: an image machine gets "insufficient capacity" naming runc
    // (the exchange leaves the host out, as its row says); a process machine runs.
    let fly = Fly::new(&agent);
    fly.create_app("prereq").await;
    let (status, body) = fly
        .post(
            "/apps/prereq/machines",
            json!({"config": {"image": "127.0.0.1:5000/busybox:latest"}}),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["status"], "insufficient_capacity", "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(
        error.contains("cannot run oci machines: missing runc (package runc)"),
        "{error}"
    );
    let (status, body) = fly
        .post(
            "/apps/prereq/machines",
            json!({"config": process_config(&["sleep", "1000"])}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let id = body["id"].as_str().unwrap();
    fly.wait_state("prereq", id, "started").await;
    // Nothing of the refused image machine was made.
    let (_, list) = fly.get("/apps/prereq/machines").await;
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");

    // `bazaar hosts` shows why, in its table and in its JSON (the host's labels).
    let hosts = |args: &[&str]| {
        let out = std::process::Command::new(EXE)
            .arg("hosts")
            .args(args)
            .env("BAZAAR_API_URL", agent.url())
            .env("BAZAAR_CLUSTER_SECRET", TEST_SECRET)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let table = eventually(Duration::from_secs(10), || async {
        let t = hosts(&[]);
        t.contains("oci: missing runc (package runc)").then_some(t)
    })
    .await
    .unwrap_or_else(|_| panic!("bazaar hosts never showed why: {}", hosts(&[])));
    assert!(table.contains("cannot run"), "{table}");
    let rows: serde_json::Value = serde_json::from_str(&hosts(&["--json"])).unwrap();
    assert_eq!(
        rows[0]["labels"]["cannot_run_oci"], "runc (package runc)",
        "{rows}"
    );
    assert!(
        rows[0]["labels"].get("cannot_run_process").is_none(),
        "{rows}"
    );
}
