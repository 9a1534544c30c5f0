//! `/v1/apps/{app}/volumes`: creates go through the market (hosts ranked from the local
//! catalog by [`bazaar_placement::volume`], each asked in turn until one accepts from its
//! exact state), lists come from the local catalog, every call on one volume (snapshots
//! included) is forwarded to the host that owns it. A machine that mounts a volume is pinned
//! to that host ([`crate::machines`]).
//!
//! Restores (`snapshot_id`) and forks (`source_volume_id`) are made on the host that holds
//! the source (Fly may fork onto another host; here the data never leaves its host), found
//! for a snapshot by asking every host, for a volume from the catalog.

use crate::error::ApiError;
use crate::exchange::{HostAddr, HostCallError};
use crate::machines::require_app;
use crate::openapi::{op, Body, RawJson, Relayed};
use crate::Api;
use aide::transform::TransformOperation;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bazaar_placement::exchange::parse_regions;
use bazaar_placement::volume::{volume_candidates, VolumeCandidate, VolumeRequest};
use bazaar_types::host::Resources;
use bazaar_types::volume::{
    is_valid_snapshot_id, is_valid_volume_id, new_volume_id, validate_size_gb,
    validate_volume_name, CreateVolumeRequest, ExtendVolumeRequest, ExtendVolumeResponse,
    HostSnapshot, HostVolumeCreate, UpdateVolumeRequest, Volume, VolumeSnapshot, VolumeSource,
    BLOCK_SIZE, DEFAULT_SIZE_GB, NO_ENCRYPTION,
};

/// A volume shown from the catalog (lists, and gets while its host does not answer).
pub(crate) fn from_catalog(v: &bazaar_catalog::VolumeView) -> Volume {
    let r = &v.record;
    let blocks = r.size_gb * 1024 * 1024 * 1024 / BLOCK_SIZE;
    Volume {
        id: r.id.clone(),
        name: r.name.clone(),
        state: r.state.clone(),
        size_gb: r.size_gb,
        region: r.region.clone(),
        zone: r.host_id.clone(),
        encrypted: r.encrypted,
        attached_machine_id: r.attached_machine_id.clone(),
        attached_alloc_id: r.attached_machine_id.clone(),
        created_at: bazaar_types::rfc3339(r.created_at_ms),
        host_status: v.host_status.to_string(),
        fstype: r.fstype.clone(),
        block_size: BLOCK_SIZE,
        blocks,
        blocks_free: blocks,
        blocks_avail: blocks,
        bytes_total: r.size_gb * 1024 * 1024 * 1024,
        bytes_used: 0,
        snapshot_retention: r.snapshot_retention,
        auto_backup_enabled: r.auto_backup_enabled,
        kind: "local".into(),
        host_id: r.host_id.clone(),
    }
}

/// Checks a create request and turns it into what each host is asked (less the id).
fn host_request(app: &str, req: &CreateVolumeRequest) -> Result<HostVolumeCreate, ApiError> {
    validate_volume_name(&req.name).map_err(ApiError::BadRequest)?;
    let size_gb = req.size_gb.unwrap_or(DEFAULT_SIZE_GB);
    validate_size_gb(size_gb).map_err(ApiError::BadRequest)?;
    if let Some(fstype) = req.fstype.as_deref() {
        if fstype != "ext4" {
            return Err(ApiError::BadRequest(format!(
                "fstype {fstype:?} is not supported: volumes are ext4"
            )));
        }
    }
    if req.encrypted == Some(true) {
        return Err(ApiError::BadRequest(NO_ENCRYPTION.into()));
    }
    let snapshot_retention = req.snapshot_retention.unwrap_or(5);
    if !(1..=60).contains(&snapshot_retention) {
        return Err(ApiError::BadRequest(format!(
            "snapshot_retention must be between 1 and 60 days, got {snapshot_retention}"
        )));
    }
    let compute = match &req.compute {
        Some(guest) => {
            bazaar_types::config_fields::check_guest(guest, "compute")
                .map_err(ApiError::BadRequest)?;
            Some(Resources::from(guest.validate().map_err(|e| {
                ApiError::BadRequest(format!("compute: {e}"))
            })?))
        }
        None => None,
    };
    Ok(HostVolumeCreate {
        id: String::new(),
        app: app.to_string(),
        name: req.name.clone(),
        size_gb,
        encrypted: false,
        require_unique_zone: req.require_unique_zone.unwrap_or(true),
        compute,
        snapshot_retention,
        auto_backup_enabled: req.auto_backup_enabled.unwrap_or(false),
        source: None,
    })
}

