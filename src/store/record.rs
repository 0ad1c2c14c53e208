//! What a run records of its flow: [`RunDefinition`], its own versioned type, separate from the
//! loader's [`Flow`] so that the loader can change without breaking runs already recorded.
//!
//! Versioning: every change to what is recorded raises [`VERSION`], and a field added later is
//! `#[serde(default)]`, so a run recorded by an older binary loads, with the defaults, in a newer
//! one. A record of a higher version than this binary knows is refused ([`RecordError::Newer`]),
//! and so is a field this version does not know: an older binary never runs a newer record with
//! part of it silently ignored. Each version written is kept as a fixture in
//! `tests/fixtures/records/run-definition-vN.json` and must go on loading.
//!
//! Version 2 added the workflow structure: `needs`, `catch` and `compensate` per step, and
//! `max_parallel`, `fail_fast`, `timeout`, `params`, `env_file`, `secret_env` and `hooks` per
//! flow. Their defaults are what a version 1 run meant: each step needs the one before it (so
//! nothing runs side by side and `max_parallel` changes nothing), no deadline, no handlers, no
//! compensation, no hooks, no parameters, no env file, no secrets.
//!
//! Version 3 added `param_values`: the value of each parameter the run was started with, so that a
//! resumed run goes on with them. A version 2 record has none (no version 2 waymark ran a flow
//! with parameters). The env file's contents are never recorded (only its path): they may hold
//! secrets, and are read again by each runner.
//!
//! Version 4 records the same fields, but leaves out each one at its default (a 10,000-step
//! flow's record shrinks about eightfold): an absent field reads as the default written next to
//! it here, fixed by the version (never the loader's default of the day), and an absent step
//! `workdir` is the directory of the flow file. Records of versions 1 to 3 hold every field they
//! had; one without a field its version always wrote is corrupt.

use crate::classify::classes::ClassTree;
use crate::flow::model::{Catch, Command, Hooks, Param, implicit_needs};
use crate::flow::{self, Flow};
use crate::retry::{Backoff, RetryPolicy};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The version this binary writes, and the highest it reads.
pub(crate) const VERSION: u32 = 4;

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
/// `S` is what each step is recorded as: [`RecordedStep`], or (to record a flow, see
/// [`RunDefinition::json_of`]) a view of the flow's step that copies nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunDefinition<S = RecordedStep> {
    pub(crate) version: u32,
    pub(crate) name: String,
    /// Whether the file declared its `name` (the run then belongs to the name, not to the file).
    #[serde(default, skip_serializing_if = "is_false")]
    pub(crate) name_declared: bool,
    /// The flow file the run started from, absolute.
    pub(crate) path: PathBuf,
    /// How old an unfinished run may be and still be resumed by `waymark run`.
    #[serde(default, with = "opt_duration", skip_serializing_if = "Option::is_none")]
    pub(crate) resume_within: Option<Duration>,
    /// The flow's `max_parallel` (since version 2).
    #[serde(default = "default_max_parallel", skip_serializing_if = "is_default_max_parallel")]
    pub(crate) max_parallel: u32,
    /// Since version 2.
    #[serde(default, skip_serializing_if = "is_false")]
    pub(crate) fail_fast: bool,
    /// The workflow deadline (since version 2).
    #[serde(default, with = "opt_duration", skip_serializing_if = "Option::is_none")]
    pub(crate) timeout: Option<Duration>,
    /// The declared parameters (since version 2).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) params: BTreeMap<String, RecordedParam>,
    /// The value of each parameter for this run (since version 3).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) param_values: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) env: BTreeMap<String, String>,
    /// The dotenv file, absolute (since version 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) env_file: Option<PathBuf>,
    /// Since version 2.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) secret_env: Vec<String>,
    /// Since version 2.
    #[serde(default, skip_serializing_if = "RecordedHooks::is_empty")]
    pub(crate) hooks: RecordedHooks,
    /// The flow's own error classes and their direct bases, in declaration order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) errors: Vec<RecordedClass>,
    #[serde(default, skip_serializing_if = "RecordedExitCodes::is_empty")]
    pub(crate) exit_codes: RecordedExitCodes,
    pub(crate) steps: Vec<S>,
}

/// Fields of the run that every record before version 4 holds, and of each of its steps.
const ALWAYS_BEFORE_4: [&str; 8] =
    ["name", "name_declared", "path", "resume_within", "env", "errors", "exit_codes", "steps"];
const STEP_ALWAYS_BEFORE_4: [&str; 10] = [
    "name",
    "command",
    "timeout",
    "retry",
    "exit_codes",
    "env",
    "workdir",
    "kill_signal",
    "kill_grace",
    "detect_tracebacks",
];

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_true(b: &bool) -> bool {
    *b
}

fn yes() -> bool {
    true
}

/// The flow's `max_parallel` when its record has none (version 4): fixed here, not the loader's
/// default of the day, which a later waymark may change.
const RECORDED_MAX_PARALLEL: u32 = 4;

fn is_default_max_parallel(n: &u32) -> bool {
    *n == RECORDED_MAX_PARALLEL
}

/// A step's kill signal when its record has none (version 4).
const DEFAULT_KILL_SIGNAL: &str = "SIGTERM";
/// A step's kill grace when its record has none (version 4).
const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(10);

fn default_kill_signal() -> String {
    DEFAULT_KILL_SIGNAL.to_owned()
}

fn is_default_kill_signal(s: &str) -> bool {
    s == DEFAULT_KILL_SIGNAL
}

