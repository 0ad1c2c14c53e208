//! One module per subcommand. Each returns the process exit status or a [`CliError`], which
//! `main` prints and maps to its documented exit status.

mod check;
pub mod complete;
mod docs;
mod errors;
mod graph;
mod inspect;
mod output;
mod run;

use crate::cli::{Cli, ColorArg, Command};
use crate::flow::LoadError;
use crate::store::lease::{LeaseTiming, host_id};
use crate::store::lock::{FlowLock, LockError};
use crate::store::postgres::{FlowLease, Leased, PgStore, lease_key};
use crate::store::url::StoreUrl;
use crate::store::{FlowKey, SqliteStore, StateDir, Store, StoreError, statedir};
use std::io::IsTerminal;
use std::path::PathBuf;

pub(crate) const EXIT_OK: i32 = 0;
pub(crate) const EXIT_FAILED: i32 = 1;
pub(crate) const EXIT_USAGE: i32 = 2;
pub(crate) const EXIT_RUNNING: i32 = 3;
pub(crate) const EXIT_INTERNAL: i32 = 4;

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The flow file is invalid; its diagnostics are already rendered. With a hint after them
    /// (what still works: `waymark resume` of an unfinished run of the file).
    #[error("{0}")]
    Flow(Box<LoadError>, Option<String>),
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Locked(LockError),
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
    /// Stdout is a pipe whose reader has gone: the command ends quietly.
    #[error("standard output was closed")]
    StdoutClosed,
}

impl CliError {
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::StdoutClosed => EXIT_OK,
            CliError::Flow(..) | CliError::Usage(_) => EXIT_USAGE,
            CliError::Locked(LockError::Held { .. }) => EXIT_RUNNING,
            CliError::Locked(_) | CliError::Internal(_) => EXIT_INTERNAL,
        }
    }

    /// Say it on stderr, as every command ends with its error; its exit status. A closed or full
    /// stderr leaves nothing to tell: the exit status still does.
    pub fn tell(&self) -> i32 {
        let _ = std::io::Write::write_all(&mut std::io::stderr(), self.render().as_bytes());
        self.exit_code()
    }

    /// The message for stderr, its `error:` and `hint:` colored as the flow's diagnostics are
    /// when stderr is (see [`stderr_color`]).
    pub fn render(&self) -> String {
        let text = self.text();
        if !stderr_color() {
            return text;
        }
        let mut out = String::with_capacity(text.len() + 64);
        for line in text.split_inclusive('\n') {
            let styled = [
                ("error: ", "\x1b[1m\x1b[91merror\x1b[0m\x1b[1m:\x1b[0m "),
                ("hint: ", "\x1b[1m\x1b[96mhint\x1b[0m\x1b[1m:\x1b[0m "),
            ]
            .into_iter()
            .find_map(|(plain, styled)| line.strip_prefix(plain).map(|rest| (styled, rest)));
            match styled {
                Some((prefix, rest)) => {
                    out.push_str(prefix);
                    out.push_str(rest);
                }
                None => out.push_str(line),
            }
        }
        out
    }

    /// The message for stderr, without color.
    fn text(&self) -> String {
        match self {
            CliError::StdoutClosed => String::new(),
            CliError::Flow(e, hint) => {
                let mut text = e.render(stderr_color());
                if let Some(hint) = hint {
                    text.push_str(&format!("hint: {hint}\n"));
                }
                text
            }
            CliError::Locked(e @ LockError::Held { .. }) => {
                // Said by `run` and `resume` alike: both wait with `--wait`.
                format!("error: {e}\nhint: give the same command `--wait` to wait for it, or see `waymark status`\n")
            }
            CliError::Internal(e) => {
                let mut text = format!("error: {e:#}\n");
                // A store failure says what to do about it, from its kind.
                if let Some(hint) = e.chain().find_map(|c| c.downcast_ref::<StoreError>()).and_then(StoreError::hint) {
                    text.push_str(&format!("hint: {hint}\n"));
                }
                text
            }
            other => format!("error: {other}\n"),
        }
    }
}

