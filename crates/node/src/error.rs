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

/// Most of a plain error body kept as the message of its Fly-shaped answer.
const PLAIN_ERROR_BYTES: usize = 16 * 1024;

/// Any error answer (4xx or 5xx) that is not JSON in Fly's error shape: axum's own
/// refusals (a path or query parameter that does not parse, a wrong method, a body too
/// large, no such route) come as plain text or empty. A `map_response` layer over every
/// HTTP interface of a host, so that each error a client gets is `{"error": ...}`. The text
/// becomes the message (the status's reason when there is none); other headers, `Allow`
/// among them, are kept.
pub async fn fly_shaped_errors(resp: Response) -> Response {
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, PLAIN_ERROR_BYTES)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let error = match (status, text.is_empty()) {
        (StatusCode::METHOD_NOT_ALLOWED, _) => "method not allowed".to_string(),
        (_, true) => status
            .canonical_reason()
            .unwrap_or("error")
            .to_ascii_lowercase(),
        (_, false) => text,
    };
    let body = serde_json::to_vec(&ErrorBody {
        error,
        status: None,
    })
    .unwrap_or_default();
    parts.headers.insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn shaped(resp: Response) -> (StatusCode, Option<String>, serde_json::Value) {
        let resp = fly_shaped_errors(resp).await;
        let status = resp.status();
        let allow = resp
            .headers()
            .get(axum::http::header::ALLOW)
            .map(|v| v.to_str().unwrap().to_string());
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (
            status,
            allow,
            serde_json::from_slice(&body).unwrap_or_default(),
        )
    }

    #[tokio::test]
    async fn plain_errors_become_fly_shaped_and_the_rest_is_left_alone() {
        let (s, _, v) = shaped(
            (
                StatusCode::BAD_REQUEST,
                "Failed to deserialize query string",
            )
                .into_response(),
        )
        .await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
        assert_eq!(
            v,
            serde_json::json!({"error": "Failed to deserialize query string"})
        );
        let (s, _, v) = shaped(StatusCode::NOT_FOUND.into_response()).await;
        assert_eq!(
            (s, v),
            (
                StatusCode::NOT_FOUND,
                serde_json::json!({"error": "not found"})
            )
        );
        let (s, allow, v) = shaped(
            (
                StatusCode::METHOD_NOT_ALLOWED,
                [(axum::http::header::ALLOW, "GET,HEAD")],
            )
                .into_response(),
        )
        .await;
        assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(allow.as_deref(), Some("GET,HEAD"));
        assert_eq!(v["error"], "method not allowed");
        // JSON errors and successes pass unchanged.
        let json = NodeError::new(StatusCode::CONFLICT, "held").into_response();
        let (s, _, v) = shaped(json).await;
        assert_eq!(
            (s, v["error"].as_str()),
            (StatusCode::CONFLICT, Some("held"))
        );
        let ok = fly_shaped_errors((StatusCode::OK, "plain").into_response()).await;
        let body = axum::body::to_bytes(ok.into_body(), 100).await.unwrap();
        assert_eq!(&body[..], b"plain");
    }
}
