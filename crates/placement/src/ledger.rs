//! A host's ledger: what it has, what it has promised (reservations) and what it has given
//! (committed to machines). Every change goes through here, so the invariant
//! `committed + reserved <= capacity` holds whatever the number of concurrent exchanges.
//! The agent persists the ledger's reservations and rebuilds committed resources from its
//! machines on start; the simulator drives it directly.
//!
//! With reclamation on ([`Ledger::with_reclaim`], `ledger/reclaiming.rs`) a second pool rides on
//! what services reserve and do not use: `batch` machines are held against capacity minus
//! each service's decaying reservation, and a second invariant holds as well
//! (reservations + batch ≤ capacity): see `ledger/reclaiming.rs`.

mod reclaiming;
pub use reclaiming::{Eviction, Pool, Use};

use crate::score::{score, ScorePolicy};
use bazaar_types::host::Resources;
use std::collections::BTreeMap;

/// Resources held for an exchange until `expires_at_ms`, unless claimed or released.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Reservation {
    pub id: String,
    pub resources: Resources,
    pub expires_at_ms: u64,
    /// Set once claimed: the machine it became (kept so a repeated claim is idempotent).
    pub claimed_by: Option<String>,
    /// Held against the reclaimed room ([`Pool::Batch`]) rather than capacity by requests.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub batch: bool,
}

/// Why the ledger refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    #[error("insufficient memory: {want} MB requested, {free} MB free")]
    InsufficientMemory { want: u64, free: u64 },
    #[error("insufficient cpus: {want} requested, {free} free")]
    InsufficientCpus { want: u32, free: u32 },
    #[error("reservation {0} not found (expired or released)")]
    UnknownReservation(String),
    #[error("reservation {id} was already claimed by machine {machine}")]
    AlreadyClaimed { id: String, machine: String },
    #[error("host is draining")]
    Draining,
    #[error("insufficient reclaimed room for batch machines: {want} millicpus / {want_mb} MB requested, {free} millicpus / {free_mb} MB free")]
    InsufficientBatchRoom {
        want: u64,
        want_mb: u64,
        free: u64,
        free_mb: u64,
    },
}

/// A host's capacity accounting.
#[derive(Debug, Clone)]
pub struct Ledger {
    capacity: Resources,
    /// Resources given to machines, by machine id.
    committed: BTreeMap<String, Resources>,
    /// Open and recently claimed reservations, by id.
    reservations: BTreeMap<String, Reservation>,
    policy: ScorePolicy,
    draining: bool,
    /// The batch pool and the services' reservations, when reclamation is on.
    reclaim: Option<reclaiming::Reclaiming>,
}

impl Ledger {
    /// A ledger for a host of `capacity` (already including any overcommit).
    pub fn new(capacity: Resources) -> Ledger {
        Ledger {
            capacity,
            committed: BTreeMap::new(),
            reservations: BTreeMap::new(),
            policy: ScorePolicy::default(),
            draining: false,
            reclaim: None,
        }
    }

    /// Sets the scoring policy.
    pub fn with_policy(mut self, policy: ScorePolicy) -> Ledger {
        self.policy = policy;
        self
    }

    /// Refuse every new bid (the host is being drained) or accept them again.
    pub fn set_draining(&mut self, draining: bool) {
        self.draining = draining;
    }

    /// Total capacity.
    pub fn capacity(&self) -> Resources {
        self.capacity
    }

    /// Sum of resources committed against capacity by requests (every machine; with
    /// reclamation on, every machine but those of the batch pool).
    pub fn committed(&self) -> Resources {
        sum(self
            .committed
            .iter()
            .filter(|(id, _)| !self.in_batch_pool(id))
            .map(|(_, r)| *r))
    }

    /// Sum of open (unclaimed) reservations held against capacity by requests (not those of
    /// the batch pool).
    pub fn reserved(&self) -> Resources {
        sum(self
            .reservations
            .values()
            .filter(|r| r.claimed_by.is_none() && !r.batch)
            .map(|r| r.resources))
    }

    /// Capacity minus committed minus reserved.
    pub fn free(&self) -> Resources {
        let used = add(self.committed(), self.reserved());
        Resources {
            cpus: self.capacity.cpus.saturating_sub(used.cpus),
            memory_mb: self.capacity.memory_mb.saturating_sub(used.memory_mb),
        }
    }

    /// Number of open reservations.
    pub fn num_open_reservations(&self) -> usize {
        self.reservations
            .values()
            .filter(|r| r.claimed_by.is_none())
            .count()
    }

    /// Looks up a reservation (open or claimed).
    pub fn reservation(&self, id: &str) -> Option<&Reservation> {
        self.reservations.get(id)
    }

