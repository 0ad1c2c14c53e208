//! The validated flow: what the executor runs. Built only by `validate.rs`; serializable so a run
//! can record the exact definition it started with.

use crate::classify::classes::ClassTree;
use crate::retry::RetryPolicy;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Flow {
    pub(crate) name: String,
    /// Whether the file declares `name`: then files of the same name share runs, else the flow
    /// is its file (see [`crate::store::FlowKey`]).
    #[serde(default)]
    pub(crate) name_declared: bool,
    /// The flow file, absolute.
    pub(crate) path: PathBuf,
    /// How old an unfinished run may be and still be resumed by `waymark run`.
    #[serde(default)]
    pub(crate) resume_within: Option<Duration>,
    /// The most steps that run at once (`max_parallel`, at least 1).
    #[serde(default = "default_max_parallel")]
    pub(crate) max_parallel: u32,
    /// Whether a step failing for good cancels the running attempts (`fail_fast`).
    #[serde(default)]
    pub(crate) fail_fast: bool,
    /// The workflow deadline (`timeout` at the top level); `None`: the run may take forever.
    #[serde(default)]
    pub(crate) timeout: Option<Duration>,
    /// The run's inputs (`[params]`), by name.
    #[serde(default)]
    pub(crate) params: BTreeMap<String, Param>,
    /// The value of each parameter for the run this flow is run as (`--param`, else the
    /// default): set by `waymark run` when it creates the run, and recorded with it, so that a
    /// resumed run goes on with the values it started with. Empty in a flow loaded from a file.
    #[serde(default)]
    pub(crate) param_values: BTreeMap<String, String>,
    pub(crate) env: BTreeMap<String, String>,
    /// The dotenv file (`env_file`), absolute; read when a run starts, not when the flow loads.
    #[serde(default)]
    pub(crate) env_file: Option<PathBuf>,
    /// Names of variables whose values are shown and stored as `***` (`secret_env`).
    #[serde(default)]
    pub(crate) secret_env: Vec<String>,
    #[serde(default)]
    pub(crate) hooks: Hooks,
    pub(crate) classes: ClassTree,
    pub(crate) exit_codes: ExitCodes,
    pub(crate) steps: Vec<Step>,
}

/// `max_parallel` when the flow does not set it.
pub(crate) const DEFAULT_MAX_PARALLEL: u32 = 4;

/// The names of the variables waymark sets for every attempt over the env file, the flow's and the
/// step's `env` (README, "Environment").
pub(crate) mod var {
    pub(crate) const RUN_ID: &str = "WAYMARK_RUN_ID";
    pub(crate) const FLOW: &str = "WAYMARK_FLOW";
    pub(crate) const STEP: &str = "WAYMARK_STEP";
    pub(crate) const MAX_ATTEMPTS: &str = "WAYMARK_MAX_ATTEMPTS";
    pub(crate) const ATTEMPT: &str = "WAYMARK_ATTEMPT";
    pub(crate) const ERROR_FILE: &str = "WAYMARK_ERROR_FILE";
    pub(crate) const OUTPUT: &str = "WAYMARK_OUTPUT";
    /// Also the one waymark finds an attempt's processes by.
    pub(crate) const ATTEMPT_ID: &str = crate::os::process::ATTEMPT_ID_VAR;
    /// In a nested run (a step of another run started waymark), the attempt ids of the steps it
    /// runs under, nearest first, comma-separated: how the outer runner finds the processes of
    /// the nested run's steps.
    pub(crate) const OUTER_ATTEMPT_IDS: &str = crate::os::process::OUTER_IDS_VAR;
    // Those of a catch handler (the error it handles) and of a hook (how the run ended).
    pub(crate) const RUN_STATUS: &str = "WAYMARK_RUN_STATUS";
    pub(crate) const FAILED_STEP: &str = "WAYMARK_FAILED_STEP";
    pub(crate) const ERROR_TYPE: &str = "WAYMARK_ERROR_TYPE";
    pub(crate) const ERROR_BASES: &str = "WAYMARK_ERROR_BASES";
    pub(crate) const ERROR_MESSAGE: &str = "WAYMARK_ERROR_MESSAGE";
}