fn default_kill_grace() -> Duration {
    DEFAULT_KILL_GRACE
}

fn is_default_kill_grace(d: &Duration) -> bool {
    *d == DEFAULT_KILL_GRACE
}

fn default_max_parallel() -> u32 {
    RECORDED_MAX_PARALLEL
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RecordedParam {
    /// `None`: required.
    pub(crate) default: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RecordedHooks {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) on_success: Option<RecordedCommand>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) on_failure: Option<RecordedCommand>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) on_exit: Option<RecordedCommand>,
}

impl RecordedHooks {
    fn is_empty(&self) -> bool {
        *self == RecordedHooks::default()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RecordedCatch {
    pub(crate) exception_types: Vec<String>,
    /// `None`: the handler swallows the error.
    pub(crate) command: Option<RecordedCommand>,
}

impl From<&Catch> for RecordedCatch {
    fn from(c: &Catch) -> RecordedCatch {
        RecordedCatch {
            exception_types: c.exception_types.clone(),
            command: c.command.as_ref().map(RecordedCommand::from),
        }
    }
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
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) codes: BTreeMap<u8, String>,
    /// Keyed by canonical signal name (`SIGTERM`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) signals: BTreeMap<String, String>,
}

impl RecordedExitCodes {
    fn of(e: &flow::model::ExitCodes) -> RecordedExitCodes {
        RecordedExitCodes { codes: e.codes.clone(), signals: e.signals.clone() }
    }

    fn is_empty(&self) -> bool {
        self.codes.is_empty() && self.signals.is_empty()
    }
}

/// A step as recorded. [`StepView`] writes the same text from a borrowed step: a field added or
/// changed here is added or changed there too (the test
/// `a_flow_is_recorded_from_a_view_as_its_record_writes_it` compares both, for a flow that sets
/// every field away from its default).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RecordedStep {
    pub(crate) name: String,
    /// The names of the steps it needs, as written; `None` (and in version 1, always): the step
    /// before it (none for the first step). Since version 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) needs: Option<Vec<String>>,
    pub(crate) command: RecordedCommand,
    #[serde(default, with = "opt_duration", skip_serializing_if = "Option::is_none")]
    pub(crate) timeout: Option<Duration>,
    #[serde(default, skip_serializing_if = "RecordedRetry::is_none")]
    pub(crate) retry: RecordedRetry,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) retry_name: Option<String>,
    #[serde(default, skip_serializing_if = "RecordedExitCodes::is_empty")]
    pub(crate) exit_codes: RecordedExitCodes,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) env: BTreeMap<String, String>,
    /// `None` (version 4 only): the directory of the flow file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) workdir: Option<PathBuf>,
    /// Canonical signal name (`SIGTERM`).
    #[serde(default = "default_kill_signal", skip_serializing_if = "is_default_kill_signal")]
    pub(crate) kill_signal: String,
    #[serde(default = "default_kill_grace", with = "duration", skip_serializing_if = "is_default_kill_grace")]
    pub(crate) kill_grace: Duration,
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub(crate) detect_tracebacks: bool,
    /// Since version 2.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) catch: Vec<RecordedCatch>,
    /// Since version 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) compensate: Option<RecordedCommand>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum RecordedCommand {
    Run(Vec<String>),
    Shell(String),
}

impl From<&Command> for RecordedCommand {
    fn from(c: &Command) -> RecordedCommand {
        match c {
            Command::Run(argv) => RecordedCommand::Run(argv.clone()),
            Command::Shell(script) => RecordedCommand::Shell(script.clone()),
        }
    }
}

