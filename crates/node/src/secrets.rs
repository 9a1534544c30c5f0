//! App secrets' errors and limits (the agent seals and opens them: `bazaar_agent::app_secrets`),
//! files readable by their owner only, and comparing credentials in constant time.

use std::path::Path;

/// Header of a call that an API node forwards to a machine's owner (start, restart, update,
/// claim): `<version> <app>`, the app's secrets version as the API node sees it. The owner
/// waits (at most `SECRETS_WAIT`) until its catalog has caught up, so a machine restarted
/// right after `secrets set` on another node starts with the new values (Fly's
/// `min_secrets_version`, implicit).
pub const SECRETS_VERSION_HEADER: &str = "x-bazaar-secrets-version";
/// Largest value, in bytes (an environment string may be at most 128 KiB on Linux).
pub const MAX_VALUE_BYTES: usize = 64 * 1024;
/// Longest name.
pub const MAX_NAME_LEN: usize = 128;
/// Most secrets an app may hold.
pub const MAX_SECRETS_PER_APP: usize = 256;

/// Why a secret could not be set, unset or opened. Messages name secrets, never values.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SecretError {
    #[error("{0}")]
    Invalid(String),
    #[error("app {0} not found")]
    NoApp(String),
    #[error("secret {0} not found")]
    NotFound(String),
    #[error("the catalog is not running yet")]
    NoCatalog,
    /// Sealed with another cluster secret (rotated without re-sealing), or edited.
    #[error("app secret {name} of {app} does not open with this cluster's key: set it again")]
    Unreadable { app: String, name: String },
}

/// A name the environment takes: a letter or `_`, then letters, digits and `_`; not one of
/// the variables bazaar sets itself (`FLY_*`, `BAZAAR_*`).
pub fn validate_name(name: &str) -> Result<(), SecretError> {
    let invalid = |why: &str| {
        Err(SecretError::Invalid(format!(
            "invalid secret name {name:?}: {why}"
        )))
    };
    let mut chars = name.chars();
    match chars.next() {
        None => return invalid("it is empty"),
        Some(c) if !(c.is_ascii_alphabetic() || c == '_') => {
            return invalid("it must start with a letter or '_'")
        }
        _ => {}
    }
    if !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return invalid("only letters, digits and '_' are allowed (an environment variable name)");
    }
    if name.len() > MAX_NAME_LEN {
        return invalid(&format!("at most {MAX_NAME_LEN} characters"));
    }
    if ["FLY_", "BAZAAR_"].iter().any(|p| name.starts_with(p)) {
        return invalid("FLY_* and BAZAAR_* are set by bazaar itself");
    }
    Ok(())
}

/// A value the environment takes: at most [`MAX_VALUE_BYTES`], no NUL byte.
pub fn validate_value(name: &str, value: &str) -> Result<(), SecretError> {
    if value.len() > MAX_VALUE_BYTES {
        return Err(SecretError::Invalid(format!(
            "the value of secret {name} is too large: at most {MAX_VALUE_BYTES} bytes"
        )));
    }
    if value.contains('\0') {
        return Err(SecretError::Invalid(format!(
            "the value of secret {name} contains a NUL byte"
        )));
    }
    Ok(())
}

/// Writes a file readable by its owner only.
pub fn write_private(path: &Path, contents: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(contents.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// Compares two byte strings without leaking where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
