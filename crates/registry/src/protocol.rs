//! The OCI distribution protocol's rules, pure (no I/O, no clock of its own): which route
//! a `/v2/...` path is ([`Route::parse`]), the error body and status of each error code
//! ([`RegistryError`]), who a request's credentials name ([`credential`]), what operation a
//! request is ([`operation`]), and the rules of an upload's chunks ([`Upload`]).

use axum::http::{Method, StatusCode};
use base64::Engine as _;
use bazaar_auth::Op;
use std::time::Duration;

/// A request of the distribution API, by its path below `/v2`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `/v2/`: the API's version check.
    Base,
    /// `/v2/<name>/blobs/<digest>`.
    Blob { name: String, digest: String },
    /// `/v2/<name>/blobs/uploads/`: starts an upload.
    StartUpload { name: String },
    /// `/v2/<name>/blobs/uploads/<id>`: an upload in progress.
    Upload { name: String, id: String },
    /// `/v2/<name>/manifests/<reference>` (a tag or a digest).
    Manifest { name: String, reference: String },
    /// `/v2/<name>/tags/list`.
    Tags { name: String },
}

impl Route {
    /// The route of `path` (the request's whole path, `/v2/...`): `None` when it is none
    /// of the API's. The repository name may hold `/`, so the path is read from its end.
    pub fn parse(path: &str) -> Option<Route> {
        let rest = path.strip_prefix("/v2")?;
        if rest.is_empty() || rest == "/" {
            return Some(Route::Base);
        }
        let rest = rest.strip_prefix('/')?;
        if let Some(name) = rest.strip_suffix("/tags/list") {
            return Some(Route::Tags { name: name.into() });
        }
        if let Some(name) = rest.strip_suffix("/blobs/uploads/") {
            return Some(Route::StartUpload { name: name.into() });
        }
        if let Some(name) = rest.strip_suffix("/blobs/uploads") {
            return Some(Route::StartUpload { name: name.into() });
        }
        let (head, last) = rest.rsplit_once('/')?;
        if last.is_empty() {
            return None;
        }
        if let Some(name) = head.strip_suffix("/blobs/uploads") {
            return Some(Route::Upload {
                name: name.into(),
                id: last.into(),
            });
        }
        if let Some(name) = head.strip_suffix("/blobs") {
            return Some(Route::Blob {
                name: name.into(),
                digest: last.into(),
            });
        }
        if let Some(name) = head.strip_suffix("/manifests") {
            return Some(Route::Manifest {
                name: name.into(),
                reference: last.into(),
            });
        }
        None
    }

    /// The repository the route names (`None` for [`Route::Base`]).
    pub fn name(&self) -> Option<&str> {
        match self {
            Route::Base => None,
            Route::Blob { name, .. }
            | Route::StartUpload { name }
            | Route::Upload { name, .. }
            | Route::Manifest { name, .. }
            | Route::Tags { name } => Some(name),
        }
    }
}

/// The app a repository belongs to: its first component (`web` of `web` and `web/worker`).
pub fn app_of(name: &str) -> &str {
    name.split('/').next().unwrap_or(name)
}

