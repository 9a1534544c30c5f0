//! The error of a machine's launch ([`LaunchError`]): at which step it failed, what kind of
//! failure it is (a full disk, a missing image or command, a permission problem, a busy
//! resource, a bad config: [`FailureKind`]) and whether trying again may succeed, with the
//! message that was always shown. The agent records the kind and step in the machine's
//! `exit` event (`request.failure`) and answers with the kind's HTTP status.

use bazaar_shim::{Fault, ShimError};
use bazaar_types::failure::{Failure, FailureKind};

/// The step of a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LaunchStep {
    /// The run directory, the app's secrets: before anything of the machine's.
    Prepare,
    /// The machine's network namespace and address.
    Network,
    /// A process machine's work disk (a loop-mounted ext4 of its size).
    WorkDisk,
    /// Handing the work directory and volume to the machine's user.
    Ownership,
    /// `config.files`.
    Files,
    /// The image: found in the store or pulled.
    Image,
    /// An image machine's writable layer (its own disk).
    Layer,
    /// An image machine's root filesystem, its user and its `/etc` files.
    Rootfs,
    /// The OCI bundle (`config.json`) and the volume's ids.
    Bundle,
    /// Starting the shim.
    Spawn,
    /// The workload itself (the shim could not exec it).
    Workload,
    /// runc creating the container.
    Container,
}

impl LaunchStep {
    /// How the step is named in events (`request.failure.step`).
    pub fn as_str(self) -> &'static str {
        match self {
            LaunchStep::Prepare => "prepare",
            LaunchStep::Network => "network",
            LaunchStep::WorkDisk => "work_disk",
            LaunchStep::Ownership => "ownership",
            LaunchStep::Files => "files",
            LaunchStep::Image => "image",
            LaunchStep::Layer => "layer",
            LaunchStep::Rootfs => "rootfs",
            LaunchStep::Bundle => "bundle",
            LaunchStep::Spawn => "spawn",
            LaunchStep::Workload => "workload",
            LaunchStep::Container => "container",
        }
    }
}

impl std::fmt::Display for LaunchStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a launch failed. Its `Display` is the message alone (`command not found: x`,
/// `making the machine's 64 MB work disk: No space left on device (os error 28)`), as
/// events and logs have always shown it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct LaunchError {
    pub step: LaunchStep,
    pub kind: FailureKind,
    pub message: String,
}

impl LaunchError {
    pub fn new(step: LaunchStep, kind: FailureKind, message: impl Into<String>) -> LaunchError {
        LaunchError {
            step,
            kind,
            message: message.into(),
        }
    }

    /// An I/O error at `step` while doing `context`.
    pub fn io(step: LaunchStep, context: impl std::fmt::Display, err: &std::io::Error) -> Self {
        LaunchError::new(step, FailureKind::of_io(err), format!("{context}: {err}"))
    }

    /// An error of the image crate at `step` ([`image_kind`]), its message prefixed with
    /// `context: ` unless that is empty.
    pub fn image(step: LaunchStep, context: &str, err: &bazaar_image::Error) -> Self {
        let message = if context.is_empty() {
            err.to_string()
        } else {
            format!("{context}: {err}")
        };
        LaunchError::new(step, image_kind(err), message)
    }

    /// A shim error at `step`: a workload the shim could not exec is the `workload` step.
    pub fn shim(step: LaunchStep, err: ShimError) -> Self {
        let step = match err {
            ShimError::Launch(_) if step == LaunchStep::Spawn => LaunchStep::Workload,
            _ => step,
        };
        let kind = err.kind();
        let message = match err {
            ShimError::Launch(m) => m,
            other => other.to_string(),
        };
        LaunchError::new(step, kind, message)
    }

    /// A [`Fault`] at `step`.
    pub fn fault(step: LaunchStep, fault: Fault) -> Self {
        LaunchError::new(step, fault.kind, fault.message)
    }

    /// [`FailureKind::retryable`].
    pub fn retryable(&self) -> bool {
        self.kind.retryable()
    }

    /// What a machine event says of it (`request.failure`).
    pub fn failure(&self) -> Failure {
        Failure {
            kind: self.kind,
            step: self.step.as_str().into(),
            retryable: self.retryable(),
        }
    }
}

