//! Durable run state behind a small interface, and which part owns what:
//!
//! - [`StateDir`] (`statedir.rs`) owns the state directory: checked (ours, writable by no one else)
//!   and resolved once; every path under it (database, lock files, logs) is built by it alone.
//! - `FlowLock` (`lock.rs`) keeps one runner per flow: an OS file lock on the
//!   flow's lock file, released by the kernel when its holder dies. It is how the SQLite store
//!   makes a lease exclusive.
//! - A [`Store`] owns the records (runs, steps, attempts): the commands create, claim, choose and
//!   read runs through it. [`SqliteStore`] (`sqlite.rs`) is the embedded one; a shared database
//!   can be another. Its failures are [`StoreError`]s by kind, naming a printable location, never
//!   a path for other code to open.
//! - A [`Lease`] (`lease.rs`) is a runner's ownership of one run: an owner id and a fencing token,
//!   given by `create_run` or `claim`. Every write of the runner ([`RunLog`]) carries it and is
//!   checked in its own transaction; once another runner has claimed the run, the write is
//!   [`StoreError::LeaseLost`] and changes nothing.
//! - A `RunJournal` is how the runner writes its run, each write a future, with the run id and the
//!   lease bound in. `ThreadJournal` (`journal.rs`) owns the store connection on a writer thread,
//!   so the runner's timers never wait for the disk (or another process's lock); the runner drops
//!   it, which makes every write it sent, before it releases the flow's lock.
//! - `state.rs` owns the states and their legal moves; `record.rs` the versioned run record.

pub(crate) mod journal;
pub(crate) mod lease;
pub(crate) mod postgres;
pub(crate) mod record;
pub(crate) mod sqlite;
mod stall;
pub(crate) use stall::on_stall;
pub(crate) mod state;
#[cfg(test)]
mod suite;
pub(crate) mod url;

use crate::classify::ErrorValue;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::SystemTime;

pub(crate) use journal::ThreadJournal;
pub use lease::Lease;
pub use lock::LockError;
pub(crate) use lock::held_by_gc;
pub use record::RecordError;
pub use sqlite::SqliteStore;
pub use state::{AttemptOutcome, RunStatus};
pub(crate) use state::{AttemptState, StepState, StepStatus};
pub use statedir::{StateDir, TrustError};

/// What went wrong with the store, as a user can act on it. A store maps its own failures to
/// these (the SQLite store in `sqlite.rs`); the message and hint are built from the kind alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreErrorKind {
    /// Another process holds the store locked for longer than waymark waits.
    Busy,
    /// The store is damaged, or is not a waymark store at all.
    Corrupt,
    /// A newer waymark wrote the store in a form this one does not know.
    NewerSchema,
    /// A database that holds tables but no schema version (rebuilt from sqlite3's `.dump`, which
    /// does not carry it over): what it holds cannot be told, so it is neither read nor written.
    Unversioned,
    /// No space left where the store lives.
    Full,
    /// The store, or where it lives, may not be read or written by this user.
    Permission,
    /// A networked store that cannot be reached (refused, timed out, the connection lost).
    Unreachable,
    /// A networked store that refused this user's credentials.
    Auth,
    /// A networked store that takes no writes (a read-only replica).
    ReadOnly,
    /// The store's file was deleted or moved (its state directory removed) while waymark used
    /// it: what it writes reaches no one.
    Deleted,
    /// Anything else (an I/O error, a bug): the detail says what.
    Other,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store failed. `location` says where (the database file, or what a networked store
    /// can name); `detail` is the store's own account, for the message only.
    #[error("{}", failure_message(*kind, location, detail))]
    Failed { kind: StoreErrorKind, location: String, detail: String },
    /// A state name this binary does not know, or a move between states that is not legal:
    /// the database was changed behind waymark's back, or a newer waymark wrote it.
    #[error(
        "state database {location} holds a corrupt or newer state: {table} of run {run_id}: {what}; if a newer \
         waymark wrote it, use that one; otherwise `waymark run --fresh FLOW` starts the flow anew (or move \
         the database aside)"
    )]
    BadState { location: String, table: &'static str, run_id: String, what: String },
    /// A run's recorded definition that this binary cannot read (see `record`).
    #[error("run {run_id} in {location}: {error}")]
    Record { location: String, run_id: String, error: record::RecordError },
    #[error("no run with id `{0}` in the state directory")]
    NoSuchRun(String),
    /// A runner of a shared store that fenced itself off: it lost its lease to another runner, or
    /// could not renew it in time (`why` says which). It stopped its attempts; nothing more of it
    /// is recorded.
    #[error("{}", fenced_message(run_id, location, owner, why))]
    Fenced { run_id: String, location: String, owner: String, why: String },
    /// A write by a runner whose lease was taken: another runner claimed the run since (see
    /// `lease`). The write changed nothing.
    #[error(
        "run {run_id} in {location} was taken over by another runner ({holder}) while this runner ({owner}) \
         was running it; this runner stops: its attempts are killed and their outcomes are not recorded, and \
         the run is the other runner's now (`waymark status {run_id}` shows it); two runners held the \
         run at once, so its flow's lock did not keep the second one out: do not delete the lock files under \
         the state directory's `locks/` while a runner is active, and keep the state directory on a local \
         file system"
    )]
    LeaseLost { run_id: String, location: String, owner: String, holder: String },
}

