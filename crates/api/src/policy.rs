//! A machine's placement policy (`config.placement`: constraints, affinities, spread) in
//! the exchange, over the pure rules of `bazaar_placement::constraints`: the app's machines
//! per spread key from the local catalog, the refusal at once (422) when no live host of
//! the regions meets the constraints, and each round's filter with the hosts' verdicts
//! that `machine explain` and dry runs show (docs/POLICY.md).

use crate::error::ApiError;
use crate::Api;
use bazaar_placement::constraints::{self, HostVerdict, HostView, PlacementPolicy, SpreadBy};
use bazaar_placement::exchange::{Candidate, Exclusion};
use std::collections::BTreeMap;

/// The app's live machines per spread key (empty without a spread or an app): the hosts of
/// its machines as this node's catalog has them.
pub(crate) fn spread_counts(
    api: &Api,
    app: &str,
    policy: &PlacementPolicy,
    cands: &[Candidate],
) -> Result<BTreeMap<String, usize>, ApiError> {
    let Some(by) = policy.spread_by() else {
        return Ok(BTreeMap::new());
    };
    if app.is_empty() {
        return Ok(BTreeMap::new());
    }
    let machines = api
        .catalog()?
        .machines(&bazaar_catalog::MachineFilter::app(app));
    let hosts: Vec<&str> = machines
        .iter()
        .filter(|m| m.record.state != "destroyed")
        .map(|m| m.record.host_id.as_str())
        .collect();
    Ok(constraints::spread_counts(&by, hosts, |h| {
        cands.iter().find(|c| c.host_id == h).map(|c| &c.labels)
    }))
}

/// Refuses (422) a policy that no live host of the regions meets, naming each constraint
/// with how many hosts fail it; a capacity refusal would wrongly suggest waiting.
pub(crate) fn check_possible(
    policy: &PlacementPolicy,
    cands: &[Candidate],
    groups: &[Vec<String>],
) -> Result<(), ApiError> {
    if policy.constraints.is_empty() {
        return Ok(());
    }
    let hosts: Vec<HostView<'_>> = cands
        .iter()
        .filter(|c| c.alive && groups.iter().flatten().any(|r| *r == c.region))
        .map(view)
        .collect();
    if hosts
        .iter()
        .any(|h| constraints::unmet(&policy.constraints, h.labels).is_none())
    {
        return Ok(());
    }
    Err(ApiError::Unprocessable(format!(
        "{} in region(s) {}",
        constraints::refusal(&policy.constraints, &hosts),
        groups
            .iter()
            .flatten()
            .cloned()
            .collect::<Vec<_>>()
            .join(", ")
    )))
}

/// A candidate as the constraint rules see it.
pub(crate) fn view(c: &Candidate) -> HostView<'_> {
    HostView {
        host_id: &c.host_id,
        labels: &c.labels,
    }
}

/// One round's candidates under the policy: those meeting the constraints, the hosts that
/// fail one (with the constraint named), and the verdict of every host of the group.
pub(crate) fn filter<'a>(
    policy: &PlacementPolicy,
    ok: Vec<&'a Candidate>,
    counts: &BTreeMap<String, usize>,
    group: &[String],
    cands: &[Candidate],
) -> (Vec<&'a Candidate>, Vec<Exclusion>, Vec<HostVerdict>) {
    if policy.is_empty() {
        return (ok, Vec::new(), Vec::new());
    }
    let in_group: Vec<HostView<'_>> = cands
        .iter()
        .filter(|c| group.contains(&c.region))
        .map(view)
        .collect();
    let verdicts = constraints::verdicts(policy, &in_group, counts);
    let (kept, excluded) = constraints::apply(policy, &ok, counts);
    (
        kept.into_iter().map(|(c, _)| c).collect(),
        excluded,
        verdicts,
    )
}

/// Adds a placed machine's host to the spread counts (a later round of the placement sees
/// it).
pub(crate) fn count_placed(
    policy: &PlacementPolicy,
    counts: &mut BTreeMap<String, usize>,
    host: &str,
    cands: &[Candidate],
) {
    let Some(by) = policy.spread_by() else {
        return;
    };
    let Some(c) = cands.iter().find(|c| c.host_id == host) else {
        return;
    };
    let key = match &by {
        SpreadBy::Host => Some(host),
        SpreadBy::Label(l) => c.labels.get(l).map(String::as_str),
    };
    if let Some(k) = key {
        *counts.entry(k.to_string()).or_insert(0) += 1;
    }
}
