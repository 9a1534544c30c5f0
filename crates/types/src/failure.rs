//! Why a machine could not be launched, as a kind callers can act on: a full disk, a missing
//! image or command, a permission problem, a busy resource, a bad config, or another I/O
//! error. The runtime and the shim classify their errors into a [`FailureKind`] (from the
//! errno where there is one); machine events carry it ([`Failure`] in an event's `request`)
//! and an API answer maps it to its HTTP status ([`FailureKind::http_status`]).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The kind of a launch failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// A disk or quota is full (`ENOSPC`, `EDQUOT`): the machine's own disk, the image
    /// store or the host's.
    NoSpace,
    /// Something named does not exist: the image, the command, a file or directory.
    NotFound,
    /// Refused by the kernel or the registry (`EACCES`, `EPERM`, an authentication failure).
    Permission,
    /// A resource is held or exhausted for now (`EBUSY`, `EAGAIN`, no free loop device,
    /// a run directory a live shim holds, a timeout).
    Busy,
    /// The machine's config or image cannot run as given (a bad user, a file path, an
    /// image without a command): the same request fails again.
    Config,
    /// This host cannot run such a machine (no runc, no machine network).
    Unsupported,
    /// Any other error of the system or the network.
    Io,
}

impl FailureKind {
    /// Every kind, in the order of the enum.
    pub const ALL: [FailureKind; 7] = [
        FailureKind::NoSpace,
        FailureKind::NotFound,
        FailureKind::Permission,
        FailureKind::Busy,
        FailureKind::Config,
        FailureKind::Unsupported,
        FailureKind::Io,
    ];

    /// How the kind is spelled on the wire (`no_space`, `not_found`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::NoSpace => "no_space",
            FailureKind::NotFound => "not_found",
            FailureKind::Permission => "permission",
            FailureKind::Busy => "busy",
            FailureKind::Config => "config",
            FailureKind::Unsupported => "unsupported",
            FailureKind::Io => "io",
        }
    }

    /// Whether the same launch may succeed later or on another host without a change to
    /// the machine: a full disk, a busy resource, an unsupported host and a passing I/O
    /// error may; a missing image, a permission problem or a bad config will not.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            FailureKind::NoSpace | FailureKind::Busy | FailureKind::Unsupported | FailureKind::Io
        )
    }

    /// The HTTP status an API answer gives a launch that failed so: 507 for a full disk,
    /// 503 for a busy or unsupported host, 404 for what is missing, 403 for a permission
    /// problem, 422 for a config that cannot run, 500 otherwise.
    pub fn http_status(self) -> u16 {
        match self {
            FailureKind::NoSpace => 507,
            FailureKind::Busy | FailureKind::Unsupported => 503,
            FailureKind::NotFound => 404,
            FailureKind::Permission => 403,
            FailureKind::Config => 422,
            FailureKind::Io => 500,
        }
    }

    /// The kind of an OS error number.
    pub fn of_errno(errno: i32) -> FailureKind {
        // Linux errno values (the crate has no libc): ENOSPC 28, EDQUOT 122, ENOENT 2,
        // ENOTDIR 20, ENXIO 6, EACCES 13, EPERM 1, EROFS 30, EBUSY 16, EAGAIN 11,
        // ETXTBSY 26, EMFILE 24, ENFILE 23, ENOMEM 12, EINVAL 22, ELOOP 40, EISDIR 21.
        match errno {
            28 | 122 => FailureKind::NoSpace,
            2 | 20 | 6 => FailureKind::NotFound,
            13 | 1 | 30 => FailureKind::Permission,
            16 | 11 | 26 | 24 | 23 | 12 => FailureKind::Busy,
            40 | 21 => FailureKind::Config,
            _ => FailureKind::Io,
        }
    }

    /// The kind of an I/O error: from its errno, else from its [`std::io::ErrorKind`].
    pub fn of_io(err: &std::io::Error) -> FailureKind {
        use std::io::ErrorKind as K;
        if let Some(errno) = err.raw_os_error() {
            return FailureKind::of_errno(errno);
        }
        match err.kind() {
            K::NotFound => FailureKind::NotFound,
            K::PermissionDenied | K::ReadOnlyFilesystem => FailureKind::Permission,
            K::StorageFull | K::QuotaExceeded => FailureKind::NoSpace,
            K::ResourceBusy | K::WouldBlock | K::TimedOut => FailureKind::Busy,
            K::InvalidInput | K::InvalidData => FailureKind::Config,
            _ => FailureKind::Io,
        }
    }
}

impl std::fmt::Display for FailureKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// bazaar extension, in a failed launch's `exit` event (`request.failure`): what kind of
/// failure, at which step of the launch, and whether trying again may succeed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Failure {
    pub kind: FailureKind,
    /// The launch step that failed (`network`, `work_disk`, `image`, `layer`, `rootfs`,
    /// `files`, `bundle`, `spawn`, `workload`, `container`, ...).
    pub step: String,
    /// [`FailureKind::retryable`].
    pub retryable: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_told_apart_by_their_errno() {
        let kind = |errno| FailureKind::of_io(&std::io::Error::from_raw_os_error(errno));
        assert_eq!(kind(28), FailureKind::NoSpace);
        assert_eq!(kind(2), FailureKind::NotFound);
        assert_eq!(kind(13), FailureKind::Permission);
        assert_eq!(kind(16), FailureKind::Busy);
        assert_eq!(kind(5), FailureKind::Io);
        assert!(FailureKind::NoSpace.retryable() && !FailureKind::NotFound.retryable());
        assert_eq!(
            serde_json::to_string(&FailureKind::NoSpace).unwrap(),
            "\"no_space\""
        );
        for k in FailureKind::ALL {
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
        }
    }
}
