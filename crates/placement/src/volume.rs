//! Placement of volumes (pure). A volume is a bid for disk: the exchange filters and ranks
//! hosts from its (possibly stale) view, and each host decides from its exact local state
//! with [`check_volume`]. Rules:
//!
//! - the host must have `size_gb` of disk free, and, with a `compute` hint, room for a
//!   machine of that size too;
//! - `require_unique_zone` (Fly's default): a host already holding a volume of the same name
//!   for the same app refuses, so same-name volumes spread over hosts (Fly's zones);
//!   without it such hosts are only ranked last;
//! - among the rest, the host left with the largest share of its disk free wins (spread).
//!
//! A machine that mounts a volume is pinned to the volume's host
//! ([`crate::exchange::PlacementRequest::pinned_host`]).

use crate::exchange::{Candidate, Exclusion};
use bazaar_types::host::Resources;

/// What the exchange knows of a host for a volume placement.
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeCandidate {
    pub host: Candidate,
    /// Disk offered to volumes, in GB.
    pub disk_gb: u64,
    /// Disk not yet given to volumes, in GB (advertised; may be stale).
    pub disk_free_gb: u64,
    /// Volumes of the same app and name this host holds already.
    pub same_name: usize,
}

/// What is being placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VolumeRequest {
    pub size_gb: u64,
    /// cpus and memory the host must also have free.
    pub compute: Option<Resources>,
    pub require_unique_zone: bool,
}

/// What a host knows exactly when it decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskState {
    pub disk_gb: u64,
    /// Sum of the sizes of its volumes.
    pub used_gb: u64,
    /// Volumes of the same app and name it holds.
    pub same_name: usize,
    /// cpus and memory free (capacity minus committed and reserved).
    pub free: Resources,
}

/// Why a host cannot take a volume.
fn refusal(state: &DiskState, req: &VolumeRequest) -> Option<String> {
    let free_gb = state.disk_gb.saturating_sub(state.used_gb);
    if req.size_gb > free_gb {
        return Some(format!(
            "insufficient disk: {} GB requested, {free_gb} GB free",
            req.size_gb
        ));
    }
    if req.require_unique_zone && state.same_name > 0 {
        return Some(
            "already holds a volume of this name (require_unique_zone spreads them)".into(),
        );
    }
    if let Some(c) = req.compute {
        if c.memory_mb > state.free.memory_mb || c.cpus > state.free.cpus {
            return Some(format!(
                "cannot also fit the compute hint ({} cpus / {} MB; {} cpus / {} MB free)",
                c.cpus, c.memory_mb, state.free.cpus, state.free.memory_mb
            ));
        }
    }
    None
}

/// A host's decision from its exact state: a score (higher is better: the share of its
/// disk left free, less 1 per same-name volume held) or why it refuses.
pub fn check_volume(state: &DiskState, req: &VolumeRequest) -> Result<f64, String> {
    if let Some(reason) = refusal(state, req) {
        return Err(reason);
    }
    let left = state.disk_gb.saturating_sub(state.used_gb + req.size_gb) as f64;
    let share = if state.disk_gb == 0 {
        0.0
    } else {
        left / state.disk_gb as f64
    };
    Ok(share - state.same_name as f64)
}

