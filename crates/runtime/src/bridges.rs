//! The bridges of a host's machine network (issue 36): a Linux bridge holds at most 1,023
//! ports ([`BRIDGE_PORTS`]), fewer than a /19 has addresses, so the subnet is cut into
//! aligned slices (a /23 each by default, [`SLICE_PREFIX`]) and slice `k` has a bridge of
//! its own. Pure: which bridge an address is on, the bridges' names, the gateway's address
//! and the route each one carries, and the `ip`-family nftables rules naming them; the
//! links themselves are made by [`crate::network`].
//!
//! One L3 subnet and one gateway address whatever the number of bridges, so nothing
//! changes for machines (their `eth0` has `address/prefix` of the whole subnet and a
//! default route through the gateway), the internal DNS (it listens on the gateway), the
//! mesh or the proxy:
//! - bridge 0 keeps the name it always had, `bz-<hash>`, and has the gateway as
//!   `gateway/prefix` of the subnet (the connected route of the whole subnet);
//! - bridge `k > 0`, `bz-<hash>-<k>`, made when the first address of its slice gets a
//!   namespace, has the gateway as `gateway/32` (no route of its own) and the route
//!   `slice dev bz-<hash>-<k>`, more specific than the subnet's: the host reaches (and
//!   answers ARP for the gateway on) every bridge, and its reverse-path check holds.
//!
//! Machines reach each other neither on a bridge (ports isolated) nor across two (they
//! are in different L2 domains, and the host's `forward` chain drops whatever it would
//! route from one of this host's bridges into another, as it does into the same one).

use crate::subnet::Subnet;
use std::net::Ipv4Addr;

/// The ports a Linux bridge holds (the kernel's `BR_MAX_PORTS`, 1,024, less port number 0):
/// a veth beyond it fails with `EXFULL`, "Exchange full". No slice has more addresses.
pub const BRIDGE_PORTS: usize = 1023;

/// The default slice a bridge holds: a /23, 512 addresses (a /22's 1,024 would be one more
/// than a bridge's ports). A /19 has 16 of them; a subnet of a /23 or smaller has one bridge.
pub const SLICE_PREFIX: u8 = 23;

/// The bridges of one host's machine network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bridges {
    /// Bridge 0's name (`bz-<8 hex>`): the others are named after it.
    first: String,
    subnet: Subnet,
    /// The prefix of each bridge's slice of the subnet.
    slice_prefix: u8,
}

impl Bridges {
    /// The bridges of `subnet`, the first named `first`, each holding a /23 of it (or the
    /// whole subnet when it is no larger).
    pub fn new(first: &str, subnet: Subnet) -> Bridges {
        Bridges {
            first: first.to_string(),
            subnet,
            slice_prefix: subnet.prefix.max(SLICE_PREFIX),
        }
    }

    /// The bridges of `subnet` with slices of `slice_prefix` (smaller than the default ones:
    /// tests span two bridges with a few addresses). Refused when a slice would be larger
    /// than the subnet or than a bridge's ports, or when there would be over 128 bridges.
    pub fn with_slice_prefix(
        first: &str,
        subnet: Subnet,
        slice_prefix: u8,
    ) -> Result<Bridges, String> {
        if slice_prefix < subnet.prefix.max(SLICE_PREFIX) || slice_prefix > 30 {
            return Err(format!(
                "slices of /{slice_prefix}: a bridge's slice of {subnet} must be a /{} to a /30",
                subnet.prefix.max(SLICE_PREFIX)
            ));
        }
        if slice_prefix - subnet.prefix > 7 {
            return Err(format!(
                "slices of /{slice_prefix}: over 128 bridges for {subnet}"
            ));
        }
        Ok(Bridges {
            first: first.to_string(),
            subnet,
            slice_prefix,
        })
    }

    /// How many bridges the subnet has room for (they are made as their slices are used).
    pub fn count(&self) -> usize {
        1 << (self.slice_prefix - self.subnet.prefix)
    }

    /// The bridge whose slice holds `ip` (an address of the subnet).
    pub fn of(&self, ip: Ipv4Addr) -> usize {
        let index = u32::from(ip).wrapping_sub(u32::from(self.subnet.base));
        (index >> (32 - self.slice_prefix)) as usize
    }

    /// Bridge `k`'s name: `bz-<hash>` for the first, `bz-<hash>-<k>` for the others (at most
    /// 14 characters: a link's name has 15).
    pub fn name(&self, k: usize) -> String {
        if k == 0 {
            self.first.clone()
        } else {
            format!("{}-{k}", self.first)
        }
    }

