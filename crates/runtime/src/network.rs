//! The machine network of this host: a private subnet on a few bridges (one per /23 of it,
//! [`crate::bridges`]: a bridge holds at most 1,023 ports), and for every isolated machine
//! a network namespace with one end of a veth pair on its address's bridge and an address
//! of its own (`BAZAAR_PRIVATE_IP`). The edge proxy reaches a machine at
//! `address:internal_port` through its bridge.
//!
//! Isolation: every machine's bridge port is `isolated` (the bridge forwards nothing
//! between two machines), and an nftables rule drops what the host would route from one
//! of its bridges into one of them (the same or another), so machines reach, with NAT on,
//! the outside, but never each other (different apps or not; they talk through the
//! proxy). Outbound NAT is off unless configured. Nothing from the bridges reaches the
//! host's own listeners (any of its addresses) but replies to connections the host opened
//! (the proxy, health checks) and DNS (UDP/TCP 53) to the gateway, where the internal DNS
//! listens (`crate::dns`), and a machine sends only with its own address: a bridge-family
//! table drops IPv4 and ARP whose source is not the address of the veth it came in on.
//!
//! Nothing is created until the host's first image machine ([`LazyNetwork`]). Namespaces
//! belong to addresses: `/run/netns/<bridge>-<index>` for the index-th address
//! of the subnet, host side of its veth `b<bridge hash><index>`. Each is owned by a user
//! namespace of the address's id range ([`crate::idranges`]), kept at
//! `/run/bazaar/userns/<bridge>-<index>`: the machine's container runs in it (a process
//! `runc exec` adds joins the user namespace first, and then may only join a network
//! namespace it owns). The agent sets one up for each address it hands out, and a pool
//! ahead in the background (as many as addresses were handed out in the last 10 s, 4 to
//! 64, at a lower CPU priority than launches), so a launch usually finds its namespace
//! ready; when a machine is destroyed its address gets a fresh one.
//!
//! A namespace is wired by [`crate::netlink`] requests from the agent itself (veth pair,
//! bridge port, address, route: no execs), and so are the bridges (`bz-<8 hex of the host
//! id>` once per host, in a subnet no route of the host covers, and `bz-<8 hex>-<k>` when
//! its slice's first namespace is made): the machine network needs no iproute2. The
//! namespaces themselves are made by a short-lived child process
//! ([`bazaar_image::IdMap`]); the firewall with nftables (`nft`, once per host, and once per
//! namespace only in subnets larger than a /19).

pub use crate::bridges::BRIDGE_PORTS;
use crate::bridges::{check_room, Bridges};
use crate::idranges::{IdRanges, RANGE_SIZE};
use crate::netlink::{self, Rtnl};
use crate::subnet::pick_subnet;
pub use crate::subnet::Subnet;
use std::collections::HashSet;
use std::io::Write;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

/// Where `ip netns` keeps named namespaces.
pub const NETNS_DIR: &str = "/run/netns";
/// Markers of namespaces that are completely set up (each holds its id range's base).
pub const READY_DIR: &str = "/run/bazaar/netns-ready";
/// The `resolv.conf` of a machine whose network's gateway is `gateway` (the host's
/// internal DNS listens there).
pub fn resolv_conf(gateway: Ipv4Addr) -> String {
    format!("nameserver {gateway}\n")
}

/// The user namespaces owning them.
const USERNS_DIR: &str = "/run/bazaar/userns";
/// Subnets with at most this many machine addresses (a /19, the default, or smaller) have
/// all of them in the anti-spoofing set from the start ([`Network::anti_spoofing_rules`]:
/// one `nft` run of 8,189 elements takes some 70 ms, once; one per namespace 2-6 ms each).
const PREFILLED_SOURCES: usize = 8189;
/// This host's machine network, set up the first time an image machine needs it (a host
/// that never runs one creates no bridge), or at start when it already has image machines.
#[derive(Debug)]
pub struct LazyNetwork {
    data_dir: PathBuf,
    host_id: String,
    /// The subnet asked for; a mesh may move it to another prefix until the network is
    /// set up ([`LazyNetwork::reconfigure`]).
    configured: Mutex<Option<Subnet>>,
    /// Outbound NAT for machines.
    pub nat: bool,
    /// The id range of each machine address.
    pub id_ranges: Arc<IdRanges>,
    cell: std::sync::OnceLock<Network>,
    init: Mutex<()>,
    /// Turns true once the network is set up (the internal DNS then listens on its gateway).
    ready_tx: tokio::sync::watch::Sender<bool>,
}

