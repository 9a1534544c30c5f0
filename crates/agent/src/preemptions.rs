//! The agent's part that holds this host's open preemption bids, by reservation id (in
//! memory only, as reservations are): what `preempt.rs` reserves, claims and releases; and
//! the displaced machines this host is moving to another host (`preempt::hold_for_move`),
//! which no other operation touches meanwhile.

use crate::sync::lock;
use bazaar_placement::preemption::Preemption;
use bazaar_placement::Ledger;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

/// Open preemption bids by reservation id, and the machines being moved.
#[derive(Debug, Default)]
pub struct Preemptions(Mutex<HashMap<String, Preemption>>, Mutex<HashSet<String>>);

impl Preemptions {
    /// Marks machine `id` as being moved to another host.
    pub fn start_move(&self, id: &str) {
        lock(&self.1).insert(id.to_string());
    }

    /// Whether machine `id` is being (or has been) moved to another host.
    pub fn moving(&self, id: &str) -> bool {
        lock(&self.1).contains(id)
    }

    /// Machine `id` is no longer being moved (the move failed, or its copy here is gone).
    pub fn end_move(&self, id: &str) {
        lock(&self.1).remove(id);
    }

    /// Ends the bids that expired at `now_ms` unclaimed (the exchange went away), giving
    /// their parts back to `ledger`; returns the machines the open ones name as victims.
    pub fn expire(&self, ledger: &mut Ledger, now_ms: u64) -> Vec<String> {
        let mut open = lock(&self.0);
        let expired: Vec<String> = open
            .iter()
            .filter(|(_, p)| p.expires_at_ms <= now_ms)
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            if let Some(p) = open.remove(&id) {
                p.release(ledger);
            }
        }
        open.values().flat_map(|p| p.victims.clone()).collect()
    }

    pub fn insert(&self, id: String, p: Preemption) {
        lock(&self.0).insert(id, p);
    }

    /// Whether `id` is an open bid.
    pub fn contains(&self, id: &str) -> bool {
        lock(&self.0).contains_key(id)
    }

    /// Gives bid `id`'s parts back to `ledger`; false if it is none.
    pub fn release(&self, ledger: &mut Ledger, id: &str) -> bool {
        match lock(&self.0).remove(id) {
            Some(p) => {
                p.release(ledger);
                true
            }
            None => false,
        }
    }

    /// Holds bid `id` for its claim (no other bid's clean-up ends it now); its victims.
    pub fn hold(&self, id: &str) -> Option<Vec<String>> {
        lock(&self.0).get_mut(id).map(|p| {
            p.expires_at_ms = u64::MAX;
            p.victims.clone()
        })
    }

    /// Takes bid `id` out, to claim it.
    pub fn take(&self, id: &str) -> Option<Preemption> {
        lock(&self.0).remove(id)
    }
}
