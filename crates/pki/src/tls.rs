//! rustls configs between hosts. A host serves and connects with the certificate in its
//! [`IdentityHandle`] (swapped on renewal: new connections use the new one); it trusts only
//! certificates the cluster CA signed, and when it connects to a host it checks that the
//! certificate names that host. A joining host, which has no certificate yet, trusts a
//! server whose chain holds the CA its token pins ([`join_client_config`]).

use crate::{host::pem_certs, host_dns_name, HostIdentity, HOST_NAME_SUFFIX};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use std::sync::{Arc, RwLock};

/// The crypto provider (aws-lc-rs, already built for the registry client).
pub(crate) fn provider() -> CryptoProvider {
    rustls::crypto::aws_lc_rs::default_provider()
}

fn roots(ca_pem: &str) -> anyhow::Result<Arc<RootCertStore>> {
    let mut roots = RootCertStore::empty();
    for der in pem_certs(ca_pem)? {
        roots.add(CertificateDer::from(der))?;
    }
    anyhow::ensure!(!roots.is_empty(), "no CA certificate");
    Ok(Arc::new(roots))
}

/// Checks that `cert` is signed by `ca` (and valid now) and names `host_id`.
pub(crate) fn verify_host_cert(cert: &[u8], ca: &[u8], host_id: &str) -> anyhow::Result<()> {
    let mut roots = RootCertStore::empty();
    roots.add(CertificateDer::from(ca.to_vec()))?;
    let cert = CertificateDer::from(cert.to_vec());
    let parsed = ParsedCertificate::try_from(&cert)?;
    rustls::client::verify_server_cert_signed_by_trust_anchor(
        &parsed,
        &roots,
        &[],
        UnixTime::now(),
        provider().signature_verification_algorithms.all,
    )?;
    rustls::client::verify_server_name(&parsed, &ServerName::try_from(host_dns_name(host_id))?)?;
    Ok(())
}

/// The host id a peer's certificate names. Only meaningful for a chain the TLS handshake
/// verified against the CA.
pub fn peer_host_id(chain: &[CertificateDer<'_>]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(chain.first()?).ok()?;
    let san = cert.subject_alternative_name().ok()??;
    san.value.general_names.iter().find_map(|name| match name {
        x509_parser::extensions::GeneralName::DNSName(dns) => dns
            .strip_suffix(HOST_NAME_SUFFIX)
            .and_then(|id| id.strip_suffix('.'))
            .filter(|id| crate::valid_host_id(id))
            .map(str::to_string),
        _ => None,
    })
}

/// This host's current key and certificate, shared by every TLS config of the host and
/// replaced when the certificate is renewed.
#[derive(Clone)]
pub struct IdentityHandle(Arc<RwLock<Arc<CertifiedKey>>>);

impl std::fmt::Debug for IdentityHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdentityHandle")
    }
}

impl IdentityHandle {
    /// A handle holding `identity`.
    pub fn new(identity: &HostIdentity) -> anyhow::Result<Self> {
        Ok(Self(Arc::new(RwLock::new(Arc::new(
            identity.certified_key()?,
        )))))
    }

    /// New connections from now on use `identity`.
    pub fn replace(&self, identity: &HostIdentity) -> anyhow::Result<()> {
        let key = Arc::new(identity.certified_key()?);
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = key;
        Ok(())
    }

