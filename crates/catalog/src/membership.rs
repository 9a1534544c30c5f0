//! Membership: the SWIM identity given to foca, this node's view of every host's liveness
//! (alive, suspect, dead, left) derived from foca's member list and from goodbyes, the
//! timeout of suspicions that foca would otherwise keep forever ([`SuspicionTimeouts`]),
//! and the announces that take a node back in after it changed identity ([`Rejoin`]).

use crate::records::HostStatus;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::time::Instant;

/// A node's SWIM identity. The host id names the host; `bump` (the start time in µs) makes
/// a restarted host with the same id a new identity that wins over its previous one, and
/// [`foca::Identity::renew`] increments it when the cluster declared this node down (after
/// a partition, say) so that it rejoins at once.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeIdentity {
    pub node_id: String,
    pub addr: SocketAddr,
    pub bump: u64,
}

impl foca::Identity for NodeIdentity {
    /// Members are unique by gossip address: a seed is reached by address alone, before
    /// its host id is known.
    type Addr = SocketAddr;

    fn renew(&self) -> Option<Self> {
        Some(NodeIdentity {
            bump: self.bump.wrapping_add(1),
            ..self.clone()
        })
    }

    fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        (self.bump, &self.node_id) > (adversary.bump, &adversary.node_id)
    }
}

/// What this node believes about one host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberInfo {
    pub status: HostStatus,
    pub addr: SocketAddr,
    pub bump: u64,
}

/// Every host's liveness as seen from here. Hosts the failure detector has never heard of
/// are absent; hosts it forgot (or renamed away) stay, as dead.
#[derive(Debug, Default)]
pub struct MemberView {
    members: HashMap<String, MemberInfo>,
    /// Hosts that said goodbye, with the bump of the identity that left.
    left: HashMap<String, u64>,
}

impl MemberView {
    /// This host's status, if the failure detector knows it.
    pub fn status(&self, node_id: &str) -> Option<HostStatus> {
        self.members.get(node_id).map(|m| m.status)
    }

    pub fn get(&self, node_id: &str) -> Option<&MemberInfo> {
        self.members.get(node_id)
    }

    /// Every known host with its info.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &MemberInfo)> {
        self.members.iter()
    }

    /// Records a goodbye; the next [`MemberView::refresh`] reports the host as left.
    pub fn mark_left(&mut self, node_id: &str, bump: u64) {
        self.left.insert(node_id.to_owned(), bump);
    }

    /// Rebuilds the view from foca's member list (every identity it knows, down ones
    /// included). Returns the hosts whose status changed.
    pub fn refresh<'a>(
        &mut self,
        members: impl Iterator<Item = (&'a NodeIdentity, foca::State)>,
    ) -> Vec<String> {
        let mut fresh: HashMap<String, MemberInfo> = HashMap::new();
        for (id, state) in members {
            let status = match state {
                foca::State::Alive => HostStatus::Alive,
                foca::State::Suspect => HostStatus::Suspect,
                foca::State::Down => HostStatus::Dead,
            };
            let info = MemberInfo {
                status,
                addr: id.addr,
                bump: id.bump,
            };
            match fresh.get(&id.node_id) {
                // Several identities of one host (it restarted on another address): the
                // newest speaks for it.
                Some(known) if known.bump >= id.bump => {}
                _ => {
                    fresh.insert(id.node_id.clone(), info);
                }
            }
        }
        for (node_id, info) in fresh.iter_mut() {
            if self.left.get(node_id) == Some(&info.bump) {
                info.status = HostStatus::Left;
            }
        }
        // Hosts foca no longer lists are gone: dead, unless they left.
        for (node_id, old) in &self.members {
            if !fresh.contains_key(node_id) {
                let status = if self.left.get(node_id) == Some(&old.bump) {
                    HostStatus::Left
                } else {
                    HostStatus::Dead
                };
                fresh.insert(
                    node_id.clone(),
                    MemberInfo {
                        status,
                        ..old.clone()
                    },
                );
            }
        }
        let mut changed: Vec<String> = fresh
            .iter()
            .filter(|(id, info)| self.members.get(*id).map(|o| o.status) != Some(info.status))
            .map(|(id, _)| id.clone())
            .collect();
        changed.sort();
        self.members = fresh;
        changed
    }

    /// Addresses of the members that answer (alive or merely suspect).
    pub fn live_addrs(&self) -> Vec<SocketAddr> {
        self.members
            .values()
            .filter(|m| matches!(m.status, HostStatus::Alive | HostStatus::Suspect))
            .map(|m| m.addr)
            .collect()
    }
}

