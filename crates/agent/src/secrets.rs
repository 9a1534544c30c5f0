//! The cluster secret (host-to-host calls) and API tokens: where they are kept and how they
//! are compared. Every authorization check goes through [`constant_time_eq`] via
//! [`crate::Agent::authorized`].

use crate::config::AgentConfig;
use std::path::Path;

/// The cluster secret: from the config (inline, else its `cluster_secret_file`), else
/// `data_dir/cluster-secret` (created once).
pub fn cluster_secret(config: &AgentConfig) -> anyhow::Result<String> {
    let from_file = match (&config.cluster_secret, &config.cluster_secret_file) {
        (None, Some(path)) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| {
                    anyhow::anyhow!("reading cluster secret file {}: {e}", path.display())
                })?
                .lines()
                .next()
                .unwrap_or_default()
                .trim()
                .to_string(),
        ),
        _ => None,
    };
    if let Some(s) = config.cluster_secret.as_ref().or(from_file.as_ref()) {
        anyhow::ensure!(
            s.len() >= 16,
            "the cluster secret must be at least 16 characters"
        );
        return Ok(s.clone());
    }
    let path = config.data_dir.join("cluster-secret");
    match std::fs::read_to_string(&path) {
        Ok(s) if !s.trim().is_empty() => Ok(s.trim().to_string()),
        _ => {
            let secret = bazaar_types::ids::new_secret(24);
            write_private(&path, &secret)?;
            Ok(secret)
        }
    }
}

/// Reads a token file: one token per line; blank lines and `#` comments are skipped.
pub fn read_tokens(path: &Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("reading token file {}: {e}", path.display()))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect())
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
