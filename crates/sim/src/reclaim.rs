//! `bazaar sim --reclaim`: oversubscription with reclamation (issue 34, docs/SIMULATION.md).
//! Hosts full of service machines whose CPU use follows a daily curve (with noise and
//! bursts) run `batch` work from an endless queue, under three policies:
//!
//! - `no-reclaim`: batch fits in capacity minus the services' *requests* (today's ledger);
//! - `reclaim+preempt`: batch fits in capacity minus the services' *reservations*, which
//!   decay towards use plus a margin ([`bazaar_placement::reclaim::Reclaim`]); when a
//!   service's use comes back, the newest batch machines are stopped
//!   ([`bazaar_placement::reclaim::to_stop`]) and their work is lost;
//! - `reclaim-only`: as above but nothing is stopped: batch keeps its share and services
//!   are short when they come back (what reclamation without preemption would cost).
//!
//! A step is one observation (5 s of the rule) standing for 5 minutes of the day, so two
//! simulated days take 576 steps; the rule's parameters are scaled to it (decay 30 % per
//! step, one step of grace). Measured: CPU utilization (use over capacity), batch throughput
//! (finished batch CPU-hours per host-day), the share of batch work done in reclaimed
//! capacity, service shortfall (host-steps where services got less than their use: Borg's
//! "SLO violation" proxy) and preemptions per host-day. Deterministic for a seed.

use bazaar_placement::reclaim::{batch_room, to_stop, Reclaim};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::fmt::Write;

/// Steps per simulated day (5 minutes each).
const STEPS_PER_DAY: u32 = 288;
/// Host capacity, millicpus.
const CAPACITY: u64 = 16_000;
/// Service requests fill this share of a host.
const SERVICE_FILL: f64 = 0.85;
/// A batch job: its size (millicpus) and its length (steps: 6 hours).
const BATCH_SIZE: u64 = 1_000;
const BATCH_STEPS: u32 = 72;

/// One run's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub policy: &'static str,
    /// Mean CPU in use over capacity.
    pub utilization: f64,
    /// Batch CPU-hours finished per host per day.
    pub batch_cpu_hours: f64,
    /// The share of finished batch work that ran beyond capacity minus requests.
    pub reclaimed_share: f64,
    /// The share of all CPU work (services and batch) that ran on reclaimed capacity: the
    /// figure Borg reports (about 20 % in a median cell).
    pub workload_reclaimed: f64,
    /// Host-steps in which services got less CPU than they used, over all host-steps.
    pub shortfall: f64,
    /// The share of the services' CPU demand they did not get (batch held it).
    pub unmet: f64,
    /// Batch machines stopped per host per day.
    pub preemptions: f64,
}

#[derive(Debug, Clone, Copy)]
struct Service {
    request: u64,
    reservation: u64,
    phase: f64,
    peak: f64,
}

#[derive(Debug, Clone, Copy)]
struct Job {
    left: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Policy {
    NoReclaim,
    ReclaimPreempt,
    ReclaimOnly,
}

impl Policy {
    fn name(self) -> &'static str {
        match self {
            Policy::NoReclaim => "no-reclaim",
            Policy::ReclaimPreempt => "reclaim+preempt",
            Policy::ReclaimOnly => "reclaim-only",
        }
    }
}

/// A service's use at `step`: a daily curve between ~20 % and its peak share of the request,
/// with noise and a rare burst to the whole request.
fn use_at(s: &Service, step: u32, rng: &mut StdRng) -> u64 {
    let day = f64::from(step % STEPS_PER_DAY) / f64::from(STEPS_PER_DAY);
    let curve = 0.5 - 0.5 * (2.0 * std::f64::consts::PI * (day + s.phase)).cos();
    let mut share = 0.2 + (s.peak - 0.2) * curve + rng.random_range(-0.05..0.05);
    if rng.random::<f64>() < 0.002 {
        share = 1.0;
    }
    (s.request as f64 * share.clamp(0.05, 1.0)) as u64
}

