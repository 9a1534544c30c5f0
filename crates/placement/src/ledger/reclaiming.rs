//! The ledger's side of reclamation (issue 34 item 3, docs/POLICY.md "Reclamation"): with
//! it on, each machine is held in one of two pools.
//!
//! - [`Pool::Service`] (every class but `batch`): against capacity by requests, as without
//!   reclamation, so a service always gets its request back. Each also has a
//!   **reservation** ([`Use`], millicpus and MiB) that starts at its request and moves with
//!   its measured use by [`crate::reclaim::Reclaim::next`] ([`Ledger::observe`]).
//! - [`Pool::Batch`]: against the **reclaimed room**, capacity minus every service's
//!   reservation, every batch machine and every open bid ([`Ledger::batch_room`]).
//!
//! Two invariants hold after every call: services' requests + open service bids ≤ capacity
//! (the ledger's own), and services' reservations + batch machines + open batch bids ≤
//! capacity, the batch machines' CPU counted at their throttled share. When a reservation
//! grows (use grows, a service is committed or starts again), the batch machines' CPU is
//! first throttled: each keeps the same share of its request ([`crate::reclaim::cpu_share`],
//! [`Ledger::batch_cpu_limit`], which the host writes to its cgroup), down to the rule's
//! `throttle_floor_pct`; past that, or for memory, open batch bids are dropped and then the
//! newest batch machines evicted in the same call, as few as [`crate::reclaim::to_stop`]
//! says (CPU counted at the floor); the evicted machines are uncommitted at once and listed
//! by [`Ledger::take_evictions`] for the host to stop. As reservations fall again the share
//! rises back ([`Ledger::rebalance_batch_cpu`], once per measurement round). (When the services' reservations alone pass capacity, which only restored machines
//! can do, no batch machine is left.)

use super::{Ledger, LedgerError, Reservation};
use crate::reclaim::{to_stop, Reclaim};
use crate::score::score;
use bazaar_types::host::Resources;
use bazaar_types::priority::Priority;
use std::collections::BTreeMap;

/// Millicpus in one CPU.
const MILLI: u64 = 1000;

/// Which capacity a machine or bid is held against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pool {
    /// Capacity by requests.
    Service,
    /// The reclaimed room (with reclamation off: the same as `Service`).
    Batch,
}

impl Pool {
    /// `batch` machines ride on reclaimed room; every other class is a service.
    pub fn for_priority(priority: Priority) -> Pool {
        match priority {
            Priority::Batch => Pool::Batch,
            _ => Pool::Service,
        }
    }
}

/// An amount of CPU (millicpus) and memory (MiB): a reservation or a measured use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Use {
    pub millicpus: u64,
    pub memory_mb: u64,
}

impl Use {
    /// A request in the ledger's units.
    pub fn of(r: Resources) -> Use {
        Use {
            millicpus: u64::from(r.cpus) * MILLI,
            memory_mb: r.memory_mb,
        }
    }

    fn plus(self, o: Use) -> Use {
        Use {
            millicpus: self.millicpus.saturating_add(o.millicpus),
            memory_mb: self.memory_mb.saturating_add(o.memory_mb),
        }
    }

    fn fits_in(self, o: Use) -> bool {
        self.millicpus <= o.millicpus && self.memory_mb <= o.memory_mb
    }
}

/// A batch machine the ledger dropped so a service's reservation fits: the host stops it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eviction {
    pub machine_id: String,
    /// The service whose reservation grew.
    pub for_machine: String,
    pub resources: Resources,
}

#[derive(Debug, Clone, Copy)]
struct Held {
    reservation: Use,
    /// Observations since the machine was committed or last started.
    age: u32,
}

/// The batch pool and the services' reservations.
#[derive(Debug, Clone)]
pub(super) struct Reclaiming {
    rule: Reclaim,
    /// Batch machines, by id, with the order they were placed in (newest highest).
    batch: BTreeMap<String, u64>,
    next_seq: u64,
    /// Services' reservations, by machine id.
    held: BTreeMap<String, Held>,
    evicted: Vec<Eviction>,
    /// The share of its CPU request every batch machine keeps, per mille (1000: none is
    /// throttled).
    cpu_share: u64,
    /// The service whose reservation's growth throttled the batch machines, while they are.
    throttled_for: Option<String>,
}

