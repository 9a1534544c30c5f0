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

impl From<bazaar_agent::error::AgentError> for ApiError {
    fn from(e: bazaar_agent::error::AgentError) -> Self {
        use bazaar_agent::error::AgentError as A;
        match e {
            A::Invalid(m) => ApiError::BadRequest(m),
            A::MachineNotFound(_) | A::NotFound(_) | A::ReservationNotFound(_) => {
                ApiError::NotFound(e.to_string())
            }
            A::Capacity(m) => ApiError::InsufficientCapacity(m),
            A::Conflict(m) => ApiError::Conflict(m),
            A::Precondition(m) => ApiError::Precondition(m),
            other => ApiError::Internal(other.to_string()),
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
