//! The private root file system of a sandboxed run ([`Sandbox`]), built by the mini init in
//! its new mount namespace before it forks the workload, and the capability drop that every
//! confined process (a sandboxed workload, an `exec` inside it) goes through.
//!
//! The root is a tmpfs made `/` with `pivot_root`; the old root is then detached, so
//! nothing of the host is reachable but what was mounted in. The init first takes detached
//! copies of the host paths it shares (`open_tree`, `HostParts`), then enters a copy of
//! the agent's base mount namespace ([`make_sandbox_base`]: one read-only tmpfs) and builds
//! the root on its `/sandbox`; without a base, on `RUN_DIR/root` in a copy of the host's
//! mount namespace, whose mounts (two per machine address) made the copy and the detach
//! cost ~37 ms per start at 700 mounts (load 20), against ~1 ms at 21.
//!
//! | path | what |
//! |---|---|
//! | `/usr`, `/bin`, `/sbin`, `/lib*` | the host's, bind-mounted read-only (symlinks copied) |
//! | `/etc` | `passwd`/`group` naming the workload's user, `hosts`, `hostname`, `nsswitch.conf`; `resolv.conf` ([`Sandbox::resolv_conf`] or the host's), `ld.so.cache`, `localtime` copied; `ssl`, `ca-certificates`, `alternatives` read-only |
//! | `/proc` | a fresh proc of the run's pid namespace |
//! | `/dev` | `null`, `zero`, `full`, `random`, `urandom`, `tty`, a private `pts` and `shm` |
//! | `/tmp` | a tmpfs |
//! | [`Sandbox::workdir`] | the machine's work directory, read-write (the workload's cwd) |
//! | each of [`Sandbox::binds`] | a host directory, read-write (a volume) |
//!
//! The root itself is read-only once built. Everything runs as root in the init, before the
//! user switch, so the mounted directories are reachable whatever the modes of their parents
//! on the host.

use std::fs;
use std::io;
use std::os::unix::fs::{symlink, DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use rustix::fs::CWD;
use rustix::mount::{
    MountFlags, MountPropagationFlags, MoveMountFlags, OpenTreeFlags, UnmountFlags,
};
use rustix::thread::UnshareFlags;
use serde::{Deserialize, Serialize};

use crate::launch::describe;
use crate::user::Credentials;

/// What a sandboxed run sees instead of the host's file system.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Sandbox {
    /// Where [`ShimSpec::workdir`](crate::ShimSpec::workdir) is mounted inside (the cwd).
    pub workdir: PathBuf,
    /// More host directories mounted read-write: `(host path, path inside)`.
    #[serde(default)]
    pub binds: Vec<(PathBuf, PathBuf)>,
    /// A network namespace to run in (e.g. `/run/netns/x`); `None` keeps the host's.
    #[serde(default)]
    pub netns: Option<PathBuf>,
    /// The private `/etc/resolv.conf` (the internal DNS of the run's network); `None`
    /// copies the host's.
    #[serde(default)]
    pub resolv_conf: Option<String>,
    /// The name `/etc/passwd` gives the workload's uid.
    pub user_name: String,
    /// The seccomp filters, compiled by [`crate::write_seccomp_filters`] (the agent does it
    /// once); `None` compiles them for this run.
    #[serde(default)]
    pub seccomp: Option<PathBuf>,
    /// A mount namespace made by [`make_sandbox_base`] to build the root in (a copy of
    /// it: a few mounts); `None` builds it in a copy of the host's, whose mounts (two per
    /// machine address, for its namespaces) make the copy and the detach of the old root
    /// slow.
    #[serde(default)]
    pub base: Option<PathBuf>,
}

