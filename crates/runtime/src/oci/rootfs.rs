//! A machine's root filesystem from the runtime's side: exposing it where runc can enter
//! it, giving a volume to the machine's ids, and writing and reading files inside it with
//! every path resolved as if the rootfs were `/` (an image's user looked up in its own
//! `/etc/passwd`).

use bazaar_image::IdMap;
use bazaar_shim::{FailureKind, Fault};
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::Path;

/// Mounts machine `rootfs` again at `exposed` (under `/run/bazaar`, whose parents anyone
/// may traverse), for runc to enter as the machine's root.
pub(super) fn expose_rootfs(rootfs: &Path, exposed: &Path) -> Result<(), Fault> {
    use rustix::mount::{move_mount, open_tree, MoveMountFlags, OpenTreeFlags};
    use std::os::unix::fs::PermissionsExt;
    let what = format!("mounting the rootfs at {}", exposed.display());
    let io = |e: std::io::Error| Fault::io(&what, &e);
    let err = |e: rustix::io::Errno| Fault::errno(&what, e);
    std::fs::create_dir_all(exposed).map_err(io)?;
    // /run/bazaar/<host id>/rootfs: traversable, not listable.
    for dir in exposed.ancestors().skip(1).take(3) {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).map_err(io)?;
    }
    let tree = open_tree(
        rustix::fs::CWD,
        rootfs,
        OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
    )
    .map_err(err)?;
    move_mount(
        &tree,
        "",
        rustix::fs::CWD,
        exposed,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
    .map_err(err)
}

/// Unmounts and removes the rootfs mounted by [`expose_rootfs`] (if it is). Idempotent.
pub(crate) fn unexpose_rootfs(exposed: &Path) -> Result<(), Fault> {
    use rustix::mount::{unmount, UnmountFlags};
    loop {
        match unmount(exposed, UnmountFlags::DETACH | UnmountFlags::NOFOLLOW) {
            Ok(()) => continue,
            Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOENT) => break,
            Err(e) => return Err(Fault::errno(format!("unmounting {}", exposed.display()), e)),
        }
    }
    match std::fs::remove_dir(exposed) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(Fault::io(format!("removing {}", exposed.display()), &e))
        }
        _ => Ok(()),
    }
}

/// Gives the volume at `path` to the machine's ids: a volume whose root is not already its
/// root's (new, or last used by a machine with another range) has every file's owner
/// shifted into the range.
pub(super) fn give_volume_to_ids(path: &Path, ids: IdMap) -> Result<(), Fault> {
    use std::os::unix::fs::MetadataExt;
    let root = ids.to_host(0);
    let meta = std::fs::symlink_metadata(path)
        .map_err(|e| Fault::io(format!("volume {}", path.display()), &e))?;
    if meta.uid() == root && meta.gid() == root {
        return Ok(());
    }
    fn walk(path: &Path, ids: IdMap) -> std::io::Result<()> {
        let meta = std::fs::symlink_metadata(path)?;
        std::os::unix::fs::lchown(
            path,
            Some(ids.shift_from_host(meta.uid())),
            Some(ids.shift_from_host(meta.gid())),
        )?;
        if meta.is_dir() {
            for entry in std::fs::read_dir(path)? {
                walk(&entry?.path(), ids)?;
            }
        }
        Ok(())
    }
    walk(path, ids).map_err(|e| {
        Fault::io(
            format!("giving volume {} to the machine", path.display()),
            &e,
        )
    })
}

/// Opens a rootfs directory to resolve paths inside it.
pub(super) fn open_root(rootfs: &Path) -> Result<OwnedFd, Fault> {
    rustix::fs::open(
        rootfs,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| Fault::errno(format!("opening {}", rootfs.display()), e))
}

