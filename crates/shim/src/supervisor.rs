//! The body of the shim process, `bazaar shim RUN_DIR`: take the run directory's lock, launch
//! the workload (directly, or under the mini init of an isolated run), report readiness to
//! the agent, log the workload's output, forward SIGTERM and friends, and when the workload
//! is gone clean up and write `exit.json`.
//!
//! The shim is single-threaded and event-driven: one `poll(2)` over a signalfd (SIGCHLD and
//! the forwarded signals) and the workload's stdout and stderr pipes. It must stay small
//! (about 2 MiB RSS): no runtime, no threads, small buffers.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::fs::FlockOperation;
use rustix::process::PidfdFlags;
use rustix::thread::UnshareFlags;

use crate::cgroup::Cgroup;
use crate::files::{self, PidRecord, Ready};
use crate::init::{self, Confined, InitMessage, InitSetup, StatusReader};
use crate::launch::{self, describe, Command, Setup};
use crate::log::{LogWriter, Stream};
use crate::seccomp::Filters;
use crate::sys::{self, Forked, SigSet};
use crate::{user, ExitRecord, ShimSpec, EXIT_FILE, LOCK_FILE, PID_FILE, SPEC_FILE};

/// Signals sent to the shim that it passes on to the workload, so that `kill <shim>` acts
/// like a stop. (SIGKILL of the shim kills the workload through the parent-death signal.)
pub(crate) const FORWARDED: &[i32] = &[
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];
/// After the workload exits, how long to wait for its output pipes to close. Leftover
/// processes holding them are killed first, so this only bounds pathological cases (a process
/// outside the cgroup that inherited the pipe).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
/// How long to retry taking the run directory's lock: an agent probing it with `adopt` holds
/// it for microseconds.
const LOCK_TIMEOUT: Duration = Duration::from_millis(100);
/// How long to wait for the `oom_kill` counter after a SIGKILL death: the kernel bumps it
/// right after sending the signal, so it is normally already there when we reap.
const OOM_SETTLE: Duration = Duration::from_millis(50);
/// The directory of RUN_DIR on which a sandboxed run's root is built (a mount point in the
/// run's own mount namespace only: empty on the host).
const SANDBOX_ROOT: &str = "root";
/// Read buffer for the workload's output.
const READ_CHUNK: usize = 8 * 1024;

/// The shim process body: `bazaar shim RUN_DIR`. Supervises one run and exits (status 0 once
/// `exit.json` is written, 1 if the shim could not even take charge of RUN_DIR).
///
/// Must be called before any thread is started: the shim forks.
pub fn shim_main(run_dir: &Path) -> ! {
    // Our own session: no signal for the agent's process group or terminal reaches us.
    let _ = rustix::process::setsid();
    // Nothing inherited beyond stdio (0, 1 = the readiness pipe, 2).
    sys::close_fds_from(3);
    let run_dir = std::path::absolute(run_dir).unwrap_or_else(|_| run_dir.to_path_buf());
    // Pin no directory of the agent's.
    let _ = rustix::process::chdir("/");
    sys::exit_now(run(&run_dir))
}

