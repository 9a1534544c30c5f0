use super::*;
use proptest::prelude::*;

fn r(cpus: u32, memory_mb: u64) -> Resources {
    Resources { cpus, memory_mb }
}

/// A short grace so tests reach the decay quickly; batch machines are stopped, never
/// throttled.
const RULE: Reclaim = Reclaim {
    margin_pct: 20,
    decay_pct: 50,
    grace_observations: 2,
    throttle_floor_pct: 100,
};

/// [`RULE`] throttling batch machines' CPU down to a quarter before stopping any.
const THROTTLING: Reclaim = Reclaim {
    throttle_floor_pct: 25,
    ..RULE
};

fn burn(l: &mut Ledger, id: &str, millicpus: u64, memory_mb: u64) {
    l.observe(
        id,
        Use {
            millicpus,
            memory_mb,
        },
    );
}

#[test]
fn batch_cpu_is_throttled_before_any_batch_machine_is_stopped_and_given_back_after() {
    let mut l = Ledger::new(r(4, 4096)).with_reclaim(THROTTLING);
    l.commit("svc", r(4, 3072)).unwrap();
    idle(&mut l, "svc", 40);
    for i in 0..3 {
        l.commit_in(&format!("batch{i}"), r(1, 1200), Pool::Batch)
            .unwrap();
    }
    assert_eq!(
        (l.batch_cpu_share(), l.batch_cpu_limit("batch0")),
        (1000, None)
    );
    // 1.8 reserved + 3 batch > 4: all three keep 2.2 / 3 of a core, none is stopped.
    burn(&mut l, "svc", 1500, 100);
    assert!(l.take_evictions().is_empty());
    assert_eq!(l.batch_cpu_share(), 733);
    assert_eq!(l.batch_cpu_limit("batch2"), Some(733));
    assert_eq!(
        l.batch_cpu_limit("svc"),
        None,
        "services are never throttled"
    );
    assert_eq!(l.throttled_for(), Some("svc"));
    assert!(l.batch_held().fits_in(Use::of(l.capacity())));
    // No room for more batch work while they are throttled.
    assert_eq!(l.batch_room().millicpus, 0);
    // 3.6 reserved: three at 25 % would need 0.75 > 0.4: the newest two go, the oldest
    // keeps 40 %.
    burn(&mut l, "svc", 3000, 100);
    let ev: Vec<String> = l
        .take_evictions()
        .into_iter()
        .map(|e| e.machine_id)
        .collect();
    assert_eq!(ev, ["batch2", "batch1"]);
    assert_eq!(l.batch_cpu_limit("batch0"), Some(400));
    assert!(l.batch_held().fits_in(Use::of(l.capacity())));
    // The service idles again: its reservation decays and the batch machine's CPU comes
    // back in full (at the end of the measurement round).
    idle(&mut l, "svc", 40);
    assert_eq!(l.batch_cpu_share(), 400, "not before the round's end");
    l.rebalance_batch_cpu();
    assert_eq!(
        (l.batch_cpu_share(), l.batch_cpu_limit("batch0")),
        (1000, None)
    );
    assert_eq!(l.throttled_for(), None);
    // Memory is never throttled: a service taking its memory back stops the batch machine.
    burn(&mut l, "svc", 100, 3072);
    let ev: Vec<String> = l
        .take_evictions()
        .into_iter()
        .map(|e| e.machine_id)
        .collect();
    assert_eq!(ev, ["batch0"]);
}

fn idle(l: &mut Ledger, id: &str, times: usize) {
    for _ in 0..times {
        l.observe(
            id,
            Use {
                millicpus: 100,
                memory_mb: 100,
            },
        );
    }
}

#[test]
fn a_batch_machine_takes_room_a_full_by_requests_host_would_refuse() {
    let mut l = Ledger::new(r(4, 4096)).with_reclaim(RULE);
    l.commit("svc", r(4, 4096)).unwrap();
    assert_eq!(l.free(), r(0, 0), "full by requests");
    assert!(l.reserve_in("b0", r(1, 512), 100, Pool::Batch).is_err());
    idle(&mut l, "svc", 40);
    assert_eq!(
        l.reservation_of("svc"),
        Some(Use {
            millicpus: 120,
            memory_mb: 120
        }),
        "use plus 20 %"
    );
    // A service still cannot come in: requests are full.
    assert!(l.reserve("s2", r(1, 512), 100).is_err());
    let (_, score) = l.reserve_in("b1", r(2, 2048), 100, Pool::Batch).unwrap();
    assert!(score > 0.0);
    l.claim("b1", "batch1").unwrap();
    assert!(l.in_batch_pool("batch1"));
    assert_eq!(l.batch_committed(), r(2, 2048));
    assert_eq!(l.committed(), r(4, 4096), "batch is not held by requests");
    assert_eq!(
        l.batch_room(),
        Use {
            millicpus: 4000 - 120 - 2000,
            memory_mb: 4096 - 120 - 2048
        }
    );
    assert!(l.take_evictions().is_empty());
}

