//! Machines API (`/v1`) bodies that are not a machine, config or volume: apps, create
//! requests, batch, version, lease, traffic, secret and certificate answers, as the API
//! spells them. Clients (`bazaar-client`) decode into these.

use crate::config::MachineConfig;
use crate::machine::{Lease, Machine};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Body of `POST /v1/apps`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CreateAppRequest {
    pub app_name: String,
    /// The organization (`personal`).
    pub org_slug: String,
}

/// An app's organization.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Organization {
    pub name: String,
    pub slug: String,
}

/// An app.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct App {
    pub id: String,
    pub name: String,
    pub machine_count: u64,
    pub volume_count: u64,
    pub network: String,
    pub organization: Organization,
    /// `deployed` when it has machines, else `pending`.
    pub status: String,
    /// RFC 3339.
    pub created_at: String,
}

/// Answer of `GET /v1/apps`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AppList {
    pub total_apps: u64,
    pub apps: Vec<App>,
}

/// Fly's CreateMachineRequest; with `count`, bazaar's batch create.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CreateMachineRequest {
    pub config: MachineConfig,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A region expression: `ord`, `ord,any`, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    #[serde(default)]
    pub skip_launch: bool,
    /// Create it cordoned.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skip_service_registration: bool,
    /// Take a lease of this many seconds on the new machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ttl: Option<u64>,
    /// How many machines (batch create only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<usize>,
}

/// Answer of `POST /v1/apps/{app}/machines/batch`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BatchCreateResponse {
    pub machines: Vec<Machine>,
    pub requested: u64,
    pub created: u64,
    /// How the market placed them (free-form record of the rounds).
    pub placement: serde_json::Value,
}

/// Body of `POST /v1/apps/{app}/machines/{id}` (an update).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct UpdateMachineRequest {
    pub config: MachineConfig,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skip_launch: bool,
}

/// One config version of a machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MachineVersion {
    /// The version's `instance_id`.
    pub version: String,
    pub user_config: MachineConfig,
}

/// A lease as its acquirer gets it (with the nonce), wrapped as fly-go expects.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LeaseResponse {
    /// `success`.
    pub status: String,
    pub data: Lease,
}

/// Answer of `GET /v1/apps/{app}/machines/{id}/traffic`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MachineTraffic {
    pub machine_id: String,
    /// Requests (and TCP or WebSocket connections) being served.
    pub in_flight: u32,
    /// RFC 3339, if it ever served one.
    #[serde(default)]
    pub last_request_at: Option<String>,
}

/// One app secret (never its value).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Secret {
    pub name: String,
    pub digest: String,
    pub created_at: String,
    pub updated_at: String,
}

/// Answer of `GET /v1/apps/{app}/secrets`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SecretList {
    pub secrets: Vec<Secret>,
}

/// A certificate of one of an app's hostnames.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Certificate {
    pub hostname: String,
    pub app: String,
    /// `acme` or `custom`.
    pub source: String,
    /// `pending`, `issued` or `failed`.
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The host that owns (and renews) it.
    pub owner_host: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_after: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

/// Body of `POST /v1/apps/{app}/certificates`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AddCertificateRequest {
    pub hostname: String,
    /// A PEM chain to serve instead of issuing one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// Answer of `GET /v1/apps/{app}/audit`: the app's audit record, gathered from every host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AuditList {
    pub app: String,
    /// Every change, oldest first.
    pub entries: Vec<AuditEntry>,
    /// Hosts that did not answer: the changes they handled are missing.
    pub unreachable_hosts: Vec<String>,
}

/// One change made through the Machines API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct AuditEntry {
    /// When it was answered (RFC 3339).
    pub time: String,
    pub time_ms: u64,
    /// Who: the scoped token's id, `token-file:<hash prefix>` or `cluster-secret`.
    pub token_id: String,
    pub method: String,
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_id: Option<String>,
    /// The client's address as the handling host saw it.
    pub peer: String,
    /// The answer's HTTP status.
    pub status: u16,
    /// The host that handled it.
    pub host_id: String,
}
