//! This host's images over the host interface (`/host/v1/images`): list, pull with its
//! progress streamed as JSON lines, import of a `docker save` or OCI-layout archive (for
//! hosts without registry access: `bazaar image import FILE`), and pruning. Unused images
//! are also pruned in the background: an image no live machine uses and nobody pulled,
//! imported or launched for [`PRUNE_AFTER`] is forgotten and its layers collected.

use crate::agent::Agent;
use crate::error::AgentError;
use crate::oci::OciRuntime;
use crate::record::MachineRecord;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bazaar_image::{ImageStore, PullPhase, Reference};
use bazaar_types::state::MachineState;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::json;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// An image unused this long is pruned.
pub const PRUNE_AFTER: Duration = Duration::from_secs(3600);
/// How often the background pruning looks.
const PRUNE_EVERY: Duration = Duration::from_secs(600);

pub use bazaar_runtime::oci::LastUse;

/// The routes, nested under `/host/v1`.
pub fn routes() -> Router<Agent> {
    Router::new()
        .route("/images", get(list))
        .route("/images/pull", post(pull))
        .route("/images/import", post(import))
        .route("/images/prune", post(prune))
}

fn runtime(agent: &Agent) -> Result<std::sync::Arc<OciRuntime>, AgentError> {
    agent
        .driver()
        .oci
        .clone()
        .map_err(|reason| AgentError::Invalid(format!("this host has no image store: {reason}")))
}

fn store(agent: &Agent) -> Result<ImageStore, AgentError> {
    Ok(runtime(agent)?.images.clone())
}

fn image_json(image: &bazaar_image::Image) -> serde_json::Value {
    json!({
        "reference": image.reference,
        "digest": image.digest.to_string(),
        "layers": image.layers.len(),
        "size": image.layers.iter().map(|l| l.size).sum::<u64>(),
    })
}

async fn list(State(agent): State<Agent>) -> Result<Response, AgentError> {
    let images = store(&agent)?
        .images()
        .map_err(|e| AgentError::Internal(e.to_string()))?;
    Ok(Json(images.iter().map(image_json).collect::<Vec<_>>()).into_response())
}

#[derive(Deserialize)]
struct PullRequest {
    image: String,
}

/// Progress lines of one pull waiting for its reader.
const PROGRESS_QUEUE: usize = 64;

/// Pulls an image; the answer is a stream of JSON lines: one per layer phase
/// (`{"layer", "of", "phase", "done", "total"}`), then `{"image": ...}` or `{"error": ...}`.
async fn pull(State(agent): State<Agent>, body: Bytes) -> Result<Response, AgentError> {
    let req: PullRequest = bazaar_types::json::from_body(&body).map_err(AgentError::Invalid)?;
    let runtime = runtime(&agent)?;
    let store = runtime.images.clone();
    let reference: Reference = req
        .image
        .parse()
        .map_err(|e| AgentError::Invalid(format!("image {:?}: {e}", req.image)))?;
    // Progress lines wait here for a slow reader; when it is full a progress line is
    // dropped (the next one says as much), never the final line, which waits for room.
    let (tx, rx) = tokio::sync::mpsc::channel::<String>(PROGRESS_QUEUE);
    let progress_tx = tx.clone();
    let last_phase = Mutex::new(HashMap::<usize, (PullPhase, u64)>::new());
    runtime.last_use.touch(&reference.to_string());
    let auth = runtime.auth_for(&reference);
    let shutdown = agent.shutdown_token();
    agent.tracker().clone().spawn(async move {
        let progress = move |p: bazaar_image::PullProgress| {
            // One line per phase change, and at most one per MiB while downloading.
            let mut last = last_phase.lock().unwrap_or_else(|e| e.into_inner());
            let prev = last.insert(p.index, (p.phase, p.done));
            if let Some((phase, done)) = prev {
                if phase == p.phase && p.done < done + (1 << 20) && p.done != p.total {
                    last.insert(p.index, (phase, done));
                    return;
                }
            }
            let line = json!({"layer": p.index + 1, "of": p.count, "digest": p.layer.to_string(),
                              "phase": format!("{:?}", p.phase).to_lowercase(),
                              "done": p.done, "total": p.total});
            let _ = progress_tx.try_send(format!("{line}\n"));
        };
        // The agent's shutdown gives the pull up (a half-pulled layer is not recorded).
        let pulled = tokio::select! {
            () = shutdown.cancelled() => return,
            pulled = store.pull(&reference, &auth, &progress) => pulled,
        };
        let last = match pulled {
            Ok(image) => json!({"image": image_json(&image)}),
            Err(e) => json!({"error": format!("pulling {reference}: {e}")}),
        };
        let _ = tx.send(format!("{last}\n")).await;
    });
    let stream = tokio_stream_of(rx).map(|line| Ok::<_, std::io::Error>(Bytes::from(line)));
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response())
}

