//! The host interface over HTTP/JSON, under `/host/v1` (the catalog view `/v1/catalog` is
//! the API's: `bazaar_api::catalog`), authenticated with the cluster secret only (never a Machines API token) as
//! `Authorization: Bearer <secret>` (`FlyV1 <secret>` also accepted): other nodes (API
//! forwarding, the exchange, proxies) and operators (`bazaar host`, `image`, `hosts`,
//! `status`) call it. Every error is a Fly-shaped JSON body; malformed input is a 4xx and
//! changes nothing.

use crate::agent::Agent;
use crate::error::AgentError;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use bazaar_node::access::bearer;
use bazaar_types::host::{BidRequest, ClaimRequest, SignalRequest, StopRequest, UpdateRequest};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use std::time::Duration;

/// `GET /host/v1/audit/{app}`: this host's record of changes to the app.
async fn audit_for_app(
    State(agent): State<Agent>,
    Path(app): Path<String>,
) -> Result<Json<Vec<crate::audit::AuditEntry>>, AgentError> {
    tokio::task::spawn_blocking(move || agent.audit().for_app(&app))
        .await
        .map(Json)
        .map_err(|e| AgentError::Internal(e.to_string()))
}

/// Largest request body accepted (a machine config is a few KB).
const MAX_BODY_BYTES: usize = 1024 * 1024;

/// The router of the host interface.
pub fn router(agent: Agent) -> Router {
    let host = Router::new()
        .route("/info", get(info))
        .route("/bids", post(bid))
        .route("/reservations/{id}/claim", post(claim))
        .route("/reservations/{id}", delete(release))
        .route("/machines", get(list).post(create))
        .route(
            "/machines/{id}",
            get(get_machine).post(update).delete(destroy),
        )
        .route("/machines/{id}/start", post(start))
        .route("/machines/{id}/stop", post(stop))
        .route("/machines/{id}/restart", post(restart))
        .route("/machines/{id}/signal", post(signal))
        .route("/machines/{id}/wait", get(wait))
        .route("/machines/{id}/events", get(events))
        .route("/machines/{id}/versions", get(versions))
        .route("/machines/{id}/logs", get(logs))
        .route("/machines/{id}/suspend", post(suspend))
        .route("/machines/{id}/cordon", post(cordon))
        .route("/machines/{id}/uncordon", post(uncordon))
        .route(
            "/machines/{id}/lease",
            get(lease_get).post(lease_acquire).delete(lease_release),
        )
        .route(
            "/machines/{id}/metadata",
            get(metadata_get).put(metadata_bulk).patch(metadata_bulk),
        )
        .route(
            "/machines/{id}/metadata/{key}",
            get(metadata_key_get)
                .post(metadata_key_set)
                .delete(metadata_key_delete),
        )
        .route("/machines/{id}/exec", post(exec))
        .route("/machines/{id}/ps", get(ps))
        .route("/machines/{id}/memory", get(memory_get).put(memory_set))
        .route("/machines/{id}/memory/reclaim", post(memory_reclaim))
        .route("/machines/{id}/placement", get(placement))
        .route("/volumes", get(volume_list).post(volume_create))
        .route(
            "/volumes/{id}",
            get(volume_get)
                .put(volume_update)
                .post(volume_update)
                .delete(volume_delete),
        )
        .route("/volumes/{id}/extend", put(volume_extend))
        .route(
            "/volumes/{id}/snapshots",
            get(volume_snapshots).post(volume_snapshot),
        )
        .route("/snapshots/{id}", get(snapshot_get))
        .merge(crate::images::routes())
        .route("/audit/{app}", get(audit_for_app))
        .merge(crate::ledger_dump::routes())
        .merge(crate::drain::routes())
        .merge(crate::backup::routes())
        .merge(crate::cluster_security::routes())
        .layer(middleware::from_fn_with_state(
            agent.clone(),
            crate::app_secrets::await_secrets,
        ))
        .layer(middleware::from_fn(detached))
        .layer(middleware::from_fn(refuse_newer_format))
        .layer(middleware::from_fn_with_state(
            agent.clone(),
            require_cluster_secret,
        ));
    Router::new()
        .nest("/host/v1", host)
        .route("/health", get(|| async { "ok" }))
        .fallback(|| async {
            AgentError::Invalid("no such endpoint".into())
                .into_response()
                .status(StatusCode::NOT_FOUND)
        })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::map_response(fly_shaped_errors))
        .with_state(agent)
}

