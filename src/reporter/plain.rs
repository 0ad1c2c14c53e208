//! Line-oriented output: child lines prefixed with their step, waymark's own lines on stderr
//! behind `waymark:`, and a failure report at the end.

use crate::events::{
    AbandonReason, AttemptEnd, Envelope, Event, NoticeKind, Reporter, RunOutcome, SkipReason, StepOutcome, Stream,
};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Lines of the failed attempt's stderr repeated in the failure report.
const TAIL_LINES: usize = 10;

fn human(d: std::time::Duration) -> String {
    // Round to milliseconds: nobody wants nanoseconds in a log line.
    humantime::format_duration(std::time::Duration::from_millis(d.as_millis() as u64)).to_string()
}

/// Bytes of child output that may wait for one terminal stream at once; beyond that its output is
/// dropped from the display (the logs keep all of it) until the stream catches up.
pub(crate) const BUDGET: usize = 8 * 1024 * 1024;
/// How long waymark waits at its end for a terminal stream that takes nothing more.
const STALL_LIMIT: Duration = Duration::from_secs(5);
/// Largest single write, so that progress of a slow reader is seen.
const PIECE: usize = 64 * 1024;

/// What a terminal writer is given, in order.
struct Item {
    text: Vec<u8>,
    /// How many of the bytes are child output, counted against [`BUDGET`].
    child_bytes: usize,
}

/// What a writer thread and the reporter share.
#[derive(Default)]
struct Shared {
    /// Child output queued and not written yet.
    queued: AtomicUsize,
    /// Bytes written so far: a reader that takes anything makes progress.
    written: AtomicU64,
    /// The first write error other than a closed pipe (a full disk, say).
    error: Mutex<Option<std::io::Error>>,
}

/// One terminal file (stdout, stderr, or both when they are the same file), written by a thread
/// of its own so that a stream that stops reading never stalls the event loop nor the other
/// stream.
struct Sink {
    name: &'static str,
    tx: Option<Sender<Item>>,
    /// Disconnected when the writer thread has written everything and ended.
    done: Receiver<()>,
    shared: Arc<Shared>,
}

impl Sink {
    fn start(name: &'static str, file: Option<File>) -> Sink {
        let (tx, rx) = channel::<Item>();
        let (done_tx, done) = channel::<()>();
        let shared = Arc::new(Shared::default());
        let state = Arc::clone(&shared);
        let write = move || {
            let _done = done_tx;
            let mut file = file;
            for item in rx {
                if let Some(f) = &mut file
                    && let Err(e) = write_item(f, &item.text, &state.written)
                {
                    // A closed pipe (`| head`) is the reader's choice and ends the display
                    // quietly; any other error is said at the end. Neither stops the run.
                    if e.kind() != std::io::ErrorKind::BrokenPipe {
                        *state.error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                    }
                    file = None;
                }
                state.queued.fetch_sub(item.child_bytes, Ordering::Relaxed);
            }
        };
        let tx = std::thread::Builder::new().name(format!("waymark-{name}")).spawn(write).ok().map(|_| tx);
        Sink { name, tx, done, shared }
    }

    /// Queue child output, or return false to drop it when the stream is too far behind.
    fn output(&self, text: Vec<u8>) -> bool {
        let Some(tx) = &self.tx else { return true };
        let n = text.len();
        if self.shared.queued.load(Ordering::Relaxed) + n > BUDGET {
            return false;
        }
        self.shared.queued.fetch_add(n, Ordering::Relaxed);
        if tx.send(Item { text, child_bytes: n }).is_err() {
            self.shared.queued.fetch_sub(n, Ordering::Relaxed);
        }
        true
    }

