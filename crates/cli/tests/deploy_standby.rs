//! Standbys (issue 6, acceptance 5): a stopped machine with `config.standbys = [primary]`
//! starts when the primary's host is killed (kill -9) and declared dead; a standby whose
//! primary's host is alive stays stopped.

use crate::deploy_support;

use bazaar_testkit::start_cluster;
use serde_json::{json, Value};
use std::time::Duration;

async fn call(http: &reqwest::Client, url: &str, body: Option<Value>) -> Value {
    let req = match body {
        Some(b) => http.post(url).json(&b),
        None => http.get(url),
    };
    let r = req
        .bearer_auth(bazaar_testkit::api_token())
        .send()
        .await
        .unwrap();
    let s = r.status();
    let v: Value = r.json().await.unwrap_or(Value::Null);
    assert!(s.is_success(), "{url}: {s} {v}");
    v
}

fn config(standbys: &[&str]) -> Value {
    json!({
        "image": "process", "driver": "process",
        "init": {"exec": ["sleep", "1000"]},
        "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256},
        "restart": {"policy": "no"},
        "standbys": standbys,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_starts_when_its_primarys_host_dies() {
    let regions = ["ams", "ord", "fra"];
    let mut agents = start_cluster(std::path::Path::new(deploy_support::EXE), 3, |i, o| {
        o.region = regions[i].to_string();
    })
    .expect("cluster");
    let http = reqwest::Client::new();
    let base = format!("{}/v1", agents[0].url());
    call(
        &http,
        &format!("{base}/apps"),
        Some(json!({"app_name": "db"})),
    )
    .await;
    // Every node must know every host before placing by region.
    bazaar_testkit::eventually(Duration::from_secs(20), || async {
        let r = call(&http, &format!("{base}/platform/regions"), None).await;
        (r["regions"].as_array().map(|a| a.len()) == Some(3)).then_some(())
    })
    .await
    .expect("3 regions");
    let create = |region: &str, cfg: Value, skip: bool| {
        let (http, base, region) = (http.clone(), base.clone(), region.to_string());
        async move {
            let m = call(
                &http,
                &format!("{base}/apps/db/machines"),
                Some(json!({"config": cfg, "region": region, "skip_launch": skip})),
            )
            .await;
            m["id"].as_str().unwrap().to_string()
        }
    };
    let primary = create("ord", config(&[]), false).await;
    let other = create("fra", config(&[]), false).await;
    let standby = create("ams", config(&[&primary]), true).await;
    let idle = create("ams", config(&[&other]), true).await;
    let state = |id: String| {
        let (http, base) = (http.clone(), base.clone());
        async move {
            call(&http, &format!("{base}/apps/db/machines/{id}"), None).await["state"]
                .as_str()
                .unwrap()
                .to_string()
        }
    };
    // A machine created with skip_launch shows `starting` for a moment (the queued create
    // operation), then settles as created.
    for id in [&standby, &idle] {
        bazaar_testkit::eventually(Duration::from_secs(10), || {
            let s = state(id.clone());
            async move {
                let s = s.await;
                (s == "created" || s == "stopped").then_some(())
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{id} never settled as created"));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_ne!(
        state(standby.clone()).await,
        "started",
        "started while its primary lives"
    );

    // kill -9 the primary's host (ord): declared dead within ~2 s, the standby starts.
    agents[1].kill9();
    bazaar_testkit::eventually(Duration::from_secs(20), || {
        let s = state(standby.clone());
        async move { (s.await == "started").then_some(()) }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "standby never started; agent log:\n{}",
            agents[0].log_tail()
        )
    });
    // The standby of a machine on a live host stays down.
    let s = state(idle.clone()).await;
    assert!(s == "created" || s == "stopped", "{s}");
}
