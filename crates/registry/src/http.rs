//! The axum shell of the registry: one handler for every `/v2` path, which checks the
//! caller, parses the route ([`crate::protocol`]) and carries it out on the host's
//! repositories ([`bazaar_image::RepoStore`]). Upload bytes stream to a file of the image
//! store, bounded by [`RegistryConfig::max_blob_bytes`], and enter the store only once their
//! digest is checked; a chunked upload's file and record outlive a restart of the agent.

use crate::protocol::{
    app_of, credential, name_unknown, operation, valid_name, valid_tag, ErrorCode, RegistryError,
    Route, Upload, CHALLENGE,
};
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use bazaar_auth::{Access, Denied};
use bazaar_image::{Digest, ImageStore, RepoStore};
use bazaar_node::{AuditEntry, Caller, NodeHandle};
use futures_util::StreamExt;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::io::AsyncWriteExt;

/// The largest manifest taken (Docker's limit too).
pub const MAX_MANIFEST_BYTES: usize = 4 << 20;

/// The registry's limits.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// The largest blob one upload may bring (413 past it).
    pub max_blob_bytes: u64,
    /// Uploads in progress at once (429 past it).
    pub max_uploads: usize,
}

impl Default for RegistryConfig {
    fn default() -> RegistryConfig {
        RegistryConfig {
            max_blob_bytes: 4 << 30,
            max_uploads: 256,
        }
    }
}

/// One upload: its state, where its bytes are, and whether it ended.
#[derive(Debug)]
struct Slot {
    state: Upload,
    path: PathBuf,
    ended: bool,
}

#[derive(Debug)]
struct Shared {
    node: NodeHandle,
    repos: RepoStore,
    config: RegistryConfig,
    uploads: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Slot>>>>,
    epoch: Instant,
}

type Answer = Result<Response, RegistryError>;

/// The distribution API on `/v2`, over the repositories of `store`. Uploads an earlier
/// agent left in progress are taken up again where their bytes end.
pub fn router(node: NodeHandle, store: ImageStore, config: RegistryConfig) -> Router {
    let repos = store.repos();
    let mut uploads = HashMap::new();
    match repos.resumable_uploads() {
        Ok(left) => {
            if !left.is_empty() {
                tracing::info!(uploads = left.len(), "uploads in progress taken up again");
            }
            for (id, name, path, offset) in left {
                let state = Upload {
                    name,
                    offset,
                    touched: std::time::Duration::ZERO,
                };
                let slot = Slot {
                    state,
                    path,
                    ended: false,
                };
                uploads.insert(id, Arc::new(tokio::sync::Mutex::new(slot)));
            }
        }
        Err(e) => tracing::warn!(error = %e, "uploads in progress could not be read"),
    }
    let shared = Arc::new(Shared {
        node,
        repos,
        config,
        uploads: Mutex::new(uploads),
        epoch: Instant::now(),
    });
    Router::new()
        .route("/v2", any(handle))
        .route("/v2/", any(handle))
        .route("/v2/{*rest}", any(handle))
        .layer(DefaultBodyLimit::disable())
        .with_state(shared)
}

fn internal(e: impl std::fmt::Display) -> RegistryError {
    tracing::warn!(error = %e, "registry");
    RegistryError::new(ErrorCode::Unknown, e.to_string())
}

fn unauthorized(why: impl Into<String>) -> RegistryError {
    RegistryError::new(ErrorCode::Unauthorized, why)
}

fn answer(status: StatusCode) -> axum::http::response::Builder {
    Response::builder()
        .status(status)
        .header("docker-distribution-api-version", "registry/2.0")
}

fn error_response(err: &RegistryError) -> Response {
    let mut builder = answer(err.status).header(header::CONTENT_TYPE, "application/json");
    if err.status == StatusCode::UNAUTHORIZED {
        builder = builder.header(header::WWW_AUTHENTICATE, CHALLENGE);
    }
    builder
        .body(Body::from(err.body()))
        .expect("a well-formed answer")
}

async fn handle(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    match serve(&shared, req).await {
        Ok(resp) => resp,
        Err(err) => error_response(&err),
    }
}

