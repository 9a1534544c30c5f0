//! The agent side of a shim: [`ShimHandle`] starts a shim ([`ShimHandle::spawn`]) or
//! re-attaches to a live one after an agent restart ([`ShimHandle::adopt`]), and then signals,
//! kills, freezes and awaits the run.
//!
//! Processes are referred to by pidfds, opened only after checking the `/proc` start time
//! recorded by the shim, so a recycled pid is never signalled. Whether a shim is alive is
//! decided by its lock on `RUN_DIR/shim.lock`, never by its pid alone.

use std::fmt;
use std::fs::{self, File};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rustix::fs::FlockOperation;
use rustix::io::Errno;
use rustix::process::{Pid, PidfdFlags, Signal, WaitId, WaitIdOptions};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncReadExt, Interest};

use crate::cgroup::Cgroup;
use crate::files::{self, PidRecord, Ready};
use crate::{sys, ShimError, ShimSpec, LOCK_FILE, SPEC_FILE};

/// How long `spawn` waits for the shim to report. A launch takes milliseconds; this bounds
/// a shim stuck on, say, an unresponsive filesystem.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `adopt` waits for a shim that is still launching to record its workload (the
/// launch phase is milliseconds long).
const ADOPT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long `spawn` waits for a shim that reported a launch failure to exit (it exits at once).
const FAILED_EXIT_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest readiness line accepted from a shim.
const MAX_READY_LINE: usize = 64 * 1024;

/// The agent's handle on one shim and its run.
///
/// Dropping the handle leaves the shim running (re-attach with [`ShimHandle::adopt`]). A
/// shim started by [`ShimHandle::spawn`] is a child of the agent: it is reaped by
/// [`ShimHandle::wait`], or in the background when the handle is dropped inside a tokio
/// runtime.
pub struct ShimHandle {
    run_dir: PathBuf,
    run_id: u64,
    cgroup: Option<String>,
    pids: PidRecord,
    /// `shim` registered with the tokio reactor, made on the first `wait`: the descriptor
    /// itself, not a duplicate (one fewer open file per machine: the agent's open-file limit
    /// bounds how many machines a host holds, issue 36). Declared before `shim`, so it is
    /// dropped (deregistered) before `shim` is closed.
    exit_watch: OnceLock<AsyncFd<ShimFd>>,
    /// pidfd of the shim.
    shim: OwnedFd,
    /// pidfd of the init of an isolated run (while it lives).
    init: Option<OwnedFd>,
    /// pidfd of the workload (while it lives).
    workload: Option<OwnedFd>,
    /// The shim is our child (we spawned it) and must be reaped.
    child: bool,
    /// The shim delivers the signals it forwards itself (`ShimSpec::signal_argv`).
    signals_through_shim: bool,
}

impl fmt::Debug for ShimHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShimHandle")
            .field("run_dir", &self.run_dir)
            .field("run_id", &self.run_id)
            .field("shim_pid", &self.pids.shim_pid)
            .field("init_pid", &self.pids.init_pid)
            .field("workload_pid", &self.pids.workload_pid)
            .field("cgroup", &self.cgroup)
            .finish_non_exhaustive()
    }
}

impl ShimHandle {
    /// Writes `RUN_DIR/spec.json` and starts `exe shim RUN_DIR` in its own session, with
    /// stdin and stderr on `/dev/null` and stdout on a pipe where the shim reports one
    /// readiness line. Returns once the workload has been exec'd.
    ///
    /// # Errors
    ///
    /// [`ShimError::Launch`] with the shim's message if the workload could not be started
    /// (its `exit.json` then holds the same `error`, and the shim has exited); [`ShimError::Busy`] if a live shim
    /// holds `run_dir`; [`ShimError::Spec`] for an invalid spec; [`ShimError::Io`] if the
    /// shim could not be started.
    pub async fn spawn(
        exe: &Path,
        run_dir: &Path,
        spec: &ShimSpec,
    ) -> Result<ShimHandle, ShimError> {
        Self::spawn_with_env(exe, run_dir, spec, &[]).await
    }

