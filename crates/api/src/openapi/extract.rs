//! The request bodies and answers of the Machines API as types that both serve and describe
//! themselves: each implements axum's extractor or response trait and aide's
//! `OperationInput` / `OperationOutput`, so the handler's signature is its documentation.

use crate::error::ApiError;
use aide::generate::GenContext;
use aide::openapi::{
    MediaType, Operation, ReferenceOr, RequestBody, Response as DocResponse, SchemaObject,
    StatusCode as DocStatus,
};
use aide::{OperationInput, OperationOutput};
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::marker::PhantomData;

/// How every JSON request body is described: optional, an empty body being `{}`.
const BODY_TEXT: &str = "A JSON object; an empty body is taken as `{}`. Unknown fields are \
     ignored; a key given twice in one object is refused (400).";

fn document_body<T: JsonSchema>(ctx: &mut GenContext, operation: &mut Operation) {
    let schema = ctx.schema.subschema_for::<T>();
    operation.request_body = Some(ReferenceOr::Item(RequestBody {
        description: Some(BODY_TEXT.into()),
        content: [(
            "application/json".to_string(),
            MediaType {
                schema: Some(SchemaObject {
                    json_schema: schema,
                    example: None,
                    external_docs: None,
                }),
                ..Default::default()
            },
        )]
        .into_iter()
        .collect(),
        required: false,
        extensions: Default::default(),
    }));
}

fn json_response<T: JsonSchema>(ctx: &mut GenContext) -> DocResponse {
    let schema = ctx.schema.subschema_for::<T>();
    let description = ctx
        .resolve_schema(&schema)
        .get("description")
        .and_then(|d| d.as_str())
        .map(|d| d.lines().next().unwrap_or(d).to_string())
        .unwrap_or_else(|| "Done.".into());
    DocResponse {
        description,
        content: [(
            "application/json".to_string(),
            MediaType {
                schema: Some(SchemaObject {
                    json_schema: schema,
                    example: None,
                    external_docs: None,
                }),
                ..Default::default()
            },
        )]
        .into_iter()
        .collect(),
        ..Default::default()
    }
}

/// The raw request body (the size limit applies); its rejection answered as axum does, and
/// made Fly-shaped by the router's error layer.
async fn bytes_of<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, Response> {
    Bytes::from_request(req, state)
        .await
        .map_err(IntoResponse::into_response)
}

/// A JSON object body parsed into `T` ([`crate::parse_body`]: empty is `{}`, unknown fields
/// ignored, a 400 saying what is wrong).
#[derive(Debug)]
pub struct Body<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequest<S> for Body<T> {
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = bytes_of(req, state).await?;
        crate::parse_body(&bytes)
            .map(Body)
            .map_err(IntoResponse::into_response)
    }
}

impl<T: JsonSchema> OperationInput for Body<T> {
    fn operation_input(ctx: &mut GenContext, operation: &mut Operation) {
        document_body::<T>(ctx, operation);
    }
}

/// A body kept as bytes (parsed by the handler itself, or relayed to the machine's owner)
/// and documented as `T`. It is checked to be a JSON object with no key given twice (400
/// otherwise), so whoever reads it reads the same thing.
#[derive(Debug)]
pub struct RawJson<T>(pub Bytes, pub PhantomData<fn() -> T>);

impl<T, S: Send + Sync> FromRequest<S> for RawJson<T> {
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = bytes_of(req, state).await?;
        bazaar_types::json::parse_object(&bytes)
            .and_then(|object| object.refuse_duplicates())
            .map_err(|e| ApiError::BadRequest(e).into_response())?;
        Ok(RawJson(bytes, PhantomData))
    }
}

impl<T: JsonSchema> OperationInput for RawJson<T> {
    fn operation_input(ctx: &mut GenContext, operation: &mut Operation) {
        document_body::<T>(ctx, operation);
    }
}

/// A body that may carry a machine config (create, batch create, update), parsed once into
/// `T` and authorized as parsed: a config that runs the process driver needs a token that
/// allows it (`access::authorize_config`, 403), checked on this very value before
/// the handler gets it; a key given twice is then refused (400), as in every body.
#[derive(Debug)]
pub struct Checked<T>(pub T);

/// A request body that may carry a machine config.
pub trait CarriesConfig {
    /// The config it carries, if any.
    fn config(&self) -> Option<&bazaar_types::config::MachineConfig>;
}

