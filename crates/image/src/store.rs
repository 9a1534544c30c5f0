//! The content store under one root directory: blobs by digest, each layer unpacked once
//! into its own directory (tmp dir + rename, so a crash never leaves a half layer that looks
//! complete), and image records by reference. Pulls go through here.
//!
//! ```text
//! ROOT/blobs/sha256/<hex>      manifests, configs, layer tarballs
//! ROOT/layers/sha256/<hex>/    an unpacked layer, named by its blob digest
//! ROOT/images/<hex>.json       an image record, named by the sha256 of its reference
//! ROOT/tmp/                    work in progress; emptied on open
//! ```

use crate::config::{ImageConfig, Process};
use crate::digest::Digest;
use crate::error::{Error, IoContext, Result};
use crate::manifest::{Descriptor, Document, Manifest, Platform};
use crate::reference::Reference;
use crate::registry::{Auth, Registry};
use crate::rootfs::{self, RootfsKind};
use crate::unpack::{unpack_layer, Whiteouts};
use bazaar_types::config::InitConfig;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// How a store behaves.
#[derive(Debug, Clone, Default)]
pub struct StoreOptions {
    /// Registries (`host[:port]`) reached over plain HTTP, on any address (a private one
    /// too: [`crate::egress`]).
    pub insecure_registries: Vec<String>,
    /// Registries on loopback addresses may be pulled from (over plain HTTP): `bazaar dev`
    /// and tests. Otherwise a pull reaches public addresses only, and the insecure ones.
    pub allow_loopback_registries: bool,
    /// Never use overlayfs: every rootfs is a flattened copy.
    pub copy_rootfs: bool,
}

/// An image in the store: what its reference resolved to and what it is made of.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Image {
    /// The normalised reference it was pulled or imported as.
    pub reference: String,
    /// The digest the reference resolved to (an index's, for multi-arch images).
    pub digest: Digest,
    /// The platform manifest's digest.
    pub manifest_digest: Digest,
    /// The config blob's digest.
    pub config_digest: Digest,
    /// The parsed config.
    pub config: ImageConfig,
    /// Layers, bottom first.
    pub layers: Vec<Descriptor>,
}

impl Image {
    /// The process to run: the image's config merged with `init` and the machine's env
    /// (see [`crate::config::ContainerConfig::process`]).
    pub fn process(
        &self,
        init: Option<&InitConfig>,
        env: &BTreeMap<String, String>,
    ) -> Result<Process> {
        self.config
            .config
            .clone()
            .unwrap_or_default()
            .process(init, env)
            .ok_or_else(|| Error::NoCommand(self.reference.clone()))
    }
}

/// Where a layer of a pull stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullPhase {
    /// Already unpacked in the store; nothing to do.
    Cached,
    /// Bytes arriving (`done` of `total`).
    Downloading,
    /// Downloaded and verified; being unpacked.
    Unpacking,
    /// Unpacked and in the store.
    Ready,
}

/// One progress report of a pull, per layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullProgress {
    /// The layer's blob digest.
    pub layer: Digest,
    /// Its position, bottom first, and the number of layers.
    pub index: usize,
    pub count: usize,
    /// Compressed bytes done and in all.
    pub done: u64,
    pub total: u64,
    pub phase: PullPhase,
}

/// The callback pulls report progress to.
pub type ProgressFn<'a> = dyn Fn(PullProgress) + Send + Sync + 'a;

#[derive(Debug, Serialize, Deserialize)]
struct StoreMeta {
    whiteouts: Whiteouts,
}

#[derive(Debug)]
struct Inner {
    root: PathBuf,
    options: StoreOptions,
    whiteouts: Whiteouts,
    /// The client of pulls: it resolves and redirects only to what `egress` allows.
    http: reqwest::Client,
    egress: Arc<crate::egress::EgressPolicy>,
    /// Pulls, imports and rootfs creation hold it shared; garbage collection exclusively.
    gc_lock: tokio::sync::RwLock<()>,
}

/// The image store. Cheap to clone; all clones share one root.
#[derive(Debug, Clone)]
pub struct ImageStore {
    inner: Arc<Inner>,
}

/// A temp file removed when dropped (also when a pull is cancelled); a no-op once renamed.
struct TmpFile(PathBuf);