fn failure_message(kind: StoreErrorKind, location: &str, detail: &str) -> String {
    match kind {
        StoreErrorKind::Busy => format!("state database {location} is locked by another process: {detail}"),
        StoreErrorKind::Corrupt => format!(
            "state database {location}: the file is not a waymark database (or is corrupt); move it aside to start afresh"
        ),
        // A shared store is chosen by its URL, a state directory's database by the directory.
        StoreErrorKind::NewerSchema if location.starts_with("postgres") => format!(
            "state database {location} was written by a newer waymark ({detail}); upgrade waymark or choose another \
             store with --store or WAYMARK_STORE"
        ),
        StoreErrorKind::NewerSchema => format!(
            "state database {location} was written by a newer waymark ({detail}); upgrade waymark or point --state-dir elsewhere"
        ),
        StoreErrorKind::Unversioned => format!(
            "state database {location} holds tables but no schema version (its `PRAGMA user_version` is 0), so \
             waymark cannot tell what they hold and neither reads nor writes it; a copy made with sqlite3's `.dump` \
             loses the version: if it is a copy of a database this waymark last wrote (schema {detail}), set the \
             version back with `sqlite3 {} 'PRAGMA user_version = {detail}'` (a copy of one an older waymark \
             wrote needs that waymark's version, or it is read wrong), otherwise move it aside to start afresh",
            crate::flow::model::shell_word(location)
        ),
        StoreErrorKind::Full => format!("cannot write the state database {location}: {detail}"),
        StoreErrorKind::Permission => format!("no permission to use the state database {location}: {detail}"),
        StoreErrorKind::Unreachable => format!("cannot reach the state database {location}: {detail}"),
        StoreErrorKind::Auth => format!("the state database {location} refused this user's credentials: {detail}"),
        StoreErrorKind::ReadOnly => format!("the state database {location} takes no writes: {detail}"),
        // A file beside it (its write-ahead log): the detail says which, and what became of it.
        StoreErrorKind::Deleted if !detail.is_empty() => format!("state database {location}: {detail}"),
        StoreErrorKind::Deleted => format!(
            "state database {location} was deleted or moved while waymark was using it (its state directory \
             removed?): nothing written to it reaches a later runner, and the flow's lock no longer keeps a second \
             runner out; waymark stops here (a runner kills its attempts first)"
        ),
        StoreErrorKind::Other => format!("state database {location} failed: {detail}"),
    }
}

impl StoreError {
    /// A store failure of `kind` at `location`.
    pub(crate) fn failed(kind: StoreErrorKind, location: impl Into<String>, detail: impl Into<String>) -> StoreError {
        StoreError::Failed { kind, location: location.into(), detail: detail.into() }
    }

    /// The kind of a store failure; `None` for the domain errors.
    pub fn kind(&self) -> Option<StoreErrorKind> {
        match self {
            StoreError::Failed { kind, .. } => Some(*kind),
            StoreError::BadState { .. }
            | StoreError::Record { .. }
            | StoreError::NoSuchRun(_)
            | StoreError::LeaseLost { .. }
            | StoreError::Fenced { .. } => None,
        }
    }

    /// What to do about a store failure, from its kind (a line for `hint:`); `None` where the
    /// message already says it.
    pub(crate) fn hint(&self) -> Option<String> {
        let StoreError::Failed { kind, location, detail } = self else { return None };
        if location.starts_with("postgres") {
            // The server answers; what is between it and this host does not.
            if detail.ends_with(IN_BETWEEN) || detail.ends_with(&format!("{IN_BETWEEN})")) {
                return Some(format!(
                    "the server at {location} answers: check the proxy or pooler between this host and it, then try \
                     again (nothing is lost: a run resumes where it stopped)"
                ));
            }
            return network_hint(*kind, location);
        }
        let dir = std::path::Path::new(location).parent().map_or(location.clone(), |d| d.display().to_string());
        let elsewhere = "--state-dir or WAYMARK_STATE_DIR selects another directory";
        let resumes = "try again (nothing is lost: a run resumes where it stopped)";
        match kind {
            StoreErrorKind::Corrupt | StoreErrorKind::NewerSchema | StoreErrorKind::Unversioned => None,
            StoreErrorKind::Deleted if !detail.is_empty() => Some(
                "do not delete or replace the files of a state directory while a runner uses it; the next `waymark \
                 run` resumes the run from what was saved"
                    .to_owned(),
            ),
            StoreErrorKind::Deleted => Some(format!(
                "do not delete or move a state directory while a runner uses it; the next `waymark run` starts \
                 the flow anew in {dir} (what was recorded went with the file)"
            )),
            StoreErrorKind::Busy => Some(format!(
                "another process holds {location} locked (a waymark, or a tool with it open); wait for it or stop \
                 it, then {resumes}"
            )),
            StoreErrorKind::Full => {
                Some(format!("check that {dir} is writable, that its disk has free space, then {resumes}; {elsewhere}"))
            }
            StoreErrorKind::Permission => Some(format!(
                "check that you may read and write {location} and its directory {dir} (its owner and mode), then \
                 {resumes}; {elsewhere}"
            )),
            StoreErrorKind::Unreachable | StoreErrorKind::Auth | StoreErrorKind::ReadOnly => None,
            StoreErrorKind::Other => Some(format!(
                "check that {dir} is writable, that its disk has free space and that no other process holds \
                 {location} locked, then {resumes}; {elsewhere}"
            )),
        }
    }
}

/// What a run belongs to: the flow's declared name (`named:NAME`: files that declare the same name
/// share runs on purpose) or, without a `name` key, its file's canonical path
/// (`path:/canonical/path.toml`: two files never share runs). Runs, the lock and resume are per key;
/// the display name (`RunRecord::flow`) is the name or the file's stem.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowKey(String);

