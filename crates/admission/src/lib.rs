//! Whether a machine config is admitted: everything the agent checks before it makes
//! anything (a create, an update, a bid), with the resources the config asks for
//! ([`validate`]). A refusal says what is wrong ([`Refusal::Invalid`], a 400) or that no
//! host here can do it ([`Refusal::Capacity`]). Pure apart from [`validate_command`], which
//! looks the program up on the host. Its own crate so that the fuzz target of the config
//! decoder (fuzz/fuzz_targets/machine_config.rs) checks what the agent checks without
//! building the agent.
#![forbid(unsafe_code)]

use bazaar_types::config::{CheckConfig, MachineConfig};
use bazaar_types::config_fields;
use bazaar_types::guest::Guest;
use bazaar_types::host::Resources;

/// Why a config is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The config is wrong: the message says which key and why.
    #[error("{0}")]
    Invalid(String),
    /// No host in this cluster can run it (e.g. GPUs).
    #[error("{0}")]
    Capacity(String),
}

use bazaar_lifecycle::schedule::SCHEDULES;

/// Refuses what a config asks for and no host here can do, rather than accept it silently:
/// GPUs (no host has one: a placement refusal, `insufficient_capacity`), keys that are no
/// Fly config's and Fly's fields bazaar does not act on set to other than their default
/// (400 naming the field: `bazaar_types::config_fields`).
fn refuse_unsupported(config: &MachineConfig, guest: &Guest) -> Result<(), Refusal> {
    let set = |v: Option<&serde_json::Value>| {
        v.is_some_and(|v| !config_fields::is_default(v, config_fields::Shape::Any))
    };
    if set(guest.extra.get("gpus")) || set(guest.extra.get("gpu_kind")) {
        return Err(Refusal::Capacity(
            "no host in this cluster has GPUs (guest.gpus / guest.gpu_kind)".into(),
        ));
    }
    config_fields::check(config).map_err(Refusal::Invalid)?;
    if let Some(metrics) = &config.metrics {
        if metrics.port == 0 {
            return Err(Refusal::Invalid(
                "config.metrics.port must be between 1 and 65535".into(),
            ));
        }
        if !metrics.path.starts_with('/')
            || metrics
                .path
                .chars()
                .any(|c| c.is_ascii_control() || c == ' ')
        {
            return Err(Refusal::Invalid(format!(
                "config.metrics.path must be an absolute URL path, got {:?}",
                metrics.path
            )));
        }
        if metrics.https {
            return Err(Refusal::Invalid(
                "config.metrics.https is not supported by bazaar (metrics are scraped over HTTP on the machine's own address); leave it out".into(),
            ));
        }
    }
    if let Some(schedule) = config.schedule.as_deref().filter(|s| !s.is_empty()) {
        if !SCHEDULES.contains(&schedule) {
            return Err(Refusal::Invalid(format!(
                "config.schedule {schedule:?} must be one of {}",
                SCHEDULES.join(", ")
            )));
        }
    }
    let service_checks = config.services.iter().flat_map(|s| &s.checks);
    for check in config.checks.values().chain(service_checks) {
        check_headers(check).map_err(Refusal::Invalid)?;
    }
    Ok(())
}

/// Validates a config and returns the resources it needs.
pub fn validate(config: &MachineConfig) -> Result<Resources, Refusal> {
    let guest = match (&config.guest, &config.size) {
        (Some(_), Some(_)) => {
            return Err(Refusal::Invalid(
                "config.size and config.guest are mutually exclusive".into(),
            ))
        }
        (Some(g), None) => g.clone(),
        (None, Some(size)) => Guest::preset(size).map_err(Refusal::Invalid)?,
        (None, None) => Guest::default(),
    };
    let size = guest.validate().map_err(Refusal::Invalid)?;
    bazaar_types::limits::check_config(config).map_err(Refusal::Invalid)?;
    refuse_unsupported(config, &guest)?;
    config.rootfs_size_gb().map_err(Refusal::Invalid)?;
    bazaar_types::replacement::validate(config).map_err(Refusal::Invalid)?;
    if let Some(p) = &config.placement {
        p.validate().map_err(Refusal::Invalid)?;
    }
    config.check_runtime().map_err(Refusal::Invalid)?;
    match config.driver() {
        "process" => {
            let argv = config.init.as_ref().map(|i| i.argv()).unwrap_or_default();
            validate_command(&config.env, &argv).map_err(Refusal::Invalid)?;
            decode_files(config).map_err(Refusal::Invalid)?;
        }
        // gVisor runs the same bundle as runc, a microVM a disk of the same rootfs (a host
        // that cannot run them refuses them: runnable.rs).
        "oci" | "gvisor" | "microvm" => {
            config
                .image
                .parse::<bazaar_image::Reference>()
                .map_err(|e| Refusal::Invalid(format!("image {:?}: {e}", config.image)))?;
            for f in &config.files {
                if !f.guest_path.starts_with('/') || f.guest_path.split('/').any(|c| c == "..") {
                    return Err(Refusal::Invalid(format!(
                        "config.files: guest_path {:?} must be an absolute path without ..",
                        f.guest_path
                    )));
                }
                if f.raw_value.is_none() {
                    return Err(Refusal::Invalid(format!(
                        "config.files {}: raw_value (base64) is required",
                        f.guest_path
                    )));
                }
            }
        }
        other => {
            return Err(Refusal::Invalid(format!(
                "unknown driver {other:?}: use \"process\", or set config.image"
            )))
        }
    }
    bazaar_types::volume::mount_of(config).map_err(Refusal::Invalid)?;
    for svc in &config.services {
        if svc.internal_port == 0 {
            return Err(Refusal::Invalid(
                "services[].internal_port must be between 1 and 65535".into(),
            ));
        }
        if !matches!(svc.protocol.as_str(), "tcp" | "udp") {
            return Err(Refusal::Invalid(format!(
                "services[].protocol must be tcp or udp, got {:?}",
                svc.protocol
            )));
        }
    }
    for key in config.env.keys() {
        if key.is_empty() || key.contains('=') || key.contains('\0') {
            return Err(Refusal::Invalid(format!("invalid env name {key:?}")));
        }
    }
    Ok(size.into())
}

