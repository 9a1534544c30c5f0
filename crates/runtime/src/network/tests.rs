//! The network's tests: address locks, veth names, and (as root) the bridge, routes and
//! namespaces on a real host.

use super::*;

/// Host `bridge`'s network on `subnet`, not set up (names and addresses only).
fn unset_network(bridge: &str, subnet: Subnet) -> Network {
    Network {
        bridge: bridge.to_string(),
        subnet,
        bridges: Bridges::new(bridge, subnet),
        bridges_made: Arc::default(),
        nat: false,
        setup_locks: Arc::default(),
        id_ranges: Arc::new(IdRanges::new("test")),
        pool: Arc::default(),
    }
}

#[test]
fn an_address_lock_holds_up_that_address_only() {
    use std::sync::mpsc;
    use std::time::Duration;
    let locks = Arc::new(AddressLocks::default());
    let ip = Ipv4Addr::new(10, 0, 0, 2);
    let held = locks.lock(ip);
    let lock_in_thread = |other: Ipv4Addr| {
        let (locks, (tx, rx)) = (locks.clone(), mpsc::channel());
        std::thread::spawn(move || {
            let _guard = locks.lock(other);
            tx.send(()).unwrap();
        });
        rx
    };
    // Another address, the pool's 64 ahead included (which shared a striped lock), goes.
    let ahead = lock_in_thread(Ipv4Addr::new(10, 0, 0, 66));
    assert!(ahead.recv_timeout(Duration::from_secs(5)).is_ok());
    // The same address waits until it is let go.
    let same = lock_in_thread(ip);
    assert!(same.recv_timeout(Duration::from_millis(200)).is_err());
    drop(held);
    assert!(same.recv_timeout(Duration::from_secs(5)).is_ok());
}

/// Runs `work` on a thread in a network namespace of its own (gone with the thread),
/// where only root may make one.
fn in_fresh_namespace<T: Send>(work: impl FnOnce() -> T + Send) -> Option<T> {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: needs root (a network namespace)");
        return None;
    }
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // SAFETY: unshare takes a flag and moves this thread alone, which ends
                // with `work`.
                assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
                work()
            })
            .join()
            .unwrap()
    })
    .into()
}

#[test]
fn the_bridge_is_made_and_subnets_picked_without_iproute2() {
    in_fresh_namespace(|| {
        // Nothing routed yet: the pool's first /19.
        let first: Subnet = "10.192.0.0/19".parse().unwrap();
        assert_eq!(pick_subnet(&own_bridge_links("bz-test0")).unwrap(), first);
        let net = unset_network("bz-test0", first);
        net.create_bridge(0).unwrap();
        // Again: it is found, its address replaced (a restarted agent does so).
        net.create_bridge(0).unwrap();
        // A later slice's bridge, with the route of its slice only.
        let later = net.create_bridge(5).unwrap();
        assert_eq!(net.create_bridge(5), Ok(later));
        let index = netlink::link_index("bz-test0").expect("the bridge exists");
        assert_eq!(netlink::link_index("bz-test0-5"), Some(later));
        let routes = Rtnl::open().unwrap().routes().unwrap();
        let routed = |dst: [u8; 4], prefix: u8, oif: u32| {
            routes
                .iter()
                .any(|r| r.dst == Ipv4Addr::from(dst) && r.prefix == prefix && r.oif == Some(oif))
        };
        assert!(routed([10, 192, 0, 0], 19, index), "{routes:?}");
        assert!(routed([10, 192, 10, 0], 23, later), "{routes:?}");
        assert!(
            !routes.iter().any(|r| r.oif == Some(later) && r.prefix < 23),
            "{routes:?}"
        );
        // Another host's bridge skips the /19 now routed; this one keeps its own.
        assert_eq!(
            pick_subnet(&own_bridge_links("bz-test1")).unwrap(),
            "10.192.32.0/19".parse().unwrap()
        );
        assert_eq!(pick_subnet(&own_bridge_links("bz-test0")).unwrap(), first);
        net.teardown();
        assert!(netlink::link_index("bz-test0").is_none());
        assert!(netlink::link_index("bz-test0-5").is_none());
        assert_eq!(pick_subnet(&own_bridge_links("bz-test1")).unwrap(), first);
    });
}