#[test]
fn when_use_grows_the_newest_batch_machines_are_evicted_and_only_as_many_as_needed() {
    let mut l = Ledger::new(r(4, 4096)).with_reclaim(RULE);
    l.commit("svc", r(2, 2048)).unwrap();
    idle(&mut l, "svc", 40);
    for (i, size) in [1u32, 1, 1].iter().enumerate() {
        l.commit_in(&format!("batch{i}"), r(*size, 1200), Pool::Batch)
            .unwrap();
    }
    assert_eq!(l.batch_committed(), r(3, 3600));
    // The service burns 1.5 CPUs: 1.8 reserved + 3 batch > 4: the newest one goes.
    l.observe(
        "svc",
        Use {
            millicpus: 1500,
            memory_mb: 100,
        },
    );
    let ev = l.take_evictions();
    assert_eq!(
        ev,
        vec![Eviction {
            machine_id: "batch2".into(),
            for_machine: "svc".into(),
            resources: r(1, 1200)
        }]
    );
    assert!(!l.in_batch_pool("batch2"));
    assert_eq!(l.committed_to("batch2"), None);
    assert!(l.batch_held().fits_in(Use::of(l.capacity())));
    // Memory too: 2,048 back at once evicts the rest.
    l.observe(
        "svc",
        Use {
            millicpus: 1500,
            memory_mb: 2048,
        },
    );
    let ev: Vec<String> = l
        .take_evictions()
        .into_iter()
        .map(|e| e.machine_id)
        .collect();
    assert_eq!(ev, vec!["batch1".to_string()]);
}

#[test]
fn a_service_committed_or_started_again_gets_its_request_back() {
    let mut l = Ledger::new(r(4, 4096)).with_reclaim(RULE);
    l.commit("svc", r(2, 2048)).unwrap();
    idle(&mut l, "svc", 40);
    l.commit_in("batch0", r(2, 2048), Pool::Batch).unwrap();
    // A second service by requests: 2 + 2 ≤ 4, so it comes in and batch0 leaves.
    l.commit("svc2", r(2, 2048)).unwrap();
    assert_eq!(l.take_evictions()[0].for_machine, "svc2");
    idle(&mut l, "svc2", 40);
    l.commit_in("batch1", r(2, 2048), Pool::Batch).unwrap();
    l.restarted("svc");
    assert_eq!(l.reservation_of("svc"), Some(Use::of(r(2, 2048))));
    assert_eq!(l.take_evictions()[0].machine_id, "batch1");
}

#[test]
fn a_restarted_agent_keeps_its_batch_machines_until_a_reservation_grows() {
    let mut l = Ledger::new(r(4, 4096)).with_reclaim(RULE);
    l.restore_in("svc", r(2, 2048), Pool::Service);
    l.restore_in("batch0", r(2, 2048), Pool::Batch);
    l.restore_in("batch1", r(1, 1024), Pool::Batch);
    // 2,000 + 3,000 > 4,000: nothing is stopped for a restart; the service's reservation
    // starts lowered by the excess (the batch machines ran on room reclaimed from it), and
    // the pool is full.
    assert!(l.take_evictions().is_empty());
    assert_eq!(
        l.reservation_of("svc"),
        Some(Use {
            millicpus: 1000,
            memory_mb: 1024
        })
    );
    assert!(l.batch_held().fits_in(Use::of(l.capacity())));
    assert!(l.reserve_in("b", r(1, 256), 10, Pool::Batch).is_err());
    // No grace: the first observations decay towards use, evicting nothing.
    idle(&mut l, "svc", 3);
    assert!(l.take_evictions().is_empty());
    assert!(l.reservation_of("svc").unwrap().millicpus < 1000);
    // Growth evicts until the pool fits.
    l.observe(
        "svc",
        Use {
            millicpus: 2000,
            memory_mb: 100,
        },
    );
    let ev: Vec<String> = l
        .take_evictions()
        .into_iter()
        .map(|e| e.machine_id)
        .collect();
    assert_eq!(ev, vec!["batch1".to_string()]);
    assert!(l.batch_held().fits_in(Use::of(l.capacity())));
}