impl From<RecordedCommand> for Command {
    fn from(c: RecordedCommand) -> Command {
        match c {
            RecordedCommand::Run(argv) => Command::Run(argv),
            RecordedCommand::Shell(script) => Command::Shell(script),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RecordedRetry {
    pub(crate) attempts: u32,
    pub(crate) exception_types: Vec<String>,
    pub(crate) backoff: RecordedBackoff,
}

/// A step's retry when its record has none (version 4): one attempt, no error retried, no
/// backoff.
impl Default for RecordedRetry {
    fn default() -> RecordedRetry {
        RecordedRetry {
            attempts: 1,
            exception_types: Vec::new(),
            backoff: RecordedBackoff { initial: Duration::ZERO, multiplier: 1.0, max: None, jitter: false },
        }
    }
}

impl RecordedRetry {
    fn is_none(&self) -> bool {
        *self == RecordedRetry::default()
    }
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
        // The common case in one pass, without building a JSON tree first (a 10,000-step record
        // takes several times as long through one): a record of this version. Anything else, or
        // a record that does not read, takes the checked way below, whose errors are the ones
        // reported.
        if let Ok(definition) = serde_json::from_str::<RunDefinition>(json)
            && definition.version == VERSION
        {
            return Ok(definition);
        }
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
                    if let Some(field) = field_after(object, found) {
                        return Err(RecordError::Corrupt(format!(
                            "`{field}` is not part of run record version {found}, which it claims to be"
                        )));
                    }
                    if let Some(field) = field_missing(object, found) {
                        return Err(RecordError::Corrupt(format!(
                            "`{field}` is missing, which run record version {found} always holds"
                        )));
                    }
                    serde_json::from_value(value).map_err(|e| RecordError::Corrupt(e.to_string()))
                }
                _ => Err(RecordError::Corrupt(format!("`version` is {v}, not a version number"))),
            },
        }
    }

    #[cfg(test)]
    pub(crate) fn to_json(&self) -> String {
        serde_json::to_string(self).expect("the tests' flows have UTF-8 paths")
    }

    /// What `RunDefinition::from(flow).to_json()` writes, without copying the flow's steps first
    /// (for a 10,000-step flow, most of the cost of recording it).
    /// It fails only on a path that is not UTF-8 (the flow's, a step's `workdir` or `env_file`),
    /// which `waymark run` refuses before it records anything.
    pub(crate) fn json_of(flow: &Flow) -> Result<String, serde_json::Error> {
        // The flow file's directory, found once: finding it again for every step was a fifth of
        // the cost of writing a 10,000-step definition.
        let flow_dir = flow.path.parent();
        serde_json::to_string(&RunDefinition::of(flow, |step| LazyStep { flow, flow_dir, step }))
    }

    /// Whether `flow` records as exactly `recorded` (the text [`RunDefinition::json_of`] gives),
    /// compared while it is written: no copy of the text (megabytes for 10,000 steps) is made,
    /// and the first difference ends the comparison. `false` where `json_of` fails.
    pub(crate) fn records_as(flow: &Flow, recorded: &str) -> bool {
        /// A writer that takes only the bytes `rest` starts with, and leaves the rest.
        struct Same<'a> {
            rest: &'a [u8],
        }
        impl std::io::Write for Same<'_> {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                match self.rest.strip_prefix(buf) {
                    Some(rest) => {
                        self.rest = rest;
                        Ok(buf.len())
                    }
                    None => Err(std::io::Error::other("the definition differs")),
                }
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let flow_dir = flow.path.parent();
        let mut same = Same { rest: recorded.as_bytes() };
        // The serialiser writes a token at a time: compared in pieces, a comparison per token
        // cost as much as the writing.
        let mut buffered = std::io::BufWriter::with_capacity(16 * 1024, &mut same);
        let written =
            serde_json::to_writer(&mut buffered, &RunDefinition::of(flow, |step| LazyStep { flow, flow_dir, step }));
        written.is_ok() && buffered.into_inner().is_ok() && same.rest.is_empty()
    }

    /// [`RunDefinition::json_of`] for a store at `location` creating a run.
    pub(crate) fn recorded(flow: &Flow, location: &str) -> Result<String, super::StoreError> {
        RunDefinition::json_of(flow).map_err(|e| {
            super::StoreError::failed(
                super::StoreErrorKind::Other,
                location,
                format!(
                    "the definition of flow {} cannot be recorded ({e}): a path in it (the flow's own, or a \
                     step's `workdir` or `env_file`) is not valid UTF-8; move the flow to a path that is",
                    flow.path.display()
                ),
            )
        })
    }

    /// Whether `json` was written by this version's [`RunDefinition::json_of`] (compact JSON,
    /// `version` first): only such a record can be the same text as a flow recorded now.
    pub(crate) fn is_current(json: &str) -> bool {
        json.strip_prefix("{\"version\":")
            .and_then(|rest| rest.split_once(','))
            .is_some_and(|(version, _)| version.parse() == Ok(VERSION))
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
        if self.max_parallel == 0 {
            return Err(RecordError::Corrupt("`max_parallel` is 0; it is at least 1".into()));
        }
        if let Some(name) = self.param_values.keys().find(|name| !self.params.contains_key(*name)) {
            return Err(RecordError::Corrupt(format!("a value is recorded for `{name}`, which is not a parameter")));
        }
        let needs = needs(&self.steps)?;
        // Where steps run unless they say otherwise, shared by them.
        let flow_dir: std::sync::Arc<std::path::Path> =
            self.path.parent().map_or_else(|| std::path::Path::new("").into(), Into::into);
        let steps = self
            .steps
            .into_iter()
            .zip(needs)
            .map(|(s, needs)| {
                Ok(flow::Step {
                    name: s.name,
                    span: 0..0,
                    needs_explicit: s.needs.is_some(),
                    needs,
                    command: s.command.into(),
                    timeout: s.timeout,
                    retry: std::sync::Arc::new(RetryPolicy {
                        attempts: s.retry.attempts,
                        exception_types: s.retry.exception_types,
                        backoff: Backoff {
                            initial: s.retry.backoff.initial,
                            multiplier: s.retry.backoff.multiplier,
                            max: s.retry.backoff.max,
                            jitter: s.retry.backoff.jitter,
                        },
                    }),
                    retry_name: s.retry_name,
                    exit_codes: exit_codes(s.exit_codes)?,
                    env: s.env,
                    workdir: match s.workdir {
                        Some(workdir) => workdir.into(),
                        None => flow_dir.clone(),
                    },
                    kill_signal: signal(&s.kill_signal)?,
                    kill_grace: s.kill_grace,
                    detect_tracebacks: s.detect_tracebacks,
                    catch: s
                        .catch
                        .into_iter()
                        .map(|c| Catch { exception_types: c.exception_types, command: c.command.map(Command::from) })
                        .collect(),
                    compensate: s.compensate.map(Command::from),
                })
            })
            .collect::<Result<Vec<_>, RecordError>>()?;
        let hooks = Hooks {
            on_success: self.hooks.on_success.map(Command::from),
            on_failure: self.hooks.on_failure.map(Command::from),
            on_exit: self.hooks.on_exit.map(Command::from),
        };
        Ok(Flow {
            name: self.name,
            name_declared: self.name_declared,
            path: self.path,
            resume_within: self.resume_within,
            max_parallel: self.max_parallel,
            fail_fast: self.fail_fast,
            timeout: self.timeout,
            params: self.params.into_iter().map(|(name, p)| (name, Param { default: p.default })).collect(),
            param_values: self.param_values,
            env: self.env,
            env_file: self.env_file,
            secret_env: self.secret_env,
            hooks,
            classes,
            exit_codes: exit_codes(self.exit_codes)?,
            steps,
        })
    }
}

