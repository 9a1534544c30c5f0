//! Images built from source for `bazaar deploy`, as `fly deploy` builds them: the app's
//! Dockerfile is built by a real builder on the operator's machine (buildah, Debian's
//! daemonless builder), tagged for the registry the cluster pulls from, pushed, and the
//! deploy runs the pushed digest (so every host runs the same bytes). By default that is
//! the cluster's own registry ([`PushTo::Cluster`]): pushed to the agent the CLI talks to
//! (`/v2` on its API port, with the deploy's token) and run as
//! `registry.bazaar.internal/<app>@<digest>`, which every host pulls from its peers.
//!
//! [`plan`] and the argv functions are pure; [`build_and_push`] runs them.

use crate::config::AppConfig;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tokio::io::{AsyncBufReadExt, BufReader};

/// What to build, and where the result goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildPlan {
    /// The build context: the directory of the config file.
    pub context: PathBuf,
    /// The Dockerfile, relative paths resolved against the context.
    pub dockerfile: PathBuf,
    /// The stage to build (`build-target`).
    pub target: Option<String>,
    /// `[build.args]` then `--build-arg` (the command line wins).
    pub args: BTreeMap<String, String>,
    /// `--build-secret` values, passed to the builder as its `--secret` (`id=NAME,src=FILE`).
    pub secrets: Vec<String>,
    /// The image the build is pushed as: `REGISTRY/APP:deployment-ULID`.
    pub tag: String,
    /// Push over plain HTTP (a loopback registry, or the cluster's on a plain API port).
    pub plain_http: bool,
    /// Pushed to the cluster's registry: run as [`CLUSTER_REGISTRY`]`/<app>@<digest>`.
    pub cluster: bool,
}

/// The name every host resolves to the cluster's own registry (`bazaar_image::peers`).
pub const CLUSTER_REGISTRY: &str = "registry.bazaar.internal";

/// Where a build is pushed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushTo<'a> {
    /// The cluster's registry, on the agent at this API URL (`http[s]://HOST:PORT`).
    Cluster { api_url: &'a str },
    /// A registry of the operator's (`--registry HOST[:PORT]`) the hosts pull from.
    External(&'a str),
}

/// The build of `config` (its `[build] dockerfile`) from the directory `dir` of its file,
/// pushed to `to` as a new tag `deployment-<unique>` of the app.
/// `args` are `--build-arg` values (`KEY=VALUE`).
pub fn plan(
    config: &AppConfig,
    dir: &Path,
    to: PushTo<'_>,
    unique: &str,
    args: &[String],
    secrets: &[String],
) -> Result<BuildPlan, String> {
    let dockerfile = config
        .build
        .dockerfile
        .as_deref()
        .ok_or("[build] names no dockerfile to build")?;
    let (registry, cluster_plain) = match to {
        PushTo::External(r) => (r, None),
        PushTo::Cluster { api_url } => {
            let (scheme, rest) = api_url.split_once("://").ok_or_else(|| {
                format!("the API URL {api_url:?} must be http://HOST:PORT or https://HOST:PORT")
            })?;
            (
                rest.split('/').next().unwrap_or(rest),
                Some(scheme == "http"),
            )
        }
    };
    let registry = registry.trim_end_matches('/');
    if registry.is_empty() || registry.contains("://") || registry.contains(char::is_whitespace) {
        return Err(format!(
            "--registry {registry:?} must be HOST[:PORT] (the registry the cluster pulls from)"
        ));
    }
    let mut all_args = config.build.args.clone();
    for a in args {
        let (k, v) = a
            .split_once('=')
            .filter(|(k, _)| !k.is_empty())
            .ok_or_else(|| format!("--build-arg {a:?} must be KEY=VALUE"))?;
        all_args.insert(k.to_string(), v.to_string());
    }
    for s in secrets {
        if !s.split(',').any(|p| p.starts_with("id=")) {
            return Err(format!(
                "--build-secret {s:?} must name its id: id=NAME,src=FILE"
            ));
        }
    }
    let host = registry.split('/').next().unwrap_or(registry);
    let name = host.rsplit_once(':').map_or(host, |(h, _)| h);
    let plain_http =
        cluster_plain.unwrap_or(name == "localhost" || name.starts_with("127.") || name == "[::1]");
    Ok(BuildPlan {
        context: dir.to_path_buf(),
        dockerfile: dir.join(dockerfile),
        target: config.build.build_target.clone(),
        args: all_args,
        secrets: secrets.to_vec(),
        tag: format!("{registry}/{}:deployment-{unique}", config.app),
        plain_http,
        cluster: cluster_plain.is_some(),
    })
}

/// `buildah bud ...`: builds the plan's Dockerfile into the local image `plan.tag`.
pub fn build_argv(plan: &BuildPlan) -> Vec<String> {
    let mut argv: Vec<String> = vec![
        "buildah".into(),
        "bud".into(),
        "--layers".into(),
        "-f".into(),
        plan.dockerfile.display().to_string(),
        "-t".into(),
        plan.tag.clone(),
    ];
    if let Some(t) = &plan.target {
        argv.extend(["--target".into(), t.clone()]);
    }
    for (k, v) in &plan.args {
        argv.extend(["--build-arg".into(), format!("{k}={v}")]);
    }
    for s in &plan.secrets {
        argv.extend(["--secret".into(), s.clone()]);
    }
    argv.push(plan.context.display().to_string());
    argv
}

/// `buildah push ...`: pushes `plan.tag` and writes its manifest digest to `digest_file`;
/// with the credentials in `auth_file` (containers-auth.json, [`auth_file_json`]) if any.
pub fn push_argv(plan: &BuildPlan, digest_file: &Path, auth_file: Option<&Path>) -> Vec<String> {
    let mut argv: Vec<String> = vec!["buildah".into(), "push".into()];
    if plan.plain_http {
        argv.push("--tls-verify=false".into());
    }
    if let Some(f) = auth_file {
        argv.extend(["--authfile".into(), f.display().to_string()]);
    }
    argv.extend([
        "--digestfile".into(),
        digest_file.display().to_string(),
        plan.tag.clone(),
        format!("docker://{}", plan.tag),
    ]);
    argv
}

/// The credentials file buildah reads with `--authfile`: `token` as the password for
/// `registry` (how the cluster's registry takes a Machines API token), never on a command
/// line other users could read.
pub fn auth_file_json(registry: &str, token: &str) -> String {
    use base64::Engine as _;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("x:{token}"));
    serde_json::json!({"auths": {registry: {"auth": auth}}}).to_string()
}

