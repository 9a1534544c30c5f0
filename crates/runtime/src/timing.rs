//! Where a launch's time goes: marks taken on the host's monotonic clock as each step
//! ends (by the agent, its shim and the shim's init: one clock for all three processes),
//! turned into milliseconds per step for the machine's start event
//! (`bazaar machine explain --timing`).
//!
//! Steps, in the order a sandboxed process machine runs them (a mark names the step that
//! ends there): `queued` (from the operation's creation to the launch step; whole
//! milliseconds), `run_dir`, `network` (the address's network namespace and veth: made
//! now, or taken from the pool made ahead), `work_disk` (its file system, made and
//! mounted once; `work_disk_ahead` when the first start took one made ahead,
//! `crate::disk_pool`), `owner` (work directory handed to the machine's user), `files`,
//! `spec_written` (the shim's spec), `spawned` (posix_spawn of the shim), `shim_start`
//! (the shim's exec and start-up), `shim_spec` (spec read, run dir locked),
//! `seccomp_load` (the filters compiled once at agent start, read), `shim_cgroup` (user,
//! work dir, log, cgroup made and limited), `init` (pid namespace, fork of the init),
//! `join_cgroup_netns`, `mount_namespace` (its mounts unshared, from the sandbox base),
//! `private_root` (root built and entered, capabilities dropped), `seccomp_exec` (the
//! workload forked, its filters installed, exec'd), `shim_started` (the init's report read
//! by the shim), `ready` (the shim's report read by the agent). A step that did not run
//! (no sandbox, no work disk) has no entry. An image machine's launch: `run_dir`, `layer`
//! (its writable layer emptied, or made and mounted; `layer_ahead` when the first start
//! took a disk made ahead), `image_prepared` (the image found or
//! pulled, its rootfs, the bundle and its network), the shim's steps as above (from
//! `spec_written` to `ready`: the shim runs runc), and `container_created` (runc has
//! created the container: the machine is started).

use bazaar_types::event::StepTiming;

/// Marks of one launch, in order.
#[derive(Debug, Default, Clone)]
pub struct Timing {
    start_us: u64,
    marks: Vec<(String, u64)>,
}

impl Timing {
    /// Starts timing now.
    pub fn start() -> Timing {
        Timing {
            start_us: bazaar_shim::monotonic_us(),
            marks: Vec::new(),
        }
    }

    /// Step `step` ended now.
    pub fn mark(&mut self, step: &str) {
        self.marks
            .push((step.to_owned(), bazaar_shim::monotonic_us()));
    }

    /// Adds marks taken elsewhere on the same clock (a shim's), in time order with the
    /// others (an image machine's agent marks `container_created` after the shim's marks).
    pub fn extend(&mut self, marks: &[(String, u64)]) {
        self.marks.extend(marks.iter().cloned());
        self.marks.sort_by_key(|(_, us)| *us);
    }

    /// Milliseconds per step: each mark's distance from the one before (the first from
    /// the start). Marks out of order (none should be) count as 0.
    pub fn steps(&self) -> Vec<StepTiming> {
        steps(self.start_us, &self.marks)
    }
}

/// Milliseconds per step of `marks` (µs on one clock), from `start_us`.
pub fn steps(start_us: u64, marks: &[(String, u64)]) -> Vec<StepTiming> {
    let mut last = start_us;
    marks
        .iter()
        .map(|(step, us)| {
            let ms = us.saturating_sub(last) as f64 / 1e3;
            last = last.max(*us);
            StepTiming {
                step: step.clone(),
                ms,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_distances_between_marks() {
        let marks = [
            ("a".to_owned(), 1_500),
            ("b".to_owned(), 4_000),
            ("c".to_owned(), 3_000),
        ];
        let got = steps(1_000, &marks);
        let ms: Vec<f64> = got.iter().map(|s| s.ms).collect();
        assert_eq!(ms, [0.5, 2.5, 0.0]);
        assert_eq!(got[1].step, "b");
    }

    #[test]
    fn marks_are_taken_in_order() {
        let mut t = Timing::start();
        t.mark("one");
        t.mark("two");
        let steps = t.steps();
        assert_eq!(steps.len(), 2);
        assert!(steps.iter().all(|s| s.ms >= 0.0));
    }

    #[test]
    fn a_shims_marks_fall_between_the_agents_by_time() {
        let mut t = Timing {
            start_us: 1_000,
            marks: vec![
                ("spawned".into(), 2_000),
                ("container_created".into(), 9_000),
            ],
        };
        t.extend(&[("shim_start".into(), 3_000), ("shim_started".into(), 5_000)]);
        let got: Vec<(String, f64)> = t.steps().into_iter().map(|s| (s.step, s.ms)).collect();
        assert_eq!(
            got,
            [
                ("spawned".to_owned(), 1.0),
                ("shim_start".to_owned(), 1.0),
                ("shim_started".to_owned(), 2.0),
                ("container_created".to_owned(), 4.0),
            ]
        );
    }
}