/// Opens `path` inside `root` with every symlink resolved as if `root` were `/` (an
/// image's symlink can never lead out of its rootfs).
fn open_in_root(
    root: &OwnedFd,
    path: &str,
    flags: rustix::fs::OFlags,
    mode: u32,
) -> rustix::io::Result<OwnedFd> {
    let relative = path.trim_start_matches('/');
    rustix::fs::openat2(
        root,
        if relative.is_empty() { "." } else { relative },
        flags | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::from_raw_mode(mode),
        rustix::fs::ResolveFlags::IN_ROOT | rustix::fs::ResolveFlags::NO_MAGICLINKS,
    )
}

/// A machine's rootfs opened for writing into it: what is written belongs to `owner` (the
/// host id of the machine's root).
pub(super) struct InRoot {
    pub(super) fd: OwnedFd,
    pub(super) owner: u32,
}

/// Writes a file at `guest_path` inside the rootfs, creating its directories; the file and
/// the directories made belong to the machine's root.
pub(super) fn write_in_root(
    root: &InRoot,
    guest_path: &str,
    data: &[u8],
    mode: u32,
) -> Result<(), Fault> {
    let owner = Some(rustix::fs::Uid::from_raw(root.owner));
    let group = Some(rustix::fs::Gid::from_raw(root.owner));
    let root_fd = &root.fd;
    let what = format!("writing {guest_path} into the machine");
    let err = |e: rustix::io::Errno| Fault::errno(&what, e);
    if !guest_path.starts_with('/') || guest_path.ends_with('/') {
        return Err(Fault::new(
            FailureKind::Config,
            format!("{guest_path:?}: a file path must be absolute"),
        ));
    }
    if guest_path.split('/').any(|c| c == "..") {
        return Err(Fault::new(
            FailureKind::Config,
            format!("{guest_path:?}: .. is not allowed"),
        ));
    }
    let (parent, _) = guest_path.rsplit_once('/').unwrap_or(("", guest_path));
    let mut dir = String::new();
    for component in parent.split('/').filter(|c| !c.is_empty()) {
        dir.push('/');
        dir.push_str(component);
        let parent_fd = open_in_root(
            root_fd,
            dir.rsplit_once('/').map(|(p, _)| p).unwrap_or(""),
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY,
            0,
        )
        .map_err(err)?;
        match rustix::fs::mkdirat(
            &parent_fd,
            component,
            rustix::fs::Mode::from_raw_mode(0o755),
        ) {
            Ok(()) => rustix::fs::chownat(
                &parent_fd,
                component,
                owner,
                group,
                rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
            )
            .map_err(err)?,
            Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(err(e)),
        }
    }
    let fd = open_in_root(
        root_fd,
        guest_path,
        rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CREATE | rustix::fs::OFlags::TRUNC,
        mode,
    )
    .map_err(err)?;
    // chown before chmod: chown clears setuid bits.
    rustix::fs::fchown(&fd, owner, group).map_err(err)?;
    rustix::fs::fchmod(&fd, rustix::fs::Mode::from_raw_mode(mode & 0o7777)).map_err(err)?;
    let mut f = std::fs::File::from(fd);
    f.write_all(data).map_err(|e| Fault::io(&what, &e))
}

/// Reads a file inside the rootfs ("" when it is missing).
fn read_in_root(root: &OwnedFd, path: &str) -> String {
    open_in_root(root, path, rustix::fs::OFlags::RDONLY, 0)
        .ok()
        .and_then(|fd| std::io::read_to_string(std::fs::File::from(fd)).ok())
        .unwrap_or_default()
}

