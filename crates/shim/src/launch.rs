//! Starting the workload process: what is prepared before `fork` (argv, environment, `PATH`
//! candidates, the working directory) and what runs in the forked child before `execve`
//! (session, stdio, cgroup, credentials, parent-death signal, working directory,
//! `no_new_privs`, signal mask).
//!
//! The child reports a failure to its parent as a message on a close-on-exec pipe ("command
//! not found: foo") and exits with [`LAUNCH_FAILED`]; a successful `execve` closes the pipe,
//! which the parent reads as "started". Code here runs in a child forked from a
//! single-threaded process, so it may allocate.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::process::Signal;

use crate::cgroup::Cgroup;
use crate::sandbox;
use crate::seccomp::Filters;
use crate::sys::{self, SigSet};
use crate::user::Credentials;
use crate::ShimSpec;

/// `PATH` used to find `argv[0]` when the spec's environment has none (Debian's default).
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Exit status of a child that failed before `execve` (the shell's "command not found").
pub(crate) const LAUNCH_FAILED: i32 = 127;

/// A workload command ready to be exec'd: everything is allocated before `fork`.
pub(crate) struct Command {
    argv: Vec<CString>,
    envp: Vec<CString>,
    /// Paths to try, in order: `argv[0]` if it has a '/', else `argv[0]` in each `PATH` entry.
    candidates: Vec<CString>,
    workdir: CString,
}

impl Command {
    /// Prepares `spec`'s command (a validated spec: no NUL bytes).
    pub(crate) fn new(spec: &ShimSpec) -> Result<Command, String> {
        Command::with_argv(spec, &spec.argv)
    }

    /// Prepares `argv` to run as `spec`'s workload would: its environment and working
    /// directory (the one inside a sandbox).
    pub(crate) fn with_argv(spec: &ShimSpec, argv: &[String]) -> Result<Command, String> {
        let cstring =
            |s: &[u8]| CString::new(s).map_err(|_| "argument contains a NUL byte".to_owned());
        let names = argv;
        let argv = argv
            .iter()
            .map(|a| cstring(a.as_bytes()))
            .collect::<Result<Vec<_>, _>>()?;
        let envp = spec
            .env
            .iter()
            .map(|(k, v)| cstring(format!("{k}={v}").as_bytes()))
            .collect::<Result<Vec<_>, _>>()?;
        let name = names.first().ok_or("argv is empty")?;
        let candidates = if name.contains('/') {
            vec![cstring(name.as_bytes())?]
        } else {
            let path = spec
                .env
                .iter()
                .rev()
                .find(|(k, _)| k == "PATH")
                .map_or(DEFAULT_PATH, |(_, v)| v);
            // Empty entries (the current directory, for POSIX) are skipped on purpose.
            path.split(':')
                .filter(|dir| !dir.is_empty())
                .map(|dir| cstring(format!("{}/{name}", dir.trim_end_matches('/')).as_bytes()))
                .collect::<Result<Vec<_>, _>>()?
        };
        Ok(Command {
            argv,
            envp,
            candidates,
            workdir: cstring(spec.workdir_inside().as_os_str().as_bytes())?,
        })
    }

    fn name(&self) -> String {
        self.argv[0].to_string_lossy().into_owned()
    }

    /// Execs the first candidate that can be; returns the failure message if none could.
    fn exec(&self) -> String {
        let mut argv: Vec<*const libc::c_char> = self.argv.iter().map(|a| a.as_ptr()).collect();
        argv.push(std::ptr::null());
        let mut envp: Vec<*const libc::c_char> = self.envp.iter().map(|e| e.as_ptr()).collect();
        envp.push(std::ptr::null());
        let mut denied = false;
        for candidate in &self.candidates {
            // SAFETY: every pointer is a NUL-terminated string owned by `self`, and both
            // arrays end with a null pointer.
            unsafe { libc::execve(candidate.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                // As execvp does: keep looking, remembering a permission problem.
                Some(libc::ENOENT | libc::ENOTDIR) => {}
                Some(libc::EACCES) => denied = true,
                _ => return format!("{}: {}", candidate.to_string_lossy(), describe(&err)),
            }
        }
        if denied {
            format!("permission denied: {}", self.name())
        } else {
            format!("command not found: {}", self.name())
        }
    }
}

/// Creates `workdir` if it is missing; the directories created are chowned to `creds`,
/// each through a descriptor of the directory made (`O_NOFOLLOW`): whatever took its place
/// in between (a symlink to a host file) is refused, never followed.
pub(crate) fn prepare_workdir(workdir: &Path, creds: Option<&Credentials>) -> Result<(), String> {
    let fail = |err: io::Error| format!("workdir {}: {}", workdir.display(), describe(&err));
    let missing: Vec<&Path> = workdir
        .ancestors()
        .take_while(|dir| !dir.exists())
        .collect();
    for dir in missing.iter().rev() {
        match fs::create_dir(dir) {
            Ok(()) => {
                if let Some(c) = creds {
                    give_dir(dir, c).map_err(fail)?;
                }
            }
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
            Err(err) => return Err(fail(err)),
        }
    }
    if workdir.is_dir() {
        Ok(())
    } else {
        Err(format!("workdir {}: not a directory", workdir.display()))
    }
}

/// Gives directory `dir` itself (not what a symlink there names) to `creds`.
fn give_dir(dir: &Path, creds: &Credentials) -> io::Result<()> {
    use rustix::fs::{Gid, Mode, OFlags, Uid};
    let fd = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    rustix::fs::fchown(
        &fd,
        Some(Uid::from_raw(creds.uid)),
        Some(Gid::from_raw(creds.gid)),
    )?;
    Ok(())
}

/// How the workload process is set up between `fork` and `execve`.
pub(crate) struct Setup<'a> {
    pub command: &'a Command,
    /// Credentials to switch to (`None`: stay as we are).
    pub creds: Option<&'a Credentials>,
    /// fds to install as stdin, stdout and stderr (`None`: already in place).
    pub stdio: Option<[RawFd; 3]>,
    /// Cgroup to join (`None`: none, or already joined by the init).
    pub cgroup: Option<&'a Cgroup>,
    /// A pidfd of the parent. Arm `PR_SET_PDEATHSIG(SIGKILL)` and check, through this fd,
    /// that the parent had not already died before (`None`: no parent-death signal).
    pub parent: Option<RawFd>,
    /// Value to restore in `/proc/self/oom_score_adj` (the init lowers its own).
    pub oom_score_adj: Option<&'a str>,
    /// Confine the workload: no capabilities at all, and these seccomp filters.
    pub confine: Option<&'a Filters>,
}

/// Runs in the forked child: sets the process up and execs the workload. Returns only on
/// failure, with the message to report.
pub(crate) fn exec_workload(setup: &Setup<'_>) -> String {
    // Signals stay blocked until just before execve, so nothing kills us half set up
    // without being reported as a signal death.
    sys::reset_signal_dispositions();
    // Own session and process group: the shim can kill leftovers by group.
    let _ = rustix::process::setsid();
    if let Some(fds) = setup.stdio {
        for (target, fd) in fds.into_iter().enumerate() {
            if let Err(err) = sys::dup2(fd, target as RawFd) {
                return format!("setting up stdio: {}", describe(&err));
            }
        }
    }
    if let Some(value) = setup.oom_score_adj {
        let _ = fs::write("/proc/self/oom_score_adj", value);
    }
    if let Some(cgroup) = setup.cgroup {
        if let Err(err) = cgroup.join() {
            return format!("joining cgroup: {err}");
        }
    }
    if setup.confine.is_some() {
        if let Err(err) = sandbox::drop_bounding_capabilities() {
            return format!("dropping capabilities: {}", describe(&err));
        }
    }
    if let Some(c) = setup.creds {
        if let Err(err) = sys::set_credentials(c.uid, c.gid, &c.groups) {
            return format!(
                "switching to uid {} gid {}: {}",
                c.uid,
                c.gid,
                describe(&err)
            );
        }
    }
    // After the credential change, which clears the parent-death signal.
    if let Some(parent) = setup.parent {
        if let Err(err) = arm_parent_death_signal(parent) {
            return err;
        }
    }
    if let Err(err) = rustix::process::chdir(setup.command.workdir.as_c_str()) {
        let workdir = setup.command.workdir.to_string_lossy();
        return format!("workdir {workdir}: {}", describe(&err.into()));
    }
    if let Err(err) = rustix::thread::set_no_new_privs(true) {
        return format!("setting no_new_privs: {}", describe(&err.into()));
    }
    if setup.confine.is_some() {
        if let Err(err) = sandbox::clear_capabilities() {
            return format!("dropping capabilities: {}", describe(&err));
        }
    }
    if let Err(err) = SigSet::empty().set_mask() {
        return format!("unblocking signals: {}", describe(&err));
    }
    // Last: from here on only what the workload may do is allowed.
    if let Some(filters) = setup.confine {
        if let Err(err) = filters.install() {
            return err;
        }
    }
    setup.command.exec()
}

/// Arms `PR_SET_PDEATHSIG(SIGKILL)`, then checks that the parent (via its pidfd) had not
/// already exited before it was armed: the signal would then never come.
pub(crate) fn arm_parent_death_signal(parent_pidfd: RawFd) -> Result<(), String> {
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL))
        .map_err(|err| format!("setting the parent-death signal: {}", describe(&err.into())))?;
    // SAFETY: the fd stays open for the duration of this borrow.
    let parent = unsafe { std::os::fd::BorrowedFd::borrow_raw(parent_pidfd) };
    if sys::is_readable(parent) {
        return Err("the shim exited during launch".into());
    }
    Ok(())
}

