//! The guardian: re-placement on host death, without consensus. Fly leaves this to users
//! (standbys); Nomad and Kubernetes re-place from a central scheduler. Here every agent
//! runs this loop over its own catalog, and the rules make every node reach the same
//! answer (DESIGN.md "Re-placement on host death"):
//!
//! - **Which machines.** A machine is re-placed only if its config opted in
//!   (`metadata.bazaar_replace_on_host_failure = "true"`, `bazaar_types::replacement`),
//!   it has no volume (a volume holds state and lives on its host: never moved), it was
//!   `started` (a stopped machine keeps its desired state), and its host has been *dead*
//!   (declared by the failure detector; `left`, a clean shutdown such as an upgrade, does
//!   not count) for the agent's `replace_after` (default 60 s) as this node saw it.
//! - **Who decides.** Among the hosts of the machine's region that are not dead or left,
//!   the one with the lowest id; the others defer. If the decider dies, the next lowest
//!   takes over once it is declared dead. Two nodes whose views differ can both decide
//!   (during a partition, say): that is settled by the epochs below, not prevented.
//! - **How.** Through the normal market (bids, claim) in the machine's region, so capacity
//!   is respected, with the machine's config as its old host last published it (such a
//!   machine's catalog row carries its config). The machine keeps its id, and is claimed
//!   with its ownership **epoch** plus one.
//! - **Identity and fencing.** Of two hosts' rows for one machine id, the one with the
//!   higher epoch is the machine (then the lower host id, for two deciders that raced;
//!   `bazaar_catalog::MachineRecord::precedence`). Lists show it once, machine calls and
//!   the proxy go to its host. The old host, when it returns, never launches its copy
//!   again and destroys it (`bazaar_agent::fence`).

use crate::exchange::Order;
use crate::Api;
use bazaar_catalog::{HostStatus, HostView, MachineFilter, MachineView};
use bazaar_types::config::MachineConfig;
use bazaar_types::host::ClaimRequest;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How often the guardian looks (deaths count in seconds: the change stream is not needed,
/// and a burst of changes costs nothing here).
const PERIOD: Duration = Duration::from_millis(250);
/// After a placement (or a failed one), the machine is not tried again for this long
/// unless the catalog shows the new copy meanwhile.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// One machine to re-place.
#[derive(Debug, Clone, PartialEq)]
pub struct Replacement {
    pub machine_id: String,
    pub app: String,
    /// The id of the app the machine was made in (kept by the new copy).
    pub app_id: String,
    pub name: String,
    pub region: String,
    /// The dead host it was on.
    pub from_host: String,
    /// The epoch of the new copy (one above the dead copy's).
    pub epoch: u64,
    pub config: MachineConfig,
    pub cordoned: bool,
}

/// Whether a machine may be re-placed at all, whatever its host's state: it opted in, has
/// no volume, was started, and its row carries the config to re-create it from.
pub fn eligible(m: &MachineView) -> bool {
    !m.deleted
        && m.record.state == "started"
        && bazaar_types::replacement::opted_in(&m.record.metadata)
        && m.record
            .config
            .as_ref()
            .is_some_and(|c| c.mounts.is_empty())
}

/// The host that decides for machines of `region`: the lowest id among the region's
/// hosts that are not dead or left.
pub fn decider<'a>(hosts: &'a [HostView], region: &str) -> Option<&'a str> {
    hosts
        .iter()
        .filter(|h| h.record.region == region)
        .filter(|h| matches!(h.status, HostStatus::Alive | HostStatus::Suspect))
        .map(|h| h.record.id.as_str())
        .min()
}