    /// [`ShimHandle::spawn`], with `secret_env` added to the workload's environment (replacing
    /// variables of the same name) without being written to `spec.json`: the shim reads it
    /// from a pipe on its stdin (app secrets; they reach no file).
    ///
    /// # Errors
    ///
    /// As [`ShimHandle::spawn`]; [`ShimError::Spec`] for an invalid name or a NUL byte
    /// (the message names the variable, never its value).
    pub async fn spawn_with_env(
        exe: &Path,
        run_dir: &Path,
        spec: &ShimSpec,
        secret_env: &[(String, String)],
    ) -> Result<ShimHandle, ShimError> {
        files::validate(spec)?;
        files::validate_env(secret_env)?;
        let run_dir =
            std::path::absolute(run_dir).map_err(ShimError::io("resolving the run directory"))?;
        fs::create_dir_all(&run_dir)
            .map_err(ShimError::io(format!("creating {}", run_dir.display())))?;
        if lock_held(&run_dir)? {
            return Err(ShimError::Busy(run_dir));
        }
        let spec_json = serde_json::to_vec(spec).map_err(|err| ShimError::Spec(err.to_string()))?;
        files::write_atomic(&run_dir.join(SPEC_FILE), &spec_json, false)
            .map_err(ShimError::io(format!("writing {SPEC_FILE}")))?;
        let spec_written = crate::monotonic_us();

        let (ready_r, ready_w) =
            sys::pipe().map_err(ShimError::io("creating the readiness pipe"))?;
        // Plain std spawn (posix_spawn, cheap even from a large agent). The shim is our
        // child, but nothing ties its life to ours: it calls setsid and we set no
        // parent-death signal. It is reaped through its pidfd.
        let (stdin, env_pipe) = if secret_env.is_empty() {
            (Stdio::null(), None)
        } else {
            let (r, w) = sys::pipe().map_err(ShimError::io("creating the environment pipe"))?;
            (Stdio::from(r), Some(w))
        };
        let child = std::process::Command::new(exe)
            .arg("shim")
            .arg(&run_dir)
            .env_clear()
            .stdin(stdin)
            .stdout(Stdio::from(ready_w))
            .stderr(Stdio::null())
            .spawn()
            .map_err(ShimError::io(format!("starting {}", exe.display())))?;
        let spawned = crate::monotonic_us();
        let shim_pid =
            Pid::from_raw(child.id() as i32).ok_or(ShimError::Spec("shim pid 0".into()))?;
        drop(child);
        if let Some(mut pipe) = env_pipe {
            // Written from a thread: more than a pipe's buffer would block until the shim
            // reads it, which it does first thing. A shim that died early closes the pipe.
            let json = serde_json::to_vec(secret_env).expect("pairs of strings are JSON");
            std::thread::spawn(move || {
                use std::io::Write as _;
                let _ = pipe.write_all(&json);
            });
        }
        // Our unreaped child: its pid cannot be reused, so no start-time check is needed.
        let shim = rustix::process::pidfd_open(shim_pid, PidfdFlags::empty())
            .map_err(|err| ShimError::Io("opening the shim's pidfd".into(), err.into()))?;

        let ready = tokio::time::timeout(READY_TIMEOUT, read_ready(ready_r)).await;
        let mut pids = match ready {
            Ok(Ok(Ready::Started(pids))) => pids,
            Ok(Ok(Ready::Failed(msg))) => {
                // The shim exits right after reporting; wait for it, so that the run directory
                // is free again when we return.
                if let Some(watch) = watch_pidfd(shim) {
                    let _ = tokio::time::timeout(FAILED_EXIT_TIMEOUT, watch.readable()).await;
                    reap_later(watch.into_inner());
                }
                return Err(ShimError::Launch(msg));
            }
            Ok(Err(err)) => {
                let _ = rustix::process::pidfd_send_signal(&shim, Signal::KILL);
                reap_later(shim);
                return Err(err);
            }
            Err(_) => {
                let _ = rustix::process::pidfd_send_signal(&shim, Signal::KILL);
                reap_later(shim);
                return Err(ShimError::Timeout(format!(
                    "the shim did not report within {READY_TIMEOUT:?}"
                )));
            }
        };
        let shim_marks = std::mem::take(&mut pids.marks);
        // The shim may start (and mark) before this thread sees the spawn return: it was
        // spawned by its first mark.
        let spawned = shim_marks
            .iter()
            .map(|(_, us)| *us)
            .min()
            .map_or(spawned, |first| spawned.min(first));
        pids.marks = [("spec_written", spec_written), ("spawned", spawned)]
            .into_iter()
            .map(|(step, us)| (step.to_owned(), us))
            .chain(shim_marks)
            .chain([("ready".to_owned(), crate::monotonic_us())])
            .collect();
        Ok(ShimHandle {
            run_dir,
            run_id: spec.run_id,
            cgroup: spec.cgroup.clone(),
            init: open_pidfd(pids.init_pid, pids.init_start),
            workload: open_pidfd(pids.workload_pid, pids.workload_start),
            pids,
            shim,
            child: true,
            signals_through_shim: spec.signal_argv.is_some(),
            exit_watch: OnceLock::new(),
        })
    }

