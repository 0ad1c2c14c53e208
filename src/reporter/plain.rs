//! Line-oriented output, for a terminal that is not one (a CI log, a pipe) or `--progress plain`:
//! waymark's own lines on stderr, one per event, each behind the local time of day and
//! `waymark:`; the children's lines behind their step's name, as `--output` chooses; at the end a
//! summary table of the steps, and the failure report when the run failed. No colors, no carriage
//! returns: what is written is never rewritten.
//!
//! ```text
//! 12:03:04.500 waymark: date 2026-12-01 (UTC+01:00)
//! 12:03:04.500 waymark: run cv0dna4k of retry-demo: 2 step(s)
//! 12:03:04.511 waymark: fetch: started
//! 12:03:04.512 waymark: fetch: attempt 1/4 started (pid 4242)
//! fetch | upstream busy
//! 12:03:04.530 waymark: fetch: attempt 1/4 failed: UpstreamBusy: exit status 75 [exit code mapping]
//! 12:03:04.530 waymark: fetch: retry at 12:03:04.730 (in 200ms): attempt 2/4
//! ```

use super::local_time::LocalTime;
use super::output_filter::{OutputFilter, OutputMode, Pass};
use super::report::{History, brief, human};
use super::terminal::{Dropped, Terminal, close_for_run};
use crate::events::{
    AbandonReason, AttemptEnd, Envelope, Event, NoticeKind, Reporter, RunOutcome, SkipReason, StepOutcome, Stream,
};
use crate::executor::Chunk;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Child output on the display, waymark's own lines on stderr. Child output that a terminal
/// stream is too far behind to take is dropped from the display (never from the logs), and a
/// warning says how much, so a stalled terminal never holds up the children, their timeouts or
/// the runner's signals.
pub(crate) struct PlainReporter {
    terminal: Terminal,
    /// The run of the latest event, for the hint about where the logs are.
    run_id: std::sync::Arc<str>,
    /// Child output not shown, per step and stream, since it was last reported.
    dropped: Dropped,
    /// The steps and attempts, for the summary table and the failure report.
    history: History,
    /// Which child output is shown.
    filter: OutputFilter,
    /// The local time of the lines.
    clock: LocalTime,
}

impl PlainReporter {
    pub(crate) fn new(output: OutputMode) -> PlainReporter {
        PlainReporter::with_clock(output, LocalTime::system())
    }

    fn with_clock(output: OutputMode, clock: LocalTime) -> PlainReporter {
        PlainReporter {
            terminal: Terminal::open_holding(),
            run_id: std::sync::Arc::default(),
            dropped: Dropped::default(),
            history: History::default(),
            filter: OutputFilter::new(output),
            clock,
        }
    }

    /// Waymark's own `text` (newline-terminated, one line or more), its first line behind the
    /// time `at`; the date first when it is new.
    fn line(&mut self, at: SystemTime, text: &str) {
        let stamped = stamp(&mut self.clock, at, text);
        self.terminal.say(stamped);
    }

    /// Say how much output of `step` (of every step when `None`) was not shown.
    fn report_drops(&mut self, at: SystemTime, step: Option<&str>) {
        for text in self.dropped.take_warnings(step, &self.run_id) {
            self.line(at, &text);
        }
    }

    /// Show a child's lines, each behind its step's name.
    fn output(&mut self, step: &str, stream: Stream, chunk: Arc<Chunk>) {
        let len = chunk.len();
        if !self.terminal.sink(stream).output_behind(step, chunk) {
            self.dropped.add(step, stream, len);
        }
    }

    /// Show what the output filter lets through now.
    fn show(&mut self, at: SystemTime, passed: Vec<Pass>) {
        for pass in passed {
            match pass {
                Pass::Chunk { step, stream, chunk } => self.output(&step, stream, chunk),
                omitted @ Pass::Omitted { .. } => {
                    if let Some(text) = omitted.omitted_line(&self.run_id) {
                        self.line(at, &text);
                    }
                }
            }
        }
    }

    /// The end of the run: the summary table, then how it ended.
    fn finish(&mut self, envelope: &Envelope, outcome: RunOutcome, failures: &[crate::events::Failure]) {
        let at = envelope.at;
        self.report_drops(at, None);
        for text in ending(&self.history, &self.run_id, envelope, outcome, failures) {
            self.line(at, &text);
        }
    }
}

