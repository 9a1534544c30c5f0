//! `bazaar certs ...`: TLS certificates of an app's hostnames over our API
//! (`/v1/apps/{app}/certificates`), as `fly certs` does. Same connection flags as
//! `bazaar machine` (`BAZAAR_API_URL`, `BAZAAR_TOKEN`, `--json`).

use crate::api_cmd::{out, s, Conn};
use anyhow::Context;
use comfy_table::Table;
use reqwest::Method;
use serde_json::{json, Value};
use std::path::PathBuf;

/// `bazaar certs`.
#[derive(Debug, clap::Args)]
pub struct CertsArgs {
    #[command(flatten)]
    conn: Conn,
    /// The app.
    #[arg(long, short, env = "BAZAAR_APP", global = true)]
    app: Option<String>,
    #[command(subcommand)]
    command: CertsCommand,
}

#[derive(Debug, clap::Subcommand)]
enum CertsCommand {
    /// Attach a hostname to the app: its certificate is issued by ACME (see `certs show`),
    /// or given with --cert and --key.
    Add {
        hostname: String,
        /// The certificate chain (PEM file, leaf first) to serve instead of issuing one.
        #[arg(long, requires = "key")]
        cert: Option<PathBuf>,
        /// Its private key (PEM file).
        #[arg(long, requires = "cert")]
        key: Option<PathBuf>,
    },
    /// List the app's certificates.
    List,
    /// Show one hostname's certificate: pending, issued (until when) or failed (why).
    Show { hostname: String },
    /// Detach a hostname: no proxy serves it any more.
    Remove { hostname: String },
}

/// Runs `bazaar certs`.
pub async fn certs(a: CertsArgs) -> anyhow::Result<()> {
    let c = &a.conn;
    let app = a
        .app
        .clone()
        .context("which app? pass --app or set BAZAAR_APP")?;
    let base = format!("/apps/{app}/certificates");
    match a.command {
        CertsCommand::Add {
            hostname,
            cert,
            key,
        } => {
            let mut body = json!({ "hostname": hostname });
            if let (Some(cert), Some(key)) = (cert, key) {
                let read = |p: &PathBuf| {
                    std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
                };
                body["cert"] = json!(read(&cert)?);
                body["key"] = json!(read(&key)?);
            }
            let v = c.call(Method::POST, &base, Some(body)).await?;
            out(c, &v, || print_certs(std::slice::from_ref(&v)))
        }
        CertsCommand::List => {
            let v = c.call(Method::GET, &base, None).await?;
            out(c, &v, || {
                print_certs(v.as_array().map(Vec::as_slice).unwrap_or_default())
            })
        }
        CertsCommand::Show { hostname } => {
            let v = c
                .call(Method::GET, &format!("{base}/{hostname}"), None)
                .await?;
            out(c, &v, || {
                let mut t = Table::new();
                t.set_header(["field", "value"]);
                for (k, val) in v.as_object().into_iter().flatten() {
                    t.add_row([k.clone(), s(val)]);
                }
                println!("{t}");
            })
        }
        CertsCommand::Remove { hostname } => {
            let v = c
                .call(Method::DELETE, &format!("{base}/{hostname}"), None)
                .await?;
            out(c, &v, || println!("removed the certificate of {hostname}"))
        }
    }
}

fn print_certs(certs: &[Value]) {
    let mut t = Table::new();
    t.set_header([
        "hostname",
        "status",
        "source",
        "not after",
        "owner",
        "error",
    ]);
    for c in certs {
        t.add_row([
            s(&c["hostname"]),
            s(&c["status"]),
            s(&c["source"]),
            s(&c["not_after"]),
            s(&c["owner_host"]),
            s(&c["error"]),
        ]);
    }
    println!("{t}");
}