/// The reference a deploy of `plan` runs: the pushed repository at its digest (for the
/// cluster's registry, under the name every host resolves to it).
pub fn deployed(plan: &BuildPlan, app: &str, digest: &str) -> String {
    if plan.cluster {
        return format!("{CLUSTER_REGISTRY}/{app}@{}", digest.trim());
    }
    pinned(&plan.tag, digest)
}

/// The reference a deploy runs: the pushed repository at its digest.
pub fn pinned(tag: &str, digest: &str) -> String {
    let repo = match tag.rsplit_once(':') {
        Some((repo, t)) if !t.contains('/') => repo,
        _ => tag,
    };
    format!("{repo}@{}", digest.trim())
}

/// Builds and pushes `plan` with buildah (with `token` as the registry password, if
/// given), handing each line the builder prints to `progress`; answers the reference the
/// deploy runs ([`deployed`]).
pub async fn build_and_push(
    plan: &BuildPlan,
    app: &str,
    token: Option<&str>,
    mut progress: impl FnMut(&str),
) -> anyhow::Result<String> {
    run(&build_argv(plan), &mut progress).await?;
    let scratch = tempfile::Builder::new().prefix("bazaar-build-").tempdir()?;
    let digest_file = scratch.path().join("digest");
    let auth_file = match token {
        Some(t) => {
            let path = scratch.path().join("auth.json");
            let host = plan.tag.split('/').next().unwrap_or_default();
            std::fs::write(&path, auth_file_json(host, t))?;
            Some(path)
        }
        None => None,
    };
    run(
        &push_argv(plan, &digest_file, auth_file.as_deref()),
        &mut progress,
    )
    .await?;
    let digest = std::fs::read_to_string(&digest_file)
        .map_err(|e| anyhow::anyhow!("buildah push wrote no digest: {e}"))?;
    Ok(deployed(plan, app, &digest))
}

