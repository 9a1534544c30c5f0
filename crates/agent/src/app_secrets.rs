//! App secrets (Fly's `fly secrets`): set and unset through any host's API, sealed with the
//! cluster's `app-secrets` key (`bazaar-seal`: ChaCha20-Poly1305, the associated data
//! `app/<app>/secret/<NAME>`), spread as catalog rows of the host that wrote them
//! ([`bazaar_catalog::SecretRecord`]; the latest write of a name wins), and opened by the
//! host that starts a machine of the app, at every start, to be added to the workload's
//! environment. Plain text exists only in the request that sets a value and in the
//! environment of the workloads; rows, the store, specs on disk and answers hold the sealed
//! value or a keyed digest.

use crate::agent::Agent;
use crate::error::AgentError;
use axum::extract::{Request, State};
use axum::http::header::RETRY_AFTER;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use bazaar_catalog::SecretRecord;
use bazaar_seal::SealKey;
use sha2::{Digest as _, Sha256};
use std::time::Duration;

pub use bazaar_node::secrets::{
    validate_name, validate_value, SecretError, MAX_NAME_LEN, MAX_SECRETS_PER_APP, MAX_VALUE_BYTES,
    SECRETS_VERSION_HEADER,
};
/// Longest an owner waits for the secrets a forwarded call saw.
const SECRETS_WAIT: Duration = Duration::from_secs(3);

/// The purpose the sealing key is derived for.
const SEAL_PURPOSE: &str = "app-secrets";

/// The associated data a secret's value is sealed for: moved to another app or name, it
/// does not open.
fn place(app: &str, name: &str) -> String {
    format!("app/{app}/secret/{name}")
}

fn seal_key(agent: &Agent) -> SealKey {
    SealKey::derive(agent.cluster_secret().as_bytes(), SEAL_PURPOSE)
}

/// A digest of a value that shows it changed (16 hex digits), keyed with the cluster
/// secret: a holder of a read token cannot guess a short value from it.
fn secret_digest(agent: &Agent, app: &str, name: &str, value: &str) -> String {
    let key = Sha256::new()
        .chain_update(b"bazaar secret digest v1\0")
        .chain_update(agent.cluster_secret().as_bytes())
        .finalize();
    let digest = Sha256::new()
        .chain_update(key)
        .chain_update(app.as_bytes())
        .chain_update([0])
        .chain_update(name.as_bytes())
        .chain_update([0])
        .chain_update(value.as_bytes())
        .finalize();
    hex::encode(&digest[..8])
}

/// Sets (`Some`) and unsets (`None`) secrets of `app` in one go: every name and value is
/// checked first, so a bad one changes nothing. Unsetting a name that is not set is an
/// error only when it is the only change (`NotFound`). Returns the app's secrets after
/// the change (set ones only).
pub fn set_app_secrets(
    agent: &Agent,
    app: &str,
    changes: &[(String, Option<String>)],
) -> Result<Vec<SecretRecord>, SecretError> {
    let catalog = agent.catalog().ok_or(SecretError::NoCatalog)?;
    let app_record = catalog
        .app(app)
        .ok_or_else(|| SecretError::NoApp(app.to_string()))?;
    if changes.is_empty() {
        return Err(SecretError::Invalid("no secrets given".into()));
    }
    for (name, value) in changes {
        validate_name(name)?;
        if let Some(value) = value {
            validate_value(name, value)?;
        }
    }
    let current = catalog.app_secrets(app);
    let is_set = |name: &str| current.iter().any(|s| s.name == name && s.sealed.is_some());
    if let [(name, None)] = changes {
        if !is_set(name) {
            return Err(SecretError::NotFound(name.clone()));
        }
    }
    let mut names: std::collections::BTreeSet<&str> = current
        .iter()
        .filter(|s| s.sealed.is_some())
        .map(|s| s.name.as_str())
        .collect();
    for (name, value) in changes {
        match value {
            Some(_) => names.insert(name),
            None => names.remove(name.as_str()),
        };
    }
    if names.len() > MAX_SECRETS_PER_APP {
        return Err(SecretError::Invalid(format!(
            "an app may hold at most {MAX_SECRETS_PER_APP} secrets"
        )));
    }
    let key = seal_key(agent);
    let now = bazaar_types::now_ms();
    for (name, value) in changes {
        if value.is_none() && !is_set(name) {
            continue;
        }
        let created_at_ms = current
            .iter()
            .find(|s| s.name == *name && s.sealed.is_some())
            .map_or(now, |s| s.created_at_ms);
        catalog.publish_secret(SecretRecord {
            id: SecretRecord::key_of(app, name),
            app: app.to_string(),
            name: name.clone(),
            set_by_host: agent.host_id().to_string(),
            sealed: value
                .as_ref()
                .map(|v| key.seal(&place(app, name), v.as_bytes())),
            digest: value
                .as_ref()
                .map(|v| secret_digest(agent, app, name, v))
                .unwrap_or_default(),
            app_created_at_ms: app_record.created_at_ms,
            created_at_ms,
            updated_at_ms: now,
        });
    }
    tracing::info!(app, changed = changes.len(), "app secrets changed");
    Ok(app_secrets(agent, app))
}

