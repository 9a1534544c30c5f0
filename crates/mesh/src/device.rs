//! The mesh device (I/O shell): a TUN device made by ioctl, one UDP socket, and a
//! WireGuard tunnel (boringtun's `noise::Tunn`) per peer. Three threads: packets read from
//! the TUN device are encrypted to the peer whose prefix holds their destination; datagrams
//! from a peer's endpoint are decrypted and written to the TUN device if their source is
//! in that peer's prefix (WireGuard's cryptokey routing); a timer drives handshakes,
//! retries and keepalives every 100 ms, and starts a tunnel afresh once boringtun gives up
//! on it, so traffic flows again after a partition heals. Routes to the peers' prefixes
//! point at the device; they go with it when the device is closed (dropping [`Mesh`]).
//!
//! Batching, as wireguard-go does, so that a packet costs its encryption and little else:
//! the TUN device hands TCP over unsegmented (TSO, `IFF_VNET_HDR`; cut into packets of the
//! MSS by [`crate::offload`]), whose encrypted segments leave in one UDP GSO send; the UDP
//! socket takes a burst from a peer in one receive (UDP GRO) and has room for bursts
//! (`udp.rs`); the decrypted TCP segments of a burst are joined again into one
//! super-packet for the TUN device, so that the receiving stack runs once for many.
//!
//! The kernel's WireGuard would replace all of this by `ip link add <name> type wireguard`
//! and `wg set` with the same keys, endpoints and allowed IPs (a peer's prefix): the
//! routes, labels and firewall stay as they are.

use crate::offload::{self, VnetHdr, VNET_HDR_LEN};
use crate::plan::{Peer, Prefix};
use crate::udp;
use boringtun::noise::{Tunn, TunnResult};
use boringtun::x25519::{PublicKey, StaticSecret};
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

/// The MTU of the mesh device: 1500 less WireGuard's overhead over IPv6 (80 bytes: 40 IPv6,
/// 8 UDP, 32 WireGuard), as wg-quick picks.
pub const MTU: u16 = 1420;
/// Keepalive interval of a tunnel (seconds): keeps a session warm and notices a peer that
/// comes back.
const KEEPALIVE_S: u16 = 5;
const TIMER_PERIOD: Duration = Duration::from_millis(100);
/// Room for a packet of [`MTU`] plus WireGuard's header and tag.
const BUF: usize = 2048;
/// Room for the largest packet the TUN device hands over unsegmented (TSO).
const TUN_READ: usize = 1 << 16;
/// Room for a super-packet's segments, encrypted: its bytes plus, for each segment (at
/// Linux's smallest MSS, 48), copied headers (up to 120 bytes) and WireGuard's 32.
const OUT: usize = TUN_READ + (TUN_READ / 48 + 1) * (120 + 32);

/// What a mesh device is made with.
#[derive(Debug, Clone)]
pub struct MeshConfig {
    /// The TUN device's name (≤ 15 characters).
    pub tun_name: String,
    /// Where the UDP socket listens (the host's address; loopback in dev).
    pub listen: SocketAddr,
    /// This host's WireGuard private key.
    pub private_key: [u8; 32],
    /// The private range: routed as unreachable while the device runs, so that an address
    /// of it no peer holds (a peer that is down) is refused at once, never sent out in the
    /// clear by another route.
    pub range: Prefix,
}

/// A running mesh device; stops its threads and removes the TUN device (and its routes)
/// when dropped.
#[derive(Debug)]
pub struct Mesh {
    shared: Arc<Shared>,
    threads: Vec<std::thread::JoinHandle<()>>,
    local_addr: SocketAddr,
}

