//! `[mounts]` and `[[mounts]]` (one table or an array of them, as fly.toml writes both):
//! the volume a process group's machines mount. Each machine gets a volume of its own,
//! named `source`, made with `initial_size` when the deploy finds none free
//! (`crate::volumes`); the group's machine config carries the mount without a volume id
//! (`{"name", "path", "size_gb"}`), which the deploy fills in per machine.

use super::*;

/// Fly's default `initial_size` for volumes a deploy creates.
pub const DEFAULT_INITIAL_SIZE_GB: u64 = 1;

/// One `[mounts]` entry.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Mount {
    /// The volume name.
    pub source: String,
    /// Where the machine sees it.
    pub destination: String,
    /// The size of a volume the deploy creates (default 1 GB).
    #[serde(default)]
    pub initial_size: Option<VolumeSize>,
    #[serde(default)]
    pub processes: Vec<String>,
    /// Days a volume's snapshots are kept (volumes the deploy creates).
    #[serde(default)]
    pub snapshot_retention: Option<u32>,
    /// Daily automatic snapshots: bazaar takes none, so only `false` is accepted.
    #[serde(default)]
    pub scheduled_snapshots: Option<bool>,
}

/// `[mounts]` or `[[mounts]]`.
#[derive(Debug, Clone, Default)]
pub struct Mounts(pub Vec<Mount>);

impl<'de> Deserialize<'de> for Mounts {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Mounts;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a [mounts] table or [[mounts]] tables")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Mounts, A::Error> {
                Mount::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(|m| Mounts(vec![m]))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Mounts, A::Error> {
                Vec::<Mount>::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))
                    .map(Mounts)
            }
        }
        d.deserialize_any(V)
    }
}

/// A volume size: whole GB as a number, or a string with a unit (`"10gb"`, `"1GB"`,
/// `"2048mb"`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VolumeSize(pub u64);

impl<'de> Deserialize<'de> for VolumeSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            S(String),
            I(u64),
        }
        let bad = |s: &str| {
            serde::de::Error::custom(format!(
                "invalid initial_size {s:?}: use whole GB, e.g. 10 or \"10gb\""
            ))
        };
        let gb = match Raw::deserialize(d).map_err(|_| bad("?"))? {
            Raw::I(n) => n,
            Raw::S(s) => {
                let t = s.trim().to_ascii_lowercase();
                let (num, mb) = if let Some(n) = t.strip_suffix("gb") {
                    (n, false)
                } else if let Some(n) = t.strip_suffix("mb") {
                    (n, true)
                } else {
                    (t.as_str(), false)
                };
                let n: u64 = num.trim().parse().map_err(|_| bad(&s))?;
                if mb {
                    if !n.is_multiple_of(1024) {
                        return Err(bad(&s));
                    }
                    n / 1024
                } else {
                    n
                }
            }
        };
        bazaar_types::volume::validate_size_gb(gb)
            .map_err(|e| serde::de::Error::custom(format!("initial_size: {e}")))?;
        Ok(VolumeSize(gb))
    }
}

impl AppConfig {
    /// The `[mounts]` entry of a process group, if any.
    pub fn mount(&self, group: &str) -> Option<&Mount> {
        self.mounts
            .0
            .iter()
            .find(|m| m.processes.iter().any(|g| g == group))
            .or_else(|| self.mounts.0.iter().find(|m| m.processes.is_empty()))
    }

    /// Volume name → snapshot retention (days) of the volumes a deploy creates.
    pub fn snapshot_retention(&self) -> BTreeMap<String, u32> {
        self.mounts
            .0
            .iter()
            .filter_map(|m| Some((m.source.clone(), m.snapshot_retention?)))
            .collect()
    }
}

/// The machine config's mount of a `[mounts]` entry: no volume id yet.
pub(super) fn mount_value(m: &Mount) -> serde_json::Value {
    serde_json::json!({
        "name": m.source,
        "path": m.destination,
        "size_gb": m.initial_size.map_or(DEFAULT_INITIAL_SIZE_GB, |s| s.0),
    })
}

/// Checks the `[mounts]` entries: names, paths, one mount per process group.
pub(super) fn validate(c: &AppConfig, groups: &[String]) -> Result<(), String> {
    for (i, m) in c.mounts.0.iter().enumerate() {
        let at = format!("[mounts] entry {}", i + 1);
        bazaar_types::volume::validate_volume_name(&m.source)
            .map_err(|e| format!("{at}: source: {e}"))?;
        let d = &m.destination;
        if !d.starts_with('/') || d.split('/').any(|p| p == "..") || d.contains('\0') || d == "/" {
            return Err(format!(
                "{at}: destination must be an absolute path below / without '..', got {d:?}"
            ));
        }
        for g in &m.processes {
            if !groups.contains(g) {
                return Err(format!(
                    "{at}: processes names process group {g:?}, which is not in [processes]"
                ));
            }
        }
        if m.scheduled_snapshots == Some(true) {
            return Err(format!(
                "{at}: `scheduled_snapshots = true` cannot be honoured: bazaar takes no automatic snapshots (take them with `bazaar volumes snapshots create`); remove the key or set it to false"
            ));
        }
        if let Some(r) = m.snapshot_retention {
            if !(1..=60).contains(&r) {
                return Err(format!(
                    "{at}: snapshot_retention must be between 1 and 60 days, got {r}"
                ));
            }
        }
    }
    for g in groups {
        let n = c
            .mounts
            .0
            .iter()
            .filter(|m| m.processes.iter().any(|p| p == g))
            .count();
        let general = c.mounts.0.iter().filter(|m| m.processes.is_empty()).count();
        if n > 1 || (n == 0 && general > 1) {
            return Err(format!(
                "process group {g:?} has more than one [mounts] entry: a machine mounts one volume"
            ));
        }
    }
    Ok(())
}
