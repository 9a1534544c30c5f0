//! Process machines' uids, claimed machine-wide. Several agents can share one kernel
//! (tests, `bazaar dev`, clusters side by side), and a uid handed to machines of two of them
//! would let one tenant's machine reach the other's files. As the id ranges of image machines
//! (`bazaar_runtime::idranges`), uids are claimed by files that appear whole or not at all,
//! in blocks of [`BLOCK`]: `/run/bazaar/uids/block-<first uid>` names the host holding the
//! block (`<host id>`), and the host hands out the block's uids to its machines itself. A
//! block someone else claimed is skipped, as is a block holding a single-uid claim
//! (`/run/bazaar/uids/<uid>`, naming `<host id>/<machine id>`) of an agent from before blocks.
//! A host gives a block back when none of its machines holds a uid of it any more.
//!
//! One claim file per block rather than per machine: creating a file costs an inode, and a
//! file system that has seen many files come and go (ext4 without a journal checks each free
//! inode's deletion time, `recently_deleted`) made that cost a create's milliseconds.
//!
//! At start an agent claims its machines' blocks again (after a reboot `/run` is empty);
//! `cleanup::release_host` gives back a host's claims. A part below the agent: it knows
//! nothing of it.

use std::collections::{BTreeSet, HashSet};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Where uids are claimed.
pub const CLAIMS_DIR: &str = "/run/bazaar/uids";

/// How many uids one claim file holds.
pub const BLOCK: u32 = 64;

/// This host's claims on machine uids.
#[derive(Debug)]
pub(crate) struct UidClaims {
    host_id: String,
    dir: PathBuf,
    /// The first uid of each block this host holds (its claim file names this host).
    held: Mutex<BTreeSet<u32>>,
}

fn block_of(uid: u32) -> u32 {
    uid - uid % BLOCK
}

fn block_name(first: u32) -> String {
    format!("block-{first}")
}

impl UidClaims {
    pub(crate) fn new(host_id: &str) -> UidClaims {
        UidClaims::in_dir(host_id, Path::new(CLAIMS_DIR))
    }

    fn in_dir(host_id: &str, dir: &Path) -> UidClaims {
        UidClaims {
            host_id: host_id.to_string(),
            dir: dir.to_path_buf(),
            held: Mutex::new(BTreeSet::new()),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, BTreeSet<u32>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Claims the block starting at `first` unless someone else holds it; `Ok(true)` if it
    /// is now (or already was) this host's.
    fn claim_block(&self, first: u32) -> std::io::Result<bool> {
        if self.held().contains(&first) {
            return Ok(true);
        }
        std::fs::create_dir_all(&self.dir)?;
        let ours =
            bazaar_runtime::idranges::claim_file(&self.dir, &block_name(first), &self.host_id)?;
        if ours {
            self.held().insert(first);
        }
        Ok(ours)
    }

    /// At start: claims again the blocks of the uids this host's machines hold (`(uid,
    /// machine id)`). A block someone else claimed meanwhile is logged (the machine keeps
    /// its uid).
    pub(crate) fn restore<'a>(&self, machines: impl IntoIterator<Item = (u32, &'a str)>) {
        for (uid, machine) in machines {
            if !self.claim_block(block_of(uid)).unwrap_or(false) {
                tracing::warn!(
                    uid,
                    machine.id = machine,
                    "machine uid's block claimed by another holder"
                );
            }
        }
    }