struct Shared {
    tun: File,
    tun_name: String,
    range: Prefix,
    udp: UdpSocket,
    secret: StaticSecret,
    peers: RwLock<Peers>,
    next_index: AtomicU32,
    stop: AtomicBool,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("tun_name", &self.tun_name)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Peers {
    by_host: HashMap<String, Arc<PeerState>>,
    by_endpoint: HashMap<SocketAddr, Arc<PeerState>>,
}

struct PeerState {
    peer: Peer,
    tunn: Mutex<Tunn>,
}

impl Mesh {
    /// Makes the TUN device (up, [`MTU`]), binds the UDP socket and starts the threads.
    pub fn start(config: MeshConfig) -> std::io::Result<Mesh> {
        let tun = open_tun(&config.tun_name)?;
        ip(&format!(
            "link set {} mtu {MTU} up\nroute replace unreachable {}\n",
            config.tun_name, config.range
        ))?;
        let udp = UdpSocket::bind(config.listen)?;
        if !udp::tune(&udp) {
            tracing::info!("mesh: no UDP GRO on this kernel, one datagram a receive");
        }
        udp.set_read_timeout(Some(Duration::from_millis(200)))?;
        let local_addr = udp.local_addr()?;
        let shared = Arc::new(Shared {
            tun,
            tun_name: config.tun_name,
            range: config.range,
            udp,
            secret: StaticSecret::from(config.private_key),
            peers: RwLock::default(),
            next_index: AtomicU32::new(1),
            stop: AtomicBool::new(false),
        });
        let mut threads = Vec::new();
        for (name, body) in [
            ("mesh-tun", Shared::tun_to_peers as fn(&Shared)),
            ("mesh-udp", Shared::peers_to_tun),
            ("mesh-timer", Shared::timers),
        ] {
            let shared = shared.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(name.into())
                    .spawn(move || body(&shared))?,
            );
        }
        Ok(Mesh {
            shared,
            threads,
            local_addr,
        })
    }

    /// Where the UDP socket listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The TUN device's name.
    pub fn tun_name(&self) -> &str {
        &self.shared.tun_name
    }

    /// Makes `peers` the mesh's peers: new ones get a tunnel and a route to their prefix,
    /// gone ones lose both, changed ones (key, endpoint or prefix) start afresh. Errors
    /// (a route that could not be set) are returned after the rest is done.
    pub fn set_peers(&self, peers: &[Peer]) -> std::io::Result<()> {
        let mut table = self.shared.peers.write().unwrap_or_else(|e| e.into_inner());
        let mut routes = String::new();
        let wanted: HashMap<&str, &Peer> = peers.iter().map(|p| (p.host_id.as_str(), p)).collect();
        let gone: Vec<String> = table
            .by_host
            .iter()
            .filter(|(id, st)| wanted.get(id.as_str()) != Some(&&st.peer))
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            if let Some(st) = table.by_host.remove(&id) {
                table.by_endpoint.remove(&st.peer.endpoint);
                routes += &format!(
                    "route del {} dev {}\n",
                    st.peer.prefix, self.shared.tun_name
                );
                tracing::info!(peer = %id, prefix = %st.peer.prefix, "mesh: peer removed");
            }
        }
        for peer in peers {
            if table.by_host.contains_key(&peer.host_id) {
                continue;
            }
            let st = Arc::new(PeerState {
                peer: peer.clone(),
                tunn: Mutex::new(self.shared.tunnel(&peer.public_key)),
            });
            table.by_endpoint.insert(peer.endpoint, st.clone());
            table.by_host.insert(peer.host_id.clone(), st);
            routes += &format!(
                "route replace {} dev {}\n",
                peer.prefix, self.shared.tun_name
            );
            tracing::info!(peer = %peer.host_id, prefix = %peer.prefix, endpoint = %peer.endpoint, "mesh: peer added");
        }
        drop(table);
        if routes.is_empty() {
            return Ok(());
        }
        // `-force`: a route already gone (or there) does not stop the others.
        ip_force(&routes)
    }

    /// The peers' prefixes the device routes, sorted.
    pub fn routed(&self) -> Vec<Prefix> {
        let table = self.shared.peers.read().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<Prefix> = table.by_host.values().map(|s| s.peer.prefix).collect();
        v.sort();
        v
    }
}

impl Drop for Mesh {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let _ = ip_force(&format!("route del unreachable {}\n", self.shared.range));
    }
}

