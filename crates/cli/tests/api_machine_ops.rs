//! Machine operations of the Fly Machines API beyond the lifecycle, on a loopback cluster:
//! `wait` with `event_id` and `from_event_id`, `ps`, and the machine view's `image_ref`.

use crate::common;

use bazaar_testkit::start_cluster;
use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::path::Path;

fn process_config(cmd: &[&str]) -> Value {
    json!({"image": "process", "driver": "process", "init": {"exec": cmd},
           "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256}})
}

const SLEEPER: &[&str] = &["sh", "-c", "while true; do sleep 0.2; done"];

/// `GET .../wait` with a query; answers (status, body).
async fn wait(fly: &Fly, app: &str, id: &str, query: &str) -> (StatusCode, Value) {
    fly.get(&format!("/apps/{app}/machines/{id}/wait?{query}"))
        .await
}

/// The machine's events, newest first.
async fn events(fly: &Fly, app: &str, id: &str) -> Vec<Value> {
    let (s, v) = fly
        .get(&format!("/apps/{app}/machines/{id}/events?limit=50"))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    v.as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_answers_the_event_and_waits_past_from_event_id() {
    let agents = start_cluster(Path::new(EXE), 2, |_, _| {}).unwrap();
    let fly = Fly::new(&agents[0]);
    fly.create_app("w").await;
    let (s, m) = fly
        .post(
            "/apps/w/machines",
            json!({"config": process_config(SLEEPER)}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let id = m["id"].as_str().unwrap().to_string();

    // The event that satisfied the wait is the start event.
    let (s, v) = wait(&fly, "w", &id, "state=started&timeout=30").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let started = v["event_id"].as_str().unwrap().to_string();
    let evs = events(&fly, "w", &id).await;
    assert_eq!(evs[0]["id"], started.as_str(), "{evs:?}");
    assert_eq!(evs[0]["status"], "started");

    // Nothing newer yet: a wait past it times out, though the machine is started.
    let (s, v) = wait(
        &fly,
        "w",
        &id,
        &format!("state=started&timeout=1&from_event_id={started}"),
    )
    .await;
    assert_eq!(s, StatusCode::REQUEST_TIMEOUT, "{v}");

    // An update: its own event does not satisfy the wait, the start after it does.
    let mut config = process_config(SLEEPER);
    config["env"] = json!({"GENERATION": "2"});
    let (s, u) = fly
        .post(&format!("/apps/w/machines/{id}"), json!({"config": config}))
        .await;
    assert_eq!(s, StatusCode::OK, "{u}");
    let (s, v) = wait(
        &fly,
        "w",
        &id,
        &format!("state=started&timeout=30&from_event_id={started}"),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let restarted = v["event_id"].as_str().unwrap().to_string();
    assert!(restarted > started, "{restarted} after {started}");
    let evs = events(&fly, "w", &id).await;
    let satisfied = evs.iter().find(|e| e["id"] == restarted.as_str()).unwrap();
    assert_eq!(satisfied["type"], "start", "{evs:?}");
    assert_eq!(satisfied["status"], "started");
    let update = evs.iter().find(|e| e["type"] == "update").unwrap();
    assert!(
        update["id"].as_str().unwrap() < restarted.as_str(),
        "the update came before: {evs:?}"
    );
    assert_eq!(v["version"], u["instance_id"], "{v} {u}");

    // Stop: the wait for stopped names the exit event.
    let (s, _) = fly
        .post(&format!("/apps/w/machines/{id}/stop"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, v) = wait(
        &fly,
        "w",
        &id,
        &format!("state=stopped&timeout=30&from_event_id={restarted}"),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let evs = events(&fly, "w", &id).await;
    assert_eq!(evs[0]["id"], v["event_id"], "{evs:?}");
    assert_eq!(evs[0]["status"], "stopped");

    // Bad input: a clear 400.
    for bad in ["nope", "../x", "01ARZ3NDEKTSV4RRFFQ69G5FA"] {
        let (s, v) = wait(
            &fly,
            "w",
            &id,
            &format!("state=stopped&timeout=1&from_event_id={bad}"),
        )
        .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}: {v}");
        assert!(
            v["error"].as_str().unwrap().contains("from_event_id"),
            "{v}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ps_lists_the_machines_processes_with_their_sockets() {
    let agents = start_cluster(Path::new(EXE), 2, |_, _| {}).unwrap();
    let fly = Fly::new(&agents[1]);
    fly.create_app("p").await;
    let port = bazaar_testkit::free_port(std::net::Ipv4Addr::LOCALHOST);
    // A listener, a CPU burner and the shell that started them.
    let script = format!(
        "python3 -c 'import socket,time; s=socket.socket(); s.bind((\"127.0.0.1\", {port})); \
         s.listen(); time.sleep(3600)' & \
         (while :; do :; done) & \
         while true; do sleep 0.2; done"
    );
    let (s, m) = fly
        .post(
            "/apps/p/machines",
            json!({"config": process_config(&["sh", "-c", &script])}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let id = m["id"].as_str().unwrap().to_string();
    fly.wait_state("p", &id, "started").await;

    let list = bazaar_testkit::eventually(std::time::Duration::from_secs(20), || async {
        let (s, v) = fly.get(&format!("/apps/p/machines/{id}/ps")).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        let list = v.as_array()?.clone();
        let listening = list.iter().any(|p| {
            p["listen_sockets"]
                .as_array()
                .is_some_and(|s| !s.is_empty())
        });
        let burned = list.iter().any(|p| p["rtime"].as_u64() > Some(300));
        (listening && burned).then_some(list)
    })
    .await
    .expect("the listener listens and the burner burns");
    let python = list
        .iter()
        .find(|p| p["command"].as_str().unwrap().starts_with("python3 -c"))
        .unwrap_or_else(|| panic!("{list:?}"));
    assert_eq!(
        python["listen_sockets"],
        json!([{"proto": "tcp", "address": format!("127.0.0.1:{port}")}])
    );
    assert!(python["rss"].as_u64().unwrap() > 1 << 20, "{python}");
    let shell = list
        .iter()
        .find(|p| p["command"].as_str().unwrap().starts_with("sh -c python3"))
        .unwrap_or_else(|| panic!("{list:?}"));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let stime = shell["stime"].as_u64().unwrap();
    assert!(
        stime <= now && stime + 60 > now,
        "started just now: {shell}"
    );
    assert!(!shell["directory"].as_str().unwrap().is_empty());
    let burner = list.iter().max_by_key(|p| p["cpu"].as_u64()).unwrap();
    assert!(burner["cpu"].as_u64().unwrap() >= 10, "{list:?}");
    // Only the machine's processes: nothing of the host or the agent.
    for p in &list {
        let c = p["command"].as_str().unwrap();
        assert!(!c.contains("bazaar"), "{list:?}");
    }

    // Sorted as asked.
    let (s, v) = fly
        .get(&format!("/apps/p/machines/{id}/ps?sort_by=rss&order=desc"))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let rss: Vec<u64> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["rss"].as_u64().unwrap())
        .collect();
    assert!(rss.windows(2).all(|w| w[0] >= w[1]), "{rss:?}");
    for bad in ["sort_by=memory", "order=up"] {
        let (s, v) = fly.get(&format!("/apps/p/machines/{id}/ps?{bad}")).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}: {v}");
        assert!(v["error"].as_str().is_some());
    }

    // A stopped machine has no processes to show.
    let (s, _) = fly
        .post(&format!("/apps/p/machines/{id}/stop"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK);
    fly.wait_state("p", &id, "stopped").await;
    let (s, v) = fly.get(&format!("/apps/p/machines/{id}/ps")).await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_machines_show_their_image_ref_and_container_processes() {
    use bazaar_testkit::images::{busybox_rootfs_layer, config_with, push_with_config};
    assert!(is_root(), "image machines need root");
    let registry = bazaar_testkit::images::TestRegistry::start(None);
    let reg =
        bazaar_image::Registry::new(&registry.host, bazaar_image::Auth::Anonymous, true).unwrap();
    let layer = busybox_rootfs_layer(&["sh", "httpd", "sleep"], ("etc/motd", b"ref\n"));
    let config = config_with(
        &[&layer],
        bazaar_image::manifest::Platform::current()
            .architecture
            .as_str(),
        json!({
            "Entrypoint": ["/bin/httpd", "-f", "-p", "8080"],
            "Env": ["PATH=/bin"],
            "WorkingDir": "/www",
            "Labels": {"org.opencontainers.image.source": "https://example.test/web"},
        }),
    );
    let digest = push_with_config(&reg, "tools/web", "2", &[&layer], &config).await;

    let agents = start_cluster(Path::new(EXE), 1, |_, _| {}).unwrap();
    let fly = Fly::new(&agents[0]);
    fly.create_app("img").await;
    let image = format!("{}/tools/web:2", registry.host);
    let (s, m) = fly
        .post(
            "/apps/img/machines",
            json!({"config": {"image": image, "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256}}}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let id = m["id"].as_str().unwrap().to_string();
    fly.wait_state("img", &id, "started").await;
    let (_, m) = fly.get(&format!("/apps/img/machines/{id}")).await;
    assert_eq!(
        m["image_ref"],
        json!({
            "registry": registry.host,
            "repository": "tools/web",
            "tag": "2",
            "digest": digest.to_string(),
            "labels": {"org.opencontainers.image.source": "https://example.test/web"},
        }),
        "{m}"
    );

    // ps shows the container as the machine sees it.
    let (s, v) = fly.get(&format!("/apps/img/machines/{id}/ps")).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let list = v.as_array().unwrap();
    assert_eq!(list.len(), 1, "{v}");
    assert_eq!(list[0]["pid"], 1, "{v}");
    assert_eq!(list[0]["command"], "/bin/httpd -f -p 8080");
    assert_eq!(list[0]["directory"], "/www");
    let sockets = list[0]["listen_sockets"].as_array().unwrap();
    assert!(
        sockets
            .iter()
            .any(|s| s["proto"] == "tcp" && s["address"].as_str().unwrap().ends_with(":8080")),
        "{v}"
    );

    // Process machines have no image.
    let (s, p) = fly
        .post(
            "/apps/img/machines",
            json!({"config": process_config(SLEEPER)}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{p}");
    assert!(p.get("image_ref").is_none(), "{p}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_leases_cordons_and_refuses_a_new_region_or_name() {
    let agents = start_cluster(Path::new(EXE), 2, |_, _| {}).unwrap();
    let fly = Fly::new(&agents[0]);
    fly.create_app("u").await;
    let (s, m) = fly
        .post(
            "/apps/u/machines",
            json!({"config": process_config(SLEEPER), "name": "first"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let id = m["id"].as_str().unwrap().to_string();
    let region = m["region"].as_str().unwrap().to_string();
    fly.wait_state("u", &id, "started").await;
    let path = format!("/apps/u/machines/{id}");

    // Refused, and nothing changes: another region, another name (immutable, as on Fly),
    // a bad lease.
    for (body, field) in [
        (
            json!({"config": process_config(SLEEPER), "region": "elsewhere"}),
            "region",
        ),
        (
            json!({"config": process_config(SLEEPER), "name": "second"}),
            "name",
        ),
        (
            json!({"config": process_config(SLEEPER), "name": "Not A Name!"}),
            "name",
        ),
        (
            json!({"config": process_config(SLEEPER), "lease_ttl": 0}),
            "lease",
        ),
    ] {
        let (s, v) = fly.post(&path, body.clone()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert!(v["error"].as_str().unwrap().contains(field), "{v}");
    }
    let (_, now) = fly.get(&path).await;
    assert_eq!(now["instance_id"], m["instance_id"], "nothing changed");
    assert_eq!(now["name"], "first");

    // Its own region and name are fine (clients send them back).
    let (s, u) = fly
        .post(
            &path,
            json!({"config": process_config(SLEEPER), "region": region, "name": "first"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{u}");
    assert_eq!(u["name"], "first");
    fly.wait_state("u", &id, "started").await;

    // lease_ttl: the update takes a lease and answers its nonce; later changes need it.
    let (s, u) = fly
        .post(
            &path,
            json!({"config": process_config(SLEEPER), "lease_ttl": 30}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{u}");
    let nonce = u["nonce"].as_str().expect("a nonce").to_string();
    let (s, l) = fly.get(&format!("{path}/lease")).await;
    assert_eq!(s, StatusCode::OK, "{l}");
    let (s, v) = fly
        .post(&path, json!({"config": process_config(SLEEPER)}))
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "leased: {v}");
    let (s, u) = fly
        .call_leased(
            reqwest::Method::POST,
            &path,
            Some(json!({"config": process_config(SLEEPER), "lease_ttl": 60})),
            Some(&nonce),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{u}");
    assert_eq!(u["nonce"], nonce.as_str(), "a refresh keeps the nonce");
    fly.wait_state("u", &id, "started").await;

    // skip_service_registration: updated and started, but out of rotation.
    assert_eq!(u["cordoned"], false);
    let (s, u) = fly
        .call_leased(
            reqwest::Method::POST,
            &path,
            Some(json!({"config": process_config(SLEEPER), "skip_service_registration": true})),
            Some(&nonce),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{u}");
    fly.wait_state("u", &id, "started").await;
    let (_, now) = fly.get(&path).await;
    assert_eq!(now["cordoned"], true, "{now}");
}

/// The memory limit of machine `id` (on host `host_id`) as its cgroup says, in MiB.
fn cgroup_limit_mb(host_id: &str, id: &str) -> u64 {
    let v1 = format!("/sys/fs/cgroup/memory/bazaar/{host_id}/{id}/memory.limit_in_bytes");
    let v2 = format!("/sys/fs/cgroup/bazaar/{host_id}/{id}/memory.max");
    let text = std::fs::read_to_string(&v1)
        .or_else(|_| std::fs::read_to_string(&v2))
        .expect("the machine's memory cgroup");
    text.trim().parse::<u64>().unwrap() >> 20
}

/// Fly's `/memory` calls: a started machine's limit read, lowered live in its cgroup (and
/// never above its guest size), memory reclaimed from its page cache, and the guest size's
/// limit back when it starts again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_limit_changes_live_and_reclaim_takes_page_cache() {
    if !is_root() {
        eprintln!("skipped: cgroups need root");
        return;
    }
    let agents = start_cluster(Path::new(EXE), 1, |_, _| {}).unwrap();
    let fly = Fly::new(&agents[0]);
    fly.create_app("mem").await;
    // 32 MiB of clean page cache charged to the machine, then idle.
    let script = "dd if=/dev/zero of=fill bs=1M count=32 conv=fsync 2>/dev/null; \
                  touch filled; while true; do sleep 0.2; done";
    let (s, m) = fly
        .post(
            "/apps/mem/machines",
            json!({"config": process_config(&["sh", "-c", script])}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let id = m["id"].as_str().unwrap().to_string();
    let host_id = m["host_id"].as_str().unwrap().to_string();
    fly.wait_state("mem", &id, "started").await;
    let filled = work_file(&agents[0], &id, "filled");
    bazaar_testkit::eventually(std::time::Duration::from_secs(20), || async {
        filled.exists().then_some(())
    })
    .await
    .expect("the machine wrote its file");
    let memory = format!("/apps/mem/machines/{id}/memory");

    let (s, v) = fly.get(&memory).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["limit_mb"], 256);
    assert!(v["available_mb"].as_u64().unwrap() <= 256, "{v}");

    let (s, v) = fly.put(&memory, json!({"limit_mb": 128})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["limit_mb"], 128);
    assert_eq!(
        cgroup_limit_mb(&host_id, &id),
        128,
        "the kernel's limit moved"
    );

    for bad in [
        json!({"limit_mb": 512}),
        json!({"limit_mb": 0}),
        json!({"limit_mb": "a lot"}),
        json!({"limit": 64}),
    ] {
        let (s, v) = fly.put(&memory, bad.clone()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}: {v}");
        assert!(v["error"].is_string(), "{bad}: {v}");
    }
    assert_eq!(
        cgroup_limit_mb(&host_id, &id),
        128,
        "a refused change changes nothing"
    );

    let (s, v) = fly
        .post(&format!("{memory}/reclaim"), json!({"amount_mb": 16}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let taken = v["actual_mb"].as_u64().unwrap();
    assert!(
        (1..=32).contains(&taken),
        "reclaimed {taken} MiB of 32 MiB of page cache"
    );
    assert_eq!(
        cgroup_limit_mb(&host_id, &id),
        128,
        "reclaiming keeps the limit"
    );

    // Stopped: no memory to read; started again: the guest size's limit.
    let (s, v) = fly
        .post(&format!("/apps/mem/machines/{id}/stop"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    fly.wait_state("mem", &id, "stopped").await;
    let (s, v) = fly.get(&memory).await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    let (s, v) = fly
        .post(&format!("/apps/mem/machines/{id}/start"), json!({}))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    fly.wait_state("mem", &id, "started").await;
    let (s, v) = fly.get(&memory).await;
    assert_eq!(
        (s, v["limit_mb"].clone()),
        (StatusCode::OK, json!(256)),
        "{v}"
    );
}