impl From<LoadError> for CliError {
    fn from(e: LoadError) -> Self {
        match e {
            LoadError::Read { .. } => CliError::Usage(e.to_string()),
            invalid => CliError::Flow(Box::new(invalid), None),
        }
    }
}

impl From<StoreError> for CliError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NoSuchRun(_) => CliError::Usage(format!("{e}; `waymark history` lists the runs")),
            e => CliError::Internal(anyhow::Error::new(e)),
        }
    }
}

/// That run `run_id` is not in the store: where it was looked for (the state directory, or the
/// shared store), and the command that lists the runs there.
fn no_such_run(run_id: &str, state: &StateDir) -> CliError {
    not_found(&format!("no run with id `{run_id}`"), state)
}

/// That `what` (`no run with id `X``) is not in the store: `what` with where it was looked for
/// (the state directory, or the shared store), and the command that lists the runs there, or that
/// the state directory does not exist or is not one (so nothing was ever recorded there).
fn not_found(what: &str, state: &StateDir) -> CliError {
    CliError::Usage(no_runs(what, None, true, state))
}

/// That there are no runs (`what`: `there are no runs yet`, `no runs of the flow file F`) where
/// the command looked: `what` with the place, then `then` (what starts one, if anything, with
/// [`AGAIN`] where the options that reach the same store go), the
/// command that lists the runs kept there if `listing` (and there can be some), and how to look
/// elsewhere.
fn no_runs(what: &str, then: Option<&str>, listing: bool, state: &StateDir) -> String {
    let looked = Looked::at(state);
    let mut next: Vec<String> = then.map(|then| then.replace(AGAIN, &looked.again)).into_iter().collect();
    match looked.listing.filter(|_| listing) {
        // It says how to look elsewhere, or names the directory again.
        Some(listing) => next.push(listing),
        None => next.push(looked.elsewhere),
    }
    format!("{what}{}; {}", looked.place, next.join(", "))
}

/// In a command that [`no_runs`] suggests, where the options that reach the same store go.
pub(super) const AGAIN: &str = "{again}";

/// Where a command that reads runs looked for them, as its messages say it.
struct Looked {
    /// Appended to what was not found: ` in the state directory D`, ` in the store URL (chosen by
    /// WAYMARK_STORE)`, or `: the state directory D does not exist, so ...`.
    place: String,
    /// The command that lists the runs kept there; `None` where none can be (no directory, or no
    /// database in it).
    listing: Option<String>,
    /// How to look in another place, naming the option or variable that chose this one.
    elsewhere: String,
    /// What a command needs to reach the same place (` --state-dir D`), when its defaults and
    /// the environment would not: a command it suggests names it.
    again: String,
}

