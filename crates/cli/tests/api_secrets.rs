//! App secrets (issue 15) on a real two-host cluster: set through one host, a process
//! machine on the other host gets them in its environment (a secret wins over
//! `config.env`); `bazaar secrets set` restarts started machines so the new value is seen
//! without a manual restart; `unset --stage` applies at the next start; lists show names and
//! digests only; wrong-app, read-only and secrets-less tokens are refused; bad names and
//! values get 400s that never quote a value; and no value appears on any read path: machine
//! GET and list, events, the log endpoint and `bazaar logs`, the catalog views, `/metrics`,
//! every file of both hosts' data dirs (the store, run specs, logs), error messages. Image
//! machines (root, runc) get them too, through their bundle's `config.json`, kept 0600.

use crate::common;

use bazaar_auth::{Op, Scope};
use bazaar_testkit::{api_token, eventually, start_cluster, tokens, TestAgent, TEST_SECRET};
use reqwest::{Client, Method, StatusCode};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::path::Path;
use std::time::Duration;

use common::EXE;
const FIRST: &str = "pg://user:f1rst-v4lue-9d8c7b6a@db/prod";
const SECOND: &str = "pg://user:s3cond-v4lue-1a2b3c4d@db/prod";
const THIRD: &str = "th1rd-v4lue-never-stored-5e6f";

async fn call(
    agent: &TestAgent,
    token: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, String) {
    let mut req = Client::new()
        .request(method, format!("{}{path}", agent.url()))
        .bearer_auth(token);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.unwrap();
    (resp.status(), resp.text().await.unwrap())
}

