//! The runner's own signals: counted delivery through signal-hook's registry, what was ignored
//! at start (`nohup`), and the default actions put back once the run is over.

use nix::sys::signal::Signal as NixSignal;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether signal `sig` was ignored when this process started (the `SigIgn` mask of
/// `/proc/self/status`, read before any handler of ours is installed). False where there is
/// no `/proc`.
pub(crate) fn ignored_at_start(sig: i32) -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else { return false };
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .unwrap_or(0);
    (1..=64).contains(&sig) && mask & (1 << (sig - 1)) != 0
}

/// Unblock every signal in the calling thread, before any other thread exists (they inherit its
/// mask). A mask inherited from waymark's parent would keep the runner from hearing SIGTERM, and
/// reach every step: a step that blocks SIGTERM sits out its timeout's signal until the SIGKILL.
/// Ignored signals are another matter, and stay ignored (`nohup`).
pub fn unblock_inherited_signals() {
    let _ = nix::sys::signal::SigSet::empty().thread_set_mask();
}

/// The signals the runner listens for: those whose default action would end it (leaving its
/// steps unsupervised, and its run `running` until a later runner finds it dead). Each is
/// forwarded to the running steps as itself, as a terminal or a service manager would have
/// signalled them without waymark in between.
const RUNNER_SIGNALS: [NixSignal; 7] = [
    NixSignal::SIGINT,
    NixSignal::SIGTERM,
    NixSignal::SIGHUP,
    NixSignal::SIGQUIT,
    NixSignal::SIGUSR1,
    NixSignal::SIGUSR2,
    NixSignal::SIGALRM,
];

/// Block the runner's own signals in the calling thread: each thread waymark starts does
/// ([`spawn_thread`], and the runtime's blocking threads by `on_thread_start`), so that the kernel
/// gives them to the main thread alone, the one that also sees the children end. A signal sent to the runner
/// and its steps at once (`systemctl stop`) is then handled (its flag set, see
/// [`runner_signalled`]) before the main thread can see a step end of it: handled on another
/// thread, it could be seen after, and the step, ended of the runner's signal, was recorded
/// failed instead of cancelled.
pub(crate) fn deafen_this_thread() {
    let mut set = nix::sys::signal::SigSet::empty();
    RUNNER_SIGNALS.iter().for_each(|sig| set.add(*sig));
    let _ = set.thread_block();
}

/// Start a thread named `name` that leaves the runner's signals to the main thread
/// ([`deafen_this_thread`]): every thread of waymark's own is started so.
pub(crate) fn spawn_thread<T: Send + 'static>(
    name: impl Into<String>,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<T>> {
    std::thread::Builder::new().name(name.into()).spawn(move || {
        deafen_this_thread();
        f()
    })
}

/// Put the runner's own signals back to their default action, once the run is over and
/// nothing listens for them any more, so that a signal during the last writes still ends the
/// process.
pub(crate) fn restore_default_signals() {
    use nix::sys::signal::{SigHandler, signal as set_handler};
    for sig in RUNNER_SIGNALS {
        if ignored_at_start(sig as i32) {
            continue;
        }
        // SAFETY: installs SIG_DFL, which runs no code of ours in the handler; the only unsafe
        // syscall wrapper needed here (sigaction).
        let _ = unsafe { set_handler(sig, SigHandler::SigDfl) };
    }
}

/// The runner's own signals ([`RUNNER_SIGNALS`]: SIGINT, SIGTERM, SIGHUP and the others whose
/// default action ends a process), each delivery counted: the handler (from
/// signal-hook's registry) writes one byte per delivery to a socket pair, and every byte read is
/// one signal. Installed before the runner starts any thread, and heard from [`RunnerSignals::listen`]
/// on, called before the run is created or claimed: until then a signal ends the process as its
/// default action would (waiting for a flow's lock stays interruptible), from then on it waits for
/// the event loop instead of killing the runner with the run left `running`; and two signals
/// delivered before the loop looked are two, so the second one still kills (tokio's signal
/// streams coalesce them). A signal that was ignored when waymark started (`nohup`) is not
/// listened for and stays ignored.
pub(crate) struct RunnerSignals<S = std::os::unix::net::UnixStream> {
    sources: Vec<(NixSignal, S, Registration)>,
    /// True until the runner listens: a signal then ends the process as by default.
    unheard: Arc<AtomicBool>,
    /// Set once the event loop reads the signals (or they are dropped): the set-up's watchdog
    /// ([`RunnerSignals::listen`]) stops.
    settled: Arc<AtomicBool>,
}