impl FlowKey {
    const NAMED: &'static str = "named:";
    const PATH: &'static str = "path:";

    /// The key of a loaded flow.
    pub(crate) fn of(flow: &crate::flow::Flow) -> FlowKey {
        if flow.name_declared { FlowKey::named(&flow.name) } else { FlowKey::path(&flow.path) }
    }

    pub(crate) fn named(name: &str) -> FlowKey {
        FlowKey(format!("{}{name}", Self::NAMED))
    }

    pub(crate) fn path(path: &std::path::Path) -> FlowKey {
        FlowKey(format!("{}{}", Self::PATH, path.display()))
    }

    /// A key as stored; `None` for text that is neither kind.
    pub(crate) fn parse(text: &str) -> Option<FlowKey> {
        (text.starts_with(Self::NAMED) || text.starts_with(Self::PATH)).then(|| FlowKey(text.to_owned()))
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    /// The flow file path of a path key.
    pub(crate) fn file(&self) -> Option<&str> {
        self.0.strip_prefix(Self::PATH)
    }

    /// The lock file's name under `locks/`, within `NAME_MAX` whatever the key: `NAME.lock` for a
    /// named flow (a name is at most 250 bytes of `[A-Za-z0-9_.-]`), `STEM@HASH.lock` for a file,
    /// with the stem cut to 64 bytes and a 128-bit hash of the whole path. `@` is not allowed in a
    /// flow name, so the two kinds never meet.
    pub(crate) fn lock_file_name(&self) -> String {
        if let Some(name) = self.0.strip_prefix(Self::NAMED) {
            // A loaded flow's name always qualifies; a key read from an edited database might not,
            // and never becomes a path (`../x`) under `locks/`.
            if crate::flow::validate::is_flow_name(name) {
                return format!("{name}.lock");
            }
        }
        let safe = |c: char| c.is_ascii_alphanumeric() || "_.-".contains(c);
        let path = std::path::Path::new(self.file().unwrap_or_default());
        let stem: String = path
            .file_stem()
            .map(|s| s.to_string_lossy())
            .unwrap_or_default()
            .chars()
            .filter(|c| safe(*c))
            .take(64)
            .collect();
        format!("{stem}@{:032x}.lock", fnv1a_128(self.0.as_bytes()))
    }
}

impl std::fmt::Display for FlowKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// FNV-1a, 128 bits: a stable hash for lock file names (not a defence: the keys are the user's own).
fn fnv1a_128(bytes: &[u8]) -> u128 {
    let mut h: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    for b in bytes {
        h ^= u128::from(*b);
        h = h.wrapping_mul(0x0000_0000_0100_0000_0000_0000_0000_013b);
    }
    h
}

/// Which runs `history` and `status` look at.
#[derive(Debug, Clone, Copy)]
pub enum RunFilter<'a> {
    All,
    /// Runs whose display name is this (of one flow or of several).
    Name(&'a str),
    /// Runs started from this flow file (canonical path).
    File(&'a std::path::Path),
    Key(&'a FlowKey),
}

/// One step of a recorded run.
#[derive(Debug, Clone)]
pub struct StepRecord {
    pub(crate) name: String,
    pub(crate) state: StepState,
    /// Attempts that count against the budget (cancelled ones do not).
    pub(crate) attempts_used: u32,
    /// Attempts used before the current budget began (`waymark resume` of a failed run).
    pub(crate) budget_base: u32,
    /// Boxed: most steps have none, and a 10,000-step run's records are 2 MB of new memory at
    /// 216 bytes each (144 boxed), a page fault per 4 KB.
    pub(crate) last_error: Option<Box<ErrorValue>>,
    pub(crate) started_at: Option<SystemTime>,
    pub(crate) ended_at: Option<SystemTime>,
    /// What the step's succeeded attempt wrote to its `WAYMARK_OUTPUT` file (secrets hidden);
    /// empty until it succeeds (schema 5).
    pub(crate) outputs: BTreeMap<String, String>,
    /// Its attempt or catch handler in flight ([`StepState::InFlight`], or
    /// [`StepState::Catching`] with a handler) died with an earlier runner of the run: the claim
    /// that made a new runner the run's recorded it `runner_lost`. The new runner has not run it
    /// again yet (that makes a new one, in flight instead).
    pub(crate) lost: bool,
}

impl StepRecord {
    /// Whether a signal to its runner cut the step short: it is pending again, and its last
    /// attempt (`last`, the last of its attempts) was cancelled. (`status` shows it `interrupted`
    /// unless its run failed: there a step `fail_fast` cancelled stays `pending`.)
    pub(crate) fn cut_short(&self, last: Option<&AttemptRecord>) -> bool {
        self.state == StepState::Pending && last.is_some_and(|a| a.outcome == AttemptState::Cancelled)
    }

    /// A step as [`Store::create_run`] records it: pending, no attempt used.
    pub(crate) fn pending(name: &str) -> StepRecord {
        StepRecord {
            name: name.to_owned(),
            state: StepState::Pending,
            attempts_used: 0,
            budget_base: 0,
            last_error: None,
            started_at: None,
            ended_at: None,
            outputs: BTreeMap::new(),
            lost: false,
        }
    }
}

/// A recorded run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    pub id: String,
    /// The display name: the declared name or the file's stem.
    pub(crate) flow: String,
    /// What the run belongs to: runs, the lock and resume are per key.
    pub(crate) key: FlowKey,
    pub(crate) flow_path: PathBuf,
    /// The validated definition, as JSON.
    pub(crate) definition: String,
    /// Hash of the flow file's text when the run started.
    pub(crate) source_hash: String,
    pub(crate) status: RunStatus,
    pub(crate) started_at: SystemTime,
    pub(crate) ended_at: Option<SystemTime>,
    pub(crate) pid: u32,
    pub(crate) host: String,
    pub(crate) failed_step: Option<String>,
    /// When `waymark resume` last reopened it after it failed (not recorded before schema 11 of
    /// the SQLite store and 4 of PostgreSQL's).
    pub(crate) reopened_at: Option<SystemTime>,
}

impl RunRecord {
    /// A run of `flow` as [`Store::create_run`] has just written it (running, its definition
    /// `definition`, started at `started_ms` by this process on `host`), rather than read back:
    /// the definition alone may be megabytes.
    pub(crate) fn created(
        flow: &crate::flow::Flow,
        id: String,
        definition: String,
        source_hash: &str,
        started_ms: i64,
        host: &str,
    ) -> RunRecord {
        RunRecord {
            id,
            key: FlowKey::of(flow),
            flow: flow.name.clone(),
            // As stored (text), and read back by `run`.
            flow_path: PathBuf::from(flow.path.display().to_string()),
            definition,
            source_hash: source_hash.to_owned(),
            status: RunStatus::Running,
            started_at: from_millis(started_ms),
            ended_at: None,
            pid: std::process::id(),
            host: host.to_owned(),
            failed_step: None,
            reopened_at: None,
        }
    }

    /// What the run's workflow deadline and `resume_within` count from: its start, or when
    /// `waymark resume` last reopened it after it failed.
    pub(crate) fn began(&self) -> SystemTime {
        self.reopened_at.unwrap_or(self.started_at)
    }
}

/// One execution of a step.
#[derive(Debug, Clone)]
pub struct AttemptRecord {
    pub(crate) step: String,
    pub(crate) attempt: u32,
    pub(crate) log_stem: PathBuf,
    /// The host it ran on (`None` for attempts recorded before hosts were).
    pub(crate) host: Option<String>,
    /// Running until it ends, then how it ended.
    pub(crate) outcome: AttemptState,
    pub(crate) started_at: SystemTime,
    /// When it ended (`None` while it runs).
    pub(crate) ended_at: Option<SystemTime>,
    /// Whether it ran again after its runner died.
    pub(crate) redelivered: bool,
    /// The error it failed with, as recorded (secrets already hidden).
    pub(crate) error: Option<ErrorValue>,
    /// Its process group was killed with SIGKILL after the kill grace; `None` (not known) for
    /// attempts recorded before schema 9 of the SQLite store, 2 of PostgreSQL's.
    pub(crate) killed_after_grace: Option<bool>,
}

impl AttemptRecord {
    /// The other host whose disk holds its logs, in a store `shared` by hosts: the host it ran
    /// on, if not this one. A store of this host's (SQLite) keeps every log here, whatever host
    /// id its runners went by (a container restarted on the same volume, `--host-id`).
    pub(crate) fn logs_on(&self, shared: bool) -> Option<&str> {
        self.host.as_deref().filter(|h| shared && *h != lease::host_id())
    }
}

/// How a finished attempt ended, for the record.
#[derive(Debug, Clone)]
pub struct AttemptResult {
    pub outcome: AttemptOutcome,
    pub exit_code: Option<i32>,
    pub signal: Option<String>,
    pub error: Option<ErrorValue>,
    pub ended_at: SystemTime,
    /// Its process group was killed with SIGKILL after the kill grace.
    pub killed_after_grace: bool,
    /// A succeeded attempt's outputs, recorded with the success in the same transaction (only
    /// with [`StepUpdate::Succeeded`]; empty otherwise).
    pub outputs: BTreeMap<String, String>,
}

/// An attempt about to be spawned, as [`RunLog::attempt_starting`] records it.
#[derive(Debug, Clone, Copy)]
pub struct NextAttempt<'a> {
    pub step: &'a str,
    pub attempt: u32,
    pub redelivered: bool,
    pub log_stem: &'a std::path::Path,
}

/// What a finished attempt does to its step, committed in the same transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepUpdate {
    Succeeded,
    Failed,
    Waiting {
        next_attempt: u32,
        wake_at: SystemTime,
    },
    /// Cancelled: the step goes back to pending with the same attempt number.
    Pending,
    /// Failed for good with an error a catch handler with a command matches: it is to run (or,
    /// after a cancelled handler, to run again).
    Catching,
    /// The error was caught: by a handler without a command, or one that succeeded.
    Caught,
}

