//! Publishing a change: this host's rows in the catalog (its host record — capacity, free
//! room, where its proxy listens — and a whole row per machine) and the live state that
//! `wait` watches.

use crate::agent::{Agent, Snapshot};
use crate::record::MachineRecord;
use crate::sync::lock;
use bazaar_types::host::Resources;
use bazaar_types::state::MachineState;
use std::collections::BTreeMap;
use tokio::sync::watch;

pub use bazaar_node::host_link::PROXY_HOP_ADDR_LABEL;

impl Agent {
    /// Attaches the catalog and publishes this host and all its machines to it (with
    /// versions above anything published before a restart).
    pub async fn attach_catalog(&self, catalog: bazaar_catalog::Catalog) {
        if self.0.catalog.set(catalog).is_err() {
            return;
        }
        self.publish_host().await;
        for m in self.0.store.machines().unwrap_or_default() {
            self.publish(&m);
        }
        for v in self.0.store.volumes().unwrap_or_default() {
            self.publish_volume(&v);
        }
    }

    /// Puts this host's machine rows in the catalog back in line with its store: a live
    /// row of a machine the store holds destroyed (or not at all) is tombstoned, a row
    /// whose state is not the machine's is published again. A restart loses publishes: a
    /// destroy that finishes while the catalog is not yet attached, or a tombstone for a
    /// row this node has not yet learned back from its peers (`delete_machine` needs the
    /// row), would leave the peers' last row live for good (found by the fault suite:
    /// `crash`). Housekeeping calls it; it copies only this host's rows.
    pub(crate) fn reconcile_catalog(&self) {
        let Some(catalog) = self.0.catalog.get() else {
            return;
        };
        let me = self.0.host_id.as_str();
        let rows = catalog.machines_where(&bazaar_catalog::MachineFilter::default(), |m| {
            m.host_id == me
        });
        for row in rows.into_iter().filter(|r| !r.deleted) {
            match self.0.store.machine(&row.record.id) {
                Ok(Some(rec)) if rec.state != MachineState::Destroyed => {
                    if row.record.state != self.current_state(&rec).as_str() {
                        self.publish(&rec);
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

    /// The catalog, once attached.
    pub fn catalog(&self) -> Option<&bazaar_catalog::Catalog> {
        self.0.catalog.get()
    }

    /// The platform this host runs gVisor machines on, if it runs them.
    fn gvisor_platform(&self) -> Option<String> {
        if self.cannot_run("gvisor").is_some() {
            return None;
        }
        let oci = self.0.driver.oci.as_ref().ok()?;
        Some(oci.gvisor.as_ref().ok()?.platform.clone())
    }

    /// The accelerator this host runs microVM machines with, if it runs them.
    fn microvm_accel(&self) -> Option<&'static str> {
        if self.cannot_run("microvm").is_some() {
            return None;
        }
        let oci = self.0.driver.oci.as_ref().ok()?;
        Some(oci.microvm.as_ref().ok()?.accel.as_str())
    }

    /// Publishes this host's record to the catalog if it changed.
    pub async fn publish_host(&self) {
        let Some(catalog) = self.0.catalog.get() else {
            return;
        };
        // Advertise capacity minus what is committed: reservations are short-lived, and
        // counting them would make a host look full to every exchange during a burst.
        let (capacity, free) = {
            let ledger = self.0.ledger.lock().await;
            let (cap, used) = (ledger.capacity(), ledger.committed());
            (
                cap,
                Resources {
                    cpus: cap.cpus.saturating_sub(used.cpus),
                    memory_mb: cap.memory_mb.saturating_sub(used.memory_mb),
                },
            )
        };
        let num_machines = self.0.actors.len() as u32;
        let disk_gb = self.disk_gb();
        let record = bazaar_catalog::HostRecord {
            id: self.0.host_id.clone(),
            region: self.0.config.region.clone(),
            api_addr: self.0.config.api_listen.to_string(),
            gossip_addr: catalog.local_addr().to_string(),
            capacity,
            free,
            num_machines,
            // The operator's labels first: the agent's own (checked not to clash) win.
            labels: self
                .0
                .config
                .labels
                .clone()
                .into_iter()
                .chain(
                    self.0
                        .proxy_addr
                        .get()
                        .map(|a| ("proxy_addr".to_string(), a.to_string())),
                )
                .chain(
                    self.0
                        .proxy_hop_addr
                        .get()
                        .map(|a| (PROXY_HOP_ADDR_LABEL.to_string(), a.to_string())),
                )
                .chain(self.0.host_link.get().map(|link| {
                    (
                        crate::host_tls::HOST_ADDR_LABEL.to_string(),
                        link.addr.to_string(),
                    )
                }))
                .chain(lock(&self.0.mesh_labels).clone())
                .chain(self.0.config.region_info.to_labels())
                .chain(
                    self.gvisor_platform()
                        .map(|p| (bazaar_types::host::GVISOR_PLATFORM_LABEL.to_string(), p)),
                )
                .chain(self.microvm_accel().map(|a| {
                    let label = bazaar_runtime::microvm::ACCEL_LABEL;
                    (label.to_string(), a.to_string())
                }))
                .chain(self.0.cannot_run.iter().map(|(driver, why)| {
                    (bazaar_types::host::cannot_run_label(driver), why.clone())
                }))
                .collect::<BTreeMap<_, _>>(),
            draining: self.0.shutdown.is_cancelled()
                || self.0.draining.load(std::sync::atomic::Ordering::SeqCst),
            disk_gb,
            disk_free_gb: disk_gb.saturating_sub(self.disk_used_gb()),
            revoked_tokens: self.0.tokens.revoked_here().into_iter().collect(),
            // Set by the catalog.
            public_key: String::new(),
            key_endorsement: String::new(),
            updated_at_ms: 0,
        };
        let mut last = lock(&self.0.last_host_record);
        if last.as_ref() != Some(&record) {
            *last = Some(record.clone());
            drop(last);
            catalog.publish_host(record);
        }
    }

    /// Records where this host's edge proxy listens and republishes the host record.
    pub async fn set_proxy_addr(&self, addr: std::net::SocketAddr) {
        let _ = self.0.proxy_addr.set(addr);
        self.publish_host().await;
    }

    /// Records the host link and republishes the host record (with `host_addr`).
    pub async fn set_host_link(&self, link: crate::host_tls::HostLink) {
        let _ = self.0.host_link.set(link);
        self.publish_host().await;
    }

    /// Records the proxy's hop listener and republishes the host record with it.
    pub async fn set_proxy_hop_addr(&self, addr: std::net::SocketAddr) {
        let _ = self.0.proxy_hop_addr.set(addr);
        self.publish_host().await;
    }

    /// Publishes a machine's state to waiters and to the catalog.
    pub(crate) fn publish(&self, rec: &MachineRecord) {
        if let Some(catalog) = self.0.catalog.get() {
            if rec.state == MachineState::Destroyed {
                catalog.delete_machine(&rec.id);
            } else {
                catalog.publish_machine(self.catalog_row(rec));
            }
        }
        let snap = Snapshot {
            state: self.current_state(rec),
            instance_id: rec.instance_id.clone(),
            event_id: rec.last_event_id.clone(),
            event_status: rec.last_event_status.clone(),
        };
        let mut live = lock(&self.0.live);
        match live.get(&rec.id) {
            Some(tx) => {
                tx.send_if_modified(|s| {
                    if *s != snap {
                        *s = snap.clone();
                        true
                    } else {
                        false
                    }
                });
            }
            None => {
                live.insert(rec.id.clone(), watch::channel(snap).0);
            }
        }
    }

    /// The catalog row of a machine.
    pub(crate) fn catalog_row(&self, rec: &MachineRecord) -> bazaar_catalog::MachineRecord {
        // A process machine's services listen on host ports on loopback; an image
        // machine's on its own address.
        let services = rec
            .config
            .services
            .iter()
            .filter_map(|svc| {
                let (address, port) = match rec.private_ip {
                    Some(ip) => (ip.to_string(), svc.internal_port),
                    None => (
                        self.0.config.api_listen.ip().to_string(),
                        *rec.host_ports.get(&svc.internal_port)?,
                    ),
                };
                Some(bazaar_catalog::ServiceRecord {
                    service: svc.clone(),
                    address,
                    port,
                })
            })
            .collect();
        bazaar_catalog::MachineRecord {
            id: rec.id.clone(),
            app: rec.app.clone(),
            app_id: rec.app_id.clone(),
            name: rec.name.clone(),
            region: rec.region.clone(),
            host_id: self.0.host_id.clone(),
            state: self.current_state(rec).to_string(),
            instance_id: rec.instance_id.clone(),
            private_ip: rec.private_ip.map(|ip| ip.to_string()),
            services,
            checks: if self.current_state(rec) == MachineState::Started {
                self.0.checks.of(&rec.id).unwrap_or_default()
            } else {
                Vec::new()
            },
            cordoned: rec.cordoned,
            metadata: rec.config.metadata.clone(),
            updated_at_ms: rec.updated_at_ms,
            epoch: rec.epoch,
            resources: rec.resources,
            config: bazaar_types::replacement::opted_in(&rec.config.metadata)
                .then(|| Box::new(rec.config.clone())),
        }
    }
}
