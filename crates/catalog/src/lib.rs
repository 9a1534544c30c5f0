//! The catalog (Fly's Corrosion): every node holds a full, eventually consistent replica
//! of the cluster — hosts, machines, volumes, apps — so the API can find candidate hosts and the
//! proxy can route without asking anyone.
//!
//! - Membership and failure detection: SWIM, by [foca](https://docs.rs/foca), driven by
//!   our own task over one UDP socket ([`gossip`]).
//! - Rows are host-owned: only the owning host writes its rows, each write replaces the
//!   whole row with a higher version ([`replica`], the pure merge logic).
//! - Fresh rows spread as foca custom broadcasts, forwarded as soon as they arrive; a
//!   periodic anti-entropy exchange of per-owner digests over TCP repairs whatever was
//!   missed ([`sync`]).
//! - Every datagram is encrypted with the gossip keyring ([`keyring`]) and every frame
//!   signed with the cluster secret ([`wire`]), with the sender and clock inside the tag;
//!   datagrams are refused when stale or replayed.
//! - Every row is signed by its owner's own key and kept only if it verifies against the
//!   key trusted for that host ([`trust`]), wherever it came from.
//!
//! Use: [`Catalog::start`] with a [`CatalogConfig`], publish this host's rows, query and
//! [`Catalog::subscribe`] to changes. The replica is soft state: after a restart the agent
//! republishes its rows (their versions come from the clock, so they win over the old
//! ones), and gossip brings the rest back.
#![forbid(unsafe_code)]

pub mod config;
pub mod gossip;
pub mod keyring;
pub mod membership;
pub mod metrics;
mod node;
pub mod own_rows;
pub mod records;
pub mod replica;
pub mod sync;
pub mod trust;
pub mod wire;

pub use config::{CatalogConfig, ClusterIdentity};
pub use records::{
    AppRecord, CertificateRecord, CertificateView, ChallengeRecord, Change, CheckRecord,
    HostRecord, HostStatus, HostView, MachineFilter, MachineRecord, MachineView, QuotaRecord,
    SecretRecord, ServiceRecord, VolumeRecord, VolumeView,
};

use anyhow::Context;
use node::{Command, Shared};
use replica::{Kind, Record, Row};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::task::JoinHandle;

/// Traffic and size counters of one node, for monitoring and benchmarks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CatalogStats {
    pub udp_bytes_sent: u64,
    pub udp_bytes_received: u64,
    pub udp_packets_sent: u64,
    pub udp_packets_received: u64,
    pub tcp_bytes_sent: u64,
    pub tcp_bytes_received: u64,
    /// Anti-entropy exchanges started by this node, and how many failed.
    pub syncs: u64,
    pub syncs_failed: u64,
    /// Immediate pulls triggered by hints (rows too big to broadcast), included in `syncs`.
    pub pulls: u64,
    /// Datagrams and frames dropped for failing authentication, freshness or decoding.
    pub rejected: u64,
    /// Rows refused because their owner's signature did not verify (forged, or signed
    /// with a key other than the one trusted for the host).
    pub rows_refused: u64,
    /// Datagrams refused because they had been received already.
    pub replayed: u64,
    /// Datagrams and syncs dropped by [`Catalog::set_partitioned`].
    pub dropped_partitioned: u64,
    /// Rows from peers that changed the replica.
    pub rows_merged: u64,
    /// Broadcast items waiting to be transmitted (bursts beyond a bound go by
    /// anti-entropy instead).
    pub broadcast_backlog: u64,
    /// Dropped because their bounded queue was full: this node's broadcasts (the rows go
    /// by anti-entropy), hint pulls (the next round fetches the rows), and changes a
    /// subscriber too far behind lost (it is told it lagged).
    pub broadcasts_dropped: u64,
    pub pulls_dropped: u64,
    pub changes_dropped: u64,
    /// Rows in the replica, tombstones included.
    pub rows: u64,
    pub tombstones: u64,
    /// Hosts the failure detector knows, and how many of them are alive.
    pub members: u64,
    pub alive_members: u64,
}

/// A cheap, cloneable handle on a running catalog node. The node stops when
/// [`Catalog::leave`] or [`Catalog::kill`] is called, or when the last handle is dropped.
#[derive(Clone, Debug)]
pub struct Catalog {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    shared: Arc<Shared>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    started: std::time::Instant,
}

