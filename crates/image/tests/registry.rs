//! Pulls from a real registry (Debian's docker-registry on 127.0.0.1): by tag, by digest,
//! multi-arch indexes, basic auth, the Bearer token flow; progress; the shared layer cache
//! and overlay/copy rootfs built from the pulled layers.

mod common;

use bazaar_image::manifest::{Descriptor, Index, Platform, OCI_INDEX, OCI_MANIFEST};
use bazaar_image::StoreOptions;
use bazaar_image::{Auth, Error, ImageStore, PullPhase, PullProgress, Reference, RootfsKind};
use common::{busybox_layer, check_rootfs, push, top_layer, Machines, TestRegistry};
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::sync::Mutex;

fn reference(s: &str) -> Reference {
    s.parse().unwrap()
}

#[tokio::test]
async fn pull_by_tag_and_digest_with_progress() {
    let reg = TestRegistry::start(None);
    let store_dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(store_dir.path(), common::loopback_store()).unwrap();
    let client = store.registry(&reg.host, Auth::Anonymous).unwrap();
    let (bottom, top) = (busybox_layer(), top_layer());
    let digest = push(&client, "test/busybox", "v1", &[&bottom, &top], "amd64").await;

    let events = Mutex::new(Vec::<PullProgress>::new());
    let by_tag = reference(&format!("{}/test/busybox:v1", reg.host));
    let image = store
        .pull(&by_tag, &Auth::Anonymous, &|p| {
            events.lock().unwrap().push(p)
        })
        .await
        .unwrap();
    assert_eq!(image.manifest_digest, digest);
    assert_eq!(image.digest, digest);
    assert_eq!(image.layers.len(), 2);
    let events = std::mem::take(&mut *events.lock().unwrap());
    for l in [&bottom, &top] {
        let mine: Vec<_> = events.iter().filter(|e| e.layer == l.digest()).collect();
        assert!(mine.iter().any(|e| e.phase == PullPhase::Downloading));
        let last = mine.last().unwrap();
        assert_eq!(last.phase, PullPhase::Ready);
        assert_eq!(
            (last.done, last.total),
            (l.blob.len() as u64, l.blob.len() as u64)
        );
        assert!(store.layer_dir(&l.digest()).join(".").is_dir());
    }
    assert!(store
        .layer_dir(&bottom.digest())
        .join("bin/busybox")
        .is_file());
    assert_eq!(store.image(&by_tag).unwrap().as_ref(), Some(&image));

    // The process to run, from the image config.
    let p = image.process(None, &BTreeMap::new()).unwrap();
    assert_eq!(p.args, ["/bin/sh", "-c", "echo $GREETING"]);
    assert_eq!(p.env, ["PATH=/bin", "GREETING=hello"]);
    assert_eq!(p.cwd, "/tmp");

    // By digest: same image, all layers cached, nothing downloaded.
    let cached = Mutex::new(Vec::<PullPhase>::new());
    let by_digest = reference(&format!("{}/test/busybox@{digest}", reg.host));
    let again = store
        .pull(&by_digest, &Auth::Anonymous, &|p| {
            cached.lock().unwrap().push(p.phase)
        })
        .await
        .unwrap();
    assert_eq!(again.manifest_digest, digest);
    assert_eq!(
        *cached.lock().unwrap(),
        [PullPhase::Cached, PullPhase::Cached]
    );

    // Unknown tag: the registry's 404 comes back.
    let missing = reference(&format!("{}/test/busybox:nope", reg.host));
    let err = store
        .pull(&missing, &Auth::Anonymous, &|_| {})
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Registry { status: 404, .. }), "{err}");
}

