//! gVisor machines (`config.runtime = "gvisor"`): the image machine of [`crate::oci`], run
//! under `runsc` instead of runc. The image, the root filesystem, the files written into
//! it, the machine's network namespace and its cgroup are the runc path's; what differs:
//!
//! - **The boundary.** The workload's system calls are answered by gVisor's Sentry, a
//!   kernel in user space, on the *platform* this host supports ([`Gvisor::detect`] tries
//!   them at start: `systrap` where the release has it, `kvm` where `/dev/kvm` opens on
//!   a CPU with hardware virtualization, else `ptrace`). Files are reached through
//!   gVisor's gofer: the root filesystem and the volume's bind mount.
//! - **No user namespace in the bundle.** runsc (the 2022 release Debian ships) cannot
//!   start a sandbox in a user namespace with id mappings; the Sentry's own users are the
//!   boundary, and its sandbox process runs as nobody. The root filesystem is therefore
//!   not id-mapped (the image's ids as they are) and the volume keeps its owners.
//! - **Network.** `--network=host` in the machine's own network namespace, which the
//!   bundle names (runsc joins it by `setns` before the Sentry starts): the machine keeps
//!   its address, the internal DNS on its gateway and the private network.
//!   (`--network=sandbox` refuses to start on this kernel; `ip netns exec` would remount
//!   `/sys` under runsc.)
//! - **Cgroup.** `--ignore-cgroups`: the sandbox stays in the machine's cgroup, where the
//!   shim put `runsc run` (its limits, freezer and kill, and its OOM kill count, which a
//!   cgroup of runsc's own would take away with it when the sandbox ends).
//! - **Seccomp.** `--oci-seccomp`: the bundle's allowlist is applied by the Sentry to the
//!   machine's processes (runsc ignores it otherwise).
//! - **Signals.** `runsc run` does not forward signals to the container, so the shim
//!   delivers the ones it forwards with `runsc kill` ([`Gvisor::signal_argv`]).
//! - **Standard streams.** runsc gives the files of its standard streams to the sandbox's
//!   user (nobody): run on the host's `/dev/null`, it makes `/dev/null` nobody's. So no
//!   runsc call here has `/dev/null` for one: they read (and `runsc kill` writes) a private
//!   file of the run ([`stdio_file`]), and the shim's pipes take a run's output.
//!
//! Layout of a run: as runc's, with runsc's state in `runs/<run_id>/runsc/`.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The platforms gVisor can run on, preferred first.
const PLATFORMS: [&str; 3] = ["systrap", "kvm", "ptrace"];

/// How long the trial sandbox of a platform may take before the platform counts as
/// unusable (a working one answers in well under a second).
const TRIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// How this host runs gVisor machines.
#[derive(Debug, Clone)]
pub struct Gvisor {
    /// The `runsc` executable.
    pub runsc: PathBuf,
    /// The platform chosen at start (`ptrace`, `kvm` or `systrap`).
    pub platform: String,
}

impl Gvisor {
    /// Finds runsc in `PATH` and the first platform (`systrap`, `kvm`, `ptrace`) whose trial sandbox
    /// (`runsc do true`, in a state directory under `scratch` that is removed) runs here.
    /// `Err` says why this host cannot run gVisor machines.
    pub fn detect(scratch: &Path) -> Result<Gvisor, String> {
        let runsc = crate::oci::find_in_path("runsc")
            .ok_or("runsc is not installed (apt-get install runsc)")?;
        let known = runsc_flags(&runsc);
        let mut tried = Vec::new();
        for platform in PLATFORMS {
            if !known.contains(platform) {
                continue;
            }
            if platform == "kvm" && !hardware_virtualization() {
                tried.push("kvm: no usable /dev/kvm with hardware virtualization".to_string());
                continue;
            }
            match trial(&runsc, platform, scratch) {
                Ok(ms) => {
                    tracing::info!(platform, trial_ms = ms, "gVisor runs here");
                    return Ok(Gvisor {
                        runsc,
                        platform: platform.to_string(),
                    });
                }
                Err(why) => tried.push(format!("{platform}: {why}")),
            }
        }
        Err(format!(
            "a working gVisor platform ({})",
            if tried.is_empty() {
                "runsc names none".to_string()
            } else {
                tried.join("; ")
            }
        ))
    }

