//! `import_archive`: loads a `docker save` tarball (`manifest.json` + layer tars) or an OCI
//! image layout (`index.json`, `blobs/`), as a directory or a tar, into the store — for hosts
//! without registry access.

use crate::digest::Digest;
use crate::error::{Error, IoContext, Result};
use crate::manifest::{
    Descriptor, Document, Index, Manifest, Platform, DOCKER_CONFIG, DOCKER_LAYER_GZIP,
    DOCKER_LAYER_TAR, DOCKER_MANIFEST,
};
use crate::reference::Reference;
use crate::store::{tmp_name, Image, ImageStore};
use crate::unpack::{unpack_layer, Whiteouts};
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// One image found in an archive, its blobs already in the store.
struct Found {
    names: Vec<String>,
    digest: Digest,
    manifest_bytes: Vec<u8>,
    manifest: Manifest,
    config_bytes: Vec<u8>,
}

/// An entry of a `docker save` `manifest.json`.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SaveEntry {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    layers: Vec<String>,
}

/// An image of an archive: its names, manifest and config; its layers' blobs are in the
/// store, not unpacked ([`ImageStore::read_archive`]).
#[derive(Debug, Clone)]
pub struct ArchiveImage {
    pub names: Vec<String>,
    pub manifest_bytes: Vec<u8>,
    pub manifest: Manifest,
    pub config_bytes: Vec<u8>,
}

impl ImageStore {
    /// The images of the archive at `path` with their layers' blobs put in the store, not
    /// unpacked and not recorded: what `bazaar image push` sends on to a registry.
    pub async fn read_archive(&self, path: &Path) -> Result<Vec<ArchiveImage>> {
        let _shared = self.gc_lock().read().await;
        let store = self.clone();
        let archive = path.to_path_buf();
        let found = tokio::task::spawn_blocking(move || store.scan_archive(&archive))
            .await
            .expect("import task panicked")?;
        Ok(found
            .into_iter()
            .map(|f| ArchiveImage {
                names: f.names,
                manifest_bytes: f.manifest_bytes,
                manifest: f.manifest,
                config_bytes: f.config_bytes,
            })
            .collect())
    }

    /// Imports every image of the archive at `path` and returns their records. Names come
    /// from `RepoTags` (docker save) or the `io.containerd.image.name` /
    /// `org.opencontainers.image.ref.name` annotations (OCI); a bare tag or no name at all
    /// is recorded under `localhost/<archive file stem>`.
    pub async fn import_archive(&self, path: &Path) -> Result<Vec<Image>> {
        let _shared = self.gc_lock().read().await;
        let store = self.clone();
        let archive = path.to_path_buf();
        let found = tokio::task::spawn_blocking(move || store.scan_archive(&archive))
            .await
            .expect("import task panicked")?;
        let mut images = Vec::new();
        for f in found {
            for name in &f.names {
                let reference: Reference = name.parse()?;
                let image = self
                    .store_image(
                        reference.to_string(),
                        f.digest.clone(),
                        &f.manifest_bytes,
                        f.manifest.clone(),
                        &f.config_bytes,
                        None,
                        &|_| {},
                    )
                    .await?;
                images.push(image);
            }
        }
        Ok(images)
    }

    fn scan_archive(&self, path: &Path) -> Result<Vec<Found>> {
        let default_repo = {
            let stem = path
                .file_stem()
                .map(|s| s.to_string_lossy().to_lowercase())
                .unwrap_or_default();
            let clean: String = stem
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
                .collect();
            let clean = clean.trim_matches('-');
            format!(
                "localhost/{}",
                if clean.is_empty() { "import" } else { clean }
            )
        };
        if path.is_dir() {
            return self.scan_dir(path, path, &default_repo);
        }
        let tmp = tmp_name(&self.tmp_dir(), "import");
        fs::create_dir(&tmp).at(&tmp)?;
        let label = format!("archive {}", path.display());
        let found = unpack_layer(path, &label, None, &tmp, Whiteouts::Markers)
            .and_then(|()| self.scan_dir(path, &tmp, &default_repo));
        let _ = fs::remove_dir_all(&tmp);
        found
    }

