//! Schema-only mirrors of the bodies the handlers build or read ad hoc: they exist to give
//! those bodies a schema in the document.

#![allow(dead_code)]

use bazaar_types::config::MachineConfig;
use bazaar_types::guest::Guest;
use bazaar_types::host::Resources;
use bazaar_types::machine::{Lease, LeaseInfo, Machine};
use bazaar_types::state::MachineState;
use schemars::JsonSchema;
use std::collections::BTreeMap;

/// Body of `POST /v1/apps`.
#[derive(JsonSchema)]
pub struct CreateAppRequest {
    /// The app's name: 1-63 lowercase letters, digits and `-`.
    app_name: Option<String>,
    /// Accepted in place of `app_name`.
    name: Option<String>,
    /// The organization (default `personal`).
    org_slug: Option<String>,
}

#[derive(JsonSchema)]
pub struct Organization {
    name: String,
    slug: String,
}

/// An app.
#[derive(JsonSchema)]
pub struct App {
    id: String,
    name: String,
    machine_count: u64,
    volume_count: u64,
    network: String,
    organization: Organization,
    /// `deployed` when it has machines, else `pending`.
    status: String,
    /// RFC 3339.
    created_at: String,
}

#[derive(JsonSchema)]
pub struct AppList {
    total_apps: u64,
    apps: Vec<App>,
}

#[derive(JsonSchema)]
pub struct StatusResponse {
    /// `accepted` or `success`.
    status: String,
}

#[derive(JsonSchema)]
pub struct OkResponse {
    ok: bool,
}

/// Fly's CreateMachineRequest.
#[derive(JsonSchema)]
pub struct CreateMachineRequest {
    config: MachineConfig,
    /// The machine's name (generated when absent).
    name: Option<String>,
    /// A region expression: `ord`, `ord,any`, ... (default: this node's region, then any).
    region: Option<String>,
    /// Create the machine without starting it.
    #[schemars(default)]
    skip_launch: bool,
    /// Create it cordoned.
    #[schemars(default)]
    skip_service_registration: bool,
    /// Take a lease of this many seconds on the new machine (its nonce is returned).
    lease_ttl: Option<u64>,
}

/// bazaar extension: a batch create.
#[derive(JsonSchema)]
pub struct BatchCreateRequest {
    config: MachineConfig,
    region: Option<String>,
    #[schemars(default)]
    skip_launch: bool,
    #[schemars(default)]
    skip_service_registration: bool,
    lease_ttl: Option<u64>,
    /// How many machines (1 to 1000, default 1).
    count: Option<u64>,
}

#[derive(JsonSchema)]
pub struct BatchCreateResponse {
    machines: Vec<Machine>,
    requested: u64,
    created: u64,
    placement: PlacementRecord,
}

/// How the market placed machines: the hosts asked per round and what they answered.
#[derive(JsonSchema)]
pub struct PlacementRecord {
    placement_id: String,
    size: Resources,
    count: u64,
    regions: String,
    excluded: Vec<serde_json::Value>,
    rounds: Vec<serde_json::Value>,
    /// The winning host per machine placed.
    winners: Vec<String>,
    reason: String,
    elapsed_us: u64,
}

/// A machine in a list with `summary=true`.
#[derive(JsonSchema)]
pub struct MachineSummary {
    id: String,
    name: String,
    state: MachineState,
    region: String,
    instance_id: String,
    version: String,
    private_ip: String,
    created_at: String,
    updated_at: String,
    cordoned: bool,
    host_id: String,
    app: String,
}

#[derive(JsonSchema)]
pub struct StartResponse {
    previous_state: MachineState,
    migrated: bool,
    new_host: String,
}

/// A lease, in the wrapped form fly-go expects (the acquire answer: with the nonce).
#[derive(JsonSchema)]
pub struct LeaseResponse {
    /// `success`.
    status: String,
    data: Lease,
}

/// The lease held on a machine, as anyone sees it (no nonce).
#[derive(JsonSchema)]
pub struct LeaseInfoResponse {
    /// `success`.
    status: String,
    data: LeaseInfo,
}

#[derive(JsonSchema)]
pub struct MetadataValue {
    value: String,
}

#[derive(JsonSchema)]
pub struct MachineVersion {
    /// The version's `instance_id`.
    version: String,
    user_config: MachineConfig,
}

#[derive(JsonSchema)]
pub struct RegionList {
    regions: Vec<Region>,
    /// This node's region.
    nearest: String,
}

#[derive(JsonSchema)]
pub struct Region {
    code: String,
    name: String,
    gateway_available: bool,
    requires_paid_plan: bool,
    deprecated: bool,
    /// bazaar extension: live hosts in the region.
    hosts: u64,
    /// bazaar extension.
    free_memory_mb: u64,
    /// bazaar extension.
    capacity_memory_mb: u64,
}

#[derive(JsonSchema)]
pub struct PlacementsRequest {
    /// The size (wins over `size`).
    compute: Option<Guest>,
    /// A preset name (`shared-cpu-1x`).
    size: Option<String>,
    /// A region expression (default: this node's region, then any).
    region: Option<String>,
    /// How many machines (1 to 1000, default 1).
    count: Option<u64>,
}

