//! Reclaiming what services reserve and do not use (Borg's rule, docs/POLICY.md): each
//! machine's reservation starts at its request; after a start-up grace it decays towards its
//! measured use plus a safety margin, a fraction of the gap per observation, and rises at once
//! (to use plus margin, at most the request) when use grows past it. A host offers `batch`
//! machines its capacity minus the reservations (not minus the requests): that difference is
//! the reclaimed capacity, and batch machines running in it are the first stopped when a
//! service needs its reservation back ([`to_stop`]). Pure: units are the ledger's (millicpus
//! or MiB); the caller measures use and keeps the clock.

/// The parameters of the rule (defaults: Borg's shape, documented in docs/POLICY.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reclaim {
    /// The safety margin over measured use, in percent of the use.
    pub margin_pct: u64,
    /// The share of the gap between reservation and target closed per observation, in
    /// percent (10 with an observation every 5 s: about half the gap in 35 s).
    pub decay_pct: u64,
    /// Observations after a start during which the reservation stays at the request (Borg:
    /// ~300 s of start-up; 60 observations of 5 s).
    pub grace_observations: u32,
    /// How far batch machines' CPU is throttled, in percent of their request, before any is
    /// stopped for CPU when a service needs its reservation back ([`cpu_share`]); 100 stops
    /// them at once. Memory is never throttled: it is taken back by stopping.
    pub throttle_floor_pct: u64,
}

impl Default for Reclaim {
    fn default() -> Reclaim {
        Reclaim {
            margin_pct: 20,
            decay_pct: 10,
            grace_observations: 60,
            throttle_floor_pct: 25,
        }
    }
}

impl Reclaim {
    /// The reservation after one more observation of `used`, for a machine of `request`
    /// whose reservation is `reservation`, observed `age` times since it started.
    pub fn next(&self, request: u64, reservation: u64, used: u64, age: u32) -> u64 {
        if age < self.grace_observations {
            return request;
        }
        let target = used
            .saturating_add(used.saturating_mul(self.margin_pct) / 100)
            .min(request);
        if target >= reservation {
            // Use grew past what was kept: back up at once.
            return target;
        }
        let gap = reservation - target;
        // At least one unit per observation, so a reservation reaches its target.
        let step = (gap.saturating_mul(self.decay_pct) / 100).max(1).min(gap);
        reservation - step
    }
}

/// What a host may offer `batch` machines: its capacity minus every reservation and every
/// batch machine already running (never below zero).
pub fn batch_room(capacity: u64, reservations: u64, batch: u64) -> u64 {
    capacity.saturating_sub(reservations.saturating_add(batch))
}

/// The share of its CPU request, per mille, every batch machine keeps so that services'
/// reservations (`fixed`, with open batch bids) and the batch machines (`batch`, their
/// requests in millicpus) fit `capacity`: 1000 when they fit in full, less when the batch
/// machines must be throttled (each to its request × share / 1000, rounded down, so the
/// sum fits). A share below the rule's floor means some must be stopped first: see
/// [`Reclaim::floor_size`] and [`to_stop`].
pub fn cpu_share(capacity: u64, fixed: u64, batch: &[u64]) -> u64 {
    let total: u64 = batch.iter().sum();
    if total == 0 {
        return 1000;
    }
    let room = u128::from(capacity.saturating_sub(fixed));
    u64::try_from(room * 1000 / u128::from(total))
        .unwrap_or(u64::MAX)
        .min(1000)
}

impl Reclaim {
    /// What a batch machine of `request` millicpus holds throttled as far as the rule
    /// allows (rounded up): the size [`to_stop`] counts for CPU.
    pub fn floor_size(&self, request: u64) -> u64 {
        (u128::from(request) * u128::from(self.throttle_floor_pct.min(100)))
            .div_ceil(100)
            .try_into()
            .unwrap_or(u64::MAX)
    }

    /// Whether `share` (per mille, [`cpu_share`]) is as far as batch machines may be
    /// throttled.
    pub fn share_allowed(&self, share: u64) -> bool {
        share >= self.throttle_floor_pct.min(100) * 10
    }
}