/// Refuses a caller of a newer host interface format than this agent's
/// (`bazaar_types::host::check_host_format`) with 400, before anything is read.
async fn refuse_newer_format(req: Request, next: Next) -> Response {
    let header = req
        .headers()
        .get(bazaar_types::host::HOST_FORMAT_HEADER)
        .map(|v| v.to_str().unwrap_or("?"));
    match bazaar_types::host::check_host_format(header) {
        Ok(()) => next.run(req).await,
        Err(why) => AgentError::Invalid(why).into_response(),
    }
}

/// Runs a host-interface handler in a task of its own, so that a caller going away (an
/// API node that crashed, a client that timed out) cannot cancel it between its durable
/// write and what must follow (publishing the row, handing the operation to the
/// machine's actor). Found by the fault suite (`crash`): a claim cut there left a machine
/// recorded, never launched and in no catalog until the agent restarted.
async fn detached(req: Request, next: Next) -> Response {
    tokio::spawn(next.run(req)).await.unwrap_or_else(|e| {
        AgentError::Internal(format!("the request's handler failed: {e}")).into_response()
    })
}

/// Every error answer in the Fly shape, axum's own refusals included (a query that does
/// not parse, a wrong method with its `Allow` header, ...). Every HTTP interface of the
/// agent goes through it ([`crate::run_agent`]).
pub use bazaar_node::error::fly_shaped_errors;

trait WithStatus {
    fn status(self, status: StatusCode) -> Response;
}

impl WithStatus for Response {
    fn status(mut self, status: StatusCode) -> Response {
        *self.status_mut() = status;
        self
    }
}

/// The token check of the host interface and the catalog: a verified cluster certificate
/// (on the host listener, `host_tls.rs`) or the cluster secret, never an API token. No
/// token (or a wrong one) is 401; a Machines API token is 403 (it is valid, but not here).
pub async fn require_cluster_secret(
    State(agent): State<Agent>,
    req: Request,
    next: Next,
) -> Response {
    // A peer whose cluster certificate the host listener verified.
    if req
        .extensions()
        .get::<crate::host_tls::PeerHost>()
        .is_some()
    {
        return next.run(req).await;
    }
    match bearer(&req) {
        Some(t) if agent.is_cluster_secret(t) => next.run(req).await,
        Some(t) if agent.caller(t).is_ok() => AgentError::Forbidden(
            "the host interface takes the cluster secret, not an API token (operators: set BAZAAR_CLUSTER_SECRET)".into(),
        )
        .into_response(),
        _ => AgentError::Unauthorized.into_response(),
    }
}

/// Parses a JSON object body into `T` (empty is `{}`; a key given twice, or anything but
/// an object, is refused), or a 400 saying what is wrong: `bazaar_types::json`.
fn parse_body<T: DeserializeOwned>(body: &Bytes) -> Result<T, AgentError> {
    bazaar_types::json::from_body(body).map_err(AgentError::Invalid)
}

type ApiResult<T> = Result<T, AgentError>;

async fn info(State(agent): State<Agent>) -> Json<bazaar_types::host::HostInfo> {
    Json(agent.info().await)
}

async fn bid(State(agent): State<Agent>, body: Bytes) -> ApiResult<Response> {
    let req: BidRequest = parse_body(&body)?;
    Ok(Json(crate::market::bid(&agent, req).await?).into_response())
}

