//! A machine's writable space with a size the kernel enforces (issue 31 item 5): its own
//! ext4 file system, a sparse image in the machine's directory on a loop device, mounted
//! `nosuid,nodev`:
//!
//! - a sandboxed process machine's work directory: `machines/<id>/disk.img` at
//!   `machines/<id>/work`, made at its first start;
//! - an image machine's writable layer: `machines/<id>/layer.img` at `machines/<id>/layer`,
//!   which holds the overlay's `upper` and `work` (or the flattened copy of the image where
//!   overlayfs is missing), made at its first start ([`ensure_layer`]).
//!
//! A workload that fills it gets `ENOSPC` there, and the host's disk, the agent's store and
//! the other machines are untouched. The size is the machine's `config.rootfs.size_gb`
//! (Fly's field), else the host's default for every machine (`--machine-disk-mb`), else one
//! by guest size ([`default_mb`]). The image is sparse: a machine costs the host only what
//! it wrote. [`full`] says when one has no room left (the agent checks its started machines
//! every few seconds).
//!
//! Start speed: `mkfs.ext4` runs once per size, into `DATA/disk-templates/<MB>.img`; a
//! machine's image is a sparse copy of it (its few MB of metadata), attached to a free loop
//! device with `LOOP_CONFIGURE` (autoclear) and mounted with `mount(2)`, without running a
//! program; `noinit_itable`: the template's inode tables are holes, which read as zeros,
//! so the kernel need not write them. An image machine's layer disk, emptied at every
//! start anyway, is not synced after its copy (one that does not mount after a crash is
//! made again). A process machine's work disk is not synced before it is mounted either
//! (the sync took 5-7 ms of its first start, issue 36): a thread syncs it right after and
//! then writes `disk.synced`; a work disk without that mark whose file system does not
//! mount (the host went down before its copy reached the disk: the machine had no time to
//! keep anything there) is made again, and one with it is an error, as before; releasing
//! the disk waits for that thread, so it never writes into a directory being removed. Most
//! first starts do none of this: they take a disk the pool made ahead, copied, synced and
//! mounted nowhere ([`crate::disk_pool`]; copies alone made ahead were tried before and
//! dropped: their writes slowed the next starts more than the copy costs, and the mount of
//! a cold loop device, which the pool also does ahead, was most of a start's disk time).
//!
//! Nothing is left on the host: destroy unmounts them (the loop device goes with the mount)
//! before removing the machine's directory; a host reset or a test kit's release unmounts
//! everything below the data dir and detaches the loop devices backed there
//! (`agent/src/cleanup.rs`).

use std::io;
use std::path::Path;

use crate::volume_fs::{path_str, run};

/// One of a machine's disks, by its names in the machine's directory.
pub(crate) struct Disk {
    /// The image file.
    pub(crate) image: &'static str,
    /// Written once the image holds a file system (a crash mid-copy makes it again).
    pub(crate) formatted: &'static str,
    /// Where it is mounted.
    pub(crate) mount: &'static str,
    /// Whether what it holds is thrown away at each start: its copy is not synced (a start
    /// saves the time), and one that does not mount (the host went down before the copy
    /// reached its disk) is made again.
    disposable: bool,
    /// A kept disk: written once its copy was synced, after it was first mounted.
    pub(crate) synced: &'static str,
}

/// A process machine's work directory.
pub(crate) const WORK: Disk = Disk {
    image: "disk.img",
    formatted: "disk.formatted",
    mount: "work",
    disposable: false,
    synced: "disk.synced",
};

/// An image machine's writable layer (overlay upper and work, or the copied rootfs).
pub(crate) const LAYER: Disk = Disk {
    image: "layer.img",
    formatted: "layer.formatted",
    mount: LAYER_DIR,
    disposable: true,
    synced: "",
};

/// Where an image machine's writable layer is, in its machine directory.
pub const LAYER_DIR: &str = "layer";

