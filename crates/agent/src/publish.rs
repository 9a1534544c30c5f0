//! Publishing this host: its host record in the catalog (capacity, free room, where its
//! proxy listens, its labels), attaching the catalog, and keeping this host's machine rows
//! in line with its store; functions over the agent's narrow methods. A machine's own row
//! and the live state `wait` watches are published by `views::Reader::publish`.

use crate::agent::Agent;
use crate::sync::lock;
use bazaar_types::host::Resources;
use bazaar_types::state::MachineState;
use std::collections::BTreeMap;

pub use bazaar_node::host_link::PROXY_HOP_ADDR_LABEL;

/// Attaches the catalog and publishes this host and all its machines to it (with
/// versions above anything published before a restart).
pub async fn attach_catalog(agent: &Agent, catalog: bazaar_catalog::Catalog) {
    if agent.catalog_cell().set(catalog).is_err() {
        return;
    }
    publish_host(agent).await;
    for m in agent.store().machines().unwrap_or_default() {
        agent.publish(&m);
    }
    for v in agent.store().volumes().unwrap_or_default() {
        crate::volumes::publish_volume(agent, &v);
    }
}

/// Puts this host's machine rows in the catalog back in line with its store: a live
/// row of a machine the store holds destroyed (or not at all) is tombstoned, a row
/// whose state is not the machine's is published again. A restart loses publishes: a
/// destroy that finishes while the catalog is not yet attached, or a tombstone for a
/// row this node has not yet learned back from its peers (`delete_machine` needs the
/// row), would leave the peers' last row live for good (found by the fault suite:
/// `crash`). Housekeeping calls it; it copies only this host's rows.
pub(crate) fn reconcile_catalog(agent: &Agent) {
    let Some(catalog) = agent.catalog() else {
        return;
    };
    let me = agent.host_id();
    let rows = catalog.machines_where(&bazaar_catalog::MachineFilter::default(), |m| {
        m.host_id == me
    });
    for row in rows.into_iter().filter(|r| !r.deleted) {
        match agent.store().machine(&row.record.id) {
            Ok(Some(rec)) if rec.state != MachineState::Destroyed => {
                if row.record.state != agent.current_state(&rec).as_str() {
                    agent.publish(&rec);
                }
            }
            Ok(_) => {
                tracing::info!(machine.id = %row.record.id, "tombstoning a stale catalog row");
                catalog.delete_machine(&row.record.id);
            }
            Err(_) => {}
        }
    }
}

/// The platform this host runs gVisor machines on, if it runs them.
fn gvisor_platform(agent: &Agent) -> Option<String> {
    if agent.cannot_run("gvisor").is_some() {
        return None;
    }
    let oci = agent.driver().oci.as_ref().ok()?;
    Some(oci.gvisor.as_ref().ok()?.platform.clone())
}

/// The accelerator this host runs microVM machines with, if it runs them.
fn microvm_accel(agent: &Agent) -> Option<&'static str> {
    if agent.cannot_run("microvm").is_some() {
        return None;
    }
    let oci = agent.driver().oci.as_ref().ok()?;
    Some(oci.microvm.as_ref().ok()?.accel.as_str())
}

/// Publishes this host's record to the catalog if it changed.
pub async fn publish_host(agent: &Agent) {
    let Some(catalog) = agent.catalog() else {
        return;
    };
    // Advertise capacity minus what is committed: reservations are short-lived, and
    // counting them would make a host look full to every exchange during a burst.
    // A host that reclaims also advertises the room it offers batch machines.
    let (capacity, free, batch_free) = {
        let ledger = agent.write_lock().await;
        let (cap, used) = (ledger.capacity(), ledger.committed());
        (
            cap,
            Resources {
                cpus: cap.cpus.saturating_sub(used.cpus),
                memory_mb: cap.memory_mb.saturating_sub(used.memory_mb),
            },
            ledger.reclaiming().then(|| ledger.batch_free()),
        )
    };
    let num_machines = agent.actors().len() as u32;
    let disk_gb = agent.disk_gb();
    let record =
        bazaar_catalog::HostRecord {
            id: agent.host_id().to_string(),
            region: agent.config().region.clone(),
            api_addr: agent.config().api_listen.to_string(),
            gossip_addr: catalog.local_addr().to_string(),
            capacity,
            free,
            num_machines,
            // The operator's labels first: the agent's own (checked not to clash) win.
            labels: agent
                .config()
                .labels
                .clone()
                .into_iter()
                .chain(
                    agent
                        .proxy_addr()
                        .get()
                        .map(|a| ("proxy_addr".to_string(), a.to_string())),
                )
                .chain(
                    agent
                        .proxy_hop_addr()
                        .get()
                        .map(|a| (PROXY_HOP_ADDR_LABEL.to_string(), a.to_string())),
                )
                .chain(agent.host_link().map(|link| {
                    (
                        crate::host_tls::HOST_ADDR_LABEL.to_string(),
                        link.addr.to_string(),
                    )
                }))
                .chain(lock(agent.mesh_labels()).clone())
                .chain(agent.config().region_info.to_labels())
                .chain(
                    gvisor_platform(agent)
                        .map(|p| (bazaar_types::host::GVISOR_PLATFORM_LABEL.to_string(), p)),
                )
                .chain(microvm_accel(agent).map(|a| {
                    let label = bazaar_runtime::microvm::ACCEL_LABEL;
                    (label.to_string(), a.to_string())
                }))
                .chain(agent.cannot_run_all().iter().map(|(driver, why)| {
                    (bazaar_types::host::cannot_run_label(driver), why.clone())
                }))
                .chain(
                    agent
                        .network_full()
                        .map(|why| (bazaar_types::host::NETWORK_FULL_LABEL.to_string(), why)),
                )
                .chain(batch_free.map(|room| {
                    (
                        bazaar_types::host::BATCH_FREE_LABEL.to_string(),
                        format!("{}/{}", room.cpus, room.memory_mb),
                    )
                }))
                .collect::<BTreeMap<_, _>>(),
            draining: agent.is_draining(),
            disk_gb,
            disk_free_gb: disk_gb.saturating_sub(agent.disk_used_gb()),
            revoked_tokens: agent.revoked_here(),
            // Set by the catalog.
            public_key: String::new(),
            key_endorsement: String::new(),
            updated_at_ms: 0,
        };
    let mut last = lock(agent.last_host_record());
    if last.as_ref() != Some(&record) {
        *last = Some(record.clone());
        drop(last);
        catalog.publish_host(record);
    }
}

/// Records where this host's edge proxy listens and republishes the host record.
pub async fn set_proxy_addr(agent: &Agent, addr: std::net::SocketAddr) {
    let _ = agent.proxy_addr().set(addr);
    publish_host(agent).await;
}

/// Records the host link and republishes the host record (with `host_addr`).
pub async fn set_host_link(agent: &Agent, link: crate::host_tls::HostLink) {
    let _ = agent.host_link_cell().set(link);
    publish_host(agent).await;
}

/// Records the proxy's hop listener and republishes the host record with it.
pub async fn set_proxy_hop_addr(agent: &Agent, addr: std::net::SocketAddr) {
    let _ = agent.proxy_hop_addr().set(addr);
    publish_host(agent).await;
}
