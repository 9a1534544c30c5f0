//! Which executable runs the agent's shims: the small `bazaar-shim` beside the agent when it
//! is of this very version, else the agent's own executable (`bazaar shim RUN_DIR`).

/// The executable to run shims with for an agent running `agent_exe`: `bazaar-shim` in the
/// same directory when it is there and of this very version (`bazaar_shim::version_line`: a
/// stale one left by an older install could misread the spec), else `agent_exe` itself,
/// which answers `shim RUN_DIR` too. The small executable starts in half the time and
/// memory of the whole `bazaar` (see `bazaar_shim`'s Cost). Asked once, at start.
pub fn shim_executable(agent_exe: &std::path::Path) -> std::path::PathBuf {
    let sibling = agent_exe.with_file_name("bazaar-shim");
    if !sibling.is_file() {
        return agent_exe.to_path_buf();
    }
    let answer = std::process::Command::new(&sibling)
        .arg("--version")
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output();
    let expected = bazaar_shim::version_line();
    match answer {
        Ok(out) if out.status.success() && out.stdout.trim_ascii() == expected.as_bytes() => {
            sibling
        }
        Ok(out) => {
            tracing::warn!(
                shim = %sibling.display(),
                answered = %String::from_utf8_lossy(out.stdout.trim_ascii()),
                %expected,
                "the bazaar-shim beside the agent is of another version: shims run from the agent's own executable"
            );
            agent_exe.to_path_buf()
        }
        Err(err) => {
            tracing::warn!(shim = %sibling.display(), error = %err, "bazaar-shim did not run: shims run from the agent's own executable");
            agent_exe.to_path_buf()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::shim_executable;
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    fn script(path: &Path, body: &str) {
        std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn shims_run_from_bazaar_shim_beside_the_agent_only_when_it_is_of_this_version() {
        let dir = tempfile::tempdir().unwrap();
        let agent = dir.path().join("bazaar");
        script(&agent, "exit 0");
        let sibling = dir.path().join("bazaar-shim");
        // None beside it: the agent's own executable.
        assert_eq!(shim_executable(&agent), agent);
        // Another version (an older install left it): not used.
        script(&sibling, "echo 'bazaar-shim 0.0.1 spec 0'");
        assert_eq!(shim_executable(&agent), agent);
        // One that fails: not used.
        script(&sibling, "exit 3");
        assert_eq!(shim_executable(&agent), agent);
        // This very version: used.
        let line = bazaar_shim::version_line();
        script(&sibling, &format!("echo '{line}'"));
        assert_eq!(shim_executable(&agent), sibling);
    }
}
