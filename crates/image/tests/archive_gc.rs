//! `import_archive` of a `docker save` tarball and of an OCI layout (dir and tar), and
//! garbage collection of what no image or live rootfs uses.

mod common;

use bazaar_image::manifest::{Index, OCI_MANIFEST};
use bazaar_image::{Digest, ImageStore, Reference};
use common::{busybox_layer, check_rootfs, top_layer, Machines};
use std::collections::BTreeMap;
use std::path::Path;

fn tar_of(files: &[(&str, &[u8])], symlinks: &[(&str, &str)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, path, *data).unwrap();
    }
    for (path, target) in symlinks {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        h.set_mode(0o777);
        b.append_link(&mut h, path, target).unwrap();
    }
    b.into_inner().unwrap()
}

/// A `docker save` of two images, `example.com/app:v1` (2 layers) and
/// `example.com/base:v1` (its bottom layer, saved as a symlink as old Docker does).
fn docker_save() -> Vec<u8> {
    let (bottom, top) = (busybox_layer(), top_layer());
    let app_config = common::config(&[&bottom, &top], "amd64");
    let base_config = common::config(&[&bottom], "amd64");
    let (app_hex, base_hex) = (Digest::of(&app_config), Digest::of(&base_config));
    let manifest = serde_json::json!([
        {"Config": format!("{}.json", app_hex.hex()), "RepoTags": ["example.com/app:v1"],
         "Layers": ["l1/layer.tar", "l2/layer.tar"]},
        {"Config": format!("{}.json", base_hex.hex()), "RepoTags": ["example.com/base:v1"],
         "Layers": ["l3/layer.tar"]},
    ]);
    let manifest = serde_json::to_vec(&manifest).unwrap();
    let (app_name, base_name) = (
        format!("{}.json", app_hex.hex()),
        format!("{}.json", base_hex.hex()),
    );
    tar_of(
        &[
            ("manifest.json", &manifest),
            (&app_name, &app_config),
            (&base_name, &base_config),
            ("l1/layer.tar", &bottom.tar),
            ("l2/layer.tar", &top.tar),
        ],
        &[("l3/layer.tar", "../l1/layer.tar")],
    )
}

/// An OCI layout holding one image tagged `v2` (gzip layers).
fn oci_layout(dir: &Path) -> Digest {
    let (bottom, top) = (busybox_layer(), top_layer());
    let config = common::config(&[&bottom, &top], "amd64");
    let manifest = common::manifest(&config, &[&bottom, &top]);
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    for bytes in [&bottom.blob, &top.blob, &config, &manifest] {
        std::fs::write(blobs.join(Digest::of(bytes).hex()), bytes).unwrap();
    }
    let mut desc = common::descriptor(OCI_MANIFEST, &manifest);
    desc.annotations = BTreeMap::from([(
        "org.opencontainers.image.ref.name".to_string(),
        "v2".to_string(),
    )]);
    let index = Index {
        schema_version: 2,
        media_type: Some(bazaar_image::manifest::OCI_INDEX.into()),
        manifests: vec![desc],
    };
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    Digest::of(&manifest)
}

fn r(s: &str) -> Reference {
    s.parse().unwrap()
}

#[tokio::test]
async fn imports_docker_save_and_oci_layouts() {
    let work = tempfile::tempdir().unwrap();
    let machines = Machines::new();
    let store = ImageStore::open(work.path().join("store"), common::loopback_store()).unwrap();

    let save = work.path().join("save.tar");
    std::fs::write(&save, docker_save()).unwrap();
    let images = store.import_archive(&save).await.unwrap();
    let names: Vec<&str> = images.iter().map(|i| i.reference.as_str()).collect();
    assert_eq!(names, ["example.com/app:v1", "example.com/base:v1"]);
    let app = store.image(&r("example.com/app:v1")).unwrap().unwrap();
    let base = store.image(&r("example.com/base:v1")).unwrap().unwrap();
    assert_eq!(
        app.layers[0].digest, base.layers[0].digest,
        "shared bottom layer"
    );
    assert_eq!(
        app.layers[0].digest,
        busybox_layer().diff_id,
        "uncompressed layer"
    );
    let root = store
        .rootfs(&app, &machines.path().join("m1"))
        .await
        .unwrap();
    check_rootfs(&root);
    assert_eq!(
        app.process(None, &BTreeMap::new()).unwrap().args,
        ["/bin/sh", "-c", "echo $GREETING"]
    );

    let layout = work.path().join("myimage");
    let manifest_digest = oci_layout(&layout);
    let images = store.import_archive(&layout).await.unwrap();
    assert_eq!(images.len(), 1);
    assert_eq!(images[0].reference, "localhost/myimage:v2");
    assert_eq!(images[0].manifest_digest, manifest_digest);

    // The same layout as a tar.
    let mut b = tar::Builder::new(Vec::new());
    b.append_dir_all(".", &layout).unwrap();
    let tarball = work.path().join("packed.tar");
    std::fs::write(&tarball, b.into_inner().unwrap()).unwrap();
    let images = store.import_archive(&tarball).await.unwrap();
    assert_eq!(images[0].reference, "localhost/packed:v2");
    let root = store
        .rootfs(&images[0], &machines.path().join("m2"))
        .await
        .unwrap();
    check_rootfs(&root);

    // Not an archive: a clear error.
    let junk = work.path().join("junk.tar");
    std::fs::write(&junk, tar_of(&[("hello", b"x")], &[])).unwrap();
    let err = store.import_archive(&junk).await.unwrap_err();
    assert!(err.to_string().contains("neither manifest.json"), "{err}");
    store
        .remove_rootfs(&machines.path().join("m1"))
        .await
        .unwrap();
    store
        .remove_rootfs(&machines.path().join("m2"))
        .await
        .unwrap();
}

