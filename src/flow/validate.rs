//! Raw types (read from the document by `raw.rs`) → the validated [`Flow`]. Every problem found is collected as a [`Diagnostic`]
//! pointing at its source span; warnings never stop a flow from loading.

use super::diagnostic::{Diagnostic, KeyIndex};
use super::graph;
use super::model::{
    Catch, Command, DEFAULT_MAX_PARALLEL, ExitCodes, Flow, Hooks, Needs, Param, Signal, Step, implicit_needs,
};
use super::raw::{
    RawCatch, RawCommand, RawDefaults, RawDuration, RawFlow, RawPolicy, RawRetry, RawStep, RawStepMore, Str, StrMap,
};
use crate::FastHash;
use crate::classify::classes::{ClassError, ClassTree, MAX_USER_CLASSES, WORKFLOW_TIMEOUT, is_builtin};
use crate::retry::{Backoff, DEFAULT_ATTEMPTS, RetryPolicy};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use toml::Spanned;

/// Longest duration accepted anywhere: 100 years.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 86_400 + 25 * 86_400);
/// Most attempts a policy may allow: far more than any retry budget needs, and room to add the
/// attempts of earlier budgets (`waymark resume` of a failed run) without overflow.
pub(crate) const MAX_ATTEMPTS: u32 = 1_000_000;
/// Shortest non-zero duration accepted anywhere: 1 ms. Anything shorter would be rounded to a
/// timer tick (or to 0 s) and mean something else than what was written.
pub(crate) const MIN_DURATION: Duration = Duration::from_millis(1);
/// Longest step name: a step's name is a directory name under `logs/RUN_ID/` (`NAME_MAX`).
pub(crate) const MAX_STEP_NAME: usize = 255;
/// Longest flow name: the flow's lock file is `locks/NAME.lock`, a file name of at most 255 bytes.
pub(crate) const MAX_FLOW_NAME: usize = 255 - ".lock".len();
/// Most cycles of `needs` reported for one file, and most step names compared in all for the
/// "did you mean" of unknown names in `needs` (each compares every step's name): bounds the work
/// on a hostile file, while a flow of a hundred steps gets a suggestion for 2,000 unknown names.
const MAX_CYCLES_REPORTED: usize = 20;
const MAX_SUGGESTION_WORK: usize = 200_000;
/// The most classes of `[errors]` reported as impossible to place (a cycle, an inconsistent order,
/// a chain too long); past it, every class is taken as a plain `Exception`, and nothing more is said.
const MAX_CLASS_ERRORS: usize = 16;
/// Longest cycle spelled out in full; a longer one is shortened in the middle.
const MAX_CYCLE_SHOWN: usize = 10;
/// Most steps without `needs` a cycle's help names.
const MAX_IMPLICIT_SHOWN: usize = 5;
/// Most steps `max_parallel` lets run at once: each is a process group with two reader threads,
/// and far more than a machine runs usefully side by side.
pub(crate) const MAX_PARALLEL: u32 = 10_000;
const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(10);
const DETECT_VALUES: [&str; 2] = ["auto", "none"];

/// Where `run` programs are looked for when a flow is checked: the PATH waymark itself has
/// (`None`: unset). Loading with one warns about a program found on no PATH a step would use.
#[derive(Debug, Clone)]
pub(crate) struct ProgramSearch {
    pub(crate) path: Option<std::ffi::OsString>,
}

/// What a path a step names (a program with a `/`, a `workdir`) is on this machine now.
#[derive(Clone)]
enum FileKind {
    Directory,
    Executable,
    /// A regular file without any execute bit.
    File,
    /// Neither a directory nor a regular file (a socket, a device).
    Other,
    Missing,
    /// It could not be looked at (a directory on the way cannot be searched): why.
    Unknown(String),
}

/// What the C library searches when PATH is unset (glibc's `execvp`).
const DEFAULT_SEARCH_PATH: &str = "/bin:/usr/bin";

struct Validator<'a> {
    source: &'a str,
    search: Option<&'a ProgramSearch>,
    /// The flow's `env` PATH, once read: a step without its own is run with it.
    flow_path_env: Option<String>,
    /// Whether the flow has an `env_file` (read only when a run starts: it may set PATH).
    env_file: bool,
    /// The parsed document, for [`KeyIndex`]: indexed on the first diagnostic (a flow without
    /// any never pays for it), then a diagnostic's path is a lookup, not a parse. `None` when the
    /// fast path read the file: the document is then parsed for the first diagnostic.
    doc: Option<&'a toml::de::DeTable<'a>>,
    keys: std::cell::OnceCell<KeyIndex>,
    /// Waymark's own PATH as text, converted once (see [`ProgramSearch`]).
    own_path: Option<String>,
    /// Whether a program was found on a search path from a working directory, by path, then
    /// working directory, then program: thousands of steps running the same program search
    /// once, and look the answer up without building a key.
    on_path: HashMap<String, HashMap<std::path::PathBuf, HashMap<String, bool>>>,
    /// The last answer, `(path, workdir, program, found)`: steps in a row usually run the same
    /// program, which is then compared, not hashed (a PATH is long).
    last_on_path: Option<(String, std::path::PathBuf, String, bool)>,
    /// What each path named by a program with a `/` or a `workdir` is, looked at once: thousands
    /// of steps naming the same program or directory cost one `stat`.
    kinds: HashMap<std::path::PathBuf, FileKind>,
    diags: Vec<Diagnostic>,
}

/// Build the domain flow, or return every error found (warnings included either way).
pub(crate) fn validate<'a>(
    raw: RawFlow,
    path: &Path,
    source: &'a str,
    doc: Option<&'a toml::de::DeTable<'a>>,
    search: Option<&'a ProgramSearch>,
) -> Result<(Flow, Vec<Diagnostic>), Vec<Diagnostic>> {
    let mut v = Validator {
        source,
        search,
        flow_path_env: None,
        env_file: false,
        doc,
        keys: std::cell::OnceCell::new(),
        own_path: search.and_then(|s| s.path.as_ref()).map(|p| p.to_string_lossy().into_owned()),
        on_path: HashMap::new(),
        last_on_path: None,
        kinds: HashMap::new(),
        diags: Vec::new(),
    };
    let flow = v.flow(raw, path);
    if v.diags.iter().any(Diagnostic::is_error) { Err(v.diags) } else { Ok((flow, v.diags)) }
}

/// The first `$NAME` or `${NAME}` in `arg` (NAME an identifier), as written.
pub(crate) fn shell_variable(arg: &str) -> Option<&str> {
    shell_variables(arg).next()
}

/// Every `$NAME` and `${NAME}` in `arg` (NAME an identifier), as written, in order.
fn shell_variables(arg: &str) -> impl Iterator<Item = &str> {
    let ident = |s: &str| s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(s.len());
    arg.match_indices('$').filter_map(move |(at, _)| {
        let rest = &arg[at + 1..];
        if let Some(inner) = rest.strip_prefix('{') {
            let len = ident(inner);
            (len > 0 && is_identifier(&inner[..len]) && inner[len..].starts_with('}')).then(|| &arg[at..at + len + 3])
        } else {
            let len = ident(rest);
            (len > 0 && is_identifier(&rest[..len])).then(|| &arg[at..at + len + 1])
        }
    })
}

/// Whether `s` can be a flow's name (`[A-Za-z0-9_.-]+`, at most [`MAX_FLOW_NAME`] bytes).
pub(crate) fn is_flow_name(s: &str) -> bool {
    is_name(s, ".-") && s.len() <= MAX_FLOW_NAME
}

fn is_name(s: &str, extra: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || extra.contains(c))
}

/// `[A-Za-z_][A-Za-z0-9_]*`: parameter and variable names.
pub(crate) fn is_identifier(s: &str) -> bool {
    is_name(s, "") && !s.starts_with(|c: char| c.is_ascii_digit())
}

/// A number as a person writes it: `0.5`, `1000000`, `1e300` (never 309 digits).
pub(crate) fn number(x: f64) -> String {
    if x == 0.0 || !x.is_finite() || (1e-4..1e15).contains(&x.abs()) { format!("{x}") } else { format!("{x:e}") }
}

/// Whose list of arguments holds what looks like a shell variable: the fix differs.
#[derive(Clone, Copy)]
enum ListOf {
    /// A step's `run`.
    Step,
    /// A catch handler's `run`.
    Handler,
    /// A command written as a list (`compensate`, a hook).
    Command,
}

/// Where `run` is a shell given a script (`["sh", "-c", "SCRIPT", ...]`, `["bash", "-euc", ...]`,
/// `["bash", "-o", "pipefail", "-c", ...]`), the script's index: that shell expands the
/// variables in it. The script is the first argument after the options, one of which holds `c`.
fn shell_script(run: &[Str]) -> Option<usize> {
    const SHELLS: [&str; 7] = ["sh", "bash", "dash", "zsh", "ksh", "ash", "mksh"];
    // A shell, an option and its script at the least.
    if run.len() < 3 {
        return None;
    }
    let program = run[0].get_ref();
    if !SHELLS.contains(&program.rsplit('/').next().unwrap_or(program)) {
        return None;
    }
    let (mut script, mut i) = (false, 1);
    while let Some(arg) = run.get(i).map(|a| a.get_ref().as_str()) {
        match arg {
            // The end of the options (a lone `-` too, for sh and bash).
            "--" | "-" => {
                i += 1;
                break;
            }
            // Options that take the next argument as their value.
            "-o" | "+o" | "-O" | "+O" | "--rcfile" | "--init-file" => i += 2,
            // bash's long options (`--norc`).
            _ if arg.starts_with("--") => i += 1,
            _ if arg.len() > 1 && (arg.starts_with('-') || arg.starts_with('+')) => {
                script |= arg.starts_with('-') && arg.contains('c');
                i += 1;
            }
            _ => break,
        }
    }
    (script && i < run.len()).then_some(i)
}

/// The most bytes the kernel passes in one argument or `NAME=value` variable: `MAX_ARG_STRLEN`,
/// 32 pages, less the NUL (131,071 bytes with 4 KiB pages).
pub(crate) fn max_arg() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE).ok().flatten().unwrap_or(4096);
        usize::try_from(page).unwrap_or(4096) * 32 - 1
    })
}

