//! `/v1/apps/{app}/machines`: creates go through the market, lists come from the local
//! catalog (filled in by the owners), every machine-level call is forwarded to the host
//! that owns the machine. A machine whose host is unreachable is shown from the catalog
//! with `host_status: "unreachable"`; changing it is refused until the host returns.

use crate::error::ApiError;
use crate::exchange::{describe_attempts, HostAddr, Order};
use crate::openapi::{op, query, CarriesConfig, Checked, Ty};
use crate::Api;
use aide::transform::TransformOperation;
use axum::extract::{Path, RawQuery, State};
use axum::http::Method;
use axum::Json;
use bazaar_placement::exchange::PlacementRecord;
use bazaar_types::api::{BatchCreateResponse, MachineSummary};
use bazaar_types::config::MachineConfig;
use bazaar_types::host::{ClaimRequest, UpdateRequest};
use bazaar_types::machine::Machine;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::Serialize;
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

mod forward;
pub(crate) use forward::{forward, forwarded};

pub use bazaar_types::create_request::CreateMachineRequest;

impl CarriesConfig for CreateMachineRequest {
    fn config(&self) -> Option<&MachineConfig> {
        self.config.as_ref()
    }
}

impl CarriesConfig for UpdateRequest {
    fn config(&self) -> Option<&MachineConfig> {
        Some(&self.config)
    }
}

pub(crate) fn require_app(api: &Api, app: &str) -> Result<(), ApiError> {
    bazaar_types::ids::validate_name("app", app)
        .map_err(|_| ApiError::NotFound(format!("app {app:?} not found")))?;
    match api.catalog()?.app(app) {
        Some(_) => Ok(()),
        None => Err(ApiError::NotFound(format!("app {app} not found"))),
    }
}

fn order_for(
    api: &Api,
    app: &str,
    req: CreateMachineRequest,
    count: usize,
) -> Result<Order, ApiError> {
    let config = req
        .config
        .ok_or_else(|| ApiError::BadRequest("config is required".into()))?;
    let size = api.0.node.validate_config(&config)?;
    if let Some(p) = &config.placement {
        p.validate().map_err(ApiError::BadRequest)?;
    }
    check_standbys(api, app, &config, None)?;
    crate::quotas::check_machines(api, app, size, count)?;
    let pinned_host = match bazaar_types::volume::mount_of(&config).map_err(ApiError::BadRequest)? {
        Some(mount) => {
            if count > 1 {
                return Err(ApiError::BadRequest(
                    "a volume can be mounted by one machine only: create one machine per volume"
                        .into(),
                ));
            }
            Some(volume_host(api, app, &mount.volume)?)
        }
        None => None,
    };
    if let Some(name) = &req.name {
        bazaar_types::ids::validate_name("machine", name).map_err(ApiError::BadRequest)?;
        if count > 1 {
            return Err(ApiError::BadRequest(
                "name cannot be given when creating several machines".into(),
            ));
        }
    }
    if !(1..=1000).contains(&count) {
        return Err(ApiError::BadRequest(format!(
            "count must be between 1 and 1000, got {count}"
        )));
    }
    let local = api.0.node.config().region.clone();
    let regions = req
        .region
        .filter(|r| !r.trim().is_empty())
        .unwrap_or_else(|| format!("{local},any"));
    Ok(Order {
        app: app.to_string(),
        template: ClaimRequest {
            app: app.to_string(),
            // The app as this node's catalog has it: the machine belongs to this app, and
            // the owner refuses an app that lost its name (`bazaar_catalog`'s rule).
            app_id: api.catalog()?.app(app).map(|a| a.id).unwrap_or_default(),
            name: req.name,
            region: None,
            config,
            skip_launch: req.skip_launch,
            machine_id: None,
            lease_ttl: req.lease_ttl,
            skip_service_registration: req.skip_service_registration,
            placement: None,
            epoch: 0,
            displaced_from: None,
        },
        size,
        count,
        regions,
        dry_run: false,
        pinned_host,
        avoid_host: None,
    })
}

