//! `bazaar host backup` / `restore` on a 2-agent loopback cluster with certificates: a
//! backup taken while the agent runs, its data dir's store and keys wiped after a kill -9,
//! the backup restored and the agent started again: same host id, its running machine
//! re-adopted (same pid) and the cluster sees it alive with its machine. A restore is
//! refused while the agent runs. The CA's directory goes in the CA host's backup and
//! comes back byte for byte.

use crate::common;

use bazaar_testkit::{create_request, pid_alive, start_cluster, TEST_SECRET};
use bazaar_types::state::MachineState;
use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

const GUIDE: &str = include_str!("../../../docs/INSTALL.md");

/// The line of the guide's `sh install-guide` blocks that holds `needle`, its example
/// paths swapped for `paths` (longest first).
fn guide_line(needle: &str, paths: &[(&str, &Path)]) -> String {
    let line = GUIDE
        .split("```sh install-guide\n")
        .skip(1)
        .filter_map(|rest| rest.split_once("```").map(|b| b.0))
        .flat_map(str::lines)
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no guide line with {needle:?}"));
    let mut line = line.split(" # ").next().unwrap().trim().to_string();
    for (from, to) in paths {
        line = line.replace(from, to.to_str().unwrap());
    }
    line
}

/// Runs a line of the guide with the binary on PATH and no secret in the environment; it
/// must succeed.
fn run_guide(line: &str) -> std::process::Output {
    let bin = Path::new(EXE).parent().unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let out = std::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", line])
        .env("PATH", path)
        .env_remove("BAZAAR_API_URL")
        .env_remove("BAZAAR_CLUSTER_SECRET")
        .env_remove("BAZAAR_HOST_DATA_DIR")
        .output()
        .unwrap();
    assert!(out.status.success(), "{line}: {out:?}");
    out
}

fn bazaar(url: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(EXE)
        .args(args)
        .env("BAZAAR_API_URL", url)
        .env("BAZAAR_CLUSTER_SECRET", TEST_SECRET)
        .env_remove("BAZAAR_HOST_DATA_DIR")
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_restored_from_a_backup_readopts_its_machines_and_rejoins() {
    let mut agents = start_cluster(Path::new(EXE), 2, |_, _| {}).unwrap();
    let fly = Fly::new(&agents[0]);
    fly.create_app("kept").await;
    let host = agents[1].client();
    let id = host.info().await.unwrap().id;
    let m = host
        .create(&create_request("kept", &["sleep", "3600"]))
        .await
        .unwrap();
    let before = wait_state(&host, &m.id, MachineState::Started).await;
    let pid = before.pid.expect("a pid");

    // Backed up as the guide says, while the agent runs (it copies its own store).
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("h2.tar.gz");
    let data = agents[1].data_dir.clone();
    let ca = agents[0].cluster_ca_dir().unwrap().to_path_buf();
    let ca_archive = dir.path().join("h1.tar.gz");
    let paths = |data: &Path, ca: &Path| -> Vec<(&'static str, PathBuf)> {
        vec![
            ("/var/lib/bazaar-ca", ca.to_path_buf()),
            ("/var/lib/bazaar", data.to_path_buf()),
            ("/root/bazaar-host.tar.gz", archive.clone()),
            ("/root/bazaar-first.tar.gz", ca_archive.clone()),
        ]
    };
    let local = |needle: &str, data: &Path, ca: &Path| {
        let p = paths(data, ca);
        let p: Vec<(&str, &Path)> = p.iter().map(|(a, b)| (*a, b.as_path())).collect();
        guide_line(needle, &p)
    };
    let backup = local("--out /root/bazaar-host.tar.gz", &data, &ca);
    let out = run_guide(&format!("{backup} --json"));
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let files = listed["data"].to_string();
    for f in ["agent.redb", "host-key", "tls/host.pem"] {
        assert!(files.contains(f), "{f} not in {files}");
    }
    let mode = std::fs::metadata(&archive).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    assert!(!data.join(bazaar_agent::backup::STORE_COPY).exists());

    // Not over a running agent.
    let out = bazaar(
        &agents[1].url(),
        &[
            "host",
            "restore",
            archive.to_str().unwrap(),
            "--data-dir",
            data.to_str().unwrap(),
        ],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is running"),
        "{out:?}"
    );

    // The host loses its store and keys; its machine keeps running.
    agents[1].kill9();
    for f in ["agent.redb", "host-key", "cluster-secret"] {
        let _ = std::fs::remove_file(data.join(f));
    }
    for d in ["tls", "mesh"] {
        let _ = std::fs::remove_dir_all(data.join(d));
    }
    assert!(pid_alive(pid as i32));
    let out = bazaar(
        &agents[1].url(),
        &[
            "host",
            "restore",
            archive.to_str().unwrap(),
            "--data-dir",
            data.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{out:?}");
    agents[1].spawn(&[]).unwrap();

    // The same host, its machine re-adopted, and the cluster sees both.
    let host = agents[1].client();
    assert_eq!(host.info().await.unwrap().id, id);
    let after = wait_state(&host, &m.id, MachineState::Started).await;
    assert_eq!(after.pid, Some(pid), "the workload was started anew");
    let seen = bazaar_testkit::eventually(Duration::from_secs(20), || async {
        let (_, v) = fly.get(&format!("/apps/kept/machines/{}", m.id)).await;
        (v["state"] == "started" && v["host_id"] == id.as_str()).then_some(())
    })
    .await;
    assert!(seen.is_ok(), "the first agent never saw the machine again");
    let alive = bazaar_testkit::eventually(Duration::from_secs(20), || async {
        let hosts = agents[0].client().catalog_hosts().await.ok()?;
        hosts
            .iter()
            .any(|h| h.id == id && h.status == "alive")
            .then_some(())
    })
    .await;
    assert!(alive.is_ok(), "the restored host never rejoined");

    // The CA's directory, in the CA host's backup.
    run_guide(&local("--ca-dir", &agents[0].data_dir, &ca));
    let elsewhere = tempfile::tempdir().unwrap();
    let (restored_data, restored_ca) = (elsewhere.path().join("data"), elsewhere.path().join("ca"));
    let out = bazaar(
        &agents[0].url(),
        &[
            "host",
            "restore",
            ca_archive.to_str().unwrap(),
            "--data-dir",
            restored_data.to_str().unwrap(),
            "--ca-dir",
            restored_ca.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        std::fs::read(restored_ca.join("ca.key")).unwrap(),
        std::fs::read(ca.join("ca.key")).unwrap()
    );
    assert!(restored_data.join("agent.redb").is_file());
    // Without --ca-dir, such a backup is refused, saying why.
    let out = bazaar(
        &agents[0].url(),
        &[
            "host",
            "restore",
            ca_archive.to_str().unwrap(),
            "--data-dir",
            elsewhere.path().join("other").to_str().unwrap(),
        ],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--ca-dir"),
        "{out:?}"
    );
}
