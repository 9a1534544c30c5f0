//! `/v1/apps/{app}/machines`: creates go through the market, lists come from the local
//! catalog (filled in by the owners), every machine-level call is forwarded to the host
//! that owns the machine. A machine whose host is unreachable is shown from the catalog
//! with `host_status: "unreachable"`; changing it is refused until the host returns.

use crate::error::ApiError;
use crate::exchange::{describe_attempts, HostAddr, Order};
use crate::openapi::{
    nonce, op, query, Body, Ndjson, NoBody, RawJson, Relayed, RelayedBody, Ty, FWD, FWD_CHANGE,
};
use crate::Api;
use aide::axum::routing::{get_with, post_with};
use aide::axum::ApiRouter;
use aide::transform::TransformOperation;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, Method, Uri};
use axum::response::{IntoResponse, NoContent, Response};
use axum::Json;
use bazaar_placement::exchange::PlacementRecord;
use bazaar_types::api::{
    BatchCreateResponse, LeaseInfoResponse, LeaseResponse, MachineSummary, MachineTraffic,
    MachineVersion, MetadataValue, OkResponse, StartResponse, StatusResponse,
};
use bazaar_types::config::MachineConfig;
use bazaar_types::event::MachineEvent;
use bazaar_types::host::{
    ClaimRequest, ExecRequest, ExecResponse, LeaseRequest, MetadataUpdate, ProcessStat,
    SignalRequest, StopRequest, UpdateRequest, WaitResponse,
};
use bazaar_types::machine::Machine;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

/// Fly's CreateMachineRequest (unknown fields are ignored); with `count`, bazaar's batch
/// create.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct CreateMachineRequest {
    /// The machine's config (required).
    #[serde(default)]
    pub config: Option<MachineConfig>,
    /// The machine's name (generated when absent).
    #[serde(default)]
    pub name: Option<String>,
    /// A region expression: `ord`, `ord,any`, ... (default: this node's region, then any).
    #[serde(default)]
    pub region: Option<String>,
    /// Create the machine without starting it.
    #[serde(default)]
    pub skip_launch: bool,
    /// Create it cordoned.
    #[serde(default)]
    pub skip_service_registration: bool,
    /// Take a lease of this many seconds on the new machine (its nonce is returned).
    #[serde(default)]
    pub lease_ttl: Option<u64>,
    /// Batch create only: how many machines (1 to 1000, default 1).
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
    Body(req): Body<CreateMachineRequest>,
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
        &[400, 401, 404, 409, 413, 503],
    )
}

/// `POST /v1/apps/{app}/machines/batch` (extension): `count` machines of one config, placed
/// with batch sampling (d·count hosts asked in one round).
pub async fn create_batch(
    State(api): State<Api>,
    Path(app): Path<String>,
    Body(req): Body<CreateMachineRequest>,
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
        &[400, 401, 404, 409, 413, 503],
    )
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
        "checks": crate::catalog::checks(&r.checks),
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
        &[401, 404, 503],
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

/// Every machine call: forwarded to the machine's owner (`/host/v1/machines/{id}...`) and
/// its answer relayed; `R` is what the owner answers when the call succeeds, `B` the body
/// it takes. `PUT` on the machine is an update, as `POST`. A `GET` of the machine while its
/// host is unreachable is answered from the catalog.
async fn forward<R, B: RelayedBody>(
    State(api): State<Api>,
    Path(params): Path<HashMap<String, String>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: B,
) -> Result<Relayed<R>, ApiError> {
    let param = |name: &str| params.get(name).cloned().unwrap_or_default();
    let (app, id) = (param("app"), param("id"));
    // `/v1/apps/{app}/machines/{id}` and what follows, as it was sent.
    let rest = match uri.path().splitn(7, '/').nth(6) {
        Some(rest) => format!("/{rest}"),
        None => String::new(),
    };
    // A key of `..` (or `%2e%2e`) would be resolved away by the URL to the owner.
    if rest
        .split('/')
        .skip(1)
        .any(|seg| matches!(decode(seg).as_deref(), None | Some("" | "." | "..")))
    {
        return Err(ApiError::NotFound("no such endpoint".into()));
    }
    let method = if method == Method::PUT && rest.is_empty() {
        Method::POST
    } else {
        method
    };
    let query = uri.query().map(str::to_string);
    let body = body.into_bytes();
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
        Ok(resp) => Ok(Relayed::new(resp)),
        Err(why) => unreachable(why).map(Relayed::new),
    }
}

