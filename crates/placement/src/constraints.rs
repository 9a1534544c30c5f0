//! Constraints, affinities and spread (Nomad's `constraint` / `affinity` / `spread`), pure:
//! which hosts a machine may go to by the operator's host labels, how much it prefers each,
//! and how its app's machines already on a host (or on a label's value) lower that host's
//! preference. Also the rule of per-host machines (Nomad's system jobs): the machines to
//! make and to remove so that one runs on every matching live host.
//!
//! The policy is a bazaar extension of the machine config (`config.placement`, documented
//! in docs/PLACEMENT.md when wired); this module holds the rules only, no I/O.

use crate::exchange::{Candidate, Exclusion, Offer};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// How a constraint compares a host label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Op {
    /// The label has exactly this value.
    #[serde(rename = "=")]
    Eq,
    /// The label is absent or has another value.
    #[serde(rename = "!=")]
    Ne,
    /// The label has one of the comma-separated values.
    #[serde(rename = "in")]
    In,
    /// The label is present (any value).
    #[serde(rename = "exists")]
    Exists,
}

/// A rule on one host label.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Constraint {
    pub label: String,
    #[serde(default = "default_op")]
    pub op: Op,
    /// Required for `=`, `!=` and `in` (comma-separated values); refused for `exists`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

fn default_op() -> Op {
    Op::Eq
}

/// A preference: hosts meeting `rule` gain `weight` (negative: avoid them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Affinity {
    pub label: String,
    #[serde(default = "default_op")]
    pub op: Op,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// -100..=100, not 0 (as Nomad's).
    pub weight: i32,
}

/// What an app's machines are spread across.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpreadBy {
    /// One machine per host as far as possible.
    Host,
    /// Evenly over the values of this host label (e.g. `zone`).
    Label(String),
}

impl SpreadBy {
    /// Parses `host` or `label:NAME`.
    pub fn parse(s: &str) -> Result<SpreadBy, String> {
        match s.trim() {
            "host" => Ok(SpreadBy::Host),
            other => match other.strip_prefix("label:") {
                Some(l) if valid_label(l) => Ok(SpreadBy::Label(l.to_string())),
                _ => Err(format!(
                    "spread.by must be \"host\" or \"label:NAME\", not {other:?}"
                )),
            },
        }
    }
}

/// Spread of an app's machines (anti-affinity).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Spread {
    /// `host` or `label:NAME`.
    pub by: String,
}

/// A machine's placement policy (`config.placement`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PlacementPolicy {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub constraints: Vec<Constraint>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub affinities: Vec<Affinity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread: Option<Spread>,
}

/// At most this many constraints and this many affinities in one policy.
pub const MAX_RULES: usize = 32;

fn valid_label(l: &str) -> bool {
    !l.is_empty()
        && l.len() <= 63
        && l.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
}

fn check_rule(
    kind: &str,
    i: usize,
    label: &str,
    op: Op,
    value: Option<&str>,
) -> Result<(), String> {
    if !valid_label(label) {
        return Err(format!(
            "placement.{kind}[{i}].label {label:?} is not a label name (1-63 of A-Z a-z 0-9 _ - . /)"
        ));
    }
    match (op, value) {
        (Op::Exists, Some(_)) => Err(format!(
            "placement.{kind}[{i}]: op \"exists\" takes no value"
        )),
        (Op::Eq | Op::Ne | Op::In, None) => Err(format!(
            "placement.{kind}[{i}]: op {:?} needs a value",
            op_str(op)
        )),
        (Op::In, Some(v)) if v.split(',').all(|s| s.trim().is_empty()) => Err(format!(
            "placement.{kind}[{i}]: op \"in\" needs comma-separated values"
        )),
        _ => Ok(()),
    }
}

fn op_str(op: Op) -> &'static str {
    match op {
        Op::Eq => "=",
        Op::Ne => "!=",
        Op::In => "in",
        Op::Exists => "exists",
    }
}

impl PlacementPolicy {
    /// Checks the policy; the error names the field and is meant for a 400.
    pub fn validate(&self) -> Result<(), String> {
        if self.constraints.len() > MAX_RULES || self.affinities.len() > MAX_RULES {
            return Err(format!(
                "placement: at most {MAX_RULES} constraints and {MAX_RULES} affinities"
            ));
        }
        for (i, c) in self.constraints.iter().enumerate() {
            check_rule("constraints", i, &c.label, c.op, c.value.as_deref())?;
        }
        for (i, a) in self.affinities.iter().enumerate() {
            check_rule("affinities", i, &a.label, a.op, a.value.as_deref())?;
            if a.weight == 0 || !(-100..=100).contains(&a.weight) {
                return Err(format!(
                    "placement.affinities[{i}].weight must be -100..=100 and not 0, not {}",
                    a.weight
                ));
            }
        }
        if let Some(s) = &self.spread {
            SpreadBy::parse(&s.by)?;
        }
        Ok(())
    }

    /// The spread asked for, if any (a validated policy parses).
    pub fn spread_by(&self) -> Option<SpreadBy> {
        self.spread
            .as_ref()
            .and_then(|s| SpreadBy::parse(&s.by).ok())
    }
}

fn holds(label: &str, op: Op, value: Option<&str>, labels: &BTreeMap<String, String>) -> bool {
    let have = labels.get(label).map(String::as_str);
    match op {
        Op::Eq => have.is_some() && have == value,
        Op::Ne => have.is_none() || have != value,
        Op::In => have.is_some_and(|h| {
            value
                .unwrap_or("")
                .split(',')
                .map(str::trim)
                .any(|v| !v.is_empty() && v == h)
        }),
        Op::Exists => have.is_some(),
    }
}

impl Constraint {
    /// Whether a host with `labels` meets it.
    pub fn holds(&self, labels: &BTreeMap<String, String>) -> bool {
        holds(&self.label, self.op, self.value.as_deref(), labels)
    }

    /// The constraint as written, for reasons: `disk = nvme`, `zone exists`.
    pub fn describe(&self) -> String {
        match &self.value {
            Some(v) => format!("{} {} {}", self.label, op_str(self.op), v),
            None => format!("{} {}", self.label, op_str(self.op)),
        }
    }
}

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
        .filter(|a| holds(&a.label, a.op, a.value.as_deref(), labels))
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
