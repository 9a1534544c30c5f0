//! The repositories of the registry a host serves (`bazaar-registry`), kept in the content
//! store beside pulled images: blobs stay in `ROOT/blobs` (one copy however many
//! repositories hold them); a repository only links the blobs and manifests pushed to it
//! and maps its tags to manifest digests, so one repository never serves another's content.
//!
//! ```text
//! ROOT/repos/<name>/_blobs/<hex>       a blob (layer, config) pushed to <name>
//! ROOT/repos/<name>/_manifests/<hex>   a manifest pushed to <name>; holds its media type
//! ROOT/repos/<name>/_tags/<tag>        the digest <tag> names
//! ROOT/uploads/<id>                    a chunked upload in progress: its bytes so far
//! ROOT/uploads/<id>.repo               the repository it is for
//! ```
//!
//! Uploads in progress outlive the agent ([`RepoStore::resumable_uploads`]): a client whose
//! upload was cut by a restart asks where it stands and goes on from there.
//!
//! A repository name's components start with a letter or digit ([`valid_repository`]), so
//! `_blobs` and friends never collide with a nested repository. Every file is written by
//! rename, so a crash leaves a link whole or absent; a blob enters the store only once its
//! content hashed to the digest it was pushed as ([`RepoStore::adopt_upload`]).

use crate::digest::Digest;
use crate::error::{Error, IoContext, Result};
use crate::manifest::Document;
use crate::store::{tmp_name, write_atomic, ImageStore};
use sha2::{Digest as _, Sha256};
use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// Whether `name` is a repository name: lowercase components of letters, digits and
/// `. _ -`, each starting and ending with a letter or digit, joined by `/`.
pub fn valid_repository(name: &str) -> bool {
    name.len() <= 255 && crate::reference::valid_repository(name)
}

/// A manifest as a repository serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredManifest {
    pub digest: Digest,
    pub media_type: String,
    pub bytes: Vec<u8>,
}

/// Why a manifest was refused.
#[derive(Debug, thiserror::Error)]
pub enum ManifestRefused {
    /// Not a manifest or index the store understands.
    #[error("{0}")]
    Invalid(String),
    /// It names a blob (or, for an index, a manifest) the repository does not hold.
    #[error("{0} is not in this repository")]
    BlobUnknown(Digest),
    /// Its content does not have the digest it was pushed under.
    #[error("the manifest's digest is {actual}, not {expected}")]
    DigestMismatch { expected: Digest, actual: Digest },
    #[error(transparent)]
    Store(#[from] Error),
}

/// Why an upload was not adopted.
#[derive(Debug, thiserror::Error)]
pub enum UploadRefused {
    #[error("the content's digest is {actual}, not {expected}")]
    DigestMismatch { expected: Digest, actual: Digest },
    #[error(transparent)]
    Store(#[from] Error),
}

/// The repositories of one store. Cheap to clone.
#[derive(Debug, Clone)]
pub struct RepoStore {
    store: ImageStore,
}

impl ImageStore {
    /// The registry's repositories in this store.
    pub fn repos(&self) -> RepoStore {
        RepoStore {
            store: self.clone(),
        }
    }
}

fn exists(path: &Path) -> Result<bool> {
    match fs::symlink_metadata(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e).at(path),
    }
}

impl RepoStore {
    fn dir(&self, name: &str) -> PathBuf {
        debug_assert!(valid_repository(name), "unchecked repository name {name:?}");
        self.store.root().join("repos").join(name)
    }

    fn blob_link(&self, name: &str, digest: &Digest) -> PathBuf {
        self.dir(name).join("_blobs").join(digest.hex())
    }

    fn manifest_link(&self, name: &str, digest: &Digest) -> PathBuf {
        self.dir(name).join("_manifests").join(digest.hex())
    }

    fn tag_path(&self, name: &str, tag: &str) -> PathBuf {
        self.dir(name).join("_tags").join(tag)
    }

    fn link(&self, path: &Path, content: &[u8]) -> Result<()> {
        let parent = path.parent().expect("links have a parent");
        fs::create_dir_all(parent).at(parent)?;
        write_atomic(&self.store.tmp_dir(), path, content)
    }

    /// A fresh path in the store's temporary directory for an upload's bytes (same file
    /// system as the blobs, so adopting it is a rename). Emptied when the store opens.
    pub fn upload_path(&self, id: &str) -> PathBuf {
        tmp_name(&self.store.tmp_dir(), &format!("upload-{id}"))
    }

    fn upload_dir(&self) -> PathBuf {
        self.store.root().join("uploads")
    }

