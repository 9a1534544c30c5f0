//! The cluster CA: a directory (`bazaar cluster init --dir D`) holding its certificate
//! (`ca.crt`), its key (`ca.key`, 0600, never sent anywhere), the join tokens it has made
//! (`join-tokens/<hash of secret>.json`, renamed to `.used` when redeemed) and the host ids it
//! has issued certificates to (`hosts/<host id>`), so a joining host cannot take the id of
//! one that is already in the cluster, and the hosts it revoked (`revoked/<host id>.json`,
//! see [`crate::authority`]), which it no longer renews.

use crate::{host_dns_name, valid_host_id, write_private, JoinToken};
use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long a host certificate is valid unless the CA is told otherwise.
pub const DEFAULT_CERT_VALIDITY: Duration = Duration::from_secs(30 * 24 * 3600);

/// How long the CA's own certificate is valid.
const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Certificates start a little in the past, so hosts whose clocks lag accept them.
const BACKDATE: Duration = Duration::from_secs(300);

/// An opened cluster CA.
pub struct ClusterCa {
    pub(crate) dir: PathBuf,
    cert_pem: String,
    cert_der: Vec<u8>,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for ClusterCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterCa")
            .field("dir", &self.dir)
            .field("fingerprint", &self.fingerprint())
            .finish_non_exhaustive()
    }
}

