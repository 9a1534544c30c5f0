//! The pure plan of a lab: its names (bridge, namespaces, veths), its addresses, each
//! agent's listeners and command line, the faults in force and the nftables ruleset each
//! host's namespace needs for them. No I/O: the shell (`net.rs`, `procs.rs`, `disk.rs`)
//! carries the plan out.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

/// Port of every agent's HTTP listener (API and host interface) on its host's address.
pub const API_PORT: u16 = 4280;
/// Port of every agent's catalog gossip (UDP and TCP).
pub const GOSSIP_PORT: u16 = 4380;
/// Port of every agent's edge proxy.
pub const PROXY_PORT: u16 = 80;
/// Port of every agent's proxy hop listener (mTLS, other hosts' proxies).
pub const PROXY_HOP_PORT: u16 = 4680;
/// The agents' WireGuard mesh (UDP): every lab host is on the private network (issue 16).
pub const MESH_PORT: u16 = 51820;
/// The interface of a host inside its namespace (the far end of its veth).
pub const HOST_IFACE: &str = "eth0";
/// The nftables table the lab owns in each host's namespace.
pub const NFT_TABLE: &str = "bazaar_lab";
/// Labs pick a free /24 from here unless told a subnet.
pub const DEFAULT_POOL: &str = "10.250.0.0/16";
/// How many gossip seeds an agent joins through (the first hosts but itself).
const SEEDS: usize = 3;

/// An IPv4 subnet in CIDR form, normalized to its network address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
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
            .map_err(|_| format!("subnet {s:?}: bad prefix"))?;
        Subnet::new(ip, prefix).map_err(|e| format!("subnet {s:?}: {e}"))
    }
}

impl TryFrom<String> for Subnet {
    type Error = String;
    fn try_from(s: String) -> Result<Subnet, String> {
        s.parse()
    }
}

impl From<Subnet> for String {
    fn from(s: Subnet) -> String {
        s.to_string()
    }
}

impl std::fmt::Display for Subnet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.base, self.prefix)
    }
}

impl Subnet {
    /// The subnet of `ip` with `prefix` bits (0..=32).
    pub fn new(ip: Ipv4Addr, prefix: u8) -> Result<Subnet, String> {
        if prefix > 32 {
            return Err("the prefix must be at most 32".into());
        }
        Ok(Subnet {
            base: Ipv4Addr::from(u32::from(ip) & Self::mask(prefix)),
            prefix,
        })
    }

    fn mask(prefix: u8) -> u32 {
        u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
    }

    /// The `n`-th address of the subnet (0 is the network address).
    pub fn nth(&self, n: u32) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.base) + n)
    }

    /// Addresses usable by interfaces: all but the network and broadcast addresses.
    pub fn usable(&self) -> u32 {
        (1u64 << (32 - u32::from(self.prefix))).saturating_sub(2) as u32
    }

    /// True if the two subnets share an address.
    pub fn overlaps(&self, other: &Subnet) -> bool {
        let p = self.prefix.min(other.prefix);
        let m = Self::mask(p);
        u32::from(self.base) & m == u32::from(other.base) & m
    }

    /// The subnets of `prefix` bits this one is made of, in order.
    pub fn split(&self, prefix: u8) -> impl Iterator<Item = Subnet> + '_ {
        let count = if prefix >= self.prefix && prefix <= 32 {
            1u64 << (prefix - self.prefix)
        } else {
            0
        };
        let step = 1u64 << (32 - u32::from(prefix));
        (0..count).map(move |i| Subnet {
            base: Ipv4Addr::from((u64::from(u32::from(self.base)) + i * step) as u32),
            prefix,
        })
    }
}

/// The first subnet of `pool` split into `prefix`-bit pieces that overlaps none of `taken`
/// (the routes and addresses of the machine).
pub fn pick_subnet(pool: &Subnet, prefix: u8, taken: &[Subnet]) -> Option<Subnet> {
    pool.split(prefix)
        .find(|s| !taken.iter().any(|t| t.overlaps(s)))
}

