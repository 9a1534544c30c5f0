//! A host's small disk: an ext4 image, loop-mounted as the host's data dir, that
//! `fill-disk` fills to the last block (ENOSPC) and `free-disk` empties again; and
//! unmounting and detaching everything a lab mounted below its directory.

use crate::net::run;
use anyhow::Context;
use std::io::Write;
use std::path::Path;

/// Size of a small disk.
pub const SMALL_DISK_MIB: u64 = 64;
/// The file `fill-disk` writes into a host's data dir.
pub const FILLER: &str = "lab-filler";

/// Makes an ext4 file system of `SMALL_DISK_MIB` in `image` and mounts it at `mountpoint`.
pub fn mount_small_disk(image: &Path, mountpoint: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(mountpoint)?;
    let f =
        std::fs::File::create(image).with_context(|| format!("creating {}", image.display()))?;
    f.set_len(SMALL_DISK_MIB << 20)?;
    drop(f);
    let image_s = image.display().to_string();
    // No blocks reserved for root: the agent runs as root, and full must mean full.
    run("mkfs.ext4", &["-q", "-F", "-m", "0", &image_s], "")?;
    run(
        "mount",
        &["-o", "loop", &image_s, &mountpoint.display().to_string()],
        "",
    )?;
    Ok(())
}

/// True if `path` is a mount point.
pub fn is_mounted(path: &Path) -> bool {
    let target = path.display().to_string();
    mount_targets().contains(&target)
}

/// Writes a filler file into `dir` until the file system is full; answers how many bytes
/// it took.
pub fn fill(dir: &Path) -> anyhow::Result<u64> {
    let path = dir.join(FILLER);
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    let block = vec![0xa5u8; 1 << 20];
    let mut written = 0u64;
    loop {
        match f.write(&block) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => return Err(e).with_context(|| format!("writing {}", path.display())),
        }
    }
    // The last partial blocks: byte by byte would be slow; halve until nothing fits.
    let mut size = block.len() / 2;
    while size > 0 {
        match f.write(&block[..size]) {
            Ok(n) if n > 0 => written += n as u64,
            _ => size /= 2,
        }
    }
    let _ = f.sync_all();
    Ok(written)
}

/// Removes the filler file (no error if there is none).
pub fn free(dir: &Path) -> anyhow::Result<()> {
    match std::fs::remove_file(dir.join(FILLER)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
        _ => Ok(()),
    }
}

fn mount_targets() -> Vec<String> {
    std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(1))
        .map(|t| t.replace("\\040", " "))
        .collect()
}

/// Mount points at or below `dir`, deepest first.
pub fn mounts_under(dir: &Path) -> Vec<String> {
    let root = dir.display().to_string();
    let prefix = format!("{root}/");
    let mut targets: Vec<String> = mount_targets()
        .into_iter()
        .filter(|t| *t == root || t.starts_with(&prefix))
        .collect();
    targets.sort_by_key(|t| std::cmp::Reverse(t.len()));
    targets.dedup();
    targets
}

/// Loop devices whose backing file is below `dir`.
pub fn loops_under(dir: &Path) -> Vec<String> {
    let prefix = format!("{}/", dir.display());
    let Ok(out) = run(
        "losetup",
        &["-n", "--raw", "-O", "NAME,BACK-FILE", "-l"],
        "",
    ) else {
        return Vec::new();
    };
    out.lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(_, file)| file.trim().starts_with(&prefix))
        .map(|(dev, _)| dev.to_string())
        .collect()
}

/// Copies of mounts below `dir` in other mount namespaces: `(a process in that namespace,
/// mount points deepest first)`. Any process that unshares its mount namespace while a
/// lab's disk is mounted (a workload of another agent, `ip netns exec`) gets a private copy
/// that keeps the loop device busy after the lab unmounts its own.
fn copies_elsewhere(dir: &Path) -> Vec<(u32, Vec<String>)> {
    use std::collections::HashMap;
    let own = std::fs::read_link("/proc/self/ns/mnt").ok();
    let prefix = format!("{}/", dir.display());
    let mut by_ns: HashMap<std::path::PathBuf, (u32, Vec<String>)> = HashMap::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(ns) = std::fs::read_link(format!("/proc/{pid}/ns/mnt")) else {
            continue;
        };
        if Some(&ns) == own.as_ref() || by_ns.contains_key(&ns) {
            continue;
        }
        let Ok(info) = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")) else {
            continue;
        };
        let mut targets: Vec<String> = info
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .map(|t| t.replace("\\040", " "))
            .filter(|t| t.starts_with(&prefix))
            .collect();
        if !targets.is_empty() {
            targets.sort_by_key(|t| std::cmp::Reverse(t.len()));
            by_ns.insert(ns, (pid, targets));
        }
    }
    by_ns.into_values().collect()
}

/// Lazily unmounts the copies of mounts below `dir` in other mount namespaces: what a
/// process there has open stays valid. A process that ended meanwhile took its copy along.
fn unmount_copies(dir: &Path) -> Vec<String> {
    let mut errors = Vec::new();
    for (pid, targets) in copies_elsewhere(dir) {
        let ns = std::path::PathBuf::from(format!("/proc/{pid}/ns/mnt"));
        for target in targets {
            if let Err(e) = crate::procs::umount_in_namespace(&ns, &target) {
                let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
                errors.push(format!(
                    "in the mount namespace of {pid} ({}): {e:#}",
                    cmd.trim()
                ));
            }
        }
    }
    errors
}

/// Unmounts everything below `dir` (here and the copies in other mount namespaces) and
/// detaches the loop devices of images below it.
pub fn unmount_under(dir: &Path) -> anyhow::Result<()> {
    for target in mounts_under(dir) {
        if run("umount", &[&target], "").is_err() {
            run("umount", &["-l", &target], "")?;
        }
    }
    // The kernel detaches an auto-clearing loop device after its last user is gone; a
    // namespace may copy the mounts again until then: unmount the copies until it is.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut errors;
    loop {
        errors = unmount_copies(dir);
        for dev in loops_under(dir) {
            let _ = run("losetup", &["-d", &dev], "");
        }
        if loops_under(dir).is_empty() || std::time::Instant::now() > deadline {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let left: Vec<String> = mounts_under(dir)
        .into_iter()
        .chain(loops_under(dir))
        .collect();
    let holders: Vec<String> = copies_elsewhere(dir)
        .into_iter()
        .map(|(pid, _)| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            format!(
                "{pid} ({})",
                String::from_utf8_lossy(&cmd).replace('\0', " ").trim()
            )
        })
        .collect();
    anyhow::ensure!(
        left.is_empty(),
        "still mounted or attached: {left:?}; copies held by {holders:?}; {}",
        errors.join("; ")
    );
    Ok(())
}
