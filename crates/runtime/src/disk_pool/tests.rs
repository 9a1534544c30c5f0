use super::*;
use crate::work_disk::tests::{attached_below, loops_below, write_64_mb, Released};

#[test]
fn a_size_is_kept_ahead_as_recent_first_starts_ask_and_dropped_when_nobody_does() {
    let t0 = Instant::now();
    let mut demand = Demand::default();
    assert_eq!(demand.wanted(t0), 0, "never asked: none kept");
    demand.ask(t0);
    assert_eq!(demand.wanted(t0), POOL_MIN);
    for i in 1..5 {
        demand.ask(t0 + Duration::from_millis(i * 100));
    }
    let burst = t0 + Duration::from_secs(1);
    assert_eq!(
        demand.wanted(burst),
        5,
        "as many as were asked in the window"
    );
    for i in 0..40 {
        demand.ask(burst + Duration::from_millis(i));
    }
    assert_eq!(demand.wanted(burst + Duration::from_secs(1)), POOL_MAX);
    let quiet = burst + DEMAND_WINDOW + Duration::from_secs(2);
    assert_eq!(
        demand.wanted(quiet),
        POOL_MIN,
        "a quiet size keeps its minimum"
    );
    assert_eq!(
        demand.wanted(burst + KEEP_FOR + Duration::from_secs(1)),
        0,
        "a size nobody asked for in 10 minutes is let go"
    );
}

fn can_mount() -> bool {
    rustix::process::geteuid().is_root() && Path::new("/dev/loop-control").exists()
}

/// The pool of `data`, filled with `n` disks of `mb` (asked for by `n` first starts).
fn filled(data: &Path, mb: u64, n: usize) -> Arc<DiskPool> {
    let pool = DiskPool::new(data);
    for i in 0..n {
        let m = data.join(format!("asker{i}"));
        std::fs::create_dir_all(&m).unwrap();
        assert!(!pool.install(&m, mb).unwrap(), "nothing made yet");
    }
    // Filled by the first start that found none (without a runtime, on its thread).
    pool
}