    /// Begins a chunked upload `id` (a fresh id of the registry's) for repository `name`:
    /// an empty file for its bytes, and beside it the repository's name, so that the
    /// upload can be taken up again after a restart. Answers the bytes' file.
    pub fn open_upload(&self, id: &str, name: &str) -> Result<PathBuf> {
        let dir = self.upload_dir();
        fs::create_dir_all(&dir).at(&dir)?;
        let data = dir.join(id);
        fs::File::create(&data).at(&data)?;
        write_atomic(
            &self.store.tmp_dir(),
            &dir.join(format!("{id}.repo")),
            name.as_bytes(),
        )?;
        Ok(data)
    }

    /// Ends upload `id`: its bytes (unless adopted already) and its record go.
    pub fn close_upload(&self, id: &str) {
        let dir = self.upload_dir();
        let _ = fs::remove_file(dir.join(id));
        let _ = fs::remove_file(dir.join(format!("{id}.repo")));
    }

    /// The uploads left in progress (by an agent that stopped): id, repository, the file
    /// of their bytes and its length. Bytes without a record (a start cut short) and
    /// records without bytes are removed.
    pub fn resumable_uploads(&self) -> Result<Vec<(String, String, PathBuf, u64)>> {
        let dir = self.upload_dir();
        let entries = match fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).at(dir),
        };
        let mut out = Vec::new();
        for e in entries {
            let path = e.at(&dir)?.path();
            let file_name = path.file_name().unwrap_or_default().to_string_lossy();
            let (id, is_record) = match file_name.strip_suffix(".repo") {
                Some(id) => (id.to_string(), true),
                None => (file_name.to_string(), false),
            };
            let data = dir.join(&id);
            let record = dir.join(format!("{id}.repo"));
            let name = read_opt(&record)?.map(|b| String::from_utf8_lossy(&b).into_owned());
            match (is_record, name, fs::metadata(&data)) {
                (true, Some(name), Ok(meta)) if valid_repository(&name) => {
                    out.push((id, name, data, meta.len()));
                }
                (false, Some(_), Ok(_)) => {}
                _ => self.close_upload(&id),
            }
        }
        Ok(out)
    }

    /// Whether repository `name` holds blob `digest`: its size if so.
    pub fn blob_size(&self, name: &str, digest: &Digest) -> Result<Option<u64>> {
        if !exists(&self.blob_link(name, digest))? && !exists(&self.manifest_link(name, digest))? {
            return Ok(None);
        }
        let blob = self.store.blob_path(digest);
        match fs::metadata(&blob) {
            Ok(m) => Ok(Some(m.len())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).at(blob),
        }
    }

    /// The file of blob `digest` if repository `name` holds it.
    pub fn blob_file(&self, name: &str, digest: &Digest) -> Result<Option<PathBuf>> {
        Ok(self
            .blob_size(name, digest)?
            .map(|_| self.store.blob_path(digest)))
    }

    /// Links blob `digest` into repository `name` if the store already has it (a blob
    /// another repository pushed, or a layer a pull brought): `false` if it has not.
    pub fn link_existing(&self, name: &str, digest: &Digest) -> Result<bool> {
        if !exists(&self.store.blob_path(digest))? {
            return Ok(false);
        }
        self.link(&self.blob_link(name, digest), b"")?;
        Ok(true)
    }

    /// Moves a finished upload at `file` into the store as blob `expected` and links it into
    /// repository `name`, after hashing it: a file whose content has another digest is
    /// removed and refused. Blocking (reads the whole file).
    pub fn adopt_upload(
        &self,
        name: &str,
        file: &Path,
        expected: &Digest,
    ) -> std::result::Result<u64, UploadRefused> {
        let outcome = (|| {
            let mut f = fs::File::open(file).at(file)?;
            let mut hasher = Sha256::new();
            let mut buf = vec![0u8; 1 << 20];
            let mut size = 0u64;
            loop {
                let n = f.read(&mut buf).at(file)?;
                if n == 0 {
                    break;
                }
                hasher.update(&buf[..n]);
                size += n as u64;
            }
            let actual = Digest::from_hasher(hasher);
            if &actual != expected {
                return Err(UploadRefused::DigestMismatch {
                    expected: expected.clone(),
                    actual,
                });
            }
            f.sync_all().at(file)?;
            let blob = self.store.blob_path(expected);
            fs::rename(file, &blob).at(&blob)?;
            self.link(&self.blob_link(name, expected), b"")?;
            Ok(size)
        })();
        if outcome.is_err() {
            let _ = fs::remove_file(file);
        }
        outcome
    }

    /// Stores a manifest pushed to repository `name` under `reference` (a tag or its
    /// digest): every blob it names must be in the repository already, and a digest
    /// reference must be the manifest's own. Answers its digest.
    pub fn put_manifest(
        &self,
        name: &str,
        reference: &str,
        media_type: Option<&str>,
        bytes: &[u8],
    ) -> std::result::Result<Digest, ManifestRefused> {
        let digest = Digest::of(bytes);
        if let Ok(expected) = reference.parse::<Digest>() {
            if expected != digest {
                return Err(ManifestRefused::DigestMismatch {
                    expected,
                    actual: digest,
                });
            }
        }
        let document = Document::parse(media_type, bytes)
            .map_err(|e| ManifestRefused::Invalid(e.to_string()))?;
        let needed: Vec<Digest> = match &document {
            Document::Manifest(m) => std::iter::once(m.config.digest.clone())
                .chain(m.layers.iter().map(|l| l.digest.clone()))
                .collect(),
            Document::Index(i) => i.manifests.iter().map(|m| m.digest.clone()).collect(),
        };
        for d in needed {
            if self.blob_size(name, &d)?.is_none() {
                return Err(ManifestRefused::BlobUnknown(d));
            }
        }
        let media_type = media_type
            .map(str::to_string)
            .or_else(|| document_media_type(bytes))
            .unwrap_or_else(|| crate::manifest::OCI_MANIFEST.to_string());
        self.store.put_blob(bytes)?;
        self.link(&self.manifest_link(name, &digest), media_type.as_bytes())?;
        if reference.parse::<Digest>().is_err() {
            self.link(&self.tag_path(name, reference), digest.as_str().as_bytes())?;
        }
        Ok(digest)
    }

    /// The manifest `reference` (a tag or a digest) names in repository `name`.
    pub fn manifest(&self, name: &str, reference: &str) -> Result<Option<StoredManifest>> {
        let digest = match reference.parse::<Digest>() {
            Ok(d) => d,
            Err(_) => match read_opt(&self.tag_path(name, reference))? {
                Some(b) => String::from_utf8_lossy(&b).trim().parse()?,
                None => return Ok(None),
            },
        };
        let Some(media_type) = read_opt(&self.manifest_link(name, &digest))? else {
            return Ok(None);
        };
        let Some(bytes) = read_opt(&self.store.blob_path(&digest))? else {
            return Ok(None);
        };
        Ok(Some(StoredManifest {
            digest,
            media_type: String::from_utf8_lossy(&media_type).into_owned(),
            bytes,
        }))
    }

    /// The tags of repository `name`, sorted; `None` if it has none and holds nothing.
    pub fn tags(&self, name: &str) -> Result<Option<Vec<String>>> {
        let dir = self.dir(name);
        if !exists(&dir)? {
            return Ok(None);
        }
        let tags_dir = dir.join("_tags");
        let mut tags = Vec::new();
        match fs::read_dir(&tags_dir) {
            Ok(rd) => {
                for e in rd {
                    tags.push(e.at(&tags_dir)?.file_name().to_string_lossy().into_owned());
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).at(tags_dir),
        }
        tags.sort();
        Ok(Some(tags))
    }

    /// Every blob and manifest some repository links (what garbage collection keeps).
    pub fn linked(&self) -> Result<Vec<Digest>> {
        let mut out = Vec::new();
        let root = self.store.root().join("repos");
        if exists(&root)? {
            collect_links(&root, &mut out)?;
        }
        Ok(out)
    }
}

