//! The runner's writes off its event loop. A [`ThreadJournal`] owns the store connection the run is
//! written through, on a thread of its own, with the run's id and the runner's [`Lease`]; each
//! [`RunJournal`] call sends the write there and awaits its reply, so a write that blocks (an
//! fsync, a database another process holds locked, one day a network round trip) never blocks the
//! runtime's thread: the tasks that supervise running attempts (their timeouts, their kills) and
//! any timer of the runner go on while the write waits.
//!
//! Writes are made one at a time, in the order they were sent; a reply means the write is
//! committed (or failed, and changed nothing). Dropping the journal closes the channel and waits
//! for the thread to make every write already sent, even one whose caller stopped waiting for the
//! reply, so nothing the runner sent is lost when it lets go of the run (and its flow's lock).
//!
//! A local store's write made while no child of the run is alive (the dispatcher says so, through
//! [`RunJournal::children_alive`]) and none is waiting for the thread is made on the caller's
//! thread instead, through the same connection: then there is no supervision for it to hold up,
//! and the hand-off to the thread and back (two wake-ups, about a tenth of a failing attempt's
//! time) is left out. Writes stay in the order they were sent: while one waits for the thread,
//! the next goes there too, and one the thread is making holds the connection until it is made.
//! The thread closes the connection when it ends, however it ends.
//!
//! On a shared store the journal also keeps the runner's lease clock ([`LeaseClock`]): once the
//! runner is fenced off (its lease lost, or not renewed in time) every write is refused without
//! being made, a write still waiting for the database is answered with the same error at once
//! (the writer thread may go on waiting for a dead connection), and [`RunJournal::lease_lost`]
//! resolves, so that the dispatcher kills the attempts.

use super::lease::{LET_GO_AFTER, LeaseClock};
use super::{AttemptResult, AuxKind, Lease, NextAttempt, RunJournal, RunLog, RunStatus, StepUpdate};
use super::{StoreError, StoreErrorKind};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// The store connection the run is written through, shared by the writer thread and the writes
/// made on the caller's thread; `None` once the thread has closed it.
type Log = Arc<Mutex<Option<Box<dyn RunLog + Send>>>>;

/// Closes the store on the writer thread however the thread ends, a panic included: a PostgreSQL
/// client must not be closed on the runtime's thread (it blocks on a runtime of its own). Its
/// sender, dropped after the store is closed, tells the journal's drop that the thread has ended.
struct CloseOnExit {
    log: Log,
    _ending: mpsc::Sender<()>,
}

impl Drop for CloseOnExit {
    fn drop(&mut self) {
        let store = self.log.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        drop(store);
    }
}

/// A write for the journal's thread, with where to send its result.
enum Write {
    Starting { step: String, attempt: u32, redelivered: bool, log_stem: PathBuf, reply: Reply<i64> },
    HandlerStarting { step: String, attempt: u32, log_stem: PathBuf, reply: Reply<i64> },
    AuxStarting { kind: AuxKind, name: String, log_stem: PathBuf, skipped: Vec<String>, reply: Reply<i64> },
    AuxFinished { row: i64, result: AttemptResult, reply: Reply<()> },
    Spawned { row: i64, pid: u32, proc_start: Option<u64>, reply: Reply<()> },
    Finished { row: i64, result: AttemptResult, update: StepUpdate, reply: Reply<()> },
    // `Finished`, then `Starting` of `next`, in one transaction.
    FinishedThenStarting { row: i64, result: AttemptResult, update: StepUpdate, next: Next, reply: Reply<i64> },
    RunFinished { status: RunStatus, failed_step: Option<String>, skipped: Vec<String>, reply: Reply<()> },
}

/// A [`NextAttempt`] sent to the thread.
struct Next {
    step: String,
    attempt: u32,
    redelivered: bool,
    log_stem: PathBuf,
}

