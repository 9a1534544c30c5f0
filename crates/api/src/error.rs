//! API errors, each mapped to one HTTP status and the Fly error body
//! `{"error": "...", "status": "..."}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bazaar_types::error::ErrorBody;

/// What the API answers when a request fails.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("unauthorized: a valid token is required (Authorization: Bearer <token>)")]
    Unauthorized,
    /// A token that is not (or no longer) valid: 401 saying why.
    #[error("unauthorized: {0}")]
    InvalidToken(String),
    /// A valid token that does not allow this: 403.
    #[error("forbidden: {0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Precondition(String),
    #[error("{0}")]
    NameTaken(String),
    #[error("{0}")]
    Unprocessable(String),
    #[error("{0}")]
    InsufficientCapacity(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    TooLarge(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    fn status(&self) -> (StatusCode, Option<&'static str>) {
        match self {
            Self::BadRequest(_) => (StatusCode::BAD_REQUEST, None),
            Self::Unauthorized | Self::InvalidToken(_) => (StatusCode::UNAUTHORIZED, None),
            Self::Forbidden(_) => (StatusCode::FORBIDDEN, None),
            Self::NotFound(_) => (StatusCode::NOT_FOUND, None),
            Self::Conflict(_) => (StatusCode::CONFLICT, None),
            Self::Precondition(_) => (StatusCode::PRECONDITION_FAILED, None),
            Self::NameTaken(_) => (StatusCode::UNPROCESSABLE_ENTITY, Some("name_taken")),
            Self::Unprocessable(_) => (StatusCode::UNPROCESSABLE_ENTITY, None),
            Self::InsufficientCapacity(_) => (StatusCode::CONFLICT, Some("insufficient_capacity")),
            Self::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, None),
            Self::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, None),
            Self::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, Some("unknown")),
        }
    }
}

impl From<bazaar_node::NodeError> for ApiError {
    fn from(e: bazaar_node::NodeError) -> Self {
        match (e.status, e.code) {
            (StatusCode::BAD_REQUEST, _) => ApiError::BadRequest(e.message),
            (StatusCode::NOT_FOUND, _) => ApiError::NotFound(e.message),
            (StatusCode::CONFLICT, Some("insufficient_capacity")) => {
                ApiError::InsufficientCapacity(e.message)
            }
            (StatusCode::CONFLICT, _) => ApiError::Conflict(e.message),
            (StatusCode::PRECONDITION_FAILED, _) => ApiError::Precondition(e.message),
            _ => ApiError::Internal(e.message),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status();
        if status.is_server_error() {
            tracing::warn!(error = %self, "api request failed");
        }
        let body = ErrorBody {
            error: self.to_string(),
            status: code.map(str::to_string),
        };
        (status, Json(body)).into_response()
    }
}
