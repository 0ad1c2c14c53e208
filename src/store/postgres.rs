//! The shared store: a PostgreSQL database that a fleet of runners (on one host or many) use at
//! once, chosen with `--store postgres://...` (see `url.rs`).
//!
//! Design:
//! - **Synchronous client, never inside the runtime.** [`PgStore`] implements the same synchronous
//!   [`Store`] and [`RunLog`] traits as the SQLite store, with the `postgres` crate (the blocking
//!   wrapper of `tokio-postgres`, which drives each connection on a small runtime of its own and
//!   must not be called from a thread that runs a tokio runtime). The commands call the store
//!   before they start the runner's runtime and after it is gone; while a run goes on, its writes
//!   go through `ThreadJournal`, whose writer thread owns the connection; the lease is renewed by
//!   a thread of its own ([`FlowLease`]) on a connection of its own. No store call is made on the
//!   runtime's thread.
//! - **Leases in the database.** There is no file lock to lean on: a runner owns a flow through a
//!   row of `waymark_leases` (its key, owner, host, pid, fencing token and expiry, by the
//!   database's clock). Taking it is one statement that inserts the row or takes it over once
//!   it has expired, raising the token; the row is never deleted, so the token only grows. The
//!   holder renews it every `renew` (5 s) for `ttl` (15 s) more. Every write of a run locks the
//!   lease row (`FOR SHARE`) and compares owner and token in the same transaction: a write with a
//!   stale token is refused ([`StoreError::LeaseLost`]) and changes nothing, and a takeover waits
//!   for a write in progress to commit. The runner stops itself (see `LeaseClock`) a quarter of the
//!   time to live before its lease would expire if it could not renew it.
//! - **Flow identity across hosts.** A flow with a declared `name` is one lease and one series of
//!   runs across hosts; a flow without one is its file on its host: its lease key and its runs
//!   carry the host (`key_host`), and another host never resumes or takes them over.
//! - **Logs.** Attempts' log files stay on the host that ran them; the last 64 KiB of each
//!   attempt's stdout and stderr are recorded with its end, for `waymark logs` on other hosts.
//! - **Schema.** Versioned migrations ([`MIGRATIONS`]) are applied on first use, in a transaction
//!   under a transaction-level advisory lock, so that several hosts starting at once migrate
//!   exactly once. A database whose schema is newer than this binary's is refused.
//! - **A connection lost during a run.** A journal write that fails for want of a connection is
//!   retried on a new one until the runner fences itself off (a failed `COMMIT`, whose outcome is
//!   unknown, is never retried: the runner stops and its run is resumed). Commands that are not
//!   running a run fail at once (exit 4) with the URL, without its password, and a hint.

use super::IN_BETWEEN;
use super::lease::{LET_GO_AFTER, LeaseClock, LeaseTiming, host_id};
use super::record::RunDefinition;
use super::stall::{Armed, Watch};
use super::url::{CertCheck, PgConfig};
use super::*;
use crate::flow::Flow;
use ::postgres::config::SslMode;
use ::postgres::{Client, Statement, Transaction};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The schema this binary writes: the number of [`MIGRATIONS`].
const SCHEMA_VERSION: i64 = 4;

/// The key of the advisory lock migrations are made under ("waymark" in ASCII).
const MIGRATION_LOCK: i64 = 0x0077_6179_6d61_726b;

/// How much of the end of each stream of an attempt the database keeps.
pub(crate) const TAIL_BYTES: u64 = 64 * 1024;

/// Migration `i` brings the schema from version `i` to `i + 1`.
const MIGRATIONS: [&str; 4] = [
    "
CREATE TABLE waymark_runs (
    id          TEXT PRIMARY KEY,
    seq         BIGSERIAL UNIQUE,
    flow        TEXT NOT NULL,
    flow_key    TEXT NOT NULL,
    key_host    TEXT,
    lease_key   TEXT NOT NULL,
    flow_path   TEXT NOT NULL,
    definition  TEXT NOT NULL,
    source_hash TEXT NOT NULL,
    status      TEXT NOT NULL,
    started_at  BIGINT NOT NULL,
    ended_at    BIGINT,
    pid         BIGINT NOT NULL,
    host        TEXT NOT NULL,
    failed_step TEXT
);
CREATE INDEX waymark_runs_by_key ON waymark_runs (flow_key, seq);
CREATE INDEX waymark_runs_by_flow ON waymark_runs (flow, seq);
CREATE TABLE waymark_steps (
    run_id        TEXT NOT NULL REFERENCES waymark_runs (id) ON DELETE CASCADE,
    position      INTEGER NOT NULL,
    name          TEXT NOT NULL,
    state         TEXT NOT NULL,
    attempts_used BIGINT NOT NULL DEFAULT 0,
    budget_base   BIGINT NOT NULL DEFAULT 0,
    next_attempt  BIGINT,
    wake_at       BIGINT,
    current_row   BIGINT,
    last_error    TEXT,
    started_at    BIGINT,
    ended_at      BIGINT,
    outputs       TEXT,
    PRIMARY KEY (run_id, name)
);
CREATE TABLE waymark_attempts (
    row_id      BIGSERIAL PRIMARY KEY,
    run_id      TEXT NOT NULL REFERENCES waymark_runs (id) ON DELETE CASCADE,
    kind        TEXT NOT NULL,
    step        TEXT NOT NULL,
    attempt     BIGINT NOT NULL,
    redelivered BOOLEAN NOT NULL,
    outcome     TEXT NOT NULL,
    started_at  BIGINT NOT NULL,
    ended_at    BIGINT,
    pid         BIGINT,
    proc_start  BIGINT,
    exit_code   INTEGER,
    signal      TEXT,
    error       TEXT,
    log_stem    TEXT NOT NULL,
    host        TEXT NOT NULL,
    stdout_tail BYTEA,
    stderr_tail BYTEA
);
CREATE INDEX waymark_attempts_by_step ON waymark_attempts (run_id, step, attempt);
CREATE TABLE waymark_leases (
    lease_key  TEXT PRIMARY KEY,
    run_id     TEXT,
    owner      TEXT NOT NULL,
    host       TEXT NOT NULL,
    pid        BIGINT NOT NULL,
    token      BIGINT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);
",
    "
-- Whether an attempt's process group was killed with SIGKILL after its kill grace.
-- NULL, not known, for the attempts recorded before.
ALTER TABLE waymark_attempts ADD COLUMN killed BOOLEAN;
",
    "
-- The runs `waymark gc` deleted, and when: every host's gc then deletes the logs it keeps of them.
CREATE TABLE waymark_deleted_runs (
    id         TEXT PRIMARY KEY,
    deleted_at BIGINT NOT NULL
);
CREATE INDEX waymark_deleted_runs_by_age ON waymark_deleted_runs (deleted_at);
",
    "
-- When `waymark resume` last reopened a failed run: its workflow deadline and `resume_within`
-- count from then, whichever runner goes on with it. NULL for the runs recorded before.
ALTER TABLE waymark_runs ADD COLUMN reopened_at BIGINT;
",
];

/// How long the deletion of a run is remembered for the hosts that keep its logs: a host whose
/// `gc` does not run for longer keeps the logs of the runs deleted before.
const DELETIONS_KEPT_MS: i64 = 366 * 86_400_000;

/// How the owner of a lease that `waymark gc` takes starts (`waymark gc:HOST:PID`): such a lease
/// holds no run.
pub(crate) const GC_OWNER: &str = "waymark gc:";

/// The lease key of flow `key` on `host`: the key itself for a named flow, shared by all hosts;
/// with the host for a flow that is its file, which no other host takes over.
pub(crate) fn lease_key(key: &FlowKey, host: &str) -> String {
    match key.file() {
        Some(_) => format!("{}#{host}", key.as_str()),
        None => key.as_str().to_owned(),
    }
}

/// What went wrong inside a transaction: PostgreSQL's error, or a check of ours.
enum Fail {
    Pg(::postgres::Error),
    Bad {
        table: &'static str,
        run_id: String,
        what: String,
    },
    /// The runner's lease is not the run's any more: `why` says what became of it.
    Lost {
        run_id: String,
        owner: String,
        why: String,
    },
    /// The `COMMIT` failed: whether it committed is unknown, so it is never retried.
    Commit(::postgres::Error),
}

impl From<::postgres::Error> for Fail {
    fn from(e: ::postgres::Error) -> Fail {
        Fail::Pg(e)
    }
}

fn bad(table: &'static str, run_id: &str, what: impl std::fmt::Display) -> Fail {
    Fail::Bad { table, run_id: run_id.to_owned(), what: what.to_string() }
}

/// The kind of a PostgreSQL failure: the only place that reads its codes.
fn kind_of(e: &::postgres::Error) -> StoreErrorKind {
    match e.code().map(::postgres::error::SqlState::code) {
        Some("28P01" | "28000") => StoreErrorKind::Auth,
        Some("25006") => StoreErrorKind::ReadOnly,
        Some("42501") => StoreErrorKind::Permission,
        Some("53100") => StoreErrorKind::Full,
        Some("40001" | "40P01" | "55P03") => StoreErrorKind::Busy,
        Some("57P01" | "57P02" | "57P03" | "08000" | "08003" | "08006" | "08001" | "08004") => {
            StoreErrorKind::Unreachable
        }
        Some(_) => StoreErrorKind::Other,
        // No answer from the server: the connection could not be made, or was lost.
        None => StoreErrorKind::Unreachable,
    }
}

/// The server's own words for a failure, else the client's.
fn detail(e: &::postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return db.message().to_owned();
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(&format!(": {cause_text}"));
        }
        source = cause.source();
    }
    text
}

/// A failure worth trying again on a fresh connection: the connection, not the statement, failed,
/// or the server asks for it (a serialization failure, a deadlock).
fn transient(e: &::postgres::Error) -> bool {
    matches!(kind_of(e), StoreErrorKind::Unreachable | StoreErrorKind::Busy)
}

fn now_ms() -> i64 {
    to_millis(SystemTime::now())
}

fn new_run_id() -> String {
    const ALPHABET: &[u8] = b"0123456789abcdefghjkmnpqrstvwxyz";
    (0..8).map(|_| ALPHABET[fastrand::usize(..ALPHABET.len())] as char).collect()
}

/// How long the server lets a session sit idle inside a transaction, and a statement wait for a
/// lock (milliseconds): twice the default lease.
const SESSION_LIMIT_MS: u64 = 30_000;

/// Connect to the database of `config` (shown as `location`), with TLS when its `sslmode` asks
/// for it (`prefer`, the default, uses it when the server offers it; the others insist), checking
/// the server's certificate as [`CertCheck`] says.
fn connect(config: &PgConfig, location: &str) -> Result<Client, StoreError> {
    connect_then(config, location, None)
}

