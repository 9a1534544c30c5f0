//! An image machine's writable layer has a size the kernel enforces (issue 31 item 5): its
//! overlay's upper and work dirs are on a loop-mounted ext4 of the machine's size, owned by
//! its user namespace's root, so writing past it fails with "no space left" inside the
//! machine and the host's disk grows by at most that size; the agent notices the full disk
//! while the machine runs (a `disk_full` event, once); a restart starts from the image
//! again on the same, emptied disk; destroy and `bazaar host reset` leave no mount nor loop
//! device. Needs root (runc, loop devices, mounts): run under the e2e lock.

use crate::common;

use bazaar_testkit::images::{
    busybox_rootfs_layer, config_with, ensure_packages, push_with_config, TestRegistry,
};
use bazaar_testkit::{start_cluster, TestAgent};
use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// Pushes a busybox image that sleeps, and names it.
async fn push_image(registry: &TestRegistry) -> String {
    let reg =
        bazaar_image::Registry::new(&registry.host, bazaar_image::Auth::Anonymous, true).unwrap();
    let layer = busybox_rootfs_layer(
        &["sh", "dd", "sleep", "echo", "ls", "df", "rm"],
        ("etc/motd", b"disk\n"),
    );
    let config = config_with(
        &[&layer],
        bazaar_image::manifest::Platform::current()
            .architecture
            .as_str(),
        json!({"Cmd": ["/bin/sleep", "1000"], "Env": ["PATH=/bin"]}),
    );
    push_with_config(&reg, "disk", "1", &[&layer], &config).await;
    format!("{}/disk:1", registry.host)
}

/// Runs `cmd` with `sh -c` in the machine; its stdout.
async fn sh(fly: &Fly, id: &str, cmd: &str) -> String {
    let (s, v) = fly
        .post(
            &format!("/apps/disk/machines/{id}/exec"),
            json!({"command": ["/bin/sh", "-c", cmd], "timeout": 20}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "exec {cmd}: {v}");
    v["stdout"].as_str().unwrap_or_default().to_string()
}

async fn create(fly: &Fly, image: &str) -> String {
    let (s, m) = fly
        .post(
            "/apps/disk/machines",
            json!({"config": {
                "image": image,
                "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256},
            }}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let id = m["id"].as_str().unwrap().to_string();
    wait_started(fly, "disk", &id).await;
    id
}

async fn disk_full_events(fly: &Fly, id: &str) -> Vec<Value> {
    let (s, events) = fly.get(&format!("/apps/disk/machines/{id}/events")).await;
    assert_eq!(s, StatusCode::OK, "{events}");
    events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "disk_full")
        .cloned()
        .collect()
}

/// Bytes allocated on the host's file system below `dir`, not counting other file systems
/// mounted there.
fn host_bytes(dir: &Path) -> u64 {
    let dev = std::fs::symlink_metadata(dir).unwrap().dev();
    let mut total = 0;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let m = e.metadata().unwrap();
        if m.dev() != dev {
            continue;
        }
        total += if m.is_dir() {
            host_bytes(&e.path())
        } else {
            m.blocks() * 512
        };
    }
    total
}

/// Mount points of the host below `dir`.
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

/// Waits (≤ 10 s) until nothing is mounted and no loop device is backed below `dir`.
async fn nothing_left(dir: &Path, after: &str) {
    bazaar_testkit::eventually(Duration::from_secs(10), || async {
        (mounts_below(dir).is_empty() && loops_below(dir).is_empty()).then_some(())
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "left after {after}: mounts {:?}, loop devices {:?}",
            mounts_below(dir),
            loops_below(dir)
        )
    });
}

