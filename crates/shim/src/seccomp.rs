//! The seccomp filter of a confined process, compiled from the shared allowlist
//! ([`bazaar_types::seccomp`]). Two filters are stacked: the allowlist, a binary search over
//! call numbers (anything else fails with `EPERM`; `clone` without namespace flags, `socket`
//! by address family and `personality` by value, these rules compiled by `seccompiler`),
//! and one that answers `clone3` with `ENOSYS` (the
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
        let allowlist = search_tree(arch, allowlist_rules()?)?;
        let clone3 = SeccompFilter::new(
            BTreeMap::from([(Sysno::clone3.id() as i64, Vec::new())]),
            SeccompAction::Allow,
            SeccompAction::Errno(allow::CLONE3_ERRNO),
            arch,
        )
        .map_err(fail)?;
        let programs = [allowlist, BpfProgram::try_from(clone3).map_err(fail)?];
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

/// The allowlist's rules by system call number: no condition for a call allowed with any
/// arguments; `clone` without namespace flags, `socket` by address family and
/// `personality` by value.
fn allowlist_rules() -> Result<BTreeMap<i64, Vec<SeccompRule>>, String> {
    let fail = |err: seccompiler::BackendError| format!("compiling the seccomp filter: {err}");
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
    Ok(rules)
}

/// How many ranges of calls a leaf of [`search_tree`] compares one after another.
const LEAF_RANGES: usize = 4;

/// A range of call numbers with one decision: allowed with any arguments, or the chain of
/// rules at this index.
#[derive(Clone, Copy)]
struct Range {
    first: u32,
    last: u32,
    chain: Option<usize>,
}

/// The allowlist as a binary search over ranges of call numbers (what seccompiler makes is
/// a chain compared one call at a time: ~1,570 instructions, a call walking up to ~700).
///
/// The kernel, when a filter is installed, runs it once for every call number of the
/// architecture to find the calls it always allows (its action cache), and translates and
/// compiles all of it: for the chain that took ~1 ms per start (2-core VM, load 7), for
/// the tree (~230 instructions, at most 30 run for a call without rules) a sixth. Same decisions as
/// seccompiler's filter for the same `rules` (tested over every call number): another
/// architecture is killed, a call without rules is denied with `EPERM`, a call with rules
/// is allowed when one of them holds (each rule compiled by seccompiler).
fn search_tree(
    arch: TargetArch,
    rules: BTreeMap<i64, Vec<SeccompRule>>,
) -> Result<BpfProgram, String> {
    let deny = u32::from(SeccompAction::Errno(allow::DENIED_ERRNO));
    let allowed = u32::from(SeccompAction::Allow);
    let mut ranges: Vec<Range> = Vec::new();
    // Each chain: every rule then "allow" (a rule that fails jumps past its "allow"), and
    // "deny" when none held.
    let mut chains: Vec<BpfProgram> = Vec::new();
    for (nr, rules) in rules {
        let nr = u32::try_from(nr).map_err(|_| format!("seccomp: call number {nr}"))?;
        if rules.is_empty() {
            match ranges.last_mut() {
                Some(r) if r.chain.is_none() && r.last + 1 == nr => r.last = nr,
                _ => ranges.push(Range {
                    first: nr,
                    last: nr,
                    chain: None,
                }),
            }
            continue;
        }
        let mut chain = Vec::new();
        for rule in rules {
            chain.extend(BpfProgram::from(rule));
            chain.push(bpf_stmt(BPF_RET | BPF_K, allowed));
        }
        chain.push(bpf_stmt(BPF_RET | BPF_K, deny));
        ranges.push(Range {
            first: nr,
            last: nr,
            chain: Some(chains.len()),
        });
        chains.push(chain);
    }
    let mut program = vec![
        bpf_stmt(BPF_LD | BPF_W | BPF_ABS, SECCOMP_DATA_ARCH),
        bpf_jump(BPF_JMP | BPF_JEQ | BPF_K, audit_arch(arch), 1, 0),
        bpf_stmt(BPF_RET | BPF_K, libc::SECCOMP_RET_KILL_PROCESS),
        bpf_stmt(BPF_LD | BPF_W | BPF_ABS, SECCOMP_DATA_NR),
    ];
    // Jumps to the chains (placed after the tree): (index of the jump, chain).
    let mut to_chains = Vec::new();
    tree_node(&ranges, &mut program, &mut to_chains, allowed, deny);
    let mut starts = Vec::new();
    for chain in &chains {
        starts.push(program.len());
        program.extend_from_slice(chain);
    }
    for (jump, chain) in to_chains {
        program[jump].k = (starts[chain] - (jump + 1)) as u32;
    }
    // Never reached: seccompiler starts each rule with a jump that is jumped over, whose
    // target is one past the chain's end; the kernel refuses a program with a jump out.
    program.push(bpf_stmt(BPF_RET | BPF_K, deny));
    if program.len() >= BPF_MAX_LEN {
        return Err(format!(
            "the seccomp filter has {} instructions (the kernel takes fewer than {BPF_MAX_LEN})",
            program.len()
        ));
    }
    Ok(program)
}