    /// Every bridge's name, the first first.
    pub fn names(&self) -> impl Iterator<Item = String> + '_ {
        (0..self.count()).map(|k| self.name(k))
    }

    /// An nftables interface name pattern that matches every bridge of this host and no
    /// other link (its veths are `b<hash>…`, other hosts' bridges have other hashes).
    pub fn pattern(&self) -> String {
        format!("{}*", self.first)
    }

    /// The prefix of the gateway's address on bridge `k`: the subnet's on the first (its
    /// connected route covers the whole subnet), 32 on the others (no route of its own).
    pub fn gateway_prefix(&self, k: usize) -> u8 {
        if k == 0 {
            self.subnet.prefix
        } else {
            32
        }
    }

    /// The slice of bridge `k`.
    pub fn slice(&self, k: usize) -> Subnet {
        let size = 1u32 << (32 - self.slice_prefix);
        Subnet {
            base: Ipv4Addr::from(u32::from(self.subnet.base) + k as u32 * size),
            prefix: self.slice_prefix,
        }
    }

    /// The route bridge `k` carries: its slice, for all but the first (whose address's
    /// connected route covers the subnet).
    pub fn route(&self, k: usize) -> Option<Subnet> {
        (k > 0).then(|| self.slice(k))
    }

    /// The `ip`-family table `table`: nothing routed from one of the bridges into another
    /// (or back into the same); nothing from them to the host but replies to what it opened
    /// and DNS (UDP/TCP 53) to the gateway; outbound masquerade when `nat` is on.
    pub fn ip_table_rules(&self, table: &str, nat: bool) -> String {
        let mut rules = format!(
            "table ip {table}\ndelete table ip {table}\ntable ip {table} {{\n\
             chain forward {{ type filter hook forward priority 0; iifname \"{br}\" oifname \"{br}\" drop; }}\n\
             chain input {{ type filter hook input priority 0; \
             iifname \"{br}\" ct state established,related accept; \
             iifname \"{br}\" ip daddr {gw} meta l4proto {{ udp, tcp }} th dport 53 accept; \
             iifname \"{br}\" counter drop; }}\n",
            br = self.pattern(),
            gw = self.subnet.gateway(),
        );
        if nat {
            rules += &format!(
                "chain postrouting {{ type nat hook postrouting priority 100; ip saddr {} oifname != \"{}\" masquerade; }}\n",
                self.subnet,
                self.pattern()
            );
        }
        rules + "}\n"
    }
}