impl Validator<'_> {
    /// An error about the value at `span`, named by its key path.
    fn error(&mut self, span: std::ops::Range<usize>, what: &str) -> &mut Diagnostic {
        let key = self.key(span.start);
        self.diags.push(Diagnostic::error(span, format!("{key}{what}")));
        self.diags.last_mut().expect("just pushed")
    }

    fn warn(&mut self, span: std::ops::Range<usize>, what: &str) -> &mut Diagnostic {
        let key = self.key(span.start);
        self.diags.push(Diagnostic::warning(span, format!("{key}{what}")));
        self.diags.last_mut().expect("just pushed")
    }

    /// "`step[0].name`: " for the key or value at `offset`, or nothing; an item of a list that
    /// starts there is named by its index (`step[0].needs[1]`).
    fn key(&self, offset: usize) -> String {
        self.keys().item_path_at(offset).map_or_else(String::new, |k| format!("`{k}`: "))
    }

    /// The index of the file's keys, built on first use.
    fn keys(&self) -> &KeyIndex {
        self.keys.get_or_init(|| match self.doc {
            Some(doc) => KeyIndex::of(doc),
            None => KeyIndex::new(self.source),
        })
    }

    /// A warning when an item of a step's `run`, or of a command written as a list (a catch
    /// handler's, a compensation's, a hook's), holds what looks like a shell variable (`$X`,
    /// `${X}`): no shell runs, so the program receives it as written.
    fn shell_variable(&mut self, raw: &Str, of: ListOf) {
        let Some(var) = shell_variable(raw.get_ref()) else { return };
        let name = var.trim_start_matches("${").trim_start_matches('$').trim_end_matches('}');
        let (passes, instead) = match of {
            ListOf::Step => ("`run` passes", "write the step as `shell = \"...\"`"),
            ListOf::Handler => ("`run` passes", "write the handler as `shell = \"...\"`"),
            ListOf::Command => ("a command written as a list passes", "write the command as one string, `\"...\"`"),
        };
        let d = self.warn(
            raw.span(),
            &format!("`{var}` looks like a shell variable, but {passes} it to the program literally"),
        );
        d.label = "not expanded".into();
        d.help = Some(format!(
            "to expand it, {instead} (run by /bin/sh -c), or read `{name}` from the environment inside the program"
        ));
    }

    /// A warning when the value of `name` in an `env` table refers to a variable as a shell would
    /// (`PATH = "/opt/bin:$PATH"`) and that is most likely what was meant: the variable is `name`
    /// itself, or one set in waymark's environment. Values are set as written; a `$` that names
    /// nothing set stays a `$` without a word (a literal one in a pattern, say).
    fn env_variable(&mut self, name: &str, val: &Str) {
        // Each `$NAME` in turn (`$TOOL_HOME/lib:$LD_LIBRARY_PATH`): the first that is meant.
        let meant = |var: &&str| {
            let used = var.trim_start_matches("${").trim_start_matches('$').trim_end_matches('}');
            used == name || std::env::var_os(used).is_some()
        };
        let Some(var) = shell_variables(val.get_ref()).find(meant) else { return };
        let d =
            self.warn(val.span(), &format!("`{var}` looks like a shell variable, but `env` values are set as written"));
        d.label = "not expanded".into();
        d.help = Some(format!(
            "write the value in full, or set `{name}` in the command itself (`shell = \"export {name}=...; ...\"`, run \
             by /bin/sh -c, which expands `{var}`)"
        ));
    }

    /// When programs are searched ([`ProgramSearch`]), a warning for `program` if it is on no
    /// directory of the PATH it would be started with: `step_path` (a step's `env` PATH), else
    /// the flow's `env` PATH, else waymark's own. `whose` names the `env` to set PATH in. A
    /// program written with a `/` is not searched: a warning if it is no executable file, a
    /// relative path counting from the working directory, which the second of `workdir` names.
    fn search_program(&mut self, program: &Str, step_path: Option<&String>, workdir: (&Path, &str), whose: &str) {
        let (workdir, base) = workdir;
        if self.search.is_none() {
            return;
        }
        let name = program.get_ref();
        if name.is_empty() || name.contains('\0') {
            return;
        }
        if name.contains('/') {
            self.program_at_path(program, workdir, base);
            return;
        }
        let (path, from) = match (step_path, &self.flow_path_env, &self.own_path) {
            (Some(p), _, _) => (p.as_str(), "the step's `env`"),
            (None, Some(p), _) => (p.as_str(), "the flow's `env`"),
            (None, None, Some(p)) => (p.as_str(), "waymark's environment"),
            (None, None, None) => (DEFAULT_SEARCH_PATH, "the system default: PATH is not set"),
        };
        let last = self.last_on_path.as_ref().filter(|(p, w, n, _)| p == path && w == workdir && n == name);
        if let Some(found) = last.map(|l| l.3) {
            if !found {
                let path = path.to_owned();
                self.program_not_on_path(program, &path, from, whose);
            }
            return;
        }
        let cached = self.on_path.get(path).and_then(|w| w.get(workdir)).and_then(|p| p.get(name.as_str())).copied();
        let found = cached.unwrap_or_else(|| {
            path.split(':').any(|dir| {
                use std::os::unix::fs::PermissionsExt;
                let dir = if dir.is_empty() { "." } else { dir };
                std::fs::metadata(workdir.join(dir).join(name))
                    .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            })
        });
        let path = path.to_owned();
        if cached.is_none() {
            self.on_path
                .entry(path.clone())
                .or_default()
                .entry(workdir.to_owned())
                .or_default()
                .insert(name.clone(), found);
        }
        // The next step most likely runs the same program: it compares with this one.
        self.last_on_path = Some((path.clone(), workdir.to_owned(), name.clone(), found));
        if !found {
            self.program_not_on_path(program, &path, from, whose);
        }
    }

    /// A warning for `program` named by a path (with a `/`) that is not an executable file: it
    /// is not searched on PATH, and a relative one counts from the working directory (`base`
    /// says which, in words), as for its process. The file may still appear before the run
    /// starts: a warning, not an error.
    fn program_at_path(&mut self, program: &Str, workdir: &Path, base: &str) {
        let name = program.get_ref();
        let (what, label, help) = match self.kind(workdir.join(name)) {
            FileKind::Executable => return,
            FileKind::Directory => {
                ("is a directory".to_owned(), "a directory", "name the program's file, not a directory".to_owned())
            }
            FileKind::File => (
                "is not executable".to_owned(),
                "not executable",
                "make it executable (`chmod +x`) before the run starts, or correct the path".to_owned(),
            ),
            FileKind::Other => (
                "is not a regular file".to_owned(),
                "not a file",
                "correct the path: it must name an executable file when the run starts".to_owned(),
            ),
            FileKind::Missing => (
                "does not exist".to_owned(),
                "not found",
                "create it before the run starts, or correct the path (a program written with a `/` is run from \
                 that path, not looked up on PATH)"
                    .to_owned(),
            ),
            FileKind::Unknown(e) => (
                format!("cannot be checked ({e})"),
                "not checked",
                "correct the path, or make sure the run can reach it".to_owned(),
            ),
        };
        let message = match Path::new(name).is_absolute() {
            true => format!("program `{name}` {what}"),
            false => format!("program `{name}` {what} (relative to {base})"),
        };
        let d = self.warn(program.span(), &message);
        d.label = label.into();
        d.help = Some(help);
    }

    /// What `path` is now (symbolic links followed, as `exec` and `chdir` do), looked at once.
    fn kind(&mut self, path: std::path::PathBuf) -> FileKind {
        use std::os::unix::fs::PermissionsExt;
        self.kinds
            .entry(path)
            .or_insert_with_key(|path| match std::fs::metadata(path) {
                Ok(m) if m.is_dir() => FileKind::Directory,
                Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => FileKind::Executable,
                Ok(m) if m.is_file() => FileKind::File,
                Ok(_) => FileKind::Other,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory) => {
                    FileKind::Missing
                }
                Err(e) => FileKind::Unknown(e.to_string()),
            })
            .clone()
    }

    /// A warning when a step's `workdir` is not a directory now: the step could not start in it.
    fn workdir_exists(&mut self, raw: &Str, workdir: &Path) {
        let not_found =
            ("not found", "create it before the run starts, or correct the path: a step cannot start without it");
        let (what, (label, help)) = match self.kind(workdir.to_owned()) {
            FileKind::Directory => return,
            FileKind::Executable | FileKind::File | FileKind::Other => (
                "is not a directory".to_owned(),
                ("not a directory", "correct the path: a step cannot start in a file"),
            ),
            FileKind::Missing => ("does not exist".to_owned(), not_found),
            FileKind::Unknown(e) => (format!("cannot be checked ({e})"), not_found),
        };
        let written = raw.get_ref();
        let message = match Path::new(written).is_absolute() {
            true => format!("the working directory `{written}` {what}"),
            false => format!("the working directory `{written}` {what} (relative to the flow file's directory)"),
        };
        let d = self.warn(raw.span(), &message);
        d.label = label.into();
        d.help = Some(help.into());
    }

    /// The warning for `program` (without a `/`), an executable file in no directory of `path`
    /// (a relative directory counts from the step's working directory, as for its process).
    fn program_not_on_path(&mut self, program: &Str, path: &str, from: &str, whose: &str) {
        let name = program.get_ref();
        let env_file = self.env_file;
        let d = self
            .warn(program.span(), &format!("program `{name}` is not on the PATH a run would search: {path} ({from})"));
        d.label = "not found".into();
        let mut help = format!(
            "install it, write its full path (`run = [\"/path/to/{name}\", ...]`), or set PATH in the {whose} `env`; \
             cron and services start with a short PATH"
        );
        if env_file {
            help.push_str("; the `env_file`, read when a run starts, may set another PATH");
        }
        d.help = Some(help);
    }

    /// An error when a program, argument or shell command cannot be passed to a program: a NUL
    /// byte, or more bytes than the kernel takes in one string (`MAX_ARG_STRLEN`, 128 KiB with its
    /// NUL), which would fail every attempt to start.
    fn passable(&mut self, raw: &Str, what: &str) {
        self.no_nul(raw, what);
        self.not_too_long(raw.span(), raw.get_ref().len(), 0, what);
    }

    /// An error when a string of `len` bytes, passed with `extra` more (a variable's `NAME=`),
    /// is more than the kernel passes to a program in one string.
    fn not_too_long(&mut self, span: std::ops::Range<usize>, len: usize, extra: usize, what: &str) {
        let most = max_arg().saturating_sub(extra);
        if len > most {
            let d = self.error(
                span,
                &format!(
                    "{what} is {len} bytes, more than the system passes to a program in one string (at most {most})"
                ),
            );
            d.label = "too long to pass".into();
            d.help = Some("put it in a file and pass the file's path (a long script: run it as a file)".into());
        }
    }

    /// An error when a string that becomes a path, argument or command holds a NUL byte, which
    /// no program can receive.
    fn no_nul(&mut self, raw: &Str, what: &str) {
        if let Some(at) = raw.get_ref().find('\0') {
            let span = raw.span();
            let d = self.error(span, &format!("{what} cannot hold a NUL byte (at byte {at} of the string)"));
            d.label = "holds a NUL byte".into();
            d.help = Some("remove the `\\u0000` escape; no program can receive a NUL byte".into());
        }
    }

    /// An error when a `shell` command line is empty or only blanks: `/bin/sh -c` would run
    /// nothing and succeed, as if the step (handler, hook) had done its work. `key` names the
    /// field in the message; `help` says what to write instead.
    fn blank_shell(&mut self, span: std::ops::Range<usize>, script: &str, key: &str, help: &str) -> bool {
        // What /bin/sh takes for the space between words: a line of them is no command.
        if !script.chars().all(|c| matches!(c, ' ' | '\t' | '\n')) {
            return false;
        }
        let what = if script.is_empty() { "is empty" } else { "holds only whitespace" };
        let d = self.error(span, &format!("{key} {what}: /bin/sh -c would run nothing and succeed"));
        d.label = "no command".into();
        d.help = Some(help.into());
        true
    }

    fn flow(&mut self, mut raw: RawFlow, path: &Path) -> Flow {
        let name = match &raw.name {
            Some(n) => {
                if !is_name(n.get_ref(), ".-") {
                    self.error(n.span(), "a flow name may only hold letters, digits, `_`, `.` and `-`").label =
                        "invalid name".into();
                } else if n.get_ref().len() > MAX_FLOW_NAME {
                    let d = self.error(
                        n.span(),
                        &format!(
                            "a flow name may be at most {MAX_FLOW_NAME} bytes long, this one is {}",
                            n.get_ref().len()
                        ),
                    );
                    d.label = "too long".into();
                    d.help = Some(format!(
                        "the flow's lock file is named after it (`locks/NAME.lock`), and a file name holds at most 255 bytes; \
                         choose a name of at most {MAX_FLOW_NAME} bytes"
                    ));
                }
                n.get_ref().clone()
            }
            None => {
                let raw_stem = path.file_stem().unwrap_or_default();
                let stem = raw_stem.to_string_lossy().into_owned();
                // Only shown (the flow is its file, and its lock file's name is made safe), so a
                // stem like `nightly backup` is fine; one a line cannot show is not. A `name` of
                // the wrong type is reported already; the stem is not what was meant.
                let shown = crate::text::shown_path(Path::new(&stem));
                // Not UTF-8 (shown with U+FFFD): `run` refuses such a path, so `check` does too.
                let lossy = raw_stem.to_str().is_none();
                if (shown != stem || lossy) && !raw.bad.contains(&"name") {
                    self.diags.push(
                        Diagnostic::error(
                            None,
                            format!(
                                "the file name `{shown}` cannot name the flow: it holds a character that a line \
                                 cannot show as it is (a control character, one that reorders text, or a byte that \
                                 is not UTF-8)"
                            ),
                        )
                        .help(Some(format!(
                            "set `name = \"...\"` at the top of the file (letters, digits, `_`, `.`, `-`; at most \
                             {MAX_FLOW_NAME} bytes)"
                        ))),
                    );
                }
                stem
            }
        };
        let resume_within = raw.resume_within.as_ref().and_then(|d| self.duration(d, false));
        let max_parallel = raw.max_parallel.as_ref().map_or(DEFAULT_MAX_PARALLEL, |n| self.max_parallel(n));
        let timeout = raw.timeout.as_ref().and_then(|d| self.duration(d, false));
        let params = self.params(&raw.params);
        let dir = path.parent().unwrap_or(Path::new("/"));
        let env_file = raw.env_file.as_ref().and_then(|f| self.env_file(f, dir));
        let secret_env = raw.secret_env.as_ref().map(|list| self.secret_env(list, &params)).unwrap_or_default();
        let hooks = Hooks {
            on_success: raw.hooks.on_success.as_ref().and_then(|c| self.command(c)),
            on_failure: raw.hooks.on_failure.as_ref().and_then(|c| self.command(c)),
            on_exit: raw.hooks.on_exit.as_ref().and_then(|c| self.command(c)),
        };
        let classes = self.classes(&raw.errors);
        let exit_codes = self.exit_codes(&raw.exit_codes, &classes);
        let env = self.env(&raw.env);
        self.flow_path_env = env.get("PATH").cloned();
        self.env_file = env_file.is_some();
        // Hooks run in the flow file's directory with the flow's environment.
        for hook in [&raw.hooks.on_success, &raw.hooks.on_failure, &raw.hooks.on_exit].into_iter().flatten() {
            if let RawCommand::Run(argv) = hook.get_ref()
                && let Some(program) = argv.first()
            {
                self.search_program(program, None, (dir, "the flow file's directory"), "flow's");
            }
        }
        let mut policies = BTreeMap::new();
        for (pname, policy) in &raw.policies {
            if !is_name(pname.get_ref(), "-") {
                self.error(pname.span(), "a policy name may only hold letters, digits, `_` and `-`");
            }
            let p = self.policy(policy.get_ref(), &classes);
            policies.insert(pname.get_ref().clone(), Arc::new(p));
        }
        let defaults = Defaults::new(self, raw.defaults.as_ref(), &policies, &classes);
        // The steps built, each with the index of its `[[step]]` in the file.
        let mut steps: Vec<Step> = Vec::with_capacity(raw.step.len());
        let mut written_at: Vec<usize> = Vec::with_capacity(raw.step.len());
        let shared_dir: Arc<Path> = dir.into();
        for (i, raw_step) in raw.step.iter_mut().enumerate() {
            if let Some(step) = self.step(raw_step, &defaults, &policies, &classes, &shared_dir) {
                steps.push(step);
                written_at.push(i);
            }
        }
        // After every step's own diagnostics: at the same place (its name), they come first. Every
        // step counts, built or not (a step whose command is wrong still takes its name).
        let mut seen = HashMap::with_capacity_and_hasher(raw.step.len(), FastHash::default());
        for (i, raw_step) in raw.step.iter().enumerate() {
            let Some(name) = &raw_step.get_ref().name else { continue };
            if let Some(&(first, at)) = seen.get(name.get_ref().as_str()) {
                let line = self.source.get(..at).map_or(0, |before: &str| before.matches('\n').count()) + 1;
                let d = self.error(name.span(), &format!("a step named `{}` is already defined", name.get_ref()));
                d.label = "duplicate step name".into();
                d.help = Some(format!(
                    "the first is `step[{first}]`, at line {line}; rename one of the two: a step's name is how \
                     `needs`, its logs and `waymark logs` know it"
                ));
            } else {
                seen.insert(name.get_ref().as_str(), (i, name.span().start));
            }
        }
        let (mut needs, explicit) = self.needs(&raw.step);
        // Indices into the steps hold only when every step was built; else the flow is refused.
        let complete = steps.len() == raw.step.len();
        for (step, &i) in steps.iter_mut().zip(&written_at) {
            if complete {
                step.needs = std::mem::take(&mut needs[i]);
            }
            step.needs_explicit = explicit[i];
            // A built step has a name; `needs` has read them all, so it moves.
            if let Some(name) = raw.step[i].get_mut().name.as_mut() {
                step.name = std::mem::take(name.get_mut());
            }
        }
        if let Some(secrets) = &raw.secret_env {
            // Each `env` table as written (its keys keep their place in the file), and whose it
            // is: every step's, built or not (a step with an error still shows its value).
            let mut built = written_at.iter().zip(&steps).peekable();
            let mut tables = vec![(None, &raw.env)];
            for (i, raw_step) in raw.step.iter().enumerate() {
                let name = match built.next_if(|(w, _)| **w == i) {
                    Some((_, step)) => Some(step.name.as_str()),
                    None => raw_step.get_ref().name.as_ref().map(|n| n.get_ref().as_str()),
                };
                tables.push((Some(name), &RawStepMore::of(&raw_step.get_ref().more).env));
            }
            self.secrets_written_here(secrets, &tables);
            self.secrets_in_defaults(secrets, &tables, &raw.params);
        }
        if raw.step.is_empty() && !raw.bad.contains(&"step") {
            // At an empty `step = []`; else the file as a whole is at fault: point at its first
            // line so the report has a place.
            let (span, label) = match self.keys().top_level("step") {
                Some(span) => (span, "an empty list of steps"),
                None => (0..self.source.find('\n').unwrap_or(self.source.len()), "no `[[step]]` in this file"),
            };
            self.diags.push(Diagnostic::error(span, "the flow has no steps").label(label).help(Some(
                "add at least one step, for example:\n[[step]]\nname = \"hello\"\nrun = [\"echo\", \"hi\"]".into(),
            )));
        }
        Flow {
            name,
            name_declared: raw.name.is_some(),
            path: path.to_owned(),
            resume_within,
            max_parallel,
            fail_fast: raw.fail_fast.unwrap_or(false),
            timeout,
            params,
            param_values: BTreeMap::new(),
            env,
            env_file,
            secret_env,
            hooks,
            classes,
            exit_codes,
            steps,
        }
    }

    fn max_parallel(&mut self, raw: &Spanned<i64>) -> u32 {
        let n = *raw.get_ref();
        match u32::try_from(n) {
            Ok(m) if (1..=MAX_PARALLEL).contains(&m) => m,
            _ => {
                let (what, help) = if n < 1 {
                    (
                        format!("`max_parallel` must be at least 1, got {n}"),
                        "`max_parallel = 1` runs one step at a time; without the key, 4 steps may run at once",
                    )
                } else {
                    (
                        format!("`max_parallel` must be at most {MAX_PARALLEL}"),
                        "each running step is a process group of its own; choose how many your machine runs well",
                    )
                };
                let d = self.error(raw.span(), &what);
                d.label = "out of range".into();
                d.help = Some(help.into());
                DEFAULT_MAX_PARALLEL
            }
        }
    }

    /// `[params]`: names are identifiers, distinct once upper-cased (each is `WAYMARK_PARAM_NAME`).
    fn params(&mut self, raw: &[(Str, Option<Str>)]) -> BTreeMap<String, Param> {
        let mut out = BTreeMap::new();
        let mut by_var: HashMap<String, String> = HashMap::new();
        for (name, default) in raw {
            let n = name.get_ref();
            if !is_identifier(n) {
                let mut fixed: String = n.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
                if fixed.starts_with(|c: char| c.is_ascii_digit()) {
                    fixed.insert(0, '_');
                }
                // As the file writes it: a name with a newline in it keeps the message on its line.
                let written = super::diagnostic::key_in_path(n);
                let d = self.error(
                    name.span(),
                    &format!(
                        "`{written}` is not a parameter name: it must start with a letter or `_` and hold only ASCII \
                         letters, digits and `_`"
                    ),
                );
                d.label = "invalid name".into();
                // An empty name has nothing to mend: say what one looks like.
                let instead = match fixed.as_str() {
                    "" => "name it, for example `region`".to_owned(),
                    fixed => format!("write `{fixed}`"),
                };
                d.help = Some(format!(
                    "steps see a parameter as the variable `WAYMARK_PARAM_NAME`, so its name must be one a variable \
                     can have: {instead}"
                ));
                continue;
            }
            let var = super::params::env_name(n);
            if let Some(other) = by_var.get(&var) {
                let d = self.error(name.span(), &format!("parameters `{other}` and `{n}` would both be `{var}`"));
                d.label = "same name upper-cased".into();
                d.help = Some("steps see parameters upper-cased; rename one of the two".into());
                continue;
            }
            let name_len = var.len();
            by_var.insert(var, n.clone());
            if let Some(d) = default {
                self.no_nul(d, "a parameter's default");
                self.not_too_long(d.span(), d.get_ref().len(), name_len + 1, "a parameter's default");
            }
            out.insert(n.clone(), Param { default: default.as_ref().map(|d| d.get_ref().clone()) });
        }
        out
    }

    fn env_file(&mut self, raw: &Str, dir: &Path) -> Option<std::path::PathBuf> {
        if raw.get_ref().is_empty() {
            let d = self.error(raw.span(), "the path of the env file is empty");
            d.label = "no path".into();
            d.help = Some(
                "write the path of a dotenv file, relative to the flow file's directory: `env_file = \".env\"`".into(),
            );
            return None;
        }
        if raw.get_ref().contains('\0') {
            self.no_nul(raw, "a path");
            return None;
        }
        Some(dir.join(raw.get_ref()))
    }

    /// A warning for each secret whose value the file itself sets in an `env` table: the run
    /// records the flow's definition, `env` included, so the value would be kept in the state
    /// database (it is still hidden wherever waymark prints it). Shown at the first `env` entry
    /// that sets it, where the value is written.
    /// `tables` holds the flow's table (no step: `None`), then each step's (`Some` of its name,
    /// if it has one).
    fn secrets_written_here(&mut self, raw: &Spanned<Vec<Str>>, tables: &[(Option<Option<&str>>, &StrMap)]) {
        let mut seen = HashSet::new();
        for item in raw.get_ref() {
            let n = item.get_ref();
            // A name listed twice (an error of its own) is said once here.
            if !seen.insert(n.as_str()) {
                continue;
            }
            let Some((step, key)) =
                tables.iter().find_map(|(step, table)| table.keys().find(|k| k.get_ref() == n).map(|k| (step, k)))
            else {
                continue;
            };
            let first = match step {
                None => "the flow's `env`".to_owned(),
                Some(Some(name)) => format!("step `{name}`'s `env`"),
                Some(None) => "the `env` of a step without a name".to_owned(),
            };
            let d = self.warn(
                key.span(),
                &format!(
                    "the value of secret `{n}` is written in this file ({first}), and every run records the flow's \
                     definition, its `env` tables included, in the state database"
                ),
            );
            d.label = "value written in the flow file".into();
            d.help = Some(
                "set it in the `env_file` or in the environment waymark runs in, which are never recorded; it is \
                 shown as *** either way"
                    .into(),
            );
        }
    }

    /// An error for each parameter default that holds the value the file sets for a secret in an
    /// `env` table: a run records its parameter values, and refuses such a default; `check` says so
    /// first, at the default. (Secrets set elsewhere, in the env file or the environment, only
    /// `run` can see.)
    fn secrets_in_defaults(
        &mut self,
        raw: &Spanned<Vec<Str>>,
        tables: &[(Option<Option<&str>>, &StrMap)],
        params: &[(Str, Option<Str>)],
    ) {
        let values: Vec<(&str, &str)> = raw
            .get_ref()
            .iter()
            .flat_map(|n| {
                tables.iter().flat_map(move |(_, table)| {
                    table
                        .iter()
                        .filter(|(k, _)| k.get_ref() == n.get_ref())
                        .map(move |(_, v)| (n.get_ref().as_str(), v.get_ref().as_str()))
                })
            })
            .filter(|(_, v)| !v.is_empty())
            .collect();
        for (name, default) in params {
            let Some(default) = default else { continue };
            let Some((secret, _)) = values.iter().find(|(_, v)| default.get_ref().contains(v)) else { continue };
            let d = self.error(
                default.span(),
                &format!(
                    "the default of parameter `{}` holds the value of secret `{secret}`, which this file sets",
                    name.get_ref()
                ),
            );
            d.label = "a secret's value".into();
            d.help = Some(
                "parameter values are recorded with the run (to resume it with them) and a secret never is: let the \
                 step read the secret from its environment instead"
                    .into(),
            );
        }
    }

    /// `secret_env`: variable names, each once, none of them a parameter's: parameter values are
    /// recorded with the run (to resume it with them), and a secret never is.
    fn secret_env(&mut self, raw: &Spanned<Vec<Str>>, params: &BTreeMap<String, Param>) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let mut seen = HashSet::new();
        for item in raw.get_ref() {
            let n = item.get_ref();
            if !is_identifier(n) {
                let d = self.error(item.span(), &format!("`{n}` is not a variable name"));
                d.label = "invalid name".into();
                d.help = Some(match n.strip_prefix('$').or_else(|| n.split_once('=').map(|(k, _)| k)) {
                    Some(bare) if is_identifier(bare) => format!("write only the name: `\"{bare}\"`"),
                    _ => "a variable name holds ASCII letters, digits and `_` and does not start with a digit".into(),
                });
            } else if !seen.insert(n.as_str()) {
                let d = self.error(item.span(), &format!("`{n}` is listed twice"));
                d.label = "listed again".into();
                d.help = Some("remove one of the two".into());
            } else if let Some(param) = params.keys().find(|p| super::params::env_name(p) == *n) {
                let d = self.error(item.span(), &format!("`{n}` is parameter `{param}`, which cannot be a secret"));
                d.label = "a parameter".into();
                d.help = Some(
                    "parameter values are recorded with the run so that a resumed run has them, and a secret is \
                     never recorded: pass the secret in the environment or the `env_file`, and name that variable \
                     here"
                        .into(),
                );
            } else {
                out.push(n.clone());
            }
        }
        out
    }

    /// A hook or a `compensate`: a list of arguments or a shell command line.
    fn command(&mut self, raw: &Spanned<RawCommand>) -> Option<Command> {
        match raw.get_ref() {
            RawCommand::Run(argv) => {
                if argv.first().is_none_or(|p| p.get_ref().is_empty()) {
                    let d = self.error(raw.span(), "a command needs at least a program name");
                    d.label = "no program".into();
                    d.help = Some(
                        "write `[\"program\", \"arg\"]`, or a string to run a command line with /bin/sh -c".into(),
                    );
                    return None;
                }
                let script = shell_script(argv);
                for (i, arg) in argv.iter().enumerate() {
                    self.passable(arg, "a program or argument");
                    if Some(i) != script {
                        self.shell_variable(arg, ListOf::Command);
                    }
                }
                Some(Command::Run(argv.iter().map(|a| a.get_ref().clone()).collect()))
            }
            RawCommand::Shell(script) => {
                if self.blank_shell(
                    raw.span(),
                    script,
                    "the command line",
                    "write the command line to run, `\"command arg\"`, or a list `[\"program\", \"arg\"]`",
                ) {
                    return None;
                }
                self.passable(&Spanned::new(raw.span(), script.clone()), "a shell command");
                Some(Command::Shell(script.clone()))
            }
        }
    }

    /// Every step's `needs` as indices into `steps` (the steps of the file, built or not), and
    /// whether the file wrote it. Reports unknown names, a step needing itself, an entry written
    /// twice, and every cycle, at the entry that closes it.
    fn needs(&mut self, steps: &[Spanned<RawStep>]) -> (Vec<Needs>, Vec<bool>) {
        let mut index: HashMap<&str, usize, FastHash> =
            HashMap::with_capacity_and_hasher(steps.len(), FastHash::default());
        // In file order, so that of two equally close names the first is suggested.
        let mut names: Vec<&str> = Vec::with_capacity(steps.len());
        for (i, s) in steps.iter().enumerate() {
            if let Some(n) = &s.get_ref().name {
                index.entry(n.get_ref().as_str()).or_insert(i);
                names.push(n.get_ref());
            }
        }
        let mut suggestion_work = 0;
        // A step whose `name` has the wrong type (`name = 2024`, reported already) may be the one
        // an unknown name in `needs` means: that name is not said to be unknown as well.
        let a_name_unread = steps.iter().any(|s| s.get_ref().bad.contains(&"name"));
        let name =
            |i: usize| steps[i].get_ref().name.as_ref().map_or_else(|| format!("step[{i}]"), |n| n.get_ref().clone());
        let mut graph: Vec<Needs> = Vec::with_capacity(steps.len());
        let mut explicit: Vec<bool> = Vec::with_capacity(steps.len());
        // Per step, the span of each entry written and kept; none for the implicit need of the
        // step before.
        let mut spans: Vec<Vec<Range<usize>>> = Vec::with_capacity(steps.len());
        for (i, s) in steps.iter().enumerate() {
            let s = s.get_ref();
            let Some(list) = &s.needs else {
                // A `needs` of the wrong type is reported already: no dependencies to guess at.
                let bad = s.bad.contains(&"needs");
                graph.push(if bad { Needs::default() } else { implicit_needs(i) });
                explicit.push(bad);
                spans.push(Vec::new());
                continue;
            };
            let own = s.name.as_ref().map(|n| n.get_ref().as_str());
            let mut kept = Vec::new();
            let mut kept_spans = Vec::new();
            let mut seen = HashSet::new();
            for item in list.get_ref() {
                let n = item.get_ref().as_str();
                if Some(n) == own {
                    let d = self.error(item.span(), &format!("step `{n}` cannot need itself"));
                    d.label = "its own name".into();
                    d.help = Some(
                        "remove it; without `needs` a step needs the step before it, and `needs = []` makes it a root"
                            .into(),
                    );
                    continue;
                }
                match index.get(n) {
                    None if a_name_unread => {}
                    None => {
                        suggestion_work += names.len();
                        let hint = (suggestion_work <= MAX_SUGGESTION_WORK)
                            .then(|| crate::suggest::closest(n, names.iter().copied().filter(|c| Some(*c) != own)))
                            .flatten();
                        let d = self.error(item.span(), &format!("no step named `{n}`"));
                        d.label = "unknown step".into();
                        d.help = Some(match hint {
                            Some(h) => format!("did you mean `{h}`?"),
                            None => "`needs` lists the `name`s of other steps of this flow".into(),
                        });
                    }
                    Some(&j) if !seen.insert(j) => {
                        let d = self.error(item.span(), &format!("`{n}` is listed twice"));
                        d.label = "listed again".into();
                        d.help = Some("remove one of the two".into());
                    }
                    Some(&j) => {
                        kept.push(j);
                        kept_spans.push(item.span());
                    }
                }
            }
            spans.push(kept_spans);
            graph.push(kept.into());
            explicit.push(true);
        }
        let mut reported = HashSet::new();
        let cycles = graph::cycles(&graph, MAX_CYCLES_REPORTED);
        let more = if cycles.len() == MAX_CYCLES_REPORTED {
            format!("; only the first {MAX_CYCLES_REPORTED} cycles are reported")
        } else {
            String::new()
        };
        for cycle in cycles {
            let k = cycle.steps.len();
            // The entry of `cycle.steps[pos]` that needs the next step of the cycle.
            let entry = |pos: usize| {
                let step = cycle.steps[pos];
                let entry = if pos + 1 == k {
                    cycle.entry
                } else {
                    graph[step].iter().position(|&t| t == cycle.steps[pos + 1]).unwrap_or_default()
                };
                (step, entry)
            };
            // Point at the entry that closes the cycle, or, when that one is implicit (a step
            // without `needs`), at the last written entry before it: every cycle has one, since
            // implicit needs only point back.
            let Some(pos) = (0..k).rev().find(|&pos| {
                let (step, e) = entry(pos);
                spans[step].get(e).is_some()
            }) else {
                continue;
            };
            let (step, e) = entry(pos);
            let Some(span) = spans[step].get(e).cloned() else { continue };
            if !reported.insert((step, e)) {
                continue;
            }
            // Start the cycle at the step the entry names, so that it ends with the entry.
            let order: Vec<usize> = (1..=k).map(|d| cycle.steps[(pos + d) % k]).collect();
            let mut text: Vec<String> = if k > MAX_CYCLE_SHOWN {
                let (head, tail) = (MAX_CYCLE_SHOWN / 2, MAX_CYCLE_SHOWN / 2 - 1);
                let mut t: Vec<String> = order[..head].iter().map(|&s| name(s)).collect();
                t.push(format!("… {} more …", k - head - tail));
                t.extend(order[k - tail..].iter().map(|&s| name(s)));
                t
            } else {
                order.iter().map(|&s| name(s)).collect()
            };
            text.push(name(order[0]));
            // The steps of the cycle that need the step before them only because they have no `needs`.
            let mut implicit: Vec<String> = order
                .iter()
                .filter(|&&s| steps[s].get_ref().needs.is_none())
                .map(|&s| format!("`{}`", name(s)))
                .collect();
            if implicit.len() > MAX_IMPLICIT_SHOWN {
                let rest = implicit.len() - (MAX_IMPLICIT_SHOWN - 1);
                implicit.truncate(MAX_IMPLICIT_SHOWN - 1);
                implicit.push(format!("{rest} more steps"));
            }
            let implicit = match implicit.as_slice() {
                [] => String::new(),
                [one] => {
                    format!("{one} has no `needs`, so it needs the step before it (`needs = []` makes it a root); ")
                }
                [init @ .., last] => format!(
                    "{} and {last} have no `needs`, so each needs the step before it (`needs = []` makes a step a \
                     root); ",
                    init.join(", ")
                ),
            };
            let d = self.error(span, &format!("steps need each other in a cycle: {}", text.join(" -> ")));
            d.label = "closes the cycle".into();
            d.help = Some(format!(
                "{implicit}`x -> y` means x needs y, so none of these steps could ever start; remove one of these \
                 needs{more}"
            ));
        }
        (graph, explicit)
    }

    fn classes(&mut self, errors: &BTreeMap<Str, Spanned<Vec<Str>>>) -> ClassTree {
        if errors.len() > MAX_USER_CLASSES {
            // Point at the first class over the limit, in the order of the file.
            let mut keys: Vec<&Str> = errors.keys().collect();
            keys.sort_by_key(|k| k.span().start);
            let extra = keys[MAX_USER_CLASSES];
            let what =
                format!("[errors] declares {} classes, more than the {MAX_USER_CLASSES} waymark accepts", errors.len());
            let d = self.error(extra.span(), &what);
            d.label = format!("class number {}", MAX_USER_CLASSES + 1);
            d.help = Some("declare only the classes your steps report or match on".into());
            return ClassTree::default();
        }
        let declared: HashSet<&str> = errors.keys().map(|k| k.get_ref().as_str()).collect();
        let mut user = Vec::new();
        for (name, bases) in errors {
            let n = name.get_ref();
            if n.contains('.') {
                self.error(name.span(), "an error class name is a bare class name, without a module path").help =
                    n.rsplit('.').next().map(|last| format!("write `{last}`"));
                continue;
            }
            if !crate::classify::error_file::is_class_name(n) {
                self.error(
                    name.span(),
                    "an error class name must be an identifier (letters, digits and `_`, not starting with a digit)",
                );
                continue;
            }
            if is_builtin(n) {
                self.error(name.span(), &format!("`{n}` is a built-in class and cannot be redefined")).help =
                    Some("choose another name for your class".into());
                continue;
            }
            let mut list: Vec<String> = Vec::new();
            let mut written = HashSet::new();
            for base in bases.get_ref() {
                let b = base.get_ref();
                if !written.insert(b.as_str()) {
                    let d = self.error(base.span(), &format!("duplicate base class `{b}`"));
                    d.label = "listed again".into();
                    d.help = Some("remove one of the two".into());
                } else if b == WORKFLOW_TIMEOUT {
                    let d = self.error(base.span(), &format!("no class can derive from `{WORKFLOW_TIMEOUT}`"));
                    d.label = "waymark's own class".into();
                    d.help = Some(format!(
                        "`{WORKFLOW_TIMEOUT}` is what a run fails with when the flow's `timeout` passes; derive from \
                         `BaseException` for a class no ordinary policy retries"
                    ));
                } else if !is_builtin(b) && !declared.contains(b.as_str()) {
                    // The declared classes in the order of their names, not of a hash set's: of two
                    // equally close names, the same one is suggested on every run.
                    let declared_names = errors.keys().map(|k| k.get_ref().as_str());
                    let hint = crate::suggest::closest(b, ClassTree::default().names().chain(declared_names));
                    let d = self.error(base.span(), &format!("unknown base class `{b}`"));
                    d.label = "not a built-in class nor one declared in [errors]".into();
                    d.help = hint.map(|h| format!("did you mean `{h}`?"));
                } else {
                    list.push(b.clone());
                }
            }
            if bases.get_ref().is_empty() {
                list.push("Exception".into());
            }
            user.push((n.clone(), list));
        }
        // Each class that cannot be placed is reported and then taken as if it had no bases of its
        // own (`["Exception"]`, which can never be wrong), so that the next one is found too and
        // every class still counts as declared where it is used. After a few, the rest are
        // taken that way at once: a file of thousands of broken classes costs no more.
        let mut reported = 0;
        loop {
            let e = match ClassTree::new(user.clone()) {
                Ok(tree) => return tree,
                Err(e) => e,
            };
            let class = match &e {
                ClassError::Cycle(class, _)
                | ClassError::Inconsistent(class)
                | ClassError::TooMany(class)
                | ClassError::TooDeep(class) => class.clone(),
            };
            self.class_error(errors, &e);
            reported += 1;
            for (name, list) in &mut user {
                if *name == class || reported >= MAX_CLASS_ERRORS {
                    *list = vec!["Exception".to_owned()];
                }
            }
        }
    }

    /// Report why class `e` names cannot be placed in the hierarchy, at its key in `[errors]`.
    fn class_error(&mut self, errors: &BTreeMap<Str, Spanned<Vec<Str>>>, e: &ClassError) {
        let (class, what, help) = match e {
            ClassError::Cycle(class, path) => {
                // `path` is the walk that led back to `class`; keep only the loop itself.
                let walk: Vec<&str> = path.split(" -> ").collect();
                let start = walk.iter().position(|c| c == class).unwrap_or(0);
                (
                    class,
                    format!("class `{class}` inherits from itself: {} -> {class}", walk[start..].join(" -> ")),
                    "a class cannot be its own base; remove one of the bases in this cycle",
                )
            }
            ClassError::Inconsistent(class) => {
                (class, e.to_string(), "reorder its bases so that a subclass comes before its own bases")
            }
            ClassError::TooMany(class) => {
                (class, e.to_string(), "declare only the classes your steps report or match on")
            }
            ClassError::TooDeep(class) => (
                class,
                e.to_string(),
                "shorten the chain: `exception_types` matches any class along it, so intermediate classes are \
                 rarely needed",
            ),
        };
        match errors.keys().find(|k| k.get_ref() == class) {
            Some(key) => {
                let d = self.error(key.span(), &what);
                d.label = match e {
                    ClassError::Cycle(..) => "in an inheritance cycle",
                    ClassError::Inconsistent(_) => "inconsistent bases",
                    ClassError::TooMany(_) => "one class too many",
                    ClassError::TooDeep(_) => "too many bases",
                }
                .into();
                d.help = Some(help.into());
            }
            None => self.diags.push(Diagnostic::error(None, format!("invalid [errors]: {e}")).help(Some(help.into()))),
        }
    }

    fn exit_codes(&mut self, raw: &StrMap, classes: &ClassTree) -> ExitCodes {
        let mut out = ExitCodes::default();
        if raw.is_empty() {
            // Most steps: nothing to sort or remember.
            return out;
        }
        // In the order of the file, so that of two keys for one code ("1" and "01") the second
        // is the one said to be written twice.
        let mut entries: Vec<_> = raw.iter().collect();
        entries.sort_by_key(|(key, _)| key.span().start);
        let mut first: HashMap<String, &str> = HashMap::new();
        // Digits only: Rust's parse would take `+3` for 3.
        let code_of = |k: &str| k.bytes().all(|b| b.is_ascii_digit()).then(|| k.parse::<u16>().ok()).flatten();
        for (key, class) in entries {
            let k = key.get_ref();
            // The code or signal the key names, however it is written.
            let number = match code_of(k).ok_or(()) {
                Ok(code) => code.to_string(),
                Err(_) => Signal::parse(k).map_or_else(|| k.clone(), |sig| sig.name().to_owned()),
            };
            let earlier = first.get(&number).copied();
            if earlier.is_none() {
                first.insert(number.clone(), k.as_str());
            }
            if let Some(earlier) = earlier {
                let d = self.error(key.span(), &format!("`{number}` is mapped twice, as \"{earlier}\" and as \"{k}\""));
                d.label = "mapped again".into();
                d.help = Some("keep one of the two".into());
            } else if let Some(code) = code_of(k) {
                match u8::try_from(code) {
                    Ok(c) if c >= 1 => {
                        out.codes.insert(c, class.get_ref().clone());
                    }
                    _ => {
                        let d = self.error(key.span(), "an exit code must be between 1 and 255");
                        d.label = "out of range".into();
                        if code == 0 {
                            d.help = Some("exit code 0 means success and cannot be mapped to an error class".into());
                        }
                    }
                }
            } else if let Some(sig) = Signal::parse(k).filter(|_| k.starts_with("SIG")) {
                out.signals.insert(sig.name().to_owned(), class.get_ref().clone());
            } else {
                self.error(key.span(), &format!("`{k}` is neither an exit code (1-255) nor a signal name")).help =
                    Some(match Signal::parse(k) {
                        Some(sig) => format!("did you mean \"{}\"?", sig.name()),
                        None => "write an exit code such as \"3\" or a signal name such as \"SIGSEGV\"".into(),
                    });
            }
            let c = class.get_ref();
            if c == WORKFLOW_TIMEOUT {
                let d = self.error(class.span(), &format!("a step cannot fail with `{WORKFLOW_TIMEOUT}`"));
                d.label = "waymark's own class".into();
                d.help = Some(format!(
                    "`{WORKFLOW_TIMEOUT}` is what a run fails with when the flow's `timeout` passes: map the code to a \
                     class of your own, declared in [errors]"
                ));
            } else if c.is_empty() {
                let d = self.error(class.span(), "an empty name is not a class name");
                d.label = "no class".into();
                d.help = Some("write the class an exit maps to, declared in [errors] or built in".into());
            } else if !classes.knows(c) {
                let hint = classes.suggest(c);
                let d = self.error(class.span(), &format!("unknown error class `{c}`"));
                d.label = "not declared".into();
                d.help = Some(match hint {
                    Some(h) => format!("did you mean `{h}`? To use a new name, declare it in [errors]"),
                    None if c.contains('.') => c.rsplit('.').next().map_or_else(String::new, |last| {
                        format!("an error class name is a bare class name: write `{last}`, declared in [errors]")
                    }),
                    None if !crate::classify::error_file::is_class_name(c) => {
                        "an error class name is letters, digits and `_`, not starting with a digit: correct it".into()
                    }
                    None => format!("declare it in [errors], e.g. `{c} = [\"Exception\"]`"),
                });
            }
        }
        out
    }

    fn env(&mut self, raw: &StrMap) -> BTreeMap<String, String> {
        let mut env = BTreeMap::new();
        for (k, val) in raw {
            let name = k.get_ref();
            let wrong = if name.is_empty() {
                Some("an environment variable name cannot be empty")
            } else if name.contains('\0') {
                Some("an environment variable name cannot hold a NUL byte")
            } else if name.contains('=') {
                Some("an environment variable name cannot hold `=`")
            } else {
                None
            };
            if let Some(wrong) = wrong {
                self.error(k.span(), wrong);
            } else if val.get_ref().contains('\0') {
                self.error(val.span(), "an environment value cannot hold a NUL byte");
            } else if val.get_ref().len() + name.len() + 1 > max_arg() {
                self.not_too_long(val.span(), val.get_ref().len(), name.len() + 1, "an environment value");
            } else {
                if super::model::WAYMARK_VARS.contains(&name.as_str()) {
                    let d = self.warn(k.span(), &format!("`{name}` is set by waymark for every attempt"));
                    d.label = "no step sees this value".into();
                    d.help =
                        Some("remove it: waymark's own variables (README, \"Environment\") are set over `env`".into());
                }
                self.env_variable(name, val);
                env.insert(k.get_ref().clone(), val.get_ref().clone());
            }
        }
        env
    }

    fn duration(&mut self, raw: &Spanned<RawDuration>, allow_zero: bool) -> Option<Duration> {
        match super::duration::resolve(raw.get_ref(), allow_zero) {
            Ok(d) => Some(d),
            Err(invalid) => {
                let d = self.error(raw.span(), &invalid.message);
                if let Some(label) = invalid.label {
                    d.label = label.into();
                }
                d.help = invalid.help.map(Into::into);
                None
            }
        }
    }

    /// Add a help line to the diagnostic just reported.
    fn hint(&mut self, help: &str) {
        if let Some(d) = self.diags.last_mut() {
            d.help = Some(help.into());
        }
    }

    /// A number of seconds in `[min, 100 years]`, and 0 or at least 1 ms.
    fn seconds(&mut self, raw: &Spanned<f64>, min: f64, what: &str) -> Option<f64> {
        let x = *raw.get_ref();
        if !x.is_finite() || x < min || x > MAX_DURATION.as_secs_f64() {
            self.error(raw.span(), &format!("{what}, got {}", number(x))).label = "out of range".into();
            return None;
        }
        if x > 0.0 && x < MIN_DURATION.as_secs_f64() {
            let d = self.error(raw.span(), &format!("a wait must be 0 or at least 1 ms (0.001), got {}", number(x)));
            d.label = "out of range".into();
            d.help = Some("waymark counts time in milliseconds; write 0 for no wait".into());
            return None;
        }
        Some(x)
    }

    fn policy(&mut self, raw: &RawPolicy, classes: &ClassTree) -> RetryPolicy {
        let attempts = match &raw.attempts {
            None => DEFAULT_ATTEMPTS,
            Some(a) => match u32::try_from(*a.get_ref()) {
                Ok(n) if (1..=MAX_ATTEMPTS).contains(&n) => n,
                _ if *a.get_ref() >= 1 => {
                    self.error(a.span(), &format!("`attempts` must be at most {MAX_ATTEMPTS}")).label =
                        "out of range".into();
                    1
                }
                _ => {
                    let d = self.error(a.span(), "`attempts` counts total executions and must be at least 1");
                    d.label = "out of range".into();
                    d.help = Some("use `attempts = 1` to run once, or `exception_types = []` to retry nothing".into());
                    1
                }
            },
        };
        let exception_types = match &raw.exception_types {
            None => vec!["Exception".to_owned()],
            Some(list) => self.exception_types(list, classes, "retried"),
        };
        let mut backoff = Backoff::default();
        if let Some(s) = &raw.backoff_seconds
            && let Some(x) = self.seconds(s, 0.0, "`backoff_seconds` must be at least 0 and at most 100 years")
        {
            backoff.initial = Duration::from_secs_f64(x);
        }
        if let Some(m) = &raw.backoff_multiplier {
            // No upper bound: waits saturate at `backoff_max_seconds` or 100 years.
            let x = *m.get_ref();
            if x.is_finite() && x >= 1.0 {
                backoff.multiplier = x;
            } else {
                let d = self.error(
                    m.span(),
                    &format!("`backoff_multiplier` must be a finite number of at least 1.0, got {}", number(x)),
                );
                d.label = "out of range".into();
                d.help = Some("1.0 keeps every wait the same; 2.0 doubles the wait after each retry".into());
            }
        }
        if let Some(m) = &raw.backoff_max_seconds {
            let min = backoff.initial.as_secs_f64();
            let below = *m.get_ref() < min;
            let what = if below {
                format!("`backoff_max_seconds` must be at least `backoff_seconds` ({})", number(min))
            } else {
                "`backoff_max_seconds` must be at most 100 years".to_owned()
            };
            match self.seconds(m, min, &what) {
                Some(x) => backoff.max = Some(Duration::from_secs_f64(x)),
                None if below => {
                    self.hint("the cap would be below the first wait; raise it or lower `backoff_seconds`")
                }
                None => {}
            }
        }
        backoff.jitter = raw.jitter.unwrap_or(false);
        // A policy that retries nothing runs once: its budget is 1 wherever it is shown (`1/1`,
        // `WAYMARK_MAX_ATTEMPTS`), not the attempts it can never use.
        let nothing = raw.exception_types.as_ref().is_some_and(|list| list.get_ref().is_empty());
        let attempts = match (nothing, &raw.attempts) {
            (false, _) => attempts,
            (true, Some(a)) if attempts > 1 => {
                let d = self.warn(a.span(), &format!("`attempts = {attempts}` is never reached"));
                d.label = "the step runs once".into();
                d.help = Some(
                    "`exception_types = []` retries nothing: remove `attempts`, or list the errors to retry".into(),
                );
                1
            }
            (true, _) => 1,
        };
        RetryPolicy { attempts, exception_types, backoff }
    }

    /// The class names of a retry policy's or a catch handler's `exception_types`; `verb` says
    /// what `WorkflowTimeout` never is ("retried", "caught").
    fn exception_types(&mut self, list: &Spanned<Vec<Str>>, classes: &ClassTree, verb: &str) -> Vec<String> {
        let mut names = Vec::new();
        // A list is short (one name, mostly): a set only for a long one, where a scan would be quadratic.
        let mut seen: Option<HashSet<&str>> = (list.get_ref().len() > 16).then(HashSet::new);
        // The classes that names listed are other names of (`IOError` is `OSError`).
        let mut aliased: Vec<&'static str> = Vec::new();
        for item in list.get_ref() {
            let n = item.get_ref();
            if n.is_empty() {
                let d = self.error(item.span(), "an empty name is not a class name, so no error has it");
                d.label = "never matches".into();
                d.help = Some("remove it, or write the class to match".into());
            } else if n.contains('.') {
                self.error(
                    item.span(),
                    "exception types are matched by bare class name; a module path is not allowed",
                )
                .help = n.rsplit('.').next().map(|last| format!("write `{last}`"));
            } else if !crate::classify::error_file::is_class_name(n) {
                let d = self.error(item.span(), &format!("`{n}` is not a class name, so no error has it"));
                d.label = "never matches".into();
                d.help = Some("a class name is letters, digits and `_`, not starting with a digit: correct it".into());
            } else if seen.as_mut().map_or_else(|| names.contains(n), |seen| !seen.insert(n.as_str())) {
                let d = self.warn(item.span(), &format!("`{n}` is listed twice"));
                d.label = "listed again".into();
                d.help = Some("remove one of the two".into());
            } else if n == WORKFLOW_TIMEOUT {
                let d = self.error(
                    item.span(),
                    &format!("`{WORKFLOW_TIMEOUT}` is never {verb}: it ends the run when the flow's `timeout` passes"),
                );
                d.label = "never matches".into();
                d.help = Some(
                    "remove it; `[hooks] on_failure` and the steps' `compensate` commands run after a workflow \
                     timeout"
                        .into(),
                );
            } else if let Some(real) = crate::classify::classes::alias_of(n).filter(|_| !classes.knows(n)) {
                // As an `except IOError:` would, it matches every OSError (and still an error a
                // child reports under its own name).
                let d = self.warn(item.span(), &format!("`{n}` is another name of `{real}` in Python 3"));
                d.label = format!("matches `{real}` too");
                d.help = Some(format!("write `{real}`: tracebacks name it so"));
                names.push(n.clone());
                aliased.push(real);
            } else if let Some(modules) = (!classes.knows(n))
                .then(|| crate::classify::classes::stdlib_named(n))
                .filter(|modules| modules.len() > 1)
            {
                let shown: Vec<String> = modules.iter().take(4).map(|m| format!("`{m}`")).collect();
                let more = if modules.len() > 4 { format!(" and {} more", modules.len() - 4) } else { String::new() };
                let d = self.warn(
                    item.span(),
                    &format!(
                        "`{n}` is the name of several classes of Python's standard library: {}{more}",
                        shown.join(", ")
                    ),
                );
                d.label = "matches every one of them".into();
                d.help = Some(format!(
                    "a traceback's class is matched by its bare name, so `{n}` matches all of them and their \
                     subclasses, where Python's `except` catches the one imported; list a subclass only that one has, \
                     or declare a class of your own in [errors] for the step to report"
                ));
                names.push(n.clone());
            } else if !classes.knows(n) && crate::classify::classes::stdlib_named(n).is_empty() {
                let d = self.warn(item.span(), &format!("no known class is named `{n}`"));
                d.label = "matches only errors children report with this name".into();
                d.help = Some(match classes.suggest(n) {
                    Some(h) => format!("did you mean `{h}`?"),
                    None => format!("declare it in [errors] to silence this warning: `{n} = [\"Exception\"]`"),
                });
                names.push(n.clone());
            } else {
                names.push(n.clone());
            }
        }
        for real in aliased {
            if !names.iter().any(|n| n == real) {
                names.push(real.to_owned());
            }
        }
        names
    }

    /// One handler of a step's `catch`.
    fn handler(&mut self, raw: &Spanned<RawCatch>, classes: &ClassTree) -> Option<Catch> {
        let h = raw.get_ref();
        let exception_types = match &h.exception_types {
            None => vec!["Exception".to_owned()],
            Some(list) => {
                if list.get_ref().is_empty() {
                    let d =
                        self.warn(list.span(), "an empty `exception_types` matches no error: this handler never runs");
                    d.label = "matches nothing".into();
                    d.help = Some(
                        "list the classes it handles, such as `exception_types = [\"ActionTimeout\"]` (without the \
                         key it handles `Exception`), or remove the handler"
                            .into(),
                    );
                }
                self.exception_types(list, classes, "caught")
            }
        };
        let command = match (&h.run, &h.shell) {
            (Some(run), None) => {
                if run.get_ref().first().is_none_or(|p| p.get_ref().is_empty()) {
                    self.error(run.span(), "`run` needs at least a program name").help =
                        Some("write `run = [\"program\", \"arg\"]`, or leave out `run` to swallow the error".into());
                }
                let script = shell_script(run.get_ref());
                for (i, arg) in run.get_ref().iter().enumerate() {
                    self.passable(arg, "a program or argument");
                    if Some(i) != script {
                        self.shell_variable(arg, ListOf::Handler);
                    }
                }
                Some(Command::Run(run.get_ref().iter().map(|a| a.get_ref().clone()).collect()))
            }
            (None, Some(shell)) => {
                self.blank_shell(
                    shell.span(),
                    shell.get_ref(),
                    "`shell`",
                    "write `shell = \"command arg\"` or `run = [\"program\", \"arg\"]`, or leave out both to swallow \
                     the error",
                );
                self.passable(shell, "a shell command");
                Some(Command::Shell(shell.get_ref().clone()))
            }
            (Some(run), Some(_)) => {
                let d = self.error(run.span(), "a catch handler takes at most one of `run` and `shell`, not both");
                d.label = "remove this or `shell`".into();
                d.help = Some(
                    "`run` starts the program directly; `shell` runs a command line with /bin/sh -c; with neither, \
                     the handler swallows the error"
                        .into(),
                );
                return None;
            }
            (None, None) => None,
        };
        Some(Catch { exception_types, command })
    }

    /// A step's or the defaults' `retry`: inline, or a `[policies]` name.
    fn retry(
        &mut self,
        raw: &Spanned<RawRetry>,
        policies: &BTreeMap<String, Arc<RetryPolicy>>,
        classes: &ClassTree,
    ) -> Option<(Arc<RetryPolicy>, Option<String>)> {
        match raw.get_ref() {
            RawRetry::Inline(p) => Some((Arc::new(self.policy(p, classes)), None)),
            RawRetry::Named(name) => match policies.get(name) {
                Some(p) => Some((Arc::clone(p), Some(name.clone()))),
                None => {
                    let hint = crate::suggest::closest(name, policies.keys().map(String::as_str));
                    let what = match name.is_empty() {
                        true => "an empty policy name".to_owned(),
                        false => format!("no policy named `{name}` in [policies]"),
                    };
                    let d = self.error(raw.span(), &what);
                    d.label = "unknown policy".into();
                    d.help = Some(match hint {
                        Some(h) => format!("did you mean `{h}`?"),
                        None if !is_name(name, "_-") => {
                            "name a policy of [policies], or write the policy inline: `retry = { attempts = 3 }`".into()
                        }
                        None => format!("define it as [policies.{name}] or write the policy inline"),
                    });
                    None
                }
            },
        }
    }

    /// A `kill_signal`: a known signal, one that ends a process unless it handles it.
    fn signal(&mut self, raw: &Str) -> Option<Signal> {
        use nix::sys::signal::Signal as S;
        let sig = Signal::parse(raw.get_ref());
        match sig.map(|s| s.0) {
            None => {
                // Compared without the `SIG` all names share: `SIGFOO` is not a typo of `SIGFPE`.
                let written = raw.get_ref().to_ascii_uppercase();
                let bare = written.strip_prefix("SIG").unwrap_or(&written);
                let hint = crate::suggest::closest(bare, S::iterator().map(|s| &s.as_str()[3..]))
                    .map(|name| format!("SIG{name}"));
                self.error(raw.span(), &format!("unknown signal `{}`", raw.get_ref())).help = Some(match hint {
                    Some(h) => format!("did you mean \"{h}\"?"),
                    None => "use a signal name such as \"SIGTERM\", \"SIGINT\" or \"SIGKILL\"".into(),
                });
            }
            // Their default action stops the process, or does nothing.
            Some(
                s @ (S::SIGSTOP
                | S::SIGTSTP
                | S::SIGTTIN
                | S::SIGTTOU
                | S::SIGCONT
                | S::SIGCHLD
                | S::SIGURG
                | S::SIGWINCH),
            ) => {
                let d = self.warn(raw.span(), &format!("`{}` does not end a process", s.as_str()));
                d.label = "stops it or does nothing".into();
                d.help = Some(
                    "the step's processes go on until SIGKILL, `kill_grace` later: use \"SIGTERM\" or \"SIGINT\""
                        .into(),
                );
            }
            Some(_) => {}
        }
        sig
    }

    fn detect(&mut self, raw: &Str) -> Option<bool> {
        match raw.get_ref().as_str() {
            "auto" => Some(true),
            "none" => Some(false),
            other => {
                let hint = crate::suggest::closest(other, DETECT_VALUES);
                self.error(
                    raw.span(),
                    &format!("`detect_errors` must be \"auto\" or \"none\", not {}", super::toml_quoted(other)),
                )
                .help = hint.map(|h| format!("did you mean \"{h}\"?"));
                None
            }
        }
    }

    /// Step `raw` built, its `run` arguments moved out of it (the rest stays for `needs`).
    fn step(
        &mut self,
        raw: &mut Spanned<RawStep>,
        defaults: &Defaults,
        policies: &BTreeMap<String, Arc<RetryPolicy>>,
        classes: &ClassTree,
        dir: &Arc<Path>,
    ) -> Option<Step> {
        let span = raw.span();
        let raw = raw.get_mut();
        // The `[[step]]` header (or the inline table's first line), not the whole table: found
        // only for a step that has an error there.
        let source = self.source;
        let header = || {
            let line_end = source[span.start.min(source.len())..].find('\n').map_or(span.end, |i| span.start + i);
            span.start..line_end.min(span.end)
        };
        // A step without a name (or with one of the wrong type, said where it is written) is
        // still checked field by field, as one whose command is wrong: every error in the file is
        // said at once. It is left out of the flow at the end.
        let name = raw.name.as_ref();
        if name.is_none() && !raw.bad.contains(&"name") {
            let d = self.error(header(), "a step has no `name`");
            d.label = "this step".into();
            d.help = Some("add `name = \"...\"` (letters, digits, `_`, `-`)".into());
        }
        if let Some(name) = name
            && !is_name(name.get_ref(), "-")
        {
            // A letter with an accent is suggested without it (`étape`: `etape`): the accent is a
            // mark of its own once the letter is decomposed, and goes.
            use unicode_normalization::{UnicodeNormalization, char::is_combining_mark};
            let fixed: String = name
                .get_ref()
                .nfd()
                .filter(|c| !is_combining_mark(*c))
                .map(|c| if is_name(&c.to_string(), "-") { c } else { '-' })
                .collect();
            let d = self.error(name.span(), "a step name may only hold letters, digits, `_` and `-`");
            d.label = "invalid name".into();
            d.help =
                Some(format!("write `{}`", fixed.trim_matches('-'))).filter(|_| !fixed.trim_matches('-').is_empty());
        } else if let Some(name) = name
            && name.get_ref().len() > MAX_STEP_NAME
        {
            let d = self.error(
                name.span(),
                &format!("a step name may be at most {MAX_STEP_NAME} bytes long, this one is {}", name.get_ref().len()),
            );
            d.label = "too long".into();
            d.help = Some(format!(
                "each step's logs go in a directory named after it, and a file name holds at most 255 bytes; \
                 choose a name of at most {MAX_STEP_NAME} bytes"
            ));
        }
        // A step whose command is wrong (`None`) is still checked field by field, so that every
        // error in the file is reported at once; it is left out of the flow at the end.
        let mut command = match (&raw.run, &raw.shell) {
            (Some(run), None) => {
                if run.get_ref().first().is_none_or(|p| p.get_ref().is_empty()) {
                    self.error(run.span(), "`run` needs at least a program name").help =
                        Some("write `run = [\"program\", \"arg\"]`".into());
                }
                let script = shell_script(run.get_ref());
                for (i, arg) in run.get_ref().iter().enumerate() {
                    self.passable(arg, "a program or argument");
                    if Some(i) != script {
                        self.shell_variable(arg, ListOf::Step);
                    }
                }
                // The arguments, moved out of `raw.run` once its program has been searched.
                Some(Command::Run(Vec::new()))
            }
            (None, Some(shell)) => {
                self.blank_shell(
                    shell.span(),
                    shell.get_ref(),
                    "`shell`",
                    "write `shell = \"command arg\"` or `run = [\"program\", \"arg\"]`",
                );
                self.passable(shell, "a shell command");
                Some(Command::Shell(shell.get_ref().clone()))
            }
            (Some(run), Some(shell)) => {
                // Each is checked as it would be alone: what else is wrong in them is said now.
                for arg in run.get_ref() {
                    self.passable(arg, "a program or argument");
                }
                self.passable(shell, "a shell command");
                let d = self.error(run.span(), "a step takes exactly one of `run` and `shell`, not both");
                d.label = "remove this or `shell`".into();
                d.help = Some("`run` starts the program directly; `shell` runs a command line with /bin/sh -c".into());
                None
            }
            // What is wrong with them was said where their keys were read.
            (None, None) if raw.bad.iter().any(|k| ["run", "shell"].contains(k)) => None,
            (None, None) => {
                let step = self.key(span.start);
                let d = match name {
                    Some(name) => {
                        Diagnostic::error(name.span(), format!("{step}step `{}` has nothing to run", name.get_ref()))
                    }
                    None => Diagnostic::error(header(), format!("{step}the step has nothing to run")),
                };
                let d = d
                    .label("neither `run` nor `shell`")
                    .help(Some("add `run = [\"program\", \"arg\"]` or `shell = \"command\"`".into()));
                self.diags.push(d);
                None
            }
        };
        // The field alone: `raw.run` is moved from below.
        let more = super::raw::RawStepMore::of(&raw.more);
        let timeout = match &more.timeout {
            Some(t) => self.duration(t, false),
            None => defaults.timeout,
        };
        let (retry, retry_name) = match &more.retry {
            Some(r) => self.retry(r, policies, classes).unwrap_or_else(|| (Arc::clone(&defaults.run_once), None)),
            None => defaults.retry.clone().unwrap_or_else(|| (Arc::clone(&defaults.run_once), None)),
        };
        let exit_codes = self.exit_codes(&more.exit_codes, classes);
        let env = self.env(&more.env);
        let workdir = match &more.workdir {
            Some(w) if w.get_ref().is_empty() => {
                let d = self.error(w.span(), "the working directory is empty");
                d.label = "no path".into();
                d.help = Some(
                    "write a directory, relative to the flow file's directory (`workdir = \"build\"`), or remove \
                     the key to run in the flow file's directory"
                        .into(),
                );
                dir.clone()
            }
            Some(w) => {
                self.no_nul(w, "a working directory");
                let workdir: Arc<Path> = dir.join(w.get_ref()).into();
                // Where programs are searched, so is the directory they are started in.
                if self.search.is_some() && !w.get_ref().contains('\0') {
                    self.workdir_exists(w, &workdir);
                }
                workdir
            }
            // Shared by the steps that run there, not a copy each.
            None => dir.clone(),
        };
        // The step's `run`, its catch handlers' and its compensation's programs are all started
        // with the step's environment in its working directory.
        let programs = raw
            .run
            .iter()
            .filter(|_| command.is_some())
            .chain(more.catch.iter().filter_map(|h| h.get_ref().run.as_ref()))
            .filter_map(|run| run.get_ref().first())
            .chain(more.compensate.as_ref().and_then(|c| match c.get_ref() {
                RawCommand::Run(argv) => argv.first(),
                RawCommand::Shell(_) => None,
            }));
        // Words for a warning (see `program_at_path`): made only where programs are searched.
        // Borrowed where it is the same for every step: one allocation per step, for a warning
        // almost never given, was about a tenth of validating a 10,000-step flow.
        let base: std::borrow::Cow<'static, str> = match &more.workdir {
            _ if self.search.is_none() => "".into(),
            Some(w) => format!("the step's `workdir`, `{}`", w.get_ref()).into(),
            None => "the flow file's directory, the step's working directory".into(),
        };
        for program in programs {
            self.search_program(program, env.get("PATH"), (&workdir, &base), "step's");
        }
        if let (Some(Command::Run(argv)), Some(run)) = (&mut command, &mut raw.run) {
            *argv = run.get_mut().iter_mut().map(|a| std::mem::take(a.get_mut())).collect();
        }
        let kill_signal = more.kill_signal.as_ref().and_then(|s| self.signal(s)).unwrap_or(defaults.kill_signal);
        let kill_grace = match &more.kill_grace {
            Some(g) => self.duration(g, true).unwrap_or(DEFAULT_KILL_GRACE),
            None => defaults.kill_grace,
        };
        let detect_tracebacks = match &more.detect_errors {
            Some(d) => self.detect(d).unwrap_or(true),
            None => defaults.detect,
        };
        let catch = more.catch.iter().filter_map(|h| self.handler(h, classes)).collect();
        let compensate = more.compensate.as_ref().and_then(|c| self.command(c));
        let command = command?;
        name?;
        Some(Step {
            // Moved out of `raw` once `needs` has read every step's name.
            name: String::new(),
            span,
            // Set by `needs` once every step is known.
            needs: Needs::default(),
            needs_explicit: false,
            command,
            timeout,
            retry,
            retry_name,
            exit_codes,
            env,
            workdir,
            kill_signal,
            kill_grace,
            detect_tracebacks,
            catch,
            compensate,
        })
    }
}

