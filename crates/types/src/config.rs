//! `MachineConfig` and its parts, spelled as the Fly Machines API spells them
//! (reference/fly.md §2.5). Fields of Fly's that bazaar has no type for are kept (`extra`)
//! and echoed back; which keys a config may carry at all, and which only at their default
//! (those bazaar does not act on), is [`crate::config_fields`]'s to say.
//!
//! bazaar extensions: `runtime` (`process`, `runc`, `gvisor`, `microvm`: what runs the
//! machine; it names the driver), `driver` (`"process"` runs `init.exec` or `init.entrypoint` + `init.cmd`
//! as a supervised process on the host; `"oci"` runs `image`), `init.user`, `priority`
//! (`crate::priority`) and `placement` (`crate::placement_policy`).

use crate::duration::GoDuration;
use crate::guest::Guest;
use crate::signal::Signal;
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;

/// A machine's configuration: one version of it is named by an `instance_id`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = close_config)]
pub struct MachineConfig {
    /// OCI image reference; for process machines, a label (defaults to `"process"`).
    #[serde(default)]
    pub image: String,
    /// bazaar extension: which driver runs the machine (`process`, or `oci` for images).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// bazaar extension: what runs the machine, and so what it shares with the host:
    /// `process`, `runc` (an image under runc: driver `oci`), `gvisor` (an image under
    /// gVisor's `runsc`), `microvm` (an image in a QEMU microVM). See [`RUNTIMES`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest: Option<Guest>,
    /// Deprecated preset name (`shared-cpu-1x`); mutually exclusive with `guest`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^(shared-cpu-(1|2|4|6|8)x|performance-(1|2|4|8|16)x)$"))]
    pub size: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init: Option<InitConfig>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<MachineService>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub checks: BTreeMap<String, CheckConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<RestartConfig>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub auto_destroy: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_config: Option<StopConfig>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "mounts_schema")]
    pub mounts: Vec<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileConfig>,
    /// Machines of the same app (ids) this one stands by for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(regex(pattern = r"^[a-z0-9]{1,64}$")))]
    pub standbys: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    /// A Prometheus endpoint of the machine that its agent scrapes (docs/METRICS.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<MetricsConfig>,
    /// bazaar extension: the machine's priority class (`batch`, `default`, `critical`;
    /// absent is `default`). A machine may displace machines of a lower class when no host
    /// has room for it (docs/POLICY.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<crate::priority::Priority>,
    /// bazaar extension: where the machine may go and what it prefers, by the operator's
    /// host labels: `constraints`, `affinities`, `spread` (docs/POLICY.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<crate::placement_policy::PlacementPolicy>,
    /// Fly's fields kept untyped (`rootfs`, and those bazaar takes only at their default),
    /// echoed back unchanged.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// `metrics`: where the machine serves Prometheus metrics, on its own address.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// The port the machine serves them on (on its own address).
    #[schemars(range(min = 1))]
    pub port: u16,
    /// The path of the page (default `/metrics`): absolute, no space or control character.
    #[serde(default = "default_metrics_path")]
    #[schemars(regex(pattern = r"^/[^\x00-\x20\x7f]*$"))]
    pub path: String,
    /// Fly's: scrape over HTTPS. Not supported: only `false`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[schemars(schema_with = "false_only")]
    pub https: bool,
}

fn default_metrics_path() -> String {
    "/metrics".into()
}

fn false_only(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"description": "Not supported: only `false`.", "const": false})
}

/// How the machine's main process is started.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = close_init)]
pub struct InitConfig {
    /// Replaces everything: the exact argv to run.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "str_or_vec"
    )]
    #[schemars(schema_with = "str_or_vec_schema")]
    pub exec: Vec<String>,
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "str_or_vec"
    )]
    #[schemars(schema_with = "str_or_vec_schema")]
    pub entrypoint: Vec<String>,
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "str_or_vec"
    )]
    #[schemars(schema_with = "str_or_vec_schema")]
    pub cmd: Vec<String>,
    /// bazaar extension: the user to run as (`root`, a name, `uid` or `uid:gid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