fn collect_links(dir: &Path, out: &mut Vec<Digest>) -> Result<()> {
    for e in fs::read_dir(dir).at(dir)? {
        let e = e.at(dir)?;
        let name = e.file_name();
        let path = e.path();
        if !e.file_type().at(&path)?.is_dir() {
            continue;
        }
        if name == "_blobs" || name == "_manifests" {
            for link in fs::read_dir(&path).at(&path)? {
                let link = link.at(&path)?.file_name();
                if let Ok(d) = format!("sha256:{}", link.to_string_lossy()).parse() {
                    out.push(d);
                }
            }
        } else if name != "_tags" {
            collect_links(&path, out)?;
        }
    }
    Ok(())
}

fn read_opt(path: &Path) -> Result<Option<Vec<u8>>> {
    match fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).at(path),
    }
}

/// The `mediaType` a manifest document names itself, if any.
fn document_media_type(bytes: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    Some(v.get("mediaType")?.as_str()?.to_string())
}

/// A manifest a repository holds, as retention sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldManifest {
    pub name: String,
    pub digest: Digest,
    /// When it was pushed (or last fetched from a peer).
    pub pushed: std::time::SystemTime,
    /// The manifests an index names (empty for an image manifest).
    pub children: Vec<Digest>,
}

impl RepoStore {
    /// Every repository name.
    pub fn names(&self) -> Result<Vec<String>> {
        fn walk(dir: &Path, prefix: &str, out: &mut Vec<String>) -> Result<()> {
            for e in fs::read_dir(dir).at(dir)? {
                let e = e.at(dir)?;
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with('_') || !e.file_type().at(e.path())?.is_dir() {
                    continue;
                }
                let full = if prefix.is_empty() {
                    name
                } else {
                    format!("{prefix}/{name}")
                };
                let path = e.path();
                if ["_blobs", "_manifests", "_tags"]
                    .iter()
                    .any(|d| path.join(d).is_dir())
                {
                    out.push(full.clone());
                }
                walk(&path, &full, out)?;
            }
            Ok(())
        }
        let root = self.store.root().join("repos");
        let mut out = Vec::new();
        if exists(&root)? {
            walk(&root, "", &mut out)?;
        }
        out.sort();
        Ok(out)
    }

