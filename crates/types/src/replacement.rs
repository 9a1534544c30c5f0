//! Re-placement on host death (the guardian), as a machine's config says it: the opt-in
//! metadata key and the rule for which configs may carry it. A machine whose config has
//! `metadata.bazaar_replace_on_host_failure = "true"` (set by `bazaar deploy` from fly.toml
//! `[deploy] replace_on_host_failure = true`, or by any API client) is re-placed on another
//! host of its region when its host has been dead for the agents' `--replace-after`. A
//! machine with a volume holds state and is never re-placed, so it cannot opt in.
//!
//! A machine *displaced* from its host (stopped there by preemption or reclamation, issue 34)
//! is re-placed on another host when [`re_placed_when_displaced`] says its config allows.

use crate::config::MachineConfig;
use std::collections::BTreeMap;

/// The config metadata key that opts a machine in.
pub const METADATA_KEY: &str = "bazaar_replace_on_host_failure";

/// Whether this metadata opts the machine in.
pub fn opted_in(metadata: &BTreeMap<String, String>) -> bool {
    metadata.get(METADATA_KEY).is_some_and(|v| v == "true")
}

/// Whether a machine with this metadata publishes its config in its catalog row: one that
/// may be re-placed from it, and a per-host machine (`crate::per_host`), whose copies
/// other hosts make from it.
pub fn carries_config(metadata: &BTreeMap<String, String>) -> bool {
    opted_in(metadata) || crate::per_host::opted_in(metadata)
}

/// Whether a machine displaced from its host (preempted, or stopped when a service took its
/// reclaimed room back) is re-placed on another host: when its restart policy would have
/// run it again (`always` or `on-failure`: it did not stop on its own; `no` leaves it
/// stopped), it holds no volume (state that lives on its host) and it is not a per-host
/// machine (one copy per host, never moved).
pub fn re_placed_when_displaced(config: &MachineConfig) -> bool {
    config.restart_policy().policy != crate::config::RestartPolicyKind::No
        && config.mounts.is_empty()
        && !crate::per_host::opted_in(&config.metadata)
}

/// Refuses a config whose opt-in is not `true`/`false`, or that opts in with a volume; the
/// per-host opt-in's rules too ([`crate::per_host::validate`]), checked with it since the
/// two exclude each other.
pub fn validate(config: &MachineConfig) -> Result<(), String> {
    crate::per_host::validate(config)?;
    match config.metadata.get(METADATA_KEY).map(String::as_str) {
        None | Some("false") => Ok(()),
        Some("true") if !config.mounts.is_empty() => Err(format!(
            "metadata.{METADATA_KEY}: a machine with a volume holds state and is never re-placed on another host; remove the key or the mount"
        )),
        Some("true") => Ok(()),
        Some(other) => Err(format!(
            "metadata.{METADATA_KEY} must be \"true\" or \"false\", got {other:?}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(value: Option<&str>, mounted: bool) -> MachineConfig {
        let mut c: MachineConfig = serde_json::from_value(serde_json::json!({
            "image": "process",
            "mounts": if mounted { serde_json::json!([{"volume": "vol_1", "path": "/data"}]) } else { serde_json::json!([]) },
        }))
        .unwrap();
        if let Some(v) = value {
            c.metadata.insert(METADATA_KEY.into(), v.into());
        }
        c
    }

    #[test]
    fn a_displaced_machine_moves_unless_its_policy_is_no_or_it_holds_state() {
        let mut c = config(None, false);
        assert!(re_placed_when_displaced(&c), "on-failure by default");
        for (policy, moves) in [("always", true), ("on-failure", true), ("no", false)] {
            c.restart =
                Some(serde_json::from_value(serde_json::json!({"policy": policy})).unwrap());
            assert_eq!(re_placed_when_displaced(&c), moves, "{policy}");
        }
        assert!(
            !re_placed_when_displaced(&config(None, true)),
            "a volume stays"
        );
        let mut per_host = config(None, false);
        per_host
            .metadata
            .insert(crate::per_host::METADATA_KEY.into(), "true".into());
        assert!(
            !re_placed_when_displaced(&per_host),
            "a per-host copy stays"
        );
    }

    #[test]
    fn only_true_opts_in_and_never_with_a_volume() {
        assert!(validate(&config(None, true)).is_ok());
        assert!(validate(&config(Some("false"), true)).is_ok());
        assert!(validate(&config(Some("true"), false)).is_ok());
        assert!(validate(&config(Some("true"), true))
            .unwrap_err()
            .contains("volume"));
        assert!(validate(&config(Some("yes"), false))
            .unwrap_err()
            .contains("\"true\" or \"false\""));
        assert!(opted_in(&config(Some("true"), false).metadata));
        assert!(!opted_in(&config(Some("false"), false).metadata));
        assert!(!opted_in(&config(None, false).metadata));
    }
}