/// The machines this host (`me`) must re-place now: eligible machines on hosts that have
/// been dead for at least `replace_after` (`dead_for`: how long this node has seen each
/// dead host dead), in regions where this host decides. `machines` are current rows (one
/// per id, as the catalog lists them).
pub fn to_replace(
    me: &str,
    hosts: &[HostView],
    dead_for: &HashMap<String, Duration>,
    machines: &[MachineView],
    replace_after: Duration,
) -> Vec<Replacement> {
    machines
        .iter()
        .filter(|m| eligible(m))
        .filter(|m| {
            dead_for
                .get(&m.record.host_id)
                .is_some_and(|d| *d >= replace_after)
        })
        .filter(|m| decider(hosts, &m.record.region) == Some(me))
        .filter_map(|m| {
            Some(Replacement {
                machine_id: m.record.id.clone(),
                app: m.record.app.clone(),
                app_id: m.record.app_id.clone(),
                name: m.record.name.clone(),
                region: m.record.region.clone(),
                from_host: m.record.host_id.clone(),
                epoch: m.record.epoch + 1,
                config: m.record.config.as_deref()?.clone(),
                cordoned: m.record.cordoned,
            })
        })
        .collect()
}

/// Starts this agent's guardian (call once the catalog is attached).
pub fn spawn(api: Api) {
    api.0.node.clone().spawn(async move {
        let Some(catalog) = api.0.node.catalog().cloned() else {
            return;
        };
        let replace_after = api.0.node.config().replace_after;
        let shutdown = api.0.node.shutdown_token();
        let mut dead_since: HashMap<String, Instant> = HashMap::new();
        // Machine id → (epoch tried, when): not tried again before `RETRY_AFTER`.
        let mut tried: HashMap<String, (u64, Instant)> = HashMap::new();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(PERIOD) => {}
            }
            let now = Instant::now();
            let hosts = catalog.hosts();
            dead_since.retain(|id, _| {
                hosts
                    .iter()
                    .any(|h| h.record.id == *id && h.status == HostStatus::Dead)
            });
            for h in hosts.iter().filter(|h| h.status == HostStatus::Dead) {
                dead_since.entry(h.record.id.clone()).or_insert(now);
            }
            let dead_for: HashMap<String, Duration> = dead_since
                .iter()
                .map(|(id, t)| (id.clone(), now.duration_since(*t)))
                .collect();
            if !dead_for.values().any(|d| *d >= replace_after) {
                continue;
            }
            let machines = catalog.machines_where(&MachineFilter::default(), |m| {
                m.config.is_some() && dead_for.contains_key(&m.host_id)
            });
            tried.retain(|_, (_, at)| now.duration_since(*at) < RETRY_AFTER);
            for r in to_replace(
                api.0.node.host_id(),
                &hosts,
                &dead_for,
                &machines,
                replace_after,
            ) {
                if tried.contains_key(&r.machine_id) {
                    continue;
                }
                tried.insert(r.machine_id.clone(), (r.epoch, now));
                replace(&api, r).await;
            }
        }
    });
}