/// Who calls: another host (by its certificate on the host listener, or the cluster
/// secret: peers fetching layers), else a Machines API token.
fn caller(shared: &Shared, req: &Request) -> Result<Caller, RegistryError> {
    if let Some(peer) = req.extensions().get::<bazaar_node::host_link::PeerHost>() {
        return Ok(Caller::Host(peer.0.clone()));
    }
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(credential)
        .ok_or_else(|| unauthorized("authentication required: a Machines API token"))?;
    if bazaar_node::secrets::constant_time_eq(
        token.as_bytes(),
        shared.node.cluster_secret().as_bytes(),
    ) {
        return Ok(Caller::Host("cluster-secret".into()));
    }
    shared
        .node
        .caller(&token)
        .map_err(|denied| unauthorized(denied.to_string()))
}

async fn serve(shared: &Arc<Shared>, req: Request) -> Answer {
    let caller = caller(shared, &req)?;
    let route = Route::parse(req.uri().path()).ok_or_else(|| {
        RegistryError::new(ErrorCode::Unsupported, "not a route of the registry API")
            .with_status(StatusCode::NOT_FOUND)
    })?;
    let Some(name) = route.name().map(str::to_string) else {
        return Ok(answer(StatusCode::OK)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from("{}"))
            .expect("a well-formed answer"));
    };
    if !valid_name(&name) {
        return Err(RegistryError::new(
            ErrorCode::NameInvalid,
            format!("{name:?} is not a repository name: <app> or <app>/<path>, lowercase"),
        ));
    }
    let method = req.method().clone();
    caller
        .authorize(&Access {
            app: Some(app_of(&name)),
            op: operation(&method),
            process: false,
            runtime: None,
        })
        .map_err(|denied| match denied {
            Denied::OtherApp => name_unknown(&name),
            Denied::Forbidden(why) => RegistryError::new(ErrorCode::Denied, why),
            other => unauthorized(other.to_string()),
        })?;
    let (parts, body) = req.into_parts();
    let (uri, headers) = (parts.uri, parts.headers);
    match (route, method) {
        (Route::Blob { digest, .. }, m) if m == Method::GET || m == Method::HEAD => {
            get_blob(shared, &name, &digest, m == Method::HEAD).await
        }
        (Route::StartUpload { .. }, Method::POST) => {
            start_upload(shared, &name, &uri, &headers, body).await
        }
        (Route::Upload { id, .. }, m) => upload(shared, &name, &id, m, &uri, &headers, body).await,
        (Route::Manifest { reference, .. }, Method::PUT) => {
            let resp = put_manifest(shared, &name, &reference, &headers, body).await;
            audit(shared, &caller, "PUT", &uri, &name, &resp);
            resp
        }
        (Route::Manifest { reference, .. }, Method::DELETE) => {
            let resp = delete_manifest(shared, &name, &reference);
            audit(shared, &caller, "DELETE", &uri, &name, &resp);
            resp
        }
        (Route::Manifest { reference, .. }, m) if m == Method::GET || m == Method::HEAD => {
            get_manifest(shared, &name, &reference, m == Method::HEAD)
        }
        (Route::Tags { .. }, Method::GET) => tags(shared, &name, &uri),
        (_, m) => Err(RegistryError::new(
            ErrorCode::Unsupported,
            format!("{m} is not supported here"),
        )),
    }
}

fn audit(shared: &Shared, caller: &Caller, method: &str, uri: &Uri, name: &str, resp: &Answer) {
    let status = match resp {
        Ok(r) => r.status(),
        Err(e) => e.status,
    };
    shared.node.record_audit(&AuditEntry {
        time: bazaar_types::rfc3339(bazaar_types::now_ms()),
        time_ms: bazaar_types::now_ms(),
        token_id: caller.id(),
        method: method.into(),
        path: uri.path().to_string(),
        app: Some(app_of(name).to_string()),
        machine_id: None,
        peer: String::new(),
        status: status.as_u16(),
        host_id: shared.node.host_id().to_string(),
    });
}

fn parse_digest(s: &str) -> Result<Digest, RegistryError> {
    s.parse()
        .map_err(|_| RegistryError::new(ErrorCode::DigestInvalid, format!("bad digest {s:?}")))
}

fn query(uri: &Uri) -> HashMap<String, String> {
    axum::extract::Query::<HashMap<String, String>>::try_from_uri(uri)
        .map(|q| q.0)
        .unwrap_or_default()
}

