//! Where a machine's services are reached: host ports on loopback for a process machine,
//! an address of its own on the host's machine network ([`crate::network`]) for an image
//! machine. Both are handed out when a machine is accepted and given back when it is
//! destroyed; namespaces for addresses are set up in the background. An image machine's
//! user namespace id range is its address's ([`crate::idranges`]).

use crate::agent::{lock, Agent};
use crate::driver;
use crate::error::AgentError;
use crate::oci::OciRuntime;
use crate::record::MachineRecord;
use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::sync::Arc;

/// How many network namespaces are kept set up ahead for the next image machines.
const NETNS_AHEAD: usize = 4;

/// At start: a host that already has image machines (`used` addresses) sets its network up
/// again at once (after a reboot the bridge is gone); others wait for their first image
/// machine.
pub(crate) fn restore_machine_network(
    oci: &Result<Arc<OciRuntime>, String>,
    used: &HashSet<Ipv4Addr>,
) {
    match oci {
        Err(reason) => tracing::info!(%reason, "image machines are not available on this host"),
        Ok(_) if used.is_empty() => {}
        Ok(oci) => {
            let (network, used) = (oci.network.clone(), used.clone());
            tokio::task::spawn_blocking(move || match network.get() {
                Ok(n) => n.prepare_ahead(&used, NETNS_AHEAD),
                Err(err) => tracing::warn!(error = %err, "setting up the machine network"),
            });
        }
    }
}

impl Agent {
    /// Gives a machine what its services are reached at: host ports on loopback for a
    /// process machine, an address of its own on the machine network for an image machine
    /// (refused with the reason when this host cannot run images).
    pub(crate) fn assign_ports(&self, rec: &mut MachineRecord) -> Result<(), AgentError> {
        if rec.config.driver() == "oci" {
            let oci = self.0.driver.oci.as_ref().map_err(|reason| {
                AgentError::Invalid(format!(
                    "image {:?}: this host cannot run image machines: {reason}",
                    rec.config.image
                ))
            })?;
            {
                let mut in_use = lock(&self.0.ports_in_use);
                for p in rec.host_ports.values() {
                    in_use.remove(p);
                }
            }
            rec.host_ports.clear();
            if rec.private_ip.is_none() {
                let network = oci.network.get().map_err(|e| {
                    AgentError::Internal(format!("setting up the machine network: {e}"))
                })?;
                let mut used = lock(&self.0.addresses_in_use);
                let ip = network.allocate(&used).ok_or_else(|| {
                    AgentError::Capacity(format!(
                        "no free address left in this host's machine network {}",
                        network.subnet
                    ))
                })?;
                used.insert(ip);
                rec.private_ip = Some(ip);
                rec.uid_base = Some(
                    oci.network
                        .id_ranges
                        .range_of(ip)
                        .map_err(AgentError::Internal)?,
                );
                // Its namespace, and the next addresses', are set up meanwhile: the launch
                // usually finds them ready.
                let (network, used) = (network.clone(), used.clone());
                tokio::task::spawn_blocking(move || {
                    if let Err(err) = network.attach(ip) {
                        tracing::warn!(%ip, error = %err, "setting up a network namespace");
                    }
                    network.prepare_ahead(&used, NETNS_AHEAD);
                });
            }
            return Ok(());
        }
        let wanted: Vec<u16> = rec
            .config
            .services
            .iter()
            .map(|s| s.internal_port)
            .collect();
        rec.host_ports
            .retain(|internal, _| wanted.contains(internal));
        let mut in_use = lock(&self.0.ports_in_use);
        for internal in wanted {
            if rec.host_ports.contains_key(&internal) {
                continue;
            }
            let mut port = driver::free_port().map_err(|e| AgentError::Internal(e.to_string()))?;
            for _ in 0..16 {
                if !in_use.contains(&port) {
                    break;
                }
                port = driver::free_port().map_err(|e| AgentError::Internal(e.to_string()))?;
            }
            in_use.insert(port);
            rec.host_ports.insert(internal, port);
        }
        Ok(())
    }

    pub(crate) fn release_ports(&self, rec: &MachineRecord) {
        if let Some(ip) = rec.private_ip {
            lock(&self.0.addresses_in_use).remove(&ip);
            let network = self
                .0
                .driver
                .oci
                .as_ref()
                .ok()
                .and_then(|o| o.network.ready());
            if let Some(network) = network.cloned() {
                tokio::task::spawn_blocking(move || network.renew(ip));
            }
        }
        let mut in_use = lock(&self.0.ports_in_use);
        for p in rec.host_ports.values() {
            in_use.remove(p);
        }
    }
}