/// `POST /v1/apps/{app}/volumes`: the best-ranked host that accepts gets the volume.
pub async fn create(
    State(api): State<Api>,
    Path(app): Path<String>,
    Body(req): Body<CreateVolumeRequest>,
) -> Result<Json<Volume>, ApiError> {
    require_app(&api, &app)?;
    if req.snapshot_id.is_some() || req.source_volume_id.is_some() {
        return create_from_source(&api, &app, &req).await.map(Json);
    }
    let template = host_request(&app, &req)?;
    crate::quotas::check_volume(&api, &app, template.size_gb)?;
    let (hosts, addrs) = api.market_view()?;
    let volumes = api.catalog()?.volumes(Some(&app));
    let cands: Vec<VolumeCandidate> = {
        let catalog = api.catalog()?;
        hosts
            .into_iter()
            .map(|h| {
                let disk = catalog.host(&h.host_id).map(|v| v.record);
                VolumeCandidate {
                    same_name: volumes
                        .iter()
                        .filter(|v| v.record.host_id == h.host_id && v.record.name == req.name)
                        .count(),
                    disk_gb: disk.as_ref().map(|d| d.disk_gb).unwrap_or(0),
                    disk_free_gb: disk.as_ref().map(|d| d.disk_free_gb).unwrap_or(0),
                    host: h,
                }
            })
            .collect()
    };
    let known = Api::known_regions(&cands.iter().map(|c| c.host.clone()).collect::<Vec<_>>());
    let region = req
        .region
        .clone()
        .filter(|r| !r.trim().is_empty())
        .unwrap_or_else(|| api.0.node.config().region.clone());
    let groups = parse_regions(&region, &known).map_err(ApiError::BadRequest)?;
    let want = VolumeRequest {
        size_gb: template.size_gb,
        compute: template.compute,
        require_unique_zone: template.require_unique_zone,
    };
    let mut tried = Vec::new();
    for group in &groups {
        let (ranked, excluded) = volume_candidates(&cands, group, &want);
        tried.extend(
            excluded
                .into_iter()
                .map(|e| format!("{} ({})", e.host_id, e.reason)),
        );
        for cand in ranked {
            let Some(addr) = addrs.get(&cand.host.host_id) else {
                continue;
            };
            // A new id per host: a host that timed out may still have made its volume.
            let mut ask = template.clone();
            ask.id = new_volume_id();
            match api
                .post_host::<Volume>(addr, "/host/v1/volumes", &ask)
                .await
            {
                Ok(volume) => {
                    api.remember(&volume.id, &addr.host_id);
                    return Ok(Json(volume));
                }
                Err(HostCallError::Refused {
                    status: 409,
                    message,
                }) => {
                    tried.push(format!("{} ({message})", addr.host_id));
                }
                Err(HostCallError::Refused { status, message }) if status < 500 => {
                    return Err(ApiError::BadRequest(message));
                }
                Err(err) => tried.push(format!("{} ({err})", addr.host_id)),
            }
        }
    }
    Err(ApiError::InsufficientCapacity(format!(
        "insufficient capacity: no host in {region} can take volume {:?} of {} GB{}; tried: {}",
        req.name,
        template.size_gb,
        if template.require_unique_zone {
            " on a host without another volume of that name (require_unique_zone)"
        } else {
            ""
        },
        if tried.is_empty() {
            "no host in the region(s)".to_string()
        } else {
            tried.join("; ")
        }
    )))
}

