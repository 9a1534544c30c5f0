//! `bazaar image push ARCHIVE NAME[:TAG]`: an image built elsewhere (a `docker save` or
//! OCI-layout archive, as `bazaar image import` reads) pushed into the cluster's registry
//! through the agent at `BAZAAR_API_URL` (`/v2` on its API port) with a Machines API token
//! of the app (`BAZAAR_TOKEN`). Machines then run it as
//! `registry.bazaar.internal/NAME@DIGEST` (or `:TAG`), and every host pulls it from its peers.

use anyhow::{bail, Context};
use bazaar_image::{Auth, ImageStore, Registry, StoreOptions};
use std::path::Path;

/// The repository and tag of `name` (`<app>[/<path>][:<tag>]`; the tag defaults to
/// `latest`).
pub fn parse_name(name: &str) -> anyhow::Result<(String, String)> {
    let (repo, tag) = match name.rsplit_once(':') {
        Some((r, t)) if !t.contains('/') => (r, t),
        _ => (name, "latest"),
    };
    let repo = repo
        .strip_prefix(&format!("{}/", bazaar_image::peers::CLUSTER_REGISTRY))
        .unwrap_or(repo);
    if !bazaar_registry::protocol::valid_name(repo) {
        bail!("{repo:?} is not a repository of the cluster's registry: <app> or <app>/<path>, lowercase");
    }
    if !bazaar_registry::protocol::valid_tag(tag) {
        bail!("{tag:?} is not a valid tag");
    }
    Ok((repo.to_string(), tag.to_string()))
}

/// Pushes the one image of `archive` as `name`; answers the reference machines run it by.
pub async fn push(
    api_url: &str,
    token: &str,
    archive: &Path,
    name: &str,
) -> anyhow::Result<String> {
    let (repo, tag) = parse_name(name)?;
    let (scheme, rest) = api_url
        .split_once("://")
        .context("the API URL must be http://HOST:PORT or https://HOST:PORT")?;
    let host = rest.split('/').next().unwrap_or(rest);
    let scratch = tempfile::Builder::new().prefix("bazaar-push-").tempdir()?;
    let store = ImageStore::open(scratch.path(), StoreOptions::default())?;
    let mut images = store
        .read_archive(archive)
        .await
        .with_context(|| format!("reading {}", archive.display()))?;
    let image = match images.len() {
        1 => images.remove(0),
        n => bail!(
            "{} holds {n} images; push an archive of one",
            archive.display()
        ),
    };
    let auth = Auth::Basic {
        username: "x".into(),
        password: token.into(),
    };
    let registry = Registry::new(host, auth, scheme == "http")?;
    for (i, layer) in image.manifest.layers.iter().enumerate() {
        eprintln!(
            "layer {}/{} {} ({} bytes)",
            i + 1,
            image.manifest.layers.len(),
            layer.digest,
            layer.size
        );
        registry
            .push_blob_file(&repo, &store.blob_path(&layer.digest), &layer.digest)
            .await?;
    }
    registry.push_blob(&repo, &image.config_bytes).await?;
    let media_type = image
        .manifest
        .media_type
        .clone()
        .unwrap_or_else(|| bazaar_image::manifest::OCI_MANIFEST.to_string());
    let digest = registry
        .push_manifest(&repo, &tag, &media_type, &image.manifest_bytes)
        .await?;
    Ok(format!(
        "{}/{repo}@{digest}",
        bazaar_image::peers::CLUSTER_REGISTRY
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_an_apps_repository_with_a_tag() {
        assert_eq!(parse_name("web").unwrap(), ("web".into(), "latest".into()));
        assert_eq!(
            parse_name("web/base:v2").unwrap(),
            ("web/base".into(), "v2".into())
        );
        assert_eq!(
            parse_name("registry.bazaar.internal/web:1").unwrap(),
            ("web".into(), "1".into())
        );
        assert!(parse_name("Web:1").is_err());
        assert!(parse_name("docker.io/library/busybox").is_err());
        assert!(parse_name("web:bad tag").is_err());
    }
}