    /// The flags every runsc call of a run takes: its state directory and platform.
    fn global(&self, run_dir: &Path) -> Vec<String> {
        vec![
            self.runsc.display().to_string(),
            "--root".into(),
            state_dir(run_dir).display().to_string(),
            format!("--platform={}", self.platform),
            "--network=host".into(),
            "--oci-seccomp".into(),
            // Writes go to the machine's layer through the gofer (its size limit holds),
            // not to the Sentry's memory.
            "--overlay2=none".into(),
            // The sandbox stays in the machine's cgroup, where the shim put `runsc run`
            // (limits, freezer, kill): a cgroup of runsc's own below it would be removed
            // with the sandbox, and its OOM kill count with it.
            "--ignore-cgroups".into(),
        ]
    }

    /// `runsc run` of the bundle: what the shim runs, its input the run's [`stdio_file`].
    /// The container's pid is written where runc's is ([`crate::oci::pid_file`]), so the
    /// run counts as started the same way.
    pub fn run_argv(&self, run_dir: &Path, id: &str, bundle: &Path) -> Vec<String> {
        let mut v = redirected(run_dir, "<\"$0\"");
        v.extend(self.global(run_dir));
        v.extend([
            "run".into(),
            "--pid-file".into(),
            crate::oci::pid_file(run_dir).display().to_string(),
            "--bundle".into(),
            bundle.display().to_string(),
            id.into(),
        ]);
        v
    }

    /// `runsc exec` of `argv` in run `run_dir`'s container (its caller gives it pipes:
    /// `crate::exec`).
    pub fn exec_argv(&self, run_dir: &Path, id: &str, argv: &[String]) -> Vec<String> {
        let mut v = self.global(run_dir);
        v.extend(["exec".into(), id.into()]);
        v.extend(argv.iter().cloned());
        v
    }

    /// `runsc kill` of run `run_dir`'s container, with `{signal}` for the shim to fill; its
    /// streams are the run's [`stdio_file`].
    pub fn signal_argv(&self, run_dir: &Path, id: &str) -> Vec<String> {
        let mut v = redirected(run_dir, "<\"$0\" >>\"$0\" 2>&1");
        v.extend(self.global(run_dir));
        v.extend([
            "kill".into(),
            id.into(),
            bazaar_shim::SIGNAL_PLACEHOLDER.into(),
        ]);
        v
    }
}

/// Where runsc keeps a run's state.
fn state_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("runsc")
}

/// The private file a run's runsc calls have for standard streams instead of `/dev/null`
/// (made empty, mode 0600, by [`make_stdio_file`]).
pub fn stdio_file(run_dir: &Path) -> PathBuf {
    run_dir.join("runsc.stdio")
}

/// Makes a run's [`stdio_file`].
pub fn make_stdio_file(run_dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(stdio_file(run_dir))
        .map(drop)
}

/// `sh -c 'exec "$@" REDIRECTIONS' STDIO_FILE`: what runs the runsc command that follows
/// with its streams redirected (`$0` is the run's [`stdio_file`]).
fn redirected(run_dir: &Path, redirections: &str) -> Vec<String> {
    vec![
        "/bin/sh".into(),
        "-c".into(),
        format!("exec \"$@\" {redirections}"),
        stdio_file(run_dir).display().to_string(),
    ]
}

/// Makes runc's bundle (`crate::oci`'s `config.json`) one runsc runs: no user namespace
/// and no id mappings (see the module's doc), no cgroup of its own (`--ignore-cgroups`);
/// everything else as runc has it.
pub fn adapt_bundle(spec: &mut Value) {
    let Some(linux) = spec.get_mut("linux").and_then(Value::as_object_mut) else {
        return;
    };
    linux.remove("uidMappings");
    linux.remove("gidMappings");
    linux.remove("cgroupsPath");
    if let Some(namespaces) = linux.get_mut("namespaces").and_then(Value::as_array_mut) {
        namespaces.retain(|ns| ns["type"] != "user");
    }
}

/// The platform names `runsc flags` knows (its help text of `--platform`).
fn runsc_flags(runsc: &Path) -> String {
    Command::new(runsc)
        .arg("flags")
        .stdin(Stdio::null())
        .output()
        .map(|o| {
            let mut text = String::from_utf8_lossy(&o.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&o.stderr));
            text.lines()
                .skip_while(|l| !l.trim_start().starts_with("-platform "))
                .nth(1)
                .unwrap_or_default()
                .to_string()
        })
        .unwrap_or_default()
}

/// Whether `/dev/kvm` opens and the CPU says it has hardware virtualization (an emulated
/// `/dev/kvm`, as in a VM without nested virtualization, makes gVisor crawl).
fn hardware_virtualization() -> bool {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags = cpu
        .lines()
        .find(|l| l.starts_with("flags"))
        .unwrap_or_default();
    let virt = flags.split_whitespace().any(|f| f == "vmx" || f == "svm");
    virt && std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok()
}