pub(crate) fn create_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "VolumesCreate",
        "volumes",
        "Create a volume: host-local storage placed by the market (disk, \
         `require_unique_zone`, the `compute` hint). With `snapshot_id` it restores a \
         snapshot, with `source_volume_id` it forks a volume (a copy taken now); both are \
         made on the host that holds the source, at least the source's size \
         (`require_unique_zone` defaults to false for them). `encrypted: true` is refused: \
         volumes are not encrypted.",
        &[400, 401, 404, 409, 503],
    )
}

/// A restore or a fork: made on the host that holds the source, at least the source's size
/// (by default exactly). `require_unique_zone` defaults to false here: the new volume has
/// no other host to go to.
async fn create_from_source(
    api: &Api,
    app: &str,
    req: &CreateVolumeRequest,
) -> Result<Volume, ApiError> {
    let (source, host, source_gb) = match (&req.snapshot_id, &req.source_volume_id) {
        (Some(_), Some(_)) => {
            return Err(ApiError::BadRequest(
                "give snapshot_id (restore) or source_volume_id (fork), not both".into(),
            ))
        }
        (Some(snap), None) => {
            let (host, found) = find_snapshot(api, app, snap).await?;
            (
                VolumeSource::Snapshot(snap.clone()),
                host,
                found.volume_size_gb,
            )
        }
        (None, Some(vol)) => {
            let not_found = || {
                ApiError::BadRequest(format!(
                    "source_volume_id {vol} is not a volume of app {app}"
                ))
            };
            let (host, _) = locate(api, app, vol).await.map_err(|e| match e {
                ApiError::NotFound(_) => not_found(),
                other => other,
            })?;
            let source: Volume = api
                .get_host(&host, &format!("/host/v1/volumes/{vol}"))
                .await
                .map_err(|e| match e {
                    HostCallError::Refused { status: 404, .. } => not_found(),
                    other => ApiError::Unavailable(format!(
                        "the host {} of source_volume_id {vol} is unreachable ({other})",
                        host.host_id
                    )),
                })?;
            (VolumeSource::Volume(vol.clone()), host, source.size_gb)
        }
        (None, None) => unreachable!("called for a restore or a fork"),
    };
    let region = api
        .catalog()?
        .host(&host.host_id)
        .map(|h| h.record.region)
        .unwrap_or_default();
    if let Some(want) = req.region.as_deref().filter(|r| !r.trim().is_empty()) {
        if want != region {
            return Err(ApiError::BadRequest(format!(
                "region {want}: a restored or forked volume is made on the host that holds its source, in region {region}"
            )));
        }
    }
    let mut ask = host_request(app, req)?;
    ask.id = new_volume_id();
    ask.size_gb = req.size_gb.unwrap_or(source_gb);
    crate::quotas::check_volume(api, app, ask.size_gb)?;
    ask.require_unique_zone = req.require_unique_zone.unwrap_or(false);
    ask.source = Some(source);
    match api
        .post_host::<Volume>(&host, "/host/v1/volumes", &ask)
        .await
    {
        Ok(volume) => {
            api.remember(&volume.id, &host.host_id);
            Ok(volume)
        }
        Err(HostCallError::Refused {
            status: 409,
            message,
        }) => Err(ApiError::InsufficientCapacity(format!(
            "insufficient capacity: host {} holds the source but cannot take the new volume: {message}",
            host.host_id
        ))),
        Err(HostCallError::Refused { status, message }) if status < 500 => {
            Err(ApiError::BadRequest(message))
        }
        Err(err) => Err(ApiError::Unavailable(format!(
            "host {}: {err}",
            host.host_id
        ))),
    }
}

