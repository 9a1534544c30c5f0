//! Two organizations create one app name on the two sides of a partition (root, on the
//! lab; issue 31, item 7). Both creates succeed (neither side can hear the other) and each
//! side starts a machine in its app; after the heal every host names the same app the app
//! of the name (the earlier one), lists the other under its organization as
//! `name_conflict`, answers its organization 409 on a machine create and on starting the
//! machine it made, which its owner has stopped, and lists only the winner's machine (still
//! running) under the name.

use crate::lab_support;

use lab_support::{until, LabApi as Api, TestLab};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use std::time::Duration;

/// What this test asks a lab host's API besides plain calls.
impl Api {
    /// A call that names the app it means by id (`bazaar-app-id`).
    async fn call_as(
        &self,
        method: Method,
        path: &str,
        app_id: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .header("bazaar-app-id", app_id)
            .timeout(Duration::from_secs(40));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("the host answers");
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// Host address → status, as this host's catalog sees them.
    async fn host_statuses(&self) -> Vec<String> {
        let (_, v) = self.get("/v1/catalog/hosts").await;
        v.as_array()
            .map(|hs| {
                hs.iter()
                    .map(|h| h["status"].as_str().unwrap_or("").to_string())
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn sleeper() -> Value {
    json!({"config": {
        "driver": "process",
        "init": {"exec": ["sleep", "1000"]},
        "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256},
    }})
}

/// The state of machine `id` of race2 as `api` answers it.
async fn state(api: &Api, id: &str) -> String {
    let (_, m) = api.get(&format!("/v1/apps/race2/machines/{id}")).await;
    m["state"].as_str().unwrap_or("").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_earlier_app_keeps_a_name_both_sides_of_a_partition_created() {
    let (t, _) = TestLab::up(
        "appnames",
        &[
            "--dead-after-ms",
            "2000",
            "--hosts",
            "2",
            "--wait-converged",
        ],
    );
    let lab = t.lab();
    let apis = [Api::of(&lab, "h1"), Api::of(&lab, "h2")];

    t.cli(&["partition", "h1", "/", "h2"]);
    until(15, "each side sees the other gone", || async {
        let mut gone = true;
        for api in &apis {
            gone &= api.host_statuses().await.iter().any(|s| s != "alive");
        }
        gone
    })
    .await;

    // Each side: its organization makes race2 and a machine in it.
    let mut made = Vec::new();
    for (api, org) in apis.iter().zip(["org-a", "org-b"]) {
        let (s, app) = api
            .post("/v1/apps", json!({"app_name": "race2", "org_slug": org}))
            .await;
        assert_eq!(s, StatusCode::CREATED, "{org}: {app}");
        let id = app["id"].as_str().unwrap().to_string();
        let (s, m) = api
            .call_as(
                Method::POST,
                "/v1/apps/race2/machines",
                &id,
                Some(sleeper()),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{org}'s machine: {m}");
        let machine = m["id"].as_str().unwrap().to_string();
        let wait = format!("/v1/apps/race2/machines/{machine}/wait?state=started&timeout=30");
        let (s, v) = api.get(&wait).await;
        assert_eq!(s, StatusCode::OK, "{org}'s machine starts: {v}");
        made.push((org, id, machine));
    }

    t.cli(&["heal"]);
    until(30, "every catalog agrees after heal", || async {
        let (a, b) = (apis[0].digest().await, apis[1].digest().await);
        a.is_some() && a == b
    })
    .await;

    // Every host names the same app, one of the two; the other lost the name.
    let (s, app) = apis[0].get("/v1/apps/race2").await;
    assert_eq!(s, StatusCode::OK, "{app}");
    let winner = made
        .iter()
        .position(|(_, id, _)| app["id"] == id.as_str())
        .unwrap_or_else(|| panic!("the app of the name is neither: {app}"));
    let (win_org, win_id, win_machine) = &made[winner];
    let (lose_org, lose_id, lose_machine) = &made[1 - winner];
    until(
        20,
        "the loser's machine is stopped by its owner",
        || async { state(&apis[0], lose_machine).await == "stopped" },
    )
    .await;
    for api in &apis {
        assert_eq!(state(api, win_machine).await, "started", "{}", api.base);
        let (s, v) = api.get("/v1/apps/race2").await;
        assert_eq!(s, StatusCode::OK, "{v}");
        assert_eq!(v["id"], win_id.as_str(), "{}: {v}", api.base);
        assert_eq!(v["organization"]["slug"], *win_org);

        let (s, v) = api.get(&format!("/v1/apps?org_slug={lose_org}")).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        assert_eq!(v["apps"][0]["id"], lose_id.as_str(), "{v}");
        assert_eq!(v["apps"][0]["status"], "name_conflict", "{v}");

        // The loser's organization: 409 naming the winner, on a create and on a start.
        let (s, v) = api
            .call_as(
                Method::POST,
                "/v1/apps/race2/machines",
                lose_id,
                Some(sleeper()),
            )
            .await;
        assert_eq!(s, StatusCode::CONFLICT, "{}: {v}", api.base);
        assert!(v["error"].as_str().unwrap().contains(win_org), "{v}");
        let start = format!("/v1/apps/race2/machines/{lose_machine}/start");
        let (s, v) = api.call(Method::POST, &start, None).await;
        assert_eq!(s, StatusCode::CONFLICT, "{}: {v}", api.base);

        // Only the winner's machine is the app's.
        let (s, v) = api.get("/v1/apps/race2/machines").await;
        assert_eq!(s, StatusCode::OK, "{v}");
        let ids: Vec<&str> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, [win_machine.as_str()], "{}", api.base);
    }

    // The winner's organization is untouched: it makes another machine.
    let (s, v) = apis[winner]
        .call_as(
            Method::POST,
            "/v1/apps/race2/machines",
            win_id,
            Some(sleeper()),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    t.cli(&["down"]);
}