#[derive(JsonSchema)]
pub struct PlacementsResponse {
    regions: Vec<RegionCount>,
    /// Machines per host.
    hosts: BTreeMap<String, u64>,
    placement: PlacementRecord,
}

#[derive(JsonSchema)]
pub struct RegionCount {
    region: String,
    count: u64,
    concurrency: u64,
}

#[derive(JsonSchema)]
pub struct CatalogHost {
    id: String,
    region: String,
    /// `alive`, `suspect`, `dead` or `left`.
    status: String,
    api_addr: String,
    gossip_addr: String,
    capacity: Resources,
    free: Resources,
    num_machines: u32,
    draining: bool,
    labels: BTreeMap<String, String>,
    updated_at: String,
    version: u64,
}

#[derive(JsonSchema)]
pub struct CatalogMachine {
    id: String,
    app: String,
    name: String,
    region: String,
    host_id: String,
    /// `ok`, `unknown` or `unreachable`.
    host_status: String,
    state: String,
    instance_id: String,
    services: Vec<CatalogService>,
    checks: Vec<CatalogCheck>,
    cordoned: bool,
    metadata: BTreeMap<String, String>,
    updated_at: String,
    deleted: bool,
    version: u64,
}

#[derive(JsonSchema)]
pub struct CatalogService {
    internal_port: u16,
    protocol: String,
    /// Where the proxy connects.
    address: String,
    port: u16,
}

#[derive(JsonSchema)]
pub struct CatalogCheck {
    name: String,
    /// `passing`, `warning` or `critical`.
    status: String,
    output: String,
    updated_at_ms: u64,
}

#[derive(JsonSchema)]
pub struct CatalogDigest {
    digest: String,
    node_id: String,
}

/// Answer of `GET /v1/apps/{app}/machines/{id}/traffic`.
#[derive(JsonSchema)]
pub struct MachineTraffic {
    machine_id: String,
    /// Requests (and TCP or WebSocket connections) being served.
    in_flight: u32,
    /// When the machine last started or finished serving one (RFC 3339), if ever.
    last_request_at: Option<String>,
}

/// bazaar extension: an app's audit record, gathered from every host.
#[derive(JsonSchema)]
pub struct AuditList {
    app: String,
    /// Every change, oldest first.
    entries: Vec<AuditEntry>,
    /// Hosts that did not answer: the changes they handled are missing.
    unreachable_hosts: Vec<String>,
}

/// One change made through the Machines API.
#[derive(JsonSchema)]
pub struct AuditEntry {
    /// When it was answered (RFC 3339).
    time: String,
    time_ms: u64,
    /// Who: the scoped token's id (its last block's revocation id), `token-file:<hash
    /// prefix>` for a token-file token, or `cluster-secret`.
    token_id: String,
    method: String,
    path: String,
    app: Option<String>,
    machine_id: Option<String>,
    /// The client's address as the handling host saw it.
    peer: String,
    /// The answer's HTTP status (refusals are recorded too).
    status: u16,
    /// The host that handled it.
    host_id: String,
}

/// One app secret as the API shows it: never its value.
#[derive(JsonSchema)]
pub struct AppSecret {
    name: String,
    /// A keyed digest of the value (16 hex digits): changes when the value changes.
    digest: String,
    created_at: String,
    updated_at: String,
}

/// An app's secrets.
#[derive(JsonSchema)]
pub struct AppSecrets {
    secrets: Vec<AppSecret>,
}

/// Body of `POST /v1/apps/{app}/secrets`.
#[derive(JsonSchema)]
pub struct UpdateAppSecretsRequest {
    /// NAME → value to set it, or `null` to unset it. All or nothing.
    values: BTreeMap<String, Option<String>>,
}

/// Body of `POST /v1/apps/{app}/secrets/{name}`.
#[derive(JsonSchema)]
pub struct SetAppSecretRequest {
    /// At most 64 KiB, no NUL byte.
    value: String,
}

/// An empty object.
#[derive(JsonSchema)]
pub struct EmptyResponse {}

/// bazaar extension: body of `POST /v1/apps/{app}/certificates`.
#[derive(JsonSchema)]
pub struct AddCertificateRequest {
    /// The hostname, e.g. `www.example.com`.
    hostname: String,
    /// The certificate chain (PEM, leaf first); with `key`, no ACME.
    cert: Option<String>,
    /// The certificate's private key (PEM).
    key: Option<String>,
}

/// bazaar extension: the TLS certificate of an app hostname.
#[derive(JsonSchema)]
pub struct Certificate {
    hostname: String,
    app: String,
    /// `acme` or `custom`.
    source: String,
    /// `pending`, `issued` or `failed`.
    status: String,
    /// Why issuance (or the last renewal) failed: the ACME server's words.
    error: Option<String>,
    /// The host that owns and renews it.
    owner_host: String,
    not_before: Option<String>,
    not_after: Option<String>,
    created_at: String,
    updated_at: String,
}
