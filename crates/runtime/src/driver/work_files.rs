//! A process machine's `config.files`, checked and decoded for its shim to write.

/// A process machine's `config.files`: each written before every start at its `guest_path`
/// taken relative to the work directory (`/etc/app.conf` → `$BAZAAR_WORK_DIR/etc/app.conf`;
/// the work directory is also `HOME` and the workload's cwd). An error says which file is
/// wrong.
pub fn work_files(
    config: &bazaar_types::config::MachineConfig,
) -> Result<Vec<bazaar_shim::WorkFile>, String> {
    Ok(bazaar_admission::decode_files(config)?
        .into_iter()
        .map(|f| bazaar_shim::WorkFile {
            path: f.path.into(),
            contents: f.contents,
            mode: f.mode,
        })
        .collect())
}