impl LazyNetwork {
    /// The network of host `host_id` (see [`Network::setup`]); nothing is done yet.
    pub fn new(
        data_dir: &Path,
        host_id: &str,
        configured: Option<Subnet>,
        nat: bool,
        id_ranges: Arc<IdRanges>,
    ) -> LazyNetwork {
        LazyNetwork {
            data_dir: data_dir.to_path_buf(),
            host_id: host_id.to_string(),
            configured: Mutex::new(configured),
            nat,
            id_ranges,
            cell: std::sync::OnceLock::new(),
            init: Mutex::new(()),
            ready_tx: tokio::sync::watch::Sender::new(false),
        }
    }

    /// The network, set up now if it is not yet (a failure is retried next time). Blocks
    /// while the bridge and the firewall are made, the first time.
    pub fn get(&self) -> Result<&Network, String> {
        if let Some(n) = self.cell.get() {
            return Ok(n);
        }
        let _one = self.init.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = self.cell.get() {
            return Ok(n);
        }
        let n = Network::setup(
            &self.data_dir,
            &self.host_id,
            *locked(&self.configured),
            self.nat,
            self.id_ranges.clone(),
        )?;
        let n = self.cell.get_or_init(|| n);
        self.ready_tx.send_replace(true);
        Ok(n)
    }

    /// Watches for the network being set up (true once it is).
    pub fn watch_ready(&self) -> tokio::sync::watch::Receiver<bool> {
        self.ready_tx.subscribe()
    }

    /// The network if it is set up.
    pub fn ready(&self) -> Option<&Network> {
        self.cell.get()
    }

    /// Why the next machine would get no address when `held` are handed out, if it would
    /// not ([`Network::check_room`]; before the network is set up, of the subnet it will
    /// have, or of a default one).
    pub fn check_room(&self, held: usize) -> Result<(), String> {
        match self.ready() {
            Some(network) => network.check_room(held),
            None => {
                let subnet = locked(&self.configured).unwrap_or(Subnet {
                    base: Ipv4Addr::UNSPECIFIED,
                    prefix: crate::subnet::DEFAULT_PREFIX,
                });
                check_room(&subnet, held)
            }
        }
    }

    /// Makes `subnet` the one to set up, unless the network is set up already (then it
    /// answers false: its machines have addresses of the old one).
    pub fn reconfigure(&self, subnet: Subnet) -> bool {
        let _one = self.init.lock().unwrap_or_else(|e| e.into_inner());
        if self.cell.get().is_some() {
            return false;
        }
        *locked(&self.configured) = Some(subnet);
        true
    }
}

/// This host's machine network, once set up.
#[derive(Debug, Clone)]
pub struct Network {
    /// The first bridge's name (`bz-<hash>`): the others, the namespaces, veths and
    /// nftables tables are named after it.
    pub bridge: String,
    pub subnet: Subnet,
    /// Which bridge each address is on.
    pub bridges: Bridges,
    /// The bridges set up by this process (held while one is being made).
    bridges_made: Arc<Mutex<HashSet<usize>>>,
    pub nat: bool,
    /// One address's namespace is set up or removed by one thread at a time (a launch
    /// waits for the namespace being made ahead for its address instead of making it
    /// twice); different addresses go in parallel.
    setup_locks: Arc<AddressLocks>,
    /// The id range of each address (its namespaces' owner).
    pub id_ranges: Arc<IdRanges>,
    /// Namespaces made ahead for the next addresses.
    pool: Arc<Pool>,
}

