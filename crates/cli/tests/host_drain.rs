//! `bazaar host drain` / `undrain` on a 3-agent loopback cluster: a drained host refuses
//! bids and direct creates at once, its row says `draining` (`bazaar hosts`), every
//! exchange leaves it out with that reason (`machine explain`'s record) and it stays
//! drained across an agent restart (and a caller of a newer host interface format is
//! refused); its machine that can run elsewhere is replaced by a
//! new one of the same app, name and config on another host, started before the original
//! is destroyed; its machine bound to a volume of the host is stopped and listed, the
//! volume kept. `undrain` takes it back. Bad input to `PUT /host/v1/drain` is a 400.

use crate::common;
use crate::volumes_support;

use bazaar_testkit::{create_request, start_cluster, TestAgent, TEST_SECRET};
use bazaar_types::host::{BidRequest, BidResponse};
use bazaar_types::state::MachineState;
use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;
use volumes_support::{agent_of, host_of, process_config, UnmountOnDrop};

/// Runs `bazaar ARGS` against `agent` with the cluster secret and an API token.
fn bazaar(agent: &TestAgent, args: &[&str]) -> std::process::Output {
    std::process::Command::new(EXE)
        .args(args)
        .env("BAZAAR_API_URL", agent.url())
        .env("BAZAAR_CLUSTER_SECRET", TEST_SECRET)
        .env("BAZAAR_TOKEN", bazaar_testkit::api_token())
        .output()
        .unwrap()
}

fn bid() -> BidRequest {
    BidRequest {
        placement_id: "drain-test".into(),
        cpus: 1,
        memory_mb: 256,
        ttl_ms: Some(5000),
        driver: None,
        priority: None,
        preempt: false,
    }
}

