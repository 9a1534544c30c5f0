//! `bazaar shim-exec RUN_DIR ARGV...`: runs a command inside a live run, as its workload
//! runs: in the run's cgroup, in its namespaces (mount, pid, network, uts, ipc: those of the
//! run's init), as its user, with its environment (as the workload started with it) and working directory, and for a
//! sandboxed run without capabilities and under the same seccomp filter. The agent's
//! `machine exec` runs it with pipes for stdio; it exits with the command's status (or
//! dies of the command's signal).

use std::path::Path;
use std::time::{Duration, Instant};

use rustix::process::{Pid, PidfdFlags};
use rustix::thread::ThreadNameSpaceType;

use crate::cgroup::Cgroup;
use crate::files::PidRecord;
use crate::launch::{self, describe, Command, Setup};
use crate::seccomp::Filters;
use crate::sys::{self, Forked};
use crate::{user, ShimSpec, SPEC_FILE};

/// Exit status when the command could not be started (as the shell's "command not found").
const NOT_STARTED: i32 = launch::LAUNCH_FAILED;

/// The body of `bazaar shim-exec`. Must be called before any thread is started.
pub fn exec_main(run_dir: &Path, argv: &[String]) -> ! {
    match run(run_dir, argv) {
        Ok(status) => {
            let (code, signal) = sys::decode_status(status);
            if let Some(sig) = signal {
                // Die of the same signal, so that the caller sees it.
                sys::reset_signal_dispositions();
                let _ = sys::kill(rustix::process::getpid().as_raw_nonzero().get(), sig);
            }
            sys::exit_now(code.unwrap_or(NOT_STARTED))
        }
        Err(msg) => {
            let _ = sys::write_all_fd(libc::STDERR_FILENO, format!("{msg}\n").as_bytes());
            sys::exit_now(NOT_STARTED)
        }
    }
}

/// The command runs with the environment the workload started with: `spec.json`'s, and what
/// the agent passed on a pipe and never wrote down (app secrets), read from the workload's
/// `/proc/PID/environ` (checked to be the recorded process). Its values win.
fn add_workload_env(spec: &mut ShimSpec, pids: &PidRecord) {
    let (Some(pid), Some(start)) = (pids.workload_pid, pids.workload_start) else {
        return;
    };
    let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return;
    };
    if sys::start_time(pid).ok() != Some(start) {
        return;
    }
    for entry in environ.split(|b| *b == 0) {
        let Ok(entry) = std::str::from_utf8(entry) else {
            continue;
        };
        let Some((name, value)) = entry.split_once('=') else {
            continue;
        };
        match spec.env.iter_mut().find(|(n, _)| n == name) {
            Some(pair) => pair.1 = value.to_string(),
            None => spec.env.push((name.to_string(), value.to_string())),
        }
    }
}

/// How long an exec waits for the run's pid record to be written.
const PIDS_PATIENCE: Duration = Duration::from_secs(2);

/// The pid record of run `run_id`. The shim writes it just after it has told the agent the
/// run started (`supervisor.rs`, so that a start waits for no file write), so an exec that
/// comes right after a start may find no record yet, or the previous run's: it waits for
/// this run's, at most `patience`. A record of this run that says it stopped, or of a later
/// run, means the process is gone.
fn pids_of_run(run_dir: &Path, run_id: u64, patience: Duration) -> Result<PidRecord, String> {
    let gone = || "the machine's process is gone".to_owned();
    let deadline = Instant::now() + patience;
    loop {
        match PidRecord::read(run_dir) {
            Some(p) if p.run_id == run_id => return if p.running { Ok(p) } else { Err(gone()) },
            Some(p) if p.run_id > run_id => return Err(gone()),
            // Not written yet, or the previous run's.
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => return Err(gone()),
        }
    }
}

