//! Issue 38's acceptance on a 3-host `bazaar lab` (root): a Debian base image the test kit
//! makes from Debian's packages is pushed into the cluster's registry (`bazaar image
//! push`, as an operator mirrors a base); an app directory whose Dockerfile starts `FROM`
//! it (as machines name it, `registry.bazaar.internal/...`), `COPY`s a static busybox and a
//! page and runs the base's own shell (`CMD`; it exits on the stop signal, so a replaced
//! machine does not wait out its kill timeout), goes through `bazaar deploy`: buildah builds
//! it, it is pushed to h1 only, h2 and h3 fetch every layer from a peer (their logs name
//! the host that served each one), and every proxy serves the page. A second deploy after a
//! one-line change pushes only the changed layer, and only it travels between hosts.

use crate::common;
use crate::deploy_build::BuiltImages;
use crate::lab_support;

use bazaar_testkit::debian_base::push_debian_base;
use common::EXE;
use lab_support::{until, LabApi as Api, TestLab};
use reqwest::StatusCode;
use serde_json::json;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const HOSTS: [&str; 3] = ["h1", "h2", "h3"];

const DOCKERFILE: &str = r#"FROM registry.bazaar.internal/built/debian:bookworm
COPY busybox /bin/busybox-static
COPY www /www
CMD ["/bin/sh", "-c", "trap 'exit 0' INT TERM; /bin/busybox-static httpd -f -p 8080 -h /www & wait"]
"#;

const FLY_TOML: &str = r#"app = "built"
primary_region = "ams"

[build]

[http_service]
  internal_port = 8080
"#;

/// `bazaar ARGS` against h1 with the lab's token; panics unless it succeeds; answers
/// stdout and stderr.
fn cli(api_url: &str, token: &str, args: &[&str]) -> String {
    let out = Command::new(EXE)
        .args(args)
        .env("BAZAAR_API_URL", api_url)
        .env("BAZAAR_TOKEN", token)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "bazaar {args:?}: {text}");
    text
}

/// The lines of `log` that come after its first `skip` lines and contain `what`.
fn log_lines(log: &Path, skip: usize, what: &str) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .skip(skip)
        .filter(|l| l.contains(what))
        .map(str::to_string)
        .collect()
}

fn line_count(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .count()
}

