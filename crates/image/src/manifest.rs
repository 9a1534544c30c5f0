//! Manifests and indexes, OCI and Docker v2 schema 2, and choosing this host's platform
//! from a multi-arch index.

use crate::digest::Digest;
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// OCI image index (multi-arch).
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// OCI image manifest.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// OCI image config.
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// OCI gzip layer.
pub const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// Docker manifest list (multi-arch).
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
/// Docker image manifest, schema 2.
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// Docker image config.
pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
/// Docker gzip layer.
pub const DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
/// Docker uncompressed layer (as in `docker save`).
pub const DOCKER_LAYER_TAR: &str = "application/vnd.docker.image.rootfs.diff.tar";

/// The `Accept` header for manifest requests: every kind this crate reads.
pub const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
    application/vnd.oci.image.manifest.v1+json, \
    application/vnd.docker.distribution.manifest.list.v2+json, \
    application/vnd.docker.distribution.manifest.v2+json";

/// A pointer to content: its media type, digest and size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub media_type: String,
    pub digest: Digest,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Foreign layers point elsewhere; they are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub urls: Vec<String>,
}

/// An OS/architecture pair (and variant, such as `v8` for arm64).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    pub architecture: String,
    pub os: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

impl Platform {
    /// This host's platform in OCI words (`linux`/`amd64`), from `std::env::consts`.
    pub fn current() -> Platform {
        let (architecture, variant) = match std::env::consts::ARCH {
            "x86_64" => ("amd64", None),
            "x86" => ("386", None),
            "aarch64" => ("arm64", Some("v8")),
            "arm" => ("arm", Some("v7")),
            "powerpc64" => ("ppc64le", None),
            "loongarch64" => ("loong64", None),
            other => (other, None),
        };
        Platform {
            architecture: architecture.into(),
            os: std::env::consts::OS.into(),
            variant: variant.map(Into::into),
        }
    }

    /// Whether an index entry for `other` runs here. A missing variant matches any.
    fn runs(&self, other: &Platform) -> bool {
        self.os == other.os
            && self.architecture == other.architecture
            && match (&self.variant, &other.variant) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

/// An image manifest: its config and its layers, bottom first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
}

/// A multi-arch index (OCI index or Docker manifest list).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Index {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    pub manifests: Vec<Descriptor>,
}

impl Index {
    /// The entry for `platform`, preferring an exact variant match.
    pub fn select(&self, platform: &Platform) -> Option<&Descriptor> {
        let fits = |d: &&Descriptor| d.platform.as_ref().is_some_and(|p| platform.runs(p));
        let exact = self
            .manifests
            .iter()
            .filter(fits)
            .find(|d| d.platform.as_ref().map(|p| &p.variant) == Some(&platform.variant));
        exact.or_else(|| self.manifests.iter().find(fits))
    }

    /// The platforms this index offers, for error messages.
    pub fn platforms(&self) -> String {
        let list: Vec<String> = self
            .manifests
            .iter()
            .filter_map(|d| d.platform.as_ref().map(ToString::to_string))
            .collect();
        list.join(", ")
    }
}

/// A fetched manifest document, told apart by media type.
#[derive(Debug, Clone)]
pub enum Document {
    Index(Index),
    Manifest(Manifest),
}

