//! Unit and property tests of the constraint, affinity, spread and per-host rules.

use super::*;
use proptest::prelude::*;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn c(label: &str, op: Op, value: Option<&str>) -> Constraint {
    Constraint {
        label: label.into(),
        op,
        value: value.map(Into::into),
    }
}

#[test]
fn ops_compare_labels_as_documented() {
    let l = labels(&[("disk", "nvme"), ("zone", "a")]);
    assert!(c("disk", Op::Eq, Some("nvme")).holds(&l));
    assert!(!c("disk", Op::Eq, Some("ssd")).holds(&l));
    assert!(!c("gpu", Op::Eq, Some("x")).holds(&l));
    assert!(c("disk", Op::Ne, Some("ssd")).holds(&l));
    assert!(
        c("gpu", Op::Ne, Some("x")).holds(&l),
        "absent label is != anything"
    );
    assert!(!c("disk", Op::Ne, Some("nvme")).holds(&l));
    assert!(c("zone", Op::In, Some("b, a")).holds(&l));
    assert!(!c("zone", Op::In, Some("b,c")).holds(&l));
    assert!(c("zone", Op::Exists, None).holds(&l));
    assert!(!c("gpu", Op::Exists, None).holds(&l));
}

#[test]
fn the_reason_names_the_unmet_constraint_and_what_the_host_has() {
    let l = labels(&[("disk", "ssd")]);
    let cs = [c("zone", Op::Exists, None), c("disk", Op::Eq, Some("nvme"))];
    assert_eq!(
        unmet(&cs, &l).unwrap(),
        "constraint zone exists not met (host has no label zone)"
    );
    let l = labels(&[("disk", "ssd"), ("zone", "a")]);
    assert_eq!(
        unmet(&cs, &l).unwrap(),
        "constraint disk = nvme not met (host has disk=ssd)"
    );
    assert!(unmet(&cs, &labels(&[("disk", "nvme"), ("zone", "b")])).is_none());
}