impl Ledger {
    /// Turns reclamation on with `rule` (before any machine is committed).
    pub fn with_reclaim(mut self, rule: Reclaim) -> Ledger {
        self.reclaim = Some(Reclaiming {
            rule,
            batch: BTreeMap::new(),
            next_seq: 0,
            held: BTreeMap::new(),
            evicted: Vec::new(),
            cpu_share: 1000,
            throttled_for: None,
        });
        self
    }

    /// Whether reclamation is on.
    pub fn reclaiming(&self) -> bool {
        self.reclaim.is_some()
    }

    /// True if `machine_id` is held in the batch pool.
    pub fn in_batch_pool(&self, machine_id: &str) -> bool {
        self.reclaim
            .as_ref()
            .is_some_and(|r| r.batch.contains_key(machine_id))
    }

    /// A service's reservation (millicpus and MiB), with reclamation on.
    pub fn reservation_of(&self, machine_id: &str) -> Option<Use> {
        Some(self.reclaim.as_ref()?.held.get(machine_id)?.reservation)
    }

    /// Every service's reservation together (zero with reclamation off).
    pub fn service_reservations(&self) -> Use {
        self.reclaim.as_ref().map_or(Use::default(), |r| {
            r.held
                .values()
                .fold(Use::default(), |a, h| a.plus(h.reservation))
        })
    }

    /// Resources of the batch machines together (zero with reclamation off).
    pub fn batch_committed(&self) -> Resources {
        super::sum(
            self.committed
                .iter()
                .filter(|(id, _)| self.in_batch_pool(id))
                .map(|(_, r)| *r),
        )
    }

    /// What a new batch machine may take: capacity minus the services' reservations, the
    /// batch machines and every open bid (`crate::reclaim::batch_room` per resource). Zero
    /// with reclamation off (batch machines are then services).
    pub fn batch_room(&self) -> Use {
        if self.reclaim.is_none() {
            return Use::default();
        }
        let open = super::sum(
            self.reservations
                .values()
                .filter(|r| r.claimed_by.is_none())
                .map(|r| r.resources),
        );
        let taken = self
            .service_reservations()
            .plus(Use::of(open))
            .plus(Use::of(self.batch_committed()));
        let cap = Use::of(self.capacity);
        Use {
            millicpus: crate::reclaim::batch_room(cap.millicpus, taken.millicpus, 0),
            memory_mb: crate::reclaim::batch_room(cap.memory_mb, taken.memory_mb, 0),
        }
    }

    /// [`Ledger::batch_room`] in whole CPUs (rounded down), as hosts advertise it.
    pub fn batch_free(&self) -> Resources {
        let room = self.batch_room();
        Resources {
            cpus: u32::try_from(room.millicpus / MILLI).unwrap_or(u32::MAX),
            memory_mb: room.memory_mb,
        }
    }

    /// Makes a bid in `pool` (see [`Ledger::reserve`]): a batch bid is held against the
    /// reclaimed room and scored by the share of it left.
    pub fn reserve_in(
        &mut self,
        id: &str,
        want: Resources,
        expires_at_ms: u64,
        pool: Pool,
    ) -> Result<(Reservation, f64), LedgerError> {
        if self.effective(pool) == Pool::Service {
            return self.reserve(id, want, expires_at_ms);
        }
        if self.draining {
            return Err(LedgerError::Draining);
        }
        self.check_batch_fits(want)?;
        let s = score(self.policy, self.capacity, self.batch_free(), want);
        let reservation = Reservation {
            id: id.to_string(),
            resources: want,
            expires_at_ms,
            claimed_by: None,
            batch: true,
        };
        self.reservations
            .insert(id.to_string(), reservation.clone());
        Ok((reservation, s))
    }

    /// One more observation of service `machine_id`'s use: its reservation moves by the
    /// rule, and when it grew, batch machines are evicted until the pool fits. A machine of the
    /// batch pool, or unknown, is ignored.
    pub fn observe(&mut self, machine_id: &str, used: Use) {
        let Some(r) = self.reclaim.as_mut() else {
            return;
        };
        let Some(request) = self.committed.get(machine_id).map(|c| Use::of(*c)) else {
            return;
        };
        let Some(h) = r.held.get_mut(machine_id) else {
            return;
        };
        let before = h.reservation;
        h.reservation = Use {
            millicpus: r.rule.next(
                request.millicpus,
                h.reservation.millicpus,
                used.millicpus,
                h.age,
            ),
            memory_mb: r.rule.next(
                request.memory_mb,
                h.reservation.memory_mb,
                used.memory_mb,
                h.age,
            ),
        };
        let rose = h.reservation.millicpus > before.millicpus
            || h.reservation.memory_mb > before.memory_mb;
        h.age = h.age.saturating_add(1);
        if rose {
            self.fit(machine_id);
        }
    }

