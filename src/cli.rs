//! The command line, as clap types. Parsing only: the commands live in `commands/`.

use clap::{Args, Parser, Subcommand, ValueEnum, ValueHint};
use clap_complete::engine::ArgValueCompleter;
use std::path::PathBuf;

const AFTER_HELP: &str = "\
Examples:
  waymark run flow.toml              run a flow (or resume its interrupted run)
  waymark check flow.toml            validate a flow and print its plan
  waymark status                     show the newest run, step by step
  waymark logs RUN fetch             show the last attempt's output of step `fetch`

Exit status: 0 success, 1 the workflow failed, 2 invalid command line or flow file,
3 the flow is already running, 4 waymark's own failure (a runner that lost its lease
on a shared store too), 128+n stopped by signal n.";

#[derive(Debug, Parser)]
#[command(name = "waymark", version, about = "Run a TOML workflow of child processes with durable retries", after_help = AFTER_HELP)]
pub struct Cli {
    /// Where runs and logs are kept, for the commands that keep or read them (run, resume, history,
    /// status, logs, gc); the others ignore it, so an alias may always pass it. The same option
    /// after the command wins
    #[arg(long, value_name = "DIR", value_hint = ValueHint::DirPath, value_parser = any_path)]
    pub(crate) state_dir: Option<PathBuf>,
    /// Where runs are recorded, for the same commands as --state-dir; the others ignore it. The
    /// same option after the command wins
    #[arg(long, value_name = "URL", value_hint = ValueHint::Url)]
    pub(crate) store: Option<String>,
    /// The name of this runner's host, for the commands that take a flow's lease (run, resume,
    /// gc); the others ignore it. The same option after the command wins
    #[arg(long, value_name = "ID", value_hint = ValueHint::Other)]
    pub(crate) host_id: Option<String>,
    /// Color error messages and diagnostics: `auto` if stderr is a terminal and NO_COLOR is
    /// unset, `always` (even with NO_COLOR), or `never`
    #[arg(long, global = true, value_enum, value_name = "WHEN", default_value_t = ColorArg::Auto, hide_possible_values = true, display_order = 900)]
    pub(crate) color: ColorArg,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run a flow, resuming its interrupted run if there is one (and not older than its `resume_within`)
    #[command(
        after_help = "Examples:\n  waymark run flow.toml\n  waymark run --fresh flow.toml     abandon an unfinished run and start over\n  waymark run --wait flow.toml      wait for a runner of the same flow to finish first\n  waymark run --param date=2026-01-31 flow.toml\n  waymark run --max-parallel 2 flow.toml\n  waymark run --quiet flow.toml     for cron: silent unless the run fails\n  waymark run --output failed flow.toml   show only the output of attempts that fail\n  waymark run --json flow.toml | jq -c 'select(.event == \"attempt.finished\")'"
    )]
    Run {
        /// The flow file
        #[arg(value_hint = ValueHint::FilePath)]
        flow: PathBuf,
        /// Run at most N steps at once, instead of the flow's `max_parallel` (default 4)
        #[arg(value_hint = ValueHint::Other, long, value_name = "N", allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..=i64::from(crate::flow::validate::MAX_PARALLEL)))]
        max_parallel: Option<u32>,
        /// Set a parameter declared in the flow's `[params]`; repeat for each one
        #[arg(value_hint = ValueHint::Other, long = "param", value_name = "NAME=VALUE")]
        params: Vec<String>,
        /// Abandon an unfinished run of this flow and start a new one
        #[arg(long)]
        fresh: bool,
        /// Wait for another runner of the same flow instead of exiting with status 3
        #[arg(long)]
        wait: bool,
        /// Treat every warning about the flow file as an error: report them and exit 2, running nothing
        #[arg(long)]
        strict: bool,
        #[command(flatten)]
        show: ShowArgs,
        #[command(flatten)]
        state: StateDirArg,
        #[command(flatten)]
        store: StoreArg,
        #[command(flatten)]
        host: HostIdArg,
    },
    /// Resume a given run, including a failed one (its failed step gets a fresh attempt budget)
    #[command(after_help = "Examples:\n  waymark resume 4k2m9xq1\n  waymark history               find run ids")]
    Resume {
        /// The run's id, as `waymark history` shows it
        #[arg(value_name = "RUN_ID", add = ArgValueCompleter::new(crate::commands::complete::run_ids))]
        run_id: String,
        /// Wait for another runner of the same flow instead of exiting with status 3
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        show: ShowArgs,
        #[command(flatten)]
        state: StateDirArg,
        #[command(flatten)]
        store: StoreArg,
        #[command(flatten)]
        host: HostIdArg,
    },
    /// Validate a flow file and print its plan; runs nothing
    #[command(
        after_help = "Examples:\n  waymark check flow.toml && echo valid\n  waymark check --strict flow.toml   warnings fail too (for CI)"
    )]
    Check {
        /// The flow file
        #[arg(value_hint = ValueHint::FilePath)]
        flow: PathBuf,
        /// Treat every warning about the flow file as an error: report them and exit 2
        #[arg(long)]
        strict: bool,
        /// Also print, for each step, when each attempt may start, which errors retry and which
        /// do not, and the longest the step can take
        #[arg(long)]
        explain: bool,
    },
    /// Print the step graph (each step's needs, and its retry policy) as Graphviz DOT or Mermaid
    #[command(
        after_help = "Examples:\n  waymark graph flow.toml | dot -Tsvg > flow.svg\n  waymark graph --format mermaid flow.toml"
    )]
    Graph {
        /// The flow file
        #[arg(value_hint = ValueHint::FilePath)]
        flow: PathBuf,
        /// The output format: `dot` for Graphviz, `mermaid` for Markdown that renders it
        #[arg(long, value_enum, default_value_t = GraphFormat::Dot)]
        format: GraphFormat,
    },
    /// List runs, newest first
    #[command(
        after_help = "Examples:\n  waymark history\n  waymark history nightly --limit 5\n  waymark history /srv/app1/nightly.toml\n  waymark history --json | jq '.[0].status'"
    )]
    History {
        /// Only runs of this flow: its file's path, or its name (a name that several flows have
        /// is refused with the list of them)
        #[arg(value_name = "FLOW", value_hint = ValueHint::FilePath)]
        flow: Option<String>,
        /// How many runs to show
        #[arg(value_hint = ValueHint::Other, long, default_value_t = 20, allow_negative_numbers = true, value_parser = count)]
        limit: usize,
        /// Print a JSON array
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        state: StateDirArg,
        #[command(flatten)]
        store: StoreArg,
    },
    /// Show a run step by step: state, attempts, last error, next retry
    #[command(
        after_help = "Examples:\n  waymark status                the newest run\n  waymark status nightly        the newest run of flow `nightly`\n  waymark status app1/nightly.toml\n  waymark status 4k2m9xq1 --json\n  waymark status 4k2m9xq1 --attempts   every attempt of every step"
    )]
    Status {
        /// A run id, or a flow file's path or a flow name for the flow's newest run [default: the
        /// newest run of all]
        #[arg(value_name = "RUN", value_hint = ValueHint::FilePath, add = ArgValueCompleter::new(crate::commands::complete::runs_and_files))]
        target: Option<String>,
        /// Print JSON
        #[arg(long)]
        json: bool,
        /// List every attempt of each step (when it started, how long it took, how it ended), with
        /// --json too
        #[arg(long)]
        attempts: bool,
        #[command(flatten)]
        state: StateDirArg,
        #[command(flatten)]
        store: StoreArg,
    },
    /// Print the output an attempt of a step wrote
    #[command(
        after_help = "Examples:\n  waymark logs 4k2m9xq1 fetch\n  waymark logs 4k2m9xq1 fetch --attempt 2 --stream stderr\n  waymark logs nightly.toml fetch    the newest run of the flow"
    )]
    Logs {
        /// A run id, or a flow file's path or a flow name for the flow's newest run
        #[arg(value_name = "RUN", value_hint = ValueHint::FilePath, add = ArgValueCompleter::new(crate::commands::complete::runs_and_files))]
        target: String,
        /// The step's name, as `waymark status RUN` lists it
        #[arg(value_name = "STEP", value_hint = ValueHint::Other, add = ArgValueCompleter::new(crate::commands::complete::steps))]
        step: String,
        /// Which attempt, from 1 [default: the last one]
        #[arg(value_hint = ValueHint::Other, long, allow_negative_numbers = true, value_parser = attempt_number)]
        attempt: Option<u32>,
        /// Only this stream [default: both]
        #[arg(long, value_enum)]
        stream: Option<StreamArg>,
        #[command(flatten)]
        state: StateDirArg,
        #[command(flatten)]
        store: StoreArg,
    },
    /// Delete finished runs (succeeded, failed, abandoned) and their logs
    #[command(
        after_help = "Examples:\n  waymark gc --older-than 30d\n  waymark gc --older-than '2w 3d'\n  waymark gc --older-than 0          every finished run"
    )]
    Gc {
        /// Delete the runs that ended longer ago than this: seconds (`3600`, `0.5`) or a duration
        /// such as `30d`, `12h`, `1h 30m`, as in flow files
        // A negative duration given as its own argument (`-1`, `-7d`) is joined to the option
        // before clap reads it (`args`), to be refused as a negative age, not as an unknown
        // option; any other value that starts with `-` is an option, as everywhere.
        #[arg(value_hint = ValueHint::Other, long, value_parser = age, value_name = "DURATION")]
        older_than: std::time::Duration,
        #[command(flatten)]
        state: StateDirArg,
        #[command(flatten)]
        store: StoreArg,
        #[command(flatten)]
        host: HostIdArg,
    },
    /// Print the error class tree that retry filters match against
    #[command(
        after_help = "Examples:\n  waymark errors\n  waymark errors --flow flow.toml     include the flow's [errors]"
    )]
    Errors {
        /// Include this flow file's own classes
        #[arg(long, value_name = "FLOW", value_hint = ValueHint::FilePath)]
        flow: Option<PathBuf>,
    },
    /// Print a shell completion script
    #[command(
        after_help = "Examples:\n  waymark completions bash > ~/.local/share/bash-completion/completions/waymark\n  waymark completions zsh > ~/.zfunc/_waymark\n  waymark completions fish > ~/.config/fish/completions/waymark.fish"
    )]
    Completions {
        /// The shell to write the script for
        #[arg(value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
    /// Print waymark's manual page (roff), or one command's
    #[command(
        after_help = "Examples:\n  waymark man | man -l -\n  waymark man run | man -l -\n  waymark man > ~/.local/share/man/man1/waymark.1"
    )]
    Man {
        /// The command whose page to print (`waymark-COMMAND(1)`) [default: the page of waymark]
        #[arg(value_name = "COMMAND", value_parser = clap::builder::PossibleValuesParser::new(COMMANDS))]
        command: Option<String>,
    },
}