#[tokio::test]
async fn multi_arch_index_resolves_to_this_platform() {
    let reg = TestRegistry::start(None);
    let store_dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(store_dir.path(), common::loopback_store()).unwrap();
    let client = store.registry(&reg.host, Auth::Anonymous).unwrap();
    let amd = common::layer(vec![common::file("arch", b"amd64")]);
    let arm = common::layer(vec![common::file("arch", b"arm64")]);
    let amd_digest = push(&client, "test/multi", "amd64", &[&amd], "amd64").await;
    let arm_digest = push(&client, "test/multi", "arm64", &[&arm], "arm64").await;
    let mut manifests = Vec::new();
    for (digest, arch) in [(&arm_digest, "arm64"), (&amd_digest, "amd64")] {
        let (bytes, _) = client
            .manifest("test/multi", digest.as_str())
            .await
            .unwrap();
        let mut d: Descriptor = common::descriptor(OCI_MANIFEST, &bytes);
        d.platform = Some(Platform {
            architecture: arch.into(),
            os: "linux".into(),
            variant: None,
        });
        manifests.push(d);
    }
    let index = serde_json::to_vec(&Index {
        schema_version: 2,
        media_type: Some(OCI_INDEX.into()),
        manifests,
    })
    .unwrap();
    let index_digest = client
        .push_manifest("test/multi", "latest", OCI_INDEX, &index)
        .await
        .unwrap();

    let image = store
        .pull(
            &reference(&format!("{}/test/multi", reg.host)),
            &Auth::Anonymous,
            &|_| {},
        )
        .await
        .unwrap();
    let here = Platform::current().architecture;
    let (want, content) = match here.as_str() {
        "amd64" => (&amd_digest, "amd64"),
        "arm64" => (&arm_digest, "arm64"),
        other => panic!("test expects amd64 or arm64, not {other}"),
    };
    assert_eq!(image.digest, index_digest);
    assert_eq!(&image.manifest_digest, want);
    assert_eq!(image.config.architecture, content);
    let layer = store.layer_dir(&image.layers[0].digest);
    assert_eq!(
        std::fs::read(layer.join("arch")).unwrap(),
        content.as_bytes()
    );

    // An index without this platform is a clear error.
    let (bytes, _) = client.manifest("test/multi", "amd64").await.unwrap();
    let mut only = common::descriptor(OCI_MANIFEST, &bytes);
    only.platform = Some(Platform {
        architecture: "s390x".into(),
        os: "linux".into(),
        variant: None,
    });
    let index = serde_json::to_vec(&Index {
        schema_version: 2,
        media_type: Some(OCI_INDEX.into()),
        manifests: vec![only],
    })
    .unwrap();
    client
        .push_manifest("test/multi", "s390x-only", OCI_INDEX, &index)
        .await
        .unwrap();
    let err = store
        .pull(
            &reference(&format!("{}/test/multi:s390x-only", reg.host)),
            &Auth::Anonymous,
            &|_| {},
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::NoPlatform { ref available, .. } if available == "linux/s390x"),
        "{err}"
    );
}

#[tokio::test]
async fn basic_auth_with_htpasswd() {
    let reg = TestRegistry::start(Some(("alice", "s3cret")));
    let store_dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(store_dir.path(), common::loopback_store()).unwrap();
    let alice = Auth::Basic {
        username: "alice".into(),
        password: "s3cret".into(),
    };
    let layer = busybox_layer();

    let anonymous = store.registry(&reg.host, Auth::Anonymous).unwrap();
    let err = anonymous
        .push_blob("private/app", &layer.blob)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Auth { .. }), "{err}");

    let client = store.registry(&reg.host, alice.clone()).unwrap();
    let digest = push(&client, "private/app", "v1", &[&layer], "amd64").await;
    let r = reference(&format!("{}/private/app:v1", reg.host));
    let err = store.pull(&r, &Auth::Anonymous, &|_| {}).await.unwrap_err();
    assert!(matches!(err, Error::Auth { .. }), "{err}");
    let wrong = Auth::Basic {
        username: "alice".into(),
        password: "wrong".into(),
    };
    let err = store.pull(&r, &wrong, &|_| {}).await.unwrap_err();
    assert!(err.to_string().contains("credentials refused"), "{err}");
    let image = store.pull(&r, &alice, &|_| {}).await.unwrap();
    assert_eq!(image.manifest_digest, digest);
}

