//! Running a flow, split along its seams. Who owns what:
//!
//! - [`dispatch`]: the **dispatcher** alone owns a run's live state. It decides which steps are
//!   ready, issues attempts, applies the pure retry model (`crate::retry`) when they end, commits
//!   every change through the store's `RunJournal` before acting on it, and emits
//!   `crate::events::Event`s. It never prints, never touches a process, and reads no clock but
//!   tokio's and the injected wall clock.
//! - [`launch`]: the **launcher** prepares an attempt's files and environment and spawns its
//!   child in a process group of its own; [`environment`] is what a runner adds to the
//!   definition (the env file's variables, read when it starts, and the run's secrets).
//! - [`outputs`]: a step's `WAYMARK_OUTPUT` file, read after it succeeds, and the
//!   `WAYMARK_OUTPUT_*` variables later steps see.
//! - [`supervise`]: a **supervisor** task per attempt enforces its timeout and grace, obeys
//!   cancellation, copies its output, and leaves its whole process group dead.
//! - [`evidence`]: the **evidence reader** turns an attempt that ended badly into an error, from
//!   its error file and stderr tail (the classification itself is `crate::classify`'s).
//! - Secrets (`crate::secrets`) are hidden by every sink: the output readers before the log
//!   files, the evidence and outputs readers before anything is recorded, the emitter before a
//!   reporter sees an event.
//! - `crate::os`: the platform code (process groups, `/proc`, signals, no-follow file opens),
//!   private to the crate.
//!
//! Spawning, the runner's signal source, the wall clock and the random source are injected
//! ([`dispatch::Parts`]), so the dispatcher is tested deterministically with fakes under tokio's
//! paused clock (`dispatch/tests.rs`); [`execute`] wires the real parts together.

mod dispatch;
pub(crate) mod environment;
mod evidence;
mod launch;
pub(crate) mod output;
mod outputs;
mod supervise;

pub use crate::os::process::close_inherited_fds_on_exec;
pub use crate::os::signals::unblock_inherited_signals;
pub(crate) use crate::os::signals::{RunnerSignals, restore_default_signals};
pub(crate) use output::{Chunk, OutputGate};

pub(crate) use dispatch::RunSpec;
pub(crate) use evidence::workflow_timeout;
pub(crate) use launch::{LeftRunning, kill_leftovers};

/// A step as the dispatcher and the tasks that run its attempts hold it: one of the run's
/// flow's, shared with the flow (a run of 10,000 steps copies none of them), or one made up for
/// a hook.
#[derive(Clone)]
pub(crate) enum StepRef {
    /// Step `.1` of the flow.
    InFlow(std::sync::Arc<crate::flow::Flow>, usize),
    Own(std::sync::Arc<crate::flow::Step>),
}

impl std::ops::Deref for StepRef {
    type Target = crate::flow::Step;

    fn deref(&self) -> &crate::flow::Step {
        match self {
            StepRef::InFlow(flow, index) => &flow.steps[*index],
            StepRef::Own(step) => step,
        }
    }
}

use crate::events::{Emitter, RunOutcome, Stream};
use crate::flow::Signal;
use crate::store::{RunJournal, StateDir, StoreError};
use dispatch::{Dispatcher, Parts, SignalSource, SystemClock};
use launch::ProcessLauncher;
use std::path::PathBuf;
use std::sync::Arc;
use supervise::End;

/// Messages from supervisors and output readers to the dispatcher.
#[derive(Debug)]
pub(crate) enum Msg {
    /// Output of the attempt recorded as `row` (a reader left behind by an earlier attempt of the
    /// same step may still send some; the row tells it apart).
    Output { step: usize, row: i64, stream: Stream, chunk: Arc<Chunk> },
    /// The attempt recorded as `row` of `step` ended (after SIGKILL followed the grace period
    /// when `killed_after_grace`), its leader at `exited`; `notes` are for the user; `left` is
    /// its evidence as the end found it.
    Done {
        step: usize,
        row: i64,
        end: End,
        exited: tokio::time::Instant,
        killed_after_grace: bool,
        notes: Vec<String>,
        left: Left,
    },
    /// An attempt's output could not be written to its log: waymark's own failure.
    LogFailed { row: i64, path: PathBuf, error: std::io::Error },
}

