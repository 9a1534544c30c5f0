//! What a proxy serves: the certificate of each app hostname, read from the catalog's
//! certificate rows of live apps ([`crate::attached`]) and rebuilt when they or the apps
//! change, as rustls's certificate resolver (SNI), and which app a hostname routes to.

use crate::{attached, open_row, SEAL_PURPOSE};
use bazaar_catalog::{Catalog, Change};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// One hostname as served.
#[derive(Debug, Clone)]
struct Served {
    app: String,
    /// Issued (or given) and opened; `None` while pending or failed.
    key: Option<Arc<CertifiedKey>>,
    not_after_ms: u64,
    /// Which row it was read from (a key is reopened only when the row changed).
    row: (String, u64),
}

/// The certificates every proxy thread reads; cheap to clone.
#[derive(Clone)]
pub struct CertStore {
    catalog: Catalog,
    seal: Arc<bazaar_seal::SealKey>,
    served: Arc<RwLock<Arc<HashMap<String, Served>>>>,
}

impl std::fmt::Debug for CertStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertStore").finish_non_exhaustive()
    }
}

impl CertStore {
    /// A store of `catalog`'s certificates, opened with the key derived from
    /// `cluster_secret`; kept up to date until `shutdown` by a task of `tasks` (must be
    /// called in a runtime).
    pub fn start(
        catalog: Catalog,
        cluster_secret: &str,
        shutdown: tokio_util::sync::CancellationToken,
        tasks: &tokio_util::task::TaskTracker,
    ) -> CertStore {
        let store = CertStore {
            catalog,
            seal: Arc::new(bazaar_seal::SealKey::derive(
                cluster_secret.as_bytes(),
                SEAL_PURPOSE,
            )),
            served: Arc::default(),
        };
        store.rebuild();
        let s = store.clone();
        let mut rx = s.catalog.subscribe();
        tasks.spawn(async move {
            // Also now and then: an expired certificate stops being served.
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    r = rx.recv() => match r {
                        // An app's deletion detaches its hostnames.
                        Ok(Change::Certificate(_) | Change::App(_)) => s.rebuild(),
                        Ok(_) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => s.rebuild(),
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                    },
                    _ = tick.tick() => s.rebuild(),
                }
            }
        });
        store
    }

    /// Reads the catalog's rows again; keys of rows seen before are reused, not reopened.
    pub fn rebuild(&self) {
        let rows = self.catalog.certificates();
        let before = self.snapshot();
        let mut served = HashMap::new();
        for (hostname, row) in attached(&self.catalog, &rows) {
            let r = &row.record;
            let row_id = (r.host_id.clone(), r.updated_at_ms);
            let reuse = before
                .get(hostname)
                .filter(|s| s.row == row_id)
                .and_then(|s| s.key.clone());
            let key = match reuse {
                Some(k) => Some(k),
                None if r.sealed_key.is_empty() => None,
                None => match open_row(&self.seal, r) {
                    Ok(k) => Some(k),
                    Err(err) => {
                        tracing::warn!(hostname, error = %err, "certificate row does not open");
                        None
                    }
                },
            };
            served.insert(
                hostname.to_string(),
                Served {
                    app: r.app.clone(),
                    key,
                    not_after_ms: r.not_after_ms,
                    row: row_id,
                },
            );
        }
        *self.served.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(served);
    }

    fn snapshot(&self) -> Arc<HashMap<String, Served>> {
        self.served
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The app a hostname (lowercase, no port) is attached to.
    pub fn app_of(&self, hostname: &str) -> Option<String> {
        self.snapshot().get(hostname).map(|s| s.app.clone())
    }

    /// The key authorization to answer for an ACME HTTP-01 token.
    pub fn challenge(&self, token: &str) -> Option<String> {
        self.catalog.challenge(token)
    }

    /// The certificate to serve for `hostname`: issued and not expired.
    pub fn key_for(&self, hostname: &str) -> Option<Arc<CertifiedKey>> {
        let served = self.snapshot();
        let s = served.get(hostname)?;
        (s.not_after_ms > bazaar_types::now_ms()).then(|| s.key.clone())?
    }
}

impl ResolvesServerCert for CertStore {
    /// By SNI; no name or no certificate for it: none, and rustls ends the handshake with
    /// a fatal alert at once.
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let name = hello.server_name()?.to_ascii_lowercase();
        self.key_for(name.trim_end_matches('.'))
    }
}
