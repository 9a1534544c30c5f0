//! The state one node's tasks share: the replica, the membership view, the version clock,
//! the pinned host keys, counters, fault injection, and the check-merge-and-notify path
//! every incoming row takes.

use crate::config::CatalogConfig;
use crate::keyring::Keyring;
use crate::membership::MemberView;
use crate::records::{Change, HostStatus};
use crate::replica::DigestEntry;
use crate::replica::{Kind, Record, Replica, Row};
use crate::trust::{self, CaTrust, KeyRing, SignedEntry};
use crate::wire::{self, Authenticator, BroadcastItem, WireRow};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use tokio::sync::{broadcast, mpsc, oneshot};

/// Past this many items waiting in foca's broadcast queue, a node stops forwarding other
/// nodes' rows (it still merges them, and still broadcasts its own): a burst of changes
/// (a cluster starting, many hosts booting at once) then travels by anti-entropy, which
/// moves rows in bulk, instead of queueing retransmissions that would take minutes to
/// drain. foca sends the freshest items first, so a backlog does not delay new changes.
pub(crate) const MAX_BROADCAST_BACKLOG: u64 = 256;

// The node's queues are bounded; what happens when one is full depends on whether its
// sender can wait.
/// The change stream ([`crate::Catalog::subscribe`]): one ring shared by every subscriber.
/// Drop-oldest: a subscriber this far behind loses the oldest changes (tokio's broadcast
/// ring overwrites them), is told so (`RecvError::Lagged`) and re-reads what it cares about;
/// however slow a subscriber, the catalog holds at most this many changes. Counted in
/// `changes_dropped`. A cluster starting (every host's rows at once) fits in it.
pub(crate) const CHANGES_CAPACITY: usize = 4096;
/// Broadcasts to the gossip task. Their sender (`publish`, called by the agent while it
/// commits) is synchronous and must not wait: when the queue is full (the gossip task is
/// stalled), the broadcast is dropped and counted in `broadcasts_dropped`. The row is in the
/// replica already, and reaches peers by anti-entropy within a round (digests every
/// `anti_entropy_interval`), as a burst past [`MAX_BROADCAST_BACKLOG`] does anyway. `Leave`
/// waits for room (backpressure; bounded by `Catalog::leave`'s timeout).
pub(crate) const COMMANDS_CAPACITY: usize = 1024;
/// Owners to pull from at once (hints of rows too big to broadcast), from the gossip task,
/// which must not wait either: when full, a hint's pull is dropped and counted in
/// `pulls_dropped`; the next anti-entropy round fetches the row. The anti-entropy task takes
/// the whole queue at once and deduplicates owners, so it rarely holds more than a few.
pub(crate) const PULLS_CAPACITY: usize = 256;

/// Requests to the gossip task.
#[derive(Debug)]
pub(crate) enum Command {
    /// Disseminate this encoded [`BroadcastItem`].
    Broadcast(Vec<u8>),
    /// Say goodbye, leave the SWIM cluster, and stop.
    Leave(oneshot::Sender<()>),
}

/// Everything under the lock.
#[derive(Debug, Default)]
pub(crate) struct State {
    pub replica: Replica,
    pub members: MemberView,
    /// The last version this node gave one of its rows.
    pub last_version: u64,
    /// This node has merged a sync from a peer since it started, so its own rows are
    /// complete (it has inherited what the cluster held of its previous life).
    pub synced: bool,
    /// This node has left the cluster.
    pub left: bool,
}

/// Counters, updated without locking.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub udp_bytes_sent: AtomicU64,
    pub udp_bytes_received: AtomicU64,
    pub udp_packets_sent: AtomicU64,
    pub udp_packets_received: AtomicU64,
    pub tcp_bytes_sent: AtomicU64,
    pub tcp_bytes_received: AtomicU64,
    pub syncs: AtomicU64,
    pub pulls: AtomicU64,
    pub syncs_failed: AtomicU64,
    pub rejected: AtomicU64,
    pub rows_refused: AtomicU64,
    pub replayed: AtomicU64,
    pub dropped_partitioned: AtomicU64,
    pub rows_merged: AtomicU64,
    /// Gauge: broadcast items foca still has to transmit.
    pub broadcast_backlog: AtomicU64,
    /// Dropped because their queue was full (see [`COMMANDS_CAPACITY`], [`PULLS_CAPACITY`],
    /// [`CHANGES_CAPACITY`]).
    pub broadcasts_dropped: AtomicU64,
    pub pulls_dropped: AtomicU64,
    pub changes_dropped: AtomicU64,
}

