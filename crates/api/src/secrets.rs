//! `/v1/apps/{app}/secrets`: an app's secrets, in the shapes of Fly's Machines API (names,
//! digests and times; values are write-only and never answered). Set and unset on any node:
//! the node seals the value and publishes it as a catalog row of its own
//! (`bazaar_agent::app_secrets`). Request bodies are parsed by hand so that no error
//! message can quote a value.

use crate::error::ApiError;
use crate::Api;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bazaar_catalog::SecretRecord;
use bazaar_node::secrets::SecretError;
use serde_json::{json, Value};

impl From<SecretError> for ApiError {
    fn from(err: SecretError) -> ApiError {
        match err {
            SecretError::Invalid(m) => ApiError::BadRequest(m),
            SecretError::NoApp(_) | SecretError::NotFound(_) => ApiError::NotFound(err.to_string()),
            SecretError::NoCatalog => ApiError::Unavailable(err.to_string()),
            SecretError::Unreadable { .. } => ApiError::Internal(err.to_string()),
        }
    }
}

fn secret_json(s: &SecretRecord) -> Value {
    json!({
        "name": s.name,
        "digest": s.digest,
        "created_at": bazaar_types::rfc3339(s.created_at_ms),
        "updated_at": bazaar_types::rfc3339(s.updated_at_ms),
    })
}

fn list_json(secrets: &[SecretRecord]) -> Value {
    json!({"secrets": secrets.iter().map(secret_json).collect::<Vec<_>>()})
}

fn require_app(api: &Api, app: &str) -> Result<(), ApiError> {
    match api.catalog()?.app(app) {
        Some(_) => Ok(()),
        None => Err(ApiError::NotFound(format!("app {app} not found"))),
    }
}

/// A JSON object body; the parser's message says where it is malformed, never what a
/// value is.
fn object_body(body: &[u8]) -> Result<serde_json::Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ApiError::BadRequest(
            "invalid JSON body: expected a JSON object".into(),
        )),
        Err(e) => Err(ApiError::BadRequest(format!(
            "invalid JSON body at line {} column {}",
            e.line(),
            e.column()
        ))),
    }
}

/// `GET /v1/apps/{app}/secrets` → `{"secrets": [{name, digest, created_at, updated_at}]}`.
pub async fn list(State(api): State<Api>, Path(app): Path<String>) -> Result<Response, ApiError> {
    require_app(&api, &app)?;
    Ok(Json(list_json(&api.0.node.app_secrets(&app))).into_response())
}

/// `POST /v1/apps/{app}/secrets` with `{"values": {"NAME": "value" | null}}`: sets each name
/// with a string and unsets each with `null`, all or nothing; answers the app's secrets.
pub async fn update(
    State(api): State<Api>,
    Path(app): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let mut body = object_body(&body)?;
    let Some(Value::Object(values)) = body.remove("values") else {
        return Err(ApiError::BadRequest(
            "values is required: an object of NAME: value (a string, or null to unset)".into(),
        ));
    };
    let mut changes = Vec::with_capacity(values.len());
    for (name, value) in values {
        let value = match value {
            Value::String(s) => Some(s),
            Value::Null => None,
            _ => {
                return Err(ApiError::BadRequest(format!(
                    "the value of secret {name:?} must be a string (or null to unset it)"
                )))
            }
        };
        changes.push((name, value));
    }
    let secrets = api.0.node.set_app_secrets(&app, &changes)?;
    Ok(Json(list_json(&secrets)).into_response())
}

/// `GET /v1/apps/{app}/secrets/{name}` → `{name, digest, created_at, updated_at}`.
pub async fn get(
    State(api): State<Api>,
    Path((app, name)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    require_app(&api, &app)?;
    api.0
        .node
        .app_secrets(&app)
        .iter()
        .find(|s| s.name == name)
        .map(|s| Json(secret_json(s)).into_response())
        .ok_or_else(|| ApiError::NotFound(format!("secret {name} not found")))
}

/// `POST /v1/apps/{app}/secrets/{name}` with `{"value": "..."}`: sets one secret (201).
pub async fn set(
    State(api): State<Api>,
    Path((app, name)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let value = match object_body(&body)?.remove("value") {
        Some(Value::String(s)) => s,
        _ => {
            return Err(ApiError::BadRequest(
                "value is required and must be a string".into(),
            ))
        }
    };
    let secrets = api
        .0
        .node
        .set_app_secrets(&app, &[(name.clone(), Some(value))])?;
    let secret = secrets
        .iter()
        .find(|s| s.name == name)
        .map(secret_json)
        .unwrap_or_default();
    Ok((StatusCode::CREATED, Json(secret)).into_response())
}

/// `DELETE /v1/apps/{app}/secrets/{name}`: unsets it (404 if it is not set).
pub async fn unset(
    State(api): State<Api>,
    Path((app, name)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    api.0.node.set_app_secrets(&app, &[(name, None)])?;
    Ok(Json(json!({})).into_response())
}
