//! What a host leaves on the machine outside its store, found from its data dir and host id
//! alone (so it works after the agent was killed), and how it is taken away:
//!
//! - processes: shims (`bazaar shim DATA/machines/<id>/runs/<n>`, and children of a killed
//!   agent not yet exec'd into one: [`processes_of_host`]) and, in the cgroup
//!   `bazaar/<host id>` of every hierarchy, their workloads and containers;
//! - mounts below the data dir (overlay roots of image machines, ext4 volumes) and the loop
//!   devices whose backing file is below it;
//! - the machine network ([`crate::network`]): bridges `bz-<hash>` and `bz-<hash>-<k>`,
//!   namespaces `bz-<hash>-<n>` and their ready markers, host-side veths `b<hash><n>`,
//!   nftables table `bazaar_bz_<hash>`.
//!
//! [`release_host`] removes all of that and keeps the data (a dev cluster stopped with
//! Ctrl-C resumes from it); [`reset_host`] also empties the data dir (`bazaar host reset`,
//! a host taken out of service). At start an agent removes what an earlier run left that no
//! machine uses any more ([`unmount_stale_roots`], [`remove_unused_namespaces`]).

use crate::network::{bridge_name, unbind_namespace, Network, NETNS_DIR, READY_DIR};
use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Stdio};

/// What [`release_host`] found and removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Released {
    pub processes: usize,
    pub cgroups: bool,
    pub mounts: usize,
    pub loop_devices: usize,
    pub namespaces: usize,
    pub links: usize,
    pub nft_tables: usize,
}

impl std::fmt::Display for Released {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} process(es), {} mount(s), {} loop device(s), {} network namespace(s), {} link(s), {} nftables table(s){}",
            self.processes,
            self.mounts,
            self.loop_devices,
            self.namespaces,
            self.links,
            self.nft_tables,
            if self.cgroups { ", cgroups" } else { "" }
        )
    }
}

/// The id of the host whose data dir is `data_dir` (from its store), `None` when it has no
/// store. Fails while an agent runs on it (the store is open).
pub fn host_id_of(data_dir: &Path) -> Result<Option<String>, String> {
    let path = data_dir.join("agent.redb");
    if !path.exists() {
        return Ok(None);
    }
    let store = crate::store::Store::open(&path).map_err(|e| {
        format!(
            "opening {} (is an agent still running on it?): {e}",
            path.display()
        )
    })?;
    store.meta("host_id").map_err(|e| e.to_string())
}

/// Removes everything host `host_id` (data dir `data_dir`) made on this machine outside
/// its data: kills its shims and workloads, removes its cgroups, unmounts what is mounted
/// below the data dir, detaches loop devices backed by files there, and deletes its
/// bridge, namespaces, veths and nftables table. The agent must not be running. Idempotent.
pub fn release_host(data_dir: &Path, host_id: Option<&str>) -> Released {
    // Shims name their run dir as the agent was given it; mounts show the canonical path.
    let mut done = Released {
        processes: kill_shims_under(data_dir),
        ..Released::default()
    };
    let canonical = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    if canonical != data_dir {
        done.processes += kill_shims_under(&canonical);
    }
    let data_dir = canonical;
    if let Some(id) = host_id {
        let cgroup = format!("bazaar/{id}");
        done.cgroups = !cgroup_dirs(&cgroup).is_empty();
        // The shim's hierarchies first (this kills what is left in them), then whatever
        // runc made in the others (cpuset, devices, blkio, ... on cgroup v1).
        if let Err(err) = bazaar_shim::remove_cgroup(&cgroup) {
            tracing::warn!(%cgroup, error = %err, "removing the host's cgroups");
        }
        for dir in cgroup_dirs(&cgroup) {
            remove_cgroup_dir(&dir);
        }
        // The parent all hosts share, once no host is left in it (refused while another
        // host's cgroups are there: that host's release removes it).
        for dir in cgroup_dirs("bazaar") {
            let _ = std::fs::remove_dir(dir);
        }
    }
    if let Some(id) = host_id {
        done.mounts += release_runtime_dir(id);
    }
    done.mounts += unmount_below(&data_dir);
    done.loop_devices = detach_loops_below(&data_dir);
    let mut bridges: Vec<String> = host_id.map(bridge_name).into_iter().collect();
    let record = std::fs::read_to_string(data_dir.join("network")).unwrap_or_default();
    if let Some(b) = record.lines().nth(1).filter(|b| b.starts_with("bz-")) {
        bridges.push(b.trim().to_string());
    }
    bridges.sort();
    bridges.dedup();
    for bridge in &bridges {
        remove_network(bridge, &mut done);
    }
    if done.namespaces + done.links > 0 {
        // An `ip` the killed agent had started may still be finishing a batch (it outlives
        // its parent): once it has, remove what it made too.
        std::thread::sleep(std::time::Duration::from_millis(200));
        for bridge in &bridges {
            remove_network(bridge, &mut done);
        }
    }
    done
}

