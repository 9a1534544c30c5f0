//! Images of the cluster's own registry, pulled from peers: a reference naming
//! [`CLUSTER_REGISTRY`] (`registry.bazaar.internal/<app>[/<path>]:<tag>` or `@sha256:...`)
//! is never resolved by DNS. A host takes the manifest from its own repositories
//! ([`crate::repos`]) when it has it (the host it was pushed to), else from the first peer
//! that answers it, and fetches each blob it lacks from a peer that holds it, each peer's
//! order its own ([`PeerSource`]), so that hosts pulling at once spread over the holders.
//! What it fetched is linked into its own repositories, so it serves the image to the
//! next host in turn (peer to peer, as Spegel or Dragonfly do). Every blob is verified
//! against its digest before it enters the store; the host that served each layer is
//! logged and returned ([`ClusterPull::sources`]).

use crate::digest::Digest;
use crate::error::{Error, IoContext, Result};
use crate::manifest::{Document, Platform, MANIFEST_ACCEPT};
use crate::reference::Reference;
use crate::store::{tmp_name, Image, ImageStore, ProgressFn};
use futures_util::StreamExt;
use sha2::{Digest as _, Sha256};
use std::time::Instant;
use tokio::io::AsyncWriteExt;

/// The registry name of the images the cluster itself serves.
pub const CLUSTER_REGISTRY: &str = "registry.bazaar.internal";

/// Whether `reference` names the cluster's registry.
pub fn is_cluster(reference: &Reference) -> bool {
    reference.registry == CLUSTER_REGISTRY
}

/// Another host's registry, as this host reaches it.
#[derive(Clone)]
pub struct Peer {
    /// Its host id (named in logs and in [`ClusterPull::sources`]).
    pub host_id: String,
    /// The URL its `/v2/` is under, without a trailing `/` (`https://<id>.hosts...:<port>`
    /// over mTLS, or `http://<api address>`).
    pub base: String,
    /// The client to reach it with (the host link's mTLS client, or a plain one).
    pub client: reqwest::Client,
    /// The bearer token to send (the cluster secret when not over mTLS).
    pub bearer: Option<String>,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer")
            .field("host_id", &self.host_id)
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl Peer {
    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let req = self.client.request(method, format!("{}{path}", self.base));
        match &self.bearer {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }
}

/// Who a host may pull the cluster's images from: the other live hosts, in the order this
/// host asks them.
pub trait PeerSource: Send + Sync + std::fmt::Debug {
    fn peers(&self) -> Vec<Peer>;
}

/// What a pull of a cluster image did.
#[derive(Debug, Clone)]
pub struct ClusterPull {
    pub image: Image,
    /// Each blob fetched from a peer, and the host that served it (empty: all were here).
    pub sources: Vec<(Digest, String)>,
}

fn http_error(url: &str) -> impl Fn(reqwest::Error) -> Error + '_ {
    move |source| Error::Http {
        url: url.to_string(),
        source,
    }
}

/// A manifest from the first peer that has it: its bytes, content type and the peer.
async fn manifest_from_peers(
    peers: &[Peer],
    repo: &str,
    target: &str,
) -> Result<(Vec<u8>, Option<String>, String)> {
    let path = format!("/v2/{repo}/manifests/{target}");
    let mut asked = Vec::new();
    for peer in peers {
        let resp = peer
            .request(reqwest::Method::GET, &path)
            .header(reqwest::header::ACCEPT, MANIFEST_ACCEPT)
            .send()
            .await;
        match resp {
            Ok(r) if r.status() == reqwest::StatusCode::OK => {
                let content_type = r
                    .headers()
                    .get(reqwest::header::CONTENT_TYPE)
                    .and_then(|h| h.to_str().ok())
                    .map(String::from);
                let url = format!("{}{path}", peer.base);
                let bytes = r.bytes().await.map_err(http_error(&url))?;
                if bytes.len() > 4 << 20 {
                    return Err(Error::Manifest(format!("{url}: document over 4 MiB")));
                }
                return Ok((bytes.to_vec(), content_type, peer.host_id.clone()));
            }
            Ok(r) => asked.push(format!("{}: {}", peer.host_id, r.status())),
            Err(e) => asked.push(format!("{}: {e}", peer.host_id)),
        }
    }
    Err(Error::NotFound(format!(
        "{CLUSTER_REGISTRY}/{repo}:{target} on no host of the cluster (asked {})",
        if asked.is_empty() {
            "none: no peer is known".to_string()
        } else {
            asked.join("; ")
        }
    )))
}