/// A [`RunJournal`] whose writes run on a writer thread that owns the store connection.
pub(crate) struct ThreadJournal {
    writes: Option<mpsc::Sender<Write>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Disconnected once the thread has closed the store and is ending.
    ended: mpsc::Receiver<()>,
    /// The store's location, for the error if the thread is gone.
    location: String,
    run_id: String,
    owner: String,
    /// The lease clock of a shared store's runner.
    clock: Option<Arc<LeaseClock>>,
    log: Log,
    lease: Lease,
    /// Writes sent to the thread that it has not begun to make.
    queued: Arc<AtomicUsize>,
    /// Whether a child of the run may be alive (see [`RunJournal::children_alive`]).
    children: bool,
}

impl ThreadJournal {
    /// Start the writer thread for run `run_id`, owned under `lease`, writing through `log` (a
    /// store connection of its own: the thread is the only one to use it from now on).
    #[cfg(test)]
    pub(crate) fn start(
        log: Box<dyn RunLog + Send>,
        location: String,
        run_id: String,
        lease: Lease,
    ) -> std::io::Result<ThreadJournal> {
        Self::start_fenced(log, location, run_id, lease, None)
    }

    /// `ThreadJournal::start` for a runner whose lease `clock` keeps (see the module doc).
    pub(crate) fn start_fenced(
        log: Box<dyn RunLog + Send>,
        location: String,
        run_id: String,
        lease: Lease,
        clock: Option<Arc<LeaseClock>>,
    ) -> std::io::Result<ThreadJournal> {
        let (writes, queue) = mpsc::channel();
        let owner = lease.owner.clone();
        let fence = clock.as_ref().map(|c| (Arc::clone(c), location.clone()));
        let log: Log = Arc::new(Mutex::new(Some(log)));
        let queued = Arc::new(AtomicUsize::new(0));
        let (ending, ended) = mpsc::channel();
        let thread = {
            let (run_id, lease, queued) = (run_id.clone(), lease.clone(), Arc::clone(&queued));
            let close = CloseOnExit { log: Arc::clone(&log), _ending: ending };
            crate::os::signals::spawn_thread("waymark-journal", move || {
                let close = close;
                write_all(&close.log, &queue, &queued, &run_id, &lease, fence.as_ref());
            })?
        };
        Ok(ThreadJournal {
            writes: Some(writes),
            thread: Some(thread),
            ended,
            location,
            run_id,
            owner,
            clock,
            log,
            lease,
            queued,
            children: true,
        })
    }

    /// Whether the next write is made on the caller's thread: a local store's (no lease clock),
    /// while no child is alive and no write waits for the thread.
    fn inline(&self) -> bool {
        self.clock.is_none() && !self.children && self.queued.load(Ordering::SeqCst) == 0
    }

    /// The error of a write refused because the runner is fenced off, for `why`.
    fn fenced(&self, why: String) -> StoreError {
        fenced(&self.run_id, &self.location, &self.owner, why)
    }

    /// Make a write, on the caller's thread (see [`ThreadJournal::inline`]) or through the writer
    /// thread, and give its result.
    async fn send<T>(&mut self, write: impl FnOnce(Reply<T>) -> Write) -> Result<T, StoreError> {
        let (reply, mut result) = oneshot::channel();
        if self.inline() {
            // A lock the thread holds is let go of once the write it began is made.
            let Ok(mut log) = self.log.lock() else { return Err(self.gone()) };
            let Some(log) = log.as_mut() else { return Err(self.gone()) };
            apply(&mut **log, write(reply), &self.run_id, &self.lease);
            // Answered by now.
            return result.try_recv().unwrap_or_else(|_| Err(self.gone()));
        }
        self.queued.fetch_add(1, Ordering::SeqCst);
        let sent = self.writes.as_ref().is_some_and(|w| w.send(write(reply)).is_ok());
        if !sent {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(self.gone());
        }
        let Some(clock) = self.clock.clone() else { return result.await.unwrap_or_else(|_| Err(self.gone())) };
        tokio::select! {
            replied = result => replied.unwrap_or_else(|_| Err(self.gone())),
            why = clock.until_fenced() => Err(self.fenced(why)),
        }
    }