/// Everything about a lab that follows from its id, subnet, size and regions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LabPlan {
    /// Four hex digits that name everything the lab creates on the machine.
    pub id: String,
    pub subnet: Subnet,
    pub hosts: Vec<HostPlan>,
}

/// One host of a lab: a namespace with one address, running one agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostPlan {
    /// 1-based.
    pub index: usize,
    /// `h<index>`.
    pub name: String,
    /// The network namespace (`/run/netns/<netns>`).
    pub netns: String,
    /// The root-namespace end of the host's veth, a port of the lab bridge.
    pub veth: String,
    pub addr: Ipv4Addr,
    /// The MAC address of its interface (fixed, so neighbors can be written in advance).
    pub mac: String,
    pub region: String,
}

impl LabPlan {
    /// Plans `hosts` hosts, regions assigned in turn.
    pub fn new(
        id: &str,
        subnet: Subnet,
        hosts: usize,
        regions: &[String],
    ) -> Result<LabPlan, String> {
        if id.is_empty() || id.len() > 4 || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(format!("lab id {id:?}: 1 to 4 letters or digits"));
        }
        if hosts == 0 {
            return Err("a lab needs at least one host".into());
        }
        if regions.is_empty() {
            return Err("a lab needs at least one region".into());
        }
        // The bridge takes the first address.
        if hosts as u64 + 1 > u64::from(subnet.usable()) {
            return Err(format!(
                "subnet {subnet} has room for {} hosts, not {hosts}",
                subnet.usable().saturating_sub(1)
            ));
        }
        let hosts = (1..=hosts)
            .map(|index| HostPlan {
                index,
                name: format!("h{index}"),
                netns: format!("bzlab-{id}-{index}"),
                veth: format!("bzl-{id}-{index}"),
                addr: subnet.nth(index as u32 + 1),
                mac: mac(id, index),
                region: regions[(index - 1) % regions.len()].clone(),
            })
            .collect();
        Ok(LabPlan {
            id: id.to_string(),
            subnet,
            hosts,
        })
    }

    /// The lab's bridge in the root namespace.
    pub fn bridge(&self) -> String {
        format!("bzlab-{}", self.id)
    }

    /// Prefix of every namespace of the lab.
    pub fn netns_prefix(&self) -> String {
        format!("bzlab-{}-", self.id)
    }

    /// Prefix of every root-namespace veth of the lab.
    pub fn veth_prefix(&self) -> String {
        format!("bzl-{}-", self.id)
    }

    /// The bridge's address: the root namespace reaches the hosts through it.
    pub fn bridge_addr(&self) -> Ipv4Addr {
        self.subnet.nth(1)
    }

    /// The bridge's MAC address (fixed: a bridge otherwise takes its ports' lowest).
    pub fn bridge_mac(&self) -> String {
        mac(&self.id, 0)
    }

    /// `ip -batch` lines giving `host` (or the root namespace, with `None`) a permanent
    /// neighbor entry for every other member of the lab. Learned entries would not do: the
    /// kernel's ARP table is shared by all namespaces (1024 entries by default), and a lab
    /// of N hosts needs about N² of them; permanent entries do not count.
    pub fn neighbors(&self, host: Option<&HostPlan>) -> String {
        let (dev, me) = match host {
            Some(h) => (HOST_IFACE.to_string(), Some(h.index)),
            None => (self.bridge(), None),
        };
        let mut lines = String::new();
        if me.is_some() {
            lines.push_str(&format!(
                "neigh replace {} lladdr {} dev {dev} nud permanent\n",
                self.bridge_addr(),
                self.bridge_mac()
            ));
        }
        for h in self.hosts.iter().filter(|h| Some(h.index) != me) {
            lines.push_str(&format!(
                "neigh replace {} lladdr {} dev {dev} nud permanent\n",
                h.addr, h.mac
            ));
        }
        lines
    }

    /// The host called `name`: `h2`, or just `2`.
    pub fn host(&self, name: &str) -> Result<&HostPlan, String> {
        let name = name.trim();
        let index = name.strip_prefix('h').unwrap_or(name);
        index
            .parse::<usize>()
            .ok()
            .and_then(|i| self.hosts.get(i.checked_sub(1)?))
            .ok_or_else(|| {
                format!(
                    "no host {name:?} in this lab (hosts are h1..h{})",
                    self.hosts.len()
                )
            })
    }

    /// The `bazaar agent` arguments of `host` (after the executable).
    pub fn agent_args(
        &self,
        host: &HostPlan,
        settings: &AgentSettings,
        data_dir: &Path,
        token_file: &Path,
    ) -> Vec<String> {
        let seeds: Vec<String> = self
            .hosts
            .iter()
            .filter(|h| h.index != host.index)
            .take(SEEDS)
            .map(|h| h.gossip().to_string())
            .collect();
        let mut args = vec![
            "agent".to_string(),
            "--data-dir".into(),
            data_dir.display().to_string(),
            "--region".into(),
            host.region.clone(),
            "--listen".into(),
            host.api().to_string(),
            "--gossip-listen".into(),
            host.gossip().to_string(),
            "--proxy-listen".into(),
            host.proxy().to_string(),
            "--proxy-hop-listen".into(),
            host.proxy_hop().to_string(),
            "--mesh-listen".into(),
            host.mesh().to_string(),
            "--token-file".into(),
            token_file.display().to_string(),
        ];
        if !seeds.is_empty() {
            args.push("--join".into());
            args.push(seeds.join(","));
        }
        if let Some(m) = settings.memory_mb {
            args.extend(["--memory-mb".into(), m.to_string()]);
        }
        if let Some(c) = settings.cpus {
            args.extend(["--cpus".into(), c.to_string()]);
        }
        if let Some(ms) = settings.dead_after_ms {
            args.extend(["--dead-after-ms".into(), ms.to_string()]);
        }
        if let Some(ms) = settings.replace_after_ms {
            args.extend(["--replace-after".into(), format!("{ms}ms")]);
        }
        if settings.config.is_some() {
            let file = AgentSettings::config_file(host, data_dir);
            args.extend(["--config".into(), file.display().to_string()]);
        }
        args
    }

    /// The nftables script that puts `host`'s firewall in the state `faults` asks for. It
    /// replaces the lab's table atomically; with no fault on the host it only removes it.
    pub fn firewall(&self, host: &HostPlan, faults: &Faults) -> String {
        let addr_of = |name: &str| self.host(name).ok().map(|h| h.addr);
        let from: Vec<Ipv4Addr> = faults
            .blocked
            .iter()
            .filter(|(_, to)| *to == host.name)
            .filter_map(|(from, _)| addr_of(from))
            .collect();
        let to: Vec<Ipv4Addr> = faults
            .blocked
            .iter()
            .filter(|(from, _)| *from == host.name)
            .filter_map(|(_, to)| addr_of(to))
            .collect();
        let loss = faults.loss.get(&host.name).copied().unwrap_or(0);
        let mut script = format!("add table inet {NFT_TABLE}\ndelete table inet {NFT_TABLE}\n");
        if from.is_empty() && to.is_empty() && loss == 0 {
            return script;
        }
        let set = |addrs: &[Ipv4Addr]| {
            addrs
                .iter()
                .map(Ipv4Addr::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let chain = |hook: &str, dir: &str, peer: &str, addrs: &[Ipv4Addr]| {
            let mut chain = format!(
                "\tchain {hook} {{\n\t\ttype filter hook {hook} priority filter; policy accept;\n"
            );
            if !addrs.is_empty() {
                chain.push_str(&format!(
                    "\t\t{dir} \"{HOST_IFACE}\" ip {peer} {{ {} }} drop\n",
                    set(addrs)
                ));
            }
            if loss > 0 {
                chain.push_str(&format!(
                    "\t\t{dir} \"{HOST_IFACE}\" numgen random mod 100 < {loss} drop\n"
                ));
            }
            chain + "\t}\n"
        };
        script.push_str(&format!("table inet {NFT_TABLE} {{\n"));
        script.push_str(&chain("input", "iifname", "saddr", &from));
        script.push_str(&chain("output", "oifname", "daddr", &to));
        script.push_str("}\n");
        script
    }
}

impl HostPlan {
    /// The agent's API and host interface.
    pub fn api(&self) -> SocketAddr {
        SocketAddr::from((self.addr, API_PORT))
    }

    /// The agent's catalog gossip.
    pub fn gossip(&self) -> SocketAddr {
        SocketAddr::from((self.addr, GOSSIP_PORT))
    }

    /// The agent's edge proxy.
    pub fn proxy(&self) -> SocketAddr {
        SocketAddr::from((self.addr, PROXY_PORT))
    }

    /// The agent's proxy hop listener.
    pub fn proxy_hop(&self) -> SocketAddr {
        SocketAddr::from((self.addr, PROXY_HOP_PORT))
    }

    /// The agent's WireGuard mesh endpoint.
    pub fn mesh(&self) -> SocketAddr {
        SocketAddr::from((self.addr, MESH_PORT))
    }
}

/// A locally administered MAC address: `02:62:<lab id>:<index>` (index 0 is the bridge).
fn mac(id: &str, index: usize) -> String {
    let id = u16::from_str_radix(id, 16).unwrap_or_else(|_| {
        id.bytes()
            .fold(0u16, |h, b| h.wrapping_mul(31).wrapping_add(u16::from(b)))
    });
    let [a, b] = id.to_be_bytes();
    let [c, d] = (index as u16).to_be_bytes();
    format!("02:62:{a:02x}:{b:02x}:{c:02x}:{d:02x}")
}

/// What every agent of a lab is started with, beyond its addresses.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentSettings {
    pub memory_mb: Option<u64>,
    pub cpus: Option<u32>,
    /// Failure detection (ms); the agent's default when `None`.
    pub dead_after_ms: Option<u64>,
    /// How long a host is dead before its opted-in machines are re-placed (ms); the
    /// agent's default when `None`.
    #[serde(default)]
    pub replace_after_ms: Option<u64>,
    /// The agent's config file every host starts with (TOML: `[reclaim]`, `[burst]`, ...,
    /// docs/CONFIG.md), written beside its data dir ([`AgentSettings::config_file`]) and
    /// passed as `--config`; `None`: no file.
    #[serde(default)]
    pub config: Option<String>,
}

