//! `bazaar-shim`: the per-machine supervisor process ("shim", like containerd-shim or conmon)
//! and the agent-side handle to it.
//!
//! Every run of a machine's workload goes through one shim:
//!
//! ```text
//!  agent ──spawn()──► bazaar shim RUN_DIR ──fork──► [mini init, pid 1 of a new pid ns] ──fork/exec──► workload
//!    ▲                 │  holds RUN_DIR/shim.lock for life, logs stdout/stderr,
//!    └──adopt()────────┘  writes RUN_DIR/exit.json when the workload is gone, then exits
//! ```
//!
//! * The agent calls [`ShimHandle::spawn`], which writes `RUN_DIR/spec.json` ([`ShimSpec`]) and
//!   execs `bazaar-shim shim RUN_DIR` (the small executable built beside `bazaar`, see
//!   `bazaar_agent`'s `shim_executable`; `bazaar shim RUN_DIR` when there is none) in its own session. It returns once the workload has been
//!   exec'd, or with [`ShimError::Launch`] if it could not be (command not found, bad user...).
//! * The shim ([`shim_main`]) is single-threaded and small. It supervises exactly one run, records
//!   how it ended in `RUN_DIR/exit.json` ([`ExitRecord`], read with [`read_exit`]) and exits.
//!   Shims outlive the agent: after an agent restart, [`ShimHandle::adopt`] re-attaches to them.
//! * A workload never outlives its shim: it (or its mini init) has `PR_SET_PDEATHSIG(SIGKILL)`,
//!   an isolated run dies with its pid namespace, and the run's cgroup is emptied at exit.
//! * A sandboxed run ([`ShimSpec::sandbox`]) sees a private root instead of the host's file
//!   system, may join a network namespace, and runs with no capabilities, `no_new_privs`
//!   and the seccomp allowlist of `bazaar_types::seccomp`.
//!
//! # Layout
//!
//! * `handle`: the agent side ([`ShimHandle`]): spawn, adopt, signal, kill, freeze, wait.
//! * `supervisor`: the body of the shim process ([`shim_main`]): launch, event loop, exit record.
//! * `launch`: code that runs in forked children before `execve` (user switch, PATH search).
//! * `init`: the mini init (like tini) that is pid 1 of an isolated run.
//! * `sandbox`, `seccomp`: the private root file system, capability drop and seccomp filter
//!   of a confined run ([`Sandbox`]).
//! * `enter`: `bazaar shim-exec`, which runs a command inside a live run ([`exec_main`]).
//! * `cgroup`: cgroup v1 and v2 discovery and control ([`remove_cgroup`], [`cgroups_available`]).
//! * `user`, `log`, `files`, `sys`: credentials, the log writer, `RUN_DIR` formats, raw syscalls.
//!
//! # RUN_DIR
//!
//! | file | written by | content |
//! |---|---|---|
//! | `spec.json` | agent, before exec | [`ShimSpec`] |
//! | `shim.lock` | shim | `flock`ed exclusively by the live shim: busy lock ⇔ shim alive |
//! | `shim.pid` | shim | pids and `/proc` start times of shim, init and workload |
//! | `exit.json` | shim, last thing before it exits | [`ExitRecord`] |
//!
//! # Guarantees and limits
//!
//! * The workload never outlives its shim. The shim's child (the workload, or the init of
//!   an isolated run) has `PR_SET_PDEATHSIG(SIGKILL)`; an isolated run is a pid
//!   namespace, which the kernel empties when its init dies; a run with a cgroup is emptied
//!   when the workload exits, and a stale cgroup is emptied before the next run reuses it.
//!   Weak spot: in a run with neither isolation nor a cgroup (a non-root agent), a process
//!   that the workload moved out of its process group survives a SIGKILLed shim.
//! * The shim is never in the run's cgroup, so the run's OOM kills cannot hit it.
//! * `exit.json` is written last, durably (fsync of the file and of RUN_DIR), once the
//!   workload and everything it left are dead and the cgroup is removed: its presence means
//!   the run is over.
//!
//! # Cost
//!
//! Measured on the 2-core development VM (cgroup v1, other jobs running) with the
//! `shim` bench in `crates/cli/benches` (`cargo bench -p bazaar --bench shim`): `spawn`
//! of `sleep 1000` until it is exec'd (p50), and VmRSS of the shim supervising it. Load
//! 1-2, except the cgroup columns: load 3-4.
//!
//! | `bazaar` build | plain | isolated | cgroup | isolated + cgroup | shim VmRSS |
//! |---|---|---|---|---|---|
//! | release | 2.9-3.8 ms | 4-6.5 ms | 4.3-6.7 ms | 5-6.4 ms | 0.85-1 MiB |
//! | debug | 5-6 ms | 7-8 ms | 9-10 ms | 8-11 ms | 2.1-2.5 MiB |
//!
//! * Most of a plain spawn is loading and relocating the large `bazaar` executable, and
//!   most of the shim's memory is its relocated read-only data; both grow with the binary.
//!   The shim drops every clean page it touched while starting (`sys::trim_resident_memory`).
//!   This is why shims run from `bazaar-shim`, an executable of only this crate (10 MB
//!   against `bazaar`'s 210 MB): `bazaar-shim shim` of a missing run directory takes
//!   1.25 ms of CPU and 83 page faults, `bazaar shim` 2.38 ms and 327 (`perf stat -r 200`,
//!   release build, 2026-11-27).
//! * A sandboxed run adds the private root (about twenty mounts in the init) and its
//!   seccomp filters: read from the file the agent compiled once ([`write_seccomp_filters`];
//!   release build at load 20: 0.03-0.09 ms, where compiling them took 0.21-0.26 ms), or
//!   compiled when the sandbox names none; the `shim` bench measures both (`sandboxed`
//!   columns) beside the plain isolated run.
//! * On cgroup v1 the child joins the run's cgroup by moving its only thread (`tasks`), not
//!   its process (`cgroup.procs`): a process move waits for an RCU grace period under the
//!   global `cgroup_mutex` whenever no other move ran in the last few milliseconds. That
//!   wait was 12-15 ms of every spawn (cgroup columns: 16-21 ms before). Other programs on
//!   the host that move processes between cgroups still hold `cgroup_mutex` that long.
//!   On cgroup v2 the join still moves the process; `clone3(CLONE_INTO_CGROUP)` would
//!   avoid the move altogether (not used yet: it cannot be tested on this host).
//!
//! This crate uses `unsafe` for `fork`, `execve`, signal masks and a few raw system calls;
//! every block says why it is sound. Everything that runs between `fork` and `execve`
//! relies on the shim being single-threaded: the shim never starts a thread or a runtime.

