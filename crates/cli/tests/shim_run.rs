//! End-to-end tests of the per-machine shim (`bazaar shim RUN_DIR`) through the agent-side
//! `bazaar_shim::ShimHandle`, driving the real `bazaar` binary.
//!
//! Tests that need root (isolation, cgroups, user switching) skip themselves otherwise, and
//! fail instead when `BAZAAR_TESTS_REQUIRE_ROOT` is set (CI: `bazaar_testkit::can_run`).

use crate::common;

use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::is_root;

use bazaar_shim::{
    read_exit, remove_cgroup, ExitRecord, FailureKind, ShimError, ShimHandle, ShimSpec,
};

/// Upper bound for anything in these tests to happen; they normally take milliseconds.
const PATIENCE: Duration = Duration::from_secs(10);

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_bazaar"))
}

/// A scratch directory that the workload user (nobody) can traverse.
fn scratch() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

fn spec(dir: &Path, argv: &[&str]) -> ShimSpec {
    ShimSpec {
        machine_id: "m-test".into(),
        run_id: 7,
        argv: argv.iter().map(|s| s.to_string()).collect(),
        env: vec![("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into())],
        workdir: dir.join("work"),
        // As root, stay root unless a test says otherwise (the default would be nobody).
        user: is_root().then(|| "root".into()),
        hostname: "m-test".into(),
        isolate: false,
        memory_mb: 0,
        cpus: 0.0,
        cgroup: None,
        log_path: dir.join("logs/m-test.log"),
        log_max_bytes: 1 << 20,
        sandbox: None,
        cgroup_layout: None,
        signal_argv: None,
    }
}

/// A cgroup name unique to this test process.
fn cgroup_name(test: &str) -> String {
    format!("bazaar-test-{}-{test}", std::process::id())
}

/// True while `pid` exists and is not a zombie (an orphaned workload stays a zombie until
/// the host's init reaps it).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .next();
            !matches!(state, Some("Z" | "X"))
        }
        Err(_) => false,
    }
}

async fn bounded<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// Waits for the run to end and returns its exit record.
async fn finish(handle: &ShimHandle) -> ExitRecord {
    bounded("shim exit", handle.wait()).await;
    read_exit(handle.run_dir()).expect("exit.json after the shim exited")
}

