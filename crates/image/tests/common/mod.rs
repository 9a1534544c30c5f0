//! Test support: Debian's `docker-registry` on loopback, and small images built in Rust
//! from Debian's `busybox-static`.
#![allow(dead_code)]

pub use bazaar_testkit::images::*;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

/// Bottom layer: busybox with applet symlinks, files a later layer deletes, an `opq` dir.
pub fn busybox_layer() -> Layer {
    let busybox = std::fs::read("/bin/busybox").expect("busybox-static");
    layer(vec![
        Entry::Dir("bin/"),
        Entry::File("bin/busybox".into(), busybox, 0o755),
        Entry::Symlink("bin/sh", "/bin/busybox".into()),
        Entry::Symlink("bin/ls", "busybox".into()),
        Entry::Hardlink("bin/busybox-link", "bin/busybox"),
        Entry::Dir("etc/"),
        file("etc/hello", b"hello from layer 1\n"),
        file("etc/gone", b"deleted by layer 2\n"),
        Entry::Dir("opq/"),
        file("opq/old", b"hidden by the opaque dir\n"),
        Entry::Dir("tmp/"),
        Entry::FileAs("bin/suid", 1000, 0o4755),
    ])
}

/// Top layer: deletes `etc/gone`, makes `opq` opaque with a new file, adds `etc/motd`.
pub fn top_layer() -> Layer {
    layer(vec![
        Entry::Dir("etc/"),
        file("etc/.wh.gone", b""),
        file("etc/motd", b"layer 2\n"),
        Entry::Dir("opq/"),
        file("opq/.wh..wh..opq", b""),
        file("opq/new", b"from layer 2\n"),
    ])
}

/// The merged view of busybox_layer + top_layer, checked by running busybox in it.
pub fn check_rootfs(root: &Path) {
    assert!(root.join("bin/busybox").is_file());
    let suid = std::fs::metadata(root.join("bin/suid")).unwrap();
    assert_eq!(
        (suid.mode() & 0o7777, suid.uid(), suid.gid()),
        (0o4755, 1000, 1000)
    );
    assert_eq!(
        std::fs::read_link(root.join("bin/sh")).unwrap(),
        Path::new("/bin/busybox")
    );
    assert!(
        !root.join("etc/gone").exists(),
        "whiteout hides the lower file"
    );
    assert!(
        !root.join("opq/old").exists(),
        "opaque dir hides the lower dir"
    );
    assert!(root.join("opq/new").exists());
    assert!(root.join("etc/motd").exists());
    let out = std::process::Command::new("/usr/sbin/chroot")
        .arg(root)
        .args(["/bin/sh", "-c", "busybox cat /etc/hello; ls /etc; ls /opq"])
        .env("PATH", "/bin")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text, "hello from layer 1\nhello\nmotd\nnew\n");
}

/// A temp dir for machine dirs that lazily unmounts any rootfs left below it when dropped,
/// so a failing test leaves no mounts behind.
pub struct Machines(tempfile::TempDir);

impl Machines {
    pub fn new() -> Machines {
        Machines(tempfile::tempdir().unwrap())
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for Machines {
    fn drop(&mut self) {
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        let prefix = self.0.path().display().to_string();
        for target in mounts.lines().filter_map(|l| l.split(' ').nth(1)) {
            if target.starts_with(&prefix) {
                let _ = Command::new("umount").args(["-l", target]).status();
            }
        }
    }
}

/// Store options for tests against the registry on loopback, which a store reaches only
/// when told it may (`bazaar_image::egress`).
pub fn loopback_store() -> bazaar_image::StoreOptions {
    bazaar_image::StoreOptions {
        allow_loopback_registries: true,
        ..Default::default()
    }
}
