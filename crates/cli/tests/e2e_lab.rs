//! End-to-end tests of `bazaar lab` fleets in network namespaces and the fault suite.
//! One test binary per area (issue 35: fewer, larger test binaries build and link
//! faster); each module is the test file of its name beside this one, and
//! `suites.rs` checks that every test file is in exactly one binary.

mod common;
mod lab_support;

mod fault_regressions;
mod fleet_faults;
mod lab;
mod lab_app_names;
mod lab_quotas;
