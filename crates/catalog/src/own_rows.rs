//! The rows this node owns that nothing else rebuilds, kept on disk: apps, app secrets,
//! quotas and edge certificates. The agent republishes its machines, volumes and host row
//! from its own store at start, and a restarted node gets its other rows from a previous
//! life back from its peers; but a host alone, or a whole cluster restarted at once (a
//! power cut), has no peer that kept them. So each of these rows is written here before it
//! is published (one file per row, written to a temporary file, synced and renamed), its
//! file removed before its deletion is, and [`OwnRows::load`] gives them back at start to be
//! published again with fresh versions.

use crate::records::{AppRecord, CertificateRecord, QuotaRecord, SecretRecord};
use crate::replica::Record;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The name of the directory of kept rows in a host's data dir (the agent's
/// `DATA/catalog-rows`; its backups hold it).
pub const DIR_NAME: &str = "catalog-rows";

/// A kept row, as written to its file.
#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", content = "record", rename_all = "snake_case")]
enum Kept {
    App(AppRecord),
    Secret(SecretRecord),
    Quota(QuotaRecord),
    Certificate(CertificateRecord),
}

impl Kept {
    /// The rows kept here; `None` for the others (rebuilt by the agent, or short-lived like
    /// ACME challenges).
    fn of(record: &Record) -> Option<Kept> {
        Some(match record {
            Record::App(r) => Kept::App(r.clone()),
            Record::Secret(r) => Kept::Secret(r.clone()),
            Record::Quota(r) => Kept::Quota(r.clone()),
            Record::Certificate(r) => Kept::Certificate(r.clone()),
            _ => return None,
        })
    }

    fn into_record(self) -> Record {
        match self {
            Kept::App(r) => Record::App(r),
            Kept::Secret(r) => Record::Secret(r),
            Kept::Quota(r) => Record::Quota(r),
            Kept::Certificate(r) => Record::Certificate(r),
        }
    }
}

/// The directory of this node's kept rows.
#[derive(Debug, Clone)]
pub struct OwnRows {
    dir: PathBuf,
}

impl OwnRows {
    pub fn new(dir: impl Into<PathBuf>) -> OwnRows {
        OwnRows { dir: dir.into() }
    }

    /// The file of `record`'s row: its kind and its key, hex-encoded (keys may hold `/`).
    fn path_of(&self, record: &Record) -> PathBuf {
        let kind = format!("{:?}", record.kind()).to_lowercase();
        self.dir
            .join(format!("{kind}-{}.json", hex::encode(record.key())))
    }

    /// Keeps `record` (or forgets it when `deleted`), durably, if it is a kind kept here.
    pub fn write(&self, record: &Record, deleted: bool) -> std::io::Result<()> {
        let Some(kept) = Kept::of(record) else {
            return Ok(());
        };
        let path = self.path_of(record);
        if deleted {
            return match std::fs::remove_file(&path) {
                Err(err) if err.kind() != std::io::ErrorKind::NotFound => Err(err),
                _ => sync_dir(&self.dir),
            };
        }
        std::fs::create_dir_all(&self.dir)?;
        let body = serde_json::to_vec(&kept)?;
        let tmp = path.with_extension("json.tmp");
        {
            use std::os::unix::fs::OpenOptionsExt;
            // App secrets are sealed, but still the host's business only.
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            file.write_all(&body)?;
            file.sync_all()?;
        }
        std::fs::rename(&tmp, &path)?;
        sync_dir(&self.dir)
    }

    /// Every kept row; a file that cannot be read is skipped with a warning.
    pub fn load(&self) -> Vec<Record> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut records = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            match std::fs::read(&path)
                .map_err(anyhow::Error::from)
                .and_then(|b| Ok(serde_json::from_slice::<Kept>(&b)?))
            {
                Ok(kept) => records.push(kept.into_record()),
                Err(err) => {
                    tracing::warn!(path = %path.display(), error = %err, "skipping a kept catalog row")
                }
            }
        }
        records
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    match std::fs::File::open(dir) {
        Ok(d) => d.sync_all(),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(name: &str) -> Record {
        Record::App(AppRecord {
            id: format!("app_{name}"),
            name: name.into(),
            org_slug: "personal".into(),
            created_at_ms: 1,
            created_by_host: "h1".into(),
        })
    }

    #[test]
    fn kept_rows_come_back_and_deleted_ones_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let rows = OwnRows::new(dir.path().join("rows"));
        rows.write(&app("web"), false).unwrap();
        rows.write(&app("api"), false).unwrap();
        rows.write(&app("api"), true).unwrap();
        // Deleting what was never kept is no error.
        rows.write(&app("never"), true).unwrap();
        let again = OwnRows::new(dir.path().join("rows")).load();
        assert_eq!(again, vec![app("web")]);
    }

    #[test]
    fn rows_the_agent_rebuilds_are_not_kept() {
        let dir = tempfile::tempdir().unwrap();
        let rows = OwnRows::new(dir.path());
        let machine = Record::Machine(Default::default());
        rows.write(&machine, false).unwrap();
        assert!(rows.load().is_empty());
    }
}