/// The docs of a forwarded call that changes a machine and takes its lease's nonce.
fn change(
    id: &'static str,
    summary: &'static str,
) -> impl for<'a> FnOnce(TransformOperation<'a>) -> TransformOperation<'a> {
    move |t| nonce(op(t, id, "machines", summary, FWD_CHANGE))
}

/// The machine calls, each forwarded to the machine's owner by [`forward`] and documented
/// with what the owner answers. Only these are forwarded: another path under a machine is
/// not a route (404).
pub(crate) fn forwarded() -> ApiRouter<Api> {
    const M: &str = "/v1/apps/{app}/machines/{id}";
    ApiRouter::new()
        .api_route(
            M,
            get_with(forward::<Json<Machine>, NoBody>, |t| {
                let t = op(
                    t,
                    "MachinesShow",
                    "machines",
                    "Get a machine (from the catalog, with `host_status: unreachable`, while \
                     its host is down).",
                    FWD,
                );
                query(
                    t,
                    "include_leases",
                    Ty::Bool,
                    "Show the machine's lease (without its nonce).",
                )
            })
            .post_with(forward::<Json<Machine>, RawJson<UpdateRequest>>, |t| {
                nonce(op(
                    t,
                    "MachinesUpdate",
                    "machines",
                    "Update a machine's config (a new version). `name` renames it, `lease_ttl` \
                     takes or refreshes a lease (its nonce is answered), \
                     `skip_service_registration` cordons it; `region` must be its own (a \
                     machine does not move: 400).",
                    FWD_CHANGE,
                ))
            })
            .put_with(
                forward::<Json<Machine>, RawJson<UpdateRequest>>,
                change("MachinesUpdatePut", "Same as `POST` (update)."),
            )
            .delete_with(forward::<Json<OkResponse>, NoBody>, |t| {
                let t = op(
                    t,
                    "MachinesDelete",
                    "machines",
                    "Destroy a machine (it must be stopped unless `force`).",
                    FWD_CHANGE,
                );
                let t = query(t, "force", Ty::Bool, "Kill the machine if it runs.");
                nonce(query(t, "kill", Ty::Bool, "Same as `force`."))
            }),
        )
        .api_route(
            "/v1/apps/{app}/machines/{id}/start",
            post_with(
                forward::<Json<StartResponse>, NoBody>,
                change("MachinesStart", "Start a machine."),
            ),
        )
        .api_route(
            "/v1/apps/{app}/machines/{id}/stop",
            post_with(
                forward::<Json<OkResponse>, RawJson<StopRequest>>,
                change(
                    "MachinesStop",
                    "Stop a machine: its stop signal, then SIGKILL after the timeout.",
                ),
            ),
        )
        .api_route(
            "/v1/apps/{app}/machines/{id}/restart",
            post_with(forward::<Json<OkResponse>, RawJson<StopRequest>>, |t| {
                let t = op(
                    t,
                    "MachinesRestart",
                    "machines",
                    "Restart a machine (the signal and timeout may also be given in the query).",
                    FWD_CHANGE,
                );
                let t = query(
                    t,
                    "timeout",
                    Ty::Str,
                    "How long to wait before SIGKILL (Go duration or seconds).",
                );
                nonce(query(
                    t,
                    "signal",
                    Ty::Str,
                    "The stop signal (name or number).",
                ))
            }),
        )
        .api_route(
            "/v1/apps/{app}/machines/{id}/signal",
            post_with(
                forward::<Json<OkResponse>, RawJson<SignalRequest>>,
                change("MachinesSignal", "Send a signal to a machine's process."),
            ),
        )
        .api_route(
            "/v1/apps/{app}/machines/{id}/suspend",
            post_with(
                forward::<Json<OkResponse>, NoBody>,
                change(
                    "MachinesSuspend",
                    "Suspend a machine (its processes are frozen).",
                ),
            ),
        )
        .api_route(
            "/v1/apps/{app}/machines/{id}/wait",
            get_with(forward::<Json<WaitResponse>, NoBody>, |t| {
                let t = op(
                    t,
                    "MachinesWait",
                    "machines",
                    "Wait until a machine is in one of the given states (default `started`).",
                    &[400, 401, 404, 408, 503],
                );
                let t = query(
                    t,
                    "state",
                    Ty::Str,
                    "States to wait for: repeated or comma-separated; `settled` means any \
                     resting state.",
                );
                let t = query(
                    t,
                    "timeout",
                    Ty::Str,
                    "Seconds or a Go duration (default and maximum 60 s).",
                );
                let t = query(t, "instance_id", Ty::Str, "Wait for this version.");
                let t = query(t, "version", Ty::Str, "Same as `instance_id`.");
                query(
                    t,
                    "from_event_id",
                    Ty::Str,
                    "Wait for the state to be reached by an event after this one (an event \
                     id); the answer's `event_id` is the event that satisfied the wait.",
                )
            }),
        )
        .api_route(
            "/v1/apps/{app}/machines/{id}/lease",
            get_with(forward::<Json<LeaseInfoResponse>, NoBody>, |t| {
                op(
                    t,
                    "MachinesShowLease",
                    "leases",
                    "Get the lease held on a machine (without its nonce).",
                    FWD,
                )
            })
            .post_with(
                forward::<crate::openapi::Answer<201, LeaseResponse>, RawJson<LeaseRequest>>,
                |t| {
                    let t = op(
                        t,
                        "MachinesCreateLease",
                        "leases",
                        "Take a lease on a machine, or renew the one whose nonce is given \
                         (201: a new lease; 200: the lease, renewed).",
                        FWD_CHANGE,
                    )
                    .response::<200, Json<LeaseResponse>>();
                    let t = query(
                        t,
                        "ttl",
                        Ty::Int,
                        "Seconds (default 30); the body's `ttl` wins.",
                    );
                    nonce(t)
                },
            )
            .delete_with(forward::<Json<StatusResponse>, NoBody>, |t| {
                nonce(op(
                    t,
                    "MachinesReleaseLease",
                    "leases",
                    "Release the lease (its nonce is required).",
                    FWD_CHANGE,
                ))
            }),
        )
        .api_route(
            "/v1/apps/{app}/machines/{id}/cordon",
            post_with(
                forward::<Json<OkResponse>, NoBody>,
                change(
                    "MachinesCordon",
                    "Take a machine out of its services' rotation.",
                ),
            ),
        )
        .api_route(
            "/v1/apps/{app}/machines/{id}/uncordon",
            post_with(
                forward::<Json<OkResponse>, NoBody>,
                change(
                    "MachinesUncordon",
                    "Put a machine back into its services' rotation.",
                ),
            ),
        )
        .api_route(
            "/v1/apps/{app}/machines/{id}/metadata",
            get_with(forward::<Json<BTreeMap<String, String>>, NoBody>, |t| {
                op(
                    t,
                    "MachinesShowMetadata",
                    "metadata",
                    "A machine's metadata.",
                    FWD,
                )
            })
            .put_with(forward::<NoContent, RawJson<MetadataUpdate>>, |t| {
                nonce(op(
                    t,
                    "MachinesUpdateMetadata",
                    "metadata",
                    "Set and remove several metadata keys at once.",
                    FWD_CHANGE,
                ))
            })
            .patch_with(forward::<NoContent, RawJson<MetadataUpdate>>, |t| {
                nonce(op(
                    t,
                    "MachinesPatchMetadata",
                    "metadata",
                    "Same as `PUT`.",
                    FWD_CHANGE,
                ))
            }),
        )
        .api_route(
            "/v1/apps/{app}/machines/{id}/metadata/{key}",
            get_with(forward::<Json<MetadataValue>, NoBody>, |t| {
                op(
                    t,
                    "MachinesShowMetadataKey",
                    "metadata",
                    "One metadata value.",
                    FWD,
                )
            })
            .post_with(forward::<NoContent, RawJson<MetadataValue>>, |t| {
                nonce(op(
                    t,
                    "MachinesUpsertMetadata",
                    "metadata",
                    "Set one metadata key.",
                    FWD_CHANGE,
                ))
            })
            .delete_with(forward::<NoContent, NoBody>, |t| {
                nonce(op(
                    t,
                    "MachinesDeleteMetadata",
                    "metadata",
                    "Remove one metadata key.",
                    FWD_CHANGE,
                ))
            }),
        )
        .api_route(
            "/v1/apps/{app}/machines/{id}/events",
            get_with(forward::<Json<Vec<MachineEvent>>, NoBody>, |t| {
                let t = op(
                    t,
                    "MachinesListEvents",
                    "machines",
                    "A machine's events, newest first.",
                    FWD,
                );
                query(
                    t,
                    "limit",
                    Ty::Int,
                    "At most this many (default 20, 1 to 50).",
                )
            }),
        )
        .api_route(
            "/v1/apps/{app}/machines/{id}/versions",
            get_with(forward::<Json<Vec<MachineVersion>>, NoBody>, |t| {
                op(
                    t,
                    "MachinesListVersions",
                    "machines",
                    "A machine's config versions.",
                    FWD,
                )
            }),
        )
        .api_route(
            "/v1/apps/{app}/machines/{id}/exec",
            post_with(forward::<Json<ExecResponse>, RawJson<ExecRequest>>, |t| {
                op(
                    t,
                    "MachinesExec",
                    "machines",
                    "Run a command in a running machine and wait for it.",
                    FWD_CHANGE,
                )
            }),
        )
        .api_route(
            "/v1/apps/{app}/machines/{id}/ps",
            get_with(forward::<Json<Vec<ProcessStat>>, NoBody>, |t| {
                let t = op(
                    t,
                    "MachinesListProcesses",
                    "machines",
                    "The processes of a started machine (its workload and every descendant), \
                     read from `/proc` on its host; 409 when it is not started.",
                    &[400, 401, 404, 409, 503],
                );
                let t = query(
                    t,
                    "sort_by",
                    Ty::Str,
                    "pid (default), stime, rtime, cpu, rss or command.",
                );
                query(t, "order", Ty::Str, "asc (default) or desc.")
            }),
        )
        .api_route(
            "/v1/apps/{app}/machines/{id}/logs",
            get_with(forward::<Ndjson, NoBody>, |t| {
                let t = op(
                    t,
                    "MachinesLogs",
                    "machines",
                    "bazaar extension: the machine's output as JSON lines; with \
                     `follow=true`, a stream.",
                    &[400, 401, 404, 503],
                );
                let t = query(
                    t,
                    "max_bytes",
                    Ty::Int,
                    "The last this many bytes (default 64 KiB, at most 8 MiB).",
                );
                query(t, "follow", Ty::Bool, "Keep streaming new lines.")
            }),
        )
        .api_route(
            "/v1/apps/{app}/machines/{id}/placement",
            get_with(forward::<Json<PlacementRecord>, NoBody>, |t| {
                op(
                    t,
                    "MachinesPlacement",
                    "machines",
                    "bazaar extension: how the market placed the machine.",
                    FWD,
                )
            }),
        )
        .api_route(
            "/v1/apps/{app}/machines/{id}/traffic",
            get_with(forward::<Json<MachineTraffic>, NoBody>, |t| {
                op(
                    t,
                    "MachinesTraffic",
                    "machines",
                    "bazaar extension: the requests and connections the machine is serving \
                     right now (counted by its host's proxy, through which every proxy reaches \
                     it); deploys wait for a cordoned machine's `in_flight` to reach 0 before \
                     stopping it.",
                    FWD,
                )
            }),
        )
}
