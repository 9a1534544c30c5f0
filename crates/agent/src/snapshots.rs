//! Volume snapshots on this host: consistent copies of a volume's ext4 image kept under
//! `data_dir/snapshots/<id>/` (`volume.img` and `snapshot.json`), the sources restores and
//! forks are copied from, and retention (a snapshot is kept for its volume's
//! `snapshot_retention` days, and outlives the volume for that long).
//!
//! A snapshot is made in `.partial-<id>/` and renamed into place once complete, so a listed
//! snapshot is always whole. A crash mid-snapshot leaves a partial directory (removed on
//! start) and maybe a frozen file system (thawed on start).

use crate::agent::Agent;
use crate::error::AgentError;
use crate::volume_fs::{consistent_copy, CopySource};
use crate::volume_record::VolumeState;
use bazaar_types::now_ms;
use bazaar_types::volume::{
    is_valid_snapshot_id, new_snapshot_id, HostSnapshot, HostVolumeCreate, VolumeSnapshot,
    VolumeSource,
};
use std::path::{Path, PathBuf};

const META: &str = "snapshot.json";
const IMAGE: &str = "volume.img";
const PARTIAL: &str = ".partial-";
/// How often expired snapshots are looked for.
const PRUNE_EVERY: std::time::Duration = std::time::Duration::from_secs(3600);

fn snapshot_not_found(id: &str) -> AgentError {
    AgentError::NotFound(format!("snapshot {id} not found"))
}

/// Every complete snapshot under `root`.
fn read_snapshots(root: &Path) -> Vec<HostSnapshot> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut out: Vec<HostSnapshot> = entries
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|e| std::fs::read(e.path().join(META)).ok())
        .filter_map(|bytes| serde_json::from_slice(&bytes).ok())
        .collect();
    out.sort_by_key(|s: &HostSnapshot| (s.created_at_ms, s.id.clone()));
    out
}

fn snapshots_root(agent: &Agent) -> &Path {
    &agent.volume_fs().snapshots
}

fn snapshot_dir(agent: &Agent, id: &str) -> PathBuf {
    snapshots_root(agent).join(id)
}

/// Takes a snapshot of a volume: a copy of its image while its file system is frozen
/// (a machine writing to it waits for the copy).
pub async fn snapshot_volume(agent: &Agent, volume_id: &str) -> Result<VolumeSnapshot, AgentError> {
    // Serialized with the volume's storage steps (extend, delete, forks).
    let _step = agent.volume_step().await;
    let vol = agent.load_volume(volume_id)?;
    if vol.state != VolumeState::Created {
        return Err(AgentError::Conflict(format!(
            "volume {volume_id} is {}; try again when it is created",
            vol.state.as_str()
        )));
    }
    if vol.fstype != "ext4" {
        return Err(AgentError::Invalid(format!(
            "volume {volume_id} is a plain directory (its host could not make ext4 images), which cannot be snapshotted"
        )));
    }
    let id = new_snapshot_id();
    let partial = snapshots_root(agent).join(format!("{PARTIAL}{id}"));
    let dir = snapshot_dir(agent, &id);
    let source = agent.volume_fs().copy_source(volume_id);
    let started = std::time::Instant::now();
    let snap = HostSnapshot {
        id: id.clone(),
        volume_id: vol.id.clone(),
        app: vol.app.clone(),
        size: 0,
        digest: String::new(),
        created_at_ms: now_ms(),
        volume_size_gb: vol.size_gb,
        retention_days: vol.snapshot_retention,
    };
    let crashing = agent.clone();
    let made = tokio::task::spawn_blocking(move || -> std::io::Result<HostSnapshot> {
        std::fs::create_dir_all(&partial)?;
        let copied = consistent_copy(&source, &partial.join(IMAGE), true, &|| {
            crashing.crash_at("volume_snapshot", 0)
        })?;
        let snap = HostSnapshot {
            size: copied.bytes,
            digest: copied.digest.unwrap_or_default(),
            ..snap
        };
        let meta = partial.join(META);
        std::fs::write(&meta, serde_json::to_vec(&snap)?)?;
        std::fs::File::open(&meta)?.sync_all()?;
        std::fs::rename(&partial, &dir)?;
        if let Some(parent) = dir.parent() {
            std::fs::File::open(parent)?.sync_all()?;
        }
        Ok(snap)
    })
    .await?
    .map_err(|e| AgentError::Internal(format!("snapshot of volume {volume_id}: {e}")))?;
    tracing::info!(volume.id = %volume_id, snapshot.id = %made.id, bytes = made.size,
        ms = started.elapsed().as_millis() as u64, "volume snapshot taken");
    prune_snapshots(agent).await;
    Ok(made.view())
}

/// A volume's snapshots, oldest first.
pub fn volume_snapshots(agent: &Agent, volume_id: &str) -> Result<Vec<VolumeSnapshot>, AgentError> {
    agent.load_volume(volume_id)?;
    Ok(read_snapshots(snapshots_root(agent))
        .iter()
        .filter(|s| s.volume_id == volume_id && !s.expired(now_ms()))
        .map(HostSnapshot::view)
        .collect())
}

