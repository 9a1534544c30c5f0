//! The Debian package (issue 37 item 1): `scripts/package` makes it from the binaries the
//! suite built; installed on this machine it puts the files in place and its unit passes
//! `systemd-analyze verify`; removed, it leaves only its configuration (a conffile) and the
//! data dir, and purged only the data dir. The test removes what it installed, even when
//! it fails, and leaves alone a machine where bazaar is installed already.

use crate::common;

use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

const DATA_DIR: &str = "/var/lib/bazaar";
const FILES: [&str; 6] = [
    "/usr/bin/bazaar",
    "/usr/bin/bazaar-shim",
    "/lib/systemd/system/bazaar-agent.service",
    "/etc/bazaar/agent.toml",
    "/usr/share/doc/bazaar/INSTALL.md",
    "/usr/share/doc/bazaar/copyright",
];

/// Runs `program args`; its stdout and stderr together, and whether it succeeded.
fn run(program: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn installed() -> bool {
    run("dpkg", &["-s", "bazaar"]).0
}

/// Purges the package and removes the (empty) data dir it made, when dropped.
struct Uninstall;

impl Drop for Uninstall {
    fn drop(&mut self) {
        if installed() {
            let _ = run("dpkg", &["--purge", "bazaar"]);
        }
        let _ = std::fs::remove_dir(DATA_DIR);
    }
}

#[test]
fn the_package_installs_its_files_verifies_its_unit_and_removes_cleanly() {
    let tools = ["dpkg-deb", "systemd-analyze", "objcopy"]
        .iter()
        .all(|t| run("sh", &["-c", &format!("command -v {t}")]).0);
    if !bazaar_testkit::can_run(is_root() && tools, "root, dpkg, systemd-analyze, binutils") {
        return;
    }
    if installed() || Path::new("/etc/bazaar").exists() || Path::new(DATA_DIR).exists() {
        eprintln!("skipped: bazaar is installed (or was) on this machine; it is left alone");
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let bin_dir = Path::new(EXE).parent().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/package");
    let (ok, said) = run(
        script.to_str().unwrap(),
        &[
            "--profile",
            "dev",
            "--bin-dir",
            bin_dir.to_str().unwrap(),
            "--out",
            out.path().to_str().unwrap(),
        ],
    );
    assert!(ok, "{said}");
    let deb = said.lines().last().unwrap().trim().to_string();
    assert!(deb.ends_with(".deb") && Path::new(&deb).is_file(), "{said}");
    let (_, fields) = run("dpkg-deb", &["-f", &deb, "Depends"]);
    for dep in ["runc", "nftables", "iproute2", "e2fsprogs"] {
        assert!(fields.contains(dep), "{fields}");
    }

    let _uninstall = Uninstall;
    let (ok, said) = run("dpkg", &["-i", &deb]);
    assert!(ok, "{said}");
    for file in FILES {
        assert!(Path::new(file).is_file(), "{file} is not installed");
    }
    for exe in ["/usr/bin/bazaar", "/usr/bin/bazaar-shim"] {
        let mode = std::fs::metadata(exe).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755, "{exe}");
        let (ok, said) = run(exe, &["--version"]);
        assert!(ok && said.contains(env!("CARGO_PKG_VERSION")), "{said}");
    }
    let data = std::fs::metadata(DATA_DIR).unwrap();
    assert!(data.is_dir());
    assert_eq!(data.permissions().mode() & 0o777, 0o700);
    // `verify` exits 0 on a misspelt key too, with a warning: nothing may be said.
    let (ok, said) = run(
        "systemd-analyze",
        &["verify", "/lib/systemd/system/bazaar-agent.service"],
    );
    assert!(ok && said.trim().is_empty(), "{said}");
    let unit = std::fs::read_to_string("/lib/systemd/system/bazaar-agent.service").unwrap();
    for line in [
        "ExecStart=/usr/bin/bazaar agent --config /etc/bazaar/agent.toml",
        "Restart=on-failure",
        "KillMode=process",
        "Delegate=yes",
        "LimitNOFILE=1048576",
    ] {
        assert!(unit.lines().any(|l| l == line), "{line} not in the unit");
    }

    // Removed: the configuration (a conffile) and the data dir stay, nothing else.
    let (ok, said) = run("dpkg", &["--remove", "bazaar"]);
    assert!(ok, "{said}");
    for file in FILES.iter().filter(|f| **f != "/etc/bazaar/agent.toml") {
        assert!(!Path::new(file).exists(), "{file} is left after removal");
    }
    assert!(!Path::new("/usr/share/doc/bazaar").exists());
    assert!(Path::new("/etc/bazaar/agent.toml").is_file());
    assert!(Path::new(DATA_DIR).is_dir());
    // Purged: only the data dir.
    let (ok, said) = run("dpkg", &["--purge", "bazaar"]);
    assert!(ok, "{said}");
    assert!(!Path::new("/etc/bazaar").exists());
    assert!(Path::new(DATA_DIR).is_dir());
}