/// How long after it starts a node may still be catching up with the cluster (see
/// [`Catalog::catching_up`]).
const CATCH_UP: std::time::Duration = std::time::Duration::from_secs(3);

impl Drop for Inner {
    fn drop(&mut self) {
        let tasks = self.tasks.get_mut().unwrap_or_else(|e| e.into_inner());
        for t in tasks.drain(..) {
            t.abort();
        }
    }
}

impl Catalog {
    /// Binds the UDP socket and the TCP listener, starts the node's tasks, and joins the
    /// cluster through the seeds (retried in the background until one answers).
    pub async fn start(config: CatalogConfig) -> anyhow::Result<Catalog> {
        config.validate()?;
        let (socket, listener) = bind(config.listen).await?;
        let bound = socket.local_addr()?;
        let addr = config.advertise.unwrap_or(bound);
        if addr.ip().is_unspecified() {
            anyhow::bail!("listening on {bound}: set `advertise` to an address peers can reach");
        }
        let (commands_tx, commands_rx) = mpsc::channel(node::COMMANDS_CAPACITY);
        let (pulls_tx, pulls_rx) = mpsc::channel(node::PULLS_CAPACITY);
        let shared = Arc::new(Shared::new(config, addr, commands_tx, pulls_tx)?);
        let gossip = gossip::Gossip::new(shared.clone(), socket, commands_rx);
        let tasks = vec![
            tokio::spawn(gossip.run()),
            tokio::spawn(sync::serve(shared.clone(), listener)),
            tokio::spawn(sync::anti_entropy(shared.clone(), pulls_rx)),
        ];
        // The rows of a previous life that only this node kept, with fresh versions.
        if let Some(dir) = &shared.config.own_rows_dir {
            let kept = own_rows::OwnRows::new(dir).load();
            tracing::info!(num = kept.len(), "republishing this node's kept rows");
            for record in kept {
                shared.publish(record, false);
            }
        }
        tracing::info!(node = shared.node_id(), %addr, "catalog started");
        Ok(Catalog {
            inner: Arc::new(Inner {
                shared,
                tasks: Mutex::new(tasks),
                started: std::time::Instant::now(),
            }),
        })
    }

    fn shared(&self) -> &Shared {
        &self.inner.shared
    }

    /// Whether this node's view may still lack rows the cluster holds: it started moments
    /// ago and has not merged a sync from a peer yet. A lookup that finds nothing is worth
    /// waiting on then (an agent restarted a moment ago learns of other hosts' machines
    /// from its first sync).
    pub fn catching_up(&self) -> bool {
        if self.inner.started.elapsed() >= CATCH_UP {
            return false;
        }
        let st = self.shared().read();
        // A node alone (no seeds, no peer heard of) has nobody to catch up with.
        let has_peers = !self.shared().config.seeds.is_empty()
            || st.members.iter().any(|(id, _)| id != self.node_id());
        has_peers && !st.synced
    }

    /// The address peers reach this node at (UDP and TCP).
    pub fn local_addr(&self) -> SocketAddr {
        self.shared().addr
    }

    pub fn node_id(&self) -> &str {
        self.shared().node_id()
    }

    /// Publishes this host's record (its `id` is set to this node's id, its `public_key`
    /// to this node's key).
    pub fn publish_host(&self, mut record: HostRecord) {
        record.id = self.node_id().to_owned();
        record.public_key = trust::public_key_hex(&self.shared().config.signing_key);
        if let Some(cluster) = &self.shared().config.cluster {
            record.key_endorsement = cluster.key_endorsement.clone();
        }
        if record.updated_at_ms == 0 {
            record.updated_at_ms = bazaar_types::now_ms();
        }
        self.shared().publish(Record::Host(record), false);
    }

    /// Publishes one of this host's machines (its `host_id` is set to this node's id).
    pub fn publish_machine(&self, mut record: MachineRecord) {
        record.host_id = self.node_id().to_owned();
        if record.updated_at_ms == 0 {
            record.updated_at_ms = bazaar_types::now_ms();
        }
        self.shared().publish(Record::Machine(record), false);
    }