/// How many namespaces are kept made ahead: as many as addresses were handed out in the
/// last `DEMAND_WINDOW`, at least [`POOL_MIN`] and at most `POOL_MAX`.
pub const POOL_MIN: usize = 4;
const POOL_MAX: usize = 64;
const DEMAND_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

/// The namespaces made ahead, and the demand that sizes them.
#[derive(Debug, Default)]
struct Pool {
    /// Addresses whose namespaces this process set up or found set up (and has not
    /// removed since).
    ready: Mutex<HashSet<Ipv4Addr>>,
    /// When addresses were handed out, within the last [`DEMAND_WINDOW`].
    handed_out: Mutex<std::collections::VecDeque<std::time::Instant>>,
    /// Held by the one thread filling the pool.
    filling: Mutex<()>,
}

impl Pool {
    /// Counts an address handed out now.
    fn count(&self, now: std::time::Instant) {
        let mut times = locked(&self.handed_out);
        while times.front().is_some_and(|t| now - *t > DEMAND_WINDOW) {
            times.pop_front();
        }
        if times.len() < POOL_MAX {
            times.push_back(now);
        }
    }

    /// How many namespaces to keep ahead at `now`.
    fn wanted(&self, now: std::time::Instant) -> usize {
        let times = locked(&self.handed_out);
        let recent = times.iter().filter(|t| now - **t <= DEMAND_WINDOW).count();
        recent.clamp(POOL_MIN, POOL_MAX)
    }
}

fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The namespaces of a machine address, set up.
#[derive(Debug, Clone)]
pub struct Attached {
    /// The network namespace (`/run/netns/...`).
    pub netns: PathBuf,
    /// The user namespace that owns it.
    pub userns: PathBuf,
    /// The first host id of that user namespace's range.
    pub uid_base: u32,
}

impl Network {
    /// Sets up (or finds again) the first bridge of host `host_id` and the firewall of
    /// all of them (the others are made as their slices are used). The subnet is
    /// `configured`, else the one this host used before (`data_dir/network`), else the first
    /// free /19 of 10.192.0.0/12. Idempotent.
    ///
    /// `data_dir/network` records the subnet (line 1) and the first bridge (line 2).
    pub fn setup(
        data_dir: &Path,
        host_id: &str,
        configured: Option<Subnet>,
        nat: bool,
        id_ranges: Arc<IdRanges>,
    ) -> Result<Network, String> {
        Self::setup_sliced(data_dir, host_id, configured, nat, id_ranges, None)
    }

    /// [`Network::setup`] with bridges of a `/slice_prefix` each instead of the default
    /// ([`Bridges::with_slice_prefix`]: tests span bridges with a few addresses).
    pub fn setup_sliced(
        data_dir: &Path,
        host_id: &str,
        configured: Option<Subnet>,
        nat: bool,
        id_ranges: Arc<IdRanges>,
        slice_prefix: Option<u8>,
    ) -> Result<Network, String> {
        let bridge = bridge_name(host_id);
        let record = data_dir.join("network");
        let remembered = std::fs::read_to_string(&record)
            .ok()
            .and_then(|s| s.lines().next()?.trim().parse::<Subnet>().ok());
        // Agents of one machine pick their subnets one at a time.
        let _lock = host_lock()?;
        let subnet = match configured.or(remembered) {
            Some(s) => s,
            None => pick_subnet(&own_bridge_links(&bridge))?,
        };
        let bridges = match slice_prefix {
            Some(prefix) => Bridges::with_slice_prefix(&bridge, subnet, prefix)?,
            None => Bridges::new(&bridge, subnet),
        };
        // Line 1 the subnet, line 2 the bridge (for whoever cleans up after this host).
        std::fs::write(&record, format!("{subnet}\n{bridge}\n"))
            .map_err(|e| format!("writing {}: {e}", record.display()))?;
        let network = Network {
            bridge,
            subnet,
            bridges,
            bridges_made: Arc::default(),
            nat,
            setup_locks: Arc::default(),
            id_ranges,
            pool: Arc::default(),
        };
        network.bridge_link(0)?;
        network.firewall();
        Ok(network)
    }

