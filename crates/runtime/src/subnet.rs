//! The machine network's subnet: its CIDR form ([`Subnet`]), the first free address of it
//! ([`Subnet::first_free`]), and the one a host picks when none is configured: the first
//! /19 of 10.192.0.0/12 that no route of the host covers, read from the kernel by netlink
//! (`pick_subnet`). A /19 holds 8,189 machine addresses (issue 36; the /24 held 253), on
//! 16 bridges of a /23 each (`crate::bridges`: a bridge has 1,023 ports); 10.192.0.0/12
//! is private and outside the mesh's 10.208.0.0/12, and holds 128 of them, so many agents
//! can share one machine (tests, dev clusters).

use crate::netlink;
use std::net::Ipv4Addr;

/// Default subnets are picked from here (the first one no route on the host covers).
const DEFAULT_POOL: Subnet = Subnet {
    base: Ipv4Addr::new(10, 192, 0, 0),
    prefix: 12,
};
/// The size of a default subnet: a /19, 8,189 machine addresses.
pub const DEFAULT_PREFIX: u8 = 19;

/// A subnet in CIDR form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subnet {
    pub base: Ipv4Addr,
    pub prefix: u8,
}

/// A subnet is at most a /16 (65,533 machines): a host's machines each take a user
/// namespace id range of 65,536 ids (`crate::idranges`), 65,520 of which fit in the
/// 32-bit id space, and a veth's name (`b<8 hex><index>`) leaves 6 digits to the index.
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
            .filter(|p| (16..=29).contains(p))
            .ok_or_else(|| format!("subnet {s:?}: the prefix must be between 16 and 29"))?;
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

    /// How many addresses machines can have (those after the gateway, before the broadcast
    /// address).
    pub fn capacity(&self) -> usize {
        (1usize << (32 - self.prefix)) - 3
    }

    /// The first machine address not in `used`, or why there is none: every one of them
    /// is held (the host is full; a larger `--machine-subnet` holds more).
    pub fn first_free(
        &self,
        used: &std::collections::HashSet<Ipv4Addr>,
    ) -> Result<Ipv4Addr, String> {
        self.machine_addresses()
            .find(|ip| !used.contains(ip))
            .ok_or_else(|| {
                format!(
                    "all {} machine addresses of this host's machine network {self} are in use",
                    self.capacity()
                )
            })
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

/// The first /19 of the default pool that no route of this host covers, except those
/// through links `own` (the host's own bridges, when it picks its subnet again).
pub(crate) fn pick_subnet(own: &[u32]) -> Result<Subnet, String> {
    let routes = netlink::Rtnl::open()
        .and_then(|mut rtnl| rtnl.routes())
        .map_err(|e| format!("reading the routes: {e}"))?;
    let taken: Vec<Subnet> = routes
        .iter()
        .filter(|r| r.prefix > 0 && r.prefix <= 32 && !r.oif.is_some_and(|oif| own.contains(&oif)))
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

/// The first /19 of the default pool that overlaps none of `taken`.
fn first_free_subnet(taken: &[Subnet]) -> Result<Subnet, String> {
    let step = 1u32 << (32 - DEFAULT_PREFIX);
    (0..1u32 << (DEFAULT_PREFIX - DEFAULT_POOL.prefix))
        .map(|slot| Subnet {
            base: Ipv4Addr::from(u32::from(DEFAULT_POOL.base) + slot * step),
            prefix: DEFAULT_PREFIX,
        })
        .find(|s| !taken.iter().any(|t| t.overlaps(s)))
        .ok_or_else(|| {
            format!("no free /{DEFAULT_PREFIX} left in {DEFAULT_POOL} for the machine network; set --machine-subnet")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_free_subnet_skips_every_overlapping_route() {
        let mut taken: Vec<Subnet> = ["10.192.0.0/24", "10.192.33.128/25"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        // A host route (a local address, say).
        taken.push(Subnet {
            base: Ipv4Addr::new(10, 192, 64, 7),
            prefix: 32,
        });
        assert_eq!(
            first_free_subnet(&taken).unwrap(),
            "10.192.96.0/19".parse().unwrap()
        );
        // A route covering the whole pool, or a larger one, leaves nothing.
        let all = Subnet {
            base: Ipv4Addr::new(10, 0, 0, 0),
            prefix: 8,
        };
        assert!(first_free_subnet(&[all]).is_err());
        let pool: Vec<Subnet> = (0..128u32)
            .map(|i| Subnet {
                base: Ipv4Addr::from(u32::from(DEFAULT_POOL.base) + (i << 13)),
                prefix: 19,
            })
            .collect();
        assert_eq!(pool[127].to_string(), "10.207.224.0/19");
        let err = first_free_subnet(&pool).unwrap_err();
        assert!(err.contains("10.192.0.0/12"), "{err}");
        // The default holds thousands of machines, and none of the mesh's addresses.
        assert_eq!(pool[0].capacity(), 8189);
        let mesh = Subnet {
            base: Ipv4Addr::new(10, 208, 0, 0),
            prefix: 12,
        };
        assert!(!pool.iter().any(|s| s.overlaps(&mesh)));
    }

    #[test]
    fn addresses_are_handed_out_once_reused_after_release_and_run_out_clearly() {
        use std::collections::HashSet;
        let subnet: Subnet = "10.192.0.0/21".parse().unwrap();
        let mut used = HashSet::new();
        for _ in 0..subnet.capacity() {
            let ip = subnet.first_free(&used).unwrap();
            assert!(subnet.contains(ip));
            assert_ne!(ip, subnet.gateway());
            assert_ne!(ip, subnet.base, "the network's own address");
            assert!(used.insert(ip), "{ip} handed out twice");
        }
        assert_eq!(used.len(), 2045);
        assert!(!used.contains(&Ipv4Addr::new(10, 192, 7, 255)), "broadcast");
        let err = subnet.first_free(&used).unwrap_err();
        assert_eq!(
            err,
            "all 2045 machine addresses of this host's machine network 10.192.0.0/21 are in use"
        );
        // A released address is the next one handed out.
        let released = Ipv4Addr::new(10, 192, 5, 4);
        used.remove(&released);
        assert_eq!(subnet.first_free(&used), Ok(released));
        // A small configured subnet runs out as soon.
        let small: Subnet = "10.1.2.0/29".parse().unwrap();
        let mut used = HashSet::new();
        while let Ok(ip) = small.first_free(&used) {
            used.insert(ip);
        }
        assert_eq!(used.len(), 5);
    }
}