/// `AUDIT_ARCH_*` of `arch` (what `seccomp_data.arch` holds for its calls).
fn audit_arch(arch: TargetArch) -> u32 {
    match arch {
        TargetArch::x86_64 => AUDIT_ARCH_X86_64,
        TargetArch::aarch64 => AUDIT_ARCH_AARCH64,
        TargetArch::riscv64 => AUDIT_ARCH_RISCV64,
    }
}

/// Emits the search over `ranges` (ascending, disjoint). The call number is loaded; every
/// path ends in a return or a jump to a chain.
fn tree_node(
    ranges: &[Range],
    program: &mut BpfProgram,
    to_chains: &mut Vec<(usize, usize)>,
    allowed: u32,
    deny: u32,
) {
    if ranges.len() <= LEAF_RANGES {
        // Per range: above it, to the next; below it (a gap), denied; else its decision.
        let deny_at = program.len() + 3 * ranges.len();
        for range in ranges {
            program.push(bpf_jump(BPF_JMP | BPF_JGT | BPF_K, range.last, 2, 0));
            let below = (deny_at - (program.len() + 1)) as u8;
            program.push(bpf_jump(BPF_JMP | BPF_JGE | BPF_K, range.first, 0, below));
            match range.chain {
                None => program.push(bpf_stmt(BPF_RET | BPF_K, allowed)),
                Some(chain) => {
                    to_chains.push((program.len(), chain));
                    program.push(bpf_stmt(BPF_JMP | BPF_JA, 0));
                }
            }
        }
        program.push(bpf_stmt(BPF_RET | BPF_K, deny));
        return;
    }
    let mid = ranges.len() / 2;
    // Below ranges[mid] to the left half (right after the jump), else over it to the right.
    program.push(bpf_jump(BPF_JMP | BPF_JGE | BPF_K, ranges[mid].first, 0, 1));
    let over_left = program.len();
    program.push(bpf_stmt(BPF_JMP | BPF_JA, 0));
    tree_node(&ranges[..mid], program, to_chains, allowed, deny);
    program[over_left].k = (program.len() - (over_left + 1)) as u32;
    tree_node(&ranges[mid..], program, to_chains, allowed, deny);
}

/// `struct seccomp_data` offsets: the call number and the audit architecture.
const SECCOMP_DATA_NR: u32 = 0;
const SECCOMP_DATA_ARCH: u32 = 4;
/// `AUDIT_ARCH_*` of `linux/audit.h` (the architectures seccompiler knows).
const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
const AUDIT_ARCH_AARCH64: u32 = 0xc000_00b7;
const AUDIT_ARCH_RISCV64: u32 = 0xc000_00f3;
/// The kernel's limit on one program's length (`BPF_MAXINSNS`).
const BPF_MAX_LEN: usize = 4096;
const BPF_LD: u16 = 0x00;
const BPF_W: u16 = 0x00;
const BPF_ABS: u16 = 0x20;
const BPF_JMP: u16 = 0x05;
const BPF_RET: u16 = 0x06;
const BPF_K: u16 = 0x00;
const BPF_JA: u16 = 0x00;
const BPF_JEQ: u16 = 0x10;
const BPF_JGT: u16 = 0x20;
const BPF_JGE: u16 = 0x30;

