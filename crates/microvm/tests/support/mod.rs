//! What the tests that boot microVMs share (this crate's `tests/boot.rs`, the runtime's
//! `tests/microvm_boot.rs` and the binary's `tests/microvm_machines.rs`, by `#[path]`): the
//! guest kernel of `scripts/vm-kernel` and bazaar's guest init built by `scripts/vminit`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// Where the guest kernel is: `BAZAAR_VM_KERNEL` (as `scripts/test` sets it), else the
/// cache `scripts/vm-kernel` fills. It may not be there.
pub fn kernel_path() -> PathBuf {
    std::env::var_os("BAZAAR_VM_KERNEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_default();
            Path::new(&home).join(".cache/bazaar/vm/vmlinuz")
        })
}

/// The guest kernel, which must be there.
pub fn kernel() -> PathBuf {
    let kernel = kernel_path();
    assert!(
        kernel.is_file(),
        "no guest kernel at {} (run scripts/vm-kernel, or set BAZAAR_VM_KERNEL)",
        kernel.display()
    );
    kernel
}

/// bazaar's guest init, built static (`scripts/vminit`, or `BAZAAR_VMINIT`).
pub fn vminit() -> PathBuf {
    if let Some(p) = std::env::var_os("BAZAAR_VMINIT") {
        return p.into();
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::process::Command::new(root.join("scripts/vminit"))
        .output()
        .expect("scripts/vminit");
    assert!(
        out.status.success(),
        "scripts/vminit: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}