    /// The link index of bridge `k`, set up first if this process has not yet (or it is
    /// gone).
    fn bridge_link(&self, k: usize) -> Result<u32, String> {
        let mut made = locked(&self.bridges_made);
        let name = self.bridges.name(k);
        match netlink::link_index(&name) {
            Some(index) if made.contains(&k) => Ok(index),
            _ => {
                let index = self.create_bridge(k)?;
                made.insert(k);
                Ok(index)
            }
        }
    }

    /// Makes bridge `k` unless it exists, and gives it the gateway's address and its route
    /// ([`Bridges`]). Idempotent: an agent that starts again finds its bridges so.
    fn create_bridge(&self, k: usize) -> Result<u32, String> {
        let name = self.bridges.name(k);
        let err = |what: &str, e: std::io::Error| format!("{what} bridge {name}: {e}");
        let mut rtnl = netlink::Rtnl::open().map_err(|e| err("making", e))?;
        let gateway = self.subnet.gateway();
        if !link_exists(&name) {
            // Its MAC fixed at birth only: changing a running bridge's would leave its
            // machines' neighbor entry for the gateway stale (their answers to the proxy
            // lost) until they ask again. The same on every bridge: each is an L2 domain
            // of its own.
            match rtnl.add_bridge(&name, Some(mac_of(gateway))) {
                // Made meanwhile by an agent of the same host id: it is the same bridge.
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                other => other.map_err(|e| err("making", e))?,
            }
        }
        let index = netlink::link_index(&name).ok_or_else(|| format!("bridge {name} is gone"))?;
        rtnl.replace_address(index, gateway, self.bridges.gateway_prefix(k))
            .map_err(|e| err("addressing", e))?;
        rtnl.set_up(index).map_err(|e| err("bringing up", e))?;
        if let Some(slice) = self.bridges.route(k) {
            rtnl.replace_link_route(slice.base, slice.prefix, index, gateway)
                .map_err(|e| err("routing its slice to", e))?;
        }
        Ok(index)
    }

    /// nftables: nothing routed from one of the bridges into one of them; nothing from
    /// them to the host but replies and DNS ([`Bridges::ip_table_rules`]); no spoofed
    /// sources ([`Network::allow_source`]); masquerade outbound when NAT is on. Without
    /// `nft` the bridges' port isolation still keeps machines apart (and the host open to
    /// them: a warning says so).
    fn firewall(&self) {
        let mut rules = self.bridges.ip_table_rules(&self.table(), self.nat);
        rules += &self.anti_spoofing_rules();
        if let Err(err) = run_stdin("nft", &["-f", "-"], &rules) {
            tracing::warn!(error = %err, "nftables rules for the machine network not installed (machines stay apart through bridge port isolation, but reach the host and may spoof)");
        }
        if self.nat {
            if let Err(err) = std::fs::write("/proc/sys/net/ipv4/ip_forward", "1") {
                tracing::warn!(error = %err, "enabling ip_forward for outbound NAT");
            }
        }
    }

    /// The nftables table of this network (in the `ip` and `bridge` families).
    fn table(&self) -> String {
        format!("bazaar_{}", self.bridge.replace('-', "_"))
    }

    /// The bridge-family table: a frame from a machine's veth (`b<bridge hash>*`) passes
    /// only with the source address of that veth (a set of `veth . address`). Veth names
    /// follow from addresses, so the set holds every pair of the subnet from the start
    /// when it has at most [`PREFILLED_SOURCES`] addresses (no `nft` run per namespace);
    /// a larger subnet's set is filled as namespaces are made (those that exist already
    /// are in it from the start). Machines have no IPv6 addresses: IPv6 from them
    /// (link-local, which would reach the host's listeners past the `ip` table) is dropped.
    fn anti_spoofing_rules(&self) -> String {
        let table = self.table();
        let ports = format!("{}*", self.veth_prefix());
        let prefilled = self.sources_prefilled();
        let existing: Vec<String> = self
            .subnet
            .machine_addresses()
            .filter(|ip| prefilled || Path::new(NETNS_DIR).join(self.netns_name(*ip)).exists())
            .map(|ip| format!("\"{}\" . {ip}", self.veth_name(ip)))
            .collect();
        let elements = if existing.is_empty() {
            String::new()
        } else {
            format!(" elements = {{ {} }};", existing.join(", "))
        };
        format!(
            "table bridge {table}\ndelete table bridge {table}\ntable bridge {table} {{\n\
             set sources {{ type ifname . ipv4_addr;{elements} }}\n\
             chain prerouting {{ type filter hook prerouting priority -200; \
             iifname \"{ports}\" ether type ip iifname . ip saddr != @sources counter drop; \
             iifname \"{ports}\" ether type arp iifname . arp saddr ip != @sources counter drop; \
             iifname \"{ports}\" ether type ip6 counter drop; }}\n}}\n"
        )
    }

