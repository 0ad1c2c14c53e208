//! Serde types that mirror the flow file exactly. Unknown keys are rejected and every value keeps
//! its span, so validation (in `validate.rs`) can point at the offending text.

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use std::collections::BTreeMap;
use std::fmt;
use toml::Spanned;

pub type Str = Spanned<String>;
pub type StrMap = BTreeMap<Str, Str>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFlow {
    pub name: Option<Str>,
    pub resume_within: Option<Spanned<RawDuration>>,
    #[serde(default)]
    pub env: StrMap,
    pub defaults: Option<RawDefaults>,
    #[serde(default)]
    pub policies: BTreeMap<Str, Spanned<RawPolicy>>,
    #[serde(default)]
    pub errors: BTreeMap<Str, Spanned<Vec<Str>>>,
    #[serde(default)]
    pub exit_codes: StrMap,
    #[serde(default)]
    pub step: Vec<Spanned<RawStep>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDefaults {
    pub timeout: Option<Spanned<RawDuration>>,
    pub retry: Option<Spanned<RawRetry>>,
    pub kill_signal: Option<Str>,
    pub kill_grace: Option<Spanned<RawDuration>>,
    pub detect_errors: Option<Str>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStep {
    pub name: Option<Str>,
    pub run: Option<Spanned<Vec<Str>>>,
    pub shell: Option<Str>,
    pub timeout: Option<Spanned<RawDuration>>,
    pub retry: Option<Spanned<RawRetry>>,
    #[serde(default)]
    pub exit_codes: StrMap,
    #[serde(default)]
    pub env: StrMap,
    pub workdir: Option<Str>,
    pub kill_signal: Option<Str>,
    pub kill_grace: Option<Spanned<RawDuration>>,
    pub detect_errors: Option<Str>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPolicy {
    pub attempts: Option<Spanned<i64>>,
    pub exception_types: Option<Spanned<Vec<Str>>>,
    pub backoff_seconds: Option<Spanned<f64>>,
    pub backoff_multiplier: Option<Spanned<f64>>,
    pub backoff_max_seconds: Option<Spanned<f64>>,
    pub jitter: Option<bool>,
}

/// `retry = "name"` or `retry = { ... }`.
#[derive(Debug)]
pub enum RawRetry {
    Named(String),
    Inline(RawPolicy),
}

impl<'de> Deserialize<'de> for RawRetry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawRetry;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a retry policy table or the name of a [policies] entry")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawRetry, E> {
                Ok(RawRetry::Named(v.to_owned()))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawRetry, A::Error> {
                RawPolicy::deserialize(de::value::MapAccessDeserializer::new(map)).map(RawRetry::Inline)
            }
        }
        d.deserialize_any(V)
    }
}

/// A duration as written: seconds as a number, or a humantime string.
#[derive(Debug, Clone)]
pub enum RawDuration {
    Seconds(f64),
    Text(String),
}

impl<'de> Deserialize<'de> for RawDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = RawDuration;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number of seconds or a duration string such as \"90s\" or \"2m 30s\"")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawDuration, E> {
                Ok(RawDuration::Seconds(v as f64))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawDuration, E> {
                Ok(RawDuration::Seconds(v as f64))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<RawDuration, E> {
                Ok(RawDuration::Seconds(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawDuration, E> {
                Ok(RawDuration::Text(v.to_owned()))
            }
        }
        d.deserialize_any(V)
    }
}