/// The commands, for `waymark man COMMAND` (a test keeps the list whole).
pub(crate) const COMMANDS: [&str; 11] =
    ["run", "resume", "check", "graph", "history", "status", "logs", "gc", "errors", "completions", "man"];

/// What `run` and `resume` show.
#[derive(Debug, Args)]
pub(crate) struct ShowArgs {
    /// Print nothing if the run succeeds; if it fails, only the failure report, on stderr (for
    /// cron). The steps' output is kept in the log files
    #[arg(long, short, conflicts_with = "json")]
    quiet: bool,
    /// Print one JSON object per event on stdout (JSON Lines; the schema is in README.md); the
    /// steps' output goes only to the log files
    #[arg(long)]
    json: bool,
    /// How the run is shown on a terminal: `live` draws a line per running step (attempt, time
    /// left, retry countdown) and a done/total bar; `plain` prints one line per event; `auto` is
    /// `live` when stderr is a terminal and TERM is not `dumb`. `--json` and `--quiet` win over it
    #[arg(long, value_enum, value_name = "WHEN", default_value_t = ProgressArg::Auto)]
    progress: ProgressArg,
    /// Whose output to show as it comes: `all` (every line, behind its step's name), `failed`
    /// (an attempt's lines only if it fails, when it ends), or `none`; the log files keep all of
    /// it either way
    #[arg(long, value_enum, value_name = "WHOSE", default_value_t = OutputArg::All, hide_possible_values = true, conflicts_with_all = ["quiet", "json"])]
    output: OutputArg,
}

