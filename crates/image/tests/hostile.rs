//! Hostile layers: `..` paths, writes through symlinks (to `/` and to a host path), hard
//! links out of the layer, device nodes. Each is refused with an error naming the layer and
//! the entry, and nothing appears outside the store.

mod common;

use bazaar_image::unpack::{unpack_layer, Whiteouts};
use bazaar_image::{Auth, Error, ImageStore};
use common::{file, layer, push, Entry, Layer, TestRegistry};
use std::path::Path;

/// Unpacks `l` into a fresh dir under `store`; returns the error text, if any.
fn unpack(store: &Path, l: &Layer) -> Result<(), Error> {
    let blob = store.join("blob");
    std::fs::write(&blob, &l.blob).unwrap();
    let dest = store.join("dest");
    let _ = std::fs::remove_dir_all(&dest);
    std::fs::create_dir(&dest).unwrap();
    unpack_layer(
        &blob,
        l.digest().as_str(),
        Some(&l.diff_id),
        &dest,
        Whiteouts::Overlay,
    )
}

fn assert_untouched(outside: &Path) {
    let left: Vec<_> = std::fs::read_dir(outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        left,
        vec![std::ffi::OsString::from("sentinel")],
        "{outside:?}"
    );
}

#[test]
fn hostile_entries_are_rejected() {
    let store = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("sentinel"), "x").unwrap();
    let o = outside.path().display().to_string();
    let climb = format!("{}{o}/pwned", "../".repeat(12));
    let cases: Vec<(&str, Vec<Entry>, &str, &str)> = vec![
        ("dot-dot", vec![file(&climb, b"x")], &climb, "`..`"),
        (
            "dot-dot inside",
            vec![Entry::Dir("a/"), file("a/../../pwned", b"x")],
            "a/../../pwned",
            "`..`",
        ),
        (
            "symlink to /",
            vec![
                Entry::Symlink("escape", "/".into()),
                file(&format!("escape{o}/pwned"), b"x"),
            ],
            "escape",
            "through the symlink escape",
        ),
        (
            "symlink to a host path",
            vec![Entry::Symlink("out", o.clone()), file("out/pwned", b"x")],
            "out/pwned",
            "through the symlink out",
        ),
        (
            "dir entry through a symlink",
            vec![Entry::Symlink("d", o.clone()), Entry::Dir("d/sub/")],
            "d/sub",
            "through the symlink d",
        ),
        (
            "hard link to a host file",
            vec![Entry::Hardlink("passwd", "/etc/passwd")],
            "passwd",
            "not a file of this layer",
        ),
        (
            "hard link climbing out",
            vec![Entry::Hardlink("passwd", "../../../../etc/passwd")],
            "passwd",
            "not a file of this layer",
        ),
        (
            "hard link through a symlink",
            vec![
                Entry::Symlink("s", o.clone()),
                Entry::Hardlink("h", "s/sentinel"),
            ],
            "h",
            "not a file of this layer",
        ),
        (
            "char device",
            vec![Entry::Dir("dev/"), Entry::CharDev("dev/mem")],
            "dev/mem",
            "device nodes",
        ),
    ];
    for (name, entries, entry, why) in cases {
        let l = layer(entries);
        let err = unpack(store.path(), &l).expect_err(name);
        let text = err.to_string();
        assert!(matches!(err, Error::UnsafeLayer { .. }), "{name}: {text}");
        assert!(text.contains(l.digest().as_str()), "{name}: {text}");
        assert!(text.contains(entry), "{name}: {text}");
        assert!(text.contains(why), "{name}: {text}");
        assert_untouched(outside.path());
    }
    assert!(!Path::new("/pwned").exists());

    // Leading `/` and `./` are normalised into the layer; absolute symlink targets are fine.
    let ok = layer(vec![
        file("/etc/abs", b"a"),
        file("./etc/rel", b"r"),
        Entry::Symlink("bin/sh", "/bin/busybox".into()),
    ]);
    unpack(store.path(), &ok).unwrap();
    let dest = store.path().join("dest");
    assert_eq!(std::fs::read(dest.join("etc/abs")).unwrap(), b"a");
    assert_eq!(std::fs::read(dest.join("etc/rel")).unwrap(), b"r");
    assert_eq!(
        std::fs::read_link(dest.join("bin/sh")).unwrap(),
        Path::new("/bin/busybox")
    );
}

