//! Bid scores. Higher wins. The default policy spreads: a host bids the fraction of its
//! memory and CPU that would remain free after taking the machine, so the emptiest host wins
//! and no host becomes a hot spot (DESIGN.md "The market", point 6). Bin-packing, the
//! opposite, is the negation.

use bazaar_types::host::Resources;

/// How hosts score bids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ScorePolicy {
    /// Prefer the emptiest host (default).
    #[default]
    Spread,
    /// Prefer the fullest host that still fits.
    BinPack,
}

/// Scores placing `want` on a host with `capacity` of which `free` is free (before placing).
/// Returns a value in [0, 1] for `Spread`, in [-1, 0] for `BinPack`.
pub fn score(policy: ScorePolicy, capacity: Resources, free: Resources, want: Resources) -> f64 {
    let frac = |free: u64, want: u64, cap: u64| {
        if cap == 0 {
            0.0
        } else {
            (free.saturating_sub(want)) as f64 / cap as f64
        }
    };
    let mem = frac(free.memory_mb, want.memory_mb, capacity.memory_mb);
    let cpu = frac(free.cpus as u64, want.cpus as u64, capacity.cpus as u64);
    // Memory is the scarcer resource on most fleets; weight it more.
    let left = 0.7 * mem + 0.3 * cpu;
    match policy {
        ScorePolicy::Spread => left,
        ScorePolicy::BinPack => -left,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(cpus: u32, memory_mb: u64) -> Resources {
        Resources { cpus, memory_mb }
    }

    #[test]
    fn spread_prefers_the_emptier_host() {
        let cap = r(8, 8192);
        let want = r(1, 256);
        let empty = score(ScorePolicy::Spread, cap, cap, want);
        let half = score(ScorePolicy::Spread, cap, r(4, 4096), want);
        assert!(empty > half);
        let pack_empty = score(ScorePolicy::BinPack, cap, cap, want);
        let pack_half = score(ScorePolicy::BinPack, cap, r(4, 4096), want);
        assert!(pack_half > pack_empty);
    }
}
