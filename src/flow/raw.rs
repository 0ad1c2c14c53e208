//! The flow file as written, read from the parsed TOML document by one walk against waymark's own
//! schema: the keys each table accepts and the type each value must have.
//!
//! The walk reports every unknown key (with a "did you mean" from our own key lists) and every
//! value of the wrong type (with what would work instead), all in one pass, each at its span and
//! key path. No message comes from serde or from the `toml` crate's wording, so a crate upgrade
//! cannot change a diagnostic. What the walk builds keeps every value's span, so validation (in
//! `validate.rs`) can point at the offending text.
//!
//! A key written with a value of the wrong type is reported once, here. It is still recorded as
//! written (`RawFlow::bad`, `RawStep::bad`), and a name it declares (a policy, an error class)
//! stays declared, so validation adds no second error about it being missing or unknown.

use super::diagnostic::Diagnostic;
use super::model::Signal;
use std::collections::BTreeMap;
use std::ops::Range;
use toml::Spanned;
use toml::de::{DeTable, DeValue};

pub(crate) type Str = Spanned<String>;
pub(crate) type StrMap = BTreeMap<Str, Str>;

/// The keys of the top level, in the order the README lists them.
pub(crate) const FLOW_KEYS: [&str; 15] = [
    "name",
    "resume_within",
    "max_parallel",
    "fail_fast",
    "timeout",
    "params",
    "env",
    "env_file",
    "secret_env",
    "hooks",
    "defaults",
    "policies",
    "errors",
    "exit_codes",
    "step",
];
/// The keys of `[defaults]`.
pub(crate) const DEFAULTS_KEYS: [&str; 5] = ["timeout", "retry", "kill_signal", "kill_grace", "detect_errors"];
/// The keys of a `[[step]]`.
pub(crate) const STEP_KEYS: [&str; 14] = [
    "name",
    "needs",
    "run",
    "shell",
    "timeout",
    "retry",
    "exit_codes",
    "env",
    "workdir",
    "kill_signal",
    "kill_grace",
    "detect_errors",
    "catch",
    "compensate",
];
/// The keys of `[hooks]`.
pub(crate) const HOOK_KEYS: [&str; 3] = ["on_success", "on_failure", "on_exit"];
/// The keys of a step's `catch` handler.
pub(crate) const CATCH_KEYS: [&str; 3] = ["exception_types", "run", "shell"];
/// The keys of a retry policy.
pub(crate) const POLICY_KEYS: [&str; 6] =
    ["attempts", "exception_types", "backoff_seconds", "backoff_multiplier", "backoff_max_seconds", "jitter"];

const DURATION_HELP: &str = "write seconds as a number (`90`, `0.5`) or a string such as \"90s\", \"2m 30s\", \"1h\"";

#[derive(Debug, Default)]
pub(crate) struct RawFlow {
    pub(crate) name: Option<Str>,
    pub(crate) resume_within: Option<Spanned<RawDuration>>,
    pub(crate) max_parallel: Option<Spanned<i64>>,
    pub(crate) fail_fast: Option<bool>,
    pub(crate) timeout: Option<Spanned<RawDuration>>,
    /// `[params]` in the order of the file: the name and its default (`None`: required).
    pub(crate) params: Vec<(Str, Option<Str>)>,
    pub(crate) env: StrMap,
    pub(crate) env_file: Option<Str>,
    pub(crate) secret_env: Option<Spanned<Vec<Str>>>,
    pub(crate) hooks: RawHooks,
    pub(crate) defaults: Option<RawDefaults>,
    pub(crate) policies: BTreeMap<Str, Spanned<RawPolicy>>,
    pub(crate) errors: BTreeMap<Str, Spanned<Vec<Str>>>,
    pub(crate) exit_codes: StrMap,
    pub(crate) step: Vec<Spanned<RawStep>>,
    /// Keys written with a value of the wrong type (already reported).
    pub(crate) bad: Vec<&'static str>,
}

#[derive(Debug, Default)]
pub(crate) struct RawHooks {
    pub(crate) on_success: Option<Spanned<RawCommand>>,
    pub(crate) on_failure: Option<Spanned<RawCommand>>,
    pub(crate) on_exit: Option<Spanned<RawCommand>>,
}

/// A command written as a list of arguments or as one shell command line (hooks, `compensate`).
#[derive(Debug)]
pub(crate) enum RawCommand {
    Run(Vec<Str>),
    Shell(String),
}

/// One handler of a step's `catch`.
#[derive(Debug, Default)]
pub(crate) struct RawCatch {
    pub(crate) exception_types: Option<Spanned<Vec<Str>>>,
    pub(crate) run: Option<Spanned<Vec<Str>>>,
    pub(crate) shell: Option<Str>,
}

