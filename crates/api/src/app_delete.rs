//! `DELETE /v1/apps/{app}`: all or nothing. The node that wrote the app's record does it
//! (another node forwards the call there before touching anything). It first takes a short
//! lease on every machine of the app that is not destroyed or being destroyed (Fly's
//! lease, which every change to a machine checks; the machines are those its catalog lists
//! and those the hosts it sees alive say they hold): if one cannot be taken (another
//! holder's lease, its host unknown or unreachable), it lets go of the leases it took and
//! answers 409 naming every machine in the way and why; nothing changed. Otherwise it
//! destroys them all under its leases, removes the app's hostnames (their certificate rows
//! and ACME orders), deletes the record, and deletes the volumes in the background.
//! Secrets and machine history stay behind only as an earlier app's: a new app of the same
//! name does not see them (`Replica::app_secrets`, `Catalog::machines`).

use crate::error::ApiError;
use crate::openapi::{op, Answer};
use crate::Api;
use aide::transform::TransformOperation;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use bazaar_catalog::{AppRecord, Catalog, HostStatus, MachineFilter};
use bazaar_types::api::StatusResponse;
use std::time::Duration;

/// How long the delete's leases last: long enough to destroy every machine once all are
/// held; if this node dies in between, the machines are free again after this.
const LEASE_TTL_S: u64 = 30;
/// How long one host may take to answer a lease or a destroy.
const HOST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the owner of the app's record may take to delete it.
const OWNER_TIMEOUT: Duration = Duration::from_secs(60);
/// The header that carries a lease's nonce.
const NONCE_HEADER: &str = "fly-machine-lease-nonce";

/// A machine this delete holds the lease of.
struct Held {
    id: String,
    api_addr: String,
    nonce: String,
}

/// What taking a machine's lease gave.
enum Take {
    Held(Held),
    /// Destroyed already (its host no longer has it).
    Gone,
    /// In the way: the machine and why.
    Blocked(String),
}

/// `DELETE /v1/apps/{app}`: 202 once every machine is destroyed and the app is gone; 409,
/// with nothing changed, naming every machine that is in the way.
pub async fn destroy(
    State(api): State<Api>,
    Path(app): Path<String>,
) -> Result<Answer<202, StatusResponse>, ApiError> {
    let catalog = api.catalog()?;
    let record = catalog
        .app(&app)
        .ok_or_else(|| ApiError::NotFound(format!("app {app} not found")))?;
    if record.created_by_host != api.0.node.host_id() {
        forward_to_owner(&api, catalog, &record).await?;
        return Ok(accepted());
    }
    // Check everything first: every machine's lease, taken at once. The machines are those
    // this node's catalog lists and those their hosts hold that it does not list yet.
    let mut machines: Vec<(String, String)> = catalog
        .machines(&MachineFilter::app(&app))
        .into_iter()
        .filter(|m| live(&m.record.state))
        .map(|m| (m.record.id, m.record.host_id))
        .collect();
    machines.extend(unlisted(&api, catalog, &app, &machines).await);
    let takes = futures_util::future::join_all(
        machines
            .iter()
            .map(|(id, host)| take(&api, catalog, id, host, &app)),
    )
    .await;
    let mut held = Vec::new();
    let mut blocked = Vec::new();
    for t in takes {
        match t {
            Take::Held(h) => held.push(h),
            Take::Gone => {}
            Take::Blocked(why) => blocked.push(why),
        }
    }
    if !blocked.is_empty() {
        futures_util::future::join_all(held.iter().map(|h| release(&api, h))).await;
        return Err(ApiError::Conflict(format!(
            "app {app} was not deleted and nothing was changed: {} machine(s) are in the way: {}",
            blocked.len(),
            blocked.join("; ")
        )));
    }
    // Then act.
    let failed: Vec<String> =
        futures_util::future::join_all(held.iter().map(|h| destroy_held(&api, h)))
            .await
            .into_iter()
            .flatten()
            .collect();
    if !failed.is_empty() {
        // Every machine was held, so only a host that failed in between gets here.
        return Err(ApiError::Unavailable(format!(
            "app {app} was not deleted: {} machine(s) could not be destroyed (their hosts failed during the delete; the others were destroyed): {}",
            failed.len(),
            failed.join("; ")
        )));
    }
    match bazaar_certs::Certs::new(&api.0.node) {
        Ok(certs) => {
            let gone = certs.forget_app(&app);
            if !gone.is_empty() {
                tracing::info!(app, hostnames = ?gone, "hostnames of a deleted app removed");
            }
        }
        // Without them, the rows stay but attach nothing: they are bound to the app's id.
        Err(err) => tracing::warn!(app, error = %err, "removing a deleted app's hostnames"),
    }
    catalog.delete_app(&app);
    let volumes = catalog.volumes(Some(&app));
    if !volumes.is_empty() {
        api.0
            .node
            .spawn(delete_volumes(api.clone(), app.clone(), volumes));
    }
    Ok(accepted())
}

