//! Cgroups of runs: discovery of the hierarchies from `/proc/self/mountinfo`, creation with
//! memory and cpu limits, joining, the `oom_kill` counter, freezing, killing and removal.
//!
//! Both layouts are supported. On the unified layout (cgroup v2: a `cgroup2` mount that has
//! the memory controller, usually `/sys/fs/cgroup`) a run has one directory. On v1 (including
//! "hybrid" hosts, whose `cgroup2` mount has no controllers) a run has one directory in each of
//! the memory, cpu, cpuacct, pids and freezer hierarchies that are mounted. Run cgroup paths
//! are relative to the root of each hierarchy, e.g. `bazaar/host-abc/m-123`.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::{sys, ShimError};
use serde::{Deserialize, Serialize};
use std::sync::OnceLock;

/// v1 controllers a run gets a directory in (when they are mounted).
const V1_CONTROLLERS: &[&str] = &["memory", "cpu", "cpuacct", "pids", "freezer"];
/// v2 controllers enabled for runs in their ancestors' `cgroup.subtree_control`.
const V2_CONTROLLERS: &[&str] = &["memory", "cpu", "pids"];
/// CFS period for the cpu quota: the kernel's default of 100 ms.
const CPU_PERIOD_US: u64 = 100_000;
/// Smallest quota the kernel accepts (1 ms).
const CPU_MIN_QUOTA_US: u64 = 1_000;
/// How long freezing may take. Tasks freeze at their next safe point (microseconds) unless
/// stuck in uninterruptible sleep, where waiting longer would not help.
const FREEZE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long removal waits for killed tasks to leave the cgroup. Exiting a large process
/// (freeing its memory) takes milliseconds; this bounds stuck cases.
const REMOVE_TIMEOUT: Duration = Duration::from_secs(3);
/// Poll interval while waiting for the kernel to settle a cgroup.
const SETTLE_POLL: Duration = Duration::from_millis(1);

/// Returns true when runs can get cgroups: the process is root and the memory and cpu
/// controllers are available (v1 or v2).
pub fn cgroups_available() -> bool {
    sys::effective_ids().0 == 0
        && Layout::current().is_some_and(|l| l.has_controller("memory") && l.has_controller("cpu"))
}

/// Kills whatever is left in the run cgroup `cgroup` (relative path) and removes its directory
/// in every hierarchy: those the shim uses, and the others (a named `systemd` hierarchy, a
/// hybrid host's `unified` one) where a runtime such as runc made child cgroups too.
/// Idempotent: a missing cgroup is not an error. Parent directories are left alone (they are
/// shared with other runs).
///
/// # Errors
///
/// [`ShimError::Spec`] for an invalid path; [`ShimError::Io`] if the cgroup cannot be emptied
/// or removed within a few seconds.
pub fn remove_cgroup(cgroup: &str) -> Result<(), ShimError> {
    validate_relative(cgroup).map_err(ShimError::Spec)?;
    let Some(layout) = Layout::current() else {
        return Ok(());
    };
    let cg = Cgroup::new(&layout, cgroup);
    cg.remove()
        .map_err(ShimError::io(format!("removing cgroup {cgroup}")))?;
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for root in cgroup_mounts(&mountinfo) {
        let dir = root.join(cgroup);
        let mut below = descendants(&dir);
        below.reverse();
        for d in below.iter().chain(std::iter::once(&dir)) {
            match fs::remove_dir(d) {
                Ok(()) => {}
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => return Err(ShimError::Io(format!("removing {}", d.display()), err)),
            }
        }
    }
    Ok(())
}

/// The mount points of every cgroup (v1) and cgroup2 file system in `mountinfo`.
fn cgroup_mounts(mountinfo: &str) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let fstype = after.split(' ').next()?;
            let mount_point = before.split(' ').nth(4)?;
            matches!(fstype, "cgroup" | "cgroup2").then(|| PathBuf::from(unescape(mount_point)))
        })
        .collect()
}