/// The uid and gid of an image's `User` (`name`, `uid`, `name:group`, `uid:gid`), looked up
/// in the image's own `/etc/passwd` and `/etc/group`. `None` is root.
pub(super) fn resolve_user(root: &OwnedFd, user: Option<&str>) -> Result<(u32, u32), Fault> {
    let Some(user) = user.filter(|u| !u.is_empty()) else {
        return Ok((0, 0));
    };
    let (u, g) = match user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user, None),
    };
    let passwd = read_in_root(root, "/etc/passwd");
    let entry = passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() > 3 && (f[0] == u || f[2] == u));
    let uid = match (u.parse::<u32>(), &entry) {
        (Ok(uid), _) => uid,
        (Err(_), Some(f)) => f[2].parse().map_err(|_| {
            Fault::new(
                FailureKind::Config,
                format!("user {u}: bad /etc/passwd entry"),
            )
        })?,
        (Err(_), None) => {
            return Err(Fault::new(
                FailureKind::Config,
                format!("user {u:?} is not in the image's /etc/passwd"),
            ))
        }
    };
    let gid = match g {
        None => entry.and_then(|f| f[3].parse().ok()).unwrap_or(0),
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => read_in_root(root, "/etc/group")
                .lines()
                .map(|l| l.split(':').collect::<Vec<_>>())
                .find(|f| f.len() > 2 && f[0] == g)
                .and_then(|f| f[2].parse().ok())
                .ok_or_else(|| {
                    Fault::new(
                        FailureKind::Config,
                        format!("group {g:?} is not in the image's /etc/group"),
                    )
                })?,
        },
    };
    Ok((uid, gid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_stay_inside_the_root_even_through_symlinks() {
        let outside = tempfile::tempdir().unwrap();
        let rootfs = tempfile::tempdir().unwrap();
        std::fs::create_dir(rootfs.path().join("etc")).unwrap();
        // An image's absolute symlink pointing at a host directory.
        std::os::unix::fs::symlink(outside.path(), rootfs.path().join("escape")).unwrap();
        let root = InRoot {
            fd: open_root(rootfs.path()).unwrap(),
            owner: rustix::process::geteuid().as_raw(),
        };
        // The link's target, read inside the rootfs, does not exist: refused.
        assert!(write_in_root(&root, "/escape/x", b"data", 0o600).is_err());
        assert!(
            !outside.path().join("x").exists(),
            "written outside the rootfs"
        );
        // Once it exists inside the rootfs, the file lands there.
        let inside_dir = rootfs
            .path()
            .join(outside.path().strip_prefix("/").unwrap());
        std::fs::create_dir_all(&inside_dir).unwrap();
        write_in_root(&root, "/escape/x", b"data", 0o600).unwrap();
        assert!(
            !outside.path().join("x").exists(),
            "written outside the rootfs"
        );
        let inside = inside_dir.join("x");
        assert_eq!(std::fs::read(inside).unwrap(), b"data");
        write_in_root(&root, "/a/b/c.txt", b"hi", 0o640).unwrap();
        assert_eq!(
            std::fs::read(rootfs.path().join("a/b/c.txt")).unwrap(),
            b"hi"
        );
        assert!(write_in_root(&root, "relative", b"", 0o644).is_err());
        assert!(write_in_root(&root, "/../x", b"", 0o644).is_err());
    }

    #[test]
    fn users_resolve_against_the_image() {
        let rootfs = tempfile::tempdir().unwrap();
        std::fs::create_dir(rootfs.path().join("etc")).unwrap();
        std::fs::write(
            rootfs.path().join("etc/passwd"),
            "root:x:0:0::/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n",
        )
        .unwrap();
        std::fs::write(rootfs.path().join("etc/group"), "root:x:0:\nstaff:x:50:\n").unwrap();
        let root = open_root(rootfs.path()).unwrap();
        assert_eq!(resolve_user(&root, None).unwrap(), (0, 0));
        assert_eq!(resolve_user(&root, Some("app")).unwrap(), (1000, 1001));
        assert_eq!(resolve_user(&root, Some("1000")).unwrap(), (1000, 1001));
        assert_eq!(resolve_user(&root, Some("app:staff")).unwrap(), (1000, 50));
        assert_eq!(resolve_user(&root, Some("4242:7")).unwrap(), (4242, 7));
        assert!(resolve_user(&root, Some("ghost"))
            .unwrap_err()
            .message
            .contains("not in the image"));
    }
}
