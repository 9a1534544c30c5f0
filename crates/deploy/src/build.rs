//! Images built from source for `bazaar deploy`, as `fly deploy` builds them: the app's
//! Dockerfile is built by a real builder on the operator's machine (buildah, Debian's
//! daemonless builder), tagged for the registry the cluster pulls from, pushed, and the
//! deploy runs the pushed digest (so every host runs the same bytes). By default that is
//! the cluster's own registry ([`PushTo::Cluster`]): pushed to the agent the CLI talks to
//! (`/v2` on its API port, with the deploy's token) and run as
//! `registry.bazaar.internal/<app>@<digest>`, which every host pulls from its peers.
//!
//! A Dockerfile may start `FROM` an image in the cluster's registry (a base image the
//! operator mirrored there, docs/REGISTRY.md), named as machines name it
//! (`registry.bazaar.internal/<app>/...`) or by the API address: the build gets a
//! registries.conf that sends that name to the API address ([`registries_conf`]) and the
//! deploy's token in its `--authfile` ([`auth_file_json`]).
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
    build_argv_with_auth(plan, None)
}

/// [`build_argv`], pulling its `FROM` images with the credentials in `auth_file` (the
/// cluster's registry wants the deploy's token for a base image mirrored there).
pub fn build_argv_with_auth(plan: &BuildPlan, auth_file: Option<&Path>) -> Vec<String> {
    let mut argv: Vec<String> = vec!["buildah".into(), "bud".into()];
    if let Some(f) = auth_file {
        argv.extend(["--authfile".into(), f.display().to_string()]);
    }
    argv.extend([
        "--layers".into(),
        "-f".into(),
        plan.dockerfile.display().to_string(),
        "-t".into(),
        plan.tag.clone(),
    ]);
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

/// The credentials file for a build to the cluster's registry at `registry`: the
/// operator's own file `existing` (logins to other registries, credential helpers) with
/// `token` added for `registry` and for [`CLUSTER_REGISTRY`] (the name a `FROM` may use).
pub fn merged_auth_file_json(existing: Option<&str>, registry: &str, token: &str) -> String {
    let mut file: serde_json::Value = existing
        .and_then(|t| serde_json::from_str(t).ok())
        .filter(serde_json::Value::is_object)
        .unwrap_or_else(|| serde_json::json!({}));
    let ours: serde_json::Value =
        serde_json::from_str(&auth_file_json(registry, token)).expect("auth_file_json writes JSON");
    let entry = ours["auths"][registry].clone();
    if !file["auths"].is_object() {
        file["auths"] = serde_json::json!({});
    }
    file["auths"][registry] = entry.clone();
    file["auths"][CLUSTER_REGISTRY] = entry;
    file.to_string()
}

/// The registries.conf a build to the cluster's registry at `registry` runs with: the
/// system's `system` (its search registries and mirrors) and two entries of ours, so that
/// `FROM registry.bazaar.internal/<app>/...` pulls from `registry`, and over plain HTTP
/// when `plain_http` (only from it: other registries keep TLS).
pub fn registries_conf(system: &str, registry: &str, plain_http: bool) -> String {
    format!(
        "{system}\n\n# bazaar deploy: the cluster's registry\n\
         [[registry]]\nprefix = \"{CLUSTER_REGISTRY}\"\nlocation = \"{registry}\"\ninsecure = {plain_http}\n\n\
         [[registry]]\nlocation = \"{registry}\"\ninsecure = {plain_http}\n"
    )
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
    let scratch = tempfile::Builder::new().prefix("bazaar-build-").tempdir()?;
    let digest_file = scratch.path().join("digest");
    let host = plan.tag.split('/').next().unwrap_or_default();
    let auth_file = match token {
        Some(t) => {
            let path = scratch.path().join("auth.json");
            write_private(&path, &auth_file_json(host, t))?;
            Some(path)
        }
        None => None,
    };
    let mut build = tokio::process::Command::new("buildah");
    let build_auth = match token.filter(|_| plan.cluster) {
        Some(t) => {
            let path = scratch.path().join("build-auth.json");
            let existing = operator_auth_file().and_then(|p| std::fs::read_to_string(p).ok());
            write_private(&path, &merged_auth_file_json(existing.as_deref(), host, t))?;
            let system = std::fs::read_to_string(SYSTEM_REGISTRIES_CONF).unwrap_or_default();
            let conf = scratch.path().join("registries.conf");
            std::fs::write(&conf, registries_conf(&system, host, plan.plain_http))?;
            build.env("CONTAINERS_REGISTRIES_CONF", &conf);
            Some(path)
        }
        None => None,
    };
    let argv = build_argv_with_auth(plan, build_auth.as_deref());
    build.args(&argv[1..]);
    run_command(build, &argv, &mut progress).await?;
    run(
        &push_argv(plan, &digest_file, auth_file.as_deref()),
        &mut progress,
    )
    .await?;
    let digest = std::fs::read_to_string(&digest_file)
        .map_err(|e| anyhow::anyhow!("buildah push wrote no digest: {e}"))?;
    Ok(deployed(plan, app, &digest))
}

/// The system's registries.conf, which a build's own one extends.
const SYSTEM_REGISTRIES_CONF: &str = "/etc/containers/registries.conf";

/// The credentials file buildah would read without `--authfile`, if there is one:
/// `REGISTRY_AUTH_FILE`, `$XDG_RUNTIME_DIR/containers/auth.json`, `~/.docker/config.json`.
fn operator_auth_file() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("REGISTRY_AUTH_FILE").map(PathBuf::from),
        std::env::var_os("XDG_RUNTIME_DIR").map(|d| PathBuf::from(d).join("containers/auth.json")),
        std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".docker/config.json")),
    ];
    candidates.into_iter().flatten().find(|p| p.is_file())
}

