//! Boots a real microVM under TCG from what `bazaar_runtime::microvm` makes: a root disk
//! of a rootfs (`make_root_disk`) and the initramfs that loads the cloud kernel's virtio
//! modules and hands over to the guest init on that disk (`write_initramfs`). The guest
//! init here is a busybox script that says what it sees and powers off. Needs the kernel
//! of `scripts/vm-kernel` (`BAZAAR_VM_KERNEL`, else `~/.cache/bazaar/vm/vmlinuz`),
//! qemu-system-x86, busybox-static and e2fsprogs; its files are in a temporary directory.

use bazaar_microvm::cmdline::GUEST_INIT;
use bazaar_microvm::{Accel, GuestBoot, VmSpec};
use bazaar_runtime::microvm::{make_root_disk, write_initramfs, MicroVm};
use std::path::Path;

#[path = "../../microvm/tests/support/mod.rs"]
mod support;
use std::process::Command;
use support::{kernel, vminit};

const GUEST: &str = r#"#!/bin/busybox sh
B=/bin/busybox
$B mount -t proc proc /proc
echo "pid=$$"
echo "root=$($B cat /hello)"
echo "uname=$($B uname -r)"
$B poweroff -f
"#;

#[test]
fn the_initramfs_hands_the_root_disk_to_the_guest_init() {
    let kernel = kernel();
    let vm =
        MicroVm::detect(Some(&kernel), Some(&vminit()), true).expect("a microVM runtime with TCG");
    assert_eq!(vm.accel, Accel::Tcg, "this test expects no hardware KVM");
    let modules = vm.modules.clone().expect("modules beside the kernel");
    let d = tempfile::tempdir().unwrap();
    let rootfs = d.path().join("rootfs");
    for sub in ["bin", "proc", "dev", "sys", ".bazaar"] {
        std::fs::create_dir_all(rootfs.join(sub)).unwrap();
    }
    std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).unwrap();
    std::fs::write(rootfs.join("hello"), "the image's root").unwrap();
    let init = rootfs.join(GUEST_INIT.trim_start_matches('/'));
    std::fs::write(&init, GUEST).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&init, std::fs::Permissions::from_mode(0o755)).unwrap();
    let disk = d.path().join("root.ext4");
    make_root_disk(&rootfs, &disk, 32 << 20).unwrap();
    let initrd = d.path().join("initrd.cpio");
    write_initramfs(Path::new("/bin/busybox"), &modules, &initrd).unwrap();

    let spec = VmSpec {
        qemu: vm.qemu.clone(),
        accel: vm.accel,
        cpus: 1,
        memory_mb: 256,
        kernel,
        initrd: Some(initrd),
        cmdline: GuestBoot {
            root: "/dev/vda".into(),
            net: None,
            init: GUEST_INIT.into(),
            tcg: true,
        }
        .to_cmdline(),
        root_disk: disk,
        volume_disks: vec![],
        tap: None,
        exec_socket: d.path().join("exec.sock"),
        ctl_socket: d.path().join("ctl.sock"),
        qmp_socket: d.path().join("qmp.sock"),
    };
    let argv = spec.argv();
    // `timeout` bounds a guest that never powers off; it boots in ~2-3 s under TCG.
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
    // The guest init is PID 1 of the root disk, not of the initramfs.
    assert_eq!(line("pid="), "1");
    assert_eq!(line("root="), "the image's root");
    assert!(line("uname=").ends_with("-cloud-amd64"), "{console}");
}

