//! `bazaar certs ...`: TLS certificates of an app's hostnames over our API
//! (`/v1/apps/{app}/certificates`), as `fly certs` does. Same connection flags as
//! `bazaar machine` (`BAZAAR_API_URL`, `BAZAAR_TOKEN`, `--json`).

use crate::api_cmd::{out, print_fields, Conn};
use anyhow::Context;
use bazaar_types::api::{AddCertificateRequest, Certificate};
use comfy_table::Table;
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
    let api = c.client()?;
    match a.command {
        CertsCommand::Add {
            hostname,
            cert,
            key,
        } => {
            let read = |p: &PathBuf| {
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
            };
            let mut req = AddCertificateRequest {
                hostname,
                ..Default::default()
            };
            if let (Some(cert), Some(key)) = (cert, key) {
                req.cert = Some(read(&cert)?);
                req.key = Some(read(&key)?);
            }
            let added = api.add_certificate(&app, &req).await?;
            out(c, &added, || print_certs(std::slice::from_ref(&added)))
        }
        CertsCommand::List => {
            let list = api.certificates(&app).await?;
            out(c, &list, || print_certs(&list))
        }
        CertsCommand::Show { hostname } => {
            let cert = api.certificate(&app, &hostname).await?;
            out(c, &cert, || print_fields(&cert))
        }
        CertsCommand::Remove { hostname } => {
            let v = api.remove_certificate(&app, &hostname).await?;
            out(c, &v, || println!("removed the certificate of {hostname}"))
        }
    }
}

fn print_certs(certs: &[Certificate]) {
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
            c.hostname.clone(),
            c.status.clone(),
            c.source.clone(),
            c.not_after.clone().unwrap_or_default(),
            c.owner_host.clone(),
            c.error.clone().unwrap_or_default(),
        ]);
    }
    println!("{t}");
}
