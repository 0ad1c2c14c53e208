//! The embedded store: one SQLite database in WAL mode under the state directory.
//!
//! Durability: commits use `synchronous=NORMAL` (they survive a crash of waymark or of a child,
//! not a power loss; creating a run is one of them), except the commits that finish a step or a
//! run, which are made with `synchronous=FULL` and so reach the disk before waymark goes on: a
//! succeeded step is never run again, even after a power loss; an attempt's start or a retry's
//! wake-up time may be lost by one, and is then redone.
//!
//! Leases: a run records its owner and fencing token (`lease_owner`, `lease_token`); every write of
//! the runner checks them first, in its own transaction (see [`check_lease`]). The per-flow file
//! lock is what makes the lease exclusive here: a runner takes it before it creates or claims a run.

use super::record::RunDefinition;
use super::*;
use crate::FastHash;
use crate::flow::Flow;
use rusqlite::{Connection, OpenFlags, OptionalExtension, params};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::BuildHasher;
use std::path::Path;

/// See [`SqliteStore::positions`].
type Positions = HashMap<String, Option<StepPositions>>;

/// The positions of some steps of a run, by name (see [`SqliteStore::positions`]). The names are
/// kept one after another in one string, where a map keyed by names made a copy of each: for a
/// 10,000-step run, 10,000 allocations and frees, 4% of its instructions to its first child.
struct StepPositions {
    names: String,
    /// Each step: where its name is in `names`, and its position.
    table: hashbrown::HashTable<(std::ops::Range<usize>, i64)>,
    hasher: FastHash,
}

impl StepPositions {
    /// The positions of `steps` (each a name and its position); `None` if a name comes twice.
    fn of<'a>(steps: impl Iterator<Item = (&'a str, i64)> + Clone) -> Option<StepPositions> {
        let (mut count, mut length) = (0, 0);
        for (name, _) in steps.clone() {
            count += 1;
            length += name.len();
        }
        let mut positions = StepPositions {
            names: String::with_capacity(length),
            table: hashbrown::HashTable::with_capacity(count),
            hasher: FastHash::default(),
        };
        for (name, position) in steps {
            let StepPositions { names, table, hasher } = &mut positions;
            let hash = hasher.hash_one(name);
            match table.entry(hash, |(at, _)| names[at.clone()] == *name, |(at, _)| hasher.hash_one(&names[at.clone()]))
            {
                hashbrown::hash_table::Entry::Occupied(_) => return None,
                hashbrown::hash_table::Entry::Vacant(entry) => {
                    entry.insert((names.len()..names.len() + name.len(), position));
                }
            }
            names.push_str(name);
        }
        Some(positions)
    }

    fn get(&self, name: &str) -> Option<i64> {
        let hash = self.hasher.hash_one(name);
        self.table.find(hash, |(at, _)| self.names[at.clone()] == *name).map(|&(_, position)| position)
    }

    /// Forgets step `name`: its row is written. (Its name stays in `names`, unused.)
    fn remove(&mut self, name: &str) {
        let hash = self.hasher.hash_one(name);
        if let Ok(entry) = self.table.find_entry(hash, |(at, _)| self.names[at.clone()] == *name) {
            entry.remove();
        }
    }
}

const SCHEMA_VERSION: i64 = 11;

/// Prepared statements kept per connection: more than the runner's writes use.
const STATEMENT_CACHE: usize = 64;

/// The key of a run recorded before schema 2, which had runs per flow name only: a run whose
/// recorded path is `DIR/NAME.toml` or `DIR/NAME` (its flow name is the file's stem, the default
/// name) belongs to that file (`path:`); any other run belongs to its declared name (`named:`).
const LEGACY_KEY: &str = "CASE WHEN flow_path GLOB ('*/' || flow || '.toml') OR flow_path GLOB ('*/' || flow)
     THEN 'path:' || flow_path ELSE 'named:' || flow END";

/// Schema 1 to 2: runs get their flow's identity (see [`FlowKey`]); old rows per [`LEGACY_KEY`].
const MIGRATE_TO_2: &str = "
ALTER TABLE runs ADD COLUMN flow_key TEXT NOT NULL DEFAULT '';
CREATE INDEX runs_by_key ON runs (flow_key, seq);
";

/// Schema 2 to 3: each attempt records the host it ran on; older attempts have none (`NULL`).
const MIGRATE_TO_3: &str = "
ALTER TABLE attempts ADD COLUMN host TEXT;
";

/// Schema 3 to 4: owning a run is a lease (see `lease`). Runs recorded before have no owner and
/// token 0; the next claim gives them token 1, so they resume as before.
const MIGRATE_TO_4: &str = "
ALTER TABLE runs ADD COLUMN lease_owner TEXT;
ALTER TABLE runs ADD COLUMN lease_token INTEGER NOT NULL DEFAULT 0;
";

/// Schema 4 to 5: a succeeded step records its outputs (what it wrote to `WAYMARK_OUTPUT`), a
/// JSON object of strings; steps recorded before have none (`NULL`).
const MIGRATE_TO_5: &str = "
ALTER TABLE steps ADD COLUMN outputs TEXT;
";

/// Schema 6: what a row of `attempts` is: an attempt of its step, or a catch handler run for it.
const MIGRATE_TO_6: &str = "
ALTER TABLE attempts ADD COLUMN kind TEXT NOT NULL DEFAULT 'attempt';
";

/// Schema 7: the unfinished runs (the ones `waymark run` may resume) have an index of their own,
/// so finding one reads only those, never the finished runs (nor their definitions) before them.
const MIGRATE_TO_7: &str = "
CREATE INDEX IF NOT EXISTS runs_unfinished ON runs (seq) WHERE status IN ('running', 'interrupted');
";

/// Schema 8: the lease and status of a run, which every write of its runner checks, have an index
/// that holds them (the queries name it: `INDEXED BY runs_lease`): reading them from the run's
/// row walks past its definition (a flow of 10,000 steps spans hundreds of pages), which made a
/// step's writes cost in proportion to the flow.
const MIGRATE_TO_8: &str = "
CREATE INDEX IF NOT EXISTS runs_lease ON runs (id, lease_owner, lease_token, status);
";

/// Schema 9: a run's definition has a table of its own. In the run's row (hundreds of pages for a
/// flow of 10,000 steps) every change of the row rewrote it: claiming a run, ending it, abandoning
/// it. A run's compensations and hooks have an index of their own: a resumed run read every
/// attempt of the run to find them. And an attempt records whether its process group was killed
/// with SIGKILL after its kill grace (`killed`; `NULL`, not known, for the attempts recorded
/// before).
const MIGRATE_TO_9: &str = "
CREATE TABLE definitions (
    run_id     TEXT PRIMARY KEY REFERENCES runs (id) ON DELETE CASCADE,
    definition TEXT NOT NULL
);
INSERT INTO definitions (run_id, definition) SELECT id, definition FROM runs;
ALTER TABLE runs DROP COLUMN definition;
CREATE INDEX attempts_aux ON attempts (run_id) WHERE kind IN ('compensate', 'hook');
ALTER TABLE attempts ADD COLUMN killed INTEGER;
";

/// Schema 10: a step's row is written when the step first moves (its first attempt starts, or its
/// run ends with it skipped), no longer with its run: a run of 10,000 steps wrote 10,000 rows
/// before its first child (a third of the time to it). The run's step names, in order, are kept
/// with its definition (`steps`, a JSON array), and a step of that list without a row is pending
/// (see [`SqliteStore::steps`]). The runs recorded before have a row per step, and no list.
const MIGRATE_TO_10: &str = "
ALTER TABLE definitions ADD COLUMN steps TEXT;
";

/// Schema 11: a failed run reopened by `waymark resume` records when (`reopened_at`): its workflow
/// deadline and `resume_within` count from then, whichever runner goes on with it. Runs recorded
/// before have none (`NULL`).
const MIGRATE_TO_11: &str = "
ALTER TABLE runs ADD COLUMN reopened_at INTEGER;
";

/// A run's definition, as a column of [`select_runs`] (an empty text, which no reader takes for a
/// definition, where a row of `definitions` is missing).
const DEFINITION: &str = "COALESCE((SELECT d.definition FROM definitions d WHERE d.run_id = runs.id), '')";

/// The condition [`MIGRATE_TO_7`]'s index covers, as a query must write it for the index to serve.
const UNFINISHED: &str = "status IN ('running', 'interrupted')";

/// The schema of a new database: version 1's (`SCHEMA`, kept for a test) with every migration
/// made, written out. A new state directory took the migrations' path too, which cost 7.3M
/// instructions (SQLite parses the whole schema again for each `ALTER TABLE`, and schema 9
/// rebuilt a table), 8% of a 10,000-step flow's first run to its first child. A test checks that
/// both paths give the same tables, columns, keys and indexes: a new migration changes both.
///
/// One difference is meant: a new database's `attempts.row` is a plain rowid, not
/// `AUTOINCREMENT`. Each row is still one more than the largest in the table, so within a run
/// (whose rows are never deleted while it is kept) rows only grow, as `WAYMARK_ATTEMPT_ID`
/// (`RUN.ROW`) needs; only rows of runs `gc` deleted may be given again, to another run. Without
/// `AUTOINCREMENT` an attempt's commit writes no `sqlite_sequence` page: 4 pages instead of 5 per
/// failing attempt (its end with the next start, and its pid), 2% fewer instructions, and a WAL
/// checkpoint (two fsyncs) every 250 attempts instead of every 200. Older databases keep theirs:
/// rebuilding their largest table on upgrade is not worth that.
const CURRENT_SCHEMA: &str = "
CREATE TABLE runs (
    id          TEXT PRIMARY KEY,
    seq         INTEGER NOT NULL UNIQUE,
    flow        TEXT NOT NULL,
    flow_path   TEXT NOT NULL,
    source_hash TEXT NOT NULL,
    status      TEXT NOT NULL,
    started_at  INTEGER NOT NULL,
    ended_at    INTEGER,
    pid         INTEGER NOT NULL,
    host        TEXT NOT NULL,
    failed_step TEXT,
    flow_key    TEXT NOT NULL DEFAULT '',
    lease_owner TEXT,
    lease_token INTEGER NOT NULL DEFAULT 0,
    reopened_at INTEGER
);
CREATE INDEX runs_by_flow ON runs (flow, seq);
CREATE INDEX runs_by_key ON runs (flow_key, seq);
CREATE INDEX runs_unfinished ON runs (seq) WHERE status IN ('running', 'interrupted');
CREATE INDEX runs_lease ON runs (id, lease_owner, lease_token, status);
CREATE TABLE steps (
    run_id        TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    position      INTEGER NOT NULL,
    name          TEXT NOT NULL,
    state         TEXT NOT NULL,
    attempts_used INTEGER NOT NULL DEFAULT 0,
    budget_base   INTEGER NOT NULL DEFAULT 0,
    next_attempt  INTEGER,
    wake_at       INTEGER,
    current_row   INTEGER,
    last_error    TEXT,
    started_at    INTEGER,
    ended_at      INTEGER,
    outputs       TEXT,
    PRIMARY KEY (run_id, name)
);
CREATE TABLE attempts (
    row         INTEGER PRIMARY KEY,
    run_id      TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    step        TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    redelivered INTEGER NOT NULL,
    outcome     TEXT NOT NULL,
    started_at  INTEGER NOT NULL,
    ended_at    INTEGER,
    pid         INTEGER,
    proc_start  INTEGER,
    exit_code   INTEGER,
    signal      TEXT,
    error       TEXT,
    log_stem    TEXT NOT NULL,
    host        TEXT,
    kind        TEXT NOT NULL DEFAULT 'attempt',
    killed      INTEGER
);
CREATE INDEX attempts_by_step ON attempts (run_id, step, attempt);
CREATE INDEX attempts_aux ON attempts (run_id) WHERE kind IN ('compensate', 'hook');
CREATE TABLE definitions (
    run_id     TEXT PRIMARY KEY REFERENCES runs (id) ON DELETE CASCADE,
    definition TEXT NOT NULL,
    steps      TEXT
);
";

/// The schema as version 1 created it, from which the migrations start: kept for the test that
/// checks them against [`CURRENT_SCHEMA`] (a new database no longer takes their path).
#[cfg(test)]
const SCHEMA: &str = "
CREATE TABLE runs (
    id          TEXT PRIMARY KEY,
    seq         INTEGER NOT NULL UNIQUE,
    flow        TEXT NOT NULL,
    flow_path   TEXT NOT NULL,
    definition  TEXT NOT NULL,
    source_hash TEXT NOT NULL,
    status      TEXT NOT NULL,
    started_at  INTEGER NOT NULL,
    ended_at    INTEGER,
    pid         INTEGER NOT NULL,
    host        TEXT NOT NULL,
    failed_step TEXT
);
CREATE INDEX runs_by_flow ON runs (flow, seq);
CREATE TABLE steps (
    run_id        TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    position      INTEGER NOT NULL,
    name          TEXT NOT NULL,
    state         TEXT NOT NULL,
    attempts_used INTEGER NOT NULL DEFAULT 0,
    budget_base   INTEGER NOT NULL DEFAULT 0,
    next_attempt  INTEGER,
    wake_at       INTEGER,
    current_row   INTEGER,
    last_error    TEXT,
    started_at    INTEGER,
    ended_at      INTEGER,
    PRIMARY KEY (run_id, name)
);
CREATE TABLE attempts (
    row         INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    step        TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    redelivered INTEGER NOT NULL,
    outcome     TEXT NOT NULL,
    started_at  INTEGER NOT NULL,
    ended_at    INTEGER,
    pid         INTEGER,
    proc_start  INTEGER,
    exit_code   INTEGER,
    signal      TEXT,
    error       TEXT,
    log_stem    TEXT NOT NULL
);
CREATE INDEX attempts_by_step ON attempts (run_id, step, attempt);
";

/// Brings a database of schema `version` (1 or later; a new one gets [`CURRENT_SCHEMA`]) to the
/// current one, but for its `user_version`.
fn migrate(tx: &Connection, version: i64) -> rusqlite::Result<()> {
    if version < 2 {
        tx.execute_batch(MIGRATE_TO_2)?;
        tx.execute(&format!("UPDATE runs SET flow_key = {LEGACY_KEY}"), [])?;
    }
    // Each to the schema its number names, the last to this one's.
    let steps: [(i64, &str); (SCHEMA_VERSION - 2) as usize] = [
        (3, MIGRATE_TO_3),
        (4, MIGRATE_TO_4),
        (5, MIGRATE_TO_5),
        (6, MIGRATE_TO_6),
        (7, MIGRATE_TO_7),
        (8, MIGRATE_TO_8),
        (9, MIGRATE_TO_9),
        (10, MIGRATE_TO_10),
        (11, MIGRATE_TO_11),
    ];
    for (_, sql) in steps.into_iter().filter(|(to, _)| version < *to) {
        tx.execute_batch(sql)?;
    }
    Ok(())
}

/// The device and inode of the file at `path` (not followed).
fn file_id(path: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).map(|m| (m.dev(), m.ino()))
}

pub struct SqliteStore {
    conn: Connection,
    /// The database file's identity (device, inode) when a store that writes opened it: every
    /// write checks that the path still leads to it (a state directory deleted or moved under a
    /// runner would take every later write with it, unseen). No descriptor is kept for it: closing
    /// one would drop SQLite's own locks on the file.
    file_id: Option<(u64, u64)>,
    /// How many durable writes were committed, each with `synchronous=FULL` (see [`Self::write`];
    /// one that changed nothing has nothing to flush).
    flushed: u64,
    path: PathBuf,
    /// `path` as shown in messages (see [`Store::location`]).
    location: String,
    /// The directory of the logs beside the database, ending with `/` (see [`Self::here`]).
    logs: Option<String>,
    /// The write-ahead log beside the database, and its identity once it exists (see
    /// [`Self::check_wal`]).
    wal: PathBuf,
    wal_id: Option<(u64, u64)>,
    /// The SQL for a run's [`FlowKey`]: the `flow_key` column, or, in a schema-1 database that a
    /// read-only command cannot migrate, [`LEGACY_KEY`].
    key_sql: &'static str,
    /// The SQL for an attempt's host: the `host` column, or `NULL` in a database older than
    /// schema 3 that a read-only command cannot migrate.
    attempt_host_sql: &'static str,
    /// The SQL for a step's outputs: the `outputs` column, or `NULL` in a database older than
    /// schema 5 that a read-only command cannot migrate.
    step_outputs_sql: &'static str,
    /// What a row of `attempts` is (rows recorded before schema 6 are all attempts).
    attempt_kind_sql: &'static str,
    /// Whether an attempt was killed after its grace: the `killed` column, or `NULL` (not known)
    /// in a database older than schema 9 that a read-only command cannot migrate.
    attempt_killed_sql: &'static str,
    /// The SQL for a run's definition: [`DEFINITION`], or the `definition` column of the run's row
    /// in a database older than schema 9 that a read-only command cannot migrate.
    definition_sql: &'static str,
    /// Whether runs may have steps without rows (schema 10, [`MIGRATE_TO_10`]): a database older
    /// than that, which a read-only command cannot migrate, has a row for every step.
    lazy_steps: bool,
    /// When a failed run was reopened: the `reopened_at` column, or `NULL` in a database older
    /// than schema 11 that a read-only command cannot migrate.
    run_reopened_sql: &'static str,
    /// The position of each step of the runs this store wrote or read, by run, that may still
    /// have no row: where its row goes when it first moves. `None` for a run recorded before
    /// schema 10 (a row per step). Filled when a run is created, or when its steps are read (a
    /// resumed run's runner reads them before it starts any), else from the run's list.
    positions: RefCell<Positions>,
}

