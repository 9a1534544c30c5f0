//! Volume storage on this host, under `data_dir/volumes/<id>/`: `volume.img` (a sparse ext4
//! image of the volume's size, from `mkfs.ext4`) mounted on a loop device at `mnt/` when the
//! agent is root and the tools are there; otherwise `mnt/` is a plain directory (`fstype`
//! `dir`, size not enforced). Every function is idempotent, so an operation cut short by a
//! crash is finished by running it again.
//!
//! Snapshots and forks are consistent copies of an image ([`consistent_copy`]): the mounted
//! file system is frozen (`fsfreeze`, so a machine writing to it waits) while its image is
//! copied sparsely, block by block, skipping zeros and hashing what is copied.

use sha2::{Digest, Sha256};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const GIB: u64 = 1024 * 1024 * 1024;

/// Where volumes live and how they are made.
#[derive(Debug, Clone)]
pub struct VolumeFs {
    pub root: PathBuf,
    /// Where snapshots are kept (`<id>/volume.img` and `<id>/snapshot.json`).
    pub snapshots: PathBuf,
    /// Make ext4 images on loop devices (root, e2fsprogs and `/dev/loop-control`).
    pub ext4: bool,
}

/// Block counts of a mounted volume.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FsStats {
    pub block_size: u64,
    pub blocks: u64,
    pub blocks_free: u64,
    pub blocks_avail: u64,
}

impl VolumeFs {
    /// Volumes under `data_dir/volumes`, snapshots under `data_dir/snapshots`; ext4 when
    /// this host can make and mount images.
    pub fn new(data_dir: &Path) -> VolumeFs {
        let ext4 = rustix::process::geteuid().is_root()
            && Path::new("/dev/loop-control").exists()
            && ["mkfs.ext4", "resize2fs", "mount", "umount", "losetup"]
                .iter()
                .all(|tool| find_tool(tool).is_some());
        VolumeFs {
            root: data_dir.join("volumes"),
            snapshots: data_dir.join("snapshots"),
            ext4,
        }
    }