#[test]
fn subnets_parse_and_hand_out_addresses() {
    let s: Subnet = "10.213.7.9/24".parse().unwrap();
    assert_eq!(s.to_string(), "10.213.7.0/24");
    assert_eq!(s.gateway(), Ipv4Addr::new(10, 213, 7, 1));
    let mut used = HashSet::new();
    let net = unset_network("bz-0a1b2c3d", s);
    assert_eq!(
        net.netns_name(Ipv4Addr::new(10, 213, 7, 254)),
        "bz-0a1b2c3d-254"
    );
    assert!(net.veth_name(Ipv4Addr::new(10, 213, 7, 254)).len() <= 15);
    let a = net.allocate(&used).unwrap();
    assert_eq!(a, Ipv4Addr::new(10, 213, 7, 2));
    used.insert(a);
    assert_eq!(net.allocate(&used), Ok(Ipv4Addr::new(10, 213, 7, 3)));
    assert_eq!(s.machine_addresses().count(), 253);
    assert!("10.0.0.0/33".parse::<Subnet>().is_err());
    // Larger than a /16: more machines than id ranges, and veth names too long.
    assert!("10.0.0.0/15".parse::<Subnet>().is_err());
    let largest = Network {
        subnet: "10.200.0.0/16".parse().unwrap(),
        ..net.clone()
    };
    assert_eq!(largest.subnet.capacity(), 65533);
    let last = Ipv4Addr::new(10, 200, 255, 254);
    assert_eq!(largest.veth_name(last), "b0a1b2c3d65534");
    assert_eq!(largest.netns_name(last), "bz-0a1b2c3d-65534");
    assert!("10.0.0.0".parse::<Subnet>().is_err());
    let other: Subnet = "10.213.0.0/16".parse().unwrap();
    assert!(s.overlaps(&other) && other.overlaps(&s));
    assert!(!s.overlaps(&"10.213.8.0/24".parse().unwrap()));
}

#[test]
fn the_pool_follows_recent_demand_within_its_bounds() {
    let pool = Pool::default();
    let start = std::time::Instant::now();
    assert_eq!(pool.wanted(start), POOL_MIN);
    for _ in 0..20 {
        pool.count(start);
    }
    assert_eq!(pool.wanted(start), 20);
    for _ in 0..100 {
        pool.count(start);
    }
    assert_eq!(pool.wanted(start), POOL_MAX);
    let later = start + DEMAND_WINDOW + std::time::Duration::from_secs(1);
    assert_eq!(pool.wanted(later), POOL_MIN);
    pool.count(later);
    assert_eq!(
        locked(&pool.handed_out).len(),
        1,
        "old hand-outs are forgotten"
    );
}

#[test]
fn work_ahead_runs_at_a_lower_priority_and_gives_the_thread_back_as_it_was() {
    // In a thread of its own: the niceness is per thread.
    std::thread::spawn(|| {
        let tid = rustix::thread::gettid().as_raw_nonzero().get() as libc::id_t;
        // SAFETY: getpriority takes plain integers.
        let niceness = || unsafe { libc::getpriority(libc::PRIO_PROCESS, tid) };
        let before = niceness();
        let guard = LowPriority::this_thread().expect("lowering one's own priority");
        assert_eq!(niceness(), (before + LowPriority::NICENESS).min(19));
        drop(guard);
        // Raising it back needs CAP_SYS_NICE: a root agent's.
        if rustix::process::geteuid().is_root() {
            assert_eq!(niceness(), before);
        }
    })
    .join()
    .unwrap();
}

#[test]
fn names_fit_the_kernel_limits() {
    assert_eq!(format!("bz-{}", &hex_of("host")[..8]).len(), 11);
    let net = unset_network(
        &format!("bz-{}", &hex_of("host")[..8]),
        "10.0.0.0/16".parse().unwrap(),
    );
    assert!(net.veth_name(Ipv4Addr::new(10, 0, 255, 254)).len() <= 15);
}