impl InitConfig {
    /// The argv the process driver runs: `exec`, else `entrypoint` + `cmd`.
    pub fn argv(&self) -> Vec<String> {
        if !self.exec.is_empty() {
            return self.exec.clone();
        }
        self.entrypoint
            .iter()
            .chain(self.cmd.iter())
            .cloned()
            .collect()
    }
}

/// A service: an internal port the proxy routes to, with its public ports and limits.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = close_service)]
pub struct MachineService {
    #[serde(default = "default_protocol")]
    pub protocol: String,
    pub internal_port: u16,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<MachinePort>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<Concurrency>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autostart: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autostop: Option<Autostop>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_machines_running: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<CheckConfig>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

fn default_protocol() -> String {
    "tcp".into()
}

/// A public port of a service.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = close_port)]
pub struct MachinePort {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_port: Option<u16>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub handlers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub force_https: Option<bool>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// Load limits of a service (`soft_limit` defaults to 20, as on Fly).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Concurrency {
    #[serde(rename = "type", default = "default_concurrency_type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soft_limit: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hard_limit: Option<u32>,
}

fn default_concurrency_type() -> String {
    "connections".into()
}

/// `autostop`: `"off" | "stop" | "suspend"`, also accepted as `false`/`true`. As Fly does,
/// `off` and `stop` are written back as `false` and `true`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Autostop {
    Off,
    Stop,
    Suspend,
}

impl Serialize for Autostop {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Autostop::Off => s.serialize_bool(false),
            Autostop::Stop => s.serialize_bool(true),
            Autostop::Suspend => s.serialize_str("suspend"),
        }
    }
}

impl<'de> Deserialize<'de> for Autostop {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bool(bool),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Bool(false) => Ok(Autostop::Off),
            Raw::Bool(true) => Ok(Autostop::Stop),
            Raw::Text(t) => match t.as_str() {
                "off" | "false" => Ok(Autostop::Off),
                "stop" | "true" => Ok(Autostop::Stop),
                "suspend" => Ok(Autostop::Suspend),
                other => Err(serde::de::Error::custom(format!(
                    "autostop must be off, stop or suspend, got {other:?}"
                ))),
            },
        }
    }
}

impl JsonSchema for Autostop {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Autostop".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "Whether the proxy stops idle machines: `\"off\"`, `\"stop\"` or `\"suspend\"`, or a boolean (`false` = off, `true` = stop). `off` and `stop` are written back as `false` and `true`.",
            "oneOf": [
                {"type": "boolean"},
                {"type": "string", "enum": ["off", "stop", "suspend"]}
            ]
        })
    }
}

/// A health check (top-level `checks` map, or a service's `checks`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = close_check)]
pub struct CheckConfig {
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<GoDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<GoDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_period: Option<GoDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// Restart policy: `no`, `always`, `on-failure` (flyctl's `on-fail` accepted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RestartPolicyKind {
    #[serde(rename = "no")]
    No,
    #[serde(rename = "always")]
    Always,
    #[serde(rename = "on-failure", alias = "on-fail", alias = "on_failure")]
    OnFailure,
}

/// `restart`: the policy and, for `on-failure`, how many retries (default 10 within 5 minutes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RestartConfig {
    #[serde(default = "default_policy")]
    pub policy: RestartPolicyKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_retries: Option<u32>,
}

fn default_policy() -> RestartPolicyKind {
    RestartPolicyKind::OnFailure
}

/// Graceful stop: the signal to send, then SIGKILL after `timeout`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StopConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<Signal>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<GoDuration>,
}

