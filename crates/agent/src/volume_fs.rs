//! Volume storage on this host, under `data_dir/volumes/<id>/`: `volume.img` (a sparse ext4
//! image of the volume's size, from `mkfs.ext4`) mounted on a loop device at `mnt/` when the
//! agent is root and the tools are there; otherwise `mnt/` is a plain directory (`fstype`
//! `dir`, size not enforced). Every function is idempotent, so an operation cut short by a
//! crash is finished by running it again.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

const GIB: u64 = 1024 * 1024 * 1024;

/// Where volumes live and how they are made.
#[derive(Debug, Clone)]
pub struct VolumeFs {
    pub root: PathBuf,
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
    /// Volumes under `root`; ext4 when this host can make and mount images.
    pub fn new(root: PathBuf) -> VolumeFs {
        let ext4 = rustix::process::geteuid().is_root()
            && Path::new("/dev/loop-control").exists()
            && ["mkfs.ext4", "resize2fs", "mount", "umount", "losetup"]
                .iter()
                .all(|tool| find_tool(tool).is_some());
        VolumeFs { root, ext4 }
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

    fn image(&self, id: &str) -> PathBuf {
        self.dir(id).join("volume.img")
    }

    /// Makes the volume's storage and mounts it (or finishes doing so).
    pub fn create(&self, id: &str, size_gb: u64, fstype: &str) -> io::Result<()> {
        let mnt = self.mount_path(id);
        std::fs::create_dir_all(&mnt)?;
        if fstype != "ext4" || is_mounted(&mnt)? {
            return Ok(());
        }
        let image = self.image(id);
        let formatted = self.dir(id).join("formatted");
        if !formatted.exists() {
            let f = std::fs::File::create(&image)?;
            f.set_len(size_gb * GIB)?;
            f.sync_all()?;
            run("mkfs.ext4", &["-F", "-q", "-m", "0", path_str(&image)?])?;
            std::fs::write(&formatted, b"")?;
        }
        self.mount(id)
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

fn path_str(p: &Path) -> io::Result<&str> {
    p.to_str()
        .ok_or_else(|| io::Error::other(format!("path {} is not UTF-8", p.display())))
}

fn run(tool: &str, args: &[&str]) -> io::Result<()> {
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
            root: tmp.path().join("volumes"),
            ext4: false,
        };
        fs.create("vol_a", 1, "dir").unwrap();
        fs.create("vol_a", 1, "dir").unwrap();
        std::fs::write(fs.mount_path("vol_a").join("f"), b"hello").unwrap();
        assert_eq!(fs.dir_bytes("vol_a"), 5);
        assert!(fs.stats("vol_a").unwrap().blocks > 0);
        fs.remove("vol_a").unwrap();
        fs.remove("vol_a").unwrap();
        assert!(!fs.dir("vol_a").exists());
    }

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape("/a\\040b"), "/a b");
        assert_eq!(unescape("/plain"), "/plain");
    }
}
