//! `bazaar quota set|show --org ORG [--app APP]`: the quotas of an organization or of one of
//! its apps (docs/POLICY.md), through the Machines API's bazaar extension
//! (`/v1/orgs/{org}/quota`, `/v1/orgs/{org}/apps/{app}/quota`). `set` replaces the limits:
//! a resource not given has none, and `set` with none lifts the quota.

use crate::api_cmd::{out, Conn};
use bazaar_types::quota::{Limits, QuotaStatus};
use comfy_table::Table;

/// `bazaar quota`.
#[derive(Debug, clap::Args)]
pub struct QuotaArgs {
    #[command(flatten)]
    conn: Conn,
    /// The organization.
    #[arg(long, short, default_value = "personal", global = true)]
    org: String,
    /// An app of the organization: its quota instead of the organization's.
    #[arg(long, short, env = "BAZAAR_APP", global = true)]
    app: Option<String>,
    #[command(subcommand)]
    command: QuotaCommand,
}

#[derive(Debug, clap::Subcommand)]
enum QuotaCommand {
    /// Replace the limits (a resource not given has none; none given lifts the quota).
    Set {
        /// Machines not destroyed.
        #[arg(long)]
        machines: Option<u64>,
        /// CPUs of those machines.
        #[arg(long)]
        cpus: Option<u64>,
        /// Memory of those machines, in MB.
        #[arg(long)]
        memory_mb: Option<u64>,
        /// Size of the volumes, in GB.
        #[arg(long)]
        volume_gb: Option<u64>,
    },
    /// Show the limits and what is in use.
    Show,
}

/// Runs `bazaar quota`.
pub async fn quota(a: QuotaArgs) -> anyhow::Result<()> {
    let c = &a.conn;
    let api = c.client()?;
    let app = a.app.as_deref();
    let status = match a.command {
        QuotaCommand::Show => api.quota(&a.org, app).await?,
        QuotaCommand::Set {
            machines,
            cpus,
            memory_mb,
            volume_gb,
        } => {
            let limits = Limits {
                machines,
                cpus,
                memory_mb,
                volume_gb,
            };
            api.set_quota(&a.org, app, &limits).await?
        }
    };
    out(c, &status, || print_status(&status))
}

fn print_status(s: &QuotaStatus) {
    let limit = |l: Option<u64>| l.map_or("-".to_string(), |n| n.to_string());
    let mut t = Table::new();
    t.set_header(["", "limit", "in use"]);
    let rows = [
        ("machines", s.limits.machines, s.usage.machines),
        ("cpus", s.limits.cpus, s.usage.cpus),
        ("memory_mb", s.limits.memory_mb, s.usage.memory_mb),
        ("volume_gb", s.limits.volume_gb, s.usage.volume_gb),
    ];
    for (name, l, used) in rows {
        t.add_row([name.to_string(), limit(l), used.to_string()]);
    }
    println!("quota of {}\n{t}", s.scope);
}