/// Host directories shared read-only (those that exist; a symlink is recreated as is).
const SYSTEM_DIRS: &[&str] = &["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];
/// Host files copied into the private `/etc` when they exist.
const ETC_COPIED: &[&str] = &["resolv.conf", "ld.so.cache", "localtime", "mime.types"];
/// Host directories of `/etc` shared read-only when they exist.
const ETC_SHARED: &[&str] = &["ssl", "ca-certificates", "alternatives"];
/// Host devices bind-mounted into the private `/dev`.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// What the root is built from, taken from the host's mount namespace before the init
/// leaves it: detached copies of the mounts shared (`open_tree(OPEN_TREE_CLONE)`, attached
/// later with `move_mount`), symlinks and the contents of the files copied.
pub(crate) struct HostParts {
    system: Vec<(&'static str, Shared)>,
    etc_shared: Vec<(&'static str, Shared)>,
    etc_copied: Vec<(&'static str, Vec<u8>)>,
    devices: Vec<(&'static str, OwnedFd)>,
    workdir: OwnedFd,
    binds: Vec<(OwnedFd, PathBuf)>,
}

/// A host path as shared into the root.
enum Shared {
    Symlink(PathBuf),
    Dir(OwnedFd),
    File(OwnedFd),
}

impl HostParts {
    /// Takes what `sandbox` shares of the host (`workdir` is the host path of the work
    /// directory). Runs in the init, as root, in the host's mount namespace.
    pub(crate) fn gather(sandbox: &Sandbox, workdir: &Path) -> Result<HostParts, String> {
        let fail = |what: &Path| {
            let what = what.display().to_string();
            move |err: io::Error| format!("sandbox: {what}: {}", describe(&err))
        };
        let shared = |names: &[&'static str], dir: &Path| {
            let mut out = Vec::new();
            for name in names {
                let path = dir.join(name);
                if let Some(part) = share(&path).map_err(fail(&path))? {
                    out.push((*name, part));
                }
            }
            Ok::<_, String>(out)
        };
        let mut etc_copied = Vec::new();
        for name in ETC_COPIED {
            if *name == "resolv.conf" && sandbox.resolv_conf.is_some() {
                continue;
            }
            let path = Path::new("/etc").join(name);
            match fs::read(&path) {
                Ok(bytes) => etc_copied.push((*name, bytes)),
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => return Err(fail(&path)(err)),
            }
        }
        let devices = DEVICES
            .iter()
            .map(|name| {
                let path = Path::new("/dev").join(name);
                clone_mount(&path, false)
                    .map(|fd| (*name, fd))
                    .map_err(fail(&path))
            })
            .collect::<Result<_, _>>()?;
        let binds = sandbox
            .binds
            .iter()
            .map(|(source, inside)| {
                clone_mount(source, true)
                    .map(|fd| (fd, inside.clone()))
                    .map_err(fail(source))
            })
            .collect::<Result<_, _>>()?;
        Ok(HostParts {
            system: shared(SYSTEM_DIRS, Path::new("/"))?,
            etc_shared: shared(ETC_SHARED, Path::new("/etc"))?,
            etc_copied,
            devices,
            workdir: clone_mount(workdir, true).map_err(fail(workdir))?,
            binds,
        })
    }
}

/// A detached copy of the mount(s) at `path` (recursive or not).
fn clone_mount(path: &Path, recursive: bool) -> io::Result<OwnedFd> {
    let mut flags = OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC;
    if recursive {
        flags |= OpenTreeFlags::AT_RECURSIVE;
    }
    Ok(rustix::mount::open_tree(CWD, path, flags)?)
}

/// How host path `path` is shared, if it exists.
fn share(path: &Path) -> io::Result<Option<Shared>> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(err),
    };
    Ok(Some(if meta.file_type().is_symlink() {
        Shared::Symlink(fs::read_link(path)?)
    } else if meta.is_dir() {
        Shared::Dir(clone_mount(path, true)?)
    } else {
        Shared::File(clone_mount(path, true)?)
    }))
}

/// Enters `sandbox.base`, if any, then a mount namespace of the init's own (a copy of the
/// base's, or of the host's), whose mounts are private; returns the empty directory to
/// build the root on (`/sandbox` of the base, else `staging`).
pub(crate) fn unshare_mounts<'a>(sandbox: &Sandbox, staging: &'a Path) -> Result<&'a Path, String> {
    if let Some(base) = &sandbox.base {
        let fail = |err: io::Error| format!("sandbox base {}: {}", base.display(), describe(&err));
        let ns = fs::File::open(base).map_err(fail)?;
        rustix::thread::move_into_link_name_space(
            ns.as_fd(),
            Some(rustix::thread::LinkNameSpaceType::Mount),
        )
        .map_err(|e| fail(e.into()))?;
    }
    let flags = UnshareFlags::NEWNS | UnshareFlags::NEWIPC | UnshareFlags::NEWUTS;
    // SAFETY: unshare_unsafe is unsafe because a new mount or fs namespace can invalidate
    // what other threads assume about paths; the init is single-threaded.
    unsafe { rustix::thread::unshare_unsafe(flags) }
        .map_err(|err| format!("unsharing namespaces: {}", describe(&err.into())))?;
    // Keep our mounts (the fresh /proc) from propagating back to the host or the base.
    rustix::mount::mount_change(
        "/",
        MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
    )
    .map_err(|err| format!("making / private: {}", describe(&err.into())))?;
    Ok(if sandbox.base.is_some() {
        Path::new(BASE_STAGING)
    } else {
        staging
    })
}

/// The empty directory of the base's root the sandbox's root is built on.
const BASE_STAGING: &str = "/sandbox";

/// Makes the mount namespace sandboxes start from and binds it at `path` (a file,
/// created; whatever was bound there is unbound first): its root is an empty read-only
/// tmpfs but for the directory `/sandbox`, so an init entering it and unsharing
/// copies one mount instead of the host's many. `scratch` is an empty directory of the
/// host to mount that tmpfs on (in the new namespace only). Runs in the agent, once.
pub fn make_sandbox_base(path: &Path, scratch: &Path) -> io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let _ = rustix::mount::unmount(path, UnmountFlags::DETACH);
    fs::create_dir_all(scratch)?;
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::write(path, b"")?;
    let scratch = CString::new(scratch.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let (mut ready_r, ready_w) = crate::sys::pipe()?;
    // SAFETY: getpid takes nothing.
    let parent = unsafe { libc::getpid() };
    // SAFETY: a raw clone without CLONE_VM gives the child a copy of this process with only
    // the calling thread; the child makes only raw system calls on memory prepared before
    // (no locks, no allocation), so whatever other threads held does not matter.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (libc::CLONE_NEWNS | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid == 0 {
        let w = ready_w.as_raw_fd();
        // SAFETY: as above; every pointer is a NUL-terminated string alive in this copy.
        unsafe {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            let ok = libc::getppid() == parent
                && libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) == 0
                && libc::mount(
                    c"tmpfs".as_ptr(),
                    scratch.as_ptr(),
                    c"tmpfs".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    c"mode=0755,size=16k".as_ptr().cast(),
                ) == 0
                && libc::chdir(scratch.as_ptr()) == 0
                && libc::mkdir(c"sandbox".as_ptr(), 0o755) == 0
                && libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) == 0
                && libc::umount2(c".".as_ptr(), libc::MNT_DETACH) == 0
                && libc::chdir(c"/".as_ptr()) == 0
                && libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REMOUNT
                        | libc::MS_BIND
                        | libc::MS_RDONLY
                        | libc::MS_NOSUID
                        | libc::MS_NODEV
                        | libc::MS_NOEXEC,
                    std::ptr::null(),
                ) == 0;
            if ok {
                libc::write(w, c"1".as_ptr().cast(), 1);
                libc::pause();
            }
            libc::_exit(1);
        }
    }
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    drop(ready_w);
    let pid = pid as libc::pid_t;
    let mut ready = [0u8; 1];
    let result = match std::io::Read::read(&mut ready_r, &mut ready) {
        Ok(1) => rustix::mount::mount_bind(format!("/proc/{pid}/ns/mnt").as_str(), path)
            .map_err(io::Error::from),
        Ok(_) => Err(io::Error::other("the sandbox base could not be set up")),
        Err(err) => Err(err),
    };
    // SAFETY: kill and waitpid take plain integers; the child is ours and unreaped.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
    result
}

