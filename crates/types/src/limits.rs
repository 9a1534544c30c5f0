//! How large a machine's config may be. Metadata is copied into the machine's catalog row
//! on every node, and every config version is kept by the owner, so each part has a cap
//! (docs/API.md lists them); a config past one is refused with a 400 that names it.

use crate::config::MachineConfig;
use std::collections::BTreeMap;

/// Longest metadata key, in bytes.
pub const METADATA_KEY_BYTES: usize = 128;
/// Longest metadata value, in bytes.
pub const METADATA_VALUE_BYTES: usize = 4 * 1024;
/// All metadata keys and values of a machine together, in bytes.
pub const METADATA_TOTAL_BYTES: usize = 16 * 1024;
/// Longest environment variable name, in bytes.
pub const ENV_NAME_BYTES: usize = 256;
/// Longest environment variable value, in bytes.
pub const ENV_VALUE_BYTES: usize = 32 * 1024;
/// All of `config.env` together (names and values), in bytes.
pub const ENV_TOTAL_BYTES: usize = 64 * 1024;
/// Most entries in `config.files`.
pub const FILES_COUNT: usize = 64;
/// Longest `guest_path` of a file, in bytes.
pub const FILE_PATH_BYTES: usize = 4096;
/// All `raw_value`s of `config.files` together (base64 text), in bytes.
pub const FILES_TOTAL_BYTES: usize = 256 * 1024;
/// A whole config, as JSON, in bytes.
pub const CONFIG_BYTES: usize = 512 * 1024;

/// Checks every size limit of `config`: its metadata, env, files, and the whole of it.
pub fn check_config(config: &MachineConfig) -> Result<(), String> {
    check_metadata(&config.metadata)?;
    check_env(&config.env)?;
    check_files(config)?;
    let bytes = serde_json::to_vec(config).map(|v| v.len()).unwrap_or(0);
    if bytes > CONFIG_BYTES {
        return Err(format!(
            "config is {bytes} bytes as JSON: at most {CONFIG_BYTES} bytes"
        ));
    }
    Ok(())
}

/// Checks the size of a machine's metadata: each key, each value and all of it together.
pub fn check_metadata(metadata: &BTreeMap<String, String>) -> Result<(), String> {
    check_map(
        "config.metadata",
        "key",
        metadata,
        (
            METADATA_KEY_BYTES,
            METADATA_VALUE_BYTES,
            METADATA_TOTAL_BYTES,
        ),
    )
}

fn check_env(env: &BTreeMap<String, String>) -> Result<(), String> {
    check_map(
        "config.env",
        "name",
        env,
        (ENV_NAME_BYTES, ENV_VALUE_BYTES, ENV_TOTAL_BYTES),
    )
}

/// `(key, value, total)` limits of a map of strings.
fn check_map(
    what: &str,
    key_word: &str,
    map: &BTreeMap<String, String>,
    (key_max, value_max, total_max): (usize, usize, usize),
) -> Result<(), String> {
    let mut total = 0;
    for (k, v) in map {
        if k.len() > key_max {
            return Err(format!(
                "{what}: {key_word} {:?}... is {} bytes: at most {key_max} bytes per {key_word}",
                prefix(k),
                k.len()
            ));
        }
        if v.len() > value_max {
            return Err(format!(
                "{what}: the value of {k:?} is {} bytes: at most {value_max} bytes per value",
                v.len()
            ));
        }
        total += k.len() + v.len();
    }
    if total > total_max {
        return Err(format!(
            "{what} is {total} bytes (keys and values): at most {total_max} bytes per machine"
        ));
    }
    Ok(())
}

fn check_files(config: &MachineConfig) -> Result<(), String> {
    if config.files.len() > FILES_COUNT {
        return Err(format!(
            "config.files has {} files: at most {FILES_COUNT}",
            config.files.len()
        ));
    }
    let mut total = 0;
    for f in &config.files {
        if f.guest_path.len() > FILE_PATH_BYTES {
            return Err(format!(
                "config.files: guest_path {:?}... is {} bytes: at most {FILE_PATH_BYTES} bytes",
                prefix(&f.guest_path),
                f.guest_path.len()
            ));
        }
        total += f.raw_value.as_ref().map_or(0, String::len);
    }
    if total > FILES_TOTAL_BYTES {
        return Err(format!(
            "config.files: raw_value is {total} bytes in all: at most {FILES_TOTAL_BYTES} bytes per machine"
        ));
    }
    Ok(())
}

/// The first few characters of a long string, for a message.
fn prefix(s: &str) -> String {
    s.chars().take(32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FileConfig;

    fn with_metadata(pairs: &[(&str, String)]) -> MachineConfig {
        MachineConfig {
            metadata: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            ..MachineConfig::default()
        }
    }

    #[test]
    fn metadata_is_capped_per_key_per_value_and_in_all() {
        let at = "v".repeat(METADATA_VALUE_BYTES);
        assert_eq!(check_config(&with_metadata(&[("k", at.clone())])), Ok(()));
        let err = check_config(&with_metadata(&[("k", format!("{at}v"))])).unwrap_err();
        assert!(err.contains("at most 4096 bytes per value"), "{err}");
        let long_key = "k".repeat(METADATA_KEY_BYTES + 1);
        let err = check_config(&with_metadata(&[(&long_key, "v".into())])).unwrap_err();
        assert!(err.contains("at most 128 bytes per key"), "{err}");
        let many: Vec<(String, String)> = (0..5).map(|i| (format!("k{i}"), at.clone())).collect();
        let many: Vec<(&str, String)> = many.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        let err = check_config(&with_metadata(&many)).unwrap_err();
        assert!(err.contains("at most 16384 bytes per machine"), "{err}");
    }

    #[test]
    fn env_files_and_the_whole_config_are_capped() {
        let mut c = MachineConfig::default();
        c.env.insert("BIG".into(), "x".repeat(ENV_VALUE_BYTES + 1));
        let err = check_config(&c).unwrap_err();
        assert!(
            err.starts_with("config.env") && err.contains("32768"),
            "{err}"
        );
        let c = MachineConfig {
            files: vec![
                FileConfig {
                    guest_path: "/a".into(),
                    raw_value: Some("A".repeat(FILES_TOTAL_BYTES / 2 + 1)),
                    ..FileConfig::default()
                };
                2
            ],
            ..MachineConfig::default()
        };
        let err = check_config(&c).unwrap_err();
        assert!(err.contains("at most 262144 bytes per machine"), "{err}");
        let mut c = MachineConfig::default();
        c.extra
            .insert("huge".into(), serde_json::json!("x".repeat(CONFIG_BYTES)));
        let err = check_config(&c).unwrap_err();
        assert!(err.contains("at most 524288 bytes"), "{err}");
    }
}
