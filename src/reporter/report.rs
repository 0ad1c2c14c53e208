//! The failure report: what a person (or cron's mail) needs to know about a failed run. For each
//! step that failed for good: every attempt (this runner's from the events, an earlier runner's
//! of a resumed run from the store: [`History::prefill`]) (start time, duration, error class
//! and message, its source, whether stopping it took SIGKILL after the grace period), why
//! retrying stopped, the end of the last attempt's stdout and stderr, and its log files; then the
//! run id with what to do next. The plain and quiet reporters print it; JSON mode does not (its
//! events carry all of it).

use crate::classify::ErrorValue;
use crate::events::{AttemptEnd, EarlierAttempt, Envelope, Event, Failure, StepOutcome};
use std::collections::HashMap;
use std::fmt::Write;
use std::time::{Duration, SystemTime};

/// Lines of the last attempt's stdout and stderr repeated in the report.
pub(crate) const TAIL_LINES: usize = 10;

/// A duration for people, to the millisecond.
pub(crate) fn human(d: Duration) -> String {
    humantime::format_duration(Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))).to_string()
}

/// One attempt as this runner saw it, or as the store recorded an earlier runner's.
struct Row {
    attempt: u32,
    redelivered: bool,
    started: Option<SystemTime>,
    end: Option<RowEnd>,
    /// Made by an earlier runner of the run (it was resumed).
    earlier: bool,
}

struct RowEnd {
    duration: Duration,
    outcome: AttemptEnd,
    error: Option<ErrorValue>,
    killed_after_grace: bool,
}

/// The attempts of the steps that have not succeeded, kept from the events for the report.
#[derive(Default)]
pub(crate) struct History {
    steps: HashMap<String, Vec<Row>>,
}

impl History {
    /// Keep what `envelope` says about an attempt; a step that succeeded is forgotten.
    pub(crate) fn record(&mut self, envelope: &Envelope) {
        match &envelope.event {
            Event::AttemptStarted { step, attempt, redelivered, .. } => {
                let row = Row {
                    attempt: *attempt,
                    redelivered: *redelivered,
                    started: Some(envelope.at),
                    end: None,
                    earlier: false,
                };
                self.steps.entry(step.clone()).or_default().push(row);
            }
            Event::AttemptFinished { step, attempt, outcome, error, duration, killed_after_grace, .. } => {
                let rows = self.steps.entry(step.clone()).or_default();
                let end = RowEnd {
                    duration: *duration,
                    outcome: *outcome,
                    error: error.clone(),
                    killed_after_grace: *killed_after_grace,
                };
                match rows.last_mut() {
                    Some(row) if row.attempt == *attempt && row.end.is_none() => row.end = Some(end),
                    _ => rows.push(Row {
                        attempt: *attempt,
                        redelivered: false,
                        started: None,
                        end: Some(end),
                        earlier: false,
                    }),
                }
            }
            Event::StepFinished { step, outcome: StepOutcome::Succeeded, .. } => {
                self.steps.remove(step);
            }
            _ => {}
        }
    }

    /// Keep the attempts earlier runners made of the run, as recorded, so that the report lists
    /// them like this runner's (called before this runner's first attempt).
    pub(crate) fn prefill(&mut self, attempts: &[EarlierAttempt]) {
        for a in attempts {
            let end = a.end.map(|(ended, outcome)| RowEnd {
                duration: ended.duration_since(a.started).unwrap_or_default(),
                outcome,
                error: a.error.clone(),
                killed_after_grace: false,
            });
            let row =
                Row { attempt: a.attempt, redelivered: a.redelivered, started: Some(a.started), end, earlier: true };
            self.steps.entry(a.step.clone()).or_default().push(row);
        }
    }

    /// The report of run `run_id`, which failed with `failures`; newline-terminated.
    pub(crate) fn report(&self, run_id: &str, failures: &[Failure]) -> String {
        let mut out = format!("waymark: run {run_id} failed\n");
        for f in failures {
            self.step(&mut out, run_id, f);
        }
        let _ = writeln!(
            out,
            "  run id: {run_id} (`waymark status {run_id}` shows it; `waymark resume {run_id}` runs its failed \
             steps again with a fresh budget)"
        );
        out
    }

