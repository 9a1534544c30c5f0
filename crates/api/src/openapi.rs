//! The OpenAPI 3.1 description of the Machines API this crate serves, generated from the
//! code and served at `GET /openapi.json` (no token needed).
//!
//! The schemas come from the wire types (`bazaar_types`, which derive `JsonSchema`) and,
//! for bodies that the handlers build ad hoc, from the schema-only mirrors of the private
//! module `wire`. The paths come from the table `operations`, one row per route and method of
//! [`crate::router`] and of the machine calls forwarded to the owner's host interface
//! (`bazaar_agent::http`). A test (`crates/cli/tests/api_openapi.rs`) calls every
//! operation of the document on a running agent, so a row that names no real route fails.

use axum::http::header;
use axum::response::{IntoResponse, Response};
use bazaar_types::error::ErrorBody;
use bazaar_types::event::MachineEvent;
use bazaar_types::host::{
    ExecRequest, ExecResponse, LeaseRequest, MetadataUpdate, SignalRequest, StopRequest,
    UpdateRequest, WaitResponse,
};
use bazaar_types::machine::Machine;
use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// `GET /openapi.json`: the document, built once.
pub async fn serve() -> Response {
    static DOC: OnceLock<String> = OnceLock::new();
    let body = DOC.get_or_init(|| document().to_string()).clone();
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Builds the OpenAPI 3.1 document.
pub fn document() -> Value {
    let mut settings = SchemaSettings::draft2020_12();
    settings.definitions_path = "/components/schemas".into();
    settings.meta_schema = None;
    let mut g = settings.into_generator();
    let error_ref = g.subschema_for::<ErrorBody>().to_value();

    let mut paths: BTreeMap<&str, Map<String, Value>> = BTreeMap::new();
    for op in operations() {
        let item = operation_json(&op, &mut g, &error_ref);
        paths
            .entry(op.path)
            .or_default()
            .insert(op.method.to_ascii_lowercase(), item);
    }
    let schemas = g.take_definitions(true);
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "bazaar Machines API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "The Fly.io Machines API v1 as bazaar serves it, on every agent. \
                Machine calls are answered by the host that owns the machine; lists come from \
                the cluster catalog. bazaar extensions are marked as such.",
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "tags": [
            {"name": "apps", "description": "Apps (catalog records)."},
            {"name": "machines", "description": "Machines: created through the market, then served by their owner."},
            {"name": "leases", "description": "Exclusive, time-bound write locks on machines."},
            {"name": "metadata", "description": "Machine metadata."},
            {"name": "platform", "description": "Regions and placement dry runs."},
            {"name": "catalog", "description": "bazaar extension: the cluster catalog as this node sees it."},
            {"name": "meta", "description": "This document."},
        ],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An API token of the cluster. `Authorization: FlyV1 <token>` is accepted too.",
                },
            },
        },
    })
}

/// How a schema of the document is made.
type SchemaFn = fn(&mut SchemaGenerator) -> Schema;

/// The schema of `T` (a `$ref` to `components.schemas`).
fn schema<T: JsonSchema>(g: &mut SchemaGenerator) -> Schema {
    g.subschema_for::<T>()
}

/// A query parameter's type.
#[derive(Debug, Clone, Copy)]
enum Ty {
    Str,
    Int,
    Bool,
}

/// A parameter besides the path's own (which are read from the path).
#[derive(Debug, Clone, Copy)]
enum Param {
    Query(&'static str, Ty, &'static str),
    /// The `fly-machine-lease-nonce` header.
    Nonce,
}

/// What a successful answer carries.
#[derive(Debug, Clone, Copy)]
enum Content {
    Json(SchemaFn),
    /// JSON lines (`application/x-ndjson`).
    Ndjson,
    None,
}

/// One operation: a method on a path.
#[derive(Debug)]
struct Op {
    method: &'static str,
    path: &'static str,
    id: &'static str,
    tag: &'static str,
    summary: &'static str,
    params: &'static [Param],
    body: Option<SchemaFn>,
    ok: &'static [(u16, &'static str, Content)],
    errors: &'static [u16],
    auth: bool,
}