/// How long a signal heard while the run is set up may wait for the event loop before the
/// runner stops without it: set-up takes milliseconds, unless a store call is stuck on a
/// database that stopped answering, which nothing else would interrupt.
const SETUP_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// Removes the handler's actions when the signal is no longer listened for.
struct Registration([signal_hook::SigId; 3]);

/// Set by the handler itself the moment one of the runner's signals comes (see
/// [`runner_signalled`]).
static SIGNALLED: std::sync::OnceLock<Arc<AtomicBool>> = std::sync::OnceLock::new();

/// Whether one of the runner's own signals ([`RUNNER_SIGNALS`]) has come, by the handler's
/// flag: as of the moment it came, not of when the event loop got to it. A child that ends once
/// it has, before the runner passed the signal on (`systemctl stop` signals the steps with their
/// runner), ended of it: its supervisor counts it cancelled.
pub(crate) fn runner_signalled() -> bool {
    SIGNALLED.get().is_some_and(|flag| flag.load(Ordering::SeqCst))
}

impl Drop for Registration {
    fn drop(&mut self) {
        for id in self.0 {
            signal_hook::low_level::unregister(id);
        }
    }
}

/// [`RunnerSignals`] read by the event loop.
pub(crate) type AsyncSignals = RunnerSignals<tokio::net::UnixStream>;

impl RunnerSignals {
    /// Install the handlers, not heard yet ([`RunnerSignals::listen`]). To be called before the
    /// runner starts a thread: the signals are blocked in the calling thread while the handlers
    /// are installed, because signal-hook's registry drops a signal that comes between the
    /// installation of its handler and the publication of the handler's actions (it runs no
    /// default action then); blocked, it waits, and comes once they are in place.
    pub(crate) fn install() -> std::io::Result<RunnerSignals> {
        use nix::sys::signal::{SigSet, SigmaskHow, pthread_sigmask};
        let signals: Vec<NixSignal> = RUNNER_SIGNALS.into_iter().filter(|sig| !ignored_at_start(*sig as i32)).collect();
        let unheard = Arc::new(AtomicBool::new(true));
        let signalled = SIGNALLED.get_or_init(|| Arc::new(AtomicBool::new(false)));
        let mut blocked = SigSet::empty();
        signals.iter().for_each(|sig| blocked.add(*sig));
        let mut before = SigSet::empty();
        pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&blocked), Some(&mut before))?;
        let register = |sig: NixSignal| -> std::io::Result<_> {
            let (read, write) = std::os::unix::net::UnixStream::pair()?;
            read.set_nonblocking(true)?;
            // The byte first, then (while unheard) the default action: a process that goes on
            // has the byte to read.
            let flagged = signal_hook::flag::register(sig as i32, Arc::clone(signalled))?;
            let piped = signal_hook::low_level::pipe::register(sig as i32, write)?;
            let by_default = signal_hook::flag::register_conditional_default(sig as i32, Arc::clone(&unheard))?;
            Ok((sig, read, Registration([flagged, piped, by_default])))
        };
        let sources = signals.iter().map(|sig| register(*sig)).collect::<std::io::Result<Vec<_>>>();
        pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&before), None)?;
        Ok(RunnerSignals { sources: sources?, unheard, settled: Arc::new(AtomicBool::new(false)) })
    }

    /// Hear the signals from now on: each waits for the event loop rather than ending the process.
    /// Until the loop reads them, a watchdog thread looks at the sockets: a signal that waited
    /// [`SETUP_GRACE`] there (the set-up stuck in a store call) stops the runner, with 128 + its
    /// number, before any step has started.
    pub(crate) fn listen(&self) {
        self.unheard.store(false, Ordering::SeqCst);
        let watched: Vec<(NixSignal, std::os::unix::net::UnixStream)> =
            self.sources.iter().filter_map(|(sig, read, _)| Some((*sig, read.try_clone().ok()?))).collect();
        let settled = Arc::clone(&self.settled);
        let _ = spawn_thread("waymark-setup-watch", move || watch_setup(&watched, &settled));
    }

    /// The same signals, read by the event loop's runtime (which must be running).
    pub(crate) fn into_async(mut self) -> std::io::Result<AsyncSignals> {
        self.settled.store(true, Ordering::SeqCst);
        let sources = std::mem::take(&mut self.sources)
            .into_iter()
            .map(|(sig, read, id)| Ok((sig, tokio::net::UnixStream::from_std(read)?, id)))
            .collect::<std::io::Result<_>>()?;
        Ok(RunnerSignals { sources, unheard: Arc::clone(&self.unheard), settled: Arc::clone(&self.settled) })
    }
}

