//! Deploys, the way flyctl does them over the Machines API: policy here, in the client;
//! primitives (create, update, leases, cordon, wait) in the server.
//!
//! - [`config`]: the app config file (`bazaar.toml`, reading fly.toml keys) → one
//!   `MachineConfig` per process group.
//! - [`plan`]: desired vs existing machines → create / update / keep / destroy, per group
//!   and region (pure).
//! - [`api`]: the small Machines API client deploys use.
//! - [`build`]: the app's Dockerfile built with buildah, pushed, deployed by digest.
//! - [`lease`]: short leases, refreshed while a deploy works.
//! - [`health`]: waiting for a machine to be started and its checks passing.
//! - [`execute`]: running a plan with a strategy, draining, automatic rollback.
//! - [`ops`]: deploy, rollback, scale: plan, then (unless a dry run) execute.
//! - [`release`]: release numbers and history, read back from machine config versions.
//! - [`release_command`]: `[deploy] release_command`, run once per release in a temporary
//!   machine.
//! - [`progress`]: what a deploy reports while it works.
//! - [`volumes`]: which volume each machine of a group with `[mounts]` mounts.
#![forbid(unsafe_code)]

pub mod api;
pub mod build;
pub mod config;
pub mod execute;
pub mod health;
pub mod lease;
pub mod ops;
pub mod plan;
pub mod progress;
pub mod release;
pub mod release_command;
pub mod volumes;

/// Metadata key: the release a machine's config belongs to.
pub const META_RELEASE: &str = "fly_release_version";
/// Metadata key: the machine's process group.
pub const META_GROUP: &str = "fly_process_group";
/// Metadata key: the platform version (always `v2`, as on Fly).
pub const META_PLATFORM: &str = "fly_platform_version";
