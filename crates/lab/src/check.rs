//! The invariants a fault must not break, checked over a [`History`] (pure):
//!
//! - every acknowledged create exists afterwards exactly once, with the id it was
//!   acknowledged with, unless a destroy of it was tried (an indeterminate create may exist
//!   0 or 1 times, a refused one never); no machine appears that no call made; every
//!   acknowledged destroy stays destroyed; no id is held by two owners;
//! - no host's committed plus reserved resources exceed its capacity in any sample, and at
//!   the end every host's ledger counts exactly the machines it holds;
//! - after the heal every node's catalog equals the owners' truth within a bound, and
//!   every machine settles (no operation left under way);
//! - during a partition each side places on its own hosts and is not refused;
//! - the proxies of unimpaired hosts keep serving (error rate within a bound);
//! - workloads that must outlive the fault keep their pids.
//!
//! [`check`] answers a [`Row`] of the fault matrix and every [`Violation`] with the calls
//! that show it.

use crate::history::{Call, History, MachineView, Op, Outcome};
use std::collections::{BTreeMap, BTreeSet};

/// States in which a machine waits for nothing (no operation of it is under way).
pub const SETTLED: [&str; 4] = ["started", "stopped", "suspended", "failed"];

/// Limits a run is held to.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Every catalog equals the truth at most this long after the heal.
    pub converge_ms: u64,
    /// Largest share of failed proxy requests on unimpaired hosts during the fault.
    pub proxy_error_rate: f64,
}

/// One line of the fault matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub fault: String,
    pub tried: usize,
    pub acknowledged: usize,
    pub indeterminate: usize,
    pub lost: usize,
    pub duplicated: usize,
    pub overcommits: usize,
    /// Time from the heal until every catalog equalled the truth.
    pub converged_ms: Option<u64>,
    /// Proxy requests on unimpaired hosts during the fault, and how many failed.
    pub proxy_requests: usize,
    pub proxy_errors: usize,
}

impl Row {
    pub fn proxy_error_rate(&self) -> f64 {
        if self.proxy_requests == 0 {
            0.0
        } else {
            self.proxy_errors as f64 / self.proxy_requests as f64
        }
    }
}

/// A broken invariant.
#[derive(Debug, Clone, PartialEq)]
pub struct Violation {
    /// Short name: `lost`, `duplicated`, `phantom`, `refused-exists`, `unsettled`, `resurrected`,
    /// `overcommit`, `ledger`, `converge`, `partition-side`, `minority-refused`, `proxy`,
    /// `pids`.
    pub invariant: &'static str,
    pub detail: String,
    /// The calls that show it.
    pub excerpt: Vec<String>,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.invariant, self.detail)?;
        for line in &self.excerpt {
            write!(f, "\n    {line}")?;
        }
        Ok(())
    }
}

/// Checks every invariant over `h`.
pub fn check(h: &History, bounds: &Bounds) -> (Row, Vec<Violation>) {
    let mut v = Vec::new();
    let (lost, duplicated) = check_machines(h, &mut v);
    let overcommits = check_ledgers(h, &mut v);
    check_convergence(h, bounds, &mut v);
    check_sides(h, &mut v);
    let (proxy_requests, proxy_errors) = check_proxy(h, bounds, &mut v);
    check_pids(h, &mut v);
    let row = Row {
        fault: h.fault.kind.clone(),
        tried: h.calls.len(),
        acknowledged: h.calls.iter().filter(|c| c.outcome.is_ok()).count(),
        indeterminate: h
            .calls
            .iter()
            .filter(|c| matches!(c.outcome, Outcome::Indeterminate { .. }))
            .count(),
        lost,
        duplicated,
        overcommits,
        converged_ms: h.end.converged_after_ms,
        proxy_requests,
        proxy_errors,
    };
    (row, v)
}

