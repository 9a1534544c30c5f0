//! The registry on an in-process agent: pushes and pulls with our own registry client over
//! loopback (what the agent's pulls use), the distribution API's upload rules and error
//! answers by `oneshot`, and the Machines API's tokens: a token of app A neither pushes
//! to nor pulls from app B's repository.

use axum::body::Body;
use axum::http::{header, HeaderMap, Method, Request, StatusCode};
use bazaar_auth::Scope;
use bazaar_image::{Auth, Digest, ImageStore, Registry, StoreOptions};
use bazaar_registry::RegistryConfig;
use bazaar_testkit::images::{self, file, layer};
use bazaar_testkit::in_process::InProcessAgent;
use bazaar_testkit::tokens;
use std::net::SocketAddr;
use tower::ServiceExt;

/// The most one upload may bring in these tests.
const LIMIT: u64 = 1 << 20;

struct Fixture {
    agent: InProcessAgent,
    router: axum::Router,
    addr: SocketAddr,
    store: ImageStore,
    server: tokio::task::JoinHandle<()>,
    dir: tempfile::TempDir,
}

impl Fixture {
    async fn start() -> Fixture {
        let agent = InProcessAgent::start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path().join("images"), StoreOptions::default()).unwrap();
        let router = bazaar_registry::router(
            agent.node(),
            store.clone(),
            RegistryConfig {
                max_blob_bytes: LIMIT,
                max_uploads: 4,
            },
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let served = router.clone();
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, served).await;
        });
        Fixture {
            agent,
            router,
            addr,
            store,
            server,
            dir,
        }
    }

    /// Our registry client on this registry with `token` as Basic credentials (as
    /// buildah's `--creds x:TOKEN`).
    fn client(&self, token: &str) -> Registry {
        let auth = Auth::Basic {
            username: "x".into(),
            password: token.into(),
        };
        Registry::new(&self.addr.to_string(), auth, true).unwrap()
    }

    /// A request with no headers and no body.
    async fn send(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
    ) -> (StatusCode, HeaderMap, Vec<u8>) {
        self.call(method, path, token, &[], vec![]).await
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> (StatusCode, HeaderMap, Vec<u8>) {
        let mut req = Request::builder().method(method).uri(path);
        if let Some(t) = token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req
            .header(header::CONTENT_LENGTH, body.len())
            .body(Body::from(body))
            .unwrap();
        let resp = self.router.clone().oneshot(req).await.unwrap();
        let (status, headers) = (resp.status(), resp.headers().clone());
        let bytes = axum::body::to_bytes(resp.into_body(), 16 << 20)
            .await
            .unwrap();
        (status, headers, bytes.to_vec())
    }

    async fn stop(self) {
        self.server.abort();
        self.agent.stop().await;
        drop(self.dir);
    }
}

fn app_token(app: &str) -> String {
    tokens::mint(&Scope {
        apps: [app.to_string()].into(),
        ..Scope::default()
    })
}

fn read_only_token(app: &str) -> String {
    tokens::mint(&Scope {
        apps: [app.to_string()].into(),
        read_only: true,
        ..Scope::default()
    })
}

/// The code of a distribution error body.
fn code(body: &[u8]) -> String {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    v["errors"][0]["code"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn location(headers: &HeaderMap) -> String {
    headers[header::LOCATION].to_str().unwrap().to_string()
}

#[tokio::test]
async fn an_image_pushed_with_a_token_of_its_app_is_pulled_back_whole() {
    let fx = Fixture::start().await;
    let token = app_token("web");
    let base = layer(vec![file("etc/motd", b"base\n")]);
    let top = layer(vec![file("www/index.html", b"hello\n")]);
    let pushed = images::push(&fx.client(&token), "web", "v1", &[&base, &top], "amd64").await;
    // A nested repository of the app too.
    images::push(&fx.client(&token), "web/worker", "v1", &[&base], "amd64").await;

    let (status, headers, body) = fx
        .send(Method::GET, "/v2/web/tags/list", Some(&token))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["docker-distribution-api-version"], "registry/2.0");
    let tags: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(tags, serde_json::json!({"name": "web", "tags": ["v1"]}));
    let (status, headers, _) = fx
        .send(Method::HEAD, "/v2/web/manifests/v1", Some(&token))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["docker-content-digest"], pushed.as_str());

    // Pulled with the client and store the agent pulls with, over loopback.
    let pull_dir = tempfile::tempdir().unwrap();
    let puller = ImageStore::open(
        pull_dir.path(),
        StoreOptions {
            allow_loopback_registries: true,
            copy_rootfs: true,
            ..StoreOptions::default()
        },
    )
    .unwrap();
    let reference = format!("{}/web:v1", fx.addr).parse().unwrap();
    let auth = Auth::Basic {
        username: "x".into(),
        password: token.clone(),
    };
    let image = puller.pull(&reference, &auth, &|_| {}).await.unwrap();
    assert_eq!(image.digest, pushed);
    assert_eq!(image.layers.len(), 2);
    let served = std::fs::read(puller.layer_dir(&top.digest()).join("www/index.html")).unwrap();
    assert_eq!(served, b"hello\n");

    // Garbage collection keeps what the repositories hold.
    fx.store.gc(&[]).await.unwrap();
    let path = format!("/v2/web/blobs/{}", top.digest());
    let (status, headers, body) = fx.send(Method::GET, &path, Some(&token)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, top.blob);
    assert_eq!(headers["docker-content-digest"], top.digest().as_str());
    fx.stop().await;
}