fn run(policy: Policy, hosts: usize, days: u32, seed: u64) -> Outcome {
    let rule = Reclaim {
        margin_pct: 20,
        decay_pct: 30,
        grace_observations: 1,
        // The simulator's experiment stops batch work when services need it back.
        throttle_floor_pct: 100,
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let steps = days * STEPS_PER_DAY;
    let (mut used_total, mut batch_done, mut reclaimed_done) = (0u64, 0u64, 0u64);
    let (mut short_steps, mut preempted) = (0u64, 0u64);
    let (mut demand, mut unmet) = (0u64, 0u64);
    for _ in 0..hosts {
        let mut services = Vec::new();
        let mut requested = 0;
        while requested < (CAPACITY as f64 * SERVICE_FILL) as u64 {
            let request = [1_000, 2_000, 4_000][rng.random_range(0..3)];
            let request = request.min((CAPACITY as f64 * SERVICE_FILL) as u64 - requested);
            requested += request;
            services.push(Service {
                request,
                reservation: request,
                // Most services peak in the day of one region; some elsewhere.
                phase: if rng.random::<f64>() < 0.7 {
                    rng.random_range(-0.05..0.05)
                } else {
                    rng.random_range(0.0..1.0)
                },
                peak: rng.random_range(0.45..0.8),
            });
        }
        let mut jobs: Vec<Job> = Vec::new();
        for step in 0..steps {
            let uses: Vec<u64> = services.iter().map(|s| use_at(s, step, &mut rng)).collect();
            let service_use: u64 = uses.iter().sum();
            // This step: services first up to their use, batch takes what it was given at
            // the last observation; a shortfall when both do not fit.
            let batch_use = jobs.len() as u64 * BATCH_SIZE;
            if service_use + batch_use > CAPACITY {
                short_steps += 1;
            }
            demand += service_use;
            unmet += service_use
                .min(CAPACITY)
                .saturating_sub(CAPACITY.saturating_sub(batch_use));
            used_total += (service_use + batch_use).min(CAPACITY);
            // Batch running beyond capacity minus requests runs on reclaimed capacity.
            reclaimed_done += batch_use.saturating_sub(CAPACITY - requested);
            batch_done += batch_use;
            // The observation: reservations follow what was used (after the fact), batch
            // machines are stopped or started for the next step.
            let held: u64 = match policy {
                Policy::NoReclaim => requested,
                _ => {
                    for (s, &u) in services.iter_mut().zip(&uses) {
                        s.reservation = rule.next(s.request, s.reservation, u, step);
                    }
                    services.iter().map(|s| s.reservation).sum()
                }
            };
            if policy == Policy::ReclaimPreempt {
                let sizes = vec![BATCH_SIZE; jobs.len()];
                let stop = to_stop(CAPACITY, held, &sizes);
                jobs.truncate(jobs.len() - stop);
                preempted += stop as u64;
            }
            let running = jobs.len() as u64 * BATCH_SIZE;
            let room = batch_room(CAPACITY, held, running);
            for _ in 0..room / BATCH_SIZE {
                jobs.push(Job { left: BATCH_STEPS });
            }
            for j in &mut jobs {
                j.left -= 1;
            }
            jobs.retain(|j| j.left > 0);
        }
    }
    let host_steps = hosts as f64 * f64::from(steps);
    let host_days = hosts as f64 * f64::from(days);
    // millicpu-steps → CPU-hours: /1000 CPUs, ×5 min per step.
    let cpu_hours = |m: u64| m as f64 / 1000.0 * 5.0 / 60.0;
    Outcome {
        policy: policy.name(),
        utilization: used_total as f64 / (host_steps * CAPACITY as f64),
        batch_cpu_hours: cpu_hours(batch_done) / host_days,
        reclaimed_share: if batch_done == 0 {
            0.0
        } else {
            reclaimed_done as f64 / batch_done as f64
        },
        workload_reclaimed: reclaimed_done as f64 / used_total.max(1) as f64,
        shortfall: short_steps as f64 / host_steps,
        unmet: unmet as f64 / demand.max(1) as f64,
        preemptions: preempted as f64 / host_days,
    }
}

/// The three policies on `hosts` hosts over `days` simulated days.
pub fn compare(hosts: usize, days: u32, seed: u64) -> Vec<Outcome> {
    [
        Policy::NoReclaim,
        Policy::ReclaimPreempt,
        Policy::ReclaimOnly,
    ]
    .into_iter()
    .map(|p| run(p, hosts, days, seed))
    .collect()
}

/// The comparison as a table (Markdown).
pub fn report(hosts: usize, days: u32, seed: u64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "oversubscription: {hosts} hosts of {} CPUs, services requesting {:.0} % of each, {days} days, seed {seed}\n",
        CAPACITY / 1000,
        SERVICE_FILL * 100.0
    );
    let _ = writeln!(
        out,
        "| policy | CPU utilization | batch CPU-h / host-day | batch in reclaimed capacity | all work in reclaimed capacity | host-steps with services short | service demand unmet | preemptions / host-day |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    for o in compare(hosts, days, seed) {
        let _ = writeln!(
            out,
            "| {} | {:.1} % | {:.1} | {:.1} % | {:.1} % | {:.2} % | {:.3} % | {:.1} |",
            o.policy,
            o.utilization * 100.0,
            o.batch_cpu_hours,
            o.reclaimed_share * 100.0,
            o.workload_reclaimed * 100.0,
            o.shortfall * 100.0,
            o.unmet * 100.0,
            o.preemptions
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reclamation_raises_utilization_and_batch_work_and_preemption_protects_services() {
        let r = compare(20, 2, 7);
        let (none, preempt, only) = (&r[0], &r[1], &r[2]);
        // Without reclamation batch runs only in the unrequested 15 %.
        assert!(none.reclaimed_share == 0.0, "{none:?}");
        assert_eq!(none.preemptions, 0.0);
        assert!(none.shortfall < 0.01, "requests cover the use: {none:?}");
        // Reclamation: more batch work, higher utilization, much of it on reclaimed CPUs.
        assert!(
            preempt.batch_cpu_hours > 1.5 * none.batch_cpu_hours,
            "{preempt:?} {none:?}"
        );
        assert!(
            preempt.utilization > none.utilization + 0.1,
            "{preempt:?} {none:?}"
        );
        assert!(preempt.reclaimed_share > 0.3, "{preempt:?}");
        assert!(preempt.preemptions > 0.0, "{preempt:?}");
        // Without preemption services come back to find their CPUs taken.
        assert!(
            only.shortfall > 5.0 * preempt.shortfall.max(0.001),
            "{only:?} {preempt:?}"
        );
    }

    #[test]
    fn the_same_seed_gives_the_same_figures() {
        assert_eq!(compare(3, 1, 9), compare(3, 1, 9));
        assert_ne!(compare(3, 1, 9), compare(3, 1, 10));
    }
}
