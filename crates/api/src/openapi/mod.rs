//! The OpenAPI 3.1 description of the Machines API, derived from the router itself and
//! served at `GET /openapi.json` (no token needed).
//!
//! Every route of [`crate::router`] is registered with [`aide`]'s router, which takes the
//! handler and its documentation at once: a route cannot be served without being in the
//! document. What the document says of an operation comes from the code:
//!
//! - the request body from the handler's extractor ([`Body`], [`RawJson`], [`NoBody`]),
//! - the successful answer from its return type (`Json<T>`, [`Answer`], [`Relayed`],
//!   [`Ndjson`], `NoContent`), every schema from the wire types' `JsonSchema`,
//! - the operation id (Fly's names), tag, summary, query parameters and error statuses
//!   from the `*_docs` function beside each handler (`op`, `query`, `nonce`),
//! - path parameters from the route's path ([`document`] adds them).
//!
//! The machine calls forwarded to the owner's host interface are routes of their own here
//! (`machines::forwarded`), each typed with what the owner answers.

mod extract;

pub use extract::{
    Answer, Body, CarriesConfig, Checked, Ndjson, NoBody, RawJson, Relayed, RelayedBody,
};

use aide::openapi::{
    MediaType, OpenApi, Parameter, ParameterData, ParameterSchemaOrContent, QueryStyle,
    ReferenceOr, Response as DocResponse, SchemaObject, StatusCode as DocStatus,
};
use aide::transform::TransformOperation;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bazaar_types::error::ErrorBody;
use schemars::generate::SchemaSettings;
use serde_json::{json, Value};
use std::sync::{Arc, OnceLock};

/// Builds the routes' documentation with the schema settings of the document: JSON Schema
/// 2020-12 (OpenAPI 3.1's dialect), definitions under `components.schemas`. `build` runs
/// aide's thread-local generator, so a document is built whole on one thread.
pub(crate) fn with_generator<R>(build: impl FnOnce() -> R) -> R {
    aide::generate::reset_context();
    aide::generate::in_context(|ctx| {
        let mut settings = SchemaSettings::draft2020_12();
        settings.definitions_path = "/components/schemas".into();
        settings.meta_schema = None;
        ctx.schema = settings.into_generator();
    });
    aide::generate::on_error(|e| tracing::warn!(error = %e, "openapi: {e}"));
    let built = build();
    // The generator lives in a thread-local: let go of the schemas it gathered, which the
    // document now holds (it would otherwise stay for the life of the thread).
    aide::generate::reset_context();
    built
}

/// The document of `api` (the routes' part, from [`aide::axum::ApiRouter::finish_api`]),
/// completed: info, tags, security, path parameters. A JSON value.
/// Gives every integer of a fixed width its range (`minimum`/`maximum`) where the schema
/// lacks it: a number beyond the width does not decode (400), so the document says so.
fn bound_integers(value: &mut Value) {
    match value {
        Value::Object(object) => {
            let range: Option<(Value, Value)> = match object.get("format").and_then(Value::as_str) {
                Some("uint8") => Some((0.into(), u8::MAX.into())),
                Some("uint16") => Some((0.into(), u16::MAX.into())),
                Some("uint32") => Some((0.into(), u32::MAX.into())),
                Some("uint64" | "uint") => Some((0.into(), u64::MAX.into())),
                Some("int32") => Some((i32::MIN.into(), i32::MAX.into())),
                Some("int64" | "int") => Some((i64::MIN.into(), i64::MAX.into())),
                _ => None,
            };
            if let Some((min, max)) = range {
                object.entry("minimum").or_insert(min);
                object.entry("maximum").or_insert(max);
            }
            object.values_mut().for_each(bound_integers);
        }
        Value::Array(items) => items.iter_mut().for_each(bound_integers),
        _ => {}
    }
}

pub(crate) fn complete(api: OpenApi) -> Value {
    let mut doc = serde_json::to_value(&api).unwrap_or_else(|_| json!({}));
    bound_integers(&mut doc);
    let mut paths = doc["paths"].take();
    let schemas = doc["components"]["schemas"].take();
    if let Some(paths) = paths.as_object_mut() {
        for (path, item) in paths.iter_mut() {
            let Some(item) = item.as_object_mut() else {
                continue;
            };
            for (method, op) in item.iter_mut() {
                complete_operation(path, op);
                require_body_with_required_fields(op, &schemas);
                add_common_errors(path, method, op);
            }
        }
    }
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
            {"name": "quotas", "description": "bazaar extension: quotas per organization and app, checked by every node from its catalog (docs/POLICY.md)."},
            {"name": "platform", "description": "Regions and placement dry runs."},
            {"name": "catalog", "description": "bazaar extension: the cluster catalog as this node sees it."},
            {"name": "meta", "description": "This document."},
        ],
        "servers": [{
            "url": "/",
            "description": "The agent that serves this document: every agent serves the whole API.",
        }],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "schemas": if schemas.is_object() { schemas } else { json!({}) },
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