/// `(stream, line)` pairs of a machine log.
fn log_lines(path: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            assert!(v["ts"].as_u64().unwrap() > 0);
            (
                v["stream"].as_str().unwrap().to_owned(),
                v["line"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn stdout_lines(path: &Path) -> Vec<String> {
    log_lines(path)
        .into_iter()
        .filter(|(s, _)| s == "stdout")
        .map(|(_, l)| l)
        .collect()
}

fn run_dir(dir: &Path) -> PathBuf {
    dir.join("run")
}

#[tokio::test]
async fn sigterm_stops_the_workload_and_releases_the_lock() {
    let dir = scratch();
    let handle = ShimHandle::spawn(
        exe(),
        &run_dir(dir.path()),
        &spec(dir.path(), &["sleep", "1000"]),
    )
    .await
    .unwrap();
    assert!(
        alive(handle.workload_pid()),
        "workload {} not running",
        handle.workload_pid()
    );
    assert!(alive(handle.shim_pid()));
    assert_eq!(handle.run_id(), 7);
    assert!(!handle.has_exited());
    assert!(read_exit(handle.run_dir()).is_none());

    handle.signal(libc::SIGTERM).unwrap();
    let exit = finish(&handle).await;
    assert_eq!(
        (exit.run_id, exit.exit_code, exit.signal),
        (7, None, Some(libc::SIGTERM))
    );
    assert!(!exit.oom_killed && exit.error.is_none() && exit.exited_at_ms > 0);
    assert!(!alive(handle.workload_pid()));
    // wait() is repeatable, and the lock is free: nothing to adopt.
    bounded("second wait", handle.wait()).await;
    assert!(ShimHandle::adopt(handle.run_dir()).unwrap().is_none());
    assert!(matches!(
        handle.signal(libc::SIGTERM),
        Err(ShimError::NotRunning)
    ));
}

#[tokio::test]
async fn exit_code_and_output_are_recorded() {
    let dir = scratch();
    let argv = ["sh", "-c", "echo hi; echo err >&2; printf partial; exit 3"];
    let spec = spec(dir.path(), &argv);
    let handle = ShimHandle::spawn(exe(), &run_dir(dir.path()), &spec)
        .await
        .unwrap();
    let exit = finish(&handle).await;
    assert_eq!(
        (exit.exit_code, exit.signal, exit.error),
        (Some(3), None, None)
    );
    let lines = log_lines(&spec.log_path);
    let has = |stream: &str, line: &str| lines.iter().any(|(s, l)| s == stream && l == line);
    assert!(
        has("stdout", "hi") && has("stderr", "err") && has("stdout", "partial"),
        "{lines:?}"
    );

    // The same machine log is appended to by the next run.
    let spec2 = ShimSpec {
        run_id: 8,
        argv: vec!["echo".into(), "again".into()],
        ..spec.clone()
    };
    let handle = ShimHandle::spawn(exe(), &run_dir(dir.path()), &spec2)
        .await
        .unwrap();
    let exit = finish(&handle).await;
    assert_eq!((exit.run_id, exit.exit_code), (8, Some(0)));
    assert_eq!(stdout_lines(&spec.log_path), ["hi", "partial", "again"]);
}

#[tokio::test]
async fn launch_failures_are_reported() {
    let dir = scratch();
    let rd = run_dir(dir.path());
    let err = ShimHandle::spawn(exe(), &rd, &spec(dir.path(), &["no-such-command-xyz"]))
        .await
        .unwrap_err();
    // Each failure says its kind: what is missing, what is refused, what is misconfigured.
    assert_eq!(err.kind(), FailureKind::NotFound, "{err:?}");
    let ShimError::Launch(msg) = err else {
        panic!("{err:?}")
    };
    assert_eq!(msg, "command not found: no-such-command-xyz");
    let exit = read_exit(&rd).unwrap();
    assert_eq!(exit.error.as_deref(), Some(msg.as_str()));
    assert_eq!((exit.exit_code, exit.signal), (None, None));

    let script = dir.path().join("not-executable.sh");
    std::fs::write(&script, "#!/bin/sh\n").unwrap();
    let err = ShimHandle::spawn(exe(), &rd, &spec(dir.path(), &[script.to_str().unwrap()]))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ShimError::Launch(m) if m.starts_with("permission denied")),
        "{err:?}"
    );
    assert_eq!(err.kind(), FailureKind::Permission, "{err:?}");

    let mut bad_user = spec(dir.path(), &["true"]);
    bad_user.user = Some("no-such-user-xyz".into());
    let err = ShimHandle::spawn(exe(), &rd, &bad_user).await.unwrap_err();
    assert!(
        matches!(&err, ShimError::Launch(m) if m == "unknown user: no-such-user-xyz"),
        "{err:?}"
    );
    assert_eq!(err.kind(), FailureKind::Config, "{err:?}");

    let mut bad_workdir = spec(dir.path(), &["true"]);
    bad_workdir.workdir = script.clone();
    let err = ShimHandle::spawn(exe(), &rd, &bad_workdir)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ShimError::Launch(m) if m.contains("not a directory")),
        "{err:?}"
    );
    assert_eq!(err.kind(), FailureKind::Config, "{err:?}");

    let err = ShimHandle::spawn(exe(), &rd, &spec(dir.path(), &[]))
        .await
        .unwrap_err();
    assert!(matches!(err, ShimError::Spec(_)), "{err:?}");
    assert_eq!(err.kind(), FailureKind::Config);
}

#[tokio::test]
async fn killing_the_shim_kills_the_workload() {
    let dir = scratch();
    for isolate in [false, true] {
        if isolate && !bazaar_testkit::can_run(is_root(), "root (isolation)") {
            continue;
        }
        let rd = dir.path().join(format!("run-{isolate}"));
        let spec = ShimSpec {
            isolate,
            ..spec(dir.path(), &["sleep", "1000"])
        };
        let handle = ShimHandle::spawn(exe(), &rd, &spec).await.unwrap();
        let workload = handle.workload_pid();
        assert!(alive(workload));
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(handle.shim_pid(), libc::SIGKILL) };
        assert!(
            bazaar_testkit::holds_within(Duration::from_secs(2), || !alive(workload)).await,
            "isolate={isolate}"
        );
        bounded("shim exit", handle.wait()).await;
        assert!(read_exit(&rd).is_none(), "a killed shim records nothing");
    }
}

#[tokio::test]
async fn sigterm_to_the_shim_is_forwarded() {
    let dir = scratch();
    let handle = ShimHandle::spawn(
        exe(),
        &run_dir(dir.path()),
        &spec(dir.path(), &["sleep", "1000"]),
    )
    .await
    .unwrap();
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(handle.shim_pid(), libc::SIGTERM) };
    let exit = finish(&handle).await;
    assert_eq!(exit.signal, Some(libc::SIGTERM));
}

