//! microVM machines (`config.runtime = "microvm"`, issue 33 item 3): the host side of a
//! QEMU `-machine microvm` run, over the pure command lines of `bazaar_microvm`.
//!
//! What is here (`oci.rs` calls [`prepare`] for a `microvm` machine once its rootfs is
//! made; `launch`'s doc says what the driver adds):
//! - [`MicroVm::detect`]: QEMU in `PATH`, the operator's guest kernel (`--vm-kernel`) and
//!   the virtio modules beside it (the `modules/` directory `scripts/vm-kernel` extracts),
//!   and the accelerator: KVM with hardware virtualization, else TCG only when allowed.
//! - [`make_root_disk`]: a run's root disk, an ext4 image of the image's unpacked rootfs
//!   (`mkfs.ext4 -d`), sparse, of the machine's rootfs size.
//! - [`write_initramfs`]: the initramfs the cloud kernel needs for its virtio drivers: a
//!   `newc` cpio (written here, no `cpio` tool) of busybox-static, the modules and a
//!   small `/init` that loads them, mounts the root disk and hands over to the guest init
//!   the kernel command line names (`init=`, `bazaar_microvm::cmdline::GUEST_INIT`).
//! - [`MicroVm::run_argv`]: what the shim runs: `nsenter --net=<netns>` (QEMU opens the
//!   machine's tap inside its network namespace) then QEMU's argv, with `-pidfile` where
//!   the driver waits for a runc container's pid ([`crate::oci::pid_file`]).
//! - [`wire_tap`]: the guest takes the machine's address: in the machine's network
//!   namespace the address comes off `eth0` (the veth to the host's bridge), and `eth0`
//!   and a persistent tap QEMU opens by name become ports of a bridge there. Deleting the
//!   namespace (as for any machine) removes them.

mod launch;

pub use launch::{
    ctl_socket, exec_argv, exec_socket, is_vm_run, prepare, signal_argv, workload_exit, VmLaunch,
    OVERHEAD_MB,
};

use bazaar_microvm::{choose_accel, Accel, VmSpec};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The modules the cloud kernel needs for a microvm's devices, in load order.
pub const VIRTIO_MODULES: [&str; 8] = [
    "virtio_ring",
    "virtio",
    "virtio_mmio",
    "virtio_blk",
    "failover",
    "net_failover",
    "virtio_net",
    "virtio_console",
];

/// The initramfs's `/init`: loads the virtio modules, mounts the root disk (`/dev/vda`)
/// and switches to the guest init named by `init=` on the kernel command line.
const STAGE1_INIT: &str = r#"#!/bin/busybox sh
B=/bin/busybox
$B mount -t proc proc /proc
$B mount -t devtmpfs dev /dev
for m in $(cat /mods/order); do $B insmod /mods/$m.ko || echo "bazaar: insmod $m failed"; done
init=/.bazaar/init
for w in $(cat /proc/cmdline); do case "$w" in init=*) init="${w#init=}";; esac; done
$B mkdir -p /newroot
$B mount -t ext4 -o rw /dev/vda /newroot || { echo "bazaar: no root disk"; $B poweroff -f; }
$B umount /proc
$B mount --move /dev /newroot/dev 2>/dev/null || $B umount /dev
exec $B switch_root /newroot "$init"
"#;

/// The host label naming the accelerator microVM machines run with there (`kvm`, `tcg`),
/// on a host that runs them.
pub const ACCEL_LABEL: &str = "microvm_accel";

/// The environment variable naming the guest init when it is not beside the executable
/// (`scripts/vminit` builds it into a target directory of its own).
pub const INIT_VAR: &str = "BAZAAR_VMINIT";

/// How this host runs microVM machines.
#[derive(Debug, Clone)]
pub struct MicroVm {
    pub qemu: PathBuf,
    pub kernel: PathBuf,
    /// The directory of the virtio modules (`<kernel dir>/modules`), when there is one.
    pub modules: Option<PathBuf>,
    pub accel: Accel,
    /// bazaar's static guest init (`crates/vminit`, built by `scripts/vminit`).
    pub init: PathBuf,
    /// A static busybox for the initramfs (`busybox-static`).
    pub busybox: PathBuf,
}