/// Image machine `machine_dir`'s writable layer directory (the mount of its disk, when it
/// has a limit).
pub fn layer_dir(machine_dir: &Path) -> std::path::PathBuf {
    machine_dir.join(LAYER_DIR)
}
/// The largest size a machine may ask for (`config.rootfs.size_gb`).
pub const MAX_GB: u64 = 1024;

/// The size of a machine's writable space by its guest memory, when nothing says
/// otherwise: 4 MB of disk per MB of memory (1 GB for the smallest guest), at most 8 GB
/// (Fly's default rootfs size).
pub fn default_mb(memory_mb: u64) -> u64 {
    (memory_mb * 4).clamp(1024, 8192)
}

/// Whether `work` is a mount point (another file system than `machine_dir`'s).
fn is_mounted(machine_dir: &Path, work: &Path) -> io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let dev = |p: &Path| std::fs::symlink_metadata(p).map(|m| m.dev());
    match dev(work) {
        Ok(d) => Ok(d != dev(machine_dir)?),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Makes machine `machine_dir`'s work directory a file system of `size_mb` (once, from
/// the template of that size in `templates`) and mounts it (if it is not). A work
/// directory that already holds files on the host's file system (a machine from before
/// limits) is left as it is. Returns whether it is limited.
pub fn ensure(machine_dir: &Path, templates: &Path, size_mb: u64) -> io::Result<bool> {
    ensure_disk(&WORK, machine_dir, templates, size_mb)
}

/// Makes image machine `machine_dir`'s writable layer directory ([`layer_dir`]) a file
/// system of `size_mb` and mounts it, as [`ensure`] does the work directory. It must hold
/// nothing on the host's file system (the caller removed an earlier rootfs).
pub fn ensure_layer(machine_dir: &Path, templates: &Path, size_mb: u64) -> io::Result<bool> {
    ensure_disk(&LAYER, machine_dir, templates, size_mb)
}

fn ensure_disk(
    disk: &Disk,
    machine_dir: &Path,
    templates: &Path,
    size_mb: u64,
) -> io::Result<bool> {
    let work = machine_dir.join(disk.mount);
    if is_mounted(machine_dir, &work)? {
        return Ok(true);
    }
    let image = machine_dir.join(disk.image);
    let formatted = machine_dir.join(disk.formatted);
    let made = !formatted.exists();
    if made {
        if std::fs::read_dir(&work).is_ok_and(|mut d| d.next().is_some()) {
            return Ok(false);
        }
        sparse_copy(&template(templates, size_mb)?, &image)?;
        std::fs::write(&formatted, b"")?;
    }
    std::fs::create_dir_all(&work)?;
    let synced = (!disk.disposable).then(|| machine_dir.join(disk.synced));
    match mount_image(&image, &work)? {
        Ok(()) => {}
        // Its copy may never have reached the disk: nothing was kept there.
        Err(err) if !made && synced.as_ref().is_none_or(|s| !s.exists()) => {
            tracing::warn!(error = %err, image = %image.display(), "a machine's disk does not mount: made again");
            std::fs::remove_file(&formatted)?;
            sparse_copy(&template(templates, size_mb)?, &image)?;
            std::fs::write(&formatted, b"")?;
            mount_image(&image, &work)??;
        }
        Err(err) => return Err(err),
    }
    if let Some(synced) = synced.filter(|s| !s.exists()) {
        sync_later(image, synced);
    }
    // The workload's directory starts empty.
    match std::fs::remove_dir(work.join("lost+found")) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    Ok(true)
}

/// The empty ext4 image of `size_mb` in `templates`, made now if it is not there yet
/// (in a file of its own, renamed when complete: two launches may make it at once).
pub(crate) fn template(templates: &Path, size_mb: u64) -> io::Result<std::path::PathBuf> {
    let path = templates.join(format!("{size_mb}.img"));
    if path.exists() {
        return Ok(path);
    }
    std::fs::create_dir_all(templates)?;
    let partial = templates.join(format!(
        ".{size_mb}.img.{}.{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let f = std::fs::File::create(&partial)?;
    f.set_len(size_mb << 20)?;
    drop(f);
    let made = run(
        "mkfs.ext4",
        &[
            "-F",
            "-q",
            "-m",
            "0",
            "-E",
            "lazy_itable_init=1,lazy_journal_init=1",
            path_str(&partial)?,
        ],
    )
    .and_then(|()| std::fs::rename(&partial, &path));
    if made.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    made.map(|()| path)
}

/// The marks of kept disks whose sync thread has not finished ([`sync_later`]): a release
/// waits for its disk's ([`release`]), so no `disk.synced` is written into a machine
/// directory being removed (a mark written between `remove_dir_all`'s listing and its
/// `rmdir` left the directory behind, not empty).
static SYNCING: Syncing = Syncing {
    marks: std::sync::Mutex::new(Vec::new()),
    done: std::sync::Condvar::new(),
};

struct Syncing {
    marks: std::sync::Mutex<Vec<std::path::PathBuf>>,
    done: std::sync::Condvar,
}

impl Syncing {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<std::path::PathBuf>> {
        self.marks.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn finish(&self, mark: &Path) {
        self.lock().retain(|m| m != mark);
        self.done.notify_all();
    }

    /// Waits (at most `within`) until no sync writes `mark`.
    fn wait(&self, mark: &Path, within: std::time::Duration) {
        let deadline = std::time::Instant::now() + within;
        let mut marks = self.lock();
        while marks.iter().any(|m| m == mark) {
            let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) else {
                tracing::warn!(mark = %mark.display(), "a machine's disk is still syncing as it is released");
                return;
            };
            marks = self
                .done
                .wait_timeout(marks, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// How long a test makes the sync thread wait before it syncs (a slow disk).
#[cfg(test)]
static SYNC_DELAY_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Syncs a kept disk's `image` on a thread of its own, then writes `synced` (errors are
/// logged: the next start tries again).
fn sync_later(image: std::path::PathBuf, synced: std::path::PathBuf) {
    SYNCING.lock().push(synced.clone());
    let mark = synced.clone();
    let sync = move || {
        #[cfg(test)]
        std::thread::sleep(std::time::Duration::from_millis(
            SYNC_DELAY_MS.load(std::sync::atomic::Ordering::Relaxed),
        ));
        let done = std::fs::File::open(&image)
            .and_then(|f| f.sync_all())
            .and_then(|()| std::fs::write(&synced, b""));
        if let Err(err) = done {
            tracing::warn!(error = %err, image = %image.display(), "syncing a machine's new disk");
        }
        SYNCING.finish(&synced);
    };
    if let Err(err) = std::thread::Builder::new()
        .name("disk-sync".into())
        .spawn(sync)
    {
        SYNCING.finish(&mark);
        tracing::warn!(error = %err, "starting a thread to sync a machine's new disk");
    }
}

/// Copies `from` to `to` (created, renamed into place once complete) with its holes: only
/// the ranges that hold data. Not synced.
pub(crate) fn sparse_copy(from: &Path, to: &Path) -> io::Result<()> {
    use rustix::fs::SeekFrom;
    let src = std::fs::File::open(from)?;
    let len = src.metadata()?.len();
    let partial = to.with_extension("partial");
    let dst = std::fs::File::create(&partial)?;
    dst.set_len(len)?;
    let mut at = 0u64;
    while at < len {
        let start = match rustix::fs::seek(&src, SeekFrom::Data(at)) {
            Ok(s) => s,
            Err(rustix::io::Errno::NXIO) => break, // only a hole is left
            Err(e) => return Err(e.into()),
        };
        let end = rustix::fs::seek(&src, SeekFrom::Hole(start))?;
        let (mut from_at, mut to_at) = (start, start);
        while from_at < end {
            let want = (end - from_at) as usize;
            let n = rustix::fs::copy_file_range(
                &src,
                Some(&mut from_at),
                &dst,
                Some(&mut to_at),
                want,
            )?;
            if n == 0 {
                break;
            }
        }
        at = end;
    }
    std::fs::rename(&partial, to)
}

/// `struct loop_info64` of `<linux/loop.h>`.
#[repr(C)]
struct LoopInfo64 {
    device: u64,
    inode: u64,
    rdevice: u64,
    offset: u64,
    sizelimit: u64,
    number: u32,
    encrypt_type: u32,
    encrypt_key_size: u32,
    flags: u32,
    file_name: [u8; 64],
    crypt_name: [u8; 64],
    encrypt_key: [u8; 32],
    init: [u64; 2],
}

/// `struct loop_config` of `<linux/loop.h>`.
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// Attaches `image` to a free loop device, autoclear (it is detached once nothing holds it:
/// the caller mounts it before it drops the returned descriptor). Returns the device's path
/// and an open descriptor of it.
pub(crate) fn attach_loop(image: &Path) -> io::Result<(String, std::fs::File)> {
    use std::os::fd::AsRawFd;
    let backing = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)?;
    let control = std::fs::File::open("/dev/loop-control")?;
    let mut tries = 0;
    loop {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and answers a device number.
        let n = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE as _) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let path = format!("/dev/loop{n}");
        let device = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)?;
        let mut config = LoopConfig {
            fd: backing.as_raw_fd() as u32,
            block_size: 0,
            // SAFETY: an all-zero loop_info64 is valid (plain integers and byte arrays).
            info: unsafe { std::mem::zeroed() },
            reserved: [0; 8],
        };
        config.info.flags = LO_FLAGS_AUTOCLEAR;
        // SAFETY: LOOP_CONFIGURE reads a `struct loop_config`, which `config` is, for the
        // length of the call.
        let r = unsafe { libc::ioctl(device.as_raw_fd(), LOOP_CONFIGURE as _, &config) };
        if r == 0 {
            return Ok((path, device));
        }
        let err = io::Error::last_os_error();
        // Another process took the device between the two calls: take the next free one.
        // Launches at once all get the same free device, and all but one try again: as
        // many times as launches may run at once (a copy without a sync makes them meet).
        tries += 1;
        if err.raw_os_error() != Some(libc::EBUSY) || tries > 256 {
            return Err(err);
        }
    }
}

/// Attaches `image` to a free loop device (autoclear: it goes when the mount does) and
/// mounts its ext4 at `target`, `nosuid,nodev`. The inner error: the loop device is
/// attached but its file system does not mount.
fn mount_image(image: &Path, target: &Path) -> io::Result<io::Result<()>> {
    let device = attach_loop(image)?;
    let mounted = rustix::mount::mount(
        device.0.as_str(),
        target,
        "ext4",
        rustix::mount::MountFlags::NOSUID | rustix::mount::MountFlags::NODEV,
        Some(c"noinit_itable"),
    );
    // Our descriptor closes here; the mount holds the device until it is unmounted (and
    // autoclear detaches it if nothing mounted).
    drop(device.1);
    Ok(mounted.map_err(io::Error::from))
}

/// Unmounts machine `machine_dir`'s disks (work directory, writable layer), those mounted
/// (their loop devices go with them). An image machine's rootfs mounted over its layer must
/// be unmounted first. Idempotent.
pub fn release(machine_dir: &Path) -> io::Result<()> {
    // The machine's directory may be removed next: its disk's sync (a thread that writes
    // a mark there) finishes first.
    SYNCING.wait(
        &machine_dir.join(WORK.synced),
        std::time::Duration::from_secs(30),
    );
    release_disk(&WORK, machine_dir)?;
    release_disk(&LAYER, machine_dir)
}

fn release_disk(disk: &Disk, machine_dir: &Path) -> io::Result<()> {
    use rustix::mount::{unmount, UnmountFlags};
    let work = machine_dir.join(disk.mount);
    while is_mounted(machine_dir, &work)? {
        match unmount(&work, UnmountFlags::NOFOLLOW) {
            Ok(()) => {}
            // Workloads killed a moment ago may still hold it: detach it lazily.
            Err(rustix::io::Errno::BUSY) => unmount(&work, UnmountFlags::DETACH)?,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Why the machine's writable space counts as full (none of it left for the workload),
/// or `None`.
pub fn full(machine_dir: &Path) -> Option<String> {
    let work = [WORK.mount, LAYER.mount]
        .map(|m| machine_dir.join(m))
        .into_iter()
        .find(|w| is_mounted(machine_dir, w).unwrap_or(false))?;
    let st = rustix::fs::statvfs(&work).ok()?;
    // Full: under 1% or 1 MiB left, whichever is more (a write that no longer fits fails
    // with some blocks still free: ext4 keeps a few back for its own metadata).
    let free = st.f_bavail * st.f_frsize;
    let size = st.f_blocks * st.f_frsize;
    (free < (size / 100).max(1 << 20)).then(|| {
        format!(
            "disk full: the machine's writable space ({} MB, config.rootfs.size_gb) has no room left",
            size >> 20
        )
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn the_default_grows_with_memory_between_1_and_8_gb() {
        assert_eq!(default_mb(256), 1024);
        assert_eq!(default_mb(1024), 4096);
        assert_eq!(default_mb(2048), 8192);
        assert_eq!(default_mb(65536), 8192);
    }

    /// Writes 64 MB to a new file `path` on a disk of 32 MB: the error that stopped it.
    pub(crate) fn write_64_mb(path: &Path) -> io::Error {
        use std::io::Write;
        let mut f = std::fs::File::create(path).unwrap();
        let chunk = vec![1u8; 1 << 20];
        (0..64)
            .find_map(|_| f.write_all(&chunk).err())
            .expect("64 MB do not fit in 32")
    }

    /// Loop devices backed by a file below `dir`, once those going have gone (autoclear
    /// is not instant), within 2 s.
    pub(crate) fn loops_below(dir: &Path) -> usize {
        for _ in 0..100 {
            if attached_below(dir) == 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        attached_below(dir)
    }

    pub(crate) fn attached_below(dir: &Path) -> usize {
        std::fs::read_dir("/sys/block")
            .unwrap()
            .flatten()
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
                    .is_ok_and(|b| Path::new(b.trim()).starts_with(dir))
            })
            .count()
    }

    /// A machine's disk unmounted however the test ends, so a failure leaves nothing on
    /// the host.
    pub(crate) struct Released<'a>(pub(crate) &'a Path);
    impl Drop for Released<'_> {
        fn drop(&mut self) {
            let _ = release(self.0);
        }
    }

    #[test]
    fn a_work_disk_stops_writes_at_its_size_and_leaves_nothing_once_released() {
        if !rustix::process::geteuid().is_root() || !Path::new("/dev/loop-control").exists() {
            return; // loop devices and mounts need root
        }
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().canonicalize().unwrap();
        let (machine, templates) = (dir.join("m1"), dir.join("templates"));
        std::fs::create_dir_all(&machine).unwrap();
        let _released = Released(&machine);
        assert!(ensure(&machine, &templates, 32).unwrap());
        assert!(ensure(&machine, &templates, 32).unwrap(), "mounted once");
        let work = machine.join("work");
        assert_eq!(
            std::fs::read_dir(&work).unwrap().count(),
            0,
            "no lost+found"
        );
        assert_eq!(full(&machine), None);
        let err = write_64_mb(&work.join("big"));
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
        assert!(full(&machine).unwrap().contains("disk full"));
        // The image is sparse: what the template and the machine cost is what they hold.
        use std::os::unix::fs::MetadataExt;
        let template = std::fs::metadata(templates.join("32.img")).unwrap();
        assert!(
            template.blocks() * 512 < 8 << 20,
            "{} bytes",
            template.blocks() * 512
        );
        release(&machine).unwrap();
        release(&machine).unwrap();
        assert!(!work.join("big").exists());
        assert_eq!(loops_below(&dir), 0);
        // Mounted again, it holds what was written.
        assert!(ensure(&machine, &templates, 32).unwrap());
        assert!(work.join("big").exists());
        release(&machine).unwrap();
        assert_eq!(loops_below(&dir), 0);
        // Another machine of that size starts from the template: a copy of its metadata
        // and a mount, no mkfs (the time is what a first start adds).
        let other = dir.join("m2");
        std::fs::create_dir_all(&other).unwrap();
        let _released = Released(&other);
        let t0 = std::time::Instant::now();
        assert!(ensure(&other, &templates, 32).unwrap());
        eprintln!("work disk from a template: {:?}", t0.elapsed());
        assert_eq!(std::fs::read_dir(other.join("work")).unwrap().count(), 0);
        release(&other).unwrap();
        assert_eq!(loops_below(&dir), 0);
    }

    /// Waits (≤ 10 s) until `path` exists.
    fn appears(path: &Path) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !path.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        path.exists()
    }

    /// Empties `image` as a copy that never reached the disk reads after a crash.
    fn lose_copy(image: &Path) {
        let f = std::fs::OpenOptions::new().write(true).open(image).unwrap();
        let len = f.metadata().unwrap().len();
        f.set_len(0).unwrap();
        f.set_len(len).unwrap();
    }

    #[test]
    fn a_work_disk_is_synced_after_its_start_and_made_again_only_if_its_copy_was_lost() {
        if !rustix::process::geteuid().is_root() || !Path::new("/dev/loop-control").exists() {
            return; // loop devices and mounts need root
        }
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().canonicalize().unwrap();
        let (machine, templates) = (dir.join("m1"), dir.join("templates"));
        std::fs::create_dir_all(&machine).unwrap();
        let _released = Released(&machine);
        let (image, synced) = (machine.join("disk.img"), machine.join("disk.synced"));
        assert!(ensure(&machine, &templates, 32).unwrap());
        assert!(appears(&synced), "synced once mounted");
        // The host went down before the copy reached the disk (and before the mark): made
        // again, empty, and synced.
        release(&machine).unwrap();
        std::fs::remove_file(&synced).unwrap();
        lose_copy(&image);
        assert!(ensure(&machine, &templates, 32).unwrap());
        assert_eq!(std::fs::read_dir(machine.join("work")).unwrap().count(), 0);
        assert!(appears(&synced));
        // A synced disk that does not mount is an error, never replaced.
        std::fs::write(machine.join("work/kept"), b"data").unwrap();
        release(&machine).unwrap();
        lose_copy(&image);
        assert!(ensure(&machine, &templates, 32).is_err());
        assert!(image.exists() && synced.exists());
        assert_eq!(loops_below(&dir), 0);
    }

    #[test]
    fn a_release_waits_for_its_disks_sync_so_the_directory_can_go() {
        if !rustix::process::geteuid().is_root() || !Path::new("/dev/loop-control").exists() {
            return; // loop devices and mounts need root
        }
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().canonicalize().unwrap();
        let (machine, templates) = (dir.join("m1"), dir.join("templates"));
        std::fs::create_dir_all(&machine).unwrap();
        let _released = Released(&machine);
        // A slow disk: the sync is still to come when the machine is destroyed.
        SYNC_DELAY_MS.store(300, std::sync::atomic::Ordering::Relaxed);
        assert!(ensure(&machine, &templates, 32).unwrap());
        assert!(!machine.join("disk.synced").exists());
        release(&machine).unwrap();
        // Nothing writes into the directory once released: it is removed whole, and stays.
        assert!(
            machine.join("disk.synced").exists(),
            "the sync finished first"
        );
        std::fs::remove_dir_all(&machine).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(400));
        assert!(!machine.exists());
        assert_eq!(loops_below(&dir), 0);
    }

    #[test]
    fn an_image_machines_layer_is_a_disk_of_its_own_that_says_when_it_is_full() {
        if !rustix::process::geteuid().is_root() || !Path::new("/dev/loop-control").exists() {
            return; // loop devices and mounts need root
        }
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().canonicalize().unwrap();
        let (machine, templates) = (dir.join("m1"), dir.join("templates"));
        std::fs::create_dir_all(&machine).unwrap();
        let _released = Released(&machine);
        assert!(ensure_layer(&machine, &templates, 32).unwrap());
        let layer = layer_dir(&machine);
        assert!(is_mounted(&machine, &layer).unwrap());
        assert!(machine.join("layer.img").exists());
        assert!(!machine.join("work").exists(), "not the work disk");
        assert_eq!(full(&machine), None);
        let err = write_64_mb(&layer.join("big"));
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
        assert!(full(&machine).unwrap().contains("disk full"));
        release(&machine).unwrap();
        assert!(!is_mounted(&machine, &layer).unwrap());
        assert_eq!(full(&machine), None, "not mounted: nothing to say");
        assert_eq!(loops_below(&dir), 0);
        // Its copy is not synced: one lost in a crash (here: emptied) is made again.
        std::fs::File::create(machine.join("layer.img")).unwrap();
        assert!(ensure_layer(&machine, &templates, 32).unwrap());
        assert!(is_mounted(&machine, &layer).unwrap());
        assert_eq!(std::fs::read_dir(&layer).unwrap().count(), 0);
        release(&machine).unwrap();
        assert_eq!(loops_below(&dir), 0);
        // What a start costs at the default size of the smallest guest, template made.
        let first = dir.join("m3");
        std::fs::create_dir_all(&first).unwrap();
        let _released_first = Released(&first);
        ensure_layer(&first, &templates, 1024).unwrap();
        release(&first).unwrap();
        for n in 0..3 {
            let m = dir.join(format!("t{n}"));
            std::fs::create_dir_all(&m).unwrap();
            let _released = Released(&m);
            let t0 = std::time::Instant::now();
            assert!(ensure_layer(&m, &templates, 1024).unwrap());
            eprintln!("a 1 GB layer disk from its template: {:?}", t0.elapsed());
            release(&m).unwrap();
        }
        assert_eq!(loops_below(&dir), 0);
    }

    #[test]
    fn a_launch_tells_a_full_disk_from_a_read_only_one_and_a_missing_directory() {
        use crate::launch_error::{LaunchError, LaunchStep};
        use bazaar_types::failure::FailureKind;
        if !rustix::process::geteuid().is_root() || !Path::new("/dev/loop-control").exists() {
            return; // loop devices and mounts need root
        }
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().canonicalize().unwrap();
        let (machine, templates) = (dir.join("m1"), dir.join("templates"));
        std::fs::create_dir_all(&machine).unwrap();
        let _released = Released(&machine);
        assert!(ensure(&machine, &templates, 32).unwrap());
        let work = machine.join("work");
        let launch = |workdir: &Path, name: &str| {
            let files = [bazaar_shim::WorkFile {
                path: name.into(),
                contents: vec![7; 1 << 20],
                mode: 0o644,
            }];
            bazaar_shim::write_work_files(workdir, None, &files)
                .map_err(|f| LaunchError::fault(LaunchStep::Files, f))
        };
        launch(&work, "etc/app.conf").unwrap();
        // Full: the machine's own disk.
        write_64_mb(&work.join("big"));
        let full = launch(&work, "etc/more.conf").expect_err("the disk is full");
        assert_eq!(full.kind, FailureKind::NoSpace, "{full}");
        assert_eq!(full.kind.http_status(), 507);
        assert!(full.retryable());
        assert_eq!(full.failure().step, "files");
        assert!(
            full.to_string().starts_with("config.files etc/more.conf: "),
            "{full}"
        );
        // Read-only: the kernel refuses the write.
        std::fs::remove_file(work.join("big")).unwrap();
        rustix::mount::mount_remount(&work, rustix::mount::MountFlags::RDONLY, "").unwrap();
        let refused = launch(&work, "etc/app.conf").expect_err("the disk is read-only");
        assert_eq!(refused.kind, FailureKind::Permission, "{refused}");
        assert!(!refused.retryable());
        // Missing: the machine's disk made in a directory that is not there.
        let missing = ensure_layer(&dir.join("gone/m2"), &templates, 32)
            .map_err(|e| LaunchError::io(LaunchStep::Layer, "making the machine's disk", &e))
            .expect_err("no machine directory");
        assert_eq!(missing.kind, FailureKind::NotFound, "{missing}");
        release(&machine).unwrap();
        assert_eq!(loops_below(&dir), 0);
    }
}