fn run(run_dir: &Path) -> i32 {
    // When each launch step ended, for `machine explain --timing`.
    let mut marks = vec![("shim_start".to_owned(), sys::monotonic_us())];
    let spec = match read_spec(run_dir) {
        Ok(spec) => spec,
        Err(msg) => {
            report(&Ready::Failed(msg));
            return 1;
        }
    };
    // Held until the process exits: a busy lock tells the agent this shim is alive.
    let _lock = match lock_run_dir(run_dir) {
        Ok(lock) => lock,
        Err(msg) => {
            report(&Ready::Failed(msg));
            return 1;
        }
    };
    // Records left by an earlier run of this directory would be mistaken for ours.
    let _ = fs::remove_file(run_dir.join(EXIT_FILE));
    let _ = fs::remove_file(run_dir.join(PID_FILE));
    marks.push(("shim_spec".to_owned(), sys::monotonic_us()));
    let launched = Run::launch(&spec, run_dir, &mut marks);
    let run = match launched {
        Ok(run) => run,
        Err(msg) => {
            let record = ExitRecord {
                run_id: spec.run_id,
                exit_code: None,
                signal: None,
                oom_killed: false,
                exited_at_ms: sys::now_ms(),
                error: Some(msg.clone()),
            };
            // Written before reporting, so the agent finds it when spawn returns the error.
            let _ = write_exit(run_dir, &record);
            report(&Ready::Failed(msg));
            return 0;
        }
    };
    let shim_pid = rustix::process::getpid().as_raw_nonzero().get();
    let pids = PidRecord {
        run_id: spec.run_id,
        shim_pid,
        shim_start: sys::start_time(shim_pid).unwrap_or_default(),
        init_pid: run.init,
        init_start: run.init.and_then(|pid| sys::start_time(pid).ok()),
        workload_pid: run.workload,
        workload_start: run.workload.and_then(|pid| sys::start_time(pid).ok()),
        running: true,
        marks,
    };
    drop(spec);
    report(&Ready::Started(pids.clone()));
    // For `adopt`, after the report (spawn is waiting). Written once, when final: `adopt`
    // polls until it appears, and replacing an existing file by rename would make ext4
    // flush it synchronously (auto_da_alloc).
    let _ = write_pids(run_dir, &pids);
    // The agent may be gone by the time we write anything else: stdout is /dev/null now.
    if let Ok(null) = sys::dev_null() {
        let _ = sys::dup2(null.as_raw_fd(), libc::STDOUT_FILENO);
    }
    // Only the event loop runs from here on: shed the memory touched while starting up.
    sys::trim_resident_memory();
    let record = run.supervise();
    if write_exit(run_dir, &record).is_err() {
        return 1;
    }
    0
}

fn read_spec(run_dir: &Path) -> Result<ShimSpec, String> {
    let path = run_dir.join(SPEC_FILE);
    let bytes =
        fs::read(&path).map_err(|err| format!("reading {}: {}", path.display(), describe(&err)))?;
    let mut spec: ShimSpec = serde_json::from_slice(&bytes)
        .map_err(|err| format!("parsing {}: {err}", path.display()))?;
    add_piped_env(&mut spec)?;
    Ok(spec)
}

/// Adds the variables the agent passed on a pipe as stdin (`ShimHandle::spawn_with_env`: app
/// secrets, kept out of `spec.json`) to the workload's environment, replacing those of the
/// same name. Stdin that is not a pipe (`/dev/null`) carries none.
fn add_piped_env(spec: &mut ShimSpec) -> Result<(), String> {
    let stdin = io::stdin();
    let is_pipe = rustix::fs::fstat(&stdin).is_ok_and(|st| {
        rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Fifo
    });
    if !is_pipe {
        return Ok(());
    }
    let mut bytes = Vec::new();
    stdin
        .lock()
        .read_to_end(&mut bytes)
        .map_err(|err| format!("reading the environment pipe: {}", describe(&err)))?;
    // Never echo the bytes: they hold secrets.
    let extra: Vec<(String, String)> = serde_json::from_slice(&bytes)
        .map_err(|_| "the environment pipe does not hold a list of name/value pairs".to_string())?;
    spec.env
        .retain(|(name, _)| !extra.iter().any(|(secret, _)| secret == name));
    spec.env.extend(extra);
    Ok(())
}

/// Takes the exclusive lock on RUN_DIR/shim.lock, retrying briefly (see [`LOCK_TIMEOUT`]).
fn lock_run_dir(run_dir: &Path) -> Result<File, String> {
    let path = run_dir.join(LOCK_FILE);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(|err| format!("opening {}: {}", path.display(), describe(&err)))?;
    let deadline = Instant::now() + LOCK_TIMEOUT;
    loop {
        match rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(file),
            Err(err) if err == rustix::io::Errno::WOULDBLOCK && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(err) if err == rustix::io::Errno::WOULDBLOCK => {
                return Err(format!(
                    "run directory {} is held by another shim",
                    run_dir.display()
                ));
            }
            Err(err) => {
                return Err(format!(
                    "locking {}: {}",
                    path.display(),
                    describe(&err.into())
                ))
            }
        }
    }
}

fn write_pids(run_dir: &Path, pids: &PidRecord) -> Result<(), String> {
    let bytes = serde_json::to_vec(pids).map_err(|err| err.to_string())?;
    files::write_atomic(&run_dir.join(PID_FILE), &bytes, false)
        .map_err(|err| format!("writing {PID_FILE}: {}", describe(&err)))
}

fn write_exit(run_dir: &Path, record: &ExitRecord) -> io::Result<()> {
    let bytes = serde_json::to_vec(record).map_err(io::Error::other)?;
    files::write_atomic(&run_dir.join(EXIT_FILE), &bytes, true)
}

