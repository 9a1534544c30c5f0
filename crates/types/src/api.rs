//! Machines API (`/v1`) bodies that are not a machine, config or volume: apps, create
//! requests, batch, version, lease, traffic, secret and certificate answers, regions and
//! placement dry runs, the catalog view, as the API spells them. The API's handlers answer
//! these (`bazaar-api`, whose OpenAPI document is derived from them) and clients
//! (`bazaar-client`) decode into them.

use crate::config::MachineConfig;
use crate::guest::Guest;
use crate::host::Resources;
use crate::machine::{Lease, LeaseInfo, Machine};
use crate::state::MachineState;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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

/// Answer of `POST /v1/apps/{app}/machines/batch`. `P` is how the market placed them: the
/// API answers `bazaar_placement::exchange::PlacementRecord`; a client may read it as any
/// JSON value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BatchCreateResponse<P = serde_json::Value> {
    pub machines: Vec<Machine>,
    pub requested: u64,
    pub created: u64,
    /// How the market placed them: the hosts asked per round and what they answered.
    pub placement: P,
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

/// Body of `POST /v1/apps/{app}/certificates` (unknown fields are refused): `cert` and `key`
/// both or neither.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("dependentRequired" = {"cert": ["key"], "key": ["cert"]}))]
pub struct AddCertificateRequest {
    /// A DNS name of at least two labels (letters, digits, `-`), at most 253 characters.
    #[schemars(
        length(max = 253),
        regex(
            pattern = r"^([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$"
        )
    )]
    pub hostname: String,
    /// A PEM chain to serve instead of issuing one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// Body of `POST /v1/apps/{app}/certificates/acme` (Fly's path to issue by ACME).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AcmeCertificateRequest {
    /// A DNS name of at least two labels (letters, digits, `-`), at most 253 characters.
    #[schemars(
        length(max = 253),
        regex(
            pattern = r"^([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$"
        )
    )]
    pub hostname: String,
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

/// A status answer, `{"status": "accepted"}` (an app's delete) or `{"status": "success"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StatusResponse {
    /// `accepted` or `success`.
    pub status: String,
}

/// `{"ok": true}`: a machine call or a certificate removal done.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OkResponse {
    pub ok: bool,
}

/// An empty object, `{}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct EmptyResponse {}

/// Answer of `POST /v1/apps/{app}/machines/{id}/start`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StartResponse {
    pub previous_state: MachineState,
    pub migrated: bool,
    pub new_host: String,
}

/// The lease held on a machine (`GET .../lease`), wrapped as fly-go expects.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LeaseInfoResponse {
    /// `success`.
    pub status: String,
    pub data: HeldLease,
}

/// A lease as `GET .../lease` shows it: with its nonce for a caller whose token may use
/// leases (as on Fly, where `fly machine leases clear` reads it there), without it for
/// one that may not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HeldLease {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
    #[serde(flatten)]
    pub lease: LeaseInfo,
}

/// One metadata value: the answer of `GET .../metadata/{key}` and the body that sets it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MetadataValue {
    pub value: String,
}

/// Body of `POST /v1/apps/{app}/secrets`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct UpdateSecretsRequest {
    /// NAME → value to set it, or `null` to unset it (at least one). All or nothing.
    #[schemars(extend("minProperties" = 1, "propertyNames" = {"pattern": "^(?!FLY_|BAZAAR_)[A-Za-z_][A-Za-z0-9_]*$", "maxLength": 128}))]
    pub values: BTreeMap<String, Option<String>>,
}

/// Body of `POST /v1/apps/{app}/secrets/{name}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SetSecretRequest {
    /// At most 64 KiB, no NUL byte.
    pub value: String,
}

/// A region of the cluster's hosts (Fly's shape, with bazaar's counts).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Region {
    pub code: String,
    pub name: String,
    pub gateway_available: bool,
    pub requires_paid_plan: bool,
    pub deprecated: bool,
    /// Latitude in decimal degrees, when an agent of the region says it (`[region_info]`).
    pub latitude: Option<f64>,
    /// Longitude in decimal degrees, when an agent of the region says it.
    pub longitude: Option<f64>,
    /// The wider area the region belongs to (`eu`, `na`, ...), when an agent says it.
    pub geo_region: Option<String>,
    /// bazaar extension: live hosts in the region.
    pub hosts: u64,
    /// bazaar extension: free memory of its live hosts.
    pub free_memory_mb: u64,
    /// bazaar extension: memory capacity of its live hosts.
    pub capacity_memory_mb: u64,
}

/// Answer of `GET` and `PUT /v1/apps/{app}/machines/{id}/memory`: the running machine's
/// memory limit (its guest size's, unless changed live) and how much of it is free.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MemoryResponse {
    pub limit_mb: u64,
    /// The limit less the machine's working set (its use less reclaimable page cache).
    pub available_mb: u64,
}

/// Body of `PUT /v1/apps/{app}/machines/{id}/memory`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemoryLimitRequest {
    /// The new limit in MiB: at least 1, at most the machine's guest `memory_mb`. It holds
    /// until the machine next starts.
    pub limit_mb: u64,
}

