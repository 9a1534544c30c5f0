//! `bazaar host backup` and `bazaar host restore`, on the host itself (root): a host's
//! store, copied consistently while its agent runs, with the files that make it the same
//! host, and the cluster CA's directory on the CA's host, in one archive
//! (`bazaar_agent::backup`).

use anyhow::Context;
use std::path::{Path, PathBuf};

/// Flags of `bazaar host backup`.
#[derive(Debug, clap::Args)]
pub struct BackupArgs {
    /// The host's data dir (its agent's --data-dir).
    #[arg(long)]
    data_dir: PathBuf,
    /// The archive to write (a gzipped tar, 0600).
    #[arg(long)]
    out: PathBuf,
    /// The cluster CA's directory (`bazaar cluster init --dir`), on the CA's host: its
    /// key, the host ids it issued and its revocations go in the archive too.
    #[arg(long)]
    ca_dir: Option<PathBuf>,
}

/// Flags of `bazaar host restore`.
#[derive(Debug, clap::Args)]
pub struct RestoreArgs {
    /// The archive `bazaar host backup` wrote.
    archive: PathBuf,
    /// The host's data dir; its agent must be stopped.
    #[arg(long)]
    data_dir: PathBuf,
    /// Where the cluster CA's directory goes, when the archive holds it.
    #[arg(long)]
    ca_dir: Option<PathBuf>,
}

/// `bazaar host backup`: the store copied by the running agent (over its host interface:
/// `conn`, or its host listener with its own certificate when no cluster secret is given),
/// or by this command when the agent is stopped.
pub async fn backup(
    conn: &crate::operator::OperatorConn,
    args: BackupArgs,
    json: bool,
) -> anyhow::Result<()> {
    let data_dir = &args.data_dir;
    anyhow::ensure!(
        data_dir.join("agent.redb").is_file(),
        "{} holds no agent store (agent.redb): not a host's data dir",
        data_dir.display()
    );
    let copy = if bazaar_agent::backup::store_in_use(data_dir) {
        let mut conn = conn.clone();
        if conn.cluster_secret.is_none() && conn.host_data_dir.is_none() {
            conn.host_data_dir = Some(data_dir.clone());
        }
        let answer = conn
            .client()?
            .copy_store()
            .await
            .context("asking the running agent for a copy of its store")?;
        let expected = data_dir.join(bazaar_agent::backup::STORE_COPY);
        let said = answer["path"].as_str().map(PathBuf::from);
        anyhow::ensure!(
            said.as_deref().and_then(|p| p.canonicalize().ok()) == expected.canonicalize().ok(),
            "the agent reached ({}) copied its store to {said:?}, not into {}: it is not the \
             agent of this data dir",
            answer["host_id"],
            data_dir.display()
        );
        expected
    } else {
        bazaar_agent::backup::snapshot_stopped(data_dir)?
    };
    let written =
        bazaar_agent::backup::write_archive(data_dir, &copy, args.ca_dir.as_deref(), &args.out);
    let _ = std::fs::remove_file(&copy);
    let contents = written?;
    report(json, "backed up", &args.out, &contents)
}

/// `bazaar host restore`.
pub fn restore(args: RestoreArgs, json: bool) -> anyhow::Result<()> {
    let contents =
        bazaar_agent::backup::restore(&args.archive, &args.data_dir, args.ca_dir.as_deref())?;
    report(json, "restored", &args.archive, &contents)
}

fn report(
    json: bool,
    what: &str,
    archive: &Path,
    contents: &bazaar_agent::backup::Contents,
) -> anyhow::Result<()> {
    if json {
        return crate::host_cmd::print_sorted_json(contents);
    }
    println!(
        "{what} {}: {}{}",
        archive.display(),
        contents.data.join(", "),
        if contents.ca.is_empty() {
            String::new()
        } else {
            format!("; the CA's {}", contents.ca.join(", "))
        }
    );
    Ok(())
}
