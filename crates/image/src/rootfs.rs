//! Per-machine root filesystems: an overlayfs mount of the shared layer directories (lower,
//! top first) with the machine's own `upper`/`work`, or, where overlayfs is missing, a
//! flattened copy of the layers with their whiteouts applied. A machine in a user namespace
//! ([`IdMap`]) sees the shared layers through idmapped mounts and owns its `upper` (or its
//! copy, chowned as it is made).
//!
//! ```text
//! MACHINE/rootfs.json   how it was made (kind, image, layers) — also what GC keeps
//! MACHINE/rootfs/       the root filesystem (mount point, or the copy)
//! MACHINE/upper/ work/  overlay only
//! ```

use crate::digest::Digest;
use crate::error::{Error, IoContext, Result};
use crate::idmap::{idmapped_clone, IdMap};
use crate::unpack::{OPAQUE, OPAQUE_XATTR, WHITEOUT};
use rustix::fs::{FileTypeExt as _, CWD};
use rustix::mount::{
    fsconfig_create, fsconfig_set_string, fsmount, fsopen, move_mount, FsMountFlags, FsOpenFlags,
    MountAttrFlags, MountFlags, MoveMountFlags, UnmountFlags,
};
use serde::{Deserialize, Serialize};
use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::fs::{lchown, symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

const RECORD: &str = "rootfs.json";

/// How a rootfs was built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RootfsKind {
    /// overlayfs over the shared layers.
    Overlay,
    /// A private flattened copy.
    Copy,
}

/// What `MACHINE/rootfs.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RootfsRecord {
    pub image: String,
    pub layers: Vec<Digest>,
    pub kind: RootfsKind,
}

/// Whether overlayfs can be used here: root, and the kernel lists it.
pub(crate) fn overlay_available() -> bool {
    rustix::process::geteuid().is_root()
        && fs::read_to_string("/proc/filesystems").is_ok_and(|s| {
            s.lines()
                .any(|l| l.split_whitespace().last() == Some("overlay"))
        })
}

/// Reads a machine's rootfs record.
pub(crate) fn read_record(machine_dir: &Path) -> Result<Option<RootfsRecord>> {
    let path = machine_dir.join(RECORD);
    match fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| Error::Manifest(format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).at(path),
    }
}

/// Whether `path` is a mount point other than its parent's file system.
fn is_mounted(path: &Path) -> bool {
    let (Ok(a), Some(Ok(b))) = (
        fs::symlink_metadata(path),
        path.parent().map(fs::symlink_metadata),
    ) else {
        return false;
    };
    a.dev() != b.dev()
}

/// Builds (or keeps, or remounts) `machine_dir/rootfs` from `layers` (bottom first), its
/// files owned by the host ids `ids` maps the image's to (through `userns`, a user namespace
/// with that mapping, when given).
pub(crate) fn create(
    image: &str,
    layers: &[(Digest, PathBuf)],
    machine_dir: &Path,
    overlay: bool,
    ids: Option<IdMap>,
    userns: Option<&Path>,
) -> Result<PathBuf> {
    let rootfs = machine_dir.join("rootfs");
    if let Some(record) = read_record(machine_dir)? {
        match record.kind {
            RootfsKind::Copy => return Ok(rootfs),
            RootfsKind::Overlay if is_mounted(&rootfs) => return Ok(rootfs),
            RootfsKind::Overlay => {
                mount_overlay(layers, machine_dir, ids, userns)?;
                return Ok(rootfs);
            }
        }
    }
    fs::create_dir_all(&rootfs).at(&rootfs)?;
    let kind = match overlay.then(|| mount_overlay(layers, machine_dir, ids, userns)) {
        Some(Ok(())) => RootfsKind::Overlay,
        other => {
            if let Some(Err(e)) = other {
                tracing::warn!(error = %e, "overlayfs mount failed; copying the layers instead");
            }
            for (_, dir) in layers {
                apply_layer(dir, &rootfs, ids)?;
            }
            if let Some(ids) = ids {
                let meta = fs::symlink_metadata(&rootfs).at(&rootfs)?;
                own(&meta, &rootfs, Some(ids))?;
            }
            RootfsKind::Copy
        }
    };
    let record = RootfsRecord {
        image: image.to_string(),
        layers: layers.iter().map(|(d, _)| d.clone()).collect(),
        kind,
    };
    let bytes = serde_json::to_vec(&record).expect("serializable");
    let tmp = machine_dir.join(".rootfs.json.tmp");
    fs::write(&tmp, bytes).at(&tmp)?;
    fs::rename(&tmp, machine_dir.join(RECORD)).at(machine_dir.join(RECORD))?;
    Ok(rootfs)
}