/// Host `host`'s machine network on `subnet` (no NAT), its state in `dir`.
fn plain_network(dir: &Path, host: &str, subnet: &str) -> (Network, Subnet) {
    let subnet: Subnet = subnet.parse().unwrap();
    let net = Network::setup(
        dir,
        host,
        Some(subnet),
        false,
        Arc::new(IdRanges::new(host)),
    )
    .unwrap();
    (net, subnet)
}

/// A machine's address goes to the next machine with a fresh namespace, and the host must
/// reach that one at once. Its veth had a MAC of its own, so the host's neighbor entry for
/// the address (confirmed by the proxy's traffic, and trusted for up to 45 s) pointed at the
/// old veth: every connection from the host timed out for half a minute or more (a machine
/// moved back to a host by `bazaar host drain` got 503s from that host's proxy).
#[test]
fn a_reused_address_is_reached_at_once_from_the_host() {
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::os::fd::AsFd;
    use std::time::Duration;
    in_fresh_namespace(|| {
        let dir = tempfile::tempdir().unwrap();
        let (net, subnet) = plain_network(dir.path(), "h_neighbor_test", "10.213.9.0/24");
        let ip = subnet.machine_addresses().next().unwrap();
        let addr = SocketAddr::from((ip, 8080));
        // A machine on the address, listening in its namespace.
        let serve = || -> TcpListener {
            let attached = net.attach(ip).unwrap();
            let ns = std::fs::File::open(&attached.netns).unwrap();
            netlink::in_namespace(ns.as_fd(), || TcpListener::bind(addr)).unwrap()
        };
        let reach = || TcpStream::connect_timeout(&addr, Duration::from_secs(3));
        let first = serve();
        // The host talks to it (as the proxy does): its neighbor entry is confirmed.
        for _ in 0..3 {
            reach().expect("the host reaches the first machine");
            first.accept().unwrap();
        }
        drop(first);
        // The machine is gone; the next one gets the address in a fresh namespace.
        net.release(ip);
        let second = serve();
        let reached = reach();
        net.release(ip);
        net.teardown();
        drop(second);
        assert!(
            reached.is_ok(),
            "the host does not reach the address's new namespace: {reached:?}"
        );
    });
}

/// A machine's veth carries no IPv6 on the host: no link-local address, no route in the
/// host's IPv6 table (which the kernel walks whole at every link change: with thousands of
/// machines their routes made starts and stops quadratic). (It is up: the tests around
/// reach machines through it.)
#[test]
fn a_machines_veth_carries_no_ipv6_on_the_host() {
    if !Path::new("/proc/sys/net/ipv6").exists() {
        return; // a host without IPv6: nothing to turn off
    }
    in_fresh_namespace(|| {
        let dir = tempfile::tempdir().unwrap();
        let (net, subnet) = plain_network(dir.path(), "h_no_ipv6_test", "10.213.10.0/24");
        let ip = subnet.machine_addresses().next().unwrap();
        net.attach(ip).unwrap();
        let veth = net.veth_name(ip);
        let disabled =
            std::fs::read_to_string(format!("/proc/sys/net/ipv6/conf/{veth}/disable_ipv6"));
        let routes = std::fs::read_to_string("/proc/thread-self/net/ipv6_route").unwrap();
        net.release(ip);
        net.teardown();
        assert_eq!(disabled.unwrap().trim(), "1");
        assert!(
            !routes
                .lines()
                .any(|l| l.split_whitespace().last() == Some(veth.as_str())),
            "IPv6 routes of {veth}: {routes}"
        );
    });
}

/// A host used to stop at 1,023 machines (its one bridge's ports): now every address of
/// its subnet has room on one of its bridges, and the subnet is the limit.
#[test]
fn a_host_holds_as_many_machines_as_its_subnet_has_addresses_on_bridges_with_room() {
    let net = unset_network("bz-0a1b2c3d", "10.192.0.0/19".parse().unwrap());
    let mut used = HashSet::new();
    let mut per_bridge = vec![0usize; net.bridges.count()];
    while let Ok(ip) = net.allocate(&used) {
        assert!(used.insert(ip), "{ip} handed out twice");
        per_bridge[net.bridges.of(ip)] += 1;
    }
    assert_eq!(used.len(), 8189);
    assert!(
        per_bridge.iter().all(|n| *n <= BRIDGE_PORTS),
        "{per_bridge:?}"
    );
    let err = net.allocate(&used).unwrap_err();
    assert!(err.contains("network is full"), "{err}");
    assert!(err.contains("at most 8189 machines"), "{err}");
    // One released, one more fits.
    let released = Ipv4Addr::new(10, 192, 1, 7);
    assert!(used.remove(&released));
    assert_eq!(net.allocate(&used), Ok(released));
}

