//! The hosts this host pulls the cluster's images from ([`NodePeers`], a
//! [`bazaar_image::peers::PeerSource`] over the node): every other alive host of the
//! catalog, over the host link (mTLS, the certificate is the credential) when both have
//! cluster certificates, else on its API address with the cluster secret, as other calls
//! between hosts go (`bazaar-api`'s `to_node`). Each host asks its peers in an order of
//! its own (by a hash of both ids), so hosts pulling at once spread over the holders.

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

/// The order `me` asks its peers in: by the hash of both ids.
pub fn peer_order(me: &str, peers: &mut [(String, Peer)]) {
    peers.sort_by_cached_key(|(id, _)| Digest::of(format!("{me}\0{id}").as_bytes()));
}

impl PeerSource for NodePeers {
    fn peers(&self) -> Vec<Peer> {
        let Some(catalog) = self.node.catalog() else {
            return Vec::new();
        };
        let me = self.node.host_id().to_string();
        let mut peers: Vec<(String, Peer)> = catalog
            .hosts()
            .into_iter()
            .filter(|h| h.record.id != me && h.status == HostStatus::Alive)
            .map(|h| {
                let link = self.node.host_link();
                let peer = match link.and_then(|l| Some((l, l.url_for(&h.record.api_addr, "")?))) {
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
                };
                (h.record.id, peer)
            })
            .collect();
        peer_order(&me, &mut peers);
        peers.into_iter().map(|(_, p)| p).collect()
    }
}
