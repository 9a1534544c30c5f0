//! Handing a machine's directories (its work directory, its volume's root) to the
//! machine's user without ever changing the owner of anything else on the host. A path is
//! opened with `O_NOFOLLOW | O_DIRECTORY` and changed through that descriptor (`fchown`,
//! `fchmod`), so a symlink put in its place, or a file where a directory should be, is
//! refused instead of followed (a `chown` by path of a symlink to `/dev/null` changes
//! `/dev/null`). A tree is walked with `lchown`, without crossing into other mounts.

use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{Gid, Mode, OFlags, Uid};

/// Opens directory `path` itself: a symlink (`ELOOP`) or anything but a directory
/// (`ENOTDIR`) is an error naming what it is.
fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|err| {
        let what = match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_symlink() => "is a symlink, not a directory".to_owned(),
            Ok(m) if !m.is_dir() => "is not a directory".to_owned(),
            _ => err.to_string(),
        };
        io::Error::new(
            io::Error::from(err).kind(),
            format!("{}: {what}", path.display()),
        )
    })
}

/// Gives directory `path` to `uid:uid` with `mode` (permission bits), unless it already
/// is; with `recursive`, everything in it too (symlinks themselves, not their targets;
/// other mounts are not entered).
pub fn give_dir(path: &Path, uid: u32, mode: u32, recursive: bool) -> io::Result<()> {
    let dir = open_dir(path)?;
    let stat = rustix::fs::fstat(&dir)?;
    if stat.st_uid != uid || stat.st_gid != uid {
        if recursive {
            give_tree(path, stat.st_dev, uid)?;
        }
        rustix::fs::fchown(&dir, Some(Uid::from_raw(uid)), Some(Gid::from_raw(uid)))?;
    }
    if stat.st_mode & 0o7777 != mode {
        rustix::fs::fchmod(&dir, Mode::from_raw_mode(mode))?;
    }
    Ok(())
}

/// Gives directory `path` to `uid:uid` if it belongs to root (as made), leaving a
/// directory someone already owns alone. Returns whether it changed its owner.
pub fn give_dir_if_root(path: &Path, uid: u32) -> io::Result<bool> {
    let dir = open_dir(path)?;
    if rustix::fs::fstat(&dir)?.st_uid != 0 {
        return Ok(false);
    }
    rustix::fs::fchown(&dir, Some(Uid::from_raw(uid)), Some(Gid::from_raw(uid)))?;
    Ok(true)
}

/// Everything below `root` (on file system `device`) to `uid:uid`, by `lchown`.
fn give_tree(root: &Path, device: u64, uid: u32) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let mut stack: Vec<_> = std::fs::read_dir(root)?
        .map(|e| e.map(|e| e.path()))
        .collect::<io::Result<_>>()?;
    while let Some(path) = stack.pop() {
        let meta = std::fs::symlink_metadata(&path)?;
        if meta.dev() != device {
            continue;
        }
        std::os::unix::fs::lchown(&path, Some(uid), Some(uid))?;
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path)? {
                stack.push(entry?.path());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn is_root() -> bool {
        rustix::process::geteuid().is_root()
    }

    #[test]
    fn a_directory_and_its_contents_are_given_but_not_what_a_symlink_names() {
        if !is_root() {
            return; // chown to another uid needs root
        }
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::write(&outside, b"host file").unwrap();
        let dir = tmp.path().join("work");
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/f"), b"x").unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("link")).unwrap();
        give_dir(&dir, 200_123, 0o700, true).unwrap();
        for p in ["", "sub", "sub/f", "link"] {
            let m = std::fs::symlink_metadata(dir.join(p)).unwrap();
            assert_eq!((m.uid(), m.gid()), (200_123, 200_123), "{p}");
        }
        let m = std::fs::metadata(&dir).unwrap();
        assert_eq!(m.permissions().mode() & 0o7777, 0o700);
        let host = std::fs::metadata(&outside).unwrap();
        assert_eq!((host.uid(), host.gid()), (0, 0));
    }

    #[test]
    fn a_symlink_or_a_file_in_place_of_the_directory_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::write(&outside, b"host file").unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o644)).unwrap();
        let link = tmp.path().join("mnt");
        std::os::unix::fs::symlink(&outside, &link).unwrap();
        let err = give_dir(&link, 200_123, 0o700, false).unwrap_err();
        assert!(err.to_string().contains("is a symlink"), "{err}");
        let err = give_dir_if_root(&link, 65534).unwrap_err();
        assert!(err.to_string().contains("is a symlink"), "{err}");
        let err = give_dir(&outside, 200_123, 0o700, true).unwrap_err();
        assert!(err.to_string().contains("is not a directory"), "{err}");
        let host = std::fs::metadata(&outside).unwrap();
        assert_eq!(host.permissions().mode() & 0o7777, 0o644);
        assert_eq!(host.uid(), rustix::process::geteuid().as_raw());
    }
}