#[derive(Debug, Default)]
pub(crate) struct RawDefaults {
    pub(crate) timeout: Option<Spanned<RawDuration>>,
    pub(crate) retry: Option<Spanned<RawRetry>>,
    pub(crate) kill_signal: Option<Str>,
    pub(crate) kill_grace: Option<Spanned<RawDuration>>,
    pub(crate) detect_errors: Option<Str>,
}

#[derive(Debug, Default)]
pub(crate) struct RawStep {
    pub(crate) name: Option<Str>,
    pub(crate) needs: Option<Spanned<Vec<Str>>>,
    pub(crate) run: Option<Spanned<Vec<Str>>>,
    pub(crate) shell: Option<Str>,
    /// Every other key, boxed only when one is written: a flow may have 10,000 steps that set
    /// none of them, and a step small in memory is cheap to build, move and free.
    pub(crate) more: Option<Box<RawStepMore>>,
    /// Keys written with a value of the wrong type (already reported).
    pub(crate) bad: Vec<&'static str>,
}

/// The keys of a step other than `name`, `needs`, `run` and `shell`.
#[derive(Debug, Default)]
pub(crate) struct RawStepMore {
    pub(crate) timeout: Option<Spanned<RawDuration>>,
    pub(crate) retry: Option<Spanned<RawRetry>>,
    pub(crate) exit_codes: StrMap,
    pub(crate) env: StrMap,
    pub(crate) workdir: Option<Str>,
    pub(crate) kill_signal: Option<Str>,
    pub(crate) kill_grace: Option<Spanned<RawDuration>>,
    pub(crate) detect_errors: Option<Str>,
    pub(crate) catch: Vec<Spanned<RawCatch>>,
    pub(crate) compensate: Option<Spanned<RawCommand>>,
}

/// What a step that writes none of [`RawStepMore`]'s keys has.
static NO_MORE: RawStepMore = RawStepMore {
    timeout: None,
    retry: None,
    exit_codes: StrMap::new(),
    env: StrMap::new(),
    workdir: None,
    kill_signal: None,
    kill_grace: None,
    detect_errors: None,
    catch: Vec::new(),
    compensate: None,
};

impl RawStepMore {
    /// The keys of a step's `more` field, as written (none when it has no box). Borrows the field
    /// alone, so that the step's other fields may be moved from meanwhile.
    pub(crate) fn of(more: &Option<Box<RawStepMore>>) -> &RawStepMore {
        more.as_deref().unwrap_or(&NO_MORE)
    }
}

impl RawStep {
    /// The keys other than `name`, `needs`, `run` and `shell`, as written.
    pub(crate) fn more(&self) -> &RawStepMore {
        RawStepMore::of(&self.more)
    }

    /// [`RawStep::more`] to write into, boxed on the first key written.
    pub(crate) fn more_mut(&mut self) -> &mut RawStepMore {
        self.more.get_or_insert_with(Box::default)
    }
}

#[derive(Debug, Default)]
pub(crate) struct RawPolicy {
    pub(crate) attempts: Option<Spanned<i64>>,
    pub(crate) exception_types: Option<Spanned<Vec<Str>>>,
    pub(crate) backoff_seconds: Option<Spanned<f64>>,
    pub(crate) backoff_multiplier: Option<Spanned<f64>>,
    pub(crate) backoff_max_seconds: Option<Spanned<f64>>,
    pub(crate) jitter: Option<bool>,
}

/// `retry = "name"` or `retry = { ... }`.
#[derive(Debug)]
pub(crate) enum RawRetry {
    Named(String),
    Inline(RawPolicy),
}

/// A duration as written: seconds as a number, or a humantime string.
#[derive(Debug, Clone)]
pub(crate) enum RawDuration {
    Seconds(f64),
    Text(String),
}

type Value<'i> = Spanned<DeValue<'i>>;

/// Read the parsed document `doc` of `source` into the raw flow, with a diagnostic for every
/// unknown key and every value of the wrong type.
pub(crate) fn read(doc: &DeTable<'_>, source: &str) -> (RawFlow, Vec<Diagnostic>) {
    let mut reader = Reader { source, diags: Vec::new() };
    let flow = reader.flow(doc);
    (flow, reader.diags)
}

struct Reader<'s> {
    source: &'s str,
    diags: Vec<Diagnostic>,
}

