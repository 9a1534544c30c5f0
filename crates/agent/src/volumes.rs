//! Volumes owned by this host: records in the store, storage through
//! [`crate::volume_fs::VolumeFs`], the host's side of volume placement (an exact check of
//! disk, `require_unique_zone` and the compute hint), attachment to machines, and catalog
//! rows; functions over the agent's narrow API (store, write lock, volume steps).
//!
//! Each change is record-then-do: the record is written in its transient state
//! (`creating`, `extending`, `destroying`) before the storage is touched, and the final
//! state after; the storage steps are idempotent, so on start `recover_volumes`
//! finishes whatever a crash cut short. A create is answered once the volume is `created`,
//! so an acknowledged volume survives a kill -9. Record writes happen under the ledger lock
//! (which serializes every write of the agent), so attaching a volume to a new machine and
//! deleting it cannot interleave.

use crate::agent::Agent;
use crate::error::AgentError;
use crate::record::MachineRecord;
use crate::store::Batch;

pub use crate::volume_record::{VolumeRecord, VolumeState};
use bazaar_placement::volume::{check_volume, DiskState, VolumeRequest};
use bazaar_types::volume::{
    is_valid_volume_id, mount_of, validate_size_gb, validate_volume_name, HostVolumeCreate,
    UpdateVolumeRequest, Volume, BLOCK_SIZE, NO_ENCRYPTION,
};
use bazaar_types::{ids, now_ms};

fn not_found(id: &str) -> AgentError {
    AgentError::NotFound(format!("volume {id} not found"))
}

/// Creates a volume here (or returns it, if this id was created already). Refused with
/// `insufficient_capacity` when the disk, the unique-zone rule or the compute hint says no.
pub async fn create_volume(agent: &Agent, req: HostVolumeCreate) -> Result<Volume, AgentError> {
    if !is_valid_volume_id(&req.id) {
        return Err(AgentError::Invalid(format!(
            "invalid volume id {:?}",
            req.id
        )));
    }
    ids::validate_name("app", &req.app).map_err(AgentError::Invalid)?;
    validate_volume_name(&req.name).map_err(AgentError::Invalid)?;
    validate_size_gb(req.size_gb).map_err(AgentError::Invalid)?;
    if req.encrypted {
        return Err(AgentError::Invalid(NO_ENCRYPTION.into()));
    }
    let rec = {
        let ledger = agent.write_lock().await;
        if let Some(existing) = agent.store().volume(&req.id)? {
            if existing.app != req.app || existing.name != req.name {
                return Err(AgentError::Conflict(format!(
                    "volume id {} is taken",
                    req.id
                )));
            }
            existing
        } else {
            let volumes = agent.store().volumes()?;
            let state = DiskState {
                disk_gb: agent.disk_gb(),
                used_gb: volumes.iter().map(|v| v.size_gb).sum(),
                same_name: volumes
                    .iter()
                    .filter(|v| v.app == req.app && v.name == req.name)
                    .count(),
                free: ledger.free(),
            };
            let want = VolumeRequest {
                size_gb: req.size_gb,
                compute: req.compute,
                require_unique_zone: req.require_unique_zone,
            };
            if let Some(source) = &req.source {
                crate::snapshots::check_source(agent, source, &req)?;
            }
            check_volume(&state, &want).map_err(AgentError::Capacity)?;
            let now = now_ms();
            let rec = VolumeRecord {
                id: req.id.clone(),
                app: req.app.clone(),
                name: req.name.clone(),
                region: agent.config().region.clone(),
                size_gb: req.size_gb,
                state: VolumeState::Creating,
                fstype: agent.volume_fs().fstype().to_string(),
                encrypted: req.encrypted,
                attached_machine_id: None,
                snapshot_retention: req.snapshot_retention,
                auto_backup_enabled: req.auto_backup_enabled,
                created_at_ms: now,
                updated_at_ms: now,
                source: req.source.clone(),
            };
            let mut b = Batch::default();
            b.volume(&rec);
            agent.commit(b).await?;
            publish_volume(agent, &rec);
            rec
        }
    };
    agent.crash_at("volume_create", 0);
    let rec = finish_volume(agent, rec).await?;
    tracing::info!(volume.id = %rec.id, app = %rec.app, size_gb = rec.size_gb, fstype = %rec.fstype, "volume created");
    Ok(volume_view(agent, &rec))
}