async fn call_json(
    agent: &TestAgent,
    token: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let (s, text) = call(agent, token, method, path, body).await;
    (
        s,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Runs `bazaar ARGS` against `agent` with the cluster secret as token; must succeed.
fn bazaar(agent: &TestAgent, args: &[&str]) -> String {
    let out = std::process::Command::new(EXE)
        .args(args)
        .env("BAZAAR_API_URL", agent.url())
        .env("BAZAAR_TOKEN", bazaar_testkit::api_token())
        .output()
        .unwrap();
    assert!(out.status.success(), "bazaar {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

fn sha_line(value: &str) -> String {
    hex::encode(Sha256::digest(format!("{value}\n")))
}

/// What the machine last wrote at start: the sha256 of `$DB_URL` and `$GREETING`.
fn seen_by_machine(host: &TestAgent, id: &str) -> Option<(String, String)> {
    let work = host.data_dir.join("machines").join(id).join("work");
    let sha = std::fs::read_to_string(work.join("db.sha")).ok()?;
    let greeting = std::fs::read_to_string(work.join("greeting")).ok()?;
    Some((
        sha.split_whitespace().next()?.to_string(),
        greeting.trim_end().to_string(),
    ))
}

/// Every file under `dir` that contains `needle`.
/// Whether the bytes of file `path` hold `needle`. Only the parts that hold data are read
/// (`SEEK_DATA`/`SEEK_HOLE`): a machine's disk image is a sparse file of a gigabyte or more,
/// mostly holes, that a plain read would scan byte by byte.
fn data_contains(path: &Path, needle: &[u8]) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    use std::os::fd::AsRawFd;
    let Ok(mut file) = std::fs::File::open(path) else {
        return false;
    };
    let fd = file.as_raw_fd();
    let mut at: libc::off_t = 0;
    loop {
        // SAFETY: lseek on a descriptor this function owns; no memory is passed.
        let data = unsafe { libc::lseek(fd, at, libc::SEEK_DATA) };
        if data < 0 {
            return false; // no data past `at` (ENXIO)
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        if hole <= data {
            return false;
        }
        // One extent of data (a hole between two holds only zeros, so no needle spans it).
        let mut bytes = Vec::with_capacity((hole - data) as usize);
        if file.seek(SeekFrom::Start(data as u64)).is_err()
            || (&mut file)
                .take((hole - data) as u64)
                .read_to_end(&mut bytes)
                .is_err()
        {
            return false;
        }
        if contains(&bytes, needle) {
            return true;
        }
        at = hole;
    }
}

/// Whether `haystack` holds `needle`: the first byte found with `position`, then compared.
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    let Some((&first, _)) = needle.split_first() else {
        return true;
    };
    let mut i = 0;
    while let Some(p) = haystack[i..].iter().position(|&b| b == first) {
        let at = i + p;
        if haystack[at..].starts_with(needle) {
            return true;
        }
        i = at + 1;
    }
    false
}

fn files_containing(dir: &Path, needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if meta.is_dir() {
                stack.push(path);
            } else if meta.is_file() && data_contains(&path, needle.as_bytes()) {
                found.push(path.display().to_string());
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn app_secrets_reach_machines_on_other_hosts_and_no_read_path() {
    let hosts = start_cluster(Path::new(EXE), 2, |i, o| {
        o.region = ["ams", "ord"][i].into();
    })
    .expect("agents start");
    let (a, b) = (&hosts[0], &hosts[1]);
    eventually(Duration::from_secs(10), || async {
        let (_, v) = call_json(a, api_token(), Method::GET, "/v1/platform/regions", None).await;
        (v["regions"].as_array().map_or(0, |r| r.len()) == 2).then_some(())
    })
    .await
    .expect("both hosts in the catalog");
    let (s, v) = call_json(
        a,
        api_token(),
        Method::POST,
        "/v1/apps",
        Some(json!({"app_name": "web", "org_slug": "personal"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");

    // Set through host A.
    let (s, v) = call_json(
        a,
        api_token(),
        Method::POST,
        "/v1/apps/web/secrets",
        Some(json!({"values": {"DB_URL": FIRST, "GREETING": "from-secret"}})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert!(!v.to_string().contains(FIRST), "{v}");

    // Host B's catalog holds both secrets first: a claim waits for the version its caller
    // saw for 3 s at most (`SECRETS_WAIT`, agent/src/app_secrets.rs) and is then refused
    // (503), and under a loaded CI machine gossip once took longer.
    eventually(Duration::from_secs(30), || async {
        let (_, list) = call_json(b, api_token(), Method::GET, "/v1/apps/web/secrets", None).await;
        (list["secrets"].as_array().map(Vec::len) == Some(2)).then_some(())
    })
    .await
    .expect("host B's catalog holds the secrets set through host A");
    // A process machine placed in ord (host B) sees both; the secret wins over config.env.
    let script = "echo \"$DB_URL\" | sha256sum > $HOME/db.sha; \
                  echo \"$GREETING\" > $HOME/greeting; echo started; exec sleep 1000";
    let (s, m) = call_json(
        a,
        api_token(),
        Method::POST,
        "/v1/apps/web/machines",
        Some(json!({"region": "ord", "config": {
            "driver": "process", "image": "process",
            "init": {"exec": ["sh", "-c", script]},
            "env": {"GREETING": "from-config"},
            "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256}}})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let id = m["id"].as_str().unwrap().to_string();
    let machine = format!("/v1/apps/web/machines/{id}");
    // It runs on B: it writes into B's data dir.
    let seen = eventually(Duration::from_secs(10), || async {
        seen_by_machine(b, &id).filter(|(sha, _)| *sha == sha_line(FIRST))
    })
    .await
    .expect("the machine on host B sees the secret set through host A");
    assert_eq!(seen.1, "from-secret");
    // `machine exec` runs with the environment the workload started with.
    let (s, v) = call_json(
        a,
        api_token(),
        Method::POST,
        &format!("{machine}/exec"),
        Some(json!({"command": ["sh", "-c", "echo \"$DB_URL\" | sha256sum; echo $GREETING"]})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let stdout = v["stdout"].as_str().unwrap_or_default();
    assert!(stdout.starts_with(&sha_line(FIRST)), "{v}");
    assert!(stdout.ends_with("from-secret\n"), "{v}");

    // Lists: names and digests (16 hex), never values; through either host.
    let (s, list) = call_json(b, api_token(), Method::GET, "/v1/apps/web/secrets", None).await;
    assert_eq!(s, StatusCode::OK);
    let names: Vec<&str> = list["secrets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["DB_URL", "GREETING"]);
    let digest_before = list["secrets"][0]["digest"].as_str().unwrap().to_string();
    assert_eq!(digest_before.len(), 16);
    assert!(!list.to_string().contains(FIRST));
    let listed = bazaar(a, &["secrets", "list", "-a", "web"]);
    assert!(
        listed.contains("DB_URL") && listed.contains(&digest_before),
        "{listed}"
    );
    assert!(!listed.contains(FIRST), "{listed}");

    // `secrets set` (the CLI, the value from stdin) restarts the started machine: the new
    // value is seen with no manual restart; the digest changed.
    let mut child = std::process::Command::new(EXE)
        .args(["secrets", "set", "-a", "web", "DB_URL=-"])
        .env("BAZAAR_API_URL", a.url())
        .env("BAZAAR_TOKEN", bazaar_testkit::api_token())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "{SECOND}").unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(printed.contains("restarted (1/1)"), "{printed}");
    assert!(!printed.contains(SECOND));
    eventually(Duration::from_secs(5), || async {
        seen_by_machine(b, &id).filter(|(sha, _)| *sha == sha_line(SECOND))
    })
    .await
    .expect("the rolled machine sees the new value");
    let (_, list) = call_json(a, api_token(), Method::GET, "/v1/apps/web/secrets", None).await;
    assert_ne!(list["secrets"][0]["digest"], digest_before);

    // `unset --stage` leaves the machine; its next start no longer has the secret (config.env
    // is back).
    bazaar(b, &["secrets", "unset", "-a", "web", "GREETING", "--stage"]);
    assert_eq!(seen_by_machine(b, &id).unwrap().1, "from-secret");
    let (s, v) = call_json(
        a,
        api_token(),
        Method::POST,
        &format!("{machine}/restart"),
        Some(json!({})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    eventually(Duration::from_secs(10), || async {
        seen_by_machine(b, &id).filter(|(_, g)| g == "from-config")
    })
    .await
    .expect("after an unset, the next start has config.env's value");
    let (s, _) = call(
        a,
        api_token(),
        Method::DELETE,
        "/v1/apps/web/secrets/GREETING",
        None,
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "unsetting what is not set");

    // Tokens: another app's (404), read-only (403), without the secrets operation (403).
    let other = tokens::mint(&Scope {
        apps: ["api".to_string()].into(),
        ..Scope::default()
    });
    let read_only = tokens::mint(&Scope {
        read_only: true,
        ..Scope::default()
    });
    let starter = tokens::mint(&Scope {
        ops: [Op::Start, Op::Stop].into(),
        ..Scope::default()
    });
    let web_secrets = tokens::mint(&Scope {
        apps: ["web".to_string()].into(),
        ops: [Op::Secrets].into(),
        ..Scope::default()
    });
    let set = || Some(json!({"values": {"DB_URL": THIRD}}));
    for (token, want) in [
        (&other, StatusCode::NOT_FOUND),
        (&read_only, StatusCode::FORBIDDEN),
        (&starter, StatusCode::FORBIDDEN),
    ] {
        let (s, body) = call(a, token, Method::POST, "/v1/apps/web/secrets", set()).await;
        assert_eq!(s, want, "{body}");
        assert!(!body.contains(THIRD), "{body}");
        let (s, body) = call(
            a,
            token,
            Method::DELETE,
            "/v1/apps/web/secrets/DB_URL",
            None,
        )
        .await;
        assert_eq!(s, want, "{body}");
    }
    let (s, _) = call(a, &other, Method::GET, "/v1/apps/web/secrets", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = call(a, &read_only, Method::GET, "/v1/apps/web/secrets", None).await;
    assert_eq!(s, StatusCode::OK, "reading names and digests is a read");
    let (s, body) = call(
        b,
        &web_secrets,
        Method::POST,
        "/v1/apps/web/secrets/EXTRA",
        Some(json!({"value": "x"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");

    // Bad input: 400, nothing changed, no value quoted.
    let bad_bodies = [
        json!({"values": {"1BAD": THIRD}}),
        json!({"values": {"A-B": THIRD}}),
        json!({"values": {"FLY_APP_NAME": THIRD}}),
        json!({"values": {"OK": THIRD, "bad name": "x"}}),
        json!({"values": {"NUL": format!("{THIRD}\u{0}")}}),
        json!({"values": {"BIG": THIRD.repeat(3000)}}),
        json!({"values": {"NUM": 5}}),
        json!({"values": THIRD}),
        json!({"nothing": THIRD}),
    ];
    for body in bad_bodies {
        let (s, answer) = call(
            a,
            api_token(),
            Method::POST,
            "/v1/apps/web/secrets",
            Some(body.clone()),
        )
        .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert!(serde_json::from_str::<Value>(&answer).unwrap()["error"].is_string());
        assert!(!answer.contains(THIRD), "{answer}");
    }
    let truncated = format!("{{\"values\": {{\"A\": \"{THIRD}");
    let resp = Client::new()
        .post(format!("{}/v1/apps/web/secrets", a.url()))
        .bearer_auth(api_token())
        .header("content-type", "application/json")
        .body(truncated)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert!(!resp.text().await.unwrap().contains(THIRD));
    let (_, list) = call_json(a, api_token(), Method::GET, "/v1/apps/web/secrets", None).await;
    let names: Vec<&str> = list["secrets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["DB_URL", "EXTRA"], "refused calls changed nothing");
    let (s, _) = call(a, api_token(), Method::POST, "/v1/apps/nope/secrets", set()).await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    // No value on any read path.
    let mut answers = Vec::new();
    for host in [a, b] {
        for path in [
            machine.clone(),
            "/v1/apps/web/machines".to_string(),
            format!("{machine}/events"),
            format!("{machine}/logs"),
            "/v1/apps/web".to_string(),
            "/v1/apps/web/secrets".to_string(),
            "/v1/apps/web/secrets/DB_URL".to_string(),
            "/v1/apps/web/audit".to_string(),
            "/v1/catalog/machines?include_deleted=true".to_string(),
            "/v1/catalog/hosts".to_string(),
            "/metrics".to_string(),
        ] {
            // The catalog view and `/metrics` take the cluster secret.
            let token = if path.starts_with("/v1/catalog/") || path == "/metrics" {
                TEST_SECRET
            } else {
                api_token()
            };
            let (s, body) = call(host, token, Method::GET, &path, None).await;
            assert!(s.is_success(), "{path}: {s} {body}");
            answers.push((path, body));
        }
    }
    answers.push(("bazaar logs".into(), bazaar(a, &["logs", "-a", "web"])));
    assert!(
        answers.iter().any(|(_, body)| body.contains("started")),
        "the log endpoints answered the machine's output"
    );
    assert!(
        !files_containing(&b.data_dir, "from-config").is_empty(),
        "the scan reads the machine's files"
    );
    for secret in [FIRST, SECOND, THIRD] {
        for (path, body) in &answers {
            assert!(!body.contains(secret), "{path} shows a secret: {body}");
        }
        for host in [a, b] {
            let found = files_containing(&host.data_dir, secret);
            assert!(found.is_empty(), "a value in plain text on disk: {found:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_machines_get_app_secrets_in_their_environment() {
    use bazaar_testkit::images::{busybox_rootfs_layer, config_with, push_with_config};
    if !bazaar_testkit::can_run(common::is_root(), "root (image machines)") {
        return;
    }
    bazaar_testkit::images::ensure_packages();
    let registry = bazaar_testkit::images::TestRegistry::start(None);
    let reg =
        bazaar_image::Registry::new(&registry.host, bazaar_image::Auth::Anonymous, true).unwrap();
    let layer = busybox_rootfs_layer(&["sh", "sleep", "sha256sum", "echo"], ("etc/motd", b"x\n"));
    let arch = bazaar_image::manifest::Platform::current().architecture;
    let config = config_with(
        &[&layer],
        arch.as_str(),
        json!({
            "Entrypoint": ["/bin/sh", "-c",
                "echo \"$DB_URL\" | sha256sum; echo \"greeting=$GREETING\"; exec sleep 1000"],
            "Env": ["PATH=/bin", "GREETING=from-image"],
        }),
    );
    push_with_config(&reg, "env", "1", &[&layer], &config).await;
    let image = format!("{}/env:1", registry.host);
    let agent = start_cluster(Path::new(EXE), 1, |_, _| {})
        .expect("agent starts")
        .remove(0);
    let (s, v) = call_json(
        &agent,
        api_token(),
        Method::POST,
        "/v1/apps",
        Some(json!({"app_name": "img", "org_slug": "personal"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = call_json(
        &agent,
        api_token(),
        Method::POST,
        "/v1/apps/img/secrets",
        Some(json!({"values": {"DB_URL": FIRST, "GREETING": "from-secret"}})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, m) = call_json(
        &agent,
        api_token(),
        Method::POST,
        "/v1/apps/img/machines",
        Some(
            json!({"config": {"image": image, "env": {"GREETING": "from-config"},
            "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256}}}),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let id = m["id"].as_str().unwrap().to_string();
    let log = agent.data_dir.join("machines").join(&id).join("output.log");
    let want = sha_line(FIRST);
    eventually(Duration::from_secs(30), || async {
        let out = std::fs::read_to_string(&log).unwrap_or_default();
        (out.contains(&want) && out.contains("greeting=")).then_some(())
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "the image machine never printed the secret's digest: {:?}",
            std::fs::read_to_string(&log)
        )
    });
    let out = std::fs::read_to_string(&log).unwrap();
    assert!(
        out.contains("greeting=from-secret"),
        "the secret wins: {out}"
    );
    // runc reads the environment from the bundle: readable by the agent's user only.
    let runs = agent.data_dir.join("machines").join(&id).join("runs");
    let bundles: Vec<_> = std::fs::read_dir(&runs)
        .unwrap()
        .flatten()
        .map(|run| run.path().join("bundle/config.json"))
        .filter(|p| p.exists())
        .collect();
    assert!(!bundles.is_empty());
    for bundle in bundles {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&bundle).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{} is mode {mode:o}", bundle.display());
    }
    let (_, body) = call(
        &agent,
        api_token(),
        Method::GET,
        &format!("/v1/apps/img/machines/{id}"),
        None,
    )
    .await;
    assert!(!body.contains(FIRST), "{body}");
}

/// A host that set a secret restarts: its row comes back to it from its peers (the catalog
/// is soft state, as for apps), and every host still lists it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_survive_a_restart_of_the_host_that_set_them() {
    let mut hosts = start_cluster(Path::new(EXE), 2, |_, _| {}).expect("agents start");
    let (s, v) = call_json(
        &hosts[0],
        api_token(),
        Method::POST,
        "/v1/apps",
        Some(json!({"app_name": "kept", "org_slug": "personal"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = call_json(
        &hosts[1],
        api_token(),
        Method::POST,
        "/v1/apps/kept/secrets",
        Some(json!({"values": {"TOKEN": FIRST}})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    eventually(Duration::from_secs(10), || lists_only_token(&hosts[0]))
        .await
        .expect("host A lists the secret set through B");
    hosts[1].restart().unwrap();
    for host in [1, 0, 1] {
        eventually(Duration::from_secs(15), || lists_only_token(&hosts[host]))
            .await
            .unwrap_or_else(|_| panic!("host {host} lost the secret after B restarted"));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    for host in [0, 1] {
        eventually(Duration::from_secs(1), || lists_only_token(&hosts[host]))
            .await
            .unwrap_or_else(|_| panic!("host {host} dropped the secret after anti-entropy"));
    }
}

/// `Some` when `agent` lists exactly the secret `TOKEN` of app `kept`.
async fn lists_only_token(agent: &TestAgent) -> Option<()> {
    let (s, v) = call_json(
        agent,
        api_token(),
        Method::GET,
        "/v1/apps/kept/secrets",
        None,
    )
    .await;
    let names: Vec<&str> = v["secrets"]
        .as_array()?
        .iter()
        .filter_map(|x| x["name"].as_str())
        .collect();
    (s == StatusCode::OK && names == ["TOKEN"]).then_some(())
}
