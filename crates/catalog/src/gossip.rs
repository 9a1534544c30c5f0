//! The gossip task: drives foca (SWIM membership, failure detection and custom
//! broadcasts) over the node's UDP socket, with its timers, joins through the seeds, says
//! goodbye on leave, and keeps the membership view current. Datagrams carry this node's id,
//! clock and a sequence number inside their tag; stale and replayed ones are refused
//! ([`ReplayGuard`]), and every row a broadcast carries is checked against its owner's key.

use crate::membership::{NodeIdentity, Rejoin, SuspicionTimeouts, REJOIN_ANNOUNCES};
use crate::node::{Command, Counters, Shared};
use crate::replica::Kind;
use crate::wire::{self, BroadcastItem, Goodbye, Refusal, ReplayGuard, DGRAM_GOODBYE, DGRAM_SWIM};
use foca::{AccumulatingRuntime, BroadcastHandler, Foca, Invalidates, OwnedNotification, Timer};
use rand_foca::rngs::SmallRng;
use rand_foca::SeedableRng;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio::time::Instant;

type Swim = Foca<NodeIdentity, foca::PostcardCodec, SmallRng, RowBroadcasts>;

/// The key foca keeps a broadcast under: a newer version of a row replaces the older one
/// still waiting in the dissemination queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BroadcastKey {
    owner: String,
    kind: Kind,
    key: String,
    version: u64,
}

impl Invalidates for BroadcastKey {
    fn invalidates(&self, other: &Self) -> bool {
        self.owner == other.owner
            && self.kind == other.kind
            && self.key == other.key
            && self.version >= other.version
    }
}

/// Why a broadcast item was refused.
#[derive(Debug)]
pub(crate) struct BadBroadcast(String);

impl std::fmt::Display for BadBroadcast {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bad broadcast: {}", self.0)
    }
}

impl std::error::Error for BadBroadcast {}

/// foca's hook for custom broadcasts: merges incoming rows into the replica and tells foca
/// to keep disseminating only what was news here.
pub(crate) struct RowBroadcasts {
    shared: Arc<Shared>,
    /// Set when an item from a peer was news, so the task forwards it at once.
    fresh: Arc<AtomicBool>,
}

impl BroadcastHandler<NodeIdentity> for RowBroadcasts {
    type Key = BroadcastKey;
    type Error = BadBroadcast;

    fn receive_item(
        &mut self,
        data: &[u8],
        sender: Option<&NodeIdentity>,
    ) -> Result<Option<BroadcastKey>, BadBroadcast> {
        let item: BroadcastItem = wire::decode(data).map_err(|e| BadBroadcast(e.to_string()))?;
        let (owner, kind, key, version) = item.ident();
        let bkey = BroadcastKey {
            owner: owner.to_owned(),
            kind,
            key: key.to_owned(),
            version,
        };
        if sender.is_none() {
            // Our own publication, already in the replica.
            return Ok(Some(bkey));
        }
        let news = match item {
            // Only news is worth checking a signature for.
            BroadcastItem::Row(w)
                if self.shared.is_newer(&bkey.owner, kind, &bkey.key, version) =>
            {
                match self.shared.open_row(w) {
                    Some(row) => self.shared.merge(vec![row], None) > 0,
                    None => false,
                }
            }
            BroadcastItem::Row(_) => false,
            BroadcastItem::Hint { .. } if self.shared.is_revoked(&bkey.owner) => false,
            BroadcastItem::Hint { .. } => {
                let news = self.shared.is_newer(&bkey.owner, kind, &bkey.key, version);
                if news && bkey.owner != self.shared.node_id() {
                    self.shared.pull(&bkey.owner);
                }
                news
            }
            BroadcastItem::Revocation(r) => self.shared.revoke(&r).unwrap_or_else(|e| {
                // Not the CA's (or this node has none): dropped, and not forwarded.
                Counters::add(&self.shared.counters.rejected, 1);
                tracing::debug!(error = %e, "refused a revocation");
                false
            }),
        };
        if news && !self.shared.broadcasts_saturated() {
            self.fresh.store(true, Ordering::Relaxed);
            Ok(Some(bkey))
        } else {
            Ok(None)
        }
    }
}

