//! User commands over the Machines API (`/v1`): `bazaar apps ...`, `bazaar machine ...`
//! (tokens: `token_cmd.rs`). They read `BAZAAR_API_URL` and `BAZAAR_TOKEN`; tables by
//! default, `--json` for scripts.

use anyhow::{bail, Context};
use comfy_table::Table;
use serde_json::{json, Value};

/// Where the API is and how to authenticate.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Conn {
    #[arg(
        long,
        env = "BAZAAR_API_URL",
        default_value = "http://127.0.0.1:4280",
        global = true
    )]
    api_url: String,
    #[arg(long, env = "BAZAAR_TOKEN", hide_env_values = true, global = true)]
    token: Option<String>,
    /// The cluster CA certificate (PEM) to trust for an API served over HTTPS with a
    /// certificate of the cluster (`bazaar agent --api-tls`; `bazaar dev` writes its path).
    #[arg(long, env = "BAZAAR_CA_CERT", global = true)]
    ca_cert: Option<std::path::PathBuf>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
}

impl Conn {
    /// The HTTP client: trusts the cluster CA of `--ca-cert` besides the system's roots.
    pub(crate) fn http(&self) -> anyhow::Result<reqwest::Client> {
        let mut builder = reqwest::Client::builder();
        if let Some(path) = &self.ca_cert {
            let pem = std::fs::read(path)
                .with_context(|| format!("reading the CA certificate {}", path.display()))?;
            builder = builder.tls_certs_merge(
                reqwest::Certificate::from_pem_bundle(&pem)
                    .with_context(|| format!("{}: not a PEM certificate", path.display()))?,
            );
        }
        Ok(builder.build()?)
    }

    /// A request to `path` (from the server's root, e.g. `/host/v1/images`) with the token.
    pub(crate) fn request(
        &self,
        method: reqwest::Method,
        path: &str,
    ) -> anyhow::Result<reqwest::RequestBuilder> {
        let token = self
            .token
            .clone()
            .context("no token: set BAZAAR_TOKEN (bazaar dev writes it to .bazaar-dev/dev.env) or pass --token")?;
        let url = format!("{}{path}", self.api_url.trim_end_matches('/'));
        Ok(self.http()?.request(method, url).bearer_auth(token))
    }

    /// The same server, called with `token` instead (the cluster secret, for the host
    /// interface).
    pub(crate) fn with_token(&self, token: String) -> Conn {
        Conn {
            api_url: self.api_url.clone(),
            token: Some(token),
            ca_cert: self.ca_cert.clone(),
            json: self.json,
        }
    }

    /// True when the user asked for JSON.
    pub(crate) fn json(&self) -> bool {
        self.json
    }

    pub(crate) async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let path = format!("/v1{path}");
        let mut req = self.request(method, &path)?;
        if let Some(b) = body {
            req = req.json(&b);
        }
        let url = format!("{}{path}", self.api_url.trim_end_matches('/'));
        let resp = req.send().await.with_context(|| format!("calling {url}"))?;
        answer(resp).await
    }
}

/// The JSON of a response, or its Fly-shaped error (`{"error": ...}`) as an error.
pub(crate) async fn answer(resp: reqwest::Response) -> anyhow::Result<Value> {
    let status = resp.status();
    let text = resp.text().await?;
    let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text.clone()));
    if !status.is_success() {
        let msg = value["error"].as_str().map(str::to_string).unwrap_or(text);
        bail!("{} ({})", msg, status.as_u16());
    }
    Ok(value)
}

/// `bazaar apps`.
#[derive(Debug, clap::Args)]
pub struct AppsArgs {
    #[command(flatten)]
    conn: Conn,
    #[command(subcommand)]
    command: AppsCommand,
}

#[derive(Debug, clap::Subcommand)]
enum AppsCommand {
    /// Create an app.
    Create {
        name: String,
        #[arg(long, default_value = "personal")]
        org: String,
    },
    /// List apps.
    List,
    /// Destroy an app and its machines.
    Destroy { name: String },
}