impl Document {
    /// Parses `bytes` served with `content_type` (or, when that is missing or generic, the
    /// document's own `mediaType`).
    pub fn parse(content_type: Option<&str>, bytes: &[u8]) -> Result<Document> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Probe {
            media_type: Option<String>,
            schema_version: Option<u32>,
            manifests: Option<serde_json::Value>,
        }
        let probe: Probe = serde_json::from_slice(bytes)
            .map_err(|e| Error::Manifest(format!("manifest is not JSON: {}", json_error(&e))))?;
        let kind = content_type
            .map(|c| c.split(';').next().unwrap_or("").trim().to_string())
            .filter(|c| c.starts_with("application/vnd."))
            .or(probe.media_type)
            .unwrap_or_else(|| {
                if probe.manifests.is_some() {
                    OCI_INDEX.into()
                } else {
                    OCI_MANIFEST.into()
                }
            });
        if probe.schema_version == Some(1)
            || kind.starts_with("application/vnd.docker.distribution.manifest.v1")
        {
            return Err(Error::Manifest(
                "uses Docker manifest schema 1, which is not supported".into(),
            ));
        }
        let bad =
            |e: serde_json::Error| Error::Manifest(format!("malformed {kind}: {}", json_error(&e)));
        match kind.as_str() {
            OCI_INDEX | DOCKER_LIST => {
                Ok(Document::Index(serde_json::from_slice(bytes).map_err(bad)?))
            }
            OCI_MANIFEST | DOCKER_MANIFEST => Ok(Document::Manifest(
                serde_json::from_slice(bytes).map_err(bad)?,
            )),
            other => Err(Error::Manifest(format!(
                "has unsupported media type {other}"
            ))),
        }
    }
}

/// A JSON error of a registry's document, without the document's own text: serde names
/// the values it did not expect (`invalid type: string "..."`), and the document may come
/// from a server the caller could not read otherwise (the message lands in machine events).
pub(crate) fn json_error(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let mut out = String::with_capacity(text.len());
    let mut quoted = false;
    for c in text.chars() {
        if c == '"' {
            if !quoted {
                out.push_str("\"…\"");
            }
            quoted = !quoted;
        } else if !quoted {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(arch: &str, variant: Option<&str>) -> Descriptor {
        Descriptor {
            media_type: OCI_MANIFEST.into(),
            digest: Digest::of(arch.as_bytes()),
            size: 1,
            platform: Some(Platform {
                architecture: arch.into(),
                os: "linux".into(),
                variant: variant.map(Into::into),
            }),
            annotations: BTreeMap::new(),
            urls: vec![],
        }
    }

    #[test]
    fn selects_platform() {
        let index = Index {
            schema_version: 2,
            media_type: Some(OCI_INDEX.into()),
            manifests: vec![
                entry("arm", Some("v7")),
                entry("arm64", None),
                entry("amd64", None),
            ],
        };
        let amd64 = Platform {
            architecture: "amd64".into(),
            os: "linux".into(),
            variant: None,
        };
        assert_eq!(index.select(&amd64).unwrap().digest, Digest::of(b"amd64"));
        let arm64 = Platform {
            architecture: "arm64".into(),
            os: "linux".into(),
            variant: Some("v8".into()),
        };
        assert_eq!(index.select(&arm64).unwrap().digest, Digest::of(b"arm64"));
        let arm6 = Platform {
            architecture: "arm".into(),
            os: "linux".into(),
            variant: Some("v6".into()),
        };
        assert!(index.select(&arm6).is_none());
        assert_eq!(Platform::current().os, "linux");
    }

    #[test]
    fn errors_do_not_echo_the_document() {
        for doc in [
            &br#""root:x:0:0:root:/root:/bin/bash""#[..],
            br#"{"schemaVersion": "root:x:0:0"}"#,
            br#"{"mediaType": "application/vnd.oci.image.manifest.v1+json", "config": "root:x:0:0"}"#,
        ] {
            let err = Document::parse(None, doc).expect_err("refused").to_string();
            assert!(!err.contains("root:x"), "{err}");
            assert!(err.contains("\"…\""), "{err}");
        }
    }

    #[test]
    fn parses_by_media_type() {
        let doc = br#"{"schemaVersion":2,"manifests":[]}"#;
        assert!(matches!(
            Document::parse(Some(DOCKER_LIST), doc).unwrap(),
            Document::Index(_)
        ));
        assert!(matches!(
            Document::parse(Some("application/json"), doc).unwrap(),
            Document::Index(_)
        ));
        let v1 = br#"{"schemaVersion":1,"fsLayers":[]}"#;
        assert!(Document::parse(None, v1)
            .unwrap_err()
            .to_string()
            .contains("schema 1"));
    }
}
