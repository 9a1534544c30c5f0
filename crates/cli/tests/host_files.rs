//! Nothing a machine leaves in its work directory makes the agent change a host file
//! (issue 31 item 9): a symlink to `/dev/null`, a symlink to `/etc/passwd` and a FIFO where
//! the next version's `config.files` go are replaced by those files; the host's files keep
//! their owner, mode and contents, and the launch does not hang on the FIFO. The test kit's
//! host guard checks the watched host files again when the agent is dropped. Needs root:
//! run under the e2e lock.

use crate::common;

use bazaar_testkit::{create_request, AgentOptions, TestAgent};
use bazaar_types::host::UpdateRequest;
use bazaar_types::state::MachineState;
use common::*;
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

/// Owner, group, mode and size of a host path.
fn stat(path: &str) -> (u32, u32, u32, u64) {
    let m = std::fs::symlink_metadata(path).unwrap();
    (m.uid(), m.gid(), m.mode(), m.size())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_written_over_what_a_workload_left_change_no_host_file() {
    use base64::Engine;
    assert!(is_root(), "this test needs root (CI runs as root)");
    let agent = TestAgent::start(AgentOptions::new(EXE)).expect("agent starts");
    let c = agent.client();
    let before = ["/dev/null", "/etc/passwd"].map(stat);

    // The first version leaves traps in /work and exits.
    let mut req = create_request(
        "traps",
        &[
            "sh",
            "-c",
            "ln -s /dev/null conf && ln -s /etc/passwd passwd && mkfifo fifo && echo set",
        ],
    );
    req.config.restart = serde_json::from_value(serde_json::json!({"policy": "no"})).unwrap();
    let m = c.create(&req).await.expect("create");
    let stopped = wait_state(&c, &m.id, MachineState::Stopped).await;
    assert!(c.logs(&m.id).await.unwrap().contains("set"));

    // The next one writes config.files by those names.
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let mut config = create_request(
        "traps",
        &["sh", "-c", "cat conf passwd fifo; exec sleep 1000"],
    )
    .config;
    config.files = serde_json::from_value(serde_json::json!([
        {"guest_path": "/conf", "raw_value": b64("a\n")},
        {"guest_path": "/passwd", "raw_value": b64("b\n")},
        {"guest_path": "/fifo", "raw_value": b64("c\n")},
    ]))
    .unwrap();
    c.update(
        &m.id,
        &UpdateRequest {
            config,
            current_version: Some(stopped.instance_id.clone()),
            ..Default::default()
        },
    )
    .await
    .expect("update");
    bazaar_testkit::eventually(Duration::from_secs(20), || async {
        let m = c.machine(&m.id).await.ok()?;
        (m.state == MachineState::Started).then_some(())
    })
    .await
    .unwrap_or_else(|_| panic!("never started again; log:\n{}", agent.log_tail()));
    // The log (JSON lines): what the first version said, then the three files.
    let lines = || async {
        let logs = c.logs(&m.id).await.unwrap_or_default();
        logs.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v["line"].as_str().map(str::to_owned))
            .collect::<Vec<_>>()
    };
    bazaar_testkit::eventually(Duration::from_secs(10), || async {
        (lines().await.len() >= 4).then_some(())
    })
    .await
    .ok();
    assert_eq!(lines().await, ["set", "a", "b", "c"]);
    for name in ["conf", "passwd", "fifo"] {
        let meta = std::fs::symlink_metadata(work_file(&agent, &m.id, name)).unwrap();
        assert!(meta.is_file(), "{name} is a plain file now");
    }
    assert_eq!(["/dev/null", "/etc/passwd"].map(stat), before);
}