    /// Gives throttled batch machines back what the services' reservations no longer take:
    /// the share rises to the most that fits. Once per measurement round, after every
    /// [`Ledger::observe`] (the share falls in `observe` itself, when a reservation grows).
    pub fn rebalance_batch_cpu(&mut self) {
        let Some(r) = self.reclaim.as_ref() else {
            return;
        };
        if r.cpu_share >= 1000 {
            return;
        }
        let for_machine = r.throttled_for.clone().unwrap_or_default();
        self.rethrottle(&for_machine);
    }

    /// The share of its CPU request each batch machine keeps now, per mille (1000 when none
    /// is throttled, and with reclamation off).
    pub fn batch_cpu_share(&self) -> u64 {
        self.reclaim.as_ref().map_or(1000, |r| r.cpu_share)
    }

    /// Batch machine `machine_id`'s CPU limit in millicpus while the batch machines are
    /// throttled (its request × [`Ledger::batch_cpu_share`], rounded down); `None` when it
    /// runs at its request or is no batch machine.
    pub fn batch_cpu_limit(&self, machine_id: &str) -> Option<u64> {
        let r = self.reclaim.as_ref()?;
        if r.cpu_share >= 1000 || !r.batch.contains_key(machine_id) {
            return None;
        }
        let request = Use::of(self.committed.get(machine_id).copied()?).millicpus;
        Some(request * r.cpu_share / 1000)
    }

    /// The service whose reservation's growth throttled the batch machines, while they are.
    pub fn throttled_for(&self) -> Option<&str> {
        self.reclaim.as_ref()?.throttled_for.as_deref()
    }

    /// Sets the batch machines' CPU share to the most that fits beside the services'
    /// reservations and open batch bids (`for_machine`: whose reservation moved).
    fn rethrottle(&mut self, for_machine: &str) {
        let Some(r) = self.reclaim.as_ref() else {
            return;
        };
        let requests: Vec<u64> = r
            .batch
            .keys()
            .map(|id| Use::of(self.committed.get(id).copied().unwrap_or_default()).millicpus)
            .collect();
        let fixed = self.service_reservations().millicpus + Use::of(self.open_batch()).millicpus;
        let share = crate::reclaim::cpu_share(Use::of(self.capacity).millicpus, fixed, &requests);
        if let Some(r) = self.reclaim.as_mut() {
            if share >= 1000 {
                r.throttled_for = None;
            } else if r.cpu_share >= 1000 || r.throttled_for.is_none() {
                r.throttled_for = Some(for_machine.to_string());
            }
            r.cpu_share = share;
        }
    }

    /// Open batch bids together.
    fn open_batch(&self) -> Resources {
        super::sum(
            self.reservations
                .values()
                .filter(|r| r.claimed_by.is_none() && r.batch)
                .map(|r| r.resources),
        )
    }

    /// Whether reservations + batch (CPU at its share) + open batch bids fit, with the
    /// share no lower than the rule allows.
    fn pool_fits(&self) -> bool {
        let Some(r) = self.reclaim.as_ref() else {
            return true;
        };
        self.batch_held().fits_in(Use::of(self.capacity)) && r.rule.share_allowed(r.cpu_share)
    }

    /// Service `machine_id` started again: its reservation is its request again, with a new
    /// start-up grace (evicting batch machines as needed).
    pub fn restarted(&mut self, machine_id: &str) {
        let Some(request) = self.committed.get(machine_id).copied() else {
            return;
        };
        if self
            .reclaim
            .as_ref()
            .is_some_and(|r| r.held.contains_key(machine_id))
        {
            self.held_as(machine_id, request, Pool::Service);
        }
    }

    /// The batch machines evicted and not yet taken by [`Ledger::take_evictions`]: they
    /// hold nothing, and their host has yet to stop them.
    pub fn pending_evictions(&self) -> Vec<String> {
        self.reclaim.as_ref().map_or_else(Vec::new, |r| {
            r.evicted.iter().map(|e| e.machine_id.clone()).collect()
        })
    }

