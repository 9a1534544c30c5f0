//! `bazaar deploy` from source, as `fly deploy` builds: an app directory with a Dockerfile
//! (`FROM scratch`, a static busybox, a page) and a fly.toml whose `[build]` is empty is
//! built by buildah, pushed to the cluster's own registry (the agent the CLI talks to),
//! deployed by digest as `registry.bazaar.internal/<app>@...` and served through every
//! proxy; a second deploy after a one-line change pushes only the changed layer; with
//! `--registry` the build goes to an external registry instead. Root (image machines).

use crate::deploy_support;

use bazaar_testkit::images::{ensure_packages, TestRegistry};
use deploy_support::*;
use std::time::Duration;

const FLY_TOML: &str = r#"app = "built"
primary_region = "ams"

[build]

[http_service]
  internal_port = 8080
"#;

const DOCKERFILE: &str = r#"FROM scratch
COPY busybox /bin/busybox
COPY www /www
CMD ["/bin/busybox", "httpd", "-f", "-p", "8080", "-h", "/www"]
"#;

/// Serves `page` through every proxy, eventually.
async fn serves(env: &Env, page: &str) {
    for a in &env.agents {
        let url = a.proxy_url();
        bazaar_testkit::eventually(Duration::from_secs(30), || {
            let url = url.clone();
            async move {
                let r = env
                    .http
                    .get(&url)
                    .header("host", "built.localhost")
                    .send()
                    .await
                    .ok()?;
                (r.text().await.ok()? == page).then_some(())
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{page:?} never served through {url}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dockerfile_is_built_pushed_and_deployed_by_digest() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() == 0 };
    if !bazaar_testkit::can_run(root, "root (image machines, buildah)") {
        return;
    }
    ensure_packages();
    assert!(
        std::process::Command::new("buildah")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success()),
        "buildah is needed (scripts/test installs it)"
    );
    let registry = TestRegistry::start(None);
    let _external = BuiltImages(format!("{}/built", registry.host));
    let env = Env::start();
    let api_host = env.agents[0]
        .url()
        .trim_start_matches("http://")
        .to_string();
    let _built = BuiltImages(format!("{api_host}/built"));
    let app_dir = env.dir.path().join("app");
    std::fs::create_dir_all(app_dir.join("www")).unwrap();
    std::fs::copy("/bin/busybox", app_dir.join("busybox")).unwrap();
    std::fs::write(app_dir.join("Dockerfile"), DOCKERFILE).unwrap();
    std::fs::write(app_dir.join("www/index.html"), "release one\n").unwrap();
    let fly = app_dir.join("fly.toml");
    std::fs::write(&fly, FLY_TOML).unwrap();
    let fly = fly.to_str().unwrap();

    // A dry run plans without building.
    let (ok, _, err) = env.cli(&["deploy", "-c", fly, "--dry-run"]);
    assert!(ok, "{err}");
    assert!(
        !err.contains("buildah") && !err.contains("building"),
        "{err}"
    );
    assert!(env.machines("built").await.is_empty());

    // No --registry: the cluster's own.
    let (ok, out, err) = env.cli(&["deploy", "-c", fly]);
    assert!(ok, "{out}\n{err}");
    assert!(
        err.contains("STEP") || err.contains("COPY"),
        "the builder's progress: {err}"
    );
    let machines = env.machines("built").await;
    assert_eq!(machines.len(), 1, "{machines:?}");
    let image = machines[0]["config"]["image"].as_str().unwrap().to_string();
    let pinned = "registry.bazaar.internal/built@sha256:";
    assert!(image.starts_with(pinned), "deployed by digest: {image}");
    serves(&env, "release one\n").await;

    // One changed line: only its layer is pushed again; the new digest is deployed.
    std::fs::write(app_dir.join("www/index.html"), "release two\n").unwrap();
    let (ok, out, err) = env.cli(&["deploy", "-c", fly]);
    assert!(ok, "{out}\n{err}");
    let machines = env.machines("built").await;
    let second = machines[0]["config"]["image"].as_str().unwrap().to_string();
    assert!(second.starts_with(pinned) && second != image, "{second}");
    serves(&env, "release two\n").await;
    let token = bazaar_testkit::api_token();
    let (one, two) = (
        layers(&env, &api_host, Some(token), &image).await,
        layers(&env, &api_host, Some(token), &second).await,
    );
    assert_eq!(one.len(), 2, "{one:?}");
    assert_eq!(
        one[0], two[0],
        "the busybox layer is the same blob, not pushed again"
    );
    assert_ne!(one[1], two[1], "the changed page is a new layer");
    // The registry logs each blob it takes: the busybox layer once, over both deploys.
    let log = std::fs::read_to_string(env.agents[0].data_dir.join("agent.log")).unwrap();
    let pushed = |digest: &str| {
        log.lines()
            .filter(|l| l.contains("blob pushed") && l.contains(digest))
            .count()
    };
    assert_eq!(pushed(&one[0]), 1, "the unchanged layer is uploaded once");
    assert_eq!(pushed(&two[1]), 1, "the changed one is uploaded");

    // With --registry, to an external registry the hosts pull from.
    std::fs::write(app_dir.join("www/index.html"), "release three\n").unwrap();
    let (ok, out, err) = env.cli(&["deploy", "-c", fly, "--registry", &registry.host]);
    assert!(ok, "{out}\n{err}");
    let machines = env.machines("built").await;
    let third = machines[0]["config"]["image"].as_str().unwrap().to_string();
    let external = format!("{}/built@sha256:", registry.host);
    assert!(third.starts_with(&external), "{third}");
    serves(&env, "release three\n").await;
    assert_eq!(layers(&env, &registry.host, None, &third).await.len(), 2);
}

/// The layer digests of the pushed image `pinned` (`NAME/REPO@DIGEST`), from the registry
/// at `host`.
async fn layers(env: &Env, host: &str, token: Option<&str>, pinned: &str) -> Vec<String> {
    let (name, digest) = pinned.split_once('@').unwrap();
    let repo = name.split_once('/').unwrap().1;
    let mut req = env
        .http
        .get(format!("http://{host}/v2/{repo}/manifests/{digest}"))
        .header(
            "accept",
            "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json",
        );
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let manifest: serde_json::Value = req.send().await.unwrap().json().await.unwrap();
    manifest["layers"]
        .as_array()
        .unwrap_or_else(|| panic!("{manifest}"))
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_string())
        .collect()
}

/// Removes the images a test built from the host's buildah storage.
pub(crate) struct BuiltImages(pub(crate) String);

impl Drop for BuiltImages {
    fn drop(&mut self) {
        let listed = std::process::Command::new("buildah")
            .args(["images", "--format", "{{.Name}}:{{.Tag}}"])
            .output();
        for name in listed
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
            .lines()
            .filter(|n| n.starts_with(&self.0))
        {
            let _ = std::process::Command::new("buildah")
                .args(["rmi", "-f", name])
                .output();
        }
    }
}
