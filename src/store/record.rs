//! What a run records of its flow: [`RunDefinition`], its own versioned type, separate from the
//! loader's [`Flow`] so that the loader can change without breaking runs already recorded.
//!
//! Versioning: every change to what is recorded raises [`VERSION`], and a field added later is
//! `#[serde(default)]`, so a run recorded by an older binary loads, with the defaults, in a newer
//! one. A record of a higher version than this binary knows is refused ([`RecordError::Newer`]),
//! and so is a field this version does not know: an older binary never runs a newer record with
//! part of it silently ignored. Each version written is kept as a fixture in
//! `tests/fixtures/records/run-definition-vN.json` and must go on loading.

use crate::classify::classes::ClassTree;
use crate::flow::{self, Flow};
use crate::retry::{Backoff, RetryPolicy};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// The version this binary writes, and the highest it reads.
pub(crate) const VERSION: u32 = 1;

/// Why a recorded definition cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error(
        "its definition was recorded by a newer waymark (run record version {found}; this one reads up to \
         {known}); resume it with that waymark, or start the flow anew with `waymark run --fresh FLOW`"
    )]
    Newer { found: u64, known: u32 },
    #[error(
        "its recorded definition cannot be read ({0}); the database was changed behind waymark's back: \
         `waymark run --fresh FLOW` starts the flow anew"
    )]
    Corrupt(String),
}

