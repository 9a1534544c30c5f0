//! The cluster identity with real agents: `bazaar cluster init` and `join-token`, one agent
//! holding the CA, others joining with one-time tokens over TLS (CA pinned by the token),
//! certificates kept 0600 and renewed while machines run, and the host listener refusing
//! callers without a certificate of this cluster.

use crate::common;

use bazaar_testkit::{AgentOptions, TestAgent};
use common::EXE;
use std::path::Path;
use std::time::Duration;

fn bazaar(args: &[&str]) -> std::process::Output {
    std::process::Command::new(EXE).args(args).output().unwrap()
}

fn init_ca(dir: &Path) {
    let out = bazaar(&["cluster", "init", "--dir", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
}

fn join_token(dir: &Path, ttl: &str) -> String {
    let out = bazaar(&[
        "cluster",
        "join-token",
        "--dir",
        dir.to_str().unwrap(),
        "--ttl",
        ttl,
    ]);
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn options(args: &[String], env: &[(&str, &str)]) -> AgentOptions {
    let mut o = AgentOptions::new(EXE);
    o.extra_args = args.to_vec();
    o.extra_args
        .extend(["--host-listen".into(), "127.0.0.1:0".into()]);
    o.env = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    o
}

/// The agent holding the CA; certificates it issues last `validity_ms`.
fn ca_agent(ca_dir: &Path, validity_ms: u64) -> TestAgent {
    TestAgent::start(options(
        &[
            "--cluster-ca".into(),
            ca_dir.display().to_string(),
            "--cert-validity-ms".into(),
            validity_ms.to_string(),
        ],
        &[],
    ))
    .expect("the CA's agent starts")
}

fn joining_agent(token: &str, join_addr: &str) -> anyhow::Result<TestAgent> {
    TestAgent::start(options(
        &["--join-addr".into(), join_addr.into()],
        &[("BAZAAR_JOIN_TOKEN", token)],
    ))
}

fn host_addr(agent: &TestAgent) -> String {
    std::fs::read_to_string(agent.data_dir.join("host.addr"))
        .expect("host.addr written")
        .trim()
        .to_string()
}

async fn host_id(agent: &TestAgent) -> String {
    agent.client().info().await.unwrap().id
}

fn identity(agent: &TestAgent, id: &str) -> bazaar_pki::HostIdentity {
    bazaar_pki::HostIdentity::load(&agent.data_dir.join("tls"), id)
        .unwrap()
        .expect("the agent keeps its certificate")
}

/// A client of `target`'s host listener presenting `identity` (None: no certificate) and
/// checking that the server is `target_id` of `ca_pem`'s cluster.
fn listener_client(
    identity: Option<&bazaar_pki::HostIdentity>,
    ca_pem: &str,
    target_id: &str,
    target_addr: &str,
) -> reqwest::Client {
    let config = match identity {
        Some(identity) => {
            let handle = bazaar_pki::IdentityHandle::new(identity).unwrap();
            bazaar_pki::client_config(&handle, ca_pem).unwrap()
        }
        None => bazaar_pki::join_client_config(&bazaar_pki::ca_fingerprint(ca_pem).unwrap(), None)
            .unwrap(),
    };
    reqwest::Client::builder()
        .use_preconfigured_tls((*config).clone())
        .resolve(
            &bazaar_pki::host_dns_name(target_id),
            target_addr.parse().unwrap(),
        )
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

fn info_url(target_id: &str, target_addr: &str) -> String {
    let port = target_addr.rsplit(':').next().unwrap();
    format!(
        "https://{}:{port}/host/v1/info",
        bazaar_pki::host_dns_name(target_id)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_joins_with_a_token_and_the_host_listener_takes_only_cluster_certificates() {
    let ca_dir = tempfile::tempdir().unwrap();
    init_ca(ca_dir.path());
    // A second init must not replace the CA.
    let out = bazaar(&["cluster", "init", "--dir", ca_dir.path().to_str().unwrap()]);
    assert!(!out.status.success(), "{out:?}");

    let a = ca_agent(ca_dir.path(), 30 * 24 * 3600 * 1000);
    let a_addr = host_addr(&a);
    let a_id = host_id(&a).await;
    let token = join_token(ca_dir.path(), "1h");
    let b = joining_agent(&token, &a_addr).expect("b joins");
    let b_id = host_id(&b).await;

    // b's key and certificate (one file): 0600, the certificate naming b, signed by the CA.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(b.data_dir.join("tls").join(bazaar_pki::HOST_FILE))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let b_identity = identity(&b, &b_id);
    let ca_pem = std::fs::read_to_string(ca_dir.path().join("ca.crt")).unwrap();
    assert_eq!(b_identity.ca_pem(), ca_pem);

    // The token was used: another host cannot join with it.
    let err = joining_agent(&token, &a_addr).unwrap_err();
    assert!(err.to_string().contains("already used"), "{err}");
    // An expired token is refused too.
    let expired = join_token(ca_dir.path(), "1s");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let err = joining_agent(&expired, &a_addr).unwrap_err();
    assert!(err.to_string().contains("expired"), "{err}");

    // b calls a's host interface with its certificate: let through.
    let with_cert = listener_client(Some(&b_identity), &ca_pem, &a_id, &a_addr);
    let resp = with_cert
        .get(info_url(&a_id, &a_addr))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // Without a certificate (TLS, right CA): 401, even with the cluster secret.
    let anonymous = listener_client(None, &ca_pem, &a_id, &a_addr);
    let resp = anonymous
        .get(info_url(&a_id, &a_addr))
        .bearer_auth(bazaar_testkit::TEST_SECRET)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    // Plain HTTP on the host listener: no answer.
    let plain = reqwest::Client::new()
        .get(format!("http://{a_addr}/host/v1/info"))
        .bearer_auth(bazaar_testkit::TEST_SECRET)
        .send()
        .await;
    assert!(plain.map(|r| r.status() != 200).unwrap_or(true));
    // A certificate of another CA: the handshake fails.
    let other_dir = tempfile::tempdir().unwrap();
    let other = bazaar_pki::ClusterCa::init(other_dir.path()).unwrap();
    let other_token = other.new_join_token(Duration::from_secs(60)).unwrap();
    let request = bazaar_pki::HostRequest::new(&b_id).unwrap();
    let cert = other
        .join(
            &other_token,
            &b_id,
            &request.csr_pem,
            Duration::from_secs(600),
        )
        .unwrap();
    let intruder = request.into_identity(&cert, other.cert_pem()).unwrap();
    let foreign = listener_client(Some(&intruder), other.cert_pem(), &a_id, &a_addr);
    assert!(foreign.get(info_url(&a_id, &a_addr)).send().await.is_err());
    // b's certificate presented by a listener that claims to be another host: a client
    // meaning to reach a, but sent to b's listener, refuses it.
    let b_addr = host_addr(&b);
    let misled = listener_client(Some(&b_identity), &ca_pem, &a_id, &b_addr);
    assert!(misled.get(info_url(&a_id, &b_addr)).send().await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_are_renewed_before_expiry_while_machines_keep_running() {
    let ca_dir = tempfile::tempdir().unwrap();
    init_ca(ca_dir.path());
    // Certificates of 6 s: renewed after 4 s.
    let a = ca_agent(ca_dir.path(), 6000);
    let a_addr = host_addr(&a);
    let b = joining_agent(&join_token(ca_dir.path(), "1h"), &a_addr).expect("b joins");
    let b_id = host_id(&b).await;
    let b_addr = host_addr(&b);
    let client = b.client();
    let machine = client
        .create(&bazaar_testkit::create_request("renew", &["sleep", "1000"]))
        .await
        .unwrap();
    let started = common::wait_state(
        &client,
        &machine.id,
        bazaar_types::state::MachineState::Started,
    )
    .await;
    let first = identity(&b, &b_id);

    let renewed = bazaar_testkit::eventually(Duration::from_secs(15), || async {
        let now = identity(&b, &b_id);
        (now.not_after() > first.not_after()).then_some(now)
    })
    .await
    .expect("b renews its certificate");
    // The machine was not touched.
    let after = client.machine(&machine.id).await.unwrap();
    assert_eq!(after.state, bazaar_types::state::MachineState::Started);
    assert_eq!(after.instance_id, started.instance_id);
    // New connections to b get the renewed certificate: a client that trusts only a
    // chain whose leaf is the renewed one gets through.
    let ca_pem = std::fs::read_to_string(ca_dir.path().join("ca.crt")).unwrap();
    let a_id = host_id(&a).await;
    let a_identity = identity(&a, &a_id);
    let c = listener_client(Some(&a_identity), &ca_pem, &b_id, &b_addr);
    let resp = c.get(info_url(&b_id, &b_addr)).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(renewed.not_after() > std::time::SystemTime::now());
    // Once the first certificate has expired, the host is still reachable over mTLS.
    let wait = first
        .not_after()
        .duration_since(std::time::SystemTime::now())
        .unwrap_or_default();
    tokio::time::sleep(wait + Duration::from_millis(200)).await;
    let a_identity = identity(&a, &a_id);
    assert!(
        a_identity.not_after() > std::time::SystemTime::now(),
        "a renewed too"
    );
    let c = listener_client(Some(&a_identity), &ca_pem, &b_id, &b_addr);
    let resp = c.get(info_url(&b_id, &b_addr)).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        client.machine(&machine.id).await.unwrap().state,
        bazaar_types::state::MachineState::Started
    );
}

/// Established TCP connections (IPv4) whose remote port is `port`: /proc/net/tcp.
fn connections_to(port: u16) -> usize {
    let text = std::fs::read_to_string("/proc/net/tcp").unwrap();
    text.lines()
        .skip(1)
        .filter(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let remote_port = cols[2].rsplit(':').next().unwrap();
            cols[3] == "01" && u16::from_str_radix(remote_port, 16).unwrap() == port
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_reaches_other_hosts_over_mtls() {
    let ca_dir = tempfile::tempdir().unwrap();
    init_ca(ca_dir.path());
    let a = ca_agent(ca_dir.path(), 30 * 24 * 3600 * 1000);
    let token = join_token(ca_dir.path(), "1h");
    let mut o = options(
        &[
            "--join-addr".into(),
            host_addr(&a),
            "--join".into(),
            a.gossip_addr(),
        ],
        &[("BAZAAR_JOIN_TOKEN", &token)],
    );
    o.region = "far".into();
    let b = TestAgent::start(o).expect("b joins");
    let b_id = host_id(&b).await;
    let b_port: u16 = host_addr(&b).rsplit(':').next().unwrap().parse().unwrap();
    // a knows b's host listener from the catalog.
    let fly = bazaar_testkit::Fly::new(&a);
    bazaar_testkit::eventually(Duration::from_secs(10), || async {
        let (_, hosts) = fly.get("/platform/regions").await;
        (hosts.to_string().contains("far")).then_some(())
    })
    .await
    .expect("a sees b");
    fly.create_app("tls").await;
    let before = connections_to(b_port);
    let (status, machine) = fly
        .post(
            "/apps/tls/machines",
            serde_json::json!({"region": "far", "config": {"image": "process", "driver": "process", "init": {"exec": ["sleep", "1000"]}}}),
        )
        .await;
    assert_eq!(status, 200, "{machine}");
    let id = machine["id"].as_str().unwrap();
    let (status, got) = fly.get(&format!("/apps/tls/machines/{id}")).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["id"], id);
    // The bids, the claim and the read went to b's host listener (pooled connections to it).
    assert!(
        connections_to(b_port) > before,
        "no connection from a to b's host listener"
    );
    // b's own view agrees: the machine is b's.
    assert!(b.client().machine(id).await.is_ok(), "machine on {b_id}");
}