/// What an attempt left that its error is read from, as its end found it.
#[derive(Debug, Default)]
pub(crate) struct Left {
    /// The end of its stderr as it passed (`None`: read it from the log).
    pub(crate) stderr_tail: Option<output::StderrTail>,
    /// Its error file, read before the run's secrets were hidden in it: a secret in its class
    /// name does not change the class its retry policy matches (`None`: read it from the file).
    /// Boxed: every message to the dispatcher, each piece of output too, is as large as the
    /// largest.
    pub(crate) error_file: Option<Box<crate::classify::error_file::ErrorFileOutcome>>,
    /// Its first process, exited, reaped when this is dropped: after the dispatcher has let go of
    /// the attempt, and with it of the last kill of its group by that number.
    #[allow(dead_code, reason = "held for its drop, which reaps it")]
    pub(crate) leader: Option<crate::os::spawn::Child>,
}

/// Waymark's own failures while running (not a step's).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ExecError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot write attempt files{}", at_unless_said(path, source))]
    Files { path: PathBuf, source: std::io::Error },
    #[error("cannot install the runner's signal handlers: {0}")]
    Signals(std::io::Error),
    #[error(
        "processes {pids:?} of attempt {attempt} of step `{step}` from the previous runner did not die when killed; \
         the attempt is not run again while they live (check them with `ps -o pid,stat,cmd -p PID`)"
    )]
    Leftovers { step: String, attempt: u32, pids: Vec<u32> },
}

/// ` at PATH` for [`ExecError::Files`], unless its cause names the path already (`PATH: ENOENT:
/// ...`): the message names it once.
fn at_unless_said(path: &std::path::Path, source: &std::io::Error) -> String {
    let path = path.display().to_string();
    match source.to_string().contains(&path) {
        true => String::new(),
        false => format!(" at {path}"),
    }
}

/// The runner's own signals, as the dispatcher reads them, and whether it has read all that came
/// before its first look (which comes after it set the run up without awaiting, so it reads the
/// sockets themselves).
struct OsSignals(crate::os::signals::AsyncSignals, bool);

impl SignalSource for OsSignals {
    fn try_next(&mut self) -> Option<Signal> {
        if self.1 {
            return self.0.try_next().map(Signal);
        }
        // Every signal that came meanwhile, until there is none.
        let sig = self.0.try_next_unpolled();
        self.1 = sig.is_none();
        sig.map(Signal)
    }

    async fn next(&mut self) -> Signal {
        Signal(self.0.next().await)
    }
}

/// Run `spec` with real processes, writing through `journal` and reporting to `emitter`; must be
/// awaited inside the runtime the attempts run in. On waymark's own failure every running
/// attempt's process group is killed before the error is returned.
pub(crate) async fn execute(
    spec: RunSpec,
    state: StateDir,
    journal: impl RunJournal,
    signals: RunnerSignals,
    emitter: &mut Emitter,
) -> Result<RunOutcome, ExecError> {
    let signals = OsSignals(signals.into_async().map_err(ExecError::Signals)?, false);
    let mut launcher = ProcessLauncher::new(Arc::clone(&spec.flow), spec.run_id.clone(), Arc::clone(&spec.env), state);
    launcher.elsewhere = spec.elsewhere.clone();
    launcher.lines = emitter.shows_output();
    launcher.gate = emitter.output_gate();
    let hook = |name: &str| if cfg!(debug_assertions) { std::env::var(name).ok() } else { None };
    let (crash_after, crash_at_start) = (hook("WAYMARK_TEST_CRASH_AFTER"), hook("WAYMARK_TEST_CRASH_AT_START"));
    let rng = fastrand::Rng::new();
    let stall =
        hook("WAYMARK_TEST_STALL_AT_START").and_then(|ms| ms.parse().ok()).map(std::time::Duration::from_millis);
    let parts = Parts { launcher, journal, signals, clock: SystemClock, rng, crash_after, crash_at_start };
    let dispatcher = Dispatcher::new(spec, parts, emitter)?;
    // Test hook, in debug builds only (`WAYMARK_TEST_STALL_AT_START=MS`): work that long without
    // awaiting before the first start, as a long set-up would.
    if let Some(stall) = stall {
        std::thread::sleep(stall);
    }
    dispatcher.run().await
}
