//! The registry the cluster serves, end to end on three agents as root: an image pushed to
//! host 1's API port (`/v2`, with an app token as buildah's `--creds x:TOKEN` sends it) runs
//! on hosts 2 and 3 as `registry.bazaar.internal/<app>@<digest>`, each fetching the layers
//! it lacks from a peer that holds them (the pull event names the host that served them);
//! another app's machine cannot run it. `bazaar image push` sends a `docker save` archive
//! into the same registry.

use crate::common;

use bazaar_auth::Scope;
use bazaar_testkit::images::{
    busybox_rootfs_layer, config_with, docker_save, ensure_packages, push_with_config,
};
use bazaar_testkit::{start_cluster, start_plain_cluster};
use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::time::Duration;

fn on_host(image: &str, n: usize) -> Value {
    json!({"config": {
        "image": image,
        "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256},
        "init": {"exec": ["/bin/sleep", "1000"]},
        "placement": {"constraints": [{"label": "n", "op": "=", "value": n.to_string()}]},
    }})
}

async fn pull_event(fly: &Fly, app: &str, id: &str) -> String {
    let (_, events) = fly.get(&format!("/apps/{app}/machines/{id}/events")).await;
    events
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "pull")
        .map(|e| e["request"].to_string() + &e.to_string())
        .unwrap_or_else(|| panic!("no pull event: {events}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_pull_the_cluster_images_from_their_peers() {
    if !bazaar_testkit::can_run(is_root(), "root (image machines)") {
        return;
    }
    ensure_packages();
    let agents = start_cluster(std::path::Path::new(EXE), 3, |i, o| {
        o.extra_args
            .extend(["--label".to_string(), format!("n={i}")]);
    })
    .unwrap();
    let mut ids = Vec::new();
    for a in &agents {
        ids.push(a.client().info().await.unwrap().id);
    }
    let fly = Fly::new(&agents[0]);
    wait_for_hosts(&fly, 3).await;
    fly.create_app("web").await;
    fly.create_app("other").await;

    // Pushed to host 0's API port with a token of the app.
    let token = bazaar_testkit::tokens::mint(&Scope {
        apps: ["web".to_string()].into(),
        ..Scope::default()
    });
    let host0 = agents[0].url().trim_start_matches("http://").to_string();
    let auth = bazaar_image::Auth::Basic {
        username: "x".into(),
        password: token.clone(),
    };
    let registry = bazaar_image::Registry::new(&host0, auth, true).unwrap();
    let layer = busybox_rootfs_layer(&["sh", "sleep"], ("etc/motd", b"peers\n"));
    let arch = bazaar_image::manifest::Platform::current().architecture;
    let config = config_with(&[&layer], &arch, json!({"Cmd": ["/bin/sleep", "1000"]}));
    let digest = push_with_config(&registry, "web", "v1", &[&layer], &config).await;
    let image = format!("registry.bazaar.internal/web@{digest}");

    // Host 1 has only host 0 to fetch from; host 2 then has both.
    for n in [1, 2] {
        let (s, m) = fly.post("/apps/web/machines", on_host(&image, n)).await;
        assert_eq!(s, StatusCode::OK, "{m}");
        let id = m["id"].as_str().unwrap().to_string();
        wait_started(&fly, "web", &id).await;
        let (_, got) = fly.get(&format!("/apps/web/machines/{id}")).await;
        assert_eq!(got["config"]["image"], image.as_str());
        let pulled = pull_event(&fly, "web", &id).await;
        let served_by: Vec<&String> = ids
            .iter()
            .filter(|h| pulled.contains(&format!("from {h}")))
            .collect();
        assert!(
            served_by.len() == 1 && *served_by[0] != ids[n] && pulled.contains("0 cached"),
            "host {n} fetched its layers from a peer, named in the event: {pulled}"
        );
        if n == 1 {
            assert_eq!(served_by[0], &ids[0], "{pulled}");
        }
    }
    // Every host that ran it now serves it (the cluster secret opens it between hosts).
    for a in &agents {
        let resp = reqwest::Client::new()
            .head(format!("{}/v2/web/blobs/{}", a.url(), layer.digest()))
            .bearer_auth(bazaar_testkit::TEST_SECRET)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{}", a.url());
    }

    // Another app's machine may not run web's image, though its host holds it.
    let (s, m) = fly.post("/apps/other/machines", on_host(&image, 1)).await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let id = m["id"].as_str().unwrap().to_string();
    let refused = bazaar_testkit::eventually(Duration::from_secs(30), || async {
        let (_, events) = fly.get(&format!("/apps/other/machines/{id}/events")).await;
        let text = events.to_string();
        text.contains("may run only its app's images")
            .then_some(text)
    })
    .await;
    assert!(refused.is_ok(), "the launch is refused naming why");

    // An image built elsewhere: `bazaar image push` of its archive to host 1, run on host 0.
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("imported.tar");
    let other_layer = busybox_rootfs_layer(&["sh", "sleep"], ("etc/motd", b"archived\n"));
    let config = config_with(
        &[&other_layer],
        &arch,
        json!({"Cmd": ["/bin/sleep", "1000"]}),
    );
    std::fs::write(
        &archive,
        docker_save("built:elsewhere", &[&other_layer], &config),
    )
    .unwrap();
    let out = std::process::Command::new(EXE)
        .args([
            "image",
            "push",
            archive.to_str().unwrap(),
            "web/imported:v1",
        ])
        .env("BAZAAR_API_URL", agents[1].url())
        .env("BAZAAR_TOKEN", &token)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pushed = stdout
        .trim()
        .strip_prefix("pushed ")
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        pushed.starts_with("registry.bazaar.internal/web/imported@sha256:"),
        "{pushed}"
    );
    let (s, m) = fly.post("/apps/web/machines", on_host(pushed, 0)).await;
    assert_eq!(s, StatusCode::OK, "{m}");
    wait_started(&fly, "web", m["id"].as_str().unwrap()).await;
    let pulled = pull_event(&fly, "web", m["id"].as_str().unwrap()).await;
    assert!(pulled.contains(&format!("from {}", ids[1])), "{pulled}");
}

