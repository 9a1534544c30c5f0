//! Short leases, as flyctl holds them (13 s, refreshed every 4 s): a crashed deploy blocks
//! the next one for seconds, not half an hour. [`Leases`] takes, refreshes in the
//! background and releases the leases of every machine a deploy works on.

use crate::api::{status_of, Client};
use bazaar_client::fly::LeaseRequest;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Lease time to live, in seconds.
pub const TTL_SECS: u64 = 13;
/// How often held leases are refreshed.
pub const REFRESH: Duration = Duration::from_secs(4);

/// The leases one deploy holds, by machine id → nonce.
#[derive(Debug, Clone)]
pub struct Leases {
    client: Client,
    app: String,
    held: Arc<Mutex<HashMap<String, String>>>,
    refresher: Arc<tokio::task::JoinHandle<()>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Leases {
    /// Starts the refresher.
    pub fn new(client: Client, app: &str) -> Leases {
        let held: Arc<Mutex<HashMap<String, String>>> = Arc::default();
        let (c, a, h) = (client.clone(), app.to_string(), held.clone());
        let refresher = tokio::spawn(async move {
            loop {
                tokio::time::sleep(REFRESH).await;
                let list: Vec<(String, String)> = lock(&h)
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                let calls = list.into_iter().map(|(id, nonce)| {
                    let (c, a) = (c.clone(), a.clone());
                    async move {
                        let refresh = LeaseRequest {
                            ttl: Some(TTL_SECS),
                            description: None,
                        };
                        let _ = c.fly().lease(&a, &id, &refresh, Some(&nonce)).await;
                    }
                });
                futures_util::future::join_all(calls).await;
            }
        });
        Leases {
            client,
            app: app.to_string(),
            held,
            refresher: Arc::new(refresher),
        }
    }

    /// The nonce of a held lease.
    pub fn nonce(&self, id: &str) -> Option<String> {
        lock(&self.held).get(id).cloned()
    }

    /// Records a lease taken elsewhere (a create with `lease_ttl`).
    pub fn adopt(&self, id: &str, nonce: &str) {
        lock(&self.held).insert(id.to_string(), nonce.to_string());
    }

    /// Takes a machine's lease, retrying for up to 15 s while another holder has it.
    pub async fn acquire(&self, id: &str) -> anyhow::Result<String> {
        if let Some(n) = self.nonce(id) {
            return Ok(n);
        }
        let mut delay = Duration::from_millis(100);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let take = LeaseRequest {
                ttl: Some(TTL_SECS),
                description: Some("bazaar deploy".into()),
            };
            let r = self
                .client
                .fly()
                .lease(&self.app, id, &take, None)
                .await
                .map_err(anyhow::Error::from);
            match r {
                Ok(lease) => {
                    self.adopt(id, &lease.data.nonce);
                    return Ok(lease.data.nonce);
                }
                Err(e) if status_of(&e) == Some(409) && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
                Err(e) => return Err(e.context(format!("taking the lease of machine {id}"))),
            }
        }
    }

    /// Forgets a lease (its machine was destroyed).
    pub fn forget(&self, id: &str) {
        lock(&self.held).remove(id);
    }

    /// Releases one lease.
    pub async fn release(&self, id: &str) {
        let nonce = lock(&self.held).remove(id);
        if let Some(n) = nonce {
            let _ = self.client.fly().release_lease(&self.app, id, &n).await;
        }
    }

    /// Releases every lease and stops refreshing.
    pub async fn release_all(&self) {
        self.refresher.abort();
        let ids: Vec<String> = lock(&self.held).keys().cloned().collect();
        futures_util::future::join_all(ids.iter().map(|id| self.release(id))).await;
    }
}
