//! The dispatcher driven by fakes under tokio's paused clock: a launcher whose "children" end when
//! a script says, a journal that keeps its writes in memory, a signal source the test feeds, a
//! wall clock that follows tokio's, and a seeded random source. Time only moves when every task
//! waits, so every instant below is exact and the tests take no real time.

use super::*;
use crate::events::{Envelope, Reporter};
use crate::executor::launch::Killed;
use crate::store::{NextAttempt, StoreError, StoreErrorKind};
use std::cell::{Cell, RefCell};
use std::path::Path;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// What a fake attempt does.
#[derive(Debug, Clone, Copy)]
enum Script {
    /// Exit with `code` after `after`.
    Exit { after: Duration, code: i32 },
    /// Run until its timeout or a cancel.
    Hang,
    /// The program cannot be started.
    NotStarted,
    /// Run until a cancel, then take this long to end (a child in its `kill_grace`).
    Linger(Duration),
    /// End after this long as its supervisor reports a child that one of the runner's signals
    /// reached before the runner passed it on (Ctrl-C to the terminal's group): cancelled.
    Signalled(Duration),
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn exit(after: u64, code: i32) -> Script {
    Script::Exit { after: secs(after), code }
}

/// One attempt the fake launcher was asked to spawn.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Spawned {
    step: String,
    attempt: u32,
    redelivered: bool,
    /// When, since the test began.
    at: Duration,
}

type Shared<T> = Rc<RefCell<Vec<T>>>;

/// Says what attempt N of a step does.
type ScriptFn = Box<dyn FnMut(&str, u32) -> Script>;

struct FakeLauncher {
    script: ScriptFn,
    spawned: Shared<Spawned>,
    leftovers_checked: Shared<String>,
    /// The pids whose process group the dispatcher killed.
    killed: Shared<u32>,
    begin: Instant,
    next_pid: u32,
    /// The children running now: spawned and not yet ended (the dispatcher may not know yet).
    live: Arc<AtomicUsize>,
}

impl Launcher for FakeLauncher {
    fn prepare(&mut self, step: &Step, attempt: u32) -> Result<PathBuf, ExecError> {
        Ok(self.stem(&step.name, attempt))
    }

    fn stem(&self, step: &str, attempt: u32) -> PathBuf {
        // Nothing is there: the evidence reader finds no file and goes by the exit status.
        Path::new("/nonexistent/waymark-dispatch-test").join(step).join(format!("attempt-{attempt}"))
    }

    fn prepare_aux(&mut self, kind: AuxKind, name: &str) -> Result<PathBuf, ExecError> {
        Ok(Path::new("/nonexistent/waymark-dispatch-test").join(kind.as_str()).join(name))
    }

    fn prepare_handler(&mut self, step: &Step, attempt: u32) -> Result<PathBuf, ExecError> {
        Ok(Path::new("/nonexistent/waymark-dispatch-test").join(&step.name).join(format!("catch-{attempt}")))
    }

    fn spawn(
        &mut self,
        a: Attempt,
        mut control: watch::Receiver<Control>,
        events: &mpsc::Sender<Msg>,
    ) -> Result<Launched, ExecError> {
        let at = Instant::now() - self.begin;
        // A catch handler is scripted, and recorded, as the step `NAME:catch`, a compensation as
        // `NAME:compensate`, a hook as `hook:NAME`.
        let name = match &a.aux {
            Some(aux) if aux.what.starts_with("catch") => format!("{}:catch", a.step.name),
            Some(aux) if aux.what.starts_with("compensation") => format!("{}:compensate", a.step.name),
            Some(_) => format!("hook:{}", a.step.name),
            None => a.step.name.clone(),
        };
        self.spawned.borrow_mut().push(Spawned {
            step: name.clone(),
            attempt: a.attempt,
            redelivered: a.redelivered,
            at,
        });
        let script = (self.script)(&name, a.attempt);
        if let Script::NotStarted = script {
            return Ok(Launched::NotStarted { why: "program `nope` not found in PATH".into(), stderr_from: 0 });
        }
        self.next_pid += 1;
        let (tx, step, row, deadline) = (events.clone(), a.step_index, a.row, a.deadline);
        let live = Arc::clone(&self.live);
        live.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(async move {
            let exit = match script {
                Script::Exit { after, code } => Some((Instant::now() + after, Some(code))),
                Script::Signalled(after) => Some((Instant::now() + after, None)),
                _ => None,
            };
            let never = Instant::now() + secs(1_000_000_000);
            if let Script::Linger(grace) = script {
                let _ = control.changed().await;
                tokio::time::sleep(grace).await;
                live.fetch_sub(1, Ordering::SeqCst);
                let _ = tx
                    .send(Msg::Done {
                        step,
                        row,
                        end: End::Cancelled,
                        exited: Instant::now(),
                        killed_after_grace: true,
                        notes: Vec::new(),
                        left: Default::default(),
                    })
                    .await;
                return;
            }
            let end = tokio::select! {
                () = tokio::time::sleep_until(exit.map_or(never, |e| e.0)), if exit.is_some() => {
                    match exit.and_then(|e| e.1) {
                        Some(code) => End::Exited(ExitKind::Code(code)),
                        None => End::Cancelled,
                    }
                }
                () = tokio::time::sleep_until(deadline.unwrap_or(never)), if deadline.is_some() => End::TimedOut,
                                _ = control.changed() => match *control.borrow() {
                    Control::Expire => End::Expired,
                    _ => End::Cancelled,
                },
            };
            live.fetch_sub(1, Ordering::SeqCst);
            let _ = tx
                .send(Msg::Done {
                    step,
                    row,
                    end,
                    exited: Instant::now(),
                    killed_after_grace: false,
                    notes: Vec::new(),
                    left: Default::default(),
                })
                .await;
        });
        Ok(Launched::Running { pid: self.next_pid, proc_start: None, stderr_from: 0 })
    }

    fn kill(&mut self, pid: u32) {
        self.killed.borrow_mut().push(pid);
    }

    fn kill_leftovers(&mut self, left: &LeftRunning<'_>) -> Killed {
        let mut checked = self.leftovers_checked.borrow_mut();
        checked.extend(left.steps.iter().map(|step| step.name.clone()));
        for (aux, own_files) in &left.aux {
            let files = if *own_files { "" } else { " (a later run's files)" };
            checked.push(format!("{}:{}{files}", aux.name, aux.kind.as_str()));
        }
        (Vec::new(), None)
    }

    fn log_dir(&self, step: &str) -> PathBuf {
        Path::new("/nonexistent/waymark-dispatch-test").join(step)
    }
}

/// A journal that keeps every write as a line, with times relative to the fake clock's start.
struct FakeJournal {
    writes: Shared<String>,
    next_row: i64,
    /// How long each attempt's start and outcome take to commit (a database another process holds
    /// locked).
    start_takes: Duration,
    finish_takes: Duration,
    /// Whether recording a spawned child's pid fails (the store is gone mid-run), and how long it
    /// takes (a database slow to answer).
    spawned_fails: bool,
    spawned_takes: Duration,
    /// Each attempt's row and recorded end, since the start.
    ends: Shared<(i64, Duration)>,
    /// What the dispatcher last said of its children (see `RunJournal::children_alive`), and the
    /// launcher's count of those running.
    alive: bool,
    live: Arc<AtomicUsize>,
    /// Writes made while the dispatcher said no child was alive.
    idle_writes: Rc<Cell<usize>>,
}

fn since_base(t: SystemTime) -> Duration {
    t.duration_since(BASE).expect("after the base")
}

impl FakeJournal {
    /// Keep a write. If the dispatcher said no child is alive, none may be (a real journal would
    /// make the write on the runtime's thread, holding up the supervision of any).
    fn write(&self, line: String) {
        if !self.alive {
            assert_eq!(
                self.live.load(Ordering::SeqCst),
                0,
                "{line} while a child ran, yet the dispatcher said none was alive"
            );
            self.idle_writes.set(self.idle_writes.get() + 1);
        }
        self.writes.borrow_mut().push(line);
    }

    /// How an attempt's outcome is written down.
    fn finished(row: i64, result: &AttemptResult, update: &StepUpdate) -> String {
        let error = result.error.as_ref().map_or(String::new(), |e| format!(" {}", e.class));
        let update = match update {
            StepUpdate::Waiting { next_attempt, wake_at } => {
                format!("waiting for #{next_attempt} until +{:?}", since_base(*wake_at))
            }
            other => format!("{other:?}"),
        };
        format!("finished row {row} {:?}{error} -> {update}", result.outcome)
    }
}

impl RunJournal for FakeJournal {
    fn children_alive(&mut self, alive: bool) {
        self.alive = alive;
    }

    async fn attempt_starting(
        &mut self,
        step: &str,
        attempt: u32,
        redelivered: bool,
        _log_stem: &Path,
    ) -> Result<i64, StoreError> {
        tokio::time::sleep(self.start_takes).await;
        self.next_row += 1;
        let again = if redelivered { " redelivered" } else { "" };
        self.write(format!("starting {step} #{attempt}{again} row {}", self.next_row));
        Ok(self.next_row)
    }

    async fn aux_starting(
        &mut self,
        kind: AuxKind,
        name: &str,
        _log_stem: &Path,
        skipped: &[String],
    ) -> Result<i64, StoreError> {
        self.next_row += 1;
        let skipped = if skipped.is_empty() { String::new() } else { format!(" skipped {skipped:?}") };
        self.write(format!("{} {name} row {}{skipped}", kind.as_str(), self.next_row));
        Ok(self.next_row)
    }

    async fn aux_finished(&mut self, row: i64, result: &AttemptResult) -> Result<(), StoreError> {
        let class = result.error.as_ref().map(|e| format!(" {}", e.class)).unwrap_or_default();
        self.write(format!("finished row {row} {:?}{class}", result.outcome));
        Ok(())
    }

    async fn handler_starting(&mut self, step: &str, attempt: u32, _log_stem: &Path) -> Result<i64, StoreError> {
        self.next_row += 1;
        self.write(format!("handler of {step} #{attempt} row {}", self.next_row));
        Ok(self.next_row)
    }

    async fn attempt_spawned(&mut self, row: i64, _pid: u32, _proc_start: Option<u64>) -> Result<(), StoreError> {
        tokio::time::sleep(self.spawned_takes).await;
        if self.spawned_fails {
            return Err(StoreError::failed(StoreErrorKind::Full, "fake", "disk full"));
        }
        self.write(format!("spawned row {row}"));
        Ok(())
    }

    async fn attempt_finished(
        &mut self,
        row: i64,
        result: &AttemptResult,
        update: &StepUpdate,
    ) -> Result<(), StoreError> {
        tokio::time::sleep(self.finish_takes).await;
        self.ends.borrow_mut().push((row, since_base(result.ended_at)));
        self.write(Self::finished(row, result, update));
        Ok(())
    }

    async fn attempt_finished_then_starting(
        &mut self,
        row: i64,
        result: &AttemptResult,
        update: &StepUpdate,
        next: &NextAttempt<'_>,
    ) -> Result<i64, StoreError> {
        tokio::time::sleep(self.finish_takes.max(self.start_takes)).await;
        self.ends.borrow_mut().push((row, since_base(result.ended_at)));
        let finished = Self::finished(row, result, update);
        self.next_row += 1;
        let again = if next.redelivered { " redelivered" } else { "" };
        let (step, attempt, row) = (next.step, next.attempt, self.next_row);
        self.write(format!("{finished}; starting {step} #{attempt}{again} row {row}"));
        Ok(self.next_row)
    }

    async fn run_finished(
        &mut self,
        status: RunStatus,
        failed_step: Option<&str>,
        skipped: &[String],
    ) -> Result<(), StoreError> {
        let skipped = if skipped.is_empty() { String::new() } else { format!(" skipped {skipped:?}") };
        self.write(format!("run {status:?} {failed_step:?}{skipped}"));
        Ok(())
    }
}

/// The runner's signals, sent by the test; and how often the dispatcher looked for one without
/// waiting, which it does once per turn of its loop (and after a write).
struct FakeSignals(mpsc::UnboundedReceiver<Signal>, Rc<std::cell::Cell<u64>>);

impl SignalSource for FakeSignals {
    fn try_next(&mut self) -> Option<Signal> {
        self.1.set(self.1.get() + 1);
        self.0.try_recv().ok()
    }

