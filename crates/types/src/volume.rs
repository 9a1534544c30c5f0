//! Volumes: host-local persistent storage, spelled as the Fly Machines API spells it
//! (reference/fly.md §2.2). A volume lives on exactly one host; a machine that mounts it
//! (`config.mounts[0].volume`) must live there too. This module holds the API objects, the
//! host-interface requests and the shared validation rules.

use crate::config::MachineConfig;
use crate::guest::Guest;
use rand::Rng;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Fly's default volume size.
pub const DEFAULT_SIZE_GB: u64 = 3;
/// Largest volume accepted (Fly's limit).
pub const MAX_SIZE_GB: u64 = 500;
/// Bytes per block of a volume's file system (ext4 default).
pub const BLOCK_SIZE: u64 = 4096;

/// A volume as the API returns it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Volume {
    /// `vol_` and 16 base-36 characters.
    pub id: String,
    pub name: String,
    /// `created`, or `creating` / `extending` / `destroying` while an operation runs.
    pub state: String,
    pub size_gb: u64,
    pub region: String,
    /// The host the volume lives on (Fly's hardware zone).
    pub zone: String,
    pub encrypted: bool,
    /// The machine that mounts the volume, if any.
    pub attached_machine_id: Option<String>,
    pub attached_alloc_id: Option<String>,
    /// RFC 3339.
    pub created_at: String,
    /// `ok`, or `unreachable` when the owning host is not answering.
    pub host_status: String,
    /// `ext4` (an image file on a loop device) or `dir` (a plain directory: the host could
    /// not make a file system, e.g. the agent is not root).
    pub fstype: String,
    pub block_size: u64,
    pub blocks: u64,
    pub blocks_free: u64,
    pub blocks_avail: u64,
    pub bytes_total: u64,
    pub bytes_used: u64,
    pub snapshot_retention: u32,
    pub auto_backup_enabled: bool,
    /// Always `local`.
    #[serde(rename = "type")]
    pub kind: String,
    /// bazaar extension: the owning host's id.
    pub host_id: String,
}

/// Fly's CreateVolumeRequest. `snapshot_id` restores a snapshot and `source_volume_id` forks
/// a volume; both put the new volume on the host that holds the source.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(extend("required" = ["name"]))]
pub struct CreateVolumeRequest {
    /// 1-30 lowercase letters, digits and `_` (required: a volume without a name is refused).
    #[serde(default)]
    #[schemars(length(min = 1, max = 30), regex(pattern = r"^[a-z0-9_]+$"))]
    pub name: String,
    #[serde(default)]
    pub region: Option<String>,
    /// 1 to 500 (default 3).
    #[serde(default)]
    #[schemars(range(min = 1, max = 500))]
    pub size_gb: Option<u64>,
    #[serde(default)]
    pub encrypted: Option<bool>,
    /// Spread same-name volumes of an app over distinct hosts (default true, as on Fly).
    #[serde(default)]
    pub require_unique_zone: Option<bool>,
    /// Place the volume on a host that can also run a machine of this size.
    #[serde(default)]
    pub compute: Option<Guest>,
    /// Days a snapshot is kept: 1 to 60 (default 5).
    #[serde(default)]
    #[schemars(range(min = 1, max = 60))]
    pub snapshot_retention: Option<u32>,
    #[serde(default)]
    pub auto_backup_enabled: Option<bool>,
    #[serde(default)]
    pub fstype: Option<String>,
    /// A snapshot of the app's (`vs_...`).
    #[serde(default)]
    #[schemars(regex(pattern = r"^vs_[a-z0-9]{1,40}$"))]
    pub snapshot_id: Option<String>,
    /// A volume of the app (`vol_...`).
    #[serde(default)]
    #[schemars(regex(pattern = r"^vol_[a-z0-9]{1,40}$"))]
    pub source_volume_id: Option<String>,
}

/// Fly's UpdateVolumeRequest.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct UpdateVolumeRequest {
    /// Days a snapshot is kept: 1 to 60 (default 5).
    #[serde(default)]
    #[schemars(range(min = 1, max = 60))]
    pub snapshot_retention: Option<u32>,
    #[serde(default)]
    pub auto_backup_enabled: Option<bool>,
}

