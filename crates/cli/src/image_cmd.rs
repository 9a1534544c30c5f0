//! `bazaar image ...`: the images of one host (the agent at `BAZAAR_API_URL`), through its
//! host interface (`/host/v1/images`, with the cluster secret `BAZAAR_CLUSTER_SECRET`):
//! list, pull with progress, import an archive made by `docker save` (or an OCI layout tar)
//! for hosts without registry access, and prune.

use crate::api_cmd::{answer, Conn};
use anyhow::{bail, Context};
use comfy_table::Table;
use reqwest::Method;
use serde_json::{json, Value};
use std::path::PathBuf;

/// `bazaar image`.
#[derive(Debug, clap::Args)]
pub struct ImageArgs {
    #[command(flatten)]
    conn: Conn,
    /// The cluster secret (`bazaar dev` writes it to .bazaar-dev/dev.env; an agent keeps
    /// it in DATA_DIR/cluster-secret).
    #[arg(
        long,
        env = "BAZAAR_CLUSTER_SECRET",
        hide_env_values = true,
        global = true
    )]
    cluster_secret: Option<String>,
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
}

/// Runs `bazaar image`.
pub async fn image(a: ImageArgs) -> anyhow::Result<()> {
    let c = &a
        .conn
        .with_token(crate::host_cmd::require_secret(a.cluster_secret)?);
    match a.command {
        ImageCommand::List => {
            let v = answer(c.request(Method::GET, "/host/v1/images")?.send().await?).await?;
            if c.json() {
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
            }
            let mut t = Table::new();
            t.set_header(["REFERENCE", "DIGEST", "LAYERS", "SIZE"]);
            for i in v.as_array().into_iter().flatten() {
                t.add_row([
                    text(&i["reference"]),
                    text(&i["digest"]).chars().take(19).collect(),
                    i["layers"].to_string(),
                    mib(i["size"].as_u64().unwrap_or(0)),
                ]);
            }
            println!("{t}");
        }
        ImageCommand::Pull { image } => pull(c, &image).await?,
        ImageCommand::Import { file } => {
            let f = tokio::fs::File::open(&file)
                .await
                .with_context(|| format!("opening {}", file.display()))?;
            let resp = c
                .request(Method::POST, "/host/v1/images/import")?
                .header("content-type", "application/x-tar")
                .body(reqwest::Body::from(f))
                .send()
                .await?;
            let v = answer(resp).await?;
            if c.json() {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                for i in v.as_array().into_iter().flatten() {
                    println!(
                        "imported {} ({})",
                        text(&i["reference"]),
                        text(&i["digest"])
                    );
                }
            }
        }
        ImageCommand::Prune => {
            let v = answer(
                c.request(Method::POST, "/host/v1/images/prune")?
                    .json(&json!({}))
                    .send()
                    .await?,
            )
            .await?;
            if c.json() {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!(
                    "removed {} image(s), {} layer(s), {} freed",
                    v["images"].as_array().map_or(0, Vec::len),
                    v["layers"],
                    mib(v["bytes"].as_u64().unwrap_or(0))
                );
            }
        }
    }
    Ok(())
}

/// Streams the pull's progress lines: a bar per layer on a terminal, plain lines
/// otherwise (JSON lines with `--json`).
async fn pull(c: &Conn, image: &str) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    let mut resp = c
        .request(Method::POST, "/host/v1/images/pull")?
        .json(&json!({"image": image}))
        .send()
        .await?;
    if !resp.status().is_success() {
        answer(resp).await?;
        return Ok(());
    }
    let bars = indicatif::MultiProgress::new();
    let mut layer_bars: Vec<indicatif::ProgressBar> = Vec::new();
    let fancy = !c.json() && std::io::stderr().is_terminal();
    let mut buf = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        buf.extend_from_slice(&chunk);
        while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            let v: Value = serde_json::from_slice(&line).unwrap_or(Value::Null);
            if c.json() {
                print!("{}", String::from_utf8_lossy(&line));
                continue;
            }
            if let Some(err) = v["error"].as_str() {
                bail!("{err}");
            }
            if let Some(i) = v.get("image") {
                for b in &layer_bars {
                    b.finish();
                }
                println!(
                    "pulled {} ({}, {} layer(s), {})",
                    text(&i["reference"]),
                    text(&i["digest"]),
                    i["layers"],
                    mib(i["size"].as_u64().unwrap_or(0))
                );
                continue;
            }
            let (n, of) = (
                v["layer"].as_u64().unwrap_or(1),
                v["of"].as_u64().unwrap_or(1),
            );
            let phase = text(&v["phase"]);
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
                b.set_length(v["total"].as_u64().unwrap_or(0));
                b.set_position(v["done"].as_u64().unwrap_or(0));
                b.set_message(phase);
            } else {
                eprintln!(
                    "layer {n}/{of} {phase} {}/{}",
                    mib(v["done"].as_u64().unwrap_or(0)),
                    mib(v["total"].as_u64().unwrap_or(0))
                );
            }
        }
    }
    Ok(())
}

fn text(v: &Value) -> String {
    v.as_str()
        .map(str::to_string)
        .unwrap_or_else(|| v.to_string())
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}