/// A database whose schema is newer than this binary's.
fn newer_schema(path: &Path, found: i64) -> StoreError {
    StoreError::failed(
        StoreErrorKind::NewerSchema,
        path.display().to_string(),
        format!("schema {found}, this one knows {SCHEMA_VERSION}"),
    )
}

/// `SELECT` of a run's columns in the order [`SqliteStore::run_from_row`] reads them by
/// position, its key last.
fn select_runs(store: &SqliteStore) -> String {
    let (definition, key, reopened) = (store.definition_sql, store.key_sql, store.run_reopened_sql);
    format!(
        "SELECT id, flow, flow_path, {definition}, source_hash, status, started_at, ended_at, pid, host, failed_step, \
         {key}, {reopened} FROM runs"
    )
}

/// The newest unfinished run of key `?1`. (`+`, SQLite's no-op operator, keeps the key's own index,
/// which holds the finished runs too, from being chosen: the unfinished runs' index is read.)
fn resumable_sql(store: &SqliteStore) -> String {
    format!("{} WHERE +{} = ?1 AND {UNFINISHED} ORDER BY seq DESC LIMIT 1", select_runs(store), store.key_sql)
}

/// Unfinished runs that `cond` selects, newest first, at most `?2` (`+` as in [`resumable_sql`]).
fn unfinished_sql(store: &SqliteStore, cond: &str) -> String {
    format!("{} WHERE {UNFINISHED} AND +{cond} ORDER BY seq DESC LIMIT ?2", select_runs(store))
}

fn now_ms() -> i64 {
    to_millis(SystemTime::now())
}

fn outputs_json(outputs: &BTreeMap<String, String>) -> String {
    // A map of strings: serialising it cannot fail.
    serde_json::to_string(outputs).unwrap_or_default()
}

/// The kind of an SQLite failure on the database at `path`: the only place that reads SQLite's
/// codes.
fn kind_of(path: &Path, e: &rusqlite::Error) -> StoreErrorKind {
    use rusqlite::ErrorCode as C;
    let e = match e {
        rusqlite::Error::SqliteFailure(e, _) => e,
        // A value no waymark writes where it reads one (a negative count, text for a number): the
        // file was damaged or edited.
        rusqlite::Error::IntegralValueOutOfRange(..)
        | rusqlite::Error::InvalidColumnType(..)
        | rusqlite::Error::FromSqlConversionFailure(..) => return StoreErrorKind::Corrupt,
        _ => return StoreErrorKind::Other,
    };
    match e.code {
        C::DatabaseBusy | C::DatabaseLocked => StoreErrorKind::Busy,
        C::DatabaseCorrupt | C::NotADatabase => StoreErrorKind::Corrupt,
        C::DiskFull => StoreErrorKind::Full,
        C::PermissionDenied | C::ReadOnly | C::AuthorizationForStatementDenied => StoreErrorKind::Permission,
        // SQLite does not say why it could not open the file: ask the file system.
        C::CannotOpen if denied(path) => StoreErrorKind::Permission,
        _ => StoreErrorKind::Other,
    }
}

/// Whether this user may not open `path` (or, where it does not exist, create files beside it).
fn denied(path: &Path) -> bool {
    let is_denied = |r: std::io::Result<()>| matches!(r, Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied);
    if path.exists() {
        is_denied(std::fs::File::open(path).map(drop))
    } else {
        path.parent().is_some_and(|dir| is_denied(std::fs::read_dir(dir).map(drop)))
            || path.parent().is_some_and(|dir| {
                nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK) == Err(nix::errno::Errno::EACCES)
            })
    }
}

/// Refuses the database `conn` has open at `path` if it holds tables but no schema version: a copy
/// rebuilt from sqlite3's `.dump`, which does not carry `user_version` over, would be taken for a
/// new database (a looking command saw no runs; a runner failed creating tables that exist).
/// Waymark creates its tables and sets the version in one transaction: no waymark is ever seen
/// half way.
fn unversioned(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let sql = |e| failure(path, e);
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).map_err(sql)?;
    let tables: i64 =
        conn.query_row("SELECT count(*) FROM sqlite_master WHERE type = 'table'", [], |r| r.get(0)).map_err(sql)?;
    if version == 0 && tables > 0 {
        return Err(StoreError::failed(
            StoreErrorKind::Unversioned,
            path.display().to_string(),
            SCHEMA_VERSION.to_string(),
        ));
    }
    Ok(())
}

/// An SQLite failure on the database at `path` as a [`StoreError`] of its kind.
fn failure(path: &Path, e: rusqlite::Error) -> StoreError {
    StoreError::failed(kind_of(path, &e), path.display().to_string(), e.to_string())
}

/// `file:PATH?immutable=1`, with the characters that mean something in a URI escaped.
fn immutable_uri(path: &Path) -> String {
    let mut uri = String::from("file:");
    for b in path.as_os_str().as_encoded_bytes() {
        match b {
            b'?' | b'#' | b'%' => uri.push_str(&format!("%{b:02X}")),
            b if b.is_ascii() => uri.push(char::from(*b)),
            b => uri.push_str(&format!("%{b:02X}")),
        }
    }
    uri.push_str("?immutable=1");
    uri
}

/// A row whose state this binary does not know, or a write that would make an illegal move:
/// carried through rusqlite's error type out of row mappers and transactions, then turned into
/// [`StoreError::BadState`] by [`SqliteStore::sql`].
#[derive(Debug, thiserror::Error)]
#[error("{table} of run {run_id}: {what}")]
struct BadRow {
    table: &'static str,
    run_id: String,
    what: String,
}

fn bad_row(table: &'static str, run_id: &str, what: impl std::fmt::Display) -> rusqlite::Error {
    let bad = BadRow { table, run_id: run_id.to_owned(), what: what.to_string() };
    rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, Box::new(bad))
}

/// `row` added to the last of `chunks`, or to a new one twice its size: one Vec grown to 10,000
/// records by doubling copied them all over again at each step (3.5M of the instructions to read
/// them), where chunks are never moved.
fn push_chunked<T>(chunks: &mut Vec<Vec<T>>, row: T) {
    match chunks.last_mut() {
        Some(chunk) if chunk.len() < chunk.capacity() => chunk.push(row),
        last => {
            let mut chunk = Vec::with_capacity(last.map_or(64, |c| c.capacity() * 2));
            chunk.push(row);
            chunks.push(chunk);
        }
    }
}

/// The steps read (in chunks, in the order read), in the order of their positions. A run's steps
/// are at positions 0 to n - 1, each at one: then each is moved straight into its place, where a
/// sort compared and moved the records of a 10,000-step run over and over. Any other positions
/// (which waymark never writes) are sorted, as ever.
fn in_position_order(chunks: Vec<Vec<(i64, StepRecord)>>) -> Vec<StepRecord> {
    let n = chunks.iter().map(Vec::len).sum();
    let mut taken = vec![false; n];
    let each_once = chunks.iter().flatten().all(|&(position, _)| {
        usize::try_from(position)
            .ok()
            .and_then(|p| taken.get_mut(p))
            .is_some_and(|taken| !std::mem::replace(taken, true))
    });
    let mut steps = Vec::with_capacity(n);
    if each_once {
        // Where each position's record is read (chunk, index): the records are then moved once,
        // straight into their places, where a vector of slots moved them all twice (a few
        // megabytes for 10,000 steps, each page of it new memory to fault in).
        let mut at: Vec<(usize, usize)> = vec![(0, 0); n];
        for (c, chunk) in chunks.iter().enumerate() {
            for (i, &(position, _)) in chunk.iter().enumerate() {
                // Always a place: checked above.
                if let Some(place) = usize::try_from(position).ok().and_then(|p| at.get_mut(p)) {
                    *place = (c, i);
                }
            }
        }
        let mut chunks = chunks;
        // Each record is taken once (each position is taken once), leaving an empty one behind.
        steps.extend(at.into_iter().map(|(c, i)| std::mem::replace(&mut chunks[c][i].1, StepRecord::pending(""))));
    } else {
        let mut read: Vec<(i64, StepRecord)> = Vec::with_capacity(n);
        read.extend(chunks.into_iter().flatten());
        read.sort_unstable_by_key(|&(position, _)| position);
        steps.extend(read.into_iter().map(|(_, step)| step));
    }
    steps
}

/// Run `sql` through the connection's statement cache: the runner's writes repeat the same few
/// statements for every attempt, and parsing them again each time cost more than running them.
fn exec(tx: &Connection, sql: &str, params: impl rusqlite::Params) -> rusqlite::Result<usize> {
    tx.prepare_cached(sql)?.execute(params)
}

/// [`rusqlite::Connection::query_row`] through the statement cache (see [`exec`]).
fn query_row<T>(
    tx: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    f: impl FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    tx.prepare_cached(sql)?.query_row(params, f)
}

/// The recorded status of a run, checked to be one this binary knows.
fn run_status(tx: &Connection, run_id: &str) -> rusqlite::Result<RunStatus> {
    let status: Option<String> =
        query_row(tx, "SELECT status FROM runs INDEXED BY runs_lease WHERE id = ?1", [run_id], |r| r.get(0))
            .optional()?;
    let status = status.ok_or_else(|| bad_row("runs", run_id, "the run is not recorded"))?;
    RunStatus::parse(&status).map_err(|e| bad_row("runs", run_id, e))
}

/// Check that run `run_id` may move to `to` (see [`RunStatus::can_move_to`]).
fn move_run(tx: &Connection, run_id: &str, to: RunStatus) -> rusqlite::Result<()> {
    let from = run_status(tx, run_id)?;
    if !from.can_move_to(to) {
        return Err(bad_row("runs", run_id, format!("the run cannot go from {} to {}", from.as_str(), to.as_str())));
    }
    Ok(())
}

/// Check that step `step` of run `run_id` may move to `to` (see [`StepStatus::can_move_to`]).
fn move_step(tx: &Connection, run_id: &str, step: &str, to: StepStatus) -> rusqlite::Result<()> {
    let state: Option<String> =
        query_row(tx, "SELECT state FROM steps WHERE run_id = ?1 AND name = ?2", [run_id, step], |r| r.get(0))
            .optional()?;
    let state = state.ok_or_else(|| bad_row("steps", run_id, format!("step `{step}` is not recorded")))?;
    let from = StepStatus::parse(&state).map_err(|e| bad_row("steps", run_id, format!("step `{step}`: {e}")))?;
    if !from.can_move_to(to) {
        return Err(bad_row(
            "steps",
            run_id,
            format!("step `{step}` cannot go from {} to {}", from.as_str(), to.as_str()),
        ));
    }
    Ok(())
}

/// The states a step may move to `to` from, as `,name,name,`: an `UPDATE` that moves it checks
/// its state with `instr(list, ',' || state || ',')` instead of reading it first.
fn sources(to: StepStatus) -> String {
    StepStatus::sources_of(to).fold(",".to_owned(), |list, from| list + from.as_str() + ",")
}

/// Check that an `UPDATE` that moved step `step` of run `run_id` to `to`, its row chosen with
/// [`sources`], changed it (`changed` rows): if not, the step's state forbids the
/// move, and [`move_step`] says why.
fn moved(tx: &Connection, changed: usize, run_id: &str, step: &str, to: StepStatus) -> rusqlite::Result<()> {
    if changed == 1 {
        return Ok(());
    }
    move_step(tx, run_id, step, to)?;
    Err(bad_row("steps", run_id, format!("step `{step}` was not moved to {}", to.as_str())))
}

/// A write by an owner whose lease a later claim replaced: carried through rusqlite's error type
/// like [`BadRow`], then turned into [`StoreError::LeaseLost`] by [`SqliteStore::sql`].
#[derive(Debug, thiserror::Error)]
#[error("run {run_id}: lease of {owner} lost to {holder}")]
struct LostLease {
    run_id: String,
    owner: String,
    holder: String,
}

/// Check, inside the writing transaction, that `lease` is still the lease of run `run_id`: the
/// first thing every write of the runner does, so a fenced-off write changes nothing.
fn check_lease(tx: &Connection, run_id: &str, lease: &Lease) -> rusqlite::Result<()> {
    let found: Option<(Option<String>, i64)> =
        query_row(tx, "SELECT lease_owner, lease_token FROM runs INDEXED BY runs_lease WHERE id = ?1", [run_id], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()?;
    let (holder, token) = found.ok_or_else(|| bad_row("runs", run_id, "the run is not recorded"))?;
    if token == lease.token && holder.as_deref() == Some(lease.owner.as_str()) {
        return Ok(());
    }
    let lost = LostLease {
        run_id: run_id.to_owned(),
        owner: lease.owner.clone(),
        holder: holder.unwrap_or_else(|| "an unknown runner".to_owned()),
    };
    Err(rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, Box::new(lost)))
}

/// The run an attempt belongs to, checking that `lease` is still that run's lease.
fn check_lease_of_attempt(tx: &Connection, row: i64, lease: &Lease) -> rusqlite::Result<String> {
    let run_id: Option<String> =
        query_row(tx, "SELECT run_id FROM attempts WHERE row = ?1", [row], |r| r.get(0)).optional()?;
    let run_id = run_id.ok_or_else(|| bad_row("attempts", "?", format!("attempt {row} is not recorded")))?;
    check_lease(tx, &run_id, lease)?;
    Ok(run_id)
}

/// The row of step `?3` of run `?1`, at position `?2`, pending, unless it has one: written just
/// before the `UPDATE` that skips a step at its run's end, which may be its first move (see
/// [`MIGRATE_TO_10`]). An attempt's start inserts the row itself (see [`start_attempt`]).
const STEP_ROW: &str = "INSERT OR IGNORE INTO steps (run_id, position, name, state) VALUES (?1, ?2, ?3, 'pending')";

/// The names in run `run_id`'s list of steps (see [`MIGRATE_TO_10`]), borrowed from its JSON: a
/// step's name never needs an escape (validation allows letters, digits, `_` and `-`).
fn step_names<'a>(json: &'a str, run_id: &str) -> rusqlite::Result<Vec<&'a str>> {
    serde_json::from_str(json)
        .map_err(|e| bad_row("definitions", run_id, format!("its list of steps is not a JSON array of names: {e}")))
}

fn new_run_id() -> String {
    const ALPHABET: &[u8] = b"0123456789abcdefghjkmnpqrstvwxyz";
    (0..8).map(|_| ALPHABET[fastrand::usize(..ALPHABET.len())] as char).collect()
}

