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
    // Each number is read as an exact count of nanoseconds (no float rounding), so that
    // what `format_go_duration` writes reads back to the same duration.
    let mut total_ns: u128 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("duration {text:?} is missing a unit"))?;
        if num_len == 0 {
            return Err(format!("invalid duration {text:?}"));
        }
        let number = &rest[..num_len];
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit_ns: u128 = match &rest[..unit_len] {
            "ns" => 1,
            "us" | "µs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            unit => return Err(format!("unknown unit {unit:?} in duration {text:?}")),
        };
        rest = &rest[unit_len..];
        total_ns = nanos_of(number, unit_ns)
            .and_then(|n| total_ns.checked_add(n))
            .filter(|n| *n <= MAX_NANOS)
            .ok_or_else(|| format!("duration {text:?} out of range or invalid"))?;
    }
    Ok(Duration::new(
        (total_ns / 1_000_000_000) as u64,
        (total_ns % 1_000_000_000) as u32,
    ))
}

/// Longest duration read from a Go string: 10^7 hours, so that every duration the API
/// writes back (at most `u64::MAX` nanoseconds, 5124095h...) reads again.
const MAX_NANOS: u128 = 10_000_000 * 3_600 * 1_000_000_000;

/// The Go strings the document promises are read (a subset of what is: units in Go's own
/// order, minutes and seconds below 60 after a larger unit), every one of them in range.
pub const GO_DURATION_PATTERN: &str = concat!(
    r"^(?:[0-9]{1,9}(?:\.[0-9]{1,9})?",
    r"|[0-9]{1,7}h(?:[0-5]?[0-9]m)?(?:[0-5]?[0-9](?:\.[0-9]{1,9})?s)?",
    r"|[0-9]{1,6}m(?:[0-5]?[0-9](?:\.[0-9]{1,9})?s)?",
    r"|[0-9]{1,6}(?:\.[0-9]{1,9})?(?:s|ms|us|µs|ns))$"
);

/// `number` (digits with at most one `.`) of a unit of `unit_ns` nanoseconds, in whole
/// nanoseconds (digits below a nanosecond dropped).
fn nanos_of(number: &str, unit_ns: u128) -> Option<u128> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return None;
    }
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    // 19 digits are below a nanosecond of an hour; 10^19 × an hour fits in a u128.
    let fraction = &fraction[..fraction.len().min(19)];
    let fraction_ns = if fraction.is_empty() {
        0
    } else {
        fraction.parse::<u128>().ok()? * unit_ns / 10u128.pow(fraction.len() as u32)
    };
    whole.checked_mul(unit_ns)?.checked_add(fraction_ns)
}

/// Formats a duration the way Go's `time.Duration.String` does (`"0s"`, `"1.5ms"`,
/// `"500µs"`, `"2m0s"`, `"1h0m0.25s"`), to the nanosecond.
pub fn format_go_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        return "0s".into();
    }
    if ns < 1_000_000_000 {
        let (unit, per) = if ns < 1_000 {
            ("ns", 1)
        } else if ns < 1_000_000 {
            ("µs", 1_000)
        } else {
            ("ms", 1_000_000)
        };
        return format!("{}{unit}", decimal(ns, per));
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
    let s_ns = u128::from(s) * 1_000_000_000 + u128::from(d.subsec_nanos());
    out.push_str(&format!("{}s", decimal(s_ns, 1_000_000_000)));
    out
}

/// `n / per` in decimal, without trailing zeros (`per` a power of ten).
fn decimal(n: u128, per: u128) -> String {
    let (whole, fraction) = (n / per, n % per);
    if fraction == 0 {
        return whole.to_string();
    }
    let width = per.ilog10() as usize;
    let fraction = format!("{fraction:0width$}");
    format!("{whole}.{}", fraction.trim_end_matches('0'))
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
                {"type": "string", "examples": ["10s", "1m30s", "500ms"], "pattern": GO_DURATION_PATTERN},
                {"type": "integer", "minimum": 0, "maximum": u64::MAX, "description": "nanoseconds"}
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

    /// Found by fuzzing: sub-millisecond parts were dropped when written (a check timeout
    /// of `.5ms` became `0s` once the config went through JSON).
    #[test]
    fn durations_are_written_as_go_does_and_read_back_exactly() {
        for (text, written) in [
            ("500us", "500µs"),
            (".500ms", "500µs"),
            ("1.5ms", "1.5ms"),
            ("1ns", "1ns"),
            ("90s", "1m30s"),
            ("1h0.000000001s", "1h0m0.000000001s"),
            ("1.25s", "1.25s"),
            ("0s", "0s"),
        ] {
            let d = parse_go_duration(text).unwrap();
            assert_eq!(format_go_duration(d), written, "{text}");
            assert_eq!(parse_go_duration(written).unwrap(), d, "{written}");
        }
        assert!(parse_go_duration("1.2.3s").is_err());
        assert!(parse_go_duration(".s").is_err());
        assert!(parse_go_duration("99999999999999999999999999h").is_err());
    }

    /// Every duration written back (to `u64::MAX` nanoseconds) matches the document's
    /// pattern, and reads back the same.
    #[test]
    fn what_is_written_matches_the_documented_pattern() {
        let pattern = regex::Regex::new(GO_DURATION_PATTERN).unwrap();
        for ns in [
            u64::MAX,
            0,
            1,
            999,
            1_500_000,
            59_999_999_999,
            3_600_000_000_000 * 24,
        ] {
            let written = format_go_duration(Duration::from_nanos(ns));
            assert!(pattern.is_match(&written), "{written}");
            assert_eq!(
                parse_go_duration(&written).unwrap(),
                Duration::from_nanos(ns)
            );
        }
        assert!(
            !pattern.is_match("10 parsecs") && !pattern.is_match("") && !pattern.is_match("1h1h")
        );
    }

    proptest::proptest! {
        /// Every string the document's pattern admits is read (none is out of range).
        #[test]
        fn every_string_the_documented_pattern_admits_is_read(
            text in proptest::string::string_regex(
                GO_DURATION_PATTERN.trim_start_matches('^').trim_end_matches('$')
            ).unwrap()
        ) {
            proptest::prop_assert!(parse_go_duration(&text).is_ok(), "{text:?}");
        }
    }
}