    /// Replaces one of this host's machines by a tombstone (state `destroyed`), collected
    /// after `tombstone_ttl`. Does nothing if this host holds no such machine.
    pub fn delete_machine(&self, id: &str) {
        let current = self
            .shared()
            .read()
            .replica
            .get(self.node_id(), Kind::Machine, id)
            .filter(|r| !r.deleted)
            .map(|r| r.record.clone());
        if let Some(Record::Machine(mut m)) = current {
            m.state = "destroyed".into();
            m.updated_at_ms = bazaar_types::now_ms();
            self.shared().publish(Record::Machine(m), true);
        }
    }

    /// Publishes one of this host's volumes (its `host_id` is set to this node's id).
    pub fn publish_volume(&self, mut record: VolumeRecord) {
        record.host_id = self.node_id().to_owned();
        if record.updated_at_ms == 0 {
            record.updated_at_ms = bazaar_types::now_ms();
        }
        self.shared().publish(Record::Volume(record), false);
    }

    /// Replaces one of this host's volumes by a tombstone (state `destroyed`). Does
    /// nothing if this host holds no such volume.
    pub fn delete_volume(&self, id: &str) {
        let current = self
            .shared()
            .read()
            .replica
            .get(self.node_id(), Kind::Volume, id)
            .filter(|r| !r.deleted)
            .map(|r| r.record.clone());
        if let Some(Record::Volume(mut v)) = current {
            v.state = "destroyed".into();
            v.updated_at_ms = bazaar_types::now_ms();
            self.shared().publish(Record::Volume(v), true);
        }
    }

    /// Live volumes, of one app or of all, ordered by (app, name, id).
    pub fn volumes(&self, app: Option<&str>) -> Vec<VolumeView> {
        let st = self.shared().read();
        let mut out: Vec<VolumeView> = st
            .replica
            .volumes()
            .filter(|row| !row.deleted)
            .filter_map(|row| match &row.record {
                Record::Volume(v) if app.is_none_or(|a| a == v.app) => {
                    Some(self.volume_view(&st, row, v))
                }
                _ => None,
            })
            .collect();
        out.sort_by(|a, b| {
            (&a.record.app, &a.record.name, &a.record.id).cmp(&(
                &b.record.app,
                &b.record.name,
                &b.record.id,
            ))
        });
        out
    }

    /// One volume (a tombstone too, until collected); a live row wins over a tombstone.
    pub fn volume(&self, id: &str) -> Option<VolumeView> {
        let st = self.shared().read();
        st.replica
            .volumes()
            .filter(|row| row.key() == id)
            .max_by_key(|r| (!r.deleted, r.updated_at_ms, r.version))
            .and_then(|row| match &row.record {
                Record::Volume(v) => Some(self.volume_view(&st, row, v)),
                _ => None,
            })
    }

    fn volume_view(&self, st: &node::State, row: &Row, v: &VolumeRecord) -> VolumeView {
        VolumeView {
            record: v.clone(),
            host_status: match self.shared().status_of(st, &row.owner) {
                Some(HostStatus::Alive) => "ok",
                Some(_) => "unreachable",
                None => "unknown",
            },
            deleted: row.deleted,
        }
    }

    /// Publishes this host's row of an edge certificate (its `host_id` is set to this
    /// node's id).
    pub fn publish_certificate(&self, mut record: CertificateRecord) {
        record.host_id = self.node_id().to_owned();
        record.updated_at_ms = record.updated_at_ms.max(bazaar_types::now_ms());
        self.shared().publish(Record::Certificate(record), false);
    }

    /// Replaces this host's row of a hostname's certificate by a tombstone written now.
    /// Publishes one (a removal) when this host held none: its tombstone, newer than every
    /// other host's row, is what every proxy then reads.
    pub fn delete_certificate(&self, hostname: &str, app: &str) {
        let current = self
            .shared()
            .read()
            .replica
            .get(self.node_id(), Kind::Certificate, hostname)
            .map(|r| r.record.clone());
        let mut record = match current {
            Some(Record::Certificate(c)) => c,
            _ => CertificateRecord {
                hostname: hostname.to_owned(),
                app: app.to_owned(),
                created_at_ms: bazaar_types::now_ms(),
                ..Default::default()
            },
        };
        record.host_id = self.node_id().to_owned();
        record.status = "removed".into();
        record.chain_pem.clear();
        record.sealed_key.clear();
        record.updated_at_ms = bazaar_types::now_ms().max(record.updated_at_ms + 1);
        self.shared().publish(Record::Certificate(record), true);
    }