/// All of [`var`]: a value an `env` table gives one of them never reaches a step.
pub(crate) const WAYMARK_VARS: [&str; 9] = [
    var::RUN_ID,
    var::FLOW,
    var::STEP,
    var::MAX_ATTEMPTS,
    var::ATTEMPT,
    var::ERROR_FILE,
    var::OUTPUT,
    var::ATTEMPT_ID,
    var::OUTER_ATTEMPT_IDS,
];

/// The variables waymark sets for a catch handler or a hook alone: one that waymark itself
/// inherited (a nested run, started by an outer run's hook) reaches none of this run's commands,
/// as a step of this run would read it for its own.
pub(crate) const AUX_VARS: [&str; 5] =
    [var::RUN_STATUS, var::FAILED_STEP, var::ERROR_TYPE, var::ERROR_BASES, var::ERROR_MESSAGE];

fn default_max_parallel() -> u32 {
    DEFAULT_MAX_PARALLEL
}

/// A declared parameter of the flow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Param {
    /// `None`: required, the run must be given `--param NAME=VALUE`.
    pub(crate) default: Option<String>,
}

/// `[hooks]`: commands run once at the very end of a run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Hooks {
    pub(crate) on_success: Option<Command>,
    pub(crate) on_failure: Option<Command>,
    pub(crate) on_exit: Option<Command>,
}

/// One handler of a step's `catch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Catch {
    /// Matched like a retry policy's `exception_types` (by name along the error's bases).
    pub(crate) exception_types: Vec<String>,
    /// `None`: the handler swallows the error without running anything.
    pub(crate) command: Option<Command>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Step {
    pub(crate) name: String,
    /// Where the step's `[[step]]` table starts in the flow file.
    pub(crate) span: Range<usize>,
    /// The steps (indices into [`Flow::steps`]) that must succeed (or be caught) before this one
    /// is ready, in the order written. Without `needs` in the file it is the step before
    /// (`[i - 1]`, nothing for the first step); `needs = []` gives none: a root. Always acyclic.
    #[serde(default)]
    pub(crate) needs: Needs,
    /// Whether the file wrote `needs` (else `needs` is the step before).
    #[serde(default)]
    pub(crate) needs_explicit: bool,
    pub(crate) command: Command,
    /// Per-attempt deadline; `None` lets an attempt run forever.
    pub(crate) timeout: Option<Duration>,
    /// Shared by the steps whose policy is the same one (the defaults', a `[policies]` entry's, or
    /// none): a step is 312 bytes where it was 384, and a 10,000-step flow's steps are new memory,
    /// a page fault per 4 KB.
    pub(crate) retry: Arc<RetryPolicy>,
    /// The `[policies]` entry the retry policy came from, if any.
    pub(crate) retry_name: Option<String>,
    pub(crate) exit_codes: ExitCodes,
    pub(crate) env: BTreeMap<String, String>,
    /// Absolute working directory (checked when an attempt starts). Steps that run in the same
    /// directory (the flow file's, unless they say otherwise) share it.
    pub(crate) workdir: Arc<Path>,
    pub(crate) kill_signal: Signal,
    pub(crate) kill_grace: Duration,
    /// Read Python tracebacks from stderr to name errors.
    pub(crate) detect_tracebacks: bool,
    /// Handlers for the step's final error, tried in order.
    #[serde(default)]
    pub(crate) catch: Vec<Catch>,
    /// What undoes the step's work when the run fails after the step succeeded.
    #[serde(default)]
    pub(crate) compensate: Option<Command>,
}

/// What a step without `needs` depends on: the step before it in the file.
pub(crate) fn implicit_needs(index: usize) -> Needs {
    Needs(match index.checked_sub(1) {
        Some(before) => Repr::One(before),
        None => Repr::None,
    })
}

/// The steps (indices into [`Flow::steps`]) a step needs, read as a slice. Most steps need one
/// step or none, held without an allocation each: for a 10,000-step flow a list of one was
/// a tenth of a run's allocations before its first child.
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct Needs(Repr);

#[derive(Clone, Default, PartialEq, Eq)]
enum Repr {
    #[default]
    None,
    One(usize),
    Many(Vec<usize>),
}

impl std::ops::Deref for Needs {
    type Target = [usize];
    fn deref(&self) -> &[usize] {
        match &self.0 {
            Repr::None => &[],
            Repr::One(i) => std::slice::from_ref(i),
            Repr::Many(list) => list,
        }
    }
}

