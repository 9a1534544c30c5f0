//! QEMU's command line for one microVM machine (`qemu-system-x86_64 -machine microvm`):
//! the accelerator (KVM, or TCG only when the operator allows it), CPUs and memory from the
//! machine's `guest`, the kernel and its command line, the root disk and volumes as
//! virtio-blk disks, the tap as virtio-net, the serial console on stdout (the shim writes
//! it to the machine's log), a virtio-serial port for exec and a QMP socket for a clean
//! powerdown.

use std::fmt;
use std::path::PathBuf;

/// How QEMU runs the guest's code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualization through `/dev/kvm`.
    Kvm,
    /// QEMU's own translator: slow, allowed only with the agent's `--vm-allow-tcg`.
    Tcg,
}

impl Accel {
    pub fn as_str(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

/// Why this host runs no microVM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccelError;

impl fmt::Display for AccelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("/dev/kvm is not usable and TCG is not allowed (agent flag --vm-allow-tcg)")
    }
}

impl std::error::Error for AccelError {}

/// KVM when `/dev/kvm` is usable, TCG only when the operator allows it.
pub fn choose_accel(kvm_usable: bool, allow_tcg: bool) -> Result<Accel, AccelError> {
    match (kvm_usable, allow_tcg) {
        (true, _) => Ok(Accel::Kvm),
        (false, true) => Ok(Accel::Tcg),
        (false, false) => Err(AccelError),
    }
}

/// The guest NIC's MAC for the machine address `ip`: the MAC every machine on that
/// address has (`02:62:` and the address, as the agent gives a machine's `eth0`), so an
/// address handed from one machine to the next, whatever their runtimes, keeps its MAC and
/// the host's neighbour entry for it (trusted for up to 45 s without asking again) stays
/// right. The namespace's `eth0`, bridged with the guest's tap, then takes another
/// (`bazaar_runtime::microvm::wire_tap`). Locally administered, unicast.
pub fn guest_mac(ip: std::net::Ipv4Addr) -> String {
    let [a, b, c, d] = ip.octets();
    format!("02:62:{a:02x}:{b:02x}:{c:02x}:{d:02x}")
}

/// Everything one microVM's QEMU needs; [`VmSpec::argv`] makes the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmSpec {
    pub qemu: PathBuf,
    pub accel: Accel,
    pub cpus: u32,
    pub memory_mb: u32,
    pub kernel: PathBuf,
    pub initrd: Option<PathBuf>,
    pub cmdline: String,
    /// The root disk (raw ext4), then the volumes' disks in order (`/dev/vda`, `vdb`, ...).
    pub root_disk: PathBuf,
    pub volume_disks: Vec<PathBuf>,
    /// The tap in the machine's network namespace, and the guest's MAC.
    pub tap: Option<(String, String)>,
    /// The host end of the exec virtio-serial port (a unix socket QEMU listens on).
    pub exec_socket: PathBuf,
    /// The host end of the control port: the stop signal and other signals for the
    /// workload, which the guest init forwards ([`CTL_PORT`]).
    pub ctl_socket: PathBuf,
    /// QMP's unix socket (`system_powerdown` for a clean stop).
    pub qmp_socket: PathBuf,
}

/// The name the guest sees the exec port under (`/dev/virtio-ports/bazaar.exec`).
pub const EXEC_PORT: &str = "bazaar.exec";

/// The name the guest sees the control port under (`/dev/virtio-ports/bazaar.ctl`).
pub const CTL_PORT: &str = "bazaar.ctl";

impl VmSpec {
    /// QEMU's argv, the program first.
    pub fn argv(&self) -> Vec<String> {
        let mut a: Vec<String> = vec![self.qemu.display().to_string()];
        let mut push = |xs: &[&str]| a.extend(xs.iter().map(|s| s.to_string()));
        push(&["-nodefaults", "-no-user-config", "-nographic", "-no-reboot"]);
        let machine = format!(
            "microvm,accel={},acpi=on,rtc=on,isa-serial=on",
            self.accel.as_str()
        );
        push(&["-machine", &machine]);
        push(&[
            "-cpu",
            if self.accel == Accel::Kvm {
                "host"
            } else {
                "max"
            },
        ]);
        push(&["-smp", &self.cpus.max(1).to_string()]);
        push(&["-m", &format!("{}M", self.memory_mb.max(64))]);
        push(&["-serial", "stdio"]);
        push(&["-kernel", &self.kernel.display().to_string()]);
        if let Some(initrd) = &self.initrd {
            push(&["-initrd", &initrd.display().to_string()]);
        }
        push(&["-append", &self.cmdline]);
        let disks = std::iter::once(&self.root_disk).chain(&self.volume_disks);
        for (i, disk) in disks.enumerate() {
            let drive = format!(
                "id=disk{i},file={},format=raw,if=none,cache=none,aio=threads",
                escape_opt(&disk.display().to_string())
            );
            push(&["-drive", &drive]);
            push(&["-device", &format!("virtio-blk-device,drive=disk{i}")]);
        }
        if let Some((tap, mac)) = &self.tap {
            push(&[
                "-netdev",
                &format!("tap,id=net0,ifname={tap},script=no,downscript=no"),
            ]);
            push(&[
                "-device",
                &format!("virtio-net-device,netdev=net0,mac={mac}"),
            ]);
        }
        push(&["-device", "virtio-serial-device"]);
        let exec = format!(
            "socket,id=exec,path={},server=on,wait=off",
            escape_opt(&self.exec_socket.display().to_string())
        );
        push(&["-chardev", &exec]);
        push(&[
            "-device",
            &format!("virtserialport,chardev=exec,name={EXEC_PORT}"),
        ]);
        let ctl = format!(
            "socket,id=ctl,path={},server=on,wait=off",
            escape_opt(&self.ctl_socket.display().to_string())
        );
        push(&["-chardev", &ctl]);
        push(&[
            "-device",
            &format!("virtserialport,chardev=ctl,name={CTL_PORT}"),
        ]);
        let qmp = format!(
            "unix:{},server=on,wait=off",
            escape_opt(&self.qmp_socket.display().to_string())
        );
        push(&["-qmp", &qmp]);
        a
    }
}

