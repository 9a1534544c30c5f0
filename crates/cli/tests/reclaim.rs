//! Oversubscription with reclamation (issue 34 item 3, docs/POLICY.md "Reclamation") on a
//! real host, with real cgroups (root): a service that idles sees its reservation decay as
//! its cgroup's CPU time and memory say, a `batch` machine is placed through the market on
//! the room reclaimed from it (the host is full by requests), and when the service takes
//! memory and CPU its reservation comes back and the batch machine is stopped with a
//! `reclaimed` event naming it. Short rule parameters through the config file (`[reclaim]`).

use crate::common;

use bazaar_testkit::{start_cluster, Fly};
use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::time::Duration;

fn machine(priority: &str, cmd: &str, cpus: u32, memory_mb: u64) -> Value {
    let mut config = process_config(&["/bin/sh", "-c", cmd]);
    config["priority"] = json!(priority);
    config["guest"] = json!({"cpu_kind": "shared", "cpus": cpus, "memory_mb": memory_mb});
    json!({"config": config, "region": "local"})
}

/// The host's ledger (`GET /host/v1/ledger`, cluster secret).
async fn ledger(fly: &Fly) -> Value {
    let url = format!("{}/host/v1/ledger", fly.base.trim_end_matches("/v1"));
    reqwest::Client::new()
        .get(url)
        .bearer_auth(bazaar_testkit::TEST_SECRET)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn machine_state(fly: &Fly, id: &str) -> Value {
    let (s, m) = fly.get(&format!("/apps/rec/machines/{id}")).await;
    assert_eq!(s, StatusCode::OK, "{m}");
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_machine_runs_on_an_idle_services_reclaimed_room_until_the_service_burns() {
    if !is_root() || !bazaar_shim::cgroups_available() {
        eprintln!("skipped: needs root and cgroups");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        "[reclaim]\nenabled = true\ninterval = 300\nmargin_pct = 20\ndecay_pct = 50\ngrace_observations = 2\n",
    )
    .unwrap();
    // A host of 2 CPUs and 1024 MB.
    let agents = start_cluster(std::path::Path::new(EXE), 1, |_, o| {
        o.cpus = 2;
        o.memory_mb = 1024;
        o.extra_args
            .extend(["--config".to_string(), config.display().to_string()]);
    })
    .unwrap();
    let fly = Fly::new(&agents[0]);
    wait_for_hosts(&fly, 1).await;
    let (s, v) = fly.post("/apps", json!({"app_name": "rec"})).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");

    // The service takes the whole host by requests; it idles until `burn` appears in its
    // work directory, then holds 450 MB (`tail` keeps the last 450 MB of a stream that has
    // not ended).
    let burn = "while [ ! -e burn ]; do sleep 0.1; done; \
                (head -c 450000000 /dev/zero; sleep 1000) | tail -c 450000000";
    let (s, m) = fly
        .post("/apps/rec/machines", machine("default", burn, 2, 1024))
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let service = m["id"].as_str().unwrap().to_string();
    wait_started(&fly, "rec", &service).await;
    // Full by requests: another service is refused.
    let (s, v) = fly
        .post(
            "/apps/rec/machines",
            machine("default", "sleep 1000", 1, 256),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");

    // Once the service's reservation has decayed, a batch machine is placed on the room.
    let batch = bazaar_testkit::eventually(Duration::from_secs(30), || async {
        let (s, m) = fly
            .post("/apps/rec/machines", machine("batch", "sleep 1000", 1, 512))
            .await;
        (s == StatusCode::OK).then(|| m["id"].as_str().unwrap().to_string())
    })
    .await
    .expect("a batch machine placed on reclaimed room");
    wait_started(&fly, "rec", &batch).await;
    assert_eq!(machine_state(&fly, &service).await["state"], "started");
    let l = ledger(&fly).await;
    assert_eq!(l["batch"], json!([batch]), "{l}");
    let pool = &l["reclaim"]["batch_held"];
    assert!(
        pool["millicpus"].as_u64().unwrap() <= 2000 && pool["memory_mb"].as_u64().unwrap() <= 1024,
        "{l}"
    );

    // The service takes 450 MB: its memory reservation rises at once to 540 MB (+ 20 %),
    // which leaves the 512 MB batch machine no room: it stops.
    std::fs::write(work_file(&agents[0], &service, "burn"), "").unwrap();
    let (s, v) = fly
        .get(&format!(
            "/apps/rec/machines/{batch}/wait?state=stopped&timeout=30"
        ))
        .await;
    if s != StatusCode::OK {
        let log = std::fs::read_to_string(agents[0].data_dir.join("agent.log")).unwrap();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        let out = std::fs::read_to_string(
            agents[0]
                .data_dir
                .join("machines")
                .join(&service)
                .join("output.log"),
        )
        .unwrap_or_default();
        panic!(
            "{v}\nledger: {}\nlog: {}\nservice output: {out}\nservice: {}",
            ledger(&fly).await,
            tail.join("\n"),
            machine_state(&fly, &service).await
        );
    }
    let b = machine_state(&fly, &batch).await;
    let event = b["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "reclaimed")
        .unwrap_or_else(|| panic!("a reclaimed event: {b}"));
    assert_eq!(
        event["status"],
        format!("stopped for machine {service}'s reservation (reclamation)")
    );
    assert_eq!(machine_state(&fly, &service).await["state"], "started");
    // While the service holds its memory, the batch machine cannot start again.
    let (s, v) = fly
        .post(&format!("/apps/rec/machines/{batch}/start"), json!({}))
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    for id in [&service, &batch] {
        let (s, v) = fly
            .delete(&format!("/apps/rec/machines/{id}?force=true"))
            .await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }
    drop(agents);
}

/// The CPU limit the kernel holds for machine `id`'s cgroup, in cores (v2 `cpu.max`, v1
/// `cpu.cfs_quota_us` over a 100 ms period), found under any host's `bazaar/` directory.
fn cpu_limit(id: &str) -> Option<f64> {
    for (root, file) in [
        ("/sys/fs/cgroup/bazaar", "cpu.max"),
        ("/sys/fs/cgroup/cpu/bazaar", "cpu.cfs_quota_us"),
    ] {
        for host in std::fs::read_dir(root).into_iter().flatten().flatten() {
            let Ok(text) = std::fs::read_to_string(host.path().join(id).join(file)) else {
                continue;
            };
            let quota: f64 = text.split_whitespace().next()?.parse().ok()?;
            return Some(quota / 100_000.0);
        }
    }
    None
}

/// Shared CPUs' burst model on a real cgroup (`[burst]`): a shared machine that keeps a core
/// busy spends its small balance and the kernel then holds it to its baseline (6.25 % of a
/// core).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_shared_machine_is_held_to_its_baseline_once_its_balance_is_spent() {
    if !is_root() || !bazaar_shim::cgroups_available() {
        eprintln!("skipped: needs root and cgroups");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        "[reclaim]\ninterval = 300\n[burst]\nenabled = true\nmax_balance_ms = 300\n",
    )
    .unwrap();
    let agents = start_cluster(std::path::Path::new(EXE), 1, |_, o| {
        o.extra_args
            .extend(["--config".to_string(), config.display().to_string()]);
    })
    .unwrap();
    let fly = Fly::new(&agents[0]);
    wait_for_hosts(&fly, 1).await;
    let (s, v) = fly.post("/apps", json!({"app_name": "rec"})).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, m) = fly
        .post(
            "/apps/rec/machines",
            machine("default", "while :; do :; done", 1, 256),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let id = m["id"].as_str().unwrap().to_string();
    wait_started(&fly, "rec", &id).await;
    let throttled = bazaar_testkit::eventually(Duration::from_secs(30), || async {
        cpu_limit(&id).filter(|cores| (cores - 0.0625).abs() < 1e-9)
    })
    .await;
    assert!(
        throttled.is_ok(),
        "never held to its baseline: the limit is {:?} cores",
        cpu_limit(&id)
    );
    let (s, v) = fly
        .delete(&format!("/apps/rec/machines/{id}?force=true"))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    drop(agents);
}
