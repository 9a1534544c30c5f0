//! The plan of a deploy or a scale: desired machines per process group and region against
//! the machines that exist, giving what to create, update, keep and destroy. Pure: no I/O,
//! so every rule here is unit-tested.

use bazaar_types::config::MachineConfig;
use serde::Serialize;
use std::collections::BTreeMap;

/// A machine of the app as it is now.
#[derive(Debug, Clone, PartialEq)]
pub struct Existing {
    pub id: String,
    pub group: String,
    pub region: String,
    pub state: String,
    pub config: MachineConfig,
}

/// What one process group should look like.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupTarget {
    pub config: MachineConfig,
    /// Machines wanted per region.
    pub regions: BTreeMap<String, usize>,
}

/// What to do in one process group and region.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Step {
    pub group: String,
    pub region: String,
    /// How many new machines.
    pub create: usize,
    /// Machines whose config changes (ids).
    pub update: Vec<String>,
    /// Machines already at the desired config (ids).
    pub keep: Vec<String>,
    /// Machines to drain and destroy (ids).
    pub destroy: Vec<String>,
    /// The volume each machine of the group mounts (`[mounts]`: `NAME at PATH`); a new
    /// machine gets a free one of that name, else a new one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
}

/// A whole plan, ordered by group then region.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Plan {
    pub steps: Vec<Step>,
}

impl Plan {
    /// Whether the plan changes nothing (keeping machines is no change).
    pub fn is_empty(&self) -> bool {
        self.steps
            .iter()
            .all(|s| s.create == 0 && s.update.is_empty() && s.destroy.is_empty())
    }

    /// Totals: (create, update, keep, destroy).
    pub fn totals(&self) -> (usize, usize, usize, usize) {
        self.steps.iter().fold((0, 0, 0, 0), |t, s| {
            (
                t.0 + s.create,
                t.1 + s.update.len(),
                t.2 + s.keep.len(),
                t.3 + s.destroy.len(),
            )
        })
    }

    /// One line per group and region, for people.
    pub fn lines(&self) -> Vec<String> {
        self.steps
            .iter()
            .map(|s| {
                let volume = match &s.volume {
                    Some(v) => format!(" (each with volume {v})"),
                    None => String::new(),
                };
                format!(
                    "{:<10} {:<8} create {}, update {}, keep {}, destroy {}{volume}",
                    s.group,
                    s.region,
                    s.create,
                    s.update.len(),
                    s.keep.len(),
                    s.destroy.len()
                )
            })
            .collect()
    }
}

/// Metadata keys that change with every release and do not make a config different.
const RELEASE_KEYS: &[&str] = &[crate::META_RELEASE, "fly_release_id", "fly_flyctl_version"];

/// Whether two configs are the same apart from release labels.
pub fn same_config(a: &MachineConfig, b: &MachineConfig) -> bool {
    let strip = |c: &MachineConfig| {
        let mut c = c.clone();
        for k in RELEASE_KEYS {
            c.metadata.remove(*k);
        }
        serde_json::to_value(&c).unwrap_or_default()
    };
    strip(a) == strip(b)
}

/// Spreads `total` machines over `regions`, starting from the `existing` counts so that as
/// few machines as possible move: regions outside the list get none, missing machines go
/// to the emptiest region, surplus ones leave the fullest (ties: list order).
pub fn distribute(
    total: usize,
    regions: &[String],
    existing: &BTreeMap<String, usize>,
) -> BTreeMap<String, usize> {
    let mut out: BTreeMap<String, usize> = regions
        .iter()
        .map(|r| (r.clone(), existing.get(r).copied().unwrap_or(0)))
        .collect();
    if regions.is_empty() {
        return out;
    }
    let mut sum: usize = out.values().sum();
    while sum < total {
        let r = regions
            .iter()
            .min_by_key(|r| out[*r])
            .expect("regions is not empty");
        *out.get_mut(r).expect("present") += 1;
        sum += 1;
    }
    while sum > total {
        let r = regions
            .iter()
            .rev()
            .max_by_key(|r| out[*r])
            .expect("regions is not empty");
        *out.get_mut(r).expect("present") -= 1;
        sum -= 1;
    }
    out
}

