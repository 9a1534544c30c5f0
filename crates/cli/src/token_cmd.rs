//! `bazaar token ...` (the cluster token key, scoped tokens: create, narrow offline, inspect,
//! revoke; legacy token-file tokens) and `bazaar audit -a APP` (an app's changes).

use crate::api_cmd::{out, Conn};
use anyhow::Context;
use bazaar_auth::{Op, Scope, TokenKey};
use comfy_table::Table;
use serde_json::json;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// `bazaar token`.
#[derive(Debug, clap::Args)]
pub struct TokenArgs {
    #[command(subcommand)]
    command: TokenCommand,
}

/// What a token may do, on the command line.
#[derive(Debug, clap::Args)]
struct ScopeArgs {
    /// Only this app (repeatable, or comma-separated). Default: every app.
    #[arg(long = "app", short = 'a', value_delimiter = ',')]
    apps: Vec<String>,
    /// Only reads.
    #[arg(long)]
    read_only: bool,
    /// Only these operations (reads are always allowed): create, update, start, stop,
    /// restart, signal, suspend, destroy, exec, lease, volumes, secrets.
    #[arg(long, value_delimiter = ',')]
    ops: Vec<String>,
    /// Refused after this long (`10m`, `1h`, `24h`).
    #[arg(long)]
    expires: Option<String>,
    /// Allow machines with `config.driver = "process"` (any command the hosts' /usr offers,
    /// confined): app-scoped tokens do not have it unless asked.
    #[arg(long, conflicts_with = "no_process")]
    allow_process: bool,
    /// Take the process driver away (org tokens have it by default).
    #[arg(long)]
    no_process: bool,
    /// Only machines of these runtimes (`config.runtime`: process, runc, gvisor, microvm;
    /// comma-separated). Default: every runtime (the process driver as above).
    #[arg(long = "runtime", value_delimiter = ',')]
    runtimes: Vec<String>,
}

impl ScopeArgs {
    fn scope(&self) -> anyhow::Result<Scope> {
        let ops = self
            .ops
            .iter()
            .map(|o| o.trim().parse::<Op>())
            .collect::<Result<BTreeSet<_>, _>>()?;
        let expires = self
            .expires
            .as_deref()
            .map(|e| {
                bazaar_types::duration::parse_go_duration(e)
                    .map(|d| std::time::SystemTime::now() + d)
                    .map_err(|e| anyhow::anyhow!("--expires: {e}"))
            })
            .transpose()?;
        let apps: BTreeSet<String> = self.apps.iter().map(|a| a.trim().to_string()).collect();
        Ok(Scope {
            process: self.allow_process || (apps.is_empty() && !self.no_process),
            apps,
            read_only: self.read_only,
            ops,
            expires,
            runtimes: self.runtimes.iter().map(|r| r.trim().to_string()).collect(),
        })
    }
}

/// The private cluster token key's file.
#[derive(Debug, clap::Args)]
struct KeyFileArg {
    /// The private cluster token key (`bazaar dev` keeps it in .bazaar-dev; its public half
    /// is beside it, `.pub`).
    #[arg(
        long,
        env = "BAZAAR_TOKEN_KEY_FILE",
        default_value = ".bazaar-dev/cluster-token-key"
    )]
    key_file: PathBuf,
}

/// The agents' token file.
#[derive(Debug, clap::Args)]
struct TokenFileArg {
    /// The agents' token file (`bazaar dev` uses .bazaar-dev/api-tokens).
    #[arg(
        long,
        env = "BAZAAR_TOKEN_FILE",
        default_value = ".bazaar-dev/api-tokens"
    )]
    token_file: PathBuf,
}

