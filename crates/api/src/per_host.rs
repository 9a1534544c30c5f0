//! Per-host machines (issue 34 item 5; Nomad's system jobs, Kubernetes' DaemonSets), without
//! a central controller: every agent runs this loop over its own catalog and looks after its
//! own host only, so no two nodes ever make a copy for the same host.
//!
//! - **Which groups.** A per-host group is an app's machines of one process group whose
//!   config has `metadata.bazaar_per_host = "true"` (`bazaar_types::per_host`); such a
//!   machine's catalog row carries its config. The first machine of a group is created as
//!   any machine is (the API, `bazaar deploy`).
//! - **When this host makes a copy.** When a group has live machines on other hosts and
//!   none (live) here, and this host meets the group's `config.placement` constraints. The
//!   copy is made from the group's newest config (the row updated last), through the normal
//!   market pinned to this host (capacity, draining and quotas respected), so a host that
//!   joins later gets its copy within a few seconds of receiving the catalog.
//! - **What this host destroys.** Only its own machines: a second copy of a group here
//!   (the lower id stays) and a copy of a group whose constraints this host no longer meets
//!   (its labels changed), both by the rule `bazaar_placement::constraints::per_host_plan`.
//!   A host that leaves takes its copy with it, a drained host destroys its copy instead of
//!   moving it (`bazaar host drain`), and a group whose machines are all destroyed is gone.
//!   A copy destroyed by hand on one host comes back while the group lives elsewhere, as a
//!   DaemonSet's pod does.

use crate::exchange::Order;
use crate::Api;
use bazaar_catalog::{HostView, MachineFilter, MachineView};
use bazaar_placement::constraints;
use bazaar_types::config::MachineConfig;
use bazaar_types::host::ClaimRequest;
use bazaar_types::per_host;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// How often the loop looks.
const PERIOD: Duration = Duration::from_millis(500);
/// After a copy is asked for (made or refused), the group is not tried again on this host
/// for this long unless the catalog shows the copy meanwhile.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// A per-host group: the app (by name and id) and the process group.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Group {
    pub app: String,
    pub app_id: String,
    pub process_group: String,
}

/// A copy this host must make.
#[derive(Debug, Clone, PartialEq)]
pub struct Copy {
    pub group: Group,
    /// The group's newest config (of the row updated last).
    pub config: MachineConfig,
}

/// What host `me` must do for the per-host groups of `machines` (current rows).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Work {
    /// Copies to make here: groups with live machines and none here, whose constraints
    /// `me`'s labels meet.
    pub copies: Vec<Copy>,
    /// Machines of this host to destroy: a second copy of a group here (the lower id
    /// stays), or a copy of a group whose constraints this host no longer meets.
    pub destroy: Vec<String>,
}

/// This host's part of every group's plan (`bazaar_placement::constraints::per_host_plan`
/// with `me` as the only host: other hosts' machines are theirs to look after).
pub fn work(me: &HostView, machines: &[MachineView]) -> Work {
    let mut groups: BTreeMap<Group, Vec<&MachineView>> = BTreeMap::new();
    for m in machines.iter().filter(|m| live(m)) {
        let group = Group {
            app: m.record.app.clone(),
            app_id: m.record.app_id.clone(),
            process_group: per_host::process_group(&m.record.metadata).to_string(),
        };
        groups.entry(group).or_default().push(m);
    }
    let mut work = Work::default();
    let host = constraints::HostView {
        host_id: &me.record.id,
        labels: &me.record.labels,
    };
    for (group, members) in groups {
        let Some(config) = members
            .iter()
            .filter_map(|m| Some((m.record.updated_at_ms, m.record.config.as_deref()?)))
            .max_by_key(|(updated, _)| *updated)
            .map(|(_, c)| c.clone())
        else {
            continue;
        };
        let rules = config
            .placement
            .as_ref()
            .map(|p| p.constraints.as_slice())
            .unwrap_or_default();
        let existing: Vec<(String, String)> = members
            .iter()
            .map(|m| (m.record.id.clone(), m.record.host_id.clone()))
            .collect();
        let plan = constraints::per_host_plan(rules, std::slice::from_ref(&host), &existing);
        work.destroy.extend(plan.destroy);
        if !plan.create_on.is_empty() {
            work.copies.push(Copy { group, config });
        }
    }
    work
}

/// A live machine of a per-host group (not destroyed or going).
fn live(m: &MachineView) -> bool {
    !m.deleted
        && !matches!(m.record.state.as_str(), "destroyed" | "destroying")
        && per_host::opted_in(&m.record.metadata)
}