/// [`release_host`], then removes the contents of the data dir (the store, machines,
/// volumes, images, secrets). Refuses a directory without a host's store (it deletes what
/// is inside), while an agent runs on it, or when something below it could not be
/// unmounted.
pub fn reset_host(data_dir: &Path) -> Result<Released, String> {
    if !data_dir.join("agent.redb").is_file() {
        return Err(format!(
            "{} is not a host's data dir (it has no agent.redb); nothing was done",
            data_dir.display()
        ));
    }
    let host_id = host_id_of(data_dir)?;
    let done = release_host(data_dir, host_id.as_deref());
    let dir = std::fs::canonicalize(data_dir).map_err(|e| e.to_string())?;
    if let Some(target) = mounts_below(&dir).first() {
        return Err(format!(
            "{target} is still mounted; nothing was deleted from {}",
            dir.display()
        ));
    }
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
    for entry in entries.flatten() {
        let path = entry.path();
        let removed = if entry.file_type().is_ok_and(|t| t.is_dir()) {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        removed.map_err(|e| format!("removing {}: {e}", path.display()))?;
    }
    Ok(done)
}

/// Unmounts the overlay root (`machines/<id>/layer/rootfs`), the layer disk under it
/// (`machines/<id>/layer`) and the work disk (`machines/<id>/work`) of every machine under
/// `data_dir` that is not in `running`: an earlier run of the agent left them (a root is
/// rebuilt and a disk mounted, or made, again at every start anyway). Returns how many
/// were unmounted.
pub fn unmount_stale_roots(data_dir: &Path, running: &HashSet<String>) -> usize {
    let Ok(machines) = std::fs::canonicalize(data_dir.join("machines")) else {
        return 0;
    };
    let prefix = format!("{}/", machines.display());
    // One read of the mount table, whatever the number of machines.
    let stale: Vec<String> = mounts_below(&machines)
        .into_iter()
        .filter(|target| {
            let id = target[prefix.len()..].split('/').next().unwrap_or("");
            !running.contains(id)
        })
        .collect();
    let n = stale.iter().filter(|target| unmount(target)).count();
    if n > 0 {
        tracing::info!(count = n, "unmounted root filesystems an earlier run left");
    }
    n
}

/// Deletes the namespaces of `network` whose address is not in `keep` (their machine is
/// gone; the agent sets up fresh ones ahead as it needs them). Returns how many.
pub fn remove_unused_namespaces(network: &Network, keep: &HashSet<Ipv4Addr>) -> usize {
    let base = u32::from(network.subnet.base);
    let keep: HashSet<u32> = keep.iter().map(|ip| u32::from(*ip) - base).collect();
    let prefix = format!("{}-", network.bridge);
    let mut n = 0;
    for name in namespaces_with_prefix(&prefix) {
        let index = name[prefix.len()..].parse::<u32>().ok();
        if index.is_some_and(|i| keep.contains(&i)) {
            continue;
        }
        let _ = std::fs::remove_file(Path::new(READY_DIR).join(&name));
        n += unbind_namespace(&Path::new(NETNS_DIR).join(&name)) as usize;
    }
    n
}

/// Kills every `bazaar shim` whose run dir is below `dir`, and every shim the agent of
/// `dir` was starting when it died: the agent spawns a shim with `posix_spawn`, whose child
/// shows the agent's own command line until it has exec'd `bazaar shim`, which may come
/// after a first look at `/proc`. Looks again until a pass finds none. Returns how many.
fn kill_shims_under(dir: &Path) -> usize {
    let mut killed = HashSet::new();
    for _ in 0..20 {
        let mut new = 0;
        for pid in processes_of_host(dir) {
            // SAFETY: kill(2) takes plain integers and touches no memory of ours.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
            new += killed.insert(pid) as usize;
        }
        if new == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    killed.len()
}

/// The processes a host of data dir `dir` leaves once its agent is gone: its shims (and the
/// inits they forked), and children of the agent not yet exec'd into shims (an agent of
/// `dir` that still runs, too).
pub fn processes_of_host(dir: &Path) -> Vec<i32> {
    let needle = format!("{}/", dir.display());
    let data_dir = dir.display().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id() as i32;
    let mut pids = Vec::new();
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_shim = args.get(1) == Some(&&b"shim"[..])
            && args
                .get(2)
                .is_some_and(|a| a.starts_with(needle.as_bytes()));
        let is_agent = args.get(1) == Some(&&b"agent"[..])
            && args
                .windows(2)
                .any(|w| w[0] == b"--data-dir" && w[1] == data_dir.as_bytes());
        if (is_shim || is_agent) && pid != me {
            pids.push(pid);
        }
    }
    pids
}

/// The directories of cgroup `rel` in every cgroup hierarchy mounted here.
fn cgroup_dirs(rel: &str) -> Vec<std::path::PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    mountinfo
        .lines()
        .filter(|l| l.contains(" - cgroup"))
        .filter_map(|l| l.split(' ').nth(4))
        .map(|mount_point| Path::new(&unescape(mount_point)).join(rel))
        .filter(|dir| dir.is_dir())
        .collect()
}

