//! The seccomp filter of a confined process, compiled from the shared allowlist
//! ([`bazaar_types::seccomp`]) with `seccompiler`. Two filters are stacked: the allowlist
//! (anything else fails with `EPERM`; `clone` without namespace flags, `socket` by address
//! family and `personality` by value), and one that answers `clone3` with `ENOSYS` (the
//! kernel lets the most recently installed filter's errno win among equal actions), so that
//! libc falls back to `clone`, whose flags the first filter can check.
//!
//! Compiled before `fork` (it allocates); installed right before `execve`, after
//! `no_new_privs`.

use std::collections::{BTreeMap, HashSet};

use bazaar_types::seccomp as allow;
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use syscalls::Sysno;

/// The compiled filters, in the order they are installed.
pub(crate) struct Filters {
    programs: [BpfProgram; 2],
}

impl Filters {
    /// Compiles the filters for the running architecture.
    pub(crate) fn compile() -> Result<Filters, String> {
        let fail = |err: seccompiler::BackendError| format!("compiling the seccomp filter: {err}");
        let arch = TargetArch::try_from(std::env::consts::ARCH)
            .map_err(|err| format!("seccomp: {err}"))?;
        // One pass over this architecture's calls (names that do not exist here are skipped).
        let allowed: HashSet<&str> = allow::ALLOWED.iter().copied().collect();
        let mut rules: BTreeMap<i64, Vec<SeccompRule>> = Sysno::iter()
            .filter(|nr| allowed.contains(nr.name()))
            .map(|nr| (nr.id() as i64, Vec::new()))
            .collect();
        let arg0 = |op, value| SeccompCondition::new(0, SeccompCmpArgLen::Qword, op, value);
        let clone = arg0(SeccompCmpOp::MaskedEq(allow::CLONE_NAMESPACE_FLAGS), 0)
            .and_then(|c| SeccompRule::new(vec![c]))
            .map_err(fail)?;
        rules.insert(Sysno::clone.id() as i64, vec![clone]);
        // One rule (its conditions all hold): below the limit and none of the denied.
        let families = std::iter::once(arg0(SeccompCmpOp::Lt, allow::SOCKET_FAMILY_LIMIT))
            .chain(
                allow::SOCKET_FAMILIES_DENIED
                    .iter()
                    .map(|&f| arg0(SeccompCmpOp::Ne, f)),
            )
            .collect::<Result<Vec<_>, _>>()
            .and_then(SeccompRule::new)
            .map_err(fail)?;
        rules.insert(Sysno::socket.id() as i64, vec![families]);
        let personalities = allow::PERSONALITY_ALLOWED
            .iter()
            .map(|&p| {
                SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, p)
                    .and_then(|c| SeccompRule::new(vec![c]))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(fail)?;
        rules.insert(Sysno::personality.id() as i64, personalities);
        let allowlist = SeccompFilter::new(
            rules,
            SeccompAction::Errno(allow::DENIED_ERRNO),
            SeccompAction::Allow,
            arch,
        )
        .map_err(fail)?;
        let clone3 = SeccompFilter::new(
            BTreeMap::from([(Sysno::clone3.id() as i64, Vec::new())]),
            SeccompAction::Allow,
            SeccompAction::Errno(allow::CLONE3_ERRNO),
            arch,
        )
        .map_err(fail)?;
        let programs = [
            BpfProgram::try_from(allowlist).map_err(fail)?,
            BpfProgram::try_from(clone3).map_err(fail)?,
        ];
        Ok(Filters { programs })
    }

    /// Installs the filters on the calling thread (`no_new_privs` must be set, or the
    /// caller have `CAP_SYS_ADMIN`).
    pub(crate) fn install(&self) -> Result<(), String> {
        for program in &self.programs {
            seccompiler::apply_filter(program)
                .map_err(|err| format!("installing the seccomp filter: {err}"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_allowlist_compiles() {
        let filters = Filters::compile().unwrap();
        assert!(filters.programs[0].len() > allow::ALLOWED.len());
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn every_listed_call_is_known_to_this_architecture_table() {
        // A typo in the shared list would silently allow nothing under that name.
        let known: HashSet<&str> = Sysno::iter().map(|nr| nr.name()).collect();
        let unknown: Vec<&&str> = allow::ALLOWED
            .iter()
            .filter(|name| !known.contains(**name))
            .collect();
        assert!(unknown.is_empty(), "{unknown:?}");
    }
}