async fn get_blob(shared: &Shared, name: &str, digest: &str, head: bool) -> Answer {
    let digest = parse_digest(digest)?;
    let path = shared.repos.blob_file(name, &digest).map_err(internal)?;
    let unknown = || RegistryError::new(ErrorCode::BlobUnknown, format!("blob {digest} unknown"));
    let path = path.ok_or_else(unknown)?;
    let file = match tokio::fs::File::open(&path).await {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(unknown()),
        Err(e) => return Err(internal(e)),
    };
    let size = file.metadata().await.map_err(internal)?.len();
    let builder = answer(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_LENGTH, size)
        .header("docker-content-digest", digest.as_str());
    let body = if head {
        Body::empty()
    } else {
        tracing::debug!(repository = name, %digest, size, "serving a blob");
        Body::from_stream(tokio_util::io::ReaderStream::new(file))
    };
    Ok(builder.body(body).expect("a well-formed answer"))
}

/// Appends `body` to `path`, at most `max` bytes (413 past it: the caller drops the upload).
async fn append(
    body: Body,
    headers: &HeaderMap,
    path: &Path,
    max: u64,
    limit: u64,
) -> Result<u64, RegistryError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max) {
        return Err(RegistryError::too_large("the upload", limit));
    }
    let mut file = tokio::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .await
        .map_err(internal)?;
    let mut stream = body.into_data_stream();
    let mut written = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            RegistryError::new(
                ErrorCode::BlobUploadInvalid,
                format!("reading the upload: {e}"),
            )
        })?;
        written += chunk.len() as u64;
        if written > max {
            return Err(RegistryError::too_large("the upload", limit));
        }
        file.write_all(&chunk).await.map_err(internal)?;
    }
    file.flush().await.map_err(internal)?;
    Ok(written)
}

/// Hashes the finished upload at `path` and moves it into the store as `digest`.
async fn adopt(shared: &Shared, name: &str, path: PathBuf, digest: &Digest) -> Answer {
    let (repos, owned_name, expected) = (shared.repos.clone(), name.to_string(), digest.clone());
    let adopted =
        tokio::task::spawn_blocking(move || repos.adopt_upload(&owned_name, &path, &expected))
            .await
            .map_err(internal)?;
    match adopted {
        Ok(size) => {
            tracing::info!(repository = name, %digest, size, "blob pushed");
            Ok(answer(StatusCode::CREATED)
                .header(header::LOCATION, format!("/v2/{name}/blobs/{digest}"))
                .header("docker-content-digest", digest.as_str())
                .header(header::CONTENT_LENGTH, 0)
                .body(Body::empty())
                .expect("a well-formed answer"))
        }
        Err(bazaar_image::repos::UploadRefused::DigestMismatch { expected, actual }) => {
            Err(RegistryError::new(
                ErrorCode::DigestInvalid,
                format!("the upload's content is {actual}, not {expected}"),
            ))
        }
        Err(e) => Err(internal(e)),
    }
}

fn upload_answer(status: StatusCode, name: &str, id: &str, state: &Upload) -> Response {
    answer(status)
        .header(header::LOCATION, format!("/v2/{name}/blobs/uploads/{id}"))
        .header(header::RANGE, state.range())
        .header("docker-upload-uuid", id)
        .header(header::CONTENT_LENGTH, 0)
        .body(Body::empty())
        .expect("a well-formed answer")
}

impl Shared {
    fn now(&self) -> std::time::Duration {
        self.epoch.elapsed()
    }

    /// Drops uploads idle past their time (their bytes too).
    fn sweep(&self) {
        let now = self.now();
        let mut uploads = self.uploads.lock().unwrap_or_else(|e| e.into_inner());
        uploads.retain(|id, slot| match slot.try_lock() {
            Ok(mut s) if s.state.expired(now) => {
                s.ended = true;
                self.repos.close_upload(id);
                false
            }
            _ => true,
        });
    }

    /// Ends upload `id`: out of the table, its bytes and record off the disk.
    fn forget(&self, id: &str) {
        self.repos.close_upload(id);
        self.uploads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
    }
}