/// `config.standbys` must name live machines of the same app, other than the machine itself
/// (`own`, on an update): a standby of nothing would never start (400 naming the id).
pub(crate) fn check_standbys(
    api: &Api,
    app: &str,
    config: &bazaar_types::config::MachineConfig,
    own: Option<&str>,
) -> Result<(), ApiError> {
    if config.standbys.is_empty() {
        return Ok(());
    }
    let catalog = api.catalog()?;
    for id in &config.standbys {
        if own == Some(id.as_str()) {
            return Err(ApiError::BadRequest(format!(
                "config.standbys: machine {id} cannot be a standby for itself"
            )));
        }
        let known = bazaar_types::ids::is_valid_machine_id(id)
            && (catalog
                .machine_of_app(id, app)
                .is_some_and(|m| !m.deleted && m.record.state != "destroyed")
                || (catalog.machine(id).is_none() && api.recent_host(id).is_some()));
        if !known {
            return Err(ApiError::BadRequest(format!(
                "config.standbys: {id:?} is not a machine of app {app}"
            )));
        }
    }
    Ok(())
}

/// The host of a volume a new machine mounts: the volume must be of the app and free
/// (412 when another machine has it).
fn volume_host(api: &Api, app: &str, volume_id: &str) -> Result<String, ApiError> {
    let row = api
        .catalog()?
        .volume(volume_id)
        .filter(|v| !v.deleted && v.record.app == app);
    match (row, api.recent_host(volume_id)) {
        (Some(v), _) => match &v.record.attached_machine_id {
            Some(m) => Err(ApiError::Precondition(format!(
                "volume {volume_id} is already attached to machine {m}"
            ))),
            None => Ok(v.record.host_id),
        },
        (None, Some(host)) => Ok(host),
        (None, None) => Err(ApiError::NotFound(format!(
            "volume {volume_id} not found in app {app}"
        ))),
    }
}

/// `POST /v1/apps/{app}/machines`: one machine, placed by the market.
pub async fn create(
    State(api): State<Api>,
    Path(app): Path<String>,
    Checked(req): Checked<CreateMachineRequest>,
) -> Result<Json<Machine>, ApiError> {
    require_app(&api, &app)?;
    let order = order_for(&api, &app, req, 1)?;
    let placed = api.place(order.clone()).await?;
    if let Some(m) = placed.machines.into_iter().next() {
        return Ok(Json(m));
    }
    if let Some(u) = placed.unanswered.first() {
        return Err(unanswered(&app, u));
    }
    // The owner of a mounted volume refused the claim: another machine took it meanwhile.
    let attached = placed
        .record
        .rounds
        .iter()
        .flat_map(|r| &r.asked)
        .find_map(|a| match &a.outcome {
            bazaar_placement::exchange::AskOutcome::ClaimFailed { error }
                if error.contains("already attached") =>
            {
                Some(error.clone())
            }
            _ => None,
        });
    if let Some(error) = attached {
        return Err(ApiError::Precondition(error));
    }
    if let (Some(host), Some(mount)) = (
        &order.pinned_host,
        bazaar_types::volume::mount_of(&order.template.config)
            .ok()
            .flatten(),
    ) {
        return Err(ApiError::InsufficientCapacity(format!(
            "insufficient capacity: the machine mounts volume {}, which lives on host {host}, and that host cannot take {} cpu(s) / {} MB; tried: {}",
            mount.volume,
            order.size.cpus,
            order.size.memory_mb,
            describe_attempts(&placed.record)
        )));
    }
    Err(ApiError::InsufficientCapacity(format!(
        "insufficient capacity: no host in {} could take {} cpu(s) / {} MB; tried: {}",
        order.regions,
        order.size.cpus,
        order.size.memory_mb,
        describe_attempts(&placed.record)
    )))
}

/// A create whose claim got no answer: the machine may exist, so this is not a refusal
/// (a 4xx says nothing was made) but a 503 that names the machine to look for.
fn unanswered(app: &str, u: &crate::exchange::Unanswered) -> ApiError {
    ApiError::Unavailable(format!(
        "host {} did not answer the claim for machine {id}: it may have been created there; GET /v1/apps/{app}/machines/{id} tells once the host is reachable",
        u.hosts.join(", "),
        id = u.machine_id
    ))
}

pub(crate) fn create_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "MachinesCreate",
        "machines",
        "Create a machine, placed by the market.",
        &[400, 401, 403, 404, 409, 413, 422, 503],
    )
}

