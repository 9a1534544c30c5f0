//! The error a node answers a service with: an HTTP status, Fly's `status` code and a
//! message, answered in the Fly error body. The agent maps its own errors into it.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bazaar_types::error::ErrorBody;

/// A refused or failed node call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct NodeError {
    /// The HTTP status it is answered with.
    pub status: StatusCode,
    /// Fly's `status` code (`not_found`, `insufficient_capacity`, ...), if any.
    pub code: Option<&'static str>,
    /// What went wrong, for the caller.
    pub message: String,
}

impl NodeError {
    /// An error answered with `status` and `message`, no Fly code.
    pub fn new(status: StatusCode, message: impl Into<String>) -> NodeError {
        NodeError {
            status,
            code: None,
            message: message.into(),
        }
    }
}

impl IntoResponse for NodeError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(error = %self.message, "request failed");
        }
        let body = ErrorBody {
            error: self.message,
            status: self.code.map(str::to_string),
        };
        (self.status, Json(body)).into_response()
    }
}