impl<S> Drop for RunnerSignals<S> {
    fn drop(&mut self) {
        self.settled.store(true, Ordering::SeqCst);
    }
}

/// The set-up's watchdog: until `settled`, look (without reading: the bytes are the event
/// loop's) for a signal on the sockets `watched`; one that is still unread after [`SETUP_GRACE`]
/// ends the process.
fn watch_setup(watched: &[(NixSignal, std::os::unix::net::UnixStream)], settled: &AtomicBool) {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    let mut first: Option<(std::time::Instant, NixSignal)> = None;
    while !settled.load(Ordering::SeqCst) {
        let mut fds: Vec<PollFd<'_>> = watched.iter().map(|(_, s)| PollFd::new(s.as_fd(), PollFlags::POLLIN)).collect();
        let _ = poll(&mut fds, PollTimeout::from(100u16));
        let ready = fds.iter().position(|fd| fd.revents().is_some_and(|r| r.contains(PollFlags::POLLIN)));
        if first.is_none() {
            first = ready.map(|i| (std::time::Instant::now(), watched[i].0));
        }
        if let Some((at, sig)) = first
            && at.elapsed() >= SETUP_GRACE
            && !settled.load(Ordering::SeqCst)
        {
            note!(
                "waymark: {sig:?} came {}s ago while the run was being set up, which has not finished (is the state \
                 database answering?); stopped before any step started, and nothing is lost: run it again once the \
                 database answers",
                SETUP_GRACE.as_secs()
            );
            std::process::exit(128 + sig as i32);
        }
    }
}

impl AsyncSignals {
    /// The next delivered signal, if one is waiting.
    pub(crate) fn try_next(&self) -> Option<NixSignal> {
        let mut byte = [0u8; 1];
        self.sources.iter().find_map(|(sig, read, _)| matches!(read.try_read(&mut byte), Ok(1)).then_some(*sig))
    }

    /// [`AsyncSignals::try_next`] for a runner that has worked a while without awaiting (killing
    /// a dead runner's leftovers before its first start, say): the runtime sees a byte only once
    /// it has polled for it, so the sockets themselves are read too. (Only then: that is one
    /// more system call per signal listened for.)
    pub(crate) fn try_next_unpolled(&self) -> Option<NixSignal> {
        let mut byte = [0u8; 1];
        self.try_next().or_else(|| {
            self.sources
                .iter()
                .find_map(|(sig, read, _)| matches!(nix::unistd::read(read, &mut byte), Ok(1)).then_some(*sig))
        })
    }

    /// Wait for the next delivered signal; pending forever when none is listened for.
    pub(crate) async fn next(&self) -> NixSignal {
        loop {
            if let Some(sig) = self.try_next() {
                return sig;
            }
            // Until one of the sockets is readable (each polled, so that each wakes the task).
            std::future::poll_fn(|cx| {
                let ready = self.sources.iter().filter(|(_, read, _)| read.poll_read_ready(cx).is_ready()).count();
                if ready > 0 { std::task::Poll::Ready(()) } else { std::task::Poll::Pending }
            })
            .await;
        }
    }
}