/// `POST /v1/apps/{app}/machines/batch` (extension): `count` machines of one config, placed
/// with batch sampling (d·count hosts asked in one round).
pub async fn create_batch(
    State(api): State<Api>,
    Path(app): Path<String>,
    Checked(req): Checked<CreateMachineRequest>,
) -> Result<Json<BatchCreateResponse<PlacementRecord>>, ApiError> {
    require_app(&api, &app)?;
    let count = req.count.unwrap_or(1);
    let order = order_for(&api, &app, req, count)?;
    let placed = api.place(order.clone()).await?;
    if let (true, Some(u)) = (placed.machines.is_empty(), placed.unanswered.first()) {
        return Err(unanswered(&app, u));
    }
    if placed.machines.is_empty() {
        return Err(ApiError::InsufficientCapacity(format!(
            "insufficient capacity: none of {count} machine(s) could be placed in {}; tried: {}",
            order.regions,
            describe_attempts(&placed.record)
        )));
    }
    Ok(Json(BatchCreateResponse {
        requested: count as u64,
        created: placed.machines.len() as u64,
        machines: placed.machines,
        placement: placed.record,
    }))
}

pub(crate) fn create_batch_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "MachinesCreateBatch",
        "machines",
        "bazaar extension: create `count` machines of one config, placed in one round \
         (maybe fewer than asked).",
        &[400, 401, 403, 404, 409, 413, 422, 503],
    )
}

/// A machine shown from the catalog only (its host did not answer).
pub(crate) fn from_catalog(v: &bazaar_catalog::MachineView) -> serde_json::Value {
    let r = &v.record;
    serde_json::json!({
        "id": r.id,
        "name": r.name,
        "state": if v.deleted { "destroyed" } else { r.state.as_str() },
        "region": r.region,
        "instance_id": r.instance_id,
        "version": r.instance_id,
        "private_ip": r.private_ip.clone().unwrap_or_else(|| "127.0.0.1".into()),
        "created_at": bazaar_types::rfc3339(r.updated_at_ms),
        "updated_at": bazaar_types::rfc3339(r.updated_at_ms),
        "config": {"metadata": r.metadata},
        "incomplete_config": true,
        "events": [],
        "checks": crate::catalog::checks(&r.checks),
        "host_status": v.host_status,
        "cordoned": r.cordoned,
        "host_id": r.host_id,
        "app": r.app,
    })
}

/// A boolean query parameter: `true`/`1` or `false`/`0`/empty; anything else is a 400
/// (found by schemathesis: `include_deleted=c` was read as false).
fn flag(name: &str, value: &str) -> Result<bool, ApiError> {
    match value {
        "true" | "1" => Ok(true),
        "false" | "0" | "" => Ok(false),
        other => Err(ApiError::BadRequest(format!(
            "{name} must be true or false, got {other:?}"
        ))),
    }
}

/// `GET /v1/apps/{app}/machines`: the catalog's list (filters `region`, `state`,
/// `include_deleted`, `metadata.KEY=VALUE`), with each machine's full object from its owner
/// unless `summary=true`, and its lease (without the nonce) with `include_leases=true`.
pub async fn list(
    State(api): State<Api>,
    Path(app): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Json<Vec<ListedMachine>>, ApiError> {
    require_app(&api, &app)?;
    let params: Vec<(String, String)> = query
        .as_deref()
        .map(|q| {
            q.split('&')
                .filter_map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                    Some((decode(k)?, decode(v)?))
                })
                .collect()
        })
        .unwrap_or_default();
    let mut filter = bazaar_catalog::MachineFilter::app(&app);
    let mut summary = false;
    let mut include_leases = false;
    let mut metadata: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in &params {
        match k.as_str() {
            "region" => filter.region = Some(v.clone()),
            "state" => filter.states.extend(
                v.split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty()),
            ),
            "include_deleted" => filter.include_deleted = flag(k, v)?,
            "summary" => summary = flag(k, v)?,
            "include_leases" => include_leases = flag(k, v)?,
            _ => {
                if let Some(key) = k.strip_prefix("metadata.") {
                    metadata.insert(key.to_string(), v.clone());
                }
            }
        }
    }
    let rows: Vec<bazaar_catalog::MachineView> = api
        .catalog()?
        .machines(&filter)
        .into_iter()
        .filter(|m| {
            metadata
                .iter()
                .all(|(k, v)| m.record.metadata.get(k) == Some(v))
        })
        .collect();
    let mut full: HashMap<String, serde_json::Value> = HashMap::new();
    if !summary {
        let mut hosts: Vec<String> = rows.iter().map(|r| r.record.host_id.clone()).collect();
        hosts.sort();
        hosts.dedup();
        let fetches = hosts.into_iter().filter_map(|h| {
            let addr = host_addr(&api, &h)?;
            let path = format!(
                "/host/v1/machines?app={app}&include_deleted={}&include_leases={include_leases}",
                filter.include_deleted
            );
            let req = api.to_node(Method::GET, &addr.api_addr, &path);
            Some(async move {
                let r = tokio::time::timeout(std::time::Duration::from_secs(2), req.send())
                    .await
                    .ok()?
                    .ok()?;
                r.json::<Vec<serde_json::Value>>().await.ok()
            })
        });
        for list in futures_util::future::join_all(fetches)
            .await
            .into_iter()
            .flatten()
        {
            for m in list {
                if let Some(id) = m["id"].as_str() {
                    full.insert(id.to_string(), m);
                }
            }
        }
    }
    let mut out = Vec::new();
    for row in &rows {
        let mut v = match full.remove(&row.record.id) {
            Some(m) if row.host_status == "ok" => m,
            _ => from_catalog(row),
        };
        v["host_status"] = serde_json::Value::String(row.host_status.to_string());
        if summary {
            if let Some(obj) = v.as_object_mut() {
                for k in [
                    "config",
                    "checks",
                    "events",
                    "host_status",
                    "nonce",
                    "incomplete_config",
                ] {
                    obj.remove(k);
                }
            }
        }
        out.push(ListedMachine(v));
    }
    Ok(Json(out))
}