#[tokio::test]
async fn a_token_of_app_a_neither_pushes_to_nor_pulls_from_app_b() {
    let fx = Fixture::start().await;
    let secret = layer(vec![file("secret", b"b's\n")]);
    images::push(&fx.client(tokens::admin()), "b", "v1", &[&secret], "amd64").await;
    let token_a = app_token("a");
    let blob = format!("/v2/b/blobs/{}", secret.digest());
    for (method, path) in [
        (Method::GET, "/v2/b/manifests/v1"),
        (Method::HEAD, "/v2/b/manifests/v1"),
        (Method::GET, "/v2/b/tags/list"),
        (Method::GET, blob.as_str()),
        (Method::POST, "/v2/b/blobs/uploads/"),
        (Method::PUT, "/v2/b/manifests/v2"),
        (Method::GET, "/v2/b/other/tags/list"),
    ] {
        let (status, _, body) = fx
            .call(method.clone(), path, Some(&token_a), &[], vec![])
            .await;
        // As the Machines API answers a hidden app: as if it did not exist.
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}");
        if method != Method::HEAD {
            assert_eq!(code(&body), "NAME_UNKNOWN", "{method} {path}");
        }
    }
    // And through a real client: the push fails, B's repository is unchanged.
    let mine = layer(vec![file("mine", b"a's\n")]);
    let pushed = fx.client(&token_a).push_blob("b", &mine.blob).await;
    assert!(pushed.is_err(), "{pushed:?}");
    let (status, headers, _) = fx
        .send(Method::GET, "/v2/b/tags/list", Some(tokens::admin()))
        .await;
    assert_eq!(status, StatusCode::OK, "{headers:?}");
    let path = format!("/v2/b/blobs/{}", mine.digest());
    let (status, _, _) = fx.send(Method::HEAD, &path, Some(tokens::admin())).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // A read-only token of B pulls, but does not push.
    let reader = read_only_token("b");
    let (status, _, _) = fx.send(Method::GET, &blob, Some(&reader)).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, body) = fx
        .send(Method::POST, "/v2/b/blobs/uploads/", Some(&reader))
        .await;
    assert_eq!(
        (status, code(&body).as_str()),
        (StatusCode::FORBIDDEN, "DENIED")
    );

    // No credentials, or a forged token: 401 with a challenge clients answer.
    for token in [None, Some("not-a-token")] {
        let (status, headers, body) = fx.send(Method::GET, "/v2/", token).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(code(&body), "UNAUTHORIZED");
        assert!(
            headers[header::WWW_AUTHENTICATE]
                .to_str()
                .unwrap()
                .starts_with("Basic realm="),
            "{headers:?}"
        );
    }
    let (status, _, _) = fx.send(Method::GET, "/v2/", Some(&token_a)).await;
    assert_eq!(status, StatusCode::OK);
    fx.stop().await;
}