/// Builds the root on `root` (an empty directory) from `parts` and makes it `/`. Runs in
/// the init, as root, in its own mount namespace ([`unshare_mounts`]).
pub(crate) fn enter(
    root: &Path,
    parts: HostParts,
    sandbox: &Sandbox,
    creds: Option<&Credentials>,
    hostname: &str,
) -> Result<(), String> {
    let fail = |what: &str| {
        let what = what.to_owned();
        move |err: io::Error| format!("sandbox: {what}: {}", describe(&err))
    };
    mount_tmpfs(
        root,
        "mode=0755,size=4m",
        MountFlags::NOSUID | MountFlags::NODEV,
    )
    .map_err(fail("mounting the root"))?;
    for (dir, part) in parts.system {
        place(part, &root.join(dir)).map_err(fail(&format!("/{dir}")))?;
    }
    write_etc(
        &root.join("etc"),
        parts.etc_shared,
        parts.etc_copied,
        creds,
        sandbox,
        hostname,
    )
    .map_err(fail("/etc"))?;
    mkdir(&root.join("proc"), 0o555).map_err(fail("/proc"))?;
    let proc_flags = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
    rustix::mount::mount("proc", root.join("proc"), "proc", proc_flags, None)
        .map_err(|e| fail("mounting /proc")(e.into()))?;
    make_dev(&root.join("dev"), parts.devices).map_err(fail("/dev"))?;
    mkdir(&root.join("tmp"), 0o1777).map_err(fail("/tmp"))?;
    mount_tmpfs(
        &root.join("tmp"),
        "mode=1777",
        MountFlags::NOSUID | MountFlags::NODEV,
    )
    .map_err(fail("mounting /tmp"))?;
    attach_inside(parts.workdir, root, &sandbox.workdir).map_err(fail(&format!(
        "mounting the work directory at {}",
        sandbox.workdir.display()
    )))?;
    for (source, target) in parts.binds {
        attach_inside(source, root, &target)
            .map_err(fail(&format!("mounting a volume at {}", target.display())))?;
    }
    pivot(root).map_err(fail("entering the root"))?;
    // Read-only from here on: the workload writes to its work directory, volume and /tmp.
    rustix::mount::mount_remount(
        "/",
        MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV,
        "",
    )
    .map_err(|e| fail("making the root read-only")(e.into()))?;
    Ok(())
}

