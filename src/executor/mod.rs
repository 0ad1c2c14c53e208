//! The executor: one event loop that alone owns a run's state. Child exits, output, timers and the
//! runner's own signals all arrive here; every state change is committed to the store before the
//! next thing happens, and reported as an `Event`. It never prints.

mod attempt;
pub(crate) mod events;
pub(crate) mod output;
mod unix;

pub(crate) use events::{Event, Failure, RunOutcome, Stream};
pub(crate) use output::Chunk;
pub use unix::close_inherited_fds_on_exec;
pub(crate) use unix::{RunnerSignals, restore_default_signals};

use crate::classify::{self, Ending, ErrorSource, ErrorValue, Evidence, error_file};
use crate::flow::{Flow, Signal, Step};
use crate::reporter::Reporter;
use crate::retry::Decision;
use crate::store::{
    AttemptOutcome, AttemptResult, RunJournal, RunStatus, StateDir, StepRecord, StepState, StepUpdate, StoreError,
};
use attempt::{AttemptSpec, Control, End, SpawnError};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// How much of an attempt's stderr is kept for tracebacks and the failure report.
const STDERR_TAIL: u64 = 64 * 1024;

/// Messages from attempt tasks and output readers to the loop.
#[derive(Debug)]
pub(crate) enum Msg {
    /// Output of the attempt recorded as `row` (a reader left behind by an earlier attempt of the
    /// same step may still send some; the row tells it apart).
    Output {
        step: usize,
        row: i64,
        stream: Stream,
        chunk: Arc<Chunk>,
    },
    Done {
        step: usize,
        end: End,
        notes: Vec<String>,
    },
    /// An attempt's output could not be written to its log: waymark's own failure.
    LogFailed {
        row: i64,
        path: PathBuf,
        error: std::io::Error,
    },
}

/// Waymark's own failures while running (not a step's).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ExecError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot write attempt files at {}", path.display())]
    Files { path: PathBuf, source: std::io::Error },
    #[error("cannot install the runner's signal handlers: {0}")]
    Signals(std::io::Error),
    #[error(
        "processes {pids:?} of attempt {attempt} of step `{step}` from the previous runner did not die when killed; \
         the attempt is not run again while they live (check them with `ps -o pid,stat,cmd -p PID`)"
    )]
    Leftovers { step: String, attempt: u32, pids: Vec<u32> },
}

enum Slot {
    /// Ready to start `attempt`.
    Ready {
        attempt: u32,
        redelivered: bool,
    },
    Waiting {
        attempt: u32,
        wake: Instant,
    },
    Running {
        attempt: u32,
        row: i64,
        pid: u32,
        /// Where this attempt's output starts in its stderr log.
        stderr_from: u64,
        started: Instant,
        control: watch::Sender<Control>,
    },
    Succeeded,
    Failed,
}

struct StepSlot {
    step: Arc<Step>,
    slot: Slot,
    budget_base: u32,
    /// The attempt that ran last, whose logs explain a failure, and where its stderr starts.
    last_attempt: u32,
    last_stderr_from: u64,
    last_error: Option<ErrorValue>,
    /// Whether this runner has made sure the step's log directory exists.
    log_dir_ready: bool,
}

impl StepSlot {
    /// The number of the last attempt the current budget allows.
    fn max_attempts(&self) -> u32 {
        self.budget_base.saturating_add(self.step.retry.attempts)
    }
}

/// A run about to execute: the flow, its id, the state directory its logs go to, and each step's
/// recorded state.
pub(crate) struct RunSpec {
    pub(crate) flow: Arc<Flow>,
    pub(crate) run_id: String,
    pub(crate) state: StateDir,
    pub(crate) steps: Vec<StepRecord>,
    pub(crate) resumed: bool,
}