/// Fly's ExtendVolumeRequest.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(extend("required" = ["size_gb"]))]
pub struct ExtendVolumeRequest {
    /// The new size (required), 1 to 500.
    #[serde(default)]
    #[schemars(with = "u64", range(min = 1, max = 500))]
    pub size_gb: Option<u64>,
}

/// Fly's ExtendVolumeResponse.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ExtendVolumeResponse {
    pub volume: Volume,
    /// True when the attached machine must restart to see the new size (never for ext4,
    /// which is grown online).
    pub needs_restart: bool,
}

/// `POST /host/v1/volumes`: create a volume on this host. The exchange chooses the id, so a
/// retried create is idempotent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HostVolumeCreate {
    pub id: String,
    pub app: String,
    pub name: String,
    pub size_gb: u64,
    /// Always false (see [`NO_ENCRYPTION`]); a host refuses true.
    #[serde(default)]
    pub encrypted: bool,
    #[serde(default = "yes")]
    pub require_unique_zone: bool,
    /// cpus and memory the host must also have free (the `compute` hint).
    #[serde(default)]
    pub compute: Option<crate::host::Resources>,
    #[serde(default = "default_retention")]
    pub snapshot_retention: u32,
    #[serde(default)]
    pub auto_backup_enabled: bool,
    /// What the volume starts with (empty when absent).
    #[serde(default)]
    pub source: Option<VolumeSource>,
}

/// The data a new volume starts with: a copy of a snapshot or of another volume, both on
/// the host that creates it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum VolumeSource {
    /// Restore: the snapshot with this id.
    Snapshot(String),
    /// Fork: a consistent copy of the volume with this id, taken now.
    Volume(String),
}

/// Fly's VolumeSnapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct VolumeSnapshot {
    /// `vs_` and 16 base-36 characters.
    pub id: String,
    /// RFC 3339.
    pub created_at: String,
    /// `sha256:` of the image's non-zero blocks and their offsets.
    pub digest: String,
    /// Bytes of data in the snapshot (the image's non-zero blocks).
    pub size: u64,
    /// Always `created`: a snapshot is listed once it is complete.
    pub status: String,
}

/// A snapshot as its host keeps it (`GET /host/v1/snapshots/{id}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HostSnapshot {
    pub id: String,
    pub volume_id: String,
    pub app: String,
    pub size: u64,
    pub digest: String,
    pub created_at_ms: u64,
    /// The size of the volume it was taken from: a restore is at least this big.
    pub volume_size_gb: u64,
    /// Days it is kept (the volume's `snapshot_retention` when it was taken).
    pub retention_days: u32,
}

impl HostSnapshot {
    /// The API object.
    pub fn view(&self) -> VolumeSnapshot {
        VolumeSnapshot {
            id: self.id.clone(),
            created_at: crate::rfc3339(self.created_at_ms),
            digest: self.digest.clone(),
            size: self.size,
            status: "created".into(),
        }
    }

    /// True once it has been kept for its retention period.
    pub fn expired(&self, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.created_at_ms) > u64::from(self.retention_days) * 86_400_000
    }
}

/// Why `encrypted: true` is refused: volumes are plain ext4 images.
pub const NO_ENCRYPTION: &str = "encrypted volumes are not supported: encryption at rest needs dm-crypt (LUKS), which the kernel of this cluster's hosts does not have, so bazaar will not claim it; create the volume with \"encrypted\": false";

fn yes() -> bool {
    true
}

fn default_retention() -> u32 {
    5
}

/// A machine's volume mount (`config.mounts[0]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountSpec {
    pub volume: String,
    /// Where the machine wants it (absolute).
    pub path: String,
}

/// Returns a new volume id: `vol_` and 16 base-36 characters, as Fly's.
pub fn new_volume_id() -> String {
    const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut rng = rand::rng();
    let tail: String = (0..16)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect();
    format!("vol_{tail}")
}

/// Returns a new snapshot id: `vs_` and 16 base-36 characters.
pub fn new_snapshot_id() -> String {
    format!("vs_{}", &new_volume_id()[4..])
}

/// Checks a snapshot id's shape (so it can be used in paths safely).
pub fn is_valid_snapshot_id(id: &str) -> bool {
    id.strip_prefix("vs_").is_some_and(base36_tail)
}

