//! The few rtnetlink requests of the machine network, sent by the agent itself on a
//! `NETLINK_ROUTE` socket ([`crate::network`] made them with `ip` executions before: a fork
//! and exec each, most of a namespace's cost, and a host without iproute2 could run no
//! machine): the bridge and its address, each namespace's veth pair and addresses, and the
//! routes a free subnet is picked among. Each request asks for an acknowledgement and fails
//! with the kernel's errno.
//!
//! Requests that act inside a namespace run on a short-lived thread that joins it
//! (`in_namespace`): a network namespace is per thread, and the caller's thread stays
//! where it was.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_NEWADDR: u16 = 20;
const RTM_DELADDR: u16 = 21;
const RTM_NEWROUTE: u16 = 24;
const RTM_GETROUTE: u16 = 26;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_REPLACE: u16 = 0x100;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const IFF_UP: u32 = 0x1;
const IFLA_ADDRESS: u16 = 1;
const IFLA_IFNAME: u16 = 3;
const IFLA_MASTER: u16 = 10;
const IFLA_LINKINFO: u16 = 18;
const IFLA_NET_NS_FD: u16 = 28;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const IFLA_INFO_SLAVE_KIND: u16 = 4;
const IFLA_INFO_SLAVE_DATA: u16 = 5;
const IFLA_BRPORT_ISOLATED: u16 = 33;
const VETH_INFO_PEER: u16 = 1;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_PREFSRC: u16 = 7;
const RT_TABLE_MAIN: u8 = 254;
const RTPROT_BOOT: u8 = 3;
const RT_SCOPE_UNIVERSE: u8 = 0;
const RT_SCOPE_LINK: u8 = 253;
const RTN_UNICAST: u8 = 1;

/// A `NETLINK_ROUTE` socket of the calling thread's network namespace.
pub(crate) struct Rtnl {
    socket: OwnedFd,
    seq: u32,
}

/// One request being put together: a netlink header, a fixed part, attributes.
struct Message(Vec<u8>);