impl SqliteStore {
    /// A store over `conn`, reading the database as schema `schema` laid it out: a read-only
    /// command reads an older database as it is (a runner migrates it first).
    fn with(conn: Connection, path: PathBuf, schema: i64) -> SqliteStore {
        let location = path.display().to_string();
        // The database is the state directory's: its logs are beside it.
        let logs = path.parent().map(|dir| format!("{}/", dir.join(statedir::LOGS).display()));
        let mut wal = path.clone().into_os_string();
        wal.push("-wal");
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        SqliteStore {
            conn,
            file_id: None,
            flushed: 0,
            path,
            location,
            logs,
            wal: PathBuf::from(wal),
            wal_id: None,
            // A schema-1 database is migrated by the next runner; until then its keys are computed.
            key_sql: if schema < 2 { LEGACY_KEY } else { "flow_key" },
            // Attempts recorded before schema 3 have no host.
            attempt_host_sql: if schema < 3 { "NULL" } else { "host" },
            // Steps recorded before schema 5 have no outputs.
            step_outputs_sql: if schema < 5 { "NULL" } else { "s.outputs" },
            // Attempts recorded before schema 6 are attempts (catch handlers came with it).
            attempt_kind_sql: if schema < 6 { "'attempt'" } else { "kind" },
            // Attempts recorded before schema 9 say nothing of a kill after the grace.
            attempt_killed_sql: if schema < 9 { "NULL" } else { "killed" },
            // Before schema 9 a run's definition was a column of its row.
            definition_sql: if schema < 9 { "definition" } else { DEFINITION },
            lazy_steps: schema >= 10,
            // Runs recorded before schema 11 have no time of reopening.
            run_reopened_sql: if schema < 11 { "NULL" } else { "reopened_at" },
            positions: RefCell::new(HashMap::new()),
        }
    }

    /// Open (creating if needed) the database in `state_dir`.
    pub fn open(state_dir: &StateDir) -> Result<SqliteStore, StoreError> {
        let path = state_dir.db();
        let sql = |e| failure(&path, e);
        // Never through a symlink (the state directory was checked, this closes the gap since).
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NOFOLLOW
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(&path, flags).map_err(sql)?;
        // The database holds commands and errors: keep it private like the logs.
        let _ = std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600));
        unversioned(&conn, &path)?;
        let mut store = SqliteStore::with(conn, path, SCHEMA_VERSION);
        store.init().map_err(|e| failure(&store.path, e))?;
        store.file_id = Some(
            file_id(&store.path)
                .map_err(|e| StoreError::failed(StoreErrorKind::Other, &store.location, e.to_string()))?,
        );
        // No checkpoint when the connection closes: it would cost two more flushes at the end of
        // every run, and the WAL it deletes would be created anew by the next run (a flush of the
        // directory and of the new WAL). The WAL stays, as durable as it was (every run ends with
        // a full sync of it), and SQLite's automatic checkpoints still bound its size.
        store
            .conn
            .set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)
            .map_err(|e| store.sql(e))?;
        let found: i64 = store.conn.query_row("PRAGMA user_version", [], |r| r.get(0)).map_err(|e| store.sql(e))?;
        if found > SCHEMA_VERSION {
            return Err(newer_schema(&store.path, found));
        }
        // The write-ahead log as it is now (opening made it): from here on it must stay.
        store.check_wal()?;
        Ok(store)
    }

    /// A store with no runs, kept in memory, for a looking command where nothing was ever
    /// recorded; `location` is where it looked (a file, or a shared store's URL).
    pub(crate) fn empty(location: PathBuf) -> Result<SqliteStore, StoreError> {
        let conn = Connection::open_in_memory().map_err(|e| failure(&location, e))?;
        let mut store = SqliteStore::with(conn, location.clone(), SCHEMA_VERSION);
        store.init().map_err(|e| failure(&location, e))?;
        Ok(store)
    }

    /// Open the database in `state_dir` read-only, for commands that only look: nothing is
    /// written, not even a schema or a WAL file. Where there is no database yet, or an empty
    /// (0-byte) file, an empty in-memory one stands in: no runs yet.
    pub(crate) fn open_for_reading(state_dir: &StateDir) -> Result<SqliteStore, StoreError> {
        let path = state_dir.db();
        let empty = || SqliteStore::empty(path.clone());
        match std::fs::symlink_metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return empty(),
            Ok(meta) if meta.is_file() && meta.len() == 0 => return empty(),
            _ => {}
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_NOFOLLOW
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI;
        let version = |conn: &Connection| -> rusqlite::Result<i64> {
            conn.busy_timeout(std::time::Duration::from_secs(10))?;
            conn.query_row("PRAGMA user_version", [], |r| r.get(0))
        };
        let mut conn = Connection::open_with_flags(&path, flags).map_err(|e| failure(&path, e))?;
        let found = match version(&conn) {
            Ok(v) => v,
            // A WAL database can be read without writing only if its -shm index exists or can be
            // created; in a read-only directory, when no runner left one, nobody can be writing
            // it either, so it is read as an immutable file.
            Err(rusqlite::Error::SqliteFailure(e, _))
                if matches!(e.code, rusqlite::ErrorCode::CannotOpen | rusqlite::ErrorCode::ReadOnly) =>
            {
                conn = Connection::open_with_flags(immutable_uri(&path), flags).map_err(|e| failure(&path, e))?;
                version(&conn).map_err(|e| failure(&path, e))?
            }
            Err(e) => return Err(failure(&path, e)),
        };
        if found > SCHEMA_VERSION {
            return Err(newer_schema(&path, found));
        }
        if found == 0 {
            unversioned(&conn, &path)?;
            // A database without waymark's schema (created, never written): no runs yet.
            return empty();
        }
        Ok(SqliteStore::with(conn, path, found))
    }

    /// A run and its steps, read in one transaction: a consistent snapshot.
    fn snapshot(&self, id: &str) -> Result<(RunRecord, Vec<StepRecord>), StoreError> {
        let tx = self.conn.unchecked_transaction().map_err(|e| self.sql(e))?;
        let run = self.run(id)?;
        let steps = self.steps(id)?;
        tx.commit().map_err(|e| self.sql(e))?;
        Ok((run, steps))
    }

    /// Where the row of step `step` of run `run_id` goes when the step first moves (see
    /// [`MIGRATE_TO_10`]): its position in the run's list of steps, read once per run. `None`
    /// when the step has a row already as far as this store knows (it wrote it, see
    /// [`Self::row_written`], or the run was recorded before schema 10 with a row per step), or
    /// when the step is not the run's: the `UPDATE` that moves it then finds no row, and says so.
    /// So does a step of a list that names a step twice (changed behind waymark's back), which
    /// gives no positions.
    fn position(&mut self, run_id: &str, step: &str) -> Result<Option<i64>, StoreError> {
        if !self.lazy_steps {
            return Ok(None);
        }
        if !self.positions.get_mut().contains_key(run_id) {
            let json = self.step_list(run_id).map_err(|e| self.sql(e))?;
            let positions = match json {
                None => None,
                Some(json) => {
                    let names = step_names(&json, run_id).map_err(|e| self.sql(e))?;
                    StepPositions::of(names.iter().enumerate().map(|(i, &name)| (name, i as i64)))
                }
            };
            self.positions.get_mut().insert(run_id.to_owned(), positions);
        }
        Ok(self.positions.get_mut().get(run_id).and_then(Option::as_ref).and_then(|p| p.get(step)))
    }

    /// The positions of steps `steps` of run `run_id` whose rows may not be written yet (a
    /// skipped step may never have moved: its row is written first, see `MIGRATE_TO_10`).
    fn positions(&mut self, run_id: &str, steps: &[String]) -> Result<Vec<Option<i64>>, StoreError> {
        steps.iter().map(|step| self.position(run_id, step)).collect()
    }

    /// Step `step` of run `run_id` has a row now, committed: its later attempts need not write
    /// one (an `INSERT` that finds the row was 3% of a failing attempt's instructions).
    fn row_written(&mut self, run_id: &str, step: &str) {
        if let Some(Some(positions)) = self.positions.get_mut().get_mut(run_id) {
            positions.remove(step);
        }
    }

    /// Run `run_id`'s list of steps (see [`MIGRATE_TO_10`]), as recorded: `None` for a run
    /// recorded before schema 10 (it has a row per step) or one without a definition's row.
    fn step_list(&self, run_id: &str) -> rusqlite::Result<Option<String>> {
        let mut stmt = self.conn.prepare_cached("SELECT steps FROM definitions WHERE run_id = ?1")?;
        Ok(stmt.query_row([run_id], |r| r.get::<_, Option<String>>(0)).optional()?.flatten())
    }

    /// The steps of run `run_id` that have no row yet, pending, put in their places in `placed`
    /// (the rows read at their places in the run's list, `names`; `strays`, the rows read that
    /// are not at theirs): each name of the list that no row has (see [`MIGRATE_TO_10`]). A step
    /// that has had an attempt has a row, written with its first one: one without (deleted behind
    /// waymark's back) is left out, for the caller to report as a step with no recorded state, as
    /// before.
    fn add_unmoved<'n>(
        &self,
        run_id: &str,
        names: &[&'n str],
        placed: &mut [Option<StepRecord>],
        strays: &[Vec<(i64, StepRecord)>],
    ) -> rusqlite::Result<Vec<usize>> {
        // A row changed behind waymark's back (not at its name's place) is matched by name.
        let stray: HashSet<&str, FastHash> = strays.iter().flatten().map(|(_, step)| step.name.as_str()).collect();
        let mut missing: HashMap<&'n str, usize, FastHash> = names
            .iter()
            .enumerate()
            .filter(|&(p, name)| placed[p].is_none() && !stray.contains(name))
            .map(|(p, name)| (*name, p))
            .collect();
        if !missing.is_empty() {
            self.drop_attempted(run_id, names, &mut missing)?;
        }
        // Where the rows of these steps go when they first move: the list need not be read again
        // for it (for a 10,000-step run half done, 3% of the resume's instructions to its first
        // child). The steps with rows are left out; no row is ever deleted but with its run.
        self.positions
            .borrow_mut()
            .entry(run_id.to_owned())
            .or_insert_with(|| StepPositions::of(missing.iter().map(|(&name, &p)| (name, p as i64))));
        let mut unmoved = Vec::with_capacity(missing.len());
        for (name, p) in missing {
            placed[p] = Some(StepRecord::pending(name));
            unmoved.push(p);
        }
        unmoved.sort_unstable();
        Ok(unmoved)
    }

    /// Of `missing` (names of run `run_id`'s list without a row, each to its position in
    /// `names`), leave out the ones an attempt (or catch handler) names. The names of the run's
    /// attempts come from their index; a hook's name (`on_exit`) may be a step's too, so a name
    /// found is then checked for an attempt of its own.
    fn drop_attempted(
        &self,
        run_id: &str,
        names: &[&str],
        missing: &mut HashMap<&str, usize, FastHash>,
    ) -> rusqlite::Result<()> {
        let mut attempted = Vec::new();
        let mut stmt = self.conn.prepare_cached("SELECT DISTINCT step FROM attempts WHERE run_id = ?1")?;
        let mut rows = stmt.query([run_id])?;
        while let Some(row) = rows.next()? {
            if let Some(&p) = row.get_ref(0)?.as_str().ok().and_then(|name| missing.get(name)) {
                attempted.push(p);
            }
        }
        let mut own = self.conn.prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM attempts WHERE run_id = ?1 AND step = ?2 AND kind IN ('attempt', 'catch'))",
        )?;
        for p in attempted {
            if own.query_row(params![run_id, names[p]], |r| r.get::<_, bool>(0))? {
                missing.remove(names[p]);
            }
        }
        Ok(())
    }

    /// Each step's recorded state, in flow order (see [`Store::steps`]), read in the caller's
    /// transaction.
    fn steps_read(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        // The run's list of steps (see [`MIGRATE_TO_10`]), read first: each row read goes
        // straight into its place in it.
        let list = if self.lazy_steps { self.step_list(run_id).map_err(|e| self.sql(e))? } else { None };
        let names = match &list {
            Some(json) => step_names(json, run_id).map_err(|e| self.sql(e))?,
            None => Vec::new(),
        };
        let mut stmt = self
            .conn
            .prepare_cached(&format!(
                // Read by position below: 0 name, 1 state, 2 attempts_used, 3 budget_base,
                // 4 next_attempt, 5 wake_at, 6 current_row, 7 last_error, 8 started_at,
                // 9 ended_at, 10 the attempt's pid, 11 its process start, 12 its number,
                // 13 outputs, 14 position, 15 the outcome of the attempt or handler in flight.
                // Read in the primary key's order and put in order of position below: an
                // `ORDER BY` sorted every row (all columns) in SQLite, about a third of reading a
                // 10,000-step run.
                "SELECT s.name, s.state, s.attempts_used, s.budget_base, s.next_attempt, s.wake_at, s.current_row,
                        s.last_error, s.started_at, s.ended_at, a.pid, a.proc_start, a.attempt, {}, s.position,
                        a.outcome
                 FROM steps s LEFT JOIN attempts a ON a.row = s.current_row
                 WHERE s.run_id = ?1",
                self.step_outputs_sql
            ))
            .map_err(|e| self.sql(e))?;
        let rows = stmt
            .query_map([run_id], |r| {
                let name: String = r.get(0)?;
                let bad = |what: String| bad_row("steps", run_id, format!("step `{name}`: {what}"));
                // Borrowed from the row: no copy to parse.
                let state = r.get_ref(1)?.as_str().map_err(|e| bad(e.to_string()))?;
                let state = match StepStatus::parse(state).map_err(|e| bad(e.to_string()))? {
                    StepStatus::Pending => StepState::Pending,
                    StepStatus::Succeeded => StepState::Succeeded,
                    StepStatus::Failed => StepState::Failed,
                    StepStatus::Skipped => StepState::Skipped,
                    StepStatus::Caught => StepState::Caught,
                    StepStatus::Catching => StepState::Catching {
                        attempt: r.get(2)?,
                        in_flight: match r.get::<_, Option<i64>>(6)? {
                            Some(row) => Some((row, r.get(10)?, r.get::<_, Option<i64>>(11)?.map(|v| v as u64))),
                            None => None,
                        },
                    },
                    StepStatus::Waiting => {
                        StepState::Waiting { next_attempt: r.get(4)?, wake_at: from_millis(r.get(5)?) }
                    }
                    StepStatus::Running => {
                        // A running step names its attempt: without it there is nothing to redeliver.
                        let (Some(row), Some(attempt)) = (r.get::<_, Option<i64>>(6)?, r.get::<_, Option<u32>>(12)?)
                        else {
                            return Err(bad("running, but its attempt is not recorded".into()));
                        };
                        StepState::InFlight {
                            attempt,
                            row,
                            pid: r.get(10)?,
                            proc_start: r.get::<_, Option<i64>>(11)?.map(|v| v as u64),
                        }
                    }
                };
                let outputs = match r.get::<_, Option<String>>(13)? {
                    None => BTreeMap::new(),
                    Some(json) => serde_json::from_str(&json).map_err(|e| {
                        bad("its outputs are not a JSON object of strings: ".to_owned() + &e.to_string())
                    })?,
                };
                let position: i64 = r.get(14)?;
                // Borrowed, as the state is.
                let lost =
                    matches!(&state, StepState::InFlight { .. } | StepState::Catching { in_flight: Some(_), .. })
                        && r.get_ref(15)?.as_str_or_null().map_err(|e| bad(e.to_string()))? == Some("runner_lost");
                Ok((
                    position,
                    StepRecord {
                        name,
                        state,
                        attempts_used: r.get(2)?,
                        budget_base: r.get(3)?,
                        last_error: parse_error(r.get(7)?).map(Box::new),
                        started_at: r.get::<_, Option<i64>>(8)?.map(from_millis),
                        ended_at: r.get::<_, Option<i64>>(9)?.map(from_millis),
                        outputs,
                        lost,
                    },
                ))
            })
            .map_err(|e| self.sql(e))?;
        // Each record at its place in the list: the records are then in order where they were
        // read, with no copy (reading them into chunks, adding the unmoved steps, and ordering
        // all into a vector of their own touched 4 MB of new memory for a 10,000-step run half
        // done, a page fault per 4 KB: a sixth of its resume's page faults).
        let mut placed: Vec<Option<StepRecord>> = std::iter::repeat_with(|| None).take(names.len()).collect();
        // The others (all, for a run without a list), to be put in the order of their positions.
        let mut chunks: Vec<Vec<(i64, StepRecord)>> = Vec::new();
        for row in rows {
            let (position, step) = row.map_err(|e| self.sql(e))?;
            let place = usize::try_from(position).ok().filter(|&p| names.get(p) == Some(&step.name.as_str()));
            match place.and_then(|p| placed.get_mut(p)).filter(|place| place.is_none()) {
                Some(place) => *place = Some(step),
                None => push_chunked(&mut chunks, (position, step)),
            }
        }
        if list.is_none() {
            if self.lazy_steps {
                self.positions.borrow_mut().entry(run_id.to_owned()).or_insert(None);
            }
            return Ok(in_position_order(chunks));
        }
        let unmoved = self.add_unmoved(run_id, &names, &mut placed, &chunks).map_err(|e| self.sql(e))?;
        if chunks.is_empty() {
            // Collected in place (`flatten` is not): the records stay in the memory read into.
            #[allow(clippy::filter_map_identity)]
            return Ok(placed.into_iter().filter_map(|step| step).collect());
        }
        // Rows not at their places (changed behind waymark's back): all are ordered by position as
        // they were before the rows were placed, the rows in the order read (the primary key's,
        // by name), then the unmoved steps in order, so that steps whose positions tie come out
        // as they did.
        let mut pending: Vec<(i64, StepRecord)> = Vec::with_capacity(unmoved.len());
        for &p in &unmoved {
            if let Some(step) = placed[p].take() {
                pending.push((p as i64, step));
            }
        }
        let mut rows: Vec<(i64, StepRecord)> = chunks.into_iter().flatten().collect();
        rows.extend(placed.into_iter().enumerate().filter_map(|(p, step)| Some((p as i64, step?))));
        rows.sort_by(|a, b| a.1.name.cmp(&b.1.name));
        Ok(in_position_order(vec![rows, pending]))
    }

    fn init(&mut self) -> rusqlite::Result<()> {
        self.conn.busy_timeout(std::time::Duration::from_secs(10))?;
        self.conn.pragma_update(None, "journal_mode", "WAL")?;
        self.conn.pragma_update(None, "synchronous", "NORMAL")?;
        self.conn.pragma_update(None, "foreign_keys", "ON")?;
        if self.conn.query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0))? >= SCHEMA_VERSION {
            return Ok(());
        }
        // Several waymark processes may open a new database at once: check again and create or
        // migrate the schema under the write lock, so exactly one of them does it.
        let tx = self.conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let version: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        if version == 0 {
            tx.execute_batch(CURRENT_SCHEMA)?;
        } else {
            migrate(&tx, version)?;
        }
        if version < SCHEMA_VERSION {
            tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
        }
        tx.commit()?;
        // Moving every run's definition (schema 9) wrote as much to the log as the definitions
        // hold, and the log keeps its largest size: it is checkpointed and cut back once, here.
        // (Busy readers leave it as it is, to be done by SQLite's own checkpoints.)
        if (1..9).contains(&version) {
            self.conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        }
        Ok(())
    }

    fn sql(&self, source: rusqlite::Error) -> StoreError {
        match source {
            rusqlite::Error::FromSqlConversionFailure(column, kind, e) => match e.downcast::<BadRow>() {
                Ok(bad) => StoreError::BadState {
                    location: self.location.clone(),
                    table: bad.table,
                    run_id: bad.run_id,
                    what: bad.what,
                },
                Err(e) => match e.downcast::<LostLease>() {
                    Ok(lost) => StoreError::LeaseLost {
                        run_id: lost.run_id,
                        location: self.location.clone(),
                        owner: lost.owner,
                        holder: lost.holder,
                    },
                    Err(e) => failure(&self.path, rusqlite::Error::FromSqlConversionFailure(column, kind, e)),
                },
            },
            source => failure(&self.path, source),
        }
    }

    /// Run `f` in a transaction; `durable` commits with a full sync. One connection makes every
    /// commit: `synchronous` is switched to `FULL` around a durable one. (A second connection
    /// kept at `FULL` had to read again, at each of its commits, the pages the first one had
    /// changed since: 12% of a step's instructions.) BEGIN and COMMIT are prepared once
    /// (rusqlite's transactions parse them every time); the switches are not, as a `PRAGMA`
    /// takes effect when it is prepared, not when a prepared one is run again.
    fn write<T>(&mut self, durable: bool, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T, StoreError> {
        let conn = &self.conn;
        let step = |sql: &str| conn.prepare_cached(sql).and_then(|mut s| s.execute([])).map(|_| ());
        let result = (|| {
            if durable {
                conn.execute_batch("PRAGMA synchronous = FULL")?;
            }
            // IMMEDIATE takes the write lock up front, so a busy database is waited for (busy
            // timeout) instead of failing when a read would have to upgrade to a write.
            step("BEGIN IMMEDIATE")?;
            match f(conn).and_then(|out| step("COMMIT").map(|()| out)) {
                Ok(out) => Ok(out),
                Err(e) => {
                    // Nothing of a failed write stays (a failed COMMIT may leave it open).
                    if !conn.is_autocommit() {
                        let _ = conn.execute_batch("ROLLBACK");
                    }
                    Err(e)
                }
            }
        })();
        if durable {
            // Set back whatever the outcome; should it fail, later commits are flushed too.
            let _ = conn.execute_batch("PRAGMA synchronous = NORMAL");
            self.flushed += u64::from(result.is_ok());
        }
        let out = result.map_err(|e| self.sql(e))?;
        // One `lstat`: the path no longer leads to the file this wrote to.
        if let Some(id) = self.file_id
            && file_id(&self.path).ok() != Some(id)
        {
            return Err(StoreError::failed(StoreErrorKind::Deleted, &self.location, ""));
        }
        self.check_wal()?;
        Ok(out)
    }

    /// One more `lstat`: the write-ahead log, which holds every write since the last checkpoint
    /// (all of a new state directory's first thousand pages), is still the file this connection
    /// writes to. Deleted under it (a clean-up of `*-wal` files, say), it would take every write
    /// since then with it when the connection closes, and the next runner would run the finished
    /// steps again: what it holds is copied into the database first (SQLite still reads it
    /// through its descriptor), then the writer stops as for a deleted database.
    fn check_wal(&mut self) -> Result<(), StoreError> {
        if self.file_id.is_none() {
            return Ok(());
        }
        let now = file_id(&self.wal).ok();
        match self.wal_id {
            // Known from when the store opened (or the first write after, had it none then).
            None => {
                self.wal_id = now;
                return Ok(());
            }
            Some(id) if now == Some(id) => return Ok(()),
            Some(_) => {}
        }
        let shown = self.wal.display().to_string();
        let saved = self.conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get::<_, i64>(0));
        let what = match saved {
            Ok(0) => "what was recorded is saved in the database (copied from the deleted log through the \
                      descriptor SQLite still had), so nothing is lost"
                .to_owned(),
            Ok(_) => "what was recorded since the last checkpoint could not all be copied into the database (a \
                      reader held it back) and may be lost"
                .to_owned(),
            Err(e) => format!("what was recorded since the last checkpoint could not be saved ({e}) and may be lost"),
        };
        Err(StoreError::failed(
            StoreErrorKind::Deleted,
            &self.location,
            format!(
                "its write-ahead log {shown} was deleted or replaced while waymark was using it; {what}; waymark \
                 stops here (a runner kills its attempts first)"
            ),
        ))
    }

    /// A row of [`select_runs`], read by column position (a name would be looked up per column).
    fn run_from_row(r: &rusqlite::Row) -> rusqlite::Result<RunRecord> {
        let id: String = r.get(0)?;
        let status: String = r.get(5)?;
        let status = RunStatus::parse(&status).map_err(|e| bad_row("runs", &id, e))?;
        let key: String = r.get(11)?;
        let flow: String = r.get(1)?;
        let key = match FlowKey::parse(&key) {
            Some(key) => key,
            // Only a row inserted by an older waymark while this one migrated has no key.
            None if key.is_empty() => FlowKey::named(&flow),
            None => return Err(bad_row("runs", &id, format!("unknown flow key `{key}`"))),
        };
        Ok(RunRecord {
            id,
            key,
            flow,
            flow_path: PathBuf::from(r.get::<_, String>(2)?),
            definition: r.get(3)?,
            source_hash: r.get(4)?,
            status,
            started_at: from_millis(r.get(6)?),
            ended_at: r.get::<_, Option<i64>>(7)?.map(from_millis),
            pid: r.get(8)?,
            host: r.get(9)?,
            failed_step: r.get(10)?,
            reopened_at: r.get::<_, Option<i64>>(12)?.map(from_millis),
        })
    }
}

