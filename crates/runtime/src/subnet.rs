//! The machine network's subnet: its CIDR form ([`Subnet`]), and the one a host picks when
//! none is configured: the first /24 of 10.213.0.0/16 that no route of the host covers,
//! read from the kernel by netlink (`pick_subnet`).

use crate::netlink;
use std::net::Ipv4Addr;

/// Default subnets are /24s picked from here (the first one no route on the host covers).
const DEFAULT_POOL: (u8, u8) = (10, 213);

/// A subnet in CIDR form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subnet {
    pub base: Ipv4Addr,
    pub prefix: u8,
}

impl std::str::FromStr for Subnet {
    type Err = String;
    fn from_str(s: &str) -> Result<Subnet, String> {
        let (ip, prefix) = s
            .split_once('/')
            .ok_or_else(|| format!("subnet {s:?}: expected a.b.c.d/prefix"))?;
        let ip: Ipv4Addr = ip.parse().map_err(|e| format!("subnet {s:?}: {e}"))?;
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| (8..=29).contains(p))
            .ok_or_else(|| format!("subnet {s:?}: the prefix must be between 8 and 29"))?;
        let mask = u32::MAX << (32 - prefix);
        Ok(Subnet {
            base: Ipv4Addr::from(u32::from(ip) & mask),
            prefix,
        })
    }
}

impl std::fmt::Display for Subnet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.base, self.prefix)
    }
}

impl Subnet {
    /// The host's address on the bridge (the first one).
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.base) + 1)
    }

    /// Addresses machines can have: all but the network, the gateway and the broadcast.
    pub(crate) fn machine_addresses(&self) -> impl Iterator<Item = Ipv4Addr> {
        let base = u32::from(self.base);
        let size = 1u32 << (32 - self.prefix);
        (base + 2..base + size - 1).map(Ipv4Addr::from)
    }

    pub(crate) fn contains(&self, ip: Ipv4Addr) -> bool {
        let mask = u32::MAX << (32 - self.prefix);
        u32::from(ip) & mask == u32::from(self.base)
    }

    pub(crate) fn overlaps(&self, other: &Subnet) -> bool {
        let p = self.prefix.min(other.prefix);
        let mask = u32::MAX.checked_shl(32 - p as u32).unwrap_or(0);
        u32::from(self.base) & mask == u32::from(other.base) & mask
    }
}

/// The first /24 of the default pool that no route of this host covers, except one that
/// is already `bridge`'s.
pub(crate) fn pick_subnet(bridge: &str) -> Result<Subnet, String> {
    let routes = netlink::Rtnl::open()
        .and_then(|mut rtnl| rtnl.routes())
        .map_err(|e| format!("reading the routes: {e}"))?;
    let bridge = netlink::link_index(bridge);
    let taken: Vec<Subnet> = routes
        .iter()
        .filter(|r| r.prefix > 0 && r.prefix <= 32 && (bridge.is_none() || r.oif != bridge))
        .map(|r| {
            let mask = u32::MAX.checked_shl(32 - r.prefix as u32).unwrap_or(0);
            Subnet {
                base: Ipv4Addr::from(u32::from(r.dst) & mask),
                prefix: r.prefix,
            }
        })
        .collect();
    first_free_subnet(&taken)
}

/// The first /24 of the default pool that overlaps none of `taken`.
fn first_free_subnet(taken: &[Subnet]) -> Result<Subnet, String> {
    (0..=255u8)
        .map(|third| Subnet {
            base: Ipv4Addr::new(DEFAULT_POOL.0, DEFAULT_POOL.1, third, 0),
            prefix: 24,
        })
        .find(|s| !taken.iter().any(|t| t.overlaps(s)))
        .ok_or_else(|| {
            "no free /24 left in 10.213.0.0/16 for the machine network; set --machine-subnet".into()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_free_subnet_skips_every_overlapping_route() {
        let mut taken: Vec<Subnet> = ["10.213.0.0/24", "10.213.1.128/25"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        // A host route (a local address, say).
        taken.push(Subnet {
            base: Ipv4Addr::new(10, 213, 2, 7),
            prefix: 32,
        });
        assert_eq!(
            first_free_subnet(&taken).unwrap(),
            "10.213.3.0/24".parse().unwrap()
        );
        let all: Subnet = "10.0.0.0/8".parse().unwrap();
        assert!(first_free_subnet(&[all]).is_err());
    }
}
