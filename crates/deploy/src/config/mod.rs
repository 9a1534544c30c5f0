//! The app config file: `bazaar.toml`, which reads the common `fly.toml` keys unchanged
//! (docs/DEPLOY.md has the mapping), and its translation into one `MachineConfig` per
//! process group.
//!
//! Invalid values fail with `file:line:col: message` (toml's spans); keys bazaar does not
//! act on are refused with an error naming them, or, when purely cosmetic, reported as
//! warnings (`keys.rs`), never silently dropped.
//!
//! Here: the file's sections and loading; [`values`] the value types read as fly.toml
//! writes them; [`mounts`] `[mounts]` / `[[mounts]]`; [`files`] `[[files]]`; `machine.rs`
//! the translation into machine configs.

use bazaar_types::config::{
    Autostop, CheckConfig, Concurrency, FileConfig, InitConfig, MachineConfig, MachinePort,
    MachineService, RestartConfig, RestartPolicyKind, StopConfig,
};
use bazaar_types::duration::GoDuration;
use bazaar_types::guest::Guest;
use bazaar_types::signal::Signal;
use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;
use std::time::Duration;

pub mod files;
mod keys;
mod machine;
pub mod mounts;
pub mod values;

pub use mounts::{Mount, Mounts, VolumeSize};
pub use values::*;

/// The default process group when the file has no `[processes]`.
pub const DEFAULT_GROUP: &str = "app";

/// A parsed app config file.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct AppConfig {
    /// The app's name.
    #[serde(default)]
    pub app: String,
    #[serde(default)]
    pub primary_region: Option<String>,
    #[serde(default)]
    pub kill_signal: Option<SignalName>,
    #[serde(default)]
    pub kill_timeout: Option<Seconds>,
    #[serde(default)]
    pub build: Build,
    #[serde(default)]
    pub env: BTreeMap<String, Scalar>,
    /// Process groups: name → command line.
    #[serde(default)]
    pub processes: BTreeMap<String, Command>,
    #[serde(default)]
    pub http_service: Option<HttpService>,
    #[serde(default)]
    pub services: Vec<Service>,
    /// Top-level machine checks (`[checks.NAME]`).
    #[serde(default)]
    pub checks: BTreeMap<String, TopCheck>,
    #[serde(default)]
    pub vm: Vec<Vm>,
    #[serde(default)]
    pub deploy: DeploySection,
    #[serde(default)]
    pub restart: Vec<Restart>,
    /// `[mounts]` or `[[mounts]]`.
    #[serde(default)]
    pub mounts: Mounts,
    #[serde(default)]
    pub experimental: Experimental,
    /// `[[files]]`.
    #[serde(default)]
    pub files: Vec<files::File>,
}

/// `[experimental]`: the keys bazaar acts on (the others are refused).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Experimental {
    /// Overrides the image's CMD (a group's `[processes]` command wins).
    #[serde(default)]
    pub cmd: Option<Command>,
    /// Overrides the image's ENTRYPOINT.
    #[serde(default)]
    pub entrypoint: Option<Command>,
    /// Runs this instead of the image's ENTRYPOINT and CMD.
    #[serde(default)]
    pub exec: Option<Command>,
    /// `false`: a failed deploy is left as it is (as `--no-rollback`).
    #[serde(default)]
    pub auto_rollback: Option<bool>,
}

/// `[build]`: an image, or `driver = "process"` (bazaar) to run `[processes]` commands.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Build {
    #[serde(default)]
    pub image: Option<String>,
    #[serde(default)]
    pub driver: Option<Driver>,
}

/// Which driver runs the machines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Driver {
    Process,
    Oci,
}

/// `[http_service]`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct HttpService {
    pub internal_port: u16,
    #[serde(default)]
    pub force_https: bool,
    #[serde(default)]
    pub auto_stop_machines: Option<AutostopSetting>,
    #[serde(default)]
    pub auto_start_machines: Option<bool>,
    #[serde(default)]
    pub min_machines_running: Option<u32>,
    #[serde(default)]
    pub concurrency: Option<ConcurrencySection>,
    #[serde(default)]
    pub processes: Vec<String>,
    #[serde(default)]
    pub checks: Vec<ServiceCheck>,
}