    /// Tombstones this host's row of a hostname's certificate as it was written (not newer):
    /// for a row another host's newer row superseded (a takeover, a removal).
    pub fn retire_certificate(&self, hostname: &str) {
        let current = self
            .shared()
            .read()
            .replica
            .get(self.node_id(), Kind::Certificate, hostname)
            .filter(|r| !r.deleted)
            .map(|r| r.record.clone());
        if let Some(record) = current {
            self.shared().publish(record, true);
        }
    }

    /// Every host's certificate rows (tombstones included, until collected), by
    /// (hostname, host).
    pub fn certificates(&self) -> Vec<CertificateView> {
        let st = self.shared().read();
        let mut out: Vec<CertificateView> = st
            .replica
            .certificates()
            .filter_map(|row| match &row.record {
                Record::Certificate(c) => Some(CertificateView {
                    record: c.clone(),
                    host_status: self
                        .shared()
                        .status_of(&st, &row.owner)
                        .unwrap_or(HostStatus::Suspect),
                    deleted: row.deleted,
                }),
                _ => None,
            })
            .collect();
        out.sort_by(|a, b| {
            (&a.record.hostname, &a.record.host_id).cmp(&(&b.record.hostname, &b.record.host_id))
        });
        out
    }

    /// Publishes an ACME challenge this host is answering (its `host_id` is set).
    pub fn publish_challenge(&self, mut record: ChallengeRecord) {
        record.host_id = self.node_id().to_owned();
        self.shared().publish(Record::Challenge(record), false);
    }

    /// Removes this host's challenge row for `token`, if any.
    pub fn delete_challenge(&self, token: &str) {
        let current = self
            .shared()
            .read()
            .replica
            .get(self.node_id(), Kind::Challenge, token)
            .filter(|r| !r.deleted)
            .map(|r| r.record.clone());
        if let Some(record) = current {
            self.shared().publish(record, true);
        }
    }

    /// The key authorization to answer for an ACME challenge token, whichever host
    /// published it.
    pub fn challenge(&self, token: &str) -> Option<String> {
        let st = self.shared().read();
        let answer = st
            .replica
            .challenges()
            .find(|r| r.key() == token)
            .and_then(|r| match &r.record {
                Record::Challenge(c) => Some(c.key_authorization.clone()),
                _ => None,
            });
        answer
    }

    /// Publishes an app created through this host's API.
    pub fn publish_app(&self, record: AppRecord) {
        self.shared().publish(Record::App(record), false);
    }

    /// Deletes this host's row of an app (rows other hosts published stay theirs).
    pub fn delete_app(&self, name: &str) {
        let current = self
            .shared()
            .read()
            .replica
            .get(self.node_id(), Kind::App, name)
            .filter(|r| !r.deleted)
            .map(|r| r.record.clone());
        if let Some(record) = current {
            self.shared().publish(record, true);
        }
    }

    /// Every host with a published record, this one included, ordered by id.
    pub fn hosts(&self) -> Vec<HostView> {
        let st = self.shared().read();
        let ids: Vec<String> = st.replica.owners().map(str::to_owned).collect();
        ids.iter()
            .filter_map(|id| self.host_view(&st, id))
            .collect()
    }

    pub fn host(&self, id: &str) -> Option<HostView> {
        let st = self.shared().read();
        self.host_view(&st, id)
    }

    fn host_view(&self, st: &node::State, id: &str) -> Option<HostView> {
        let row = st.replica.host(id)?;
        let Record::Host(record) = &row.record else {
            return None;
        };
        Some(HostView {
            record: record.clone(),
            // Not known to the failure detector (yet): not confirmed alive.
            status: self
                .shared()
                .status_of(st, id)
                .unwrap_or(HostStatus::Suspect),
            version: row.version,
        })
    }

