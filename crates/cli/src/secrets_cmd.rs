//! `bazaar secrets set|list|unset -a APP`, as `fly secrets` does: values go to the Machines
//! API (`/v1/apps/{app}/secrets`), which seals them; `set` and `unset` then restart the
//! app's started machines one at a time, each waited for, so they run with the change
//! (`--stage` leaves them: the change applies at their next start). `NAME=-` reads the
//! value from stdin.

use crate::api_cmd::{out, Conn};
use anyhow::{bail, Context};
use bazaar_client::FlyClient;
use bazaar_types::state::MachineState;
use comfy_table::Table;
use serde_json::{Map, Value};
use std::io::Read;

/// `bazaar secrets`.
#[derive(Debug, clap::Args)]
pub struct SecretsArgs {
    #[command(flatten)]
    conn: Conn,
    /// The app.
    #[arg(long, short, env = "BAZAAR_APP", global = true)]
    app: Option<String>,
    #[command(subcommand)]
    command: SecretsCommand,
}

#[derive(Debug, clap::Subcommand)]
enum SecretsCommand {
    /// Set secrets (`NAME=VALUE`; `NAME=-` reads the value from stdin), then restart the
    /// app's started machines one by one.
    Set {
        #[arg(required = true, value_name = "NAME=VALUE")]
        pairs: Vec<String>,
        /// Do not restart machines: they get the change at their next start.
        #[arg(long)]
        stage: bool,
    },
    /// List the app's secrets: names and digests, never values.
    List,
    /// Unset secrets, then restart the app's started machines one by one.
    Unset {
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
        /// Do not restart machines: they lose the secrets at their next start.
        #[arg(long)]
        stage: bool,
    },
}

/// Runs `bazaar secrets`.
pub async fn secrets(a: SecretsArgs) -> anyhow::Result<()> {
    let c = &a.conn;
    let app = a
        .app
        .clone()
        .context("which app? pass --app or set BAZAAR_APP")?;
    let api = c.client()?;
    let (values, stage) = match a.command {
        SecretsCommand::List => {
            let list = api.secrets(&app).await?;
            return out(c, &list, || {
                let mut t = Table::new();
                t.set_header(["name", "digest", "updated"]);
                for x in &list.secrets {
                    t.add_row([x.name.clone(), x.digest.clone(), x.updated_at.clone()]);
                }
                println!("{t}");
            });
        }
        SecretsCommand::Set { pairs, stage } => (parse_pairs(&pairs)?, stage),
        SecretsCommand::Unset { names, stage } => {
            let values: Map<String, Value> = names.into_iter().map(|n| (n, Value::Null)).collect();
            (values, stage)
        }
    };
    let count = values.len();
    let v = api.update_secrets(&app, &values).await?;
    if !c.json() {
        println!("{count} secret(s) of {app} changed");
    }
    if stage {
        return out(c, &v, || {
            println!("staged: machines get the change at their next start")
        });
    }
    roll(c, &api, &app).await?;
    out(c, &v, || {})
}

/// `NAME=VALUE` pairs; `NAME=-` takes the value from stdin (once, trailing newline removed).
fn parse_pairs(pairs: &[String]) -> anyhow::Result<Map<String, Value>> {
    let mut values = Map::new();
    let mut stdin_used = false;
    for pair in pairs {
        let Some((name, value)) = pair.split_once('=') else {
            bail!("{pair:?} is not NAME=VALUE");
        };
        let value = if value == "-" {
            if stdin_used {
                bail!("only one secret can be read from stdin");
            }
            stdin_used = true;
            let mut buf = String::new();
            std::io::stdin()
                .read_to_string(&mut buf)
                .context("reading the value from stdin")?;
            buf.strip_suffix('\n').unwrap_or(&buf).to_string()
        } else {
            value.to_string()
        };
        values.insert(name.to_string(), Value::String(value));
    }
    Ok(values)
}

/// Restarts the app's started machines one at a time, each waited for until it runs again
/// (as `fly secrets set` updates machines). A machine whose host is unreachable is left:
/// it gets the change when it next starts.
async fn roll(c: &Conn, api: &FlyClient, app: &str) -> anyhow::Result<()> {
    let machines = api.machines(app).await?;
    let mut started = Vec::new();
    for m in machines {
        if m.state != MachineState::Started {
            continue;
        }
        if m.host_status == "unreachable" {
            eprintln!(
                "machine {}: its host is unreachable; it gets the change at its next start",
                m.id
            );
            continue;
        }
        started.push(m.id);
    }
    for (i, id) in started.iter().enumerate() {
        let seen = crate::machine_wait::seen_events(api, app, id).await?;
        api.action(app, id, "restart", None, None)
            .await
            .with_context(|| format!("restarting machine {id}"))?;
        crate::machine_wait::until_running(api, app, id, &seen)
            .await
            .with_context(|| format!("machine {id} after its restart"))?;
        if !c.json() {
            println!("machine {id} restarted ({}/{})", i + 1, started.len());
        }
    }
    Ok(())
}
