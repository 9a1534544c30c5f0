//! Volumes in a deploy. A group's config names its mount by volume name and path
//! (`[mounts]`: `{"name", "path", "size_gb"}`, no volume id); every machine mounts a volume
//! of its own:
//!
//! - a machine that exists keeps the volume it has (a machine's mount cannot change by an
//!   update): [`for_machine`] gives its config, and [`check`] refuses a deploy that would
//!   need to add, remove or move a machine's volume, before anything changes;
//! - a new machine gets a free volume of that name in its region (not attached, not taken
//!   by this deploy), else a new one of `size_gb` (`execute` does this, one machine at a
//!   time), and is placed on the volume's host.
//!
//! A deploy never deletes a volume: one made for a machine that a rollback destroyed stays,
//! free, and the next deploy mounts it.

use crate::plan::{Existing, GroupTarget};
use bazaar_types::config::MachineConfig;
use std::collections::BTreeMap;

/// The volume a config's machines mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// The volume name (`source`).
    pub name: String,
    /// Where the machine sees it (`destination`).
    pub path: String,
    /// The size of a volume made for it.
    pub size_gb: u64,
}

fn field<'a>(v: &'a serde_json::Value, k: &str) -> Option<&'a str> {
    v.get(k).and_then(|x| x.as_str())
}

/// The mount `config` asks for, if any.
pub fn wanted(config: &MachineConfig) -> Option<Wanted> {
    let m = config.mounts.first()?;
    Some(Wanted {
        name: field(m, "name").unwrap_or_default().to_string(),
        path: field(m, "path").unwrap_or_default().to_string(),
        size_gb: m
            .get("size_gb")
            .and_then(|s| s.as_u64())
            .unwrap_or(crate::config::mounts::DEFAULT_INITIAL_SIZE_GB),
    })
}

/// The mount of a new machine on volume `id`.
pub fn mount_on(config: &MachineConfig, id: &str) -> MachineConfig {
    let mut c = config.clone();
    if let Some(m) = c.mounts.first_mut().and_then(|m| m.as_object_mut()) {
        m.insert("volume".into(), id.into());
    }
    c
}

/// The config machine `m` should get from its group's `target`: the target with the
/// machine's own mount. An error when the two disagree on whether there is a volume, its
/// name or its path.
pub fn for_machine(target: &MachineConfig, m: &Existing) -> Result<MachineConfig, String> {
    let have = m.config.mounts.first();
    let want = wanted(target);
    match (have, &want) {
        (None, None) => Ok(target.clone()),
        (Some(h), Some(w))
            if field(h, "path") == Some(w.path.as_str())
                && field(h, "name").is_none_or(|n| n == w.name) =>
        {
            let mut c = target.clone();
            c.mounts = m.config.mounts.clone();
            Ok(c)
        }
        (None, Some(w)) => Err(format!(
            "machine {} (process group {:?}) has no volume and the config mounts volume {:?} at {}: a machine's mounts cannot change; destroy it (`bazaar scale count 0 --process-group {}`) and deploy again to create machines with volumes",
            m.id, m.group, w.name, w.path, m.group
        )),
        (Some(h), want) => {
            let vol = field(h, "volume").unwrap_or("?");
            let at = field(h, "path").unwrap_or("?");
            let now = match want {
                Some(w) => format!("mounts volume {:?} at {}", w.name, w.path),
                None => "has no [mounts] for it".to_string(),
            };
            Err(format!(
                "machine {} (process group {:?}) mounts volume {vol} at {at} and the config {now}: a machine's volume cannot change by a deploy (its data would be left behind); keep the [mounts] entry as it is, or destroy the machine first",
                m.id, m.group
            ))
        }
    }
}

/// [`for_machine`], or the target itself where they disagree (which [`check`] refused
/// before any plan ran).
pub fn desired(target: &MachineConfig, m: &Existing) -> MachineConfig {
    for_machine(target, m).unwrap_or_else(|_| target.clone())
}

/// Refuses a plan that would change any existing machine's volume: every problem, one per
/// line.
pub fn check(targets: &BTreeMap<String, GroupTarget>, existing: &[Existing]) -> Result<(), String> {
    let errors: Vec<String> = existing
        .iter()
        .filter_map(|m| {
            let t = targets.get(&m.group)?;
            for_machine(&t.config, m).err()
        })
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("\n"))
    }
}

/// Whether any target mounts a volume.
pub fn any(targets: &BTreeMap<String, GroupTarget>) -> bool {
    targets.values().any(|t| !t.config.mounts.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cfg(mount: Option<serde_json::Value>) -> MachineConfig {
        MachineConfig {
            image: "i".into(),
            mounts: mount.into_iter().collect(),
            ..Default::default()
        }
    }

    fn machine(mount: Option<serde_json::Value>) -> Existing {
        Existing {
            id: "m1".into(),
            group: "app".into(),
            region: "ams".into(),
            state: "started".into(),
            config: cfg(mount),
        }
    }

    #[test]
    fn a_machine_keeps_its_own_volume() {
        let target = cfg(Some(json!({"name": "data", "path": "/data", "size_gb": 3})));
        let w = wanted(&target).unwrap();
        assert_eq!(
            (w.name.as_str(), w.path.as_str(), w.size_gb),
            ("data", "/data", 3)
        );
        let m = machine(Some(
            json!({"volume": "vol_a", "name": "data", "path": "/data", "size_gb": 1}),
        ));
        let c = for_machine(&target, &m).unwrap();
        assert_eq!(c.mounts, m.config.mounts);
        // A mount made through the API, without a name, matches by path.
        let m = machine(Some(json!({"volume": "vol_a", "path": "/data"})));
        assert_eq!(for_machine(&target, &m).unwrap().mounts, m.config.mounts);
        // A new machine's mount names its volume.
        let c = mount_on(&target, "vol_b");
        assert_eq!(c.mounts[0]["volume"], "vol_b");
        assert_eq!(c.mounts[0]["path"], "/data");
    }

    #[test]
    fn adding_removing_or_moving_a_volume_is_refused() {
        let target = cfg(Some(json!({"name": "data", "path": "/data", "size_gb": 1})));
        let e = for_machine(&target, &machine(None)).unwrap_err();
        assert!(e.contains("m1") && e.contains("no volume"), "{e}");
        let moved = machine(Some(
            json!({"volume": "vol_a", "name": "data", "path": "/srv"}),
        ));
        let e = for_machine(&target, &moved).unwrap_err();
        assert!(e.contains("vol_a") && e.contains("/srv"), "{e}");
        let renamed = machine(Some(
            json!({"volume": "vol_a", "name": "old", "path": "/data"}),
        ));
        assert!(for_machine(&target, &renamed).is_err());
        let e = for_machine(&cfg(None), &renamed).unwrap_err();
        assert!(e.contains("has no [mounts]"), "{e}");
        assert!(for_machine(&cfg(None), &machine(None)).is_ok());

        let targets = BTreeMap::from([(
            "app".to_string(),
            GroupTarget {
                config: target,
                regions: BTreeMap::new(),
            },
        )]);
        let e = check(&targets, &[machine(None), moved]).unwrap_err();
        assert_eq!(e.lines().count(), 2, "{e}");
    }
}