#[tokio::test]
async fn rootfs_shares_layers_and_applies_whiteouts() {
    let reg = TestRegistry::start(None);
    let store_dir = tempfile::tempdir().unwrap();
    let machines = Machines::new();
    let store = ImageStore::open(store_dir.path(), common::loopback_store()).unwrap();
    let client = store.registry(&reg.host, Auth::Anonymous).unwrap();
    push(
        &client,
        "test/bb",
        "v1",
        &[&busybox_layer(), &top_layer()],
        "amd64",
    )
    .await;
    let r = reference(&format!("{}/test/bb:v1", reg.host));
    let image = store.pull(&r, &Auth::Anonymous, &|_| {}).await.unwrap();
    let layer_inodes: Vec<u64> = image
        .layers
        .iter()
        .map(|l| std::fs::metadata(store.layer_dir(&l.digest)).unwrap().ino())
        .collect();

    let (a, b) = (machines.path().join("a"), machines.path().join("b"));
    let ra = store.rootfs(&image, &a).await.unwrap();
    let rb = store.rootfs(&image, &b).await.unwrap();
    assert_eq!(store.rootfs_kind(&a).unwrap(), Some(RootfsKind::Overlay));
    for root in [&ra, &rb] {
        check_rootfs(root);
    }
    // One copy of each layer, shared: the same directories, nothing unpacked again.
    let after: Vec<u64> = image
        .layers
        .iter()
        .map(|l| std::fs::metadata(store.layer_dir(&l.digest)).unwrap().ino())
        .collect();
    assert_eq!(layer_inodes, after);
    assert_eq!(
        std::fs::read_dir(store_dir.path().join("layers/sha256"))
            .unwrap()
            .count(),
        2
    );
    // Writes stay in the machine's upper dir.
    std::fs::write(ra.join("etc/hello"), "changed by a").unwrap();
    assert_eq!(
        std::fs::read_to_string(rb.join("etc/hello")).unwrap(),
        "hello from layer 1\n"
    );
    let bottom = store.layer_dir(&image.layers[0].digest);
    assert_eq!(
        std::fs::read_to_string(bottom.join("etc/hello")).unwrap(),
        "hello from layer 1\n"
    );
    // Idempotent.
    assert_eq!(store.rootfs(&image, &a).await.unwrap(), ra);
    assert_eq!(
        std::fs::read_to_string(ra.join("etc/hello")).unwrap(),
        "changed by a"
    );
    // After a reboot (unmounted), the same layers and upper dir are mounted again.
    let umount = std::process::Command::new("umount")
        .arg(&ra)
        .status()
        .unwrap();
    assert!(umount.success());
    assert!(!ra.join("bin/busybox").exists());
    assert_eq!(store.rootfs(&image, &a).await.unwrap(), ra);
    assert_eq!(
        std::fs::read_to_string(ra.join("etc/hello")).unwrap(),
        "changed by a"
    );

    store.remove_rootfs(&a).await.unwrap();
    store.remove_rootfs(&b).await.unwrap();
    assert!(!ra.exists() && !a.join("upper").exists());
    assert!(
        bottom.join("bin/busybox").is_file(),
        "layers survive rootfs removal"
    );

    // Without overlayfs: a flattened copy, same view.
    let copying = ImageStore::open(
        store_dir.path(),
        StoreOptions {
            copy_rootfs: true,
            ..common::loopback_store()
        },
    )
    .unwrap();
    let c = machines.path().join("c");
    let rc = copying.rootfs(&image, &c).await.unwrap();
    assert_eq!(copying.rootfs_kind(&c).unwrap(), Some(RootfsKind::Copy));
    check_rootfs(&rc);
    copying.remove_rootfs(&c).await.unwrap();
    assert!(!rc.exists());
}

#[tokio::test]
async fn docker_v2_manifest_and_manifest_list() {
    use bazaar_image::manifest::{
        Manifest, DOCKER_CONFIG, DOCKER_LAYER_GZIP, DOCKER_LIST, DOCKER_MANIFEST,
    };
    let reg = TestRegistry::start(None);
    let store_dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(store_dir.path(), common::loopback_store()).unwrap();
    let client = store.registry(&reg.host, Auth::Anonymous).unwrap();
    let layer = busybox_layer();
    let config = common::config(&[&layer], "amd64");
    client.push_blob("test/docker", &layer.blob).await.unwrap();
    client.push_blob("test/docker", &config).await.unwrap();
    let manifest = serde_json::to_vec(&Manifest {
        schema_version: 2,
        media_type: Some(DOCKER_MANIFEST.into()),
        config: common::descriptor(DOCKER_CONFIG, &config),
        layers: vec![common::descriptor(DOCKER_LAYER_GZIP, &layer.blob)],
    })
    .unwrap();
    let digest = client
        .push_manifest("test/docker", "v2", DOCKER_MANIFEST, &manifest)
        .await
        .unwrap();
    let mut entry = common::descriptor(DOCKER_MANIFEST, &manifest);
    entry.platform = Some(Platform::current());
    let list = serde_json::to_vec(&Index {
        schema_version: 2,
        media_type: Some(DOCKER_LIST.into()),
        manifests: vec![entry],
    })
    .unwrap();
    let list_digest = client
        .push_manifest("test/docker", "list", DOCKER_LIST, &list)
        .await
        .unwrap();

    let v2 = reference(&format!("{}/test/docker:v2", reg.host));
    let image = store.pull(&v2, &Auth::Anonymous, &|_| {}).await.unwrap();
    assert_eq!((&image.digest, &image.manifest_digest), (&digest, &digest));
    let listed = reference(&format!("{}/test/docker:list", reg.host));
    let image = store
        .pull(&listed, &Auth::Anonymous, &|_| {})
        .await
        .unwrap();
    assert_eq!(
        (&image.digest, &image.manifest_digest),
        (&list_digest, &digest)
    );
    assert!(store
        .layer_dir(&image.layers[0].digest)
        .join("bin/busybox")
        .is_file());
}