mod cgroup;
mod cpu_use;
mod enter;
mod files;
mod handle;
mod init;
mod launch;
mod log;
mod memory;
mod sandbox;
mod seccomp;
mod supervisor;
mod sys;
mod user;
mod vm_port;
mod work_files;

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use bazaar_types::failure::FailureKind;
pub use cgroup::{cgroup_layout, cgroups_available, remove_cgroup, CgroupLayout};
pub use cpu_use::{cpu_usage_usec, set_cpu_limit};
pub use enter::exec_main;
pub use handle::ShimHandle;
pub use memory::{memory_use, reclaim_memory, set_memory_limit, MemoryUse};
pub use sandbox::{make_sandbox_base, Sandbox};
pub use seccomp::write_seccomp_filters;
pub use supervisor::shim_main;
pub use sys::monotonic_us;
pub use work_files::{write_work_files, WorkFile};

/// File in RUN_DIR holding the [`ShimSpec`], written by the agent before the shim starts.
pub const SPEC_FILE: &str = "spec.json";
/// File in RUN_DIR that the live shim holds an exclusive `flock` on.
pub const LOCK_FILE: &str = "shim.lock";
/// File in RUN_DIR with the pids and start times of the shim, init and workload.
pub const PID_FILE: &str = "shim.pid";
/// File in RUN_DIR holding the [`ExitRecord`] of the run.
pub const EXIT_FILE: &str = "exit.json";