    /// Re-attaches to the live shim of `run_dir` (after an agent restart). `Ok(None)` if no
    /// live shim holds the directory's lock (none was started, it has exited, or it is so
    /// new that it has not taken the lock yet).
    ///
    /// A shim still launching its workload is waited for: this may block the calling thread
    /// for the length of a launch (milliseconds), at most 2 s.
    ///
    /// # Errors
    ///
    /// [`ShimError::Spec`] if `spec.json` is unreadable; [`ShimError::Timeout`] if the shim
    /// stays in its launch phase; [`ShimError::Io`] if the lock cannot be probed.
    pub fn adopt(run_dir: &Path) -> Result<Option<ShimHandle>, ShimError> {
        let run_dir =
            std::path::absolute(run_dir).map_err(ShimError::io("resolving the run directory"))?;
        if !lock_held(&run_dir)? {
            return Ok(None);
        }
        let spec_path = run_dir.join(SPEC_FILE);
        let spec: ShimSpec = fs::read(&spec_path)
            .map_err(|err| ShimError::Spec(format!("{}: {err}", spec_path.display())))
            .and_then(|bytes| {
                serde_json::from_slice(&bytes).map_err(|err| ShimError::Spec(err.to_string()))
            })?;
        let deadline = Instant::now() + ADOPT_TIMEOUT;
        loop {
            // The record may not say `running` yet, or still be a previous run's.
            let record = PidRecord::read(&run_dir).filter(|p| p.running && p.run_id == spec.run_id);
            if let Some(pids) = record {
                if let Some(shim) = open_pidfd(Some(pids.shim_pid), Some(pids.shim_start)) {
                    // The pidfd pins the process; if the lock is still held now, it is by
                    // this shim, which is therefore alive (or a zombie we can still await).
                    if !lock_held(&run_dir)? {
                        return Ok(None);
                    }
                    return Ok(Some(ShimHandle {
                        run_dir,
                        run_id: spec.run_id,
                        cgroup: spec.cgroup,
                        init: open_pidfd(pids.init_pid, pids.init_start),
                        workload: open_pidfd(pids.workload_pid, pids.workload_start),
                        pids,
                        shim,
                        child: false,
                        exit_watch: OnceLock::new(),
                        signals_through_shim: spec.signal_argv.is_some(),
                    }));
                }
            }
            if !lock_held(&run_dir)? {
                return Ok(None);
            }
            if Instant::now() >= deadline {
                return Err(ShimError::Timeout(format!(
                    "the shim of {} is still launching",
                    run_dir.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The pid of the shim process.
    pub fn shim_pid(&self) -> i32 {
        self.pids.shim_pid
    }

    /// When each step of this run's launch ended ([`crate::monotonic_us`]), in order: the
    /// agent's side of the spawn, the shim's and its init's steps, and `ready` (the report
    /// read). An adopted run has the shim's and the init's only.
    pub fn launch_marks(&self) -> &[(String, u64)] {
        &self.pids.marks
    }

    /// The host pid of the workload process; 0 in the rare case of an isolated workload that
    /// exited before the shim could see its pid.
    pub fn workload_pid(&self) -> i32 {
        self.pids.workload_pid.unwrap_or(0)
    }

    /// The host pid of the mini init of an isolated run.
    pub fn init_pid(&self) -> Option<i32> {
        self.pids.init_pid
    }

    /// The run id from the spec.
    pub fn run_id(&self) -> u64 {
        self.run_id
    }

    /// The run directory (absolute).
    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    /// Sends `sig` to the workload. In an isolated run it goes through the init, which
    /// forwards it, except SIGKILL and SIGSTOP, which cannot be forwarded and go straight to
    /// the workload; with a [`ShimSpec::signal_argv`], the signals the shim forwards go to
    /// the shim, which delivers them with that command.
    ///
    /// # Errors
    ///
    /// [`ShimError::NotRunning`] if the target has exited; [`ShimError::Spec`] for an
    /// unknown signal number.
    pub fn signal(&self, sig: i32) -> Result<(), ShimError> {
        let signal = Signal::from_named_raw(sig)
            .ok_or_else(|| ShimError::Spec(format!("unknown signal {sig}")))?;
        let target = if signal == Signal::KILL || signal == Signal::STOP {
            self.workload.as_ref().or(self.init.as_ref())
        } else if self.signals_through_shim && crate::supervisor::FORWARDED.contains(&sig) {
            // The shim runs the command that delivers it (`runsc kill`).
            Some(&self.shim)
        } else {
            self.init.as_ref().or(self.workload.as_ref())
        };
        let fd = target.ok_or(ShimError::NotRunning)?;
        match rustix::process::pidfd_send_signal(fd, signal) {
            Ok(()) => Ok(()),
            Err(Errno::SRCH) => Err(ShimError::NotRunning),
            Err(err) => Err(ShimError::Io(format!("sending signal {sig}"), err.into())),
        }
    }

    /// Kills the whole run at once: SIGKILL to everything in its cgroup, its init and its
    /// workload. The shim then records the exit and exits. Idempotent.
    ///
    /// # Errors
    ///
    /// None at present; the signature leaves room for reporting cgroup failures.
    pub fn kill(&self) -> Result<(), ShimError> {
        if let Some(cgroup) = self
            .cgroup
            .as_deref()
            .and_then(|rel| Cgroup::open(rel).ok())
        {
            cgroup.kill_all();
        }
        for fd in [&self.init, &self.workload].into_iter().flatten() {
            let _ = rustix::process::pidfd_send_signal(fd, Signal::KILL);
        }
        Ok(())
    }

    /// Freezes every process of the run (cgroup freezer) and waits until they are frozen.
    ///
    /// # Errors
    ///
    /// [`ShimError::NoCgroup`] if the run has no cgroup; [`ShimError::Io`] if the freezer
    /// fails or the run does not freeze within 2 s.
    pub fn freeze(&self) -> Result<(), ShimError> {
        let cgroup = self.run_cgroup()?;
        cgroup.freeze().map_err(|err| {
            // Not left half frozen: the run goes on as it was.
            let _ = cgroup.thaw();
            ShimError::io("freezing the run")(err)
        })
    }

    /// Thaws a run frozen by [`ShimHandle::freeze`].
    ///
    /// # Errors
    ///
    /// As for [`ShimHandle::freeze`].
    pub fn thaw(&self) -> Result<(), ShimError> {
        self.run_cgroup()?
            .thaw()
            .map_err(ShimError::io("thawing the run"))
    }

    fn run_cgroup(&self) -> Result<Cgroup, ShimError> {
        let rel = self.cgroup.as_deref().ok_or(ShimError::NoCgroup)?;
        Cgroup::open(rel).map_err(ShimError::Spec)
    }

    /// Returns true once the shim process has exited.
    pub fn has_exited(&self) -> bool {
        sys::is_readable(self.shim.as_fd())
    }

    /// Resolves when the shim process has exited (its `exit.json` is then final). Cancel-safe;
    /// may be called again, and from several tasks. Must be called within a tokio runtime.
    pub async fn wait(&self) {
        match self.exit_watch() {
            Some(watch) => {
                // A pidfd becomes readable when the process exits and stays readable.
                let _ = watch.readable().await;
            }
            None => {
                while !self.has_exited() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
        self.reap();
    }

    fn exit_watch(&self) -> Option<&AsyncFd<ShimFd>> {
        if let Some(watch) = self.exit_watch.get() {
            return Some(watch);
        }
        // SAFETY: `self.shim` stays open, and is the same descriptor, for as long as the
        // watch lives: the handle owns both and drops the watch first (field order). Of
        // calls racing here only one registers (the reactor refuses the same descriptor
        // twice: the others poll), and that one is kept.
        let watch = unsafe {
            AsyncFd::register_with_interest(ShimFd(self.shim.as_raw_fd()), Interest::READABLE)
        }
        .ok()?;
        Some(self.exit_watch.get_or_init(|| watch))
    }

    /// Reaps the shim if it is our child and has exited (harmless otherwise).
    fn reap(&self) {
        if self.child {
            let _ = rustix::process::waitid(
                WaitId::PidFd(self.shim.as_fd()),
                WaitIdOptions::EXITED | WaitIdOptions::NOHANG,
            );
        }
    }
}

impl Drop for ShimHandle {
    fn drop(&mut self) {
        if !self.child || self.has_exited() {
            self.reap();
            return;
        }
        if let Ok(dup) = self.shim.try_clone() {
            reap_later(dup);
        }
    }
}

/// Reaps our child shim `pidfd` once it exits, from a background task (when in a runtime;
/// otherwise it stays a zombie until the agent exits).
fn reap_later(pidfd: OwnedFd) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        if let Some(watch) = watch_pidfd(pidfd) {
            let _ = watch.readable().await;
            let _ = rustix::process::waitid(
                WaitId::PidFd(watch.get_ref().as_fd()),
                WaitIdOptions::EXITED | WaitIdOptions::NOHANG,
            );
        }
    });
}

/// The number of a [`ShimHandle`]'s shim pidfd, which the handle owns (and closes only
/// after the reactor's watch on it is gone).
struct ShimFd(RawFd);

impl AsRawFd for ShimFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// Registers `pidfd` with the current tokio reactor (which must exist).
fn watch_pidfd(pidfd: OwnedFd) -> Option<AsyncFd<OwnedFd>> {
    // SAFETY: an OwnedFd keeps its fd open, and always returns the same one, for as long as
    // it is owned by the AsyncFd.
    unsafe { AsyncFd::register_with_interest(pidfd, Interest::READABLE) }.ok()
}

/// Reads the shim's readiness line.
async fn read_ready(pipe: File) -> Result<Ready, ShimError> {
    let mut pipe = tokio::net::unix::pipe::Receiver::from_file(pipe)
        .map_err(ShimError::io("readiness pipe"))?;
    let mut line = Vec::with_capacity(256);
    let mut chunk = [0u8; 1024];
    loop {
        let n = pipe
            .read(&mut chunk)
            .await
            .map_err(ShimError::io("reading the readiness pipe"))?;
        if n == 0 {
            return Err(ShimError::Launch(
                "the shim exited without reporting".into(),
            ));
        }
        line.extend_from_slice(&chunk[..n]);
        if let Some(end) = line.iter().position(|&b| b == b'\n') {
            return serde_json::from_slice(&line[..end]).map_err(|err| {
                ShimError::Launch(format!("unreadable report from the shim: {err}"))
            });
        }
        if line.len() > MAX_READY_LINE {
            return Err(ShimError::Launch("oversized report from the shim".into()));
        }
    }
}

/// Opens a pidfd for `pid` if it is still the process that started at `start`.
fn open_pidfd(pid: Option<i32>, start: Option<u64>) -> Option<OwnedFd> {
    let pid = pid.and_then(Pid::from_raw)?;
    let fd = rustix::process::pidfd_open(pid, PidfdFlags::empty()).ok()?;
    // Checked after opening: the pidfd now pins the process we compare.
    if let Some(start) = start {
        if sys::start_time(pid.as_raw_nonzero().get()).ok()? != start {
            return None;
        }
    }
    Some(fd)
}

/// Whether a live shim holds `RUN_DIR/shim.lock`. Probing takes the lock for an instant.
fn lock_held(run_dir: &Path) -> Result<bool, ShimError> {
    let path = run_dir.join(LOCK_FILE);
    let file = match File::open(&path) {
        Ok(file) => file,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(err) => return Err(ShimError::Io(format!("opening {}", path.display()), err)),
    };
    match rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
        // Released when `file` is closed.
        Ok(()) => Ok(false),
        Err(Errno::WOULDBLOCK) => Ok(true),
        Err(err) => Err(ShimError::Io(
            format!("probing {}", path.display()),
            err.into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_can_be_shared_across_tasks() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<ShimHandle>();
    }

    #[test]
    fn lock_probe_sees_only_a_held_lock() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!lock_held(dir.path()).unwrap(), "no lock file");
        let file = File::create(dir.path().join(LOCK_FILE)).unwrap();
        assert!(!lock_held(dir.path()).unwrap(), "lock file, not locked");
        rustix::fs::flock(&file, FlockOperation::LockExclusive).unwrap();
        assert!(lock_held(dir.path()).unwrap());
        drop(file);
        assert!(!lock_held(dir.path()).unwrap(), "released with the holder");
    }

    #[test]
    fn pidfds_are_only_opened_for_the_recorded_process() {
        let me = std::process::id() as i32;
        let start = sys::start_time(me).unwrap();
        assert!(open_pidfd(Some(me), Some(start)).is_some());
        assert!(
            open_pidfd(Some(me), Some(start + 1)).is_none(),
            "a reused pid"
        );
        assert!(open_pidfd(None, None).is_none());
    }
}
