//! Hostile clients of the transport between hosts (issue 15), on real agents whose cluster
//! has a CA (the test kit's default): a proxy hop and host-interface calls from a process
//! without a cluster certificate, or with a certificate of another CA, are refused and
//! change nothing; a server holding another host's certificate cannot take the hops meant
//! for a machine's owner; `--api-tls` refuses plain HTTP and serves the CLI over HTTPS.

use crate::proxy;

use bazaar_pki::{ClusterCa, HostIdentity, HostRequest, IdentityHandle};
use proxy::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The CA certificate of the cluster of `c` (agent 0 holds the CA).
fn cluster_ca_pem(c: &Cluster) -> String {
    let dir = c.agents[0].cluster_ca_dir().expect("the cluster has a CA");
    std::fs::read_to_string(dir.join("ca.crt")).unwrap()
}

/// A host identity for `host_id` issued by a CA of its own (another cluster).
fn foreign_identity(dir: &std::path::Path, host_id: &str) -> HostIdentity {
    let ca = ClusterCa::init(dir).unwrap();
    let request = HostRequest::new(host_id).unwrap();
    let cert = ca
        .issue_own(host_id, &request.csr_pem, Duration::from_secs(3600))
        .unwrap();
    request.into_identity(&cert, ca.cert_pem()).unwrap()
}

/// The identity agent `i` holds in its data dir.
async fn agent_identity(c: &Cluster, i: usize) -> HostIdentity {
    let id = c.agents[i].client().info().await.unwrap().id;
    HostIdentity::load(&c.agents[i].data_dir.join("tls"), &id)
        .unwrap()
        .expect("the agent has a certificate")
}

/// A TLS client trusting `ca_pem` and presenting `identity` (none: no certificate).
fn tls_client(ca_pem: &str, identity: Option<&HostIdentity>) -> tokio_rustls::TlsConnector {
    let config = match identity {
        Some(identity) => {
            bazaar_pki::client_config(&IdentityHandle::new(identity).unwrap(), ca_pem).unwrap()
        }
        // Trusts the cluster's CA, presents nothing.
        None => {
            let fingerprint = bazaar_pki::ca_fingerprint(ca_pem).unwrap();
            bazaar_pki::join_client_config(&fingerprint, None).unwrap()
        }
    };
    tokio_rustls::TlsConnector::from(config)
}

/// Sends `request` over TLS to `addr` (server name `host_id`'s) and reads the answer: the
/// text, or why there is none (handshake or connection refused).
async fn tls_exchange(
    connector: &tokio_rustls::TlsConnector,
    addr: SocketAddr,
    host_id: &str,
    request: &str,
) -> Result<String, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from(bazaar_pki::host_dns_name(host_id)).unwrap();
    let mut tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tls.write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    tls.flush().await.map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = [0u8; 4096];
        loop {
            match tls.read(&mut buf).await {
                Ok(0) => return Ok(()),
                Ok(n) => {
                    answer.extend_from_slice(&buf[..n]);
                    if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                        return Ok(());
                    }
                }
                Err(e) => return Err(e.to_string()),
            }
        }
    })
    .await
    .map_err(|_| "no answer within 10 s".to_string())?;
    read?;
    if answer.is_empty() {
        return Err("closed without an answer".into());
    }
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

/// A hop request for machine `id`, as another host's proxy sends it.
fn hop_request(app: &str, id: &str, extra: &str) -> String {
    format!(
        "GET /hostile HTTP/1.1\r\nhost: {app}.localhost\r\nbazaar-proxy-machine: {id}\r\n{extra}connection: close\r\n\r\n"
    )
}

/// How many requests machine `id`'s backend has served, asked through its own host's proxy
/// (the request asking counts too).
async fn served(c: &Cluster, owner: usize, app: &str, id: &str) -> u64 {
    let (s, _, body) = c
        .get(owner, app, "/", &[("fly-force-instance-id", id)])
        .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    serde_json::from_str::<Value>(&body).unwrap()["count"]
        .as_u64()
        .unwrap()
}