/// Fields of the run and of each step added in version 2.
const SINCE_2: [&str; 7] = ["max_parallel", "fail_fast", "timeout", "params", "env_file", "secret_env", "hooks"];
const STEP_SINCE_2: [&str; 3] = ["needs", "catch", "compensate"];
/// Fields of the run added in version 3.
const SINCE_3: [&str; 1] = ["param_values"];

/// The first field that `record`, of version `found` (before 4), lacks though every record of
/// that version holds it (`steps[0].workdir`).
fn field_missing(record: &serde_json::Map<String, serde_json::Value>, found: u64) -> Option<String> {
    if found >= 4 {
        return None;
    }
    if let Some(field) = ALWAYS_BEFORE_4.iter().find(|f| !record.contains_key(**f)) {
        return Some((*field).to_owned());
    }
    let steps = record.get("steps").and_then(serde_json::Value::as_array)?;
    steps.iter().enumerate().find_map(|(i, step)| {
        let step = step.as_object()?;
        STEP_ALWAYS_BEFORE_4.iter().find(|f| !step.contains_key(**f)).map(|f| format!("steps[{i}].{f}"))
    })
}

/// The first field of `record` that its version `found` did not have yet (`steps[0].needs`).
fn field_after(record: &serde_json::Map<String, serde_json::Value>, found: u64) -> Option<String> {
    if found < 3
        && let Some(field) = SINCE_3.iter().find(|f| record.contains_key(**f))
    {
        return Some((*field).to_owned());
    }
    if found >= 2 {
        return None;
    }
    if let Some(field) = SINCE_2.iter().find(|f| record.contains_key(**f)) {
        return Some((*field).to_owned());
    }
    let steps = record.get("steps").and_then(serde_json::Value::as_array)?;
    steps.iter().enumerate().find_map(|(i, step)| {
        let step = step.as_object()?;
        STEP_SINCE_2.iter().find(|f| step.contains_key(**f)).map(|f| format!("steps[{i}].{f}"))
    })
}

/// The recorded steps' needs as indices: the named steps, or the step before. A name that is not
/// a recorded step, a name given twice, or a cycle is corruption: the loader never records one.
fn needs(steps: &[RecordedStep]) -> Result<Vec<flow::model::Needs>, RecordError> {
    // Hashed, presized: a 10,000-step record looks up 10,000 names.
    let mut index = std::collections::HashMap::with_capacity(steps.len());
    for (i, s) in steps.iter().enumerate().rev() {
        index.insert(s.name.as_str(), i);
    }
    let mut out = Vec::with_capacity(steps.len());
    for (i, step) in steps.iter().enumerate() {
        let Some(names) = &step.needs else {
            out.push(implicit_needs(i));
            continue;
        };
        let mut needs = Vec::with_capacity(names.len());
        let mut seen = std::collections::HashSet::new();
        for name in names {
            let &j = index.get(name.as_str()).ok_or_else(|| {
                RecordError::Corrupt(format!("step `{}` needs `{name}`, which is not a recorded step", step.name))
            })?;
            if !seen.insert(j) {
                return Err(RecordError::Corrupt(format!("step `{}` needs `{name}` twice", step.name)));
            }
            needs.push(j);
        }
        out.push(needs.into());
    }
    if let Some(cycle) = flow::graph::cycles(&out, 1).first() {
        // A corrupt record may hold any cycle: name at most ten of its steps.
        let mut names: Vec<&str> = cycle.steps.iter().take(10).map(|&i| steps[i].name.as_str()).collect();
        if cycle.steps.len() > names.len() {
            names.push("…");
        }
        return Err(RecordError::Corrupt(format!(
            "its steps need each other in a cycle: {} -> {}",
            names.join(" -> "),
            names[0]
        )));
    }
    Ok(out)
}

impl<S> RunDefinition<S> {
    /// `flow`'s definition, each of its steps recorded by `step`.
    fn of<'a>(flow: &'a Flow, step: impl FnMut(&'a flow::Step) -> S) -> RunDefinition<S> {
        let exit_codes = RecordedExitCodes::of;
        RunDefinition {
            version: VERSION,
            name: flow.name.clone(),
            name_declared: flow.name_declared,
            path: flow.path.clone(),
            resume_within: flow.resume_within,
            max_parallel: flow.max_parallel,
            fail_fast: flow.fail_fast,
            timeout: flow.timeout,
            params: flow
                .params
                .iter()
                .map(|(name, p)| (name.clone(), RecordedParam { default: p.default.clone() }))
                .collect(),
            param_values: flow.param_values.clone(),
            env: flow.env.clone(),
            env_file: flow.env_file.clone(),
            secret_env: flow.secret_env.clone(),
            hooks: RecordedHooks {
                on_success: flow.hooks.on_success.as_ref().map(RecordedCommand::from),
                on_failure: flow.hooks.on_failure.as_ref().map(RecordedCommand::from),
                on_exit: flow.hooks.on_exit.as_ref().map(RecordedCommand::from),
            },
            errors: flow
                .classes
                .user
                .iter()
                .map(|(name, bases)| RecordedClass { name: name.clone(), bases: bases.clone() })
                .collect(),
            exit_codes: exit_codes(&flow.exit_codes),
            steps: flow.steps.iter().map(step).collect(),
        }
    }
}

