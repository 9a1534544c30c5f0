//! `bazaar-mesh`: the private network between hosts (issue 16). A pure core (`plan`: each
//! host's /22 of 10.208.0.0/12, claimed deterministically from its id with the lower id
//! winning a prefix claimed twice; the peers a host's catalog announces; the nftables
//! rules that keep organizations apart) and a thin shell: the WireGuard device (`device`:
//! boringtun over a TUN device, batched: `offload` cuts the device's TCP super-packets,
//! `udp` sends and receives many datagrams a call), the host's key (`keys`) and the
//! firewall (`firewall`).
//! docs/NETWORK.md says how it fits together.

pub mod device;
pub mod firewall;
pub mod keys;
pub mod offload;
pub mod plan;
mod udp;

pub use device::{Mesh, MeshConfig, MTU};
pub use plan::{Peer, Prefix};

/// Runs `program args...` with `input` on stdin; an error carries its stderr.
fn run_stdin(program: &str, args: &[&str], input: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(input.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}