/// Starts this agent's per-host loop (call once the catalog is attached).
pub fn spawn(api: Api) {
    api.0.node.clone().spawn(async move {
        let Some(catalog) = api.0.node.catalog().cloned() else {
            return;
        };
        let shutdown = api.0.node.shutdown_token();
        let me = api.0.node.host_id().to_string();
        let mut tried: HashMap<Group, Instant> = HashMap::new();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(PERIOD) => {}
            }
            let Some(host) = catalog.host(&me) else {
                continue;
            };
            if host.record.draining {
                continue;
            }
            let machines = catalog.machines_where(&MachineFilter::default(), |m| {
                per_host::opted_in(&m.metadata)
            });
            let now = Instant::now();
            tried.retain(|_, at| now.duration_since(*at) < RETRY_AFTER);
            let work = work(&host, &machines);
            for id in work.destroy {
                destroy_extra(&api, &host, &id).await;
            }
            for copy in work.copies {
                if tried.contains_key(&copy.group) {
                    continue;
                }
                tried.insert(copy.group.clone(), now);
                make_copy(&api, &host, copy).await;
            }
        }
    });
}

/// Destroys a copy this host must not run (a second one, or one whose constraints it no
/// longer meets), through its own host interface.
async fn destroy_extra(api: &Api, host: &HostView, id: &str) {
    let sent = api
        .to_node(
            reqwest::Method::DELETE,
            &host.record.api_addr,
            &format!("/host/v1/machines/{id}?force=true"),
        )
        .timeout(Duration::from_secs(10))
        .send()
        .await;
    match sent {
        Ok(r) if r.status().is_success() || r.status() == reqwest::StatusCode::NOT_FOUND => {
            tracing::info!(machine.id = %id, "per-host: destroyed a copy this host must not run");
        }
        Ok(r) => {
            tracing::warn!(machine.id = %id, status = r.status().as_u16(), "per-host: destroying a copy this host must not run")
        }
        Err(err) => {
            tracing::warn!(machine.id = %id, error = %err, "per-host: destroying a copy this host must not run")
        }
    }
}