    /// Queue waymark's own line: always kept.
    fn line(&self, text: Vec<u8>) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Item { text, child_bytes: 0 });
        }
    }

    /// Let the writer finish what is queued; true when it did, false when the stream took
    /// nothing for [`STALL_LIMIT`].
    fn close(&mut self) -> bool {
        if self.tx.take().is_none() {
            return true;
        }
        let mut seen = self.shared.written.load(Ordering::Relaxed);
        let mut since = Instant::now();
        loop {
            match self.done.recv_timeout(Duration::from_millis(50)) {
                Err(RecvTimeoutError::Timeout) => {}
                Ok(()) | Err(RecvTimeoutError::Disconnected) => return true,
            }
            let now = self.shared.written.load(Ordering::Relaxed);
            if now != seen {
                (seen, since) = (now, Instant::now());
            } else if since.elapsed() >= STALL_LIMIT {
                return false;
            }
        }
    }
}

/// Write `text` in pieces, counting progress.
fn write_item(f: &mut File, text: &[u8], written: &AtomicU64) -> std::io::Result<()> {
    for piece in text.chunks(PIECE) {
        f.write_all(piece)?;
        written.fetch_add(piece.len() as u64, Ordering::Relaxed);
    }
    Ok(())
}

/// A handle of our own on a standard stream, so that writing it takes no lock that a blocked
/// writer could hold against the rest of waymark. `None` when the stream is closed.
fn own_handle(fd: std::os::fd::BorrowedFd<'_>) -> Option<File> {
    fd.try_clone_to_owned().ok().map(File::from)
}