    /// The first uid of `range` that no machine of this host holds (`used`) in a block this
    /// host holds, or else in the first block of `range` nobody claimed (claimed now);
    /// `Ok(None)` when none is left.
    pub(crate) fn claim_free(
        &self,
        used: &HashSet<u32>,
        range: Range<u32>,
    ) -> std::io::Result<Option<u32>> {
        let free_in = |first: u32| {
            (first.max(range.start)..(first + BLOCK).min(range.end)).find(|u| !used.contains(u))
        };
        let held: Vec<u32> = self.held().iter().copied().collect();
        if let Some(uid) = held.into_iter().find_map(free_in) {
            return Ok(Some(uid));
        }
        // Blocks someone claimed, whole or (an agent from before blocks) one uid of.
        let claimed: HashSet<u32> = std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name();
                let name = name.to_str()?;
                let uid = name.strip_prefix("block-").unwrap_or(name);
                uid.parse().ok().map(block_of)
            })
            .collect();
        let mut first = block_of(range.start);
        while first < range.end {
            if !claimed.contains(&first) && self.claim_block(first)? {
                if let Some(uid) = free_in(first) {
                    return Ok(Some(uid));
                }
            }
            first += BLOCK;
        }
        Ok(None)
    }

    /// Gives back the block of `uid` once no machine of this host holds a uid of it
    /// (`used`, without `uid` now).
    pub(crate) fn release(&self, uid: u32, used: &HashSet<u32>) {
        let first = block_of(uid);
        if (first..first + BLOCK).any(|u| used.contains(&u)) || !self.held().remove(&first) {
            return;
        }
        let path = self.dir.join(block_name(first));
        if std::fs::read_to_string(&path).is_ok_and(|h| h == self.host_id) {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Removes every claim host `host_id` holds (`bazaar host reset`, `bazaar dev`'s stop).
pub fn release_all(host_id: &str) {
    release_all_in(host_id, Path::new(CLAIMS_DIR));
}

fn release_all_in(host_id: &str, dir: &Path) {
    let machine_prefix = format!("{host_id}/");
    for claim in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if std::fs::read_to_string(claim.path())
            .is_ok_and(|h| h == host_id || h.starts_with(&machine_prefix))
        {
            let _ = std::fs::remove_file(claim.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(dir: &Path) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let holder = std::fs::read_to_string(e.path()).unwrap();
                (e.file_name().to_string_lossy().into_owned(), holder)
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn agents_sharing_a_kernel_never_hand_out_the_same_uid() {
        let dir = tempfile::tempdir().unwrap();
        let a = UidClaims::in_dir("host-a", dir.path());
        let b = UidClaims::in_dir("host-b", dir.path());
        let range = 200_000..200_000 + 3 * BLOCK;
        let (mut used_a, mut used_b) = (HashSet::new(), HashSet::new());
        let take = |claims: &UidClaims, used: &mut HashSet<u32>| {
            let uid = claims.claim_free(used, range.clone()).unwrap();
            used.extend(uid);
            uid
        };
        assert_eq!(take(&a, &mut used_a), Some(200_000));
        assert_eq!(take(&b, &mut used_b), Some(200_064), "a's block is skipped");
        assert_eq!(
            take(&a, &mut used_a),
            Some(200_001),
            "a fills its own block"
        );
        assert_eq!(
            files(dir.path()),
            [
                ("block-200000".into(), "host-a".into()),
                ("block-200064".into(), "host-b".into())
            ],
            "one claim file per block, not per machine"
        );
        // After a restart, an agent claims its machines' blocks again; another's stays its.
        let a_again = UidClaims::in_dir("host-a", dir.path());
        a_again.restore([(200_001, "m1"), (200_064, "m9")]);
        assert!(!a_again.claim_block(200_064).unwrap());
        assert_eq!(
            a_again.claim_free(&used_a, range.clone()).unwrap(),
            Some(200_002)
        );
        // A full block: the next free one is claimed; none left once every block is.
        for _ in 2..BLOCK {
            take(&a, &mut used_a);
        }
        assert_eq!(take(&a, &mut used_a), Some(200_128));
        for _ in 1..BLOCK {
            take(&b, &mut used_b);
        }
        assert_eq!(take(&b, &mut used_b), None, "none left");
    }

    #[test]
    fn a_block_is_given_back_with_its_last_uid_and_a_host_release_leaves_others_claims() {
        let dir = tempfile::tempdir().unwrap();
        let a = UidClaims::in_dir("host-a", dir.path());
        let b = UidClaims::in_dir("host-b", dir.path());
        let range = 200_000..200_000 + 2 * BLOCK;
        let mut used = HashSet::new();
        let first = a.claim_free(&used, range.clone()).unwrap().unwrap();
        used.insert(first);
        let second = a.claim_free(&used, range.clone()).unwrap().unwrap();
        used.insert(second);
        used.remove(&first);
        a.release(first, &used);
        assert_eq!(files(dir.path()).len(), 1, "still held for {second}");
        used.remove(&second);
        a.release(second, &used);
        assert!(files(dir.path()).is_empty(), "given back with its last uid");
        assert_eq!(
            b.claim_free(&HashSet::new(), range.clone()).unwrap(),
            Some(200_000),
            "free for anyone"
        );
        a.claim_free(&HashSet::new(), range.clone()).unwrap();
        release_all_in("host-b", dir.path());
        assert_eq!(
            files(dir.path()),
            [("block-200064".into(), "host-a".into())],
            "only host-a's claim is left"
        );
    }

    #[test]
    fn a_single_uid_claim_of_an_agent_from_before_blocks_keeps_its_whole_block_taken() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("200070"), "old-host/m1").unwrap();
        let a = UidClaims::in_dir("host-a", dir.path());
        let range = 200_000..200_000 + 3 * BLOCK;
        let used = HashSet::from_iter(200_000..200_064);
        a.claim_block(200_000).unwrap();
        assert_eq!(
            a.claim_free(&used, range).unwrap(),
            Some(200_128),
            "the block holding uid 200070 is skipped"
        );
        release_all_in("old-host", dir.path());
        assert_eq!(files(dir.path()).len(), 2, "old-host's claim is gone");
    }
}