impl StepUpdate {
    /// The state the step moves to.
    pub(crate) fn status(&self) -> StepStatus {
        match self {
            StepUpdate::Succeeded => StepStatus::Succeeded,
            StepUpdate::Failed => StepStatus::Failed,
            StepUpdate::Waiting { .. } => StepStatus::Waiting,
            StepUpdate::Pending => StepStatus::Pending,
            StepUpdate::Catching => StepStatus::Catching,
            StepUpdate::Caught => StepStatus::Caught,
        }
    }

    /// Whether the step is over with it (succeeded, failed, caught): such an outcome is committed
    /// with a full sync and records when the step ended.
    pub(crate) fn ends_step(&self) -> bool {
        matches!(self, StepUpdate::Succeeded | StepUpdate::Failed | StepUpdate::Caught)
    }
}

/// The executor's view of the store: every write it makes, each one transaction. Each write
/// carries the runner's [`Lease`] on the run, checked in the same transaction: a lease that a
/// later claim replaced fails the write with [`StoreError::LeaseLost`], which changes nothing.
pub trait RunLog {
    /// Commit that an attempt is about to be spawned. Returns the attempt's row id.
    fn attempt_starting(
        &mut self,
        lease: &Lease,
        run_id: &str,
        step: &str,
        attempt: u32,
        redelivered: bool,
        log_stem: &std::path::Path,
    ) -> Result<i64, StoreError>;
    /// Commit that the catch handler of step `step` (catching the error of attempt `attempt`)
    /// is about to be spawned. Returns its row id; `attempt_spawned` and `attempt_finished` record
    /// the rest, as for an attempt, but it uses no attempt of the budget.
    fn handler_starting(
        &mut self,
        lease: &Lease,
        run_id: &str,
        step: &str,
        attempt: u32,
        log_stem: &std::path::Path,
    ) -> Result<i64, StoreError>;
    /// Commit that a compensation or hook (`name`: its step or hook) is about to be spawned, with
    /// its files at `log_stem`, and mark `skipped` the steps of a failed run that will not run
    /// (given with the first of its wind-down, so that they are not left `pending` while it goes
    /// on). Returns its row id; `attempt_spawned` records its pid.
    fn aux_starting(
        &mut self,
        lease: &Lease,
        run_id: &str,
        kind: AuxKind,
        name: &str,
        log_stem: &std::path::Path,
        skipped: &[String],
    ) -> Result<i64, StoreError>;
    /// Commit how a compensation or hook ended (it changes no step).
    fn aux_finished(&mut self, lease: &Lease, row: i64, result: &AttemptResult) -> Result<(), StoreError>;
    /// Record the spawned child's pid and start time (to kill it after a runner crash).
    fn attempt_spawned(&mut self, lease: &Lease, row: i64, pid: u32, proc_start: Option<u64>)
    -> Result<(), StoreError>;
    /// Commit an attempt's outcome together with what it does to its step.
    fn attempt_finished(
        &mut self,
        lease: &Lease,
        row: i64,
        result: &AttemptResult,
        update: &StepUpdate,
    ) -> Result<(), StoreError>;
    /// Commit attempt `row`'s outcome (as [`RunLog::attempt_finished`]) and that attempt `next` is
    /// about to be spawned (as [`RunLog::attempt_starting`]) in ONE transaction, the lease checked
    /// once at its start: both are recorded or neither is. How a failed attempt whose retry is
    /// due at once (no backoff) hands over to it. It is synced like the outcome alone would be.
    /// Returns the new attempt's row id.
    fn attempt_finished_then_starting(
        &mut self,
        lease: &Lease,
        run_id: &str,
        row: i64,
        result: &AttemptResult,
        update: &StepUpdate,
        next: &NextAttempt<'_>,
    ) -> Result<i64, StoreError>;
    /// Commit the run's final (or interrupted) status, and mark `skipped` the steps that will not
    /// run (pending or waiting ones of a failed run), in one transaction.
    fn run_finished(
        &mut self,
        lease: &Lease,
        run_id: &str,
        status: RunStatus,
        failed_step: Option<&str>,
        skipped: &[String],
    ) -> Result<(), StoreError>;
}