/// The index of the agent whose host id is `host_id`.
async fn index_of(c: &Cluster, host_id: &str) -> usize {
    for (i, a) in c.agents.iter().enumerate() {
        if a.client().info().await.unwrap().id == host_id {
            return i;
        }
    }
    panic!("no agent {host_id}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_proxy_hop_without_a_certificate_of_this_cluster_is_refused_and_delivers_nothing() {
    let c = Cluster::start(2, &[]);
    c.create_app("hop").await;
    let id = c.create_machine("hop", json!({}), json!({})).await;
    let owner_id = c.machine("hop", &id).await["host_id"]
        .as_str()
        .unwrap()
        .to_string();
    let owner = index_of(&c, &owner_id).await;
    let entry = 1 - owner;
    // The real path: the entry proxy hands the request to the owner over mTLS.
    c.wait_routable(entry, "hop").await;
    let (s, _, body) = c.get(entry, "hop", "/", &[]).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    assert!(
        !body.contains("bazaar-proxy-hop"),
        "no hop secret reaches the machine: {body}"
    );
    let before = served(&c, owner, "hop", &id).await;
    let secret = format!("bazaar-proxy-hop: {}\r\n", bazaar_testkit::TEST_SECRET);

    // 1. The cluster secret on the plain proxy port no longer authorizes a hop.
    let mut plain = tokio::net::TcpStream::connect(c.agents[owner].proxy_addr())
        .await
        .unwrap();
    plain
        .write_all(hop_request("hop", &id, &secret).as_bytes())
        .await
        .unwrap();
    let mut answer = String::new();
    plain.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    // Nor a TCP hop (an upgrade) with it.
    let mut plain = tokio::net::TcpStream::connect(c.agents[owner].proxy_addr())
        .await
        .unwrap();
    plain
        .write_all(
            format!(
                "GET / HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: bazaar-tcp\r\n\
                 {secret}bazaar-proxy-machine: {id}\r\nbazaar-proxy-tcp-port: 8080\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut head = vec![0u8; 512];
    let n = plain.read(&mut head).await.unwrap();
    let head = String::from_utf8_lossy(&head[..n]);
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");

    // 2. The hop listener: no client certificate, refused in the handshake.
    let hop_addr = c.agents[owner].proxy_hop_addr().expect("a hop listener");
    let ca_pem = cluster_ca_pem(&c);
    let anonymous = tls_client(&ca_pem, None);
    let refused = tls_exchange(
        &anonymous,
        hop_addr,
        &owner_id,
        &hop_request("hop", &id, ""),
    )
    .await;
    assert!(
        refused.is_err(),
        "served without a certificate: {refused:?}"
    );
    let refused = tls_exchange(
        &anonymous,
        hop_addr,
        &owner_id,
        &hop_request("hop", &id, &secret),
    )
    .await;
    assert!(
        refused.is_err(),
        "served with the cluster secret and no certificate: {refused:?}"
    );

    // 3. A certificate of another CA (naming the entry host, even): refused.
    let other_ca = tempfile::tempdir().unwrap();
    let entry_id = c.agents[entry].client().info().await.unwrap().id;
    let foreign = foreign_identity(other_ca.path(), &entry_id);
    let foreign_client = tls_client(&ca_pem, Some(&foreign));
    let refused = tls_exchange(
        &foreign_client,
        hop_addr,
        &owner_id,
        &hop_request("hop", &id, ""),
    )
    .await;
    assert!(
        refused.is_err(),
        "served with another CA's certificate: {refused:?}"
    );

    // Nothing reached the machine: the next request it serves is the one after `before`.
    assert_eq!(served(&c, owner, "hop", &id).await, before + 1);

    // The control: the same request with the entry host's own certificate is served.
    let member = tls_client(&ca_pem, Some(&agent_identity(&c, entry).await));
    let answer = tls_exchange(&member, hop_addr, &owner_id, &hop_request("hop", &id, ""))
        .await
        .expect("a member's hop is served");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn host_interface_calls_without_a_certificate_of_this_cluster_change_nothing() {
    let c = Cluster::start(2, &[]);
    let target_id = c.agents[1].client().info().await.unwrap().id;
    let host_addr = c.agents[1].host_listen_addr().expect("a host listener");
    let ca_pem = cluster_ca_pem(&c);
    let create = serde_json::to_string(&bazaar_testkit::create_request(
        "intruder",
        &["sleep", "1000"],
    ))
    .unwrap();
    let post = |auth: &str| {
        format!(
            "POST /host/v1/machines HTTP/1.1\r\nhost: x\r\n{auth}content-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{create}",
            create.len()
        )
    };
    let with_secret = format!("authorization: Bearer {}\r\n", bazaar_testkit::TEST_SECRET);
    // No certificate: the listener answers 401, even to the cluster secret.
    let anonymous = tls_client(&ca_pem, None);
    for auth in ["", with_secret.as_str()] {
        let answer = tls_exchange(&anonymous, host_addr, &target_id, &post(auth))
            .await
            .expect("an answer");
        assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    }
    // Another CA's certificate, naming a real host of this cluster: the handshake fails.
    let other_ca = tempfile::tempdir().unwrap();
    let agent0_id = c.agents[0].client().info().await.unwrap().id;
    let foreign = tls_client(
        &ca_pem,
        Some(&foreign_identity(other_ca.path(), &agent0_id)),
    );
    let refused = tls_exchange(&foreign, host_addr, &target_id, &post("")).await;
    assert!(refused.is_err(), "served: {refused:?}");
    // Nothing was created.
    let machines = c.agents[1]
        .client()
        .machines(Some("intruder"), true)
        .await
        .unwrap();
    assert!(machines.is_empty(), "{machines:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_with_another_hosts_certificate_cannot_take_the_owners_hops() {
    // Slow failure detection: the killed owner stays routable for a while.
    let mut c = Cluster::start_with(3, |_, o| {
        let at = o
            .extra_args
            .iter()
            .position(|a| a == "--dead-after-ms")
            .unwrap();
        o.extra_args[at + 1] = "60000".into();
    });
    c.create_app("spoof").await;
    let id = c.create_machine("spoof", json!({}), json!({})).await;
    let owner_id = c.machine("spoof", &id).await["host_id"]
        .as_str()
        .unwrap()
        .to_string();
    let owner = index_of(&c, &owner_id).await;
    let entry = (owner + 1) % 3;
    let impostor = (owner + 2) % 3;
    c.wait_routable(entry, "spoof").await;
    let hop_addr = c.agents[owner].proxy_hop_addr().unwrap();
    let ca_pem = cluster_ca_pem(&c);
    // The impostor holds a real certificate of this cluster, for its own host id, and
    // takes the owner's hop address once the owner is gone.
    let identity = agent_identity(&c, impostor).await;
    let config =
        bazaar_pki::server_config(&IdentityHandle::new(&identity).unwrap(), &ca_pem).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    c.agents[owner].kill9();
    let listener = tokio::net::TcpListener::bind(hop_addr).await.unwrap();
    let attempts = Arc::new(AtomicUsize::new(0));
    let handshakes = Arc::new(AtomicUsize::new(0));
    {
        let (attempts, handshakes) = (attempts.clone(), handshakes.clone());
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                attempts.fetch_add(1, Ordering::SeqCst);
                let acceptor = acceptor.clone();
                let handshakes = handshakes.clone();
                tokio::spawn(async move {
                    if let Ok(mut tls) = acceptor.accept(tcp).await {
                        // The client finished its side: it would now send the request.
                        let mut buf = [0u8; 1];
                        if matches!(tls.read(&mut buf).await, Ok(n) if n > 0) {
                            handshakes.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                });
            }
        });
    }
    let (s, _, body) = c.get(entry, "spoof", "/", &[]).await;
    assert_ne!(s, StatusCode::OK, "answered: {body}");
    assert!(
        attempts.load(Ordering::SeqCst) > 0,
        "the entry proxy never tried the owner's hop address (status {s}: {body})"
    );
    assert_eq!(
        handshakes.load(Ordering::SeqCst),
        0,
        "a request was sent to a server that is not the machine's owner"
    );
}

/// Runs the CLI against `api_url`, trusting `ca_cert` when given.
fn cli(api_url: &str, ca_cert: Option<&std::path::Path>, args: &[&str]) -> std::process::Output {
    let mut cmd = std::process::Command::new(EXE);
    cmd.args(args)
        .env("BAZAAR_API_URL", api_url)
        .env("BAZAAR_TOKEN", bazaar_testkit::api_token())
        .env_remove("BAZAAR_CA_CERT");
    if let Some(ca) = ca_cert {
        cmd.env("BAZAAR_CA_CERT", ca);
    }
    cmd.output().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn api_tls_refuses_plain_http_and_serves_the_cli() {
    let agents = bazaar_testkit::start_cluster(std::path::Path::new(EXE), 2, |_, o| {
        o.extra_args.push("--api-tls".into());
    })
    .expect("cluster starts");
    let ca_cert = agents[0].cluster_ca_dir().unwrap().join("ca.crt");
    // Host 1 joined: its API certificate came from the CA's host over mTLS.
    let plain_url = agents[1].url();
    let https_url = plain_url.replacen("http://", "https://", 1);

    // Plain HTTP: a 400 in Fly's error shape, and nothing is done.
    let plain = reqwest::Client::new();
    let r = plain
        .post(format!("{plain_url}/v1/apps"))
        .bearer_auth(bazaar_testkit::api_token())
        .json(&json!({"app_name": "plaintext", "org_slug": "personal"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let v: Value = r.json().await.unwrap();
    assert!(v["error"].as_str().unwrap().contains("HTTPS"), "{v}");

    // Without the cluster CA the CLI does not trust the API's certificate.
    let out = cli(&https_url, None, &["apps", "list"]);
    assert!(!out.status.success(), "{out:?}");

    // With it, the CLI works end to end: an app, a machine placed on either host (calls
    // between hosts over mTLS), and the list.
    let out = cli(&https_url, Some(&ca_cert), &["apps", "create", "secure"]);
    assert!(out.status.success(), "{out:?}");
    let out = cli(
        &https_url,
        Some(&ca_cert),
        &["machine", "run", "-a", "secure", "--", "sleep", "1000"],
    );
    assert!(out.status.success(), "{out:?}");
    let out = cli(&https_url, Some(&ca_cert), &["apps", "list", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("secure"), "{text}");
    assert!(!text.contains("plaintext"), "{text}");

    // The certificate names the host and the address it serves at, from this cluster's CA.
    let ca_pem = std::fs::read(&ca_cert).unwrap();
    let strict = reqwest::Client::builder()
        .tls_certs_only(reqwest::Certificate::from_pem_bundle(&ca_pem).unwrap())
        .build()
        .unwrap();
    for agent in &agents {
        let url = agent.url().replacen("http://", "https://", 1);
        let r = strict.get(format!("{url}/health")).send().await.unwrap();
        assert!(r.status().is_success());
        let localhost = url.replacen("127.0.0.1", "localhost", 1);
        let r = strict
            .get(format!("{localhost}/health"))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
    }
}