#[test]
fn wrong_diff_id_is_rejected() {
    let store = tempfile::tempdir().unwrap();
    let mut l = layer(vec![file("a", b"a")]);
    l.diff_id = bazaar_image::Digest::of(b"something else");
    let err = unpack(store.path(), &l).unwrap_err();
    assert!(matches!(err, Error::DigestMismatch { .. }), "{err}");
}

#[tokio::test]
async fn hostile_image_from_a_registry_leaves_nothing() {
    let reg = TestRegistry::start(None);
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("sentinel"), "x").unwrap();
    let store = ImageStore::open(root.path(), common::loopback_store()).unwrap();
    let client = store.registry(&reg.host, Auth::Anonymous).unwrap();
    let good = common::busybox_layer();
    let evil = layer(vec![
        Entry::Symlink("etc", outside.path().display().to_string()),
        file("etc/pwned", b"x"),
    ]);
    push(&client, "evil/app", "v1", &[&good, &evil], "amd64").await;
    let r = format!("{}/evil/app:v1", reg.host).parse().unwrap();
    let err = store.pull(&r, &Auth::Anonymous, &|_| {}).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(evil.digest().as_str()) && text.contains("etc/pwned"),
        "{text}"
    );
    assert_untouched(outside.path());
    assert!(!store.layer_dir(&evil.digest()).exists());
    assert!(store.image(&r).unwrap().is_none());
    let tmp: Vec<_> = std::fs::read_dir(root.path().join("tmp"))
        .unwrap()
        .collect();
    assert!(
        tmp.is_empty(),
        "half-unpacked layers are cleaned up: {tmp:?}"
    );
}

#[test]
fn zstd_and_plain_tar_layers_unpack() {
    let store = tempfile::tempdir().unwrap();
    let mut l = layer(vec![file("etc/zstd", b"z")]);
    for blob in [
        ruzstd::encoding::compress_to_vec(&l.tar[..], ruzstd::encoding::CompressionLevel::Fastest),
        l.tar.clone(),
    ] {
        l.blob = blob;
        unpack(store.path(), &l).unwrap();
        assert_eq!(
            std::fs::read(store.path().join("dest/etc/zstd")).unwrap(),
            b"z"
        );
    }
}

#[test]
fn pax_xattrs_kept_but_overlay_ones_dropped() {
    let store = tempfile::tempdir().unwrap();
    let mut b = tar::Builder::new(Vec::new());
    let xattrs: [(&str, &[u8]); 3] = [
        ("SCHILY.xattr.user.note", b"hi"),
        ("SCHILY.xattr.trusted.overlay.opaque", b"y"),
        ("SCHILY.xattr.trusted.overlay.redirect", b"/etc"),
    ];
    for path in ["d/", "d/f"] {
        b.append_pax_extensions(xattrs).unwrap();
        let mut h = tar::Header::new_gnu();
        let dir = path.ends_with('/');
        h.set_entry_type(if dir {
            tar::EntryType::Directory
        } else {
            tar::EntryType::Regular
        });
        h.set_mode(0o755);
        h.set_size(if dir { 0 } else { 1 });
        b.append_data(&mut h, path, &b"x"[..usize::from(!dir)])
            .unwrap();
    }
    let tar = b.into_inner().unwrap();
    let l = Layer {
        blob: tar.clone(),
        diff_id: bazaar_image::Digest::of(&tar),
        tar,
    };
    unpack(store.path(), &l).unwrap();
    for p in ["dest/d", "dest/d/f"] {
        let path = store.path().join(p);
        let mut buf = [0u8; 16];
        let n = rustix::fs::lgetxattr(&path, "user.note", &mut buf[..]).unwrap();
        assert_eq!(&buf[..n], b"hi");
        for name in ["trusted.overlay.opaque", "trusted.overlay.redirect"] {
            assert!(
                rustix::fs::lgetxattr(&path, name, &mut buf[..]).is_err(),
                "{p} {name}"
            );
        }
    }
}
