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
    /// Process groups: name → command line (older templates write `processes = []`).
    #[serde(default, deserialize_with = "values::process_groups")]
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
    /// Older templates write `allowed_public_ports = []`; only empty.
    #[serde(default)]
    pub allowed_public_ports: Vec<u16>,
}

/// `[build]`: an image, or `driver = "process"` (bazaar) to run `[processes]` commands.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Build {
    #[serde(default)]
    pub image: Option<String>,
    #[serde(default)]
    pub driver: Option<Driver>,
    /// The Dockerfile `bazaar deploy` builds the image from (relative to the config file;
    /// a `Dockerfile` beside it is used when `[build]` names no image).
    #[serde(default)]
    pub dockerfile: Option<String>,
    /// The Dockerfile stage to build (`build-target`).
    #[serde(default, rename = "build-target")]
    pub build_target: Option<String>,
    /// Build arguments (`[build.args]`).
    #[serde(default)]
    pub args: BTreeMap<String, String>,
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
    /// Older templates write `script_checks = []`; bazaar runs none, so only empty.
    #[serde(default)]
    pub script_checks: Vec<serde_json::Value>,
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
    /// Restart the machine after this many failures (older templates): bazaar's checks
    /// never restart a machine, so only 0.
    #[serde(default)]
    pub restart_limit: Option<u32>,
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

/// `[[vm]]`: a size preset, overridden by `cpus`, `memory`, `cpu_kind`; and `runtime`
/// (bazaar: `config.runtime`, one of process, runc, gvisor, microvm).
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
    /// bazaar extension: the machines' priority class (`batch`, `default`, `critical`;
    /// docs/POLICY.md), set as `config.priority`.
    #[serde(default)]
    pub priority: Option<bazaar_types::priority::Priority>,
    /// bazaar extension: the machines' placement policy on host labels (`constraints`,
    /// `affinities`, `spread`; docs/POLICY.md), set as `config.placement`.
    #[serde(default)]
    pub placement: Option<bazaar_types::placement_policy::PlacementPolicy>,
    #[serde(default)]
    pub processes: Vec<String>,
    #[serde(default)]
    pub runtime: Option<String>,
    /// bazaar extension: one machine of the group on every host meeting its `placement`
    /// constraints, hosts that join later included (docs/POLICY.md "Per-host machines"),
    /// set as `metadata.bazaar_per_host`; a deploy creates the first and updates them all.
    #[serde(default)]
    pub per_host: Option<bool>,
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
    load_with(path, &Overrides::default())
}

/// What the command line sets over the file (flyctl's `deploy --image`).
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// The image to run instead of `[build] image` (a file without one, or one that names a
    /// Dockerfile to build, then deploys this image).
    pub image: Option<String>,
    /// The Dockerfile to build when `[build]` names neither an image nor a Dockerfile (a
    /// `Dockerfile` found beside the config file).
    pub default_dockerfile: Option<String>,
}

/// Loads the config file at `path` as [`load`] does, with `overrides` applied before it is
/// checked.
pub fn load_with(path: &std::path::Path, overrides: &Overrides) -> Result<Loaded, ConfigError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        file: file.clone(),
        line: None,
        col: None,
        message: format!("cannot read: {e}"),
    })?;
    let dir = path.parent().unwrap_or(std::path::Path::new("."));
    let mut overrides = overrides.clone();
    if dir.join("Dockerfile").is_file() {
        overrides
            .default_dockerfile
            .get_or_insert_with(|| "Dockerfile".into());
    }
    let mut loaded = parse_with(&file, &text, &overrides)?;
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
    parse_with(file, text, &Overrides::default())
}

/// Parses config text as [`parse`] does, with `overrides` applied before it is checked.
pub fn parse_with(file: &str, text: &str, overrides: &Overrides) -> Result<Loaded, ConfigError> {
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
    let mut config: AppConfig =
        serde_ignored::deserialize(de, |path| ignored.push(path.to_string()))
            .map_err(|e: toml::de::Error| at(e.span(), e.message().to_string()))?;
    if let Some(image) = &overrides.image {
        if config.build.driver == Some(Driver::Process) {
            return Err(at(
                None,
                format!(
                    "--image {image} runs an image, but [build] driver = \"process\" runs commands: remove one"
                ),
            ));
        }
        if image.trim().is_empty() || image.chars().any(char::is_whitespace) {
            return Err(at(
                None,
                format!("--image {image:?} is not an image reference"),
            ));
        }
        config.build.image = Some(image.clone());
    }
    if config.build.image.is_none()
        && config.build.dockerfile.is_none()
        && config.build.driver != Some(Driver::Process)
    {
        config.build.dockerfile = overrides.default_dockerfile.clone();
    }
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
    if !process && c.build.image.is_none() && c.build.dockerfile.is_none() {
        return Err(
            "[build] needs an `image` or a `dockerfile` to build it from (or a Dockerfile beside the config file), or `driver = \"process\"` with commands in [processes]"
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
        if let Some(n) = ch.restart_limit.filter(|n| *n > 0) {
            return Err(format!(
                "a service check's `restart_limit = {n}` cannot be honoured: failing checks never restart a machine (as on Fly Machines); remove it or set it to 0"
            ));
        }
    }
    if c.services.iter().any(|s| !s.script_checks.is_empty()) {
        return Err("`services.script_checks` cannot be honoured: bazaar runs no script checks; remove them".into());
    }
    if !c.experimental.allowed_public_ports.is_empty() {
        return Err("`experimental.allowed_public_ports` cannot be honoured: public ports are the services' ports; remove it".into());
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
mod tests;
