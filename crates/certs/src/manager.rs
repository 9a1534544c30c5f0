//! Certificates of app hostnames as the API sees them (add by ACME or PEM, list, show,
//! remove) and their renewal: by the owner at 2/3 of the certificate's life, or, when the
//! owner is down (dead or left in the catalog), by the live host with the lowest id.

use crate::acme::{self, AcmeConfig};
use crate::{attached, check_pem, current, key_aad, normalize_hostname, SEAL_PURPOSE};
use bazaar_catalog::{Catalog, CertificateRecord, CertificateView, HostStatus};
use bazaar_node::NodeHandle;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often every host looks for certificates to renew (reads the local catalog only).
const RENEW_TICK: Duration = Duration::from_secs(1);
/// A failed renewal is tried again after this long.
const RETRY_AFTER_MS: u64 = 60_000;
/// A pending issuance nobody is working on (its host restarted) is started again after this.
const STALE_PENDING_MS: u64 = 120_000;

/// Issuances running in this process, by (host id, hostname): one at a time per hostname.
static ISSUING: Mutex<Option<HashSet<(String, String)>>> = Mutex::new(None);

/// A certificate as the API shows it (the Machines API's wire type).
pub use bazaar_types::api::Certificate as CertInfo;

/// What the API shows of a certificate row.
fn cert_info(r: &CertificateRecord) -> CertInfo {
    let time = |ms: u64| (ms > 0).then(|| bazaar_types::rfc3339(ms));
    CertInfo {
        hostname: r.hostname.clone(),
        app: r.app.clone(),
        source: r.source.clone(),
        status: r.status.clone(),
        error: r.error.clone(),
        owner_host: r.host_id.clone(),
        not_before: time(r.not_before_ms),
        not_after: time(r.not_after_ms),
        created_at: bazaar_types::rfc3339(r.created_at_ms),
        updated_at: bazaar_types::rfc3339(r.updated_at_ms),
    }
}

/// Why a certificate cannot be added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertError {
    /// Bad input (400).
    Invalid(String),
    /// The hostname belongs to another app (409).
    Taken(String),
}

/// This host's handle on the cluster's certificates; cheap to clone.
#[derive(Clone, Debug)]
pub struct Certs {
    catalog: Catalog,
    host_id: String,
    seal: Arc<bazaar_seal::SealKey>,
    acme: Option<AcmeConfig>,
    /// The domain apps are served under (`<app>.<domain>`): of its names, an app may
    /// attach only its own.
    proxy_domain: String,
    /// The node's tracker, which issuances are spawned through.
    tasks: tokio_util::task::TaskTracker,
}