impl Looked {
    fn at(state: &StateDir) -> Looked {
        let chosen_by = CHOSEN_BY.get().copied().flatten();
        let by = chosen_by.map(|v| format!(" (chosen by {v})")).unwrap_or_default();
        let dir = state.root().display();
        let elsewhere = match chosen_by {
            Some(_) => "`--state-dir DIR` looks in another".to_owned(),
            None => "`--state-dir DIR` (or WAYMARK_STATE_DIR) looks in another".to_owned(),
        };
        let elsewhere_store = match chosen_by {
            Some("WAYMARK_STORE") => "`--store URL` (or WAYMARK_STORE) looks in another".to_owned(),
            _ => "`--store URL` looks in another".to_owned(),
        };
        // The same store needs the option again where an option chose it: a state directory other
        // than the environment's (or the default), or a store URL given as `--store`.
        let dir_again = || {
            let by_default = match chosen_by {
                Some(v) => v == "WAYMARK_STORE",
                // As the state directory was resolved: a missing one cannot be canonicalized.
                None => configured_state_dir(None)
                    .ok()
                    .and_then(|d| std::fs::canonicalize(&d).or_else(|_| std::path::absolute(&d)).ok())
                    .is_some_and(|d| d == state.root()),
            };
            match by_default {
                true => String::new(),
                false => format!(" --state-dir {}", crate::flow::model::shell_word(&state.root().to_string_lossy())),
            }
        };
        let store_again = match chosen_by {
            Some("--store") => " --store URL".to_owned(),
            _ => String::new(),
        };
        match backend() {
            Backend::Postgres { shown, .. } if EMPTY_STORE.load(std::sync::atomic::Ordering::Relaxed) => Looked {
                place: format!(
                    " in the store {shown}{by}: it has no waymark tables, so no run was ever recorded there"
                ),
                listing: None,
                elsewhere: elsewhere_store,
                again: store_again,
            },
            Backend::Postgres { shown, .. } => Looked {
                place: format!(" in the store {shown}{by}"),
                // `waymark history` alone reads the store the environment names, if any.
                listing: Some(match chosen_by {
                    Some("--store") => {
                        "`waymark history --store URL`, with the same URL, lists the runs kept there".into()
                    }
                    _ => "`waymark history` lists the runs kept there".into(),
                }),
                elsewhere: elsewhere_store,
                again: store_again,
            },
            Backend::Sqlite if !state.exists() => Looked {
                place: format!(": the state directory {dir}{by} does not exist, so no run was ever recorded there"),
                listing: None,
                elsewhere,
                again: dir_again(),
            },
            Backend::Sqlite if !state.has_database() => Looked {
                place: format!(
                    ": {dir}{by} is not a state directory (it holds no waymark.db), so no run was ever recorded there"
                ),
                listing: None,
                elsewhere,
                again: dir_again(),
            },
            Backend::Sqlite => {
                // `waymark history` alone reads the directory that the environment names (or the
                // default one); a directory given by an option needs it again.
                let again = dir_again();
                let listing = match again.is_empty() {
                    true => {
                        "`waymark history` lists the runs kept there, `--state-dir DIR` looks in another".to_owned()
                    }
                    false => format!("`waymark history{again}` lists the runs kept there"),
                };
                Looked { place: format!(" in the state directory {dir}{by}"), listing: Some(listing), elsewhere, again }
            }
        }
    }
}

/// Which store URL chose where the commands look, for their messages: `--store` or
/// `WAYMARK_STORE` when one names a PostgreSQL store, or a SQLite state directory (`sqlite:DIR`)
/// that no `--state-dir` overrides; `None` when the state directory was chosen as usual. Set once,
/// by [`dispatch`].
static CHOSEN_BY: std::sync::OnceLock<Option<&'static str>> = std::sync::OnceLock::new();

/// The state directory, absolute (children get paths inside it), as configured.
fn configured_state_dir(cli_flag: Option<&std::path::Path>) -> Result<PathBuf, CliError> {
    let dir = crate::store::state_dir(cli_flag).ok_or_else(|| {
        CliError::Usage("cannot tell where to keep state: set --state-dir, WAYMARK_STATE_DIR or HOME".into())
    })?;
    std::path::absolute(&dir)
        .map_err(|e| CliError::Usage(format!("cannot resolve the state directory {}: {e}", dir.display())))
}

/// The state directory for commands that only look: checked (ours, writable by no one else, no
/// symlinked entries) if it exists, never created.
fn find_state_dir(cli_flag: Option<&std::path::Path>) -> Result<StateDir, CliError> {
    let dir = configured_state_dir(cli_flag)?;
    StateDir::find(&dir).map_err(|e| CliError::Internal(anyhow::anyhow!(elsewhere(e.to_string()))))
}

/// A message about the state directory that says to choose another "with --state-dir or
/// WAYMARK_STATE_DIR", corrected where a `sqlite:DIR` store URL chose it: WAYMARK_STATE_DIR does
/// not apply then.
fn elsewhere(message: String) -> String {
    const USUAL: &str = "--state-dir or WAYMARK_STATE_DIR";
    // A PostgreSQL store's URL chooses no state directory: the usual advice stands there.
    match CHOSEN_BY.get().copied().flatten().filter(|_| matches!(backend(), Backend::Sqlite)) {
        Some(by) if message.contains(USUAL) => {
            message.replace(USUAL, &format!("--state-dir (or another `sqlite:DIR` in {by})"))
        }
        _ => message,
    }
}

