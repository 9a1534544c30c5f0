//! What the network's threads hold: a lock per address (one thread sets up or removes an
//! address's namespaces at a time) and a lowered priority for work done ahead.

use super::locked;
use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::sync::Mutex;

/// A lock per address, for setting up or removing its namespaces. Exact, not striped: the
/// pool makes the namespace of the address as many ahead as it keeps, and a stripe shared
/// with it would make a launch wait for that namespace instead of taking its own ready one.
#[derive(Debug, Default)]
pub(super) struct AddressLocks {
    /// The addresses held now.
    pub(super) held: Mutex<HashSet<Ipv4Addr>>,
    /// Signalled whenever one is let go.
    released: std::sync::Condvar,
}

impl AddressLocks {
    /// Waits until no other thread holds `ip`, and holds it until the guard is dropped.
    pub(super) fn lock(&self, ip: Ipv4Addr) -> AddressGuard<'_> {
        let mut held = locked(&self.held);
        while held.contains(&ip) {
            held = self.released.wait(held).unwrap_or_else(|e| e.into_inner());
        }
        held.insert(ip);
        AddressGuard { locks: self, ip }
    }
}

/// `ip` held in [`AddressLocks`] until dropped.
pub(super) struct AddressGuard<'a> {
    locks: &'a AddressLocks,
    ip: Ipv4Addr,
}

impl Drop for AddressGuard<'_> {
    fn drop(&mut self) {
        locked(&self.locks.held).remove(&self.ip);
        self.locks.released.notify_all();
    }
}

/// Lowers the calling thread's scheduling priority (nice +10) until dropped: for work done
/// ahead, in a thread of the blocking pool that goes back to other work afterwards.
pub(crate) struct LowPriority {
    tid: libc::id_t,
    before: libc::c_int,
}

impl LowPriority {
    pub(super) const NICENESS: libc::c_int = 10;

    pub(crate) fn this_thread() -> Option<LowPriority> {
        let tid = rustix::thread::gettid().as_raw_nonzero().get() as libc::id_t;
        // SAFETY: getpriority and setpriority take plain integers. -1 is also a valid
        // niceness, so errno tells an error apart; a failure leaves the priority as it was.
        unsafe {
            *libc::__errno_location() = 0;
            let before = libc::getpriority(libc::PRIO_PROCESS, tid);
            if *libc::__errno_location() != 0 {
                return None;
            }
            let lower = (before + Self::NICENESS).min(19);
            (libc::setpriority(libc::PRIO_PROCESS, tid, lower) == 0)
                .then_some(LowPriority { tid, before })
        }
    }
}

impl Drop for LowPriority {
    fn drop(&mut self) {
        // SAFETY: as above. Raising the priority back needs CAP_SYS_NICE, which a root
        // agent (the only one with a machine network) has.
        unsafe { libc::setpriority(libc::PRIO_PROCESS, self.tid, self.before) };
    }
}