fn accepted() -> Answer<202, StatusResponse> {
    Answer(StatusResponse {
        status: "accepted".into(),
    })
}

pub(crate) fn destroy_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "AppsDelete",
        "apps",
        "Delete an app, all or nothing: every machine is checked first (a short lease is \
         taken on each); if one is in the way (leased by someone else, host unreachable) \
         nothing changes and 409 names each. Otherwise its machines are destroyed, its \
         hostnames removed and the app deleted; its volumes go in the background. Machines \
         already destroyed or being destroyed are not in the way.",
        &[401, 404, 409, 503],
    )
}

/// Hands the delete to the host that wrote the app's record (only a row's owner may
/// change it), before anything is done here: through its host-level route
/// (`DELETE /v1/catalog/apps/{app}`, host certificate or cluster secret), since the
/// Machines API takes no host credential.
async fn forward_to_owner(
    api: &Api,
    catalog: &Catalog,
    record: &AppRecord,
) -> Result<(), ApiError> {
    let app = &record.name;
    let owner = catalog.host(&record.created_by_host).ok_or_else(|| {
        ApiError::Unavailable(format!(
            "the host that owns app {app} is not known to this node yet; retry"
        ))
    })?;
    let resp = api
        .to_node(
            reqwest::Method::DELETE,
            &owner.record.api_addr,
            &format!("/v1/catalog/apps/{app}"),
        )
        .timeout(OWNER_TIMEOUT)
        .send()
        .await
        .map_err(|e| {
            ApiError::Unavailable(format!(
                "the host that owns app {app} is unreachable ({e}); nothing was changed"
            ))
        })?;
    if resp.status().is_success() {
        return Ok(());
    }
    let status = resp.status();
    let why = error_of(resp).await;
    Err(match status {
        StatusCode::CONFLICT => ApiError::Conflict(why),
        StatusCode::NOT_FOUND => ApiError::NotFound(why),
        _ => ApiError::Unavailable(format!("the host that owns app {app}: {why}")),
    })
}

/// The `error` of a Fly-shaped error answer.
async fn error_of(resp: reqwest::Response) -> String {
    let body: serde_json::Value = resp.json().await.unwrap_or_default();
    body["error"]
        .as_str()
        .unwrap_or("no reason given")
        .to_string()
}

/// Whether a machine in `state` is in an app delete's way (not destroyed or going).
fn live(state: &str) -> bool {
    !matches!(state, "destroyed" | "destroying")
}

/// The app's live machines, as `(id, host)`, that their hosts hold and `listed` lacks: a
/// machine created through another node a moment ago may not have reached this node's
/// catalog, and a delete that missed it would not be all or nothing. Every host this node
/// sees alive is asked for its own (the owner is the truth), and the machines whose rows
/// have not reached this node are added; a host that does not answer adds nothing here
/// (the machines the catalog lists on it are checked by their leases).
async fn unlisted(
    api: &Api,
    catalog: &Catalog,
    app: &str,
    listed: &[(String, String)],
) -> Vec<(String, String)> {
    let asks = catalog
        .hosts()
        .into_iter()
        .filter(|h| h.status == HostStatus::Alive)
        .map(|h| async move {
            let resp = api
                .to_node(
                    reqwest::Method::GET,
                    &h.record.api_addr,
                    // App names are DNS labels: nothing to escape.
                    &format!("/host/v1/machines?app={app}"),
                )
                .timeout(HOST_TIMEOUT)
                .send()
                .await
                .ok()
                .filter(|r| r.status().is_success())?;
            let held: Vec<serde_json::Value> = resp.json().await.ok()?;
            Some(
                held.into_iter()
                    .filter(|m| live(m["state"].as_str().unwrap_or_default()))
                    .filter_map(|m| Some((m["id"].as_str()?.to_string(), h.record.id.clone())))
                    .collect::<Vec<_>>(),
            )
        });
    futures_util::future::join_all(asks)
        .await
        .into_iter()
        .flatten()
        .flatten()
        .filter(|(id, _)| !listed.iter().any(|(l, _)| l == id))
        // A row this node has, of any app, is judged by the catalog's list (which leaves
        // out the machines of another org's app that lost this name).
        .filter(|(id, _)| catalog.machine(id).is_none())
        .collect()
}