    fn step(&self, out: &mut String, run_id: &str, f: &Failure) {
        let _ = writeln!(out, "  step {}:", f.step);
        let rows = self.steps.get(&f.step).map(Vec::as_slice).unwrap_or_default();
        // Attempts of an earlier runner of the run (it was resumed) are not among the events.
        let first_seen = rows.first().map_or(f.last_attempt + 1, |r| r.attempt);
        match first_seen {
            0 | 1 => {}
            2 => {
                let _ = writeln!(
                    out,
                    "    attempt 1: run before this runner (`waymark logs {run_id} {} --attempt 1`)",
                    f.step
                );
            }
            n => {
                let _ = writeln!(
                    out,
                    "    attempts 1 to {}: run before this runner (`waymark logs {run_id} {} --attempt N`)",
                    n - 1,
                    f.step
                );
            }
        }
        for row in rows {
            let _ = writeln!(out, "    {}", describe(row));
        }
        // The error the step failed with, unless its last attempt's line said it.
        let said = rows.last().and_then(|r| r.end.as_ref()).and_then(|e| e.error.as_ref());
        if said != Some(&f.error) {
            let _ = writeln!(out, "    error: {} [{}]", f.error, f.error.source.describe());
        }
        let _ = writeln!(out, "    {}", f.stopped.explain(&f.error));
        if f.last_attempt == 0 {
            return;
        }
        for (name, tail) in [("stdout", &f.stdout_tail), ("stderr", &f.stderr_tail)] {
            let lines: Vec<&str> = tail.lines().collect();
            if lines.is_empty() {
                let _ = writeln!(out, "    {name} of attempt {}: nothing", f.last_attempt);
                continue;
            }
            let _ = writeln!(out, "    {name} of attempt {}, last lines:", f.last_attempt);
            for line in &lines[lines.len().saturating_sub(TAIL_LINES)..] {
                let _ = writeln!(out, "      {line}");
            }
        }
        let _ = writeln!(out, "    logs: {}", f.stdout_log.display());
        let _ = writeln!(out, "          {}", f.stderr_log.display());
    }
}