/// Makes `root` the root of this mount namespace.
///
/// In a copy of the sandbox base (`root` is its [`BASE_STAGING`]) the root is moved onto
/// `/` and entered with `chroot`: the old root left below it is the base's empty read-only
/// tmpfs, nothing of the host's (the workload can neither `chroot` nor `pivot_root`: its
/// seccomp filter refuses both, and it has no capability). `pivot_root` would walk every
/// thread of the host to move the roots that point at the old one (`chroot_fs_refs`), a
/// cost that grows with the host's machines (three processes each). Elsewhere (a copy of
/// the host's mounts) the old root must go: `pivot_root`, then the old root detached.
fn pivot(root: &Path) -> io::Result<()> {
    rustix::process::chdir(root)?;
    if root == Path::new(BASE_STAGING) {
        rustix::mount::mount_move(".", "/")?;
        rustix::process::chroot(".")?;
    } else {
        // pivot_root(".", ".") stacks the old root under the new one at "/"; detaching "/"
        // then removes the old root (runc's way: no directory for the old root is needed).
        rustix::process::pivot_root(".", ".")?;
        rustix::mount::unmount(".", UnmountFlags::DETACH)?;
    }
    rustix::process::chdir("/")?;
    Ok(())
}

fn mount_tmpfs(target: &Path, options: &str, flags: MountFlags) -> io::Result<()> {
    let data = std::ffi::CString::new(options).map_err(io::Error::other)?;
    rustix::mount::mount("tmpfs", target, "tmpfs", flags, Some(data.as_c_str()))
        .map_err(io::Error::from)
}

fn mkdir(path: &Path, mode: u32) -> io::Result<()> {
    fs::DirBuilder::new().mode(mode).create(path)?;
    // The umask may have taken bits away (the sticky bit of /tmp among them).
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}

/// Puts a shared host path at `target` (created): read-only, or a copy of the symlink.
fn place(part: Shared, target: &Path) -> io::Result<()> {
    match part {
        Shared::Symlink(to) => symlink(to, target),
        Shared::Dir(mount) => {
            mkdir(target, 0o755)?;
            attach(mount, target, true)
        }
        Shared::File(mount) => {
            fs::write(target, b"")?;
            attach(mount, target, true)
        }
    }
}

/// Attaches the detached `mount` at `target`, read-only or not; never suid or devices.
fn attach(mount: OwnedFd, target: &Path, read_only: bool) -> io::Result<()> {
    rustix::mount::move_mount(
        mount.as_fd(),
        "",
        CWD,
        target,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )?;
    let mut flags = MountFlags::BIND | MountFlags::NOSUID | MountFlags::NODEV;
    if read_only {
        flags |= MountFlags::RDONLY;
    }
    rustix::mount::mount_remount(target, flags, "")?;
    Ok(())
}

/// Attaches `mount` (a host directory) read-write at `inside` (an absolute path) under
/// `root`, creating the mount point.
fn attach_inside(mount: OwnedFd, root: &Path, inside: &Path) -> io::Result<()> {
    let relative = inside.strip_prefix("/").unwrap_or(inside);
    let target = root.join(relative);
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&target)?;
    attach(mount, &target, false)
}

