//! This host's part of the private network between hosts (issue 16, docs/NETWORK.md), when
//! the agent is given `--mesh-listen`: its machine network is the /22 of 10.208.0.0/12 it
//! claims ([`bazaar_mesh::plan::claim`], remembered in `DATA/mesh/prefix`), its WireGuard
//! device (`wg-<8 hex of the host id>`, key in `DATA/mesh/key`) is announced in its host
//! row (labels `mesh_key`, `mesh_endpoint`, `mesh_prefix`), and a task keeps the device's
//! peers and routes and the organization isolation rules (nftables table
//! `bazaar_mesh_<8 hex>`) in line with the catalog.

use crate::agent::Agent;
use crate::config::AgentConfig;
use bazaar_mesh::plan::{self, Prefix};
use bazaar_mesh::{firewall, keys, Mesh, MeshConfig, Peer};
use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

/// With a mesh, sets `config.machine_subnet` to this host's prefix: the one remembered in
/// `DATA/mesh/prefix`, else the one its id claims (and remembers). The claim is made
/// before the catalog is known; [`spawn`] confirms it against the fleet's claims.
pub(crate) fn with_host_prefix(
    mut config: AgentConfig,
    host_id: &str,
) -> anyhow::Result<AgentConfig> {
    if config.mesh_listen.is_none() {
        return Ok(config);
    }
    if let Some(subnet) = &config.machine_subnet {
        anyhow::bail!("--machine-subnet {subnet} and --mesh-listen: with a mesh the machine network is the host's claimed prefix");
    }
    let path = config.data_dir.join("mesh").join("prefix");
    let remembered = std::fs::read_to_string(&path)
        .ok()
        .and_then(|s| s.trim().parse::<Prefix>().ok());
    let prefix = match remembered {
        Some(p) => p,
        None => {
            let p = plan::claim(host_id, &[])
                .ok_or_else(|| anyhow::anyhow!("no prefix left in the private range"))?;
            std::fs::create_dir_all(path.parent().unwrap_or(&config.data_dir))?;
            std::fs::write(&path, format!("{p}\n"))?;
            p
        }
    };
    config.machine_subnet = Some(prefix.to_string());
    Ok(config)
}

