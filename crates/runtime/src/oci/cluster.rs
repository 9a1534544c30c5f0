//! Images of the cluster's own registry (`registry.bazaar.internal/<app>/...`,
//! `bazaar_image::peers`) at a launch: a machine runs only its app's, and they are pulled
//! from this host's repositories and its peers rather than from a registry.

use super::OciRuntime;
use crate::launch_error::{LaunchError, LaunchStep};
use bazaar_image::peers::{is_cluster, CLUSTER_REGISTRY};
use bazaar_image::{Image, ProgressFn, Reference};
use bazaar_shim::FailureKind;

/// Refuses a cluster image of another app than the machine's: every host could fetch any
/// app's image from its peers, so the app is checked here, before the store is looked at.
pub(super) fn check_app(reference: &Reference, app: &str) -> Result<(), LaunchError> {
    let repo_app = reference.repository.split('/').next().unwrap_or_default();
    if is_cluster(reference) && repo_app != app {
        return Err(LaunchError::new(
            LaunchStep::Image,
            FailureKind::Permission,
            format!(
                "image {reference}: a machine of app {app} may run only its app's images of the cluster registry ({CLUSTER_REGISTRY}/{app}/...)"
            ),
        ));
    }
    Ok(())
}

/// Pulls `reference`: a cluster image from the peers, any other from its registry. Also
/// answers, for the pull event, the peers that served its blobs (`", from h1, h2"`).
pub(super) async fn pull(
    runtime: &OciRuntime,
    reference: &Reference,
    progress: &ProgressFn<'_>,
) -> Result<(Image, String), bazaar_image::Error> {
    if !is_cluster(reference) {
        let auth = runtime.auth_for(reference);
        let image = runtime.images.pull(reference, &auth, progress).await?;
        return Ok((image, String::new()));
    }
    let peers = runtime.peers.get().map(|p| p.peers()).unwrap_or_default();
    let pulled = runtime
        .images
        .pull_cluster(reference, &peers, progress)
        .await?;
    let mut hosts: Vec<&str> = pulled.sources.iter().map(|(_, h)| h.as_str()).collect();
    hosts.sort_unstable();
    hosts.dedup();
    let served_by = if hosts.is_empty() {
        String::new()
    } else {
        format!(", from {}", hosts.join(", "))
    };
    Ok((pulled.image, served_by))
}
