//! The mini init of an isolated run (like tini): pid 1 of the run's new pid namespace.
//!
//! The shim forks it after `unshare(CLONE_NEWPID)`. It dies with the shim
//! (`PR_SET_PDEATHSIG`), joins the cgroup (and, when confined, the run's network
//! namespace), gives the run its own mount (with a fresh `/proc`, or the whole private root
//! of a [`Sandbox`]), ipc and uts namespaces, then forks and execs the workload. It forwards every signal
//! it gets to the workload, reaps orphans, and when the workload exits reports its wait status
//! to the shim and exits, which makes the kernel kill whatever is left in the namespace.
//!
//! Why an init at all: pid 1 of a namespace gets no signal it has no handler for, so a
//! workload that is pid 1 would ignore the SIGTERM of a stop. And pid 1 cannot die of the
//! workload's signal to pass it on, so the real status travels over the status pipe.
//!
//! The status pipe carries one line per message (see [`InitMessage`]).

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;

use rustix::mount::{MountFlags, MountPropagationFlags};
use rustix::thread::UnshareFlags;

use crate::cgroup::Cgroup;
use crate::launch::{self, describe, Command, Setup};
use crate::sandbox::{self, Sandbox};
use crate::seccomp::Filters;
use crate::sys::{self, Forked, SigSet};
use crate::user::Credentials;

/// fd number of the status pipe inside the init (0-2 are the workload's stdio).
const STATUS_FD: RawFd = 3;

/// Signals that only make sense for the thread that faults: left unblocked, so that a real
/// fault in the init kills it instead of being forwarded.
const SYNCHRONOUS: &[i32] = &[
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGFPE,
    libc::SIGILL,
    libc::SIGTRAP,
    libc::SIGSYS,
];

/// A message from the init to the shim on the status pipe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum InitMessage {
    /// The workload was exec'd; when each of the init's launch steps ended
    /// ([`sys::monotonic_us`]).
    Started(Vec<(String, u64)>),
    /// The workload could not be started (the reason).
    Failed(String),
    /// The workload exited with this wait status.
    Exited(i32),
}

impl InitMessage {
    fn encode(&self) -> String {
        match self {
            InitMessage::Started(marks) => {
                let mut line = "started".to_owned();
                for (step, us) in marks {
                    line.push_str(&format!(" {step}={us}"));
                }
                line.push('\n');
                line
            }
            InitMessage::Failed(msg) => format!("failed {}\n", msg.replace('\n', " ")),
            InitMessage::Exited(status) => format!("exited {status}\n"),
        }
    }

    /// Parses one line (without its '\n').
    pub(crate) fn parse(line: &str) -> Option<InitMessage> {
        match line.split_once(' ') {
            None if line == "started" => Some(InitMessage::Started(Vec::new())),
            Some(("started", marks)) => Some(InitMessage::Started(
                marks
                    .split(' ')
                    .filter_map(|m| {
                        let (step, us) = m.split_once('=')?;
                        Some((step.to_owned(), us.parse().ok()?))
                    })
                    .collect(),
            )),
            Some(("failed", msg)) => Some(InitMessage::Failed(msg.to_owned())),
            Some(("exited", status)) => status.parse().ok().map(InitMessage::Exited),
            _ => None,
        }
    }
}

/// What the init needs, prepared by the shim before forking it.
pub(crate) struct InitSetup<'a> {
    pub command: &'a Command,
    pub creds: Option<&'a Credentials>,
    pub hostname: &'a str,
    pub cgroup: Option<&'a Cgroup>,
    /// A pidfd of the shim, to close the race with the parent-death signal.
    pub shim_pidfd: RawFd,
    /// Write end of the status pipe.
    pub status_fd: RawFd,
    /// The workload's stdin, stdout and stderr.
    pub stdio: [RawFd; 3],
    /// A confined run: its sandbox, built on the empty directory `staging`, with the host
    /// path of its work directory; and the seccomp filters of the workload.
    pub confined: Option<Confined<'a>>,
}

/// What the init needs for a confined run.
pub(crate) struct Confined<'a> {
    pub sandbox: &'a Sandbox,
    pub staging: &'a Path,
    pub workdir: &'a Path,
    pub filters: &'a Filters,
}

