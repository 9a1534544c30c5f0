//! A run's CPU time so far, from its cgroup: v2's `cpu.stat` `usage_usec`, v1's
//! `cpuacct.usage` (nanoseconds). Two readings some time apart give the run's CPU use
//! (`bazaar_placement::reclaim::cpu_millis`); the agent's reclamation reads it
//! (docs/POLICY.md "Reclamation"). And its CPU limit changed live ([`set_cpu_limit`]:
//! shared CPUs' burst model).

use crate::cgroup::Cgroup;
use crate::ShimError;
use std::fs;
use std::io;
use std::path::Path;

/// The CPU time the run cgroup `cgroup` (relative path) has used, child cgroups included,
/// in microseconds.
///
/// # Errors
///
/// [`ShimError::NoCgroup`] without cgroups (or v1 without cpuacct), [`ShimError::NotRunning`]
/// when the cgroup is gone, [`ShimError::Io`] naming a file that cannot be read.
pub fn cpu_usage_usec(cgroup: &str) -> Result<u64, ShimError> {
    let cg = Cgroup::open(cgroup).map_err(ShimError::Spec)?;
    let (dir, v2) = cg.cpu_time_dir().ok_or(ShimError::NoCgroup)?;
    if !dir.exists() {
        return Err(ShimError::NotRunning);
    }
    read_usage(dir, v2).map_err(ShimError::io(format!("reading the CPU time of {cgroup}")))
}

/// Sets the CPU limit of the run cgroup `cgroup` to `cores` (v2 `cpu.max`, v1
/// `cpu.cfs_quota_us`, over the kernel's default period of 100 ms; at least 1 ms). Holds
/// until it is set again or the run ends.
///
/// # Errors
///
/// As [`cpu_usage_usec`].
pub fn set_cpu_limit(cgroup: &str, cores: f64) -> Result<(), ShimError> {
    let cg = Cgroup::open(cgroup).map_err(ShimError::Spec)?;
    let (dir, v2) = cg.cpu_limit_dir().ok_or(ShimError::NoCgroup)?;
    if !dir.exists() {
        return Err(ShimError::NotRunning);
    }
    write_limit(dir, v2, cores).map_err(ShimError::io(format!("limiting the CPU of {cgroup}")))
}

const PERIOD_US: u64 = 100_000;

fn write_limit(dir: &Path, v2: bool, cores: f64) -> io::Result<()> {
    let quota = ((cores * PERIOD_US as f64) as u64).max(1_000);
    if v2 {
        fs::write(dir.join("cpu.max"), format!("{quota} {PERIOD_US}"))
    } else {
        fs::write(dir.join("cpu.cfs_quota_us"), quota.to_string())
    }
}

fn read_usage(dir: &Path, v2: bool) -> io::Result<u64> {
    let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    if v2 {
        let stat = fs::read_to_string(dir.join("cpu.stat"))?;
        stat.lines()
            .find_map(|l| l.strip_prefix("usage_usec "))
            .and_then(|n| n.trim().parse().ok())
            .ok_or_else(|| invalid("cpu.stat has no usage_usec"))
    } else {
        let ns: u64 = fs::read_to_string(dir.join("cpuacct.usage"))?
            .trim()
            .parse()
            .map_err(|_| invalid("cpuacct.usage is not a number"))?;
        Ok(ns / 1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_written_as_a_quota_of_the_100_ms_period() {
        let dir = tempfile::tempdir().unwrap();
        write_limit(dir.path(), true, 0.0625).unwrap();
        assert_eq!(
            fs::read_to_string(dir.path().join("cpu.max")).unwrap(),
            "6250 100000"
        );
        write_limit(dir.path(), false, 2.0).unwrap();
        assert_eq!(
            fs::read_to_string(dir.path().join("cpu.cfs_quota_us")).unwrap(),
            "200000"
        );
        write_limit(dir.path(), true, 0.001).unwrap();
        assert_eq!(
            fs::read_to_string(dir.path().join("cpu.max")).unwrap(),
            "1000 100000",
            "at least the kernel's 1 ms"
        );
    }

    #[test]
    fn v2_reads_usage_usec_and_v1_converts_nanoseconds() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join("cpu.stat"),
            "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n",
        )
        .unwrap();
        assert_eq!(read_usage(dir.path(), true).unwrap(), 2_500_000);
        fs::write(dir.path().join("cpuacct.usage"), "7000123456\n").unwrap();
        assert_eq!(read_usage(dir.path(), false).unwrap(), 7_000_123);
        fs::write(dir.path().join("cpu.stat"), "nr_periods 0\n").unwrap();
        assert!(read_usage(dir.path(), true).is_err());
    }
}