/// Whether two handles are the same file (a terminal, or `2>&1`): one writer then keeps their
/// lines in order.
fn same_file(a: &File, b: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (a.metadata(), b.metadata()) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

/// Child output on the display, waymark's own lines on stderr. Child output that a terminal
/// stream is too far behind to take is dropped from the display (never from the logs), and a
/// warning says how much, so a stalled terminal never holds up the children, their timeouts or
/// the runner's signals.
pub(crate) struct PlainReporter {
    /// Show child output (off with `--quiet`).
    quiet: bool,
    /// Stdout's sink, and stderr's when it is another file.
    out: Sink,
    err: Option<Sink>,
    /// The run of the latest event, for the hint about where the logs are.
    run_id: String,
    /// Child output not shown, per step and stream, since it was last reported.
    dropped: BTreeMap<(String, &'static str), u64>,
}

impl PlainReporter {
    pub(crate) fn new(quiet: bool) -> PlainReporter {
        let out = own_handle(std::io::stdout().as_fd());
        let err = own_handle(std::io::stderr().as_fd());
        let shared = match (&out, &err) {
            (Some(o), Some(e)) => same_file(o, e),
            _ => false,
        };
        let (out, err) = if shared {
            (Sink::start("stdout and stderr", out), None)
        } else {
            (Sink::start("stdout", out), Some(Sink::start("stderr", err)))
        };
        PlainReporter { quiet, out, err, run_id: String::new(), dropped: BTreeMap::new() }
    }

    fn sink(&self, stream: Stream) -> &Sink {
        match (stream, &self.err) {
            (Stream::Stderr, Some(err)) => err,
            _ => &self.out,
        }
    }

    fn line(&self, text: String) {
        self.sink(Stream::Stderr).line(text.into_bytes());
    }

    /// Say how much output of `step` (of every step when `None`) was not shown.
    fn report_drops(&mut self, step: Option<&str>) {
        let keys: Vec<(String, &'static str)> =
            self.dropped.keys().filter(|(s, _)| step.is_none_or(|name| name == s)).cloned().collect();
        for key in keys {
            let Some(bytes) = self.dropped.remove(&key) else { continue };
            let (step, stream) = key;
            self.line(format!(
                "waymark: warning: {step}: {bytes} bytes of its {stream} not shown: {stream} was not being read \
                 fast enough; the log has all of it (`waymark logs {} {step} --stream {stream}`)\n",
                self.run_id
            ));
        }
    }

    /// Deliver what is queued before the process exits. A stream that takes nothing for
    /// [`STALL_LIMIT`] is given up on, and stderr says so when it can.
    fn close(&mut self) {
        let mut notes = Vec::new();
        // Whether stderr is a file of its own that took everything: only then is it told.
        let mut stderr_ok = self.err.is_some();
        // stderr first, so that its lines are out before a stalled stdout is waited for.
        let sinks = self.err.iter_mut().map(|s| (s, true)).chain(std::iter::once((&mut self.out, false)));
        for (sink, is_stderr) in sinks {
            let finished = sink.close();
            let error = sink.shared.error.lock().unwrap_or_else(|p| p.into_inner()).take();
            if is_stderr {
                stderr_ok = finished && error.is_none();
            }
            if !finished {
                notes.push(format!(
                    "waymark: warning: {} took nothing for {}s; the rest of the steps' output was not shown \
                     there (the logs have all of it: `waymark logs {} STEP`)\n",
                    sink.name,
                    STALL_LIMIT.as_secs(),
                    self.run_id
                ));
            }
            if let Some(e) = error {
                notes.push(format!(
                    "waymark: warning: cannot write to {}: {e}; what was to be shown there is in the logs \
                     (`waymark logs {} STEP`)\n",
                    sink.name, self.run_id
                ));
            }
        }
        // Written directly: the stderr writer is done.
        if !notes.is_empty()
            && stderr_ok
            && let Some(mut f) = own_handle(std::io::stderr().as_fd())
        {
            let _ = f.write_all(notes.concat().as_bytes());
        }
    }
}

impl Drop for PlainReporter {
    fn drop(&mut self) {
        self.close();
    }
}

impl Reporter for PlainReporter {
    fn report(&mut self, envelope: &Envelope) {
        if let Some(run_id) = &envelope.run_id {
            self.run_id.clone_from(run_id);
        }
        match &envelope.event {
            Event::Output { step, stream, chunk } => {
                if self.quiet {
                    return;
                }
                let mut text = Vec::with_capacity(chunk.len() + 16);
                for line in chunk.split_inclusive(|b| *b == b'\n') {
                    text.extend_from_slice(step.as_bytes());
                    text.extend_from_slice(b" | ");
                    text.extend_from_slice(line);
                }
                if !self.sink(*stream).output(text) {
                    *self.dropped.entry((step.clone(), stream.name())).or_default() += chunk.len() as u64;
                }
                return;
            }
            Event::AttemptFinished { step, outcome: AttemptEnd::Succeeded | AttemptEnd::Failed, .. } => {
                self.report_drops(Some(step));
            }
            Event::RunFinished { .. } => self.report_drops(None),
            _ => {}
        }
        if let Some(text) = describe(envelope) {
            self.line(text);
        }
    }
}

/// A run's age for a message: whole seconds, or milliseconds under a second.
fn readable(age: Duration) -> Duration {
    if age.as_secs() > 0 { Duration::from_secs(age.as_secs()) } else { age }
}

/// Waymark's own line(s) for an event, newline-terminated; `None` for the events that have no
/// line (a step's turn, start, wait and end are said by the attempts' lines).
fn describe(envelope: &Envelope) -> Option<String> {
    let run_id = envelope.run_id.as_deref().unwrap_or_default();
    let text = match &envelope.event {
        Event::RunStarted { flow, steps_total } => format!("waymark: run {run_id} of {flow}: {steps_total} step(s)"),
        Event::RunResumed { flow, steps_total, steps_done } => {
            format!("waymark: resuming run {run_id} of {flow}: {steps_done} of {steps_total} steps done")
        }
        Event::RunAbandoned { reason: AbandonReason::Fresh, .. } => {
            format!("waymark: abandoned unfinished run {run_id}")
        }
        Event::RunAbandoned { flow, file, reason: AbandonReason::Stale { age, limit } } => format!(
            "waymark: abandoned unfinished run {run_id} of flow `{flow}`: it started {} ago, longer than \
             resume_within = {} in {}; starting a new run (`waymark resume {run_id}` would still resume it)",
            humantime::format_duration(readable(*age)),
            humantime::format_duration(*limit),
            file.display(),
        ),
        Event::StepSkipped { step, reason: SkipReason::AlreadySucceeded } => {
            format!("waymark: {step}: already succeeded, skipped")
        }
        // `status` shows them; the failure report says why the run failed.
        Event::StepSkipped { reason: SkipReason::RunFailed | SkipReason::DeadlinePassed, .. }
        | Event::StepReady { .. }
        | Event::StepStarted { .. }
        | Event::StepWaiting { .. }
        | Event::HandlerFinished { .. }
        | Event::AuxStarted { kind: crate::store::AuxKind::Hook, .. }
        | Event::AuxFinished { .. }
        | Event::StepFinished { outcome: StepOutcome::Succeeded | StepOutcome::Failed, .. } => {
            return None;
        }
        Event::StepFinished { step, outcome: StepOutcome::Caught, .. } => {
            format!("waymark: {step}: error caught; the steps that need it run")
        }
        Event::AuxStarted { kind: crate::store::AuxKind::Compensate, name, .. } => {
            format!("waymark: {name}: compensating (the run failed)")
        }
        Event::HandlerStarted { step, error, .. } => format!("waymark: {step}: running its catch handler for {error}"),
        Event::AttemptStarted { step, attempt, max_attempts, redelivered, .. } => {
            if *max_attempts == 1 && *attempt == 1 && !*redelivered {
                return None;
            }
            let again = if *redelivered { " (redelivered)" } else { "" };
            format!("waymark: {step}: attempt {attempt}/{max_attempts}{again}")
        }
        Event::Output { .. } => return None,
        Event::AttemptFinished { step, attempt, outcome: AttemptEnd::Succeeded, duration, .. } => {
            format!("waymark: {step}: succeeded on attempt {attempt} in {}", human(*duration))
        }
        Event::AttemptFinished { step, attempt, max_attempts, outcome: AttemptEnd::Failed, error, retry, .. } => {
            let next = match retry {
                Some(plan) if plan.delay.is_zero() => "; retrying now".to_owned(),
                Some(plan) => format!("; retrying in {}", human(plan.delay)),
                None => String::new(),
            };
            let error = error.as_ref().map(|e| format!(": {e} [{}]", e.source.describe())).unwrap_or_default();
            format!("waymark: {step}: attempt {attempt}/{max_attempts} failed{error}{next}")
        }
        // A cancelled attempt runs again on resume; the run's end says it was interrupted.
        Event::AttemptFinished { outcome: AttemptEnd::Cancelled, .. } => return None,
        Event::Notice { notice: NoticeKind::Warning, step: Some(step), message } => {
            format!("waymark: warning: {step}: {message}")
        }
        Event::Notice { notice: NoticeKind::Warning, step: None, message } => format!("waymark: warning: {message}"),
        Event::Notice { step: Some(step), message, .. } => format!("waymark: {step}: {message}"),
        Event::Notice { step: None, message, .. } => format!("waymark: {message}"),
        // The command prints the error itself, with its hint, as for any other command.
        Event::RunAborted { .. } => return None,
        Event::Cancelling { signal, forced } => {
            let name = crate::flow::Signal::from_number(*signal).map_or("signal", |s| s.name());
            if *forced {
                format!("waymark: got {name} again, killing running steps")
            } else {
                format!("waymark: got {name}, stopping running steps (send it again to kill them)")
            }
        }
        Event::RunFinished { outcome: RunOutcome::Succeeded, .. } => format!("waymark: run {run_id} succeeded"),
        Event::RunFinished { outcome: RunOutcome::Interrupted { .. }, .. } => {
            format!("waymark: run {run_id} interrupted; `waymark run` again resumes it")
        }
        Event::RunFinished { outcome: RunOutcome::Failed, failure } => {
            let mut report = format!("\nwaymark: run {run_id} failed\n");
            if let Some(f) = failure {
                report.push_str(&format!(
                    "  step:     {}\n  error:    {}\n  source:   {}\n  attempts: {}\n",
                    f.step,
                    f.error,
                    f.error.source.describe(),
                    f.attempts
                ));
                let lines: Vec<&str> = f.stderr_tail.lines().collect();
                if !lines.is_empty() {
                    report.push_str("  stderr (last lines):\n");
                    for line in &lines[lines.len().saturating_sub(TAIL_LINES)..] {
                        report.push_str(&format!("    {line}\n"));
                    }
                }
                report.push_str(&format!("  logs:     {}", f.log_dir.display()));
            }
            report
        }
    };
    Some(text + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{RetryPlan, StepOutcome};
    use std::time::SystemTime;

    fn line(run_id: Option<&str>, event: Event) -> Option<String> {
        describe(&Envelope { seq: 1, at: SystemTime::UNIX_EPOCH, run_id: run_id.map(str::to_owned), event })
    }

    #[test]
    fn the_run_id_of_a_line_comes_from_the_envelope() {
        assert_eq!(
            line(Some("r1"), Event::RunStarted { flow: "nightly".into(), steps_total: 2 }).as_deref(),
            Some("waymark: run r1 of nightly: 2 step(s)\n")
        );
        assert_eq!(
            line(Some("r1"), Event::RunResumed { flow: "nightly".into(), steps_total: 2, steps_done: 1 }).as_deref(),
            Some("waymark: resuming run r1 of nightly: 1 of 2 steps done\n")
        );
    }

    #[test]
    fn an_abandoned_run_is_said_as_before() {
        let abandoned = |reason| Event::RunAbandoned { flow: "nightly".into(), file: "n.toml".into(), reason };
        assert_eq!(
            line(Some("old"), abandoned(AbandonReason::Fresh)).as_deref(),
            Some("waymark: abandoned unfinished run old\n")
        );
        let stale = AbandonReason::Stale { age: Duration::from_millis(7_200_900), limit: Duration::from_secs(3600) };
        assert_eq!(
            line(Some("old"), abandoned(stale)).as_deref(),
            Some(
                "waymark: abandoned unfinished run old of flow `nightly`: it started 2h ago, longer than \
                 resume_within = 1h in n.toml; starting a new run (`waymark resume old` would still resume it)\n"
            )
        );
    }

    #[test]
    fn notices_are_waymark_lines_and_warnings_say_so() {
        let notice = |notice, step: Option<&str>| Event::Notice {
            notice,
            step: step.map(str::to_owned),
            message: "text".into(),
        };
        let said = |event| line(None, event).unwrap_or_default();
        assert_eq!(said(notice(NoticeKind::Warning, Some("a"))), "waymark: warning: a: text\n");
        assert_eq!(said(notice(NoticeKind::Warning, None)), "waymark: warning: text\n");
        assert_eq!(said(notice(NoticeKind::WaitingForLock, None)), "waymark: text\n");
        assert_eq!(said(notice(NoticeKind::FlowChanged, None)), "waymark: text\n");
        assert_eq!(said(notice(NoticeKind::Info, Some("a"))), "waymark: a: text\n");
    }

    #[test]
    fn events_without_a_line_of_their_own_print_nothing() {
        let step = || "a".to_owned();
        let retry = RetryPlan { delay: Duration::from_secs(1), wake_at: SystemTime::UNIX_EPOCH };
        let silent = [
            Event::StepReady { step: step() },
            Event::StepStarted { step: step() },
            Event::StepWaiting { step: step(), next_attempt: 2, retry },
            Event::StepFinished { step: step(), outcome: StepOutcome::Succeeded, attempts: 1 },
            Event::StepFinished { step: step(), outcome: StepOutcome::Failed, attempts: 1 },
            Event::AttemptStarted { step: step(), attempt: 1, max_attempts: 1, pid: Some(1), redelivered: false },
            Event::AttemptFinished {
                step: step(),
                attempt: 1,
                max_attempts: 1,
                outcome: AttemptEnd::Cancelled,
                error: None,
                duration: Duration::from_millis(5),
                retry: None,
                stopped: None,
            },
        ];
        for event in silent {
            let shown = format!("{event:?}");
            assert_eq!(line(Some("r1"), event), None, "{shown}");
        }
    }
}