/// Machines per region of a group now.
pub fn counts(existing: &[Existing], group: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for m in existing.iter().filter(|m| m.group == group) {
        *out.entry(m.region.clone()).or_insert(0) += 1;
    }
    out
}

/// Which machines of a region to give up first: not running ones, then the newest ids last
/// kept (stable order).
fn destroy_order(ms: &mut [&Existing]) {
    ms.sort_by(|a, b| {
        let running = |m: &Existing| m.state == "started";
        running(a).cmp(&running(b)).then_with(|| b.id.cmp(&a.id))
    });
}

/// The plan that turns `existing` into `targets`. Groups with machines but no target are
/// destroyed whole (a process group removed from the config).
pub fn plan(targets: &BTreeMap<String, GroupTarget>, existing: &[Existing]) -> Plan {
    let mut steps = Vec::new();
    let mut groups: Vec<&String> = targets.keys().collect();
    for m in existing {
        if !groups.contains(&&m.group) {
            groups.push(&m.group);
        }
    }
    groups.sort();
    groups.dedup();
    for group in groups {
        let mut regions: Vec<String> = existing
            .iter()
            .filter(|m| &m.group == group)
            .map(|m| m.region.clone())
            .collect();
        if let Some(t) = targets.get(group) {
            regions.extend(t.regions.keys().cloned());
        }
        regions.sort();
        regions.dedup();
        for region in regions {
            let mut here: Vec<&Existing> = existing
                .iter()
                .filter(|m| &m.group == group && m.region == region)
                .collect();
            let mut step = Step {
                group: group.clone(),
                region: region.clone(),
                ..Default::default()
            };
            let Some(t) = targets.get(group) else {
                step.destroy = here.iter().map(|m| m.id.clone()).collect();
                steps.push(step);
                continue;
            };
            step.volume =
                crate::volumes::wanted(&t.config).map(|w| format!("{} at {}", w.name, w.path));
            let want = t.regions.get(&region).copied().unwrap_or(0);
            if here.len() > want {
                destroy_order(&mut here);
                let extra = here.len() - want;
                step.destroy = here.drain(..extra).map(|m| m.id.clone()).collect();
            }
            step.create = want.saturating_sub(here.len());
            here.sort_by(|a, b| a.id.cmp(&b.id));
            for m in here {
                if same_config(&m.config, &crate::volumes::desired(&t.config, m)) {
                    step.keep.push(m.id.clone());
                } else {
                    step.update.push(m.id.clone());
                }
            }
            step.destroy.sort();
            steps.push(step);
        }
    }
    Plan { steps }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(v: &str) -> MachineConfig {
        let mut c = MachineConfig {
            image: "process".into(),
            ..Default::default()
        };
        c.env.insert("V".into(), v.into());
        c
    }

    fn m(id: &str, group: &str, region: &str, v: &str) -> Existing {
        Existing {
            id: id.into(),
            group: group.into(),
            region: region.into(),
            state: "started".into(),
            config: cfg(v),
        }
    }

    fn regions(list: &[(&str, usize)]) -> BTreeMap<String, usize> {
        list.iter().map(|(r, n)| (r.to_string(), *n)).collect()
    }

    fn target(v: &str, list: &[(&str, usize)]) -> GroupTarget {
        GroupTarget {
            config: cfg(v),
            regions: regions(list),
        }
    }

    #[test]
    fn a_first_deploy_creates_per_region() {
        let t = BTreeMap::from([("app".to_string(), target("1", &[("ams", 2), ("ord", 1)]))]);
        let p = plan(&t, &[]);
        assert_eq!(p.steps.len(), 2);
        assert_eq!((p.steps[0].region.as_str(), p.steps[0].create), ("ams", 2));
        assert_eq!((p.steps[1].region.as_str(), p.steps[1].create), ("ord", 1));
        assert_eq!(p.totals(), (3, 0, 0, 0));
        assert!(!p.is_empty());
    }

    #[test]
    fn a_new_config_updates_and_an_equal_one_keeps() {
        let existing = vec![m("a", "app", "ams", "1"), m("b", "app", "ams", "1")];
        let t = BTreeMap::from([("app".to_string(), target("2", &[("ams", 2)]))]);
        let p = plan(&t, &existing);
        assert_eq!(p.steps[0].update, vec!["a", "b"]);
        assert_eq!(p.totals(), (0, 2, 0, 0));

        let mut same = existing.clone();
        same[0]
            .config
            .metadata
            .insert(crate::META_RELEASE.into(), "7".into());
        let t = BTreeMap::from([("app".to_string(), target("1", &[("ams", 2)]))]);
        let p = plan(&t, &same);
        assert_eq!(p.totals(), (0, 0, 2, 0));
        assert!(p.is_empty());
    }

    #[test]
    fn scaling_down_destroys_stopped_machines_first() {
        let mut existing = vec![
            m("a", "app", "ams", "1"),
            m("b", "app", "ams", "1"),
            m("c", "app", "ams", "1"),
        ];
        existing[1].state = "stopped".into();
        let t = BTreeMap::from([("app".to_string(), target("1", &[("ams", 1)]))]);
        let p = plan(&t, &existing);
        assert_eq!(p.steps[0].destroy, vec!["b", "c"]);
        assert_eq!(p.steps[0].keep, vec!["a"]);
        let t = BTreeMap::from([("app".to_string(), target("1", &[("ams", 0)]))]);
        assert_eq!(plan(&t, &existing).totals(), (0, 0, 0, 3));
    }

    #[test]
    fn removed_groups_are_destroyed_and_other_groups_untouched() {
        let existing = vec![m("a", "web", "ams", "1"), m("w", "worker", "ord", "1")];
        let t = BTreeMap::from([("web".to_string(), target("1", &[("ams", 1)]))]);
        let p = plan(&t, &existing);
        assert_eq!(p.steps.len(), 2);
        assert_eq!(p.steps[1].group, "worker");
        assert_eq!(p.steps[1].destroy, vec!["w"]);
        assert_eq!(p.steps[0].keep, vec!["a"]);
    }

    #[test]
    fn a_region_left_out_is_emptied() {
        let existing = vec![m("a", "app", "ams", "1"), m("b", "app", "ord", "1")];
        let t = BTreeMap::from([("app".to_string(), target("1", &[("ams", 2)]))]);
        let p = plan(&t, &existing);
        assert_eq!(p.steps[0].region, "ams");
        assert_eq!(p.steps[0].create, 1);
        assert_eq!(p.steps[1].region, "ord");
        assert_eq!(p.steps[1].destroy, vec!["b"]);
    }

    #[test]
    fn distribute_moves_as_little_as_possible() {
        let r = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            distribute(3, &r(&["ams", "ord"]), &BTreeMap::new()),
            regions(&[("ams", 2), ("ord", 1)])
        );
        let now = regions(&[("ams", 1), ("ord", 3)]);
        assert_eq!(
            distribute(6, &r(&["ams", "ord"]), &now),
            regions(&[("ams", 3), ("ord", 3)])
        );
        assert_eq!(
            distribute(2, &r(&["ams", "ord"]), &now),
            regions(&[("ams", 1), ("ord", 1)])
        );
        assert_eq!(
            distribute(0, &r(&["ams", "ord"]), &now),
            regions(&[("ams", 0), ("ord", 0)])
        );
        assert_eq!(distribute(2, &r(&["fra"]), &now), regions(&[("fra", 2)]));
    }
}
