//! Backups of a host (`bazaar host backup` / `restore`): its store and the files that make
//! it the same host (its catalog key `host-key`, its cluster certificate and key `tls/`, its
//! mesh key `mesh/`, the cluster secret it made, the gossip keys and revocations it was
//! given), and for the CA's host the cluster CA's directory, in one gzipped tar, 0600.
//!
//! The store is copied while the agent runs and writes: `POST /host/v1/backup` (cluster
//! secret or a host certificate) copies every table as one redb read transaction sees it
//! into `DATA/backup/agent.redb` ([`crate::store::Store::copy_to`]), so the copy is one
//! commit, never a torn file. With the agent stopped the command opens the store and
//! makes the same copy itself ([`snapshot_stopped`]).
//!
//! A restore needs the agent stopped (the store's lock says so): it puts the store and
//! the files back, and the agent started again re-adopts the machines the store names
//! that still run (their shims outlive it) and rejoins the cluster with its own
//! certificate. What changed after the backup (machines made or destroyed since) is not
//! in it.

use crate::agent::Agent;
use crate::error::AgentError;
use crate::store::Store;
use anyhow::Context;
use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use std::path::{Component, Path, PathBuf};

/// Where the agent writes the store's copy, under its data dir.
pub const STORE_COPY: &str = "backup/agent.redb";
/// Directories of the data dir whose files a backup holds: keys, and the catalog rows the
/// host owns that no store rebuilds (apps, app secrets, quotas, certificates).
const KEY_DIRS: [&str; 3] = ["tls", "mesh", bazaar_catalog::own_rows::DIR_NAME];
/// Top-level files of the data dir a backup holds, where there: the host's catalog key,
/// the cluster secret it made, the gossip keys and the revocations it was given. (Others
/// are written anew at each start, or are logs, or are no files to copy: the sandbox's
/// base mount namespace is one.)
const KEY_FILES: [&str; 4] = [
    "host-key",
    "cluster-secret",
    "gossip-keys",
    "revocations.json",
];
/// Larger files are not keys: left out.
const MAX_FILE: u64 = 1 << 20;

/// The answer of `POST /host/v1/backup`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct StoreCopy {
    pub host_id: String,
    /// The copy, under the data dir.
    pub path: PathBuf,
}

pub fn routes() -> Router<Agent> {
    Router::new().route("/backup", post(copy_store))
}

async fn copy_store(State(agent): State<Agent>) -> Result<Json<StoreCopy>, AgentError> {
    let path = agent.config().data_dir.join(STORE_COPY);
    let store = agent.store().clone();
    let dest = path.clone();
    tokio::task::spawn_blocking(move || {
        private_dir(dest.parent().expect("a parent"))
            .map_err(|e| AgentError::Internal(format!("{e:#}")))?;
        store.copy_to(&dest).map_err(AgentError::from)
    })
    .await
    .map_err(|e| AgentError::Internal(e.to_string()))??;
    Ok(Json(StoreCopy {
        host_id: agent.host_id().to_string(),
        path,
    }))
}

/// Whether an agent holds the store of `data_dir` open (redb's lock on the file).
pub fn store_in_use(data_dir: &Path) -> bool {
    let path = data_dir.join("agent.redb");
    path.exists()
        && matches!(
            redb::Database::open(&path),
            Err(redb::DatabaseError::DatabaseAlreadyOpen)
        )
}

/// The store's copy made without the agent (stopped): `DATA/backup/agent.redb`.
pub fn snapshot_stopped(data_dir: &Path) -> anyhow::Result<PathBuf> {
    let path = data_dir.join(STORE_COPY);
    private_dir(path.parent().expect("a parent"))?;
    let store = Store::open(&data_dir.join("agent.redb")).context("opening the store")?;
    store.copy_to(&path).context("copying the store")?;
    Ok(path)
}

/// What a backup holds, or a restore put back.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Contents {
    /// Files of the data dir (relative), the store first.
    pub data: Vec<String>,
    /// Files of the CA's directory (relative).
    pub ca: Vec<String>,
}

/// Writes the backup archive `out` (0600): the store's copy `store_copy` as `agent.redb`,
/// the data dir's key files under `data/`, and `ca_dir`'s files under `ca/`.
pub fn write_archive(
    data_dir: &Path,
    store_copy: &Path,
    ca_dir: Option<&Path>,
    out: &Path,
) -> anyhow::Result<Contents> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode_0600()
        .open(out)
        .with_context(|| format!("creating {}", out.display()))?;
    let gz = flate2::write::GzEncoder::new(file, flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    tar.follow_symlinks(false);
    // A redb file has holes; plain entries keep the archive readable by any tar.
    tar.sparse(false);
    let mut contents = Contents::default();
    tar.append_path_with_name(store_copy, "agent.redb")
        .context("adding the store")?;
    contents.data.push("agent.redb".into());
    for rel in key_files(data_dir)? {
        tar.append_path_with_name(data_dir.join(&rel), Path::new("data").join(&rel))
            .with_context(|| format!("adding {}", rel.display()))?;
        contents.data.push(rel.display().to_string());
    }
    if let Some(ca) = ca_dir {
        anyhow::ensure!(
            ca.join("ca.key").is_file(),
            "{} holds no ca.key: not a cluster CA directory",
            ca.display()
        );
        for rel in files_under(ca, Path::new(""), u64::MAX)? {
            tar.append_path_with_name(ca.join(&rel), Path::new("ca").join(&rel))
                .with_context(|| format!("adding {}", rel.display()))?;
            contents.ca.push(rel.display().to_string());
        }
    }
    tar.into_inner()?.finish()?.sync_all()?;
    Ok(contents)
}