/// The format of [`ShimSpec`] and of the files in RUN_DIR. Raise it whenever they change:
/// an agent runs its shims from the `bazaar-shim` beside it only when that executable
/// reports this same number (with [`version_line`]).
pub const SPEC_FORMAT: u32 = 1;

/// What `bazaar-shim --version` prints: the package version and [`SPEC_FORMAT`].
pub fn version_line() -> String {
    format!(
        "bazaar-shim {} spec {SPEC_FORMAT}",
        env!("CARGO_PKG_VERSION")
    )
}

/// Runs the internal command named by `command` and never returns when it is one:
/// `shim RUN_DIR` ([`shim_main`]) or `shim-exec RUN_DIR ARGV...` ([`exec_main`]), the rest
/// of `args` being their arguments. Returns for any other command. Both executables that
/// host the shim (`bazaar` and `bazaar-shim`) call it first thing, before any thread or
/// runtime exists.
pub fn dispatch(command: &std::ffi::OsStr, mut args: impl Iterator<Item = std::ffi::OsString>) {
    if command == "vm-signal" || command == "vm-exec" {
        let socket = std::path::PathBuf::from(args.next().unwrap_or_default());
        let rest: Vec<String> = args.map(|a| a.to_string_lossy().into_owned()).collect();
        vm_port::port_main(&command.to_string_lossy(), &socket, &rest);
    }
    if command != "shim" && command != "shim-exec" {
        return;
    }
    let run_dir = std::path::PathBuf::from(args.next().unwrap_or_default());
    if command == "shim" {
        shim_main(&run_dir);
    }
    let argv: Vec<String> = args.map(|a| a.to_string_lossy().into_owned()).collect();
    exec_main(&run_dir, &argv);
}

/// What to run and how: written by the agent into `RUN_DIR/spec.json` before exec.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShimSpec {
    /// The machine this run belongs to (informational; used in messages).
    pub machine_id: String,
    /// Identifies the run; copied into the [`ExitRecord`].
    pub run_id: u64,
    /// The command. `argv[0]` is looked up in `PATH` (from `env`, or a default `PATH`) when it
    /// has no `/`.
    pub argv: Vec<String>,
    /// The complete environment of the workload (nothing is inherited from the agent).
    pub env: Vec<(String, String)>,
    /// Working directory; created if missing, and the directories created are chowned to the
    /// workload user (an existing directory keeps its owner).
    pub workdir: PathBuf,
    /// `"root"`, a user name, `"uid"` or `"uid:gid"` (a name or number on either side). `None`
    /// runs as `nobody` (65534:65534) when the shim is root, else as the current user.
    pub user: Option<String>,
    /// Hostname seen by the workload (isolated runs only).
    pub hostname: String,
    /// Run in new pid, mount, ipc and uts namespaces under a mini init (root only).
    pub isolate: bool,
    /// Memory limit in MiB, swap disabled where the kernel allows (0 = no limit).
    pub memory_mb: u64,
    /// CPU quota in cpus (`cpus * period`; 0 = no quota).
    pub cpus: f64,
    /// Cgroup path relative to the root of each hierarchy, e.g. `"bazaar/host-abc/m-123"`.
    /// `None` = no cgroup (the usual choice when not root).
    pub cgroup: Option<String>,
    /// Per-machine log file; appended to across runs.
    pub log_path: PathBuf,
    /// When the log would exceed this size it is rotated to `<log_path>.1` (0 = never).
    pub log_max_bytes: u64,
    /// Confine an isolated run: a private root file system ([`Sandbox`]), no capabilities,
    /// `no_new_privs` and the seccomp filter of `bazaar_types::seccomp` (root only; needs
    /// `isolate`).
    #[serde(default)]
    pub sandbox: Option<Sandbox>,
    /// The cgroup hierarchies as the agent found them ([`cgroup_layout`]), so the shim does
    /// not read the host's mount table again; `None`: the shim finds them itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_layout: Option<CgroupLayout>,
    /// A command that delivers a forwarded signal to the workload instead of `kill(2)`
    /// of the shim's child, with [`SIGNAL_PLACEHOLDER`] replaced by the signal's number
    /// (`runsc kill`: `runsc run` does not forward signals). `None`: `kill(2)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal_argv: Option<Vec<String>>,
}

