//! Multi-node tests of the catalog: several nodes in one process on 127.0.0.1, with short
//! timings, checked by polling until a deadline (never by fixed long sleeps).

mod common;

use common::eventually;

use bazaar_catalog::keyring::{derived_key, Keyring};
use bazaar_catalog::trust::SigningKey;
use bazaar_catalog::wire::{Authenticator, DGRAM_SWIM};
use bazaar_catalog::{
    AppRecord, Catalog, CatalogConfig, Change, HostRecord, HostStatus, MachineFilter, MachineRecord,
};
use bazaar_types::host::Resources;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

const SECRET: &str = "test-cluster-secret";
const DEAD_AFTER: Duration = Duration::from_secs(2);
/// How long convergence may take in a test before it fails.
const PATIENCE: Duration = Duration::from_secs(15);
/// Convergence after a partition heals (see the partition test).
const HEAL_PATIENCE: Duration = Duration::from_secs(60);

fn config(id: &str, listen: SocketAddr, seeds: &[SocketAddr]) -> CatalogConfig {
    let mut c = CatalogConfig::new(id, "ams", listen, SECRET);
    // A host keeps its key across restarts (the agent stores it in its data dir).
    let mut seed = [7u8; 32];
    seed[..id.len()].copy_from_slice(id.as_bytes());
    c.signing_key = SigningKey::from_bytes(&seed);
    c.seeds = seeds.to_vec();
    c.probe_period = Duration::from_millis(200);
    c.dead_after = DEAD_AFTER;
    c.anti_entropy_interval = Duration::from_millis(300);
    c.tombstone_ttl = Duration::from_secs(1);
    c
}

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn host(id: &str, free_mb: u64) -> HostRecord {
    HostRecord {
        id: id.into(),
        region: "ams".into(),
        api_addr: format!("127.0.0.1:4280/{id}"),
        capacity: Resources {
            cpus: 8,
            memory_mb: 16_384,
        },
        free: Resources {
            cpus: 8,
            memory_mb: free_mb,
        },
        ..Default::default()
    }
}

fn machine(id: &str, app: &str, state: &str) -> MachineRecord {
    MachineRecord {
        id: id.into(),
        app: app.into(),
        name: format!("{id}-name"),
        region: "ams".into(),
        state: state.into(),
        instance_id: format!("{id}-{state}"),
        ..Default::default()
    }
}

/// Starts `n` nodes (`n0`, `n1`, ...) that join through `n0`, each publishing its host
/// record, and waits until every node sees every host alive.
async fn cluster(n: usize) -> Vec<Catalog> {
    let first = Catalog::start(config("n0", any_port(), &[])).await.unwrap();
    let seed = first.local_addr();
    let mut nodes = vec![first];
    for i in 1..n {
        let c = Catalog::start(config(&format!("n{i}"), any_port(), &[seed]))
            .await
            .unwrap();
        nodes.push(c);
    }
    for c in &nodes {
        c.publish_host(host(c.node_id(), 8000));
    }
    let all = nodes.clone();
    eventually("every node sees every host alive", PATIENCE, || {
        all.iter().all(|c| {
            let hosts = c.hosts();
            hosts.len() == n && hosts.iter().all(|h| h.status == HostStatus::Alive)
        })
    })
    .await;
    nodes
}

