//! The dispatcher: the one owner of a run's live state. It decides which steps are ready, issues
//! their attempts through a [`Launcher`], applies the retry model when they end, commits every
//! change through a [`RunJournal`] before acting on it, and tells the world through an
//! [`Emitter`]. Everything it touches from outside is injected: the launcher, the journal, the
//! runner's signal source, the wall clock and the random source for jitter; tokio's clock drives
//! its timers, so a test runs it under a paused clock with fakes (see `tests.rs`).

use super::environment::RunEnv;
use super::launch::{Attempt, Aux, Launched, Launcher, LeftRunning};
use super::outputs::{self, RunOutputs};
use super::supervise::{Control, End};
use super::{ExecError, Msg, StepRef, evidence};
use crate::classify::{Ending, ErrorValue};
use crate::events::{
    AttemptEnd, Emitter, Event, Failure, RetryPlan, RetryStop, RunOutcome, SkipReason, StepOutcome, StopReason,
};
use crate::flow::{Flow, Signal, Step};
use crate::os::process::ExitKind;
use crate::retry::Decision;
use crate::secrets::Secrets;
use crate::store::{
    AttemptOutcome, AttemptResult, AuxKind, AuxRun, NextAttempt, RunJournal, RunStatus, StepRecord, StepState,
    StepUpdate,
};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// How long before its backoff ends a retry's start is recorded. Recording it is a round trip to
/// the journal's thread and a commit; made while the backoff still runs, it does not make the
/// wait longer, and the child is spawned when the backoff ends (the attempt's timeout counts from
/// then). A runner killed in between leaves what one killed between any start's commit and its
/// spawn leaves: an attempt recorded as running without a pid, run again under its number on
/// resume. A signal in between cancels it before its child exists, as during any start's commit.
const RECORD_AHEAD: Duration = Duration::from_millis(3);

/// When a retry whose backoff ends at `wake` is issued: `RECORD_AHEAD` before, unless the run's
/// `deadline` comes first (then the deadline ends the wait, and no child is started after it).
fn issue_at(wake: Instant, deadline: Option<Instant>) -> Instant {
    match deadline {
        Some(deadline) if deadline <= wake => wake,
        _ => wake.checked_sub(RECORD_AHEAD).unwrap_or(wake),
    }
}

/// Where the runner's own signals (SIGINT, SIGTERM, SIGHUP, and the others of `os::signals`) come from.
pub(crate) trait SignalSource {
    /// A signal delivered before the dispatcher listened, if one is waiting.
    fn try_next(&mut self) -> Option<Signal>;
    /// The next signal; pending forever when none will come.
    async fn next(&mut self) -> Signal;
}

/// The wall clock, for what is recorded (a retry's wake-up time, an attempt's end).
pub(crate) trait Clock {
    fn now(&self) -> SystemTime;
}

/// The system's wall clock.
pub(crate) struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A run about to execute: the flow as recorded, its id, each step's recorded state (in the
/// flow's order) and whether an earlier runner started it.
pub(crate) struct RunSpec {
    pub(crate) flow: Arc<Flow>,
    pub(crate) run_id: String,
    /// Each step's record, in the flow's order; none for a new run, whose steps are all pending
    /// (a step without a record is read as pending).
    pub(crate) steps: Vec<StepRecord>,
    pub(crate) resumed: bool,
    /// At most this many attempts run at once.
    pub(crate) max_parallel: usize,
    /// When the workflow's deadline (its top-level `timeout`) passes, if it has one.
    pub(crate) deadline: Option<SystemTime>,
    /// The compensations and hooks recorded for the run by earlier runners.
    pub(crate) aux: Vec<AuxRun>,
    /// The steps (by index) whose last attempt a signal to an earlier runner cancelled: they were
    /// under way, and go on as the steps under way do (`interrupted` in `status`).
    pub(crate) interrupted: BTreeSet<usize>,
    /// What this runner adds to the definition: the env file's variables and the secrets.
    pub(crate) env: Arc<RunEnv>,
    /// The host the run's previous runner ran on, if it was another host (a shared store): the
    /// attempts it left in flight are redelivered without killing anything by their pids.
    pub(crate) elsewhere: Option<String>,
}

/// What the dispatcher is given to act on the world.
pub(crate) struct Parts<L, J, S, C> {
    pub(crate) launcher: L,
    pub(crate) journal: J,
    pub(crate) signals: S,
    pub(crate) clock: C,
    /// For the jitter of backoff delays.
    pub(crate) rng: fastrand::Rng,
    /// Test hook, in debug builds only (`WAYMARK_TEST_CRASH_AFTER=STEP`): SIGKILL the runner
    /// right after an attempt outcome of STEP is committed, to test resuming from exactly there.
    /// STEP's outcomes are committed on their own, never with the next start (see [`Held`]).
    pub(crate) crash_after: Option<String>,
    /// Test hook, in debug builds only (`WAYMARK_TEST_CRASH_AT_START=STEP`): SIGKILL the runner
    /// right after an attempt of STEP is recorded as starting in one transaction with a held
    /// outcome (see [`Held`]: usually a failed attempt of STEP's, or the success of the step
    /// before), before its child is spawned.
    pub(crate) crash_at_start: Option<String>,
}

/// An attempt's outcome, decided but not yet committed: a success, or a failure whose retry is due
/// at once (no backoff). The next attempt started in the same turn of the event loop, a few
/// instructions later, commits it in the same transaction as its own start, whichever step that
/// attempt is of (usually the retry, or a step that waited for the success): one write instead of
/// two, and for a success one synced commit where there were a synced and an unsynced one. A step
/// issued by that success counts its timeout from the commit, as it did when the success was
/// committed alone before it was issued. A crash leaves both or neither, and each
/// is a state resume already handles: before, the ended attempt in flight (its group killed by
/// its recorded pid, it is redelivered); after, the next attempt in flight without a pid (its
/// processes found by their `WAYMARK_ATTEMPT_ID`, it is redelivered). Anything else to be written
/// first commits it alone, as does the end of the turn, before the loop waits for anything: it is
/// never held across a wait. What is said about the attempt, and every event of the run after
/// it, is said once it is committed (see `Dispatcher::say`).
struct Held {
    /// When it was decided: a step issued since then was issued by it.
    at: Instant,
    row: i64,
    result: AttemptResult,
    update: StepUpdate,
    said: Vec<Event>,
}

/// An attempt whose child runs.
struct Live {
    attempt: u32,
    row: i64,
    pid: u32,
    stem: PathBuf,
    stderr_from: u64,
    issued: Instant,
    control: watch::Sender<Control>,
}

/// What is kept of an attempt that ended (or never started).
struct Ended {
    attempt: u32,
    row: i64,
    stem: PathBuf,
    stderr_from: u64,
    issued: Instant,
    /// When it ended (its leader exited; stopped with a grace, the last of its group), or was
    /// found never to start: its duration is from
    /// `issued` to then, whatever the runner did after (a final outcome's commit waits for the
    /// disk).
    ended: Instant,
    /// Stopping it took SIGKILL after the grace period.
    killed_after_grace: bool,
    /// Its evidence as its end found it.
    left: super::Left,
}

/// How a catch handler ended: its outcome and exit status, when (as an attempt's end) and how long
/// its process ran, why it did not succeed (for the warning) and its error (for the record).
struct HandlerEnd {
    outcome: AttemptOutcome,
    exit_code: Option<i32>,
    ended: Instant,
    duration: Duration,
    why: Option<String>,
    error: Option<ErrorValue>,
}

enum Slot {
    /// To start `attempt` once the steps it needs have succeeded.
    Ready {
        attempt: u32,
        redelivered: bool,
    },
    /// Issued: its turn came (or its backoff is over), and it waits for a free slot. Its timeout
    /// counts from `issued`. `retry`: a later attempt of a step that already ran in this run.
    Queued {
        attempt: u32,
        redelivered: bool,
        issued: Instant,
        retry: bool,
    },
    /// A retry waits for its backoff.
    Waiting {
        attempt: u32,
        wake: Instant,
    },
    /// Its attempt runs. (Boxed, as `Handling`: a slot is 24 bytes where it was 80, a step's 72
    /// where it was 200, and a 10,000-step run's are new memory, a page fault per 4 KB.)
    Running(Box<Live>),
    /// Failed for good with an error its catch handler (with a command) matches: the handler of
    /// the error of attempt `attempt` is to run: `handler`, the one the error matched as the step
    /// reported it (its class may hold a secret, hidden in the error recorded); `None`: the one
    /// the recorded error matches (a resumed run's).
    Catching {
        attempt: u32,
        handler: Option<u16>,
    },
    /// Its catch handler runs.
    Handling(Box<Live>),
    Succeeded,
    /// The error was caught: like succeeded for the steps that need it.
    Caught,
    Failed,
    Skipped,
}

impl Slot {
    /// The running attempt or handler, if any.
    fn live(&self) -> Option<&Live> {
        match self {
            Slot::Running(live) | Slot::Handling(live) => Some(live.as_ref()),
            _ => None,
        }
    }

    /// Whether the step is done in a way that lets the steps that need it run.
    fn done(&self) -> bool {
        matches!(self, Slot::Succeeded | Slot::Caught)
    }
}

struct StepSlot {
    step: StepRef,
    slot: Slot,
    /// Attempts used before the current budget began (`waymark resume` of a failed run).
    budget_base: u32,
    /// The attempt that ran last, whose logs explain a failure, and where its stderr starts.
    last_attempt: u32,
    last_stderr_from: u64,
    /// Boxed, for the size of a slot (see [`Slot::Running`]): most steps have none.
    last_error: Option<Box<ErrorValue>>,
    /// Whether this runner has said the step is ready, and that it started.
    said_ready: bool,
    said_started: bool,
    /// Left under way by an earlier runner (its attempt was in flight when the runner died, or a
    /// signal to the runner cancelled it), and not run again by this one yet.
    left_under_way: bool,
    /// Why its retrying stopped, when it failed for good in this runner: as decided on its error
    /// as the step reported it (its class may hold a secret, hidden in the error kept), for the
    /// failure report.
    stopped_by: Option<StopReason>,
    /// What this runner warned of the evidence of the step's last attempt: the same said of the
    /// next one (a class waymark does not know, failing attempt after attempt) is not said again.
    warned: Vec<String>,
}

