//! The lab's network on the machine, done with iproute2 (batch mode) and nftables: the
//! subnets already in use, the bridge with its address, one namespace per host with its
//! veth and address, each host's firewall, and removing all of it again (by name prefix,
//! so a lab whose processes died is removed as completely as a live one).

use crate::plan::{HostPlan, LabPlan, Subnet, HOST_IFACE};
use anyhow::Context;
use std::path::Path;
use std::process::{Command, Stdio};

/// Where `ip netns` keeps named namespaces.
pub const NETNS_DIR: &str = "/run/netns";

/// Runs `program args`, feeding `input`; an error carries its stderr.
pub(crate) fn run(program: &str, args: &[&str], input: &str) -> anyhow::Result<String> {
    let mut cmd = Command::new(program);
    cmd.args(args);
    feed_and_wait(cmd, program, args, input, "")
}

/// Starts `cmd` (which runs `program args`), writes `input` to its stdin and waits for it;
/// its stdout, or an error naming the command (`context` added after it) with its stderr.
pub(crate) fn feed_and_wait(
    mut cmd: Command,
    program: &str,
    args: &[&str],
    input: &str,
    context: &str,
) -> anyhow::Result<String> {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {program} (is it installed?)"))?;
    child
        .stdin
        .take()
        .context("stdin")?
        .write_all(input.as_bytes())?;
    let out = child.wait_with_output()?;
    anyhow::ensure!(
        out.status.success(),
        "{program} {}{context}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Every IPv4 subnet this machine routes or has an address in (all routing tables).
pub fn subnets_in_use() -> anyhow::Result<Vec<Subnet>> {
    let routes = run("ip", &["-4", "-o", "route", "show", "table", "all"], "")?;
    let addrs = run("ip", &["-4", "-o", "addr", "show"], "")?;
    let mut used = Vec::new();
    for line in routes.lines() {
        let mut words = line.split_whitespace();
        let mut first = words.next().unwrap_or("");
        // `local 10.0.0.1 ...`, `broadcast ...`, `unreachable ...`: the type comes first.
        if [
            "local",
            "broadcast",
            "unicast",
            "unreachable",
            "blackhole",
            "prohibit",
        ]
        .contains(&first)
        {
            first = words.next().unwrap_or("");
        }
        if first == "default" {
            continue;
        }
        let cidr = if first.contains('/') {
            first.to_string()
        } else {
            format!("{first}/32")
        };
        if let Ok(s) = cidr.parse::<Subnet>() {
            used.push(s);
        }
    }
    for line in addrs.lines() {
        let mut words = line.split_whitespace();
        if let Some(cidr) = words.find(|w| *w == "inet").and_then(|_| words.next()) {
            if let Ok(s) = cidr.parse::<Subnet>() {
                used.push(s);
            }
        }
    }
    Ok(used)
}

/// True if a network interface of this name exists in the root namespace.
pub fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// Creates the bridge (with the lab's first address), and every host's namespace, veth,
/// address, loopback and permanent neighbor entries. No route leaves the subnet: hosts reach one another and the
/// bridge's address, nothing else.
pub fn create(plan: &LabPlan) -> anyhow::Result<()> {
    let bridge = plan.bridge();
    let prefix = plan.subnet.prefix;
    let mut root = format!(
        "link add {bridge} address {} type bridge\naddr add {}/{prefix} dev {bridge}\n\
         link set {bridge} up\n",
        plan.bridge_mac(),
        plan.bridge_addr()
    );
    for h in &plan.hosts {
        root.push_str(&format!(
            "netns add {ns}\nlink add {veth} type veth peer name {HOST_IFACE} address {mac} netns {ns}\n\
             link set {veth} master {bridge} up\n",
            ns = h.netns,
            veth = h.veth,
            mac = h.mac
        ));
    }
    root.push_str(&plan.neighbors(None));
    run("ip", &["-batch", "-"], &root).context("creating the lab's bridge and namespaces")?;
    for h in &plan.hosts {
        configure_host(plan, h)?;
    }
    Ok(())
}

fn configure_host(plan: &LabPlan, h: &HostPlan) -> anyhow::Result<()> {
    let inside = format!(
        "link set lo up\naddr add {}/{} dev {HOST_IFACE}\nlink set {HOST_IFACE} up\n{}",
        h.addr,
        plan.subnet.prefix,
        plan.neighbors(Some(h))
    );
    run("ip", &["-n", &h.netns, "-batch", "-"], &inside)
        .with_context(|| format!("configuring {}", h.netns))?;
    Ok(())
}

/// Loads an nftables script into the host's namespace.
pub fn apply_firewall(host: &HostPlan, script: &str) -> anyhow::Result<()> {
    let ns = Path::new(NETNS_DIR).join(&host.netns);
    crate::procs::run_in_namespace(&ns, libc::CLONE_NEWNET, "nft", &["-f", "-"], script)
        .with_context(|| format!("setting the firewall of {}", host.name))
}

/// The lab's namespaces that exist now (by prefix, whatever the state file says).
pub fn namespaces(plan: &LabPlan) -> Vec<String> {
    let prefix = plan.netns_prefix();
    let mut names: Vec<String> = std::fs::read_dir(NETNS_DIR)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&prefix))
        .collect();
    names.sort();
    names
}

/// The lab's links in the root namespace (bridge and veths) that exist now.
pub fn links(plan: &LabPlan) -> Vec<String> {
    let bridge = plan.bridge();
    let veth = plan.veth_prefix();
    let mut names: Vec<String> = std::fs::read_dir("/sys/class/net")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| *n == bridge || n.starts_with(&veth))
        .collect();
    names.sort();
    names
}

/// Removes the lab's namespaces (their veths and firewalls go with them), leftover veths
/// and the bridge. Processes still inside a namespace keep it alive: kill them first.
pub fn remove(plan: &LabPlan) -> anyhow::Result<()> {
    let mut batch = String::new();
    for ns in namespaces(plan) {
        batch.push_str(&format!("netns delete {ns}\n"));
    }
    for link in links(plan) {
        batch.push_str(&format!("link delete {link}\n"));
    }
    if batch.is_empty() {
        return Ok(());
    }
    // `-force`: go on past a link already gone with its namespace.
    let _ = run("ip", &["-force", "-batch", "-"], &batch);
    let left: Vec<String> = namespaces(plan).into_iter().chain(links(plan)).collect();
    anyhow::ensure!(left.is_empty(), "could not remove {left:?}");
    Ok(())
}

/// Removes what a host's agent made for its image machines outside its own namespace:
/// named namespaces `<bridge>-<n>` and their ready markers (`DATA/network` names the
/// bridge, as the agent's `network.rs` writes it).
pub fn remove_machine_namespaces(data_dir: &Path) {
    let network = std::fs::read_to_string(data_dir.join("network")).unwrap_or_default();
    let Some(bridge) = network.lines().nth(1).filter(|b| b.starts_with("bz-")) else {
        return;
    };
    let prefix = format!("{bridge}-");
    for e in std::fs::read_dir(NETNS_DIR).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(&prefix) {
            let _ = run("ip", &["netns", "delete", &name], "");
            let _ = std::fs::remove_file(Path::new("/run/bazaar/netns-ready").join(&name));
        }
    }
}
