//! An image machine's writable layer: where its rootfs's writes go (the overlay's `upper`
//! and `work` dirs, or the flattened copy where overlayfs is missing), in
//! `machines/<id>/layer`. On an agent that limits machines' disks that directory is the
//! machine's own ext4 disk ([`crate::work_disk::ensure_layer`], the size rules of a process
//! machine's work disk), made at its first start and kept, mounted, until it is destroyed
//! (or the agent restarts: a layer disk that is not mounted is made afresh).
//! Every start begins from the image as it is (what a run wrote to its root file system is
//! gone at the next start: volumes are for data that must stay), so the layer is emptied
//! at each start.

use crate::launch_error::{LaunchError, LaunchStep};
use crate::oci::{unexpose_rootfs, OciRuntime};
use bazaar_types::failure::FailureKind;
use std::path::{Path, PathBuf};

impl OciRuntime {
    /// Empties (and makes, and mounts: `disk_mb` is its size, `None` for no limit) machine
    /// `id`'s writable layer for a new run, its previous rootfs unmounted at both places.
    /// Returns the layer directory, the machine directory to make its rootfs in.
    pub async fn fresh_layer(
        &self,
        id: &str,
        machine_dir: &Path,
        disk_mb: Option<u64>,
    ) -> Result<PathBuf, LaunchError> {
        const STEP: LaunchStep = LaunchStep::Layer;
        unexpose_rootfs(&self.exposed_rootfs(id)).map_err(|f| LaunchError::fault(STEP, f))?;
        let removing = |e: bazaar_image::Error| {
            LaunchError::image(STEP, "removing the previous root filesystem", &e)
        };
        // A rootfs made before layers had a directory of their own sits in the machine's.
        if machine_dir.join("rootfs.json").exists() {
            self.images
                .remove_rootfs(machine_dir)
                .await
                .map_err(removing)?;
        }
        let layer = crate::work_disk::layer_dir(machine_dir);
        // The previous run's (on its mounted disk; one not mounted is made afresh).
        self.images.remove_rootfs(&layer).await.map_err(removing)?;
        let Some(mb) = disk_mb else {
            std::fs::create_dir_all(&layer).map_err(|e| {
                LaunchError::io(STEP, format_args!("creating {}", layer.display()), &e)
            })?;
            return Ok(layer);
        };
        let (dir, templates) = (machine_dir.to_path_buf(), self.disk_templates.clone());
        let limited = tokio::task::spawn_blocking(move || {
            crate::work_disk::ensure_layer(&dir, &templates, mb)
        })
        .await
        .map_err(|e| LaunchError::new(STEP, FailureKind::Io, e.to_string()))?
        .map_err(|e| {
            LaunchError::io(STEP, format_args!("making the machine's {mb} MB disk"), &e)
        })?;
        if !limited {
            tracing::warn!(
                machine.id = id,
                "the writable layer holds files: no disk limit"
            );
        }
        Ok(layer)
    }
}
