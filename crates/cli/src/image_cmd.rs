//! `bazaar image ...`: the images of one host (the agent at `BAZAAR_API_URL`), through its
//! host interface (`/host/v1/images`, with the cluster secret `BAZAAR_CLUSTER_SECRET` over
//! HTTPS or to loopback, or with `--host-data-dir` over its host listener: `operator.rs`):
//! list, pull with progress, import an archive made by `docker save` (or an OCI layout tar)
//! for hosts without registry access, and prune.

use crate::host_cmd::print_sorted_json;
use crate::operator::OperatorConn;
use anyhow::{anyhow, bail, Context};
use bazaar_client::{ClientError, HostClient};
use bazaar_types::host::PullLine;
use comfy_table::Table;
use std::path::PathBuf;

/// `bazaar image`.
#[derive(Debug, clap::Args)]
pub struct ImageArgs {
    #[command(flatten)]
    conn: OperatorConn,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: ImageCommand,
}

#[derive(Debug, clap::Subcommand)]
enum ImageCommand {
    /// List the images this host has.
    List,
    /// Pull an image (e.g. `127.0.0.1:5000/web:1`) into this host's store, showing progress.
    Pull { image: String },
    /// Load a `docker save` or OCI-layout archive into this host's store.
    Import { file: PathBuf },
    /// Forget every image no machine of this host uses and free their layers.
    Prune,
    /// Push a `docker save` or OCI-layout archive into the cluster's registry as
    /// `NAME[:TAG]` (`<app>` or `<app>/<path>`), through the agent at `--api-url` with an API
    /// token of the app; machines run it as `registry.bazaar.internal/NAME@DIGEST`.
    Push {
        file: PathBuf,
        name: String,
        /// A Machines API token that may update the app.
        #[arg(long, env = "BAZAAR_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
}

/// Runs `bazaar image`.
pub async fn image(a: ImageArgs) -> anyhow::Result<()> {
    if let ImageCommand::Push { file, name, token } = &a.command {
        let token = token
            .as_deref()
            .context("no token: set BAZAAR_TOKEN or pass --token (an API token of the app)")?;
        let pushed = crate::image_push::push(&a.conn.api_url, token, file, name).await?;
        println!("pushed {pushed}");
        return Ok(());
    }
    let host = a.conn.client()?;
    let json = a.json;
    match a.command {
        ImageCommand::List => {
            let images = host.images().await.map_err(refused)?;
            if json {
                return print_sorted_json(&images);
            }
            let mut t = Table::new();
            t.set_header(["REFERENCE", "DIGEST", "LAYERS", "SIZE"]);
            for i in &images {
                t.add_row([
                    i.reference.clone(),
                    i.digest.chars().take(19).collect(),
                    i.layers.to_string(),
                    mib(i.size),
                ]);
            }
            println!("{t}");
        }
        ImageCommand::Pull { image } => pull(&host, &image, json).await?,
        ImageCommand::Import { file } => {
            let f = tokio::fs::File::open(&file)
                .await
                .with_context(|| format!("opening {}", file.display()))?;
            let images = host
                .import_images(reqwest::Body::from(f))
                .await
                .map_err(refused)?;
            if json {
                return print_sorted_json(&images);
            }
            for i in &images {
                println!("imported {} ({})", i.reference, i.digest);
            }
        }
        ImageCommand::Push { .. } => unreachable!("pushed above"),
        ImageCommand::Prune => {
            let report = host.prune_images().await.map_err(refused)?;
            if json {
                return print_sorted_json(&report);
            }
            println!(
                "removed {} image(s), {} layer(s), {} freed",
                report.images.len(),
                report.layers,
                mib(report.bytes)
            );
        }
    }
    Ok(())
}

/// A refusal as the other commands word it: the host's message, then the status.
fn refused(e: ClientError) -> anyhow::Error {
    match e {
        ClientError::Status {
            status, message, ..
        } => anyhow!("{message} ({status})"),
        other => other.into(),
    }
}

/// Streams the pull's progress lines: a bar per layer on a terminal, plain lines
/// otherwise (the lines as sent with `--json`).
async fn pull(host: &HostClient, image: &str, json: bool) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    let mut progress = host.pull_image(image).await.map_err(refused)?;
    let bars = indicatif::MultiProgress::new();
    let mut layer_bars: Vec<indicatif::ProgressBar> = Vec::new();
    let fancy = !json && std::io::stderr().is_terminal();
    while let Some((raw, line)) = progress.next().await? {
        if json {
            print!("{raw}");
            continue;
        }
        let p = match line {
            PullLine::Failed { error } => bail!("{error}"),
            PullLine::Pulled { image: i } => {
                for b in &layer_bars {
                    b.finish();
                }
                println!(
                    "pulled {} ({}, {} layer(s), {})",
                    i.reference,
                    i.digest,
                    i.layers,
                    mib(i.size)
                );
                continue;
            }
            PullLine::Layer(p) => p,
        };
        let (n, of) = (p.layer, p.of);
        if fancy {
            while layer_bars.len() < of as usize {
                let b = bars.add(indicatif::ProgressBar::new(0));
                b.set_style(
                    indicatif::ProgressStyle::with_template(
                        "layer {prefix} {bar:30} {bytes}/{total_bytes} {msg}",
                    )
                    .expect("template"),
                );
                b.set_prefix(format!("{}/{of}", layer_bars.len() + 1));
                layer_bars.push(b);
            }
            let b = &layer_bars[(n as usize).saturating_sub(1)];
            b.set_length(p.total);
            b.set_position(p.done);
            b.set_message(p.phase);
        } else {
            eprintln!(
                "layer {n}/{of} {} {}/{}",
                p.phase,
                mib(p.done),
                mib(p.total)
            );
        }
    }
    Ok(())
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}