    /// Machines matching the filter, ordered by (app, id). With an app, only its machines as
    /// it is now: not those destroyed before it was created (an earlier app of that name's).
    pub fn machines(&self, filter: &MachineFilter) -> Vec<MachineView> {
        self.machines_where(filter, |_| true)
    }

    /// Machines matching the filter and `keep`, ordered by (app, id); a machine held by
    /// two hosts (re-placed) once, as its current row. Only those kept are
    /// copied out, so a reader that needs few of them (the proxy: machines with services)
    /// does not pay for the rest.
    pub fn machines_where(
        &self,
        filter: &MachineFilter,
        keep: impl Fn(&MachineRecord) -> bool,
    ) -> Vec<MachineView> {
        let st = self.shared().read();
        let rows: Box<dyn Iterator<Item = &Row>> = match &filter.app {
            Some(app) => Box::new(st.replica.app_machines(app)),
            None => Box::new(st.replica.machines()),
        };
        let mut out: Vec<MachineView> = rows
            .filter_map(|row| {
                let Record::Machine(m) = &row.record else {
                    return None;
                };
                (filter.matches(m, row.deleted)
                    && keep(m)
                    && st.replica.is_current_machine_row(row)
                    && (filter.app.is_none()
                        || (st.replica.is_of_current_app(row) && !st.replica.is_of_losing_app(m))))
                .then(|| self.machine_view(&st, row, m))
            })
            .collect();
        out.sort_by(|a, b| (&a.record.app, &a.record.id).cmp(&(&b.record.app, &b.record.id)));
        out
    }

    /// One machine (a tombstone too, until collected).
    pub fn machine(&self, id: &str) -> Option<MachineView> {
        let st = self.shared().read();
        let row = st.replica.machine(id)?;
        let Record::Machine(m) = &row.record else {
            return None;
        };
        Some(self.machine_view(&st, row, m))
    }

    /// One machine of `app` (a tombstone too, until collected): not one of another app,
    /// nor one destroyed before `app` was created (an earlier app of the same name's).
    pub fn machine_of_app(&self, id: &str, app: &str) -> Option<MachineView> {
        let st = self.shared().read();
        let row = st.replica.machine(id)?;
        let Record::Machine(m) = &row.record else {
            return None;
        };
        (m.app == app && st.replica.is_of_current_app(row)).then(|| self.machine_view(&st, row, m))
    }

    fn machine_view(&self, st: &node::State, row: &Row, m: &MachineRecord) -> MachineView {
        let host_status = match self.shared().status_of(st, &row.owner) {
            Some(HostStatus::Alive) => "ok",
            Some(_) => "unreachable",
            None => "unknown",
        };
        MachineView {
            record: m.clone(),
            host_status,
            deleted: row.deleted,
            version: row.version,
        }
    }

    /// Every app; if two hosts created the same name, the least by
    /// [`AppRecord::precedence`] (created_at_ms, created_by_host, id) wins, on every node
    /// alike; the others lost the name ([`Catalog::app_rows`], [`Catalog::lost_to`]).
    pub fn apps(&self) -> Vec<AppRecord> {
        self.shared()
            .read()
            .replica
            .apps()
            .into_iter()
            .cloned()
            .collect()
    }

    pub fn app(&self, name: &str) -> Option<AppRecord> {
        self.shared().read().replica.app(name).cloned()
    }

    /// Every live app row, by name, each name's app first and then the apps that lost the
    /// name to it (made on the other side of a partition; see `replica::apps`).
    pub fn app_rows(&self) -> Vec<AppRecord> {
        let st = self.shared().read();
        st.replica
            .apps()
            .into_iter()
            .flat_map(|a| st.replica.app_rows(&a.name))
            .cloned()
            .collect()
    }

    /// The app that app `id` of `name` lost the name to, if it did.
    pub fn lost_to(&self, name: &str, id: &str) -> Option<AppRecord> {
        self.shared().read().replica.lost_to(name, id).cloned()
    }

    /// The ids of the apps that lost their name: a machine whose `app_id` is one of them
    /// is not the app's of its name (the proxy and the DNS leave it out).
    pub fn losing_app_ids(&self) -> std::collections::HashSet<String> {
        let st = self.shared().read();
        st.replica
            .apps()
            .into_iter()
            .flat_map(|a| st.replica.app_rows(&a.name).into_iter().skip(1))
            .map(|a| a.id.clone())
            .filter(|id| !id.is_empty())
            .collect()
    }

