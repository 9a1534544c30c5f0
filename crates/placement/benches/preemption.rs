//! The cost preemption adds to a placement round, in one run beside the round's own pure
//! work: a host's ordinary bid (reserve, then release) and the exchange's choice among three
//! offers, against a full host's preemption bid (the victims chosen among N machines of
//! mixed classes, the bid's reservation made and released) and the exchange's choice among
//! three preemption offers. The network round trip of a round (docs/benchmarks/api.md) is
//! the same with or without preemption; this is what changes.
//!
//! Run: `cargo bench -p bazaar-placement --bench preemption` (prints a Markdown table).

use bazaar_placement::exchange::{choose_winners, Offer};
use bazaar_placement::preemption::{
    best_offer, choose_victims, Candidate, Preemption, PreemptionOffer,
};
use bazaar_placement::Ledger;
use bazaar_types::host::Resources;
use bazaar_types::priority::Priority;
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

/// A host of 64 CPUs and 64 GiB filled with `n` machines, a third of each class, of sizes
/// 1-4 CPUs and 256 MB-4 GB, so that nothing is free.
fn full_host(n: usize) -> (Ledger, Vec<Candidate>) {
    let classes = [Priority::Batch, Priority::Default, Priority::Critical];
    let machines: Vec<Candidate> = (0..n)
        .map(|i| Candidate {
            machine_id: format!("m{i:04}"),
            priority: classes[i % 3],
            resources: r(1 + (i % 4) as u32, 256 << (i % 5)),
            created_at_ms: (i as u64 * 7919) % 1000,
        })
        .collect();
    let cap = machines.iter().fold(r(0, 0), |a, m| {
        r(
            a.cpus + m.resources.cpus,
            a.memory_mb + m.resources.memory_mb,
        )
    });
    let mut ledger = Ledger::new(cap);
    for m in &machines {
        ledger.commit(&m.machine_id, m.resources).unwrap();
    }
    (ledger, machines)
}

fn main() {
    let want = r(2, 2048);
    let mut rows = Vec::new();
    let n = 20_000;

    let mut ledger = Ledger::new(r(64, 65536));
    rows.push((
        "ordinary bid: reserve + release".to_string(),
        percentiles(n, || {
            ledger.reserve("bid", want, 1).unwrap();
            ledger.release("bid");
        }),
    ));
    let offers: Vec<Offer> = (0..3)
        .map(|i| Offer {
            host_id: format!("h{i}"),
            reservation_id: format!("r{i}"),
            score: 0.1 * f64::from(i),
        })
        .collect();
    rows.push((
        "exchange: choose among 3 bids".to_string(),
        percentiles(n, || {
            black_box(choose_winners(offers.clone(), 1));
        }),
    ));
    for (machines, want) in [
        (8, want),
        (32, want),
        (128, want),
        (512, want),
        (32, r(12, 12288)),
        (128, r(12, 12288)),
        (512, r(12, 12288)),
    ] {
        let (mut ledger, running) = full_host(machines);
        let mut victims = 0;
        rows.push((
            format!(
                "preemption bid for {} CPUs / {} MB, full host of {machines} machines",
                want.cpus, want.memory_mb
            ),
            percentiles(n / 4, || {
                let v = choose_victims(ledger.free(), want, Priority::Critical, &running)
                    .expect("victims");
                victims = v.len();
                let ids = v.into_iter().map(|c| c.machine_id).collect();
                Preemption::reserve(&mut ledger, "bid", want, ids, 1)
                    .unwrap()
                    .release(&mut ledger);
            }),
        ));
        eprintln!("{machines} machines, {want:?}: {victims} victim(s)");
    }
    let (_, running) = full_host(32);
    let poffers: Vec<PreemptionOffer> = (0..3)
        .map(|i| PreemptionOffer {
            host_id: format!("h{i}"),
            victims: running[i * 3..i * 3 + 1 + i].to_vec(),
            score: 0.1 * i as f64,
        })
        .collect();
    rows.push((
        "exchange: choose among 3 preemption bids".to_string(),
        percentiles(n, || {
            black_box(best_offer(&poffers));
        }),
    ));
    println!("| step | p50 | p99 |\n|---|---|---|");
    for (name, (p50, p99)) in rows {
        println!("| {name} | {:.2} µs | {:.2} µs |", us(p50), us(p99));
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