impl Drop for TmpFile {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// Writes `bytes` to `path` atomically (a temp file in `tmp`, then rename).
pub(crate) fn write_atomic(tmp: &Path, path: &Path, bytes: &[u8]) -> Result<()> {
    let t = tmp_name(tmp, "file");
    let mut f = fs::File::create(&t).at(&t)?;
    f.write_all(bytes).at(&t)?;
    f.sync_all().at(&t)?;
    fs::rename(&t, path).at(path)
}

/// A fresh name in `tmp`.
pub(crate) fn tmp_name(tmp: &Path, what: &str) -> PathBuf {
    let n = TMP_SEQ.fetch_add(1, Ordering::Relaxed);
    tmp.join(format!("{what}-{}-{n}", std::process::id()))
}

impl ImageStore {
    /// Opens (creating) the store at `root`. Layers hold overlayfs whiteouts when this host
    /// can mount overlayfs (root, and `overlay` in /proc/filesystems), marker files otherwise;
    /// the choice is kept in `ROOT/store.json` for the store's life.
    pub fn open(root: impl Into<PathBuf>, options: StoreOptions) -> Result<ImageStore> {
        let root = root.into();
        for d in ["blobs/sha256", "layers/sha256", "images", "tmp"] {
            fs::create_dir_all(root.join(d)).at(root.join(d))?;
        }
        let tmp = root.join("tmp");
        for e in fs::read_dir(&tmp).at(&tmp)? {
            let p = e.at(&tmp)?.path();
            let _ = fs::remove_dir_all(&p).or_else(|_| fs::remove_file(&p));
        }
        let meta_path = root.join("store.json");
        let whiteouts = match fs::read(&meta_path) {
            Ok(b) => {
                let meta: StoreMeta = serde_json::from_slice(&b)
                    .map_err(|e| Error::Manifest(format!("store metadata: {e}")))?;
                meta.whiteouts
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let whiteouts = if rootfs::overlay_available() {
                    Whiteouts::Overlay
                } else {
                    Whiteouts::Markers
                };
                let bytes = serde_json::to_vec(&StoreMeta { whiteouts }).expect("serializable");
                write_atomic(&tmp, &meta_path, &bytes)?;
                whiteouts
            }
            Err(e) => return Err(e).at(meta_path),
        };
        let egress = Arc::new(crate::egress::EgressPolicy {
            allowed: options.insecure_registries.clone(),
            allow_loopback: options.allow_loopback_registries,
        });
        Ok(ImageStore {
            inner: Arc::new(Inner {
                root,
                options,
                whiteouts,
                http: crate::registry::pull_client(egress.clone())?,
                egress,
                gc_lock: tokio::sync::RwLock::new(()),
            }),
        })
    }

    /// The store's root directory.
    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    pub(crate) fn tmp_dir(&self) -> PathBuf {
        self.inner.root.join("tmp")
    }

    pub(crate) fn gc_lock(&self) -> &tokio::sync::RwLock<()> {
        &self.inner.gc_lock
    }

    /// Where a blob lives.
    pub fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.inner.root.join("blobs/sha256").join(digest.hex())
    }

    /// Where a layer is unpacked (it exists only once complete).
    pub fn layer_dir(&self, digest: &Digest) -> PathBuf {
        self.inner.root.join("layers/sha256").join(digest.hex())
    }

    fn record_path(&self, reference: &str) -> PathBuf {
        let key = Digest::of(reference.as_bytes());
        self.inner
            .root
            .join("images")
            .join(format!("{}.json", key.hex()))
    }

    /// A registry client for `host`, over plain HTTP if it is configured insecure, or on
    /// loopback while loopback registries are allowed. Its requests reach only the
    /// addresses the store's [`crate::egress::EgressPolicy`] allows.
    pub fn registry(&self, host: &str, auth: Auth) -> Result<Registry> {
        let options = &self.inner.options;
        let plain = (options.allow_loopback_registries && crate::reference::is_loopback_host(host))
            || options.insecure_registries.iter().any(|h| h == host);
        let registry = Registry::with_client(self.inner.http.clone(), host, auth, plain)?
            .with_egress(self.inner.egress.clone())?;
        Ok(registry)
    }

    /// Stores `bytes` as a blob (no-op if present); returns its digest.
    pub(crate) fn put_blob(&self, bytes: &[u8]) -> Result<Digest> {
        let digest = Digest::of(bytes);
        let path = self.blob_path(&digest);
        if !path.exists() {
            write_atomic(&self.tmp_dir(), &path, bytes)?;
        }
        Ok(digest)
    }

    /// The image record for `reference`, if pulled or imported.
    pub fn image(&self, reference: &Reference) -> Result<Option<Image>> {
        let path = self.record_path(&reference.to_string());
        match fs::read(&path) {
            Ok(b) => Ok(Some(parse_record(&path, &b)?)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).at(path),
        }
    }