/// Whether `name` is a repository of this registry: a valid OCI repository name whose first
/// component is an app's name (lowercase letters, digits and dashes, as the Machines API
/// and tokens' scopes take them).
pub fn valid_name(name: &str) -> bool {
    let app = app_of(name);
    bazaar_image::repos::valid_repository(name)
        && app.len() <= 63
        && app
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Whether `tag` is a valid tag (`[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`).
pub fn valid_tag(tag: &str) -> bool {
    let b = tag.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

/// The operation a request needs of the caller's token: reads (`GET`, `HEAD`) need
/// `read`; every push (uploads, manifests) needs `update`, the operation of a deploy's
/// changes to an app.
pub fn operation(method: &Method) -> Op {
    if *method == Method::GET || *method == Method::HEAD {
        Op::Read
    } else {
        Op::Update
    }
}

/// The token of an `Authorization` header: `Bearer <token>`, or `Basic` with the token as
/// the password (what `docker login`, buildah's and podman's `--creds user:TOKEN` send;
/// the user name is ignored).
pub fn credential(authorization: &str) -> Option<String> {
    let (scheme, value) = authorization.trim().split_once(' ')?;
    let value = value.trim();
    if scheme.eq_ignore_ascii_case("bearer") {
        return (!value.is_empty()).then(|| value.to_string());
    }
    if scheme.eq_ignore_ascii_case("basic") {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(value)
            .ok()?;
        let decoded = String::from_utf8(decoded).ok()?;
        let (_, password) = decoded.split_once(':')?;
        return (!password.is_empty()).then(|| password.to_string());
    }
    None
}

/// The challenge a 401 carries: clients answer it with Basic credentials.
pub const CHALLENGE: &str = r#"Basic realm="bazaar""#;

/// The distribution spec's error codes that this registry answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    BlobUnknown,
    BlobUploadInvalid,
    BlobUploadUnknown,
    DigestInvalid,
    ManifestBlobUnknown,
    ManifestInvalid,
    ManifestUnknown,
    NameInvalid,
    NameUnknown,
    SizeInvalid,
    Unauthorized,
    Denied,
    Unsupported,
    TooManyRequests,
    /// The registry failed (its disk): 500.
    Unknown,
}

impl ErrorCode {
    /// Its name in an error body.
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::BlobUnknown => "BLOB_UNKNOWN",
            ErrorCode::BlobUploadInvalid => "BLOB_UPLOAD_INVALID",
            ErrorCode::BlobUploadUnknown => "BLOB_UPLOAD_UNKNOWN",
            ErrorCode::DigestInvalid => "DIGEST_INVALID",
            ErrorCode::ManifestBlobUnknown => "MANIFEST_BLOB_UNKNOWN",
            ErrorCode::ManifestInvalid => "MANIFEST_INVALID",
            ErrorCode::ManifestUnknown => "MANIFEST_UNKNOWN",
            ErrorCode::NameInvalid => "NAME_INVALID",
            ErrorCode::NameUnknown => "NAME_UNKNOWN",
            ErrorCode::SizeInvalid => "SIZE_INVALID",
            ErrorCode::Unauthorized => "UNAUTHORIZED",
            ErrorCode::Denied => "DENIED",
            ErrorCode::Unsupported => "UNSUPPORTED",
            ErrorCode::TooManyRequests => "TOOMANYREQUESTS",
            ErrorCode::Unknown => "UNKNOWN",
        }
    }

    /// Its usual status (an error may carry another: [`RegistryError::with_status`]).
    pub fn status(self) -> StatusCode {
        match self {
            ErrorCode::BlobUnknown
            | ErrorCode::BlobUploadUnknown
            | ErrorCode::ManifestUnknown
            | ErrorCode::NameUnknown => StatusCode::NOT_FOUND,
            ErrorCode::BlobUploadInvalid
            | ErrorCode::DigestInvalid
            | ErrorCode::ManifestBlobUnknown
            | ErrorCode::ManifestInvalid
            | ErrorCode::NameInvalid
            | ErrorCode::SizeInvalid => StatusCode::BAD_REQUEST,
            ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorCode::Denied => StatusCode::FORBIDDEN,
            ErrorCode::Unsupported => StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::TooManyRequests => StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::Unknown => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// An error answer: `{"errors":[{"code","message","detail"}]}` with its status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryError {
    pub code: ErrorCode,
    pub status: StatusCode,
    pub message: String,
}

impl RegistryError {
    /// `code` with its usual status.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> RegistryError {
        RegistryError {
            code,
            status: code.status(),
            message: message.into(),
        }
    }

    /// The same error answered with `status`.
    pub fn with_status(mut self, status: StatusCode) -> RegistryError {
        self.status = status;
        self
    }

    /// An upload or manifest over `limit` bytes: 413.
    pub fn too_large(what: &str, limit: u64) -> RegistryError {
        RegistryError::new(
            ErrorCode::SizeInvalid,
            format!("{what} is over this registry's limit of {limit} bytes"),
        )
        .with_status(StatusCode::PAYLOAD_TOO_LARGE)
    }

    /// The JSON body.
    pub fn body(&self) -> String {
        serde_json::json!({"errors": [{
            "code": self.code.name(),
            "message": self.message,
            "detail": null,
        }]})
        .to_string()
    }
}