impl Op {
    #[allow(clippy::too_many_arguments)]
    fn new(
        method: &'static str,
        path: &'static str,
        id: &'static str,
        tag: &'static str,
        summary: &'static str,
        ok: &'static [(u16, &'static str, Content)],
        errors: &'static [u16],
    ) -> Op {
        Op {
            method,
            path,
            id,
            tag,
            summary,
            params: &[],
            body: None,
            ok,
            errors,
            auth: true,
        }
    }

    fn params(mut self, params: &'static [Param]) -> Op {
        self.params = params;
        self
    }

    fn body(mut self, body: SchemaFn) -> Op {
        self.body = Some(body);
        self
    }
}

const M: &str = "/v1/apps/{app}/machines/{id}";

/// Errors of every call forwarded to a machine's owner.
const FWD: &[u16] = &[401, 404, 503];
/// Errors of a forwarded call that changes a machine.
const FWD_CHANGE: &[u16] = &[400, 401, 404, 409, 412, 503];

/// Every route and method of the Machines API.
fn operations() -> Vec<Op> {
    use Content::Json;
    use Param::{Nonce, Query};
    use Ty::{Bool, Int, Str};
    const OK: &[(u16, &str, Content)] = &[(200, "Done.", Json(schema::<wire::OkResponse>))];
    const NO_CONTENT: &[(u16, &str, Content)] = &[(204, "Done.", Content::None)];
    vec![
        Op {
            auth: false,
            ..Op::new(
                "GET",
                "/openapi.json",
                "GetOpenApi",
                "meta",
                "This OpenAPI document (no token needed).",
                &[(200, "The document.", Json(any_object))],
                &[],
            )
        },
        // Apps.
        Op::new(
            "GET",
            "/v1/apps",
            "AppsList",
            "apps",
            "List apps.",
            &[(200, "The apps.", Json(schema::<wire::AppList>))],
            &[401, 503],
        )
        .params(&[Query(
            "org_slug",
            Str,
            "Only apps of this organization.",
        )]),
        Op::new(
            "POST",
            "/v1/apps",
            "AppsCreate",
            "apps",
            "Create an app. The name is unique in the cluster.",
            &[(201, "Created.", Json(schema::<wire::App>))],
            &[400, 401, 422, 503],
        )
        .body(schema::<wire::CreateAppRequest>),
        Op::new(
            "GET",
            "/v1/apps/{app}",
            "AppsShow",
            "apps",
            "Get an app.",
            &[(200, "The app.", Json(schema::<wire::App>))],
            &[401, 404, 503],
        ),
        Op::new(
            "DELETE",
            "/v1/apps/{app}",
            "AppsDelete",
            "apps",
            "Delete an app: destroys its machines at once, then the app.",
            &[(202, "Accepted.", Json(schema::<wire::StatusResponse>))],
            &[401, 404, 503],
        ),
        // Machines.
        Op::new(
            "GET",
            "/v1/apps/{app}/machines",
            "MachinesList",
            "machines",
            "List an app's machines (from the catalog; each one's full object from its owner \
             unless `summary=true`). Also filters by metadata: `metadata.KEY=VALUE`.",
            &[(200, "The machines.", Json(machine_list))],
            &[401, 404, 503],
        )
        .params(&[
            Query("region", Str, "Only machines in this region."),
            Query(
                "state",
                Str,
                "Only machines in these states (comma-separated).",
            ),
            Query("include_deleted", Bool, "Include destroyed machines."),
            Query(
                "summary",
                Bool,
                "Leave out config, checks, events, host_status and nonce.",
            ),
        ]),
        Op::new(
            "POST",
            "/v1/apps/{app}/machines",
            "MachinesCreate",
            "machines",
            "Create a machine, placed by the market.",
            &[(200, "The new machine.", Json(schema::<Machine>))],
            &[400, 401, 404, 409, 413, 503],
        )
        .body(schema::<wire::CreateMachineRequest>),
        Op::new(
            "POST",
            "/v1/apps/{app}/machines/batch",
            "MachinesCreateBatch",
            "machines",
            "bazaar extension: create `count` machines of one config, placed in one round.",
            &[(
                200,
                "The machines created (maybe fewer than asked).",
                Json(schema::<wire::BatchCreateResponse>),
            )],
            &[400, 401, 404, 409, 413, 503],
        )
        .body(schema::<wire::BatchCreateRequest>),
        Op::new(
            "GET",
            M,
            "MachinesShow",
            "machines",
            "Get a machine (from the catalog, with `host_status: unreachable`, while its host is down).",
            &[(200, "The machine.", Json(schema::<Machine>))],
            FWD,
        ),
        Op::new(
            "POST",
            M,
            "MachinesUpdate",
            "machines",
            "Update a machine's config (a new version).",
            &[(200, "The updated machine.", Json(schema::<Machine>))],
            FWD_CHANGE,
        )
        .params(&[Nonce])
        .body(schema::<UpdateRequest>),
        Op::new(
            "PUT",
            M,
            "MachinesUpdatePut",
            "machines",
            "Same as `POST` (update).",
            &[(200, "The updated machine.", Json(schema::<Machine>))],
            FWD_CHANGE,
        )
        .params(&[Nonce])
        .body(schema::<UpdateRequest>),
        Op::new(
            "DELETE",
            M,
            "MachinesDelete",
            "machines",
            "Destroy a machine (it must be stopped unless `force`).",
            OK,
            FWD_CHANGE,
        )
        .params(&[
            Query("force", Bool, "Kill the machine if it runs."),
            Query("kill", Bool, "Same as `force`."),
            Nonce,
        ]),
        Op::new(
            "POST",
            "/v1/apps/{app}/machines/{id}/start",
            "MachinesStart",
            "machines",
            "Start a machine.",
            &[(200, "Started.", Json(schema::<wire::StartResponse>))],
            FWD_CHANGE,
        )
        .params(&[Nonce]),
        Op::new(
            "POST",
            "/v1/apps/{app}/machines/{id}/stop",
            "MachinesStop",
            "machines",
            "Stop a machine: its stop signal, then SIGKILL after the timeout.",
            OK,
            FWD_CHANGE,
        )
        .params(&[Nonce])
        .body(schema::<StopRequest>),
        Op::new(
            "POST",
            "/v1/apps/{app}/machines/{id}/restart",
            "MachinesRestart",
            "machines",
            "Restart a machine (the signal and timeout may also be given in the query).",
            OK,
            FWD_CHANGE,
        )
        .params(&[
            Query(
                "timeout",
                Str,
                "How long to wait before SIGKILL (Go duration or seconds).",
            ),
            Query("signal", Str, "The stop signal (name or number)."),
            Nonce,
        ])
        .body(schema::<StopRequest>),
        Op::new(
            "POST",
            "/v1/apps/{app}/machines/{id}/signal",
            "MachinesSignal",
            "machines",
            "Send a signal to a machine's process.",
            OK,
            FWD_CHANGE,
        )
        .params(&[Nonce])
        .body(schema::<SignalRequest>),
        Op::new(
            "POST",
            "/v1/apps/{app}/machines/{id}/suspend",
            "MachinesSuspend",
            "machines",
            "Suspend a machine (its processes are frozen).",
            OK,
            FWD_CHANGE,
        )
        .params(&[Nonce]),
        Op::new(
            "GET",
            "/v1/apps/{app}/machines/{id}/wait",
            "MachinesWait",
            "machines",
            "Wait until a machine is in one of the given states (default `started`).",
            &[(200, "The machine reached a state asked for.", Json(schema::<WaitResponse>))],
            &[400, 401, 404, 408, 503],
        )
        .params(&[
            Query(
                "state",
                Str,
                "States to wait for: repeated or comma-separated; `settled` means any resting state.",
            ),
            Query(
                "timeout",
                Str,
                "Seconds or a Go duration (default and maximum 60 s).",
            ),
            Query("instance_id", Str, "Wait for this version."),
            Query("version", Str, "Same as `instance_id`."),
        ]),
        Op::new(
            "GET",
            "/v1/apps/{app}/machines/{id}/lease",
            "MachinesShowLease",
            "leases",
            "Get the lease held on a machine.",
            &[(200, "The lease.", Json(schema::<wire::LeaseResponse>))],
            FWD,
        ),
        Op::new(
            "POST",
            "/v1/apps/{app}/machines/{id}/lease",
            "MachinesCreateLease",
            "leases",
            "Take a lease on a machine, or renew the one whose nonce is given.",
            &[
                (201, "A new lease.", Json(schema::<wire::LeaseResponse>)),
                (200, "The lease, renewed.", Json(schema::<wire::LeaseResponse>)),
            ],
            FWD_CHANGE,
        )
        .params(&[
            Query("ttl", Int, "Seconds (default 30); the body's `ttl` wins."),
            Nonce,
        ])
        .body(schema::<LeaseRequest>),
        Op::new(
            "DELETE",
            "/v1/apps/{app}/machines/{id}/lease",
            "MachinesReleaseLease",
            "leases",
            "Release the lease (its nonce is required).",
            &[(200, "Released.", Json(schema::<wire::StatusResponse>))],
            FWD_CHANGE,
        )
        .params(&[Nonce]),
        Op::new(
            "POST",
            "/v1/apps/{app}/machines/{id}/cordon",
            "MachinesCordon",
            "machines",
            "Take a machine out of its services' rotation.",
            OK,
            FWD_CHANGE,
        )
        .params(&[Nonce]),
        Op::new(
            "POST",
            "/v1/apps/{app}/machines/{id}/uncordon",
            "MachinesUncordon",
            "machines",
            "Put a machine back into its services' rotation.",
            OK,
            FWD_CHANGE,
        )
        .params(&[Nonce]),
        Op::new(
            "GET",
            "/v1/apps/{app}/machines/{id}/metadata",
            "MachinesShowMetadata",
            "metadata",
            "A machine's metadata.",
            &[(200, "The metadata.", Json(schema::<BTreeMap<String, String>>))],
            FWD,
        ),
        Op::new(
            "PUT",
            "/v1/apps/{app}/machines/{id}/metadata",
            "MachinesUpdateMetadata",
            "metadata",
            "Set and remove several metadata keys at once.",
            NO_CONTENT,
            FWD_CHANGE,
        )
        .params(&[Nonce])
        .body(schema::<MetadataUpdate>),
        Op::new(
            "PATCH",
            "/v1/apps/{app}/machines/{id}/metadata",
            "MachinesPatchMetadata",
            "metadata",
            "Same as `PUT`.",
            NO_CONTENT,
            FWD_CHANGE,
        )
        .params(&[Nonce])
        .body(schema::<MetadataUpdate>),
        Op::new(
            "GET",
            "/v1/apps/{app}/machines/{id}/metadata/{key}",
            "MachinesShowMetadataKey",
            "metadata",
            "One metadata value.",
            &[(200, "The value.", Json(schema::<wire::MetadataValue>))],
            FWD,
        ),
        Op::new(
            "POST",
            "/v1/apps/{app}/machines/{id}/metadata/{key}",
            "MachinesUpsertMetadata",
            "metadata",
            "Set one metadata key.",
            NO_CONTENT,
            FWD_CHANGE,
        )
        .params(&[Nonce])
        .body(schema::<wire::MetadataValue>),
        Op::new(
            "DELETE",
            "/v1/apps/{app}/machines/{id}/metadata/{key}",
            "MachinesDeleteMetadata",
            "metadata",
            "Remove one metadata key.",
            NO_CONTENT,
            FWD_CHANGE,
        )
        .params(&[Nonce]),
        Op::new(
            "GET",
            "/v1/apps/{app}/machines/{id}/events",
            "MachinesListEvents",
            "machines",
            "A machine's events, newest first.",
            &[(200, "The events.", Json(schema::<Vec<MachineEvent>>))],
            FWD,
        )
        .params(&[Query("limit", Int, "At most this many (default 20, 1 to 50).")]),
        Op::new(
            "GET",
            "/v1/apps/{app}/machines/{id}/versions",
            "MachinesListVersions",
            "machines",
            "A machine's config versions.",
            &[(200, "The versions.", Json(schema::<Vec<wire::MachineVersion>>))],
            FWD,
        ),
        Op::new(
            "POST",
            "/v1/apps/{app}/machines/{id}/exec",
            "MachinesExec",
            "machines",
            "Run a command in a running machine and wait for it.",
            &[(200, "The command ran.", Json(schema::<ExecResponse>))],
            FWD_CHANGE,
        )
        .body(schema::<ExecRequest>),
        Op::new(
            "GET",
            "/v1/apps/{app}/machines/{id}/logs",
            "MachinesLogs",
            "machines",
            "bazaar extension: the machine's output as JSON lines; with `follow=true`, a stream.",
            &[(200, "The log lines.", Content::Ndjson)],
            &[400, 401, 404, 503],
        )
        .params(&[
            Query(
                "max_bytes",
                Int,
                "The last this many bytes (default 64 KiB, at most 8 MiB).",
            ),
            Query("follow", Bool, "Keep streaming new lines."),
        ]),
        Op::new(
            "GET",
            "/v1/apps/{app}/machines/{id}/placement",
            "MachinesPlacement",
            "machines",
            "bazaar extension: how the market placed the machine.",
            &[(200, "The placement record.", Json(schema::<wire::PlacementRecord>))],
            FWD,
        ),
        // Platform.
        Op::new(
            "GET",
            "/v1/platform/regions",
            "PlatformRegions",
            "platform",
            "The regions of the cluster's hosts.",
            &[(200, "The regions.", Json(schema::<wire::RegionList>))],
            &[401, 503],
        ),
        Op::new(
            "POST",
            "/v1/platform/placements",
            "PlatformPlacements",
            "platform",
            "Where machines of a size would go: the market is asked for real and every \
             reservation released.",
            &[(200, "The dry run's outcome.", Json(schema::<wire::PlacementsResponse>))],
            &[400, 401, 409, 503],
        )
        .body(schema::<wire::PlacementsRequest>),
        // Catalog.
        Op::new(
            "GET",
            "/v1/catalog/hosts",
            "CatalogHosts",
            "catalog",
            "bazaar extension: the hosts this node's catalog knows.",
            &[(200, "The hosts.", Json(schema::<Vec<wire::CatalogHost>>))],
            &[401, 500],
        ),
        Op::new(
            "GET",
            "/v1/catalog/machines",
            "CatalogMachines",
            "catalog",
            "bazaar extension: the machines this node's catalog knows.",
            &[(200, "The machines.", Json(schema::<Vec<wire::CatalogMachine>>))],
            &[401, 500],
        )
        .params(&[
            Query("app", Str, "Only machines of this app."),
            Query("region", Str, "Only machines in this region."),
            Query("state", Str, "Only machines in these states (comma-separated)."),
            Query("include_deleted", Bool, "Include tombstones."),
        ]),
        Op::new(
            "GET",
            "/v1/catalog/digest",
            "CatalogDigest",
            "catalog",
            "bazaar extension: a digest of this node's catalog (equal digests, same rows).",
            &[(200, "The digest.", Json(schema::<wire::CatalogDigest>))],
            &[401, 500],
        ),
    ]
}