#[tokio::test]
async fn leftover_background_processes_are_killed() {
    let dir = scratch();
    let spec = spec(dir.path(), &["sh", "-c", "sleep 1000 & echo $!"]);
    let handle = ShimHandle::spawn(exe(), &run_dir(dir.path()), &spec)
        .await
        .unwrap();
    let exit = finish(&handle).await;
    assert_eq!(exit.exit_code, Some(0));
    let pid: i32 = stdout_lines(&spec.log_path)[0].parse().unwrap();
    assert!(
        bazaar_testkit::holds_within(Duration::from_secs(2), || !alive(pid)).await,
        "background sleep {pid} survived"
    );
}

#[tokio::test]
async fn isolated_runs_get_their_own_namespaces_and_user() {
    if !bazaar_testkit::can_run(is_root(), "root") {
        return;
    }
    let dir = scratch();
    let script = "echo pid=$$; id -u; id -g; hostname; ls /proc | grep -c '^[0-9]'; pwd";
    let spec = ShimSpec {
        isolate: true,
        user: None, // nobody
        hostname: "iso-host".into(),
        ..spec(dir.path(), &["sh", "-c", script])
    };
    let handle = ShimHandle::spawn(exe(), &run_dir(dir.path()), &spec)
        .await
        .unwrap();
    assert!(handle.init_pid().is_some());
    let exit = finish(&handle).await;
    assert_eq!(exit.exit_code, Some(0), "{:?}", log_lines(&spec.log_path));
    let out = stdout_lines(&spec.log_path);
    let nprocs: usize = out[4].parse().unwrap();
    // pid 1 is the init; the shell is 2; `ls` and `grep` are the only others.
    assert_eq!(&out[..4], ["pid=2", "65534", "65534", "iso-host"]);
    assert!(nprocs <= 4, "{out:?}");
    assert_eq!(out[5], spec.workdir.to_str().unwrap());
    let meta = std::fs::metadata(&spec.workdir).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), 65534);
}

#[tokio::test]
async fn isolated_workloads_get_forwarded_signals() {
    if !bazaar_testkit::can_run(is_root(), "root") {
        return;
    }
    let dir = scratch();
    let spec = ShimSpec {
        isolate: true,
        ..spec(dir.path(), &["sleep", "1000"])
    };
    let handle = ShimHandle::spawn(exe(), &run_dir(dir.path()), &spec)
        .await
        .unwrap();
    let (init, workload) = (handle.init_pid().unwrap(), handle.workload_pid());
    assert!(alive(init) && alive(workload) && init != workload);
    // `sleep` as pid 1 would ignore SIGTERM; under the init it dies of it.
    handle.signal(libc::SIGTERM).unwrap();
    let exit = finish(&handle).await;
    assert_eq!((exit.exit_code, exit.signal), (None, Some(libc::SIGTERM)));
    assert!(!alive(init) && !alive(workload));
}

#[tokio::test]
async fn oom_kills_are_detected_and_contained() {
    if !bazaar_testkit::can_run(
        bazaar_shim::cgroups_available() && Path::new("/usr/bin/python3").exists(),
        "root, cgroups and python3",
    ) {
        return;
    }
    let dir = scratch();
    let hog_argv = [
        "/usr/bin/python3",
        "-c",
        "b = b'x' * (200 * 1024 * 1024); import time; time.sleep(5)",
    ];
    let sibling_cg = cgroup_name("oom-sibling");
    let sibling = ShimSpec {
        memory_mb: 32,
        cgroup: Some(sibling_cg.clone()),
        ..spec(dir.path(), &["sleep", "1000"])
    };
    let sibling = ShimHandle::spawn(exe(), &dir.path().join("run-sibling"), &sibling)
        .await
        .unwrap();
    // Directly supervised, and under the init of an isolated run (which must survive it).
    for isolate in [false, true] {
        let cg = cgroup_name(&format!("oom-{isolate}"));
        let hog = ShimSpec {
            memory_mb: 32,
            isolate,
            cgroup: Some(cg.clone()),
            ..spec(dir.path(), &hog_argv)
        };
        let hog = ShimHandle::spawn(exe(), &dir.path().join(format!("run-hog-{isolate}")), &hog)
            .await
            .unwrap();
        let exit = finish(&hog).await;
        assert!(exit.oom_killed, "isolate={isolate}: {exit:?}");
        assert_eq!(exit.signal, Some(libc::SIGKILL), "isolate={isolate}");
        assert!(
            !Path::new("/sys/fs/cgroup/memory").join(&cg).exists(),
            "shim left cgroup {cg}"
        );
        remove_cgroup(&cg).unwrap();
    }
    assert!(alive(sibling.workload_pid()) && !sibling.has_exited());

    sibling.kill().unwrap();
    let exit = finish(&sibling).await;
    assert_eq!((exit.signal, exit.oom_killed), (Some(libc::SIGKILL), false));
    remove_cgroup(&sibling_cg).unwrap();
}