/// [`connect`], and then `then` on the thread that made the handshake (if it ever ends).
fn connect_then(
    config: &PgConfig,
    location: &str,
    then: Option<Box<dyn FnOnce() + Send>>,
) -> Result<Client, StoreError> {
    let mut conn = config.conn.clone();
    if conn.get_connect_timeout().is_none() {
        conn.connect_timeout(Duration::from_secs(10));
    }
    if conn.get_tcp_user_timeout().is_none() {
        // Unacknowledged data for this long means the connection is gone.
        conn.tcp_user_timeout(Duration::from_secs(10));
    }
    conn.keepalives_idle(Duration::from_secs(5));
    // Limits the server keeps for the session (the URL's own `options` come after, and win). A
    // session left inside a transaction by a host that vanished mid-write (power lost, network cut:
    // the server's TCP notices only after hours) is ended, so that its locks no longer block the
    // host taking the run over; and a statement waits for a lock at most as long, then fails as
    // busy (exit status 4) instead of leaving a runner blocked without a word. waymark's own
    // transactions never wait between their statements, nor hold a lock for long.
    let limits =
        format!("-c idle_in_transaction_session_timeout={SESSION_LIMIT_MS} -c lock_timeout={SESSION_LIMIT_MS}");
    let options = match conn.get_options() {
        Some(own) => format!("{limits} {own}"),
        None => limits,
    };
    conn.options(&options);
    let fail = |e: ::postgres::Error| {
        // The server asked for a password and the URL has none: the client's words for it
        // (`invalid configuration: password missing`) are no more than a string.
        if e.as_db_error().is_none() && detail(&e).ends_with("password missing") {
            let why = "the server asks for a password, and the URL gives none (waymark reads it from the URL only, \
                       not from PGPASSWORD or ~/.pgpass)";
            return StoreError::failed(StoreErrorKind::Auth, location, why);
        }
        StoreError::failed(kind_of(&e), location, tls_detail(&e, config))
    };
    // `connect_timeout` bounds each TCP connection; a server (or a pooler, or a proxy) that takes
    // the connection and then never answers would hold the handshake, and so every command, for
    // ever. The whole handshake gets as long, on a thread of its own that is left behind if it
    // never ends (the process exits soon after, or the runner's lease runs out).
    let limit = conn.get_connect_timeout().copied().unwrap_or(Duration::from_secs(10))
        * u32::try_from(conn.get_hosts().len().max(1)).unwrap_or(1);
    let tls = match conn.get_ssl_mode() {
        SslMode::Disable => None,
        _ => Some(tls(config, location)?),
    };
    let (done, result) = std::sync::mpsc::channel();
    // Named for what it goes on to do, when it does.
    let name = if then.is_some() { "waymark-pg-watch" } else { "waymark-pg-connect" };
    crate::os::signals::spawn_thread(name, move || {
        let connected = match tls {
            None => conn.connect(::postgres::NoTls),
            Some(tls) => conn.connect(tls),
        };
        let _ = done.send(connected);
        if let Some(then) = then {
            then();
        }
    })
    .map_err(|e| StoreError::failed(StoreErrorKind::Other, location, format!("cannot start a thread: {e}")))?;
    match result.recv_timeout(limit) {
        Ok(connected) => connected.map_err(fail),
        Err(_) => Err(StoreError::failed(
            StoreErrorKind::Unreachable,
            location,
            format!(
                "the server took the connection but did not finish the handshake within {} (`connect_timeout`)",
                humantime::format_duration(limit)
            ),
        )),
    }
}

/// [`detail`], and for a certificate the TLS handshake refused, what it was checked against.
fn tls_detail(e: &::postgres::Error, config: &PgConfig) -> String {
    let text = detail(e);
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        // tokio-postgres hands the handshake's error on inside an io::Error.
        let tls = cause
            .downcast_ref::<rustls::Error>()
            .or_else(|| cause.downcast_ref::<std::io::Error>()?.get_ref()?.downcast_ref::<rustls::Error>());
        if let Some(rustls::Error::InvalidCertificate(_)) = tls {
            let against = match &config.roots {
                Some(roots) => format!("the certificates of sslrootcert `{}`", roots.path.display()),
                None => "the system's root certificates".to_owned(),
            };
            let what = match config.check {
                CertCheck::Full => "its chain and host name",
                _ => "its chain",
            };
            return format!("{text} (the server's certificate was checked against {against}: {what})");
        }
        source = cause.source();
    }
    text
}

/// The certificates of an `sslrootcert` file (PEM), or why they cannot be read.
pub(crate) fn load_roots(file: &Path) -> Result<rustls::RootCertStore, String> {
    use rustls::pki_types::pem::PemObject;
    let unreadable =
        |e: &dyn std::fmt::Display| format!("cannot read the certificates of sslrootcert `{}`: {e}", file.display());
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_file_iter(file).map_err(|e| unreadable(&e))? {
        roots.add(cert.map_err(|e| unreadable(&e))?).map_err(|e| unreadable(&e))?;
    }
    if roots.is_empty() {
        return Err(unreadable(&"it holds no certificate (PEM, `-----BEGIN CERTIFICATE-----`)"));
    }
    Ok(roots)
}

/// TLS by rustls, with the certificate checks of `config` (roots: its `sslrootcert` file or the
/// system's).
fn tls(config: &PgConfig, location: &str) -> Result<tokio_postgres_rustls::MakeRustlsConnect, StoreError> {
    let setup = |what: String| StoreError::failed(StoreErrorKind::Other, location, what);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| setup(format!("cannot set up TLS: {e}")))?;
    if config.check == CertCheck::Nothing {
        let tls =
            builder.dangerous().with_custom_certificate_verifier(Arc::new(Unverified(provider))).with_no_client_auth();
        return Ok(tokio_postgres_rustls::MakeRustlsConnect::new(tls));
    }
    let roots = match &config.roots {
        Some(file) => file.certs.clone(),
        None => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
            Arc::new(roots)
        }
    };
    let tls = if config.check == CertCheck::Chain {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(ChainOnly { roots, provider }))
            .with_no_client_auth()
    } else {
        builder.with_root_certificates(roots).with_no_client_auth()
    };
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(tls))
}