    /// Checks that `want` fits in what is free.
    pub fn check_fits(&self, want: Resources) -> Result<(), LedgerError> {
        let free = self.free();
        if want.memory_mb > free.memory_mb {
            return Err(LedgerError::InsufficientMemory {
                want: want.memory_mb,
                free: free.memory_mb,
            });
        }
        if want.cpus > free.cpus {
            return Err(LedgerError::InsufficientCpus {
                want: want.cpus,
                free: free.cpus,
            });
        }
        Ok(())
    }

    /// True if `want` would fit once every open reservation is returned: a refusal now is
    /// then only "busy", and asking again soon may succeed.
    pub fn fits_without_reservations(&self, want: Resources) -> bool {
        let committed = self.committed();
        committed.memory_mb + want.memory_mb <= self.capacity.memory_mb
            && committed.cpus + want.cpus <= self.capacity.cpus
    }

    /// Makes a bid: reserves `want` under `id` until `expires_at_ms` and returns the score.
    pub fn reserve(
        &mut self,
        id: &str,
        want: Resources,
        expires_at_ms: u64,
    ) -> Result<(Reservation, f64), LedgerError> {
        if self.draining {
            return Err(LedgerError::Draining);
        }
        self.check_fits(want)?;
        let score = score(self.policy, self.capacity, self.free(), want);
        let reservation = Reservation {
            id: id.to_string(),
            resources: want,
            expires_at_ms,
            claimed_by: None,
            batch: false,
        };
        self.reservations
            .insert(id.to_string(), reservation.clone());
        Ok((reservation, score))
    }

    /// Turns an open reservation into resources committed to `machine_id`. Claiming again
    /// for the same machine is a no-op; for another machine it is refused.
    pub fn claim(&mut self, id: &str, machine_id: &str) -> Result<Resources, LedgerError> {
        let reservation = self
            .reservations
            .get_mut(id)
            .ok_or_else(|| LedgerError::UnknownReservation(id.to_string()))?;
        match &reservation.claimed_by {
            Some(m) if m == machine_id => return Ok(reservation.resources),
            Some(m) => {
                return Err(LedgerError::AlreadyClaimed {
                    id: id.to_string(),
                    machine: m.clone(),
                })
            }
            None => {}
        }
        reservation.claimed_by = Some(machine_id.to_string());
        let resources = reservation.resources;
        let pool = if reservation.batch {
            Pool::Batch
        } else {
            Pool::Service
        };
        self.committed.insert(machine_id.to_string(), resources);
        self.held_as(machine_id, resources, pool);
        Ok(resources)
    }

    /// Returns an open reservation's resources. Releasing an unknown or claimed one is a
    /// no-op (returns false).
    pub fn release(&mut self, id: &str) -> bool {
        match self.reservations.get(id) {
            Some(r) if r.claimed_by.is_none() => {
                self.reservations.remove(id);
                true
            }
            _ => false,
        }
    }

    /// Drops open reservations that expired at `now_ms`, and forgets claimed ones whose
    /// expiry is more than `keep_claimed_ms` in the past. Returns the ids of the expired
    /// open reservations.
    pub fn expire(&mut self, now_ms: u64, keep_claimed_ms: u64) -> Vec<String> {
        let mut expired = Vec::new();
        self.reservations.retain(|id, r| {
            let keep = match r.claimed_by {
                None => r.expires_at_ms > now_ms,
                Some(_) => r.expires_at_ms.saturating_add(keep_claimed_ms) > now_ms,
            };
            if !keep && r.claimed_by.is_none() {
                expired.push(id.clone());
            }
            keep
        });
        expired
    }

    /// Commits resources to a machine without a reservation (recovery on start, direct
    /// creates, and growing a machine on update). Refused if it does not fit; a machine that
    /// already holds resources is re-sized (its old share is counted as free).
    pub fn commit(&mut self, machine_id: &str, want: Resources) -> Result<(), LedgerError> {
        self.commit_in(machine_id, want, Pool::Service)
    }

    /// As [`Ledger::commit`], in `pool`: a batch machine with reclamation on is held against
    /// the reclaimed room ([`Ledger::batch_room`]) instead.
    pub fn commit_in(
        &mut self,
        machine_id: &str,
        want: Resources,
        pool: Pool,
    ) -> Result<(), LedgerError> {
        let pool = self.effective(pool);
        let previous = self.committed.remove(machine_id);
        let was_batch = self.forget(machine_id);
        let fits = match pool {
            Pool::Service => self.check_fits(want),
            Pool::Batch => self.check_batch_fits(want),
        };
        if let Err(err) = fits {
            if let Some(p) = previous {
                self.committed.insert(machine_id.to_string(), p);
                self.held_as(machine_id, p, was_batch);
            }
            return Err(err);
        }
        self.committed.insert(machine_id.to_string(), want);
        self.held_as(machine_id, want, pool);
        Ok(())
    }

