//! Work disks made ahead (issue 36): the first start of a sandboxed process machine needs
//! its own ext4 work disk ([`crate::work_disk`]), as an image machine's its writable layer
//! disk (the same file system, mounted on `layer`), and making one (a sparse copy of the
//! template, a loop device, the first `mount(2)` of a cold device) took 5-15 ms of that
//! start. The pool makes them before they are asked for, on a thread at a lower CPU
//! priority than launches: the copy, its `fsync`, the loop device and the file system,
//! mounted *nowhere* (`fsopen`/`fsmount`: a detached mount, held by a descriptor), in a
//! directory shaped like a machine's (`disk.img`, its marks, an empty `work`). A launch that
//! finds one of its size renames that directory into the machine's (or, when the machine's
//! directory exists already, the image and its marks into it) and moves the mount onto its
//! work directory (`move_mount(2)`): a few system calls, no blocking thread, and on the
//! host's file system one rename instead of five new entries.
//!
//! How many are kept, per size ([`Demand`]): as many as machines of that size first started
//! in the last 10 s, at least 2 and at most 16, while that size was asked for in the last
//! 10 minutes; none of a size nobody asked for. A launch that finds none makes its own disk
//! as before, and wakes the filler.
//!
//! Nothing is left on the host: a disk made ahead lives in a descriptor of the agent's and
//! an image in `DATA/disk-pool`; when the agent goes (even by `kill -9`) the kernel
//! unmounts what the descriptors held and the loop devices detach themselves (autoclear);
//! the images are removed when the pool is made again (the next agent start) or with the
//! data directory.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::work_disk::{self, LAYER, WORK};

/// Disks of a size kept ahead: at least this many while the size is in demand.
pub const POOL_MIN: usize = 2;
/// And at most this many (each holds a loop device and a mounted file system).
pub const POOL_MAX: usize = 16;
/// First starts within this window size the pool.
const DEMAND_WINDOW: Duration = Duration::from_secs(10);
/// A size nobody asked for within this long is no longer kept.
const KEEP_FOR: Duration = Duration::from_secs(600);

/// The demand for disks of one size: when they were asked for (pure; the clock is given).
#[derive(Debug, Default)]
pub struct Demand {
    /// First starts within the last [`DEMAND_WINDOW`] (at most [`POOL_MAX`] kept).
    recent: VecDeque<Instant>,
    /// The last one.
    last: Option<Instant>,
}

impl Demand {
    /// Counts a disk of this size asked for at `now`.
    pub fn ask(&mut self, now: Instant) {
        while self
            .recent
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) > DEMAND_WINDOW)
        {
            self.recent.pop_front();
        }
        if self.recent.len() == POOL_MAX {
            self.recent.pop_front();
        }
        self.recent.push_back(now);
        self.last = Some(now);
    }

    /// How many disks of this size to keep ready at `now`.
    pub fn wanted(&self, now: Instant) -> usize {
        match self.last {
            Some(last) if now.saturating_duration_since(last) <= KEEP_FOR => self
                .recent
                .iter()
                .filter(|t| now.saturating_duration_since(**t) <= DEMAND_WINDOW)
                .count()
                .clamp(POOL_MIN, POOL_MAX),
            _ => 0,
        }
    }
}

/// A disk made ahead: a directory of the pool shaped like a machine's (the image, marked
/// formatted and synced, and an empty `work`), its file system mounted nowhere. Dropped
/// untaken, its mount goes with the descriptor and its directory is removed.
struct Ready {
    dir: PathBuf,
    mount: Option<OwnedFd>,
}

impl Drop for Ready {
    fn drop(&mut self) {
        drop(self.mount.take());
        // Gone already once taken (renamed into a machine's directory, or emptied into it).
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[derive(Default)]
struct Size {
    demand: Demand,
    ready: Vec<Ready>,
}

/// The work disks made ahead on this host (see the module's doc).
pub struct DiskPool {
    /// `DATA/disk-pool`: the images of the disks made ahead.
    dir: PathBuf,
    /// `DATA/disk-templates`: the empty file systems they are copied from.
    templates: PathBuf,
    sizes: Mutex<HashMap<u64, Size>>,
    /// Set while a thread fills the pool.
    filling: AtomicBool,
    /// Names the next image.
    next: AtomicU64,
}

impl std::fmt::Debug for DiskPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskPool")
            .field("dir", &self.dir)
            .field("ready", &self.ready())
            .finish()
    }
}