impl Certs {
    /// The node's certificates (its catalog, cluster secret and ACME settings).
    pub fn new(node: &NodeHandle) -> anyhow::Result<Certs> {
        let catalog = node
            .catalog()
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("certificates need the node's catalog"))?;
        let config = node.config();
        Ok(Certs {
            catalog,
            host_id: node.host_id().to_string(),
            proxy_domain: config
                .proxy_domain
                .trim_end_matches('.')
                .to_ascii_lowercase(),
            tasks: node.tasks().clone(),
            seal: Arc::new(bazaar_seal::SealKey::derive(
                node.cluster_secret().as_bytes(),
                SEAL_PURPOSE,
            )),
            acme: config.acme_directory.clone().map(|directory| AcmeConfig {
                directory,
                ca: config.acme_ca.clone(),
                account_file: config.data_dir.join("acme-account.json"),
            }),
        })
    }

    /// The certificates of `app`, by hostname.
    pub fn list(&self, app: &str) -> Vec<CertInfo> {
        let rows = self.catalog.certificates();
        let mut out: Vec<CertInfo> = attached(&self.catalog, &rows)
            .into_values()
            .filter(|v| v.record.app == app)
            .map(|v| cert_info(&v.record))
            .collect();
        out.sort_by(|a, b| a.hostname.cmp(&b.hostname));
        out
    }

    /// One hostname's certificate, if `app` has it.
    pub fn show(&self, app: &str, hostname: &str) -> Option<CertInfo> {
        let hostname = normalize_hostname(hostname).ok()?;
        let rows = self.catalog.certificates();
        let cur = attached(&self.catalog, &rows);
        cur.get(hostname.as_str())
            .filter(|v| v.record.app == app)
            .map(|v| cert_info(&v.record))
    }

    /// Checks that `hostname` may be (re)attached to `app`; returns it normalized and the
    /// app's id. Refused: a name under the proxy domain other than the app's own
    /// `<app>.<domain>` (another app's address, now or once it exists), and a hostname
    /// attached to another app.
    fn claim(&self, app: &str, hostname: &str) -> Result<(String, String), CertError> {
        let hostname = normalize_hostname(hostname).map_err(CertError::Invalid)?;
        let app_id = self
            .catalog
            .app(app)
            .map(|a| a.id)
            .ok_or_else(|| CertError::Invalid(format!("app {app} not found")))?;
        let domain = &self.proxy_domain;
        let under_domain = hostname == *domain
            || hostname
                .strip_suffix(domain.as_str())
                .is_some_and(|head| head.ends_with('.'));
        if under_domain && hostname != format!("{app}.{domain}") {
            return Err(CertError::Taken(format!(
                "hostname {hostname} is under the cluster's app domain {domain}, where app {app} may attach only its own name, {app}.{domain}"
            )));
        }
        let rows = self.catalog.certificates();
        if let Some(v) = attached(&self.catalog, &rows).get(hostname.as_str()) {
            if v.record.app_id != app_id {
                return Err(CertError::Taken(format!(
                    "hostname {hostname} already has a certificate of app {:?}",
                    v.record.app
                )));
            }
        }
        Ok((hostname, app_id))
    }

    /// Attaches `hostname` to `app` and issues its certificate by ACME in the background
    /// (`pending` until then, `issued` or `failed` after).
    pub fn add_acme(&self, app: &str, hostname: &str) -> Result<CertInfo, CertError> {
        let (hostname, app_id) = self.claim(app, hostname)?;
        let Some(acme) = self.acme.clone() else {
            return Err(CertError::Invalid(
                "this host has no ACME directory (agent flag --acme-directory); give the certificate as PEM (--cert, --key) instead".into(),
            ));
        };
        let now = bazaar_types::now_ms();
        let record = CertificateRecord {
            hostname: hostname.clone(),
            app: app.to_string(),
            app_id,
            host_id: self.host_id.clone(),
            source: "acme".into(),
            status: "pending".into(),
            created_at_ms: now,
            updated_at_ms: now,
            ..Default::default()
        };
        self.catalog.publish_certificate(record.clone());
        self.spawn_issue(acme, record.clone());
        Ok(cert_info(&record))
    }

    /// Looks at `hostname`'s certificate again (Fly's `certs check`): an ACME certificate
    /// whose issuance failed is issued again (`pending` until it ends); one that is issued,
    /// pending, or given as PEM is answered as it is. `Ok(None)` when `app` has no such
    /// hostname.
    pub fn check(&self, app: &str, hostname: &str) -> Result<Option<CertInfo>, CertError> {
        let Some(info) = self.show(app, hostname) else {
            return Ok(None);
        };
        if info.source == "acme" && info.status == "failed" {
            return self.add_acme(app, hostname).map(Some);
        }
        Ok(Some(info))
    }

    /// Attaches `hostname` to `app` with a certificate given by the user (PEM chain, leaf
    /// first, and its private key). It is not renewed.
    pub fn add_pem(
        &self,
        app: &str,
        hostname: &str,
        chain_pem: &str,
        key_pem: &str,
    ) -> Result<CertInfo, CertError> {
        let (hostname, app_id) = self.claim(app, hostname)?;
        let (not_before_ms, not_after_ms) =
            check_pem(chain_pem, key_pem, &hostname).map_err(CertError::Invalid)?;
        if not_after_ms <= bazaar_types::now_ms() {
            return Err(CertError::Invalid("the certificate has expired".into()));
        }
        let now = bazaar_types::now_ms();
        let record = CertificateRecord {
            hostname: hostname.clone(),
            app: app.to_string(),
            host_id: self.host_id.clone(),
            source: "custom".into(),
            status: "issued".into(),
            chain_pem: chain_pem.to_string(),
            sealed_key: self
                .seal
                .seal(&key_aad(app, &app_id, &hostname), key_pem.as_bytes()),
            app_id,
            not_before_ms,
            not_after_ms,
            created_at_ms: now,
            updated_at_ms: now,
            ..Default::default()
        };
        self.catalog.publish_certificate(record.clone());
        Ok(cert_info(&record))
    }

    /// Detaches `hostname` from `app`: every proxy stops serving it. `false` when `app`
    /// has no such hostname.
    pub fn remove(&self, app: &str, hostname: &str) -> bool {
        let Some(info) = self.show(app, hostname) else {
            return false;
        };
        self.catalog.delete_certificate(&info.hostname, app);
        true
    }

    /// Removes every hostname of `app` (being deleted): a tombstone of this host, newer
    /// than every row, for each, so every proxy stops serving them and each owner retires
    /// its own row (`Certs::renew_due`); a pending issuance publishes nothing. Rows of
    /// an earlier app of the name go too. Answers the hostnames removed.
    pub fn forget_app(&self, app: &str) -> Vec<String> {
        let rows = self.catalog.certificates();
        let mut gone: Vec<String> = current(&rows)
            .into_values()
            .filter(|v| v.record.app == app)
            .map(|v| v.record.hostname.clone())
            .collect();
        gone.sort();
        for hostname in &gone {
            self.catalog.delete_certificate(hostname, app);
        }
        gone
    }

    /// Issues `record`'s certificate in the background (one issuance per hostname at a
    /// time in this process) and publishes the outcome.
    fn spawn_issue(&self, acme: AcmeConfig, record: CertificateRecord) {
        let key = (self.host_id.clone(), record.hostname.clone());
        {
            let mut issuing = ISSUING.lock().unwrap_or_else(|p| p.into_inner());
            if !issuing.get_or_insert_with(HashSet::new).insert(key.clone()) {
                return;
            }
        }
        let certs = self.clone();
        self.tasks.spawn(async move {
            let outcome = acme::issue(&acme, &certs.catalog, &record.hostname).await;
            certs.publish_outcome(record, outcome);
            let mut issuing = ISSUING.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(set) = issuing.as_mut() {
                set.remove(&key);
            }
        });
    }

    fn issuing(&self, hostname: &str) -> bool {
        ISSUING
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|s| s.contains(&(self.host_id.clone(), hostname.to_string())))
    }

    /// Publishes an issuance's outcome as this host's row, unless the hostname was
    /// removed or attached elsewhere meanwhile. A failed renewal keeps the certificate
    /// being served and says why.
    fn publish_outcome(
        &self,
        mut record: CertificateRecord,
        outcome: anyhow::Result<acme::Issued>,
    ) {
        let rows = self.catalog.certificates();
        let still = attached(&self.catalog, &rows)
            .get(record.hostname.as_str())
            .is_some_and(|v| v.record.app_id == record.app_id);
        if !still {
            return;
        }
        record.host_id = self.host_id.clone();
        record.updated_at_ms = bazaar_types::now_ms();
        match outcome.and_then(|issued| {
            let (nb, na) = check_pem(&issued.chain_pem, &issued.key_pem, &record.hostname)
                .map_err(anyhow::Error::msg)?;
            Ok((issued, nb, na))
        }) {
            Ok((issued, not_before_ms, not_after_ms)) => {
                tracing::info!(hostname = %record.hostname, app = %record.app, "certificate issued");
                record.status = "issued".into();
                record.error = None;
                record.sealed_key = self.seal.seal(
                    &key_aad(&record.app, &record.app_id, &record.hostname),
                    issued.key_pem.as_bytes(),
                );
                record.chain_pem = issued.chain_pem;
                record.not_before_ms = not_before_ms;
                record.not_after_ms = not_after_ms;
            }
            Err(err) => {
                let why = format!("{err:#}");
                tracing::warn!(hostname = %record.hostname, error = %why, "certificate issuance failed");
                if record.status != "issued" {
                    record.status = "failed".into();
                }
                record.error = Some(why);
            }
        }
        self.catalog.publish_certificate(record);
    }

    /// One pass of the renewal loop at `now_ms`. `retry_at`: when failed renewals may be
    /// tried again, by hostname.
    fn renew_due(&self, now_ms: u64, retry_at: &mut HashMap<String, u64>) {
        let rows = self.catalog.certificates();
        let cur = current(&rows);
        // Own rows another host's newer row superseded (a takeover, a removal elsewhere).
        for v in &rows {
            let r = &v.record;
            if r.host_id == self.host_id && !v.deleted {
                let mine = cur
                    .get(r.hostname.as_str())
                    .is_some_and(|c| c.record.host_id == self.host_id);
                if !mine {
                    self.catalog.retire_certificate(&r.hostname);
                }
            }
        }
        let Some(acme) = self.acme.clone() else {
            return;
        };
        let renewer = lowest_live_host(&self.catalog);
        retry_at.retain(|_, at| *at > now_ms);
        // Only hostnames of live apps: a deleted app's are not renewed.
        for v in attached(&self.catalog, &rows).values() {
            let r = &v.record;
            if r.source != "acme" || !self.responsible(v, renewer.as_deref()) {
                continue;
            }
            let due = match r.status.as_str() {
                "issued" => {
                    let life = r.not_after_ms.saturating_sub(r.not_before_ms);
                    now_ms >= r.not_before_ms + life / 3 * 2
                }
                // Left unfinished by a host that went down or restarted.
                "pending" => {
                    r.host_id != self.host_id
                        || now_ms.saturating_sub(r.updated_at_ms) > STALE_PENDING_MS
                }
                _ => false,
            };
            if !due || retry_at.contains_key(&r.hostname) || self.issuing(&r.hostname) {
                continue;
            }
            tracing::info!(hostname = %r.hostname, owner = %r.host_id, "renewing a certificate");
            retry_at.insert(r.hostname.clone(), now_ms + RETRY_AFTER_MS);
            self.spawn_issue(acme.clone(), r.clone());
        }
    }

    /// Whether this host renews `v`: its owner while the owner is up; else the live host
    /// with the lowest id.
    fn responsible(&self, v: &CertificateView, renewer: Option<&str>) -> bool {
        let owner_down = matches!(v.host_status, HostStatus::Dead | HostStatus::Left);
        if v.record.host_id == self.host_id {
            return true;
        }
        owner_down && renewer == Some(self.host_id.as_str())
    }
}

/// The live host with the lowest id.
fn lowest_live_host(catalog: &Catalog) -> Option<String> {
    catalog
        .hosts()
        .into_iter()
        .filter(|h| h.status == HostStatus::Alive)
        .map(|h| h.record.id)
        .min()
}

/// Runs the renewal loop of this host until the node shuts down.
pub fn spawn_renewal(node: &NodeHandle) -> anyhow::Result<()> {
    let certs = Certs::new(node)?;
    let shutdown = node.shutdown_token();
    node.spawn(async move {
        let mut retry_at = HashMap::new();
        let mut tick = tokio::time::interval(RENEW_TICK);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = tick.tick() => certs.renew_due(bazaar_types::now_ms(), &mut retry_at),
            }
        }
    });
    Ok(())
}
