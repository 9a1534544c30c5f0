//! The address plan and the mesh's wanted state, pure (no I/O): which /22 of the private
//! range a host claims, who its peers are (from the host rows' labels), and the nftables
//! script that keeps organizations apart. The shell (`device.rs`, `firewall.rs`) applies it.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};

/// The private range every host's prefix comes from: 10.208.0.0/12.
pub const PRIVATE_RANGE: Prefix = Prefix {
    base: Ipv4Addr::new(10, 208, 0, 0),
    len: 12,
};
/// Each host's prefix: a /22 (1,021 machine addresses), 1,024 of them in the range.
pub const HOST_PREFIX_LEN: u8 = 22;
/// How many host prefixes the range holds.
pub const SLOTS: u32 = 1 << (HOST_PREFIX_LEN - PRIVATE_RANGE.len);

/// Host row label: the host's WireGuard public key (hex).
pub const LABEL_KEY: &str = "mesh_key";
/// Host row label: the UDP address its mesh listens on.
pub const LABEL_ENDPOINT: &str = "mesh_endpoint";
/// Host row label: the prefix its machines' addresses come from.
pub const LABEL_PREFIX: &str = "mesh_prefix";

/// An IPv4 prefix in CIDR form (base address masked).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Prefix {
    pub base: Ipv4Addr,
    pub len: u8,
}

impl Prefix {
    /// The prefix of length `len` holding `ip`.
    pub fn new(ip: Ipv4Addr, len: u8) -> Prefix {
        Prefix {
            base: Ipv4Addr::from(u32::from(ip) & mask(len)),
            len,
        }
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & mask(self.len) == u32::from(self.base)
    }
}

fn mask(len: u8) -> u32 {
    u32::MAX.checked_shl(32 - len as u32).unwrap_or(0)
}

impl std::fmt::Display for Prefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.base, self.len)
    }
}

impl std::str::FromStr for Prefix {
    type Err = String;
    fn from_str(s: &str) -> Result<Prefix, String> {
        let (ip, len) = s
            .split_once('/')
            .ok_or_else(|| format!("prefix {s:?}: expected a.b.c.d/len"))?;
        let ip: Ipv4Addr = ip.parse().map_err(|e| format!("prefix {s:?}: {e}"))?;
        let len: u8 = len
            .parse()
            .ok()
            .filter(|l| *l <= 32)
            .ok_or_else(|| format!("prefix {s:?}: bad length"))?;
        Ok(Prefix::new(ip, len))
    }
}

/// The `slot`-th host prefix of the private range.
fn slot_prefix(slot: u32) -> Prefix {
    let step = 1u32 << (32 - HOST_PREFIX_LEN);
    Prefix {
        base: Ipv4Addr::from(u32::from(PRIVATE_RANGE.base) + (slot % SLOTS) * step),
        len: HOST_PREFIX_LEN,
    }
}

/// FNV-1a: stable across runs and builds.
fn fnv(s: &str) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// The prefix host `host_id` claims when `taken` are claimed by others: its preferred slot
/// (a hash of its id), else the next free one after it. Deterministic, so two hosts that
/// see the same claims agree; `None` when all [`SLOTS`] are taken.
pub fn claim(host_id: &str, taken: &[Prefix]) -> Option<Prefix> {
    let first = (fnv(host_id) % SLOTS as u64) as u32;
    (0..SLOTS)
        .map(|i| slot_prefix(first + i))
        .find(|p| !taken.contains(p))
}

/// Whether host `own_id` must give up `own` because another host claims the same prefix
/// (two hosts that claimed while partitioned): the lower host id keeps it.
pub fn loses_claim(own_id: &str, own: Prefix, claims: &[(String, Prefix)]) -> bool {
    claims
        .iter()
        .any(|(id, p)| *p == own && id.as_str() < own_id)
}

/// A host of the mesh as its host row announces it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub host_id: String,
    pub public_key: [u8; 32],
    pub endpoint: SocketAddr,
    pub prefix: Prefix,
}

/// The peer a host row's labels announce, if they announce a complete one.
pub fn peer_from_labels(host_id: &str, labels: &BTreeMap<String, String>) -> Option<Peer> {
    let key = hex::decode(labels.get(LABEL_KEY)?).ok()?;
    Some(Peer {
        host_id: host_id.to_string(),
        public_key: key.try_into().ok()?,
        endpoint: labels.get(LABEL_ENDPOINT)?.parse().ok()?,
        prefix: labels.get(LABEL_PREFIX)?.parse().ok()?,
    })
}

/// This host's peers among `hosts` (id, labels, whether it is up): every other host that
/// is up and announces a mesh in the private range. Of hosts announcing the same prefix
/// only the lowest id is a peer (the others lost the claim), and none that claims this
/// host's own prefix. Sorted by host id.
pub fn peers<'a>(
    own_id: &str,
    own_prefix: Prefix,
    hosts: impl IntoIterator<Item = (&'a str, &'a BTreeMap<String, String>, bool)>,
) -> Vec<Peer> {
    let mut all: Vec<Peer> = hosts
        .into_iter()
        .filter(|(id, _, up)| *up && *id != own_id)
        .filter_map(|(id, labels, _)| peer_from_labels(id, labels))
        .filter(|p| p.prefix.len == HOST_PREFIX_LEN && PRIVATE_RANGE.contains(p.prefix.base))
        .collect();
    all.sort_by(|a, b| a.host_id.cmp(&b.host_id));
    let mut seen = vec![own_prefix];
    all.retain(|p| {
        let fresh = !seen.contains(&p.prefix);
        seen.push(p.prefix);
        fresh
    });
    all
}

