//! Internal DNS on every host (issue 16): `<app>.internal`, `<region>.<app>.internal`,
//! `top<N>.nearest.of.<app>.internal`, `<machine id>.vm.<app>.internal`,
//! `<group>.process.<app>.internal`, `_apps.internal` and `_instances.internal`, answered
//! from the local catalog; anything else forwarded to the host's resolvers.
//!
//! The pure part is [`zone`] (catalog rows → answers); [`server`] is the hickory-dns shell
//! that the agent runs on the machines' gateway and, for the host, on a loopback address;
//! [`client`] asks one question over UDP (tests, the benchmark).
#![forbid(unsafe_code)]

pub mod client;
pub mod server;
pub mod zone;

/// The DNS message types (hickory's), for clients and tests.
pub use hickory_server::proto;

pub use server::{resolv_conf_nameservers, Dns, TTL};
pub use zone::{Answer, Kind, Viewer, Zone};