fn count(dir: &Path) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

#[tokio::test]
async fn gc_frees_unreferenced_and_keeps_referenced() {
    let work = tempfile::tempdir().unwrap();
    let machines = Machines::new();
    let root = work.path().join("store");
    let store = ImageStore::open(&root, common::loopback_store()).unwrap();
    let save = work.path().join("save.tar");
    std::fs::write(&save, docker_save()).unwrap();
    store.import_archive(&save).await.unwrap();
    let app = store.image(&r("example.com/app:v1")).unwrap().unwrap();
    let base = store.image(&r("example.com/base:v1")).unwrap().unwrap();
    let (shared, top) = (&app.layers[0].digest, &app.layers[1].digest);

    let report = store.gc(&[]).await.unwrap();
    assert_eq!(report, Default::default(), "everything is referenced");

    // Without the app image: its top layer, blob, manifest and config go; the shared stays.
    assert!(store.remove_image(&r("example.com/app:v1")).unwrap());
    let report = store.gc(&[]).await.unwrap();
    assert_eq!(report.layers, vec![top.clone()]);
    let mut freed = report.blobs.clone();
    freed.sort();
    let mut want = vec![
        top.clone(),
        app.manifest_digest.clone(),
        app.config_digest.clone(),
    ];
    want.sort();
    assert_eq!(freed, want);
    assert!(report.bytes > top_layer().tar.len() as u64);
    assert!(!store.layer_dir(top).exists());
    assert!(store.layer_dir(shared).join("bin/busybox").is_file());

    // A live rootfs keeps its layers even when no image names them any more.
    let m = machines.path().join("m");
    let rootfs = store.rootfs(&base, &m).await.unwrap();
    assert!(store.remove_image(&r("example.com/base:v1")).unwrap());
    let report = store.gc(std::slice::from_ref(&m)).await.unwrap();
    assert!(report.layers.is_empty());
    assert!(store.layer_dir(shared).is_dir());
    assert!(rootfs.join("bin/busybox").is_file());
    store.remove_rootfs(&m).await.unwrap();
    let report = store.gc(&[m]).await.unwrap();
    assert_eq!(report.layers, vec![shared.clone()]);
    assert_eq!(count(&root.join("layers/sha256")), 0);
    assert_eq!(count(&root.join("blobs/sha256")), 0);
    assert_eq!(count(&root.join("tmp")), 0);
}

#[tokio::test]
async fn store_with_whiteout_markers_builds_copied_rootfs() {
    // A store created where overlayfs was unavailable keeps `.wh.` markers in its layers.
    let work = tempfile::tempdir().unwrap();
    let machines = Machines::new();
    let root = work.path().join("store");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("store.json"), r#"{"whiteouts":"markers"}"#).unwrap();
    let store = ImageStore::open(&root, common::loopback_store()).unwrap();
    let save = work.path().join("save.tar");
    std::fs::write(&save, docker_save()).unwrap();
    store.import_archive(&save).await.unwrap();
    let app = store.image(&r("example.com/app:v1")).unwrap().unwrap();
    let top = store.layer_dir(&app.layers[1].digest);
    assert!(top.join("etc/.wh.gone").is_file());
    assert!(top.join("opq/.wh..wh..opq").is_file());
    let m = machines.path().join("m");
    let rootfs = store.rootfs(&app, &m).await.unwrap();
    assert_eq!(
        store.rootfs_kind(&m).unwrap(),
        Some(bazaar_image::RootfsKind::Copy)
    );
    check_rootfs(&rootfs);
    assert!(!rootfs.join("etc/.wh.gone").exists());
}