    /// The thread ended without replying: only a panic in a store does that.
    fn gone(&self) -> StoreError {
        StoreError::failed(
            StoreErrorKind::Other,
            &self.location,
            "the writer thread stopped (a bug in waymark; its panic message is above)",
        )
    }
}

fn fenced(run_id: &str, location: &str, owner: &str, why: String) -> StoreError {
    StoreError::Fenced { run_id: run_id.to_owned(), location: location.to_owned(), owner: owner.to_owned(), why }
}

/// The writer thread: make each write in turn until the journal is dropped. A reply nobody awaits
/// any more is dropped; the write was made all the same, unless the runner is fenced off by then.
fn write_all(
    log: &Log,
    queue: &mpsc::Receiver<Write>,
    queued: &AtomicUsize,
    run_id: &str,
    lease: &Lease,
    fence: Option<&(Arc<LeaseClock>, String)>,
) {
    for write in queue {
        // Counted off under the lock: a write on the caller's thread that finds none queued
        // waits for the lock, so it is made after this one.
        let Ok(mut log) = log.lock() else { return };
        queued.fetch_sub(1, Ordering::SeqCst);
        let Some(log) = log.as_mut() else { return };
        if let Some((clock, location)) = fence
            && let Some(why) = clock.fenced()
        {
            refuse(write, &fenced(run_id, location, &lease.owner, why));
            continue;
        }
        if let Some((clock, _)) = fence {
            clock.writing(true);
        }
        apply(&mut **log, write, run_id, lease);
        if let Some((clock, _)) = fence {
            clock.writing(false);
        }
    }
}

/// Make `write` through `log` and send its result.
fn apply(log: &mut (dyn RunLog + Send), write: Write, run_id: &str, lease: &Lease) {
    match write {
        Write::Starting { step, attempt, redelivered, log_stem, reply } => {
            let _ = reply.send(log.attempt_starting(lease, run_id, &step, attempt, redelivered, &log_stem));
        }
        Write::HandlerStarting { step, attempt, log_stem, reply } => {
            let _ = reply.send(log.handler_starting(lease, run_id, &step, attempt, &log_stem));
        }
        Write::AuxStarting { kind, name, log_stem, skipped, reply } => {
            let _ = reply.send(log.aux_starting(lease, run_id, kind, &name, &log_stem, &skipped));
        }
        Write::AuxFinished { row, result, reply } => {
            let _ = reply.send(log.aux_finished(lease, row, &result));
        }
        Write::Spawned { row, pid, proc_start, reply } => {
            let _ = reply.send(log.attempt_spawned(lease, row, pid, proc_start));
        }
        Write::Finished { row, result, update, reply } => {
            let _ = reply.send(log.attempt_finished(lease, row, &result, &update));
        }
        Write::FinishedThenStarting { row, result, update, next, reply } => {
            let Next { step, attempt, redelivered, log_stem } = &next;
            let next = NextAttempt { step, attempt: *attempt, redelivered: *redelivered, log_stem };
            let _ = reply.send(log.attempt_finished_then_starting(lease, run_id, row, &result, &update, &next));
        }
        Write::RunFinished { status, failed_step, skipped, reply } => {
            let _ = reply.send(log.run_finished(lease, run_id, status, failed_step.as_deref(), &skipped));
        }
    }
}

/// Answer a write with `error`, without making it.
fn refuse(write: Write, error: &StoreError) {
    let error = || match error {
        StoreError::Fenced { run_id, location, owner, why } => StoreError::Fenced {
            run_id: run_id.clone(),
            location: location.clone(),
            owner: owner.clone(),
            why: why.clone(),
        },
        other => StoreError::failed(StoreErrorKind::Other, "", other.to_string()),
    };
    let _ = match write {
        Write::Starting { reply, .. }
        | Write::HandlerStarting { reply, .. }
        | Write::AuxStarting { reply, .. }
        | Write::FinishedThenStarting { reply, .. } => reply.send(Err(error())).is_ok(),
        Write::AuxFinished { reply, .. }
        | Write::Spawned { reply, .. }
        | Write::Finished { reply, .. }
        | Write::RunFinished { reply, .. } => reply.send(Err(error())).is_ok(),
    };
}