/// A network namespace of the test's, removed on drop.
struct Netns(String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

const WORKLOAD: &str = "echo uid=$(id -u) gid=$(id -g) cwd=$(pwd) greeting=$GREETING; \
     echo addr=$(ip -4 -o addr show eth0 | awk '{print $4}'); \
     echo route=$(ip route | awk '/^default/{print $3}'); \
     echo uname=$(uname -r); exit 7";

#[test]
fn the_guest_init_runs_the_workload_as_its_user_on_its_network() {
    if !rustix::process::geteuid().is_root() {
        panic!("this test makes a network namespace and a tap: run it as root");
    }
    let kernel = kernel();
    let vm =
        MicroVm::detect(Some(&kernel), Some(&vminit()), true).expect("a microVM runtime with TCG");
    let d = tempfile::tempdir().unwrap();
    let rootfs = d.path().join("rootfs");
    for sub in ["bin", "proc", "dev", "sys", "srv", ".bazaar"] {
        std::fs::create_dir_all(rootfs.join(sub)).unwrap();
    }
    std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).unwrap();
    for applet in ["sh", "id", "ip", "awk", "uname", "pwd", "echo"] {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet)).unwrap();
    }
    std::fs::copy(vminit(), rootfs.join(GUEST_INIT.trim_start_matches('/'))).unwrap();
    let workload = bazaar_vminit::Workload {
        argv: vec!["sh".into(), "-c".into(), WORKLOAD.into()],
        env: vec!["PATH=/bin".into(), "GREETING=hello there".into()],
        uid: 1000,
        gid: 1001,
        cwd: "/srv".into(),
    };
    for (name, data) in workload.to_files() {
        std::fs::write(rootfs.join(".bazaar").join(name), data).unwrap();
    }
    let disk = d.path().join("root.ext4");
    make_root_disk(&rootfs, &disk, 32 << 20).unwrap();
    let initrd = d.path().join("initrd.cpio");
    write_initramfs(
        Path::new("/bin/busybox"),
        vm.modules.as_ref().unwrap(),
        &initrd,
    )
    .unwrap();

    let ns = Netns(format!("bzvm-test-{}", std::process::id()));
    assert!(Command::new("ip")
        .args(["netns", "add", &ns.0])
        .status()
        .unwrap()
        .success());
    let net = bazaar_microvm::GuestNet {
        address: "172.19.4.2".parse().unwrap(),
        prefix: 30,
        gateway: "172.19.4.1".parse().unwrap(),
        dns: vec![],
    };
    let spec = VmSpec {
        qemu: vm.qemu.clone(),
        accel: vm.accel,
        cpus: 1,
        memory_mb: 256,
        kernel,
        initrd: Some(initrd),
        cmdline: GuestBoot {
            root: "/dev/vda".into(),
            net: Some(net),
            init: GUEST_INIT.into(),
            tcg: true,
        }
        .to_cmdline(),
        root_disk: disk,
        volume_disks: vec![],
        tap: Some((
            "tap0".into(),
            bazaar_microvm::guest_mac(std::net::Ipv4Addr::new(10, 0, 0, 2)),
        )),
        exec_socket: d.path().join("exec.sock"),
        ctl_socket: d.path().join("ctl.sock"),
        qmp_socket: d.path().join("qmp.sock"),
    };
    let pid_file = d.path().join("qemu.pid");
    let argv = vm.run_argv(&spec, &Path::new("/run/netns").join(&ns.0), &pid_file);
    let out = Command::new("timeout")
        .arg("300")
        .args(&argv)
        .output()
        .expect("nsenter + qemu");
    let console = String::from_utf8_lossy(&out.stdout).replace('\r', "");
    assert!(
        out.status.success(),
        "{argv:?}: {}\n{console}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // QEMU removes its -pidfile when it exits: nothing of the run is left beside the disk.
    assert!(!pid_file.exists());
    let line = |key: &str| {
        console
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} on the console:\n{console}"))
            .to_string()
    };
    assert_eq!(
        line("uid="),
        "1000 gid=1001 cwd=/srv greeting=hello there",
        "{console}"
    );
    assert_eq!(line("addr="), "172.19.4.2/30", "{console}");
    assert_eq!(line("route="), "172.19.4.1", "{console}");
    assert!(line("uname=").ends_with("-cloud-amd64"), "{console}");
    let code = console
        .lines()
        .find_map(bazaar_vminit::parse_exit_line)
        .unwrap_or_else(|| panic!("no exit line:\n{console}"));
    assert_eq!(code, 7, "{console}");
}

