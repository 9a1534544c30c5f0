//! The market under stress: many exchanges, stale views, bursts, deploys, failures, a
//! nearly full fleet. No host ever commits beyond its capacity, every machine is either
//! placed or refused, and no reservation leaks.

use bazaar_sim::config::{Bursts, Failures, Lifetime, Scenario};
use bazaar_sim::engine;

fn stressed() -> Scenario {
    Scenario {
        name: "stress".into(),
        hosts: 60,
        regions: 2,
        placements: 8000,
        load: 1.4,
        exchanges: 16,
        gossip_delay_ms: 2000.0,
        rtt_ms: 20.0,
        rtt_jitter_ms: 20.0,
        deploy_fraction: 0.1,
        deploy_count: 10,
        bursts: Some(Bursts {
            every_s: 60.0,
            requests: 50,
        }),
        lifetime: Lifetime::Pareto {
            mean_s: 300.0,
            alpha: 1.5,
        },
        check_invariants: true,
        ..Scenario::default()
    }
}

#[test]
fn never_beyond_capacity_whatever_the_concurrency() {
    let mut s = stressed();
    for p in [
        "market",
        "market-d2",
        "market-all",
        "per-task-d2",
        "random",
        "least-loaded-stale",
    ] {
        let r = engine::run(&s, p).unwrap();
        assert_eq!(r.invariant_violations, 0, "{p}");
        assert_eq!(
            r.placed + r.failed,
            r.machines,
            "{p}: every machine placed or refused"
        );
        assert!(r.failed > 0, "{p}: the scenario is meant to overflow");
        assert!(r.false_ice <= r.failed);
        // Only a bid that arrives after its round gave up on it may be left to expire.
        assert!(
            r.expired_reservations <= r.no_answers,
            "{p}: unclaimed reservations are released"
        );
    }
    s.failures = Some(Failures {
        mtbf_hours: 0.5,
        repair_s: 120.0,
        replace_lost: true,
    });
    for p in ["market-d2", "ideal", "nomad-spread", "k8s"] {
        let r = engine::run(&s, p).unwrap();
        assert_eq!(r.invariant_violations, 0, "{p}");
        assert!(r.lost > 0, "{p}: hosts failed");
        assert_eq!(r.placed + r.failed, r.machines, "{p}");
    }
}

#[test]
fn the_market_spreads_far_better_than_random_and_near_the_ideal() {
    let s = Scenario {
        hosts: 400,
        regions: 2,
        placements: 40_000,
        load: 0.7,
        ..Scenario::default()
    };
    let cv = |p: &str| engine::run(&s, p).unwrap().steady_cv;
    let (random, d2, ideal, binpack) = (
        cv("random"),
        cv("market-d2"),
        cv("ideal"),
        cv("nomad-binpack"),
    );
    assert!(d2 < random * 0.6, "d2 {d2} vs random {random}");
    assert!(d2 < ideal * 2.0, "d2 {d2} vs ideal {ideal}");
    assert!(
        binpack > random,
        "bin-packing concentrates load: {binpack} vs {random}"
    );
}

#[test]
fn a_fill_reaches_90_percent_and_refuses_only_when_full() {
    let s = Scenario {
        hosts: 100,
        regions: 1,
        placements: 12_000,
        rate_per_s: 200.0,
        lifetime: Lifetime::Forever,
        policies: vec!["market-d2".into()],
        check_invariants: true,
        ..Scenario::default()
    };
    let r = engine::run(&s, "market-d3").unwrap();
    assert_eq!(r.invariant_violations, 0);
    let (t, _) = r.fill90.expect("reached 90 %");
    assert!(t > 0.0);
    assert!(r.final_stats.mean > 0.9);
}