impl Drop for ThreadJournal {
    /// Close the channel and wait until the thread has made every write sent before. A runner
    /// fenced off makes no write any more: a thread still stuck on a connection that stopped
    /// answering is let go after a moment ([`LET_GO_AFTER`]), and the process's end closes its
    /// connection (what it was writing is refused by the database, see `PgStore::write`; only a
    /// `COMMIT` already on its way can land, before any takeover).
    fn drop(&mut self) {
        drop(self.writes.take());
        let Some(thread) = self.thread.take() else { return };
        if let Some(clock) = &self.clock {
            let mut fenced_at = None;
            while let Err(mpsc::RecvTimeoutError::Timeout) = self.ended.recv_timeout(Duration::from_millis(50)) {
                if clock.fenced().is_some() && fenced_at.get_or_insert_with(Instant::now).elapsed() >= LET_GO_AFTER {
                    return;
                }
            }
        }
        let _ = thread.join();
    }
}

impl RunJournal for ThreadJournal {
    async fn attempt_starting(
        &mut self,
        step: &str,
        attempt: u32,
        redelivered: bool,
        log_stem: &Path,
    ) -> Result<i64, StoreError> {
        let (step, log_stem) = (step.to_owned(), log_stem.to_owned());
        self.send(|reply| Write::Starting { step, attempt, redelivered, log_stem, reply }).await
    }

    async fn handler_starting(&mut self, step: &str, attempt: u32, log_stem: &Path) -> Result<i64, StoreError> {
        let (step, log_stem) = (step.to_owned(), log_stem.to_owned());
        self.send(|reply| Write::HandlerStarting { step, attempt, log_stem, reply }).await
    }

    async fn aux_starting(
        &mut self,
        kind: AuxKind,
        name: &str,
        log_stem: &Path,
        skipped: &[String],
    ) -> Result<i64, StoreError> {
        let (name, log_stem, skipped) = (name.to_owned(), log_stem.to_owned(), skipped.to_vec());
        self.send(|reply| Write::AuxStarting { kind, name, log_stem, skipped, reply }).await
    }

    async fn aux_finished(&mut self, row: i64, result: &AttemptResult) -> Result<(), StoreError> {
        let result = result.clone();
        self.send(|reply| Write::AuxFinished { row, result, reply }).await
    }

    async fn attempt_spawned(&mut self, row: i64, pid: u32, proc_start: Option<u64>) -> Result<(), StoreError> {
        self.send(|reply| Write::Spawned { row, pid, proc_start, reply }).await
    }

    async fn attempt_finished(
        &mut self,
        row: i64,
        result: &AttemptResult,
        update: &StepUpdate,
    ) -> Result<(), StoreError> {
        let (result, update) = (result.clone(), update.clone());
        self.send(|reply| Write::Finished { row, result, update, reply }).await
    }

    async fn attempt_finished_then_starting(
        &mut self,
        row: i64,
        result: &AttemptResult,
        update: &StepUpdate,
        next: &NextAttempt<'_>,
    ) -> Result<i64, StoreError> {
        let (result, update) = (result.clone(), update.clone());
        let next = Next {
            step: next.step.to_owned(),
            attempt: next.attempt,
            redelivered: next.redelivered,
            log_stem: next.log_stem.to_owned(),
        };
        self.send(|reply| Write::FinishedThenStarting { row, result, update, next, reply }).await
    }

    async fn run_finished(
        &mut self,
        status: RunStatus,
        failed_step: Option<&str>,
        skipped: &[String],
    ) -> Result<(), StoreError> {
        let (failed_step, skipped) = (failed_step.map(str::to_owned), skipped.to_vec());
        self.send(|reply| Write::RunFinished { status, failed_step, skipped, reply }).await
    }

    fn children_alive(&mut self, alive: bool) {
        self.children = alive;
    }