/// `sslmode=require` or `prefer` (the default) without `sslrootcert`: any certificate is
/// accepted. This is libpq's meaning of these modes (encryption against eavesdropping, no
/// protection against an active man in the middle), which servers with self-signed certificates
/// rely on (Debian's packages turn TLS on with one); `verify-ca` and `verify-full` are the
/// authenticated modes. The handshake's signatures are still checked (the server holds
/// the key of the certificate it sent).
#[derive(Debug)]
struct Unverified(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `sslmode=verify-ca` (or `require` with `sslrootcert`): the certificate must chain to one of
/// `roots`, for whatever host name it names.
#[derive(Debug)]
struct ChainOnly {
    roots: Arc<rustls::RootCertStore>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl rustls::client::danger::ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let cert = rustls::server::ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// Bring the schema up to date: under the advisory lock, in one transaction, so that of several
/// hosts starting at once exactly one migrates and the others find it done.
fn migrate(client: &mut Client, location: &str) -> Result<(), StoreError> {
    let fail = |e: ::postgres::Error| StoreError::failed(kind_of(&e), location, detail(&e));
    let newer = |found: i64| {
        StoreError::failed(
            StoreErrorKind::NewerSchema,
            location,
            format!("schema {found}, this one knows {SCHEMA_VERSION}"),
        )
    };
    // Most of the time the schema is there already: a read, no lock, no write.
    match installed(client).map_err(fail)? {
        Some(v) if v == SCHEMA_VERSION => return Ok(()),
        Some(v) if v > SCHEMA_VERSION => return Err(newer(v)),
        _ => {}
    }
    let mut tx = client.transaction().map_err(fail)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).map_err(fail)?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS waymark_schema (version BIGINT NOT NULL)").map_err(fail)?;
    let found: Option<i64> = tx.query_opt("SELECT version FROM waymark_schema", &[]).map_err(fail)?.map(|r| r.get(0));
    let found = match found {
        Some(v) => v,
        None => {
            tx.execute("INSERT INTO waymark_schema (version) VALUES (0)", &[]).map_err(fail)?;
            0
        }
    };
    if found > SCHEMA_VERSION {
        return Err(newer(found));
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(usize::try_from(found).unwrap_or(0)) {
        tx.batch_execute(sql).map_err(fail)?;
        tx.execute("UPDATE waymark_schema SET version = $1", &[&(i as i64 + 1)]).map_err(fail)?;
    }
    tx.commit().map_err(fail)
}

/// The schema the database has, if any: a read, no lock, no write.
fn installed(client: &mut Client) -> Result<Option<i64>, ::postgres::Error> {
    let exists: bool = client.query_one("SELECT to_regclass('waymark_schema') IS NOT NULL", &[])?.get(0);
    if !exists {
        return Ok(None);
    }
    Ok(client.query_opt("SELECT version FROM waymark_schema", &[])?.map(|r| r.get(0)))
}

/// How long a statement made outside a run may go unanswered before the server is probed, and
/// how long the probe may take (see `stall`): the URL's `connect_timeout`, else 10 s.
fn patience(config: &PgConfig) -> Duration {
    config.conn.get_connect_timeout().copied().unwrap_or(Duration::from_secs(10))
}

/// A connection to the database of `config` whose statements outside a run are watched (see
/// `stall`), by the thread that made its handshake; with `config` as it names the connection, for
/// the connections made again in its place.
fn connect_watched(config: &PgConfig, location: &str) -> Result<(Client, Watch, PgConfig), StoreError> {
    let patience = patience(config);
    // The session's name tells it apart in `pg_stat_activity`, where the probe looks for it.
    let (tag, session) = session_name(config.conn.get_application_name());
    let mut named = config.clone();
    named.conn.application_name(&session);
    let probe = SessionProbe {
        config: config.clone(),
        location: location.to_owned(),
        like: format!("{tag}%"),
        patience,
        found: std::sync::atomic::AtomicBool::new(false),
        refused_since: std::sync::Mutex::default(),
    };
    let watch = Watch::new(patience, location, Box::new(move || probe.probe()));
    let client = connect_then(&named, location, Some(watch.run_later()))?;
    Ok((client, watch, named))
}

/// A watched session as the probe finds it in `pg_stat_activity`.
enum Session {
    /// Its state, and for how long it has been in it.
    Found(::postgres::Row),
    Missing,
    /// It could not be read.
    Unknown,
}

/// How many times `connect_timeout` a statement's watch waits, while the server answers every new
/// connection with an error (it is at `max_connections`, say), before it gives up on it.
const REFUSED_PROBES: u32 = 6;

/// The probe of a watched connection's statement (see `stall`): a new connection asks the server,
/// in `pg_stat_activity`, how the session named `like` is.
struct SessionProbe {
    config: PgConfig,
    location: String,
    /// The session's name as matched: its tag, then anything.
    like: String,
    patience: Duration,
    /// Whether the probe has found the session: one it no longer finds was ended by the server.
    found: std::sync::atomic::AtomicBool,
    /// Since when every new connection has been answered with an error while statements waited.
    refused_since: std::sync::Mutex<Option<Instant>>,
}

impl SessionProbe {
    /// `Ok` while the statement is worth waiting for; else why not, as the error says it.
    fn probe(&self) -> Result<(), String> {
        let mut refused = self.refused_since.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let client = match connect(&self.config, &self.location) {
            Ok(client) => client,
            // The server answered, with an error (it is at `max_connections`, say): it is there,
            // and is waited for, though not without end: it cannot say how the statement is.
            Err(StoreError::Failed { kind, detail, .. }) if kind != StoreErrorKind::Unreachable => {
                let limit = self.patience * REFUSED_PROBES;
                return match refused.get_or_insert_with(Instant::now).elapsed() >= limit {
                    true => Err(format!(
                        "{}, and for {} the server has refused every new connection ({detail}), so it cannot say \
                         whether it is at work on it",
                        self.unanswered(),
                        humantime::format_duration(limit)
                    )),
                    false => Ok(()),
                };
            }
            Err(StoreError::Failed { detail, .. }) => return Err(self.no_new_connection(&detail)),
            Err(other) => return Err(self.no_new_connection(&other.to_string())),
        };
        *refused = None;
        match self.ask(client)? {
            Session::Found(row) => {
                self.found.store(true, std::sync::atomic::Ordering::Relaxed);
                let state: Option<String> = row.get(0);
                let idle = row.get::<_, Option<f64>>(1).unwrap_or_default();
                // The server waits for the next statement, or for the end of the transaction, and
                // has for as long as the statement waited: what it answered, or the statement
                // itself, is stuck on the way.
                match state.as_deref() {
                    Some(s) if s.starts_with("idle") && idle >= self.patience.as_secs_f64() => Err(format!(
                        "{}, while the server has waited {idle:.1}s for the next one on its connection: what it \
                         answered, or the statement itself, is stuck on the way, {IN_BETWEEN}",
                        self.unanswered()
                    )),
                    _ => Ok(()),
                }
            }
            Session::Missing if self.found.load(std::sync::atomic::Ordering::Relaxed) => Err(format!(
                "{}, and the server has since ended the connection it was sent on (its end is stuck on the way, \
                 {IN_BETWEEN})",
                self.unanswered()
            )),
            // Not found (a pooler may name its server connections otherwise), or not readable:
            // the server answers, and is waited for.
            Session::Missing | Session::Unknown => Ok(()),
        }
    }

    /// The session (its state, and for how long it has been in it) as `client` finds it: on a
    /// thread of its own, for at most twice the patience (the probe's connection may stop
    /// answering too).
    fn ask(&self, mut client: Client) -> Result<Session, String> {
        let (done, asked) = std::sync::mpsc::channel();
        let (like, patience) = (self.like.clone(), self.patience);
        let asking = crate::os::signals::spawn_thread("waymark-pg-probe", move || {
            let seen = client.is_valid(patience).map(|()| {
                client.query_opt(
                    "SELECT state, extract(epoch FROM clock_timestamp() - state_change)::float8
                     FROM pg_stat_activity WHERE application_name LIKE $1 ORDER BY backend_start DESC LIMIT 1",
                    &[&like],
                )
            });
            let _ = done.send(seen);
        });
        if asking.is_err() {
            return Ok(Session::Unknown);
        }
        match asked.recv_timeout(patience * 2) {
            Ok(Ok(Ok(Some(row)))) => Ok(Session::Found(row)),
            Ok(Ok(Ok(None))) => Ok(Session::Missing),
            Ok(Ok(Err(_))) => Ok(Session::Unknown),
            Ok(Err(e)) => Err(self.no_new_connection(&detail(&e))),
            Err(_) => {
                let twice = humantime::format_duration(patience * 2);
                Err(self.no_new_connection(&format!("it did not answer within {twice}")))
            }
        }
    }

    /// How every reason to give up begins.
    fn unanswered(&self) -> String {
        format!("a statement had no answer within {}", humantime::format_duration(self.patience))
    }

    /// Why to give up when a new connection got no answer either (`why`).
    fn no_new_connection(&self, why: &str) -> String {
        format!(
            "{}, and a new connection got none either ({why}): the server, or a proxy or pooler in front of it, \
             has stopped answering",
            self.unanswered()
        )
    }
}

/// A watched connection's tag (`waymark ` and a random one) and `application_name`: the tag, then
/// the URL's own name if it gives one, in parentheses (the server keeps 63 bytes of it, and may
/// rewrite what is not ASCII: the tag comes first, and is looked for as the name's start).
fn session_name(own: Option<&str>) -> (String, String) {
    let tag = format!("waymark {:08x}", fastrand::u32(..));
    let name = match own.filter(|o| !o.is_empty()) {
        None => tag.clone(),
        Some(own) => format!("{tag} ({own})"),
    };
    (tag, name)
}

/// The shared store. See the module documentation.
pub(crate) struct PgStore {
    client: RefCell<Client>,
    /// The watch of its statements made outside a run; `None` for a lease's renewals (a runner's
    /// lease clock bounds those).
    watch: Option<Watch>,
    /// A statement of `client` failed for want of an answer from the server. The client learns
    /// that its connection is gone a moment later, on its own thread (`is_closed`): until then a
    /// write made at once would go to the dead connection again. See [`Self::connection_lost`].
    lost: Cell<bool>,
    /// The statements prepared on `client` (see [`Tx`]).
    prepared: RefCell<HashMap<&'static str, Statement>>,
    config: PgConfig,
    location: String,
    /// While a run goes on: its runner's lease clock. Writes that fail for want of a connection
    /// are retried until the runner is fenced off, and none is made after.
    clock: Option<Arc<LeaseClock>>,
    /// The SQL for whether an attempt was killed after its grace: the `killed` column, or
    /// `NULL` (not known) in a schema-1 database that a looking command reads as it is.
    killed_sql: &'static str,
}

impl PgStore {
    /// Connect and bring the schema up to date.
    pub(crate) fn open(config: &PgConfig, location: &str) -> Result<PgStore, StoreError> {
        let (mut client, watch, config) = connect_watched(config, location)?;
        let armed = watch.arm();
        migrate(&mut client, location)?;
        drop(armed);
        Ok(PgStore::with(client, watch, &config, location, SCHEMA_VERSION))
    }

    /// [`PgStore::open`] of a database where something was recorded: `None`, creating nothing, where
    /// waymark's schema is not (no run was ever recorded there).
    pub(crate) fn open_existing(config: &PgConfig, location: &str) -> Result<Option<PgStore>, StoreError> {
        let (mut client, watch, config) = connect_watched(config, location)?;
        let armed = watch.arm();
        let found = installed(&mut client).map_err(|e| StoreError::failed(kind_of(&e), location, detail(&e)))?;
        if found.is_none() {
            return Ok(None);
        }
        migrate(&mut client, location)?;
        drop(armed);
        Ok(Some(PgStore::with(client, watch, &config, location, SCHEMA_VERSION)))
    }

    /// Connect for a command that only looks: a database of an older schema is read as it is,
    /// so that looking never locks the older waymarks of other hosts out of it (the next runner
    /// migrates it). `None` for a database without waymark's schema: no run was ever recorded
    /// there, and a looking command writes nothing (the database may be a read-only one).
    pub(crate) fn open_for_reading(config: &PgConfig, location: &str) -> Result<Option<PgStore>, StoreError> {
        let (mut client, watch, config) = connect_watched(config, location)?;
        let armed = watch.arm();
        let found = installed(&mut client).map_err(|e| StoreError::failed(kind_of(&e), location, detail(&e)))?;
        let schema = match found {
            None => return Ok(None),
            Some(older) if older < SCHEMA_VERSION => older,
            // The current schema, or a newer one, which `migrate` refuses.
            Some(_) => {
                migrate(&mut client, location)?;
                SCHEMA_VERSION
            }
        };
        drop(armed);
        Ok(Some(PgStore::with(client, watch, &config, location, schema)))
    }

    fn with(client: Client, watch: Watch, config: &PgConfig, location: &str, schema: i64) -> PgStore {
        PgStore {
            client: RefCell::new(client),
            watch: Some(watch),
            lost: Cell::new(false),
            prepared: RefCell::default(),
            config: config.clone(),
            location: location.to_owned(),
            clock: None,
            // Attempts recorded before schema 2 say nothing of a kill after the grace.
            killed_sql: if schema < 2 { "NULL::boolean" } else { "killed" },
        }
    }

    fn pg(&self, e: &::postgres::Error) -> StoreError {
        StoreError::failed(kind_of(e), &self.location, detail(e))
    }

    fn fail(&self, f: Fail) -> StoreError {
        match f {
            Fail::Pg(e) => self.pg(&e),
            Fail::Bad { table, run_id, what } => {
                StoreError::BadState { location: self.location.clone(), table, run_id, what }
            }
            Fail::Lost { run_id, owner, why } => {
                StoreError::Fenced { run_id, location: self.location.clone(), owner, why }
            }
            Fail::Commit(e) => StoreError::failed(
                kind_of(&e),
                &self.location,
                format!("the commit's outcome is unknown ({}); the run resumes from what was recorded", detail(&e)),
            ),
        }
    }

    /// Why a write was refused when a fenced-off runner made it.
    fn fenced(&self, run_id: &str, owner: &str, why: String) -> StoreError {
        StoreError::Fenced { run_id: run_id.to_owned(), location: self.location.clone(), owner: owner.to_owned(), why }
    }

    /// Watch a statement made outside a run (see `stall`); a run's are bounded by its lease clock.
    fn watched(&self) -> Option<Armed<'_>> {
        self.watch.as_ref().filter(|_| self.clock.is_none()).map(Watch::arm)
    }

    /// Whether the connection is gone: closed, or a statement on it went unanswered.
    fn connection_lost(&self) -> bool {
        self.lost.get() || self.client.borrow().is_closed()
    }

    /// Statement `e` failed: if for want of an answer from the server, the connection is lost
    /// (see [`Self::lost`]).
    fn note_failure(&self, e: &::postgres::Error) {
        if kind_of(e) == StoreErrorKind::Unreachable {
            self.lost.set(true);
        }
    }

    /// A new connection in place of a lost one.
    fn reconnect(&self) -> Result<(), StoreError> {
        let client = connect(&self.config, &self.location)?;
        *self.client.borrow_mut() = client;
        self.lost.set(false);
        // Statements are the old connection's.
        self.prepared.borrow_mut().clear();
        Ok(())
    }

    /// Run `f` in a read-write transaction. While a run goes on (a lease clock is set), a failure
    /// of the connection before the commit is retried on a new connection until the runner is
    /// fenced off; without one it is the caller's error at once.
    fn write<T>(
        &self,
        run_id: &str,
        owner: &str,
        mut f: impl FnMut(&mut Tx) -> Result<T, Fail>,
    ) -> Result<T, StoreError> {
        loop {
            if let Some(why) = self.clock.as_ref().and_then(|c| c.fenced()) {
                return Err(self.fenced(run_id, owner, why));
            }
            let retry = |e: &StoreError| {
                self.clock.is_some() && matches!(e.kind(), Some(StoreErrorKind::Unreachable | StoreErrorKind::Busy))
            };
            if self.connection_lost()
                && let Err(e) = self.reconnect()
            {
                if retry(&e) {
                    std::thread::sleep(Duration::from_millis(250));
                    continue;
                }
                return Err(e);
            }
            let armed = self.watched();
            let mut client = self.client.borrow_mut();
            let margin_ms = self.clock.as_ref().map_or(0.0, |c| c.timing().margin_ms());
            let attempt = (|| {
                let mut tx = Tx { tx: client.transaction()?, prepared: &self.prepared, margin_ms };
                let out = f(&mut tx)?;
                // A runner fenced off while the transaction was under way (its statements held up
                // on their way to the database) does not commit it.
                if let Some(why) = self.clock.as_ref().and_then(|c| c.fenced()) {
                    return Err(Fail::Lost { run_id: run_id.to_owned(), owner: owner.to_owned(), why });
                }
                // A failed commit may have committed: never retried.
                tx.tx.commit().map_err(Fail::Commit)?;
                Ok(out)
            })();
            drop(client);
            drop(armed);
            if let Err(Fail::Pg(e) | Fail::Commit(e)) = &attempt {
                self.note_failure(e);
            }
            if attempt.is_err() {
                self.prepared.borrow_mut().clear();
            }
            match attempt {
                Ok(out) => return Ok(out),
                Err(Fail::Pg(e)) if self.clock.is_some() && transient(&e) => {
                    if let Some(clock) = &self.clock {
                        clock.renewal_failed(detail(&e));
                    }
                    // The connection may be usable again (a serialization failure); if not (it is
                    // lost), the next round reconnects.
                    std::thread::sleep(Duration::from_millis(250));
                }
                Err(e) => return Err(self.fail(e)),
            }
        }
    }

    /// Run `f` in a read-only transaction (one consistent snapshot).
    fn read<T>(&self, f: impl FnOnce(&mut Tx) -> Result<T, Fail>) -> Result<T, StoreError> {
        let armed = self.watched();
        let mut client = self.client.borrow_mut();
        let result = (|| {
            let tx = client
                .build_transaction()
                .isolation_level(::postgres::IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()?;
            let mut tx = Tx { tx, prepared: &self.prepared, margin_ms: 0.0 };
            let out = f(&mut tx)?;
            tx.tx.commit()?;
            Ok(out)
        })();
        drop(client);
        drop(armed);
        if result.is_err() {
            self.prepared.borrow_mut().clear();
        }
        result.map_err(|e| self.fail(e))
    }

    fn run_from_row(r: &::postgres::Row) -> Result<RunRecord, Fail> {
        let id: String = r.get("id");
        let status: String = r.get("status");
        let status = RunStatus::parse(&status).map_err(|e| bad("runs", &id, e))?;
        let key: String = r.get("flow_key");
        let key = FlowKey::parse(&key).ok_or_else(|| bad("runs", &id, format!("unknown flow key `{key}`")))?;
        Ok(RunRecord {
            key,
            flow: r.get("flow"),
            flow_path: PathBuf::from(r.get::<_, String>("flow_path")),
            definition: r.get("definition"),
            source_hash: r.get("source_hash"),
            status,
            started_at: from_millis(r.get("started_at")),
            ended_at: r.get::<_, Option<i64>>("ended_at").map(from_millis),
            pid: u32::try_from(r.get::<_, i64>("pid")).unwrap_or(0),
            host: r.get("host"),
            failed_step: r.get("failed_step"),
            // A database of an older schema, read as it is, has no such column.
            reopened_at: r.try_get::<_, Option<i64>>("reopened_at").ok().flatten().map(from_millis),
            id,
        })
    }

    /// Take the lease of `lease_key` for `owner` if nobody holds it, its holder's lease has
    /// expired, or its holder is `owner` itself (an earlier try whose answer was lost with its
    /// connection: owners are unique to a runner), raising the token, with when it was taken for
    /// the runner's clock (see [`WAITED`]); otherwise who holds it, as a message names them.
    pub(crate) fn try_lease(
        &self,
        lease_key: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Result<(i64, Instant), String>, StoreError> {
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let pid = i64::from(std::process::id());
        let _armed = self.watched();
        let mut client = self.client.borrow_mut();
        // Prepared first: a lock another session holds on the table may hold up its parsing too.
        let taking = client
            .prepare(&format!(
                "INSERT INTO waymark_leases (lease_key, owner, host, pid, token, expires_at)
                 VALUES ($1, $2, $3, $4, 1, clock_timestamp() + $5 * interval '1 millisecond')
                 ON CONFLICT (lease_key) DO UPDATE
                 SET owner = EXCLUDED.owner, host = EXCLUDED.host, pid = EXCLUDED.pid, run_id = NULL,
                     token = waymark_leases.token + 1, expires_at = clock_timestamp() + $5 * interval '1 millisecond'
                 WHERE waymark_leases.expires_at < clock_timestamp() OR waymark_leases.owner = EXCLUDED.owner
                 RETURNING token, {WAITED}"
            ))
            .map_err(|e| self.pg(&e))?;
        let sent = Instant::now();
        let taken = client
            .query_opt(&taking, &[&lease_key, &owner, &host_id(), &pid, &(ttl_ms as f64)])
            .map_err(|e| self.pg(&e))?;
        if let Some(row) = taken {
            return Ok(Ok((row.get(0), sent + waited(&row, 1))));
        }
        let holder = client
            .query_opt(
                "SELECT host, pid, to_char(expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'), run_id,
                        owner
                 FROM waymark_leases WHERE lease_key = $1",
                &[&lease_key],
            )
            .map_err(|e| self.pg(&e))?;
        Ok(Err(match holder {
            Some(r) => describe_holder(&r),
            None => "another runner holds its lease".to_owned(),
        }))
    }
}

/// How long a statement that set a lease's `expires_at` (to the time then plus the time to live,
/// `$5` milliseconds) waited in the database before it did (for a lock), as seconds: the time
/// from its arrival to then. The runner counts the lease from its sending (once prepared: a lock
/// may hold up the parsing too) plus this, a time the database's own expiry is never earlier
/// than.
const WAITED: &str =
    "greatest(0, extract(epoch FROM expires_at - $5 * interval '1 millisecond' - statement_timestamp()))::float8";

/// Column `i` of `row`, [`WAITED`].
fn waited(row: &::postgres::Row, i: usize) -> Duration {
    Duration::try_from_secs_f64(row.get::<_, f64>(i)).unwrap_or_default()
}

/// A holder as messages name it, from its columns `host, pid, expires_at (text), run_id, owner`:
/// `run ID on host H, pid P, its lease expires at T unless renewed`; a runner that took the lease
/// and has not yet created or claimed its run is `a runner starting (its run not chosen yet) on
/// host H, ...`, and `waymark gc` deleting the flow's finished runs is `waymark gc on host H, ...`.
fn describe_holder(r: &::postgres::Row) -> String {
    let (host, pid, expires, run): (String, i64, String, Option<String>) = (r.get(0), r.get(1), r.get(2), r.get(3));
    let owner: String = r.get(4);
    let who = match run {
        Some(run) => format!("run {run}"),
        None if owner.starts_with(GC_OWNER) => "`waymark gc` (deleting finished runs)".to_owned(),
        None => "a runner starting (its run not chosen yet)".to_owned(),
    };
    format!("{who} on host {host}, pid {pid}, its lease expires at {expires} unless renewed")
}

fn lost_to(holder: &str) -> String {
    format!("lost its lease to another runner ({holder})")
}

/// A transaction of [`PgStore`] with its connection's prepared statements. A statement given
/// as text is parsed by the server each time, a round trip before the one that runs it; the
/// runner's statements ([`Tx::exec`] and its siblings) are parsed once per connection and then
/// only run. They name the columns they read: a prepared `*` fails once a column is added. Any other statement goes through the transaction itself (`Deref`). The statements
/// are forgotten with the connection, and after any failed transaction.
pub(crate) struct Tx<'t, 'c> {
    tx: Transaction<'c>,
    prepared: &'t RefCell<HashMap<&'static str, Statement>>,
    /// How long before its expiry a runner's lease no longer lets it write (milliseconds): the
    /// margin at which the runner fences itself off ([`LeaseTiming::margin`]), 0 without a run.
    margin_ms: f64,
}

type Params<'p> = &'p [&'p (dyn ::postgres::types::ToSql + Sync)];

impl<'c> std::ops::Deref for Tx<'_, 'c> {
    type Target = Transaction<'c>;
    fn deref(&self) -> &Transaction<'c> {
        &self.tx
    }
}

impl<'c> std::ops::DerefMut for Tx<'_, 'c> {
    fn deref_mut(&mut self) -> &mut Transaction<'c> {
        &mut self.tx
    }
}

