//! Durations as the Fly API writes them: Go duration strings (`"10s"`, `"1m30s"`, `"500ms"`)
//! or integers. fly-go encodes integers as nanoseconds, so integers are read as nanoseconds.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::time::Duration;

/// A duration that reads Go strings or integer nanoseconds and writes Go strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GoDuration(pub Duration);

impl GoDuration {
    /// Returns the wrapped duration.
    pub fn get(self) -> Duration {
        self.0
    }
}

/// Parses a Go duration string such as `"1h2m3.5s"`, `"300ms"` or `"10s"`; a bare number is
/// taken as seconds (query parameters like `timeout=30` use seconds).
pub fn parse_go_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty duration".into());
    }
    if let Ok(secs) = text.parse::<f64>() {
        if !(0.0..=1e9).contains(&secs) {
            return Err(format!("duration {text:?} out of range"));
        }
        return Ok(Duration::from_secs_f64(secs));
    }
    let mut total = 0f64;
    let mut rest = text;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("duration {text:?} is missing a unit"))?;
        if num_len == 0 {
            return Err(format!("invalid duration {text:?}"));
        }
        let value: f64 = rest[..num_len]
            .parse()
            .map_err(|_| format!("invalid duration {text:?}"))?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            unit => return Err(format!("unknown unit {unit:?} in duration {text:?}")),
        };
        rest = &rest[unit_len..];
        total += value * scale;
    }
    if total > 1e9 {
        return Err(format!("duration {text:?} out of range"));
    }
    Ok(Duration::from_secs_f64(total))
}

/// Formats a duration the way Go's `time.Duration.String` does for common values.
pub fn format_go_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    if !ms.is_multiple_of(1000) {
        if ms < 1000 {
            return format!("{ms}ms");
        }
        return format!("{}s", d.as_secs_f64());
    }
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if h > 0 || m > 0 {
        out.push_str(&format!("{m}m"));
    }
    out.push_str(&format!("{s}s"));
    out
}

impl Serialize for GoDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_go_duration(self.0))
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Float(f64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(ns) => Ok(GoDuration(Duration::from_nanos(ns))),
            Raw::Float(ns) if ns >= 0.0 => Ok(GoDuration(Duration::from_nanos(ns as u64))),
            Raw::Float(ns) => Err(serde::de::Error::custom(format!("negative duration {ns}"))),
            Raw::Text(text) => {
                // A Go string never is a bare number; accept one anyway, as seconds.
                parse_go_duration(&text)
                    .map(GoDuration)
                    .map_err(serde::de::Error::custom)
            }
        }
    }
}

impl schemars::JsonSchema for GoDuration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "GoDuration".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A duration: a Go duration string (`\"10s\"`, `\"1m30s\"`, `\"500ms\"`; a bare number is seconds) or an integer number of nanoseconds. Written back as a Go duration string.",
            "oneOf": [
                {"type": "string", "examples": ["10s", "1m30s", "500ms"]},
                {"type": "integer", "minimum": 0, "description": "nanoseconds"}
            ]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_strings_and_integers() {
        assert_eq!(parse_go_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_go_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(
            parse_go_duration("250ms").unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(
            parse_go_duration("1.5s").unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(parse_go_duration("30").unwrap(), Duration::from_secs(30));
        assert!(parse_go_duration("10 parsecs").is_err());
        assert!(parse_go_duration("s").is_err());
        let d: GoDuration = serde_json::from_str("5000000000").unwrap();
        assert_eq!(d.get(), Duration::from_secs(5));
        let d: GoDuration = serde_json::from_str("\"2m\"").unwrap();
        assert_eq!(d.get(), Duration::from_secs(120));
        assert_eq!(serde_json::to_string(&d).unwrap(), "\"2m0s\"");
        assert!(serde_json::from_str::<GoDuration>("-5").is_err());
    }
}
