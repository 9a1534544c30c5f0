//! `/v1/apps`: apps are records in the catalog, written by the node whose API created
//! them. Names are unique cluster-wide; two nodes that create the same name while
//! partitioned both succeed, and after the partition heals every node agrees on the older
//! record (smallest creation time, then host id, then app id); the other lost the name: it
//! is listed under its organization with status `name_conflict` and takes no machines
//! ([`crate::app_conflict`]). Each app gets an id of its own at creation, never reused:
//! what it owns is bound to the id. Deleting an app: [`crate::app_delete`].

use crate::error::ApiError;
use crate::openapi::{op, Answer, Body};
use crate::Api;
use aide::transform::TransformOperation;
use axum::extract::{Path, Query, State};
use axum::Json;
use bazaar_types::api::{App, AppList, Organization};
use serde::Deserialize;

/// Body of `POST /v1/apps` (unknown fields are ignored).
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[schemars(rename = "CreateAppRequest")]
// One of the two names, given as a string (a `null` name is no name).
#[schemars(extend("anyOf" = [
    {"required": ["app_name"], "properties": {"app_name": {"type": "string"}}},
    {"required": ["name"], "properties": {"name": {"type": "string"}}}
]))]
pub struct CreateApp {
    /// The app's name: 1-63 lowercase letters, digits and `-`.
    #[serde(default)]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
    )]
    app_name: Option<String>,
    /// Accepted in place of `app_name`.
    #[serde(default)]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
    )]
    name: Option<String>,
    /// The organization (default `personal`).
    #[serde(default)]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
    )]
    org_slug: Option<String>,
}

/// The app of a record; `lost`: a record that lost its name to an older app of the name
/// (status `name_conflict`, counting only the machines made in it).
fn app_of(api: &Api, a: &bazaar_catalog::AppRecord, lost: bool) -> App {
    let machine_count = api
        .catalog()
        .map(|c| match lost {
            false => c
                .machines(&bazaar_catalog::MachineFilter::app(&a.name))
                .len(),
            true => c
                .machines_where(&bazaar_catalog::MachineFilter::default(), |m| {
                    m.app == a.name && m.app_id == a.id
                })
                .len(),
        })
        .unwrap_or(0);
    App {
        id: if a.id.is_empty() {
            a.name.clone()
        } else {
            a.id.clone()
        },
        name: a.name.clone(),
        machine_count: machine_count as u64,
        volume_count: match lost {
            false => api
                .catalog()
                .map(|c| c.volumes(Some(&a.name)).len())
                .unwrap_or(0) as u64,
            true => 0,
        },
        network: "default".into(),
        organization: Organization {
            name: a.org_slug.clone(),
            slug: a.org_slug.clone(),
        },
        status: if lost {
            "name_conflict"
        } else if machine_count > 0 {
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
    // Created after every machine row of an earlier app of this name (whose host's clock
    // may run ahead of this one's): those rows are that app's history, not this one's
    // (`Catalog::machines`).
    let mut earlier = bazaar_catalog::MachineFilter::app(&name);
    earlier.include_deleted = true;
    let after_earlier = catalog
        .machines(&earlier)
        .iter()
        .map(|m| m.record.updated_at_ms + 1)
        .max()
        .unwrap_or(0);
    let record = bazaar_catalog::AppRecord {
        id: bazaar_types::ids::new_app_id(),
        name: name.clone(),
        org_slug: org,
        created_at_ms: bazaar_types::now_ms().max(after_earlier),
        created_by_host: api.0.node.host_id().to_string(),
    };
    catalog.publish_app(record.clone());
    Ok(Answer(app_of(&api, &record, false)))
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

/// `GET /v1/apps?org_slug=`: every app, and after a partition an app that lost its name to
/// another (status `name_conflict`) after it. A token scoped to some apps sees only those.
pub async fn list(
    State(api): State<Api>,
    caller: Option<axum::Extension<bazaar_node::Caller>>,
    Query(q): Query<ListQuery>,
) -> Result<Json<AppList>, ApiError> {
    let caller = caller.as_ref().map(|c| &c.0);
    let mut previous: Option<String> = None;
    let apps: Vec<App> = api
        .catalog()?
        .app_rows()
        .into_iter()
        .map(|a| {
            // Rows come by name, the app of the name first.
            let lost = previous.as_ref() == Some(&a.name);
            previous = Some(a.name.clone());
            (a, lost)
        })
        .filter(|(a, _)| q.org_slug.as_ref().is_none_or(|o| *o == a.org_slug))
        .filter(|(a, _)| crate::access::may_read(caller, &a.name))
        .map(|(a, lost)| app_of(&api, &a, lost))
        .collect();
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
        Some(a) => Ok(Json(app_of(&api, &a, false))),
        None => Err(ApiError::NotFound(format!("app {app} not found"))),
    }
}

pub(crate) fn get_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(t, "AppsShow", "apps", "Get an app.", &[401, 404, 503])
}