impl From<&Flow> for RunDefinition {
    fn from(flow: &Flow) -> RunDefinition {
        RunDefinition::of(flow, |s| RecordedStep {
            name: s.name.clone(),
            needs: s
                .needs_explicit
                .then(|| s.needs.iter().filter_map(|&i| flow.steps.get(i)).map(|n| n.name.clone()).collect()),
            command: (&s.command).into(),
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
            exit_codes: RecordedExitCodes::of(&s.exit_codes),
            env: s.env.clone(),
            // The flow file's directory, the usual one, goes without saying.
            workdir: (Some(&*s.workdir) != flow.path.parent()).then(|| s.workdir.to_path_buf()),
            kill_signal: s.kill_signal.name().to_owned(),
            kill_grace: s.kill_grace,
            detect_tracebacks: s.detect_tracebacks,
            catch: s.catch.iter().map(RecordedCatch::from).collect(),
            compensate: s.compensate.as_ref().map(RecordedCommand::from),
        })
    }
}

/// A step of a flow as [`RecordedStep`] serialises it, borrowed from the flow: the same fields,
/// in the same order, each left out under the same condition (`json_of` and `from` writing the
/// same text is tested).
#[derive(Serialize)]
struct StepView<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    needs: Option<Vec<&'a str>>,
    command: CommandView<'a>,
    #[serde(serialize_with = "opt_duration::serialize", skip_serializing_if = "Option::is_none")]
    timeout: Option<Duration>,
    #[serde(skip_serializing_if = "RetryView::is_none")]
    retry: RetryView<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_name: Option<&'a str>,
    #[serde(skip_serializing_if = "ExitCodesView::is_empty")]
    exit_codes: ExitCodesView<'a>,
    #[serde(skip_serializing_if = "no_entries")]
    env: &'a BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    workdir: Option<&'a Path>,
    #[serde(skip_serializing_if = "is_default_kill_signal_name")]
    kill_signal: &'static str,
    #[serde(serialize_with = "duration::serialize", skip_serializing_if = "is_default_kill_grace")]
    kill_grace: Duration,
    #[serde(skip_serializing_if = "is_true")]
    detect_tracebacks: bool,
    #[serde(skip_serializing_if = "<[_]>::is_empty", serialize_with = "catch_records")]
    catch: &'a [Catch],
    #[serde(skip_serializing_if = "Option::is_none")]
    compensate: Option<CommandView<'a>>,
}

/// A step's handlers as [`RecordedStep`] writes them (a list of [`RecordedCatch`]), each made as
/// it is written.
fn catch_records<S: serde::Serializer>(catch: &&[Catch], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(catch.iter().map(RecordedCatch::from))
}

/// Step `step` of `flow`, written as its [`StepView`], which is made as it is written: the views of
/// a 10,000-step flow are not all built (and then dropped) before the first is written.
struct LazyStep<'a> {
    flow: &'a Flow,
    /// `flow.path.parent()`.
    flow_dir: Option<&'a Path>,
    step: &'a flow::Step,
}

impl Serialize for LazyStep<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        StepView::of(self.flow, self.flow_dir, self.step).serialize(s)
    }
}

impl<'a> StepView<'a> {
    /// Step `s` of `flow`, whose file is in `flow_dir` (`flow.path.parent()`).
    fn of(flow: &'a Flow, flow_dir: Option<&Path>, s: &'a flow::Step) -> StepView<'a> {
        StepView {
            name: &s.name,
            needs: s
                .needs_explicit
                .then(|| s.needs.iter().filter_map(|&i| flow.steps.get(i)).map(|n| n.name.as_str()).collect()),
            command: CommandView::of(&s.command),
            timeout: s.timeout,
            retry: RetryView {
                attempts: s.retry.attempts,
                exception_types: &s.retry.exception_types,
                backoff: RecordedBackoff {
                    initial: s.retry.backoff.initial,
                    multiplier: s.retry.backoff.multiplier,
                    max: s.retry.backoff.max,
                    jitter: s.retry.backoff.jitter,
                },
            },
            retry_name: s.retry_name.as_deref(),
            exit_codes: ExitCodesView { codes: &s.exit_codes.codes, signals: &s.exit_codes.signals },
            env: &s.env,
            workdir: (Some(&*s.workdir) != flow_dir).then_some(&*s.workdir),
            kill_signal: s.kill_signal.name(),
            kill_grace: s.kill_grace,
            detect_tracebacks: s.detect_tracebacks,
            catch: &s.catch,
            compensate: s.compensate.as_ref().map(CommandView::of),
        }
    }
}

/// [`RecordedCommand`], borrowed.
#[derive(Serialize)]
#[serde(rename_all = "snake_case")]
enum CommandView<'a> {
    Run(&'a [String]),
    Shell(&'a str),
}

impl<'a> CommandView<'a> {
    fn of(c: &'a Command) -> CommandView<'a> {
        match c {
            Command::Run(argv) => CommandView::Run(argv),
            Command::Shell(script) => CommandView::Shell(script),
        }
    }
}

/// [`RecordedRetry`], borrowed.
#[derive(Serialize)]
struct RetryView<'a> {
    attempts: u32,
    exception_types: &'a [String],
    backoff: RecordedBackoff,
}

impl RetryView<'_> {
    fn is_none(&self) -> bool {
        let none = RecordedRetry::default();
        self.attempts == none.attempts && self.exception_types.is_empty() && self.backoff == none.backoff
    }
}

