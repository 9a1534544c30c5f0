//! End-to-end tests of the Machines API: machines, volumes, tokens, secrets, capacity, quotas, placement policy, preemption, per-host machines, the documents.
//! One test binary per area (issue 35: fewer, larger test binaries build and link
//! faster); each module is the test file of its name beside this one, and
//! `suites.rs` checks that every test file is in exactly one binary.

mod common;
mod volumes_support;

mod api_defects;
mod api_host_faults;
mod api_machine_capacity;
mod api_machine_ops;
mod api_machines;
mod api_openapi;
mod api_scoped_tokens;
mod api_secrets;
mod api_tokens;
mod api_volume_snapshots;
mod api_volumes;
mod docs_reference;
mod per_host;
mod placement_latency;
mod placement_policy;
mod preemption;
mod quotas;
mod reclaim;
