//! A host's identity: its own key (made on the host, never sent), the certificate the CA
//! issued for it and the CA certificate it trusts, kept in `DATA/tls/`: `host.pem` (the
//! certificate and the key, one file replaced atomically, 0600) and `ca.crt`.

use crate::{host_dns_name, write_private};
use anyhow::Context;
use rcgen::{CertificateParams, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The file of a host's certificate and key in its `DATA/tls`.
pub const HOST_FILE: &str = "host.pem";

fn pem_encode(label: &str, der: &[u8]) -> String {
    use base64::Engine;
    let text = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in text.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// The certificates in a PEM text, DER.
pub(crate) fn pem_certs(pem: &str) -> anyhow::Result<Vec<Vec<u8>>> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .map(|c| {
            c.map(|c| c.to_vec())
                .map_err(|e| anyhow::anyhow!("bad PEM: {e:?}"))
        })
        .collect()
}

/// A new key for `host_id` and the certificate request that carries its public half.
pub struct HostRequest {
    host_id: String,
    key: KeyPair,
    /// The request (PEM) to send to the CA.
    pub csr_pem: String,
}

impl std::fmt::Debug for HostRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostRequest")
            .field("host_id", &self.host_id)
            .finish_non_exhaustive()
    }
}

impl HostRequest {
    /// Makes a key and a request naming `host_id`.
    pub fn new(host_id: &str) -> anyhow::Result<Self> {
        let key = KeyPair::generate()?;
        let csr_pem = CertificateParams::new(vec![host_dns_name(host_id)])?
            .serialize_request(&key)?
            .pem()?;
        Ok(Self {
            host_id: host_id.to_string(),
            key,
            csr_pem,
        })
    }

    /// The identity made of this key and the certificate the CA answered; refused unless
    /// the certificate is for this key, names this host and is signed by `ca_pem`.
    pub fn into_identity(self, cert_pem: &str, ca_pem: &str) -> anyhow::Result<HostIdentity> {
        HostIdentity::new(
            &self.host_id,
            self.key.serialize_pem(),
            cert_pem.to_string(),
            ca_pem.to_string(),
        )
    }
}

/// A host's key, certificate and CA, checked to belong together.
#[derive(Clone)]
pub struct HostIdentity {
    host_id: String,
    key_pem: String,
    cert_pem: String,
    ca_pem: String,
    not_after: SystemTime,
    lifetime: Duration,
}

impl std::fmt::Debug for HostIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostIdentity")
            .field("host_id", &self.host_id)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl HostIdentity {
    fn new(
        host_id: &str,
        key_pem: String,
        cert_pem: String,
        ca_pem: String,
    ) -> anyhow::Result<Self> {
        let cert_der = pem_certs(&cert_pem)?
            .into_iter()
            .next()
            .context("no certificate")?;
        let ca_der = pem_certs(&ca_pem)?
            .into_iter()
            .next()
            .context("no CA certificate")?;
        crate::tls::verify_host_cert(&cert_der, &ca_der, host_id)?;
        let (_, cert) = x509_parser::parse_x509_certificate(&cert_der)
            .map_err(|e| anyhow::anyhow!("parsing the host certificate: {e}"))?;
        let secs = |t: x509_parser::time::ASN1Time| {
            UNIX_EPOCH + Duration::from_secs(t.timestamp().max(0) as u64)
        };
        let not_before = secs(cert.validity().not_before);
        let not_after = secs(cert.validity().not_after);
        let identity = Self {
            host_id: host_id.to_string(),
            key_pem,
            cert_pem,
            ca_pem,
            not_after,
            lifetime: not_after.duration_since(not_before).unwrap_or_default(),
        };
        // The key must be the certificate's.
        identity.certified_key()?.keys_match()?;
        Ok(identity)
    }

    /// Reads the identity kept in `dir` (`DATA/tls`), if there is one.
    pub fn load(dir: &Path, host_id: &str) -> anyhow::Result<Option<Self>> {
        let read = |name: &str| std::fs::read_to_string(dir.join(name));
        match (read(HOST_FILE), read("ca.crt")) {
            (Ok(host), Ok(ca)) => {
                let cert = pem_certs(&host)?
                    .into_iter()
                    .map(|der| pem_encode("CERTIFICATE", &der))
                    .collect::<String>();
                let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(host.as_bytes())
                    .map_err(|e| anyhow::anyhow!("{HOST_FILE}: {e:?}"))?;
                let key = pem_encode("PRIVATE KEY", key.secret_der());
                Ok(Some(Self::new(host_id, key, cert, ca).with_context(
                    || format!("the host certificate in {}", dir.display()),
                )?))
            }
            (Err(e), _) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            (Err(e), _) | (_, Err(e)) => Err(anyhow::anyhow!("reading {}: {e}", dir.display())),
        }
    }

    /// Keeps the identity in `dir` (created 0700): certificate and key in one file,
    /// replaced atomically (0600), so a crash leaves the old pair or the new one.
    pub fn save(&self, dir: &Path) -> anyhow::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        write_private(&dir.join("ca.crt"), self.ca_pem.as_bytes())?;
        let both = format!("{}{}", self.cert_pem, self.key_pem);
        write_private(&dir.join(HOST_FILE), both.as_bytes())?;
        Ok(())
    }

    /// The host this identity names.
    pub fn host_id(&self) -> &str {
        &self.host_id
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// When the certificate expires.
    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }

    /// When to renew: once two thirds of the certificate's life have passed.
    pub fn renew_at(&self) -> SystemTime {
        self.not_after - self.lifetime / 3
    }

    /// The key and certificate chain (host, then CA) as rustls uses them.
    pub fn certified_key(&self) -> anyhow::Result<rustls::sign::CertifiedKey> {
        use rustls::pki_types::PrivateKeyDer;
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())
            .map_err(|e| anyhow::anyhow!("the host key: {e:?}"))?;
        let chain = pem_certs(&self.cert_pem)?
            .into_iter()
            .chain(pem_certs(&self.ca_pem)?)
            .map(CertificateDer::from)
            .collect();
        Ok(rustls::sign::CertifiedKey::from_der(
            chain,
            key,
            &crate::tls::provider(),
        )?)
    }
}
