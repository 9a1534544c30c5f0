//! bazaar's init inside a microVM guest (issue 33, item 3), the pure part: what the agent
//! writes on the root disk for it, under `/.bazaar` ([`Workload`]: `argv`, `env` as
//! NUL-separated lists, `user` as `uid:gid`, `cwd`), and the line it prints on the console
//! when the workload ends ([`exit_line`], read back by [`parse_exit_line`]), and the lines of
//! its two virtio-serial ports ([`Request`], [`ExecReply`]): on the control port
//! (`bazaar.ctl`) the signals the host forwards to the workload, on the exec port
//! (`bazaar.exec`) commands to run in the guest and their output. The binary
//! (`src/main.rs`) is built static (`scripts/vminit`) and runs as PID 1 in the guest.
#![forbid(unsafe_code)]

use std::path::Path;

/// Where the agent puts the workload's files on the root disk.
pub const DIR: &str = "/.bazaar";

/// The prefix of the console line that reports the workload's end.
pub const EXIT_PREFIX: &str = "bazaar-vminit: exit ";

/// What the guest init runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    pub argv: Vec<String>,
    /// `KEY=VALUE` entries.
    pub env: Vec<String>,
    pub uid: u32,
    pub gid: u32,
    pub cwd: String,
}

fn join(items: &[String]) -> Vec<u8> {
    let mut out = Vec::new();
    for i in items {
        out.extend_from_slice(i.as_bytes());
        out.push(0);
    }
    out
}

fn split(data: &[u8]) -> Vec<String> {
    data.split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

impl Workload {
    /// The files of `dir` (`/.bazaar` on the root disk, or the agent's path to it), each
    /// as (name, contents).
    pub fn to_files(&self) -> Vec<(&'static str, Vec<u8>)> {
        vec![
            ("argv", join(&self.argv)),
            ("env", join(&self.env)),
            ("user", format!("{}:{}", self.uid, self.gid).into_bytes()),
            ("cwd", self.cwd.clone().into_bytes()),
        ]
    }

    /// Reads what [`Workload::to_files`] wrote into `dir`.
    pub fn read(dir: &Path) -> Result<Workload, String> {
        let read = |name: &str| {
            std::fs::read(dir.join(name)).map_err(|e| format!("{}/{name}: {e}", dir.display()))
        };
        let argv = split(&read("argv")?);
        if argv.is_empty() {
            return Err("no command to run (empty argv)".into());
        }
        let user = String::from_utf8_lossy(&read("user")?).trim().to_string();
        let (uid, gid) = user
            .split_once(':')
            .and_then(|(u, g)| Some((u.parse().ok()?, g.parse().ok()?)))
            .ok_or_else(|| format!("user {user:?} is not uid:gid"))?;
        let cwd = String::from_utf8_lossy(&read("cwd")?).trim().to_string();
        Ok(Workload {
            argv,
            env: split(&read("env")?),
            uid,
            gid,
            cwd: if cwd.is_empty() { "/".into() } else { cwd },
        })
    }
}

/// The console line for a workload that exited with `code` (a signal `n` is `128 + n`).
pub fn exit_line(code: i32) -> String {
    format!("{EXIT_PREFIX}{code}")
}

/// The exit code in a console line of [`exit_line`]'s.
pub fn parse_exit_line(line: &str) -> Option<i32> {
    line.trim_end_matches('\r')
        .strip_prefix(EXIT_PREFIX)?
        .trim()
        .parse()
        .ok()
}

/// What the host asks of the guest init, one line each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Deliver signal `n` to the workload (control port).
    Signal(i32),
    /// Run `argv` (exec port); the reply carries `nonce`, so that a reply a host client
    /// gave up on is told from its own.
    Exec { nonce: u64, argv: Vec<String> },
}

/// How a command run by [`Request::Exec`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecReply {
    pub nonce: u64,
    /// Its exit code (a signal `n` is `128 + n`; 127: it could not be started).
    pub code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

fn hex(data: &[u8]) -> String {
    if data.is_empty() {
        return "-".into();
    }
    data.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s == "-" {
        return Some(Vec::new());
    }
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

impl Request {
    /// The request as one line (newline included).
    pub fn line(&self) -> String {
        match self {
            Request::Signal(n) => format!("signal {n}\n"),
            Request::Exec { nonce, argv } => format!("exec {nonce} {}\n", hex(&join(argv))),
        }
    }

    /// A line of [`Request::line`]'s; `None` for anything else.
    pub fn parse(line: &str) -> Option<Request> {
        let mut words = line.split_whitespace();
        match words.next()? {
            "signal" => Some(Request::Signal(words.next()?.parse().ok()?)),
            "exec" => {
                let nonce = words.next()?.parse().ok()?;
                let argv = split(&unhex(words.next()?)?);
                (!argv.is_empty()).then_some(Request::Exec { nonce, argv })
            }
            _ => None,
        }
    }
}

impl ExecReply {
    /// The reply as one line (newline included).
    pub fn line(&self) -> String {
        format!(
            "reply {} {} {} {}\n",
            self.nonce,
            self.code,
            hex(&self.stdout),
            hex(&self.stderr)
        )
    }

    /// A line of [`ExecReply::line`]'s; `None` for anything else.
    pub fn parse(line: &str) -> Option<ExecReply> {
        let mut words = line.split_whitespace();
        (words.next()? == "reply").then_some(())?;
        Some(ExecReply {
            nonce: words.next()?.parse().ok()?,
            code: words.next()?.parse().ok()?,
            stdout: unhex(words.next()?)?,
            stderr: unhex(words.next()?)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workload_round_trips_through_its_files() {
        let w = Workload {
            argv: vec!["/bin/sh".into(), "-c".into(), "echo 'a b'".into()],
            env: vec!["PATH=/bin".into(), "EMPTY=".into()],
            uid: 1000,
            gid: 100,
            cwd: "/srv".into(),
        };
        let d = std::env::temp_dir().join(format!("vminit-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        for (name, data) in w.to_files() {
            std::fs::write(d.join(name), data).unwrap();
        }
        let back = Workload::read(&d);
        std::fs::write(d.join("argv"), b"").unwrap();
        let empty = Workload::read(&d);
        std::fs::remove_dir_all(&d).unwrap();
        assert_eq!(back.unwrap(), w);
        assert!(empty.unwrap_err().contains("empty argv"));
    }

    #[test]
    fn exit_lines_read_back() {
        assert_eq!(parse_exit_line(&exit_line(0)), Some(0));
        assert_eq!(parse_exit_line(&format!("{}\r", exit_line(143))), Some(143));
        assert_eq!(parse_exit_line("exit 3"), None);
    }

    #[test]
    fn port_lines_read_back() {
        for r in [
            Request::Signal(15),
            Request::Exec {
                nonce: 7,
                argv: vec!["uname".into(), "-r".into(), "a b".into()],
            },
        ] {
            let line = r.line();
            assert!(line.ends_with('\n') && line.matches('\n').count() == 1);
            assert_eq!(Request::parse(&line), Some(r));
        }
        assert_eq!(Request::parse("exec 1 -"), None, "no command");
        assert_eq!(Request::parse("noise"), None);
        let reply = ExecReply {
            nonce: 9,
            code: 3,
            stdout: b"6.1.0\n".to_vec(),
            stderr: vec![],
        };
        assert_eq!(ExecReply::parse(&reply.line()), Some(reply));
        assert_eq!(ExecReply::parse("reply 1 0 zz -"), None);
    }
}
