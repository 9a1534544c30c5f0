//! A full disk under an agent's data dir (docs/RELIABILITY.md, `fill-disk`): while it is
//! full a write fails with 507 and says why; once space is freed the same agent process
//! writes again, and a destroy acknowledged before the disk filled, whose steps could not
//! be recorded meanwhile, completes. (redb refuses every write after one I/O error until
//! the database is reopened: this used to need an agent restart.)

use crate::common;

use bazaar_client::ClientError;
use bazaar_testkit::{AgentOptions, TestAgent};
use bazaar_types::state::MachineState;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A tmpfs of a few MiB mounted for the test, unmounted when dropped.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(at: &Path) -> SmallDisk {
        std::fs::create_dir_all(at).unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=12m,mode=700", "bazaar-disk-full"])
            .arg(at)
            .status()
            .unwrap();
        assert!(status.success(), "mounting a tmpfs at {}", at.display());
        SmallDisk(at.to_path_buf())
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("--lazy")
            .arg(&self.0)
            .status();
    }
}

const FILLER: &str = "filler";

/// Writes a file into `dir` until its file system is full.
fn fill(dir: &Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(dir.join(FILLER)).unwrap();
    let block = vec![0xa5u8; 1 << 20];
    let mut size = block.len();
    while size > 0 {
        match f.write(&block[..size]) {
            Ok(n) if n > 0 => {}
            Err(e) if e.raw_os_error() != Some(libc::ENOSPC) => panic!("filling: {e}"),
            _ => size /= 2,
        }
    }
}

/// A create whose config is large enough that its record needs pages the store does not
/// have yet (a small one may fit in pages freed by earlier transactions).
fn large_create(app: &str) -> bazaar_types::host::ClaimRequest {
    let mut req = bazaar_testkit::create_request(app, &["sleep", "1000"]);
    // About 300 KiB, within a config's limits (docs/API.md): env values of at most 32 KiB
    // and 64 KiB in all, files of at most 256 KiB in all.
    for i in 0..2 {
        req.config
            .env
            .insert(format!("PADDING_{i}"), "x".repeat(30 * 1024));
    }
    for i in 0..3 {
        req.config.files.push(bazaar_types::config::FileConfig {
            guest_path: format!("/padding/{i}"),
            raw_value: Some("eHh4".repeat(20 * 1024)),
            mode: None,
            extra: Default::default(),
        });
    }
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_writes_with_507_and_heals_without_a_restart() {
    if !bazaar_testkit::can_run(common::is_root(), "root (to mount a tmpfs)") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let disk = SmallDisk::mount(&tmp.path().join("disk"));
    let data_dir = disk.0.join("data");
    let agent = TestAgent::start_in(AgentOptions::new(common::EXE), data_dir.clone()).unwrap();
    let pid = agent.pid();
    let c = agent.client();

    // A machine that takes 3 s to stop: its stop and the destroy queued behind it are
    // acknowledged, and the exit comes while the disk is full.
    let slow = c
        .create(&bazaar_testkit::create_request(
            "full",
            &[
                "sh",
                "-c",
                "trap 'sleep 3; exit 0' INT TERM; while true; do sleep 0.1; done",
            ],
        ))
        .await
        .unwrap();
    common::wait_state(&c, &slow.id, MachineState::Started).await;
    let started = Instant::now();
    c.stop(&slow.id, &Default::default()).await.unwrap();
    c.destroy(&slow.id, false).await.unwrap();

    fill(&data_dir);
    let mut refused = None;
    for _ in 0..10 {
        match c.create(&large_create("full")).await {
            Ok(_) => continue,
            Err(err) => {
                refused = Some(err);
                break;
            }
        }
    }
    match refused {
        Some(ClientError::Status {
            status, message, ..
        }) => {
            assert_eq!(status, 507, "{message}");
            assert!(
                message.contains("disk") && message.contains("full"),
                "{message}"
            );
        }
        other => panic!("a create on a full disk: {other:?}"),
    }
    // The exit cannot be recorded while the disk is full.
    let exited = Duration::from_millis(3500);
    tokio::time::sleep(exited.saturating_sub(started.elapsed())).await;
    let m = c.machine(&slow.id).await.unwrap();
    assert_eq!(m.state, MachineState::Stopping, "{m:?}");

    std::fs::remove_file(data_dir.join(FILLER)).unwrap();
    let gone = bazaar_testkit::eventually(Duration::from_secs(5), || async {
        match c.machine(&slow.id).await {
            Ok(m) => (m.state == MachineState::Destroyed).then_some(()),
            Err(ClientError::Status { status: 404, .. }) => Some(()),
            Err(_) => None,
        }
    })
    .await;
    assert!(
        gone.is_ok(),
        "the acknowledged destroy did not finish once space was freed: {:?}\n{}",
        c.machine(&slow.id).await,
        agent.log_tail()
    );
    let after = c
        .create(&large_create("full"))
        .await
        .expect("a create once space is freed");
    common::wait_state(&c, &after.id, MachineState::Started).await;
    assert_eq!(agent.pid(), pid, "the agent restarted");
    drop(agent);
}
