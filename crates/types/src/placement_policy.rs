//! A machine's placement policy on the wire (`config.placement`, a bazaar extension):
//! `constraints` on the operator's host labels (must), `affinities` (prefer) and `spread`
//! of an app's machines across hosts or a label's values, as Nomad's `constraint`,
//! `affinity` and `spread` (docs/POLICY.md). Also the rule of the labels an operator gives a
//! host (`bazaar agent --label disk=nvme`, the config file's `[labels]`).
//!
//! What the market does with a policy (each host's verdict, the score it adds) is
//! `bazaar_placement::constraints`'s; this module holds the types and their checks.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How a rule compares a host label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Op {
    /// The label has exactly this value.
    #[serde(rename = "=")]
    Eq,
    /// The label is absent or has another value.
    #[serde(rename = "!=")]
    Ne,
    /// The label has one of the comma-separated values.
    #[serde(rename = "in")]
    In,
    /// The label is present (any value).
    #[serde(rename = "exists")]
    Exists,
}

impl Op {
    /// The operator as written (`=`, `!=`, `in`, `exists`).
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Eq => "=",
            Op::Ne => "!=",
            Op::In => "in",
            Op::Exists => "exists",
        }
    }
}

/// A rule on one host label.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Constraint {
    pub label: String,
    #[serde(default = "default_op")]
    pub op: Op,
    /// Required for `=`, `!=` and `in` (comma-separated values); refused for `exists`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

fn default_op() -> Op {
    Op::Eq
}

/// A preference: hosts meeting the rule gain `weight` (negative: avoid them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Affinity {
    pub label: String,
    #[serde(default = "default_op")]
    pub op: Op,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// -100..=100, not 0 (as Nomad's).
    pub weight: i32,
}

/// What an app's machines are spread across.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpreadBy {
    /// One machine per host as far as possible.
    Host,
    /// Evenly over the values of this host label (e.g. `zone`).
    Label(String),
}

impl SpreadBy {
    /// Parses `host` or `label:NAME`.
    pub fn parse(s: &str) -> Result<SpreadBy, String> {
        match s.trim() {
            "host" => Ok(SpreadBy::Host),
            other => match other.strip_prefix("label:") {
                Some(l) if valid_label(l) => Ok(SpreadBy::Label(l.to_string())),
                _ => Err(format!(
                    "placement.spread.by must be \"host\" or \"label:NAME\", not {other:?}"
                )),
            },
        }
    }
}

/// Spread of an app's machines (anti-affinity).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Spread {
    /// `host` or `label:NAME`.
    pub by: String,
}

/// A machine's placement policy (`config.placement`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PlacementPolicy {
    /// Rules every host taking the machine must meet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub constraints: Vec<Constraint>,
    /// Preferences among the hosts that meet the constraints.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub affinities: Vec<Affinity>,
    /// Spread of the app's machines across hosts or a label's values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread: Option<Spread>,
}

/// At most this many constraints and this many affinities in one policy.
pub const MAX_RULES: usize = 32;

/// Whether `l` may name a host label: 1 to 63 of `A-Z a-z 0-9 _ - . /`.
pub fn valid_label(l: &str) -> bool {
    !l.is_empty()
        && l.len() <= 63
        && l.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
}

fn check_rule(
    kind: &str,
    i: usize,
    label: &str,
    op: Op,
    value: Option<&str>,
) -> Result<(), String> {
    if !valid_label(label) {
        return Err(format!(
            "placement.{kind}[{i}].label {label:?} is not a label name (1-63 of A-Z a-z 0-9 _ - . /)"
        ));
    }
    match (op, value) {
        (Op::Exists, Some(_)) => Err(format!(
            "placement.{kind}[{i}]: op \"exists\" takes no value"
        )),
        (Op::Eq | Op::Ne | Op::In, None) => Err(format!(
            "placement.{kind}[{i}]: op {:?} needs a value",
            op.as_str()
        )),
        (Op::In, Some(v)) if v.split(',').all(|s| s.trim().is_empty()) => Err(format!(
            "placement.{kind}[{i}]: op \"in\" needs comma-separated values"
        )),
        _ => Ok(()),
    }
}

impl PlacementPolicy {
    /// Checks the policy; the error names the field and is meant for a 400.
    pub fn validate(&self) -> Result<(), String> {
        if self.constraints.len() > MAX_RULES || self.affinities.len() > MAX_RULES {
            return Err(format!(
                "placement: at most {MAX_RULES} constraints and {MAX_RULES} affinities"
            ));
        }
        for (i, c) in self.constraints.iter().enumerate() {
            check_rule("constraints", i, &c.label, c.op, c.value.as_deref())?;
        }
        for (i, a) in self.affinities.iter().enumerate() {
            check_rule("affinities", i, &a.label, a.op, a.value.as_deref())?;
            if a.weight == 0 || !(-100..=100).contains(&a.weight) {
                return Err(format!(
                    "placement.affinities[{i}].weight must be -100..=100 and not 0, not {}",
                    a.weight
                ));
            }
        }
        if let Some(s) = &self.spread {
            SpreadBy::parse(&s.by)?;
        }
        Ok(())
    }