/// How a user names a TOML value's type.
fn found(value: &DeValue<'_>) -> &'static str {
    match value {
        DeValue::String(_) => "a string",
        DeValue::Integer(_) => "an integer",
        DeValue::Float(_) => "a float",
        DeValue::Boolean(_) => "a boolean",
        DeValue::Datetime(_) => "a date-time",
        DeValue::Array(_) => "an array",
        DeValue::Table(_) => "a table",
    }
}

/// A string value as read, or `None` for another type (which [`Reader::string`] reports).
fn plain_string(value: &Value<'_>) -> Option<Str> {
    value.get_ref().as_str().map(|s| Spanned::new(value.span(), s.to_owned()))
}

/// An array of strings as read, or `None` for anything else (which [`Reader::strings`] reports).
fn plain_strings(value: &Value<'_>) -> Option<Spanned<Vec<Str>>> {
    let items = value.get_ref().as_array()?;
    let strings = items.iter().map(plain_string).collect::<Option<Vec<Str>>>()?;
    Some(Spanned::new(value.span(), strings))
}

/// `prefix.key`, the key written as the file must write it ([`super::diagnostic::key_in_path`]).
fn join(prefix: &str, key: &str) -> String {
    let key = super::diagnostic::key_in_path(key);
    if prefix.is_empty() { key.into_owned() } else { format!("{prefix}.{key}") }
}

fn integer(value: &DeValue<'_>) -> Option<i64> {
    value.as_integer().and_then(|i| i64::from_str_radix(i.as_str(), i.radix()).ok())
}

/// A TOML number (integer or float) as `f64`; an integer too large for `i64` is still a number.
fn number(value: &DeValue<'_>) -> Option<f64> {
    match value {
        DeValue::Integer(i) if i.radix() == 10 => i.as_str().parse().ok(),
        DeValue::Integer(_) => integer(value).map(|i| i as f64),
        DeValue::Float(f) => f.as_str().parse().ok(),
        _ => None,
    }
}

/// `"text"` as a TOML basic string, when `text` needs no escape (so the example can be copied).
fn quoted(text: &str) -> Option<String> {
    (!text.contains(['"', '\\']) && !text.chars().any(char::is_control)).then(|| format!("\"{text}\""))
}

impl Reader<'_> {
    /// The text of `span` as written in the file.
    fn text(&self, span: Range<usize>) -> &str {
        self.source.get(span).unwrap_or_default()
    }

    /// A value of the wrong type: what was expected, what was found, and what would work.
    fn wrong(&mut self, value: &Value<'_>, path: &str, expected: &str, help: Option<String>) {
        let what = found(value.get_ref());
        self.diags.push(
            Diagnostic::error(value.span(), format!("`{path}`: expected {expected}, found {what}"))
                .label("wrong type")
                .help(help),
        );
    }

    /// "write it in quotes" for a number, boolean or date-time where a string was expected.
    fn quote_help(&self, value: &Value<'_>) -> Option<String> {
        match value.get_ref() {
            DeValue::Integer(_) | DeValue::Float(_) | DeValue::Boolean(_) | DeValue::Datetime(_) => {
                quoted(self.text(value.span())).map(|q| format!("write it in quotes: `{q}`"))
            }
            _ => None,
        }
    }

    fn unknown(&mut self, key: &Spanned<std::borrow::Cow<'_, str>>, path: &str, valid: &[&str], policy_hint: bool) {
        let name = key.get_ref();
        let valid_list = valid.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ");
        let help = if policy_hint && POLICY_KEYS.contains(&name.as_ref()) {
            format!("`{name}` belongs in a retry policy: write `retry = {{ {name} = ... }}`")
        } else {
            match crate::suggest::closest_key(name, valid) {
                Some(s) => format!("did you mean `{s}`? valid keys here: {valid_list}"),
                None => format!("valid keys here: {valid_list}"),
            }
        };
        self.diags.push(
            Diagnostic::error(key.span(), format!("`{path}`: unknown key")).label("unknown key").help(Some(help)),
        );
    }

    /// The table `value`, or an error saying how to write one.
    fn table<'v, 'i>(&mut self, value: &'v Value<'i>, path: &str, help: &str) -> Option<&'v DeTable<'i>> {
        let table = value.get_ref().as_table();
        if table.is_none() {
            self.wrong(value, path, "a table", Some(help.to_owned()));
        }
        table
    }

    fn string(&mut self, value: &Value<'_>, path: &str, help: Option<String>) -> Option<Str> {
        match value.get_ref().as_str() {
            Some(s) => Some(Spanned::new(value.span(), s.to_owned())),
            None => {
                let help = help.or_else(|| self.quote_help(value));
                self.wrong(value, path, "a string", help);
                None
            }
        }
    }

    /// An array of strings; one item of another type makes the whole value unusable (every such
    /// item is reported).
    fn strings(&mut self, value: &Value<'_>, path: &str, help: Option<String>) -> Option<Spanned<Vec<Str>>> {
        let Some(items) = value.get_ref().as_array() else {
            self.wrong(value, path, "an array of strings", help);
            return None;
        };
        let mut out = Vec::with_capacity(items.len());
        let mut ok = true;
        for (i, item) in items.iter().enumerate() {
            // The item's path only for a diagnostic.
            match plain_string(item) {
                Some(s) => out.push(s),
                None => ok = self.string(item, &format!("{path}[{i}]"), None).is_some() && ok,
            }
        }
        ok.then(|| Spanned::new(value.span(), out))
    }

    /// A table of strings; an entry of another type is reported and left out.
    fn string_map(&mut self, value: &Value<'_>, path: &str, help: &str) -> StrMap {
        let mut out = StrMap::new();
        let Some(table) = self.table(value, path, help) else { return out };
        for (key, item) in table {
            if let Some(s) = self.string(item, &join(path, key.get_ref()), None) {
                out.insert(Spanned::new(key.span(), key.get_ref().to_string()), s);
            }
        }
        out
    }

    fn duration(&mut self, value: &Value<'_>, path: &str) -> Option<Spanned<RawDuration>> {
        let raw = match value.get_ref() {
            DeValue::String(s) => RawDuration::Text(s.to_string()),
            v => match number(v) {
                Some(x) => RawDuration::Seconds(x),
                None => {
                    self.wrong(value, path, "a duration", Some(DURATION_HELP.into()));
                    return None;
                }
            },
        };
        Some(Spanned::new(value.span(), raw))
    }

    fn signal(&mut self, value: &Value<'_>, path: &str) -> Option<Str> {
        let by_number = integer(value.get_ref())
            .and_then(|n| i32::try_from(n).ok())
            .and_then(Signal::from_number)
            .map(|s| format!("write the signal's name: `\"{}\"`", s.name()));
        let help = by_number.unwrap_or_else(|| "write a signal name such as \"SIGTERM\" or \"SIGINT\"".into());
        self.string(value, path, Some(help))
    }

    fn detect(&mut self, value: &Value<'_>, path: &str) -> Option<Str> {
        let help = match value.get_ref().as_bool() {
            Some(true) => "write `\"auto\"` to read Python tracebacks, `\"none\"` not to",
            Some(false) => "write `\"none\"` not to read Python tracebacks, `\"auto\"` to",
            None => "write \"auto\" or \"none\"",
        };
        self.string(value, path, Some(help.into()))
    }

    fn retry(&mut self, value: &Value<'_>, path: &str) -> Option<Spanned<RawRetry>> {
        let raw = match value.get_ref() {
            DeValue::String(s) => RawRetry::Named(s.to_string()),
            DeValue::Table(t) => RawRetry::Inline(self.policy(t, path)),
            v => {
                let help = match integer(v) {
                    Some(n) => format!("for {n} attempts, write `retry = {{ attempts = {n} }}`"),
                    None => "write the name of a [policies] entry (`retry = \"network\"`) or a policy table \
                             (`retry = { attempts = 3 }`)"
                        .into(),
                };
                self.wrong(value, path, "a policy name or a policy table", Some(help));
                return None;
            }
        };
        Some(Spanned::new(value.span(), raw))
    }

    fn flow(&mut self, doc: &DeTable<'_>) -> RawFlow {
        let mut raw = RawFlow::default();
        for (key, value) in doc {
            let path = join("", key.get_ref());
            match key.get_ref().as_ref() {
                "name" => {
                    raw.name = self.string(value, &path, None);
                    if raw.name.is_none() {
                        raw.bad.push("name");
                    }
                }
                "resume_within" => raw.resume_within = self.duration(value, &path),
                "max_parallel" => raw.max_parallel = self.whole(value, &path, "a whole number of steps, such as `4`"),
                "fail_fast" => raw.fail_fast = self.boolean(value, &path),
                "timeout" => raw.timeout = self.duration(value, &path),
                "params" => {
                    let help = "write `[params]` with entries such as `date = \"today\"` (a default) or `date = {}` \
                                (required)";
                    if let Some(t) = self.table(value, &path, help) {
                        raw.params = self.params(t, &path);
                    }
                }
                "env" => raw.env = self.string_map(value, &path, "write `env = { NAME = \"value\" }`"),
                "env_file" => raw.env_file = self.string(value, &path, None),
                "secret_env" => {
                    let help = match value.get_ref().as_str().and_then(quoted) {
                        Some(q) => format!("write a list: `secret_env = [{q}]`"),
                        None => "write a list of variable names, such as `secret_env = [\"API_TOKEN\"]`".into(),
                    };
                    raw.secret_env = self.strings(value, &path, Some(help));
                }
                "hooks" => {
                    let help = "write a `[hooks]` table with keys such as `on_failure = [\"notify\", \"failed\"]`";
                    if let Some(t) = self.table(value, &path, help) {
                        raw.hooks = self.hooks(t, &path);
                    }
                }
                "defaults" => {
                    raw.defaults = self
                        .table(value, &path, "write a `[defaults]` table with keys such as `timeout = \"10m\"`")
                        .map(|t| self.defaults(t, &path));
                }
                "policies" => {
                    if let Some(t) = self.table(value, &path, "write each policy as a table: `[policies.NAME]`") {
                        raw.policies = self.policies(t, &path);
                    }
                }
                "errors" => {
                    if let Some(t) =
                        self.table(value, &path, "write `[errors]` with entries such as `Busy = [\"Exception\"]`")
                    {
                        raw.errors = self.errors(t, &path);
                    }
                }
                "exit_codes" => {
                    raw.exit_codes = self.string_map(
                        value,
                        &path,
                        "write `[exit_codes]` with entries such as `\"3\" = \"BadInput\"`",
                    )
                }
                "step" => match value.get_ref() {
                    DeValue::Array(items) => {
                        raw.step.reserve_exact(items.len());
                        for (i, item) in items.iter().enumerate() {
                            // The path is built only for a diagnostic (a flow may have 10,000 steps).
                            match item.get_ref().as_table() {
                                Some(t) => raw.step.push(Spanned::new(item.span(), self.step(t, i))),
                                None => {
                                    let help = "write each step as a `[[step]]` table".to_owned();
                                    self.wrong(item, &format!("step[{i}]"), "a table", Some(help));
                                    raw.bad.push("step");
                                }
                            }
                        }
                    }
                    DeValue::Table(_) => {
                        self.wrong(
                            value,
                            &path,
                            "an array of tables",
                            Some("write `[[step]]`, with two brackets, above each step".into()),
                        );
                        raw.bad.push("step");
                    }
                    _ => {
                        self.wrong(
                            value,
                            &path,
                            "an array of tables",
                            Some("write each step as a `[[step]]` table".into()),
                        );
                        raw.bad.push("step");
                    }
                },
                _ => self.unknown(key, &path, &FLOW_KEYS, false),
            }
        }
        raw
    }

    fn defaults(&mut self, table: &DeTable<'_>, prefix: &str) -> RawDefaults {
        let mut raw = RawDefaults::default();
        for (key, value) in table {
            let path = join(prefix, key.get_ref());
            match key.get_ref().as_ref() {
                "timeout" => raw.timeout = self.duration(value, &path),
                "retry" => raw.retry = self.retry(value, &path),
                "kill_signal" => raw.kill_signal = self.signal(value, &path),
                "kill_grace" => raw.kill_grace = self.duration(value, &path),
                "detect_errors" => raw.detect_errors = self.detect(value, &path),
                _ => self.unknown(key, &path, &DEFAULTS_KEYS, true),
            }
        }
        raw
    }

    fn policies(&mut self, table: &DeTable<'_>, prefix: &str) -> BTreeMap<Str, Spanned<RawPolicy>> {
        let mut out = BTreeMap::new();
        for (key, value) in table {
            let path = join(prefix, key.get_ref());
            let help =
                format!("write the policy as a table: `[policies.{}]` with keys such as `attempts = 3`", key.get_ref());
            // A policy of the wrong type stays declared, so `retry = "NAME"` finds it.
            let policy = self.table(value, &path, &help).map(|t| self.policy(t, &path)).unwrap_or_default();
            out.insert(Spanned::new(key.span(), key.get_ref().to_string()), Spanned::new(value.span(), policy));
        }
        out
    }

    fn errors(&mut self, table: &DeTable<'_>, prefix: &str) -> BTreeMap<Str, Spanned<Vec<Str>>> {
        let mut out = BTreeMap::new();
        for (key, value) in table {
            let path = join(prefix, key.get_ref());
            let name = key.get_ref();
            let help = match value.get_ref().as_str().and_then(quoted) {
                Some(base) => format!("write a list of base classes: `{name} = [{base}]`"),
                None => format!("write a list of base classes, such as `{name} = [\"Exception\"]`"),
            };
            // A class of the wrong shape stays declared, so references to it are not errors too.
            let bases = self.strings(value, &path, Some(help)).map_or_else(Vec::new, Spanned::into_inner);
            out.insert(Spanned::new(key.span(), name.to_string()), Spanned::new(value.span(), bases));
        }
        out
    }

    /// Step `index` (`step[index]` in diagnostics).
    fn step(&mut self, table: &DeTable<'_>, index: usize) -> RawStep {
        let mut raw = RawStep::default();
        for (key, value) in table {
            let k = key.get_ref().as_ref();
            // A well-formed `name`, `run` or `shell` (every step has two of them) is read without
            // the path and help that only a diagnostic uses.
            let read = match k {
                "name" => plain_string(value).map(|s| raw.name = Some(s)).is_some(),
                "run" => plain_strings(value).map(|s| raw.run = Some(s)).is_some(),
                "shell" => plain_string(value).map(|s| raw.shell = Some(s)).is_some(),
                _ => false,
            };
            if read {
                continue;
            }
            let path = join(&format!("step[{index}]"), k);
            match k {
                "name" => raw.name = self.string(value, &path, None),
                "run" => {
                    let help = match value.get_ref().as_str() {
                        Some(line) => Some(run_help(line)),
                        None => Some("write the program and its arguments: `run = [\"program\", \"arg\"]`".into()),
                    };
                    raw.run = self.strings(value, &path, help);
                }
                "shell" => {
                    let help = value.get_ref().as_array().map(|_| {
                        "`shell` is one command line for /bin/sh; for a list of arguments write `run = [...]`"
                            .to_owned()
                    });
                    raw.shell = self.string(value, &path, help);
                }
                "timeout" => raw.more_mut().timeout = self.duration(value, &path),
                "retry" => raw.more_mut().retry = self.retry(value, &path),
                "exit_codes" => {
                    raw.more_mut().exit_codes =
                        self.string_map(value, &path, "write `exit_codes = { \"3\" = \"BadInput\" }`")
                }
                "env" => raw.more_mut().env = self.string_map(value, &path, "write `env = { NAME = \"value\" }`"),
                "workdir" => raw.more_mut().workdir = self.string(value, &path, None),
                "kill_signal" => raw.more_mut().kill_signal = self.signal(value, &path),
                "kill_grace" => raw.more_mut().kill_grace = self.duration(value, &path),
                "detect_errors" => raw.more_mut().detect_errors = self.detect(value, &path),
                "needs" => {
                    let help = match value.get_ref().as_str().and_then(quoted) {
                        Some(q) => format!("write a list: `needs = [{q}]`"),
                        None => "write a list of step names, such as `needs = [\"fetch\"]`; `needs = []` makes the \
                                 step a root"
                            .into(),
                    };
                    raw.needs = self.strings(value, &path, Some(help));
                }
                "catch" => match self.catch(value, &path) {
                    Some(handlers) => raw.more_mut().catch = handlers,
                    None => raw.bad.push("catch"),
                },
                "compensate" => raw.more_mut().compensate = self.command(value, &path),
                _ => {
                    self.unknown(key, &path, &STEP_KEYS, true);
                    continue;
                }
            }
            let read = match k {
                "name" => raw.name.is_some(),
                "needs" => raw.needs.is_some(),
                "run" => raw.run.is_some(),
                "shell" => raw.shell.is_some(),
                "compensate" => raw.more().compensate.is_some(),
                _ => true,
            };
            if !read && let Some(known) = STEP_KEYS.iter().find(|s| **s == k) {
                raw.bad.push(*known);
            }
        }
        raw
    }

    fn policy(&mut self, table: &DeTable<'_>, prefix: &str) -> RawPolicy {
        let mut raw = RawPolicy::default();
        for (key, value) in table {
            let path = join(prefix, key.get_ref());
            match key.get_ref().as_ref() {
                "attempts" => raw.attempts = self.whole(value, &path, "a whole number of attempts, such as `3`"),
                "exception_types" => raw.exception_types = self.exception_types(value, &path),
                k @ ("backoff_seconds" | "backoff_max_seconds") => {
                    let x = self.seconds(value, &path, "a number of seconds");
                    *(if k == "backoff_seconds" { &mut raw.backoff_seconds } else { &mut raw.backoff_max_seconds }) = x;
                }
                "backoff_multiplier" => raw.backoff_multiplier = self.seconds(value, &path, "a number"),
                "jitter" => raw.jitter = self.boolean(value, &path),
                _ => self.unknown(key, &path, &POLICY_KEYS, false),
            }
        }
        raw
    }

    /// An integer; one past `i64` is kept as `i64::MAX` (or `MIN`), out of range, which validation
    /// says with the bounds. `example` completes "write ..." for a value of another type.
    fn whole(&mut self, value: &Value<'_>, path: &str, example: &str) -> Option<Spanned<i64>> {
        match (integer(value.get_ref()), value.get_ref().as_integer()) {
            (Some(n), _) => Some(Spanned::new(value.span(), n)),
            (None, Some(i)) => {
                let n = if i.as_str().starts_with('-') { i64::MIN } else { i64::MAX };
                Some(Spanned::new(value.span(), n))
            }
            (None, None) => {
                let help = match value.get_ref() {
                    DeValue::String(s) if s.trim().parse::<i64>().is_ok() => {
                        format!("write the number without quotes: `{}`", s.trim())
                    }
                    v @ DeValue::Float(_) => match number(v) {
                        Some(x) if x.fract() == 0.0 && x.abs() < 1e15 => format!("write a whole number: `{x}`"),
                        _ => format!("write {example}"),
                    },
                    _ => format!("write {example}"),
                };
                self.wrong(value, path, "an integer", Some(help));
                None
            }
        }
    }

    fn boolean(&mut self, value: &Value<'_>, path: &str) -> Option<bool> {
        let b = value.get_ref().as_bool();
        if b.is_none() {
            let help = match value.get_ref().as_str() {
                Some(s @ ("true" | "false")) => format!("write `{s}` without quotes"),
                _ => "write `true` or `false`".into(),
            };
            self.wrong(value, path, "a boolean", Some(help));
        }
        b
    }

    /// `exception_types` of a retry policy or a catch handler.
    fn exception_types(&mut self, value: &Value<'_>, path: &str) -> Option<Spanned<Vec<Str>>> {
        let help = match value.get_ref().as_str().and_then(quoted) {
            Some(q) => format!("write a list: `exception_types = [{q}]`"),
            None => "write a list of class names, such as `exception_types = [\"OSError\"]`".into(),
        };
        self.strings(value, path, Some(help))
    }

    /// A command as a list of arguments (run directly) or a string (run by /bin/sh -c): hooks and
    /// `compensate`.
    fn command(&mut self, value: &Value<'_>, path: &str) -> Option<Spanned<RawCommand>> {
        let raw = match value.get_ref() {
            DeValue::String(s) => RawCommand::Shell(s.to_string()),
            DeValue::Array(_) => RawCommand::Run(self.strings(value, path, None)?.into_inner()),
            _ => {
                let key = path.rsplit('.').next().unwrap_or(path);
                let help = format!(
                    "write `{key} = [\"program\", \"arg\"]` to run a program, or `{key} = \"command line\"` for /bin/sh -c"
                );
                self.wrong(value, path, "a list of arguments or a shell command line", Some(help));
                return None;
            }
        };
        Some(Spanned::new(value.span(), raw))
    }

    fn hooks(&mut self, table: &DeTable<'_>, prefix: &str) -> RawHooks {
        let mut raw = RawHooks::default();
        for (key, value) in table {
            let path = join(prefix, key.get_ref());
            match key.get_ref().as_ref() {
                "on_success" => raw.on_success = self.command(value, &path),
                "on_failure" => raw.on_failure = self.command(value, &path),
                "on_exit" => raw.on_exit = self.command(value, &path),
                _ => self.unknown(key, &path, &HOOK_KEYS, false),
            }
        }
        raw
    }

    /// `[params]`: `NAME = "default"`, or `NAME = {}` for a parameter without a default.
    fn params(&mut self, table: &DeTable<'_>, prefix: &str) -> Vec<(Str, Option<Str>)> {
        let mut out = Vec::new();
        for (key, value) in table {
            let path = join(prefix, key.get_ref());
            let name = Spanned::new(key.span(), key.get_ref().to_string());
            let forms = format!(
                "write `{0} = \"default\"`, or `{0} = {{}}` for a parameter that must be given with `--param {0}=VALUE`",
                key.get_ref()
            );
            match value.get_ref() {
                DeValue::String(s) => out.push((name, Some(Spanned::new(value.span(), s.to_string())))),
                DeValue::Table(t) => {
                    for (k, v) in t {
                        // `NAME = { default = "x" }`: the default is the value itself, as written.
                        let default = match v.get_ref() {
                            DeValue::String(_) if k.get_ref() == "default" => Some(self.text(v.span()).to_owned()),
                            _ if k.get_ref() == "default" => self.quote_help(v).and(quoted(self.text(v.span()))),
                            _ => None,
                        };
                        let help = match default {
                            Some(value) => format!(
                                "a parameter's default is its value: write `{0} = {value}`, or `{0} = {{}}` for a \
                                 parameter that must be given with `--param {0}=VALUE`",
                                key.get_ref()
                            ),
                            None => format!("a required parameter is an empty table: {forms}"),
                        };
                        let d = Diagnostic::error(k.span(), format!("`{}`: unknown key", join(&path, k.get_ref())))
                            .label("unknown key")
                            .help(Some(help));
                        self.diags.push(d);
                    }
                    out.push((name, None));
                }
                _ => {
                    let help = self.quote_help(value).map(|q| format!("a default is a string: {q}")).unwrap_or(forms);
                    self.wrong(value, &path, "a string (the default) or `{}` (required)", Some(help));
                }
            }
        }
        // In the order of the file, so that of two clashing names the later one is reported.
        out.sort_by_key(|(name, _)| name.span().start);
        out
    }

    /// A step's `catch`: a list of handler tables. `None` when it is not a list or an item is not
    /// a table (reported).
    fn catch(&mut self, value: &Value<'_>, path: &str) -> Option<Vec<Spanned<RawCatch>>> {
        const EXAMPLE: &str = "`catch = [{ exception_types = [\"ActionTimeout\"], run = [\"program\", \"arg\"] }]`";
        let Some(items) = value.get_ref().as_array() else {
            let help = if value.get_ref().as_table().is_some() {
                format!("put the handler in a list: {EXAMPLE}, or write it under `[[step.catch]]`")
            } else {
                format!("write a list of handlers: {EXAMPLE}")
            };
            self.wrong(value, path, "an array of tables", Some(help));
            return None;
        };
        let mut out = Vec::new();
        let mut ok = true;
        for (i, item) in items.iter().enumerate() {
            let item_path = format!("{path}[{i}]");
            match self.table(item, &item_path, &format!("write each handler as a table: {EXAMPLE}")) {
                Some(t) => out.push(Spanned::new(item.span(), self.handler(t, &item_path))),
                None => ok = false,
            }
        }
        ok.then_some(out)
    }

    fn handler(&mut self, table: &DeTable<'_>, prefix: &str) -> RawCatch {
        let mut raw = RawCatch::default();
        for (key, value) in table {
            let path = join(prefix, key.get_ref());
            match key.get_ref().as_ref() {
                "exception_types" => raw.exception_types = self.exception_types(value, &path),
                "run" => {
                    let help = match value.get_ref().as_str() {
                        Some(line) => run_help(line),
                        None => "write the program and its arguments: `run = [\"program\", \"arg\"]`".into(),
                    };
                    raw.run = self.strings(value, &path, Some(help));
                }
                "shell" => {
                    let help = value.get_ref().as_array().map(|_| {
                        "`shell` is one command line for /bin/sh; for a list of arguments write `run = [...]`"
                            .to_owned()
                    });
                    raw.shell = self.string(value, &path, help);
                }
                _ => self.unknown(key, &path, &CATCH_KEYS, false),
            }
        }
        raw
    }

    /// A number (`backoff_*`); a string holding a number or a duration says what to write instead.
    fn seconds(&mut self, value: &Value<'_>, path: &str, expected: &str) -> Option<Spanned<f64>> {
        if let Some(x) = number(value.get_ref()) {
            return Some(Spanned::new(value.span(), x));
        }
        let help = match value.get_ref().as_str() {
            Some(s) if s.trim().parse::<f64>().is_ok() => format!("write the number without quotes: `{}`", s.trim()),
            Some(s) if expected != "a number" && humantime::parse_duration(s).is_ok() => {
                let secs = humantime::parse_duration(s).map(|d| d.as_secs_f64()).unwrap_or_default();
                format!("this key counts seconds as a number: write `{}`", super::validate::number(secs))
            }
            _ if expected == "a number" => "write a number, such as `2` to double each wait".into(),
            _ => "write a number of seconds, such as `1` or `0.5`".into(),
        };
        self.wrong(value, path, expected, Some(help));
        None
    }
}

/// What to write instead of `run = "a command line"`.
fn run_help(line: &str) -> String {
    const BASE: &str = "use a list of arguments, or `shell = \"...\"`";
    let words: Vec<&str> = line.split_whitespace().collect();
    // An example only for a plain command line, where splitting at spaces is what a shell does too.
    let plain = |w: &str| !w.contains(['\'', '"', '\\', '$', '`', '|', '&', ';', '<', '>', '(', ')', '*', '?']);
    match (words.iter().map(|w| quoted(w)).collect::<Option<Vec<_>>>(), quoted(line)) {
        (Some(list), Some(whole)) if !words.is_empty() && words.iter().all(|w| plain(w)) => {
            format!("{BASE}: `run = [{}]` or `shell = {whole}`", list.join(", "))
        }
        _ => BASE.to_owned(),
    }
}