/// `[[services]]`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Service {
    #[serde(default = "tcp")]
    pub protocol: String,
    pub internal_port: u16,
    #[serde(default)]
    pub ports: Vec<Port>,
    #[serde(default)]
    pub auto_stop_machines: Option<AutostopSetting>,
    #[serde(default)]
    pub auto_start_machines: Option<bool>,
    #[serde(default)]
    pub min_machines_running: Option<u32>,
    #[serde(default)]
    pub concurrency: Option<ConcurrencySection>,
    #[serde(default)]
    pub processes: Vec<String>,
    #[serde(default)]
    pub tcp_checks: Vec<ServiceCheck>,
    #[serde(default)]
    pub http_checks: Vec<ServiceCheck>,
}

fn tcp() -> String {
    "tcp".into()
}

/// `[[services.ports]]`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Port {
    #[serde(default)]
    pub port: Option<u16>,
    #[serde(default)]
    pub start_port: Option<u16>,
    #[serde(default)]
    pub end_port: Option<u16>,
    #[serde(default)]
    pub handlers: Vec<String>,
    #[serde(default)]
    pub force_https: Option<bool>,
}

/// `concurrency = { type, soft_limit, hard_limit }`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ConcurrencySection {
    #[serde(rename = "type", default)]
    pub kind: Option<ConcurrencyKind>,
    #[serde(default)]
    pub soft_limit: Option<u32>,
    #[serde(default)]
    pub hard_limit: Option<u32>,
}

/// What a concurrency limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConcurrencyKind {
    Connections,
    Requests,
}

/// A service check (`[[http_service.checks]]`, `[[services.tcp_checks]]`, ...).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ServiceCheck {
    #[serde(default)]
    pub interval: Option<Millis>,
    #[serde(default)]
    pub timeout: Option<Millis>,
    #[serde(default)]
    pub grace_period: Option<Millis>,
    #[serde(default)]
    pub method: Option<String>,
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub protocol: Option<String>,
    #[serde(default)]
    pub tls_skip_verify: Option<bool>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

/// `[checks.NAME]`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct TopCheck {
    #[serde(rename = "type", default)]
    pub kind: Option<CheckKind>,
    #[serde(default)]
    pub port: Option<u16>,
    #[serde(default)]
    pub interval: Option<Millis>,
    #[serde(default)]
    pub timeout: Option<Millis>,
    #[serde(default)]
    pub grace_period: Option<Millis>,
    #[serde(default)]
    pub method: Option<String>,
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub processes: Vec<String>,
}

/// A check's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckKind {
    Http,
    Tcp,
}

/// `[[vm]]`: a size preset, overridden by `cpus`, `memory`, `cpu_kind`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Vm {
    #[serde(default)]
    pub size: Option<Size>,
    #[serde(default, alias = "memory_mb")]
    pub memory: Option<Memory>,
    #[serde(default)]
    pub cpus: Option<u32>,
    #[serde(default)]
    pub cpu_kind: Option<CpuKind>,
    #[serde(default)]
    pub processes: Vec<String>,
}

/// `shared` or `performance`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CpuKind {
    Shared,
    Performance,
}

/// `[deploy]`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct DeploySection {
    #[serde(default)]
    pub strategy: Option<Strategy>,
    #[serde(default)]
    pub max_unavailable: Option<MaxUnavailable>,
    #[serde(default)]
    pub wait_timeout: Option<Millis>,
    /// bazaar extension: re-place the app's machines on another host of their region when
    /// their host dies (the guardian); sets `metadata.bazaar_replace_on_host_failure`.
    #[serde(default)]
    pub replace_on_host_failure: bool,
    /// Run once per release in a temporary machine before any machine changes; the deploy
    /// stops if it fails (`crate::release_command`).
    #[serde(default)]
    pub release_command: Option<Command>,
    /// How long the release command may run (default 5 min).
    #[serde(default)]
    pub release_command_timeout: Option<Millis>,
}