/// Mounts overlayfs at `machine_dir/rootfs`: with the new mount API and one `lowerdir+` per
/// layer (no length limit; Linux ≥ 6.8), else with a classic `lowerdir=a:b` option string.
/// With `ids`, every layer is an idmapped mount (new API only) and `upper` belongs to the
/// machine's root, so what it writes is owned by its own host ids. The layers are idmapped
/// through `userns` (a user namespace with the mapping `ids`) when given, else through one
/// made now.
fn mount_overlay(
    layers: &[(Digest, PathBuf)],
    machine_dir: &Path,
    ids: Option<IdMap>,
    userns: Option<&Path>,
) -> Result<()> {
    let rootfs = machine_dir.join("rootfs");
    let upper = machine_dir.join("upper");
    let work = machine_dir.join("work");
    let empty = machine_dir.join("empty");
    for d in [&upper, &work] {
        fs::create_dir_all(d).at(d)?;
    }
    // overlayfs wants a lower layer even for an image without layers.
    let mut lowers: Vec<PathBuf> = layers.iter().rev().map(|(_, p)| p.clone()).collect();
    if lowers.is_empty() {
        fs::create_dir_all(&empty).at(&empty)?;
        lowers.push(empty);
    }
    // Idmapped copies of the layers, detached, named by their descriptors.
    let mapped: Vec<std::os::fd::OwnedFd> = match ids {
        None => Vec::new(),
        Some(ids) => {
            use std::os::fd::AsFd;
            let userns = match userns {
                Some(path) => std::os::fd::OwnedFd::from(fs::File::open(path).at(path)?),
                None => ids.user_namespace().at(&rootfs)?,
            };
            let fds = lowers
                .iter()
                .map(|l| idmapped_clone(l, userns.as_fd()).at(l))
                .collect::<Result<Vec<_>>>()?;
            lchown(&upper, Some(ids.host_base), Some(ids.host_base)).at(&upper)?;
            fds
        }
    };
    let new_api = || -> rustix::io::Result<()> {
        use std::os::fd::AsRawFd;
        let fs_fd = fsopen("overlay", FsOpenFlags::FSOPEN_CLOEXEC)?;
        if mapped.is_empty() {
            for l in &lowers {
                fsconfig_set_string(&fs_fd, "lowerdir+", l)?;
            }
        } else {
            for fd in &mapped {
                let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
                fsconfig_set_string(&fs_fd, "lowerdir+", path.as_str())?;
            }
        }
        fsconfig_set_string(&fs_fd, "upperdir", &upper)?;
        fsconfig_set_string(&fs_fd, "workdir", &work)?;
        fsconfig_create(&fs_fd)?;
        let mnt = fsmount(
            &fs_fd,
            FsMountFlags::FSMOUNT_CLOEXEC,
            MountAttrFlags::empty(),
        )?;
        move_mount(
            &mnt,
            "",
            CWD,
            &rootfs,
            MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    match new_api() {
        Ok(()) => return Ok(()),
        Err(e) if ids.is_some() => return Err(e).at(&rootfs),
        Err(_) => {}
    }
    let joined: Vec<String> = lowers.iter().map(|p| p.display().to_string()).collect();
    let data = format!(
        "lowerdir={},upperdir={},workdir={}",
        joined.join(":"),
        upper.display(),
        work.display()
    );
    let data = CString::new(data).map_err(|_| Error::Io {
        path: rootfs.clone(),
        source: io::Error::new(io::ErrorKind::InvalidInput, "NUL in a path"),
    })?;
    rustix::mount::mount("overlay", &rootfs, "overlay", MountFlags::empty(), &*data).at(&rootfs)
}

/// Unmounts (if mounted) and deletes `machine_dir`'s rootfs, upper and work dirs.
pub(crate) fn remove(machine_dir: &Path) -> Result<()> {
    let rootfs = machine_dir.join("rootfs");
    if is_mounted(&rootfs) {
        if let Err(e) = rustix::mount::unmount(&rootfs, UnmountFlags::empty()) {
            tracing::warn!(error = %e, path = %rootfs.display(), "busy; detaching the rootfs");
            rustix::mount::unmount(&rootfs, UnmountFlags::DETACH).at(&rootfs)?;
        }
    }
    if is_mounted(&rootfs) {
        return Err(Error::Io {
            path: rootfs,
            source: io::Error::other("still mounted; not deleting through it"),
        });
    }
    for d in ["rootfs", "upper", "work", "empty"] {
        let p = machine_dir.join(d);
        match fs::remove_dir_all(&p) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e).at(p),
            _ => {}
        }
    }
    match fs::remove_file(machine_dir.join(RECORD)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e).at(machine_dir.join(RECORD)),
        _ => Ok(()),
    }
}

