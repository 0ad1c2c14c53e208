//! Line-oriented output: child lines prefixed with their step, waymark's own lines on stderr
//! behind `waymark:`, and the failure report at the end.

use super::report::{History, human};
use super::terminal::Terminal;
use crate::events::{
    AbandonReason, AttemptEnd, Envelope, Event, NoticeKind, Reporter, RunOutcome, SkipReason, StepOutcome,
};
use std::collections::BTreeMap;
use std::time::Duration;

/// Child output on the display, waymark's own lines on stderr. Child output that a terminal
/// stream is too far behind to take is dropped from the display (never from the logs), and a
/// warning says how much, so a stalled terminal never holds up the children, their timeouts or
/// the runner's signals.
pub(crate) struct PlainReporter {
    terminal: Terminal,
    /// The run of the latest event, for the hint about where the logs are.
    run_id: String,
    /// Child output not shown, per step and stream, since it was last reported.
    dropped: BTreeMap<(String, &'static str), u64>,
    /// The attempts, for the failure report.
    history: History,
}

impl PlainReporter {
    pub(crate) fn new() -> PlainReporter {
        PlainReporter {
            terminal: Terminal::open(),
            run_id: String::new(),
            dropped: BTreeMap::new(),
            history: History::default(),
        }
    }

    fn line(&self, text: String) {
        self.terminal.say(text);
    }

    /// Say how much output of `step` (of every step when `None`) was not shown.
    fn report_drops(&mut self, step: Option<&str>) {
        let keys: Vec<(String, &'static str)> =
            self.dropped.keys().filter(|(s, _)| step.is_none_or(|name| name == s)).cloned().collect();
        for key in keys {
            let Some(bytes) = self.dropped.remove(&key) else { continue };
            let (step, stream) = key;
            self.line(format!(
                "waymark: warning: {step}: {bytes} bytes of its {stream} not shown: {stream} was not being read \
                 fast enough; the log has all of it (`waymark logs {} {step} --stream {stream}`)\n",
                self.run_id
            ));
        }
    }
}

impl Drop for PlainReporter {
    fn drop(&mut self) {
        let run = &self.run_id;
        self.terminal.close(
            &format!(
                "the rest of the steps' output was not shown there (the logs have all of it: `waymark logs {run} STEP`)"
            ),
            &format!("what was to be shown there is in the logs (`waymark logs {run} STEP`)"),
        );
    }
}

impl Reporter for PlainReporter {
    fn earlier_attempts(&mut self, attempts: &[crate::events::EarlierAttempt]) {
        self.history.prefill(attempts);
    }