/// A foca timer due at `at`; `seq` keeps equal instants in submission order.
struct Due {
    at: Instant,
    seq: u64,
    timer: Timer<NodeIdentity>,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Due {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// The task's state.
pub(crate) struct Gossip {
    shared: Arc<Shared>,
    socket: UdpSocket,
    swim: Swim,
    /// The configuration `swim` runs with (foca has no getter).
    swim_config: foca::Config,
    runtime: AccumulatingRuntime<NodeIdentity>,
    timers: BinaryHeap<Reverse<Due>>,
    seq: u64,
    /// A hash of foca's member list when the membership view was last rebuilt.
    members_fingerprint: u64,
    fresh: Arc<AtomicBool>,
    commands: mpsc::Receiver<Command>,
    /// The sequence number of the last datagram sent.
    sent: u64,
    replays: ReplayGuard,
    suspicions: SuspicionTimeouts,
    rejoin: Rejoin,
}

impl Gossip {
    pub fn new(shared: Arc<Shared>, socket: UdpSocket, commands: mpsc::Receiver<Command>) -> Self {
        let identity = NodeIdentity {
            node_id: shared.node_id().to_owned(),
            addr: shared.addr,
            bump: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_micros() as u64)
                .unwrap_or(1),
        };
        let fresh = Arc::new(AtomicBool::new(false));
        let handler = RowBroadcasts {
            shared: shared.clone(),
            fresh: fresh.clone(),
        };
        let swim_config = shared.config.foca();
        let suspicions = SuspicionTimeouts::new(
            swim_config.suspect_to_down_after,
            shared.config.probe_period * 2,
        );
        let swim = Foca::with_custom_broadcast(
            identity,
            swim_config.clone(),
            SmallRng::seed_from_u64(rand::random()),
            foca::PostcardCodec,
            handler,
        );
        Gossip {
            shared,
            socket,
            swim,
            swim_config,
            runtime: AccumulatingRuntime::new(),
            timers: BinaryHeap::new(),
            seq: 0,
            members_fingerprint: 0,
            fresh,
            commands,
            sent: 0,
            replays: ReplayGuard::default(),
            suspicions,
            rejoin: Rejoin::default(),
        }
    }

    /// Runs until the node leaves (or the task is aborted).
    pub async fn run(mut self) {
        let mut buf = vec![0u8; 65_536];
        let join_every = (self.shared.config.probe_period * 2).max(Duration::from_millis(200));
        let mut join = tokio::time::interval(join_every);
        join.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let next = self.timers.peek().map(|d| d.0.at);
            tokio::select! {
                received = self.socket.recv_from(&mut buf) => match received {
                    Ok((n, from)) => {
                        self.on_datagram(&buf[..n], from);
                        // Under load, take what else is queued before answering, so news
                        // is forwarded in full packets rather than one packet per item.
                        for _ in 0..64 {
                            let Ok((n, from)) = self.socket.try_recv_from(&mut buf) else {
                                break;
                            };
                            self.on_datagram(&buf[..n], from);
                        }
                        if self.fresh.swap(false, Ordering::Relaxed) {
                            // Forward news right away, not at the next gossip round.
                            let _ = self.swim.broadcast(&mut self.runtime);
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "gossip socket receive failed"),
                },
                command = self.commands.recv() => match command {
                    Some(Command::Broadcast(item)) => self.broadcast(&item),
                    Some(Command::Leave(done)) => {
                        self.leave().await;
                        let _ = done.send(());
                        return;
                    }
                    None => return,
                },
                _ = sleep_until(next) => self.fire_timers(),
                _ = join.tick() => {
                    self.join_if_alone();
                    if self.rejoin.waiting() {
                        self.announce_to_known();
                    }
                }
            }
            self.flush().await;
        }
    }

    fn on_datagram(&mut self, data: &[u8], from: SocketAddr) {
        Counters::add(&self.shared.counters.udp_bytes_received, data.len());
        Counters::add(&self.shared.counters.udp_packets_received, 1);
        if self.shared.is_blocked(&from) {
            Counters::add(&self.shared.counters.dropped_partitioned, 1);
            return;
        }
        let opened = self.shared.keyring().open_datagram(data);
        let Some(datagram) = opened else {
            Counters::add(&self.shared.counters.rejected, 1);
            tracing::trace!(%from, "dropped unauthenticated datagram");
            return;
        };
        if self.shared.is_revoked(datagram.sender) {
            Counters::add(&self.shared.counters.rejected, 1);
            tracing::debug!(%from, sender = datagram.sender, "dropped a revoked host's datagram");
            return;
        }
        match self.replays.admit(&datagram, bazaar_types::now_ms()) {
            Ok(()) => {}
            Err(Refusal::Replayed) => {
                Counters::add(&self.shared.counters.replayed, 1);
                tracing::debug!(%from, sender = datagram.sender, "dropped a replayed datagram");
                return;
            }
            Err(Refusal::Stale) => {
                Counters::add(&self.shared.counters.rejected, 1);
                tracing::debug!(%from, sender = datagram.sender, "dropped a stale datagram");
                return;
            }
        }
        let payload = &datagram.payload[..];
        match datagram.kind {
            DGRAM_SWIM => {
                if let Err(e) = self.swim.handle_data(payload, &mut self.runtime) {
                    tracing::trace!(%from, error = %e, "foca refused a packet");
                }
            }
            DGRAM_GOODBYE => match wire::decode::<Goodbye>(payload) {
                // A node says goodbye for itself only.
                Ok(bye) if bye.node_id == datagram.sender => self.on_goodbye(bye),
                Ok(bye) => tracing::debug!(%from, node = bye.node_id, "goodbye for another node"),
                Err(e) => tracing::debug!(%from, error = %e, "bad goodbye"),
            },
            other => tracing::debug!(%from, kind = other, "unknown datagram kind"),
        }
    }

    /// A peer left cleanly: mark it left and tell foca it is down, so probing stops.
    fn on_goodbye(&mut self, bye: Goodbye) {
        let leaving: Vec<foca::Member<NodeIdentity>> = self
            .swim
            .iter_membership_state()
            .filter(|m| m.id().node_id == bye.node_id && m.id().bump == bye.bump)
            .map(|m| foca::Member::down(m.id().clone()))
            .collect();
        self.shared
            .write()
            .members
            .mark_left(&bye.node_id, bye.bump);
        if let Err(e) = self
            .swim
            .apply_many(leaving.into_iter(), true, &mut self.runtime)
        {
            tracing::debug!(error = %e, "applying a goodbye failed");
        }
        self.refresh_members();
    }

    fn broadcast(&mut self, item: &[u8]) {
        match self.swim.add_broadcast(item) {
            Ok(true) => {
                let _ = self.swim.broadcast(&mut self.runtime);
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "could not broadcast a row"),
        }
    }

    fn fire_timers(&mut self) {
        let now = Instant::now();
        let mut due = Vec::new();
        while self.timers.peek().is_some_and(|d| d.0.at <= now) {
            due.push(self.timers.pop().expect("peeked").0);
        }
        // foca asks that late timers be handled in its own order (a stable sort keeps
        // submission order among equals).
        due.sort_by(|a, b| a.timer.cmp(&b.timer));
        for d in due {
            if let Err(e) = self.swim.handle_timer(d.timer, &mut self.runtime) {
                tracing::debug!(error = %e, "foca timer failed");
            }
        }
        let overdue = self
            .suspicions
            .overdue(self.swim.iter_membership_state(), now);
        if !overdue.is_empty() {
            tracing::info!(
                ?overdue,
                "suspicions outlived their timeout: declaring down"
            );
            let downs = overdue.into_iter().map(foca::Member::down);
            if let Err(e) = self.swim.apply_many(downs, true, &mut self.runtime) {
                tracing::debug!(error = %e, "declaring suspects down failed");
            }
        }
        self.refresh_members();
    }

    fn join_if_alone(&mut self) {
        if self.swim.num_members() > 0 {
            return;
        }
        for seed in &self.shared.config.seeds {
            if *seed == self.shared.addr {
                continue;
            }
            // foca needs an identity to address; a seed's id is unknown until it answers,
            // and an announce is accepted by whoever holds the address.
            let dst = NodeIdentity {
                node_id: String::new(),
                addr: *seed,
                bump: 0,
            };
            if let Err(e) = self.swim.announce(dst, &mut self.runtime) {
                tracing::debug!(%seed, error = %e, "announce failed");
            }
        }
    }

    /// Announces this node to a few members it knows, whatever their state ([`Rejoin`]).
    fn announce_to_known(&mut self) {
        let targets = Rejoin::targets(
            self.swim.iter_membership_state(),
            self.shared.addr,
            REJOIN_ANNOUNCES,
            rand::random::<u32>() as usize,
        );
        for dst in targets {
            if let Err(e) = self.swim.announce(dst, &mut self.runtime) {
                tracing::debug!(error = %e, "announce failed");
            }
        }
    }

    async fn leave(&mut self) {
        self.shared.write().left = true;
        let bye = wire::encode(&Goodbye {
            node_id: self.shared.node_id().to_owned(),
            bump: self.swim.identity().bump,
        });
        let peers: Vec<SocketAddr> = self.swim.iter_members().map(|m| m.id().addr).collect();
        for peer in peers {
            let datagram = self.seal(DGRAM_GOODBYE, &bye);
            self.send(&datagram, peer).await;
        }
        if let Err(e) = self.swim.leave_cluster(&mut self.runtime) {
            tracing::debug!(error = %e, "leave_cluster failed");
        }
        self.flush().await;
        self.shared
            .notify_status(&[self.shared.node_id().to_owned()]);
    }

    /// Sends what foca asked to send, schedules its timers, and reacts to notifications.
    async fn flush(&mut self) {
        self.send_queued().await;
        let now = Instant::now();
        while let Some((after, timer)) = self.runtime.to_schedule() {
            self.seq += 1;
            self.timers.push(Reverse(Due {
                at: now + after,
                seq: self.seq,
                timer,
            }));
        }
        let mut membership_changed = false;
        let mut announce = false;
        while let Some(n) = self.runtime.to_notify() {
            announce |= self.rejoin.note(&n);
            match &n {
                OwnedNotification::Defunct => {
                    tracing::warn!("this node was declared down and cannot rejoin")
                }
                OwnedNotification::Rejoin(id) => {
                    tracing::info!(bump = id.bump, "rejoined the cluster with a new identity")
                }
                _ => {}
            }
            membership_changed = true;
        }
        if membership_changed {
            self.refresh_members();
        }
        if announce {
            self.announce_to_known();
            self.send_queued().await;
        }
        self.shared.counters.broadcast_backlog.store(
            self.swim.custom_broadcast_backlog() as u64,
            Ordering::Relaxed,
        );
    }

    async fn send_queued(&mut self) {
        while let Some((to, data)) = self.runtime.to_send() {
            let datagram = self.seal(DGRAM_SWIM, &data);
            self.send(&datagram, to.addr).await;
        }
    }

    /// Signs a datagram from this node, with the next sequence number.
    fn seal(&mut self, kind: u8, payload: &[u8]) -> Vec<u8> {
        self.sent += 1;
        let now = bazaar_types::now_ms();
        self.shared
            .keyring()
            .seal_datagram(kind, self.shared.node_id(), now, self.sent, payload)
    }

    async fn send(&self, datagram: &[u8], to: SocketAddr) {
        if self.shared.is_blocked(&to) {
            Counters::add(&self.shared.counters.dropped_partitioned, 1);
            return;
        }
        match self.socket.send_to(datagram, to).await {
            Ok(n) => {
                Counters::add(&self.shared.counters.udp_bytes_sent, n);
                Counters::add(&self.shared.counters.udp_packets_sent, 1);
            }
            Err(e) => tracing::debug!(%to, error = %e, "gossip send failed"),
        }
    }

    fn refresh_members(&mut self) {
        // Rebuilding the view allocates; skip it when foca's member list is unchanged.
        let fingerprint = self.swim.iter_membership_state().fold(0u64, |acc, m| {
            let id = m.id();
            let state = m.state() as u64;
            let port = u64::from(id.addr.port());
            let x = (id.bump ^ (port << 48) ^ (state << 40) ^ u64::from(m.incarnation()))
                .wrapping_mul(0x9E37_79B9_7F4A_7C15);
            acc.wrapping_add(x ^ (x >> 29))
        });
        if fingerprint == self.members_fingerprint {
            return;
        }
        self.members_fingerprint = fingerprint;
        let me = self.shared.node_id();
        let changed = {
            let mut st = self.shared.write();
            st.members.refresh(
                self.swim
                    .iter_membership_state()
                    // An identity of our own previous life may still be listed.
                    .filter(|m| m.id().node_id != me)
                    .map(|m| (m.id(), m.state())),
            )
        };
        if !changed.is_empty() {
            tracing::debug!(node = self.shared.node_id(), ?changed, "membership changed");
            self.shared.notify_status(&changed);
            self.tune_transmissions();
        }
    }

    /// Scales how often each broadcast is retransmitted with the cluster's size, like
    /// memberlist's 4 × log10(n + 1) but with 5: a node misses a change with probability
    /// about e^-(retransmissions), and anti-entropy repairs the rare miss.
    fn tune_transmissions(&mut self) {
        let n = self.swim.num_members() as f64 + 1.0;
        let wanted = ((n + 1.0).log10() * 5.0).ceil().clamp(3.0, 15.0) as u8;
        if self.swim_config.max_transmissions.get() != wanted {
            let mut config = self.swim_config.clone();
            config.max_transmissions = std::num::NonZeroU8::new(wanted).expect("at least 3");
            match self.swim.set_config(config.clone()) {
                Ok(()) => self.swim_config = config,
                Err(e) => tracing::debug!(error = %e, "could not retune foca"),
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