/// Polls `check` every 20 ms until it holds (true) or `within` has passed (false), for a
/// caller that says what it saw when it fails.
async fn eventually_or_timeout(within: Duration, mut check: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if check() {
            return true;
        }
        if start.elapsed() > within {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Each node's digest and the status it holds of every host, one line per node.
fn views(nodes: &[Catalog]) -> String {
    nodes
        .iter()
        .map(|n| {
            let mut hosts: Vec<String> = n
                .hosts()
                .iter()
                .map(|h| format!("{}={}", h.record.id, h.status.as_str()))
                .collect();
            hosts.sort();
            format!("{}: {} {}\n", n.node_id(), n.digest(), hosts.join(" "))
        })
        .collect()
}

fn status_on(c: &Catalog, host: &str) -> Option<HostStatus> {
    c.host(host).map(|h| h.status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machines_propagate_change_and_leave_tombstones() {
    let nodes = cluster(3).await;
    let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
    let mut changes = c.subscribe();

    a.publish_machine(machine("m1", "web", "started"));
    eventually("m1 reaches b and c", PATIENCE, || {
        [b, c].iter().all(|n| {
            n.machine("m1")
                .is_some_and(|m| m.record.state == "started" && m.host_status == "ok")
        })
    })
    .await;
    let m = b.machine("m1").unwrap();
    assert_eq!(m.record.host_id, "n0");
    assert_eq!(b.machines(&MachineFilter::app("web")).len(), 1);
    assert!(b.machines(&MachineFilter::app("api")).is_empty());

    // Someone watching c was told.
    let change = tokio::time::timeout(PATIENCE, changes.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(change, Change::Machine { ref id, ref app } if id == "m1" && app == "web"));

    // A state change replaces the row whole, with a higher version.
    let v1 = m.version;
    a.publish_machine(machine("m1", "web", "stopped"));
    eventually("the stop reaches b and c", PATIENCE, || {
        [b, c]
            .iter()
            .all(|n| n.machine("m1").is_some_and(|m| m.record.state == "stopped"))
    })
    .await;
    assert!(c.machine("m1").unwrap().version > v1);
    let stopped = MachineFilter {
        states: vec!["stopped".into()],
        ..Default::default()
    };
    assert_eq!(c.machines(&stopped).len(), 1);

    // Free capacity travels with the host record.
    b.publish_host(host("n1", 1234));
    eventually("b's new free memory reaches a", PATIENCE, || {
        a.host("n1")
            .is_some_and(|h| h.record.free.memory_mb == 1234)
    })
    .await;

    // A delete leaves a tombstone everywhere, which is collected later.
    a.delete_machine("m1");
    eventually("the tombstone reaches b and c", PATIENCE, || {
        [b, c]
            .iter()
            .all(|n| n.machine("m1").is_some_and(|m| m.deleted))
    })
    .await;
    assert!(c.machines(&MachineFilter::default()).is_empty());
    let with_deleted = MachineFilter {
        include_deleted: true,
        ..Default::default()
    };
    assert_eq!(c.machines(&with_deleted).len(), 1);
    assert_eq!(c.machine("m1").unwrap().record.state, "destroyed");
    eventually("the tombstone is collected everywhere", PATIENCE, || {
        nodes.iter().all(|n| n.machine("m1").is_none())
    })
    .await;
    eventually("replicas converge", PATIENCE, || {
        nodes.iter().all(|n| n.digest() == a.digest())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_node_is_declared_dead_then_comes_back_with_newer_rows() {
    let nodes = cluster(4).await;
    let d = &nodes[3];
    let addr = d.local_addr();
    d.publish_machine(machine("md", "api", "started"));
    eventually("md reaches everyone", PATIENCE, || {
        nodes.iter().all(|n| n.machine("md").is_some())
    })
    .await;
    let old_version = nodes[0].machine("md").unwrap().version;

    d.kill().await;
    let others = &nodes[..3];
    let took = eventually("every other node declares n3 dead", PATIENCE, || {
        others
            .iter()
            .all(|n| status_on(n, "n3") == Some(HostStatus::Dead))
    })
    .await;
    assert!(
        took <= DEAD_AFTER + Duration::from_millis(1500),
        "detection took {took:?}, dead_after is {DEAD_AFTER:?}"
    );
    for n in others {
        let m = n.machine("md").unwrap();
        assert_eq!(m.host_status, "unreachable");
        assert!(!m.deleted, "a dead host's rows stay");
    }

    // Restart on the same address with the same id: an empty replica, rebuilt from the
    // agent's store (republished) and from gossip.
    let d2 = Catalog::start(config("n3", addr, &[nodes[0].local_addr()]))
        .await
        .unwrap();
    d2.publish_host(host("n3", 4000));
    d2.publish_machine(machine("md", "api", "stopped"));
    eventually("n3 is alive again everywhere", PATIENCE, || {
        others
            .iter()
            .all(|n| status_on(n, "n3") == Some(HostStatus::Alive))
    })
    .await;
    eventually("the republished row wins everywhere", PATIENCE, || {
        others.iter().all(|n| {
            n.machine("md").is_some_and(|m| {
                m.record.state == "stopped" && m.host_status == "ok" && m.version > old_version
            })
        })
    })
    .await;
    // The restarted node got everyone else's rows back.
    eventually("n3 knows every host again", PATIENCE, || {
        d2.hosts().len() == 4
    })
    .await;
    let mut all = others.to_vec();
    all.push(d2);
    eventually("replicas converge", PATIENCE, || {
        all.iter().all(|n| n.digest() == all[0].digest())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_leave_is_seen_at_once() {
    let nodes = cluster(3).await;
    nodes[2].publish_machine(machine("mc", "web", "started"));
    eventually("mc reaches everyone", PATIENCE, || {
        nodes.iter().all(|n| n.machine("mc").is_some())
    })
    .await;
    nodes[2].leave().await;
    let took = eventually("n2 is seen as left", PATIENCE, || {
        nodes[..2]
            .iter()
            .all(|n| status_on(n, "n2") == Some(HostStatus::Left))
    })
    .await;
    assert!(took < Duration::from_millis(500), "leave took {took:?}");
    assert_eq!(nodes[0].machine("mc").unwrap().host_status, "unreachable");
    // And it stays left (not dead) afterwards.
    tokio::time::sleep(DEAD_AFTER).await;
    assert_eq!(status_on(&nodes[0], "n2"), Some(HostStatus::Left));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_groups_keep_serving_and_converge_after_healing() {
    let nodes = cluster(5).await;
    let (left, right) = nodes.split_at(3);
    let left_addrs: Vec<SocketAddr> = left.iter().map(Catalog::local_addr).collect();
    let right_addrs: Vec<SocketAddr> = right.iter().map(Catalog::local_addr).collect();
    for n in left {
        n.set_partitioned(&right_addrs);
    }
    for n in right {
        n.set_partitioned(&left_addrs);
    }

    // Both sides keep working on their own.
    left[0].publish_machine(machine("ml", "web", "started"));
    right[0].publish_machine(machine("mr", "web", "started"));
    eventually("each side sees its own new machine", PATIENCE, || {
        left.iter().all(|n| n.machine("ml").is_some())
            && right.iter().all(|n| n.machine("mr").is_some())
    })
    .await;
    eventually("each side declares the other dead", PATIENCE, || {
        left.iter()
            .all(|n| status_on(n, "n3") == Some(HostStatus::Dead))
            && right
                .iter()
                .all(|n| status_on(n, "n0") == Some(HostStatus::Dead))
    })
    .await;
    assert!(left.iter().all(|n| n.machine("mr").is_none()));
    assert!(right.iter().all(|n| n.machine("ml").is_none()));
    // Each side's own records are still served, with host_status ok.
    assert_eq!(left[1].machine("ml").unwrap().host_status, "ok");
    // More changes while partitioned: these never get broadcast across.
    left[1].publish_machine(machine("ml2", "api", "started"));
    right[1].publish_machine(machine("mr2", "api", "started"));

    for n in &nodes {
        n.set_partitioned(&[]);
    }
    // Usually 3 s; the bound is wide because rejoining members declared dead across a
    // healed partition waits for background seed retries, which a loaded CI box slows
    // (seen once past 15 s in CI; a known issue to look into).
    let seen = std::cell::RefCell::new(String::new());
    let converged = eventually_or_timeout(HEAL_PATIENCE, || {
        let d = nodes[0].digest();
        *seen.borrow_mut() = views(&nodes);
        nodes.iter().all(|n| {
            n.digest() == d
                && n.hosts().len() == 5
                && n.hosts().iter().all(|h| h.status == HostStatus::Alive)
        })
    })
    .await;
    assert!(
        converged,
        "all nodes converge to identical views within {HEAL_PATIENCE:?}; last seen:\n{}",
        seen.borrow()
    );
    for n in &nodes {
        for id in ["ml", "mr", "ml2", "mr2"] {
            assert_eq!(
                n.machine(id).unwrap().host_status,
                "ok",
                "{id} on {}",
                n.node_id()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_unauthenticated_traffic_is_ignored() {
    let nodes = cluster(2).await;
    let target = nodes[0].local_addr();

    // Random bytes, an empty datagram, and a well-formed datagram signed with another secret.
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.send_to(&[], target).unwrap();
    for len in [1usize, 17, 64, 1400, 9000] {
        let junk: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        udp.send_to(&junk, target).unwrap();
    }
    let wrong = bazaar_catalog::wire::Authenticator::new("not-the-secret");
    let wrong_keys = Keyring::new(&[derived_key("not-the-secret")]).unwrap();
    udp.send_to(
        &wrong_keys.seal_datagram(DGRAM_SWIM, "n1", bazaar_types::now_ms(), 1, b"hello"),
        target,
    )
    .unwrap();

    // TCP: junk, a huge length prefix, and a frame signed with another secret.
    for payload in [
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
        vec![0xff, 0xff, 0xff, 0xff, 1, 2, 3],
    ] {
        let mut s = tokio::net::TcpStream::connect(target).await.unwrap();
        s.write_all(&payload).await.unwrap();
        drop(s);
    }
    let mut s = tokio::net::TcpStream::connect(target).await.unwrap();
    wrong
        .write_frame(&mut s, "n1", b"not a sync")
        .await
        .unwrap();
    drop(s);

    eventually("the garbage is counted as rejected", PATIENCE, || {
        nodes[0].stats().rejected >= 7
    })
    .await;
    // And the node still works.
    nodes[1].publish_machine(machine("after-garbage", "web", "started"));
    eventually("gossip still flows", PATIENCE, || {
        nodes[0].machine("after-garbage").is_some()
    })
    .await;
    assert_eq!(status_on(&nodes[0], "n1"), Some(HostStatus::Alive));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_too_big_for_a_datagram_arrive_through_hints() {
    // Anti-entropy is slowed right down, so only the hint's immediate pull can deliver.
    let mut cfg = config("big0", any_port(), &[]);
    cfg.anti_entropy_interval = Duration::from_secs(60);
    let a = Catalog::start(cfg).await.unwrap();
    let mut cfg = config("big1", any_port(), &[a.local_addr()]);
    cfg.anti_entropy_interval = Duration::from_secs(60);
    let b = Catalog::start(cfg).await.unwrap();
    eventually("the two nodes see each other", PATIENCE, || {
        a.stats().alive_members == 1 && b.stats().alive_members == 1
    })
    .await;
    let mut m = machine("big", "web", "started");
    for i in 0..100 {
        m.metadata.insert(format!("key-{i}"), "x".repeat(40));
    }
    a.publish_machine(m.clone());
    eventually("the big row reaches b", Duration::from_secs(5), || {
        b.machine("big")
            .is_some_and(|v| v.record.metadata == m.metadata)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_app_names_resolve_the_same_everywhere() {
    let nodes = cluster(2).await;
    let app = |host: &str, at: u64| AppRecord {
        name: "shop".into(),
        org_slug: "personal".into(),
        created_at_ms: at,
        created_by_host: host.into(),
        ..Default::default()
    };
    nodes[0].publish_app(app("n0", 200));
    nodes[1].publish_app(app("n1", 100));
    eventually("both nodes pick n1's app", PATIENCE, || {
        nodes
            .iter()
            .all(|n| n.app("shop").is_some_and(|a| a.created_by_host == "n1"))
    })
    .await;
    assert_eq!(nodes[0].apps().len(), 1);
    nodes[1].delete_app("shop");
    eventually("n0's app remains", PATIENCE, || {
        nodes
            .iter()
            .all(|n| n.app("shop").is_some_and(|a| a.created_by_host == "n0"))
    })
    .await;
}

/// A machine row too big for a datagram: it travels by anti-entropy (TCP) only.
fn big_machine(id: &str) -> MachineRecord {
    let mut m = machine(id, "web", "started");
    for i in 0..100 {
        m.metadata.insert(format!("key-{i}"), "x".repeat(40));
    }
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_forged_for_another_host_are_refused_everywhere() {
    let nodes = cluster(3).await;
    nodes[1].publish_machine(machine("m-real", "web", "started"));
    nodes[1].publish_app(AppRecord {
        name: "web".into(),
        org_slug: "personal".into(),
        created_at_ms: 100,
        created_by_host: "n1".into(),
        ..Default::default()
    });
    eventually("n1's rows reach everyone", PATIENCE, || {
        nodes
            .iter()
            .all(|n| n.machine("m-real").is_some() && n.app("web").is_some())
    })
    .await;
    let real_api = nodes[0].host("n1").unwrap().record.api_addr;

    // Someone holding the cluster secret, but not n1's key, claims to be n1 and rewrites
    // its rows: its api_addr, one of its machines, its app, and adds a machine too big for
    // a datagram (so it goes by TCP sync), while small ones also go by datagram.
    let mut cfg = config("n1", any_port(), &[nodes[0].local_addr()]);
    cfg.signing_key = SigningKey::from_bytes(&[0xee; 32]);
    let rogue = Catalog::start(cfg).await.unwrap();
    let mut forged = host("n1", 8000);
    forged.api_addr = "127.6.6.6:4280".into();
    rogue.publish_host(forged);
    rogue.publish_machine(machine("m-real", "web", "stopped"));
    rogue.publish_machine(big_machine("m-forged"));
    rogue.publish_app(AppRecord {
        name: "web".into(),
        org_slug: "evil".into(),
        created_at_ms: 1,
        created_by_host: "n1".into(),
        ..Default::default()
    });
    eventually("every node refuses forged rows", PATIENCE, || {
        nodes.iter().all(|n| n.stats().rows_refused >= 3)
    })
    .await;
    // Several anti-entropy rounds later, nothing of the forgery got in.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for n in &nodes {
        let h = n.host("n1").unwrap();
        assert_eq!(h.record.api_addr, real_api, "on {}", n.node_id());
        assert_eq!(n.machine("m-real").unwrap().record.state, "started");
        assert!(n.machine("m-forged").is_none(), "on {}", n.node_id());
        assert_eq!(n.app("web").unwrap().org_slug, "personal");
    }
    rogue.kill().await;
    // The real n1 still publishes as before.
    nodes[1].publish_machine(machine("m-real", "web", "stopped"));
    eventually("n1's real change arrives", PATIENCE, || {
        nodes.iter().all(|n| {
            n.machine("m-real")
                .is_some_and(|m| m.record.state == "stopped")
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_and_stale_datagrams_are_refused() {
    let nodes = cluster(2).await;
    let target = nodes[0].local_addr();
    // Capture a real datagram: a node that joins through a socket we hold announces to it.
    let capture = UdpSocket::bind("127.0.0.1:0").unwrap();
    capture
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let joiner = Catalog::start(config("n9", any_port(), &[capture.local_addr().unwrap()]))
        .await
        .unwrap();
    let mut buf = vec![0u8; 65_536];
    let (len, _) = capture.recv_from(&mut buf).unwrap();
    let captured = buf[..len].to_vec();
    joiner.kill().await;

    let before = nodes[0].stats();
    capture.send_to(&captured, target).unwrap();
    capture.send_to(&captured, target).unwrap();
    capture.send_to(&captured, target).unwrap();
    eventually("the replays are counted", PATIENCE, || {
        nodes[0].stats().replayed >= before.replayed + 2
    })
    .await;
    // A datagram signed with the secret but stamped a minute ago is refused too.
    let old = Keyring::new(&[derived_key(SECRET)]).unwrap().seal_datagram(
        DGRAM_SWIM,
        "n1",
        bazaar_types::now_ms() - 60_000,
        u64::MAX,
        b"old",
    );
    let rejected = nodes[0].stats().rejected;
    capture.send_to(&old, target).unwrap();
    eventually("the stale datagram is refused", PATIENCE, || {
        nodes[0].stats().rejected > rejected
    })
    .await;
    assert_eq!(nodes[0].stats().replayed, before.replayed + 2);
}

/// This process's resident memory, from `/proc/self/status`.
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_loris_syncs_neither_grow_memory_nor_starve_anti_entropy() {
    // b never starts an exchange itself: its rows reach a only through a's syncs with b,
    // which is the listener under attack.
    let a = Catalog::start(config("la", any_port(), &[])).await.unwrap();
    let mut cfg = config("lb", any_port(), &[a.local_addr()]);
    cfg.anti_entropy_interval = Duration::from_secs(600);
    let b = Catalog::start(cfg).await.unwrap();
    eventually("the two nodes see each other", PATIENCE, || {
        a.stats().alive_members == 1 && b.stats().alive_members == 1
    })
    .await;
    let target = b.local_addr();
    let rss_before = rss_bytes();

    // Four connections, each announcing a 200 MiB frame, then sending 48 MiB of it as fast
    // as the node reads and trickling the rest; reconnecting whenever dropped.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut attackers = Vec::new();
    for _ in 0..4 {
        let stop = stop.clone();
        attackers.push(tokio::spawn(async move {
            let chunk = vec![0x5au8; 64 * 1024];
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let Ok(mut s) = tokio::net::TcpStream::connect(target).await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let _ = s.write_all(&(200u32 << 20).to_be_bytes()).await;
                let mut sent = 0;
                while sent < 48 << 20 && s.write_all(&chunk).await.is_ok() {
                    sent += chunk.len();
                }
                while !stop.load(std::sync::atomic::Ordering::Relaxed)
                    && s.write_all(&[0]).await.is_ok()
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    b.publish_machine(big_machine("during-attack"));
    eventually(
        "b's row reaches a by anti-entropy during the attack",
        PATIENCE,
        || a.machine("during-attack").is_some(),
    )
    .await;
    let grown = rss_bytes().saturating_sub(rss_before);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in attackers {
        t.await.unwrap();
    }
    assert!(
        grown < 64 << 20,
        "resident memory grew by {} MiB under the attack",
        grown >> 20
    );
    assert!(b.stats().rejected > 0, "the attackers were refused");
}

/// How long until the node closes `s` (reading whatever it sends first).
async fn closed_within(s: &mut tokio::net::TcpStream, within: Duration) -> Option<Duration> {
    use tokio::io::AsyncReadExt;
    let start = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout_at((start + within).into(), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Some(start.elapsed()),
            Ok(Ok(_)) => {}
            Err(_) => return None,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_or_oversized_request_from_a_key_holder_loses_its_slot_quickly() {
    let node = Catalog::start(config("k0", any_port(), &[])).await.unwrap();
    let auth = Authenticator::new(SECRET);
    let sender = "mallory";
    let header_len = 4 + 8 + 1 + sender.len() + 16;

    // A request announced at 5 MiB (above what a digest needs): refused from its header.
    let mut frame = Vec::new();
    auth.write_frame(&mut frame, sender, &vec![0u8; 5 << 20])
        .await
        .unwrap();
    let mut s = tokio::net::TcpStream::connect(node.local_addr())
        .await
        .unwrap();
    s.write_all(&frame[..header_len]).await.unwrap();
    assert!(
        closed_within(&mut s, Duration::from_secs(2))
            .await
            .is_some(),
        "an oversized request keeps its connection"
    );

    // A 3 MiB request trickled in: dropped after its deadline (1 s + 1 s per MiB), well
    // before the exchange's 10 s timeout.
    let mut frame = Vec::new();
    auth.write_frame(&mut frame, sender, &vec![0u8; 3 << 20])
        .await
        .unwrap();
    let mut s = tokio::net::TcpStream::connect(node.local_addr())
        .await
        .unwrap();
    s.write_all(&frame[..header_len + 1000]).await.unwrap();
    let took = closed_within(&mut s, Duration::from_secs(8))
        .await
        .expect("a slow request keeps its slot");
    assert!(took >= Duration::from_secs(3), "closed too early: {took:?}");
    eventually("both are counted as rejected", PATIENCE, || {
        node.stats().rejected >= 2
    })
    .await;
}

/// A node with no peer (a host alone, or a whole cluster restarted at once) gets back the
/// apps and app secrets it created, kept in its own-rows directory; one it deleted stays
/// deleted.
#[tokio::test]
async fn a_lone_node_restarted_keeps_the_apps_and_secrets_it_created() {
    let dir = tempfile::tempdir().unwrap();
    let lone = |port| {
        let mut c = config("n1", port, &[]);
        c.own_rows_dir = Some(dir.path().join("catalog-rows"));
        c
    };
    let node = Catalog::start(lone(any_port())).await.unwrap();
    let app = |name: &str| AppRecord {
        id: format!("app_{name}"),
        name: name.into(),
        org_slug: "personal".into(),
        created_at_ms: 1,
        created_by_host: "n1".into(),
    };
    node.publish_app(app("kept"));
    node.publish_app(app("gone"));
    node.delete_app("gone");
    node.publish_secret(bazaar_catalog::SecretRecord {
        id: "kept/TOKEN".into(),
        app: "kept".into(),
        name: "TOKEN".into(),
        set_by_host: "n1".into(),
        sealed: Some("sealed".into()),
        app_created_at_ms: 1,
        ..Default::default()
    });
    node.leave().await;
    drop(node);

    let again = Catalog::start(lone(any_port())).await.unwrap();
    assert_eq!(again.app("kept"), Some(app("kept")));
    assert_eq!(again.app("gone"), None);
    let secrets = again.app_secrets("kept");
    assert_eq!(secrets.len(), 1, "{secrets:?}");
    assert_eq!(secrets[0].sealed.as_deref(), Some("sealed"));
    // Without the directory, the same node comes back empty (what the test guards).
    let mut bare = config("n2", any_port(), &[]);
    bare.own_rows_dir = None;
    assert_eq!(Catalog::start(bare).await.unwrap().app("kept"), None);
}
