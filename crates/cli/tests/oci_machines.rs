//! Image machines end to end, on two agents as root: Debian's `docker-registry` on loopback
//! serves an image built from Debian's `busybox-static`; machines made from it run under
//! runc as the image says (entrypoint, cmd, user, workdir, env) with `config.files`, get an
//! address of their own (reached through either agent's proxy), cannot see the host's
//! processes nor reach another app's machine, are held to their memory, keep their volume's
//! data (and lose what they wrote elsewhere) over a restart, and a hostile image fails the
//! machine with a clear error without writing outside the image store.

use crate::common;

use base64::Engine;
use bazaar_testkit::images::{
    busybox_rootfs_layer, config_with, ensure_packages, layer, push_with_config, Entry, Layer,
    TestRegistry,
};
use bazaar_testkit::start_cluster;
use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::time::Duration;

/// busybox (with the applets the test uses), a user `app`, and a web root.
fn web_layer() -> Layer {
    busybox_rootfs_layer(
        &[
            "sh", "httpd", "cat", "id", "ps", "nc", "printf", "sleep", "dd", "echo", "ls",
        ],
        ("etc/motd", b"web\n"),
    )
}

async fn push_web_image(registry: &TestRegistry) -> String {
    let reg =
        bazaar_image::Registry::new(&registry.host, bazaar_image::Auth::Anonymous, true).unwrap();
    let l = web_layer();
    let config = config_with(
        &[&l],
        bazaar_image::manifest::Platform::current()
            .architecture
            .as_str(),
        json!({
            "Entrypoint": ["/bin/httpd", "-f", "-p"],
            "Cmd": ["8080"],
            "Env": ["PATH=/bin", "GREETING=from-image"],
            "WorkingDir": "/www",
            "User": "app",
        }),
    );
    push_with_config(&reg, "web", "1", &[&l], &config).await;
    format!("{}/web:1", registry.host)
}

fn machine_config(image: &str, memory_mb: u64) -> Value {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    json!({
        "image": image,
        "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": memory_mb},
        "env": {"MSG": "from-env"},
        "files": [{"guest_path": "/www/file.txt", "raw_value": b64("from-files\n")}],
        "services": [{"protocol": "tcp", "internal_port": 8080,
                      "ports": [{"port": 80, "handlers": ["http"]}]}],
    })
}

/// Waits until the machine is started; otherwise fails with its events and its log.
async fn started(fly: &Fly, agents: &[bazaar_testkit::TestAgent], app: &str, id: &str) {
    let (s, w) = fly
        .get(&format!(
            "/apps/{app}/machines/{id}/wait?state=started&timeout=30"
        ))
        .await;
    if s != StatusCode::OK {
        let (_, ev) = fly.get(&format!("/apps/{app}/machines/{id}/events")).await;
        let logs: Vec<String> = agents
            .iter()
            .map(|a| {
                let log = a.data_dir.join("machines").join(id).join("output.log");
                std::fs::read_to_string(log).unwrap_or_default()
            })
            .collect();
        panic!("machine {id} never started: {w}\nevents: {ev}\nlogs: {logs:?}");
    }
}