fn agent_with(args: &[&str]) -> TestAgent {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let mut agents =
        start_cluster(Path::new(EXE), 1, |_, o| o.extra_args = args.clone()).expect("agent starts");
    agents.pop().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_machine_fills_only_its_own_disk_and_is_told_while_it_runs() {
    assert!(
        is_root(),
        "this test needs root (runc, loop devices, mounts)"
    );
    ensure_packages();
    let registry = TestRegistry::start(None);
    let image = push_image(&registry).await;
    let mut agent = agent_with(&["--machine-disk-mb", "64"]);
    let fly = Fly::new(&agent);
    fly.create_app("disk").await;
    let id = create(&fly, &image).await;
    let machine_dir = agent.data_dir.join("machines").join(&id);
    let layer = machine_dir.join("layer");

    // The writable layer is a file system of its own, its upper dir owned by the machine's
    // root (an unprivileged host id), and the machine sees a root of 64 MB.
    assert_ne!(
        std::fs::metadata(&layer).unwrap().dev(),
        std::fs::metadata(&machine_dir).unwrap().dev(),
        "the layer is not a mount"
    );
    let upper = std::fs::metadata(layer.join("upper")).unwrap();
    assert!(upper.uid() >= 1 << 20, "upper owned by {}", upper.uid());
    let df = sh(&fly, &id, "df -m / | tail -1").await;
    let size_mb: u64 = df.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!((48..=64).contains(&size_mb), "{df}");

    // 200 MB asked for, 64 MB given: "no space left" inside, the host's disk spared.
    let before = host_bytes(&machine_dir);
    let out = sh(
        &fly,
        &id,
        "dd if=/dev/zero of=/big bs=1M count=200 2>&1; echo dd=$?",
    )
    .await;
    assert!(out.contains("No space left on device"), "{out}");
    assert!(out.contains("dd=1"), "{out}");
    let grown = host_bytes(&machine_dir).saturating_sub(before);
    assert!(
        grown <= 64 << 20,
        "the host's disk grew by {grown} bytes past a 64 MB limit"
    );

    // Noticed while it runs: one disk_full event, the machine still started.
    let event = bazaar_testkit::eventually(Duration::from_secs(15), || async {
        disk_full_events(&fly, &id).await.into_iter().next()
    })
    .await
    .expect("a disk_full event while the machine runs");
    assert_eq!(event["status"], "started", "{event}");
    assert!(
        event["request"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("disk full")),
        "{event}"
    );
    let (_, m) = fly.get(&format!("/apps/disk/machines/{id}")).await;
    assert_eq!(m["state"], "started", "{m}");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        disk_full_events(&fly, &id).await.len(),
        1,
        "one event per crossing"
    );

    // A restart starts from the image again, on the same disk, emptied.
    let (s, v) = fly
        .post(&format!("/apps/disk/machines/{id}/stop"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = fly
        .get(&format!(
            "/apps/disk/machines/{id}/wait?state=stopped&timeout=30"
        ))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = fly
        .post(&format!("/apps/disk/machines/{id}/start"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    wait_started(&fly, "disk", &id).await;
    let out = sh(&fly, &id, "ls /big 2>&1; echo ls=$?; cat /etc/motd").await;
    assert!(out.contains("ls=1") && out.contains("disk"), "{out}");
    assert_eq!(loops_below(&machine_dir).len(), 1, "one disk per machine");
    // It fills again, and is told again.
    sh(
        &fly,
        &id,
        "dd if=/dev/zero of=/big bs=1M count=200 2>/dev/null; true",
    )
    .await;
    bazaar_testkit::eventually(Duration::from_secs(15), || async {
        (disk_full_events(&fly, &id).await.len() == 2).then_some(())
    })
    .await
    .expect("a second disk_full event after the restart");

    // Destroyed: nothing of it is left.
    let (s, v) = fly
        .delete(&format!("/apps/disk/machines/{id}?force=true"))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    nothing_left(&machine_dir, "destroy").await;
    bazaar_testkit::eventually(Duration::from_secs(10), || async {
        (!machine_dir.exists()).then_some(())
    })
    .await
    .expect("the machine's directory removed");

    // `bazaar host reset` after a kill -9, a machine running: nothing of its disk is left.
    create(&fly, &image).await;
    assert!(!loops_below(&agent.data_dir).is_empty());
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
    nothing_left(&data_dir, "reset").await;
}

/// Not a check: create→started of image machines with a disk of their own (the default
/// size by guest, 1 GB for 256 MB) and without (`--machine-disk-mb 0`), one agent after
/// the other. `cargo nextest run -p bazaar --test e2e_lifecycle image_disk:: --run-ignored only
/// --no-capture` (under the e2e lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, run by hand"]
async fn image_machine_start_time_with_and_without_a_disk() {
    ensure_packages();
    let registry = TestRegistry::start(None);
    let image = push_image(&registry).await;
    for (label, args) in [
        ("no disk limit", vec!["--machine-disk-mb", "0"]),
        ("a 1 GB disk each", vec![]),
        ("no disk limit", vec!["--machine-disk-mb", "0"]),
        ("a 1 GB disk each", vec![]),
    ] {
        let agent = agent_with(&args);
        let fly = Fly::new(&agent);
        fly.create_app("disk").await;
        let mut times = Vec::new();
        for _ in 0..11 {
            let t0 = Instant::now();
            create(&fly, &image).await;
            times.push(t0.elapsed());
        }
        // The first pulls the image (and makes the disk template).
        let first = times.remove(0);
        times.sort();
        eprintln!(
            "{label}: first {:.1} ms, then min {:.1} / median {:.1} / max {:.1} ms",
            first.as_secs_f64() * 1e3,
            times[0].as_secs_f64() * 1e3,
            times[times.len() / 2].as_secs_f64() * 1e3,
            times[times.len() - 1].as_secs_f64() * 1e3
        );
    }
}
