//! What this host can run (issue 37 item 7): at start the agent checks what each driver's
//! machines need of the host (`bazaar_runtime::prerequisites`), says plainly what is
//! missing, and keeps it: bids and creates for a driver it cannot run are refused with the
//! reason, and the host row publishes it (`cannot_run_<driver>` labels) so exchanges do
//! not ask this host for such machines and `bazaar hosts` shows why.

use crate::config::AgentConfig;
use crate::driver::Driver;
use bazaar_runtime::prerequisites::{self, Facts};
use std::collections::BTreeMap;

/// For each driver this host cannot run, what it lacks (joined into one line). Logged
/// here, once, with what it runs without (a missing `nft`, loop devices, or the mesh's `ip`).
pub(crate) fn check(config: &AgentConfig, driver: &Driver) -> BTreeMap<String, String> {
    let facts = Facts {
        mesh: config.mesh_listen.is_some(),
        ..Facts::probe(
            config.isolate,
            driver.cgroups,
            config.machine_disk_mb != Some(0),
            config.runc.as_deref(),
        )
    };
    let mut missing: BTreeMap<String, String> = prerequisites::missing(&facts)
        .into_iter()
        .map(|(d, what)| (d.to_string(), what.join(", ")))
        .collect();
    // What the image runtime found when it started (an image store that would not open,
    // a bad registry_auth entry) beyond the host's prerequisites.
    if let Err(reason) = &driver.oci {
        for d in ["oci", "gvisor", "microvm"] {
            missing.entry(d.into()).or_insert_with(|| reason.clone());
        }
    }
    // Whether one of gVisor's platforms ran a trial sandbox here (runsc found).
    if let Some(Err(reason)) = driver.oci.as_ref().ok().map(|oci| &oci.gvisor) {
        missing
            .entry("gvisor".into())
            .or_insert_with(|| reason.clone());
    }
    // Whether QEMU, the guest kernel, the guest init and an accelerator were found.
    if let Some(Err(reason)) = driver.oci.as_ref().ok().map(|oci| &oci.microvm) {
        missing
            .entry("microvm".into())
            .or_insert_with(|| reason.clone());
    }
    for (d, what) in &missing {
        tracing::warn!(
            driver = %d,
            "this host cannot run {d} machines and will not bid for them; missing: {what}"
        );
    }
    for warning in prerequisites::warnings(&facts) {
        tracing::warn!("{warning}");
    }
    missing
}