/// Runs the storage step a volume's state calls for and records the settled state.
async fn finish_volume(agent: &Agent, rec: VolumeRecord) -> Result<VolumeRecord, AgentError> {
    let _step = agent.volume_step().await;
    // A concurrent call may have finished it meanwhile.
    let rec = match agent.store().volume(&rec.id)? {
        Some(current) => current,
        None if rec.state == VolumeState::Destroying => return Ok(rec),
        None => return Err(not_found(&rec.id)),
    };
    let fs = agent.volume_fs().clone();
    let (id, size, fstype, state) = (rec.id.clone(), rec.size_gb, rec.fstype.clone(), rec.state);
    let source = match (&rec.source, state) {
        (Some(source), VolumeState::Creating) => {
            Some(crate::snapshots::copy_source(agent, source)?)
        }
        _ => None,
    };
    let done = tokio::task::spawn_blocking(move || match state {
        VolumeState::Creating => fs.create(&id, size, &fstype, source.as_ref()),
        VolumeState::Extending => fs.grow(&id, size, &fstype),
        VolumeState::Destroying => fs.remove(&id),
        VolumeState::Created if fstype == "ext4" => fs.mount(&id),
        VolumeState::Created => Ok(()),
    })
    .await?;
    if let Err(err) = done {
        if state == VolumeState::Creating {
            // Nothing was acknowledged: undo, so no half-made volume stays behind.
            discard_volume(agent, &rec).await;
        }
        return Err(AgentError::Internal(format!(
            "volume {} ({}): {err}",
            rec.id,
            state.as_str()
        )));
    }
    let _ledger = agent.write_lock().await;
    let mut b = Batch::default();
    let settled = match state {
        VolumeState::Destroying => {
            b.delete_volume(&rec.id);
            None
        }
        VolumeState::Created => return Ok(rec),
        _ => {
            // Reload: an attach may have changed the record meanwhile.
            let mut current = agent.store().volume(&rec.id)?.unwrap_or(rec.clone());
            current.state = VolumeState::Created;
            current.updated_at_ms = now_ms();
            b.volume(&current);
            Some(current)
        }
    };
    agent.commit(b).await?;
    match &settled {
        Some(v) => publish_volume(agent, v),
        None => {
            if let Some(c) = agent.catalog() {
                c.delete_volume(&rec.id);
            }
        }
    }
    Ok(settled.unwrap_or(rec))
}

async fn discard_volume(agent: &Agent, rec: &VolumeRecord) {
    let fs = agent.volume_fs().clone();
    let id = rec.id.clone();
    if let Ok(Err(err)) = tokio::task::spawn_blocking(move || fs.remove(&id)).await {
        tracing::warn!(volume.id = %rec.id, error = %err, "removing a failed volume");
    }
    let _ledger = agent.write_lock().await;
    let mut b = Batch::default();
    b.delete_volume(&rec.id);
    if agent.commit(b).await.is_ok() {
        if let Some(c) = agent.catalog() {
            c.delete_volume(&rec.id);
        }
    }
}

/// Finishes every volume operation a crash cut short and mounts ext4 volumes that are
/// not mounted (after a reboot). Runs on start.
pub(crate) async fn recover_volumes(agent: &Agent) {
    crate::snapshots::recover_snapshots(agent).await;
    for rec in agent.store().volumes().unwrap_or_default() {
        let (id, state) = (rec.id.clone(), rec.state);
        if let Err(err) = finish_volume(agent, rec).await {
            tracing::error!(volume.id = %id, state = state.as_str(), error = %err, "recovering volume");
        }
    }
}

/// This host's volumes (of one app, if given).
pub fn list_volumes(agent: &Agent, app: Option<&str>) -> Result<Vec<Volume>, AgentError> {
    Ok(agent
        .store()
        .volumes()?
        .iter()
        .filter(|v| app.is_none_or(|a| a == v.app))
        .map(|v| volume_view(agent, v))
        .collect())
}

/// One volume, with its file system's block counts.
pub fn get_volume(agent: &Agent, id: &str) -> Result<Volume, AgentError> {
    Ok(volume_view(agent, &agent.load_volume(id)?))
}

/// Changes a volume's settings (snapshot retention, automatic backups).
pub async fn update_volume(
    agent: &Agent,
    id: &str,
    req: UpdateVolumeRequest,
) -> Result<Volume, AgentError> {
    if let Some(r) = req.snapshot_retention {
        if !(1..=60).contains(&r) {
            return Err(AgentError::Invalid(format!(
                "snapshot_retention must be between 1 and 60 days, got {r}"
            )));
        }
    }
    let _ledger = agent.write_lock().await;
    let mut rec = agent.load_volume(id)?;
    if let Some(r) = req.snapshot_retention {
        rec.snapshot_retention = r;
    }
    if let Some(a) = req.auto_backup_enabled {
        rec.auto_backup_enabled = a;
    }
    rec.updated_at_ms = now_ms();
    let mut b = Batch::default();
    b.volume(&rec);
    agent.commit(b).await?;
    publish_volume(agent, &rec);
    Ok(volume_view(agent, &rec))
}

