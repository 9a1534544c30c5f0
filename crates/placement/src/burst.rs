//! Shared CPUs' burst model (issue 34 item 3, docs/POLICY.md "Shared CPU bursts"; Fly's
//! model): a shared vCPU is guaranteed a **baseline** share of a core (Fly's shared-cpu-1x:
//! 1/16, 6.25 %). While a machine uses less than its baseline it earns a **burst balance**
//! (CPU time, capped); while it uses more it spends it; and with the balance empty it is
//! throttled to the baseline until it has earned some again. Pure: the agent measures
//! each shared machine's CPU time on an interval, steps its [`Balance`] and writes the
//! [`CpuLimit`] to the machine's cgroup (`cpu.max`) when it changes.

/// The model's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Burst {
    /// Each shared vCPU's guaranteed share of a core, in percent (Fly: 6.25).
    pub baseline_pct: f64,
    /// The largest balance, in milliseconds of one full core per vCPU.
    pub max_balance_ms: u64,
}

impl Default for Burst {
    fn default() -> Burst {
        Burst {
            baseline_pct: 6.25,
            max_balance_ms: 30_000,
        }
    }
}

/// What a machine may use now, in cores.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CpuLimit {
    /// Its vCPUs in full (a core each).
    Full(f64),
    /// The baseline of its vCPUs: the balance is empty.
    Baseline(f64),
}

impl CpuLimit {
    /// The limit in cores (what `cpu.max` is set to).
    pub fn cores(self) -> f64 {
        match self {
            CpuLimit::Full(c) | CpuLimit::Baseline(c) => c,
        }
    }
}

/// A machine's burst balance, in microseconds of CPU time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Balance {
    pub usec: u64,
}

impl Burst {
    /// The balance a machine of `cpus` vCPUs starts with: full, so it boots at full speed.
    pub fn start(&self, cpus: u32) -> Balance {
        Balance {
            usec: self.max_usec(cpus),
        }
    }

    fn max_usec(&self, cpus: u32) -> u64 {
        self.max_balance_ms
            .saturating_mul(1000)
            .saturating_mul(u64::from(cpus))
    }

    /// The balance after `used_usec` of CPU time over `elapsed_us` by a machine of `cpus`
    /// vCPUs: it earns its baseline over the time and pays what it used (never below zero,
    /// never above the cap); and the limit that follows.
    pub fn step(
        &self,
        balance: Balance,
        cpus: u32,
        used_usec: u64,
        elapsed_us: u64,
    ) -> (Balance, CpuLimit) {
        let baseline = self.baseline_pct / 100.0 * f64::from(cpus);
        let earned = (baseline * elapsed_us as f64) as u64;
        let usec = balance
            .usec
            .saturating_add(earned)
            .saturating_sub(used_usec)
            .min(self.max_usec(cpus));
        let limit = if usec > 0 {
            CpuLimit::Full(f64::from(cpus))
        } else {
            CpuLimit::Baseline(baseline)
        };
        (Balance { usec }, limit)
    }
}

/// Each shared machine's balance, its last reading and the limit its cgroup has, kept by
/// the agent between readings.
#[derive(Debug, Default, Clone)]
pub struct Shares {
    machines: std::collections::BTreeMap<String, Share>,
}

#[derive(Debug, Clone, Copy)]
struct Share {
    balance: Balance,
    /// The last reading: cumulative CPU time and when (µs).
    last: Option<(u64, u64)>,
    /// The limit its cgroup has now.
    applied: f64,
}

impl Shares {
    /// Started machine `id` of `cpus` shared vCPUs has used `cpu_usec` since its cgroup was
    /// made, at `now_us`: steps its balance and answers the limit to write, when it differs
    /// from what its cgroup has. A machine seen for the first time starts with a full
    /// balance; one whose counter went back (a new run, whose cgroup starts unthrottled)
    /// keeps its balance and is read afresh.
    pub fn read(
        &mut self,
        rule: &Burst,
        id: &str,
        cpus: u32,
        cpu_usec: u64,
        now_us: u64,
    ) -> Option<CpuLimit> {
        let full = f64::from(cpus);
        let share = self.machines.entry(id.to_string()).or_insert(Share {
            balance: rule.start(cpus),
            last: None,
            applied: full,
        });
        let last = share.last.replace((cpu_usec, now_us));
        let Some((before, at)) = last.filter(|(before, _)| *before <= cpu_usec) else {
            share.applied = if last.is_some() { full } else { share.applied };
            return None;
        };
        let (balance, limit) = rule.step(
            share.balance,
            cpus,
            cpu_usec - before,
            now_us.saturating_sub(at),
        );
        share.balance = balance;
        if (limit.cores() - share.applied).abs() < f64::EPSILON {
            return None;
        }
        share.applied = limit.cores();
        Some(limit)
    }