/// The body of the init, in the child forked by the shim. Never returns.
pub(crate) fn run(setup: &InitSetup<'_>) -> ! {
    if let Err(msg) = launch::arm_parent_death_signal(setup.shim_pidfd) {
        report_to(setup.status_fd, &InitMessage::Failed(msg));
        sys::exit_now(1);
    }
    if let Err(err) = take_fds(setup) {
        report_to(
            setup.status_fd,
            &InitMessage::Failed(format!("init fds: {}", describe(&err))),
        );
        sys::exit_now(1);
    }
    // From here on the status pipe is STATUS_FD and nothing else of the shim is open.
    let mut marks = vec![("init".to_owned(), sys::monotonic_us())];
    let workload = match start(setup, &mut marks) {
        Ok(pid) => pid,
        Err(msg) => {
            report(&InitMessage::Failed(msg));
            sys::exit_now(1);
        }
    };
    report(&InitMessage::Started(marks));
    // The init shares the run's cgroup (and memory limit) with the workload: keep it small.
    sys::trim_resident_memory();
    supervise(workload)
}

/// Installs the workload's stdio on 0-2 and the status pipe on [`STATUS_FD`], and closes
/// every other fd inherited from the shim (its lock, log and signalfd must not be held here).
fn take_fds(setup: &InitSetup<'_>) -> std::io::Result<()> {
    for (target, fd) in setup.stdio.into_iter().enumerate() {
        sys::dup2(fd, target as RawFd)?;
    }
    sys::move_fd(setup.status_fd, STATUS_FD)?;
    sys::close_fds_from(STATUS_FD + 1);
    Ok(())
}

/// Sets up the namespaces and the cgroup, then forks and execs the workload. Returns the
/// workload's pid (in the new namespace) once `execve` succeeded.
/// When each step ends it is added to `marks`.
fn start(setup: &InitSetup<'_>, marks: &mut Vec<(String, u64)>) -> Result<libc::pid_t, String> {
    let mut mark = |step: &str| marks.push((step.to_owned(), sys::monotonic_us()));
    let _ = rustix::process::setsid();
    // The init lives in the cgroup with the workload: make sure the OOM killer picks the
    // workload, and give the workload back the score it would have had.
    let oom_score_adj = std::fs::read_to_string("/proc/self/oom_score_adj").unwrap_or_default();
    let _ = std::fs::write("/proc/self/oom_score_adj", "-1000");
    // Before a sandbox hides the host's /sys.
    if let Some(cgroup) = setup.cgroup {
        cgroup
            .join()
            .map_err(|err| format!("joining cgroup: {err}"))?;
    }
    if let Some(netns) = setup
        .confined
        .as_ref()
        .and_then(|c| c.sandbox.netns.as_ref())
    {
        sandbox::join_netns(netns)?;
    }
    mark("join_cgroup_netns");
    match &setup.confined {
        Some(c) => {
            // Taken from the host before the init leaves its mount namespace.
            let parts = sandbox::HostParts::gather(c.sandbox, c.workdir)?;
            let root = sandbox::unshare_mounts(c.sandbox, c.staging)?;
            mark("mount_namespace");
            sandbox::enter(root, parts, c.sandbox, setup.creds, setup.hostname)?;
            mark("private_root");
        }
        None => {
            let flags = UnshareFlags::NEWNS | UnshareFlags::NEWIPC | UnshareFlags::NEWUTS;
            // SAFETY: unshare_unsafe is unsafe because a new mount or fs namespace can
            // invalidate what other threads assume about paths; the init is single-threaded.
            unsafe { rustix::thread::unshare_unsafe(flags) }
                .map_err(|err| format!("unsharing namespaces: {}", describe(&err.into())))?;
            // Keep our mounts (the fresh /proc) from propagating back to the host.
            rustix::mount::mount_change(
                "/",
                MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
            )
            .map_err(|err| format!("making / private: {}", describe(&err.into())))?;
            let proc_flags = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
            rustix::mount::mount("proc", "/proc", "proc", proc_flags, None)
                .map_err(|err| format!("mounting /proc: {}", describe(&err.into())))?;
        }
    }
    if !setup.hostname.is_empty() {
        rustix::system::sethostname(setup.hostname.as_bytes())
            .map_err(|err| format!("setting the hostname: {}", describe(&err.into())))?;
    }
    let mut blocked = SigSet::full();
    SYNCHRONOUS.iter().for_each(|&sig| blocked.remove(sig));
    blocked
        .set_mask()
        .map_err(|err| format!("blocking signals: {}", describe(&err)))?;
    let _ = rustix::process::chdir("/");

    let (mut exec_r, exec_w) = sys::pipe().map_err(|err| format!("pipe: {}", describe(&err)))?;
    // SAFETY: the init is single-threaded; the child ends in execve or exit_now.
    match unsafe { sys::fork() } {
        Err(err) => Err(format!("fork: {}", describe(&err))),
        Ok(Forked::Child) => {
            let workload = Setup {
                command: setup.command,
                creds: setup.creds,
                stdio: None,
                cgroup: None,
                parent: None,
                oom_score_adj: Some(oom_score_adj.trim()),
                confine: setup.confined.as_ref().map(|c| c.filters),
            };
            let msg = launch::exec_workload(&workload);
            let _ = sys::write_all_fd(exec_w.as_raw_fd(), msg.as_bytes());
            sys::exit_now(launch::LAUNCH_FAILED);
        }
        Ok(Forked::Parent(pid)) => {
            drop(exec_w);
            let mut msg = String::new();
            let _ = exec_r.read_to_string(&mut msg);
            if msg.is_empty() {
                mark("seccomp_exec");
                Ok(pid)
            } else {
                let _ = sys::wait_child(pid);
                Err(msg)
            }
        }
    }
}

