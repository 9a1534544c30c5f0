//! `GET /v1/apps/{app}/audit`: the changes made to an app, from every host's audit record
//! (each host keeps the changes it handled: `bazaar_agent::audit`), merged oldest first.
//! Hosts that cannot be reached are named in `unreachable_hosts`, so a partial answer says so.
//! Only the app as it is now: changes made before it was created were an earlier app's of
//! the same name (deleted, maybe of another organization), and a deleted app's record is
//! not answered here (404); hosts keep it for operators (`/host/v1/audit/{app}`, cluster
//! secret).

use crate::error::ApiError;
use crate::openapi::op;
use crate::Api;
use aide::transform::TransformOperation;
use axum::extract::{Path, State};
use axum::Json;
use bazaar_node::AuditEntry;
use bazaar_types::api::AuditList;
use std::time::Duration;

/// How long one host may take to answer.
const HOST_TIMEOUT: Duration = Duration::from_secs(3);

/// `GET /v1/apps/{app}/audit`.
pub async fn list(
    State(api): State<Api>,
    Path(app): Path<String>,
) -> Result<Json<AuditList>, ApiError> {
    bazaar_types::ids::validate_name("app", &app).map_err(ApiError::BadRequest)?;
    let catalog = api.catalog()?;
    let created_at_ms = catalog
        .app(&app)
        .ok_or_else(|| ApiError::NotFound(format!("app {app} not found")))?
        .created_at_ms;
    let hosts = catalog.hosts();
    let asks = hosts.iter().map(|h| {
        let req = api
            .to_node(
                reqwest::Method::GET,
                &h.record.api_addr,
                &format!("/host/v1/audit/{app}"),
            )
            .timeout(HOST_TIMEOUT);
        async move {
            let entries = async {
                let resp = req.send().await.ok()?.error_for_status().ok()?;
                resp.json::<Vec<AuditEntry>>().await.ok()
            }
            .await;
            (h.record.id.clone(), entries)
        }
    });
    let mut entries = Vec::new();
    let mut unreachable = Vec::new();
    for (host, answer) in futures_util::future::join_all(asks).await {
        match answer {
            Some(e) => entries.extend(e.into_iter().filter(|e| e.time_ms >= created_at_ms)),
            None => unreachable.push(host),
        }
    }
    entries.sort_by_key(|e| e.time_ms);
    Ok(Json(AuditList {
        app,
        entries,
        unreachable_hosts: unreachable,
    }))
}

pub(crate) fn list_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "AppsAudit",
        "apps",
        "bazaar extension: every change made to the app through the Machines API (who: \
         the token's id; what; when; from where; the answer's status), gathered from the \
         audit record of every host. Org tokens and tokens of this app.",
        &[400, 401, 404, 503],
    )
}
