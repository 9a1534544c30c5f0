//! A run's memory while it runs (Fly's `/memory` calls, which move a VM's balloon): what
//! its cgroup uses and may use ([`memory_use`]), its limit changed live
//! ([`set_memory_limit`]), and memory taken back from it ([`reclaim_memory`]).
//!
//! A limit set here holds until the run ends: the next run of the machine starts with the
//! limit of its guest size again (`Cgroup::configure`).
//!
//! The kernel does the work on both layouts. Lowering a limit below what the run uses makes
//! the kernel reclaim first; where it cannot (the memory is in use, not cache), v1 refuses
//! the write (`EBUSY`), and v2 would kill the run, so on v2 the reclaim is asked for first
//! (`memory.reclaim`) and the new limit is refused unless usage fits under it. Reclaiming
//! on v2 writes `memory.reclaim`; v1 has no such file, so the limit is lowered to
//! the target for a moment (the kernel reclaims down to it, as far as it can) and then put
//! back.

use crate::cgroup::Cgroup;
use crate::ShimError;
use std::fs;
use std::io;
use std::path::Path;

/// What a run's cgroup uses of memory, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryUse {
    /// The cgroup's limit; `None` when it has none.
    pub limit_bytes: Option<u64>,
    /// All memory charged to it, page cache included.
    pub usage_bytes: u64,
    /// The part of the page cache the kernel takes back first (`inactive_file`): usage
    /// less this is the working set (as Kubernetes counts it).
    pub inactive_file_bytes: u64,
}

impl MemoryUse {
    /// Usage less the inactive page cache.
    pub fn working_set_bytes(&self) -> u64 {
        self.usage_bytes.saturating_sub(self.inactive_file_bytes)
    }
}

/// v1 writes this (or anything above the page-rounded maximum) to mean "no limit".
const V1_UNLIMITED: u64 = i64::MAX as u64 / 4096 * 4096;

/// The memory hierarchy's directory of the run cgroup `cgroup` (relative path).
fn memory_dir(cgroup: &str) -> Result<(std::path::PathBuf, bool), ShimError> {
    let cg = Cgroup::open(cgroup).map_err(ShimError::Spec)?;
    let (dir, v2) = cg.memory_dir().ok_or(ShimError::NoCgroup)?;
    if !dir.exists() {
        return Err(ShimError::NotRunning);
    }
    Ok((dir.to_path_buf(), v2))
}

/// What the run cgroup `cgroup` uses of memory now.
///
/// # Errors
///
/// [`ShimError::NoCgroup`] without a memory controller, [`ShimError::NotRunning`] when the
/// cgroup is gone, [`ShimError::Io`] naming a file that cannot be read.
pub fn memory_use(cgroup: &str) -> Result<MemoryUse, ShimError> {
    let (dir, v2) = memory_dir(cgroup)?;
    read_use(&dir, v2).map_err(ShimError::io(format!("reading the memory of {cgroup}")))
}

fn read_use(dir: &Path, v2: bool) -> io::Result<MemoryUse> {
    let (limit_file, usage_file, inactive_key) = if v2 {
        ("memory.max", "memory.current", "inactive_file")
    } else {
        (
            "memory.limit_in_bytes",
            "memory.usage_in_bytes",
            "total_inactive_file",
        )
    };
    let limit = read_number(&dir.join(limit_file))?;
    let usage = read_number(&dir.join(usage_file))?.unwrap_or(0);
    let stat = fs::read_to_string(dir.join("memory.stat"))?;
    let inactive_file = stat
        .lines()
        .find_map(|l| l.strip_prefix(inactive_key)?.strip_prefix(' '))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    Ok(MemoryUse {
        limit_bytes: limit.filter(|&l| l < V1_UNLIMITED),
        usage_bytes: usage,
        inactive_file_bytes: inactive_file,
    })
}

/// A cgroup file's number; `None` for `max`.
fn read_number(path: &Path) -> io::Result<Option<u64>> {
    let text = fs::read_to_string(path)?;
    match text.trim() {
        "max" => Ok(None),
        n => n.parse().map(Some).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {n:?} is not a number", path.display()),
            )
        }),
    }
}