/// Issue 36: past a bridge's ports, machines go on the host's further bridges, in the same
/// subnet and behind the same gateway. A machine on the second bridge is reached from the
/// host (as the proxy reaches it) and from a peer the host routes (as the mesh's packets
/// are), reaches the gateway's DNS port, and nothing else: not the host's other listeners, not a machine on the first
/// bridge, not even when both route to each other through the gateway (the host's forward
/// chain drops that; without its table they would talk, so the check can fail). Teardown
/// leaves no bridge, route, veth or nftables table.
#[test]
fn a_machine_on_a_later_bridge_is_reached_and_kept_apart_as_on_the_first() {
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::os::fd::AsFd;
    use std::time::{Duration, Instant};
    in_fresh_namespace(|| {
        let dir = tempfile::tempdir().unwrap();
        let host = "h_bridges_test";
        let subnet: Subnet = "10.213.10.0/24".parse().unwrap();
        // Two bridges of a /25 each; NAT on, so the host forwards (what the drop guards).
        let net = Network::setup_sliced(
            dir.path(),
            host,
            Some(subnet),
            true,
            Arc::new(IdRanges::new(host)),
            Some(25),
        )
        .unwrap();
        let gateway = subnet.gateway();
        let (on_first, on_second) = (
            Ipv4Addr::new(10, 213, 10, 2),
            Ipv4Addr::new(10, 213, 10, 130),
        );
        // Whatever fails below, nothing is left on the host.
        let cleanup = TornDown(&net, [on_first, on_second]);
        assert_eq!(
            (net.bridges.of(on_first), net.bridges.of(on_second)),
            (0, 1)
        );
        // The second bridge is made with its first namespace.
        assert!(netlink::link_index(&net.bridges.name(1)).is_none());
        let namespace = |ip| std::fs::File::open(net.attach(ip).unwrap().netns).unwrap();
        let (first_ns, second_ns) = (namespace(on_first), namespace(on_second));
        assert!(netlink::link_index(&net.bridges.name(1)).is_some());
        let listen = |ns: &std::fs::File, ip: Ipv4Addr| {
            netlink::in_namespace(ns.as_fd(), || TcpListener::bind((ip, 8080))).unwrap()
        };
        let (first_app, second_app) = (listen(&first_ns, on_first), listen(&second_ns, on_second));
        let wait = Duration::from_secs(1);
        let from_second = |to: SocketAddr| {
            netlink::in_namespace(second_ns.as_fd(), || TcpStream::connect_timeout(&to, wait))
        };
        // The host reaches machines on both bridges.
        for (ip, app) in [(on_first, &first_app), (on_second, &second_app)] {
            TcpStream::connect_timeout(&SocketAddr::from((ip, 8080)), Duration::from_secs(3))
                .unwrap_or_else(|e| panic!("the host does not reach {ip}: {e}"));
            app.accept().unwrap();
        }
        // A peer routed in from outside the bridges, as the mesh device (`wg-<hash>`)
        // forwards another host's machines' packets, reaches it too.
        let peer = PeerNamespace::new(&format!("bzt-peer-{}", std::process::id()));
        peer.route_to(subnet);
        let from_peer = std::fs::File::open(Path::new(NETNS_DIR).join(&peer.0)).unwrap();
        netlink::in_namespace(from_peer.as_fd(), || {
            TcpStream::connect_timeout(&SocketAddr::from((on_second, 8080)), Duration::from_secs(3))
        })
        .expect("a routed peer (the mesh's path) reaches the machine on the second bridge");
        second_app.accept().unwrap();
        drop((from_peer, peer));
        // The machine reaches the gateway's DNS port, and no other listener of the host.
        let dns = TcpListener::bind((gateway, 53)).unwrap();
        from_second((gateway, 53).into()).expect("the machine reaches the gateway's DNS");
        dns.accept().unwrap();
        let other = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
        let other_port = other.local_addr().unwrap().port();
        assert!(from_second((gateway, other_port).into()).is_err());
        // Nor the machine on the first bridge: not on the link (another L2 domain)...
        let first_app_addr = SocketAddr::from((on_first, 8080));
        assert!(from_second(first_app_addr).is_err());
        // ... nor routed through the host, both machines asking for it (root in their
        // namespaces may).
        let route_via_gateway = |ns: &std::fs::File, to: Ipv4Addr| {
            netlink::in_namespace(ns.as_fd(), || {
                let eth0 = netlink::link_index("eth0").unwrap();
                Rtnl::open()?.add_route_via(to, 32, gateway, eth0)
            })
            .unwrap()
        };
        route_via_gateway(&second_ns, on_first);
        route_via_gateway(&first_ns, on_second);
        assert!(
            from_second(first_app_addr).is_err(),
            "routed across bridges"
        );
        // Without the host's `ip` table they would talk: the drop above is the firewall's.
        run_stdin("nft", &["delete", "table", "ip", &net.table()], "").unwrap();
        from_second(first_app_addr).expect("routed across bridges without the firewall");
        drop((first_app, second_app, first_ns, second_ns, dns, other));
        drop(cleanup);
        assert!(net
            .bridges
            .names()
            .all(|b| netlink::link_index(&b).is_none()));
        let routes = Rtnl::open().unwrap().routes().unwrap();
        assert!(!routes.iter().any(|r| subnet.contains(r.dst)), "{routes:?}");
        let tables = Command::new("nft")
            .args(["list", "tables"])
            .output()
            .unwrap();
        let tables = String::from_utf8_lossy(&tables.stdout);
        assert!(!tables.contains(&net.table()), "{tables}");
        // The veths go with their namespaces, which the kernel frees in the background.
        let deadline = Instant::now() + Duration::from_secs(10);
        let veths_left = || {
            [on_first, on_second]
                .iter()
                .any(|ip| netlink::link_index(&net.veth_name(*ip)).is_some())
        };
        while veths_left() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!veths_left(), "veths left after teardown");
    });
}