impl Message {
    fn new(kind: u16, flags: u16) -> Message {
        let mut buf = vec![0u8; 16];
        buf[4..6].copy_from_slice(&kind.to_ne_bytes());
        buf[6..8].copy_from_slice(&(flags | NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
        Message(buf)
    }

    fn put(&mut self, bytes: &[u8]) -> &mut Message {
        self.0.extend_from_slice(bytes);
        while !self.0.len().is_multiple_of(4) {
            self.0.push(0);
        }
        self
    }

    /// An interface header (`struct ifinfomsg`).
    fn link(&mut self, index: u32, flags: u32) -> &mut Message {
        let mut ifi = [0u8; 16];
        ifi[4..8].copy_from_slice(&index.to_ne_bytes());
        ifi[8..12].copy_from_slice(&flags.to_ne_bytes());
        ifi[12..16].copy_from_slice(&flags.to_ne_bytes());
        self.put(&ifi)
    }

    fn attr(&mut self, kind: u16, data: &[u8]) -> &mut Message {
        let len = (4 + data.len()) as u16;
        self.0.extend_from_slice(&len.to_ne_bytes());
        self.0.extend_from_slice(&kind.to_ne_bytes());
        self.put(data)
    }

    fn name(&mut self, kind: u16, name: &str) -> &mut Message {
        let mut data = name.as_bytes().to_vec();
        data.push(0);
        self.attr(kind, &data)
    }

    /// Opens a nested attribute (without `NLA_F_NESTED`, as iproute2 sends them);
    /// [`Message::end`] closes it.
    fn nest(&mut self, kind: u16) -> usize {
        let at = self.0.len();
        self.attr(kind, &[]);
        at
    }

    fn end(&mut self, at: usize) -> &mut Message {
        let len = (self.0.len() - at) as u16;
        self.0[at..at + 2].copy_from_slice(&len.to_ne_bytes());
        self
    }
}

impl Rtnl {
    pub(crate) fn open() -> io::Result<Rtnl> {
        // SAFETY: socket takes plain integers; the descriptor it returns is ours alone.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        let socket = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Rtnl { socket, seq: 0 })
    }

    /// Numbers `msg` with the next sequence number, sets its length and sends it.
    fn send(&mut self, msg: &mut Message) -> io::Result<()> {
        self.seq += 1;
        let len = msg.0.len() as u32;
        msg.0[0..4].copy_from_slice(&len.to_ne_bytes());
        msg.0[8..12].copy_from_slice(&self.seq.to_ne_bytes());
        // SAFETY: the buffer lives across the call and `len` bytes of it are read.
        let sent = unsafe {
            libc::send(
                self.socket.as_raw_fd(),
                msg.0.as_ptr().cast(),
                msg.0.len(),
                0,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Sends `msg` and waits for the kernel's acknowledgement.
    fn request(&mut self, msg: &mut Message) -> io::Result<()> {
        self.send(msg)?;
        let mut buf = [0u8; 8192];
        loop {
            // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`.
            let n = unsafe {
                libc::recv(
                    self.socket.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    0,
                )
            };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut at = 0usize;
            while at + 16 <= n as usize {
                let field =
                    |o: usize| u32::from_ne_bytes(buf[at + o..at + o + 4].try_into().unwrap());
                let (len, kind, seq) = (field(0) as usize, field(4) as u16, field(8));
                if kind == NLMSG_ERROR && seq == self.seq && at + 20 <= n as usize {
                    let errno = field(16) as i32;
                    return if errno == 0 {
                        Ok(())
                    } else {
                        Err(io::Error::from_raw_os_error(-errno))
                    };
                }
                if len < 16 {
                    break;
                }
                at += (len + 3) & !3;
            }
        }
    }

    /// Makes veth pair `name` here (down, a port of bridge `master`: the caller turns its
    /// IPv6 off and brings it up) and `peer`, with MAC address `peer_mac`, in the network
    /// namespace `netns`.
    pub(crate) fn add_veth(
        &mut self,
        name: &str,
        master: u32,
        peer: &str,
        peer_mac: [u8; 6],
        netns: BorrowedFd<'_>,
    ) -> io::Result<()> {
        let mut msg = Message::new(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL);
        msg.link(0, 0)
            .name(IFLA_IFNAME, name)
            .attr(IFLA_MASTER, &master.to_ne_bytes());
        let info = msg.nest(IFLA_LINKINFO);
        msg.name(IFLA_INFO_KIND, "veth");
        let data = msg.nest(IFLA_INFO_DATA);
        let peer_at = msg.nest(VETH_INFO_PEER);
        msg.link(0, 0)
            .name(IFLA_IFNAME, peer)
            .attr(IFLA_ADDRESS, &peer_mac)
            .attr(IFLA_NET_NS_FD, &(netns.as_raw_fd() as u32).to_ne_bytes());
        msg.end(peer_at).end(data).end(info);
        self.request(&mut msg)
    }

    /// Makes bridge port `index` isolated: the bridge forwards nothing between two
    /// isolated ports.
    pub(crate) fn isolate_bridge_port(&mut self, index: u32) -> io::Result<()> {
        let mut msg = Message::new(RTM_NEWLINK, 0);
        msg.link(index, 0);
        let info = msg.nest(IFLA_LINKINFO);
        msg.name(IFLA_INFO_SLAVE_KIND, "bridge");
        let data = msg.nest(IFLA_INFO_SLAVE_DATA);
        msg.attr(IFLA_BRPORT_ISOLATED, &[1]);
        msg.end(data).end(info);
        self.request(&mut msg)
    }

    /// Makes bridge `name` (down), with MAC address `mac` when given (kept: a bridge given
    /// one does not take its ports').
    pub(crate) fn add_bridge(&mut self, name: &str, mac: Option<[u8; 6]>) -> io::Result<()> {
        let mut msg = Message::new(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL);
        msg.link(0, 0).name(IFLA_IFNAME, name);
        if let Some(mac) = mac {
            msg.attr(IFLA_ADDRESS, &mac);
        }
        let info = msg.nest(IFLA_LINKINFO);
        msg.name(IFLA_INFO_KIND, "bridge");
        msg.end(info);
        self.request(&mut msg)
    }

    /// The IPv4 routes of every table (as `ip -4 route show table all`).
    pub(crate) fn routes(&mut self) -> io::Result<Vec<Route>> {
        let mut rtm = [0u8; 12];
        rtm[0] = libc::AF_INET as u8;
        let mut msg = Message::new(RTM_GETROUTE, NLM_F_DUMP);
        msg.put(&rtm);
        let mut routes = Vec::new();
        self.dump(&mut msg, |kind, body| {
            if kind == RTM_NEWROUTE && body.len() >= 12 && body[0] == libc::AF_INET as u8 {
                routes.push(Route::parse(body));
            }
        })?;
        Ok(routes)
    }

    /// Sends dump request `msg` and hands each answer's type and body to `each`, until the
    /// kernel says it is done.
    fn dump(&mut self, msg: &mut Message, mut each: impl FnMut(u16, &[u8])) -> io::Result<()> {
        self.send(msg)?;
        // A dump's datagrams hold whole messages, each at most a page or so.
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`.
            let n = unsafe {
                libc::recv(
                    self.socket.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    0,
                )
            };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let n = n as usize;
            let mut at = 0usize;
            while at + 16 <= n {
                let field =
                    |o: usize| u32::from_ne_bytes(buf[at + o..at + o + 4].try_into().unwrap());
                let (len, kind, seq) = (field(0) as usize, field(4) as u16, field(8));
                if len < 16 || at + len > n {
                    break;
                }
                if seq == self.seq {
                    match kind {
                        NLMSG_DONE => return Ok(()),
                        NLMSG_ERROR if len >= 20 => {
                            let errno = field(16) as i32;
                            if errno != 0 {
                                return Err(io::Error::from_raw_os_error(-errno));
                            }
                        }
                        _ => each(kind, &buf[at + 16..at + len]),
                    }
                }
                at += (len + 3) & !3;
            }
        }
    }

    /// Brings link `index` up.
    pub(crate) fn set_up(&mut self, index: u32) -> io::Result<()> {
        self.request(Message::new(RTM_NEWLINK, 0).link(index, IFF_UP))
    }

    /// Removes link `name` (and its veth peer with it).
    pub(crate) fn delete_link(&mut self, name: &str) -> io::Result<()> {
        self.request(
            Message::new(RTM_DELLINK, 0)
                .link(0, 0)
                .name(IFLA_IFNAME, name),
        )
    }

    /// Gives link `index` the MAC address `mac`.
    pub(crate) fn set_mac(&mut self, index: u32, mac: [u8; 6]) -> io::Result<()> {
        self.request(
            Message::new(RTM_NEWLINK, 0)
                .link(index, 0)
                .attr(IFLA_ADDRESS, &mac),
        )
    }

    /// Makes link `index` a port of bridge `master`, and up.
    pub(crate) fn set_master(&mut self, index: u32, master: u32) -> io::Result<()> {
        self.request(
            Message::new(RTM_NEWLINK, 0)
                .link(index, IFF_UP)
                .attr(IFLA_MASTER, &master.to_ne_bytes()),
        )
    }

    /// Takes address `ip/prefix` off link `index`.
    pub(crate) fn delete_address(
        &mut self,
        index: u32,
        ip: Ipv4Addr,
        prefix: u8,
    ) -> io::Result<()> {
        let mut ifa = [0u8; 8];
        ifa[0] = libc::AF_INET as u8;
        ifa[1] = prefix;
        ifa[4..8].copy_from_slice(&index.to_ne_bytes());
        self.request(
            Message::new(RTM_DELADDR, 0)
                .put(&ifa)
                .attr(IFA_LOCAL, &ip.octets())
                .attr(IFA_ADDRESS, &ip.octets()),
        )
    }

    /// Gives link `index` address `ip/prefix`.
    pub(crate) fn add_address(&mut self, index: u32, ip: Ipv4Addr, prefix: u8) -> io::Result<()> {
        self.address(index, ip, prefix, NLM_F_CREATE | NLM_F_EXCL)
    }

    /// Gives link `index` address `ip/prefix`, whether or not it had it (`ip addr replace`).
    pub(crate) fn replace_address(
        &mut self,
        index: u32,
        ip: Ipv4Addr,
        prefix: u8,
    ) -> io::Result<()> {
        self.address(index, ip, prefix, NLM_F_CREATE | NLM_F_REPLACE)
    }

    fn address(&mut self, index: u32, ip: Ipv4Addr, prefix: u8, flags: u16) -> io::Result<()> {
        let mut ifa = [0u8; 8];
        ifa[0] = libc::AF_INET as u8;
        ifa[1] = prefix;
        ifa[3] = RT_SCOPE_UNIVERSE;
        ifa[4..8].copy_from_slice(&index.to_ne_bytes());
        self.request(
            Message::new(RTM_NEWADDR, flags)
                .put(&ifa)
                .attr(IFA_LOCAL, &ip.octets())
                .attr(IFA_ADDRESS, &ip.octets()),
        )
    }

    /// Routes everything through `gateway` on link `index`.
    pub(crate) fn add_default_route(&mut self, gateway: Ipv4Addr, index: u32) -> io::Result<()> {
        let rtm = route_message(0, RT_SCOPE_UNIVERSE);
        self.request(
            Message::new(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL)
                .put(&rtm)
                .attr(RTA_GATEWAY, &gateway.octets())
                .attr(RTA_OIF, &index.to_ne_bytes()),
        )
    }

    /// Routes `dst/prefix` straight onto link `index` (on-link, no gateway), from source
    /// `source`, whether or not that route was there (`ip route replace dst/prefix dev
    /// index scope link src source`).
    pub(crate) fn replace_link_route(
        &mut self,
        dst: Ipv4Addr,
        prefix: u8,
        index: u32,
        source: Ipv4Addr,
    ) -> io::Result<()> {
        let rtm = route_message(prefix, RT_SCOPE_LINK);
        self.request(
            Message::new(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_REPLACE)
                .put(&rtm)
                .attr(RTA_DST, &dst.octets())
                .attr(RTA_PREFSRC, &source.octets())
                .attr(RTA_OIF, &index.to_ne_bytes()),
        )
    }

    /// Routes `dst/prefix` through `gateway` on link `index` (`ip route add dst/prefix via
    /// gateway dev index`): what a machine may do in its own namespace (tests).
    #[cfg(test)]
    pub(crate) fn add_route_via(
        &mut self,
        dst: Ipv4Addr,
        prefix: u8,
        gateway: Ipv4Addr,
        index: u32,
    ) -> io::Result<()> {
        let rtm = route_message(prefix, RT_SCOPE_UNIVERSE);
        self.request(
            Message::new(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL)
                .put(&rtm)
                .attr(RTA_DST, &dst.octets())
                .attr(RTA_GATEWAY, &gateway.octets())
                .attr(RTA_OIF, &index.to_ne_bytes()),
        )
    }
}

/// Turns IPv6 off on host link `name` (made down, so that it never had an address):
/// a machine's veth carries no IPv6 (the firewall drops it), and each one that has it
/// adds a link-local address with its duplicate detection and two routes to the host's
/// IPv6 table, which the kernel walks whole whenever a link goes down: with thousands of
/// machines, making and removing veths went quadratic (issue 36). A host without IPv6
/// has nothing to turn off.
pub(crate) fn disable_ipv6(name: &str) -> io::Result<()> {
    match std::fs::write(format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6"), "1") {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// The `struct rtmsg` of a unicast route of the main table to a `prefix`-long destination
/// (0: the default route).
fn route_message(prefix: u8, scope: u8) -> [u8; 12] {
    [
        libc::AF_INET as u8,
        prefix,
        0,
        0,
        RT_TABLE_MAIN,
        RTPROT_BOOT,
        scope,
        RTN_UNICAST,
        0,
        0,
        0,
        0,
    ]
}

/// An IPv4 route: where to (`dst/prefix`; prefix 0 is a default route) and through which
/// link (none for a multipath or unreachable route).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Route {
    pub dst: Ipv4Addr,
    pub prefix: u8,
    pub oif: Option<u32>,
}

impl Route {
    /// Reads a route message's body: `struct rtmsg` (12 bytes), then attributes.
    fn parse(body: &[u8]) -> Route {
        let mut route = Route {
            dst: Ipv4Addr::UNSPECIFIED,
            prefix: body[1],
            oif: None,
        };
        let mut at = 12;
        while at + 4 <= body.len() {
            let len = u16::from_ne_bytes([body[at], body[at + 1]]) as usize;
            let kind = u16::from_ne_bytes([body[at + 2], body[at + 3]]);
            if len < 4 || at + len > body.len() {
                break;
            }
            let data = &body[at + 4..at + len];
            match (kind, data.len()) {
                (RTA_DST, 4) => route.dst = Ipv4Addr::new(data[0], data[1], data[2], data[3]),
                (RTA_OIF, 4) => route.oif = Some(u32::from_ne_bytes(data.try_into().unwrap())),
                _ => {}
            }
            at += (len + 3) & !3;
        }
        route
    }
}

/// Removes link `name` of the calling thread's network namespace (a veth's peer goes with
/// it), as `ip link delete` does.
pub fn delete_link(name: &str) -> io::Result<()> {
    Rtnl::open()?.delete_link(name)
}

/// The index of link `name` in the calling thread's network namespace (asked of the
/// kernel), if there is one.
pub(crate) fn link_index(name: &str) -> Option<u32> {
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: `name` is NUL-terminated and lives across the call.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    (index != 0).then_some(index)
}

/// Runs `work` on a thread of its own that has joined network namespace `netns`.
pub(crate) fn in_namespace<T: Send>(
    netns: BorrowedFd<'_>,
    work: impl FnOnce() -> io::Result<T> + Send,
) -> io::Result<T> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // SAFETY: setns takes a descriptor and a flag; it moves only this thread,
                // which ends with `work`.
                if unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                work()
            })
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("a namespace thread panicked")))
    })
}