    /// The manifests repository `name` holds.
    pub fn held(&self, name: &str) -> Result<Vec<HeldManifest>> {
        let dir = self.dir(name).join("_manifests");
        let mut out = Vec::new();
        let entries = match fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(e).at(dir),
        };
        for e in entries {
            let e = e.at(&dir)?;
            let Ok(digest) = format!("sha256:{}", e.file_name().to_string_lossy()).parse() else {
                continue;
            };
            let pushed = e.metadata().at(e.path())?.modified().at(e.path())?;
            let children = match self.manifest(name, &format!("{digest}"))? {
                Some(m) => match Document::parse(Some(&m.media_type), &m.bytes) {
                    Ok(Document::Index(i)) => i.manifests.into_iter().map(|d| d.digest).collect(),
                    _ => Vec::new(),
                },
                None => continue,
            };
            out.push(HeldManifest {
                name: name.to_string(),
                digest,
                pushed,
                children,
            });
        }
        Ok(out)
    }

    /// Removes tag `tag` of repository `name` (the manifest stays, under its digest);
    /// answers whether there was one.
    pub fn untag(&self, name: &str, tag: &str) -> Result<bool> {
        let path = self.tag_path(name, tag);
        match fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e).at(path),
        }
    }

    /// Lets repository `name` go of manifest `digest` and of the tags naming it, then of
    /// every blob link no manifest it keeps names and older than `grace` (a younger one may
    /// belong to a push in progress). The store's garbage collection frees what no one
    /// links any more. Answers the blob links dropped.
    pub fn release(
        &self,
        name: &str,
        digest: &Digest,
        grace: std::time::Duration,
    ) -> Result<usize> {
        let tags_dir = self.dir(name).join("_tags");
        if let Ok(rd) = fs::read_dir(&tags_dir) {
            for e in rd.flatten() {
                let points_here = fs::read(e.path())
                    .is_ok_and(|b| String::from_utf8_lossy(&b).trim() == digest.as_str());
                if points_here {
                    fs::remove_file(e.path()).at(e.path())?;
                }
            }
        }
        let link = self.manifest_link(name, digest);
        match fs::remove_file(&link) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).at(link),
        }
        let mut needed = std::collections::HashSet::new();
        for m in self.held(name)? {
            if let Some(stored) = self.manifest(name, m.digest.as_str())? {
                if let Ok(Document::Manifest(doc)) =
                    Document::parse(Some(&stored.media_type), &stored.bytes)
                {
                    needed.insert(doc.config.digest);
                    needed.extend(doc.layers.into_iter().map(|l| l.digest));
                }
            }
        }
        let blobs = self.dir(name).join("_blobs");
        let mut dropped = 0;
        if let Ok(rd) = fs::read_dir(&blobs) {
            let now = std::time::SystemTime::now();
            for e in rd.flatten() {
                let Ok(d) = format!("sha256:{}", e.file_name().to_string_lossy()).parse::<Digest>()
                else {
                    continue;
                };
                let young = e
                    .metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| now.duration_since(t).unwrap_or_default() < grace);
                if !needed.contains(&d) && !young {
                    fs::remove_file(e.path()).at(e.path())?;
                    dropped += 1;
                }
            }
        }
        Ok(dropped)
    }
}
