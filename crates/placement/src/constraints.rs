//! Constraints, affinities and spread (Nomad's `constraint` / `affinity` / `spread`), pure:
//! which hosts a machine may go to by the operator's host labels, how much it prefers each,
//! and how its app's machines already on a host (or on a label's value) lower that host's
//! preference. Also the rule of per-host machines (Nomad's system jobs): the machines to
//! make and to remove so that one runs on every matching live host.
//!
//! The policy is a bazaar extension of the machine config (`config.placement`, its types in
//! `bazaar_types::placement_policy`, re-exported here; docs/POLICY.md); this module holds
//! the rules only, no I/O. The API's exchange applies them (`bazaar_api`'s `exchange.rs`).

use crate::exchange::{Candidate, Exclusion, Offer};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

pub use bazaar_types::placement_policy::{
    holds, Affinity, Constraint, Op, PlacementPolicy, Spread, SpreadBy, MAX_RULES,
};

/// The first constraint a host with `labels` does not meet, as a reason naming it.
pub fn unmet(constraints: &[Constraint], labels: &BTreeMap<String, String>) -> Option<String> {
    constraints.iter().find(|c| !c.holds(labels)).map(|c| {
        let what = c.describe();
        match labels.get(&c.label) {
            Some(v) => format!("constraint {what} not met (host has {}={v})", c.label),
            None => format!("constraint {what} not met (host has no label {})", c.label),
        }
    })
}

/// Affinity score of a host in [-1, 1]: the weights of the affinities it meets over the
/// sum of all weights' magnitudes (Nomad's normalisation). 0 without affinities.
pub fn affinity_score(affinities: &[Affinity], labels: &BTreeMap<String, String>) -> f64 {
    let total: i64 = affinities.iter().map(|a| i64::from(a.weight.abs())).sum();
    if total == 0 {
        return 0.0;
    }
    let met: i64 = affinities
        .iter()
        .filter(|a| a.holds(labels))
        .map(|a| i64::from(a.weight))
        .sum();
    met as f64 / total as f64
}

/// The key a host counts under for `by`: its id, or its value of the label (`None`: the
/// host lacks the label, and counts under no value).
pub fn spread_key<'a>(
    by: &SpreadBy,
    host_id: &'a str,
    labels: &'a BTreeMap<String, String>,
) -> Option<&'a str> {
    match by {
        SpreadBy::Host => Some(host_id),
        SpreadBy::Label(l) => labels.get(l).map(String::as_str),
    }
}

/// Spread score of a host in [-1, 0]: minus the share of the app's machines already under
/// its key (0 when the app has none there; a host lacking the label counts as full).
/// `counts` is the app's machines per key, from the catalog.
pub fn spread_score(key: Option<&str>, counts: &BTreeMap<String, usize>) -> f64 {
    let total: usize = counts.values().sum();
    match key {
        None => -1.0,
        Some(_) if total == 0 => 0.0,
        Some(k) => -(counts.get(k).copied().unwrap_or(0) as f64) / total as f64,
    }
}

/// A host as the constraint rules see it.
#[derive(Debug, Clone, PartialEq)]
pub struct HostView<'a> {
    pub host_id: &'a str,
    pub labels: &'a BTreeMap<String, String>,
}

/// One host's verdict, for dry runs and `machine explain`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct HostVerdict {
    pub host_id: String,
    /// Why the host may not take the machine; `None`: it may.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub excluded: Option<String>,
    /// Affinity score in [-1, 1].
    pub affinity: f64,
    /// Spread score in [-1, 0].
    pub spread: f64,
}

impl HostVerdict {
    /// What the policy adds to a host's bid score (its weight: affinity and spread count as
    /// much as the load score, whose range is [0, 1]).
    pub fn bonus(&self) -> f64 {
        self.affinity + self.spread
    }
}

