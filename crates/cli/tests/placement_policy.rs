//! Host labels and machines' placement policy (issue 34 item 4, docs/POLICY.md) on a real
//! three-host cluster: hosts labelled with `bazaar agent --label`, machines with
//! `config.placement` constraints go only to the hosts that meet them, a batch with
//! `spread` puts one machine on each such host, an affinity picks the host it prefers, an
//! impossible constraint is refused at once with 422 naming it and how many hosts fail it,
//! and `bazaar machine explain` and the dry run show each host's verdict.

use crate::common;

use bazaar_testkit::{api_token, start_cluster, Fly, TestAgent};
use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Runs `bazaar ARGS` against `agent`; must succeed.
fn bazaar(agent: &TestAgent, args: &[&str]) -> String {
    let out = std::process::Command::new(EXE)
        .args(args)
        .env("BAZAAR_API_URL", agent.url())
        .env("BAZAAR_TOKEN", api_token())
        .output()
        .unwrap();
    assert!(out.status.success(), "bazaar {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

fn machine(placement: Value) -> Value {
    let mut config = process_config(&["sleep", "1000"]);
    config["placement"] = placement;
    json!({"config": config, "skip_launch": true, "region": "local"})
}

/// The host each machine of a placement went to.
async fn host_of(fly: &Fly, id: &str) -> String {
    let (s, p) = fly
        .get(&format!("/apps/labels/machines/{id}/placement"))
        .await;
    assert_eq!(s, StatusCode::OK, "{p}");
    p["winners"][0].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constraints_affinities_and_spread_place_by_host_labels() {
    let labels = [
        ["disk=nvme", "zone=a"],
        ["disk=ssd", "zone=a"],
        ["disk=nvme", "zone=b"],
    ];
    let agents = start_cluster(std::path::Path::new(EXE), 3, |i, o| {
        for l in labels[i] {
            o.extra_args.extend(["--label".to_string(), l.to_string()]);
        }
    })
    .unwrap();
    let mut ids = Vec::new();
    for a in &agents {
        ids.push(a.client().info().await.unwrap().id);
    }
    let fly = Fly::new(&agents[0]);
    wait_for_hosts(&fly, 3).await;
    let (s, v) = fly.post("/apps", json!({"app_name": "labels"})).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    // Every host row carries its operator's labels next to the agent's own.
    let rows = agents[0].client().catalog_hosts().await.unwrap();
    for (i, id) in ids.iter().enumerate() {
        let row = rows.iter().find(|h| &h.id == id).expect("every host's row");
        for l in labels[i] {
            let (k, v) = l.split_once('=').unwrap();
            assert_eq!(row.labels.get(k).map(String::as_str), Some(v), "{row:?}");
        }
        assert!(row.labels.contains_key("proxy_addr"), "{row:?}");
    }

    // A batch that must have NVMe disks, spread over hosts: one on each NVMe host.
    let nvme = json!({"constraints": [{"label": "disk", "op": "=", "value": "nvme"}],
                      "spread": {"by": "host"}});
    let mut body = machine(nvme.clone());
    body["count"] = json!(2);
    let (s, v) = fly.post("/apps/labels/machines/batch", body).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let mut winners: Vec<&str> = v["placement"]["winners"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    winners.sort();
    let mut want = vec![ids[0].as_str(), ids[2].as_str()];
    want.sort();
    assert_eq!(winners, want, "one machine on each NVMe host: {v}");
    let excluded = &v["placement"]["excluded"];
    assert!(
        excluded
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["host_id"] == ids[1].as_str()
                && e["reason"] == "constraint disk = nvme not met (host has disk=ssd)"),
        "the SSD host is left out naming the constraint: {excluded}"
    );
    let verdicts = v["placement"]["verdicts"].as_array().unwrap();
    assert_eq!(verdicts.len(), 3, "a verdict per host: {verdicts:?}");

    // An affinity for zone b picks the one host there, though every host may take it.
    let (s, m) = fly
        .post(
            "/apps/labels/machines",
            machine(json!({"affinities": [{"label": "zone", "value": "b", "weight": 100}]})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    assert_eq!(host_of(&fly, m["id"].as_str().unwrap()).await, ids[2]);

    // `machine explain` shows each host's verdict.
    let out = bazaar(
        &agents[0],
        &[
            "machine",
            "explain",
            "-a",
            "labels",
            m["id"].as_str().unwrap(),
        ],
    );
    assert!(out.contains("placement policy, host by host"), "{out}");
    for id in &ids {
        assert!(out.contains(id.as_str()), "{out}");
    }

    // Spread by zone, with one machine of the app in zone a per NVMe host... the app now
    // has machines on hosts 0 and 2 (zone a once, zone b twice): the next goes to zone a.
    let (s, m) = fly
        .post(
            "/apps/labels/machines",
            machine(json!({"spread": {"by": "label:zone"}})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let host = host_of(&fly, m["id"].as_str().unwrap()).await;
    assert!(host == ids[0] || host == ids[1], "zone a has fewer: {host}");

    // An impossible constraint is refused at once, naming it, and makes nothing.
    let (s, before) = fly.get("/apps/labels/machines").await;
    assert_eq!(s, StatusCode::OK);
    let (s, v) = fly
        .post(
            "/apps/labels/machines",
            machine(json!({"constraints": [{"label": "gpu", "op": "exists"}]})),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
    assert_eq!(
        v["error"],
        "no host meets the constraints: gpu exists (3 of 3 hosts fail) in region(s) local"
    );
    let (_, after) = fly.get("/apps/labels/machines").await;
    assert_eq!(
        before.as_array().unwrap().len(),
        after.as_array().unwrap().len()
    );
    // A malformed one is a 400 naming the field.
    let (s, v) = fly
        .post(
            "/apps/labels/machines",
            machine(json!({"constraints": [{"label": "disk", "op": "="}]})),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(
        v["error"],
        "placement.constraints[0]: op \"=\" needs a value"
    );

    // The dry run shows the verdicts too, and places as a create would.
    let (s, v) = fly
        .post(
            "/platform/placements",
            json!({"region": "local", "count": 1,
                   "placement": {"constraints": [{"label": "zone", "value": "b"}]}}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        v["hosts"],
        json!(BTreeMap::from([(ids[2].clone(), 1)])),
        "{v}"
    );
    let verdicts = v["placement"]["verdicts"].as_array().unwrap();
    let v1 = verdicts
        .iter()
        .find(|x| x["host_id"] == ids[1].as_str())
        .unwrap();
    assert_eq!(
        v1["excluded"],
        "constraint zone = b not met (host has zone=a)"
    );
    drop(agents);
}