async fn claim(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Response> {
    let req: ClaimRequest = parse_body(&body)?;
    let machine = crate::market::claim(&agent, &id, req).await?;
    Ok((StatusCode::CREATED, Json(machine)).into_response())
}

async fn release(State(agent): State<Agent>, Path(id): Path<String>) -> ApiResult<Response> {
    crate::market::release(&agent, &id).await?;
    Ok(Json(serde_json::json!({"ok": true})).into_response())
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    app: Option<String>,
    #[serde(default)]
    include_deleted: bool,
    #[serde(default)]
    include_leases: bool,
}

async fn list(State(agent): State<Agent>, Query(q): Query<ListQuery>) -> ApiResult<Response> {
    let mut machines = agent.machines(q.app.as_deref(), q.include_deleted).await?;
    if !q.include_leases {
        machines.iter_mut().for_each(|m| m.lease = None);
    }
    Ok(Json(machines).into_response())
}

async fn create(State(agent): State<Agent>, body: Bytes) -> ApiResult<Response> {
    let req: ClaimRequest = parse_body(&body)?;
    Ok(Json(crate::market::create(&agent, req).await?).into_response())
}

#[derive(Debug, Deserialize)]
struct GetQuery {
    #[serde(default)]
    include_leases: bool,
}

/// A machine; its lease (never the nonce) only with `include_leases=true`, as on Fly.
async fn get_machine(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    Query(q): Query<GetQuery>,
) -> ApiResult<Response> {
    let mut machine = agent.machine(&id).await?;
    if !q.include_leases {
        machine.lease = None;
    }
    Ok(Json(machine).into_response())
}

#[derive(Debug, Deserialize)]
struct VolumeListQuery {
    app: Option<String>,
}

async fn volume_list(
    State(agent): State<Agent>,
    Query(q): Query<VolumeListQuery>,
) -> ApiResult<Response> {
    Ok(Json(crate::volumes::list_volumes(&agent, q.app.as_deref())?).into_response())
}

async fn volume_create(State(agent): State<Agent>, body: Bytes) -> ApiResult<Response> {
    let req: bazaar_types::volume::HostVolumeCreate = parse_body(&body)?;
    Ok(Json(crate::volumes::create_volume(&agent, req).await?).into_response())
}

async fn volume_get(State(agent): State<Agent>, Path(id): Path<String>) -> ApiResult<Response> {
    Ok(Json(crate::volumes::get_volume(&agent, &id)?).into_response())
}

async fn volume_update(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Response> {
    let req: bazaar_types::volume::UpdateVolumeRequest = parse_body(&body)?;
    Ok(Json(crate::volumes::update_volume(&agent, &id, req).await?).into_response())
}

async fn volume_extend(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Response> {
    let req: bazaar_types::volume::ExtendVolumeRequest = parse_body(&body)?;
    let size_gb = req
        .size_gb
        .ok_or_else(|| AgentError::Invalid("size_gb is required".into()))?;
    let volume = crate::volumes::extend_volume(&agent, &id, size_gb).await?;
    Ok(Json(bazaar_types::volume::ExtendVolumeResponse {
        volume,
        needs_restart: false,
    })
    .into_response())
}

async fn volume_delete(State(agent): State<Agent>, Path(id): Path<String>) -> ApiResult<Response> {
    Ok(Json(crate::volumes::delete_volume(&agent, &id).await?).into_response())
}

async fn volume_snapshots(
    State(agent): State<Agent>,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    Ok(Json(crate::snapshots::volume_snapshots(&agent, &id)?).into_response())
}

async fn volume_snapshot(
    State(agent): State<Agent>,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    Ok(Json(crate::snapshots::snapshot_volume(&agent, &id).await?).into_response())
}

async fn snapshot_get(State(agent): State<Agent>, Path(id): Path<String>) -> ApiResult<Response> {
    Ok(Json(crate::snapshots::snapshot(&agent, &id)?).into_response())
}

/// The lease nonce a client sent, if any.
pub const NONCE_HEADER: &str = "fly-machine-lease-nonce";

fn nonce(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(NONCE_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
}

async fn update(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let req: UpdateRequest = parse_body(&body)?;
    Ok(
        Json(crate::operations::update_machine(&agent, &id, req, nonce(&headers)).await?)
            .into_response(),
    )
}

#[derive(Debug, Deserialize)]
struct DestroyQuery {
    force: Option<String>,
    kill: Option<String>,
}

fn truthy(v: &Option<String>) -> Result<bool, AgentError> {
    match v.as_deref() {
        None | Some("false") | Some("0") => Ok(false),
        Some("true") | Some("1") | Some("") => Ok(true),
        Some(other) => Err(AgentError::Invalid(format!(
            "expected true or false, got {other:?}"
        ))),
    }
}

async fn destroy(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    Query(q): Query<DestroyQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let force = truthy(&q.force)? || truthy(&q.kill)?;
    crate::operations::destroy_machine(&agent, &id, force, nonce(&headers)).await?;
    Ok(Json(serde_json::json!({"ok": true})).into_response())
}

async fn start(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let before = agent.machine(&id).await?.state;
    crate::operations::start_machine(&agent, &id, nonce(&headers)).await?;
    Ok(
        Json(serde_json::json!({"previous_state": before, "migrated": false, "new_host": ""}))
            .into_response(),
    )
}

async fn stop(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let req: StopRequest = parse_body(&body)?;
    crate::operations::stop_machine(&agent, &id, req, nonce(&headers)).await?;
    Ok(Json(serde_json::json!({"ok": true})).into_response())
}

#[derive(Debug, Deserialize)]
struct RestartQuery {
    timeout: Option<String>,
    signal: Option<String>,
}

async fn restart(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    Query(q): Query<RestartQuery>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let mut req: StopRequest = parse_body(&body)?;
    // fly-go sends these in the query.
    if let Some(t) = &q.timeout {
        let d = bazaar_types::duration::parse_go_duration(t)
            .map_err(|e| AgentError::Invalid(format!("invalid timeout: {e}")))?;
        req.timeout = Some(bazaar_types::duration::GoDuration(d));
    }
    if let Some(sig) = &q.signal {
        req.signal = Some(bazaar_types::signal::Signal::parse(sig).map_err(AgentError::Invalid)?);
    }
    crate::operations::restart_machine(&agent, &id, req, nonce(&headers)).await?;
    Ok(Json(serde_json::json!({"ok": true})).into_response())
}

async fn signal(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let req: SignalRequest = parse_body(&body)?;
    crate::operations::signal_machine(&agent, &id, req.signal, nonce(&headers)).await?;
    Ok(Json(serde_json::json!({"ok": true})).into_response())
}

/// `GET .../wait`: its query is read by [`crate::views::WaitQuery::parse`].
async fn wait(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    Query(params): Query<Vec<(String, String)>>,
) -> ApiResult<Response> {
    let q = crate::views::WaitQuery::parse(&params)?;
    Ok(Json(
        agent
            .wait(
                &id,
                &q.states,
                q.timeout,
                q.version.as_deref(),
                q.from_event_id.as_deref(),
            )
            .await?,
    )
    .into_response())
}

#[derive(Debug, Deserialize)]
struct EventsQuery {
    limit: Option<usize>,
}

async fn events(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    Query(q): Query<EventsQuery>,
) -> ApiResult<Response> {
    let limit = q.limit.unwrap_or(20).clamp(1, 50);
    Ok(Json(agent.events(&id, limit).await?).into_response())
}

async fn versions(State(agent): State<Agent>, Path(id): Path<String>) -> ApiResult<Response> {
    let v: Vec<serde_json::Value> = agent
        .versions(&id)
        .await?
        .into_iter()
        .map(|(version, config)| serde_json::json!({"version": version, "user_config": config}))
        .collect();
    Ok(Json(v).into_response())
}

#[derive(Debug, Deserialize)]
struct LogsQuery {
    max_bytes: Option<u64>,
    follow: Option<String>,
}

/// The machine's output as JSON lines; with `follow=true`, keeps streaming new lines (the
/// file is polled; rotation is followed) until the client goes away or the machine is
/// destroyed.
async fn logs(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    Query(q): Query<LogsQuery>,
) -> ApiResult<Response> {
    let text = agent
        .log_tail(&id, q.max_bytes.unwrap_or(64 * 1024).min(8 * 1024 * 1024))
        .await?;
    let headers = [(axum::http::header::CONTENT_TYPE, "application/x-ndjson")];
    if !truthy(&q.follow)? {
        return Ok((headers, text).into_response());
    }
    let path = crate::leases::log_path(&agent, &id);
    let start = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let first =
        futures_util::stream::once(async move { Ok::<_, std::io::Error>(Bytes::from(text)) });
    let rest = futures_util::stream::unfold((path, start), |(path, mut pos)| async move {
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let len = match std::fs::metadata(&path) {
                Ok(m) => m.len(),
                // The machine was destroyed: end the stream.
                Err(_) => return None,
            };
            if len < pos {
                pos = 0; // rotated
            }
            if len > pos {
                let data = read_range(&path, pos, len).unwrap_or_default();
                pos = len;
                return Some((Ok(Bytes::from(data)), (path, pos)));
            }
        }
    });
    let body = axum::body::Body::from_stream(futures_util::StreamExt::chain(first, rest));
    Ok((headers, body).into_response())
}

fn read_range(path: &std::path::Path, from: u64, to: u64) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path)?;
    f.seek(SeekFrom::Start(from))?;
    let mut buf = vec![0u8; (to - from).min(8 * 1024 * 1024) as usize];
    f.read_exact(&mut buf)?;
    Ok(buf)
}

async fn suspend(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    crate::operations::suspend_machine(&agent, &id, nonce(&headers)).await?;
    Ok(Json(serde_json::json!({"ok": true})).into_response())
}

async fn cordon(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    crate::leases::cordon(&agent, &id, true, nonce(&headers)).await?;
    Ok(Json(serde_json::json!({"ok": true})).into_response())
}

async fn uncordon(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    crate::leases::cordon(&agent, &id, false, nonce(&headers)).await?;
    Ok(Json(serde_json::json!({"ok": true})).into_response())
}

#[derive(Debug, Deserialize)]
struct LeaseQuery {
    ttl: Option<u64>,
}

/// Leases answer in the wrapped form fly-go expects: `{"status": "success", "data": lease}`.
fn wrapped(lease: &impl serde::Serialize) -> serde_json::Value {
    serde_json::json!({"status": "success", "data": lease})
}

async fn lease_acquire(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    Query(q): Query<LeaseQuery>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let req: bazaar_types::host::LeaseRequest = parse_body(&body)?;
    let ttl = req.ttl.or(q.ttl).unwrap_or(30);
    let (lease, created) = crate::leases::lease_acquire(
        &agent,
        &id,
        ttl,
        req.description.as_deref().unwrap_or(""),
        nonce(&headers),
    )
    .await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(wrapped(&lease))).into_response())
}