/// Hosts of `regions` that may take the volume, best first, and why the others may not.
pub fn volume_candidates<'a>(
    hosts: &'a [VolumeCandidate],
    regions: &[String],
    req: &VolumeRequest,
) -> (Vec<&'a VolumeCandidate>, Vec<Exclusion>) {
    let mut ok: Vec<(&VolumeCandidate, f64)> = Vec::new();
    let mut excluded = Vec::new();
    for h in hosts.iter().filter(|h| regions.contains(&h.host.region)) {
        let state = DiskState {
            disk_gb: h.disk_gb,
            used_gb: h.disk_gb.saturating_sub(h.disk_free_gb),
            same_name: h.same_name,
            free: h.host.free,
        };
        let verdict = if !h.host.alive {
            Err("host is not alive".to_string())
        } else if h.host.draining {
            Err("host is draining".to_string())
        } else {
            check_volume(&state, req)
        };
        match verdict {
            Ok(score) => ok.push((h, score)),
            Err(reason) => excluded.push(Exclusion {
                host_id: h.host.host_id.clone(),
                reason,
            }),
        }
    }
    ok.sort_by(|(a, sa), (b, sb)| {
        sb.partial_cmp(sa)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then_with(|| a.host.host_id.cmp(&b.host.host_id))
    });
    (ok.into_iter().map(|(h, _)| h).collect(), excluded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn host(id: &str, disk_gb: u64, disk_free_gb: u64, same_name: usize) -> VolumeCandidate {
        VolumeCandidate {
            host: Candidate {
                host_id: id.into(),
                region: "ams".into(),
                capacity: Resources {
                    cpus: 8,
                    memory_mb: 8192,
                },
                free: Resources {
                    cpus: 8,
                    memory_mb: 4096,
                },
                alive: true,
                draining: false,
                labels: BTreeMap::new(),
            },
            disk_gb,
            disk_free_gb,
            same_name,
        }
    }

    fn ids(v: &[&VolumeCandidate]) -> Vec<String> {
        v.iter().map(|h| h.host.host_id.clone()).collect()
    }

    const AMS: &[&str] = &["ams"];

    fn regions() -> Vec<String> {
        AMS.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_host_with_the_most_disk_left_wins() {
        let hosts = vec![
            host("a", 100, 20, 0),
            host("b", 100, 90, 0),
            host("c", 10, 9, 0),
        ];
        let req = VolumeRequest {
            size_gb: 5,
            require_unique_zone: true,
            ..Default::default()
        };
        let (ok, ex) = volume_candidates(&hosts, &regions(), &req);
        assert_eq!(ids(&ok), vec!["b", "c", "a"], "by share of disk left");
        assert!(ex.is_empty());
        let big = VolumeRequest { size_gb: 50, ..req };
        let (ok, ex) = volume_candidates(&hosts, &regions(), &big);
        assert_eq!(ids(&ok), vec!["b"]);
        assert!(ex
            .iter()
            .any(|e| e.host_id == "a" && e.reason.contains("20 GB free")));
    }

    #[test]
    fn unique_zone_excludes_hosts_holding_the_name_or_ranks_them_last() {
        let hosts = vec![host("a", 100, 100, 1), host("b", 100, 10, 0)];
        let req = VolumeRequest {
            size_gb: 1,
            require_unique_zone: true,
            ..Default::default()
        };
        let (ok, ex) = volume_candidates(&hosts, &regions(), &req);
        assert_eq!(ids(&ok), vec!["b"], "a holds one already");
        assert!(ex[0].reason.contains("require_unique_zone"));
        let relaxed = VolumeRequest {
            require_unique_zone: false,
            ..req
        };
        let (ok, _) = volume_candidates(&hosts, &regions(), &relaxed);
        assert_eq!(ids(&ok), vec!["b", "a"], "emptier but already holding one");
        let all_hold = vec![host("a", 100, 100, 1), host("b", 100, 100, 2)];
        let (ok, ex) = volume_candidates(&all_hold, &regions(), &req);
        assert!(ok.is_empty());
        assert_eq!(ex.len(), 2);
    }

    #[test]
    fn the_compute_hint_must_fit_too() {
        let hosts = vec![host("a", 100, 100, 0)];
        let req = VolumeRequest {
            size_gb: 1,
            compute: Some(Resources {
                cpus: 1,
                memory_mb: 8192,
            }),
            require_unique_zone: true,
        };
        let (ok, ex) = volume_candidates(&hosts, &regions(), &req);
        assert!(ok.is_empty());
        assert!(ex[0].reason.contains("compute hint"));
        let fits = VolumeRequest {
            compute: Some(Resources {
                cpus: 1,
                memory_mb: 1024,
            }),
            ..req
        };
        assert_eq!(volume_candidates(&hosts, &regions(), &fits).0.len(), 1);
    }

    #[test]
    fn hosts_decide_from_exact_state() {
        let state = DiskState {
            disk_gb: 10,
            used_gb: 8,
            same_name: 0,
            free: Resources {
                cpus: 1,
                memory_mb: 256,
            },
        };
        let req = VolumeRequest {
            size_gb: 2,
            require_unique_zone: true,
            ..Default::default()
        };
        assert_eq!(check_volume(&state, &req), Ok(0.0));
        let too_big = VolumeRequest { size_gb: 3, ..req };
        assert!(check_volume(&state, &too_big)
            .unwrap_err()
            .contains("insufficient disk"));
        let taken = DiskState {
            same_name: 1,
            ..state
        };
        assert!(check_volume(&taken, &req).is_err());
        let mut dead = vec![host("a", 100, 100, 0)];
        dead[0].host.alive = false;
        assert!(volume_candidates(&dead, &regions(), &req).0.is_empty());
    }
}
