//! The create request as the Machines API reads it: the server's side of
//! [`crate::api::CreateMachineRequest`] (which clients send), with `config` optional so that a
//! body without one is refused with a 400 naming it rather than a decoding error. Here, not
//! in `bazaar-api`, so that the config decoder's fuzz target reads bodies as the API does
//! without building the API.

use crate::config::MachineConfig;
use schemars::JsonSchema;
use serde::Deserialize;

/// Fly's CreateMachineRequest (unknown fields are ignored); with `count`, bazaar's batch
/// create.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct CreateMachineRequest {
    /// The machine's config (required).
    #[schemars(required)]
    pub config: Option<MachineConfig>,
    /// The machine's name (generated when absent).
    #[serde(default)]
    pub name: Option<String>,
    /// A region expression: `ord`, `ord,any`, ... (default: this node's region, then any).
    #[serde(default)]
    pub region: Option<String>,
    /// Create the machine without starting it.
    #[serde(default)]
    pub skip_launch: bool,
    /// Create it cordoned.
    #[serde(default)]
    pub skip_service_registration: bool,
    /// Take a lease of this many seconds on the new machine (its nonce is returned).
    #[serde(default)]
    pub lease_ttl: Option<u64>,
    /// Batch create only: how many machines (1 to 1000, default 1).
    #[serde(default)]
    pub count: Option<usize>,
}