    /// Commits resources for a machine found on start, even beyond capacity (capacity may
    /// have been lowered by config; the machines exist regardless). With reclamation on, the
    /// reclaimed pool may be past capacity too until reservations decay (see
    /// `ledger/reclaiming.rs`).
    pub fn restore(&mut self, machine_id: &str, resources: Resources) {
        self.restore_in(machine_id, resources, Pool::Service);
    }

    /// As [`Ledger::restore`], in `pool`.
    pub fn restore_in(&mut self, machine_id: &str, resources: Resources, pool: Pool) {
        let pool = self.effective(pool);
        self.forget(machine_id);
        self.committed.insert(machine_id.to_string(), resources);
        self.held_restored(machine_id, resources, pool);
    }

    /// Restores a persisted reservation.
    pub fn restore_reservation(&mut self, reservation: Reservation) {
        if let Some(m) = &reservation.claimed_by {
            // The machine holds the resources through `committed`.
            let _ = m;
        }
        self.reservations
            .insert(reservation.id.clone(), reservation);
    }

    /// Frees a machine's resources (destroyed).
    pub fn uncommit(&mut self, machine_id: &str) -> Option<Resources> {
        self.forget(machine_id);
        self.committed.remove(machine_id)
    }

    /// Resources committed to one machine.
    pub fn committed_to(&self, machine_id: &str) -> Option<Resources> {
        self.committed.get(machine_id).copied()
    }

    /// Every machine's committed resources, by machine id.
    pub fn commitments(&self) -> &BTreeMap<String, Resources> {
        &self.committed
    }
}

fn add(a: Resources, b: Resources) -> Resources {
    Resources {
        cpus: a.cpus + b.cpus,
        memory_mb: a.memory_mb + b.memory_mb,
    }
}

fn sum(items: impl Iterator<Item = Resources>) -> Resources {
    items.fold(Resources::default(), add)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn r(cpus: u32, memory_mb: u64) -> Resources {
        Resources { cpus, memory_mb }
    }

    #[test]
    fn reserve_claim_release_expire() {
        let mut l = Ledger::new(r(4, 1024));
        let (_, s) = l.reserve("a", r(1, 512), 100).unwrap();
        assert!(s > 0.0);
        assert_eq!(l.free(), r(3, 512));
        assert!(matches!(
            l.reserve("b", r(1, 1024), 100),
            Err(LedgerError::InsufficientMemory { .. })
        ));
        l.claim("a", "m1").unwrap();
        assert_eq!(
            l.claim("a", "m1").unwrap(),
            r(1, 512),
            "claim is idempotent"
        );
        assert!(matches!(
            l.claim("a", "m2"),
            Err(LedgerError::AlreadyClaimed { .. })
        ));
        assert_eq!(l.committed(), r(1, 512));
        l.reserve("c", r(1, 256), 50).unwrap();
        assert_eq!(l.expire(60, 1000), vec!["c".to_string()]);
        assert!(matches!(
            l.claim("c", "m3"),
            Err(LedgerError::UnknownReservation(_))
        ));
        l.reserve("d", r(1, 256), 500).unwrap();
        assert!(l.release("d"));
        assert!(!l.release("d"));
        assert_eq!(l.free(), r(3, 512));
        l.uncommit("m1");
        assert_eq!(l.free(), r(4, 1024));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Reserve(u8, u32, u64),
        Claim(u8),
        Release(u8),
        Expire(u64),
        Uncommit(u8),
        Commit(u8, u32, u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..16, 0u32..4, 0u64..2048).prop_map(|(i, c, m)| Op::Reserve(i, c, m)),
            (0u8..16).prop_map(Op::Claim),
            (0u8..16).prop_map(Op::Release),
            (0u64..200).prop_map(Op::Expire),
            (0u8..16).prop_map(Op::Uncommit),
            (0u8..16, 0u32..4, 0u64..2048).prop_map(|(i, c, m)| Op::Commit(i, c, m)),
        ]
    }

    proptest! {
        /// Whatever the sequence of operations, committed + reserved never exceeds capacity.
        #[test]
        fn never_over_capacity(ops in proptest::collection::vec(op(), 1..200)) {
            let cap = r(8, 4096);
            let mut l = Ledger::new(cap);
            for (t, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Reserve(i, c, m) => { let _ = l.reserve(&format!("r{i}"), r(c, m), t as u64 + 50); }
                    Op::Claim(i) => { let _ = l.claim(&format!("r{i}"), &format!("m{i}")); }
                    Op::Release(i) => { l.release(&format!("r{i}")); }
                    Op::Expire(now) => { l.expire(now, 10); }
                    Op::Uncommit(i) => { l.uncommit(&format!("m{i}")); }
                    Op::Commit(i, c, m) => { let _ = l.commit(&format!("m{i}"), r(c, m)); }
                }
                let used = add(l.committed(), l.reserved());
                prop_assert!(used.cpus <= cap.cpus && used.memory_mb <= cap.memory_mb, "{used:?}");
            }
        }
    }
}