/// One run of a microVM machine, as [`MicroVm::prepare_run`] sets it up.
#[derive(Debug, Clone)]
pub struct GuestRun<'a> {
    /// The machine's id.
    pub id: &'a str,
    /// The run's unpacked root filesystem (the image's, with the agent's files in it).
    pub rootfs: &'a Path,
    /// The run's directory: its root disk, initramfs, sockets and QEMU's pid file.
    pub run_dir: &'a Path,
    /// The root disk's size in bytes (the machine's rootfs size).
    pub disk_size: u64,
    pub workload: &'a bazaar_vminit::Workload,
    /// The machine's network namespace and the guest's address in it.
    pub netns: &'a Path,
    pub net: bazaar_microvm::GuestNet,
    pub cpus: u32,
    pub memory_mb: u32,
}

impl MicroVm {
    /// This host's microVM runtime, or why it has none: no `--vm-kernel`, no QEMU, no
    /// guest init (`init`, else [`INIT_VAR`], else `bazaar-vminit` beside this executable), or neither KVM
    /// nor TCG allowed (`--vm-allow-tcg`).
    pub fn detect(
        kernel: Option<&Path>,
        init: Option<&Path>,
        allow_tcg: bool,
    ) -> Result<MicroVm, String> {
        let kernel = kernel.ok_or("no guest kernel configured (agent flag --vm-kernel)")?;
        if !kernel.is_file() {
            return Err(format!(
                "the guest kernel {} is not a file",
                kernel.display()
            ));
        }
        let qemu = crate::oci::find_in_path("qemu-system-x86_64")
            .ok_or("qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)")?;
        let accel = choose_accel(kvm_usable(), allow_tcg).map_err(|e| e.to_string())?;
        let modules = kernel
            .parent()
            .map(|d| d.join("modules"))
            .filter(|m| m.is_dir());
        let init = match init {
            Some(p) => p.to_path_buf(),
            None if std::env::var_os(INIT_VAR).is_some() => {
                PathBuf::from(std::env::var_os(INIT_VAR).unwrap_or_default())
            }
            None => std::env::current_exe()
                .map_err(|e| format!("this executable's path: {e}"))?
                .with_file_name("bazaar-vminit"),
        };
        if !init.is_file() {
            return Err(format!(
                "no guest init at {} (scripts/vminit builds it)",
                init.display()
            ));
        }
        let busybox = crate::oci::find_in_path("busybox")
            .ok_or("busybox is not installed (apt-get install busybox-static)")?;
        Ok(MicroVm {
            qemu,
            kernel: kernel.to_path_buf(),
            modules,
            accel,
            init,
            busybox,
        })
    }

