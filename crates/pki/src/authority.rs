//! What the CA vouches for besides certificates, and how every host checks it with the CA
//! certificate alone ([`CaVerifier`]):
//!
//! - **Row-key endorsements**: the CA signs (host id, the host's ed25519 catalog key). A
//!   host row carries its endorsement, so a node pins a host's row key only when the CA
//!   says it is that host's (no trust on first use). The CA endorses only hosts it issued a
//!   certificate to and that are not revoked; a host asks over mTLS, as that host.
//! - **Revocations**: the CA signs (host id, when). Host ids are issued once, so revoking
//!   the id revokes every certificate and key it ever had; the record spreads through the
//!   catalog and every node refuses that host from then on.
//!
//! Signatures are ECDSA P-256 (the CA's key) over a context string, the host id (length
//! prefixed) and the rest; they travel base64.

use crate::ClusterCa;
use anyhow::Context;
use base64::Engine;
use serde::{Deserialize, Serialize};

const ROW_KEY_CONTEXT: &[u8] = b"bazaar-pki/row-key/v1";
const REVOCATION_CONTEXT: &[u8] = b"bazaar-pki/revocation/v1";

fn message(context: &[u8], host_id: &str, rest: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(context.len() + 4 + host_id.len() + rest.len());
    m.extend_from_slice(context);
    m.extend_from_slice(&(host_id.len() as u32).to_be_bytes());
    m.extend_from_slice(host_id.as_bytes());
    m.extend_from_slice(rest);
    m
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD_NO_PAD
}

/// A host revoked by the CA.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revocation {
    pub host_id: String,
    /// When the CA revoked it (seconds since the epoch).
    pub revoked_at: u64,
    /// The CA's signature, base64.
    pub signature: String,
}

impl Revocation {
    fn message(&self) -> Vec<u8> {
        message(
            REVOCATION_CONTEXT,
            &self.host_id,
            &self.revoked_at.to_be_bytes(),
        )
    }
}

/// Checks the CA's signatures with its certificate.
#[derive(Clone)]
pub struct CaVerifier {
    /// The CA's public key (an uncompressed P-256 point).
    public_key: Vec<u8>,
}

impl std::fmt::Debug for CaVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CaVerifier")
    }
}

impl CaVerifier {
    /// The verifier of the CA whose certificate (PEM) is `ca_pem`.
    pub fn new(ca_pem: &str) -> anyhow::Result<Self> {
        let der = crate::host::pem_certs(ca_pem)?
            .into_iter()
            .next()
            .context("no CA certificate")?;
        let (_, cert) = x509_parser::parse_x509_certificate(&der)
            .map_err(|e| anyhow::anyhow!("parsing the CA certificate: {e}"))?;
        Ok(Self {
            public_key: cert.public_key().subject_public_key.data.to_vec(),
        })
    }

    fn verify(&self, message: &[u8], signature: &str) -> bool {
        let Ok(signature) = b64().decode(signature) else {
            return false;
        };
        ring::signature::UnparsedPublicKey::new(
            &ring::signature::ECDSA_P256_SHA256_ASN1,
            &self.public_key,
        )
        .verify(message, &signature)
        .is_ok()
    }

    /// Whether the CA endorsed `row_key` as the catalog key of `host_id`.
    pub fn check_row_key(&self, host_id: &str, row_key: &[u8; 32], endorsement: &str) -> bool {
        self.verify(&message(ROW_KEY_CONTEXT, host_id, row_key), endorsement)
    }

    /// Whether `revocation` was signed by the CA.
    pub fn check_revocation(&self, revocation: &Revocation) -> bool {
        self.verify(&revocation.message(), &revocation.signature)
    }
}

impl ClusterCa {
    fn sign(&self, message: &[u8]) -> anyhow::Result<String> {
        use rcgen::SigningKey;
        let key_pem = std::fs::read_to_string(self.dir.join("ca.key"))
            .with_context(|| format!("reading {}/ca.key", self.dir.display()))?;
        let key = rcgen::KeyPair::from_pem(&key_pem).context("ca.key")?;
        Ok(b64().encode(key.sign(message)?))
    }