/// Takes the lease of machine `id` on its host.
async fn take(api: &Api, catalog: &Catalog, id: &str, host: &str, app: &str) -> Take {
    let Some(h) = catalog.host(host) else {
        return Take::Blocked(format!("{id}: its host {host} is unknown"));
    };
    let resp = api
        .to_node(
            reqwest::Method::POST,
            &h.record.api_addr,
            &format!("/host/v1/machines/{id}/lease"),
        )
        .timeout(HOST_TIMEOUT)
        .json(&serde_json::json!({
            "ttl": LEASE_TTL_S,
            "description": format!("deleting app {app}"),
        }))
        .send()
        .await;
    let resp = match resp {
        Ok(r) => r,
        Err(e) => {
            return Take::Blocked(format!(
                "{id}: its host {} is unreachable ({e})",
                h.record.id
            ))
        }
    };
    let status = resp.status();
    if status == StatusCode::NOT_FOUND {
        return Take::Gone;
    }
    if !status.is_success() {
        return Take::Blocked(format!(
            "{id}: {} ({})",
            error_of(resp).await,
            status.as_u16()
        ));
    }
    let body: serde_json::Value = resp.json().await.unwrap_or_default();
    match body["data"]["nonce"].as_str() {
        Some(nonce) => Take::Held(Held {
            id: id.to_string(),
            api_addr: h.record.api_addr.clone(),
            nonce: nonce.to_string(),
        }),
        None => Take::Blocked(format!("{id}: its host answered a lease without a nonce")),
    }
}

/// Lets go of a lease this delete took (best effort: it expires anyway).
async fn release(api: &Api, h: &Held) {
    let sent = api
        .to_node(
            reqwest::Method::DELETE,
            &h.api_addr,
            &format!("/host/v1/machines/{}/lease", h.id),
        )
        .timeout(HOST_TIMEOUT)
        .header(NONCE_HEADER, &h.nonce)
        .send()
        .await;
    if let Err(err) = sent {
        tracing::warn!(machine.id = %h.id, error = %err, "releasing a lease of a refused app delete; it expires in {LEASE_TTL_S} s");
    }
}

/// Destroys a held machine at once. `None` when it is gone; else what went wrong.
async fn destroy_held(api: &Api, h: &Held) -> Option<String> {
    let resp = api
        .to_node(
            reqwest::Method::DELETE,
            &h.api_addr,
            &format!("/host/v1/machines/{}?force=true", h.id),
        )
        .timeout(HOST_TIMEOUT)
        .header(NONCE_HEADER, &h.nonce)
        .send()
        .await;
    let resp = match resp {
        Ok(r) => r,
        Err(e) => return Some(format!("{}: its host is unreachable ({e})", h.id)),
    };
    let status = resp.status();
    // Gone already, or (412, the only refusal of a forced destroy by a lease holder) being
    // destroyed already: either way not in the way.
    if status.is_success()
        || status == StatusCode::NOT_FOUND
        || status == StatusCode::PRECONDITION_FAILED
    {
        return None;
    }
    Some(format!(
        "{}: {} ({})",
        h.id,
        error_of(resp).await,
        status.as_u16()
    ))
}

/// Force-destroys every machine of `app` the local catalog knows about (a machine created
/// just before the delete may reach the catalog only after it). Answers nothing: used only
/// while the app's volumes wait for their machines.
async fn destroy_late_machines(api: &Api, catalog: &Catalog, app: &str) {
    let machines = catalog.machines(&MachineFilter::app(app));
    let calls = machines.iter().filter_map(|m| {
        let h = catalog.host(&m.record.host_id)?;
        let path = format!("/host/v1/machines/{}?force=true", m.record.id);
        Some(
            api.to_node(reqwest::Method::DELETE, &h.record.api_addr, &path)
                .timeout(HOST_TIMEOUT)
                .send(),
        )
    });
    futures_util::future::join_all(calls).await;
}

/// Deletes the volumes of a deleted app on their owners, retrying for a minute while their
/// machines are still being destroyed (412). A machine created just before the delete may
/// reach the local catalog only afterwards: while a volume is still in use, the app's
/// machines are destroyed again.
async fn delete_volumes(api: Api, app: String, volumes: Vec<bazaar_catalog::VolumeView>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    for v in volumes {
        let path = format!("/host/v1/volumes/{}", v.record.id);
        while let Some(h) = api.catalog().ok().and_then(|c| c.host(&v.record.host_id)) {
            let status = api
                .to_node(reqwest::Method::DELETE, &h.record.api_addr, &path)
                .send()
                .await
                .map(|r| r.status());
            match status {
                Ok(s) if s == StatusCode::PRECONDITION_FAILED || s == StatusCode::CONFLICT => {
                    if let Ok(catalog) = api.catalog() {
                        destroy_late_machines(&api, catalog, &app).await;
                    }
                }
                Ok(_) => break,
                Err(err) => {
                    tracing::warn!(volume.id = %v.record.id, error = %err, "deleting a volume of a deleted app");
                }
            }
            if tokio::time::Instant::now() > deadline {
                tracing::warn!(volume.id = %v.record.id, "volume of a deleted app still in use after 60 s; left in place");
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
