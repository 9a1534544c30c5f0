//! The crate's error type.

use crate::digest::Digest;
use std::path::PathBuf;

/// What can go wrong with images.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An image reference or digest that does not parse.
    #[error("invalid image reference {0:?}: {1}")]
    Reference(String, &'static str),
    /// A digest string that is not `sha256:<64 hex>`.
    #[error("invalid digest {0:?} (want sha256:<64 hex digits>)")]
    Digest(String),
    /// Content whose sha256 is not the one it was asked for by.
    #[error("{what} {expected}: content has digest {actual}")]
    DigestMismatch {
        what: &'static str,
        expected: Digest,
        actual: Digest,
    },
    /// The registry answered with an unexpected status.
    #[error("registry {url}: {status}{}", if .body.is_empty() { String::new() } else { format!(": {}", .body) })]
    Registry {
        url: String,
        status: u16,
        body: String,
    },
    /// Transport errors talking to a registry (with their causes: "Connection refused", a
    /// name that does not resolve, ...).
    #[error("registry request {url}: {}", causes(.source))]
    Http {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// A registry this host does not pull from (a loopback, private or link-local
    /// address the operator did not allow: [`crate::egress`]).
    #[error("{0}")]
    Egress(String),
    /// The registry asked for credentials in a way this client cannot answer.
    #[error("registry {url}: authentication failed: {reason}")]
    Auth { url: String, reason: String },
    /// A manifest, index or config that is malformed or not supported.
    #[error("image {0}")]
    Manifest(String),
    /// An index without an entry for this host's platform.
    #[error("image {reference} has no manifest for platform {platform} (has: {available})")]
    NoPlatform {
        reference: String,
        platform: String,
        available: String,
    },
    /// A layer that would write outside its directory, or holds what layers may not hold.
    #[error("layer {layer}: entry {entry:?} rejected: {reason}")]
    UnsafeLayer {
        layer: String,
        entry: String,
        reason: String,
    },
    /// An image archive (`docker save`, OCI layout) that cannot be read.
    #[error("archive {path}: {reason}")]
    Archive { path: PathBuf, reason: String },
    /// No image record for a reference.
    #[error("image {0} is not in the store")]
    NotFound(String),
    /// The image gives nothing to run and the machine's `init` does not either.
    #[error("image {0} has no Entrypoint or Cmd and init gives no command")]
    NoCommand(String),
    /// File system errors, with the path they happened on.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Attaches a path to an `io::Error`.
pub(crate) trait IoContext<T> {
    fn at(self, path: impl Into<PathBuf>) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn at(self, path: impl Into<PathBuf>) -> Result<T> {
        self.map_err(|source| Error::Io {
            path: path.into(),
            source,
        })
    }
}

impl<T> IoContext<T> for rustix::io::Result<T> {
    fn at(self, path: impl Into<PathBuf>) -> Result<T> {
        self.map_err(|e| Error::Io {
            path: path.into(),
            source: e.into(),
        })
    }
}

/// An error and its sources, `outer: inner: ...` (reqwest's own message alone says only
/// "error sending request").
fn causes(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut next = err.source();
    while let Some(e) = next {
        let more = e.to_string();
        if !text.contains(&more) {
            text += &format!(": {more}");
        }
        next = e.source();
    }
    text
}
