//! Signals as clients send them: a name (`"SIGTERM"`, `"TERM"`) or a number (`9`).

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Signals that may be sent to a machine, with their Linux numbers.
const SIGNALS: &[(&str, i32)] = &[
    ("HUP", 1),
    ("INT", 2),
    ("QUIT", 3),
    ("ILL", 4),
    ("TRAP", 5),
    ("ABRT", 6),
    ("BUS", 7),
    ("FPE", 8),
    ("KILL", 9),
    ("USR1", 10),
    ("SEGV", 11),
    ("USR2", 12),
    ("PIPE", 13),
    ("ALRM", 14),
    ("TERM", 15),
    ("STOP", 19),
    ("CONT", 18),
    ("WINCH", 28),
];

/// A validated signal number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Signal(pub i32);

impl Signal {
    /// SIGTERM.
    pub const TERM: Signal = Signal(15);
    /// SIGKILL.
    pub const KILL: Signal = Signal(9);
    /// SIGINT, Fly's default stop signal.
    pub const INT: Signal = Signal(2);

    /// Parses `"SIGTERM"`, `"term"`, `"15"`.
    pub fn parse(text: &str) -> Result<Signal, String> {
        let t = text.trim();
        if let Ok(n) = t.parse::<i32>() {
            return Signal::from_number(n);
        }
        let upper = t.to_ascii_uppercase();
        let name = upper.strip_prefix("SIG").unwrap_or(&upper);
        SIGNALS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, num)| Signal(*num))
            .ok_or_else(|| format!("unknown signal {text:?}"))
    }

    /// Accepts a number of a known signal.
    pub fn from_number(n: i32) -> Result<Signal, String> {
        if SIGNALS.iter().any(|(_, num)| *num == n) {
            Ok(Signal(n))
        } else {
            Err(format!("unsupported signal number {n}"))
        }
    }

    /// Returns `SIGTERM`-style name.
    pub fn name(self) -> String {
        SIGNALS
            .iter()
            .find(|(_, n)| *n == self.0)
            .map(|(name, _)| format!("SIG{name}"))
            .unwrap_or_else(|| self.0.to_string())
    }
}

impl Serialize for Signal {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.name())
    }
}

impl<'de> Deserialize<'de> for Signal {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Num(i32),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Num(n) => Signal::from_number(n),
            Raw::Text(t) => Signal::parse(&t),
        }
        .map_err(serde::de::Error::custom)
    }
}

impl schemars::JsonSchema for Signal {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Signal".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let names: Vec<String> = SIGNALS
            .iter()
            .flat_map(|(n, _)| [format!("SIG{n}"), n.to_string()])
            .collect();
        let numbers: Vec<i32> = SIGNALS.iter().map(|(_, n)| *n).collect();
        schemars::json_schema!({
            "description": "A signal: its name (`\"SIGTERM\"` or `\"TERM\"`, any case) or its Linux number (`15`). Written back as a `SIG...` name.",
            "oneOf": [
                {"type": "string", "examples": names},
                {"type": "integer", "enum": numbers}
            ]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers() {
        assert_eq!(Signal::parse("SIGTERM").unwrap(), Signal(15));
        assert_eq!(Signal::parse("kill").unwrap(), Signal(9));
        assert_eq!(Signal::parse("2").unwrap(), Signal(2));
        assert!(Signal::parse("SIGNOPE").is_err());
        assert!(Signal::parse("99").is_err());
        let s: Signal = serde_json::from_str("9").unwrap();
        assert_eq!(s, Signal::KILL);
        let s: Signal = serde_json::from_str("\"SIGUSR1\"").unwrap();
        assert_eq!(s.name(), "SIGUSR1");
    }
}
