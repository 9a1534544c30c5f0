//! `bazaar volumes ...`: volumes over the Machines API (`/v1/apps/{app}/volumes`), as
//! `fly volumes` does. Same connection flags as `bazaar machine` (`BAZAAR_API_URL`,
//! `BAZAAR_TOKEN`, `--json`).

use crate::api_cmd::{out, s, Conn};
use anyhow::Context;
use comfy_table::Table;
use reqwest::Method;
use serde_json::{json, Value};

/// `bazaar volumes`.
#[derive(Debug, clap::Args)]
pub struct VolumesArgs {
    #[command(flatten)]
    conn: Conn,
    /// The app.
    #[arg(long, short, env = "BAZAAR_APP", global = true)]
    app: Option<String>,
    #[command(subcommand)]
    command: VolumesCommand,
}

#[derive(Debug, clap::Subcommand)]
enum VolumesCommand {
    /// Create a volume, placed by the market on a host with room.
    Create {
        /// Lowercase letters, digits and `_` (at most 30).
        name: String,
        /// Size in GB (default 3, or the snapshot's volume's size).
        #[arg(long, short)]
        size: Option<u64>,
        /// Restore this snapshot into the new volume (made on the snapshot's host).
        #[arg(long)]
        snapshot_id: Option<String>,
        /// Region (default: the API node's region).
        #[arg(long, short)]
        region: Option<String>,
        /// Allow a host that already holds a volume of this name.
        #[arg(long)]
        no_require_unique_zone: bool,
        /// Pick a host that can also run a machine of this many CPUs ...
        #[arg(long, requires = "vm_memory")]
        vm_cpus: Option<u32>,
        /// ... and this much memory (MB).
        #[arg(long, requires = "vm_cpus")]
        vm_memory: Option<u64>,
    },
    /// List the app's volumes.
    List,
    /// Show one volume.
    Show { id: String },
    /// Grow a volume to a new size (GB).
    Extend {
        id: String,
        #[arg(long, short)]
        size: u64,
    },
    /// Delete a volume and its data (refused while a machine mounts it).
    Destroy { id: String },
    /// A new volume with a copy of this one's data, taken now, on the same host.
    Fork {
        id: String,
        /// Name of the new volume (default: the source's).
        #[arg(long)]
        name: Option<String>,
        /// Size in GB (default: the source's).
        #[arg(long, short)]
        size: Option<u64>,
    },
    /// A volume's snapshots.
    Snapshots {
        #[command(subcommand)]
        command: SnapshotsCommand,
    },
}

#[derive(Debug, clap::Subcommand)]
enum SnapshotsCommand {
    /// List a volume's snapshots.
    List { id: String },
    /// Take a snapshot of a volume now.
    Create { id: String },
}

/// Runs `bazaar volumes`.
pub async fn volumes(a: VolumesArgs) -> anyhow::Result<()> {
    let c = &a.conn;
    let app = a
        .app
        .clone()
        .context("which app? pass --app or set BAZAAR_APP")?;
    let path = |id: &str, rest: &str| format!("/apps/{app}/volumes/{id}{rest}");
    match a.command {
        VolumesCommand::Create {
            name,
            size,
            snapshot_id,
            region,
            no_require_unique_zone,
            vm_cpus,
            vm_memory,
        } => {
            let mut body = json!({
                "name": name,
                "require_unique_zone": !no_require_unique_zone,
            });
            if let Some(size) = size {
                body["size_gb"] = json!(size);
            }
            if let Some(snapshot) = snapshot_id {
                body["snapshot_id"] = json!(snapshot);
            }
            if let Some(r) = region {
                body["region"] = json!(r);
            }
            if let (Some(cpus), Some(memory_mb)) = (vm_cpus, vm_memory) {
                body["compute"] =
                    json!({"cpu_kind": "shared", "cpus": cpus, "memory_mb": memory_mb});
            }
            let v = c
                .call(Method::POST, &format!("/apps/{app}/volumes"), Some(body))
                .await?;
            out(c, &v, || print_volumes(std::slice::from_ref(&v)))
        }
        VolumesCommand::List => {
            let v = c
                .call(Method::GET, &format!("/apps/{app}/volumes"), None)
                .await?;
            out(c, &v, || {
                print_volumes(v.as_array().map(Vec::as_slice).unwrap_or_default())
            })
        }
        VolumesCommand::Show { id } => {
            let v = c.call(Method::GET, &path(&id, ""), None).await?;
            out(c, &v, || {
                let mut t = Table::new();
                t.set_header(["field", "value"]);
                for (k, val) in v.as_object().into_iter().flatten() {
                    t.add_row([k.clone(), s(val)]);
                }
                println!("{t}");
            })
        }
        VolumesCommand::Extend { id, size } => {
            let v = c
                .call(
                    Method::PUT,
                    &path(&id, "/extend"),
                    Some(json!({"size_gb": size})),
                )
                .await?;
            out(c, &v, || {
                println!(
                    "volume {id} is now {} GB{}",
                    s(&v["volume"]["size_gb"]),
                    if v["needs_restart"] == true {
                        " (restart its machine to see it)"
                    } else {
                        ""
                    }
                )
            })
        }
        VolumesCommand::Destroy { id } => {
            let v = c.call(Method::DELETE, &path(&id, ""), None).await?;
            out(c, &v, || println!("destroyed volume {id}"))
        }
        VolumesCommand::Fork { id, name, size } => {
            let name = match name {
                Some(n) => n,
                None => s(&c.call(Method::GET, &path(&id, ""), None).await?["name"]),
            };
            let mut body = json!({"name": name, "source_volume_id": id});
            if let Some(size) = size {
                body["size_gb"] = json!(size);
            }
            let v = c
                .call(Method::POST, &format!("/apps/{app}/volumes"), Some(body))
                .await?;
            out(c, &v, || print_volumes(std::slice::from_ref(&v)))
        }
        VolumesCommand::Snapshots {
            command: SnapshotsCommand::List { id },
        } => {
            let v = c.call(Method::GET, &path(&id, "/snapshots"), None).await?;
            out(c, &v, || {
                let mut t = Table::new();
                t.set_header(["id", "created at", "size", "digest", "status"]);
                for snap in v.as_array().into_iter().flatten() {
                    t.add_row([
                        s(&snap["id"]),
                        s(&snap["created_at"]),
                        s(&snap["size"]),
                        s(&snap["digest"]),
                        s(&snap["status"]),
                    ]);
                }
                println!("{t}");
            })
        }
        VolumesCommand::Snapshots {
            command: SnapshotsCommand::Create { id },
        } => {
            let v = c
                .call(Method::POST, &path(&id, "/snapshots"), Some(json!({})))
                .await?;
            out(c, &v, || {
                println!("snapshot {} of volume {id}", s(&v["id"]))
            })
        }
    }
}

fn print_volumes(volumes: &[Value]) {
    let mut t = Table::new();
    t.set_header([
        "id",
        "name",
        "state",
        "size",
        "region",
        "zone",
        "fstype",
        "attached to",
    ]);
    for v in volumes {
        t.add_row([
            s(&v["id"]),
            s(&v["name"]),
            s(&v["state"]),
            format!("{}GB", s(&v["size_gb"])),
            s(&v["region"]),
            s(&v["zone"]),
            s(&v["fstype"]),
            s(&v["attached_machine_id"]),
        ]);
    }
    println!("{t}");
}
