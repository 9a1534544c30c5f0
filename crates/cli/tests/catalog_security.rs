//! The catalog's security with real agents (issue 15): hosts of a cluster CA sync over
//! mTLS with keys the CA endorsed, `bazaar cluster revoke` cuts a host off everywhere
//! (rows, host listener) while the others keep working, and `bazaar cluster gossip-key`
//! rotates the gossip key on every host without losing a member.

use crate::common;

use bazaar_testkit::{AgentOptions, TestAgent, TEST_SECRET};
use common::EXE;
use std::path::Path;
use std::time::{Duration, Instant};

const PATIENCE: Duration = Duration::from_secs(20);

fn bazaar(args: &[&str]) -> std::process::Output {
    std::process::Command::new(EXE).args(args).output().unwrap()
}

fn ok(out: std::process::Output) -> String {
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

fn options(args: Vec<String>, env: &[(&str, &str)]) -> AgentOptions {
    let mut o = AgentOptions::new(EXE);
    o.extra_args = args;
    o.extra_args
        .extend(["--host-listen".into(), "127.0.0.1:0".into()]);
    o.env = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    o
}

fn host_addr(agent: &TestAgent) -> String {
    std::fs::read_to_string(agent.data_dir.join("host.addr"))
        .unwrap()
        .trim()
        .to_string()
}

/// A host of the CA in `ca_dir`, joining through `ca`'s host listener and gossip.
fn join(ca_dir: &Path, ca: &TestAgent) -> TestAgent {
    let token = ok(bazaar(&[
        "cluster",
        "join-token",
        "--dir",
        ca_dir.to_str().unwrap(),
    ]));
    TestAgent::start(options(
        vec![
            "--join-addr".into(),
            host_addr(ca),
            "--join".into(),
            ca.gossip_addr(),
        ],
        &[("BAZAAR_JOIN_TOKEN", token.trim())],
    ))
    .expect("joins")
}

/// The hosts `agent`'s catalog lists: (id, status).
async fn hosts(agent: &TestAgent) -> Vec<(String, String)> {
    let resp = reqwest::Client::new()
        .get(format!("{}/v1/catalog/hosts", agent.url()))
        .bearer_auth(TEST_SECRET)
        .send()
        .await
        .unwrap();
    let hosts: Vec<serde_json::Value> = resp.json().await.unwrap();
    hosts
        .iter()
        .map(|h| {
            (
                h["id"].as_str().unwrap().to_string(),
                h["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

async fn sees_alive(agent: &TestAgent, ids: &[&str]) -> bool {
    let hosts = hosts(agent).await;
    hosts.len() == ids.len()
        && ids
            .iter()
            .all(|id| hosts.iter().any(|(h, s)| h == id && s == "alive"))
}

/// A client of `target`'s host listener presenting `from`'s certificate.
fn listener_client(
    from: &TestAgent,
    from_id: &str,
    target_id: &str,
    target: &TestAgent,
) -> reqwest::Client {
    let identity = bazaar_pki::HostIdentity::load(&from.data_dir.join("tls"), from_id)
        .unwrap()
        .unwrap();
    let handle = bazaar_pki::IdentityHandle::new(&identity).unwrap();
    let config = bazaar_pki::client_config(&handle, identity.ca_pem()).unwrap();
    reqwest::Client::builder()
        .use_preconfigured_tls((*config).clone())
        .resolve(
            &bazaar_pki::host_dns_name(target_id),
            host_addr(target).parse().unwrap(),
        )
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

async fn listener_info(
    client: &reqwest::Client,
    target_id: &str,
    target: &TestAgent,
) -> Option<u16> {
    let port = host_addr(target).rsplit(':').next().unwrap().to_string();
    let url = format!(
        "https://{}:{port}/host/v1/info",
        bazaar_pki::host_dns_name(target_id)
    );
    client
        .get(url)
        .send()
        .await
        .ok()
        .map(|r| r.status().as_u16())
}

async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < PATIENCE, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_host_is_refused_everywhere_and_the_gossip_key_rotates() {
    let ca_dir = tempfile::tempdir().unwrap();
    let ca_path = ca_dir.path().to_str().unwrap();
    ok(bazaar(&["cluster", "init", "--dir", ca_path]));
    let a = TestAgent::start(options(vec!["--cluster-ca".into(), ca_path.into()], &[]))
        .expect("the CA's agent starts");
    let mut b = join(ca_dir.path(), &a);
    let mut c = join(ca_dir.path(), &a);
    let id = |t: &TestAgent| {
        let t = t.client();
        async move { t.info().await.unwrap().id }
    };
    let (a_id, b_id, c_id) = (id(&a).await, id(&b).await, id(&c).await);
    let all = [a_id.as_str(), b_id.as_str(), c_id.as_str()];
    // With a CA, a host's rows are taken only with the key the CA endorsed for it: that
    // every host sees every other shows the endorsements are made and published.
    for agent in [&a, &b, &c] {
        until("every host sees every host alive", async || {
            sees_alive(agent, &all).await
        })
        .await;
        assert!(std::fs::read_to_string(agent.data_dir.join("tls/row-key.endorsement")).is_ok());
    }
    let c_to_a = listener_client(&c, &c_id, &a_id, &a);
    let b_to_a = listener_client(&b, &b_id, &a_id, &a);
    assert_eq!(listener_info(&c_to_a, &a_id, &a).await, Some(200));

    // Revoke c, handing the revocation to b (not the CA's host).
    let out = ok(bazaar(&[
        "cluster",
        "revoke",
        &c_id,
        "--dir",
        ca_path,
        "--api-url",
        &b.url(),
        "--cluster-secret",
        TEST_SECRET,
    ]));
    assert!(out.contains("revoked"), "{out}");
    let took = until("a and b drop c", async || {
        sees_alive(&a, &all[..2]).await && sees_alive(&b, &all[..2]).await
    })
    .await;
    eprintln!("the revocation reached every host in {took:?}");
    // c's certificate no longer opens a's host listener; b's still does.
    until("a's host listener refuses c", async || {
        listener_info(&c_to_a, &a_id, &a).await != Some(200)
    })
    .await;
    // A new connection: the handshake is refused outright.
    let c_to_a = listener_client(&c, &c_id, &a_id, &a);
    assert_eq!(listener_info(&c_to_a, &a_id, &a).await, None);
    assert_eq!(listener_info(&b_to_a, &a_id, &a).await, Some(200));
    // c stays out: a few anti-entropy rounds later it is still gone, and every host keeps
    // the revocation for its next start.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(sees_alive(&a, &all[..2]).await);
    for agent in [&a, &b] {
        let kept = std::fs::read_to_string(agent.data_dir.join("revocations.json")).unwrap();
        assert!(kept.contains(&c_id), "{kept}");
    }
    // Neither side forgets across restarts: c comes back with its old certificate, b
    // restarts from its data dir; c is still refused.
    c.restart().expect("c restarts");
    b.restart().expect("b restarts");
    until("b is back", async || {
        sees_alive(&a, &all[..2]).await && sees_alive(&b, &all[..2]).await
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(sees_alive(&a, &all[..2]).await);
    assert!(sees_alive(&b, &all[..2]).await);
    // Revoking is for this CA's hosts only.
    let out = bazaar(&[
        "cluster",
        "revoke",
        "nobody",
        "--dir",
        ca_path,
        "--api-url",
        &a.url(),
        "--cluster-secret",
        TEST_SECRET,
    ]);
    assert!(!out.status.success());

    // Rotate the gossip key on every host the catalog knows: install, use, remove.
    let gossip_key = |args: &[&str]| {
        let mut all = vec!["cluster", "gossip-key"];
        all.extend_from_slice(args);
        let url = a.url();
        all.extend_from_slice(&["--api-url", &url, "--cluster-secret", TEST_SECRET]);
        ok(bazaar(&all))
    };
    let old = gossip_key(&["list"]).trim().to_string();
    let new = gossip_key(&["generate"]).trim().to_string();
    assert_ne!(old, new);
    for step in [["install", &new], ["use", &new], ["remove", &old]] {
        gossip_key(&step);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(sees_alive(&a, &all[..2]).await, "after {step:?}");
        assert!(sees_alive(&b, &all[..2]).await, "after {step:?}");
    }
    for agent in [&a, &b] {
        let kept = std::fs::read_to_string(agent.data_dir.join("gossip-keys")).unwrap();
        assert_eq!(kept.trim(), new);
    }
    // Removing the key in use is refused.
    let out = bazaar(&[
        "cluster",
        "gossip-key",
        "remove",
        &new,
        "--api-url",
        &a.url(),
        "--cluster-secret",
        TEST_SECRET,
    ]);
    assert!(!out.status.success());
}