/// The answer to a token scoped to other apps, and to a repository nobody pushed to: the
/// same, so a token learns nothing of other apps (as the Machines API's 404).
pub fn name_unknown(name: &str) -> RegistryError {
    RegistryError::new(
        ErrorCode::NameUnknown,
        format!("repository {name} is not known to this registry"),
    )
}

/// An upload in progress: its repository and how many bytes it has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upload {
    pub name: String,
    pub offset: u64,
    /// When it last moved (the shell's clock, in any unit of [`Duration`]).
    pub touched: Duration,
}

/// An upload untouched this long is dropped with its bytes.
pub const UPLOAD_IDLE: Duration = Duration::from_secs(3600);

impl Upload {
    /// Whether `name`'s request may act on this upload (another repository's upload id is
    /// unknown to it).
    pub fn belongs_to(&self, name: &str) -> bool {
        self.name == name
    }

    /// Checks a chunk's `Content-Range` (`<start>-<end>`, inclusive; absent: appended
    /// where the upload is) against the upload: it must start where the upload ends (416
    /// otherwise, with the range the upload has). Answers the most bytes the chunk may
    /// bring under `limit`.
    pub fn accept_chunk(
        &self,
        content_range: Option<&str>,
        limit: u64,
    ) -> Result<u64, RegistryError> {
        if let Some(range) = content_range {
            let parsed = range
                .trim()
                .trim_start_matches("bytes ")
                .trim_start_matches("bytes=")
                .split_once('-')
                .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)));
            let Some((start, end)) = parsed.filter(|(a, b)| a <= b) else {
                return Err(RegistryError::new(
                    ErrorCode::BlobUploadInvalid,
                    format!("bad Content-Range {range:?}"),
                )
                .with_status(StatusCode::RANGE_NOT_SATISFIABLE));
            };
            if start != self.offset {
                return Err(RegistryError::new(
                    ErrorCode::BlobUploadInvalid,
                    format!(
                        "the chunk starts at {start}, the upload has {} bytes",
                        self.offset
                    ),
                )
                .with_status(StatusCode::RANGE_NOT_SATISFIABLE));
            }
            if end >= limit {
                return Err(RegistryError::too_large("the upload", limit));
            }
        }
        if self.offset >= limit {
            return Err(RegistryError::too_large("the upload", limit));
        }
        Ok(limit - self.offset)
    }

    /// The `Range` header of an answer about this upload (`0-<last byte>`; `0-0` when
    /// empty, as Docker's registry says).
    pub fn range(&self) -> String {
        format!("0-{}", self.offset.saturating_sub(1))
    }

    /// Whether it has been idle past [`UPLOAD_IDLE`] at `now`.
    pub fn expired(&self, now: Duration) -> bool {
        now.saturating_sub(self.touched) > UPLOAD_IDLE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_parse_from_their_end_so_names_may_hold_slashes() {
        let d = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert_eq!(Route::parse("/v2/"), Some(Route::Base));
        assert_eq!(Route::parse("/v2"), Some(Route::Base));
        assert_eq!(
            Route::parse(&format!("/v2/web/worker/blobs/{d}")),
            Some(Route::Blob {
                name: "web/worker".into(),
                digest: d.into()
            })
        );
        assert_eq!(
            Route::parse("/v2/web/blobs/uploads/"),
            Some(Route::StartUpload { name: "web".into() })
        );
        assert_eq!(
            Route::parse("/v2/web/blobs/uploads/01ABC"),
            Some(Route::Upload {
                name: "web".into(),
                id: "01ABC".into()
            })
        );
        assert_eq!(
            Route::parse("/v2/a/b/manifests/v1"),
            Some(Route::Manifest {
                name: "a/b".into(),
                reference: "v1".into()
            })
        );
        assert_eq!(
            Route::parse("/v2/web/tags/list"),
            Some(Route::Tags { name: "web".into() })
        );
        assert_eq!(Route::parse("/v2/web/manifests/"), None);
        assert_eq!(Route::parse("/v2/web/other/x"), None);
        assert_eq!(Route::parse("/v1/apps"), None);
    }

    #[test]
    fn names_are_an_app_then_anything() {
        assert!(valid_name("web"));
        assert!(valid_name("web/worker-1"));
        assert_eq!(app_of("web/worker"), "web");
        assert!(!valid_name("Web"));
        assert!(!valid_name("web//x"));
        assert!(!valid_name("web/_blobs"));
        assert!(!valid_name("../etc"));
        assert!(!valid_name(""));
    }

    #[test]
    fn reads_need_read_and_pushes_need_update() {
        assert_eq!(operation(&Method::GET), Op::Read);
        assert_eq!(operation(&Method::HEAD), Op::Read);
        for m in [Method::POST, Method::PATCH, Method::PUT, Method::DELETE] {
            assert_eq!(operation(&m), Op::Update);
        }
    }

    #[test]
    fn the_token_comes_as_bearer_or_as_a_basic_password() {
        assert_eq!(credential("Bearer abc").as_deref(), Some("abc"));
        let basic = base64::engine::general_purpose::STANDARD.encode("x:tok:en");
        assert_eq!(
            credential(&format!("Basic {basic}")).as_deref(),
            Some("tok:en")
        );
        let empty = base64::engine::general_purpose::STANDARD.encode("x:");
        assert_eq!(credential(&format!("Basic {empty}")), None);
        assert_eq!(credential("Basic !!!"), None);
        assert_eq!(credential("Bearer "), None);
        assert_eq!(credential("Digest abc"), None);
    }

    #[test]
    fn errors_have_the_spec_body_and_status() {
        let e = RegistryError::new(ErrorCode::DigestInvalid, "bad");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        let body: serde_json::Value = serde_json::from_str(&e.body()).unwrap();
        assert_eq!(body["errors"][0]["code"], "DIGEST_INVALID");
        assert_eq!(body["errors"][0]["message"], "bad");
        assert_eq!(name_unknown("b").status, StatusCode::NOT_FOUND);
        let big = RegistryError::too_large("the upload", 10);
        assert_eq!(big.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(big.message.contains("10 bytes"), "{}", big.message);
    }

    #[test]
    fn chunks_must_continue_the_upload_and_stay_under_the_limit() {
        let up = Upload {
            name: "web".into(),
            offset: 10,
            touched: Duration::ZERO,
        };
        assert_eq!(up.accept_chunk(None, 100), Ok(90));
        assert_eq!(up.accept_chunk(Some("10-19"), 100), Ok(90));
        let gap = up.accept_chunk(Some("12-19"), 100).unwrap_err();
        assert_eq!(gap.status, StatusCode::RANGE_NOT_SATISFIABLE);
        assert_eq!(gap.code, ErrorCode::BlobUploadInvalid);
        let bad = up.accept_chunk(Some("19-10"), 100).unwrap_err();
        assert_eq!(bad.status, StatusCode::RANGE_NOT_SATISFIABLE);
        let over = up.accept_chunk(Some("10-100"), 100).unwrap_err();
        assert_eq!(over.status, StatusCode::PAYLOAD_TOO_LARGE);
        let full = Upload {
            offset: 100,
            ..up.clone()
        };
        assert_eq!(
            full.accept_chunk(None, 100).unwrap_err().status,
            StatusCode::PAYLOAD_TOO_LARGE
        );
        assert!(up.belongs_to("web") && !up.belongs_to("api"));
        assert_eq!(up.range(), "0-9");
        assert_eq!(
            Upload {
                offset: 0,
                ..up.clone()
            }
            .range(),
            "0-0"
        );
        assert!(!up.expired(UPLOAD_IDLE));
        assert!(up.expired(UPLOAD_IDLE + Duration::from_secs(1)));
    }
}