/// An attempt's line in the report.
fn describe(row: &Row) -> String {
    let again = match (row.redelivered, row.earlier) {
        (true, true) => " (redelivered, by an earlier runner)",
        (false, true) => " (by an earlier runner)",
        (true, false) => " (redelivered)",
        (false, false) => "",
    };
    let mut text = format!("attempt {}{again}:", row.attempt);
    if let Some(at) = row.started {
        let _ = write!(text, " started {},", humantime::format_rfc3339_seconds(at));
    }
    let Some(end) = &row.end else {
        text.push_str(if row.earlier { " its runner died before it ended" } else { " did not end in this runner" });
        return text;
    };
    let _ = write!(text, " took {}: ", human(end.duration));
    match (&end.outcome, &end.error) {
        (AttemptEnd::Failed, Some(e)) => {
            let _ = write!(text, "{e} [{}]", e.source.describe());
        }
        (AttemptEnd::Failed, None) => text.push_str("failed"),
        (AttemptEnd::Succeeded, _) => text.push_str("succeeded"),
        (AttemptEnd::Cancelled, _) => text.push_str("cancelled"),
    }
    if end.killed_after_grace {
        text.push_str("; still running after the grace period, so killed with SIGKILL");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::ErrorSource;
    use crate::events::{RetryStop, StopReason};
    use std::time::UNIX_EPOCH;

    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(1_767_323_045_000 + ms)
    }

    fn error(class: &str, message: &str, source: ErrorSource) -> ErrorValue {
        let tree = crate::classify::classes::ClassTree::default();
        ErrorValue {
            class: class.into(),
            bases: tree.bases(class).unwrap_or_default(),
            message: message.into(),
            source,
        }
    }

    fn envelope(ms: u64, event: Event) -> Envelope {
        Envelope { seq: 1, at: at(ms), run_id: Some("r1".into()), event }
    }

    fn finished(step: &str, attempt: u32, error: ErrorValue, ms: u64, killed: bool) -> Event {
        Event::AttemptFinished {
            step: step.into(),
            attempt,
            max_attempts: 3,
            outcome: AttemptEnd::Failed,
            error: Some(error),
            duration: Duration::from_millis(ms),
            retry: None,
            stopped: None,
            exit_code: None,
            signal: None,
            killed_after_grace: killed,
        }
    }

    fn started(step: &str, attempt: u32, redelivered: bool) -> Event {
        Event::AttemptStarted { step: step.into(), attempt, max_attempts: 3, pid: Some(9), redelivered, timeout: None }
    }

    fn failure(step: &str, error: ErrorValue, stopped: RetryStop, last_attempt: u32) -> Failure {
        Failure {
            step: step.into(),
            error,
            stopped,
            last_attempt,
            stdout_tail: (1..=12).map(|i| format!("row {i}\n")).collect(),
            stderr_tail: String::new(),
            stdout_log: format!("/s/logs/r1/{step}/attempt-{last_attempt}.stdout").into(),
            stderr_log: format!("/s/logs/r1/{step}/attempt-{last_attempt}.stderr").into(),
            log_dir: format!("/s/logs/r1/{step}").into(),
        }
    }

    #[test]
    fn the_report_has_every_attempt_why_it_stopped_the_tails_and_the_logs() {
        let mut history = History::default();
        let reset = error("ConnectionResetError", "peer reset", ErrorSource::Traceback);
        let timeout = error("ActionTimeout", "timed out after 1s", ErrorSource::Timeout);
        let events = [
            envelope(0, started("fetch", 1, false)),
            envelope(250, finished("fetch", 1, reset.clone(), 250, false)),
            envelope(1250, started("fetch", 2, false)),
            envelope(3250, finished("fetch", 2, timeout.clone(), 2000, true)),
            envelope(3300, started("ok", 1, false)),
            envelope(3400, Event::StepFinished { step: "ok".into(), outcome: StepOutcome::Succeeded, attempts: 1 }),
        ];
        for e in &events {
            history.record(e);
        }
        let stopped = RetryStop {
            reason: StopReason::NotRetryable,
            exception_types: vec!["ConnectionError".into()],
            attempts: 2,
            attempts_allowed: 3,
        };
        let report = history.report("r1", &[failure("fetch", timeout, stopped, 2)]);
        assert_eq!(
            report,
            "waymark: run r1 failed\n  \
             step fetch:\n    \
             attempt 1: started 2026-01-02T03:04:05Z, took 250ms: ConnectionResetError(ConnectionError, OSError, \
             Exception, BaseException): peer reset [traceback]\n    \
             attempt 2: started 2026-01-02T03:04:06Z, took 2s: ActionTimeout(BaseException): timed out after 1s \
             [timeout]; still running after the grace period, so killed with SIGKILL\n    \
             not retried: timeouts are not retried unless ActionTimeout is listed (exception_types is \
             [\"ConnectionError\"])\n    \
             stdout of attempt 2, last lines:\n      \
             row 3\n      row 4\n      row 5\n      row 6\n      row 7\n      row 8\n      row 9\n      row 10\n      \
             row 11\n      row 12\n    \
             stderr of attempt 2: nothing\n    \
             logs: /s/logs/r1/fetch/attempt-2.stdout\n          \
             /s/logs/r1/fetch/attempt-2.stderr\n  \
             run id: r1 (`waymark status r1` shows it; `waymark resume r1` runs its failed steps again with a \
             fresh budget)\n"
        );
    }

    #[test]
    fn attempts_of_an_earlier_runner_and_an_error_no_attempt_said_are_named() {
        let mut history = History::default();
        let value = error("ValueError", "bad", ErrorSource::Traceback);
        history.record(&envelope(0, started("load", 3, true)));
        history.record(&envelope(5, finished("load", 3, value.clone(), 5, false)));
        let deadline = error("WorkflowTimeout", "the workflow's timeout of 10s passed", ErrorSource::Timeout);
        let stopped =
            RetryStop { reason: StopReason::NotRetryable, exception_types: vec![], attempts: 3, attempts_allowed: 5 };
        let mut f = failure("load", deadline, stopped, 3);
        f.stdout_tail.clear();
        let report = history.report("r1", &[f]);
        let body: Vec<&str> = report.lines().skip(1).take(5).collect();
        assert_eq!(
            body,
            [
                "  step load:",
                "    attempts 1 to 2: run before this runner (`waymark logs r1 load --attempt N`)",
                "    attempt 3 (redelivered): started 2026-01-02T03:04:05Z, took 5ms: ValueError(Exception, \
                 BaseException): bad [traceback]",
                "    error: WorkflowTimeout(BaseException): the workflow's timeout of 10s passed [timeout]",
                "    not retried: the workflow's timeout passed, and no policy retries WorkflowTimeout",
            ]
        );
    }
}