/// Checks that `rel` is a relative path of plain components (no `..`, no empty parts).
pub(crate) fn validate_relative(rel: &str) -> Result<(), String> {
    let ok = !rel.is_empty()
        && !rel.contains('\0')
        && rel
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..");
    if ok {
        Ok(())
    } else {
        Err(format!(
            "cgroup path {rel:?} must be relative, with plain components"
        ))
    }
}

/// The cgroup hierarchies as this process first found them: read from mountinfo once, or
/// taken from the spec the agent wrote ([`CgroupLayout`]). Mountinfo lists every mount of
/// the host, two per machine address (its namespaces' binds): reading it costs ~1.6 ms at
/// 600 mounts, once per start if each shim read it.
static LAYOUT: OnceLock<Option<Layout>> = OnceLock::new();

/// The cgroup hierarchies this process found, for the agent to hand to the shims it starts
/// (`ShimSpec::cgroup_layout`); `None` if none is mounted.
pub fn cgroup_layout() -> Option<CgroupLayout> {
    Layout::current().map(CgroupLayout)
}

/// The cgroup hierarchies of the host (opaque), as the agent found them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CgroupLayout(Layout);

/// A shim takes the layout its agent found, before its first cgroup operation.
pub(crate) fn adopt(layout: Option<&CgroupLayout>) {
    if let Some(l) = layout {
        let _ = LAYOUT.set(Some(l.0.clone()));
    }
}

/// The cgroup hierarchies mounted on this host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum Layout {
    /// The unified hierarchy mounted at `root`, whose root has `controllers`.
    V2 {
        root: PathBuf,
        controllers: Vec<String>,
    },
    /// One mount per group of v1 controllers (only the controllers we use).
    V1 { mounts: Vec<V1Mount> },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct V1Mount {
    controllers: Vec<String>,
    path: PathBuf,
}

impl Layout {
    /// The layout of this process ([`LAYOUT`]): detected on first use.
    pub(crate) fn current() -> Option<Layout> {
        LAYOUT.get_or_init(Layout::detect).clone()
    }

    /// Reads the mounts of this process; `None` if no usable hierarchy is mounted.
    pub(crate) fn detect() -> Option<Layout> {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok()?;
        Layout::from_mountinfo(&mountinfo, |root| {
            fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default()
        })
    }

    /// Parses `mountinfo`; `v2_controllers` reads `cgroup.controllers` of a cgroup2 mount.
    fn from_mountinfo(mountinfo: &str, v2_controllers: impl Fn(&Path) -> String) -> Option<Layout> {
        let mut v1: Vec<V1Mount> = Vec::new();
        let mut v2 = None;
        for line in mountinfo.lines() {
            // "id parent maj:min root mountpoint opts [optional...] - fstype source superopts"
            let Some((pre, post)) = line.split_once(" - ") else {
                continue;
            };
            let Some(mountpoint) = pre.split(' ').nth(4) else {
                continue;
            };
            let mut post = post.split(' ');
            let (fstype, options) = (post.next(), post.nth(1).unwrap_or(""));
            match fstype {
                Some("cgroup2") if v2.is_none() => v2 = Some(PathBuf::from(unescape(mountpoint))),
                Some("cgroup") => {
                    let controllers: Vec<String> = options
                        .split(',')
                        .filter(|o| V1_CONTROLLERS.contains(o))
                        .map(String::from)
                        .collect();
                    let seen = controllers
                        .iter()
                        .any(|c| v1.iter().any(|m| m.controllers.contains(c)));
                    if !controllers.is_empty() && !seen {
                        v1.push(V1Mount {
                            controllers,
                            path: PathBuf::from(unescape(mountpoint)),
                        });
                    }
                }
                _ => {}
            }
        }
        // The unified layout is the cgroup2 mount when it has the memory controller (or when
        // there is nothing else); on hybrid hosts it has none and the v1 mounts are used.
        if let Some(root) = v2 {
            let controllers: Vec<String> = v2_controllers(&root)
                .split_whitespace()
                .map(String::from)
                .collect();
            if controllers.iter().any(|c| c == "memory") || v1.is_empty() {
                return Some(Layout::V2 { root, controllers });
            }
        }
        (!v1.is_empty()).then_some(Layout::V1 { mounts: v1 })
    }

