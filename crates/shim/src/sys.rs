//! Thin wrappers over the raw Linux system calls the shim needs and that std and rustix don't
//! offer in a usable shape: `fork`, pipes, signal masks and `signalfd`, `waitpid`, fd
//! juggling, credentials, trimming resident memory, plus small readers for `/proc`. Most of
//! the crate's `unsafe` code lives here, behind safe functions.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, RawFd};
use std::time::{SystemTime, UNIX_EPOCH};

/// Turns a `-1` return into the current `errno`.
fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Creates a pipe; both ends are close-on-exec. Returns `(read, write)`.
pub(crate) fn pipe() -> io::Result<(File, File)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: pipe2 succeeded, so both fds are open and owned by nobody else.
    Ok(unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) })
}

/// What `fork` returned in this process.
pub(crate) enum Forked {
    Child,
    Parent(libc::pid_t),
}

/// Forks the calling process.
///
/// # Safety
///
/// The caller must be single-threaded (the shim and the init always are), so that the child
/// can keep running ordinary code; the child must end with [`exit_now`] or `execve`, never by
/// returning into code that would run the parent's destructors twice.
pub(crate) unsafe fn fork() -> io::Result<Forked> {
    // SAFETY: forwarded to the caller (see above).
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent(pid)),
    }
}

/// Ends the process at once: no destructors, no atexit handlers, no stdio flush. The only
/// correct way out of a forked child.
pub(crate) fn exit_now(code: i32) -> ! {
    // SAFETY: _exit has no preconditions.
    unsafe { libc::_exit(code) }
}

/// A set of signals.
#[derive(Clone, Copy)]
pub(crate) struct SigSet(libc::sigset_t);

impl SigSet {
    pub(crate) fn empty() -> SigSet {
        // SAFETY: sigemptyset initialises the zeroed set it is given.
        unsafe {
            let mut set = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            SigSet(set)
        }
    }

    pub(crate) fn full() -> SigSet {
        // SAFETY: sigfillset initialises the zeroed set it is given.
        unsafe {
            let mut set = std::mem::zeroed();
            libc::sigfillset(&mut set);
            SigSet(set)
        }
    }

    pub(crate) fn of(signals: &[i32]) -> SigSet {
        let mut set = SigSet::empty();
        for &sig in signals {
            set.add(sig);
        }
        set
    }

    pub(crate) fn add(&mut self, sig: i32) {
        // SAFETY: the set is initialised; an invalid signal number only makes this fail.
        unsafe { libc::sigaddset(&mut self.0, sig) };
    }

    pub(crate) fn remove(&mut self, sig: i32) {
        // SAFETY: as for `add`.
        unsafe { libc::sigdelset(&mut self.0, sig) };
    }

    /// Blocks the signals of this set for the calling thread (the whole process here).
    pub(crate) fn block(&self) -> io::Result<()> {
        self.mask(libc::SIG_BLOCK)
    }

    /// Makes this set the signal mask of the calling thread.
    pub(crate) fn set_mask(&self) -> io::Result<()> {
        self.mask(libc::SIG_SETMASK)
    }

    fn mask(&self, how: libc::c_int) -> io::Result<()> {
        // SAFETY: both pointers are valid; the old mask is not asked for.
        let ret = unsafe { libc::sigprocmask(how, &self.0, std::ptr::null_mut()) };
        cvt(ret).map(drop)
    }

    /// Waits for one of the (blocked) signals of this set and returns it.
    pub(crate) fn wait(&self) -> i32 {
        loop {
            // SAFETY: the set is initialised; the siginfo is not asked for.
            let sig = unsafe { libc::sigwaitinfo(&self.0, std::ptr::null_mut()) };
            if sig > 0 {
                return sig;
            }
        }
    }

