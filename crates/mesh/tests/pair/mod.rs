//! Two mesh devices in two network namespaces of their own, joined by a veth pair (the
//! underlay), for the device test and the pair bench. Namespace `a` holds 10.208.0.1 (its
//! prefix 10.208.0.0/22) and `b` 10.208.4.1 (10.208.4.0/22), reached through the mesh;
//! 10.99.0.1 and 10.99.4.1 are the same namespaces over the veth alone. Everything goes with
//! the namespaces when the pair is dropped.

use bazaar_mesh::{keys, Mesh, MeshConfig, Peer, Prefix};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::{Duration, Instant};

pub struct Pair {
    pub a: String,
    pub b: String,
    meshes: Vec<Mesh>,
}

fn sh(script: &str) {
    let ok = Command::new("sh").args(["-c", script]).status().unwrap();
    assert!(ok.success(), "{script}");
}

/// Runs `f` on a thread in network namespace `ns` (threads it starts stay there).
pub fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(path).unwrap();
        // SAFETY: setns on a valid namespace fd, for this thread only.
        assert_eq!(
            unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) },
            0
        );
        f()
    })
    .join()
    .unwrap()
}

impl Pair {
    /// Makes the namespaces (named after `tag` and this process) and the two devices, and
    /// lets them shake hands.
    pub fn up(tag: &str) -> Pair {
        assert!(
            // SAFETY: geteuid has no preconditions.
            unsafe { libc::geteuid() } == 0,
            "mesh pair needs root (network namespaces)"
        );
        let id = std::process::id();
        let (a, b) = (format!("{tag}{id}a"), format!("{tag}{id}b"));
        let mut pair = Pair {
            a: a.clone(),
            b: b.clone(),
            meshes: Vec::new(),
        };
        sh(&format!(
            "ip netns add {a} && ip netns add {b} \
             && ip link add va netns {a} type veth peer name vb netns {b} \
             && ip -n {a} addr add 192.168.231.1/24 dev va && ip -n {b} addr add 192.168.231.2/24 dev vb \
             && ip -n {a} link set va up && ip -n {b} link set vb up \
             && ip -n {a} link set lo up && ip -n {b} link set lo up \
             && ip -n {a} addr add 10.208.0.1/32 dev lo && ip -n {b} addr add 10.208.4.1/32 dev lo \
             && ip -n {a} addr add 10.99.0.1/32 dev lo && ip -n {b} addr add 10.99.4.1/32 dev lo \
             && ip -n {a} route add 10.99.4.1/32 via 192.168.231.2 src 10.99.0.1 \
             && ip -n {b} route add 10.99.0.1/32 via 192.168.231.1 src 10.99.4.1"
        ));
        let (ka, kb) = ([7u8; 32], [9u8; 32]);
        for (ns, key, me, peer_key, peer_ep, peer_prefix) in [
            (
                &a,
                ka,
                "192.168.231.1:51820",
                kb,
                "192.168.231.2:51820",
                "10.208.4.0/22",
            ),
            (
                &b,
                kb,
                "192.168.231.2:51820",
                ka,
                "192.168.231.1:51820",
                "10.208.0.0/22",
            ),
        ] {
            let (me, peer_ep, peer_prefix) =
                (me.to_string(), peer_ep.to_string(), peer_prefix.to_string());
            let mesh = in_ns(ns, move || {
                let m = Mesh::start(MeshConfig {
                    tun_name: "wg-pair".into(),
                    listen: me.parse().unwrap(),
                    private_key: key,
                    range: "10.208.0.0/12".parse::<Prefix>().unwrap(),
                })
                .unwrap();
                m.set_peers(&[Peer {
                    host_id: "peer".into(),
                    public_key: keys::public_key(&peer_key),
                    endpoint: peer_ep.parse().unwrap(),
                    prefix: peer_prefix.parse().unwrap(),
                }])
                .unwrap();
                m
            });
            pair.meshes.push(mesh);
        }
        // Machines' addresses are the source of what goes into the mesh.
        sh(&format!(
            "ip -n {a} route replace 10.208.4.0/22 dev wg-pair src 10.208.0.1 \
             && ip -n {b} route replace 10.208.0.0/22 dev wg-pair src 10.208.4.1"
        ));
        // The handshake, on the first packet.
        let (_, intact) = pair.stream(&a, &b, "10.208.4.1", 1024);
        assert!(intact, "the handshake's stream arrived intact");
        pair
    }

    /// Sends `bytes` (a pattern) from namespace `from` to `to_addr` in namespace `to` over
    /// one TCP connection; returns (bytes/s, whether they arrived intact).
    pub fn stream(&self, from: &str, to: &str, to_addr: &str, bytes: u64) -> (f64, bool) {
        let addr: SocketAddr = format!("{to_addr}:5201").parse().unwrap();
        let listener = in_ns(to, move || TcpListener::bind(addr).unwrap());
        let pattern: Vec<u8> = (0..PERIOD * 1046).map(|i| (i % PERIOD) as u8).collect();
        let sent_pattern = pattern.clone();
        let sink = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut buf = vec![0u8; 1 << 18];
            let (mut total, mut intact) = (0u64, true);
            loop {
                match s.read(&mut buf) {
                    Ok(0) => return (total, intact),
                    Ok(n) => {
                        let phase = (total % PERIOD as u64) as usize;
                        intact &= buf[..n] == pattern[phase..phase + n];
                        total += n as u64;
                    }
                    Err(e) => panic!("receiving after {total} bytes: {e}"),
                }
            }
        });
        let start = Instant::now();
        in_ns(from, move || {
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
            s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
            // Whole periods a write, so that each starts the pattern afresh.
            let chunk = PERIOD * 1044;
            let mut sent = 0u64;
            while sent < bytes {
                let n = (bytes - sent).min(chunk as u64) as usize;
                s.write_all(&sent_pattern[..n]).unwrap();
                sent += n as u64;
            }
        });
        let (total, intact) = sink.join().unwrap();
        let secs = start.elapsed().as_secs_f64();
        (total as f64 / secs, intact && total == bytes)
    }
}

/// The bytes sent repeat with this period (a prime: no alignment hides a shifted segment).
const PERIOD: usize = 251;

impl Drop for Pair {
    fn drop(&mut self) {
        self.meshes.clear();
        let _ = Command::new("ip").args(["netns", "del", &self.a]).status();
        let _ = Command::new("ip").args(["netns", "del", &self.b]).status();
    }
}
