//! What each host's registry keeps (issue 38, garbage collection): the images live
//! machines run (by digest, or by a tag as it resolves now), the newest
//! [`Retention::newest`] manifests of each repository (a deploy pushes one per release, so
//! these are the app's recent releases, what `bazaar rollback` deploys again), and anything
//! pushed within [`Retention::grace`] (a deploy between its push and its machines). The
//! rule is pure ([`doomed`]); [`spawn`] applies it now and then, letting repositories go of
//! what it dooms, and the image store's collection (`bazaar image prune`, the agent's
//! hourly pruning) frees the bytes no one links any more.

use bazaar_image::peers::CLUSTER_REGISTRY;
use bazaar_image::repos::HeldManifest;
use bazaar_image::{Digest, ImageStore, Reference};
use bazaar_node::NodeHandle;
use std::collections::HashSet;
use std::time::{Duration, SystemTime};

/// How much a registry keeps besides what machines run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Manifests kept per repository, newest first.
    pub newest: usize,
    /// Anything pushed this recently is kept.
    pub grace: Duration,
}

impl Default for Retention {
    fn default() -> Retention {
        Retention {
            newest: 10,
            grace: Duration::from_secs(3600),
        }
    }
}

/// How often [`spawn`]'s task looks.
pub const EVERY: Duration = Duration::from_secs(600);

/// The manifests of `held` (one repository's or many) to let go of at `now`: neither in
/// `in_use`, nor among the newest of their repository, nor young, nor named by an index
/// that is kept.
pub fn doomed(
    held: &[HeldManifest],
    in_use: &HashSet<Digest>,
    rule: Retention,
    now: SystemTime,
) -> Vec<(String, Digest)> {
    let mut by_repo: std::collections::BTreeMap<&str, Vec<&HeldManifest>> = Default::default();
    for m in held {
        by_repo.entry(&m.name).or_default().push(m);
    }
    let mut kept: HashSet<(&str, &Digest)> = HashSet::new();
    for (name, mut ms) in by_repo {
        ms.sort_by(|a, b| b.pushed.cmp(&a.pushed).then(a.digest.cmp(&b.digest)));
        for (i, m) in ms.iter().enumerate() {
            let young = now.duration_since(m.pushed).unwrap_or_default() < rule.grace;
            if i < rule.newest || young || in_use.contains(&m.digest) {
                kept.insert((name, &m.digest));
            }
        }
    }
    let children: HashSet<(&str, &Digest)> = held
        .iter()
        .filter(|m| kept.contains(&(m.name.as_str(), &m.digest)))
        .flat_map(|m| m.children.iter().map(move |c| (m.name.as_str(), c)))
        .collect();
    held.iter()
        .filter(|m| {
            let key = (m.name.as_str(), &m.digest);
            !kept.contains(&key) && !children.contains(&key)
        })
        .map(|m| (m.name.clone(), m.digest.clone()))
        .collect()
}

/// The manifests the machines of the catalog run from the cluster's registry (destroyed
/// ones not yet collected too): by their digest, or by the manifest their tag names now.
fn in_use(node: &NodeHandle, store: &ImageStore) -> HashSet<Digest> {
    let Some(catalog) = node.catalog() else {
        return HashSet::new();
    };
    let filter = bazaar_catalog::MachineFilter {
        include_deleted: true,
        ..Default::default()
    };
    let repos = store.repos();
    catalog
        .machines(&filter)
        .into_iter()
        .filter_map(|m| m.record.config.map(|c| c.image.clone()))
        .filter_map(|image| image.parse::<Reference>().ok())
        .filter(|r| r.registry == CLUSTER_REGISTRY)
        .filter_map(|r| match r.digest {
            Some(d) => Some(d),
            None => repos
                .manifest(&r.repository, &r.target())
                .ok()
                .flatten()
                .map(|m| m.digest),
        })
        .collect()
}

/// Applies `rule` once to every repository of `store`; answers how many manifests it let go.
pub fn apply(
    node: &NodeHandle,
    store: &ImageStore,
    rule: Retention,
) -> bazaar_image::Result<usize> {
    let repos = store.repos();
    let mut held = Vec::new();
    for name in repos.names()? {
        held.extend(repos.held(&name)?);
    }
    let used = in_use(node, store);
    let gone = doomed(&held, &used, rule, SystemTime::now());
    for (name, digest) in &gone {
        let blobs = repos.release(name, digest, rule.grace)?;
        tracing::info!(repository = %name, %digest, blobs, "registry let a manifest go");
    }
    Ok(gone.len())
}

/// Applies `rule` every [`EVERY`] until the node shuts down.
pub fn spawn(node: NodeHandle, store: ImageStore, rule: Retention) {
    let shutdown = node.shutdown_token();
    node.clone().spawn(async move {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(EVERY) => {}
            }
            let (n, s) = (node.clone(), store.clone());
            match tokio::task::spawn_blocking(move || apply(&n, &s, rule)).await {
                Ok(Err(e)) => tracing::warn!(error = %e, "registry retention"),
                Err(e) => tracing::warn!(error = %e, "registry retention task"),
                Ok(Ok(_)) => {}
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(name: &str, tag: &[u8], age_s: u64, now: SystemTime) -> HeldManifest {
        HeldManifest {
            name: name.into(),
            digest: Digest::of(tag),
            pushed: now - Duration::from_secs(age_s),
            children: Vec::new(),
        }
    }

    #[test]
    fn keeps_what_runs_the_newest_and_the_young() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let rule = Retention {
            newest: 2,
            grace: Duration::from_secs(60),
        };
        let all = vec![
            held("web", b"r1", 5000, now),
            held("web", b"r2", 4000, now),
            held("web", b"r3", 3000, now),
            held("web", b"r4", 2000, now),
            held("api", b"a1", 9000, now),
        ];
        // r3 and r4 are the newest two; a machine still runs r1; r2 goes.
        let running: HashSet<Digest> = [Digest::of(b"r1")].into();
        assert_eq!(
            doomed(&all, &running, rule, now),
            vec![("web".to_string(), Digest::of(b"r2"))]
        );
        // Nothing runs: r1 goes too; api's only manifest is its newest.
        let gone = doomed(&all, &HashSet::new(), rule, now);
        assert_eq!(gone.len(), 2, "{gone:?}");
        // Keeping none by count: only the young and the running stay.
        let strict = Retention { newest: 0, ..rule };
        let mut fresh = all.clone();
        fresh.push(held("web", b"r5", 10, now));
        let gone = doomed(&fresh, &running, strict, now);
        assert_eq!(gone.len(), 4, "{gone:?}");
        assert!(!gone
            .iter()
            .any(|(_, d)| *d == Digest::of(b"r5") || *d == Digest::of(b"r1")));
    }

    #[test]
    fn an_index_kept_keeps_the_manifests_it_names() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let rule = Retention {
            newest: 1,
            grace: Duration::ZERO,
        };
        let mut index = held("web", b"index", 100, now);
        index.children = vec![Digest::of(b"amd64")];
        let all = vec![
            index,
            held("web", b"amd64", 200, now),
            held("web", b"old", 300, now),
        ];
        assert_eq!(
            doomed(&all, &HashSet::new(), rule, now),
            vec![("web".to_string(), Digest::of(b"old"))]
        );
    }
}
