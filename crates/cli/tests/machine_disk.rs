//! A machine's writable space has a size the kernel enforces (issue 31 item 5): a process
//! machine that fills its work directory gets "no space left" at its limit, not the host's
//! disk, and its exit comes with a `disk_full` event; `config.rootfs.size_gb` sets the size
//! (bad values are a 400); nothing of it is left after a kill -9, a restart and a destroy,
//! nor after `bazaar host reset`.
//! Needs root (loop devices, mounts): run under the e2e lock.

use crate::common;

use bazaar_testkit::{create_request, AgentOptions, TestAgent};
use bazaar_types::state::MachineState;
use common::*;
use std::path::Path;

/// Mount points of the host at or below `dir`.
fn mounts_below(dir: &Path) -> Vec<String> {
    let dir = std::fs::canonicalize(dir).unwrap_or(dir.to_path_buf());
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_owned))
        .filter(|p| Path::new(p).starts_with(&dir))
        .collect()
}

/// Loop devices whose backing file is below `dir`.
fn loops_below(dir: &Path) -> Vec<String> {
    let dir = std::fs::canonicalize(dir).unwrap_or(dir.to_path_buf());
    std::fs::read_dir("/sys/block")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let backing = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"));
            backing
                .ok()
                .filter(|b| Path::new(b.trim()).starts_with(&dir))
                .map(|_| name)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_fills_only_its_own_limited_disk_and_says_so() {
    assert!(is_root(), "this test needs root (CI runs as root)");
    let mut opts = AgentOptions::new(EXE);
    opts.extra_args = vec!["--machine-disk-mb".into(), "64".into()];
    let mut agent = TestAgent::start(opts).expect("agent starts");
    let c = agent.client();

    // 200 MB asked for, 64 MB given: dd fails with ENOSPC and the machine exits.
    let mut req = create_request(
        "disk",
        &[
            "sh",
            "-c",
            "dd if=/dev/zero of=big bs=1M count=200 2>&1; echo dd=$?",
        ],
    );
    req.config.restart = serde_json::from_value(serde_json::json!({"policy": "no"})).unwrap();
    let m = c.create(&req).await.expect("create");
    wait_state(&c, &m.id, MachineState::Stopped).await;
    let work = agent.data_dir.join("machines").join(&m.id).join("work");
    let written = std::fs::metadata(work.join("big")).unwrap().len();
    assert!(
        written <= 64 << 20,
        "wrote {written} bytes past a 64 MB limit"
    );
    let logs = c.logs(&m.id).await.unwrap();
    assert!(logs.contains("No space left on device"), "{logs}");
    let events = c.events(&m.id).await.unwrap();
    let full = events
        .iter()
        .find(|e| e.kind == "disk_full")
        .unwrap_or_else(|| panic!("no disk_full event: {events:#?}"));
    let reason = full.request.as_ref().and_then(|r| r.reason.clone());
    assert!(
        reason.as_deref().is_some_and(|r| r.contains("disk full")),
        "{reason:?}"
    );

    // config.rootfs.size_gb sets the size; a bad one is refused and makes nothing.
    let mut bad = create_request("disk", &["true"]);
    bad.config
        .extra
        .insert("rootfs".into(), serde_json::json!({"size_gb": 0}));
    let err = c.create(&bad).await.unwrap_err().to_string();
    assert!(err.contains("config.rootfs.size_gb"), "{err}");
    let mut sized = create_request("disk", &["sleep", "1000"]);
    sized
        .config
        .extra
        .insert("rootfs".into(), serde_json::json!({"size_gb": 1}));
    let sized = c.create(&sized).await.expect("create");
    wait_state(&c, &sized.id, MachineState::Started).await;
    let sized_work = agent.data_dir.join("machines").join(&sized.id).join("work");
    let df = std::process::Command::new("df")
        .args(["--output=size", "-BM"])
        .arg(&sized_work)
        .output()
        .unwrap();
    let df = String::from_utf8_lossy(&df.stdout);
    let size_mb: u64 = df
        .lines()
        .nth(1)
        .unwrap()
        .trim()
        .trim_end_matches('M')
        .parse()
        .unwrap();
    assert!((900..=1024).contains(&size_mb), "{df}");

    // A kill -9 and a restart keep the running machine's disk mounted (the stopped one's
    // is unmounted until it starts again); destroying the machines removes them.
    agent.kill9();
    agent.restart().expect("restart");
    let c = agent.client();
    wait_state(&c, &sized.id, MachineState::Started).await;
    let mounted = mounts_below(&agent.data_dir.join("machines"));
    assert!(
        mounted.len() == 1 && mounted[0].ends_with(&format!("{}/work", sized.id)),
        "{mounted:?}"
    );
    for id in [&m.id, &sized.id] {
        c.destroy(id, true).await.expect("destroy");
        wait_state(&c, id, MachineState::Destroyed).await;
    }
    let machines = agent.data_dir.join("machines");
    bazaar_testkit::eventually(std::time::Duration::from_secs(10), || async {
        (mounts_below(&machines).is_empty() && loops_below(&agent.data_dir).is_empty())
            .then_some(())
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "left after destroy: mounts {:?}, loop devices {:?}",
            mounts_below(&machines),
            loops_below(&agent.data_dir)
        )
    });

    // `bazaar host reset` after a kill -9, a machine running: nothing of its disk is left.
    let last = create_request("disk", &["sleep", "1000"]);
    let last = c.create(&last).await.expect("create");
    wait_state(&c, &last.id, MachineState::Started).await;
    assert_eq!(mounts_below(&machines).len(), 1);
    let data_dir = std::fs::canonicalize(&agent.data_dir).unwrap();
    agent.kill9();
    let out = std::process::Command::new(EXE)
        .args(["host", "reset", "--data-dir"])
        .arg(&data_dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "reset: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    bazaar_testkit::eventually(std::time::Duration::from_secs(10), || async {
        (mounts_below(&data_dir).is_empty() && loops_below(&data_dir).is_empty()).then_some(())
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "left after reset: mounts {:?}, loop devices {:?}",
            mounts_below(&data_dir),
            loops_below(&data_dir)
        )
    });
}

