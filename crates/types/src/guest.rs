//! Guest sizes: CPU kind, CPU count and memory, validated as Fly validates them, plus Fly's
//! named presets (`shared-cpu-1x`, `performance-2x`, ...).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A machine's size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = close_guest)]
pub struct Guest {
    #[serde(default = "default_cpu_kind")]
    pub cpu_kind: String,
    #[serde(default = "default_cpus")]
    pub cpus: i64,
    #[serde(default = "default_memory")]
    pub memory_mb: i64,
    #[serde(flatten)]
    pub extra: std::collections::BTreeMap<String, serde_json::Value>,
}

/// The schema says what [`Guest::validate`] takes: for each CPU kind and count, the
/// memory range and step (a branch each), with the defaults (shared, 1 CPU, 256 MB).
fn close_guest(schema: &mut schemars::Schema) {
    crate::config_fields::close_schema(schema, crate::config_fields::GUEST_FIELDS);
    let mut branches = Vec::new();
    for (performance, cpus, per_cpu, step) in [
        (false, &[1, 2, 4, 6, 8][..], (256, 2048), 256),
        (true, &[1, 2, 4, 8, 16][..], (2048, 8192), 1024),
    ] {
        for &n in cpus {
            let kind = if performance {
                serde_json::json!({"const": "performance"})
            } else {
                serde_json::json!({"enum": ["shared", ""]})
            };
            let mut required = Vec::new();
            if performance {
                required.push("cpu_kind");
            }
            if n != 1 {
                required.push("cpus");
            }
            if performance || n != 1 {
                required.push("memory_mb");
            }
            branches.push(serde_json::json!({
                "properties": {
                    "cpu_kind": kind,
                    "cpus": {"const": n},
                    "memory_mb": {"minimum": per_cpu.0 * n, "maximum": per_cpu.1 * n, "multipleOf": step},
                },
                "required": required,
            }));
        }
    }
    schema.insert("anyOf".into(), serde_json::Value::Array(branches));
}

fn default_cpu_kind() -> String {
    "shared".into()
}
fn default_cpus() -> i64 {
    1
}
fn default_memory() -> i64 {
    256
}

impl Default for Guest {
    fn default() -> Self {
        Guest {
            cpu_kind: default_cpu_kind(),
            cpus: 1,
            memory_mb: 256,
            extra: Default::default(),
        }
    }
}

/// A validated size: what the ledger counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub struct Size {
    pub cpus: u32,
    pub memory_mb: u64,
    pub performance: bool,
}

/// Shared CPUs: 1, 2, 4, 6 or 8; memory 256 MB to 2 GB per CPU in steps of 256 MB.
/// Performance CPUs: 1, 2, 4, 8 or 16; memory 2 GB to 8 GB per CPU in steps of 1024 MB.
impl Guest {
    /// Returns the guest as a validated [`Size`], or a message saying what is wrong.
    pub fn validate(&self) -> Result<Size, String> {
        let (performance, cpu_choices, mb_per_cpu_min, mb_per_cpu_max, step): (
            bool,
            &[i64],
            i64,
            i64,
            i64,
        ) = match self.cpu_kind.as_str() {
            "shared" | "" => (false, &[1, 2, 4, 6, 8], 256, 2048, 256),
            "performance" => (true, &[1, 2, 4, 8, 16], 2048, 8192, 1024),
            other => {
                return Err(format!(
                    "invalid cpu_kind {other:?}: must be \"shared\" or \"performance\""
                ))
            }
        };
        if !cpu_choices.contains(&self.cpus) {
            return Err(format!(
                "invalid number of CPUs {} for {} machines: must be one of {:?}",
                self.cpus, self.cpu_kind, cpu_choices
            ));
        }
        let (min, max) = (mb_per_cpu_min * self.cpus, mb_per_cpu_max * self.cpus);
        if self.memory_mb < min || self.memory_mb > max {
            return Err(format!(
                "invalid memory size {} MB for {} {} CPU(s): must be between {min} and {max} MB",
                self.memory_mb, self.cpus, self.cpu_kind
            ));
        }
        if self.memory_mb % step != 0 {
            return Err(format!(
                "invalid memory size {} MB: must be a multiple of {step} MB",
                self.memory_mb
            ));
        }
        Ok(Size {
            cpus: self.cpus as u32,
            memory_mb: self.memory_mb as u64,
            performance,
        })
    }

    /// Returns Fly's preset of that name (`shared-cpu-2x`, `performance-4x`, GPU presets
    /// are not supported).
    pub fn preset(name: &str) -> Result<Guest, String> {
        let (kind, rest) = if let Some(n) = name.strip_prefix("shared-cpu-") {
            ("shared", n)
        } else if let Some(n) = name.strip_prefix("performance-") {
            ("performance", n)
        } else {
            return Err(format!(
                "unknown size {name:?}: try shared-cpu-1x or performance-1x"
            ));
        };
        let cpus: i64 = rest
            .strip_suffix('x')
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| format!("unknown size {name:?}"))?;
        // Saturating: any count the name may carry is refused by `validate` below, not
        // by an overflow (found by fuzzing: `shared-cpu-<2^62>x`).
        let memory_mb = cpus.saturating_mul(if kind == "shared" { 256 } else { 2048 });
        let guest = Guest {
            cpu_kind: kind.into(),
            cpus,
            memory_mb,
            extra: Default::default(),
        };
        guest
            .validate()
            .map_err(|_| format!("unknown size {name:?}"))?;
        Ok(guest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_with_huge_counts_are_refused() {
        for name in [
            "shared-cpu-36028797018963968x",
            "performance-9223372036854775807x",
            "shared-cpu--9223372036854775808x",
        ] {
            assert!(Guest::preset(name).is_err(), "{name}");
        }
    }

    #[test]
    fn presets_match_fly() {
        let g = Guest::preset("shared-cpu-2x").unwrap();
        assert_eq!((g.cpus, g.memory_mb), (2, 512));
        let g = Guest::preset("performance-4x").unwrap();
        assert_eq!(
            (g.cpus, g.memory_mb, g.cpu_kind.as_str()),
            (4, 8192, "performance")
        );
        assert!(Guest::preset("shared-cpu-3x").is_err());
        assert!(Guest::preset("huge").is_err());
    }

    #[test]
    fn absurd_sizes_are_refused_with_reasons() {
        let g = |kind: &str, cpus, mem| Guest {
            cpu_kind: kind.into(),
            cpus,
            memory_mb: mem,
            extra: Default::default(),
        };
        assert!(g("shared", 1, 256).validate().is_ok());
        assert!(g("shared", 1, 2048).validate().is_ok());
        assert!(g("shared", -1, 256)
            .validate()
            .unwrap_err()
            .contains("CPUs"));
        assert!(g("shared", 1, -256)
            .validate()
            .unwrap_err()
            .contains("memory"));
        assert!(g("shared", 1, 4096).validate().is_err());
        assert!(g("shared", 1, 300)
            .validate()
            .unwrap_err()
            .contains("multiple"));
        assert!(g("shared", 1_000_000, 256).validate().is_err());
        assert!(g("gpu", 1, 256).validate().is_err());
        assert!(g("performance", 2, 4096).validate().is_ok());
    }
}