/// Where a shared store's statement or its answer is stuck, as its error says it (and its hint
/// tells from a server that does not answer).
pub(crate) const IN_BETWEEN: &str = "in a proxy or pooler between waymark and the server";

/// The run id a runner's writes carry before its run is created (`create_run`), for messages.
pub(crate) const NEW_RUN: &str = "(new)";

/// [`StoreError::Fenced`] in words: of a run, or of one a runner was creating ([`NEW_RUN`]).
fn fenced_message(run_id: &str, location: &str, owner: &str, why: &str) -> String {
    if run_id == NEW_RUN {
        return format!(
            "the state database {location}: this runner ({owner}) {why}, while it created the flow's run; it \
             stopped before any step ran, and recorded nothing of the run; run the flow again"
        );
    }
    format!(
        "run {run_id} in {location}: this runner ({owner}) {why}; it stopped, killing any attempt it had running, \
         and nothing more of the run is recorded by it; another runner may take the run over (`waymark status \
         {run_id}` shows it)"
    )
}

/// What to do about a failure of a networked store (`location` its URL without the password).
fn network_hint(kind: StoreErrorKind, location: &str) -> Option<String> {
    let resumes = "then try again (nothing is lost: a run resumes where it stopped)";
    let elsewhere = "--store or WAYMARK_STORE selects another store";
    Some(match kind {
        StoreErrorKind::Corrupt | StoreErrorKind::NewerSchema | StoreErrorKind::Unversioned => return None,
        StoreErrorKind::Unreachable => format!(
            "check that PostgreSQL runs at {location} and takes connections from this host (host, port, firewall, \
             sslmode), {resumes}; {elsewhere}"
        ),
        StoreErrorKind::Auth => format!(
            "check the user and password of the URL (`postgres://USER:PASSWORD@HOST/DATABASE`) and that the \
             server's pg_hba.conf lets this user in from this host, {resumes}"
        ),
        StoreErrorKind::ReadOnly => format!(
            "{location} is a read-only server (a hot standby, or `default_transaction_read_only` is on): point \
             --store (or WAYMARK_STORE) at the primary, {resumes}; `history`, `status` and `logs` can read from it"
        ),
        StoreErrorKind::Permission => format!(
            "grant the user of the URL the right to create and write tables in its database (or have its \
             owner run waymark once to create them), {resumes}"
        ),
        StoreErrorKind::Busy | StoreErrorKind::Full | StoreErrorKind::Deleted | StoreErrorKind::Other => {
            format!("check the PostgreSQL server at {location} (its log says more), {resumes}; {elsewhere}")
        }
    })
}

