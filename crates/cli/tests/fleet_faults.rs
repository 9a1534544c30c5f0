//! The fault suite at CI size (root): a lab of 3 hosts, each fault of
//! `bazaar_lab::faults::ALL` injected once under a workload through every API node and
//! proxy traffic, healed, and checked (`bazaar_lab::check`): nothing acknowledged is lost
//! or duplicated, no host overcommits, catalogs agree with the owners soon after the heal,
//! both sides of a partition place, proxies keep serving, workloads keep their pids. A
//! broken invariant fails the test with the calls that show it. The lab comes down even
//! when the run fails, and leaves nothing on the machine.

use crate::common;

use common::{is_root, EXE};
use std::path::PathBuf;

#[test]
fn every_fault_keeps_every_invariant() {
    assert!(
        is_root(),
        "the fault suite needs root (network namespaces, mounts)"
    );
    let dir = tempfile::Builder::new()
        .prefix("bazaar-faults-")
        .tempdir()
        .unwrap();
    let mut opts =
        bazaar_lab::faults::FaultOptions::ci(dir.path().to_path_buf(), PathBuf::from(EXE));
    // `BAZAAR_LAB_POLICIES=1`: the same run with reclamation on and batch machines in the
    // workload (docs/POLICY.md, "What is wired").
    opts.policies = std::env::var("BAZAAR_LAB_POLICIES").is_ok_and(|v| v == "1");
    let started = std::time::Instant::now();
    let report = bazaar_lab::faults::run(&opts, |run| {
        eprintln!(
            "{}: {} ops, {} acknowledged, converged {:?} ms after the last operation, {} violation(s)",
            run.row.fault,
            run.row.tried,
            run.row.acknowledged,
            run.row.converged_ms,
            run.violations.len()
        );
    })
    .unwrap();
    let runs = &report.runs;
    eprintln!(
        "{}\n{} faults in {} s",
        bazaar_lab::faults::matrix(runs),
        runs.len(),
        started.elapsed().as_secs()
    );
    assert_eq!(runs.len(), bazaar_lab::faults::ALL.len());
    let broken: Vec<String> = runs
        .iter()
        .flat_map(|r| {
            r.violations
                .iter()
                .map(move |v| format!("{}: {v}", r.row.fault))
        })
        .collect();
    assert!(
        broken.is_empty(),
        "broken invariants:\n{}",
        broken.join("\n")
    );
    for r in runs {
        assert!(
            r.row.acknowledged > 0,
            "{}: nothing acknowledged",
            r.row.fault
        );
    }
    // Nothing of the lab is left: no namespace, link or mount of it.
    let ip = |args: &[&str]| {
        let out = std::process::Command::new("ip")
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let plan = &report.plan;
    assert!(!ip(&["netns", "list"]).contains(&plan.netns_prefix()));
    let links = ip(&["-o", "link", "show"]);
    assert!(!links.contains(&plan.bridge()), "{links}");
    assert!(!links.contains(&plan.veth_prefix()), "{links}");
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    assert!(
        !mounts.contains(&dir.path().display().to_string()),
        "{mounts}"
    );
    assert!(!dir.path().join("lab.json").exists());
}