/// An error's description as a lowercase phrase without the "(os error N)" suffix.
pub(crate) fn describe(err: &io::Error) -> String {
    let text = err.to_string();
    let text = text.split(" (os error").next().unwrap_or(&text);
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(argv: &[&str], path: Option<&str>) -> ShimSpec {
        ShimSpec {
            machine_id: "m".into(),
            run_id: 1,
            argv: argv.iter().map(|s| s.to_string()).collect(),
            env: path
                .map(|p| ("PATH".to_owned(), p.to_owned()))
                .into_iter()
                .collect(),
            workdir: "/".into(),
            user: None,
            hostname: String::new(),
            isolate: false,
            memory_mb: 0,
            cpus: 0.0,
            cgroup: None,
            log_path: "/tmp/x.log".into(),
            log_max_bytes: 0,
            sandbox: None,
            cgroup_layout: None,
            signal_argv: None,
        }
    }

    fn candidates(cmd: &Command) -> Vec<String> {
        cmd.candidates
            .iter()
            .map(|c| c.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn path_search_uses_the_spec_path_or_the_default() {
        let cmd = Command::new(&spec(&["sleep", "1"], Some("/a:/b/::/c"))).unwrap();
        assert_eq!(candidates(&cmd), ["/a/sleep", "/b/sleep", "/c/sleep"]);
        let cmd = Command::new(&spec(&["sleep"], None)).unwrap();
        assert_eq!(candidates(&cmd).len(), DEFAULT_PATH.split(':').count());
        let cmd = Command::new(&spec(&["./run.sh"], Some("/a"))).unwrap();
        assert_eq!(candidates(&cmd), ["./run.sh"]);
    }

    #[test]
    fn workdir_is_created_with_its_missing_parents() {
        let dir = tempfile::tempdir().unwrap();
        let workdir = dir.path().join("a/b/c");
        prepare_workdir(&workdir, None).unwrap();
        assert!(workdir.is_dir());
        prepare_workdir(&workdir, None).unwrap();
        let file = dir.path().join("file");
        fs::write(&file, "").unwrap();
        assert!(prepare_workdir(&file, None)
            .unwrap_err()
            .contains("not a directory"));
    }

    #[test]
    fn describe_drops_the_errno_suffix() {
        let err = io::Error::from_raw_os_error(libc::EACCES);
        assert_eq!(describe(&err), "permission denied");
    }
}
