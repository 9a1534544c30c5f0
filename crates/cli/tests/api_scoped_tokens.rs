//! Scoped tokens (issue 15) against hostile clients, on real agents that verify them offline
//! with the cluster's public token key (the test kit's): wrong, expired, edited and revoked
//! tokens; a token for one app used on another (404, and the other app's machines never
//! shown); a read-only token trying every mutation (all refused, nothing changed); the
//! process driver refused to an app token without the scope; narrowing offline with the CLI;
//! Fly's `FlyV1` header; and the audit record naming the token of each change.

use bazaar_auth::{Op, Scope};
use bazaar_testkit::{api_token, start_cluster, tokens, TestAgent};
use reqwest::{Client, Method, StatusCode};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::{Duration, Instant, SystemTime};

const EXE: &str = env!("CARGO_BIN_EXE_bazaar");

fn process_config() -> Value {
    json!({"image": "process", "driver": "process", "init": {"exec": ["sleep", "1000"]},
           "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256}})
}

/// `method /v1{path}` on `agent` with `Authorization: <scheme> <token>`: status and body.
async fn call_as(
    agent: &TestAgent,
    scheme: &str,
    token: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut req = Client::new()
        .request(method, format!("{}/v1{path}", agent.url()))
        .header("authorization", format!("{scheme} {token}"));
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn call(
    agent: &TestAgent,
    token: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    call_as(agent, "Bearer", token, method, path, body).await
}

fn apps(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| n.to_string()).collect()
}

/// Runs `bazaar ARGS`, which must succeed; its trimmed stdout.
fn bazaar(args: &[&str]) -> String {
    let out = std::process::Command::new(EXE).args(args).output().unwrap();
    assert!(out.status.success(), "bazaar {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Creates app `app` and a machine in it (not started) with the test org token; the id.
async fn app_with_machine(agent: &TestAgent, app: &str) -> String {
    let (s, b) = call(
        agent,
        api_token(),
        Method::POST,
        "/apps",
        Some(json!({"app_name": app, "org_slug": "personal"})),
    )
    .await;
    assert!(s.is_success(), "{s} {b}");
    let (s, m) = call(
        agent,
        api_token(),
        Method::POST,
        &format!("/apps/{app}/machines"),
        Some(json!({"config": process_config(), "skip_launch": true})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    m["id"].as_str().unwrap().to_string()
}

/// Every mutation of the Machines API on app `app` and its machine `id`.
fn mutations(app: &str, id: &str) -> Vec<(Method, String, Value)> {
    let m = format!("/apps/{app}/machines/{id}");
    vec![
        (
            Method::POST,
            "/apps".into(),
            json!({"app_name": "newapp", "org_slug": "personal"}),
        ),
        (Method::DELETE, format!("/apps/{app}"), json!({})),
        (
            Method::POST,
            format!("/apps/{app}/machines"),
            json!({"config": process_config()}),
        ),
        (
            Method::POST,
            format!("/apps/{app}/machines/batch"),
            json!({"config": process_config(), "count": 2}),
        ),
        (Method::POST, m.clone(), json!({"config": process_config()})),
        (Method::DELETE, m.clone(), json!({})),
        (Method::POST, format!("{m}/start"), json!({})),
        (Method::POST, format!("{m}/stop"), json!({})),
        (Method::POST, format!("{m}/restart"), json!({})),
        (
            Method::POST,
            format!("{m}/signal"),
            json!({"signal": "SIGTERM"}),
        ),
        (Method::POST, format!("{m}/suspend"), json!({})),
        (
            Method::POST,
            format!("{m}/exec"),
            json!({"command": ["id"]}),
        ),
        (Method::POST, format!("{m}/lease"), json!({"ttl": 60})),
        (Method::POST, format!("{m}/cordon"), json!({})),
        (
            Method::PUT,
            format!("{m}/metadata"),
            json!({"metadata": {"k": "v"}}),
        ),
        (
            Method::POST,
            format!("{m}/metadata/k"),
            json!({"value": "v"}),
        ),
        (
            Method::POST,
            format!("/apps/{app}/volumes"),
            json!({"name": "data", "size_gb": 1}),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scoped_tokens_hold_every_request_to_their_scope() {
    let agent = start_cluster(std::path::Path::new(EXE), 1, |_, _| {})
        .expect("agent starts")
        .remove(0);
    let web_machine = app_with_machine(&agent, "web").await;
    let db_machine = app_with_machine(&agent, "db").await;
    let org = tokens::mint(&Scope::default());

    // An org token works, with Fly's header too.
    let (s, _) = call(&agent, &org, Method::GET, "/apps/db/machines", None).await;
    assert_eq!(s, StatusCode::OK);
    let (s, list) = call_as(&agent, "FlyV1", &org, Method::GET, "/apps", None).await;
    assert_eq!(s, StatusCode::OK, "{list}");
    assert_eq!(list["total_apps"], 2);

    // Wrong tokens: garbage, another cluster's key, an unknown plain token. Expired.
    let foreign = bazaar_auth::mint(&bazaar_auth::TokenKey::generate(), &Scope::default()).unwrap();
    let expired = tokens::mint(&Scope {
        expires: Some(SystemTime::now() - Duration::from_secs(5)),
        ..Scope::default()
    });
    for (token, why) in [
        ("bz1_not-a-token", "invalid token"),
        (foreign.as_str(), "invalid token"),
        ("some-plain-token-nobody-issued", "unknown token"),
        (expired.as_str(), "token expired"),
    ] {
        let (s, b) = call(&agent, token, Method::GET, "/apps/web/machines", None).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{token}: {b}");
        assert!(b["error"].as_str().unwrap().contains(why), "{b}");
    }

    // A token for web on db: as if db did not exist, and db is in no list.
    let web_only = tokens::mint(&Scope {
        apps: apps(&["web"]),
        process: false,
        ..Scope::default()
    });
    let (s, list) = call(&agent, &web_only, Method::GET, "/apps", None).await;
    assert_eq!(s, StatusCode::OK);
    let names: Vec<&str> = list["apps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["web"]);
    for path in [
        "/apps/db".to_string(),
        "/apps/db/machines".to_string(),
        format!("/apps/db/machines/{db_machine}"),
        "/apps/db/volumes".to_string(),
        "/apps/db/audit".to_string(),
    ] {
        let (s, b) = call(&agent, &web_only, Method::GET, &path, None).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{path}: {b}");
        assert!(
            !b.to_string().contains(&db_machine),
            "{path} shows db's machine: {b}"
        );
    }
    for (method, path, body) in mutations("db", &db_machine) {
        let (s, b) = call(&agent, &web_only, method.clone(), &path, Some(body)).await;
        let expected = if path == "/apps" {
            StatusCode::FORBIDDEN // creating apps is for org tokens
        } else {
            StatusCode::NOT_FOUND
        };
        assert_eq!(s, expected, "{method} {path}: {b}");
    }
    let (s, m) = call(&agent, &web_only, Method::GET, "/apps/web/machines", None).await;
    assert_eq!(s, StatusCode::OK, "{m}");
    assert_eq!(m.as_array().unwrap().len(), 1);

    // A read-only token tries every mutation: each refused, nothing changed.
    let read_only = tokens::mint(&Scope {
        read_only: true,
        ..Scope::default()
    });
    let before = call(
        &agent,
        &org,
        Method::GET,
        &format!("/apps/db/machines/{db_machine}"),
        None,
    )
    .await
    .1;
    for (method, path, body) in mutations("db", &db_machine) {
        let (s, b) = call(&agent, &read_only, method.clone(), &path, Some(body)).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{method} {path}: {b}");
        assert!(
            b["error"].as_str().unwrap().contains("does not allow"),
            "{b}"
        );
    }
    let (_, after) = call(
        &agent,
        &org,
        Method::GET,
        &format!("/apps/db/machines/{db_machine}"),
        None,
    )
    .await;
    assert_eq!(before, after, "a refused mutation changed the machine");
    let (_, list) = call(&agent, &org, Method::GET, "/apps", None).await;
    assert_eq!(list["total_apps"], 2);
    let (_, machines) = call(&agent, &org, Method::GET, "/apps/db/machines", None).await;
    assert_eq!(machines.as_array().unwrap().len(), 1);
    let (_, lease) = call(
        &agent,
        &org,
        Method::GET,
        &format!("/apps/db/machines/{db_machine}/lease"),
        None,
    )
    .await;
    assert!(
        lease.get("data").is_none_or(|d| d.is_null()),
        "a lease was taken: {lease}"
    );
    let (_, volumes) = call(&agent, &org, Method::GET, "/apps/db/volumes", None).await;
    assert_eq!(volumes.as_array().unwrap().len(), 0);

    // Narrowed offline by the CLI: web, read-only, 10 minutes.
    let narrowed = bazaar(&[
        "token",
        "attenuate",
        &org,
        "--app",
        "web",
        "--read-only",
        "--expires",
        "10m",
    ]);
    let inspect = bazaar(&["token", "inspect", &narrowed]);
    assert!(
        inspect.contains(r#"operation("read")"#) && inspect.contains("\"web\""),
        "{inspect}"
    );
    assert_eq!(
        call(&agent, &narrowed, Method::GET, "/apps/web", None)
            .await
            .0,
        StatusCode::OK
    );
    assert_eq!(
        call(&agent, &narrowed, Method::GET, "/apps/db", None)
            .await
            .0,
        StatusCode::NOT_FOUND
    );
    let stop = format!("/apps/web/machines/{web_machine}/stop");
    assert_eq!(
        call(&agent, &narrowed, Method::POST, &stop, Some(json!({})))
            .await
            .0,
        StatusCode::FORBIDDEN
    );

    // Widened by editing its bytes: refused (never allowed to change anything).
    let body = narrowed.strip_prefix("bz1_").unwrap();
    let mut refused = 0;
    for at in (0..body.len()).step_by(body.len() / 12) {
        let mut chars: Vec<char> = body.chars().collect();
        chars[at] = if chars[at] == 'A' { 'B' } else { 'A' };
        let edited = format!("bz1_{}", chars.into_iter().collect::<String>());
        let (s, b) = call(&agent, &edited, Method::POST, &stop, Some(json!({}))).await;
        assert!(!s.is_success(), "an edited token stopped a machine: {b}");
        if s == StatusCode::UNAUTHORIZED {
            refused += 1;
        }
    }
    assert!(
        refused >= 10,
        "only {refused} edits were refused as invalid"
    );

    // The process driver: refused to an app token without the scope, allowed with it.
    let key_dir = tempfile::tempdir().unwrap();
    let key_file = key_dir.path().join("cluster-token-key");
    tokens::write_key_file(&key_file).unwrap();
    let key = key_file.to_str().unwrap();
    let deployer = bazaar(&[
        "token",
        "create",
        "--key-file",
        key,
        "--app",
        "web",
        "--ops",
        "create,start,stop",
    ]);
    let create = "/apps/web/machines";
    let (s, b) = call(
        &agent,
        &deployer,
        Method::POST,
        create,
        Some(json!({"config": process_config()})),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b}");
    assert!(
        b["error"].as_str().unwrap().contains("process driver"),
        "{b}"
    );
    let (s, b) = call(
        &agent,
        &deployer,
        Method::POST,
        &format!("/apps/web/machines/{web_machine}"),
        Some(json!({"config": process_config()})),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "update to a process config: {b}");
    let (s, b) = call(
        &agent,
        &deployer,
        Method::DELETE,
        &format!("/apps/web/machines/{web_machine}"),
        None,
    )
    .await;
    assert_eq!(
        s,
        StatusCode::FORBIDDEN,
        "destroy is not among its operations: {b}"
    );
    let with_process = bazaar(&[
        "token",
        "create",
        "--key-file",
        key,
        "--app",
        "web",
        "--ops",
        "create",
        "--allow-process",
    ]);
    let (s, b) = call(
        &agent,
        &with_process,
        Method::POST,
        create,
        Some(json!({"config": process_config(), "skip_launch": true})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    // Narrowing it takes the process driver away again.
    let narrowed = bazaar(&["token", "attenuate", &with_process, "--no-process"]);
    let (s, b) = call(
        &agent,
        &narrowed,
        Method::POST,
        create,
        Some(json!({"config": process_config()})),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_revoked_on_one_node_is_refused_on_another() {
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<_> = (0..2)
        .map(|i| dir.path().join(format!("tokens-{i}")))
        .collect();
    for f in &files {
        std::fs::write(f, "").unwrap();
    }
    let agents = start_cluster(std::path::Path::new(EXE), 2, |i, o| {
        o.extra_args.push("--token-file".into());
        o.extra_args.push(files[i].display().to_string());
    })
    .expect("cluster starts");
    let doomed = tokens::mint(&Scope::default());
    let narrowed = bazaar(&["token", "attenuate", &doomed, "--read-only"]);
    let kept = tokens::mint(&Scope {
        ops: BTreeSet::from([Op::Create]),
        ..Scope::default()
    });
    for a in &agents {
        for t in [&doomed, &narrowed, &kept] {
            assert_eq!(
                call(a, t, Method::GET, "/apps", None).await.0,
                StatusCode::OK
            );
        }
    }
    let id = bazaar_auth::describe(&doomed).unwrap().id;
    let out = bazaar(&[
        "token",
        "revoke",
        &id,
        "--token-file",
        files[0].to_str().unwrap(),
    ]);
    assert!(out.contains(&id), "{out}");

    // At once where it was revoked; the narrowed token with it.
    for t in [&doomed, &narrowed] {
        let (s, b) = call(&agents[0], t, Method::GET, "/apps", None).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{b}");
        assert!(b["error"].as_str().unwrap().contains("revoked"), "{b}");
    }
    // Within the catalog's propagation time on the other node, whose file says nothing.
    let started = Instant::now();
    loop {
        match call(&agents[1], &narrowed, Method::GET, "/apps", None)
            .await
            .0
        {
            StatusCode::UNAUTHORIZED => break,
            s => assert_eq!(s, StatusCode::OK),
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "agent 1 still accepts the revoked token"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "revocation reached the other node in {:?}",
        started.elapsed()
    );
    assert_eq!(
        call(&agents[1], &doomed, Method::GET, "/apps", None)
            .await
            .0,
        StatusCode::UNAUTHORIZED
    );
    for a in &agents {
        assert_eq!(
            call(a, &kept, Method::GET, "/apps", None).await.0,
            StatusCode::OK
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_record_names_the_token_of_each_change() {
    let agents = start_cluster(std::path::Path::new(EXE), 2, |_, _| {}).expect("cluster starts");
    let id = app_with_machine(&agents[0], "web").await;
    let operator = tokens::mint(&Scope {
        apps: apps(&["web"]),
        ops: BTreeSet::from([Op::Update]),
        ..Scope::default()
    });
    let operator_id = bazaar_auth::describe(&operator).unwrap().id;
    // A change made through the second node, and one it refused.
    let cordon = format!("/apps/web/machines/{id}/cordon");
    let (cordoned, b) = call(
        &agents[1],
        &operator,
        Method::POST,
        &cordon,
        Some(json!({})),
    )
    .await;
    assert!(cordoned.is_success(), "{cordoned} {b}");
    let destroy = format!("/apps/web/machines/{id}");
    let (s, _) = call(&agents[1], &operator, Method::DELETE, &destroy, None).await;
    assert_eq!(s, StatusCode::FORBIDDEN);

    // Read through the first node, with a read-only token of the app.
    let reader = tokens::mint(&Scope {
        apps: apps(&["web"]),
        read_only: true,
        process: false,
        ..Scope::default()
    });
    let (s, audit) = call(&agents[0], &reader, Method::GET, "/apps/web/audit", None).await;
    assert_eq!(s, StatusCode::OK, "{audit}");
    assert_eq!(audit["unreachable_hosts"], json!([]), "{audit}");
    let entries = audit["entries"].as_array().unwrap();
    let by_operator: Vec<&Value> = entries
        .iter()
        .filter(|e| e["token_id"] == operator_id)
        .collect();
    assert_eq!(by_operator.len(), 2, "{audit}");
    assert_eq!(by_operator[0]["method"], "POST");
    assert_eq!(by_operator[0]["path"], format!("/v1{cordon}"));
    assert_eq!(by_operator[0]["machine_id"], id.as_str());
    assert_eq!(by_operator[0]["status"], cordoned.as_u16());
    assert!(
        by_operator[0]["peer"]
            .as_str()
            .unwrap()
            .starts_with("127.0.0.1:"),
        "{audit}"
    );
    assert!(by_operator[0]["time"].as_str().unwrap().ends_with('Z'));
    assert_eq!(by_operator[1]["method"], "DELETE");
    assert_eq!(by_operator[1]["status"], 403);
    // The app's creation and first machine, by the org token, are there too.
    let by_admin: Vec<&str> = entries
        .iter()
        .filter(|e| e["token_id"] == tokens::admin_id())
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(by_admin, ["/v1/apps", "/v1/apps/web/machines"], "{audit}");
    // The CLI shows the same.
    let out = std::process::Command::new(EXE)
        .args(["audit", "-a", "web", "--json"])
        .env("BAZAAR_API_URL", agents[1].url())
        .env("BAZAAR_TOKEN", &reader)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let cli: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(cli["entries"].as_array().unwrap().len(), entries.len());
}
