//! Who is calling the Machines API ([`Caller`]): a token of the token file (legacy:
//! all-powerful organization tokens), or a scoped token (`bz1_…`) verified offline with the
//! cluster's public token key ([`bazaar_auth`]) and refused once any host has revoked its
//! id. The key comes from the config, else `DATA/token-public-key`. The cluster secret is
//! not an API token: it is refused there ([`NOT_AN_API_TOKEN`]) and opens only the host
//! interface and the catalog view (`require_cluster_secret`).
//!
//! `Tokens` is the agent's part that holds them: the cluster secret, the token file's
//! tokens (re-read when the file changes), the revocations of this host and of the cluster,
//! and the verifier of scoped tokens.

use crate::config::AgentConfig;
use crate::sync::lock;
use bazaar_auth::{Denied, Verifier};
use std::collections::{BTreeSet, HashSet};
use std::path::PathBuf;
use std::sync::{Mutex, RwLock};
use std::time::SystemTime;

/// The verifier of scoped tokens, if this agent has the cluster's public token key.
pub(crate) fn verifier(config: &AgentConfig) -> anyhow::Result<Option<Verifier>> {
    let text = match (&config.token_public_key, &config.token_public_key_file) {
        (Some(hex), _) => Some(hex.clone()),
        (None, Some(path)) => Some(std::fs::read_to_string(path).map_err(|e| {
            anyhow::anyhow!("reading token public key file {}: {e}", path.display())
        })?),
        (None, None) => std::fs::read_to_string(config.data_dir.join("token-public-key")).ok(),
    };
    text.map(|t| {
        Verifier::from_public_hex(&t).map_err(|e| anyhow::anyhow!("token public key: {e}"))
    })
    .transpose()
}

pub use bazaar_node::Caller;

/// Why the cluster secret is refused as an API token (issue 31, item 8).
pub const NOT_AN_API_TOKEN: &str = "the cluster secret is not an API token: it opens only the \
     host interface; make an API token with `bazaar token create` (bazaar dev writes one to \
     .bazaar-dev/dev.env as BAZAAR_TOKEN)";

/// The bearer tokens this host accepts and the ones revoked.
#[derive(Debug)]
pub(crate) struct Tokens {
    cluster_secret: String,
    /// The token file, if the config names one.
    token_file: Option<PathBuf>,
    /// The token file's API tokens.
    accepted: Mutex<Vec<String>>,
    /// The token file's modification time and length when last read (it is re-read when
    /// they change).
    read: Mutex<Option<(Option<SystemTime>, u64)>>,
    /// Hashes of the tokens this host's token file revokes (published in its host record).
    revoked_here: Mutex<BTreeSet<String>>,
    /// Hashes of the tokens revoked anywhere in the cluster: this host's and those every
    /// host record publishes (refreshed by housekeeping).
    revoked: RwLock<HashSet<String>>,
    /// Verifies scoped tokens, if this host has the cluster's public token key.
    verifier: Option<Verifier>,
}

impl Tokens {
    /// The tokens of `config`: its cluster secret (`secret`), its token file, its token key.
    pub(crate) fn load(config: &AgentConfig, secret: String) -> anyhow::Result<Tokens> {
        let mut accepted = Vec::new();
        let mut revoked_here = BTreeSet::new();
        if let Some(path) = &config.token_file {
            let file = crate::secrets::read_tokens(path)?;
            accepted.extend(file.tokens);
            revoked_here = file.revoked;
        }
        let revoked = revoked_here.iter().cloned().collect();
        Ok(Tokens {
            cluster_secret: secret,
            token_file: config.token_file.clone(),
            accepted: Mutex::new(accepted),
            read: Mutex::new(None),
            revoked_here: Mutex::new(revoked_here),
            revoked: RwLock::new(revoked),
            verifier: verifier(config)?,
        })
    }

    /// The cluster secret.
    pub(crate) fn cluster_secret(&self) -> &str {
        &self.cluster_secret
    }

    /// True if `token` is the cluster secret (constant time).
    pub(crate) fn is_cluster_secret(&self, token: &str) -> bool {
        crate::secrets::constant_time_eq(self.cluster_secret.as_bytes(), token.as_bytes())
    }

    /// True if `token` is a token of the token file that no host has revoked (constant
    /// time; the file is re-read first if it changed). The cluster secret is not one.
    pub(crate) fn authorized(&self, token: &str) -> bool {
        let eq = |t: &String| crate::secrets::constant_time_eq(t.as_bytes(), token.as_bytes());
        if self.is_cluster_secret(token) {
            return false;
        }
        self.refresh();
        {
            let revoked = self.revoked.read().unwrap_or_else(|e| e.into_inner());
            if !revoked.is_empty() && revoked.contains(&crate::secrets::token_hash(token)) {
                return false;
            }
        }
        lock(&self.accepted).iter().any(eq)
    }

    /// Re-reads the token file if its modification time or length changed. A file that
    /// cannot be read leaves no token-file token.
    pub(crate) fn refresh(&self) {
        let Some(path) = &self.token_file else {
            return;
        };
        let stamp = std::fs::metadata(path)
            .ok()
            .map(|m| (m.modified().ok(), m.len()));
        let mut read = lock(&self.read);
        if read.is_some() && *read == stamp {
            return;
        }
        *read = stamp;
        let file = crate::secrets::read_tokens(path).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "token file unreadable: none of its tokens is accepted");
            crate::secrets::TokenFile::default()
        });
        *lock(&self.accepted) = file.tokens;
        self.revoked
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .extend(file.revoked.iter().cloned());
        *lock(&self.revoked_here) = file.revoked;
    }

    /// Hashes of the tokens this host's token file revokes.
    pub(crate) fn revoked_here(&self) -> BTreeSet<String> {
        lock(&self.revoked_here).clone()
    }

    /// Sets the cluster-wide revocations to this host's file's and `elsewhere` (every host
    /// record's `revoked_tokens`).
    pub(crate) fn refresh_revocations(&self, elsewhere: impl IntoIterator<Item = String>) {
        self.refresh();
        let mut all: HashSet<String> = lock(&self.revoked_here).iter().cloned().collect();
        all.extend(elsewhere);
        let mut revoked = self.revoked.write().unwrap_or_else(|e| e.into_inner());
        if *revoked != all {
            *revoked = all;
        }
    }

    /// Who `token` is on the Machines API: a scoped token (signatures checked once and
    /// cached, then its revocation), else a token-file token ([`Tokens::authorized`]). The
    /// cluster secret is refused ([`NOT_AN_API_TOKEN`]).
    pub(crate) fn caller(&self, token: &str) -> Result<Caller, Denied> {
        if bazaar_auth::is_scoped(token) {
            let verifier = self.verifier.as_ref().ok_or_else(|| {
                Denied::Invalid("this cluster has no token key (--token-public-key)".into())
            })?;
            let verified = verifier.verify(token)?;
            // A revocation written to this host's token file counts at once.
            self.refresh();
            let revoked = self.revoked.read().unwrap_or_else(|e| e.into_inner());
            if verified
                .revocation_ids()
                .iter()
                .any(|id| revoked.contains(id))
            {
                return Err(Denied::Invalid("token revoked".into()));
            }
            return Ok(Caller::Scoped(verified));
        }
        if self.is_cluster_secret(token) {
            return Err(Denied::Invalid(NOT_AN_API_TOKEN.into()));
        }
        if self.authorized(token) {
            return Ok(Caller::Legacy(crate::secrets::token_hash(token)));
        }
        Err(Denied::Invalid("unknown token".into()))
    }
}
