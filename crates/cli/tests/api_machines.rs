//! The Fly Machines API on a 3-agent loopback cluster, driven with a plain HTTP client the
//! way third-party clients drive it: the whole machine lifecycle, the field spellings of
//! reference/fly.md §5, bad input. Concurrent creates racing for capacity, batches:
//! `api_machine_capacity.rs`. Hosts that die or are down under the API:
//! `api_host_faults.rs`.

use crate::common;

use bazaar_testkit::{api_token, start_cluster};
use common::*;
use reqwest::{Client, Method, StatusCode};
use serde_json::{json, Value};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machine_lifecycle_through_the_api() {
    let agents = start_cluster(std::path::Path::new(EXE), 3, |_, _| {}).unwrap();
    let fly = Fly::new(&agents[1]);
    let (s, v) = fly
        .post("/apps", json!({"app_name": "web", "org_slug": "personal"}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = fly
        .post("/apps", json!({"app_name": "web", "org_slug": "personal"}))
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(v["status"], "name_taken");
    let (s, v) = fly.get("/apps?org_slug=personal").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["total_apps"], 1);

    // Create: placed by the market on some host, answered by it.
    let (s, m) = fly
        .post("/apps/web/machines", json!({"config": process_config(&["sh", "-c", "trap 'true' USR1; while true; do sleep 0.1; done"]), "region": "local", "some_unknown_field": 1}))
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let id = m["id"].as_str().unwrap().to_string();
    wait_started(&fly, "web", &id).await;
    let (_, m) = fly.get(&format!("/apps/web/machines/{id}")).await;
    assert_eq!(m["state"], "started");
    assert_eq!(m["host_status"], "ok");
    // Why it landed there.
    let (s, p) = fly.get(&format!("/apps/web/machines/{id}/placement")).await;
    assert_eq!(s, StatusCode::OK, "{p}");
    assert_eq!(p["winners"][0], m["host_id"]);
    assert!(!p["rounds"][0]["asked"].as_array().unwrap().is_empty());

    // The list (from the catalog), full and summary, with filters.
    let listed = bazaar_testkit::eventually(Duration::from_secs(5), || async {
        let (_, v) = fly.get("/apps/web/machines").await;
        (v.as_array()?.len() == 1).then_some(v)
    })
    .await
    .unwrap();
    assert_eq!(listed[0]["id"], id.as_str());
    assert!(
        listed[0]["config"]["init"].is_object(),
        "full objects come from the owner"
    );
    let (_, v) = fly
        .get("/apps/web/machines?summary=true&state=started,stopped")
        .await;
    assert!(v[0].get("config").is_none());
    let (_, v) = fly.get("/apps/web/machines?region=elsewhere").await;
    assert_eq!(v.as_array().unwrap().len(), 0);

    // Stop (empty body), start, restart with the query spellings, signal by number.
    let (s, _) = fly
        .call(Method::POST, &format!("/apps/web/machines/{id}/stop"), None)
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = fly
        .get(&format!(
            "/apps/web/machines/{id}/wait?state=stopped&timeout=30"
        ))
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, v) = fly
        .post(&format!("/apps/web/machines/{id}/start"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["previous_state"], "stopped");
    wait_started(&fly, "web", &id).await;
    let (s, _) = fly
        .call(
            Method::POST,
            &format!("/apps/web/machines/{id}/restart?timeout=5s&signal=SIGTERM"),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    wait_started(&fly, "web", &id).await;
    let (s, _) = fly
        .post(
            &format!("/apps/web/machines/{id}/signal"),
            json!({"signal": 10}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);

    // Leases: ttl in the query (fly-go), wrapped answer, 409 without the nonce.
    let (s, l) = fly
        .call(
            Method::POST,
            &format!("/apps/web/machines/{id}/lease?ttl=30"),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{l}");
    assert_eq!(l["status"], "success");
    let nonce = l["data"]["nonce"].as_str().unwrap().to_string();
    let (s, v) = fly
        .post(&format!("/apps/web/machines/{id}/cordon"), json!({}))
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    let (s, _) = fly
        .call_leased(
            Method::POST,
            &format!("/apps/web/machines/{id}/cordon"),
            None,
            Some(&nonce),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = fly
        .call_leased(
            Method::DELETE,
            &format!("/apps/web/machines/{id}/lease"),
            None,
            Some(&nonce),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = fly
        .post(&format!("/apps/web/machines/{id}/uncordon"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK);

    // Metadata, exec, logs, events, versions.
    let (s, _) = fly
        .post(
            &format!("/apps/web/machines/{id}/metadata/role"),
            json!({"value": "primary"}),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (_, v) = fly.get(&format!("/apps/web/machines/{id}/metadata")).await;
    assert_eq!(v["role"], "primary");
    let found = bazaar_testkit::eventually(Duration::from_secs(5), || async {
        let (_, v) = fly.get("/apps/web/machines?metadata.role=primary").await;
        (v.as_array()?.len() == 1).then_some(())
    })
    .await;
    assert!(found.is_ok(), "metadata filter on list");
    let (s, v) = fly
        .post(
            &format!("/apps/web/machines/{id}/exec"),
            json!({"command": ["sh", "-c", "echo hello"]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["stdout"], "hello\n");
    let (s, _) = fly.get(&format!("/apps/web/machines/{id}/logs")).await;
    assert_eq!(s, StatusCode::OK);
    let (_, ev) = fly.get(&format!("/apps/web/machines/{id}/events")).await;
    assert!(ev.as_array().unwrap().iter().any(|e| e["type"] == "launch"));

    // Update: whole config, current_version checked.
    let (_, m) = fly.get(&format!("/apps/web/machines/{id}")).await;
    let version = m["instance_id"].as_str().unwrap().to_string();
    let mut cfg = process_config(&["sleep", "2000"]);
    cfg["env"] = json!({"V": "2"});
    let (s, v) = fly
        .post(
            &format!("/apps/web/machines/{id}"),
            json!({"config": cfg, "current_version": "01WRONG"}),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    let (s, v) = fly
        .call(
            Method::PUT,
            &format!("/apps/web/machines/{id}"),
            Some(json!({"config": cfg, "current_version": version})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let new_version = v["instance_id"].as_str().unwrap().to_string();
    let (s, _) = fly
        .get(&format!(
            "/apps/web/machines/{id}/wait?state=started&version={new_version}&timeout=30"
        ))
        .await;
    assert_eq!(s, StatusCode::OK);
    let (_, vs) = fly.get(&format!("/apps/web/machines/{id}/versions")).await;
    assert_eq!(vs.as_array().unwrap().len(), 2);

    // Destroy with fly-go's `kill`, then it lists only with include_deleted.
    let (s, _) = fly
        .call(
            Method::DELETE,
            &format!("/apps/web/machines/{id}?kill=true"),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = fly
        .get(&format!(
            "/apps/web/machines/{id}/wait?state=destroyed&timeout=30"
        ))
        .await;
    assert_eq!(s, StatusCode::OK);
    bazaar_testkit::eventually(Duration::from_secs(5), || async {
        let (_, v) = fly.get("/apps/web/machines").await;
        v.as_array()?.is_empty().then_some(())
    })
    .await
    .unwrap();
    let (_, v) = fly.get("/apps/web/machines?include_deleted=true").await;
    assert_eq!(v.as_array().unwrap().len(), 1);

    // Regions and a placement dry run change nothing.
    let (_, r) = fly.get("/platform/regions").await;
    assert_eq!(r["regions"][0]["code"], "local");
    let (s, p) = fly.post("/platform/placements", json!({"compute": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256}, "region": "local", "count": 4})).await;
    assert_eq!(s, StatusCode::OK, "{p}");
    assert_eq!(p["regions"][0]["count"], 4);
    for a in &agents {
        assert_eq!(
            a.client().info().await.unwrap().num_reservations,
            0,
            "dry run released everything"
        );
    }
    let (s, _) = fly.call(Method::DELETE, "/apps/web", None).await;
    assert_eq!(s, StatusCode::ACCEPTED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fly_field_spellings_both_work() {
    let agents = start_cluster(std::path::Path::new(EXE), 1, |_, _| {}).unwrap();
    let fly = Fly::new(&agents[0]);
    fly.post("/apps", json!({"name": "quirks"})).await;
    let mut cfg = process_config(&[
        "sh",
        "-c",
        "trap 'exit 0' TERM INT; trap 'true' USR1 USR2; while true; do sleep 0.05; done",
    ]);
    cfg["services"] = json!([{"internal_port": 8080, "protocol": "tcp", "autostop": "stop", "autostart": true},
                             {"internal_port": 8081, "protocol": "tcp", "autostop": false}]);
    cfg["stop_config"] = json!({"signal": "SIGTERM", "timeout": 5000000000u64});
    cfg["checks"] = json!({"alive": {"type": "tcp", "port": 8080, "interval": "15s", "timeout": 2000000000u64}});
    let (s, m) = fly
        .post("/apps/quirks/machines", json!({"config": cfg}))
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let id = m["id"].as_str().unwrap().to_string();
    // autostop is written back as a bool for stop/off; durations as Go strings.
    assert_eq!(m["config"]["services"][0]["autostop"], true);
    assert_eq!(m["config"]["services"][1]["autostop"], false);
    assert_eq!(m["config"]["stop_config"]["timeout"], "5s");
    assert_eq!(m["config"]["checks"]["alive"]["timeout"], "2s");
    let version = m["instance_id"].as_str().unwrap().to_string();
    // wait: `instance_id` and `version`; `state` repeated and comma-separated.
    for q in [
        format!("state=started&instance_id={version}"),
        format!("state=started&version={version}"),
        "state=stopped&state=started&timeout=10".to_string(),
        "state=stopped,started&timeout=10".to_string(),
    ] {
        let (s, v) = fly
            .get(&format!("/apps/quirks/machines/{id}/wait?{q}"))
            .await;
        assert_eq!(s, StatusCode::OK, "{q}: {v}");
    }
    let (s, v) = fly
        .get(&format!(
            "/apps/quirks/machines/{id}/wait?state=stopped&timeout=1"
        ))
        .await;
    assert_eq!(s, StatusCode::REQUEST_TIMEOUT, "{v}");
    // lease ttl in the body or in the query.
    let (s, l) = fly
        .post(
            &format!("/apps/quirks/machines/{id}/lease"),
            json!({"ttl": 10, "description": "deploy"}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{l}");
    let nonce = l["data"]["nonce"].as_str().unwrap().to_string();
    let (s, l2) = fly
        .call_leased(
            Method::POST,
            &format!("/apps/quirks/machines/{id}/lease?ttl=20"),
            None,
            Some(&nonce),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "refresh with the nonce: {l2}");
    fly.call_leased(
        Method::DELETE,
        &format!("/apps/quirks/machines/{id}/lease"),
        None,
        Some(&nonce),
    )
    .await;
    // signal as a name or a number.
    let (s, _) = fly
        .post(
            &format!("/apps/quirks/machines/{id}/signal"),
            json!({"signal": "SIGUSR1"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = fly
        .post(
            &format!("/apps/quirks/machines/{id}/signal"),
            json!({"signal": 12}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    // stop with a body of Go-string and integer durations.
    let (s, _) = fly
        .post(
            &format!("/apps/quirks/machines/{id}/stop"),
            json!({"signal": "SIGTERM", "timeout": "3s"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    fly.get(&format!(
        "/apps/quirks/machines/{id}/wait?state=stopped&timeout=30"
    ))
    .await;
    fly.post(&format!("/apps/quirks/machines/{id}/start"), json!({}))
        .await;
    wait_started(&fly, "quirks", &id).await;
    let (s, _) = fly
        .post(
            &format!("/apps/quirks/machines/{id}/stop"),
            json!({"timeout": 3000000000u64}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    fly.get(&format!(
        "/apps/quirks/machines/{id}/wait?state=stopped&timeout=30"
    ))
    .await;
    // DELETE with `force` (spec) as well as `kill` (fly-go, other test).
    let (s, _) = fly
        .call(
            Method::DELETE,
            &format!("/apps/quirks/machines/{id}?force=true"),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    // FlyV1 tokens are accepted too.
    let r = Client::new()
        .get(format!("{}/apps", fly.base))
        .header("authorization", format!("FlyV1 {}", api_token()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_the_right_4xx_and_changes_nothing() {
    let agents = start_cluster(std::path::Path::new(EXE), 1, |_, _| {}).unwrap();
    let fly = Fly::new(&agents[0]);
    fly.post("/apps", json!({"app_name": "bad"})).await;
    let bad_json = Client::new()
        .post(format!("{}/apps/bad/machines", fly.base))
        .bearer_auth(api_token())
        .header("content-type", "application/json")
        .body("{\"config\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(bad_json.status(), StatusCode::BAD_REQUEST);
    let body: Value = bad_json.json().await.unwrap();
    assert!(
        body["error"].as_str().unwrap().contains("invalid JSON"),
        "{body}"
    );
    let huge = "x".repeat(3 * 1024 * 1024);
    let r = Client::new()
        .post(format!("{}/apps/bad/machines", fly.base))
        .bearer_auth(api_token())
        .header("content-type", "application/json")
        .body(format!("{{\"config\": {{\"image\": \"{huge}\"}}}}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body: Value = r.json().await.unwrap();
    assert!(
        body["error"].as_str().unwrap().contains("too large"),
        "{body}"
    );
    for name in ["../etc", "a\u{7}b", "UPPER", "x/y", ""] {
        let (s, v) = fly.post("/apps", json!({"app_name": name})).await;
        assert!(
            s == StatusCode::UNPROCESSABLE_ENTITY || s == StatusCode::BAD_REQUEST,
            "{name:?}: {s} {v}"
        );
    }
    let (s, v) = fly
        .post(
            "/apps/bad/machines",
            json!({"config": process_config(&["sleep", "1"]), "name": "../../x"}),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let (s, _) = fly
        .post(
            "/apps/nope/machines",
            json!({"config": process_config(&["sleep", "1"])}),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = fly.get("/apps/bad/machines/00000000000000").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = fly.get("/apps/bad/machines/..%2F..%2Fhost").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let mut cfg = process_config(&["sleep", "1"]);
    cfg["guest"] = json!({"cpu_kind": "shared", "cpus": 64, "memory_mb": -1});
    let (s, v) = fly.post("/apps/bad/machines", json!({"config": cfg})).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let (s, v) = fly
        .post(
            "/apps/bad/machines",
            json!({"config": process_config(&["sleep", "1"]), "region": "atlantis"}),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("known regions: local"),
        "{v}"
    );
    let (s, m) = fly
        .post(
            "/apps/bad/machines",
            json!({"config": process_config(&["sleep", "1000"])}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let id = m["id"].as_str().unwrap();
    wait_started(&fly, "bad", id).await;
    let (_, l) = fly
        .post(
            &format!("/apps/bad/machines/{id}/lease"),
            json!({"ttl": 30}),
        )
        .await;
    assert_eq!(l["status"], "success");
    let (s, _) = fly
        .call_leased(
            Method::POST,
            &format!("/apps/bad/machines/{id}/stop"),
            Some(json!({})),
            Some("wrongnonce00"),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT);
    let r = Client::new()
        .get(format!("{}/apps", fly.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    // Nothing changed: one machine, still started.
    let (_, v) = fly.get("/apps/bad/machines?include_deleted=true").await;
    assert_eq!(v.as_array().unwrap().len(), 1);
    assert_eq!(v[0]["state"], "started");
}

/// Fly's organization-wide lists (`/v1/orgs/{org}/machines`, `/volumes`: across the
/// org's apps, paged by `updated_at`, filtered by what the token may read) and what the
/// agents say of their region (`[region_info]` in their config files, merged per region)
/// in `/v1/platform/regions`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn org_wide_lists_and_what_agents_say_of_their_region() {
    let dir = scratch();
    let configs: Vec<String> = [
        "[region_info]\nname = \"Local, Loopback\"\nlatitude = 52.37\nlongitude = 4.89\n",
        "[region_info]\ngeo_region = \"eu\"\ngateway = false\n",
    ]
    .iter()
    .enumerate()
    .map(|(i, text)| {
        let path = dir.path().join(format!("agent{i}.toml"));
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    })
    .collect();
    let agents = start_cluster(std::path::Path::new(EXE), 2, |i, o| {
        o.extra_args.extend(["--config".into(), configs[i].clone()]);
    })
    .unwrap();
    let fly = Fly::new(&agents[0]);

    // Each host says part of the region; every field someone said is answered.
    let region = bazaar_testkit::eventually(Duration::from_secs(10), || async {
        let (_, v) = fly.get("/platform/regions").await;
        let r = v["regions"][0].clone();
        (r["hosts"] == 2 && r["geo_region"] == "eu" && r["latitude"].is_number()).then_some(r)
    })
    .await
    .unwrap();
    assert_eq!(region["code"], "local");
    assert_eq!(region["name"], "Local, Loopback");
    assert_eq!(region["latitude"], 52.37);
    assert_eq!(region["longitude"], 4.89);
    assert_eq!(region["gateway_available"], false);

    // Apps in two orgs, machines in each.
    let mut ids: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
    for (app, org, machines) in [("a1", "acme", 2), ("a2", "acme", 1), ("b1", "other", 1)] {
        let (s, v) = fly
            .post("/apps", json!({"app_name": app, "org_slug": org}))
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        for _ in 0..machines {
            let (s, m) = fly
                .post(
                    &format!("/apps/{app}/machines"),
                    json!({"config": process_config(&["sleep", "100"]), "skip_launch": true}),
                )
                .await;
            assert_eq!(s, StatusCode::OK, "{m}");
            ids.entry(app)
                .or_default()
                .push(m["id"].as_str().unwrap().to_string());
        }
    }
    let (s, v) = fly
        .post(
            "/apps/a1/volumes",
            json!({"name": "data", "size_gb": 1, "region": "local"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let volume = v["id"].as_str().unwrap().to_string();

    let acme = bazaar_testkit::eventually(Duration::from_secs(10), || async {
        let (_, v) = fly.get("/orgs/acme/machines").await;
        (v["machines"].as_array()?.len() == 3).then_some(v)
    })
    .await
    .unwrap();
    let listed: Vec<&str> = acme["machines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    let mut expected: Vec<&str> = ids["a1"]
        .iter()
        .chain(&ids["a2"])
        .map(String::as_str)
        .collect();
    let mut sorted = listed.clone();
    sorted.sort();
    expected.sort();
    assert_eq!(sorted, expected, "only acme's machines: {acme}");
    let updated: Vec<&str> = acme["machines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["updated_at"].as_str().unwrap())
        .collect();
    assert!(updated.windows(2).all(|w| w[0] <= w[1]), "{updated:?}");
    assert_eq!(acme["last_machine_id"], *listed.last().unwrap());
    assert_eq!(acme["next_cursor"], Value::Null);
    assert_eq!(acme["error_regions"], json!([]));

    // Pages: two, then the rest from the cursor, together the whole list.
    let (s, first) = fly.get("/orgs/acme/machines?limit=2").await;
    assert_eq!(s, StatusCode::OK, "{first}");
    assert_eq!(first["machines"].as_array().unwrap().len(), 2);
    let cursor = first["next_cursor"]
        .as_str()
        .expect("a next page")
        .to_string();
    let (s, rest) = fly
        .get(&format!("/orgs/acme/machines?limit=2&cursor={cursor}"))
        .await;
    assert_eq!(s, StatusCode::OK, "{rest}");
    assert_eq!(rest["next_cursor"], Value::Null);
    let paged: Vec<&str> = first["machines"]
        .as_array()
        .unwrap()
        .iter()
        .chain(rest["machines"].as_array().unwrap())
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(paged, listed);
    let (s, v) = fly
        .get("/orgs/acme/machines?updated_after=2999-01-01T00:00:00Z")
        .await;
    assert_eq!((s, v["machines"].clone()), (StatusCode::OK, json!([])));
    for bad in ["updated_after=soon", "limit=0", "limit=501", "cursor=nope"] {
        let (s, v) = fly.get(&format!("/orgs/acme/machines?{bad}")).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}: {v}");
        assert!(v["error"].is_string(), "{bad}: {v}");
    }

    // Another org's list shows only its own.
    let (_, other) = fly.get("/orgs/other/machines").await;
    assert_eq!(other["machines"][0]["id"], ids["b1"][0].as_str());
    assert_eq!(other["machines"].as_array().unwrap().len(), 1);

    // A token for a1 sees a1's machines and volumes only.
    let token = bazaar_testkit::tokens::mint(&bazaar_auth::Scope {
        apps: ["a1".to_string()].into(),
        ..Default::default()
    });
    let scoped = reqwest::Client::new();
    let get_as = |path: String| {
        let req = scoped
            .get(format!("{}/v1{path}", agents[0].url()))
            .bearer_auth(&token);
        async move {
            let resp = req.send().await.unwrap();
            (resp.status(), resp.json::<Value>().await.unwrap())
        }
    };
    let (s, v) = get_as("/orgs/acme/machines".into()).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let mut seen: Vec<&str> = v["machines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    seen.sort();
    let mut a1: Vec<&str> = ids["a1"].iter().map(String::as_str).collect();
    a1.sort();
    assert_eq!(seen, a1);
    let (_, v) = get_as("/orgs/other/machines".into()).await;
    assert_eq!(v["machines"], json!([]));

    // Volumes, org-wide.
    let vols = bazaar_testkit::eventually(Duration::from_secs(10), || async {
        let (_, v) = fly.get("/orgs/acme/volumes").await;
        (v.as_array()?.len() == 1).then_some(v)
    })
    .await
    .unwrap();
    assert_eq!(vols[0]["id"], volume.as_str());
    let (_, v) = fly.get("/orgs/other/volumes").await;
    assert_eq!(v, json!([]));
    let (_, v) = get_as("/orgs/acme/volumes".into()).await;
    assert_eq!(v[0]["id"], volume.as_str());
}

/// fly-admin (a third-party Fly Machines API client from npm, installed by `scripts/test`
/// into `tests/clients/fly-admin`), unchanged, through create → lease → get lease (with its
/// nonce) → release → update → stop → start → delete app: every step passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fly_admin_drives_the_machine_lifecycle_unchanged() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/fly-admin");
    assert!(
        dir.join("node_modules/fly-admin").is_dir(),
        "fly-admin is not installed: run scripts/test, or `npm ci --prefix {}`",
        dir.display()
    );
    let agents = start_cluster(std::path::Path::new(EXE), 2, |_, _| {}).unwrap();
    let out = tokio::process::Command::new("node")
        .arg(dir.join("run.js"))
        .env("BAZAAR_API_URL", agents[1].url())
        .env("BAZAAR_TOKEN", bazaar_testkit::api_token())
        .output()
        .await
        .expect("node runs (scripts/test installs it)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let steps: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not a step: {l}")))
        .collect();
    let names: Vec<&str> = steps.iter().map(|s| s["step"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "create app",
            "create machine",
            "acquire lease",
            "get lease",
            "release lease",
            "update machine",
            "stop machine",
            "start machine",
            "delete app"
        ],
        "{stdout}"
    );
    let failed: Vec<&Value> = steps.iter().filter(|s| s["ok"] != true).collect();
    assert!(failed.is_empty(), "fly-admin steps failed: {failed:?}");
}
