//! A small Debian base image for tests, made without pulling from any image registry (issue
//! 38 item 4): the `.deb` files of a few Debian packages (`base-files`, `libc6` and the
//! dynamically linked `busybox`, with `/bin/sh` and a few applets linked to it) come from
//! apt's cache (`/var/cache/apt/archives`) or, for those not there, from the host's
//! configured mirror as `apt-get install` gets them (`apt-get download`); they are
//! unpacked with `dpkg-deb -x` into a root filesystem, and written as one layer of a
//! `docker save` archive. The archive is cached under [`cache_dir`], named by the exact
//! package files it was made of, so only a new package version makes it again.
//!
//! [`push_debian_base`] puts it into a cluster's registry with `bazaar image push`, as an
//! operator mirrors a base image (docs/REGISTRY.md).

use crate::images::{config_with, docker_save, Layer};
use bazaar_image::Digest;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The packages of the base image.
pub const PACKAGES: &[&str] = &["base-files", "libc6", "busybox"];

/// Where apt keeps the packages it downloaded.
const APT_ARCHIVES: &str = "/var/cache/apt/archives";

/// Busybox applets linked in `/bin` (the package ships only `/bin/busybox`).
const APPLETS: &[&str] = &["sh", "ls", "cat", "echo", "sleep", "env", "id"];

/// The base image: its `docker save` archive (in the cache) and its one layer's diff id
/// (the digest of the uncompressed tar, which image configs list; `bazaar image push`
/// stores an archive's layers as they are, so it is the pushed blob's digest too).
#[derive(Debug, Clone)]
pub struct DebianBase {
    pub archive: PathBuf,
    pub diff_id: Digest,
}

/// Where made base images are kept between test runs: `BAZAAR_TEST_CACHE` if set, else
/// `/var/tmp/bazaar-test-cache` (kept across reboots, unlike /tmp).
pub fn cache_dir() -> PathBuf {
    std::env::var_os("BAZAAR_TEST_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/bazaar-test-cache"))
        .join("debian-base")
}

/// The base image, made once per set of package versions (see the module doc). Panics
/// naming what failed (apt cannot find the packages, dpkg-deb is missing).
pub fn debian_base() -> DebianBase {
    debian_base_in(&cache_dir())
}

/// [`debian_base`], cached in `dir`.
pub fn debian_base_in(dir: &Path) -> DebianBase {
    std::fs::create_dir_all(dir).expect("the test cache directory");
    let files = package_files();
    // The recipe's version, then the packages: a change to either makes a new archive.
    let recipe = format!("3\n{}", files.join("\n"));
    let key = Digest::of(recipe.as_bytes()).hex()[..16].to_string();
    let archive = dir.join(format!("debian-base-{key}.tar"));
    let digest_file = dir.join(format!("debian-base-{key}.layer"));
    if let (true, Ok(d)) = (archive.exists(), std::fs::read_to_string(&digest_file)) {
        if let Ok(diff_id) = d.trim().parse() {
            return DebianBase { archive, diff_id };
        }
    }
    let work = tempfile::Builder::new()
        .prefix("debian-base-")
        .tempdir_in(dir)
        .unwrap();
    let debs = work.path().join("debs");
    std::fs::create_dir_all(&debs).unwrap();
    // apt's own cache first (what `apt-get install` left there): no mirror needed then.
    let mut missing = Vec::new();
    for file in &files {
        let cached = Path::new(APT_ARCHIVES).join(file);
        if std::fs::copy(&cached, debs.join(file)).is_err() {
            missing.push(file.split('_').next().unwrap_or(file).to_string());
        }
    }
    if !missing.is_empty() {
        run(Command::new("apt-get")
            .arg("download")
            .args(&missing)
            .current_dir(&debs));
    }
    let rootfs = work.path().join("rootfs");
    std::fs::create_dir_all(rootfs.join("tmp")).unwrap();
    for deb in std::fs::read_dir(&debs).unwrap().flatten() {
        run(Command::new("dpkg-deb")
            .arg("-x")
            .arg(deb.path())
            .arg(&rootfs));
    }
    for applet in APPLETS {
        let link = rootfs.join("bin").join(applet);
        if !link.exists() {
            std::os::unix::fs::symlink("busybox", link).unwrap();
        }
    }
    let layer = rootfs_layer(&rootfs);
    let arch = bazaar_image::manifest::Platform::current().architecture;
    let mut config: serde_json::Value = serde_json::from_slice(&config_with(
        &[&layer],
        &arch,
        serde_json::json!({
            "Cmd": ["/bin/sh"],
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        }),
    ))
    .unwrap();
    // One history entry per layer, as builders write: buildah refuses to build on an image
    // whose history does not account for its layers.
    config["history"] = serde_json::json!([{
        "created": "2023-11-14T22:13:20Z",
        "created_by": format!("bazaar-testkit: dpkg-deb -x {}", files.join(" ")),
    }]);
    let config = serde_json::to_vec(&config).unwrap();
    let tar = docker_save("debian-base:test", &[&layer], &config);
    // Written aside, then renamed: a run killed halfway leaves no half archive in the cache.
    let aside = work.path().join("archive.tar");
    std::fs::write(&aside, tar).unwrap();
    std::fs::write(&digest_file, layer.diff_id.to_string()).unwrap();
    std::fs::rename(&aside, &archive).unwrap();
    DebianBase {
        archive,
        diff_id: layer.diff_id,
    }
}