/// Removes an (empty of processes) cgroup directory and the cgroups below it.
fn remove_cgroup_dir(dir: &Path) {
    let mut all = vec![dir.to_path_buf()];
    let mut next = 0;
    while next < all.len() {
        let children: Vec<_> = std::fs::read_dir(&all[next])
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect();
        all.extend(children);
        next += 1;
    }
    for d in all.iter().rev() {
        // Tasks killed a moment ago may take a few milliseconds to leave.
        for _ in 0..100 {
            match std::fs::remove_dir(d) {
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    std::thread::sleep(std::time::Duration::from_millis(10))
                }
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    tracing::warn!(cgroup = %d.display(), error = %e, "removing a cgroup");
                    break;
                }
                _ => break,
            }
        }
    }
}

/// Mount points below `dir` (not `dir` itself), deepest first.
fn mounts_below(dir: &Path) -> Vec<String> {
    let prefix = format!("{}/", dir.display());
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let mut targets: Vec<String> = mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(1))
        .map(unescape)
        .filter(|t| t.starts_with(&prefix))
        .collect();
    targets.sort_by_key(|t| std::cmp::Reverse(t.len()));
    targets.dedup();
    targets
}

/// Unmounts everything below `dir`, deepest first (lazily when a mount is busy). Returns
/// how many mounts were removed.
fn unmount_below(dir: &Path) -> usize {
    let mut n = 0;
    // Stacked mounts show once per layer: repeat until none is left.
    for _ in 0..8 {
        let targets = mounts_below(dir);
        if targets.is_empty() {
            break;
        }
        for t in targets {
            n += unmount(&t) as usize;
        }
    }
    n
}

/// Unmounts `target`; while it is busy (workloads killed a moment ago still exiting) for up
/// to a second, then lazily.
fn unmount(target: &str) -> bool {
    use rustix::mount::UnmountFlags;
    for _ in 0..10 {
        match rustix::mount::unmount(target, UnmountFlags::empty()) {
            Ok(()) => return true,
            Err(rustix::io::Errno::BUSY) => {
                std::thread::sleep(std::time::Duration::from_millis(100))
            }
            Err(_) => break,
        }
    }
    rustix::mount::unmount(target, UnmountFlags::DETACH).is_ok()
}

/// Detaches loop devices whose backing file is below `dir`, waiting (up to 5 s) for those
/// still busy, as after a lazy unmount. Returns how many went.
fn detach_loops_below(dir: &Path) -> usize {
    let prefix = format!("{}/", dir.display());
    let attached = || -> Vec<String> {
        std::fs::read_dir("/sys/block")
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with("loop"))
            .filter(|name| {
                let backing =
                    std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
                        .unwrap_or_default();
                backing
                    .trim()
                    .trim_end_matches(" (deleted)")
                    .starts_with(&prefix)
            })
            .collect()
    };
    let found = attached();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut left = found.clone();
    while !left.is_empty() && std::time::Instant::now() < deadline {
        for name in &left {
            run("losetup", &["-d", &format!("/dev/{name}")]);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        left = attached();
    }
    for name in &left {
        tracing::warn!(device = %name, "a loop device of the host is still busy");
    }
    found.len() - left.len()
}

