//! Who may do what on the Machines API: every request's token is checked once
//! ([`bazaar_node::Node::caller`]: the cluster secret, a token-file token, or a scoped token
//! verified offline), its route mapped to an app and an operation ([`route_access`]), and
//! the token's scope asked ([`bazaar_node::Caller::authorize`]). A token scoped to
//! other apps gets 404 (as if the app did not exist), one that does not allow the operation
//! 403, an invalid, expired or revoked one 401. Every change (any method but `GET`/`HEAD`) by
//! a known caller is written to this host's audit record with its answer's status.
//!
//! The check reads the request as its handler does: the route as the router matched it and
//! its path parameters decoded (`/v1/apps/%61pp` is app `app` to both), never the body (the
//! audit record only takes a new app's name from it). What a body asks for (a machine
//! config's driver) is authorized by `authorize_config` on the value the handler acts on,
//! parsed once (`openapi::Checked`).

use crate::error::ApiError;
use axum::extract::{ConnectInfo, FromRequestParts, MatchedPath, RawPathParams, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bazaar_auth::{Access, Denied, Op};
use bazaar_node::AuditEntry;
use bazaar_node::Caller;
use bazaar_node::NodeHandle;

/// What a route touches: its app and machine (if any) and its operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteAccess {
    pub app: Option<String>,
    pub machine_id: Option<String>,
    pub op: Op,
}

/// The app, machine and operation of a Machines API request.
pub fn route_access(method: &Method, path: &str) -> RouteAccess {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let read = *method == Method::GET || *method == Method::HEAD;
    let mut access = RouteAccess {
        app: None,
        machine_id: None,
        op: if read { Op::Read } else { Op::Create },
    };
    match segments.as_slice() {
        // `/v1/apps` (list, create), `/v1/platform/...` (reads and dry runs).
        ["v1", "apps"] => {}
        ["v1", "platform", ..] => access.op = Op::Read,
        ["v1", "apps", app, rest @ ..] => {
            access.app = Some(app.to_string());
            if read {
                return access;
            }
            access.op = match rest {
                [] => Op::Destroy,
                ["machines"] | ["machines", "batch"] => Op::Create,
                ["volumes", ..] => Op::Volumes,
                ["secrets", ..] => Op::Secrets,
                ["machines", id, action @ ..] => {
                    access.machine_id = Some(id.to_string());
                    machine_op(method, action)
                }
                _ => Op::Update,
            };
        }
        _ => {
            if !read {
                access.op = Op::Update;
            }
        }
    }
    access
}

/// The operation of a change to one machine (`action`: the path after its id).
fn machine_op(method: &Method, action: &[&str]) -> Op {
    match action {
        [] if *method == Method::DELETE => Op::Destroy,
        [] => Op::Update,
        ["start"] => Op::Start,
        ["stop"] => Op::Stop,
        ["restart"] => Op::Restart,
        ["signal"] => Op::Signal,
        ["suspend"] => Op::Suspend,
        ["exec"] => Op::Exec,
        ["lease", ..] => Op::Lease,
        _ => Op::Update,
    }
}

/// The access of a request as its handler sees it: the route the router matched (its
/// template, so a parameter's value never changes the operation) with the app and machine
/// of its decoded path parameters; a request no route matched by its raw path.
async fn access_of(req: Request) -> Result<(RouteAccess, Request), ApiError> {
    let Some(template) = req.extensions().get::<MatchedPath>().cloned() else {
        let route = route_access(req.method(), req.uri().path());
        return Ok((route, req));
    };
    let (mut parts, body) = req.into_parts();
    let params = match RawPathParams::from_request_parts(&mut parts, &()).await {
        Ok(params) => params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        Err(axum::extract::rejection::RawPathParamsRejection::MissingPathParams(_)) => Vec::new(),
        Err(rejection) => return Err(ApiError::BadRequest(rejection.body_text())),
    };
    let param = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let mut route = route_access(&parts.method, template.as_str());
    route.app = route.app.map(|_| param("app"));
    route.machine_id = route.machine_id.map(|_| param("id"));
    Ok((route, Request::from_parts(parts, body)))
}

