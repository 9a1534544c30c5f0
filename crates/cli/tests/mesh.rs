//! The private network between hosts (issue 16) on `bazaar lab` (root): a machine on host
//! A fetches HTTP from a machine of the same app on host B at its private address, through
//! the hosts' WireGuard mesh; a machine of another organization on A cannot connect; after
//! a partition between A and B heals, traffic flows again without restarting anything;
//! `down` leaves nothing behind.

use crate::lab_support;

use lab_support::{LabApi as Api, TestLab};
use reqwest::{Method, StatusCode};
use serde_json::json;
use std::process::Command;
use std::time::{Duration, Instant};

/// What these tests ask a lab host's API.
impl Api {
    async fn create_app(&self, app: &str, org: &str) {
        let (s, v) = self
            .call(
                Method::POST,
                "/v1/apps",
                Some(json!({"app_name": app, "org_slug": org})),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "creating {app}: {v}");
    }

    /// Creates a machine of `app` in `region` running `script`; answers (id, private_ip)
    /// once it started.
    async fn machine(&self, app: &str, region: &str, script: &str) -> (String, String) {
        let config = json!({
            "image": "process", "driver": "process",
            "init": {"exec": ["sh", "-c", script]},
            "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256},
            "services": [{"internal_port": 8080, "protocol": "tcp"}],
        });
        let (s, m) = self
            .call(
                Method::POST,
                &format!("/v1/apps/{app}/machines"),
                Some(json!({"config": config, "region": region})),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{m}");
        let id = m["id"].as_str().unwrap().to_string();
        let (s, v) = self
            .call(
                Method::GET,
                &format!("/v1/apps/{app}/machines/{id}/wait?state=started&timeout=30"),
                None,
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{v}");
        let (_, m) = self
            .call(Method::GET, &format!("/v1/apps/{app}/machines/{id}"), None)
            .await;
        let ip = m["private_ip"].as_str().unwrap().to_string();
        (id, ip)
    }

    /// Runs `curl` in machine `id` of `app` against `url`: Some(body) if it answered.
    async fn fetch(&self, app: &str, id: &str, url: &str, max_time_s: u32) -> Option<String> {
        let (s, v) = self
            .call(
                Method::POST,
                &format!("/v1/apps/{app}/machines/{id}/exec"),
                Some(json!({
                    "command": ["curl", "-sS", "-m", max_time_s.to_string(), url],
                    "timeout": max_time_s + 5,
                })),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "exec: {v}");
        (v["exit_code"] == 0).then(|| v["stdout"].as_str().unwrap_or_default().to_string())
    }
}

/// Polls `fetch` until it answers, for at most `within`; answers the body and how long it
/// took.
async fn until_answered(
    api: &Api,
    app: &str,
    id: &str,
    url: &str,
    within: Duration,
) -> (String, Duration) {
    let start = Instant::now();
    while start.elapsed() < within {
        if let Some(body) = api.fetch(app, id, url, 2).await {
            return (body, start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{url} did not answer machine {id} within {within:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machines_reach_each_other_across_hosts_within_their_organization_and_after_a_partition() {
    let t = TestLab::up(
        "mesh",
        &[
            "--dead-after-ms",
            "2000",
            "--hosts",
            "2",
            "--regions",
            "ams,ord",
            "--wait-converged",
        ],
    )
    .0;
    let mut lab = t.lab();
    // Every call through h1's API: the market places by region (ams is h1, ord is h2).
    let a = Api::of(&lab, "h1");
    a.create_app("db", "personal").await;
    a.create_app("intruder", "other").await;

    // On B: a server. On A: a client of the same app, and a machine of another organization.
    let (server, server_ip) = a
        .machine(
            "db",
            "ord",
            "cd $BAZAAR_VOLUME_PATH 2>/dev/null || cd /tmp; echo served-by-$FLY_MACHINE_ID > index.html; exec python3 -m http.server --bind 0.0.0.0 8080",
        )
        .await;
    let (client, client_ip) = a.machine("db", "ams", "exec sleep 1000").await;
    let (intruder, _) = a.machine("intruder", "ams", "exec sleep 1000").await;
    // Different hosts' prefixes of the private range.
    for ip in [&server_ip, &client_ip] {
        assert!(ip.starts_with("10."), "{ip}");
        let second: u8 = ip.split('.').nth(1).unwrap().parse().unwrap();
        assert!((208..=223).contains(&second), "{ip} in 10.208.0.0/12");
    }
    let prefix22 = |ip: &str| u32::from(ip.parse::<std::net::Ipv4Addr>().unwrap()) & !0x3ff;
    assert_ne!(
        prefix22(&server_ip),
        prefix22(&client_ip),
        "each host has its own /22"
    );
    let url = format!("http://{server_ip}:8080/");

    let (body, took) = until_answered(&a, "db", &client, &url, Duration::from_secs(30)).await;
    assert_eq!(body.trim(), format!("served-by-{server}"));
    eprintln!("first answer across the mesh after {took:?}");
    // By name, from the internal DNS on the client's gateway (issue 16): the app, its
    // region, and the machine itself.
    for name in [
        "db.internal".to_string(),
        "ord.db.internal".to_string(),
        format!("{server}.vm.db.internal"),
    ] {
        let by_name = format!("http://{name}:8080/");
        let (body, _) = until_answered(&a, "db", &client, &by_name, Duration::from_secs(30)).await;
        assert_eq!(body.trim(), format!("served-by-{server}"), "{name}");
    }

    // Another organization's machine on the same host: dropped at B (a timeout).
    let started = Instant::now();
    assert_eq!(a.fetch("intruder", &intruder, &url, 3).await, None);
    assert!(started.elapsed() < Duration::from_secs(10));
    // And the client still reaches it (the refusal was the organization, not the path).
    assert!(a.fetch("db", &client, &url, 3).await.is_some());

    // A partition between A and B: nothing gets through; after it heals, traffic flows
    // again with no restart (the peer was dropped when B was declared dead, and is
    // added back, with a fresh handshake, when it is alive again).
    lab.partition(&["h1".to_string()], &["h2".to_string()], false)
        .unwrap();
    assert_eq!(a.fetch("db", &client, &url, 2).await, None);
    let h2_addr = lab.host("h2").unwrap().addr.to_string();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, hosts) = a.call(Method::GET, "/v1/catalog/hosts", None).await;
        let dead = hosts.as_array().into_iter().flatten().any(|h| {
            h["api_addr"]
                .as_str()
                .unwrap_or("")
                .starts_with(&format!("{h2_addr}:"))
                && h["status"] == "dead"
        });
        if dead {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "h1 never declared h2 dead: {hosts}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // h1 dropped its peer h2 (and the route to h2's prefix) meanwhile.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    lab.heal().unwrap();
    let (body, took) = until_answered(&a, "db", &client, &url, Duration::from_secs(30)).await;
    assert_eq!(body.trim(), format!("served-by-{server}"));
    eprintln!("answered again {took:?} after the partition healed");

    t.cli(&["down"]);
    assert_eq!(lab.leftovers(), Vec::<String>::new());
    let links = Command::new("ip").args(["-o", "link"]).output().unwrap();
    let links = String::from_utf8_lossy(&links.stdout);
    for h in lab.state().hosts.iter().filter_map(|h| h.host_id.as_ref()) {
        let device = format!("wg-{}", &bazaar_agent::network::bridge_name(h)[3..]);
        assert!(!links.contains(&device), "{device} left behind: {links}");
    }
}
