//! Content digests (`sha256:<hex>`), the names of everything in the store.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::fmt;
use std::str::FromStr;

/// A validated `sha256:<64 lowercase hex>` digest.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Digest(String);

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest::from_hasher(Sha256::new_with_prefix(bytes))
    }

    /// The digest a finished hasher computed.
    pub fn from_hasher(hasher: Sha256) -> Digest {
        Digest(format!("sha256:{}", hex::encode(hasher.finalize())))
    }

    /// The hex part, used as the file name in the store.
    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }

    /// The full `sha256:<hex>` form.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Fails unless `bytes` hash to this digest; `what` names the content in the error.
    pub fn verify(&self, what: &'static str, bytes: &[u8]) -> Result<()> {
        let actual = Digest::of(bytes);
        if &actual != self {
            return Err(Error::DigestMismatch {
                what,
                expected: self.clone(),
                actual,
            });
        }
        Ok(())
    }
}

impl FromStr for Digest {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let hex = s
            .strip_prefix("sha256:")
            .ok_or_else(|| Error::Digest(s.into()))?;
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(Error::Digest(s.into()));
        }
        Ok(Digest(s.into()))
    }
}

impl TryFrom<String> for Digest {
    type Error = Error;

    fn try_from(s: String) -> Result<Self> {
        s.parse()
    }
}

impl From<Digest> for String {
    fn from(d: Digest) -> String {
        d.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let d = Digest::of(b"");
        assert_eq!(
            d.as_str(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(d.as_str().parse::<Digest>().unwrap(), d);
        assert!("sha256:abc".parse::<Digest>().is_err());
        assert!("sha512:e3b0".parse::<Digest>().is_err());
        assert!(d.as_str().to_uppercase().parse::<Digest>().is_err());
        assert!(d.verify("blob", b"x").is_err());
        d.verify("blob", b"").unwrap();
    }
}
