//! End-to-end tests of deploys, the package, the install guide, rolling upgrades and the README's tour.
//! One test binary per area (issue 35: fewer, larger test binaries build and link
//! faster); each module is the test file of its name beside this one, and
//! `suites.rs` checks that every test file is in exactly one binary.

mod common;
mod deploy_support;
mod lab_support;
mod proxy;

mod deploy_build;
mod deploy_rollout;
mod deploy_scale;
mod deploy_standby;
mod deploy_volumes;
mod install_guide;
mod lab_deploy_build;
mod package;
mod rolling_upgrade;
mod tour;
