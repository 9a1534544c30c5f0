//! The mesh's nftables table (`ip bazaar_mesh_<8 hex>`): the isolation rules of
//! [`crate::plan::isolation_rules`], replaced atomically when the fleet's machines change.

use crate::plan::isolation_rules;
use std::collections::BTreeMap;
use std::net::Ipv4Addr;

/// Installs (or replaces) `table` so that only packets between machines of one
/// organization are forwarded from `tun`.
pub fn apply(table: &str, tun: &str, members: &BTreeMap<Ipv4Addr, String>) -> std::io::Result<()> {
    crate::run_stdin("nft", &["-f", "-"], &isolation_rules(table, tun, members))
}

/// Removes `table`. Idempotent.
pub fn remove(table: &str) {
    let _ = crate::run_stdin(
        "nft",
        &["-f", "-"],
        &format!("table ip {table}\ndelete table ip {table}\n"),
    );
}
