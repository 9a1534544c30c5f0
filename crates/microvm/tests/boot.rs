//! Boots a real microVM under TCG with the command lines this crate makes: Debian's cloud
//! kernel (`scripts/vm-kernel`, found through `BAZAAR_VM_KERNEL`), an initramfs of
//! busybox-static that loads the virtio modules, mounts the virtio-blk root disk and echoes
//! what it found, then powers off. Needs qemu-system-x86, busybox-static and e2fsprogs
//! (scripts/test installs them). Leaves nothing: its files are in a temporary directory.

use std::path::PathBuf;
use std::process::Command;

use bazaar_microvm::{Accel, GuestBoot, GuestNet, VmSpec};

mod support;
use support::kernel;

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn run(cmd: &mut Command) {
    let status = cmd.status().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(status.success(), "{cmd:?}: {status}");
}

const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t devtmpfs dev /dev
/bin/busybox mount -t sysfs sys /sys
for m in virtio_ring virtio virtio_mmio virtio_blk failover net_failover virtio_net virtio_console; do
  /bin/busybox insmod /mods/$m.ko
done
/bin/busybox mkdir -p /newroot
/bin/busybox mount -t ext4 /dev/vda /newroot && echo "root=$(/bin/busybox cat /newroot/hello)"
echo "uname=$(/bin/busybox uname -r)"
# virtio-serial ports come up after the driver's probe (control messages): wait for one.
for i in $(/bin/busybox seq 100); do
  [ -n "$(/bin/busybox cat /sys/class/virtio-ports/*/name 2>/dev/null)" ] && break
  /bin/busybox sleep 0.1
done
echo "port=$(/bin/busybox cat /sys/class/virtio-ports/*/name)"
echo "cmdline=$(/bin/busybox cat /proc/cmdline)"
/bin/busybox poweroff -f
"#;

#[test]
fn a_microvm_boots_under_tcg_with_its_root_disk_and_command_line() {
    let kernel = kernel();
    let modules = kernel.parent().unwrap().join("modules");
    let dir =
        TempDir(std::env::temp_dir().join(format!("bazaar-microvm-boot-{}", std::process::id())));
    let d = &dir.0;
    for sub in [
        "initrd/bin",
        "initrd/mods",
        "initrd/proc",
        "initrd/dev",
        "initrd/sys",
        "rootfs",
    ] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    std::fs::copy("/bin/busybox", d.join("initrd/bin/busybox")).unwrap();
    for m in std::fs::read_dir(&modules).unwrap_or_else(|e| panic!("{}: {e}", modules.display())) {
        let m = m.unwrap();
        std::fs::copy(m.path(), d.join("initrd/mods").join(m.file_name())).unwrap();
    }
    std::fs::write(d.join("initrd/init"), INIT).unwrap();
    run(Command::new("chmod").arg("+x").arg(d.join("initrd/init")));
    run(Command::new("sh")
        .arg("-c")
        .arg("cd initrd && find . | busybox cpio -o -H newc > ../initrd.cpio 2>/dev/null")
        .current_dir(d));
    std::fs::write(d.join("rootfs/hello"), "the image's root").unwrap();
    std::fs::File::create(d.join("root.ext4"))
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    run(Command::new("mkfs.ext4")
        .args(["-q", "-d"])
        .arg(d.join("rootfs"))
        .arg(d.join("root.ext4")));

    let boot = GuestBoot {
        root: "/dev/vda".into(),
        net: Some(GuestNet {
            address: "172.19.4.2".parse().unwrap(),
            prefix: 30,
            gateway: "172.19.4.1".parse().unwrap(),
            dns: vec!["172.19.4.1".parse().unwrap()],
        }),
        init: "/init".into(),
        tcg: true,
    };
    let spec = VmSpec {
        qemu: "qemu-system-x86_64".into(),
        accel: Accel::Tcg,
        cpus: 1,
        memory_mb: 256,
        kernel,
        initrd: Some(d.join("initrd.cpio")),
        cmdline: boot.to_cmdline(),
        root_disk: d.join("root.ext4"),
        volume_disks: vec![],
        tap: None,
        exec_socket: d.join("exec.sock"),
        ctl_socket: d.join("ctl.sock"),
        qmp_socket: d.join("qmp.sock"),
    };
    let argv = spec.argv();
    // `timeout` bounds a guest that never powers off; the boot takes ~2 s under TCG.
    let out = Command::new("timeout")
        .arg("300")
        .args(&argv)
        .output()
        .expect("qemu-system-x86_64");
    let console = String::from_utf8_lossy(&out.stdout).replace('\r', "");
    assert!(
        out.status.success(),
        "{argv:?}: {}\n{console}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let line = |key: &str| {
        console
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} on the console:\n{console}"))
            .to_string()
    };
    assert_eq!(line("root="), "the image's root");
    assert!(line("uname=").ends_with("-cloud-amd64"), "{console}");
    // The exec port is there, under its name, for the init to serve exec on.
    assert_eq!(line("port="), bazaar_microvm::qemu::EXEC_PORT);
    // The guest reads back what the agent wrote.
    assert_eq!(GuestBoot::parse(&line("cmdline=")).unwrap(), boot);
}