/// Runs `bazaar apps`.
pub async fn apps(a: AppsArgs) -> anyhow::Result<()> {
    let c = &a.conn;
    match a.command {
        AppsCommand::Create { name, org } => {
            let v = c
                .call(
                    reqwest::Method::POST,
                    "/apps",
                    Some(json!({"app_name": name, "org_slug": org})),
                )
                .await?;
            out(c, &v, || {
                println!("created app {}", v["name"].as_str().unwrap_or_default())
            })
        }
        AppsCommand::List => {
            let v = c.call(reqwest::Method::GET, "/apps", None).await?;
            out(c, &v, || {
                let mut t = Table::new();
                t.set_header(["name", "org", "machines", "status"]);
                for app in v["apps"].as_array().into_iter().flatten() {
                    t.add_row([
                        s(&app["name"]),
                        s(&app["organization"]["slug"]),
                        app["machine_count"].to_string(),
                        s(&app["status"]),
                    ]);
                }
                println!("{t}");
            })
        }
        AppsCommand::Destroy { name } => {
            let v = c
                .call(reqwest::Method::DELETE, &format!("/apps/{name}"), None)
                .await?;
            out(c, &v, || println!("destroying app {name} and its machines"))
        }
    }
}

/// `bazaar machine`.
#[derive(Debug, clap::Args)]
pub struct MachineArgs {
    #[command(flatten)]
    conn: Conn,
    /// The app.
    #[arg(long, short, env = "BAZAAR_APP", global = true)]
    app: Option<String>,
    #[command(subcommand)]
    command: MachineCommand,
}