/// A process machine whose disk fills and that keeps running is told so while it runs:
/// one `disk_full` event (not only at its exit), the machine still started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_reported_while_the_machine_runs() {
    assert!(is_root(), "this test needs root (CI runs as root)");
    let mut opts = AgentOptions::new(EXE);
    opts.extra_args = vec!["--machine-disk-mb".into(), "32".into()];
    let agent = TestAgent::start(opts).expect("agent starts");
    let c = agent.client();
    let req = create_request(
        "disk",
        &[
            "sh",
            "-c",
            "dd if=/dev/zero of=big bs=1M count=100 2>&1; echo dd=$?; exec sleep 1000",
        ],
    );
    let m = c.create(&req).await.expect("create");
    wait_state(&c, &m.id, MachineState::Started).await;
    let full = |events: Vec<bazaar_types::event::MachineEvent>| -> Vec<_> {
        events
            .into_iter()
            .filter(|e| e.kind == "disk_full")
            .collect()
    };
    let event = bazaar_testkit::eventually(std::time::Duration::from_secs(15), || async {
        full(c.events(&m.id).await.ok()?).into_iter().next()
    })
    .await
    .expect("a disk_full event while the machine runs");
    assert_eq!(event.status, "started");
    let reason = event.request.and_then(|r| r.reason).unwrap_or_default();
    assert!(reason.contains("disk full"), "{reason}");
    assert_eq!(c.machine(&m.id).await.unwrap().state, MachineState::Started);
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    assert_eq!(
        full(c.events(&m.id).await.unwrap()).len(),
        1,
        "one event per crossing"
    );
    c.destroy(&m.id, true).await.expect("destroy");
    wait_state(&c, &m.id, MachineState::Destroyed).await;
}