/// [`RecordedExitCodes`], borrowed.
#[derive(Serialize)]
struct ExitCodesView<'a> {
    #[serde(skip_serializing_if = "no_entries")]
    codes: &'a BTreeMap<u8, String>,
    #[serde(skip_serializing_if = "no_entries")]
    signals: &'a BTreeMap<String, String>,
}

impl ExitCodesView<'_> {
    fn is_empty(&self) -> bool {
        self.codes.is_empty() && self.signals.is_empty()
    }
}

fn no_entries<K, V>(map: &&BTreeMap<K, V>) -> bool {
    map.is_empty()
}

fn is_default_kill_signal_name(s: &&str) -> bool {
    is_default_kill_signal(s)
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

    /// The flow behind the fixture of `version`, as the loader builds it today; from version 3 on,
    /// as run with `--param date=2026-01-31` (`region` keeps its default).
    fn fixture_flow(version: u32) -> Flow {
        let toml = fixture(&format!("run-definition-v{version}.toml"));
        let mut flow = flow::parse(&toml, Path::new("/srv/waymark-fixture/nightly.toml")).unwrap().0;
        if version >= 3 {
            flow.param_values = flow::params::resolve(&flow, &[("date".into(), "2026-01-31".into())]).unwrap();
        }
        flow
    }

    fn without_spans(mut flow: Flow) -> Flow {
        for step in &mut flow.steps {
            step.span = 0..0;
        }
        flow
    }

    /// Every fixture ever written loads as the flow it was recorded from, loaded today.
    #[test]
    fn every_version_s_fixture_loads_as_the_flow_it_was_recorded_from() {
        for version in 1..=VERSION {
            let recorded = RunDefinition::parse(&fixture(&format!("run-definition-v{version}.json"))).unwrap();
            assert_eq!(recorded.version, version);
            assert_eq!(recorded.into_flow().unwrap(), without_spans(fixture_flow(version)), "version {version}");
        }
    }

    /// A run recorded before the workflow structure existed means what it meant: each step needs
    /// the one before (so nothing runs side by side), no deadline, handlers, compensation, hooks,
    /// parameters, env file or secrets.
    #[test]
    fn a_version_1_record_runs_its_steps_one_after_another_as_before() {
        let flow = RunDefinition::parse(&fixture("run-definition-v1.json")).unwrap().into_flow().unwrap();
        let needs: Vec<(Vec<usize>, bool)> = flow.steps.iter().map(|s| (s.needs.to_vec(), s.needs_explicit)).collect();
        assert_eq!(needs, [(vec![], false), (vec![0], false)]);
        assert!(!flow.has_explicit_needs());
        assert!(flow.steps.iter().all(|s| s.catch.is_empty() && s.compensate.is_none()));
        assert_eq!(flow.max_parallel, RECORDED_MAX_PARALLEL);
        assert!(!flow.fail_fast);
        assert_eq!(flow.timeout, None);
        assert_eq!(flow.hooks, Hooks::default());
        assert!(flow.params.is_empty() && flow.secret_env.is_empty() && flow.param_values.is_empty());
        assert_eq!(flow.env_file, None);
        // Recorded again today, its steps keep depending on the step before, not on nothing.
        let again = RunDefinition::from(&flow);
        assert!(again.steps.iter().all(|s| s.needs.is_none()));
    }

    #[test]
    fn the_version_2_fixture_keeps_the_workflow_structure() {
        let flow = RunDefinition::parse(&fixture("run-definition-v2.json")).unwrap().into_flow().unwrap();
        let needs: Vec<(Vec<usize>, bool)> = flow.steps.iter().map(|s| (s.needs.to_vec(), s.needs_explicit)).collect();
        assert_eq!(needs, [(vec![], true), (vec![], true), (vec![1, 0], true), (vec![2], false)]);
        assert_eq!(flow.max_parallel, 3);
        assert!(flow.fail_fast);
        assert_eq!(flow.timeout, Some(Duration::from_secs(9000)));
        assert_eq!(flow.params["date"].default, None);
        assert_eq!(flow.params["region"].default.as_deref(), Some("eu-west-1"));
        assert_eq!(flow.env_file.as_deref(), Some(Path::new("/srv/waymark-fixture/secrets/.env")));
        assert_eq!(flow.secret_env, ["API_TOKEN", "DB_PASSWORD"]);
        assert_eq!(flow.hooks.on_success, Some(Command::Run(vec!["notify".into(), "--ok".into()])));
        assert_eq!(flow.hooks.on_exit, Some(Command::Run(vec!["cleanup".into()])));
        assert_eq!(flow.steps[0].catch.len(), 2);
        assert_eq!(flow.steps[0].catch[1], Catch { exception_types: vec!["BadInput".into()], command: None });
        assert_eq!(flow.steps[2].catch[0].exception_types, ["Exception"]);
        assert_eq!(flow.steps[1].compensate, Some(Command::Shell("rm -f mirror.log".into())));
        assert!(flow.param_values.is_empty(), "version 2 records no parameter values");
    }

    #[test]
    fn the_version_3_fixture_keeps_the_values_the_run_was_given() {
        let flow = RunDefinition::parse(&fixture("run-definition-v3.json")).unwrap().into_flow().unwrap();
        let values: Vec<(&str, &str)> = flow.param_values.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(values, [("date", "2026-01-31"), ("region", "eu-west-1")]);
    }

    /// Version 4 leaves out what is at its default, and reads it back as that default: a step
    /// with nothing of its own is its name and command alone.
    #[test]
    fn the_version_4_fixture_leaves_defaults_out_and_reads_them_back() {
        let json = fixture("run-definition-v4.json");
        let record: serde_json::Value = serde_json::from_str(&json).unwrap();
        let keys = |v: &serde_json::Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(&record["steps"][3]), ["command", "name"]);
        assert_eq!(keys(&record["steps"][1]), ["command", "compensate", "name", "needs"]);
        let flow = RunDefinition::parse(&json).unwrap().into_flow().unwrap();
        let archive = &flow.steps[3];
        let once = RetryPolicy { attempts: 1, exception_types: vec![], backoff: Backoff::default() };
        assert_eq!(*archive.retry, once);
        assert_eq!((archive.kill_signal.name(), archive.kill_grace), ("SIGTERM", Duration::from_secs(10)));
        assert!(archive.detect_tracebacks && archive.env.is_empty() && archive.timeout.is_none());
        assert_eq!(&*archive.workdir, Path::new("/srv/waymark-fixture"));
        assert_eq!(&*flow.steps[2].workdir, Path::new("/srv/waymark-fixture/reports"));
        // A flow with nothing of its own records little more than its steps' names and commands.
        let plain = RunDefinition::from(
            &flow::parse("[[step]]\nname = 'a'\nrun = ['true']\n", Path::new("/x/f.toml")).unwrap().0,
        );
        assert_eq!(
            plain.to_json(),
            r#"{"version":4,"name":"f","path":"/x/f.toml","steps":[{"name":"a","command":{"run":["true"]}}]}"#
        );
        // What was left out reads back as version 4's default, whatever the loader's is now.
        assert_eq!(RunDefinition::parse(&plain.to_json()).unwrap().into_flow().unwrap().max_parallel, 4);
    }

    /// Before version 4 every record holds every field of its version: one left out is not a
    /// default but a record changed behind waymark's back.
    #[test]
    fn a_field_missing_from_a_record_before_version_4_is_corruption() {
        for version in 1..=3 {
            let mut record: serde_json::Value =
                serde_json::from_str(&fixture(&format!("run-definition-v{version}.json"))).unwrap();
            record["steps"][1].as_object_mut().unwrap().remove("workdir");
            let err = RunDefinition::parse(&record.to_string()).unwrap_err();
            assert!(
                matches!(&err, RecordError::Corrupt(w) if *w == format!("`steps[1].workdir` is missing, which run record version {version} always holds")),
                "{err}"
            );
        }
        let mut record: serde_json::Value = serde_json::from_str(&fixture("run-definition-v3.json")).unwrap();
        record.as_object_mut().unwrap().remove("resume_within");
        assert!(
            RunDefinition::parse(&record.to_string()).unwrap_err().to_string().contains("`resume_within` is missing")
        );
    }

    #[test]
    fn a_value_for_a_parameter_that_is_not_declared_is_corruption() {
        let mut record: serde_json::Value = serde_json::from_str(&fixture("run-definition-v3.json")).unwrap();
        record["param_values"]["zone"] = "x".into();
        let err = RunDefinition::parse(&record.to_string()).and_then(RunDefinition::into_flow).unwrap_err();
        assert!(
            matches!(&err, RecordError::Corrupt(what) if what == "a value is recorded for `zone`, which is not a parameter"),
            "{err}"
        );
    }

    /// Whatever this binary records must be kept as a fixture: raising [`VERSION`] without adding
    /// `run-definition-vN.json` (or changing what is recorded without raising it) fails here.
    /// What is recorded is written from a view of the flow (`json_of`), not through the owned
    /// record (`from`, then `to_json`): both write the same text, for every fixture's flow and
    /// for one with every step field away from its default.
    #[test]
    fn a_flow_is_recorded_from_a_view_as_its_record_writes_it() {
        let mut flows: Vec<Flow> = (1..=VERSION).map(fixture_flow).collect();
        let mut odd = fixture_flow(VERSION);
        for step in &mut odd.steps {
            step.workdir = Path::new("/elsewhere").into();
            step.retry_name = Some("network".into());
            step.detect_tracebacks = false;
            step.kill_grace = Duration::from_millis(1500);
            step.kill_signal = flow::model::Signal::parse("SIGINT").unwrap();
            step.exit_codes.codes.insert(3, "BadInput".into());
            step.exit_codes.signals.insert("SIGSEGV".into(), "RuntimeError".into());
            step.env.insert("K".into(), "v".into());
            step.timeout = Some(Duration::from_secs(90));
            step.needs_explicit = true;
            step.compensate = Some(Command::Shell("undo".into()));
            step.catch
                .push(Catch { exception_types: vec!["OSError".into()], command: Some(Command::Run(vec!["x".into()])) });
            let retry = std::sync::Arc::make_mut(&mut step.retry);
            retry.attempts = 3;
            retry.exception_types = vec!["OSError".into()];
        }
        flows.push(odd);
        for flow in &flows {
            let json = RunDefinition::json_of(flow).unwrap();
            assert_eq!(json, RunDefinition::from(flow).to_json());
            assert!(RunDefinition::is_current(&json));
            // And it reads back as the flow (`waymark run` resumes with the loaded flow when it
            // records as the run's record).
            let read = RunDefinition::parse(&json).unwrap().into_flow().unwrap();
            assert_eq!(read, without_spans(flow.clone()));
        }
    }

    /// `waymark run` resumes with the loaded flow only if it records as exactly the run's text:
    /// the same text is the same, and any other (a byte changed, more, less) is not.
    #[test]
    fn a_flow_records_as_exactly_its_own_text_and_no_other() {
        let flow = fixture_flow(VERSION);
        let json = RunDefinition::json_of(&flow).unwrap();
        assert!(RunDefinition::records_as(&flow, &json));
        assert!(!RunDefinition::records_as(&flow, &json[..json.len() - 1]));
        assert!(!RunDefinition::records_as(&flow, &format!("{json} ")));
        assert!(!RunDefinition::records_as(&flow, ""));
        let changed = json.replacen(&flow.steps[0].name, &format!("{}x", flow.steps[0].name), 1);
        assert_ne!(changed, json);
        assert!(!RunDefinition::records_as(&flow, &changed));
        let mut other = flow.clone();
        std::sync::Arc::make_mut(&mut other.steps[0].retry).attempts += 1;
        assert!(!RunDefinition::records_as(&other, &json));
        assert!(RunDefinition::records_as(&other, &RunDefinition::json_of(&other).unwrap()));
    }

    #[test]
    fn this_version_records_exactly_its_fixture() {
        let written = RunDefinition::json_of(&fixture_flow(VERSION)).unwrap();
        let written: serde_json::Value = serde_json::from_str(&written).unwrap();
        let kept: serde_json::Value =
            serde_json::from_str(&fixture(&format!("run-definition-v{VERSION}.json"))).unwrap();
        assert_eq!(written, kept);
    }

    #[test]
    fn a_newer_version_is_refused_with_what_to_do() {
        let mut record: serde_json::Value = serde_json::from_str(&fixture("run-definition-v1.json")).unwrap();
        record["version"] = (VERSION + 1).into();
        record["outputs"] = serde_json::json!({"report": ["fetch"]});
        let err = RunDefinition::parse(&record.to_string()).unwrap_err();
        assert!(matches!(err, RecordError::Newer { found, known: VERSION } if found == u64::from(VERSION) + 1));
        assert_eq!(
            err.to_string(),
            format!(
                "its definition was recorded by a newer waymark (run record version {}; this one reads up to \
                 {VERSION}); resume it with that waymark, or start the flow anew with `waymark run --fresh FLOW`",
                VERSION + 1
            )
        );
    }

    #[test]
    fn an_unknown_field_in_a_known_version_is_corruption_not_ignored() {
        let mut record: serde_json::Value = serde_json::from_str(&fixture("run-definition-v2.json")).unwrap();
        record["steps"][0]["outputs"] = serde_json::json!(["report"]);
        let err = RunDefinition::parse(&record.to_string()).unwrap_err();
        let RecordError::Corrupt(what) = &err else { panic!("{err:?}") };
        assert!(what.starts_with("unknown field `outputs`"), "{what}");
    }

    /// A version 1 record cannot carry what version 2 added: it would run with a meaning no
    /// version 1 waymark gave it.
    #[test]
    fn a_field_newer_than_the_record_s_version_is_corruption() {
        for (path, value) in [("needs", serde_json::json!(["report"])), ("catch", serde_json::json!([]))] {
            let mut record: serde_json::Value = serde_json::from_str(&fixture("run-definition-v1.json")).unwrap();
            record["steps"][1][path] = value;
            let err = RunDefinition::parse(&record.to_string()).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!(
                    "its recorded definition cannot be read (`steps[1].{path}` is not part of run record version 1, \
                     which it claims to be); the database was changed behind waymark's back: `waymark run --fresh \
                     FLOW` starts the flow anew"
                )
            );
        }
        let mut record: serde_json::Value = serde_json::from_str(&fixture("run-definition-v1.json")).unwrap();
        record["max_parallel"] = 2.into();
        assert!(RunDefinition::parse(&record.to_string()).unwrap_err().to_string().contains("`max_parallel` is not"));
        let mut record: serde_json::Value = serde_json::from_str(&fixture("run-definition-v2.json")).unwrap();
        record["param_values"] = serde_json::json!({"date": "2026-01-31"});
        assert!(
            RunDefinition::parse(&record.to_string())
                .unwrap_err()
                .to_string()
                .contains("(`param_values` is not part of run record version 2, which it claims to be)")
        );
    }

    #[test]
    fn needs_that_no_loader_records_are_corruption() {
        let corrupt = |edit: &dyn Fn(&mut serde_json::Value)| {
            let mut record: serde_json::Value = serde_json::from_str(&fixture("run-definition-v2.json")).unwrap();
            edit(&mut record);
            match RunDefinition::parse(&record.to_string()).and_then(RunDefinition::into_flow) {
                Err(RecordError::Corrupt(what)) => what,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(
            corrupt(&|r| r["steps"][2]["needs"] = serde_json::json!(["fetch", "gone"])),
            "step `report` needs `gone`, which is not a recorded step"
        );
        assert_eq!(
            corrupt(&|r| r["steps"][2]["needs"] = serde_json::json!(["fetch", "fetch"])),
            "step `report` needs `fetch` twice"
        );
        assert_eq!(
            corrupt(&|r| r["steps"][0]["needs"] = serde_json::json!(["archive"])),
            "its steps need each other in a cycle: fetch -> archive -> report -> fetch"
        );
        assert_eq!(corrupt(&|r| r["max_parallel"] = 0.into()), "`max_parallel` is 0; it is at least 1");
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
        let flow = fixture_flow(1);
        let legacy = serde_json::to_string(&flow).unwrap();
        assert_eq!(RunDefinition::parse(&legacy).unwrap().into_flow().unwrap(), without_spans(flow));
    }
}