/// The state directory, created with mode 0700 if missing, checked, and resolved: no component of
/// the returned path is a symlink.
fn state_dir(cli_flag: Option<&std::path::Path>) -> Result<StateDir, CliError> {
    create_state_dir(&configured_state_dir(cli_flag)?)
}

/// The state directory `dir` (absolute), created with mode 0700 if missing, checked, and
/// resolved ([`state_dir`]).
fn create_state_dir(dir: &std::path::Path) -> Result<StateDir, CliError> {
    match statedir::prepare(dir, true) {
        Ok(Some(resolved)) => Ok(resolved),
        Ok(None) => Err(CliError::Internal(anyhow::anyhow!(
            "the state directory {} vanished as it was created; run again, or choose another with --state-dir",
            dir.display()
        ))),
        // `mkdir` of a path a file holds.
        Err(statedir::TrustError::Io { path, error, .. }) if error.kind() == std::io::ErrorKind::AlreadyExists => {
            Err(CliError::Internal(anyhow::anyhow!(elsewhere(format!(
                "cannot use {} as the state directory: something other than a directory (a file, a link) is at \
                 that path; choose another with --state-dir or WAYMARK_STATE_DIR",
                path.display()
            )))))
        }
        Err(statedir::TrustError::Io { path, error, .. }) => {
            Err(CliError::Internal(anyhow::anyhow!(elsewhere(format!(
                "cannot create the state directory {}: {error}; choose another with --state-dir or WAYMARK_STATE_DIR",
                path.display()
            )))))
        }
        Err(e) => Err(CliError::Internal(anyhow::anyhow!(elsewhere(e.to_string())))),
    }
}

/// The store the commands use (`--store`, `WAYMARK_STORE`), set once by [`dispatch`].
#[derive(Debug)]
enum Backend {
    /// The state directory's SQLite database; runners of a flow exclude each other by its lock file.
    Sqlite,
    /// A PostgreSQL database shared by hosts; runners exclude each other by leases in it.
    Postgres { config: Box<crate::store::url::PgConfig>, shown: String, timing: LeaseTiming },
}

static BACKEND: std::sync::OnceLock<Backend> = std::sync::OnceLock::new();

fn backend() -> &'static Backend {
    BACKEND.get_or_init(|| Backend::Sqlite)
}

/// Whether the store is shared by hosts (PostgreSQL).
fn shared_store() -> bool {
    matches!(backend(), Backend::Postgres { .. })
}

fn open_store(dir: &StateDir) -> Result<Box<dyn Store>, CliError> {
    match backend() {
        Backend::Sqlite => Ok(Box::new(SqliteStore::open(dir)?)),
        Backend::Postgres { config, shown, .. } => Ok(Box::new(PgStore::open(config, shown)?)),
    }
}

/// The shared store the commands look in was found without waymark's tables (by [`read_store`]
/// or [`open_recorded_store`]), for their messages.
static EMPTY_STORE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The store of [`open_store`], where a run was ever recorded: `None` for a state directory
/// without its database (missing, or not a state directory), or a shared database without
/// waymark's tables. The commands that change runs (`resume`, `gc`) create nothing there to find
/// none.
fn open_recorded_store(dir: &StateDir) -> Result<Option<Box<dyn Store>>, CliError> {
    match backend() {
        Backend::Sqlite if !dir.has_database() => Ok(None),
        Backend::Sqlite => Ok(Some(Box::new(SqliteStore::open(dir)?))),
        Backend::Postgres { config, shown, .. } => match PgStore::open_existing(config, shown)? {
            Some(store) => Ok(Some(Box::new(store))),
            None => {
                EMPTY_STORE.store(true, std::sync::atomic::Ordering::Relaxed);
                Ok(None)
            }
        },
    }
}