    fn has_controller(&self, name: &str) -> bool {
        match self {
            Layout::V2 { controllers, .. } => controllers.iter().any(|c| c == name),
            Layout::V1 { mounts } => mounts
                .iter()
                .any(|m| m.controllers.iter().any(|c| c == name)),
        }
    }
}

/// Undoes the octal escapes (`\040` for a space...) of mountinfo paths.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The cgroup of one run, in every hierarchy it lives in.
#[derive(Debug, Clone)]
pub(crate) struct Cgroup {
    /// The run's directory in each hierarchy, with that hierarchy's controllers.
    dirs: Vec<(PathBuf, Vec<String>)>,
    /// The hierarchy root on the unified layout (`None` on v1).
    v2_root: Option<PathBuf>,
}

impl Cgroup {
    /// Locates the run cgroup `rel` (already validated) in `layout`. Touches nothing.
    pub(crate) fn new(layout: &Layout, rel: &str) -> Cgroup {
        match layout {
            Layout::V2 { root, controllers } => Cgroup {
                dirs: vec![(root.join(rel), controllers.clone())],
                v2_root: Some(root.clone()),
            },
            Layout::V1 { mounts } => Cgroup {
                dirs: mounts
                    .iter()
                    .map(|m| (m.path.join(rel), m.controllers.clone()))
                    .collect(),
                v2_root: None,
            },
        }
    }

    /// Finds the hierarchies and locates `rel` in them.
    pub(crate) fn open(rel: &str) -> Result<Cgroup, String> {
        validate_relative(rel)?;
        let layout = Layout::current().ok_or("no cgroup hierarchy is mounted")?;
        Ok(Cgroup::new(&layout, rel))
    }

    /// The run's directory in the hierarchy that has `controller`.
    fn dir_with(&self, controller: &str) -> Option<&Path> {
        match &self.v2_root {
            Some(_) => self.dirs.first().map(|(p, _)| p.as_path()),
            None => self
                .dirs
                .iter()
                .find(|(_, c)| c.iter().any(|c| c == controller))
                .map(|(p, _)| p.as_path()),
        }
    }

    /// The run's directory in the memory hierarchy, and whether it is the unified (v2)
    /// layout.
    pub(crate) fn memory_dir(&self) -> Option<(&Path, bool)> {
        Some((self.dir_with("memory")?, self.v2_root.is_some()))
    }

    /// The directory with the run's CPU limit (v1: the cpu hierarchy's), and whether it is
    /// v2.
    pub(crate) fn cpu_limit_dir(&self) -> Option<(&Path, bool)> {
        Some((self.dir_with("cpu")?, self.v2_root.is_some()))
    }

    /// The directory with the run's CPU time (v2: `cpu.stat`, in every cgroup; v1: the
    /// cpuacct hierarchy's), and whether it is v2.
    pub(crate) fn cpu_time_dir(&self) -> Option<(&Path, bool)> {
        match &self.v2_root {
            Some(_) => Some((&self.dirs[0].0, true)),
            None => Some((self.dir_with("cpuacct")?, false)),
        }
    }

    fn exists(&self) -> bool {
        self.dirs.iter().any(|(p, _)| p.exists())
    }

    /// Creates the cgroup afresh: a leftover from an earlier run (whose shim was killed) is
    /// emptied and removed first, so limits and the `oom_kill` counter start clean.
    pub(crate) fn recreate(&self) -> io::Result<()> {
        if self.exists() {
            self.remove()?;
        }
        match &self.v2_root {
            None => self
                .dirs
                .iter()
                .try_for_each(|(p, _)| fs::create_dir_all(p).map_err(context(p))),
            Some(root) => self.create_v2(root),
        }
    }