/// Without cluster certificates, hosts fetch from each other's API port with the cluster
/// secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_certificates_peers_are_reached_with_the_cluster_secret() {
    if !bazaar_testkit::can_run(is_root(), "root (image machines)") {
        return;
    }
    ensure_packages();
    let agents = start_plain_cluster(std::path::Path::new(EXE), 2, |i, o| {
        o.extra_args
            .extend(["--label".to_string(), format!("n={i}")]);
    })
    .unwrap();
    let host0 = agents[0].client().info().await.unwrap().id;
    let fly = Fly::new(&agents[0]);
    wait_for_hosts(&fly, 2).await;
    fly.create_app("web").await;
    let auth = bazaar_image::Auth::Basic {
        username: "x".into(),
        password: bazaar_testkit::api_token().into(),
    };
    let addr = agents[0].url().trim_start_matches("http://").to_string();
    let registry = bazaar_image::Registry::new(&addr, auth, true).unwrap();
    let layer = busybox_rootfs_layer(&["sh", "sleep"], ("etc/motd", b"plain\n"));
    let arch = bazaar_image::manifest::Platform::current().architecture;
    let config = config_with(&[&layer], &arch, json!({"Cmd": ["/bin/sleep", "1000"]}));
    let digest = push_with_config(&registry, "web", "v1", &[&layer], &config).await;
    let image = format!("registry.bazaar.internal/web@{digest}");
    let (s, m) = fly.post("/apps/web/machines", on_host(&image, 1)).await;
    assert_eq!(s, StatusCode::OK, "{m}");
    let id = m["id"].as_str().unwrap().to_string();
    wait_started(&fly, "web", &id).await;
    let pulled = pull_event(&fly, "web", &id).await;
    assert!(pulled.contains(&format!("from {host0}")), "{pulled}");
}