    /// Every image record.
    pub fn images(&self) -> Result<Vec<Image>> {
        let dir = self.inner.root.join("images");
        let mut out = Vec::new();
        for e in fs::read_dir(&dir).at(&dir)? {
            let path = e.at(&dir)?.path();
            if path.extension().is_some_and(|x| x == "json") {
                out.push(parse_record(&path, &fs::read(&path).at(&path)?)?);
            }
        }
        out.sort_by(|a, b| a.reference.cmp(&b.reference));
        Ok(out)
    }

    /// Forgets an image record (its content goes at the next [`ImageStore::gc`]).
    pub fn remove_image(&self, reference: &Reference) -> Result<bool> {
        let path = self.record_path(&reference.to_string());
        match fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e).at(path),
        }
    }

    pub(crate) fn save_record(&self, image: &Image) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(image).expect("serializable");
        write_atomic(&self.tmp_dir(), &self.record_path(&image.reference), &bytes)
    }

    /// Pulls `reference` (resolving a multi-arch index to this platform), downloads and
    /// verifies what the store lacks, unpacks each new layer once, and records the image.
    pub async fn pull(
        &self,
        reference: &Reference,
        auth: &Auth,
        progress: &ProgressFn<'_>,
    ) -> Result<Image> {
        let _shared = self.inner.gc_lock.read().await;
        let registry = self.registry(&reference.registry, auth.clone())?;
        let repo = &reference.repository;
        let (bytes, content_type) = registry.manifest(repo, &reference.target()).await?;
        if let Some(d) = &reference.digest {
            d.verify("manifest", &bytes)?;
        }
        let digest = Digest::of(&bytes);
        let (manifest_bytes, manifest) = match Document::parse(content_type.as_deref(), &bytes)? {
            Document::Manifest(m) => (bytes, m),
            Document::Index(index) => {
                let platform = Platform::current();
                let entry = index.select(&platform).ok_or_else(|| Error::NoPlatform {
                    reference: reference.to_string(),
                    platform: platform.to_string(),
                    available: index.platforms(),
                })?;
                let (b, ct) = registry.manifest(repo, entry.digest.as_str()).await?;
                entry.digest.verify("manifest", &b)?;
                self.put_blob(&bytes)?;
                match Document::parse(ct.as_deref(), &b)? {
                    Document::Manifest(m) => (b, m),
                    Document::Index(_) => {
                        return Err(Error::Manifest(format!(
                            "{reference}: index entry {} is another index",
                            entry.digest
                        )))
                    }
                }
            }
        };
        let config_bytes = registry.blob_bytes(repo, &manifest.config.digest).await?;
        let image = self
            .store_image(
                reference.to_string(),
                digest,
                &manifest_bytes,
                manifest,
                &config_bytes,
                Some((&registry, repo)),
                progress,
            )
            .await?;
        tracing::info!(image = %image.reference, digest = %image.digest, "pulled");
        Ok(image)
    }

    /// Keeps the manifest and config, makes sure every layer is unpacked (fetching from
    /// `source` what is missing), and writes the record.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn store_image(
        &self,
        reference: String,
        digest: Digest,
        manifest_bytes: &[u8],
        manifest: Manifest,
        config_bytes: &[u8],
        source: Option<(&Registry, &str)>,
        progress: &ProgressFn<'_>,
    ) -> Result<Image> {
        let config: ImageConfig = serde_json::from_slice(config_bytes).map_err(|e| {
            let e = crate::manifest::json_error(&e);
            Error::Manifest(format!("{reference}: bad config: {e}"))
        })?;
        if let Some(l) = manifest.layers.iter().find(|l| !l.urls.is_empty()) {
            return Err(Error::Manifest(format!(
                "{reference}: foreign layer {} is not supported",
                l.digest
            )));
        }
        let manifest_digest = self.put_blob(manifest_bytes)?;
        let config_digest = self.put_blob(config_bytes)?;
        let diff_ids = &config.rootfs.diff_ids;
        let count = manifest.layers.len();
        let jobs = manifest.layers.iter().enumerate().map(|(index, layer)| {
            let diff_id = (diff_ids.len() == count).then(|| diff_ids[index].clone());
            self.ensure_layer(source, layer, diff_id, index, count, progress)
        });
        // Every layer finishes (or fails) before an error is returned: nothing is left
        // half-done in the background.
        for result in futures_util::future::join_all(jobs).await {
            result?;
        }
        let image = Image {
            reference,
            digest,
            manifest_digest,
            config_digest,
            config,
            layers: manifest.layers,
        };
        self.save_record(&image)?;
        Ok(image)
    }

    async fn ensure_layer(
        &self,
        source: Option<(&Registry, &str)>,
        layer: &Descriptor,
        diff_id: Option<Digest>,
        index: usize,
        count: usize,
        progress: &ProgressFn<'_>,
    ) -> Result<()> {
        let report = |done, phase| {
            progress(PullProgress {
                layer: layer.digest.clone(),
                index,
                count,
                done,
                total: layer.size,
                phase,
            })
        };
        let dir = self.layer_dir(&layer.digest);
        if dir.exists() {
            report(layer.size, PullPhase::Cached);
            return Ok(());
        }
        let blob = self.blob_path(&layer.digest);
        if !blob.exists() {
            let Some((registry, repo)) = source else {
                return Err(Error::NotFound(format!("layer blob {}", layer.digest)));
            };
            let tmp = TmpFile(tmp_name(&self.tmp_dir(), "blob"));
            registry
                .blob_to_file(repo, &layer.digest, layer.size, &tmp.0, &mut |done| {
                    report(done, PullPhase::Downloading)
                })
                .await?;
            fs::rename(&tmp.0, &blob).at(&blob)?;
        }
        report(layer.size, PullPhase::Unpacking);
        let (digest, tmp, whiteouts) = (
            layer.digest.clone(),
            tmp_name(&self.tmp_dir(), "layer"),
            self.inner.whiteouts,
        );
        tokio::task::spawn_blocking(move || {
            fs::create_dir(&tmp).at(&tmp)?;
            let done = unpack_layer(&blob, digest.as_str(), diff_id.as_ref(), &tmp, whiteouts)
                .and_then(|()| fs::rename(&tmp, &dir).at(&dir));
            if done.is_err() {
                let _ = fs::remove_dir_all(&tmp);
                // Another pull of the same layer won the race: theirs is as good.
                if dir.exists() {
                    return Ok(());
                }
            }
            done
        })
        .await
        .expect("unpack task panicked")?;
        report(layer.size, PullPhase::Ready);
        Ok(())
    }

    /// Makes `machine_dir/rootfs` the image's root filesystem: an overlay mount of its layers
    /// with `upper`/`work` in `machine_dir` where possible, else a flattened copy. Idempotent:
    /// an existing rootfs is kept (and an overlay remounted after a reboot).
    pub async fn rootfs(&self, image: &Image, machine_dir: &Path) -> Result<PathBuf> {
        self.rootfs_mapped(image, machine_dir, None, None).await
    }

    /// [`ImageStore::rootfs`] for a machine in a user namespace: its files are owned by the
    /// host ids `ids` maps the image's to (the shared layers through idmapped mounts).
    /// `userns` is a user namespace with exactly that mapping (bound at this path, e.g. the
    /// machine's own) to idmap the layers through; without one, one is made for the mounts.
    pub async fn rootfs_mapped(
        &self,
        image: &Image,
        machine_dir: &Path,
        ids: Option<crate::IdMap>,
        userns: Option<PathBuf>,
    ) -> Result<PathBuf> {
        let _shared = self.inner.gc_lock.read().await;
        // An existing rootfs keeps the layers it was made of, even if the tag moved since.
        let digests: Vec<Digest> = match rootfs::read_record(machine_dir)? {
            Some(record) => record.layers,
            None => image.layers.iter().map(|l| l.digest.clone()).collect(),
        };
        let layers: Vec<(Digest, PathBuf)> = digests
            .into_iter()
            .map(|d| {
                let dir = self.layer_dir(&d);
                (d, dir)
            })
            .collect();
        if let Some((d, _)) = layers.iter().find(|(_, p)| !p.is_dir()) {
            return Err(Error::NotFound(format!(
                "layer {d} of {} (pull the image again)",
                image.reference
            )));
        }
        let overlay = self.inner.whiteouts == Whiteouts::Overlay && !self.inner.options.copy_rootfs;
        let (reference, machine_dir) = (image.reference.clone(), machine_dir.to_path_buf());
        tokio::task::spawn_blocking(move || {
            rootfs::create(
                &reference,
                &layers,
                &machine_dir,
                overlay,
                ids,
                userns.as_deref(),
            )
        })
        .await
        .expect("rootfs task panicked")
    }

    /// Unmounts and deletes a machine's rootfs (and its writable layer).
    pub async fn remove_rootfs(&self, machine_dir: &Path) -> Result<()> {
        let dir = machine_dir.to_path_buf();
        tokio::task::spawn_blocking(move || rootfs::remove(&dir))
            .await
            .expect("rootfs task panicked")
    }

    /// How a machine's rootfs was made, if it has one.
    pub fn rootfs_kind(&self, machine_dir: &Path) -> Result<Option<RootfsKind>> {
        Ok(rootfs::read_record(machine_dir)?.map(|r| r.kind))
    }
}

fn parse_record(path: &Path, bytes: &[u8]) -> Result<Image> {
    serde_json::from_slice(bytes)
        .map_err(|e| Error::Manifest(format!("record {}: {e}", path.display())))
}
