//! Defects of the Machines API (issue 19), each pinned by a test on a real agent: lease
//! nonces shown to anyone (and then, issue 32, hidden from the lease's own GET), destroy
//! ignoring `force`, app deletes that orphan machines, the host interface taking API tokens, config fields accepted and never acted on (`schedule`
//! now runs machines, `files` reach process machines), and bare 405s.

use bazaar_testkit::{start_cluster, AgentOptions, Fly, TestAgent, TEST_SECRET};
use reqwest::{Client, Method, StatusCode};
use serde_json::{json, Value};

const EXE: &str = env!("CARGO_BIN_EXE_bazaar");
/// A Machines API token (not the cluster secret) the test agents accept.
const API_TOKEN: &str = "an-api-token-for-tests-0123456789";

fn process_config(cmd: &[&str]) -> Value {
    json!({"image": "process", "driver": "process", "init": {"exec": cmd},
           "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256}})
}

/// One agent that also accepts [`API_TOKEN`], and an app `app` on it.
async fn agent_with_app(app: &str) -> (TestAgent, Fly, tempfile::TempDir) {
    agent_with_app_and(app, &[]).await
}

/// As [`agent_with_app`], the agent started with `args` too.
async fn agent_with_app_and(app: &str, args: &[&str]) -> (TestAgent, Fly, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("api-tokens");
    std::fs::write(&tokens, format!("{API_TOKEN}\n")).unwrap();
    let mut agents = start_cluster(std::path::Path::new(EXE), 1, |_, o: &mut AgentOptions| {
        o.extra_args
            .extend(["--token-file".into(), tokens.display().to_string()]);
        o.extra_args.extend(args.iter().map(|a| a.to_string()));
    })
    .expect("agent starts");
    let agent = agents.remove(0);
    let fly = Fly::new(&agent);
    fly.create_app(app).await;
    (agent, fly, dir)
}

async fn create(fly: &Fly, app: &str, body: Value) -> String {
    let (s, m) = fly.post(&format!("/apps/{app}/machines"), body).await;
    assert_eq!(s, StatusCode::OK, "{m}");
    m["id"].as_str().unwrap().to_string()
}

/// `method url` with `token`: status, `Allow` header and body.
async fn raw(method: Method, url: &str, token: Option<&str>) -> (StatusCode, String, Value) {
    let mut req = Client::new().request(method, url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.json(&json!({})).send().await.unwrap();
    let status = resp.status();
    let allow = resp
        .headers()
        .get("allow")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let text = resp.text().await.unwrap();
    (
        status,
        allow,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_nonce_is_shown_only_to_callers_that_may_use_leases() {
    let (_agent, fly, _dir) = agent_with_app("leases").await;
    let id = create(
        &fly,
        "leases",
        json!({"config": process_config(&["sleep", "100"]), "skip_launch": true}),
    )
    .await;
    let m = format!("/apps/leases/machines/{id}");
    let (s, l) = fly.post(&format!("{m}/lease"), json!({"ttl": 60})).await;
    assert_eq!(s, StatusCode::CREATED, "{l}");
    let nonce = l["data"]["nonce"].as_str().unwrap().to_string();
    assert!(!nonce.is_empty());

    // Machine views never show it: not in the machine or the list.
    for path in [
        m.clone(),
        format!("{m}?include_leases=true"),
        "/apps/leases/machines".to_string(),
        "/apps/leases/machines?include_leases=true".to_string(),
    ] {
        let (s, v) = fly.get(&path).await;
        assert_eq!(s, StatusCode::OK, "{path}: {v}");
        assert!(
            !v.to_string().contains(&nonce),
            "{path} shows the lease nonce: {v}"
        );
    }
    // GET lease: with its nonce for a caller that may use leases (as on Fly, where `fly
    // machine leases clear` reads it there), without it for a read-only token.
    let (_, v) = fly.get(&format!("{m}/lease")).await;
    assert_eq!(v["status"], "success");
    assert!(v["data"]["expires_at"].as_u64().is_some(), "{v}");
    assert!(v["data"]["owner"].is_string(), "{v}");
    assert_eq!(v["data"]["nonce"], nonce.as_str(), "{v}");
    let read_only = bazaar_testkit::tokens::mint(&bazaar_auth::Scope {
        read_only: true,
        ..bazaar_auth::Scope::default()
    });
    let url = format!("{}{m}/lease", fly.base);
    let (s, _, v) = raw(Method::GET, &url, Some(&read_only)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert!(v["data"]["expires_at"].as_u64().is_some(), "{v}");
    assert!(v["data"].get("nonce").is_none(), "{v}");
    // The lease is shown only with include_leases.
    let (_, v) = fly.get(&m).await;
    assert!(v.get("lease").is_none(), "{v}");
    let (_, v) = fly.get(&format!("{m}?include_leases=true")).await;
    assert!(v["lease"]["expires_at"].as_u64().is_some(), "{v}");
    let (_, v) = fly.get("/apps/leases/machines").await;
    assert!(v[0].get("lease").is_none(), "{v}");
    let (_, v) = fly.get("/apps/leases/machines?include_leases=true").await;
    assert!(v[0]["lease"]["expires_at"].as_u64().is_some(), "{v}");

    // The holder still proves itself with the nonce it was given.
    let (s, v) = fly
        .call_leased(Method::POST, &format!("{m}/cordon"), None, Some(&nonce))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    // A create with lease_ttl answers its nonce to its creator, as on Fly.
    let (s, v) = fly
        .post(
            "/apps/leases/machines",
            json!({"config": process_config(&["sleep", "100"]), "skip_launch": true, "lease_ttl": 30}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert!(v["nonce"].as_str().is_some_and(|n| !n.is_empty()), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroying_a_running_machine_needs_force() {
    let (_agent, fly, _dir) = agent_with_app("force").await;
    let id = create(
        &fly,
        "force",
        json!({"config": process_config(&["sleep", "1000"])}),
    )
    .await;
    fly.wait_state("force", &id, "started").await;
    let m = format!("/apps/force/machines/{id}");
    let (s, v) = fly.delete(&m).await;
    assert_eq!(s, StatusCode::PRECONDITION_FAILED, "{v}");
    let why = v["error"].as_str().unwrap();
    assert!(why.contains("force=true"), "{why}");
    // Nothing changed.
    let (_, v) = fly.get(&m).await;
    assert_eq!(v["state"], "started", "{v}");
    let (s, v) = fly.delete(&format!("{m}?force=true")).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    fly.wait_state("force", &id, "destroyed").await;

    // A machine that is not running goes without force.
    let id = create(
        &fly,
        "force",
        json!({"config": process_config(&["sleep", "1000"]), "skip_launch": true}),
    )
    .await;
    let (s, v) = fly.delete(&format!("/apps/force/machines/{id}")).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    fly.wait_state("force", &id, "destroyed").await;
}

/// Issue 32 item 3: a refused app delete changes nothing (it used to destroy the machines
/// it could before answering 409).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_with_a_machine_that_cannot_be_destroyed_is_kept_whole() {
    let (_agent, fly, _dir) = agent_with_app("keep").await;
    let config = process_config(&["sleep", "1000"]);
    let free = create(&fly, "keep", json!({"config": config})).await;
    let leased = create(&fly, "keep", json!({"config": config})).await;
    fly.wait_state("keep", &free, "started").await;
    let (s, l) = fly
        .post(
            &format!("/apps/keep/machines/{leased}/lease"),
            json!({"ttl": 120}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{l}");
    let nonce = l["data"]["nonce"].as_str().unwrap().to_string();

    let (s, v) = fly.delete("/apps/keep").await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    let why = v["error"].as_str().unwrap();
    assert!(why.contains(&leased), "names the machine: {why}");
    assert!(why.contains("lease"), "says why: {why}");
    assert!(why.contains("nothing was changed"), "{why}");
    assert!(!why.contains(&free), "{why}");
    // The app and every machine stay, the free one running and not leased by the delete.
    let (s, _) = fly.get("/apps/keep").await;
    assert_eq!(s, StatusCode::OK);
    let (_, v) = fly.get(&format!("/apps/keep/machines/{leased}")).await;
    assert_ne!(v["state"], "destroyed", "{v}");
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let (_, v) = fly
        .get(&format!("/apps/keep/machines/{free}?include_leases=true"))
        .await;
    assert_eq!(
        v["state"], "started",
        "the free machine was not touched: {v}"
    );
    assert!(
        v.get("lease").is_none(),
        "the delete let go of its lease: {v}"
    );

    // Once the lease is let go, the app goes.
    let (s, _) = fly
        .call_leased(
            Method::DELETE,
            &format!("/apps/keep/machines/{leased}/lease"),
            None,
            Some(&nonce),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, v) = fly.delete("/apps/keep").await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let (s, _) = fly.get("/apps/keep").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    // Its machines go with it: once destroyed, a machine of the deleted app is not found
    // (while it still runs, its row is live and answered).
    let gone = bazaar_testkit::eventually(std::time::Duration::from_secs(30), || async {
        let (s, _) = fly.get(&format!("/apps/keep/machines/{free}")).await;
        (s == StatusCode::NOT_FOUND).then_some(())
    })
    .await;
    assert!(
        gone.is_ok(),
        "machine {free} of the deleted app was not destroyed"
    );
}

/// Issue 32 item 2: machines destroyed just before (their destroy still running, as when a
/// client destroys every machine and then the app) are not in the way of the app's delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_an_app_passes_over_machines_already_destroyed() {
    let (_agent, fly, _dir) = agent_with_app("gone").await;
    let config = process_config(&["sleep", "1000"]);
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(create(&fly, "gone", json!({"config": config})).await);
    }
    let settled = create(&fly, "gone", json!({"config": config})).await;
    for id in &ids {
        fly.wait_state("gone", id, "started").await;
    }
    let (s, v) = fly
        .delete(&format!("/apps/gone/machines/{settled}?force=true"))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    fly.wait_state("gone", &settled, "destroyed").await;
    for id in &ids {
        let (s, v) = fly
            .delete(&format!("/apps/gone/machines/{id}?force=true"))
            .await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }
    let (s, v) = fly.delete("/apps/gone").await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let (s, _) = fly.get("/apps/gone").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

/// An app's delete asked of a node that did not make the app goes to the node that did,
/// before anything is done: all or nothing there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_delete_through_another_node_is_all_or_nothing_too() {
    let agents = start_cluster(std::path::Path::new(EXE), 2, |_, _: &mut AgentOptions| {})
        .expect("agents start");
    let (maker, other) = (Fly::new(&agents[0]), Fly::new(&agents[1]));
    maker.create_app("far").await;
    bazaar_testkit::eventually(std::time::Duration::from_secs(10), || async {
        (other.get("/apps/far").await.0 == StatusCode::OK).then_some(())
    })
    .await
    .expect("the other node learns the app");
    let config = process_config(&["sleep", "1000"]);
    let free = create(&other, "far", json!({"config": config})).await;
    let leased = create(&other, "far", json!({"config": config})).await;
    other.wait_state("far", &free, "started").await;
    let (s, l) = other
        .post(
            &format!("/apps/far/machines/{leased}/lease"),
            json!({"ttl": 120}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{l}");
    let nonce = l["data"]["nonce"].as_str().unwrap().to_string();
    // At once: the maker takes its leases on the machines its catalog lists and on those
    // their hosts hold (the rows of machines just created through another node may not
    // have reached it yet).

    let (s, v) = other.delete("/apps/far").await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    let why = v["error"].as_str().unwrap();
    assert!(
        why.contains(&leased) && why.contains("nothing was changed"),
        "{why}"
    );
    let (_, v) = other.get(&format!("/apps/far/machines/{free}")).await;
    assert_eq!(v["state"], "started", "{v}");

    let (s, _) = other
        .call_leased(
            Method::DELETE,
            &format!("/apps/far/machines/{leased}/lease"),
            None,
            Some(&nonce),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, v) = other.delete("/apps/far").await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let (s, _) = maker.get("/apps/far").await;
    assert_eq!(s, StatusCode::NOT_FOUND, "the maker deleted its record");
    // The owners destroy in the background (202) and gossip the tombstones: under a loaded
    // CI machine that took over 10 s once (1.7 s quiet).
    bazaar_testkit::eventually(std::time::Duration::from_secs(30), || async {
        // The catalog view: the cluster secret's, not the API token's.
        let rows = agents[1]
            .client()
            .catalog_machines(Some("far"), true)
            .await
            .ok()?;
        let destroyed = |id: &str| {
            rows.iter()
                .find(|r| r.id == id)
                .map(|r| r.state == "destroyed")
        };
        (destroyed(&free)? && destroyed(&leased)?).then_some(())
    })
    .await
    .expect("both machines are destroyed");
}

/// Issue 31 item 2: an app made again under a deleted app's name, by another
/// organization, starts empty: no machine history (the release record), no audit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_made_again_under_a_deleted_apps_name_starts_empty() {
    let (_agent, fly, _dir) = agent_with_app("shop").await;
    let id = create(
        &fly,
        "shop",
        json!({"config": process_config(&["sleep", "1000"]), "skip_launch": true}),
    )
    .await;
    let (s, v) = fly.delete(&format!("/apps/shop/machines/{id}")).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    fly.wait_state("shop", &id, "destroyed").await;
    let (_, v) = fly.get("/apps/shop/machines?include_deleted=true").await;
    assert_eq!(
        v.as_array().map(Vec::len),
        Some(1),
        "the history is there: {v}"
    );
    let (s, v) = fly.delete("/apps/shop").await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let (s, v) = fly.get("/apps/shop/audit").await;
    assert_eq!(s, StatusCode::NOT_FOUND, "a deleted app's audit: {v}");

    let (s, v) = fly
        .post("/apps", json!({"app_name": "shop", "org_slug": "beta"}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = fly.get("/apps/shop/machines?include_deleted=true").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v, json!([]), "the old machines are not the new app's");
    for path in [
        format!("/apps/shop/machines/{id}"),
        format!("/apps/shop/machines/{id}/versions"),
        format!("/apps/shop/machines/{id}/events"),
    ] {
        let (s, v) = fly.get(&path).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{path}: {v}");
    }
    let (s, v) = fly.get("/apps/shop/audit").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let entries = v["entries"].as_array().unwrap();
    let paths: Vec<&str> = entries
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["/v1/apps"], "only the new app's creation: {v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_interface_takes_only_the_cluster_secret() {
    let (agent, _fly, _dir) = agent_with_app("auth").await;
    let base = agent.url();
    let host_calls = [
        (Method::POST, "/host/v1/bids"),
        (Method::POST, "/host/v1/reservations/r_x/claim"),
        (Method::POST, "/host/v1/machines"),
        (Method::GET, "/host/v1/info"),
        (Method::GET, "/host/v1/images"),
        (Method::GET, "/host/v1/machines/0123456789abcd/traffic"),
        (Method::GET, "/v1/catalog/hosts"),
        (Method::GET, "/v1/catalog/machines"),
    ];
    for (method, path) in &host_calls {
        let url = format!("{base}{path}");
        let (s, _, v) = raw(method.clone(), &url, Some(API_TOKEN)).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{method} {path}: {v}");
        assert!(
            v["error"].as_str().unwrap().contains("cluster secret"),
            "{v}"
        );
        let (s, _, _) = raw(method.clone(), &url, None).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{method} {path}");
        let (s, _, v) = raw(method.clone(), &url, Some(TEST_SECRET)).await;
        assert!(
            s != StatusCode::FORBIDDEN && s != StatusCode::UNAUTHORIZED,
            "{method} {path} refuses the cluster secret: {s} {v}"
        );
    }
    // The API token still drives the Machines API, whose calls between nodes (bids,
    // claims, forwarding) carry the cluster secret.
    let api = |method: Method, path: &str| {
        Client::new()
            .request(method, format!("{base}/v1{path}"))
            .bearer_auth(API_TOKEN)
    };
    let resp = api(Method::POST, "/apps/auth/machines")
        .json(&json!({"config": process_config(&["sleep", "100"]), "skip_launch": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let m: Value = resp.json().await.unwrap();
    let id = m["id"].as_str().unwrap();
    let resp = api(Method::GET, &format!("/apps/auth/machines/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let resp = api(Method::GET, "/apps/auth/machines")
        .send()
        .await
        .unwrap();
    let list: Value = resp.json().await.unwrap();
    assert_eq!(
        list[0]["id"], id,
        "the list reads the owner with the secret"
    );
    assert!(list[0]["config"]["init"].is_object(), "{list}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_fields_bazaar_does_not_act_on_are_refused() {
    let (_agent, fly, _dir) = agent_with_app("fields").await;
    let refused = [
        ("dns", json!({"skip_registration": true})),
        (
            "statics",
            json!([{"guest_path": "/srv", "url_prefix": "/s"}]),
        ),
        ("processes", json!([{"name": "x", "cmd": ["sleep", "1"]}])),
        ("schedule", json!("every-minute")),
    ];
    for (field, value) in refused {
        let mut config = process_config(&["sleep", "100"]);
        config[field] = value;
        let (s, v) = fly
            .post("/apps/fields/machines", json!({"config": config}))
            .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{field}: {v}");
        assert!(v["error"].as_str().unwrap().contains(field), "{v}");
    }
    let mut config = process_config(&["sleep", "100"]);
    config["init"]["swap_size_mb"] = json!(512);
    let (s, v) = fly
        .post("/apps/fields/machines", json!({"config": config}))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"].as_str().unwrap().contains("swap_size_mb"), "{v}");
    let mut config = process_config(&["sleep", "100"]);
    config["checks"] = json!({"web": {"type": "http", "port": 80, "headers": [{"name": "bad name", "values": ["x"]}]}});
    let (s, v) = fly
        .post("/apps/fields/machines", json!({"config": config}))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"].as_str().unwrap().contains("headers"), "{v}");
    // GPUs: no host has one, a placement refusal.
    let mut config = process_config(&["sleep", "100"]);
    config["guest"]["gpus"] = json!(1);
    config["guest"]["gpu_kind"] = json!("a100-pcie-40gb");
    let (s, v) = fly
        .post("/apps/fields/machines", json!({"config": config}))
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["status"], "insufficient_capacity", "{v}");
    // Empty values are as good as absent.
    let mut config = process_config(&["sleep", "100"]);
    config["dns"] = json!({});
    config["processes"] = json!([]);
    let id = create(
        &fly,
        "fields",
        json!({"config": config, "skip_launch": true}),
    )
    .await;
    // Nothing refused was created.
    let (_, list) = fly.get("/apps/fields/machines").await;
    let ids: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [id.as_str()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_machine_finds_its_files_in_its_work_dir() {
    use base64::Engine;
    let (_agent, fly, _dir) = agent_with_app("files").await;
    let mut config = process_config(&["sleep", "1000"]);
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    config["files"] = json!([
        {"guest_path": "/etc/app/app.conf", "raw_value": b64("port = 8080\n")},
        {"guest_path": "/run.sh", "raw_value": b64("#!/bin/sh\necho ran\n"), "mode": 0o755},
    ]);
    let id = create(&fly, "files", json!({"config": config})).await;
    fly.wait_state("files", &id, "started").await;
    let exec = |command: Vec<&str>| {
        let command: Vec<String> = command.into_iter().map(str::to_string).collect();
        let fly = fly.clone();
        let path = format!("/apps/files/machines/{id}/exec");
        async move {
            let (s, v) = fly.post(&path, json!({"command": command})).await;
            assert_eq!(s, StatusCode::OK, "{v}");
            v
        }
    };
    let v = exec(vec!["sh", "-c", "cat $BAZAAR_WORK_DIR/etc/app/app.conf"]).await;
    assert_eq!(v["stdout"], "port = 8080\n", "{v}");
    let v = exec(vec!["sh", "-c", "$BAZAAR_WORK_DIR/run.sh"]).await;
    assert_eq!(v["stdout"], "ran\n", "{v}");

    // A path outside the work dir, or no content, is a 400 and creates nothing.
    for bad in [
        json!({"guest_path": "/etc/../../x", "raw_value": b64("x")}),
        json!({"guest_path": "relative", "raw_value": b64("x")}),
        json!({"guest_path": "/etc/x"}),
    ] {
        let mut config = process_config(&["sleep", "1000"]);
        config["files"] = json!([bad]);
        let (s, v) = fly
            .post("/apps/files/machines", json!({"config": config}))
            .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}: {v}");
    }
    let (_, list) = fly.get("/apps/files/machines").await;
    assert_eq!(list.as_array().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_method_or_route_answers_in_the_fly_shape() {
    let (agent, fly, _dir) = agent_with_app("methods").await;
    let base = agent.url();
    let id = create(
        &fly,
        "methods",
        json!({"config": process_config(&["sleep", "100"]), "skip_launch": true}),
    )
    .await;
    let cases = [
        // The API's own routes.
        (Method::PATCH, "/v1/apps".to_string(), "GET"),
        (Method::PUT, "/v1/apps/methods/machines".to_string(), "POST"),
        // Forwarded to the machine's owner.
        (
            Method::GET,
            format!("/v1/apps/methods/machines/{id}/start"),
            "POST",
        ),
        // The host interface.
        (Method::GET, "/host/v1/bids".to_string(), "POST"),
    ];
    for (method, path, allowed) in &cases {
        let token = if path.starts_with("/host/") {
            TEST_SECRET
        } else {
            API_TOKEN
        };
        let (s, allow, v) = raw(method.clone(), &format!("{base}{path}"), Some(token)).await;
        assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}: {v}");
        assert_eq!(v, json!({"error": "method not allowed"}), "{method} {path}");
        assert!(allow.contains(allowed), "{method} {path}: Allow {allow:?}");
    }
    for path in ["/v1/no-such-route", "/host/v1/no-such-route", "/nothing"] {
        let token = if path.starts_with("/host/") {
            TEST_SECRET
        } else {
            API_TOKEN
        };
        let (s, _, v) = raw(Method::GET, &format!("{base}{path}"), Some(token)).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{path}: {v}");
        assert!(v["error"].is_string(), "{path}: {v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_machine_is_started_once_per_interval() {
    // An "hour" of one second.
    let (_agent, fly, _dir) = agent_with_app_and("cron", &["--schedule-hour-ms", "1000"]).await;
    let mut config = process_config(&["true"]);
    config["schedule"] = json!("hourly");
    config["restart"] = json!({"policy": "no"});
    let created = std::time::Instant::now();
    let id = create(&fly, "cron", json!({"config": config})).await;
    let exits = || {
        let fly = fly.clone();
        let path = format!("/apps/cron/machines/{id}/events?limit=50");
        async move {
            let (s, v) = fly.get(&path).await;
            assert_eq!(s, StatusCode::OK, "{v}");
            v.as_array()
                .unwrap()
                .iter()
                .filter(|e| e["type"] == "exit")
                .count()
        }
    };
    // The first run at creation, then one per second.
    bazaar_testkit::eventually(std::time::Duration::from_secs(10), || async {
        (exits().await >= 4).then_some(())
    })
    .await
    .expect("started again on its schedule");
    let runs = exits().await;
    let allowed = created.elapsed().as_secs() as usize + 1;
    assert!(runs <= allowed, "{runs} runs in {:?}", created.elapsed());
    let (_, m) = fly.get(&format!("/apps/cron/machines/{id}")).await;
    assert_eq!(m["config"]["schedule"], "hourly");
}