impl StepSlot {
    /// The number of the last attempt the current budget allows.
    fn max_attempts(&self) -> u32 {
        self.budget_base.saturating_add(self.step.retry.attempts)
    }

    /// Attempt `attempt`'s number within the current budget, as the retry policy counts.
    fn within_budget(&self, attempt: u32) -> u32 {
        attempt - self.budget_base
    }
}

/// The steps sorted by what the dispatcher does with them next, kept up to date by
/// [`Dispatcher::set_slot`] on every change of a slot: the steps ready to be issued (their needs
/// all done), the issued ones and the catch handlers to start (in file order), the retries
/// waiting for their backoff (by wake-up time), and counts. Each need is counted down once, when
/// the step it names is done, so a run costs its steps plus its `needs` entries in all.
struct Agenda {
    /// How many of each step's `needs` entries are not done yet.
    unmet: Vec<usize>,
    /// The steps that need each step, once per entry: those of step `i` are
    /// `dependents[first_dependent[i]..first_dependent[i + 1]]` (one list for all, rather than a
    /// list per step: a 10,000-step flow made 10,000 of them).
    dependents: Vec<usize>,
    first_dependent: Vec<usize>,
    /// `Ready` steps whose needs are all done: those yet to start, and those under way again
    /// (an attempt redelivered after a runner died, or run again after a signal cancelled it).
    fresh: BTreeSet<usize>,
    under_way: BTreeSet<usize>,
    /// `Queued` and `Catching` steps, in file order.
    pending: BTreeSet<usize>,
    /// `Waiting` steps, by wake-up time then file order.
    waits: BTreeSet<(Instant, usize)>,
    /// `Queued` steps with a timeout, by the end of their attempt's timeout (it counts from when
    /// the attempt was issued, slot or no slot) then file order.
    queued_timeouts: BTreeSet<(Instant, usize)>,
    /// Steps done (succeeded or caught).
    done: usize,
    /// Steps under way with their retries: `Waiting`, `Queued` for a retry, or `Catching`.
    retrying: usize,
}

impl Agenda {
    fn new(steps: &[StepSlot]) -> Agenda {
        // How many steps need each step, then where each one's list starts, then the lists.
        let mut first_dependent = vec![0; steps.len() + 1];
        for s in steps {
            for &need in &s.step.needs {
                first_dependent[need + 1] += 1;
            }
        }
        for i in 0..steps.len() {
            first_dependent[i + 1] += first_dependent[i];
        }
        let mut filled = first_dependent.clone();
        let mut dependents = vec![0; first_dependent[steps.len()]];
        for (index, s) in steps.iter().enumerate() {
            for &need in &s.step.needs {
                dependents[filled[need]] = index;
                filled[need] += 1;
            }
        }
        let mut agenda = Agenda {
            unmet: steps.iter().map(|s| s.step.needs.len()).collect(),
            dependents,
            first_dependent,
            fresh: BTreeSet::new(),
            under_way: BTreeSet::new(),
            pending: BTreeSet::new(),
            waits: BTreeSet::new(),
            queued_timeouts: BTreeSet::new(),
            done: 0,
            retrying: 0,
        };
        for index in 0..steps.len() {
            agenda.enter(index, steps);
        }
        agenda
    }

    /// Step `index`, whose attempts time out after `timeout`, left `slot`.
    fn leave(&mut self, index: usize, timeout: Option<Duration>, slot: &Slot) {
        match *slot {
            Slot::Ready { .. } => {
                self.fresh.remove(&index);
                self.under_way.remove(&index);
            }
            Slot::Queued { retry, issued, .. } => {
                if let Some(timeout) = timeout {
                    self.queued_timeouts.remove(&(issued + timeout, index));
                }
                self.pending.remove(&index);
                self.retrying -= usize::from(retry);
            }
            Slot::Catching { .. } => {
                self.pending.remove(&index);
                self.retrying -= 1;
            }
            Slot::Waiting { wake, .. } => {
                self.waits.remove(&(wake, index));
                self.retrying -= 1;
            }
            Slot::Succeeded | Slot::Caught => {
                debug_assert!(false, "a step done stays done");
                self.done -= 1;
            }
            Slot::Running(_) | Slot::Handling(_) | Slot::Failed | Slot::Skipped => {}
        }
    }

    /// Step `index` entered the slot it has now in `steps`.
    fn enter(&mut self, index: usize, steps: &[StepSlot]) {
        match steps[index].slot {
            Slot::Ready { redelivered, .. } => {
                self.ready_if_needs_done(index, redelivered || steps[index].left_under_way)
            }
            Slot::Queued { retry, issued, .. } => {
                if let Some(timeout) = steps[index].step.timeout {
                    self.queued_timeouts.insert((issued + timeout, index));
                }
                self.pending.insert(index);
                self.retrying += usize::from(retry);
            }
            Slot::Catching { .. } => {
                self.pending.insert(index);
                self.retrying += 1;
            }
            Slot::Waiting { wake, .. } => {
                self.waits.insert((wake, index));
                self.retrying += 1;
            }
            Slot::Succeeded | Slot::Caught => {
                self.done += 1;
                for i in self.first_dependent[index]..self.first_dependent[index + 1] {
                    let dependent = self.dependents[i];
                    self.unmet[dependent] -= 1;
                    if let Slot::Ready { redelivered, .. } = steps[dependent].slot {
                        self.ready_if_needs_done(dependent, redelivered || steps[dependent].left_under_way);
                    }
                }
            }
            Slot::Running(_) | Slot::Handling(_) | Slot::Failed | Slot::Skipped => {}
        }
    }

    fn ready_if_needs_done(&mut self, index: usize, under_way: bool) {
        if self.unmet[index] == 0 {
            match under_way {
                true => self.under_way.insert(index),
                false => self.fresh.insert(index),
            };
        }
    }
}

pub(crate) struct Dispatcher<'e, L, J, S, C> {
    flow: Arc<Flow>,
    parts: Parts<L, J, S, C>,
    emitter: &'e mut Emitter,
    steps: Vec<StepSlot>,
    /// Which steps are in which state, kept as slots change so that an event costs what it
    /// changes rather than a walk over every step.
    agenda: Agenda,
    tx: mpsc::Sender<Msg>,
    rx: mpsc::Receiver<Msg>,
    /// The first signal the runner received, if any.
    cancelled: Option<Signal>,
    /// `fail_fast` cancelled the running attempts before any signal came: their cancellation is
    /// its, not the signal's, even when the signal comes during their grace period (the run can
    /// only fail, and what resumes them its end says, as for any attempt `fail_fast` cancels).
    fail_fast_first: bool,
    running: usize,
    max_parallel: usize,
    /// The step that failed for good first: from then on no new step starts.
    stopping: Option<usize>,
    /// When the workflow's deadline passes, and whether it has.
    deadline: Option<Instant>,
    expired: bool,
    /// A step had failed for good when the deadline passed: the steps skipped since were skipped
    /// because the run failed (first), not because of the deadline.
    failed_before_deadline: bool,
    /// Steps in the order they succeeded: by earlier runners (by when), then by this one.
    completed: Vec<usize>,
    /// Compensations and hooks that have run for this run: they do not run again.
    aux_done: BTreeSet<(AuxKind, String)>,
    /// Steps an earlier runner recorded skipped when the run's wind-down began, not yet said to
    /// be (with the next compensation or hook, or the run's end): their indices.
    unsaid_skips: Vec<usize>,
    /// The outputs of the steps that succeeded, recorded ones included: what an attempt sees.
    outputs: RunOutputs,
    /// Hidden in what is read from an attempt's files before it is recorded.
    secrets: Arc<Secrets>,
    /// The declared secrets alone (see [`RunEnv::declared`]): taken out of a step's outputs.
    declared: Arc<Secrets>,
    /// When this runner took the run up, for the run's duration.
    began: Instant,
    /// An outcome waiting to be committed with the next attempt's start (see [`Held`]).
    held: Option<Held>,
}

