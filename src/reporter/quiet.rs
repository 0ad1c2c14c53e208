//! `--quiet`, for cron: nothing at all while the run goes well, so a good night sends no mail;
//! the failure report on stderr when the run fails, and one line when a signal interrupted it
//! (it resumes on the next run); and after either, or alone when the run succeeded, one line per
//! compensation or hook that failed, so that what was not undone, or a failed notification hook,
//! leaves a trace. Child output is in the
//! logs only, and notices (warnings, waiting for the lock) are not shown.

use super::report::History;
use super::terminal::Terminal;
use crate::events::{Envelope, Event, Reporter, RunOutcome};
use crate::store::AuxKind;

pub(crate) struct QuietReporter {
    /// Opened when there is something to say, so that a run that succeeds never touches stdout
    /// or stderr.
    terminal: Option<Terminal>,
    run_id: std::sync::Arc<str>,
    history: History,
    /// The lines of the compensations and hooks that failed, said at the run's end (after its
    /// report).
    aux_failed: Vec<String>,
}

impl QuietReporter {
    pub(crate) fn new() -> QuietReporter {
        QuietReporter {
            terminal: None,
            run_id: std::sync::Arc::default(),
            history: History::default(),
            aux_failed: Vec::new(),
        }
    }

    fn say(&mut self, text: String) {
        self.terminal.get_or_insert_with(Terminal::open).say(text);
    }

    /// Say the failed compensations' and hooks' lines not said yet.
    fn say_aux_failed(&mut self) {
        for line in std::mem::take(&mut self.aux_failed) {
            self.say(line);
        }
    }
}

impl Reporter for QuietReporter {
    fn earlier(&mut self, earlier: &crate::events::Earlier) {
        self.history.prefill(earlier);
    }

    fn flow(&mut self, path: &std::path::Path, fail_fast: bool) {
        self.history.set_flow(path, fail_fast);
    }

    /// The failure report reads the logs, never the lines as they pass.
    fn shows_output(&self) -> bool {
        false
    }

    fn report(&mut self, envelope: &Envelope) {
        if let Some(run_id) = &envelope.run_id {
            self.run_id.clone_from(run_id);
        }
        self.history.record(envelope);
        match &envelope.event {
            Event::RunFinished { outcome: RunOutcome::Failed, failures, .. } => {
                let report = self.history.report(&self.run_id, failures);
                self.say(report);
            }
            Event::RunFinished { outcome: RunOutcome::Interrupted { .. }, .. } => {
                let run = &self.run_id;
                self.say(format!("waymark: run {run} interrupted; `waymark run` again resumes it\n"));
            }
            // Its warning, as the plain mode says it, with the run's id.
            Event::AuxFinished { kind, name, warning: Some(warning), .. } => {
                let run = &self.run_id;
                self.aux_failed.push(match kind {
                    AuxKind::Compensate => format!("waymark: warning: run {run}: {name}: {warning}\n"),
                    AuxKind::Hook => format!("waymark: warning: run {run}: {warning}\n"),
                });
            }
            _ => {}
        }
        if matches!(envelope.event, Event::RunFinished { .. }) {
            self.say_aux_failed();
        }
    }
}

impl Drop for QuietReporter {
    fn drop(&mut self) {
        // A run that stopped without its end (waymark's own failure) still says its failed
        // compensations and hooks.
        self.say_aux_failed();
        if let Some(terminal) = &mut self.terminal {
            let run = &self.run_id;
            terminal.close(
                &format!("the rest of the report was not shown there (`waymark status {run}` shows the run)"),
                &format!("the report was not shown there (`waymark status {run}` shows the run)"),
            );
        }
    }
}