/// One snapshot of this host.
pub fn snapshot(agent: &Agent, id: &str) -> Result<HostSnapshot, AgentError> {
    if !is_valid_snapshot_id(id) {
        return Err(snapshot_not_found(id));
    }
    let bytes =
        std::fs::read(snapshot_dir(agent, id).join(META)).map_err(|_| snapshot_not_found(id))?;
    serde_json::from_slice(&bytes).map_err(|e| AgentError::Internal(format!("snapshot {id}: {e}")))
}

/// Checks that a new volume may be made from `source` here: same app, at least the
/// source's size, ext4.
pub(crate) fn check_source(
    agent: &Agent,
    source: &VolumeSource,
    req: &HostVolumeCreate,
) -> Result<(), AgentError> {
    if !agent.volume_fs().ext4 {
        return Err(AgentError::Invalid(
            "this host keeps volumes as plain directories (the agent is not root), so it cannot restore or fork volumes".into(),
        ));
    }
    let (field, id, source_gb) = match source {
        VolumeSource::Snapshot(id) => {
            let snap = snapshot(agent, id)
                .ok()
                .filter(|s| s.app == req.app)
                .ok_or_else(|| {
                    AgentError::Invalid(format!(
                        "snapshot_id {id} is not a snapshot of app {} on this host",
                        req.app
                    ))
                })?;
            ("snapshot_id", id, snap.volume_size_gb)
        }
        VolumeSource::Volume(id) => {
            let vol = agent
                .load_volume(id)
                .ok()
                .filter(|v| v.app == req.app)
                .ok_or_else(|| {
                    AgentError::Invalid(format!(
                        "source_volume_id {id} is not a volume of app {} on this host",
                        req.app
                    ))
                })?;
            if vol.state != VolumeState::Created || vol.fstype != "ext4" {
                return Err(AgentError::Invalid(format!(
                    "source_volume_id {id} is {} ({}); only a created ext4 volume can be forked",
                    vol.state.as_str(),
                    vol.fstype
                )));
            }
            ("source_volume_id", id, vol.size_gb)
        }
    };
    if req.size_gb < source_gb {
        return Err(AgentError::Invalid(format!(
            "size_gb {} is smaller than {field} {id} ({source_gb} GB); volumes do not shrink",
            req.size_gb
        )));
    }
    Ok(())
}

/// Where a new volume's data is copied from.
pub(crate) fn copy_source(agent: &Agent, source: &VolumeSource) -> Result<CopySource, AgentError> {
    match source {
        VolumeSource::Snapshot(id) => {
            snapshot(agent, id)?;
            Ok(CopySource {
                image: snapshot_dir(agent, id).join(IMAGE),
                freeze: None,
            })
        }
        VolumeSource::Volume(id) => {
            agent.load_volume(id)?;
            Ok(agent.volume_fs().copy_source(id))
        }
    }
}

/// After a crash: thaws every volume (a snapshot may have been cut short while its file
/// system was frozen), removes partial snapshots and expired ones. Runs on start.
pub(crate) async fn recover_snapshots(agent: &Agent) {
    let fs = agent.volume_fs().clone();
    let volumes: Vec<String> = agent
        .store()
        .volumes()
        .unwrap_or_default()
        .into_iter()
        .filter(|v| v.fstype == "ext4")
        .map(|v| v.id)
        .collect();
    let root = snapshots_root(agent).to_path_buf();
    let _ = tokio::task::spawn_blocking(move || {
        for id in &volumes {
            fs.thaw(id);
        }
        for entry in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            if entry.file_name().to_string_lossy().starts_with(PARTIAL) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    })
    .await;
    prune_snapshots(agent).await;
}

/// Removes expired snapshots every hour (also when no snapshot is taken).
pub(crate) fn spawn_snapshot_pruning(agent: &Agent) {
    let shutdown = agent.shutdown_token();
    let tracker = agent.tracker();
    let agent = agent.clone();
    tracker.spawn(async move {
        let mut tick = tokio::time::interval(PRUNE_EVERY);
        tick.tick().await; // the first tick is now: start-up pruned already
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = tick.tick() => prune_snapshots(&agent).await,
            }
        }
    });
}

/// Removes the snapshots kept longer than their retention.
async fn prune_snapshots(agent: &Agent) {
    let root = snapshots_root(agent).to_path_buf();
    let _ = tokio::task::spawn_blocking(move || {
        let now = now_ms();
        for snap in read_snapshots(&root).into_iter().filter(|s| s.expired(now)) {
            match std::fs::remove_dir_all(root.join(&snap.id)) {
                Ok(()) => {
                    tracing::info!(snapshot.id = %snap.id, volume.id = %snap.volume_id, "expired snapshot removed")
                }
                Err(err) => {
                    tracing::warn!(snapshot.id = %snap.id, error = %err, "removing an expired snapshot")
                }
            }
        }
    })
    .await;
}
