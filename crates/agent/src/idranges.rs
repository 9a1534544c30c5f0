//! Subordinate id ranges of image machines: each machine runs in a user namespace whose ids
//! `0..65536` are host ids `base..base + 65536`, a range of its own. The base is chosen
//! when the machine is accepted, kept in its record (a re-adopted or restarted machine
//! keeps its files' owners) and given back when it is destroyed.
//!
//! Ranges are unique per host, not only per agent: several agents can share a machine
//! (tests, dev clusters), so a range is claimed by a file `/run/bazaar/idranges/<base>`
//! naming its holder (`<host id>/<machine id>`), created exclusively. An agent claims its
//! machines' ranges again at start (after a reboot `/run` is empty).

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Ids per machine.
pub const RANGE_SIZE: u32 = 65536;
/// The first range starts at 16 × 65536 = 1 048 576, above any id a host hands out to its
/// users; ranges are aligned to their size.
const FIRST_RANGE: u32 = 16;
/// Where ranges are claimed.
const CLAIMS_DIR: &str = "/run/bazaar/idranges";

/// The id ranges this agent's machines hold.
#[derive(Debug)]
pub struct IdRanges {
    host_id: String,
    claims: PathBuf,
    held: Mutex<HashSet<u32>>,
}

impl IdRanges {
    pub fn new(host_id: &str) -> IdRanges {
        IdRanges::in_dir(host_id, Path::new(CLAIMS_DIR))
    }

    fn in_dir(host_id: &str, claims: &Path) -> IdRanges {
        IdRanges {
            host_id: host_id.to_string(),
            claims: claims.to_path_buf(),
            held: Mutex::default(),
        }
    }

    fn holder(&self, machine_id: &str) -> String {
        format!("{}/{machine_id}", self.host_id)
    }

    fn claim_path(&self, base: u32) -> PathBuf {
        self.claims.join(base.to_string())
    }

    /// Claims `base` for `machine_id` unless someone else holds it; `Ok(true)` if it is now
    /// (or already was) this machine's.
    fn claim(&self, base: u32, machine_id: &str) -> std::io::Result<bool> {
        let path = self.claim_path(base);
        let holder = self.holder(machine_id);
        match std::fs::File::create_new(&path) {
            Ok(mut f) => {
                f.write_all(holder.as_bytes())?;
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                Ok(std::fs::read_to_string(&path).is_ok_and(|h| h == holder))
            }
            Err(e) => Err(e),
        }
    }

    /// At start: the ranges this agent's machines hold (`(machine id, base)`), claimed
    /// again. A range someone else claimed meanwhile is logged (the machine keeps it).
    pub fn restore<'a>(&self, machines: impl IntoIterator<Item = (&'a str, u32)>) {
        let _ = std::fs::create_dir_all(&self.claims);
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        for (id, base) in machines {
            held.insert(base);
            if !self.claim(base, id).unwrap_or(false) {
                tracing::warn!(machine.id = id, base, "id range claimed by another holder");
            }
        }
    }

    /// A free range for `machine_id`: its base host id.
    pub fn allocate(&self, machine_id: &str) -> Result<u32, String> {
        std::fs::create_dir_all(&self.claims)
            .map_err(|e| format!("creating {}: {e}", self.claims.display()))?;
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        // The last range would end on id u32::MAX, which is no id (-1).
        for range in FIRST_RANGE..u32::MAX / RANGE_SIZE - 1 {
            let base = range * RANGE_SIZE;
            if held.contains(&base) {
                continue;
            }
            match self.claim(base, machine_id) {
                Ok(true) => {
                    held.insert(base);
                    return Ok(base);
                }
                Ok(false) => continue,
                Err(e) => return Err(format!("claiming id range {base}: {e}")),
            }
        }
        Err("no free id range left on this host".into())
    }

    /// Gives back a destroyed machine's range.
    pub fn release(&self, base: u32) {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&base);
        let _ = std::fs::remove_file(self.claim_path(base));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_unique_across_agents_of_one_host() {
        let dir = tempfile::tempdir().unwrap();
        let a = IdRanges::in_dir("host-a", dir.path());
        let b = IdRanges::in_dir("host-b", dir.path());
        let a1 = a.allocate("m1").unwrap();
        assert_eq!(a1, 16 * RANGE_SIZE);
        let b1 = b.allocate("m1").unwrap();
        assert_eq!(b1, a1 + RANGE_SIZE, "another agent's claim is skipped");
        let a2 = a.allocate("m2").unwrap();
        assert_eq!(a2, b1 + RANGE_SIZE);
        a.release(a1);
        assert_eq!(b.allocate("m2").unwrap(), a1, "a released range is free again");
        // After a restart the agent claims its machines' ranges again.
        let a_again = IdRanges::in_dir("host-a", dir.path());
        a_again.restore([("m2", a2)]);
        assert_ne!(a_again.allocate("m3").unwrap(), a2);
    }
}