impl Tx<'_, '_> {
    /// `sql`, prepared on this connection (the first time it is asked for).
    fn statement(&mut self, sql: &'static str) -> Result<Statement, ::postgres::Error> {
        if let Some(statement) = self.prepared.borrow().get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.tx.prepare(sql)?;
        self.prepared.borrow_mut().insert(sql, statement.clone());
        Ok(statement)
    }

    fn exec(&mut self, sql: &'static str, params: Params<'_>) -> Result<u64, ::postgres::Error> {
        let statement = self.statement(sql)?;
        self.tx.execute(&statement, params)
    }

    fn one(&mut self, sql: &'static str, params: Params<'_>) -> Result<::postgres::Row, ::postgres::Error> {
        let statement = self.statement(sql)?;
        self.tx.query_one(&statement, params)
    }

    fn opt(&mut self, sql: &'static str, params: Params<'_>) -> Result<Option<::postgres::Row>, ::postgres::Error> {
        let statement = self.statement(sql)?;
        self.tx.query_opt(&statement, params)
    }

    fn all(&mut self, sql: &'static str, params: Params<'_>) -> Result<Vec<::postgres::Row>, ::postgres::Error> {
        let statement = self.statement(sql)?;
        self.tx.query(&statement, params)
    }
}

/// Check, in the writing transaction, that `lease` is still the lease of run `run_id` and is not
/// about to expire (by the database's clock, less the margin at which its runner fences itself
/// off: a write held up on its way, by a network or a runner that was stopped, is refused once
/// its runner has stopped, even if nobody took the lease yet); the lease row stays locked until
/// the commit, so a takeover waits for this write.
fn check_lease(tx: &mut Tx, run_id: &str, lease: &Lease) -> Result<(), Fail> {
    let margin_ms = tx.margin_ms;
    let found = tx.opt(
        "SELECT l.owner, l.token, l.host, l.pid, l.expires_at <= clock_timestamp() + $2 * interval '1 millisecond'
         FROM waymark_leases l WHERE l.lease_key = (SELECT lease_key FROM waymark_runs WHERE id = $1) FOR SHARE",
        &[&run_id, &margin_ms],
    )?;
    let mine = |r: &::postgres::Row| r.get::<_, String>(0) == lease.owner && r.get::<_, i64>(1) == lease.token;
    judge(found, mine, "nobody: the run or its lease is gone").map(drop).map_err(|why| Fail::Lost {
        run_id: run_id.to_owned(),
        owner: lease.owner.clone(),
        why,
    })
}