    fn scan_dir(&self, archive: &Path, dir: &Path, default_repo: &str) -> Result<Vec<Found>> {
        let bad = |reason: String| Error::Archive {
            path: archive.to_path_buf(),
            reason,
        };
        let root = dir.canonicalize().at(dir)?;
        // Files are named by the archive; resolve them without leaving it.
        let inside = |name: &str| -> Result<PathBuf> {
            let p = root
                .join(name.trim_start_matches('/'))
                .canonicalize()
                .map_err(|e| bad(format!("{name}: {e}")))?;
            if !p.starts_with(&root) || !p.is_file() {
                return Err(bad(format!("{name} is not a file inside the archive")));
            }
            Ok(p)
        };
        if root.join("manifest.json").is_file() {
            let entries: Vec<SaveEntry> = parse_json(
                archive,
                "manifest.json",
                &fs::read(inside("manifest.json")?).at(dir)?,
            )?;
            let mut found = Vec::new();
            for entry in entries {
                let config_path = inside(&entry.config)?;
                let config_bytes = fs::read(&config_path).at(&config_path)?;
                let mut layers = Vec::new();
                for l in &entry.layers {
                    let (digest, size, gzip) = self.import_blob(&inside(l)?, None)?;
                    layers.push(descriptor(
                        if gzip {
                            DOCKER_LAYER_GZIP
                        } else {
                            DOCKER_LAYER_TAR
                        },
                        digest,
                        size,
                    ));
                }
                let manifest = Manifest {
                    schema_version: 2,
                    media_type: Some(DOCKER_MANIFEST.into()),
                    config: descriptor(
                        DOCKER_CONFIG,
                        Digest::of(&config_bytes),
                        config_bytes.len() as u64,
                    ),
                    layers,
                };
                let manifest_bytes = serde_json::to_vec(&manifest).expect("serializable");
                let digest = Digest::of(&manifest_bytes);
                let names = match entry.repo_tags {
                    Some(tags) if !tags.is_empty() => tags,
                    _ => vec![format!("{default_repo}@{digest}")],
                };
                found.push(Found {
                    names,
                    digest,
                    manifest_bytes,
                    manifest,
                    config_bytes,
                });
            }
            return Ok(found);
        }
        if !root.join("index.json").is_file() {
            return Err(bad(
                "neither manifest.json (docker save) nor index.json (OCI layout)".into(),
            ));
        }
        let blob = |d: &Digest| -> Result<Vec<u8>> {
            let path = inside(&format!("blobs/sha256/{}", d.hex()))?;
            let bytes = fs::read(&path).at(&path)?;
            d.verify("blob", &bytes)?;
            Ok(bytes)
        };
        let index: Index = parse_json(
            archive,
            "index.json",
            &fs::read(inside("index.json")?).at(dir)?,
        )?;
        let mut found = Vec::new();
        for desc in &index.manifests {
            let top = blob(&desc.digest)?;
            let manifest_bytes = match Document::parse(Some(&desc.media_type), &top)? {
                Document::Manifest(_) => top,
                Document::Index(inner) => {
                    let platform = Platform::current();
                    let entry = inner.select(&platform).ok_or_else(|| Error::NoPlatform {
                        reference: archive.display().to_string(),
                        platform: platform.to_string(),
                        available: inner.platforms(),
                    })?;
                    self.put_blob(&top)?;
                    blob(&entry.digest)?
                }
            };
            let Document::Manifest(manifest) = Document::parse(None, &manifest_bytes)? else {
                return Err(bad(format!("{}: nested index", desc.digest)));
            };
            let config_bytes = blob(&manifest.config.digest)?;
            for l in &manifest.layers {
                let path = inside(&format!("blobs/sha256/{}", l.digest.hex()))?;
                self.import_blob(&path, Some(&l.digest))?;
            }
            let annotation = |k: &str| desc.annotations.get(k).cloned();
            let name = match annotation("io.containerd.image.name")
                .or_else(|| annotation("org.opencontainers.image.ref.name"))
            {
                Some(n) if n.contains('/') || n.contains('@') => n,
                Some(tag) => format!("{default_repo}:{tag}"),
                None => format!("{default_repo}@{}", desc.digest),
            };
            found.push(Found {
                names: vec![name],
                digest: desc.digest.clone(),
                manifest_bytes,
                manifest,
                config_bytes,
            });
        }
        if found.is_empty() {
            return Err(bad("index.json lists no images".into()));
        }
        Ok(found)
    }

    /// Copies a file into the blob store, hashing it on the way (and checking it against
    /// `expected`); returns its digest, size and whether it is gzip.
    fn import_blob(&self, src: &Path, expected: Option<&Digest>) -> Result<(Digest, u64, bool)> {
        let tmp = tmp_name(&self.tmp_dir(), "blob");
        let mut input = fs::File::open(src).at(src)?;
        let mut out = fs::File::create(&tmp).at(&tmp)?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 16];
        let (mut size, mut head) = (0u64, [0u8; 2]);
        loop {
            let n = match input.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e).at(src),
            };
            if size == 0 && n >= 2 {
                head.copy_from_slice(&buf[..2]);
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n]).at(&tmp)?;
            size += n as u64;
        }
        out.sync_all().at(&tmp)?;
        let digest = Digest::from_hasher(hasher);
        if let Some(e) = expected {
            if e != &digest {
                let _ = fs::remove_file(&tmp);
                return Err(Error::DigestMismatch {
                    what: "archive blob",
                    expected: e.clone(),
                    actual: digest,
                });
            }
        }
        let dest = self.blob_path(&digest);
        fs::rename(&tmp, &dest).at(&dest)?;
        Ok((digest, size, head == [0x1f, 0x8b]))
    }
}

fn parse_json<T: serde::de::DeserializeOwned>(
    archive: &Path,
    what: &str,
    bytes: &[u8],
) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| Error::Archive {
        path: archive.to_path_buf(),
        reason: format!("{what}: {e}"),
    })
}

fn descriptor(media_type: &str, digest: Digest, size: u64) -> Descriptor {
    Descriptor {
        media_type: media_type.into(),
        digest,
        size,
        platform: None,
        annotations: BTreeMap::new(),
        urls: vec![],
    }
}