/// The packet mark standing for organization `org` in the isolation rules (never 0, which
/// is "no organization").
pub fn org_mark(org: &str) -> u32 {
    (fnv(org) as u32) | 1
}

/// The nftables script (table `ip <table>`, replaced atomically) that lets a packet from
/// the mesh device `tun` be forwarded only to an address of the source's organization:
/// `members` maps every machine address of the fleet to its organization. A source or
/// destination not in it is dropped. TCP's MSS is clamped to the path MTU on the way into
/// the mesh (its MTU is smaller than the machines').
pub fn isolation_rules(table: &str, tun: &str, members: &BTreeMap<Ipv4Addr, String>) -> String {
    let org_of: Vec<String> = members
        .iter()
        .map(|(ip, org)| format!("{ip} : 0x{:08x}", org_mark(org)))
        .collect();
    let member: Vec<String> = members
        .iter()
        .map(|(ip, org)| format!("{ip} . 0x{:08x}", org_mark(org)))
        .collect();
    let elements = |v: &[String]| {
        if v.is_empty() {
            String::new()
        } else {
            format!(" elements = {{ {} }};", v.join(", "))
        }
    };
    format!(
        "table ip {table}\ndelete table ip {table}\ntable ip {table} {{\n\
         map org_of {{ type ipv4_addr : mark;{} }}\n\
         set member {{ type ipv4_addr . mark;{} }}\n\
         chain forward {{ type filter hook forward priority -10; \
         oifname \"{tun}\" tcp flags syn tcp option maxseg size set rt mtu; \
         iifname \"{tun}\" meta mark set ip saddr map @org_of; \
         iifname \"{tun}\" ip daddr . meta mark != @member counter drop; }}\n}}\n",
        elements(&org_of),
        elements(&member),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_is_deterministic_inside_the_range_and_skips_taken_prefixes() {
        let a = claim("host-a", &[]).unwrap();
        assert_eq!(claim("host-a", &[]), Some(a));
        assert_eq!(a.len, 22);
        assert!(PRIVATE_RANGE.contains(a.base));
        let b = claim("host-a", &[a]).unwrap();
        assert_ne!(a, b);
        assert!(PRIVATE_RANGE.contains(b.base));
        let all: Vec<Prefix> = (0..SLOTS).map(slot_prefix).collect();
        assert_eq!(claim("x", &all), None);
        assert_eq!(slot_prefix(SLOTS - 1).to_string(), "10.223.252.0/22");
    }

    #[test]
    fn the_lower_host_id_keeps_a_prefix_claimed_twice() {
        let p: Prefix = "10.208.4.0/22".parse().unwrap();
        let claims = vec![("a".to_string(), p), ("b".to_string(), p)];
        assert!(!loses_claim("a", p, &claims));
        assert!(loses_claim("b", p, &claims));
        assert!(!loses_claim("b", "10.208.8.0/22".parse().unwrap(), &claims));
    }

    fn labels(key: u8, endpoint: &str, prefix: &str) -> BTreeMap<String, String> {
        [
            (LABEL_KEY, hex::encode([key; 32])),
            (LABEL_ENDPOINT, endpoint.to_string()),
            (LABEL_PREFIX, prefix.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    #[test]
    fn peers_are_the_other_live_hosts_with_a_complete_unique_announcement() {
        let own: Prefix = "10.208.0.0/22".parse().unwrap();
        let b = labels(2, "10.0.0.2:51820", "10.208.4.0/22");
        let c = labels(3, "10.0.0.3:51820", "10.208.4.0/22"); // same prefix as b: c loses
        let d = labels(4, "10.0.0.4:51820", "10.208.8.0/22"); // down
        let e = labels(5, "10.0.0.5:51820", "10.208.0.0/22"); // claims ours
        let f = labels(6, "10.0.0.6:51820", "192.168.0.0/22"); // outside the range
        let mut g = labels(7, "10.0.0.7:51820", "10.208.12.0/22");
        g.remove(LABEL_KEY);
        let me = labels(1, "10.0.0.1:51820", "10.208.0.0/22");
        let hosts = vec![
            ("a", &me, true),
            ("b", &b, true),
            ("c", &c, true),
            ("d", &d, false),
            ("e", &e, true),
            ("f", &f, true),
            ("g", &g, true),
        ];
        let peers = peers("a", own, hosts);
        assert_eq!(peers.len(), 1, "{peers:?}");
        assert_eq!(peers[0].host_id, "b");
        assert_eq!(peers[0].public_key, [2; 32]);
        assert_eq!(peers[0].endpoint, "10.0.0.2:51820".parse().unwrap());
    }

    #[test]
    fn isolation_rules_map_each_address_to_its_organization() {
        let mut members = BTreeMap::new();
        members.insert(Ipv4Addr::new(10, 208, 0, 2), "personal".to_string());
        members.insert(Ipv4Addr::new(10, 208, 4, 2), "other".to_string());
        let rules = isolation_rules("bazaar_mesh_x", "wg-x", &members);
        let mark = format!("0x{:08x}", org_mark("personal"));
        assert!(rules.contains(&format!("10.208.0.2 : {mark}")), "{rules}");
        assert!(rules.contains(&format!("10.208.0.2 . {mark}")), "{rules}");
        assert!(rules.contains("ip daddr . meta mark != @member counter drop"));
        assert_ne!(org_mark("personal"), org_mark("other"));
        assert_ne!(org_mark(""), 0);
        let empty = isolation_rules("t", "wg-x", &BTreeMap::new());
        assert!(!empty.contains("elements"));
    }
}