/// The lease row `found` (its columns `owner, token, host, pid, about to expire`) if it is this
/// runner's (`mine`) and not about to expire; else why the runner may not write (`none`: there is
/// no row).
fn judge(
    found: Option<::postgres::Row>,
    mine: impl Fn(&::postgres::Row) -> bool,
    none: &str,
) -> Result<::postgres::Row, String> {
    match found {
        Some(r) if mine(&r) && r.get::<_, bool>(4) => Err(EXPIRED.to_owned()),
        Some(r) if mine(&r) => Ok(r),
        Some(r) => Err(lost_to(&holder_of(&r))),
        None => Err(lost_to(none)),
    }
}

/// Why a write is refused that reached the database when its runner's lease was about to expire
/// (less than the margin left), though nobody took it over yet: the runner had fenced itself off
/// by then (it stops its attempts a quarter of the lease before it expires).
const EXPIRED: &str = "could not write in time: its lease was about to expire when the write reached the database";

/// A lease row's holder (its columns `owner, token, host, pid`) as messages name it.
fn holder_of(r: &::postgres::Row) -> String {
    format!("{} on host {}, pid {}", r.get::<_, String>(0), r.get::<_, String>(2), r.get::<_, i64>(3))
}

/// The run of attempt `row`, checking that `lease` is still that run's lease.
fn check_lease_of_attempt(tx: &mut Tx, row: i64, lease: &Lease) -> Result<String, Fail> {
    let run_id: Option<String> =
        tx.opt("SELECT run_id FROM waymark_attempts WHERE row_id = $1", &[&row])?.map(|r| r.get(0));
    let run_id = run_id.ok_or_else(|| bad("attempts", "?", format!("attempt {row} is not recorded")))?;
    check_lease(tx, &run_id, lease)?;
    Ok(run_id)
}

/// The lease `owner` holds on the flow of run `run_id` (locked for this transaction), if it has
/// not expired.
fn held_token(tx: &mut Tx, lease_key: &str, run_id: &str, owner: &str) -> Result<i64, Fail> {
    let margin_ms = tx.margin_ms;
    let row = tx.opt(
        "SELECT owner, token, host, pid, expires_at <= clock_timestamp() + $2 * interval '1 millisecond' \
         FROM waymark_leases WHERE lease_key = $1 FOR UPDATE",
        &[&lease_key, &margin_ms],
    )?;
    judge(row, |r| r.get::<_, String>(0) == owner, "nobody: this runner never took the flow's lease")
        .map(|r| r.get(1))
        .map_err(|why| Fail::Lost { run_id: run_id.to_owned(), owner: owner.to_owned(), why })
}

fn run_status(tx: &mut Tx, run_id: &str) -> Result<RunStatus, Fail> {
    let status: Option<String> = tx.opt("SELECT status FROM waymark_runs WHERE id = $1", &[&run_id])?.map(|r| r.get(0));
    let status = status.ok_or_else(|| bad("runs", run_id, "the run is not recorded"))?;
    RunStatus::parse(&status).map_err(|e| bad("runs", run_id, e))
}

fn move_run(tx: &mut Tx, run_id: &str, to: RunStatus) -> Result<(), Fail> {
    let from = run_status(tx, run_id)?;
    if !from.can_move_to(to) {
        return Err(bad("runs", run_id, format!("the run cannot go from {} to {}", from.as_str(), to.as_str())));
    }
    Ok(())
}

fn move_step(tx: &mut Tx, run_id: &str, step: &str, to: StepStatus) -> Result<(), Fail> {
    let state: Option<String> = tx
        .query_opt("SELECT state FROM waymark_steps WHERE run_id = $1 AND name = $2", &[&run_id, &step])?
        .map(|r| r.get(0));
    let state = state.ok_or_else(|| bad("steps", run_id, format!("step `{step}` is not recorded")))?;
    let from = StepStatus::parse(&state).map_err(|e| bad("steps", run_id, format!("step `{step}`: {e}")))?;
    if !from.can_move_to(to) {
        return Err(bad("steps", run_id, format!("step `{step}` cannot go from {} to {}", from.as_str(), to.as_str())));
    }
    Ok(())
}

/// The states a step may move to `to` from: an `UPDATE` that moves it checks its state with
/// `state = ANY(list)` instead of reading it first (a round trip less).
fn sources(to: StepStatus) -> Vec<&'static str> {
    StepStatus::sources_of(to).map(StepStatus::as_str).collect()
}

/// Check that an `UPDATE` that moved step `step` of run `run_id` to `to`, its row chosen with
/// [`sources`], changed it (`changed` rows): if not, the step's state forbids the move, and
/// [`move_step`] says why.
fn moved(tx: &mut Tx, changed: u64, run_id: &str, step: &str, to: StepStatus) -> Result<(), Fail> {
    if changed == 1 {
        return Ok(());
    }
    move_step(tx, run_id, step, to)?;
    Err(bad("steps", run_id, format!("step `{step}` was not moved to {}", to.as_str())))
}

/// The last [`TAIL_BYTES`] of a log file of this host: empty when there is none (a stream that
/// stayed empty leaves no file), `None` when it cannot be read.
fn tail(path: &Path) -> Option<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = match crate::os::fs::open_read_nofollow(path) {
        Ok(file) => file,
        // No file: nothing was written to it (a log is created on its first byte), unless its
        // directory is gone too (removed while the attempt ran): then nothing is known.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return path.parent().is_some_and(|dir| dir.is_dir()).then(Vec::new);
        }
        Err(_) => return None,
    };
    let len = file.metadata().ok()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES))).ok()?;
    let mut out = Vec::new();
    file.take(TAIL_BYTES).read_to_end(&mut out).ok()?;
    Some(out)
}

/// Record the ends of an attempt's output streams (read from this host's log files).
fn record_tails(tx: &mut Tx, row: i64) -> Result<(), Fail> {
    let stem: Option<String> =
        tx.opt("SELECT log_stem FROM waymark_attempts WHERE row_id = $1", &[&row])?.map(|r| r.get(0));
    let Some(stem) = stem else { return Ok(()) };
    let stem = PathBuf::from(stem);
    let (out, err) = (tail(&stem.with_extension("stdout")), tail(&stem.with_extension("stderr")));
    tx.exec("UPDATE waymark_attempts SET stdout_tail = $2, stderr_tail = $3 WHERE row_id = $1", &[&row, &out, &err])?;
    Ok(())
}

const SELECT_RUNS: &str = "SELECT * FROM waymark_runs";

/// The condition of `filter` on `waymark_runs`, with its value as `$1` and this host as `$2`: a
/// flow without a `name` is its file on its host, so of such runs only this host's are a flow's
/// (every host's are listed by `RunFilter::All`).
fn filter_sql(filter: RunFilter<'_>) -> (&'static str, Option<String>) {
    match filter {
        RunFilter::All => ("$1::text IS NULL AND $2::text IS NOT NULL", None),
        RunFilter::Name(name) => ("flow = $1 AND (key_host IS NULL OR key_host = $2)", Some(name.to_owned())),
        RunFilter::File(path) => {
            ("flow_path = $1 AND (key_host IS NULL OR key_host = $2)", Some(path.display().to_string()))
        }
        RunFilter::Key(key) => ("flow_key = $1 AND (key_host IS NULL OR key_host = $2)", Some(key.as_str().to_owned())),
    }
}

impl Store for PgStore {
    fn location(&self) -> &str {
        &self.location
    }

