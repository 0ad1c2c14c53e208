//! Events, version 2: everything waymark tells the outside world while it runs a flow.
//!
//! The executor and the commands around it (`waymark run` and `waymark resume`: picking the run,
//! waiting for the flow's lock, abandoning a stale run) emit [`Event`]s through an [`Emitter`],
//! which stamps each with a sequence number, the wall-clock time and the run id (an [`Envelope`])
//! and hands it to every attached [`Reporter`], in the order they were attached, with the run's
//! secrets replaced by `***` in every text an event carries. Nothing else
//! prints while a flow runs: reporters own the terminal (or a file, or a socket), consume events
//! and never reach back. Every event derives `Serialize`: a machine-readable stream is a reporter
//! like any other, and `tests/fixtures/events/v2.jsonl` pins the wire form of every kind.

use crate::classify::ErrorValue;
use crate::executor::Chunk;
use crate::secrets::Secrets;
use serde::{Serialize, Serializer};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// One event with the time it happened, its place in the stream and the run it belongs to.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Envelope {
    /// 1, 2, 3, … within one waymark process: a gap never happens, so a reader can tell none was lost.
    pub(crate) seq: u64,
    /// Wall-clock time, RFC 3339 with milliseconds in UTC when serialised.
    #[serde(serialize_with = "rfc3339")]
    pub(crate) at: SystemTime,
    /// The run the event is about; `None` only before a run is chosen (waiting for the lock, or a
    /// notice about another run of the flow that is not resumed). Shared: every event carries it.
    pub(crate) run_id: Option<Arc<str>>,
    #[serde(flatten)]
    pub(crate) event: Event,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub(crate) enum RunOutcome {
    Succeeded,
    Failed,
    /// Stopped by a signal to the runner; resumable.
    Interrupted {
        signal: i32,
    },
}

/// Why an unfinished run was abandoned for a new one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub(crate) enum AbandonReason {
    /// `waymark run --fresh`.
    Fresh,
    /// It started (or `waymark resume` reopened it after it failed: `reopened`) longer ago than
    /// the flow's `resume_within`.
    Stale {
        #[serde(rename = "age_ms", serialize_with = "millis")]
        age: Duration,
        #[serde(rename = "resume_within_ms", serialize_with = "millis")]
        limit: Duration,
        #[serde(skip)]
        reopened: bool,
    },
}

/// Why a step did not run in this runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum SkipReason {
    /// An earlier runner of the same run already finished it.
    AlreadySucceeded,
    /// An earlier runner of the same run already caught its error (the steps that need it run).
    AlreadyCaught,
    /// An earlier runner of the same run already failed it for good (and was stopped by a
    /// signal, or died, before the run was finished); it is not run again.
    AlreadyFailed,
    /// A step failed for good, so no new step started.
    RunFailed,
    /// The workflow's deadline passed before it could run (or run again).
    DeadlinePassed,
}

/// How a step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum StepOutcome {
    Succeeded,
    /// Its error was caught by a catch handler: its dependents run.
    Caught,
    Failed,
}

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum AttemptEnd {
    Succeeded,
    Failed,
    /// Stopped by a signal to the runner; it runs again on resume and does not count.
    Cancelled,
}

/// Why retrying stopped after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum StopReason {
    /// The error matched none of the policy's `exception_types` (a step without `retry` has
    /// none, so its one failure stops here).
    NotRetryable,
    /// Every attempt of the budget was used.
    Exhausted,
}

/// Why a step is not retried (again), with what it takes to say so in words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct RetryStop {
    pub(crate) reason: StopReason,
    /// The step's policy: the class names it retries.
    pub(crate) exception_types: Vec<String>,
    /// Attempts used, and allowed, in the step's current budget.
    pub(crate) attempts: u32,
    pub(crate) attempts_allowed: u32,
}

impl RetryStop {
    /// Why retrying stopped after `error`, in words: `budget spent: 5 of 5 attempts`,
    /// `not retried: CalledProcessError is not in exception_types ["ConnectionError"]`.
    pub(crate) fn explain(&self, error: &ErrorValue) -> String {
        use crate::classify::classes::{ACTION_TIMEOUT, WORKFLOW_TIMEOUT};
        let listed = || {
            let names: Vec<String> = self.exception_types.iter().map(|n| format!("{n:?}")).collect();
            format!("[{}]", names.join(", "))
        };
        let class = &error.class;
        match self.reason {
            StopReason::Exhausted => {
                format!("budget spent: {} of {} attempts", self.attempts, self.attempts_allowed)
            }
            _ if class == WORKFLOW_TIMEOUT => {
                "not retried: the workflow's timeout passed, and no policy retries WorkflowTimeout".to_owned()
            }
            _ if self.exception_types.is_empty() => {
                "not retried: the step retries no error (it has no `retry`, or an empty `exception_types`)".to_owned()
            }
            _ if class == ACTION_TIMEOUT => format!(
                "not retried: timeouts are not retried unless ActionTimeout is listed (exception_types is {})",
                listed()
            ),
            // A class outside `Exception` (ActionExecutionLost, a user's BaseException subclass)
            // is missed by the usual `["Exception"]`: say why.
            _ if !error.bases.iter().any(|b| b == "Exception")
                && self.exception_types.iter().any(|n| n == "Exception") =>
            {
                format!(
                    "not retried: {class} derives from BaseException, not Exception, so it is not retried unless it \
                     is listed (exception_types is {})",
                    listed()
                )
            }
            _ => format!("not retried: {class} is not in exception_types {}", listed()),
        }
    }
}

