//! A displaced machine re-placed elsewhere (issue 34 item 1, docs/POLICY.md "Preemption"),
//! on two agents in the test's own process whose machines run on the test kit's fake
//! driver, their catalogs joined on loopback: host `a` is full with a `batch` and a
//! `default` machine, a `critical` machine pinned to `a` stops the batch one by preemption;
//! while host `b` is full the batch machine stays stopped on `a`, displaced, and once `b`
//! has room it (restart policy `on-failure`, the default) runs on `b` under its own id, its `replaced` event naming where it came from and for what; the
//! cluster lists it once, and `a`'s stopped copy is gone. One stopped by hand before it was
//! preempted stays stopped on `a`.

use axum::http::{Method, StatusCode};
use bazaar_testkit::api_token;
use bazaar_testkit::in_process::{oneshot, InProcessAgent};
use serde_json::{json, Value};
use std::time::Duration;

fn machine(priority: &str, placement: Value) -> String {
    json!({
        "config": {"driver": "process", "init": {"exec": ["sleep", "100"]}, "priority": priority,
                   "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256},
                   "placement": placement},
    })
    .to_string()
}

async fn host(name: &str, seeds: Vec<std::net::SocketAddr>) -> InProcessAgent {
    let (mut node, _driver) = InProcessAgent::start_fake_member(seeds, |c| {
        c.memory_mb = Some(512);
        c.labels.insert("name".into(), name.into());
    })
    .await
    .unwrap();
    node.serve(bazaar_api::router(node.node()));
    bazaar_api::displaced::spawn(bazaar_api::Api::new(node.node()));
    node
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preempted_batch_machine_runs_again_on_another_host() {
    let a = host("a", Vec::new()).await;
    let b = host("b", vec![a.catalog.local_addr()]).await;
    let (a_id, b_id) = (a.agent.host_id().to_string(), b.agent.host_id().to_string());
    let wait = Duration::from_secs(20);
    bazaar_testkit::eventually(wait, || async {
        (a.catalog.hosts().len() == 2 && b.catalog.hosts().len() == 2).then_some(())
    })
    .await
    .expect("the two hosts see each other");
    let api = bazaar_api::router(a.node());
    let token = Some(api_token());
    let body = json!({"app_name": "dis", "org_slug": "personal"}).to_string();
    let (s, v) = oneshot(&api, Method::POST, "/v1/apps", token, Some(&body)).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let path = "/v1/apps/dis/machines";
    let on_a = json!({"constraints": [{"label": "name", "value": "a"}]});
    let prefers_a = json!({"affinities": [{"label": "name", "value": "a", "weight": 100}]});
    let mut ids = Vec::new();
    for (priority, placement) in [("batch", prefers_a), ("default", on_a.clone())] {
        let (s, m) = oneshot(
            &api,
            Method::POST,
            path,
            token,
            Some(&machine(priority, placement)),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{m}");
        ids.push(m["id"].as_str().unwrap().to_string());
    }
    let batch = ids[0].clone();
    assert_eq!(a.catalog.machine(&batch).unwrap().record.host_id, a_id);
    // Host b is full too, for now.
    let on_b = json!({"constraints": [{"label": "name", "value": "b"}]});
    let mut b_ids = Vec::new();
    for _ in 0..2 {
        let body = machine("default", on_b.clone());
        let (s, m) = oneshot(&api, Method::POST, path, token, Some(&body)).await;
        assert_eq!(s, StatusCode::OK, "{m}");
        b_ids.push(m["id"].as_str().unwrap().to_string());
    }
    // Host a is full: the critical machine, which must run on a, stops the batch one.
    let (s, m) = oneshot(
        &api,
        Method::POST,
        path,
        token,
        Some(&machine("critical", on_a)),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let critical = m["id"].as_str().unwrap().to_string();

    // No other host has room: the batch machine stays stopped on a, displaced, and is
    // tried again (its host's loop looks every 0.5 s, and asks again after 5 s).
    let row = bazaar_testkit::eventually(wait, || async {
        let row = a.catalog.machine(&batch)?;
        row.record.displaced_by.is_some().then_some(row)
    })
    .await
    .expect("the batch machine displaced");
    assert_eq!(row.record.displaced_by.as_deref(), Some(critical.as_str()));
    assert_eq!(
        (row.record.host_id.as_str(), row.record.state.as_str()),
        (a_id.as_str(), "stopped")
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        a.catalog.machine(&batch).unwrap().record.host_id,
        a_id,
        "no room on b yet"
    );
    // Room on b: the batch machine runs again there, under its id, one epoch up.
    let (s, v) = oneshot(
        &api,
        Method::DELETE,
        &format!("{path}/{}?force=true", b_ids[0]),
        token,
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let moved = bazaar_testkit::eventually(wait, || async {
        let row = a.catalog.machine(&batch)?;
        (row.record.host_id == b_id && row.record.state == "started").then_some(row)
    })
    .await
    .expect("the displaced batch machine re-placed on host b");
    assert_eq!(moved.record.epoch, 1);
    assert_eq!(moved.record.displaced_by, None);
    let (s, m): (StatusCode, Value) =
        oneshot(&api, Method::GET, &format!("{path}/{batch}"), token, None).await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let replaced = m["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "replaced")
        .unwrap_or_else(|| panic!("a replaced event: {m}"));
    assert_eq!(
        replaced["status"],
        bazaar_api::displaced::event_status(&a_id, &critical)
    );
    // a's stopped copy is destroyed (fenced): the cluster lists the machine once, on b.
    bazaar_testkit::eventually(wait, || async {
        let (_, list) = oneshot(&api, Method::GET, path, token, None).await;
        let copies: Vec<&Value> = list
            .as_array()?
            .iter()
            .filter(|m| m["id"] == batch.as_str())
            .collect();
        let a_copy_gone = a.agent.machine(&batch).await.map_or(true, |m| {
            m.state == bazaar_types::state::MachineState::Destroyed
        });
        (copies.len() == 1 && a_copy_gone).then_some(())
    })
    .await
    .expect("host a's copy destroyed, the machine listed once");
    // The others were not touched.
    for id in [&ids[1], &critical] {
        let row = a.catalog.machine(id).unwrap();
        assert_eq!(
            (row.record.host_id.as_str(), row.record.state.as_str()),
            (a_id.as_str(), "started")
        );
    }
    b.stop().await;
    a.stop().await;
}

/// A batch machine stopped by hand and then preempted stays where it is, stopped: only a
/// machine displaced while it ran is moved, even with room elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_stopped_by_hand_and_then_preempted_stays_stopped_where_it_is() {
    let a = host("a", Vec::new()).await;
    let b = host("b", vec![a.catalog.local_addr()]).await;
    let a_id = a.agent.host_id().to_string();
    bazaar_testkit::eventually(Duration::from_secs(20), || async {
        (a.catalog.hosts().len() == 2 && b.catalog.hosts().len() == 2).then_some(())
    })
    .await
    .expect("the two hosts see each other");
    let api = bazaar_api::router(a.node());
    let token = Some(api_token());
    let body = json!({"app_name": "kept", "org_slug": "personal"}).to_string();
    let (s, v) = oneshot(&api, Method::POST, "/v1/apps", token, Some(&body)).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let path = "/v1/apps/kept/machines";
    let on_a = json!({"constraints": [{"label": "name", "value": "a"}]});
    let prefers_a = json!({"affinities": [{"label": "name", "value": "a", "weight": 100}]});
    let mut ids = Vec::new();
    for (priority, placement) in [("batch", prefers_a), ("default", on_a.clone())] {
        let body = machine(priority, placement);
        let (s, m) = oneshot(&api, Method::POST, path, token, Some(&body)).await;
        assert_eq!(s, StatusCode::OK, "{m}");
        ids.push(m["id"].as_str().unwrap().to_string());
    }
    let batch = ids[0].clone();
    let stop = format!("{path}/{batch}/stop");
    let (s, v) = oneshot(&api, Method::POST, &stop, token, None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    bazaar_testkit::eventually(Duration::from_secs(10), || async {
        (a.catalog.machine(&batch)?.record.state == "stopped").then_some(())
    })
    .await
    .expect("stopped by hand");
    let body = machine("critical", on_a);
    let (s, m) = oneshot(&api, Method::POST, path, token, Some(&body)).await;
    assert_eq!(s, StatusCode::OK, "{m}");
    // Its host's loop looks every 0.5 s: three looks later it is still here, not displaced.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let row = a.catalog.machine(&batch).unwrap().record;
    assert_eq!(
        (
            row.host_id.as_str(),
            row.state.as_str(),
            row.displaced_by,
            row.epoch
        ),
        (a_id.as_str(), "stopped", None, 0)
    );
    let (_, m): (StatusCode, Value) =
        oneshot(&api, Method::GET, &format!("{path}/{batch}"), token, None).await;
    assert!(
        m["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["type"] == "preempted"),
        "{m}"
    );
    b.stop().await;
    a.stop().await;
}
