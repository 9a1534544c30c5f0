//! The keys of a file that bazaar does not act on. A key that would change where data
//! lives or what runs is refused, with an error that names it and says why; only keys that
//! change neither (a console command, build settings bazaar's builds do not use, app
//! metrics) are reported as warnings. A key bazaar does not know at all (a typo, a
//! newer Fly key) is refused too: it might matter.

/// What to do about one key.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Verdict {
    /// Purely cosmetic: the deploy goes on, with this warning.
    Warn(String),
    /// Refused, for this reason.
    Refuse(String),
}

/// Why keys are refused, by their path without array indexes (`services.ports.tls_options`).
const REFUSED: &[(&str, &str)] = &[
    ("swap_size_mb", "machines run without swap (their memory limit is the [[vm]] memory); size the memory to fit instead"),
    ("statics", "the proxy does not serve static files from the image; serve them from the app"),
    ("files.secret_name", "the agent does not write app secrets into files; read the secret from the environment"),
    ("host_dedication_id", "bazaar has no dedicated hosts"),
    ("deploy.release_command_vm", "the release command runs at the size of the app's [[vm]]"),
    ("deploy.seed_command", "bazaar does not run seed commands"),
    ("mounts.auto_extend_size_threshold", "bazaar does not grow volumes by itself; extend them with `bazaar volumes extend`"),
    ("mounts.auto_extend_size_increment", "bazaar does not grow volumes by itself; extend them with `bazaar volumes extend`"),
    ("mounts.auto_extend_size_limit", "bazaar does not grow volumes by itself; extend them with `bazaar volumes extend`"),
    ("vm.gpus", "no host in a bazaar cluster has GPUs"),
    ("vm.gpu_kind", "no host in a bazaar cluster has GPUs"),
    ("vm.kernel_args", "machines are not VMs: there is no kernel to pass arguments to"),
    ("vm.persist_rootfs", "a machine's root file system is not kept across restarts; keep data on a volume ([mounts])"),
    ("vm.host_dedication_id", "bazaar has no dedicated hosts"),
    ("http_service.tls_options", "the proxy's TLS settings are cluster-wide"),
    ("http_service.http_options", "the proxy does not rewrite requests or answers"),
    ("http_service.proxy_proto_options", "the proxy does not speak the PROXY protocol"),
    ("http_service.machine_checks", "bazaar does not run machine checks at deploy"),
    ("services.ports.tls_options", "the proxy's TLS settings are cluster-wide"),
    ("services.ports.http_options", "the proxy does not rewrite requests or answers"),
    ("services.ports.proxy_proto_options", "the proxy does not speak the PROXY protocol"),
    ("services.machine_checks", "bazaar does not run machine checks at deploy"),
    ("experimental", "it changes how machines run, and bazaar does not act on it"),
    ("build.builder", "bazaar builds images from a Dockerfile (with buildah), not with buildpacks; add a Dockerfile or give [build] image"),
    ("build.buildpacks", "bazaar builds images from a Dockerfile (with buildah), not with buildpacks; add a Dockerfile or give [build] image"),
    ("build.builtin", "bazaar builds images from a Dockerfile (with buildah), not with Fly's builtin builders; add a Dockerfile or give [build] image"),
];

/// Keys that change neither what runs nor where data lives.
const COSMETIC: &[(&str, &str)] = &[
    ("console_command", "bazaar has no console command"),
    (
        "build",
        "bazaar builds with `dockerfile`, `build-target` and [build.args] only",
    ),
    ("metrics", "bazaar does not scrape app metrics"),
];

fn under(path: &str, prefix: &str) -> bool {
    path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('.'))
}

/// The verdict on a key serde left unread; `path` as `serde_ignored` writes it
/// (`services.0.ports.1.tls_options`).
pub(super) fn judge(path: &str) -> Verdict {
    let key: String = path
        .split('.')
        .filter(|s| s.parse::<usize>().is_err())
        .collect::<Vec<_>>()
        .join(".");
    // The most specific reason first (`vm.host_dedication_id` before `vm`, a refused
    // `build.buildpacks` before the cosmetic rest of `build`).
    let refused = REFUSED
        .iter()
        .filter(|(prefix, _)| under(&key, prefix))
        .max_by_key(|(prefix, _)| prefix.len())
        .map(|(_, why)| *why);
    if refused.is_none() {
        for (prefix, why) in COSMETIC {
            if under(&key, prefix) {
                return Verdict::Warn(format!("key `{key}` has no effect: {why}"));
            }
        }
    }
    let reason = refused.unwrap_or("bazaar does not know or act on it");
    Verdict::Refuse(format!("`{key}` ({reason})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_judged_by_their_path_without_indexes() {
        assert!(matches!(judge("console_command"), Verdict::Warn(_)));
        assert!(matches!(judge("build.ignorefile"), Verdict::Warn(_)));
        assert!(matches!(judge("build.buildpacks"), Verdict::Refuse(_)));
        assert!(matches!(judge("metrics.0.port"), Verdict::Warn(_)));
        let Verdict::Refuse(m) = judge("services.0.ports.1.tls_options") else {
            panic!()
        };
        assert!(
            m.starts_with("`services.ports.tls_options` (the proxy's TLS"),
            "{m}"
        );
        let Verdict::Refuse(m) = judge("mounts.0.auto_extend_size_limit") else {
            panic!()
        };
        assert!(
            m.contains("`mounts.auto_extend_size_limit`") && m.contains("extend"),
            "{m}"
        );
        let Verdict::Refuse(m) = judge("buildx") else {
            panic!()
        };
        assert!(m.contains("does not know"), "{m}");
        let Verdict::Refuse(m) = judge("experimental.enable_consul") else {
            panic!()
        };
        assert!(m.contains("`experimental.enable_consul`"), "{m}");
    }
}
