//! The private root file system of a sandboxed run ([`Sandbox`]), built by the mini init in
//! its new mount namespace before it forks the workload, and the capability drop that every
//! confined process (a sandboxed workload, an `exec` inside it) goes through.
//!
//! The root is a tmpfs mounted on `RUN_DIR/root` and made `/` with `pivot_root`; the host's
//! root is then detached, so nothing of it is reachable but what was mounted in:
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

use rustix::mount::{MountFlags, UnmountFlags};
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
}

/// Host directories shared read-only (those that exist; a symlink is recreated as is).
const SYSTEM_DIRS: &[&str] = &["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];
/// Host files copied into the private `/etc` when they exist.
const ETC_COPIED: &[&str] = &["resolv.conf", "ld.so.cache", "localtime", "mime.types"];
/// Host directories of `/etc` shared read-only when they exist.
const ETC_SHARED: &[&str] = &["ssl", "ca-certificates", "alternatives"];
/// Host devices bind-mounted into the private `/dev`.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// Builds the root under `staging` (an empty directory) and makes it `/`. Runs in the
/// init, as root, in a new mount namespace whose mounts are private; `workdir` is the host
/// path of the work directory.
pub(crate) fn enter(
    staging: &Path,
    sandbox: &Sandbox,
    workdir: &Path,
    creds: Option<&Credentials>,
    hostname: &str,
) -> Result<(), String> {
    let root = staging;
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
    for dir in SYSTEM_DIRS {
        share_system_path(&Path::new("/").join(dir), &root.join(dir))
            .map_err(fail(&format!("/{dir}")))?;
    }
    write_etc(&root.join("etc"), creds, sandbox, hostname).map_err(fail("/etc"))?;
    mkdir(&root.join("proc"), 0o555).map_err(fail("/proc"))?;
    let proc_flags = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
    rustix::mount::mount("proc", root.join("proc"), "proc", proc_flags, None)
        .map_err(|e| fail("mounting /proc")(e.into()))?;
    make_dev(&root.join("dev")).map_err(fail("/dev"))?;
    mkdir(&root.join("tmp"), 0o1777).map_err(fail("/tmp"))?;
    mount_tmpfs(
        &root.join("tmp"),
        "mode=1777",
        MountFlags::NOSUID | MountFlags::NODEV,
    )
    .map_err(fail("mounting /tmp"))?;
    bind_inside(workdir, root, &sandbox.workdir).map_err(fail(&format!(
        "mounting the work directory at {}",
        sandbox.workdir.display()
    )))?;
    for (source, target) in &sandbox.binds {
        bind_inside(source, root, target).map_err(fail(&format!(
            "mounting {} at {}",
            source.display(),
            target.display()
        )))?;
    }
    pivot(root).map_err(fail("pivot_root"))?;
    // Read-only from here on: the workload writes to its work directory, volume and /tmp.
    rustix::mount::mount_remount(
        "/",
        MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV,
        "",
    )
    .map_err(|e| fail("making the root read-only")(e.into()))?;
    Ok(())
}

/// Makes `root` the root of this mount namespace and detaches the old one.
fn pivot(root: &Path) -> io::Result<()> {
    rustix::process::chdir(root)?;
    // pivot_root(".", ".") stacks the old root under the new one at "/"; detaching "/"
    // then removes the old root (runc's way: no directory for the old root is needed).
    rustix::process::pivot_root(".", ".")?;
    rustix::mount::unmount(".", UnmountFlags::DETACH)?;
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

/// Bind-mounts `source` read-only at `target` (created), or copies it if it is a symlink.
fn share_system_path(source: &Path, target: &Path) -> io::Result<()> {
    let meta = match fs::symlink_metadata(source) {
        Ok(meta) => meta,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(err),
    };
    if meta.file_type().is_symlink() {
        return symlink(fs::read_link(source)?, target);
    }
    if meta.is_dir() {
        mkdir(target, 0o755)?;
    } else {
        fs::write(target, b"")?;
    }
    bind(source, target, true)
}

/// Bind-mounts `source` (recursively) at `target`, read-only or not; never suid or devices.
fn bind(source: &Path, target: &Path, read_only: bool) -> io::Result<()> {
    rustix::mount::mount_bind_recursive(source, target)?;
    let mut flags = MountFlags::BIND | MountFlags::NOSUID | MountFlags::NODEV;
    if read_only {
        flags |= MountFlags::RDONLY;
    }
    rustix::mount::mount_remount(target, flags, "")?;
    Ok(())
}

/// Bind-mounts host directory `source` read-write at `inside` (an absolute path) under
/// `root`, creating the mount point.
fn bind_inside(source: &Path, root: &Path, inside: &Path) -> io::Result<()> {
    let relative = inside.strip_prefix("/").unwrap_or(inside);
    let target = root.join(relative);
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&target)?;
    bind(source, &target, false)
}

/// The private `/etc`.
fn write_etc(
    etc: &Path,
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
    for name in ETC_COPIED {
        if *name == "resolv.conf" && sandbox.resolv_conf.is_some() {
            continue;
        }
        match fs::copy(Path::new("/etc").join(name), etc.join(name)) {
            Ok(_) => {}
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            Err(err) => return Err(err),
        }
    }
    for name in ETC_SHARED {
        share_system_path(&Path::new("/etc").join(name), &etc.join(name))?;
    }
    Ok(())
}

/// The private `/dev`: a few host devices, a new `pts` instance, `shm`, the usual links.
fn make_dev(dev: &Path) -> io::Result<()> {
    mkdir(dev, 0o755)?;
    mount_tmpfs(
        dev,
        "mode=0755,size=64k",
        MountFlags::NOSUID | MountFlags::NOEXEC,
    )?;
    for name in DEVICES {
        let target = dev.join(name);
        fs::write(&target, b"")?;
        rustix::mount::mount_bind(Path::new("/dev").join(name), &target)?;
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
