//! Preemption, pure: which lower-priority machines a full host would stop to take a machine
//! ([`choose_victims`]), which of several hosts' preemption bids the exchange takes
//! ([`best_offer`]), and the ledger's side of such a bid ([`Preemption`]), so that
//! committed + reserved ≤ capacity holds while the victims are being stopped.
//!
//! The rule (docs/POLICY.md): only machines of a strictly lower class than the preemptor are
//! candidates, never its own or a higher class. Of the sets of candidates whose resources,
//! added to what is free, cover the request, the cheapest is taken, compared in this order:
//! 1. fewest machines;
//! 2. lowest classes (the sets' classes compared highest first: a set of `batch` machines
//!    beats one that includes a `default` machine);
//! 3. least resources stopped (memory, then CPUs);
//! 4. newest machines (creation times compared newest first: the work that has run least is
//!    lost first);
//! 5. machine ids (so that the choice is deterministic).
//!
//! The search is exact while the sets of the smallest possible size number at most
//! [`EXACT_SETS`]; beyond that (hosts with very many small lower-class machines) it falls
//! back to a greedy choice in the same order per machine, still only of lower classes.

use crate::ledger::{Ledger, LedgerError};
use bazaar_types::host::Resources;
use bazaar_types::priority::Priority;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::cmp::{Ordering, Reverse};

/// How many sets of one size the exact search looks at before it falls back to the greedy
/// choice (measured: a few milliseconds at most; docs/benchmarks/placement.md).
pub const EXACT_SETS: u64 = 20_000;

/// A machine a host holds resources for, as preemption sees it (the wire's
/// `bazaar_types::host::Victim`).
pub use bazaar_types::host::Victim as Candidate;

/// A host's bid that needs machines stopped: the victims the rule chose on that host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PreemptionOffer {
    pub host_id: String,
    pub victims: Vec<Candidate>,
    /// The host's score of the bid once the victims are gone (higher is better).
    pub score: f64,
}

/// The cheapest set of machines to stop so that `want` fits on a host with `free` left, for
/// a machine of class `priority`. `Some(vec![])` when it fits already; `None` when stopping
/// every machine of a lower class would not be enough.
pub fn choose_victims(
    free: Resources,
    want: Resources,
    priority: Priority,
    running: &[Candidate],
) -> Option<Vec<Candidate>> {
    if covers(free, &[], want) {
        return Some(Vec::new());
    }
    let mut eligible: Vec<&Candidate> = running
        .iter()
        .filter(|c| priority.may_preempt(c.priority))
        .collect();
    if !covers(free, &eligible, want) {
        return None;
    }
    eligible.sort_by(|a, b| machine_order(a, b));
    let n = eligible.len();
    for k in lower_bound(free, want, &eligible)..=n {
        if binomial(n, k) > EXACT_SETS {
            return Some(greedy(free, want, &eligible));
        }
        let mut best: Option<Vec<&Candidate>> = None;
        for_each_combination(n, k, &mut |idx| {
            let set: Vec<&Candidate> = idx.iter().map(|&i| eligible[i]).collect();
            if covers(free, &set, want)
                && best
                    .as_ref()
                    .is_none_or(|b| compare_sets(&set, b) == Ordering::Less)
            {
                best = Some(set);
            }
        });
        if let Some(best) = best {
            return Some(best.into_iter().cloned().collect());
        }
    }
    None
}

/// The offer that displaces least, by the same order as the victims within a host (fewest
/// machines, lowest classes, least resources, newest), then the higher score, then the
/// host id.
pub fn best_offer(offers: &[PreemptionOffer]) -> Option<&PreemptionOffer> {
    offers.iter().min_by(|a, b| {
        let (va, vb): (Vec<&Candidate>, Vec<&Candidate>) =
            (a.victims.iter().collect(), b.victims.iter().collect());
        compare_sets(&va, &vb)
            .then_with(|| b.score.total_cmp(&a.score))
            .then_with(|| a.host_id.cmp(&b.host_id))
    })
}