/// Runs `argv`, its output (both streams) line by line to `progress`.
async fn run(argv: &[String], progress: &mut impl FnMut(&str)) -> anyhow::Result<()> {
    let mut child = tokio::process::Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot run {}: {e} (install buildah: apt-get install buildah)",
                argv[0]
            )
        })?;
    let mut out = BufReader::new(child.stdout.take().expect("piped")).lines();
    let mut err = BufReader::new(child.stderr.take().expect("piped")).lines();
    let (mut out_open, mut err_open) = (true, true);
    while out_open || err_open {
        tokio::select! {
            line = out.next_line(), if out_open => match line? {
                Some(l) => progress(&l),
                None => out_open = false,
            },
            line = err.next_line(), if err_open => match line? {
                Some(l) => progress(&l),
                None => err_open = false,
            },
        }
    }
    let status = child.wait().await?;
    anyhow::ensure!(status.success(), "{} {} failed: {status}", argv[0], argv[1]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> AppConfig {
        crate::config::parse("fly.toml", text).unwrap().config
    }

    const APP: &str = "app = \"web\"\n[build]\n  dockerfile = \"deploy/Dockerfile\"\n  build-target = \"runtime\"\n[build.args]\n  RUBY = \"3.3\"\n  MODE = \"prod\"\n";

    #[test]
    fn a_plan_builds_the_files_dockerfile_for_the_clusters_registry() {
        let p = plan(
            &config(APP),
            Path::new("/src/web"),
            PushTo::External("127.0.0.1:5000"),
            "01J",
            &["MODE=debug".into(), "EXTRA=a=b".into()],
            &["id=npm,src=/root/.npmrc".into()],
        )
        .unwrap();
        assert_eq!(p.tag, "127.0.0.1:5000/web:deployment-01J");
        assert!(p.plain_http, "a loopback registry is plain HTTP");
        assert_eq!(p.dockerfile, Path::new("/src/web/deploy/Dockerfile"));
        assert_eq!(
            build_argv(&p),
            [
                "buildah",
                "bud",
                "--layers",
                "-f",
                "/src/web/deploy/Dockerfile",
                "-t",
                "127.0.0.1:5000/web:deployment-01J",
                "--target",
                "runtime",
                "--build-arg",
                "EXTRA=a=b",
                "--build-arg",
                "MODE=debug",
                "--build-arg",
                "RUBY=3.3",
                "--secret",
                "id=npm,src=/root/.npmrc",
                "/src/web"
            ]
        );
        assert_eq!(
            push_argv(&p, Path::new("/tmp/d"), None),
            [
                "buildah",
                "push",
                "--tls-verify=false",
                "--digestfile",
                "/tmp/d",
                "127.0.0.1:5000/web:deployment-01J",
                "docker://127.0.0.1:5000/web:deployment-01J"
            ]
        );
        let remote = plan(
            &config(APP),
            Path::new("/s"),
            PushTo::External("registry.example.com:443"),
            "x",
            &[],
            &[],
        )
        .unwrap();
        assert!(!remote.plain_http);
        assert!(
            !push_argv(&remote, Path::new("/d"), None).contains(&"--tls-verify=false".to_string())
        );
    }

    #[test]
    fn by_default_the_build_goes_to_the_clusters_registry_with_the_token() {
        let to = PushTo::Cluster {
            api_url: "http://10.0.0.5:4280",
        };
        let p = plan(&config(APP), Path::new("/s"), to, "01J", &[], &[]).unwrap();
        assert_eq!(p.tag, "10.0.0.5:4280/web:deployment-01J");
        assert!(p.plain_http && p.cluster, "{p:?}");
        let argv = push_argv(&p, Path::new("/t/d"), Some(Path::new("/t/auth.json")));
        assert!(
            argv.windows(2).any(|w| w == ["--authfile", "/t/auth.json"]),
            "{argv:?}"
        );
        assert!(!argv.iter().any(|a| a.contains("creds")), "{argv:?}");
        let auth: serde_json::Value =
            serde_json::from_str(&auth_file_json("10.0.0.5:4280", "TOKEN")).unwrap();
        use base64::Engine as _;
        let encoded = auth["auths"]["10.0.0.5:4280"]["auth"].as_str().unwrap();
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap();
        assert_eq!(decoded, b"x:TOKEN");
        assert_eq!(
            deployed(&p, "web", "sha256:abc\n"),
            "registry.bazaar.internal/web@sha256:abc"
        );
        let https = PushTo::Cluster {
            api_url: "https://node1:4280/",
        };
        let p = plan(&config(APP), Path::new("/s"), https, "x", &[], &[]).unwrap();
        assert!(!p.plain_http && p.tag.starts_with("node1:4280/"), "{p:?}");
        let bad = PushTo::Cluster { api_url: "node1" };
        assert!(plan(&config(APP), Path::new("/s"), bad, "x", &[], &[]).is_err());
    }

    #[test]
    fn bad_input_is_named() {
        let c = config(APP);
        let dir = Path::new("/s");
        let e = plan(&c, dir, PushTo::External("http://r:5000"), "x", &[], &[]).unwrap_err();
        assert!(e.contains("HOST[:PORT]"), "{e}");
        let e = plan(
            &c,
            dir,
            PushTo::External("r:5000"),
            "x",
            &["NOVALUE".into()],
            &[],
        )
        .unwrap_err();
        assert!(e.contains("KEY=VALUE"), "{e}");
        let e = plan(
            &c,
            dir,
            PushTo::External("r:5000"),
            "x",
            &[],
            &["src=/f".into()],
        )
        .unwrap_err();
        assert!(e.contains("id=NAME"), "{e}");
        let image_only = config("app = \"web\"\n[build]\n  image = \"x:1\"\n");
        assert!(plan(&image_only, dir, PushTo::External("r:5000"), "x", &[], &[]).is_err());
    }

    #[test]
    fn the_deploy_runs_the_pushed_digest() {
        assert_eq!(
            pinned("127.0.0.1:5000/web:deployment-01J", "sha256:ab\n"),
            "127.0.0.1:5000/web@sha256:ab"
        );
    }
}