    /// Endorses `row_key` as the catalog key of `host_id`, a host this CA issued a
    /// certificate to and has not revoked.
    pub fn endorse_row_key(&self, host_id: &str, row_key: &[u8; 32]) -> anyhow::Result<String> {
        anyhow::ensure!(
            self.host_marker(host_id).exists(),
            "host {host_id} never joined this cluster"
        );
        self.ensure_not_revoked(host_id)?;
        self.sign(&message(ROW_KEY_CONTEXT, host_id, row_key))
    }

    fn revocation_file(&self, host_id: &str) -> std::path::PathBuf {
        self.dir.join("revoked").join(format!("{host_id}.json"))
    }

    /// The revocation of `host_id`, if the CA revoked it.
    pub fn revocation(&self, host_id: &str) -> Option<Revocation> {
        let text = std::fs::read(self.revocation_file(host_id)).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// Refuses a revoked host (renewals, endorsements).
    pub(crate) fn ensure_not_revoked(&self, host_id: &str) -> anyhow::Result<()> {
        anyhow::ensure!(
            !self.revocation_file(host_id).exists(),
            "host {host_id} was revoked: join again as a new host with a new join token"
        );
        Ok(())
    }

    /// Revokes `host_id` (one the CA issued a certificate to): records it in
    /// `revoked/<host id>.json` and returns the signed record to spread. Revoking again
    /// returns the first record.
    pub fn revoke(&self, host_id: &str) -> anyhow::Result<Revocation> {
        anyhow::ensure!(crate::valid_host_id(host_id), "invalid host id {host_id:?}");
        if let Some(done) = self.revocation(host_id) {
            return Ok(done);
        }
        anyhow::ensure!(
            self.host_marker(host_id).exists(),
            "host {host_id} never joined this cluster"
        );
        let revoked_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut revocation = Revocation {
            host_id: host_id.to_string(),
            revoked_at,
            signature: String::new(),
        };
        revocation.signature = self.sign(&revocation.message())?;
        std::fs::create_dir_all(self.dir.join("revoked"))?;
        crate::write_private(
            &self.revocation_file(host_id),
            &serde_json::to_vec(&revocation)?,
        )?;
        Ok(revocation)
    }

    /// Every revocation the CA made.
    pub fn revocations(&self) -> Vec<Revocation> {
        let Ok(dir) = std::fs::read_dir(self.dir.join("revoked")) else {
            return Vec::new();
        };
        dir.filter_map(|e| std::fs::read(e.ok()?.path()).ok())
            .filter_map(|text| serde_json::from_slice(&text).ok())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endorsements_and_revocations_verify_with_the_ca_certificate_only() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ClusterCa::init(dir.path()).unwrap();
        let other = ClusterCa::init(&dir.path().join("other")).unwrap();
        let verifier = CaVerifier::new(ca.cert_pem()).unwrap();
        let request = crate::HostRequest::new("h1").unwrap();
        ca.issue_own("h1", &request.csr_pem, crate::DEFAULT_CERT_VALIDITY)
            .unwrap();
        assert!(ca.endorse_row_key("h2", &[1; 32]).is_err(), "never joined");
        let endorsement = ca.endorse_row_key("h1", &[1; 32]).unwrap();
        assert!(verifier.check_row_key("h1", &[1; 32], &endorsement));
        assert!(!verifier.check_row_key("h1", &[2; 32], &endorsement));
        assert!(!verifier.check_row_key("h10", &[1; 32], &endorsement));
        other
            .issue_own("h1", &request.csr_pem, crate::DEFAULT_CERT_VALIDITY)
            .unwrap();
        let foreign = other.endorse_row_key("h1", &[1; 32]).unwrap();
        assert!(!verifier.check_row_key("h1", &[1; 32], &foreign));

        let revocation = ca.revoke("h1").unwrap();
        assert!(verifier.check_revocation(&revocation));
        assert_eq!(ca.revoke("h1").unwrap(), revocation);
        assert_eq!(ca.revocations(), vec![revocation.clone()]);
        let mut forged = revocation.clone();
        forged.host_id = "h2".into();
        assert!(!verifier.check_revocation(&forged));
        assert!(!CaVerifier::new(other.cert_pem())
            .unwrap()
            .check_revocation(&revocation));
        assert!(ca.endorse_row_key("h1", &[1; 32]).is_err(), "revoked");
        let renewal = crate::HostRequest::new("h1").unwrap();
        assert!(ca
            .renew("h1", &renewal.csr_pem, crate::DEFAULT_CERT_VALIDITY)
            .is_err());
    }
}