/// A file written into the machine at boot.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = close_file)]
pub struct FileConfig {
    pub guest_path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

fn close_config(schema: &mut schemars::Schema) {
    crate::config_fields::close_schema(schema, crate::config_fields::CONFIG);
}
fn close_init(schema: &mut schemars::Schema) {
    crate::config_fields::close_schema(schema, crate::config_fields::INIT_FIELDS);
}
fn close_service(schema: &mut schemars::Schema) {
    crate::config_fields::close_schema(schema, crate::config_fields::SERVICE_FIELDS);
}
fn close_port(schema: &mut schemars::Schema) {
    crate::config_fields::close_schema(schema, crate::config_fields::PORT_FIELDS);
}
fn close_check(schema: &mut schemars::Schema) {
    crate::config_fields::close_schema(schema, crate::config_fields::CHECK_FIELDS);
}
fn close_file(schema: &mut schemars::Schema) {
    crate::config_fields::close_schema(schema, crate::config_fields::FILE_FIELDS);
}

/// Schema of `mounts`: volume mounts, as Fly spells them (one at most).
fn mounts_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut mount = schemars::json_schema!({
        "type": "object",
        "required": ["volume", "path"],
        "properties": {
            "volume": {"type": "string", "description": "The volume's id."},
            "path": {"type": "string", "description": "Where it is mounted: an absolute path."},
            "name": {"type": ["string", "null"], "description": "The volume's name (a label)."},
            "size_gb": {"type": ["integer", "null"], "description": "The volume's size (a label)."}
        }
    });
    crate::config_fields::close_schema(&mut mount, crate::config_fields::MOUNT_FIELDS);
    schemars::json_schema!({"type": "array", "items": mount, "maxItems": 1})
}

/// Schema of a field read by [`str_or_vec`]: one string, a list of strings, or null.
fn str_or_vec_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "A list of strings; a single string is taken as a one-element list.",
        "oneOf": [
            {"type": "array", "items": {"type": "string"}},
            {"type": "string"},
            {"type": "null"}
        ]
    })
}

fn str_or_vec<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        One(String),
        Many(Vec<String>),
        Null(()),
    }
    Ok(match Raw::deserialize(d)? {
        Raw::One(s) => vec![s],
        Raw::Many(v) => v,
        Raw::Null(()) => Vec::new(),
    })
}

/// The runtimes a machine may ask for in `config.runtime`, weakest boundary first.
pub const RUNTIMES: [&str; 4] = ["process", "runc", "gvisor", "microvm"];

/// The default stop timeout (fly.toml `kill_timeout` default, 5 s) and its maximum (300 s).
pub const DEFAULT_STOP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// Upper bound for stop timeouts, as on Fly.
pub const MAX_STOP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

impl MachineConfig {
    /// The machine's priority class (`default` when the config names none).
    pub fn priority(&self) -> crate::priority::Priority {
        self.priority.unwrap_or_default()
    }

    /// Fly's `config.rootfs.size_gb`: the size of the machine's writable space, when the
    /// config asks for one (a whole number of GB, 1 to 1024).
    pub fn rootfs_size_gb(&self) -> Result<Option<u64>, String> {
        let Some(size) = self.extra.get("rootfs").and_then(|r| r.get("size_gb")) else {
            return Ok(None);
        };
        match size.as_u64() {
            _ if size.is_null() => Ok(None),
            Some(gb @ 1..=1024) => Ok(Some(gb)),
            _ => Err(format!(
                "config.rootfs.size_gb must be a whole number of GB from 1 to 1024, got {size}"
            )),
        }
    }

    /// The driver that runs this machine: the one `runtime` names (`runc` is driver `oci`),
    /// else `process` when set so or when the config has a command and no image; otherwise
    /// `oci`.
    pub fn driver(&self) -> &str {
        match (self.runtime.as_deref(), self.driver.as_deref()) {
            (Some("runc"), _) => "oci",
            (Some(r), _) => r,
            (None, Some(d)) => d,
            (None, None) if self.image.is_empty() || self.image == "process" => "process",
            (None, None) => "oci",
        }
    }

    /// Whether this machine runs an image in a container or sandbox (drivers `oci`,
    /// `gvisor`, `microvm`), rather than a command on the host (`process`).
    pub fn runs_image(&self) -> bool {
        matches!(self.driver(), "oci" | "gvisor" | "microvm")
    }

    /// The runtime of this machine (one of [`RUNTIMES`] once [`Self::check_runtime`]
    /// passed): `runtime` when set, else the one its driver means (driver `oci` is `runc`).
    pub fn runtime(&self) -> &str {
        match self.driver() {
            "oci" => "runc",
            d => d,
        }
    }