/// Ends suspicions on this node, as SWIM has every member that hears of one do.
///
/// foca times a suspicion out only on the node whose probe failed, with a timer that dies
/// when that node changes identity (`renew`, after the cluster declared it down: a partition
/// healing does exactly that) or stops; the nodes that heard of the suspicion by gossip set
/// no timer at all. A suspected member clears itself only by refuting, and it refutes only
/// if the suspicion reaches it; when the few retransmissions of the suspicion were spent
/// while it was cut off, nobody tells it, probes of it succeed, and every node that heard
/// keeps it suspect until some later probe happens to fail (a minute and more, seen in
/// `bazaar lab` after `heal`; a suspect host's machines refuse changes meanwhile).
///
/// So each node declares down a member it has held suspect, at the same incarnation, for
/// longer than foca's own timeout plus a margin (the prober, whose timer starts first,
/// normally does it before). The member then hears it is down, rejoins with a new identity
/// and is alive again everywhere, as after any other partition.
#[derive(Debug)]
pub struct SuspicionTimeouts {
    limit: Duration,
    /// Each suspect identity, the incarnation it is suspected at, and since when.
    since: HashMap<NodeIdentity, (foca::Incarnation, Instant)>,
}

impl SuspicionTimeouts {
    /// Suspicions end after `suspect_to_down_after` (foca's timeout) plus `margin`.
    pub fn new(suspect_to_down_after: Duration, margin: Duration) -> Self {
        SuspicionTimeouts {
            limit: suspect_to_down_after + margin,
            since: HashMap::new(),
        }
    }

    /// Notes which members are suspect now; answers those suspect, at the same
    /// incarnation, for longer than the limit (to be declared down).
    pub fn overdue<'a>(
        &mut self,
        members: impl Iterator<Item = &'a foca::Member<NodeIdentity>>,
        now: Instant,
    ) -> Vec<NodeIdentity> {
        let mut still = HashMap::with_capacity(self.since.len());
        let mut overdue = Vec::new();
        for m in members.filter(|m| m.state() == foca::State::Suspect) {
            let since = match self.since.get(m.id()) {
                Some(&(incarnation, since)) if incarnation == m.incarnation() => since,
                _ => now,
            };
            if now.saturating_duration_since(since) > self.limit {
                overdue.push(m.id().clone());
            }
            still.insert(m.id().clone(), (m.incarnation(), since));
        }
        self.since = still;
        overdue
    }
}

/// Takes a node that changed identity back into the cluster.
///
/// foca renews a node's identity when it hears the cluster declared it down (a partition
/// healing, say): the node then forgets its timers, counts as disconnected, and tells only
/// the members it holds active, by gossip addressed to their identities. It starts probing
/// again only once a message reaches its new identity. When every node of a side renews at
/// once (each told "you are down" by the other side in the same instant, as a heal does),
/// each one's gossip is addressed to the others' old identities, which foca drops: nobody
/// answers, nobody probes, and the sides stay apart for good (the catalog's partition test
/// failed so, about once in 25 runs). An announce is accepted by address whatever
/// identity the receiver holds now, so a renewed node announces itself to a few known
/// members right away, and again at every join tick until foca says it is active.
#[derive(Debug, Default)]
pub struct Rejoin {
    waiting: bool,
}

/// How many members a renewed node announces itself to at once.
pub const REJOIN_ANNOUNCES: usize = 3;

impl Rejoin {
    /// Notes one of foca's notifications; answers whether to announce now (a new identity).
    pub fn note(&mut self, notification: &foca::OwnedNotification<NodeIdentity>) -> bool {
        match notification {
            foca::OwnedNotification::Rejoin(_) => {
                self.waiting = true;
                true
            }
            foca::OwnedNotification::Active => {
                self.waiting = false;
                false
            }
            _ => false,
        }
    }

    /// Whether the node renewed its identity and has not been answered yet.
    pub fn waiting(&self) -> bool {
        self.waiting
    }