    /// Creates the v2 directory, enabling our controllers in every ancestor on the way (a
    /// controller is only available in a cgroup if its parent delegates it). The shared
    /// parent `bazaar` is removed when its last host is released (`cleanup::release_host`
    /// in the agent): if that happens mid-way, the walk starts again.
    fn create_v2(&self, root: &Path) -> io::Result<()> {
        let mut tries = 0;
        loop {
            match self.create_v2_once(root) {
                Err(err) if err.kind() == io::ErrorKind::NotFound && tries < 3 => tries += 1,
                done => return done,
            }
        }
    }

    fn create_v2_once(&self, root: &Path) -> io::Result<()> {
        let leaf = &self.dirs[0].0;
        let rel = leaf.strip_prefix(root).unwrap_or(leaf);
        let mut dir = root.to_path_buf();
        for component in rel.components() {
            let available = fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
            let enabled =
                fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
            for controller in V2_CONTROLLERS {
                let has = |list: &str| list.split_whitespace().any(|c| c == *controller);
                if has(&available) && !has(&enabled) {
                    // Fails if `dir` has processes of its own (the "no internal processes"
                    // rule); configure() then reports the missing controller file.
                    let _ = fs::write(dir.join("cgroup.subtree_control"), format!("+{controller}"));
                }
            }
            dir.push(component);
            match fs::create_dir(&dir) {
                Ok(()) => {}
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
                Err(err) => return Err(context(&dir)(err)),
            }
        }
        Ok(())
    }

