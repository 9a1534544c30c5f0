//! The hosts this host pulls the cluster's images from ([`NodePeers`], a
//! [`bazaar_image::peers::PeerSource`] over the node): every other alive host of the
//! catalog, over the host link (mTLS, the certificate is the credential) when both have
//! cluster certificates, else on its API address with the cluster secret, as other calls
//! between hosts go (`bazaar-api`'s `to_node`). Each host asks its peers in an order of
//! its own (by a hash of both ids), so hosts pulling at once spread over the holders.
//! Suspect hosts are asked after the alive ones, not left out: a host that has just
//! started does not yet know every peer as alive, and the one that was pushed to may be
//! among them (a missing answer costs a connect timeout of 500 ms).

use bazaar_catalog::HostStatus;
use bazaar_image::peers::{Peer, PeerSource};
use bazaar_image::Digest;
use bazaar_node::NodeHandle;
use std::time::Duration;

/// The peers of a node.
#[derive(Debug, Clone)]
pub struct NodePeers {
    node: NodeHandle,
    plain: reqwest::Client,
}

impl NodePeers {
    pub fn new(node: NodeHandle) -> anyhow::Result<NodePeers> {
        let plain = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(500))
            .pool_idle_timeout(Duration::from_secs(5))
            .build()?;
        Ok(NodePeers { node, plain })
    }
}

/// The order `me` asks its peers in: the alive ones, then the suspect ones (dead and
/// departed hosts are not asked), each by the hash of both ids.
pub fn peer_order<'a>(me: &str, hosts: &'a [(String, HostStatus)]) -> Vec<&'a str> {
    let mut asked: Vec<(bool, Digest, &str)> = hosts
        .iter()
        .filter(|(id, status)| {
            id != me && matches!(status, HostStatus::Alive | HostStatus::Suspect)
        })
        .map(|(id, status)| {
            let rank = Digest::of(format!("{me}\0{id}").as_bytes());
            (*status != HostStatus::Alive, rank, id.as_str())
        })
        .collect();
    asked.sort();
    asked.into_iter().map(|(_, _, id)| id).collect()
}

impl PeerSource for NodePeers {
    fn peers(&self) -> Vec<Peer> {
        let Some(catalog) = self.node.catalog() else {
            return Vec::new();
        };
        let hosts = catalog.hosts();
        let statuses: Vec<(String, HostStatus)> = hosts
            .iter()
            .map(|h| (h.record.id.clone(), h.status))
            .collect();
        let link = self.node.host_link();
        peer_order(self.node.host_id(), &statuses)
            .into_iter()
            .filter_map(|id| hosts.iter().find(|h| h.record.id == id))
            .map(
                |h| match link.and_then(|l| Some((l, l.url_for(&h.record.api_addr, "")?))) {
                    Some((link, base)) => Peer {
                        host_id: h.record.id.clone(),
                        base,
                        client: link.client.clone(),
                        bearer: None,
                    },
                    None => Peer {
                        host_id: h.record.id.clone(),
                        base: format!("http://{}", h.record.api_addr),
                        client: self.plain.clone(),
                        bearer: Some(self.node.cluster_secret().to_string()),
                    },
                },
            )
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(list: &[(&str, HostStatus)]) -> Vec<(String, HostStatus)> {
        list.iter().map(|(id, s)| (id.to_string(), *s)).collect()
    }

    #[test]
    fn alive_peers_are_asked_first_then_suspect_ones_never_dead_ones_or_itself() {
        let all = hosts(&[
            ("me", HostStatus::Alive),
            ("s1", HostStatus::Suspect),
            ("a1", HostStatus::Alive),
            ("d1", HostStatus::Dead),
            ("a2", HostStatus::Alive),
            ("l1", HostStatus::Left),
            ("s2", HostStatus::Suspect),
        ]);
        let order = peer_order("me", &all);
        assert_eq!(order.len(), 4, "{order:?}");
        let mut alive = order[..2].to_vec();
        alive.sort();
        assert_eq!(alive, ["a1", "a2"]);
        let mut suspect = order[2..].to_vec();
        suspect.sort();
        assert_eq!(suspect, ["s1", "s2"]);
    }

    #[test]
    fn hosts_ask_the_same_peers_in_orders_of_their_own() {
        let ids: Vec<String> = (0..16).map(|i| format!("h{i}")).collect();
        let all: Vec<(String, HostStatus)> = ids
            .iter()
            .map(|id| (id.clone(), HostStatus::Alive))
            .collect();
        let firsts: std::collections::BTreeSet<&str> =
            ids.iter().map(|me| peer_order(me, &all)[0]).collect();
        // Sixteen hosts pulling at once do not all start at one holder.
        assert!(firsts.len() > 4, "{firsts:?}");
        assert_eq!(peer_order("h0", &all), peer_order("h0", &all), "stable");
    }
}