impl<'e, L: Launcher, J: RunJournal, S: SignalSource, C: Clock> Dispatcher<'e, L, J, S, C> {
    /// Set up a run from its recorded state. An attempt left in flight by a dead runner is made
    /// sure to be dead first; an error if some of its processes will not die.
    pub(crate) fn new(
        spec: RunSpec,
        mut parts: Parts<L, J, S, C>,
        emitter: &'e mut Emitter,
    ) -> Result<Dispatcher<'e, L, J, S, C>, ExecError> {
        let (tx, rx) = mpsc::channel(256);
        let ((outputs, too_long), secrets) = (RunOutputs::recorded(&spec.steps), Arc::clone(&spec.env.secrets));
        let declared = Arc::clone(&spec.env.declared);
        let flow = spec.flow;
        let steps_total = flow.steps.len();
        let done = |s: &&StepRecord| matches!(s.state, StepState::Succeeded | StepState::Caught);
        let steps_done = spec.steps.iter().filter(done).count();
        emitter.flow(&flow.path, flow.fail_fast);
        emitter.emit(match spec.resumed {
            true => Event::RunResumed { flow: flow.name.clone(), steps_total, steps_done },
            false => Event::RunStarted { flow: flow.name.clone(), steps_total },
        });
        for (step, message) in too_long {
            emitter.warning(Some(&step), message);
        }
        // What a dead runner left running (attempts, catch handlers, compensations, hooks) is made
        // sure dead first, all of it at once: nothing of it may run beside what this one starts.
        let (said, error) = parts.launcher.kill_leftovers(&LeftRunning::of(&spec.steps, &spec.aux));
        for (step, message) in said {
            emitter.warning(step.as_deref(), message);
        }
        if let Some(e) = error {
            return Err(e);
        }
        let pending = StepRecord::pending("");
        let record = |index: usize| spec.steps.get(index).unwrap_or(&pending);
        // A resume that can only fail the run (past the workflow's deadline, or a step failed for
        // good under `fail_fast`) serves no retry: none is said to be due.
        let only_fails = spec.deadline.is_some_and(|at| at <= parts.clock.now())
            || (flow.fail_fast && spec.steps.iter().any(|r| r.state == StepState::Failed));
        let mut steps = Vec::with_capacity(flow.steps.len());
        for (index, step) in flow.steps.iter().enumerate() {
            let rec = record(index);
            let cut_short = spec.interrupted.contains(&index);
            let slot = match &rec.state {
                StepState::Pending => Slot::Ready { attempt: rec.attempts_used + 1, redelivered: false },
                StepState::Succeeded => {
                    emitter.emit(Event::StepSkipped { step: step.name.clone(), reason: SkipReason::AlreadySucceeded });
                    Slot::Succeeded
                }
                StepState::Failed => {
                    emitter.emit(Event::StepSkipped { step: step.name.clone(), reason: SkipReason::AlreadyFailed });
                    Slot::Failed
                }
                StepState::Skipped => Slot::Skipped,
                StepState::Caught => {
                    emitter.emit(Event::StepSkipped { step: step.name.clone(), reason: SkipReason::AlreadyCaught });
                    Slot::Caught
                }
                StepState::Catching { attempt, .. } => Slot::Catching { attempt: *attempt, handler: None },
                StepState::Waiting { next_attempt, wake_at } => {
                    // A resumed run serves the rest of a recorded backoff.
                    let left = wake_at.duration_since(parts.clock.now()).unwrap_or(Duration::ZERO);
                    let retry = RetryPlan { delay: left, wake_at: *wake_at };
                    let max_attempts = rec.budget_base.saturating_add(step.retry.attempts);
                    let next_attempt = *next_attempt;
                    if !only_fails {
                        emitter.emit(Event::StepWaiting { step: step.name.clone(), next_attempt, max_attempts, retry });
                    }
                    Slot::Waiting { attempt: next_attempt, wake: Instant::now() + left }
                }
                StepState::InFlight { attempt, .. } => Slot::Ready { attempt: *attempt, redelivered: true },
            };
            steps.push(StepSlot {
                step: StepRef::InFlow(Arc::clone(&flow), index),
                slot,
                budget_base: rec.budget_base,
                // A step left under way: the attempt cut short, whose logs explain it if it does
                // not run again (the deadline passed).
                last_attempt: match rec.state {
                    StepState::InFlight { attempt, .. } => attempt,
                    _ if cut_short => rec.attempts_used + 1,
                    _ => rec.attempts_used,
                },
                last_stderr_from: 0,
                last_error: rec.last_error.clone(),
                said_ready: false,
                said_started: false,
                left_under_way: matches!(rec.state, StepState::InFlight { .. }) || cut_short,
                stopped_by: None,
                warned: Vec::new(),
            });
        }
        let unsaid_skips = (0..steps.len()).filter(|&i| matches!(steps[i].slot, Slot::Skipped)).collect();
        // A step already failed for good (its runner was stopped, or died, before the run was
        // finished): nothing new starts, as if it had just failed. The run failed on the first to
        // fail, by when it ended, whatever the order of the file.
        let stopping = (0..steps.len())
            .filter(|&i| matches!(steps[i].slot, Slot::Failed))
            .min_by_key(|&i| (record(i).ended_at, i));
        let deadline =
            spec.deadline.map(|at| Instant::now() + at.duration_since(parts.clock.now()).unwrap_or(Duration::ZERO));
        let max_parallel = spec.max_parallel.max(1);
        let agenda = Agenda::new(&steps);
        let mut completed: Vec<usize> = (0..steps.len()).filter(|&i| steps[i].slot.done()).collect();
        completed.sort_by_key(|&i| (record(i).ended_at, i));
        let aux_done: BTreeSet<_> =
            spec.aux.iter().filter(|aux| aux.finished).map(|aux| (aux.kind, aux.name.clone())).collect();
        // No child of the run is alive: this runner has started none, and a dead runner's are
        // dead (above). The first start is made on the runtime's thread, not handed to the
        // writer thread just started and back (four of a 1-step run's 37 context switches).
        parts.journal.children_alive(false);
        Ok(Dispatcher {
            flow,
            parts,
            emitter,
            steps,
            agenda,
            tx,
            rx,
            cancelled: None,
            fail_fast_first: false,
            running: 0,
            max_parallel,
            stopping,
            deadline,
            expired: false,
            failed_before_deadline: false,
            completed,
            aux_done,
            unsaid_skips,
            outputs,
            secrets,
            declared,
            began: Instant::now(),
            held: None,
        })
    }

    /// Run until every step succeeded, one failed for good, or a signal stopped the runner.
    /// On waymark's own failure every running attempt's process group is killed first.
    pub(crate) async fn run(mut self) -> Result<RunOutcome, ExecError> {
        let result = self.event_loop().await;
        if result.is_err() {
            for s in &self.steps {
                if let Some(live) = s.slot.live() {
                    self.parts.launcher.kill(live.pid);
                }
            }
        }
        result
    }

    async fn event_loop(&mut self) -> Result<RunOutcome, ExecError> {
        loop {
            // Signals that came while the dispatcher was not listening (before the loop, or while
            // it awaited a write): nothing starts after them.
            self.take_pending_signals();
            let now = Instant::now();
            if self.deadline.is_some_and(|d| d <= now) && !self.expired && self.cancelled.is_none() {
                self.on_deadline();
            }
            if self.cancelled.is_none() && !self.expired {
                self.make_ready(now);
                self.start_queued().await?;
                self.time_out_queued().await?;
            }
            // An outcome held for a start that did not come in this turn is committed now, before
            // anything else is written or waited for.
            self.commit_held().await?;
            if self.running == 0
                && let Some(outcome) = self.outcome()
            {
                let outcome = self.wind_down(outcome).await?;
                return self.finish(outcome).await;
            }
            let wake = self.next_wake().into_iter().chain(self.queued_timeout()).min();
            let deadline = self.deadline.filter(|_| !self.expired && self.cancelled.is_none());
            tokio::select! {
                Some(msg) = self.rx.recv() => self.handle(msg).await?,
                _ = crate::os::timer::sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => {}
                _ = crate::os::timer::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {}
                sig = self.parts.signals.next() => self.on_signal(sig),
                // A runner fenced off from a shared store stops: `run` kills its attempts.
                lost = self.parts.journal.lease_lost() => return Err(ExecError::Store(lost)),
            }
        }
    }

    /// Put step `index` in `slot`, keeping the agenda up to date; the slot it leaves.
    fn set_slot(&mut self, index: usize, slot: Slot) -> Slot {
        let old = std::mem::replace(&mut self.steps[index].slot, slot);
        self.agenda.leave(index, self.steps[index].step.timeout, &old);
        self.agenda.enter(index, &self.steps);
        old
    }

    /// Issue what may run now, in file order: a step whose needs have all succeeded (unless a
    /// step failed for good: then no new step starts), and a retry whose backoff is over (unless
    /// `fail_fast` stopped retrying). A step an earlier runner left under way (its attempt was
    /// running when the runner died, or a signal cancelled it) after a failure for good: like the
    /// other steps under way it finishes, unless `fail_fast`.
    fn make_ready(&mut self, now: Instant) {
        let retries_go_on = self.under_way_goes_on();
        let agenda = &self.agenda;
        let mut due: Vec<usize> = Vec::new();
        if self.stopping.is_none() {
            due.extend(&agenda.fresh);
        }
        if retries_go_on {
            due.extend(&agenda.under_way);
            // A retry is issued once its backoff ends, or `RECORD_AHEAD` before, for when it ends.
            let deadline = self.deadline;
            due.extend(
                agenda.waits.iter().take_while(|(wake, _)| issue_at(*wake, deadline) <= now).map(|&(_, index)| index),
            );
        }
        due.sort_unstable();
        for index in due {
            let queued = match self.steps[index].slot {
                Slot::Ready { attempt, redelivered } => {
                    Slot::Queued { attempt, redelivered, issued: now, retry: false }
                }
                Slot::Waiting { attempt, wake } => {
                    Slot::Queued { attempt, redelivered: false, issued: wake.max(now), retry: true }
                }
                _ => continue,
            };
            self.set_slot(index, queued);
            if !self.steps[index].said_ready {
                self.steps[index].said_ready = true;
                self.say(Event::StepReady { step: self.steps[index].step.name.clone() });
            }
        }
    }

    /// Start issued attempts in file order while fewer than `max_parallel` run.
    async fn start_queued(&mut self) -> Result<(), ExecError> {
        let mut from = 0;
        // The step whose retry was issued at once in this pass (see below): once per pass, so that
        // a program that cannot start and retries at once does not take every turn until its
        // budget is spent, with the steps after it, the deadline and the other children waiting.
        let mut reissued = None;
        loop {
            if self.running >= self.max_parallel || self.cancelled.is_some() || self.expired {
                break;
            }
            // The next issued step after the last one looked at, as a walk in file order would
            // find it: starting one may change the steps after it.
            let Some(&index) = self.agenda.pending.range(from..).next() else { break };
            from = index + 1;
            match self.steps[index].slot {
                Slot::Queued { .. } => {
                    self.start(index).await?;
                    // An attempt that ended without a child (its program could not be started,
                    // or its timeout passed while it waited for a slot) may leave its step
                    // catching: its handler is looked at now, as no child's exit will wake the
                    // loop for it. Or its retry may be due at once (no backoff): it is issued
                    // now, and takes the free slot before the steps after it in the file, as a
                    // walk in file order finds it (before, the next ready step took the slot).
                    if matches!(self.steps[index].slot, Slot::Waiting { .. }) && reissued != Some(index) {
                        reissued = Some(index);
                        self.make_ready(Instant::now());
                    }
                    if matches!(self.steps[index].slot, Slot::Catching { .. } | Slot::Queued { .. }) {
                        from = index;
                    }
                }
                Slot::Catching { .. } if self.under_way_goes_on() => {
                    self.commit_held().await?;
                    self.start_handler(index).await?
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The run's outcome once nothing is running, or `None` while work remains.
    fn outcome(&self) -> Option<RunOutcome> {
        if self.agenda.done == self.steps.len() {
            return Some(RunOutcome::Succeeded);
        }
        if self.expired {
            return Some(RunOutcome::Failed);
        }
        let interrupted = self.cancelled.map(|sig| RunOutcome::Interrupted { signal: sig.number() });
        if self.stopping.is_some() {
            // Without fail_fast the steps already under way finish with their retries, and a
            // signal leaves them (cut short, waiting for a retry, or for their catch handler) to go
            // on when the run resumes: it is interrupted. With nothing left under way, or with
            // fail_fast, a run that can only fail fails.
            let goes_on = !self.flow.fail_fast;
            return match interrupted {
                None if goes_on && self.agenda.retrying > 0 => None,
                Some(interrupted) if goes_on && (self.agenda.retrying > 0 || !self.agenda.under_way.is_empty()) => {
                    Some(interrupted)
                }
                _ => Some(RunOutcome::Failed),
            };
        }
        interrupted
    }

    /// Whether the steps under way go on with their retries and catch handlers: not once a step
    /// failed for good under `fail_fast`.
    fn under_way_goes_on(&self) -> bool {
        self.stopping.is_none() || !self.flow.fail_fast
    }

    /// When a waiting retry is next due, while `make_ready` would take it: after a signal, the
    /// workflow deadline or a `fail_fast` failure none is, and the loop waits for the running
    /// children rather than wake for a retry it will not take.
    fn next_wake(&self) -> Option<Instant> {
        if self.cancelled.is_some() || self.expired || !self.under_way_goes_on() {
            return None;
        }
        self.agenda.waits.first().map(|&(wake, _)| issue_at(wake, self.deadline))
    }

    /// When the first attempt issued and waiting for a slot times out: its clock started when it
    /// was issued, so it times out then, whether or not a slot came free.
    fn queued_timeout(&self) -> Option<Instant> {
        if self.cancelled.is_some() || self.expired {
            return None;
        }
        self.agenda.queued_timeouts.first().map(|&(at, _)| at)
    }

    /// The attempts issued and waiting for a slot whose timeout passed: each times out now,
    /// without a child and without a slot (see `start`), in file order.
    async fn time_out_queued(&mut self) -> Result<(), ExecError> {
        let now = Instant::now();
        let mut due: Vec<usize> =
            self.agenda.queued_timeouts.iter().take_while(|&&(at, _)| at <= now).map(|&(_, index)| index).collect();
        if !due.is_empty() {
            due.sort_unstable();
            // A success held for the next start would restart a new step's clock in `start`: it
            // is committed first, so that an attempt started here times out without a child.
            self.commit_held().await?;
        }
        for index in due {
            if self.cancelled.is_some() || self.expired {
                break;
            }
            // Kept by `set_slot`: a step in the set waits for a slot (one left there would wake
            // the loop at once, on every turn).
            debug_assert!(matches!(self.steps[index].slot, Slot::Queued { .. }), "{index} is not waiting for a slot");
            self.start(index).await?;
        }
        Ok(())
    }

    /// Issue the next attempt of step `index`: its start is durable before the child exists.
    async fn start(&mut self, index: usize) -> Result<(), ExecError> {
        let Slot::Queued { attempt, redelivered, mut issued, retry } = self.steps[index].slot else { return Ok(()) };
        let step = self.steps[index].step.clone();
        let max_attempts = self.steps[index].max_attempts();
        let stem = match self.parts.launcher.prepare(&step, attempt) {
            Ok(stem) => stem,
            Err(e) => {
                self.commit_held().await?;
                return Err(e);
            }
        };
        let row = match self.held.take() {
            // An outcome held for this start (see `Held`): both in one transaction.
            Some(held) => {
                let next = NextAttempt { step: &step.name, attempt, redelivered, log_stem: &stem };
                let row = self
                    .parts
                    .journal
                    .attempt_finished_then_starting(held.row, &held.result, &held.update, &next)
                    .await?;
                // A step that the success issued: its clock starts once the success is on disk.
                if !retry && held.update == StepUpdate::Succeeded && issued >= held.at {
                    issued = Instant::now();
                }
                self.say_held(held);
                if self.parts.crash_at_start.as_deref() == Some(step.name.as_str()) {
                    crash();
                }
                row
            }
            None => self.parts.journal.attempt_starting(&step.name, attempt, redelivered, &stem).await?,
        };
        self.steps[index].left_under_way = false;
        // A retry recorded ahead of the end of its backoff: its child starts when the backoff
        // ends, unless a signal comes first.
        if issued > Instant::now() {
            tokio::select! {
                () = crate::os::timer::sleep_until(issued) => {}
                sig = self.parts.signals.next() => self.on_signal(sig),
            }
        }
        // A signal that came while the start was being recorded: the child is not spawned after it.
        // The attempt is recorded as cancelled and runs again, under its number, on resume.
        if self.take_pending_signals() {
            let signal = self.cancelled.map(|s| s.name().to_owned());
            let result = self.result(AttemptOutcome::Cancelled, None, signal);
            self.parts.journal.attempt_finished(row, &result, &StepUpdate::Pending).await?;
            self.set_slot(index, Slot::Ready { attempt, redelivered: true });
            return Ok(());
        }
        if !self.steps[index].said_started {
            self.steps[index].said_started = true;
            self.emitter.emit(Event::StepStarted { step: step.name.clone() });
        }
        let (control, control_rx) = watch::channel(Control::Run);
        let spec = Attempt {
            step_index: index,
            step: step.clone(),
            attempt,
            max_attempts,
            redelivered,
            row,
            stem: stem.clone(),
            deadline: step.timeout.map(|t| issued + t),
            outputs: self.outputs.env(),
            aux: None,
        };
        // Its timeout passed while it waited for a slot (or while its start was recorded): it times
        // out without a child, rather than spawn one that may do its work before the kill comes.
        if let Some(timeout) = step.timeout.filter(|_| spec.deadline.is_some_and(|d| d <= Instant::now())) {
            self.emitter.emit(Event::AttemptStarted {
                step: step.name.clone(),
                attempt,
                max_attempts,
                pid: None,
                redelivered,
                timeout: step.timeout,
            });
            // It wrote nothing: none of its log is its evidence.
            let ended = Ended {
                attempt,
                row,
                stem,
                stderr_from: u64::MAX,
                issued,
                ended: Instant::now(),
                killed_after_grace: false,
                left: Default::default(),
            };
            return self.failed(index, ended, Ending::TimedOutBeforeStart(timeout), None).await;
        }
        let launched = self.spawn_recorded(spec, control_rx).await?;
        let pid = match &launched {
            Launched::Running { pid, .. } => Some(*pid),
            Launched::NotStarted { .. } => None,
        };
        self.emitter.emit(Event::AttemptStarted {
            step: step.name.clone(),
            attempt,
            max_attempts,
            pid,
            redelivered,
            timeout: step.timeout,
        });
        match launched {
            Launched::Running { pid, stderr_from, .. } => {
                self.set_slot(
                    index,
                    Slot::Running(Box::new(Live { attempt, row, pid, stem, stderr_from, issued, control })),
                );
                self.running += 1;
                Ok(())
            }
            Launched::NotStarted { why, stderr_from } => {
                let ended = Ended {
                    attempt,
                    row,
                    stem,
                    stderr_from,
                    issued,
                    ended: Instant::now(),
                    killed_after_grace: false,
                    left: Default::default(),
                };
                self.failed(index, ended, Ending::NotStarted(why), None).await
            }
        }
    }

    async fn handle(&mut self, msg: Msg) -> Result<(), ExecError> {
        match msg {
            Msg::Output { step, row, stream, chunk } => {
                if self.is_current(step, row) {
                    let name = self.steps[step].step.name.clone();
                    self.emitter.emit(Event::Output { step: name, stream, chunk });
                }
                Ok(())
            }
            Msg::LogFailed { row, path, error } => {
                if !(0..self.steps.len()).any(|i| self.is_current(i, row)) {
                    return Ok(()); // from an attempt that is already over
                }
                Err(ExecError::Files { path, source: error })
            }
            Msg::Done { step: index, row, end, exited, killed_after_grace, notes, left } => {
                if !self.is_current(index, row) {
                    return Ok(()); // the end of an attempt that is over already: nothing to do
                }
                self.signal_first(&end);
                for message in notes {
                    self.emitter.warning(Some(&self.steps[index].step.name), message);
                }
                if let Slot::Handling(_) = self.steps[index].slot {
                    return self.handler_ended(index, end, exited).await;
                }
                let ended = self.take_running(index, exited, killed_after_grace, left);
                match end {
                    End::Exited(ExitKind::Code(0)) => self.succeeded(index, ended).await,
                    End::Exited(ExitKind::Code(code)) => {
                        self.failed(index, ended, Ending::Exited(code), Some(code)).await
                    }
                    End::Exited(ExitKind::Signal(sig)) => self.failed(index, ended, Ending::Signaled(sig), None).await,
                    End::TimedOut => {
                        let t = self.steps[index].step.timeout.unwrap_or_default();
                        self.failed(index, ended, Ending::TimedOut(t), None).await
                    }
                    End::Expired => {
                        let limit = self.flow.timeout.unwrap_or_default();
                        self.failed(index, ended, Ending::WorkflowTimeout(limit), None).await
                    }
                    End::Cancelled => self.cancelled(index, ended).await,
                }
            }
        }
    }

    /// A child its supervisor found cancelled by one of the runner's signals that the runner has
    /// not passed on yet (it reached the child first: Ctrl-C, `systemctl stop`): the signal is taken
    /// before the child's end, so that it is the signal's cancel (recorded with its name, and
    /// nothing starts after it).
    fn signal_first(&mut self, end: &End) {
        if matches!(end, End::Cancelled) {
            self.take_pending_signals();
        }
    }

    /// Whether `row` is the attempt now running for step `index`.
    fn is_current(&self, index: usize, row: i64) -> bool {
        self.steps.get(index).and_then(|s| s.slot.live()).is_some_and(|live| live.row == row)
    }

    /// Take the running attempt of a step that just ended (at `ended`, as [`Msg::Done`] says).
    fn take_running(&mut self, index: usize, ended: Instant, killed_after_grace: bool, left: super::Left) -> Ended {
        match self.set_slot(index, Slot::Failed) {
            Slot::Running(live) => {
                let Live { attempt, row, stem, stderr_from, issued, .. } = *live;
                self.child_ended();
                Ended { attempt, row, stem, stderr_from, issued, ended, killed_after_grace, left }
            }
            _ => unreachable!("an attempt ends only once, and only while its step runs"),
        }
    }

    /// A running attempt or catch handler ended: one fewer runs, and the journal hears whether any
    /// child still is.
    fn child_ended(&mut self) {
        self.running -= 1;
        self.parts.journal.children_alive(self.running > 0);
    }

    fn result(&self, outcome: AttemptOutcome, exit_code: Option<i32>, signal: Option<String>) -> AttemptResult {
        let ended_at = self.parts.clock.now();
        let killed_after_grace = false;
        AttemptResult {
            outcome,
            exit_code,
            signal,
            error: None,
            ended_at,
            killed_after_grace,
            outputs: Default::default(),
        }
    }

    /// [`Self::result`] of an attempt that ended at `ended`: its end is recorded as that moment,
    /// not as when the dispatcher came to it (after a write of its pid that the database was slow
    /// to answer, say).
    fn result_at(
        &self,
        ended: Instant,
        outcome: AttemptOutcome,
        exit_code: Option<i32>,
        signal: Option<String>,
    ) -> AttemptResult {
        let mut result = self.result(outcome, exit_code, signal);
        result.ended_at = result.ended_at.checked_sub(ended.elapsed()).unwrap_or(result.ended_at);
        result
    }

    /// The error of a compensation or hook that ended so: named as an attempt's would be, with no
    /// error file, traceback or `exit_codes` consulted (they are a step's, not its handlers').
    fn aux_error(&self, ending: &Ending) -> ErrorValue {
        let none = crate::flow::ExitCodes::default();
        let evidence = crate::classify::Evidence {
            classes: &self.flow.classes,
            step_codes: &none,
            flow_codes: &none,
            detect_tracebacks: false,
            error_file: crate::classify::error_file::ErrorFileOutcome::Empty,
            stderr_tail: "",
            named: &|_| false,
        };
        let mut error = crate::classify::classify(ending, evidence).0;
        self.secrets.redact_error(&mut error);
        error
    }

    async fn succeeded(&mut self, index: usize, ended: Ended) -> Result<(), ExecError> {
        let name = self.steps[index].step.name.clone();
        let (found, warnings) = outputs::read(&outputs::path(&ended.stem), &self.declared);
        for message in warnings {
            self.emitter.warning(Some(&name), message);
        }
        let result =
            AttemptResult { outputs: found, ..self.result_at(ended.ended, AttemptOutcome::Succeeded, Some(0), None) };
        // The steps it lets start are started in this turn of the loop: the success is committed
        // with the first one's start (see `Held`), unless the crash hook is to stop the runner
        // right after it.
        let hold = self.parts.crash_after.as_deref() != Some(name.as_str());
        // An outcome is held only until the next write, and this is one: never overwrite it.
        self.commit_held().await?;
        if !hold {
            self.parts.journal.attempt_finished(ended.row, &result, &StepUpdate::Succeeded).await?;
            self.crash_point(index);
        }
        self.outputs.insert(index, &name, result.outputs.clone());
        self.completed.push(index);
        self.set_slot(index, Slot::Succeeded);
        let s = &mut self.steps[index];
        (s.last_attempt, s.last_stderr_from) = (ended.attempt, ended.stderr_from);
        let (step, max_attempts, used) = (s.step.name.clone(), s.max_attempts(), s.within_budget(ended.attempt));
        let attempt_finished = Event::AttemptFinished {
            step: step.clone(),
            attempt: ended.attempt,
            max_attempts,
            outcome: AttemptEnd::Succeeded,
            error: None,
            duration: ended.ended.saturating_duration_since(ended.issued),
            retry: None,
            stopped: None,
            exit_code: Some(0),
            signal: None,
            killed_after_grace: false,
        };
        let said =
            vec![attempt_finished, Event::StepFinished { step, outcome: StepOutcome::Succeeded, attempts: used }];
        if hold {
            self.held = Some(Held { at: Instant::now(), row: ended.row, result, update: StepUpdate::Succeeded, said });
        } else {
            said.into_iter().for_each(|event| self.emitter.emit(event));
        }
        Ok(())
    }

    /// An attempt stopped by the runner's signal or by `fail_fast`: it does not count, and runs
    /// again on resume.
    async fn cancelled(&mut self, index: usize, ended: Ended) -> Result<(), ExecError> {
        let signal = self.cancelled.filter(|_| !self.fail_fast_first).map(|s| s.name().to_owned());
        let killed_after_grace = ended.killed_after_grace;
        let result = AttemptResult {
            killed_after_grace,
            ..self.result_at(ended.ended, AttemptOutcome::Cancelled, None, signal)
        };
        self.parts.journal.attempt_finished(ended.row, &result, &StepUpdate::Pending).await?;
        let signal = result.signal;
        self.set_slot(index, Slot::Ready { attempt: ended.attempt, redelivered: true });
        let s = &mut self.steps[index];
        (s.last_attempt, s.last_stderr_from) = (ended.attempt, ended.stderr_from);
        let (step, max_attempts) = (s.step.name.clone(), s.max_attempts());
        self.emitter.emit(Event::AttemptFinished {
            step,
            attempt: ended.attempt,
            max_attempts,
            outcome: AttemptEnd::Cancelled,
            error: None,
            duration: ended.ended.saturating_duration_since(ended.issued),
            retry: None,
            stopped: None,
            exit_code: None,
            signal,
            killed_after_grace: ended.killed_after_grace,
        });
        Ok(())
    }

    /// A failed attempt: read its evidence, decide by the retry policy, commit, then say it.
    async fn failed(
        &mut self,
        index: usize,
        ended: Ended,
        ending: Ending,
        exit_code: Option<i32>,
    ) -> Result<(), ExecError> {
        let step = self.steps[index].step.clone();
        let (error, warnings) =
            evidence::read(&self.flow, &step, ended.attempt, &ending, &ended.stem, ended.stderr_from, ended.left);
        let said = std::mem::replace(&mut self.steps[index].warned, warnings.clone());
        for message in warnings.into_iter().filter(|w| !said.contains(w)) {
            self.emitter.warning(Some(&step.name), message);
        }
        let k = self.steps[index].within_budget(ended.attempt);
        // The workflow's deadline is final: no policy retries it.
        let decision = match ending {
            Ending::WorkflowTimeout(_) => Decision::NotRetryable,
            _ => step.retry.decide(&error, k),
        };
        let (update, retry, stopped) = match decision {
            Decision::Retry { .. } => {
                let delay = step.retry.backoff.delay(k, &mut self.parts.rng);
                let wake_at = self.parts.clock.now() + delay;
                let update = StepUpdate::Waiting { next_attempt: ended.attempt + 1, wake_at };
                (update, Some(RetryPlan { delay, wake_at }), None)
            }
            Decision::NotRetryable => (StepUpdate::Failed, None, Some(StopReason::NotRetryable)),
            Decision::Exhausted => (StepUpdate::Failed, None, Some(StopReason::Exhausted)),
        };
        // A final error that a catch handler matches is caught (a handler without a command
        // swallows it), or its handler is to run; the deadline's error is never caught.
        let handler = match (&update, &ending) {
            (_, Ending::WorkflowTimeout(_)) | (StepUpdate::Waiting { .. }, _) => None,
            _ => step.catch.iter().position(|h| error.matches_any(&h.exception_types)),
        };
        let handler_index = handler.and_then(|i| u16::try_from(i).ok());
        let handler = handler.map(|i| &step.catch[i]);
        let update = match handler {
            Some(h) if h.command.is_none() => StepUpdate::Caught,
            Some(_) => StepUpdate::Catching,
            None => update,
        };
        let signal = match &ending {
            Ending::Signaled(s) => Some(s.name().to_owned()),
            _ => None,
        };
        // Matched as the step reported it; recorded and shown with the run's secrets hidden.
        let mut error = error;
        self.secrets.redact_error(&mut error);
        let result = AttemptResult {
            error: Some(error.clone()),
            killed_after_grace: ended.killed_after_grace,
            ..self.result_at(ended.ended, AttemptOutcome::Failed, exit_code, signal)
        };
        // A retry due at once is started in this turn of the loop: the outcome is committed with
        // its start (see `Held`), unless the crash hook is to stop the runner right after it.
        let hold = retry.is_some_and(|plan| plan.delay.is_zero())
            && self.parts.crash_after.as_deref() != Some(step.name.as_str());
        // An outcome is held only until the next write, and this is one: never overwrite it.
        self.commit_held().await?;
        if !hold {
            self.parts.journal.attempt_finished(ended.row, &result, &update).await?;
            self.crash_point(index);
        }
        let slot = match (retry, &update) {
            (Some(plan), _) => Slot::Waiting { attempt: ended.attempt + 1, wake: Instant::now() + plan.delay },
            (None, StepUpdate::Caught) => Slot::Caught,
            (None, StepUpdate::Catching) => Slot::Catching { attempt: ended.attempt, handler: handler_index },
            (None, _) => Slot::Failed,
        };
        self.set_slot(index, slot);
        let s = &mut self.steps[index];
        (s.last_attempt, s.last_stderr_from) = (ended.attempt, ended.stderr_from);
        s.last_error = Some(Box::new(error.clone()));
        s.stopped_by = stopped;
        let max_attempts = s.max_attempts();
        // The error is moved into `AttemptFinished`; `RetryStopped`, when there is one, gets a clone.
        let error_stopped = stopped.map(|_| error.clone());
        let mut said = vec![Event::AttemptFinished {
            step: step.name.clone(),
            attempt: ended.attempt,
            max_attempts,
            outcome: AttemptEnd::Failed,
            error: Some(error),
            duration: ended.ended.saturating_duration_since(ended.issued),
            retry,
            stopped,
            exit_code: result.exit_code,
            signal: result.signal.clone(),
            killed_after_grace: ended.killed_after_grace,
        }];
        // Why retrying stopped, whether or not a catch handler then takes the error.
        if let (Some(reason), Some(error)) = (stopped, error_stopped) {
            let stop = retry_stop(&step, reason, k);
            said.push(Event::RetryStopped { step: step.name.clone(), attempt: ended.attempt, error, stop });
        }
        match (retry, &update) {
            (Some(retry), _) => {
                let next_attempt = ended.attempt + 1;
                said.push(Event::StepWaiting { step: step.name.clone(), next_attempt, max_attempts, retry });
            }
            (None, StepUpdate::Caught) => {
                said.push(Event::StepFinished { step: step.name.clone(), outcome: StepOutcome::Caught, attempts: k });
            }
            (None, StepUpdate::Catching) => {}
            (None, _) => {
                said.push(Event::StepFinished { step: step.name.clone(), outcome: StepOutcome::Failed, attempts: k });
            }
        }
        if hold {
            self.held = Some(Held { at: Instant::now(), row: ended.row, result, update, said });
            return Ok(());
        }
        for event in said {
            self.emitter.emit(event);
        }
        if retry.is_none() && !matches!(update, StepUpdate::Caught | StepUpdate::Catching) {
            self.failed_for_good(index);
        }
        Ok(())
    }

    /// Commit the held outcome (see [`Held`]) on its own, then say it.
    async fn commit_held(&mut self) -> Result<(), ExecError> {
        let Some(held) = self.held.take() else { return Ok(()) };
        self.parts.journal.attempt_finished(held.row, &held.result, &held.update).await?;
        self.say_held(held);
        Ok(())
    }

    /// What was said while an outcome was held (about it, then what followed), now that it is
    /// committed.
    fn say_held(&mut self, held: Held) {
        for event in held.said {
            self.emitter.emit(event);
        }
    }

    /// Start the catch handler of step `index`, for the error of its last attempt; its clock is
    /// the step's `timeout`. Like an attempt's, its start is durable before the child exists.
    async fn start_handler(&mut self, index: usize) -> Result<(), ExecError> {
        let Slot::Catching { attempt, handler } = self.steps[index].slot else { return Ok(()) };
        let step = self.steps[index].step.clone();
        let error =
            self.steps[index].last_error.as_deref().cloned().unwrap_or_else(|| evidence::workflow_timeout(&self.flow));
        let handler = match handler {
            Some(i) => step.catch.get(usize::from(i)),
            None => step.catch.iter().find(|h| error.matches_any(&h.exception_types)),
        };
        let command = handler.and_then(|h| h.command.clone());
        let Some(command) = command else {
            // The recorded error no longer matches a handler with a command (an edited database):
            // the step fails with it.
            self.set_slot(index, Slot::Failed);
            self.failed_for_good(index);
            return Ok(());
        };
        let stem = self.parts.launcher.prepare_handler(&step, attempt)?;
        let row = self.parts.journal.handler_starting(&step.name, attempt, &stem).await?;
        if self.take_pending_signals() || self.expired {
            let result = self.result(AttemptOutcome::Cancelled, None, self.cancelled.map(|s| s.name().to_owned()));
            self.parts.journal.attempt_finished(row, &result, &StepUpdate::Catching).await?;
            return Ok(());
        }
        let issued = Instant::now();
        let (control, control_rx) = watch::channel(Control::Run);
        let error_class = error.class.clone();
        let spec = Attempt {
            step_index: index,
            step: step.clone(),
            attempt,
            max_attempts: self.steps[index].max_attempts(),
            redelivered: false,
            row,
            stem: stem.clone(),
            deadline: step.timeout.map(|t| issued + t),
            outputs: self.outputs.env(),
            aux: Some(Aux {
                what: format!("catch handler for attempt {attempt}"),
                command,
                env: vec![
                    (crate::flow::model::var::ERROR_TYPE.to_owned(), error.class.clone()),
                    (crate::flow::model::var::ERROR_BASES.to_owned(), error.bases.join(",")),
                    (crate::flow::model::var::ERROR_MESSAGE.to_owned(), error.message.clone()),
                ],
            }),
        };
        match self.spawn_recorded(spec, control_rx).await? {
            Launched::Running { pid, stderr_from, .. } => {
                let name = step.name.clone();
                self.emitter.emit(Event::HandlerStarted { step: name, attempt, error: error_class, pid: Some(pid) });
                let live = Live { attempt, row, pid, stem, stderr_from, issued, control };
                self.set_slot(index, Slot::Handling(Box::new(live)));
                self.running += 1;
                Ok(())
            }
            Launched::NotStarted { why, .. } => {
                let name = step.name.clone();
                self.emitter.emit(Event::HandlerStarted { step: name, attempt, error: error_class, pid: None });
                let error = Some(self.aux_error(&Ending::NotStarted(why.clone())));
                let why = Some(format!("it could not start: {why}"));
                let end = HandlerEnd {
                    outcome: AttemptOutcome::Failed,
                    exit_code: None,
                    ended: Instant::now(),
                    duration: issued.elapsed(),
                    why,
                    error,
                };
                self.handler_done(index, row, &stem, end).await
            }
        }
    }

    /// The catch handler of step `index` ended: the step is caught if it succeeded, catching
    /// again (to run on resume) if it was cancelled, and fails with its error otherwise.
    async fn handler_ended(&mut self, index: usize, end: End, exited: Instant) -> Result<(), ExecError> {
        let Slot::Handling(live) = self.set_slot(index, Slot::Failed) else {
            return Ok(()); // the caller checked: only a running handler ends
        };
        self.child_ended();
        let (outcome, exit_code) = match end {
            End::Exited(ExitKind::Code(0)) => (AttemptOutcome::Succeeded, Some(0)),
            End::Cancelled => (AttemptOutcome::Cancelled, None),
            End::Exited(ExitKind::Code(code)) => (AttemptOutcome::Failed, Some(code)),
            End::Exited(ExitKind::Signal(_)) | End::TimedOut | End::Expired => (AttemptOutcome::Failed, None),
        };
        let why = (outcome == AttemptOutcome::Failed).then(|| match end {
            End::Exited(ExitKind::Code(code)) => format!("exit status {code}"),
            End::Exited(ExitKind::Signal(sig)) => format!("killed by {}", sig.name()),
            End::TimedOut => "its step's timeout passed".to_owned(),
            _ => "the workflow's deadline passed".to_owned(),
        });
        // Recorded, as a compensation's is, for `status` to say how it failed.
        let step = &self.steps[index].step;
        let error = (outcome == AttemptOutcome::Failed).then(|| match end {
            End::Exited(ExitKind::Code(code)) => self.aux_error(&Ending::Exited(code)),
            End::Exited(ExitKind::Signal(sig)) => self.aux_error(&Ending::Signaled(sig)),
            End::Expired => evidence::workflow_timeout(&self.flow),
            _ => self.aux_error(&Ending::TimedOut(step.timeout.unwrap_or_default())),
        });
        // To its process's exit, as an attempt's (its outcome's commit is not part of it).
        let duration = exited.saturating_duration_since(live.issued);
        let end = HandlerEnd { outcome, exit_code, ended: exited, duration, why, error };
        self.handler_done(index, live.row, &live.stem, end).await
    }

    /// Commit how a catch handler ended and what it does to its step, then say it; a failed one
    /// (`why`) is a warning, after its end, that says where its output (at `stem`) is.
    async fn handler_done(&mut self, index: usize, row: i64, stem: &Path, end: HandlerEnd) -> Result<(), ExecError> {
        let HandlerEnd { outcome, exit_code, ended, duration, why, error } = end;
        let (update, slot) = match outcome {
            AttemptOutcome::Succeeded => (StepUpdate::Caught, Slot::Caught),
            AttemptOutcome::Cancelled => {
                (StepUpdate::Catching, Slot::Catching { attempt: self.steps[index].last_attempt, handler: None })
            }
            AttemptOutcome::Failed => (StepUpdate::Failed, Slot::Failed),
        };
        let result = AttemptResult { error, ..self.result_at(ended, outcome, exit_code, None) };
        self.parts.journal.attempt_finished(row, &result, &update).await?;
        self.set_slot(index, slot);
        let s = &self.steps[index];
        let (step, attempt, attempts) = (s.step.name.clone(), s.last_attempt, s.within_budget(s.last_attempt));
        let end = match outcome {
            AttemptOutcome::Succeeded => AttemptEnd::Succeeded,
            AttemptOutcome::Failed => AttemptEnd::Failed,
            AttemptOutcome::Cancelled => AttemptEnd::Cancelled,
        };
        let warning = why
            .as_deref()
            .map(|why| format!("its catch handler {}; the step fails with its error", failed_with_logs(why, stem)));
        // As an attempt's: the signal's, unless `fail_fast` cancelled it first.
        let signal = (outcome == AttemptOutcome::Cancelled)
            .then(|| self.cancelled.filter(|_| !self.fail_fast_first).map(|s| s.name().to_owned()))
            .flatten();
        self.emitter.emit(Event::HandlerFinished { step: step.clone(), attempt, outcome: end, duration, why, signal });
        if let Some(message) = warning {
            self.emitter.warning(Some(&step), message);
        }
        match outcome {
            AttemptOutcome::Succeeded => {
                self.emitter.emit(Event::StepFinished { step, outcome: StepOutcome::Caught, attempts });
            }
            AttemptOutcome::Failed => {
                self.emitter.emit(Event::StepFinished { step, outcome: StepOutcome::Failed, attempts });
                self.failed_for_good(index);
            }
            AttemptOutcome::Cancelled => {}
        }
        Ok(())
    }

    /// What runs once the steps are done: when the run failed, the compensations of the steps that
    /// succeeded, in reverse order of completion; then the hooks (`on_success` or `on_failure`,
    /// then `on_exit`). Each runs once, recorded; one that fails is a warning and the others go
    /// on. A signal stops the one running (it runs again on resume) and the run is interrupted.
    async fn wind_down(&mut self, outcome: RunOutcome) -> Result<RunOutcome, ExecError> {
        if matches!(outcome, RunOutcome::Interrupted { .. }) {
            return Ok(outcome);
        }
        let failed = outcome == RunOutcome::Failed;
        let mut todo: Vec<(AuxKind, String, StepRef, crate::flow::model::Command)> = Vec::new();
        if failed {
            for &i in self.completed.iter().rev() {
                let step = &self.steps[i].step;
                if let (Slot::Succeeded, Some(command)) = (&self.steps[i].slot, &step.compensate) {
                    todo.push((AuxKind::Compensate, step.name.clone(), step.clone(), command.clone()));
                }
            }
        }
        let hooks = &self.flow.hooks;
        let first = if failed { ("on_failure", &hooks.on_failure) } else { ("on_success", &hooks.on_success) };
        for (name, command) in [first, ("on_exit", &hooks.on_exit)] {
            if let Some(command) = command {
                todo.push((AuxKind::Hook, name.to_owned(), self.hook_step(name), command.clone()));
            }
        }
        todo.retain(|(kind, name, ..)| !self.aux_done.contains(&(*kind, name.clone())));
        if todo.is_empty() {
            return Ok(outcome);
        }
        // Told to stop before the end: what is left runs on resume.
        if let Some(sig) = self.cancelled {
            return Ok(RunOutcome::Interrupted { signal: sig.number() });
        }
        let env = self.hook_env(outcome);
        // The steps that will not run are recorded so with the first compensation or hook, not
        // left `pending` (in `status`, and after a kill) while the wind-down goes on.
        let mut skipped = if failed { self.skip_the_rest() } else { Vec::new() };
        for (kind, name, step, command) in todo {
            let env = if kind == AuxKind::Hook { env.clone() } else { Vec::new() };
            if let Some(sig) = self.run_aux(kind, &name, step, command, env, std::mem::take(&mut skipped)).await? {
                return Ok(RunOutcome::Interrupted { signal: sig.number() });
            }
        }
        Ok(outcome)
    }

    /// The variables a hook gets: how the run ended and, when it failed, where and why.
    fn hook_env(&self, outcome: RunOutcome) -> Vec<(String, String)> {
        let status = if outcome == RunOutcome::Succeeded { "succeeded" } else { "failed" };
        let failed = match outcome {
            RunOutcome::Failed => self.stopping.or_else(|| self.steps.iter().position(|s| !s.slot.done())),
            _ => None,
        };
        // As the failure report says it ([`Dispatcher::failure`]): a step that failed for good
        // failed with its own error, even when the deadline has passed since (a resume after it);
        // one the deadline stopped, with `WorkflowTimeout`.
        let error = failed.and_then(|i| match (&self.steps[i].slot, self.expired) {
            (Slot::Failed, _) | (_, false) => self.steps[i].last_error.as_deref().cloned(),
            (_, true) => Some(evidence::workflow_timeout(&self.flow)),
        });
        vec![
            (crate::flow::model::var::RUN_STATUS.to_owned(), status.to_owned()),
            (
                crate::flow::model::var::FAILED_STEP.to_owned(),
                failed.map(|i| self.steps[i].step.name.clone()).unwrap_or_default(),
            ),
            (
                crate::flow::model::var::ERROR_TYPE.to_owned(),
                error.as_ref().map(|e| e.class.clone()).unwrap_or_default(),
            ),
            (crate::flow::model::var::ERROR_MESSAGE.to_owned(), error.map(|e| e.message).unwrap_or_default()),
        ]
    }

    /// A step-like description of hook `name` for the launcher: it runs in the flow file's
    /// directory with the flow's environment, no timeout, stopped with SIGTERM then SIGKILL.
    fn hook_step(&self, name: &str) -> StepRef {
        let mut step = (*self.steps[0].step).clone();
        step.name = name.to_owned();
        step.env.clear();
        step.timeout = None;
        step.workdir = self.flow.path.parent().map_or_else(|| step.workdir.clone(), Arc::from);
        step.kill_signal = Signal(nix::sys::signal::Signal::SIGTERM);
        step.kill_grace = Duration::from_secs(10);
        StepRef::Own(Arc::new(step))
    }

    /// Run one compensation or hook to its end, showing its output; `Some(signal)` when a
    /// signal to the runner stopped it. Its start also records the steps `skipped`.
    async fn run_aux(
        &mut self,
        kind: AuxKind,
        name: &str,
        step: StepRef,
        command: crate::flow::model::Command,
        env: Vec<(String, String)>,
        skipped: Vec<usize>,
    ) -> Result<Option<Signal>, ExecError> {
        let stem = self.parts.launcher.prepare_aux(kind, name)?;
        let row = self.parts.journal.aux_starting(kind, name, &stem, &self.names(&skipped)).await?;
        self.say_skipped(skipped);
        self.take_pending_signals();
        let issued = Instant::now();
        if let Some(sig) = self.cancelled {
            let result = self.result(AttemptOutcome::Cancelled, None, Some(sig.name().to_owned()));
            self.parts.journal.aux_finished(row, &result).await?;
            return Ok(Some(sig));
        }
        let what = match kind {
            AuxKind::Compensate => format!("compensation of step `{name}`"),
            AuxKind::Hook => format!("hook {name}"),
        };
        let (control, control_rx) = watch::channel(Control::Run);
        let spec = Attempt {
            step_index: usize::MAX,
            step: step.clone(),
            attempt: 1,
            max_attempts: 1,
            redelivered: false,
            row,
            stem: stem.clone(),
            deadline: step.timeout.map(|t| issued + t),
            outputs: self.outputs.env(),
            aux: Some(Aux { what: what.clone(), command, env }),
        };
        // When it ended: its process's exit, or now if it never started.
        let mut ended = Instant::now();
        let (end, pid) = match self.spawn_recorded(spec, control_rx).await? {
            Launched::NotStarted { why, .. } => (Err(why), None),
            Launched::Running { pid, .. } => {
                self.emitter.emit(Event::AuxStarted { kind, name: name.to_owned(), pid: Some(pid) });
                let (end, exited) = self.await_aux(row, name, &control).await?;
                self.parts.journal.children_alive(self.running > 0);
                ended = exited;
                (Ok(end), Some(pid))
            }
        };
        let (outcome, exit_code, why) = match &end {
            Ok(End::Exited(ExitKind::Code(0))) => (AttemptOutcome::Succeeded, Some(0), None),
            Ok(End::Cancelled) => (AttemptOutcome::Cancelled, None, None),
            Ok(End::Exited(ExitKind::Code(code))) => {
                (AttemptOutcome::Failed, Some(*code), Some(format!("exit status {code}")))
            }
            Ok(End::Exited(ExitKind::Signal(sig))) => {
                (AttemptOutcome::Failed, None, Some(format!("killed by {}", sig.name())))
            }
            Ok(End::TimedOut | End::Expired) => {
                (AttemptOutcome::Failed, None, Some("its step's timeout passed".to_owned()))
            }
            Err(why) => (AttemptOutcome::Failed, None, Some(why.clone())),
        };
        if pid.is_none() {
            self.emitter.emit(Event::AuxStarted { kind, name: name.to_owned(), pid: None });
        }
        // Recorded, as an attempt's is, for `status` to say how it failed.
        let error = (outcome == AttemptOutcome::Failed).then(|| {
            let ending = match &end {
                Ok(End::Exited(ExitKind::Code(code))) => Ending::Exited(*code),
                Ok(End::Exited(ExitKind::Signal(sig))) => Ending::Signaled(*sig),
                Ok(_) => Ending::TimedOut(step.timeout.unwrap_or_default()),
                Err(why) => Ending::NotStarted(why.clone()),
            };
            self.aux_error(&ending)
        });
        let result = AttemptResult { error, ..self.result(outcome, exit_code, None) };
        self.parts.journal.aux_finished(row, &result).await?;
        let end = match outcome {
            AttemptOutcome::Succeeded => AttemptEnd::Succeeded,
            AttemptOutcome::Failed => AttemptEnd::Failed,
            AttemptOutcome::Cancelled => AttemptEnd::Cancelled,
        };
        // To its process's exit, as an attempt's (its outcome's commit is not part of it).
        let duration = ended.saturating_duration_since(issued);
        // A failure is a warning that says how it failed and where its output is.
        let warning = why.map(|why| {
            let why = match pid {
                Some(_) => why,
                None => format!("it could not start: {why}"),
            };
            let failed = failed_with_logs(&why, &stem);
            match kind {
                AuxKind::Compensate => format!("its compensation {failed}; the other compensations go on"),
                AuxKind::Hook => format!("hook {name} {failed}"),
            }
        });
        let signal =
            (outcome == AttemptOutcome::Cancelled).then(|| self.cancelled.map(|s| s.name().to_owned())).flatten();
        let event = Event::AuxFinished {
            kind,
            name: name.to_owned(),
            outcome: end,
            duration,
            warning: warning.clone(),
            signal,
        };
        self.emitter.emit(event);
        if let Some(message) = warning {
            let step = (kind == AuxKind::Compensate).then_some(name);
            self.emitter.warning(step, message);
        }
        if outcome == AttemptOutcome::Cancelled {
            return Ok(self.cancelled.or(Some(Signal(nix::sys::signal::Signal::SIGTERM))));
        }
        self.aux_done.insert((kind, name.to_owned()));
        Ok(None)
    }

    /// Wait for the compensation or hook recorded as `row` to end, showing its output and passing
    /// the runner's signals on to it.
    async fn await_aux(
        &mut self,
        row: i64,
        name: &str,
        control: &watch::Sender<Control>,
    ) -> Result<(End, Instant), ExecError> {
        loop {
            tokio::select! {
                Some(msg) = self.rx.recv() => match msg {
                    Msg::Output { row: r, stream, chunk, .. } if r == row => {
                        self.emitter.emit(Event::Output { step: name.to_owned(), stream, chunk });
                    }
                    Msg::Done { row: r, end, exited, notes, .. } if r == row => {
                        for message in notes {
                            self.emitter.warning(None, message);
                        }
                        // Cancelled by a signal that reached it before the runner passed it
                        // on: the signal first (see `signal_first`), whose it is.
                        if matches!(end, End::Cancelled) {
                            while let Some(sig) = self.parts.signals.try_next() {
                                self.aux_signal(sig, control);
                            }
                        }
                        return Ok((end, exited));
                    }
                    Msg::LogFailed { row: r, path, error } if r == row => {
                        return Err(ExecError::Files { path, source: error });
                    }
                    _ => {}
                },
                sig = self.parts.signals.next() => self.aux_signal(sig, control),
            }
        }
    }

    /// The runner got `sig` while a compensation or hook ran: passed on to it through `control`.
    fn aux_signal(&mut self, sig: Signal, control: &watch::Sender<Control>) {
        let forced = self.cancelled.is_some();
        self.cancelled.get_or_insert(sig);
        let _ = control.send(if forced { Control::Kill } else { Control::Cancel(sig) });
        self.emitter.emit(Event::Cancelling { signal: sig.number(), forced });
    }

    /// Step `index` failed for good: no new step starts from now on (issued steps that have not
    /// started go back to waiting for their turn, which does not come); with `fail_fast` the
    /// running attempts are cancelled the way a signal does.
    fn failed_for_good(&mut self, index: usize) {
        if self.stopping.is_some() {
            return;
        }
        self.stopping = Some(index);
        let pending: Vec<usize> = self.agenda.pending.iter().copied().collect();
        for i in pending {
            match self.steps[i].slot {
                Slot::Queued { attempt, redelivered, retry: false, .. } => {
                    self.set_slot(i, Slot::Ready { attempt, redelivered });
                }
                // With `fail_fast` a retry that has not started (no slot was free) does not run,
                // as one still waiting for its backoff does not: it waits again, and is skipped.
                Slot::Queued { attempt, retry: true, issued, .. } if self.flow.fail_fast => {
                    self.set_slot(i, Slot::Waiting { attempt, wake: issued });
                }
                _ => {}
            }
        }
        if self.flow.fail_fast {
            self.fail_fast_first = self.cancelled.is_none();
            let sig = Signal(nix::sys::signal::Signal::SIGTERM);
            for s in &self.steps {
                if let Some(live) = s.slot.live() {
                    let _ = live.control.send(Control::Cancel(sig));
                }
            }
        }
    }

    /// The workflow's deadline passed: running attempts are stopped as a timeout stops them (and
    /// fail with `WorkflowTimeout`), and nothing starts any more.
    fn on_deadline(&mut self) {
        self.expired = true;
        self.failed_before_deadline = self.stopping.is_some();
        for s in &self.steps {
            if let Some(live) = s.slot.live() {
                let _ = live.control.send(Control::Expire);
            }
        }
    }

    fn crash_point(&self, index: usize) {
        if self.parts.crash_after.as_deref() == Some(self.steps[index].step.name.as_str()) {
            crash();
        }
    }

    /// Take the signals that came while the dispatcher was not listening (awaiting a write);
    /// whether the runner is stopping.
    fn take_pending_signals(&mut self) -> bool {
        while let Some(sig) = self.parts.signals.try_next() {
            self.on_signal(sig);
        }
        self.cancelled.is_some()
    }

    /// Spawn `spec` and record its pid: a child whose pid cannot be recorded is killed, since a
    /// later resume could not find it.
    async fn spawn_recorded(
        &mut self,
        spec: Attempt,
        control: watch::Receiver<Control>,
    ) -> Result<Launched, ExecError> {
        let row = spec.row;
        // From here until it ends, a child's supervision must not wait on a write.
        self.parts.journal.children_alive(true);
        let launched = self.parts.launcher.spawn(spec, control, &self.tx)?;
        if matches!(launched, Launched::NotStarted { .. }) {
            self.parts.journal.children_alive(self.running > 0);
        }
        if let Launched::Running { pid, proc_start, .. } = &launched
            && let Err(e) = self.parts.journal.attempt_spawned(row, *pid, *proc_start).await
        {
            self.parts.launcher.kill(*pid);
            return Err(e.into());
        }
        Ok(launched)
    }

    fn on_signal(&mut self, sig: Signal) {
        let forced = self.cancelled.is_some();
        self.cancelled.get_or_insert(sig);
        // Children first, then words.
        for s in &self.steps {
            if let Some(live) = s.slot.live() {
                let _ = live.control.send(if forced { Control::Kill } else { Control::Cancel(sig) });
            }
        }
        self.say(Event::Cancelling { signal: sig.number(), forced });
    }

    /// Say `event` now, or after the held outcome once it is committed (see `Held`): the events
    /// keep the order of what happened.
    fn say(&mut self, event: Event) {
        match &mut self.held {
            Some(held) => held.said.push(event),
            None => self.emitter.emit(event),
        }
    }

    async fn finish(&mut self, outcome: RunOutcome) -> Result<RunOutcome, ExecError> {
        // The step the run failed on: the first to fail for good, else (the deadline passed while
        // nothing ran) the first that had not finished. The failure report is about it and every
        // other step that failed for good.
        let unfinished = |s: &StepSlot| !s.slot.done();
        let failed = match outcome {
            RunOutcome::Failed => self.stopping.or_else(|| self.steps.iter().position(unfinished)),
            _ => None,
        };
        let mut reported: Vec<usize> = failed.into_iter().collect();
        if failed.is_some() {
            let others = (0..self.steps.len()).filter(|i| Some(*i) != failed);
            reported.extend(others.filter(|i| matches!(self.steps[*i].slot, Slot::Failed)));
        }
        let skipped = if outcome == RunOutcome::Failed { self.skip_the_rest() } else { Vec::new() };
        let status = match outcome {
            RunOutcome::Succeeded => RunStatus::Succeeded,
            RunOutcome::Failed => RunStatus::Failed,
            RunOutcome::Interrupted { .. } => RunStatus::Interrupted,
        };
        let failed_step = failed.map(|i| self.steps[i].step.name.clone());
        self.parts.journal.run_finished(status, failed_step.as_deref(), &self.names(&skipped)).await?;
        self.say_skipped(skipped);
        let failures = reported.into_iter().filter_map(|i| self.failure(i)).collect();
        let duration = self.began.elapsed();
        self.emitter.emit(Event::RunFinished { outcome, duration, failures });
        Ok(outcome)
    }

    /// Skip the steps of a failed run that will not run, and give their indices: those whose turn never
    /// came, and those waiting for a retry (the run ends only once no retry can come: the deadline
    /// passed, fail_fast, or a signal), which must not be left `waiting` with a next retry in a
    /// finished run. They are recorded with the first write of the run's wind-down (its first
    /// compensation or hook), else with its end.
    fn skip_the_rest(&mut self) -> Vec<usize> {
        let mut skipped = Vec::new();
        for i in 0..self.steps.len() {
            let s = &self.steps[i];
            // A step an earlier runner left under way that did not run again (the deadline had
            // passed, or fail_fast) is skipped too, rather than left `running` in a finished run.
            let skip = match s.slot {
                Slot::Ready { redelivered, .. } | Slot::Queued { redelivered, .. } => !redelivered || s.left_under_way,
                // A step whose catch handler did not run (fail_fast, the deadline): it runs again,
                // with a fresh budget, when the run is resumed.
                Slot::Waiting { .. } | Slot::Catching { .. } => true,
                _ => false,
            };
            if skip {
                skipped.push(i);
                self.set_slot(i, Slot::Skipped);
            }
        }
        skipped
    }

    /// The names of steps `indices`.
    fn names(&self, indices: &[usize]) -> Vec<String> {
        indices.iter().map(|&i| self.steps[i].step.name.clone()).collect()
    }

    /// Say that `skipped` (recorded so), and those an earlier runner recorded so, will not run in
    /// this run.
    fn say_skipped(&mut self, skipped: Vec<usize>) {
        let reason = match self.expired && !self.failed_before_deadline {
            true => SkipReason::DeadlinePassed,
            false => SkipReason::RunFailed,
        };
        let mut all = std::mem::take(&mut self.unsaid_skips);
        all.extend(skipped);
        // In the file's order, those recorded before among them.
        all.sort_unstable();
        for i in all {
            self.emitter.emit(Event::StepSkipped { step: self.steps[i].step.name.clone(), reason });
        }
    }

    /// What the failure report says of step `index`, which failed for good (or, past the
    /// workflow's deadline, did not finish); `None` when it has no error to report.
    fn failure(&self, index: usize) -> Option<Failure> {
        let s = &self.steps[index];
        // A step the deadline stopped while it waited for a retry, or before it ran, failed of it.
        let error = match s.slot {
            Slot::Failed => s.last_error.as_deref().cloned(),
            _ if self.expired => Some(evidence::workflow_timeout(&self.flow)),
            _ => s.last_error.as_deref().cloned(),
        }?;
        let k = s.within_budget(s.last_attempt);
        let reason = match (s.stopped_by, &s.slot) {
            (Some(reason), Slot::Failed) => reason,
            _ => match s.step.retry.decide(&error, k) {
                Decision::Exhausted if error.class != crate::classify::classes::WORKFLOW_TIMEOUT => {
                    StopReason::Exhausted
                }
                _ => StopReason::NotRetryable,
            },
        };
        let launcher = &self.parts.launcher;
        let stem = launcher.stem(&s.step.name, s.last_attempt);
        let ran = s.last_attempt > 0;
        Some(Failure {
            step: s.step.name.clone(),
            stopped: retry_stop(&s.step, reason, k),
            error,
            last_attempt: s.last_attempt,
            stdout_tail: if ran { evidence::report_stdout_tail(&stem) } else { String::new() },
            stderr_tail: if ran { evidence::report_tail(&stem, s.last_stderr_from) } else { String::new() },
            stdout_log: stem.with_extension("stdout"),
            stderr_log: stem.with_extension("stderr"),
            log_dir: launcher.log_dir(&s.step.name),
        })
    }
}

/// How a catch handler, compensation or hook failed and where its output is, as its warning
/// says after what it is: `failed (exit status 5); its output: .../hooks/on_success.stderr`, the
/// logs at `stem` that exist (a log is created on its first byte), or `failed (...); it wrote
/// nothing`.
fn failed_with_logs(why: &str, stem: &Path) -> String {
    format!("failed ({why}); {}", crate::store::statedir::output_said(stem))
}

/// The test hooks' crash: SIGKILL the runner itself, as a crash would stop it.
fn crash() {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL);
}

/// Why `step` is not retried after its attempt `attempts` (of its current budget) failed.
fn retry_stop(step: &Step, reason: StopReason, attempts: u32) -> RetryStop {
    RetryStop {
        reason,
        exception_types: step.retry.exception_types.clone(),
        attempts,
        attempts_allowed: step.retry.attempts,
    }
}

#[cfg(test)]
mod tests;