/// Writes the readiness line on stdout, the pipe the agent waits on.
fn report(ready: &Ready) {
    if let Ok(mut line) = serde_json::to_string(ready) {
        line.push('\n');
        let _ = sys::write_all_fd(libc::STDOUT_FILENO, line.as_bytes());
    }
}

/// Starts `argv` with `SIGNAL_PLACEHOLDER` replaced by `sig`, without waiting
/// for it (the shim reaps it with its other children). Its output is dropped.
fn deliver(argv: &[String], sig: i32) -> io::Result<libc::pid_t> {
    let mut args = argv
        .iter()
        .map(|a| a.replace(crate::SIGNAL_PLACEHOLDER, &sig.to_string()));
    let program = args
        .next()
        .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        // Reaped by the event loop (`reap_any`), like every child.
        .map(|child| child.id() as libc::pid_t)
}

/// A launched run, supervised by [`Run::supervise`].
struct Run {
    run_id: u64,
    /// Our only direct child: the workload, or the init of an isolated run.
    child: libc::pid_t,
    /// The init of an isolated run.
    init: Option<libc::pid_t>,
    /// The workload (host pid); `None` if an isolated workload exited before we saw it.
    workload: Option<libc::pid_t>,
    /// Where the init of an isolated run reports the workload's exit status.
    status: Option<StatusReader>,
    /// SIGCHLD and the [`FORWARDED`] signals, blocked and read from here.
    signals: File,
    /// The workload's stdout and stderr pipes, until they reach end-of-file.
    outputs: [Option<File>; 2],
    log: LogWriter,
    cgroup: Option<Cgroup>,
    /// The cgroup's `oom_kill` counter before the run.
    oom_before: Option<u64>,
    /// How forwarded signals are delivered (`ShimSpec::signal_argv`).
    signal_argv: Option<Vec<String>>,
    /// The delivery command running now: one at a time, so signals arrive in the order
    /// they were sent (a SIGINT then a SIGTERM is not turned around).
    delivering: Option<libc::pid_t>,
    /// Signals waiting for the delivery before them to finish.
    queued: std::collections::VecDeque<i32>,
}

impl Run {
    /// Prepares everything and starts the workload; returns once it was exec'd. On failure,
    /// returns the message for the agent, and nothing is left behind.
    fn launch(
        spec: &ShimSpec,
        run_dir: &Path,
        marks: &mut Vec<(String, u64)>,
    ) -> Result<Run, String> {
        files::validate(spec).map_err(|err| err.to_string())?;
        let (euid, egid) = sys::effective_ids();
        let confined = match &spec.sandbox {
            None => None,
            Some(_) if !spec.isolate || euid != 0 => {
                return Err("a sandboxed run needs root and isolation".into())
            }
            Some(sandbox) => {
                let staging = run_dir.join(SANDBOX_ROOT);
                match fs::create_dir(&staging) {
                    Ok(()) => {}
                    Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(err) => {
                        return Err(format!(
                            "creating {}: {}",
                            staging.display(),
                            describe(&err)
                        ))
                    }
                }
                let filters = Filters::for_sandbox(sandbox)?;
                marks.push(("seccomp_load".to_owned(), sys::monotonic_us()));
                Some((staging, filters))
            }
        };
        let creds = user::resolve(spec.user.as_deref(), euid, egid)?;
        let command = Command::new(spec)?;
        launch::prepare_workdir(&spec.workdir, creds.as_ref())?;
        let log = LogWriter::open(&spec.log_path, spec.log_max_bytes)
            .map_err(|err| format!("log {}: {}", spec.log_path.display(), describe(&err)))?;
        crate::cgroup::adopt(spec.cgroup_layout.as_ref());
        let cgroup = match &spec.cgroup {
            None => None,
            Some(rel) => {
                let cgroup = Cgroup::open(rel)?;
                let created = cgroup
                    .recreate()
                    .and_then(|()| cgroup.configure(spec.memory_mb, spec.cpus));
                if let Err(err) = created {
                    let _ = cgroup.remove();
                    return Err(format!("cgroup {rel}: {err}"));
                }
                Some(cgroup)
            }
        };
        // Before the workload starts: a fresh cgroup reads 0, and an instant OOM kill counts.
        let oom_before = cgroup.as_ref().and_then(Cgroup::oom_kills);
        marks.push(("shim_cgroup".to_owned(), sys::monotonic_us()));
        let parts = Parts {
            spec,
            command: &command,
            creds: creds.as_ref(),
            cgroup: cgroup.as_ref(),
            confined: confined
                .as_ref()
                .map(|(staging, filters)| (staging.as_path(), filters)),
        };
        let started = if spec.isolate && euid == 0 {
            parts.start_isolated()
        } else {
            parts.start_direct()
        };
        match started {
            Ok(mut started) => {
                marks.append(&mut started.marks);
                marks.push(("shim_started".to_owned(), sys::monotonic_us()));
                Ok(Run {
                    run_id: spec.run_id,
                    child: started.child,
                    init: started.init,
                    workload: started.workload,
                    status: started.status,
                    signals: started.signals,
                    outputs: [Some(started.stdout), Some(started.stderr)],
                    log,
                    oom_before,
                    cgroup,
                    signal_argv: spec.signal_argv.clone(),
                    delivering: None,
                    queued: Default::default(),
                })
            }
            Err(msg) => {
                if let Some(cgroup) = &cgroup {
                    let _ = cgroup.remove();
                }
                Err(msg)
            }
        }
    }

