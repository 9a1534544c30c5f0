//! `/v1/apps/{app}/certificates`: TLS certificates of an app's hostnames (Fly's `fly certs`),
//! served by every host's proxy. Handled by the node that receives the call: it issues
//! (ACME) or takes the user's PEM, and owns and renews the certificate row it publishes
//! (`bazaar_certs`). Reads come from the local catalog.

use crate::error::ApiError;
use crate::machines::require_app;
use crate::{parse_body, Api};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bazaar_certs::manager::CertError;
use bazaar_certs::Certs;
use serde::Deserialize;

/// Body of `POST /v1/apps/{app}/certificates`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AddCertificate {
    hostname: String,
    /// The certificate chain, PEM (with `key`: no ACME).
    #[serde(default)]
    cert: Option<String>,
    #[serde(default)]
    key: Option<String>,
}

fn certs(api: &Api) -> Result<Certs, ApiError> {
    Certs::new(&api.0.node).map_err(|e| ApiError::Unavailable(e.to_string()))
}

/// `GET /v1/apps/{app}/certificates`.
pub async fn list(State(api): State<Api>, Path(app): Path<String>) -> Result<Response, ApiError> {
    require_app(&api, &app)?;
    Ok(Json(certs(&api)?.list(&app)).into_response())
}

/// `POST /v1/apps/{app}/certificates`: issue by ACME, or take `cert` and `key`.
pub async fn add(
    State(api): State<Api>,
    Path(app): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    require_app(&api, &app)?;
    let req: AddCertificate = parse_body(&body)?;
    let certs = certs(&api)?;
    let added = match (&req.cert, &req.key) {
        (Some(cert), Some(key)) => certs.add_pem(&app, &req.hostname, cert, key),
        (None, None) => certs.add_acme(&app, &req.hostname),
        _ => {
            return Err(ApiError::BadRequest(
                "give both cert and key (PEM), or neither to issue by ACME".into(),
            ))
        }
    };
    match added {
        Ok(info) => Ok((StatusCode::CREATED, Json(info)).into_response()),
        Err(CertError::Invalid(why)) => Err(ApiError::BadRequest(why)),
        Err(CertError::Taken(why)) => Err(ApiError::Conflict(why)),
    }
}

/// `GET /v1/apps/{app}/certificates/{hostname}`.
pub async fn show(
    State(api): State<Api>,
    Path((app, hostname)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    require_app(&api, &app)?;
    match certs(&api)?.show(&app, &hostname) {
        Some(info) => Ok(Json(info).into_response()),
        None => Err(not_found(&app, &hostname)),
    }
}

/// `DELETE /v1/apps/{app}/certificates/{hostname}`.
pub async fn remove(
    State(api): State<Api>,
    Path((app, hostname)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    require_app(&api, &app)?;
    if certs(&api)?.remove(&app, &hostname) {
        Ok(Json(serde_json::json!({ "ok": true })).into_response())
    } else {
        Err(not_found(&app, &hostname))
    }
}

fn not_found(app: &str, hostname: &str) -> ApiError {
    ApiError::NotFound(format!("app {app} has no certificate for {hostname}"))
}