    /// Up to `count` members to announce to, one per address other than `me`, taken
    /// around the list from `start` (a random number, so that retries reach others).
    pub fn targets<'a>(
        members: impl Iterator<Item = &'a foca::Member<NodeIdentity>>,
        me: SocketAddr,
        count: usize,
        start: usize,
    ) -> Vec<NodeIdentity> {
        let mut known: Vec<&NodeIdentity> = Vec::new();
        for m in members {
            if m.id().addr != me && !known.iter().any(|k| k.addr == m.id().addr) {
                known.push(m.id());
            }
        }
        known.sort_by_key(|id| id.addr);
        let len = known.len();
        (0..count.min(len))
            .map(|i| known[(start + i) % len].clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use foca::Identity as _;

    fn id(node: &str, port: u16, bump: u64) -> NodeIdentity {
        NodeIdentity {
            node_id: node.into(),
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            bump,
        }
    }

    #[test]
    fn renewed_identity_wins() {
        let a = id("a", 1, 5);
        let b = a.renew().unwrap();
        assert!(b.win_addr_conflict(&a));
        assert!(!a.win_addr_conflict(&b));
    }

    #[test]
    fn view_tracks_states_goodbyes_and_restarts() {
        let mut v = MemberView::default();
        let (a, b) = (id("a", 1, 1), id("b", 2, 1));
        let changed = v.refresh([(&a, foca::State::Alive), (&b, foca::State::Suspect)].into_iter());
        assert_eq!(changed, vec!["a".to_string(), "b".to_string()]);
        assert_eq!(v.status("b"), Some(HostStatus::Suspect));
        assert_eq!(v.live_addrs().len(), 2);

        v.mark_left("a", 1);
        let changed = v.refresh([(&a, foca::State::Down), (&b, foca::State::Down)].into_iter());
        assert_eq!(changed.len(), 2);
        assert_eq!(v.status("a"), Some(HostStatus::Left));
        assert_eq!(v.status("b"), Some(HostStatus::Dead));

        // b restarts on another port: the newer identity speaks for it.
        let b2 = id("b", 3, 2);
        v.refresh([(&b, foca::State::Down), (&b2, foca::State::Alive)].into_iter());
        assert_eq!(v.status("b"), Some(HostStatus::Alive));
        // a is forgotten by foca: still left.
        assert_eq!(v.status("a"), Some(HostStatus::Left));
    }

    /// A few foca nodes with the catalog's SWIM settings on a simulated network and clock,
    /// driven the way the gossip task drives them.
    mod sim {
        use super::super::*;
        use crate::CatalogConfig;
        use foca::{AccumulatingRuntime, Foca, Member, NoCustomBroadcast, PostcardCodec, Timer};
        use rand_foca::rngs::SmallRng;
        use rand_foca::SeedableRng;

        pub struct Node {
            pub swim: Foca<NodeIdentity, PostcardCodec, SmallRng, NoCustomBroadcast>,
            runtime: AccumulatingRuntime<NodeIdentity>,
            timers: Vec<(Duration, Timer<NodeIdentity>)>,
            /// `None`: foca alone, without the catalog's suspicion timeouts.
            suspicions: Option<SuspicionTimeouts>,
            rejoin: Rejoin,
        }

        pub struct Sim {
            pub nodes: Vec<Node>,
            now: Duration,
            start: Instant,
            /// Whether nodes announce themselves after a new identity ([`Rejoin`]).
            pub rejoin_announces: bool,
            /// Node indexes that cannot reach each other: one side of a partition.
            cut: Vec<usize>,
            announces: usize,
        }

        impl Sim {
            /// `n` nodes with the lab's settings (probe every 250 ms, dead within 2 s),
            /// every one but the first joined through the first.
            pub fn new(n: usize, timeouts: bool, seed: u64) -> Sim {
                let mut config = CatalogConfig::new("x", "r", "127.0.0.1:0".parse().unwrap(), "s");
                config.probe_period = Duration::from_millis(250);
                config.dead_after = Duration::from_secs(2);
                let foca_config = config.foca();
                let nodes = (0..n)
                    .map(|i| Node {
                        swim: Foca::new(
                            NodeIdentity {
                                node_id: format!("n{i}"),
                                addr: SocketAddr::from(([127, 0, 0, 1], 5000 + i as u16)),
                                bump: 1000,
                            },
                            foca_config.clone(),
                            SmallRng::seed_from_u64(seed + i as u64),
                            PostcardCodec,
                        ),
                        runtime: AccumulatingRuntime::new(),
                        timers: Vec::new(),
                        suspicions: timeouts.then(|| {
                            SuspicionTimeouts::new(
                                foca_config.suspect_to_down_after,
                                config.probe_period * 2,
                            )
                        }),
                        rejoin: Rejoin::default(),
                    })
                    .collect();
                let mut sim = Sim {
                    nodes,
                    now: Duration::ZERO,
                    start: Instant::now(),
                    rejoin_announces: timeouts,
                    cut: Vec::new(),
                    announces: 0,
                };
                let first = sim.id(0);
                for i in 1..n {
                    let node = &mut sim.nodes[i];
                    node.swim
                        .announce(first.clone(), &mut node.runtime)
                        .unwrap();
                }
                sim.deliver();
                sim
            }

            pub fn id(&self, i: usize) -> NodeIdentity {
                self.nodes[i].swim.identity().clone()
            }

            /// What node `i` believes of the member at node `j`'s address.
            pub fn view(&self, i: usize, j: usize) -> Option<(NodeIdentity, foca::State)> {
                let addr = self.id(j).addr;
                self.nodes[i]
                    .swim
                    .iter_membership_state()
                    .find(|m| m.id().addr == addr)
                    .map(|m| (m.id().clone(), m.state()))
            }

            /// Cuts nodes `side` off from the others (both ways); an empty side heals.
            pub fn partition(&mut self, side: &[usize]) {
                self.cut = side.to_vec();
            }

            /// Every node is told "you are down" (foca's TurnUndead) by a node it holds
            /// down, `by[i]` for node `i`, all in the same instant, before any answer
            /// travels: as both sides of a heal announce to each other at once.
            pub fn all_told_down(&mut self, by: &[usize]) {
                use foca::Codec as _;
                let mut datagrams = Vec::new();
                for (i, &j) in by.iter().enumerate() {
                    let header = foca::Header {
                        src: self.id(j),
                        src_incarnation: 0,
                        dst: self.id(i),
                        message: foca::Message::TurnUndead,
                    };
                    let mut data = Vec::new();
                    PostcardCodec.encode_header(&header, &mut data).unwrap();
                    datagrams.push((i, data));
                }
                for (i, data) in datagrams {
                    let node = &mut self.nodes[i];
                    node.swim.handle_data(&data, &mut node.runtime).unwrap();
                }
                self.deliver();
            }

            fn reaches(&self, from: usize, to: usize) -> bool {
                self.cut.contains(&from) == self.cut.contains(&to)
            }

            /// Advances the clock by `d`, 10 ms at a time.
            pub fn run(&mut self, d: Duration) {
                let end = self.now + d;
                while self.now < end {
                    self.now += Duration::from_millis(10);
                    let now = self.start + self.now;
                    // The gossip task's join tick, every two probe periods.
                    let join_tick = self.now.as_millis().is_multiple_of(500);
                    for node in &mut self.nodes {
                        if join_tick && self.rejoin_announces && node.rejoin.waiting() {
                            self.announces += 1;
                            node.announce_to_known(self.announces);
                        }
                        let mut due: Vec<Timer<NodeIdentity>> = Vec::new();
                        node.timers.retain(|(at, t)| {
                            let fire = *at <= self.now;
                            if fire {
                                due.push(t.clone());
                            }
                            !fire
                        });
                        due.sort();
                        for t in due {
                            let _ = node.swim.handle_timer(t, &mut node.runtime);
                        }
                        if let Some(s) = &mut node.suspicions {
                            let overdue = s.overdue(node.swim.iter_membership_state(), now);
                            // As the gossip task: foca is called only with something to
                            // apply (any call lets a disconnected node count as connected).
                            if !overdue.is_empty() {
                                let downs = overdue.into_iter().map(Member::down);
                                node.swim
                                    .apply_many(downs, true, &mut node.runtime)
                                    .unwrap();
                            }
                        }
                    }
                    self.deliver();
                }
            }

            /// Delivers every datagram sent (and what answering them sends) at once, but
            /// across a partition.
            fn deliver(&mut self) {
                loop {
                    let mut sent = Vec::new();
                    for (from, node) in self.nodes.iter_mut().enumerate() {
                        while let Some((after, timer)) = node.runtime.to_schedule() {
                            node.timers.push((self.now + after, timer));
                        }
                        let mut announce = false;
                        while let Some(n) = node.runtime.to_notify() {
                            announce |= node.rejoin.note(&n);
                        }
                        if announce && self.rejoin_announces {
                            self.announces += 1;
                            node.announce_to_known(self.announces);
                        }
                        while let Some((to, data)) = node.runtime.to_send() {
                            sent.push((from, to.addr, data));
                        }
                    }
                    if sent.is_empty() {
                        return;
                    }
                    for (from, addr, data) in sent {
                        let Some(to) = self
                            .nodes
                            .iter()
                            .position(|n| n.swim.identity().addr == addr)
                        else {
                            continue;
                        };
                        if self.reaches(from, to) {
                            let node = &mut self.nodes[to];
                            let _ = node.swim.handle_data(&data, &mut node.runtime);
                        }
                    }
                }
            }
        }

        impl Node {
            /// What the gossip task's `announce_to_known` does.
            fn announce_to_known(&mut self, start: usize) {
                let me = self.swim.identity().addr;
                let targets = Rejoin::targets(
                    self.swim.iter_membership_state(),
                    me,
                    REJOIN_ANNOUNCES,
                    start,
                );
                for dst in targets {
                    let _ = self.swim.announce(dst, &mut self.runtime);
                }
            }
        }
    }

    /// The lab's heal defect: nodes that hold a member suspect without a timer (they heard
    /// the suspicion from a prober that then renewed its identity, which drops its timers,
    /// and the member itself never heard it) kept it suspect while every probe of it
    /// succeeded.
    #[test]
    fn a_suspicion_nobody_times_out_ends_anyway() {
        for timeouts in [false, true] {
            let mut sim = sim::Sim::new(3, timeouts, 7);
            sim.run(Duration::from_secs(3));
            for i in 0..3 {
                for j in (0..3).filter(|j| *j != i) {
                    assert_eq!(
                        sim.view(i, j).unwrap().1,
                        foca::State::Alive,
                        "{i} sees {j}"
                    );
                }
            }
            let c = sim.id(2);
            // Every node but n2 heard that n2 is suspect; n2 never did (the suspicion's
            // retransmissions were spent while it was cut off), and nobody has a timer.
            for node in &mut sim.nodes[..2] {
                let heard = foca::Member::new(c.clone(), 0, foca::State::Suspect);
                let mut runtime = foca::AccumulatingRuntime::new();
                node.swim
                    .apply_many(std::iter::once(heard), false, &mut runtime)
                    .unwrap();
            }
            assert_eq!(sim.view(0, 2).unwrap().1, foca::State::Suspect);
            sim.run(Duration::from_secs(20));
            let (seen, state) = sim.view(0, 2).unwrap();
            if timeouts {
                assert_eq!(state, foca::State::Alive, "n0 sees n2 alive again");
                assert!(seen.bump > c.bump, "under a new identity");
                for i in 0..3 {
                    for j in (0..3).filter(|j| *j != i) {
                        assert_eq!(
                            sim.view(i, j).unwrap().1,
                            foca::State::Alive,
                            "{i} sees {j}"
                        );
                    }
                }
            } else {
                // foca alone: still suspect 20 s later, though n2 answers every probe.
                assert_eq!((seen, state), (c, foca::State::Suspect));
            }
        }
    }

    /// Both sides of a healed partition told "you are down" by the other in the same
    /// instant renew their identities at once: each renewed node's gossip goes to the
    /// others' old identities and is dropped. Without the announces of [`Rejoin`] nobody
    /// is answered and the sides stay apart; with them the cluster is whole again.
    #[test]
    fn sides_that_renew_at_once_after_a_partition_come_together() {
        for announces in [false, true] {
            let mut sim = sim::Sim::new(5, true, 3);
            sim.rejoin_announces = announces;
            sim.run(Duration::from_secs(3));
            sim.partition(&[3, 4]);
            sim.run(Duration::from_secs(5));
            assert_eq!(sim.view(0, 3).unwrap().1, foca::State::Down);
            assert_eq!(sim.view(3, 0).unwrap().1, foca::State::Down);
            sim.partition(&[]);
            sim.all_told_down(&[3, 4, 3, 0, 1]);
            sim.run(Duration::from_secs(20));
            let whole = (0..5).all(|i| {
                (0..5)
                    .filter(|j| *j != i)
                    .all(|j| sim.view(i, j).is_some_and(|(_, s)| s == foca::State::Alive))
            });
            let views: Vec<_> = (0..5)
                .map(|i| {
                    (0..5)
                        .map(|j| sim.view(i, j).map(|v| v.1))
                        .collect::<Vec<_>>()
                })
                .collect();
            assert_eq!(whole, announces, "announces {announces}: {views:?}");
        }
    }
}