/// What ends a run shown in plain or live mode, each newline-terminated: the summary table
/// (when a step was heard of), then how the run ended (the failure report when it failed).
pub(super) fn ending(
    history: &History,
    run: &str,
    envelope: &Envelope,
    outcome: RunOutcome,
    failures: &[crate::events::Failure],
) -> Vec<String> {
    let mut texts = Vec::with_capacity(2);
    let table = history.summary_table(envelope.at);
    if !table.is_empty() {
        texts.push(format!("waymark: steps of run {run}:\n{table}"));
    }
    texts.push(match outcome {
        RunOutcome::Failed => history.report(run, failures),
        RunOutcome::Succeeded => {
            let took = match &envelope.event {
                Event::RunFinished { duration, .. } => human(*duration),
                _ => String::new(),
            };
            format!("waymark: run {run} succeeded in {took}\n")
        }
        RunOutcome::Interrupted { .. } => format!("waymark: run {run} interrupted; `waymark run` again resumes it\n"),
    });
    texts
}

/// `text` with its first line behind the local time of `at`, preceded by the date when the
/// date (or the offset from UTC) is not the one last said.
fn stamp(clock: &mut LocalTime, at: SystemTime, text: &str) -> String {
    let (time, day) = clock.stamp(at);
    let date = day.map(|day| format!("{time} waymark: date {day}\n")).unwrap_or_default();
    format!("{date}{time} {text}")
}

impl Drop for PlainReporter {
    fn drop(&mut self) {
        close_for_run(&mut self.terminal, &self.run_id);
    }
}

impl Reporter for PlainReporter {
    fn earlier(&mut self, earlier: &crate::events::Earlier) {
        self.history.prefill(earlier);
    }

    fn flow(&mut self, path: &std::path::Path, fail_fast: bool) {
        self.history.set_flow(path, fail_fast);
    }

    fn shows_output(&self) -> bool {
        self.filter.shows_any()
    }

    fn output_gate(&self) -> Option<Arc<crate::executor::OutputGate>> {
        self.terminal.output_gate()
    }

    fn report(&mut self, envelope: &Envelope) {
        if let Some(run_id) = &envelope.run_id {
            self.run_id.clone_from(run_id);
        }
        self.history.record(envelope);
        let at = envelope.at;
        // A failed attempt's held output comes before the line that says it failed.
        let passed = self.filter.pass(envelope);
        self.show(at, passed);
        match &envelope.event {
            Event::Output { .. } => return,
            Event::AttemptFinished { step, outcome: AttemptEnd::Succeeded | AttemptEnd::Failed, .. } => {
                self.report_drops(at, Some(step));
            }
            Event::RunFinished { outcome, failures, .. } => {
                self.finish(envelope, *outcome, failures);
                return;
            }
            _ => {}
        }
        if let Some(text) = describe(envelope, &self.clock, &self.history) {
            self.line(at, &text);
        }
    }
}

/// A run's age for a message: whole seconds, or milliseconds under a second.
fn readable(age: Duration) -> Duration {
    if age.as_secs() > 0 { Duration::from_secs(age.as_secs()) } else { age }
}