    fn create_run(&mut self, flow: &Flow, source_hash: &str, owner: &str) -> Result<(RunRecord, Lease), StoreError> {
        let definition = RunDefinition::recorded(flow, &self.location)?;
        let key = FlowKey::of(flow);
        let key_host = key.file().map(|_| host_id());
        let lkey = lease_key(&key, host_id());
        let path = flow.path.display().to_string();
        let pid = i64::from(std::process::id());
        let started = now_ms();
        let names: Vec<&str> = flow.steps.iter().map(|s| s.name.as_str()).collect();
        let (id, token) = self.write(super::NEW_RUN, owner, |tx| {
            let token = held_token(tx, &lkey, super::NEW_RUN, owner)?;
            let mut id = new_run_id();
            while tx.opt("SELECT 1 FROM waymark_runs WHERE id = $1", &[&id])?.is_some() {
                id = new_run_id();
            }
            tx.exec(
                "INSERT INTO waymark_runs (id, flow, flow_key, key_host, lease_key, flow_path, definition, source_hash,
                                           status, started_at, pid, host)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'running', $9, $10, $11)",
                &[
                    &id,
                    &flow.name,
                    &key.as_str(),
                    &key_host,
                    &lkey,
                    &path,
                    &definition,
                    &source_hash,
                    &started,
                    &pid,
                    &host_id(),
                ],
            )?;
            // Every step by one statement (one round trip), their names as one array.
            tx.exec(
                "INSERT INTO waymark_steps (run_id, position, name, state)
                 SELECT $1, (t.ord - 1)::int, t.name, 'pending' FROM unnest($2::text[]) WITH ORDINALITY AS t(name, ord)",
                &[&id, &names],
            )?;
            tx.exec("UPDATE waymark_leases SET run_id = $2 WHERE lease_key = $1", &[&lkey, &id])?;
            Ok((id.clone(), token))
        })?;
        let record = RunRecord::created(flow, id, definition, source_hash, started, host_id());
        Ok((record, Lease { owner: owner.to_owned(), token }))
    }

    fn run(&self, id: &str) -> Result<RunRecord, StoreError> {
        self.read(|tx| run_in(tx, id))?.ok_or_else(|| StoreError::NoSuchRun(id.to_owned()))
    }

    fn run_and_steps(&self, id: &str) -> Result<(RunRecord, Vec<StepRecord>), StoreError> {
        // One snapshot (the transaction is REPEATABLE READ): the run and its steps as one moment
        // saw them, even while the run's runner writes.
        let (run, steps) = self.read(|tx| Ok((run_in(tx, id)?, steps_in(tx, id)?)))?;
        Ok((run.ok_or_else(|| StoreError::NoSuchRun(id.to_owned()))?, steps))
    }

    fn find_resumable(&self, key: &FlowKey) -> Result<Option<RunRecord>, StoreError> {
        self.read(|tx| {
            let row = tx.query_opt(
                &format!(
                    "{SELECT_RUNS} WHERE flow_key = $1 AND status IN ('running', 'interrupted')
                     AND (key_host IS NULL OR key_host = $2) ORDER BY seq DESC LIMIT 1"
                ),
                &[&key.as_str(), &host_id()],
            )?;
            row.as_ref().map(Self::run_from_row).transpose()
        })
    }

    fn list_runs(&self, filter: RunFilter<'_>, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let (cond, value) = filter_sql(filter);
        self.read(|tx| {
            let rows = tx.query(
                &format!("{SELECT_RUNS} WHERE {cond} ORDER BY seq DESC LIMIT $3"),
                &[&value, &host_id(), &limit],
            )?;
            rows.iter().map(Self::run_from_row).collect()
        })
    }

    fn unfinished_runs(&self, filter: RunFilter<'_>, limit: usize) -> Result<Vec<RunRecord>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let (cond, value) = filter_sql(filter);
        self.read(|tx| {
            let rows = tx.query(
                &format!(
                    "{SELECT_RUNS} WHERE status IN ('running', 'interrupted') AND {cond} ORDER BY seq DESC LIMIT $3"
                ),
                &[&value, &host_id(), &limit],
            )?;
            rows.iter().map(Self::run_from_row).collect()
        })
    }

    fn flows(&self, filter: RunFilter<'_>) -> Result<Vec<(FlowKey, PathBuf)>, StoreError> {
        let (cond, value) = filter_sql(filter);
        let rows = self.read(|tx| {
            Ok(tx.query(
                &format!("SELECT flow_key, flow_path FROM waymark_runs WHERE {cond} ORDER BY seq DESC"),
                &[&value, &host_id()],
            )?)
        })?;
        let mut out: Vec<(FlowKey, PathBuf)> = Vec::new();
        for row in rows {
            let (key, path): (String, String) = (row.get(0), row.get(1));
            let key = FlowKey::parse(&key).unwrap_or(FlowKey(key));
            if !out.iter().any(|(k, _)| *k == key) {
                out.push((key, PathBuf::from(path)));
            }
        }
        Ok(out)
    }

    fn steps(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        self.read(|tx| steps_in(tx, run_id))
    }

    fn attempts(&self, run_id: &str, step: Option<&str>) -> Result<Vec<AttemptRecord>, StoreError> {
        self.read(|tx| {
            let sql = format!(
                "SELECT step, attempt, log_stem, host, outcome, started_at, ended_at, redelivered, error, {}
                 FROM waymark_attempts
                 WHERE run_id = $1 AND ($2::text IS NULL OR step = $2) AND kind = 'attempt' ORDER BY row_id",
                self.killed_sql
            );
            let rows = tx.query(&sql, &[&run_id, &step])?;
            rows.iter()
                .map(|r| {
                    let step: String = r.get(0);
                    let attempt = u32::try_from(r.get::<_, i64>(1)).unwrap_or(0);
                    let outcome: String = r.get(4);
                    let outcome = AttemptState::parse(&outcome)
                        .map_err(|e| bad("attempts", run_id, format!("attempt {attempt} of step `{step}`: {e}")))?;
                    Ok(AttemptRecord {
                        step,
                        attempt,
                        log_stem: PathBuf::from(r.get::<_, String>(2)),
                        host: Some(r.get(3)),
                        outcome,
                        started_at: from_millis(r.get(5)),
                        ended_at: r.get::<_, Option<i64>>(6).map(from_millis),
                        redelivered: r.get(7),
                        error: parse_error(r.get(8)),
                        killed_after_grace: r.get(9),
                    })
                })
                .collect()
        })
    }

    fn claim(&mut self, run_id: &str, owner: &str) -> Result<Lease, StoreError> {
        let pid = i64::from(std::process::id());
        self.write(run_id, owner, |tx| {
            let lkey: Option<String> =
                tx.opt("SELECT lease_key FROM waymark_runs WHERE id = $1", &[&run_id])?.map(|r| r.get(0));
            let lkey = lkey.ok_or_else(|| bad("runs", run_id, "the run is not recorded"))?;
            let token = held_token(tx, &lkey, run_id, owner)?;
            move_run(tx, run_id, RunStatus::Running)?;
            tx.exec(
                "UPDATE waymark_runs SET status = 'running', ended_at = NULL, failed_step = NULL, pid = $2, host = $3
                 WHERE id = $1",
                &[&run_id, &pid, &host_id()],
            )?;
            tx.exec("UPDATE waymark_leases SET run_id = $2 WHERE lease_key = $1", &[&lkey, &run_id])?;
            // Attempts the earlier runner left open ended with it (or with its lease).
            tx.exec(
                "UPDATE waymark_attempts SET outcome = 'runner_lost', ended_at = $2 WHERE run_id = $1 AND outcome = 'running'",
                &[&run_id, &now_ms()],
            )?;
            Ok(Lease { owner: owner.to_owned(), token })
        })
    }

    fn reopen_failed(&mut self, run_id: &str, at: SystemTime) -> Result<(), StoreError> {
        self.write(run_id, "", |tx| {
            tx.exec(
                "UPDATE waymark_steps SET state = 'pending', budget_base = attempts_used, ended_at = NULL
                 WHERE run_id = $1 AND state IN ('failed', 'skipped')",
                &[&run_id],
            )?;
            tx.exec(
                "UPDATE waymark_attempts SET kind = 'hook_before_reopen' WHERE run_id = $1 AND kind = 'hook'",
                &[&run_id],
            )?;
            tx.exec("UPDATE waymark_runs SET reopened_at = $2 WHERE id = $1", &[&run_id, &to_millis(at)])?;
            Ok(())
        })
    }

    fn handlers(&self, run_id: &str) -> Result<Vec<HandlerRun>, StoreError> {
        self.read(|tx| {
            let rows = tx.all(
                "SELECT step, attempt, outcome, exit_code, error, log_stem, host FROM waymark_attempts
                 WHERE run_id = $1 AND kind = 'catch' ORDER BY row_id",
                &[&run_id],
            )?;
            rows.iter()
                .map(|r| {
                    let outcome: String = r.get(2);
                    Ok(HandlerRun {
                        step: r.get(0),
                        attempt: u32::try_from(r.get::<_, i64>(1)).unwrap_or(0),
                        outcome: AttemptState::parse(&outcome).map_err(|e| bad("attempts", run_id, e))?,
                        exit_code: r.get(3),
                        error: parse_error(r.get(4)),
                        log_stem: PathBuf::from(r.get::<_, String>(5)),
                        host: Some(r.get(6)),
                    })
                })
                .collect()
        })
    }

    fn aux_runs(&self, run_id: &str) -> Result<Vec<AuxRun>, StoreError> {
        self.read(|tx| {
            let rows = tx.all(
                "SELECT kind, step, outcome, row_id, pid, proc_start, started_at, ended_at, exit_code, error
                 FROM waymark_attempts
                 WHERE run_id = $1 AND kind IN ('compensate', 'hook') ORDER BY row_id",
                &[&run_id],
            )?;
            rows.iter()
                .map(|r| {
                    let kind = match r.get::<_, String>(0).as_str() {
                        "compensate" => AuxKind::Compensate,
                        _ => AuxKind::Hook,
                    };
                    let outcome: String = r.get(2);
                    let state = AttemptState::parse(&outcome).map_err(|e| bad("attempts", run_id, e))?;
                    Ok(AuxRun {
                        kind,
                        name: r.get(1),
                        finished: matches!(state, AttemptState::Succeeded | AttemptState::Failed),
                        row: r.get(3),
                        pid: r.get::<_, Option<i64>>(4).and_then(|p| u32::try_from(p).ok()),
                        proc_start: r.get::<_, Option<i64>>(5).map(|v| v as u64),
                        outcome: state,
                        started_at: from_millis(r.get(6)),
                        ended_at: r.get::<_, Option<i64>>(7).map(from_millis),
                        exit_code: r.get(8),
                        error: parse_error(r.get(9)),
                    })
                })
                .collect()
        })
    }

    fn abandon(&mut self, run_id: &str, owner: &str) -> Result<(), StoreError> {
        self.write(run_id, owner, |tx| {
            let lkey: Option<String> =
                tx.opt("SELECT lease_key FROM waymark_runs WHERE id = $1", &[&run_id])?.map(|r| r.get(0));
            let lkey = lkey.ok_or_else(|| bad("runs", run_id, "the run is not recorded"))?;
            held_token(tx, &lkey, run_id, owner)?;
            move_run(tx, run_id, RunStatus::Abandoned)?;
            tx.exec(
                "UPDATE waymark_runs SET status = 'abandoned', ended_at = $2 WHERE id = $1",
                &[&run_id, &now_ms()],
            )?;
            Ok(())
        })
    }

    fn finished_before(&self, cutoff: SystemTime) -> Result<Vec<RunRecord>, StoreError> {
        self.read(|tx| {
            let rows = tx.query(
                &format!(
                    "{SELECT_RUNS} WHERE status IN ('succeeded', 'failed', 'abandoned') AND ended_at IS NOT NULL
                     AND ended_at < $1 ORDER BY seq"
                ),
                &[&to_millis(cutoff)],
            )?;
            rows.iter().map(Self::run_from_row).collect()
        })
    }

    fn delete_finished(&mut self, id: &str, cutoff: SystemTime) -> Result<bool, StoreError> {
        let cutoff = to_millis(cutoff);
        self.write(id, "", |tx| {
            let n = tx.exec(
                "DELETE FROM waymark_runs WHERE id = $1 AND status IN ('succeeded', 'failed', 'abandoned')
                 AND ended_at IS NOT NULL AND ended_at < $2",
                &[&id, &cutoff],
            )?;
            if n > 0 {
                tx.exec(
                    "INSERT INTO waymark_deleted_runs (id, deleted_at) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING",
                    &[&id, &now_ms()],
                )?;
            }
            Ok(n > 0)
        })
    }

    fn deleted_elsewhere(&mut self, ids: &[String]) -> Result<Vec<String>, StoreError> {
        self.write("?", "", |tx| {
            tx.exec("DELETE FROM waymark_deleted_runs WHERE deleted_at < $1", &[&(now_ms() - DELETIONS_KEPT_MS)])?;
            // A run deleted and since created again under the same id (ids are random) is kept.
            let rows = tx.all(
                "SELECT id FROM waymark_deleted_runs d WHERE id = ANY($1)
                   AND NOT EXISTS (SELECT 1 FROM waymark_runs r WHERE r.id = d.id) ORDER BY id",
                &[&ids],
            )?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
    }

    fn attempt_tail(&self, run_id: &str, log_stem: &Path, stream: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let column = if stream == "stderr" { "stderr_tail" } else { "stdout_tail" };
        let stem = log_stem.display().to_string();
        self.read(|tx| {
            let row = tx.query_opt(
                &format!(
                    "SELECT {column} FROM waymark_attempts WHERE run_id = $1 AND log_stem = $2
                     ORDER BY row_id DESC LIMIT 1"
                ),
                &[&run_id, &stem],
            )?;
            Ok(row.and_then(|r| r.get::<_, Option<Vec<u8>>>(0)))
        })
    }

    fn other_hosts(&self, filter: RunFilter<'_>) -> Result<Vec<String>, StoreError> {
        let (column, value) = match filter {
            RunFilter::All => return Ok(Vec::new()),
            RunFilter::Name(name) => ("flow", name.to_owned()),
            RunFilter::File(path) => ("flow_path", path.display().to_string()),
            RunFilter::Key(key) => ("flow_key", key.as_str().to_owned()),
        };
        self.read(|tx| {
            let rows = tx.query(
                &format!(
                    "SELECT DISTINCT key_host FROM waymark_runs WHERE {column} = $1 AND key_host <> $2 ORDER BY 1"
                ),
                &[&value, &host_id()],
            )?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
    }

    fn lease_holder(&self, run_id: &str) -> Option<Result<Option<String>, StoreError>> {
        Some(self.run_lease_holder(run_id))
    }

    fn fenced_by(&mut self, clock: Arc<LeaseClock>) {
        self.clock = Some(clock);
        self.watch = None;
    }
}

impl PgStore {
    /// Who holds the lease of run `run_id`'s flow now for that run (`None` if nobody's lease is
    /// live, or the live one is held for another run of the flow, or by `waymark gc`), as the
    /// embedded store's `FlowLock::is_held_for` tells it: a lease not yet given a run (a runner
    /// between taking it and claiming its run) counts, unless `gc` holds it.
    pub(crate) fn run_lease_holder(&self, run_id: &str) -> Result<Option<String>, StoreError> {
        self.read(|tx| {
            let row = tx.opt(
                "SELECT l.host, l.pid, to_char(l.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
                        l.run_id, l.owner
                 FROM waymark_leases l JOIN waymark_runs r ON r.lease_key = l.lease_key
                 WHERE r.id = $1 AND l.expires_at > clock_timestamp()
                   AND (l.run_id = r.id OR (l.run_id IS NULL AND l.owner NOT LIKE $2))",
                &[&run_id, &format!("{GC_OWNER}%")],
            )?;
            Ok(row.as_ref().map(describe_holder))
        })
    }
}

/// Run `id`, read in `tx`.
fn run_in(tx: &mut Tx, id: &str) -> Result<Option<RunRecord>, Fail> {
    let row = tx.query_opt(&format!("{SELECT_RUNS} WHERE id = $1"), &[&id])?;
    row.as_ref().map(PgStore::run_from_row).transpose()
}

/// The steps of run `run_id` in flow order, each with its current attempt's process, read in `tx`.
fn steps_in(tx: &mut Tx, run_id: &str) -> Result<Vec<StepRecord>, Fail> {
    let rows = tx.all(
        // Its columns named: a prepared `s.*` would fail once another host's newer waymark added
        // a column ("cached plan must not change result type").
        "SELECT s.name, s.state, s.attempts_used, s.budget_base, s.next_attempt, s.wake_at, s.current_row,
                s.last_error, s.started_at, s.ended_at, s.outputs,
                a.pid AS a_pid, a.proc_start AS a_start, a.attempt AS a_attempt, a.outcome AS a_outcome
         FROM waymark_steps s LEFT JOIN waymark_attempts a ON a.row_id = s.current_row
         WHERE s.run_id = $1 ORDER BY s.position",
        &[&run_id],
    )?;
    rows.iter().map(|r| step_from_row(run_id, r)).collect()
}

fn step_from_row(run_id: &str, r: &::postgres::Row) -> Result<StepRecord, Fail> {
    let name: String = r.get("name");
    let state: String = r.get("state");
    let badly = |what: String| bad("steps", run_id, format!("step `{name}`: {what}"));
    let u = |v: i64| u32::try_from(v).unwrap_or(0);
    let pid = r.get::<_, Option<i64>>("a_pid").and_then(|p| u32::try_from(p).ok());
    let start = r.get::<_, Option<i64>>("a_start").map(|v| v as u64);
    let state = match StepStatus::parse(&state).map_err(|e| badly(e.to_string()))? {
        StepStatus::Pending => StepState::Pending,
        StepStatus::Succeeded => StepState::Succeeded,
        StepStatus::Failed => StepState::Failed,
        StepStatus::Skipped => StepState::Skipped,
        StepStatus::Caught => StepState::Caught,
        StepStatus::Catching => StepState::Catching {
            attempt: u(r.get("attempts_used")),
            in_flight: r.get::<_, Option<i64>>("current_row").map(|row| (row, pid, start)),
        },
        StepStatus::Waiting => StepState::Waiting {
            next_attempt: u(r.get::<_, Option<i64>>("next_attempt").unwrap_or(0)),
            wake_at: from_millis(r.get::<_, Option<i64>>("wake_at").unwrap_or(0)),
        },
        StepStatus::Running => {
            let (Some(row), Some(attempt)) =
                (r.get::<_, Option<i64>>("current_row"), r.get::<_, Option<i64>>("a_attempt"))
            else {
                return Err(badly("running, but its attempt is not recorded".into()));
            };
            StepState::InFlight { attempt: u(attempt), row, pid, proc_start: start }
        }
    };
    let outputs = match r.get::<_, Option<String>>("outputs") {
        None => BTreeMap::new(),
        Some(json) => serde_json::from_str(&json)
            .map_err(|e| badly(format!("its outputs are not a JSON object of strings: {e}")))?,
    };
    let lost = matches!(&state, StepState::InFlight { .. } | StepState::Catching { in_flight: Some(_), .. })
        && r.get::<_, Option<&str>>("a_outcome") == Some("runner_lost");
    Ok(StepRecord {
        lost,
        state,
        attempts_used: u(r.get("attempts_used")),
        budget_base: u(r.get("budget_base")),
        last_error: parse_error(r.get("last_error")).map(Box::new),
        started_at: r.get::<_, Option<i64>>("started_at").map(from_millis),
        ended_at: r.get::<_, Option<i64>>("ended_at").map(from_millis),
        outputs,
        name,
    })
}

/// Record a `kind` row (an attempt, a catch handler, a compensation, a hook) of `step` starting
/// now on this host; its row id.
#[allow(clippy::too_many_arguments, reason = "the columns of one row")]
fn insert_running(
    tx: &mut Tx,
    run_id: &str,
    kind: &str,
    step: &str,
    attempt: u32,
    redelivered: bool,
    now: i64,
    stem: &str,
) -> Result<i64, ::postgres::Error> {
    let row = tx.one(
        "INSERT INTO waymark_attempts (run_id, kind, step, attempt, redelivered, outcome, started_at, log_stem, host)
         VALUES ($1, $2, $3, $4, $5, 'running', $6, $7, $8) RETURNING row_id",
        &[&run_id, &kind, &step, &i64::from(attempt), &redelivered, &now, &stem, &host_id()],
    )?;
    Ok(row.get(0))
}

/// Record, in `tx`, that attempt `next` of run `run_id` is about to be spawned (its step moves
/// to `running`); its row id. The caller checked the lease.
fn start_attempt(tx: &mut Tx, run_id: &str, next: &NextAttempt<'_>, now: i64) -> Result<i64, Fail> {
    let NextAttempt { step, attempt, redelivered, log_stem } = *next;
    let stem = log_stem.display().to_string();
    let row = insert_running(tx, run_id, "attempt", step, attempt, redelivered, now, &stem)?;
    let changed = tx.exec(
        "UPDATE waymark_steps SET state = 'running', current_row = $3, next_attempt = NULL, wake_at = NULL,
                started_at = COALESCE(started_at, $4)
         WHERE run_id = $1 AND name = $2 AND state = ANY($5)",
        &[&run_id, &step, &row, &now, &sources(StepStatus::Running)],
    )?;
    moved(tx, changed, run_id, step, StepStatus::Running)?;
    Ok(row)
}

/// Record, in `tx`, how attempt `row` of run `run_id` ended, with the ends of its output, and
/// what that does to its step. The caller checked the lease.
fn finish_attempt(
    tx: &mut Tx,
    run_id: &str,
    row: i64,
    result: &AttemptResult,
    update: &StepUpdate,
) -> Result<(), Fail> {
    let ended = to_millis(result.ended_at);
    let r = tx.one("SELECT run_id, step, outcome, kind FROM waymark_attempts WHERE row_id = $1", &[&row])?;
    let (of_run, step, outcome, kind): (String, String, String, String) = (r.get(0), r.get(1), r.get(2), r.get(3));
    let what = |e: &dyn std::fmt::Display| format!("attempt {row} of step `{step}`: {e}");
    if of_run != run_id {
        return Err(bad("attempts", run_id, what(&format!("it is an attempt of run {of_run}"))));
    }
    let from = AttemptState::parse(&outcome).map_err(|e| bad("attempts", run_id, what(&e)))?;
    let to = result.outcome.state();
    if !from.can_move_to(to) {
        let e = format!("cannot go from {} to {}", from.as_str(), to.as_str());
        return Err(bad("attempts", run_id, what(&e)));
    }
    tx.exec(
        "UPDATE waymark_attempts SET outcome = $2, ended_at = $3, exit_code = $4, signal = $5, error = $6,
                killed = $7
         WHERE row_id = $1",
        &[
            &row,
            &result.outcome.as_str(),
            &ended,
            &result.exit_code,
            &result.signal,
            &result.error.as_ref().map(error_json),
            &result.killed_after_grace,
        ],
    )?;
    record_tails(tx, row)?;
    // A catch handler's error is its own: the step keeps the error it failed with.
    let used = i64::from(result.outcome != AttemptOutcome::Cancelled && kind == "attempt");
    let step_error = result.error.as_ref().filter(|_| kind == "attempt").map(error_json);
    let (next, wake) = match update {
        StepUpdate::Waiting { next_attempt, wake_at } => (Some(i64::from(*next_attempt)), Some(to_millis(*wake_at))),
        _ => (None, None),
    };
    let ended_at = update.ends_step().then_some(ended);
    let outputs = match update {
        StepUpdate::Succeeded if !result.outputs.is_empty() => {
            Some(serde_json::to_string(&result.outputs).unwrap_or_default())
        }
        _ => None,
    };
    let changed = tx.exec(
        "UPDATE waymark_steps SET state = $3, attempts_used = attempts_used + $4, next_attempt = $5,
                wake_at = $6, current_row = NULL, last_error = COALESCE($7, last_error), ended_at = $8,
                outputs = COALESCE($9, outputs)
         WHERE run_id = $1 AND name = $2 AND state = ANY($10)",
        &[
            &run_id,
            &step,
            &update.status().as_str(),
            &used,
            &next,
            &wake,
            &step_error,
            &ended_at,
            &outputs,
            &sources(update.status()),
        ],
    )?;
    moved(tx, changed, run_id, &step, update.status())
}

impl RunLog for PgStore {
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
        let now = now_ms();
        self.write(run_id, &lease.owner, |tx| {
            check_lease(tx, run_id, lease)?;
            start_attempt(tx, run_id, &next, now)
        })
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
        let stem = log_stem.display().to_string();
        self.write(run_id, &lease.owner, |tx| {
            check_lease(tx, run_id, lease)?;
            let row = insert_running(tx, run_id, "catch", step, attempt, false, now, &stem)?;
            let changed = tx.exec(
                "UPDATE waymark_steps SET current_row = $3 WHERE run_id = $1 AND name = $2 AND state = ANY($4)",
                &[&run_id, &step, &row, &sources(StepStatus::Catching)],
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
        let now = now_ms();
        let stem = log_stem.display().to_string();
        self.write(run_id, &lease.owner, |tx| {
            check_lease(tx, run_id, lease)?;
            skip_steps(tx, run_id, skipped)?;
            let row = insert_running(tx, run_id, kind.as_str(), name, 1, false, now, &stem)?;
            Ok(row)
        })
    }

    fn aux_finished(&mut self, lease: &Lease, row: i64, result: &AttemptResult) -> Result<(), StoreError> {
        self.write("?", &lease.owner, |tx| {
            check_lease_of_attempt(tx, row, lease)?;
            tx.exec(
                "UPDATE waymark_attempts SET outcome = $2, ended_at = $3, exit_code = $4, signal = $5, error = $6
                 WHERE row_id = $1 AND outcome = 'running'",
                &[
                    &row,
                    &result.outcome.as_str(),
                    &to_millis(result.ended_at),
                    &result.exit_code,
                    &result.signal,
                    &result.error.as_ref().map(error_json),
                ],
            )?;
            record_tails(tx, row)
        })
    }

    fn attempt_spawned(
        &mut self,
        lease: &Lease,
        row: i64,
        pid: u32,
        proc_start: Option<u64>,
    ) -> Result<(), StoreError> {
        self.write("?", &lease.owner, |tx| {
            check_lease_of_attempt(tx, row, lease)?;
            tx.exec(
                "UPDATE waymark_attempts SET pid = $2, proc_start = $3 WHERE row_id = $1",
                &[&row, &i64::from(pid), &proc_start.map(|v| v as i64)],
            )?;
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
        self.write("?", &lease.owner, |tx| {
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
        let now = now_ms();
        self.write(run_id, &lease.owner, |tx| {
            check_lease(tx, run_id, lease)?;
            finish_attempt(tx, run_id, row, result, update)?;
            start_attempt(tx, run_id, next, now)
        })
    }

    fn run_finished(
        &mut self,
        lease: &Lease,
        run_id: &str,
        status: RunStatus,
        failed_step: Option<&str>,
        skipped: &[String],
    ) -> Result<(), StoreError> {
        self.write(run_id, &lease.owner, |tx| {
            check_lease(tx, run_id, lease)?;
            move_run(tx, run_id, status)?;
            skip_steps(tx, run_id, skipped)?;
            tx.exec(
                "UPDATE waymark_runs SET status = $2, ended_at = $3, failed_step = $4 WHERE id = $1",
                &[&run_id, &status.as_str(), &now_ms(), &failed_step],
            )?;
            Ok(())
        })
    }
}

/// Mark `skipped` the steps of run `run_id` that will not run.
fn skip_steps(tx: &mut Tx, run_id: &str, skipped: &[String]) -> Result<(), Fail> {
    let sources = sources(StepStatus::Skipped);
    for step in skipped {
        let changed = tx.exec(
            "UPDATE waymark_steps SET state = 'skipped', next_attempt = NULL, wake_at = NULL, current_row = NULL
             WHERE run_id = $1 AND name = $2 AND state = ANY($3)",
            &[&run_id, &step, &sources],
        )?;
        moved(tx, changed, run_id, step, StepStatus::Skipped)?;
    }
    Ok(())
}

/// A runner's lease on a flow of the shared store, renewed by a thread of its own (on its own
/// connection) until it is dropped, which gives it up (expires it now: the row, and so its
/// token, stays).
pub(crate) struct FlowLease {
    clock: Arc<LeaseClock>,
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Whether a lease was taken.
pub(crate) enum Leased {
    Taken(FlowLease),
    /// Another runner holds it: who, as messages name them.
    Held(String),
}

impl FlowLease {
    /// Take the lease of `lease_key` for `owner` on the database of `config` if nobody holds it
    /// (or its holder's lease has expired), and keep renewing it.
    pub(crate) fn try_take(
        config: &PgConfig,
        location: &str,
        lease_key: &str,
        owner: &str,
        timing: LeaseTiming,
    ) -> Result<Leased, StoreError> {
        let mut store = PgStore::open(config, location)?;
        let (token, taken) = match store.try_lease(lease_key, owner, timing.ttl)? {
            Ok(taken) => taken,
            Err(holder) => return Ok(Leased::Held(holder)),
        };
        let clock = Arc::new(LeaseClock::new(timing, taken));
        // Its renewals are bounded by the lease clock, which fences the runner off in time.
        store.watch = None;
        let (stop, stopped) = std::sync::mpsc::channel();
        let renewer = Renewer { store, lease_key: lease_key.to_owned(), owner: owner.to_owned(), token };
        let for_thread = Arc::clone(&clock);
        let thread = crate::os::signals::spawn_thread("waymark-lease", move || renewer.run(&for_thread, &stopped))
            .map_err(|e| StoreError::failed(StoreErrorKind::Other, location, format!("cannot start a thread: {e}")))?;
        Ok(Leased::Taken(FlowLease { clock, stop: Some(stop), thread: Some(thread) }))
    }

    pub(crate) fn clock(&self) -> Arc<LeaseClock> {
        Arc::clone(&self.clock)
    }
}

impl Drop for FlowLease {
    /// Stop renewing and give the lease up; a renewer stuck on a dead connection is left behind
    /// after a moment (the process is about to end, and the lease then expires by itself), at
    /// once if the runner is fenced off (it gives nothing up then, and the journal waited).
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let start = Instant::now();
            let wait = if self.clock.fenced().is_some() { Duration::ZERO } else { LET_GO_AFTER };
            while !thread.is_finished() && start.elapsed() < wait {
                std::thread::sleep(Duration::from_millis(10));
            }
            if thread.is_finished() {
                let _ = thread.join();
            }
        }
    }
}

struct Renewer {
    store: PgStore,
    lease_key: String,
    owner: String,
    token: i64,
}

impl Renewer {
    /// Why a renewal found no lease of this runner's to move: it had expired (a renewal held up
    /// on its way does not bring it back), or another runner took it over since.
    fn why_not_renewed(&self) -> String {
        let still_ours = self.store.client.borrow_mut().query_opt(
            "SELECT 1 FROM waymark_leases WHERE lease_key = $1 AND owner = $2 AND token = $3",
            &[&self.lease_key, &self.owner, &self.token],
        );
        match still_ours {
            Ok(Some(_)) => {
                "could not renew its lease in time: it was about to expire when the renewal reached the database"
                    .to_owned()
            }
            Ok(None) => "lost its lease to another runner, which took it over after it expired".to_owned(),
            Err(_) => "could not renew its lease: it had expired, or another runner took it over".to_owned(),
        }
    }

    fn run(self, clock: &LeaseClock, stopped: &std::sync::mpsc::Receiver<()>) {
        let timing = clock.timing();
        let ttl_ms = i64::try_from(timing.ttl.as_millis()).unwrap_or(i64::MAX) as f64;
        // A renewal that reaches the database when the lease is about to expire (its runner
        // fenced itself off by then) does not bring it back.
        let margin_ms = timing.margin_ms();
        loop {
            match stopped.recv_timeout(timing.renew) {
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                // Dropped: give the lease up (if it is still ours), so that another runner may
                // take the flow at once.
                _ => {
                    if clock.fenced().is_none() {
                        let _ = self.store.client.borrow_mut().execute(
                            "UPDATE waymark_leases SET expires_at = clock_timestamp() - interval '1 millisecond'
                             WHERE lease_key = $1 AND owner = $2 AND token = $3",
                            &[&self.lease_key, &self.owner, &self.token],
                        );
                    }
                    return;
                }
            }
            if clock.fenced().is_some() {
                return;
            }
            if let Err(why) = clock.may_renew() {
                clock.renewal_failed(why);
                continue;
            }
            if self.store.connection_lost()
                && let Err(e) = self.store.reconnect()
            {
                clock.renewal_failed(e.to_string());
                continue;
            }
            clock.renewing(Some(Instant::now()));
            // Prepared first, and the lease counted from the statement's sending (see `WAITED`).
            let mut sent = Instant::now();
            let renewed = {
                let mut client = self.store.client.borrow_mut();
                client
                    .prepare(&format!(
                        "UPDATE waymark_leases SET expires_at = clock_timestamp() + $4 * interval '1 millisecond'
                         WHERE lease_key = $1 AND owner = $2 AND token = $3
                           AND expires_at > clock_timestamp() + $5 * interval '1 millisecond'
                         RETURNING {}",
                        WAITED.replace("$5", "$4")
                    ))
                    .and_then(|renewal| {
                        sent = Instant::now();
                        client.query_opt(&renewal, &[&self.lease_key, &self.owner, &self.token, &ttl_ms, &margin_ms])
                    })
            };
            clock.renewing(None);
            match renewed {
                // From when the database set it: after a lock it waited for, if any.
                Ok(Some(row)) => clock.renewed(sent + waited(&row, 0)),
                Ok(None) => {
                    clock.lost(self.why_not_renewed());
                    return;
                }
                Err(e) => {
                    self.store.note_failure(&e);
                    clock.renewal_failed(format!("the database {}: {}", self.store.location, detail(&e)));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_keys_share_named_flows_and_keep_files_to_their_host() {
        let named = FlowKey::named("nightly");
        assert_eq!(lease_key(&named, "a"), lease_key(&named, "b"));
        let file = FlowKey::path(Path::new("/srv/nightly.toml"));
        assert_eq!(lease_key(&file, "a"), "path:/srv/nightly.toml#a");
        assert_ne!(lease_key(&file, "a"), lease_key(&file, "b"));
    }
}
