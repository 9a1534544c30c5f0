//! Three real agents gossiping: a machine created on one appears on the others with its
//! state changes and its tombstone; a killed host is declared dead (its machines
//! unreachable) and comes back alive after a restart; a host that stops cleanly leaves at
//! once.

use crate::common;

use bazaar_testkit::{create_request, start_cluster, TestAgent, TEST_SECRET};
use bazaar_types::host::StopRequest;
use bazaar_types::state::MachineState;
use common::*;
use std::time::{Duration, Instant};

async fn catalog(agent: &TestAgent, path: &str) -> serde_json::Value {
    reqwest::Client::new()
        .get(format!("{}/v1/catalog/{path}", agent.url()))
        .bearer_auth(TEST_SECRET)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Runs the CLI against `agent` with the cluster secret; its stdout.
fn cli(agent: &TestAgent, args: &[&str]) -> String {
    let out = std::process::Command::new(EXE)
        .args(args)
        .env("BAZAAR_API_URL", agent.url())
        .env("BAZAAR_CLUSTER_SECRET", TEST_SECRET)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "bazaar {args:?}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

async fn machine_on(agent: &TestAgent, id: &str) -> Option<serde_json::Value> {
    let all = catalog(agent, "machines?include_deleted=true").await;
    all.as_array()?.iter().find(|m| m["id"] == id).cloned()
}

async fn host_status(agent: &TestAgent, host_id: &str) -> Option<String> {
    let hosts = catalog(agent, "hosts").await;
    hosts
        .as_array()?
        .iter()
        .find(|h| h["id"] == host_id)
        .and_then(|h| h["status"].as_str().map(str::to_string))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machines_and_host_liveness_spread_to_every_node() {
    let mut agents = start_cluster(std::path::Path::new(EXE), 3, |_, _| {}).unwrap();
    let ids: Vec<String> = {
        let mut v = Vec::new();
        for a in &agents {
            v.push(a.client().info().await.unwrap().id);
        }
        v
    };
    // Everyone knows everyone.
    for a in &agents {
        bazaar_testkit::eventually(Duration::from_secs(10), || async {
            let hosts = catalog(a, "hosts").await;
            let alive = hosts
                .as_array()?
                .iter()
                .filter(|h| h["status"] == "alive")
                .count();
            (alive == 3).then_some(())
        })
        .await
        .expect("all three hosts alive in every catalog");
    }

    // A machine created on A shows up on B and C, with its state changes.
    let a = agents[0].client();
    let m = a
        .create(&create_request("gossip", &["sleep", "1000"]))
        .await
        .unwrap();
    wait_state(&a, &m.id, MachineState::Started).await;
    for other in &agents[1..] {
        let row = bazaar_testkit::eventually(Duration::from_secs(5), || async {
            machine_on(other, &m.id)
                .await
                .filter(|r| r["state"] == "started")
        })
        .await
        .expect("the machine reaches the other nodes");
        assert_eq!(row["host_id"], ids[0].as_str());
        assert_eq!(row["app"], "gossip");
        assert_eq!(row["host_status"], "ok");
    }
    // `bazaar hosts` and `bazaar status` show the same rows: as tables, and with `--json`
    // the catalog's answer as it was sent (every field, keys sorted).
    for (command, path) in [
        (&["hosts"][..], "hosts"),
        (&["status", "--app", "gossip"][..], "machines?app=gossip"),
    ] {
        let raw = catalog(&agents[1], path).await;
        let json = cli(&agents[1], &[command, &["--json"][..]].concat());
        let shown: serde_json::Value = serde_json::from_str(&json).expect("JSON");
        let (raw, shown) = (raw.as_array().unwrap(), shown.as_array().unwrap());
        assert_eq!(raw.len(), shown.len(), "{json}");
        for (r, s) in raw.iter().zip(shown) {
            let keys =
                |v: &serde_json::Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
            assert_eq!(keys(r), keys(s), "{json}");
            assert_eq!(r["id"], s["id"]);
        }
        assert!(json.starts_with("[\n  {\n    \""), "pretty: {json}");
        let table = cli(&agents[1], command);
        for r in raw {
            assert!(table.contains(r["id"].as_str().unwrap()), "{table}");
        }
    }
    a.stop(&m.id, &StopRequest::default()).await.unwrap();
    bazaar_testkit::eventually(Duration::from_secs(5), || async {
        machine_on(&agents[2], &m.id)
            .await
            .filter(|r| r["state"] == "stopped")
    })
    .await
    .expect("the stop propagates");
    a.destroy(&m.id, false).await.unwrap();
    let tomb = bazaar_testkit::eventually(Duration::from_secs(5), || async {
        machine_on(&agents[1], &m.id)
            .await
            .filter(|r| r["deleted"] == true)
    })
    .await
    .expect("the destroy leaves a tombstone");
    assert_eq!(tomb["state"], "destroyed");
    let live = catalog(&agents[1], "machines?app=gossip").await;
    assert_eq!(
        live.as_array().unwrap().len(),
        0,
        "tombstones are hidden from normal lists"
    );

    // A killed host is declared dead everywhere, its machines unreachable.
    let c = agents[2].client();
    let mc = c
        .create(&create_request("gossip", &["sleep", "1000"]))
        .await
        .unwrap();
    wait_state(&c, &mc.id, MachineState::Started).await;
    bazaar_testkit::eventually(Duration::from_secs(5), || async {
        machine_on(&agents[0], &mc.id).await
    })
    .await
    .unwrap();
    agents[2].kill9();
    let t0 = Instant::now();
    bazaar_testkit::eventually(Duration::from_secs(10), || async {
        (host_status(&agents[0], &ids[2]).await.as_deref() == Some("dead")).then_some(())
    })
    .await
    .expect("the killed host is declared dead");
    let detected = t0.elapsed();
    assert!(
        detected < Duration::from_secs(6),
        "detected after {detected:?} (dead_after is 2 s)"
    );
    let row = machine_on(&agents[1], &mc.id).await.unwrap();
    assert_eq!(row["host_status"], "unreachable");

    // It comes back alive after a restart; its machine is still there, reachable again.
    // Asked at once, its API already knows the other hosts' machines (it waits for its
    // first sync rather than answering 404).
    let ma = a
        .create(&create_request("gossip", &["sleep", "1000"]))
        .await
        .unwrap();
    wait_state(&a, &ma.id, MachineState::Started).await;
    agents[2].spawn(&[]).unwrap();
    let (s, v) = Fly::new(&agents[2])
        .get(&format!("/apps/gossip/machines/{}", ma.id))
        .await;
    assert_eq!(s, reqwest::StatusCode::OK, "right after a restart: {v}");
    bazaar_testkit::eventually(Duration::from_secs(10), || async {
        let alive = host_status(&agents[0], &ids[2]).await.as_deref() == Some("alive");
        let row = machine_on(&agents[0], &mc.id).await?;
        (alive && row["host_status"] == "ok").then_some(())
    })
    .await
    .expect("the restarted host is alive again");

    // A clean stop is seen as leaving at once.
    agents[1].stop().unwrap();
    let t0 = Instant::now();
    bazaar_testkit::eventually(Duration::from_secs(5), || async {
        (host_status(&agents[0], &ids[1]).await.as_deref() == Some("left")).then_some(())
    })
    .await
    .expect("a graceful stop leaves");
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "left after {:?}",
        t0.elapsed()
    );
}

/// A host alone (as a whole cluster restarted at once is) killed and started again still
/// has the apps, secrets and quota it was asked for: they live in its catalog rows, which
/// it keeps on disk (`bazaar_catalog::own_rows`), not only in peers' memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_host_killed_keeps_its_apps_secrets_and_quotas() {
    let mut agents = start_cluster(std::path::Path::new(EXE), 1, |_, _| {}).unwrap();
    let fly = bazaar_testkit::Fly::new(&agents[0]);
    fly.create_app("kept").await;
    let (s, v) = fly
        .post(
            "/apps/kept/secrets",
            serde_json::json!({"values": {"TOKEN": "s3cret"}}),
        )
        .await;
    assert!(s.is_success(), "{s} {v}");
    let (s, v) = fly
        .post(
            "/orgs/personal/apps/kept/quota",
            serde_json::json!({"machines": 3}),
        )
        .await;
    assert!(s.is_success(), "{s} {v}");

    agents[0].kill9();
    agents[0].spawn(&[]).unwrap();
    let fly = bazaar_testkit::Fly::new(&agents[0]);
    let (s, app) = fly.get("/apps/kept").await;
    assert_eq!(s, reqwest::StatusCode::OK, "the app is gone: {app}");
    let (_, secrets) = fly.get("/apps/kept/secrets").await;
    assert!(secrets.to_string().contains("TOKEN"), "{secrets}");
    let (_, quota) = fly.get("/orgs/personal/apps/kept/quota").await;
    assert!(quota.to_string().contains('3'), "{quota}");
}