#[derive(Debug, clap::Subcommand)]
enum MachineCommand {
    /// Create (and start) machines running a command, or an image (`--image`), placed by
    /// the market.
    Run {
        /// Run this OCI image (e.g. `127.0.0.1:5000/web:1`) under runc; a command after
        /// `--` then replaces the image's.
        #[arg(long)]
        image: Option<String>,
        /// Region expression: `ams`, `ams,ord`, `any` (default: this node's region, then any).
        #[arg(long)]
        region: Option<String>,
        #[arg(long, default_value = "shared-cpu-1x")]
        size: String,
        #[arg(long)]
        memory_mb: Option<i64>,
        #[arg(long)]
        name: Option<String>,
        /// Internal ports of services (repeatable); the workload reads its port in $PORT.
        #[arg(long = "port")]
        ports: Vec<u16>,
        #[arg(long = "env")]
        env: Vec<String>,
        /// no, always, on-failure.
        #[arg(long)]
        restart: Option<String>,
        /// How many machines (batch placement).
        #[arg(long, default_value_t = 1)]
        count: usize,
        #[arg(long)]
        skip_launch: bool,
        /// Return once the machine is created, without waiting for it to start.
        #[arg(long, short)]
        detach: bool,
        #[arg(last = true, required_unless_present = "image")]
        command: Vec<String>,
    },
    /// Change a machine's image, command or environment (it restarts with them).
    Update {
        id: String,
        #[arg(long)]
        image: Option<String>,
        /// KEY=VALUE (repeatable), added to its environment.
        #[arg(long = "env")]
        env: Vec<String>,
        /// Return without waiting for it to start again.
        #[arg(long, short)]
        detach: bool,
        /// The new command.
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// List the app's machines.
    List,
    /// Show a machine.
    Status {
        id: String,
    },
    /// Start a machine and wait until it runs.
    Start {
        id: String,
        /// Return without waiting for it to start.
        #[arg(long, short)]
        detach: bool,
    },
    Stop {
        id: String,
    },
    /// Restart a machine and wait until it runs again.
    Restart {
        id: String,
        /// Return without waiting for it to start again.
        #[arg(long, short)]
        detach: bool,
    },
    /// Freeze a machine (start resumes it).
    Suspend {
        id: String,
    },
    /// Destroy a machine that is not running (stop it first, or pass --force).
    Destroy {
        id: String,
        /// Kill it at once if it is running (or starting, or suspended).
        #[arg(long)]
        force: bool,
    },
    /// Run a command inside a machine.
    Exec {
        id: String,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Show a machine's output.
    Logs {
        id: String,
        #[arg(long, short)]
        follow: bool,
    },
    /// Why a machine landed where it did.
    Explain {
        id: String,
    },
    /// Take a lease (prints the nonce), or release one with --release NONCE.
    Lease {
        id: String,
        #[arg(long, default_value_t = 120)]
        ttl: u64,
        #[arg(long)]
        release: Option<String>,
    },
}

/// Runs `bazaar machine`.
pub async fn machine(a: MachineArgs) -> anyhow::Result<()> {
    use reqwest::Method;
    let c = &a.conn;
    let app = a
        .app
        .clone()
        .context("which app? pass --app or set BAZAAR_APP")?;
    let m = |id: &str, rest: &str| format!("/apps/{app}/machines/{id}{rest}");
    match a.command {
        MachineCommand::Run {
            image,
            region,
            size,
            memory_mb,
            name,
            ports,
            env,
            restart,
            count,
            skip_launch,
            detach,
            command,
        } => {
            let mut guest =
                bazaar_types::guest::Guest::preset(&size).map_err(anyhow::Error::msg)?;
            if let Some(mb) = memory_mb {
                guest.memory_mb = mb;
            }
            let mut env_map = serde_json::Map::new();
            for kv in env {
                let (k, v) = kv.split_once('=').context("--env takes KEY=VALUE")?;
                env_map.insert(k.into(), json!(v));
            }
            let services: Vec<Value> = ports
                .iter()
                .map(|p| json!({"internal_port": p, "protocol": "tcp"}))
                .collect();
            let mut config = json!({"image": "process", "driver": "process", "guest": guest, "init": {"exec": command}, "env": env_map, "services": services});
            if let Some(image) = image {
                config["image"] = json!(image);
                if let Some(c) = config.as_object_mut() {
                    c.remove("driver");
                    if command.is_empty() {
                        c.remove("init");
                    }
                }
            }
            if let Some(r) = restart {
                config["restart"] = json!({"policy": r});
            }
            let mut body = json!({"config": config, "skip_launch": skip_launch});
            if let Some(r) = region {
                body["region"] = json!(r);
            }
            if let Some(n) = name {
                body["name"] = json!(n);
            }
            let machines: Vec<Value> = if count > 1 {
                body["count"] = json!(count);
                let v = c
                    .call(
                        Method::POST,
                        &format!("/apps/{app}/machines/batch"),
                        Some(body),
                    )
                    .await?;
                v["machines"].as_array().cloned().unwrap_or_default()
            } else {
                vec![
                    c.call(Method::POST, &format!("/apps/{app}/machines"), Some(body))
                        .await?,
                ]
            };
            let machines = if skip_launch || detach {
                machines
            } else {
                until_all_running(c, &app, &machines).await?
            };
            let v = Value::Array(machines);
            out(c, &v, || {
                for mm in v.as_array().into_iter().flatten() {
                    println!(
                        "machine {} ({}) on host {} in {}",
                        s(&mm["id"]),
                        s(&mm["name"]),
                        s(&mm["host_id"]),
                        s(&mm["region"])
                    );
                }
            })
        }
        MachineCommand::List => {
            let v = c
                .call(Method::GET, &format!("/apps/{app}/machines"), None)
                .await?;
            out(c, &v, || print_machines(&v))
        }
        MachineCommand::Status { id } => {
            let v = c.call(Method::GET, &m(&id, ""), None).await?;
            out(c, &v, || print_machines(&Value::Array(vec![v.clone()])))
        }
        MachineCommand::Start { id, detach } => {
            act_and_wait(
                c,
                &app,
                &id,
                Method::POST,
                "/start",
                None,
                detach,
                "started",
            )
            .await
        }
        MachineCommand::Stop { id } => {
            simple(c, Method::POST, &m(&id, "/stop"), &format!("stopping {id}")).await
        }
        MachineCommand::Restart { id, detach } => {
            act_and_wait(
                c,
                &app,
                &id,
                Method::POST,
                "/restart",
                None,
                detach,
                "restarted",
            )
            .await
        }
        MachineCommand::Update {
            id,
            image,
            env,
            detach,
            command,
        } => {
            let current = c.call(Method::GET, &m(&id, ""), None).await?;
            let mut config = current["config"].clone();
            if let Some(image) = image {
                config["image"] = json!(image);
            }
            for kv in env {
                let (k, v) = kv.split_once('=').context("--env takes KEY=VALUE")?;
                config["env"][k] = json!(v);
            }
            if !command.is_empty() {
                config["init"]["exec"] = json!(command);
            }
            let body = json!({"config": config});
            act_and_wait(
                c,
                &app,
                &id,
                Method::POST,
                "",
                Some(body),
                detach,
                "updated",
            )
            .await
        }
        MachineCommand::Suspend { id } => {
            simple(
                c,
                Method::POST,
                &m(&id, "/suspend"),
                &format!("suspending {id}"),
            )
            .await
        }
        MachineCommand::Destroy { id, force } => {
            let destroyed = simple(
                c,
                Method::DELETE,
                &m(&id, &format!("?force={force}")),
                &format!("destroying {id}"),
            )
            .await;
            match destroyed {
                Err(e) if !force && e.to_string().contains("force=true") => Err(e.context(
                    format!("machine {id} is running: stop it first, or pass --force to kill and destroy it"),
                )),
                other => other,
            }
        }
        MachineCommand::Exec { id, command } => {
            let v = c
                .call(
                    Method::POST,
                    &m(&id, "/exec"),
                    Some(json!({"command": command})),
                )
                .await?;
            out(c, &v, || {
                print!("{}", v["stdout"].as_str().unwrap_or_default());
                eprint!("{}", v["stderr"].as_str().unwrap_or_default());
                if v["exit_code"] != 0 {
                    eprintln!("exit code {}", v["exit_code"]);
                }
            })
        }
        MachineCommand::Logs { id, follow } => {
            let token = c.token.clone().context("no token: set BAZAAR_TOKEN")?;
            let url = format!(
                "{}/v1{}",
                c.api_url.trim_end_matches('/'),
                m(&id, &format!("/logs?follow={follow}"))
            );
            let mut resp = c.http()?.get(url).bearer_auth(token).send().await?;
            if !resp.status().is_success() {
                bail!("{}", resp.text().await?);
            }
            let mut pending = String::new();
            while let Some(chunk) = resp.chunk().await? {
                pending.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(pos) = pending.find('\n') {
                    let line: String = pending.drain(..=pos).collect();
                    match serde_json::from_str::<Value>(line.trim()) {
                        Ok(v) if !c.json => println!("{}", s(&v["line"])),
                        _ => print!("{line}"),
                    }
                }
            }
            Ok(())
        }
        MachineCommand::Explain { id } => {
            let v = c.call(Method::GET, &m(&id, "/placement"), None).await?;
            out(c, &v, || {
                println!(
                    "placement {} for {} cpu(s) / {} MB in {:?}: {}",
                    s(&v["placement_id"]),
                    v["size"]["cpus"],
                    v["size"]["memory_mb"],
                    s(&v["regions"]),
                    s(&v["reason"])
                );
                let mut t = Table::new();
                t.set_header(["round", "host", "answer", "µs"]);
                for (i, r) in v["rounds"].as_array().into_iter().flatten().enumerate() {
                    for ask in r["asked"].as_array().into_iter().flatten() {
                        let answer = match ask["outcome"].as_str() {
                            Some("bid") => {
                                format!("bid {:.3}", ask["score"].as_f64().unwrap_or(0.0))
                            }
                            Some("refused") => format!("refused: {}", s(&ask["reason"])),
                            Some(other) => format!("{other}: {}", s(&ask["error"])),
                            None => String::new(),
                        };
                        t.add_row([
                            (i + 1).to_string(),
                            s(&ask["host_id"]),
                            answer,
                            ask["elapsed_us"].to_string(),
                        ]);
                    }
                }
                println!("{t}");
                for e in v["excluded"].as_array().into_iter().flatten() {
                    println!("excluded {}: {}", s(&e["host_id"]), s(&e["reason"]));
                }
                println!("winner: {}", v["winners"]);
            })
        }
        MachineCommand::Lease { id, ttl, release } => {
            if let Some(nonce) = release {
                let token = c.token.clone().context("no token")?;
                let url = format!("{}/v1{}", c.api_url.trim_end_matches('/'), m(&id, "/lease"));
                let r = c
                    .http()?
                    .delete(url)
                    .bearer_auth(token)
                    .header("fly-machine-lease-nonce", nonce)
                    .send()
                    .await?;
                if !r.status().is_success() {
                    bail!("{}", r.text().await?);
                }
                println!("released");
                return Ok(());
            }
            let v = c
                .call(Method::POST, &m(&id, &format!("/lease?ttl={ttl}")), None)
                .await?;
            out(c, &v, || {
                println!(
                    "lease nonce {} (expires at {})",
                    s(&v["data"]["nonce"]),
                    v["data"]["expires_at"]
                )
            })
        }
    }
}

/// Waits until every machine of a `run` runs (in parallel); fails with the first failure.
async fn until_all_running(c: &Conn, app: &str, machines: &[Value]) -> anyhow::Result<Vec<Value>> {
    let mut waits = tokio::task::JoinSet::new();
    for (i, mm) in machines.iter().enumerate() {
        let (c, app, id) = (c.clone(), app.to_string(), s(&mm["id"]));
        waits.spawn(async move {
            let none = std::collections::HashSet::new();
            (
                i,
                crate::machine_wait::until_running(&c, &app, &id, &none).await,
            )
        });
    }
    let mut out = machines.to_vec();
    while let Some(joined) = waits.join_next().await {
        let (i, result) = joined?;
        out[i] = result?;
    }
    Ok(out)
}

/// Does `method` on machine `id` (`rest` after its path), then, unless `detach`, waits
/// until it runs and says so (or fails saying why).
#[allow(clippy::too_many_arguments)]
async fn act_and_wait(
    c: &Conn,
    app: &str,
    id: &str,
    method: reqwest::Method,
    rest: &str,
    body: Option<Value>,
    detach: bool,
    done: &str,
) -> anyhow::Result<()> {
    let seen = if detach {
        Default::default()
    } else {
        crate::machine_wait::seen_events(c, app, id).await?
    };
    let path = format!("/apps/{app}/machines/{id}{rest}");
    let v = c
        .call(method, &path, Some(body.unwrap_or(json!({}))))
        .await?;
    if detach {
        return out(c, &v, || {
            println!("machine {id}: {done}, not waiting for it to run")
        });
    }
    let machine = crate::machine_wait::until_running(c, app, id, &seen).await?;
    out(c, &machine, || {
        println!("machine {id} {done}: {}", s(&machine["state"]))
    })
}

pub(crate) fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

pub(crate) fn out(c: &Conn, v: &Value, human: impl FnOnce()) -> anyhow::Result<()> {
    if c.json {
        println!("{}", serde_json::to_string_pretty(v)?);
    } else {
        human();
    }
    Ok(())
}

async fn simple(
    c: &Conn,
    method: reqwest::Method,
    path: &str,
    message: &str,
) -> anyhow::Result<()> {
    let v = c.call(method, path, Some(json!({}))).await?;
    out(c, &v, || println!("{message}"))
}

fn print_machines(v: &Value) {
    let mut t = Table::new();
    t.set_header([
        "id",
        "name",
        "state",
        "region",
        "host",
        "host status",
        "version",
        "updated",
    ]);
    for m in v.as_array().into_iter().flatten() {
        t.add_row([
            s(&m["id"]),
            s(&m["name"]),
            s(&m["state"]),
            s(&m["region"]),
            s(&m["host_id"]),
            s(&m["host_status"]),
            s(&m["instance_id"]),
            s(&m["updated_at"]),
        ]);
    }
    println!("{t}");
}
