//! Helpers shared by the agent tests.
#![allow(dead_code)]

use bazaar_client::HostClient;
use bazaar_testkit::{AgentOptions, TestAgent};
use bazaar_types::machine::Machine;
use bazaar_types::state::MachineState;
use std::time::Duration;

pub const EXE: &str = env!("CARGO_BIN_EXE_bazaar");

pub fn agent() -> TestAgent {
    TestAgent::start(AgentOptions::new(EXE)).expect("agent starts")
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Waits until the machine is in `state`.
pub async fn wait_state(client: &HostClient, id: &str, state: MachineState) -> Machine {
    let result = bazaar_testkit::eventually(Duration::from_secs(20), || async {
        client.machine(id).await.ok().filter(|m| m.state == state)
    })
    .await;
    match result {
        Ok(m) => m,
        Err(_) => {
            let m = client.machine(id).await;
            panic!("machine {id} never reached {state}; now: {m:#?}");
        }
    }
}

/// A file of machine `id`'s work directory, on the host (a workload's cwd: the files it
/// writes at relative paths; gone when the machine is destroyed).
pub fn work_file(agent: &TestAgent, id: &str, name: &str) -> std::path::PathBuf {
    agent
        .data_dir
        .join("machines")
        .join(id)
        .join("work")
        .join(name)
}

/// A world-writable scratch directory (for shims run directly: their workloads run as
/// nobody and see the host's files).
pub fn scratch() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("bazaar-scratch-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

/// Counts lines of a file (0 if missing).
pub fn lines(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// The Machines API client (not every test binary uses it).
#[allow(unused_imports)]
pub use bazaar_testkit::Fly;

/// A process machine's config in the Machines API's JSON: `cmd`, 1 shared cpu, 256 MB.
pub fn process_config(cmd: &[&str]) -> serde_json::Value {
    serde_json::json!({"image": "process", "driver": "process", "init": {"exec": cmd},
        "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256}})
}

/// Waits (≤ 30 s, through the API) until machine `id` of `app` is started.
pub async fn wait_started(fly: &Fly, app: &str, id: &str) {
    let (s, v) = fly
        .get(&format!(
            "/apps/{app}/machines/{id}/wait?state=started&timeout=30"
        ))
        .await;
    assert_eq!(s, reqwest::StatusCode::OK, "{v}");
}

/// Waits until `fly`'s node knows `hosts` hosts in region `local`.
pub async fn wait_for_hosts(fly: &Fly, hosts: usize) {
    bazaar_testkit::eventually(Duration::from_secs(10), || async {
        let (_, r) = fly.get("/platform/regions").await;
        (r["regions"][0]["hosts"] == hosts).then_some(())
    })
    .await
    .expect("every host in the region");
}
