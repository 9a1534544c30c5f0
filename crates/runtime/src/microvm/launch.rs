//! A microVM machine's run, as the driver launches it (`crate::oci::OciRuntime::prepare`
//! hands over once the image's rootfs and its `/etc` files are made): the guest init and
//! the workload in the rootfs, the run's root disk and initramfs, the tap, QEMU's argv
//! (its pid file where runc's is, so the run counts as started the same way); what the
//! shim needs to deliver signals (`vm-signal` on the control port) and what `exec` runs
//! (`vm-exec` on the exec port); and the workload's exit code, read back from the console
//! in the machine's log once QEMU has exited.

use super::{GuestRun, MicroVm};
use crate::launch_error::{LaunchError, LaunchStep};
use bazaar_shim::FailureKind;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The marker of a microVM run in its run directory; it holds the length the machine's
/// log had when the run was launched (the run's console starts there).
const MARKER: &str = "microvm";

/// What QEMU needs beyond the guest's memory (its own code, the TCG translation cache,
/// device buffers): added to the machine's cgroup memory limit.
pub const OVERHEAD_MB: u64 = 256;

/// The root disk's size when the machine's config gives no `rootfs.size_gb`.
const DEFAULT_DISK: u64 = 1 << 30;

/// A run's inputs from the image path.
#[derive(Debug)]
pub struct VmLaunch<'a> {
    pub id: &'a str,
    pub rootfs: &'a Path,
    pub run_dir: &'a Path,
    pub log: &'a Path,
    pub netns: &'a Path,
    pub ip: Ipv4Addr,
    pub prefix: u8,
    pub gateway: Ipv4Addr,
    pub process: &'a bazaar_image::Process,
    pub uid: u32,
    pub gid: u32,
    pub cpus: u32,
    pub memory_mb: u32,
    pub disk_gb: Option<u64>,
}

/// Makes the run (blocking work on a blocking thread) and answers QEMU's argv.
pub async fn prepare(vm: &Arc<MicroVm>, l: VmLaunch<'_>) -> Result<Vec<String>, LaunchError> {
    let workload = bazaar_vminit::Workload {
        argv: l.process.args.clone(),
        env: l.process.env.clone(),
        uid: l.uid,
        gid: l.gid,
        cwd: l.process.cwd.clone(),
    };
    let (vm, id, rootfs, run_dir, netns) = (
        vm.clone(),
        l.id.to_string(),
        l.rootfs.to_path_buf(),
        l.run_dir.to_path_buf(),
        l.netns.to_path_buf(),
    );
    let log_len = std::fs::metadata(l.log).map_or(0, |m| m.len());
    let net = bazaar_microvm::GuestNet {
        address: l.ip,
        prefix: l.prefix,
        gateway: l.gateway,
        dns: vec![l.gateway],
    };
    let (cpus, memory_mb) = (l.cpus, l.memory_mb);
    let disk_size = l.disk_gb.map_or(DEFAULT_DISK, |gb| gb << 30);
    tokio::task::spawn_blocking(move || {
        // Earlier runs' root disks: each run has its own, made from the image again.
        if let Some(runs) = run_dir.parent() {
            for entry in std::fs::read_dir(runs).into_iter().flatten().flatten() {
                if entry.path() != run_dir {
                    let _ = std::fs::remove_file(entry.path().join("root.ext4"));
                }
            }
        }
        std::fs::write(run_dir.join(MARKER), log_len.to_string())?;
        vm.prepare_run(&GuestRun {
            id: &id,
            rootfs: &rootfs,
            run_dir: &run_dir,
            disk_size,
            workload: &workload,
            netns: &netns,
            net,
            cpus,
            memory_mb,
        })
    })
    .await
    .map_err(|e| LaunchError::new(LaunchStep::Bundle, FailureKind::Io, e.to_string()))?
    .map_err(|e| LaunchError::io(LaunchStep::Bundle, "making the microVM's disks and tap", &e))
}

/// Whether `run_dir` is a microVM run's.
pub fn is_vm_run(run_dir: &Path) -> bool {
    run_dir.join(MARKER).exists()
}