impl<T: DeserializeOwned + CarriesConfig + Send, S: Send + Sync> FromRequest<S> for Checked<T> {
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let caller = req.extensions().get::<bazaar_node::Caller>().cloned();
        let route = req
            .extensions()
            .get::<crate::access::RouteAccess>()
            .cloned();
        let bytes = bytes_of(req, state).await?;
        let checked = || -> Result<T, ApiError> {
            let object = bazaar_types::json::parse_object(&bytes).map_err(ApiError::BadRequest)?;
            let duplicates = object.refuse_duplicates();
            let value: T = object.into_typed().map_err(ApiError::BadRequest)?;
            crate::access::authorize_config(caller.as_ref(), route.as_ref(), value.config())?;
            duplicates.map_err(ApiError::BadRequest)?;
            Ok(value)
        };
        checked().map(Checked).map_err(IntoResponse::into_response)
    }
}

impl<T: JsonSchema> OperationInput for Checked<T> {
    fn operation_input(ctx: &mut GenContext, operation: &mut Operation) {
        document_body::<T>(ctx, operation);
    }
}

/// A call that takes no body: whatever is sent is relayed as it is, and nothing documented.
#[derive(Debug)]
pub struct NoBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for NoBody {
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        Ok(NoBody(bytes_of(req, state).await?))
    }
}

impl OperationInput for NoBody {}

/// The bytes of a relayed body, whichever extractor read them.
pub trait RelayedBody {
    /// The body as received.
    fn into_bytes(self) -> Bytes;
}

impl<T> RelayedBody for RawJson<T> {
    fn into_bytes(self) -> Bytes {
        self.0
    }
}

/// A checked body is relayed as the value that was authorized, not as the bytes received.
impl<T: Serialize> RelayedBody for Checked<T> {
    fn into_bytes(self) -> Bytes {
        serde_json::to_vec(&self.0).unwrap_or_default().into()
    }
}

impl RelayedBody for NoBody {
    fn into_bytes(self) -> Bytes {
        self.0
    }
}

/// `T` as JSON with status `CODE` (`Answer<201, App>`: created).
#[derive(Debug)]
pub struct Answer<const CODE: u16, T>(pub T);

impl<const CODE: u16, T: Serialize> IntoResponse for Answer<CODE, T> {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(CODE).unwrap_or(StatusCode::OK);
        (status, Json(self.0)).into_response()
    }
}

impl<const CODE: u16, T: JsonSchema> OperationOutput for Answer<CODE, T> {
    type Inner = T;

    fn operation_response(ctx: &mut GenContext, _: &mut Operation) -> Option<DocResponse> {
        Some(json_response::<T>(ctx))
    }

    fn inferred_responses(
        ctx: &mut GenContext,
        _: &mut Operation,
    ) -> Vec<(Option<DocStatus>, DocResponse)> {
        vec![(Some(DocStatus::Code(CODE)), json_response::<T>(ctx))]
    }
}

/// The owner's answer to a forwarded call, relayed as it is (status, type, body); `R` is
/// what it is when the call succeeds, for the document.
#[derive(Debug)]
pub struct Relayed<R>(pub Response, pub PhantomData<fn() -> R>);

impl<R> Relayed<R> {
    /// Relays `resp`.
    pub fn new(resp: Response) -> Relayed<R> {
        Relayed(resp, PhantomData)
    }
}

impl<R> IntoResponse for Relayed<R> {
    fn into_response(self) -> Response {
        self.0
    }
}

impl<R: OperationOutput> OperationOutput for Relayed<R> {
    type Inner = R::Inner;

    fn operation_response(ctx: &mut GenContext, op: &mut Operation) -> Option<DocResponse> {
        R::operation_response(ctx, op)
    }

    fn inferred_responses(
        ctx: &mut GenContext,
        op: &mut Operation,
    ) -> Vec<(Option<DocStatus>, DocResponse)> {
        R::inferred_responses(ctx, op)
    }
}

/// JSON lines (`application/x-ndjson`), for the document only: a machine's log.
#[derive(Debug)]
pub enum Ndjson {}

impl OperationOutput for Ndjson {
    type Inner = ();

    fn inferred_responses(
        _: &mut GenContext,
        _: &mut Operation,
    ) -> Vec<(Option<DocStatus>, DocResponse)> {
        let content = [(
            "application/x-ndjson".to_string(),
            MediaType {
                schema: Some(SchemaObject {
                    json_schema: schemars::json_schema!({"type": "string"}),
                    example: None,
                    external_docs: None,
                }),
                ..Default::default()
            },
        )];
        vec![(
            Some(DocStatus::Code(200)),
            DocResponse {
                description: "The log lines.".into(),
                content: content.into_iter().collect(),
                ..Default::default()
            },
        )]
    }
}

/// Errors are listed per operation (`openapi::op`), with the statuses each may answer.
impl OperationOutput for ApiError {
    type Inner = ();
}
