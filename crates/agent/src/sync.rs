//! Locking that survives a panicked holder: the agent's parts keep plain `std` mutexes,
//! and a poisoned one is taken over rather than spreading the panic.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking it over if an earlier holder panicked.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
