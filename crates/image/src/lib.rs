//! OCI images for bazaar machines: parse references, pull from registries (OCI distribution
//! v2; anonymous, basic and token auth), keep a content store of blobs and layers unpacked
//! once and shared, build per-machine root filesystems (overlayfs, or a copy), merge the
//! image config with a machine's `init`, import `docker save`/OCI-layout archives, and
//! collect garbage.
//!
//! The agent's driver uses [`ImageStore`]: [`ImageStore::pull`] → [`Image`],
//! [`ImageStore::rootfs`] → the machine's root directory, [`Image::process`] → what to run,
//! [`ImageStore::remove_rootfs`] when the machine goes, [`ImageStore::gc`] now and then.
//!
//! ```no_run
//! # async fn run() -> bazaar_image::Result<()> {
//! use bazaar_image::{Auth, ImageStore, StoreOptions};
//! use std::collections::BTreeMap;
//! use std::path::Path;
//!
//! // A registry on loopback is pulled from only when allowed (`crate::egress`).
//! let options = StoreOptions { allow_loopback_registries: true, ..StoreOptions::default() };
//! let store = ImageStore::open("/var/lib/bazaar/images", options)?;
//! let reference = "127.0.0.1:5000/app:v1".parse()?;
//! let image = store
//!     .pull(&reference, &Auth::Anonymous, &|p| println!("{:?} {}/{}", p.phase, p.done, p.total))
//!     .await?;
//! let machine_dir = Path::new("/var/lib/bazaar/machines/m1");
//! let rootfs = store.rootfs(&image, machine_dir).await?;
//! let process = image.process(None, &BTreeMap::new())?; // args, env, cwd, user
//! # let _ = (rootfs, process);
//! store.remove_rootfs(machine_dir).await?;
//! # Ok(()) }
//! ```

pub mod archive;
pub mod config;
pub mod digest;
pub mod egress;
pub mod error;
pub mod gc;
pub mod idmap;
pub mod manifest;
pub mod peers;
pub mod reference;
pub mod registry;
pub mod repos;
pub mod rootfs;
pub mod store;
pub mod unpack;

pub use config::{ContainerConfig, ImageConfig, Process};
pub use digest::Digest;
pub use error::{Error, Result};
pub use gc::GcReport;
pub use idmap::IdMap;
pub use reference::Reference;
pub use registry::{Auth, Registry};
pub use repos::RepoStore;
pub use rootfs::RootfsKind;
pub use store::{Image, ImageStore, ProgressFn, PullPhase, PullProgress, StoreOptions};
