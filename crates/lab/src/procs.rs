//! The processes of a lab host: starting an agent inside the host's network namespace
//! (`setns` before `exec`, in a session of its own, so it outlives the command that
//! started it), knowing a process again by its pid and start time, signals, memory, and
//! the power-loss sweep that kills everything of a host at once.

use anyhow::Context;
use std::collections::{HashMap, HashSet};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A process as the lab remembers it: pids are reused, start times are not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProcId {
    pub pid: u32,
    /// Field 22 of `/proc/<pid>/stat` (clock ticks since boot).
    pub start_time: u64,
}

/// What a host's agent process is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentState {
    Running,
    /// Stopped by SIGSTOP (`lab freeze`).
    Frozen,
    /// Not running (killed, crashed, never started).
    Down,
}

impl AgentState {
    pub fn as_str(self) -> &'static str {
        match self {
            AgentState::Running => "running",
            AgentState::Frozen => "frozen",
            AgentState::Down => "down",
        }
    }
}

/// `/proc/<pid>/stat` split after the command name: the state is field 0 of the rest.
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_string).collect())
}

impl ProcId {
    /// The process `pid` as it is now.
    pub fn of(pid: u32) -> Option<ProcId> {
        let start_time = stat_fields(pid)?.get(19)?.parse().ok()?;
        Some(ProcId { pid, start_time })
    }

    /// What the process is doing, if it is still the one remembered.
    pub fn state(&self) -> AgentState {
        match stat_fields(self.pid) {
            Some(f) if f.get(19).and_then(|s| s.parse().ok()) == Some(self.start_time) => {
                match f.first().map(String::as_str) {
                    // A thread-group leader turns zombie while its other threads still
                    // exit (one in an fsync, say); their shared file table, listeners
                    // included, is released with the last of them.
                    Some("Z") | Some("X") if threads_left(self.pid) > 1 => AgentState::Running,
                    Some("Z") | Some("X") | None => AgentState::Down,
                    Some("T") => AgentState::Frozen,
                    Some(_) => AgentState::Running,
                }
            }
            _ => AgentState::Down,
        }
    }

    /// Sends `sig` if the process is still the one remembered.
    pub fn signal(&self, sig: i32) {
        if self.state() != AgentState::Down {
            signal(self.pid, sig);
        }
    }

    /// Resident memory in KiB.
    pub fn rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    }

    /// Waits up to `within` until the process is in `state` (signals land asynchronously).
    pub fn wait_state(&self, state: AgentState, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let now = self.state();
            if now == state {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline && now != AgentState::Down,
                "process {} is {} instead of {}",
                self.pid,
                now.as_str(),
                state.as_str()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits up to `within` for the process to end.
    pub fn wait_gone(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while self.state() != AgentState::Down {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }
}

/// How many threads of process `pid` are left (its leader included, zombie or not).
fn threads_left(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count())
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// Starts `exe args` inside the network namespace `/run/netns/<netns>`, in a new session,
/// output appended to `log`. A thread reaps it when it ends, so a long-lived caller
/// collects no zombies; a short-lived one leaves it to init.
pub fn spawn_in_netns(
    netns: &str,
    exe: &Path,
    args: &[String],
    env: &[(&str, &str)],
    log: &Path,
) -> anyhow::Result<ProcId> {
    let ns = std::fs::File::open(Path::new(crate::net::NETNS_DIR).join(netns))
        .with_context(|| format!("opening network namespace {netns}"))?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let mut cmd = Command::new(exe);
    cmd.args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    let fd = ns.as_raw_fd();
    // SAFETY: between fork and exec the closure only makes two system calls (setns,
    // setsid), which are async-signal-safe, and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {} in {netns}", exe.display()))?;
    let pid = child.id();
    let id = ProcId::of(pid).with_context(|| format!("process {pid} ended at once"))?;
    std::thread::spawn(move || child.wait());
    Ok(id)
}

/// Runs `program args` inside the namespace of kind `nstype` (`CLONE_NEWNET`,
/// `CLONE_NEWNS`) that `ns` names, and waits for it, feeding `input`.
pub fn run_in_namespace(
    ns: &Path,
    nstype: libc::c_int,
    program: &str,
    args: &[&str],
    input: &str,
) -> anyhow::Result<()> {
    let ns_file =
        std::fs::File::open(ns).with_context(|| format!("opening namespace {}", ns.display()))?;
    let fd = ns_file.as_raw_fd();
    let mut cmd = Command::new(program);
    cmd.args(args);
    // SAFETY: as in `spawn_in_netns`: one async-signal-safe system call.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(fd, nstype) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    crate::net::feed_and_wait(cmd, program, args, input, &format!(" in {}", ns.display()))?;
    Ok(())
}

/// Lazily unmounts `target` inside the mount namespace `ns` (`/proc/<pid>/ns/mnt`). A
/// forked child enters the namespace and calls umount2 itself: the `umount` program would
/// need a `/proc/self` there, which a namespace with its own /proc (a workload's) lacks.
pub fn umount_in_namespace(ns: &Path, target: &str) -> anyhow::Result<()> {
    let ns_file =
        std::fs::File::open(ns).with_context(|| format!("opening namespace {}", ns.display()))?;
    let fd = ns_file.as_raw_fd();
    let path = std::ffi::CString::new(target)?;
    // SAFETY: between fork and _exit the child makes only system calls (setns, umount2,
    // _exit) on memory prepared before the fork; nothing allocates or takes a lock.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        unsafe {
            let code = if libc::setns(fd, libc::CLONE_NEWNS) != 0
                || libc::umount2(path.as_ptr(), libc::MNT_DETACH) != 0
            {
                *libc::__errno_location()
            } else {
                0
            };
            libc::_exit(code);
        }
    }
    anyhow::ensure!(pid > 0, "fork: {}", std::io::Error::last_os_error());
    let mut status = 0;
    // SAFETY: waiting for the child we just forked.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let code = libc::WEXITSTATUS(status);
    anyhow::ensure!(
        libc::WIFEXITED(status) && code == 0,
        "unmounting {target} in {}: {}",
        ns.display(),
        std::io::Error::from_raw_os_error(code)
    );
    Ok(())
}