impl ShowArgs {
    pub(crate) fn mode(&self) -> crate::reporter::Mode {
        use std::io::IsTerminal;
        let live = match self.progress {
            ProgressArg::Live => true,
            ProgressArg::Plain => false,
            ProgressArg::Auto => {
                std::io::stderr().is_terminal() && std::env::var_os("TERM").is_none_or(|t| t != "dumb")
            }
        };
        let output = match self.output {
            OutputArg::All => crate::reporter::OutputMode::All,
            OutputArg::Failed => crate::reporter::OutputMode::Failed,
            OutputArg::None => crate::reporter::OutputMode::None,
        };
        crate::reporter::Mode::from_flags(self.quiet, self.json, live, output)
    }
}

/// `run --progress` and `resume --progress`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ProgressArg {
    // Described in the flag's help (a description here would turn `--help` into its long form).
    Auto,
    Live,
    Plain,
}

/// `--output` of `run` and `resume`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OutputArg {
    /// Every line of every attempt
    All,
    /// The lines of the attempts that fail
    Failed,
    /// No child output
    None,
}

/// `--state-dir`, on the commands that keep or read runs.
#[derive(Debug, Args)]
pub(crate) struct StateDirArg {
    /// Where runs and logs are kept [default: $WAYMARK_STATE_DIR, else $XDG_STATE_HOME/waymark,
    /// else ~/.local/state/waymark]
    #[arg(long = "state-dir", value_name = "DIR", value_hint = ValueHint::DirPath, value_parser = state_dir)]
    pub(crate) dir: Option<PathBuf>,
}