/// The key files of the data dir, relative: those of `KEY_FILES` there, and the files of
/// `KEY_DIRS`.
fn key_files(data_dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = KEY_FILES
        .iter()
        .map(PathBuf::from)
        .filter(|p| data_dir.join(p).is_file())
        .collect();
    for dir in KEY_DIRS {
        if data_dir.join(dir).is_dir() {
            files.extend(files_under(data_dir, Path::new(dir), MAX_FILE)?);
        }
    }
    files.sort();
    Ok(files)
}

/// Regular files under `root/rel` and its subdirectories, relative to `root`, at most `max`
/// bytes each; symlinks skipped.
fn files_under(root: &Path, rel: &Path, max: u64) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let dir = root.join(rel);
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        // `DirEntry::file_type` does not follow symlinks.
        let kind = entry.file_type()?;
        let path = rel.join(entry.file_name());
        if kind.is_file() && entry.metadata()?.len() <= max {
            out.push(path);
        } else if kind.is_dir() {
            out.extend(files_under(root, &path, max)?);
        }
    }
    Ok(out)
}

/// Makes `dir` (and its parents) if missing; one it makes is its owner's alone.
fn private_dir(dir: &Path) -> anyhow::Result<()> {
    if !dir.is_dir() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let mode = <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o700);
        std::fs::set_permissions(dir, mode)
            .with_context(|| format!("making {} private", dir.display()))?;
    }
    Ok(())
}

/// Puts a backup back: the store as `data_dir/agent.redb`, the key files into `data_dir`
/// and, with `ca_dir`, the CA's files there. Refused while an agent holds the store.
pub fn restore(archive: &Path, data_dir: &Path, ca_dir: Option<&Path>) -> anyhow::Result<Contents> {
    anyhow::ensure!(
        !store_in_use(data_dir),
        "the agent of {} is running: stop it first (systemctl stop bazaar-agent)",
        data_dir.display()
    );
    let open = || -> anyhow::Result<tar::Archive<flate2::read::GzDecoder<std::fs::File>>> {
        let file = std::fs::File::open(archive)
            .with_context(|| format!("opening {}", archive.display()))?;
        let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(file));
        tar.set_preserve_permissions(true);
        Ok(tar)
    };
    // Read through once before writing anything: a backup that cannot be put back whole
    // changes nothing.
    let mut has_store = false;
    for entry in open()?.entries().context("reading the backup")? {
        let entry = entry.context("reading the backup")?;
        let path = entry.path()?.into_owned();
        anyhow::ensure!(
            path.components().all(|c| matches!(c, Component::Normal(_))),
            "the backup holds a path outside its directories: {}",
            path.display()
        );
        anyhow::ensure!(
            path == Path::new("agent.redb") || path.starts_with("data") || path.starts_with("ca"),
            "not a bazaar host backup: it holds {}",
            path.display()
        );
        anyhow::ensure!(
            !path.starts_with("ca") || ca_dir.is_some(),
            "the backup holds the cluster CA's directory: say where it goes with --ca-dir"
        );
        has_store |= path == Path::new("agent.redb");
    }
    anyhow::ensure!(
        has_store,
        "not a bazaar host backup: it holds no agent.redb"
    );
    private_dir(data_dir)?;
    let mut contents = Contents::default();
    let store = data_dir.join("agent.redb.restoring");
    for entry in open()?.entries().context("reading the backup")? {
        let mut entry = entry.context("reading the backup")?;
        let path = entry.path()?.into_owned();
        let kind = entry.header().entry_type();
        if !(kind.is_file() || kind.is_gnu_sparse()) {
            continue;
        }
        let (dest, list) = if path == Path::new("agent.redb") {
            // Written beside the store, renamed once complete.
            (store.clone(), &mut contents.data)
        } else if let Ok(rel) = path.strip_prefix("data") {
            (data_dir.join(rel), &mut contents.data)
        } else {
            let rel = path.strip_prefix("ca")?;
            (ca_dir.context("--ca-dir")?.join(rel), &mut contents.ca)
        };
        if let Some(parent) = dest.parent() {
            private_dir(parent)?;
        }
        entry
            .unpack(&dest)
            .with_context(|| format!("writing {}", dest.display()))?;
        list.push(path.display().to_string());
    }
    std::fs::rename(&store, data_dir.join("agent.redb"))
        .with_context(|| format!("putting the store back in {}", data_dir.display()))?;
    Ok(contents)
}

/// `OpenOptions` that create files readable by their owner alone.
trait Private {
    fn mode_0600(&mut self) -> &mut Self;
}

impl Private for std::fs::OpenOptions {
    fn mode_0600(&mut self) -> &mut Self {
        std::os::unix::fs::OpenOptionsExt::mode(self, 0o600)
    }
}
