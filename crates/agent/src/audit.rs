//! The audit record: every change made through this host's Machines API (who: the token's
//! id; what: method, path, app, machine; when; from where: the peer's address; the answer's
//! status), appended as a JSON line to `DATA/audit.log`. The file is rotated to
//! `audit.log.1` past [`ROTATE_BYTES`] (one old file kept), so a host keeps the latest
//! changes it handled within a bounded size. `GET /host/v1/audit/{app}` reads them; the API
//! (`/v1/apps/{app}/audit`) gathers every host's.
//! The agent holds its host's [`AuditLog`].

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Size past which `audit.log` is rotated.
pub const ROTATE_BYTES: u64 = 4 * 1024 * 1024;

pub use bazaar_node::AuditEntry;

/// The append-only, rotated audit file of one host.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    file: Mutex<()>,
}

impl AuditLog {
    /// The audit log in `data_dir`.
    pub fn new(data_dir: &Path) -> AuditLog {
        AuditLog {
            path: data_dir.join("audit.log"),
            file: Mutex::new(()),
        }
    }

    /// Appends `entry` (rotating first if the file is full). A write that fails is logged,
    /// not returned: the change it records has already been made.
    pub fn append(&self, entry: &AuditEntry) {
        let _one_writer = self.file.lock().unwrap_or_else(|e| e.into_inner());
        let result = (|| -> std::io::Result<()> {
            if std::fs::metadata(&self.path).is_ok_and(|m| m.len() >= ROTATE_BYTES) {
                std::fs::rename(&self.path, self.path.with_extension("log.1"))?;
            }
            let mut line = serde_json::to_vec(entry).map_err(std::io::Error::other)?;
            line.push(b'\n');
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(&self.path)?
                .write_all(&line)
        })();
        if let Err(e) = result {
            tracing::warn!(error = %e, path = %self.path.display(), "audit record not written");
        }
    }

    /// The entries about `app`, oldest first (the rotated file, then the current one).
    pub fn for_app(&self, app: &str) -> Vec<AuditEntry> {
        let _one_writer = self.file.lock().unwrap_or_else(|e| e.into_inner());
        [self.path.with_extension("log.1"), self.path.clone()]
            .iter()
            .filter_map(|p| std::fs::File::open(p).ok())
            .flat_map(|f| std::io::BufReader::new(f).lines().map_while(Result::ok))
            .filter_map(|line| serde_json::from_str::<AuditEntry>(&line).ok())
            .filter(|e| e.app.as_deref() == Some(app))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(app: &str, n: u64) -> AuditEntry {
        AuditEntry {
            time: bazaar_types::rfc3339(n),
            time_ms: n,
            token_id: "id".into(),
            method: "POST".into(),
            path: format!("/v1/apps/{app}/machines"),
            app: Some(app.into()),
            machine_id: None,
            peer: "127.0.0.1:1".into(),
            status: 200,
            host_id: "h".into(),
        }
    }

    #[test]
    fn entries_are_kept_per_app_across_a_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let log = AuditLog::new(dir.path());
        log.append(&entry("web", 1));
        log.append(&entry("db", 2));
        // Fill the file past the rotation size: the next append rotates it.
        let big = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("audit.log"))
            .unwrap();
        big.set_len(ROTATE_BYTES).unwrap();
        log.append(&entry("web", 3));
        let web: Vec<u64> = log.for_app("web").iter().map(|e| e.time_ms).collect();
        assert_eq!(web, vec![1, 3]);
        assert_eq!(log.for_app("db").len(), 1);
        assert!(dir.path().join("audit.log.1").exists());
    }
}