/// The path's parameters (first, in the path's order), and `security: []` for the one
/// operation that needs no token.
fn complete_operation(path: &str, op: &mut Value) {
    let mut params: Vec<Value> = path
        .split('/')
        .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
        .map(|name| {
            let description = match name {
                "app" => "The app's name.",
                "org" => "The organization's slug.",
                "id" if path.contains("/volumes/") => "The volume's id.",
                "id" => "The machine's id.",
                "key" => "The metadata key.",
                "name" => "The secret's name (an environment variable name).",
                "hostname" => "The hostname, e.g. `www.example.com`.",
                _ => "",
            };
            // App and organization names follow `ids::validate_name` (a DNS label), so a
            // client knows what the server refuses (400) before sending it.
            let schema = match name {
                "app" | "org" => json!({
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 63,
                    "pattern": "^[a-z0-9]([a-z0-9-]*[a-z0-9])?$",
                }),
                // `bazaar_node::secrets::validate_name`: an environment variable's name.
                "name" => json!({
                    "type": "string",
                    "minLength": 1,
                    "maxLength": bazaar_node::secrets::MAX_NAME_LEN,
                    "pattern": "^(?!FLY_|BAZAAR_)[A-Za-z_][A-Za-z0-9_]*$",
                }),
                _ => json!({"type": "string"}),
            };
            json!({
                "name": name,
                "in": "path",
                "required": true,
                "description": description,
                "schema": schema,
            })
        })
        .collect();
    if let Some(rest) = op.get("parameters").and_then(Value::as_array) {
        params.extend(rest.iter().cloned());
    }
    op["parameters"] = Value::Array(params);
    if op["operationId"] == OPENAPI_ID {
        op["security"] = json!([]);
    }
}

/// Marks an operation's request body required when its schema has required fields: a call
/// without a body could only be refused (400), so the document says it must have one.
/// Bodies whose fields are all optional stay optional (no body is `{}`).
fn require_body_with_required_fields(op: &mut Value, schemas: &Value) {
    let Some(body) = op.get_mut("requestBody") else {
        return;
    };
    let schema = &body["content"]["application/json"]["schema"];
    let schema = match schema["$ref"].as_str() {
        Some(r) => &schemas[r.trim_start_matches("#/components/schemas/")],
        None => schema,
    };
    let has_required = |s: &Value| s["required"].as_array().is_some_and(|r| !r.is_empty());
    let any_of_requires = schema["anyOf"]
        .as_array()
        .is_some_and(|alts| !alts.is_empty() && alts.iter().all(has_required));
    if has_required(schema) || any_of_requires {
        body["required"] = Value::Bool(true);
    }
}

/// The errors any operation of its kind can answer, whether or not its own docs name them:
/// 403 for a change on the Machines API (a token whose scope lacks the operation), 413 for
/// an operation that takes a body (past the 1 MiB limit). Each with Fly's error body.
fn add_common_errors(path: &str, method: &str, op: &mut Value) {
    let scoped = path.starts_with("/v1/apps")
        || path.starts_with("/v1/orgs")
        || path.starts_with("/v1/platform");
    let mut codes = Vec::new();
    if scoped && method != "get" {
        codes.push(403);
    }
    if op.get("requestBody").is_some() {
        codes.push(413);
    }
    for code in codes {
        let key = code.to_string();
        if op["responses"].get(&key).is_some() {
            continue;
        }
        op["responses"][key] = json!({
            "description": error_text(code),
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
        });
    }
}

/// The operation id of `GET /openapi.json`.
const OPENAPI_ID: &str = "GetOpenApi";

/// `GET /openapi.json`: the document built with the router (set once it is built).
pub(crate) fn serve(
    doc: Arc<OnceLock<Arc<str>>>,
) -> impl FnOnce() -> std::future::Ready<DocumentJson> + Clone + Send + Sync + 'static {
    move || {
        std::future::ready(DocumentJson(
            doc.get().cloned().unwrap_or_else(|| "{}".into()),
        ))
    }
}

/// The document, as served.
#[derive(Debug)]
pub(crate) struct DocumentJson(Arc<str>);

impl IntoResponse for DocumentJson {
    fn into_response(self) -> Response {
        (
            [(header::CONTENT_TYPE, "application/json")],
            self.0.to_string(),
        )
            .into_response()
    }
}