/// The middleware of the Machines API (state: the node).
pub async fn require_access(State(node): State<NodeHandle>, req: Request, next: Next) -> Response {
    let peer_host = req
        .extensions()
        .get::<bazaar_node::host_link::PeerHost>()
        .map(|p| p.0.clone());
    let caller = match (peer_host, bearer(&req).map(|t| node.caller(t))) {
        // Another host over the host listener (mTLS): it checked its own caller's token.
        (Some(host), _) => Caller::Host(host),
        (None, None) => return ApiError::Unauthorized.into_response(),
        (None, Some(Err(denied))) => return refusal(denied, None).into_response(),
        (None, Some(Ok(caller))) => caller,
    };
    let (route, mut req) = match access_of(req).await {
        Ok(found) => found,
        Err(err) => return err.into_response(),
    };
    let is_change = !(req.method() == Method::GET || req.method() == Method::HEAD);
    let verdict = caller.authorize(&Access {
        app: route.app.as_deref(),
        op: route.op,
        process: false,
        runtime: None,
    });
    // An app's creation is recorded under the app it creates (named in the body).
    let mut audit_app = route.app.clone();
    if route.app.is_none() && *req.method() == Method::POST && req.uri().path() == "/v1/apps" {
        let (parts, body) = req.into_parts();
        let bytes = axum::body::to_bytes(body, crate::MAX_BODY_BYTES)
            .await
            .unwrap_or_default();
        audit_app = created_app_name(&bytes);
        req = Request::from_parts(parts, axum::body::Body::from(bytes));
    }
    let peer = req
        .extensions()
        .get::<ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.to_string())
        .unwrap_or_default();
    let (method, path) = (req.method().to_string(), req.uri().path().to_string());
    let response = match verdict {
        Ok(()) => {
            req.extensions_mut().insert(caller.clone());
            req.extensions_mut().insert(route.clone());
            next.run(req).await
        }
        Err(denied) => refusal(denied, route.app.as_deref()).into_response(),
    };
    if is_change {
        node.record_audit(&AuditEntry {
            time: bazaar_types::rfc3339(bazaar_types::now_ms()),
            time_ms: bazaar_types::now_ms(),
            token_id: caller.id(),
            method,
            path,
            app: audit_app,
            machine_id: route.machine_id,
            peer,
            status: response.status().as_u16(),
            host_id: node.host_id().to_string(),
        });
    }
    response
}

/// Whether the caller of a request ([`require_access`] put it and the route's access in the
/// request) may have the machine config `config` made or acted on: a config that runs the
/// process driver needs a token that allows it, and a token limited to runtimes allows only
/// configs of those (403 otherwise). `config` is the value the
/// handler goes on to use, parsed once.
pub(crate) fn authorize_config(
    caller: Option<&Caller>,
    route: Option<&RouteAccess>,
    config: Option<&bazaar_types::config::MachineConfig>,
) -> Result<(), ApiError> {
    let (Some(caller), Some(route)) = (caller, route) else {
        return Err(ApiError::Internal(
            "the request's token was not checked".into(),
        ));
    };
    caller
        .authorize(&Access {
            app: route.app.as_deref(),
            op: route.op,
            process: config.is_some_and(|c| c.driver() == "process"),
            runtime: config.map(|c| c.runtime()),
        })
        .map_err(|denied| refusal(denied, route.app.as_deref()))
}

/// Whether the caller of a request (set by [`require_access`]) may use leases on `app`
/// (and so see a lease's nonce).
pub(crate) fn may_lease(caller: Option<&Caller>, app: &str) -> bool {
    caller.is_some_and(|c| {
        c.authorize(&Access {
            app: Some(app),
            op: Op::Lease,
            process: false,
            runtime: None,
        })
        .is_ok()
    })
}

/// The answer to a refused request.
fn refusal(denied: Denied, app: Option<&str>) -> ApiError {
    match denied {
        Denied::Invalid(_) | Denied::Expired => ApiError::InvalidToken(denied.to_string()),
        // The same answer as for an app that does not exist (`apps::get`).
        Denied::OtherApp => ApiError::NotFound(format!("app {} not found", app.unwrap_or(""))),
        Denied::Forbidden(why) => ApiError::Forbidden(why),
    }
}

/// The app a `POST /v1/apps` body names (`app_name`, or `name`), read as its handler reads
/// it (a body with a key given twice names none: the handler refuses it).
fn created_app_name(body: &[u8]) -> Option<String> {
    let object = bazaar_types::json::parse_object(body).ok()?;
    object.refuse_duplicates().ok()?;
    let v = object.value;
    v.get("app_name")
        .or_else(|| v.get("name"))?
        .as_str()
        .map(str::to_string)
}

/// The token of a request: `Authorization: Bearer <token>` or Fly's `FlyV1 <token>`.
fn bearer(req: &Request) -> Option<&str> {
    req.headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("FlyV1 "))
                .map(str::trim)
        })
}

