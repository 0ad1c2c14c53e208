//! Line-oriented output: child lines prefixed with their step, waymark's own lines on stderr
//! behind `waymark:`, and a failure report at the end.

use super::Reporter;
use crate::executor::{Event, RunOutcome, Stream};
use std::io::Write;

/// Lines of the failed attempt's stderr repeated in the failure report.
const TAIL_LINES: usize = 10;

#[derive(Default)]
pub struct PlainReporter {
    /// Show child output (off with `--quiet`).
    pub quiet: bool,
}

fn human(d: std::time::Duration) -> String {
    // Round to milliseconds: nobody wants nanoseconds in a log line.
    humantime::format_duration(std::time::Duration::from_millis(d.as_millis() as u64)).to_string()
}

impl Reporter for PlainReporter {
    fn report(&mut self, event: &Event) {
        let mut err = std::io::stderr().lock();
        // Write errors on our own terminal are ignored: a closed stderr must not stop a run.
        let _ = match event {
            Event::RunStarted { run_id, flow, steps_total, steps_done, resumed } => {
                if *resumed {
                    writeln!(err, "waymark: resuming run {run_id} of {flow}: {steps_done} of {steps_total} steps done")
                } else {
                    writeln!(err, "waymark: run {run_id} of {flow}: {steps_total} step(s)")
                }
            }
            Event::StepAlreadyDone { step } => writeln!(err, "waymark: {step}: already succeeded, skipped"),
            Event::AttemptStarted { step, attempt, max_attempts, redelivered, .. } => {
                let again = if *redelivered { " (redelivered)" } else { "" };
                if *max_attempts > 1 || *attempt > 1 || *redelivered {
                    writeln!(err, "waymark: {step}: attempt {attempt}/{max_attempts}{again}")
                } else {
                    Ok(())
                }
            }
            Event::Output { step, stream, bytes } => {
                if self.quiet {
                    return;
                }
                let mut text = Vec::with_capacity(bytes.len() + 16);
                for line in bytes.split_inclusive(|b| *b == b'\n') {
                    text.extend_from_slice(step.as_bytes());
                    text.extend_from_slice(b" | ");
                    text.extend_from_slice(line);
                }
                match stream {
                    Stream::Stdout => std::io::stdout().lock().write_all(&text),
                    Stream::Stderr => err.write_all(&text),
                }
            }
            Event::AttemptSucceeded { step, attempt, elapsed } => {
                writeln!(err, "waymark: {step}: succeeded on attempt {attempt} in {}", human(*elapsed))
            }
            Event::AttemptFailed { step, attempt, max_attempts, error, retry, .. } => {
                let next = match retry {
                    Some((delay, _)) if delay.is_zero() => "; retrying now".to_owned(),
                    Some((delay, _)) => format!("; retrying in {}", human(*delay)),
                    None => String::new(),
                };
                writeln!(
                    err,
                    "waymark: {step}: attempt {attempt}/{max_attempts} failed: {error} [{}]{next}",
                    error.source.describe()
                )
            }
            Event::Warning { step, message } => match step {
                Some(step) => writeln!(err, "waymark: warning: {step}: {message}"),
                None => writeln!(err, "waymark: warning: {message}"),
            },
            Event::Cancelling { signal, forced } => {
                let name = crate::flow::Signal::from_number(*signal).map_or("signal", |s| s.name());
                if *forced {
                    writeln!(err, "waymark: got {name} again, killing running steps")
                } else {
                    writeln!(err, "waymark: got {name}, stopping running steps (send it again to kill them)")
                }
            }
            Event::RunFinished { run_id, outcome, failure } => match outcome {
                RunOutcome::Succeeded => writeln!(err, "waymark: run {run_id} succeeded"),
                RunOutcome::Interrupted { .. } => {
                    writeln!(err, "waymark: run {run_id} interrupted; `waymark run` again resumes it")
                }
                RunOutcome::Failed => {
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
                        report.push_str(&format!("  logs:     {}\n", f.log_dir.display()));
                    }
                    err.write_all(report.as_bytes())
                }
            },
        };
    }
}