/// The wait before the next attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct RetryPlan {
    #[serde(rename = "delay_ms", serialize_with = "millis")]
    pub(crate) delay: Duration,
    #[serde(serialize_with = "rfc3339")]
    pub(crate) wake_at: SystemTime,
}

/// What a notice is about, for a reader that acts on some of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum NoticeKind {
    /// Something worth attention that is not a failure (a malformed error file, a killed leftover).
    Warning,
    /// The flow file changed since the resumed run started; the recorded definition is used.
    FlowChanged,
    /// Another runner holds the flow's lock; this one waits.
    WaitingForLock,
    /// Anything else the user should know (a run of this file kept under another key, …).
    Info,
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum Event {
    /// A new run begins.
    RunStarted {
        flow: String,
        steps_total: usize,
    },
    /// An unfinished run goes on in this runner.
    RunResumed {
        flow: String,
        steps_total: usize,
        steps_done: usize,
    },
    /// An unfinished run (the envelope's run id) was given up for a new one.
    RunAbandoned {
        flow: String,
        /// The flow file being run, as given on the command line.
        #[serde(serialize_with = "lossy_path")]
        file: PathBuf,
        #[serde(flatten)]
        reason: AbandonReason,
    },
    RunFinished {
        #[serde(flatten)]
        outcome: RunOutcome,
        /// How long this runner ran the run: from the run's start (or resume) in this process.
        #[serde(rename = "duration_ms", serialize_with = "millis")]
        duration: Duration,
        /// Each step that failed for good, the one the run failed on first; empty unless failed.
        failures: Vec<Failure>,
    },
    /// The dispatcher found the step ready to run (its turn came).
    StepReady {
        step: String,
    },
    /// The step's first attempt in this runner started.
    StepStarted {
        step: String,
    },
    /// A failed attempt is retried after a wait.
    StepWaiting {
        step: String,
        next_attempt: u32,
        /// The attempts the step's budget allows: a resumed run's retry says `K/N` before any
        /// attempt of this runner said N. For the displays; the wire form (v2) is as it was.
        #[serde(skip)]
        max_attempts: u32,
        #[serde(flatten)]
        retry: RetryPlan,
    },
    StepFinished {
        step: String,
        outcome: StepOutcome,
        /// Attempts used in the step's current budget (as the failure report counts them).
        attempts: u32,
    },
    StepSkipped {
        step: String,
        reason: SkipReason,
    },
    AttemptStarted {
        step: String,
        attempt: u32,
        max_attempts: u32,
        /// `None` when the program could not be started.
        pid: Option<u32>,
        /// Run again after its runner died (an attempt cancelled by a signal runs again unmarked).
        redelivered: bool,
        /// The step's `timeout`: the attempt is stopped this long after it started.
        #[serde(rename = "timeout_ms", serialize_with = "opt_millis")]
        timeout: Option<Duration>,
    },
    /// Whole lines (or a final unterminated line) a child wrote.
    Output {
        step: String,
        stream: Stream,
        #[serde(rename = "text", serialize_with = "lossy")]
        chunk: Arc<Chunk>,
    },
    AttemptFinished {
        step: String,
        attempt: u32,
        max_attempts: u32,
        outcome: AttemptEnd,
        error: Option<ErrorValue>,
        #[serde(rename = "duration_ms", serialize_with = "millis")]
        duration: Duration,
        /// The wait before the next attempt, when the policy retries.
        retry: Option<RetryPlan>,
        /// Why retrying stopped, when the attempt failed for good.
        stopped: Option<StopReason>,
        /// The child's exit code, when it exited.
        exit_code: Option<i32>,
        /// The signal that ended the child when waymark did not send it (`SIGSEGV`); for a
        /// cancelled attempt, the runner's signal that was forwarded to it.
        signal: Option<String>,
        /// Stopping the attempt (its timeout, the workflow's deadline, a cancel) took SIGKILL
        /// after the grace period: it outlived `kill_signal`.
        killed_after_grace: bool,
    },
    /// The step is not retried after its failed attempt `attempt` (just after that attempt's
    /// `AttemptFinished`, before the step's `StepFinished`).
    RetryStopped {
        step: String,
        attempt: u32,
        error: ErrorValue,
        #[serde(flatten)]
        stop: RetryStop,
    },
    /// A line for the user that is not about an attempt's outcome.
    Notice {
        notice: NoticeKind,
        step: Option<String>,
        message: String,
    },
    /// A step's catch handler started for the final error (`error`, a class name) of attempt
    /// `attempt`; `pid` is `None` when it could not be started.
    HandlerStarted {
        step: String,
        attempt: u32,
        error: String,
        pid: Option<u32>,
    },
    /// A step's catch handler ended: succeeded (the step is caught), failed (the step fails with its
    /// error), or cancelled (it runs again on resume).
    HandlerFinished {
        step: String,
        attempt: u32,
        outcome: AttemptEnd,
        #[serde(rename = "duration_ms", serialize_with = "millis")]
        duration: Duration,
        /// Why a failed handler did not succeed (`exit status 3`, `its step's timeout passed`), for
        /// the failure report; not part of the event's wire form.
        #[serde(skip)]
        why: Option<String>,
        /// For a cancelled handler, the runner's signal that was forwarded to it (`None`: by
        /// `fail_fast`); not part of the event's wire form.
        #[serde(skip)]
        signal: Option<String>,
    },
    /// A compensation (`name`: its step) or a hook (`name`: `on_success`, `on_failure`,
    /// `on_exit`) started; `pid` is `None` when it could not be started.
    AuxStarted {
        #[serde(rename = "what")]
        kind: crate::store::AuxKind,
        name: String,
        pid: Option<u32>,
    },
    /// A compensation or hook ended; a failed one does not change how the run ended.
    AuxFinished {
        #[serde(rename = "what")]
        kind: crate::store::AuxKind,
        name: String,
        outcome: AttemptEnd,
        #[serde(rename = "duration_ms", serialize_with = "millis")]
        duration: Duration,
        /// Of a failed one: its warning, which says how it failed and where its output is (`hook
        /// on_success failed (exit status 5); its output: .../hooks/on_success.stderr`, `its
        /// compensation failed (...); it wrote nothing; the other compensations go on`); not part
        /// of the event's wire form.
        #[serde(skip)]
        warning: Option<String>,
        /// For a cancelled one, the runner's signal that was forwarded to it; not part of the
        /// event's wire form.
        #[serde(skip)]
        signal: Option<String>,
    },
    /// Waymark's own failure (the store, the attempts' files) stopped the run before it finished;
    /// the run stays unfinished and resumable. `error` is what the command prints.
    RunAborted {
        error: String,
    },
    /// The runner got a signal and is stopping its children.
    Cancelling {
        signal: i32,
        forced: bool,
    },
}

