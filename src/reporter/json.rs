//! `--json`: one JSON object per event on stdout (JSON Lines), for scripts. Every object has
//! `event` (a dotted name), `ts` (RFC 3339 in UTC, to the millisecond), `seq` (1, 2, 3, … of the
//! lines written, without gaps) and `run_id`, then the fields of its kind; README.md's table is the schema, and
//! `tests/fixtures/json/` pins it. Child output goes only to the logs. Nothing of the run is
//! written to stderr: only what is not an event (the flow file's diagnostics before the run, the
//! command's own error at its end, a note that stdout could not be written).

use super::terminal::Terminal;
use crate::classify::{ErrorSource, ErrorValue};
use crate::events::{
    AbandonReason, AttemptEnd, Envelope, Event, NoticeKind, Reporter, RunOutcome, SkipReason, StepOutcome, StopReason,
};
use crate::store::AuxKind;
use serde::Serialize;

pub(crate) struct JsonReporter {
    terminal: Terminal,
    run_id: std::sync::Arc<str>,
    /// Lines written so far: the stream numbers its own lines (child output, which it leaves
    /// out, has numbers among the events), so that a gap in it always means a lost line.
    written: u64,
}

impl JsonReporter {
    pub(crate) fn new() -> JsonReporter {
        JsonReporter { terminal: Terminal::open(), run_id: std::sync::Arc::default(), written: 0 }
    }
}

impl Reporter for JsonReporter {
    /// Children's output is in the logs, not in the event stream.
    fn shows_output(&self) -> bool {
        false
    }

    /// The stream has no failure report: what earlier runners did is in their runs' events.
    fn wants_earlier(&self) -> bool {
        false
    }

    fn report(&mut self, envelope: &Envelope) {
        if let Some(run_id) = &envelope.run_id {
            self.run_id.clone_from(run_id);
        }
        let Some(mut line) = wire(envelope) else { return };
        self.written += 1;
        line.seq = self.written;
        // Writing these types cannot fail (string keys, no maps of other keys). Most lines fit
        // the first allocation.
        let mut text = Vec::with_capacity(256);
        if line.write(&mut text).is_ok() {
            text.push(b'\n');
            self.terminal.sink(crate::events::Stream::Stdout).line(text);
        }
    }
}

impl Drop for JsonReporter {
    fn drop(&mut self) {
        let run = &self.run_id;
        self.terminal.close(
            &format!("the rest of the events were not written there (`waymark status {run}` shows the run)"),
            &format!("the events from then on were not written there (`waymark status {run}` shows the run)"),
        );
    }
}

/// One line of the stream.
pub(crate) struct Line<'a> {
    event: &'static str,
    ts: std::time::SystemTime,
    seq: u64,
    run_id: Option<&'a str>,
    fields: Fields<'a>,
}

impl Line<'_> {
    /// The line's JSON object, appended to `out`: the four common fields, then the kind's own.
    ///
    /// The common fields' keys, the event's name and the time are written as they are: none
    /// has a character JSON escapes (the names are the literals in [`wire`], the time is
    /// [`crate::events::with_rfc3339`]'s). serde_json writes the rest, the kind's fields as an
    /// object whose braces are this one's. Escaping every key and value, and serde's
    /// `flatten`, took half the instructions of a line (a resumed run writes one per step done).
    fn write(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        out.extend_from_slice(b"{\"event\":\"");
        out.extend_from_slice(self.event.as_bytes());
        out.extend_from_slice(b"\",\"ts\":\"");
        crate::events::with_rfc3339(&self.ts, |ts| out.extend_from_slice(ts.as_bytes()));
        out.extend_from_slice(b"\",\"seq\":");
        serde_json::to_writer(&mut *out, &self.seq)?;
        out.extend_from_slice(b",\"run_id\":");
        serde_json::to_writer(&mut *out, &self.run_id)?;
        // The kind's object continues this one: its `{` becomes the `,` after `run_id`, and its
        // `}` closes the line. Every kind has a field (the golden file has a line of each kind,
        // and a test reads each as JSON).
        let fields = out.len();
        serde_json::to_writer(&mut *out, &self.fields)?;
        debug_assert!(out.len() > fields + 2, "a kind of line without a field: {}", self.event);
        out[fields] = b',';
        Ok(())
    }

    /// The line as text, without its newline.
    #[cfg(test)]
    fn text(&self) -> String {
        let mut out = Vec::new();
        self.write(&mut out).expect("a line is written");
        String::from_utf8(out).expect("a line is UTF-8")
    }
}