/// Grows a volume to `size_gb` (online for ext4). Shrinking is refused.
pub async fn extend_volume(agent: &Agent, id: &str, size_gb: u64) -> Result<Volume, AgentError> {
    validate_size_gb(size_gb).map_err(AgentError::Invalid)?;
    let rec = {
        let _ledger = agent.write_lock().await;
        let mut rec = agent.load_volume(id)?;
        if rec.state != VolumeState::Created {
            return Err(AgentError::Conflict(format!(
                "volume {id} is {}; try again when it is created",
                rec.state.as_str()
            )));
        }
        if size_gb <= rec.size_gb {
            return Err(AgentError::Invalid(format!(
                "volume {id} is {} GB; extend only grows it (asked for {size_gb} GB)",
                rec.size_gb
            )));
        }
        let free = agent.disk_gb().saturating_sub(agent.disk_used_gb());
        if size_gb - rec.size_gb > free {
            return Err(AgentError::Capacity(format!(
                "insufficient disk: {} GB more requested, {free} GB free",
                size_gb - rec.size_gb
            )));
        }
        let previous_gb = rec.size_gb;
        rec.size_gb = size_gb;
        rec.state = VolumeState::Extending;
        rec.updated_at_ms = now_ms();
        let mut b = Batch::default();
        b.volume(&rec);
        agent.commit(b).await?;
        publish_volume(agent, &rec);
        (rec, previous_gb)
    };
    let (rec, previous_gb) = rec;
    match finish_volume(agent, rec).await {
        Ok(rec) => Ok(volume_view(agent, &rec)),
        Err(err) => {
            // The file may have grown; the volume keeps the size its file system has.
            let _ledger = agent.write_lock().await;
            if let Some(mut rec) = agent.store().volume(id)? {
                rec.size_gb = previous_gb;
                rec.state = VolumeState::Created;
                rec.updated_at_ms = now_ms();
                let mut b = Batch::default();
                b.volume(&rec);
                agent.commit(b).await?;
                publish_volume(agent, &rec);
            }
            Err(match err {
                AgentError::Internal(m) => AgentError::Conflict(m),
                other => other,
            })
        }
    }
}

/// Deletes a volume and its storage. Refused (412) while a machine has it attached.
pub async fn delete_volume(agent: &Agent, id: &str) -> Result<Volume, AgentError> {
    let rec = {
        let _ledger = agent.write_lock().await;
        let mut rec = agent.load_volume(id)?;
        if let Some(m) = &rec.attached_machine_id {
            return Err(AgentError::Precondition(format!(
                "volume {id} is attached to machine {m}; destroy the machine first"
            )));
        }
        if rec.state == VolumeState::Creating || rec.state == VolumeState::Extending {
            return Err(AgentError::Conflict(format!(
                "volume {id} is {}; try again when it is created",
                rec.state.as_str()
            )));
        }
        rec.state = VolumeState::Destroying;
        rec.updated_at_ms = now_ms();
        let mut b = Batch::default();
        b.volume(&rec);
        agent.commit(b).await?;
        publish_volume(agent, &rec);
        rec
    };
    let mut view = volume_view(agent, &rec);
    finish_volume(agent, rec).await?;
    view.state = "destroyed".into();
    tracing::info!(volume.id = %id, "volume destroyed");
    Ok(view)
}

/// Checks that `rec` (a machine being created) may mount the volume its config names, and
/// adds the attachment to `batch` (the machine's create transaction). Call under the
/// ledger lock.
pub(crate) fn attach_volume(
    agent: &Agent,
    rec: &MachineRecord,
    batch: &mut Batch,
) -> Result<(), AgentError> {
    let Some(mount) = mount_of(&rec.config).map_err(AgentError::Invalid)? else {
        return Ok(());
    };
    let mut vol = agent.store()
        .volume(&mount.volume)?
        .filter(|v| v.app == rec.app)
        .ok_or_else(|| {
            AgentError::Precondition(format!(
                "volume {} of app {} is not on host {}; a machine can only mount a volume of its app on the volume's host",
                mount.volume, rec.app, agent.host_id()
            ))
        })?;
    match &vol.attached_machine_id {
        Some(m) if *m != rec.id => {
            return Err(AgentError::Precondition(format!(
                "volume {} is already attached to machine {m}",
                vol.id
            )))
        }
        _ => {}
    }
    if !matches!(vol.state, VolumeState::Created | VolumeState::Extending) {
        return Err(AgentError::Precondition(format!(
            "volume {} is {}",
            vol.id,
            vol.state.as_str()
        )));
    }
    vol.attached_machine_id = Some(rec.id.clone());
    vol.updated_at_ms = now_ms();
    batch.volume(&vol);
    Ok(())
}