    /// Machine `id` is not running: its next run starts unthrottled and is read afresh
    /// (its balance is kept).
    pub fn not_running(&mut self, id: &str, cpus: u32) {
        if let Some(share) = self.machines.get_mut(id) {
            share.last = None;
            share.applied = f64::from(cpus);
        }
    }

    /// The balance of machine `id`, if it is kept.
    pub fn balance(&self, id: &str) -> Option<Balance> {
        Some(self.machines.get(id)?.balance)
    }

    /// Forgets machines no longer there.
    pub fn retain(&mut self, live: impl Fn(&str) -> bool) {
        self.machines.retain(|id, _| live(id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_write_a_limit_only_when_it_changes() {
        let b = Burst {
            baseline_pct: 6.25,
            max_balance_ms: 1_000,
        };
        let mut s = Shares::default();
        assert_eq!(s.read(&b, "m", 1, 0, 0), None, "a first reading");
        // Busy: 1 s of balance gone within 2 s.
        assert_eq!(s.read(&b, "m", 1, SECOND, SECOND), None);
        assert_eq!(
            s.read(&b, "m", 1, 2 * SECOND, 2 * SECOND),
            Some(CpuLimit::Baseline(0.0625))
        );
        assert_eq!(
            s.read(&b, "m", 1, 2 * SECOND + 62_500, 3 * SECOND),
            None,
            "still empty"
        );
        // Idle for a second: it has earned some, full again.
        assert_eq!(
            s.read(&b, "m", 1, 2 * SECOND + 62_500, 4 * SECOND),
            Some(CpuLimit::Full(1.0))
        );
        // A new run: unthrottled, its balance kept.
        s.not_running("m", 1);
        let kept = s.balance("m").unwrap();
        assert_eq!(s.read(&b, "m", 1, 5, 5 * SECOND), None);
        assert_eq!(s.balance("m"), Some(kept));
        s.retain(|_| false);
        assert_eq!(s.balance("m"), None);
    }

    const SECOND: u64 = 1_000_000;

    #[test]
    fn a_busy_machine_spends_its_balance_then_runs_at_its_baseline() {
        let b = Burst {
            baseline_pct: 6.25,
            max_balance_ms: 10_000,
        };
        let mut bal = b.start(1);
        assert_eq!(bal.usec, 10 * SECOND);
        // A full core for 5 s: earns 0.3125 s, spends 5 s.
        let (next, limit) = b.step(bal, 1, 5 * SECOND, 5 * SECOND);
        assert_eq!(next.usec, 10 * SECOND + 312_500 - 5 * SECOND);
        assert_eq!(limit, CpuLimit::Full(1.0));
        bal = next;
        // 6 s of CPU time over the next 5 s empties it: throttled to 1/16 of a core.
        let (next, limit) = b.step(bal, 1, 6 * SECOND, 5 * SECOND);
        assert_eq!(next.usec, 0);
        assert_eq!(limit, CpuLimit::Baseline(0.0625));
        // At its baseline it earns what it spends: it stays throttled.
        let (same, limit) = b.step(next, 1, 312_500, 5 * SECOND);
        assert_eq!(same.usec, 0);
        assert_eq!(limit.cores(), 0.0625);
    }

    #[test]
    fn an_idle_machine_earns_its_balance_back_up_to_the_cap() {
        let b = Burst {
            baseline_pct: 6.25,
            max_balance_ms: 10_000,
        };
        let (bal, limit) = b.step(Balance { usec: 0 }, 2, 0, 8 * SECOND);
        // 2 vCPUs earn 1/8 of a second per second.
        assert_eq!(bal.usec, SECOND);
        assert_eq!(limit, CpuLimit::Full(2.0));
        let (bal, _) = b.step(bal, 2, 0, 1000 * SECOND);
        assert_eq!(bal.usec, 20 * SECOND, "capped at 10 s per vCPU");
    }
}