/// An error as the stream shows it.
#[derive(Serialize)]
struct Error<'a> {
    #[serde(rename = "type")]
    class: &'a str,
    bases: &'a [String],
    message: &'a str,
    source: ErrorSource,
}

impl<'a> From<&'a ErrorValue> for Error<'a> {
    fn from(e: &'a ErrorValue) -> Self {
        Error { class: &e.class, bases: &e.bases, message: &e.message, source: e.source }
    }
}

/// The fields of each kind of line, after the four every line has.
#[derive(Serialize)]
#[serde(untagged)]
enum Fields<'a> {
    RunStarted {
        flow: &'a str,
        steps_total: usize,
    },
    RunResumed {
        flow: &'a str,
        steps_total: usize,
        steps_done: usize,
    },
    RunAbandoned {
        flow: &'a str,
        file: String,
        reason: &'static str,
        age_ms: Option<u64>,
        resume_within_ms: Option<u64>,
    },
    RunFinished {
        status: &'static str,
        duration_ms: u64,
        signal: Option<&'static str>,
        failed_steps: Vec<&'a str>,
    },
    RunAborted {
        error: &'a str,
    },
    RunCancelling {
        signal: Option<&'static str>,
        forced: bool,
    },
    Step {
        step: &'a str,
    },
    StepSkipped {
        step: &'a str,
        reason: SkipReason,
    },
    StepFinished {
        step: &'a str,
        status: StepOutcome,
        attempts: u32,
    },
    AttemptStarted {
        step: &'a str,
        attempt: u32,
        max_attempts: u32,
        pid: Option<u32>,
        redelivered: bool,
    },
    AttemptFinished {
        step: &'a str,
        attempt: u32,
        max_attempts: u32,
        outcome: AttemptEnd,
        exit_code: Option<i32>,
        signal: Option<&'a str>,
        error: Option<Error<'a>>,
        duration_ms: u64,
        killed_after_grace: bool,
    },
    RetryScheduled {
        step: &'a str,
        attempt: u32,
        wake_at: String,
        delay_ms: u64,
    },
    RetryStopped {
        step: &'a str,
        attempt: u32,
        reason: StopReason,
        message: String,
    },
    Notice {
        kind: NoticeKind,
        step: Option<&'a str>,
        message: &'a str,
    },
    HandlerStarted {
        step: &'a str,
        attempt: u32,
        error: &'a str,
        pid: Option<u32>,
    },
    HandlerFinished {
        step: &'a str,
        attempt: u32,
        outcome: AttemptEnd,
        duration_ms: u64,
    },
    Compensation {
        step: &'a str,
        pid: Option<u32>,
    },
    CompensationFinished {
        step: &'a str,
        outcome: AttemptEnd,
        duration_ms: u64,
    },
    Hook {
        hook: &'a str,
        pid: Option<u32>,
    },
    HookFinished {
        hook: &'a str,
        outcome: AttemptEnd,
        duration_ms: u64,
    },
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn signal_name(number: i32) -> Option<&'static str> {
    crate::flow::Signal::from_number(number).map(|s| s.name())
}