    /// The spread asked for, if any (a validated policy parses).
    pub fn spread_by(&self) -> Option<SpreadBy> {
        self.spread
            .as_ref()
            .and_then(|s| SpreadBy::parse(&s.by).ok())
    }

    /// Whether the policy asks nothing.
    pub fn is_empty(&self) -> bool {
        self.constraints.is_empty() && self.affinities.is_empty() && self.spread.is_none()
    }
}

/// Whether a host with `labels` meets `label op value`.
pub fn holds(label: &str, op: Op, value: Option<&str>, labels: &BTreeMap<String, String>) -> bool {
    let have = labels.get(label).map(String::as_str);
    match op {
        Op::Eq => have.is_some() && have == value,
        Op::Ne => have.is_none() || have != value,
        Op::In => have.is_some_and(|h| {
            value
                .unwrap_or("")
                .split(',')
                .map(str::trim)
                .any(|v| !v.is_empty() && v == h)
        }),
        Op::Exists => have.is_some(),
    }
}

impl Constraint {
    /// Whether a host with `labels` meets it.
    pub fn holds(&self, labels: &BTreeMap<String, String>) -> bool {
        holds(&self.label, self.op, self.value.as_deref(), labels)
    }

    /// The constraint as written, for reasons: `disk = nvme`, `zone exists`.
    pub fn describe(&self) -> String {
        match &self.value {
            Some(v) => format!("{} {} {}", self.label, self.op.as_str(), v),
            None => format!("{} {}", self.label, self.op.as_str()),
        }
    }
}

impl Affinity {
    /// Whether a host with `labels` meets its rule.
    pub fn holds(&self, labels: &BTreeMap<String, String>) -> bool {
        holds(&self.label, self.op, self.value.as_deref(), labels)
    }
}

/// Names of host labels the agent publishes itself (its addresses, mesh, region, what it
/// cannot run, whether it drains): an operator's label may not use them.
pub const RESERVED_LABEL_PREFIXES: &[&str] = &[
    "proxy_",
    "host_",
    "mesh_",
    "region_",
    "cannot_run_",
    "draining",
    "bazaar",
];

/// Checks a label an operator gives a host (`--label NAME=VALUE`, `[labels]`): a label name
/// (1-63 of `A-Z a-z 0-9 _ - . /`) not reserved by the agent (see
/// [`RESERVED_LABEL_PREFIXES`]), and a value of 1 to 255 printable characters.
pub fn check_host_label(name: &str, value: &str) -> Result<(), String> {
    if !valid_label(name) {
        return Err(format!(
            "host label {name:?} is not a label name (1-63 of A-Z a-z 0-9 _ - . /)"
        ));
    }
    if let Some(p) = RESERVED_LABEL_PREFIXES
        .iter()
        .find(|p| name.starts_with(*p))
    {
        return Err(format!(
            "host label {name:?}: names starting with {p:?} are the agent's own"
        ));
    }
    if value.is_empty() || value.len() > 255 || value.chars().any(|c| c.is_control()) {
        return Err(format!(
            "host label {name}: the value must be 1 to 255 printable characters"
        ));
    }
    Ok(())
}

/// Parses `NAME=VALUE` of `--label`, checked as [`check_host_label`] does.
pub fn parse_host_label(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("--label takes NAME=VALUE, not {s:?}"))?;
    check_host_label(k, v)?;
    Ok((k.to_string(), v.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_parses_from_the_wire_and_bad_rules_are_named() {
        let p: PlacementPolicy = serde_json::from_value(serde_json::json!({
            "constraints": [{"label": "disk", "value": "nvme"}],
            "affinities": [{"label": "zone", "op": "in", "value": "a,b", "weight": 50}],
            "spread": {"by": "label:zone"}
        }))
        .unwrap();
        assert!(p.validate().is_ok());
        assert_eq!(p.constraints[0].op, Op::Eq);
        assert_eq!(p.spread_by(), Some(SpreadBy::Label("zone".into())));
        let bad = PlacementPolicy {
            constraints: vec![Constraint {
                label: "disk".into(),
                op: Op::Eq,
                value: None,
            }],
            ..Default::default()
        };
        assert_eq!(
            bad.validate().unwrap_err(),
            "placement.constraints[0]: op \"=\" needs a value"
        );
        let e = serde_json::from_value::<PlacementPolicy>(serde_json::json!({"constrains": []}))
            .unwrap_err();
        assert!(e.to_string().contains("unknown field `constrains`"), "{e}");
    }

    #[test]
    fn operator_labels_refuse_the_agents_own_names() {
        assert_eq!(
            parse_host_label("disk=nvme").unwrap(),
            ("disk".into(), "nvme".into())
        );
        assert!(parse_host_label("disk").unwrap_err().contains("NAME=VALUE"));
        assert!(parse_host_label("proxy_addr=x")
            .unwrap_err()
            .contains("the agent's own"));
        assert!(parse_host_label("draining=true")
            .unwrap_err()
            .contains("the agent's own"));
        assert!(parse_host_label("disk=").unwrap_err().contains("1 to 255"));
        assert!(parse_host_label("dísk=x")
            .unwrap_err()
            .contains("label name"));
    }
}