/// The lease held, with its nonce: the host interface answers only hosts and operators, and
/// the API leaves the nonce out for a caller whose token may not use leases.
async fn lease_get(State(agent): State<Agent>, Path(id): Path<String>) -> ApiResult<Response> {
    match crate::leases::lease_get(&agent, &id).await? {
        Some(lease) => Ok(Json(wrapped(&lease)).into_response()),
        None => Err(AgentError::LeaseNotFound(id)),
    }
}

async fn lease_release(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    crate::leases::lease_release(&agent, &id, nonce(&headers)).await?;
    Ok(Json(serde_json::json!({"status": "success"})).into_response())
}

async fn metadata_get(State(agent): State<Agent>, Path(id): Path<String>) -> ApiResult<Response> {
    Ok(Json(crate::leases::metadata(&agent, &id).await?).into_response())
}

async fn metadata_key_get(
    State(agent): State<Agent>,
    Path((id, key)): Path<(String, String)>,
) -> ApiResult<Response> {
    match crate::leases::metadata(&agent, &id).await?.get(&key) {
        Some(v) => Ok(Json(serde_json::json!({"value": v})).into_response()),
        None => Err(AgentError::MetadataNotFound(key)),
    }
}

#[derive(Debug, Deserialize)]
struct MetadataValue {
    value: String,
}

