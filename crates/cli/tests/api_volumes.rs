//! Volumes through the Fly Machines API on a 3-agent loopback cluster: the CRUD calls with
//! Fly's shapes, bad input, `require_unique_zone` spreading same-name volumes over hosts,
//! machines pinned to their volume's host, the attach rules (412), a volume's data surviving
//! stop/start, restart and a kill -9 of its agent, and `bazaar volumes`. As root volumes are
//! ext4 images on loop devices; otherwise plain directories (`fstype: "dir"`).

use crate::common;
use crate::volumes_support;

use bazaar_testkit::{start_cluster, TEST_SECRET};
use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;
use volumes_support::{
    agent_of, expected_fstype, host_of, list_volumes, mounts_under, process_config, UnmountOnDrop,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volume_crud_with_fly_shapes_and_bad_input() {
    let agents = start_cluster(Path::new(EXE), 3, |_, _| {}).unwrap();
    let _unmount = UnmountOnDrop::new(&agents);
    let fly = Fly::new(&agents[1]);
    fly.create_app("db").await;

    let (s, v) = fly
        .post(
            "/apps/db/volumes",
            json!({"name": "pg_data", "size_gb": 1, "region": "local",
                   "snapshot_id": null, "auto_backup_enabled": false}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("vol_") && id.len() == 20, "{id}");
    assert_eq!(v["name"], "pg_data");
    assert_eq!(v["state"], "created");
    assert_eq!(v["size_gb"], 1);
    assert_eq!(v["region"], "local");
    assert_eq!(
        v["encrypted"], false,
        "volumes are plain ext4: never claimed encrypted"
    );
    assert_eq!(v["attached_machine_id"], Value::Null);
    assert_eq!(v["host_status"], "ok");
    assert_eq!(v["fstype"], expected_fstype());
    assert_eq!(v["snapshot_retention"], 5);
    assert_eq!(v["type"], "local");
    assert!(v["created_at"].as_str().unwrap().ends_with('Z'));
    assert!(v["block_size"].as_u64().unwrap() > 0);
    let blocks = v["blocks"].as_u64().unwrap();
    assert!(blocks > 0 && v["blocks_avail"].as_u64().unwrap() <= blocks);
    let zone = v["zone"].as_str().unwrap().to_string();
    let owner = agent_of(&agents, &zone);
    let storage = owner.data_dir.join("volumes").join(&id);
    assert!(storage.join("mnt").is_dir());
    if expected_fstype() == "ext4" {
        let mnt = std::fs::canonicalize(storage.join("mnt")).unwrap();
        assert!(
            mounts_under(&owner.data_dir).contains(&mnt.display().to_string()),
            "the ext4 image is mounted at {}",
            mnt.display()
        );
    }

    // List (from the catalog) and get (from the owner) on every node.
    for agent in &agents {
        let fly = Fly::new(agent);
        let list = list_volumes(&fly, "db", 1).await;
        assert_eq!(list[0]["id"], id.as_str());
        assert_eq!(list[0]["zone"], zone.as_str());
        let (s, g) = fly.get(&format!("/apps/db/volumes/{id}")).await;
        assert_eq!(s, StatusCode::OK, "{g}");
        assert_eq!(g["name"], "pg_data");
    }
    let (_, app) = fly.get("/apps/db").await;
    assert_eq!(app["volume_count"], 1);

    // Update.
    let (s, u) = fly
        .put(
            &format!("/apps/db/volumes/{id}"),
            json!({"snapshot_retention": 10, "auto_backup_enabled": true}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{u}");
    assert_eq!(u["snapshot_retention"], 10);
    assert_eq!(u["auto_backup_enabled"], true);
    // Fly's method for it is POST.
    let (s, u) = fly
        .post(
            &format!("/apps/db/volumes/{id}"),
            json!({"snapshot_retention": 12}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{u}");
    assert_eq!(u["snapshot_retention"], 12);
    let (_, g) = fly.get(&format!("/apps/db/volumes/{id}")).await;
    assert_eq!(g["snapshot_retention"], 12);
    let (s, u) = fly
        .post(
            &format!("/apps/db/volumes/{id}"),
            json!({"snapshot_retention": 0}),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{u}");

    // Extend: grows (the file system too), never shrinks.
    let (s, e) = fly
        .put(
            &format!("/apps/db/volumes/{id}/extend"),
            json!({"size_gb": 2}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{e}");
    assert_eq!(e["needs_restart"], false);
    assert_eq!(e["volume"]["size_gb"], 2);
    assert_eq!(e["volume"]["state"], "created");
    if expected_fstype() == "ext4" {
        assert!(
            e["volume"]["blocks"].as_u64().unwrap() > blocks * 3 / 2,
            "the file system grew: {e}"
        );
    }
    for (body, what) in [
        (json!({"size_gb": 1}), "shrink"),
        (json!({"size_gb": 2}), "same size"),
        (json!({}), "no size"),
        (json!({"size_gb": 100000}), "absurd size"),
    ] {
        let (s, v) = fly
            .put(&format!("/apps/db/volumes/{id}/extend"), body)
            .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{what}: {v}");
        assert!(v["error"].as_str().is_some(), "{what}: Fly error shape {v}");
    }

    // Bad input: a clear 4xx, nothing created.
    for (body, want) in [
        (json!({"name": "x", "size_gb": 0}), StatusCode::BAD_REQUEST),
        (
            json!({"name": "x", "size_gb": 501}),
            StatusCode::BAD_REQUEST,
        ),
        (json!({"name": "x", "size_gb": -1}), StatusCode::BAD_REQUEST),
        (
            json!({"name": "Bad-Name", "size_gb": 1}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"name": "../etc", "size_gb": 1}),
            StatusCode::BAD_REQUEST,
        ),
        (json!({"name": "", "size_gb": 1}), StatusCode::BAD_REQUEST),
        (
            json!({"name": "ok", "region": "nowhere"}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"name": "ok", "fstype": "xfs"}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"name": "ok", "compute": {"cpus": 3, "memory_mb": 256}}),
            StatusCode::BAD_REQUEST,
        ),
        (json!([1, 2]), StatusCode::BAD_REQUEST),
        (
            json!({"name": "ok", "encrypted": true}),
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let (s, v) = fly.post("/apps/db/volumes", body.clone()).await;
        assert_eq!(s, want, "{body}: {v}");
        assert!(v["error"].as_str().is_some(), "{body}: Fly error shape {v}");
    }
    let (s, v) = fly
        .post("/apps/nope/volumes", json!({"name": "x", "size_gb": 1}))
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    for path in [
        "/apps/db/volumes/vol_doesnotexist0000",
        "/apps/db/volumes/1857156b526dd8",
        "/apps/nope/volumes",
    ] {
        let (s, v) = fly.get(path).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{path}: {v}");
    }
    fly.create_app("other").await;
    let (s, _) = fly.get(&format!("/apps/other/volumes/{id}")).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "a volume belongs to its app");
    assert_eq!(
        list_volumes(&fly, "db", 1).await.len(),
        1,
        "nothing created"
    );
    for agent in &agents {
        let dirs = std::fs::read_dir(agent.data_dir.join("volumes"))
            .map(|d| d.count())
            .unwrap_or(0);
        assert_eq!(dirs, usize::from(agent.data_dir == owner.data_dir));
    }

    // Delete: the storage is gone.
    let (s, d) = fly.delete(&format!("/apps/db/volumes/{id}")).await;
    assert_eq!(s, StatusCode::OK, "{d}");
    assert_eq!(d["state"], "destroyed");
    assert!(!storage.exists(), "{} removed", storage.display());
    assert!(mounts_under(&owner.data_dir.join("volumes")).is_empty());
    let (s, _) = fly.get(&format!("/apps/db/volumes/{id}")).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    list_volumes(&fly, "db", 0).await;
    let (s, _) = fly.delete(&format!("/apps/db/volumes/{id}")).await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    // Deleting an app deletes its volumes, once their machines are gone.
    let (s, v) = fly
        .post(
            "/apps/other/volumes",
            json!({"name": "scratch", "size_gb": 1}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let vid = v["id"].as_str().unwrap().to_string();
    let storage = agent_of(&agents, v["zone"].as_str().unwrap())
        .data_dir
        .join("volumes")
        .join(&vid);
    let sleeper = ["sh", "-c", "while true; do sleep 0.2; done"];
    let (s, m) = fly
        .post(
            "/apps/other/machines",
            json!({"config": process_config(&sleeper, 256, Some((&vid, "/data")))}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let (s, v) = fly.delete("/apps/other").await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    bazaar_testkit::eventually(Duration::from_secs(30), || async {
        (!storage.exists()).then_some(())
    })
    .await
    .expect("the deleted app's volume is deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unique_zones_and_machines_pinned_to_their_volume() {
    // Host 0 has much more disk (volumes go there first) and far less memory than the
    // others: a machine placed freely would never land on it.
    let agents = start_cluster(Path::new(EXE), 3, |i, o| {
        let disk = if i == 0 { "100" } else { "10" };
        o.extra_args
            .extend(["--disk-gb".to_string(), disk.to_string()]);
        o.memory_mb = if i == 0 { 1024 } else { 65536 };
    })
    .unwrap();
    let _unmount = UnmountOnDrop::new(&agents);
    let host0 = host_of(&agents[0]);
    let fly = Fly::new(&agents[2]);
    fly.create_app("shards").await;
    bazaar_testkit::eventually(Duration::from_secs(10), || async {
        let (_, v) = fly.get("/platform/regions").await;
        Some(()).filter(|_| v["regions"].as_array().is_some_and(|r| !r.is_empty()))
    })
    .await
    .unwrap();
    // Every host is in the catalog of the node asked, with its disk.
    bazaar_testkit::eventually(Duration::from_secs(10), || async {
        let v: Value = reqwest::Client::new()
            .get(format!("{}/v1/catalog/hosts", agents[2].url()))
            .bearer_auth(TEST_SECRET)
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        (v.as_array()?.len() == 3).then_some(())
    })
    .await
    .unwrap();

    // require_unique_zone (the default): three same-name volumes on three hosts.
    let mut zones = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (s, v) = fly
            .post(
                "/apps/shards/volumes",
                json!({"name": "data", "size_gb": 1}),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{v}");
        zones.push(v["zone"].as_str().unwrap().to_string());
        ids.push(v["id"].as_str().unwrap().to_string());
        // The next exchange knows of it (as any later client would).
        list_volumes(&fly, "shards", ids.len()).await;
    }
    assert_eq!(zones[0], host0, "the host with the most disk left wins");
    let mut distinct = zones.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "one per host: {zones:?}");
    let (s, v) = fly
        .post(
            "/apps/shards/volumes",
            json!({"name": "data", "size_gb": 1}),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["status"], "insufficient_capacity");
    assert!(
        v["error"].as_str().unwrap().contains("require_unique_zone"),
        "{v}"
    );
    // Without it, a fourth is fine.
    let (s, v) = fly
        .post(
            "/apps/shards/volumes",
            json!({"name": "data", "size_gb": 1, "require_unique_zone": false}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    // The compute hint: only hosts that can also run the machine.
    let (s, v) = fly
        .post(
            "/apps/shards/volumes",
            json!({"name": "big", "size_gb": 1, "compute": {"cpu_kind": "shared", "cpus": 2, "memory_mb": 2048}}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_ne!(v["zone"], host0.as_str(), "host 0 has 1 GB of memory");
    // Too big for any host's disk.
    let (s, v) = fly
        .post(
            "/apps/shards/volumes",
            json!({"name": "huge", "size_gb": 400}),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["status"], "insufficient_capacity");

    // A machine mounting the volume on host 0 lands there, though the others have 64× the
    // memory free.
    let vol0 = ids[0].clone();
    let sleeper = ["sh", "-c", "while true; do sleep 0.2; done"];
    let (s, m) = fly
        .post(
            "/apps/shards/machines",
            json!({"config": process_config(&sleeper, 256, Some((&vol0, "/data")))}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let m1 = m["id"].as_str().unwrap().to_string();
    assert_eq!(m["host_id"], host0.as_str(), "pinned to the volume's host");
    // Only the volume's host was asked; the others were left out by the constraint.
    let (s, p) = fly
        .get(&format!("/apps/shards/machines/{m1}/placement"))
        .await;
    assert_eq!(s, StatusCode::OK, "{p}");
    let asked: Vec<&str> = p["rounds"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["asked"].as_array().unwrap())
        .map(|a| a["host_id"].as_str().unwrap())
        .collect();
    assert_eq!(asked, vec![host0.as_str()], "{p}");
    let excluded = p["excluded"].as_array().unwrap();
    assert_eq!(excluded.len(), 2, "{p}");
    assert!(excluded
        .iter()
        .all(|e| e["reason"].as_str().unwrap().contains("pinned")));
    let (_, v) = fly.get(&format!("/apps/shards/volumes/{vol0}")).await;
    assert_eq!(v["attached_machine_id"], m1.as_str());
    bazaar_testkit::eventually(Duration::from_secs(10), || async {
        let list = list_volumes(&fly, "shards", 5).await;
        list.iter()
            .any(|v| v["id"] == vol0.as_str() && v["attached_machine_id"] == m1.as_str())
            .then_some(())
    })
    .await
    .unwrap();

    // A second machine cannot mount it: 412.
    let (s, v) = fly
        .post(
            "/apps/shards/machines",
            json!({"config": process_config(&sleeper, 256, Some((&vol0, "/data")))}),
        )
        .await;
    assert_eq!(s, StatusCode::PRECONDITION_FAILED, "{v}");
    assert!(v["error"].as_str().unwrap().contains(&m1), "{v}");
    // Mounts are fixed for the machine's life.
    let (s, v) = fly
        .post(
            &format!("/apps/shards/machines/{m1}"),
            json!({"config": process_config(&sleeper, 256, Some((&ids[1], "/data")))}),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    // Mount errors: unknown volume, two mounts, a relative path.
    for (mounts, want) in [
        (
            json!([{"volume": "vol_doesnotexist0000", "path": "/data"}]),
            StatusCode::NOT_FOUND,
        ),
        (
            json!([{"volume": ids[1], "path": "/a"}, {"volume": ids[2], "path": "/b"}]),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!([{"volume": ids[1], "path": "data"}]),
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let mut config = process_config(&sleeper, 256, None);
        config["mounts"] = mounts.clone();
        let (s, v) = fly
            .post("/apps/shards/machines", json!({"config": config}))
            .await;
        assert_eq!(s, want, "{mounts}: {v}");
    }
    // The volume's host has no room for the machine: insufficient capacity, naming it.
    let (s, v) = fly
        .post(
            "/apps/shards/volumes",
            json!({"name": "solo", "size_gb": 1}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["zone"], host0.as_str());
    let solo = v["id"].as_str().unwrap().to_string();
    list_volumes(&fly, "shards", 6).await;
    let (s, v) = fly
        .post(
            "/apps/shards/machines",
            json!({"config": process_config(&sleeper, 2048, Some((&solo, "/data")))}),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["status"], "insufficient_capacity");
    assert!(v["error"].as_str().unwrap().contains(&solo), "{v}");

    // An attached volume cannot be deleted; once its machine is destroyed it can.
    let (s, v) = fly.delete(&format!("/apps/shards/volumes/{vol0}")).await;
    assert_eq!(s, StatusCode::PRECONDITION_FAILED, "{v}");
    assert!(v["error"].as_str().unwrap().contains("attached"), "{v}");
    let (s, v) = fly
        .delete(&format!("/apps/shards/machines/{m1}?force=true"))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    fly.wait_state("shards", &m1, "destroyed").await;
    let (_, v) = fly.get(&format!("/apps/shards/volumes/{vol0}")).await;
    assert_eq!(v["attached_machine_id"], Value::Null, "{v}");
    let (s, v) = fly.delete(&format!("/apps/shards/volumes/{vol0}")).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert!(!agents[0].data_dir.join("volumes").join(&vol0).exists());

    // Two machines racing for one volume, through two nodes: one gets it, the other 412.
    let other = Fly::new(&agents[1]);
    let body = json!({"config": process_config(&sleeper, 256, Some((&ids[1], "/data")))});
    let (a, b) = tokio::join!(
        fly.post("/apps/shards/machines", body.clone()),
        other.post("/apps/shards/machines", body.clone())
    );
    let mut codes = [a.0, b.0];
    codes.sort();
    assert_eq!(
        codes,
        [StatusCode::OK, StatusCode::PRECONDITION_FAILED],
        "{} / {}",
        a.1,
        b.1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volume_data_survives_stop_start_restart_and_agent_kill() {
    let mut agents = start_cluster(Path::new(EXE), 3, |_, _| {}).unwrap();
    let _unmount = UnmountOnDrop::new(&agents);
    let fly = Fly::new(&agents[0]);
    fly.create_app("keeper").await;
    let (s, v) = fly
        .post(
            "/apps/keeper/volumes",
            json!({"name": "state", "size_gb": 1}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let vol = v["id"].as_str().unwrap().to_string();
    let zone = v["zone"].as_str().unwrap().to_string();
    let owner_ix = agents.iter().position(|a| host_of(a) == zone).unwrap();

    // Each boot appends a line to a file in the volume, through the machine's env.
    let boot = [
        "sh",
        "-c",
        "echo boot >> \"$BAZAAR_VOLUME_PATH/boots\" && while true; do sleep 0.2; done",
    ];
    let (s, m) = fly
        .post(
            "/apps/keeper/machines",
            json!({"config": process_config(&boot, 256, Some((&vol, "/data")))}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let id = m["id"].as_str().unwrap().to_string();
    assert_eq!(m["host_id"], zone.as_str());
    fly.wait_state("keeper", &id, "started").await;

    // Reads the file back through the machine.
    let boots = |expected: usize| {
        let fly = &fly;
        let id = id.clone();
        async move {
            let got = bazaar_testkit::eventually(Duration::from_secs(20), || async {
                let (s, v) = fly
                    .post(
                        &format!("/apps/keeper/machines/{id}/exec"),
                        json!({"command": ["sh", "-c", "cat \"$BAZAAR_VOLUME_PATH/boots\""]}),
                    )
                    .await;
                if s != StatusCode::OK {
                    return None;
                }
                let n = v["stdout"]
                    .as_str()?
                    .lines()
                    .filter(|l| *l == "boot")
                    .count();
                (n == expected).then_some(n)
            })
            .await;
            assert!(got.is_ok(), "the volume never held {expected} boot line(s)");
        }
    };
    boots(1).await;

    let (s, v) = fly
        .post(&format!("/apps/keeper/machines/{id}/stop"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    fly.wait_state("keeper", &id, "stopped").await;
    let (s, v) = fly
        .post(&format!("/apps/keeper/machines/{id}/start"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    fly.wait_state("keeper", &id, "started").await;
    boots(2).await;

    let (s, v) = fly
        .post(&format!("/apps/keeper/machines/{id}/restart"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    fly.wait_state("keeper", &id, "started").await;
    boots(3).await;

    // kill -9 of the volume's agent: the volume, its attachment and its data are all there
    // when it comes back, and a new boot still writes to it.
    agents[owner_ix].kill9();
    agents[owner_ix].spawn(&[]).unwrap();
    let (s, v) = bazaar_testkit::eventually(Duration::from_secs(20), || async {
        let r = fly.get(&format!("/apps/keeper/volumes/{vol}")).await;
        (r.0 == StatusCode::OK && r.1["host_status"] == "ok").then_some(r)
    })
    .await
    .unwrap();
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["state"], "created");
    assert_eq!(v["attached_machine_id"], id.as_str());
    boots(3).await;
    let (s, v) = fly
        .post(&format!("/apps/keeper/machines/{id}/restart"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    fly.wait_state("keeper", &id, "started").await;
    boots(4).await;

    // A create cut short by a kill -9 (record written, storage not yet made) is finished
    // when the agent comes back.
    let owner = &mut agents[owner_ix];
    owner.kill9();
    owner
        .spawn(&[("BAZAAR_CRASH_AT", "volume_create:0")])
        .unwrap();
    let req = bazaar_types::volume::HostVolumeCreate {
        id: bazaar_types::volume::new_volume_id(),
        app: "keeper".into(),
        name: "half".into(),
        size_gb: 1,
        encrypted: false,
        require_unique_zone: true,
        compute: None,
        snapshot_retention: 5,
        auto_backup_enabled: false,
        source: None,
    };
    assert!(
        owner.client().create_volume(&req).await.is_err(),
        "the agent died mid-create"
    );
    owner.wait_exit(Duration::from_secs(10)).unwrap();
    owner.kill9();
    owner.spawn(&[]).unwrap();
    let v = owner.client().volume(&req.id).await.unwrap();
    assert_eq!(v.state, "created");
    assert!(owner
        .data_dir
        .join("volumes")
        .join(&req.id)
        .join("mnt")
        .is_dir());
    let v = owner.client().create_volume(&req).await.unwrap();
    assert_eq!(v.state, "created", "a retried create is idempotent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_cli_commands() {
    let agents = start_cluster(Path::new(EXE), 1, |_, _| {}).unwrap();
    let _unmount = UnmountOnDrop::new(&agents);
    Fly::new(&agents[0]).create_app("clivol").await;
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(EXE)
            .arg("volumes")
            .args(args)
            .args(["--app", "clivol", "--json"])
            .env("BAZAAR_API_URL", agents[0].url())
            .env("BAZAAR_TOKEN", bazaar_testkit::api_token())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        (
            out.status.success(),
            serde_json::from_str::<Value>(&text).ok(),
            err,
        )
    };
    let (ok, v, err) = cli(&["create", "data", "--size", "1"]);
    assert!(ok, "{err}");
    let v = v.unwrap();
    let id = v["id"].as_str().unwrap().to_string();
    assert_eq!(v["size_gb"], 1);
    let (ok, v, err) = cli(&["list"]);
    assert!(ok, "{err}");
    assert_eq!(v.unwrap()[0]["id"], id.as_str());
    let (ok, v, err) = cli(&["extend", &id, "--size", "2"]);
    assert!(ok, "{err}");
    assert_eq!(v.unwrap()["volume"]["size_gb"], 2);
    let (ok, v, err) = cli(&["show", &id]);
    assert!(ok, "{err}");
    assert_eq!(v.unwrap()["size_gb"], 2);
    let (ok, _, err) = cli(&["create", "Bad-Name"]);
    assert!(!ok);
    assert!(err.contains("volume name"), "{err}");
    // Snapshots, restores and forks (ext4 as root; a plain directory cannot be copied).
    if expected_fstype() == "ext4" {
        let (ok, snap, err) = cli(&["snapshots", "create", &id]);
        assert!(ok, "{err}");
        let snap_id = snap.unwrap()["id"].as_str().unwrap().to_string();
        let (ok, list, err) = cli(&["snapshots", "list", &id]);
        assert!(ok, "{err}");
        assert_eq!(list.unwrap()[0]["id"], snap_id.as_str());
        let (ok, v, err) = cli(&["create", "restored", "--snapshot-id", &snap_id]);
        assert!(ok, "{err}");
        let v = v.unwrap();
        assert_eq!(v["size_gb"], 2, "the snapshot's volume's size: {v}");
        let (ok, _, err) = cli(&["destroy", v["id"].as_str().unwrap()]);
        assert!(ok, "{err}");
        let (ok, v, err) = cli(&["fork", &id]);
        assert!(ok, "{err}");
        let v = v.unwrap();
        assert_eq!((&v["name"], &v["size_gb"]), (&json!("data"), &json!(2)));
        let (ok, _, err) = cli(&["destroy", v["id"].as_str().unwrap()]);
        assert!(ok, "{err}");
    }
    let (ok, v, err) = cli(&["destroy", &id]);
    assert!(ok, "{err}");
    assert_eq!(v.unwrap()["state"], "destroyed");
    let (ok, _, err) = cli(&["show", &id]);
    assert!(!ok && err.contains("not found"), "{err}");
}