impl AgentSettings {
    /// Where host `host`'s config file is, beside its data dir `data_dir`.
    pub fn config_file(host: &HostPlan, data_dir: &Path) -> PathBuf {
        data_dir.with_file_name(format!("{}.agent.toml", host.name))
    }
}

/// The network faults in force: directed blocks between hosts and packet loss per host.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Faults {
    /// `(from, to)`: packets from host `from` to host `to` are dropped.
    pub blocked: BTreeSet<(String, String)>,
    /// Percentage of packets each host loses, in and out.
    pub loss: BTreeMap<String, u8>,
}

impl Faults {
    /// Cuts `a` from `b`: both ways, or only what `a` sends to `b` when `oneway`.
    pub fn partition(&mut self, a: &[String], b: &[String], oneway: bool) {
        for x in a {
            for y in b {
                self.blocked.insert((x.clone(), y.clone()));
                if !oneway {
                    self.blocked.insert((y.clone(), x.clone()));
                }
            }
        }
    }

    /// Hosts whose firewall a change from `self` to `next` touches.
    pub fn hosts_changed<'a>(&'a self, next: &'a Faults) -> BTreeSet<&'a str> {
        let ends = |f: &'a Faults| {
            f.blocked
                .iter()
                .flat_map(|(a, b)| [a.as_str(), b.as_str()])
                .chain(f.loss.keys().map(String::as_str))
                .collect::<BTreeSet<_>>()
        };
        ends(self).union(&ends(next)).copied().collect()
    }
}

