//! Displaced machines re-placed elsewhere (issue 34 item 1, docs/POLICY.md "Preemption"):
//! a machine stopped on its host for another one, by preemption or because a service took
//! back the reclaimed room it ran on, is placed again on another host when its restart
//! policy would have run it again and capacity allows. No controller: every agent runs this
//! loop over its own catalog and looks after its own host's displaced machines only, so no
//! two nodes re-place one machine.
//!
//! - **Which machines.** This host's rows that say `displaced_by` (the agent publishes it,
//!   with the config, only for a stopped machine whose config allows:
//!   `bazaar_types::replacement::re_placed_when_displaced`: restart policy `always` or
//!   `on-failure`, no volume, not per-host).
//! - **How.** Through the normal market in the machine's region, with this host left out
//!   (it just had no room), so capacity, constraints and classes hold (a `default` machine
//!   may preempt a `batch` one elsewhere; a `batch` machine never preempts). The machine
//!   keeps its id and name and is claimed with its epoch plus one; the new copy records a
//!   `replaced` event saying from where and for what. This host's stopped copy, superseded,
//!   is then destroyed by the agent's fence (`bazaar_agent::fence`), as after the guardian.
//! - **When no host has room**, the machine stays stopped here (as it was before this
//!   existed) and is tried again every [`RETRY_AFTER`]; started again here by hand, it is no
//!   longer displaced.

use crate::exchange::Order;
use crate::Api;
use bazaar_catalog::{MachineFilter, MachineView};
use bazaar_types::config::MachineConfig;
use bazaar_types::host::ClaimRequest;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How often the loop looks.
const PERIOD: Duration = Duration::from_millis(500);
/// After a re-placement was asked for (made or refused), the machine is not tried again
/// for this long unless the catalog shows the new copy meanwhile.
pub const RETRY_AFTER: Duration = Duration::from_secs(5);

/// A displaced machine of this host to place again elsewhere.
#[derive(Debug, Clone, PartialEq)]
pub struct Displaced {
    pub machine_id: String,
    pub app: String,
    pub app_id: String,
    pub name: String,
    pub region: String,
    /// The machine it was stopped for.
    pub displaced_by: String,
    /// The epoch of the new copy (one above this host's).
    pub epoch: u64,
    pub config: MachineConfig,
    pub cordoned: bool,
}

/// The machines host `me` must re-place: its own current rows that are stopped, displaced
/// and carry their config (the agent publishes both only when the config allows).
pub fn to_re_place(me: &str, machines: &[MachineView]) -> Vec<Displaced> {
    machines
        .iter()
        .filter(|m| !m.deleted && m.record.host_id == me && m.record.state == "stopped")
        .filter_map(|m| {
            let config = m.record.config.as_deref()?;
            if !bazaar_types::replacement::re_placed_when_displaced(config) {
                return None;
            }
            Some(Displaced {
                machine_id: m.record.id.clone(),
                app: m.record.app.clone(),
                app_id: m.record.app_id.clone(),
                name: m.record.name.clone(),
                region: m.record.region.clone(),
                displaced_by: m.record.displaced_by.clone()?,
                epoch: m.record.epoch + 1,
                config: config.clone(),
                cordoned: m.record.cordoned,
            })
        })
        .collect()
}

/// The `replaced` event's status on the new copy.
pub fn event_status(from_host: &str, displaced_by: &str) -> String {
    format!("re-placed from host {from_host}, where it was stopped for machine {displaced_by}")
}

/// Starts this agent's loop (call once the catalog is attached).
pub fn spawn(api: Api) {
    api.0.node.clone().spawn(async move {
        let Some(catalog) = api.0.node.catalog().cloned() else {
            return;
        };
        let me = api.0.node.host_id().to_string();
        let shutdown = api.0.node.shutdown_token();
        let mut tried: HashMap<String, Instant> = HashMap::new();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(PERIOD) => {}
            }
            let machines = catalog.machines_where(&MachineFilter::default(), |m| {
                m.host_id == me && m.displaced_by.is_some()
            });
            let now = Instant::now();
            tried.retain(|_, at| now.duration_since(*at) < RETRY_AFTER);
            for d in to_re_place(&me, &machines) {
                if tried.contains_key(&d.machine_id) {
                    continue;
                }
                tried.insert(d.machine_id.clone(), now);
                // Earlier re-placements of this round took time: still displaced here (not
                // destroyed or started again meanwhile)?
                let still = catalog
                    .machine(&d.machine_id)
                    .is_some_and(|m| !to_re_place(&me, std::slice::from_ref(&m)).is_empty());
                if still {
                    re_place(&api, &me, d).await;
                }
            }
        }
    });
}