/// How a deploy replaces machines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// A few at a time (`max_unavailable`), each health-gated.
    Rolling,
    /// One machine first, health-gated, then the rest rolling.
    Canary,
    /// A new set beside the old, health-gated, traffic switched, old destroyed.
    Bluegreen,
    /// All at once, not health-gated.
    Immediate,
}

impl std::fmt::Display for Strategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Strategy::Rolling => "rolling",
            Strategy::Canary => "canary",
            Strategy::Bluegreen => "bluegreen",
            Strategy::Immediate => "immediate",
        })
    }
}

impl std::str::FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "rolling" => Ok(Strategy::Rolling),
            "canary" => Ok(Strategy::Canary),
            "bluegreen" => Ok(Strategy::Bluegreen),
            "immediate" => Ok(Strategy::Immediate),
            _ => Err(format!(
                "unknown strategy {s:?}: rolling, canary, bluegreen or immediate"
            )),
        }
    }
}

/// `max_unavailable`: a count (≥ 1) or a fraction of the group (0 < f < 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MaxUnavailable {
    Count(usize),
    Fraction(f64),
}

impl MaxUnavailable {
    /// How many of `total` machines may be down at once (at least 1).
    pub fn of(self, total: usize) -> usize {
        match self {
            MaxUnavailable::Count(n) => n.max(1),
            MaxUnavailable::Fraction(f) => ((total as f64 * f).floor() as usize).max(1),
        }
    }
}

impl<'de> Deserialize<'de> for MaxUnavailable {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = f64::deserialize(d)?;
        if v >= 1.0 && v.fract() == 0.0 {
            Ok(MaxUnavailable::Count(v as usize))
        } else if v > 0.0 && v < 1.0 {
            Ok(MaxUnavailable::Fraction(v))
        } else {
            Err(serde::de::Error::custom(format!(
                "max_unavailable must be a whole number ≥ 1 or a fraction between 0 and 1, got {v}"
            )))
        }
    }
}

/// `[[restart]]`.
#[derive(Debug, Clone, Deserialize)]
pub struct Restart {
    pub policy: RestartPolicyName,
    #[serde(default, alias = "max_retries")]
    pub retries: Option<u32>,
    #[serde(default)]
    pub processes: Vec<String>,
}

/// A config file that could not be read: where and why.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError {
    pub file: String,
    /// 1-based line and column, when known.
    pub line: Option<usize>,
    pub col: Option<usize>,
    pub message: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.line, self.col) {
            (Some(l), Some(c)) => write!(f, "{}:{l}:{c}: {}", self.file, self.message),
            _ => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

/// A loaded config and the warnings about keys it ignored.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: AppConfig,
    pub warnings: Vec<String>,
}

/// Reads and checks a config file.
pub fn load(path: &std::path::Path) -> Result<Loaded, ConfigError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        file: file.clone(),
        line: None,
        col: None,
        message: format!("cannot read: {e}"),
    })?;
    let mut loaded = parse(&file, &text)?;
    let dir = path.parent().unwrap_or(std::path::Path::new("."));
    files::read_local(&mut loaded.config, dir).map_err(|message| ConfigError {
        file,
        line: None,
        col: None,
        message,
    })?;
    Ok(loaded)
}

