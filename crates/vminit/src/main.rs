//! `bazaar-vminit`: PID 1 of a microVM guest. Mounts `/proc`, `/sys`, `/dev`, sets the
//! network from the kernel command line (`bazaar.ip`, `bazaar.gw`: `bazaar_microvm`'s
//! `GuestBoot`), runs the workload the agent wrote under `/.bazaar` as its user with its
//! env, forwards the signals it gets to it and those the host sends on the control port,
//! runs the commands of the exec port (`bazaar_vminit::Request`), reaps every child,
//! prints the workload's exit code on the console (`bazaar_vminit::exit_line`) and powers
//! the guest off.
//! Built static (`scripts/vminit`) so it runs on any image.

use bazaar_microvm::{GuestBoot, GuestNet};
use bazaar_vminit::{exit_line, ExecReply, Request, Workload, DIR};
use std::collections::HashMap;
use std::ffi::CString;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};

fn main() {
    let code = match run() {
        Ok(code) => code,
        Err(e) => {
            println!("bazaar-vminit: {e}");
            127
        }
    };
    // Everything else first, so that the exit line is the last a process of the guest
    // prints (the host takes the last one on the console).
    // SAFETY: plain system calls.
    unsafe { libc::kill(-1, libc::SIGKILL) };
    println!("{}", exit_line(code));
    // SAFETY: plain system calls.
    unsafe {
        libc::sync();
        libc::reboot(libc::RB_POWER_OFF);
    }
}

fn cstr(s: &str) -> CString {
    CString::new(s.replace('\0', "")).expect("no NUL")
}

fn mount(source: &str, target: &str, fstype: &str) {
    let _ = std::fs::create_dir_all(target);
    // SAFETY: valid C strings for the call's duration.
    let rc = unsafe {
        libc::mount(
            cstr(source).as_ptr(),
            cstr(target).as_ptr(),
            cstr(fstype).as_ptr(),
            libc::MS_NOSUID,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EBUSY) {
            println!("bazaar-vminit: mount {target}: {e}");
        }
    }
}

/// Signals forwarded to the workload.
const FORWARDED: [libc::c_int; 6] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

extern "C" fn noop(_: libc::c_int) {}

fn run() -> Result<i32, String> {
    mount("proc", "/proc", "proc");
    mount("sysfs", "/sys", "sysfs");
    mount("devtmpfs", "/dev", "devtmpfs");
    mount("devpts", "/dev/pts", "devpts");
    let cmdline =
        std::fs::read_to_string("/proc/cmdline").map_err(|e| format!("/proc/cmdline: {e}"))?;
    let boot = GuestBoot::parse(&cmdline).map_err(|e| e.to_string())?;
    net::up("lo", None).map_err(|e| format!("lo: {e}"))?;
    if let Some(n) = &boot.net {
        net::up("eth0", Some(n)).map_err(|e| format!("eth0: {e}"))?;
    }
    let w = Workload::read(Path::new(DIR))?;
    // SAFETY: signal set manipulation on local values; handlers are no-ops (PID 1 gets
    // only the signals it handles, so each forwarded one needs a handler).
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        libc::sigemptyset(&mut set);
        for s in FORWARDED.iter().chain(&[libc::SIGCHLD]) {
            libc::signal(*s, noop as *const () as libc::sighandler_t);
            libc::sigaddset(&mut set, *s);
        }
        libc::sigprocmask(libc::SIG_BLOCK, &set, &mut old);
    }
    let argv: Vec<CString> = w.argv.iter().map(|a| cstr(a)).collect();
    let env: Vec<CString> = w.env.iter().map(|a| cstr(a)).collect();
    let program = cstr(&resolve(&w.argv[0], &w.env));
    let cwd = cstr(&w.cwd);
    let mut argv_p: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_p.push(std::ptr::null());
    let mut env_p: Vec<*const libc::c_char> = env.iter().map(|a| a.as_ptr()).collect();
    env_p.push(std::ptr::null());
    // SAFETY: fork in a single-threaded process; the child only makes system calls on
    // values prepared before the fork, then execs or exits.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(format!("fork: {}", std::io::Error::last_os_error()));
    }
    if child == 0 {
        unsafe {
            for s in FORWARDED.iter().chain(&[libc::SIGCHLD]) {
                libc::signal(*s, libc::SIG_DFL);
            }
            libc::sigprocmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            libc::setsid();
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(w.gid) != 0
                || libc::setuid(w.uid) != 0
            {
                libc::_exit(126);
            }
            libc::chdir(cwd.as_ptr());
            libc::execve(program.as_ptr(), argv_p.as_ptr(), env_p.as_ptr());
            libc::_exit(127);
        }
    }
    let reaped = Arc::new(Reaped::default());
    spawn_port(bazaar_microvm::qemu::CTL_PORT, move |req, _| {
        if let Request::Signal(sig) = req {
            // SAFETY: a signal to our child.
            unsafe { libc::kill(child, sig) };
        }
        None
    });
    let (exec_env, r) = (w.env.clone(), reaped.clone());
    spawn_port(bazaar_microvm::qemu::EXEC_PORT, move |req, _| match req {
        Request::Exec { nonce, argv } => Some(exec(nonce, &argv, &exec_env, &r)),
        Request::Signal(_) => None,
    });
    loop {
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let timeout = libc::timespec {
            tv_sec: 1,
            tv_nsec: 0,
        };
        // SAFETY: waits on the blocked set; `info` is ours.
        let sig = unsafe { libc::sigtimedwait(&set, &mut info, &timeout) };
        if sig > 0 && sig != libc::SIGCHLD {
            unsafe { libc::kill(child, sig) };
            continue;
        }
        // Reap everything that exited; the workload's end ends the guest.
        loop {
            let mut status = 0;
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid <= 0 {
                break;
            }
            let code = if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                128 + libc::WTERMSIG(status)
            };
            if pid == child {
                return Ok(code);
            }
            reaped.put(pid, code);
        }
    }
}

