//! Subordinate id ranges of image machines: each machine runs in a user namespace whose ids
//! `0..65536` are host ids `base..base + 65536`, a range of its own. A range belongs to a
//! machine address, as its network namespace does ([`crate::network`]): the namespace is
//! owned by the user namespace, so both are made together, ahead, before the machine that
//! gets the address is known. The machine's record keeps the base (its files' owners).
//!
//! Ranges are unique per host, not only per agent: several agents can share a machine
//! (tests, dev clusters), so a range is claimed by a file `/run/bazaar/idranges/<base>`
//! naming its holder (`<host id>/<address>`), created exclusively. At start an agent claims
//! again the ranges its machines hold (after a reboot `/run` is empty).

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Ids per machine.
pub const RANGE_SIZE: u32 = 65536;
/// The first range starts at 16 × 65536 = 1 048 576, above any id a host hands out to its
/// users; ranges are aligned to their size.
const FIRST_RANGE: u32 = 16;
/// Where ranges are claimed.
const CLAIMS_DIR: &str = "/run/bazaar/idranges";

/// The id ranges of this agent's machine addresses.
#[derive(Debug)]
pub struct IdRanges {
    host_id: String,
    claims: PathBuf,
    held: Mutex<HashMap<Ipv4Addr, u32>>,
    /// Claims of this host's addresses found on disk (an earlier run's), read once at the
    /// first claim: a search for a free range then skips every existing claim without
    /// reading it (with other agents on the machine holding hundreds of ranges, trying
    /// each in turn cost a claim tens of milliseconds).
    earlier: Mutex<Option<HashMap<Ipv4Addr, u32>>>,
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
            earlier: Mutex::default(),
        }
    }

    fn holder(&self, ip: Ipv4Addr) -> String {
        format!("{}/{ip}", self.host_id)
    }

    fn claim_path(&self, base: u32) -> PathBuf {
        self.claims.join(base.to_string())
    }

    /// Claims `base` for `ip` unless someone else holds it; `Ok(true)` if it is now (or
    /// already was) this address's.
    fn claim(&self, base: u32, ip: Ipv4Addr) -> std::io::Result<bool> {
        claim_file(&self.claims, &base.to_string(), &self.holder(ip))
    }

    /// At start: the ranges this agent's machines hold (`(address, base)`), claimed again.
    /// A range someone else claimed meanwhile is logged (the machine keeps it).
    pub fn restore(&self, machines: impl IntoIterator<Item = (Ipv4Addr, u32)>) {
        let _ = std::fs::create_dir_all(&self.claims);
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        for (ip, base) in machines {
            held.insert(ip, base);
            if !self.claim(base, ip).unwrap_or(false) {
                tracing::warn!(%ip, base, "id range claimed by another holder");
            }
        }
    }

    /// The range of address `ip` (its base host id), claimed now if it has none yet.
    pub fn range_of(&self, ip: Ipv4Addr) -> Result<u32, String> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(base) = held.get(&ip) {
            return Ok(*base);
        }
        std::fs::create_dir_all(&self.claims)
            .map_err(|e| format!("creating {}: {e}", self.claims.display()))?;
        let existing = self.existing_claims();
        let earlier = {
            let mut earlier = self.earlier.lock().unwrap_or_else(|e| e.into_inner());
            earlier
                .get_or_insert_with(|| self.own_claims(&existing))
                .remove(&ip)
        };
        if let Some(base) = earlier {
            if self.claim(base, ip).unwrap_or(false) {
                held.insert(ip, base);
                return Ok(base);
            }
        }
        // The last range would end on id u32::MAX, which is no id (-1).
        for range in FIRST_RANGE..u32::MAX / RANGE_SIZE - 1 {
            let base = range * RANGE_SIZE;
            if existing.contains(&base) || held.values().any(|b| *b == base) {
                continue;
            }
            match self.claim(base, ip) {
                Ok(true) => {
                    held.insert(ip, base);
                    return Ok(base);
                }
                Ok(false) => continue,
                Err(e) => return Err(format!("claiming id range {base}: {e}")),
            }
        }
        Err("no free id range left on this host".into())
    }

    /// The bases claimed now (by anyone), from one listing of the claims.
    fn existing_claims(&self) -> std::collections::HashSet<u32> {
        std::fs::read_dir(&self.claims)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
            .collect()
    }

    /// The claims among `existing` that name this host as holder, by address.
    fn own_claims(&self, existing: &std::collections::HashSet<u32>) -> HashMap<Ipv4Addr, u32> {
        let prefix = format!("{}/", self.host_id);
        existing
            .iter()
            .filter_map(|base| {
                let holder = std::fs::read_to_string(self.claim_path(*base)).ok()?;
                Some((holder.strip_prefix(&prefix)?.parse().ok()?, *base))
            })
            .collect()
    }

    /// Gives back every range (the machine network is torn down).
    pub fn release_all(&self) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        for (_, base) in held.drain() {
            let _ = std::fs::remove_file(self.claim_path(base));
        }
    }
}

/// Claims the file `dir/name` for `holder` unless someone else holds it; `Ok(true)` if it
/// is now (or already was) `holder`'s. The claim appears whole or not at all (written
/// aside, then linked into place: the link fails if the name is taken), so a process killed
/// midway leaves no claim without a holder, which nobody could ever give back. Machine-wide
/// claims (id ranges here, machine uids in the agent) are made this way.
pub fn claim_file(dir: &Path, name: &str, holder: &str) -> std::io::Result<bool> {
    let path = dir.join(name);
    let aside = dir.join(format!(".{name}.{}", std::process::id()));
    if let Err(e) = std::fs::write(&aside, holder.as_bytes()) {
        // A full disk: no empty claim file left behind.
        let _ = std::fs::remove_file(&aside);
        return Err(e);
    }
    let linked = std::fs::hard_link(&aside, &path);
    let _ = std::fs::remove_file(&aside);
    match linked {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            Ok(std::fs::read_to_string(&path).is_ok_and(|h| h == holder))
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_unique_across_agents_of_one_host() {
        let dir = tempfile::tempdir().unwrap();
        let ip = |n| Ipv4Addr::new(10, 213, 0, n);
        let a = IdRanges::in_dir("host-a", dir.path());
        let b = IdRanges::in_dir("host-b", dir.path());
        let a2 = a.range_of(ip(2)).unwrap();
        assert_eq!(a2, 16 * RANGE_SIZE);
        assert_eq!(a.range_of(ip(2)).unwrap(), a2, "an address keeps its range");
        let b2 = b.range_of(ip(2)).unwrap();
        assert_eq!(b2, a2 + RANGE_SIZE, "another agent's claim is skipped");
        let a3 = a.range_of(ip(3)).unwrap();
        assert_eq!(a3, b2 + RANGE_SIZE);
        // After a restart the agent claims its machines' ranges again.
        let a_again = IdRanges::in_dir("host-a", dir.path());
        a_again.restore([(ip(3), a3)]);
        assert_eq!(a_again.range_of(ip(3)).unwrap(), a3);
        assert_eq!(a_again.range_of(ip(2)).unwrap(), a2, "its own claim");
        a_again.release_all();
        assert_eq!(
            b.range_of(ip(4)).unwrap(),
            a2,
            "released ranges are free again"
        );
    }
}