/// A blob or manifest of the repository `built`, from h1's registry.
async fn registry_get(api: &Api, path: &str) -> serde_json::Value {
    api.http
        .get(format!("{}/v2/built/{path}", api.base))
        .bearer_auth(&api.token)
        .header(
            "accept",
            "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json",
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The layer digests of `built@digest`, and the diff ids its config lists.
async fn layers(api: &Api, image: &str) -> (Vec<String>, Vec<String>) {
    let digest = image.split_once('@').unwrap().1;
    let manifest = registry_get(api, &format!("manifests/{digest}")).await;
    let config_digest = manifest["config"]["digest"].as_str().unwrap();
    let config = registry_get(api, &format!("blobs/{config_digest}")).await;
    let strings = |v: &serde_json::Value, key: Option<&str>| -> Vec<String> {
        v.as_array()
            .unwrap_or_else(|| panic!("{manifest}\n{config}"))
            .iter()
            .map(|x| key.map_or(x, |k| &x[k]).as_str().unwrap().to_string())
            .collect()
    };
    (
        strings(&manifest["layers"], Some("digest")),
        strings(&config["rootfs"]["diff_ids"], None),
    )
}

/// The app's machines: (region, image) each.
async fn machines(api: &Api) -> Vec<(String, String)> {
    let (s, v) = api.get("/v1/apps/built/machines").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    v.as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["region"].as_str().unwrap_or("").to_string(),
                m["config"]["image"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// Every proxy of the lab answers `page` for the app, eventually.
async fn served_everywhere(lab: &bazaar_lab::Lab, page: &str) {
    let http = reqwest::Client::new();
    for name in HOSTS {
        let url = lab.proxy_url(&lab.host(name).unwrap());
        until(
            60,
            &format!("{page:?} served through {name}'s proxy"),
            || {
                let req = http
                    .get(&url)
                    .header("host", "built.localhost")
                    .timeout(Duration::from_secs(5));
                async move {
                    match req.send().await {
                        Ok(r) => r.text().await.is_ok_and(|t| t == page),
                        Err(_) => false,
                    }
                }
            },
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_built_from_a_cluster_base_is_pushed_once_and_spread_by_peers() {
    if !bazaar_testkit::can_run(common::is_root(), "root (the lab, image machines, buildah)") {
        return;
    }
    bazaar_testkit::images::ensure_packages();
    assert!(
        Command::new("buildah")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success()),
        "buildah is needed (scripts/test-deps installs it)"
    );
    let (t, _) = TestLab::up(
        "regbuild",
        &[
            "--hosts",
            "3",
            "--regions",
            "ams,ord,sjc",
            "--wait-converged",
        ],
    );
    let t = t.show_log_lines(|l| {
        l.contains("ERROR") || l.contains("WARN") || l.contains("blob") || l.contains("pull")
    });
    let lab = t.lab();
    let h1 = lab.host("h1").unwrap();
    let api_url = lab.api_url(&h1);
    let api_host = api_url.trim_start_matches("http://").to_string();
    let _built = BuiltImages(format!("{api_host}/built"));
    let _base = BuiltImages("registry.bazaar.internal/built".into());
    let token = lab.token().to_string();
    let apis: Vec<Api> = HOSTS.iter().map(|h| Api::of(&lab, h)).collect();
    let mut ids = Vec::new();
    for api in &apis {
        let (s, info) = api.get("/host/v1/info").await;
        assert_eq!(s, StatusCode::OK, "{info}");
        ids.push(info["id"].as_str().unwrap().to_string());
    }
    let logs: Vec<_> = HOSTS
        .iter()
        .map(|h| lab.log_file(&lab.host(h).unwrap()))
        .collect();

    // The operator mirrors the base into the app's repository.
    let (s, v) = apis[0]
        .post(
            "/v1/apps",
            json!({"app_name": "built", "org_slug": "personal"}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let base = bazaar_testkit::debian_base::debian_base();
    let mirrored = push_debian_base(Path::new(EXE), &api_url, &token, "built/debian:bookworm");
    assert!(
        mirrored.starts_with("registry.bazaar.internal/built/debian@sha256:"),
        "{mirrored}"
    );

    let dir = tempfile::tempdir().unwrap();
    let app = dir.path();
    std::fs::create_dir_all(app.join("www")).unwrap();
    std::fs::copy("/bin/busybox", app.join("busybox")).unwrap();
    std::fs::write(app.join("Dockerfile"), DOCKERFILE).unwrap();
    std::fs::write(app.join("www/index.html"), "release one\n").unwrap();
    std::fs::write(app.join("fly.toml"), FLY_TOML).unwrap();
    let fly = app.join("fly.toml");
    let fly = fly.to_str().unwrap();
    let deploy = [
        "deploy",
        "-c",
        fly,
        "--count",
        "3",
        "--regions",
        "ams,ord,sjc",
    ];

    let out = cli(&api_url, &token, &deploy);
    assert!(out.contains("STEP") || out.contains("COPY"), "{out}");
    let placed = machines(&apis[0]).await;
    let regions: BTreeSet<&str> = placed.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(regions.len(), 3, "one machine on each host: {placed:?}");
    let image = placed[0].1.clone();
    assert!(
        image.starts_with("registry.bazaar.internal/built@sha256:"),
        "{image}"
    );
    served_everywhere(&lab, "release one\n").await;

    let (one, diff_ids) = layers(&apis[0], &image).await;
    assert_eq!(one.len(), 3, "base, busybox, page: {one:?}");
    assert_eq!(
        diff_ids[0],
        base.diff_id.to_string(),
        "the image is built on the mirrored base"
    );
    // h1 was pushed to; h2 and h3 fetched every layer from a peer, named in their logs.
    for digest in &one {
        assert!(
            log_lines(&logs[0], 0, "blob fetched from a peer")
                .iter()
                .all(|l| !l.contains(digest.as_str())),
            "h1 holds what was pushed to it"
        );
        for n in [1, 2] {
            let fetched = log_lines(&logs[n], 0, "blob fetched from a peer");
            let line = fetched
                .iter()
                .find(|l| l.contains(digest.as_str()))
                .unwrap_or_else(|| {
                    panic!("{} fetched {digest} from no peer: {fetched:?}", HOSTS[n])
                });
            let served_by: Vec<usize> = (0..3).filter(|&i| line.contains(&ids[i])).collect();
            assert!(
                served_by.len() == 1 && served_by[0] != n,
                "{} names the other host that served {digest}: {line}",
                HOSTS[n]
            );
            eprintln!("{} got {digest} from {}", HOSTS[n], HOSTS[served_by[0]]);
        }
    }

    // One changed line: one layer pushed, one layer fetched by the others.
    let marks: Vec<usize> = logs.iter().map(|l| line_count(l)).collect();
    std::fs::write(app.join("www/index.html"), "release two\n").unwrap();
    cli(&api_url, &token, &deploy);
    let second = machines(&apis[0]).await;
    assert!(second.iter().all(|(_, i)| i != &image), "{second:?}");
    served_everywhere(&lab, "release two\n").await;
    let (two, _) = layers(&apis[0], &second[0].1).await;
    assert_eq!(one[..2], two[..2], "base and busybox are the same blobs");
    assert_ne!(one[2], two[2], "the page is a new layer");
    let pushed = log_lines(&logs[0], marks[0], "blob pushed");
    assert!(
        pushed.iter().any(|l| l.contains(&two[2])),
        "the changed layer is pushed: {pushed:?}"
    );
    for unchanged in &one[..2] {
        assert!(
            pushed.iter().all(|l| !l.contains(unchanged.as_str())),
            "{unchanged} is not pushed again: {pushed:?}"
        );
        for n in [1, 2] {
            assert!(
                log_lines(&logs[n], marks[n], "blob fetched from a peer")
                    .iter()
                    .all(|l| !l.contains(unchanged.as_str())),
                "{} fetched {unchanged} again",
                HOSTS[n]
            );
        }
    }
}
