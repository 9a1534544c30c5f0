//! `bazaar machine run` (and `start`, `restart`) as a user sees it: it waits until the
//! machine runs and prints its id; a machine that cannot start (a missing image, a registry
//! nobody answers on) or that exits at once makes the command exit non-zero within seconds,
//! saying why and showing the end of the machine's log; the machine is left for inspection.

use crate::common;

use bazaar_testkit::TestAgent;
use common::*;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Runs `bazaar <args>` against `agent`'s API; returns its output and how long it took.
fn bazaar(agent: &TestAgent, args: &[&str]) -> (Output, Duration) {
    let t0 = Instant::now();
    let out = Command::new(EXE)
        .args(args)
        .env("BAZAAR_API_URL", agent.url())
        .env("BAZAAR_TOKEN", bazaar_testkit::api_token())
        .output()
        .expect("bazaar runs");
    (out, t0.elapsed())
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn machine(fly: &Fly, app: &str, id: &str) -> serde_json::Value {
    let (status, m) = fly.get(&format!("/apps/{app}/machines/{id}")).await;
    assert!(status.is_success(), "{m}");
    m
}

/// The machine id in a failure message "machine <id> failed: ...".
fn failed_id(stderr: &str) -> String {
    let rest = stderr
        .split("machine ")
        .nth(1)
        .unwrap_or_else(|| panic!("no machine id in {stderr:?}"));
    rest.split(' ').next().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_good_machine_prints_its_id_once_started_and_a_failing_one_says_why() {
    let agent = agent();
    let fly = Fly::new(&agent);
    fly.create_app("runs").await;

    let (out, _) = bazaar(
        &agent,
        &["machine", "run", "-a", "runs", "--", "sleep", "1000"],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "stdout {stdout}\nstderr {stderr}");
    let id = stdout
        .strip_prefix("machine ")
        .and_then(|r| r.split(' ').next())
        .unwrap_or_else(|| panic!("no id in {stdout:?}"))
        .to_string();
    assert_eq!(machine(&fly, "runs", &id).await["state"], "started");

    // restart waits for it to run again; --json prints the machine.
    let (out, _) = bazaar(&agent, &["machine", "restart", "-a", "runs", &id, "--json"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let m: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(m["id"], id.as_str());
    assert_eq!(m["state"], "started");

    // An update to a command that cannot stay up fails the same way.
    let (out, _) = bazaar(
        &agent,
        &[
            "machine", "update", "-a", "runs", &id, "--", "sh", "-c", "exit 5",
        ],
    );
    let (_, stderr) = text(&out);
    assert!(!out.status.success(), "a failed update reported as success");
    assert!(stderr.contains("exited with code 5"), "{stderr}");

    // A command that exits at once (restarted by the default policy, then given up on).
    let (out, took) = bazaar(
        &agent,
        &[
            "machine",
            "run",
            "-a",
            "runs",
            "--",
            "sh",
            "-c",
            "echo config missing >&2; exit 3",
        ],
    );
    let (stdout, stderr) = text(&out);
    assert!(
        !out.status.success(),
        "exit 3 reported as success: {stdout}"
    );
    assert!(
        stderr.contains("exited with code 3"),
        "no exit code: {stderr}"
    );
    assert!(stderr.contains("config missing"), "no log lines: {stderr}");
    assert!(took < Duration::from_secs(15), "took {took:?}");
    // Left for inspection.
    let failed = failed_id(&stderr);
    let (status, _) = fly.get(&format!("/apps/runs/machines/{failed}")).await;
    assert!(status.is_success(), "the failed machine is kept");

    // A job that finishes with code 0 did what it was asked.
    let (out, _) = bazaar(
        &agent,
        &[
            "machine",
            "run",
            "-a",
            "runs",
            "--restart",
            "no",
            "--",
            "true",
        ],
    );
    assert!(out.status.success(), "{:?}", text(&out));

    // --detach returns at once, as before.
    let (out, took) = bazaar(
        &agent,
        &[
            "machine", "run", "-a", "runs", "--detach", "--", "sh", "-c", "exit 4",
        ],
    );
    assert!(out.status.success(), "{:?}", text(&out));
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_that_cannot_be_pulled_fails_the_run_fast() {
    assert!(
        is_root(),
        "image machines need root (run the tests as root, as CI does)"
    );
    let agent = agent();
    let fly = Fly::new(&agent);
    fly.create_app("pulls").await;

    // `.invalid` never resolves: the agent must not even try the network.
    let (out, took) = bazaar(
        &agent,
        &[
            "machine",
            "run",
            "-a",
            "pulls",
            "--image",
            "nosuch.invalid/foo:1",
        ],
    );
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "reported as success: {stdout}");
    assert!(stderr.contains("nosuch.invalid"), "no reason: {stderr}");
    assert!(took < Duration::from_secs(5), "took {took:?}: {stderr}");
    let id = failed_id(&stderr);
    let m = machine(&fly, "pulls", &id).await;
    assert_ne!(m["state"], "started", "{m}");

    // A registry on a loopback port nobody listens on.
    let port = bazaar_testkit::free_port(std::net::Ipv4Addr::LOCALHOST);
    let image = format!("127.0.0.1:{port}/foo:1");
    let (out, took) = bazaar(
        &agent,
        &["machine", "run", "-a", "pulls", "--image", &image],
    );
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "reported as success: {stdout}");
    assert!(stderr.contains(&image), "no reason: {stderr}");
    assert!(took < Duration::from_secs(10), "took {took:?}: {stderr}");
}