/// Places one displaced machine again, through the market, in its region, on another host.
async fn re_place(api: &Api, me: &str, d: Displaced) {
    let size = match api.0.node.validate_config(&d.config) {
        Ok(size) => size,
        Err(err) => {
            tracing::warn!(machine.id = %d.machine_id, error = %err, "displaced: the machine's config is no longer valid");
            return;
        }
    };
    let order = Order {
        app: d.app.clone(),
        template: ClaimRequest {
            app: d.app.clone(),
            app_id: d.app_id.clone(),
            name: Some(d.name.clone()),
            region: None,
            config: d.config.clone(),
            skip_launch: false,
            machine_id: Some(d.machine_id.clone()),
            lease_ttl: None,
            skip_service_registration: d.cordoned,
            placement: None,
            epoch: d.epoch,
            displaced_from: Some(event_status(me, &d.displaced_by)),
        },
        size,
        count: 1,
        regions: d.region.clone(),
        dry_run: false,
        pinned_host: None,
        avoid_host: Some(me.to_string()),
    };
    // Held: no operation on this host's copy while it moves (a destroy acknowledged here
    // would be undone by the new copy).
    match api.0.node.hold_for_move(&d.machine_id).await {
        Ok(true) => {}
        _ => return,
    }
    let placed = api.place(order).await;
    let moved = placed.as_ref().is_ok_and(|p| !p.machines.is_empty());
    api.0.node.end_move(&d.machine_id, moved);
    match placed {
        Ok(placed) if !placed.machines.is_empty() => tracing::info!(
            machine.id = %d.machine_id, by = %d.displaced_by, to = ?placed.record.winners,
            epoch = d.epoch, "displaced machine re-placed on another host"
        ),
        Ok(placed) => tracing::info!(
            machine.id = %d.machine_id,
            tried = %crate::exchange::describe_attempts(&placed.record),
            "displaced machine: no other host has room; it stays stopped here for now"
        ),
        Err(err) => tracing::info!(
            machine.id = %d.machine_id, error = %err,
            "displaced machine: not re-placed; it stays stopped here for now"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bazaar_catalog::MachineRecord;

    fn machine(id: &str, host: &str, state: &str, by: Option<&str>, policy: &str) -> MachineView {
        let config: MachineConfig =
            serde_json::from_value(serde_json::json!({"restart": {"policy": policy}})).unwrap();
        MachineView {
            record: MachineRecord {
                id: id.into(),
                app: "jobs".into(),
                name: format!("{id}-name"),
                region: "ams".into(),
                host_id: host.into(),
                state: state.into(),
                epoch: 1,
                config: by.map(|_| Box::new(config)),
                displaced_by: by.map(str::to_string),
                ..Default::default()
            },
            host_status: "alive",
            deleted: false,
            version: 1,
        }
    }

    #[test]
    fn only_this_hosts_stopped_displaced_machines_whose_policy_restarts_them() {
        let machines = vec![
            machine("m-yes", "h1", "stopped", Some("m-critical"), "always"),
            machine("m-on-failure", "h1", "stopped", Some("m-svc"), "on-failure"),
            machine("m-no", "h1", "stopped", Some("m-critical"), "no"),
            machine("m-plain-stop", "h1", "stopped", None, "always"),
            machine("m-started", "h1", "started", Some("m-critical"), "always"),
            machine(
                "m-other-host",
                "h2",
                "stopped",
                Some("m-critical"),
                "always",
            ),
        ];
        let chosen = to_re_place("h1", &machines);
        let ids: Vec<&str> = chosen.iter().map(|d| d.machine_id.as_str()).collect();
        assert_eq!(ids, ["m-yes", "m-on-failure"]);
        assert_eq!(chosen[0].epoch, 2, "one above the displaced copy's");
        assert_eq!(chosen[0].displaced_by, "m-critical");
        let mut gone = machines[0].clone();
        gone.deleted = true;
        assert!(to_re_place("h1", &[gone]).is_empty());
    }
}
