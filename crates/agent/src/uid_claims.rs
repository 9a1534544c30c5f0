//! Process machines' uids, claimed machine-wide. Several agents can share one kernel
//! (tests, `bazaar dev`, clusters side by side), and a uid handed to machines of two of them
//! would let one tenant's machine reach the other's files. As the id ranges of image machines
//! (`bazaar_runtime::idranges`), each uid a machine holds is claimed by a file
//! `/run/bazaar/uids/<uid>` naming its holder (`<host id>/<machine id>`), which appears
//! whole or not at all; a uid someone else claimed is skipped. At start an agent claims its
//! machines' uids again (after a reboot `/run` is empty); `cleanup::release_host` gives
//! back a host's claims. A part below the agent: it knows nothing of it.

use std::collections::HashSet;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// Where uids are claimed.
pub const CLAIMS_DIR: &str = "/run/bazaar/uids";

/// This host's claims on machine uids.
#[derive(Debug)]
pub(crate) struct UidClaims {
    host_id: String,
    dir: PathBuf,
}

impl UidClaims {
    pub(crate) fn new(host_id: &str) -> UidClaims {
        UidClaims::in_dir(host_id, Path::new(CLAIMS_DIR))
    }

    fn in_dir(host_id: &str, dir: &Path) -> UidClaims {
        UidClaims {
            host_id: host_id.to_string(),
            dir: dir.to_path_buf(),
        }
    }

    fn holder(&self, machine: &str) -> String {
        format!("{}/{machine}", self.host_id)
    }

    /// Claims `uid` for `machine` unless someone else holds it; `Ok(true)` if it is now (or
    /// already was) the machine's.
    fn claim(&self, uid: u32, machine: &str) -> std::io::Result<bool> {
        std::fs::create_dir_all(&self.dir)?;
        bazaar_runtime::idranges::claim_file(&self.dir, &uid.to_string(), &self.holder(machine))
    }

    /// At start: claims again the uids this host's machines hold (`(uid, machine id)`).
    /// One someone else claimed meanwhile is logged (the machine keeps it).
    pub(crate) fn restore<'a>(&self, machines: impl IntoIterator<Item = (u32, &'a str)>) {
        for (uid, machine) in machines {
            if !self.claim(uid, machine).unwrap_or(false) {
                tracing::warn!(
                    uid,
                    machine.id = machine,
                    "machine uid claimed by another holder"
                );
            }
        }
    }

    /// The first uid of `range` that neither this host's machines (`used`) nor anyone else
    /// holds, claimed for `machine`; `Ok(None)` when none is left.
    pub(crate) fn claim_free(
        &self,
        machine: &str,
        used: &HashSet<u32>,
        range: Range<u32>,
    ) -> std::io::Result<Option<u32>> {
        let claimed: HashSet<u32> = std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
        for uid in range {
            if used.contains(&uid) || claimed.contains(&uid) {
                continue;
            }
            if self.claim(uid, machine)? {
                return Ok(Some(uid));
            }
        }
        Ok(None)
    }

    /// Gives back `machine`'s claim on `uid` (left alone if someone else holds it).
    pub(crate) fn release(&self, uid: u32, machine: &str) {
        let path = self.dir.join(uid.to_string());
        if std::fs::read_to_string(&path).is_ok_and(|h| h == self.holder(machine)) {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Removes every claim host `host_id` holds (`bazaar host reset`, `bazaar dev`'s stop).
pub fn release_all(host_id: &str) {
    release_all_in(host_id, Path::new(CLAIMS_DIR));
}

fn release_all_in(host_id: &str, dir: &Path) {
    let prefix = format!("{host_id}/");
    for claim in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if std::fs::read_to_string(claim.path()).is_ok_and(|h| h.starts_with(&prefix)) {
            let _ = std::fs::remove_file(claim.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_sharing_a_kernel_never_hand_out_the_same_uid() {
        let dir = tempfile::tempdir().unwrap();
        let a = UidClaims::in_dir("host-a", dir.path());
        let b = UidClaims::in_dir("host-b", dir.path());
        let none = HashSet::new();
        let range = 200_000..200_004;
        let a1 = a.claim_free("m1", &none, range.clone()).unwrap().unwrap();
        let b1 = b.claim_free("m2", &none, range.clone()).unwrap().unwrap();
        assert_eq!(
            (a1, b1),
            (200_000, 200_001),
            "another agent's claim is skipped"
        );
        // After a restart, an agent claims its machines' uids again; another's stays its.
        let a_again = UidClaims::in_dir("host-a", dir.path());
        a_again.restore([(a1, "m1"), (b1, "m9")]);
        assert!(!a_again.claim(b1, "m9").unwrap());
        let b2 = b.claim_free("m3", &none, range.clone()).unwrap().unwrap();
        assert_eq!(b2, 200_002);
        let a2 = a
            .claim_free("m4", &HashSet::from([a1]), range.clone())
            .unwrap();
        assert_eq!(a2, Some(200_003));
        assert_eq!(
            b.claim_free("m5", &none, range.clone()).unwrap(),
            None,
            "none left"
        );
        // Given back: free for anyone; a host's release leaves others' claims.
        a.release(a1, "m1");
        b.release(a2.unwrap(), "m4");
        assert_eq!(b.claim_free("m5", &none, range.clone()).unwrap(), Some(a1));
        release_all_in("host-b", dir.path());
        let left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, ["200003"], "only host-a's claim is left");
    }
}
