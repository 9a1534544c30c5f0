//! The pure core of microVM machines (issue 33, item 3): what the agent hands QEMU
//! (`qemu-system-x86_64 -machine microvm`, [`qemu`]), what it writes on the guest kernel's
//! command line (the machine's network, [`cmdline`]) and how bazaar's guest init reads it
//! back. No I/O here: the runtime's shell makes the tap, the disks and runs QEMU under the
//! shim; the guest init parses with [`cmdline::GuestBoot::parse`].

pub mod cmdline;
pub mod qemu;

pub use cmdline::{GuestBoot, GuestNet};
pub use qemu::{choose_accel, guest_mac, Accel, AccelError, VmSpec};
