//! End-to-end tests of a machine's life on one agent: operations, crashes, leases, the market, supervision, the CLI's waits, the shim, disks.
//! One test binary per area (issue 35: fewer, larger test binaries build and link
//! faster); each module is the test file of its name beside this one, and
//! `suites.rs` checks that every test file is in exactly one binary.

mod common;

mod agent_crash;
mod agent_leases;
mod agent_lifecycle;
mod agent_market;
mod agent_metrics;
mod agent_supervision;
mod cli_machine_run;
mod disk_full;
mod host_files;
mod image_disk;
mod launch_timing;
mod machine_disk;
mod shim_run;
mod suites;
