//! A volume's record as the store keeps it ([`VolumeRecord`], [`VolumeState`]): plain data,
//! so the store need not know [`crate::volumes`], which works on volumes through the store.

use bazaar_types::volume::VolumeSource;
use serde::{Deserialize, Serialize};

/// One volume, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub id: String,
    pub app: String,
    pub name: String,
    pub region: String,
    pub size_gb: u64,
    pub state: VolumeState,
    /// `ext4` or `dir` (see [`crate::volume_fs::VolumeFs`]).
    pub fstype: String,
    pub encrypted: bool,
    pub attached_machine_id: Option<String>,
    pub snapshot_retention: u32,
    pub auto_backup_enabled: bool,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    /// What it was made from (a restore or a fork); absent for an empty volume.
    #[serde(default)]
    pub source: Option<VolumeSource>,
}

/// Where a volume is in its life. Transient states say which storage step is under way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VolumeState {
    Creating,
    Created,
    /// Growing to `size_gb`.
    Extending,
    Destroying,
}

impl VolumeState {
    /// The state as the Fly API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            VolumeState::Creating => "creating",
            VolumeState::Created => "created",
            VolumeState::Extending => "extending",
            VolumeState::Destroying => "destroying",
        }
    }
}
