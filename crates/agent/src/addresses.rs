//! Where a machine's services are reached: an address of its own on the host's machine
//! network ([`crate::network`]) for an image machine and for a process machine of an
//! isolating (root) agent, host ports on loopback for a process machine otherwise. Both
//! are handed out when a machine is accepted and given back when it is destroyed;
//! namespaces for addresses are set up in the background. An image machine's user namespace
//! id range is its address's ([`crate::idranges`]).

use crate::agent::{lock, Agent};
use crate::driver;
use crate::error::AgentError;
use crate::network::LazyNetwork;
use crate::record::MachineRecord;
use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::sync::Arc;

/// The machine network of this host: the image machines' one when it can run images, else
/// its own when it isolates process machines (root), else none.
pub(crate) fn machine_network(
    config: &crate::config::AgentConfig,
    host_id: &str,
    driver: &crate::driver::Driver,
) -> Option<Arc<LazyNetwork>> {
    if let Ok(oci) = &driver.oci {
        return Some(oci.network.clone());
    }
    if !driver.isolate {
        return None;
    }
    let subnet = match config.machine_subnet.as_deref().map(str::parse).transpose() {
        Ok(subnet) => subnet,
        Err(err) => {
            tracing::warn!(error = %err, "no machine network: process machines listen on host ports");
            return None;
        }
    };
    Some(Arc::new(LazyNetwork::new(
        &config.data_dir,
        host_id,
        subnet,
        config.machine_nat,
        Arc::new(crate::idranges::IdRanges::new(host_id)),
    )))
}

/// At start: a host whose machines already have addresses (`used`) sets its network up
/// again at once (after a reboot the bridge is gone); others wait for their first machine
/// that needs it.
pub(crate) fn restore_machine_network(driver: &crate::driver::Driver, used: &HashSet<Ipv4Addr>) {
    if let Err(reason) = &driver.oci {
        tracing::info!(%reason, "image machines are not available on this host");
    }
    let Some(network) = driver.network.clone() else {
        return;
    };
    if used.is_empty() {
        return;
    }
    let used = used.clone();
    tokio::task::spawn_blocking(move || match network.get() {
        Ok(n) => {
            // Namespaces of addresses no machine holds go, but for those kept ahead
            // (deleting and making one again at once races with the kernel's asynchronous
            // removal of its veth).
            let mut keep = used.clone();
            for _ in 0..crate::network::POOL_MIN {
                keep.extend(n.allocate(&keep));
            }
            crate::cleanup::remove_unused_namespaces(n, &keep);
            n.prepare_ahead(|| used.clone());
        }
        Err(err) => tracing::warn!(error = %err, "setting up the machine network"),
    });
}

impl Agent {
    /// Gives a machine what its services are reached at: an address of its own on the
    /// machine network for an image machine (refused with the reason when this host cannot
    /// run images) and for a process machine of an isolating agent; host ports on loopback
    /// for a process machine otherwise.
    pub(crate) fn assign_ports(&self, rec: &mut MachineRecord) -> Result<(), AgentError> {
        let driver = &self.0.driver;
        if rec.config.driver() == "oci" {
            driver.oci.as_ref().map_err(|reason| {
                AgentError::Invalid(format!(
                    "image {:?}: this host cannot run image machines: {reason}",
                    rec.config.image
                ))
            })?;
        }
        if let Some(network) = driver.network.as_ref().filter(|_| driver.isolate) {
            {
                let mut in_use = lock(&self.0.ports_in_use);
                for p in rec.host_ports.values() {
                    in_use.remove(p);
                }
            }
            rec.host_ports.clear();
            if rec.private_ip.is_none() {
                let network = network.get().map_err(|e| {
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
                    network
                        .id_ranges
                        .range_of(ip)
                        .map_err(AgentError::Internal)?,
                );
                network.handed_out();
                // Its namespace, and the next addresses', are set up meanwhile: the launch
                // usually finds them ready.
                let (network, agent) = (network.clone(), self.clone());
                tokio::task::spawn_blocking(move || {
                    if let Err(err) = network.attach(ip) {
                        tracing::warn!(%ip, error = %err, "setting up a network namespace");
                    }
                    network.prepare_ahead(|| lock(&agent.0.addresses_in_use).clone());
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

    /// Gives back what [`Agent::assign_ports`] and [`Agent::assign_user`] handed out.
    pub(crate) fn release_ports(&self, rec: &MachineRecord) {
        self.release_user(rec);
        if let Some(ip) = rec.private_ip {
            let network = self.0.driver.network.as_ref().and_then(|n| n.ready());
            match network.cloned() {
                // Handed out again only once its namespaces are fresh: a machine given it
                // meanwhile would find them ready, then removed under its starting init.
                Some(network) => {
                    let agent = self.clone();
                    tokio::task::spawn_blocking(move || {
                        network.renew(ip);
                        lock(&agent.0.addresses_in_use).remove(&ip);
                    });
                }
                None => {
                    lock(&self.0.addresses_in_use).remove(&ip);
                }
            }
        }
        let mut in_use = lock(&self.0.ports_in_use);
        for p in rec.host_ports.values() {
            in_use.remove(p);
        }
    }
}
