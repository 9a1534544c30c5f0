//! End-to-end tests of a cluster of agents: the catalog, identities and transports, the guardian, hosts drained, backed up and cleaned, DNS, the mesh, `bazaar dev`, the dashboard.
//! One test binary per area (issue 35: fewer, larger test binaries build and link
//! faster); each module is the test file of its name beside this one, and
//! `suites.rs` checks that every test file is in exactly one binary.

mod common;
mod lab_support;
mod proxy;
mod volumes_support;

mod catalog_cluster;
mod catalog_security;
mod cluster_identity;
mod dashboard;
mod dev_cluster;
mod guardian;
mod host_backup;
mod host_cleanup;
mod host_drain;
mod host_prerequisites;
mod hostile_transport;
mod internal_dns;
mod listener_exhaustion;
mod mesh;
mod operator_transport;