/// The calls about a machine id or a create tag.
fn excerpt(h: &History, id: Option<&str>, tag: Option<&str>) -> Vec<String> {
    h.calls
        .iter()
        .filter(|c| {
            let about_id = id.is_some() && c.op.machine() == id;
            let made_id = id.is_some()
                && matches!(&c.outcome, Outcome::Ok { id: Some(x), .. } if Some(x.as_str()) == id);
            let about_tag = matches!(&c.op, Op::Create { tag: t, .. } if Some(t.as_str()) == tag);
            about_id || made_id || about_tag
        })
        .map(Call::to_string)
        .collect()
}

/// Creates and destroys against the owners' truth; answers (lost, duplicated).
fn check_machines(h: &History, v: &mut Vec<Violation>) -> (usize, usize) {
    let workload: Vec<&MachineView> = h
        .end
        .truth
        .iter()
        .filter(|m| h.workload_apps.contains(&m.app))
        .collect();
    let mut by_tag: BTreeMap<&str, Vec<&MachineView>> = BTreeMap::new();
    for m in &workload {
        by_tag.entry(m.name.as_str()).or_default().push(m);
    }
    let mut owners: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for m in &h.end.truth {
        owners
            .entry(m.id.as_str())
            .or_default()
            .push(m.host_id.as_str());
    }
    // A destroy that was tried and may have happened (acknowledged or unknown).
    let destroy_tried: BTreeSet<&str> = h
        .calls
        .iter()
        .filter(|c| !matches!(c.outcome, Outcome::Failed { .. }))
        .filter_map(|c| match &c.op {
            Op::Destroy { id, .. } => Some(id.as_str()),
            _ => None,
        })
        .collect();
    let (mut lost, mut duplicated) = (0, 0);
    for (id, hosts) in &owners {
        if hosts.len() > 1 {
            duplicated += 1;
            v.push(Violation {
                invariant: "duplicated",
                detail: format!("machine {id} is held by {} owners: {hosts:?}", hosts.len()),
                excerpt: excerpt(h, Some(id), None),
            });
        }
    }
    let mut tags = BTreeSet::new();
    for c in &h.calls {
        let Op::Create { tag, .. } = &c.op else {
            continue;
        };
        tags.insert(tag.as_str());
        let found: Vec<&MachineView> = by_tag.get(tag.as_str()).cloned().unwrap_or_default();
        let ids: BTreeSet<&str> = found.iter().map(|m| m.id.as_str()).collect();
        if ids.len() > 1 {
            duplicated += 1;
            v.push(Violation {
                invariant: "duplicated",
                detail: format!("create {tag} made {} machines: {ids:?}", ids.len()),
                excerpt: excerpt(h, None, Some(tag)),
            });
            continue;
        }
        match &c.outcome {
            Outcome::Ok { id, .. } => {
                let Some(id) = id else {
                    v.push(Violation {
                        invariant: "lost",
                        detail: format!("create {tag} was acknowledged without an id"),
                        excerpt: excerpt(h, None, Some(tag)),
                    });
                    continue;
                };
                if let Some(other) = ids.iter().find(|x| *x != id) {
                    duplicated += 1;
                    v.push(Violation {
                        invariant: "duplicated",
                        detail: format!("create {tag} was acknowledged as {id} but made {other}"),
                        excerpt: excerpt(h, Some(id), Some(tag)),
                    });
                } else if ids.is_empty() && !destroy_tried.contains(id.as_str()) {
                    lost += 1;
                    v.push(Violation {
                        invariant: "lost",
                        detail: format!(
                            "create {tag} was acknowledged as {id}, which no owner holds"
                        ),
                        excerpt: excerpt(h, Some(id), Some(tag)),
                    });
                }
            }
            Outcome::Failed { .. } if !ids.is_empty() => v.push(Violation {
                invariant: "refused-exists",
                detail: format!("create {tag} was refused but made {ids:?}"),
                excerpt: excerpt(h, None, Some(tag)),
            }),
            _ => {}
        }
    }
    for m in &workload {
        if !tags.contains(m.name.as_str()) {
            v.push(Violation {
                invariant: "phantom",
                detail: format!(
                    "machine {} ({}) on {} was made by no call",
                    m.id, m.name, m.host_id
                ),
                excerpt: excerpt(h, Some(&m.id), None),
            });
        }
    }
    for m in &h.end.truth {
        if !SETTLED.contains(&m.state.as_str()) {
            v.push(Violation {
                invariant: "unsettled",
                detail: format!(
                    "machine {} ({}) on {} is still {} at the end",
                    m.id, m.name, m.host_id, m.state
                ),
                excerpt: excerpt(h, Some(&m.id), Some(&m.name)),
            });
        }
    }
    for c in &h.calls {
        if let (Op::Destroy { id, .. }, Outcome::Ok { .. }) = (&c.op, &c.outcome) {
            if owners.contains_key(id.as_str()) {
                v.push(Violation {
                    invariant: "resurrected",
                    detail: format!("machine {id} was destroyed (acknowledged) but exists"),
                    excerpt: excerpt(h, Some(id), None),
                });
            }
        }
    }
    (lost, duplicated)
}

