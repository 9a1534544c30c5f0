//! Per-host machines (issue 34 item 5; Nomad's system jobs, Kubernetes' DaemonSets): a
//! machine whose config has `metadata.bazaar_per_host = "true"` runs once on every host
//! that meets its `config.placement` constraints, per app and process group
//! (`metadata.fly_process_group`, `app` when absent). The first is created as any machine
//! is; every host then makes its own copy from the group's newest config, which such a
//! machine's catalog row carries (`bazaar_api::per_host`), including hosts that join later.
//! A host that leaves takes its copy with it; a drained host destroys its copy rather than
//! moving it. This module holds the opt-in key and the rule for which configs may carry it.

use crate::config::MachineConfig;
use std::collections::BTreeMap;

/// The config metadata key that makes a machine per-host.
pub const METADATA_KEY: &str = "bazaar_per_host";
/// The metadata key naming a machine's process group (Fly's), part of a per-host group's
/// identity.
pub const PROCESS_GROUP_KEY: &str = "fly_process_group";

/// Whether this metadata makes the machine per-host.
pub fn opted_in(metadata: &BTreeMap<String, String>) -> bool {
    metadata.get(METADATA_KEY).is_some_and(|v| v == "true")
}

/// The process group of a machine with this metadata (`app` when none is named).
pub fn process_group(metadata: &BTreeMap<String, String>) -> &str {
    metadata
        .get(PROCESS_GROUP_KEY)
        .map(String::as_str)
        .unwrap_or("app")
}

/// Refuses a per-host opt-in that is not `true`/`false`, that mounts a volume (a volume
/// lives on one host: each host's copy would need its own), or that also asks to be
/// re-placed on another host when its host dies (a per-host machine belongs to its host).
pub fn validate(config: &MachineConfig) -> Result<(), String> {
    match config.metadata.get(METADATA_KEY).map(String::as_str) {
        None | Some("false") => Ok(()),
        Some("true") if !config.mounts.is_empty() => Err(format!(
            "metadata.{METADATA_KEY}: a per-host machine cannot mount a volume (a volume lives on one host); remove the key or the mount"
        )),
        Some("true") if crate::replacement::opted_in(&config.metadata) => Err(format!(
            "metadata.{METADATA_KEY}: a per-host machine belongs to its host and is never re-placed on another; remove metadata.{}",
            crate::replacement::METADATA_KEY
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

    fn config(metadata: &[(&str, &str)], mounted: bool) -> MachineConfig {
        let mut c: MachineConfig = serde_json::from_value(serde_json::json!({
            "image": "process",
            "mounts": if mounted { serde_json::json!([{"volume": "vol_1", "path": "/data"}]) } else { serde_json::json!([]) },
        }))
        .unwrap();
        for (k, v) in metadata {
            c.metadata.insert(k.to_string(), v.to_string());
        }
        c
    }

    #[test]
    fn only_true_opts_in_never_with_a_volume_or_re_placement() {
        assert!(validate(&config(&[], true)).is_ok());
        assert!(validate(&config(&[(METADATA_KEY, "false")], true)).is_ok());
        assert!(validate(&config(&[(METADATA_KEY, "true")], false)).is_ok());
        assert!(validate(&config(&[(METADATA_KEY, "true")], true))
            .unwrap_err()
            .contains("volume"));
        let both = config(
            &[
                (METADATA_KEY, "true"),
                (crate::replacement::METADATA_KEY, "true"),
            ],
            false,
        );
        assert!(validate(&both).unwrap_err().contains("re-placed"));
        assert!(validate(&config(&[(METADATA_KEY, "yes")], false))
            .unwrap_err()
            .contains("\"true\" or \"false\""));
        assert!(opted_in(&config(&[(METADATA_KEY, "true")], false).metadata));
        assert!(!opted_in(
            &config(&[(METADATA_KEY, "false")], false).metadata
        ));
    }

    #[test]
    fn the_process_group_defaults_to_app() {
        assert_eq!(process_group(&config(&[], false).metadata), "app");
        let worker = config(&[(PROCESS_GROUP_KEY, "worker")], false);
        assert_eq!(process_group(&worker.metadata), "worker");
    }
}
