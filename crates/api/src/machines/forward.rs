//! The machine calls forwarded to the machine's owner: each a route of its own
//! ([`forwarded`]) typed with what the owner's host interface answers, relayed by
//! [`forward`]; `GET .../lease` shows the nonce only to a caller that may use leases.

use super::{decode, from_catalog, require_app};
use crate::error::ApiError;
use crate::exchange::HostAddr;
use crate::openapi::{
    nonce, op, query, Checked, Ndjson, NoBody, RawJson, Relayed, RelayedBody, Ty, FWD, FWD_CHANGE,
};
use crate::Api;
use aide::axum::routing::{get_with, post_with};
use aide::axum::ApiRouter;
use aide::transform::TransformOperation;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, Uri};
use axum::response::{IntoResponse, NoContent, Response};
use axum::Json;
use bazaar_placement::exchange::PlacementRecord;
use bazaar_types::api::{
    LeaseInfoResponse, LeaseResponse, MachineTraffic, MachineVersion, MetadataValue, OkResponse,
    StartResponse, StatusResponse,
};
use bazaar_types::event::MachineEvent;
use bazaar_types::host::{
    ExecRequest, ExecResponse, LeaseRequest, MetadataUpdate, ProcessStat, SignalRequest,
    StopRequest, UpdateRequest, WaitResponse,
};
use bazaar_types::machine::Machine;
use std::collections::{BTreeMap, HashMap};

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
        // Another app's, or an earlier app's of the same name (deleted, then made again).
        if r.record.app != app || catalog.machine_of_app(id, app).is_none() {
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
pub(crate) async fn forward<R, B: RelayedBody>(
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
    let app_known = require_app(&api, &app);
    let (host, row) = locate(&api, &app, &id).await?;
    // A machine of a deleted app went with it (404, as the app). A live machine whose app
    // has no record (made on its host directly, through the host interface) is served.
    if let Err(gone) = app_known {
        if row.as_ref().is_none_or(|r| r.deleted) {
            return Err(gone);
        }
    }
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

/// `GET .../lease`: the lease held, from the owner (which answers it with its nonce); the
/// nonce is left out for a caller whose token may not use leases on the app (a read-only
/// one), so it can see who holds the machine but not release or use the lease.
async fn lease_show(
    api: State<Api>,
    params: Path<HashMap<String, String>>,
    caller: Option<axum::Extension<bazaar_node::Caller>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: NoBody,
) -> Result<Relayed<Json<LeaseInfoResponse>>, ApiError> {
    let app = params.get("app").cloned().unwrap_or_default();
    let relayed: Relayed<Json<LeaseInfoResponse>> =
        forward(api, params, method, uri, headers, body).await?;
    let resp = relayed.into_response();
    if !resp.status().is_success() || crate::access::may_lease(caller.as_ref().map(|c| &c.0), &app)
    {
        return Ok(Relayed::new(resp));
    }
    let bytes = axum::body::to_bytes(resp.into_body(), 64 * 1024)
        .await
        .map_err(|e| ApiError::Unavailable(format!("reading the lease from its host: {e}")))?;
    let mut lease: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::Internal(format!("the lease its host answered: {e}")))?;
    if let Some(data) = lease.get_mut("data").and_then(|d| d.as_object_mut()) {
        data.remove("nonce");
    }
    Ok(Relayed::new(Json(lease).into_response()))
}

/// `POST`/`PUT .../machines/{id}`: an update, its standbys checked here (they are other
/// hosts' machines), then forwarded.
async fn update(
    api: State<Api>,
    params: Path<HashMap<String, String>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Checked<UpdateRequest>,
) -> Result<Relayed<Json<Machine>>, ApiError> {
    let param = |name: &str| params.get(name).map(String::as_str).unwrap_or_default();
    super::check_standbys(&api, param("app"), &body.0.config, Some(param("id")))?;
    // A config the owner will refuse is left to it; one that grows the machine is checked
    // against the quotas here.
    let State(this) = &api;
    if let Ok(size) = this.0.node.validate_config(&body.0.config) {
        crate::quotas::check_growth(this, param("app"), param("id"), size)?;
    }
    forward(api, params, method, uri, headers, body).await
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
            .post_with(update, |t| {
                nonce(op(
                    t,
                    "MachinesUpdate",
                    "machines",
                    "Update a machine's config (a new version). `lease_ttl` takes or \
                     refreshes a lease (its nonce is answered), `skip_service_registration` \
                     cordons it; `name` and `region` must be its own if given (a machine is \
                     not renamed and does not move: 400).",
                    FWD_CHANGE,
                ))
            })
            .put_with(
                update,
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
                    "Wait until a machine is in one of the given states (default `started`); a \
                     launch that fails meanwhile is answered with its kind's status (507 a \
                     full disk, 503 busy, 404 a missing image or command, 403 refused, 422 a \
                     config that cannot run, 500 else).",
                    &[400, 401, 403, 404, 408, 422, 500, 503, 507],
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
                    "Seconds or a Go duration (default 60 s; more than 60 s is refused with \
                     400).",
                );
                let t = query(
                    t,
                    "instance_id",
                    Ty::Str,
                    "Wait for this version (an `instance_id`, a ULID; anything else is 400).",
                );
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
            get_with(lease_show, |t| {
                op(
                    t,
                    "MachinesShowLease",
                    "leases",
                    "Get the lease held on a machine, with its nonce for a token that may use \
                     leases (to release a stuck one), without it for one that may not.",
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
