//! OCI images for bazaar machines: parse references, pull from registries (OCI distribution
//! v2; anonymous, basic and token auth), keep a content store of blobs and layers unpacked
//! once and shared, build per-machine root filesystems (overlayfs, or a copy), merge the
//! image config with a machine's `init`, import `docker save`/OCI-layout archives, and
//! collect garbage.
//!
//! The agent's driver uses [`ImageStore`]: [`ImageStore::pull`] → [`Image`],
//! [`ImageStore::rootfs`] → the machine's root directory, [`Image::process`] → what to run.

pub mod archive;
pub mod config;
pub mod digest;
pub mod error;
pub mod gc;
pub mod manifest;
pub mod reference;
pub mod registry;
pub mod rootfs;
pub mod store;
pub mod unpack;

pub use config::{ContainerConfig, ImageConfig, Process};
pub use digest::Digest;
pub use error::{Error, Result};
pub use gc::GcReport;
pub use reference::Reference;
pub use registry::{Auth, Registry};
pub use rootfs::RootfsKind;
pub use store::{Image, ImageStore, ProgressFn, PullPhase, PullProgress, StoreOptions};