/// Each host's verdict under `policy`; `counts` is the app's machines per spread key.
pub fn verdicts(
    policy: &PlacementPolicy,
    hosts: &[HostView<'_>],
    counts: &BTreeMap<String, usize>,
) -> Vec<HostVerdict> {
    let by = policy.spread_by();
    hosts
        .iter()
        .map(|h| HostVerdict {
            host_id: h.host_id.to_string(),
            excluded: unmet(&policy.constraints, h.labels),
            affinity: affinity_score(&policy.affinities, h.labels),
            spread: by
                .as_ref()
                .map(|b| spread_score(spread_key(b, h.host_id, h.labels), counts))
                .unwrap_or(0.0),
        })
        .collect()
}

/// The refusal when no host meets the constraints: each constraint with how many hosts
/// fail it, e.g. `no host meets the constraints: disk = nvme (3 of 3 hosts fail)`.
pub fn refusal(constraints: &[Constraint], hosts: &[HostView<'_>]) -> String {
    let parts: Vec<String> = constraints
        .iter()
        .map(|c| {
            let fail = hosts.iter().filter(|h| !c.holds(h.labels)).count();
            format!("{} ({fail} of {} hosts fail)", c.describe(), hosts.len())
        })
        .collect();
    format!("no host meets the constraints: {}", parts.join(", "))
}

/// Applies `policy` to the exchange's candidates (`exchange::candidates`): a host failing a
/// constraint joins the exclusions with the reason naming it; the others come with their
/// verdict. `counts` is the app's machines per spread key, from the catalog.
pub fn apply<'a>(
    policy: &PlacementPolicy,
    cands: &[&'a Candidate],
    counts: &BTreeMap<String, usize>,
) -> (Vec<(&'a Candidate, HostVerdict)>, Vec<Exclusion>) {
    let views: Vec<HostView<'_>> = cands
        .iter()
        .map(|c| HostView {
            host_id: &c.host_id,
            labels: &c.labels,
        })
        .collect();
    let mut ok = Vec::new();
    let mut excluded = Vec::new();
    for (c, mut v) in cands.iter().zip(verdicts(policy, &views, counts)) {
        match v.excluded.take() {
            Some(reason) => excluded.push(Exclusion {
                host_id: v.host_id,
                reason,
            }),
            None => ok.push((*c, v)),
        }
    }
    (ok, excluded)
}

/// Adds each host's policy bonus (affinity + spread) to its offers' scores, before
/// `exchange::choose_winners` ranks them. Offers of hosts without a verdict are unchanged.
pub fn adjust_offers(offers: &mut [Offer], verdicts: &[HostVerdict]) {
    for o in offers {
        if let Some(v) = verdicts.iter().find(|v| v.host_id == o.host_id) {
            o.score += v.bonus();
        }
    }
}

/// The app's machines per spread key under `by`: `machine_hosts` are the hosts of the
/// app's live machines (one entry per machine), `labels_of` a host's labels.
pub fn spread_counts<'a>(
    by: &SpreadBy,
    machine_hosts: impl IntoIterator<Item = &'a str>,
    labels_of: impl Fn(&str) -> Option<&'a BTreeMap<String, String>>,
) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    let empty = BTreeMap::new();
    for host in machine_hosts {
        let labels = labels_of(host).unwrap_or(&empty);
        if let Some(k) = spread_key(by, host, labels) {
            *counts.entry(k.to_string()).or_insert(0) += 1;
        }
    }
    counts
}

/// `exchange::choose_winners` under a policy: the `count` winners are taken one at a time,
/// each the offer with the highest bid score plus its host's affinity and spread scores,
/// the spread counts growing with each winner (so a batch spreads too); ties by host id.
/// `hosts` are the offering hosts with their labels; `counts` the app's machines per spread
/// key before this placement. Offers of a host not in `hosts` get no bonus.
pub fn choose_winners(
    mut offers: Vec<Offer>,
    count: usize,
    policy: &PlacementPolicy,
    hosts: &[HostView<'_>],
    counts: &BTreeMap<String, usize>,
) -> (Vec<Offer>, Vec<Offer>) {
    let by = policy.spread_by();
    let mut counts = counts.clone();
    let mut winners = Vec::new();
    let bonus = |o: &Offer, counts: &BTreeMap<String, usize>| -> f64 {
        let Some(h) = hosts.iter().find(|h| h.host_id == o.host_id) else {
            return 0.0;
        };
        let spread = by
            .as_ref()
            .map(|b| spread_score(spread_key(b, h.host_id, h.labels), counts))
            .unwrap_or(0.0);
        affinity_score(&policy.affinities, h.labels) + spread
    };
    while winners.len() < count && !offers.is_empty() {
        let best = (0..offers.len())
            .max_by(|&a, &b| {
                let (oa, ob) = (&offers[a], &offers[b]);
                (oa.score + bonus(oa, &counts))
                    .total_cmp(&(ob.score + bonus(ob, &counts)))
                    .then_with(|| ob.host_id.cmp(&oa.host_id))
                    .then_with(|| ob.reservation_id.cmp(&oa.reservation_id))
            })
            .expect("offers is not empty");
        let mut won = offers.swap_remove(best);
        won.score += bonus(&won, &counts);
        if let (Some(b), Some(h)) = (&by, hosts.iter().find(|h| h.host_id == won.host_id)) {
            if let Some(k) = spread_key(b, h.host_id, h.labels) {
                *counts.entry(k.to_string()).or_insert(0) += 1;
            }
        }
        winners.push(won);
    }
    offers.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then_with(|| a.host_id.cmp(&b.host_id))
    });
    (winners, offers)
}

/// What to do so that a per-host machine runs once on every live host meeting its
/// constraints.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PerHostPlan {
    /// Hosts that should have one and have none.
    pub create_on: Vec<String>,
    /// Machines to remove: on a host that no longer matches, or a second one on a host.
    pub destroy: Vec<String>,
}

/// The per-host rule: `hosts` are the live hosts (not dead, not left), `existing` the
/// group's machines as (machine id, host id). A machine on a host that is not live is left
/// alone (its host may come back; when it leaves, its rows go with it). Of two machines on
/// one host the one with the lower id stays.
pub fn per_host_plan(
    constraints: &[Constraint],
    hosts: &[HostView<'_>],
    existing: &[(String, String)],
) -> PerHostPlan {
    let live: BTreeSet<&str> = hosts.iter().map(|h| h.host_id).collect();
    let wanted: BTreeSet<&str> = hosts
        .iter()
        .filter(|h| unmet(constraints, h.labels).is_none())
        .map(|h| h.host_id)
        .collect();
    let mut sorted: Vec<&(String, String)> = existing.iter().collect();
    sorted.sort();
    let mut kept: BTreeSet<&str> = BTreeSet::new();
    let mut plan = PerHostPlan::default();
    for (machine, host) in sorted {
        if !live.contains(host.as_str()) {
            continue;
        }
        if wanted.contains(host.as_str()) && kept.insert(host.as_str()) {
            continue;
        }
        plan.destroy.push(machine.clone());
    }
    plan.create_on = wanted
        .iter()
        .filter(|h| !kept.contains(*h))
        .map(|h| h.to_string())
        .collect();
    plan
}

#[cfg(test)]
mod tests;