/// Runs `ip` with `args`, asserting success.
fn ip(args: &[&str]) {
    let status = Command::new("ip").args(args).status().unwrap();
    assert!(status.success(), "ip {args:?}: {status}");
}

/// A child process killed and reaped on drop.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_guest_on_the_wired_tap_serves_http_at_the_machines_address() {
    if !rustix::process::geteuid().is_root() {
        panic!("this test makes network namespaces and a tap: run it as root");
    }
    let kernel = kernel();
    let vm =
        MicroVm::detect(Some(&kernel), Some(&vminit()), true).expect("a microVM runtime with TCG");
    let d = tempfile::tempdir().unwrap();
    let rootfs = d.path().join("rootfs");
    for sub in ["bin", "proc", "dev", "sys", "srv", ".bazaar"] {
        std::fs::create_dir_all(rootfs.join(sub)).unwrap();
    }
    std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).unwrap();
    std::fs::write(rootfs.join("srv/index.html"), "served from the guest\n").unwrap();
    let workload = bazaar_vminit::Workload {
        argv: ["/bin/busybox", "httpd", "-f", "-p", "8080", "-h", "/srv"]
            .map(String::from)
            .to_vec(),
        env: vec![],
        uid: 1000,
        gid: 1000,
        cwd: "/".into(),
    };
    // The machine's namespace as the network sets it up (eth0 with the address, a veth
    // to the gateway), the gateway's side in a namespace of its own.
    let pid = std::process::id();
    let machine = Netns(format!("bzvm-m-{pid}"));
    let gateway = Netns(format!("bzvm-g-{pid}"));
    ip(&["netns", "add", &machine.0]);
    ip(&["netns", "add", &gateway.0]);
    ip(&[
        "-n", &gateway.0, "link", "add", "gw0", "type", "veth", "peer", "name", "eth0", "netns",
        &machine.0,
    ]);
    ip(&[
        "-n",
        &gateway.0,
        "addr",
        "add",
        "172.19.4.1/30",
        "dev",
        "gw0",
    ]);
    ip(&["-n", &gateway.0, "link", "set", "gw0", "up"]);
    ip(&[
        "-n",
        &machine.0,
        "addr",
        "add",
        "172.19.4.2/30",
        "dev",
        "eth0",
    ]);
    ip(&["-n", &machine.0, "link", "set", "eth0", "up"]);
    let netns = Path::new("/run/netns").join(&machine.0);
    let address = "172.19.4.2".parse().unwrap();
    let run_dir = d.path().join("run");
    std::fs::create_dir_all(&run_dir).unwrap();
    let net = bazaar_microvm::GuestNet {
        address,
        prefix: 30,
        gateway: "172.19.4.1".parse().unwrap(),
        dns: vec![],
    };
    let run = bazaar_runtime::microvm::GuestRun {
        id: "m1",
        rootfs: &rootfs,
        run_dir: &run_dir,
        disk_size: 32 << 20,
        workload: &workload,
        netns: &netns,
        net,
        cpus: 1,
        memory_mb: 256,
    };
    vm.prepare_run(&run).unwrap();
    // Idempotent: a redone launch step makes it all again.
    let argv = vm.prepare_run(&run).unwrap();
    let console = d.path().join("console");
    let qemu = Child(
        Command::new(&argv[0])
            .args(&argv[1..])
            .stdout(std::fs::File::create(&console).unwrap())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Awaited, not slept: the guest boots in a few seconds under TCG.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let body = loop {
        let out = Command::new("ip")
            .args(["netns", "exec", &gateway.0, "curl", "-s", "-m", "2"])
            .arg("http://172.19.4.2:8080/index.html")
            .output()
            .unwrap();
        if out.status.success() {
            break String::from_utf8_lossy(&out.stdout).into_owned();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no answer from the guest in 120 s; console:\n{}",
            std::fs::read_to_string(&console).unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert_eq!(body, "served from the guest\n");
    drop(qemu);
}