    async fn next(&mut self) -> Signal {
        match self.0.recv().await {
            Some(sig) => sig,
            None => std::future::pending().await,
        }
    }
}

/// Wall-clock time when a test begins.
const BASE: SystemTime = SystemTime::UNIX_EPOCH;

/// A wall clock that moves with tokio's (paused) clock, from [`BASE`].
struct FakeClock(Instant);

impl Clock for FakeClock {
    fn now(&self) -> SystemTime {
        BASE + (Instant::now() - self.0)
    }
}

struct Recorder(Shared<Envelope>);

impl Reporter for Recorder {
    fn report(&mut self, event: &Envelope) {
        self.0.borrow_mut().push(event.clone());
    }
}

/// The contents of a shared record once the run is over.
fn take<T: Clone>(shared: Shared<T>) -> Vec<T> {
    shared.borrow().clone()
}

/// What a run did.
struct Ran {
    /// The run's outcome, or waymark's own failure.
    result: Result<RunOutcome, ExecError>,
    spawned: Vec<Spawned>,
    writes: Vec<String>,
    events: Vec<Envelope>,
    leftovers_checked: Vec<String>,
    killed: Vec<u32>,
    /// How long the run took, by tokio's clock.
    took: Duration,
    /// At least the number of turns of the dispatcher's loop.
    turns: u64,
    /// Writes made while the dispatcher said no child was alive (every journal write checks that
    /// none was: see `FakeJournal::write`).
    idle_writes: usize,
    /// Each attempt's row and recorded end, since the start.
    ends: Vec<(i64, Duration)>,
}

impl Ran {
    /// How long each attempt and catch handler took, by their events (a handler as `STEP:catch`).
    fn durations(&self) -> Vec<(String, Duration)> {
        let each = self.events.iter().filter_map(|e| match &e.event {
            Event::AttemptFinished { step, duration, .. } => Some((step.clone(), *duration)),
            Event::HandlerFinished { step, duration, .. } => Some((format!("{step}:catch"), *duration)),
            _ => None,
        });
        each.collect()
    }

    fn outcome(&self) -> RunOutcome {
        match &self.result {
            Ok(outcome) => *outcome,
            Err(e) => panic!("the run failed: {e}"),
        }
    }

    /// The attempts' (step, attempt, start time in seconds).
    fn schedule(&self) -> Vec<(&str, u32, f64)> {
        self.spawned.iter().map(|s| (s.step.as_str(), s.attempt, s.at.as_secs_f64())).collect()
    }

    /// The events' kinds in order, with the step where there is one.
    fn kinds(&self) -> Vec<String> {
        self.events
            .iter()
            .map(|e| {
                let json = serde_json::to_value(e).expect("events serialise");
                let kind = json["kind"].as_str().unwrap_or("?").to_owned();
                match json["step"].as_str() {
                    Some(step) => format!("{kind} {step}"),
                    None => kind,
                }
            })
            .collect()
    }

    fn attempt_finished(&self) -> Vec<(u32, AttemptEnd, Option<String>, Option<StopReason>)> {
        self.events
            .iter()
            .filter_map(|e| match &e.event {
                Event::AttemptFinished { attempt, outcome, error, stopped, .. } => {
                    Some((*attempt, *outcome, error.as_ref().map(|e| e.class.clone()), *stopped))
                }
                _ => None,
            })
            .collect()
    }
}

struct Test {
    flow: Arc<Flow>,
    records: Vec<StepRecord>,
    resumed: bool,
    seed: u64,
    /// Signals to send, at these times since the start.
    signals: Vec<(Duration, Signal)>,
    /// As the command gives them: the flow's `max_parallel`, and its `timeout` from the start.
    max_parallel: usize,
    /// The workflow's deadline, since the start.
    deadline: Option<Duration>,
    /// Compensations and hooks recorded by an earlier runner.
    aux: Vec<AuxRun>,
    interrupted: std::collections::BTreeSet<usize>,
    /// See [`FakeJournal`].
    start_takes: Duration,
    finish_takes: Duration,
    spawned_fails: bool,
    spawned_takes: Duration,
}

fn flow(toml: &str) -> Arc<Flow> {
    match crate::flow::parse(toml, Path::new("/nonexistent/flow.toml")) {
        Ok((flow, _)) => Arc::new(flow),
        Err(e) => panic!("test flow is invalid: {e:?}"),
    }
}

impl Test {
    fn new(toml: &str) -> Test {
        let flow = flow(toml);
        let records = flow.steps.iter().map(|s| StepRecord::pending(&s.name)).collect();
        let (max_parallel, deadline) = (flow.max_parallel as usize, flow.timeout);
        Test {
            flow,
            records,
            resumed: false,
            seed: 7,
            signals: Vec::new(),
            max_parallel,
            deadline,
            aux: Vec::new(),
            interrupted: Default::default(),
            start_takes: Duration::ZERO,
            finish_takes: Duration::ZERO,
            spawned_fails: false,
            spawned_takes: Duration::ZERO,
        }
    }

    async fn run(self, script: impl FnMut(&str, u32) -> Script + 'static) -> Ran {
        let begin = Instant::now();
        let (spawned, writes, events): (Shared<Spawned>, Shared<String>, Shared<Envelope>) = Default::default();
        let (leftovers, killed): (Shared<String>, Shared<u32>) = Default::default();
        let looked = Rc::new(std::cell::Cell::new(0));
        let (live, idle_writes) = (Arc::new(AtomicUsize::new(0)), Rc::new(Cell::new(0)));
        let ends: Shared<(i64, Duration)> = Default::default();
        let (sig_tx, sig_rx) = mpsc::unbounded_channel();
        for (after, sig) in self.signals {
            let tx = sig_tx.clone();
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                let _ = tx.send(sig);
            });
        }
        let parts = Parts {
            launcher: FakeLauncher {
                script: Box::new(script),
                spawned: Rc::clone(&spawned),
                leftovers_checked: Rc::clone(&leftovers),
                killed: Rc::clone(&killed),
                begin,
                next_pid: 1000,
                live: Arc::clone(&live),
            },
            journal: FakeJournal {
                writes: Rc::clone(&writes),
                next_row: 0,
                start_takes: self.start_takes,
                finish_takes: self.finish_takes,
                spawned_fails: self.spawned_fails,
                spawned_takes: self.spawned_takes,
                ends: Rc::clone(&ends),
                alive: true,
                live,
                idle_writes: Rc::clone(&idle_writes),
            },
            signals: FakeSignals(sig_rx, Rc::clone(&looked)),
            clock: FakeClock(begin),
            rng: fastrand::Rng::with_seed(self.seed),
            crash_after: None,
            crash_at_start: None,
        };
        let mut emitter = Emitter::with_clock(vec![Box::new(Recorder(Rc::clone(&events)))], || BASE);
        emitter.set_run("r1");
        let spec = RunSpec {
            flow: self.flow,
            run_id: "r1".into(),
            steps: self.records,
            resumed: self.resumed,
            max_parallel: self.max_parallel,
            deadline: self.deadline.map(|d| BASE + d),
            aux: self.aux,
            interrupted: self.interrupted,
            env: Default::default(),
            elsewhere: None,
        };
        let result = Dispatcher::new(spec, parts, &mut emitter).expect("set up").run().await;
        let took = Instant::now() - begin;
        drop(emitter);
        Ran {
            result,
            spawned: take(spawned),
            writes: take(writes),
            events: take(events),
            leftovers_checked: take(leftovers),
            killed: take(killed),
            took,
            turns: looked.get(),
            idle_writes: idle_writes.get(),
            ends: take(ends),
        }
    }
}

const FLAKY: &str = r#"
[errors]
BadInput = []
[exit_codes]
"3" = "ConnectionError"
"4" = "BadInput"
[[step]]
name = "a"
run = ["fetch"]
retry = { attempts = 3, exception_types = ["ConnectionError"], backoff_seconds = 1, backoff_multiplier = 2 }
[[step]]
name = "b"
run = ["load"]
"#;

#[tokio::test(start_paused = true)]
async fn retries_until_the_budget_is_spent() {
    let ran = Test::new(FLAKY).run(|_, _| exit(5, 3)).await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    // Each attempt runs 5 s; the waits before retries 1 and 2 are 1 s and 2 s.
    assert_eq!(ran.schedule(), [("a", 1, 0.0), ("a", 2, 6.0), ("a", 3, 13.0)]);
    assert_eq!(ran.took, secs(18));
    let ce = Some("ConnectionError".to_owned());
    assert_eq!(
        ran.attempt_finished(),
        [
            (1, AttemptEnd::Failed, ce.clone(), None),
            (2, AttemptEnd::Failed, ce.clone(), None),
            (3, AttemptEnd::Failed, ce, Some(StopReason::Exhausted)),
        ]
    );
    assert_eq!(
        ran.writes,
        [
            "starting a #1 row 1",
            "spawned row 1",
            "finished row 1 Failed ConnectionError -> waiting for #2 until +6s",
            "starting a #2 row 2",
            "spawned row 2",
            "finished row 2 Failed ConnectionError -> waiting for #3 until +13s",
            "starting a #3 row 3",
            "spawned row 3",
            "finished row 3 Failed ConnectionError -> Failed",
            "run Failed Some(\"a\") skipped [\"b\"]",
        ]
    );
    assert_eq!(
        ran.kinds(),
        [
            "run_started",
            "step_ready a",
            "step_started a",
            "attempt_started a",
            "attempt_finished a",
            "step_waiting a",
            "attempt_started a",
            "attempt_finished a",
            "step_waiting a",
            "attempt_started a",
            "attempt_finished a",
            "retry_stopped a",
            "step_finished a",
            "step_skipped b",
            "run_finished",
        ]
    );
    // Every event is stamped: 1, 2, 3, … and the run's id.
    assert!(ran.events.iter().enumerate().all(|(i, e)| e.seq == i as u64 + 1 && e.run_id.as_deref() == Some("r1")));
}

#[tokio::test(start_paused = true)]
async fn backoff_wakes_at_the_recorded_time_and_jitter_follows_the_seed() {
    let jittery = FLAKY.replace("backoff_multiplier = 2", "backoff_multiplier = 2, jitter = true");
    let run = |seed| {
        let jittery = jittery.clone();
        async move {
            let mut test = Test::new(&jittery);
            test.seed = seed;
            test.run(|_, _| exit(5, 3)).await
        }
    };
    let ran = run(1).await;
    let waits: Vec<RetryPlan> = ran
        .events
        .iter()
        .filter_map(|e| match &e.event {
            Event::StepWaiting { retry, .. } => Some(*retry),
            _ => None,
        })
        .collect();
    assert_eq!(waits.len(), 2);
    // The next attempt starts when the recorded wake-up time comes, after the wait the event
    // announced (an attempt runs 5 s), to tokio's timer resolution of a millisecond.
    let starts: Vec<Duration> = ran.spawned.iter().map(|s| s.at).collect();
    let on_time = |actual: Duration, due: Duration| actual >= due && actual - due < Duration::from_millis(1);
    assert!(on_time(starts[1], secs(5) + waits[0].delay), "{starts:?} {waits:?}");
    assert!(on_time(starts[2], starts[1] + secs(5) + waits[1].delay), "{starts:?} {waits:?}");
    assert!(on_time(starts[1], since_base(waits[0].wake_at)), "{starts:?} {waits:?}");
    assert!(on_time(starts[2], since_base(waits[1].wake_at)), "{starts:?} {waits:?}");
    // Jitter multiplies each wait by a factor in [0.5, 1.0].
    let within = |wait: Duration, nominal: Duration| wait >= nominal / 2 && wait <= nominal;
    assert!(within(waits[0].delay, secs(1)) && within(waits[1].delay, secs(2)), "{waits:?}");
    // The same seed gives the same schedule; another seed another one.
    assert_eq!(run(1).await.schedule(), ran.schedule());
    let seeds: Vec<_> = [2, 3, 4, 5].into_iter().collect();
    let mut differs = false;
    for seed in seeds {
        differs |= run(seed).await.schedule() != ran.schedule();
    }
    assert!(differs, "jitter ignores the seed");
}