/// Writes a file only its owner can read (it holds credentials).
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?
        .write_all(text.as_bytes())
}

/// Runs `argv`, its output (both streams) line by line to `progress`.
async fn run(argv: &[String], progress: &mut impl FnMut(&str)) -> anyhow::Result<()> {
    let mut command = tokio::process::Command::new(&argv[0]);
    command.args(&argv[1..]);
    run_command(command, argv, progress).await
}

/// Runs `command` (which is `argv`), its output line by line to `progress`.
async fn run_command(
    mut command: tokio::process::Command,
    argv: &[String],
    progress: &mut impl FnMut(&str),
) -> anyhow::Result<()> {
    let mut child = command
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
    fn a_build_to_the_cluster_pulls_its_base_from_the_clusters_registry() {
        let to = PushTo::Cluster {
            api_url: "http://10.0.0.5:4280",
        };
        let p = plan(&config(APP), Path::new("/s"), to, "01J", &[], &[]).unwrap();
        let argv = build_argv_with_auth(&p, Some(Path::new("/t/build-auth.json")));
        assert_eq!(
            argv[..4],
            ["buildah", "bud", "--authfile", "/t/build-auth.json"]
        );
        assert!(!argv.iter().any(|a| a.contains("tls-verify")), "{argv:?}");
        // The system's settings stay; the cluster's name and address are plain HTTP only.
        let system = "unqualified-search-registries = [\"docker.io\"]\n";
        let conf: toml::Value =
            toml::from_str(&registries_conf(system, "10.0.0.5:4280", true)).unwrap();
        assert_eq!(
            conf["unqualified-search-registries"][0].as_str(),
            Some("docker.io")
        );
        let entries = conf["registry"].as_array().unwrap();
        assert_eq!(entries[0]["prefix"].as_str(), Some(CLUSTER_REGISTRY));
        assert_eq!(entries[0]["location"].as_str(), Some("10.0.0.5:4280"));
        assert_eq!(entries[0]["insecure"].as_bool(), Some(true));
        assert_eq!(entries[1]["location"].as_str(), Some("10.0.0.5:4280"));
        let tls: toml::Value = toml::from_str(&registries_conf("", "node1:4280", false)).unwrap();
        assert_eq!(tls["registry"][1]["insecure"].as_bool(), Some(false));
        // The operator's logins and helpers stay; the token is added for both names.
        let existing =
            r#"{"auths":{"docker.io":{"auth":"b3A6cHc="}},"credHelpers":{"gcr.io":"gcloud"}}"#;
        let merged: serde_json::Value =
            serde_json::from_str(&merged_auth_file_json(Some(existing), "10.0.0.5:4280", "T"))
                .unwrap();
        assert_eq!(merged["auths"]["docker.io"]["auth"], "b3A6cHc=");
        assert_eq!(merged["credHelpers"]["gcr.io"], "gcloud");
        assert_eq!(
            merged["auths"]["10.0.0.5:4280"],
            merged["auths"][CLUSTER_REGISTRY]
        );
        let fresh: serde_json::Value =
            serde_json::from_str(&merged_auth_file_json(Some("not json"), "h:1", "T")).unwrap();
        assert!(fresh["auths"]["h:1"]["auth"].is_string(), "{fresh}");
    }

    #[test]
    fn the_deploy_runs_the_pushed_digest() {
        assert_eq!(
            pinned("127.0.0.1:5000/web:deployment-01J", "sha256:ab\n"),
            "127.0.0.1:5000/web@sha256:ab"
        );
    }
}
