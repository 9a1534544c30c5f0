//! One entry of a host's audit record (the agent keeps the file: `bazaar_agent::audit`; the
//! API appends what it handled and gathers every host's).

/// One change, as recorded: the same entry the Machines API answers
/// (`GET /v1/audit`), so a host's record is served as it was written.
pub use bazaar_types::api::AuditEntry;