    /// Sets up `run` and answers the argv the shim runs: the guest init and the workload's
    /// files in the rootfs (`/.bazaar`), the root disk made of it, the initramfs of the
    /// kernel's modules, the tap wired in the machine's namespace ([`wire_tap`]).
    /// Idempotent (a redone launch step makes them again).
    pub fn prepare_run(&self, run: &GuestRun<'_>) -> io::Result<Vec<String>> {
        use std::os::unix::fs::PermissionsExt;
        let dir = run.rootfs.join(bazaar_vminit::DIR.trim_start_matches('/'));
        std::fs::create_dir_all(&dir)?;
        let init = run
            .rootfs
            .join(bazaar_microvm::cmdline::GUEST_INIT.trim_start_matches('/'));
        std::fs::copy(&self.init, &init)?;
        std::fs::set_permissions(&init, std::fs::Permissions::from_mode(0o755))?;
        for (name, data) in run.workload.to_files() {
            std::fs::write(dir.join(name), data)?;
        }
        let root_disk = run.run_dir.join("root.ext4");
        make_root_disk(run.rootfs, &root_disk, run.disk_size)?;
        let initrd = match &self.modules {
            Some(modules) => {
                let path = run.run_dir.join("initrd.cpio");
                write_initramfs(&self.busybox, modules, &path)?;
                Some(path)
            }
            None => None,
        };
        wire_tap(run.netns, run.net.address, run.net.prefix)?;
        let spec = VmSpec {
            qemu: self.qemu.clone(),
            accel: self.accel,
            cpus: run.cpus,
            memory_mb: run.memory_mb,
            kernel: self.kernel.clone(),
            initrd,
            cmdline: bazaar_microvm::GuestBoot {
                root: "/dev/vda".into(),
                net: Some(run.net.clone()),
                init: bazaar_microvm::cmdline::GUEST_INIT.into(),
                tcg: self.accel == Accel::Tcg,
            }
            .to_cmdline(),
            root_disk,
            volume_disks: vec![],
            tap: Some((VM_TAP.into(), bazaar_microvm::guest_mac(run.net.address))),
            exec_socket: run.run_dir.join("exec.sock"),
            ctl_socket: run.run_dir.join("ctl.sock"),
            qmp_socket: run.run_dir.join("qmp.sock"),
        };
        Ok(self.run_argv(&spec, run.netns, &crate::oci::pid_file(run.run_dir)))
    }

    /// The argv the shim runs for `spec`: QEMU inside the network namespace `netns`,
    /// writing its pid to `pid_file` once the guest is set up.
    pub fn run_argv(&self, spec: &VmSpec, netns: &Path, pid_file: &Path) -> Vec<String> {
        let mut v = vec![
            "nsenter".to_string(),
            format!("--net={}", netns.display()),
            "--".to_string(),
        ];
        v.extend(spec.argv());
        v.push("-pidfile".into());
        v.push(pid_file.display().to_string());
        v
    }
}

/// The bridge in a microVM machine's network namespace.
pub const VM_BRIDGE: &str = "vmbr0";

/// The tap QEMU opens in a microVM machine's network namespace.
pub const VM_TAP: &str = "vmtap0";

/// Moves the machine's address `ip/prefix` from `eth0` of network namespace `netns` to
/// the guest: makes the persistent tap [`VM_TAP`] and bridges it with `eth0` on
/// [`VM_BRIDGE`], `eth0` taking `02:63:` and the address as its MAC (the guest has the
/// address's usual one, `bazaar_microvm::guest_mac`). Idempotent (a redone launch step
/// finds them made).
pub fn wire_tap(netns: &Path, ip: std::net::Ipv4Addr, prefix: u8) -> io::Result<()> {
    use crate::netlink::{in_namespace, link_index, Rtnl};
    use std::os::fd::AsFd;
    let ns = std::fs::File::open(netns)?;
    in_namespace(ns.as_fd(), || {
        if link_index(VM_TAP).is_none() {
            make_persistent_tap(VM_TAP)?;
        }
        let mut rtnl = Rtnl::open()?;
        if link_index(VM_BRIDGE).is_none() {
            rtnl.add_bridge(VM_BRIDGE, None)?;
        }
        let missing = |name: &str| io::Error::other(format!("no link {name} in the namespace"));
        let bridge = link_index(VM_BRIDGE).ok_or_else(|| missing(VM_BRIDGE))?;
        let eth0 = link_index("eth0").ok_or_else(|| missing("eth0"))?;
        let tap = link_index(VM_TAP).ok_or_else(|| missing(VM_TAP))?;
        match rtnl.delete_address(eth0, ip, prefix) {
            Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) => {}
            r => r?,
        }
        // The guest answers for the address with the MAC a machine on it always has
        // (`guest_mac`); `eth0`, now only a port of the bridge, must not share it.
        let [a, b, c, d] = ip.octets();
        rtnl.set_mac(eth0, [0x02, 0x63, a, b, c, d])?;
        rtnl.set_up(bridge)?;
        rtnl.set_master(eth0, bridge)?;
        rtnl.set_master(tap, bridge)
    })
}