impl ImageStore {
    /// A blob, from this store if it has it, else from a peer that holds it (asked from
    /// `start` on, around), verified, kept and linked into repository `repo`. Answers the
    /// peer that served it, if one did.
    async fn cluster_blob(
        &self,
        peers: &[Peer],
        start: usize,
        repo: &str,
        digest: &Digest,
    ) -> Result<Option<String>> {
        let repos = self.repos();
        if repos.link_existing(repo, digest)? {
            return Ok(None);
        }
        let path = format!("/v2/{repo}/blobs/{digest}");
        let mut asked = Vec::new();
        for i in 0..peers.len() {
            let peer = &peers[(start + i) % peers.len()];
            let t0 = Instant::now();
            match self.blob_from(peer, &path, digest).await {
                Ok(bytes) => {
                    tracing::info!(
                        blob = %digest,
                        repository = repo,
                        host = %peer.host_id,
                        bytes,
                        ms = t0.elapsed().as_millis() as u64,
                        "blob fetched from a peer"
                    );
                    repos.link_existing(repo, digest)?;
                    return Ok(Some(peer.host_id.clone()));
                }
                Err(e) => asked.push(format!("{}: {e}", peer.host_id)),
            }
        }
        Err(Error::NotFound(format!(
            "blob {digest} of {repo} on no host of the cluster ({})",
            if asked.is_empty() {
                "no peer is known".to_string()
            } else {
                asked.join("; ")
            }
        )))
    }

