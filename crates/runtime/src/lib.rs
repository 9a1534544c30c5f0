//! The host plumbing of bazaar machines on Linux, below the agent: how a workload is
//! launched, supervised and removed, with nothing of the agent's store, market or API.
//! The agent hands each call what it needs ([`Workload`], paths, settings).
//!
//! - [`lifecycle`]: the interface the agent's actors call ([`MachineDriver`], [`Run`]) and
//!   the borrowed view of a machine it takes ([`Workload`]).
//! - [`driver`]: the real driver (command, environment, ports, shims) of process and image
//!   machines; [`oci`] prepares image machines (image, rootfs, bundle, `runc`) and
//!   [`network`] gives each one a network namespace on one of the host's [`bridges`]
//!   (wired by [`netlink`] requests; user namespace id ranges from [`idranges`]; its
//!   [`subnet`]);
//!   [`gvisor`] runs the same bundles under gVisor's `runsc`; [`microvm`] holds the host
//!   side of QEMU microVM machines (root disk, initramfs, QEMU in the network namespace).
//! - [`volume_fs`]: volumes' storage (ext4 images on loop devices, or directories);
//!   [`work_disk`]: a machine's writable space, limited in size the same way ([`layer`]:
//!   an image machine's, emptied at each start); [`disk_pool`]: work disks made ahead, so
//!   a first start only moves one into place.
//! - [`exec`]: running a command inside a machine.
//! - [`prerequisites`]: what this host lacks to run each driver's machines.

pub mod bridges;
pub mod disk_pool;
pub mod driver;
pub mod exec;
pub mod gvisor;
pub mod idranges;
pub mod launch_error;
pub mod layer;
pub mod lifecycle;
pub mod microvm;
pub mod netlink;
pub mod network;
pub mod oci;
pub mod owner;
pub mod prerequisites;
pub mod subnet;
pub mod timing;
pub mod volume_fs;
pub mod work_disk;

pub use lifecycle::{LaunchReport, MachineDriver, Run, RunFound, Workload};