/// Whether one more address fits when `held` of `subnet`'s are handed out: a clear
/// refusal at create (409, and the host bids for nothing: label `bazaar_network_full`)
/// instead of a launch that fails.
pub fn check_room(subnet: &Subnet, held: usize) -> Result<(), String> {
    if held >= subnet.capacity() {
        return Err(format!(
            "this host's machine network is full: its subnet {subnet} holds at most {} machines, and {held} have addresses",
            subnet.capacity()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subnet(s: &str) -> Subnet {
        s.parse().unwrap()
    }

    #[test]
    fn a_19_is_cut_into_16_bridges_of_a_23_each_by_address() {
        let bridges = Bridges::new("bz-0a1b2c3d", subnet("10.192.32.0/19"));
        assert_eq!(bridges.count(), 16);
        let on = |ip: [u8; 4]| bridges.of(Ipv4Addr::from(ip));
        assert_eq!(on([10, 192, 32, 2]), 0);
        assert_eq!(on([10, 192, 33, 255]), 0);
        assert_eq!(on([10, 192, 34, 0]), 1);
        assert_eq!(on([10, 192, 35, 255]), 1);
        assert_eq!(on([10, 192, 63, 254]), 15);
        // Every bridge holds fewer addresses than a bridge has ports, and every address of
        // the subnet is on one of them.
        let mut per_bridge = vec![0usize; bridges.count()];
        for ip in subnet("10.192.32.0/19").machine_addresses() {
            let k = bridges.of(ip);
            assert!(bridges.slice(k).contains(ip), "{ip} outside slice {k}");
            per_bridge[k] += 1;
        }
        assert_eq!(per_bridge[0], 510, "less the network's and the gateway's");
        assert_eq!(per_bridge[15], 511, "less the broadcast address");
        assert!(per_bridge.iter().all(|n| *n <= BRIDGE_PORTS));
        assert_eq!(per_bridge.iter().sum::<usize>(), 8189);
    }

    #[test]
    fn bridges_are_named_after_the_first_and_carry_the_gateway_and_their_slice() {
        let bridges = Bridges::new("bz-0a1b2c3d", subnet("10.192.0.0/19"));
        assert_eq!(bridges.name(0), "bz-0a1b2c3d");
        assert_eq!(bridges.name(1), "bz-0a1b2c3d-1");
        assert_eq!(bridges.names().last().unwrap(), "bz-0a1b2c3d-15");
        // The first: the gateway with the subnet's prefix (its connected route), no other
        // route; the others: the gateway alone, and their slice's route.
        assert_eq!(bridges.gateway_prefix(0), 19);
        assert_eq!(bridges.route(0), None);
        assert_eq!(bridges.gateway_prefix(3), 32);
        assert_eq!(bridges.route(3), Some(subnet("10.192.6.0/23")));
        // The largest subnet (a /16) has 128 bridges, and their names fit a link's 15.
        let largest = Bridges::new("bz-0a1b2c3d", subnet("10.200.0.0/16"));
        assert_eq!(largest.count(), 128);
        assert!(largest.names().all(|n| n.len() <= 15));
        // The pattern matches all of them, and neither the host's veths nor other hosts'.
        let pattern = bridges.pattern();
        let matches = |name: &str| name.starts_with(pattern.trim_end_matches('*'));
        assert!(largest.names().all(|n| matches(&n)));
        assert!(!matches("b0a1b2c3d2") && !matches("bz-0a1b2c3e") && !matches("wg-0a1b2c3d"));
    }

    #[test]
    fn a_small_subnet_keeps_one_bridge_and_tests_may_slice_it_finer() {
        let small = Bridges::new("bz-0a1b2c3d", subnet("10.1.2.0/24"));
        assert_eq!(small.count(), 1);
        assert_eq!(small.gateway_prefix(0), 24);
        assert!(subnet("10.1.2.0/24")
            .machine_addresses()
            .all(|ip| small.of(ip) == 0));
        let sliced = Bridges::with_slice_prefix("bz-x", subnet("10.1.2.0/24"), 25).unwrap();
        assert_eq!(sliced.count(), 2);
        assert_eq!(sliced.of(Ipv4Addr::new(10, 1, 2, 127)), 0);
        assert_eq!(sliced.of(Ipv4Addr::new(10, 1, 2, 128)), 1);
        assert_eq!(sliced.route(1), Some(subnet("10.1.2.128/25")));
        // Slices larger than the subnet or than a bridge's ports, or too many of them.
        assert!(Bridges::with_slice_prefix("bz-x", subnet("10.1.2.0/24"), 23).is_err());
        assert!(Bridges::with_slice_prefix("bz-x", subnet("10.0.0.0/19"), 22).is_err());
        assert!(Bridges::with_slice_prefix("bz-x", subnet("10.0.0.0/16"), 24).is_err());
        assert!(Bridges::with_slice_prefix("bz-x", subnet("10.1.2.0/24"), 31).is_err());
    }

    #[test]
    fn the_firewall_covers_every_bridge_by_one_pattern() {
        let bridges = Bridges::new("bz-0a1b2c3d", subnet("10.192.0.0/19"));
        let rules = bridges.ip_table_rules("bazaar_bz_0a1b2c3d", true);
        assert!(
            rules.contains("iifname \"bz-0a1b2c3d*\" oifname \"bz-0a1b2c3d*\" drop"),
            "{rules}"
        );
        assert!(rules.contains(
            "iifname \"bz-0a1b2c3d*\" ip daddr 10.192.0.1 meta l4proto { udp, tcp } th dport 53 accept"
        ));
        assert!(rules.contains("iifname \"bz-0a1b2c3d*\" counter drop"));
        assert!(rules.contains("ip saddr 10.192.0.0/19 oifname != \"bz-0a1b2c3d*\" masquerade"));
        assert!(!bridges
            .ip_table_rules("bazaar_bz_0a1b2c3d", false)
            .contains("masquerade"));
    }

    #[test]
    fn a_host_is_full_when_every_address_of_its_subnet_is_held() {
        let s = subnet("10.192.0.0/19");
        assert!(check_room(&s, 8188).is_ok());
        let err = check_room(&s, 8189).unwrap_err();
        assert_eq!(
            err,
            "this host's machine network is full: its subnet 10.192.0.0/19 holds at most 8189 machines, and 8189 have addresses"
        );
    }
}