/// The store for commands that only look: never creates one.
fn read_store(dir: &StateDir) -> Result<Box<dyn Store>, CliError> {
    match backend() {
        Backend::Sqlite => Ok(Box::new(SqliteStore::open_for_reading(dir)?)),
        Backend::Postgres { config, shown, .. } => match PgStore::open_for_reading(config, shown)? {
            Some(store) => Ok(Box::new(store)),
            // Nothing recorded there yet: read as a store with no runs, as a missing SQLite
            // database is, without creating waymark's tables.
            None => {
                EMPTY_STORE.store(true, std::sync::atomic::Ordering::Relaxed);
                Ok(Box::new(SqliteStore::empty(shown.into())?))
            }
        },
    }
}

/// What keeps one runner per flow while it is held: the flow's lock file (SQLite), or its lease
/// in the shared database, renewed while held.
enum FlowGuard {
    File(FlowLock),
    Lease(FlowLease),
}

impl FlowGuard {
    /// Take the guard of flow `key` (shown as `flow`) for `owner`, waiting for another runner if
    /// `wait`; `waiting` is told who holds it before the wait.
    fn acquire(
        state: &StateDir,
        key: &FlowKey,
        flow: &str,
        owner: &str,
        wait: bool,
        mut waiting: impl FnMut(&str),
    ) -> Result<FlowGuard, CliError> {
        let (config, shown, timing) = match backend() {
            Backend::Sqlite => {
                let lock = FlowLock::acquire(state, key, flow, wait, waiting).map_err(CliError::Locked)?;
                return Ok(FlowGuard::File(lock));
            }
            Backend::Postgres { config, shown, timing } => (config, shown, *timing),
        };
        let lease_key = lease_key(key, host_id());
        let mut said = false;
        // While waiting, the database last answered then: a restart or a failover that it is away
        // for less than a lease lasts is waited out, as the holder's writes wait it out (a holder
        // away longer has fenced itself off by then).
        let mut answered = std::time::Instant::now();
        let pause = || std::thread::sleep(timing.renew.min(std::time::Duration::from_secs(1)));
        loop {
            let taken = match FlowLease::try_take(config, shown, &lease_key, owner, timing) {
                Err(e)
                    if said
                        && e.kind() == Some(crate::store::StoreErrorKind::Unreachable)
                        && answered.elapsed() < timing.ttl =>
                {
                    pause();
                    continue;
                }
                taken => taken?,
            };
            match taken {
                Leased::Taken(lease) => return Ok(FlowGuard::Lease(lease)),
                Leased::Held(holder) if wait => {
                    if !said {
                        waiting(&holder);
                        said = true;
                    }
                    answered = std::time::Instant::now();
                    pause();
                }
                Leased::Held(holder) => {
                    return Err(CliError::Locked(LockError::Held { flow: flow.to_owned(), holder }));
                }
            }
        }
    }

    /// The flow's lock or lease for `waymark gc`, if nobody holds it; else whether another gc does.
    fn for_gc(state: &StateDir, key: &FlowKey, host: &str) -> Result<Result<FlowGuard, GcHeld>, CliError> {
        match backend() {
            Backend::Sqlite => Ok(match FlowLock::try_acquire_for_gc(state, key).map_err(CliError::Locked)? {
                Ok(lock) => Ok(FlowGuard::File(lock)),
                Err(holder) if crate::store::held_by_gc(&holder) => Err(GcHeld::ByGc),
                Err(_) => Err(GcHeld::ByRunner),
            }),
            Backend::Postgres { config, shown, timing } => {
                let gc = crate::store::postgres::GC_OWNER;
                // Unique to this take, as a runner's owner is (the store lets an owner take its own
                // lease again: two gcs of one host id and pid, in two containers, must not meet).
                let owner = format!("{gc}{}:{}:{:08x}", host_id(), std::process::id(), fastrand::u32(..));
                match FlowLease::try_take(config, shown, &lease_key(key, host), &owner, *timing)? {
                    Leased::Taken(lease) => Ok(Ok(FlowGuard::Lease(lease))),
                    Leased::Held(holder) if holder.starts_with(gc) => Ok(Err(GcHeld::ByGc)),
                    Leased::Held(_) => Ok(Err(GcHeld::ByRunner)),
                }
            }
        }
    }
}

