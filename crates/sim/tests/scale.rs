//! Scale: 10,000 hosts and 1,000,000 placements under 60 s on one core (release build),
//! and 100,000 hosts. `cargo test --release -p bazaar-sim --test scale -- --ignored --nocapture`.

use bazaar_sim::config::Scenario;
use bazaar_sim::engine;
use std::time::Instant;

#[test]
#[ignore = "release-only benchmark"]
fn ten_thousand_hosts_a_million_placements() {
    let s = Scenario {
        name: "scale".into(),
        hosts: 10_000,
        regions: 10,
        placements: 1_000_000,
        ..Scenario::default()
    };
    for p in ["market-d2", "market", "ideal", "nomad-spread"] {
        let started = Instant::now();
        let r = engine::run(&s, p).unwrap();
        let wall = started.elapsed().as_secs_f64();
        println!(
            "{p}: {} placed, {} events, {:.0} s virtual, {wall:.1} s wall",
            r.placed, r.events, r.virtual_s
        );
        assert_eq!(r.placed, 1_000_000);
        if p.starts_with("market") {
            assert!(wall < 60.0, "{p} took {wall:.1} s");
        }
    }
}

#[test]
#[ignore = "release-only benchmark"]
fn a_hundred_thousand_hosts() {
    let s = Scenario {
        name: "scale-100k".into(),
        hosts: 100_000,
        regions: 20,
        placements: 1_000_000,
        ..Scenario::default()
    };
    let started = Instant::now();
    let r = engine::run(&s, "market-d2").unwrap();
    println!(
        "market-d2, 100k hosts: {} placed, {} events, {:.1} s wall",
        r.placed,
        r.events,
        started.elapsed().as_secs_f64()
    );
    assert_eq!(r.placed, 1_000_000);
}