/// Capacity in every sample, and the final ledgers against the owners' machines;
/// answers how many samples overcommitted.
fn check_ledgers(h: &History, v: &mut Vec<Violation>) -> usize {
    let mut overcommits = 0;
    for s in h.ledgers.iter().chain(&h.end.ledgers) {
        // Batch machines on reclaimed room are held against the reclaimed pool instead.
        let by_request = || {
            s.committed
                .iter()
                .filter(|(id, _)| !s.batch.contains(id))
                .map(|(_, r)| r)
        };
        let cpus: u32 = by_request().map(|r| r.cpus).sum::<u32>() + s.reserved.cpus;
        let mem: u64 = by_request().map(|r| r.memory_mb).sum::<u64>() + s.reserved.memory_mb;
        if let Some((millicpus, memory_mb)) = s.batch_held.filter(|_| !s.batch.is_empty()) {
            if millicpus > u64::from(s.capacity.cpus) * 1000 || memory_mb > s.capacity.memory_mb {
                overcommits += 1;
                v.push(Violation {
                    invariant: "overcommit",
                    detail: format!(
                        "{} at {} ms holds {millicpus} millicpus / {memory_mb} MB (reservations + batch) of {} / {}",
                        s.host, s.at_ms, s.capacity.cpus, s.capacity.memory_mb
                    ),
                    excerpt: Vec::new(),
                });
            }
        }
        if cpus > s.capacity.cpus || mem > s.capacity.memory_mb {
            overcommits += 1;
            v.push(Violation {
                invariant: "overcommit",
                detail: format!(
                    "{} at {} ms holds {cpus} cpus / {mem} MB (committed + reserved) of {} / {}",
                    s.host, s.at_ms, s.capacity.cpus, s.capacity.memory_mb
                ),
                excerpt: Vec::new(),
            });
        }
    }
    for s in &h.end.ledgers {
        let Some(held) = h.end.held.get(&s.host) else {
            continue;
        };
        let held: BTreeSet<&str> = held.iter().map(String::as_str).collect();
        let counted: BTreeSet<&str> = s.committed.keys().map(String::as_str).collect();
        if held != counted {
            let extra: Vec<&&str> = counted.difference(&held).collect();
            let missing: Vec<&&str> = held.difference(&counted).collect();
            v.push(Violation {
                invariant: "ledger",
                detail: format!(
                    "{}'s ledger counts machines it does not hold {extra:?} and misses machines it holds {missing:?}",
                    s.host
                ),
                excerpt: extra
                    .iter()
                    .chain(&missing)
                    .flat_map(|id| excerpt(h, Some(id), None))
                    .collect(),
            });
        }
    }
    overcommits
}