/// Who holds a flow that `waymark gc` leaves alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum GcHeld {
    ByRunner,
    /// Another `waymark gc`, deleting the flow's runs itself.
    ByGc,
}

/// Choose the store and this runner's host id, from the command line and the environment.
/// The options after the command win over those before it; the commands that keep and read no
/// runs ignore both (and `WAYMARK_STORE` and `WAYMARK_HOST_ID`).
fn configure(cli: &Cli) -> Result<Option<PathBuf>, CliError> {
    let Some((store, host)) = cli.command.store_flags() else { return Ok(None) };
    crate::store::lease::set_host_id(host.or(cli.host_id.as_deref())).map_err(CliError::Usage)?;
    let flag = store.or(cli.store.as_deref());
    let dir_flag = cli.command.state_dir_flag().or(cli.state_dir.as_deref());
    if dir_flag.is_some_and(|d| d.as_os_str().is_empty()) {
        return Err(CliError::Usage(format!(
            "invalid value '' for '--state-dir <DIR>': {}",
            crate::cli::EMPTY_STATE_DIR
        )));
    }
    choose_store(flag, dir_flag)
}

/// Choose the store the commands use: `flag` (`--store`), else `WAYMARK_STORE`; set once. Returns
/// the state directory that a `sqlite:DIR` URL names (`dir_flag`, `--state-dir`, overrides it).
fn choose_store(flag: Option<&str>, dir_flag: Option<&std::path::Path>) -> Result<Option<PathBuf>, CliError> {
    let url = crate::store::url::configured(flag).map_err(|e| CliError::Usage(e.to_string()))?;
    let by = if flag.is_some() { "--store" } else { "WAYMARK_STORE" };
    let (backend, dir, chosen_by) = match url {
        StoreUrl::Sqlite(dir) => {
            let chosen_by = (dir.is_some() && dir_flag.is_none()).then_some(by);
            (Backend::Sqlite, dir, chosen_by)
        }
        StoreUrl::Postgres { config, shown } => {
            let timing = LeaseTiming::from_env().map_err(CliError::Usage)?;
            (Backend::Postgres { config, shown, timing }, None, Some(by))
        }
    };
    let _ = BACKEND.set(backend);
    let _ = CHOSEN_BY.set(chosen_by);
    Ok(dir)
}

/// `--color` as given, for everything that colors stderr (set once, by [`dispatch`]).
static COLOR: std::sync::OnceLock<ColorArg> = std::sync::OnceLock::new();

/// Whether what goes to stderr is colored: by `--color`, else NO_COLOR and whether stderr is a
/// terminal.
fn stderr_color() -> bool {
    COLOR.get().copied().unwrap_or(ColorArg::Auto).colors(std::io::stderr().is_terminal())
}

/// Print the help or version text clap made instead of parsing (`--help`, `help run`,
/// `--version`) as every command prints: a closed stdout ends it quietly, a full one is exit
/// status 4 with a message. Returns the exit status.
pub fn print_clap_text(e: &clap::Error) -> i32 {
    use std::io::Write;
    let printed = e.print().and_then(|()| std::io::stdout().flush());
    match printed.map_err(output::failed) {
        Ok(()) => EXIT_OK,
        Err(e) => e.tell(),
    }
}

/// Set `--color` as read before parsing (see [`ColorArg::from_args`]), so that what is printed
/// before [`dispatch`] (the help and version text, and their errors) follows it too.
pub fn set_color(color: ColorArg) {
    let _ = COLOR.set(color);
}

