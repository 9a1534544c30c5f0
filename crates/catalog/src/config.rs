//! The catalog's configuration and how it maps onto foca's SWIM settings.

use std::net::SocketAddr;
use std::num::{NonZeroU8, NonZeroUsize};
use std::time::Duration;

/// How a node joins and runs the catalog. [`CatalogConfig::new`] gives LAN defaults.
#[derive(Clone, Debug)]
pub struct CatalogConfig {
    /// This host's id; the owner of every row this node publishes.
    pub node_id: String,
    pub region: String,
    /// Where to bind: one UDP socket (SWIM and broadcasts) and a TCP listener on the same
    /// port (anti-entropy). Port 0 picks a free port.
    pub listen: SocketAddr,
    /// The address other nodes use to reach this one; defaults to the bound address.
    pub advertise: Option<SocketAddr>,
    /// Addresses of nodes to join through; retried in the background until one answers.
    pub seeds: Vec<SocketAddr>,
    /// Shared by the whole cluster; every anti-entropy frame is signed with it.
    pub cluster_secret: String,
    /// The gossip keyring (see [`crate::keyring`]): the first key encrypts datagrams, every
    /// key decrypts them. Empty: one key derived from `cluster_secret`.
    pub gossip_keys: Vec<[u8; crate::keyring::KEY_LEN]>,
    /// This host's certificate of the cluster CA, when the cluster has one: anti-entropy
    /// runs over mTLS, rows are taken only with keys the CA endorsed, and the CA's
    /// revocations are honoured (see [`crate::trust`]). `None`: the cluster secret and
    /// trust on first use, as before certificates.
    pub cluster: Option<ClusterIdentity>,
    /// This host's own key: every row it publishes is signed with it, and other nodes
    /// refuse rows of this host id signed with any other key (see [`crate::trust`]). Keep
    /// it across restarts; [`CatalogConfig::new`] makes a fresh one.
    pub signing_key: crate::trust::SigningKey,
    /// The largest anti-entropy frame accepted, checked from the frame's header before
    /// anything is read.
    pub max_frame: usize,
    /// How often each node probes one random member (SWIM).
    pub probe_period: Duration,
    /// A killed node is declared dead on every other node within about this long.
    pub dead_after: Duration,
    /// How often (jittered ±25%) each node runs anti-entropy with `sync_fanout` peers.
    pub anti_entropy_interval: Duration,
    pub sync_fanout: usize,
    /// Tombstones of deleted rows are collected this long after they were written.
    pub tombstone_ttl: Duration,
    /// The largest datagram sent or accepted.
    pub max_packet_size: usize,
    /// Where this node keeps the rows it owns that no store rebuilds (apps, app secrets,
    /// quotas, edge certificates: [`crate::own_rows`]), so that they outlive a restart of
    /// every node at once. `None`: in memory only, as for a node that has peers to learn
    /// them back from.
    pub own_rows_dir: Option<std::path::PathBuf>,
}

/// A host's identity in a cluster with a CA, as the catalog uses it.
#[derive(Clone, Debug)]
pub struct ClusterIdentity {
    /// The host's key and certificate (renewals swap it in place).
    pub identity: bazaar_pki::IdentityHandle,
    /// The CA certificate, PEM.
    pub ca_pem: String,
    /// The CA's endorsement of [`CatalogConfig::signing_key`] for this host id
    /// ([`bazaar_pki::ClusterCa::endorse_row_key`]), published in the host row.
    pub key_endorsement: String,
    /// Revocations known at start (the agent keeps those it learnt across restarts).
    pub revocations: Vec<bazaar_pki::Revocation>,
}

impl CatalogConfig {
    /// A configuration with LAN defaults: probe every 1 s, dead within 8 s, anti-entropy
    /// every 2 s with 2 peers, tombstones kept 10 min, 1400-byte datagrams, no seeds.
    pub fn new(
        node_id: impl Into<String>,
        region: impl Into<String>,
        listen: SocketAddr,
        cluster_secret: impl Into<String>,
    ) -> Self {
        CatalogConfig {
            node_id: node_id.into(),
            region: region.into(),
            listen,
            advertise: None,
            seeds: Vec::new(),
            cluster_secret: cluster_secret.into(),
            gossip_keys: Vec::new(),
            cluster: None,
            signing_key: crate::trust::SigningKey::from_bytes(&rand::random()),
            max_frame: crate::wire::MAX_FRAME,
            probe_period: Duration::from_secs(1),
            dead_after: Duration::from_secs(8),
            anti_entropy_interval: Duration::from_secs(2),
            sync_fanout: 2,
            tombstone_ttl: Duration::from_secs(600),
            max_packet_size: 1400,
            own_rows_dir: None,
        }
    }

