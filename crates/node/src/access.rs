//! Who is calling the Machines API ([`Caller`]: another host, a token-file token or a
//! scoped token; the agent tells which: never the cluster secret, which is not an API
//! token), and [`require_cluster_secret`], the check of the routes only hosts and operators
//! may call (the host interface and the services' own host-level routes).

use crate::error::NodeError;
use crate::NodeHandle;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bazaar_auth::{Access, Denied, Verified};
use std::sync::Arc;
use std::time::SystemTime;

/// The credential a Machines API request came with. The cluster secret is none of them:
/// it opens the host interface and the catalog view only ([`require_cluster_secret`]).
#[derive(Debug, Clone)]
pub enum Caller {
    /// Another host, by the cluster certificate the host listener verified (the API's
    /// calls between hosts): may do everything.
    Host(String),
    /// A token of the token file, named by its hash: may do everything.
    Legacy(String),
    /// A scoped token: may do what its checks allow.
    Scoped(Arc<Verified>),
}

impl Caller {
    /// Who, in the audit record: the scoped token's id, `token-file:<hash prefix>` or
    /// `host:<id>`.
    pub fn id(&self) -> String {
        match self {
            Caller::Host(id) => format!("host:{id}"),
            Caller::Legacy(hash) => format!("token-file:{}", &hash[..16]),
            Caller::Scoped(token) => token.id().to_string(),
        }
    }

    /// Whether this caller may do `access` now.
    pub fn authorize(&self, access: &Access<'_>) -> Result<(), Denied> {
        match self {
            Caller::Host(_) | Caller::Legacy(_) => Ok(()),
            Caller::Scoped(token) => token.authorize(access, SystemTime::now()),
        }
    }
}

/// The token of a request (`Authorization: Bearer <token>` or Fly's `FlyV1 <token>`).
pub fn bearer(req: &Request) -> Option<&str> {
    req.headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("FlyV1 "))
                .map(str::trim)
        })
}

/// A middleware letting through a peer whose cluster certificate the host listener
/// verified ([`crate::host_link::PeerHost`]) or the cluster secret, never an API token.
pub async fn require_cluster_secret(
    State(node): State<NodeHandle>,
    req: Request,
    next: Next,
) -> Response {
    if req
        .extensions()
        .get::<crate::host_link::PeerHost>()
        .is_some()
    {
        return next.run(req).await;
    }
    match bearer(&req) {
        Some(t) if crate::secrets::constant_time_eq(t.as_bytes(), node.cluster_secret().as_bytes()) => {
            next.run(req).await
        }
        Some(t) if node.caller(t).is_ok() => NodeError::new(
            StatusCode::FORBIDDEN,
            "forbidden: the host interface takes the cluster secret, not an API token (operators: set BAZAAR_CLUSTER_SECRET)",
        )
        .into_response(),
        _ => NodeError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized: a valid token is required (Authorization: Bearer <token>)",
        )
        .into_response(),
    }
}