#[test]
fn a_first_start_takes_a_disk_made_ahead_that_holds_its_size_and_leaves_nothing() {
    if !can_mount() {
        return; // loop devices and mounts need root
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().canonicalize().unwrap();
    let pool = filled(&data, 32, 1);
    assert_eq!(pool.ready(), vec![(32, POOL_MIN)]);
    assert_eq!(attached_below(&data.join("disk-pool")), POOL_MIN);

    let machine = data.join("machines/m1");
    std::fs::create_dir_all(&machine).unwrap();
    let _released = Released(&machine);
    assert!(pool.install(&machine, 32).unwrap());
    // The one taken is made again (here at once: without a runtime, the filler runs on
    // the caller's thread).
    assert_eq!(pool.ready(), vec![(32, POOL_MIN)]);
    // The machine's disk, as one made at its start is: mounted, empty, marked formatted
    // and synced (its copy was synced before it was offered), and it stops writes at its size.
    let work = machine.join("work");
    assert!(crate::work_disk::ensure(&machine, &data.join("disk-templates"), 32).unwrap());
    assert_eq!(
        std::fs::read_dir(&work).unwrap().count(),
        0,
        "no lost+found"
    );
    assert!(machine.join("disk.formatted").exists() && machine.join("disk.synced").exists());
    let err = write_64_mb(&work.join("big"));
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    // Its second start mounts its own image again, with what it wrote; the pool is not asked.
    crate::work_disk::release(&machine).unwrap();
    assert!(!pool.install(&machine, 32).unwrap());
    assert!(crate::work_disk::ensure(&machine, &data.join("disk-templates"), 32).unwrap());
    assert!(work.join("big").exists());
    crate::work_disk::release(&machine).unwrap();
    assert_eq!(loops_below(&machine), 0);

    // What was never taken goes with the pool: no loop device, no image.
    drop(pool);
    assert_eq!(loops_below(&data), 0);
    assert_eq!(
        std::fs::read_dir(data.join("disk-pool")).unwrap().count(),
        0,
        "images removed"
    );
}

#[test]
fn a_machine_that_has_a_disk_or_files_from_before_limits_is_given_none() {
    if !can_mount() {
        return; // loop devices and mounts need root
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().canonicalize().unwrap();
    let pool = filled(&data, 32, 1);
    // Files on the host's file system, from before limits: left as they are.
    let old = data.join("machines/old");
    std::fs::create_dir_all(old.join("work")).unwrap();
    std::fs::write(old.join("work/kept"), b"data").unwrap();
    assert!(!pool.install(&old, 32).unwrap());
    assert!(!old.join("disk.img").exists());
    assert_eq!(pool.ready(), vec![(32, POOL_MIN)]);
    // A size nobody asked for: none ready, the launch makes its own.
    let other = data.join("machines/other");
    std::fs::create_dir_all(&other).unwrap();
    assert!(!pool.install(&other, 64).unwrap());
    drop(pool);
    assert_eq!(loops_below(&data), 0);
}

#[test]
fn a_machine_without_a_directory_gets_the_disks_whole_and_a_new_pool_starts_empty() {
    if !can_mount() {
        return; // loop devices and mounts need root
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().canonicalize().unwrap();
    let pool = filled(&data, 32, 1);
    // A first start before anything made the machine's directory: the disk's directory
    // becomes it, with its marks and its file system on `work`.
    let machine = data.join("machines/fresh");
    let _released = Released(&machine);
    assert!(pool.install(&machine, 32).unwrap());
    for name in ["disk.img", "disk.formatted", "disk.synced"] {
        assert!(machine.join(name).exists(), "{name}");
    }
    let work = machine.join("work");
    assert!(crate::work_disk::ensure(&machine, &data.join("disk-templates"), 32).unwrap());
    assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0);
    std::fs::write(work.join("kept"), b"data").unwrap();
    crate::work_disk::release(&machine).unwrap();
    assert!(
        !work.join("kept").exists(),
        "it was the mounted disk that held it"
    );
    assert!(crate::work_disk::ensure(&machine, &data.join("disk-templates"), 32).unwrap());
    assert!(work.join("kept").exists());
    crate::work_disk::release(&machine).unwrap();
    // A killed agent's disks went with its descriptors; what it left in the pool's
    // directory is removed when the next one starts.
    drop(pool);
    assert_eq!(loops_below(&data), 0);
    std::fs::create_dir_all(data.join("disk-pool/7/work")).unwrap();
    std::fs::write(data.join("disk-pool/7/disk.img"), b"left").unwrap();
    let again = DiskPool::new(&data);
    assert!(!data.join("disk-pool").exists(), "a new pool starts empty");
    assert!(again.ready().is_empty());
}

#[test]
fn an_image_machines_first_start_takes_a_disk_made_ahead_as_its_layer() {
    if !can_mount() {
        return; // loop devices and mounts need root
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().canonicalize().unwrap();
    let pool = filled(&data, 32, 1);
    // An image machine's directory holds its run directory before its layer is made.
    let machine = data.join("machines/img");
    std::fs::create_dir_all(machine.join("runs/1")).unwrap();
    let _released = Released(&machine);
    assert!(pool.install_layer(&machine, 32).unwrap());
    for name in ["layer.img", "layer.formatted"] {
        assert!(machine.join(name).exists(), "{name}");
    }
    assert!(!machine.join("disk.img").exists() && !machine.join("work").exists());
    // The layer is the machine's own disk: mounted (ensure_layer finds it so), empty, and
    // it stops writes at its size.
    let layer = machine.join("layer");
    assert!(crate::work_disk::ensure_layer(&machine, &data.join("disk-templates"), 32).unwrap());
    assert_eq!(std::fs::read_dir(&layer).unwrap().count(), 0);
    let err = write_64_mb(&layer.join("big"));
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    // Its next starts keep that disk: the pool is not asked again.
    std::fs::remove_file(layer.join("big")).unwrap();
    assert!(!pool.install_layer(&machine, 32).unwrap());
    crate::work_disk::release(&machine).unwrap();
    assert_eq!(loops_below(&machine), 0);
    drop(pool);
    assert_eq!(loops_below(&data), 0);
}