/// Publishes the volume a just-created machine mounts (its attachment changed).
pub(crate) fn publish_attached_volume(agent: &Agent, rec: &MachineRecord) {
    if let Ok(Some(mount)) = mount_of(&rec.config) {
        if let Ok(Some(v)) = agent.store().volume(&mount.volume) {
            publish_volume(agent, &v);
        }
    }
}

/// Detaches every volume attached to a destroyed machine (idempotent; its own
/// transaction, done before the machine is recorded destroyed).
pub(crate) async fn detach_volumes(agent: &Agent, machine_id: &str) -> Result<(), AgentError> {
    let _ledger = agent.write_lock().await;
    let attached: Vec<VolumeRecord> = agent
        .store()
        .volumes()?
        .into_iter()
        .filter(|v| v.attached_machine_id.as_deref() == Some(machine_id))
        .map(|mut v| {
            v.attached_machine_id = None;
            v.updated_at_ms = now_ms();
            v
        })
        .collect();
    if attached.is_empty() {
        return Ok(());
    }
    let mut b = Batch::default();
    for v in &attached {
        b.volume(v);
    }
    agent.commit(b).await?;
    for v in &attached {
        publish_volume(agent, v);
    }
    Ok(())
}

/// Publishes a volume to the catalog.
pub(crate) fn publish_volume(agent: &Agent, v: &VolumeRecord) {
    if let Some(catalog) = agent.catalog() {
        catalog.publish_volume(bazaar_catalog::VolumeRecord {
            id: v.id.clone(),
            app: v.app.clone(),
            name: v.name.clone(),
            region: v.region.clone(),
            host_id: agent.host_id().to_string(),
            state: v.state.as_str().to_string(),
            size_gb: v.size_gb,
            attached_machine_id: v.attached_machine_id.clone(),
            fstype: v.fstype.clone(),
            encrypted: v.encrypted,
            snapshot_retention: v.snapshot_retention,
            auto_backup_enabled: v.auto_backup_enabled,
            created_at_ms: v.created_at_ms,
            updated_at_ms: v.updated_at_ms,
        });
    }
}

/// The API object of a volume.
pub fn volume_view(agent: &Agent, v: &VolumeRecord) -> Volume {
    let fs = agent.volume_fs();
    let nominal_blocks = v.size_gb * 1024 * 1024 * 1024 / BLOCK_SIZE;
    let (block_size, blocks, blocks_free, blocks_avail, bytes_used) =
        match (v.fstype.as_str(), fs.stats(&v.id)) {
            ("ext4", Ok(st)) if v.state != VolumeState::Creating => (
                st.block_size,
                st.blocks,
                st.blocks_free,
                st.blocks_avail,
                (st.blocks - st.blocks_free) * st.block_size,
            ),
            _ => {
                let used = fs.dir_bytes(&v.id);
                let used_blocks = used.div_ceil(BLOCK_SIZE).min(nominal_blocks);
                (
                    BLOCK_SIZE,
                    nominal_blocks,
                    nominal_blocks - used_blocks,
                    nominal_blocks - used_blocks,
                    used,
                )
            }
        };
    Volume {
        id: v.id.clone(),
        name: v.name.clone(),
        state: v.state.as_str().to_string(),
        size_gb: v.size_gb,
        region: v.region.clone(),
        zone: agent.host_id().to_string(),
        encrypted: v.encrypted,
        attached_machine_id: v.attached_machine_id.clone(),
        attached_alloc_id: v.attached_machine_id.clone(),
        created_at: bazaar_types::rfc3339(v.created_at_ms),
        host_status: "ok".into(),
        fstype: v.fstype.clone(),
        block_size,
        blocks,
        blocks_free,
        blocks_avail,
        bytes_total: v.size_gb * 1024 * 1024 * 1024,
        bytes_used,
        snapshot_retention: v.snapshot_retention,
        auto_backup_enabled: v.auto_backup_enabled,
        kind: "local".into(),
        host_id: agent.host_id().to_string(),
    }
}
