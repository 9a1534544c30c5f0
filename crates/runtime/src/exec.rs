//! `exec`: runs a command in a machine's context and returns its exit status and output.
//! In an isolated process machine through `bazaar shim-exec` ([`bazaar_shim::exec_main`]:
//! the run's cgroup, namespaces, user, environment and working directory, and for a
//! sandboxed run no capabilities and its seccomp filter); in an image machine through
//! `runc exec`; otherwise directly, with the machine's environment. Output is capped; the
//! command is killed at its timeout.

use bazaar_types::host::{ExecRequest, ExecResponse};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Each of stdout and stderr is cut at this size.
const MAX_OUTPUT: usize = 1024 * 1024;
/// Default and maximum timeouts.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
const MAX_TIMEOUT: Duration = Duration::from_secs(300);

/// Why a command could not be run to its end.
#[derive(Debug)]
pub enum ExecError {
    /// The request is wrong (no command, a program that cannot be run).
    Invalid(String),
    /// Something failed on the host.
    Internal(String),
    /// The command did not finish in time (it was killed): `id` names it, `states` what
    /// it did not do, in the words of the agent's wait timeouts.
    Timeout { id: String, states: String },
}

impl std::fmt::Display for ExecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExecError::Invalid(m) | ExecError::Internal(m) => f.write_str(m),
            ExecError::Timeout { id, states } => {
                write!(f, "timeout waiting for {id} to be {states}")
            }
        }
    }
}

impl std::error::Error for ExecError {}

/// Where and how to run.
#[derive(Debug)]
pub struct ExecTarget {
    /// For an isolated run: the `bazaar` executable and the run's directory, for
    /// `bazaar shim-exec RUN_DIR ARGV...`.
    pub shim_exec: Option<(std::path::PathBuf, std::path::PathBuf)>,
    pub env: Vec<(String, String)>,
    pub workdir: std::path::PathBuf,
    /// For an image machine: the whole `runc exec ...` argv to run instead.
    pub runc_exec: Option<Vec<String>>,
}

/// The argv of a request (`command`, or the deprecated `cmd` string split on spaces).
pub fn argv(req: &ExecRequest) -> Result<Vec<String>, ExecError> {
    let argv = if !req.command.is_empty() {
        req.command.clone()
    } else if let Some(cmd) = &req.cmd {
        cmd.split_whitespace().map(str::to_string).collect()
    } else {
        Vec::new()
    };
    if argv.is_empty() || argv[0].is_empty() {
        return Err(ExecError::Invalid("exec needs a command".into()));
    }
    if argv.iter().any(|a| a.contains('\0')) {
        return Err(ExecError::Invalid("the command contains a NUL byte".into()));
    }
    Ok(argv)
}

/// Runs the command.
pub async fn run(target: &ExecTarget, req: &ExecRequest) -> Result<ExecResponse, ExecError> {
    let argv = argv(req)?;
    let timeout = req
        .timeout
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_TIMEOUT)
        .min(MAX_TIMEOUT);
    let mut cmd = if let Some(runc) = &target.runc_exec {
        let mut c = tokio::process::Command::new(&runc[0]);
        c.args(&runc[1..]);
        c
    } else if let Some((exe, run_dir)) = &target.shim_exec {
        let mut c = tokio::process::Command::new(exe);
        c.arg("shim-exec").arg(run_dir).args(&argv);
        c
    } else {
        let mut c = tokio::process::Command::new(&argv[0]);
        c.args(&argv[1..]);
        c
    };
    if target.runc_exec.is_none() && target.shim_exec.is_none() {
        cmd.env_clear()
            .envs(target.env.iter().cloned())
            .current_dir(&target.workdir);
    }
    // A runtime's exec (`runc exec`, `runsc exec`) reads a pipe, closed at once without
    // input: runsc gives its streams' files to its sandbox's user, and so would make the
    // host's `/dev/null` nobody's.
    cmd.stdin(if req.stdin.is_some() || target.runc_exec.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .map_err(|e| ExecError::Invalid(format!("cannot run {:?}: {e}", argv[0])))?;
    // (Without input, the pipe is dropped here: the command reads its end.)
    if let (Some(input), Some(mut stdin)) = (req.stdin.clone(), child.stdin.take()) {
        tokio::spawn(async move {
            let _ = stdin.write_all(input.as_bytes()).await;
        });
    }
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let collect = async {
        let (o, e) = tokio::join!(read_capped(out.as_mut()), read_capped(err.as_mut()));
        let status = child.wait().await;
        (o, e, status)
    };
    match tokio::time::timeout(timeout, collect).await {
        Ok((stdout, stderr, status)) => {
            let status = status.map_err(|e| ExecError::Internal(e.to_string()))?;
            use std::os::unix::process::ExitStatusExt;
            Ok(ExecResponse {
                exit_code: status.code().unwrap_or(-1),
                exit_signal: status.signal().unwrap_or(0),
                stdout,
                stderr,
            })
        }
        Err(_) => Err(ExecError::Timeout {
            id: format!("exec of {:?}", argv[0]),
            states: format!("finished within {}s", timeout.as_secs()),
        }),
    }
}

async fn read_capped<R: tokio::io::AsyncRead + Unpin>(r: Option<&mut R>) -> String {
    let Some(r) = r else { return String::new() };
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        match r.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if buf.len() < MAX_OUTPUT {
                    let take = n.min(MAX_OUTPUT - buf.len());
                    buf.extend_from_slice(&chunk[..take]);
                }
            }
        }
    }
    String::from_utf8_lossy(&buf).into_owned()
}