/// What runs around a run's steps, recorded in `attempts` beside them (schema 6: `kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AuxKind {
    /// A step's compensation, run when the run fails; `name` is the step's.
    Compensate,
    /// A hook of the run (`on_success`, `on_failure`, `on_exit`), run at its very end; `name` is
    /// the hook's.
    Hook,
}

impl AuxKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            AuxKind::Compensate => "compensate",
            AuxKind::Hook => "hook",
        }
    }
}

/// A compensation or hook run recorded for a run: finished (it is not run again), or still
/// running when its runner stopped (its pid and start time, to kill what is left of it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuxRun {
    pub(crate) kind: AuxKind,
    pub(crate) name: String,
    pub(crate) finished: bool,
    pub(crate) row: i64,
    pub(crate) pid: Option<u32>,
    pub(crate) proc_start: Option<u64>,
    /// How it ended, as recorded (`running` while it runs, or when its runner died before a new
    /// one claimed the run), with when it started and ended and its exit status: what `waymark
    /// status` says of it.
    pub(crate) outcome: AttemptState,
    pub(crate) started_at: SystemTime,
    pub(crate) ended_at: Option<SystemTime>,
    pub(crate) exit_code: Option<i32>,
    /// How it failed, when it did (not recorded before waymark recorded it for these).
    pub(crate) error: Option<ErrorValue>,
}

/// A catch handler's run, as recorded: for the error of which attempt of which step, and how it
/// ended (what `status` says of a step whose handler failed).
#[derive(Debug, Clone, PartialEq)]
pub struct HandlerRun {
    pub(crate) step: String,
    /// The attempt whose error it handled.
    pub(crate) attempt: u32,
    pub(crate) outcome: AttemptState,
    pub(crate) exit_code: Option<i32>,
    /// How it failed, when it did (not recorded before waymark recorded it for handlers).
    pub(crate) error: Option<ErrorValue>,
    pub(crate) log_stem: PathBuf,
    /// The host it ran on (`None` where the store recorded none).
    pub(crate) host: Option<String>,
}

/// An error as both stores keep it: JSON, as its serde form.
fn error_json(e: &ErrorValue) -> String {
    // Strings and a list of them: serialising it cannot fail.
    serde_json::to_string(e).unwrap_or_default()
}

/// An error kept by [`error_json`]; `None` for none, or for one this binary cannot read.
fn parse_error(s: Option<String>) -> Option<ErrorValue> {
    s.and_then(|s| serde_json::from_str(&s).ok())
}

impl AuxRun {
    /// Whether a later run of the same compensation or hook is among `all` (the run's): then the
    /// files at their one stem are that later run's, not this one's.
    pub(crate) fn superseded(&self, all: &[AuxRun]) -> bool {
        all.iter().any(|other| other.kind == self.kind && other.name == self.name && other.row > self.row)
    }
}

/// The runner's writes to the run it owns, as futures, so that a store whose writes block (SQLite's
/// fsync, a network round trip) never stalls the runner's timers: an implementation runs them
/// elsewhere (a writer thread) and the dispatcher awaits the result. The run id (and the lease
/// that owning the run gives) is bound into the journal.
pub(crate) trait RunJournal {
    /// Commit that an attempt is about to be spawned. Returns the attempt's row id.
    async fn attempt_starting(
        &mut self,
        step: &str,
        attempt: u32,
        redelivered: bool,
        log_stem: &std::path::Path,
    ) -> Result<i64, StoreError>;
    /// Commit that step `step`'s catch handler is about to be spawned (see
    /// [`RunLog::handler_starting`]). Returns its row id.
    async fn handler_starting(
        &mut self,
        step: &str,
        attempt: u32,
        log_stem: &std::path::Path,
    ) -> Result<i64, StoreError>;
    /// Commit that a compensation or hook is about to be spawned (see [`RunLog::aux_starting`]).
    async fn aux_starting(
        &mut self,
        kind: AuxKind,
        name: &str,
        log_stem: &std::path::Path,
        skipped: &[String],
    ) -> Result<i64, StoreError>;
    /// Commit how a compensation or hook ended.
    async fn aux_finished(&mut self, row: i64, result: &AttemptResult) -> Result<(), StoreError>;
    /// Record the spawned child's pid and start time (to kill it after a runner crash).
    async fn attempt_spawned(&mut self, row: i64, pid: u32, proc_start: Option<u64>) -> Result<(), StoreError>;
    /// Commit an attempt's outcome together with what it does to its step.
    async fn attempt_finished(
        &mut self,
        row: i64,
        result: &AttemptResult,
        update: &StepUpdate,
    ) -> Result<(), StoreError>;
    /// Commit attempt `row`'s outcome and the start of attempt `next` in one transaction (see
    /// [`RunLog::attempt_finished_then_starting`]). Returns the new attempt's row id.
    async fn attempt_finished_then_starting(
        &mut self,
        row: i64,
        result: &AttemptResult,
        update: &StepUpdate,
        next: &NextAttempt<'_>,
    ) -> Result<i64, StoreError>;
    /// Commit the run's final (or interrupted) status, with the steps it skipped.
    async fn run_finished(
        &mut self,
        status: RunStatus,
        failed_step: Option<&str>,
        skipped: &[String],
    ) -> Result<(), StoreError>;
    /// Whether a child of the run may be alive now: an attempt, catch handler, compensation or
    /// hook spawned (or being spawned) and not yet ended. While none is, no supervision waits on a write, and a journal
    /// may make it on the caller's thread. Until told, a journal takes it that one may be.
    fn children_alive(&mut self, _alive: bool) {}
    /// Resolves when the runner has lost the right to write the run without being told by a
    /// refused write: a lease on a shared store that it could not renew in time. The dispatcher
    /// then kills its attempts and stops. Never, for a store whose leases do not expire.
    async fn lease_lost(&self) -> StoreError {
        std::future::pending().await
    }
}