    /// Sets the memory limit (MiB, 0 = none; swap disabled where possible) and the cpu quota
    /// (in cpus, 0 = none).
    pub(crate) fn configure(&self, memory_mb: u64, cpus: f64) -> io::Result<()> {
        let bytes = memory_mb.saturating_mul(1024 * 1024);
        let quota = ((cpus * CPU_PERIOD_US as f64) as u64).max(CPU_MIN_QUOTA_US);
        match self.v2_root {
            Some(_) => {
                let dir = &self.dirs[0].0;
                if memory_mb > 0 {
                    write(&dir.join("memory.max"), &bytes.to_string())?;
                    // Missing when swap accounting is off: then there is no swap to disable.
                    let _ = write(&dir.join("memory.swap.max"), "0");
                }
                if cpus > 0.0 {
                    write(&dir.join("cpu.max"), &format!("{quota} {CPU_PERIOD_US}"))?;
                }
            }
            None => {
                if memory_mb > 0 {
                    let dir = self.dir_with("memory").ok_or_else(|| missing("memory"))?;
                    write(&dir.join("memory.limit_in_bytes"), &bytes.to_string())?;
                    // memsw (memory + swap) exists when swap accounting is on; otherwise make
                    // the cgroup avoid swap.
                    if write(&dir.join("memory.memsw.limit_in_bytes"), &bytes.to_string()).is_err()
                    {
                        let _ = write(&dir.join("memory.swappiness"), "0");
                    }
                }
                if cpus > 0.0 {
                    let dir = self.dir_with("cpu").ok_or_else(|| missing("cpu"))?;
                    write(&dir.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
                    write(&dir.join("cpu.cfs_quota_us"), &quota.to_string())?;
                }
            }
        }
        Ok(())
    }

    /// The number of OOM kills in this cgroup so far, child cgroups included (`None`
    /// without a memory controller). On v1 the kernel counts a kill only in the victim's
    /// own cgroup (an OCI runtime puts the container in a child), so the tree is summed;
    /// v2 counts it in every ancestor already.
    pub(crate) fn oom_kills(&self) -> Option<u64> {
        let read = |dir: &Path, file: &str| -> Option<u64> {
            let text = fs::read_to_string(dir.join(file)).ok()?;
            text.lines()
                .find_map(|l| l.strip_prefix("oom_kill "))
                .and_then(|n| n.trim().parse().ok())
        };
        let dir = self.dir_with("memory")?;
        match self.v2_root {
            Some(_) => read(dir, "memory.events"),
            None => {
                let own = read(dir, "memory.oom_control")?;
                let below: u64 = descendants(dir)
                    .iter()
                    .filter_map(|d| read(d, "memory.oom_control"))
                    .sum();
                Some(own + below)
            }
        }
    }

    /// Moves the calling process into the cgroup in every hierarchy. The caller must be
    /// single-threaded (the shim's freshly forked child).
    ///
    /// On v1 this writes to `tasks`, which moves only the calling thread, i.e. the whole
    /// process. Writing to `cgroup.procs` would write-lock the kernel's global
    /// `cgroup_threadgroup_rwsem`, which first waits for an RCU grace period (10-20 ms) unless
    /// another migration ran in the last few milliseconds, all the while holding
    /// `cgroup_mutex` and then holding up every fork and exit on the host. A thread moving
    /// itself takes neither lock. v2 allows no per-thread move between ordinary cgroups, so
    /// there it is `cgroup.procs`.
    pub(crate) fn join(&self) -> io::Result<()> {
        let file = match self.v2_root {
            Some(_) => "cgroup.procs",
            None => "tasks",
        };
        // "0" means the writing thread (process), whatever pid namespace it is in.
        self.dirs
            .iter()
            .try_for_each(|(p, _)| write(&p.join(file), "0"))
    }

    /// The processes in the cgroup and its child cgroups (the union over all hierarchies).
    fn procs(&self) -> Vec<i32> {
        let mut pids: Vec<i32> = Vec::new();
        for (dir, _) in &self.dirs {
            for d in std::iter::once(dir.clone()).chain(descendants(dir)) {
                let text = fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
                pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
        }
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Freezes every process of the cgroup and waits until the kernel reports it frozen.
    pub(crate) fn freeze(&self) -> io::Result<()> {
        match self.v2_root {
            Some(_) => {
                let dir = &self.dirs[0].0;
                write(&dir.join("cgroup.freeze"), "1")?;
                wait_for(&dir.join("cgroup.events"), |text| {
                    text.lines().any(|l| l == "frozen 1")
                })
            }
            None => {
                let dir = self.dir_with("freezer").ok_or_else(|| missing("freezer"))?;
                let state = dir.join("freezer.state");
                write(&state, "FROZEN")?;
                wait_for(&state, |text| text.trim() == "FROZEN")
            }
        }
    }

    /// Thaws the cgroup.
    pub(crate) fn thaw(&self) -> io::Result<()> {
        match self.v2_root {
            Some(_) => write(&self.dirs[0].0.join("cgroup.freeze"), "0"),
            None => {
                let dir = self.dir_with("freezer").ok_or_else(|| missing("freezer"))?;
                write(&dir.join("freezer.state"), "THAWED")
            }
        }
    }

    /// Sends SIGKILL to every process in the cgroup, at once where the kernel allows it
    /// (`cgroup.kill`), else while the cgroup is frozen so that nothing forks meanwhile.
    pub(crate) fn kill_all(&self) {
        if self.v2_root.is_some() && write(&self.dirs[0].0.join("cgroup.kill"), "1").is_ok() {
            return;
        }
        let pids = self.procs();
        if pids.is_empty() {
            return;
        }
        // Killed even when the freeze does not settle in time (a gVisor sandbox on the
        // ptrace platform can take seconds on a loaded host), and thawed in any case: a
        // freeze that settles later would hold the SIGKILLs pending for good. So is every
        // cgroup below that was frozen by itself (a suspended machine, or one whose shim
        // died while it froze it): thawing a v1 parent leaves those frozen.
        let _ = self.freeze();
        for pid in self.procs() {
            let _ = sys::kill(pid, libc::SIGKILL);
        }
        if let Some(dir) = self.dir_with("freezer") {
            for below in descendants(dir) {
                let _ = write(&below.join("freezer.state"), "THAWED");
            }
        }
        let _ = self.thaw();
    }

    /// Kills what is left in the cgroup and removes its directories (child cgroups first).
    /// Idempotent.
    pub(crate) fn remove(&self) -> io::Result<()> {
        let deadline = Instant::now() + REMOVE_TIMEOUT;
        loop {
            self.kill_all();
            let mut busy = None;
            for (dir, _) in &self.dirs {
                let mut below = descendants(dir);
                below.reverse();
                for d in below.iter().chain(std::iter::once(dir)) {
                    match fs::remove_dir(d) {
                        Ok(()) => {}
                        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                        Err(err) => busy = Some(context(d)(err)),
                    }
                }
            }
            match busy {
                None => return Ok(()),
                Some(err) if Instant::now() >= deadline => return Err(err),
                Some(_) => std::thread::sleep(SETTLE_POLL),
            }
        }
    }
}

/// The child cgroups below `dir`, parents before their children.
fn descendants(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut next = 0;
    let push_children = |d: &Path, out: &mut Vec<PathBuf>| {
        if let Ok(entries) = fs::read_dir(d) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    out.push(e.path());
                }
            }
        }
    };
    push_children(dir, &mut out);
    while next < out.len() {
        let d = out[next].clone();
        push_children(&d, &mut out);
        next += 1;
    }
    out
}

