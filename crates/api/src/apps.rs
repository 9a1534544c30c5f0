//! `/v1/apps`: apps are records in the catalog, written by the node whose API created
//! them. Names are unique cluster-wide; two nodes that create the same name while
//! partitioned both succeed, and after the partition heals every node agrees on the older
//! record (smallest creation time, then host id) — the machines of both stay under the one
//! name (see ARCHITECTURE.md).

use crate::error::ApiError;
use crate::openapi::{op, Answer, Body};
use crate::Api;
use aide::transform::TransformOperation;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use bazaar_types::api::{App, AppList, Organization, StatusResponse};
use serde::Deserialize;

/// Body of `POST /v1/apps` (unknown fields are ignored).
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(rename = "CreateAppRequest")]
pub struct CreateApp {
    /// The app's name: 1-63 lowercase letters, digits and `-`.
    #[serde(default)]
    app_name: Option<String>,
    /// Accepted in place of `app_name`.
    #[serde(default)]
    name: Option<String>,
    /// The organization (default `personal`).
    #[serde(default)]
    org_slug: Option<String>,
}

fn app_of(api: &Api, a: &bazaar_catalog::AppRecord) -> App {
    let machine_count = api
        .catalog()
        .map(|c| {
            c.machines(&bazaar_catalog::MachineFilter::app(&a.name))
                .len()
        })
        .unwrap_or(0);
    App {
        id: a.name.clone(),
        name: a.name.clone(),
        machine_count: machine_count as u64,
        volume_count: api
            .catalog()
            .map(|c| c.volumes(Some(&a.name)).len())
            .unwrap_or(0) as u64,
        network: "default".into(),
        organization: Organization {
            name: a.org_slug.clone(),
            slug: a.org_slug.clone(),
        },
        status: if machine_count > 0 {
            "deployed"
        } else {
            "pending"
        }
        .into(),
        created_at: bazaar_types::rfc3339(a.created_at_ms),
    }
}

/// `POST /v1/apps`.
pub async fn create(
    State(api): State<Api>,
    Body(req): Body<CreateApp>,
) -> Result<Answer<201, App>, ApiError> {
    let name = req
        .app_name
        .or(req.name)
        .ok_or_else(|| ApiError::BadRequest("app_name is required".into()))?;
    bazaar_types::ids::validate_name("app", &name).map_err(ApiError::Unprocessable)?;
    let org = req.org_slug.unwrap_or_else(|| "personal".into());
    bazaar_types::ids::validate_name("organization", &org).map_err(ApiError::Unprocessable)?;
    let catalog = api.catalog()?;
    if catalog.app(&name).is_some() {
        return Err(ApiError::NameTaken(format!(
            "app name {name:?} is already taken"
        )));
    }
    let record = bazaar_catalog::AppRecord {
        name: name.clone(),
        org_slug: org,
        created_at_ms: bazaar_types::now_ms(),
        created_by_host: api.0.node.host_id().to_string(),
    };
    catalog.publish_app(record.clone());
    Ok(Answer(app_of(&api, &record)))
}

pub(crate) fn create_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "AppsCreate",
        "apps",
        "Create an app. The name is unique in the cluster.",
        &[400, 401, 422, 503],
    )
}

/// The filter of `GET /v1/apps`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(inline)]
pub struct ListQuery {
    /// Only apps of this organization.
    org_slug: Option<String>,
}

/// `GET /v1/apps?org_slug=`.
/// A token scoped to some apps sees only those.
pub async fn list(
    State(api): State<Api>,
    caller: Option<axum::Extension<bazaar_node::Caller>>,
    Query(q): Query<ListQuery>,
) -> Result<Json<AppList>, ApiError> {
    let caller = caller.as_ref().map(|c| &c.0);
    let mut apps: Vec<_> = api
        .catalog()?
        .apps()
        .into_iter()
        .filter(|a| q.org_slug.as_ref().is_none_or(|o| *o == a.org_slug))
        .filter(|a| crate::access::may_read(caller, &a.name))
        .collect();
    apps.sort_by(|a, b| a.name.cmp(&b.name));
    let apps: Vec<App> = apps.iter().map(|a| app_of(&api, a)).collect();
    Ok(Json(AppList {
        total_apps: apps.len() as u64,
        apps,
    }))
}

pub(crate) fn list_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(t, "AppsList", "apps", "List apps.", &[401, 503])
}

/// `GET /v1/apps/{app}`.
pub async fn get(State(api): State<Api>, Path(app): Path<String>) -> Result<Json<App>, ApiError> {
    match api.catalog()?.app(&app) {
        Some(a) => Ok(Json(app_of(&api, &a))),
        None => Err(ApiError::NotFound(format!("app {app} not found"))),
    }
}