/// Starts the mesh device and the task that keeps it in line with the catalog, if this
/// agent has a mesh. A device that cannot be made (no `/dev/net/tun`) is logged: the host
/// then runs without reaching other hosts' machines.
pub(crate) async fn spawn(agent: &Agent) {
    let config = agent.config();
    let Some(listen) = config.mesh_listen else {
        return;
    };
    let Some(mut prefix) = config
        .machine_subnet
        .as_deref()
        .and_then(|s| s.parse::<Prefix>().ok())
    else {
        return;
    };
    let Some(catalog) = agent.catalog().cloned() else {
        return;
    };
    // Confirm the claim against the fleet's before any machine gets an address.
    while catalog.catching_up() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    confirm_claim(agent, &catalog, &mut prefix);
    let hash = &crate::network::bridge_name(agent.host_id())[3..];
    let tun_name = format!("wg-{hash}");
    let table = format!("bazaar_mesh_{hash}");
    let key_path = config.data_dir.join("mesh").join("key");
    let started = tokio::task::spawn_blocking(move || -> std::io::Result<(Mesh, [u8; 32])> {
        let key = keys::load_or_create(&key_path)?;
        let mesh = Mesh::start(MeshConfig {
            tun_name,
            listen,
            private_key: key,
            range: plan::PRIVATE_RANGE,
        })?;
        // Machines' packets are routed between the bridge and the mesh device.
        std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")?;
        Ok((mesh, keys::public_key(&key)))
    })
    .await;
    let (mesh, public) = match started {
        Ok(Ok(started)) => started,
        Ok(Err(err)) => {
            tracing::warn!(error = %err, "the mesh could not start: machines of other hosts are out of reach");
            return;
        }
        Err(err) => {
            tracing::warn!(error = %err, "the mesh could not start");
            return;
        }
    };
    let announce = |prefix: Prefix| {
        *crate::sync::lock(agent.mesh_labels()) = [
            (plan::LABEL_KEY, hex::encode(public)),
            (plan::LABEL_ENDPOINT, mesh.local_addr().to_string()),
            (plan::LABEL_PREFIX, prefix.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    };
    announce(prefix);
    crate::publish::publish_host(agent).await;
    tracing::info!(%prefix, endpoint = %mesh.local_addr(), device = mesh.tun_name(), "mesh up");
    let (agent, stop) = (agent.clone(), agent.shutdown_token());
    let mesh = std::sync::Arc::new(mesh);
    agent.tracker().clone().spawn(async move {
        let mut changes = catalog.subscribe();
        let mut applied: Option<(Vec<Peer>, BTreeMap<Ipv4Addr, String>)> = None;
        loop {
            if confirm_claim(&agent, &catalog, &mut prefix) {
                let mut labels = crate::sync::lock(agent.mesh_labels()).clone();
                labels.insert(plan::LABEL_PREFIX.into(), prefix.to_string());
                *crate::sync::lock(agent.mesh_labels()) = labels;
                crate::publish::publish_host(&agent).await;
            }
            let (peers, members) = wanted(&agent, &catalog, prefix);
            if applied.as_ref() != Some(&(peers.clone(), members.clone())) {
                let (mesh, table) = (mesh.clone(), table.clone());
                let (p, m) = (peers.clone(), members.clone());
                let done = tokio::task::spawn_blocking(move || {
                    let tun = mesh.tun_name().to_string();
                    mesh.set_peers(&p)
                        .and_then(|()| firewall::apply(&table, &tun, &m))
                })
                .await;
                match done {
                    Ok(Ok(())) => applied = Some((peers, members)),
                    Ok(Err(err)) => tracing::warn!(error = %err, "updating the mesh"),
                    Err(err) => tracing::warn!(error = %err, "updating the mesh"),
                }
            }
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = changes.recv() => {
                    // Let a burst of changes settle into one update.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    while changes.try_recv().is_ok() {}
                }
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
        let _ = tokio::task::spawn_blocking(move || {
            drop(mesh);
            firewall::remove(&table);
        })
        .await;
    });
}

/// Claim-then-confirm: while a host with a lower id announces this host's prefix, this
/// host moves to the first prefix nobody announces (from its own preferred slot on),
/// remembered in `DATA/mesh/prefix`, as long as its machine network is not set up yet.
/// Answers whether it moved. A host that lost its claim after its machines got addresses
/// stays out of the mesh (its peers ignore it) and says so in its log.
fn confirm_claim(agent: &Agent, catalog: &bazaar_catalog::Catalog, prefix: &mut Prefix) -> bool {
    let claims: Vec<(String, Prefix)> = catalog
        .hosts()
        .into_iter()
        .filter(|h| h.record.id != agent.host_id())
        .filter_map(|h| {
            let p = h.record.labels.get(plan::LABEL_PREFIX)?.parse().ok()?;
            Some((h.record.id, p))
        })
        .collect();
    if !plan::loses_claim(agent.host_id(), *prefix, &claims) {
        return false;
    }
    let taken: Vec<Prefix> = claims.iter().map(|(_, p)| *p).collect();
    let Some(next) = plan::claim(agent.host_id(), &taken) else {
        tracing::error!(%prefix, "this host's mesh prefix is another's and no other is free");
        return false;
    };
    let moved = match (agent.driver().network.as_ref(), next.to_string().parse()) {
        (Some(network), Ok(subnet)) => network.reconfigure(subnet),
        _ => true,
    };
    if !moved {
        tracing::error!(%prefix, "a host with a lower id claims this host's mesh prefix, which its machines already use: its peers ignore this host (reset the host to claim another)");
        return false;
    }
    let path = agent.config().data_dir.join("mesh").join("prefix");
    if let Err(err) = std::fs::write(&path, format!("{next}\n")) {
        tracing::warn!(error = %err, "remembering the mesh prefix");
    }
    tracing::info!(from = %prefix, to = %next, "mesh prefix claimed by a host with a lower id: moved");
    *prefix = next;
    true
}

/// The peers (other hosts that are up and announce a mesh) and every machine address of
/// the fleet with its organization, as the local catalog has them.
fn wanted(
    agent: &Agent,
    catalog: &bazaar_catalog::Catalog,
    prefix: Prefix,
) -> (Vec<Peer>, BTreeMap<Ipv4Addr, String>) {
    use bazaar_catalog::HostStatus;
    let hosts = catalog.hosts();
    let peers = plan::peers(
        agent.host_id(),
        prefix,
        hosts.iter().map(|h| {
            let up = matches!(h.status, HostStatus::Alive | HostStatus::Suspect);
            (h.record.id.as_str(), &h.record.labels, up)
        }),
    );
    let orgs: BTreeMap<String, String> = catalog
        .apps()
        .into_iter()
        .map(|a| (a.name, a.org_slug))
        .collect();
    // A machine of an app that lost its name (a partition) is in its own app's
    // organization, not in the organization of the app of that name.
    let orgs_by_id: BTreeMap<String, String> = catalog
        .app_rows()
        .into_iter()
        .filter(|a| !a.id.is_empty())
        .map(|a| (a.id, a.org_slug))
        .collect();
    let members = catalog
        .machines(&bazaar_catalog::MachineFilter::default())
        .into_iter()
        .filter_map(|m| {
            let ip = m.record.private_ip.as_deref()?.parse().ok()?;
            let org = orgs_by_id
                .get(&m.record.app_id)
                .or_else(|| orgs.get(&m.record.app))?;
            Some((ip, org.clone()))
        })
        .collect();
    (peers, members)
}