/// Runs `runsc do true` on `platform`, in its own state directory, without network;
/// the milliseconds it took, or why it failed.
fn trial(runsc: &Path, platform: &str, scratch: &Path) -> Result<u128, String> {
    let root = scratch.join(format!("gvisor-trial-{platform}"));
    let _ = std::fs::remove_dir_all(&root);
    let t0 = Instant::now();
    // (`runsc do` makes its bundle in TMPDIR, where the sandbox, as nobody, reads it: not
    // under the data dir, which may be closed to others. It removes it when it ends.) Its
    // streams are pipes: runsc would make a `/dev/null` it was given nobody's.
    let child = Command::new(runsc)
        .arg("--root")
        .arg(&root)
        .arg(format!("--platform={platform}"))
        .args(["--network=none", "do", "true"])
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let result = match child {
        Err(e) => Err(format!("runsc: {e}")),
        Ok(mut child) => loop {
            match child.try_wait() {
                Ok(Some(status)) if status.success() => break Ok(t0.elapsed().as_millis()),
                Ok(Some(status)) => {
                    let mut err = String::new();
                    if let Some(mut e) = child.stderr.take() {
                        use std::io::Read;
                        let _ = e.read_to_string(&mut err);
                    }
                    let last = err.lines().last().unwrap_or("no output").to_string();
                    break Err(format!("{status}: {last}"));
                }
                Ok(None) if t0.elapsed() > TRIAL_TIMEOUT => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break Err(format!("no answer in {}s", TRIAL_TIMEOUT.as_secs()));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Err(e) => break Err(e.to_string()),
            }
        },
    };
    let _ = std::fs::remove_dir_all(&root);
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_bundle_loses_its_user_namespace_and_keeps_the_network_one() {
        let mut spec = json!({"linux": {
            "uidMappings": [{"containerID": 0, "hostID": 200000, "size": 65536}],
            "gidMappings": [{"containerID": 0, "hostID": 200000, "size": 65536}],
            "cgroupsPath": "/bazaar/h/m/ctr",
            "namespaces": [{"type": "user", "path": "/proc/1/ns/user"}, {"type": "pid"},
                           {"type": "network", "path": "/run/netns/m"}],
            "seccomp": {"defaultAction": "SCMP_ACT_ERRNO"},
        }});
        adapt_bundle(&mut spec);
        assert_eq!(
            spec,
            json!({"linux": {
                "namespaces": [{"type": "pid"}, {"type": "network", "path": "/run/netns/m"}],
                "seccomp": {"defaultAction": "SCMP_ACT_ERRNO"},
            }})
        );
    }

    #[test]
    fn every_runsc_call_of_a_run_names_its_state_and_platform() {
        let g = Gvisor {
            runsc: "/usr/bin/runsc".into(),
            platform: "ptrace".into(),
        };
        let run = Path::new("/d/machines/m/runs/3");
        let exec = g.exec_argv(run, "m", &["cat".into(), "/proc/version".into()]);
        assert_eq!(
            exec,
            [
                "/usr/bin/runsc",
                "--root",
                "/d/machines/m/runs/3/runsc",
                "--platform=ptrace",
                "--network=host",
                "--oci-seccomp",
                "--overlay2=none",
                "--ignore-cgroups",
                "exec",
                "m",
                "cat",
                "/proc/version"
            ]
        );
        let kill = g.signal_argv(run, "m");
        assert_eq!(kill[kill.len() - 3..], ["kill", "m", "{signal}"]);
        // No /dev/null for runsc's streams: the run's own file.
        let stdio = "/d/machines/m/runs/3/runsc.stdio";
        assert_eq!(
            kill[..5],
            [
                "/bin/sh",
                "-c",
                "exec \"$@\" <\"$0\" >>\"$0\" 2>&1",
                stdio,
                "/usr/bin/runsc"
            ]
        );
        let runs = g.run_argv(run, "m", &run.join("bundle"));
        assert_eq!(
            runs[..5],
            [
                "/bin/sh",
                "-c",
                "exec \"$@\" <\"$0\"",
                stdio,
                "/usr/bin/runsc"
            ]
        );
        assert!(runs.ends_with(&[
            "--pid-file".into(),
            "/d/machines/m/runs/3/container.pid".into(),
            "--bundle".into(),
            "/d/machines/m/runs/3/bundle".into(),
            "m".into()
        ]));
    }
}