/// Makes this host's copy of a group, through the market, pinned to this host.
async fn make_copy(api: &Api, host: &HostView, copy: Copy) {
    let Copy { group, config } = copy;
    let size = match api.0.node.validate_config(&config) {
        Ok(size) => size,
        Err(err) => {
            tracing::warn!(app = %group.app, group = %group.process_group, error = %err, "per-host: the group's config is not valid here");
            return;
        }
    };
    if let Err(err) = crate::quotas::check_machines(api, &group.app, size, 1) {
        tracing::info!(app = %group.app, group = %group.process_group, error = %err, "per-host: a quota refuses this host's copy; retrying");
        return;
    }
    let order = Order {
        app: group.app.clone(),
        template: ClaimRequest {
            app: group.app.clone(),
            app_id: group.app_id.clone(),
            name: None,
            region: None,
            config,
            skip_launch: false,
            machine_id: None,
            lease_ttl: None,
            skip_service_registration: false,
            placement: None,
            epoch: 0,
            displaced_from: None,
        },
        size,
        count: 1,
        regions: host.record.region.clone(),
        dry_run: false,
        pinned_host: Some(host.record.id.clone()),
        avoid_host: None,
    };
    match api.place(order).await {
        Ok(placed) if !placed.machines.is_empty() => tracing::info!(
            app = %group.app, group = %group.process_group,
            machine.id = %placed.machines[0].id,
            "per-host: made this host's copy"
        ),
        Ok(placed) => tracing::info!(
            app = %group.app, group = %group.process_group,
            tried = %crate::exchange::describe_attempts(&placed.record),
            "per-host: this host cannot take its copy now; retrying"
        ),
        Err(err) => tracing::info!(
            app = %group.app, group = %group.process_group, error = %err,
            "per-host: making this host's copy failed; retrying"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bazaar_catalog::{HostRecord, HostStatus, MachineRecord};
    use bazaar_types::placement_policy::{Constraint, Op, PlacementPolicy};

    fn host(id: &str, labels: &[(&str, &str)]) -> HostView {
        HostView {
            record: HostRecord {
                id: id.into(),
                region: "ams".into(),
                labels: labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..Default::default()
            },
            status: HostStatus::Alive,
            version: 1,
        }
    }

    /// A per-host machine of app `web` on `host`, in process group `group`, asking for
    /// `disk=nvme` when `constrained`; its config's `env.MARK` tells configs apart.
    fn machine(id: &str, host: &str, group: &str, updated: u64, mark: &str) -> MachineView {
        let metadata = BTreeMap::from([
            (per_host::METADATA_KEY.to_string(), "true".to_string()),
            (per_host::PROCESS_GROUP_KEY.to_string(), group.to_string()),
        ]);
        let mut config = MachineConfig {
            metadata: metadata.clone(),
            ..Default::default()
        };
        config.env.insert("MARK".into(), mark.into());
        MachineView {
            record: MachineRecord {
                id: id.into(),
                app: "web".into(),
                app_id: "app_1".into(),
                host_id: host.into(),
                state: "started".into(),
                metadata,
                updated_at_ms: updated,
                config: Some(Box::new(config)),
                ..Default::default()
            },
            host_status: "ok",
            deleted: false,
            version: 1,
        }
    }

    fn constrained(mut m: MachineView) -> MachineView {
        let config = m.record.config.as_mut().unwrap();
        config.placement = Some(PlacementPolicy {
            constraints: vec![Constraint {
                label: "disk".into(),
                op: Op::Eq,
                value: Some("nvme".into()),
            }],
            ..Default::default()
        });
        m
    }

    #[test]
    fn a_host_without_a_copy_makes_one_from_the_newest_config() {
        let machines = vec![
            machine("m1", "h1", "agent", 10, "old"),
            machine("m2", "h2", "agent", 20, "new"),
        ];
        let w = work(&host("h3", &[]), &machines);
        assert_eq!(w.copies.len(), 1);
        assert!(w.destroy.is_empty());
        assert_eq!(w.copies[0].group.process_group, "agent");
        assert_eq!(w.copies[0].group.app_id, "app_1");
        assert_eq!(w.copies[0].config.env["MARK"], "new");
        // h1 has its copy already.
        assert_eq!(work(&host("h1", &[]), &machines), Work::default());
    }

    #[test]
    fn each_process_group_is_a_group_of_its_own() {
        let machines = vec![
            machine("m1", "h1", "agent", 10, "a"),
            machine("m2", "h2", "logs", 10, "l"),
        ];
        let groups: Vec<String> = work(&host("h1", &[]), &machines)
            .copies
            .into_iter()
            .map(|c| c.group.process_group)
            .collect();
        assert_eq!(groups, ["logs"]);
    }

    #[test]
    fn only_hosts_meeting_the_constraints_copy_and_one_that_stops_meeting_them_destroys() {
        let machines = vec![constrained(machine("m1", "h1", "agent", 10, "a"))];
        assert_eq!(
            work(&host("h2", &[("disk", "hdd")]), &machines),
            Work::default()
        );
        assert_eq!(work(&host("h2", &[]), &machines), Work::default());
        assert_eq!(
            work(&host("h3", &[("disk", "nvme")]), &machines)
                .copies
                .len(),
            1
        );
        // h1 was relabelled: its copy goes; other hosts' copies are not its business.
        let w = work(&host("h1", &[("disk", "hdd")]), &machines);
        assert_eq!(w.destroy, ["m1"]);
        assert!(w.copies.is_empty());
    }

    #[test]
    fn a_second_copy_on_a_host_goes_and_the_lower_id_stays() {
        let machines = vec![
            machine("m2", "h1", "agent", 10, "a"),
            machine("m1", "h1", "agent", 10, "a"),
            machine("m3", "h2", "agent", 10, "a"),
        ];
        let w = work(&host("h1", &[]), &machines);
        assert_eq!(w.destroy, ["m2"]);
        assert!(w.copies.is_empty());
    }

    #[test]
    fn destroyed_and_going_machines_neither_count_nor_serve_as_templates() {
        let mut gone = machine("m1", "h1", "agent", 10, "a");
        gone.deleted = true;
        let mut going = machine("m2", "h2", "agent", 10, "a");
        going.record.state = "destroying".into();
        assert_eq!(work(&host("h3", &[]), &[gone, going]), Work::default());
        // A copy here that is being destroyed does not count as this host's copy.
        let mut mine = machine("m3", "h3", "agent", 10, "a");
        mine.record.state = "destroying".into();
        let other = machine("m4", "h1", "agent", 10, "a");
        assert_eq!(work(&host("h3", &[]), &[mine, other]).copies.len(), 1);
        // A machine without the opt-in is no group's.
        let mut plain = machine("m5", "h1", "agent", 10, "a");
        plain.record.metadata.remove(per_host::METADATA_KEY);
        assert_eq!(work(&host("h3", &[]), &[plain]), Work::default());
    }
}
