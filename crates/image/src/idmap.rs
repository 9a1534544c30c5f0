//! Id mappings for machines in a user namespace: a machine's ids `0..count` are the host's
//! `host_base..host_base + count`. The shared layer directories stay owned by the host's
//! ids and are seen through idmapped mounts (`mount_setattr(MOUNT_ATTR_IDMAP)`), so one
//! unpacked layer serves every machine whatever its range.
//!
//! The kernel takes the mapping from a user namespace: [`IdMap::user_namespace`] makes one
//! with a short-lived child process. This module holds the crate's only `unsafe` code
//! (`clone` and `mount_setattr`, which rustix does not wrap).

use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

/// Machine ids `0..count` are host ids `host_base..host_base + count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdMap {
    pub host_base: u32,
    pub count: u32,
}

/// `struct mount_attr` of `mount_setattr(2)`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

impl IdMap {
    /// The host id of machine id `id` (ids past the range stay where they are: the kernel
    /// shows them as the overflow id inside).
    pub fn to_host(&self, id: u32) -> u32 {
        if id < self.count {
            self.host_base + id
        } else {
            id
        }
    }

    /// The host id `id` shifted into this range: ids of another machine's range (ranges
    /// are aligned to their size) or plain ids below `count` land on the same machine id
    /// here.
    pub fn shift_from_host(&self, id: u32) -> u32 {
        self.to_host(id % self.count.max(1))
    }

    /// The `uid_map`/`gid_map` line of this mapping.
    fn map_line(&self) -> String {
        format!("0 {} {}\n", self.host_base, self.count)
    }

    /// A user namespace with this mapping (for idmapped mounts).
    pub fn user_namespace(&self) -> io::Result<OwnedFd> {
        self.namespaces(0).map(|(user, _)| user)
    }

    /// A user namespace with this mapping and a network namespace it owns (a machine's:
    /// the processes `runc exec` adds join the user namespace first, and then may join
    /// only a network namespace it owns).
    pub fn user_and_network_namespaces(&self) -> io::Result<(OwnedFd, OwnedFd)> {
        let (user, net) = self.namespaces(libc::CLONE_NEWNET)?;
        Ok((user, net.expect("asked for")))
    }

    /// A child process is made in a new user namespace (and the namespaces of `also`),
    /// its maps are written, its namespaces opened, and it is killed. The child shares this
    /// process's memory (`CLONE_VM`, on a stack of its own): copying the page tables of a
    /// large agent, and the copy-on-write faults that follow in all its threads, cost more
    /// than the namespaces themselves.
    fn namespaces(&self, also: libc::c_int) -> io::Result<(OwnedFd, Option<OwnedFd>)> {
        // SAFETY: getpid takes nothing.
        let parent = unsafe { libc::getpid() };
        let mut stack = vec![0u128; HOLDER_STACK / std::mem::size_of::<u128>()];
        // SAFETY: the child runs `hold_namespaces` on `stack` (16-byte aligned, its top
        // passed, as the stack grows down), which stays allocated until the child has been
        // reaped below; `hold_namespaces` makes only raw system calls (no locks, no
        // allocation), so sharing the memory of this multi-threaded process is sound.
        let pid = unsafe {
            libc::clone(
                hold_namespaces,
                stack.as_mut_ptr().add(stack.len()).cast(),
                libc::CLONE_VM | libc::CLONE_NEWUSER | also | libc::SIGCHLD,
                parent as usize as *mut libc::c_void,
            )
        };
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        let pid = pid as libc::pid_t;
        let result = (|| {
            fs::write(format!("/proc/{pid}/uid_map"), self.map_line())?;
            fs::write(format!("/proc/{pid}/gid_map"), self.map_line())?;
            let open = |ns: &str| -> io::Result<OwnedFd> {
                Ok(OwnedFd::from(fs::File::open(format!(
                    "/proc/{pid}/ns/{ns}"
                ))?))
            };
            let net = if also & libc::CLONE_NEWNET != 0 {
                Some(open("net")?)
            } else {
                None
            };
            Ok((open("user")?, net))
        })();
        // SAFETY: kill and waitpid take plain integers; the child is ours and unreaped.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            // Reaped before `stack` is freed.
            while libc::waitpid(pid, std::ptr::null_mut(), 0) < 0
                && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
            {}
        }
        result
    }
}

/// Stack size of the namespace holder (it makes a few system calls and waits).
const HOLDER_STACK: usize = 16 * 1024;

/// The body of the child that holds new namespaces until it is killed: it holds none of
/// its parent's file descriptors (a listening socket kept open by it would keep a restarted
/// agent from its port) and dies with its parent (`arg` is the parent's pid).
extern "C" fn hold_namespaces(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: these calls take plain integers, succeed (no errno written to the parent
    // thread's TLS, which the child shares) or never return (the child is killed in pause).
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32);
        if libc::getppid() != arg as usize as libc::pid_t {
            libc::_exit(0);
        }
        libc::pause();
        libc::_exit(0)
    }
}

/// Makes the detached mount `mount` (from `open_tree(OPEN_TREE_CLONE)`) show its files
/// with the ids of `userns` shifted as that namespace maps them.
pub(crate) fn idmap_mount(mount: BorrowedFd<'_>, userns: BorrowedFd<'_>) -> io::Result<()> {
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    // SAFETY: the kernel reads `size_of::<MountAttr>()` bytes from `attr`, which lives
    // until the call returns; the path is a NUL-terminated literal.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            mount.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A detached copy of the mount at `path`, idmapped through `userns`.
pub(crate) fn idmapped_clone(
    path: &std::path::Path,
    userns: BorrowedFd<'_>,
) -> io::Result<OwnedFd> {
    use rustix::mount::{open_tree, OpenTreeFlags};
    let fd = open_tree(
        rustix::fs::CWD,
        path,
        OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
    )?;
    idmap_mount(fd.as_fd(), userns)?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_shift_into_the_range() {
        let m = IdMap {
            host_base: 1 << 20,
            count: 65536,
        };
        assert_eq!(m.to_host(0), 1 << 20);
        assert_eq!(m.to_host(1000), (1 << 20) + 1000);
        assert_eq!(m.to_host(70_000), 70_000);
        assert_eq!(m.shift_from_host(0), 1 << 20);
        assert_eq!(m.shift_from_host((1 << 20) + 65536 + 5), (1 << 20) + 5);
        assert_eq!(m.map_line(), "0 1048576 65536\n");
    }
}
