//! Who may do what on the Machines API: every request's token is checked once
//! ([`bazaar_node::Node::caller`]: the cluster secret, a token-file token, or a scoped token
//! verified offline), its route mapped to an app and an operation ([`route_access`]), and
//! the token's scope asked ([`bazaar_node::Caller::authorize`]). A token scoped to
//! other apps gets 404 (as if the app did not exist), one that does not allow the operation
//! 403, an invalid, expired or revoked one 401. Every change (any method but `GET`/`HEAD`) by
//! a known caller is written to this host's audit record with its answer's status.

use crate::error::ApiError;
use axum::extract::{ConnectInfo, Request, State};
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
    /// Whether its body may carry a machine config (create, batch, update), whose driver
    /// the token must allow.
    pub has_config: bool,
}

/// The app, machine and operation of a Machines API request.
pub fn route_access(method: &Method, path: &str) -> RouteAccess {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let read = *method == Method::GET || *method == Method::HEAD;
    let mut access = RouteAccess {
        app: None,
        machine_id: None,
        op: if read { Op::Read } else { Op::Create },
        has_config: false,
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
                ["machines"] | ["machines", "batch"] => {
                    access.has_config = true;
                    Op::Create
                }
                ["volumes", ..] => Op::Volumes,
                ["secrets", ..] => Op::Secrets,
                ["machines", id, action @ ..] => {
                    access.machine_id = Some(id.to_string());
                    machine_op(method, action, &mut access.has_config)
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
fn machine_op(method: &Method, action: &[&str], has_config: &mut bool) -> Op {
    match action {
        [] if *method == Method::DELETE => Op::Destroy,
        [] => {
            *has_config = true;
            Op::Update
        }
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

/// The middleware of the Machines API (state: the node).
pub async fn require_access(
    State(node): State<NodeHandle>,
    mut req: Request,
    next: Next,
) -> Response {
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
    let route = route_access(req.method(), req.uri().path());
    let is_change = !(req.method() == Method::GET || req.method() == Method::HEAD);
    let mut access = Access {
        app: route.app.as_deref(),
        op: route.op,
        process: false,
    };
    // A scoped token that does not allow the process driver has the body looked at.
    let mut verdict = caller.authorize(&access);
    if route.has_config && matches!(caller, Caller::Scoped(_)) {
        let process = Access {
            process: true,
            ..access
        };
        if caller.authorize(&process).is_err() {
            let (parts, body) = req.into_parts();
            let bytes = match axum::body::to_bytes(body, crate::MAX_BODY_BYTES).await {
                Ok(b) => b,
                Err(_) => {
                    return ApiError::TooLarge(format!(
                        "request body too large: at most {} bytes",
                        crate::MAX_BODY_BYTES
                    ))
                    .into_response()
                }
            };
            access.process = runs_process_driver(&bytes);
            verdict = caller.authorize(&access);
            req = Request::from_parts(parts, axum::body::Body::from(bytes));
        }
    }
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

/// The answer to a refused request.
fn refusal(denied: Denied, app: Option<&str>) -> ApiError {
    match denied {
        Denied::Invalid(_) | Denied::Expired => ApiError::InvalidToken(denied.to_string()),
        // The same answer as for an app that does not exist (`apps::get`).
        Denied::OtherApp => ApiError::NotFound(format!("app {} not found", app.unwrap_or(""))),
        Denied::Forbidden(why) => ApiError::Forbidden(why),
    }
}

/// Whether a create or update body asks for a process machine (`config.driver`, or no
/// image). A body that does not parse is left to the handler, which refuses it.
fn runs_process_driver(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct WithConfig {
        #[serde(default)]
        config: bazaar_types::config::MachineConfig,
    }
    serde_json::from_slice::<WithConfig>(body).is_ok_and(|b| b.config.driver() == "process")
}

/// The app a `POST /v1/apps` body names (`app_name`, or `name`).
fn created_app_name(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
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
        })
        .is_ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(method: Method, path: &str) -> (Option<String>, Option<String>, Op, bool) {
        let a = route_access(&method, path);
        (a.app, a.machine_id, a.op, a.has_config)
    }

    #[test]
    fn every_route_maps_to_its_app_and_operation() {
        let web = || Some("web".to_string());
        let m = || Some("m1".to_string());
        let cases = [
            (Method::GET, "/v1/apps", (None, None, Op::Read, false)),
            (Method::POST, "/v1/apps", (None, None, Op::Create, false)),
            (
                Method::GET,
                "/v1/platform/regions",
                (None, None, Op::Read, false),
            ),
            (
                Method::POST,
                "/v1/platform/placements",
                (None, None, Op::Read, false),
            ),
            (Method::GET, "/v1/apps/web", (web(), None, Op::Read, false)),
            (
                Method::DELETE,
                "/v1/apps/web",
                (web(), None, Op::Destroy, false),
            ),
            (
                Method::GET,
                "/v1/apps/web/machines",
                (web(), None, Op::Read, false),
            ),
            (
                Method::POST,
                "/v1/apps/web/machines",
                (web(), None, Op::Create, true),
            ),
            (
                Method::POST,
                "/v1/apps/web/machines/batch",
                (web(), None, Op::Create, true),
            ),
            (
                Method::POST,
                "/v1/apps/web/machines/m1",
                (web(), m(), Op::Update, true),
            ),
            (
                Method::DELETE,
                "/v1/apps/web/machines/m1",
                (web(), m(), Op::Destroy, false),
            ),
            (
                Method::GET,
                "/v1/apps/web/machines/m1/wait",
                (web(), None, Op::Read, false),
            ),
            (
                Method::POST,
                "/v1/apps/web/machines/m1/start",
                (web(), m(), Op::Start, false),
            ),
            (
                Method::POST,
                "/v1/apps/web/machines/m1/stop",
                (web(), m(), Op::Stop, false),
            ),
            (
                Method::POST,
                "/v1/apps/web/machines/m1/restart",
                (web(), m(), Op::Restart, false),
            ),
            (
                Method::POST,
                "/v1/apps/web/machines/m1/signal",
                (web(), m(), Op::Signal, false),
            ),
            (
                Method::POST,
                "/v1/apps/web/machines/m1/suspend",
                (web(), m(), Op::Suspend, false),
            ),
            (
                Method::POST,
                "/v1/apps/web/machines/m1/exec",
                (web(), m(), Op::Exec, false),
            ),
            (
                Method::POST,
                "/v1/apps/web/machines/m1/lease",
                (web(), m(), Op::Lease, false),
            ),
            (
                Method::DELETE,
                "/v1/apps/web/machines/m1/lease",
                (web(), m(), Op::Lease, false),
            ),
            (
                Method::POST,
                "/v1/apps/web/machines/m1/cordon",
                (web(), m(), Op::Update, false),
            ),
            (
                Method::PUT,
                "/v1/apps/web/machines/m1/metadata",
                (web(), m(), Op::Update, false),
            ),
            (
                Method::POST,
                "/v1/apps/web/volumes",
                (web(), None, Op::Volumes, false),
            ),
            (
                Method::PUT,
                "/v1/apps/web/volumes/v1/extend",
                (web(), None, Op::Volumes, false),
            ),
            (
                Method::DELETE,
                "/v1/apps/web/volumes/v1",
                (web(), None, Op::Volumes, false),
            ),
            (
                Method::GET,
                "/v1/apps/web/audit",
                (web(), None, Op::Read, false),
            ),
            (
                Method::POST,
                "/v1/apps/web/secrets",
                (web(), None, Op::Secrets, false),
            ),
            (
                Method::DELETE,
                "/v1/apps/web/secrets/DB",
                (web(), None, Op::Secrets, false),
            ),
            (
                Method::GET,
                "/v1/apps/web/secrets",
                (web(), None, Op::Read, false),
            ),
        ];
        for (method, path, want) in cases {
            assert_eq!(op(method.clone(), path), want, "{method} {path}");
        }
    }

    #[test]
    fn the_process_driver_is_read_from_the_config() {
        assert!(runs_process_driver(
            br#"{"config": {"driver": "process", "init": {"exec": ["sleep", "1"]}}}"#
        ));
        assert!(runs_process_driver(
            br#"{"config": {"init": {"exec": ["sleep", "1"]}}}"#
        ));
        assert!(!runs_process_driver(br#"{"config": {"image": "web:1"}}"#));
        assert!(!runs_process_driver(b"not json"));
    }
}