pub(crate) struct Executor<'a, J: RunJournal> {
    flow: Arc<Flow>,
    run_id: String,
    state: StateDir,
    store: &'a mut J,
    reporter: &'a mut dyn Reporter,
    steps: Vec<StepSlot>,
    rng: fastrand::Rng,
    tx: mpsc::Sender<Msg>,
    rx: mpsc::Receiver<Msg>,
    /// The first signal the runner received, if any.
    cancelled: Option<Signal>,
    running: usize,
    /// The runner's signals, until the event loop takes them.
    signals: Option<RunnerSignals>,
    /// Test hook, in debug builds only (`WAYMARK_TEST_CRASH_AFTER=STEP`): SIGKILL the runner right
    /// after an attempt outcome of STEP is committed, to test resuming from exactly that point.
    crash_after: Option<String>,
}

impl<'a, J: RunJournal> Executor<'a, J> {
    /// Set up a run from its recorded state. An attempt left in flight by a dead runner is made
    /// sure to be dead first; an error if some of its processes will not die.
    pub(crate) fn new(
        spec: RunSpec,
        store: &'a mut J,
        reporter: &'a mut dyn Reporter,
        signals: RunnerSignals,
    ) -> Result<Executor<'a, J>, ExecError> {
        let (tx, rx) = mpsc::channel(256);
        let resumed = spec.resumed;
        let done = spec.steps.iter().filter(|s| s.state == StepState::Succeeded).count();
        reporter.report(&Event::RunStarted {
            run_id: spec.run_id.clone(),
            flow: spec.flow.name.clone(),
            steps_total: spec.flow.steps.len(),
            steps_done: done,
            resumed,
        });
        let mut steps = Vec::with_capacity(spec.steps.len());
        for (step, rec) in spec.flow.steps.iter().zip(&spec.steps) {
            let slot = match &rec.state {
                StepState::Pending => Slot::Ready { attempt: rec.attempts_used + 1, redelivered: false },
                StepState::Succeeded => {
                    reporter.report(&Event::StepAlreadyDone { step: step.name.clone() });
                    Slot::Succeeded
                }
                StepState::Failed => Slot::Failed,
                StepState::Waiting { next_attempt, wake_at } => {
                    let left = wake_at.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO);
                    Slot::Waiting { attempt: *next_attempt, wake: Instant::now() + left }
                }
                StepState::InFlight { attempt, .. } => {
                    if let Some(message) = kill_leftovers(&spec.run_id, rec)? {
                        reporter.report(&Event::Warning { step: Some(step.name.clone()), message });
                    }
                    Slot::Ready { attempt: *attempt, redelivered: true }
                }
            };
            steps.push(StepSlot {
                step: Arc::new(step.clone()),
                slot,
                budget_base: rec.budget_base,
                last_attempt: rec.attempts_used,
                last_stderr_from: 0,
                last_error: rec.last_error.clone(),
                log_dir_ready: false,
            });
        }
        Ok(Executor {
            flow: spec.flow,
            run_id: spec.run_id,
            state: spec.state,
            store,
            reporter,
            steps,
            rng: fastrand::Rng::new(),
            tx,
            rx,
            cancelled: None,
            running: 0,
            signals: Some(signals),
            crash_after: if cfg!(debug_assertions) { std::env::var("WAYMARK_TEST_CRASH_AFTER").ok() } else { None },
        })
    }

    /// Run until every step succeeded, one failed for good, or a signal stopped the runner.
    /// On waymark's own failure every running attempt's process group is killed first.
    pub(crate) async fn run(mut self) -> Result<RunOutcome, ExecError> {
        let result = self.event_loop().await;
        if result.is_err() {
            for s in &self.steps {
                if let Slot::Running { pid, .. } = s.slot {
                    unix::kill_group(pid);
                }
            }
        }
        result
    }

    async fn event_loop(&mut self) -> Result<RunOutcome, ExecError> {
        let signals =
            self.signals.take().map(unix::RunnerSignals::into_async).transpose().map_err(ExecError::Signals)?;
        // Signals that came before the loop listened: nothing starts after them.
        while let Some(sig) = signals.as_ref().and_then(|s| s.try_next()) {
            self.on_signal(Signal(sig));
        }
        let next_signal = || async {
            match &signals {
                Some(s) => s.next().await,
                None => std::future::pending().await,
            }
        };
        loop {
            if self.cancelled.is_none() {
                self.start_ready().await?;
            }
            if self.running == 0
                && let Some(outcome) = self.finished()
            {
                return self.finish(outcome).await;
            }
            let wake = self.next_wake();
            tokio::select! {
                Some(msg) = self.rx.recv() => self.handle(msg).await?,
                _ = tokio::time::sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => {}
                sig = next_signal() => self.on_signal(Signal(sig)),
            }
        }
    }

    /// The run's outcome once nothing is running, or `None` while work remains.
    fn finished(&self) -> Option<RunOutcome> {
        if self.steps.iter().all(|s| matches!(s.slot, Slot::Succeeded)) {
            return Some(RunOutcome::Succeeded);
        }
        if self.steps.iter().any(|s| matches!(s.slot, Slot::Failed)) {
            return Some(RunOutcome::Failed);
        }
        self.cancelled.map(|sig| RunOutcome::Interrupted { signal: sig.number() })
    }

    fn next_wake(&self) -> Option<Instant> {
        if self.cancelled.is_some() {
            return None;
        }
        self.steps
            .iter()
            .filter_map(|s| match s.slot {
                Slot::Waiting { wake, .. } => Some(wake),
                _ => None,
            })
            .min()
    }

    /// Steps run in file order: the first unfinished step runs once all before it succeeded.
    async fn start_ready(&mut self) -> Result<(), ExecError> {
        let Some(index) = self.steps.iter().position(|s| !matches!(s.slot, Slot::Succeeded)) else {
            return Ok(());
        };
        let now = Instant::now();
        let (attempt, redelivered) = match self.steps[index].slot {
            Slot::Ready { attempt, redelivered } => (attempt, redelivered),
            Slot::Waiting { attempt, wake } if wake <= now => (attempt, false),
            _ => return Ok(()),
        };
        self.start_attempt(index, attempt, redelivered).await
    }

    fn attempt_stem(&self, step: &Step, attempt: u32) -> PathBuf {
        self.state.attempt_stem(&self.run_id, &step.name, attempt)
    }

    async fn start_attempt(&mut self, index: usize, attempt: u32, redelivered: bool) -> Result<(), ExecError> {
        let issued = Instant::now();
        let step = Arc::clone(&self.steps[index].step);
        let max_attempts = self.steps[index].max_attempts();
        let stem = self.attempt_stem(&step, attempt);
        let files_err = |path: &Path, source| ExecError::Files { path: path.to_owned(), source };
        if !self.steps[index].log_dir_ready {
            let dir = self.state.step_logs(&self.run_id, &step.name);
            crate::store::create_private_dir(&dir).map_err(|e| files_err(&dir, e))?;
            self.steps[index].log_dir_ready = true;
        }
        let error_path = stem.with_extension("error.json");
        error_file::create_error_file(&error_path).map_err(|e| files_err(&error_path, e))?;
        // The start is durable before the child exists.
        let row = self.store.attempt_starting(&step.name, attempt, redelivered, &stem).await?;
        let attempt_id = attempt_id(&self.run_id, row);
        let mut env: Vec<(String, String)> =
            self.flow.env.iter().chain(&step.env).map(|(k, v)| (k.clone(), v.clone())).collect();
        env.extend([
            ("WAYMARK_RUN_ID".to_owned(), self.run_id.clone()),
            ("WAYMARK_FLOW".to_owned(), self.flow.name.clone()),
            ("WAYMARK_STEP".to_owned(), step.name.clone()),
            ("WAYMARK_ATTEMPT".to_owned(), attempt.to_string()),
            ("WAYMARK_MAX_ATTEMPTS".to_owned(), max_attempts.to_string()),
            ("WAYMARK_ERROR_FILE".to_owned(), error_path.display().to_string()),
            (unix::ATTEMPT_ID_VAR.to_owned(), attempt_id.clone()),
        ]);
        let spec = AttemptSpec {
            step_index: index,
            step: Arc::clone(&step),
            env,
            stdout_log: stem.with_extension("stdout"),
            stderr_log: stem.with_extension("stderr"),
            row,
            attempt_id,
            attempt,
            redelivered,
        };
        // Ok: the child runs. Err: it could not be started, which is the attempt's failure.
        let spawned = match attempt::spawn(&spec, &self.tx) {
            Ok(running) => Ok(running),
            Err(SpawnError::Runner(source, path)) => return Err(ExecError::Files { path, source }),
            Err(SpawnError::NotStarted(why)) => Err(why),
        };
        let pid = spawned.as_ref().map_or(0, |r| r.pid);
        if let Ok(running) = &spawned
            && let Err(e) = self.store.attempt_spawned(row, pid, unix::process_start_time(pid)).await
        {
            // Without its pid on record a later resume could not find this child: stop it.
            unix::kill_group(running.pid);
            return Err(e.into());
        }
        self.reporter.report(&Event::AttemptStarted { step: step.name.clone(), attempt, max_attempts, redelivered });
        // Only what follows now in the stderr log belongs to this attempt.
        let stderr_from = match &spawned {
            Ok(r) => r.stderr_from,
            Err(_) => std::fs::metadata(&spec.stderr_log).map_or(0, |m| m.len()),
        };
        let (control, control_rx) = watch::channel(Control::Run);
        self.steps[index].slot = Slot::Running { attempt, row, pid, stderr_from, started: issued, control };
        self.running += 1;
        match spawned {
            Ok(running) => {
                let deadline = step.timeout.map(|t| issued + t);
                let tx = self.tx.clone();
                tokio::spawn(async move {
                    let (end, notes) = running.supervise(step, deadline, control_rx).await;
                    let _ = tx.send(Msg::Done { step: index, end, notes }).await;
                });
                Ok(())
            }
            Err(why) => self.attempt_failed(index, Ending::NotStarted(why), None).await,
        }
    }

    async fn handle(&mut self, msg: Msg) -> Result<(), ExecError> {
        match msg {
            Msg::Output { step, row, stream, chunk } => {
                if self.is_current(step, row) {
                    let name = self.steps[step].step.name.clone();
                    self.reporter.report(&Event::Output { step: name, stream, chunk });
                }
                Ok(())
            }
            Msg::LogFailed { row, path, error } => {
                if !(0..self.steps.len()).any(|i| self.is_current(i, row)) {
                    return Ok(()); // from an attempt that is already over
                }
                Err(ExecError::Files { path, source: error })
            }
            Msg::Done { step, end, notes } => {
                for message in notes {
                    self.reporter.report(&Event::Warning { step: Some(self.steps[step].step.name.clone()), message });
                }
                match end {
                    End::Exited(unix::ExitKind::Code(0)) => self.attempt_succeeded(step).await,
                    End::Exited(unix::ExitKind::Code(code)) => {
                        self.attempt_failed(step, Ending::Exited(code), Some(code)).await
                    }
                    End::Exited(unix::ExitKind::Signal(sig)) => {
                        self.attempt_failed(step, Ending::Signaled(sig), None).await
                    }
                    End::TimedOut => {
                        let t = self.steps[step].step.timeout.unwrap_or_default();
                        self.attempt_failed(step, Ending::TimedOut(t), None).await
                    }
                    End::Cancelled => self.attempt_cancelled(step).await,
                }
            }
        }
    }

    /// Whether `row` is the attempt now running for step `index`.
    fn is_current(&self, index: usize, row: i64) -> bool {
        matches!(self.steps[index].slot, Slot::Running { row: r, .. } if r == row)
    }

    /// Take the running slot of a step that just ended.
    fn take_running(&mut self, index: usize) -> (u32, i64, Duration) {
        self.running -= 1;
        match std::mem::replace(&mut self.steps[index].slot, Slot::Failed) {
            Slot::Running { attempt, row, started, stderr_from, .. } => {
                self.steps[index].last_attempt = attempt;
                self.steps[index].last_stderr_from = stderr_from;
                (attempt, row, started.elapsed())
            }
            _ => unreachable!("a finished attempt belongs to a running step"),
        }
    }

    async fn attempt_succeeded(&mut self, index: usize) -> Result<(), ExecError> {
        let (attempt, row, elapsed) = self.take_running(index);
        let result = AttemptResult {
            outcome: AttemptOutcome::Succeeded,
            exit_code: Some(0),
            signal: None,
            error: None,
            ended_at: SystemTime::now(),
        };
        self.store.attempt_finished(row, &result, &StepUpdate::Succeeded).await?;
        self.crash_point(index);
        self.steps[index].slot = Slot::Succeeded;
        self.reporter.report(&Event::AttemptSucceeded { step: self.steps[index].step.name.clone(), attempt, elapsed });
        Ok(())
    }

    async fn attempt_cancelled(&mut self, index: usize) -> Result<(), ExecError> {
        let (attempt, row, _) = self.take_running(index);
        let result = AttemptResult {
            outcome: AttemptOutcome::Cancelled,
            exit_code: None,
            signal: self.cancelled.map(|s| s.name().to_owned()),
            error: None,
            ended_at: SystemTime::now(),
        };
        self.store.attempt_finished(row, &result, &StepUpdate::Pending).await?;
        self.steps[index].slot = Slot::Ready { attempt, redelivered: true };
        Ok(())
    }

    async fn attempt_failed(&mut self, index: usize, ending: Ending, exit_code: Option<i32>) -> Result<(), ExecError> {
        let (attempt, row, _) = self.take_running(index);
        let step = Arc::clone(&self.steps[index].step);
        let stem = self.attempt_stem(&step, attempt);
        let from = self.steps[index].last_stderr_from;
        let (stderr_tail, stderr_cut) = read_tail(&stem.with_extension("stderr"), from, STDERR_TAIL);
        let evidence = Evidence {
            classes: &self.flow.classes,
            step_codes: &step.exit_codes,
            flow_codes: &self.flow.exit_codes,
            detect_tracebacks: step.detect_tracebacks,
            error_file: error_file::read_error_file(&stem.with_extension("error.json")),
            stderr_tail: &stderr_tail,
        };
        let (mut error, mut warnings) = classify::classify(&ending, evidence);
        // A traceback longer than the tail has lost its header and is not recognised: say so
        // rather than report a plain exit status as if nothing were there.
        if stderr_cut
            && step.detect_tracebacks
            && ending == Ending::Exited(1)
            && matches!(error.source, ErrorSource::ExitStatus | ErrorSource::ExitCodeMapping)
            && ends_with_cut_traceback(&stderr_tail)
        {
            let kib = STDERR_TAIL / 1024;
            error
                .message
                .push_str(&format!(" (the traceback may be cut: stderr tail is {kib} KiB; use an error file)"));
            warnings.push(format!(
                "attempt {attempt}: stderr ends like a Python traceback longer than the {kib} KiB that waymark reads, \
                 so its error class was not recognised; report the error through WAYMARK_ERROR_FILE \
                 (examples/helpers/waymark_errors.py does it for Python)"
            ));
        }
        for message in warnings {
            self.reporter.report(&Event::Warning { step: Some(step.name.clone()), message });
        }
        // Attempt numbers go on across budgets; the policy counts within the current one.
        let k = attempt - self.steps[index].budget_base;
        let (update, retry) = match step.retry.decide(&error, k) {
            Decision::Retry { .. } => {
                let delay = step.retry.backoff.delay(k, &mut self.rng);
                let wake_at = SystemTime::now() + delay;
                (StepUpdate::Waiting { next_attempt: attempt + 1, wake_at }, Some((delay, wake_at)))
            }
            Decision::NotRetryable | Decision::Exhausted => (StepUpdate::Failed, None),
        };
        let result = AttemptResult {
            outcome: AttemptOutcome::Failed,
            exit_code,
            signal: match &ending {
                Ending::Signaled(s) => Some(s.name().to_owned()),
                _ => None,
            },
            error: Some(error.clone()),
            ended_at: SystemTime::now(),
        };
        self.store.attempt_finished(row, &result, &update).await?;
        self.crash_point(index);
        self.steps[index].slot = match retry {
            Some((delay, _)) => Slot::Waiting { attempt: attempt + 1, wake: Instant::now() + delay },
            None => Slot::Failed,
        };
        self.steps[index].last_error = Some(error.clone());
        self.reporter.report(&Event::AttemptFailed {
            step: step.name.clone(),
            attempt,
            max_attempts: self.steps[index].max_attempts(),
            error,
            retry,
        });
        Ok(())
    }

    fn crash_point(&self, index: usize) {
        if self.crash_after.as_deref() == Some(self.steps[index].step.name.as_str()) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL);
        }
    }

    fn on_signal(&mut self, sig: Signal) {
        let forced = self.cancelled.is_some();
        self.cancelled.get_or_insert(sig);
        // Children first, then words.
        for s in &self.steps {
            if let Slot::Running { control, .. } = &s.slot {
                let _ = control.send(if forced { Control::Kill } else { Control::Cancel(sig) });
            }
        }
        self.reporter.report(&Event::Cancelling { signal: sig.number(), forced });
    }

    async fn finish(&mut self, outcome: RunOutcome) -> Result<RunOutcome, ExecError> {
        let failed = self.steps.iter().find(|s| matches!(s.slot, Slot::Failed));
        let (status, failed_step) = match outcome {
            RunOutcome::Succeeded => (RunStatus::Succeeded, None),
            RunOutcome::Failed => (RunStatus::Failed, failed.map(|s| s.step.name.as_str())),
            RunOutcome::Interrupted { .. } => (RunStatus::Interrupted, None),
        };
        self.store.run_finished(status, failed_step).await?;
        let failure = match (outcome, failed) {
            (RunOutcome::Failed, Some(s)) => s.last_error.clone().map(|error| {
                let stem = self.attempt_stem(&s.step, s.last_attempt);
                Box::new(Failure {
                    step: s.step.name.clone(),
                    error,
                    attempts: s.last_attempt - s.budget_base,
                    stderr_tail: read_tail(&stem.with_extension("stderr"), s.last_stderr_from, 4096).0,
                    log_dir: self.state.step_logs(&self.run_id, &s.step.name),
                })
            }),
            _ => None,
        };
        self.reporter.report(&Event::RunFinished { run_id: self.run_id.clone(), outcome, failure });
        Ok(outcome)
    }
}

