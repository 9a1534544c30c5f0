//! Quotas, pure: limits per org and per app on machines, CPUs, memory and volume GB, what
//! an org's or an app's machines and volumes use (counted by the caller from its own
//! catalog), and the check of a create against them. Every API node checks from its own
//! catalog, without a central store, so a partition can overshoot: by how much is in
//! docs/POLICY.md.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::fmt;

/// The limits of one org or app. `None`: no limit on that resource.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Machines that are not destroyed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machines: Option<u64>,
    /// CPUs of those machines (`guest.cpus`, shared or performance alike).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u64>,
    /// Memory of those machines, in MB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    /// Size of the volumes that are not destroyed, in GB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_gb: Option<u64>,
}

/// What an org or app uses, or what a create adds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Usage {
    pub machines: u64,
    pub cpus: u64,
    pub memory_mb: u64,
    pub volume_gb: u64,
}

impl Usage {
    /// What one machine of this size uses.
    pub fn machine(cpus: u32, memory_mb: u64) -> Usage {
        Usage {
            machines: 1,
            cpus: u64::from(cpus),
            memory_mb,
            volume_gb: 0,
        }
    }

    /// What one volume of this size uses.
    pub fn volume(size_gb: u64) -> Usage {
        Usage {
            volume_gb: size_gb,
            ..Usage::default()
        }
    }

    /// The sum of two usages.
    pub fn plus(self, other: Usage) -> Usage {
        Usage {
            machines: self.machines + other.machines,
            cpus: self.cpus + other.cpus,
            memory_mb: self.memory_mb + other.memory_mb,
            volume_gb: self.volume_gb + other.volume_gb,
        }
    }
}

/// Whose quota: an org's or an app's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase", tag = "kind", content = "name")]
pub enum Scope {
    Org(String),
    App(String),
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::Org(o) => write!(f, "org {o}"),
            Scope::App(a) => write!(f, "app {a}"),
        }
    }
}

/// An org's or app's quota as the API answers it: the limits and what is in use, as the
/// answering node's catalog counts it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct QuotaStatus {
    pub scope: Scope,
    pub limits: Limits,
    pub usage: Usage,
}

/// A create the quota refuses: which quota, its limit, what is used and what the create adds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Exceeded {
    pub scope: Scope,
    /// `machines`, `cpus`, `memory_mb` or `volume_gb`.
    pub resource: String,
    pub limit: u64,
    pub used: u64,
    pub requested: u64,
}

impl fmt::Display for Exceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "quota exceeded: {} allows {} {}, {} in use, this request adds {}",
            self.scope, self.limit, self.resource, self.used, self.requested
        )
    }
}

/// Refuses `add` when `used + add` would pass a limit (the first one passed, in the order
/// machines, cpus, memory_mb, volume_gb). A request that adds nothing of a resource is never
/// refused for it, even when the quota was already passed (lowered below use, or overshot
/// in a partition): stopping, deleting and shrinking stay possible.
pub fn check(scope: &Scope, limits: &Limits, used: Usage, add: Usage) -> Result<(), Exceeded> {
    let rows = [
        ("machines", limits.machines, used.machines, add.machines),
        ("cpus", limits.cpus, used.cpus, add.cpus),
        ("memory_mb", limits.memory_mb, used.memory_mb, add.memory_mb),
        ("volume_gb", limits.volume_gb, used.volume_gb, add.volume_gb),
    ];
    for (resource, limit, used, requested) in rows {
        if let Some(limit) = limit {
            if requested > 0 && used.saturating_add(requested) > limit {
                return Err(Exceeded {
                    scope: scope.clone(),
                    resource: resource.into(),
                    limit,
                    used,
                    requested,
                });
            }
        }
    }
    Ok(())
}

/// The most a quota's use can pass its limit, in units of the resource, when `nodes` API
/// nodes, split into `sides` sides of a partition (each side at least one node), each accept
/// up to `per_node_in_flight` concurrent creates of one unit checked before the others' rows
/// reach them. Each side sees only its own side's new rows, so each may fill the whole
/// quota, and its nodes' racing creates may each take the last unit: in all
/// `sides × limit + nodes × per_node_in_flight − sides`, that is an overshoot of
/// `(sides − 1) × limit + nodes × per_node_in_flight − sides`. Connected (`sides` = 1) with
/// one create at a time per node: `nodes − 1`.
pub fn overshoot_bound(limit: u64, sides: u64, nodes: u64, per_node_in_flight: u64) -> u64 {
    let sides = sides.clamp(1, nodes.max(1));
    (sides - 1)
        .saturating_mul(limit)
        .saturating_add(nodes.saturating_mul(per_node_in_flight))
        .saturating_sub(sides)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_create_past_a_limit_is_refused_naming_the_quota_and_the_numbers() {
        let scope = Scope::App("shop".into());
        let limits = Limits {
            machines: Some(2),
            memory_mb: Some(1024),
            ..Limits::default()
        };
        let used = Usage::machine(1, 256);
        assert_eq!(check(&scope, &limits, used, Usage::machine(1, 256)), Ok(()));
        let err = check(&scope, &limits, used.plus(used), Usage::machine(1, 256)).unwrap_err();
        assert_eq!(err.resource, "machines");
        assert_eq!(
            err.to_string(),
            "quota exceeded: app shop allows 2 machines, 2 in use, this request adds 1"
        );
        let err = check(&scope, &limits, used, Usage::machine(1, 1024)).unwrap_err();
        assert_eq!(
            (err.resource.as_str(), err.limit, err.used),
            ("memory_mb", 1024, 256)
        );
        // No limit: anything goes; adding nothing of a passed resource is never refused.
        assert_eq!(
            check(
                &scope,
                &Limits::default(),
                used,
                Usage::machine(64, 1 << 20)
            ),
            Ok(())
        );
        let over = Usage::machine(1, 4096);
        assert_eq!(check(&scope, &limits, over, Usage::volume(10)), Ok(()));
        let vol = Limits {
            volume_gb: Some(10),
            ..Limits::default()
        };
        let err = check(
            &Scope::Org("acme".into()),
            &vol,
            Usage::volume(8),
            Usage::volume(3),
        )
        .unwrap_err();
        assert!(err
            .to_string()
            .starts_with("quota exceeded: org acme allows 10 volume_gb"));
    }

    #[test]
    fn limits_refuse_unknown_keys() {
        let l: Limits = serde_json::from_value(serde_json::json!({"machines": 3})).unwrap();
        assert_eq!(l.machines, Some(3));
        assert!(serde_json::from_value::<Limits>(serde_json::json!({"machine": 3})).is_err());
    }

    #[test]
    fn the_overshoot_bound() {
        // Connected, one create at a time per node: three nodes may each take the last slot.
        assert_eq!(overshoot_bound(10, 1, 3, 1), 2);
        // Two sides of a partition, each filling the quota, plus their own races: 20 + 3 - 2
        // in all for a limit of 10.
        assert_eq!(overshoot_bound(10, 2, 3, 1), 11);
        assert_eq!(overshoot_bound(10, 1, 1, 1), 0);
    }
}
