//! Priority classes (a bazaar extension: `config.priority`, `[vm] priority` in the app
//! file). A machine's class decides which machines it may displace when no host has room
//! for it: only machines of a strictly lower class (docs/POLICY.md). Absent means
//! `default`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A machine's priority class, lowest first (the order is the one `Ord` gives).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Work that may be stopped to make room for `default` and `critical` machines.
    Batch,
    /// What a machine is when its config names no class.
    #[default]
    Default,
    /// May stop `batch` and `default` machines to find room; never stopped for another.
    Critical,
}

impl Priority {
    /// Every class, lowest first.
    pub const ALL: [Priority; 3] = [Priority::Batch, Priority::Default, Priority::Critical];

    /// The class's name as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Batch => "batch",
            Priority::Default => "default",
            Priority::Critical => "critical",
        }
    }

    /// Whether a machine of this class may displace one of `other`: only a strictly lower
    /// class, never its own or a higher one.
    pub fn may_preempt(self, other: Priority) -> bool {
        other < self
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Priority {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Priority::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| {
                format!("priority must be one of \"batch\", \"default\", \"critical\", got {s:?}")
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_order_and_parse() {
        assert!(Priority::Batch < Priority::Default && Priority::Default < Priority::Critical);
        for p in Priority::ALL {
            assert_eq!(p.as_str().parse::<Priority>(), Ok(p));
            assert_eq!(serde_json::to_value(p).unwrap(), p.as_str());
            assert!(!p.may_preempt(p), "never its own class");
        }
        assert!(Priority::Critical.may_preempt(Priority::Batch));
        assert!(!Priority::Batch.may_preempt(Priority::Critical));
        assert!("urgent"
            .parse::<Priority>()
            .unwrap_err()
            .contains("\"batch\""));
        assert!(serde_json::from_value::<Priority>(serde_json::json!("urgent")).is_err());
        assert_eq!(Priority::default(), Priority::Default);
    }
}
