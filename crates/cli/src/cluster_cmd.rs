//! `bazaar cluster ...`: the cluster CA (`init`) and one-time join tokens (`join-token`),
//! over [`bazaar_pki`], which run where the CA's directory is and send nothing; host
//! revocation (`revoke`: signed where the CA is, handed to one agent, spread by the
//! catalog) and the gossip keyring (`gossip-key`: applied to every host the catalog knows,
//! through their host interfaces).

use crate::operator::OperatorConn as AgentConn;
use anyhow::Context;
use bazaar_client::HostClient;
use bazaar_types::host::GossipKeyChange;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct ClusterArgs {
    #[command(subcommand)]
    command: ClusterCommand,
}

#[derive(Debug, clap::Subcommand)]
enum ClusterCommand {
    /// Make the cluster CA in DIR (its key stays there, 0600). Start one agent with
    /// `--cluster-ca DIR`; the others join with tokens.
    Init {
        /// Where the CA is kept.
        #[arg(long)]
        dir: PathBuf,
    },
    /// Print a one-time join token for a new host (`bazaar agent --join-token TOKEN
    /// --join-addr HOST:PORT`, the host listener of the agent holding the CA).
    JoinToken {
        /// The CA's directory.
        #[arg(long)]
        dir: PathBuf,
        /// How long the token can be used (Go duration: 30m, 1h, 24h).
        #[arg(long, default_value = "1h")]
        ttl: String,
    },
    /// Revoke a host: the CA signs the revocation (kept in DIR/revoked/) and the agent at
    /// --api-url spreads it through the catalog; every host then refuses HOST (its rows,
    /// gossip, catalog syncs, host-listener calls), and the CA no longer renews its
    /// certificate. To bring the machine back, reset it and join with a new token.
    Revoke {
        /// The host id to revoke.
        host: String,
        /// The CA's directory.
        #[arg(long)]
        dir: PathBuf,
        #[command(flatten)]
        conn: AgentConn,
    },
    /// The gossip keyring: `generate` prints a new key; `list` shows the agent's keys (the
    /// one in use first); `install`, `use` and `remove` change every host the catalog knows.
    /// Rotate with install NEW, then use NEW, then remove OLD.
    GossipKey {
        /// generate, list, install, use or remove.
        action: String,
        /// The key (64 hex characters), for install, use and remove.
        key: Option<String>,
        #[command(flatten)]
        conn: AgentConn,
    },
}

pub fn run(args: ClusterArgs) -> anyhow::Result<()> {
    match args.command {
        ClusterCommand::Init { dir } => {
            let ca = bazaar_pki::ClusterCa::init(&dir)?;
            println!("cluster CA made in {}", dir.display());
            println!("fingerprint: sha256:{}", ca.fingerprint());
        }
        ClusterCommand::JoinToken { dir, ttl } => {
            let ttl = bazaar_types::duration::parse_go_duration(&ttl)
                .map_err(|e| anyhow::anyhow!("--ttl: {e}"))?;
            anyhow::ensure!(!ttl.is_zero(), "--ttl must be positive");
            let ca = bazaar_pki::ClusterCa::open(&dir)?;
            println!("{}", ca.new_join_token(ttl)?);
        }
        ClusterCommand::Revoke { host, dir, conn } => {
            let ca = bazaar_pki::ClusterCa::open(&dir)?;
            let revocation = ca.revoke(&host)?;
            println!("host {host} revoked by the CA in {}", dir.display());
            crate::run_async(async move {
                client(&conn)?.revoke(&revocation).await.with_context(|| {
                    format!(
                        "handing the revocation to the agent at {} (the CA's own agent also \
                             spreads it when it restarts)",
                        conn.api_url
                    )
                })?;
                println!("spreading through the catalog from {}", conn.api_url);
                Ok(())
            })?;
        }
        ClusterCommand::GossipKey { action, key, conn } => {
            crate::run_async(gossip_key(action, key, conn))?;
        }
    }
    Ok(())
}

fn client(conn: &AgentConn) -> anyhow::Result<HostClient> {
    conn.client()
}

/// `bazaar cluster gossip-key ACTION [KEY]`.
async fn gossip_key(action: String, key: Option<String>, conn: AgentConn) -> anyhow::Result<()> {
    if action == "generate" {
        println!("{}", bazaar_catalog::keyring::generate_key());
        return Ok(());
    }
    let client = client(&conn)?;
    if action == "list" {
        for key in client.gossip_keys().await?.keys {
            println!("{key}");
        }
        return Ok(());
    }
    anyhow::ensure!(
        ["install", "use", "remove"].contains(&action.as_str()),
        "unknown action {action:?}: generate, list, install, use or remove"
    );
    let key = key.context("install, use and remove take a KEY")?;
    bazaar_catalog::keyring::parse_key(&key)?;
    let change = GossipKeyChange {
        action: action.clone(),
        key,
    };
    let mut failed = Vec::new();
    for host in client.catalog_hosts().await? {
        // Each host the way the first was reached: never the secret in clear.
        let done = match conn.peer(&host) {
            Ok(peer) => peer
                .change_gossip_key(&change)
                .await
                .map_err(anyhow::Error::from),
            Err(e) => Err(e),
        };
        let id = host.id;
        match done {
            Ok(_) => println!("{id}: {action} done"),
            Err(e) => {
                println!("{id}: {e:#}");
                failed.push(id);
            }
        }
    }
    anyhow::ensure!(
        failed.is_empty(),
        "not done on {} (run it again once they are up): {}",
        failed.len(),
        failed.join(", ")
    );
    Ok(())
}