#[tokio::test(start_paused = true)]
async fn an_error_the_filter_does_not_match_stops_at_once() {
    let ran = Test::new(FLAKY).run(|_, _| exit(2, 4)).await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    assert_eq!(ran.schedule(), [("a", 1, 0.0)]);
    assert_eq!(ran.took, secs(2));
    assert_eq!(
        ran.attempt_finished(),
        [(1, AttemptEnd::Failed, Some("BadInput".to_owned()), Some(StopReason::NotRetryable))]
    );
    assert_eq!(ran.writes.last().map(String::as_str), Some("run Failed Some(\"a\") skipped [\"b\"]"));
}

#[tokio::test(start_paused = true)]
async fn steps_run_in_file_order_each_after_the_previous_succeeded() {
    let ran = Test::new(FLAKY).run(|step, _| if step == "a" { exit(3, 0) } else { exit(4, 0) }).await;
    assert_eq!(ran.outcome(), RunOutcome::Succeeded);
    assert_eq!(ran.schedule(), [("a", 1, 0.0), ("b", 1, 3.0)]);
    assert_eq!(ran.took, secs(7));
    assert_eq!(ran.writes.last().map(String::as_str), Some("run Succeeded None"));
}

#[tokio::test(start_paused = true)]
async fn a_timeout_counts_from_the_issue_and_is_not_retried_by_an_ordinary_policy() {
    let flow = r#"
[[step]]
name = "a"
run = ["slow"]
timeout = 3
retry = { attempts = 4, exception_types = ["Exception"] }
"#;
    let mut test = Test::new(flow);
    // Recording the attempt's start takes 1 s: the child starts then, and still has 2 s left.
    test.start_takes = secs(1);
    let ran = test.run(|_, _| Script::Hang).await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    assert_eq!(ran.schedule(), [("a", 1, 1.0)]);
    assert_eq!(ran.took, secs(3));
    assert_eq!(
        ran.attempt_finished(),
        [(1, AttemptEnd::Failed, Some("ActionTimeout".to_owned()), Some(StopReason::NotRetryable))]
    );
}

/// An attempt lasts from its issue to its process's end: committing its outcome (synced to the
/// disk for a final one, which takes 2 s here) is not part of it.
#[tokio::test(start_paused = true)]
async fn an_attempt_s_duration_ends_with_its_process_not_with_its_outcome_s_commit() {
    let flow = "[[step]]\nname = 'a'\nrun = ['slow']\ntimeout = 3\n[[step]]\nname = 'b'\nrun = ['quick']\n";
    let mut test = Test::new(flow);
    test.finish_takes = secs(2);
    let ran = test.run(|step, _| if step == "a" { Script::Hang } else { exit(1, 0) }).await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    assert_eq!(ran.durations(), [("a".to_owned(), secs(3))]);
    assert_eq!(ran.took, secs(5), "the run waited for the commit");
}

