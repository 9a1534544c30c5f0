//! Join tokens: `bzjoin1.<secret>.<ca fingerprint>`. The secret (32 random bytes) is what
//! the CA redeems once; the fingerprint (SHA-256 of the CA certificate) lets the joining
//! host check that it talks to the right cluster before it trusts anything it is sent.

use std::fmt;
use std::str::FromStr;

const PREFIX: &str = "bzjoin1";

/// A one-time join token as an operator passes it to a new host.
#[derive(Clone, PartialEq, Eq)]
pub struct JoinToken {
    /// The one-time secret, hex (64 characters).
    pub secret: String,
    /// SHA-256 of the cluster CA's certificate (DER), hex.
    pub ca_fingerprint: String,
}

impl JoinToken {
    /// A new token for the CA whose certificate has `ca_fingerprint`.
    pub fn new(ca_fingerprint: &str) -> Self {
        let secret: [u8; 32] = rand::random();
        Self {
            secret: hex::encode(secret),
            ca_fingerprint: ca_fingerprint.to_string(),
        }
    }

    /// How the CA files the token: the hash of its secret (the secret is never stored).
    pub fn id(&self) -> String {
        crate::fingerprint(self.secret.as_bytes())
    }
}

impl fmt::Display for JoinToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PREFIX}.{}.{}", self.secret, self.ca_fingerprint)
    }
}

// The secret stays out of logs and panics.
impl fmt::Debug for JoinToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinToken")
            .field("ca_fingerprint", &self.ca_fingerprint)
            .finish_non_exhaustive()
    }
}

impl FromStr for JoinToken {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<Self> {
        let hex64 = |part: &str| part.len() == 64 && part.bytes().all(|b| b.is_ascii_hexdigit());
        match s.trim().split('.').collect::<Vec<_>>().as_slice() {
            [PREFIX, secret, fp] if hex64(secret) && hex64(fp) => Ok(Self {
                secret: secret.to_ascii_lowercase(),
                ca_fingerprint: fp.to_ascii_lowercase(),
            }),
            _ => anyhow::bail!(
                "not a join token (expected {PREFIX}.<64 hex>.<64 hex>, as `bazaar cluster join-token` prints)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_reads_back_as_written_and_hides_its_secret() {
        let token = JoinToken::new(&"ab".repeat(32));
        let parsed: JoinToken = token.to_string().parse().unwrap();
        assert_eq!(parsed, token);
        assert!(!format!("{token:?}").contains(&token.secret));
    }

    #[test]
    fn malformed_tokens_are_refused() {
        let fp = "ab".repeat(32);
        for bad in [
            String::new(),
            format!("bzjoin2.{fp}.{fp}"),
            format!("bzjoin1.{fp}"),
            format!("bzjoin1.{}.{fp}", "zz".repeat(32)),
            format!("bzjoin1.{fp}.{fp}.x"),
        ] {
            assert!(bad.parse::<JoinToken>().is_err(), "{bad}");
        }
    }
}