/// The order of the rule between two sets of victims (`Less`: `a` is cheaper).
pub fn compare_sets(a: &[&Candidate], b: &[&Candidate]) -> Ordering {
    let classes = |s: &[&Candidate]| {
        let mut v: Vec<Reverse<Priority>> = s.iter().map(|c| Reverse(c.priority)).collect();
        v.sort();
        v.into_iter().map(|Reverse(p)| p).collect::<Vec<_>>()
    };
    let total = |s: &[&Candidate]| {
        s.iter().fold((0u64, 0u64), |(m, c), x| {
            (m + x.resources.memory_mb, c + u64::from(x.resources.cpus))
        })
    };
    let newest = |s: &[&Candidate]| {
        let mut v: Vec<Reverse<u64>> = s.iter().map(|c| Reverse(c.created_at_ms)).collect();
        v.sort();
        v
    };
    let ids = |s: &[&Candidate]| {
        let mut v: Vec<String> = s.iter().map(|c| c.machine_id.clone()).collect();
        v.sort();
        v
    };
    a.len()
        .cmp(&b.len())
        .then_with(|| classes(a).cmp(&classes(b)))
        .then_with(|| total(a).cmp(&total(b)))
        .then_with(|| newest(a).cmp(&newest(b)))
        .then_with(|| ids(a).cmp(&ids(b)))
}

/// The greedy choice's order of single machines: lowest class, largest (fewer needed),
/// newest, id.
fn machine_order(a: &Candidate, b: &Candidate) -> Ordering {
    a.priority
        .cmp(&b.priority)
        .then_with(|| b.resources.memory_mb.cmp(&a.resources.memory_mb))
        .then_with(|| b.resources.cpus.cmp(&a.resources.cpus))
        .then_with(|| b.created_at_ms.cmp(&a.created_at_ms))
        .then_with(|| a.machine_id.cmp(&b.machine_id))
}

fn greedy(free: Resources, want: Resources, eligible: &[&Candidate]) -> Vec<Candidate> {
    let mut chosen: Vec<&Candidate> = Vec::new();
    for c in eligible {
        if covers(free, &chosen, want) {
            break;
        }
        let (short_mem, short_cpu) = shortfall(free, &chosen, want);
        // Skip a machine that frees nothing that is still missing.
        if (short_mem > 0 && c.resources.memory_mb > 0) || (short_cpu > 0 && c.resources.cpus > 0) {
            chosen.push(c);
        }
    }
    chosen.into_iter().cloned().collect()
}

fn shortfall(free: Resources, set: &[&Candidate], want: Resources) -> (u64, u64) {
    let (m, c) = set
        .iter()
        .fold((free.memory_mb, u64::from(free.cpus)), |(m, c), x| {
            (m + x.resources.memory_mb, c + u64::from(x.resources.cpus))
        });
    (
        want.memory_mb.saturating_sub(m),
        u64::from(want.cpus).saturating_sub(c),
    )
}

fn covers(free: Resources, set: &[&Candidate], want: Resources) -> bool {
    shortfall(free, set, want) == (0, 0)
}

/// No set smaller than this can cover `want`: the largest machines first, per resource.
fn lower_bound(free: Resources, want: Resources, eligible: &[&Candidate]) -> usize {
    let need = |free: u64, want: u64, mut sizes: Vec<u64>| {
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        let mut have = free;
        let mut k = 0;
        for s in sizes {
            if have >= want {
                break;
            }
            have += s;
            k += 1;
        }
        k
    };
    let mem = need(
        free.memory_mb,
        want.memory_mb,
        eligible.iter().map(|c| c.resources.memory_mb).collect(),
    );
    let cpu = need(
        u64::from(free.cpus),
        u64::from(want.cpus),
        eligible
            .iter()
            .map(|c| u64::from(c.resources.cpus))
            .collect(),
    );
    mem.max(cpu).max(1)
}

fn binomial(n: usize, k: usize) -> u64 {
    let k = k.min(n - k);
    let mut r: u64 = 1;
    for i in 0..k {
        r = r.saturating_mul((n - i) as u64) / (i as u64 + 1);
        if r > EXACT_SETS {
            return r;
        }
    }
    r
}