/// Waymark's own line for an event, newline-terminated, without its time; `None` for the events
/// that have no line (a step's turn, which its start follows; hooks, which say something only
/// when they fail; the run's end, which [`PlainReporter::finish`] says).
pub(super) fn describe(envelope: &Envelope, clock: &LocalTime, history: &super::report::History) -> Option<String> {
    let run_id = envelope.run_id.as_deref().unwrap_or_default();
    let text = match &envelope.event {
        Event::RunStarted { flow, steps_total } => format!("waymark: run {run_id} of {flow}: {steps_total} step(s)"),
        Event::RunResumed { flow, steps_total, steps_done } => {
            format!("waymark: resuming run {run_id} of {flow}: {steps_done} of {steps_total} steps done")
        }
        Event::RunAbandoned { reason: AbandonReason::Fresh, .. } => {
            format!("waymark: abandoned unfinished run {run_id}")
        }
        Event::RunAbandoned { flow, file, reason: AbandonReason::Stale { age, limit, reopened } } => format!(
            "waymark: abandoned unfinished run {run_id} of flow `{flow}`: it {} {} ago, longer than \
             resume_within = {} in {}; starting a new run (`waymark status {run_id}` shows the abandoned one)",
            if *reopened { "was reopened by `waymark resume`" } else { "started" },
            humantime::format_duration(readable(*age)),
            humantime::format_duration(*limit),
            file.display(),
        ),
        Event::StepSkipped { step, reason: SkipReason::AlreadySucceeded } => {
            format!("waymark: {step}: already succeeded, skipped")
        }
        Event::StepSkipped { step, reason: SkipReason::AlreadyCaught } => {
            format!("waymark: {step}: error already caught, skipped")
        }
        Event::StepSkipped { step, reason: SkipReason::AlreadyFailed } => {
            format!("waymark: {step}: already failed, not run again")
        }
        // A step that had run is not run again (its retry waited, or an earlier runner's attempt
        // did not finish).
        Event::StepSkipped { step, reason: SkipReason::RunFailed } if history.ran(step) => {
            format!("waymark: {step}: not run again: the run failed first")
        }
        Event::StepSkipped { step, reason: SkipReason::DeadlinePassed } if history.ran(step) => {
            format!("waymark: {step}: not run again: the workflow's deadline passed")
        }
        Event::StepSkipped { step, reason: SkipReason::RunFailed } => {
            format!("waymark: {step}: not run: the run failed first")
        }
        Event::StepSkipped { step, reason: SkipReason::DeadlinePassed } => {
            format!("waymark: {step}: not run: the workflow's deadline passed")
        }
        // Cancelled: said as an attempt's cancel is (their other ends are said by their warnings,
        // or need no line).
        Event::HandlerFinished { step, outcome: AttemptEnd::Cancelled, signal, .. } => match signal {
            Some(s) => format!("waymark: {step}: its catch handler was cancelled by {s}; it runs again on resume"),
            None => format!("waymark: {step}: its catch handler was cancelled by fail_fast; its error is not handled"),
        },
        Event::AuxFinished { kind, name, outcome: AttemptEnd::Cancelled, signal, .. } => {
            let by = signal.as_deref().unwrap_or("a signal");
            match kind {
                crate::store::AuxKind::Compensate => {
                    format!("waymark: {name}: its compensation was cancelled by {by}; it runs again on resume")
                }
                crate::store::AuxKind::Hook => {
                    format!("waymark: hook {name} cancelled by {by}; it runs again on resume")
                }
            }
        }
        Event::StepReady { .. }
        | Event::HandlerFinished { .. }
        | Event::AuxStarted { kind: crate::store::AuxKind::Hook, .. }
        | Event::AuxFinished { .. }
        | Event::Output { .. }
        | Event::RunFinished { .. } => return None,
        Event::StepStarted { step } => format!("waymark: {step}: started"),
        Event::StepWaiting { step, next_attempt, max_attempts, retry } => {
            if retry.delay.is_zero() {
                format!("waymark: {step}: retry now: attempt {next_attempt}/{max_attempts}")
            } else {
                format!(
                    "waymark: {step}: retry at {} (in {}): attempt {next_attempt}/{max_attempts}",
                    clock.later(retry.wake_at, envelope.at),
                    human(retry.delay)
                )
            }
        }
        Event::RetryStopped { step, error, stop, .. } => format!("waymark: {step}: {}", stop.explain(error)),
        Event::StepFinished { step, outcome: StepOutcome::Succeeded, attempts } => {
            format!("waymark: {step}: succeeded ({})", attempts_used(*attempts))
        }
        Event::StepFinished { step, outcome: StepOutcome::Failed, attempts } => {
            format!("waymark: {step}: failed ({})", attempts_used(*attempts))
        }
        Event::StepFinished { step, outcome: StepOutcome::Caught, .. } => {
            format!("waymark: {step}: error caught; the steps that need it run")
        }
        Event::AuxStarted { kind: crate::store::AuxKind::Compensate, name, .. } => {
            format!("waymark: {name}: compensating (the run failed)")
        }
        Event::HandlerStarted { step, error, .. } => format!("waymark: {step}: running its catch handler for {error}"),
        Event::AttemptStarted { step, attempt, max_attempts, pid, redelivered, .. } => {
            let process = match pid {
                Some(pid) => format!("pid {pid}"),
                None => "no process".to_owned(),
            };
            let again = if *redelivered { ", redelivered" } else { "" };
            format!("waymark: {step}: attempt {attempt}/{max_attempts} started ({process}{again})")
        }
        Event::AttemptFinished { step, attempt, max_attempts, outcome, error, signal, killed_after_grace, .. } => {
            let mut text = match outcome {
                AttemptEnd::Succeeded => {
                    format!("waymark: {step}: attempt {attempt}/{max_attempts} succeeded")
                }
                AttemptEnd::Failed => {
                    let error =
                        error.as_ref().map(|e| format!(": {} [{}]", brief(e), e.source.describe())).unwrap_or_default();
                    format!("waymark: {step}: attempt {attempt}/{max_attempts} failed{error}")
                }
                // By a signal to the runner: the run is interrupted, and resumes. Without one, by
                // `fail_fast`: the run fails, and whether it can be resumed (not once its
                // compensations ran) its end says.
                AttemptEnd::Cancelled => match signal {
                    Some(s) => {
                        format!(
                            "waymark: {step}: attempt {attempt}/{max_attempts} cancelled by {s}; it runs again on resume"
                        )
                    }
                    None => format!("waymark: {step}: attempt {attempt}/{max_attempts} cancelled by fail_fast"),
                },
            };
            if *killed_after_grace {
                text.push_str("; still running after the grace period, so killed with SIGKILL");
            }
            text
        }
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
                format!("waymark: got {name}, a second signal: killing running steps")
            } else {
                format!("waymark: got {name}, stopping running steps (send it again to kill them)")
            }
        }
    };
    Some(text + "\n")
}