#[test]
fn the_policy_parses_from_json_and_refuses_bad_input_by_field() {
    let p: PlacementPolicy = serde_json::from_str(
        r#"{"constraints":[{"label":"disk","op":"=","value":"nvme"},{"label":"zone","op":"exists"}],
            "affinities":[{"label":"zone","value":"a","weight":50}],
            "spread":{"by":"label:zone"}}"#,
    )
    .unwrap();
    p.validate().unwrap();
    assert_eq!(p.spread_by(), Some(SpreadBy::Label("zone".into())));
    assert_eq!(p.affinities[0].op, Op::Eq, "op defaults to =");

    assert!(
        serde_json::from_str::<PlacementPolicy>(r#"{"constraints":[{"label":"a","op":"~"}]}"#)
            .is_err()
    );
    assert!(serde_json::from_str::<PlacementPolicy>(r#"{"nope":1}"#).is_err());

    let bad = |json: &str| {
        serde_json::from_str::<PlacementPolicy>(json)
            .unwrap()
            .validate()
            .unwrap_err()
    };
    assert!(bad(r#"{"constraints":[{"label":"disk","op":"="}]}"#)
        .contains("constraints[0]: op \"=\" needs a value"));
    assert!(
        bad(r#"{"constraints":[{"label":"disk","op":"exists","value":"x"}]}"#)
            .contains("takes no value")
    );
    assert!(bad(r#"{"constraints":[{"label":"","value":"x"}]}"#).contains("constraints[0].label"));
    assert!(
        bad(r#"{"constraints":[{"label":"z","op":"in","value":" , "}]}"#)
            .contains("comma-separated")
    );
    assert!(
        bad(r#"{"affinities":[{"label":"z","value":"a","weight":0}]}"#)
            .contains("affinities[0].weight")
    );
    assert!(bad(r#"{"affinities":[{"label":"z","value":"a","weight":101}]}"#).contains("weight"));
    assert!(bad(r#"{"spread":{"by":"rack"}}"#).contains("spread.by"));
    assert!(bad(r#"{"spread":{"by":"label:"}}"#).contains("spread.by"));
}

#[test]
fn affinities_are_normalised_and_may_be_negative() {
    let a = |label: &str, value: &str, weight| Affinity {
        label: label.into(),
        op: Op::Eq,
        value: Some(value.into()),
        weight,
    };
    let affs = [a("zone", "a", 50), a("disk", "hdd", -50)];
    assert_eq!(affinity_score(&affs, &labels(&[("zone", "a")])), 0.5);
    assert_eq!(affinity_score(&affs, &labels(&[("disk", "hdd")])), -0.5);
    assert_eq!(affinity_score(&affs, &labels(&[])), 0.0);
    assert_eq!(affinity_score(&[], &labels(&[("zone", "a")])), 0.0);
}

#[test]
fn spread_prefers_the_host_or_value_with_fewest_of_the_app() {
    let a = labels(&[("zone", "a")]);
    let b = labels(&[("zone", "b")]);
    let none = labels(&[]);
    let hosts = [
        HostView {
            host_id: "h1",
            labels: &a,
        },
        HostView {
            host_id: "h2",
            labels: &a,
        },
        HostView {
            host_id: "h3",
            labels: &b,
        },
        HostView {
            host_id: "h4",
            labels: &none,
        },
    ];
    let policy = PlacementPolicy {
        spread: Some(Spread {
            by: "label:zone".into(),
        }),
        ..Default::default()
    };
    let counts: BTreeMap<String, usize> = [("a".to_string(), 2)].into();
    let v = verdicts(&policy, &hosts, &counts);
    assert_eq!(v[0].spread, -1.0);
    assert_eq!(v[2].spread, 0.0, "zone b has none of the app");
    assert_eq!(v[3].spread, -1.0, "a host without the label is last");
    let best = v
        .iter()
        .max_by(|x, y| x.bonus().partial_cmp(&y.bonus()).unwrap())
        .unwrap();
    assert_eq!(best.host_id, "h3");

    let by_host = PlacementPolicy {
        spread: Some(Spread { by: "host".into() }),
        ..Default::default()
    };
    let counts: BTreeMap<String, usize> = [("h1".to_string(), 1), ("h3".to_string(), 1)].into();
    let v = verdicts(&by_host, &hosts, &counts);
    assert_eq!(
        v.iter().map(|v| v.spread).collect::<Vec<_>>(),
        [-0.5, 0.0, -0.5, 0.0]
    );
}

#[test]
fn an_impossible_placement_is_refused_with_each_constraint_counted() {
    let a = labels(&[("disk", "ssd")]);
    let b = labels(&[("disk", "nvme")]);
    let hosts = [
        HostView {
            host_id: "h1",
            labels: &a,
        },
        HostView {
            host_id: "h2",
            labels: &b,
        },
    ];
    let cs = [c("disk", Op::Eq, Some("nvme")), c("gpu", Op::Exists, None)];
    let policy = PlacementPolicy {
        constraints: cs.to_vec(),
        ..Default::default()
    };
    assert!(verdicts(&policy, &hosts, &BTreeMap::new())
        .iter()
        .all(|v| v.excluded.is_some()));
    assert_eq!(
        refusal(&cs, &hosts),
        "no host meets the constraints: disk = nvme (1 of 2 hosts fail), gpu exists (2 of 2 hosts fail)"
    );
}

#[test]
fn per_host_machines_follow_hosts_that_join_and_stop_matching() {
    let nvme = labels(&[("disk", "nvme")]);
    let ssd = labels(&[("disk", "ssd")]);
    let cs = [c("disk", Op::Eq, Some("nvme"))];
    let m = |id: &str, host: &str| (id.to_string(), host.to_string());

    // Two matching hosts, one machine: make one on the other.
    let hosts = [
        HostView {
            host_id: "h1",
            labels: &nvme,
        },
        HostView {
            host_id: "h2",
            labels: &nvme,
        },
        HostView {
            host_id: "h3",
            labels: &ssd,
        },
    ];
    let plan = per_host_plan(&cs, &hosts, &[m("m1", "h1")]);
    assert_eq!(plan.create_on, ["h2"]);
    assert!(plan.destroy.is_empty());

    // A host that joins gets one.
    let hosts4 = [
        HostView {
            host_id: "h1",
            labels: &nvme,
        },
        HostView {
            host_id: "h2",
            labels: &nvme,
        },
        HostView {
            host_id: "h4",
            labels: &nvme,
        },
    ];
    let plan = per_host_plan(&cs, &hosts4, &[m("m1", "h1"), m("m2", "h2")]);
    assert_eq!(plan.create_on, ["h4"]);

    // A host that no longer matches loses its machine; a duplicate goes (higher id).
    let plan = per_host_plan(
        &cs,
        &hosts,
        &[m("m1", "h1"), m("m0", "h1"), m("m2", "h2"), m("m3", "h3")],
    );
    assert!(plan.create_on.is_empty());
    assert_eq!(plan.destroy, ["m1", "m3"]);

    // A machine on a host that is not live is left alone and not replaced elsewhere.
    let plan = per_host_plan(&cs, &hosts[..1], &[m("m1", "h1"), m("m2", "h2")]);
    assert_eq!(plan, PerHostPlan::default());
}

#[test]
fn the_market_filters_candidates_and_spread_changes_the_winner() {
    use crate::exchange::{choose_winners, Candidate, Offer};
    use bazaar_types::host::Resources;
    let r = Resources {
        cpus: 8,
        memory_mb: 8192,
    };
    let host = |id: &str, pairs: &[(&str, &str)]| Candidate {
        host_id: id.into(),
        region: "local".into(),
        capacity: r,
        free: r,
        alive: true,
        draining: false,
        labels: labels(pairs),
    };
    let hosts = [
        host("h1", &[("disk", "nvme"), ("zone", "a")]),
        host("h2", &[("disk", "nvme"), ("zone", "b")]),
        host("h3", &[("disk", "ssd"), ("zone", "c")]),
    ];
    let cands: Vec<&Candidate> = hosts.iter().collect();
    let policy = PlacementPolicy {
        constraints: vec![c("disk", Op::Eq, Some("nvme"))],
        spread: Some(Spread {
            by: "label:zone".into(),
        }),
        ..Default::default()
    };
    let counts: BTreeMap<String, usize> = [("a".to_string(), 1)].into();
    let (ok, excluded) = apply(&policy, &cands, &counts);
    assert_eq!(
        ok.iter()
            .map(|(c, _)| c.host_id.as_str())
            .collect::<Vec<_>>(),
        ["h1", "h2"]
    );
    assert_eq!(excluded.len(), 1);
    assert_eq!(excluded[0].host_id, "h3");
    assert!(excluded[0].reason.contains("disk = nvme"));

    // h1 bids a little better on load, but zone a already has the app's machine.
    let mut offers = vec![
        Offer {
            host_id: "h1".into(),
            reservation_id: "r1".into(),
            score: 0.9,
        },
        Offer {
            host_id: "h2".into(),
            reservation_id: "r2".into(),
            score: 0.8,
        },
    ];
    let verdicts: Vec<HostVerdict> = ok.into_iter().map(|(_, v)| v).collect();
    adjust_offers(&mut offers, &verdicts);
    let (winners, _) = choose_winners(offers, 1);
    assert_eq!(winners[0].host_id, "h2");
}

fn arb_labels() -> impl Strategy<Value = BTreeMap<String, String>> {
    prop::collection::btree_map(
        prop::sample::select(vec!["disk", "zone", "gpu"]).prop_map(String::from),
        prop::sample::select(vec!["a", "b", "nvme"]).prop_map(String::from),
        0..3,
    )
}

fn arb_constraint() -> impl Strategy<Value = Constraint> {
    (
        prop::sample::select(vec!["disk", "zone", "gpu"]),
        prop::sample::select(vec![Op::Eq, Op::Ne, Op::In, Op::Exists]),
        prop::sample::select(vec!["a", "b", "nvme", "a,nvme"]),
    )
        .prop_map(|(l, op, v)| Constraint {
            label: l.into(),
            op,
            value: (op != Op::Exists).then(|| v.to_string()),
        })
}

proptest! {
    /// `!=` is exactly the negation of `=`, and `in` with one value is `=`.
    #[test]
    fn ne_negates_eq(l in arb_labels(), label in "disk|zone|gpu", v in "a|b|nvme") {
        let eq = c(&label, Op::Eq, Some(&v)).holds(&l);
        prop_assert_eq!(c(&label, Op::Ne, Some(&v)).holds(&l), !eq);
        prop_assert_eq!(c(&label, Op::In, Some(&v)).holds(&l), eq);
    }

    /// After the plan, every matching live host has exactly one machine and no other
    /// live host has any; machines on hosts that are not live are untouched.
    #[test]
    fn per_host_plan_converges(
        host_labels in prop::collection::vec(arb_labels(), 0..6),
        cs in prop::collection::vec(arb_constraint(), 0..3),
        existing in prop::collection::vec((0u8..20, 0usize..8), 0..12),
    ) {
        let ids: Vec<String> = (0..host_labels.len()).map(|i| format!("h{i}")).collect();
        let hosts: Vec<HostView<'_>> = ids.iter().zip(&host_labels)
            .map(|(id, labels)| HostView { host_id: id, labels }).collect();
        let mut machines: BTreeMap<String, String> = BTreeMap::new();
        for (m, h) in existing {
            machines.insert(format!("m{m}"), format!("h{h}"));
        }
        let list: Vec<(String, String)> = machines.clone().into_iter().collect();
        let plan = per_host_plan(&cs, &hosts, &list);
        for m in &plan.destroy {
            let host = machines.remove(m).expect("destroys only existing machines");
            prop_assert!(ids.contains(&host), "never touches a host that is not live");
        }
        for (i, h) in plan.create_on.iter().enumerate() {
            machines.insert(format!("new{i}"), h.clone());
        }
        for h in &hosts {
            let n = machines.values().filter(|x| *x == h.host_id).count();
            let want = usize::from(unmet(&cs, h.labels).is_none());
            prop_assert_eq!(n, want, "host {}", h.host_id);
        }
        // Converged: a second plan does nothing.
        let again: Vec<(String, String)> = machines.into_iter().collect();
        prop_assert_eq!(per_host_plan(&cs, &hosts, &again), PerHostPlan::default());
    }
}

#[test]
fn a_batch_spreads_over_hosts_and_affinities_tip_the_choice() {
    let (a, b, c) = (
        labels(&[("zone", "a")]),
        labels(&[("zone", "a")]),
        labels(&[("zone", "b")]),
    );
    let hosts = [
        HostView {
            host_id: "h1",
            labels: &a,
        },
        HostView {
            host_id: "h2",
            labels: &b,
        },
        HostView {
            host_id: "h3",
            labels: &c,
        },
    ];
    let offer = |h: &str, n: u32, score: f64| Offer {
        host_id: h.into(),
        reservation_id: format!("r{h}{n}"),
        score,
    };
    // h1 bids best twice: without a policy both winners are on h1.
    let offers = vec![
        offer("h1", 1, 0.9),
        offer("h1", 2, 0.9),
        offer("h2", 1, 0.5),
        offer("h3", 1, 0.4),
    ];
    let plain = crate::exchange::choose_winners(offers.clone(), 2);
    assert_eq!(
        plain
            .0
            .iter()
            .map(|o| o.host_id.as_str())
            .collect::<Vec<_>>(),
        ["h1", "h1"]
    );
    // Spread by host: the second machine goes elsewhere.
    let by_host = PlacementPolicy {
        spread: Some(Spread { by: "host".into() }),
        ..Default::default()
    };
    let (w, rest) = choose_winners(offers.clone(), 2, &by_host, &hosts, &BTreeMap::new());
    assert_eq!(
        w.iter().map(|o| o.host_id.as_str()).collect::<Vec<_>>(),
        ["h1", "h2"]
    );
    assert_eq!(rest.len(), 2);
    // Spread by zone: the second goes to the other zone, though its bid is the lowest.
    let by_zone = PlacementPolicy {
        spread: Some(Spread {
            by: "label:zone".into(),
        }),
        ..Default::default()
    };
    let (w, _) = choose_winners(offers.clone(), 2, &by_zone, &hosts, &BTreeMap::new());
    assert_eq!(
        w.iter().map(|o| o.host_id.as_str()).collect::<Vec<_>>(),
        ["h1", "h3"]
    );
    // An affinity for zone b outweighs h1's better bid.
    let prefer_b = PlacementPolicy {
        affinities: vec![Affinity {
            label: "zone".into(),
            op: Op::Eq,
            value: Some("b".into()),
            weight: 100,
        }],
        ..Default::default()
    };
    let (w, _) = choose_winners(offers, 1, &prefer_b, &hosts, &BTreeMap::new());
    assert_eq!(w[0].host_id, "h3");
    // The counts of machines already placed come from the app's machines' hosts.
    let counts = spread_counts(&SpreadBy::Label("zone".into()), ["h1", "h2", "h3"], |h| {
        hosts.iter().find(|v| v.host_id == h).map(|v| v.labels)
    });
    assert_eq!(counts, BTreeMap::from([("a".into(), 2), ("b".into(), 1)]));
}