/// Where [`ShimSpec::signal_argv`] takes the signal's number.
pub const SIGNAL_PLACEHOLDER: &str = "{signal}";

impl ShimSpec {
    /// The working directory as the workload sees it (inside its sandbox, if any).
    pub fn workdir_inside(&self) -> &Path {
        self.sandbox.as_ref().map_or(&self.workdir, |s| &s.workdir)
    }
}

/// How a run ended: `RUN_DIR/exit.json`, written by the shim after the run is fully over (the
/// workload and everything it left behind are dead and the cgroup is removed).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ExitRecord {
    /// The [`ShimSpec::run_id`] of the run.
    pub run_id: u64,
    /// Set when the workload exited normally.
    pub exit_code: Option<i32>,
    /// Set when the workload was killed by a signal.
    pub signal: Option<i32>,
    /// The cgroup's `oom_kill` counter rose during this run.
    pub oom_killed: bool,
    /// When the shim saw the workload end (unix ms).
    pub exited_at_ms: u64,
    /// Launch failure (e.g. `"command not found: foo"`): the workload never started.
    pub error: Option<String>,
}

/// Errors from the agent-side API.
#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    /// The workload could not be started; the message comes from the shim (e.g.
    /// `"command not found: foo"`, `"permission denied: /bin/x"`).
    #[error("failed to launch workload: {0}")]
    Launch(String),
    /// A system call or file operation failed; the string says which.
    #[error("{0}: {1}")]
    Io(String, #[source] io::Error),
    /// The spec (or a file in RUN_DIR) is invalid.
    #[error("invalid shim spec: {0}")]
    Spec(String),
    /// A live shim already holds this RUN_DIR.
    #[error("run directory {} is held by a live shim", .0.display())]
    Busy(PathBuf),
    /// The run has no cgroup (freeze and thaw need one).
    #[error("the run has no cgroup")]
    NoCgroup,
    /// The target process has already exited.
    #[error("the workload is not running")]
    NotRunning,
    /// An operation did not complete in time; the string says which.
    #[error("timed out: {0}")]
    Timeout(String),
}

impl ShimError {
    /// What kind of failure this is: from the errno of an I/O error, from the words of a
    /// message the shim process reported (it makes them from the errno's text, e.g.
    /// `command not found: x`, `workdir /w: no space left on device`), a spec that does
    /// not parse is a config error, a held run directory is busy.
    pub fn kind(&self) -> FailureKind {
        match self {
            ShimError::Launch(message) => kind_of_message(message),
            ShimError::Io(_, err) => FailureKind::of_io(err),
            ShimError::Spec(_) => FailureKind::Config,
            ShimError::Busy(_) | ShimError::Timeout(_) => FailureKind::Busy,
            ShimError::NoCgroup => FailureKind::Unsupported,
            ShimError::NotRunning => FailureKind::Io,
        }
    }

    /// Wraps an I/O error with what was being done.
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(io::Error) -> ShimError {
        let context = context.into();
        move |err| ShimError::Io(context, err)
    }
}

