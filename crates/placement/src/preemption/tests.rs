use super::*;
use proptest::prelude::*;

fn r(cpus: u32, memory_mb: u64) -> Resources {
    Resources { cpus, memory_mb }
}

fn c(id: &str, priority: Priority, cpus: u32, memory_mb: u64, created_at_ms: u64) -> Candidate {
    Candidate {
        machine_id: id.into(),
        priority,
        resources: r(cpus, memory_mb),
        created_at_ms,
    }
}

fn ids(v: &[Candidate]) -> Vec<&str> {
    v.iter().map(|c| c.machine_id.as_str()).collect()
}

#[test]
fn a_critical_machine_stops_the_cheapest_batch_machine_never_its_own_class() {
    use Priority::*;
    let running = vec![
        c("svc", Default, 2, 2048, 1),
        c("old-batch", Batch, 1, 1024, 2),
        c("new-batch", Batch, 1, 1024, 3),
        c("big-batch", Batch, 2, 2048, 4),
        c("crit", Critical, 1, 512, 5),
    ];
    let free = r(0, 0);
    // Fewest machines first, then least resources, then newest.
    let v = choose_victims(free, r(1, 1024), Critical, &running).unwrap();
    assert_eq!(ids(&v), ["new-batch"]);
    // One machine is enough only if it is big: the big batch one, not the default one.
    let v = choose_victims(free, r(2, 2048), Critical, &running).unwrap();
    assert_eq!(ids(&v), ["big-batch"]);
    // A default machine may stop batch ones only.
    let v = choose_victims(free, r(2, 2048), Default, &running).unwrap();
    assert_eq!(ids(&v), ["big-batch"]);
    assert_eq!(choose_victims(free, r(5, 5000), Default, &running), None);
    // A batch machine stops nothing.
    assert_eq!(choose_victims(free, r(1, 256), Batch, &running), None);
    // Room already: nothing is stopped.
    assert_eq!(
        choose_victims(r(1, 256), r(1, 256), Batch, &running),
        Some(vec![])
    );
    // What is free counts: 512 MB free plus a 512 MB machine is enough.
    let running = vec![c("a", Batch, 1, 512, 1), c("b", Batch, 1, 2048, 2)];
    let v = choose_victims(r(0, 512), r(1, 1024), Critical, &running).unwrap();
    assert_eq!(ids(&v), ["a"]);
}

#[test]
fn the_exchange_takes_the_offer_that_displaces_least() {
    use Priority::*;
    let offer = |host: &str, victims: Vec<Candidate>, score: f64| PreemptionOffer {
        host_id: host.into(),
        victims,
        score,
    };
    let offers = vec![
        offer(
            "h1",
            vec![c("a", Batch, 1, 256, 1), c("b", Batch, 1, 256, 1)],
            0.9,
        ),
        offer("h2", vec![c("c", Default, 1, 256, 1)], 0.5),
        offer("h3", vec![c("d", Batch, 1, 512, 1)], 0.1),
        offer("h4", vec![c("e", Batch, 1, 256, 1)], 0.2),
    ];
    assert_eq!(best_offer(&offers).unwrap().host_id, "h4");
    assert!(best_offer(&[]).is_none());
}

#[test]
fn many_small_machines_fall_back_to_a_greedy_choice_of_lower_classes() {
    let running: Vec<Candidate> = (0..200)
        .map(|i| c(&format!("m{i:03}"), Priority::Batch, 0, 64, i))
        .chain([c("svc", Priority::Default, 0, 100_000, 0)])
        .collect();
    let v = choose_victims(r(0, 0), r(0, 64 * 6), Priority::Default, &running).unwrap();
    assert_eq!(v.len(), 6);
    assert!(v.iter().all(|c| c.priority == Priority::Batch));
}

fn priority() -> impl Strategy<Value = Priority> {
    prop_oneof![
        Just(Priority::Batch),
        Just(Priority::Default),
        Just(Priority::Critical)
    ]
}

