//! Re-placement on host death (the guardian), as a machine's config says it: the opt-in
//! metadata key and the rule for which configs may carry it. A machine whose config has
//! `metadata.bazaar_replace_on_host_failure = "true"` (set by `bazaar deploy` from fly.toml
//! `[deploy] replace_on_host_failure = true`, or by any API client) is re-placed on another
//! host of its region when its host has been dead for the agents' `--replace-after`. A
//! machine with a volume holds state and is never re-placed, so it cannot opt in.

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