/// The exit codes of the children PID 1 reaped other than the workload (exec's commands
/// among them), for the threads that wait on them.
#[derive(Default)]
struct Reaped {
    codes: Mutex<HashMap<libc::pid_t, i32>>,
    changed: Condvar,
}

impl Reaped {
    fn put(&self, pid: libc::pid_t, code: i32) {
        let mut codes = self.codes.lock().unwrap_or_else(|e| e.into_inner());
        // Orphans' codes nobody asks for: keep the map bounded.
        if codes.len() > 4096 {
            codes.clear();
        }
        codes.insert(pid, code);
        self.changed.notify_all();
    }

    fn take(&self, pid: libc::pid_t) -> i32 {
        let mut codes = self.codes.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(code) = codes.remove(&pid) {
                return code;
            }
            codes = self.changed.wait(codes).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// The device of virtio-serial port `name` (no udev here to make
/// `/dev/virtio-ports/<name>`: found by its name in sysfs). Ports come up after the
/// driver's probe, which may end after the workload starts: waited for, 30 s at most.
fn port_device(name: &str) -> Option<PathBuf> {
    for _ in 0..600 {
        let found = std::fs::read_dir("/sys/class/virtio-ports")
            .into_iter()
            .flatten()
            .flatten()
            .find(|e| {
                std::fs::read_to_string(e.path().join("name")).is_ok_and(|n| n.trim() == name)
            })
            .map(|e| Path::new("/dev").join(e.file_name()));
        if let Some(dev) = found.filter(|d| d.exists()) {
            return Some(dev);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    None
}

/// Serves port `name` on a thread of its own: each request line to `handle`, its answer
/// (if any) written back. Reads see end-of-file while no host end is connected.
fn spawn_port(
    name: &'static str,
    handle: impl Fn(Request, &mut std::fs::File) -> Option<ExecReply> + Send + 'static,
) {
    std::thread::spawn(move || {
        let Some(dev) = port_device(name) else {
            println!("bazaar-vminit: no port {name}");
            return;
        };
        let port = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&dev)
        {
            Ok(p) => p,
            Err(e) => return println!("bazaar-vminit: {}: {e}", dev.display()),
        };
        let mut out = match port.try_clone() {
            Ok(p) => p,
            Err(e) => return println!("bazaar-vminit: {}: {e}", dev.display()),
        };
        let mut reader = std::io::BufReader::new(port);
        let mut line = String::new();
        loop {
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    continue;
                }
                Ok(_) if !line.ends_with('\n') => continue,
                Ok(_) => {}
            }
            if let Some(req) = Request::parse(&line) {
                if let Some(reply) = handle(req, &mut out) {
                    let _ = out.write_all(reply.line().as_bytes());
                }
            }
            line.clear();
        }
    });
}

/// Runs `argv` (as root, with the workload's environment, in `/`) for the exec port.
fn exec(nonce: u64, argv: &[String], env: &[String], reaped: &Reaped) -> ExecReply {
    let failed = |msg: String| ExecReply {
        nonce,
        code: 127,
        stdout: Vec::new(),
        stderr: msg.into_bytes(),
    };
    let mut cmd = std::process::Command::new(resolve(&argv[0], env));
    cmd.args(&argv[1..])
        .env_clear()
        .envs(env.iter().filter_map(|e| e.split_once('=')))
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return failed(format!("cannot run {:?}: {e}\n", argv[0])),
    };
    let err_pipe = child.stderr.take();
    let errors = std::thread::spawn(move || err_pipe.map(read_capped).unwrap_or_default());
    let stdout = child.stdout.take().map(read_capped).unwrap_or_default();
    let stderr = errors.join().unwrap_or_default();
    // PID 1's loop reaps it (never `child.wait()`, which would race that loop).
    let code = reaped.take(child.id() as libc::pid_t);
    ExecReply {
        nonce,
        code,
        stdout,
        stderr,
    }
}