    /// Publishes a secret of an app written through this host's API (`sealed: None` to
    /// unset it); `record.set_by_host` must be this host.
    pub fn publish_secret(&self, record: SecretRecord) {
        self.shared().publish(Record::Secret(record), false);
    }

    /// Publishes a quota set through this host's API; `record.set_by_host` must be this host.
    pub fn publish_quota(&self, record: QuotaRecord) {
        self.shared().publish(Record::Quota(record), false);
    }

    /// The quota of an org or app as every node resolves it ([`QuotaRecord`]).
    pub fn quota(&self, scope: &bazaar_types::quota::Scope) -> Option<QuotaRecord> {
        self.shared().read().replica.quota(scope).cloned()
    }

    /// The version of an app's secrets: the time of their latest set or unset (0: none).
    /// Reads without copying (it is asked on every forwarded machine call).
    pub fn app_secrets_version(&self, app: &str) -> u64 {
        self.shared()
            .read()
            .replica
            .app_secrets(app)
            .iter()
            .map(|s| s.updated_at_ms)
            .max()
            .unwrap_or(0)
    }

    /// The secrets of an app as every node resolves them (the latest write per name, unset
    /// ones included, sealed), ordered by name. See [`SecretRecord`].
    pub fn app_secrets(&self, app: &str) -> Vec<SecretRecord> {
        self.shared()
            .read()
            .replica
            .app_secrets(app)
            .into_iter()
            .cloned()
            .collect()
    }

