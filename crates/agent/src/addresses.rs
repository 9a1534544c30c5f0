//! Where a machine's services are reached: an address of its own on the host's machine
//! network ([`crate::network`]) for an image machine and for a process machine of an
//! isolating (root) agent, host ports on loopback for a process machine otherwise. Both
//! are handed out when a machine is accepted and given back when it is destroyed;
//! namespaces for addresses are set up in the background. An image machine's user namespace
//! id range is its address's ([`crate::idranges`]).
//!
//! `Addresses` is the agent's part that holds what is handed out: host ports, machine
//! network addresses and process machines' uids (claimed machine-wide:
//! [`crate::uid_claims`]).

use crate::driver::{self, Driver};
use crate::error::AgentError;
use crate::network::LazyNetwork;
use crate::record::MachineRecord;
use crate::sync::lock;
use crate::uid_claims::UidClaims;
use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

/// The machine network of this host: the image machines' one when it can run images, else
/// its own when it isolates process machines (root), else none.
pub(crate) fn machine_network(
    config: &crate::config::AgentConfig,
    host_id: &str,
    driver: &Driver,
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
pub(crate) fn restore_machine_network(driver: &Driver, used: &HashSet<Ipv4Addr>) {
    // (Why image machines cannot run here, if they cannot, `runnable` said at start.)
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
                keep.extend(n.allocate(&keep).ok());
            }
            crate::cleanup::remove_unused_namespaces(n, &keep);
            n.prepare_ahead(|| used.clone());
        }
        Err(err) => tracing::warn!(error = %err, "setting up the machine network"),
    });
}

/// What this host's machines hold: host ports, machine network addresses, uids.
#[derive(Debug, Default)]
pub(crate) struct Addresses {
    ports: Mutex<HashSet<u16>>,
    /// Machine network addresses (shared with the background namespace set-up).
    ips: Arc<Mutex<HashSet<Ipv4Addr>>>,
    /// Uids held by this host's process machines ([`crate::identity`]).
    pub(crate) uids: Mutex<HashSet<u32>>,
    /// Their machine-wide claims, when machines get uids of their own (a root agent that
    /// isolates).
    pub(crate) uid_claims: Option<UidClaims>,
}

impl Addresses {
    /// What the machines of a store already hold, at start; `uid_claims` holds their uids'
    /// claims (made again here).
    pub(crate) fn restore(
        ports: HashSet<u16>,
        ips: HashSet<Ipv4Addr>,
        uids: HashMap<u32, String>,
        uid_claims: Option<UidClaims>,
    ) -> Self {
        if let Some(claims) = &uid_claims {
            claims.restore(uids.iter().map(|(uid, id)| (*uid, id.as_str())));
        }
        Addresses {
            ports: Mutex::new(ports),
            ips: Arc::new(Mutex::new(ips)),
            uids: Mutex::new(uids.into_keys().collect()),
            uid_claims,
        }
    }

    /// Gives a machine what its services are reached at: an address of its own on the
    /// machine network for an image machine (refused with the reason when this host cannot
    /// run images) and for a process machine of an isolating agent; host ports on loopback
    /// for a process machine otherwise.
    pub(crate) fn assign(
        &self,
        driver: &Driver,
        rec: &mut MachineRecord,
    ) -> Result<(), AgentError> {
        if rec.config.runs_image() {
            driver.oci.as_ref().map_err(|reason| {
                AgentError::Invalid(format!(
                    "image {:?}: this host cannot run image machines: {reason}",
                    rec.config.image
                ))
            })?;
        }
        if let Some(network) = driver.network.as_ref().filter(|_| driver.isolate) {
            {
                let mut in_use = lock(&self.ports);
                for p in rec.host_ports.values() {
                    in_use.remove(p);
                }
            }
            rec.host_ports.clear();
            if rec.private_ip.is_none() {
                let network = network.get().map_err(|e| {
                    AgentError::Internal(format!("setting up the machine network: {e}"))
                })?;
                let mut used = lock(&self.ips);
                let ip = network.allocate(&used).map_err(AgentError::Capacity)?;
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
                let (network, ips) = (network.clone(), self.ips.clone());
                tokio::task::spawn_blocking(move || {
                    if let Err(err) = network.attach(ip) {
                        tracing::warn!(%ip, error = %err, "setting up a network namespace");
                    }
                    network.prepare_ahead(|| lock(&ips).clone());
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
        let mut in_use = lock(&self.ports);
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

    /// Why the next machine would get no address, if it would not: the machine network of
    /// an isolating host is full, every address of its subnet held
    /// ([`LazyNetwork::check_room`]). The host then bids for nothing and says so in its
    /// record, so the exchange goes elsewhere.
    pub(crate) fn network_full(&self, driver: &Driver) -> Option<String> {
        let network = driver.network.as_ref().filter(|_| driver.isolate)?;
        network.check_room(lock(&self.ips).len()).err()
    }

    /// Gives back the address and host ports [`Addresses::assign`] handed out.
    pub(crate) fn release(&self, driver: &Driver, rec: &MachineRecord) {
        if let Some(ip) = rec.private_ip {
            let network = driver.network.as_ref().and_then(|n| n.ready());
            match network.cloned() {
                // Handed out again only once its namespaces are fresh: a machine given it
                // meanwhile would find them ready, then removed under its starting init.
                Some(network) => {
                    let ips = Arc::clone(&self.ips);
                    tokio::task::spawn_blocking(move || {
                        network.renew(ip);
                        lock(&ips).remove(&ip);
                    });
                }
                None => {
                    lock(&self.ips).remove(&ip);
                }
            }
        }
        self.release_ports(rec.host_ports.values());
    }

    /// Gives back host ports.
    pub(crate) fn release_ports<'a>(&self, ports: impl IntoIterator<Item = &'a u16>) {
        let mut in_use = lock(&self.ports);
        for p in ports {
            in_use.remove(p);
        }
    }
}