/// Releases its addresses and tears its network down when dropped (a failed test leaves
/// nothing behind either).
struct TornDown<'a, const N: usize>(&'a Network, [Ipv4Addr; N]);

impl<const N: usize> Drop for TornDown<'_, N> {
    fn drop(&mut self) {
        for ip in self.1 {
            self.0.release(ip);
        }
        self.0.teardown();
    }
}

/// A network namespace (`ip netns add`) with a veth to the calling thread's, addressed
/// 10.99.0.2/24 there and 10.99.0.1/24 here: a peer whose packets the host routes, as it
/// routes the mesh's. Removed when dropped.
struct PeerNamespace(String);

impl PeerNamespace {
    fn new(name: &str) -> PeerNamespace {
        let peer = PeerNamespace(name.to_string());
        let link = format!("p{}", std::process::id());
        peer.ip(&["netns", "add", name]);
        peer.ip(&[
            "link", "add", &link, "type", "veth", "peer", "name", "eth0", "netns", name,
        ]);
        peer.ip(&["addr", "add", "10.99.0.1/24", "dev", &link]);
        peer.ip(&["link", "set", &link, "up"]);
        peer.ip(&["-n", name, "addr", "add", "10.99.0.2/24", "dev", "eth0"]);
        peer.ip(&["-n", name, "link", "set", "eth0", "up"]);
        peer
    }

    /// Routes `subnet` from the peer through this namespace.
    fn route_to(&self, subnet: Subnet) {
        self.ip(&[
            "-n",
            &self.0,
            "route",
            "add",
            &subnet.to_string(),
            "via",
            "10.99.0.1",
        ]);
    }

    fn ip(&self, args: &[&str]) {
        let out = Command::new("ip").args(args).output().unwrap();
        assert!(
            out.status.success(),
            "ip {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for PeerNamespace {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.0])
            .output();
    }
}