/// What the user needs to know about a step that failed for good.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Failure {
    pub(crate) step: String,
    /// Its last error (`WorkflowTimeout` for a step the workflow's deadline stopped while it
    /// waited).
    pub(crate) error: ErrorValue,
    /// Why it is not retried (again).
    pub(crate) stopped: RetryStop,
    /// Its last attempt, 0 when none ran, and the end of that attempt's output.
    pub(crate) last_attempt: u32,
    pub(crate) stdout_tail: String,
    pub(crate) stderr_tail: String,
    /// The last attempt's log files, and the step's log directory.
    #[serde(serialize_with = "lossy_path")]
    pub(crate) stdout_log: PathBuf,
    #[serde(serialize_with = "lossy_path")]
    pub(crate) stderr_log: PathBuf,
    #[serde(serialize_with = "lossy_path")]
    pub(crate) log_dir: PathBuf,
}

/// What earlier runners did of the run this runner resumes, as the store has it.
#[derive(Debug, Default)]
pub(crate) struct Earlier {
    /// Their attempts, oldest first.
    pub(crate) attempts: Vec<EarlierAttempt>,
    /// A compensation ran: the run cannot be resumed with `waymark resume` once it failed.
    pub(crate) compensated: bool,
    /// The attempts each step used before its current budget (`waymark resume` of a failed run
    /// gave it a fresh one), where there were any: what the summary table says of a step that
    /// does not end in this runner.
    pub(crate) budget_bases: Vec<(String, u32)>,
    /// The steps they left under way (an attempt in flight when their runner died, or cancelled
    /// by a signal to it; a retry waiting; a catch handler to run), with the number of the last
    /// attempt their budget allows: what the summary table counts of one that this runner does
    /// not run again before it stops, as `waymark status` counts it.
    pub(crate) under_way: Vec<(String, u32)>,
}

/// An attempt that an earlier runner of a resumed run made, as the store recorded it: not an
/// event (it happened before this runner), but what the failure report lists before this
/// runner's attempts (and `waymark status --attempts` lists).
#[derive(Debug, Clone)]
pub(crate) struct EarlierAttempt {
    pub(crate) step: String,
    pub(crate) attempt: u32,
    pub(crate) redelivered: bool,
    pub(crate) started: SystemTime,
    /// When and how it ended; `None` while it runs, or when its runner died while it ran.
    pub(crate) end: Option<(SystemTime, AttemptEnd)>,
    pub(crate) error: Option<ErrorValue>,
    /// Its process group was killed with SIGKILL after the kill grace.
    pub(crate) killed_after_grace: bool,
    /// Where its logs are: the stem of `attempt-N.stdout` and `attempt-N.stderr`.
    pub(crate) log_stem: PathBuf,
    /// The other host whose disk holds its logs: the host it ran on, when that is not this one
    /// and the store is shared by hosts. `None`: its logs are here (a store of this host's keeps
    /// them here, whatever host id a runner went by).
    pub(crate) logs_on: Option<String>,
}

