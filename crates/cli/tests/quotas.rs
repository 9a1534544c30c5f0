//! Quotas (issue 34, docs/POLICY.md) on a real three-host cluster: an app's quota set with
//! `bazaar quota set` through one host reaches every host's catalog, and once the app's
//! machines are there too, every host refuses the next create with 403 naming the quota
//! and the numbers, making nothing; `bazaar quota show` prints the limits and the use. The
//! volume GB quota holds against extends, forks and restores too.

use crate::common;
use crate::volumes_support;

use bazaar_testkit::{api_token, eventually, start_cluster, TestAgent};
use reqwest::{Client, Method, StatusCode};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

use common::EXE;

async fn call(
    agent: &TestAgent,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut req = Client::new()
        .request(method, format!("{}{path}", agent.url()))
        .bearer_auth(api_token());
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

/// Runs `bazaar ARGS` against `agent`; must succeed.
fn bazaar(agent: &TestAgent, args: &[&str]) -> String {
    let out = std::process::Command::new(EXE)
        .args(args)
        .env("BAZAAR_API_URL", agent.url())
        .env("BAZAAR_TOKEN", api_token())
        .output()
        .unwrap();
    assert!(out.status.success(), "bazaar {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

fn create_body() -> Value {
    json!({
        "config": bazaar_testkit::process_config(&["sleep", "1000"]),
        "skip_launch": true,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_refuses_the_next_create_on_every_node() {
    let hosts = start_cluster(Path::new(EXE), 3, |_, _| {}).expect("agents start");
    let (s, v) = call(
        &hosts[0],
        Method::POST,
        "/v1/apps",
        Some(json!({"app_name": "quota", "org_slug": "acme"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let quota = "/v1/orgs/acme/apps/quota/quota";
    // Every node knows the app before the quota is set on another.
    for h in &hosts {
        eventually(Duration::from_secs(10), || async {
            (call(h, Method::GET, quota, None).await.0 == StatusCode::OK).then_some(())
        })
        .await
        .expect("every node knows the app");
    }
    let set = bazaar(
        &hosts[1],
        &[
            "quota",
            "set",
            "--org",
            "acme",
            "--app",
            "quota",
            "--machines",
            "2",
            "--json",
        ],
    );
    let set: Value = serde_json::from_str(&set).unwrap();
    assert_eq!(set["limits"], json!({"machines": 2}), "{set}");

    for h in &hosts[..2] {
        let (s, v) = call(
            h,
            Method::POST,
            "/v1/apps/quota/machines",
            Some(create_body()),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }
    // Each node refuses once its catalog holds the quota and both machines.
    for h in &hosts {
        eventually(Duration::from_secs(10), || async {
            let (_, v) = call(h, Method::GET, quota, None).await;
            (v["limits"]["machines"] == 2 && v["usage"]["machines"] == 2).then_some(())
        })
        .await
        .unwrap_or_else(|_| panic!("{} never counted the quota and 2 machines", h.url()));
        let (s, v) = call(
            h,
            Method::POST,
            "/v1/apps/quota/machines",
            Some(create_body()),
        )
        .await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
        assert_eq!(
            v["error"],
            "forbidden: quota exceeded: app quota allows 2 machines, 2 in use, this request adds 1",
            "{v}"
        );
    }
    let (s, v) = call(&hosts[2], Method::GET, "/v1/apps/quota/machines", None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        v.as_array().unwrap().len(),
        2,
        "the refused creates made nothing: {v}"
    );
    let shown = bazaar(
        &hosts[2],
        &["quota", "show", "--org", "acme", "--app", "quota"],
    );
    assert!(
        shown.contains("quota of app quota") && shown.contains("machines"),
        "{shown}"
    );
}

/// The volume GB quota counts every way a volume grows or is made: a create, an extend, a
/// fork and a restore are refused past it, naming it; what fits goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volume_extends_forks_and_restores_count_against_the_volume_quota() {
    if !bazaar_testkit::can_run(
        common::is_root() && Path::new("/dev/loop-control").exists(),
        "root with loop devices (ext4 volumes)",
    ) {
        return;
    }
    let hosts = start_cluster(Path::new(EXE), 2, |_, _| {}).expect("agents start");
    let _unmount = volumes_support::UnmountOnDrop::new(&hosts);
    let (s, v) = call(
        &hosts[0],
        Method::POST,
        "/v1/apps",
        Some(json!({"app_name": "vq", "org_slug": "acme"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = call(
        &hosts[0],
        Method::POST,
        "/v1/orgs/acme/apps/vq/quota",
        Some(json!({"volume_gb": 3})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, vol) = call(
        &hosts[0],
        Method::POST,
        "/v1/apps/vq/volumes",
        Some(json!({"name": "data", "size_gb": 2})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{vol}");
    let id = vol["id"].as_str().unwrap().to_string();
    let refused = |s: StatusCode, v: &Value| {
        assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
        assert!(
            v["error"].as_str().unwrap().contains("allows 3 volume_gb"),
            "{v}"
        );
    };
    let (s, v) = call(
        &hosts[0],
        Method::PUT,
        &format!("/v1/apps/vq/volumes/{id}/extend"),
        Some(json!({"size_gb": 4})),
    )
    .await;
    refused(s, &v);
    let (s, v) = call(
        &hosts[0],
        Method::POST,
        "/v1/apps/vq/volumes",
        Some(json!({"name": "copy", "source_volume_id": id})),
    )
    .await;
    refused(s, &v);
    let (s, snap) = call(
        &hosts[0],
        Method::POST,
        &format!("/v1/apps/vq/volumes/{id}/snapshots"),
        Some(json!({})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{snap}");
    let (s, v) = call(
        &hosts[0],
        Method::POST,
        "/v1/apps/vq/volumes",
        Some(json!({"name": "restored", "snapshot_id": snap["id"]})),
    )
    .await;
    refused(s, &v);
    // Within the quota: the extend to 3 goes through; one volume is all there is.
    let (s, v) = call(
        &hosts[0],
        Method::PUT,
        &format!("/v1/apps/vq/volumes/{id}/extend"),
        Some(json!({"size_gb": 3})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (_, list) = call(&hosts[0], Method::GET, "/v1/apps/vq/volumes", None).await;
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");
    for h in &hosts {
        let (_, vols) = call(h, Method::GET, "/v1/apps/vq/volumes", None).await;
        for v in vols.as_array().into_iter().flatten() {
            let id = v["id"].as_str().unwrap();
            let _ = call(
                h,
                Method::DELETE,
                &format!("/v1/apps/vq/volumes/{id}"),
                None,
            )
            .await;
        }
    }
}