#[tokio::test]
async fn cgroup_limits_are_applied() {
    if !bazaar_testkit::can_run(bazaar_shim::cgroups_available(), "root and cgroups") {
        return;
    }
    let dir = scratch();
    let cg = cgroup_name("limits");
    let spec = ShimSpec {
        memory_mb: 64,
        cpus: 0.5,
        cgroup: Some(cg.clone()),
        ..spec(dir.path(), &["sleep", "1000"])
    };
    let handle = ShimHandle::spawn(exe(), &run_dir(dir.path()), &spec)
        .await
        .unwrap();
    let cgroups_of = |pid: i32| std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(cgroups_of(handle.workload_pid()).contains(&format!("/{cg}\n")));
    // The shim itself stays out of the cgroup it creates, so an OOM kill never hits it.
    assert!(!cgroups_of(handle.shim_pid()).contains(&cg));
    let read =
        |path: PathBuf| std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let root = Path::new("/sys/fs/cgroup");
    let v1_memory = root.join("memory").join(&cg);
    if v1_memory.exists() {
        assert_eq!(
            read(v1_memory.join("memory.limit_in_bytes")).trim(),
            (64u64 << 20).to_string()
        );
        assert_eq!(
            read(root.join("cpu").join(&cg).join("cpu.cfs_quota_us")).trim(),
            "50000"
        );
        assert_eq!(
            read(root.join("cpu").join(&cg).join("cpu.cfs_period_us")).trim(),
            "100000"
        );
    } else {
        assert_eq!(
            read(root.join(&cg).join("memory.max")).trim(),
            (64u64 << 20).to_string()
        );
        assert_eq!(read(root.join(&cg).join("cpu.max")).trim(), "50000 100000");
    }
    handle.kill().unwrap();
    let exit = finish(&handle).await;
    assert_eq!(exit.signal, Some(libc::SIGKILL));
    assert!(
        !v1_memory.exists() && !root.join(&cg).exists(),
        "the shim removes its cgroup"
    );
    remove_cgroup(&cg).unwrap();
}

#[tokio::test]
async fn adopt_reattaches_to_a_live_shim() {
    let dir = scratch();
    let rd = run_dir(dir.path());
    assert!(
        ShimHandle::adopt(&rd).unwrap().is_none(),
        "nothing to adopt yet"
    );
    let spawned = ShimHandle::spawn(exe(), &rd, &spec(dir.path(), &["sleep", "1000"]))
        .await
        .unwrap();
    let (shim_pid, workload_pid) = (spawned.shim_pid(), spawned.workload_pid());
    drop(spawned);

    let adopted = ShimHandle::adopt(&rd).unwrap().expect("a live shim");
    assert_eq!(
        (adopted.shim_pid(), adopted.workload_pid(), adopted.run_id()),
        (shim_pid, workload_pid, 7)
    );
    // A second spawn into a live run directory is refused.
    let again = ShimHandle::spawn(exe(), &rd, &spec(dir.path(), &["true"])).await;
    assert!(matches!(again, Err(ShimError::Busy(_))), "{again:?}");

    adopted.kill().unwrap();
    let exit = finish(&adopted).await;
    assert_eq!(exit.signal, Some(libc::SIGKILL));
    assert!(ShimHandle::adopt(&rd).unwrap().is_none());
}