pub(crate) fn list_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    let t = op(
        t,
        "MachinesList",
        "machines",
        "List an app's machines (from the catalog; each one's full object from its owner \
         unless `summary=true`). Also filters by metadata: `metadata.KEY=VALUE`.",
        &[400, 401, 404, 503],
    );
    let t = query(t, "region", Ty::Str, "Only machines in this region.");
    let t = query(
        t,
        "state",
        Ty::Str,
        "Only machines in these states (comma-separated).",
    );
    let t = query(
        t,
        "include_deleted",
        Ty::Bool,
        "Include destroyed machines.",
    );
    let t = query(
        t,
        "summary",
        Ty::Bool,
        "Leave out config, checks, events, host_status and nonce.",
    );
    query(
        t,
        "include_leases",
        Ty::Bool,
        "Show each machine's lease (without its nonce).",
    )
}

/// A machine in a list: its owner's object as the owner answered it (relayed unchanged), or
/// the catalog's view of it while the owner is down; without its config and the rest with
/// `summary=true`.
#[derive(Debug, Serialize)]
#[serde(transparent)]
pub struct ListedMachine(serde_json::Value);

impl JsonSchema for ListedMachine {
    fn schema_name() -> Cow<'static, str> {
        "ListedMachine".into()
    }

    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        let full = g.subschema_for::<Machine>();
        let summary = g.subschema_for::<MachineSummary>();
        schemars::json_schema!({
            "description": "A machine, or its summary with `summary=true`.",
            "anyOf": [full, summary],
        })
    }
}

fn decode(s: &str) -> Option<String> {
    let s = s.replace('+', " ");
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn host_addr(api: &Api, host_id: &str) -> Option<HostAddr> {
    let h = api.catalog().ok()?.host(host_id)?;
    Some(HostAddr {
        host_id: host_id.to_string(),
        api_addr: h.record.api_addr,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(private_ip: Option<&str>, services_at: Option<&str>) -> bazaar_catalog::MachineView {
        bazaar_catalog::MachineView {
            record: bazaar_catalog::MachineRecord {
                id: "0123456789abcd".into(),
                app: "web".into(),
                state: "started".into(),
                private_ip: private_ip.map(str::to_string),
                services: services_at
                    .map(|at| bazaar_catalog::ServiceRecord {
                        service: Default::default(),
                        address: at.into(),
                        port: 41000,
                    })
                    .into_iter()
                    .collect(),
                updated_at_ms: 1_700_000_000_000,
                ..Default::default()
            },
            host_status: "ok",
            deleted: false,
            version: 1,
        }
    }

    #[test]
    fn a_machine_from_the_catalog_shows_its_own_address() {
        // A machine with an address of its own and no services.
        let v = from_catalog(&row(Some("10.213.4.7"), None));
        assert_eq!(v["private_ip"], "10.213.4.7");
        let v = from_catalog(&row(Some("10.213.4.7"), Some("10.213.4.7")));
        assert_eq!(v["private_ip"], "10.213.4.7");
        // A process machine without an address of its own: its services listen on the
        // host's ports, and the host's address is not the machine's.
        let v = from_catalog(&row(None, Some("192.0.2.10")));
        assert_eq!(v["private_ip"], "127.0.0.1");
        assert_eq!(v["updated_at"], bazaar_types::rfc3339(1_700_000_000_000));
    }
}