/// Everything else the commands need of a store: choosing, claiming and reading runs back. The
/// embedded [`SqliteStore`] implements it; a shared database for fleets of hosts can too.
pub trait Store: RunLog + Send {
    /// Where the state lives, for messages: the database file, or what a networked store can
    /// name (never a path other code may open).
    fn location(&self) -> &str;
    /// Record a new run of `flow`, all steps pending (each as [`StepRecord::pending`]), owned by
    /// `owner` (see [`Lease::new_owner`]): its lease is the first. Returns the run as recorded,
    /// built from what was written rather than read back (`run` reads the same).
    fn create_run(
        &mut self,
        flow: &crate::flow::Flow,
        source_hash: &str,
        owner: &str,
    ) -> Result<(RunRecord, Lease), StoreError>;
    fn run(&self, id: &str) -> Result<RunRecord, StoreError>;
    /// A run and its steps as one consistent snapshot (one read transaction).
    fn run_and_steps(&self, id: &str) -> Result<(RunRecord, Vec<StepRecord>), StoreError>;
    /// The newest run of the flow `key` that a new `waymark run` should resume.
    fn find_resumable(&self, key: &FlowKey) -> Result<Option<RunRecord>, StoreError>;
    /// Runs, newest first, that `filter` selects.
    fn list_runs(&self, filter: RunFilter<'_>, limit: usize) -> Result<Vec<RunRecord>, StoreError>;
    /// Unfinished runs (running or interrupted), newest first, that `filter` selects; without
    /// reading the finished ones, however many there are.
    fn unfinished_runs(&self, filter: RunFilter<'_>, limit: usize) -> Result<Vec<RunRecord>, StoreError>;
    /// The distinct flows whose runs match `filter`: each key with the newest run's path, newest
    /// first.
    fn flows(&self, filter: RunFilter<'_>) -> Result<Vec<(FlowKey, PathBuf)>, StoreError>;
    /// Each step's recorded state, in flow order.
    fn steps(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError>;
    /// Every attempt of a run (or of one of its steps), oldest first.
    fn attempts(&self, run_id: &str, step: Option<&str>) -> Result<Vec<AttemptRecord>, StoreError>;
    /// Take over a run in this process for `owner`: status `running`, our pid and host, and a new
    /// lease whose token fences off every earlier owner's writes.
    fn claim(&mut self, run_id: &str, owner: &str) -> Result<Lease, StoreError>;
    /// Give failed steps a fresh attempt budget (for `waymark resume` of a failed run), let its
    /// hooks, which ran for the ending reopened, run again when it ends anew, and record that it
    /// was reopened `at` (its workflow deadline and `resume_within` count from then). Made under
    /// the flow's lock just before the claim, so it carries no lease (nor does `delete_finished`).
    fn reopen_failed(&mut self, run_id: &str, at: SystemTime) -> Result<(), StoreError>;
    /// The compensations and hooks run for run `run_id` so far.
    fn aux_runs(&self, run_id: &str) -> Result<Vec<AuxRun>, StoreError>;
    /// The catch handlers run for run `run_id`'s steps so far, oldest first.
    fn handlers(&self, run_id: &str) -> Result<Vec<HandlerRun>, StoreError>;
    /// Mark an unfinished run `abandoned` for `owner`, who starts a new run instead. Like a claim,
    /// it takes the run's lease: if its earlier owner still lives (the lock did not keep it out),
    /// its next write is refused and it runs nothing more of the abandoned run.
    fn abandon(&mut self, run_id: &str, owner: &str) -> Result<(), StoreError>;
    /// Finished runs (succeeded, failed, abandoned) that ended before `cutoff`, oldest first.
    fn finished_before(&self, cutoff: SystemTime) -> Result<Vec<RunRecord>, StoreError>;
    /// Delete run `id` if, in the deleting transaction, it is still finished and ended before
    /// `cutoff`; whether it was. The caller holds the run's flow lock.
    fn delete_finished(&mut self, id: &str, cutoff: SystemTime) -> Result<bool, StoreError>;
    /// Of the runs `ids` whose logs this host keeps, those that the store no longer has because
    /// `gc` deleted them (on another host of a shared store): their logs are to go too. A run of
    /// another store whose logs share the state directory is not one of them.
    fn deleted_elsewhere(&mut self, ids: &[String]) -> Result<Vec<String>, StoreError>;
    /// The end of one stream (`stdout` or `stderr`) of the attempt whose files are at `log_stem`,
    /// as a shared store keeps it for the hosts that do not have the log file; `None` where the
    /// store keeps none (the embedded one: the log files are all there is).
    fn attempt_tail(
        &self,
        _run_id: &str,
        _log_stem: &std::path::Path,
        _stream: &str,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(None)
    }
    /// The other hosts with runs of a flow without `name` that `filter` selects there (such a
    /// flow is its file on each host, and `filter` selects only this host's): none where the store
    /// is one host's.
    fn other_hosts(&self, _filter: RunFilter<'_>) -> Result<Vec<String>, StoreError> {
        Ok(Vec::new())
    }
    /// Who holds the lease on run `run_id`'s flow now, for a shared store whose leases are rows
    /// of its own (`Ok(None)` when nobody's lease is live); `None` where leases are file locks (the
    /// embedded store: see `lock.rs`).
    fn lease_holder(&self, _run_id: &str) -> Option<Result<Option<String>, StoreError>> {
        None
    }
    /// From now on the store writes for a runner whose lease `clock` keeps: a shared store retries
    /// a write that lost its connection until the runner is fenced off, and writes nothing after.
    fn fenced_by(&mut self, _clock: std::sync::Arc<lease::LeaseClock>) {}
}

/// Milliseconds since the epoch, as stored.
pub(crate) fn to_millis(t: SystemTime) -> i64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(_) => 0,
    }
}

/// A time the store holds, in milliseconds since the epoch, kept between the epoch and the last
/// millisecond of year 9999: a value outside (a damaged or hand-edited row) is shown at that end,
/// never past what a timestamp can print.
pub(crate) fn from_millis(ms: i64) -> SystemTime {
    const LAST: u64 = 253_402_300_799_999; // 9999-12-31T23:59:59.999Z
    SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0).min(LAST))
}