/// Pushes the base image into the cluster registry of the agent at `api_url` with
/// `bazaar image push` (binary `exe`, a token of the app `name` belongs to) as `name`
/// (`APP/PATH[:TAG]`); answers what it printed: `registry.bazaar.internal/NAME@DIGEST`.
pub fn push_debian_base(exe: &Path, api_url: &str, token: &str, name: &str) -> String {
    let base = debian_base();
    let out = Command::new(exe)
        .args(["image", "push"])
        .arg(&base.archive)
        .arg(name)
        .env("BAZAAR_API_URL", api_url)
        .env("BAZAAR_TOKEN", token)
        .output()
        .expect("bazaar image push");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bazaar image push {name}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .trim()
        .strip_prefix("pushed ")
        .unwrap_or_else(|| panic!("bazaar image push printed {stdout:?}"))
        .to_string()
}

/// The `.deb` file names apt would download for [`PACKAGES`] (versions included): the
/// cache key. Asks apt only (`--print-uris` downloads nothing).
fn package_files() -> Vec<String> {
    let out = Command::new("apt-get")
        .args(["download", "--print-uris"])
        .args(PACKAGES)
        .output()
        .expect("apt-get");
    assert!(
        out.status.success(),
        "apt-get download --print-uris {PACKAGES:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut files: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1).map(str::to_string))
        .collect();
    files.sort();
    assert_eq!(
        files.len(),
        PACKAGES.len(),
        "apt names one file per package"
    );
    files
}

/// One layer of the whole root filesystem `rootfs`, in a deterministic tar (sorted, owners
/// 0, a fixed time), so the same packages make the same digest.
fn rootfs_layer(rootfs: &Path) -> Layer {
    let mut b = tar::Builder::new(Vec::new());
    b.mode(tar::HeaderMode::Deterministic);
    b.follow_symlinks(false);
    append_sorted(&mut b, rootfs, Path::new(""));
    let tar = b.into_inner().unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, &tar).unwrap();
    Layer {
        blob: gz.finish().unwrap(),
        diff_id: Digest::of(&tar),
        tar,
    }
}

/// Appends what `root/rel` holds, each directory before its entries, in name order.
fn append_sorted(b: &mut tar::Builder<Vec<u8>>, root: &Path, rel: &Path) {
    let mut entries: Vec<_> = std::fs::read_dir(root.join(rel))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    entries.sort();
    for name in entries {
        let rel = rel.join(name);
        let path = root.join(&rel);
        b.append_path_with_name(&path, &rel).unwrap();
        if path.symlink_metadata().unwrap().is_dir() {
            append_sorted(b, root, &rel);
        }
    }
}

/// Runs a command; panics with its output unless it succeeds.
fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Needs apt's package lists and a mirror or cache that has the packages (as every
    /// test host that runs scripts/test-deps has); skipped without apt.
    #[test]
    fn the_base_is_made_once_from_debians_packages() {
        if Command::new("apt-get").arg("--version").output().is_err() {
            eprintln!("no apt-get: skipped");
            return;
        }
        let cache = tempfile::tempdir().unwrap();
        let first = debian_base_in(cache.path());
        let made = std::fs::metadata(&first.archive)
            .unwrap()
            .modified()
            .unwrap();
        let again = debian_base_in(cache.path());
        assert_eq!(first.archive, again.archive);
        assert_eq!(first.diff_id, again.diff_id);
        assert_eq!(
            std::fs::metadata(&again.archive)
                .unwrap()
                .modified()
                .unwrap(),
            made,
            "the cached archive is used, not made again"
        );
        let size = std::fs::metadata(&first.archive).unwrap().len();
        assert!(size < 32 << 20, "small: {size} bytes");
        // The layer holds Debian's files: its release, libc's loader, busybox and sh.
        let mut archive = tar::Archive::new(std::fs::File::open(&first.archive).unwrap());
        let layer = archive
            .entries()
            .unwrap()
            .flatten()
            .find(|e| e.path().unwrap().ends_with("layer.tar"))
            .map(|mut e| {
                let mut v = Vec::new();
                std::io::Read::read_to_end(&mut e, &mut v).unwrap();
                v
            })
            .unwrap();
        let names: Vec<String> = tar::Archive::new(&layer[..])
            .entries()
            .unwrap()
            .flatten()
            .map(|e| e.path().unwrap().display().to_string())
            .collect();
        for want in ["etc/debian_version", "bin/busybox", "bin/sh", "/ld-linux"] {
            assert!(
                names
                    .iter()
                    .any(|n| n.starts_with(want) || n.contains(want)),
                "{want} in {names:?}"
            );
        }
        assert!(
            std::fs::read_dir(cache.path()).unwrap().flatten().all(|e| e
                .path()
                .extension()
                .is_some_and(|x| x == "tar" || x == "layer")),
            "no work directory left in the cache"
        );
    }
}
