//! Quotas per org and per app (issue 34, docs/POLICY.md), a bazaar extension:
//! `GET`/`POST /v1/orgs/{org}/quota` and `/v1/orgs/{org}/apps/{app}/quota`. Setting one
//! publishes a catalog row of this node's own (`bazaar_catalog::QuotaRecord`; the latest
//! write wins everywhere). Every node checks creates against the quotas and the use its own
//! catalog holds, with no central store (`check_machines`, `check_volume`): a refusal
//! is a 403 naming the quota and the numbers. The routes are under the org so that a token
//! scoped to an app cannot raise its own quota.

use crate::error::ApiError;
use crate::openapi::{op, Body};
use crate::Api;
use aide::transform::TransformOperation;
use axum::extract::{Path, State};
use axum::Json;
use bazaar_catalog::{Catalog, MachineFilter, QuotaRecord};
use bazaar_types::host::Resources;
use bazaar_types::quota::{check, Limits, QuotaStatus, Scope, Usage};

/// What an app's machines and volumes use, as this node's catalog holds them.
fn app_usage(catalog: &Catalog, app: &str) -> Usage {
    let machines =
        catalog
            .machines(&MachineFilter::app(app))
            .into_iter()
            .fold(Usage::default(), |u, m| {
                u.plus(Usage::machine(
                    m.record.resources.cpus,
                    m.record.resources.memory_mb,
                ))
            });
    catalog
        .volumes(Some(app))
        .into_iter()
        .filter(|v| v.record.state != "destroyed")
        .fold(machines, |u, v| u.plus(Usage::volume(v.record.size_gb)))
}

fn usage(catalog: &Catalog, scope: &Scope) -> Usage {
    match scope {
        Scope::App(app) => app_usage(catalog, app),
        Scope::Org(org) => catalog
            .apps()
            .into_iter()
            .filter(|a| &a.org_slug == org)
            .fold(Usage::default(), |u, a| u.plus(app_usage(catalog, &a.name))),
    }
}

fn status(catalog: &Catalog, scope: Scope) -> QuotaStatus {
    QuotaStatus {
        limits: catalog.quota(&scope).map(|q| q.limits).unwrap_or_default(),
        usage: usage(catalog, &scope),
        scope,
    }
}

/// Refuses (403) what `add` would take past the app's or its org's quota.
fn check_add(api: &Api, app: &str, add: Usage) -> Result<(), ApiError> {
    let catalog = api.catalog()?;
    let Some(record) = catalog.app(app) else {
        return Ok(());
    };
    for scope in [Scope::App(app.to_string()), Scope::Org(record.org_slug)] {
        if let Some(q) = catalog.quota(&scope) {
            check(&scope, &q.limits, usage(catalog, &scope), add)
                .map_err(|e| ApiError::Forbidden(e.to_string()))?;
        }
    }
    Ok(())
}

/// Refuses (403) `count` machines of `size` that would take the app or its org past a quota.
pub(crate) fn check_machines(
    api: &Api,
    app: &str,
    size: Resources,
    count: usize,
) -> Result<(), ApiError> {
    let one = Usage::machine(size.cpus, size.memory_mb);
    let add = (0..count).fold(Usage::default(), |u, _| u.plus(one));
    check_add(api, app, add)
}

/// Refuses (403) an update that grows machine `id` to `size` past the app's or its org's
/// CPU or memory quota (what it held before, as the catalog has it, is already counted).
pub(crate) fn check_growth(
    api: &Api,
    app: &str,
    id: &str,
    size: Resources,
) -> Result<(), ApiError> {
    let Some(now) = api.catalog()?.machine(id).map(|m| m.record.resources) else {
        return Ok(());
    };
    let add = Usage {
        cpus: u64::from(size.cpus.saturating_sub(now.cpus)),
        memory_mb: size.memory_mb.saturating_sub(now.memory_mb),
        ..Usage::default()
    };
    check_add(api, app, add)
}

/// Refuses (403) a volume of `size_gb` that would take the app or its org past a quota.
pub(crate) fn check_volume(api: &Api, app: &str, size_gb: u64) -> Result<(), ApiError> {
    check_add(api, app, Usage::volume(size_gb))
}

fn require_org_app(api: &Api, org: &str, app: &str) -> Result<(), ApiError> {
    match api.catalog()?.app(app) {
        Some(a) if a.org_slug == org => Ok(()),
        _ => Err(ApiError::NotFound(format!(
            "app {app} not found in organization {org}"
        ))),
    }
}

fn set(api: &Api, scope: Scope, limits: Limits) -> Result<QuotaStatus, ApiError> {
    let catalog = api.catalog()?;
    let app_created_at_ms = match &scope {
        Scope::App(app) => catalog.app(app).map(|a| a.created_at_ms).unwrap_or(0),
        Scope::Org(_) => 0,
    };
    catalog.publish_quota(QuotaRecord {
        id: QuotaRecord::key_of(&scope),
        scope: scope.clone(),
        limits,
        set_by_host: api.0.node.host_id().to_string(),
        app_created_at_ms,
        updated_at_ms: bazaar_types::now_ms(),
    });
    Ok(status(catalog, scope))
}

/// `GET /v1/orgs/{org}/quota`.
pub async fn show_org(
    State(api): State<Api>,
    Path(org): Path<String>,
) -> Result<Json<QuotaStatus>, ApiError> {
    Ok(Json(status(api.catalog()?, Scope::Org(org))))
}

/// `POST /v1/orgs/{org}/quota` with the limits (a resource left out has none).
pub async fn set_org(
    State(api): State<Api>,
    Path(org): Path<String>,
    Body(limits): Body<Limits>,
) -> Result<Json<QuotaStatus>, ApiError> {
    bazaar_types::ids::validate_name("organization", &org).map_err(ApiError::BadRequest)?;
    set(&api, Scope::Org(org), limits).map(Json)
}

/// `GET /v1/orgs/{org}/apps/{app}/quota`.
pub async fn show_app(
    State(api): State<Api>,
    Path((org, app)): Path<(String, String)>,
) -> Result<Json<QuotaStatus>, ApiError> {
    require_org_app(&api, &org, &app)?;
    Ok(Json(status(api.catalog()?, Scope::App(app))))
}

/// `POST /v1/orgs/{org}/apps/{app}/quota` with the limits.
pub async fn set_app(
    State(api): State<Api>,
    Path((org, app)): Path<(String, String)>,
    Body(limits): Body<Limits>,
) -> Result<Json<QuotaStatus>, ApiError> {
    require_org_app(&api, &org, &app)?;
    set(&api, Scope::App(app), limits).map(Json)
}

const SHOW: &str = "bazaar extension: the quota (limits on machines, cpus, memory_mb, volume_gb) and what is in use, as this node's catalog counts it (docs/POLICY.md).";
const SET: &str = "bazaar extension: sets the quota, replacing the limits (a resource left out has none; `{}` lifts it). Every node refuses a create that would pass it with 403 naming the quota and the numbers; how far a partition can overshoot: docs/POLICY.md. Needs a token not scoped to an app.";

pub(crate) fn show_org_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(t, "OrgQuotaShow", "quotas", SHOW, &[401, 403, 503])
}

pub(crate) fn set_org_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(t, "OrgQuotaSet", "quotas", SET, &[400, 401, 403, 503])
}

pub(crate) fn show_app_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(t, "AppQuotaShow", "quotas", SHOW, &[401, 403, 404, 503])
}

pub(crate) fn set_app_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(t, "AppQuotaSet", "quotas", SET, &[400, 401, 403, 404, 503])
}