    async fn lease_lost(&self) -> StoreError {
        match &self.clock {
            Some(clock) => self.fenced(clock.until_fenced().await),
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{AttemptOutcome, RunRecord, SqliteStore, StateDir, StepState, Store};
    use std::time::{Duration, Instant, SystemTime};

    /// A state directory with a run of a one-step flow, created by `owner`.
    fn run(owner: &str) -> (tempfile::TempDir, StateDir, RunRecord, Lease) {
        let dir = tempfile::tempdir().unwrap();
        let (flow, _) =
            crate::flow::parse("name = 'f'\n[[step]]\nname = 'a'\nrun = ['true']\n", &dir.path().join("f.toml"))
                .unwrap();
        let state = StateDir::create(dir.path()).unwrap();
        let (record, lease) = SqliteStore::open(&state).unwrap().create_run(&flow, "hash", owner).unwrap();
        (dir, state, record, lease)
    }

    fn journal(state: &StateDir, run: &RunRecord, lease: Lease) -> ThreadJournal {
        let store = SqliteStore::open(state).unwrap();
        let location = store.location().to_owned();
        ThreadJournal::start(Box::new(store), location, run.id.clone(), lease).unwrap()
    }

    fn succeeded() -> AttemptResult {
        AttemptResult {
            outcome: AttemptOutcome::Succeeded,
            exit_code: Some(0),
            signal: None,
            error: None,
            ended_at: SystemTime::now(),
            killed_after_grace: false,
            outputs: Default::default(),
        }
    }

    /// Another connection holding the database's write lock, as another process would.
    fn lock_database(state: &StateDir) -> rusqlite::Connection {
        let locker = rusqlite::Connection::open(state.db()).unwrap();
        locker.execute_batch("BEGIN EXCLUSIVE").unwrap();
        locker
    }

    /// Poll `write` while a 100 ms timer runs: the timer fires first, and soon (the write waits on
    /// the writer thread for a database another connection holds locked).
    async fn timer_fires_while<T: std::fmt::Debug>(write: std::pin::Pin<&mut impl Future<Output = T>>) {
        let start = Instant::now();
        let timer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            start.elapsed()
        });
        let fired = tokio::select! {
            fired = timer => fired.unwrap(),
            result = write => panic!("the write ended while the database was locked: {result:?}"),
        };
        assert!(fired < Duration::from_secs(3), "the 100 ms timer fired after {fired:?}");
    }

    #[tokio::test]
    async fn writes_are_made_on_the_thread_and_a_lost_lease_comes_back_as_the_error() {
        let (dir, state, run, lease) = run("host:1:first");
        let mut journal = journal(&state, &run, lease);
        let row = journal.attempt_starting("a", 1, false, &dir.path().join("x")).await.unwrap();
        journal.attempt_spawned(row, 4242, Some(7)).await.unwrap();
        let reader = SqliteStore::open(&state).unwrap();
        let a = |r: &SqliteStore| r.steps(&run.id).unwrap().remove(0).state;
        assert_eq!(a(&reader), StepState::InFlight { attempt: 1, row, pid: Some(4242), proc_start: Some(7) });

        // Another runner claims the run: this journal's writes are refused and change nothing.
        SqliteStore::open(&state).unwrap().claim(&run.id, "host:2:second").unwrap();
        let err = journal.attempt_finished(row, &succeeded(), &StepUpdate::Succeeded).await.unwrap_err();
        assert!(matches!(&err, StoreError::LeaseLost { holder, .. } if holder == "host:2:second"), "{err}");
        let err = journal.run_finished(RunStatus::Succeeded, None, &[]).await.unwrap_err();
        assert!(matches!(err, StoreError::LeaseLost { .. }), "{err}");
        assert!(matches!(a(&reader), StepState::InFlight { attempt: 1, .. }));
        assert_eq!(reader.run(&run.id).unwrap().status, RunStatus::Running);
    }