async fn metadata_key_set(
    State(agent): State<Agent>,
    Path((id, key)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let v: MetadataValue = parse_body(&body)?;
    let changes = std::iter::once((key, Some(v.value))).collect();
    crate::leases::metadata_update(&agent, &id, changes, None, nonce(&headers)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn metadata_key_delete(
    State(agent): State<Agent>,
    Path((id, key)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    if !crate::leases::metadata(&agent, &id)
        .await?
        .contains_key(&key)
    {
        return Err(AgentError::MetadataNotFound(key));
    }
    let changes = std::iter::once((key, None)).collect();
    crate::leases::metadata_update(&agent, &id, changes, None, nonce(&headers)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn metadata_bulk(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let req: bazaar_types::host::MetadataUpdate = parse_body(&body)?;
    crate::leases::metadata_update(
        &agent,
        &id,
        req.metadata,
        req.machine_version.as_deref(),
        nonce(&headers),
    )
    .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Debug, Deserialize)]
struct PsQuery {
    sort_by: Option<String>,
    order: Option<String>,
}

async fn ps(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    Query(q): Query<PsQuery>,
) -> ApiResult<Response> {
    let sort = crate::ps::Sort::parse(q.sort_by.as_deref(), q.order.as_deref())?;
    Ok(Json(crate::ps::ps(&agent, &id, sort).await?).into_response())
}

async fn memory_get(State(agent): State<Agent>, Path(id): Path<String>) -> ApiResult<Response> {
    Ok(Json(crate::memory::machine_memory(&agent, &id).await?).into_response())
}

async fn memory_set(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Response> {
    let req: bazaar_types::api::MemoryLimitRequest = parse_body(&body)?;
    Ok(Json(crate::memory::set_machine_memory(&agent, &id, req.limit_mb).await?).into_response())
}

async fn memory_reclaim(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Response> {
    let req: bazaar_types::api::ReclaimMemoryRequest = parse_body(&body)?;
    Ok(
        Json(crate::memory::reclaim_machine_memory(&agent, &id, req.amount_mb).await?)
            .into_response(),
    )
}

async fn exec(
    State(agent): State<Agent>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Response> {
    let req: bazaar_types::host::ExecRequest = parse_body(&body)?;
    Ok(Json(crate::leases::exec(&agent, &id, req).await?).into_response())
}

async fn placement(State(agent): State<Agent>, Path(id): Path<String>) -> ApiResult<Response> {
    match crate::leases::placement(&agent, &id).await? {
        Some(p) => Ok(Json(p).into_response()),
        None => Err(AgentError::NotFound(format!(
            "machine {id} was created directly on its host, not through the market: no placement record"
        ))),
    }
}
