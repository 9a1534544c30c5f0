//! The seccomp section of an image machine's OCI bundle: [`bazaar_types::seccomp`]'s
//! allowlist as runc reads it.

use bazaar_types::seccomp;
use serde_json::{json, Value};

/// The seccomp section: [`bazaar_types::seccomp`]'s allowlist, everything else `EPERM`.
pub(super) fn seccomp_profile() -> Value {
    let allow_if = |name: &str, value: u64, op: &str| {
        json!({"names": [name], "action": "SCMP_ACT_ALLOW",
               "args": [{"index": 0, "value": value, "valueTwo": 0, "op": op}]})
    };
    let mut rules = vec![
        json!({"names": seccomp::ALLOWED, "action": "SCMP_ACT_ALLOW"}),
        // clone only without namespace flags: (flags & NS) == 0.
        json!({"names": ["clone"], "action": "SCMP_ACT_ALLOW",
               "args": [{"index": 0, "value": seccomp::CLONE_NAMESPACE_FLAGS, "valueTwo": 0,
                         "op": "SCMP_CMP_MASKED_EQ"}]}),
        json!({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": seccomp::CLONE3_ERRNO}),
    ];
    rules.extend(
        (0..seccomp::SOCKET_FAMILY_LIMIT)
            .filter(|f| !seccomp::SOCKET_FAMILIES_DENIED.contains(f))
            .map(|f| allow_if("socket", f, "SCMP_CMP_EQ")),
    );
    rules.extend(
        seccomp::PERSONALITY_ALLOWED
            .iter()
            .map(|p| allow_if("personality", *p, "SCMP_CMP_EQ")),
    );
    json!({
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": seccomp::DENIED_ERRNO,
        // This host's own system call ABI only: a call through another (32-bit x86, x32)
        // kills the thread. Each ABI listed multiplies the filter runc compiles at every
        // start (three took 30 ms more than one, measured with runc 1.1 / libseccomp 2.5).
        "architectures": [native_seccomp_arch()],
        "syscalls": rules,
    })
}

/// libseccomp's name of this host's architecture.
fn native_seccomp_arch() -> &'static str {
    match std::env::consts::ARCH {
        "aarch64" => "SCMP_ARCH_AARCH64",
        "riscv64" => "SCMP_ARCH_RISCV64",
        "s390x" => "SCMP_ARCH_S390X",
        "powerpc64" => "SCMP_ARCH_PPC64LE",
        _ => "SCMP_ARCH_X86_64",
    }
}
