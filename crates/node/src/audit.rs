//! One entry of a host's audit record (the agent keeps the file: `bazaar_agent::audit`; the
//! API appends what it handled and gathers every host's).

use serde::{Deserialize, Serialize};

/// One change, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// When it was answered (RFC 3339).
    pub time: String,
    /// Unix milliseconds of `time` (for ordering entries of several hosts).
    pub time_ms: u64,
    /// Who: the scoped token's id, `token-file:<hash prefix>` or `cluster-secret`.
    pub token_id: String,
    pub method: String,
    pub path: String,
    /// The app it concerns (none for calls about no app).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_id: Option<String>,
    /// The client's address as this host saw it.
    pub peer: String,
    /// The answer's HTTP status (refusals are recorded too).
    pub status: u16,
    /// The host that handled it.
    pub host_id: String,
}
