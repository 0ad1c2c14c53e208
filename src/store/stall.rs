//! A watch on a shared store's statements made outside a run: the commands that look, `gc`, and a
//! runner's set-up. The synchronous client bounds no statement, and a server (or a proxy or pooler
//! in front of it) that stops answering after the handshake would hold such a command for ever.
//!
//! A statement with no answer within the patience (the URL's `connect_timeout`, else 10 s) is
//! followed by a probe (`PgStore`'s: a new connection, given as long, asks the server how the
//! statement's session is). A server at work on the statement (a slow one, or one waiting for a
//! lock, which the session's `lock_timeout` bounds) is waited for: the watch goes on, and probes
//! again after as long. One that does not answer the probe, or whose session has had nothing to
//! do for as long (what it answered, or the statement itself, is stuck on the way), makes the
//! watch give up ([`on_stall`]): the command ends as for a database it cannot reach. Ending it
//! loses nothing: the server rolls back what was not committed, and a runner's set-up has started
//! no step yet.
//!
//! A run's own writes are not watched: its lease fences the runner off in time (`lease.rs`).

use super::{StoreError, StoreErrorKind};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// What a watch does when it gives up: told why, it ends the process.
static ON_STALL: OnceLock<fn(StoreError) -> !> = OnceLock::new();

/// How a watch that gives up ends the process (the commands render the error as their own);
/// without it, `error: ERROR` and exit status 4.
pub(crate) fn on_stall(handler: fn(StoreError) -> !) {
    let _ = ON_STALL.set(handler);
}

fn give_up(error: StoreError) -> ! {
    match ON_STALL.get() {
        Some(handler) => handler(error),
        None => {
            eprintln!("error: {error}");
            std::process::exit(4)
        }
    }
}

/// Whether the statement is still worth waiting for (the server answers, and is at work on it, or
/// cannot say): `Err` with why not, as the error says it.
pub(crate) type Probe = Box<dyn Fn() -> Result<(), String> + Send + Sync>;

/// The watch of one store's statements; see the module documentation.
pub(crate) struct Watch {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    patience: Duration,
    probe: Probe,
    /// Told why it gave up: ends the process (a test's records it instead).
    stalled: Box<dyn Fn(String) + Send + Sync>,
}

#[derive(Default)]
struct State {
    /// Since when the statement under way has waited, while one does.
    since: Option<Instant>,
    /// Raised by every statement: tells a statement that ended from the next one.
    statement: u64,
    /// The thread that watches, once a statement started it.
    started: bool,
    /// The store is gone: the thread ends.
    dropped: bool,
}

/// A statement under way: watched until dropped.
pub(crate) struct Armed<'a>(&'a Watch);

impl Watch {
    /// A watch that probes with `probe` after `patience`, and on a failed probe ends the process
    /// saying that the database `location` stopped answering.
    pub(crate) fn new(patience: Duration, location: &str, probe: Probe) -> Watch {
        let location = location.to_owned();
        let stalled = move |why: String| give_up(StoreError::failed(StoreErrorKind::Unreachable, &*location, why));
        Watch::with(patience, probe, Box::new(stalled))
    }

    fn with(patience: Duration, probe: Probe, stalled: Box<dyn Fn(String) + Send + Sync>) -> Watch {
        let state = Mutex::new(State::default());
        Watch { shared: Arc::new(Shared { state, changed: Condvar::new(), patience, probe, stalled }) }
    }

    /// The watch's loop, for a thread that is started anyway to run it when that thread is done
    /// (the connection's handshake: one thread fewer to start for each store).
    pub(crate) fn run_later(&self) -> Box<dyn FnOnce() + Send> {
        self.shared.lock().started = true;
        let shared = Arc::clone(&self.shared);
        Box::new(move || shared.watch())
    }

    /// Watch a statement until the guard is dropped. The first one starts the thread that watches
    /// if [`Watch::run_later`] gave it to none.
    pub(crate) fn arm(&self) -> Armed<'_> {
        let mut state = self.shared.lock();
        state.since = Some(Instant::now());
        state.statement += 1;
        if !state.started {
            let shared = Arc::clone(&self.shared);
            // Without the thread, statements go unwatched, as they were before it.
            state.started = crate::os::signals::spawn_thread("waymark-pg-watch", move || shared.watch()).is_ok();
        }
        drop(state);
        self.shared.changed.notify_one();
        Armed(self)
    }
}

