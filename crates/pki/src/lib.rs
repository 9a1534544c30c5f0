//! bazaar's cluster identity: the cluster CA (`ca.rs`: made by `bazaar cluster init`, its
//! key never leaves the CA's directory), one-time join tokens that pin the CA by
//! fingerprint (`token.rs`, as kubeadm's discovery hash), a host's own key and certificate
//! naming its host id (`host.rs`), and the rustls configs hosts use between themselves
//! (`tls.rs`: a peer must present a certificate the CA signed, and is known by the host id
//! it names; the catalog's sync takes any host of the CA and binds it to the rows it sends),
//! and what the CA signs besides certificates (`authority.rs`: the catalog key of each host,
//! revocations of hosts). Pure but for the files of the CA's directory and of a host's
//! `DATA/tls/`.
#![forbid(unsafe_code)]

mod authority;
mod ca;
mod host;
mod tls;
mod token;

pub use authority::{CaVerifier, Revocation};
pub use ca::{ClusterCa, DEFAULT_CERT_VALIDITY};
pub use host::{HostIdentity, HostRequest, HOST_FILE};
pub use tls::{
    catalog_client_config, catalog_server_config, client_config, join_client_config, peer_host_id,
    peer_server_config, server_config, IdentityHandle,
};
pub use token::JoinToken;

/// The DNS name a host certificate carries for `host_id`; the only subject name the CA
/// issues, so a certificate names exactly one host.
pub fn host_dns_name(host_id: &str) -> String {
    format!("{host_id}.{HOST_NAME_SUFFIX}")
}

/// The domain under which host certificates name hosts.
pub const HOST_NAME_SUFFIX: &str = "hosts.bazaar.internal";

/// Whether `host_id` can be put into a certificate name (a DNS label: lowercase letters,
/// digits and `-`, 1 to 63 characters).
pub fn valid_host_id(host_id: &str) -> bool {
    !host_id.is_empty()
        && host_id.len() <= 63
        && host_id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !host_id.starts_with('-')
        && !host_id.ends_with('-')
}

/// SHA-256 of a certificate's DER bytes, in hex: how a join token names the CA.
pub fn fingerprint(der: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(der))
}

/// The fingerprint of the (first) certificate of a PEM text.
pub fn ca_fingerprint(ca_pem: &str) -> anyhow::Result<String> {
    let der = host::pem_certs(ca_pem)?;
    Ok(fingerprint(
        der.first()
            .ok_or_else(|| anyhow::anyhow!("no certificate"))?,
    ))
}

/// The host id the (first) certificate of a PEM text names, e.g. of `DATA/tls/host.pem`.
pub fn host_id_of_pem(pem: &str) -> Option<String> {
    let der = host::pem_certs(pem).ok()?.into_iter().next()?;
    peer_host_id(&[rustls::pki_types::CertificateDer::from(der)])
}

/// Writes `contents` to `path` readable by its owner only (0600), replacing it atomically.
pub fn write_private(path: &std::path::Path, contents: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", tmp.display()))?;
    file.write_all(contents)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path).map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_ids_that_fit_a_dns_label() {
        assert!(valid_host_id("a1b2"));
        assert!(valid_host_id("host-1"));
        assert!(!valid_host_id(""));
        assert!(!valid_host_id("Host"));
        assert!(!valid_host_id("a.b"));
        assert!(!valid_host_id("-a"));
        assert!(!valid_host_id(&"a".repeat(64)));
    }
}