impl aide::OperationOutput for DocumentJson {
    type Inner = ();

    fn inferred_responses(
        _: &mut aide::generate::GenContext,
        _: &mut aide::openapi::Operation,
    ) -> Vec<(Option<DocStatus>, DocResponse)> {
        let content = [(
            "application/json".to_string(),
            MediaType {
                schema: Some(SchemaObject {
                    json_schema: schemars::json_schema!({"type": "object"}),
                    example: None,
                    external_docs: None,
                }),
                ..Default::default()
            },
        )];
        vec![(
            Some(DocStatus::Code(200)),
            DocResponse {
                description: "The document.".into(),
                content: content.into_iter().collect(),
                ..Default::default()
            },
        )]
    }
}

/// The docs of `GET /openapi.json`.
pub(crate) fn serve_docs(t: TransformOperation<'_>) -> TransformOperation<'_> {
    op(
        t,
        OPENAPI_ID,
        "meta",
        "This OpenAPI document (no token needed).",
        &[],
    )
}

/// An operation's id (Fly's name), tag, summary and the error statuses it may answer (each
/// with Fly's error body).
pub(crate) fn op<'a>(
    t: TransformOperation<'a>,
    id: &str,
    tag: &str,
    summary: &str,
    errors: &[u16],
) -> TransformOperation<'a> {
    let mut t = t.id(id).tag(tag).summary(summary);
    let error_schema = aide::generate::in_context(|ctx| ctx.schema.subschema_for::<ErrorBody>());
    let responses = t.inner_mut().responses.get_or_insert_with(Default::default);
    for &code in errors {
        let content = [(
            "application/json".to_string(),
            MediaType {
                schema: Some(SchemaObject {
                    json_schema: error_schema.clone(),
                    example: None,
                    external_docs: None,
                }),
                ..Default::default()
            },
        )];
        responses.responses.insert(
            DocStatus::Code(code),
            ReferenceOr::Item(DocResponse {
                description: error_text(code).into(),
                content: content.into_iter().collect(),
                ..Default::default()
            }),
        );
    }
    t
}

/// Errors of every call forwarded to a machine's owner (400: a path or query parameter
/// that does not parse).
pub(crate) const FWD: &[u16] = &[400, 401, 404, 503];
/// Errors of a forwarded call that changes a machine (403: a token without the operation).
pub(crate) const FWD_CHANGE: &[u16] = &[400, 401, 403, 404, 409, 412, 503];

/// A query parameter's type.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Ty {
    Str,
    Int,
    Bool,
}

/// An optional query parameter read from the raw query (handlers that parse it themselves,
/// and the forwarded calls, whose owner parses it).
pub(crate) fn query<'a>(
    mut t: TransformOperation<'a>,
    name: &str,
    ty: Ty,
    description: &str,
) -> TransformOperation<'a> {
    let ty = match ty {
        Ty::Str => "string",
        Ty::Int => "integer",
        Ty::Bool => "boolean",
    };
    t.inner_mut()
        .parameters
        .push(ReferenceOr::Item(Parameter::Query {
            parameter_data: parameter(name, ty, description),
            allow_reserved: false,
            style: QueryStyle::Form,
            allow_empty_value: None,
        }));
    t
}

/// The `fly-machine-lease-nonce` header of a call on a leased machine.
pub(crate) fn nonce(mut t: TransformOperation<'_>) -> TransformOperation<'_> {
    t.inner_mut()
        .parameters
        .push(ReferenceOr::Item(Parameter::Header {
            parameter_data: parameter(
                "fly-machine-lease-nonce",
                "string",
                "The nonce of the lease held on the machine, if one is.",
            ),
            style: aide::openapi::HeaderStyle::Simple,
        }));
    t
}

fn parameter(name: &str, ty: &str, description: &str) -> ParameterData {
    ParameterData {
        name: name.into(),
        description: Some(description.into()),
        required: false,
        deprecated: None,
        format: ParameterSchemaOrContent::Schema(SchemaObject {
            json_schema: schemars::json_schema!({"type": ty}),
            example: None,
            external_docs: None,
        }),
        example: None,
        examples: Default::default(),
        explode: None,
        extensions: Default::default(),
    }
}

fn error_text(code: u16) -> &'static str {
    match code {
        400 => "Invalid request.",
        401 => "A valid token is required.",
        403 => "Forbidden: a Machines API token where only the cluster secret is accepted, a token without the operation, or one without the process driver for a config that runs it.",
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

/// The document as a JSON value, without a node: the routes are built (not served) only to
/// be described.
pub fn document() -> Value {
    crate::document_of_routes()
}

#[cfg(test)]
mod tests;
