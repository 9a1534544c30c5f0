//! The host's side of the market: bids from exact local state, reservations that expire,
//! idempotent claims, and the invariant that committed resources never exceed capacity
//! whatever the concurrency.

use crate::common;

use bazaar_testkit::{create_request, AgentOptions, TestAgent};
use bazaar_types::host::{BidRequest, BidResponse};
use common::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn bid_req(ttl_ms: Option<u64>) -> BidRequest {
    BidRequest {
        placement_id: "test".into(),
        cpus: 1,
        memory_mb: 256,
        ttl_ms,
        driver: None,
        priority: None,
        preempt: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_bids_and_claims_fill_exactly_fifty_slots() {
    let mut opts = AgentOptions::new(EXE);
    opts.memory_mb = 50 * 256;
    opts.cpus = 64;
    let agent = TestAgent::start(opts).unwrap();
    let c = agent.client();
    let capacity = c.info().await.unwrap().capacity;
    assert_eq!(capacity.memory_mb, 12800);

    // Watch committed + reserved while the race runs.
    let max_used = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (c, max_used, stop) = (c.clone(), max_used.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if let Ok(i) = c.info().await {
                    max_used.fetch_max(
                        i.committed.memory_mb + i.reserved.memory_mb,
                        Ordering::Relaxed,
                    );
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    let mut tasks = Vec::new();
    for _ in 0..200 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            match c.bid(&bid_req(None)).await.unwrap() {
                BidResponse::Bid { reservation_id, .. } => {
                    let m = c
                        .claim(&reservation_id, &create_request("race", &["sleep", "1000"]))
                        .await
                        .unwrap();
                    Some(m.id)
                }
                BidResponse::Refusal { reason, .. } => {
                    assert!(reason.contains("insufficient memory"), "{reason}");
                    None
                }
            }
        }));
    }
    let mut won = Vec::new();
    for t in tasks {
        if let Some(id) = t.await.unwrap() {
            won.push(id);
        }
    }
    stop.store(true, Ordering::Relaxed);
    watcher.await.unwrap();
    assert_eq!(won.len(), 50, "exactly 50 bids won");
    let machines = c.machines(Some("race"), true).await.unwrap();
    assert_eq!(machines.len(), 50, "exactly 50 machines exist");
    let info = c.info().await.unwrap();
    assert_eq!(info.committed.memory_mb, 12800);
    assert_eq!(info.num_reservations, 0, "no leaked reservation");
    assert!(
        max_used.load(Ordering::Relaxed) <= 12800,
        "over capacity: {}",
        max_used.load(Ordering::Relaxed)
    );
    // A full host refuses with a reason.
    match c.bid(&bid_req(None)).await.unwrap() {
        BidResponse::Refusal { reason, .. } => {
            assert!(reason.contains("insufficient memory"), "{reason}")
        }
        other => panic!("a full host bid: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_expire_release_and_claims_are_idempotent() {
    let agent = agent();
    let c = agent.client();
    // An unclaimed reservation returns its resources when it expires.
    let BidResponse::Bid { reservation_id, .. } = c.bid(&bid_req(Some(200))).await.unwrap() else {
        panic!()
    };
    assert_eq!(c.info().await.unwrap().reserved.memory_mb, 256);
    bazaar_testkit::eventually(Duration::from_secs(5), || async {
        (c.info().await.ok()?.reserved.memory_mb == 0).then_some(())
    })
    .await
    .expect("reservation expires");
    let err = c
        .claim(&reservation_id, &create_request("late", &["sleep", "1"]))
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(404), "{err}");

    // Release returns it at once.
    let BidResponse::Bid { reservation_id, .. } = c.bid(&bid_req(None)).await.unwrap() else {
        panic!()
    };
    c.release(&reservation_id).await.unwrap();
    assert_eq!(c.info().await.unwrap().reserved.memory_mb, 0);

    // A claim retried (same reservation) gives the same machine, once.
    let BidResponse::Bid { reservation_id, .. } = c.bid(&bid_req(None)).await.unwrap() else {
        panic!()
    };
    let req = create_request("idem", &["sleep", "1000"]);
    let a = c.claim(&reservation_id, &req).await.unwrap();
    let b = c.claim(&reservation_id, &req).await.unwrap();
    assert_eq!(a.id, b.id);
    assert_eq!(c.machines(Some("idem"), true).await.unwrap().len(), 1);
    assert_eq!(c.info().await.unwrap().committed.memory_mb, 256);
    // A claim whose config needs more than was reserved is refused and changes nothing.
    let BidResponse::Bid { reservation_id, .. } = c.bid(&bid_req(None)).await.unwrap() else {
        panic!()
    };
    let mut big = create_request("idem", &["sleep", "1000"]);
    big.config.guest = Some(bazaar_types::guest::Guest::preset("shared-cpu-2x").unwrap());
    let err = c.claim(&reservation_id, &big).await.unwrap_err();
    assert_eq!(err.status(), Some(400), "{err}");
    assert_eq!(c.machines(Some("idem"), true).await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commitments_survive_an_agent_restart_and_open_reservations_are_returned() {
    // Open reservations live in memory only (DESIGN.md: a reservation that is not claimed
    // is always returned): after a crash the reserved resources are free again and a
    // late claim is refused, so the exchange takes its next offer. A machine's resources
    // stay committed.
    let mut opts = AgentOptions::new(EXE);
    opts.memory_mb = 1024;
    let mut agent = TestAgent::start(opts).unwrap();
    let c = agent.client();
    c.create(&create_request("dur", &["sleep", "1000"]))
        .await
        .unwrap();
    let BidResponse::Bid { reservation_id, .. } = c.bid(&bid_req(None)).await.unwrap() else {
        panic!()
    };
    assert_eq!(c.info().await.unwrap().num_reservations, 1);
    agent.kill9();
    agent.spawn(&[]).unwrap();
    let c = agent.client();
    let info = c.info().await.unwrap();
    assert_eq!(
        info.committed.memory_mb, 256,
        "the machine still holds its resources"
    );
    assert_eq!(
        info.num_reservations, 0,
        "the open reservation was returned"
    );
    let late = c
        .claim(&reservation_id, &create_request("dur", &["sleep", "1000"]))
        .await
        .expect_err("a reservation lost in a crash cannot be claimed");
    assert_eq!(late.status(), Some(404), "{late:?}");
    assert_eq!(c.info().await.unwrap().committed.memory_mb, 256);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_on_a_port_held_a_moment_longer_still_comes_up() {
    // The test kit's restart tries again for a second when the agent's old port is still
    // taken (twice in CI, a restarted agent found its API port in use).
    let mut agent = TestAgent::start(AgentOptions::new(EXE)).unwrap();
    agent.kill9();
    let api = agent.url().trim_start_matches("http://").to_string();
    let holder = std::net::TcpListener::bind(api).unwrap();
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        drop(holder);
    });
    agent.spawn(&[]).unwrap();
    release.join().unwrap();
    agent.client().info().await.unwrap();
}