pub(crate) mod lock;
pub(crate) mod statedir;

/// Where waymark keeps its state: `--state-dir`, else `$WAYMARK_STATE_DIR`, else
/// `$XDG_STATE_HOME/waymark`, else `~/.local/state/waymark`.
pub(crate) fn state_dir(flag: Option<&std::path::Path>) -> Option<PathBuf> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    flag.map(PathBuf::from)
        .or_else(|| env("WAYMARK_STATE_DIR"))
        .or_else(|| env("XDG_STATE_HOME").map(|d| d.join("waymark")))
        .or_else(|| env("HOME").map(|h| h.join(".local/state/waymark")))
}

/// Create a directory (and parents) readable only by its owner, below the resolved state
/// directory: no component of `dir` may be a symlink (one a step planted there is refused, never
/// followed).
pub(crate) fn create_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    crate::os::fs::open_dir_nofollow(dir, true).map(drop)
}

/// Create the state directory itself (and parents) with mode 0700; the path to it may go through
/// symlinks.
fn create_dir_following(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

#[cfg(test)]
mod tests {
    use super::{AttemptRecord, AttemptState, FlowKey};
    use std::path::Path;

    /// An attempt's logs are on another host only in a store shared by hosts, and only when it
    /// ran on another host: a store of this host's keeps them here whatever host id it recorded.
    #[test]
    fn an_attempt_s_logs_are_elsewhere_only_in_a_shared_store_and_from_another_host() {
        let on = |host: Option<&str>| AttemptRecord {
            step: "s".into(),
            attempt: 1,
            log_stem: "/x/attempt-1".into(),
            host: host.map(str::to_owned),
            outcome: AttemptState::Failed,
            started_at: std::time::SystemTime::UNIX_EPOCH,
            ended_at: None,
            redelivered: false,
            error: None,
            killed_after_grace: Some(false),
        };
        let here = super::lease::host_id();
        assert_eq!(on(Some("far-away")).logs_on(true), Some("far-away"));
        assert_eq!(on(Some("far-away")).logs_on(false), None);
        assert_eq!(on(Some(here)).logs_on(true), None);
        assert_eq!(on(None).logs_on(true), None);
    }

    #[test]
    fn lock_file_names_stay_within_name_max_and_never_meet() {
        assert_eq!(FlowKey::named("nightly").lock_file_name(), "nightly.lock");
        assert_eq!(FlowKey::named(&"n".repeat(250)).lock_file_name().len(), 255);
        let a = FlowKey::path(Path::new("/srv/app1/nightly.toml")).lock_file_name();
        let b = FlowKey::path(Path::new("/srv/app2/nightly.toml")).lock_file_name();
        assert_ne!(a, b);
        assert!(a.starts_with("nightly@") && a.ends_with(".lock"), "{a}");
        assert_eq!(a, FlowKey::path(Path::new("/srv/app1/nightly.toml")).lock_file_name(), "stable");
        // A path of any length, with a long stem, still makes a short name.
        let long = format!("/{}/{}.toml", "d".repeat(4000), "s".repeat(250));
        let name = FlowKey::path(Path::new(&long)).lock_file_name();
        assert_eq!(name.len(), 64 + 1 + 32 + 5, "{name}");
        // `@` is not allowed in a flow name, so a named lock never takes a file's.
        assert!(!FlowKey::named("nightly").lock_file_name().contains('@'));
        // A name that could not come from a flow file (an edited database) is hashed, never a path.
        let odd = FlowKey::parse("named:../../x").unwrap().lock_file_name();
        assert!(odd.starts_with('@') && !odd.contains('/'), "{odd}");
    }

    #[test]
    fn keys_round_trip_and_unknown_text_is_refused() {
        let key = FlowKey::path(Path::new("/a/b.toml"));
        assert_eq!(FlowKey::parse(key.as_str()), Some(key.clone()));
        assert_eq!(key.file(), Some("/a/b.toml"));
        assert_eq!(FlowKey::named("x").file(), None);
        assert_eq!(FlowKey::parse("nightly"), None);
    }
}