    /// Runs the event loop until the workload has exited and everything it left is gone;
    /// returns the exit record.
    fn supervise(mut self) -> ExitRecord {
        let mut child_status = None;
        let mut exited_at_ms = 0;
        let mut drain_deadline: Option<Instant> = None;
        let mut buf = [0u8; READ_CHUNK];
        loop {
            let timeout_ms = match drain_deadline {
                None => -1,
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() || self.outputs.iter().all(Option::is_none) {
                        break;
                    }
                    left.as_millis().clamp(1, i32::MAX as u128) as i32
                }
            };
            let mut fds = [self.signals.as_raw_fd(), -1, -1];
            for (slot, output) in fds[1..].iter_mut().zip(&self.outputs) {
                *slot = output.as_ref().map_or(-1, AsRawFd::as_raw_fd);
            }
            let mut pollfds = fds.map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
            if sys::poll(&mut pollfds, timeout_ms).is_err() {
                // Only EINVAL/ENOMEM are possible; do not spin.
                std::thread::sleep(Duration::from_millis(10));
            }
            if pollfds[0].revents != 0 {
                self.handle_signals(&mut child_status);
            }
            for (i, stream) in [Stream::Stdout, Stream::Stderr].into_iter().enumerate() {
                if pollfds[i + 1].revents != 0 {
                    self.read_output(i, stream, &mut buf);
                }
            }
            self.log.flush();
            if child_status.is_some() && drain_deadline.is_none() {
                exited_at_ms = sys::now_ms();
                // The workload is gone: kill what it left behind, which closes the pipes.
                self.kill_leftovers();
                drain_deadline = Some(Instant::now() + DRAIN_TIMEOUT);
            }
        }
        self.log.finish(Stream::Stdout);
        self.log.finish(Stream::Stderr);
        self.log.flush();
        while sys::reap_any().is_some() {}

