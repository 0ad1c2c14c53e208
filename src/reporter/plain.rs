//! Line-oriented output: child lines prefixed with their step, waymark's own lines on stderr
//! behind `waymark:`, and a failure report at the end.

use super::Reporter;
use crate::executor::{Event, RunOutcome, Stream};
use std::io::Write;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};

/// Lines of the failed attempt's stderr repeated in the failure report.
const TAIL_LINES: usize = 10;

/// Chunks of output queued for a terminal stream before further child output is dropped.
const QUEUE: usize = 256;

/// One terminal stream, written by a thread of its own so that a terminal or pipe that stops
/// reading never stalls the event loop (and with it timeouts and signals).
struct Sink {
    tx: Option<SyncSender<Vec<u8>>>,
    done: Receiver<()>,
    /// Lines of child output dropped because the stream was not keeping up.
    dropped: usize,
}

impl Sink {
    fn spawn(mut out: impl Write + Send + 'static) -> Sink {
        let (tx, rx) = sync_channel::<Vec<u8>>(QUEUE);
        let (done_tx, done) = sync_channel(1);
        let writer = move || {
            for chunk in rx {
                // A closed terminal must not stop a run: write errors are ignored.
                let _ = out.write_all(&chunk);
                let _ = out.flush();
            }
            let _ = done_tx.send(());
        };
        let tx = std::thread::Builder::new().name("waymark-terminal".into()).spawn(writer).ok().map(|_| tx);
        Sink { tx, done, dropped: 0 }
    }

    /// Child output: dropped (and counted) rather than waited for when the stream lags.
    fn output(&mut self, bytes: Vec<u8>) {
        let Some(tx) = &self.tx else { return };
        let lines = bytes.iter().filter(|b| **b == b'\n').count();
        match tx.try_send(bytes) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => self.dropped += lines,
            Err(TrySendError::Disconnected(_)) => self.tx = None,
        }
    }

    /// Waymark's own lines: always delivered.
    fn line(&mut self, text: String) {
        if self.dropped > 0 {
            let note = format!(
                "waymark: {} line(s) of output not shown: the terminal was not keeping up (the logs have them)\n",
                self.dropped
            );
            self.dropped = 0;
            self.send(note.into_bytes());
        }
        self.send(text.into_bytes());
    }

    fn send(&mut self, bytes: Vec<u8>) {
        if let Some(tx) = &self.tx
            && tx.send(bytes).is_err()
        {
            self.tx = None;
        }
    }

    /// Deliver what is queued and stop the writer.
    fn close(&mut self) {
        if self.tx.take().is_some() {
            let _ = self.done.recv();
        }
    }
}

pub struct PlainReporter {
    /// Show child output (off with `--quiet`).
    quiet: bool,
    out: Sink,
    err: Sink,
}

impl PlainReporter {
    pub fn new(quiet: bool) -> PlainReporter {
        PlainReporter { quiet, out: Sink::spawn(std::io::stdout()), err: Sink::spawn(std::io::stderr()) }
    }
}

impl Drop for PlainReporter {
    fn drop(&mut self) {
        self.out.close();
        self.err.close();
    }
}

fn human(d: std::time::Duration) -> String {
    // Round to milliseconds: nobody wants nanoseconds in a log line.
    humantime::format_duration(std::time::Duration::from_millis(d.as_millis() as u64)).to_string()
}

impl Reporter for PlainReporter {
    fn report(&mut self, event: &Event) {
        if let Event::Output { step, stream, bytes } = event {
            if !self.quiet {
                let mut text = Vec::with_capacity(bytes.len() + 16);
                for line in bytes.split_inclusive(|b| *b == b'\n') {
                    text.extend_from_slice(step.as_bytes());
                    text.extend_from_slice(b" | ");
                    text.extend_from_slice(line);
                }
                match stream {
                    Stream::Stdout => self.out.output(text),
                    Stream::Stderr => self.err.output(text),
                }
            }
            return;
        }
        if let Some(text) = describe(event) {
            self.err.line(text);
        }
    }
}

/// Waymark's own line(s) for an event, newline-terminated.
fn describe(event: &Event) -> Option<String> {
    let text = match event {
        Event::RunStarted { run_id, flow, steps_total, steps_done, resumed } => {
            if *resumed {
                format!("waymark: resuming run {run_id} of {flow}: {steps_done} of {steps_total} steps done")
            } else {
                format!("waymark: run {run_id} of {flow}: {steps_total} step(s)")
            }
        }
        Event::StepAlreadyDone { step } => format!("waymark: {step}: already succeeded, skipped"),
        Event::AttemptStarted { step, attempt, max_attempts, redelivered, .. } => {
            if *max_attempts == 1 && *attempt == 1 && !*redelivered {
                return None;
            }
            let again = if *redelivered { " (redelivered)" } else { "" };
            format!("waymark: {step}: attempt {attempt}/{max_attempts}{again}")
        }
        Event::Output { .. } => return None,
        Event::AttemptSucceeded { step, attempt, elapsed } => {
            format!("waymark: {step}: succeeded on attempt {attempt} in {}", human(*elapsed))
        }
        Event::AttemptFailed { step, attempt, max_attempts, error, retry, .. } => {
            let next = match retry {
                Some((delay, _)) if delay.is_zero() => "; retrying now".to_owned(),
                Some((delay, _)) => format!("; retrying in {}", human(*delay)),
                None => String::new(),
            };
            let source = error.source.describe();
            format!("waymark: {step}: attempt {attempt}/{max_attempts} failed: {error} [{source}]{next}")
        }
        Event::Warning { step: Some(step), message } => format!("waymark: warning: {step}: {message}"),
        Event::Warning { step: None, message } => format!("waymark: warning: {message}"),
        Event::Cancelling { signal, forced } => {
            let name = crate::flow::Signal::from_number(*signal).map_or("signal", |s| s.name());
            if *forced {
                format!("waymark: got {name} again, killing running steps")
            } else {
                format!("waymark: got {name}, stopping running steps (send it again to kill them)")
            }
        }
        Event::RunFinished { run_id, outcome: RunOutcome::Succeeded, .. } => format!("waymark: run {run_id} succeeded"),
        Event::RunFinished { run_id, outcome: RunOutcome::Interrupted { .. }, .. } => {
            format!("waymark: run {run_id} interrupted; `waymark run` again resumes it")
        }
        Event::RunFinished { run_id, outcome: RunOutcome::Failed, failure } => {
            let mut report = format!("\nwaymark: run {run_id} failed\n");
            if let Some(f) = failure {
                report.push_str(&format!(
                    "  step:     {}\n  error:    {}\n  source:   {}\n  attempts: {}\n",
                    f.step,
                    f.error,
                    f.error.source.describe(),
                    f.attempts
                ));
                let lines: Vec<&str> = f.stderr_tail.lines().collect();
                if !lines.is_empty() {
                    report.push_str("  stderr (last lines):\n");
                    for line in &lines[lines.len().saturating_sub(TAIL_LINES)..] {
                        report.push_str(&format!("    {line}\n"));
                    }
                }
                report.push_str(&format!("  logs:     {}", f.log_dir.display()));
            }
            report
        }
    };
    Some(text + "\n")
}
