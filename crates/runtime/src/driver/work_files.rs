//! A process machine's `config.files`, checked and decoded for its shim to write.

/// A process machine's `config.files`: each written before every start at its `guest_path`
/// taken relative to the work directory (`/etc/app.conf` → `$BAZAAR_WORK_DIR/etc/app.conf`;
/// the work directory is also `HOME` and the workload's cwd). An error says which file is
/// wrong.
pub fn work_files(
    config: &bazaar_types::config::MachineConfig,
) -> Result<Vec<bazaar_shim::WorkFile>, String> {
    use base64::Engine;
    config
        .files
        .iter()
        .map(|f| {
            let relative = f.guest_path.trim_start_matches('/');
            if !f.guest_path.starts_with('/')
                || relative.is_empty()
                || relative.split('/').any(|c| c.is_empty() || c == "." || c == "..")
            {
                return Err(format!(
                    "config.files: guest_path {:?} must be an absolute path to a file, without . or ..",
                    f.guest_path
                ));
            }
            let Some(raw) = &f.raw_value else {
                return Err(format!(
                    "config.files {}: raw_value (base64) is required",
                    f.guest_path
                ));
            };
            let contents = base64::engine::general_purpose::STANDARD
                .decode(raw)
                .map_err(|e| format!("config.files {}: raw_value is not base64: {e}", f.guest_path))?;
            Ok(bazaar_shim::WorkFile {
                path: relative.into(),
                contents,
                mode: f.mode.unwrap_or(0o644) & 0o7777,
            })
        })
        .collect()
}
