//! The catalog's transport security (issue 15): gossip encrypted with a rotating keyring,
//! anti-entropy over mTLS, rows bound to the cluster CA, host revocation. Nodes run in one
//! process on 127.0.0.1 with short timings, checked by polling until a deadline.

mod common;

use common::eventually;

use bazaar_catalog::keyring::{derived_key, generate_key, parse_key};
use bazaar_catalog::trust::SigningKey;
use bazaar_catalog::{Catalog, CatalogConfig, HostRecord, HostStatus, MachineRecord};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const SECRET: &str = "test-cluster-secret";
const PATIENCE: Duration = Duration::from_secs(15);

fn config(id: &str, seeds: &[SocketAddr]) -> CatalogConfig {
    let mut c = CatalogConfig::new(id, "ams", "127.0.0.1:0".parse().unwrap(), SECRET);
    let mut seed = [7u8; 32];
    seed[..id.len()].copy_from_slice(id.as_bytes());
    c.signing_key = SigningKey::from_bytes(&seed);
    c.seeds = seeds.to_vec();
    c.probe_period = Duration::from_millis(200);
    c.dead_after = Duration::from_secs(2);
    c.anti_entropy_interval = Duration::from_millis(300);
    c
}

fn host(id: &str) -> HostRecord {
    HostRecord {
        id: id.into(),
        region: "ams".into(),
        api_addr: format!("127.0.0.1:4280/{id}"),
        ..Default::default()
    }
}

fn machine(id: &str) -> MachineRecord {
    MachineRecord {
        id: id.into(),
        app: "web".into(),
        name: format!("{id}-name"),
        region: "ams".into(),
        state: "started".into(),
        ..Default::default()
    }
}

/// Whether every node sees each of `ids` alive.
fn all_alive(nodes: &[Catalog], ids: &[&str]) -> bool {
    nodes.iter().all(|n| {
        ids.iter()
            .all(|id| n.host(id).is_some_and(|h| h.status == HostStatus::Alive))
    })
}

