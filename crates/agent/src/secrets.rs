//! The cluster secret (host-to-host calls), this host's catalog signing key and API tokens:
//! where they are kept and how they are compared. Every authorization check goes through [`constant_time_eq`] via
//! [`crate::Agent::authorized`].

use crate::config::AgentConfig;
use std::collections::BTreeSet;
use std::path::Path;

pub use bazaar_node::secrets::{constant_time_eq, write_private};

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

/// This host's catalog signing key (ed25519): `data_dir/host-key`, 32 bytes in hex, made
/// once and kept 0600. Other nodes pin it to this host id on first sight, so it must
/// outlive restarts (see `bazaar_catalog::trust`).
pub fn host_signing_key(data_dir: &Path) -> anyhow::Result<bazaar_catalog::trust::SigningKey> {
    use anyhow::Context;
    let path = data_dir.join("host-key");
    let seed = match std::fs::read_to_string(&path) {
        Ok(text) => {
            let bytes = hex::decode(text.trim())
                .with_context(|| format!("{} is not hex", path.display()))?;
            <[u8; 32]>::try_from(bytes.as_slice())
                .map_err(|_| anyhow::anyhow!("{} must hold 32 bytes", path.display()))?
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let seed: [u8; 32] = rand::random();
            write_private(&path, &hex::encode(seed))?;
            seed
        }
        Err(e) => return Err(anyhow::anyhow!("reading {}: {e}", path.display())),
    };
    Ok(bazaar_catalog::trust::SigningKey::from_bytes(&seed))
}

/// A token file's line naming a revoked token by its hash ([`token_hash`]).
const REVOKED: &str = "revoked:";

/// What a token file says.
#[derive(Debug, Default, PartialEq)]
pub struct TokenFile {
    /// The API tokens accepted.
    pub tokens: Vec<String>,
    /// Hashes of revoked legacy tokens and ids of revoked scoped tokens (`revoked:<hash>`
    /// and `revoked:<id>` lines, written by `bazaar token revoke`): refused on this host, and published in its host record so that every
    /// host refuses them.
    pub revoked: BTreeSet<String>,
}

/// Reads a token file: one token per line, or `revoked:<hash>`; blank lines and `#`
/// comments are skipped.
pub fn read_tokens(path: &Path) -> anyhow::Result<TokenFile> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("reading token file {}: {e}", path.display()))?;
    let mut file = TokenFile::default();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match line.strip_prefix(REVOKED) {
            Some(hash) => {
                file.revoked.insert(hash.trim().to_string());
            }
            None => file.tokens.push(line.to_string()),
        }
    }
    Ok(file)
}

/// How a revoked token is named where others can read it (the catalog): the hex SHA-256
/// of the token, never the token itself.
pub fn token_hash(token: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}

/// Revokes `token` in a token file: removes it and records its hash (also when the file
/// never held it: another host's file may). Returns the hash.
pub fn revoke_token(path: &Path, token: &str) -> anyhow::Result<String> {
    let hash = token_hash(token);
    record_revoked(path, Some(token), &hash)?;
    Ok(hash)
}

/// Revokes a scoped token by its id (`bazaar_auth::Verified::id`, or any of its revocation
/// ids) in a token file: a `revoked:<id>` line, published and refused as a hash is.
pub fn revoke_id(path: &Path, id: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        !id.is_empty() && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "a token id is hex (bazaar token inspect shows it)"
    );
    record_revoked(path, None, &id.to_ascii_lowercase())
}

/// Rewrites a token file without `token` and with a `revoked:<name>` line.
fn record_revoked(path: &Path, token: Option<&str>, name: &str) -> anyhow::Result<()> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => anyhow::bail!("reading token file {}: {e}", path.display()),
    };
    let revoked_line = format!("{REVOKED}{name}");
    let mut out: String = text
        .lines()
        .filter(|l| Some(l.trim()) != token)
        .flat_map(|l| [l, "\n"])
        .collect();
    if !text.lines().any(|l| l.trim() == revoked_line) {
        out.push_str(&revoked_line);
        out.push('\n');
    }
    write_private(path, &out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revoking_removes_the_token_and_records_its_hash() {
        let dir = std::env::temp_dir().join(format!("bazaar-tokens-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokens");
        std::fs::write(&path, "# api tokens\naaa\nbbb\n").unwrap();
        let hash = revoke_token(&path, "aaa").unwrap();
        assert_eq!(hash, token_hash("aaa"));
        assert_ne!(hash, "aaa");
        let file = read_tokens(&path).unwrap();
        assert_eq!(file.tokens, vec!["bbb".to_string()]);
        assert_eq!(file.revoked, BTreeSet::from([hash.clone()]));
        // Twice is the same; a token the file never held is recorded too.
        revoke_token(&path, "aaa").unwrap();
        revoke_token(&path, "zzz").unwrap();
        let file = read_tokens(&path).unwrap();
        assert_eq!(file.revoked, BTreeSet::from([hash, token_hash("zzz")]));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_scoped_token_is_revoked_by_its_id() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(&path, "kept\n").unwrap();
        revoke_id(&path, "ABCDEF01").unwrap();
        revoke_id(&path, "abcdef01").unwrap();
        assert!(revoke_id(&path, "not hex").is_err());
        let file = read_tokens(&path).unwrap();
        assert_eq!(file.tokens, vec!["kept".to_string()]);
        assert_eq!(file.revoked, BTreeSet::from(["abcdef01".to_string()]));
    }

    #[test]
    fn the_host_key_is_made_once_and_kept_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("bazaar-host-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let first = host_signing_key(&dir).unwrap();
        let again = host_signing_key(&dir).unwrap();
        assert_eq!(first.to_bytes(), again.to_bytes());
        let mode = std::fs::metadata(dir.join("host-key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