impl DiskPool {
    /// The pool of the agent whose data directory is `data_dir` (empty; the images a
    /// previous agent left there are removed: their mounts went with it).
    pub fn new(data_dir: &Path) -> Arc<DiskPool> {
        let dir = data_dir.join("disk-pool");
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                tracing::warn!(error = %e, dir = %dir.display(), "removing the disks a previous agent made ahead");
            }
            _ => {}
        }
        Arc::new(DiskPool {
            dir,
            templates: data_dir.join("disk-templates"),
            sizes: Mutex::default(),
            filling: AtomicBool::new(false),
            next: AtomicU64::new(0),
        })
    }

    fn sizes(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Size>> {
        self.sizes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many disks are ready, by size (MB).
    pub fn ready(&self) -> Vec<(u64, usize)> {
        let mut ready: Vec<_> = self
            .sizes()
            .iter()
            .map(|(mb, s)| (*mb, s.ready.len()))
            .collect();
        ready.sort();
        ready
    }

    /// Makes machine `machine_dir`'s work disk of `size_mb` from one made ahead, if there
    /// is one and the machine has none yet (its first start): the image renamed into the
    /// machine's directory, marked formatted and synced, and its file system moved onto
    /// the work directory. `Ok(false)`: nothing done, the caller makes the disk
    /// ([`work_disk::ensure`]). An error leaves what the caller's `ensure` completes (the
    /// image in place and marked, or nothing). A first start counts as demand for its size
    /// and wakes the filler, whether it found a disk or not.
    pub fn install(self: &Arc<Self>, machine_dir: &Path, size_mb: u64) -> io::Result<bool> {
        let formatted = machine_dir.join(WORK.formatted);
        let work = machine_dir.join(WORK.mount);
        let fresh = !machine_dir.exists();
        if !fresh
            && (formatted.exists()
                || std::fs::read_dir(&work).is_ok_and(|mut d| d.next().is_some()))
        {
            return Ok(false);
        }
        let Some(mut disk) = self.take(size_mb) else {
            return Ok(false);
        };
        if fresh {
            // The machine's directory is the disk's: one rename.
            if let Some(machines) = machine_dir.parent() {
                std::fs::create_dir_all(machines)?;
            }
            std::fs::rename(&disk.dir, machine_dir)?;
        } else {
            std::fs::rename(disk.dir.join(WORK.image), machine_dir.join(WORK.image))?;
            std::fs::write(&formatted, b"")?;
            std::fs::create_dir_all(&work)?;
        }
        let mount = disk.mount.take().expect("a disk made ahead is mounted");
        rustix::mount::move_mount(
            &mount,
            "",
            rustix::fs::CWD,
            &work,
            rustix::mount::MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
        )?;
        if !fresh {
            // Its copy was synced before it was offered.
            std::fs::write(machine_dir.join(WORK.synced), b"")?;
        }
        Ok(true)
    }

    /// Makes image machine `machine_dir`'s writable layer disk of `size_mb`
    /// ([`work_disk::ensure_layer`]) from one made ahead, if there is one and the machine
    /// has no layer disk yet (its first start): the image, its mark and its empty
    /// directory renamed into the machine's, and its file system moved onto the layer
    /// directory. `Ok(false)`: nothing done, the caller makes the disk. An error leaves what
    /// the caller's `ensure_layer` completes. Counts as demand for its size, as
    /// [`DiskPool::install`].
    pub fn install_layer(self: &Arc<Self>, machine_dir: &Path, size_mb: u64) -> io::Result<bool> {
        let formatted = machine_dir.join(LAYER.formatted);
        let layer = machine_dir.join(LAYER.mount);
        if formatted.exists() || std::fs::read_dir(&layer).is_ok_and(|mut d| d.next().is_some()) {
            return Ok(false);
        }
        let Some(mut disk) = self.take(size_mb) else {
            return Ok(false);
        };
        std::fs::create_dir_all(machine_dir)?;
        std::fs::rename(disk.dir.join(WORK.image), machine_dir.join(LAYER.image))?;
        std::fs::rename(disk.dir.join(WORK.formatted), &formatted)?;
        // Onto an empty layer directory, if the machine has one.
        std::fs::rename(disk.dir.join(WORK.mount), &layer)?;
        let mount = disk.mount.take().expect("a disk made ahead is mounted");
        rustix::mount::move_mount(
            &mount,
            "",
            rustix::fs::CWD,
            &layer,
            rustix::mount::MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
        )?;
        Ok(true)
    }

    /// A disk of `size_mb` made ahead, if one is ready; counts the demand and wakes the
    /// filler either way.
    fn take(self: &Arc<Self>, size_mb: u64) -> Option<Ready> {
        let taken = {
            let mut sizes = self.sizes();
            let size = sizes.entry(size_mb).or_default();
            size.demand.ask(Instant::now());
            size.ready.pop()
        };
        self.fill_in_background();
        taken
    }

    /// Fills the pool on a blocking thread, unless one does already (outside a tokio
    /// runtime: on the calling thread).
    pub fn fill_in_background(self: &Arc<Self>) {
        if self.filling.swap(true, Ordering::AcqRel) {
            return;
        }
        let pool = Arc::clone(self);
        let fill = move || {
            pool.fill();
            pool.filling.store(false, Ordering::Release);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(fill)),
            Err(_) => fill(),
        }
    }

    /// Makes disks until every size in demand has as many ready as it wants, and lets go of
    /// those no longer wanted, at a lower CPU priority than launches. Errors are logged
    /// (the next launch of that size makes its own disk and calls again).
    pub fn fill(&self) {
        let _yielding = crate::network::threads::LowPriority::this_thread();
        loop {
            let now = Instant::now();
            let (next, unwanted) = {
                let mut sizes = self.sizes();
                let mut unwanted = Vec::new();
                for size in sizes.values_mut() {
                    let wanted = size.demand.wanted(now);
                    while size.ready.len() > wanted {
                        unwanted.extend(size.ready.pop());
                    }
                }
                let next = sizes
                    .iter()
                    .filter(|(_, s)| s.ready.len() < s.demand.wanted(now))
                    .map(|(mb, _)| *mb)
                    .min();
                (next, unwanted)
            };
            drop(unwanted);
            let Some(mb) = next else {
                return;
            };
            match self.make(mb) {
                Ok(disk) => self.sizes().entry(mb).or_default().ready.push(disk),
                Err(err) => {
                    tracing::warn!(size_mb = mb, error = %err, "making a work disk ahead");
                    return;
                }
            }
        }
    }

    /// One disk of `size_mb`: copied from its template, synced, marked formatted and
    /// synced, attached and mounted nowhere, its `lost+found` removed (the workload's
    /// directory starts empty).
    fn make(&self, size_mb: u64) -> io::Result<Ready> {
        let template = work_disk::template(&self.templates, size_mb)?;
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let mut disk = Ready {
            dir: self.dir.join(n.to_string()),
            mount: None,
        };
        std::fs::create_dir_all(disk.dir.join(WORK.mount))?;
        let image = disk.dir.join(WORK.image);
        work_disk::sparse_copy(&template, &image)?;
        std::fs::File::open(&image)?.sync_all()?;
        std::fs::write(disk.dir.join(WORK.formatted), b"")?;
        std::fs::write(disk.dir.join(WORK.synced), b"")?;
        disk.mount = Some(mount_nowhere(&image)?);
        Ok(disk)
    }
}

/// Attaches `image` to a loop device (autoclear) and mounts its ext4 `nosuid,nodev`
/// without a place in any mount tree: the returned descriptor holds it, and it goes with
/// the descriptor unless moved somewhere first.
fn mount_nowhere(image: &Path) -> io::Result<OwnedFd> {
    use rustix::mount::{
        fsconfig_create, fsconfig_set_flag, fsconfig_set_string, fsmount, fsopen, FsMountFlags,
        FsOpenFlags, MountAttrFlags,
    };
    let (device, _held_until_mounted) = work_disk::attach_loop(image)?;
    let fs = fsopen("ext4", FsOpenFlags::FSOPEN_CLOEXEC)?;
    fsconfig_set_string(&fs, "source", device.as_str())?;
    fsconfig_set_flag(&fs, "noinit_itable")?;
    fsconfig_create(&fs)?;
    let mount = fsmount(
        &fs,
        FsMountFlags::FSMOUNT_CLOEXEC,
        MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NODEV,
    )?;
    match rustix::fs::unlinkat(&mount, "lost+found", rustix::fs::AtFlags::REMOVEDIR) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(mount),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests;
