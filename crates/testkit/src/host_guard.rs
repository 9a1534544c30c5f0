//! A watch on host files no test may change: the owner and mode of `/dev/null`, `/tmp`,
//! `/etc/passwd` and their like, taken when a test agent starts and compared when it is
//! dropped (after everything it made on the host is released). A change fails that test,
//! naming the path with its owner and mode before and after, so the suite finds the
//! culprit (issue 31: `/dev/null` was once found owned by `nobody:nogroup` after a run).
//! Agents of other tests run alongside on the same host, so a change is the work of one
//! of the agents alive at the time, most likely the one whose test failed.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

/// Host paths whose owner and mode no machine, agent or test may change.
pub const WATCHED: &[&str] = &[
    "/",
    "/dev",
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/shm",
    "/dev/net/tun",
    "/dev/loop-control",
    "/tmp",
    "/var/tmp",
    "/run",
    "/etc",
    "/etc/passwd",
    "/etc/group",
    "/etc/shadow",
    "/etc/hosts",
    "/etc/resolv.conf",
    "/usr",
    "/usr/bin",
    "/usr/sbin",
    "/bin",
    "/sbin",
    "/root",
    "/home",
];

/// Owner, group and mode (file type and permission bits) of a path, not following a
/// symlink; `None` when it does not exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
}

impl std::fmt::Display for Stat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{} mode {:o}", self.uid, self.gid, self.mode)
    }
}

fn stat(path: &std::path::Path) -> Option<Stat> {
    std::fs::symlink_metadata(path).ok().map(|m| Stat {
        uid: m.uid(),
        gid: m.gid(),
        mode: m.mode(),
    })
}

/// The owner and mode of some host paths as they were when it was made.
#[derive(Debug, Clone)]
pub struct HostGuard {
    before: Vec<(PathBuf, Option<Stat>)>,
}

impl HostGuard {
    /// Takes the owner and mode of every path of [`WATCHED`].
    pub fn new() -> HostGuard {
        HostGuard::over(WATCHED.iter().map(PathBuf::from))
    }

    /// Takes the owner and mode of `paths`.
    pub fn over(paths: impl IntoIterator<Item = PathBuf>) -> HostGuard {
        HostGuard {
            before: paths.into_iter().map(|p| (p.clone(), stat(&p))).collect(),
        }
    }

    /// Every path whose owner or mode changed since, with how (one line each); an error
    /// when any did.
    pub fn check(&self) -> Result<(), String> {
        let show = |s: &Option<Stat>| s.map_or("missing".to_owned(), |s| s.to_string());
        let changed: Vec<String> = self
            .before
            .iter()
            .filter_map(|(path, before)| {
                let now = stat(path);
                (now != *before).then(|| {
                    format!(
                        "{}: was {}, now {}",
                        path.display(),
                        show(before),
                        show(&now)
                    )
                })
            })
            .collect();
        if changed.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "host files changed while this test's agents ran:\n  {}",
                changed.join("\n  ")
            ))
        }
    }
}

impl Default for HostGuard {
    fn default() -> Self {
        HostGuard::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_change_of_mode_or_owner_is_reported_with_the_path_and_both_states() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("null");
        std::fs::write(&file, b"").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
        let guard = HostGuard::over([file.clone(), tmp.path().to_path_buf()]);
        assert_eq!(guard.check(), Ok(()));
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let err = guard.check().unwrap_err();
        assert!(err.contains(&format!("{}: was ", file.display())), "{err}");
        assert!(
            err.contains("mode 100666, now ") && err.contains("mode 100600"),
            "{err}"
        );
        assert!(
            !err.contains(&format!("{}:", tmp.path().display())),
            "{err}"
        );
        if rustix_is_root() {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
            std::os::unix::fs::chown(&file, Some(65534), Some(65534)).unwrap();
            let err = guard.check().unwrap_err();
            assert!(err.contains("now 65534:65534 mode 100666"), "{err}");
        }
        std::fs::remove_file(&file).unwrap();
        assert!(guard.check().unwrap_err().contains("now missing"));
    }

    fn rustix_is_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }
}