    /// Whether the anti-spoofing set holds every address of the subnet from the start.
    fn sources_prefilled(&self) -> bool {
        self.subnet.capacity() <= PREFILLED_SOURCES
    }

    /// Lets `ip`'s veth send with source `ip` (and nothing else).
    fn allow_source(&self, ip: Ipv4Addr) -> Result<(), String> {
        run_stdin(
            "nft",
            &["-f", "-"],
            &format!(
                "add element bridge {} sources {{ \"{}\" . {ip} }}\n",
                self.table(),
                self.veth_name(ip)
            ),
        )
    }

    /// The first address of the subnet not in `used`, or why there is none
    /// ([`Network::check_room`], [`Subnet::first_free`]).
    pub fn allocate(&self, used: &HashSet<Ipv4Addr>) -> Result<Ipv4Addr, String> {
        self.check_room(used.len())?;
        self.subnet.first_free(used)
    }

    /// Whether one more address fits when `held` are handed out: the subnet is the limit
    /// (every address has a bridge with room for it, [`Bridges`]).
    pub fn check_room(&self, held: usize) -> Result<(), String> {
        check_room(&self.subnet, held)
    }

    /// The name of the network namespace for `ip`: `<bridge>-<index in the subnet>`.
    fn netns_name(&self, ip: Ipv4Addr) -> String {
        format!("{}-{}", self.bridge, self.index(ip))
    }

    /// The host side of `ip`'s veth pair: `b<bridge hash><index>` (≤ 15 characters).
    fn veth_name(&self, ip: Ipv4Addr) -> String {
        format!("{}{}", self.veth_prefix(), self.index(ip))
    }

    fn veth_prefix(&self) -> String {
        format!("b{}", &self.bridge[3..])
    }