/// The host that keeps snapshot `id` of `app`: every host is asked (snapshots are not in
/// the catalog; restores are rare).
async fn find_snapshot(
    api: &Api,
    app: &str,
    id: &str,
) -> Result<(HostAddr, HostSnapshot), ApiError> {
    let not_found = |extra: String| {
        ApiError::BadRequest(format!(
            "snapshot_id {id} is not a snapshot of app {app}{extra}"
        ))
    };
    if !is_valid_snapshot_id(id) {
        return Err(not_found(String::new()));
    }
    let (_, addrs) = api.market_view()?;
    let path = format!("/host/v1/snapshots/{id}");
    let asks = addrs.values().map(|addr| {
        let path = &path;
        async move { (addr, api.get_host::<HostSnapshot>(addr, path).await) }
    });
    let mut silent = Vec::new();
    for (addr, answer) in futures_util::future::join_all(asks).await {
        match answer {
            Ok(snap) if snap.app == app => return Ok((addr.clone(), snap)),
            Ok(_) | Err(HostCallError::Refused { status: 404, .. }) => {}
            Err(err) => silent.push(format!("{} ({err})", addr.host_id)),
        }
    }
    Err(not_found(if silent.is_empty() {
        String::new()
    } else {
        format!(
            " on the hosts that answered; not answering: {}",
            silent.join("; ")
        )
    }))
}

/// `GET /v1/apps/{app}/volumes`: the app's volumes from the local catalog.
pub async fn list(
    State(api): State<Api>,
    Path(app): Path<String>,
) -> Result<Json<Vec<Volume>>, ApiError> {
    require_app(&api, &app)?;
    let out: Vec<Volume> = api
        .catalog()?
        .volumes(Some(&app))
        .iter()
        .map(from_catalog)
        .collect();
    Ok(Json(out))
}

pub(crate) fn list_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "VolumesList",
        "volumes",
        "List an app's volumes (from the cluster catalog).",
        &[401, 404, 503],
    )
}

/// The volume's owner and its catalog row, or 404.
async fn locate(
    api: &Api,
    app: &str,
    id: &str,
) -> Result<(HostAddr, Option<bazaar_catalog::VolumeView>), ApiError> {
    let not_found = || ApiError::NotFound(format!("volume {id} not found in app {app}"));
    if !is_valid_volume_id(id) {
        return Err(not_found());
    }
    let catalog = api.catalog()?;
    let row = catalog.volume(id).filter(|v| !v.deleted);
    let host_id = match (&row, api.recent_host(id)) {
        (Some(r), _) if r.record.app == app => r.record.host_id.clone(),
        (Some(_), _) => return Err(not_found()),
        (None, Some(h)) => h,
        (None, None) => return Err(not_found()),
    };
    let api_addr = api.host_addr(&host_id).await?;
    Ok((HostAddr { host_id, api_addr }, row))
}

/// `GET /v1/apps/{app}/volumes/{id}`: from the owner (or the catalog, if it is down).
pub async fn get(
    State(api): State<Api>,
    Path((app, id)): Path<(String, String)>,
) -> Result<Relayed<Json<Volume>>, ApiError> {
    forward(api, app, id, "", Method::GET, Bytes::new()).await
}

pub(crate) fn get_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "VolumesShow",
        "volumes",
        "Get a volume (from its host; from the catalog while the host is down).",
        &[401, 404, 503],
    )
}

/// `POST` (Fly's method) or `PUT /v1/apps/{app}/volumes/{id}`: update (snapshot
/// retention, backups).
pub async fn update(
    State(api): State<Api>,
    Path((app, id)): Path<(String, String)>,
    RawJson(body, ..): RawJson<UpdateVolumeRequest>,
) -> Result<Relayed<Json<Volume>>, ApiError> {
    forward(api, app, id, "", Method::PUT, body).await
}

pub(crate) fn update_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "VolumesUpdate",
        "volumes",
        "Change a volume's snapshot retention or automatic backups.",
        &[400, 401, 404, 503],
    )
}

pub(crate) fn update_post_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "VolumesUpdatePost",
        "volumes",
        "Same as `PUT` (Fly's method).",
        &[400, 401, 404, 503],
    )
}

