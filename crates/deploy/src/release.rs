//! Releases. Every deploy is a numbered release; the number is written into each machine's
//! config metadata (`fly_release_version`, as flyctl does), so the history needs no store
//! of its own: every machine keeps its config versions (`GET .../versions`), destroyed ones
//! too until their tombstones are collected (1 h by default). A release's config per
//! process group is the newest machine config version that carries its number; that is
//! what `bazaar rollback VERSION` deploys again.

use crate::api::Client;
use bazaar_types::config::MachineConfig;
use bazaar_types::state::MachineState;
use serde::Serialize;
use std::collections::BTreeMap;

/// One release as the machines remember it.
#[derive(Debug, Clone, Serialize)]
pub struct Release {
    pub version: u64,
    /// When its first machine config was written (RFC 3339).
    pub created_at: String,
    /// `deployed` (the newest release machines run), `superseded`, or `failed` (newer than
    /// what runs: it was rolled back).
    pub status: String,
    /// Machines running it now.
    pub machines: usize,
    /// Its config per process group.
    #[serde(skip)]
    pub configs: BTreeMap<String, MachineConfig>,
    #[serde(skip)]
    first_ms: u64,
}

/// The release label of a config.
pub fn release_of(config: &MachineConfig) -> Option<u64> {
    config
        .metadata
        .get(crate::META_RELEASE)
        .and_then(|v| v.parse().ok())
}

/// Every release the app's machines (live and tombstoned) remember, newest first.
pub async fn history(client: &Client, app: &str) -> anyhow::Result<Vec<Release>> {
    let all = client.fly().machines_including_deleted(app).await?;
    let mut live: BTreeMap<u64, usize> = BTreeMap::new();
    for m in &all {
        if m.state == MachineState::Destroyed {
            continue;
        }
        if let Some(v) = release_of(&m.config) {
            *live.entry(v).or_default() += 1;
        }
    }
    let calls = all
        .iter()
        .map(|m| async move { client.versions(app, &m.id).await.unwrap_or_default() });
    let mut releases: BTreeMap<u64, Release> = BTreeMap::new();
    for versions in futures_util::future::join_all(calls).await {
        for (ver, cfg) in versions {
            let Some(n) = release_of(&cfg) else {
                continue;
            };
            let ms = ulid::Ulid::from_string(&ver)
                .map(|u| u.timestamp_ms())
                .unwrap_or(0);
            let group = cfg
                .metadata
                .get(crate::META_GROUP)
                .cloned()
                .unwrap_or_else(|| crate::config::DEFAULT_GROUP.to_string());
            let r = releases.entry(n).or_insert_with(|| Release {
                version: n,
                created_at: String::new(),
                status: String::new(),
                machines: 0,
                configs: BTreeMap::new(),
                first_ms: u64::MAX,
            });
            r.first_ms = r.first_ms.min(ms);
            // The newest version of the release wins for its group (versions come newest
            // first per machine; across machines, compare times).
            r.configs.entry(group).or_insert(cfg);
        }
    }
    // Machines relabeled without a new config version still count.
    for (n, count) in &live {
        releases.entry(*n).or_insert_with(|| Release {
            version: *n,
            created_at: String::new(),
            status: String::new(),
            machines: 0,
            configs: BTreeMap::new(),
            first_ms: u64::MAX,
        });
        releases.get_mut(n).expect("inserted").machines = *count;
    }
    let current = live.keys().max().copied();
    let mut out: Vec<Release> = releases.into_values().collect();
    for r in &mut out {
        r.status = match current {
            Some(c) if r.version == c => "deployed",
            Some(c) if r.version > c => "failed",
            None => "superseded",
            _ => "superseded",
        }
        .into();
        if r.first_ms != u64::MAX {
            r.created_at = bazaar_types::rfc3339(r.first_ms);
        }
    }
    out.reverse();
    Ok(out)
}

/// The number the next release gets: one more than any release seen.
pub fn next_version(history: &[Release]) -> u64 {
    history.iter().map(|r| r.version).max().unwrap_or(0) + 1
}
