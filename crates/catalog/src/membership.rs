//! Membership: the SWIM identity given to foca, and this node's view of every host's
//! liveness (alive, suspect, dead, left) derived from foca's member list and from goodbyes.

use crate::records::HostStatus;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::SocketAddr;

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
}