/// Run the parsed command line.
pub fn dispatch(cli: Cli) -> Result<i32, CliError> {
    let _ = COLOR.set(cli.color);
    crate::store::on_stall(|e| std::process::exit(CliError::from(e).tell()));
    let store_dir = configure(&cli)?;
    // `--store sqlite:DIR` names the state directory, as `--state-dir DIR` before the command does.
    let flag = cli.state_dir.as_deref().or(store_dir.as_deref());
    match cli.command {
        Command::Run { flow, fresh, wait, strict, show, max_parallel, params, state, .. } => {
            let start = run::Start { fresh, wait, strict, max_parallel, params: &params };
            run::run(state.or(flag), &flow, show.mode(), start)
        }
        // The state directory is created only once the run is found (a shared store keeps the
        // logs of this host's attempts in it); `run` alone creates it before.
        Command::Resume { run_id, wait, show, state, .. } => {
            run::resume(&find_state_dir(state.or(flag))?, &run_id, wait, show.mode())
        }
        Command::Check { flow, strict, explain } => check::check(&flow, strict, explain),
        Command::Graph { flow, format } => graph::graph(&flow, format),
        Command::History { flow, limit, json, state, .. } => {
            inspect::history(&find_state_dir(state.or(flag))?, flow.as_deref(), limit, json)
        }
        Command::Status { target, json, attempts, state, .. } => {
            inspect::status(&find_state_dir(state.or(flag))?, target.as_deref(), json, attempts)
        }
        Command::Logs { target, step, attempt, stream, state, .. } => {
            inspect::logs(&find_state_dir(state.or(flag))?, &target, &step, attempt, stream)
        }
        Command::Gc { older_than, state, .. } => inspect::gc(&find_state_dir(state.or(flag))?, older_than),
        Command::Errors { flow } => errors::errors(flow.as_deref()),
        Command::Completions { shell } => docs::completions(shell),
        Command::Man { command } => docs::man(command.as_deref()),
    }
}

/// Load the flow file at `path`; with `strict` (`--strict`), a flow with warnings is invalid:
/// each warning is reported as an error and nothing runs.
fn load_flow(path: &std::path::Path, strict: bool) -> Result<crate::flow::Loaded, CliError> {
    let loaded = crate::flow::load(path)?;
    if !strict || loaded.warnings.is_empty() {
        return Ok(loaded);
    }
    let diagnostics = loaded
        .warnings
        .into_iter()
        .map(|mut d| {
            d.severity = crate::flow::diagnostic::Severity::Error;
            d.message.push_str(" (an error under --strict)");
            d
        })
        .collect();
    Err(CliError::Flow(
        Box::new(LoadError::Invalid { shown: crate::text::shown_path(path), source_text: loaded.source, diagnostics }),
        None,
    ))
}

/// For the message that the flow file at `path` is invalid (or, under `--strict`, has warnings:
/// `warnings_only`, when they are all it has):
/// an unfinished run of that file whose runner is gone, which `waymark resume` still resumes with
/// the flow as it recorded it. Looked for without creating anything; nothing when there is none,
/// or the store cannot be read. A run whose runner lives goes on with its flow: nothing to say.
fn resumable_despite(
    cli_flag: Option<&std::path::Path>,
    path: &std::path::Path,
    warnings_only: bool,
) -> Option<String> {
    let dir = find_state_dir(cli_flag).ok()?;
    let store = read_store(&dir).ok()?;
    let file = std::fs::canonicalize(path).or_else(|_| std::path::absolute(path)).ok()?;
    let run = store.unfinished_runs(crate::store::RunFilter::File(&file), 1).ok()?.into_iter().next()?;
    if run.status == crate::store::RunStatus::Running && !inspect::runner_gone(store.as_ref(), &dir, &run).ok()? {
        return None;
    }
    let then = match warnings_only {
        true => "`waymark run` without `--strict` resumes it, or with it once the warnings are fixed",
        // By its path and its flow's name, which the invalid file may have changed too.
        false => &format!("`waymark run` resumes it once the file is valid again and names the flow `{}`", run.flow),
    };
    Some(format!(
        "run {0} of this flow file is unfinished: `waymark resume {0}` resumes it with the flow it recorded \
         when it started; {then}",
        run.id
    ))
}

/// Print a loaded flow's warnings to stderr.
fn print_warnings(loaded: &crate::flow::Loaded, shown: &str) {
    let color = stderr_color();
    for w in &loaded.warnings {
        note!("{}\n", w.render(shown, &loaded.source, color));
    }
}
