//! `/v1/apps/{app}/secrets`: an app's secrets, in the shapes of Fly's Machines API (names,
//! digests and times; values are write-only and never answered). Set and unset on any node:
//! the node seals the value and publishes it as a catalog row of its own
//! (`bazaar_agent::app_secrets`). Request bodies are parsed by hand so that no error
//! message can quote a value.

use crate::error::ApiError;
use crate::openapi::{op, Answer, RawJson};
use crate::Api;
use aide::transform::TransformOperation;
use axum::extract::{Path, State};
use axum::Json;
use bazaar_catalog::SecretRecord;
use bazaar_node::secrets::SecretError;
use bazaar_types::api::{
    EmptyResponse, Secret, SecretList, SetSecretRequest, UpdateSecretsRequest,
};
use serde_json::Value;

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

fn secret_of(s: &SecretRecord) -> Secret {
    Secret {
        name: s.name.clone(),
        digest: s.digest.clone(),
        created_at: bazaar_types::rfc3339(s.created_at_ms),
        updated_at: bazaar_types::rfc3339(s.updated_at_ms),
    }
}

fn list_of(secrets: &[SecretRecord]) -> SecretList {
    SecretList {
        secrets: secrets.iter().map(secret_of).collect(),
    }
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
pub async fn list(
    State(api): State<Api>,
    Path(app): Path<String>,
) -> Result<Json<SecretList>, ApiError> {
    require_app(&api, &app)?;
    Ok(Json(list_of(&api.0.node.app_secrets(&app))))
}

pub(crate) fn list_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "AppSecretsList",
        "secrets",
        "The app's secrets: names, digests and times, never values.",
        &[401, 404, 503],
    )
}

/// `POST /v1/apps/{app}/secrets` with `{"values": {"NAME": "value" | null}}`: sets each name
/// with a string and unsets each with `null`, all or nothing; answers the app's secrets.
pub async fn update(
    State(api): State<Api>,
    Path(app): Path<String>,
    RawJson(body, ..): RawJson<UpdateSecretsRequest>,
) -> Result<Json<SecretList>, ApiError> {
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
    Ok(Json(list_of(&secrets)))
}

pub(crate) fn update_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "AppSecretsUpdate",
        "secrets",
        "Set (a string) and unset (null) secrets, all or nothing. Sealed with the cluster's \
         key and given to the app's machines as environment variables at their next start \
         (a secret wins over `config.env`); `bazaar secrets set` restarts them. Names: \
         environment variable syntax, not FLY_* or BAZAAR_*; values: at most 64 KiB. \
         Needs the `secrets` operation on the app.",
        &[400, 401, 403, 404, 503],
    )
}

/// `GET /v1/apps/{app}/secrets/{name}` → `{name, digest, created_at, updated_at}`.
pub async fn get(
    State(api): State<Api>,
    Path((app, name)): Path<(String, String)>,
) -> Result<Json<Secret>, ApiError> {
    require_app(&api, &app)?;
    api.0
        .node
        .app_secrets(&app)
        .iter()
        .find(|s| s.name == name)
        .map(|s| Json(secret_of(s)))
        .ok_or_else(|| ApiError::NotFound(format!("secret {name} not found")))
}

pub(crate) fn get_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "AppSecretShow",
        "secrets",
        "One secret: its name, digest and times, never its value.",
        &[401, 404, 503],
    )
}

/// `POST /v1/apps/{app}/secrets/{name}` with `{"value": "..."}`: sets one secret (201).
pub async fn set(
    State(api): State<Api>,
    Path((app, name)): Path<(String, String)>,
    RawJson(body, ..): RawJson<SetSecretRequest>,
) -> Result<Answer<201, Secret>, ApiError> {
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
    secrets
        .iter()
        .find(|s| s.name == name)
        .map(|s| Answer(secret_of(s)))
        .ok_or_else(|| ApiError::Internal(format!("secret {name} was set but is not listed")))
}

pub(crate) fn set_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "AppSecretSet",
        "secrets",
        "Set one secret.",
        &[400, 401, 403, 404, 503],
    )
}

/// `DELETE /v1/apps/{app}/secrets/{name}`: unsets it (404 if it is not set).
pub async fn unset(
    State(api): State<Api>,
    Path((app, name)): Path<(String, String)>,
) -> Result<Json<EmptyResponse>, ApiError> {
    api.0.node.set_app_secrets(&app, &[(name, None)])?;
    Ok(Json(EmptyResponse {}))
}

pub(crate) fn unset_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        "AppSecretDelete",
        "secrets",
        "Unset a secret (machines lose it at their next start).",
        &[400, 401, 403, 404, 503],
    )
}
