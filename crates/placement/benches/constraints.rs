//! What constraints, affinities and spread add to the exchange's pure work per placement:
//! `exchange::candidates` alone against `candidates` + `constraints::apply` (two
//! constraints, one affinity, spread by a label) over clusters of 3 to 10,000 hosts. The
//! network part of a placement round (bids asked, answers read) is unchanged by a policy.
//!
//! Run: `cargo bench -p bazaar-placement --bench constraints` (prints a Markdown table).

use bazaar_placement::constraints::{self, Affinity, Constraint, Op, PlacementPolicy, Spread};
use bazaar_placement::exchange::{self, Candidate, PlacementRequest};
use bazaar_types::host::Resources;
use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

fn per_call(n: u32, mut f: impl FnMut()) -> Duration {
    for _ in 0..n / 10 {
        f();
    }
    let started = Instant::now();
    for _ in 0..n {
        f();
    }
    started.elapsed() / n
}

fn hosts(n: usize) -> Vec<Candidate> {
    let r = Resources {
        cpus: 16,
        memory_mb: 65536,
    };
    (0..n)
        .map(|i| Candidate {
            host_id: format!("host-{i:05}"),
            region: "local".into(),
            capacity: r,
            free: r,
            alive: true,
            draining: false,
            labels: [
                ("zone".to_string(), format!("z{}", i % 3)),
                (
                    "disk".to_string(),
                    if i % 2 == 0 { "nvme" } else { "ssd" }.to_string(),
                ),
            ]
            .into(),
        })
        .collect()
}

fn main() {
    let policy = PlacementPolicy {
        constraints: vec![
            Constraint {
                label: "disk".into(),
                op: Op::Eq,
                value: Some("nvme".into()),
            },
            Constraint {
                label: "zone".into(),
                op: Op::Exists,
                value: None,
            },
        ],
        affinities: vec![Affinity {
            label: "zone".into(),
            op: Op::Eq,
            value: Some("z1".into()),
            weight: 50,
        }],
        spread: Some(Spread {
            by: "label:zone".into(),
        }),
    };
    let counts: BTreeMap<String, usize> = [("z0".to_string(), 4), ("z1".to_string(), 2)].into();
    let req = PlacementRequest {
        size: Resources {
            cpus: 1,
            memory_mb: 256,
        },
        count: 1,
        ..Default::default()
    };
    let regions = vec!["local".to_string()];
    println!("| hosts | candidates | candidates + constraints/affinity/spread | added |");
    println!("|---|---|---|---|");
    for n in [3usize, 100, 1000, 10_000] {
        let hs = hosts(n);
        let iters = (200_000 / n as u32).max(20);
        let plain = per_call(iters, || {
            black_box(exchange::candidates(black_box(&hs), &regions, &req));
        });
        let with = per_call(iters, || {
            let (c, _) = exchange::candidates(black_box(&hs), &regions, &req);
            black_box(constraints::apply(&policy, &c, &counts));
        });
        println!(
            "| {n} | {:.1} µs | {:.1} µs | {:.1} µs |",
            plain.as_secs_f64() * 1e6,
            with.as_secs_f64() * 1e6,
            (with.as_secs_f64() - plain.as_secs_f64()) * 1e6
        );
    }
}