/// The private `/etc`.
fn write_etc(
    etc: &Path,
    shared: Vec<(&str, Shared)>,
    copied: Vec<(&str, Vec<u8>)>,
    creds: Option<&Credentials>,
    sandbox: &Sandbox,
    hostname: &str,
) -> io::Result<()> {
    let (user_name, home) = (sandbox.user_name.as_str(), &sandbox.workdir);
    mkdir(etc, 0o755)?;
    let (uid, gid) = creds.map_or((0, 0), |c| (c.uid, c.gid));
    let mut passwd = String::from("root:x:0:0:root:/root:/usr/sbin/nologin\n");
    let mut group = String::from("root:x:0:\n");
    if uid != 0 {
        let name = if user_name.is_empty() {
            "machine"
        } else {
            user_name
        };
        passwd += &format!("{name}:x:{uid}:{gid}::{}:/bin/sh\n", home.display());
        group += &format!("{name}:x:{gid}:\n");
    }
    passwd += "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
    group += "nogroup:x:65534:\n";
    fs::write(etc.join("passwd"), passwd)?;
    fs::write(etc.join("group"), group)?;
    fs::write(etc.join("hostname"), format!("{hostname}\n"))?;
    fs::write(
        etc.join("hosts"),
        format!("127.0.0.1\tlocalhost {hostname}\n::1\tlocalhost ip6-localhost ip6-loopback\n"),
    )?;
    fs::write(
        etc.join("nsswitch.conf"),
        "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\n\
         protocols: files\nservices: files\n",
    )?;
    if let Some(resolv) = &sandbox.resolv_conf {
        fs::write(etc.join("resolv.conf"), resolv)?;
    }
    for (name, bytes) in copied {
        fs::write(etc.join(name), bytes)?;
    }
    for (name, part) in shared {
        place(part, &etc.join(name))?;
    }
    Ok(())
}

/// The private `/dev`: a few host devices, a new `pts` instance, `shm`, the usual links.
fn make_dev(dev: &Path, devices: Vec<(&str, OwnedFd)>) -> io::Result<()> {
    mkdir(dev, 0o755)?;
    mount_tmpfs(
        dev,
        "mode=0755,size=64k",
        MountFlags::NOSUID | MountFlags::NOEXEC,
    )?;
    for (name, device) in devices {
        let target = dev.join(name);
        fs::write(&target, b"")?;
        rustix::mount::move_mount(
            device.as_fd(),
            "",
            CWD,
            &target,
            MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
        )?;
    }
    mkdir(&dev.join("pts"), 0o755)?;
    rustix::mount::mount(
        "devpts",
        dev.join("pts"),
        "devpts",
        MountFlags::NOSUID | MountFlags::NOEXEC,
        Some(c"newinstance,ptmxmode=0666,mode=0620"),
    )?;
    symlink("pts/ptmx", dev.join("ptmx"))?;
    mkdir(&dev.join("shm"), 0o1777)?;
    mount_tmpfs(
        &dev.join("shm"),
        "mode=1777",
        MountFlags::NOSUID | MountFlags::NODEV,
    )?;
    for (link, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        symlink(to, dev.join(link))?;
    }
    Ok(())
}

/// Joins the network namespace at `path` (the init, before the root is built).
pub(crate) fn join_netns(path: &Path) -> Result<(), String> {
    let fail = |err: io::Error| format!("network namespace {}: {}", path.display(), describe(&err));
    let ns = fs::File::open(path).map_err(fail)?;
    rustix::thread::move_into_link_name_space(
        std::os::fd::AsFd::as_fd(&ns),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )
    .map_err(|e| fail(e.into()))
}

/// First half of dropping every capability, before the user switch (which needs
/// `CAP_SETUID`): empties the bounding and ambient sets, so that nothing the process
/// executes can gain a capability back (uid 0 included).
pub(crate) fn drop_bounding_capabilities() -> io::Result<()> {
    let last: u32 = fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63);
    for cap in 0..=last {
        // SAFETY: PR_CAPBSET_DROP takes a capability number and no pointers.
        let ret = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        if ret == -1 {
            let err = io::Error::last_os_error();
            // A capability this kernel does not know.
            if err.raw_os_error() != Some(libc::EINVAL) {
                return Err(err);
            }
        }
    }
    rustix::thread::clear_ambient_capability_set()?;
    Ok(())
}

/// Second half, after the user switch: empties the effective, permitted and inheritable
/// sets (a switch to a non-zero uid already emptied the first two; uid 0 keeps them).
pub(crate) fn clear_capabilities() -> io::Result<()> {
    use rustix::thread::{CapabilitySet, CapabilitySets};
    rustix::thread::set_capabilities(
        None,
        CapabilitySets {
            effective: CapabilitySet::empty(),
            permitted: CapabilitySet::empty(),
            inheritable: CapabilitySet::empty(),
        },
    )?;
    Ok(())
}
