//! The cost reclamation adds on a host (docs/POLICY.md "Reclamation"), in one run: a host's
//! ordinary bid (reserve, then release) beside a `batch` bid on the reclaimed room (which
//! sums every service's reservation), and one measurement round (every service's use
//! observed, reservations moved), on hosts of N services and N/4 batch machines. The
//! network round trip of a placement round (docs/benchmarks/api.md) is the same either way.
//!
//! Run: `cargo bench -p bazaar-placement --bench reclaim` (prints a Markdown table).

use bazaar_placement::ledger::{Pool, Use};
use bazaar_placement::reclaim::Reclaim;
use bazaar_placement::Ledger;
use bazaar_types::host::Resources;
use std::hint::black_box;
use std::time::{Duration, Instant};

fn percentiles(n: usize, mut f: impl FnMut()) -> (Duration, Duration) {
    for _ in 0..n / 10 {
        f();
    }
    let mut times: Vec<Duration> = (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    times.sort();
    (times[n / 2], times[n * 99 / 100])
}

fn r(cpus: u32, memory_mb: u64) -> Resources {
    Resources { cpus, memory_mb }
}

/// A host full by requests with `n` services of 1 CPU / 1 GB idling at a tenth of that
/// (their reservations decayed), and `n / 4` batch machines on the reclaimed room.
fn host(n: usize) -> Ledger {
    let rule = Reclaim {
        grace_observations: 0,
        ..Reclaim::default()
    };
    let mut l = Ledger::new(r(n as u32, n as u64 * 1024)).with_reclaim(rule);
    for i in 0..n {
        l.commit(&format!("s{i}"), r(1, 1024)).unwrap();
    }
    for _ in 0..100 {
        for i in 0..n {
            l.observe(&format!("s{i}"), idle());
        }
    }
    for i in 0..n / 4 {
        l.commit_in(&format!("b{i}"), r(1, 1024), Pool::Batch)
            .unwrap();
    }
    l
}

fn idle() -> Use {
    Use {
        millicpus: 100,
        memory_mb: 100,
    }
}

fn main() {
    println!("| services on the host | service bid p50 / p99 | batch bid p50 / p99 | measurement round p50 / p99 |");
    println!("|---|---|---|---|");
    for n in [10usize, 100, 1000] {
        let mut l = host(n);
        // A service bid is refused (the host is full by requests): the same work as one
        // that fits, the check against capacity.
        let (s50, s99) = percentiles(20_000, || {
            black_box(l.reserve("x", r(1, 256), u64::MAX).is_ok());
            l.release("x");
        });
        let (b50, b99) = percentiles(20_000, || {
            black_box(l.reserve_in("y", r(1, 256), u64::MAX, Pool::Batch).unwrap());
            l.release("y");
        });
        let ids: Vec<String> = (0..n).map(|i| format!("s{i}")).collect();
        let (m50, m99) = percentiles(2_000, || {
            for id in &ids {
                l.observe(id, idle());
            }
        });
        println!("| {n} | {s50:.2?} / {s99:.2?} | {b50:.2?} / {b99:.2?} | {m50:.2?} / {m99:.2?} |");
        assert!(l.take_evictions().is_empty());
    }
}