/// Parses config text; `file` names it in errors and warnings.
pub fn parse(file: &str, text: &str) -> Result<Loaded, ConfigError> {
    let at = |span: Option<std::ops::Range<usize>>, message: String| {
        let (line, col) = match span {
            Some(s) => {
                let before = &text[..s.start.min(text.len())];
                let line = before.matches('\n').count() + 1;
                let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
                (Some(line), Some(col))
            }
            None => (None, None),
        };
        ConfigError {
            file: file.to_string(),
            line,
            col,
            message,
        }
    };
    let de = toml::Deserializer::parse(text).map_err(|e| at(e.span(), e.message().to_string()))?;
    let mut ignored = Vec::new();
    let config: AppConfig = serde_ignored::deserialize(de, |path| ignored.push(path.to_string()))
        .map_err(|e: toml::de::Error| at(e.span(), e.message().to_string()))?;
    let mut warnings = Vec::new();
    let mut refused = Vec::new();
    for k in ignored {
        match keys::judge(&k) {
            keys::Verdict::Warn(w) => warnings.push(format!("{file}: {w}")),
            keys::Verdict::Refuse(r) => refused.push(r),
        }
    }
    if !refused.is_empty() {
        return Err(at(
            None,
            format!(
                "bazaar cannot honour {}: {}; remove {}",
                if refused.len() == 1 {
                    "this key"
                } else {
                    "these keys"
                },
                refused.join(", "),
                if refused.len() == 1 { "it" } else { "them" },
            ),
        ));
    }
    validate(&config, &mut warnings).map_err(|m| at(None, m))?;
    Ok(Loaded { config, warnings })
}

