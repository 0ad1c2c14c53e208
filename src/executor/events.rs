//! What the executor tells the outside world. Reporters consume these and never reach back.

use super::output::Chunk;
use crate::classify::ErrorValue;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunOutcome {
    Succeeded,
    Failed,
    /// Stopped by a signal to the runner; resumable.
    Interrupted {
        signal: i32,
    },
}

#[derive(Debug, Clone)]
pub(crate) enum Event {
    RunStarted {
        run_id: String,
        flow: String,
        steps_total: usize,
        steps_done: usize,
        resumed: bool,
    },
    /// A step that an earlier runner already finished.
    StepAlreadyDone {
        step: String,
    },
    AttemptStarted {
        step: String,
        attempt: u32,
        max_attempts: u32,
        redelivered: bool,
    },
    /// Whole lines (or a final unterminated line) a child wrote.
    Output {
        step: String,
        stream: Stream,
        chunk: Arc<Chunk>,
    },
    AttemptSucceeded {
        step: String,
        attempt: u32,
        elapsed: Duration,
    },
    AttemptFailed {
        step: String,
        attempt: u32,
        max_attempts: u32,
        error: ErrorValue,
        /// The retry's wait and wake-up time when the policy retries.
        retry: Option<(Duration, SystemTime)>,
    },
    /// Something noteworthy that is not a failure (a malformed error file, a killed leftover).
    Warning {
        step: Option<String>,
        message: String,
    },
    /// The runner got a signal and is stopping its children.
    Cancelling {
        signal: i32,
        forced: bool,
    },
    RunFinished {
        run_id: String,
        outcome: RunOutcome,
        failure: Option<Box<Failure>>,
    },
}

/// What the user needs to know about a failed run.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub(crate) step: String,
    pub(crate) error: ErrorValue,
    pub(crate) attempts: u32,
    pub(crate) stderr_tail: String,
    pub(crate) log_dir: PathBuf,
}