#[test]
fn with_reclamation_off_batch_is_held_by_requests_like_any_machine() {
    let mut l = Ledger::new(r(4, 4096));
    l.commit("svc", r(4, 4096)).unwrap();
    assert!(matches!(
        l.reserve_in("b", r(1, 512), 10, Pool::Batch),
        Err(LedgerError::InsufficientMemory { .. })
    ));
    l.uncommit("svc");
    l.commit_in("batch", r(1, 512), Pool::Batch).unwrap();
    assert_eq!(l.committed(), r(1, 512));
    assert!(!l.in_batch_pool("batch"));
    assert_eq!(l.batch_room(), Use::default());
}

#[derive(Debug, Clone)]
enum Op {
    Reserve(u8, u32, u64, bool),
    Claim(u8),
    Release(u8),
    Expire(u64),
    Uncommit(u8),
    Commit(u8, u32, u64, bool),
    Observe(u8, u64, u64),
    Restarted(u8),
    Rebalance,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..12, 0u32..4, 0u64..2048, any::<bool>())
            .prop_map(|(i, c, m, b)| Op::Reserve(i, c, m, b)),
        (0u8..12).prop_map(Op::Claim),
        (0u8..12).prop_map(Op::Release),
        (0u64..200).prop_map(Op::Expire),
        (0u8..12).prop_map(Op::Uncommit),
        (0u8..12, 0u32..4, 0u64..2048, any::<bool>())
            .prop_map(|(i, c, m, b)| Op::Commit(i, c, m, b)),
        (0u8..12, 0u64..4000, 0u64..2048).prop_map(|(i, c, m)| Op::Observe(i, c, m)),
        (0u8..12).prop_map(Op::Restarted),
        Just(Op::Rebalance),
    ]
}

proptest! {
    /// Whatever the sequence: requests + open service bids ≤ capacity, and reservations +
    /// batch machines + open batch bids ≤ capacity; every reservation is at most its
    /// request; an evicted machine holds nothing.
    #[test]
    fn reservations_and_batch_never_pass_capacity(ops in proptest::collection::vec(op(), 1..300)) {
        check_ops(ops, RULE)?;
    }

    /// The same with batch machines' CPU throttled first: their CPU counted at its share,
    /// which is never below the floor.
    #[test]
    fn reservations_and_throttled_batch_never_pass_capacity(ops in proptest::collection::vec(op(), 1..300)) {
        check_ops(ops, THROTTLING)?;
    }
}

fn check_ops(ops: Vec<Op>, rule: Reclaim) -> Result<(), TestCaseError> {
    {
        let cap = r(8, 4096);
        let mut l = Ledger::new(cap).with_reclaim(rule);
        let pool = |b: bool| if b { Pool::Batch } else { Pool::Service };
        for (t, op) in ops.into_iter().enumerate() {
            match op {
                Op::Reserve(i, c, m, b) => {
                    let _ = l.reserve_in(&format!("r{i}"), r(c, m), t as u64 + 50, pool(b));
                }
                Op::Claim(i) => {
                    let _ = l.claim(&format!("r{i}"), &format!("m{i}"));
                }
                Op::Release(i) => {
                    l.release(&format!("r{i}"));
                }
                Op::Expire(now) => {
                    l.expire(now, 10);
                }
                Op::Uncommit(i) => {
                    l.uncommit(&format!("m{i}"));
                }
                Op::Commit(i, c, m, b) => {
                    let _ = l.commit_in(&format!("m{i}"), r(c, m), pool(b));
                }
                Op::Observe(i, c, m) => l.observe(
                    &format!("m{i}"),
                    Use {
                        millicpus: c,
                        memory_mb: m,
                    },
                ),
                Op::Restarted(i) => l.restarted(&format!("m{i}")),
                Op::Rebalance => l.rebalance_batch_cpu(),
            }
            let used = super::super::add(l.committed(), l.reserved());
            prop_assert!(
                used.cpus <= cap.cpus && used.memory_mb <= cap.memory_mb,
                "{used:?}"
            );
            prop_assert!(l.batch_held().fits_in(Use::of(cap)), "{:?}", l.batch_held());
            if l.batch_committed().cpus > 0 {
                prop_assert!(
                    rule.share_allowed(l.batch_cpu_share()),
                    "{}",
                    l.batch_cpu_share()
                );
            }
            for (id, request) in l.commitments() {
                if let Some(res) = l.reservation_of(id) {
                    prop_assert!(
                        res.fits_in(Use::of(*request)),
                        "{id}: {res:?} > {request:?}"
                    );
                }
            }
            for e in l.take_evictions() {
                prop_assert!(l.committed_to(&e.machine_id).is_none());
                prop_assert!(!l.in_batch_pool(&e.machine_id));
            }
        }
    }
    Ok(())
}
