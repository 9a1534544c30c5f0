//! Per-host machines (issue 34 item 5, docs/POLICY.md) on a real cluster: a machine with
//! `metadata.bazaar_per_host = "true"` and a constraint on a host label gets one copy on
//! every host that meets it and none on the others; a host that joins later, labelled to
//! match, makes its own copy from the group's config; `bazaar host drain` of a host
//! destroys its copy instead of moving it (no host gets a second one); and a config that
//! opts in with a volume is refused.

use crate::common;

use bazaar_testkit::{
    api_token, eventually, start_plain_cluster, AgentOptions, Fly, TestAgent, TEST_SECRET,
};
use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

/// The live machines of app `daemons`, counted per host id.
async fn copies(fly: &Fly) -> BTreeMap<String, usize> {
    let (s, list) = fly.get("/apps/daemons/machines").await;
    assert_eq!(s, StatusCode::OK, "{list}");
    let mut per_host = BTreeMap::new();
    for m in list.as_array().unwrap() {
        if !matches!(m["state"].as_str(), Some("destroyed" | "destroying")) {
            *per_host
                .entry(m["host_id"].as_str().unwrap().to_string())
                .or_default() += 1;
        }
    }
    per_host
}

/// Waits until the copies per host are exactly `want`.
async fn until_copies(fly: &Fly, want: &BTreeMap<String, usize>, what: &str) {
    let reached = eventually(Duration::from_secs(30), || async {
        (copies(fly).await == *want).then_some(())
    })
    .await;
    if reached.is_err() {
        panic!(
            "{what}: copies per host {:?}, wanted {want:?}",
            copies(fly).await
        );
    }
}

fn per_host_machine() -> Value {
    let mut config = process_config(&["sleep", "1000"]);
    config["metadata"] = json!({"bazaar_per_host": "true", "fly_process_group": "agent"});
    config["placement"] = json!({"constraints": [{"label": "role", "op": "=", "value": "edge"}]});
    json!({"config": config, "region": "local"})
}

async fn host_id(agent: &TestAgent) -> String {
    agent.client().info().await.unwrap().id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_host_machine_runs_once_on_every_matching_host_including_one_that_joins() {
    let roles = ["edge", "edge", "db"];
    let mut agents = start_plain_cluster(std::path::Path::new(EXE), 3, |i, o| {
        o.extra_args
            .extend(["--label".into(), format!("role={}", roles[i])]);
    })
    .unwrap();
    let fly = Fly::new(&agents[0]);
    wait_for_hosts(&fly, 3).await;
    fly.create_app("daemons").await;

    // A volume cannot go with it (each host would need its own).
    let mut bad = per_host_machine();
    bad["config"]["mounts"] = json!([{"volume": "vol_123456789", "path": "/data"}]);
    let (s, v) = fly.post("/apps/daemons/machines", bad).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("bazaar_per_host"),
        "{v}"
    );

    // One created through the API; the other edge host makes its own; the db host none.
    let (s, v) = fly.post("/apps/daemons/machines", per_host_machine()).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (edge0, edge1) = (host_id(&agents[0]).await, host_id(&agents[1]).await);
    let want = BTreeMap::from([(edge0.clone(), 1), (edge1.clone(), 1)]);
    until_copies(&fly, &want, "both edge hosts, not the db host").await;

    // A host that joins later, labelled edge, makes its copy.
    let mut opts = AgentOptions::new(EXE);
    opts.extra_args.extend([
        "--dead-after-ms".into(),
        "2000".into(),
        "--join".into(),
        agents[0].gossip_addr(),
        "--label".into(),
        "role=edge".into(),
    ]);
    agents.push(TestAgent::start(opts).unwrap());
    let late = host_id(&agents[3]).await;
    let mut want_late = want.clone();
    want_late.insert(late.clone(), 1);
    until_copies(&fly, &want_late, "the host that joined").await;
    // Each copy runs.
    let (_, list) = fly.get("/apps/daemons/machines").await;
    for m in list.as_array().unwrap() {
        wait_started(&fly, "daemons", m["id"].as_str().unwrap()).await;
    }

    // Draining the late host destroys its copy; no other host gets a second one.
    let out = std::process::Command::new(EXE)
        .args(["host", "drain", &late, "--deadline", "60s", "--json"])
        .env("BAZAAR_API_URL", agents[3].url())
        .env("BAZAAR_CLUSTER_SECRET", TEST_SECRET)
        .env("BAZAAR_TOKEN", api_token())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let drained: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(drained["machines"][0]["outcome"], "destroyed", "{drained}");
    until_copies(&fly, &want, "after the drain").await;
    // And it stays so: the drained host makes no new copy (its loop looks every 0.5 s).
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(copies(&fly).await, want, "after the drain");
    }
}
