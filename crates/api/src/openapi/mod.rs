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
    ExecRequest, ExecResponse, LeaseRequest, MetadataUpdate, ProcessStat, SignalRequest,
    StopRequest, UpdateRequest, WaitResponse,
};
use bazaar_types::machine::Machine;
use bazaar_types::volume::{
    CreateVolumeRequest, ExtendVolumeRequest, ExtendVolumeResponse, UpdateVolumeRequest, Volume,
    VolumeSnapshot,
};
use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::sync::OnceLock;

#[cfg(test)]
mod coverage;
mod routes;
mod wire;

use routes::operations;

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
            {"name": "volumes", "description": "Volumes: host-local storage; a machine that mounts one lives on its host."},
            {"name": "secrets", "description": "App secrets: sealed with the cluster's key, given to machines as environment variables; values are never answered."},
            {"name": "certificates", "description": "bazaar extension: TLS certificates of app hostnames, served by every proxy."},
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
        403 => "Forbidden: a Machines API token where only the cluster secret is accepted.",
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
            "name" => "The secret's name (an environment variable name).",
            "hostname" => "The hostname, e.g. `www.example.com`.",
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