/// Writes `value` to the cgroup file `path`; errors name the file.
fn write(path: &Path, value: &str) -> io::Result<()> {
    fs::write(path, value).map_err(context(path))
}

/// Polls `path` until `done` accepts its content, for at most [`FREEZE_TIMEOUT`].
fn wait_for(path: &Path, done: impl Fn(&str) -> bool) -> io::Result<()> {
    let deadline = Instant::now() + FREEZE_TIMEOUT;
    loop {
        if done(&fs::read_to_string(path).map_err(context(path))?) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let msg = format!(
                "{} did not settle within {FREEZE_TIMEOUT:?}",
                path.display()
            );
            return Err(io::Error::new(io::ErrorKind::TimedOut, msg));
        }
        std::thread::sleep(SETTLE_POLL);
    }
}

fn context(path: &Path) -> impl FnOnce(io::Error) -> io::Error + '_ {
    move |err| io::Error::new(err.kind(), format!("{}: {err}", path.display()))
}

fn missing(controller: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("the {controller} cgroup controller is not mounted"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/free\\040zer rw,relatime - cgroup cgroup rw,freezer
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn every_cgroup_hierarchy_is_found_for_removal() {
        let mounts = cgroup_mounts(HYBRID);
        assert_eq!(mounts.len(), 7, "{mounts:?}");
        assert!(mounts.contains(&PathBuf::from("/sys/fs/cgroup/systemd")));
        assert!(mounts.contains(&PathBuf::from("/sys/fs/cgroup/unified")));
        assert!(mounts.contains(&PathBuf::from("/sys/fs/cgroup/free zer")));
    }

    #[test]
    fn the_layout_the_agent_found_reaches_the_shim_unchanged() {
        // The agent writes it into the spec; the shim reads it back instead of mountinfo.
        let layout = CgroupLayout(Layout::from_mountinfo(HYBRID, |_| String::new()).unwrap());
        let json = serde_json::to_string(&layout).unwrap();
        let back: CgroupLayout = serde_json::from_str(&json).unwrap();
        assert_eq!(back, layout);
        assert_eq!(
            Cgroup::new(&back.0, "bazaar/m1").dir_with("memory"),
            Some(Path::new("/sys/fs/cgroup/memory/bazaar/m1"))
        );
    }

    #[test]
    fn hybrid_hosts_use_the_v1_controllers() {
        let layout = Layout::from_mountinfo(HYBRID, |_| "hugetlb\n".into()).unwrap();
        let Layout::V1 { mounts } = &layout else {
            panic!("{layout:?}")
        };
        let paths: Vec<_> = mounts.iter().map(|m| m.path.to_str().unwrap()).collect();
        assert_eq!(
            paths,
            [
                "/sys/fs/cgroup/cpu",
                "/sys/fs/cgroup/cpuacct",
                "/sys/fs/cgroup/memory",
                "/sys/fs/cgroup/free zer"
            ]
        );
        assert!(layout.has_controller("memory") && layout.has_controller("cpu"));
        assert!(!layout.has_controller("pids"));
        let cg = Cgroup::new(&layout, "bazaar/m1");
        assert_eq!(
            cg.dir_with("freezer").unwrap(),
            Path::new("/sys/fs/cgroup/free zer/bazaar/m1")
        );
    }

    #[test]
    fn joined_v1_controllers_share_a_mount() {
        let info = "1 0 0:1 / /cg/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n";
        let layout = Layout::from_mountinfo(info, |_| String::new()).unwrap();
        let cg = Cgroup::new(&layout, "x");
        assert_eq!(cg.dirs.len(), 1);
        assert_eq!(cg.dir_with("cpuacct"), cg.dir_with("cpu"));
    }

    #[test]
    fn unified_hosts_use_v2() {
        let info = "25 1 0:22 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        let layout =
            Layout::from_mountinfo(info, |_| "cpuset cpu io memory pids\n".into()).unwrap();
        assert!(matches!(&layout, Layout::V2 { root, .. } if root == Path::new("/sys/fs/cgroup")));
        let cg = Cgroup::new(&layout, "bazaar/m1");
        assert_eq!(
            cg.dir_with("memory").unwrap(),
            Path::new("/sys/fs/cgroup/bazaar/m1")
        );
        assert!(Layout::from_mountinfo("", |_| String::new()).is_none());
    }

    /// Exercises the v2 code paths on whatever cgroup2 hierarchy is mounted (on a v1
    /// "hybrid" host, the controller-less unified one: enough for create, join, freeze, kill
    /// and remove). Needs root.
    #[test]
    fn v2_lifecycle_on_the_mounted_cgroup2_hierarchy() {
        use std::os::unix::process::ExitStatusExt;
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
        let v2_root = mountinfo.lines().find_map(|line| {
            let (pre, post) = line.split_once(" - ")?;
            let mountpoint = pre.split(' ').nth(4)?;
            post.starts_with("cgroup2 ")
                .then(|| PathBuf::from(unescape(mountpoint)))
        });
        let Some(root) = v2_root.filter(|_| sys::effective_ids().0 == 0) else {
            // The test kit's `can_run`, which this crate cannot depend on.
            assert!(
                std::env::var_os("BAZAAR_TESTS_REQUIRE_ROOT").is_none(),
                "this test needs root and a cgroup2 mount (CI runs as root)"
            );
            eprintln!("skipped: needs root and a cgroup2 mount");
            return;
        };
        let controllers = fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
        let layout = Layout::V2 {
            root: root.clone(),
            controllers: controllers.split_whitespace().map(String::from).collect(),
        };
        let parent = format!("bazaar-unit-{}", std::process::id());
        let cg = Cgroup::new(&layout, &format!("{parent}/run"));
        cg.recreate().unwrap();
        cg.configure(0, 0.0).unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("100")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        fs::write(cg.dirs[0].0.join("cgroup.procs"), pid.to_string()).unwrap();
        assert_eq!(cg.procs(), [pid]);
        cg.freeze().unwrap();
        cg.thaw().unwrap();
        // Recreating kills what is left in a stale cgroup.
        cg.recreate().unwrap();
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
        assert!(cg.procs().is_empty());
        cg.remove().unwrap();
        cg.remove().unwrap();
        assert!(!cg.dirs[0].0.exists());
        fs::remove_dir(root.join(parent)).unwrap();
    }

    #[test]
    fn relative_paths_are_validated() {
        assert!(validate_relative("bazaar/host-abc/m-123").is_ok());
        for bad in ["", "/abs", "a//b", "a/../b", "a/./b", "a/", "a\0b"] {
            assert!(validate_relative(bad).is_err(), "{bad:?}");
        }
    }
}
