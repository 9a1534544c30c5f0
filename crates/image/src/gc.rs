//! Garbage collection: deletes blobs and unpacked layers that no image record references,
//! no repository of the host's registry links ([`crate::repos`]) and no live machine rootfs
//! uses.

use crate::digest::Digest;
use crate::error::{IoContext, Result};
use crate::rootfs::read_record;
use crate::store::{tmp_name, ImageStore};
use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

/// What a collection freed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Blobs deleted.
    pub blobs: Vec<Digest>,
    /// Unpacked layers deleted.
    pub layers: Vec<Digest>,
    /// Bytes freed (file sizes).
    pub bytes: u64,
}

fn du(path: &Path) -> u64 {
    let Ok(m) = fs::symlink_metadata(path) else {
        return 0;
    };
    if !m.is_dir() {
        return m.len();
    }
    m.len()
        + fs::read_dir(path)
            .map(|rd| rd.flatten().map(|e| du(&e.path())).sum())
            .unwrap_or(0)
}

/// Digests named by the entries of `dir` (files or dirs named by their hex).
fn listed(dir: &Path) -> Result<Vec<Digest>> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).at(dir)? {
        let name = e.at(dir)?.file_name();
        if let Ok(d) = format!("sha256:{}", name.to_string_lossy()).parse() {
            out.push(d);
        }
    }
    Ok(out)
}

impl ImageStore {
    /// Deletes what no image record references, keeping the layers of the rootfs in
    /// `live_machine_dirs` (machine directories given to [`ImageStore::rootfs`]). Waits for
    /// running pulls; pulls wait for it.
    pub async fn gc(&self, live_machine_dirs: &[PathBuf]) -> Result<GcReport> {
        let _exclusive = self.gc_lock().write().await;
        let store = self.clone();
        let live = live_machine_dirs.to_vec();
        tokio::task::spawn_blocking(move || store.collect(&live))
            .await
            .expect("gc task panicked")
    }

    fn collect(&self, live: &[PathBuf]) -> Result<GcReport> {
        let mut keep_blobs = HashSet::new();
        let mut keep_layers = HashSet::new();
        for image in self.images()? {
            keep_blobs.extend([image.digest, image.manifest_digest, image.config_digest]);
            for l in image.layers {
                keep_blobs.insert(l.digest.clone());
                keep_layers.insert(l.digest);
            }
        }
        // What the registry's repositories hold stays until they let it go.
        keep_blobs.extend(self.repos().linked()?);
        for dir in live {
            if let Some(record) = read_record(dir)? {
                keep_layers.extend(record.layers);
            }
        }
        let mut report = GcReport::default();
        for d in listed(&self.root().join("blobs/sha256"))? {
            if !keep_blobs.contains(&d) {
                let path = self.blob_path(&d);
                report.bytes += du(&path);
                fs::remove_file(&path).at(&path)?;
                report.blobs.push(d);
            }
        }
        for d in listed(&self.root().join("layers/sha256"))? {
            if !keep_layers.contains(&d) {
                let path = self.layer_dir(&d);
                report.bytes += du(&path);
                // Out of sight first, so a crash mid-delete leaves no partial layer behind.
                let doomed = tmp_name(&self.tmp_dir(), "gc");
                fs::rename(&path, &doomed).at(&path)?;
                fs::remove_dir_all(&doomed).at(&doomed)?;
                report.layers.push(d);
            }
        }
        tracing::info!(
            blobs = report.blobs.len(),
            layers = report.layers.len(),
            bytes = report.bytes,
            "image gc"
        );
        Ok(report)
    }
}