    /// Streams blob `digest` from `peer` into the store, hashing it on the way: a blob
    /// whose content is another is not kept.
    async fn blob_from(&self, peer: &Peer, path: &str, digest: &Digest) -> Result<u64> {
        let url = format!("{}{path}", peer.base);
        let resp = peer
            .request(reqwest::Method::GET, path)
            .send()
            .await
            .map_err(http_error(&url))?;
        if resp.status() != reqwest::StatusCode::OK {
            return Err(Error::Registry {
                url,
                status: resp.status().as_u16(),
                body: String::new(),
            });
        }
        let tmp = TmpPath(tmp_name(&self.tmp_dir(), "peer-blob"));
        let mut file = tokio::fs::File::create(&tmp.0).await.at(&tmp.0)?;
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        let mut stream = resp.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(http_error(&url))?;
            hasher.update(&chunk);
            size += chunk.len() as u64;
            file.write_all(&chunk).await.at(&tmp.0)?;
        }
        file.sync_all().await.at(&tmp.0)?;
        let actual = Digest::from_hasher(hasher);
        if &actual != digest {
            return Err(Error::DigestMismatch {
                what: "blob",
                expected: digest.clone(),
                actual,
            });
        }
        let blob = self.blob_path(digest);
        std::fs::rename(&tmp.0, &blob).at(&blob)?;
        Ok(size)
    }

    /// Pulls `reference` (of [`CLUSTER_REGISTRY`]) from this host's repositories and its
    /// `peers`: see the module's doc.
    pub async fn pull_cluster(
        &self,
        reference: &Reference,
        peers: &[Peer],
        progress: &ProgressFn<'_>,
    ) -> Result<ClusterPull> {
        let _shared = self.gc_lock().read().await;
        let repos = self.repos();
        let repo = reference.repository.as_str();
        if !crate::repos::valid_repository(repo) {
            return Err(Error::Reference(reference.to_string(), "bad repository"));
        }
        let target = reference.target();
        let mut sources = Vec::new();
        let (bytes, content_type) = match repos.manifest(repo, &target)? {
            Some(m) => (m.bytes, Some(m.media_type)),
            None => {
                let (b, ct, host) = manifest_from_peers(peers, repo, &target).await?;
                sources.push((Digest::of(&b), host));
                (b, ct)
            }
        };
        if let Some(d) = &reference.digest {
            d.verify("manifest", &bytes)?;
        }
        let digest = Digest::of(&bytes);
        let (manifest_bytes, manifest_type, manifest, index) =
            match Document::parse(content_type.as_deref(), &bytes)? {
                Document::Manifest(m) => (bytes, content_type, m, None),
                Document::Index(index) => {
                    let platform = Platform::current();
                    let entry = index.select(&platform).ok_or_else(|| Error::NoPlatform {
                        reference: reference.to_string(),
                        platform: platform.to_string(),
                        available: index.platforms(),
                    })?;
                    let target = entry.digest.to_string();
                    let (b, ct) = match repos.manifest(repo, &target)? {
                        Some(m) => (m.bytes, Some(m.media_type)),
                        None => {
                            let (b, ct, host) = manifest_from_peers(peers, repo, &target).await?;
                            sources.push((entry.digest.clone(), host));
                            (b, ct)
                        }
                    };
                    entry.digest.verify("manifest", &b)?;
                    match Document::parse(ct.as_deref(), &b)? {
                        Document::Manifest(m) => (b, ct, m, Some((bytes, content_type))),
                        Document::Index(_) => {
                            return Err(Error::Manifest(format!(
                                "{reference}: index entry {} is another index",
                                entry.digest
                            )))
                        }
                    }
                }
            };
        let blobs: Vec<&Digest> = std::iter::once(&manifest.config.digest)
            .chain(manifest.layers.iter().map(|l| &l.digest))
            .collect();
        let fetches = blobs
            .iter()
            .enumerate()
            .map(|(i, d)| self.cluster_blob(peers, i, repo, d));
        let fetched = futures_util::future::join_all(fetches).await;
        for (d, served) in blobs.iter().zip(fetched) {
            if let Some(host) = served? {
                sources.push(((*d).clone(), host));
            }
        }
        // This host now holds the image as a repository too, and serves it to the next.
        let manifest_digest = Digest::of(&manifest_bytes);
        let link = |target: &str, media: Option<&str>, b: &[u8]| {
            repos
                .put_manifest(repo, target, media, b)
                .map_err(|e| Error::Manifest(format!("{reference}: {e}")))
        };
        link(
            manifest_digest.as_str(),
            manifest_type.as_deref(),
            &manifest_bytes,
        )?;
        match &index {
            // An index is linked only when this host holds every platform's manifest (it
            // fetched one): then it serves that platform's manifest by digest alone.
            Some((index_bytes, index_type)) => {
                let linked = link(digest.as_str(), index_type.as_deref(), index_bytes);
                if linked.is_ok() && reference.digest.is_none() {
                    link(&target, index_type.as_deref(), index_bytes)?;
                }
            }
            None if reference.digest.is_none() => {
                link(&target, manifest_type.as_deref(), &manifest_bytes)?;
            }
            None => {}
        }
        let config_bytes = std::fs::read(self.blob_path(&manifest.config.digest))
            .at(self.blob_path(&manifest.config.digest))?;
        let image = self
            .store_image(
                reference.to_string(),
                digest,
                &manifest_bytes,
                manifest,
                &config_bytes,
                None,
                progress,
            )
            .await?;
        tracing::info!(image = %image.reference, digest = %image.digest, fetched = sources.len(), "pulled from the cluster");
        Ok(ClusterPull { image, sources })
    }
}

/// A temporary file removed when dropped; a no-op once renamed.
struct TmpPath(std::path::PathBuf);

impl Drop for TmpPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