impl EarlierAttempt {
    /// The attempt `a` as recorded in a store `shared` by hosts or not. One left running, or
    /// ended by a claim (`runner_lost`), has no outcome.
    pub(crate) fn of(a: &crate::store::AttemptRecord, shared: bool) -> EarlierAttempt {
        use crate::store::AttemptState;
        let outcome = match a.outcome {
            AttemptState::Succeeded => Some(AttemptEnd::Succeeded),
            AttemptState::Failed => Some(AttemptEnd::Failed),
            AttemptState::Cancelled => Some(AttemptEnd::Cancelled),
            AttemptState::Running | AttemptState::RunnerLost => None,
        };
        EarlierAttempt {
            step: a.step.clone(),
            attempt: a.attempt,
            redelivered: a.redelivered,
            started: a.started_at,
            end: a.ended_at.zip(outcome),
            error: a.error.clone(),
            killed_after_grace: a.killed_after_grace.unwrap_or(false),
            log_stem: a.log_stem.clone(),
            logs_on: a.logs_on(shared).map(str::to_owned),
        }
    }
}

/// Consumes events. Reporters own what they write to and never reach back into the run.
pub(crate) trait Reporter {
    fn report(&mut self, event: &Envelope);

    /// What earlier runners did of the run this runner resumes (their attempts, oldest first),
    /// handed over before its first event about an attempt. Most reporters need only the events.
    fn earlier(&mut self, _earlier: &Earlier) {}

    /// The file of the flow whose run it reports (absolute), and whether the flow has `fail_fast`,
    /// handed over before the run's first event: what a message names for running the flow anew,
    /// and what a run a signal interrupted does when resumed.
    fn flow(&mut self, _path: &Path, _fail_fast: bool) {}

    /// Whether it reads what [`Reporter::earlier`] hands over. When no reporter does, a resumed
    /// run's earlier attempts (thousands, for a large run half done) are not read at all.
    fn wants_earlier(&self) -> bool {
        true
    }

    /// Whether it shows what children write ([`Event::Output`]). When no reporter does, the
    /// readers of the children's output only write it to the logs, and send the runner no lines.
    fn shows_output(&self) -> bool {
        true
    }

    /// Where the readers of children's output must wait while this reporter's display, which
    /// drops none of it, is behind ([`crate::executor::OutputGate`]); `None` for a reporter that
    /// never makes them wait.
    fn output_gate(&self) -> Option<Arc<crate::executor::OutputGate>> {
        None
    }
}

/// Stamps events and hands them to every attached reporter, in the order they were attached.
pub(crate) struct Emitter {
    seq: u64,
    run_id: Option<Arc<str>>,
    reporters: Vec<Box<dyn Reporter>>,
    /// Wall-clock time; injected by tests.
    now: fn() -> SystemTime,
    /// Hidden in every event before a reporter sees it.
    secrets: Arc<Secrets>,
}

impl Emitter {
    pub(crate) fn new(reporters: Vec<Box<dyn Reporter>>) -> Emitter {
        Emitter { seq: 0, run_id: None, reporters, now: SystemTime::now, secrets: Arc::default() }
    }

    /// Whether a reporter reads what earlier runners did ([`Reporter::wants_earlier`]).
    pub(crate) fn wants_earlier(&self) -> bool {
        self.reporters.iter().any(|r| r.wants_earlier())
    }

    /// Whether a reporter shows what children write ([`Reporter::shows_output`]).
    pub(crate) fn shows_output(&self) -> bool {
        self.reporters.iter().any(|r| r.shows_output())
    }

    /// The first reporter's [`Reporter::output_gate`] (one reporter shows a run).
    pub(crate) fn output_gate(&self) -> Option<Arc<crate::executor::OutputGate>> {
        self.reporters.iter().find_map(|r| r.output_gate())
    }

    /// An emitter whose clock is `now` (tests).
    #[cfg(test)]
    pub(crate) fn with_clock(reporters: Vec<Box<dyn Reporter>>, now: fn() -> SystemTime) -> Emitter {
        Emitter { now, ..Emitter::new(reporters) }
    }

    /// The run that the events from now on are about.
    pub(crate) fn set_run(&mut self, run_id: &str) {
        self.run_id = Some(run_id.into());
    }

    /// The run's secrets: from now on they are hidden in every event.
    pub(crate) fn set_secrets(&mut self, secrets: Arc<Secrets>) {
        self.secrets = secrets;
    }

    pub(crate) fn emit(&mut self, event: Event) {
        let event = if self.secrets.is_empty() { event } else { redact(&self.secrets, event) };
        self.seq += 1;
        let envelope = Envelope { seq: self.seq, at: (self.now)(), run_id: self.run_id.clone(), event };
        for reporter in &mut self.reporters {
            reporter.report(&envelope);
        }
    }