/// The line of an event; `None` for child output, which goes only to the logs.
pub(crate) fn wire(envelope: &Envelope) -> Option<Line<'_>> {
    let (event, fields) = match &envelope.event {
        Event::RunStarted { flow, steps_total } => {
            ("run.started", Fields::RunStarted { flow, steps_total: *steps_total })
        }
        Event::RunResumed { flow, steps_total, steps_done } => {
            ("run.resumed", Fields::RunResumed { flow, steps_total: *steps_total, steps_done: *steps_done })
        }
        Event::RunAbandoned { flow, file, reason } => {
            let (reason, age_ms, resume_within_ms) = match reason {
                AbandonReason::Fresh => ("fresh", None, None),
                AbandonReason::Stale { age, limit, .. } => ("stale", Some(millis(*age)), Some(millis(*limit))),
            };
            let file = file.display().to_string();
            ("run.abandoned", Fields::RunAbandoned { flow, file, reason, age_ms, resume_within_ms })
        }
        Event::RunFinished { outcome, duration, failures } => {
            let (status, signal) = match outcome {
                RunOutcome::Succeeded => ("succeeded", None),
                RunOutcome::Failed => ("failed", None),
                RunOutcome::Interrupted { signal } => ("interrupted", signal_name(*signal)),
            };
            let failed_steps = failures.iter().map(|f| f.step.as_str()).collect();
            ("run.finished", Fields::RunFinished { status, duration_ms: millis(*duration), signal, failed_steps })
        }
        Event::RunAborted { error } => ("run.aborted", Fields::RunAborted { error }),
        Event::Cancelling { signal, forced } => {
            ("run.cancelling", Fields::RunCancelling { signal: signal_name(*signal), forced: *forced })
        }
        Event::StepReady { step } => ("step.ready", Fields::Step { step }),
        Event::StepStarted { step } => ("step.started", Fields::Step { step }),
        Event::StepSkipped { step, reason } => ("step.skipped", Fields::StepSkipped { step, reason: *reason }),
        Event::StepFinished { step, outcome, attempts } => {
            ("step.finished", Fields::StepFinished { step, status: *outcome, attempts: *attempts })
        }
        Event::StepWaiting { step, next_attempt, retry, .. } => (
            "retry.scheduled",
            Fields::RetryScheduled {
                step,
                attempt: *next_attempt,
                wake_at: humantime::format_rfc3339_millis(retry.wake_at).to_string(),
                delay_ms: millis(retry.delay),
            },
        ),
        Event::AttemptStarted { step, attempt, max_attempts, pid, redelivered, .. } => (
            "attempt.started",
            Fields::AttemptStarted {
                step,
                attempt: *attempt,
                max_attempts: *max_attempts,
                pid: *pid,
                redelivered: *redelivered,
            },
        ),
        Event::Output { .. } => return None,
        Event::AttemptFinished {
            step,
            attempt,
            max_attempts,
            outcome,
            error,
            duration,
            exit_code,
            signal,
            killed_after_grace,
            ..
        } => (
            "attempt.finished",
            Fields::AttemptFinished {
                step,
                attempt: *attempt,
                max_attempts: *max_attempts,
                outcome: *outcome,
                exit_code: *exit_code,
                signal: signal.as_deref(),
                error: error.as_ref().map(Error::from),
                duration_ms: millis(*duration),
                killed_after_grace: *killed_after_grace,
            },
        ),
        Event::RetryStopped { step, attempt, error, stop } => (
            "retry.stopped",
            Fields::RetryStopped { step, attempt: *attempt, reason: stop.reason, message: stop.explain(error) },
        ),
        Event::Notice { notice, step, message } => {
            ("notice", Fields::Notice { kind: *notice, step: step.as_deref(), message })
        }
        Event::HandlerStarted { step, attempt, error, pid } => {
            ("catch.started", Fields::HandlerStarted { step, attempt: *attempt, error, pid: *pid })
        }
        Event::HandlerFinished { step, attempt, outcome, duration, .. } => (
            "catch.finished",
            Fields::HandlerFinished { step, attempt: *attempt, outcome: *outcome, duration_ms: millis(*duration) },
        ),
        Event::AuxStarted { kind: AuxKind::Compensate, name, pid } => {
            ("compensation.started", Fields::Compensation { step: name, pid: *pid })
        }
        Event::AuxFinished { kind: AuxKind::Compensate, name, outcome, duration, .. } => (
            "compensation.finished",
            Fields::CompensationFinished { step: name, outcome: *outcome, duration_ms: millis(*duration) },
        ),
        Event::AuxStarted { kind: AuxKind::Hook, name, pid } => {
            ("hook.started", Fields::Hook { hook: name, pid: *pid })
        }
        Event::AuxFinished { kind: AuxKind::Hook, name, outcome, duration, .. } => {
            ("hook.finished", Fields::HookFinished { hook: name, outcome: *outcome, duration_ms: millis(*duration) })
        }
    };
    Some(Line { event, ts: envelope.at, seq: envelope.seq, run_id: envelope.run_id.as_deref(), fields })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::tests::{fixed_clock, samples};

    /// `WAYMARK_BLESS=1 cargo test --lib reporter` rewrites it after a deliberate change.
    const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/json/wire.jsonl");

    /// Every sample event as the stream writes it (child output has no line).
    fn lines() -> Vec<serde_json::Value> {
        samples()
            .into_iter()
            .enumerate()
            .map(|(i, event)| Envelope { seq: i as u64 + 1, at: fixed_clock(), run_id: Some("r1".into()), event })
            .filter_map(|e| wire(&e).map(|line| serde_json::from_str(&line.text()).expect("a line is JSON")))
            .collect()
    }

    #[test]
    fn the_wire_form_of_every_kind_of_line_is_unchanged() {
        let actual: String = samples()
            .into_iter()
            .enumerate()
            .map(|(i, event)| Envelope { seq: i as u64 + 1, at: fixed_clock(), run_id: Some("r1".into()), event })
            .filter_map(|e| wire(&e).map(|line| line.text() + "\n"))
            .collect();
        if std::env::var_os("WAYMARK_BLESS").is_some() {
            std::fs::write(GOLDEN, &actual).expect("write the golden file");
        }
        let expected = std::fs::read_to_string(GOLDEN).expect("read tests/fixtures/json/wire.jsonl");
        for (i, (actual, expected)) in actual.lines().zip(expected.lines()).enumerate() {
            assert_eq!(actual, expected, "line {} of {GOLDEN}", i + 1);
        }
        assert_eq!(actual.lines().count(), expected.lines().count(), "lines in {GOLDEN}");
    }

    #[test]
    fn every_line_starts_with_the_four_common_fields() {
        for (i, event) in samples().into_iter().enumerate() {
            let seq = i as u64 + 1;
            let envelope = Envelope { seq, at: fixed_clock(), run_id: Some("r1".into()), event };
            let Some(line) = wire(&envelope) else { continue };
            let text = line.text();
            let head =
                format!(r#"{{"event":"{}","ts":"2026-01-02T03:04:05.678Z","seq":{seq},"run_id":"r1","#, line.event);
            assert!(text.starts_with(&head), "{text}");
        }
    }

    /// A line written before a run is chosen (a notice while waiting for the flow's lock) has
    /// `run_id` null.
    #[test]
    fn a_line_without_a_run_has_a_null_run_id() {
        let event = Event::Notice { notice: NoticeKind::WaitingForLock, step: None, message: "held".into() };
        let envelope = Envelope { seq: 3, at: fixed_clock(), run_id: None, event };
        assert_eq!(
            wire(&envelope).unwrap().text(),
            r#"{"event":"notice","ts":"2026-01-02T03:04:05.678Z","seq":3,"run_id":null,"kind":"waiting_for_lock","step":null,"message":"held"}"#
        );
    }

    /// README.md's schema table names every kind of line and every field it has.
    #[test]
    fn the_readme_documents_every_event_and_field() {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
        let mut kinds = std::collections::BTreeSet::new();
        for line in lines() {
            let event = line["event"].as_str().unwrap();
            kinds.insert(event.to_owned());
            let row = readme
                .lines()
                .find(|l| l.starts_with(&format!("| `{event}` |")))
                .unwrap_or_else(|| panic!("README.md's JSON table has no row for `{event}`"));
            for key in line.as_object().unwrap().keys() {
                let common = ["event", "ts", "seq", "run_id"].contains(&key.as_str());
                let documented =
                    if common { readme.contains(&format!("| `{key}` |")) } else { row.contains(&format!("`{key}`")) };
                assert!(documented, "README.md does not document field `{key}` of `{event}`");
            }
        }
        // Every kind of event has a line, child output aside.
        assert_eq!(kinds.len(), crate::events::tests::KINDS - 1, "{kinds:?}");
    }
}