/// The inode of a network namespace file (`/run/netns/<name>` or `/proc/<pid>/ns/net`).
fn netns_inode(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| m.ino())
}

/// Every process of a host: those in its network namespace, the shims of its data dir,
/// and all their descendants (workloads in namespaces of their own included).
pub fn processes_of_host(netns: &str, data_dir: &Path) -> Vec<u32> {
    let ns_inode = netns_inode(&Path::new(crate::net::NETNS_DIR).join(netns));
    let needle = format!("{}/", data_dir.display());
    let mut parent: HashMap<u32, u32> = HashMap::new();
    let mut roots: HashSet<u32> = HashSet::new();
    let me = std::process::id();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        if let Some(ppid) = stat_fields(pid).and_then(|f| f.get(1)?.parse().ok()) {
            parent.insert(pid, ppid);
        }
        let in_ns = ns_inode.is_some()
            && netns_inode(Path::new(&format!("/proc/{pid}/ns/net"))) == ns_inode;
        let is_shim = || {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| {
                    let c = String::from_utf8_lossy(&c).replace('\0', " ");
                    c.contains(" shim ") && c.contains(&needle)
                })
                .unwrap_or(false)
        };
        if in_ns || is_shim() {
            roots.insert(pid);
        }
    }
    // Descendants: keep adding children of what is in the set until nothing changes.
    let mut all = roots;
    loop {
        let before = all.len();
        for (pid, ppid) in &parent {
            if all.contains(ppid) {
                all.insert(*pid);
            }
        }
        if all.len() == before {
            break;
        }
    }
    all.remove(&me);
    all.into_iter().collect()
}

/// Power loss: stops every process of the host at once (so none sees another die and
/// reacts), then kills them all, and waits until they are gone.
pub fn kill_host(netns: &str, data_dir: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen: HashSet<u32> = HashSet::new();
    let mut stopped: Vec<ProcId> = Vec::new();
    // A process may fork between the scan and the stop: scan again until a pass finds
    // nothing new.
    loop {
        let pids = processes_of_host(netns, data_dir);
        let fresh: Vec<u32> = pids.into_iter().filter(|p| seen.insert(*p)).collect();
        if fresh.is_empty() {
            break;
        }
        for pid in fresh {
            signal(pid, libc::SIGSTOP);
            stopped.extend(ProcId::of(pid));
        }
    }
    for id in &stopped {
        id.signal(libc::SIGKILL);
    }
    // Wait for each process itself: one on its way out has already left its namespace
    // and lost its command line, so a new scan would miss it.
    loop {
        let left: Vec<u32> = stopped
            .iter()
            .filter(|id| id.state() != AgentState::Down)
            .map(|id| id.pid)
            .chain(
                processes_of_host(netns, data_dir)
                    .into_iter()
                    .filter(|p| ProcId::of(*p).is_some_and(|id| id.state() != AgentState::Down)),
            )
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "processes of {netns} survive SIGKILL: {left:?}"
        );
        for pid in left {
            signal(pid, libc::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