impl From<Vec<usize>> for Needs {
    fn from(list: Vec<usize>) -> Needs {
        Needs(match *list.as_slice() {
            [] => Repr::None,
            [one] => Repr::One(one),
            _ => Repr::Many(list),
        })
    }
}

impl<'a> IntoIterator for &'a Needs {
    type Item = &'a usize;
    type IntoIter = std::slice::Iter<'a, usize>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl std::fmt::Debug for Needs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Serialize for Needs {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (**self).serialize(s)
    }
}

impl<'de> Deserialize<'de> for Needs {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Needs, D::Error> {
        Vec::<usize>::deserialize(d).map(Needs::from)
    }
}

impl Flow {
    /// Every command of the flow (its steps', their catch handlers' and compensations', its
    /// hooks') with `secrets` hidden: what `waymark check` shows.
    pub(crate) fn hide_in_commands(&mut self, secrets: &crate::secrets::Secrets) {
        if secrets.is_empty() {
            return;
        }
        let hooks = [&mut self.hooks.on_success, &mut self.hooks.on_failure, &mut self.hooks.on_exit];
        for command in hooks.into_iter().flatten() {
            command.hide(secrets);
        }
        for step in &mut self.steps {
            step.command.hide(secrets);
            for command in step.catch.iter_mut().filter_map(|h| h.command.as_mut()).chain(step.compensate.as_mut()) {
                command.hide(secrets);
            }
        }
    }

    /// Whether some step declares `needs`, so that steps may run side by side.
    pub(crate) fn has_explicit_needs(&self) -> bool {
        self.steps.iter().any(|s| s.needs_explicit)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Command {
    /// Executed directly with `PATH` lookup.
    Run(Vec<String>),
    /// Run by `/bin/sh -c`.
    Shell(String),
}

impl Command {
    /// Program and arguments as executed.
    pub(crate) fn argv(&self) -> Vec<String> {
        match self {
            Command::Run(argv) => argv.clone(),
            Command::Shell(script) => vec!["/bin/sh".into(), "-c".into(), script.clone()],
        }
    }

    /// Every secret in its program, arguments or command line replaced by `***`, before it is
    /// quoted for display (quoting rewrites a secret holding `'` or a newline, so that it would no
    /// longer be found as written).
    pub(crate) fn hide(&mut self, secrets: &crate::secrets::Secrets) {
        let hide = |text: &mut String| *text = secrets.redact_string(std::mem::take(text));
        match self {
            Command::Run(argv) => argv.iter_mut().for_each(hide),
            Command::Shell(script) => hide(script),
        }
    }

    /// [`argv`](Self::argv), borrowed where the command holds it as is (a `run` list): an
    /// attempt's spawn makes no copy of it.
    pub(crate) fn argv_ref(&self) -> std::borrow::Cow<'_, [String]> {
        match self {
            Command::Run(argv) => std::borrow::Cow::Borrowed(argv),
            Command::Shell(_) => std::borrow::Cow::Owned(self.argv()),
        }
    }

    /// The program it runs (`argv()[0]`, without making the rest).
    pub(crate) fn program(&self) -> &str {
        match self {
            Command::Run(argv) => argv.first().map_or("", String::as_str),
            Command::Shell(_) => "/bin/sh",
        }
    }

    /// A one-line rendering for plans and reports.
    pub(crate) fn display(&self) -> String {
        let mut out = String::new();
        self.display_to(&mut out);
        out
    }

    /// [`Command::display`], appended to `out`.
    pub(crate) fn display_to(&self, out: &mut String) {
        match self {
            Command::Run(argv) => {
                for (i, a) in argv.iter().enumerate() {
                    if i > 0 {
                        out.push(' ');
                    }
                    // An argument with a newline (`python3 -c` code) on one line, as bash reads it
                    // (`$'...\n...'`): a `shell` script's lines are the only ones a command shows.
                    push_shell_word(a, out);
                }
            }
            Command::Shell(script) => {
                out.push_str("sh -c ");
                shell_quote(script, out);
            }
        }
    }
}

/// `s` as a shell word, for a command a message tells the user to run: as is when it needs no
/// quotes, in bash's `$'...'` when it holds a newline or a tab (to stay on its line), else in
/// single quotes. (Another control character is left to [`crate::text::visible`], which shows it
/// as its picture wherever waymark prints a flow's text.)
pub(crate) fn shell_word(s: &str) -> String {
    let mut out = String::new();
    push_shell_word(s, &mut out);
    out
}

/// [`shell_word`], appended to `out`.
fn push_shell_word(s: &str, out: &mut String) {
    if s.contains(['\n', '\t']) {
        // On one line, as bash and zsh read it (`$'a\nb'`): a path or a value with a newline
        // keeps the message that names it on its line.
        out.push_str("$'");
        for c in s.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\'' => out.push_str("\\'"),
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                c => out.push(c),
            }
        }
        out.push('\'');
        return;
    }
    shell_quote(s, out);
}

