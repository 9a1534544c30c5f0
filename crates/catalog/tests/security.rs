//! The catalog's transport security (issue 15): gossip encrypted with a rotating keyring,
//! anti-entropy over mTLS, rows bound to the cluster CA, host revocation. Nodes run in one
//! process on 127.0.0.1 with short timings, checked by polling until a deadline.

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

async fn eventually(what: &str, within: Duration, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(
            start.elapsed() < within,
            "timed out after {within:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
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
