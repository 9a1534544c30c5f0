//! Hosts that die or are down under the Machines API, on loopback clusters: a bid winner
//! that dies before its claim or after making the machine (before it answers: `BAZAAR_CRASH_AT`),
//! and a machine whose host is down (shown from the catalog, every change refused).

use crate::common;

use bazaar_testkit::{start_cluster, TestAgent};
use common::*;
use reqwest::{Method, StatusCode};
use serde_json::json;
use std::time::Duration;

/// `hosts` hosts in region `local`; the last one is by far the emptiest, so it wins every
/// bid, and it kills itself at `crash_at` (`BAZAAR_CRASH_AT`). The others offer
/// `others_memory_mb`.
fn cluster_whose_winner_dies_at(
    hosts: usize,
    crash_at: &str,
    others_memory_mb: u64,
) -> Vec<TestAgent> {
    start_cluster(std::path::Path::new(EXE), hosts, |i, o| {
        if i == hosts - 1 {
            o.memory_mb = 1024 * 1024;
            o.env.push(("BAZAAR_CRASH_AT".into(), crash_at.into()));
        } else {
            o.memory_mb = others_memory_mb;
        }
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_winner_that_dies_before_the_claim_does_not_fail_the_create() {
    // Host 2 wins every bid and dies on the claim.
    let mut agents = cluster_whose_winner_dies_at(3, "claim:0", 4096);
    let loser_id = agents[2].client().info().await.unwrap().id;
    let fly = Fly::new(&agents[0]);
    fly.post("/apps", json!({"app_name": "fault"})).await;
    wait_for_hosts(&fly, 3).await;
    let (s, m) = fly
        .post(
            "/apps/fault/machines",
            json!({"config": process_config(&["sleep", "1000"]), "region": "local"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    assert_ne!(
        m["host_id"],
        loser_id.as_str(),
        "placed on a host that is alive"
    );
    agents[2]
        .wait_exit(Duration::from_secs(5))
        .expect("the winner died at the claim");
    let id = m["id"].as_str().unwrap();
    let (_, p) = fly
        .get(&format!("/apps/fault/machines/{id}/placement"))
        .await;
    let failed = p["rounds"][0]["asked"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a["outcome"] == "claim_failed");
    assert!(failed, "the record shows the failed claim: {p}");
    // No half-created machine on the host that died.
    agents[2].opts.env.clear();
    agents[2].spawn(&[]).unwrap();
    assert!(agents[2]
        .client()
        .machines(None, true)
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_winner_that_dies_after_making_the_machine_leaves_exactly_one() {
    // Host 2 wins every bid and dies right after it has recorded the machine, before it
    // answers the claim: the claim may or may not have worked, as far as the API can tell.
    let mut agents = cluster_whose_winner_dies_at(3, "create:0", 4096);
    let fly = Fly::new(&agents[0]);
    fly.post("/apps", json!({"app_name": "twice"})).await;
    wait_for_hosts(&fly, 3).await;
    let (s, m) = fly
        .post(
            "/apps/twice/machines",
            json!({"name": "only", "config": process_config(&["sleep", "1000"]), "region": "local"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    agents[2]
        .wait_exit(Duration::from_secs(5))
        .expect("the winner died after making the machine");
    let id = m["id"].as_str().unwrap().to_string();
    // The next offer claimed the same machine (one epoch up), not a second one.
    let dead = agents[2].client();
    agents[2].opts.env.clear();
    agents[2].spawn(&[]).unwrap();
    let made_there = dead.machines(Some("twice"), true).await.unwrap();
    assert_eq!(
        made_there.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(),
        [id.as_str()],
        "the host that died made the machine the API answered with, under the same id"
    );
    // Once it hears of the newer copy, the host that died destroys its own.
    bazaar_testkit::eventually(Duration::from_secs(20), || async {
        let there = dead.machines(Some("twice"), false).await.ok()?;
        there.is_empty().then_some(())
    })
    .await
    .expect("the copy on the host that died is destroyed");
    wait_started(&fly, "twice", &id).await;
    let (_, list) = fly.get("/apps/twice/machines").await;
    let listed: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [id.as_str()], "one machine: {list}");
    assert_eq!(list[0]["host_id"], m["host_id"], "{list}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_only_claim_went_unanswered_is_a_503_naming_the_machine() {
    // Only host 1 can take the machine (host 0 is too small), and it dies right after
    // recording it: the API cannot say "refused" (409), it says "unknown" (503) and names
    // the machine, which is there once the host is back.
    let mut agents = cluster_whose_winner_dies_at(2, "create:0", 256);
    let fly = Fly::new(&agents[0]);
    fly.post("/apps", json!({"app_name": "unknown"})).await;
    wait_for_hosts(&fly, 2).await;
    let mut config = process_config(&["sleep", "1000"]);
    config["guest"]["memory_mb"] = json!(1024);
    let (s, e) = fly
        .post(
            "/apps/unknown/machines",
            json!({"config": config, "region": "local"}),
        )
        .await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{e}");
    let error = e["error"].as_str().unwrap();
    assert!(error.contains("may have been created"), "{error}");
    let id = error
        .split("claim for machine ")
        .nth(1)
        .and_then(|rest| rest.split(':').next())
        .unwrap_or_else(|| panic!("the error names the machine: {error}"))
        .to_string();
    agents[1]
        .wait_exit(Duration::from_secs(5))
        .expect("the host died after making the machine");
    agents[1].opts.env.clear();
    agents[1].spawn(&[]).unwrap();
    // The machine the 503 named was made, and runs once its host is back.
    bazaar_testkit::eventually(Duration::from_secs(20), || async {
        let (s, m) = fly.get(&format!("/apps/unknown/machines/{id}")).await;
        (s == StatusCode::OK && m["state"] == "started").then_some(())
    })
    .await
    .expect("the named machine runs on the host that came back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_whose_host_is_down_is_shown_but_not_changed() {
    let mut agents = start_cluster(std::path::Path::new(EXE), 2, |i, o| {
        o.region = if i == 0 { "ams" } else { "ord" }.into();
    })
    .unwrap();
    let fly = Fly::new(&agents[0]);
    fly.post("/apps", json!({"app_name": "orphan"})).await;
    bazaar_testkit::eventually(Duration::from_secs(10), || async {
        let (_, r) = fly.get("/platform/regions").await;
        (r["regions"].as_array().map(Vec::len) == Some(2)).then_some(())
    })
    .await
    .unwrap();
    let (s, m) = fly
        .post(
            "/apps/orphan/machines",
            json!({"config": process_config(&["sleep", "1000"]), "region": "ord"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let id = m["id"].as_str().unwrap().to_string();
    wait_started(&fly, "orphan", &id).await;
    // The machine's row reaches the first node's catalog, then its host dies.
    bazaar_testkit::eventually(Duration::from_secs(10), || async {
        let (_, list) = fly.get("/apps/orphan/machines").await;
        (list.as_array().map(Vec::len) == Some(1)).then_some(())
    })
    .await
    .unwrap();
    agents[1].kill9();

    // At once (the host is not yet declared dead) and after it is: reads answer from the
    // catalog with host_status unreachable; every change is refused with a clear 503.
    for phase in ["refused connection", "declared dead"] {
        if phase == "declared dead" {
            bazaar_testkit::eventually(Duration::from_secs(15), || async {
                // The catalog view: the cluster secret's, not the API token's.
                let hosts = agents[0].client().catalog_hosts().await.ok()?;
                let dead = hosts
                    .iter()
                    .any(|h| h.region == "ord" && h.status == "dead");
                dead.then_some(())
            })
            .await
            .expect("the catalog declares the host dead");
            let (_, list) = fly.get("/apps/orphan/machines").await;
            assert_eq!(list[0]["host_status"], "unreachable", "{list}");
        }
        let (s, v) = fly.get(&format!("/apps/orphan/machines/{id}")).await;
        assert_eq!(s, StatusCode::OK, "{phase}: {v}");
        assert_eq!(v["host_status"], "unreachable", "{phase}: {v}");
        assert_eq!(v["state"], "started", "{phase}: last known state: {v}");
        for (method, path, body) in [
            (Method::POST, "/stop", None),
            (Method::POST, "/start", None),
            (Method::DELETE, "?force=true", None),
            (
                Method::POST,
                "",
                Some(json!({"config": process_config(&["sleep", "5"])})),
            ),
        ] {
            let (s, e) = fly
                .call(
                    method.clone(),
                    &format!("/apps/orphan/machines/{id}{path}"),
                    body,
                )
                .await;
            assert_eq!(
                s,
                StatusCode::SERVICE_UNAVAILABLE,
                "{phase} {method} {path}: {e}"
            );
            let msg = e["error"].as_str().unwrap_or_default();
            assert!(
                msg.contains("unreachable") && msg.contains(&id),
                "{phase}: a clear error: {e}"
            );
        }
    }
    // The host comes back: the machine is changeable again, and was never touched.
    agents[1].spawn(&[]).unwrap();
    bazaar_testkit::eventually(Duration::from_secs(20), || async {
        let (s, v) = fly
            .post(&format!("/apps/orphan/machines/{id}/stop"), json!({}))
            .await;
        (s == StatusCode::OK).then_some(v)
    })
    .await
    .expect("stop works once the host is back");
}
