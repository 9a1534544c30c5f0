//! The agent's errors, each mapped to exactly one HTTP status and the Fly error body.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bazaar_types::error::ErrorBody;

/// Errors from agent operations.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("machine {0} not found")]
    MachineNotFound(String),
    #[error("reservation {0} not found (it expired, was released, or never existed)")]
    ReservationNotFound(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Transition(#[from] bazaar_types::state::TransitionError),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Precondition(String),
    #[error("lease not found on machine {0}")]
    LeaseNotFound(String),
    #[error("metadata key {0:?} not found")]
    MetadataNotFound(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    TooLarge(String),
    #[error("aborted: could not reserve resources for machine: {0}")]
    Capacity(String),
    #[error("timeout waiting for machine {id} to be {states}")]
    WaitTimeout { id: String, states: String },
    #[error("unauthorized: a valid token is required (Authorization: Bearer <token>)")]
    Unauthorized,
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// The disk under the data dir is full: the change was not made.
    #[error("insufficient storage: {0}")]
    DiskFull(String),
    #[error("the agent is shutting down")]
    ShuttingDown,
    /// Too many operations wait for the machine's actor ([`crate::registry::QUEUE`]).
    #[error("{0}")]
    Busy(String),
    /// The machine's launch failed (while a client waited for it to start): answered with
    /// its kind's status ([`bazaar_types::failure::FailureKind::http_status`]: 507 for a full
    /// disk, 503 busy, 404 a missing image or command, 403 refused, 422 a config that
    /// cannot run, 500 else) and the kind as the Fly `status` code.
    #[error("machine {id} failed to launch: {message}")]
    LaunchFailed {
        id: String,
        message: String,
        failure: Option<bazaar_types::failure::Failure>,
    },
    #[error("internal error: {0}")]
    Internal(String),
}

/// A refused lease call (`bazaar_lifecycle::lease`).
impl From<bazaar_lifecycle::lease::LeaseError> for AgentError {
    fn from(err: bazaar_lifecycle::lease::LeaseError) -> Self {
        use bazaar_lifecycle::lease::LeaseError;
        match err {
            LeaseError::Invalid(msg) => AgentError::Invalid(msg),
            LeaseError::Conflict(msg) => AgentError::Conflict(msg),
            LeaseError::NotFound(id) => AgentError::LeaseNotFound(id),
        }
    }
}

/// A refused operation (`bazaar_lifecycle::accept`).
impl From<bazaar_lifecycle::accept::Refusal> for AgentError {
    fn from(r: bazaar_lifecycle::accept::Refusal) -> Self {
        match r {
            bazaar_lifecycle::accept::Refusal::Lease(e) => e.into(),
            bazaar_lifecycle::accept::Refusal::Transition(e) => AgentError::Transition(e),
        }
    }
}

impl From<crate::store::StoreError> for AgentError {
    fn from(e: crate::store::StoreError) -> Self {
        match e {
            crate::store::StoreError::DiskFull(_) => AgentError::DiskFull(e.to_string()),
            _ => AgentError::Internal(e.to_string()),
        }
    }
}

impl From<bazaar_runtime::exec::ExecError> for AgentError {
    fn from(e: bazaar_runtime::exec::ExecError) -> Self {
        use bazaar_runtime::exec::ExecError;
        match e {
            ExecError::Invalid(m) => AgentError::Invalid(m),
            ExecError::Internal(m) => AgentError::Internal(m),
            ExecError::Timeout { id, states } => AgentError::WaitTimeout { id, states },
        }
    }
}

impl From<tokio::task::JoinError> for AgentError {
    fn from(e: tokio::task::JoinError) -> Self {
        AgentError::Internal(e.to_string())
    }
}

impl AgentError {
    /// The HTTP status and the Fly `status` code of this error.
    pub fn status(&self) -> (StatusCode, Option<&'static str>) {
        match self {
            Self::MachineNotFound(_) | Self::ReservationNotFound(_) => {
                (StatusCode::NOT_FOUND, Some("not_found"))
            }
            Self::Invalid(_) => (StatusCode::BAD_REQUEST, None),
            Self::Transition(_) => (StatusCode::PRECONDITION_FAILED, None),
            Self::Conflict(_) => (StatusCode::CONFLICT, None),
            Self::Precondition(_) => (StatusCode::PRECONDITION_FAILED, None),
            Self::LeaseNotFound(_) | Self::MetadataNotFound(_) | Self::NotFound(_) => {
                (StatusCode::NOT_FOUND, None)
            }
            Self::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, None),
            Self::Capacity(_) => (StatusCode::CONFLICT, Some("insufficient_capacity")),
            Self::WaitTimeout { .. } => (StatusCode::REQUEST_TIMEOUT, None),
            Self::Unauthorized => (StatusCode::UNAUTHORIZED, None),
            Self::Forbidden(_) => (StatusCode::FORBIDDEN, None),
            Self::DiskFull(_) => (
                StatusCode::INSUFFICIENT_STORAGE,
                Some("insufficient_storage"),
            ),
            Self::ShuttingDown | Self::Busy(_) => (StatusCode::SERVICE_UNAVAILABLE, None),
            Self::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, Some("unknown")),
            Self::LaunchFailed { failure, .. } => match failure {
                Some(f) => (
                    StatusCode::from_u16(f.kind.http_status())
                        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                    Some(f.kind.as_str()),
                ),
                None => (StatusCode::INTERNAL_SERVER_ERROR, Some("launch_failed")),
            },
        }
    }
}

impl IntoResponse for AgentError {
    fn into_response(self) -> Response {
        let (status, code) = self.status();
        if status.is_server_error() {
            tracing::error!(error = %self, "request failed");
        } else {
            tracing::debug!(error = %self, "request refused");
        }
        let body = ErrorBody {
            error: self.to_string(),
            status: code.map(str::to_string),
        };
        (status, Json(body)).into_response()
    }
}

/// The refusal of a placement the ledger has no room for.
pub(crate) fn capacity_error(err: bazaar_placement::LedgerError) -> AgentError {
    AgentError::Capacity(err.to_string())
}
