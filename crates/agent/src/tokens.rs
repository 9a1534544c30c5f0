//! Who is calling the Machines API ([`Caller`]): the cluster secret, a token of the token
//! file (legacy: all-powerful organization tokens), or a scoped token (`bz1_…`) verified
//! offline with the cluster's public token key ([`bazaar_auth`]) and refused once any host
//! has revoked its id. The key comes from the config, else `DATA/token-public-key`.

use crate::agent::Agent;
use crate::config::AgentConfig;
use bazaar_auth::{Denied, Verifier};

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

impl Agent {
    /// Who `token` is: a scoped token (signatures checked once and cached, then its
    /// revocation), else the cluster secret or a token-file token ([`Agent::authorized`]).
    pub fn caller(&self, token: &str) -> Result<Caller, Denied> {
        if bazaar_auth::is_scoped(token) {
            let verifier = self.0.token_verifier.as_ref().ok_or_else(|| {
                Denied::Invalid("this cluster has no token key (--token-public-key)".into())
            })?;
            let verified = verifier.verify(token)?;
            // A revocation written to this host's token file counts at once.
            self.refresh_tokens();
            let revoked = self.0.revoked.read().unwrap_or_else(|e| e.into_inner());
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
            return Ok(Caller::ClusterSecret);
        }
        if self.authorized(token) {
            return Ok(Caller::Legacy(crate::secrets::token_hash(token)));
        }
        Err(Denied::Invalid("unknown token".into()))
    }
}
