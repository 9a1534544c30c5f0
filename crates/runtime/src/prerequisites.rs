//! What this host can run (issue 37 item 7). Pure: the facts an agent finds at start
//! ([`Facts`]) → for each driver, what it lacks to run machines of that driver
//! ([`missing`]), and what it runs without but worse ([`warnings`]). The thin shell that
//! finds the facts is [`Facts::probe`]: lookups in `PATH`, the cgroup controllers,
//! `/proc/sys/user/max_user_namespaces`, `/dev/loop-control`.
//!
//! The agent says at start what is missing, publishes it in its host row
//! (`bazaar_types::host::cannot_run_label`), and bids only for the drivers it can run.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The drivers a machine can have (`MachineConfig::driver`; `config.runtime` names one:
/// runtime `runc` is driver `oci`).
pub const DRIVERS: [&str; 4] = ["process", "oci", "gvisor", "microvm"];

/// A program a driver runs, and the Debian package that has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Program {
    pub name: &'static str,
    pub package: &'static str,
}

/// `runc`: image machines' container runtime.
pub const RUNC: Program = Program {
    name: "runc",
    package: "runc",
};
/// `runsc`: gVisor, the runtime of `gvisor` machines.
pub const RUNSC: Program = Program {
    name: "runsc",
    package: "runsc",
};
/// `mkfs.ext4`: a machine's work disk (and volumes).
pub const MKFS_EXT4: Program = Program {
    name: "mkfs.ext4",
    package: "e2fsprogs",
};
/// `ip`: the mesh's device addresses and routes (the machine network needs no `ip`).
pub const IP: Program = Program {
    name: "ip",
    package: "iproute2",
};
/// `nft`: the machine network's firewall (without it machines can reach the host).
pub const NFT: Program = Program {
    name: "nft",
    package: "nftables",
};

/// `qemu-system-x86_64`: the VMM of `microvm` machines.
pub const QEMU: Program = Program {
    name: "qemu-system-x86_64",
    package: "qemu-system-x86",
};

/// What a host has that machines need.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    /// The agent runs as root.
    pub root: bool,
    /// Isolation is on (`isolate`, the default): machines are sandboxed.
    pub isolate: bool,
    /// The `memory` and `cpu` cgroup controllers can be used (v1 or v2).
    pub cgroups: bool,
    /// User namespaces can be made (`/proc/sys/user/max_user_namespaces` above 0).
    pub user_namespaces: bool,
    /// Loop devices can be attached (`/dev/loop-control`).
    pub loop_devices: bool,
    /// Machines get a work disk of their own (the config's `machine_disk_mb` is not 0).
    pub work_disks: bool,
    /// The host runs the mesh between hosts (`mesh_listen`).
    pub mesh: bool,
    /// The programs of [`RUNC`], [`RUNSC`], [`QEMU`], [`MKFS_EXT4`], [`NFT`], [`IP`] that were found. (The
    /// machine network needs no `ip`: the agent sends its own netlink requests.)
    pub programs: BTreeSet<&'static str>,
}

impl Facts {
    fn has(&self, p: Program) -> bool {
        self.programs.contains(p.name)
    }

    /// Finds the facts of this host. `runc` is the configured runc (`None`: looked up in
    /// `PATH`, as the runtime does); `mkfs.ext4` is looked up where the runtime runs it
    /// from (`/usr/sbin`, `/sbin`, `/usr/bin`, `/bin`), the others in `PATH`.
    pub fn probe(isolate: bool, cgroups: bool, work_disks: bool, runc: Option<&Path>) -> Facts {
        let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into());
        Facts::probe_in(&path, isolate, cgroups, work_disks, runc)
    }

    /// [`Facts::probe`] with `path` for `PATH`.
    fn probe_in(
        path: &str,
        isolate: bool,
        cgroups: bool,
        work_disks: bool,
        runc: Option<&Path>,
    ) -> Facts {
        let mut programs = BTreeSet::new();
        for p in [NFT, IP, RUNSC, QEMU] {
            if in_path(path, p.name) {
                programs.insert(p.name);
            }
        }
        if runc.map_or_else(|| in_path(path, RUNC.name), Path::is_file) {
            programs.insert(RUNC.name);
        }
        if ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
            .iter()
            .any(|d| Path::new(d).join(MKFS_EXT4.name).is_file())
        {
            programs.insert(MKFS_EXT4.name);
        }
        let user_namespaces = std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .is_some_and(|n| n > 0);
        Facts {
            root: rustix::process::geteuid().is_root(),
            isolate,
            cgroups,
            user_namespaces,
            loop_devices: Path::new("/dev/loop-control").exists(),
            work_disks,
            // Said by the caller: whether it is configured.
            mesh: false,
            programs,
        }
    }
}