    /// Opens a non-blocking, close-on-exec signalfd for this set (which must be blocked).
    pub(crate) fn signalfd(&self) -> io::Result<File> {
        let flags = libc::SFD_CLOEXEC | libc::SFD_NONBLOCK;
        // SAFETY: -1 asks for a new fd; the set is initialised.
        let fd = cvt(unsafe { libc::signalfd(-1, &self.0, flags) })?;
        // SAFETY: signalfd returned a new fd that nobody else owns.
        Ok(unsafe { File::from_raw_fd(fd) })
    }
}

/// Reads one pending signal from a non-blocking signalfd; `None` when there is none.
pub(crate) fn read_signalfd(fd: &File) -> Option<i32> {
    // SAFETY: signalfd_siginfo is plain data; all-zero is a valid value.
    let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
    let len = std::mem::size_of::<libc::signalfd_siginfo>();
    // SAFETY: `info` is a writable buffer of `len` bytes.
    let n = unsafe { libc::read(fd.as_raw_fd(), (&raw mut info).cast(), len) };
    (n == len as isize).then_some(info.ssi_signo as i32)
}

/// Resets the disposition of every catchable signal to the default (run before `execve`:
/// ignored signals, like Rust's `SIGPIPE`, would otherwise stay ignored in the workload).
pub(crate) fn reset_signal_dispositions() {
    for sig in 1..libc::SIGRTMAX() {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP {
            // SAFETY: SIG_DFL is always a valid disposition; failures (reserved signals) are
            // harmless.
            unsafe { libc::signal(sig, libc::SIG_DFL) };
        }
    }
}

/// Reaps one exited child without blocking: `Some((pid, status))`, or `None` if no child has
/// exited (or there are no children).
pub(crate) fn reap_any() -> Option<(libc::pid_t, libc::c_int)> {
    let mut status = 0;
    // SAFETY: `status` is a valid out pointer.
    let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
    (pid > 0).then_some((pid, status))
}

/// Whether the child `pid` has exited, without reaping it (its pid stays reserved).
pub(crate) fn child_exited(pid: libc::pid_t) -> bool {
    // SAFETY: siginfo_t is plain data; all-zero is a valid value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
    // SAFETY: `info` is a valid out pointer.
    let ret = unsafe { libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, flags) };
    // SAFETY: waitid filled `info` (si_pid stays 0 when no child has changed state).
    ret == 0 && unsafe { info.si_pid() } != 0
}

/// Waits for the child `pid` to exit and returns its wait status.
pub(crate) fn wait_child(pid: libc::pid_t) -> io::Result<libc::c_int> {
    let mut status = 0;
    loop {
        // SAFETY: `status` is a valid out pointer.
        let ret = unsafe { libc::waitpid(pid, &mut status, 0) };
        match cvt(ret) {
            Ok(_) => return Ok(status),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(err),
        }
    }
}

/// Splits a wait status into `(exit_code, signal)`.
pub(crate) fn decode_status(status: libc::c_int) -> (Option<i32>, Option<i32>) {
    if libc::WIFEXITED(status) {
        (Some(libc::WEXITSTATUS(status)), None)
    } else if libc::WIFSIGNALED(status) {
        (None, Some(libc::WTERMSIG(status)))
    } else {
        (None, None)
    }
}

/// Sends `sig` to `pid` (a negative pid names a process group).
pub(crate) fn kill(pid: libc::pid_t, sig: i32) -> io::Result<()> {
    // SAFETY: kill has no memory-safety preconditions.
    cvt(unsafe { libc::kill(pid, sig) }).map(drop)
}

/// Waits until one of `fds` is ready or `timeout_ms` passes (-1 = forever). An interrupted
/// wait counts as a timeout.
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize> {
    // SAFETY: the pointer and length describe the caller's slice.
    let ret = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    match cvt(ret) {
        Ok(n) => Ok(n as usize),
        Err(err) if err.kind() == io::ErrorKind::Interrupted => Ok(0),
        Err(err) => Err(err),
    }
}