        let status = self.workload_status(child_status.unwrap_or_default());
        let (exit_code, signal) = sys::decode_status(status);
        let oom_killed = self.oom_killed(signal);
        if let Some(cgroup) = &self.cgroup {
            let _ = cgroup.remove();
        }
        ExitRecord {
            run_id: self.run_id,
            exit_code,
            signal,
            oom_killed,
            exited_at_ms,
            error: None,
        }
    }

    /// Reaps exited children and forwards signals to the workload.
    fn handle_signals(&mut self, child_status: &mut Option<i32>) {
        while let Some(sig) = sys::read_signalfd(&self.signals) {
            if sig == libc::SIGCHLD {
                if child_status.is_none() && sys::child_exited(self.child) {
                    // Kill the workload's process group while its unreaped zombie still
                    // pins the group id (so it cannot name an unrelated group).
                    if let (Some(workload), None) = (self.workload, self.init) {
                        let _ = sys::kill(-workload, libc::SIGKILL);
                    }
                }
                // SIGCHLDs coalesce: reap everything (orphans we adopted as subreaper too).
                while let Some((pid, status)) = sys::reap_any() {
                    if pid == self.child {
                        *child_status = Some(status);
                    }
                    if Some(pid) == self.delivering {
                        self.delivering = None;
                    }
                }
            } else if child_status.is_none() {
                match &self.signal_argv {
                    // A command of the runtime's delivers it, in turn (below).
                    Some(_) => self.queued.push_back(sig),
                    // To the init (which forwards it) or to the workload itself.
                    None => {
                        let _ = sys::kill(self.child, sig);
                    }
                }
            }
        }
        self.deliver_next(child_status.is_some());
    }

    /// Starts the delivery command of the next queued signal once the one before it has
    /// finished (reaped above). A command that cannot be started leaves the signal to the
    /// child; once the workload is gone, what is queued is dropped.
    fn deliver_next(&mut self, exited: bool) {
        if exited {
            self.queued.clear();
        }
        let Some(argv) = &self.signal_argv else {
            return;
        };
        while self.delivering.is_none() {
            let Some(sig) = self.queued.pop_front() else {
                return;
            };
            match deliver(argv, sig) {
                Ok(pid) => self.delivering = Some(pid),
                Err(_) => {
                    let _ = sys::kill(self.child, sig);
                }
            }
        }
    }

    fn read_output(&mut self, index: usize, stream: Stream, buf: &mut [u8]) {
        let Some(pipe) = self.outputs[index].as_mut() else {
            return;
        };
        match pipe.read(buf) {
            Ok(0) => {}
            Ok(n) => return self.log.feed(stream, &buf[..n]),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => return,
            Err(_) => {}
        }
        // End of file (or a broken pipe): every writer is gone.
        self.log.finish(stream);
        self.outputs[index] = None;
    }

    /// Kills whatever the workload left (beyond its process group, see `handle_signals`):
    /// orphans re-parented to us (we are a subreaper) and everything in the cgroup. An
    /// isolated run needs none of it (its namespace died with the init) but it is harmless.
    fn kill_leftovers(&self) {
        let shim_pid = rustix::process::getpid().as_raw_nonzero().get();
        for orphan in sys::children(shim_pid) {
            let _ = sys::kill(orphan, libc::SIGKILL);
        }
        if let Some(cgroup) = &self.cgroup {
            cgroup.kill_all();
        }
    }

    /// The workload's wait status: reported by the init of an isolated run, or the status of
    /// our child. An init that died without reporting (killed) gives its own status.
    fn workload_status(&mut self, child_status: i32) -> i32 {
        let Some(reader) = self.status.as_mut() else {
            return child_status;
        };
        loop {
            match reader.next() {
                Some(InitMessage::Exited(status)) => return status,
                Some(_) => {}
                None => return child_status,
            }
        }
    }

    /// Whether the cgroup's `oom_kill` counter rose during the run.
    fn oom_killed(&self, signal: Option<i32>) -> bool {
        let (Some(cgroup), Some(before)) = (&self.cgroup, self.oom_before) else {
            return false;
        };
        let deadline = Instant::now() + OOM_SETTLE;
        loop {
            if cgroup.oom_kills().is_some_and(|now| now > before) {
                return true;
            }
            if signal != Some(libc::SIGKILL) || Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// What [`Run::launch`] has prepared for starting the workload.
struct Parts<'a> {
    spec: &'a ShimSpec,
    command: &'a Command,
    creds: Option<&'a user::Credentials>,
    cgroup: Option<&'a Cgroup>,
    /// A confined run's staging directory and seccomp filters.
    confined: Option<(&'a Path, &'a Filters)>,
}

/// The processes and fds of a started workload.
struct Started {
    child: libc::pid_t,
    init: Option<libc::pid_t>,
    workload: Option<libc::pid_t>,
    status: Option<StatusReader>,
    signals: File,
    stdout: File,
    stderr: File,
    /// The init's launch marks (an isolated run).
    marks: Vec<(String, u64)>,
}

/// The fds shared by both ways of starting: the signalfd, our pidfd and the output pipes.
struct Plumbing {
    signals: File,
    shim_pidfd: OwnedFd,
    stdin: File,
    stdout: (File, File),
    stderr: (File, File),
}

impl Plumbing {
    fn new() -> io::Result<Plumbing> {
        // Blocked before forking so that no SIGCHLD or SIGTERM is lost in between; the
        // children unblock everything before execve.
        let mut handled = SigSet::of(FORWARDED);
        handled.add(libc::SIGCHLD);
        handled.block()?;
        let signals = handled.signalfd()?;
        // Orphans of the workload come to us, so that we can kill them when it exits.
        rustix::process::set_child_subreaper(Some(rustix::process::getpid()))?;
        let shim_pidfd =
            rustix::process::pidfd_open(rustix::process::getpid(), PidfdFlags::empty())?;
        Ok(Plumbing {
            signals,
            shim_pidfd,
            stdin: sys::dev_null()?,
            stdout: sys::pipe()?,
            stderr: sys::pipe()?,
        })
    }

    fn stdio(&self) -> [i32; 3] {
        [
            self.stdin.as_raw_fd(),
            self.stdout.1.as_raw_fd(),
            self.stderr.1.as_raw_fd(),
        ]
    }
}

impl Parts<'_> {
    /// Forks the workload as our child.
    fn start_direct(&self) -> Result<Started, String> {
        let plumbing = Plumbing::new().map_err(|err| format!("shim set-up: {}", describe(&err)))?;
        let (mut exec_r, exec_w) =
            sys::pipe().map_err(|err| format!("pipe: {}", describe(&err)))?;
        // SAFETY: the shim is single-threaded; the child ends in execve or exit_now.
        match unsafe { sys::fork() } {
            Err(err) => Err(format!("fork: {}", describe(&err))),
            Ok(Forked::Child) => {
                let setup = Setup {
                    command: self.command,
                    creds: self.creds,
                    stdio: Some(plumbing.stdio()),
                    cgroup: self.cgroup,
                    parent: Some(plumbing.shim_pidfd.as_raw_fd()),
                    oom_score_adj: None,
                    confine: None,
                };
                let msg = launch::exec_workload(&setup);
                let _ = sys::write_all_fd(exec_w.as_raw_fd(), msg.as_bytes());
                sys::exit_now(launch::LAUNCH_FAILED);
            }
            Ok(Forked::Parent(pid)) => {
                drop(exec_w);
                let mut msg = String::new();
                let _ = exec_r.read_to_string(&mut msg);
                if !msg.is_empty() {
                    let _ = sys::wait_child(pid);
                    return Err(msg);
                }
                Ok(Started {
                    child: pid,
                    init: None,
                    workload: Some(pid),
                    status: None,
                    signals: plumbing.signals,
                    stdout: plumbing.stdout.0,
                    stderr: plumbing.stderr.0,
                    marks: Vec::new(),
                })
            }
        }
    }

    /// Forks the mini init as pid 1 of a new pid namespace; it starts the workload.
    fn start_isolated(&self) -> Result<Started, String> {
        let plumbing = Plumbing::new().map_err(|err| format!("shim set-up: {}", describe(&err)))?;
        // SAFETY: only our next child enters the new pid namespace; the shim is
        // single-threaded, which unshare_unsafe requires for the namespaces that affect paths.
        unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWPID) }
            .map_err(|err| format!("unsharing the pid namespace: {}", describe(&err.into())))?;
        let (status_r, status_w) =
            sys::pipe().map_err(|err| format!("pipe: {}", describe(&err)))?;
        // SAFETY: the shim is single-threaded; the child (the init) never returns.
        match unsafe { sys::fork() } {
            Err(err) => Err(format!("fork: {}", describe(&err))),
            Ok(Forked::Child) => init::run(&InitSetup {
                command: self.command,
                creds: self.creds,
                hostname: &self.spec.hostname,
                cgroup: self.cgroup,
                shim_pidfd: plumbing.shim_pidfd.as_raw_fd(),
                status_fd: status_w.as_raw_fd(),
                stdio: plumbing.stdio(),
                confined: self.spec.sandbox.as_ref().zip(self.confined).map(
                    |(sandbox, (staging, filters))| Confined {
                        sandbox,
                        staging,
                        workdir: &self.spec.workdir,
                        filters,
                    },
                ),
            }),
            Ok(Forked::Parent(init_pid)) => {
                drop(status_w);
                let mut status = StatusReader::new(status_r);
                let marks = match status.next() {
                    Some(InitMessage::Started(marks)) => marks,
                    other => {
                        let _ = sys::wait_child(init_pid);
                        return Err(match other {
                            Some(InitMessage::Failed(msg)) => msg,
                            _ => "the init exited during launch".to_owned(),
                        });
                    }
                };
                // The init has exactly one child: the workload (unless it already exited).
                let workload = sys::children(init_pid).first().copied();
                Ok(Started {
                    child: init_pid,
                    init: Some(init_pid),
                    workload,
                    status: Some(status),
                    signals: plumbing.signals,
                    stdout: plumbing.stdout.0,
                    stderr: plumbing.stderr.0,
                    marks,
                })
            }
        }
    }
}