impl StateDirArg {
    /// The directory given after the command, else the one given before it.
    pub(crate) fn or<'a>(&'a self, before: Option<&'a std::path::Path>) -> Option<&'a std::path::Path> {
        self.dir.as_deref().or(before)
    }
}

/// `--store`, on the commands that keep or read runs.
#[derive(Debug, Args)]
pub(crate) struct StoreArg {
    /// Where runs are recorded: `sqlite:` (the state directory's database, the default),
    /// `sqlite:DIR`, or a PostgreSQL URL `postgres://USER:PASSWORD@HOST:PORT/DB` shared by several
    /// hosts [default: $WAYMARK_STORE, else `sqlite:`]
    #[arg(long = "store", value_name = "URL", value_hint = ValueHint::Url)]
    pub(crate) url: Option<String>,
}

/// `--host-id`, on the commands that take a flow's lease.
#[derive(Debug, Args)]
pub(crate) struct HostIdArg {
    /// The name of this runner's host in leases, attempts and messages [default: $WAYMARK_HOST_ID,
    /// else the host name]
    #[arg(long = "host-id", value_name = "ID", value_hint = ValueHint::Other)]
    pub(crate) id: Option<String>,
}

impl Command {
    /// `--state-dir` as given after the command (`None` where it takes none).
    pub(crate) fn state_dir_flag(&self) -> Option<&std::path::Path> {
        match self {
            Command::Run { state, .. }
            | Command::Resume { state, .. }
            | Command::History { state, .. }
            | Command::Status { state, .. }
            | Command::Logs { state, .. }
            | Command::Gc { state, .. } => state.dir.as_deref(),
            Command::Check { .. }
            | Command::Graph { .. }
            | Command::Errors { .. }
            | Command::Completions { .. }
            | Command::Man { .. } => None,
        }
    }