fn candidates(max: usize) -> impl Strategy<Value = Vec<Candidate>> {
    proptest::collection::vec((priority(), 0u32..4, 0u64..4, 0u64..5), 0..max).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (p, cpus, mem, t))| c(&format!("m{i}"), p, cpus, mem * 256, t))
            .collect()
    })
}

proptest! {
    /// The choice covers the request, takes only lower classes, and no other set of lower
    /// classes that covers it is cheaper by the rule (brute force over every subset).
    #[test]
    fn the_choice_is_the_cheapest_set_of_lower_classes(
        running in candidates(9),
        want_cpus in 0u32..8,
        want_mem in 0u64..8,
        free_cpus in 0u32..2,
        free_mem in 0u64..2,
        p in priority(),
    ) {
        let (free, want) = (r(free_cpus, free_mem * 256), r(want_cpus, want_mem * 256));
        let mut best: Option<Vec<&Candidate>> = None;
        for mask in 0u32..(1 << running.len()) {
            let set: Vec<&Candidate> = running
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .map(|(_, c)| c)
                .collect();
            if set.iter().all(|c| c.priority < p)
                && covers(free, &set, want)
                && best.as_ref().is_none_or(|b| compare_sets(&set, b) == Ordering::Less)
            {
                best = Some(set);
            }
        }
        let got = choose_victims(free, want, p, &running);
        match (got, best) {
            (None, None) => {}
            (Some(got), Some(best)) => {
                let got_refs: Vec<&Candidate> = got.iter().collect();
                prop_assert!(got.iter().all(|v| v.priority < p), "{got:?}");
                prop_assert!(covers(free, &got_refs, want));
                prop_assert_eq!(compare_sets(&got_refs, &best), Ordering::Equal);
            }
            (got, best) => prop_assert!(false, "got {got:?}, brute force {best:?}"),
        }
    }

    /// The ledger of a host taking a machine by preemption never holds more than its
    /// capacity, whatever other exchanges do meanwhile, and the claim succeeds once every
    /// victim has stopped.
    #[test]
    fn a_preemption_bid_never_overcommits_and_claims_once_victims_stopped(
        running in candidates(8),
        want_cpus in 1u32..6,
        want_mem in 1u64..6,
        others in proptest::collection::vec((0u32..3, 0u64..3), 0..6),
    ) {
        let cap = r(8, 8 * 256);
        let mut ledger = Ledger::new(cap);
        let mut placed = Vec::new();
        for m in &running {
            if ledger.commit(&m.machine_id, m.resources).is_ok() {
                placed.push(m.clone());
            }
        }
        let check = |l: &Ledger| {
            let (c, rsv) = (l.committed(), l.reserved());
            c.cpus + rsv.cpus <= cap.cpus && c.memory_mb + rsv.memory_mb <= cap.memory_mb
        };
        let want = r(want_cpus, want_mem * 256);
        let Some(victims) = choose_victims(ledger.free(), want, Priority::Critical, &placed) else {
            return Ok(());
        };
        let ids: Vec<String> = victims.iter().map(|v| v.machine_id.clone()).collect();
        let mut bid = Preemption::reserve(&mut ledger, "bid", want, ids.clone(), 1000).unwrap();
        prop_assert!(check(&ledger));
        for (i, victim) in ids.iter().enumerate() {
            // Another exchange tries to take what is free between the victims' stops.
            if let Some((cpus, mem)) = others.get(i) {
                let _ = ledger.reserve(&format!("other{i}"), r(*cpus, mem * 256), 1000);
            }
            prop_assert!(bid.claim(&mut ledger.clone(), "new").is_err(), "claimed before its victims stopped");
            bid.victim_stopped(&mut ledger, victim).unwrap();
            prop_assert!(check(&ledger));
        }
        prop_assert!(bid.pending().is_empty());
        prop_assert_eq!(bid.claim(&mut ledger, "new").unwrap(), want);
        prop_assert!(check(&ledger));
        prop_assert_eq!(ledger.committed_to("new"), Some(want));
    }
}
