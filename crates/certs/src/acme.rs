//! Issuing one certificate by ACME (instant-acme), with the HTTP-01 challenge answered
//! by every proxy of the cluster from a catalog row.

use anyhow::{anyhow, bail, Context};
use bazaar_catalog::{Catalog, ChallengeRecord};
use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, ChallengeType, Identifier, NewAccount,
    NewOrder, OrderStatus, RetryPolicy,
};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where certificates come from.
#[derive(Debug, Clone)]
pub struct AcmeConfig {
    /// The directory URL.
    pub directory: String,
    /// Roots the directory's HTTPS is checked against (PEM); `None`: the system's.
    pub ca: Option<PathBuf>,
    /// Where this host keeps its ACME account (`DATA/acme-account.json`).
    pub account_file: PathBuf,
}

/// How long the challenge row is given to reach every host before the ACME server is told
/// to validate (gossip takes milliseconds; anti-entropy repairs within 2 s).
const SPREAD: Duration = Duration::from_millis(500);

/// An issued certificate: the chain (leaf first) and its private key, PEM.
pub struct Issued {
    pub chain_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued").finish_non_exhaustive()
    }
}

/// Issues a certificate for `hostname`. Every ACME error comes back with the server's
/// words (the challenge's problem when validation failed).
pub async fn issue(cfg: &AcmeConfig, catalog: &Catalog, hostname: &str) -> anyhow::Result<Issued> {
    let account = account(cfg).await?;
    let ids = [Identifier::Dns(hostname.to_string())];
    let mut order = account
        .new_order(&NewOrder::new(&ids))
        .await
        .context("creating the ACME order")?;
    let mut tokens = Vec::new();
    let result = async {
        let mut authorizations = order.authorizations();
        while let Some(authz) = authorizations.next().await {
            let mut authz = authz.context("reading the ACME authorization")?;
            if authz.status == AuthorizationStatus::Valid {
                continue;
            }
            let mut challenge = authz
                .challenge(ChallengeType::Http01)
                .ok_or_else(|| anyhow!("the ACME server offers no http-01 challenge"))?;
            let token = challenge.token.clone();
            catalog.publish_challenge(ChallengeRecord {
                token: token.clone(),
                key_authorization: challenge.key_authorization().as_str().to_string(),
                hostname: hostname.to_string(),
                host_id: String::new(),
                created_at_ms: bazaar_types::now_ms(),
            });
            tokens.push(token);
            tokio::time::sleep(SPREAD).await;
            challenge
                .set_ready()
                .await
                .context("telling the ACME server the challenge is ready")?;
        }
        let retry = RetryPolicy::new()
            .initial_delay(Duration::from_millis(100))
            .backoff(1.5)
            .timeout(Duration::from_secs(90));
        let status = order.poll_ready(&retry).await.map_err(acme_error)?;
        if status != OrderStatus::Ready {
            bail!("{}", challenge_problem(&mut order).await);
        }
        let key = rcgen::KeyPair::generate().context("making a key")?;
        let mut params = rcgen::CertificateParams::new(vec![hostname.to_string()])
            .context("certificate parameters")?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        let csr = params.serialize_request(&key).context("making the CSR")?;
        order
            .finalize_csr(csr.der())
            .await
            .map_err(acme_error)
            .context("finalizing the ACME order")?;
        let chain_pem = order
            .poll_certificate(&retry)
            .await
            .map_err(acme_error)
            .context("fetching the certificate")?;
        Ok(Issued {
            chain_pem,
            key_pem: key.serialize_pem(),
        })
    }
    .await;
    for token in tokens {
        catalog.delete_challenge(&token);
    }
    result
}

/// Why an invalid order failed: the problem of its failed challenge.
async fn challenge_problem(order: &mut instant_acme::Order) -> String {
    let mut why = Vec::new();
    let mut authorizations = order.authorizations();
    while let Some(Ok(mut authz)) = authorizations.next().await {
        let _ = authz.refresh().await;
        for c in &authz.challenges {
            if let Some(p) = &c.error {
                why.push(problem_text(p));
            }
        }
    }
    if why.is_empty() {
        "the ACME order became invalid".into()
    } else {
        format!("ACME validation failed: {}", why.join("; "))
    }
}

fn problem_text(p: &instant_acme::Problem) -> String {
    match (&p.detail, &p.r#type) {
        (Some(d), Some(t)) => format!("{d} ({t})"),
        (Some(d), None) => d.clone(),
        (None, Some(t)) => t.clone(),
        (None, None) => "unknown problem".into(),
    }
}

fn acme_error(err: instant_acme::Error) -> anyhow::Error {
    match err {
        instant_acme::Error::Api(p) => anyhow!("ACME server: {}", problem_text(&p)),
        other => anyhow!("ACME: {other}"),
    }
}

/// This host's ACME account at the directory: read from `account_file`, or registered
/// and saved there (0600).
async fn account(cfg: &AcmeConfig) -> anyhow::Result<Account> {
    let builder = || match &cfg.ca {
        Some(ca) => Account::builder_with_root(ca)
            .with_context(|| format!("reading the ACME CA {}", ca.display())),
        None => Account::builder().context("the ACME HTTP client"),
    };
    if let Some(creds) = read_account(&cfg.account_file, &cfg.directory) {
        if let Ok(account) = builder()?.from_credentials(creds).await {
            return Ok(account);
        }
    }
    let (account, creds) = builder()?
        .create(
            &NewAccount {
                contact: &[],
                terms_of_service_agreed: true,
                only_return_existing: false,
            },
            cfg.directory.clone(),
            None,
        )
        .await
        .map_err(acme_error)
        .with_context(|| format!("registering an ACME account at {}", cfg.directory))?;
    let saved = serde_json::json!({ "directory": cfg.directory, "credentials": creds });
    if let Err(err) = bazaar_node::secrets::write_private(
        &cfg.account_file,
        &serde_json::to_string(&saved).unwrap_or_default(),
    ) {
        tracing::warn!(error = %err, "saving the ACME account");
    }
    Ok(account)
}

fn read_account(path: &Path, directory: &str) -> Option<AccountCredentials> {
    let text = std::fs::read_to_string(path).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    (v.get("directory")?.as_str()? == directory)
        .then(|| serde_json::from_value(v.get("credentials")?.clone()).ok())
        .flatten()
}