    /// The batch machines evicted since the last call, oldest eviction first.
    pub fn take_evictions(&mut self) -> Vec<Eviction> {
        self.reclaim
            .as_mut()
            .map(|r| std::mem::take(&mut r.evicted))
            .unwrap_or_default()
    }

    /// The pool a request in `pool` is held in: with reclamation off, always `Service`.
    pub(super) fn effective(&self, pool: Pool) -> Pool {
        if self.reclaim.is_some() {
            pool
        } else {
            Pool::Service
        }
    }

    /// Checks that `want` fits in the reclaimed room.
    pub(super) fn check_batch_fits(&self, want: Resources) -> Result<(), LedgerError> {
        let room = self.batch_room();
        let want = Use::of(want);
        if want.fits_in(room) {
            Ok(())
        } else {
            Err(LedgerError::InsufficientBatchRoom {
                want: want.millicpus,
                want_mb: want.memory_mb,
                free: room.millicpus,
                free_mb: room.memory_mb,
            })
        }
    }

    /// Drops `machine_id` from the pools; answers which it was in.
    pub(super) fn forget(&mut self, machine_id: &str) -> Pool {
        match self.reclaim.as_mut() {
            Some(r) => {
                r.held.remove(machine_id);
                if r.batch.remove(machine_id).is_some() {
                    Pool::Batch
                } else {
                    Pool::Service
                }
            }
            None => Pool::Service,
        }
    }

    /// Puts a just committed machine in its pool: a batch machine as the newest, a service
    /// with its request as reservation (evicting batch machines as needed).
    pub(super) fn held_as(&mut self, machine_id: &str, request: Resources, pool: Pool) {
        let Some(r) = self.reclaim.as_mut() else {
            return;
        };
        match pool {
            Pool::Batch => {
                r.held.remove(machine_id);
                r.batch.insert(machine_id.to_string(), r.next_seq);
                r.next_seq += 1;
            }
            Pool::Service => {
                r.batch.remove(machine_id);
                r.held.insert(
                    machine_id.to_string(),
                    Held {
                        reservation: Use::of(request),
                        age: 0,
                    },
                );
                self.fit(machine_id);
            }
        }
    }

    /// A machine found on start (`Ledger::restore_in`): nothing is evicted for a restart.
    /// A service's reservation starts at its request with no grace (it was running before);
    /// when the batch machines found with them do not fit beside the requests, the services'
    /// reservations are lowered, each by its share (by request) of the excess: the batch
    /// machines were admitted on room reclaimed from them before the restart. The next
    /// measurements correct the estimate; a reservation that grows evicts as always.
    pub(super) fn held_restored(&mut self, machine_id: &str, request: Resources, pool: Pool) {
        let Some(r) = self.reclaim.as_mut() else {
            return;
        };
        match pool {
            Pool::Batch => {
                r.held.remove(machine_id);
                r.batch.insert(machine_id.to_string(), r.next_seq);
                r.next_seq += 1;
            }
            Pool::Service => {
                r.batch.remove(machine_id);
                let age = r.rule.grace_observations;
                r.held.insert(
                    machine_id.to_string(),
                    Held {
                        reservation: Use::of(request),
                        age,
                    },
                );
            }
        }
        self.shrink_to_fit();
    }