fn base36_tail(t: &str) -> bool {
    (1..=40).contains(&t.len())
        && t.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// Checks a volume id's shape (so it can be used in paths safely).
pub fn is_valid_volume_id(id: &str) -> bool {
    id.strip_prefix("vol_").is_some_and(base36_tail)
}

/// Checks a volume name as Fly does: 1-30 lowercase letters, digits and `_`.
pub fn validate_volume_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 30 {
        return Err(format!(
            "volume name must be 1-30 characters, got {}",
            name.len()
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_'))
    {
        return Err(format!(
            "volume name {name:?} contains {bad:?}: only lowercase letters, digits and '_' are allowed"
        ));
    }
    Ok(())
}

/// Checks a volume size in GB.
pub fn validate_size_gb(size_gb: u64) -> Result<(), String> {
    if !(1..=MAX_SIZE_GB).contains(&size_gb) {
        return Err(format!(
            "size_gb must be between 1 and {MAX_SIZE_GB}, got {size_gb}"
        ));
    }
    Ok(())
}

/// The volume a machine config mounts, if any. One mount at most, naming a volume id and
/// an absolute path without `..`.
pub fn mount_of(config: &MachineConfig) -> Result<Option<MountSpec>, String> {
    let Some(first) = config.mounts.first() else {
        return Ok(None);
    };
    if config.mounts.len() > 1 {
        return Err("a machine can mount one volume only (config.mounts has more)".into());
    }
    let volume = first
        .get("volume")
        .and_then(|v| v.as_str())
        .ok_or("config.mounts[0].volume must name a volume id")?;
    if !is_valid_volume_id(volume) {
        return Err(format!(
            "config.mounts[0].volume {volume:?} is not a volume id"
        ));
    }
    let path = first
        .get("path")
        .and_then(|v| v.as_str())
        .ok_or("config.mounts[0].path is required")?;
    if !path.starts_with('/') || path.split('/').any(|p| p == "..") || path.contains('\0') {
        return Err(format!(
            "config.mounts[0].path must be an absolute path without '..', got {path:?}"
        ));
    }
    Ok(Some(MountSpec {
        volume: volume.to_string(),
        path: path.to_string(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_names_and_sizes() {
        let id = new_volume_id();
        assert_eq!(id.len(), 20);
        assert!(is_valid_volume_id(&id));
        for bad in ["vol_", "vol_../x", "1857156b526dd8", "vol_ABC"] {
            assert!(!is_valid_volume_id(bad), "{bad:?}");
        }
        assert!(validate_volume_name("pg_data1").is_ok());
        for bad in ["", "Data", "a-b", "../x", &"a".repeat(31)] {
            assert!(validate_volume_name(bad).is_err(), "{bad:?}");
        }
        let snap = new_snapshot_id();
        assert!(is_valid_snapshot_id(&snap) && snap.len() == 19, "{snap}");
        for bad in ["vs_", "vs_../x", "vol_abc", "vs_ABC"] {
            assert!(!is_valid_snapshot_id(bad), "{bad:?}");
        }
        assert!(validate_size_gb(0).is_err());
        assert!(validate_size_gb(MAX_SIZE_GB + 1).is_err());
        assert!(validate_size_gb(1).is_ok());
    }

    #[test]
    fn snapshots_expire_after_their_retention() {
        let day = 86_400_000;
        let snap = HostSnapshot {
            id: new_snapshot_id(),
            volume_id: new_volume_id(),
            app: "a".into(),
            size: 1,
            digest: "sha256:00".into(),
            created_at_ms: 10 * day,
            volume_size_gb: 1,
            retention_days: 5,
        };
        assert!(!snap.expired(15 * day));
        assert!(snap.expired(15 * day + 1));
        assert_eq!(snap.view().status, "created");
    }

    #[test]
    fn mounts_are_checked() {
        let mut c = MachineConfig::default();
        assert_eq!(mount_of(&c), Ok(None));
        c.mounts = vec![serde_json::json!({"volume": "vol_abc", "path": "/data"})];
        assert_eq!(
            mount_of(&c).unwrap().unwrap(),
            MountSpec {
                volume: "vol_abc".into(),
                path: "/data".into()
            }
        );
        c.mounts = vec![serde_json::json!({"volume": "vol_abc", "path": "data/../x"})];
        assert!(mount_of(&c).is_err());
        c.mounts = vec![serde_json::json!({"path": "/data"})];
        assert!(mount_of(&c).is_err());
    }
}