#[derive(Debug, clap::Subcommand)]
enum TokenCommand {
    /// Make the cluster token key pair (the private key signs tokens; give every agent the
    /// public key: `--token-public-key-file KEY.pub`).
    Init {
        #[command(flatten)]
        key: KeyFileArg,
    },
    /// Make a new token signed by the cluster token key (default: the whole organization).
    Create {
        #[command(flatten)]
        scope: ScopeArgs,
        #[command(flatten)]
        key: KeyFileArg,
        /// Instead, a legacy all-powerful token added to the token file.
        #[arg(long, conflicts_with_all = ["apps", "read_only", "ops", "expires", "allow_process", "no_process"])]
        legacy: bool,
        #[command(flatten)]
        file: TokenFileArg,
    },
    /// Narrow a token, offline (no key needed); nothing can widen one.
    Attenuate {
        /// The token to narrow.
        token: String,
        #[command(flatten)]
        scope: ScopeArgs,
    },
    /// Show a token's id and what each of its blocks allows.
    Inspect {
        /// The token.
        token: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token by its id (or the token itself): every token narrowed from it goes
    /// too. The agent reading the token file refuses it at once, every other agent within
    /// moments (the id or hash travels in the catalog; the token never does).
    Revoke {
        /// The token's id (`bazaar token inspect`), a scoped token, or a legacy token.
        token: String,
        #[command(flatten)]
        file: TokenFileArg,
    },
}

/// Runs `bazaar token`.
pub async fn token(a: TokenArgs) -> anyhow::Result<()> {
    match a.command {
        TokenCommand::Init { key } => {
            let public = init_key(&key.key_file)?;
            println!("{public}");
            Ok(())
        }
        TokenCommand::Create {
            legacy: true, file, ..
        } => {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let token = bazaar_types::ids::new_secret(20);
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(&file.token_file)
                .with_context(|| format!("opening {}", file.token_file.display()))?;
            writeln!(f, "{token}")?;
            f.sync_all()?;
            println!("{token}");
            Ok(())
        }
        TokenCommand::Create { scope, key, .. } => {
            let text = std::fs::read_to_string(&key.key_file).with_context(|| {
                format!(
                    "reading the cluster token key {} (bazaar token init makes one)",
                    key.key_file.display()
                )
            })?;
            let key = TokenKey::from_private_hex(&text)?;
            println!("{}", bazaar_auth::mint(&key, &scope.scope()?)?);
            Ok(())
        }
        TokenCommand::Attenuate { token, scope } => {
            println!("{}", bazaar_auth::attenuate(&token, &scope.scope()?)?);
            Ok(())
        }
        TokenCommand::Inspect { token, json } => {
            let d = bazaar_auth::describe(&token)?;
            if json {
                let v = json!({"id": d.id, "blocks": d.blocks, "revocation_ids": d.revocation_ids});
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!("id: {}", d.id);
                println!("  (revoking it revokes this token and every token narrowed from it)");
                for (i, block) in d.blocks.iter().enumerate() {
                    let what = if i == 0 { "as created" } else { "narrowed" };
                    println!("block {i} ({what}), id {}:", d.revocation_ids[i]);
                    for line in block.lines() {
                        println!("  {line}");
                    }
                }
            }
            Ok(())
        }
        TokenCommand::Revoke { token, file } => {
            let token = token.trim();
            if bazaar_auth::is_scoped(token) {
                let id = bazaar_auth::describe(token)?.id;
                bazaar_agent::secrets::revoke_id(&file.token_file, &id)?;
                println!("revoked {id}");
            } else if token.len() == 128 && token.bytes().all(|b| b.is_ascii_hexdigit()) {
                bazaar_agent::secrets::revoke_id(&file.token_file, token)?;
                println!("revoked {token}");
            } else {
                let hash = bazaar_agent::secrets::revoke_token(&file.token_file, token)?;
                println!("revoked {hash}");
            }
            Ok(())
        }
    }
}

/// Makes the cluster token key at `path` (0600) and its public half at `path.pub`, unless
/// it exists. Returns the public key (hex).
pub fn init_key(path: &Path) -> anyhow::Result<String> {
    let public_path = public_key_path(path);
    if let Ok(text) = std::fs::read_to_string(path) {
        let key = TokenKey::from_private_hex(&text)
            .with_context(|| format!("{} holds no token key", path.display()))?;
        if !public_path.exists() {
            std::fs::write(&public_path, format!("{}\n", key.public_hex()))?;
        }
        return Ok(key.public_hex());
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let key = TokenKey::generate();
    bazaar_agent::secrets::write_private(path, &format!("{}\n", key.private_hex()))?;
    std::fs::write(&public_path, format!("{}\n", key.public_hex()))?;
    Ok(key.public_hex())
}

/// Where the public half of a token key file is kept.
pub fn public_key_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".pub");
    PathBuf::from(name)
}

/// `bazaar audit`.
#[derive(Debug, clap::Args)]
pub struct AuditArgs {
    /// The app.
    #[arg(long, short = 'a')]
    app: String,
    #[command(flatten)]
    conn: Conn,
}

/// Runs `bazaar audit -a APP`: every change to the app, oldest first.
pub async fn audit(a: AuditArgs) -> anyhow::Result<()> {
    let c = &a.conn;
    let list = c.client()?.audit(&a.app).await?;
    out(c, &list, || {
        let mut t = Table::new();
        t.set_header(["time", "token", "method", "path", "status", "from", "host"]);
        for e in &list.entries {
            let token = &e.token_id;
            let short = if token.len() > 16 {
                &token[..16]
            } else {
                token
            };
            t.add_row([
                e.time.clone(),
                short.to_string(),
                e.method.clone(),
                e.path.clone(),
                e.status.to_string(),
                e.peer.clone(),
                e.host_id.clone(),
            ]);
        }
        println!("{t}");
        for h in &list.unreachable_hosts {
            eprintln!("host {h} did not answer: its changes are missing");
        }
    })
}
