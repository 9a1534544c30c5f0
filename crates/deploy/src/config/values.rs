//! The value types of the file, each read the way fly.toml writes it: commands as a string
//! or a list, durations as Go strings or numbers, sizes, memory with units, signals by name,
//! restart policies under flyctl's names.

use super::*;

/// `always`, `never`/`no`, `on-failure`/`on-fail`.
#[derive(Debug, Clone, Copy)]
pub struct RestartPolicyName(pub RestartPolicyKind);

impl<'de> Deserialize<'de> for RestartPolicyName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(RestartPolicyName(match s.as_str() {
            "always" => RestartPolicyKind::Always,
            "never" | "no" => RestartPolicyKind::No,
            "on-failure" | "on-fail" | "on_failure" => RestartPolicyKind::OnFailure,
            _ => {
                return Err(serde::de::Error::custom(format!(
                    "restart policy must be always, never or on-failure, got {s:?}"
                )))
            }
        }))
    }
}

/// An env value: strings, numbers and booleans are all written as strings.
#[derive(Debug, Clone, PartialEq)]
pub struct Scalar(pub String);

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            S(String),
            I(i64),
            F(f64),
            B(bool),
        }
        Raw::deserialize(d)
            .map(|r| {
                Scalar(match r {
                    Raw::S(s) => s,
                    Raw::I(i) => i.to_string(),
                    Raw::F(f) => f.to_string(),
                    Raw::B(b) => b.to_string(),
                })
            })
            .map_err(|_| {
                serde::de::Error::custom("env values must be strings, numbers or booleans")
            })
    }
}

/// A process group's command: a command line (split like a shell) or a list of arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct Command(pub Vec<String>);

impl<'de> Deserialize<'de> for Command {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Line(String),
            Argv(Vec<String>),
        }
        let argv = match Raw::deserialize(d).map_err(|_| {
            serde::de::Error::custom("a process command must be a string or a list of strings")
        })? {
            Raw::Line(l) => split_command(&l).map_err(serde::de::Error::custom)?,
            Raw::Argv(v) => v,
        };
        if argv.is_empty() {
            return Err(serde::de::Error::custom(
                "a process command cannot be empty",
            ));
        }
        Ok(Command(argv))
    }
}

/// `[processes]`: a table of commands, or the empty list older templates write.
pub fn process_groups<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, Command>, D::Error> {
    struct V;
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = BTreeMap<String, Command>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a [processes] table of process group commands")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            BTreeMap::deserialize(serde::de::value::MapAccessDeserializer::new(map))
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            match seq.next_element::<serde::de::IgnoredAny>()? {
                None => Ok(BTreeMap::new()),
                Some(_) => Err(serde::de::Error::custom(
                    "processes must be a table (name = command); only an empty list is read as none",
                )),
            }
        }
    }
    d.deserialize_any(V)
}

/// Splits a command line as a POSIX shell would (quotes and backslashes; no expansion).
pub fn split_command(line: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => cur.push(c),
                        None => return Err(format!("unterminated ' in {line:?}")),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c) => cur.push(c),
                            None => return Err(format!("trailing \\ in {line:?}")),
                        },
                        Some(c) => cur.push(c),
                        None => return Err(format!("unterminated \" in {line:?}")),
                    }
                }
            }
            '\\' => {
                in_word = true;
                match chars.next() {
                    Some(c) => cur.push(c),
                    None => return Err(format!("trailing \\ in {line:?}")),
                }
            }
            c if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        out.push(cur);
    }
    Ok(out)
}

/// A signal name (`SIGINT`, `TERM`) or number.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SignalName(pub Signal);

impl<'de> Deserialize<'de> for SignalName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            S(String),
            I(i32),
        }
        let sig = match Raw::deserialize(d)
            .map_err(|_| serde::de::Error::custom("a signal is a name such as SIGTERM"))?
        {
            Raw::S(s) => Signal::parse(&s),
            Raw::I(n) => Signal::from_number(n),
        };
        sig.map(SignalName).map_err(serde::de::Error::custom)
    }
}

fn duration<'de, D: Deserializer<'de>>(d: D, int_unit: Duration) -> Result<Duration, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        S(String),
        I(u64),
    }
    match Raw::deserialize(d).map_err(|_| {
        serde::de::Error::custom("a duration is a string such as \"10s\" or a whole number")
    })? {
        Raw::S(s) => {
            bazaar_types::duration::parse_go_duration(&s).map_err(serde::de::Error::custom)
        }
        Raw::I(n) => Ok(int_unit * n as u32),
    }
}

/// A duration: a Go string (`"10s"`), or a whole number of milliseconds (as fly.toml).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Millis(pub Duration);

impl<'de> Deserialize<'de> for Millis {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        duration(d, Duration::from_millis(1)).map(Millis)
    }
}

/// A duration: a Go string, or a whole number of seconds (`kill_timeout = 5`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Seconds(pub Duration);

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = duration(d, Duration::from_secs(1))?;
        if v > bazaar_types::config::MAX_STOP_TIMEOUT {
            return Err(serde::de::Error::custom("kill_timeout is at most 300s"));
        }
        Ok(Seconds(v))
    }
}

/// A validated size preset (`shared-cpu-1x`).
#[derive(Debug, Clone, PartialEq)]
pub struct Size(pub Guest);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Guest::preset(&s)
            .map(Size)
            .map_err(serde::de::Error::custom)
    }
}

/// Memory: a whole number of MB, or a string with a unit (`"512mb"`, `"1gb"`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Memory(pub u64);

impl<'de> Deserialize<'de> for Memory {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            S(String),
            I(u64),
        }
        let bad = |s: &str| {
            serde::de::Error::custom(format!(
                "invalid memory {s:?}: use a number of MB or a string such as \"512mb\" or \"1gb\""
            ))
        };
        match Raw::deserialize(d).map_err(|_| bad("?"))? {
            Raw::I(n) => Ok(Memory(n)),
            Raw::S(s) => {
                let t = s.trim().to_ascii_lowercase();
                let (num, mult) = if let Some(n) = t.strip_suffix("gb") {
                    (n, 1024.0)
                } else if let Some(n) = t.strip_suffix("mb") {
                    (n, 1.0)
                } else {
                    (t.as_str(), 1.0)
                };
                let v: f64 = num.trim().parse().map_err(|_| bad(&s))?;
                if v <= 0.0 {
                    return Err(bad(&s));
                }
                Ok(Memory((v * mult).round() as u64))
            }
        }
    }
}

/// `auto_stop_machines`: `"off" | "stop" | "suspend"` or a boolean.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AutostopSetting(pub Autostop);

impl<'de> Deserialize<'de> for AutostopSetting {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Autostop::deserialize(d).map(AutostopSetting)
    }
}