async fn start(configs: Vec<CatalogConfig>) -> Vec<Catalog> {
    let mut nodes = Vec::new();
    for c in configs {
        let node = Catalog::start(c).await.unwrap();
        node.publish_host(host(node.node_id()));
        nodes.push(node);
    }
    nodes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gossip_sealed_with_another_key_is_dropped() {
    let first = Catalog::start(config("g0", &[])).await.unwrap();
    first.publish_host(host("g0"));
    let seed = first.local_addr();
    let mut nodes = vec![first];
    nodes.extend(start(vec![config("g1", &[seed])]).await);
    eventually("the two nodes see each other", PATIENCE, || {
        all_alive(&nodes, &["g0", "g1"])
    })
    .await;

    // Same cluster secret, another gossip key: nothing it sends is opened.
    let mut outsider = config("g9", &[seed]);
    outsider.gossip_keys = vec![parse_key(&generate_key()).unwrap()];
    let outsider = Catalog::start(outsider).await.unwrap();
    let rejected = nodes[0].stats().rejected;
    eventually("the outsider's datagrams are refused", PATIENCE, || {
        nodes[0].stats().rejected >= rejected + 3
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    for n in &nodes {
        assert_eq!(n.stats().members, 1, "on {}: {:?}", n.node_id(), n.stats());
    }
    assert_eq!(outsider.stats().alive_members, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gossip_key_rotates_across_three_nodes_without_losing_a_member() {
    let old = hex::encode(derived_key(SECRET));
    let first = Catalog::start(config("r0", &[])).await.unwrap();
    first.publish_host(host("r0"));
    let seed = first.local_addr();
    let mut nodes = vec![first];
    nodes.extend(start(vec![config("r1", &[seed]), config("r2", &[seed])]).await);
    let ids = ["r0", "r1", "r2"];
    eventually("every node sees every host alive", PATIENCE, || {
        all_alive(&nodes, &ids)
    })
    .await;

    // A watcher samples membership all along: nobody may become suspect or down.
    let watched = nodes.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = stop.clone();
    let watcher = tokio::spawn(async move {
        let mut lapses = Vec::new();
        while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
            for n in &watched {
                for id in ids {
                    if let Some(h) = n.host(id) {
                        if h.status != HostStatus::Alive {
                            lapses.push(format!("{} saw {id} {:?}", n.node_id(), h.status));
                        }
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        lapses
    });
    // Each step on one node at a time, a few probe periods apart, as an operator would.
    let new = generate_key();
    let settle = Duration::from_millis(600);
    for n in &nodes {
        n.install_gossip_key(&new).unwrap();
        tokio::time::sleep(settle).await;
    }
    for n in &nodes {
        n.use_gossip_key(&new).unwrap();
        tokio::time::sleep(settle).await;
    }
    for n in &nodes {
        n.remove_gossip_key(&old).unwrap();
        assert_eq!(n.gossip_keys(), vec![new.clone()]);
        tokio::time::sleep(settle).await;
    }
    nodes[2].publish_machine(machine("after-rotation"));
    eventually("a change still spreads", PATIENCE, || {
        nodes.iter().all(|n| n.machine("after-rotation").is_some())
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let lapses = watcher.await.unwrap();
    assert!(
        lapses.is_empty(),
        "membership lapsed: {:?}",
        &lapses[..lapses.len().min(5)]
    );
    assert!(all_alive(&nodes, &ids));

    // A node still on the removed key is not heard any more.
    let stale = Catalog::start(config("r9", &[seed])).await.unwrap();
    stale.publish_host(host("r9"));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(nodes.iter().all(|n| n.stats().members == 2));
    assert!(nodes[0].stats().rejected > 0);
}

/// A cluster CA in a temporary directory, and what a host of it hands its catalog.
struct Ca {
    _dir: tempfile::TempDir,
    ca: bazaar_pki::ClusterCa,
}

impl Ca {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ca = bazaar_pki::ClusterCa::init(&dir.path().join("ca")).unwrap();
        Ca { _dir: dir, ca }
    }

    /// A certificate for `cert_id` and the CA's endorsement of `config`'s key for
    /// `cert_id`, put in `config` (whose node id may differ, to forge).
    fn admit(&self, config: &mut CatalogConfig, cert_id: &str) {
        let request = bazaar_pki::HostRequest::new(cert_id).unwrap();
        let cert = self
            .ca
            .issue_own(cert_id, &request.csr_pem, bazaar_pki::DEFAULT_CERT_VALIDITY)
            .unwrap();
        let identity = request.into_identity(&cert, self.ca.cert_pem()).unwrap();
        let row_key = config.signing_key.verifying_key().to_bytes();
        config.cluster = Some(ClusterIdentity {
            identity: bazaar_pki::IdentityHandle::new(&identity).unwrap(),
            ca_pem: self.ca.cert_pem().to_string(),
            key_endorsement: self.ca.endorse_row_key(cert_id, &row_key).unwrap(),
            revocations: Vec::new(),
        });
    }

    fn config(&self, id: &str, seeds: &[SocketAddr]) -> CatalogConfig {
        let mut c = config(id, seeds);
        self.admit(&mut c, id);
        c
    }

    /// `n` nodes `{prefix}0..` of this CA joined through the first, each with a host row.
    async fn cluster(&self, prefix: &str, n: usize) -> Vec<Catalog> {
        let first = Catalog::start(self.config(&format!("{prefix}0"), &[]))
            .await
            .unwrap();
        first.publish_host(host(first.node_id()));
        let seed = first.local_addr();
        let mut nodes = vec![first];
        let rest = (1..n)
            .map(|i| self.config(&format!("{prefix}{i}"), &[seed]))
            .collect();
        nodes.extend(start(rest).await);
        let ids: Vec<String> = nodes.iter().map(|n| n.node_id().to_owned()).collect();
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        eventually("every node sees every host alive", PATIENCE, || {
            all_alive(&nodes, &ids)
        })
        .await;
        nodes
    }
}

use bazaar_catalog::ClusterIdentity;

/// Whether a connection is closed by the peer within `within`.
async fn closed_within(s: &mut tokio::net::TcpStream, within: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
            Err(_) => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_peer_without_a_cluster_certificate_is_refused() {
    let ca = Ca::new();
    let nodes = ca.cluster("t", 2).await;
    nodes[1].publish_machine(machine("m-member"));
    eventually("the members sync", PATIENCE, || {
        nodes.iter().all(|n| n.machine("m-member").is_some())
    })
    .await;

    // The cluster secret and the gossip key, but no certificate: every sync it starts
    // fails, and what it publishes is not taken.
    let plain = Catalog::start(config("t9", &[nodes[0].local_addr()]))
        .await
        .unwrap();
    plain.publish_host(host("t9"));
    plain.publish_machine(machine("m-plain"));
    eventually("its syncs are refused", PATIENCE, || {
        plain.stats().syncs_failed >= 3
    })
    .await;
    assert_eq!(plain.stats().syncs, plain.stats().syncs_failed);
    assert!(nodes.iter().all(|n| n.machine("m-plain").is_none()));
    assert!(nodes.iter().all(|n| n.host("t9").is_none()));

    // A frame header signed with the cluster secret, announcing 3 MiB: the TLS server
    // takes it for a bad handshake and closes at once, before reading any payload.
    let mut frame = Vec::new();
    bazaar_catalog::wire::Authenticator::new(SECRET)
        .write_frame(&mut frame, "t9", &vec![0u8; 3 << 20])
        .await
        .unwrap();
    let mut s = tokio::net::TcpStream::connect(nodes[0].local_addr())
        .await
        .unwrap();
    let rejected = nodes[0].stats().rejected;
    use tokio::io::AsyncWriteExt;
    s.write_all(&frame[..64]).await.unwrap();
    assert!(closed_within(&mut s, Duration::from_secs(2)).await);
    eventually("the connection is counted as rejected", PATIENCE, || {
        nodes[0].stats().rejected > rejected
    })
    .await;
    // The members still sync with each other.
    nodes[0].publish_machine(machine("m-after"));
    eventually("members still sync", PATIENCE, || {
        nodes[1].machine("m-after").is_some()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_for_another_host_are_refused_even_from_a_member_of_the_ca() {
    let ca = Ca::new();
    let nodes = ca.cluster("f", 2).await;
    let seed = nodes[0].local_addr();
    // x9 is a real member (its own certificate and endorsed key). It claims to be f2, a
    // host the cluster has not seen yet: under trust on first use it would own that id.
    let mut rogue = config("f2", &[seed]);
    rogue.signing_key = SigningKey::from_bytes(&[0xee; 32]);
    ca.admit(&mut rogue, "x9");
    let rogue = Catalog::start(rogue).await.unwrap();
    let mut forged = host("f2");
    forged.api_addr = "127.6.6.6:4280".into();
    // The rogue keeps publishing, as an attacker would: its first broadcasts may go out
    // before it has joined (its sync connections are refused, so only gossip carries them).
    eventually("the forged rows are refused", PATIENCE, || {
        rogue.publish_host(forged.clone());
        rogue.publish_machine(machine("m-forged"));
        nodes.iter().all(|n| n.stats().rows_refused >= 2)
    })
    .await;
    rogue.kill().await;

    // The real f2 arrives: its rows are taken everywhere, the forgery never was.
    let real = Catalog::start(ca.config("f2", &[seed])).await.unwrap();
    real.publish_host(host("f2"));
    real.publish_machine(machine("m-real"));
    eventually("the real f2's rows arrive", PATIENCE, || {
        nodes.iter().all(|n| n.machine("m-real").is_some())
    })
    .await;
    for n in &nodes {
        assert_eq!(n.host("f2").unwrap().record.api_addr, host("f2").api_addr);
        assert!(n.machine("m-forged").is_none(), "on {}", n.node_id());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_host_is_refused_everywhere_within_the_propagation_time() {
    let ca = Ca::new();
    let nodes = ca.cluster("v", 3).await;
    for n in &nodes {
        n.publish_machine(machine(&format!("m-{}", n.node_id())));
    }
    eventually("every machine everywhere", PATIENCE, || {
        nodes.iter().all(|n| {
            ["m-v0", "m-v1", "m-v2"]
                .iter()
                .all(|m| n.machine(m).is_some())
        })
    })
    .await;

    // A revocation not signed by this CA is refused.
    let other = Ca::new();
    let mut stray = config("v2", &[]);
    other.admit(&mut stray, "v2");
    assert!(nodes[0].revoke(&other.ca.revoke("v2").unwrap()).is_err());
    assert!(!nodes[0].is_revoked("v2"));

    let revocation = ca.ca.revoke("v2").unwrap();
    let started = Instant::now();
    nodes[0].revoke(&revocation).unwrap();
    let (good, revoked) = nodes.split_at(2);
    eventually("every other node drops v2", PATIENCE, || {
        good.iter()
            .all(|n| n.is_revoked("v2") && n.host("v2").is_none() && n.machine("m-v2").is_none())
    })
    .await;
    let took = started.elapsed();
    // What v2 publishes from now on is refused, its syncs too.
    let refused = good[1].stats().rows_refused + good[1].stats().rejected;
    revoked[0].publish_machine(machine("m-v2-late"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    for n in good {
        assert!(n.machine("m-v2-late").is_none(), "on {}", n.node_id());
        assert!(n.host("v2").is_none());
    }
    assert!(good[1].stats().rows_refused + good[1].stats().rejected > refused);
    // The others keep working, and a node that joins later learns the revocation.
    good[1].publish_machine(machine("m-v1-after"));
    let late = Catalog::start(ca.config("v3", &[good[1].local_addr()]))
        .await
        .unwrap();
    late.publish_host(host("v3"));
    eventually(
        "the others still sync, the newcomer learns",
        PATIENCE,
        || {
            good[0].machine("m-v1-after").is_some()
                && late.machine("m-v1-after").is_some()
                && late.is_revoked("v2")
        },
    )
    .await;
    assert!(late.host("v2").is_none());
    assert_eq!(late.revocations(), vec![revocation]);
    eprintln!("revocation reached every node in {took:?}");
}