fn check_convergence(h: &History, bounds: &Bounds, v: &mut Vec<Violation>) {
    match h.end.converged_after_ms {
        Some(ms) if ms <= bounds.converge_ms => {}
        took => {
            let truth: BTreeSet<&MachineView> = h.end.truth.iter().collect();
            let mut diffs = Vec::new();
            for (node, rows) in &h.end.catalogs {
                let seen: BTreeSet<&MachineView> = rows.iter().collect();
                for m in truth.difference(&seen).take(3) {
                    diffs.push(format!("{node} lacks or differs on {m:?}"));
                    diffs.extend(excerpt(h, Some(&m.id), Some(&m.name)));
                }
                for m in seen.difference(&truth).take(3) {
                    diffs.push(format!("{node} shows {m:?}, which no owner holds so"));
                    diffs.extend(excerpt(h, Some(&m.id), Some(&m.name)));
                }
            }
            diffs.extend(
                h.end
                    .last_disagreement
                    .iter()
                    .map(|d| format!("before: {d}")),
            );
            v.push(Violation {
                invariant: "converge",
                detail: match took {
                    Some(ms) => format!(
                        "catalogs equalled the owners' truth {ms} ms after the workload ended, {} ms after the heal (bound {} ms)",
                        h.end.quiet_after_ms,
                        bounds.converge_ms
                    ),
                    None => "catalogs never equalled the owners' truth after the heal".into(),
                },
                excerpt: diffs,
            });
        }
    }
}

/// During a partition, each side places on its own hosts and is not refused.
fn check_sides(h: &History, v: &mut Vec<Violation>) {
    if h.fault.sides.is_empty() {
        return;
    }
    let Some(from) = h.fault.split_seen_ms else {
        v.push(Violation {
            invariant: "partition-side",
            detail: "the sides never saw each other gone".into(),
            excerpt: Vec::new(),
        });
        return;
    };
    let side_of_host_id = |host_id: &str| {
        let name = h.host_ids.iter().find(|(_, id)| *id == host_id)?.0;
        h.fault.sides.iter().position(|s| s.contains(name))
    };
    for (i, side) in h.fault.sides.iter().enumerate() {
        let creates: Vec<&Call> = h
            .calls
            .iter()
            .filter(|c| matches!(c.op, Op::Create { .. }))
            .filter(|c| side.contains(&c.node) && !h.fault.impaired.contains(&c.node))
            .filter(|c| c.start_ms >= from && c.end_ms <= h.fault.healed_ms)
            .collect();
        for c in &creates {
            if let Outcome::Ok {
                host_id: Some(host),
                ..
            } = &c.outcome
            {
                if side_of_host_id(host) != Some(i) {
                    v.push(Violation {
                        invariant: "partition-side",
                        detail: format!(
                            "a create through {} was placed across the partition",
                            c.node
                        ),
                        excerpt: vec![c.to_string()],
                    });
                }
            }
        }
        let acked = creates.iter().filter(|c| c.outcome.is_ok()).count();
        let refused_for_other_reasons = creates.iter().any(|c| match &c.outcome {
            Outcome::Failed { error, .. } => !error.contains("insufficient"),
            Outcome::Indeterminate { .. } => true,
            Outcome::Ok { .. } => false,
        });
        if !creates.is_empty() && acked == 0 && refused_for_other_reasons {
            v.push(Violation {
                invariant: "minority-refused",
                detail: format!(
                    "side {} placed nothing during the partition ({} creates tried)",
                    side.join(","),
                    creates.len()
                ),
                excerpt: creates.iter().map(|c| c.to_string()).collect(),
            });
        }
    }
}

/// Answers (requests, errors) on unimpaired proxies during the fault.
fn check_proxy(h: &History, bounds: &Bounds, v: &mut Vec<Violation>) -> (usize, usize) {
    let during: Vec<_> = h
        .proxy
        .iter()
        .filter(|s| s.at_ms >= h.fault.injected_ms && s.at_ms <= h.fault.healed_ms)
        .filter(|s| !h.fault.impaired.contains(&s.proxy))
        .collect();
    let errors: Vec<_> = during.iter().filter(|s| s.status != Some(200)).collect();
    let rate = if during.is_empty() {
        0.0
    } else {
        errors.len() as f64 / during.len() as f64
    };
    if rate > bounds.proxy_error_rate {
        v.push(Violation {
            invariant: "proxy",
            detail: format!(
                "{} of {} proxy requests failed during the fault ({:.1} %, bound {:.1} %)",
                errors.len(),
                during.len(),
                rate * 100.0,
                bounds.proxy_error_rate * 100.0
            ),
            excerpt: errors
                .iter()
                .take(5)
                .map(|s| format!("[{} ms] via {}: {:?}", s.at_ms, s.proxy, s.status))
                .collect(),
        });
    }
    (during.len(), errors.len())
}