    fn lock(&self, ip: Ipv4Addr) -> AddressGuard<'_> {
        self.setup_locks.lock(ip)
    }

    fn index(&self, ip: Ipv4Addr) -> u32 {
        u32::from(ip) - u32::from(self.subnet.base)
    }

    /// Marks `ip`'s namespace as completely set up (it survives agent restarts, as the
    /// namespaces do).
    fn ready_marker(&self, ip: Ipv4Addr) -> PathBuf {
        Path::new(READY_DIR).join(self.netns_name(ip))
    }

    /// The network namespace of address `ip` and the user namespace owning it: set up now
    /// unless they already are (made ahead by [`Network::prepare_ahead`], or by an earlier
    /// run of the same machine). Namespaces belong to addresses, not machines: they exist
    /// while their address is held or about to be handed out.
    pub fn attach(&self, ip: Ipv4Addr) -> Result<Attached, String> {
        if !self.subnet.contains(ip) || ip == self.subnet.gateway() {
            return Err(format!(
                "address {ip} is not a machine address of this host's subnet {}",
                self.subnet
            ));
        }
        let uid_base = self.id_ranges.range_of(ip)?;
        let _one_at_a_time = self.lock(ip);
        let ns = self.netns_name(ip);
        let attached = Attached {
            netns: Path::new(NETNS_DIR).join(&ns),
            userns: Path::new(USERNS_DIR).join(&ns),
            uid_base,
        };
        let ready = std::fs::read_to_string(self.ready_marker(ip))
            .is_ok_and(|base| base == uid_base.to_string());
        if ready && attached.netns.exists() && attached.userns.exists() {
            locked(&self.pool.ready).insert(ip);
            return Ok(attached);
        }
        let veth = self.veth_name(ip);
        // What a cut-short set-up left: the veth pair first (deleting the namespace would
        // take the pair with it, and the host end would then be gone when deleted).
        let mut rtnl = Rtnl::open().map_err(|e| format!("opening a netlink socket: {e}"))?;
        if link_exists(&veth) {
            rtnl.delete_link(&veth)
                .map_err(|e| format!("removing the veth {veth} left behind: {e}"))?;
        }
        unbind_namespace(&attached.netns);
        let netns = make_namespaces(&attached, uid_base)?;
        let bridge = self.bridge_link(self.bridges.of(ip))?;
        rtnl.add_veth(&veth, bridge, "eth0", mac_of(ip), netns.as_fd())
            .and_then(|()| {
                let index = netlink::link_index(&veth).ok_or_else(|| {
                    std::io::Error::other("the veth is gone right after it was made")
                })?;
                rtnl.isolate_bridge_port(index)?;
                netlink::disable_ipv6(&veth)?;
                rtnl.set_up(index)
            })
            .map_err(|e| format!("making the veth {veth} of {ns}: {e}"))?;
        let (prefix, gateway) = (self.subnet.prefix, self.subnet.gateway());
        netlink::in_namespace(netns.as_fd(), || {
            netlink::configure_machine_side("eth0", ip, prefix, gateway)
        })
        .map_err(|e| format!("setting up eth0 in {ns}: {e}"))?;
        if !self.sources_prefilled() {
            if let Err(err) = self.allow_source(ip) {
                tracing::warn!(%ip, error = %err, "nftables: the machine's source address not allowed (its traffic is dropped)");
            }
        }
        std::fs::create_dir_all(READY_DIR).map_err(|e| format!("creating {READY_DIR}: {e}"))?;
        std::fs::write(self.ready_marker(ip), uid_base.to_string())
            .map_err(|e| format!("marking {ns} ready: {e}"))?;
        locked(&self.pool.ready).insert(ip);
        Ok(attached)
    }

    /// `ip`'s namespaces if they are set up (made ahead by the pool, usually) and no thread
    /// is making or removing them now: a lookup and two `stat`s, so that a launch takes
    /// them without a trip to a blocking thread (which cost it 1-2 ms on a busy host).
    pub fn attach_ready(&self, ip: Ipv4Addr) -> Option<Attached> {
        if !locked(&self.pool.ready).contains(&ip) || locked(&self.setup_locks.held).contains(&ip) {
            return None;
        }
        let ns = self.netns_name(ip);
        let attached = Attached {
            netns: Path::new(NETNS_DIR).join(&ns),
            userns: Path::new(USERNS_DIR).join(&ns),
            // Held since its namespaces were made: no file is read.
            uid_base: self.id_ranges.range_of(ip).ok()?,
        };
        (attached.netns.exists() && attached.userns.exists()).then_some(attached)
    }

    /// Replaces `ip`'s namespace with a fresh one (a machine that had the address is gone;
    /// the next one to get it starts clean and without waiting).
    pub fn renew(&self, ip: Ipv4Addr) {
        let _yielding = LowPriority::this_thread();
        self.release(ip);
        if let Err(err) = self.attach(ip) {
            tracing::warn!(%ip, error = %err, "setting up a network namespace ahead");
        }
    }

    /// Counts an address handed out (the demand that sizes the pool made ahead).
    pub fn handed_out(&self) {
        self.pool.count(std::time::Instant::now());
    }

    /// Sets up the namespaces of the next addresses not `used()` (as many as recent demand
    /// asks for, see `POOL_MIN`), so the machines that get them start without waiting.
    /// One thread fills at a time, asking `used()` again after each namespace; a call while
    /// another fills returns at once. Errors are logged.
    pub fn prepare_ahead(&self, used: impl Fn() -> HashSet<Ipv4Addr>) {
        let Ok(_filler) = self.pool.filling.try_lock() else {
            return;
        };
        // Machines starting now come first: on a busy host the pool is filled with what
        // CPU they leave (a launch that finds no namespace ready makes its own, at its
        // own priority).
        let _yielding = LowPriority::this_thread();
        loop {
            let wanted = self.pool.wanted(std::time::Instant::now());
            let used = used();
            let next = {
                let ready = locked(&self.pool.ready);
                self.subnet
                    .machine_addresses()
                    .filter(|ip| !used.contains(ip))
                    .take(wanted)
                    .find(|ip| !ready.contains(ip))
            };
            let Some(ip) = next else {
                return;
            };
            if let Err(err) = self.attach(ip) {
                tracing::warn!(%ip, error = %err, "setting up a network namespace ahead");
                return;
            }
        }
    }

    /// Removes `ip`'s namespace (and with it the veth pair). Idempotent. The agent then
    /// makes a fresh one ([`Network::renew`]) for the next machine to get the address.
    pub fn release(&self, ip: Ipv4Addr) {
        let _one_at_a_time = self.lock(ip);
        locked(&self.pool.ready).remove(&ip);
        let _ = std::fs::remove_file(self.ready_marker(ip));
        // As `ip netns delete` does: the kernel removes the namespace, and its veth pair,
        // once nothing holds it.
        let ns = self.netns_name(ip);
        unbind_namespace(&Path::new(NETNS_DIR).join(&ns));
        unbind_namespace(&Path::new(USERNS_DIR).join(&ns));
    }

    /// Removes the bridges (their routes go with them) and the firewall tables (tests and
    /// dev clusters that go away), and gives back the id ranges.
    pub fn teardown(&self) {
        self.id_ranges.release_all();
        for name in self.bridges.names() {
            let _ = netlink::delete_link(&name);
        }
        locked(&self.bridges_made).clear();
        let table = self.table();
        for family in ["ip", "bridge"] {
            let _ = run_stdin(
                "nft",
                &["-f", "-"],
                &format!("delete table {family} {table}\n"),
            );
        }
    }
}