/// QEMU's option syntax doubles a comma inside a value.
fn escape_opt(value: &str) -> String {
    value.replace(',', ",,")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(accel: Accel) -> VmSpec {
        VmSpec {
            qemu: "qemu-system-x86_64".into(),
            accel,
            cpus: 2,
            memory_mb: 512,
            kernel: "/var/lib/bazaar/vm/vmlinux".into(),
            initrd: None,
            cmdline: "console=ttyS0 root=/dev/vda".into(),
            root_disk: "/data/m1/root.ext4".into(),
            volume_disks: vec!["/data/vol,1.img".into()],
            tap: Some((
                "tap0".into(),
                guest_mac(std::net::Ipv4Addr::new(10, 0, 0, 2)),
            )),
            exec_socket: "/run/m1/exec.sock".into(),
            ctl_socket: "/run/m1/ctl.sock".into(),
            qmp_socket: "/run/m1/qmp.sock".into(),
        }
    }

    fn value_of<'a>(argv: &'a [String], flag: &str) -> Vec<&'a str> {
        argv.windows(2)
            .filter(|w| w[0] == flag)
            .map(|w| w[1].as_str())
            .collect()
    }

    #[test]
    fn kvm_first_tcg_only_when_allowed() {
        assert_eq!(choose_accel(true, false), Ok(Accel::Kvm));
        assert_eq!(choose_accel(true, true), Ok(Accel::Kvm));
        assert_eq!(choose_accel(false, true), Ok(Accel::Tcg));
        assert_eq!(choose_accel(false, false), Err(AccelError));
    }

    #[test]
    fn the_command_line_carries_the_guest_and_its_devices() {
        let argv = spec(Accel::Tcg).argv();
        assert_eq!(argv[0], "qemu-system-x86_64");
        assert_eq!(
            value_of(&argv, "-machine"),
            ["microvm,accel=tcg,acpi=on,rtc=on,isa-serial=on"]
        );
        assert_eq!(value_of(&argv, "-cpu"), ["max"]);
        assert_eq!(value_of(&argv, "-smp"), ["2"]);
        assert_eq!(value_of(&argv, "-m"), ["512M"]);
        assert_eq!(value_of(&argv, "-serial"), ["stdio"]);
        assert_eq!(value_of(&argv, "-append"), ["console=ttyS0 root=/dev/vda"]);
        // The root disk is the first virtio-blk disk (/dev/vda), a volume's path escaped.
        let drives = value_of(&argv, "-drive");
        assert!(
            drives[0].starts_with("id=disk0,file=/data/m1/root.ext4,"),
            "{drives:?}"
        );
        assert!(
            drives[1].starts_with("id=disk1,file=/data/vol,,1.img,"),
            "{drives:?}"
        );
        let mac = guest_mac(std::net::Ipv4Addr::new(10, 0, 0, 2));
        assert!(value_of(&argv, "-device")
            .contains(&format!("virtio-net-device,netdev=net0,mac={mac}").as_str()));
        assert!(value_of(&argv, "-netdev")[0].contains("ifname=tap0,script=no"));
        assert!(argv.contains(&"-no-reboot".to_string()));
        assert!(
            value_of(&argv, "-device").contains(&"virtserialport,chardev=exec,name=bazaar.exec")
        );
        assert!(value_of(&argv, "-device").contains(&"virtserialport,chardev=ctl,name=bazaar.ctl"));
        assert!(value_of(&argv, "-chardev")
            .contains(&"socket,id=ctl,path=/run/m1/ctl.sock,server=on,wait=off"));
        assert_eq!(
            value_of(&argv, "-qmp"),
            ["unix:/run/m1/qmp.sock,server=on,wait=off"]
        );
        assert_eq!(value_of(&spec(Accel::Kvm).argv(), "-cpu"), ["host"]);
    }

    #[test]
    fn a_machine_without_network_gets_no_nic() {
        let mut s = spec(Accel::Kvm);
        s.tap = None;
        assert!(value_of(&s.argv(), "-netdev").is_empty());
    }

    #[test]
    fn macs_are_stable_local_and_unicast() {
        let a = guest_mac(std::net::Ipv4Addr::new(172, 30, 1, 7));
        assert_eq!(a, "02:62:ac:1e:01:07");
        assert_ne!(a, guest_mac(std::net::Ipv4Addr::new(172, 30, 1, 8)));
        assert!(a.starts_with("02:"), "{a}");
        assert_eq!(a.len(), 17);
    }
}
