//! Measuring what a machine uses (a part of the agent, below it: it knows nothing of the
//! agent): its cgroup's cumulative CPU time and its memory working set, read by
//! [`UsageProbe::sample`]. The reclamation loop ([`crate::reclaim`]) reads every started
//! machine on an interval and turns two readings into CPU use. [`CgroupUsage`] reads the
//! kernel's files (`bazaar_shim::cpu_usage_usec`, `bazaar_shim::memory_use`) and sets a
//! machine's CPU limit ([`UsageProbe::limit_cpu`], `bazaar_shim::set_cpu_limit`: shared
//! CPUs' burst model); a test puts its own probe in the agent's `Seams` to feed use and see
//! the limits.

/// One reading of a machine's cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsageSample {
    /// CPU time used since the cgroup was made, in microseconds.
    pub cpu_usec: u64,
    /// Memory in use less the inactive page cache (the working set), in bytes.
    pub memory_bytes: u64,
}

/// Where a machine's use is read from.
pub trait UsageProbe: std::fmt::Debug + Send + Sync + 'static {
    /// Reads machine `machine_id`, whose cgroup (relative path) is `cgroup` when the host
    /// runs machines in cgroups; `None` when nothing can be read (no cgroup, gone).
    /// Called off the async threads.
    fn sample(&self, machine_id: &str, cgroup: Option<&str>) -> Option<UsageSample>;

    /// Limits machine `machine_id` to `cores` of CPU from now on (shared CPUs' burst
    /// model); false when it could not be done. Called off the async threads.
    fn limit_cpu(&self, machine_id: &str, cgroup: Option<&str>, cores: f64) -> bool;
}

/// The kernel's cgroup files (v2 or v1).
#[derive(Debug, Default)]
pub struct CgroupUsage;

impl UsageProbe for CgroupUsage {
    fn sample(&self, _machine_id: &str, cgroup: Option<&str>) -> Option<UsageSample> {
        let cgroup = cgroup?;
        let cpu_usec = bazaar_shim::cpu_usage_usec(cgroup).ok()?;
        let memory = bazaar_shim::memory_use(cgroup).ok()?;
        Some(UsageSample {
            cpu_usec,
            memory_bytes: memory.working_set_bytes(),
        })
    }

    fn limit_cpu(&self, machine_id: &str, cgroup: Option<&str>, cores: f64) -> bool {
        let Some(cgroup) = cgroup else {
            return false;
        };
        match bazaar_shim::set_cpu_limit(cgroup, cores) {
            Ok(()) => true,
            Err(err) => {
                tracing::warn!(machine.id = %machine_id, error = %err, "setting a machine's CPU limit");
                false
            }
        }
    }
}