/// The MAC address of the machine network's interface that has `ip`: a machine's `eth0`,
/// or the bridge (the gateway's address). Fixed by the address, as Docker's bridge does: an
/// address handed to the next machine (a fresh namespace and veth) keeps its MAC, so the
/// host's neighbor entry for it (trusted up to 45 s without asking again) stays right, and
/// so does the machines' entry for the gateway while bridge ports come and go (a bridge
/// otherwise takes the lowest MAC of its ports). Locally administered, unicast.
pub(crate) fn mac_of(ip: Ipv4Addr) -> [u8; 6] {
    let [a, b, c, d] = ip.octets();
    [0x02, 0x62, a, b, c, d]
}

/// The first bridge of host `host_id`: `bz-<8 hex of a hash of the id>`. Everything else
/// of the host's network is named after it: its other bridges `<bridge>-<k>`, namespaces
/// `<bridge>-<n>`, host-side veths `b<8 hex><n>`, the nftables table `bazaar_bz_<8 hex>`
/// (the agent's `cleanup` finds them so).
pub fn bridge_name(host_id: &str) -> String {
    format!("bz-{}", &hex_of(host_id)[..8])
}

/// The links of the bridges named after `bridge` that exist (whatever the subnet: at most
/// 128 of them), whose routes are this host's own when it picks a subnet again.
fn own_bridge_links(bridge: &str) -> Vec<u32> {
    let others = (1..128).map(|k| format!("{bridge}-{k}"));
    std::iter::once(bridge.to_string())
        .chain(others)
        .filter_map(|name| netlink::link_index(&name))
        .collect()
}