async fn exec(fly: &Fly, app: &str, id: &str, cmd: &str) -> Value {
    let (s, v) = fly
        .post(
            &format!("/apps/{app}/machines/{id}/exec"),
            json!({"command": ["/bin/sh", "-c", cmd], "timeout": 20}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "exec {cmd}: {v}");
    v
}

/// Runs `cmd` in the machine once exec answers 200 (retried for up to `secs` seconds, as
/// after a restart).
async fn exec_when_ready(fly: &Fly, app: &str, id: &str, cmd: &str, secs: u64) -> Value {
    bazaar_testkit::eventually(Duration::from_secs(secs), || async {
        let (s, v) = fly
            .post(
                &format!("/apps/{app}/machines/{id}/exec"),
                json!({"command": ["/bin/sh", "-c", cmd]}),
            )
            .await;
        (s == StatusCode::OK).then_some(v)
    })
    .await
    .unwrap_or_else(|_| panic!("exec {cmd:?} never answered 200 within {secs} s"))
}

async fn proxy_get(proxy: &str, app: &str, path: &str) -> Option<(u16, String)> {
    let resp = reqwest::Client::new()
        .get(format!("{proxy}{path}"))
        .header("host", format!("{app}.localhost"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .ok()?;
    Some((resp.status().as_u16(), resp.text().await.ok()?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_machines_run_isolated_on_their_own_address() {
    if !bazaar_testkit::can_run(is_root(), "root (image machines)") {
        return;
    }
    ensure_packages();
    let registry = TestRegistry::start(None);
    let image = push_web_image(&registry).await;
    let mut agents = start_cluster(std::path::Path::new(EXE), 2, |_, _| {}).unwrap();
    let fly = Fly::new(&agents[0]);
    fly.create_app("web").await;
    fly.create_app("other").await;

    // Created from the registry; runs as its image says.
    let (s, m) = fly
        .post(
            "/apps/web/machines",
            json!({"config": machine_config(&image, 256)}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let id = m["id"].as_str().unwrap().to_string();
    started(&fly, &agents, "web", &id).await;
    let (_, m) = fly.get(&format!("/apps/web/machines/{id}")).await;
    let ip = m["private_ip"].as_str().unwrap().to_string();
    assert!(ip.starts_with("10."), "an address of its own: {m}");
    let (_, events) = fly.get(&format!("/apps/web/machines/{id}/events")).await;
    assert!(
        events.to_string().contains("pulled"),
        "the pull is in the events: {events}"
    );
    // Its start says where the time went (`machine explain --timing`), in order.
    let start = events
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "start")
        .unwrap_or_else(|| panic!("a start event: {events}"));
    let steps: Vec<&str> = start["request"]["timing"]
        .as_array()
        .unwrap_or_else(|| panic!("timing in {start}"))
        .iter()
        .map(|s| s["step"].as_str().unwrap())
        .collect();
    let image_steps = [
        "run_dir",
        "layer",
        "image_prepared",
        "spawned",
        "container_created",
    ];
    let in_order: Vec<&str> = steps
        .iter()
        .copied()
        .filter(|s| image_steps.contains(s))
        .collect();
    assert_eq!(in_order, image_steps, "{steps:?}");

    let v = exec(
        &fly,
        "web",
        &id,
        "echo $MSG $GREETING $FLY_PRIVATE_IP; id -u; pwd",
    )
    .await;
    assert_eq!(
        v["stdout"].as_str().unwrap(),
        format!("from-env from-image {ip}\n1000\n/www\n"),
        "{v}"
    );
    // Its own pid namespace: the server is pid 1 and nothing of the host is visible.
    let v = exec(&fly, "web", &id, "ps -o pid,args").await;
    let ps = v["stdout"].as_str().unwrap();
    assert!(ps.contains("1 /bin/httpd -f -p 8080"), "{ps}");
    assert!(!ps.contains("bazaar"), "host processes visible: {ps}");
    assert!(ps.lines().count() <= 5, "{ps}");

    // Reachable through either agent's proxy, on its own address.
    for agent in &agents {
        let got = bazaar_testkit::eventually(Duration::from_secs(15), || async {
            proxy_get(&agent.proxy_url(), "web", "/file.txt")
                .await
                .filter(|(s, _)| *s == 200)
        })
        .await
        .expect("served through the proxy");
        assert_eq!(got.1, "from-files\n");
    }

    // Another app's machine cannot reach it; the machine itself can.
    let mut other_config = machine_config(&image, 256);
    other_config["init"] = json!({"exec": ["/bin/sleep", "1000"]});
    other_config["services"] = json!([]);
    let (s, o) = fly
        .post("/apps/other/machines", json!({"config": other_config}))
        .await;
    assert_eq!(s, StatusCode::OK, "{o}");
    let other = o["id"].as_str().unwrap().to_string();
    started(&fly, &agents, "other", &other).await;
    // (busybox's static wget crashes without NSS libraries; nc does not resolve names.)
    let fetch = format!("printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {ip} 8080");
    let v = exec(&fly, "web", &id, &fetch).await;
    assert!(
        v["stdout"]
            .as_str()
            .unwrap()
            .ends_with("hello from the image\n"),
        "{v}"
    );
    let v = exec(&fly, "other", &other, &fetch).await;
    assert!(
        !v["stdout"].as_str().unwrap().contains("hello"),
        "another app reached the machine: {v}"
    );

    // Held to its memory: 400 MB in a 256 MB machine is killed, and the event says OOM.
    let mut hog = machine_config(&image, 256);
    hog["init"] =
        json!({"exec": ["/bin/dd", "if=/dev/zero", "of=/dev/null", "bs=400M", "count=1"]});
    hog["services"] = json!([]);
    hog["restart"] = json!({"policy": "no"});
    let (s, h) = fly
        .post("/apps/other/machines", json!({"config": hog}))
        .await;
    assert_eq!(s, StatusCode::OK, "{h}");
    let hog = h["id"].as_str().unwrap().to_string();
    let oom = bazaar_testkit::eventually(Duration::from_secs(30), || async {
        let (_, ev) = fly.get(&format!("/apps/other/machines/{hog}/events")).await;
        ev.as_array()?.iter().find(|e| e["type"] == "exit").cloned()
    })
    .await
    .expect("the hog exits");
    assert_eq!(oom["request"]["exit_event"]["oom_killed"], true, "{oom}");

    // A restart starts from the image again: the volume keeps its data, the rootfs not.
    let (s, vol) = fly
        .post("/apps/web/volumes", json!({"name": "data", "size_gb": 1}))
        .await;
    assert_eq!(s, StatusCode::OK, "{vol}");
    let mut with_volume = machine_config(&image, 256);
    with_volume["mounts"] = json!([{"volume": vol["id"], "path": "/data"}]);
    with_volume["init"] = json!({"exec": ["/bin/sleep", "1000"], "user": "root"});
    let (s, d) = fly
        .post("/apps/web/machines", json!({"config": with_volume}))
        .await;
    assert_eq!(s, StatusCode::OK, "{d}");
    let db = d["id"].as_str().unwrap().to_string();
    started(&fly, &agents, "web", &db).await;
    exec(
        &fly,
        "web",
        &db,
        "echo kept > /data/x; echo gone > /www/scratch",
    )
    .await;
    let (s, v) = fly
        .post(&format!("/apps/web/machines/{db}/restart"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    started(&fly, &agents, "web", &db).await;
    let v = exec_when_ready(&fly, "web", &db, "cat /data/x; ls /www", 10).await;
    assert_eq!(v["stdout"], "kept\nfile.txt\nindex.html\n", "{v}");

    // A kill -9 of every agent leaves the containers running; they are adopted again.
    exec(&fly, "web", &db, "echo alive > /tmp/marker").await;
    for a in agents.iter_mut() {
        a.kill9();
        a.restart().unwrap();
    }
    let v = exec_when_ready(&fly, "web", &db, "cat /data/x /tmp/marker", 20).await;
    assert_eq!(
        v["stdout"], "kept\nalive\n",
        "the same run, re-adopted: {v}"
    );

    // Destroyed: its root filesystem is unmounted and its directory gone. (Every agent was
    // restarted: the one serving the API learns of the machine again by gossip first.)
    bazaar_testkit::eventually(Duration::from_secs(10), || async {
        let (s, _) = fly.get(&format!("/apps/web/machines/{id}")).await;
        (s == StatusCode::OK).then_some(())
    })
    .await
    .expect("the machine is known again after the restarts");
    let (s, v) = fly
        .delete(&format!("/apps/web/machines/{id}?force=true"))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    bazaar_testkit::eventually(Duration::from_secs(15), || async {
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        let gone = agents
            .iter()
            .all(|a| !a.data_dir.join("machines").join(&id).exists());
        (gone && !mounts.contains(&id)).then_some(())
    })
    .await
    .expect("the root filesystem is removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_image_fails_the_machine_with_a_clear_error() {
    if !bazaar_testkit::can_run(is_root(), "root (image machines)") {
        return;
    }
    ensure_packages();
    let registry = TestRegistry::start(None);
    let reg =
        bazaar_image::Registry::new(&registry.host, bazaar_image::Auth::Anonymous, true).unwrap();
    let evil = layer(vec![
        Entry::Dir("bin/"),
        Entry::File("../../escaped".into(), b"x".to_vec(), 0o644),
    ]);
    let config = config_with(
        &[&evil],
        bazaar_image::manifest::Platform::current()
            .architecture
            .as_str(),
        json!({"Cmd": ["/bin/true"]}),
    );
    push_with_config(&reg, "evil", "1", &[&evil], &config).await;
    let agents = start_cluster(std::path::Path::new(EXE), 1, |_, _| {}).unwrap();
    let fly = Fly::new(&agents[0]);
    fly.create_app("evil").await;
    let (s, m) = fly
        .post(
            "/apps/evil/machines",
            json!({"config": {"image": format!("{}/evil:1", registry.host)}}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let id = m["id"].as_str().unwrap().to_string();
    fly.wait_state("evil", &id, "failed").await;
    let (_, events) = fly.get(&format!("/apps/evil/machines/{id}/events")).await;
    let text = events.to_string();
    assert!(
        text.contains("escaped"),
        "the error names the entry: {text}"
    );
    let data = &agents[0].data_dir;
    assert!(!data.join("escaped").exists() && !data.parent().unwrap().join("escaped").exists());
    // The exit event says what kind of failure it was and where: a bad image, for good.
    let exit = events
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "exit")
        .expect("an exit event");
    let failure = &exit["request"]["failure"];
    assert_eq!(failure["kind"], "config", "{exit}");
    assert_eq!(failure["step"], "image", "{exit}");
    assert_eq!(failure["retryable"], false, "{exit}");

    // An image the registry lacks: a wait for `started` from the machine's first event is
    // answered 404 `not_found` with the registry's word, not a timeout.
    let (s, m) = fly
        .post(
            "/apps/evil/machines",
            json!({"config": {"image": format!("{}/nope:1", registry.host)}}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let id = m["id"].as_str().unwrap().to_string();
    let (_, events) = fly.get(&format!("/apps/evil/machines/{id}/events")).await;
    let first = events.as_array().unwrap().last().unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (s, v) = fly
        .get(&format!(
            "/apps/evil/machines/{id}/wait?state=started&timeout=30&from_event_id={first}"
        ))
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    assert_eq!(v["status"], "not_found", "{v}");
    assert!(v["error"].as_str().unwrap().contains("nope"), "{v}");

    // Bad input is refused before anything is created.
    let (s, v) = fly
        .post(
            "/apps/evil/machines",
            json!({"config": {"image": "UPPER/Case::bad"}}),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let (s, v) = fly
        .post(
            "/apps/evil/machines",
            json!({"config": {"image": format!("{}/evil:1", registry.host),
                              "files": [{"guest_path": "../etc/passwd", "raw_value": "eA=="}]}}),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_commands_pull_import_list_and_prune() {
    if !bazaar_testkit::can_run(is_root(), "root (image machines)") {
        return;
    }
    ensure_packages();
    let registry = TestRegistry::start(None);
    let image = push_web_image(&registry).await;
    // A registry that wants a password, given to the agent with --registry-auth.
    let private = TestRegistry::start(Some(("alice", "s3cret")));
    let private_image = {
        let auth = bazaar_image::Auth::Basic {
            username: "alice".into(),
            password: "s3cret".into(),
        };
        let reg = bazaar_image::Registry::new(&private.host, auth, true).unwrap();
        let l = web_layer();
        let config = config_with(
            &[&l],
            bazaar_image::manifest::Platform::current()
                .architecture
                .as_str(),
            json!({"Cmd": ["/bin/sleep", "1000"], "Env": ["PATH=/bin"]}),
        );
        push_with_config(&reg, "secret/app", "1", &[&l], &config).await;
        format!("{}/secret/app:1", private.host)
    };
    let credentials = format!("{}=alice:s3cret", private.host);
    let agents = start_cluster(std::path::Path::new(EXE), 1, |_, o| {
        o.extra_args
            .extend(["--registry-auth".to_string(), credentials.clone()]);
    })
    .unwrap();
    let bazaar = |args: &[&str]| {
        let out = std::process::Command::new(EXE)
            .args(args)
            .env("BAZAAR_API_URL", agents[0].url())
            .env("BAZAAR_CLUSTER_SECRET", bazaar_testkit::TEST_SECRET)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };

    // Pull shows each layer's progress, then the image.
    let (ok, out, err) = bazaar(&["image", "pull", &image]);
    assert!(ok, "{out}{err}");
    assert!(err.contains("layer 1/1"), "progress lines: {err}");
    assert!(out.contains(&format!("pulled {image}")), "{out}");

    let (ok, out, err) = bazaar(&["image", "pull", &private_image]);
    assert!(ok, "pull with the configured credentials: {out}{err}");

    // Import of a `docker save` archive, then a machine made from it with no registry.
    let l = busybox_rootfs_layer(&["sh", "sleep"], ("etc/imported", b"yes\n"));
    let config = config_with(
        &[&l],
        bazaar_image::manifest::Platform::current()
            .architecture
            .as_str(),
        json!({"Cmd": ["/bin/sleep", "1000"], "Env": ["PATH=/bin"]}),
    );
    let archive = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        archive.path(),
        bazaar_testkit::images::docker_save("offline.example/app:v1", &[&l], &config),
    )
    .unwrap();
    let (ok, out, err) = bazaar(&["image", "import", archive.path().to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("imported offline.example/app:v1"), "{out}");
    let (ok, out, err) = bazaar(&["image", "list"]);
    assert!(
        ok && out.contains("offline.example/app:v1") && out.contains("/web:1"),
        "{out}{err}"
    );

    let fly = Fly::new(&agents[0]);
    fly.create_app("offline").await;
    let (s, m) = fly
        .post(
            "/apps/offline/machines",
            json!({"config": {"image": "offline.example/app:v1"}}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let id = m["id"].as_str().unwrap().to_string();
    started(&fly, &agents, "offline", &id).await;

    // Prune forgets what no machine uses; the imported image stays while its machine lives.
    let (ok, out, err) = bazaar(&["image", "prune", "--json"]);
    assert!(ok, "{out}{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    let mut removed: Vec<String> = serde_json::from_value(report["images"].clone()).unwrap();
    removed.sort();
    let mut expected = vec![image.clone(), private_image.clone()];
    expected.sort();
    assert_eq!(removed, expected, "{report}");
    let (_, out, _) = bazaar(&["image", "list"]);
    assert!(
        out.contains("offline.example/app:v1") && !out.contains("/web:1"),
        "{out}"
    );

    // Bad input: not an archive.
    let junk = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(junk.path(), b"not a tar").unwrap();
    let (ok, _, err) = bazaar(&["image", "import", junk.path().to_str().unwrap()]);
    assert!(!ok && err.contains("importing the archive"), "{err}");
}