fn bpf_stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn bpf_jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
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

    /// Runs a classic BPF seccomp program over `seccomp_data` (call number, audit
    /// architecture, arguments), as the kernel would; returns its action and how many
    /// instructions it ran. Panics on an instruction these filters are not expected to hold.
    fn run(program: &[sock_filter], nr: u32, arch: u32, args: [u64; 6]) -> (u32, usize) {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_ne_bytes());
        data[4..8].copy_from_slice(&arch.to_ne_bytes());
        for (i, arg) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&arg.to_ne_bytes());
        }
        let (mut a, mut pc, mut steps) = (0u32, 0usize, 0usize);
        loop {
            let ins = &program[pc];
            steps += 1;
            pc += 1;
            let (k, jt, jf) = (ins.k, ins.jt as usize, ins.jf as usize);
            let jump = |taken: bool| if taken { jt } else { jf };
            match ins.code {
                0x20 => {
                    let at = k as usize;
                    a = u32::from_ne_bytes(data[at..at + 4].try_into().unwrap());
                }
                0x54 => a &= k,
                0x05 => pc += k as usize,
                0x15 => pc += jump(a == k),
                0x25 => pc += jump(a > k),
                0x35 => pc += jump(a >= k),
                0x45 => pc += jump(a & k != 0),
                0x06 => return (k, steps),
                code => panic!("unexpected BPF instruction {code:#x} at {}", pc - 1),
            }
        }
    }

    #[test]
    fn the_search_tree_decides_as_the_chain_it_replaces_in_few_steps() {
        let arch = TargetArch::try_from(std::env::consts::ARCH).unwrap();
        let chain = BpfProgram::try_from(
            SeccompFilter::new(
                allowlist_rules().unwrap(),
                SeccompAction::Errno(allow::DENIED_ERRNO),
                SeccompAction::Allow,
                arch,
            )
            .unwrap(),
        )
        .unwrap();
        let tree = Filters::compile().unwrap().programs[0].clone();
        // As the kernel checks it: every jump lands inside, and it ends with a return.
        for (pc, ins) in tree.iter().enumerate() {
            let left = tree.len() - pc - 1;
            match ins.code {
                0x05 => assert!((ins.k as usize) < left, "jump out at {pc}"),
                0x15 | 0x25 | 0x35 | 0x45 => {
                    assert!((ins.jt.max(ins.jf) as usize) < left, "jump out at {pc}")
                }
                _ => {}
            }
        }
        assert_eq!(tree.last().unwrap().code, 0x06);
        assert!(
            tree.len() < chain.len(),
            "{} vs {}",
            tree.len(),
            chain.len()
        );
        // Numbers of this and other ABIs (x32's bit), beyond the table, the largest.
        let numbers = (0..1100u32)
            .chain((0..600).map(|nr| nr | 0x4000_0000))
            .chain([u32::MAX, 0x7fff_ffff, 0x8000_0000]);
        // Arguments around every condition: namespace flags in and out of clone's, families
        // below, at and above the limit and each denied, every personality allowed and not.
        let mut firsts: Vec<u64> = vec![0, 1, 17, 0x1_0000_0002, u64::MAX, 0x11, 0x0100_0011];
        firsts.extend((0..64).map(|bit| 1u64 << bit));
        firsts.extend((0..50).chain([allow::SOCKET_FAMILY_LIMIT]));
        firsts.extend(allow::SOCKET_FAMILIES_DENIED);
        firsts.extend(
            allow::PERSONALITY_ALLOWED
                .iter()
                .flat_map(|&p| [p, p + 1, p | 1 << 32]),
        );
        let archs = [
            AUDIT_ARCH_X86_64,
            AUDIT_ARCH_AARCH64,
            AUDIT_ARCH_RISCV64,
            0x4000_0003,
        ];
        let with_rules = [Sysno::clone, Sysno::socket, Sysno::personality].map(|c| c.id() as u32);
        let (mut longest, mut allowed) = (0, 0);
        for nr in numbers {
            for arch in archs {
                for &first in &firsts {
                    let args = [first, 7, 0, 0, 0, u64::MAX];
                    let (want, _) = run(&chain, nr, arch, args);
                    let (got, steps) = run(&tree, nr, arch, args);
                    assert_eq!(got, want, "call {nr:#x}, arch {arch:#x}, arg0 {first:#x}");
                    if !with_rules.contains(&nr) {
                        longest = longest.max(steps);
                    }
                    allowed += usize::from(got == libc::SECCOMP_RET_ALLOW);
                }
            }
        }
        assert!(allowed > allow::ALLOWED.len(), "the tree allows nothing?");
        assert!(
            longest <= 30,
            "a call without rules walks {longest} instructions"
        );
    }

    #[test]
    fn the_shared_allowlist_compiles_to_what_it_lists() {
        let arch = TargetArch::try_from(std::env::consts::ARCH).unwrap();
        let filters = Filters::compile().unwrap();
        let decide = |call: Sysno, arg0: u64| {
            let args = [arg0, 0, 0, 0, 0, 0];
            let (action, _) = run(
                &filters.programs[0],
                call.id() as u32,
                audit_arch(arch),
                args,
            );
            action
        };
        let (allowed, denied) = (
            u32::from(SeccompAction::Allow),
            u32::from(SeccompAction::Errno(allow::DENIED_ERRNO)),
        );
        for call in [Sysno::read, Sysno::write, Sysno::execve, Sysno::exit_group] {
            assert_eq!(decide(call, 0), allowed, "{call}");
        }
        for call in [
            Sysno::mount,
            Sysno::unshare,
            Sysno::setns,
            Sysno::bpf,
            Sysno::io_uring_setup,
        ] {
            assert_eq!(decide(call, 0), denied, "{call}");
        }
        let newuser = libc::CLONE_NEWUSER as u64 | libc::SIGCHLD as u64;
        assert_eq!(decide(Sysno::clone, libc::SIGCHLD as u64), allowed);
        assert_eq!(decide(Sysno::clone, newuser), denied);
        assert_eq!(decide(Sysno::socket, libc::AF_INET as u64), allowed);
        assert_eq!(decide(Sysno::socket, libc::AF_VSOCK as u64), denied);
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
