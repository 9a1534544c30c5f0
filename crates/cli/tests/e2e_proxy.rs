//! End-to-end tests of the edge proxy: exchanges, routing, autostart and autostop, TLS at the edge.
//! One test binary per area (issue 35: fewer, larger test binaries build and link
//! faster); each module is the test file of its name beside this one, and
//! `suites.rs` checks that every test file is in exactly one binary.

mod common;
mod proxy;

mod edge_tls;
mod proxy_exchange;
mod proxy_routing;
mod proxy_scale;