    /// The file system new volumes get: `ext4` or `dir`.
    pub fn fstype(&self) -> &'static str {
        if self.ext4 {
            "ext4"
        } else {
            "dir"
        }
    }

    /// A volume's directory.
    pub fn dir(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }

    /// Where a volume's file system is (what a machine writes to).
    pub fn mount_path(&self, id: &str) -> PathBuf {
        self.dir(id).join("mnt")
    }

    /// A volume's ext4 image.
    pub fn image(&self, id: &str) -> PathBuf {
        self.dir(id).join("volume.img")
    }

    /// Makes the volume's storage and mounts it (or finishes doing so): a new file system,
    /// or a copy of `source` grown to `size_gb`.
    pub fn create(
        &self,
        id: &str,
        size_gb: u64,
        fstype: &str,
        source: Option<&CopySource>,
    ) -> io::Result<()> {
        let mnt = self.mount_path(id);
        std::fs::create_dir_all(&mnt)?;
        if fstype != "ext4" || is_mounted(&mnt)? {
            return Ok(());
        }
        let image = self.image(id);
        let formatted = self.dir(id).join("formatted");
        if !formatted.exists() {
            match source {
                Some(source) => {
                    // Copied aside and renamed, so a crash mid-copy leaves no half image.
                    let partial = self.dir(id).join("volume.img.partial");
                    consistent_copy(source, &partial, false, &|| {})?;
                    std::fs::rename(&partial, &image)?;
                }
                None => {
                    let f = std::fs::File::create(&image)?;
                    f.set_len(size_gb * GIB)?;
                    f.sync_all()?;
                    run("mkfs.ext4", &["-F", "-q", "-m", "0", path_str(&image)?])?;
                }
            }
            std::fs::write(&formatted, b"")?;
        }
        self.mount(id)?;
        if std::fs::metadata(&image)?.len() < size_gb * GIB {
            self.grow(id, size_gb, fstype)?;
        }
        Ok(())
    }

    /// What a consistent copy of volume `id` reads: its image, with its file system frozen
    /// while it is read.
    pub fn copy_source(&self, id: &str) -> CopySource {
        CopySource {
            image: self.image(id),
            freeze: Some(self.mount_path(id)),
        }
    }

    /// Thaws volume `id`'s file system, in case a crash left it frozen mid-copy (a no-op
    /// when it is not frozen).
    pub fn thaw(&self, id: &str) {
        if let Some(exe) = find_tool("fsfreeze") {
            let _ = Command::new(exe)
                .arg("-u")
                .arg(self.mount_path(id))
                .output();
        }
    }

    /// Mounts an existing ext4 volume if it is not mounted (after a host reboot).
    pub fn mount(&self, id: &str) -> io::Result<()> {
        let mnt = self.mount_path(id);
        if is_mounted(&mnt)? {
            return Ok(());
        }
        run(
            "mount",
            &["-o", "loop", path_str(&self.image(id))?, path_str(&mnt)?],
        )
    }

    /// Grows an ext4 volume to `size_gb` (a `dir` volume has no size): online when the
    /// kernel lets us, otherwise unmounted (which fails while a workload holds it open).
    pub fn grow(&self, id: &str, size_gb: u64, fstype: &str) -> io::Result<()> {
        if fstype != "ext4" {
            return Ok(());
        }
        self.mount(id)?;
        let image = self.image(id);
        let f = std::fs::OpenOptions::new().write(true).open(&image)?;
        if f.metadata()?.len() < size_gb * GIB {
            f.set_len(size_gb * GIB)?;
            f.sync_all()?;
        }
        let mnt = self.mount_path(id);
        let device = loop_device_of(&mnt)?.ok_or_else(|| {
            io::Error::other(format!("volume {id} is mounted but not from a loop device"))
        })?;
        // The loop device learns the file's new size, then ext4 grows online.
        run("losetup", &["-c", &device])?;
        let online = run("resize2fs", &[&device]);
        let Err(online_err) = online else {
            return Ok(());
        };
        // Some hosts (containers) refuse online resizing: grow it unmounted.
        run("umount", &[path_str(&mnt)?]).map_err(|e| {
            io::Error::other(format!(
                "growing online failed ({online_err}) and the volume is in use ({e}); stop the machine that mounts it and extend again"
            ))
        })?;
        // The loop device goes away asynchronously; until it has, its cache holds the old
        // superblock and a new mount could reuse it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while loop_attached(&image)? && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let offline = run("resize2fs", &["-f", path_str(&image)?]);
        self.mount(id)?;
        offline
    }

    /// Unmounts and removes everything of a volume.
    pub fn remove(&self, id: &str) -> io::Result<()> {
        let mnt = self.mount_path(id);
        if mnt.exists() && is_mounted(&mnt)? {
            run("umount", &[path_str(&mnt)?])?;
        }
        match std::fs::remove_dir_all(self.dir(id)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Block counts of the volume's file system (of the host's, for a `dir` volume).
    pub fn stats(&self, id: &str) -> io::Result<FsStats> {
        let st = rustix::fs::statvfs(self.mount_path(id)).map_err(io::Error::from)?;
        Ok(FsStats {
            block_size: st.f_frsize,
            blocks: st.f_blocks,
            blocks_free: st.f_bfree,
            blocks_avail: st.f_bavail,
        })
    }

    /// Bytes used by a `dir` volume's files (what `du` would say, roughly).
    pub fn dir_bytes(&self, id: &str) -> u64 {
        fn walk(p: &Path) -> u64 {
            let Ok(entries) = std::fs::read_dir(p) else {
                return 0;
            };
            entries
                .flatten()
                .map(|e| match e.file_type() {
                    Ok(t) if t.is_dir() => walk(&e.path()),
                    Ok(_) => e.metadata().map(|m| m.len()).unwrap_or(0),
                    Err(_) => 0,
                })
                .sum()
        }
        walk(&self.mount_path(id))
    }
}

/// The image a copy reads, and the mount to freeze while it does (none for a snapshot,
/// which nothing writes to).
#[derive(Debug, Clone)]
pub struct CopySource {
    pub image: PathBuf,
    pub freeze: Option<PathBuf>,
}

/// What a copy copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    /// Bytes of non-zero blocks.
    pub bytes: u64,
    /// `sha256:` over every non-zero 4 KiB block and its offset: equal for equal images,
    /// whatever their holes. Only when asked for (snapshots).
    pub digest: Option<String>,
}

