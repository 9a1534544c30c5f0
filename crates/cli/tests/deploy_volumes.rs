//! fly.toml `[[mounts]]` through `bazaar deploy` (issue 38, item 1): the deploy creates a
//! volume for the machine and mounts it, a file written there is on the volume's storage
//! and survives a restart of the machine and a new release, and a file with a key bazaar
//! cannot honour, or one that would move a machine's volume, stops the deploy with an
//! error naming it and changes nothing.

use crate::deploy_support;

use deploy_support::*;
use reqwest::StatusCode;
use serde_json::json;
use std::time::Duration;

const MOUNTS: &str = r#"
[[mounts]]
  source = "data"
  destination = "/data"
  initial_size = "1gb"
  snapshot_retention = 7
"#;

/// Runs `script` with `sh -c` in the machine: its stdout.
async fn sh(env: &Env, app: &str, id: &str, script: &str) -> String {
    let (s, v) = env
        .fly
        .post(
            &format!("/apps/{app}/machines/{id}/exec"),
            json!({"command": ["sh", "-c", script], "timeout": 30}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{script}: {v}");
    assert_eq!(v["exit_code"], 0, "{script}: {v}");
    v["stdout"].as_str().unwrap_or_default().to_string()
}

/// (id, instance_id) of the app's machines, sorted.
async fn machine_versions(env: &Env, app: &str) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = env
        .machines(app)
        .await
        .iter()
        .map(|m| {
            (
                m["id"].as_str().unwrap().to_string(),
                m["instance_id"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mounts_put_the_data_on_a_volume_and_keys_bazaar_cannot_honour_stop_the_deploy() {
    let env = Env::start();
    let app = "keeper";

    // A first deploy creates the volume, then the machine on its host, mounting it.
    let v1 = env.write_config(app, 1, true, MOUNTS);
    let (ok, out, err) = env.cli_json(&["deploy", "-c", v1.to_str().unwrap()]);
    assert!(ok, "{out}\n{err}");
    let created = out["report"]["volumes_created"].as_array().unwrap().clone();
    assert_eq!(created.len(), 1, "{out}");
    let vol_id = created[0].as_str().unwrap().to_string();
    let ms = env.machines(app).await;
    assert_eq!(ms.len(), 1, "{ms:#?}");
    let id = ms[0]["id"].as_str().unwrap().to_string();
    let mount = &ms[0]["config"]["mounts"][0];
    assert_eq!(mount["volume"], vol_id.as_str(), "{mount}");
    assert_eq!(mount["path"], "/data", "{mount}");
    let (_, vol) = env.fly.get(&format!("/apps/{app}/volumes/{vol_id}")).await;
    assert_eq!(vol["name"], "data", "{vol}");
    assert_eq!(vol["size_gb"], 1, "{vol}");
    assert_eq!(vol["snapshot_retention"], 7, "{vol}");
    assert_eq!(vol["attached_machine_id"], id.as_str(), "{vol}");
    assert_eq!(vol["region"], "ams", "{vol}");

    // What the machine writes at /data is on the volume's storage on its host.
    sh(&env, app, &id, "echo kept > /data/marker").await;
    let on_volume = env
        .agents
        .iter()
        .map(|a| a.data_dir.join("volumes").join(&vol_id).join("mnt/marker"))
        .find(|p| p.exists())
        .expect("the file is on the volume's storage");
    assert_eq!(std::fs::read_to_string(&on_volume).unwrap(), "kept\n");

    // A restart of the machine keeps it.
    let (s, v) = env
        .fly
        .post(&format!("/apps/{app}/machines/{id}/restart"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    env.fly.wait_state(app, &id, "started").await;
    let read = bazaar_testkit::eventually(Duration::from_secs(20), || async {
        let (s, v) = env
            .fly
            .post(
                &format!("/apps/{app}/machines/{id}/exec"),
                json!({"command": ["cat", "/data/marker"]}),
            )
            .await;
        (s == StatusCode::OK && v["exit_code"] == 0).then(|| v["stdout"].clone())
    })
    .await
    .expect("the file is read back after the restart");
    assert_eq!(read, "kept\n");

    // A new release updates the machine in place: same volume, same data, no new volume.
    let v2 = env.write_config(app, 2, true, MOUNTS);
    let (ok, out, err) = env.cli_json(&["deploy", "-c", v2.to_str().unwrap()]);
    assert!(ok, "{out}\n{err}");
    assert_eq!(out["report"]["updated"], json!([id.as_str()]), "{out}");
    assert!(out["report"].get("volumes_created").is_none(), "{out}");
    let ms = env.machines(app).await;
    assert_eq!(ms[0]["config"]["mounts"][0]["volume"], vol_id.as_str());
    assert_eq!(ms[0]["config"]["env"]["VERSION"], "2");
    assert_eq!(sh(&env, app, &id, "cat /data/marker").await, "kept\n");
    let before = machine_versions(&env, app).await;

    // Keys bazaar cannot honour stop the deploy, named, before anything changes.
    let refused = [
        ("swap_size_mb = 512\n", "`swap_size_mb`"),
        (
            "[[statics]]\n  guest_path = \"/app/public\"\n  url_prefix = \"/static\"\n",
            "`statics`",
        ),
    ];
    for (extra, key) in refused {
        // Top-level keys go before the first table.
        let path = env.write_config(app, 3, true, MOUNTS);
        let text = std::fs::read_to_string(&path).unwrap();
        let text = if extra.starts_with('[') {
            format!("{text}\n{extra}")
        } else {
            format!("{extra}{text}")
        };
        std::fs::write(&path, text).unwrap();
        let (ok, _, err) = env.cli(&["deploy", "-c", path.to_str().unwrap()]);
        assert!(!ok, "{key}: {err}");
        assert!(err.contains(key), "{key}: {err}");
        let (ok, _, err) = env.cli(&["deploy", "-c", path.to_str().unwrap(), "--dry-run"]);
        assert!(!ok && err.contains(key), "{key}: {err}");
    }
    let auto_extend = format!("{MOUNTS}  auto_extend_size_threshold = 80\n");
    let path = env.write_config(app, 3, true, &auto_extend);
    let (ok, _, err) = env.cli(&["deploy", "-c", path.to_str().unwrap()]);
    assert!(!ok, "{err}");
    assert!(err.contains("`mounts.auto_extend_size_threshold`"), "{err}");

    // Moving the machine's volume elsewhere, or dropping [mounts], is refused too.
    let moved = MOUNTS.replace("\"/data\"", "\"/srv/data\"");
    let path = env.write_config(app, 3, true, &moved);
    let (ok, _, err) = env.cli(&["deploy", "-c", path.to_str().unwrap()]);
    assert!(!ok, "{err}");
    assert!(err.contains(&id) && err.contains("/srv/data"), "{err}");
    let path = env.write_config(app, 3, true, "");
    let (ok, _, err) = env.cli(&["deploy", "-c", path.to_str().unwrap()]);
    assert!(!ok, "{err}");
    assert!(err.contains(&vol_id), "{err}");
    let path = env.write_config(app, 3, true, MOUNTS);
    let (ok, _, err) = env.cli(&[
        "deploy",
        "-c",
        path.to_str().unwrap(),
        "--strategy",
        "bluegreen",
    ]);
    assert!(!ok && err.contains("bluegreen"), "{err}");

    assert_eq!(machine_versions(&env, app).await, before, "nothing changed");
    let (_, vols) = env.fly.get(&format!("/apps/{app}/volumes")).await;
    assert_eq!(vols.as_array().map(Vec::len), Some(1), "{vols}");
    assert_eq!(sh(&env, app, &id, "cat /data/marker").await, "kept\n");

    // Scaling up gives each new machine a volume of its own: spread over the two ams
    // hosts, then, with no host left without one, beside another.
    let (ok, out, err) = env.cli_json(&["scale", "count", "3", "-a", app]);
    assert!(ok, "{out}\n{err}");
    let ms = env.machines(app).await;
    let vols: std::collections::BTreeSet<&str> = ms
        .iter()
        .map(|m| m["config"]["mounts"][0]["volume"].as_str().unwrap())
        .collect();
    assert_eq!(vols.len(), 3, "{out}\n{ms:#?}");
    let hosts: std::collections::BTreeSet<&str> =
        ms.iter().map(|m| m["host_id"].as_str().unwrap()).collect();
    assert_eq!(hosts.len(), 2, "both ams hosts: {ms:#?}");
}

/// The app's machines, destroyed ones too, of the release command's group.
async fn release_machines(env: &Env, app: &str) -> Vec<serde_json::Value> {
    let (_, all) = env
        .fly
        .get(&format!("/apps/{app}/machines?include_deleted=true"))
        .await;
    all.as_array()
        .unwrap()
        .iter()
        .filter(|m| m["config"]["metadata"]["fly_process_group"] == "fly_app_release_command")
        .cloned()
        .collect()
}

/// The release command's machines once there are `n`, all destroyed (the list is read
/// from agent 0's catalog, which hears of the destroy by gossip).
async fn destroyed_release_machines(env: &Env, app: &str, n: usize) -> Vec<serde_json::Value> {
    let got = bazaar_testkit::eventually(Duration::from_secs(10), || async {
        let ran = release_machines(env, app).await;
        (ran.len() == n && ran.iter().all(|m| m["state"] == "destroyed")).then_some(ran)
    })
    .await;
    match got {
        Ok(ran) => ran,
        Err(_) => panic!(
            "not {n} destroyed release command machine(s): {:#?}",
            release_machines(env, app).await
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_command_runs_once_per_release_and_a_failing_one_stops_the_deploy() {
    let env = Env::start();
    let app = "migrator";

    // It fails: the deploy stops before any machine exists, saying how and with its output.
    let failing = "  release_command = \"sh -c 'echo migrating; exit 3'\"\n";
    let path = env.write_config(app, 1, true, failing);
    let (ok, _, err) = env.cli(&["deploy", "-c", path.to_str().unwrap()]);
    assert!(!ok, "{err}");
    assert!(
        err.contains("release_command") && err.contains("exited with code 3"),
        "{err}"
    );
    assert!(err.contains("migrating"), "its output: {err}");
    let ran = destroyed_release_machines(&env, app, 1).await;
    assert!(env.machines(app).await.is_empty(), "{ran:#?}");

    // It succeeds: the release goes out, and the temporary machine is gone.
    let passing = "  release_command = \"sh -c 'echo migrated'\"\n";
    let path = env.write_config(app, 1, true, passing);
    let (ok, out, err) = env.cli_json(&["deploy", "-c", path.to_str().unwrap()]);
    assert!(ok, "{out}\n{err}");
    let ms = env.machines(app).await;
    assert_eq!(ms.len(), 1, "{ms:#?}");
    assert_eq!(ms[0]["config"]["metadata"]["fly_process_group"], "app");
    // Once per release: one more, destroyed too.
    destroyed_release_machines(&env, app, 2).await;
    // Not a release of its own: the history has the one release.
    let (ok, out, err) = env.cli_json(&["releases", "-a", app]);
    assert!(ok, "{out}\n{err}");
    assert_eq!(out.as_array().map(Vec::len), Some(1), "{out}");
}