fn run(run_dir: &Path, argv: &[String]) -> Result<i32, String> {
    let path = run_dir.join(SPEC_FILE);
    let bytes = std::fs::read(&path)
        .map_err(|err| format!("reading {}: {}", path.display(), describe(&err)))?;
    let mut spec: ShimSpec = serde_json::from_slice(&bytes)
        .map_err(|err| format!("parsing {}: {err}", path.display()))?;
    let pids = pids_of_run(run_dir, spec.run_id, PIDS_PATIENCE)?;
    add_workload_env(&mut spec, &pids);
    let (euid, egid) = sys::effective_ids();
    let creds = user::resolve(spec.user.as_deref(), euid, egid)?;
    let command = Command::with_argv(&spec, argv)?;
    let filters = spec
        .sandbox
        .as_ref()
        .map(Filters::for_sandbox)
        .transpose()?;
    crate::cgroup::adopt(spec.cgroup_layout.as_ref());
    if let Some(rel) = &spec.cgroup {
        Cgroup::open(rel)?
            .join()
            .map_err(|err| format!("joining cgroup: {}", describe(&err)))?;
    }
    if let (Some(init), Some(start)) = (pids.init_pid, pids.init_start) {
        let gone = || "the machine's process is gone".to_owned();
        let pid = Pid::from_raw(init).ok_or_else(gone)?;
        let pidfd = rustix::process::pidfd_open(pid, PidfdFlags::empty()).map_err(|_| gone())?;
        // Checked after opening: the pidfd now pins the process compared.
        if sys::start_time(init).ok() != Some(start) {
            return Err(gone());
        }
        let spaces = ThreadNameSpaceType::MOUNT
            | ThreadNameSpaceType::PROCESS_ID
            | ThreadNameSpaceType::NETWORK
            | ThreadNameSpaceType::HOST_NAME_AND_NIS_DOMAIN_NAME
            | ThreadNameSpaceType::INTER_PROCESS_COMMUNICATION;
        rustix::thread::move_into_thread_name_spaces(std::os::fd::AsFd::as_fd(&pidfd), spaces)
            .map_err(|err| {
                format!(
                    "entering the machine's namespaces: {}",
                    describe(&err.into())
                )
            })?;
    }
    let me = rustix::process::pidfd_open(rustix::process::getpid(), PidfdFlags::empty())
        .map_err(|err| format!("pidfd: {}", describe(&err.into())))?;
    let (mut exec_r, exec_w) = sys::pipe().map_err(|err| format!("pipe: {}", describe(&err)))?;
    // SAFETY: this process is single-threaded; the child ends in execve or exit_now.
    match unsafe { sys::fork() } {
        Err(err) => Err(format!("fork: {}", describe(&err))),
        Ok(Forked::Child) => {
            let setup = Setup {
                command: &command,
                creds: creds.as_ref(),
                stdio: None,
                cgroup: None,
                parent: Some(std::os::fd::AsRawFd::as_raw_fd(&me)),
                oom_score_adj: None,
                confine: filters.as_ref(),
            };
            let msg = launch::exec_workload(&setup);
            let _ = sys::write_all_fd(std::os::fd::AsRawFd::as_raw_fd(&exec_w), msg.as_bytes());
            sys::exit_now(NOT_STARTED);
        }
        Ok(Forked::Parent(pid)) => {
            drop(exec_w);
            let mut msg = String::new();
            let _ = std::io::Read::read_to_string(&mut exec_r, &mut msg);
            let status = sys::wait_child(pid).map_err(|err| format!("wait: {}", describe(&err)))?;
            if msg.is_empty() {
                Ok(status)
            } else {
                Err(msg)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(run_id: u64, running: bool) -> Vec<u8> {
        serde_json::to_vec(&PidRecord {
            run_id,
            shim_pid: 1,
            shim_start: 1,
            init_pid: None,
            init_start: None,
            workload_pid: Some(2),
            workload_start: Some(2),
            running,
            marks: Vec::new(),
        })
        .unwrap()
    }

    /// An exec right after a start (the agent told the run started, the shim has not
    /// written its pid record yet) waits for the record instead of saying the process is
    /// gone; a record of this run that stopped, or of a later run, is gone at once.
    #[test]
    fn an_exec_right_after_a_start_waits_for_the_runs_pid_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(crate::PID_FILE);
        std::fs::write(&path, record(6, true)).unwrap();
        let writer = {
            let path = path.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                std::fs::write(path, record(7, true)).unwrap();
            })
        };
        let found = pids_of_run(dir.path(), 7, Duration::from_secs(10)).unwrap();
        assert_eq!((found.run_id, found.running), (7, true));
        writer.join().unwrap();

        std::fs::write(&path, record(7, false)).unwrap();
        let started = Instant::now();
        assert!(pids_of_run(dir.path(), 7, Duration::from_secs(10)).is_err());
        assert!(pids_of_run(dir.path(), 6, Duration::from_secs(10)).is_err());
        assert!(started.elapsed() < Duration::from_secs(5), "gone at once");
        std::fs::remove_file(&path).unwrap();
        assert!(pids_of_run(dir.path(), 7, Duration::from_millis(50)).is_err());
    }
}