/// A run's definition as recorded when the run started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunDefinition {
    pub(crate) version: u32,
    pub(crate) name: String,
    /// Whether the file declared its `name` (the run then belongs to the name, not to the file).
    pub(crate) name_declared: bool,
    /// The flow file the run started from, absolute.
    pub(crate) path: PathBuf,
    /// How old an unfinished run may be and still be resumed by `waymark run`.
    #[serde(with = "opt_duration")]
    pub(crate) resume_within: Option<Duration>,
    pub(crate) env: BTreeMap<String, String>,
    /// The flow's own error classes and their direct bases, in declaration order.
    pub(crate) errors: Vec<RecordedClass>,
    pub(crate) exit_codes: RecordedExitCodes,
    pub(crate) steps: Vec<RecordedStep>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RecordedClass {
    pub(crate) name: String,
    pub(crate) bases: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RecordedExitCodes {
    pub(crate) codes: BTreeMap<u8, String>,
    /// Keyed by canonical signal name (`SIGTERM`).
    pub(crate) signals: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RecordedStep {
    pub(crate) name: String,
    pub(crate) command: RecordedCommand,
    #[serde(with = "opt_duration")]
    pub(crate) timeout: Option<Duration>,
    pub(crate) retry: RecordedRetry,
    pub(crate) retry_name: Option<String>,
    pub(crate) exit_codes: RecordedExitCodes,
    pub(crate) env: BTreeMap<String, String>,
    pub(crate) workdir: PathBuf,
    /// Canonical signal name (`SIGTERM`).
    pub(crate) kill_signal: String,
    #[serde(with = "duration")]
    pub(crate) kill_grace: Duration,
    pub(crate) detect_tracebacks: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum RecordedCommand {
    Run(Vec<String>),
    Shell(String),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RecordedRetry {
    pub(crate) attempts: u32,
    pub(crate) exception_types: Vec<String>,
    pub(crate) backoff: RecordedBackoff,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RecordedBackoff {
    #[serde(with = "duration")]
    pub(crate) initial: Duration,
    pub(crate) multiplier: f64,
    #[serde(with = "opt_duration")]
    pub(crate) max: Option<Duration>,
    pub(crate) jitter: bool,
}

impl RunDefinition {
    /// Read a recorded definition: a version this binary knows, or an error saying why not.
    pub(crate) fn parse(json: &str) -> Result<RunDefinition, RecordError> {
        let value: serde_json::Value = serde_json::from_str(json).map_err(|e| RecordError::Corrupt(e.to_string()))?;
        let Some(object) = value.as_object() else {
            return Err(RecordError::Corrupt("it is not a JSON object".into()));
        };
        match object.get("version") {
            // Recorded before run records had versions: the loader's model, serialised as is.
            None => serde_json::from_value::<Flow>(value)
                .map(|flow| RunDefinition::from(&flow))
                .map_err(|e| RecordError::Corrupt(format!("unversioned record: {e}"))),
            Some(v) => match v.as_u64() {
                Some(found) if found > u64::from(VERSION) => Err(RecordError::Newer { found, known: VERSION }),
                Some(found) if found >= 1 => {
                    serde_json::from_value(value).map_err(|e| RecordError::Corrupt(e.to_string()))
                }
                _ => Err(RecordError::Corrupt(format!("`version` is {v}, not a version number"))),
            },
        }
    }

    pub(crate) fn to_json(&self) -> String {
        // Plain data with string keys: serialising it cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The flow the executor runs. Spans into the flow file are not recorded (they are empty).
    pub(crate) fn into_flow(self) -> Result<Flow, RecordError> {
        let signal = |name: &str| {
            flow::model::Signal::parse(name).ok_or_else(|| RecordError::Corrupt(format!("unknown signal `{name}`")))
        };
        let exit_codes = |codes: RecordedExitCodes| -> Result<flow::model::ExitCodes, RecordError> {
            for name in codes.signals.keys() {
                signal(name)?;
            }
            Ok(flow::model::ExitCodes { codes: codes.codes, signals: codes.signals })
        };
        let classes = ClassTree::new(self.errors.into_iter().map(|c| (c.name, c.bases)).collect())
            .map_err(|e| RecordError::Corrupt(e.to_string()))?;
        let steps = self
            .steps
            .into_iter()
            .map(|s| {
                Ok(flow::Step {
                    name: s.name,
                    span: 0..0,
                    command: match s.command {
                        RecordedCommand::Run(argv) => flow::model::Command::Run(argv),
                        RecordedCommand::Shell(script) => flow::model::Command::Shell(script),
                    },
                    timeout: s.timeout,
                    retry: RetryPolicy {
                        attempts: s.retry.attempts,
                        exception_types: s.retry.exception_types,
                        backoff: Backoff {
                            initial: s.retry.backoff.initial,
                            multiplier: s.retry.backoff.multiplier,
                            max: s.retry.backoff.max,
                            jitter: s.retry.backoff.jitter,
                        },
                    },
                    retry_name: s.retry_name,
                    exit_codes: exit_codes(s.exit_codes)?,
                    env: s.env,
                    workdir: s.workdir,
                    kill_signal: signal(&s.kill_signal)?,
                    kill_grace: s.kill_grace,
                    detect_tracebacks: s.detect_tracebacks,
                })
            })
            .collect::<Result<Vec<_>, RecordError>>()?;
        Ok(Flow {
            name: self.name,
            name_declared: self.name_declared,
            path: self.path,
            resume_within: self.resume_within,
            env: self.env,
            classes,
            exit_codes: exit_codes(self.exit_codes)?,
            steps,
        })
    }
}

impl From<&Flow> for RunDefinition {
    fn from(flow: &Flow) -> RunDefinition {
        let exit_codes =
            |e: &flow::model::ExitCodes| RecordedExitCodes { codes: e.codes.clone(), signals: e.signals.clone() };
        RunDefinition {
            version: VERSION,
            name: flow.name.clone(),
            name_declared: flow.name_declared,
            path: flow.path.clone(),
            resume_within: flow.resume_within,
            env: flow.env.clone(),
            errors: flow
                .classes
                .user
                .iter()
                .map(|(name, bases)| RecordedClass { name: name.clone(), bases: bases.clone() })
                .collect(),
            exit_codes: exit_codes(&flow.exit_codes),
            steps: flow
                .steps
                .iter()
                .map(|s| RecordedStep {
                    name: s.name.clone(),
                    command: match &s.command {
                        flow::model::Command::Run(argv) => RecordedCommand::Run(argv.clone()),
                        flow::model::Command::Shell(script) => RecordedCommand::Shell(script.clone()),
                    },
                    timeout: s.timeout,
                    retry: RecordedRetry {
                        attempts: s.retry.attempts,
                        exception_types: s.retry.exception_types.clone(),
                        backoff: RecordedBackoff {
                            initial: s.retry.backoff.initial,
                            multiplier: s.retry.backoff.multiplier,
                            max: s.retry.backoff.max,
                            jitter: s.retry.backoff.jitter,
                        },
                    },
                    retry_name: s.retry_name.clone(),
                    exit_codes: exit_codes(&s.exit_codes),
                    env: s.env.clone(),
                    workdir: s.workdir.clone(),
                    kill_signal: s.kill_signal.name().to_owned(),
                    kill_grace: s.kill_grace,
                    detect_tracebacks: s.detect_tracebacks,
                })
                .collect(),
        }
    }
}

/// A duration as humantime text (`1m 30s`, exact to the nanosecond).
mod duration {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        humantime::parse_duration(&text).map_err(|e| serde::de::Error::custom(format!("duration `{text}`: {e}")))
    }
}

mod opt_duration {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub(super) fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => super::duration::serialize(d, s),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|text| {
                humantime::parse_duration(&text)
                    .map_err(|e| serde::de::Error::custom(format!("duration `{text}`: {e}")))
            })
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/records");

    fn fixture(name: &str) -> String {
        std::fs::read_to_string(Path::new(FIXTURES).join(name)).unwrap()
    }

    /// The fixture's flow as the loader builds it today.
    fn fixture_flow() -> Flow {
        let toml = fixture("run-definition-v1.toml");
        flow::parse(&toml, Path::new("/srv/waymark-fixture/nightly.toml")).unwrap().0
    }

    fn without_spans(mut flow: Flow) -> Flow {
        for step in &mut flow.steps {
            step.span = 0..0;
        }
        flow
    }

    #[test]
    fn the_version_1_fixture_loads_as_the_flow_it_was_recorded_from() {
        let recorded = RunDefinition::parse(&fixture("run-definition-v1.json")).unwrap();
        assert_eq!(recorded.version, 1);
        assert_eq!(recorded.into_flow().unwrap(), without_spans(fixture_flow()));
    }

    /// Whatever this binary records must be kept as a fixture: raising [`VERSION`] without adding
    /// `run-definition-vN.json` (or changing what is recorded without raising it) fails here.
    #[test]
    fn this_version_records_exactly_its_fixture() {
        let written = RunDefinition::from(&fixture_flow()).to_json();
        let written: serde_json::Value = serde_json::from_str(&written).unwrap();
        let kept: serde_json::Value =
            serde_json::from_str(&fixture(&format!("run-definition-v{VERSION}.json"))).unwrap();
        assert_eq!(written, kept);
    }

    #[test]
    fn a_newer_version_is_refused_with_what_to_do() {
        let mut record: serde_json::Value = serde_json::from_str(&fixture("run-definition-v1.json")).unwrap();
        record["version"] = (VERSION + 1).into();
        record["dependencies"] = serde_json::json!({"report": ["fetch"]});
        let err = RunDefinition::parse(&record.to_string()).unwrap_err();
        assert!(matches!(err, RecordError::Newer { found, known: VERSION } if found == u64::from(VERSION) + 1));
        assert_eq!(
            err.to_string(),
            "its definition was recorded by a newer waymark (run record version 2; this one reads up to 1); \
             resume it with that waymark, or start the flow anew with `waymark run --fresh FLOW`"
        );
    }

    #[test]
    fn an_unknown_field_in_a_known_version_is_corruption_not_ignored() {
        let mut record: serde_json::Value = serde_json::from_str(&fixture("run-definition-v1.json")).unwrap();
        record["steps"][0]["needs"] = serde_json::json!(["report"]);
        let err = RunDefinition::parse(&record.to_string()).unwrap_err();
        let RecordError::Corrupt(what) = &err else { panic!("{err:?}") };
        assert!(what.starts_with("unknown field `needs`"), "{what}");
    }

    #[test]
    fn a_missing_or_bad_version_is_corruption() {
        for (json, what) in [
            (r#"{"version": 0}"#, "`version` is 0, not a version number"),
            (r#"{"version": "1"}"#, r#"`version` is "1", not a version number"#),
            ("[]", "it is not a JSON object"),
        ] {
            let err = RunDefinition::parse(json).unwrap_err();
            assert!(matches!(&err, RecordError::Corrupt(w) if w == what), "{json}: {err}");
        }
    }

    #[test]
    fn a_record_from_before_versions_is_read_as_the_flow_it_was() {
        let flow = fixture_flow();
        let legacy = serde_json::to_string(&flow).unwrap();
        assert_eq!(RunDefinition::parse(&legacy).unwrap().into_flow().unwrap(), without_spans(flow));
    }
}