/// `[defaults]`, validated once and applied to every step that does not set its own value.
struct Defaults {
    timeout: Option<Duration>,
    retry: Option<(Arc<RetryPolicy>, Option<String>)>,
    /// The policy of a step without one, shared.
    run_once: Arc<RetryPolicy>,
    kill_signal: Signal,
    kill_grace: Duration,
    detect: bool,
}

impl Defaults {
    fn new(
        v: &mut Validator<'_>,
        raw: Option<&RawDefaults>,
        policies: &BTreeMap<String, Arc<RetryPolicy>>,
        classes: &ClassTree,
    ) -> Defaults {
        let mut d = Defaults {
            timeout: None,
            retry: None,
            run_once: Arc::new(RetryPolicy::run_once()),
            kill_signal: Signal(nix::sys::signal::Signal::SIGTERM),
            kill_grace: DEFAULT_KILL_GRACE,
            detect: true,
        };
        let Some(raw) = raw else { return d };
        d.timeout = raw.timeout.as_ref().and_then(|t| v.duration(t, false));
        d.retry = raw.retry.as_ref().and_then(|r| v.retry(r, policies, classes));
        if let Some(s) = raw.kill_signal.as_ref().and_then(|s| v.signal(s)) {
            d.kill_signal = s;
        }
        if let Some(g) = raw.kill_grace.as_ref().and_then(|g| v.duration(g, true)) {
            d.kill_grace = g;
        }
        if let Some(det) = raw.detect_errors.as_ref().and_then(|s| v.detect(s)) {
            d.detect = det;
        }
        d
    }
}