/// The request headers of an HTTP check, as Fly spells them (`[{"name": "X", "values":
/// ["a"]}]`) or as fly.toml does (`{"X": "a"}`); an error names what is wrong.
pub fn check_headers(c: &CheckConfig) -> Result<Vec<(String, String)>, String> {
    let invalid = |why: String| Err(format!("check headers: {why}"));
    let mut out = Vec::new();
    match c.extra.get("headers") {
        None | Some(serde_json::Value::Null) => {}
        Some(serde_json::Value::Array(list)) => {
            for h in list {
                let Some(name) = h["name"].as_str() else {
                    return invalid(format!("{h} has no name"));
                };
                let values = match &h["values"] {
                    serde_json::Value::Array(v) => v.clone(),
                    serde_json::Value::Null => Vec::new(),
                    other => vec![other.clone()],
                };
                for v in values {
                    let Some(v) = v.as_str() else {
                        return invalid(format!("header {name}: values must be strings"));
                    };
                    out.push((name.to_string(), v.to_string()));
                }
            }
        }
        Some(serde_json::Value::Object(map)) => {
            for (name, v) in map {
                let Some(v) = v.as_str() else {
                    return invalid(format!("header {name}: the value must be a string"));
                };
                out.push((name.clone(), v.to_string()));
            }
        }
        Some(other) => return invalid(format!("expected a list of {{name, values}}, got {other}")),
    }
    for (name, value) in &out {
        let name_ok = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !name_ok {
            return invalid(format!("invalid header name {name:?}"));
        }
        if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
            return invalid(format!(
                "header {name}: the value may not contain CR, LF or NUL"
            ));
        }
    }
    Ok(out)
}

/// A process machine's `config.files` entry, checked and decoded: written before every
/// start at `path` (its `guest_path` taken relative to the work directory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedFile {
    /// Relative to the work directory, without `.` or `..`.
    pub path: String,
    pub contents: Vec<u8>,
    /// Permission bits (default 0644).
    pub mode: u32,
}

/// A process machine's `config.files`: each written before every start at its `guest_path`
/// taken relative to the work directory (`/etc/app.conf` → `$BAZAAR_WORK_DIR/etc/app.conf`;
/// the work directory is also `HOME` and the workload's cwd). An error says which file is
/// wrong.
pub fn decode_files(config: &MachineConfig) -> Result<Vec<DecodedFile>, String> {
    use base64::Engine;
    config
        .files
        .iter()
        .map(|f| {
            let relative = f.guest_path.trim_start_matches('/');
            if !f.guest_path.starts_with('/')
                || relative.is_empty()
                || relative.split('/').any(|c| c.is_empty() || c == "." || c == "..")
            {
                return Err(format!(
                    "config.files: guest_path {:?} must be an absolute path to a file, without . or ..",
                    f.guest_path
                ));
            }
            let Some(raw) = &f.raw_value else {
                return Err(format!(
                    "config.files {}: raw_value (base64) is required",
                    f.guest_path
                ));
            };
            let contents = base64::engine::general_purpose::STANDARD
                .decode(raw)
                .map_err(|e| format!("config.files {}: raw_value is not base64: {e}", f.guest_path))?;
            Ok(DecodedFile {
                path: relative.into(),
                contents,
                mode: f.mode.unwrap_or(0o644) & 0o7777,
            })
        })
        .collect()
}

/// Checks that the machine's command can run: non-empty, and its program exists and is
/// executable (looked up in the machine's PATH when it has no `/`).
pub fn validate_command(
    rec_env: &std::collections::BTreeMap<String, String>,
    argv: &[String],
) -> Result<(), String> {
    let Some(program) = argv.first() else {
        return Err(
            "config.init.exec (or init.entrypoint/init.cmd) must name the command to run".into(),
        );
    };
    if program.is_empty() {
        return Err("the command to run is empty".into());
    }
    if program.contains('\0') || argv.iter().any(|a| a.contains('\0')) {
        return Err("the command contains a NUL byte".into());
    }
    let path = rec_env
        .get("PATH")
        .map(String::as_str)
        .unwrap_or(bazaar_image::config::DEFAULT_PATH);
    let found = if program.contains('/') {
        is_executable(std::path::Path::new(program))
    } else {
        path.split(':')
            .any(|dir| !dir.is_empty() && is_executable(&std::path::Path::new(dir).join(program)))
    };
    if found {
        Ok(())
    } else {
        Err(format!("command not found: {program}"))
    }
}

fn is_executable(p: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn commands_are_checked_before_anything_is_created() {
        let env = BTreeMap::new();
        assert!(validate_command(&env, &["sleep".into(), "1".into()]).is_ok());
        assert!(validate_command(&env, &["/bin/sh".into()]).is_ok());
        let err = validate_command(&env, &["no-such-program-xyz".into()]).unwrap_err();
        assert_eq!(err, "command not found: no-such-program-xyz");
        assert!(validate_command(&env, &[]).is_err());
        assert!(validate_command(&env, &["/etc/passwd".into()]).is_err());
    }
}
