//! The OCI registry every host serves on its API port under `/v2/` (issue 38): pushes and
//! pulls of an app's images (repositories `<app>` and `<app>/<path>`), with the Machines
//! API's tokens (`Bearer`, or `Basic` with the token as the password, as buildah, podman and
//! docker send it). A token scoped to other apps is answered as if the repository did not
//! exist; reads need `read`, pushes `update`. What is pushed is kept in the host's image
//! store ([`bazaar_image::repos`]), so the host's machines run it without a pull and peers
//! fetch layers from it.
//!
//! - [`protocol`]: the distribution API's rules, pure: routes, error bodies, credentials,
//!   operations, upload chunks.
//! - [`http`]: the axum shell ([`router`]).
//! - [`retention`]: what a host's registry keeps (the images machines run, recent
//!   releases) and lets go of.
//! - [`peers`]: the other hosts this host pulls the cluster's images from
//!   (`registry.bazaar.internal/...`, [`bazaar_image::peers`]).
#![forbid(unsafe_code)]

pub mod http;
pub mod peers;
pub mod protocol;
pub mod retention;

pub use http::{router, RegistryConfig};