    /// The point of the journal: while a child is alive and a write waits for a database that
    /// another process holds locked (SQLite waits up to 10 s), the runner's timers (an attempt's
    /// timeout, a backoff) still fire on time. Written inline, the write would hold the runtime's
    /// only thread and the timer would fire only after the write gave up.
    #[tokio::test]
    async fn a_write_waiting_for_a_locked_store_does_not_stall_a_timer() {
        let (dir, state, run, lease) = run("host:1:only");
        let mut journal = journal(&state, &run, lease);
        // (As it is until the dispatcher says otherwise.)
        journal.children_alive(true);
        let locker = lock_database(&state);
        let stem = dir.path().join("x");
        let write = journal.attempt_starting("a", 1, false, &stem);
        tokio::pin!(write);
        timer_fires_while(write.as_mut()).await;
        // Once the other process lets go, the write goes through.
        locker.execute_batch("ROLLBACK").unwrap();
        let row = write.await.unwrap();
        let reader = SqliteStore::open(&state).unwrap();
        assert!(matches!(reader.steps(&run.id).unwrap()[0].state, StepState::InFlight { row: r, .. } if r == row));
    }

    /// While no child is alive (the dispatcher says so), a local store's write is made on the
    /// runtime's thread: no supervision waits on it then, and the hand-off to the writer thread
    /// and back is saved. So a timer due while the write waits for a locked database fires only
    /// after it (on the writer thread, as in the test above, it would fire first).
    #[tokio::test]
    async fn while_no_child_is_alive_a_write_is_made_on_the_runtime_s_thread() {
        use std::sync::atomic::AtomicBool;
        let (dir, state, run, lease) = run("host:1:only");
        let mut journal = journal(&state, &run, lease);
        journal.children_alive(false);
        let locker = lock_database(&state);
        let released = Arc::new(AtomicBool::new(false));
        let release = {
            let released = Arc::clone(&released);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(500));
                released.store(true, Ordering::SeqCst);
                locker.execute_batch("ROLLBACK").unwrap();
            })
        };
        let timer = {
            let released = Arc::clone(&released);
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                released.load(Ordering::SeqCst)
            })
        };
        let row = journal.attempt_starting("a", 1, false, &dir.path().join("x")).await.unwrap();
        assert!(timer.await.unwrap(), "the timer fired while the write waited: it was made on the writer thread");
        release.join().unwrap();
        let reader = SqliteStore::open(&state).unwrap();
        assert!(matches!(reader.steps(&run.id).unwrap()[0].state, StepState::InFlight { row: r, .. } if r == row));
    }

    /// A write still waiting for the thread is made first: one sent after it, with no child
    /// alive, goes through the thread too (on the runtime's thread it would wait for the lock the
    /// thread holds through the write before, then be made before the one waiting).
    #[tokio::test]
    async fn a_write_after_one_waiting_for_the_thread_goes_through_the_thread() {
        let (dir, state, run, lease) = run("host:1:only");
        let mut journal = journal(&state, &run, lease);
        let locker = lock_database(&state);
        // Sent while a child may be alive, then their callers stop waiting: the first waits for
        // the database's lock on the thread, the second for the thread.
        let stem = dir.path().join("x");
        let first = tokio::time::timeout(Duration::ZERO, journal.attempt_starting("a", 1, false, &stem));
        assert!(first.await.is_err(), "the database is locked: the write cannot have been made yet");
        let second = tokio::time::timeout(Duration::ZERO, journal.attempt_spawned(1, 4242, Some(7)));
        assert!(second.await.is_err(), "the thread is busy: the write cannot have been made yet");
        journal.children_alive(false);
        let result = succeeded();
        let third = journal.attempt_finished(1, &result, &StepUpdate::Succeeded);
        tokio::pin!(third);
        timer_fires_while(third.as_mut()).await;
        locker.execute_batch("ROLLBACK").unwrap();
        third.await.unwrap();
        let reader = SqliteStore::open(&state).unwrap();
        assert_eq!(reader.steps(&run.id).unwrap()[0].state, StepState::Succeeded);
    }

    /// The store is closed on the writer thread even when a write panicked there (a bug in a
    /// store): a PostgreSQL client closed on the runtime's thread would panic again, and the
    /// runner would not stop with its error.
    #[tokio::test]
    async fn the_store_is_closed_on_the_writer_thread_even_after_a_panic_there() {
        struct Panicking(Arc<Mutex<Option<String>>>);
        impl Drop for Panicking {
            fn drop(&mut self) {
                *self.0.lock().unwrap() = std::thread::current().name().map(str::to_owned);
            }
        }
        impl RunLog for Panicking {
            fn attempt_starting(
                &mut self,
                _: &Lease,
                _: &str,
                _: &str,
                _: u32,
                _: bool,
                _: &Path,
            ) -> Result<i64, StoreError> {
                panic!("a bug in the store")
            }
            fn handler_starting(&mut self, _: &Lease, _: &str, _: &str, _: u32, _: &Path) -> Result<i64, StoreError> {
                unreachable!()
            }
            fn aux_starting(
                &mut self,
                _: &Lease,
                _: &str,
                _: AuxKind,
                _: &str,
                _: &Path,
                _: &[String],
            ) -> Result<i64, StoreError> {
                unreachable!()
            }
            fn aux_finished(&mut self, _: &Lease, _: i64, _: &AttemptResult) -> Result<(), StoreError> {
                unreachable!()
            }
            fn attempt_spawned(&mut self, _: &Lease, _: i64, _: u32, _: Option<u64>) -> Result<(), StoreError> {
                unreachable!()
            }
            fn attempt_finished(
                &mut self,
                _: &Lease,
                _: i64,
                _: &AttemptResult,
                _: &StepUpdate,
            ) -> Result<(), StoreError> {
                unreachable!()
            }
            fn attempt_finished_then_starting(
                &mut self,
                _: &Lease,
                _: &str,
                _: i64,
                _: &AttemptResult,
                _: &StepUpdate,
                _: &NextAttempt<'_>,
            ) -> Result<i64, StoreError> {
                unreachable!()
            }
            fn run_finished(
                &mut self,
                _: &Lease,
                _: &str,
                _: RunStatus,
                _: Option<&str>,
                _: &[String],
            ) -> Result<(), StoreError> {
                unreachable!()
            }
        }
        let (dir, _state, run, lease) = run("host:1:only");
        let closed_on = Arc::new(Mutex::new(None));
        let store = Box::new(Panicking(Arc::clone(&closed_on)));
        let mut journal = ThreadJournal::start(store, "x".into(), run.id.clone(), lease).unwrap();
        let err = journal.attempt_starting("a", 1, false, &dir.path().join("x")).await.unwrap_err();
        assert!(err.to_string().contains("the writer thread stopped"), "{err}");
        // With no child alive the next write would be made here: it is refused, as the store is gone.
        journal.children_alive(false);
        let err = journal.run_finished(RunStatus::Interrupted, None, &[]).await.unwrap_err();
        assert!(err.to_string().contains("the writer thread stopped"), "{err}");
        drop(journal);
        assert_eq!(closed_on.lock().unwrap().as_deref(), Some("waymark-journal"));
    }

    #[test]
    fn dropping_the_journal_makes_the_writes_already_sent_even_if_nobody_awaits_them() {
        let (_dir, state, run, lease) = run("host:1:only");
        let mut journal = journal(&state, &run, lease);
        let locker = lock_database(&state);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        // The write is sent (polled once), then its caller stops waiting for it.
        let write = journal.run_finished(RunStatus::Interrupted, None, &[]);
        let abandoned = runtime.block_on(async { tokio::time::timeout(Duration::ZERO, write).await });
        assert!(abandoned.is_err(), "the database is locked: the write cannot have been made yet");
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            locker.execute_batch("ROLLBACK").unwrap();
        });
        drop(journal);
        release.join().unwrap();
        let reader = SqliteStore::open(&state).unwrap();
        assert_eq!(reader.run(&run.id).unwrap().status, RunStatus::Interrupted);
    }
}