/// Makes a user namespace mapping `uid_base..` and a network namespace it owns, and binds
/// them at `attached`'s paths (as `ip netns add` does for the network namespace). Returns
/// the network namespace.
fn make_namespaces(attached: &Attached, uid_base: u32) -> Result<OwnedFd, String> {
    use std::os::fd::AsRawFd;
    let ids = bazaar_image::IdMap {
        host_base: uid_base,
        count: RANGE_SIZE,
    };
    let (user, net) = ids
        .user_and_network_namespaces()
        .map_err(|e| format!("making the namespaces of {}: {e}", attached.netns.display()))?;
    unbind_namespace(&attached.userns);
    netns_dir_is_a_mount()?;
    for (fd, target) in [(&net, &attached.netns), (&user, &attached.userns)] {
        let err = |e: &dyn std::fmt::Display| format!("binding {}: {e}", target.display());
        if let Some(dir) = target.parent() {
            std::fs::create_dir_all(dir).map_err(|e| err(&e))?;
        }
        std::fs::File::create(target).map_err(|e| err(&e))?;
        rustix::mount::mount_bind(format!("/proc/self/fd/{}", fd.as_raw_fd()).as_str(), target)
            .map_err(|e| err(&e))?;
    }
    Ok(net)
}

/// Makes [`NETNS_DIR`] a shared mount point of its own before a namespace is bound in it,
/// as `ip netns add` does before its first. On a machine where that had not happened yet, a
/// later `ip netns add` (by anyone) binds the directory onto itself: namespaces bound below
/// it before then are hidden under that mount, cannot be removed through their path, and
/// outlive their host. Done once per process.
fn netns_dir_is_a_mount() -> Result<(), String> {
    use rustix::mount::{mount_bind_recursive, mount_change, MountPropagationFlags};
    static DONE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        let err = |e: &dyn std::fmt::Display| format!("making {NETNS_DIR} a mount point: {e}");
        std::fs::create_dir_all(NETNS_DIR).map_err(|e| err(&e))?;
        let shared = MountPropagationFlags::SHARED | MountPropagationFlags::REC;
        // Refused (EINVAL) while the directory is not a mount point.
        if mount_change(NETNS_DIR, shared).is_err() {
            mount_bind_recursive(NETNS_DIR, NETNS_DIR).map_err(|e| err(&e))?;
            mount_change(NETNS_DIR, shared).map_err(|e| err(&e))?;
        }
        Ok(())
    })
    .clone()
}

/// Unmounts and removes a namespace bound at `path`, as `ip netns delete` does (the kernel
/// frees it once nothing else holds it). Idempotent; true when it was bound.
pub fn unbind_namespace(path: &Path) -> bool {
    let unbound = rustix::mount::unmount(path, rustix::mount::UnmountFlags::DETACH).is_ok();
    let _ = std::fs::remove_file(path);
    unbound
}

/// Whether this network namespace has a link named `name`. Asked of the kernel, not read
/// from `/sys/class/net`: an agent that entered a network namespace without a mount
/// namespace of its own (as `bazaar lab` starts them) sees the `/sys` of the namespace it
/// came from.
fn link_exists(name: &str) -> bool {
    netlink::link_index(name).is_some()
}

/// Hex of a short hash of `s` (stable across runs).
fn hex_of(s: &str) -> String {
    // FNV-1a: stable, and enough to tell a machine's few agents apart.
    let mut h: u64 = 0xcbf29ce484222325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    format!("{h:016x}")
}

/// An exclusive lock on `/run/bazaar/network.lock` (agents of one machine set up their
/// networks one at a time).
fn host_lock() -> Result<std::fs::File, String> {
    std::fs::create_dir_all("/run/bazaar").map_err(|e| format!("creating /run/bazaar: {e}"))?;
    let f = std::fs::File::create("/run/bazaar/network.lock")
        .map_err(|e| format!("creating /run/bazaar/network.lock: {e}"))?;
    rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| format!("locking /run/bazaar/network.lock: {e}"))?;
    Ok(f)
}

fn run_stdin(program: &str, args: &[&str], input: &str) -> Result<(), String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("running {program}: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(input.as_bytes())
            .map_err(|e| format!("writing to {program}: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("waiting for {program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

pub(crate) mod threads;
use threads::{AddressGuard, AddressLocks, LowPriority};

#[cfg(test)]
mod tests;
