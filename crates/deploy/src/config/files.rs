//! `[[files]]`: files written into a group's machines before they start (`config.files`,
//! base64). `raw_value` is the base64 contents as fly.toml writes it; `local_path` names a
//! file beside the config file, read when the file is loaded ([`super::load`]).
//! `secret_name` is refused: the agent does not write app secrets into files.

use super::*;
use base64::Engine;

/// One `[[files]]` entry.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct File {
    pub guest_path: String,
    /// The contents, base64.
    #[serde(default)]
    pub raw_value: Option<String>,
    /// A file to read, relative to the config file's directory.
    #[serde(default)]
    pub local_path: Option<String>,
    #[serde(default)]
    pub processes: Vec<String>,
}

/// Reads each `local_path` (relative to `dir`) into `raw_value`.
pub(super) fn read_local(c: &mut AppConfig, dir: &std::path::Path) -> Result<(), String> {
    for f in &mut c.files {
        if let (Some(local), None) = (&f.local_path, &f.raw_value) {
            let path = dir.join(local);
            let bytes = std::fs::read(&path).map_err(|e| {
                format!(
                    "[[files]] {}: cannot read local_path {}: {e}",
                    f.guest_path,
                    path.display()
                )
            })?;
            f.raw_value = Some(base64::engine::general_purpose::STANDARD.encode(bytes));
        }
    }
    Ok(())
}

/// Checks the entries: an absolute `guest_path`, one source, base64, known groups.
pub(super) fn validate(c: &AppConfig, groups: &[String]) -> Result<(), String> {
    for f in &c.files {
        let at = format!("[[files]] {:?}", f.guest_path);
        let relative = f.guest_path.trim_start_matches('/');
        if !f.guest_path.starts_with('/')
            || relative.is_empty()
            || relative
                .split('/')
                .any(|p| p.is_empty() || p == "." || p == "..")
        {
            return Err(format!(
                "{at}: guest_path must be an absolute path to a file, without . or .."
            ));
        }
        match (&f.raw_value, &f.local_path) {
            (Some(_), Some(_)) => {
                return Err(format!("{at}: give raw_value or local_path, not both"))
            }
            (None, None) => return Err(format!("{at}: raw_value or local_path is required")),
            (Some(raw), None) => {
                base64::engine::general_purpose::STANDARD
                    .decode(raw)
                    .map_err(|e| format!("{at}: raw_value is not base64: {e}"))?;
            }
            // Read by `load`; a file given to `parse` alone keeps its local_path unread
            // and is refused when its machine config is made.
            (None, Some(_)) => {}
        }
        for g in &f.processes {
            if !groups.contains(g) {
                return Err(format!(
                    "{at}: processes names process group {g:?}, which is not in [processes]"
                ));
            }
        }
    }
    Ok(())
}

/// The `config.files` of a group.
pub(super) fn of_group(c: &AppConfig, group: &str) -> Result<Vec<FileConfig>, String> {
    c.files
        .iter()
        .filter(|f| f.processes.is_empty() || f.processes.iter().any(|g| g == group))
        .map(|f| {
            let raw = f.raw_value.clone().ok_or_else(|| {
                format!(
                    "[[files]] {}: local_path {:?} was not read (load the file with config::load)",
                    f.guest_path,
                    f.local_path.as_deref().unwrap_or_default()
                )
            })?;
            Ok(FileConfig {
                guest_path: f.guest_path.clone(),
                raw_value: Some(raw),
                mode: None,
                extra: Default::default(),
            })
        })
        .collect()
}
