//! `bazaar cluster ...`: the cluster CA (`init`) and one-time join tokens (`join-token`),
//! over [`bazaar_pki`]. Both run where the CA's directory is; nothing is sent anywhere.

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
    }
    Ok(())
}