impl Drop for Armed<'_> {
    fn drop(&mut self) {
        self.0.shared.lock().since = None;
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.shared.lock().dropped = true;
        self.shared.changed.notify_one();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn watch(&self) {
        let mut state = self.lock();
        loop {
            if state.dropped {
                return;
            }
            let Some(since) = state.since else {
                state = self.changed.wait(state).unwrap_or_else(PoisonError::into_inner);
                continue;
            };
            let due = since + self.patience;
            let now = Instant::now();
            if now < due {
                state = self.changed.wait_timeout(state, due - now).unwrap_or_else(PoisonError::into_inner).0;
                continue;
            }
            // The statement has waited its patience: ask the server on a connection of its own.
            let statement = state.statement;
            drop(state);
            let probed = (self.probe)();
            state = self.lock();
            if state.since.is_none() || state.statement != statement {
                continue;
            }
            match probed {
                // At work: wait as long again.
                Ok(()) => state.since = Some(Instant::now()),
                Err(why) => {
                    drop(state);
                    (self.stalled)(why);
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::mpsc;

    fn watch(patience_ms: u64, answers: Arc<AtomicBool>, probes: Arc<AtomicUsize>) -> (Watch, mpsc::Receiver<String>) {
        let (told, stalled) = mpsc::channel();
        let told = Mutex::new(told);
        let probe: Probe = Box::new(move || {
            probes.fetch_add(1, Ordering::SeqCst);
            if answers.load(Ordering::SeqCst) { Ok(()) } else { Err("no answer".to_owned()) }
        });
        let stall = Box::new(move |why: String| {
            let _ = told.lock().unwrap().send(why);
        });
        (Watch::with(Duration::from_millis(patience_ms), probe, stall), stalled)
    }

    #[test]
    fn a_statement_the_server_never_answers_gives_up_after_a_failed_probe() {
        let (answers, probes) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
        let (watch, stalled) = watch(20, answers, Arc::clone(&probes));
        let _armed = watch.arm();
        let why = stalled.recv_timeout(Duration::from_secs(60)).expect("gave up");
        assert_eq!(why, "no answer");
        assert_eq!(probes.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_slow_statement_of_a_server_that_answers_probes_is_waited_for() {
        let (answers, probes) = (Arc::new(AtomicBool::new(true)), Arc::new(AtomicUsize::new(0)));
        let (watch, stalled) = watch(10, Arc::clone(&answers), Arc::clone(&probes));
        let armed = watch.arm();
        while probes.load(Ordering::SeqCst) < 3 {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(stalled.try_recv().is_err(), "a server that answers is waited for");
        // The statement is answered; a server that stops answering afterwards is not a stall of it.
        drop(armed);
        answers.store(false, Ordering::SeqCst);
        let after = probes.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(100));
        assert!(stalled.try_recv().is_err());
        assert!(probes.load(Ordering::SeqCst) <= after + 1, "no probe without a statement under way");
        // The next statement it does not answer is.
        let _armed = watch.arm();
        assert!(stalled.recv_timeout(Duration::from_secs(60)).is_ok());
    }

    /// A statement answered is no longer watched: its start is forgotten, and the next one's
    /// counts from its own (a watch that kept the first one's would probe a later quick one).
    #[test]
    fn a_statement_answered_is_no_longer_watched() {
        let (answers, probes) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
        let (watch, stalled) = watch(60_000, answers, Arc::clone(&probes));
        let first = watch.arm();
        let since = watch.shared.lock().since.expect("watched");
        drop(first);
        assert_eq!(watch.shared.lock().since, None, "answered: not watched");
        std::thread::sleep(Duration::from_millis(2));
        let _second = watch.arm();
        let state = watch.shared.lock();
        assert!(state.since.is_some_and(|s| s > since), "the next statement counts from its own start");
        assert_eq!(state.statement, 2);
        drop(state);
        assert_eq!(probes.load(Ordering::SeqCst), 0);
        assert!(stalled.try_recv().is_err());
    }
}