fn is_opaque(dir: &Path) -> bool {
    let mut buf = [0u8; 4];
    rustix::fs::lgetxattr(dir, OPAQUE_XATTR, &mut buf[..]).is_ok_and(|n| buf[..n] == *b"y")
        || fs::symlink_metadata(dir.join(OPAQUE)).is_ok()
}

fn remove_any(path: &Path) -> Result<()> {
    let r = match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    };
    r.at(path)
}

/// Gives `path` the owner of `meta` (shifted by `ids`).
fn own(meta: &fs::Metadata, path: &Path, ids: Option<IdMap>) -> Result<()> {
    if rustix::process::geteuid().is_root() {
        let shift = |id: u32| ids.map_or(id, |m| m.to_host(id));
        lchown(path, Some(shift(meta.uid())), Some(shift(meta.gid()))).at(path)?;
    }
    Ok(())
}

/// Copies the xattrs unpacking keeps (`user.*`, `security.capability`) from `src` to `dst`.
fn copy_xattrs(src: &Path, dst: &Path) -> Result<()> {
    let mut names = vec![0u8; 4096];
    let Ok(n) = rustix::fs::llistxattr(src, &mut names[..]) else {
        return Ok(());
    };
    for name in names[..n].split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let Ok(name) = std::str::from_utf8(name) else {
            continue;
        };
        if !(name.starts_with("user.") || name == "security.capability") {
            continue;
        }
        let mut value = vec![0u8; 65536];
        let len = rustix::fs::lgetxattr(src, name, &mut value[..]).at(src)?;
        rustix::fs::lsetxattr(dst, name, &value[..len], rustix::fs::XattrFlags::empty()).at(dst)?;
    }
    Ok(())
}

/// Copies the unpacked layer `src` over `dst`, applying its whiteouts (overlay form or
/// `.wh.` markers) and opaque directories. Symlinks are copied, never followed.
fn apply_layer(src: &Path, dst: &Path, ids: Option<IdMap>) -> Result<()> {
    if is_opaque(src) {
        for e in fs::read_dir(dst).at(dst)? {
            remove_any(&e.at(dst)?.path())?;
        }
    }
    let mut entries: Vec<_> = fs::read_dir(src)
        .at(src)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<io::Result<_>>()
        .at(src)?;
    // Markers first: they delete what lower layers had, never this layer's own entries.
    entries.sort_by_key(|n| !n.to_string_lossy().starts_with(WHITEOUT));
    for name in entries {
        let name_str = name.to_string_lossy();
        let (s, d) = (src.join(&name), dst.join(&name));
        if name_str == OPAQUE {
            continue;
        }
        if let Some(hidden) = name_str.strip_prefix(WHITEOUT) {
            remove_any(&dst.join(hidden))?;
            continue;
        }
        let meta = fs::symlink_metadata(&s).at(&s)?;
        let ft = meta.file_type();
        if ft.is_char_device() && meta.rdev() == 0 {
            remove_any(&d)?;
        } else if ft.is_dir() {
            if !fs::symlink_metadata(&d).is_ok_and(|m| m.is_dir()) {
                remove_any(&d)?;
                fs::create_dir(&d).at(&d)?;
            }
            own(&meta, &d, ids)?;
            fs::set_permissions(&d, fs::Permissions::from_mode(meta.mode() & 0o7777)).at(&d)?;
            copy_xattrs(&s, &d)?;
            apply_layer(&s, &d, ids)?;
        } else if ft.is_symlink() {
            remove_any(&d)?;
            symlink(fs::read_link(&s).at(&s)?, &d).at(&d)?;
            own(&meta, &d, ids)?;
        } else if ft.is_file() {
            remove_any(&d)?;
            fs::copy(&s, &d).at(&d)?;
            // chown before chmod and xattrs: chown clears setuid bits and capabilities.
            own(&meta, &d, ids)?;
            fs::set_permissions(&d, fs::Permissions::from_mode(meta.mode() & 0o7777)).at(&d)?;
            copy_xattrs(&s, &d)?;
        }
    }
    Ok(())
}
