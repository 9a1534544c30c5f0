//! Which of this host's machines have a full disk (issue 31 item 5): every
//! [`INTERVAL`] the housekeeping loop (`boot.rs`) asks the driver whether each started
//! machine's writable space has room left (`MachineDriver::disk_full`, a `statvfs` of its
//! mounted disk) and records a `disk_full` event, with a log line, when a machine's disk
//! has just become full, while it runs: one event per crossing and run (a disk that has
//! room again, or a machine started again, may be reported again). A run that ends on a
//! full disk not yet reported gets the event with its exit (the actor). This part only
//! remembers what was reported.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often the started machines' disks are looked at.
pub const INTERVAL: Duration = Duration::from_secs(2);

/// The machines whose full disk was reported, and when the disks were last looked at.
#[derive(Debug, Default)]
pub struct FullDisks {
    full: Mutex<HashSet<String>>,
    checked: Mutex<Option<Instant>>,
}

impl FullDisks {
    /// Whether a look is due at `now` (then it counts as made).
    pub fn due(&self, now: Instant) -> bool {
        let mut checked = crate::sync::lock(&self.checked);
        if checked.is_some_and(|t| now.duration_since(t) < INTERVAL) {
            return false;
        }
        *checked = Some(now);
        true
    }

    /// Records whether machine `id`'s disk was found full; true when it has just become
    /// full (to be reported).
    pub fn saw(&self, id: &str, full: bool) -> bool {
        let mut set = crate::sync::lock(&self.full);
        if full {
            set.insert(id.to_owned())
        } else {
            set.remove(id);
            false
        }
    }

    /// Forgets the machines `keep` refuses (gone, or not running).
    pub fn retain(&self, mut keep: impl FnMut(&str) -> bool) {
        crate::sync::lock(&self.full).retain(|id| keep(id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_reported_once_per_crossing() {
        let disks = FullDisks::default();
        assert!(!disks.saw("m1", false));
        assert!(disks.saw("m1", true), "became full");
        assert!(!disks.saw("m1", true), "still full: reported already");
        assert!(disks.saw("m2", true), "another machine");
        assert!(!disks.saw("m1", false));
        assert!(disks.saw("m1", true), "full again after it had room");
        disks.retain(|id| id != "m2");
        assert!(disks.saw("m2", true), "forgotten once gone");
    }

    #[test]
    fn disks_are_looked_at_every_interval() {
        let disks = FullDisks::default();
        let t0 = Instant::now();
        assert!(disks.due(t0));
        assert!(!disks.due(t0 + INTERVAL / 2));
        assert!(disks.due(t0 + INTERVAL));
        assert!(!disks.due(t0 + INTERVAL));
    }
}