/// Deletes the namespaces, veths, bridges and nftables tables named after `bridge`.
fn remove_network(bridge: &str, done: &mut Released) {
    for name in namespaces_with_prefix(&format!("{bridge}-")) {
        let _ = std::fs::remove_file(Path::new(READY_DIR).join(&name));
        done.namespaces += unbind_namespace(&Path::new(NETNS_DIR).join(&name)) as usize;
    }
    // Host-side veths (`b<hash><n>`) go with their namespace; any left, and the bridges
    // (`bz-<hash>` and `bz-<hash>-<k>`: their routes go with them).
    let veth_prefix = format!("b{}", &bridge[3..]);
    let other_bridges = format!("{bridge}-");
    let links: Vec<String> = std::fs::read_dir("/sys/class/net")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|l| l == bridge || l.starts_with(&other_bridges) || l.starts_with(&veth_prefix))
        .collect();
    for link in links {
        done.links += bazaar_runtime::netlink::delete_link(&link).is_ok() as usize;
    }
    // The user namespaces that own the machines' network namespaces (bind-mounted to keep
    // them alive).
    for e in std::fs::read_dir(USERNS_DIR)
        .into_iter()
        .flatten()
        .flatten()
    {
        if e.file_name()
            .to_string_lossy()
            .starts_with(&format!("{bridge}-"))
        {
            unbind_namespace(&e.path());
        }
    }
    let table = format!("bazaar_{}", bridge.replace('-', "_"));
    for family in ["ip", "bridge"] {
        if run("nft", &["list", "table", family, &table]) {
            done.nft_tables += run("nft", &["delete", "table", family, &table]) as usize;
        }
    }
}

/// Where the user namespaces owning machines' network namespaces are kept.
const USERNS_DIR: &str = "/run/bazaar/userns";

/// Unmounts and removes host `host_id`'s runtime dir (`/run/bazaar/<host id>`, where its
/// image machines' root filesystems are mounted for runc) and gives back the user
/// namespace id ranges and the uids its machines claimed. Returns how many mounts it removed.
fn release_runtime_dir(host_id: &str) -> usize {
    let dir = Path::new("/run/bazaar").join(host_id);
    let removed = unmount_below(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    let holder = format!("{host_id}/");
    for claim in std::fs::read_dir("/run/bazaar/idranges")
        .into_iter()
        .flatten()
        .flatten()
    {
        if std::fs::read_to_string(claim.path()).is_ok_and(|h| h.starts_with(&holder)) {
            let _ = std::fs::remove_file(claim.path());
        }
    }
    crate::uid_claims::release_all(host_id);
    removed
}

fn namespaces_with_prefix(prefix: &str) -> Vec<String> {
    std::fs::read_dir(NETNS_DIR)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(prefix))
        .collect()
}

/// Runs a tool quietly; true when it succeeded.
fn run(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Undoes the octal escapes of `/proc/mounts` (`\040` for a space, ...).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = |k: usize| b.get(i + k).filter(|c| (b'0'..=b'7').contains(c));
        if let (b'\\', Some(x), Some(y), Some(z)) = (b[i], octal(1), octal(2), octal(3)) {
            let value =
                (u32::from(*x - b'0') << 6) | (u32::from(*y - b'0') << 3) | u32::from(*z - b'0');
            out.push(value as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host's later bridges (`bz-<hash>-<k>`, one per /23 of its subnet in use) go with
    /// its first when the host is released (`bazaar host reset` after a killed agent);
    /// another host's stay.
    #[test]
    fn a_release_removes_every_bridge_of_the_host_and_no_other() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: needs root (links of the host)");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let host = format!("h_release_bridges_{}", std::process::id());
        let first = bridge_name(&host);
        let mine = [first.clone(), format!("{first}-1"), format!("{first}-15")];
        let other = format!("{}-1", bridge_name(&format!("{host}_other")));
        let exists = |name: &str| Path::new("/sys/class/net").join(name).exists();
        for name in mine.iter().chain([&other]) {
            assert!(
                run("ip", &["link", "add", name, "type", "bridge"]),
                "{name}"
            );
        }
        let done = release_host(dir.path(), Some(&host));
        let left: Vec<&String> = mine.iter().filter(|name| exists(name)).collect();
        let other_kept = exists(&other);
        run("ip", &["link", "delete", &other]);
        assert!(left.is_empty(), "bridges of the host left: {left:?}");
        assert_eq!(done.links, 3);
        assert!(other_kept, "another host's bridge was removed");
    }

    #[test]
    fn mount_paths_are_unescaped() {
        assert_eq!(unescape("/tmp/a\\040b/c"), "/tmp/a b/c");
        assert_eq!(unescape("/plain"), "/plain");
    }
}