/// Forwards signals to the workload and reaps children until the workload exits; then
/// reports its status and exits.
fn supervise(workload: libc::pid_t) -> ! {
    let mut waited = SigSet::full();
    SYNCHRONOUS.iter().for_each(|&sig| waited.remove(sig));
    loop {
        match waited.wait() {
            libc::SIGCHLD => {
                while let Some((pid, status)) = sys::reap_any() {
                    if pid == workload {
                        report(&InitMessage::Exited(status));
                        sys::exit_now(0);
                    }
                }
            }
            sig => {
                let _ = sys::kill(workload, sig);
            }
        }
    }
}

fn report(msg: &InitMessage) {
    report_to(STATUS_FD, msg);
}

fn report_to(fd: RawFd, msg: &InitMessage) {
    let _ = sys::write_all_fd(fd, msg.encode().as_bytes());
}

/// Reads what the init wrote on the status pipe, one message per line.
pub(crate) struct StatusReader {
    pipe: File,
    buf: Vec<u8>,
}

impl StatusReader {
    pub(crate) fn new(pipe: File) -> StatusReader {
        StatusReader {
            pipe,
            buf: Vec::new(),
        }
    }

    /// Blocks until the next message; `None` once the init is gone without sending one.
    pub(crate) fn next(&mut self) -> Option<InitMessage> {
        loop {
            if let Some(nl) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=nl).collect();
                if let Some(msg) = InitMessage::parse(String::from_utf8_lossy(&line[..nl]).as_ref())
                {
                    return Some(msg);
                }
                continue;
            }
            let mut chunk = [0u8; 512];
            match self.pipe.read(&mut chunk) {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return None,
            }
        }
    }
}

impl AsRawFd for StatusReader {
    fn as_raw_fd(&self) -> RawFd {
        self.pipe.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn messages_round_trip() {
        for msg in [
            InitMessage::Started(Vec::new()),
            InitMessage::Started(vec![("init".into(), 12), ("private_root".into(), 345)]),
            InitMessage::Failed("no\nway".into()),
            InitMessage::Exited(256),
        ] {
            let line = msg.encode();
            let parsed = InitMessage::parse(line.trim_end_matches('\n')).unwrap();
            let want = match msg {
                InitMessage::Failed(m) => InitMessage::Failed(m.replace('\n', " ")),
                other => other,
            };
            assert_eq!(parsed, want);
        }
        assert_eq!(InitMessage::parse("bogus"), None);
    }

    #[test]
    fn status_reader_splits_messages_and_sees_eof() {
        let (r, mut w) = sys::pipe().unwrap();
        w.write_all(b"started\nexited 9\n").unwrap();
        drop(w);
        let mut reader = StatusReader::new(r);
        assert_eq!(reader.next(), Some(InitMessage::Started(Vec::new())));
        assert_eq!(reader.next(), Some(InitMessage::Exited(9)));
        assert_eq!(reader.next(), None);
    }
}
