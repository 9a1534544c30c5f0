//! `/v1/apps/{app}/machines`: creates go through the market, lists come from the local
//! catalog (filled in by the owners), every machine-level call is forwarded to the host
//! that owns the machine. A machine whose host is unreachable is shown from the catalog
//! with `host_status: "unreachable"`; changing it is refused until the host returns.

use crate::error::ApiError;
use crate::exchange::{describe_attempts, HostAddr, Order};
use crate::{parse_body, Api};
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bazaar_types::config::MachineConfig;
use bazaar_types::host::ClaimRequest;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};

/// Fly's CreateMachineRequest (unknown fields are ignored).
#[derive(Debug, Deserialize)]
pub struct CreateMachineRequest {
    #[serde(default)]
    pub config: Option<MachineConfig>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub region: Option<String>,
    #[serde(default)]
    pub skip_launch: bool,
    #[serde(default)]
    pub skip_service_registration: bool,
    #[serde(default)]
    pub lease_ttl: Option<u64>,
    /// Batch create only: how many machines.
    #[serde(default)]
    pub count: Option<usize>,
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
            name: req.name,
            region: None,
            config,
            skip_launch: req.skip_launch,
            machine_id: None,
            lease_ttl: req.lease_ttl,
            skip_service_registration: req.skip_service_registration,
            placement: None,
            epoch: 0,
        },
        size,
        count,
        regions,
        dry_run: false,
        pinned_host,
    })
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
    body: Bytes,
) -> Result<Response, ApiError> {
    require_app(&api, &app)?;
    let req: CreateMachineRequest = parse_body(&body)?;
    let order = order_for(&api, &app, req, 1)?;
    let placed = api.place(order.clone()).await?;
    if let Some(m) = placed.machines.into_iter().next() {
        return Ok(Json(m).into_response());
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

/// `POST /v1/apps/{app}/machines/batch` (extension): `count` machines of one config, placed
/// with batch sampling (d·count hosts asked in one round).
pub async fn create_batch(
    State(api): State<Api>,
    Path(app): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    require_app(&api, &app)?;
    let req: CreateMachineRequest = parse_body(&body)?;
    let count = req.count.unwrap_or(1);
    let order = order_for(&api, &app, req, count)?;
    let placed = api.place(order.clone()).await?;
    if placed.machines.is_empty() {
        return Err(ApiError::InsufficientCapacity(format!(
            "insufficient capacity: none of {count} machine(s) could be placed in {}; tried: {}",
            order.regions,
            describe_attempts(&placed.record)
        )));
    }
    let created = placed.machines.len();
    Ok(Json(serde_json::json!({
        "machines": placed.machines,
        "requested": count,
        "created": created,
        "placement": placed.record,
    }))
    .into_response())
}

/// A machine shown from the catalog only (its host did not answer).
fn from_catalog(v: &bazaar_catalog::MachineView) -> serde_json::Value {
    let r = &v.record;
    serde_json::json!({
        "id": r.id,
        "name": r.name,
        "state": if v.deleted { "destroyed" } else { r.state.as_str() },
        "region": r.region,
        "instance_id": r.instance_id,
        "version": r.instance_id,
        "private_ip": r.services.first().map(|s| s.address.clone()).unwrap_or_else(|| "127.0.0.1".into()),
        "created_at": bazaar_types::rfc3339(r.updated_at_ms),
        "updated_at": bazaar_types::rfc3339(r.updated_at_ms),
        "config": {"metadata": r.metadata},
        "incomplete_config": true,
        "events": [],
        "checks": r.checks,
        "host_status": v.host_status,
        "cordoned": r.cordoned,
        "host_id": r.host_id,
        "app": r.app,
    })
}

/// `GET /v1/apps/{app}/machines`: the catalog's list (filters `region`, `state`,
/// `include_deleted`, `metadata.KEY=VALUE`), with each machine's full object from its owner
/// unless `summary=true`, and its lease (without the nonce) with `include_leases=true`.
pub async fn list(
    State(api): State<Api>,
    Path(app): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
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
            "include_deleted" => filter.include_deleted = v == "true" || v == "1",
            "summary" => summary = v == "true" || v == "1",
            "include_leases" => include_leases = v == "true" || v == "1",
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
        out.push(v);
    }
    Ok(Json(out).into_response())
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

/// Where a machine lives: `(host, reachable, catalog row)`.
async fn locate(
    api: &Api,
    app: &str,
    id: &str,
) -> Result<(HostAddr, Option<bazaar_catalog::MachineView>), ApiError> {
    let not_found = || ApiError::NotFound(format!("machine {id} not found"));
    if !bazaar_types::ids::is_valid_machine_id(id) {
        return Err(not_found());
    }
    let catalog = api.catalog()?;
    let mut row = catalog.machine(id);
    // Just restarted: other hosts' machines arrive with the first sync (a moment).
    while row.is_none() && api.recent_host(id).is_none() && catalog.catching_up() {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        row = catalog.machine(id);
    }
    if let Some(r) = &row {
        if r.record.app != app {
            return Err(not_found());
        }
    }
    let host_id = match (&row, api.recent_host(id)) {
        (Some(r), _) => r.record.host_id.clone(),
        (None, Some(h)) => h,
        (None, None) => return Err(not_found()),
    };
    let api_addr = api.host_addr(&host_id).await?;
    Ok((HostAddr { host_id, api_addr }, row))
}

/// `/v1/apps/{app}/machines/{id}`: get, update (POST or PUT), destroy.
pub async fn forward_root(
    State(api): State<Api>,
    Path((app, id)): Path<(String, String)>,
    method: Method,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let method = if method == Method::PUT {
        Method::POST
    } else {
        method
    };
    forward(api, app, id, String::new(), method, query, headers, body).await
}

/// `/v1/apps/{app}/machines/{id}/...`: every other machine call.
pub async fn forward_rest(
    State(api): State<Api>,
    Path((app, id, rest)): Path<(String, String, String)>,
    method: Method,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    if rest.contains("..") || rest.contains("//") {
        return Err(ApiError::NotFound("no such endpoint".into()));
    }
    forward(
        api,
        app,
        id,
        format!("/{rest}"),
        method,
        query,
        headers,
        body,
    )
    .await
}

#[allow(clippy::too_many_arguments)]
async fn forward(
    api: Api,
    app: String,
    id: String,
    rest: String,
    method: Method,
    query: Option<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let (host, row) = locate(&api, &app, &id).await?;
    let unreachable = |why: String| -> Result<Response, ApiError> {
        if method == Method::GET && rest.is_empty() {
            if let Some(row) = &row {
                let mut v = from_catalog(row);
                v["host_status"] = "unreachable".into();
                return Ok(Json(v).into_response());
            }
        }
        Err(ApiError::Unavailable(format!(
            "the host {} of machine {id} is unreachable ({why}); it cannot be changed until the host is back",
            host.host_id
        )))
    };
    let mut path = format!("/host/v1/machines/{id}{rest}");
    if let Some(q) = query.filter(|q| !q.is_empty()) {
        path.push('?');
        path.push_str(&q);
    }
    let mut req = api.to_node(method.clone(), &host.api_addr, &path);
    if let Some(n) = headers.get("fly-machine-lease-nonce") {
        req = req.header("fly-machine-lease-nonce", n);
    }
    if method != Method::GET {
        if let Some(v) = api.0.node.secrets_version_header(&app) {
            req = req.header(bazaar_node::secrets::SECRETS_VERSION_HEADER, v);
        }
    }
    if !body.is_empty() {
        req = req.header("content-type", "application/json").body(body);
    }
    match api.relay(req, &host).await? {
        Ok(resp) => Ok(resp),
        Err(why) => unreachable(why),
    }
}