/// The exec port's socket of a run.
pub fn exec_socket(run_dir: &Path) -> PathBuf {
    run_dir.join("exec.sock")
}

/// The control port's socket of a run.
pub fn ctl_socket(run_dir: &Path) -> PathBuf {
    run_dir.join("ctl.sock")
}

/// What the shim runs to deliver a signal to the workload (`exe vm-signal`).
pub fn signal_argv(exe: &Path, run_dir: &Path) -> Vec<String> {
    vec![
        exe.display().to_string(),
        "vm-signal".into(),
        ctl_socket(run_dir).display().to_string(),
        bazaar_shim::SIGNAL_PLACEHOLDER.into(),
    ]
}

/// What runs `argv` in the guest (`exe vm-exec`).
pub fn exec_argv(exe: &Path, run_dir: &Path, argv: &[String]) -> Vec<String> {
    let mut v = vec![
        exe.display().to_string(),
        "vm-exec".into(),
        exec_socket(run_dir).display().to_string(),
    ];
    v.extend(argv.iter().cloned());
    v
}

/// A microVM run's exit as the workload's: QEMU exits 0 when the guest powers off, and
/// the guest init's last console line says how the workload ended.
pub fn workload_exit(
    run_dir: &Path,
    log: &Path,
    mut record: bazaar_shim::ExitRecord,
) -> bazaar_shim::ExitRecord {
    if record.exit_code != Some(0) {
        return record;
    }
    let start: u64 = std::fs::read_to_string(run_dir.join(MARKER))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let data = std::fs::read(log).unwrap_or_default();
    // A log rotated since the launch starts over.
    let start = if (start as usize) <= data.len() {
        start as usize
    } else {
        0
    };
    let code = last_exit_code(&String::from_utf8_lossy(&data[start..]));
    match code {
        Some(code) => record.exit_code = Some(code),
        // The guest powered off without the guest init's word (a kernel panic).
        None => record.error = Some("the microVM ended without the workload's exit".into()),
    }
    record
}

/// The last exit line of the guest init in a log's JSON lines (`{"line": ...}`).
fn last_exit_code(log: &str) -> Option<i32> {
    log.lines().rev().find_map(|l| {
        let v: serde_json::Value = serde_json::from_str(l).ok()?;
        bazaar_vminit::parse_exit_line(v["line"].as_str()?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(code: Option<i32>) -> bazaar_shim::ExitRecord {
        bazaar_shim::ExitRecord {
            run_id: 1,
            exit_code: code,
            signal: None,
            oom_killed: false,
            exited_at_ms: 0,
            error: None,
        }
    }

    #[test]
    fn the_workloads_exit_comes_from_this_runs_console() {
        let d = tempfile::tempdir().unwrap();
        let (run, log) = (d.path().join("run"), d.path().join("output.log"));
        std::fs::create_dir(&run).unwrap();
        let line = |l: &str| format!("{}\n", serde_json::json!({"stream": "stdout", "line": l}));
        // An earlier run's exit, before this run's start.
        let before = line("bazaar-vminit: exit 9");
        std::fs::write(&log, &before).unwrap();
        std::fs::write(run.join(MARKER), before.len().to_string()).unwrap();
        assert!(is_vm_run(&run));
        let text = [
            line("bazaar-vminit: exit 1"), // the workload's own forgery comes first
            line("bazaar-vminit: exit 143\r"),
            line("reboot: Power down"),
        ]
        .concat();
        std::fs::write(&log, format!("{before}{text}")).unwrap();
        assert_eq!(
            workload_exit(&run, &log, record(Some(0))).exit_code,
            Some(143)
        );
        // QEMU killed: as it ended.
        let killed = workload_exit(&run, &log, record(None));
        assert_eq!(killed.exit_code, None);
        // No exit line in this run's part: an error, not the earlier run's code.
        std::fs::write(&log, format!("{before}{}", line("Kernel panic"))).unwrap();
        let r = workload_exit(&run, &log, record(Some(0)));
        assert!(r.error.is_some(), "{r:?}");
    }
}