/// True if `fd` (a pidfd or a pipe) is readable right now: the process has exited, or the
/// other end of the pipe is gone.
pub(crate) fn is_readable(fd: BorrowedFd<'_>) -> bool {
    let mut fds = [libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    matches!(poll(&mut fds, 0), Ok(1))
}

/// Makes `new` a copy of `old` (not close-on-exec).
pub(crate) fn dup2(old: RawFd, new: RawFd) -> io::Result<()> {
    // SAFETY: dup2 only operates on the fd table.
    cvt(unsafe { libc::dup2(old, new) }).map(drop)
}

/// Moves `fd` to the fd number `target` (close-on-exec), closing what `target` held.
pub(crate) fn move_fd(fd: RawFd, target: RawFd) -> io::Result<()> {
    if fd == target {
        // SAFETY: F_SETFD on an fd we own.
        return cvt(unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) }).map(drop);
    }
    // SAFETY: dup3 only operates on the fd table.
    cvt(unsafe { libc::dup3(fd, target, libc::O_CLOEXEC) })?;
    // SAFETY: `fd` was ours and has just been copied; nothing else refers to it.
    unsafe { libc::close(fd) };
    Ok(())
}

/// Closes every fd from `first` up.
pub(crate) fn close_fds_from(first: RawFd) {
    // SAFETY: close_range only operates on the fd table; the caller gives up all these fds.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            libc::c_uint::MAX,
            0,
        )
    };
}

/// Opens `/dev/null` read-write (close-on-exec).
pub(crate) fn dev_null() -> io::Result<File> {
    File::options().read(true).write(true).open("/dev/null")
}

/// Writes all of `buf` to `fd`, retrying short writes and interruptions.
pub(crate) fn write_all_fd(fd: RawFd, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: the pointer and length describe `buf`.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

/// Switches to `uid`, `gid` and the supplementary `groups`, in the only order that works
/// (groups and gid while still privileged, uid last). Affects the whole process, which must
/// be single-threaded.
pub(crate) fn set_credentials(uid: u32, gid: u32, groups: &[u32]) -> io::Result<()> {
    // SAFETY: the pointer and length describe `groups`.
    cvt(unsafe { libc::setgroups(groups.len(), groups.as_ptr()) })?;
    // SAFETY: setgid and setuid have no memory-safety preconditions.
    cvt(unsafe { libc::setgid(gid) })?;
    // SAFETY: as above.
    cvt(unsafe { libc::setuid(uid) }).map(drop)
}

/// The start time of `pid` in clock ticks since boot (field 22 of `/proc/<pid>/stat`). With
/// the pid it identifies a process uniquely.
pub(crate) fn start_time(pid: libc::pid_t) -> io::Result<u64> {
    let mut buf = [0u8; 1024];
    let mut file = File::open(format!("/proc/{pid}/stat"))?;
    let mut len = 0;
    loop {
        let n = file.read(&mut buf[len..])?;
        if n == 0 || len + n == buf.len() {
            len += n;
            break;
        }
        len += n;
    }
    parse_start_time(&buf[..len])
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed /proc/<pid>/stat"))
}

fn parse_start_time(stat: &[u8]) -> Option<u64> {
    // The command name (field 2) may contain spaces and parentheses: skip to the last ')'.
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&stat[close + 1..]).ok()?;
    // After ')' come fields 3.. ; the start time is field 22.
    rest.split_ascii_whitespace().nth(22 - 3)?.parse().ok()
}