    /// Hand every reporter what earlier runners did of the run being resumed.
    pub(crate) fn earlier(&mut self, earlier: &Earlier) {
        for reporter in &mut self.reporters {
            reporter.earlier(earlier);
        }
    }

    /// Hand every reporter the file of the flow whose run the events are about, and whether it
    /// has `fail_fast`.
    pub(crate) fn flow(&mut self, path: &Path, fail_fast: bool) {
        for reporter in &mut self.reporters {
            reporter.flow(path, fail_fast);
        }
    }

    /// A notice of `kind`, about `step` if any.
    pub(crate) fn notice(&mut self, notice: NoticeKind, step: Option<&str>, message: impl Into<String>) {
        self.emit(Event::Notice { notice, step: step.map(str::to_owned), message: message.into() });
    }

    pub(crate) fn warning(&mut self, step: Option<&str>, message: impl Into<String>) {
        self.notice(NoticeKind::Warning, step, message);
    }
}

/// `event` with `secrets` hidden in every text it carries that a step could have put a secret in.
/// Exhaustive: a new kind does not compile until it says what it carries.
fn redact(secrets: &Secrets, mut event: Event) -> Event {
    let text = |t: &mut String| *t = secrets.redact_string(std::mem::take(t));
    let error = |e: &mut ErrorValue| secrets.redact_error(e);
    match &mut event {
        Event::Notice { message, .. } => text(message),
        Event::RunAborted { error: message } => text(message),
        Event::AttemptFinished { error: e, .. } => e.iter_mut().for_each(error),
        Event::RetryStopped { error: e, .. } => error(e),
        Event::RunFinished { failures, .. } => {
            for f in failures {
                error(&mut f.error);
                text(&mut f.stdout_tail);
                text(&mut f.stderr_tail);
            }
        }
        // The output readers hide secrets before the dispatcher sees a child's output (a secret
        // split between two reads, or two lines, too); hiding them again here would cost a second
        // pass over every byte.
        Event::Output { .. } => {}
        // Names from the flow file, numbers, states.
        Event::RunStarted { .. }
        | Event::RunResumed { .. }
        | Event::RunAbandoned { .. }
        | Event::StepReady { .. }
        | Event::StepStarted { .. }
        | Event::StepWaiting { .. }
        | Event::StepFinished { .. }
        | Event::StepSkipped { .. }
        | Event::AttemptStarted { .. }
        | Event::HandlerStarted { .. }
        | Event::HandlerFinished { .. }
        | Event::AuxStarted { .. }
        | Event::AuxFinished { .. }
        | Event::Cancelling { .. } => {}
    }
    event
}

pub(crate) fn rfc3339<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    with_rfc3339(t, |text| s.serialize_str(text))
}

/// `f` of time `t` as RFC 3339 in UTC, to the millisecond (ASCII: digits, `-`, `:`, `.`, `T`
/// and `Z`, none of which JSON escapes).
pub(crate) fn with_rfc3339<R>(t: &SystemTime, f: impl FnOnce(&str) -> R) -> R {
    thread_local! {
        /// The last millisecond written and its text: events come many to a millisecond (the
        /// thousands of steps a resumed run skips), each once made into a date.
        static LAST: std::cell::RefCell<(Option<u128>, String)> = const { std::cell::RefCell::new((None, String::new())) };
    }
    let ms = t.duration_since(std::time::UNIX_EPOCH).ok().map(|d| d.as_millis());
    LAST.with_borrow_mut(|(last, text)| {
        if ms.is_none() || *last != ms {
            *text = humantime::format_rfc3339_millis(*t).to_string();
            *last = ms;
        }
        f(text)
    })
}

fn millis<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn opt_millis<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => millis(d, s),
        None => s.serialize_none(),
    }
}

/// A path as text, even one that is not UTF-8 (serde refuses those).
fn lossy_path<S: Serializer>(path: &std::path::Path, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&path.display())
}

