//! The web dashboard served by every agent at `/ui` on the API port: fleet, apps, an app,
//! a machine (config, events, placement, live log), placement dry runs, and buttons that
//! call the Machines API. Pages are rendered on the server ([`render`], pure: data → HTML)
//! and kept live by a small script that listens to the catalog's change stream over
//! server-sent events ([`shell`]: the axum routes, reading the catalog and calling the
//! Machines API in-process with the signed-in token). [`access`] decides who may act.
//! Assets are embedded in the binary: no CDN.
#![forbid(unsafe_code)]

pub mod access;
pub mod render;
pub mod shell;

pub use shell::router;
