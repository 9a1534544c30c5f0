//! The error body every bazaar HTTP interface answers with, in the Fly shape:
//! `{"error": "<message>", "status": "<code>"}` (`status` is one of `unknown`,
//! `insufficient_capacity`, `volume_placement_capacity`, `name_taken`, or absent).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A Fly-style error body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ErrorBody {
    /// What went wrong, for a person.
    #[serde(alias = "message")]
    pub error: String,
    /// A machine-readable code, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}