impl SqliteStore {
    /// An attempt's log stem as recorded (`.../logs/RUN_ID/STEP/attempt-N`, a path of the state
    /// directory it ran in), in the state directory the database is in now: the two move
    /// together (a state directory moved or restored elsewhere), and a copy's logs are the copy's,
    /// not those of the directory it was copied from.
    fn here(&self, run_id: &str, recorded: String) -> PathBuf {
        // Compared as text: a run's attempts are read by the thousand on resume.
        let Some(logs) = self.logs.as_deref().filter(|logs| !recorded.starts_with(logs)) else {
            return PathBuf::from(recorded);
        };
        let under = format!("/{}/", statedir::LOGS);
        match recorded.rfind(&format!("{under}{run_id}/")) {
            Some(at) => PathBuf::from(format!("{logs}{}", &recorded[at + under.len()..])),
            None => PathBuf::from(recorded),
        }
    }

    /// The attempts of run `?1`, or of its step `?2` if `one_step`, for [`Store::attempts`].
    fn attempts_sql(&self, one_step: bool) -> String {
        // One step's are found in the index by its name too (`?2 IS NULL OR step = ?2` read every
        // attempt of the run to find them).
        let which = if one_step { "step = ?2" } else { "?2 IS NULL" };
        // Read by position: 0 row, 1 step, 2 attempt, 3 outcome, 4 log_stem, 5 host, 6 started_at,
        // 7 ended_at, 8 redelivered, 9 error, 10 killed (by name, each column's name was looked up
        // among all of them for every row). In the index's order, sorted by row by the caller: an
        // `ORDER BY row` sorted every row (all columns) in SQLite, more than half of reading a
        // run's 5,000 attempts.
        format!(
            "SELECT row, step, attempt, outcome, log_stem, {}, started_at, ended_at, redelivered, error, {}
             FROM attempts WHERE run_id = ?1 AND {which} AND {} = 'attempt'",
            self.attempt_host_sql, self.attempt_killed_sql, self.attempt_kind_sql
        )
    }

    /// The compensations and hooks of run `?1`, for [`Store::aux_runs`].
    fn aux_sql(&self) -> String {
        let kind = self.attempt_kind_sql;
        // The condition of [`MIGRATE_TO_9`]'s index, written as there, for the index to serve.
        format!(
            "SELECT {kind} AS k, step, outcome, row, pid, proc_start, started_at, ended_at, exit_code, error
             FROM attempts
             WHERE run_id = ?1 AND {kind} IN ('compensate', 'hook') ORDER BY row"
        )
    }

    /// The catch handlers of run `?1`, for [`Store::handlers`] (none before schema 6, which
    /// brought them).
    fn handlers_sql(&self) -> String {
        format!(
            "SELECT step, attempt, outcome, exit_code, error, log_stem, {} FROM attempts
             WHERE run_id = ?1 AND {} = 'catch' ORDER BY row",
            self.attempt_host_sql, self.attempt_kind_sql
        )
    }

    /// The `WHERE` condition of a filter, with its value as `?1`.
    fn filter_sql(&self, filter: RunFilter<'_>) -> (String, Option<String>) {
        match filter {
            RunFilter::All => ("?1 IS NULL".into(), None),
            RunFilter::Name(name) => ("flow = ?1".into(), Some(name.to_owned())),
            RunFilter::File(path) => ("flow_path = ?1".into(), Some(path.display().to_string())),
            RunFilter::Key(key) => (format!("{} = ?1", self.key_sql), Some(key.as_str().to_owned())),
        }
    }
}

impl Store for SqliteStore {
    fn location(&self) -> &str {
        &self.location
    }

