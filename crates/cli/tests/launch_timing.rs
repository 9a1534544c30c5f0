//! A machine's start records where its time went (issue 36): each launch step of an
//! isolated process machine, from its namespace to the exec under seccomp, is in the start
//! event, and `bazaar machine explain --timing` shows them with the placement. Needs root
//! (an isolating agent): fails, not skips, without it.

use crate::common;

use bazaar_testkit::{api_token, AgentOptions, Fly, TestAgent, TEST_SECRET};
use common::*;
use std::time::Instant;

fn explain(agent: &TestAgent, args: &[&str]) -> String {
    let out = std::process::Command::new(EXE)
        .args(["machine", "explain", "-a", "timed"])
        .args(args)
        .env("BAZAAR_API_URL", agent.url())
        .env("BAZAAR_CLUSTER_SECRET", TEST_SECRET)
        .env("BAZAAR_TOKEN", api_token())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_start_records_each_step_and_explain_shows_them() {
    assert!(is_root(), "this test needs root (CI runs as root)");
    let agent = TestAgent::start(AgentOptions::new(EXE)).expect("agent starts");
    let fly = Fly::new(&agent);
    fly.create_app("timed").await;
    let t0 = Instant::now();
    let id = started_machine(&fly).await;
    let wall_ms = t0.elapsed().as_secs_f64() * 1e3;

    // The start event holds the steps, in the order they ran.
    let (start, steps) = start_steps(&fly, &id).await;
    let names: Vec<&str> = steps.iter().map(|(n, _)| n.as_str()).collect();
    let isolated = [
        "queued",
        "network",
        "spawned",
        "shim_start",
        "seccomp_load",
        "init",
        "join_cgroup_netns",
        "mount_namespace",
        "private_root",
        "seccomp_exec",
        "ready",
    ];
    let mut at = 0;
    for step in isolated {
        let i = names[at..]
            .iter()
            .position(|n| *n == step)
            .unwrap_or_else(|| panic!("{step} after {:?} in {names:?}", names.get(at)));
        at += i + 1;
    }
    assert!(steps.iter().all(|(_, ms)| *ms >= 0.0), "{steps:?}");
    let launch_ms: f64 = steps.iter().map(|(_, ms)| ms).sum();
    // The steps happened between the request and its answer (`queued` is counted in whole
    // milliseconds: one of slack).
    assert!(
        launch_ms > 0.0 && launch_ms <= wall_ms + 1.0,
        "{launch_ms} of {wall_ms} ms"
    );

    // `explain --timing` shows them with the placement; `--json` gives the same numbers.
    let text = explain(&agent, &["--timing", &id]);
    for row in [
        "placement",
        "network",
        "private_root",
        "seccomp_exec",
        "ready",
        "total",
    ] {
        assert!(text.contains(row), "{row} in {text}");
    }
    let json: serde_json::Value =
        serde_json::from_str(&explain(&agent, &["--timing", "--json", &id])).unwrap();
    assert_eq!(json["event"], start["id"]);
    assert_eq!(json["steps"].as_array().unwrap().len(), steps.len());
    assert!(
        json["placement_ms"].as_f64().is_some_and(|ms| ms > 0.0),
        "{json}"
    );
    assert!((json["launch_ms"].as_f64().unwrap() - launch_ms).abs() < 1e-6);
}

/// Machine `id`'s start event and its launch steps (name, ms), in the order they ran.
async fn start_steps(fly: &Fly, id: &str) -> (serde_json::Value, Vec<(String, f64)>) {
    let (_, events) = fly.get(&format!("/apps/timed/machines/{id}/events")).await;
    let start = events
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "start")
        .unwrap_or_else(|| panic!("a start event: {events}"))
        .clone();
    let steps = start["request"]["timing"]
        .as_array()
        .unwrap_or_else(|| panic!("timing in {start}"))
        .iter()
        .map(|s| {
            (
                s["step"].as_str().unwrap().to_owned(),
                s["ms"].as_f64().unwrap(),
            )
        })
        .collect();
    (start, steps)
}

/// Creates a machine of app `timed` running `sleep`, started; returns its id.
async fn started_machine(fly: &Fly) -> String {
    let (s, m) = fly
        .post(
            "/apps/timed/machines",
            serde_json::json!({"config": process_config(&["sleep", "1000"])}),
        )
        .await;
    assert_eq!(s, reqwest::StatusCode::OK, "{m}");
    let id = m["id"].as_str().unwrap().to_string();
    wait_started(fly, "timed", &id).await;
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_start_takes_a_work_disk_made_ahead_once_the_host_has_seen_its_size() {
    assert!(is_root(), "this test needs root (CI runs as root)");
    let agent = TestAgent::start(AgentOptions::new(EXE)).expect("agent starts");
    let fly = Fly::new(&agent);
    fly.create_app("timed").await;
    let names =
        |steps: Vec<(String, f64)>| -> Vec<String> { steps.into_iter().map(|(n, _)| n).collect() };
    let first = started_machine(&fly).await;
    let first_steps = names(start_steps(&fly, &first).await.1);
    assert!(
        first_steps.iter().any(|n| n == "work_disk"),
        "the first of its size makes its disk: {first_steps:?}"
    );
    // The pool makes disks of that size, one after the other: a second image means the
    // first is ready.
    let pool = agent.data_dir.join("disk-pool");
    let images = || std::fs::read_dir(&pool).map_or(0, |d| d.count());
    assert!(
        bazaar_testkit::holds_within(std::time::Duration::from_secs(30), || images() >= 2).await,
        "disks made ahead in {}",
        pool.display()
    );
    let second = started_machine(&fly).await;
    let second_steps = names(start_steps(&fly, &second).await.1);
    assert!(
        second_steps.iter().any(|n| n == "work_disk_ahead")
            && !second_steps.iter().any(|n| n == "work_disk"),
        "the next takes one made ahead: {second_steps:?}"
    );
    // It is the machine's own disk: mounted on its work directory, the image in its
    // directory, handed to its user.
    let dir = agent.data_dir.join("machines").join(&second);
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let work = dir.join("work");
    assert!(
        mountinfo.contains(&format!(" {} ", work.display())),
        "{} is a mount",
        work.display()
    );
    assert!(dir.join("disk.img").exists());
    use std::os::unix::fs::MetadataExt;
    assert_ne!(
        std::fs::metadata(&work).unwrap().uid(),
        0,
        "owned by the machine's user"
    );
}