    /// `--store` and `--host-id` as given after the command (`None` each where it takes none);
    /// `None` for the commands that keep and read no runs.
    pub(crate) fn store_flags(&self) -> Option<(Option<&str>, Option<&str>)> {
        match self {
            Command::Run { store, host, .. }
            | Command::Resume { store, host, .. }
            | Command::Gc { store, host, .. } => Some((store.url.as_deref(), host.id.as_deref())),
            Command::History { store, .. } | Command::Status { store, .. } | Command::Logs { store, .. } => {
                Some((store.url.as_deref(), None))
            }
            Command::Check { .. }
            | Command::Graph { .. }
            | Command::Errors { .. }
            | Command::Completions { .. }
            | Command::Man { .. } => None,
        }
    }
}

/// Why an empty `--state-dir` (`--state-dir "$UNSET"`) is refused.
pub(crate) const EMPTY_STATE_DIR: &str = "an empty path is no directory: give the state directory, or leave the \
     option out for the default ($WAYMARK_STATE_DIR, else $XDG_STATE_HOME/waymark, else ~/.local/state/waymark)";

/// `--state-dir` after a command that keeps or reads runs: a directory's path, not an empty one.
fn state_dir(arg: &str) -> Result<PathBuf, String> {
    if arg.is_empty() {
        return Err(EMPTY_STATE_DIR.into());
    }
    Ok(PathBuf::from(arg))
}

/// `--state-dir` before the command: any path, an empty one too, which only a command that keeps or
/// reads runs refuses (the others ignore the option, so that an alias may always pass it).
fn any_path(arg: &str) -> Result<PathBuf, String> {
    Ok(PathBuf::from(arg))
}

/// `history --limit`: how many runs, in digits (Rust's parse would take `+5`).
fn count(arg: &str) -> Result<usize, String> {
    if arg.is_empty() || !arg.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("`{arg}` is not a count of runs: write a whole number, 1 or more"));
    }
    // 0 is `history`'s to refuse, saying why; more than it can count is every run there is.
    Ok(arg.parse::<usize>().unwrap_or(usize::MAX))
}

/// `logs --attempt`: an attempt's number, as `status --attempts` shows them, from 1.
fn attempt_number(arg: &str) -> Result<u32, String> {
    match arg.parse::<u32>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "`{arg}` is not an attempt's number: attempts are numbered from 1, as `waymark status RUN --attempts` \
             shows them"
        )),
    }
}

/// `gc --older-than`: a duration as flow files write one; 0 is every finished run.
fn age(arg: &str) -> Result<std::time::Duration, String> {
    crate::flow::duration::from_arg(arg, true)
}

/// The command line as clap is to read it: a negative duration given as `--older-than`'s own
/// argument (`--older-than -7d`, `--older-than -.5`) is joined to it (`--older-than=-7d`), so that
/// it reaches `age` and is refused as negative, as `--older-than=-7d` is, instead of being taken
/// for an unknown option `-7`. Only a `-` followed by a digit or a `.` is a negative duration:
/// anything else that starts with `-` stays the next option (`--older-than --state-dir DIR` and
/// `--older-than` alone still say the value is missing), and nothing after `--` is touched.
pub fn args(args: impl IntoIterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let mut out: Vec<std::ffi::OsString> = Vec::new();
    let mut args = args.into_iter().peekable();
    while let Some(arg) = args.next() {
        let negative = |next: &std::ffi::OsString| {
            let bytes = next.as_encoded_bytes();
            bytes.first() == Some(&b'-') && bytes.get(1).is_some_and(|c| c.is_ascii_digit() || *c == b'.')
        };
        match arg.to_str() {
            Some("--") => {
                out.push(arg);
                out.extend(args);
                break;
            }
            Some("--older-than") if args.peek().is_some_and(negative) => {
                let mut joined = std::ffi::OsString::from("--older-than=");
                joined.extend(args.next());
                out.push(joined);
            }
            _ => out.push(arg),
        }
    }
    out
}

