//! The formats shared by the shim process and the agent-side handle: the files in RUN_DIR
//! (`shim.pid`, atomic writes of `exit.json`), the readiness line the shim writes on its
//! stdout pipe, and the validation of a [`ShimSpec`] before anything is started.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{ShimError, ShimSpec, PID_FILE};

/// Longest hostname the kernel accepts (`HOST_NAME_MAX`).
const HOST_NAME_MAX: usize = 64;

/// `RUN_DIR/shim.pid`: who the shim, its init and its workload are. Start times (field 22 of
/// `/proc/<pid>/stat`) make the pids safe against reuse.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PidRecord {
    /// The run this record belongs to (a reused RUN_DIR may hold a dead shim's record).
    pub run_id: u64,
    pub shim_pid: i32,
    pub shim_start: u64,
    /// The mini init of an isolated run (host pid).
    pub init_pid: Option<i32>,
    pub init_start: Option<u64>,
    /// The workload (host pid). `None` while launching, or if an isolated workload exited
    /// before its host pid could be observed.
    pub workload_pid: Option<i32>,
    pub workload_start: Option<u64>,
    /// The launch phase is over: the workload was exec'd (the other fields are final).
    pub running: bool,
    /// When each step of the launch ended ([`crate::monotonic_us`]), in order: the shim's
    /// and its init's (`bazaar machine explain --timing`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub marks: Vec<(String, u64)>,
}

impl PidRecord {
    /// Reads `RUN_DIR/shim.pid`; `None` if it is missing or being replaced.
    pub(crate) fn read(run_dir: &Path) -> Option<PidRecord> {
        let bytes = fs::read(run_dir.join(PID_FILE)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }
}

/// The single line the shim writes on its stdout (a pipe to the agent) when the launch is over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Ready {
    /// The workload was exec'd.
    Started(PidRecord),
    /// The workload could not be started; the shim has written `exit.json` and exits.
    Failed(String),
}

/// Replaces `path` with `bytes` atomically (write a sibling temporary file, rename it over).
/// With `durable`, the data and the rename are fsynced, so the file survives a power loss.
/// Readable by the owner only: a spec holds the machine's environment (its secrets).
pub(crate) fn write_atomic(path: &Path, bytes: &[u8], durable: bool) -> io::Result<()> {
    let tmp = tmp_path(path);
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(bytes)?;
    if durable {
        file.sync_all()?;
    }
    drop(file);
    fs::rename(&tmp, path)?;
    if durable {
        if let Some(dir) = path.parent() {
            File::open(dir)?.sync_all()?;
        }
    }
    Ok(())
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

/// Checks environment variables: a name without `=` or NUL, a value without NUL. The
/// message names the variable, never its value (it may be a secret).
pub(crate) fn validate_env(env: &[(String, String)]) -> Result<(), ShimError> {
    for (key, value) in env {
        if key.is_empty() || key.contains(['=', '\0']) || value.contains('\0') {
            return Err(ShimError::Spec(format!(
                "invalid environment variable {key:?} (a name without '=' or NUL, a value without NUL)"
            )));
        }
    }
    Ok(())
}

/// Checks what the shim could otherwise only report as an obscure launch failure.
pub(crate) fn validate(spec: &ShimSpec) -> Result<(), ShimError> {
    let bad = |msg: String| Err(ShimError::Spec(msg));
    if spec.argv.is_empty() || spec.argv[0].is_empty() {
        return bad("argv is empty".into());
    }
    let has_nul = |s: &str| s.contains('\0');
    if spec.argv.iter().any(|a| has_nul(a)) {
        return bad("argv contains a NUL byte".into());
    }
    validate_env(&spec.env)?;
    if !spec.workdir.is_absolute() {
        return bad(format!(
            "workdir {} is not absolute",
            spec.workdir.display()
        ));
    }
    if let Some(sandbox) = &spec.sandbox {
        let inside = std::iter::once(&sandbox.workdir).chain(sandbox.binds.iter().map(|(_, t)| t));
        for path in inside.chain(sandbox.binds.iter().map(|(s, _)| s)) {
            let plain = path
                .components()
                .all(|c| !matches!(c, std::path::Component::ParentDir));
            if !path.is_absolute() || !plain || path == Path::new("/") {
                return bad(format!(
                    "sandbox path {} must be absolute, not / and without ..",
                    path.display()
                ));
            }
        }
    }
    if !spec.log_path.is_absolute() || spec.log_path.file_name().is_none() {
        return bad(format!(
            "log_path {} is not an absolute file path",
            spec.log_path.display()
        ));
    }
    if !spec.cpus.is_finite() || spec.cpus < 0.0 {
        return bad(format!(
            "cpus must be a non-negative number, got {}",
            spec.cpus
        ));
    }
    if spec.hostname.len() > HOST_NAME_MAX || has_nul(&spec.hostname) {
        return bad(format!("invalid hostname {:?}", spec.hostname));
    }
    if let Some(cgroup) = &spec.cgroup {
        crate::cgroup::validate_relative(cgroup).map_err(ShimError::Spec)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ShimSpec {
        ShimSpec {
            machine_id: "m".into(),
            run_id: 1,
            argv: vec!["sleep".into(), "1".into()],
            env: vec![("PATH".into(), "/bin".into())],
            workdir: "/tmp".into(),
            user: None,
            hostname: "h".into(),
            isolate: false,
            memory_mb: 0,
            cpus: 0.0,
            cgroup: None,
            log_path: "/tmp/log".into(),
            log_max_bytes: 0,
            sandbox: None,
            cgroup_layout: None,
            signal_argv: None,
        }
    }

    #[test]
    fn validate_accepts_a_plain_spec_and_rejects_bad_fields() {
        assert!(validate(&spec()).is_ok());
        let cases: &[fn(&mut ShimSpec)] = &[
            |s| s.argv.clear(),
            |s| s.argv[0] = "a\0b".into(),
            |s| s.env.push(("A=B".into(), "x".into())),
            |s| s.workdir = "rel".into(),
            |s| s.log_path = "log".into(),
            |s| s.cpus = f64::NAN,
            |s| s.cpus = -1.0,
            |s| s.hostname = "x".repeat(65),
            |s| s.cgroup = Some("../escape".into()),
            |s| s.cgroup = Some("/abs".into()),
        ];
        for (i, mutate) in cases.iter().enumerate() {
            let mut s = spec();
            mutate(&mut s);
            assert!(matches!(validate(&s), Err(ShimError::Spec(_))), "case {i}");
        }
    }

    #[test]
    fn ready_line_round_trips() {
        let ready = Ready::Started(PidRecord {
            shim_pid: 7,
            running: true,
            ..Default::default()
        });
        let line = serde_json::to_string(&ready).unwrap();
        assert_eq!(serde_json::from_str::<Ready>(&line).unwrap(), ready);
        let failed = serde_json::to_string(&Ready::Failed("nope".into())).unwrap();
        assert_eq!(failed, r#"{"failed":"nope"}"#);
    }

    #[test]
    fn write_atomic_replaces_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.json");
        write_atomic(&path, b"one", false).unwrap();
        write_atomic(&path, b"two", true).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert!(!tmp_path(&path).exists());
    }
}