/// The last `max` bytes of a file after offset `from`, lossily decoded, and whether there were
/// more than `max` after `from` (the tail is cut); empty if it cannot be read.
fn read_tail(path: &Path, from: u64, max: u64) -> (String, bool) {
    let Ok(mut f) = crate::fsutil::open_read_nofollow(path) else { return (String::new(), false) };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let cut = len.saturating_sub(from) > max;
    let start = len.saturating_sub(max).max(from);
    if f.seek(SeekFrom::Start(start)).is_err() {
        return (String::new(), cut);
    }
    let mut buf = Vec::new();
    let _ = f.take(max).read_to_end(&mut buf);
    (String::from_utf8_lossy(&buf).into_owned(), cut)
}

/// Whether `tail` ends like a Python traceback whose header was cut off: from its first frame
/// line on, it parses as a traceback once the header is put back.
fn ends_with_cut_traceback(tail: &str) -> bool {
    let Some(frame) = tail.find("\n  File \"") else { return false };
    let rebuilt = format!("Traceback (most recent call last):{}", &tail[frame..]);
    classify::traceback::parse_traceback(&rebuilt).is_some()
}

/// The `WAYMARK_ATTEMPT_ID` of an attempt: unique per execution, inherited by all its processes.
fn attempt_id(run_id: &str, row: i64) -> String {
    format!("{run_id}.{row}")
}

/// Make sure an attempt that was in flight when its runner died is dead: its process group
/// (checked against the recorded start time) and any of its processes that left the group.
/// Returns a message for the user when something had to be killed.
/// An error when some would not die: the attempt must not run twice at once.
pub(crate) fn kill_leftovers(run_id: &str, step: &StepRecord) -> Result<Option<String>, ExecError> {
    let StepState::InFlight { attempt, row, pid, proc_start } = &step.state else { return Ok(None) };
    let (killed, survivors) =
        unix::kill_leftovers(*pid, *proc_start, &attempt_id(run_id, *row), Duration::from_secs(5));
    if !survivors.is_empty() {
        return Err(ExecError::Leftovers { step: step.name.clone(), attempt: *attempt, pids: survivors });
    }
    Ok((killed > 0)
        .then(|| format!("killed {killed} leftover process(es) of attempt {attempt} from the previous runner")))
}