/// The kind of an image error: a registry's 404 or an image missing from the store is
/// not found, a refused authentication permission, a registry's 429 or 5xx busy, a bad
/// reference, manifest or layer a config error, a file system error by its errno.
pub fn image_kind(err: &bazaar_image::Error) -> FailureKind {
    use bazaar_image::Error as E;
    match err {
        E::Registry { status, .. } => match status {
            404 => FailureKind::NotFound,
            401 | 403 => FailureKind::Permission,
            429 | 500..=599 => FailureKind::Busy,
            _ => FailureKind::Io,
        },
        E::NotFound(_) => FailureKind::NotFound,
        E::Auth { .. } | E::Egress(_) => FailureKind::Permission,
        E::Reference(..)
        | E::Digest(_)
        | E::Manifest(_)
        | E::NoPlatform { .. }
        | E::UnsafeLayer { .. }
        | E::Archive { .. }
        | E::NoCommand(_) => FailureKind::Config,
        E::Io { source, .. } => FailureKind::of_io(source),
        E::Http { .. } | E::DigestMismatch { .. } => FailureKind::Io,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workload_the_shim_could_not_exec_is_told_apart_from_a_spawn_failure() {
        let e = LaunchError::shim(
            LaunchStep::Spawn,
            ShimError::Launch("command not found: nope".into()),
        );
        assert_eq!(
            (e.step, e.kind, e.to_string().as_str()),
            (
                LaunchStep::Workload,
                FailureKind::NotFound,
                "command not found: nope"
            )
        );
        let e = LaunchError::shim(
            LaunchStep::Spawn,
            ShimError::Launch("permission denied: /bin/x".into()),
        );
        assert_eq!(e.kind, FailureKind::Permission);
        assert!(!e.retryable());
        let e = LaunchError::shim(
            LaunchStep::Spawn,
            ShimError::Busy(std::path::PathBuf::from("/run/x")),
        );
        assert_eq!((e.step, e.kind), (LaunchStep::Spawn, FailureKind::Busy));
        assert!(e.retryable());
    }

    #[test]
    fn a_missing_image_is_not_found_and_a_busy_registry_is_retryable() {
        let missing = bazaar_image::Error::Registry {
            url: "http://r/v2/x/manifests/latest".into(),
            status: 404,
            body: String::new(),
        };
        let e = LaunchError::image(LaunchStep::Image, "pulling r/x", &missing);
        assert_eq!(e.kind, FailureKind::NotFound);
        assert_eq!(e.failure().step, "image");
        assert!(!e.failure().retryable);
        let busy = bazaar_image::Error::Registry {
            url: "u".into(),
            status: 503,
            body: String::new(),
        };
        assert!(LaunchError::image(LaunchStep::Image, "", &busy).retryable());
    }

    /// A registry that answers every request 404, as one without the image does.
    async fn registry_without_images() -> std::net::SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = conn.read(&mut buf).await;
                    let body =
                        r#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}"#;
                    let answer = format!(
                        "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = conn.write_all(answer.as_bytes()).await;
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn pulling_an_image_the_registry_lacks_is_a_missing_image() {
        let tmp = tempfile::tempdir().unwrap();
        let store = bazaar_image::ImageStore::open(
            tmp.path().join("images"),
            bazaar_image::StoreOptions {
                allow_loopback_registries: true,
                copy_rootfs: true,
                ..Default::default()
            },
        )
        .unwrap();
        let addr = registry_without_images().await;
        let reference: bazaar_image::Reference = format!("127.0.0.1:{}/nope:latest", addr.port())
            .parse()
            .unwrap();
        let err = store
            .pull(&reference, &bazaar_image::Auth::Anonymous, &|_| {})
            .await
            .expect_err("no such image");
        let err = LaunchError::image(LaunchStep::Image, &format!("pulling {reference}"), &err);
        assert_eq!(err.kind, FailureKind::NotFound, "{err}");
        assert_eq!(err.kind.http_status(), 404);
        assert!(!err.retryable());
        assert!(err.to_string().starts_with("pulling 127.0.0.1:"), "{err}");
    }
}