    fn report(&mut self, envelope: &Envelope) {
        if let Some(run_id) = &envelope.run_id {
            self.run_id.clone_from(run_id);
        }
        self.history.record(envelope);
        match &envelope.event {
            Event::Output { step, stream, chunk } => {
                let mut text = Vec::with_capacity(chunk.len() + 16);
                for line in chunk.split_inclusive(|b| *b == b'\n') {
                    text.extend_from_slice(step.as_bytes());
                    text.extend_from_slice(b" | ");
                    text.extend_from_slice(line);
                }
                if !self.terminal.sink(*stream).output(text) {
                    *self.dropped.entry((step.clone(), stream.name())).or_default() += chunk.len() as u64;
                }
                return;
            }
            Event::AttemptFinished { step, outcome: AttemptEnd::Succeeded | AttemptEnd::Failed, .. } => {
                self.report_drops(Some(step));
            }
            Event::RunFinished { outcome: RunOutcome::Failed, failures, .. } => {
                self.report_drops(None);
                self.line(format!("\n{}", self.history.report(&self.run_id, failures)));
                return;
            }
            Event::RunFinished { .. } => self.report_drops(None),
            _ => {}
        }
        if let Some(text) = describe(envelope) {
            self.line(text);
        }
    }
}

/// A run's age for a message: whole seconds, or milliseconds under a second.
fn readable(age: Duration) -> Duration {
    if age.as_secs() > 0 { Duration::from_secs(age.as_secs()) } else { age }
}

/// Waymark's own line(s) for an event, newline-terminated; `None` for the events that have no
/// line (a step's turn, start, wait and end are said by the attempts' lines).
pub(super) fn describe(envelope: &Envelope) -> Option<String> {
    let run_id = envelope.run_id.as_deref().unwrap_or_default();
    let text = match &envelope.event {
        Event::RunStarted { flow, steps_total } => format!("waymark: run {run_id} of {flow}: {steps_total} step(s)"),
        Event::RunResumed { flow, steps_total, steps_done } => {
            format!("waymark: resuming run {run_id} of {flow}: {steps_done} of {steps_total} steps done")
        }
        Event::RunAbandoned { reason: AbandonReason::Fresh, .. } => {
            format!("waymark: abandoned unfinished run {run_id}")
        }
        Event::RunAbandoned { flow, file, reason: AbandonReason::Stale { age, limit } } => format!(
            "waymark: abandoned unfinished run {run_id} of flow `{flow}`: it started {} ago, longer than \
             resume_within = {} in {}; starting a new run (`waymark resume {run_id}` would still resume it)",
            humantime::format_duration(readable(*age)),
            humantime::format_duration(*limit),
            file.display(),
        ),
        Event::StepSkipped { step, reason: SkipReason::AlreadySucceeded } => {
            format!("waymark: {step}: already succeeded, skipped")
        }
        // `status` shows them; the failure report says why the run failed.
        Event::StepSkipped { reason: SkipReason::RunFailed | SkipReason::DeadlinePassed, .. }
        | Event::StepReady { .. }
        | Event::StepStarted { .. }
        | Event::StepWaiting { .. }
        | Event::HandlerFinished { .. }
        | Event::AuxStarted { kind: crate::store::AuxKind::Hook, .. }
        | Event::AuxFinished { .. }
        | Event::RetryStopped { .. }
        | Event::StepFinished { outcome: StepOutcome::Succeeded | StepOutcome::Failed, .. } => {
            return None;
        }
        Event::StepFinished { step, outcome: StepOutcome::Caught, .. } => {
            format!("waymark: {step}: error caught; the steps that need it run")
        }
        Event::AuxStarted { kind: crate::store::AuxKind::Compensate, name, .. } => {
            format!("waymark: {name}: compensating (the run failed)")
        }
        Event::HandlerStarted { step, error, .. } => format!("waymark: {step}: running its catch handler for {error}"),
        Event::AttemptStarted { step, attempt, max_attempts, redelivered, .. } => {
            if *max_attempts == 1 && *attempt == 1 && !*redelivered {
                return None;
            }
            let again = if *redelivered { " (redelivered)" } else { "" };
            format!("waymark: {step}: attempt {attempt}/{max_attempts}{again}")
        }
        Event::Output { .. } => return None,
        Event::AttemptFinished { step, attempt, outcome: AttemptEnd::Succeeded, duration, .. } => {
            format!("waymark: {step}: succeeded on attempt {attempt} in {}", human(*duration))
        }
        Event::AttemptFinished { step, attempt, max_attempts, outcome: AttemptEnd::Failed, error, retry, .. } => {
            let next = match retry {
                Some(plan) if plan.delay.is_zero() => "; retrying now".to_owned(),
                Some(plan) => format!("; retrying in {}", human(plan.delay)),
                None => String::new(),
            };
            let error = error.as_ref().map(|e| format!(": {e} [{}]", e.source.describe())).unwrap_or_default();
            format!("waymark: {step}: attempt {attempt}/{max_attempts} failed{error}{next}")
        }
        // A cancelled attempt runs again on resume; the run's end says it was interrupted.
        Event::AttemptFinished { outcome: AttemptEnd::Cancelled, .. } => return None,
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
                format!("waymark: got {name} again, killing running steps")
            } else {
                format!("waymark: got {name}, stopping running steps (send it again to kill them)")
            }
        }
        Event::RunFinished { outcome: RunOutcome::Succeeded, .. } => format!("waymark: run {run_id} succeeded"),
        Event::RunFinished { outcome: RunOutcome::Interrupted { .. }, .. } => {
            format!("waymark: run {run_id} interrupted; `waymark run` again resumes it")
        }
        // The reporter writes the failure report from the attempts it saw.
        Event::RunFinished { outcome: RunOutcome::Failed, .. } => return None,
    };
    Some(text + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{RetryPlan, StepOutcome};
    use std::time::SystemTime;

    fn line(run_id: Option<&str>, event: Event) -> Option<String> {
        describe(&Envelope { seq: 1, at: SystemTime::UNIX_EPOCH, run_id: run_id.map(str::to_owned), event })
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
        let stale = AbandonReason::Stale { age: Duration::from_millis(7_200_900), limit: Duration::from_secs(3600) };
        assert_eq!(
            line(Some("old"), abandoned(stale)).as_deref(),
            Some(
                "waymark: abandoned unfinished run old of flow `nightly`: it started 2h ago, longer than \
                 resume_within = 1h in n.toml; starting a new run (`waymark resume old` would still resume it)\n"
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

    #[test]
    fn events_without_a_line_of_their_own_print_nothing() {
        let step = || "a".to_owned();
        let retry = RetryPlan { delay: Duration::from_secs(1), wake_at: SystemTime::UNIX_EPOCH };
        let silent = [
            Event::StepReady { step: step() },
            Event::StepStarted { step: step() },
            Event::StepWaiting { step: step(), next_attempt: 2, retry },
            Event::StepFinished { step: step(), outcome: StepOutcome::Succeeded, attempts: 1 },
            Event::StepFinished { step: step(), outcome: StepOutcome::Failed, attempts: 1 },
            Event::AttemptStarted {
                step: step(),
                attempt: 1,
                max_attempts: 1,
                pid: Some(1),
                redelivered: false,
                timeout: None,
            },
            Event::AttemptFinished {
                step: step(),
                attempt: 1,
                max_attempts: 1,
                outcome: AttemptEnd::Cancelled,
                error: None,
                duration: Duration::from_millis(5),
                retry: None,
                stopped: None,
                exit_code: None,
                signal: Some("SIGINT".into()),
                killed_after_grace: false,
            },
        ];
        for event in silent {
            let shown = format!("{event:?}");
            assert_eq!(line(Some("r1"), event), None, "{shown}");
        }
    }
}