fn validate(c: &AppConfig, warnings: &mut Vec<String>) -> Result<(), String> {
    if c.app.trim().is_empty() {
        return Err("`app` (the app's name) is required".into());
    }
    bazaar_types::ids::validate_name("app", &c.app)?;
    let process = c.build.driver == Some(Driver::Process);
    if process && c.processes.is_empty() {
        return Err("[build] driver = \"process\" needs the commands to run in [processes]".into());
    }
    if !process && c.build.image.is_none() {
        return Err(
            "[build] needs an `image`, or `driver = \"process\"` with commands in [processes]"
                .into(),
        );
    }
    let groups = c.groups();
    let check_groups = |what: &str, list: &[String]| -> Result<(), String> {
        for g in list {
            if !groups.contains(g) {
                return Err(format!(
                    "{what} names process group {g:?}, which is not in [processes]"
                ));
            }
        }
        Ok(())
    };
    if let Some(h) = &c.http_service {
        check_groups("[http_service] processes", &h.processes)?;
    }
    for s in &c.services {
        check_groups("[[services]] processes", &s.processes)?;
    }
    for (name, ch) in &c.checks {
        check_groups(&format!("[checks.{name}] processes"), &ch.processes)?;
    }
    for v in &c.vm {
        check_groups("[[vm]] processes", &v.processes)?;
    }
    for r in &c.restart {
        check_groups("[[restart]] processes", &r.processes)?;
    }
    for g in &groups {
        c.guest(g)?;
    }
    mounts::validate(c, &groups)?;
    files::validate(c, &groups)?;
    let checks = c.http_service.iter().flat_map(|h| &h.checks).chain(
        c.services
            .iter()
            .flat_map(|s| s.http_checks.iter().chain(&s.tcp_checks)),
    );
    for ch in checks {
        if let Some(p) = ch.protocol.as_deref().filter(|p| *p != "http") {
            return Err(format!(
                "a service check's `protocol = {p:?}` cannot be honoured: checks are made over plain http"
            ));
        }
    }
    let e = &c.experimental;
    if process && (e.cmd.is_some() || e.entrypoint.is_some() || e.exec.is_some()) {
        return Err(
            "[experimental] cmd, entrypoint and exec apply to images; with driver = \"process\" put the command in [processes]"
                .into(),
        );
    }
    if !c.checks.is_empty() {
        warnings.push(
            "[checks] become machine checks; deploys are gated on service checks ([http_service.checks], [[services.*_checks]])".into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLY_TOML: &str = r#"
# fly.toml app configuration file generated for hello on 2024-03-01T10:00:00Z
app = "hello"
primary_region = "ams"
kill_signal = "SIGTERM"
kill_timeout = 10
console_command = "/code/manage.py shell"

[build]
  image = "registry.fly.io/hello:deployment-01HQ"

[env]
  PORT = "8080"
  WORKERS = 4

[processes]
  web = "gunicorn --bind :8080 'hello.wsgi:application'"
  worker = "python -m celery -A hello worker"

[http_service]
  internal_port = 8080
  force_https = true
  auto_stop_machines = "stop"
  auto_start_machines = true
  min_machines_running = 1
  processes = ["web"]
  [http_service.concurrency]
    type = "requests"
    soft_limit = 200
    hard_limit = 250
  [[http_service.checks]]
    grace_period = "10s"
    interval = "30s"
    method = "GET"
    timeout = "5s"
    path = "/healthz"

[[services]]
  protocol = "tcp"
  internal_port = 5432
  processes = ["worker"]
  [[services.ports]]
    port = 5432
  [[services.tcp_checks]]
    interval = 15000
    timeout = "2s"

[checks]
  [checks.status]
    port = 8080
    type = "http"
    interval = "10s"
    timeout = "2s"
    grace_period = "5s"
    method = "GET"
    path = "/status"
    processes = ["web"]

[[vm]]
  size = "shared-cpu-2x"
  memory = "1gb"
  processes = ["web"]

[[vm]]
  cpu_kind = "shared"
  cpus = 1
  memory_mb = 512

[deploy]
  strategy = "canary"
  max_unavailable = 0.5
  wait_timeout = "2m"

[[restart]]
  policy = "always"
  retries = 5
  processes = ["worker"]

[mounts]
  source = "data"
  destination = "/data"
"#;

    #[test]
    fn a_real_fly_toml_loads_with_the_documented_mapping() {
        let l = parse("fly.toml", FLY_TOML).unwrap();
        let c = &l.config;
        assert_eq!(c.app, "hello");
        assert_eq!(c.primary_region.as_deref(), Some("ams"));
        assert_eq!(c.groups(), vec!["web", "worker"]);
        assert_eq!(c.strategy(), Strategy::Canary);
        assert_eq!(c.wait_timeout(), Duration::from_secs(120));
        assert_eq!(c.deploy.max_unavailable.unwrap().of(10), 5);
        assert!(!c.deploy.replace_on_host_failure);
        assert!(!bazaar_types::replacement::opted_in(
            &c.machine_config("web").unwrap().metadata
        ));
        assert!(
            l.warnings.iter().any(|w| w.contains("`console_command`")),
            "{:?}",
            l.warnings
        );
        assert_eq!(
            c.machine_config("worker").unwrap().mounts,
            vec![serde_json::json!({"name": "data", "path": "/data", "size_gb": 1})]
        );
        let web = c.machine_config("web").unwrap();
        assert_eq!(web.image, "registry.fly.io/hello:deployment-01HQ");
        assert_eq!(
            web.init.as_ref().unwrap().cmd,
            vec!["gunicorn", "--bind", ":8080", "hello.wsgi:application"]
        );
        assert_eq!(web.env["WORKERS"], "4");
        let g = web.guest.as_ref().unwrap();
        assert_eq!((g.cpus, g.memory_mb), (2, 1024));
        assert_eq!(web.services.len(), 1);
        let s = &web.services[0];
        assert_eq!(s.internal_port, 8080);
        assert_eq!(s.autostop, Some(Autostop::Stop));
        assert_eq!(s.autostart, Some(true));
        assert_eq!(s.min_machines_running, Some(1));
        assert_eq!(s.concurrency.as_ref().unwrap().hard_limit, Some(250));
        assert_eq!(s.checks[0].path.as_deref(), Some("/healthz"));
        assert_eq!(s.checks[0].kind.as_deref(), Some("http"));
        assert_eq!(s.ports[0].force_https, Some(true));
        assert!(web.checks.contains_key("status"));
        let (sig, t) = web.stop_signal_and_timeout();
        assert_eq!((sig, t), (Signal::TERM, Duration::from_secs(10)));
        assert_eq!(web.metadata[crate::META_GROUP], "web");
        assert!(web.restart.is_none());

        let worker = c.machine_config("worker").unwrap();
        assert_eq!(worker.services[0].internal_port, 5432);
        assert_eq!(
            worker.services[0].checks[0].interval.unwrap().get(),
            Duration::from_secs(15)
        );
        let g = worker.guest.as_ref().unwrap();
        assert_eq!((g.cpus, g.memory_mb), (1, 512));
        assert_eq!(worker.restart.unwrap().policy, RestartPolicyKind::Always);
        assert!(worker.checks.is_empty());
    }

    #[test]
    fn process_driver_runs_the_commands() {
        let l = parse(
            "bazaar.toml",
            "app = \"p\"\n[build]\ndriver = \"process\"\n[processes]\napp = [\"python3\", \"-m\", \"http.server\"]\n",
        )
        .unwrap();
        let cfg = l.config.machine_config("app").unwrap();
        assert_eq!(cfg.driver.as_deref(), Some("process"));
        assert_eq!(cfg.init.unwrap().exec, vec!["python3", "-m", "http.server"]);
        assert!(l.warnings.is_empty(), "{:?}", l.warnings);
    }

    fn error(text: &str) -> ConfigError {
        parse("fly.toml", text).unwrap_err()
    }

    #[test]
    fn broken_files_say_file_line_and_what() {
        let e = error("app = \"x\"\n[build]\nimage = \"i\"\n[deploy]\nstrategy = \"fast\"\n");
        assert_eq!((e.line, e.col), (Some(5), Some(12)), "{e}");
        assert!(e.to_string().starts_with("fly.toml:5:12: "), "{e}");
        assert!(e.message.contains("fast"), "{e}");

        let e =
            error("app = \"x\"\n[build]\nimage = \"i\"\n\n[[vm]]\n  size = \"shared-cpu-3x\"\n");
        assert_eq!(e.line, Some(6), "{e}");
        assert!(e.message.contains("shared-cpu-3x"), "{e}");

        let e = error(
            "app = \"x\"\n[build]\nimage = \"i\"\n[http_service]\ninternal_port = \"eighty\"\n",
        );
        assert_eq!(e.line, Some(5), "{e}");

        let e = error("app = \"x\"\nkill_timeout = \"forever\"\n[build]\nimage = \"i\"\n");
        assert_eq!(e.line, Some(2), "{e}");
        assert!(e.message.contains("forever"), "{e}");

        let e = error("app = \"x\"\n[build\nimage = \"i\"\n");
        assert_eq!(e.line, Some(2), "{e}");

        let e = error("app = \"x\"\n[build]\nimage = \"i\"\n[[vm]]\nmemory = \"lots\"\n");
        assert_eq!(e.line, Some(5), "{e}");

        let e = error("[build]\nimage = \"i\"\n");
        assert!(e.message.contains("`app`"), "{e}");

        let e = error("app = \"x\"\n[build]\ndriver = \"process\"\n");
        assert!(e.message.contains("[processes]"), "{e}");
    }

    #[test]
    fn command_lines_split_like_a_shell() {
        assert_eq!(
            split_command(r#"sh -c 'echo "hi there"' a\ b"#).unwrap(),
            vec!["sh", "-c", "echo \"hi there\"", "a b"]
        );
        assert!(split_command("sh 'open").is_err());
    }

    #[test]
    fn replace_on_host_failure_opts_every_machine_in() {
        let l = parse(
            "fly.toml",
            "app = \"x\"\n[build]\nimage = \"i\"\n[deploy]\nreplace_on_host_failure = true\n",
        )
        .unwrap();
        assert!(l.warnings.is_empty(), "{:?}", l.warnings);
        let cfg = l.config.machine_config("app").unwrap();
        assert_eq!(
            cfg.metadata[bazaar_types::replacement::METADATA_KEY],
            "true"
        );
        assert!(bazaar_types::replacement::validate(&cfg).is_ok());
    }
}