/// `1 attempt`, `3 attempts`.
fn attempts_used(n: u32) -> String {
    if n == 1 { "1 attempt".to_owned() } else { format!("{n} attempts") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{RetryPlan, StepOutcome};
    use std::time::SystemTime;

    fn line(run_id: Option<&str>, event: Event) -> Option<String> {
        let envelope = Envelope { seq: 1, at: SystemTime::UNIX_EPOCH, run_id: run_id.map(Into::into), event };
        describe(&envelope, &LocalTime::new(jiff::tz::TimeZone::UTC), &crate::reporter::report::History::default())
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
        let stale = |reopened| AbandonReason::Stale {
            age: Duration::from_millis(7_200_900),
            limit: Duration::from_secs(3600),
            reopened,
        };
        assert_eq!(
            line(Some("old"), abandoned(stale(false))).as_deref(),
            Some(
                "waymark: abandoned unfinished run old of flow `nightly`: it started 2h ago, longer than \
                 resume_within = 1h in n.toml; starting a new run (`waymark status old` shows the abandoned one)\n"
            )
        );
        // A failed run that `waymark resume` reopened counts from then.
        assert_eq!(
            line(Some("old"), abandoned(stale(true))).as_deref(),
            Some(
                "waymark: abandoned unfinished run old of flow `nightly`: it was reopened by `waymark resume` 2h ago, \
                 longer than resume_within = 1h in n.toml; starting a new run (`waymark status old` shows the \
                 abandoned one)\n"
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

    fn attempt_finished(outcome: AttemptEnd, error: Option<crate::classify::ErrorValue>) -> Event {
        Event::AttemptFinished {
            step: "fetch".into(),
            attempt: 1,
            max_attempts: 4,
            outcome,
            error,
            duration: Duration::from_millis(18),
            retry: None,
            stopped: None,
            exit_code: None,
            signal: None,
            killed_after_grace: false,
        }
    }

    #[test]
    fn each_step_and_attempt_event_has_its_line() {
        let step = || "fetch".to_owned();
        let busy = crate::classify::ErrorValue {
            class: "UpstreamBusy".into(),
            bases: vec!["ConnectionError".into(), "OSError".into(), "Exception".into(), "BaseException".into()],
            message: "exit status 75".into(),
            source: crate::classify::ErrorSource::ExitCodeMapping,
        };
        let wake = |ms| RetryPlan {
            delay: Duration::from_millis(ms),
            wake_at: SystemTime::UNIX_EPOCH + Duration::from_millis(ms),
        };
        let mut killed = attempt_finished(AttemptEnd::Failed, Some(busy.clone()));
        if let Event::AttemptFinished { killed_after_grace, .. } = &mut killed {
            *killed_after_grace = true;
        }
        let mut cancelled = attempt_finished(AttemptEnd::Cancelled, None);
        if let Event::AttemptFinished { signal, .. } = &mut cancelled {
            *signal = Some("SIGINT".into());
        }
        let stop = crate::events::RetryStop {
            reason: crate::events::StopReason::Exhausted,
            exception_types: vec!["ConnectionError".into()],
            attempts: 4,
            attempts_allowed: 4,
        };
        let cases = [
            (Event::StepStarted { step: step() }, "waymark: fetch: started"),
            (
                Event::AttemptStarted {
                    step: step(),
                    attempt: 1,
                    max_attempts: 4,
                    pid: Some(4242),
                    redelivered: false,
                    timeout: None,
                },
                "waymark: fetch: attempt 1/4 started (pid 4242)",
            ),
            (
                Event::AttemptStarted {
                    step: step(),
                    attempt: 2,
                    max_attempts: 4,
                    pid: None,
                    redelivered: true,
                    timeout: None,
                },
                "waymark: fetch: attempt 2/4 started (no process, redelivered)",
            ),
            (
                attempt_finished(AttemptEnd::Failed, Some(busy.clone())),
                "waymark: fetch: attempt 1/4 failed: UpstreamBusy: exit status 75 [exit code mapping]",
            ),
            (
                killed,
                "waymark: fetch: attempt 1/4 failed: UpstreamBusy: exit status 75 [exit code mapping]; \
                 still running after the grace period, so killed with SIGKILL",
            ),
            (attempt_finished(AttemptEnd::Succeeded, None), "waymark: fetch: attempt 1/4 succeeded"),
            (cancelled, "waymark: fetch: attempt 1/4 cancelled by SIGINT; it runs again on resume"),
            (attempt_finished(AttemptEnd::Cancelled, None), "waymark: fetch: attempt 1/4 cancelled by fail_fast"),
            (
                Event::StepWaiting { step: step(), next_attempt: 2, max_attempts: 4, retry: wake(200) },
                "waymark: fetch: retry at 00:00:00.200 (in 200ms): attempt 2/4",
            ),
            (
                Event::StepWaiting { step: step(), next_attempt: 2, max_attempts: 4, retry: wake(0) },
                "waymark: fetch: retry now: attempt 2/4",
            ),
            (
                Event::StepWaiting { step: step(), next_attempt: 3, max_attempts: 4, retry: wake(90_000_000) },
                "waymark: fetch: retry at 1970-01-02 01:00:00.000 (in 1day 1h): attempt 3/4",
            ),
            (
                Event::RetryStopped { step: step(), attempt: 4, error: busy, stop },
                "waymark: fetch: budget spent: 4 of 4 attempts",
            ),
            (
                Event::StepFinished { step: step(), outcome: StepOutcome::Succeeded, attempts: 3 },
                "waymark: fetch: succeeded (3 attempts)",
            ),
            (
                Event::StepFinished { step: step(), outcome: StepOutcome::Failed, attempts: 1 },
                "waymark: fetch: failed (1 attempt)",
            ),
            (
                Event::StepSkipped { step: step(), reason: SkipReason::AlreadyFailed },
                "waymark: fetch: already failed, not run again",
            ),
            (
                Event::StepSkipped { step: step(), reason: SkipReason::RunFailed },
                "waymark: fetch: not run: the run failed first",
            ),
            (
                Event::StepSkipped { step: step(), reason: SkipReason::DeadlinePassed },
                "waymark: fetch: not run: the workflow's deadline passed",
            ),
        ];
        for (event, expected) in cases {
            assert_eq!(line(Some("r1"), event), Some(format!("{expected}\n")));
        }
    }

    #[test]
    fn events_without_a_line_of_their_own_print_nothing() {
        let silent = [
            Event::StepReady { step: "a".into() },
            Event::RunFinished { outcome: RunOutcome::Succeeded, duration: Duration::ZERO, failures: vec![] },
            Event::RunAborted { error: "disk full".into() },
        ];
        for event in silent {
            let shown = format!("{event:?}");
            assert_eq!(line(Some("r1"), event), None, "{shown}");
        }
    }

    #[test]
    fn a_line_has_the_local_time_and_the_date_before_it_when_the_date_is_new() {
        let mut clock = LocalTime::new(jiff::tz::TimeZone::fixed(jiff::tz::Offset::constant(1)));
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(82_800_000 - 1500);
        assert_eq!(
            stamp(&mut clock, at, "waymark: a\n"),
            "23:59:58.500 waymark: date 1970-01-01 (UTC+01:00)\n23:59:58.500 waymark: a\n"
        );
        assert_eq!(stamp(&mut clock, at, "waymark: b\n  more\n"), "23:59:58.500 waymark: b\n  more\n");
        assert_eq!(
            stamp(&mut clock, at + Duration::from_secs(2), "waymark: c\n"),
            "00:00:00.500 waymark: date 1970-01-02 (UTC+01:00)\n00:00:00.500 waymark: c\n"
        );
    }
}