/// Sets the memory limit of the run cgroup `cgroup` to `bytes`.
///
/// # Errors
///
/// [`ShimError::Io`] with [`io::ErrorKind::ResourceBusy`] when the run uses more than
/// `bytes` and the kernel cannot reclaim enough (nothing changed); the errors of
/// [`memory_use`] otherwise.
pub fn set_memory_limit(cgroup: &str, bytes: u64) -> Result<(), ShimError> {
    let (dir, v2) = memory_dir(cgroup)?;
    let context = format!("setting the memory limit of {cgroup}");
    if v2 {
        let now = read_use(&dir, true).map_err(ShimError::io(context.clone()))?;
        if now.usage_bytes > bytes {
            // Reclaim first: a memory.max under usage would have the kernel kill the run.
            let _ = fs::write(
                dir.join("memory.reclaim"),
                (now.usage_bytes - bytes).to_string(),
            );
            let after = read_use(&dir, true).map_err(ShimError::io(context.clone()))?;
            if after.usage_bytes > bytes {
                return Err(ShimError::Io(context, busy(after.usage_bytes, bytes)));
            }
        }
        return fs::write(dir.join("memory.max"), bytes.to_string())
            .map_err(ShimError::io(context));
    }
    // v1: memory + swap (memsw) must stay at least the memory limit, so when raising it
    // goes first, and when lowering it goes last. It exists only with swap accounting.
    let memsw = dir.join("memory.memsw.limit_in_bytes");
    let limit = dir.join("memory.limit_in_bytes");
    let current = read_number(&limit)
        .map_err(ShimError::io(context.clone()))?
        .unwrap_or(u64::MAX);
    let write_limit = || match fs::write(&limit, bytes.to_string()) {
        Err(err) if err.raw_os_error() == Some(libc::EBUSY) => {
            let usage = read_number(&dir.join("memory.usage_in_bytes"))
                .ok()
                .flatten()
                .unwrap_or(0);
            Err(busy(usage, bytes))
        }
        other => other,
    };
    let done = if bytes >= current {
        let _ = fs::write(&memsw, bytes.to_string());
        write_limit()
    } else {
        write_limit().map(|()| {
            let _ = fs::write(&memsw, bytes.to_string());
        })
    };
    done.map_err(ShimError::io(context))
}

fn busy(usage: u64, limit: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::ResourceBusy,
        format!(
            "the machine uses {} MiB, which cannot be reclaimed below {} MiB",
            usage.div_ceil(1 << 20),
            limit >> 20
        ),
    )
}

/// Asks the kernel to take back up to `bytes` of the memory the run cgroup `cgroup` uses
/// (page cache first, then swap where there is any); answers how many bytes it took.
///
/// # Errors
///
/// The errors of [`memory_use`].
pub fn reclaim_memory(cgroup: &str, bytes: u64) -> Result<u64, ShimError> {
    let (dir, v2) = memory_dir(cgroup)?;
    let context = format!("reclaiming memory of {cgroup}");
    let before = read_use(&dir, v2).map_err(ShimError::io(context.clone()))?;
    if v2 {
        // EAGAIN when less than asked could be taken: what was taken still counts.
        let _ = fs::write(dir.join("memory.reclaim"), bytes.to_string());
    } else {
        let limit = dir.join("memory.limit_in_bytes");
        let target = before.usage_bytes.saturating_sub(bytes);
        let old = read_number(&limit)
            .map_err(ShimError::io(context.clone()))?
            .unwrap_or(u64::MAX);
        // The kernel reclaims down to the lower limit, or refuses (EBUSY) having taken what
        // it could; either way the old limit goes back at once.
        if target < old {
            let _ = fs::write(&limit, target.max(1 << 20).to_string());
            fs::write(&limit, old.min(V1_UNLIMITED).to_string())
                .map_err(ShimError::io(context.clone()))?;
        }
    }
    let after = read_use(&dir, v2).map_err(ShimError::io(context))?;
    Ok(before.usage_bytes.saturating_sub(after.usage_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cgroup_dir(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            fs::write(dir.path().join(name), text).unwrap();
        }
        dir
    }

    #[test]
    fn v2_use_reads_max_current_and_inactive_file() {
        let dir = cgroup_dir(&[
            ("memory.max", "268435456\n"),
            ("memory.current", "104857600\n"),
            (
                "memory.stat",
                "anon 50\nfile 60\ninactive_file 4194304\nactive_file 9\n",
            ),
        ]);
        let got = read_use(dir.path(), true).unwrap();
        assert_eq!(got.limit_bytes, Some(256 << 20));
        assert_eq!(got.usage_bytes, 100 << 20);
        assert_eq!(got.working_set_bytes(), (100 << 20) - (4 << 20));
        fs::write(dir.path().join("memory.max"), "max\n").unwrap();
        assert_eq!(read_use(dir.path(), true).unwrap().limit_bytes, None);
    }

    #[test]
    fn v1_use_reads_the_totals_and_treats_the_huge_limit_as_none() {
        let dir = cgroup_dir(&[
            ("memory.limit_in_bytes", "9223372036854771712\n"),
            ("memory.usage_in_bytes", "2097152\n"),
            (
                "memory.stat",
                "inactive_file 7\ntotal_inactive_file 1048576\n",
            ),
        ]);
        let got = read_use(dir.path(), false).unwrap();
        assert_eq!(got.limit_bytes, None);
        assert_eq!(
            got.inactive_file_bytes,
            1 << 20,
            "the total, not the own count"
        );
        assert_eq!(got.working_set_bytes(), 1 << 20);
    }
}