    /// Whether `runtime` names a runtime, agrees with `driver` when both are set, and has
    /// the image an image runtime needs.
    pub fn check_runtime(&self) -> Result<(), String> {
        let Some(runtime) = self.runtime.as_deref() else {
            return Ok(());
        };
        if !RUNTIMES.contains(&runtime) {
            return Err(format!(
                "unknown config.runtime {runtime:?}: one of {}",
                RUNTIMES.join(", ")
            ));
        }
        if let Some(driver) = self.driver.as_deref() {
            if driver != self.driver() {
                return Err(format!(
                    "config.driver {driver:?} disagrees with config.runtime {runtime:?} \
                     (driver {:?}); set only config.runtime",
                    self.driver()
                ));
            }
        }
        if runtime != "process" && (self.image.is_empty() || self.image == "process") {
            return Err(format!(
                "config.runtime {runtime:?} runs an image: set config.image"
            ));
        }
        Ok(())
    }

    /// The stop signal (default SIGINT, as Fly) and timeout (default 5 s, max 300 s).
    pub fn stop_signal_and_timeout(&self) -> (Signal, std::time::Duration) {
        let stop = self.stop_config.clone().unwrap_or_default();
        let signal = stop.signal.unwrap_or(Signal::INT);
        let timeout = stop
            .timeout
            .map(|t| t.get())
            .unwrap_or(DEFAULT_STOP_TIMEOUT)
            .min(MAX_STOP_TIMEOUT);
        (signal, timeout)
    }

    /// The restart policy with Fly's defaults filled in.
    pub fn restart_policy(&self) -> RestartConfig {
        let mut r = self.restart.unwrap_or(RestartConfig {
            policy: RestartPolicyKind::OnFailure,
            max_retries: None,
        });
        if r.policy == RestartPolicyKind::OnFailure && r.max_retries.is_none() {
            r.max_retries = Some(10);
        }
        r
    }
}

#[cfg(test)]
mod tests {

    fn with_runtime(runtime: &str, image: &str) -> MachineConfig {
        MachineConfig {
            runtime: Some(runtime.into()),
            image: image.into(),
            ..MachineConfig::default()
        }
    }

    #[test]
    fn a_runtime_names_the_driver_and_the_driver_names_a_runtime() {
        for (runtime, driver) in [
            ("process", "process"),
            ("runc", "oci"),
            ("gvisor", "gvisor"),
            ("microvm", "microvm"),
        ] {
            let cfg = with_runtime(runtime, "docker.io/library/busybox:latest");
            assert_eq!(cfg.driver(), driver);
            assert_eq!(cfg.runtime(), runtime);
        }
        let image = MachineConfig {
            image: "busybox".into(),
            ..MachineConfig::default()
        };
        assert_eq!(image.runtime(), "runc");
        assert_eq!(MachineConfig::default().runtime(), "process");
        let cfg: MachineConfig =
            serde_json::from_value(serde_json::json!({"image": "busybox", "runtime": "gvisor"}))
                .unwrap();
        assert_eq!(cfg.driver(), "gvisor");
        assert_eq!(serde_json::to_value(&cfg).unwrap()["runtime"], "gvisor");
    }

    #[test]
    fn runtimes_are_checked() {
        let err = with_runtime("kata", "busybox").check_runtime().unwrap_err();
        assert!(
            err.contains("unknown config.runtime") && err.contains("gvisor"),
            "{err}"
        );
        let err = with_runtime("gvisor", "").check_runtime().unwrap_err();
        assert!(err.contains("set config.image"), "{err}");
        let mut cfg = with_runtime("gvisor", "busybox");
        cfg.driver = Some("process".into());
        let err = cfg.check_runtime().unwrap_err();
        assert!(err.contains("disagrees"), "{err}");
        cfg.runtime = Some("runc".into());
        cfg.driver = Some("oci".into());
        cfg.check_runtime().unwrap();
        with_runtime("process", "").check_runtime().unwrap();
        MachineConfig::default().check_runtime().unwrap();
    }