fn lossy<S: Serializer>(chunk: &Arc<Chunk>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&String::from_utf8_lossy(chunk))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An event's time is written to the millisecond, each time its own: one made into text
    /// before (the same millisecond) is reused, never another's.
    #[test]
    fn event_times_are_written_each_as_its_own_millisecond() {
        #[derive(Serialize)]
        struct At(#[serde(serialize_with = "rfc3339")] SystemTime);
        let at = |ms: u64| serde_json::to_string(&At(std::time::UNIX_EPOCH + Duration::from_millis(ms))).unwrap();
        let day = 1_796_256_000_000;
        assert_eq!(at(day), "\"2026-12-03T00:00:00.000Z\"");
        assert_eq!(at(day), "\"2026-12-03T00:00:00.000Z\"");
        assert_eq!(at(day + 1), "\"2026-12-03T00:00:00.001Z\"");
        assert_eq!(at(day + 86_400_000), "\"2026-12-04T00:00:00.000Z\"");
        assert_eq!(at(day), "\"2026-12-03T00:00:00.000Z\"");
    }
    use crate::classify::ErrorSource;
    use std::cell::RefCell;
    use std::rc::Rc;
    use std::time::UNIX_EPOCH;

    /// The golden wire form; `WAYMARK_BLESS=1 cargo test --lib events` rewrites it after a
    /// deliberate change.
    const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/events/v2.jsonl");

    /// A reporter that keeps what it is given.
    struct Recorder(Rc<RefCell<Vec<Envelope>>>);

    impl Reporter for Recorder {
        fn report(&mut self, event: &Envelope) {
            self.0.borrow_mut().push(event.clone());
        }
    }

    /// 2026-01-02T03:04:05.678Z
    pub(crate) fn fixed_clock() -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(1_767_323_045_678)
    }

    fn recorder() -> (Rc<RefCell<Vec<Envelope>>>, Box<dyn Reporter>) {
        let seen = Rc::new(RefCell::new(Vec::new()));
        (Rc::clone(&seen), Box::new(Recorder(seen)))
    }

    fn json(envelopes: &[Envelope]) -> Vec<String> {
        envelopes.iter().map(|e| serde_json::to_string(e).expect("an envelope serialises")).collect()
    }

    #[test]
    fn every_attached_reporter_gets_every_event_in_the_same_order_numbered_without_gaps() {
        let (first, a) = recorder();
        let (second, b) = recorder();
        let mut emitter = Emitter::with_clock(vec![a, b], fixed_clock);
        emitter.notice(NoticeKind::WaitingForLock, None, "flow `f` is already running; waiting for it to finish");
        emitter.set_run("r1");
        emitter.emit(Event::RunStarted { flow: "f".into(), steps_total: 1 });
        emitter.emit(Event::StepReady { step: "a".into() });
        emitter.warning(Some("a"), "careful");
        emitter.emit(Event::RunFinished {
            outcome: RunOutcome::Succeeded,
            duration: Duration::from_millis(5),
            failures: Vec::new(),
        });

        let (first, second) = (first.borrow(), second.borrow());
        assert_eq!(json(&first), json(&second));
        assert_eq!(first.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
        let runs: Vec<Option<&str>> = first.iter().map(|e| e.run_id.as_deref()).collect();
        assert_eq!(runs, [None, Some("r1"), Some("r1"), Some("r1"), Some("r1")]);
        let kinds: Vec<&str> = first.iter().map(|e| kind(&e.event)).collect();
        assert_eq!(kinds, ["notice", "run_started", "step_ready", "notice", "run_finished"]);
    }

    /// Every kind, named as the wire names it. Exhaustive: a new kind does not compile until it is
    /// named here, and the golden test then wants a sample of it.
    fn kind(event: &Event) -> &'static str {
        match event {
            Event::RunStarted { .. } => "run_started",
            Event::RunResumed { .. } => "run_resumed",
            Event::RunAbandoned { .. } => "run_abandoned",
            Event::RunFinished { .. } => "run_finished",
            Event::StepReady { .. } => "step_ready",
            Event::StepStarted { .. } => "step_started",
            Event::StepWaiting { .. } => "step_waiting",
            Event::StepFinished { .. } => "step_finished",
            Event::StepSkipped { .. } => "step_skipped",
            Event::AttemptStarted { .. } => "attempt_started",
            Event::Output { .. } => "output",
            Event::AttemptFinished { .. } => "attempt_finished",
            Event::Notice { .. } => "notice",
            Event::Cancelling { .. } => "cancelling",
            Event::RunAborted { .. } => "run_aborted",
            Event::HandlerStarted { .. } => "handler_started",
            Event::HandlerFinished { .. } => "handler_finished",
            Event::AuxStarted { .. } => "aux_started",
            Event::AuxFinished { .. } => "aux_finished",
            Event::RetryStopped { .. } => "retry_stopped",
        }
    }

    pub(crate) const KINDS: usize = 20;

    fn error() -> ErrorValue {
        ErrorValue {
            class: "ConnectionResetError".into(),
            bases: vec!["ConnectionError".into(), "OSError".into(), "Exception".into()],
            message: "peer reset".into(),
            source: ErrorSource::Traceback,
        }
    }

    fn stop(reason: StopReason, attempts: u32) -> RetryStop {
        RetryStop { reason, exception_types: vec!["TimeoutError".into()], attempts, attempts_allowed: 3 }
    }

    /// One envelope of every kind, and of every variant of what a kind carries that changes its shape.
    pub(crate) fn samples() -> Vec<Event> {
        let step = || "fetch".to_owned();
        let wake_at = fixed_clock() + Duration::from_millis(1500);
        let retry = RetryPlan { delay: Duration::from_millis(1500), wake_at };
        vec![
            Event::Notice {
                notice: NoticeKind::WaitingForLock,
                step: None,
                message: "flow `nightly` is already running (run r0, pid 7, started 2026-01-02T03:00:00Z); waiting \
                          for it to finish"
                    .into(),
            },
            Event::RunAbandoned { flow: "nightly".into(), file: "nightly.toml".into(), reason: AbandonReason::Fresh },
            Event::RunAbandoned {
                flow: "nightly".into(),
                file: "/srv/nightly.toml".into(),
                reason: AbandonReason::Stale {
                    age: Duration::from_millis(7_200_123),
                    limit: Duration::from_secs(3600),
                    reopened: false,
                },
            },
            Event::RunStarted { flow: "nightly".into(), steps_total: 2 },
            Event::RunResumed { flow: "nightly".into(), steps_total: 2, steps_done: 1 },
            Event::StepSkipped { step: "setup".into(), reason: SkipReason::AlreadySucceeded },
            Event::StepSkipped { step: "load".into(), reason: SkipReason::RunFailed },
            Event::StepSkipped { step: "load".into(), reason: SkipReason::DeadlinePassed },
            Event::StepReady { step: step() },
            Event::StepStarted { step: step() },
            Event::AttemptStarted {
                step: step(),
                attempt: 1,
                max_attempts: 3,
                pid: Some(4242),
                redelivered: false,
                timeout: Some(Duration::from_secs(30)),
            },
            Event::Output {
                step: step(),
                stream: Stream::Stdout,
                chunk: Arc::new(Chunk::new(b"got 3 rows\n".to_vec())),
            },
            Event::Output {
                step: step(),
                stream: Stream::Stderr,
                chunk: Arc::new(Chunk::new(b"bad byte \xff\n".to_vec())),
            },
            Event::AttemptFinished {
                step: step(),
                attempt: 1,
                max_attempts: 3,
                outcome: AttemptEnd::Failed,
                error: Some(error()),
                duration: Duration::from_millis(250),
                retry: Some(retry),
                stopped: None,
                exit_code: Some(1),
                signal: None,
                killed_after_grace: false,
            },
            Event::StepWaiting { step: step(), next_attempt: 2, max_attempts: 4, retry },
            Event::AttemptStarted {
                step: step(),
                attempt: 2,
                max_attempts: 3,
                pid: None,
                redelivered: true,
                timeout: None,
            },
            Event::Notice {
                notice: NoticeKind::Warning,
                step: Some(step()),
                message: "attempt 2: the error file is not JSON".into(),
            },
            Event::AttemptFinished {
                step: step(),
                attempt: 2,
                max_attempts: 3,
                outcome: AttemptEnd::Failed,
                error: Some(error()),
                duration: Duration::from_millis(3),
                retry: None,
                stopped: Some(StopReason::NotRetryable),
                exit_code: None,
                signal: Some("SIGSEGV".into()),
                killed_after_grace: false,
            },
            Event::RetryStopped { step: step(), attempt: 2, error: error(), stop: stop(StopReason::NotRetryable, 2) },
            Event::AttemptFinished {
                step: step(),
                attempt: 3,
                max_attempts: 3,
                outcome: AttemptEnd::Failed,
                error: Some(error()),
                duration: Duration::from_millis(4),
                retry: None,
                stopped: Some(StopReason::Exhausted),
                exit_code: None,
                signal: None,
                killed_after_grace: true,
            },
            Event::RetryStopped { step: step(), attempt: 3, error: error(), stop: stop(StopReason::Exhausted, 3) },
            Event::AttemptFinished {
                step: step(),
                attempt: 3,
                max_attempts: 3,
                outcome: AttemptEnd::Succeeded,
                error: None,
                duration: Duration::from_millis(1234),
                retry: None,
                stopped: None,
                exit_code: Some(0),
                signal: None,
                killed_after_grace: false,
            },
            Event::AttemptFinished {
                step: step(),
                attempt: 3,
                max_attempts: 3,
                outcome: AttemptEnd::Cancelled,
                error: None,
                duration: Duration::from_millis(99),
                retry: None,
                stopped: None,
                exit_code: None,
                signal: Some("SIGINT".into()),
                killed_after_grace: false,
            },
            Event::StepFinished { step: step(), outcome: StepOutcome::Succeeded, attempts: 3 },
            Event::StepFinished { step: step(), outcome: StepOutcome::Failed, attempts: 3 },
            Event::Notice {
                notice: NoticeKind::FlowChanged,
                step: None,
                message: "nightly.toml changed since run r1 started".into(),
            },
            Event::Notice { notice: NoticeKind::Info, step: None, message: "run r1 already succeeded".into() },
            Event::Cancelling { signal: 2, forced: false },
            Event::Cancelling { signal: 2, forced: true },
            Event::RunAborted { error: "cannot write the state database /s/waymark.db: disk full".into() },
            Event::HandlerStarted { step: "fetch".into(), attempt: 3, error: "TimeoutError".into(), pid: Some(4242) },
            Event::AuxStarted { kind: crate::store::AuxKind::Compensate, name: "load".into(), pid: Some(4343) },
            Event::AuxFinished {
                kind: crate::store::AuxKind::Hook,
                name: "on_failure".into(),
                outcome: AttemptEnd::Failed,
                duration: Duration::from_millis(20),
                warning: None,
                signal: None,
            },
            Event::HandlerFinished {
                step: "fetch".into(),
                attempt: 3,
                outcome: AttemptEnd::Succeeded,
                duration: Duration::from_millis(1500),
                why: None,
                signal: None,
            },
            Event::RunFinished {
                outcome: RunOutcome::Succeeded,
                duration: Duration::from_millis(61_234),
                failures: vec![],
            },
            Event::RunFinished {
                outcome: RunOutcome::Interrupted { signal: 15 },
                duration: Duration::from_millis(2_000),
                failures: vec![],
            },
            Event::RunFinished {
                outcome: RunOutcome::Failed,
                duration: Duration::from_millis(9_876),
                failures: vec![Failure {
                    step: step(),
                    error: error(),
                    stopped: stop(StopReason::Exhausted, 3),
                    last_attempt: 3,
                    stdout_tail: "got 3 rows\n".into(),
                    stderr_tail: "Traceback (most recent call last):\n".into(),
                    stdout_log: "/state/logs/r1/fetch/attempt-3.stdout".into(),
                    stderr_log: "/state/logs/r1/fetch/attempt-3.stderr".into(),
                    log_dir: "/state/logs/r1/fetch".into(),
                }],
            },
        ]
    }

    #[test]
    fn why_retrying_stopped_is_said_in_words() {
        let tree = crate::classify::classes::ClassTree::default();
        let error = |class: &str| ErrorValue {
            class: class.into(),
            bases: tree.bases(class).unwrap_or_default(),
            message: String::new(),
            source: ErrorSource::ExitStatus,
        };
        let stop = |reason, types: &[&str]| RetryStop {
            reason,
            exception_types: types.iter().map(|t| t.to_string()).collect(),
            attempts: 5,
            attempts_allowed: 5,
        };
        let net = ["ConnectionError", "TimeoutError"];
        let cases = [
            (stop(StopReason::Exhausted, &net), "ConnectionResetError", "budget spent: 5 of 5 attempts"),
            (
                stop(StopReason::NotRetryable, &net),
                "CalledProcessError",
                r#"not retried: CalledProcessError is not in exception_types ["ConnectionError", "TimeoutError"]"#,
            ),
            (
                stop(StopReason::NotRetryable, &["Exception"]),
                "ActionTimeout",
                r#"not retried: timeouts are not retried unless ActionTimeout is listed (exception_types is ["Exception"])"#,
            ),
            (
                stop(StopReason::NotRetryable, &["Exception"]),
                "ActionExecutionLost",
                "not retried: ActionExecutionLost derives from BaseException, not Exception, so it is not retried \
                 unless it is listed (exception_types is [\"Exception\"])",
            ),
            (
                stop(StopReason::NotRetryable, &[]),
                "ValueError",
                "not retried: the step retries no error (it has no `retry`, or an empty `exception_types`)",
            ),
            (
                stop(StopReason::NotRetryable, &["BaseException"]),
                "WorkflowTimeout",
                "not retried: the workflow's timeout passed, and no policy retries WorkflowTimeout",
            ),
        ];
        for (stop, class, said) in cases {
            assert_eq!(stop.explain(&error(class)), said);
        }
    }

    #[test]
    fn secrets_are_hidden_in_every_text_an_event_carries() {
        let (seen, recorder) = recorder();
        let mut emitter = Emitter::with_clock(vec![recorder], fixed_clock);
        emitter.set_secrets(Arc::new(Secrets::new(["peer"])));
        for event in samples() {
            emitter.emit(event);
        }
        let text: String = json(&seen.borrow()).concat();
        assert!(!text.contains("peer"), "{text}");
        assert!(text.contains("\"message\":\"*** reset\""), "{text}");
        assert!(text.contains("ConnectionResetError"), "only the secret goes: {text}");
    }

    #[test]
    fn the_wire_form_of_every_kind_is_unchanged() {
        let (seen, recorder) = recorder();
        let mut emitter = Emitter::with_clock(vec![recorder], fixed_clock);
        let events = samples();
        let covered: std::collections::BTreeSet<&str> = events.iter().map(kind).collect();
        assert_eq!(covered.len(), KINDS, "a sample of every kind: {covered:?}");
        for (i, event) in events.into_iter().enumerate() {
            // The first envelope comes before a run is chosen.
            if i == 1 {
                emitter.set_run("r1");
            }
            emitter.emit(event);
        }
        let actual: String = json(&seen.borrow()).iter().map(|line| format!("{line}\n")).collect();
        if std::env::var_os("WAYMARK_BLESS").is_some() {
            std::fs::write(GOLDEN, &actual).expect("write the golden file");
        }
        let expected = std::fs::read_to_string(GOLDEN).expect("read tests/fixtures/events/v2.jsonl");
        for (i, (actual, expected)) in actual.lines().zip(expected.lines()).enumerate() {
            assert_eq!(actual, expected, "line {} of {GOLDEN}", i + 1);
        }
        assert_eq!(actual.lines().count(), expected.lines().count(), "lines in {GOLDEN}");
    }
}