impl Counters {
    pub fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// Shared by the handle and the node's tasks.
#[derive(Debug)]
pub(crate) struct Shared {
    pub config: CatalogConfig,
    /// The address other nodes reach this one at (UDP and TCP).
    pub addr: SocketAddr,
    pub auth: Authenticator,
    /// The gossip keys (see [`crate::keyring`]), changed at run time by key rotation.
    keyring: RwLock<Keyring>,
    /// The key trusted for each host id (see [`crate::trust`]).
    keys: RwLock<KeyRing>,
    /// In a cluster with a CA: endorsed keys and revocations (see [`crate::trust`]).
    pub ca: Option<CaTrust>,
    /// In a cluster with a CA: anti-entropy over mTLS.
    pub tls: Option<SyncTls>,
    state: RwLock<State>,
    pub changes: broadcast::Sender<Change>,
    pub counters: Counters,
    blocked: RwLock<HashSet<SocketAddr>>,
    /// To the gossip task ([`COMMANDS_CAPACITY`]).
    pub commands: mpsc::Sender<Command>,
    /// Owners to pull from at once (a hint said they have rows too big to broadcast;
    /// [`PULLS_CAPACITY`]).
    pub pulls: mpsc::Sender<String>,
}

/// Both sides of anti-entropy over mTLS.
#[derive(Clone)]
pub(crate) struct SyncTls {
    pub acceptor: tokio_rustls::TlsAcceptor,
    pub connector: tokio_rustls::TlsConnector,
}

impl std::fmt::Debug for SyncTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SyncTls")
    }
}

impl Shared {
    pub fn new(
        config: CatalogConfig,
        addr: SocketAddr,
        commands: mpsc::Sender<Command>,
        pulls: mpsc::Sender<String>,
    ) -> anyhow::Result<Self> {
        let (ca, tls) =
            match &config.cluster {
                Some(c) => (
                    Some(CaTrust::new(&c.ca_pem, &c.revocations)?),
                    Some(SyncTls {
                        acceptor: tokio_rustls::TlsAcceptor::from(
                            bazaar_pki::catalog_server_config(&c.identity, &c.ca_pem)?,
                        ),
                        connector: tokio_rustls::TlsConnector::from(
                            bazaar_pki::catalog_client_config(&c.identity, &c.ca_pem)?,
                        ),
                    }),
                ),
                None => (None, None),
            };
        let auth = Authenticator::new(&config.cluster_secret);
        let keyring = if config.gossip_keys.is_empty() {
            Keyring::new(&[crate::keyring::derived_key(&config.cluster_secret)])
        } else {
            Keyring::new(&config.gossip_keys)
        }
        .expect("at least one key");
        let keys = RwLock::new(KeyRing::new(&config.node_id, &config.signing_key));
        Ok(Shared {
            config,
            addr,
            auth,
            keyring: RwLock::new(keyring),
            keys,
            ca,
            tls,
            state: RwLock::new(State::default()),
            changes: broadcast::channel(CHANGES_CAPACITY).0,
            counters: Counters::default(),
            blocked: RwLock::new(HashSet::new()),
            commands,
            pulls,
        })
    }

    pub fn node_id(&self) -> &str {
        &self.config.node_id
    }

