//! Apps that lost their name (issue 31, item 7). Two nodes that cannot hear each other may
//! both create an app of one name; once the catalog converges every node names the same
//! one the app (`bazaar_catalog`'s `replica::apps`: earliest creation, then host id, then
//! app id), and the other *lost the name*: it is listed with status `name_conflict`, takes
//! no machines and starts none (its machines' owners answer 409), and its machines are
//! never listed, routed or named in DNS as the app's.
//!
//! Paths name apps by name, so a caller who means one app of the name says which with the
//! header `bazaar-app-id` (the `id` its create answered): a call about an app that lost the
//! name answers 409 naming the rule and the winner, one about an app of another id 404.
//! Without the header a call is about the app of the name, whichever org made it.

use crate::error::ApiError;
use crate::Api;
use axum::extract::{FromRequestParts, RawPathParams, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The header naming the app a call means by its id.
pub const APP_ID_HEADER: &str = "bazaar-app-id";

/// Middleware of the Machines API: checks `bazaar-app-id` against the app the path names.
pub async fn require_app_id(State(api): State<Api>, req: Request, next: Next) -> Response {
    let Some(value) = req.headers().get(APP_ID_HEADER) else {
        return next.run(req).await;
    };
    let Some(id) = value.to_str().ok().filter(|v| is_app_id(v)) else {
        return ApiError::BadRequest(format!(
            "{APP_ID_HEADER} must be an app id (app_ and 16 hex digits)"
        ))
        .into_response();
    };
    let id = id.to_string();
    let (mut parts, body) = req.into_parts();
    let app = match RawPathParams::from_request_parts(&mut parts, &()).await {
        Ok(params) => params
            .iter()
            .find(|(k, _)| *k == "app")
            .map(|(_, v)| v.to_string()),
        Err(_) => None,
    };
    if let Some(app) = app {
        if let Err(err) = check(&api, &app, &id) {
            return err.into_response();
        }
    }
    next.run(Request::from_parts(parts, body)).await
}

/// Whether app `id` is the app named `app`: 409 if it lost the name, 404 if no app of the
/// name has that id.
fn check(api: &Api, app: &str, id: &str) -> Result<(), ApiError> {
    let catalog = api.catalog()?;
    if let Some(winner) = catalog.lost_to(app, id) {
        return Err(ApiError::Conflict(winner.lost_name_message(id)));
    }
    match catalog.app(app) {
        Some(a) if a.id == id => Ok(()),
        _ => Err(ApiError::NotFound(format!(
            "app {app} with id {id} not found"
        ))),
    }
}

fn is_app_id(v: &str) -> bool {
    v.strip_prefix("app_")
        .is_some_and(|hex| hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn app_ids_are_recognized() {
        assert!(super::is_app_id("app_0123456789abcdef"));
        assert!(!super::is_app_id("app_0123456789abcde"));
        assert!(!super::is_app_id("app_0123456789abcdeg"));
        assert!(!super::is_app_id("race2"));
    }
}