/// The arguments to parse again when `waymark help` was given `-h` or `--help` (`waymark help
/// --help`, `waymark help run --help`), which clap's `help` command takes for the name of a
/// command: the help of `help` itself, or of the command named. `None` for any other error.
pub fn help_asked_of_help(args: &[std::ffi::OsString], error: &clap::Error) -> Option<Vec<std::ffi::OsString>> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let flag = |a: &std::ffi::OsString| a == "--help" || a == "-h";
    if error.kind() != ErrorKind::InvalidSubcommand {
        return None;
    }
    let Some(ContextValue::String(named)) = error.get(ContextKind::InvalidSubcommand) else { return None };
    if named != "--help" && named != "-h" {
        return None;
    }
    // The command word `help` is the last before the flag (an option's value may be `help` too).
    let flag_at = args.iter().position(flag)?;
    let help = args[..flag_at].iter().skip(1).rposition(|a| a == "help")? + 1;
    let mut again: Vec<std::ffi::OsString> = args[..=help].to_vec();
    again.extend(args[help + 1..].iter().filter(|a| !flag(a)).cloned());
    if again.len() == help + 1 {
        again.push("help".into());
    }
    Some(again)
}

/// A usage error for an option of the top level (`--state-dir`, `--store`, `--host-id`) given
/// after a command that does not take it (`waymark check --state-dir DIR`): what to say instead
/// of clap's words, whose tip (pass it after `--`, as a value) is wrong here.
pub fn misplaced_option(error: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if error.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let Some(ContextValue::String(arg)) = error.get(ContextKind::InvalidArg) else { return None };
    let option = arg.split('=').next().unwrap_or_default();
    let others = match option {
        "--state-dir" | "--store" => "keep or read no runs",
        "--host-id" => "take no lease",
        _ => return None,
    };
    // The command, as clap's usage line names it (`Usage: waymark check [OPTIONS] <FLOW>`).
    let Some(ContextValue::StyledStr(usage)) = error.get(ContextKind::Usage) else { return None };
    let usage = usage.to_string();
    let command = usage.split_whitespace().skip_while(|w| *w != "waymark").nth(1)?;
    let cli = <Cli as clap::CommandFactory>::command();
    cli.find_subcommand(command)?;
    // The commands that take it, as their definitions say.
    let long = option.trim_start_matches('-');
    let taking: Vec<&str> = cli
        .get_subcommands()
        .filter(|c| c.get_arguments().any(|a| a.get_long() == Some(long)))
        .map(clap::Command::get_name)
        .collect();
    let takes = match taking.split_last() {
        Some((last, [])) => (*last).to_owned(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        None => return None,
    };
    Some(format!(
        "`waymark {command}` takes no `{option}`: only {takes} do; before the command (`waymark {option} ... \
         {command}`) every command takes it, and those that {others} ignore it"
    ))
}

/// `graph --format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum GraphFormat {
    /// Graphviz DOT (`dot -Tsvg`)
    Dot,
    /// A Mermaid flowchart
    Mermaid,
}

/// `--color`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ColorArg {
    Auto,
    Always,
    Never,
}