/// Which batch machines to stop, newest first, so that reservations and the batch machines
/// left fit the capacity again: `batch` lists each batch machine's size, oldest first.
/// Answers how many of the newest to stop.
pub fn to_stop(capacity: u64, reservations: u64, batch: &[u64]) -> usize {
    let mut running: u64 = batch.iter().sum();
    let mut stopped = 0;
    for size in batch.iter().rev() {
        if reservations.saturating_add(running) <= capacity {
            break;
        }
        running -= size;
        stopped += 1;
    }
    stopped
}

/// A machine's CPU use between two readings of its cgroup's cumulative CPU time
/// (`usage_usec`), `elapsed_us` apart, in millicpus (1000 = one core busy throughout; a
/// machine's vCPU is a core of `cpu.max`). A counter that went back (the cgroup was made
/// again) or no time elapsed gives `None`.
pub fn cpu_millis(before_usec: u64, after_usec: u64, elapsed_us: u64) -> Option<u64> {
    if after_usec < before_usec || elapsed_us == 0 {
        return None;
    }
    let busy = u128::from(after_usec - before_usec) * 1000 / u128::from(elapsed_us);
    Some(u64::try_from(busy).unwrap_or(u64::MAX))
}

/// What one reading of a machine gives the ledger ([`Meter::read`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// Nothing yet (a first reading, or none could be taken).
    Nothing,
    /// The machine started since the last reading: its reservation is its request again
    /// (`Ledger::restarted`).
    Restarted,
    /// Its use since the last reading (`Ledger::observe`); zero while it is not started.
    Use(crate::ledger::Use),
}

/// Turns readings of machines' cgroups (cumulative CPU time and memory) into what the
/// ledger observes, keeping each machine's last reading.
#[derive(Debug, Default, Clone)]
pub struct Meter {
    /// By machine: whether it was started at its last reading, and that reading's CPU time
    /// and time (microseconds).
    last: std::collections::BTreeMap<String, (bool, Option<(u64, u64)>)>,
}

impl Meter {
    /// Machine `id` at `now_us`: `started` or not, and, when read, its cumulative CPU time
    /// (µs) and memory working set (MiB).
    pub fn read(
        &mut self,
        id: &str,
        started: bool,
        sample: Option<(u64, u64)>,
        now_us: u64,
    ) -> Reading {
        let previous = self.last.get(id).copied();
        if !started {
            self.last.insert(id.to_string(), (false, None));
            return Reading::Use(crate::ledger::Use::default());
        }
        let reading = match (previous, sample) {
            (Some((false, _)), _) => Reading::Restarted,
            (Some((true, Some((cpu0, t0)))), Some((cpu1, memory_mb))) => {
                match cpu_millis(cpu0, cpu1, now_us.saturating_sub(t0)) {
                    Some(millicpus) => Reading::Use(crate::ledger::Use {
                        millicpus,
                        memory_mb,
                    }),
                    None => Reading::Nothing,
                }
            }
            _ => Reading::Nothing,
        };
        self.last
            .insert(id.to_string(), (true, sample.map(|(cpu, _)| (cpu, now_us))));
        reading
    }

