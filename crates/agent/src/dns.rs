//! This host's internal DNS ([`bazaar_dns`], issue 16): started once the catalog is
//! attached, it answers `.internal` names from the local catalog and forwards the rest to
//! the host's resolvers. The host asks it on `config.dns_listen` (loopback); machines on
//! the machine network's gateway, port 53, as soon as the network is set up, through the
//! `resolv.conf` of [`resolv_conf`] (image machines' `/etc`, process machines' sandbox).

use crate::agent::Agent;
use std::net::{IpAddr, SocketAddr};

pub use bazaar_runtime::network::resolv_conf;

/// Starts the DNS server of this host. A listener that cannot be bound (the port taken)
/// is logged and left out: the agent runs on without it.
pub(crate) async fn spawn(agent: &Agent) {
    let Some(catalog) = agent.catalog().cloned() else {
        return;
    };
    let config = agent.config();
    let network = agent.driver().network.clone();
    let upstreams = if config.dns_upstreams.is_empty() {
        // Never forward to ourselves: the machines' gateway or the host listener.
        let mut skip: Vec<IpAddr> = config.dns_listen.iter().map(|a| a.ip()).collect();
        skip.extend(
            network
                .as_ref()
                .and_then(|n| n.ready())
                .map(|n| IpAddr::V4(n.subnet.gateway())),
        );
        let text = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
        bazaar_dns::resolv_conf_nameservers(&text, &skip)
    } else {
        config.dns_upstreams.clone()
    };
    let dns = bazaar_dns::Dns::start(
        catalog,
        agent.host_id().to_string(),
        config.region.clone(),
        upstreams,
        (agent.tracker().clone(), agent.shutdown_token()),
    );
    if let Some(addr) = config.dns_listen {
        if let Err(err) = dns.serve(addr).await {
            tracing::warn!(%addr, error = %err, "internal DNS not served to the host");
        }
    }
    if let Some(network) = network {
        let mut ready = network.watch_ready();
        let stop = agent.shutdown_token();
        agent.tracker().clone().spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => return,
                res = ready.wait_for(|up| *up) => if res.is_err() { return },
            }
            let Some(gateway) = network.ready().map(|n| n.subnet.gateway()) else {
                return;
            };
            if let Err(err) = dns.serve(SocketAddr::new(gateway.into(), 53)).await {
                tracing::warn!(%gateway, error = %err, "internal DNS not served to machines");
            }
        });
    }
}
