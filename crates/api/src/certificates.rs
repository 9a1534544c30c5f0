//! `/v1/apps/{app}/certificates`: TLS certificates of an app's hostnames (Fly's `fly certs`),
//! served by every host's proxy. Handled by the node that receives the call: it issues
//! (ACME) or takes the user's PEM, and owns and renews the certificate row it publishes
//! (`bazaar_certs`). Reads come from the local catalog.

use crate::error::ApiError;
use crate::machines::require_app;
use crate::openapi::{op, Answer, Body};
use crate::Api;
use aide::transform::TransformOperation;
use axum::extract::{Path, State};
use axum::Json;
use bazaar_certs::manager::CertError;
use bazaar_certs::Certs;
use bazaar_types::api::{AcmeCertificateRequest, AddCertificateRequest, Certificate, OkResponse};

fn certs(api: &Api) -> Result<Certs, ApiError> {
    Certs::new(&api.0.node).map_err(|e| ApiError::Unavailable(e.to_string()))
}

/// `GET /v1/apps/{app}/certificates`.
pub async fn list(
    State(api): State<Api>,
    Path(app): Path<String>,
) -> Result<Json<Vec<Certificate>>, ApiError> {
    require_app(&api, &app)?;
    Ok(Json(certs(&api)?.list(&app)))
}

pub(crate) fn list_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "CertificatesList",
        "certificates",
        "bazaar extension: the TLS certificates of the app's hostnames, served by every \
         host's proxy (SNI) and routed to the app.",
        &[400, 401, 404, 503],
    )
}

/// `POST /v1/apps/{app}/certificates`: issue by ACME, or take `cert` and `key`.
pub async fn add(
    State(api): State<Api>,
    Path(app): Path<String>,
    Body(req): Body<AddCertificateRequest>,
) -> Result<Answer<201, Certificate>, ApiError> {
    require_app(&api, &app)?;
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
    added.map(Answer).map_err(refusal)
}

/// What a refused attach answers.
fn refusal(err: CertError) -> ApiError {
    match err {
        CertError::Invalid(why) => ApiError::BadRequest(why),
        CertError::Taken(why) => ApiError::Conflict(why),
    }
}

/// `POST /v1/apps/{app}/certificates/acme`: Fly's path to attach a hostname whose
/// certificate is issued by ACME (as `POST .../certificates` without `cert` and `key`).
pub async fn add_acme(
    State(api): State<Api>,
    Path(app): Path<String>,
    Body(req): Body<AcmeCertificateRequest>,
) -> Result<Answer<201, Certificate>, ApiError> {
    require_app(&api, &app)?;
    certs(&api)?
        .add_acme(&app, &req.hostname)
        .map(Answer)
        .map_err(refusal)
}

pub(crate) fn add_acme_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "CertificatesAddAcme",
        "certificates",
        "Attach a hostname to the app with a certificate issued by ACME (HTTP-01, answered \
         by every proxy) in the background: `pending`, then `issued` or `failed`. 400 on a \
         host without an ACME directory.",
        &[400, 401, 404, 409, 503],
    )
}

/// `POST /v1/apps/{app}/certificates/{hostname}/check`.
pub async fn check(
    State(api): State<Api>,
    Path((app, hostname)): Path<(String, String)>,
) -> Result<Json<Certificate>, ApiError> {
    require_app(&api, &app)?;
    match certs(&api)?.check(&app, &hostname) {
        Ok(Some(info)) => Ok(Json(info)),
        Ok(None) => Err(not_found(&app, &hostname)),
        Err(err) => Err(refusal(err)),
    }
}

pub(crate) fn check_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "CertificatesCheck",
        "certificates",
        "Look at a hostname's certificate again: an ACME certificate whose issuance failed is \
         issued again (`pending`); any other is answered with its status as it is.",
        &[400, 401, 404, 409, 503],
    )
}

pub(crate) fn add_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "CertificatesAdd",
        "certificates",
        "bazaar extension: attach a hostname to the app. Without `cert`/`key` its \
         certificate is issued by ACME (HTTP-01, answered by every proxy) in the \
         background: `pending`, then `issued` or `failed` with the ACME error. With them \
         (PEM) it is checked (the key matches, the certificate names the hostname) and \
         served at once. The host that handles the call owns and renews it.",
        &[400, 401, 404, 409, 503],
    )
}

/// `GET /v1/apps/{app}/certificates/{hostname}`.
pub async fn show(
    State(api): State<Api>,
    Path((app, hostname)): Path<(String, String)>,
) -> Result<Json<Certificate>, ApiError> {
    require_app(&api, &app)?;
    match certs(&api)?.show(&app, &hostname) {
        Some(info) => Ok(Json(info)),
        None => Err(not_found(&app, &hostname)),
    }
}

pub(crate) fn show_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "CertificatesShow",
        "certificates",
        "bazaar extension: one hostname's certificate and its status.",
        &[400, 401, 404, 503],
    )
}

/// `DELETE /v1/apps/{app}/certificates/{hostname}`.
pub async fn remove(
    State(api): State<Api>,
    Path((app, hostname)): Path<(String, String)>,
) -> Result<Json<OkResponse>, ApiError> {
    require_app(&api, &app)?;
    if certs(&api)?.remove(&app, &hostname) {
        Ok(Json(OkResponse { ok: true }))
    } else {
        Err(not_found(&app, &hostname))
    }
}

pub(crate) fn remove_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "CertificatesRemove",
        "certificates",
        "bazaar extension: detach a hostname; every proxy stops serving it.",
        &[400, 401, 404, 503],
    )
}

fn not_found(app: &str, hostname: &str) -> ApiError {
    ApiError::NotFound(format!("app {app} has no certificate for {hostname}"))
}