/// `s` as a shell word, appended to `out`: as is when it needs no quotes, else in single quotes.
fn shell_quote(s: &str, out: &mut String) {
    if !s.is_empty() && s.bytes().all(|c| c.is_ascii_alphanumeric() || b"-_./=:,@%+".contains(&c)) {
        out.push_str(s);
    } else {
        out.push('\'');
        out.push_str(&s.replace('\'', r"'\''"));
        out.push('\'');
    }
}

/// A signal by its number and canonical name (`SIGTERM`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub(crate) struct Signal(pub(crate) nix::sys::signal::Signal);

impl Signal {
    pub(crate) fn parse(name: &str) -> Option<Signal> {
        let upper = name.to_ascii_uppercase();
        let full = if upper.starts_with("SIG") { upper } else { format!("SIG{upper}") };
        full.parse().ok().map(Signal)
    }

    pub(crate) fn from_number(n: i32) -> Option<Signal> {
        nix::sys::signal::Signal::try_from(n).ok().map(Signal)
    }

    pub(crate) fn name(self) -> &'static str {
        self.0.as_str()
    }

    pub(crate) fn number(self) -> i32 {
        self.0 as i32
    }
}

impl TryFrom<String> for Signal {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        Signal::parse(&s).ok_or_else(|| format!("unknown signal {s}"))
    }
}

impl From<Signal> for String {
    fn from(s: Signal) -> String {
        s.name().to_owned()
    }
}

/// Exit codes and signals mapped to error class names.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ExitCodes {
    pub(crate) codes: BTreeMap<u8, String>,
    pub(crate) signals: BTreeMap<String, String>,
}

impl ExitCodes {
    pub(crate) fn for_code(&self, code: i32) -> Option<&str> {
        u8::try_from(code).ok().and_then(|c| self.codes.get(&c)).map(String::as_str)
    }

    pub(crate) fn for_signal(&self, signal: Signal) -> Option<&str> {
        self.signals.get(signal.name()).map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A word with a newline or a tab stays on its line: bash's `$'...'`. (Other control
    /// characters are shown as their pictures where waymark prints a flow's text.)
    #[test]
    fn a_shell_word_with_a_newline_is_written_as_bash_reads_it() {
        assert_eq!(shell_word("plain"), "plain");
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word("it's\nthere\t\\"), "$'it\\'s\\nthere\\t\\\\'");
        let run = Command::Run(vec!["python3".into(), "-c".into(), "import sys\nif True:\n    print(1)".into()]);
        assert_eq!(run.display(), "python3 -c $'import sys\\nif True:\\n    print(1)'");
    }

    /// A list of needs reads the same however it is held: none, one (the usual case, held
    /// without an allocation) or many, in the order given, and is written and read back as a
    /// list.
    #[test]
    fn needs_read_as_the_list_they_were_made_from() {
        for list in [vec![], vec![7], vec![3, 0, 9]] {
            let needs = Needs::from(list.clone());
            assert_eq!(&*needs, list.as_slice());
            assert_eq!(needs.iter().copied().collect::<Vec<_>>(), list);
            assert_eq!(format!("{needs:?}"), format!("{list:?}"));
            let json = serde_json::to_string(&needs).unwrap();
            assert_eq!(json, serde_json::to_string(&list).unwrap());
            assert_eq!(serde_json::from_str::<Needs>(&json).unwrap(), needs);
        }
        assert_eq!(&*implicit_needs(0), &[] as &[usize]);
        assert_eq!(implicit_needs(5), Needs::from(vec![4]));
        assert_ne!(Needs::from(vec![4]), Needs::from(vec![4, 1]));
    }
}