/// The version of an app's secrets: the time of the latest set or unset (0: none).
pub fn app_secrets_version(agent: &Agent, app: &str) -> u64 {
    agent.catalog().map_or(0, |c| c.app_secrets_version(app))
}

/// The [`SECRETS_VERSION_HEADER`] value for a call about `app` forwarded to another
/// host, if the app has secrets.
pub fn secrets_version_header(agent: &Agent, app: &str) -> Option<String> {
    match app_secrets_version(agent, app) {
        0 => None,
        version => Some(format!("{version} {app}")),
    }
}

/// The secrets of `app` that are set, ordered by name (sealed; never opened here).
pub fn app_secrets(agent: &Agent, app: &str) -> Vec<SecretRecord> {
    agent
        .catalog()
        .map(|c| c.app_secrets(app))
        .unwrap_or_default()
        .into_iter()
        .filter(|s| s.sealed.is_some())
        .collect()
}

/// The environment a machine of `app` gets from its app's secrets, opened now (every
/// start reads the latest). An error names the secret that does not open.
pub fn app_secret_env(agent: &Agent, app: &str) -> Result<Vec<(String, String)>, SecretError> {
    let secrets = app_secrets(agent, app);
    if secrets.is_empty() {
        return Ok(Vec::new());
    }
    let key = seal_key(agent);
    secrets
        .into_iter()
        .map(|s| {
            let unreadable = || SecretError::Unreadable {
                app: app.to_string(),
                name: s.name.clone(),
            };
            let sealed = s.sealed.as_deref().unwrap_or_default();
            let plain = key
                .open(&place(app, &s.name), sealed)
                .map_err(|_| unreadable())?;
            let value = String::from_utf8(plain).map_err(|_| unreadable())?;
            Ok((s.name, value))
        })
        .collect()
}

/// Host interface middleware: a call carrying [`SECRETS_VERSION_HEADER`] waits until this
/// host's catalog holds that version of the app's secrets. When `SECRETS_WAIT` passes
/// first, the call is refused with 503 and `Retry-After` (nothing done): a machine must
/// not start without the secrets its caller already saw set. A refused claim sends the
/// exchange on to its next offer; a forwarded start or update is the client's to retry.
pub async fn await_secrets(State(agent): State<Agent>, req: Request, next: Next) -> Response {
    let wanted = req
        .headers()
        .get(SECRETS_VERSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .and_then(|(version, app)| Some((version.parse::<u64>().ok()?, app.to_string())));
    if let Some((version, app)) = wanted {
        let deadline = tokio::time::Instant::now() + SECRETS_WAIT;
        while app_secrets_version(&agent, &app) < version {
            if tokio::time::Instant::now() >= deadline {
                let held = app_secrets_version(&agent, &app);
                let mut resp = AgentError::Busy(format!(
                    "this host has not yet received version {version} of app {app}'s secrets \
                     (it holds version {held}); nothing was done: retry shortly"
                ))
                .into_response();
                resp.headers_mut()
                    .insert(RETRY_AFTER, HeaderValue::from_static("1"));
                return resp;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_environment_variable_syntax() {
        for ok in ["DATABASE_URL", "_X", "a1", "Key_2"] {
            assert_eq!(validate_name(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "1A",
            "A-B",
            "A B",
            "A=B",
            "É",
            "FLY_APP_NAME",
            "BAZAAR_X",
        ] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
        assert!(validate_name(&"A".repeat(MAX_NAME_LEN + 1)).is_err());
    }

    #[test]
    fn value_errors_never_show_the_value() {
        let big = "s3cr3t".repeat(MAX_VALUE_BYTES);
        let err = validate_value("K", &big).unwrap_err().to_string();
        assert!(!err.contains("s3cr3t"), "{err}");
        let err = validate_value("K", "s3cr3t\0").unwrap_err().to_string();
        assert!(!err.contains("s3cr3t"), "{err}");
        assert_eq!(validate_value("K", "fine"), Ok(()));
    }
}