/// Reads `A,B / C,D` (one argument or several, as a shell splits it) into its two sides.
pub fn parse_sides(args: &[String]) -> Result<(Vec<String>, Vec<String>), String> {
    let text = args.join(" ");
    let parts: Vec<&str> = text.split('/').collect();
    let [a, b] = parts.as_slice() else {
        return Err(format!(
            "expected two sides separated by '/', e.g. `h1,h2 / h3`; got {text:?}"
        ));
    };
    let side = |s: &str| -> Vec<String> {
        s.split([',', ' '])
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_string)
            .collect()
    };
    let (a, b) = (side(a), side(b));
    if a.is_empty() || b.is_empty() {
        return Err(format!("each side needs at least one host; got {text:?}"));
    }
    Ok((a, b))
}

/// Reads a loss percentage: `20%` or `20`, from 0 to 100.
pub fn parse_percent(s: &str) -> Result<u8, String> {
    s.trim()
        .trim_end_matches('%')
        .parse::<u8>()
        .ok()
        .filter(|p| *p <= 100)
        .ok_or_else(|| format!("loss {s:?}: expected a percentage from 0 to 100, e.g. 20%"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lab(n: usize) -> LabPlan {
        LabPlan::new(
            "ab12",
            "10.250.3.0/24".parse().unwrap(),
            n,
            &["ams".into(), "ord".into()],
        )
        .unwrap()
    }

    #[test]
    fn subnets_parse_normalize_and_overlap() {
        let s: Subnet = "10.250.3.7/24".parse().unwrap();
        assert_eq!(s.to_string(), "10.250.3.0/24");
        assert_eq!(s.usable(), 254);
        assert!(s.overlaps(&"10.250.0.0/16".parse().unwrap()));
        assert!(!s.overlaps(&"10.250.4.0/24".parse().unwrap()));
        assert!("10.0.0.0".parse::<Subnet>().is_err());
        assert!("10.0.0.0/33".parse::<Subnet>().is_err());
        assert!("nope/8".parse::<Subnet>().is_err());
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(json, "\"10.250.3.0/24\"");
        assert_eq!(serde_json::from_str::<Subnet>(&json).unwrap(), s);
    }

    #[test]
    fn picks_the_first_free_piece_of_the_pool() {
        let pool: Subnet = DEFAULT_POOL.parse().unwrap();
        let taken: Vec<Subnet> = ["10.250.0.0/24", "10.250.1.5/32", "192.0.2.0/24"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(
            pick_subnet(&pool, 24, &taken).unwrap().to_string(),
            "10.250.2.0/24"
        );
        let everything: Vec<Subnet> = vec!["10.0.0.0/8".parse().unwrap()];
        assert_eq!(pick_subnet(&pool, 24, &everything), None);
    }

    #[test]
    fn hosts_get_names_addresses_and_regions_in_turn() {
        let plan = lab(3);
        assert_eq!(plan.bridge(), "bzlab-ab12");
        assert_eq!(plan.bridge_addr().to_string(), "10.250.3.1");
        let names: Vec<_> = plan
            .hosts
            .iter()
            .map(|h| {
                (
                    h.name.as_str(),
                    h.netns.as_str(),
                    h.veth.as_str(),
                    h.addr.to_string(),
                    h.region.as_str(),
                )
            })
            .collect();
        assert_eq!(
            names,
            vec![
                (
                    "h1",
                    "bzlab-ab12-1",
                    "bzl-ab12-1",
                    "10.250.3.2".into(),
                    "ams"
                ),
                (
                    "h2",
                    "bzlab-ab12-2",
                    "bzl-ab12-2",
                    "10.250.3.3".into(),
                    "ord"
                ),
                (
                    "h3",
                    "bzlab-ab12-3",
                    "bzl-ab12-3",
                    "10.250.3.4".into(),
                    "ams"
                ),
            ]
        );
        // Interface names fit the kernel's 15 bytes even for the largest lab.
        let big =
            LabPlan::new("ffff", "10.250.0.0/16".parse().unwrap(), 999, &["a".into()]).unwrap();
        let last = big.hosts.last().unwrap();
        assert!(last.veth.len() <= 15 && big.bridge().len() <= 15);
        assert_eq!(plan.bridge_mac(), "02:62:ab:12:00:00");
        assert_eq!(plan.hosts[2].mac, "02:62:ab:12:00:03");
        assert_eq!(last.mac, "02:62:ff:ff:03:e7");
        assert_eq!(plan.host("h2").unwrap().index, 2);
        assert_eq!(plan.host("3").unwrap().index, 3);
        assert!(plan.host("h4").is_err());
        assert!(plan.host("h0").is_err());
        assert!(plan.host("x").is_err());
    }

    #[test]
    fn refuses_labs_that_do_not_fit() {
        let s: Subnet = "10.250.3.0/29".parse().unwrap();
        // 6 usable addresses: the bridge and 5 hosts.
        assert!(LabPlan::new("a", s, 5, &["r".into()]).is_ok());
        assert!(LabPlan::new("a", s, 6, &["r".into()]).is_err());
        assert!(LabPlan::new("a", s, 0, &["r".into()]).is_err());
        assert!(LabPlan::new("a", s, 1, &[]).is_err());
        assert!(LabPlan::new("a-b", s, 1, &["r".into()]).is_err());
    }

    #[test]
    fn agents_listen_on_their_address_and_join_the_first_hosts() {
        let plan = lab(5);
        let settings = AgentSettings {
            memory_mb: Some(512),
            cpus: None,
            dead_after_ms: Some(2000),
            replace_after_ms: Some(5000),
            config: Some("[reclaim]\nenabled = true\n".into()),
        };
        let args = plan.agent_args(
            &plan.hosts[0],
            &settings,
            Path::new("/d/h1"),
            Path::new("/d/tokens"),
        );
        let joined = args.join(" ");
        assert!(joined.starts_with("agent --data-dir /d/h1 --region ams"));
        assert!(joined.contains("--listen 10.250.3.2:4280"));
        assert!(joined.contains("--gossip-listen 10.250.3.2:4380"));
        assert!(joined.contains("--proxy-listen 10.250.3.2:80"));
        assert!(joined.contains("--proxy-hop-listen 10.250.3.2:4680"));
        assert!(joined.contains("--mesh-listen 10.250.3.2:51820"));
        assert!(joined.contains("--join 10.250.3.3:4380,10.250.3.4:4380,10.250.3.5:4380"));
        assert!(joined.contains("--memory-mb 512"));
        assert!(joined.contains("--dead-after-ms 2000"));
        assert!(joined.contains("--replace-after 5000ms"));
        assert!(joined.contains("--config /d/h1.agent.toml"), "{joined}");
        assert!(!joined.contains("--cpus"));
        // Workloads must outlive their agent (kill, restart, upgrade).
        assert!(!joined.contains("stop-machines-on-shutdown"));
        let alone = lab(1);
        let args = alone.agent_args(
            &alone.hosts[0],
            &AgentSettings::default(),
            Path::new("/d"),
            Path::new("/t"),
        );
        assert!(!args.contains(&"--join".to_string()));
        assert!(!args.contains(&"--config".to_string()));
    }

    #[test]
    fn every_member_knows_every_other_statically() {
        let plan = lab(3);
        let h2 = plan.neighbors(Some(&plan.hosts[1]));
        assert_eq!(
            h2,
            "neigh replace 10.250.3.1 lladdr 02:62:ab:12:00:00 dev eth0 nud permanent\n\
             neigh replace 10.250.3.2 lladdr 02:62:ab:12:00:01 dev eth0 nud permanent\n\
             neigh replace 10.250.3.4 lladdr 02:62:ab:12:00:03 dev eth0 nud permanent\n"
        );
        let root = plan.neighbors(None);
        assert_eq!(root.lines().count(), 3);
        assert!(root
            .lines()
            .all(|l| l.contains("dev bzlab-ab12 nud permanent")));
    }

    #[test]
    fn no_fault_means_no_table() {
        let plan = lab(3);
        let script = plan.firewall(&plan.hosts[0], &Faults::default());
        assert_eq!(
            script,
            "add table inet bazaar_lab\ndelete table inet bazaar_lab\n"
        );
    }

    #[test]
    fn a_partition_drops_both_ways_on_both_sides() {
        let plan = lab(3);
        let mut f = Faults::default();
        f.partition(&["h1".into()], &["h2".into(), "h3".into()], false);
        let h1 = plan.firewall(&plan.hosts[0], &f);
        assert!(h1.contains("iifname \"eth0\" ip saddr { 10.250.3.3, 10.250.3.4 } drop"));
        assert!(h1.contains("oifname \"eth0\" ip daddr { 10.250.3.3, 10.250.3.4 } drop"));
        let h2 = plan.firewall(&plan.hosts[1], &f);
        assert!(h2.contains("ip saddr { 10.250.3.2 } drop"));
        assert!(h2.contains("ip daddr { 10.250.3.2 } drop"));
        // h2 and h3 still talk to each other.
        assert!(!h2.contains("10.250.3.4"));
        assert!(!h2.contains("numgen"));
    }

    #[test]
    fn a_oneway_partition_drops_only_what_the_first_side_sends() {
        let plan = lab(2);
        let mut f = Faults::default();
        f.partition(&["h1".into()], &["h2".into()], true);
        let h1 = plan.firewall(&plan.hosts[0], &f);
        assert!(h1.contains("ip daddr { 10.250.3.3 } drop"));
        assert!(!h1.contains("saddr"));
        let h2 = plan.firewall(&plan.hosts[1], &f);
        assert!(h2.contains("ip saddr { 10.250.3.2 } drop"));
        assert!(!h2.contains("daddr"));
    }

    #[test]
    fn loss_drops_a_share_of_packets_in_and_out() {
        let plan = lab(2);
        let mut f = Faults::default();
        f.loss.insert("h2".into(), 20);
        let h2 = plan.firewall(&plan.hosts[1], &f);
        assert_eq!(h2.matches("numgen random mod 100 < 20 drop").count(), 2);
        assert!(plan
            .firewall(&plan.hosts[0], &f)
            .ends_with("delete table inet bazaar_lab\n"));
        let none = Faults::default();
        let changed = none.hosts_changed(&f);
        assert_eq!(changed.into_iter().collect::<Vec<_>>(), vec!["h2"]);
    }

    #[test]
    fn sides_and_percentages_parse() {
        let s = |v: &[&str]| parse_sides(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(
            s(&["h1,h2", "/", "h3"]).unwrap(),
            (vec!["h1".into(), "h2".into()], vec!["h3".into()])
        );
        assert_eq!(
            s(&["1/2,3"]).unwrap(),
            (vec!["1".into()], vec!["2".into(), "3".into()])
        );
        assert!(s(&["h1", "h2"]).is_err());
        assert!(s(&["h1", "/", ""]).is_err());
        assert!(s(&["a/b/c"]).is_err());
        assert_eq!(parse_percent("20%").unwrap(), 20);
        assert_eq!(parse_percent("0").unwrap(), 0);
        assert!(parse_percent("101%").is_err());
        assert!(parse_percent("-1").is_err());
    }
}