    use super::*;

    #[test]
    fn rootfs_size_gb_is_a_whole_number_of_gb_or_refused() {
        let config = |rootfs: serde_json::Value| -> MachineConfig {
            serde_json::from_value(serde_json::json!({"image": "process", "rootfs": rootfs}))
                .unwrap()
        };
        assert_eq!(MachineConfig::default().rootfs_size_gb(), Ok(None));
        assert_eq!(
            config(serde_json::json!({"persist": "never"})).rootfs_size_gb(),
            Ok(None)
        );
        assert_eq!(
            config(serde_json::json!({"size_gb": 2})).rootfs_size_gb(),
            Ok(Some(2))
        );
        for bad in [
            serde_json::json!(0),
            serde_json::json!(-1),
            serde_json::json!(1.5),
            serde_json::json!("8"),
            serde_json::json!(1025),
        ] {
            let err = config(serde_json::json!({"size_gb": bad}))
                .rootfs_size_gb()
                .unwrap_err();
            assert!(err.contains("config.rootfs.size_gb"), "{err}");
        }
    }

    #[test]
    fn unknown_fields_survive_a_round_trip() {
        let json = r#"{"image":"nginx","dns":{"skip_registration":true},"guest":{"cpus":1,"memory_mb":256,"cpu_kind":"shared"}}"#;
        let cfg: MachineConfig = serde_json::from_str(json).unwrap();
        let back = serde_json::to_value(&cfg).unwrap();
        assert_eq!(back["dns"]["skip_registration"], true);
        assert_eq!(cfg.driver(), "oci");
    }

    /// Found by fuzzing: without serde_json's exact float parsing, a number in an unknown
    /// field changed by one unit in the last place each time the config went through JSON.
    #[test]
    fn unknown_numbers_survive_round_trips_exactly() {
        let json = format!(
            r#"{{"image":"x","guest":{{"cpus":1,"x":{}56}}}}"#,
            "2".repeat(110)
        );
        let first: MachineConfig = serde_json::from_str(&json).unwrap();
        let again: MachineConfig =
            serde_json::from_str(&serde_json::to_string(&first).unwrap()).unwrap();
        assert_eq!(again, first);
    }

    #[test]
    fn autostop_reads_bools_and_strings_and_writes_fly_style() {
        let s: MachineService =
            serde_json::from_str(r#"{"internal_port":8080,"autostop":"stop"}"#).unwrap();
        assert_eq!(s.autostop, Some(Autostop::Stop));
        assert_eq!(serde_json::to_value(&s).unwrap()["autostop"], true);
        let s: MachineService =
            serde_json::from_str(r#"{"internal_port":8080,"autostop":"suspend"}"#).unwrap();
        assert_eq!(serde_json::to_value(&s).unwrap()["autostop"], "suspend");
        let s: MachineService =
            serde_json::from_str(r#"{"internal_port":8080,"autostop":false}"#).unwrap();
        assert_eq!(s.autostop, Some(Autostop::Off));
    }

    #[test]
    fn restart_policy_defaults_and_aliases() {
        let c: MachineConfig = serde_json::from_str(r#"{"restart":{"policy":"on-fail"}}"#).unwrap();
        assert_eq!(c.restart_policy().max_retries, Some(10));
        let c = MachineConfig::default();
        assert_eq!(c.restart_policy().policy, RestartPolicyKind::OnFailure);
        let (sig, t) = c.stop_signal_and_timeout();
        assert_eq!(sig, Signal::INT);
        assert_eq!(t, DEFAULT_STOP_TIMEOUT);
    }

    #[test]
    fn init_argv_prefers_exec() {
        let i: InitConfig =
            serde_json::from_str(r#"{"entrypoint":["/bin/sh","-c"],"cmd":"echo hi"}"#).unwrap();
        assert_eq!(i.argv(), vec!["/bin/sh", "-c", "echo hi"]);
        let i: InitConfig = serde_json::from_str(r#"{"exec":["sleep","1"],"cmd":["x"]}"#).unwrap();
        assert_eq!(i.argv(), vec!["sleep", "1"]);
    }
}
