//! What a run measures and how the numbers are computed: placement latency percentiles,
//! messages per machine, refusals (and the false `insufficient_capacity` among them),
//! utilization imbalance (max/mean, coefficient of variation, percentiles of host load,
//! hot spots) at snapshots over time, and the time to fill the fleet to 90 %.

/// Load statistics over hosts at one moment (load = the larger of the memory and CPU
/// fractions committed).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LoadStats {
    pub mean: f64,
    /// max / mean (1 is perfectly even).
    pub max_over_mean: f64,
    /// Coefficient of variation: standard deviation / mean.
    pub cv: f64,
    pub p10: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
    /// Share of hosts at or above 90 % load.
    pub hot: f64,
}

/// The `q` quantile (0..=1) of sorted values (nearest rank).
pub fn quantile<T: Copy + Default>(sorted: &[T], q: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Computes [`LoadStats`]; sorts `loads`.
pub fn load_stats(loads: &mut [f64]) -> LoadStats {
    if loads.is_empty() {
        return LoadStats::default();
    }
    loads.sort_by(f64::total_cmp);
    let n = loads.len() as f64;
    let mean = loads.iter().sum::<f64>() / n;
    let var = loads.iter().map(|l| (l - mean) * (l - mean)).sum::<f64>() / n;
    let max = *loads.last().expect("non-empty");
    let ratio = |a: f64| if mean > 0.0 { a / mean } else { 0.0 };
    LoadStats {
        mean,
        max_over_mean: ratio(max),
        cv: ratio(var.sqrt()),
        p10: quantile(loads, 0.10),
        p50: quantile(loads, 0.50),
        p90: quantile(loads, 0.90),
        p99: quantile(loads, 0.99),
        max,
        hot: loads.iter().filter(|&&l| l >= 0.9).count() as f64 / n,
    }
}

/// Load statistics at one moment of virtual time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Snapshot {
    pub t_s: f64,
    pub stats: LoadStats,
}

/// Everything one policy's run measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    pub policy: String,
    pub requests: u64,
    /// Machines requested (placed + failed).
    pub machines: u64,
    pub placed: u64,
    /// Machines answered `insufficient_capacity`.
    pub failed: u64,
    /// Of those, how many the region had room for (by committed resources) at that moment.
    pub false_ice: u64,
    /// Asks + claims + releases (market), commits (direct), bindings (central).
    pub messages: u64,
    /// Bids refused by hosts, asks unanswered, claims that failed, commits refused.
    pub refusals: u64,
    pub no_answers: u64,
    pub claim_failures: u64,
    /// Reservations that expired unclaimed (should be 0 when nothing fails).
    pub expired_reservations: u64,
    /// Machines lost with a failed host.
    pub lost: u64,
    /// Placement latency (arrival to last machine acknowledged), in µs, sorted.
    pub latencies_us: Vec<u64>,
    /// Virtual seconds until the fleet first held 90 % of its memory, and the machines
    /// placed by then.
    pub fill90: Option<(f64, u64)>,
    /// Host loads at the end of arrivals, sorted.
    pub final_loads: Vec<f64>,
    pub final_stats: LoadStats,
    pub series: Vec<Snapshot>,
    /// Mean of the coefficient of variation over the second half of the snapshots.
    pub steady_cv: f64,
    pub steady_max_over_mean: f64,
    /// Ledger invariant violations seen (checked only when asked).
    pub invariant_violations: u64,
    /// Virtual seconds simulated.
    pub virtual_s: f64,
    /// Events processed.
    pub events: u64,
}

impl Summary {
    /// Messages per machine requested.
    pub fn messages_per_machine(&self) -> f64 {
        self.messages as f64 / self.machines.max(1) as f64
    }

    /// Latency quantile in milliseconds.
    pub fn latency_ms(&self, q: f64) -> f64 {
        quantile(&self.latencies_us, q) as f64 / 1000.0
    }

    /// Mean latency in milliseconds.
    pub fn mean_latency_ms(&self) -> f64 {
        if self.latencies_us.is_empty() {
            return 0.0;
        }
        self.latencies_us.iter().sum::<u64>() as f64 / self.latencies_us.len() as f64 / 1000.0
    }

    /// Fills in the steady-state figures from the series.
    pub fn finish_series(&mut self) {
        let half = &self.series[self.series.len() / 2..];
        if !half.is_empty() {
            let n = half.len() as f64;
            self.steady_cv = half.iter().map(|s| s.stats.cv).sum::<f64>() / n;
            self.steady_max_over_mean = half.iter().map(|s| s.stats.max_over_mean).sum::<f64>() / n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_of_a_known_distribution() {
        let mut loads = vec![0.5, 0.5, 0.5, 1.0];
        let s = load_stats(&mut loads);
        assert!((s.mean - 0.625).abs() < 1e-12);
        assert!((s.max_over_mean - 1.6).abs() < 1e-12);
        assert!((s.hot - 0.25).abs() < 1e-12);
        assert_eq!(s.p50, 0.5);
        assert_eq!(s.max, 1.0);
        assert!((s.cv - (0.046875f64).sqrt() / 0.625).abs() < 1e-12);
        assert_eq!(quantile(&[1, 2, 3, 4], 0.5), 2);
        assert_eq!(quantile(&[1, 2, 3, 4], 0.99), 4);
        assert_eq!(quantile::<u64>(&[], 0.5), 0);
    }
}