/// What `join-tokens/<id>.json` says about a token.
#[derive(serde::Serialize, serde::Deserialize)]
struct TokenRecord {
    expires_unix: u64,
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl ClusterCa {
    /// Makes a new CA in `dir` (created if missing). Refuses a directory that already holds
    /// one: overwriting it would cut every host off the cluster.
    pub fn init(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        anyhow::ensure!(
            !dir.join("ca.key").exists(),
            "{} already holds a cluster CA",
            dir.display()
        );
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, "bazaar cluster CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - BACKDATE;
        params.not_after = now + CA_VALIDITY;
        params.serial_number = Some(random_serial());
        let cert = params.self_signed(&key)?;
        write_private(&dir.join("ca.key"), key.serialize_pem().as_bytes())?;
        std::fs::write(dir.join("ca.crt"), cert.pem())?;
        Self::open(dir)
    }

    /// Opens the CA in `dir`.
    pub fn open(dir: &Path) -> anyhow::Result<Self> {
        let cert_pem = std::fs::read_to_string(dir.join("ca.crt")).with_context(|| {
            format!(
                "reading {}/ca.crt (run `bazaar cluster init`)",
                dir.display()
            )
        })?;
        let key_pem = std::fs::read_to_string(dir.join("ca.key"))
            .with_context(|| format!("reading {}/ca.key", dir.display()))?;
        let key = KeyPair::from_pem(&key_pem).context("ca.key")?;
        let cert_der = crate::host::pem_certs(&cert_pem)?
            .into_iter()
            .next()
            .context("ca.crt holds no certificate")?;
        let issuer = Issuer::from_ca_cert_pem(&cert_pem, key).context("ca.crt")?;
        Ok(Self {
            dir: dir.to_path_buf(),
            cert_pem,
            cert_der,
            issuer,
        })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// SHA-256 of the CA certificate: what join tokens pin.
    pub fn fingerprint(&self) -> String {
        crate::fingerprint(&self.cert_der)
    }

    /// Makes a join token valid for `ttl` and redeemable once.
    pub fn new_join_token(&self, ttl: Duration) -> anyhow::Result<JoinToken> {
        let token = JoinToken::new(&self.fingerprint());
        let dir = self.dir.join("join-tokens");
        std::fs::create_dir_all(&dir)?;
        let record = TokenRecord {
            expires_unix: now_unix() + ttl.as_secs(),
        };
        write_private(
            &dir.join(format!("{}.json", token.id())),
            &serde_json::to_vec(&record)?,
        )?;
        Ok(token)
    }

    /// Redeems `token` once: a second use, an unknown token, a token of another CA or an
    /// expired one is refused. The rename makes two concurrent joins with one token fail
    /// but for one.
    fn redeem(&self, token: &JoinToken) -> anyhow::Result<()> {
        anyhow::ensure!(
            token.ca_fingerprint == self.fingerprint(),
            "the join token names another cluster CA"
        );
        let dir = self.dir.join("join-tokens");
        let fresh = dir.join(format!("{}.json", token.id()));
        let used = dir.join(format!("{}.used", token.id()));
        std::fs::rename(&fresh, &used)
            .map_err(|_| anyhow::anyhow!("the join token is unknown or was already used"))?;
        let record: TokenRecord = serde_json::from_slice(&std::fs::read(&used)?)?;
        anyhow::ensure!(
            now_unix() < record.expires_unix,
            "the join token has expired"
        );
        Ok(())
    }

    /// A new host joins: checks its request and host id, redeems `token`, and returns its
    /// certificate (PEM), valid for `validity`. The host id must be new to this CA.
    pub fn join(
        &self,
        token: &JoinToken,
        host_id: &str,
        csr_pem: &str,
        validity: Duration,
    ) -> anyhow::Result<String> {
        let request = self.check_request(host_id, csr_pem)?;
        anyhow::ensure!(
            !self.host_marker(host_id).exists(),
            "host {host_id} already has a certificate of this cluster"
        );
        self.redeem(token)?;
        let hosts = self.dir.join("hosts");
        std::fs::create_dir_all(&hosts)?;
        std::fs::write(self.host_marker(host_id), now_unix().to_string())?;
        self.issue(request, host_id, validity)
    }

    /// A host already in the cluster (the caller checked that it presented a valid
    /// certificate naming `host_id`) gets a new certificate for a new key.
    pub fn renew(
        &self,
        host_id: &str,
        csr_pem: &str,
        validity: Duration,
    ) -> anyhow::Result<String> {
        let request = self.check_request(host_id, csr_pem)?;
        anyhow::ensure!(
            self.host_marker(host_id).exists(),
            "host {host_id} never joined this cluster"
        );
        self.ensure_not_revoked(host_id)?;
        self.issue(request, host_id, validity)
    }

    /// A certificate for this CA's own host (the one that holds the CA directory), without
    /// a token.
    pub fn issue_own(
        &self,
        host_id: &str,
        csr_pem: &str,
        validity: Duration,
    ) -> anyhow::Result<String> {
        let request = self.check_request(host_id, csr_pem)?;
        let hosts = self.dir.join("hosts");
        std::fs::create_dir_all(&hosts)?;
        std::fs::write(self.host_marker(host_id), now_unix().to_string())?;
        self.issue(request, host_id, validity)
    }

    /// A server certificate for the Machines API of `host_id` (`--api-tls`): its host name,
    /// `localhost` and the addresses `ips`; server auth only, so it cannot pass for a host
    /// between hosts. The caller checked that the request comes from `host_id` and that the
    /// addresses are its own.
    pub fn issue_api(
        &self,
        host_id: &str,
        csr_pem: &str,
        ips: &[std::net::IpAddr],
        validity: Duration,
    ) -> anyhow::Result<String> {
        let request = self.check_request(host_id, csr_pem)?;
        anyhow::ensure!(
            self.host_marker(host_id).exists(),
            "host {host_id} never joined this cluster"
        );
        self.ensure_not_revoked(host_id)?;
        let mut names = vec![
            SanType::DnsName(host_dns_name(host_id).try_into()?),
            SanType::DnsName("localhost".try_into()?),
        ];
        names.extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, host_id);
        params.subject_alt_names = names;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign_certificate(request, params, validity)
    }

    pub(crate) fn host_marker(&self, host_id: &str) -> PathBuf {
        self.dir.join("hosts").join(host_id)
    }

    /// The request's signature proves the host holds the key; nothing else in it is used:
    /// the CA alone decides what the certificate says.
    fn check_request(
        &self,
        host_id: &str,
        csr_pem: &str,
    ) -> anyhow::Result<CertificateSigningRequestParams> {
        anyhow::ensure!(valid_host_id(host_id), "invalid host id {host_id:?}");
        CertificateSigningRequestParams::from_pem(csr_pem)
            .map_err(|e| anyhow::anyhow!("invalid certificate request: {e}"))
    }

    fn issue(
        &self,
        request: CertificateSigningRequestParams,
        host_id: &str,
        validity: Duration,
    ) -> anyhow::Result<String> {
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, host_id);
        params.subject_alt_names = vec![SanType::DnsName(host_dns_name(host_id).try_into()?)];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        self.sign_certificate(request, params, validity)
    }

    fn sign_certificate(
        &self,
        request: CertificateSigningRequestParams,
        mut params: CertificateParams,
        validity: Duration,
    ) -> anyhow::Result<String> {
        params.use_authority_key_identifier_extension = true;
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - BACKDATE;
        params.not_after = now + validity;
        params.serial_number = Some(random_serial());
        let signed = CertificateSigningRequestParams {
            params,
            public_key: request.public_key,
        }
        .signed_by(&self.issuer)?;
        Ok(signed.pem())
    }
}

fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] &= 0x7f; // positive
    SerialNumber::from_slice(&bytes)
}