    /// Forgets machines no longer there.
    pub fn retain(&mut self, live: impl Fn(&str) -> bool) {
        self.last.retain(|id, _| live(id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::Use;

    #[test]
    fn the_meter_gives_use_between_readings_and_notices_a_start() {
        let mut m = Meter::default();
        assert_eq!(
            m.read("a", true, Some((0, 10)), 0),
            Reading::Nothing,
            "first"
        );
        assert_eq!(
            m.read("a", true, Some((2_500_000, 64)), 5_000_000),
            Reading::Use(Use {
                millicpus: 500,
                memory_mb: 64
            })
        );
        assert_eq!(m.read("a", true, None, 10_000_000), Reading::Nothing);
        assert_eq!(
            m.read("a", false, None, 15_000_000),
            Reading::Use(Use::default())
        );
        assert_eq!(
            m.read("a", true, Some((9, 1)), 20_000_000),
            Reading::Restarted
        );
        assert_eq!(
            m.read("a", true, Some((9 + 5_000_000, 1)), 25_000_000),
            Reading::Use(Use {
                millicpus: 1000,
                memory_mb: 1
            })
        );
        m.retain(|id| id != "a");
        assert_eq!(
            m.read("a", true, Some((0, 1)), 30_000_000),
            Reading::Nothing
        );
    }

    #[test]
    fn cpu_use_is_the_counters_delta_over_the_time_between_readings() {
        assert_eq!(cpu_millis(1_000, 1_000, 5_000_000), Some(0));
        assert_eq!(cpu_millis(0, 2_500_000, 5_000_000), Some(500));
        assert_eq!(
            cpu_millis(0, 10_000_000, 5_000_000),
            Some(2000),
            "two cores"
        );
        assert_eq!(cpu_millis(9, 3, 5_000_000), None, "the counter went back");
        assert_eq!(cpu_millis(0, 3, 0), None);
    }

    const R: Reclaim = Reclaim {
        margin_pct: 20,
        decay_pct: 10,
        grace_observations: 3,
        throttle_floor_pct: 25,
    };

    #[test]
    fn batch_cpu_is_shared_out_evenly_and_floored_before_any_is_stopped() {
        // 4 cores, services hold 1.8: three batch machines of 1 core fit in full.
        assert_eq!(cpu_share(4000, 1800, &[1000, 1000, 1000]), 733);
        assert_eq!(cpu_share(4000, 800, &[1000, 1000, 1000]), 1000);
        assert_eq!(cpu_share(4000, 5000, &[1000]), 0);
        assert_eq!(cpu_share(4000, 5000, &[]), 1000);
        let rule = Reclaim::default();
        assert_eq!(rule.throttle_floor_pct, 25);
        assert!(rule.share_allowed(733) && rule.share_allowed(250) && !rule.share_allowed(249));
        // Throttled to the floor, 3.6 reserved leaves room for one of 1 core at 25 %...
        let floors: Vec<u64> = [1000, 1000].iter().map(|c| rule.floor_size(*c)).collect();
        assert_eq!(floors, [250, 250]);
        assert_eq!(to_stop(4000, 3600, &floors), 1);
        // ...which then keeps 40 %.
        assert_eq!(cpu_share(4000, 3600, &[1000]), 400);
        // A floor of 100 % never throttles: the share must be whole.
        let never = Reclaim {
            throttle_floor_pct: 100,
            ..rule
        };
        assert!(!never.share_allowed(999) && never.share_allowed(1000));
        assert_eq!(never.floor_size(1000), 1000);
    }

    #[test]
    fn the_reservation_starts_at_the_request_and_decays_towards_use_plus_margin() {
        // During the grace, whatever the use.
        for age in 0..3 {
            assert_eq!(R.next(1000, 1000, 100, age), 1000);
        }
        // Then a tenth of the gap per observation, towards 100 + 20 % = 120.
        let mut r = 1000;
        r = R.next(1000, r, 100, 3);
        assert_eq!(r, 1000 - 88);
        for age in 4..200 {
            r = R.next(1000, r, 100, age);
            assert!(r >= 120, "never below use plus margin: {r}");
        }
        assert_eq!(r, 120, "it reaches the target");
    }

    #[test]
    fn use_past_the_reservation_raises_it_at_once_but_never_past_the_request() {
        assert_eq!(R.next(1000, 200, 500, 10), 600);
        assert_eq!(R.next(1000, 200, 900, 10), 1000, "at most the request");
        assert_eq!(
            R.next(1000, 600, 500, 10),
            600,
            "use plus margin is the reservation"
        );
    }

    #[test]
    fn batch_gets_capacity_minus_reservations_and_running_batch() {
        assert_eq!(batch_room(16_000, 6_000, 4_000), 6_000);
        assert_eq!(batch_room(16_000, 14_000, 4_000), 0);
    }

    #[test]
    fn the_newest_batch_machines_stop_first_and_only_as_many_as_needed() {
        // 10,000 reserved, batch of 2,000 + 3,000 + 1,000 on 16,000: fits.
        assert_eq!(to_stop(16_000, 10_000, &[2_000, 3_000, 1_000]), 0);
        // A service takes 2,500 back: the newest (1,000) and the next (3,000) go.
        assert_eq!(to_stop(16_000, 12_500, &[2_000, 3_000, 1_000]), 2);
        assert_eq!(to_stop(16_000, 13_000, &[2_000, 3_000, 1_000]), 2);
        assert_eq!(to_stop(16_000, 14_001, &[2_000, 3_000, 1_000]), 3);
        assert_eq!(to_stop(16_000, 20_000, &[]), 0);
    }
}