/// Body of `POST /v1/apps/{app}/machines/{id}/memory/reclaim`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReclaimMemoryRequest {
    /// How much to take back, in MiB (at least 1).
    pub amount_mb: u64,
}

/// Answer of `POST /v1/apps/{app}/machines/{id}/memory/reclaim`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ReclaimMemoryResponse {
    /// How much the kernel took back, in MiB (page cache first; it may be less than asked).
    pub actual_mb: u64,
}

/// Answer of `GET /v1/orgs/{org}/machines`: one page of an organization's machines,
/// oldest update first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OrgMachineList {
    /// The machines as the catalog knows them (each with its `app`).
    pub machines: Vec<serde_json::Value>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    pub next_cursor: Option<String>,
    /// The id of the last machine of this page.
    pub last_machine_id: Option<String>,
    /// The `updated_at` of the last machine of this page (poll with `updated_after`).
    pub last_updated_at: Option<String>,
    /// Regions that could not be read (always empty: the answer comes from this node's
    /// replica of the catalog).
    pub error_regions: Vec<String>,
}

/// Answer of `GET /v1/platform/regions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RegionList {
    pub regions: Vec<Region>,
    /// This node's region.
    pub nearest: String,
}

/// Body of `POST /v1/platform/placements` (unknown fields are ignored).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PlacementsRequest {
    /// The size (wins over `size`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute: Option<Guest>,
    /// A preset name (`shared-cpu-1x`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(shared-cpu-(1|2|4|6|8)x|performance-(1|2|4|8|16)x)$"))]
    pub size: Option<String>,
    /// A region expression (default: this node's region, then any): regions separated by
    /// `,`, at least one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"[^,\s]"))]
    pub region: Option<String>,
    /// How many machines (1 to 1000, default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<usize>,
    /// bazaar extension: a placement policy, as a machine config's `placement`; each
    /// host's verdict is in the answer's `placement.verdicts`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<crate::placement_policy::PlacementPolicy>,
    /// bazaar extension: the app whose machines a `placement.spread` counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app: Option<String>,
}

/// Machines of a dry run placed in one region.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RegionCount {
    pub region: String,
    pub count: u64,
    pub concurrency: u64,
}

/// Answer of `POST /v1/platform/placements`; `P` as in [`BatchCreateResponse`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PlacementsResponse<P = serde_json::Value> {
    pub regions: Vec<RegionCount>,
    /// Machines per host.
    pub hosts: BTreeMap<String, u64>,
    pub placement: P,
}

/// bazaar extension: a host as `GET /v1/catalog/hosts` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CatalogHost {
    pub id: String,
    pub region: String,
    /// `alive`, `suspect`, `dead` or `left`.
    pub status: String,
    pub api_addr: String,
    pub gossip_addr: String,
    pub capacity: Resources,
    pub free: Resources,
    pub num_machines: u32,
    pub draining: bool,
    pub labels: BTreeMap<String, String>,
    /// RFC 3339.
    pub updated_at: String,
    /// The row's version.
    pub version: u64,
}

/// bazaar extension: a machine as `GET /v1/catalog/machines` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CatalogMachine {
    pub id: String,
    pub app: String,
    pub name: String,
    pub region: String,
    pub host_id: String,
    /// `ok`, `unknown` or `unreachable`.
    pub host_status: String,
    /// The machine's state; `destroyed` for a tombstone.
    pub state: String,
    pub instance_id: String,
    pub services: Vec<CatalogService>,
    pub checks: Vec<CatalogCheck>,
    pub cordoned: bool,
    pub metadata: BTreeMap<String, String>,
    /// RFC 3339.
    pub updated_at: String,
    pub deleted: bool,
    /// The row's version.
    pub version: u64,
    /// The ownership epoch: one more each time the machine was re-placed.
    pub epoch: u64,
}

/// A service of a machine in the catalog: where proxies connect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CatalogService {
    pub internal_port: u16,
    pub protocol: String,
    /// Where the proxy connects.
    pub address: String,
    pub port: u16,
}

/// A health check's last result, as the catalog spreads it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CatalogCheck {
    pub name: String,
    /// `passing`, `warning` or `critical`.
    pub status: String,
    #[serde(default)]
    pub output: String,
    pub updated_at_ms: u64,
}

/// bazaar extension: answer of `GET /v1/catalog/digest` (equal digests, same rows).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CatalogDigest {
    pub digest: String,
    pub node_id: String,
}

/// A machine in a list with `summary=true`: the full object without `config`, `checks`,
/// `events`, `host_status`, `nonce` and `incomplete_config`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MachineSummary {
    pub id: String,
    pub name: String,
    pub state: MachineState,
    pub region: String,
    pub instance_id: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub private_ip: String,
    pub created_at: String,
    pub updated_at: String,
    #[serde(default)]
    pub cordoned: bool,
    #[serde(default)]
    pub host_id: String,
    #[serde(default)]
    pub app: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub host_ports: BTreeMap<u16, u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<i32>,
    /// With `include_leases=true`: the lease held on it (without its nonce).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_ref: Option<crate::machine::ImageRef>,
}