fn for_each_combination(n: usize, k: usize, f: &mut impl FnMut(&[usize])) {
    let mut idx: Vec<usize> = (0..k).collect();
    loop {
        f(&idx);
        let mut i = k;
        loop {
            if i == 0 {
                return;
            }
            i -= 1;
            if idx[i] != i + n - k {
                break;
            }
            if i == 0 {
                return;
            }
        }
        idx[i] += 1;
        for j in i + 1..k {
            idx[j] = idx[j - 1] + 1;
        }
    }
}

/// The ledger's side of a preemption bid. At the bid it reserves what is free now (up to the
/// request); each victim's resources move into the bid's reservations as that victim stops,
/// in the same call that uncommits it, so no other exchange can take them and committed +
/// reserved ≤ capacity holds throughout. The claim, once every victim has stopped, turns the
/// parts into the machine's commitment in one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preemption {
    pub id: String,
    pub want: Resources,
    pub victims: Vec<String>,
    pub expires_at_ms: u64,
    /// Victims not yet stopped.
    pending: Vec<String>,
    /// The ids of the reservations held, and what they hold together.
    parts: Vec<String>,
    held: Resources,
}

impl Preemption {
    /// Reserves what is free now towards `want` for a bid that stops `victims`.
    pub fn reserve(
        ledger: &mut Ledger,
        id: &str,
        want: Resources,
        victims: Vec<String>,
        expires_at_ms: u64,
    ) -> Result<Preemption, LedgerError> {
        let mut p = Preemption {
            id: id.to_string(),
            want,
            pending: victims.clone(),
            victims,
            expires_at_ms,
            parts: Vec::new(),
            held: Resources::default(),
        };
        p.take(ledger, ledger.free())?;
        Ok(p)
    }

    /// The victims not yet stopped.
    pub fn pending(&self) -> &[String] {
        &self.pending
    }

    /// What the bid's reservations hold now.
    pub fn held(&self) -> Resources {
        self.held
    }

    /// A victim has stopped: its commitment is dropped and what it held, up to what the bid
    /// still lacks, is reserved for the bid in the same call. Unknown victims are ignored.
    pub fn victim_stopped(&mut self, ledger: &mut Ledger, victim: &str) -> Result<(), LedgerError> {
        let Some(pos) = self.pending.iter().position(|v| v == victim) else {
            return Ok(());
        };
        self.pending.remove(pos);
        if ledger.uncommit(victim).is_some() {
            self.take(ledger, ledger.free())?;
        }
        Ok(())
    }

    /// The machine is made: the parts are returned and `want` committed to `machine_id` in
    /// one call. Refused (and nothing changes) while victims are pending or the parts fall
    /// short of the request.
    pub fn claim(&self, ledger: &mut Ledger, machine_id: &str) -> Result<Resources, LedgerError> {
        if let Some(v) = self.pending.first() {
            return Err(LedgerError::UnknownReservation(format!(
                "{} (machine {v} is still being stopped)",
                self.id
            )));
        }
        if self.held != self.want {
            ledger.check_fits(sub(self.want, self.held))?;
        }
        for part in &self.parts {
            ledger.release(part);
        }
        ledger.commit(machine_id, self.want)?;
        Ok(self.want)
    }

    /// Gives back whatever the bid holds (lost the exchange, or expired). Victims already
    /// stopped stay stopped: their restart policy or the guardian decides.
    pub fn release(self, ledger: &mut Ledger) {
        for part in &self.parts {
            ledger.release(part);
        }
    }

    fn take(&mut self, ledger: &mut Ledger, free: Resources) -> Result<(), LedgerError> {
        let lacking = sub(self.want, self.held);
        let part = Resources {
            cpus: lacking.cpus.min(free.cpus),
            memory_mb: lacking.memory_mb.min(free.memory_mb),
        };
        if part == Resources::default() {
            return Ok(());
        }
        let id = format!("{}.{}", self.id, self.parts.len());
        ledger.reserve(&id, part, self.expires_at_ms)?;
        self.parts.push(id);
        self.held = Resources {
            cpus: self.held.cpus + part.cpus,
            memory_mb: self.held.memory_mb + part.memory_mb,
        };
        Ok(())
    }
}

fn sub(a: Resources, b: Resources) -> Resources {
    Resources {
        cpus: a.cpus.saturating_sub(b.cpus),
        memory_mb: a.memory_mb.saturating_sub(b.memory_mb),
    }
}

#[cfg(test)]
mod tests;