/// Copies `source.image` to `to` (made, synced) with its mount frozen meanwhile, so the
/// copy is a point in time of the file system even while a machine writes to it.
/// `while_frozen` runs once it is frozen (crash tests kill the agent there).
pub fn consistent_copy(
    source: &CopySource,
    to: &Path,
    digest: bool,
    while_frozen: &dyn Fn(),
) -> io::Result<Copied> {
    let _frozen = match &source.freeze {
        Some(mnt) if is_mounted(mnt)? => Some(Frozen::new(mnt)?),
        _ => None,
    };
    while_frozen();
    sparse_copy(&source.image, to, digest)
}

/// A frozen file system, thawed when dropped (also on an error or a panic).
struct Frozen(PathBuf);

impl Frozen {
    fn new(mnt: &Path) -> io::Result<Frozen> {
        run("fsfreeze", &["-f", path_str(mnt)?])?;
        Ok(Frozen(mnt.to_path_buf()))
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if let Ok(p) = path_str(&self.0) {
            if let Err(err) = run("fsfreeze", &["-u", p]) {
                tracing::error!(mount = %self.0.display(), error = %err, "thawing a volume");
            }
        }
    }
}

/// Block size of the copy's zero detection and digest.
const COPY_BLOCK: usize = 4096;
static ZERO_BLOCK: [u8; COPY_BLOCK] = [0; COPY_BLOCK];

/// Copies `from` to `to` keeping it sparse: only the data extents of `from` are read
/// (`SEEK_DATA`/`SEEK_HOLE`), and of them only non-zero blocks are written.
fn sparse_copy(from: &Path, to: &Path, digest: bool) -> io::Result<Copied> {
    use std::os::fd::AsRawFd;
    let src = std::fs::File::open(from)?;
    let len = src.metadata()?.len();
    let dst = std::fs::File::create(to)?;
    dst.set_len(len)?;
    let seek = |off: u64, whence: libc::c_int| -> io::Result<Option<u64>> {
        // SAFETY: lseek on a descriptor we own; no memory is passed.
        let r = unsafe { libc::lseek(src.as_raw_fd(), off as libc::off_t, whence) };
        if r < 0 {
            let err = io::Error::last_os_error();
            return match err.raw_os_error() {
                Some(libc::ENXIO) => Ok(None),
                _ => Err(err),
            };
        }
        Ok(Some(r as u64))
    };
    let mut hasher = digest.then(Sha256::new);
    let mut buf = vec![0u8; 1 << 20];
    let mut bytes = 0;
    let mut pos = 0;
    while pos < len {
        let Some(data) = seek(pos, libc::SEEK_DATA)? else {
            break;
        };
        let hole = seek(data, libc::SEEK_HOLE)?.unwrap_or(len).min(len);
        // Whole blocks: extents are block-aligned on every file system we run on.
        let mut off = data - data % COPY_BLOCK as u64;
        while off < hole {
            let n = (buf.len() as u64).min(len - off) as usize;
            let chunk = &mut buf[..n];
            src.read_exact_at(chunk, off)?;
            let mut run_start = None;
            for (i, block) in chunk.chunks(COPY_BLOCK).enumerate() {
                let at = i * COPY_BLOCK;
                if block != &ZERO_BLOCK[..block.len()] {
                    if let Some(h) = hasher.as_mut() {
                        h.update((off + at as u64).to_le_bytes());
                        h.update(block);
                    }
                    bytes += block.len() as u64;
                    run_start.get_or_insert(at);
                } else if let Some(start) = run_start.take() {
                    dst.write_all_at(&chunk[start..at], off + start as u64)?;
                }
            }
            if let Some(start) = run_start {
                dst.write_all_at(&chunk[start..], off + start as u64)?;
            }
            off += n as u64;
        }
        pos = off;
    }
    dst.sync_all()?;
    Ok(Copied {
        bytes,
        digest: hasher.map(|h| format!("sha256:{}", hex::encode(h.finalize()))),
    })
}

/// Free space of the file system holding `path`, in GB.
pub fn free_gb(path: &Path) -> u64 {
    rustix::fs::statvfs(path)
        .map(|st| st.f_bavail * st.f_frsize / GIB)
        .unwrap_or(0)
}