/// `PUT /v1/apps/{app}/volumes/{id}/extend`: grow; answers `{volume, needs_restart}`.
pub async fn extend(
    State(api): State<Api>,
    Path((app, id)): Path<(String, String)>,
    RawJson(body, ..): RawJson<ExtendVolumeRequest>,
) -> Result<Relayed<Json<ExtendVolumeResponse>>, ApiError> {
    // The growth counts against the volume GB quota (a body the owner will refuse is left
    // to it).
    if let Ok(ExtendVolumeRequest {
        size_gb: Some(size_gb),
    }) = serde_json::from_slice(&body)
    {
        let now = api
            .catalog()?
            .volume(&id)
            .filter(|v| v.record.app == app)
            .map_or(size_gb, |v| v.record.size_gb);
        crate::quotas::check_volume(&api, &app, size_gb.saturating_sub(now))?;
    }
    forward(api, app, id, "/extend", Method::PUT, body).await
}

pub(crate) fn extend_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "VolumesExtend",
        "volumes",
        "Grow a volume (online; shrinking is refused).",
        &[400, 401, 404, 409, 503],
    )
}

/// `GET /v1/apps/{app}/volumes/{id}/snapshots`: the volume's snapshots, oldest first.
pub async fn snapshots(
    State(api): State<Api>,
    Path((app, id)): Path<(String, String)>,
) -> Result<Relayed<Json<Vec<VolumeSnapshot>>>, ApiError> {
    forward(api, app, id, "/snapshots", Method::GET, Bytes::new()).await
}

pub(crate) fn snapshots_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "VolumesListSnapshots",
        "volumes",
        "A volume's snapshots, oldest first (kept on its host for `snapshot_retention` days).",
        &[401, 404, 503],
    )
}

/// `POST /v1/apps/{app}/volumes/{id}/snapshots`: takes a snapshot now (answers it).
pub async fn snapshot(
    State(api): State<Api>,
    Path((app, id)): Path<(String, String)>,
) -> Result<Relayed<Json<VolumeSnapshot>>, ApiError> {
    forward(api, app, id, "/snapshots", Method::POST, Bytes::new()).await
}

pub(crate) fn snapshot_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "CreateVolumeSnapshot",
        "volumes",
        "Take a snapshot now: a consistent copy of the volume (its file system is frozen \
         while it is copied; writers wait), kept on the volume's host.",
        &[400, 401, 404, 409, 503],
    )
}

/// `DELETE /v1/apps/{app}/volumes/{id}`: refused with 412 while a machine has it attached.
pub async fn destroy(
    State(api): State<Api>,
    Path((app, id)): Path<(String, String)>,
) -> Result<Relayed<Json<Volume>>, ApiError> {
    forward(api, app, id, "", Method::DELETE, Bytes::new()).await
}

pub(crate) fn destroy_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "VolumesDelete",
        "volumes",
        "Delete a volume and its data; refused (412) while a machine mounts it.",
        &[401, 404, 409, 412, 503],
    )
}

async fn forward<R>(
    api: Api,
    app: String,
    id: String,
    rest: &str,
    method: Method,
    body: Bytes,
) -> Result<Relayed<R>, ApiError> {
    require_app(&api, &app)?;
    let (host, row) = locate(&api, &app, &id).await?;
    let unreachable = |why: String| -> Result<Response, ApiError> {
        if method == Method::GET && rest.is_empty() {
            if let Some(row) = &row {
                let mut v = from_catalog(row);
                v.host_status = "unreachable".into();
                return Ok(Json(v).into_response());
            }
        }
        Err(ApiError::Unavailable(format!(
            "the host {} of volume {id} is unreachable ({why}); it cannot be changed until the host is back",
            host.host_id
        )))
    };
    let path = format!("/host/v1/volumes/{id}{rest}");
    let mut req = api.to_node(method.clone(), &host.api_addr, &path);
    if !body.is_empty() {
        req = req.header("content-type", "application/json").body(body);
    }
    match api.relay(req, &host).await? {
        Ok(resp) => Ok(Relayed::new(resp)),
        Err(why) => unreachable(why).map(Relayed::new),
    }
}