    /// The gossip keyring, to seal or open datagrams.
    pub fn keyring(&self) -> RwLockReadGuard<'_, Keyring> {
        self.keyring.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The gossip keyring, to change it.
    pub fn keyring_mut(&self) -> RwLockWriteGuard<'_, Keyring> {
        self.keyring.write().unwrap_or_else(|e| e.into_inner())
    }

    pub fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Fault injection: whether traffic with this address is dropped.
    pub fn is_blocked(&self, addr: &SocketAddr) -> bool {
        let blocked = self.blocked.read().unwrap_or_else(|e| e.into_inner());
        !blocked.is_empty() && blocked.contains(addr)
    }

    pub fn set_blocked(&self, addrs: &[SocketAddr]) {
        let mut blocked = self.blocked.write().unwrap_or_else(|e| e.into_inner());
        *blocked = addrs.iter().copied().collect();
    }

    /// Writes one of this node's own rows with a fresh version, and disseminates it. A row
    /// no store rebuilds is kept on disk first ([`crate::own_rows`], with
    /// `CatalogConfig::own_rows_dir`).
    pub fn publish(&self, record: Record, deleted: bool) {
        if let Some(dir) = &self.config.own_rows_dir {
            if let Err(err) = crate::own_rows::OwnRows::new(dir).write(&record, deleted) {
                tracing::error!(
                    kind = ?record.kind(),
                    key = record.key(),
                    error = %err,
                    "keeping a catalog row on disk: it lasts only while a peer holds it"
                );
            }
        }
        let now = bazaar_types::now_ms();
        let version = {
            let mut st = self.write();
            let version = (st.last_version + 1).max(now.saturating_mul(1000));
            st.last_version = version;
            version
        };
        let mut row = Row {
            owner: self.node_id().to_owned(),
            version,
            deleted,
            updated_at_ms: now,
            record,
            seal: Default::default(),
        };
        // Signed outside the lock; a newer write of the same row that got in meanwhile
        // wins, and this one is dropped.
        row.seal = trust::seal(&self.config.signing_key, &row.identity(), &row.record);
        if !self.write().replica.apply(row.clone()).is_applied() {
            return;
        }
        self.notify(std::slice::from_ref(&row));
        let wire = WireRow::from_row(&row);
        let full = wire::encode(&BroadcastItem::Row(wire));
        let item = if full.len() <= self.config.max_broadcast_item() {
            full
        } else {
            wire::encode(&BroadcastItem::Hint {
                owner: row.owner.clone(),
                kind: row.kind(),
                key: row.key().to_owned(),
                version: row.version,
            })
        };
        self.broadcast(item);
    }

    /// Hands an encoded broadcast item to the gossip task, or drops it when its queue is
    /// full (see [`COMMANDS_CAPACITY`]).
    pub fn broadcast(&self, item: Vec<u8>) {
        if let Err(mpsc::error::TrySendError::Full(_)) =
            self.commands.try_send(Command::Broadcast(item))
        {
            Counters::add(&self.counters.broadcasts_dropped, 1);
        }
    }

    /// Asks the anti-entropy task to pull `owner`'s rows now, or drops the request when its
    /// queue is full (see [`PULLS_CAPACITY`]).
    pub fn pull(&self, owner: &str) {
        if let Err(mpsc::error::TrySendError::Full(_)) = self.pulls.try_send(owner.to_owned()) {
            Counters::add(&self.counters.pulls_dropped, 1);
        }
    }

    /// Sends one change to the subscribers, counting the one the slowest of them loses
    /// when it is [`CHANGES_CAPACITY`] behind.
    fn send_change(&self, change: Change) {
        if self.changes.len() >= CHANGES_CAPACITY {
            Counters::add(&self.counters.changes_dropped, 1);
        }
        let _ = self.changes.send(change);
    }

    /// Decodes a row from a peer and checks its owner's signature (pinning the key of an
    /// owner seen for the first time, or, with a CA, the key the CA endorsed for it);
    /// `None`, counted in `rows_refused`, if it fails.
    pub fn open_row(&self, wire: WireRow) -> Option<Row> {
        let checked = wire.into_row().and_then(|row| match &self.ca {
            Some(ca) => self.check_endorsed(ca, row),
            None => self.check_first_use(row),
        });
        match checked {
            Ok(mut row) => {
                row.seal.compact(&row.record);
                Some(row)
            }
            Err(e) => {
                Counters::add(&self.counters.rows_refused, 1);
                static WARNED: std::sync::atomic::AtomicBool =
                    std::sync::atomic::AtomicBool::new(false);
                if e.downcast_ref::<crate::wire::NewerRowFormat>().is_some()
                    && !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed)
                {
                    // Said once: every sync round brings such rows again.
                    tracing::warn!(error = %e, "refused a row");
                } else {
                    tracing::debug!(error = %e, "refused a row");
                }
                None
            }
        }
    }

    /// Without a CA: the key first seen for the owner (TOFU).
    fn check_first_use(&self, row: Row) -> anyhow::Result<Row> {
        let pinned = self
            .keys
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .pinned(&row.owner);
        let key = trust::verify_row(pinned, &row.identity(), &row.seal, &row.record)?;
        let mut keys = self.keys.write().unwrap_or_else(|e| e.into_inner());
        anyhow::ensure!(
            pinned.is_some() || keys.pin(&row.owner, key),
            "another key was pinned for {} meanwhile",
            row.owner
        );
        Ok(row)
    }

    /// With a CA: a host row pins its key if the CA endorsed it; any other row needs the
    /// endorsed key of its owner. A revoked owner's rows are refused.
    fn check_endorsed(&self, ca: &CaTrust, row: Row) -> anyhow::Result<Row> {
        anyhow::ensure!(!ca.is_revoked(&row.owner), "{} is revoked", row.owner);
        if let Record::Host(host) = &row.record {
            anyhow::ensure!(
                ca.endorses(&row.owner, &row.seal, host),
                "the key of {}'s host row is not endorsed by the cluster CA",
                row.owner
            );
            let key = trust::verify_row(None, &row.identity(), &row.seal, &row.record)?;
            if row.owner != self.node_id() {
                self.keys
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .pin_endorsed(&row.owner, key);
            }
            return Ok(row);
        }
        let pinned = self
            .keys
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .pinned(&row.owner)
            .ok_or_else(|| anyhow::anyhow!("no endorsed key known for {} yet", row.owner))?;
        trust::verify_row(Some(pinned), &row.identity(), &row.seal, &row.record)?;
        Ok(row)
    }

    /// Whether the CA revoked `host_id` (never, without a CA).
    pub fn is_revoked(&self, host_id: &str) -> bool {
        self.ca.as_ref().is_some_and(|ca| ca.is_revoked(host_id))
    }

    /// Takes a revocation signed by the CA: drops the host's rows and refuses it from now
    /// on. `Ok(true)` if it was news.
    pub fn revoke(&self, revocation: &bazaar_pki::Revocation) -> anyhow::Result<bool> {
        let ca = self
            .ca
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("this catalog has no cluster CA"))?;
        if !ca.add_revocation(revocation)? {
            return Ok(false);
        }
        tracing::warn!(host = revocation.host_id, "host revoked by the cluster CA");
        let removed = self.write().replica.remove_owner(&revocation.host_id);
        self.notify(&removed);
        Ok(true)
    }

    /// This node's digest entry signed with its key: its own rows in the same message are
    /// its complete set.
    pub fn sign_complete_set(&self, entry: DigestEntry) -> SignedEntry {
        SignedEntry::sign(&self.config.signing_key, entry)
    }

    /// Whether `complete` proves that `rows` hold the complete set of `from`'s rows:
    /// signed by `from`'s key, and matching the rows received.
    pub fn is_complete_set(&self, from: &str, complete: &SignedEntry, rows: &[Row]) -> bool {
        complete.entry.owner == from
            && DigestEntry::of(from, rows).same_as(&complete.entry)
            && self
                .keys
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .check_entry(complete)
    }

    /// Whether the broadcast queue is full (see [`MAX_BROADCAST_BACKLOG`]).
    pub fn broadcasts_saturated(&self) -> bool {
        self.counters.broadcast_backlog.load(Ordering::Relaxed) >= MAX_BROADCAST_BACKLOG
    }

    /// Merges rows received from peers; `authority` names the owner whose complete set
    /// `rows` includes (see [`Replica::apply_authoritative`]). Returns how many changed.
    pub fn merge(&self, rows: Vec<Row>, authority: Option<&str>) -> usize {
        let me = self.node_id();
        let ttl = self.config.tombstone_ttl.as_millis() as u64;
        let changed = {
            let mut st = self.write();
            let mut changed = Vec::new();
            let mut owned = Vec::new();
            for row in rows {
                if row.owner == me {
                    // Our own rows from a previous life: keep them (the agent republishes
                    // or deletes them) and never write a version below them again.
                    st.last_version = st.last_version.max(row.version);
                }
                match authority {
                    Some(owner) if owner == row.owner && owner != me => owned.push(row),
                    _ => {
                        if st.replica.apply(row.clone()).is_applied() {
                            changed.push(row);
                        }
                    }
                }
            }
            if let Some(owner) = authority.filter(|o| *o != me) {
                let now = bazaar_types::now_ms();
                changed.extend(st.replica.apply_authoritative(owner, owned, now, ttl));
            }
            changed
        };
        Counters::add(&self.counters.rows_merged, changed.len());
        self.notify(&changed);
        changed.len()
    }

    /// Whether a row newer than `version` exists for this key somewhere (we hold older).
    pub fn is_newer(&self, owner: &str, kind: Kind, key: &str, version: u64) -> bool {
        let st = self.read();
        st.replica
            .get(owner, kind, key)
            .is_none_or(|r| r.version < version)
    }

    /// Sends the change events for rows that changed.
    pub fn notify(&self, rows: &[Row]) {
        if self.changes.receiver_count() == 0 {
            return;
        }
        for row in rows {
            self.send_change(change_of(row));
        }
    }

    /// Sends the change events for hosts whose status changed: the host and each of its
    /// machines.
    pub fn notify_status(&self, hosts: &[String]) {
        if hosts.is_empty() || self.changes.receiver_count() == 0 {
            return;
        }
        let events: Vec<Change> = {
            let st = self.read();
            hosts
                .iter()
                .flat_map(|h| {
                    std::iter::once(Change::Host(h.clone())).chain(
                        st.replica
                            .owner_rows(h)
                            .filter(|r| r.kind() == Kind::Machine)
                            .map(change_of),
                    )
                })
                .collect()
        };
        for e in events {
            self.send_change(e);
        }
    }

    /// A host's status; this node is alive until it leaves.
    pub fn status_of(&self, st: &State, node_id: &str) -> Option<HostStatus> {
        if node_id == self.node_id() {
            Some(if st.left {
                HostStatus::Left
            } else {
                HostStatus::Alive
            })
        } else {
            st.members.status(node_id)
        }
    }
}

