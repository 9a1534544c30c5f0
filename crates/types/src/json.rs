//! Request bodies as every bazaar HTTP interface reads them: one JSON object (an empty body
//! is `{}`), each key at most once at every depth. serde_json alone keeps the last of two
//! equal keys while a typed `Deserialize` refuses them, so two readers of one body could
//! see two different values (a scope check reading `{"driver": "oci", "driver": "process"}`
//! one way and the handler the other); a body read here means the same thing to everyone.

use serde::de::{DeserializeOwned, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::fmt;

/// A body read as a JSON object: the object, and the keys that were given more than once
/// (at any depth; the value kept is the last one).
#[derive(Debug, Clone, PartialEq)]
pub struct Object {
    pub value: Map<String, Value>,
    pub duplicates: Vec<String>,
}

impl Object {
    /// The refusal of a body with a key given twice, if it has one.
    pub fn refuse_duplicates(&self) -> Result<(), String> {
        match self.duplicates.first() {
            None => Ok(()),
            Some(key) => Err(format!(
                "invalid JSON body: key {key:?} is given more than once (each key may appear once per object)"
            )),
        }
    }

    /// The object as `T`, or a 400's message naming the field that is wrong.
    pub fn into_typed<T: DeserializeOwned>(self) -> Result<T, String> {
        serde_json::from_value(Value::Object(self.value))
            .map_err(|e| format!("invalid request: {e}"))
    }
}

/// Reads `body` as a JSON object (whitespace alone is `{}`), noting duplicate keys. The
/// error is a 400's message.
pub fn parse_object(body: &[u8]) -> Result<Object, String> {
    let body: &[u8] = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        body
    };
    let mut duplicates = Vec::new();
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = Noting(&mut duplicates)
        .deserialize(&mut de)
        .and_then(|v| de.end().map(|()| v))
        .map_err(|e| format!("invalid JSON body: {e}"))?;
    match value {
        Value::Object(value) => Ok(Object { value, duplicates }),
        _ => Err("invalid JSON body: expected a JSON object".into()),
    }
}

/// Reads `body` as a JSON object into `T`: a body with a key given twice, one that is not
/// an object, or one that is not a `T` is refused with a 400's message.
pub fn from_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    let object = parse_object(body)?;
    object.refuse_duplicates()?;
    object.into_typed()
}

/// A JSON value, each object's repeated keys pushed to the list it holds.
struct Noting<'a>(&'a mut Vec<String>);

impl<'de> DeserializeSeed<'de> for Noting<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Value, D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Noting<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    /// A number written with a fraction or exponent that is a whole number (`3.0`,
    /// `1e3`) is that integer: JSON Schema's `integer` takes it, so the fields typed as
    /// integers do too (2^53 and beyond are not exact in an f64, and stay floats).
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
        if v.fract() == 0.0 && v.abs() < EXACT {
            return Ok(Value::from(v as i64));
        }
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, de: D) -> Result<Value, D::Error> {
        self.deserialize(de)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(Noting(&mut *self.0))? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value_seed(Noting(&mut *self.0))?;
            if out.insert(key.clone(), value).is_some() {
                self.0.push(key);
            }
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[test]
    fn a_key_given_twice_is_noted_at_any_depth() {
        let o = parse_object(br#"{"config": {"driver": "oci", "driver": "process"}}"#).unwrap();
        assert_eq!(o.duplicates, ["driver"]);
        assert_eq!(o.value["config"]["driver"], "process");
        let o = parse_object(br#"{"a": [{"b": 1, "b": 2}], "a": 3}"#).unwrap();
        assert_eq!(o.duplicates, ["b", "a"]);
        let err = from_body::<Value>(br#"{"x": 1, "x": 1}"#).unwrap_err();
        assert!(err.contains("\"x\" is given more than once"), "{err}");
    }

    #[test]
    fn a_body_without_repeats_reads_as_serde_json_reads_it() {
        let body = br#"{"s": "t\u00e9", "n": -3, "u": 18446744073709551615, "f": 1.5,
                         "b": true, "z": null, "l": [1, {"k": []}], "o": {}}"#;
        let o = parse_object(body).unwrap();
        assert!(o.duplicates.is_empty());
        let plain: Value = serde_json::from_slice(body).unwrap();
        assert_eq!(Value::Object(o.value), plain);
    }

    #[test]
    fn empty_is_an_empty_object_and_anything_but_an_object_is_refused() {
        assert_eq!(parse_object(b"  \n").unwrap().value, Map::new());
        for body in [&b"[1]"[..], b"3", b"\"s\"", b"{", b"{} {}", b"{\"a\": }"] {
            let err = parse_object(body).unwrap_err();
            assert!(err.starts_with("invalid JSON body"), "{err}");
        }
    }

    #[test]
    fn a_typed_body_names_the_field_that_is_wrong() {
        #[derive(Debug, Deserialize)]
        struct T {
            #[allow(dead_code)]
            n: u32,
        }
        let err = from_body::<T>(br#"{"n": "x"}"#).unwrap_err();
        assert!(err.starts_with("invalid request:"), "{err}");
        assert!(from_body::<T>(br#"{"n": 1, "extra": 2}"#).is_ok());
    }

    #[test]
    fn whole_numbers_written_as_floats_are_integers() {
        #[derive(serde::Deserialize)]
        struct Sizes {
            a: u16,
            b: i64,
            c: f64,
        }
        let got: Sizes = from_body(br#"{"a": 154.0, "b": -1e3, "c": 2.5}"#).unwrap();
        assert_eq!((got.a, got.b, got.c), (154, -1000, 2.5));
        assert!(from_body::<Sizes>(br#"{"a": 1.5, "b": 1, "c": 1}"#).is_err());
        assert!(from_body::<Sizes>(br#"{"a": 1, "b": 1e300, "c": 1}"#).is_err());
    }
}