/// `program` found in the workload's `PATH` (a name without `/`), else as it is.
fn resolve(program: &str, env: &[String]) -> String {
    if program.contains('/') {
        return program.to_string();
    }
    let path = env
        .iter()
        .find_map(|e| e.strip_prefix("PATH="))
        .unwrap_or("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    path.split(':')
        .map(|d| format!("{d}/{program}"))
        .find(|p| Path::new(p).is_file())
        .unwrap_or_else(|| program.to_string())
}

mod net {
    //! An interface's address and the default route, by the old ioctls (no netlink).
    use super::GuestNet;
    use std::io;
    use std::net::Ipv4Addr;

    fn sockaddr(a: Ipv4Addr) -> libc::sockaddr {
        let sin = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from(a).to_be(),
            },
            sin_zero: [0; 8],
        };
        // SAFETY: sockaddr_in and sockaddr have the same size; plain data.
        unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
    }

    fn ifreq(name: &str) -> libc::ifreq {
        // SAFETY: ifreq is plain data, zero is valid.
        let mut r: libc::ifreq = unsafe { std::mem::zeroed() };
        for (d, s) in r.ifr_name.iter_mut().zip(name.bytes()) {
            *d = s as libc::c_char;
        }
        r
    }

    fn ioctl(fd: libc::c_int, req: libc::Ioctl, arg: *mut libc::c_void) -> io::Result<()> {
        // SAFETY: `arg` points at the struct `req` expects.
        if unsafe { libc::ioctl(fd, req, arg) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Brings `name` up, with `net`'s address and default route when given.
    pub fn up(name: &str, net: Option<&GuestNet>) -> io::Result<()> {
        // SAFETY: a socket for the ioctls, closed below.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let r = (|| {
            if let Some(n) = net {
                let mut r = ifreq(name);
                r.ifr_ifru.ifru_addr = sockaddr(n.address);
                ioctl(fd, libc::SIOCSIFADDR, &mut r as *mut _ as *mut _)?;
                let mask = u32::MAX.checked_shl(32 - u32::from(n.prefix)).unwrap_or(0);
                r.ifr_ifru.ifru_netmask = sockaddr(Ipv4Addr::from(mask));
                ioctl(fd, libc::SIOCSIFNETMASK, &mut r as *mut _ as *mut _)?;
            }
            let mut r = ifreq(name);
            ioctl(fd, libc::SIOCGIFFLAGS, &mut r as *mut _ as *mut _)?;
            // SAFETY: the union's flags member, as SIOCGIFFLAGS filled it.
            unsafe { r.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
            ioctl(fd, libc::SIOCSIFFLAGS, &mut r as *mut _ as *mut _)?;
            if let Some(n) = net {
                // SAFETY: rtentry is plain data, zero is valid.
                let mut rt: libc::rtentry = unsafe { std::mem::zeroed() };
                rt.rt_dst = sockaddr(Ipv4Addr::UNSPECIFIED);
                rt.rt_genmask = sockaddr(Ipv4Addr::UNSPECIFIED);
                rt.rt_gateway = sockaddr(n.gateway);
                rt.rt_flags = libc::RTF_UP | libc::RTF_GATEWAY;
                ioctl(fd, libc::SIOCADDRT, &mut rt as *mut _ as *mut _)?;
            }
            Ok(())
        })();
        // SAFETY: our socket.
        unsafe { libc::close(fd) };
        r
    }
}

/// Everything `r` gives until its end, kept up to 1 MiB (the host caps exec's output so);
/// the rest is read and dropped, so that the command never blocks on a full pipe.
fn read_capped(mut r: impl std::io::Read) -> Vec<u8> {
    const CAP: usize = 1 << 20;
    let (mut out, mut chunk) = (Vec::new(), [0u8; 8192]);
    loop {
        match r.read(&mut chunk) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&chunk[..n.min(CAP.saturating_sub(out.len()))]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return out,
        }
    }
}