    /// Checks the settings that would make the node misbehave.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(!self.node_id.is_empty(), "node_id must not be empty");
        anyhow::ensure!(
            self.node_id.len() <= 128,
            "node_id must be at most 128 bytes"
        );
        anyhow::ensure!(
            self.max_frame >= 1024 * 1024,
            "max_frame must be at least 1 MiB"
        );
        anyhow::ensure!(
            !self.probe_period.is_zero(),
            "probe_period must not be zero"
        );
        anyhow::ensure!(
            self.dead_after > self.probe_period,
            "dead_after must exceed probe_period"
        );
        anyhow::ensure!(
            !self.anti_entropy_interval.is_zero(),
            "anti_entropy_interval must not be zero"
        );
        anyhow::ensure!(
            self.max_packet_size >= 512 && self.max_packet_size <= 65_507,
            "max_packet_size must be within 512..=65507"
        );
        Ok(())
    }

    /// The foca (SWIM) settings that meet `dead_after`.
    ///
    /// Detection takes about one probe period until some node probes the dead one (every
    /// node probes one member per period, so with several nodes that is quick), one
    /// period for the probe to fail (direct then indirect), then the suspicion timeout,
    /// then a few gossip rounds to tell everyone. The suspicion timeout is what is left of
    /// `dead_after` after three probe periods, and never less than one period.
    pub(crate) fn foca(&self) -> foca::Config {
        let period = self.probe_period;
        let suspect = self
            .dead_after
            .saturating_sub(period * 3)
            .max(period)
            .max(Duration::from_millis(1));
        let mut c = foca::Config::simple();
        c.probe_period = period;
        c.probe_rtt = (period * 2 / 5).max(Duration::from_millis(1));
        c.num_indirect_probes = NonZeroUsize::new(3).expect("non-zero");
        c.max_transmissions = NonZeroU8::new(10).expect("non-zero");
        c.suspect_to_down_after = suspect;
        c.remove_down_after = Some(Duration::from_secs(24 * 3600));
        c.max_packet_size = NonZeroUsize::new(self.foca_packet_size()).expect("non-zero");
        // Tell members we consider down that we do, so they rejoin with a new identity
        // (partitions heal by themselves), and keep announcing to them: every probe
        // period, so that after a partition every host learns within about a period that
        // it must rejoin (every third period left a 50-host heal at ~6 s; a few datagrams a
        // second while some member is down).
        c.notify_down_members = true;
        c.periodic_announce = Some(foca::PeriodicParams {
            frequency: (period * 10).max(Duration::from_secs(1)),
            num_members: NonZeroUsize::new(1).expect("non-zero"),
        });
        c.periodic_announce_to_down_members = Some(foca::PeriodicParams {
            frequency: period,
            num_members: NonZeroUsize::new(3).expect("non-zero"),
        });
        c.periodic_gossip = Some(foca::PeriodicParams {
            frequency: (period / 5).clamp(Duration::from_millis(50), Duration::from_millis(200)),
            num_members: NonZeroUsize::new(3).expect("non-zero"),
        });
        c
    }

    /// The largest foca packet: a datagram less our header, nonce and tag.
    pub(crate) fn foca_packet_size(&self) -> usize {
        self.max_packet_size - crate::keyring::datagram_overhead(&self.node_id)
    }

    /// The largest broadcast item carried in full; larger rows travel as hints. Leaves
    /// room for foca's header (two identities) and framing.
    pub(crate) fn max_broadcast_item(&self) -> usize {
        self.foca_packet_size()
            .saturating_sub(2 * (self.node_id.len() + 64) + 64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_detection_fits_dead_after() {
        let c = CatalogConfig::new("h", "ams", "127.0.0.1:0".parse().unwrap(), "s");
        c.validate().unwrap();
        let f = c.foca();
        assert!(f.probe_rtt < f.probe_period);
        assert!(f.probe_period * 3 + f.suspect_to_down_after <= c.dead_after);
        assert!(c.max_broadcast_item() > 900);
    }
}
