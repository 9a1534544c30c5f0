//! What a token may do: the operations of the Machines API ([`Op`]) and a token's scope
//! ([`Scope`]), written into a block as Datalog checks. The facts a request brings are
//! `operation(op)`, `app(name)` (or `platform(true)` for calls about no app), `driver("process")`
//! or `driver("none")`, `runtime(name)` (the runtime of the machine config it creates or
//! updates) or `runtime("none")`, and `time(now)`; see [`crate::verify`].

use crate::Error;
use biscuit_auth::builder::{BlockBuilder, Term};
use std::collections::{BTreeSet, HashMap};
use std::time::SystemTime;

/// An operation of the Machines API. Every route maps to one (`bazaar-api`'s `access`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Op {
    /// Every `GET`: apps, machines, volumes, logs, events, leases, the audit record.
    Read,
    /// Create an app, a machine (batch too).
    Create,
    /// Change a machine's config, metadata, cordon.
    Update,
    Start,
    Stop,
    Restart,
    Signal,
    Suspend,
    /// Delete an app or a machine.
    Destroy,
    /// Run a command in a machine.
    Exec,
    /// Acquire or release a lease.
    Lease,
    /// Create, change, extend, snapshot or delete a volume.
    Volumes,
    /// Set or unset an app's secrets (listing names and digests is a read).
    Secrets,
}

impl Op {
    /// Every operation.
    pub const ALL: [Op; 13] = [
        Op::Read,
        Op::Create,
        Op::Update,
        Op::Start,
        Op::Stop,
        Op::Restart,
        Op::Signal,
        Op::Suspend,
        Op::Destroy,
        Op::Exec,
        Op::Lease,
        Op::Volumes,
        Op::Secrets,
    ];

    /// Its name in tokens and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Create => "create",
            Op::Update => "update",
            Op::Start => "start",
            Op::Stop => "stop",
            Op::Restart => "restart",
            Op::Signal => "signal",
            Op::Suspend => "suspend",
            Op::Destroy => "destroy",
            Op::Exec => "exec",
            Op::Lease => "lease",
            Op::Volumes => "volumes",
            Op::Secrets => "secrets",
        }
    }
}

impl std::str::FromStr for Op {
    type Err = Error;
    fn from_str(s: &str) -> Result<Op, Error> {
        Op::ALL
            .into_iter()
            .find(|op| op.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Op::ALL.iter().map(|op| op.name()).collect();
                Error::Scope(format!(
                    "unknown operation {s:?} (one of {})",
                    names.join(", ")
                ))
            })
    }
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A token's scope, as created ([`crate::mint`]) or narrowed ([`crate::attenuate`]). The
/// default is the whole organization: every app, every operation, no expiry, the process
/// driver allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// Only these apps (empty: every app, and the calls about no app such as creating one).
    /// An app-scoped token still reads the platform (regions) and lists only its apps.
    pub apps: BTreeSet<String>,
    /// Only `read`.
    pub read_only: bool,
    /// Only these operations (empty: every one); `read` is always among them.
    pub ops: BTreeSet<Op>,
    /// Refused from this time on.
    pub expires: Option<SystemTime>,
    /// Whether machines with `config.driver = "process"` may be created or updated. Minting:
    /// grants it (only the first block can); narrowing: `false` takes it away.
    pub process: bool,
    /// Only machines of these runtimes (`config.runtime`: one of [`RUNTIMES`]) may be
    /// created or updated (empty: every runtime). A platform hands a stranger a token
    /// limited to `gvisor` or `microvm`.
    pub runtimes: BTreeSet<String>,
}

/// The runtimes a token may be limited to: those of `bazaar_types::config::RUNTIMES`.
pub const RUNTIMES: [&str; 4] = ["process", "runc", "gvisor", "microvm"];

impl Default for Scope {
    fn default() -> Scope {
        Scope {
            apps: BTreeSet::new(),
            read_only: false,
            ops: BTreeSet::new(),
            expires: None,
            process: true,
            runtimes: BTreeSet::new(),
        }
    }
}

impl Scope {
    /// The checks that hold a request to this scope, added to `block` (the process driver
    /// is left to the caller: a grant in the first block, a check in later ones).
    pub(crate) fn add_checks(&self, mut block: BlockBuilder) -> Result<BlockBuilder, Error> {
        for app in &self.apps {
            if !valid_app_name(app) {
                return Err(Error::Scope(format!("invalid app name {app:?}")));
            }
        }
        if !self.apps.is_empty() {
            let apps = self.apps.iter().map(|a| Term::Str(a.clone())).collect();
            block = block.code_with_params(
                r#"check if app($app), {apps}.contains($app) or platform(true), operation("read");"#,
                HashMap::from([("apps".to_string(), Term::Set(apps))]),
                HashMap::new(),
            )?;
        }
        if self.read_only {
            block = block.code(r#"check if operation("read");"#)?;
        }
        if !self.ops.is_empty() {
            let ops = self
                .ops
                .iter()
                .chain(&[Op::Read])
                .map(|op| Term::Str(op.name().to_string()))
                .collect();
            block = block.code_with_params(
                "check if operation($op), {ops}.contains($op);",
                HashMap::from([("ops".to_string(), Term::Set(ops))]),
                HashMap::new(),
            )?;
        }
        for runtime in &self.runtimes {
            if !RUNTIMES.contains(&runtime.as_str()) {
                return Err(Error::Scope(format!(
                    "unknown runtime {runtime:?} (one of {})",
                    RUNTIMES.join(", ")
                )));
            }
        }
        if !self.runtimes.is_empty() {
            let runtimes = self.runtimes.iter().map(|r| Term::Str(r.clone())).collect();
            block = block.code_with_params(
                r#"check if runtime($r), {runtimes}.contains($r) or runtime("none");"#,
                HashMap::from([("runtimes".to_string(), Term::Set(runtimes))]),
                HashMap::new(),
            )?;
        }
        if let Some(expires) = self.expires {
            let secs = expires
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_err(|_| Error::Scope("expiry before 1970".into()))?
                .as_secs();
            block = block.code_with_params(
                "check if time($time), $time <= {expires};",
                HashMap::from([("expires".to_string(), Term::Date(secs))]),
                HashMap::new(),
            )?;
        }
        Ok(block)
    }
}

/// App names as the API accepts them: lowercase letters, digits and dashes.
fn valid_app_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_read_back_from_their_names() {
        for op in Op::ALL {
            assert_eq!(op.name().parse::<Op>().unwrap(), op);
        }
        let err = "fly".parse::<Op>().unwrap_err().to_string();
        assert!(
            err.contains("unknown operation") && err.contains("exec"),
            "{err}"
        );
    }

    #[test]
    fn app_names_are_checked_before_they_reach_datalog() {
        let scope = Scope {
            apps: BTreeSet::from([r#"web"), app("other"#.to_string()]),
            ..Scope::default()
        };
        assert!(scope.add_checks(BlockBuilder::new()).is_err());
    }
}
