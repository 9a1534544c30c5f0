//! Volume snapshots through the Fly Machines API on a 3-agent loopback cluster (ext4
//! volumes: as root, with loop devices): restoring and forking hold the data of the
//! snapshot's moment, and an agent killed mid-snapshot thaws the volume when it comes back.

use crate::common;
use crate::volumes_support;

use bazaar_testkit::start_cluster;
use common::*;
use reqwest::StatusCode;
use serde_json::json;
use std::path::Path;
use std::time::Duration;
use volumes_support::{agent_of, host_of, list_volumes, process_config, UnmountOnDrop};

/// Runs `script` with `sh -c` in machine `id` and returns its stdout (panics on a failure).
async fn sh(fly: &Fly, app: &str, id: &str, script: &str) -> String {
    let (s, v) = fly
        .post(
            &format!("/apps/{app}/machines/{id}/exec"),
            json!({"command": ["sh", "-c", script], "timeout": 60}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{script}: {v}");
    assert_eq!(v["exit_code"], 0, "{script}: {v}");
    v["stdout"].as_str().unwrap_or_default().to_string()
}

/// A started machine of `app` that mounts `volume` and, when `writer`, appends to a log in it
/// every few milliseconds (so snapshots are taken while it writes).
async fn machine_on(fly: &Fly, app: &str, volume: &str, writer: bool) -> String {
    let script = if writer {
        "while true; do echo tick >> \"$BAZAAR_VOLUME_PATH/ticks\"; sleep 0.005; done"
    } else {
        "while true; do sleep 0.2; done"
    };
    let (s, m) = fly
        .post(
            &format!("/apps/{app}/machines"),
            json!({"config": process_config(&["sh", "-c", script], 256, Some((volume, "/data")))}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let id = m["id"].as_str().unwrap().to_string();
    fly.wait_state(app, &id, "started").await;
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_restore_and_fork_hold_the_data_of_their_moment() {
    assert!(
        is_root() && Path::new("/dev/loop-control").exists(),
        "snapshots need ext4 volumes: run as root with loop devices"
    );
    let agents = start_cluster(Path::new(EXE), 3, |_, _| {}).unwrap();
    let _unmount = UnmountOnDrop::new(&agents);
    let fly = Fly::new(&agents[2]);
    fly.create_app("snap").await;
    let (s, v) = fly
        .post("/apps/snap/volumes", json!({"name": "data", "size_gb": 1}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let vol = v["id"].as_str().unwrap().to_string();
    let zone = v["zone"].as_str().unwrap().to_string();
    let owner = agent_of(&agents, &zone);

    // A machine keeps writing to the volume; it also writes a marker and 100 MB of data.
    let writer = machine_on(&fly, "snap", &vol, true).await;
    let first_sum = sh(
        &fly,
        "snap",
        &writer,
        "cd \"$BAZAAR_VOLUME_PATH\" && echo first > marker && \
         dd if=/dev/urandom of=big bs=1M count=100 2>/dev/null && sync && md5sum big",
    )
    .await;

    let started = std::time::Instant::now();
    let (s, snap) = fly
        .post(&format!("/apps/snap/volumes/{vol}/snapshots"), json!({}))
        .await;
    let snapshot_ms = started.elapsed().as_millis();
    assert_eq!(s, StatusCode::OK, "{snap}");
    let snap_id = snap["id"].as_str().unwrap().to_string();
    assert!(snap_id.starts_with("vs_"), "{snap}");
    assert_eq!(snap["status"], "created");
    assert!(
        snap["digest"].as_str().unwrap().starts_with("sha256:"),
        "{snap}"
    );
    assert!(snap["size"].as_u64().unwrap() >= 100 << 20, "{snap}");
    assert!(
        snap["created_at"].as_str().unwrap().ends_with('Z'),
        "{snap}"
    );
    // Taken while the machine wrote, the copy is a clean file system (the freeze flushed
    // the journal), and the writer was not harmed.
    let image = owner
        .data_dir
        .join("snapshots")
        .join(&snap_id)
        .join("volume.img");
    let fsck = std::process::Command::new("e2fsck")
        .args(["-f", "-n"])
        .arg(&image)
        .output()
        .expect("e2fsck");
    assert!(
        fsck.status.success(),
        "the snapshot is a consistent file system: {}",
        String::from_utf8_lossy(&fsck.stdout)
    );
    let (_, w) = fly.get(&format!("/apps/snap/machines/{writer}")).await;
    assert_eq!(w["state"], "started", "{w}");
    // The owner keeps it with what a restore needs.
    let kept = owner.client().snapshot(&snap_id).await.unwrap();
    assert_eq!(
        (
            kept.volume_id.as_str(),
            kept.app.as_str(),
            kept.volume_size_gb
        ),
        (vol.as_str(), "snap", 1)
    );
    assert_eq!(kept.retention_days, 5);
    assert_eq!(
        owner.client().volume_snapshots(&vol).await.unwrap().len(),
        1
    );

    // More data after the snapshot.
    sh(
        &fly,
        "snap",
        &writer,
        "cd \"$BAZAAR_VOLUME_PATH\" && echo second >> marker && echo later > after",
    )
    .await;
    let (s, list) = fly
        .get(&format!("/apps/snap/volumes/{vol}/snapshots"))
        .await;
    assert_eq!(s, StatusCode::OK, "{list}");
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list[0]["id"], snap_id.as_str());
    assert_eq!(list[0]["digest"], snap["digest"]);

    // Restore: a new volume with the snapshot's data only, on the snapshot's host.
    let started = std::time::Instant::now();
    let (s, restored) = fly
        .post(
            "/apps/snap/volumes",
            json!({"name": "restored", "snapshot_id": snap_id}),
        )
        .await;
    let restore_ms = started.elapsed().as_millis();
    assert_eq!(s, StatusCode::OK, "{restored}");
    eprintln!("1 GB volume, 100 MB of data: snapshot {snapshot_ms} ms, restore {restore_ms} ms");
    assert_eq!(restored["zone"], zone.as_str(), "{restored}");
    assert_eq!(restored["size_gb"], 1);
    assert_eq!(restored["state"], "created");
    let restored_id = restored["id"].as_str().unwrap().to_string();
    let reader = machine_on(&fly, "snap", &restored_id, false).await;
    let seen = sh(
        &fly,
        "snap",
        &reader,
        "cd \"$BAZAAR_VOLUME_PATH\" && cat marker && md5sum big && ls",
    )
    .await;
    assert!(seen.starts_with("first\n"), "{seen}");
    assert!(
        !seen.contains("second") && !seen.contains("after"),
        "{seen}"
    );
    assert!(
        seen.contains(first_sum.trim()),
        "the 100 MB file intact: {seen}"
    );

    // Fork: a copy of the volume as it is now, made while the machine writes; later
    // writes to the source do not reach it. A bigger size is grown into.
    let (s, forked) = fly
        .post(
            "/apps/snap/volumes",
            json!({"name": "forked", "source_volume_id": vol, "size_gb": 2}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{forked}");
    assert_eq!(forked["zone"], zone.as_str());
    assert_eq!(forked["size_gb"], 2);
    assert!(
        forked["blocks"].as_u64().unwrap() > restored["blocks"].as_u64().unwrap() * 3 / 2,
        "the fork's file system has the new size: {forked}"
    );
    let forked_id = forked["id"].as_str().unwrap().to_string();
    sh(
        &fly,
        "snap",
        &writer,
        "echo third >> \"$BAZAAR_VOLUME_PATH/marker\"",
    )
    .await;
    // The fork is not attached: mount it from a new machine (the writer keeps its own).
    let fork_reader = machine_on(&fly, "snap", &forked_id, false).await;
    let seen = sh(
        &fly,
        "snap",
        &fork_reader,
        "cd \"$BAZAAR_VOLUME_PATH\" && cat marker after",
    )
    .await;
    assert_eq!(seen, "first\nsecond\nlater\n");

    // Bad input: a 400 naming the field, nothing created.
    for (body, field) in [
        (
            json!({"name": "x", "snapshot_id": "vs_doesnotexist00"}),
            "snapshot_id",
        ),
        (
            json!({"name": "x", "snapshot_id": "../../etc"}),
            "snapshot_id",
        ),
        (
            json!({"name": "x", "source_volume_id": "vol_doesnotexist0000"}),
            "source_volume_id",
        ),
        (
            json!({"name": "x", "snapshot_id": snap_id, "source_volume_id": vol}),
            "source_volume_id",
        ),
        (
            json!({"name": "x", "snapshot_id": snap_id, "region": "elsewhere"}),
            "region",
        ),
        (
            json!({"name": "x", "snapshot_id": snap_id, "encrypted": true}),
            "encrypted",
        ),
    ] {
        let (s, v) = fly.post("/apps/snap/volumes", body.clone()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert!(
            v["error"].as_str().unwrap().contains(field),
            "{body}: names {field}: {v}"
        );
    }
    fly.create_app("stranger").await;
    let (s, v) = fly
        .post(
            "/apps/stranger/volumes",
            json!({"name": "x", "snapshot_id": snap_id}),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "another app's snapshot: {v}");
    let (s, _) = fly
        .post(
            &format!("/apps/stranger/volumes/{vol}/snapshots"),
            json!({}),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(
        list_volumes(&fly, "snap", 3).await.len(),
        3,
        "nothing created"
    );
    assert!(list_volumes(&fly, "stranger", 0).await.is_empty());

    // No volume claims encryption it does not have.
    let (s, v) = fly
        .post(
            "/apps/snap/volumes",
            json!({"name": "secret", "encrypted": true}),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"].as_str().unwrap().contains("dm-crypt"), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_mid_snapshot_thaws_the_volume_when_it_comes_back() {
    assert!(
        is_root() && Path::new("/dev/loop-control").exists(),
        "snapshots need ext4 volumes: run as root with loop devices"
    );
    let mut agents = start_cluster(Path::new(EXE), 2, |_, _| {}).unwrap();
    let _unmount = UnmountOnDrop::new(&agents);
    let fly = Fly::new(&agents[0]);
    fly.create_app("crash").await;
    let (s, v) = fly
        .post("/apps/crash/volumes", json!({"name": "data", "size_gb": 1}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let vol = v["id"].as_str().unwrap().to_string();
    let owner = agents
        .iter()
        .position(|a| host_of(a) == v["zone"].as_str().unwrap())
        .unwrap();
    // The API is asked through the other agent, which keeps the app while the owner is down.
    let fly = Fly::new(&agents[1 - owner]);
    // The other agent learns of the volume by gossip.
    bazaar_testkit::eventually(Duration::from_secs(10), || async {
        let (s, _) = fly.get(&format!("/apps/crash/volumes/{vol}")).await;
        (s == StatusCode::OK).then_some(())
    })
    .await
    .expect("the volume reaches the other agent's catalog");
    let writer = machine_on(&fly, "crash", &vol, true).await;
    let ticks = agents[owner]
        .data_dir
        .join("volumes")
        .join(&vol)
        .join("mnt")
        .join("ticks");
    let size = || std::fs::metadata(&ticks).map(|m| m.len()).unwrap_or(0);
    let grows = |what: &'static str| {
        let size = &size;
        async move {
            let before = size();
            bazaar_testkit::eventually(Duration::from_secs(10), || async {
                (size() > before).then_some(())
            })
            .await
            .unwrap_or_else(|_| panic!("the machine's writes {what}"));
        }
    };
    grows("before the snapshot").await;

    // The agent dies while the volume's file system is frozen: the machine's writes wait.
    agents[owner].kill9();
    agents[owner]
        .spawn(&[("BAZAAR_CRASH_AT", "volume_snapshot:0")])
        .unwrap();
    // Once the other node reaches the restarted owner again.
    let owner_back = || async {
        bazaar_testkit::eventually(Duration::from_secs(20), || async {
            let (s, v) = fly.get(&format!("/apps/crash/volumes/{vol}")).await;
            (s == StatusCode::OK && v["host_status"] == "ok").then_some(())
        })
        .await
        .expect("the volume's owner answers again");
    };
    let snapshot = || async {
        owner_back().await;
        fly.post(&format!("/apps/crash/volumes/{vol}/snapshots"), json!({}))
            .await
    };
    let (s, v) = snapshot().await;
    assert!(s.is_server_error(), "the agent died mid-snapshot: {s} {v}");
    if let Err(err) = agents[owner].wait_exit(Duration::from_secs(10)) {
        panic!("{err}: the snapshot call answered {s} {v}");
    }
    let frozen_at = size();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        size(),
        frozen_at,
        "the volume is frozen while its agent is away"
    );

    // A snapshot past its retention (5 days) is removed when the agent starts too.
    let expired = agents[owner].data_dir.join("snapshots/vs_expired000000000");
    std::fs::create_dir_all(&expired).unwrap();
    std::fs::write(expired.join("volume.img"), b"old").unwrap();
    let day_ms = 86_400_000;
    let old = bazaar_types::volume::HostSnapshot {
        id: "vs_expired000000000".into(),
        volume_id: vol.clone(),
        app: "crash".into(),
        size: 3,
        digest: "sha256:00".into(),
        created_at_ms: bazaar_types::now_ms() - 6 * day_ms,
        volume_size_gb: 1,
        retention_days: 5,
    };
    std::fs::write(
        expired.join("snapshot.json"),
        serde_json::to_vec(&old).unwrap(),
    )
    .unwrap();

    // Back: the volume is thawed, the half-made and the expired snapshots are gone,
    // snapshots work again.
    agents[owner].kill9();
    agents[owner].spawn(&[]).unwrap();
    grows("after the agent came back").await;
    owner_back().await; // it serves once its recovery is done
    let snapshots = agents[owner].data_dir.join("snapshots");
    let left: Vec<_> = std::fs::read_dir(&snapshots)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        left.is_empty(),
        "no partial or expired snapshot left: {left:?}"
    );

    let (s, snap) = snapshot().await;
    assert_eq!(s, StatusCode::OK, "{snap}");
    let (s, list) = fly
        .get(&format!("/apps/crash/volumes/{vol}/snapshots"))
        .await;
    assert_eq!(s, StatusCode::OK, "{list}");
    assert_eq!(
        list.as_array().unwrap().len(),
        1,
        "only the new one: {list}"
    );
    let (_, m) = fly.get(&format!("/apps/crash/machines/{writer}")).await;
    assert_eq!(m["state"], "started", "{m}");
}
