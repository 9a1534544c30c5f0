//! Sealing small secrets at rest (app secrets, certificate keys): ChaCha20-Poly1305 with a
//! key derived from the cluster secret by HKDF-SHA256, one key per purpose. Pure: no I/O.
//!
//! Every host holds the cluster secret, so every host can open what any host sealed, and a
//! sealed value can travel through the catalog or sit in a store file without showing its
//! plain text. The associated data binds a sealed value to where it belongs (for example
//! `app/web/secret/DATABASE_URL`): moved to another place, it no longer opens.
//!
//! A sealed value is text: `bzs1_` then URL-safe base64 of `nonce (12 bytes) || ciphertext
//! and tag`. Rotating the cluster secret means re-sealing (docs/SECURITY.md).
#![forbid(unsafe_code)]

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::hkdf;
use ring::rand::{SecureRandom, SystemRandom};

/// What starts every sealed value.
pub const PREFIX: &str = "bzs1_";

/// Why a sealed value could not be opened.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SealError {
    #[error("not a sealed value (it must start with {PREFIX})")]
    NotSealed,
    #[error("sealed value is not valid base64 or is too short")]
    Malformed,
    /// Wrong key (another cluster, or another purpose) or wrong place, or edited.
    #[error("sealed value does not open with this cluster's key")]
    Rejected,
}

/// A sealing key for one purpose. Its `Debug` never shows the key.
pub struct SealKey {
    key: LessSafeKey,
}

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealKey(..)")
    }
}

impl SealKey {
    /// The key for `purpose` (e.g. `"app-secrets"`, `"certificate-keys"`) derived from the
    /// cluster secret: the same on every host of the cluster, different per purpose.
    pub fn derive(cluster_secret: &[u8], purpose: &str) -> SealKey {
        let salt = hkdf::Salt::new(hkdf::HKDF_SHA256, b"bazaar seal v1");
        let prk = salt.extract(cluster_secret);
        let info = [purpose.as_bytes()];
        let okm = prk
            .expand(&info, &CHACHA20_POLY1305)
            .expect("32 bytes is a valid HKDF-SHA256 output length");
        SealKey {
            key: LessSafeKey::new(UnboundKey::from(okm)),
        }
    }

    /// Seals `plaintext` for the place named by `aad`, with a fresh random nonce.
    pub fn seal(&self, aad: &str, plaintext: &[u8]) -> String {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .expect("the system random source works");
        let mut buf = plaintext.to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad.as_bytes()),
                &mut buf,
            )
            .expect("sealing a buffer in memory cannot fail");
        let mut out = nonce.to_vec();
        out.extend_from_slice(&buf);
        format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(out))
    }

    /// Opens a value sealed for the place named by `aad`.
    pub fn open(&self, aad: &str, sealed: &str) -> Result<Vec<u8>, SealError> {
        let body = sealed.strip_prefix(PREFIX).ok_or(SealError::NotSealed)?;
        let raw = URL_SAFE_NO_PAD
            .decode(body)
            .map_err(|_| SealError::Malformed)?;
        if raw.len() < NONCE_LEN + CHACHA20_POLY1305.tag_len() {
            return Err(SealError::Malformed);
        }
        let (nonce, ciphertext) = raw.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| SealError::Malformed)?;
        let mut buf = ciphertext.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(aad.as_bytes()), &mut buf)
            .map_err(|_| SealError::Rejected)?;
        Ok(plain.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"a cluster secret of enough length";

    #[test]
    fn a_sealed_value_opens_on_another_host_of_the_cluster() {
        let sealed = SealKey::derive(SECRET, "app-secrets").seal("app/web/DB", b"postgres://x");
        assert!(sealed.starts_with(PREFIX));
        assert!(!sealed.contains("postgres"));
        let other_host = SealKey::derive(SECRET, "app-secrets");
        assert_eq!(
            other_host.open("app/web/DB", &sealed).unwrap(),
            b"postgres://x"
        );
    }

    #[test]
    fn another_cluster_purpose_or_place_cannot_open_it() {
        let key = SealKey::derive(SECRET, "app-secrets");
        let sealed = key.seal("app/web/DB", b"x");
        let other_cluster = SealKey::derive(b"another cluster's secret!!", "app-secrets");
        assert_eq!(
            other_cluster.open("app/web/DB", &sealed),
            Err(SealError::Rejected)
        );
        let other_purpose = SealKey::derive(SECRET, "certificate-keys");
        assert_eq!(
            other_purpose.open("app/web/DB", &sealed),
            Err(SealError::Rejected)
        );
        assert_eq!(key.open("app/api/DB", &sealed), Err(SealError::Rejected));
    }

    #[test]
    fn an_edited_or_garbled_value_is_refused() {
        let key = SealKey::derive(SECRET, "app-secrets");
        let sealed = key.seal("a", b"value");
        let mut edited = sealed.clone().into_bytes();
        let last = edited.len() - 3;
        edited[last] = if edited[last] == b'A' { b'B' } else { b'A' };
        let edited = String::from_utf8(edited).unwrap();
        assert_eq!(key.open("a", &edited), Err(SealError::Rejected));
        assert_eq!(key.open("a", "plain"), Err(SealError::NotSealed));
        assert_eq!(key.open("a", "bzs1_!!"), Err(SealError::Malformed));
        assert_eq!(key.open("a", "bzs1_AAAA"), Err(SealError::Malformed));
    }

    #[test]
    fn sealing_twice_gives_different_text() {
        let key = SealKey::derive(SECRET, "p");
        assert_ne!(key.seal("a", b"v"), key.seal("a", b"v"));
    }
}