fn change_of(row: &Row) -> Change {
    match &row.record {
        Record::Host(h) => Change::Host(h.id.clone()),
        Record::Machine(m) => Change::Machine {
            id: m.id.clone(),
            app: m.app.clone(),
        },
        Record::App(a) => Change::App(a.name.clone()),
        Record::Volume(v) => Change::Volume {
            id: v.id.clone(),
            app: v.app.clone(),
        },
        // An app's secrets changed: subscribers re-read the app.
        Record::Secret(x) => Change::App(x.app.clone()),
        Record::Certificate(c) => Change::Certificate(c.hostname.clone()),
        Record::Challenge(c) => Change::Challenge(c.token.clone()),
        // A quota changed: subscribers re-read the app (an org's: nothing to re-read).
        Record::Quota(q) => Change::App(q.id.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::MachineRecord;
    use tokio::sync::broadcast::error::TryRecvError;

    #[test]
    fn queues_stay_bounded_however_slow_their_readers() {
        let config =
            CatalogConfig::new("h_slow", "local", "127.0.0.1:0".parse().unwrap(), "secret");
        // The gossip and anti-entropy tasks never read (stalled), nor does a subscriber.
        let (commands, commands_rx) = mpsc::channel(COMMANDS_CAPACITY);
        let (pulls, pulls_rx) = mpsc::channel(PULLS_CAPACITY);
        let shared = Shared::new(config, "127.0.0.1:1".parse().unwrap(), commands, pulls).unwrap();
        let mut slow = shared.changes.subscribe();
        let n = CHANGES_CAPACITY + 1000;
        for i in 0..n {
            let machine = MachineRecord {
                id: format!("m{i}"),
                app: "web".into(),
                host_id: "h_slow".into(),
                state: "started".into(),
                ..Default::default()
            };
            shared.publish(Record::Machine(machine), false);
        }
        for _ in 0..PULLS_CAPACITY + 10 {
            shared.pull("h_other");
        }
        // Every row is in the replica; what the queues could not take was dropped, counted.
        assert_eq!(shared.read().replica.len(), n);
        assert_eq!(commands_rx.len(), COMMANDS_CAPACITY);
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed) as usize;
        assert_eq!(
            get(&shared.counters.broadcasts_dropped),
            n - COMMANDS_CAPACITY
        );
        assert_eq!(pulls_rx.len(), PULLS_CAPACITY);
        assert_eq!(get(&shared.counters.pulls_dropped), 10);
        // The catalog holds the newest changes only; the slow subscriber learns what it
        // lost, then reads on from the oldest kept.
        assert_eq!(shared.changes.len(), CHANGES_CAPACITY);
        assert_eq!(get(&shared.counters.changes_dropped), n - CHANGES_CAPACITY);
        assert_eq!(
            slow.try_recv(),
            Err(TryRecvError::Lagged((n - CHANGES_CAPACITY) as u64))
        );
        assert_eq!(slow.len(), CHANGES_CAPACITY);
        let next = format!("m{}", n - CHANGES_CAPACITY);
        assert!(matches!(slow.try_recv(), Ok(Change::Machine { id, .. }) if id == next));
    }
}