    fn current(&self) -> Arc<CertifiedKey> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl rustls::server::ResolvesServerCert for IdentityHandle {
    fn resolve(&self, _: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

impl rustls::client::ResolvesClientCert for IdentityHandle {
    fn resolve(&self, _: &[&[u8]], _: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// The server side of the host listener: presents this host's certificate; a client
/// certificate, when sent, must be signed by the CA (the handshake fails otherwise). A
/// client without one still connects (to join); what it may call is decided per request
/// from [`peer_host_id`].
pub fn server_config(identity: &IdentityHandle, ca_pem: &str) -> anyhow::Result<Arc<ServerConfig>> {
    let provider = Arc::new(provider());
    let verifier = WebPkiClientVerifier::builder_with_provider(roots(ca_pem)?, provider.clone())
        .allow_unauthenticated()
        .build()?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(identity.clone()));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The client side between hosts: presents this host's certificate and accepts a server
/// only with a certificate the CA signed for the host name connected to
/// ([`host_dns_name`] of the host meant).
pub fn client_config(identity: &IdentityHandle, ca_pem: &str) -> anyhow::Result<Arc<ClientConfig>> {
    let mut config = ClientConfig::builder_with_provider(Arc::new(provider()))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots(ca_pem)?)
        .with_client_cert_resolver(Arc::new(identity.clone()));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// ALPN of the catalog's anti-entropy over mTLS.
const CATALOG_ALPN: &[u8] = b"bazaar-catalog/1";

/// The server side of the catalog's anti-entropy: a client must present a certificate the
/// CA signed (the handshake fails otherwise); its host id is then [`peer_host_id`].
pub fn catalog_server_config(
    identity: &IdentityHandle,
    ca_pem: &str,
) -> anyhow::Result<Arc<ServerConfig>> {
    let provider = Arc::new(provider());
    let verifier =
        WebPkiClientVerifier::builder_with_provider(roots(ca_pem)?, provider.clone()).build()?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(identity.clone()));
    config.alpn_protocols = vec![CATALOG_ALPN.to_vec()];
    Ok(Arc::new(config))
}

/// The client side of the catalog's anti-entropy: presents this host's certificate and
/// accepts any server whose certificate the CA signed for some host (a sync peer is known
/// by its gossip address only; the caller binds the host id the certificate names,
/// [`peer_host_id`], to the rows the peer sends).
pub fn catalog_client_config(
    identity: &IdentityHandle,
    ca_pem: &str,
) -> anyhow::Result<Arc<ClientConfig>> {
    let provider = Arc::new(provider());
    let verifier = AnyHostOfCa {
        roots: roots(ca_pem)?,
        provider: provider.clone(),
    };
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_client_cert_resolver(Arc::new(identity.clone()));
    config.alpn_protocols = vec![CATALOG_ALPN.to_vec()];
    Ok(Arc::new(config))
}

/// Trusts a server certificate the CA signed that names a host, whichever.
/// The handshake-signature methods of a [`ServerCertVerifier`] whose `provider` field holds
/// the crypto provider: the same for every verifier here, which differ only in which
/// certificates they trust.
macro_rules! signature_checks_of_provider {
    () => {
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                message,
                cert,
                dss,
                &self.provider.signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                message,
                cert,
                dss,
                &self.provider.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.provider
                .signature_verification_algorithms
                .supported_schemes()
        }
    };
}

#[derive(Debug)]
struct AnyHostOfCa {
    roots: Arc<RootCertStore>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for AnyHostOfCa {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &ParsedCertificate::try_from(end_entity)?,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        if peer_host_id(std::slice::from_ref(end_entity)).is_none() {
            return Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName,
            ));
        }
        Ok(ServerCertVerified::assertion())
    }

    signature_checks_of_provider!();
}

/// The client side of a join (`identity` `None`: nothing to present) or a renewal (the
/// current certificate): the server's chain must hold the CA whose fingerprint the join
/// token carries, and its certificate must be signed by it, whichever host it names.
pub fn join_client_config(
    ca_fingerprint: &str,
    identity: Option<&IdentityHandle>,
) -> anyhow::Result<Arc<ClientConfig>> {
    let provider = Arc::new(provider());
    let verifier = PinnedCa {
        fingerprint: ca_fingerprint.to_string(),
        provider: provider.clone(),
    };
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier));
    let mut config = match identity {
        Some(identity) => builder.with_client_cert_resolver(Arc::new(identity.clone())),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Trusts the CA found in the server's chain whose fingerprint is pinned, and nothing else.
#[derive(Debug)]
struct PinnedCa {
    fingerprint: String,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for PinnedCa {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let ca = intermediates
            .iter()
            .find(|c| crate::fingerprint(c) == self.fingerprint)
            .ok_or(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer,
            ))?;
        let mut roots = RootCertStore::empty();
        roots.add(ca.clone().into_owned())?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &ParsedCertificate::try_from(end_entity)?,
            &roots,
            &[],
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        Ok(ServerCertVerified::assertion())
    }

    signature_checks_of_provider!();
}

/// The server side of a listener only hosts may use (the proxy's hop listener): presents
/// this host's certificate and refuses, in the handshake, a client without a certificate
/// the CA signed. The peer's host id is then [`peer_host_id`] of its chain.
pub fn peer_server_config(
    identity: &IdentityHandle,
    ca_pem: &str,
) -> anyhow::Result<Arc<ServerConfig>> {
    let provider = Arc::new(provider());
    let verifier =
        WebPkiClientVerifier::builder_with_provider(roots(ca_pem)?, provider.clone()).build()?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(identity.clone()));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