impl Shared {
    fn tunnel(&self, peer_key: &[u8; 32]) -> Tunn {
        let index = self.next_index.fetch_add(1, Ordering::Relaxed) & 0x00ff_ffff;
        Tunn::new(
            self.secret.clone(),
            PublicKey::from(*peer_key),
            None,
            Some(KEEPALIVE_S),
            index,
            None,
        )
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn send(&self, to: SocketAddr, datagram: &[u8]) {
        // A peer that is down or cut off: the datagram is lost, as on a wire; TCP retries.
        let _ = self.udp.send_to(datagram, to);
    }

    /// TUN → peers. The device hands TCP over unsegmented (TSO): one read is up to 64 KiB
    /// of one flow, cut here into packets of the MSS, encrypted end to end into one buffer
    /// and sent with as few UDP GSO sends as their sizes allow.
    fn tun_to_peers(&self) {
        let mut read = vec![0u8; VNET_HDR_LEN + TUN_READ];
        let mut segment = vec![0u8; BUF];
        let mut out = vec![0u8; OUT];
        let mut sizes: Vec<((), usize)> = Vec::with_capacity(128);
        let mut tun = &self.tun;
        let mut gso = true;
        while !self.stopped() {
            let n = match tun.read(&mut read) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    readable(self.tun.as_raw_fd(), 200);
                    continue;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "mesh: reading the TUN device");
                    return;
                }
            };
            let Some(hdr) = VnetHdr::parse(&read[..n]) else {
                continue;
            };
            let packet = &mut read[VNET_HDR_LEN..n];
            let Some(std::net::IpAddr::V4(dst)) = Tunn::dst_address(packet) else {
                continue;
            };
            let Some(peer) = self.peer_for(dst) else {
                continue;
            };
            sizes.clear();
            let mut used = 0;
            {
                let mut tunn = peer.tunn.lock().unwrap_or_else(|e| e.into_inner());
                let cut = offload::segments(hdr, packet, &mut segment, |p| {
                    if let TunnResult::WriteToNetwork(d) = tunn.encapsulate(p, &mut out[used..]) {
                        used += d.len();
                        sizes.push(((), d.len()));
                    }
                });
                if let Err(e) = cut {
                    tracing::debug!(error = ?e, "mesh: a packet from the TUN device dropped");
                }
            }
            let mut start = 0;
            for run in offload::gso_runs(&sizes) {
                let len: usize = sizes[run.clone()].iter().map(|(_, l)| l).sum();
                let bytes = &out[start..start + len];
                if gso && run.len() > 1 {
                    match udp::send_segments(
                        &self.udp,
                        peer.peer.endpoint,
                        bytes,
                        sizes[run.start].1 as u16,
                    ) {
                        Ok(()) => {
                            start += len;
                            continue;
                        }
                        // No UDP GSO on this path (old kernel, device without checksum
                        // offload): one datagram a call from now on.
                        Err(e)
                            if matches!(
                                e.raw_os_error(),
                                Some(libc::EIO | libc::EINVAL | libc::ENOPROTOOPT)
                            ) =>
                        {
                            tracing::info!(error = %e, "mesh: UDP GSO refused, sending datagrams one by one");
                            gso = false;
                        }
                        Err(_) => {
                            start += len;
                            continue;
                        }
                    }
                }
                let mut at = start;
                for (_, l) in &sizes[run] {
                    self.send(peer.peer.endpoint, &out[at..at + l]);
                    at += l;
                }
                start += len;
            }
        }
    }

    /// The peer whose prefix holds `dst`.
    fn peer_for(&self, dst: std::net::Ipv4Addr) -> Option<Arc<PeerState>> {
        let table = self.peers.read().unwrap_or_else(|e| e.into_inner());
        table
            .by_host
            .values()
            .find(|s| s.peer.prefix.contains(dst))
            .cloned()
    }

    /// Peers → TUN. One receive holds several datagrams of one peer when the kernel joined
    /// them (UDP GRO); each is decrypted, and consecutive TCP segments of one flow are
    /// joined into one write to the TUN device ([`offload::Coalescer`]).
    fn peers_to_tun(&self) {
        let mut datagrams = vec![0u8; 1 << 16];
        let mut out = vec![0u8; BUF + 64];
        let mut joined = offload::Coalescer::default();
        let mut tun = &self.tun;
        let mut write = |p: &[u8]| {
            let _ = tun.write(p);
        };
        while !self.stopped() {
            let (n, from, segment) = match udp::recv_segments(&self.udp, &mut datagrams) {
                Ok(r) => r,
                Err(_) => continue,
            };
            let peer = {
                let table = self.peers.read().unwrap_or_else(|e| e.into_inner());
                table.by_endpoint.get(&from).cloned()
            };
            let Some(peer) = peer else { continue };
            for datagram in datagrams[..n].chunks(segment.map_or(n.max(1), usize::from)) {
                let mut tunn = peer.tunn.lock().unwrap_or_else(|e| e.into_inner());
                match tunn.decapsulate(Some(from.ip()), datagram, &mut out) {
                    TunnResult::WriteToNetwork(d) => {
                        self.send(from, d);
                        // Packets queued while the handshake was under way.
                        while let TunnResult::WriteToNetwork(d) =
                            tunn.decapsulate(None, &[], &mut out)
                        {
                            self.send(from, d);
                        }
                    }
                    TunnResult::WriteToTunnelV4(p, src) if peer.peer.prefix.contains(src) => {
                        drop(tunn);
                        joined.add(p, &mut write);
                    }
                    _ => {}
                }
            }
            joined.flush(&mut write);
        }
    }

    /// Handshake retries, rekeys and keepalives; a tunnel boringtun gave up on (no
    /// handshake answered for 90 s) starts afresh, and the next packet shakes hands again.
    fn timers(&self) {
        let mut out = [0u8; BUF];
        while !self.stopped() {
            std::thread::sleep(TIMER_PERIOD);
            let peers: Vec<Arc<PeerState>> = {
                let table = self.peers.read().unwrap_or_else(|e| e.into_inner());
                table.by_host.values().cloned().collect()
            };
            for peer in peers {
                let mut tunn = peer.tunn.lock().unwrap_or_else(|e| e.into_inner());
                match tunn.update_timers(&mut out) {
                    TunnResult::WriteToNetwork(d) => self.send(peer.peer.endpoint, d),
                    TunnResult::Err(
                        boringtun::noise::errors::WireGuardError::ConnectionExpired,
                    ) => {
                        *tunn = self.tunnel(&peer.peer.public_key);
                    }
                    _ => {}
                }
            }
        }
    }
}