#[tokio::test]
async fn chunked_uploads_are_checked_against_their_digest_before_they_enter_the_store() {
    let fx = Fixture::start().await;
    let token = app_token("web");
    let t = Some(token.as_str());
    let data = b"0123456789abcdefghij".to_vec();
    let digest = Digest::of(&data);

    // POST, PATCH, PATCH, PUT ?digest=.
    let (status, headers, _) = fx.send(Method::POST, "/v2/web/blobs/uploads/", t).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let upload = location(&headers);
    assert_eq!(headers[header::RANGE], "0-0");
    let (status, headers, _) = fx
        .call(
            Method::PATCH,
            &upload,
            t,
            &[("content-range", "0-9")],
            data[..10].to_vec(),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(headers[header::RANGE], "0-9");
    // A chunk that does not continue the upload.
    let (status, _, body) = fx
        .call(
            Method::PATCH,
            &upload,
            t,
            &[("content-range", "12-15")],
            data[12..16].to_vec(),
        )
        .await;
    assert_eq!(status, StatusCode::RANGE_NOT_SATISFIABLE);
    assert_eq!(code(&body), "BLOB_UPLOAD_INVALID");
    let (status, _, _) = fx
        .call(Method::PATCH, &upload, t, &[], data[10..].to_vec())
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    // The upload is this repository's only.
    let other = upload.replace("/v2/web/", "/v2/web/other/");
    let (status, _, body) = fx.send(Method::GET, &other, t).await;
    assert_eq!(
        (status, code(&body).as_str()),
        (StatusCode::NOT_FOUND, "BLOB_UPLOAD_UNKNOWN")
    );
    let (status, headers, _) = fx
        .send(Method::PUT, &format!("{upload}?digest={digest}"), t)
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers["docker-content-digest"], digest.as_str());
    let (status, _, body) = fx.send(Method::GET, &location(&headers), t).await;
    assert_eq!((status, body), (StatusCode::OK, data.clone()));
    // Finished uploads are gone.
    let (status, _, _) = fx.call(Method::PATCH, &upload, t, &[], b"x".to_vec()).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // A blob whose content is not its digest: 400, and nothing of it is kept.
    let liar = Digest::of(b"something else");
    let path = format!("/v2/web/blobs/uploads/?digest={liar}");
    let (status, _, body) = fx
        .call(Method::POST, &path, t, &[], b"the content".to_vec())
        .await;
    assert_eq!(
        (status, code(&body).as_str()),
        (StatusCode::BAD_REQUEST, "DIGEST_INVALID")
    );
    let blob = format!("/v2/web/blobs/{liar}");
    let (status, _, body) = fx.send(Method::GET, &blob, t).await;
    assert_eq!(
        (status, code(&body).as_str()),
        (StatusCode::NOT_FOUND, "BLOB_UNKNOWN")
    );
    assert!(!fx.store.blob_path(&liar).exists());
    assert!(!fx.store.blob_path(&Digest::of(b"the content")).exists());
    let tmp: Vec<_> = std::fs::read_dir(fx.store.root().join("tmp"))
        .unwrap()
        .collect();
    assert!(tmp.is_empty(), "{tmp:?}");

    // A cross-repository mount is not taken: an upload starts instead (202), as the spec
    // allows.
    let mount = format!("/v2/web/blobs/uploads/?mount={digest}&from=web");
    let (status, headers, _) = fx.send(Method::POST, &mount, t).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert!(location(&headers).starts_with("/v2/web/blobs/uploads/"));
    let (status, _, _) = fx.send(Method::DELETE, &location(&headers), t).await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    // Over the limit: 413, the upload dropped.
    let (_, headers, _) = fx.send(Method::POST, "/v2/web/blobs/uploads/", t).await;
    let upload = location(&headers);
    let big = vec![7u8; LIMIT as usize + 1];
    let (status, _, body) = fx.call(Method::PATCH, &upload, t, &[], big.clone()).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(String::from_utf8_lossy(&body).contains(&LIMIT.to_string()));
    let (status, _, _) = fx.send(Method::GET, &upload, t).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let path = format!("/v2/web/blobs/uploads/?digest={}", Digest::of(&big));
    let (status, _, _) = fx.call(Method::POST, &path, t, &[], big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);

    // A bad digest and a bad name are told apart.
    let (status, _, body) = fx.send(Method::GET, "/v2/web/blobs/sha256:zz", t).await;
    assert_eq!(
        (status, code(&body).as_str()),
        (StatusCode::BAD_REQUEST, "DIGEST_INVALID")
    );
    let (status, _, body) = fx.send(Method::GET, "/v2/Web/tags/list", t).await;
    assert_eq!(
        (status, code(&body).as_str()),
        (StatusCode::BAD_REQUEST, "NAME_INVALID")
    );
    fx.stop().await;
}