fn check_pids(h: &History, v: &mut Vec<Violation>) {
    for w in &h.pids {
        let (before, after): (BTreeSet<_>, BTreeSet<_>) =
            (w.before.iter().collect(), w.after.iter().collect());
        if before.is_empty() || before != after {
            v.push(Violation {
                invariant: "pids",
                detail: format!(
                    "machine {} on {}: workload pids {:?} before the fault, {:?} after",
                    w.machine, w.host, w.before, w.after
                ),
                excerpt: Vec::new(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::*;

    const BOUNDS: Bounds = Bounds {
        converge_ms: 5_000,
        proxy_error_rate: 0.05,
    };

    fn view(id: &str, name: &str, host: &str) -> MachineView {
        MachineView {
            id: id.into(),
            name: name.into(),
            app: "load".into(),
            host_id: host.into(),
            state: "started".into(),
        }
    }

    fn call(node: &str, op: Op, t: u64, outcome: Outcome) -> Call {
        Call {
            client: 1,
            node: node.into(),
            op,
            start_ms: t,
            end_ms: t + 10,
            outcome,
        }
    }

    fn create(tag: &str) -> Op {
        Op::Create {
            app: "load".into(),
            tag: tag.into(),
        }
    }

    fn destroy(id: &str) -> Op {
        Op::Destroy {
            app: "load".into(),
            id: id.into(),
        }
    }

    fn ok(id: &str, host: &str) -> Outcome {
        Outcome::Ok {
            id: Some(id.into()),
            host_id: Some(host.into()),
        }
    }

    fn refused() -> Outcome {
        Outcome::Failed {
            status: 412,
            error: "no".into(),
        }
    }

    fn unknown() -> Outcome {
        Outcome::Indeterminate {
            why: "timed out".into(),
        }
    }

    fn res(cpus: u32, memory_mb: u64) -> Resources {
        Resources { cpus, memory_mb }
    }

    fn ledger(host: &str, at_ms: u64, machines: &[(&str, u64)]) -> LedgerSample {
        LedgerSample {
            at_ms,
            host: host.into(),
            capacity: res(16, 1024),
            committed: machines
                .iter()
                .map(|(id, mb)| (id.to_string(), res(1, *mb)))
                .collect(),
            reserved: res(0, 0),
            batch: Vec::new(),
            batch_held: None,
            displaced: Vec::new(),
        }
    }

    /// A clean history: two creates (one destroyed), a refused one, an unknown one that
    /// took effect and one that did not, a partition both sides placed through, a proxy
    /// that served, a workload that kept its pid.
    fn clean() -> History {
        let truth = vec![view("m1", "c1", "id1"), view("m3", "c3", "id2")];
        History {
            fault: FaultRecord {
                kind: "partition".into(),
                sides: vec![vec!["h1".into()], vec!["h2".into()]],
                impaired: vec![],
                injected_ms: 100,
                split_seen_ms: Some(200),
                healed_ms: 1000,
            },
            host_ids: [("h1".into(), "id1".into()), ("h2".into(), "id2".into())].into(),
            workload_apps: vec!["load".into()],
            calls: vec![
                call("h1", create("c1"), 300, ok("m1", "id1")),
                call("h2", create("c2"), 300, ok("m2", "id2")),
                call("h2", destroy("m2"), 400, ok("", "")),
                call("h1", create("c3"), 500, unknown()),
                call("h1", create("c4"), 500, unknown()),
                call("h2", create("c5"), 600, refused()),
            ],
            ledgers: vec![ledger("h1", 300, &[("m1", 512)])],
            proxy: (0..100)
                .map(|i| ProxySample {
                    at_ms: 100 + i * 9,
                    proxy: "h1".into(),
                    status: Some(200),
                })
                .collect(),
            pids: vec![PidWatch {
                machine: "w1".into(),
                host: "h1".into(),
                before: vec![7],
                after: vec![7],
            }],
            end: EndState {
                catalogs: [("h1".into(), truth.clone()), ("h2".into(), truth.clone())].into(),
                truth,
                converged_after_ms: Some(800),
                ledgers: vec![
                    ledger("h1", 2000, &[("m1", 512)]),
                    ledger("h2", 2000, &[("m3", 512)]),
                ],
                held: [
                    ("h1".into(), vec!["m1".into()]),
                    ("h2".into(), vec!["m3".into()]),
                ]
                .into(),
                ..EndState::default()
            },
        }
    }

    fn broken(h: &History) -> Vec<&'static str> {
        check(h, &BOUNDS).1.iter().map(|v| v.invariant).collect()
    }

    #[test]
    fn a_clean_history_passes_and_is_counted() {
        let (row, v) = check(&clean(), &BOUNDS);
        assert!(v.is_empty(), "{v:#?}");
        assert_eq!(
            (row.tried, row.acknowledged, row.indeterminate, row.lost),
            (6, 3, 2, 0)
        );
        assert_eq!((row.proxy_requests, row.proxy_errors), (100, 0));
    }

    #[test]
    fn an_acknowledged_create_that_vanished_is_lost() {
        let mut h = clean();
        h.end.truth.retain(|m| m.id != "m1");
        h.end.ledgers[0].committed.clear();
        h.end.held.insert("h1".into(), vec![]);
        h.end
            .catalogs
            .values_mut()
            .for_each(|c| c.retain(|m| m.id != "m1"));
        let (row, v) = check(&h, &BOUNDS);
        assert_eq!(row.lost, 1);
        assert_eq!(v.len(), 1, "{v:#?}");
        assert_eq!(v[0].invariant, "lost");
        assert!(
            v[0].excerpt[0].contains("create load/c1"),
            "{:?}",
            v[0].excerpt
        );
    }

    #[test]
    fn a_create_made_twice_is_duplicated_whichever_way() {
        // Same tag, two ids.
        let mut h = clean();
        h.end.truth.push(view("m9", "c1", "id2"));
        assert!(broken(&h).contains(&"duplicated"));
        // Same id on two owners.
        let mut h = clean();
        h.end.truth.push(view("m1", "c1", "id2"));
        assert!(broken(&h).contains(&"duplicated"));
        // An indeterminate create may exist once, not twice.
        let mut h = clean();
        h.end.truth.push(view("m8", "c4", "id1"));
        h.end.truth.push(view("m7", "c4", "id2"));
        let (row, _) = check(&h, &BOUNDS);
        assert_eq!(row.duplicated, 1);
    }

    #[test]
    fn a_machine_left_mid_operation_is_unsettled() {
        let mut h = clean();
        h.end.truth[0].state = "created".into();
        h.end
            .catalogs
            .values_mut()
            .for_each(|c| c[0].state = "created".into());
        assert_eq!(broken(&h), ["unsettled"]);
    }

    #[test]
    fn refused_creates_phantoms_and_resurrections_are_caught() {
        let mut h = clean();
        h.end.truth.push(view("m5", "c5", "id2"));
        assert!(broken(&h).contains(&"refused-exists"));
        let mut h = clean();
        h.end.truth.push(view("m6", "nobody", "id2"));
        assert!(broken(&h).contains(&"phantom"));
        let mut h = clean();
        h.end.truth.push(view("m2", "c2", "id2"));
        assert!(broken(&h).contains(&"resurrected"));
    }

    #[test]
    fn overcommit_and_ledger_drift_are_caught() {
        let mut h = clean();
        h.ledgers
            .push(ledger("h2", 700, &[("m3", 512), ("x", 512), ("y", 1)]));
        let (row, v) = check(&h, &BOUNDS);
        assert_eq!(row.overcommits, 1);
        assert_eq!(v[0].invariant, "overcommit", "{v:#?}");
        // Reservations count too.
        let mut h = clean();
        h.ledgers[0].reserved = res(0, 600);
        assert_eq!(broken(&h), ["overcommit"]);
        // A ledger that still counts a destroyed machine.
        let mut h = clean();
        h.end.ledgers[1].committed.insert("m2".into(), res(1, 64));
        let v = check(&h, &BOUNDS).1;
        assert_eq!(v[0].invariant, "ledger");
        assert!(v[0].detail.contains("m2"), "{}", v[0]);
    }

    #[test]
    fn batch_machines_count_in_the_reclaimed_pool_not_by_request() {
        // 512 + 600 MB of 1024 by request would overcommit; the 600 is a batch machine on
        // reclaimed room, and the pool holds 900 of 1024: fine.
        let mut h = clean();
        let mut s = ledger("h1", 400, &[("m1", 512), ("b1", 600)]);
        s.batch = vec!["b1".into()];
        s.batch_held = Some((2000, 900));
        h.ledgers.push(s.clone());
        assert!(check(&h, &BOUNDS).1.is_empty());
        // Reservations + batch past capacity is an overcommit.
        s.batch_held = Some((2000, 1100));
        h.ledgers.push(s);
        assert_eq!(broken(&h), ["overcommit"]);
    }

    #[test]
    fn slow_or_missing_convergence_is_caught_with_the_difference() {
        let mut h = clean();
        h.end.converged_after_ms = Some(9_000);
        h.end.last_disagreement = vec!["h2 lacks m3".into()];
        assert_eq!(check(&h, &BOUNDS).1[0].excerpt, ["before: h2 lacks m3"]);
        h.end.converged_after_ms = None;
        h.end
            .catalogs
            .get_mut("h2")
            .unwrap()
            .retain(|m| m.id != "m3");
        let v = check(&h, &BOUNDS).1;
        assert_eq!(v[0].invariant, "converge");
        assert!(v[0].excerpt[0].contains("h2 lacks"), "{:?}", v[0].excerpt);
    }

    #[test]
    fn a_refused_minority_or_a_placement_across_the_partition_is_caught() {
        let mut h = clean();
        for c in &mut h.calls {
            if c.node == "h1" {
                c.outcome = Outcome::Failed {
                    status: 503,
                    error: "no quorum".into(),
                };
            }
        }
        h.end.truth.retain(|m| m.id != "m1" && m.id != "m3");
        h.end.catalogs.values_mut().for_each(|c| c.clear());
        h.end.ledgers.iter_mut().for_each(|l| l.committed.clear());
        h.end.held.values_mut().for_each(Vec::clear);
        h.ledgers.clear();
        assert_eq!(broken(&h), ["minority-refused"]);
        // Refusals for capacity are not a refused minority.
        for c in &mut h.calls {
            if let Outcome::Failed { error, .. } = &mut c.outcome {
                *error = "insufficient memory".into();
            }
        }
        assert!(broken(&h).is_empty());
        let mut h = clean();
        h.calls[0].outcome = ok("m1", "id2");
        assert!(broken(&h).contains(&"partition-side"));
        let mut h = clean();
        h.fault.split_seen_ms = None;
        assert_eq!(broken(&h), ["partition-side"]);
    }

    #[test]
    fn proxy_errors_on_unimpaired_hosts_count() {
        let mut h = clean();
        for s in h.proxy.iter_mut().take(10) {
            s.status = Some(502);
        }
        let (row, v) = check(&h, &BOUNDS);
        assert_eq!((row.proxy_requests, row.proxy_errors), (100, 10));
        assert_eq!(v[0].invariant, "proxy");
        // Not when that host is the one the fault took down.
        h.fault.impaired = vec!["h1".into()];
        assert!(broken(&h).is_empty());
    }

    #[test]
    fn a_restarted_workload_is_caught() {
        let mut h = clean();
        h.pids[0].after = vec![8];
        assert_eq!(broken(&h), ["pids"]);
        h.pids[0].after = vec![];
        assert_eq!(broken(&h), ["pids"]);
    }
}