#[tokio::test(start_paused = true)]
async fn a_program_that_cannot_start_is_an_attempt_failure_that_retries() {
    let flow = r#"
[[step]]
name = "a"
run = ["nope"]
retry = { attempts = 2, exception_types = ["Exception"], backoff_seconds = 10 }
"#;
    let ran = Test::new(flow).run(|_, attempt| if attempt == 1 { Script::NotStarted } else { exit(1, 0) }).await;
    assert_eq!(ran.outcome(), RunOutcome::Succeeded);
    assert_eq!(ran.schedule(), [("a", 1, 0.0), ("a", 2, 10.0)]);
    let pids: Vec<Option<u32>> = ran
        .events
        .iter()
        .filter_map(|e| match &e.event {
            Event::AttemptStarted { pid, .. } => Some(*pid),
            _ => None,
        })
        .collect();
    assert_eq!(pids, [None, Some(1001)]);
    assert_eq!(ran.attempt_finished()[0].2.as_deref(), Some("ActionExecutionNotStarted"));
    // No pid is recorded for an attempt that never started.
    assert_eq!(
        ran.writes[..2],
        ["starting a #1 row 1", "finished row 1 Failed ActionExecutionNotStarted -> waiting for #2 until +10s"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_signal_during_an_attempt_cancels_it_and_the_run_is_interrupted() {
    let mut test = Test::new(FLAKY);
    test.signals = vec![(secs(2), Signal(nix::sys::signal::Signal::SIGTERM))];
    let ran = test.run(|_, _| Script::Hang).await;
    assert_eq!(ran.outcome(), RunOutcome::Interrupted { signal: 15 });
    assert_eq!(ran.took, secs(2));
    assert_eq!(ran.schedule(), [("a", 1, 0.0)]);
    assert_eq!(ran.attempt_finished(), [(1, AttemptEnd::Cancelled, None, None)]);
    // The cancelled attempt does not count: the step is pending again with the same number.
    assert_eq!(ran.writes[2..], ["finished row 1 Cancelled -> Pending", "run Interrupted None"]);
    assert!(ran.kinds().contains(&"cancelling".to_owned()));
}

#[tokio::test(start_paused = true)]
async fn a_signal_during_a_backoff_ends_the_run_without_waiting_it_out() {
    let slow = FLAKY.replace("backoff_seconds = 1", "backoff_seconds = 600");
    let mut test = Test::new(&slow);
    test.signals = vec![(secs(10), Signal(nix::sys::signal::Signal::SIGINT))];
    let ran = test.run(|_, _| exit(1, 3)).await;
    assert_eq!(ran.outcome(), RunOutcome::Interrupted { signal: 2 });
    assert_eq!(ran.took, secs(10));
    assert_eq!(ran.schedule(), [("a", 1, 0.0)]);
    // The wait stays recorded: a resumed run serves the rest of it.
    assert_eq!(
        ran.writes[2..],
        ["finished row 1 Failed ConnectionError -> waiting for #2 until +601s", "run Interrupted None"]
    );
}

#[tokio::test(start_paused = true)]
async fn resume_redelivers_an_in_flight_attempt_under_the_same_number() {
    let mut test = Test::new(FLAKY);
    test.resumed = true;
    test.records[0].attempts_used = 2;
    test.records[0].state = StepState::InFlight { attempt: 2, row: 41, pid: Some(4242), proc_start: None };
    let ran = test.run(|_, _| exit(1, 0)).await;
    assert_eq!(ran.outcome(), RunOutcome::Succeeded);
    assert_eq!(ran.leftovers_checked, ["a"], "the dead runner's attempt is made sure dead first");
    assert_eq!(
        ran.spawned.iter().map(|s| (s.step.as_str(), s.attempt, s.redelivered)).collect::<Vec<_>>(),
        [("a", 2, true), ("b", 1, false)]
    );
    assert_eq!(ran.writes[0], "starting a #2 redelivered row 1");
    assert_eq!(ran.kinds()[0], "run_resumed");
}

#[tokio::test(start_paused = true)]
async fn resume_serves_the_rest_of_a_recorded_backoff_and_skips_finished_steps() {
    let mut test = Test::new(FLAKY);
    test.resumed = true;
    test.records[0].state = StepState::Succeeded;
    test.records[1].attempts_used = 1;
    // Recorded as waking 30 s after the test begins (the fake wall clock starts at BASE).
    test.records[1].state = StepState::Waiting { next_attempt: 2, wake_at: BASE + secs(30) };
    let ran = test.run(|_, _| exit(1, 0)).await;
    assert_eq!(ran.outcome(), RunOutcome::Succeeded);
    assert_eq!(ran.schedule(), [("b", 2, 30.0)]);
    assert_eq!(ran.kinds()[..3], ["run_resumed", "step_skipped a", "step_waiting b"]);
}

/// Three roots and a step that needs them all; `a` and `c` end as the script says.
const FAN: &str = r#"
[[step]]
name = "a"
run = ["a"]
needs = []
[[step]]
name = "b"
run = ["b"]
needs = []
[[step]]
name = "c"
run = ["c"]
needs = []
[[step]]
name = "d"
run = ["d"]
needs = ["a", "b", "c"]
"#;

fn durations(step: &str) -> u64 {
    match step {
        "a" => 3,
        "b" => 5,
        "c" => 2,
        _ => 1,
    }
}

#[tokio::test(start_paused = true)]
async fn ready_steps_start_in_file_order_at_most_max_parallel_at_once() {
    let mut test = Test::new(FAN);
    test.max_parallel = 2;
    let ran = test.run(|step, _| exit(durations(step), 0)).await;
    assert_eq!(ran.outcome(), RunOutcome::Succeeded);
    // a and b fill both slots; c takes a's when it ends at 3; d needs all three: b and c end at 5.
    assert_eq!(ran.schedule(), [("a", 1, 0.0), ("b", 1, 0.0), ("c", 1, 3.0), ("d", 1, 5.0)]);
    assert_eq!(ran.took, secs(6));
    // Without a limit the three roots overlap.
    let mut test = Test::new(FAN);
    test.max_parallel = 4;
    let ran = test.run(|step, _| exit(durations(step), 0)).await;
    assert_eq!(ran.schedule(), [("a", 1, 0.0), ("b", 1, 0.0), ("c", 1, 0.0), ("d", 1, 5.0)]);
}

/// A local store's journal makes a write on the runtime's thread while the dispatcher says no
/// child is alive: it must say so only then (every write of every test checks it), and say so
/// between the attempts of a run that has one at a time (else nothing is made there).
#[tokio::test(start_paused = true)]
async fn the_journal_hears_that_no_child_is_alive_only_between_children() {
    // One at a time: the retries' writes and the next steps' starts are made between children.
    let ran =
        Test::new(FLAKY).run(|step, attempt| if step == "a" && attempt < 3 { exit(1, 3) } else { exit(1, 0) }).await;
    assert_eq!(ran.outcome(), RunOutcome::Succeeded);
    // All but the pids (written while their children run): the first start, a's two failures,
    // its two retries' starts, its success with b's start, b's success, the run's end.
    assert_eq!(ran.idle_writes, 8, "{:#?}", ran.writes);
    // Overlapping steps: a write while another step's child runs is not one of them.
    let mut test = Test::new(FAN);
    test.max_parallel = 2;
    let ran = test.run(|step, _| exit(durations(step), 0)).await;
    assert_eq!(ran.outcome(), RunOutcome::Succeeded);
    assert!(ran.idle_writes < ran.writes.len(), "{:#?}", ran.writes);
    // A catch handler, a compensation and a hook are children too: the writes after each has
    // ended are made between children.
    let flow = catching(r#"{ exception_types = ["CalledProcessError"], run = ["fix"] }"#);
    let ran = Test::new(&flow).run(|step, _| if step == "a" { exit(1, 1) } else { exit(1, 0) }).await;
    assert_eq!(ran.outcome(), RunOutcome::Succeeded);
    // All but the pids: the first start, a's failure, its handler's start and end, b's start
    // and end, the run's end.
    assert_eq!(ran.idle_writes, 7, "{:#?}", ran.writes);
    let ran = Test::new(COMPENSATED).run(|step, _| if step == "c" { exit(1, 1) } else { exit(1, 0) }).await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    // All but the 7 pids (of 20 writes): the compensations' and hooks' starts and ends among
    // them.
    assert_eq!(ran.idle_writes, 13, "{:#?}", ran.writes);
}

/// A new run is given no records (its steps are all pending): it runs as one given a pending
/// record for each step does, with the same events, writes and schedule, failing or not.
#[tokio::test(start_paused = true)]
async fn a_run_given_no_records_runs_as_one_whose_steps_are_all_pending() {
    for (flow, failing) in [(FAN, "a"), (FAN, "none"), (COMPENSATED, "c")] {
        let script = move |step: &str, _| if step == failing { exit(1, 1) } else { exit(durations(step), 0) };
        let mut given = Test::new(flow);
        given.max_parallel = 2;
        let given = given.run(script).await;
        let mut none = Test::new(flow);
        none.max_parallel = 2;
        none.records.clear();
        let none = none.run(script).await;
        assert_eq!(none.outcome(), given.outcome());
        assert_eq!(none.schedule(), given.schedule());
        assert_eq!(none.writes, given.writes);
        let kinds = |ran: &Ran| ran.events.iter().map(|e| format!("{:?}", e.event)).collect::<Vec<_>>();
        assert_eq!(kinds(&none), kinds(&given));
    }
}

/// A signal after a step failed for good, while another is under way, interrupts the run (as any
/// signal does) rather than failing it: the step it cut short runs again when the run resumes.
#[tokio::test(start_paused = true)]
async fn a_signal_after_a_failure_for_good_interrupts_the_run() {
    let mut test = Test::new(FAN);
    test.max_parallel = 4;
    test.signals = vec![(secs(2), Signal(nix::sys::signal::Signal::SIGTERM))];
    let ran = test.run(|step, _| if step == "a" { exit(1, 3) } else { Script::Hang }).await;
    assert_eq!(ran.outcome(), RunOutcome::Interrupted { signal: 15 });
    assert_eq!(ran.writes.last().map(String::as_str), Some("run Interrupted None"));
    // b and c were cut short: they are pending again, to run on resume.
    assert_eq!(ran.attempt_finished().iter().filter(|a| a.1 == AttemptEnd::Cancelled).count(), 2);
    assert!(ran.writes.iter().filter(|w| w.ends_with("Cancelled -> Pending")).count() == 2, "{:?}", ran.writes);
}

/// A signal after a failure for good while one step waits for its retry and another runs: the
/// run is interrupted, and the resume serves the recorded wait and runs the step cut short, then
/// fails (nothing new starts: `d`).
#[tokio::test(start_paused = true)]
async fn after_a_signal_a_resumed_run_serves_the_waiting_retry_and_the_step_cut_short() {
    let flow = &FAN.replace(
        "name = \"b\"\nrun = [\"b\"]\nneeds = []\n",
        "name = \"b\"\nrun = [\"b\"]\nneeds = []\nretry = { attempts = 2, backoff_seconds = 600 }\n",
    );
    assert!(flow.contains("backoff_seconds"), "b retries");
    let mut test = Test::new(flow);
    test.max_parallel = 4;
    test.signals = vec![(secs(2), Signal(nix::sys::signal::Signal::SIGTERM))];
    let ran = test.run(|step, _| if step == "c" { Script::Hang } else { exit(1, 3) }).await;
    assert_eq!(ran.outcome(), RunOutcome::Interrupted { signal: 15 });
    assert_eq!(ran.writes.last().map(String::as_str), Some("run Interrupted None"));

    let mut test = Test::new(flow);
    test.max_parallel = 4;
    test.resumed = true;
    test.records[0].state = StepState::Failed;
    test.records[0].attempts_used = 1;
    test.records[1].attempts_used = 1;
    test.records[1].state = StepState::Waiting { next_attempt: 2, wake_at: BASE + secs(600) };
    test.interrupted = [2].into_iter().collect();
    let ran = test.run(|_, _| exit(1, 0)).await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    assert_eq!(ran.schedule(), [("c", 1, 0.0), ("b", 2, 600.0)]);
    assert_eq!(ran.writes.last().map(String::as_str), Some("run Failed Some(\"a\") skipped [\"d\"]"));
}

/// With fail_fast the steps under way are cancelled and do not go on at resume: a signal during
/// their grace period leaves a run that can only fail, and it fails, rather than being
/// interrupted with nothing to resume.
#[tokio::test(start_paused = true)]
async fn a_signal_while_fail_fast_stops_the_steps_under_way_leaves_the_run_failed() {
    let mut test = Test::new(&format!("fail_fast = true\n{FAN}"));
    test.max_parallel = 4;
    test.signals = vec![(secs(2), Signal(nix::sys::signal::Signal::SIGTERM))];
    let ran = test.run(|step, _| if step == "a" { exit(1, 3) } else { Script::Linger(secs(3)) }).await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    assert_eq!(ran.writes.last().map(String::as_str), Some("run Failed Some(\"a\") skipped [\"d\"]"));
    // fail_fast cancelled them before the signal came: theirs is fail_fast's cancellation (no
    // signal), which says the run fails, not that they run again on resume.
    let cancelled: Vec<(String, serde_json::Value)> = ran
        .events
        .iter()
        .map(|e| serde_json::to_value(e).expect("events serialise"))
        .filter(|json| json["kind"] == "attempt_finished" && json["outcome"] == "cancelled")
        .map(|json| (json["step"].as_str().unwrap_or("?").to_owned(), json["signal"].clone()))
        .collect();
    assert_eq!(cancelled, [("b".to_owned(), serde_json::Value::Null), ("c".to_owned(), serde_json::Value::Null)]);
}

/// A resumed run whose steps failed for good under earlier runners failed on the first to fail,
/// by when it ended, not on the first in the file.
#[tokio::test(start_paused = true)]
async fn a_resumed_run_failed_on_the_step_that_failed_first() {
    let mut test = Test::new(FAN);
    test.resumed = true;
    for (i, ended) in [(0, 2), (1, 1)] {
        test.records[i].state = StepState::Failed;
        test.records[i].attempts_used = 1;
        test.records[i].ended_at = Some(BASE + secs(ended));
    }
    let ran = test.run(|step, _| exit(durations(step), 0)).await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    assert_eq!(ran.writes.last().map(String::as_str), Some("run Failed Some(\"b\") skipped [\"c\", \"d\"]"));
}

/// Resuming that run: `a` failed for good, so nothing new starts (`c` never started), but `b`,
/// cut short by the signal, was under way and runs again; then the run fails.
#[tokio::test(start_paused = true)]
async fn resume_runs_again_a_step_a_signal_cut_short_after_a_failure_for_good() {
    let resumed = |interrupted: &[usize]| {
        let mut test = Test::new(FAN);
        test.max_parallel = 4;
        test.resumed = true;
        test.records[0].state = StepState::Failed;
        test.records[0].attempts_used = 1;
        test.interrupted = interrupted.iter().copied().collect();
        test
    };
    let ran = resumed(&[1]).run(|step, _| exit(durations(step), 0)).await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    assert_eq!(ran.schedule(), [("b", 1, 0.0)]);
    assert_eq!(ran.kinds()[..3], ["run_resumed", "step_skipped a", "step_ready b"]);
    // A step that had not started is not under way: nothing starts.
    let ran = resumed(&[]).run(|step, _| exit(durations(step), 0)).await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    assert_eq!(ran.schedule(), []);
}

#[tokio::test(start_paused = true)]
async fn time_spent_waiting_for_a_slot_counts_against_the_timeout() {
    let flow = r#"
max_parallel = 1
[[step]]
name = "long"
run = ["long"]
needs = []
[[step]]
name = "quick"
run = ["quick"]
needs = []
timeout = 3
"#;
    let ran = Test::new(flow).run(|step, _| if step == "long" { exit(5, 0) } else { exit(1, 0) }).await;
    // `quick` was issued at 0 and waited for the slot `long` held until 5: its timeout of 3 s
    // passed at 3, and its attempt is recorded and times out then, without a child and without
    // the slot (one spawned at 5 could do its work before the kill reached it).
    assert_eq!(ran.schedule(), [("long", 1, 0.0)]);
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    assert_eq!(ran.took, secs(5));
    assert_eq!(ran.attempt_finished()[0].2.as_deref(), Some("ActionTimeout"));
    assert_eq!(
        ran.durations().first(),
        Some(&("quick".to_owned(), secs(3))),
        "it timed out when its timeout passed, not when the slot came free"
    );
    // The error says that no program was started, and why the time counted.
    let message = ran.events.iter().rev().find_map(|e| match &e.event {
        Event::AttemptFinished { step, error: Some(error), .. } if step == "quick" => Some(error.message.clone()),
        _ => None,
    });
    assert_eq!(
        message.as_deref(),
        Some(
            "timed out after 3s before its program was started (the time an attempt waits for a free slot counts \
             against its timeout)"
        )
    );
    assert_eq!(
        ran.writes[2..],
        [
            "starting quick #1 row 2",
            "finished row 2 Failed ActionTimeout -> Failed",
            "finished row 1 Succeeded -> Succeeded",
            "run Failed Some(\"quick\")"
        ]
    );
}

/// An attempt that times out while it waits for a slot, and is retried at once, keeps its
/// step's place in the file: its retry takes the slot that came free before the steps after it.
#[tokio::test(start_paused = true)]
async fn a_retry_of_an_attempt_that_timed_out_waiting_takes_the_free_slot_in_file_order() {
    let flow = r#"
max_parallel = 1
[[step]]
name = "long"
run = ["long"]
[[step]]
name = "quick"
run = ["quick"]
needs = []
timeout = 4
retry = { attempts = 3, exception_types = ["ActionTimeout"] }
[[step]]
name = "after"
run = ["after"]
needs = ["long"]
"#;
    let ran = Test::new(flow).run(|step, _| if step == "quick" { exit(1, 0) } else { exit(5, 0) }).await;
    assert_eq!(ran.outcome(), RunOutcome::Succeeded);
    // quick's first attempt timed out at 4 while it waited for the slot `long` held, without a
    // child; its retry, issued then, takes the slot at 5, before `after`.
    assert_eq!(ran.schedule(), [("long", 1, 0.0), ("quick", 2, 5.0), ("after", 1, 6.0)]);
    assert_eq!(ran.took, secs(11));
    assert_eq!(ran.durations().first(), Some(&("quick".to_owned(), secs(4))));
}

/// A program that cannot start, retried at once, has that retry issued in its place at most once
/// per pass over the steps: the steps after it still get the free slots (its retries took every pass until its
/// budget was spent, and `b`, not started before `a` failed for good, never ran), and the loop
/// turns between its retries (where the deadline, signals and other children are heard).
#[tokio::test(start_paused = true)]
async fn a_program_that_cannot_start_and_retries_at_once_does_not_hold_the_others_up() {
    let flow = r#"
max_parallel = 2
[[step]]
name = "a"
run = ["nope"]
retry = { attempts = 5, exception_types = ["Exception"] }
[[step]]
name = "b"
run = ["b"]
needs = []
"#;
    let ran = Test::new(flow).run(|step, _| if step == "a" { Script::NotStarted } else { exit(1, 0) }).await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    assert_eq!(
        ran.schedule(),
        [("a", 1, 0.0), ("a", 2, 0.0), ("b", 1, 0.0), ("a", 3, 0.0), ("a", 4, 0.0), ("a", 5, 0.0)]
    );
}

/// Ready steps start one after another in file order: a step whose program cannot start, and
/// which retries nothing, fails for good before the ready steps after it start, and they do not
/// (README, "When a step fails for good").
#[tokio::test(start_paused = true)]
async fn a_step_that_fails_without_a_child_stops_the_ready_steps_after_it() {
    let flow = r#"
max_parallel = 4
[[step]]
name = "a"
run = ["nope"]
[[step]]
name = "b"
run = ["b"]
needs = []
"#;
    let ran = Test::new(flow).run(|step, _| if step == "a" { Script::NotStarted } else { exit(1, 0) }).await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    assert_eq!(ran.schedule(), [("a", 1, 0.0)]);
}

/// `a` fails for good at 1 s; `b` runs 10 s; `c` is ready but has no slot; `d` needs b.
const FAILING: &str = r#"
max_parallel = 2
[[step]]
name = "a"
run = ["a"]
needs = []
[[step]]
name = "b"
run = ["b"]
needs = []
[[step]]
name = "c"
run = ["c"]
needs = []
[[step]]
name = "d"
run = ["d"]
needs = ["b"]
"#;

fn failing(step: &str, _attempt: u32) -> Script {
    match step {
        "a" => exit(1, 1),
        "b" => exit(10, 0),
        _ => exit(1, 0),
    }
}

#[tokio::test(start_paused = true)]
async fn after_a_failure_running_steps_finish_and_no_new_step_starts() {
    let ran = Test::new(FAILING).run(failing).await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    assert_eq!(ran.schedule(), [("a", 1, 0.0), ("b", 1, 0.0)]);
    assert_eq!(ran.took, secs(10), "b finishes");
    assert_eq!(ran.writes.last().map(String::as_str), Some("run Failed Some(\"a\") skipped [\"c\", \"d\"]"));
    let skipped: Vec<(String, SkipReason)> = ran
        .events
        .iter()
        .filter_map(|e| match &e.event {
            Event::StepSkipped { step, reason } => Some((step.clone(), *reason)),
            _ => None,
        })
        .collect();
    assert_eq!(skipped, [("c".to_owned(), SkipReason::RunFailed), ("d".to_owned(), SkipReason::RunFailed)]);
}

#[tokio::test(start_paused = true)]
async fn fail_fast_cancels_the_running_attempts_the_way_a_signal_does() {
    let ran = Test::new(&format!("fail_fast = true\n{FAILING}")).run(failing).await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    assert_eq!(ran.took, secs(1));
    assert_eq!(
        ran.attempt_finished(),
        [
            (1, AttemptEnd::Failed, Some("CalledProcessError".to_owned()), Some(StopReason::NotRetryable)),
            (1, AttemptEnd::Cancelled, None, None)
        ]
    );
    // The cancelled attempt of b does not count and b is not "skipped": it ran.
    assert!(ran.writes.contains(&"finished row 2 Cancelled -> Pending".to_owned()), "{:?}", ran.writes);
    assert_eq!(ran.writes.last().map(String::as_str), Some("run Failed Some(\"a\") skipped [\"c\", \"d\"]"));
}

#[tokio::test(start_paused = true)]
async fn after_a_failure_a_running_step_still_gets_its_retries() {
    let flow = r#"
[[step]]
name = "a"
run = ["a"]
needs = []
[[step]]
name = "b"
run = ["b"]
needs = []
retry = { attempts = 3, exception_types = ["Exception"], backoff_seconds = 3 }
"#;
    let ran = Test::new(flow)
        .run(|step, attempt| match (step, attempt) {
            ("a", _) => exit(1, 1),
            ("b", 1) => exit(2, 1),
            _ => exit(1, 0),
        })
        .await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    assert_eq!(ran.schedule(), [("a", 1, 0.0), ("b", 1, 0.0), ("b", 2, 5.0)]);
    assert_eq!(ran.took, secs(6));
}

#[tokio::test(start_paused = true)]
async fn the_run_s_end_reports_every_step_that_failed_and_why_retrying_stopped() {
    let flow = r#"
[[step]]
name = "a"
run = ["a"]
needs = []
retry = { attempts = 2, exception_types = ["Exception"], backoff_seconds = 1 }
[[step]]
name = "b"
run = ["b"]
needs = []
retry = { attempts = 3, exception_types = ["ConnectionError", "TimeoutError"] }
"#;
    let ran = Test::new(flow)
        .run(|step, _| match step {
            "a" => exit(2, 1),
            _ => exit(1, 1),
        })
        .await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    let stopped: Vec<(String, u32, String)> = ran
        .events
        .iter()
        .filter_map(|e| match &e.event {
            Event::RetryStopped { step, attempt, error, stop } => Some((step.clone(), *attempt, stop.explain(error))),
            _ => None,
        })
        .collect();
    assert_eq!(
        stopped,
        [
            (
                "b".to_owned(),
                1,
                r#"not retried: CalledProcessError is not in exception_types ["ConnectionError", "TimeoutError"]"#
                    .to_owned()
            ),
            ("a".to_owned(), 2, "budget spent: 2 of 2 attempts".to_owned()),
        ]
    );
    // The run failed on b (it failed for good first); a failed after it, and both are reported.
    let (duration, failures) = ran
        .events
        .iter()
        .find_map(|e| match &e.event {
            Event::RunFinished { duration, failures, .. } => Some((*duration, failures.clone())),
            _ => None,
        })
        .expect("the run finished");
    assert_eq!((duration, ran.took), (secs(5), secs(5)));
    let said: Vec<(&str, &str, u32, StopReason)> =
        failures.iter().map(|f| (f.step.as_str(), f.error.class.as_str(), f.last_attempt, f.stopped.reason)).collect();
    assert_eq!(
        said,
        [
            ("b", "CalledProcessError", 1, StopReason::NotRetryable),
            ("a", "CalledProcessError", 2, StopReason::Exhausted)
        ]
    );
    assert_eq!(failures[0].stderr_log, Path::new("/nonexistent/waymark-dispatch-test/b/attempt-1.stderr"));
}

#[tokio::test(start_paused = true)]
async fn a_step_in_flight_when_its_runner_died_after_a_failure_finishes_on_resume() {
    // The runner died after `a` failed for good, while `b` ran: `b` was running, so it is
    // redelivered and finishes; `c` and `d` never start.
    let mut test = Test::new(FAILING);
    test.resumed = true;
    test.records[0].state = StepState::Failed;
    test.records[0].attempts_used = 1;
    test.records[1].state = StepState::InFlight { attempt: 1, row: 2, pid: Some(4242), proc_start: None };
    let ran = test.run(failing).await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    assert_eq!(ran.leftovers_checked, ["b"]);
    assert_eq!(
        ran.spawned.iter().map(|s| (s.step.as_str(), s.attempt, s.redelivered)).collect::<Vec<_>>(),
        [("b", 1, true)]
    );
    assert_eq!(ran.took, secs(10), "b finishes");
    assert_eq!(ran.writes.last().map(String::as_str), Some("run Failed Some(\"a\") skipped [\"c\", \"d\"]"));
}

#[tokio::test(start_paused = true)]
async fn the_workflow_deadline_stops_running_attempts_and_skips_the_rest() {
    let flow = format!("timeout = 10\n{FLAKY}");
    let ran = Test::new(&flow).run(|_, _| Script::Hang).await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    assert_eq!(ran.took, secs(10));
    // WorkflowTimeout is final, whatever the policy says.
    assert_eq!(
        ran.attempt_finished(),
        [(1, AttemptEnd::Failed, Some("WorkflowTimeout".to_owned()), Some(StopReason::NotRetryable))]
    );
    assert_eq!(ran.writes.last().map(String::as_str), Some("run Failed Some(\"a\") skipped [\"b\"]"));
    let failure = ran.events.iter().find_map(|e| match &e.event {
        Event::RunFinished { failures, .. } => failures.first().map(|f| (f.step.clone(), f.error.class.clone())),
        _ => None,
    });
    assert_eq!(failure, Some(("a".to_owned(), "WorkflowTimeout".to_owned())));
}

#[tokio::test(start_paused = true)]
async fn the_workflow_deadline_ends_a_backoff_and_a_resumed_run_past_it_fails_at_once() {
    let slow = format!("timeout = 10\n{}", FLAKY.replace("backoff_seconds = 1", "backoff_seconds = 100"));
    let ran = Test::new(&slow).run(|_, _| exit(1, 3)).await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    assert_eq!(ran.took, secs(10));
    assert_eq!(ran.schedule(), [("a", 1, 0.0)]);
    assert_eq!(ran.writes.last().map(String::as_str), Some("run Failed Some(\"a\") skipped [\"a\", \"b\"]"));
    // A run resumed after its deadline passed runs nothing.
    let mut test = Test::new(FLAKY);
    test.resumed = true;
    test.deadline = Some(Duration::ZERO);
    let ran = test.run(|_, _| exit(1, 0)).await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    assert!(ran.spawned.is_empty());
    assert_eq!(ran.writes, ["run Failed Some(\"a\") skipped [\"a\", \"b\"]"]);
}

#[tokio::test(start_paused = true)]
async fn a_signal_while_a_write_is_pending_starts_no_further_attempt() {
    let now = FLAKY.replace("backoff_seconds = 1", "backoff_seconds = 0");
    let mut test = Test::new(&now);
    // Attempt 1 fails at 5 s and its outcome takes until 8 s to commit; SIGINT comes at 6 s.
    test.finish_takes = secs(3);
    test.signals = vec![(secs(6), Signal(nix::sys::signal::Signal::SIGINT))];
    let ran = test.run(|_, _| exit(5, 3)).await;
    assert_eq!(ran.outcome(), RunOutcome::Interrupted { signal: 2 });
    // The retry was due at once, so its start was committed with the outcome (see `Held`); the
    // runner was told to stop while that write was pending: the retry is recorded as cancelled
    // before its child is spawned, and nothing more starts.
    assert_eq!(ran.schedule(), [("a", 1, 0.0)]);
    assert_eq!(ran.took, secs(11));
    assert_eq!(
        ran.writes[2..],
        [
            "finished row 1 Failed ConnectionError -> waiting for #2 until +5s; starting a #2 row 2",
            "finished row 2 Cancelled -> Pending",
            "run Interrupted None"
        ]
    );
    // With a backoff the outcome is committed alone, and the signal comes before the retry.
    let mut test = Test::new(FLAKY);
    test.finish_takes = secs(3);
    test.signals = vec![(secs(6), Signal(nix::sys::signal::Signal::SIGINT))];
    let ran = test.run(|_, _| exit(5, 3)).await;
    assert_eq!(ran.schedule(), [("a", 1, 0.0)]);
    assert_eq!(ran.took, secs(8));
    assert_eq!(
        ran.writes[2..],
        ["finished row 1 Failed ConnectionError -> waiting for #2 until +6s", "run Interrupted None"]
    );
}

/// Issue 11: a failed attempt whose retry is due at once costs two writes, not three: its pid,
/// and its outcome committed in one transaction with the retry's start; so does a success with
/// the start of the step that waited for it. What is said about it is the same, in the same
/// order, as with a backoff (each after its commit).
#[tokio::test(start_paused = true)]
async fn a_retry_due_at_once_is_started_in_the_transaction_of_the_failed_attempt_s_outcome() {
    let now = FLAKY.replace("backoff_seconds = 1", "backoff_seconds = 0");
    let ran = Test::new(&now).run(|step, attempt| exit(5, if step == "a" && attempt < 3 { 3 } else { 0 })).await;
    assert_eq!(ran.outcome(), RunOutcome::Succeeded);
    assert_eq!(ran.schedule(), [("a", 1, 0.0), ("a", 2, 5.0), ("a", 3, 10.0), ("b", 1, 15.0)]);
    assert_eq!(
        ran.writes,
        [
            "starting a #1 row 1",
            "spawned row 1",
            "finished row 1 Failed ConnectionError -> waiting for #2 until +5s; starting a #2 row 2",
            "spawned row 2",
            "finished row 2 Failed ConnectionError -> waiting for #3 until +10s; starting a #3 row 3",
            "spawned row 3",
            "finished row 3 Succeeded -> Succeeded; starting b #1 row 4",
            "spawned row 4",
            "finished row 4 Succeeded -> Succeeded",
            "run Succeeded None",
        ]
    );
    let waited = Test::new(FLAKY).run(|step, attempt| exit(5, if step == "a" && attempt < 3 { 3 } else { 0 })).await;
    assert_eq!(ran.kinds(), waited.kinds());
    // Without a retry to go with it, the last outcome is committed alone.
    let ran = Test::new(&now).run(|_, _| exit(5, 3)).await;
    assert_eq!(
        ran.writes[6..],
        ["finished row 3 Failed ConnectionError -> Failed", "run Failed Some(\"a\") skipped [\"b\"]"]
    );
}

/// A success is held for the start of the step that waited for it (see `Held`): one write for
/// both, and what is said keeps the order of what happened: the step that waited is said to be
/// ready only after the success it waited for. A step after the last has nothing to go with.
#[tokio::test(start_paused = true)]
async fn a_success_is_committed_with_the_start_of_the_step_it_lets_run_and_said_first() {
    let toml = "[[step]]\nname = \"a\"\nrun = [\"a\"]\n[[step]]\nname = \"b\"\nrun = [\"b\"]\n";
    let ran = Test::new(toml).run(|_, _| exit(2, 0)).await;
    assert_eq!(ran.outcome(), RunOutcome::Succeeded);
    assert_eq!(
        ran.writes,
        [
            "starting a #1 row 1",
            "spawned row 1",
            "finished row 1 Succeeded -> Succeeded; starting b #1 row 2",
            "spawned row 2",
            "finished row 2 Succeeded -> Succeeded",
            "run Succeeded None",
        ]
    );
    assert_eq!(
        ran.kinds(),
        [
            "run_started",
            "step_ready a",
            "step_started a",
            "attempt_started a",
            "attempt_finished a",
            "step_finished a",
            "step_ready b",
            "step_started b",
            "attempt_started b",
            "attempt_finished b",
            "step_finished b",
            "run_finished",
        ]
    );
}

/// A step issued by a success counts its timeout from the commit that records the success with
/// its start, as it did when the success was committed alone before it was issued: a slow disk
/// (here 3 s a commit) does not eat into the next step's timeout. A retry's clock, and a step's
/// that waited for a slot before the success, are as they were.
#[tokio::test(start_paused = true)]
async fn a_step_issued_by_a_success_counts_its_timeout_from_the_commit() {
    let toml = "[[step]]\nname = \"a\"\nrun = [\"a\"]\n[[step]]\nname = \"b\"\nrun = [\"b\"]\ntimeout = 2\n";
    let mut test = Test::new(toml);
    test.finish_takes = secs(3);
    let ran = test.run(|_, _| exit(1, 0)).await;
    assert_eq!(ran.outcome(), RunOutcome::Succeeded);
    // a ends at 1 s; its success and b's start take until 4 s; b runs 1 s of its 2.
    assert_eq!(ran.schedule(), [("a", 1, 0.0), ("b", 1, 4.0)]);
    let took: Vec<_> = ran
        .events
        .iter()
        .filter_map(|e| match &e.event {
            Event::AttemptFinished { step, duration, .. } => Some((step.as_str(), *duration)),
            _ => None,
        })
        .collect();
    assert_eq!(took, [("a", secs(1)), ("b", secs(1))]);
}

/// A held outcome whose retry does not get the free slot first (a step earlier in the file
/// whose backoff ended meanwhile takes it) is committed with that step's start: the writes stay
/// in the order the steps act, and the retry starts later, with the next held outcome.
#[tokio::test(start_paused = true)]
async fn a_held_outcome_is_committed_with_the_start_of_the_step_that_takes_the_slot_first() {
    let toml = r#"
max_parallel = 1
[exit_codes]
"3" = "ConnectionError"
[[step]]
name = "x"
needs = []
run = ["x"]
retry = { attempts = 2, backoff_seconds = 1 }
[[step]]
name = "a"
needs = []
run = ["a"]
retry = { attempts = 2 }
"#;
    let mut test = Test::new(toml);
    test.max_parallel = 1;
    let ran = test
        .run(|step, attempt| match (step, attempt) {
            ("x", 1) => exit(1, 3),
            ("a", 1) => exit(5, 3),
            _ => exit(1, 0),
        })
        .await;
    assert_eq!(ran.outcome(), RunOutcome::Succeeded);
    // x fails at 1 s and waits until 2 s while a runs; a fails at 6 s: x, earlier in the file,
    // takes the slot, then a's retry.
    assert_eq!(ran.schedule(), [("x", 1, 0.0), ("a", 1, 1.0), ("x", 2, 6.0), ("a", 2, 7.0)]);
    assert_eq!(
        ran.writes,
        [
            "starting x #1 row 1",
            "spawned row 1",
            "finished row 1 Failed ConnectionError -> waiting for #2 until +2s",
            "starting a #1 row 2",
            "spawned row 2",
            "finished row 2 Failed ConnectionError -> waiting for #2 until +6s; starting x #2 row 3",
            "spawned row 3",
            "finished row 3 Succeeded -> Succeeded; starting a #2 row 4",
            "spawned row 4",
            "finished row 4 Succeeded -> Succeeded",
            "run Succeeded None",
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_journal_failure_while_an_attempt_runs_kills_it_and_leaves_the_run_unfinished() {
    let mut test = Test::new(FLAKY);
    test.spawned_fails = true;
    let ran = test.run(|_, _| Script::Hang).await;
    assert!(matches!(&ran.result, Err(ExecError::Store(StoreError::Failed { kind: StoreErrorKind::Full, .. }))));
    // The child whose pid could not be recorded is killed: a later resume could not find it.
    assert_eq!(ran.killed, [1001]);
    // Nothing more is written: the run stays `running`, and the next runner redelivers the attempt.
    assert_eq!(ran.writes, ["starting a #1 row 1"]);
    assert!(!ran.kinds().contains(&"run_finished".to_owned()));
}

#[tokio::test(start_paused = true)]
async fn a_signal_while_a_start_is_recorded_spawns_nothing() {
    let mut test = Test::new(FLAKY);
    // Recording the first attempt's start takes 3 s; SIGTERM comes at 1 s.
    test.start_takes = secs(3);
    test.signals = vec![(secs(1), Signal(nix::sys::signal::Signal::SIGTERM))];
    let ran = test.run(|_, _| exit(5, 0)).await;
    assert_eq!(ran.outcome(), RunOutcome::Interrupted { signal: 15 });
    assert_eq!(ran.schedule(), []);
    assert_eq!(ran.took, secs(3));
    // Recorded as cancelled: it does not count and runs again, as attempt 1, on resume.
    assert_eq!(ran.writes, ["starting a #1 row 1", "finished row 1 Cancelled -> Pending", "run Interrupted None"]);
    assert_eq!(ran.kinds(), ["run_started", "step_ready a", "cancelling", "run_finished"]);
}

/// `a` fails with the error the test's exit code names; `b` needs it.
fn catching(catch: &str) -> String {
    format!(
        r#"
[errors]
BadInput = []
[exit_codes]
"4" = "BadInput"
[[step]]
name = "a"
run = ["a"]
timeout = 5
catch = [{catch}]
[[step]]
name = "b"
run = ["b"]
"#
    )
}

#[tokio::test(start_paused = true)]
async fn a_handler_without_a_command_swallows_the_error_and_the_dependents_run() {
    let flow = catching(r#"{ exception_types = ["CalledProcessError"] }"#);
    let ran = Test::new(&flow).run(|step, _| if step == "a" { exit(1, 1) } else { exit(1, 0) }).await;
    assert_eq!(ran.outcome(), RunOutcome::Succeeded);
    assert_eq!(ran.schedule(), [("a", 1, 0.0), ("b", 1, 1.0)]);
    assert_eq!(ran.writes[2], "finished row 1 Failed CalledProcessError -> Caught");
    assert!(ran.kinds().contains(&"step_finished a".to_owned()));
}

/// `a` times out at 5 s; its handler, which matches the timeout, runs 2 s and succeeds; `b`
/// runs 1 s. Each attempt's outcome takes `commit` to commit.
async fn caught_by_a_handler(commit: Duration) -> Ran {
    let flow = catching(r#"{ exception_types = ["ActionTimeout"], run = ["fallback"] }"#);
    let mut test = Test::new(&flow);
    test.finish_takes = commit;
    test.run(|step, _| match step {
        "a" => Script::Hang,
        "a:catch" => exit(2, 0),
        _ => exit(1, 0),
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn a_handler_that_succeeds_catches_the_error_before_the_dependents_run() {
    let ran = caught_by_a_handler(Duration::ZERO).await;
    assert_eq!(ran.outcome(), RunOutcome::Succeeded);
    // a times out at 5 s; its handler runs 2 s; then b.
    assert_eq!(ran.schedule(), [("a", 1, 0.0), ("a:catch", 1, 5.0), ("b", 1, 7.0)]);
    assert_eq!(
        ran.writes[..6],
        [
            "starting a #1 row 1",
            "spawned row 1",
            "finished row 1 Failed ActionTimeout -> Catching",
            "handler of a #1 row 2",
            "spawned row 2",
            "finished row 2 Succeeded -> Caught",
        ]
    );
}

/// A catch handler lasts, as an attempt does, until its process ends: its outcome's commit (1 s
/// here) is not part of it.
#[tokio::test(start_paused = true)]
async fn a_handler_s_duration_ends_with_its_process_not_with_its_outcome_s_commit() {
    let ran = caught_by_a_handler(secs(1)).await;
    assert_eq!(ran.outcome(), RunOutcome::Succeeded);
    let expected = [("a", secs(5)), ("a:catch", secs(2)), ("b", secs(1))].map(|(s, d)| (s.to_owned(), d));
    assert_eq!(ran.durations(), expected);
}

#[tokio::test(start_paused = true)]
async fn a_failing_handler_or_an_error_no_handler_matches_fails_the_step() {
    let flow = catching(r#"{ exception_types = ["BadInput"], shell = "exit 3" }"#);
    let ran = Test::new(&flow).run(|step, _| if step == "a" { exit(1, 4) } else { exit(1, 1) }).await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    assert_eq!(ran.schedule(), [("a", 1, 0.0), ("a:catch", 1, 1.0)]);
    // The handler's end is recorded with its own error (its exit status 1, as a compensation's
    // would be named); the store keeps the step's.
    assert_eq!(ran.writes[5], "finished row 2 Failed CalledProcessError -> Failed");
    assert_eq!(ran.writes.last().map(String::as_str), Some("run Failed Some(\"a\") skipped [\"b\"]"));
    // The step fails with its own error, not the handler's.
    let failure = ran.events.iter().find_map(|e| match &e.event {
        Event::RunFinished { failures, .. } => failures.first().map(|f| f.error.class.clone()),
        _ => None,
    });
    assert_eq!(failure.as_deref(), Some("BadInput"));
    // CalledProcessError is not BadInput: nothing catches it.
    let ran = Test::new(&flow).run(|_, _| exit(1, 1)).await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    assert_eq!(ran.schedule(), [("a", 1, 0.0)]);
}

#[tokio::test(start_paused = true)]
async fn a_handler_in_flight_when_the_runner_died_runs_again_on_resume() {
    let flow = catching(r#"{ exception_types = ["Exception"], run = ["fallback"] }"#);
    let mut test = Test::new(&flow);
    test.resumed = true;
    test.records[0].attempts_used = 1;
    test.records[0].last_error = Some(Box::new(crate::classify::ErrorValue {
        class: "CalledProcessError".into(),
        bases: vec!["SubprocessError".into(), "Exception".into(), "BaseException".into()],
        message: "exit status 1".into(),
        source: crate::classify::ErrorSource::ExitStatus,
    }));
    test.records[0].state = StepState::Catching { attempt: 1, in_flight: Some((9, Some(4242), None)) };
    let ran = test.run(|_, _| exit(1, 0)).await;
    assert_eq!(ran.outcome(), RunOutcome::Succeeded);
    assert_eq!(ran.leftovers_checked, ["a"], "the dead runner's handler is made sure dead first");
    assert_eq!(ran.schedule(), [("a:catch", 1, 0.0), ("b", 1, 1.0)]);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_is_never_caught() {
    let flow = format!("timeout = 3\n{}", catching(r#"{ exception_types = ["BaseException"] }"#));
    let ran = Test::new(&flow).run(|_, _| Script::Hang).await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    assert_eq!(ran.attempt_finished()[0].2.as_deref(), Some("WorkflowTimeout"));
}

/// a and b succeed (b needs a), c fails after them; a and b have compensations; hooks on both ends.
const COMPENSATED: &str = r#"
[hooks]
on_success = ["notify", "ok"]
on_failure = ["notify", "failed"]
on_exit = ["cleanup"]
[[step]]
name = "a"
run = ["a"]
compensate = ["undo-a"]
[[step]]
name = "b"
run = ["b"]
compensate = "undo b"
[[step]]
name = "c"
run = ["c"]
"#;

fn names(ran: &Ran) -> Vec<&str> {
    ran.spawned.iter().map(|s| s.step.as_str()).collect()
}

#[tokio::test(start_paused = true)]
async fn a_failed_run_compensates_in_reverse_order_of_completion_then_runs_its_hooks_once() {
    let ran = Test::new(COMPENSATED)
        .run(|step, _| match step {
            "c" | "b:compensate" => exit(1, 1),
            _ => exit(1, 0),
        })
        .await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    // b's compensation fails: reported, and a's still runs; then on_failure and on_exit.
    assert_eq!(names(&ran), ["a", "b", "c", "b:compensate", "a:compensate", "hook:on_failure", "hook:on_exit"]);
    let tail: Vec<&str> = ran.writes.iter().map(String::as_str).filter(|w| !w.starts_with("spawned")).collect();
    assert_eq!(
        tail[tail.len() - 9..],
        [
            "compensate b row 4",
            "finished row 4 Failed CalledProcessError",
            "compensate a row 5",
            "finished row 5 Succeeded",
            "hook on_failure row 6",
            "finished row 6 Succeeded",
            "hook on_exit row 7",
            "finished row 7 Succeeded",
            "run Failed Some(\"c\")",
        ]
    );
    // The run failed because of c, whatever its compensations did.
    let failure = ran.events.iter().find_map(|e| match &e.event {
        Event::RunFinished { failures, .. } => failures.first().map(|f| f.step.clone()),
        _ => None,
    });
    assert_eq!(failure.as_deref(), Some("c"));
}

/// The steps of a failed run that will not run are recorded skipped with the first compensation's
/// start, not with the run's end: while the compensations and hooks run (or if the runner dies
/// among them), `status` shows them skipped rather than pending; and said so before the first.
#[tokio::test(start_paused = true)]
async fn the_steps_that_will_not_run_are_skipped_when_the_wind_down_begins() {
    let flow = "[hooks]\non_exit = ['cleanup']\n[[step]]\nname = 'a'\nrun = ['a']\ncompensate = ['undo-a']\n\
                [[step]]\nname = 'b'\nrun = ['b']\nneeds = ['a']\n[[step]]\nname = 'c'\nrun = ['c']\nneeds = ['b']\n";
    let ran = Test::new(flow).run(|step, _| if step == "b" { exit(1, 1) } else { exit(1, 0) }).await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    let tail: Vec<&str> = ran.writes.iter().map(String::as_str).filter(|w| !w.starts_with("spawned")).collect();
    assert_eq!(
        tail[tail.len() - 5..],
        [
            "compensate a row 3 skipped [\"c\"]",
            "finished row 3 Succeeded",
            "hook on_exit row 4",
            "finished row 4 Succeeded",
            "run Failed Some(\"b\")",
        ]
    );
    let said: Vec<String> = ran
        .events
        .iter()
        .filter_map(|e| match &e.event {
            Event::StepSkipped { step, .. } => Some(format!("skipped {step}")),
            Event::AuxStarted { name, .. } => Some(format!("started {name}")),
            _ => None,
        })
        .collect();
    assert_eq!(said, ["skipped c", "started a", "started on_exit"]);
}

#[tokio::test(start_paused = true)]
async fn a_succeeded_run_compensates_nothing_and_runs_on_success_then_on_exit() {
    let ran = Test::new(COMPENSATED).run(|_, _| exit(1, 0)).await;
    assert_eq!(ran.outcome(), RunOutcome::Succeeded);
    assert_eq!(names(&ran), ["a", "b", "c", "hook:on_success", "hook:on_exit"]);
}

/// [`COMPENSATED`] resumed after its last step failed: its compensations are under way.
fn compensating() -> Test {
    let mut test = Test::new(COMPENSATED);
    test.resumed = true;
    test.records[0].state = StepState::Succeeded;
    test.records[0].ended_at = Some(BASE + secs(1));
    test.records[1].state = StepState::Succeeded;
    test.records[1].ended_at = Some(BASE + secs(2));
    test.records[2].state = StepState::Failed;
    test
}

/// A run of the compensation of step `name`, recorded as row `row`, finished or left running.
fn compensation(name: &str, row: i64, finished: bool) -> AuxRun {
    AuxRun {
        kind: AuxKind::Compensate,
        name: name.into(),
        finished,
        row,
        pid: Some(4242),
        proc_start: None,
        outcome: if finished { crate::store::AttemptState::Succeeded } else { crate::store::AttemptState::Running },
        started_at: BASE,
        ended_at: finished.then_some(BASE),
        exit_code: finished.then_some(0),
        error: None,
    }
}

#[tokio::test(start_paused = true)]
async fn a_resumed_run_does_not_repeat_finished_compensations_and_kills_one_left_running() {
    let mut test = compensating();
    test.aux = vec![compensation("b", 7, true), compensation("a", 7, false)];
    let ran = test.run(|_, _| exit(1, 0)).await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    assert_eq!(ran.leftovers_checked, ["a:compensate"]);
    assert_eq!(names(&ran), ["a:compensate", "hook:on_failure", "hook:on_exit"]);
}

/// A compensation left running by one dead runner, run again (and finished) by the next, which
/// died in turn: the first run's row is still unfinished, and is made sure dead again, but the
/// files at the compensation's one stem are the later run's, kept scrubbed: not removed.
#[tokio::test(start_paused = true)]
async fn a_compensation_run_again_since_keeps_its_files_when_the_first_is_made_sure_dead() {
    let mut test = compensating();
    test.aux = vec![compensation("b", 7, false), compensation("b", 8, true), compensation("a", 9, false)];
    let ran = test.run(|_, _| exit(1, 0)).await;
    assert_eq!(ran.leftovers_checked, ["b:compensate (a later run's files)", "a:compensate"]);
    assert_eq!(names(&ran), ["a:compensate", "hook:on_failure", "hook:on_exit"]);
}

#[tokio::test(start_paused = true)]
async fn a_signal_during_a_compensation_stops_it_and_the_run_is_interrupted() {
    let mut test = Test::new(COMPENSATED);
    test.signals = vec![(secs(5), Signal(nix::sys::signal::Signal::SIGTERM))];
    let ran = test
        .run(|step, _| match step {
            "c" => exit(1, 1),
            "b:compensate" => Script::Hang,
            _ => exit(1, 0),
        })
        .await;
    assert_eq!(ran.outcome(), RunOutcome::Interrupted { signal: 15 });
    assert_eq!(names(&ran), ["a", "b", "c", "b:compensate"]);
    assert_eq!(ran.writes.last().map(String::as_str), Some("run Interrupted None"));
    assert!(ran.writes.contains(&"finished row 4 Cancelled".to_owned()), "{:?}", ran.writes);
}

#[tokio::test(start_paused = true)]
async fn a_step_a_dead_runner_left_running_is_skipped_when_the_run_fails_without_running_it() {
    // Resumed after the deadline passed: the step in flight is made sure dead, not run again,
    // and recorded skipped rather than left `running` in a failed run.
    let mut test = Test::new(FLAKY);
    test.resumed = true;
    test.deadline = Some(Duration::ZERO);
    test.records[0].state = StepState::InFlight { attempt: 1, row: 3, pid: Some(4242), proc_start: None };
    let ran = test.run(|_, _| exit(1, 0)).await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    assert_eq!(ran.leftovers_checked, ["a"]);
    assert!(ran.spawned.is_empty());
    assert_eq!(ran.writes, ["run Failed Some(\"a\") skipped [\"a\", \"b\"]"]);
}

#[tokio::test(start_paused = true)]
async fn fail_fast_skips_a_retry_waiting_for_its_backoff_rather_than_leave_it_waiting() {
    // a waits 10 s for its retry when b fails for good at 2 s: with fail_fast the retry never
    // runs, so a failed run must not show a recorded "next retry" for it.
    let flow = r#"
fail_fast = true
[[step]]
name = "a"
run = ["a"]
needs = []
retry = { attempts = 3, backoff_seconds = 10, jitter = false }
[[step]]
name = "b"
run = ["b"]
needs = []
"#;
    let ran = Test::new(flow).run(|step, _| if step == "a" { exit(1, 1) } else { exit(2, 1) }).await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    assert_eq!(ran.schedule(), [("a", 1, 0.0), ("b", 1, 0.0)]);
    assert_eq!(ran.writes.last().map(String::as_str), Some("run Failed Some(\"b\") skipped [\"a\"]"));
}

#[tokio::test(start_paused = true)]
async fn a_catch_handler_cancelled_by_fail_fast_leaves_its_step_skipped_not_catching() {
    let flow = r#"
fail_fast = true
[[step]]
name = "a"
run = ["a"]
needs = []
catch = [{ exception_types = ["Exception"], run = ["fallback"] }]
[[step]]
name = "b"
run = ["b"]
needs = []
"#;
    let ran = Test::new(flow)
        .run(|step, _| match step {
            "a" => exit(1, 1),
            "a:catch" => Script::Hang,
            _ => exit(2, 1),
        })
        .await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    assert_eq!(names(&ran), ["a", "b", "a:catch"]);
    assert!(ran.writes.contains(&"finished row 3 Cancelled -> Catching".to_owned()), "{:?}", ran.writes);
    assert_eq!(ran.writes.last().map(String::as_str), Some("run Failed Some(\"b\") skipped [\"a\"]"));
}

/// The steps skipped at the end of a run, in the order said, with why.
fn skipped(ran: &Ran) -> Vec<(String, SkipReason)> {
    ran.events
        .iter()
        .filter_map(|e| match &e.event {
            Event::StepSkipped { step, reason } => Some((step.clone(), *reason)),
            _ => None,
        })
        .collect()
}

/// A flow of `n` steps named s0000, s0001, ...; `needs` gives what step `i` needs (`None`: the
/// default, the step before it).
fn many(head: &str, n: usize, needs: impl Fn(usize) -> Option<String>) -> String {
    let mut toml = head.to_owned();
    for i in 0..n {
        toml.push_str(&format!("[[step]]\nname = \"s{i:04}\"\nrun = [\"s\"]\n"));
        if let Some(needs) = needs(i) {
            toml.push_str(&format!("needs = {needs}\n"));
        }
    }
    toml
}

fn name(i: usize) -> String {
    format!("s{i:04}")
}

#[tokio::test(start_paused = true)]
async fn a_long_chain_runs_in_file_order_and_a_failure_skips_the_rest_in_file_order() {
    let n = 2_000;
    let ran = Test::new(&many("", n, |_| None)).run(|step, _| exit(1, i32::from(step == "s1500"))).await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    let expected: Vec<(String, u32, f64)> = (0..=1500).map(|i| (name(i), 1, i as f64)).collect();
    let schedule: Vec<(String, u32, f64)> = ran.schedule().into_iter().map(|(s, a, t)| (s.to_owned(), a, t)).collect();
    assert_eq!(schedule, expected, "each step starts when the one before it succeeded");
    let rest: Vec<(String, SkipReason)> = (1501..n).map(|i| (name(i), SkipReason::RunFailed)).collect();
    assert_eq!(skipped(&ran), rest);
    let names: Vec<String> = (1501..n).map(name).collect();
    assert_eq!(ran.writes.last(), Some(&format!("run Failed Some(\"s1500\") skipped {names:?}")));
}

#[tokio::test(start_paused = true)]
async fn a_wide_fan_out_starts_in_file_order_and_the_deadline_skips_the_rest_in_file_order() {
    // s0000 is the root, s0001..s1999 need it, the last needs them all; 4 run at once, 2 s each.
    let n = 2_000;
    let all: Vec<String> = (1..n - 1).map(name).collect();
    let needs = |i: usize| match i {
        0 => Some("[]".to_owned()),
        i if i == n - 1 => Some(format!("{all:?}")),
        _ => Some("[\"s0000\"]".to_owned()),
    };
    let ran = Test::new(&many("max_parallel = 4\n", n, needs)).run(|_, _| exit(2, 0)).await;
    assert_eq!(ran.outcome(), RunOutcome::Succeeded);
    let expected: Vec<(String, u32, f64)> = (0..n)
        .map(|i| match i {
            0 => (name(i), 1, 0.0),
            i if i == n - 1 => (name(i), 1, 2.0 + 2.0 * 500.0),
            i => (name(i), 1, 2.0 + 2.0 * ((i - 1) / 4) as f64),
        })
        .collect();
    let schedule: Vec<(String, u32, f64)> = ran.schedule().into_iter().map(|(s, a, t)| (s.to_owned(), a, t)).collect();
    assert_eq!(schedule, expected, "in file order, four at a time, the join after all");
    assert!(skipped(&ran).is_empty());

    // The deadline passes at 11 s while s0017..s0020 run (started at 10): they fail of it, and
    // every step not started is skipped for it, in file order.
    let mut test = Test::new(&many("max_parallel = 4\ntimeout = 11\n", n, needs));
    test.max_parallel = 4;
    let ran = test.run(|_, _| exit(2, 0)).await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    assert_eq!(ran.spawned.len(), 21);
    let rest: Vec<(String, SkipReason)> = (21..n).map(|i| (name(i), SkipReason::DeadlinePassed)).collect();
    assert_eq!(skipped(&ran), rest);
}

/// A retry's start is recorded `RECORD_AHEAD` before its backoff ends, so the commit does not
/// lengthen the wait: the child starts when the backoff ends, though the commit takes 2 ms (the
/// first attempt, with no backoff, starts 2 ms late). A commit longer than 3 ms is late by the
/// rest (2 ms of 5).
#[tokio::test(start_paused = true)]
async fn a_retry_is_recorded_ahead_of_the_end_of_its_backoff_and_spawned_at_it() {
    // Attempt 1 ends 5 s after it starts; retry 2 waits 1 s, retry 3 waits 2 s.
    for (takes, second, third) in [(2, 6.002, 13.002), (5, 6.007, 13.009)] {
        let mut test = Test::new(FLAKY);
        test.start_takes = Duration::from_millis(takes);
        let ran = test.run(|_, _| exit(5, 3)).await;
        assert_eq!(ran.outcome(), RunOutcome::Failed);
        let first = takes as f64 / 1000.0;
        let at: Vec<(u32, f64)> =
            ran.schedule().into_iter().map(|(_, attempt, at)| (attempt, (at * 1e6).round() / 1e6)).collect();
        assert_eq!(at, [(1, first), (2, second), (3, third)], "a start that takes {takes} ms");
        // The same writes, in the same order, as a start recorded after the backoff.
        assert_eq!(
            ran.writes[2..6],
            [
                format!(
                    "finished row 1 Failed ConnectionError -> waiting for #2 until +{:?}",
                    secs(5) + Duration::from_millis(takes) + secs(1)
                ),
                "starting a #2 row 2".to_owned(),
                "spawned row 2".to_owned(),
                format!(
                    "finished row 2 Failed ConnectionError -> waiting for #3 until +{:?}",
                    Duration::from_secs_f64(second) + secs(5) + secs(2)
                ),
            ]
        );
    }
}

/// A signal after a retry's start was recorded ahead, before its backoff ends: no child is
/// spawned, the attempt is recorded as cancelled and runs again under its number on resume.
#[tokio::test(start_paused = true)]
async fn a_signal_between_a_retry_recorded_ahead_and_the_end_of_its_backoff_spawns_nothing() {
    let mut test = Test::new(FLAKY);
    test.signals = vec![(Duration::from_millis(5_999), Signal(nix::sys::signal::Signal::SIGTERM))];
    let ran = test.run(|_, _| exit(5, 3)).await;
    assert_eq!(ran.outcome(), RunOutcome::Interrupted { signal: 15 });
    assert_eq!(ran.schedule(), [("a", 1, 0.0)]);
    assert_eq!(ran.took, Duration::from_millis(5_999), "the signal is acted on at once");
    assert_eq!(
        ran.writes[2..],
        [
            "finished row 1 Failed ConnectionError -> waiting for #2 until +6s",
            "starting a #2 row 2",
            "finished row 2 Cancelled -> Pending",
            "run Interrupted None",
        ]
    );
}

/// The timeout of a retry recorded ahead counts from the end of its backoff, when its child
/// starts, not from the commit.
#[tokio::test(start_paused = true)]
async fn the_timeout_of_a_retry_counts_from_the_end_of_its_backoff() {
    let flow = r#"
[[step]]
name = "a"
run = ["slow"]
timeout = 3
retry = { attempts = 2, exception_types = ["ActionTimeout"], backoff_seconds = 1 }
"#;
    let ran = Test::new(flow).run(|_, _| Script::Hang).await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    assert_eq!(ran.schedule(), [("a", 1, 0.0), ("a", 2, 4.0)]);
    assert_eq!(ran.took, secs(7));
}

/// A run whose deadline comes within `RECORD_AHEAD` of a backoff's end records no start ahead:
/// the deadline ends the wait, and no child starts after it.
#[tokio::test(start_paused = true)]
async fn a_deadline_just_before_the_end_of_a_backoff_records_no_start() {
    let flow = format!("timeout = \"5999ms\"\n{FLAKY}");
    let ran = Test::new(&flow).run(|_, _| exit(5, 3)).await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    assert_eq!(ran.schedule(), [("a", 1, 0.0)]);
    assert_eq!(ran.took, Duration::from_millis(5_999));
    assert!(!ran.writes.iter().any(|w| w.starts_with("starting a #2")), "{:?}", ran.writes);
}

/// Two roots: `a` fails with `ConnectionError` and retries after 1 s, `b` fails for good.
const FAIL_FAST: &str = r#"
fail_fast = true
[exit_codes]
"3" = "ConnectionError"
[[step]]
name = "a"
run = ["fetch"]
needs = []
retry = { attempts = 3, exception_types = ["ConnectionError"], backoff_seconds = 1 }
[[step]]
name = "b"
run = ["check"]
needs = []
"#;

/// After `fail_fast` stopped the run, a retry left waiting does not wake the dispatcher while a
/// cancelled child takes its time to end: the loop waits for the child, it does not spin. The
/// same after the workflow deadline.
#[tokio::test(start_paused = true)]
async fn a_retry_left_waiting_does_not_spin_the_loop_while_cancelled_children_end() {
    let flow = format!("{FAIL_FAST}[[step]]\nname = \"c\"\nrun = [\"slow\"]\nneeds = []\n");
    // a fails at 1 s and waits until 2 s; b fails for good at 3 s; c takes 5 s to end.
    let script = |step: &str, _| match step {
        "a" => exit(1, 3),
        "b" => exit(3, 1),
        _ => Script::Linger(secs(5)),
    };
    let ran = Test::new(&flow).run(script).await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    assert_eq!(ran.took, secs(8));
    assert!(ran.turns < 50, "{} turns", ran.turns);
    // Without fail_fast, the workflow deadline at 3 s: a's retry, due at 11 s, is not taken
    // after it, and c takes until 8 s to end.
    let deadline = format!(
        "timeout = 3\n{}",
        flow.replace("fail_fast = true\n", "").replace("backoff_seconds = 1", "backoff_seconds = 10")
    );
    let ran = Test::new(&deadline).run(script).await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    assert_eq!(ran.took, secs(8));
    assert!(ran.turns < 50, "{} turns", ran.turns);
}

/// With `fail_fast`, a retry whose backoff ended but that has no free slot yet does not run after
/// a step fails for good: it is skipped, as one still waiting is.
#[tokio::test(start_paused = true)]
async fn fail_fast_skips_a_retry_that_waits_for_a_slot() {
    let flow = FAIL_FAST.replace("fail_fast = true\n", "fail_fast = true\nmax_parallel = 1\n");
    // a fails at 1 s (due again at 2 s); b runs from 1 s and fails for good at 3 s.
    let ran = Test::new(&flow).run(|step, _| if step == "a" { exit(1, 3) } else { exit(2, 1) }).await;
    assert_eq!(ran.outcome(), RunOutcome::Failed);
    assert_eq!(ran.schedule(), [("a", 1, 0.0), ("b", 1, 1.0)]);
    assert_eq!(ran.took, secs(3));
    assert_eq!(ran.writes.last().map(String::as_str), Some("run Failed Some(\"b\") skipped [\"a\"]"));
}

/// Attempts waiting for a slot time out in the order of their timeouts' ends, whatever their
/// order in the file (their errors swallowed by a catch without a command, so the run goes on),
/// and one whose timeout has not passed when the slot comes free takes it then.
#[tokio::test(start_paused = true)]
async fn attempts_waiting_for_a_slot_time_out_in_the_order_their_timeouts_end() {
    let flow = r#"
max_parallel = 1
[[step]]
name = "long"
run = ["long"]
needs = []
[[step]]
name = "b"
run = ["b"]
needs = []
timeout = 6
catch = [{ exception_types = ["ActionTimeout"] }]
[[step]]
name = "c"
run = ["c"]
needs = []
timeout = 3
catch = [{ exception_types = ["ActionTimeout"] }]
[[step]]
name = "d"
run = ["d"]
needs = []
timeout = 20
"#;
    let ran = Test::new(flow).run(|step, _| if step == "long" { exit(10, 0) } else { exit(1, 0) }).await;
    assert_eq!(ran.schedule(), [("long", 1, 0.0), ("d", 1, 10.0)]);
    assert_eq!(
        ran.durations(),
        [
            ("c".to_owned(), secs(3)),
            ("b".to_owned(), secs(6)),
            ("long".to_owned(), secs(10)),
            ("d".to_owned(), secs(11))
        ]
    );
    // (`d`'s attempt counts from when it was issued, at 0, as its timeout does.)
    assert_eq!(ran.took, secs(11));
    assert_eq!(ran.outcome(), RunOutcome::Succeeded);
}

/// A child that ends while the write of its pid waits for the database: its end is recorded as
/// when it ended, not as when the dispatcher, once the write was answered, came to it.
#[tokio::test(start_paused = true)]
async fn an_attempt_that_ends_while_its_pid_is_written_is_recorded_ending_when_it_did() {
    let mut test = Test::new("[[step]]\nname = 'a'\nrun = ['quick']\n[[step]]\nname = 'b'\nrun = ['quick']\n");
    test.spawned_takes = secs(5);
    let ran = test.run(|_, _| exit(1, 0)).await;
    assert!(matches!(ran.result, Ok(RunOutcome::Succeeded)), "{:?}", ran.result);
    // a ends 1 s after its spawn (at 0), b 1 s after its own (at 5, when a's pid was written).
    assert_eq!(ran.ends, [(1, secs(1)), (2, secs(6))]);
}

/// A signal that reaches the runner and its child at once (Ctrl-C at a terminal, `systemctl stop`,
/// `kill -TERM -- -PGID`): the child's supervisor reports it cancelled (it ended once the signal
/// had come), before the runner has taken the signal. Here both come at 1 s while the dispatcher
/// waits for the write of the child's pid (until 3 s): the signal is taken first, so the attempt
/// is the signal's cancel (recorded with its name), the run is interrupted, and nothing starts.
/// A child that ended before the signal came keeps its own end: `b` exits 0 at 1 s, the signal
/// comes at 2 s, and `b` is recorded succeeded.
#[tokio::test(start_paused = true)]
async fn a_child_the_runner_s_signal_reached_first_is_the_signal_s_cancel() {
    let flow = "[[step]]\nname = 'a'\nrun = ['trap']\n[[step]]\nname = 'b'\nrun = ['next']\n";
    let term = Signal(nix::sys::signal::Signal::SIGTERM);
    let mut test = Test::new(flow);
    test.spawned_takes = secs(3);
    test.signals = vec![(secs(1), term)];
    let ran = test.run(|_, _| Script::Signalled(secs(1))).await;
    assert_eq!(ran.outcome(), RunOutcome::Interrupted { signal: 15 });
    assert_eq!(ran.schedule(), [("a", 1, 0.0)]);
    let signals: Vec<Option<String>> = ran
        .events
        .iter()
        .filter_map(|e| match &e.event {
            Event::AttemptFinished { signal, .. } => Some(signal.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(signals, [Some("SIGTERM".to_owned())]);
    assert_eq!(ran.attempt_finished(), [(1, AttemptEnd::Cancelled, None, None)]);
    // Ended (at 1 s) before the signal came (at 2 s), both heard once the pid is written (3 s):
    // its own end, not the signal's.
    let mut test = Test::new(flow);
    test.spawned_takes = secs(3);
    test.signals = vec![(secs(2), term)];
    let ran = test.run(|_, _| exit(1, 0)).await;
    assert_eq!(ran.outcome(), RunOutcome::Interrupted { signal: 15 });
    assert_eq!(ran.attempt_finished(), [(1, AttemptEnd::Succeeded, None, None)]);
    assert_eq!(ran.schedule(), [("a", 1, 0.0)]);
}

/// The same for a compensation: one its supervisor found cancelled by a signal the runner has not
/// taken yet is that signal's cancel, and the run is interrupted by it (its compensations go on
/// when it resumes). Each pid's write takes 3 s: `b:compensate` starts at 9 s, and both its end and the
/// signal come at 10 s, while its pid is being written.
#[tokio::test(start_paused = true)]
async fn a_compensation_the_runner_s_signal_reached_first_is_the_signal_s_cancel() {
    let mut test = Test::new(COMPENSATED);
    test.spawned_takes = secs(3);
    test.signals = vec![(secs(10), Signal(nix::sys::signal::Signal::SIGINT))];
    let ran = test
        .run(|step, _| match step {
            "c" => exit(1, 1),
            "b:compensate" => Script::Signalled(secs(1)),
            _ => exit(1, 0),
        })
        .await;
    // The signal's own number (not SIGTERM's, as a cancel with no signal heard is taken for).
    assert_eq!(ran.outcome(), RunOutcome::Interrupted { signal: 2 });
    assert_eq!(names(&ran), ["a", "b", "c", "b:compensate"]);
    assert!(ran.writes.contains(&"finished row 4 Cancelled".to_owned()), "{:?}", ran.writes);
}
