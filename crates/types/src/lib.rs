//! Shared types of bazaar: what travels between the CLI, the API, the agents and the
//! simulator, and the rules every component must agree on.
//!
//! - [`ids`]: machine, host, instance and reservation identifiers (Fly's formats).
//! - [`config`]: `MachineConfig` as the Fly Machines API spells it, quirks included.
//! - [`duration`]: durations written as Go strings (`"10s"`) or integers (nanoseconds).
//! - [`guest`]: guest sizes, Fly's presets and their validation.
//! - [`state`]: machine states and the one place where transitions are validated.
//! - [`event`]: machine events (`launch`, `start`, `exit`, ...).
//! - [`machine`]: the machine object returned to clients.
//! - [`api`]: the other Machines API bodies (apps, create requests, leases, secrets, ...).
//! - [`create_request`]: the create request as the API reads it (`config` optional).
//! - [`host`]: the host-to-host interface (bids, reservations, claims, host info).
//! - [`error`]: the Fly error body `{"error": ..., "status": ...}`.
//! - [`json`]: request bodies read once, each key at most once.
//! - [`limits`]: how large metadata, env, files and a whole config may be.
//! - [`signal`]: signals by name or number.
//! - [`region`]: what an operator says of a region (name, coordinates, gateway).
//! - [`volume`]: volumes (the API objects, host-interface requests, mounts, validation).
//! - [`placement_policy`]: a machine's constraints, affinities and spread on host labels,
//!   and the rule of the labels an operator gives a host.
//! - [`seccomp`]: the system calls a workload may make (both drivers' allowlist).
//!
//! This crate does no I/O.
#![forbid(unsafe_code)]

pub mod api;
pub mod config;
pub mod config_fields;
pub mod create_request;
pub mod duration;
pub mod error;
pub mod event;
pub mod failure;
pub mod guest;
pub mod host;
pub mod ids;
pub mod json;
pub mod limits;
pub mod machine;
pub mod per_host;
pub mod placement_policy;
pub mod priority;
pub mod quota;
pub mod region;
pub mod replacement;
pub mod seccomp;
pub mod signal;
pub mod state;
pub mod volume;

/// Milliseconds since the Unix epoch, the timestamp unit of events and records.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Formats a unix-ms timestamp as RFC 3339 (UTC, second precision), as the Fly API does.
pub fn rfc3339(ms: u64) -> String {
    let secs = (ms / 1000) as i64;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (h, m, s) = (rem / 3600, (rem % 3600) / 60, rem % 60);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if mo <= 2 { y + 1 } else { y };
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{m:02}:{s:02}Z")
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339(1_700_000_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(super::rfc3339(951_782_400_000), "2000-02-29T00:00:00Z");
    }
}
