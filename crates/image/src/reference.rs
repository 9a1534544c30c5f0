//! Image references, `[registry[:port]/]repo[:tag][@sha256:digest]`, with Docker's defaults
//! (`docker.io`, `library/`, `latest`).

use crate::digest::Digest;
use crate::error::{Error, Result};
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// Docker Hub's name in references.
pub const DOCKER_HUB: &str = "docker.io";

/// A parsed, normalised image reference.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    /// Registry host, with its port if any (`docker.io`, `127.0.0.1:5000`).
    pub registry: String,
    /// Repository path inside the registry (`library/busybox`).
    pub repository: String,
    /// Tag; `latest` when neither a tag nor a digest was given.
    pub tag: Option<String>,
    /// Digest; when present, it is what is pulled (the tag is informative).
    pub digest: Option<Digest>,
}

impl Reference {
    /// What to ask the registry for: the digest if any, else the tag.
    pub fn target(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => d.to_string(),
            (None, Some(t)) => t.clone(),
            (None, None) => "latest".into(),
        }
    }
}

/// Whether `host[:port]` names this machine: `localhost`, `127.0.0.0/8` or `[::1]`.
pub fn is_loopback_host(registry: &str) -> bool {
    let host = if let Some(rest) = registry.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        registry.split(':').next().unwrap_or("")
    };
    host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

pub(crate) fn valid_repository(repo: &str) -> bool {
    repo.split('/').all(|part| {
        let b = part.as_bytes();
        !b.is_empty()
            && b.first().is_some_and(u8::is_ascii_alphanumeric)
            && b.last().is_some_and(u8::is_ascii_alphanumeric)
            && b.iter()
                .all(|c| matches!(c, b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-'))
    })
}

fn valid_tag(tag: &str) -> bool {
    let b = tag.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

impl FromStr for Reference {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = |why| Error::Reference(s.into(), why);
        let (rest, digest) = match s.split_once('@') {
            Some((rest, d)) => (rest, Some(d.parse::<Digest>()?)),
            None => (s, None),
        };
        let (name, tag) = match rest.rfind(':') {
            Some(i) if !rest[i..].contains('/') => (&rest[..i], Some(&rest[i + 1..])),
            _ => (rest, None),
        };
        if let Some(t) = tag {
            if !valid_tag(t) {
                return Err(bad("bad tag"));
            }
        }
        let (registry, repository) = match name.split_once('/') {
            Some((first, path))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first.to_string(), path.to_string())
            }
            _ => (DOCKER_HUB.to_string(), name.to_string()),
        };
        let registry = if registry == "index.docker.io" {
            DOCKER_HUB.to_string()
        } else {
            registry
        };
        let repository = if registry == DOCKER_HUB && !repository.contains('/') {
            format!("library/{repository}")
        } else {
            repository
        };
        if registry.is_empty() || registry.contains(['/', '@', ' ']) {
            return Err(bad("bad registry"));
        }
        if !valid_repository(&repository) {
            return Err(bad(
                "repository must be lowercase letters, digits and . _ - separated by /",
            ));
        }
        let tag = match (tag, &digest) {
            (Some(t), _) => Some(t.to_string()),
            (None, Some(_)) => None,
            (None, None) => Some("latest".into()),
        };
        Ok(Reference {
            registry,
            repository,
            tag,
            digest,
        })
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(s: &str) -> Reference {
        s.parse().unwrap()
    }

    #[test]
    fn docker_defaults() {
        assert_eq!(r("busybox").to_string(), "docker.io/library/busybox:latest");
        assert_eq!(r("foo/bar:1.2").to_string(), "docker.io/foo/bar:1.2");
        assert_eq!(
            r("index.docker.io/library/nginx").to_string(),
            "docker.io/library/nginx:latest"
        );
        let x = r("localhost/x");
        assert_eq!(
            (x.registry.as_str(), x.repository.as_str()),
            ("localhost", "x")
        );
    }

    #[test]
    fn registry_port_tag_digest() {
        let d = Digest::of(b"m");
        let x = r(&format!("127.0.0.1:5000/a/b:v1@{d}"));
        assert_eq!(x.registry, "127.0.0.1:5000");
        assert_eq!(x.repository, "a/b");
        assert_eq!(x.tag.as_deref(), Some("v1"));
        assert_eq!(x.digest.as_ref(), Some(&d));
        assert_eq!(x.target(), d.to_string());
        let y = r(&format!("ghcr.io/o/p@{d}"));
        assert_eq!(y.tag, None);
        assert_eq!(y.to_string(), format!("ghcr.io/o/p@{d}"));
        assert_eq!(r("host:5000/p").tag.as_deref(), Some("latest"));
        assert_eq!(r("host:5000/p").registry, "host:5000");
    }

    #[test]
    fn rejects_bad() {
        for s in [
            "",
            "UPPER",
            "a//b",
            "a:",
            "a:b c",
            "a@sha256:12",
            "-a",
            "a/b:..x/",
        ] {
            assert!(s.parse::<Reference>().is_err(), "{s}");
        }
    }

    #[test]
    fn loopback() {
        assert!(is_loopback_host("127.0.0.1:5000"));
        assert!(is_loopback_host("127.8.9.1"));
        assert!(is_loopback_host("localhost:80"));
        assert!(is_loopback_host("[::1]:5000"));
        assert!(!is_loopback_host("docker.io"));
        assert!(!is_loopback_host("10.0.0.1:5000"));
    }
}