pub(crate) fn get_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(t, "AppsShow", "apps", "Get an app.", &[401, 404, 503])
}

/// `DELETE /v1/apps/{app}`: destroys its machines (at once), then the app; its volumes are
/// deleted in the background as soon as their machines let go of them. 202. If a machine
/// cannot be destroyed (leased by someone else, its host unreachable), the machines that
/// could be are destroyed, the app and its volumes stay, and the answer (409) names the
/// others and why.
pub async fn destroy(
    State(api): State<Api>,
    Path(app): Path<String>,
) -> Result<Answer<202, StatusResponse>, ApiError> {
    let catalog = api.catalog()?;
    let record = catalog
        .app(&app)
        .ok_or_else(|| ApiError::NotFound(format!("app {app} not found")))?;
    let left = destroy_machines(&api, catalog, &app).await;
    if !left.is_empty() {
        return Err(ApiError::Conflict(format!(
            "app {app} was not deleted: {} machine(s) could not be destroyed: {}",
            left.len(),
            left.join("; ")
        )));
    }
    if record.created_by_host != api.0.node.host_id() {
        // Only the host that wrote the app's record can delete it.
        let owner = catalog.host(&record.created_by_host).ok_or_else(|| {
            ApiError::Unavailable(format!(
                "the host that owns app {app} is not known to this node yet; retry"
            ))
        })?;
        let resp = api
            .to_node(
                reqwest::Method::DELETE,
                &owner.record.api_addr,
                &format!("/v1/apps/{app}"),
            )
            .send()
            .await
            .map_err(|e| {
                ApiError::Unavailable(format!("the host that owns app {app} is unreachable: {e}"))
            })?;
        if !resp.status().is_success() {
            let status = resp.status();
            let body: serde_json::Value = resp.json().await.unwrap_or_default();
            let why = body["error"]
                .as_str()
                .unwrap_or("no reason given")
                .to_string();
            return Err(match status {
                StatusCode::CONFLICT => ApiError::Conflict(why),
                StatusCode::NOT_FOUND => ApiError::NotFound(why),
                _ => ApiError::Unavailable(format!("the host that owns app {app}: {why}")),
            });
        }
    } else {
        catalog.delete_app(&app);
    }
    let volumes = catalog.volumes(Some(&app));
    if !volumes.is_empty() {
        api.0
            .node
            .spawn(delete_volumes(api.clone(), app.clone(), volumes));
    }
    Ok(Answer(StatusResponse {
        status: "accepted".into(),
    }))
}

pub(crate) fn destroy_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "AppsDelete",
        "apps",
        "Delete an app: destroys its machines at once, then the app. If a machine cannot \
         be destroyed (leased by someone else, host unreachable), the app stays: 409 names it.",
        &[401, 404, 409, 503],
    )
}

/// Force-destroys every machine of `app` the local catalog knows about, on its owner.
/// Returns the machines that could not be destroyed, each with the reason.
async fn destroy_machines(api: &Api, catalog: &bazaar_catalog::Catalog, app: &str) -> Vec<String> {
    let machines = catalog.machines(&bazaar_catalog::MachineFilter::app(app));
    let calls = machines.iter().map(|m| async move {
        let id = &m.record.id;
        let Some(h) = catalog.host(&m.record.host_id) else {
            return Some(format!("{id}: its host {} is unknown", m.record.host_id));
        };
        let path = format!("/host/v1/machines/{id}?force=true");
        let resp = match api
            .to_node(reqwest::Method::DELETE, &h.record.api_addr, &path)
            .send()
            .await
        {
            Ok(r) => r,
            Err(e) => {
                return Some(format!(
                    "{id}: its host {} is unreachable ({e})",
                    h.record.id
                ))
            }
        };
        // Gone already is as good as destroyed.
        if resp.status().is_success() || resp.status() == StatusCode::NOT_FOUND {
            return None;
        }
        let status = resp.status();
        let body: serde_json::Value = resp.json().await.unwrap_or_default();
        Some(format!(
            "{id}: {} ({})",
            body["error"].as_str().unwrap_or("no reason given"),
            status.as_u16()
        ))
    });
    futures_util::future::join_all(calls)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// Deletes the volumes of a deleted app on their owners, retrying for a minute while their
/// machines are still being destroyed (412). A machine created just before the delete may
/// reach the local catalog only afterwards: while a volume is still in use, the app's
/// machines are destroyed again.
async fn delete_volumes(api: Api, app: String, volumes: Vec<bazaar_catalog::VolumeView>) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
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
                        let _ = destroy_machines(&api, catalog, &app).await;
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
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
}