#[cfg(test)]
mod shell_script_tests {
    use super::*;

    fn run(args: &[&str]) -> Vec<Str> {
        args.iter().map(|a| Str::new(0..0, (*a).to_owned())).collect()
    }

    /// The script's index as sh, dash and bash take it: after the options, which `--` or a lone
    /// `-` end (`sh -c - 'echo $X'` runs `echo $X`), and whose `-o NAME`, `--rcfile FILE` and
    /// `--init-file FILE` take the next argument; none without `c` among them.
    #[test]
    fn the_script_is_found_after_the_options_and_their_values() {
        assert_eq!(shell_script(&run(&["sh", "-c", "--", "$X"])), Some(3));
        assert_eq!(shell_script(&run(&["sh", "-c", "-", "$X"])), Some(3));
        assert_eq!(shell_script(&run(&["bash", "--rcfile", "/dev/null", "-c", "$X"])), Some(4));
        assert_eq!(shell_script(&run(&["bash", "-o", "pipefail", "-ec", "$X", "$0"])), Some(4));
        assert_eq!(shell_script(&run(&["sh", "-e", "$X"])), None);
        assert_eq!(shell_script(&run(&["sh", "--", "-c", "$X"])), None);
        assert_eq!(shell_script(&run(&["sh", "-c"])), None);
        assert_eq!(shell_script(&run(&["env", "sh", "-c", "$X"])), None);
    }
}