/// Places one machine again, through the market, in its region.
async fn replace(api: &Api, r: Replacement) {
    let size = match api.0.node.validate_config(&r.config) {
        Ok(size) => size,
        Err(err) => {
            tracing::warn!(machine.id = %r.machine_id, error = %err, "guardian: the machine's config is no longer valid");
            return;
        }
    };
    let order = Order {
        app: r.app.clone(),
        template: ClaimRequest {
            app: r.app.clone(),
            app_id: r.app_id.clone(),
            name: Some(r.name.clone()),
            region: None,
            config: r.config.clone(),
            skip_launch: false,
            machine_id: Some(r.machine_id.clone()),
            lease_ttl: None,
            skip_service_registration: r.cordoned,
            placement: None,
            epoch: r.epoch,
            displaced_from: None,
        },
        size,
        count: 1,
        regions: r.region.clone(),
        dry_run: false,
        pinned_host: None,
        avoid_host: None,
    };
    let started = Instant::now();
    match api.place(order).await {
        Ok(placed) if !placed.machines.is_empty() => tracing::info!(
            machine.id = %r.machine_id, from = %r.from_host,
            to = ?placed.record.winners, epoch = r.epoch,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "guardian: re-placed a machine of a dead host"
        ),
        Ok(placed) => tracing::warn!(
            machine.id = %r.machine_id, from = %r.from_host,
            tried = %crate::exchange::describe_attempts(&placed.record),
            "guardian: no host could take the machine; retrying"
        ),
        Err(err) => tracing::warn!(
            machine.id = %r.machine_id, error = %err, "guardian: re-placement failed; retrying"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bazaar_catalog::{HostRecord, MachineRecord};
    use std::collections::BTreeMap;

    fn host(id: &str, region: &str, status: HostStatus) -> HostView {
        HostView {
            record: HostRecord {
                id: id.into(),
                region: region.into(),
                ..Default::default()
            },
            status,
            version: 1,
        }
    }

    fn machine(id: &str, host: &str, opted_in: bool, mounted: bool, state: &str) -> MachineView {
        let metadata = BTreeMap::from([(
            bazaar_types::replacement::METADATA_KEY.to_string(),
            opted_in.to_string(),
        )]);
        let mut config = MachineConfig {
            metadata: metadata.clone(),
            ..Default::default()
        };
        if mounted {
            config.mounts = vec![serde_json::json!({"volume": "vol_1", "path": "/data"})];
        }
        MachineView {
            record: MachineRecord {
                id: id.into(),
                app: "web".into(),
                name: format!("{id}-name"),
                region: "ams".into(),
                host_id: host.into(),
                state: state.into(),
                metadata,
                epoch: 2,
                config: opted_in.then(|| Box::new(config)),
                ..Default::default()
            },
            host_status: "unreachable",
            deleted: false,
            version: 1,
        }
    }

    fn dead(host: &str, secs: u64) -> HashMap<String, Duration> {
        HashMap::from([(host.to_string(), Duration::from_secs(secs))])
    }

    #[test]
    fn the_lowest_live_host_of_the_region_decides_and_the_next_takes_over() {
        let mut hosts = vec![
            host("h1", "ams", HostStatus::Dead),
            host("h2", "ams", HostStatus::Alive),
            host("h3", "ams", HostStatus::Suspect),
            host("h0", "ord", HostStatus::Alive),
        ];
        // h1 is dead and h0 is in another region: h2 decides; a merely suspect host
        // still counts (it may be busy), so that a blip does not make two deciders.
        assert_eq!(decider(&hosts, "ams"), Some("h2"));
        hosts[1].status = HostStatus::Dead;
        assert_eq!(decider(&hosts, "ams"), Some("h3"));
        hosts[2].status = HostStatus::Left;
        assert_eq!(decider(&hosts, "ams"), None);
        assert_eq!(decider(&hosts, "ord"), Some("h0"));
    }

    #[test]
    fn only_started_opted_in_machines_without_volumes_of_hosts_dead_long_enough() {
        let hosts = vec![
            host("h1", "ams", HostStatus::Dead),
            host("h2", "ams", HostStatus::Alive),
            host("h3", "ams", HostStatus::Alive),
        ];
        let machines = vec![
            machine("m-yes", "h1", true, false, "started"),
            machine("m-not-opted", "h1", false, false, "started"),
            machine("m-volume", "h1", true, true, "started"),
            machine("m-stopped", "h1", true, false, "stopped"),
            machine("m-live-host", "h3", true, false, "started"),
        ];
        let after = Duration::from_secs(60);
        let chosen = to_replace("h2", &hosts, &dead("h1", 61), &machines, after);
        assert_eq!(chosen.len(), 1);
        let r = &chosen[0];
        assert_eq!(
            (r.machine_id.as_str(), r.from_host.as_str(), r.epoch),
            ("m-yes", "h1", 3)
        );
        assert_eq!(r.region, "ams");
        // Not dead long enough yet.
        assert!(to_replace("h2", &hosts, &dead("h1", 59), &machines, after).is_empty());
        // h3 defers to h2.
        assert!(to_replace("h3", &hosts, &dead("h1", 61), &machines, after).is_empty());
        // A tombstone is never re-placed.
        let mut gone = machines[0].clone();
        gone.deleted = true;
        assert!(to_replace("h2", &hosts, &dead("h1", 61), &[gone], after).is_empty());
    }
}