/// The children of thread `pid` of process `pid` (needs `CONFIG_PROC_CHILDREN`).
pub(crate) fn children(pid: libc::pid_t) -> Vec<libc::pid_t> {
    let path = format!("/proc/{pid}/task/{pid}/children");
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .split_ascii_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Shrinks the resident memory of the process after start-up, without changing its content.
///
/// `bazaar` is a large executable: loading and relocating it, and the launch code, touch a few
/// MiB of its file-backed pages that the shim's event loop never needs again. This unmaps
/// every clean file-backed page from the page tables (`MADV_DONTNEED` on read-only file
/// mappings that hold no private copy-on-write page, so nothing is lost: a page needed again
/// comes back from the page cache on a minor fault) and returns free heap to the kernel.
/// Mappings with private modifications (the relocated `.data.rel.ro`) are left alone.
pub(crate) fn trim_resident_memory() {
    if let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") {
        for (start, end) in clean_file_mappings(&smaps) {
            // SAFETY: the range is a read-only file mapping without private pages (see
            // `clean_file_mappings`); dropping its pages loses nothing, and nothing here can
            // make it writable or dirty it concurrently (the process is single-threaded).
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
        }
    }
    // SAFETY: malloc_trim only releases memory that malloc holds free.
    unsafe { libc::malloc_trim(0) };
}

/// The `(start, end)` of every mapping in `smaps` that is file-backed, not writable, and has
/// no anonymous (copy-on-write) page.
fn clean_file_mappings(smaps: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut current: Option<(usize, usize)> = None;
    for line in smaps.lines() {
        let mut fields = line.split_ascii_whitespace();
        let first = fields.next().unwrap_or("");
        if let Some((start, end)) = first.split_once('-') {
            // A mapping header: "start-end perms offset dev inode [path]".
            let (perms, inode) = (fields.next().unwrap_or(""), fields.nth(2).unwrap_or("0"));
            let range = (
                usize::from_str_radix(start, 16),
                usize::from_str_radix(end, 16),
            );
            current = match range {
                (Ok(start), Ok(end)) if !perms.contains('w') && inode != "0" => Some((start, end)),
                _ => None,
            };
        } else if first == "Anonymous:" {
            if let (Some(range), Some("0")) = (current.take(), fields.next()) {
                out.push(range);
            }
        }
    }
    out
}

/// Current time in unix milliseconds.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// Microseconds on the host's monotonic clock (`CLOCK_MONOTONIC`, the same in every
/// process of the host: the agent and its shims compare their launch marks with it).
/// Async-signal-safe: callable between fork and exec.
pub fn monotonic_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid pointer to a timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
}

/// Returns the effective uid and gid of the process.
pub(crate) fn effective_ids() -> (u32, u32) {
    // SAFETY: geteuid/getegid cannot fail.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_parses_names_with_spaces_and_parens() {
        let stat = b"42 (a b) c) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start_time(stat), Some(987654));
        assert_eq!(parse_start_time(b"garbage"), None);
    }

    #[test]
    fn start_time_of_self_is_stable() {
        // SAFETY: getpid cannot fail.
        let pid = unsafe { libc::getpid() };
        assert_eq!(start_time(pid).unwrap(), start_time(pid).unwrap());
    }

    #[test]
    fn only_clean_read_only_file_mappings_are_trimmed() {
        let smaps = "\
5600-5700 r--p 00000000 fe:00 42 /bin/x
Rss:                  16 kB
Anonymous:             0 kB
5700-5800 r--p 00100000 fe:00 42 /bin/x
Anonymous:            60 kB
5800-5900 rw-p 00200000 fe:00 42 /bin/x
Anonymous:             0 kB
5900-5a00 rw-p 00000000 00:00 0 [heap]
Anonymous:             4 kB
7f00-7f10 r-xp 00026000 fe:00 7 /usr/lib/libc.so.6
Anonymous:             0 kB
7f20-7f30 r--p 00000000 00:00 0 [vvar]
Anonymous:             0 kB
";
        assert_eq!(
            clean_file_mappings(smaps),
            [(0x5600, 0x5700), (0x7f00, 0x7f10)]
        );
    }

    #[test]
    fn decode_status_splits_exit_codes_and_signals() {
        assert_eq!(decode_status(3 << 8), (Some(3), None));
        assert_eq!(decode_status(libc::SIGKILL), (None, Some(libc::SIGKILL)));
    }
}