async fn start_upload(
    shared: &Arc<Shared>,
    name: &str,
    uri: &Uri,
    headers: &HeaderMap,
    body: Body,
) -> Answer {
    let query = query(uri);
    let limit = shared.config.max_blob_bytes;
    let id = ulid::Ulid::new().to_string().to_lowercase();
    let path = shared.repos.upload_path(&id);
    // A monolithic upload: the whole blob in this request.
    if let Some(digest) = query.get("digest") {
        let digest = parse_digest(digest)?;
        if let Err(e) = append(body, headers, &path, limit, limit).await {
            let _ = tokio::fs::remove_file(&path).await;
            return Err(e);
        }
        return adopt(shared, name, path, &digest).await;
    }
    // `mount`/`from` (a blob of another repository) is not taken: an upload starts instead,
    // as the spec allows.
    shared.sweep();
    // The upload's file exists from the start, so an empty upload finishes as one; its
    // record beside it lets it outlive a restart.
    let path = shared.repos.open_upload(&id, name).map_err(internal)?;
    let slot = Arc::new(tokio::sync::Mutex::new(Slot {
        state: Upload {
            name: name.to_string(),
            offset: 0,
            touched: shared.now(),
        },
        path,
        ended: false,
    }));
    let mut guard = slot.clone().lock_owned().await;
    let full = {
        let mut uploads = shared.uploads.lock().unwrap_or_else(|e| e.into_inner());
        let full = uploads.len() >= shared.config.max_uploads;
        if !full {
            uploads.insert(id.clone(), slot);
        }
        full
    };
    if full {
        shared.repos.close_upload(&id);
        return Err(RegistryError::new(
            ErrorCode::TooManyRequests,
            format!(
                "{} uploads are in progress on this host; finish or cancel some",
                shared.config.max_uploads
            ),
        ));
    }
    let has_body = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .is_some_and(|n| n > 0);
    if has_body {
        match append(body, headers, &guard.path, limit, limit).await {
            Ok(n) => guard.state.offset = n,
            Err(e) => {
                end(shared, &id, &mut guard).await;
                return Err(e);
            }
        }
    }
    Ok(upload_answer(StatusCode::ACCEPTED, name, &id, &guard.state))
}

async fn end(shared: &Shared, id: &str, slot: &mut Slot) {
    slot.ended = true;
    let _ = tokio::fs::remove_file(&slot.path).await;
    shared.forget(id);
}

async fn upload(
    shared: &Arc<Shared>,
    name: &str,
    id: &str,
    method: Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Body,
) -> Answer {
    let unknown =
        || RegistryError::new(ErrorCode::BlobUploadUnknown, format!("upload {id} unknown"));
    let slot = shared
        .uploads
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(id)
        .cloned()
        .ok_or_else(unknown)?;
    let mut slot = slot.lock().await;
    if slot.ended || !slot.state.belongs_to(name) {
        return Err(unknown());
    }
    let limit = shared.config.max_blob_bytes;
    let content_range = headers
        .get(header::CONTENT_RANGE)
        .and_then(|v| v.to_str().ok());
    match method {
        Method::GET => Ok(upload_answer(StatusCode::NO_CONTENT, name, id, &slot.state)),
        Method::DELETE => {
            end(shared, id, &mut slot).await;
            Ok(answer(StatusCode::NO_CONTENT)
                .body(Body::empty())
                .expect("a well-formed answer"))
        }
        Method::PATCH | Method::PUT => {
            let digest = if method == Method::PUT {
                let q = query(uri);
                let Some(d) = q.get("digest") else {
                    return Err(RegistryError::new(
                        ErrorCode::DigestInvalid,
                        "finishing an upload needs ?digest=",
                    ));
                };
                Some(parse_digest(d)?)
            } else {
                None
            };
            let max = slot.state.accept_chunk(content_range, limit)?;
            match append(body, headers, &slot.path, max, limit).await {
                Ok(n) => {
                    slot.state.offset += n;
                    slot.state.touched = shared.now();
                }
                Err(e) => {
                    if e.status == StatusCode::PAYLOAD_TOO_LARGE {
                        end(shared, id, &mut slot).await;
                    }
                    return Err(e);
                }
            }
            let Some(digest) = digest else {
                return Ok(upload_answer(StatusCode::ACCEPTED, name, id, &slot.state));
            };
            // Finished: whatever the digest check says, this upload is over (its bytes
            // adopted or removed, then its record).
            slot.ended = true;
            let adopted = adopt(shared, name, slot.path.clone(), &digest).await;
            shared.forget(id);
            adopted
        }
        m => Err(RegistryError::new(
            ErrorCode::Unsupported,
            format!("{m} is not supported on an upload"),
        )),
    }
}