/// Makes tap `name` in the calling thread's namespace, persistent (it outlives this
/// descriptor; QEMU opens it by name).
fn make_persistent_tap(name: &str) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    const TUNSETIFF: libc::Ioctl = 0x4004_54ca;
    const TUNSETPERSIST: libc::Ioctl = 0x4004_54cb;
    const IFF_TAP: libc::c_short = 0x0002;
    const IFF_NO_PI: libc::c_short = 0x1000;
    let tun = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")?;
    // SAFETY: ifreq is plain data, zero is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(name.bytes().take(15)) {
        *d = s as libc::c_char;
    }
    req.ifr_ifru.ifru_flags = IFF_TAP | IFF_NO_PI;
    // SAFETY: the ioctls take our ifreq and an int, on our descriptor.
    if unsafe { libc::ioctl(tun.as_raw_fd(), TUNSETIFF, &mut req) } != 0
        || unsafe { libc::ioctl(tun.as_raw_fd(), TUNSETPERSIST, 1 as libc::c_ulong) } != 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `/dev/kvm` is backed by hardware virtualization (an emulated one, as under
/// PVM, crawls: TCG is faster there).
fn kvm_usable() -> bool {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags = cpu
        .lines()
        .find(|l| l.starts_with("flags"))
        .unwrap_or_default();
    flags.split_whitespace().any(|f| f == "vmx" || f == "svm")
        && std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
            .is_ok()
}

/// Makes `disk`, a sparse ext4 image of `size` bytes holding a copy of `rootfs`
/// (`mkfs.ext4 -d`, which keeps owners, modes, links and device nodes). Replaces a disk
/// already there (a redone launch step).
pub fn make_root_disk(rootfs: &Path, disk: &Path, size: u64) -> io::Result<()> {
    let _ = std::fs::remove_file(disk);
    std::fs::File::create(disk)?.set_len(size)?;
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-E", "root_owner=0:0", "-d"])
        .arg(rootfs)
        .arg(disk)
        .output()?;
    if !out.status.success() {
        let _ = std::fs::remove_file(disk);
        return Err(io::Error::other(format!(
            "mkfs.ext4 -d {}: {}: {}",
            rootfs.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Writes the initramfs to `out`: `busybox` (a static one) as `/bin/busybox`, the
/// [`VIRTIO_MODULES`] found in `modules` under `/mods`, and the stage-one `/init`.
pub fn write_initramfs(busybox: &Path, modules: &Path, out: &Path) -> io::Result<()> {
    let mut cpio = Cpio::default();
    for dir in ["bin", "mods", "proc", "dev", "sys", "newroot"] {
        cpio.dir(dir);
    }
    cpio.file("bin/busybox", 0o755, &std::fs::read(busybox)?);
    let mut order = String::new();
    for m in VIRTIO_MODULES {
        let path = modules.join(format!("{m}.ko"));
        match std::fs::read(&path) {
            Ok(data) => {
                cpio.file(&format!("mods/{m}.ko"), 0o644, &data);
                order.push_str(m);
                order.push('\n');
            }
            // A driver built into the kernel has no module.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
        }
    }
    cpio.file("mods/order", 0o644, order.as_bytes());
    cpio.file("init", 0o755, STAGE1_INIT.as_bytes());
    let tmp = out.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&cpio.finish())?;
    f.sync_all()?;
    std::fs::rename(&tmp, out)
}

/// A `newc` cpio archive, as the kernel unpacks an initramfs.
#[derive(Default)]
struct Cpio {
    out: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.ino += 1;
        let header = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.ino,
            mode,
            0,
            0,
            1,
            0,
            data.len(),
            0,
            0,
            0,
            0,
            name.len() + 1,
            0
        );
        self.out.extend_from_slice(header.as_bytes());
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040_755, &[]);
    }

    fn file(&mut self, name: &str, perm: u32, data: &[u8]) {
        self.entry(name, 0o100_000 | perm, data);
    }

    fn finish(mut self) -> Vec<u8> {
        self.ino = 0;
        self.entry("TRAILER!!!", 0, &[]);
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bazaar_microvm::GuestBoot;

    #[test]
    fn a_root_disk_holds_the_rootfs() {
        let d = tempfile::tempdir().unwrap();
        let rootfs = d.path().join("rootfs");
        std::fs::create_dir_all(rootfs.join("etc")).unwrap();
        std::fs::write(rootfs.join("etc/hostname"), "m1\n").unwrap();
        let disk = d.path().join("root.ext4");
        make_root_disk(&rootfs, &disk, 16 << 20).unwrap();
        let meta = std::fs::metadata(&disk).unwrap();
        assert_eq!(meta.len(), 16 << 20);
        // debugfs reads the file back out of the image without mounting it.
        let out = Command::new("debugfs")
            .args(["-R", "cat /etc/hostname"])
            .arg(&disk)
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "m1\n");
        // Too small for its contents: an error, and no half-made disk left.
        std::fs::write(rootfs.join("big"), vec![7u8; 4 << 20]).unwrap();
        let err = make_root_disk(&rootfs, &disk, 1 << 20).unwrap_err();
        assert!(err.to_string().contains("mkfs.ext4"), "{err}");
        assert!(!disk.exists());
    }

    #[test]
    fn the_initramfs_is_a_newc_archive_the_kernel_reads() {
        let d = tempfile::tempdir().unwrap();
        let mods = d.path().join("modules");
        std::fs::create_dir(&mods).unwrap();
        std::fs::write(mods.join("virtio_blk.ko"), b"module").unwrap();
        std::fs::write(d.path().join("busybox"), b"bb").unwrap();
        let out = d.path().join("initrd.cpio");
        write_initramfs(&d.path().join("busybox"), &mods, &out).unwrap();
        let data = std::fs::read(&out).unwrap();
        assert!(data.len().is_multiple_of(4));
        // busybox's own cpio lists it as the kernel will unpack it.
        let listed = Command::new("busybox")
            .args(["cpio", "-t"])
            .stdin(std::fs::File::open(&out).unwrap())
            .output()
            .unwrap();
        let names = String::from_utf8_lossy(&listed.stdout);
        for name in ["init", "bin/busybox", "mods/virtio_blk.ko", "mods/order"] {
            assert!(names.lines().any(|l| l == name), "{name} in {names}");
        }
        assert!(!names.contains("virtio_net"), "{names}");
    }

    #[test]
    fn qemu_runs_in_the_machines_network_namespace() {
        let vm = MicroVm {
            qemu: "/usr/bin/qemu-system-x86_64".into(),
            kernel: "/k/vmlinuz".into(),
            modules: None,
            accel: Accel::Tcg,
            init: "/b/bazaar-vminit".into(),
            busybox: "/bin/busybox".into(),
        };
        let spec = VmSpec {
            qemu: vm.qemu.clone(),
            accel: vm.accel,
            cpus: 1,
            memory_mb: 256,
            kernel: vm.kernel.clone(),
            initrd: None,
            cmdline: GuestBoot {
                root: "/dev/vda".into(),
                net: None,
                init: bazaar_microvm::cmdline::GUEST_INIT.into(),
                tcg: true,
            }
            .to_cmdline(),
            root_disk: "/r/root.ext4".into(),
            volume_disks: vec![],
            tap: None,
            exec_socket: "/r/exec.sock".into(),
            ctl_socket: "/r/ctl.sock".into(),
            qmp_socket: "/r/qmp.sock".into(),
        };
        let argv = vm.run_argv(&spec, Path::new("/run/netns/m1"), Path::new("/r/c.pid"));
        assert_eq!(
            argv[..4],
            [
                "nsenter",
                "--net=/run/netns/m1",
                "--",
                "/usr/bin/qemu-system-x86_64"
            ]
        );
        assert_eq!(argv[argv.len() - 2..], ["-pidfile", "/r/c.pid"]);
    }
}