fn web(mark: &str) -> Value {
    let mut c = process_config(&["sleep", "3600"], 256, None);
    c["env"] = json!({ "MARK": mark });
    c["metadata"] = json!({ "team": "drain-test" });
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_host_takes_nothing_new_and_its_machines_move_or_stop() {
    let mut agents = start_cluster(Path::new(EXE), 3, |_, _| {}).unwrap();
    let _unmount = UnmountOnDrop::new(&agents);
    let fly = Fly::new(&agents[0]);
    fly.create_app("shop").await;

    // A volume, and a machine bound to it: both on host `h`.
    let (s, v) = fly
        .post(
            "/apps/shop/volumes",
            json!({"name": "data", "size_gb": 1, "region": "local"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let volume = v["id"].as_str().unwrap().to_string();
    let h = v["zone"].as_str().unwrap().to_string();
    let (s, bound) = fly
        .post(
            "/apps/shop/machines",
            json!({"config": process_config(&["sleep", "3600"], 256, Some((&volume, "/data")))}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{bound}");
    let bound = bound["id"].as_str().unwrap().to_string();
    fly.wait_state("shop", &bound, "started").await;

    // Machines that can run anywhere, until one lands on `h` (the market spreads them).
    let mut movable = None;
    for i in 0..8 {
        let (s, m) = fly
            .post(
                "/apps/shop/machines",
                json!({"name": format!("web-{i}"), "config": web(&format!("m{i}"))}),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{m}");
        let id = m["id"].as_str().unwrap().to_string();
        fly.wait_state("shop", &id, "started").await;
        let (_, m) = fly.get(&format!("/apps/shop/machines/{id}")).await;
        if m["host_id"] == h.as_str() {
            movable = Some(m);
            break;
        }
    }
    let movable = movable.expect("a machine on the volume's host");
    let movable_id = movable["id"].as_str().unwrap().to_string();
    let host = agent_of(&agents, &h).client();

    // Drain it.
    let out = bazaar(
        &agents[0],
        &["host", "drain", &h, "--deadline", "60s", "--json"],
    );
    assert!(out.status.success(), "{out:?}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["host_id"], h.as_str());
    let outcome = |id: &str| {
        report["machines"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["machine"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("{id} not in {report}"))
    };
    let moved = outcome(&movable_id);
    assert_eq!(moved["outcome"], "replaced", "{report}");
    let clone_id = moved["replacement"].as_str().unwrap().to_string();
    let stopped = outcome(&bound);
    assert_eq!(stopped["outcome"], "stopped", "{report}");
    assert!(
        stopped["detail"].as_str().unwrap().contains(&volume),
        "{report}"
    );

    // The replacement: started elsewhere, same app, name, config; the original gone.
    let (_, clone) = fly.get(&format!("/apps/shop/machines/{clone_id}")).await;
    assert_eq!(clone["state"], "started", "{clone}");
    assert_ne!(clone["host_id"], h.as_str(), "{clone}");
    assert_eq!(clone["name"], movable["name"]);
    assert_eq!(clone["config"]["env"], movable["config"]["env"]);
    assert_eq!(clone["config"]["metadata"], movable["config"]["metadata"]);
    assert_eq!(clone["config"]["init"], movable["config"]["init"]);
    let original = host.machine(&movable_id).await;
    assert!(
        original.is_err() || original.as_ref().unwrap().state == MachineState::Destroyed,
        "{original:?}"
    );
    // The bound machine is stopped on `h`, its volume kept.
    assert_eq!(
        host.machine(&bound).await.unwrap().state,
        MachineState::Stopped
    );
    let (s, v) = fly.get(&format!("/apps/shop/volumes/{volume}")).await;
    assert_eq!(s, StatusCode::OK, "{v}");

    // Nothing new: bids and direct creates refused, the row says so, and the exchange
    // leaves it out with the reason.
    match host.bid(&bid()).await.unwrap() {
        BidResponse::Refusal { reason, .. } => assert!(reason.contains("draining"), "{reason}"),
        other => panic!("a drained host bid: {other:?}"),
    }
    let err = host
        .create(&create_request("shop", &["sleep", "1"]))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("draining"), "{err}");
    assert!(host.info().await.unwrap().draining);
    let drained_row = || async {
        let out = bazaar(&agents[0], &["hosts", "--json"]);
        let hosts: Value = serde_json::from_slice(&out.stdout).ok()?;
        hosts
            .as_array()?
            .iter()
            .find(|r| r["id"] == h.as_str())
            .map(|r| r["draining"] == true)
    };
    bazaar_testkit::eventually(Duration::from_secs(10), || async {
        drained_row().await.filter(|d| *d)
    })
    .await
    .expect("bazaar hosts shows the host draining");
    let table = bazaar(&agents[0], &["hosts"]);
    assert!(
        String::from_utf8_lossy(&table.stdout).contains("draining"),
        "{table:?}"
    );
    let (s, m) = fly
        .post("/apps/shop/machines", json!({"config": web("late")}))
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    assert_ne!(m["host_id"], h.as_str());
    let late = m["id"].as_str().unwrap();
    let (_, placement) = fly
        .get(&format!("/apps/shop/machines/{late}/placement"))
        .await;
    assert!(
        placement["excluded"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["host_id"] == h.as_str() && e["reason"] == "host is draining"),
        "{placement}"
    );
    let explain = bazaar(&agents[0], &["machine", "explain", "-a", "shop", late]);
    let text = String::from_utf8_lossy(&explain.stdout);
    assert!(
        text.contains(&h) && text.contains("host is draining"),
        "{explain:?}"
    );

    // Drained it stays across a restart of its agent; undrain takes it back.
    let index = agents.iter().position(|a| host_of(a) == h).unwrap();
    agents[index].restart().unwrap();
    let host = agents[index].client();
    assert!(host.info().await.unwrap().draining);
    let out = bazaar(&agents[0], &["host", "undrain", &h]);
    assert!(out.status.success(), "{out:?}");
    assert!(!host.info().await.unwrap().draining);
    match host.bid(&bid()).await.unwrap() {
        BidResponse::Bid { reservation_id, .. } => {
            host.release(&reservation_id).await.unwrap();
        }
        other => panic!("an undrained host refused: {other:?}"),
    }

    // Bad input.
    let http = reqwest::Client::new();
    for body in [r#"{"draining": "yes"}"#, r#"{}"#, "not json"] {
        let r = http
            .put(format!("{}/host/v1/drain", agents[index].url()))
            .bearer_auth(TEST_SECRET)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{body}");
        let text = r.text().await.unwrap();
        assert!(text.contains("drain request"), "{text}");
    }
    let r = http
        .put(format!("{}/host/v1/drain", agents[index].url()))
        .bearer_auth(bazaar_testkit::api_token())
        .body(r#"{"draining": true}"#)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_client_error(), "an API token drained a host");
    // A caller of a newer host interface format is refused before anything is done.
    let r = http
        .put(format!("{}/host/v1/drain", agents[index].url()))
        .bearer_auth(TEST_SECRET)
        .header(bazaar_types::host::HOST_FORMAT_HEADER, "99")
        .body(r#"{"draining": true}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let text = r.text().await.unwrap();
    assert!(text.contains("upgrade this host"), "{text}");
    assert!(!host.info().await.unwrap().draining);
}