async fn put_manifest(
    shared: &Shared,
    name: &str,
    reference: &str,
    headers: &HeaderMap,
    body: Body,
) -> Answer {
    if reference.parse::<Digest>().is_err() && !valid_tag(reference) {
        return Err(RegistryError::new(
            ErrorCode::ManifestInvalid,
            format!("{reference:?} is neither a tag nor a digest"),
        ));
    }
    let bytes = axum::body::to_bytes(body, MAX_MANIFEST_BYTES)
        .await
        .map_err(|_| RegistryError::too_large("the manifest", MAX_MANIFEST_BYTES as u64))?;
    let media_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or("").trim().to_string())
        .filter(|v| v.starts_with("application/vnd."));
    use bazaar_image::repos::ManifestRefused;
    let digest = shared
        .repos
        .put_manifest(name, reference, media_type.as_deref(), &bytes)
        .map_err(|e| match e {
            ManifestRefused::Invalid(why) => RegistryError::new(ErrorCode::ManifestInvalid, why),
            ManifestRefused::BlobUnknown(d) => RegistryError::new(
                ErrorCode::ManifestBlobUnknown,
                format!("blob {d} is not in {name}: push it first"),
            ),
            ManifestRefused::DigestMismatch { expected, actual } => RegistryError::new(
                ErrorCode::DigestInvalid,
                format!("the manifest's digest is {actual}, not {expected}"),
            ),
            ManifestRefused::Store(e) => internal(e),
        })?;
    tracing::info!(repository = name, reference, %digest, "manifest pushed");
    Ok(answer(StatusCode::CREATED)
        .header(header::LOCATION, format!("/v2/{name}/manifests/{digest}"))
        .header("docker-content-digest", digest.as_str())
        .header(header::CONTENT_LENGTH, 0)
        .body(Body::empty())
        .expect("a well-formed answer"))
}

/// `DELETE` of a manifest, as the distribution spec has it: by digest, the manifest and
/// every tag naming it leave this host's repository (its blobs' links follow once no kept
/// manifest names them and they are older than the retention's grace, so a push in
/// progress keeps what it uploaded); by tag, that tag only. `202`, or `404
/// MANIFEST_UNKNOWN` if the repository does not hold it.
fn delete_manifest(shared: &Shared, name: &str, reference: &str) -> Answer {
    let unknown = || {
        RegistryError::new(
            ErrorCode::ManifestUnknown,
            format!("manifest {reference} unknown in {name}"),
        )
    };
    match reference.parse::<Digest>() {
        Ok(digest) => {
            let held = shared
                .repos
                .manifest(name, reference)
                .map_err(internal)?
                .is_some();
            if !held {
                return Err(unknown());
            }
            let grace = crate::retention::Retention::default().grace;
            shared
                .repos
                .release(name, &digest, grace)
                .map_err(internal)?;
        }
        Err(_) if valid_tag(reference) => {
            if !shared.repos.untag(name, reference).map_err(internal)? {
                return Err(unknown());
            }
        }
        Err(_) => {
            return Err(RegistryError::new(
                ErrorCode::ManifestInvalid,
                format!("{reference:?} is neither a tag nor a digest"),
            ))
        }
    }
    tracing::info!(repository = name, reference, "manifest deleted");
    Ok(answer(StatusCode::ACCEPTED)
        .header(header::CONTENT_LENGTH, 0)
        .body(Body::empty())
        .expect("a well-formed answer"))
}

fn get_manifest(shared: &Shared, name: &str, reference: &str, head: bool) -> Answer {
    let found = shared
        .repos
        .manifest(name, reference)
        .map_err(internal)?
        .ok_or_else(|| {
            RegistryError::new(
                ErrorCode::ManifestUnknown,
                format!("manifest {reference} unknown in {name}"),
            )
        })?;
    let builder = answer(StatusCode::OK)
        .header(
            header::CONTENT_TYPE,
            HeaderValue::from_str(&found.media_type).map_err(internal)?,
        )
        .header(header::CONTENT_LENGTH, found.bytes.len())
        .header("docker-content-digest", found.digest.as_str());
    let body = if head {
        Body::empty()
    } else {
        Body::from(found.bytes)
    };
    Ok(builder.body(body).expect("a well-formed answer"))
}

fn tags(shared: &Shared, name: &str, uri: &Uri) -> Answer {
    let mut tags = shared
        .repos
        .tags(name)
        .map_err(internal)?
        .ok_or_else(|| name_unknown(name))?;
    let q = query(uri);
    if let Some(last) = q.get("last") {
        tags.retain(|t| t > last);
    }
    if let Some(n) = q.get("n").and_then(|n| n.parse::<usize>().ok()) {
        tags.truncate(n);
    }
    let body = serde_json::json!({"name": name, "tags": tags}).to_string();
    Ok(answer(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .expect("a well-formed answer"))
}

impl IntoResponse for RegistryError {
    fn into_response(self) -> Response {
        error_response(&self)
    }
}