    /// A stream of changes to the local replica and to hosts' liveness. A receiver that
    /// falls more than 4096 changes behind gets `Lagged` and should re-read everything.
    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.shared().changes.subscribe()
    }

    /// A hash of the whole replica (every row's owner, kind, key and version), equal on
    /// nodes that have converged.
    pub fn digest(&self) -> String {
        self.shared().read().replica.digest()
    }

    /// Fault injection for tests: drop all traffic to and from these gossip addresses,
    /// UDP and TCP, until called again (an empty list heals).
    pub fn set_partitioned(&self, blocked: &[SocketAddr]) {
        self.shared().set_blocked(blocked);
    }

    pub fn stats(&self) -> CatalogStats {
        let c = &self.shared().counters;
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let st = self.shared().read();
        let members: Vec<HostStatus> = st.members.iter().map(|(_, m)| m.status).collect();
        CatalogStats {
            udp_bytes_sent: get(&c.udp_bytes_sent),
            udp_bytes_received: get(&c.udp_bytes_received),
            udp_packets_sent: get(&c.udp_packets_sent),
            udp_packets_received: get(&c.udp_packets_received),
            tcp_bytes_sent: get(&c.tcp_bytes_sent),
            tcp_bytes_received: get(&c.tcp_bytes_received),
            syncs: get(&c.syncs),
            syncs_failed: get(&c.syncs_failed),
            pulls: get(&c.pulls),
            rejected: get(&c.rejected),
            rows_refused: get(&c.rows_refused),
            replayed: get(&c.replayed),
            dropped_partitioned: get(&c.dropped_partitioned),
            rows_merged: get(&c.rows_merged),
            broadcast_backlog: get(&c.broadcast_backlog),
            broadcasts_dropped: get(&c.broadcasts_dropped),
            pulls_dropped: get(&c.pulls_dropped),
            changes_dropped: get(&c.changes_dropped),
            rows: st.replica.len() as u64,
            tombstones: st.replica.num_tombstones() as u64,
            members: members.len() as u64,
            alive_members: members.iter().filter(|s| **s == HostStatus::Alive).count() as u64,
        }
    }

    /// Whether the cluster CA revoked `host_id`: every node refuses its rows, datagrams,
    /// syncs and host-listener calls. The one place to ask (never true without a CA).
    pub fn is_revoked(&self, host_id: &str) -> bool {
        self.shared().is_revoked(host_id)
    }

    /// Takes a revocation signed by the cluster CA (`bazaar cluster revoke`): drops the
    /// host's rows, refuses the host from now on, and spreads the revocation to every node.
    /// Refused without a CA or when the CA did not sign it.
    pub fn revoke(&self, revocation: &bazaar_pki::Revocation) -> anyhow::Result<()> {
        if self.shared().revoke(revocation)? {
            let item = wire::encode(&wire::BroadcastItem::Revocation(revocation.clone()));
            self.shared().broadcast(item);
        }
        Ok(())
    }

    /// Every revocation this node knows, to keep across restarts
    /// ([`ClusterIdentity::revocations`]).
    pub fn revocations(&self) -> Vec<bazaar_pki::Revocation> {
        self.shared()
            .ca
            .as_ref()
            .map(|ca| ca.revocations())
            .unwrap_or_default()
    }

    /// The gossip keys (hex), the one that encrypts first.
    pub fn gossip_keys(&self) -> Vec<String> {
        self.shared().keyring().keys()
    }

    /// Adds a gossip key that decrypts; the first step of a rotation, done on every host
    /// before any host uses the key.
    pub fn install_gossip_key(&self, key: &str) -> anyhow::Result<()> {
        let key = keyring::parse_key(key)?;
        self.shared().keyring_mut().install(key);
        Ok(())
    }

    /// Encrypts with an installed key from now on.
    pub fn use_gossip_key(&self, key: &str) -> anyhow::Result<()> {
        let key = keyring::parse_key(key)?;
        self.shared().keyring_mut().use_key(key)
    }

    /// Removes a gossip key (not the one in use): datagrams sealed with it are dropped.
    pub fn remove_gossip_key(&self, key: &str) -> anyhow::Result<()> {
        let key = keyring::parse_key(key)?;
        self.shared().keyring_mut().remove(key)
    }

    /// Leaves the cluster cleanly: every known member is told at once (it sees this host
    /// as `left`), then the node's tasks stop.
    pub async fn leave(&self) {
        let (done_tx, done_rx) = oneshot::channel();
        // Waits for room in the gossip task's queue, within the same bound.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), async {
            if self
                .shared()
                .commands
                .send(Command::Leave(done_tx))
                .await
                .is_ok()
            {
                let _ = done_rx.await;
            }
        })
        .await;
        self.stop().await;
    }

    /// Stops the node's tasks without telling anyone, as a crash would (for tests and
    /// fault injection). Returns once the sockets are closed.
    pub async fn kill(&self) {
        self.stop().await;
    }

    async fn stop(&self) {
        let tasks: Vec<JoinHandle<()>> = {
            let mut tasks = self.inner.tasks.lock().unwrap_or_else(|e| e.into_inner());
            tasks.drain(..).collect()
        };
        for t in &tasks {
            t.abort();
        }
        for t in tasks {
            let _ = t.await;
        }
    }
}

/// Binds UDP and TCP on the same port. With port 0, retries a few ports in case the one
/// picked for UDP is taken for TCP.
async fn bind(listen: SocketAddr) -> anyhow::Result<(UdpSocket, TcpListener)> {
    let attempts = if listen.port() == 0 { 10 } else { 1 };
    let mut last_err = None;
    for _ in 0..attempts {
        let socket = bind_udp(listen).with_context(|| format!("binding UDP {listen}"))?;
        let port = socket.local_addr()?.port();
        match TcpListener::bind(SocketAddr::new(listen.ip(), port)).await {
            Ok(listener) => return Ok((socket, listener)),
            Err(e) => last_err = Some(e),
        }
    }
    Err(last_err.expect("at least one attempt")).with_context(|| format!("binding TCP {listen}"))
}

/// The gossip socket, with a receive buffer large enough to absorb bursts (the kernel caps
/// it at `net.core.rmem_max`; failing to enlarge it is not an error).
fn bind_udp(listen: SocketAddr) -> std::io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(
        Domain::for_address(listen),
        Type::DGRAM,
        Some(Protocol::UDP),
    )?;
    if let Err(e) = socket.set_recv_buffer_size(4 << 20) {
        tracing::debug!(error = %e, "could not enlarge the gossip receive buffer");
    }
    socket.bind(&listen.into())?;
    socket.set_nonblocking(true)?;
    UdpSocket::from_std(socket.into())
}