#[tokio::test]
async fn a_manifest_is_taken_only_with_its_blobs_and_its_own_digest() {
    let fx = Fixture::start().await;
    let token = app_token("web");
    let t = Some(token.as_str());
    let l = layer(vec![file("a", b"a\n")]);
    let config = images::config(&[&l], "amd64");
    let manifest = images::manifest(&config, &[&l]);
    let oci = [("content-type", bazaar_image::manifest::OCI_MANIFEST)];
    // Its blobs are not pushed yet.
    let (status, _, body) = fx
        .call(
            Method::PUT,
            "/v2/web/manifests/v1",
            t,
            &oci,
            manifest.clone(),
        )
        .await;
    assert_eq!(
        (status, code(&body).as_str()),
        (StatusCode::BAD_REQUEST, "MANIFEST_BLOB_UNKNOWN")
    );
    let client = fx.client(&token);
    client.push_blob("web", &l.blob).await.unwrap();
    client.push_blob("web", &config).await.unwrap();
    // Pushed under a digest that is not its own.
    let wrong = format!("/v2/web/manifests/{}", Digest::of(b"x"));
    let (status, _, body) = fx
        .call(Method::PUT, &wrong, t, &oci, manifest.clone())
        .await;
    assert_eq!(
        (status, code(&body).as_str()),
        (StatusCode::BAD_REQUEST, "DIGEST_INVALID")
    );
    let (status, _, body) = fx
        .call(
            Method::PUT,
            "/v2/web/manifests/v1",
            t,
            &oci,
            b"{not json".to_vec(),
        )
        .await;
    assert_eq!(
        (status, code(&body).as_str()),
        (StatusCode::BAD_REQUEST, "MANIFEST_INVALID")
    );
    let (status, _, body) = fx.send(Method::GET, "/v2/web/manifests/v1", t).await;
    assert_eq!(
        (status, code(&body).as_str()),
        (StatusCode::NOT_FOUND, "MANIFEST_UNKNOWN")
    );
    let (status, _, body) = fx.send(Method::GET, "/v2/web/tags/list", t).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));

    let (status, headers, _) = fx
        .call(
            Method::PUT,
            "/v2/web/manifests/v1",
            t,
            &oci,
            manifest.clone(),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let digest = Digest::of(&manifest);
    assert_eq!(headers["docker-content-digest"], digest.as_str());
    for path in [
        "/v2/web/manifests/v1".to_string(),
        format!("/v2/web/manifests/{digest}"),
    ] {
        let (status, headers, body) = fx.send(Method::GET, &path, t).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            headers[header::CONTENT_TYPE],
            bazaar_image::manifest::OCI_MANIFEST
        );
        assert_eq!(body, manifest);
    }
    // Nobody pushed to this one.
    let (status, _, body) = fx.send(Method::GET, "/v2/web/none/tags/list", t).await;
    assert_eq!(
        (status, code(&body).as_str()),
        (StatusCode::NOT_FOUND, "NAME_UNKNOWN")
    );
    fx.stop().await;
}

#[tokio::test]
async fn retention_lets_old_releases_go_and_the_store_frees_their_blobs() {
    let fx = Fixture::start().await;
    let token = app_token("web");
    let client = fx.client(&token);
    let shared = layer(vec![file("bin/app", b"shared\n")]);
    let mut releases = Vec::new();
    for (i, page) in [b"one\n", b"two\n", b"tri\n"].iter().enumerate() {
        let own = layer(vec![file("www/index.html", *page)]);
        let digest =
            images::push(&client, "web", &format!("v{i}"), &[&shared, &own], "amd64").await;
        // Pushed an hour apart, oldest first.
        let link = fx
            .store
            .root()
            .join("repos/web/_manifests")
            .join(digest.hex());
        let when =
            std::time::SystemTime::now() - std::time::Duration::from_secs(3600 * (3 - i as u64));
        std::fs::File::options()
            .write(true)
            .open(&link)
            .unwrap()
            .set_modified(when)
            .unwrap();
        releases.push((digest, own));
    }
    // A machine (its row in the catalog) still runs the first release.
    let config = bazaar_types::config::MachineConfig {
        image: format!("registry.bazaar.internal/web@{}", releases[0].0),
        ..Default::default()
    };
    fx.agent
        .catalog
        .publish_machine(bazaar_catalog::MachineRecord {
            id: "m1".into(),
            app: "web".into(),
            state: "started".into(),
            config: Some(Box::new(config)),
            ..Default::default()
        });
    let rule = bazaar_registry::retention::Retention {
        newest: 1,
        grace: std::time::Duration::ZERO,
    };
    let gone = bazaar_registry::retention::apply(&fx.agent.node(), &fx.store, rule).unwrap();
    assert_eq!(
        gone, 1,
        "only the release nothing runs and that is not the newest"
    );
    fx.store.gc(&[]).await.unwrap();
    let t = Some(token.as_str());
    let (_, _, body) = fx.send(Method::GET, "/v2/web/tags/list", t).await;
    let tags: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        tags["tags"],
        serde_json::json!(["v0", "v2"]),
        "a release let go takes its tag"
    );
    for (i, (digest, own)) in releases.iter().enumerate() {
        let kept = i != 1;
        let (status, _, _) = fx
            .send(Method::GET, &format!("/v2/web/manifests/{digest}"), t)
            .await;
        assert_eq!(status == StatusCode::OK, kept, "release {i}");
        assert_eq!(
            fx.store.blob_path(&own.digest()).exists(),
            kept,
            "release {i}'s layer"
        );
    }
    // The layer every release shares stays with the newest.
    let (status, _, _) = fx
        .call(
            Method::GET,
            &format!("/v2/web/blobs/{}", shared.digest()),
            t,
            &[],
            vec![],
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    fx.stop().await;
}

