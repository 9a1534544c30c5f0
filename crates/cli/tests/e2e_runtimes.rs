//! End-to-end tests of image machines under runc, gVisor and microVMs, and the isolation probes.
//! One test binary per area (issue 35: fewer, larger test binaries build and link
//! faster); each module is the test file of its name beside this one, and
//! `suites.rs` checks that every test file is in exactly one binary.

mod common;

mod gvisor_machines;
mod isolation_image;
mod isolation_process;
mod microvm_machines;
mod oci_machines;
mod registry_peers;
mod sandbox_support;
