//! `bazaar volumes ...`: volumes over the Machines API (`/v1/apps/{app}/volumes`), as
//! `fly volumes` does. Same connection flags as `bazaar machine` (`BAZAAR_API_URL`,
//! `BAZAAR_TOKEN`, `--json`).

use crate::api_cmd::{out, print_fields, Conn};
use anyhow::Context;
use bazaar_types::guest::Guest;
use bazaar_types::volume::{CreateVolumeRequest, Volume};
use comfy_table::Table;

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
    let api = c.client()?;
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
            let compute = match (vm_cpus, vm_memory) {
                (Some(cpus), Some(memory_mb)) => Some(Guest {
                    cpu_kind: "shared".into(),
                    cpus: cpus.into(),
                    memory_mb: memory_mb.try_into().context("--vm-memory is too large")?,
                    extra: Default::default(),
                }),
                _ => None,
            };
            let req = CreateVolumeRequest {
                name,
                require_unique_zone: Some(!no_require_unique_zone),
                size_gb: size,
                snapshot_id,
                region,
                compute,
                ..Default::default()
            };
            let v = api.create_volume(&app, &req).await?;
            out(c, &v, || print_volumes(std::slice::from_ref(&v)))
        }
        VolumesCommand::List => {
            let list = api.volumes(&app).await?;
            out(c, &list, || print_volumes(&list))
        }
        VolumesCommand::Show { id } => {
            let v = api.volume(&app, &id).await?;
            out(c, &v, || print_fields(&v))
        }
        VolumesCommand::Extend { id, size } => {
            let r = api.extend_volume(&app, &id, size).await?;
            out(c, &r, || {
                println!(
                    "volume {id} is now {} GB{}",
                    r.volume.size_gb,
                    if r.needs_restart {
                        " (restart its machine to see it)"
                    } else {
                        ""
                    }
                )
            })
        }
        VolumesCommand::Destroy { id } => {
            let v = api.destroy_volume(&app, &id).await?;
            out(c, &v, || println!("destroyed volume {id}"))
        }
        VolumesCommand::Fork { id, name, size } => {
            let name = match name {
                Some(n) => n,
                None => api.volume(&app, &id).await?.name,
            };
            let req = CreateVolumeRequest {
                name,
                source_volume_id: Some(id),
                size_gb: size,
                ..Default::default()
            };
            let v = api.create_volume(&app, &req).await?;
            out(c, &v, || print_volumes(std::slice::from_ref(&v)))
        }
        VolumesCommand::Snapshots {
            command: SnapshotsCommand::List { id },
        } => {
            let snapshots = api.snapshots(&app, &id).await?;
            out(c, &snapshots, || {
                let mut t = Table::new();
                t.set_header(["id", "created at", "size", "digest", "status"]);
                for snap in &snapshots {
                    t.add_row([
                        snap.id.clone(),
                        snap.created_at.clone(),
                        snap.size.to_string(),
                        snap.digest.clone(),
                        snap.status.clone(),
                    ]);
                }
                println!("{t}");
            })
        }
        VolumesCommand::Snapshots {
            command: SnapshotsCommand::Create { id },
        } => {
            let snap = api.create_snapshot(&app, &id).await?;
            out(c, &snap, || println!("snapshot {} of volume {id}", snap.id))
        }
    }
}

fn print_volumes(volumes: &[Volume]) {
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
            v.id.clone(),
            v.name.clone(),
            v.state.clone(),
            format!("{}GB", v.size_gb),
            v.region.clone(),
            v.zone.clone(),
            v.fstype.clone(),
            v.attached_machine_id.clone().unwrap_or_default(),
        ]);
    }
    println!("{t}");
}
