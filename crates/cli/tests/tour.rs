//! The README's tour works as written: `scripts/tour` runs its commands top to bottom (a
//! `bazaar dev` cluster, machines, the proxy, a host killed with kill -9, deploys, a
//! volume, an image machine) on free ports, and the cluster's Ctrl-C leaves nothing of it
//! running or mounted.

use crate::common;

use common::*;
use std::process::Command;

/// A base port with `base..base + 3` free for TCP and UDP on loopback.
fn free_ports() -> u16 {
    let free = |p: u16| {
        std::net::TcpListener::bind(("127.0.0.1", p)).is_ok()
            && std::net::UdpSocket::bind(("127.0.0.1", p)).is_ok()
    };
    for _ in 0..1000 {
        let base = bazaar_testkit::free_port(std::net::Ipv4Addr::LOCALHOST);
        if base < 31_900 && (0..3).all(|i| free(base + i)) {
            return base;
        }
    }
    panic!("no free ports");
}

#[test]
fn the_readme_tour_runs_top_to_bottom() {
    assert!(
        is_root(),
        "the tour's image part needs root (CI runs as root)"
    );
    let tmp = tempfile::tempdir().unwrap();
    let dir = std::fs::canonicalize(tmp.path()).unwrap();
    let (api, proxy, gossip, tls) = loop {
        let ports = (free_ports(), free_ports(), free_ports(), free_ports());
        let distinct = [ports.0, ports.1, ports.2, ports.3];
        if distinct
            .iter()
            .enumerate()
            .all(|(i, a)| distinct[i + 1..].iter().all(|b| a.abs_diff(*b) > 3))
        {
            break ports;
        }
    };
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/tour");
    let out = Command::new("bash")
        .arg(script)
        .env("BAZAAR", EXE)
        .env("TOUR_DIR", &dir)
        .env("TOUR_BASE_PORT", api.to_string())
        .env("TOUR_PROXY_PORT", proxy.to_string())
        .env("TOUR_GOSSIP_PORT", gossip.to_string())
        .env("TOUR_PROXY_TLS_PORT", tls.to_string())
        .env_remove("BAZAAR_API_URL")
        .env_remove("BAZAAR_TOKEN")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let dev_log = std::fs::read_to_string(dir.join("dev.log")).unwrap_or_default();
    assert!(
        out.status.success(),
        "the tour failed:\n{stderr}\n{}\ndev.log:\n{dev_log}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(stderr.contains("tour: every command worked"), "{stderr}");
    assert!(!stderr.contains("skipping images"), "{stderr}");

    // Ctrl-C took the cluster down whole, the host killed with kill -9 included.
    let under = format!("{}/", dir.display());
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    let left: Vec<&str> = mounts.lines().filter(|l| l.contains(&under)).collect();
    assert!(left.is_empty(), "still mounted: {left:#?}");
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(!cmdline.contains(&under), "still running: {cmdline}");
    }
}
