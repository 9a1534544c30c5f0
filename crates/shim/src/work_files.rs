//! Files written into a process machine's work directory before its workload starts (Fly's
//! `config.files`, which an image machine gets in its root filesystem). The work directory
//! belongs to the workload, which may have left symlinks, hard links or FIFOs in it: every
//! path is opened beneath it with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_XDEV)`, so a write never leaves it nor enters another mount, and a file is
//! written as a new one (`O_EXCL`) in place of whatever had its name, so a hard link to a
//! host file is replaced, not written through (nor its owner changed). Directories created
//! and the files are owned by the workload user.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};

use crate::user::Credentials;
use crate::{FailureKind, Fault};

/// One file: `path` relative to the work directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkFile {
    pub path: PathBuf,
    pub contents: Vec<u8>,
    pub mode: u32,
}

/// Writes `files` into `workdir` (created if missing) for a workload running as `user`
/// ([`crate::ShimSpec::user`]); an error names the file.
pub fn write_work_files(
    workdir: &Path,
    user: Option<&str>,
    files: &[WorkFile],
) -> Result<(), Fault> {
    if files.is_empty() {
        return Ok(());
    }
    let (euid, egid) = crate::sys::effective_ids();
    let creds = crate::user::resolve(user, euid, egid).map_err(Fault::from_shim_message)?;
    crate::launch::prepare_workdir(workdir, creds.as_ref()).map_err(Fault::from_shim_message)?;
    let root = rustix::fs::open(
        workdir,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Fault::errno(format!("workdir {}", workdir.display()), e))?;
    for f in files {
        write_one(&root, f, creds.as_ref())
            .map_err(|e| e.context(format!("config.files {}", f.path.display())))?;
    }
    Ok(())
}

fn write_one(root: &OwnedFd, f: &WorkFile, creds: Option<&Credentials>) -> Result<(), Fault> {
    let how = ResolveFlags::BENEATH
        | ResolveFlags::NO_SYMLINKS
        | ResolveFlags::NO_MAGICLINKS
        | ResolveFlags::NO_XDEV;
    let mut names = Vec::new();
    for c in f.path.components() {
        match c {
            Component::Normal(n) => names.push(n),
            _ => {
                return Err(Fault::new(
                    FailureKind::Config,
                    "must be a plain path without . or ..",
                ))
            }
        }
    }
    let Some((file, dirs)) = names.split_last() else {
        return Err(Fault::new(FailureKind::Config, "empty path"));
    };
    let mut dir = rustix::fs::openat2(
        root,
        ".",
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
        how,
    )
    .map_err(|e| Fault::errno("", e))?;
    for name in dirs {
        let created = match rustix::fs::mkdirat(&dir, *name, Mode::from_raw_mode(0o755)) {
            Ok(()) => true,
            Err(rustix::io::Errno::EXIST) => false,
            Err(e) => {
                return Err(Fault::errno(
                    format!("creating {}", Path::new(name).display()),
                    e,
                ))
            }
        };
        let next = rustix::fs::openat2(
            &dir,
            *name,
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
            how,
        )
        .map_err(|e| Fault::errno(format!("opening {}", Path::new(name).display()), e))?;
        if created {
            give(&next, creds)?;
        }
        dir = next;
    }
    // Whatever has the name goes first (a file, a symlink, a hard link, a FIFO; a
    // directory or a mount point is refused): the file written is always a new one.
    match rustix::fs::unlinkat(&dir, *file, rustix::fs::AtFlags::empty()) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => {}
        Err(e) => return Err(Fault::errno("replacing it", e)),
    }
    let fd = rustix::fs::openat2(
        &dir,
        *file,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(f.mode),
        how,
    )
    .map_err(|e| Fault::errno("", e))?;
    // The umask may have narrowed the mode asked for.
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(f.mode)).map_err(|e| Fault::errno("", e))?;
    give(&fd, creds)?;
    std::fs::File::from(fd)
        .write_all(&f.contents)
        .map_err(|e| Fault::io("", &e))
}

/// Hands a file or directory to the workload user.
fn give(fd: &OwnedFd, creds: Option<&Credentials>) -> Result<(), Fault> {
    let Some(c) = creds else { return Ok(()) };
    rustix::fs::fchown(
        fd,
        Some(rustix::fs::Uid::from_raw(c.uid)),
        Some(rustix::fs::Gid::from_raw(c.gid)),
    )
    .map_err(|e| Fault::errno("chown", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, contents: &str) -> WorkFile {
        WorkFile {
            path: path.into(),
            contents: contents.as_bytes().to_vec(),
            mode: 0o640,
        }
    }

    #[test]
    fn files_are_written_beneath_the_workdir_with_their_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        write_work_files(&work, None, &[file("etc/app/conf.toml", "x = 1\n")]).unwrap();
        let written = work.join("etc/app/conf.toml");
        assert_eq!(std::fs::read_to_string(&written).unwrap(), "x = 1\n");
        let mode = std::fs::metadata(&written).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o640);
        // Written again (the next start): replaced, not appended.
        write_work_files(&work, None, &[file("etc/app/conf.toml", "x = 2\n")]).unwrap();
        assert_eq!(std::fs::read_to_string(&written).unwrap(), "x = 2\n");
    }

    #[test]
    fn a_symlink_left_in_the_workdir_is_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&work).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, work.join("etc")).unwrap();
        std::os::unix::fs::symlink(outside.join("secret"), work.join("f")).unwrap();
        assert!(write_work_files(&work, None, &[file("etc/passwd", "x")]).is_err());
        assert!(write_work_files(&work, None, &[file("../escape", "x")]).is_err());
        // A symlink where the file goes is replaced by the file.
        write_work_files(&work, None, &[file("f", "x")]).unwrap();
        assert!(std::fs::symlink_metadata(work.join("f")).unwrap().is_file());
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
    }

    /// A hard link the workload left where a file goes (to a host file on the same file
    /// system) is replaced: the host file keeps its contents, owner and mode. As root the
    /// files are given to nobody, which is how a host file could end up nobody's.
    #[test]
    fn a_hard_link_left_in_the_workdir_is_replaced_not_written_through() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        let host = dir.path().join("passwd");
        std::fs::write(&host, "root:x:0:0\n").unwrap();
        std::fs::set_permissions(&host, std::fs::Permissions::from_mode(0o644)).unwrap();
        let before = std::fs::metadata(&host).unwrap();
        std::fs::hard_link(&host, work.join("f")).unwrap();
        write_work_files(&work, None, &[file("f", "mine")]).unwrap();
        assert_eq!(std::fs::read_to_string(work.join("f")).unwrap(), "mine");
        let after = std::fs::metadata(&host).unwrap();
        assert_eq!(std::fs::read_to_string(&host).unwrap(), "root:x:0:0\n");
        assert_eq!(
            (after.uid(), after.gid(), after.mode(), after.nlink()),
            (before.uid(), before.gid(), before.mode(), 1)
        );
        // A FIFO there (whose open would block the launch) is replaced too.
        rustix::fs::mknodat(
            rustix::fs::CWD,
            work.join("p"),
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        write_work_files(&work, None, &[file("p", "x")]).unwrap();
        assert!(std::fs::symlink_metadata(work.join("p")).unwrap().is_file());
    }
}