fn tokio_stream_of(
    mut rx: tokio::sync::mpsc::Receiver<String>,
) -> impl futures_util::Stream<Item = String> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Imports the archive in the request body (streamed to a file first, up to
/// `max_import_bytes`: a larger one is refused with 413 before or as it passes the limit).
async fn import(
    State(agent): State<Agent>,
    headers: axum::http::HeaderMap,
    body: Body,
) -> Result<Response, AgentError> {
    let store = store(&agent)?;
    let limit = agent.config().max_import_bytes;
    let too_large = || {
        AgentError::TooLarge(format!(
            "the archive is larger than this host accepts ({limit} bytes, --max-import-bytes)"
        ))
    };
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let tmp = agent
        .config()
        .data_dir
        .join(format!("import-{}.tar", ulid::Ulid::new()));
    let result = async {
        let mut file = tokio::fs::File::create(&tmp)
            .await
            .map_err(|e| AgentError::Internal(format!("creating {}: {e}", tmp.display())))?;
        let mut stream = body.into_data_stream();
        let mut size = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk =
                chunk.map_err(|e| AgentError::Invalid(format!("reading the archive: {e}")))?;
            size += chunk.len() as u64;
            if size > limit {
                return Err(too_large());
            }
            file.write_all(&chunk)
                .await
                .map_err(|e| AgentError::Internal(format!("writing the archive: {e}")))?;
        }
        file.flush()
            .await
            .map_err(|e| AgentError::Internal(e.to_string()))?;
        if size == 0 {
            return Err(AgentError::Invalid(
                "send the archive (docker save or OCI layout tar) as the request body".into(),
            ));
        }
        store
            .import_archive(&tmp)
            .await
            .map_err(|e| AgentError::Invalid(format!("importing the archive: {e}")))
    }
    .await;
    let _ = tokio::fs::remove_file(&tmp).await;
    let images = result?;
    for i in &images {
        runtime(&agent)?.last_use.touch(&i.reference);
    }
    Ok(Json(images.iter().map(image_json).collect::<Vec<_>>()).into_response())
}

/// Prunes now: every image no live machine uses (whatever its age), then unreferenced
/// layers.
async fn prune(State(agent): State<Agent>) -> Result<Response, AgentError> {
    let report = prune_unused(&agent, Duration::ZERO).await?;
    Ok(Json(report).into_response())
}

/// Forgets images unused by live machines and idle for `idle`, then collects layers.
pub async fn prune_unused(agent: &Agent, idle: Duration) -> Result<serde_json::Value, AgentError> {
    let store = store(agent)?;
    let machines: Vec<MachineRecord> = agent
        .store()
        .machines()?
        .into_iter()
        .filter(|m| m.state != MachineState::Destroyed)
        .collect();
    let in_use: Vec<String> = machines
        .iter()
        .filter_map(|m| m.config.image.parse::<Reference>().ok())
        .map(|r| r.to_string())
        .collect();
    let mut removed = Vec::new();
    for image in store
        .images()
        .map_err(|e| AgentError::Internal(e.to_string()))?
    {
        if in_use.contains(&image.reference)
            || runtime(agent)?.last_use.idle_for(&image.reference) < idle
        {
            continue;
        }
        if let Ok(r) = image.reference.parse::<Reference>() {
            if store.remove_image(&r).unwrap_or(false) {
                removed.push(image.reference.clone());
            }
        }
    }
    // A rootfs is in the machine's writable layer (or, made before layers, its directory).
    let live: Vec<std::path::PathBuf> = machines
        .iter()
        .map(|m| agent.driver().machine_dir(&m.id))
        .flat_map(|dir| [bazaar_runtime::work_disk::layer_dir(&dir), dir])
        .collect();
    let report = store
        .gc(&live)
        .await
        .map_err(|e| AgentError::Internal(e.to_string()))?;
    Ok(
        json!({"images": removed, "layers": report.layers.len(), "blobs": report.blobs.len(),
              "bytes": report.bytes}),
    )
}

/// Prunes in the background every ten minutes.
pub fn spawn_pruning(agent: &Agent) {
    if agent.driver().oci.is_err() {
        return;
    }
    let agent = agent.clone();
    let shutdown = agent.shutdown_token();
    agent.tracker().clone().spawn(async move {
        let mut tick = tokio::time::interval(PRUNE_EVERY);
        tick.tick().await;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = tick.tick() => {
                    if let Err(err) = prune_unused(&agent, PRUNE_AFTER).await {
                        tracing::warn!(error = %err, "pruning images");
                    }
                }
            }
        }
    });
}