    /// Lowers the services' reservations, each by its share of the excess by request, until
    /// reservations + batch ≤ capacity (after a restart).
    fn shrink_to_fit(&mut self) {
        let cap = Use::of(self.capacity);
        let held = self.batch_held();
        if held.fits_in(cap) {
            return;
        }
        let requests: Vec<(String, Use)> = self
            .reclaim
            .as_ref()
            .map(|r| {
                r.held
                    .keys()
                    .map(|id| {
                        (
                            id.clone(),
                            Use::of(self.committed.get(id).copied().unwrap_or_default()),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let total = requests.iter().fold(Use::default(), |a, (_, u)| a.plus(*u));
        let excess = Use {
            millicpus: held.millicpus.saturating_sub(cap.millicpus),
            memory_mb: held.memory_mb.saturating_sub(cap.memory_mb),
        };
        let share = |excess: u64, request: u64, total: u64| -> u64 {
            // Rounded up, so that the shares cover the excess.
            (u128::from(excess) * u128::from(request))
                .div_ceil(u128::from(total.max(1)))
                .try_into()
                .unwrap_or(u64::MAX)
        };
        let Some(r) = self.reclaim.as_mut() else {
            return;
        };
        for (id, request) in requests {
            if let Some(h) = r.held.get_mut(&id) {
                h.reservation = Use {
                    millicpus: h.reservation.millicpus.saturating_sub(share(
                        excess.millicpus,
                        request.millicpus,
                        total.millicpus,
                    )),
                    memory_mb: h.reservation.memory_mb.saturating_sub(share(
                        excess.memory_mb,
                        request.memory_mb,
                        total.memory_mb,
                    )),
                };
            }
        }
    }

    /// Restores reservations + batch ≤ capacity after `for_machine`'s reservation grew:
    /// drops open batch bids first (newest id first; their claims then fail as if they had
    /// expired), then evicts the newest batch machines, as few as [`to_stop`] says per
    /// resource (the larger count).
    fn fit(&mut self, for_machine: &str) {
        let cap = Use::of(self.capacity);
        let Some(rule) = self.reclaim.as_ref().map(|r| r.rule) else {
            return;
        };
        self.rethrottle(for_machine);
        if self.pool_fits() {
            return;
        }
        let mut open: Vec<String> = self
            .reservations
            .values()
            .filter(|r| r.claimed_by.is_none() && r.batch)
            .map(|r| r.id.clone())
            .collect();
        while !self.pool_fits() {
            let Some(id) = open.pop() else { break };
            self.reservations.remove(&id);
            self.rethrottle(for_machine);
        }
        if self.pool_fits() {
            return;
        }
        let Some(r) = self.reclaim.as_ref() else {
            return;
        };
        let mut by_age: Vec<(u64, String)> =
            r.batch.iter().map(|(id, seq)| (*seq, id.clone())).collect();
        by_age.sort();
        let sizes: Vec<Use> = by_age
            .iter()
            .map(|(_, id)| Use::of(self.committed.get(id).copied().unwrap_or_default()))
            .collect();
        let open_batch = super::sum(
            self.reservations
                .values()
                .filter(|r| r.claimed_by.is_none() && r.batch)
                .map(|r| r.resources),
        );
        let fixed = self.service_reservations().plus(Use::of(open_batch));
        // CPU counted throttled as far as the rule allows: only what that cannot make fit
        // is stopped for CPU.
        let cpu: Vec<u64> = sizes.iter().map(|s| rule.floor_size(s.millicpus)).collect();
        let mem: Vec<u64> = sizes.iter().map(|s| s.memory_mb).collect();
        let n = to_stop(cap.millicpus, fixed.millicpus, &cpu).max(to_stop(
            cap.memory_mb,
            fixed.memory_mb,
            &mem,
        ));
        let victims: Vec<String> = by_age
            .iter()
            .rev()
            .take(n)
            .map(|(_, id)| id.clone())
            .collect();
        for id in victims {
            let resources = self.committed.remove(&id).unwrap_or_default();
            if let Some(r) = self.reclaim.as_mut() {
                r.batch.remove(&id);
                r.evicted.push(Eviction {
                    machine_id: id,
                    for_machine: for_machine.to_string(),
                    resources,
                });
            }
        }
        self.rethrottle(for_machine);
    }

    /// Services' reservations, batch machines and open batch bids together: at most the
    /// capacity whenever any batch machine or bid is held.
    /// Batch machines' CPU is counted at its share ([`Ledger::batch_cpu_limit`]).
    pub fn batch_held(&self) -> Use {
        let batch = self.batch_committed();
        let share = self.batch_cpu_share();
        let batch_cpu: u64 = if share >= 1000 {
            Use::of(batch).millicpus
        } else {
            self.reclaim.as_ref().map_or(0, |r| {
                r.batch
                    .keys()
                    .filter_map(|id| self.committed.get(id))
                    .map(|c| Use::of(*c).millicpus * share / 1000)
                    .sum()
            })
        };
        self.service_reservations()
            .plus(Use {
                millicpus: batch_cpu,
                memory_mb: batch.memory_mb,
            })
            .plus(Use::of(self.open_batch()))
    }
}

#[cfg(test)]
mod tests;