fn find_tool(name: &str) -> Option<PathBuf> {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
}

pub(crate) fn path_str(p: &Path) -> io::Result<&str> {
    p.to_str()
        .ok_or_else(|| io::Error::other(format!("path {} is not UTF-8", p.display())))
}

pub(crate) fn run(tool: &str, args: &[&str]) -> io::Result<()> {
    let exe = find_tool(tool).ok_or_else(|| io::Error::other(format!("{tool} not found")))?;
    let out = Command::new(&exe).args(args).output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{tool} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// The mount at exactly `mnt` in this mount namespace, as (source device, mount point).
fn mount_at(mnt: &Path) -> io::Result<Option<String>> {
    let mnt = std::fs::canonicalize(mnt)?;
    let table = std::fs::read_to_string("/proc/self/mountinfo")?;
    // Fields: id parent major:minor root mount-point options... - fstype source superopts.
    Ok(table.lines().rev().find_map(|line| {
        let mut fields = line.split(' ');
        let point = fields.nth(4)?;
        if unescape(point) != mnt.to_string_lossy() {
            return None;
        }
        let rest = line.split(" - ").nth(1)?;
        Some(rest.split(' ').nth(1).unwrap_or("").to_string())
    }))
}

/// True while a loop device is backed by `image`.
fn loop_attached(image: &Path) -> io::Result<bool> {
    let exe = find_tool("losetup").ok_or_else(|| io::Error::other("losetup not found"))?;
    let out = Command::new(exe).arg("-j").arg(image).output()?;
    Ok(!out.stdout.is_empty())
}

fn is_mounted(mnt: &Path) -> io::Result<bool> {
    Ok(mount_at(mnt)?.is_some())
}

fn loop_device_of(mnt: &Path) -> io::Result<Option<String>> {
    Ok(mount_at(mnt)?.filter(|src| src.starts_with("/dev/loop")))
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(v as char);
                i += 4;
                continue;
            }
        }
        out.push(b[i] as char);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dir_volumes_are_made_and_removed_idempotently() {
        let tmp = tempfile::tempdir().unwrap();
        let fs = VolumeFs {
            ext4: false,
            ..VolumeFs::new(tmp.path())
        };
        fs.create("vol_a", 1, "dir", None).unwrap();
        fs.create("vol_a", 1, "dir", None).unwrap();
        std::fs::write(fs.mount_path("vol_a").join("f"), b"hello").unwrap();
        assert_eq!(fs.dir_bytes("vol_a"), 5);
        assert!(fs.stats("vol_a").unwrap().blocks > 0);
        fs.remove("vol_a").unwrap();
        fs.remove("vol_a").unwrap();
        assert!(!fs.dir("vol_a").exists());
    }

    #[test]
    fn sparse_copies_keep_data_holes_and_a_digest_of_the_data() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b, c) = (
            tmp.path().join("a"),
            tmp.path().join("b"),
            tmp.path().join("c"),
        );
        let f = std::fs::File::create(&a).unwrap();
        f.set_len(64 << 20).unwrap();
        f.write_all_at(b"first", 4096 * 3 + 7).unwrap();
        f.write_all_at(&vec![0u8; 8192], 1 << 20).unwrap(); // allocated, but zeros
        f.write_all_at(b"last", (64 << 20) - 4).unwrap();
        let copied = sparse_copy(&a, &b, true).unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        assert_eq!(copied.bytes, 2 * 4096, "two non-zero blocks");
        use std::os::unix::fs::MetadataExt;
        assert!(
            std::fs::metadata(&b).unwrap().blocks() * 512 <= 64 * 1024,
            "sparse"
        );
        // The same content, written differently, has the same digest; other content not.
        assert!(copied.digest.as_ref().unwrap().starts_with("sha256:"));
        assert_eq!(sparse_copy(&b, &c, true).unwrap().digest, copied.digest);
        f.write_all_at(b"x", 0).unwrap();
        assert_ne!(sparse_copy(&a, &c, true).unwrap().digest, copied.digest);
        assert_eq!(sparse_copy(&a, &c, false).unwrap().digest, None);
    }

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape("/a\\040b"), "/a b");
        assert_eq!(unescape("/plain"), "/plain");
    }
}
