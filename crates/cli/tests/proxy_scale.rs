//! The edge proxy and machine lifecycles on loopback clusters with real HTTP backends:
//! health checks taking machines out of rotation and back, a machine killed under load,
//! scale from zero (autostart, one shared wake-up) and scale to zero (autostop).

use crate::proxy;

use proxy::*;
use reqwest::{Method, StatusCode};
use serde_json::json;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_health_checks_take_a_machine_out_of_rotation() {
    let c = Cluster::start(2, &[]);
    c.create_app("hc").await;
    let svc = json!({
        "concurrency": {"type": "requests", "soft_limit": 1},
        "checks": [{"type": "http", "path": "/healthz", "interval": "200ms", "timeout": "1s"}],
    });
    let a = c.create_machine("hc", svc.clone(), json!({})).await;
    let b = c.create_machine("hc", svc, json!({})).await;
    c.wait_routable(0, "hc").await;
    let seen = |n: usize| {
        let c = &c;
        async move {
            let mut seen = HashSet::new();
            for _ in 0..n {
                let (s, _, body) = c.get(0, "hc", "/?sleep=20", &[]).await;
                assert_eq!(s, StatusCode::OK, "{body}");
                seen.insert(machine_of(&body));
            }
            seen
        }
    };
    // Both serve (concurrently, since the soft limit is 1).
    bazaar_testkit::eventually(Duration::from_secs(10), || async {
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let (http, url) = (c.http.clone(), c.agents[0].proxy_url());
            tasks.push(tokio::spawn(async move {
                http.get(format!("{url}/?sleep=200"))
                    .header("host", "hc.localhost")
                    .send()
                    .await
                    .unwrap()
                    .text()
                    .await
                    .unwrap()
            }));
        }
        let mut ids = HashSet::new();
        for t in tasks {
            ids.insert(machine_of(&t.await.unwrap()));
        }
        (ids.len() == 2).then_some(())
    })
    .await
    .expect("both machines serve");

    // `a` turns sick: within a few check intervals it gets no traffic, and its check shows
    // critical in the API.
    std::fs::write(c.work_file(&a, "sick"), "").unwrap();
    bazaar_testkit::eventually(Duration::from_secs(10), || async {
        let m = c.machine("hc", &a).await;
        let critical = m.to_string().contains("critical");
        (critical && !seen(10).await.contains(&a)).then_some(())
    })
    .await
    .expect("the sick machine leaves rotation");
    assert_eq!(seen(20).await, HashSet::from([b.clone()]));

    // Healthy again: back in rotation.
    std::fs::remove_file(c.work_file(&a, "sick")).unwrap();
    bazaar_testkit::eventually(Duration::from_secs(10), || async {
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let (http, url) = (c.http.clone(), c.agents[0].proxy_url());
            tasks.push(tokio::spawn(async move {
                http.get(format!("{url}/?sleep=200"))
                    .header("host", "hc.localhost")
                    .send()
                    .await
                    .unwrap()
                    .text()
                    .await
                    .unwrap()
            }));
        }
        let mut ids = HashSet::new();
        for t in tasks {
            ids.insert(machine_of(&t.await.unwrap()));
        }
        ids.contains(&a).then_some(())
    })
    .await
    .expect("the machine returns to rotation");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_machine_killed_under_load_costs_only_its_in_flight_requests() {
    let c = Cluster::start(2, &[]);
    c.create_app("kl").await;
    let svc = json!({"concurrency": {"type": "requests", "soft_limit": 4, "hard_limit": 4}});
    let a = c.create_machine("kl", svc.clone(), json!({})).await;
    let _b = c.create_machine("kl", svc, json!({})).await;
    for i in 0..2 {
        c.wait_routable(i, "kl").await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let mut workers = Vec::new();
    for w in 0..6 {
        let (http, url) = (c.http.clone(), c.agents[w % 2].proxy_url());
        let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let r = http
                    .get(format!("{url}/?sleep=20"))
                    .header("host", "kl.localhost")
                    .timeout(Duration::from_secs(10))
                    .send()
                    .await;
                match r {
                    Ok(r) if r.status() == StatusCode::OK => {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    let pid = c.machine("kl", &a).await["pid"].as_i64().expect("pid");
    bazaar_testkit::signal(pid as i32, libc::SIGKILL);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    // At most what was in flight on the killed machine (its hard limit); GETs are retried.
    assert!(failed <= 4, "{failed} failed, {ok} ok");
    assert!(ok > 50, "{ok} ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn autostart_wakes_once_and_autostop_drains_then_stops() {
    let c = Cluster::start(2, &["--autostop-idle-ms", "1500"]);
    c.create_app("zz").await;
    let svc = json!({"autostart": true, "autostop": "stop", "min_machines_running": 0,
        "concurrency": {"type": "requests", "soft_limit": 50}});
    let id = c.create_machine("zz", svc, json!({})).await;
    // Idle: stopped within the idle period plus a few seconds.
    let t0 = Instant::now();
    c.wait_state("zz", &id, "stopped").await;
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());

    // A burst of first requests, through both proxies: all answered, one wake-up.
    let mut tasks = Vec::new();
    for k in 0..8 {
        let (http, url) = (c.http.clone(), c.agents[k % 2].proxy_url());
        tasks.push(tokio::spawn(async move {
            let r = http
                .get(format!("{url}/"))
                .header("host", "zz.localhost")
                .send()
                .await
                .unwrap();
            (r.status(), r.text().await.unwrap())
        }));
    }
    for t in tasks {
        let (s, body) = t.await.unwrap();
        assert_eq!(s, StatusCode::OK, "{body}");
        assert_eq!(machine_of(&body), id);
    }
    let mut wakes = 0.0;
    for i in 0..2 {
        for line in c.metrics(i).await.lines() {
            if line.starts_with("bazaar_proxy_wakes_total{") && line.contains("kind=\"ok\"") {
                wakes += line.rsplit(' ').next().unwrap().parse::<f64>().unwrap();
            }
        }
    }
    assert_eq!(wakes, 1.0, "one shared wake-up");

    // A long request keeps it running past the idle period (drain: never stopped with a
    // request in flight).
    let (s, _, body) = c.get(1, "zz", "/?sleep=2500", &[]).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let m = c.machine("zz", &id).await;
    assert_eq!(m["state"], "started", "{m}");
    // Then idle again: stopped; the next request wakes it.
    c.wait_state("zz", &id, "stopped").await;
    let (s, _, body) = c.get(0, "zz", "/", &[]).await;
    assert_eq!(s, StatusCode::OK, "{body}");

    // min_machines_running keeps one of two.
    c.create_app("mm").await;
    let svc = json!({"autostart": true, "autostop": "stop", "min_machines_running": 1});
    let m1 = c.create_machine("mm", svc.clone(), json!({})).await;
    let m2 = c.create_machine("mm", svc, json!({})).await;
    let (keep, gone) = if m1 < m2 { (m1, m2) } else { (m2, m1) };
    c.wait_state("mm", &gone, "stopped").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let v = c.machine("mm", &keep).await;
    assert_eq!(v["state"], "started", "{v}");

    // A stopped app without autostart is not woken: 503 after the bounded wait.
    c.create_app("off").await;
    let id = c.create_machine("off", json!({}), json!({})).await;
    let (s, _) = c
        .api(
            Method::POST,
            &format!("/apps/off/machines/{id}/stop"),
            Some(json!({})),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    c.wait_state("off", &id, "stopped").await;
    let (s, _, body) = c.get(0, "off", "/", &[]).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    // Nor by an anonymous client naming it with fly-force-instance-id, through any proxy.
    for i in 0..c.agents.len() {
        let (s, _, body) = c
            .get(i, "off", "/", &[("fly-force-instance-id", id.as_str())])
            .await;
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    }
    let v = c.machine("off", &id).await;
    assert_eq!(v["state"], "stopped", "{v}");
}