/// Whether `fd` has something to read within `timeout_ms`.
fn readable(fd: i32, timeout_ms: i32) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut pfd, 1, timeout_ms) > 0 }
}

/// Opens `/dev/net/tun` as a new TUN device `name`, non-blocking, packets behind a
/// `virtio_net_hdr` (no packet information header), TCP segmentation left to us.
fn open_tun(name: &str) -> std::io::Result<File> {
    if name.len() > 15 {
        return Err(std::io::Error::other(format!(
            "TUN device name {name:?} is longer than 15 characters"
        )));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")?;
    #[repr(C)]
    struct IfReq {
        name: [u8; libc::IFNAMSIZ],
        flags: libc::c_short,
        _pad: [u8; 22],
    }
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: (libc::IFF_TUN | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short,
        _pad: [0; 22],
    };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: TUNSETIFF reads an ifreq, which `req` is laid out as.
    if unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut req) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // TCP over IPv4 unsegmented, checksums left to us.
    let offloads = libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO_ECN;
    // SAFETY: TUNSETOFFLOAD takes its flags by value; F_SETFL an int.
    unsafe {
        if libc::ioctl(
            file.as_raw_fd(),
            libc::TUNSETOFFLOAD,
            offloads as libc::c_ulong,
        ) < 0
        {
            return Err(std::io::Error::last_os_error());
        }
        if libc::fcntl(file.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(file)
}

fn ip(cmds: &str) -> std::io::Result<()> {
    run_ip(&["-batch", "-"], cmds)
}

fn ip_force(cmds: &str) -> std::io::Result<()> {
    run_ip(&["-force", "-batch", "-"], cmds)
}

fn run_ip(args: &[&str], cmds: &str) -> std::io::Result<()> {
    crate::run_stdin("ip", args, cmds)
}