/// The kind of a failure the shim process reported as text (its messages end with the
/// text of the errno that caused them, or say what was missing).
pub fn kind_of_message(message: &str) -> FailureKind {
    let m = message.to_ascii_lowercase();
    let has = |words: &[&str]| words.iter().any(|w| m.contains(w));
    if has(&["no space left", "disk quota exceeded"]) {
        FailureKind::NoSpace
    } else if has(&[
        "permission denied",
        "operation not permitted",
        "read-only file system",
    ]) {
        FailureKind::Permission
    } else if has(&[
        "command not found",
        "no such file or directory",
        "not found",
    ]) {
        FailureKind::NotFound
    } else if has(&[
        "unknown user",
        "unknown group",
        "not a directory",
        "is a directory",
    ]) {
        FailureKind::Config
    } else if has(&["resource busy", "temporarily unavailable", "timed out"]) {
        FailureKind::Busy
    } else {
        FailureKind::Io
    }
}

/// An error of the launch path that says its kind: the message as it was always shown,
/// and the [`FailureKind`] a caller acts on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Fault {
    pub kind: FailureKind,
    pub message: String,
}

impl Fault {
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Fault {
        Fault {
            kind,
            message: message.into(),
        }
    }

    /// An I/O error while doing `context` (empty: the error alone).
    pub fn io(context: impl std::fmt::Display, err: &io::Error) -> Fault {
        Fault::new(FailureKind::of_io(err), join(context, err))
    }

    /// An errno while doing `context` (empty: the error alone).
    pub fn errno(context: impl std::fmt::Display, err: rustix::io::Errno) -> Fault {
        Fault::new(
            FailureKind::of_errno(err.raw_os_error()),
            join(context, err),
        )
    }

    /// A message the shim process made ([`kind_of_message`]).
    pub fn from_shim_message(message: String) -> Fault {
        Fault::new(kind_of_message(&message), message)
    }

    /// The same failure, its message prefixed with `context: `.
    pub fn context(self, context: impl std::fmt::Display) -> Fault {
        Fault::new(self.kind, join(context, self.message))
    }
}

impl From<ShimError> for Fault {
    fn from(err: ShimError) -> Fault {
        Fault::new(err.kind(), err.to_string())
    }
}

fn join(context: impl std::fmt::Display, err: impl std::fmt::Display) -> String {
    let context = context.to_string();
    if context.is_empty() {
        err.to_string()
    } else {
        format!("{context}: {err}")
    }
}

/// Reads `RUN_DIR/exit.json`; `None` if it is missing or unreadable (the run has not ended, or
/// its shim died without recording it).
pub fn read_exit(run_dir: &Path) -> Option<ExitRecord> {
    let bytes = std::fs::read(run_dir.join(EXIT_FILE)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_the_shim_reports_say_their_kind() {
        let kind = |m: &str| kind_of_message(m);
        assert_eq!(
            kind("workdir /w: No space left on device (os error 28)"),
            FailureKind::NoSpace
        );
        assert_eq!(kind("command not found: x"), FailureKind::NotFound);
        assert_eq!(kind("permission denied: /bin/x"), FailureKind::Permission);
        assert_eq!(
            kind("creating the veth: Operation not permitted (os error 1)"),
            FailureKind::Permission
        );
        assert_eq!(kind("unknown user: bob"), FailureKind::Config);
        assert_eq!(kind("workdir /x: not a directory"), FailureKind::Config);
        assert_eq!(kind("netlink: Device or resource busy"), FailureKind::Busy);
        assert_eq!(kind("the shim exited without reporting"), FailureKind::Io);
        let f = Fault::io("writing /w/f", &io::Error::from_raw_os_error(28));
        assert_eq!(f.kind, FailureKind::NoSpace);
        assert!(f.message.starts_with("writing /w/f: "), "{f}");
        assert_eq!(f.context("config.files f").kind, FailureKind::NoSpace);
    }
}