    fn create_run(&mut self, flow: &Flow, source_hash: &str, owner: &str) -> Result<(RunRecord, Lease), StoreError> {
        let lease = Lease { owner: owner.to_owned(), token: 1 };
        let definition = RunDefinition::recorded(flow, &self.location)?;
        // The steps get no rows yet (see `MIGRATE_TO_10`): their names, in order, go with the
        // definition, and each one's position is kept here for when it first moves.
        let positions = flow.steps.iter().enumerate().map(|(i, s)| (s.name.as_str(), i as i64));
        // Validation refuses a flow with two steps of one name; a map of names cannot hold both.
        let Some(positions) = StepPositions::of(positions) else {
            let why = format!("flow {} has two steps of the same name (a bug in waymark's validation)", flow.name);
            return Err(StoreError::failed(StoreErrorKind::Other, &self.location, why));
        };
        let names =
            serde_json::to_string(&flow.steps.iter().map(|s| s.name.as_str()).collect::<Vec<_>>()).unwrap_or_default();
        let host = host_name();
        let pid = std::process::id();
        let started = now_ms();
        // `synchronous=NORMAL`: a run's creation needs no flush of its own. The first step to
        // finish flushes the WAL, this commit included; a power loss before then loses a run in
        // which nothing had finished, and the next `waymark run` starts it anew.
        let id = self.write(false, |tx| {
            let seq: i64 = tx.query_row("SELECT COALESCE(MAX(seq), 0) + 1 FROM runs", [], |r| r.get(0))?;
            let mut id = new_run_id();
            while tx.query_row("SELECT 1 FROM runs WHERE id = ?1", [&id], |_| Ok(())).optional()?.is_some() {
                id = new_run_id();
            }
            tx.execute(
                "INSERT INTO runs (id, seq, flow, flow_key, flow_path, source_hash, status, started_at, pid, host,
                                   lease_owner, lease_token)
                 VALUES (?1, ?2, ?3, ?9, ?4, ?5, 'running', ?6, ?7, ?8, ?10, ?11)",
                params![
                    id,
                    seq,
                    flow.name,
                    flow.path.display().to_string(),
                    source_hash,
                    started,
                    pid,
                    host,
                    FlowKey::of(flow).as_str(),
                    lease.owner,
                    lease.token
                ],
            )?;
            tx.execute(
                "INSERT INTO definitions (run_id, definition, steps) VALUES (?1, ?2, ?3)",
                params![id, definition, names],
            )?;
            Ok(id)
        })?;
        self.positions.get_mut().insert(id.clone(), Some(positions));
        let record = RunRecord::created(flow, id, definition, source_hash, started, host);
        Ok((record, lease))
    }

    fn run(&self, id: &str) -> Result<RunRecord, StoreError> {
        self.conn
            .prepare_cached(&format!("{} WHERE id = ?1", select_runs(self)))
            .and_then(|mut stmt| stmt.query_row([id], Self::run_from_row))
            .optional()
            .map_err(|e| self.sql(e))?
            .ok_or_else(|| StoreError::NoSuchRun(id.to_owned()))
    }

    fn run_and_steps(&self, id: &str) -> Result<(RunRecord, Vec<StepRecord>), StoreError> {
        self.snapshot(id)
    }

    fn find_resumable(&self, key: &FlowKey) -> Result<Option<RunRecord>, StoreError> {
        self.conn
            .query_row(&resumable_sql(self), [key.as_str()], Self::run_from_row)
            .optional()
            .map_err(|e| self.sql(e))
    }

    fn list_runs(&self, filter: RunFilter<'_>, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let (cond, value) = self.filter_sql(filter);
        let sql = format!("{} WHERE {cond} ORDER BY seq DESC LIMIT ?2", select_runs(self));
        let mut stmt = self.conn.prepare(&sql).map_err(|e| self.sql(e))?;
        let rows = stmt.query_map(params![value, limit], Self::run_from_row).map_err(|e| self.sql(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.sql(e))
    }

    fn unfinished_runs(&self, filter: RunFilter<'_>, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let (cond, value) = self.filter_sql(filter);
        let mut stmt = self.conn.prepare(&unfinished_sql(self, &cond)).map_err(|e| self.sql(e))?;
        let rows = stmt.query_map(params![value, limit], Self::run_from_row).map_err(|e| self.sql(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.sql(e))
    }

    fn flows(&self, filter: RunFilter<'_>) -> Result<Vec<(FlowKey, PathBuf)>, StoreError> {
        let (cond, value) = self.filter_sql(filter);
        // Newest run first, so the first row of each key is its newest path.
        let sql = format!("SELECT {} AS key, flow_path FROM runs WHERE {cond} ORDER BY seq DESC", self.key_sql);
        let mut stmt = self.conn.prepare(&sql).map_err(|e| self.sql(e))?;
        let rows = stmt
            .query_map(params![value], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
            .map_err(|e| self.sql(e))?;
        let mut out: Vec<(FlowKey, PathBuf)> = Vec::new();
        for row in rows {
            let (key, path) = row.map_err(|e| self.sql(e))?;
            let key = FlowKey::parse(&key).unwrap_or(FlowKey(key));
            if !out.iter().any(|(k, _)| *k == key) {
                out.push((key, PathBuf::from(path)));
            }
        }
        Ok(out)
    }

    fn steps(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        // The rows, the run's list of steps and its attempts are read by three statements (see
        // `add_unmoved`): in one read transaction, so that a step whose first attempt a runner
        // commits in between is not taken for one whose row is gone. (`snapshot` has one open.)
        if self.conn.is_autocommit() {
            let tx = self.conn.unchecked_transaction().map_err(|e| self.sql(e))?;
            let steps = self.steps_read(run_id)?;
            tx.commit().map_err(|e| self.sql(e))?;
            return Ok(steps);
        }
        self.steps_read(run_id)
    }

    fn attempts(&self, run_id: &str, step: Option<&str>) -> Result<Vec<AttemptRecord>, StoreError> {
        let mut stmt = self.conn.prepare_cached(&self.attempts_sql(step.is_some())).map_err(|e| self.sql(e))?;
        let rows = stmt
            .query_map(params![run_id, step], |r| {
                let step: String = r.get(1)?;
                let attempt: u32 = r.get(2)?;
                // Borrowed from the row: no copy to parse. A state this binary does not know is refused.
                let bad = |e: &dyn std::fmt::Display| {
                    bad_row("attempts", run_id, format!("attempt {attempt} of step `{step}`: {e}"))
                };
                let outcome = r.get_ref(3)?.as_str().map_err(|e| bad(&e))?;
                let outcome = AttemptState::parse(outcome).map_err(|e| bad(&e))?;
                let row: i64 = r.get(0)?;
                Ok((
                    row,
                    AttemptRecord {
                        step,
                        attempt,
                        log_stem: self.here(run_id, r.get(4)?),
                        host: r.get(5)?,
                        outcome,
                        started_at: from_millis(r.get(6)?),
                        ended_at: r.get::<_, Option<i64>>(7)?.map(from_millis),
                        redelivered: r.get::<_, i64>(8)? != 0,
                        error: parse_error(r.get(9)?),
                        killed_after_grace: r.get::<_, Option<i64>>(10)?.map(|k| k != 0),
                    },
                ))
            })
            .map_err(|e| self.sql(e))?;
        let mut read: Vec<(i64, AttemptRecord)> = rows.collect::<Result<_, _>>().map_err(|e| self.sql(e))?;
        // Oldest first: rows are unique, so the order is the one `ORDER BY row` gave.
        read.sort_unstable_by_key(|&(row, _)| row);
        Ok(read.into_iter().map(|(_, attempt)| attempt).collect())
    }

    fn claim(&mut self, run_id: &str, owner: &str) -> Result<Lease, StoreError> {
        let host = host_name();
        // `synchronous=NORMAL`, like a run's creation: a claim lost to a power loss is made again
        // by the next runner, and the first of this runner's commits that reaches the disk takes
        // it there (the log is written in order). A synced commit here cost the resume two
        // flushes (the log and, on a connection's first, its directory) before its first child.
        self.write(false, |tx| {
            move_run(tx, run_id, RunStatus::Running)?;
            // A new token: every earlier owner's writes are refused from this commit on.
            tx.execute(
                "UPDATE runs SET status = 'running', ended_at = NULL, failed_step = NULL, pid = ?2, host = ?3,
                        lease_owner = ?4, lease_token = lease_token + 1
                 WHERE id = ?1",
                params![run_id, std::process::id(), host, owner],
            )?;
            let token: i64 = tx.query_row("SELECT lease_token FROM runs WHERE id = ?1", [run_id], |r| r.get(0))?;
            // Attempts the dead runner left open ended with it.
            tx.execute(
                "UPDATE attempts SET outcome = 'runner_lost', ended_at = ?2 WHERE run_id = ?1 AND outcome = 'running'",
                params![run_id, now_ms()],
            )?;
            Ok(Lease { owner: owner.to_owned(), token })
        })
    }

    fn reopen_failed(&mut self, run_id: &str, at: SystemTime) -> Result<(), StoreError> {
        // Not flushed, like the claim that follows it: a power loss before this runner's first
        // flushed commit loses both and leaves the run failed as it was, rather than failed with
        // its steps reopened (the log is written in order: that flush takes both to the disk).
        self.write(false, |tx| {
            tx.execute(
                "UPDATE steps SET state = 'pending', budget_base = attempts_used, ended_at = NULL
                 WHERE run_id = ?1 AND state IN ('failed', 'skipped')",
                [run_id],
            )?;
            // Its hooks ran for the ending being reopened: kept for the record, but the run's next
            // ending runs them again (`aux_runs` returns only `hook` rows).
            tx.execute(
                "UPDATE attempts SET kind = 'hook_before_reopen' WHERE run_id = ?1 AND kind = 'hook'",
                [run_id],
            )?;
            tx.execute("UPDATE runs SET reopened_at = ?2 WHERE id = ?1", params![run_id, to_millis(at)])?;
            Ok(())
        })
    }

    fn aux_runs(&self, run_id: &str) -> Result<Vec<AuxRun>, StoreError> {
        let mut stmt = self.conn.prepare_cached(&self.aux_sql()).map_err(|e| self.sql(e))?;
        let rows = stmt
            .query_map([run_id], |r| {
                let kind = match r.get::<_, String>("k")?.as_str() {
                    "compensate" => AuxKind::Compensate,
                    _ => AuxKind::Hook,
                };
                let outcome: String = r.get("outcome")?;
                let state = AttemptState::parse(&outcome).map_err(|e| bad_row("attempts", run_id, e.to_string()))?;
                Ok(AuxRun {
                    kind,
                    name: r.get("step")?,
                    // A cancelled one runs again; one whose runner died is killed and runs again.
                    finished: matches!(state, AttemptState::Succeeded | AttemptState::Failed),
                    row: r.get("row")?,
                    pid: r.get("pid")?,
                    proc_start: r.get::<_, Option<i64>>("proc_start")?.map(|v| v as u64),
                    outcome: state,
                    started_at: from_millis(r.get("started_at")?),
                    ended_at: r.get::<_, Option<i64>>("ended_at")?.map(from_millis),
                    exit_code: r.get("exit_code")?,
                    error: parse_error(r.get("error")?),
                })
            })
            .map_err(|e| self.sql(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.sql(e))
    }

    fn handlers(&self, run_id: &str) -> Result<Vec<HandlerRun>, StoreError> {
        let mut stmt = self.conn.prepare_cached(&self.handlers_sql()).map_err(|e| self.sql(e))?;
        let rows = stmt
            .query_map([run_id], |r| {
                let outcome: String = r.get(2)?;
                Ok(HandlerRun {
                    step: r.get(0)?,
                    attempt: r.get(1)?,
                    outcome: AttemptState::parse(&outcome).map_err(|e| bad_row("attempts", run_id, e.to_string()))?,
                    exit_code: r.get(3)?,
                    error: parse_error(r.get(4)?),
                    log_stem: self.here(run_id, r.get(5)?),
                    host: r.get(6)?,
                })
            })
            .map_err(|e| self.sql(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.sql(e))
    }

    fn abandon(&mut self, run_id: &str, owner: &str) -> Result<(), StoreError> {
        self.write(true, |tx| {
            move_run(tx, run_id, RunStatus::Abandoned)?;
            // A new token, as a claim gives: the earlier owner's writes are refused from now on.
            tx.execute(
                "UPDATE runs SET status = ?2, ended_at = ?3, lease_owner = ?4, lease_token = lease_token + 1
                 WHERE id = ?1",
                params![run_id, RunStatus::Abandoned.as_str(), now_ms(), owner],
            )?;
            Ok(())
        })
    }

    fn finished_before(&self, cutoff: SystemTime) -> Result<Vec<RunRecord>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(&format!(
                "{} WHERE status IN ('succeeded', 'failed', 'abandoned') AND ended_at IS NOT NULL
                 AND ended_at < ?1 ORDER BY seq",
                select_runs(self)
            ))
            .map_err(|e| self.sql(e))?;
        let rows = stmt.query_map([to_millis(cutoff)], Self::run_from_row).map_err(|e| self.sql(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.sql(e))
    }

    fn delete_finished(&mut self, id: &str, cutoff: SystemTime) -> Result<bool, StoreError> {
        let cutoff = to_millis(cutoff);
        self.write(true, |tx| {
            // Checked again in the deleting transaction: `waymark resume` may have reopened it.
            let finished = tx
                .query_row(
                    "SELECT 1 FROM runs WHERE id = ?1 AND status IN ('succeeded', 'failed', 'abandoned')
                     AND ended_at IS NOT NULL AND ended_at < ?2",
                    params![id, cutoff],
                    |_| Ok(()),
                )
                .optional()?
                .is_some();
            if finished {
                tx.execute("DELETE FROM attempts WHERE run_id = ?1", [id])?;
                tx.execute("DELETE FROM steps WHERE run_id = ?1", [id])?;
                tx.execute("DELETE FROM definitions WHERE run_id = ?1", [id])?;
                tx.execute("DELETE FROM runs WHERE id = ?1", [id])?;
            }
            Ok(finished)
        })
    }

    fn deleted_elsewhere(&mut self, _ids: &[String]) -> Result<Vec<String>, StoreError> {
        // One host: its gc deletes a run's logs with the run.
        Ok(Vec::new())
    }
}

/// Record, in `tx`, that attempt `next` of run `run_id` is about to be spawned (its step moves
/// to `running`); its row id. `position` is the step's, when its row may be missing (see
/// [`SqliteStore::position`]). The caller checked the lease.
fn start_attempt(
    tx: &Connection,
    run_id: &str,
    next: &NextAttempt<'_>,
    position: Option<i64>,
    now: i64,
) -> rusqlite::Result<i64> {
    let NextAttempt { step, attempt, redelivered, log_stem } = *next;
    exec(
        tx,
        "INSERT INTO attempts (run_id, step, attempt, redelivered, outcome, started_at, log_stem, host)
         VALUES (?1, ?2, ?3, ?4, 'running', ?5, ?6, ?7)",
        params![run_id, step, attempt, redelivered, now, log_stem.display().to_string(), host_name()],
    )?;
    let row = tx.last_insert_rowid();
    let changed = match position {
        // A step that may have no row yet: inserted running (a step without a row is pending,
        // which may start), or, if it has one, moved as below. One statement, not two.
        Some(position) => exec(
            tx,
            "INSERT INTO steps (run_id, position, name, state, current_row, started_at)
             VALUES (?1, ?6, ?2, 'running', ?3, ?4)
             ON CONFLICT (run_id, name) DO UPDATE SET state = 'running', current_row = ?3, next_attempt = NULL,
                    wake_at = NULL, started_at = COALESCE(started_at, ?4)
             WHERE instr(?5, ',' || state || ',')",
            params![run_id, step, row, now, sources(StepStatus::Running), position],
        )?,
        None => exec(
            tx,
            "UPDATE steps SET state = 'running', current_row = ?3, next_attempt = NULL, wake_at = NULL,
                    started_at = COALESCE(started_at, ?4)
             WHERE run_id = ?1 AND name = ?2 AND instr(?5, ',' || state || ',')",
            params![run_id, step, row, now, sources(StepStatus::Running)],
        )?,
    };
    moved(tx, changed, run_id, step, StepStatus::Running)?;
    Ok(row)
}

/// Record, in `tx`, how attempt `row` of run `run_id` ended and what that does to its step. The
/// caller checked the lease.
fn finish_attempt(
    tx: &Connection,
    run_id: &str,
    row: i64,
    result: &AttemptResult,
    update: &StepUpdate,
) -> rusqlite::Result<()> {
    let ended = to_millis(result.ended_at);
    let (of_run, step, outcome, kind): (String, String, String, String) =
        query_row(tx, "SELECT run_id, step, outcome, kind FROM attempts WHERE row = ?1", [row], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })?;
    let what = |e: &dyn std::fmt::Display| format!("attempt {row} of step `{step}`: {e}");
    if of_run != run_id {
        return Err(bad_row("attempts", run_id, what(&format!("it is an attempt of run {of_run}"))));
    }
    let from = AttemptState::parse(&outcome).map_err(|e| bad_row("attempts", run_id, what(&e)))?;
    let to = result.outcome.state();
    if !from.can_move_to(to) {
        let e = format!("cannot go from {} to {}", from.as_str(), to.as_str());
        return Err(bad_row("attempts", run_id, what(&e)));
    }
    exec(
        tx,
        "UPDATE attempts SET outcome = ?2, ended_at = ?3, exit_code = ?4, signal = ?5, error = ?6, killed = ?7
         WHERE row = ?1",
        params![
            row,
            result.outcome.as_str(),
            ended,
            result.exit_code,
            result.signal,
            result.error.as_ref().map(error_json),
            result.killed_after_grace
        ],
    )?;
    // A catch handler's run uses no attempt of the budget, and its error is its own: the step
    // keeps the error it failed with.
    let used = i64::from(result.outcome != AttemptOutcome::Cancelled && kind == "attempt");
    let step_error = result.error.as_ref().filter(|_| kind == "attempt").map(error_json);
    let state = update.status().as_str();
    let (next, wake) = match update {
        StepUpdate::Waiting { next_attempt, wake_at } => (Some(*next_attempt), Some(to_millis(*wake_at))),
        StepUpdate::Succeeded
        | StepUpdate::Failed
        | StepUpdate::Pending
        | StepUpdate::Catching
        | StepUpdate::Caught => (None, None),
    };
    let ended_at = update.ends_step().then_some(ended);
    // Outputs are the success's: recorded with it, in this transaction, and only then.
    let outputs = match update {
        StepUpdate::Succeeded if !result.outputs.is_empty() => Some(outputs_json(&result.outputs)),
        _ => None,
    };
    let changed = exec(
        tx,
        "UPDATE steps SET state = ?3, attempts_used = attempts_used + ?4, next_attempt = ?5, wake_at = ?6,
                current_row = NULL, last_error = COALESCE(?7, last_error), ended_at = ?8,
                outputs = COALESCE(?9, outputs)
         WHERE run_id = ?1 AND name = ?2 AND instr(?10, ',' || state || ',')",
        params![run_id, step, state, used, next, wake, step_error, ended_at, outputs, sources(update.status())],
    )?;
    moved(tx, changed, run_id, &step, update.status())
}

impl RunLog for SqliteStore {
    fn attempt_starting(
        &mut self,
        lease: &Lease,
        run_id: &str,
        step: &str,
        attempt: u32,
        redelivered: bool,
        log_stem: &Path,
    ) -> Result<i64, StoreError> {
        let next = NextAttempt { step, attempt, redelivered, log_stem };
        let position = self.position(run_id, step)?;
        let now = now_ms();
        let row = self.write(false, |tx| {
            check_lease(tx, run_id, lease)?;
            start_attempt(tx, run_id, &next, position, now)
        })?;
        self.row_written(run_id, step);
        Ok(row)
    }

    fn handler_starting(
        &mut self,
        lease: &Lease,
        run_id: &str,
        step: &str,
        attempt: u32,
        log_stem: &Path,
    ) -> Result<i64, StoreError> {
        let now = now_ms();
        let host = host_name();
        self.write(false, |tx| {
            check_lease(tx, run_id, lease)?;
            exec(
                tx,
                "INSERT INTO attempts (run_id, step, attempt, redelivered, outcome, started_at, log_stem, host, kind)
                 VALUES (?1, ?2, ?3, 0, 'running', ?4, ?5, ?6, 'catch')",
                params![run_id, step, attempt, now, log_stem.display().to_string(), host],
            )?;
            let row = tx.last_insert_rowid();
            let changed = exec(
                tx,
                "UPDATE steps SET current_row = ?3
                 WHERE run_id = ?1 AND name = ?2 AND instr(?4, ',' || state || ',')",
                params![run_id, step, row, sources(StepStatus::Catching)],
            )?;
            moved(tx, changed, run_id, step, StepStatus::Catching)?;
            Ok(row)
        })
    }

    fn aux_starting(
        &mut self,
        lease: &Lease,
        run_id: &str,
        kind: AuxKind,
        name: &str,
        log_stem: &Path,
        skipped: &[String],
    ) -> Result<i64, StoreError> {
        let (now, host) = (now_ms(), host_name());
        let positions = self.positions(run_id, skipped)?;
        self.write(false, |tx| {
            check_lease(tx, run_id, lease)?;
            skip_steps(tx, run_id, skipped, &positions)?;
            exec(
                tx,
                "INSERT INTO attempts (run_id, step, attempt, redelivered, outcome, started_at, log_stem, host, kind)
                 VALUES (?1, ?2, 1, 0, 'running', ?3, ?4, ?5, ?6)",
                params![run_id, name, now, log_stem.display().to_string(), host, kind.as_str()],
            )?;
            Ok(tx.last_insert_rowid())
        })
    }

    fn aux_finished(&mut self, lease: &Lease, row: i64, result: &AttemptResult) -> Result<(), StoreError> {
        self.write(true, |tx| {
            check_lease_of_attempt(tx, row, lease)?;
            exec(
                tx,
                "UPDATE attempts SET outcome = ?2, ended_at = ?3, exit_code = ?4, signal = ?5, error = ?6
                 WHERE row = ?1 AND outcome = 'running'",
                params![
                    row,
                    result.outcome.as_str(),
                    to_millis(result.ended_at),
                    result.exit_code,
                    result.signal,
                    result.error.as_ref().map(error_json)
                ],
            )?;
            Ok(())
        })
    }

    fn attempt_spawned(
        &mut self,
        lease: &Lease,
        row: i64,
        pid: u32,
        proc_start: Option<u64>,
    ) -> Result<(), StoreError> {
        self.write(false, |tx| {
            // The lease is checked by the UPDATE itself: one statement where the check took two
            // more (the run of the attempt, then its lease). A write it refuses changed nothing,
            // and the full check then says why.
            let changed = exec(
                tx,
                "UPDATE attempts SET pid = ?2, proc_start = ?3
                 WHERE row = ?1 AND EXISTS (SELECT 1 FROM runs INDEXED BY runs_lease
                                            WHERE id = attempts.run_id AND lease_owner = ?4 AND lease_token = ?5)",
                params![row, pid, proc_start.map(|v| v as i64), lease.owner, lease.token],
            )?;
            if changed == 0 {
                let run_id = check_lease_of_attempt(tx, row, lease)?;
                return Err(bad_row("attempts", &run_id, format!("attempt {row}: its pid could not be recorded")));
            }
            Ok(())
        })
    }

    fn attempt_finished(
        &mut self,
        lease: &Lease,
        row: i64,
        result: &AttemptResult,
        update: &StepUpdate,
    ) -> Result<(), StoreError> {
        self.write(update.ends_step(), |tx| {
            let run_id = check_lease_of_attempt(tx, row, lease)?;
            finish_attempt(tx, &run_id, row, result, update)
        })
    }

    fn attempt_finished_then_starting(
        &mut self,
        lease: &Lease,
        run_id: &str,
        row: i64,
        result: &AttemptResult,
        update: &StepUpdate,
        next: &NextAttempt<'_>,
    ) -> Result<i64, StoreError> {
        let position = self.position(run_id, next.step)?;
        let now = now_ms();
        let row = self.write(update.ends_step(), |tx| {
            check_lease(tx, run_id, lease)?;
            finish_attempt(tx, run_id, row, result, update)?;
            start_attempt(tx, run_id, next, position, now)
        })?;
        self.row_written(run_id, next.step);
        Ok(row)
    }

    fn run_finished(
        &mut self,
        lease: &Lease,
        run_id: &str,
        status: RunStatus,
        failed_step: Option<&str>,
        skipped: &[String],
    ) -> Result<(), StoreError> {
        let positions = self.positions(run_id, skipped)?;
        self.write(true, |tx| {
            check_lease(tx, run_id, lease)?;
            move_run(tx, run_id, status)?;
            skip_steps(tx, run_id, skipped, &positions)?;
            exec(
                tx,
                "UPDATE runs SET status = ?2, ended_at = ?3, failed_step = ?4 WHERE id = ?1",
                params![run_id, status.as_str(), now_ms(), failed_step],
            )?;
            Ok(())
        })
    }
}

/// Mark `skipped` the steps of run `run_id` that will not run, writing the row of one that never
/// moved first (at its `positions`, see [`SqliteStore::positions`]).
fn skip_steps(tx: &Connection, run_id: &str, skipped: &[String], positions: &[Option<i64>]) -> rusqlite::Result<()> {
    let sources = sources(StepStatus::Skipped);
    for (step, position) in skipped.iter().zip(positions) {
        if let Some(position) = position {
            exec(tx, STEP_ROW, params![run_id, position, step])?;
        }
        let changed = exec(
            tx,
            "UPDATE steps SET state = 'skipped', next_attempt = NULL, wake_at = NULL, current_row = NULL
             WHERE run_id = ?1 AND name = ?2 AND instr(?3, ',' || state || ',')",
            params![run_id, step, sources],
        )?;
        moved(tx, changed, run_id, step, StepStatus::Skipped)?;
    }
    Ok(())
}

/// This runner's host, for the record (`--host-id`, else the machine's name): looked up once.
pub(crate) fn host_name() -> &'static str {
    super::lease::host_id()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_codes_map_to_kinds_and_the_hint_comes_from_the_kind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("waymark.db");
        let err = |code| rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None);
        for (code, kind) in [
            (rusqlite::ffi::SQLITE_BUSY, StoreErrorKind::Busy),
            (rusqlite::ffi::SQLITE_LOCKED, StoreErrorKind::Busy),
            (rusqlite::ffi::SQLITE_CORRUPT, StoreErrorKind::Corrupt),
            (rusqlite::ffi::SQLITE_NOTADB, StoreErrorKind::Corrupt),
            (rusqlite::ffi::SQLITE_FULL, StoreErrorKind::Full),
            (rusqlite::ffi::SQLITE_READONLY, StoreErrorKind::Permission),
            (rusqlite::ffi::SQLITE_PERM, StoreErrorKind::Permission),
            (rusqlite::ffi::SQLITE_IOERR, StoreErrorKind::Other),
            // The file can be opened by this user: not a permission problem.
            (rusqlite::ffi::SQLITE_CANTOPEN, StoreErrorKind::Other),
        ] {
            let e = failure(&path, err(code));
            assert_eq!(e.kind(), Some(kind), "{code}: {e}");
            assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        }
        let busy = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
            Some("database is locked".into()),
        );
        let busy = failure(&path, busy);
        assert_eq!(
            busy.to_string(),
            format!("state database {} is locked by another process: database is locked", path.display())
        );
        assert!(busy.hint().unwrap().starts_with(&format!("another process holds {} locked", path.display())));
        assert_eq!(failure(&path, err(rusqlite::ffi::SQLITE_NOTADB)).hint(), None, "the message says what to do");
        assert_eq!(newer_schema(&path, 12).kind(), Some(StoreErrorKind::NewerSchema));
        assert!(newer_schema(&path, 12).to_string().contains("(schema 12, this one knows 11)"));
    }

    fn result(outcome: AttemptOutcome) -> AttemptResult {
        AttemptResult {
            outcome,
            exit_code: Some(1),
            signal: None,
            error: None,
            ended_at: SystemTime::now(),
            killed_after_grace: false,
            outputs: BTreeMap::new(),
        }
    }

    /// The rows of a run's steps, by name (each with its state).
    fn step_rows(store: &SqliteStore, run_id: &str) -> Vec<(String, String)> {
        let mut stmt = store.conn.prepare("SELECT name, state FROM steps WHERE run_id = ?1 ORDER BY name").unwrap();
        stmt.query_map([run_id], |r| Ok((r.get(0)?, r.get(1)?))).unwrap().map(Result::unwrap).collect()
    }

    /// A new database numbers attempts without `AUTOINCREMENT` (see [`CURRENT_SCHEMA`]): no commit
    /// writes a `sqlite_sequence` page, and a run's rows still only grow, across its runners.
    #[test]
    fn a_new_database_numbers_attempts_without_a_sequence_table_and_a_runs_rows_grow() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::create(dir.path()).unwrap();
        let mut store = SqliteStore::open(&state).unwrap();
        let (run, lease) = store.create_run(&flow_of(2, dir.path()), "hash", "test:1:a").unwrap();
        let mut rows = Vec::new();
        for attempt in 1..=3 {
            let row = store.attempt_starting(&lease, &run.id, "s0", attempt, false, Path::new("x")).unwrap();
            store.attempt_finished(&lease, row, &result(AttemptOutcome::Failed), &StepUpdate::Pending).unwrap();
            rows.push(row);
        }
        let mut other = SqliteStore::open(&state).unwrap();
        rows.push(other.attempt_starting(&lease, &run.id, "s1", 1, false, Path::new("x")).unwrap());
        assert!(rows.windows(2).all(|w| w[0] < w[1]), "{rows:?}");
        let sequences: i64 = store
            .conn
            .query_row("SELECT count(*) FROM sqlite_master WHERE name = 'sqlite_sequence'", [], |r| r.get(0))
            .unwrap();
        assert_eq!(sequences, 0);
    }

    /// A new run writes no row for its steps (schema 10): they read back pending, in the flow's
    /// order, and each gets its row when it first moves, an attempt's start or a skip at the run's
    /// end. Another process reads the same; deleting the run deletes its steps and definition.
    #[test]
    fn a_step_gets_its_row_when_it_first_moves_and_reads_pending_until_then() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::create(dir.path()).unwrap();
        let mut store = SqliteStore::open(&state).unwrap();
        let (run, lease) = store.create_run(&flow_of(3, dir.path()), "hash", "test:1:a").unwrap();
        assert_eq!(step_rows(&store, &run.id), []);
        let states = |store: &SqliteStore| -> Vec<(String, StepState)> {
            store.steps(&run.id).unwrap().into_iter().map(|s| (s.name, s.state)).collect()
        };
        let pending = ["s0", "s1", "s2"].map(|name| (name.to_owned(), StepState::Pending));
        assert_eq!(states(&store), pending);
        // Read back as `StepRecord::pending` in full: no attempt used, no times, no outputs.
        assert!(
            store
                .steps(&run.id)
                .unwrap()
                .iter()
                .all(|s| format!("{s:?}") == format!("{:?}", StepRecord::pending(&s.name)))
        );

        let row = store.attempt_starting(&lease, &run.id, "s1", 1, false, Path::new("x")).unwrap();
        assert_eq!(step_rows(&store, &run.id), [("s1".into(), "running".into())]);
        let in_flight = StepState::InFlight { attempt: 1, row, pid: None, proc_start: None };
        assert_eq!(
            states(&store),
            [("s0".into(), StepState::Pending), ("s1".into(), in_flight), ("s2".into(), StepState::Pending)]
        );
        store.attempt_finished(&lease, row, &result(AttemptOutcome::Failed), &StepUpdate::Failed).unwrap();
        store.run_finished(&lease, &run.id, RunStatus::Failed, Some("s1"), &["s0".into(), "s2".into()]).unwrap();
        let skipped_failed_skipped =
            [("s0".into(), StepState::Skipped), ("s1".into(), StepState::Failed), ("s2".into(), StepState::Skipped)];
        assert_eq!(states(&store), skipped_failed_skipped);
        assert_eq!(step_rows(&store, &run.id).len(), 3);
        // A store of another process, which did not create the run, reads and writes it the same.
        let mut other = SqliteStore::open(&state).unwrap();
        assert_eq!(states(&other), skipped_failed_skipped);
        other.reopen_failed(&run.id, SystemTime::now()).unwrap();
        let lease = other.claim(&run.id, "test:1:b").unwrap();
        let row = other.attempt_starting(&lease, &run.id, "s0", 1, false, Path::new("x")).unwrap();
        assert!(matches!(states(&other)[0].1, StepState::InFlight { row: r, .. } if r == row));

        other.conn.execute("DELETE FROM runs WHERE id = ?1", [&run.id]).unwrap();
        let left: i64 = other
            .conn
            .query_row("SELECT (SELECT COUNT(*) FROM steps) + (SELECT COUNT(*) FROM definitions)", [], |r| r.get(0))
            .unwrap();
        assert_eq!(left, 0, "the run's steps and definition went with it");
    }

    /// A runner that resumes a run reads its steps before it starts any: where the rows of the
    /// steps that never moved go is taken from that read, and starting one of them writes its
    /// row (a step left out of it would find no row to move).
    #[test]
    fn a_store_that_read_a_runs_steps_writes_the_rows_of_those_that_never_moved() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::create(dir.path()).unwrap();
        let mut store = SqliteStore::open(&state).unwrap();
        let (run, lease) = store.create_run(&flow_of(3, dir.path()), "hash", "test:1:a").unwrap();
        let row = store.attempt_starting(&lease, &run.id, "s0", 1, false, Path::new("x")).unwrap();
        store.attempt_finished(&lease, row, &result(AttemptOutcome::Succeeded), &StepUpdate::Succeeded).unwrap();
        drop(store);
        let mut other = SqliteStore::open(&state).unwrap();
        assert_eq!(other.steps(&run.id).unwrap().len(), 3);
        let lease = other.claim(&run.id, "test:1:b").unwrap();
        for step in ["s2", "s1"] {
            other.attempt_starting(&lease, &run.id, step, 1, false, Path::new("x")).unwrap();
        }
        assert_eq!(
            step_rows(&other, &run.id),
            [("s0".into(), "succeeded".into()), ("s1".into(), "running".into()), ("s2".into(), "running".into())]
        );
    }

    /// A run recorded before schema 10 has a row for every step and no list of names: after the
    /// migration it reads and moves as before (its pending rows are moved, none is added), while
    /// a new run in the same database writes no row until a step moves.
    #[test]
    fn a_run_recorded_before_schema_10_keeps_a_row_per_step_and_moves_them() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::create(dir.path()).unwrap();
        let mut store = SqliteStore::open(&state).unwrap();
        let (run, _) = store.create_run(&flow_of(2, dir.path()), "hash", "test:1:a").unwrap();
        store.conn.execute_batch(&format!("{UNDO_SCHEMA_11} {UNDO_SCHEMA_10} PRAGMA user_version = 9;")).unwrap();
        drop(store);
        let mut store = SqliteStore::open(&state).unwrap();
        let pending = [("s0".to_owned(), "pending".to_owned()), ("s1".into(), "pending".into())];
        assert_eq!(step_rows(&store, &run.id), pending);
        let lease = store.claim(&run.id, "test:1:b").unwrap();
        let row = store.attempt_starting(&lease, &run.id, "s0", 1, false, Path::new("x")).unwrap();
        store.attempt_finished(&lease, row, &result(AttemptOutcome::Succeeded), &StepUpdate::Succeeded).unwrap();
        let states: Vec<StepState> = store.steps(&run.id).unwrap().into_iter().map(|s| s.state).collect();
        assert_eq!(states, [StepState::Succeeded, StepState::Pending]);
        assert_eq!(step_rows(&store, &run.id).len(), 2);
        let (new, _) = store.create_run(&flow_of(2, dir.path()), "hash", "test:1:c").unwrap();
        assert_eq!(step_rows(&store, &new.id), []);
    }

    /// Steps read while a runner starts them, one after another: every read has every step. (The
    /// rows, the list and the attempts are read in one transaction; read apart, a step whose first
    /// attempt was committed between them was taken for one whose row is gone, and left out.)
    #[test]
    fn steps_read_while_a_runner_starts_them_are_all_there() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::create(dir.path()).unwrap();
        let n = 300;
        let mut writer = SqliteStore::open(&state).unwrap();
        let (run, lease) = writer.create_run(&flow_of(n, dir.path()), "hash", "test:1:a").unwrap();
        let reader = SqliteStore::open_for_reading(&state).unwrap();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (id, finished) = (run.id.clone(), done.clone());
        let runner = std::thread::spawn(move || {
            for i in 0..n {
                writer.attempt_starting(&lease, &id, &format!("s{i}"), 1, false, Path::new("x")).unwrap();
            }
            finished.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        let (mut reads, mut short) = (0, Vec::new());
        while !done.load(std::sync::atomic::Ordering::SeqCst) {
            let steps = reader.steps(&run.id).unwrap();
            reads += 1;
            if steps.len() != n {
                short.push(steps.len());
            }
        }
        runner.join().unwrap();
        assert_eq!(short, [0; 0], "of {reads} reads, these had fewer than {n} steps");
        assert!(reader.steps(&run.id).unwrap().iter().all(|s| matches!(s.state, StepState::InFlight { .. })));
    }

    /// A step without a row is pending only if it never had an attempt: one whose row was deleted
    /// behind waymark's back is left out of the steps read (the runner then refuses the run: its
    /// step has no recorded state), where reading it as pending would run it again. A hook's run,
    /// recorded under its own name, does not make a step of that name attempted.
    #[test]
    fn a_step_whose_row_is_gone_after_an_attempt_is_not_read_as_pending() {
        let dir = tempfile::tempdir().unwrap();
        let mut source = String::from("name = 'f'\n");
        for name in ["a", "on_exit", "c"] {
            source.push_str(&format!("[[step]]\nname = '{name}'\nrun = ['true']\n"));
        }
        let (flow, _) = crate::flow::parse(&source, &dir.path().join("f.toml")).unwrap();
        let mut store = SqliteStore::open(&StateDir::create(dir.path()).unwrap()).unwrap();
        let (run, lease) = store.create_run(&flow, "hash", "test:1:a").unwrap();
        let row = store.attempt_starting(&lease, &run.id, "a", 1, false, Path::new("x")).unwrap();
        store.attempt_finished(&lease, row, &result(AttemptOutcome::Succeeded), &StepUpdate::Succeeded).unwrap();
        store.aux_starting(&lease, &run.id, AuxKind::Hook, "on_exit", Path::new("x"), &[]).unwrap();
        let names = |store: &SqliteStore| -> Vec<String> {
            store.steps(&run.id).unwrap().into_iter().map(|s| s.name).collect()
        };
        assert_eq!(names(&store), ["a", "on_exit", "c"]);
        store.conn.execute("DELETE FROM steps WHERE name = 'a'", []).unwrap();
        assert_eq!(names(&store), ["on_exit", "c"]);
    }

    /// Each row is read into its place in the run's list only when the list names it there: a
    /// row whose position was changed behind waymark's back (here onto a step that has no row
    /// yet) is still read, by its name, with its state, and the step whose place it took is
    /// still read as pending; each step once.
    #[test]
    fn a_row_moved_behind_waymarks_back_is_still_read_with_its_state() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = SqliteStore::open(&StateDir::create(dir.path()).unwrap()).unwrap();
        let (run, lease) = store.create_run(&flow_of(3, dir.path()), "hash", "test:1:a").unwrap();
        let row = store.attempt_starting(&lease, &run.id, "s0", 1, false, Path::new("x")).unwrap();
        store.attempt_finished(&lease, row, &result(AttemptOutcome::Succeeded), &StepUpdate::Succeeded).unwrap();
        let read = |store: &SqliteStore| -> Vec<(String, StepState)> {
            store.steps(&run.id).unwrap().into_iter().map(|s| (s.name, s.state)).collect()
        };
        let pending = |name: &str| (name.to_owned(), StepState::Pending);
        let succeeded = |name: &str| (name.to_owned(), StepState::Succeeded);
        assert_eq!(read(&store), [succeeded("s0"), pending("s1"), pending("s2")]);
        store.conn.execute("UPDATE steps SET position = 2 WHERE name = 's0'", []).unwrap();
        // In the order of the positions: s1 (1), then s0 and s2 (both 2) as they always came out.
        assert_eq!(read(&store), [pending("s1"), succeeded("s0"), pending("s2")]);
        // Two rows at one position: the order they came out in before rows were placed.
        let row = store.attempt_starting(&lease, &run.id, "s1", 1, false, Path::new("x")).unwrap();
        store.attempt_finished(&lease, row, &result(AttemptOutcome::Succeeded), &StepUpdate::Succeeded).unwrap();
        store.conn.execute("UPDATE steps SET position = 0 WHERE name = 's1'", []).unwrap();
        store.conn.execute("UPDATE steps SET position = 0 WHERE name = 's0'", []).unwrap();
        assert_eq!(read(&store), [succeeded("s0"), succeeded("s1"), pending("s2")]);
    }

    #[test]
    fn steps_go_through_their_states_and_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let (flow, _) = crate::flow::parse(
            "name = 'f'\n[[step]]\nname = 'a'\nrun = ['true']\n[[step]]\nname = 'b'\nrun = ['true']\nretry = {}\n",
            &dir.path().join("f.toml"),
        )
        .unwrap();
        let mut store = SqliteStore::open(&StateDir::create(dir.path()).unwrap()).unwrap();
        let (run, lease) = store.create_run(&flow, "hash", "test:1:a").unwrap();
        assert_eq!(store.find_resumable(&FlowKey::named("f")).unwrap().unwrap().id, run.id);
        let stem = dir.path().join("x");

        let row = store.attempt_starting(&lease, &run.id, "a", 1, false, &stem).unwrap();
        store.attempt_spawned(&lease, row, 4242, Some(7)).unwrap();
        let steps = store.steps(&run.id).unwrap();
        assert_eq!(steps[0].state, StepState::InFlight { attempt: 1, row, pid: Some(4242), proc_start: Some(7) });
        store.attempt_finished(&lease, row, &result(AttemptOutcome::Succeeded), &StepUpdate::Succeeded).unwrap();

        let row = store.attempt_starting(&lease, &run.id, "b", 1, false, &stem).unwrap();
        let wake_at = from_millis(to_millis(SystemTime::now()) + 60_000);
        store
            .attempt_finished(
                &lease,
                row,
                &result(AttemptOutcome::Failed),
                &StepUpdate::Waiting { next_attempt: 2, wake_at },
            )
            .unwrap();
        drop(store);

        let mut store = SqliteStore::open(&StateDir::create(dir.path()).unwrap()).unwrap();
        let steps = store.steps(&run.id).unwrap();
        assert_eq!(steps[0].state, StepState::Succeeded);
        assert_eq!(steps[1].state, StepState::Waiting { next_attempt: 2, wake_at });
        assert_eq!(steps[1].attempts_used, 1);

        // A cancelled attempt does not use up the budget.
        let row = store.attempt_starting(&lease, &run.id, "b", 2, false, &stem).unwrap();
        store.attempt_finished(&lease, row, &result(AttemptOutcome::Cancelled), &StepUpdate::Pending).unwrap();
        assert_eq!(store.steps(&run.id).unwrap()[1].attempts_used, 1);

        // A failed step reopened gets a fresh budget on top of the attempts it used.
        let row = store.attempt_starting(&lease, &run.id, "b", 2, false, &stem).unwrap();
        store.attempt_finished(&lease, row, &result(AttemptOutcome::Failed), &StepUpdate::Failed).unwrap();
        store.run_finished(&lease, &run.id, RunStatus::Failed, Some("b"), &[]).unwrap();
        assert!(store.find_resumable(&FlowKey::named("f")).unwrap().is_none(), "a failed run is not resumed by `run`");
        store.reopen_failed(&run.id, SystemTime::now()).unwrap();
        let b = &store.steps(&run.id).unwrap()[1];
        assert_eq!((b.state.clone(), b.attempts_used, b.budget_base), (StepState::Pending, 2, 2));
        assert_eq!(store.attempts(&run.id, Some("b")).unwrap().len(), 3);
    }

    #[test]
    fn outputs_are_recorded_with_the_success_only_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let (flow, _) = crate::flow::parse(
            "name = 'f'\n[[step]]\nname = 'a'\nrun = ['true']\nretry = {}\n[[step]]\nname = 'b'\nrun = ['true']\n",
            &dir.path().join("f.toml"),
        )
        .unwrap();
        let mut store = SqliteStore::open(&StateDir::create(dir.path()).unwrap()).unwrap();
        let (run, lease) = store.create_run(&flow, "hash", "test:1:a").unwrap();
        let stem = dir.path().join("x");
        let outputs = BTreeMap::from([("rows".to_owned(), "42".to_owned()), ("path".to_owned(), "/a b".to_owned())]);
        // A failed attempt's outputs are not the step's: nothing is recorded.
        let row = store.attempt_starting(&lease, &run.id, "a", 1, false, &stem).unwrap();
        let failed = AttemptResult { outputs: outputs.clone(), ..result(AttemptOutcome::Failed) };
        let wake_at = SystemTime::now();
        store.attempt_finished(&lease, row, &failed, &StepUpdate::Waiting { next_attempt: 2, wake_at }).unwrap();
        assert!(store.steps(&run.id).unwrap()[0].outputs.is_empty());
        let row = store.attempt_starting(&lease, &run.id, "a", 2, false, &stem).unwrap();
        let succeeded = AttemptResult { outputs: outputs.clone(), ..result(AttemptOutcome::Succeeded) };
        store.attempt_finished(&lease, row, &succeeded, &StepUpdate::Succeeded).unwrap();
        drop(store);
        let store = SqliteStore::open(&StateDir::create(dir.path()).unwrap()).unwrap();
        let steps = store.steps(&run.id).unwrap();
        assert_eq!((steps[0].outputs.clone(), steps[1].outputs.clone()), (outputs, BTreeMap::new()));
        // What no waymark writes there is corruption, never read as no outputs.
        store.conn.execute("UPDATE steps SET outputs = '[1]' WHERE name = 'a'", []).unwrap();
        let err = store.steps(&run.id).unwrap_err();
        assert!(
            matches!(&err, StoreError::BadState { what, .. } if what.starts_with("step `a`: its outputs are not a JSON object of strings")),
            "{err}"
        );
    }

    /// Schema 11 undone: no time of reopening.
    const UNDO_SCHEMA_11: &str = "ALTER TABLE runs DROP COLUMN reopened_at;";

    /// A run recorded before schema 11 has no time of reopening: a command that only looks reads
    /// it as it is, and once migrated, `waymark resume` of it after it failed records one.
    #[test]
    fn a_run_recorded_before_schema_11_is_read_and_its_reopening_recorded_after() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::create(dir.path()).unwrap();
        let mut store = SqliteStore::open(&state).unwrap();
        let (run, _) = store.create_run(&flow_of(1, dir.path()), "hash", "test:1:a").unwrap();
        store.conn.execute_batch(&format!("{UNDO_SCHEMA_11} PRAGMA user_version = 10;")).unwrap();
        drop(store);
        let old = SqliteStore::open_for_reading(&state).unwrap();
        assert_eq!(old.run(&run.id).unwrap().reopened_at, None);
        let mut store = SqliteStore::open(&state).unwrap();
        assert_eq!(store.run(&run.id).unwrap().reopened_at, None);
        let at = from_millis(to_millis(SystemTime::now()));
        store.reopen_failed(&run.id, at).unwrap();
        assert_eq!(store.run(&run.id).unwrap().reopened_at, Some(at));
    }

    /// Schema 10 undone: a row for every step (pending where none was written yet), as schemas 1
    /// to 9 wrote them with their run, and no list of names.
    const UNDO_SCHEMA_10: &str = "INSERT OR IGNORE INTO steps (run_id, position, name, state)
            SELECT d.run_id, j.key, j.value, 'pending' FROM definitions d, json_each(d.steps) j WHERE d.steps IS NOT NULL;
        ALTER TABLE definitions DROP COLUMN steps;";

    /// Schema 9 undone (after schema 10): run definitions back in the runs' rows, as schemas 1 to
    /// 8 kept them, no index of compensations and hooks, no record of a kill after the grace.
    const UNDO_SCHEMA_9: &str = "ALTER TABLE runs ADD COLUMN definition TEXT NOT NULL DEFAULT '';
        UPDATE runs SET definition = (SELECT d.definition FROM definitions d WHERE d.run_id = runs.id);
        DROP TABLE definitions; DROP INDEX attempts_aux; ALTER TABLE attempts DROP COLUMN killed;";

    /// A flow of `n` steps named `s0`, `s1`, ...
    fn flow_of(n: usize, dir: &Path) -> Flow {
        let mut source = String::from("name = 'f'\n");
        for i in 0..n {
            source.push_str(&format!("[[step]]\nname = 's{i}'\nrun = ['true']\n"));
        }
        crate::flow::parse(&source, &dir.join("f.toml")).unwrap().0
    }

    /// Claiming a run and ending it write its row and the indexes that hold it: a few pages, not
    /// its definition (22 pages for 2,000 steps), which schemas 1 to 8 wrote again with every
    /// change of the run's row. The claim is not flushed (the run's end is).
    #[test]
    fn claiming_and_ending_a_run_leave_its_definition_unwritten() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::create(dir.path()).unwrap();
        let mut store = SqliteStore::open(&state).unwrap();
        let (run, _) = store.create_run(&flow_of(2000, dir.path()), "hash", "test:1:a").unwrap();
        let definition_pages = run.definition.len() / 4096;
        assert!(definition_pages >= 20, "{definition_pages}");
        // Frames appended to the write-ahead log (each a page and its header): the pages written.
        let wal = || std::fs::metadata(state.db().with_extension("db-wal")).unwrap().len() / (4096 + 24);
        let before = wal();
        let lease = store.claim(&run.id, "test:1:b").unwrap();
        // Nor is the claim flushed; the run's end is.
        assert_eq!(store.flushed, 0, "the claim was flushed");
        store.run_finished(&lease, &run.id, RunStatus::Succeeded, None, &[]).unwrap();
        assert_eq!(store.flushed, 1, "the run's end was not flushed");
        let written = wal() - before;
        assert!(written < 10, "{written} pages written; the definition spans {definition_pages}");
        assert_eq!(store.run(&run.id).unwrap().definition, run.definition);
        // `waymark gc` deletes the definition with the run.
        assert!(store.delete_finished(&run.id, SystemTime::now() + std::time::Duration::from_secs(60)).unwrap());
        let left: i64 = store.conn.query_row("SELECT COUNT(*) FROM definitions", [], |r| r.get(0)).unwrap();
        assert_eq!(left, 0);
    }

    /// A durable write commits with `synchronous=FULL` (the WAL is flushed before the commit
    /// returns), every other write and every read after it with `NORMAL`, and a write that fails
    /// changes nothing and leaves the connection as it found it.
    #[test]
    fn a_durable_write_alone_commits_with_a_full_sync() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::create(dir.path()).unwrap();
        let mut store = SqliteStore::open(&state).unwrap();
        let level = |c: &Connection| c.query_row("PRAGMA synchronous", [], |r| r.get::<_, i64>(0));
        let (full, normal) = (2, 1);
        assert_eq!(store.write(true, level).unwrap(), full);
        assert_eq!(level(&store.conn).unwrap(), normal);
        assert_eq!(store.write(false, level).unwrap(), normal);
        assert_eq!(store.write(true, level).unwrap(), full);
        assert_eq!(store.flushed, 2);
        let failed = store.write(true, |c| {
            c.execute("UPDATE runs SET status = 'x'", [])?;
            c.execute("INSERT INTO no_such_table VALUES (1)", [])
        });
        assert!(failed.is_err());
        assert_eq!(level(&store.conn).unwrap(), normal);
        assert!(store.conn.is_autocommit(), "the failed write's transaction is still open");
        assert_eq!(store.flushed, 2);
    }

    /// `waymark resume` of a failed run reopens it and claims it without a flush: a power loss
    /// before the runner's first flushed commit loses both together.
    #[test]
    fn reopening_a_failed_run_and_claiming_it_are_not_flushed() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::create(dir.path()).unwrap();
        let mut store = SqliteStore::open(&state).unwrap();
        let (run, lease) = store.create_run(&flow_of(1, dir.path()), "hash", "test:1:a").unwrap();
        store.run_finished(&lease, &run.id, RunStatus::Failed, Some("s0"), &[]).unwrap();
        drop(store);
        let mut store = SqliteStore::open(&state).unwrap();
        store.reopen_failed(&run.id, SystemTime::now()).unwrap();
        store.claim(&run.id, "test:1:b").unwrap();
        assert_eq!(store.flushed, 0, "flushed");
        assert_eq!(store.run(&run.id).unwrap().status, RunStatus::Running);
    }

    /// Attempts come back oldest first (in the order of their rows), not in the order of the
    /// index they are read through (by step name): `s1`'s attempt, started first, comes first.
    #[test]
    fn attempts_are_read_oldest_first_whatever_their_steps_names() {
        let dir = tempfile::tempdir().unwrap();
        let flow = flow_of(3, dir.path());
        let mut store = SqliteStore::open(&StateDir::create(dir.path()).unwrap()).unwrap();
        let (run, lease) = store.create_run(&flow, "hash", "test:1:a").unwrap();
        let stem = dir.path().join("stem");
        for step in ["s1", "s0", "s2"] {
            let row = store.attempt_starting(&lease, &run.id, step, 1, false, &stem).unwrap();
            store.attempt_finished(&lease, row, &result(AttemptOutcome::Succeeded), &StepUpdate::Succeeded).unwrap();
        }
        let steps: Vec<String> = store.attempts(&run.id, None).unwrap().into_iter().map(|a| a.step).collect();
        assert_eq!(steps, ["s1", "s0", "s2"]);
    }

    /// A run of more steps than SQLite takes parameters in one statement (32,766) is recorded
    /// whole, and read back in order, before and after one of its steps moves.
    #[test]
    fn a_run_of_more_steps_than_one_statement_takes_parameters_records_every_step_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let n = 33_000;
        // One step parsed, copied under new names (parsing 33,000 would be slow in a test build).
        let mut flow = flow_of(1, dir.path());
        let step = flow.steps.pop().unwrap();
        flow.steps = (0..n).map(|i| crate::flow::model::Step { name: format!("s{i}"), ..step.clone() }).collect();
        let mut store = SqliteStore::open(&StateDir::create(dir.path()).unwrap()).unwrap();
        let (run, lease) = store.create_run(&flow, "hash", "test:1:a").unwrap();
        let names = |store: &SqliteStore| -> Vec<String> {
            store.steps(&run.id).unwrap().into_iter().map(|s| s.name).collect()
        };
        let all = (0..n).map(|i| format!("s{i}")).collect::<Vec<_>>();
        assert_eq!(names(&store), all);
        store.attempt_starting(&lease, &run.id, "s20000", 1, false, Path::new("x")).unwrap();
        assert_eq!(names(&store), all);
        assert!(matches!(store.steps(&run.id).unwrap()[20_000].state, StepState::InFlight { .. }));
        let (second, _) = store.create_run(&flow, "hash", "test:1:b").unwrap();
        assert_eq!(store.steps(&second.id).unwrap().len(), n);
    }

    /// The plan SQLite chooses for `sql`, one line per step.
    fn plan(store: &SqliteStore, sql: &str) -> String {
        let mut stmt = store.conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let nulls = vec![rusqlite::types::Null; stmt.parameter_count()];
        let rows = stmt.query_map(rusqlite::params_from_iter(nulls), |r| r.get::<_, String>(3)).unwrap();
        rows.map(Result::unwrap).collect::<Vec<_>>().join("\n")
    }

    #[test]
    fn a_runner_s_checks_of_its_lease_and_status_read_an_index_not_the_run_s_definition() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::create(dir.path()).unwrap();
        let mut store = SqliteStore::open(&state).unwrap();
        store.create_run(&flow_of(1, dir.path()), "hash", "test:1:a").unwrap();
        // As schema 7 left it: the migration adds the index.
        store
            .conn
            .execute_batch(&format!(
                "{UNDO_SCHEMA_11} {UNDO_SCHEMA_10} {UNDO_SCHEMA_9} DROP INDEX runs_lease; PRAGMA user_version = 7;"
            ))
            .unwrap();
        drop(store);
        let store = SqliteStore::open(&state).unwrap();
        let covered = "SEARCH runs USING COVERING INDEX runs_lease (id=?)";
        // SQLite prefers the primary key's index, which leads to the row: the queries name this one.
        assert_eq!(
            plan(&store, "SELECT lease_owner, lease_token FROM runs INDEXED BY runs_lease WHERE id = ?1"),
            covered
        );
        assert_eq!(plan(&store, "SELECT status FROM runs INDEXED BY runs_lease WHERE id = ?1"), covered);
    }

    /// A run's compensations and hooks, and one step's attempts, are found through an index
    /// (what a resumed run reads), not among all of the run's attempts.
    #[test]
    fn a_run_s_compensations_and_hooks_and_one_step_s_attempts_are_read_through_an_index() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&StateDir::create(dir.path()).unwrap()).unwrap();
        assert_eq!(plan(&store, &store.aux_sql()), "SEARCH attempts USING INDEX attempts_aux (run_id=?)");
        assert_eq!(
            plan(&store, &store.attempts_sql(true)),
            "SEARCH attempts USING INDEX attempts_by_step (run_id=? AND step=?)"
        );
    }

    #[test]
    fn a_schema_6_database_gets_the_unfinished_runs_index_and_lookups_read_only_those() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::create(dir.path()).unwrap();
        let flow = flow_of(1, dir.path());
        let mut store = SqliteStore::open(&state).unwrap();
        let (done, lease) = store.create_run(&flow, "hash", "test:1:a").unwrap();
        store.run_finished(&lease, &done.id, RunStatus::Succeeded, None, &[]).unwrap();
        let (unfinished, _) = store.create_run(&flow, "hash", "test:1:b").unwrap();
        // As schema 6 left it.
        store
            .conn
            .execute_batch(&format!(
                "{UNDO_SCHEMA_11} {UNDO_SCHEMA_10} {UNDO_SCHEMA_9} DROP INDEX runs_unfinished; PRAGMA user_version = 6;"
            ))
            .unwrap();
        drop(store);

        let store = SqliteStore::open(&state).unwrap();
        let version: i64 = store.conn.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
        assert_eq!(version, SCHEMA_VERSION);
        // The migration moved every definition: its log was checkpointed and cut back.
        assert_eq!(std::fs::metadata(state.db().with_extension("db-wal")).unwrap().len(), 0);
        assert_eq!(store.find_resumable(&FlowKey::named("f")).unwrap().unwrap().id, unfinished.id);
        let ids = |filter| store.unfinished_runs(filter, 50).unwrap().into_iter().map(|r| r.id).collect::<Vec<_>>();
        assert_eq!(ids(RunFilter::Name("f")), vec![unfinished.id.clone()]);
        let file = dir.path().join("f.toml");
        assert_eq!(ids(RunFilter::File(&file)), vec![unfinished.id.clone()]);
        assert_eq!(ids(RunFilter::Key(&FlowKey::named("f"))), vec![unfinished.id.clone()]);
        // However many finished runs a flow has, finding its unfinished one reads only the index
        // of unfinished runs (the plans of `find_resumable` and `unfinished_runs`), and their
        // definitions by key.
        let unfinished_only = "SCAN runs USING INDEX runs_unfinished\nCORRELATED SCALAR SUBQUERY 1\n\
                               SEARCH d USING INDEX sqlite_autoindex_definitions_1 (run_id=?)";
        assert_eq!(plan(&store, &resumable_sql(&store)), unfinished_only);
        for filter in [RunFilter::Name("f"), RunFilter::File(Path::new("x")), RunFilter::Key(&FlowKey::named("f"))] {
            let (cond, _) = store.filter_sql(filter);
            assert_eq!(plan(&store, &unfinished_sql(&store, &cond)), unfinished_only);
        }
    }

    #[test]
    fn an_illegal_move_is_refused_and_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (flow, _) =
            crate::flow::parse("name = 'f'\n[[step]]\nname = 'a'\nrun = ['true']\n", &dir.path().join("f.toml"))
                .unwrap();
        let mut store = SqliteStore::open(&StateDir::create(dir.path()).unwrap()).unwrap();
        let (run, lease) = store.create_run(&flow, "hash", "test:1:a").unwrap();
        let row = store.attempt_starting(&lease, &run.id, "a", 1, false, &dir.path().join("x")).unwrap();
        store.attempt_finished(&lease, row, &result(AttemptOutcome::Succeeded), &StepUpdate::Succeeded).unwrap();
        let err = store.attempt_starting(&lease, &run.id, "a", 2, false, &dir.path().join("x")).unwrap_err();
        assert!(
            matches!(&err, StoreError::BadState { table: "steps", what, .. } if what == "step `a` cannot go from succeeded to running"),
            "{err}"
        );
        let err =
            store.attempt_finished(&lease, row, &result(AttemptOutcome::Failed), &StepUpdate::Failed).unwrap_err();
        assert!(matches!(&err, StoreError::BadState { table: "attempts", .. }), "{err}");
        store.run_finished(&lease, &run.id, RunStatus::Succeeded, None, &[]).unwrap();
        assert!(matches!(store.abandon(&run.id, "test:2:b"), Err(StoreError::BadState { .. })));
        assert_eq!(store.run(&run.id).unwrap().status, RunStatus::Succeeded);
        assert_eq!(store.steps(&run.id).unwrap()[0].state, StepState::Succeeded);
        assert_eq!(store.attempts(&run.id, None).unwrap().len(), 1);
    }

    #[test]
    fn a_later_claim_fences_off_the_earlier_owner_whose_writes_change_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (flow, _) = crate::flow::parse(
            "name = 'f'\n[[step]]\nname = 'a'\nrun = ['true']\n[[step]]\nname = 'b'\nrun = ['true']\n",
            &dir.path().join("f.toml"),
        )
        .unwrap();
        let state = StateDir::create(dir.path()).unwrap();
        let stem = dir.path().join("x");
        // The first runner creates the run and starts an attempt of `a`.
        let mut first = SqliteStore::open(&state).unwrap();
        let (run, old) = first.create_run(&flow, "hash", "host:1:first").unwrap();
        let row = first.attempt_starting(&old, &run.id, "a", 1, false, &stem).unwrap();
        // A second runner claims the run (the lock did not keep it out) on its own connection.
        let mut second = SqliteStore::open(&state).unwrap();
        let new = second.claim(&run.id, "host:2:second").unwrap();
        assert_eq!((new.owner.as_str(), new.token), ("host:2:second", old.token + 1));
        let states = |s: &SqliteStore| s.steps(&run.id).unwrap().into_iter().map(|s| s.state).collect::<Vec<_>>();
        let before = (states(&second), second.attempts(&run.id, None).unwrap().len());

        // Every write of the first runner is refused, names both runners, and changes nothing.
        let lost = |e: StoreError| match e {
            StoreError::LeaseLost { run_id, owner, holder, .. } => (run_id, owner, holder),
            e => panic!("not a lost lease: {e}"),
        };
        let expected = (run.id.clone(), "host:1:first".to_owned(), "host:2:second".to_owned());
        let err = first.attempt_finished(&old, row, &result(AttemptOutcome::Succeeded), &StepUpdate::Succeeded);
        let err = err.unwrap_err();
        let message = err.to_string();
        assert!(
            message.starts_with(&format!(
                "run {} in {} was taken over by another runner (host:2:second) while this runner (host:1:first) \
                 was running it; this runner stops",
                run.id,
                state.db().display()
            )),
            "{message}"
        );
        assert_eq!(lost(err), expected);
        assert_eq!(lost(first.attempt_spawned(&old, row, 4242, Some(7)).unwrap_err()), expected);
        assert_eq!(lost(first.attempt_starting(&old, &run.id, "b", 1, false, &stem).unwrap_err()), expected);
        assert_eq!(lost(first.run_finished(&old, &run.id, RunStatus::Succeeded, None, &[]).unwrap_err()), expected);
        assert_eq!((states(&second), second.attempts(&run.id, None).unwrap().len()), before);
        assert_eq!(second.run(&run.id).unwrap().status, RunStatus::Running);
        assert!(matches!(states(&second)[0], StepState::InFlight { attempt: 1, pid: None, .. }));

        // The second runner's writes go through.
        let row = second.attempt_starting(&new, &run.id, "a", 1, true, &stem).unwrap();
        second.attempt_finished(&new, row, &result(AttemptOutcome::Succeeded), &StepUpdate::Succeeded).unwrap();
        assert_eq!(states(&first)[0], StepState::Succeeded);
    }

    /// A new database gets [`CURRENT_SCHEMA`] at once; an old one gets there by the migrations.
    /// Both must give the same database: the same tables with the same columns in the same
    /// order (types, defaults, `NOT NULL`, keys), the same foreign keys, and the same indexes
    /// (columns, uniqueness, the condition of a partial one). `CHECK` constraints and collations,
    /// of which the schema has none, are not compared.
    #[test]
    fn a_new_database_has_the_schema_the_migrations_give() {
        fn shape(conn: &Connection) -> Vec<String> {
            let rows = |sql: &str, name: &str| -> Vec<String> {
                let mut stmt = conn.prepare(sql).unwrap();
                let n = stmt.column_count();
                stmt.query_map([name], |r| {
                    (0..n)
                        .map(|i| Ok(format!("{:?}", r.get::<_, rusqlite::types::Value>(i)?)))
                        .collect::<Result<Vec<_>, _>>()
                })
                .unwrap()
                .map(|r| format!("{name}: {}", r.unwrap().join(" ")))
                .collect()
            };
            let mut stmt = conn.prepare("SELECT type, name, sql FROM sqlite_master ORDER BY type, name").unwrap();
            let objects: Vec<(String, String, Option<String>)> =
                stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).unwrap().map(Result::unwrap).collect();
            let mut shape = Vec::new();
            // `AUTOINCREMENT`, which only migrated databases have (see `CURRENT_SCHEMA`), is their
            // `sqlite_sequence` table; it is no column, key or index.
            for (kind, name, sql) in objects.into_iter().filter(|(_, name, _)| name != "sqlite_sequence") {
                if kind == "table" {
                    shape.extend(rows("SELECT * FROM pragma_table_xinfo(?1)", &name));
                    shape.extend(rows("SELECT * FROM pragma_foreign_key_list(?1)", &name));
                    shape.extend(rows("SELECT * FROM pragma_index_list(?1)", &name));
                } else {
                    shape.extend(rows("SELECT * FROM pragma_index_xinfo(?1)", &name));
                    // A partial index's condition is only in its SQL (one space for any run of them).
                    let sql = sql.map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "));
                    shape.push(format!("{kind} {name}: {sql:?}"));
                }
            }
            shape
        }
        let new = Connection::open_in_memory().unwrap();
        new.execute_batch(CURRENT_SCHEMA).unwrap();
        let migrated = Connection::open_in_memory().unwrap();
        migrated.execute_batch(SCHEMA).unwrap();
        migrate(&migrated, 1).unwrap();
        let (new, migrated) = (shape(&new), shape(&migrated));
        assert!(new.len() > 60, "{new:#?}");
        assert_eq!(new, migrated);
    }

    /// Each name finds its own position, whatever names share its first letters; a name seen
    /// twice is refused; a step forgotten (its row written) is forgotten alone.
    #[test]
    fn step_positions_are_found_by_name() {
        let names = ["s1", "s10", "s", "", "s100", "é"];
        let mut positions = StepPositions::of(names.iter().zip([7, 3, 0, 12, 5, 1]).map(|(&n, p)| (n, p))).unwrap();
        let found = |positions: &StepPositions| names.map(|n| positions.get(n));
        assert_eq!(found(&positions), [Some(7), Some(3), Some(0), Some(12), Some(5), Some(1)]);
        assert_eq!(positions.get("s2"), None);
        positions.remove("s10");
        positions.remove("s2");
        assert_eq!(found(&positions), [Some(7), None, Some(0), Some(12), Some(5), Some(1)]);
        assert!(StepPositions::of([("a", 0), ("b", 1), ("a", 2)].into_iter()).is_none());
        // Many names, each found at its own position.
        let many: Vec<String> = (0..5000).map(|i| format!("step-{i}")).collect();
        let positions = StepPositions::of(many.iter().enumerate().map(|(i, n)| (n.as_str(), i as i64))).unwrap();
        assert!(many.iter().enumerate().all(|(i, n)| positions.get(n) == Some(i as i64)));
    }

    #[test]
    fn steps_are_put_in_the_order_of_their_positions_whatever_the_positions() {
        let order = |positions: &[i64]| -> Vec<String> {
            let steps: Vec<_> = positions.iter().map(|&p| (p, StepRecord::pending(&format!("p{p}")))).collect();
            // Read in one chunk, and in chunks of two.
            let names = |steps: Vec<StepRecord>| steps.into_iter().map(|s| s.name).collect::<Vec<_>>();
            let whole = names(in_position_order(vec![steps.clone()]));
            assert_eq!(names(in_position_order(steps.chunks(2).map(<[_]>::to_vec).collect())), whole);
            whole
        };
        // 0 to n - 1, each once (as waymark writes them), in any order.
        assert_eq!(order(&[2, 0, 3, 1]), ["p0", "p1", "p2", "p3"]);
        assert_eq!(order(&[0, 1, 2]), ["p0", "p1", "p2"]);
        assert_eq!(order(&[1, 2, 3, 4, 0]), ["p0", "p1", "p2", "p3", "p4"]);
        assert!(order(&[]).is_empty());
        // Gaps, positions past the end, negative ones and repeats are sorted.
        assert_eq!(order(&[5, 1, 9]), ["p1", "p5", "p9"]);
        assert_eq!(order(&[1, -1, 0]), ["p-1", "p0", "p1"]);
        assert_eq!(order(&[2, 0, 2]), ["p0", "p2", "p2"]);
    }
}