#[tokio::test]
async fn a_manifest_is_deleted_by_tag_or_digest_only_with_a_token_that_may_push_to_it() {
    let fx = Fixture::start().await;
    let token = app_token("web");
    let top = layer(vec![file("www/index.html", b"doomed\n")]);
    let pushed = images::push(&fx.client(&token), "web", "v1", &[&top], "amd64").await;
    let by_digest = format!("/v2/web/manifests/{pushed}");
    let status = |(s, _, _): (StatusCode, HeaderMap, Vec<u8>)| s;

    // Another app's token does not see the repository; a read-only one may not delete.
    let (s, _, body) = fx
        .send(Method::DELETE, &by_digest, Some(&app_token("other")))
        .await;
    assert_eq!(
        (s, code(&body).as_str()),
        (StatusCode::NOT_FOUND, "NAME_UNKNOWN")
    );
    let (s, _, body) = fx
        .send(Method::DELETE, &by_digest, Some(&read_only_token("web")))
        .await;
    assert_eq!((s, code(&body).as_str()), (StatusCode::FORBIDDEN, "DENIED"));
    let (s, _, _) = fx.send(Method::GET, &by_digest, Some(&token)).await;
    assert_eq!(s, StatusCode::OK, "nothing was deleted");

    // By tag: the tag goes, the manifest stays under its digest.
    let (s, _, _) = fx
        .send(Method::DELETE, "/v2/web/manifests/v1", Some(&token))
        .await;
    assert_eq!(s, StatusCode::ACCEPTED);
    let (s, _, body) = fx
        .send(Method::GET, "/v2/web/manifests/v1", Some(&token))
        .await;
    assert_eq!(
        (s, code(&body).as_str()),
        (StatusCode::NOT_FOUND, "MANIFEST_UNKNOWN")
    );
    let get = fx.send(Method::GET, &by_digest, Some(&token)).await;
    assert_eq!(status(get), StatusCode::OK);

    // By digest: the manifest and any tag naming it go; a second delete finds nothing.
    images::push(&fx.client(&token), "web", "v2", &[&top], "amd64").await;
    let (s, _, _) = fx.send(Method::DELETE, &by_digest, Some(&token)).await;
    assert_eq!(s, StatusCode::ACCEPTED);
    for path in [by_digest.as_str(), "/v2/web/manifests/v2"] {
        let (s, _, body) = fx.send(Method::GET, path, Some(&token)).await;
        assert_eq!(
            (s, code(&body).as_str()),
            (StatusCode::NOT_FOUND, "MANIFEST_UNKNOWN"),
            "{path}"
        );
    }
    let (_, _, body) = fx
        .send(Method::GET, "/v2/web/tags/list", Some(&token))
        .await;
    let tags: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(tags["tags"], serde_json::json!([]), "{tags}");
    let (s, _, body) = fx.send(Method::DELETE, &by_digest, Some(&token)).await;
    assert_eq!(
        (s, code(&body).as_str()),
        (StatusCode::NOT_FOUND, "MANIFEST_UNKNOWN")
    );
    let (s, _, body) = fx
        .send(Method::DELETE, "/v2/web/manifests/v9", Some(&token))
        .await;
    assert_eq!(
        (s, code(&body).as_str()),
        (StatusCode::NOT_FOUND, "MANIFEST_UNKNOWN")
    );
    // The blob a push may still need stays within the grace (the store's collection
    // frees it after).
    let blob = format!("/v2/web/blobs/{}", top.digest());
    let (s, _, _) = fx.send(Method::GET, &blob, Some(&token)).await;
    assert_eq!(s, StatusCode::OK);
    fx.stop().await;
}