fn any_object(_: &mut SchemaGenerator) -> Schema {
    schemars::json_schema!({"type": "object"})
}

/// A list item is a full machine, or a summary with `summary=true`.
fn machine_list(g: &mut SchemaGenerator) -> Schema {
    let full = g.subschema_for::<Machine>();
    let summary = g.subschema_for::<wire::MachineSummary>();
    schemars::json_schema!({"type": "array", "items": {"anyOf": [full, summary]}})
}

fn error_text(code: u16) -> &'static str {
    match code {
        400 => "Invalid request.",
        401 => "A valid token is required.",
        404 => "Not found.",
        408 => "Timed out waiting.",
        409 => "Conflict: a lease held by someone else, a version mismatch, no running process, or insufficient capacity (`status: insufficient_capacity`).",
        412 => "Precondition failed: the machine's state does not allow this, or its version is not the one given.",
        413 => "The request body is too large.",
        422 => "Unprocessable: an invalid name, or a name taken (`status: name_taken`).",
        500 => "Internal error.",
        503 => "Unavailable: the catalog is not running yet, or the machine's host is unreachable.",
        _ => "Error.",
    }
}

fn operation_json(op: &Op, g: &mut SchemaGenerator, error_ref: &Value) -> Value {
    let mut params = Vec::new();
    for name in op
        .path
        .split('/')
        .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
    {
        let description = match name {
            "app" => "The app's name.",
            "id" => "The machine's id.",
            "key" => "The metadata key.",
            _ => "",
        };
        params.push(json!({
            "name": name,
            "in": "path",
            "required": true,
            "description": description,
            "schema": {"type": "string"},
        }));
    }
    for p in op.params {
        params.push(match *p {
            Param::Query(name, ty, description) => json!({
                "name": name,
                "in": "query",
                "required": false,
                "description": description,
                "schema": {"type": match ty {
                    Ty::Str => "string",
                    Ty::Int => "integer",
                    Ty::Bool => "boolean",
                }},
            }),
            Param::Nonce => json!({
                "name": "fly-machine-lease-nonce",
                "in": "header",
                "required": false,
                "description": "The nonce of the lease held on the machine, if one is.",
                "schema": {"type": "string"},
            }),
        });
    }
    let mut responses = Map::new();
    for (code, description, content) in op.ok {
        let mut r = json!({"description": description});
        match content {
            Content::Json(f) => {
                r["content"] = json!({"application/json": {"schema": f(g).to_value()}});
            }
            Content::Ndjson => {
                r["content"] = json!({"application/x-ndjson": {"schema": {"type": "string"}}});
            }
            Content::None => {}
        }
        responses.insert(code.to_string(), r);
    }
    for code in op.errors {
        responses.insert(
            code.to_string(),
            json!({
                "description": error_text(*code),
                "content": {"application/json": {"schema": error_ref}},
            }),
        );
    }
    let mut out = json!({
        "operationId": op.id,
        "tags": [op.tag],
        "summary": op.summary,
        "parameters": params,
        "responses": responses,
    });
    if let Some(body) = op.body {
        out["requestBody"] = json!({
            "required": false,
            "description": "A JSON object; an empty body is taken as `{}`. Unknown fields are ignored.",
            "content": {"application/json": {"schema": body(g).to_value()}},
        });
    }
    if !op.auth {
        out["security"] = json!([]);
    }
    out
}

