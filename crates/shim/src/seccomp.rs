//! The seccomp filter of a confined process, compiled from the shared allowlist
//! ([`bazaar_types::seccomp`]) with `seccompiler`. Two filters are stacked: the allowlist
//! (anything else fails with `EPERM`; `clone` without namespace flags, `socket` by address
//! family and `personality` by value), and one that answers `clone3` with `ENOSYS` (the
//! kernel lets the most recently installed filter's errno win among equal actions), so that
//! libc falls back to `clone`, whose flags the first filter can check.
//!
//! Compiled before `fork` (it allocates); installed right before `execve`, after
//! `no_new_privs`. The agent compiles them once at start into a file
//! ([`write_seccomp_filters`]) that a sandbox names ([`crate::Sandbox::seccomp`]): a shim
//! then reads a few KiB instead of compiling for every machine.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use bazaar_types::seccomp as allow;
use seccompiler::{
    sock_filter, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch,
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

    /// The filters a sandbox names, or compiled here when it names none.
    pub(crate) fn for_sandbox(sandbox: &crate::Sandbox) -> Result<Filters, String> {
        match &sandbox.seccomp {
            Some(path) => Filters::read(path),
            None => Filters::compile(),
        }
    }

    /// Each program as its length (u32) then its instructions (code u16, jt u8, jf u8,
    /// k u32), little-endian.
    fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for program in &self.programs {
            out.extend_from_slice(&(program.len() as u32).to_le_bytes());
            for ins in program {
                out.extend_from_slice(&ins.code.to_le_bytes());
                out.extend_from_slice(&[ins.jt, ins.jf]);
                out.extend_from_slice(&ins.k.to_le_bytes());
            }
        }
        out
    }

    fn from_bytes(mut bytes: &[u8]) -> Option<Filters> {
        let mut take = |n: usize| -> Option<&[u8]> {
            let (head, rest) = bytes.split_at_checked(n)?;
            bytes = rest;
            Some(head)
        };
        let mut program = || -> Option<BpfProgram> {
            let len = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
            // The kernel's limit on one program (BPF_MAXINSNS).
            if len == 0 || len > 4096 {
                return None;
            }
            (0..len)
                .map(|_| {
                    let ins = take(8)?;
                    Some(sock_filter {
                        code: u16::from_le_bytes([ins[0], ins[1]]),
                        jt: ins[2],
                        jf: ins[3],
                        k: u32::from_le_bytes([ins[4], ins[5], ins[6], ins[7]]),
                    })
                })
                .collect()
        };
        let programs = [program()?, program()?];
        bytes.is_empty().then_some(Filters { programs })
    }

    fn read(path: &Path) -> Result<Filters, String> {
        let bytes = std::fs::read(path)
            .map_err(|err| format!("reading the seccomp filters {}: {err}", path.display()))?;
        Filters::from_bytes(&bytes)
            .ok_or_else(|| format!("{} holds no valid seccomp filters", path.display()))
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

/// Compiles the filters of a sandboxed run and writes them to `path` (replacing it
/// atomically), for sandboxes to name in [`crate::Sandbox::seccomp`].
pub fn write_seccomp_filters(path: &Path) -> Result<(), String> {
    let filters = Filters::compile()?;
    crate::files::write_atomic(path, &filters.to_bytes(), false)
        .map_err(|err| format!("writing {}: {err}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_written_by_the_agent_read_back_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seccomp.bpf");
        write_seccomp_filters(&path).unwrap();
        let compiled = Filters::compile().unwrap();
        let read = Filters::read(&path).unwrap();
        assert_eq!(read.programs, compiled.programs);
        // A truncated or padded file is refused, not installed.
        let bytes = std::fs::read(&path).unwrap();
        assert!(Filters::from_bytes(&bytes[..bytes.len() - 1]).is_none());
        assert!(Filters::from_bytes(&[bytes.as_slice(), &[0]].concat()).is_none());
    }

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