/// Whether the caller of a request (set by [`require_access`]) may see `app`: lists show
/// only those.
pub(crate) fn may_read(caller: Option<&Caller>, app: &str) -> bool {
    caller.is_none_or(|c| {
        c.authorize(&Access {
            app: Some(app),
            op: Op::Read,
            process: false,
            runtime: None,
        })
        .is_ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(method: Method, path: &str) -> (Option<String>, Option<String>, Op) {
        let a = route_access(&method, path);
        (a.app, a.machine_id, a.op)
    }

    #[test]
    fn every_route_maps_to_its_app_and_operation() {
        let web = || Some("web".to_string());
        let m = || Some("m1".to_string());
        let cases = [
            (Method::GET, "/v1/apps", (None, None, Op::Read)),
            (Method::POST, "/v1/apps", (None, None, Op::Create)),
            (Method::GET, "/v1/platform/regions", (None, None, Op::Read)),
            (
                Method::POST,
                "/v1/platform/placements",
                (None, None, Op::Read),
            ),
            (Method::GET, "/v1/apps/web", (web(), None, Op::Read)),
            (Method::DELETE, "/v1/apps/web", (web(), None, Op::Destroy)),
            (
                Method::GET,
                "/v1/apps/web/machines",
                (web(), None, Op::Read),
            ),
            (
                Method::POST,
                "/v1/apps/web/machines",
                (web(), None, Op::Create),
            ),
            (
                Method::POST,
                "/v1/apps/web/machines/batch",
                (web(), None, Op::Create),
            ),
            (
                Method::POST,
                "/v1/apps/web/machines/m1",
                (web(), m(), Op::Update),
            ),
            (
                Method::DELETE,
                "/v1/apps/web/machines/m1",
                (web(), m(), Op::Destroy),
            ),
            (
                Method::GET,
                "/v1/apps/web/machines/m1/wait",
                (web(), None, Op::Read),
            ),
            (
                Method::POST,
                "/v1/apps/web/machines/m1/start",
                (web(), m(), Op::Start),
            ),
            (
                Method::POST,
                "/v1/apps/web/machines/m1/stop",
                (web(), m(), Op::Stop),
            ),
            (
                Method::POST,
                "/v1/apps/web/machines/m1/restart",
                (web(), m(), Op::Restart),
            ),
            (
                Method::POST,
                "/v1/apps/web/machines/m1/signal",
                (web(), m(), Op::Signal),
            ),
            (
                Method::POST,
                "/v1/apps/web/machines/m1/suspend",
                (web(), m(), Op::Suspend),
            ),
            (
                Method::POST,
                "/v1/apps/web/machines/m1/exec",
                (web(), m(), Op::Exec),
            ),
            (
                Method::POST,
                "/v1/apps/web/machines/m1/lease",
                (web(), m(), Op::Lease),
            ),
            (
                Method::DELETE,
                "/v1/apps/web/machines/m1/lease",
                (web(), m(), Op::Lease),
            ),
            (
                Method::POST,
                "/v1/apps/web/machines/m1/cordon",
                (web(), m(), Op::Update),
            ),
            (
                Method::PUT,
                "/v1/apps/web/machines/m1/metadata",
                (web(), m(), Op::Update),
            ),
            (
                Method::POST,
                "/v1/apps/web/volumes",
                (web(), None, Op::Volumes),
            ),
            (
                Method::PUT,
                "/v1/apps/web/volumes/v1/extend",
                (web(), None, Op::Volumes),
            ),
            (
                Method::DELETE,
                "/v1/apps/web/volumes/v1",
                (web(), None, Op::Volumes),
            ),
            (Method::GET, "/v1/apps/web/audit", (web(), None, Op::Read)),
            (
                Method::POST,
                "/v1/apps/web/secrets",
                (web(), None, Op::Secrets),
            ),
            (
                Method::DELETE,
                "/v1/apps/web/secrets/DB",
                (web(), None, Op::Secrets),
            ),
            (Method::GET, "/v1/apps/web/secrets", (web(), None, Op::Read)),
            // Quotas are set under the org, never as a change to the app: a token scoped
            // to the app cannot raise its own.
            (
                Method::POST,
                "/v1/orgs/acme/apps/web/quota",
                (None, None, Op::Update),
            ),
            (
                Method::POST,
                "/v1/orgs/acme/quota",
                (None, None, Op::Update),
            ),
        ];
        for (method, path, want) in cases {
            assert_eq!(op(method.clone(), path), want, "{method} {path}");
        }
    }
}