impl ColorArg {
    /// Whether to color what goes to a stream: an explicit `always` or `never` wins over
    /// NO_COLOR; `auto` colors when NO_COLOR is unset or empty and the stream is a terminal.
    pub fn colors(self, is_terminal: bool) -> bool {
        match self {
            ColorArg::Always => true,
            ColorArg::Never => false,
            ColorArg::Auto => std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()) && is_terminal,
        }
    }

    /// The choice the command line makes, read before clap parses it (so that clap's own help and
    /// errors follow it too): the last `--color WHEN` or `--color=WHEN` before a `--`; `auto` when
    /// there is none or it is not a known value (clap then reports it).
    pub fn from_args(args: impl IntoIterator<Item = std::ffi::OsString>) -> ColorArg {
        let mut choice = ColorArg::Auto;
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            let value = match arg.to_str() {
                Some("--") => break,
                Some("--color") => args.next(),
                Some(a) => match a.strip_prefix("--color=") {
                    Some(v) => Some(v.into()),
                    None => continue,
                },
                None => continue,
            };
            if let Some(parsed) =
                value.as_ref().and_then(|v| v.to_str()).and_then(|v| ColorArg::from_str(v, false).ok())
            {
                choice = parsed;
            }
        }
        choice
    }

    /// The same choice, for clap.
    pub fn clap(self) -> clap::ColorChoice {
        match self {
            ColorArg::Auto => clap::ColorChoice::Auto,
            ColorArg::Always => clap::ColorChoice::Always,
            ColorArg::Never => clap::ColorChoice::Never,
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum StreamArg {
    Stdout,
    Stderr,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn color_is_read_before_parsing() {
        let read = |args: &[&str]| ColorArg::from_args(args.iter().map(std::ffi::OsString::from));
        assert_eq!(read(&["waymark", "check", "f.toml"]), ColorArg::Auto);
        assert_eq!(read(&["waymark", "--color", "never", "check"]), ColorArg::Never);
        assert_eq!(read(&["waymark", "check", "--color=always", "f.toml"]), ColorArg::Always);
        assert_eq!(read(&["waymark", "--color=never", "--color", "always"]), ColorArg::Always, "the last one");
        assert_eq!(read(&["waymark", "--color", "sometimes"]), ColorArg::Auto);
        assert_eq!(read(&["waymark", "--", "--color", "never"]), ColorArg::Auto);
    }

    #[test]
    fn color_is_the_last_option_of_every_help_before_help_and_version() {
        let mut cmd = <Cli as clap::CommandFactory>::command();
        cmd.build();
        for sub in std::iter::once(&cmd).chain(cmd.get_subcommands()).filter(|c| c.get_name() != "help") {
            let help = sub.clone().render_help().to_string();
            let options: Vec<&str> = help
                .lines()
                .filter(|l| l.trim_start().starts_with('-'))
                .filter_map(|l| l.split_whitespace().find(|w| w.starts_with("--")))
                .filter(|o| !matches!(*o, "--help" | "--version"))
                .collect();
            assert_eq!(options.last(), Some(&"--color"), "`waymark {}` --help:\n{help}", sub.get_name());
        }
    }

    #[test]
    fn a_negative_age_is_joined_to_older_than_and_nothing_else_is() {
        let read = |args: &[&str]| -> Vec<String> {
            super::args(args.iter().map(std::ffi::OsString::from))
                .into_iter()
                .map(|a| a.into_string().unwrap())
                .collect()
        };
        assert_eq!(read(&["waymark", "gc", "--older-than", "-7d"]), ["waymark", "gc", "--older-than=-7d"]);
        assert_eq!(
            read(&["waymark", "gc", "--older-than", "-.5", "--state-dir", "d"]),
            ["waymark", "gc", "--older-than=-.5", "--state-dir", "d"]
        );
        for kept in [
            &["waymark", "gc", "--older-than", "7d"][..],
            &["waymark", "gc", "--older-than"],
            &["waymark", "gc", "--older-than", "--state-dir", "d"],
            &["waymark", "gc", "--older-than", "-h"],
            &["waymark", "gc", "--older-than", "-"],
            &["waymark", "gc", "--older-than=-7d"],
            &["waymark", "gc", "--", "--older-than", "-7d"],
        ] {
            assert_eq!(read(kept), kept, "{kept:?}");
        }
    }

    #[test]
    fn every_command_has_its_man_page_name() {
        let cmd = <Cli as clap::CommandFactory>::command();
        let names: Vec<&str> = cmd.get_subcommands().map(|c| c.get_name()).collect();
        assert_eq!(names, COMMANDS, "add the new command to `COMMANDS` in src/cli.rs");
    }
}
