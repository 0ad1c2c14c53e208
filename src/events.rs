//! Events, version 2: everything waymark tells the outside world while it runs a flow.
//!
//! The dispatcher and the commands around it emit [`Event`]s through an [`Emitter`], which stamps
//! each with a sequence number, the wall-clock time and the run id (an [`Envelope`]) and hands it
//! to every attached [`Reporter`](crate::reporter::Reporter). Reporters own the terminal (or a
//! file, or a socket); they consume events and never reach back. Every event derives `Serialize`:
//! a machine-readable stream is a reporter like any other.

use crate::classify::ErrorValue;
use crate::executor::Chunk;
use serde::{Serialize, Serializer};
use std::path::PathBuf;
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
    /// The run the event is about; `None` only before a run is chosen (waiting for the lock).
    pub(crate) run_id: Option<String>,
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
    /// It started longer ago than the flow's `resume_within`.
    Stale {
        #[serde(rename = "age_ms", serialize_with = "millis")]
        age: Duration,
        #[serde(rename = "resume_within_ms", serialize_with = "millis")]
        limit: Duration,
    },
}

/// Why a step did not run in this runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum SkipReason {
    /// An earlier runner of the same run already finished it.
    AlreadySucceeded,
}

/// How a step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum StepOutcome {
    Succeeded,
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
    /// The error matched none of the policy's `exception_types` (or the step has no retry policy
    /// and the budget of one attempt is spent; see `Exhausted`).
    NotRetryable,
    /// Every attempt of the budget was used.
    Exhausted,
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
        #[serde(flatten)]
        reason: AbandonReason,
    },
    RunFinished {
        #[serde(flatten)]
        outcome: RunOutcome,
        failure: Option<Box<Failure>>,
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
        #[serde(flatten)]
        retry: RetryPlan,
    },
    StepFinished {
        step: String,
        outcome: StepOutcome,
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
        /// Run again after its runner died or was stopped.
        redelivered: bool,
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
    },
    /// A line for the user that is not about an attempt's outcome.
    Notice {
        notice: NoticeKind,
        step: Option<String>,
        message: String,
    },
    /// The runner got a signal and is stopping its children.
    Cancelling {
        signal: i32,
        forced: bool,
    },
}

/// What the user needs to know about a failed run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Failure {
    pub(crate) step: String,
    pub(crate) error: ErrorValue,
    pub(crate) attempts: u32,
    pub(crate) stderr_tail: String,
    pub(crate) log_dir: PathBuf,
}

/// Consumes events. Reporters own what they write to and never reach back into the run.
pub(crate) trait Reporter {
    fn report(&mut self, event: &Envelope);
}

/// Stamps events and hands them to every attached reporter, in the order they were attached.
pub(crate) struct Emitter {
    seq: u64,
    run_id: Option<String>,
    reporters: Vec<Box<dyn Reporter>>,
    /// Wall-clock time; injected by tests.
    now: fn() -> SystemTime,
}

impl Emitter {
    pub(crate) fn new(reporters: Vec<Box<dyn Reporter>>) -> Emitter {
        Emitter { seq: 0, run_id: None, reporters, now: SystemTime::now }
    }

    /// An emitter whose clock is `now` (tests).
    #[cfg(test)]
    pub(crate) fn with_clock(reporters: Vec<Box<dyn Reporter>>, now: fn() -> SystemTime) -> Emitter {
        Emitter { now, ..Emitter::new(reporters) }
    }

    /// The run that the events from now on are about.
    pub(crate) fn set_run(&mut self, run_id: &str) {
        self.run_id = Some(run_id.to_owned());
    }

    pub(crate) fn emit(&mut self, event: Event) {
        self.seq += 1;
        let envelope = Envelope { seq: self.seq, at: (self.now)(), run_id: self.run_id.clone(), event };
        for reporter in &mut self.reporters {
            reporter.report(&envelope);
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

fn rfc3339<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&humantime::format_rfc3339_millis(*t))
}

fn millis<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn lossy<S: Serializer>(chunk: &Arc<Chunk>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&String::from_utf8_lossy(chunk))
}