#[tokio::test]
async fn freeze_and_thaw() {
    if !bazaar_testkit::can_run(bazaar_shim::cgroups_available(), "root and cgroups") {
        return;
    }
    let dir = scratch();
    let cg = cgroup_name("freeze");
    let frozen_spec = ShimSpec {
        cgroup: Some(cg.clone()),
        isolate: true,
        ..spec(dir.path(), &["sleep", "1000"])
    };
    let handle = ShimHandle::spawn(exe(), &run_dir(dir.path()), &frozen_spec)
        .await
        .unwrap();
    let (v1_state, v2_events) = (
        Path::new("/sys/fs/cgroup/freezer")
            .join(&cg)
            .join("freezer.state"),
        Path::new("/sys/fs/cgroup").join(&cg).join("cgroup.events"),
    );
    // `None` once the cgroup is gone (the run ended and the shim removed it).
    let frozen = || match std::fs::read_to_string(&v1_state) {
        Ok(state) => Some(state.trim() == "FROZEN"),
        Err(_) => std::fs::read_to_string(&v2_events)
            .ok()
            .map(|events| events.lines().any(|l| l == "frozen 1")),
    };
    handle.freeze().unwrap();
    assert_eq!(frozen(), Some(true));
    // A frozen run does not act on signals until thawed.
    handle.signal(libc::SIGTERM).unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!handle.has_exited());
    handle.thaw().unwrap();
    assert_ne!(frozen(), Some(true));
    let exit = finish(&handle).await;
    assert_eq!(exit.signal, Some(libc::SIGTERM));

    let dir2 = scratch();
    let plain = ShimHandle::spawn(
        exe(),
        &run_dir(dir2.path()),
        &spec(dir2.path(), &["sleep", "1000"]),
    )
    .await
    .unwrap();
    assert!(matches!(plain.freeze(), Err(ShimError::NoCgroup)));
    plain.kill().unwrap();
    finish(&plain).await;
}

/// A run whose runtime does not forward signals (gVisor's `runsc run`): the agent's signal
/// goes to the shim, which delivers it with the spec's command; the workload itself is not
/// signalled, so it keeps running until the command acts.
#[tokio::test]
async fn signals_go_through_the_specs_command_when_it_has_one() {
    let dir = scratch();
    let delivered = dir.path().join("delivered");
    let spec = ShimSpec {
        signal_argv: Some(vec![
            "sh".into(),
            "-c".into(),
            format!(
                "echo {} >> {}",
                bazaar_shim::SIGNAL_PLACEHOLDER,
                delivered.display()
            ),
        ]),
        ..spec(dir.path(), &["sleep", "1000"])
    };
    let handle = ShimHandle::spawn(exe(), &run_dir(dir.path()), &spec)
        .await
        .unwrap();
    handle.signal(libc::SIGINT).unwrap();
    handle.signal(libc::SIGTERM).unwrap();
    let got = bazaar_testkit::eventually(PATIENCE, || async {
        std::fs::read_to_string(&delivered)
            .ok()
            .filter(|s| s.lines().count() == 2)
    })
    .await
    .expect("the command delivered both signals");
    assert_eq!(got, "2\n15\n");
    assert!(!handle.has_exited(), "the workload was signalled directly");
    handle.kill().unwrap();
    assert_eq!(finish(&handle).await.signal, Some(libc::SIGKILL));
}

/// A kill reaches processes in a cgroup below the one killed that froze itself (cgroup v1;
/// as a machine's below its host's when the host is released, suspended or with its shim
/// killed while it froze it): thawing the killed cgroup alone would leave them frozen with
/// SIGKILL pending, for good (a gVisor sandbox was found so).
#[tokio::test]
async fn a_kill_reaches_a_cgroup_frozen_below_the_run() {
    let freezer = Path::new("/sys/fs/cgroup/freezer");
    if !bazaar_testkit::can_run(bazaar_shim::cgroups_available(), "root and cgroups")
        || !freezer.join("cgroup.procs").exists()
    {
        return;
    }
    let dir = scratch();
    let cg = cgroup_name("frozen-below");
    let below = freezer.join(&cg).join("below");
    // The workload moves itself into a cgroup below the run's and freezes it.
    let script = format!(
        "mkdir {b} && echo $$ > {b}/cgroup.procs && echo FROZEN > {b}/freezer.state; sleep 1000",
        b = below.display()
    );
    let spec = ShimSpec {
        cgroup: Some(cg.clone()),
        ..spec(dir.path(), &["sh", "-c", &script])
    };
    let handle = ShimHandle::spawn(exe(), &run_dir(dir.path()), &spec)
        .await
        .unwrap();
    bazaar_testkit::eventually(PATIENCE, || async {
        let state = std::fs::read_to_string(below.join("freezer.state")).ok()?;
        (state.trim() == "FROZEN").then_some(())
    })
    .await
    .expect("the cgroup below froze");
    handle.kill().unwrap();
    assert_eq!(finish(&handle).await.signal, Some(libc::SIGKILL));
    // The shim removed its cgroup, the one below included.
    assert!(!freezer.join(&cg).exists());
}
