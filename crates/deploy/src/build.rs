//! Images built from source for `bazaar deploy`, as `fly deploy` builds them: the app's
//! Dockerfile is built by a real builder on the operator's machine (buildah, Debian's
//! daemonless builder), tagged for the registry the cluster pulls from, pushed, and the
//! deploy runs the pushed digest (so every host runs the same bytes).
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
    /// Push over plain HTTP (a loopback registry).
    pub plain_http: bool,
}

/// The build of `config` (its `[build] dockerfile`) from the directory `dir` of its file,
/// pushed to `registry` (`HOST[:PORT]`) as a new tag `deployment-<unique>` of the app.
/// `args` are `--build-arg` values (`KEY=VALUE`).
pub fn plan(
    config: &AppConfig,
    dir: &Path,
    registry: &str,
    unique: &str,
    args: &[String],
    secrets: &[String],
) -> Result<BuildPlan, String> {
    let dockerfile = config
        .build
        .dockerfile
        .as_deref()
        .ok_or("[build] names no dockerfile to build")?;
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
    let plain_http = name == "localhost" || name.starts_with("127.") || name == "[::1]";
    Ok(BuildPlan {
        context: dir.to_path_buf(),
        dockerfile: dir.join(dockerfile),
        target: config.build.build_target.clone(),
        args: all_args,
        secrets: secrets.to_vec(),
        tag: format!("{registry}/{}:deployment-{unique}", config.app),
        plain_http,
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

/// `buildah push ...`: pushes `plan.tag` and writes its manifest digest to `digest_file`.
pub fn push_argv(plan: &BuildPlan, digest_file: &Path) -> Vec<String> {
    let mut argv: Vec<String> = vec!["buildah".into(), "push".into()];
    if plan.plain_http {
        argv.push("--tls-verify=false".into());
    }
    argv.extend([
        "--digestfile".into(),
        digest_file.display().to_string(),
        plan.tag.clone(),
        format!("docker://{}", plan.tag),
    ]);
    argv
}

/// The reference a deploy runs: the pushed repository at its digest.
pub fn pinned(tag: &str, digest: &str) -> String {
    let repo = match tag.rsplit_once(':') {
        Some((repo, t)) if !t.contains('/') => repo,
        _ => tag,
    };
    format!("{repo}@{}", digest.trim())
}

/// Builds and pushes `plan` with buildah, handing each line the builder prints to
/// `progress`; answers the pinned reference of the pushed image.
pub async fn build_and_push(
    plan: &BuildPlan,
    mut progress: impl FnMut(&str),
) -> anyhow::Result<String> {
    run(&build_argv(plan), &mut progress).await?;
    let digest_file = std::env::temp_dir().join(format!(
        "bazaar-build-{}-{}.digest",
        std::process::id(),
        ulid::Ulid::new()
    ));
    let pushed = run(&push_argv(plan, &digest_file), &mut progress).await;
    let digest = std::fs::read_to_string(&digest_file);
    let _ = std::fs::remove_file(&digest_file);
    pushed?;
    let digest = digest.map_err(|e| anyhow::anyhow!("buildah push wrote no digest: {e}"))?;
    Ok(pinned(&plan.tag, &digest))
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
            "127.0.0.1:5000",
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
            push_argv(&p, Path::new("/tmp/d")),
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
            "registry.example.com:443",
            "x",
            &[],
            &[],
        )
        .unwrap();
        assert!(!remote.plain_http);
        assert!(!push_argv(&remote, Path::new("/d")).contains(&"--tls-verify=false".to_string()));
    }

    #[test]
    fn bad_input_is_named() {
        let c = config(APP);
        let dir = Path::new("/s");
        let e = plan(&c, dir, "http://r:5000", "x", &[], &[]).unwrap_err();
        assert!(e.contains("HOST[:PORT]"), "{e}");
        let e = plan(&c, dir, "r:5000", "x", &["NOVALUE".into()], &[]).unwrap_err();
        assert!(e.contains("KEY=VALUE"), "{e}");
        let e = plan(&c, dir, "r:5000", "x", &[], &["src=/f".into()]).unwrap_err();
        assert!(e.contains("id=NAME"), "{e}");
        let image_only = config("app = \"web\"\n[build]\n  image = \"x:1\"\n");
        assert!(plan(&image_only, dir, "r:5000", "x", &[], &[]).is_err());
    }

    #[test]
    fn the_deploy_runs_the_pushed_digest() {
        assert_eq!(
            pinned("127.0.0.1:5000/web:deployment-01J", "sha256:ab\n"),
            "127.0.0.1:5000/web@sha256:ab"
        );
    }
}
