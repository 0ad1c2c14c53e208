//! Line-oriented output: child lines prefixed with their step, waymark's own lines on stderr
//! behind `waymark:`, and a failure report at the end.

use super::Reporter;
use crate::executor::Chunk;
use crate::executor::{Event, RunOutcome, Stream};
use std::io::Write;
use std::sync::Arc;
use std::sync::mpsc::{Sender, channel};

/// Lines of the failed attempt's stderr repeated in the failure report.
const TAIL_LINES: usize = 10;

fn human(d: std::time::Duration) -> String {
    // Round to milliseconds: nobody wants nanoseconds in a log line.
    humantime::format_duration(std::time::Duration::from_millis(d.as_millis() as u64)).to_string()
}

/// What the terminal writer is given, in order.
struct Item {
    stream: Stream,
    text: Vec<u8>,
    /// Child output counts against the executor's output budget until it is written.
    _chunk: Option<Arc<Chunk>>,
}

/// Writes the terminal on a thread of its own, in the order things happened, so that a terminal
/// or pipe that stops reading never stalls the event loop (and with it timeouts and signals).
/// The queue is not bounded here: child output is bounded by the executor's budget, which makes
/// the readers (and the children) wait for a slow terminal; waymark's own lines are few.
pub struct PlainReporter {
    /// Show child output (off with `--quiet`).
    quiet: bool,
    tx: Option<Sender<Item>>,
    writer: Option<std::thread::JoinHandle<()>>,
}

impl PlainReporter {
    pub fn new(quiet: bool) -> PlainReporter {
        let (tx, rx) = channel::<Item>();
        let write = move || {
            let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
            for item in rx {
                // A closed terminal must not stop a run: write errors are ignored.
                let _ = match item.stream {
                    Stream::Stdout => out.write_all(&item.text).and_then(|()| out.flush()),
                    Stream::Stderr => err.write_all(&item.text),
                };
            }
        };
        match std::thread::Builder::new().name("waymark-terminal".into()).spawn(write) {
            Ok(writer) => PlainReporter { quiet, tx: Some(tx), writer: Some(writer) },
            Err(_) => PlainReporter { quiet, tx: None, writer: None },
        }
    }

    fn send(&mut self, stream: Stream, text: Vec<u8>, chunk: Option<Arc<Chunk>>) {
        match &self.tx {
            Some(tx) => {
                let _ = tx.send(Item { stream, text, _chunk: chunk });
            }
            // No writer thread could be started: write here.
            None => {
                let _ = match stream {
                    Stream::Stdout => std::io::stdout().write_all(&text),
                    Stream::Stderr => std::io::stderr().write_all(&text),
                };
            }
        }
    }
}

impl Drop for PlainReporter {
    /// Deliver everything queued before the process exits.
    fn drop(&mut self) {
        self.tx = None;
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

impl Reporter for PlainReporter {
    fn report(&mut self, event: &Event) {
        if let Event::Output { step, stream, chunk } = event {
            if !self.quiet {
                let mut text = Vec::with_capacity(chunk.len() + 16);
                for line in chunk.split_inclusive(|b| *b == b'\n') {
                    text.extend_from_slice(step.as_bytes());
                    text.extend_from_slice(b" | ");
                    text.extend_from_slice(line);
                }
                self.send(*stream, text, Some(Arc::clone(chunk)));
            }
            return;
        }
        if let Some(text) = describe(event) {
            self.send(Stream::Stderr, text.into_bytes(), None);
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
