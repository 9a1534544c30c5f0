//! Which keys a machine config may carry, at every depth: Fly's machine config
//! (reference/fly.md §2.5, `fly.MachineConfig` and its nested types) plus bazaar's own
//! (`driver`, `init.user`). A key bazaar acts on is taken; a key of Fly's that bazaar does
//! not act on is taken only at its default (null, `false`, `0`, `""`, `[]`, `{}`, or an
//! object whose keys are all at theirs), since real clients send such defaults; any other
//! value is refused naming the field. A key no Fly schema defines is refused naming it, so a
//! typo is caught. [`check`] judges a config; [`close_schema`] makes the OpenAPI document
//! say the same (`additionalProperties: false`, the unused keys default-only).

use crate::config::MachineConfig;
use serde_json::{json, Map, Value};

/// The shape of a key's value, as far as its keys are checked.
#[derive(Debug, Clone, Copy)]
pub enum Shape {
    /// A value whose keys are not looked into (a scalar, a map of names, a typed value).
    Any,
    /// An object with these keys.
    Object(&'static [Field]),
    /// A list of such objects.
    List(&'static [Field]),
    /// A map from names to such objects.
    Map(&'static [Field]),
}

/// One key of a config object.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    pub name: &'static str,
    pub shape: Shape,
    /// Whether bazaar acts on it; an unused key is taken only at its default.
    pub used: bool,
    /// For a used key kept untyped (in an `extra` map): its schema in the document.
    pub doc: Option<fn() -> Value>,
}

const fn used(name: &'static str, shape: Shape) -> Field {
    Field {
        name,
        shape,
        used: true,
        doc: None,
    }
}

const fn unused(name: &'static str, shape: Shape) -> Field {
    Field {
        name,
        shape,
        used: false,
        doc: None,
    }
}

use Shape::{Any, List, Map as MapOf, Object};

const HEADER: &[Field] = &[used("name", Any), used("values", Any)];

const CHECK: &[Field] = &[
    used("type", Any),
    used("port", Any),
    used("interval", Any),
    used("timeout", Any),
    used("grace_period", Any),
    used("method", Any),
    used("path", Any),
    used("headers", List(HEADER)),
    unused("protocol", Any),
    unused("tls_server_name", Any),
    unused("tls_skip_verify", Any),
    unused("kind", Any),
];

const HTTP_RESPONSE: &[Field] = &[unused("headers", Any), unused("pristine", Any)];

const REPLAY_CACHE: &[Field] = &[
    unused("path_prefix", Any),
    unused("ttl_seconds", Any),
    unused("type", Any),
    unused("name", Any),
    unused("allow_bypass", Any),
];

const HTTP_OPTIONS: &[Field] = &[
    unused("compress", Any),
    unused("h2_backend", Any),
    unused("idle_timeout", Any),
    unused("headers_read_timeout", Any),
    unused("response", Object(HTTP_RESPONSE)),
    unused("replay_cache", List(REPLAY_CACHE)),
];

const TLS_OPTIONS: &[Field] = &[
    unused("alpn", Any),
    unused("versions", Any),
    unused("default_self_signed", Any),
];

const PROXY_PROTO: &[Field] = &[unused("version", Any)];

const PORT: &[Field] = &[
    used("port", Any),
    used("start_port", Any),
    used("end_port", Any),
    used("handlers", Any),
    used("force_https", Any),
    unused("http_options", Object(HTTP_OPTIONS)),
    unused("tls_options", Object(TLS_OPTIONS)),
    unused("proxy_proto_options", Object(PROXY_PROTO)),
];

const SERVICE: &[Field] = &[
    used("protocol", Any),
    used("internal_port", Any),
    used("ports", List(PORT)),
    used("concurrency", Any),
    used("autostart", Any),
    used("autostop", Any),
    used("min_machines_running", Any),
    used("checks", List(CHECK)),
    unused("force_instance_key", Any),
    unused("force_instance_description", Any),
];

const GUEST: &[Field] = &[
    used("cpu_kind", Any),
    used("cpus", Any),
    used("memory_mb", Any),
    // Refused as capacity no host has (`insufficient_capacity`), when asked for.
    unused("gpus", Any),
    unused("gpu_kind", Any),
    unused("max_memory_mb", Any),
    unused("host_dedication_id", Any),
    unused("kernel_args", Any),
    unused("persist_rootfs", Any),
    unused("required_host_features", Any),
];

const INIT: &[Field] = &[
    used("exec", Any),
    used("entrypoint", Any),
    used("cmd", Any),
    used("user", Any),
    unused("tty", Any),
    unused("swap_size_mb", Any),
    unused("kernel_args", Any),
];

const MOUNT: &[Field] = &[
    used("volume", Any),
    used("path", Any),
    // Labels: the volume's name and size are the volume's (deploy reads them).
    used("name", Any),
    used("size_gb", Any),
    unused("encrypted", Any),
    unused("extend_threshold_percent", Any),
    unused("add_size_gb", Any),
    unused("add_size_percent", Any),
    unused("min_add_size_gb", Any),
    unused("size_gb_limit", Any),
];

const FILE: &[Field] = &[
    used("guest_path", Any),
    used("raw_value", Any),
    used("mode", Any),
    unused("secret_name", Any),
    unused("image_config", Any),
];

const ROOTFS: &[Field] = &[
    Field {
        doc: Some(|| {
            json!({"description": "The size of the machine's writable space, in GB.",
                   "type": ["integer", "null"], "minimum": 1, "maximum": 1024})
        }),
        ..used("size_gb", Any)
    },
    unused("persist", Any),
];

const DNS_OPTION: &[Field] = &[unused("name", Any), unused("value", Any)];
const DNS_FORWARD: &[Field] = &[unused("basename", Any), unused("addr", Any)];

const DNS: &[Field] = &[
    unused("skip_registration", Any),
    unused("nameservers", Any),
    unused("searches", Any),
    unused("options", List(DNS_OPTION)),
    unused("dns_forward_rules", List(DNS_FORWARD)),
    unused("hostname", Any),
    unused("hostname_fqdn", Any),
];

const ENV_FROM: &[Field] = &[unused("env_var", Any), unused("field_ref", Any)];
const SECRET: &[Field] = &[unused("env_var", Any), unused("name", Any)];

const PROCESS: &[Field] = &[
    unused("exec", Any),
    unused("entrypoint", Any),
    unused("cmd", Any),
    unused("env", Any),
    unused("env_from", List(ENV_FROM)),
    unused("user", Any),
    unused("secrets", List(SECRET)),
    unused("ignore_app_secrets", Any),
];

const STATIC: &[Field] = &[
    unused("guest_path", Any),
    unused("url_prefix", Any),
    unused("tigris_bucket", Any),
    unused("index_document", Any),
];

/// The keys of a machine config.
pub const CONFIG: &[Field] = &[
    used("image", Any),
    used("driver", Any),
    used("runtime", Any),
    used("guest", Object(GUEST)),
    used("size", Any),
    used("init", Object(INIT)),
    used("env", Any),
    used("metadata", Any),
    used("services", List(SERVICE)),
    used("checks", MapOf(CHECK)),
    used("restart", Any),
    used("auto_destroy", Any),
    used("stop_config", Any),
    used("mounts", List(MOUNT)),
    used("files", List(FILE)),
    used("standbys", Any),
    used("schedule", Any),
    used("metrics", Any),
    used("priority", Any),
    used("placement", Any),
    Field {
        doc: Some(|| {
            json!({"description": "The machine's root filesystem: `size_gb` sizes its writable space.",
                   "type": ["object", "null"]})
        }),
        ..used("rootfs", Object(ROOTFS))
    },
    unused("dns", Object(DNS)),
    unused("processes", List(PROCESS)),
    unused("statics", List(STATIC)),
    unused("disable_machine_autostart", Any),
    unused("cache_drive", Object(&[unused("size_mb", Any)])),
    unused("spot", Object(&[unused("max_price_fraction", Any)])),
    unused("containers", Any),
    unused("volumes", Any),
];

/// The keys of a service check (`services[].checks[]`, the values of `checks`).
pub const CHECK_FIELDS: &[Field] = CHECK;
/// The keys of `guest`.
pub const GUEST_FIELDS: &[Field] = GUEST;
/// The keys of `init`.
pub const INIT_FIELDS: &[Field] = INIT;
/// The keys of a service.
pub const SERVICE_FIELDS: &[Field] = SERVICE;
/// The keys of a service's port.
pub const PORT_FIELDS: &[Field] = PORT;
/// The keys of a file.
pub const FILE_FIELDS: &[Field] = FILE;
/// The keys of a mount.
pub const MOUNT_FIELDS: &[Field] = MOUNT;

/// Refuses a key no Fly schema defines, or a key bazaar does not act on set to other than
/// its default; the message names the field (`config.services[0].ports[1].tls_options`).
pub fn check(config: &MachineConfig) -> Result<(), String> {
    let value = serde_json::to_value(config).map_err(|e| format!("config: {e}"))?;
    check_value(&value)
}

/// [`check`] of a guest size given alone (`compute` of a placement or a volume): its keys
/// are those of a config's `guest`.
pub fn check_guest(guest: &crate::guest::Guest, path: &str) -> Result<(), String> {
    let value = serde_json::to_value(guest).map_err(|e| format!("{path}: {e}"))?;
    check_object(&value, GUEST, path)
}

/// [`check`] of a config as JSON.
pub fn check_value(config: &Value) -> Result<(), String> {
    check_object(config, CONFIG, "config")
}

fn check_object(value: &Value, fields: &[Field], path: &str) -> Result<(), String> {
    let Some(object) = value.as_object() else {
        return Ok(()); // Its type is checked where it is read.
    };
    for (key, v) in object {
        let Some(field) = fields.iter().find(|f| f.name == key) else {
            return Err(format!(
                "{path}.{key} is not a field of a Fly machine config; leave it out"
            ));
        };
        let at = format!("{path}.{key}");
        check_shape(v, field.shape, &at)?;
        if !field.used && !is_default(v, field.shape) {
            return Err(format!(
                "{at} is not supported by bazaar; leave it out (or at its default)"
            ));
        }
    }
    Ok(())
}

fn check_shape(value: &Value, shape: Shape, path: &str) -> Result<(), String> {
    match (shape, value) {
        (Object(fields), _) => check_object(value, fields, path),
        (List(fields), Value::Array(items)) => items
            .iter()
            .enumerate()
            .try_for_each(|(i, item)| check_object(item, fields, &format!("{path}[{i}]"))),
        (MapOf(fields), Value::Object(map)) => map
            .iter()
            .try_for_each(|(name, item)| check_object(item, fields, &format!("{path}.{name}"))),
        _ => Ok(()),
    }
}

/// Whether `value` is the default of a key of `shape`: null; for an object, one whose keys
/// are all at theirs; for a list, an empty one; otherwise also `false`, `0`, `""`, `[]`, `{}`.
pub fn is_default(value: &Value, shape: Shape) -> bool {
    match (shape, value) {
        (_, Value::Null) => true,
        (Object(fields), Value::Object(o)) => o.iter().all(|(k, v)| {
            fields
                .iter()
                .find(|f| f.name == k)
                .is_some_and(|f| is_default(v, f.shape))
        }),
        (Object(_), _) => false,
        (List(_) | MapOf(_), Value::Array(a)) => a.is_empty(),
        (List(_) | MapOf(_), _) => false,
        (Any, Value::Bool(b)) => !b,
        (Any, Value::Number(n)) => n.as_f64() == Some(0.0),
        (Any, Value::String(s)) => s.is_empty(),
        (Any, Value::Array(a)) => a.is_empty(),
        (Any, Value::Object(o)) => o.is_empty(),
    }
}

/// The schema of an unused key: its default values only.
fn default_schema(shape: Shape) -> Value {
    let description = "Fly's; bazaar does not act on it, and takes it only at its default.";
    match shape {
        Object(fields) => json!({
            "description": description,
            "type": ["object", "null"],
            "properties": fields.iter()
                .map(|f| (f.name.to_string(), default_schema(f.shape)))
                .collect::<Map<String, Value>>(),
            "additionalProperties": false,
        }),
        List(_) | MapOf(_) => {
            json!({"description": description, "type": ["array", "null"], "maxItems": 0})
        }
        Any => json!({
            "description": description,
            "anyOf": [
                {"type": "null"},
                {"const": false},
                {"const": 0},
                {"const": ""},
                {"type": "array", "maxItems": 0},
                {"type": "object", "maxProperties": 0},
            ]
        }),
    }
}

/// The schema of a used key kept untyped: its `doc`, with the keys of its object shape.
fn used_schema(field: &Field) -> Value {
    let mut schema = field.doc.map(|doc| doc()).unwrap_or_else(|| json!({}));
    if let Object(fields) = field.shape {
        close_value(&mut schema, fields);
    }
    schema
}

fn close_value(schema: &mut Value, fields: &[Field]) {
    let Some(object) = schema.as_object_mut() else {
        return;
    };
    let properties = object
        .entry("properties")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .expect("properties is an object");
    for field in fields {
        if properties.contains_key(field.name) {
            continue;
        }
        let schema = if field.used {
            used_schema(field)
        } else {
            default_schema(field.shape)
        };
        properties.insert(field.name.to_string(), schema);
    }
    object.insert("additionalProperties".into(), Value::Bool(false));
}

/// Makes a derived object schema say what [`check`] takes: the keys of `fields` it lacks
/// (the unused ones default-only) and no others.
pub fn close_schema(schema: &mut schemars::Schema, fields: &[Field]) {
    let mut value = Value::Object(
        std::mem::take(schema)
            .to_value()
            .as_object()
            .cloned()
            .unwrap_or_default(),
    );
    close_value(&mut value, fields);
    *schema = schemars::Schema::try_from(value).expect("an object is a schema");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(v: Value) -> MachineConfig {
        serde_json::from_value(v).unwrap()
    }

    fn verdict(v: Value) -> Result<(), String> {
        check(&config(v))
    }

    #[test]
    fn unknown_keys_are_refused_at_any_depth_naming_them() {
        for (bad, named) in [
            (json!({"imagee": "x"}), "config.imagee"),
            (json!({"guest": {"cpus": 1, "cpu": 2}}), "config.guest.cpu"),
            (json!({"init": {"exce": ["x"]}}), "config.init.exce"),
            (
                json!({"services": [{"internal_port": 80, "ports": [{"port": 80, "handler": ["http"]}]}]}),
                "config.services[0].ports[0].handler",
            ),
            (
                json!({"checks": {"web": {"type": "tcp", "prot": 1}}}),
                "config.checks.web.prot",
            ),
            (
                json!({"mounts": [{"volume": "vol_x", "path": "/d", "sise_gb": 1}]}),
                "config.mounts[0].sise_gb",
            ),
            (
                json!({"files": [{"guest_path": "/a", "raw": "eA=="}]}),
                "config.files[0].raw",
            ),
            (
                json!({"dns": {"skip_registraton": false}}),
                "config.dns.skip_registraton",
            ),
            (json!({"rootfs": {"size": 1}}), "config.rootfs.size"),
        ] {
            let err = verdict(bad.clone()).unwrap_err();
            assert!(
                err.starts_with(&format!("{named} is not a field")),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn unused_keys_are_refused_when_set_and_taken_at_their_defaults() {
        for (bad, named) in [
            (json!({"containers": "garbage"}), "config.containers"),
            (json!({"containers": [{"name": "a"}]}), "config.containers"),
            (
                json!({"cache_drive": {"size_mb": 100}}),
                "config.cache_drive.size_mb",
            ),
            (
                json!({"guest": {"kernel_args": ["quiet"]}}),
                "config.guest.kernel_args",
            ),
            (
                json!({"guest": {"host_dedication_id": "h"}}),
                "config.guest.host_dedication_id",
            ),
            (json!({"init": {"tty": true}}), "config.init.tty"),
            (
                json!({"init": {"kernel_args": ["x"]}}),
                "config.init.kernel_args",
            ),
            (
                json!({"dns": {"skip_registration": true}}),
                "config.dns.skip_registration",
            ),
            (json!({"processes": [{}]}), "config.processes"),
            (
                json!({"rootfs": {"persist": "always"}}),
                "config.rootfs.persist",
            ),
            (
                json!({"mounts": [{"volume": "vol_x", "path": "/d", "encrypted": true}]}),
                "config.mounts[0].encrypted",
            ),
            (
                json!({"services": [{"internal_port": 80, "ports": [{"port": 443, "tls_options": {"alpn": ["h2"]}}]}]}),
                "config.services[0].ports[0].tls_options.alpn",
            ),
        ] {
            let err = verdict(bad.clone()).unwrap_err();
            assert!(
                err.starts_with(&format!("{named} is not supported")),
                "{bad}: {err}"
            );
        }
        // What flyctl and fly-go send when these are not set.
        verdict(json!({
            "image": "x",
            "init": {"tty": false, "swap_size_mb": null, "kernel_args": []},
            "guest": {"cpus": 1, "memory_mb": 256, "cpu_kind": "shared", "kernel_args": null, "host_dedication_id": ""},
            "dns": {"skip_registration": false, "nameservers": []},
            "containers": [], "cache_drive": null, "processes": null, "statics": [],
            "disable_machine_autostart": false, "metrics": null,
            "rootfs": {"size_gb": 2, "persist": null},
            "mounts": [{"volume": "vol_x", "path": "/d", "name": "data", "size_gb": 1, "encrypted": false}],
        }))
        .unwrap();
    }

    /// Every key of Fly's published `fly.MachineConfig` and its nested types (its
    /// machines-openapi.json, reference/fly.md) is known here.
    #[test]
    fn every_key_of_flys_schema_is_known() {
        for (ours, fly) in [
            (
                CONFIG,
                &[
                    "auto_destroy",
                    "checks",
                    "disable_machine_autostart",
                    "dns",
                    "env",
                    "files",
                    "guest",
                    "image",
                    "init",
                    "metadata",
                    "metrics",
                    "mounts",
                    "processes",
                    "restart",
                    "schedule",
                    "services",
                    "size",
                    "standbys",
                    "statics",
                    "stop_config",
                ][..],
            ),
            (
                GUEST,
                &[
                    "cpu_kind",
                    "cpus",
                    "gpu_kind",
                    "gpus",
                    "host_dedication_id",
                    "kernel_args",
                    "memory_mb",
                ],
            ),
            (
                INIT,
                &[
                    "cmd",
                    "entrypoint",
                    "exec",
                    "kernel_args",
                    "swap_size_mb",
                    "tty",
                ],
            ),
            (
                SERVICE,
                &[
                    "autostart",
                    "autostop",
                    "checks",
                    "concurrency",
                    "force_instance_description",
                    "force_instance_key",
                    "internal_port",
                    "min_machines_running",
                    "ports",
                    "protocol",
                ],
            ),
            (
                PORT,
                &[
                    "end_port",
                    "force_https",
                    "handlers",
                    "http_options",
                    "port",
                    "proxy_proto_options",
                    "start_port",
                    "tls_options",
                ],
            ),
            (
                CHECK,
                &[
                    "grace_period",
                    "headers",
                    "interval",
                    "method",
                    "path",
                    "port",
                    "protocol",
                    "timeout",
                    "tls_server_name",
                    "tls_skip_verify",
                    "type",
                ],
            ),
            (
                MOUNT,
                &[
                    "add_size_gb",
                    "encrypted",
                    "extend_threshold_percent",
                    "name",
                    "path",
                    "size_gb",
                    "size_gb_limit",
                    "volume",
                ],
            ),
            (FILE, &["guest_path", "raw_value", "secret_name"]),
            (
                DNS,
                &["nameservers", "options", "searches", "skip_registration"],
            ),
            (
                PROCESS,
                &[
                    "cmd",
                    "entrypoint",
                    "env",
                    "exec",
                    "ignore_app_secrets",
                    "secrets",
                    "user",
                ],
            ),
            (STATIC, &["guest_path", "tigris_bucket", "url_prefix"]),
            (HTTP_OPTIONS, &["compress", "h2_backend", "response"]),
            (TLS_OPTIONS, &["alpn", "default_self_signed", "versions"]),
        ] {
            for key in fly {
                assert!(ours.iter().any(|f| f.name == *key), "{key} is not known");
            }
        }
        // The other keys fly.md names (fly-go's machine_types.go).
        for key in ["rootfs", "cache_drive", "spot", "containers", "volumes"] {
            assert!(CONFIG.iter().any(|f| f.name == key), "{key} is not known");
        }
    }
}