/// Gives link `ifname` of the calling thread's namespace `ip/prefix`, brings it and `lo`
/// up, and routes everything through `gateway`.
pub(crate) fn configure_machine_side(
    ifname: &str,
    ip: Ipv4Addr,
    prefix: u8,
    gateway: Ipv4Addr,
) -> io::Result<()> {
    let missing = |name: &str| io::Error::other(format!("no link {name} in the namespace"));
    let lo = link_index("lo").ok_or_else(|| missing("lo"))?;
    let link = link_index(ifname).ok_or_else(|| missing(ifname))?;
    let mut rtnl = Rtnl::open()?;
    rtnl.set_up(lo)?;
    rtnl.add_address(link, ip, prefix)?;
    rtnl.set_up(link)?;
    rtnl.add_default_route(gateway, link)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_attributes_carry_their_length_and_stay_aligned() {
        let mut msg = Message::new(RTM_NEWLINK, 0);
        msg.link(7, IFF_UP);
        let info = msg.nest(IFLA_LINKINFO);
        msg.name(IFLA_INFO_KIND, "veth");
        msg.end(info);
        // header 16 + ifinfomsg 16 + nest header 4 + "veth\0" attribute 4 + 5 → 8.
        assert_eq!(msg.0.len(), 16 + 16 + 4 + 12);
        assert_eq!(u16::from_ne_bytes([msg.0[32], msg.0[33]]), 16);
        assert_eq!(u16::from_ne_bytes([msg.0[34], msg.0[35]]), IFLA_LINKINFO);
        assert_eq!(u32::from_ne_bytes(msg.0[20..24].try_into().unwrap()), 7);
    }
}