/// Whether `program` is an executable file in a directory of `path` (as `PATH`).
fn in_path(path: &str, program: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.split(':').filter(|d| !d.is_empty()).any(|d| {
        std::fs::metadata(Path::new(d).join(program))
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// For each driver this host cannot run, what it lacks (in words an operator can act on).
/// A driver not in the map can be run.
pub fn missing(facts: &Facts) -> BTreeMap<&'static str, Vec<String>> {
    let program = |p: Program| format!("{} (package {})", p.name, p.package);
    let sandboxed = facts.root && facts.isolate;
    let mut out: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    // A process machine of an agent that does not isolate is a plain process on host
    // ports: it needs nothing. A sandboxed one gets an address and a network namespace
    // owned by a user namespace. (Its work disk is left out without loop devices: see
    // [`warnings`].)
    let mut network = Vec::new();
    if !facts.user_namespaces {
        network.push("user namespaces (/proc/sys/user/max_user_namespaces is 0)".to_string());
    }
    if sandboxed && !network.is_empty() {
        out.insert("process", network.clone());
    }
    let mut oci = Vec::new();
    if !facts.root {
        oci.push("an agent running as root".into());
    } else if !facts.isolate {
        oci.push("isolation (the agent runs with --no-isolate)".into());
    }
    if sandboxed && !facts.cgroups {
        oci.push("the memory and cpu cgroup controllers".into());
    }
    if !facts.has(RUNC) {
        oci.push(program(RUNC));
    }
    oci.extend(network);
    // gVisor runs the same bundle as runc, under runsc, in the same network namespace,
    // prepared by the image runtime (which stands on runc). Whether one of gVisor's
    // platforms works here is found when the agent starts (`crate::gvisor`).
    let mut gvisor = oci.clone();
    if !facts.has(RUNSC) {
        gvisor.insert(0, program(RUNSC));
    }
    if !gvisor.is_empty() {
        out.insert("gvisor", gvisor);
    }
    // A microVM's disk is made from the image's rootfs, which the image runtime prepares
    // (on runc's network); the guest kernel, its init and the accelerator are found when
    // the agent starts (`crate::microvm::MicroVm::detect`).
    let mut microvm = oci.clone();
    for p in [QEMU, MKFS_EXT4] {
        if !facts.has(p) {
            microvm.insert(0, program(p));
        }
    }
    if !microvm.is_empty() {
        out.insert("microvm", microvm);
    }
    if !oci.is_empty() {
        out.insert("oci", oci);
    }
    out
}

/// What this host runs machines without, at a cost the operator should know of.
pub fn warnings(facts: &Facts) -> Vec<String> {
    let mut out = Vec::new();
    if facts.root && facts.isolate && facts.work_disks {
        let mut lacking = Vec::new();
        if !facts.loop_devices {
            lacking.push("loop devices (/dev/loop-control)".to_string());
        }
        if !facts.has(MKFS_EXT4) {
            lacking.push(format!(
                "{} (package {})",
                MKFS_EXT4.name, MKFS_EXT4.package
            ));
        }
        if !lacking.is_empty() {
            out.push(format!(
                "{} missing: machines' writable space is not limited in size, and volumes are plain directories",
                lacking.join(" and ")
            ));
        }
    }
    if facts.mesh && !facts.has(IP) {
        out.push(format!(
            "{} (package {}) is missing: the mesh cannot start, machines of other hosts are out of reach",
            IP.name, IP.package
        ));
    }
    if facts.root && facts.isolate && !facts.has(NFT) {
        out.push(format!(
            "{} (package {}) is missing: machines are not firewalled from this host's listeners",
            NFT.name, NFT.package
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program_name(p: Program) -> String {
        format!("{} (package {})", p.name, p.package)
    }

    fn full() -> Facts {
        Facts {
            root: true,
            isolate: true,
            cgroups: true,
            user_namespaces: true,
            loop_devices: true,
            work_disks: true,
            mesh: true,
            programs: [RUNC, RUNSC, QEMU, MKFS_EXT4, NFT, IP]
                .map(|p| p.name)
                .into(),
        }
    }

    /// What `facts` lack for the drivers but microvm (which `microvm_needs_qemu_and_mkfs`
    /// covers).
    fn missing_built(facts: &Facts) -> BTreeMap<&'static str, Vec<String>> {
        let mut m = missing(facts);
        m.remove("microvm");
        m
    }

    #[test]
    fn microvm_needs_qemu_and_mkfs_and_what_runc_machines_need() {
        let mut facts = full();
        assert!(!missing(&facts).contains_key("microvm"));
        facts.programs.remove("qemu-system-x86_64");
        facts.programs.remove("mkfs.ext4");
        facts.programs.remove("runc");
        assert_eq!(
            missing(&facts)["microvm"],
            [
                program_name(MKFS_EXT4),
                program_name(QEMU),
                program_name(RUNC)
            ]
        );
    }

    #[test]
    fn gvisor_needs_runsc_and_what_runc_machines_need() {
        let mut facts = full();
        facts.programs.remove("runc");
        facts.programs.remove("runsc");
        facts.cgroups = false;
        let m = missing(&facts);
        assert_eq!(
            m["gvisor"],
            [
                "runsc (package runsc)",
                "the memory and cpu cgroup controllers",
                "runc (package runc)",
            ]
        );
        // runsc alone missing: only gVisor machines are refused.
        let mut facts = full();
        facts.programs.remove("runsc");
        assert_eq!(
            missing_built(&facts),
            [("gvisor", vec![program_name(RUNSC)])].into()
        );
        assert!(DRIVERS.iter().all(|d| *d == "process" || m.contains_key(d)));
    }

    #[test]
    fn a_complete_host_runs_every_driver() {
        assert!(missing_built(&full()).is_empty());
        assert!(warnings(&full()).is_empty());
    }

    #[test]
    fn without_runc_only_image_machines_are_refused_and_runc_is_named() {
        let mut facts = full();
        facts.programs.remove("runc");
        let m = missing_built(&facts);
        assert_eq!(m.keys().copied().collect::<Vec<_>>(), ["gvisor", "oci"]);
        assert_eq!(m["oci"], ["runc (package runc)"]);
        assert_eq!(m["gvisor"], ["runc (package runc)"]);
    }

    #[test]
    fn without_isolation_process_machines_need_nothing_and_images_are_refused() {
        let facts = Facts {
            isolate: false,
            user_namespaces: false,
            loop_devices: false,
            programs: BTreeSet::new(),
            ..full()
        };
        let m = missing(&facts);
        // Plain processes on host ports: no network, no disk of their own.
        assert!(!m.contains_key("process"));
        assert_eq!(
            m["oci"],
            [
                "isolation (the agent runs with --no-isolate)",
                "runc (package runc)",
                "user namespaces (/proc/sys/user/max_user_namespaces is 0)"
            ]
        );
    }

    #[test]
    fn without_loop_devices_or_mkfs_machines_run_without_a_disk_of_their_own() {
        let mut facts = full();
        facts.loop_devices = false;
        facts.programs.remove("mkfs.ext4");
        assert!(missing_built(&facts).is_empty());
        let w = warnings(&facts);
        assert_eq!(w.len(), 1);
        assert!(
            w[0].starts_with(
                "loop devices (/dev/loop-control) and mkfs.ext4 (package e2fsprogs) missing"
            ),
            "{w:?}"
        );
        // Nothing to say where work disks are turned off.
        facts.work_disks = false;
        assert!(warnings(&facts).is_empty());
    }

    #[test]
    fn a_host_that_is_not_root_runs_process_machines_only() {
        let facts = Facts {
            root: false,
            cgroups: false,
            user_namespaces: true,
            ..full()
        };
        let m = missing(&facts);
        assert!(!m.contains_key("process"));
        assert_eq!(m["oci"], ["an agent running as root"]);
        // Nor is nftables needed there.
        assert!(warnings(&facts).is_empty());
    }

    #[test]
    fn missing_cgroups_and_user_namespaces_are_named() {
        let mut facts = full();
        facts.cgroups = false;
        facts.user_namespaces = false;
        let m = missing(&facts);
        assert_eq!(
            m["oci"],
            [
                "the memory and cpu cgroup controllers",
                "user namespaces (/proc/sys/user/max_user_namespaces is 0)"
            ]
        );
        assert_eq!(
            m["process"],
            ["user namespaces (/proc/sys/user/max_user_namespaces is 0)"]
        );
    }

    #[test]
    fn without_ip_machines_run_and_only_a_mesh_is_warned_of() {
        let mut facts = full();
        facts.programs.remove("ip");
        assert!(missing_built(&facts).is_empty());
        let w = warnings(&facts);
        assert_eq!(w.len(), 1);
        assert!(
            w[0].starts_with("ip (package iproute2) is missing: the mesh"),
            "{w:?}"
        );
        facts.mesh = false;
        assert!(warnings(&facts).is_empty());
    }

    #[test]
    fn without_nft_the_host_runs_machines_and_warns() {
        let mut facts = full();
        facts.programs.remove("nft");
        assert!(missing_built(&facts).is_empty());
        assert_eq!(warnings(&facts).len(), 1);
        assert!(warnings(&facts)[0].contains("nftables"));
    }

    #[test]
    fn the_probe_finds_programs_only_in_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_str().unwrap();
        let facts_in = |path: &str| Facts::probe_in(path, true, true, true, None);
        assert!(!facts_in(path).programs.contains("runc"));
        let runc = dir.path().join("runc");
        std::fs::write(&runc, "#!/bin/sh\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&runc, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(facts_in(&format!("/nonexistent:{path}"))
            .programs
            .contains("runc"));
        // Not executable: not found.
        std::fs::set_permissions(&runc, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(!facts_in(path).programs.contains("runc"));
        // A configured runc is looked for where it is configured, not in PATH.
        let configured = Facts::probe_in("", true, true, true, Some(&runc));
        assert!(configured.programs.contains("runc"));
        let configured = Facts::probe_in(path, true, true, true, Some(&dir.path().join("none")));
        assert!(!configured.programs.contains("runc"));
    }
}