/// Schema-only mirrors of the bodies the handlers build or read ad hoc.
mod wire {
    #![allow(dead_code)]

    use bazaar_types::config::MachineConfig;
    use bazaar_types::guest::Guest;
    use bazaar_types::host::Resources;
    use bazaar_types::machine::{Lease, Machine};
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

    /// A lease, in the wrapped form fly-go expects.
    #[derive(JsonSchema)]
    pub struct LeaseResponse {
        /// `success`.
        status: String,
        data: Lease,
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
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_ref_resolves_and_every_operation_is_unique() {
        let doc = super::document();
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        let mut stack = vec![&doc];
        while let Some(v) = stack.pop() {
            match v {
                serde_json::Value::Object(o) => {
                    if let Some(r) = o.get("$ref").and_then(|r| r.as_str()) {
                        let name = r.strip_prefix("#/components/schemas/").unwrap();
                        assert!(schemas.contains_key(name), "dangling {r}");
                    }
                    stack.extend(o.values());
                }
                serde_json::Value::Array(a) => stack.extend(a),
                _ => {}
            }
        }
        let mut ids: Vec<_> = super::operations().iter().map(|o| o.id).collect();
        let n = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), n, "duplicate operationId");
        assert!(schemas.contains_key("MachineConfig"));
    }
}
