//! The cluster secret is not an API token, and operators need not send it over the
//! network (issue 31, item 8), on real agents: the Machines API answers it 401; an app
//! delete handed between hosts without certificates still works (the owner's host-level
//! route takes the secret); and the operator commands reach a host's interface and
//! catalog over its host listener with that host's own certificate (`--host-data-dir`),
//! no secret given, the gossip key change reaching every host that way too, or with the
//! secret over HTTPS to an agent with `--api-tls`.

use crate::common;

use bazaar_testkit::{start_cluster, start_plain_cluster, Fly, TestAgent, TEST_SECRET};
use common::EXE;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::process::{Command, Output};

/// Runs `bazaar ARGS` with no cluster secret in its environment and a Machines API URL
/// that points nowhere it could use.
fn operator(args: &[&str]) -> Output {
    Command::new(EXE)
        .args(args)
        .env_remove("BAZAAR_CLUSTER_SECRET")
        .env_remove("BAZAAR_CA_CERT")
        .env_remove("BAZAAR_HOST_DATA_DIR")
        .env("BAZAAR_API_URL", "http://127.0.0.1:1")
        .output()
        .expect("bazaar runs")
}

fn stdout(out: &Output) -> String {
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_refuses_the_secret_and_hosts_without_certificates_still_delete_apps() {
    let agents = start_plain_cluster(std::path::Path::new(EXE), 2, |_, _| {}).unwrap();
    let r = reqwest::Client::new()
        .get(format!("{}/v1/apps", agents[0].url()))
        .bearer_auth(TEST_SECRET)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let body: Value = r.json().await.unwrap();
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("the cluster secret is not an API token"),
        "{body}"
    );
    // An app written by host 0, deleted through host 1: handed to its owner with the
    // cluster secret over the owner's host-level route.
    let (owner, other) = (Fly::new(&agents[0]), Fly::new(&agents[1]));
    owner.create_app("far").await;
    let seen = bazaar_testkit::eventually(std::time::Duration::from_secs(10), || async {
        (other.get("/apps/far").await.0 == StatusCode::OK).then_some(())
    })
    .await;
    assert!(seen.is_ok(), "host 1 never saw the app");
    let (s, v) = other.delete("/apps/far").await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    let (s, v) = owner.get("/apps/far").await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_commands_use_the_hosts_certificate_over_its_host_listener() {
    let agents = start_cluster(std::path::Path::new(EXE), 2, |_, _| {}).unwrap();
    let dir = agents[0].data_dir.display().to_string();
    let mut ids = Vec::new();
    for agent in &agents {
        ids.push(agent.client().info().await.unwrap().id);
    }

    // Without the secret nor a data dir: refused, saying where the secret is.
    let out = operator(&["hosts"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("BAZAAR_CLUSTER_SECRET"),
        "{out:?}"
    );

    // The catalog view and the host interface, as host 0, with its certificate: every
    // host, once host 0's catalog has heard of the other.
    let mut want = ids.clone();
    want.sort();
    let listed = bazaar_testkit::eventually(std::time::Duration::from_secs(20), || {
        let hosts: Value = serde_json::from_str(&stdout(&operator(&[
            "hosts",
            "--json",
            "--host-data-dir",
            &dir,
        ])))
        .unwrap();
        let mut listed: Vec<String> = hosts
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["id"].as_str().unwrap().to_string())
            .collect();
        listed.sort();
        std::future::ready((listed == want).then_some(listed))
    })
    .await;
    assert!(listed.is_ok(), "host 0's catalog never listed {want:?}");
    let info: Value = serde_json::from_str(&stdout(&operator(&[
        "host",
        "info",
        "--json",
        "--host-data-dir",
        &dir,
    ])))
    .unwrap();
    assert_eq!(info["id"], json!(ids[0]), "{info}");
    let images = stdout(&operator(&[
        "image",
        "list",
        "--json",
        "--host-data-dir",
        &dir,
    ]));
    assert_eq!(serde_json::from_str::<Value>(&images).unwrap(), json!([]));

    // A gossip key installed on every host the catalog lists, each over its host listener.
    let key = stdout(&operator(&["cluster", "gossip-key", "generate"]))
        .trim()
        .to_string();
    let out = stdout(&operator(&[
        "cluster",
        "gossip-key",
        "install",
        &key,
        "--host-data-dir",
        &dir,
    ]));
    for id in &ids {
        assert!(out.contains(&format!("{id}: install done")), "{out}");
    }
    for agent in &agents {
        let kept = std::fs::read_to_string(agent.data_dir.join("gossip-keys")).unwrap();
        assert!(kept.contains(&key), "{}: {kept}", agent.data_dir.display());
    }
    check_listener_refuses_strangers(&agents[0]);
}

/// The host listener still refuses a caller without a certificate (the operator path
/// opened nothing): plain HTTP with the secret gets no answer there.
fn check_listener_refuses_strangers(agent: &TestAgent) {
    let addr = agent.host_listen_addr().expect("a host listener");
    let out = Command::new(EXE)
        .args(["hosts", "--json"])
        .env("BAZAAR_API_URL", format!("http://{addr}"))
        .env("BAZAAR_CLUSTER_SECRET", TEST_SECRET)
        .env_remove("BAZAAR_HOST_DATA_DIR")
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_commands_send_the_secret_over_https_to_an_api_tls_agent() {
    let agents = start_cluster(std::path::Path::new(EXE), 1, |_, o| {
        o.extra_args.push("--api-tls".into());
    })
    .unwrap();
    let ca_cert = agents[0].cluster_ca_dir().unwrap().join("ca.crt");
    let https_url = agents[0].url().replacen("http://", "https://", 1);
    let out = Command::new(EXE)
        .args(["hosts", "--json"])
        .env("BAZAAR_API_URL", &https_url)
        .env("BAZAAR_CLUSTER_SECRET", TEST_SECRET)
        .env("BAZAAR_CA_CERT", &ca_cert)
        .env_remove("BAZAAR_HOST_DATA_DIR")
        .output()
        .unwrap();
    let hosts: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(hosts.as_array().unwrap().len(), 1, "{hosts}");
}
