//! What went wrong in an attempt, as a named error class with its bases.
//!
//! `classes` holds the hierarchy; `error_file` and `traceback` read the names children report;
//! `classify` turns an attempt's end into an [`ErrorValue`] following the documented precedence.

pub(crate) mod classes;
pub mod error_file;
pub mod traceback;

use serde::{Deserialize, Serialize};
use std::fmt;

/// Where an error's class came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorSource {
    /// The child wrote `WAYMARK_ERROR_FILE`.
    ErrorFile,
    /// The child's stderr ended with a Python traceback.
    Traceback,
    /// An `exit_codes` entry mapped the exit code or signal.
    ExitCodeMapping,
    /// A non-zero exit status with no mapping.
    ExitStatus,
    /// The child died of a signal waymark did not send.
    Signal,
    /// The attempt's timeout passed.
    Timeout,
    /// The child could not be started.
    NotStarted,
}

impl ErrorSource {
    pub(crate) fn describe(self) -> &'static str {
        match self {
            ErrorSource::ErrorFile => "error file",
            ErrorSource::Traceback => "traceback",
            ErrorSource::ExitCodeMapping => "exit code mapping",
            ErrorSource::ExitStatus => "exit status",
            ErrorSource::Signal => "signal",
            ErrorSource::Timeout => "timeout",
            ErrorSource::NotStarted => "start failure",
        }
    }
}

/// A failed attempt's error: its class, ordered bases (nearest first), message and source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorValue {
    pub class: String,
    pub bases: Vec<String>,
    pub message: String,
    pub source: ErrorSource,
}

impl ErrorValue {
    /// Whether an `except` clause naming any of `names` would catch this error.
    pub(crate) fn matches_any(&self, names: &[String]) -> bool {
        names.iter().any(|n| *n == self.class || self.bases.iter().any(|b| b == n))
    }

    /// The lines of its message after the first, which is all that [`fmt::Display`] shows: empty
    /// for a message of one line.
    pub(crate) fn further_lines(&self) -> impl Iterator<Item = &str> {
        self.message.trim().lines().skip(1).map(str::trim_end)
    }
}

impl fmt::Display for ErrorValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.class, self.bases.join(", "))?;
        // One line wherever it is shown: a multi-line message keeps its first line.
        let mut lines = self.message.trim().lines();
        if let Some(first) = lines.next() {
            write!(f, ": {first}")?;
            if lines.next().is_some() {
                write!(f, " …")?;
            }
        }
        Ok(())
    }
}

use crate::flow::{ExitCodes, Signal};
use classes::{ACTION_EXECUTION_LOST, ACTION_EXECUTION_NOT_STARTED, ACTION_TIMEOUT, CALLED_PROCESS_ERROR, ClassTree};
use error_file::ErrorFileOutcome;

/// How a failed attempt ended, as the executor saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ending {
    /// Exited with a non-zero status.
    Exited(i32),
    /// Killed by a signal waymark did not send.
    Signaled(Signal),
    /// Its timeout passed (whatever happened next).
    TimedOut(std::time::Duration),
    /// Its timeout passed before its program was started: it waited that long for a free slot
    /// (or for its start to be recorded), and no child was spawned.
    TimedOutBeforeStart(std::time::Duration),
    /// The workflow's deadline (its top-level `timeout`) passed while it ran.
    WorkflowTimeout(std::time::Duration),
    /// Could not be started; the reason.
    NotStarted(String),
}

/// Everything `classify` may consult besides the ending.
pub(crate) struct Evidence<'a> {
    pub(crate) classes: &'a ClassTree,
    pub(crate) step_codes: &'a ExitCodes,
    pub(crate) flow_codes: &'a ExitCodes,
    pub(crate) detect_tracebacks: bool,
    pub(crate) error_file: ErrorFileOutcome,
    /// The end of the attempt's stderr (up to 64 KiB).
    pub(crate) stderr_tail: &'a str,
    /// Whether the step names a class in its retry policy or a catch handler: a class waymark
    /// does not know that the step names is matched by that name, and needs no word of warning.
    pub(crate) named: &'a dyn Fn(&str) -> bool,
}

/// Name a failed attempt's error. Precedence: timeout and start failure first; then the error
/// file, a Python traceback (exit status 1 only), `exit_codes` (step, then flow), and finally
/// `CalledProcessError` or `ActionExecutionLost`. Returns the error and any warnings.
pub(crate) fn classify(ending: &Ending, ev: Evidence<'_>) -> (ErrorValue, Vec<String>) {
    let mut warnings = Vec::new();
    let builtin = |class: &str, message: String, source| ErrorValue {
        class: class.to_owned(),
        bases: ev.classes.bases(class).unwrap_or_default(),
        message,
        source,
    };
    match ending {
        Ending::TimedOut(after) => {
            let message = format!("timed out after {}", humantime::format_duration(*after));
            return (builtin(ACTION_TIMEOUT, message, ErrorSource::Timeout), warnings);
        }
        Ending::TimedOutBeforeStart(after) => {
            let message = format!(
                "timed out after {} before its program was started (the time an attempt waits for a free slot \
                 counts against its timeout)",
                humantime::format_duration(*after)
            );
            return (builtin(ACTION_TIMEOUT, message, ErrorSource::Timeout), warnings);
        }
        Ending::WorkflowTimeout(limit) => {
            let message = format!("the workflow's timeout of {} passed", humantime::format_duration(*limit));
            return (builtin(classes::WORKFLOW_TIMEOUT, message, ErrorSource::Timeout), warnings);
        }
        Ending::NotStarted(why) => {
            return (builtin(ACTION_EXECUTION_NOT_STARTED, why.clone(), ErrorSource::NotStarted), warnings);
        }
        Ending::Exited(_) | Ending::Signaled(_) => {}
    }
    match ev.error_file {
        ErrorFileOutcome::Reported(r) => {
            let mut bases = match r.bases {
                Some(listed) => ev.classes.with_bases(&listed),
                None => reported_bases(ev.classes, &r.class),
            };
            // Every error derives from BaseException, as in Python: bases that leave it out (even
            // `[]`) still end with it, so that an `except`-like match on it catches the error.
            if r.class != "BaseException" && !bases.iter().any(|b| b == "BaseException") {
                bases.push("BaseException".into());
            }
            let error = ErrorValue {
                class: r.class,
                bases,
                message: r.message.unwrap_or_default(),
                source: ErrorSource::ErrorFile,
            };
            return (error, warnings);
        }
        ErrorFileOutcome::Invalid(why) => warnings.push(format!("ignored the error file: {why}")),
        ErrorFileOutcome::Empty => {}
    }
    if *ending == Ending::Exited(1)
        && ev.detect_tracebacks
        && let Some(tb) = traceback::parse_traceback(ev.stderr_tail)
    {
        // The run's own error when the flow's `timeout` passes: no attempt fails with it.
        if tb.class != classes::WORKFLOW_TIMEOUT {
            let known = ev.classes.bases(&tb.class).or_else(|| classes::stdlib_bases(&tb.printed));
            let bases = known.unwrap_or_else(|| {
                if !(ev.named)(&tb.class) {
                    warnings.push(format!(
                        "{} (from the traceback) is not a class waymark knows (built in, of Python's standard library, \
                     or in the flow's `[errors]`), so it is taken for a plain Exception; if it derives from another \
                     class, declare it in `[errors]` ({} = [\"OSError\"], say) or import \
                     examples/helpers/waymark_errors.py, which reports its bases",
                        tb.printed, tb.class
                    ));
                }
                reported_bases(ev.classes, &tb.class)
            });
            return (
                ErrorValue { class: tb.class, bases, message: tb.message, source: ErrorSource::Traceback },
                warnings,
            );
        }
        warnings.push(format!(
            "ignored the traceback: its class is {}, which only waymark reports when the flow's `timeout` passes; \
             give your class another name",
            tb.class
        ));
    }
    let (mapped, message, fallback, fallback_source) = match ending {
        Ending::Exited(code) => (
            ev.step_codes.for_code(*code).or_else(|| ev.flow_codes.for_code(*code)),
            format!("exit status {code}"),
            CALLED_PROCESS_ERROR,
            ErrorSource::ExitStatus,
        ),
        Ending::Signaled(sig) => (
            ev.step_codes.for_signal(*sig).or_else(|| ev.flow_codes.for_signal(*sig)),
            format!("killed by signal {}", sig.name()),
            ACTION_EXECUTION_LOST,
            ErrorSource::Signal,
        ),
        _ => unreachable!("handled above"),
    };
    let error = match mapped {
        Some(class) => builtin(class, message, ErrorSource::ExitCodeMapping),
        None => builtin(fallback, message, fallback_source),
    };
    (error, warnings)
}

/// Bases of a class a child named: from the hierarchy when known, else an ordinary exception's.
fn reported_bases(classes: &ClassTree, class: &str) -> Vec<String> {
    classes.bases(class).unwrap_or_else(|| vec!["Exception".into(), "BaseException".into()])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(ending: Ending, file: ErrorFileOutcome, stderr: &str, codes: &ExitCodes) -> ErrorValue {
        let tree = ClassTree::new(vec![("Flaky".into(), vec!["OSError".into()])]).unwrap();
        let ev = Evidence {
            classes: &tree,
            step_codes: codes,
            flow_codes: &ExitCodes::default(),
            detect_tracebacks: true,
            error_file: file,
            stderr_tail: stderr,
            named: &|_| false,
        };
        classify(&ending, ev).0
    }

    const TB: &str =
        "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nConnectionResetError: reset\n";

    #[test]
    fn a_traceback_of_a_class_named_workflow_timeout_is_not_waymark_s_deadline() {
        let tree = ClassTree::default();
        let ev = Evidence {
            classes: &tree,
            step_codes: &ExitCodes::default(),
            flow_codes: &ExitCodes::default(),
            detect_tracebacks: true,
            error_file: ErrorFileOutcome::Empty,
            stderr_tail: "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nWorkflowTimeout: late\n",
            named: &|_| false,
        };
        let (e, warnings) = classify(&Ending::Exited(1), ev);
        assert_eq!(e.to_string(), "CalledProcessError(SubprocessError, Exception, BaseException): exit status 1");
        assert_eq!(
            warnings,
            ["ignored the traceback: its class is WorkflowTimeout, which only waymark reports when the flow's \
              `timeout` passes; give your class another name"]
        );
    }

    #[test]
    fn precedence_is_file_then_traceback_then_mapping_then_status() {
        let mut codes = ExitCodes::default();
        codes.codes.insert(1, "Flaky".into());
        let reported = ErrorFileOutcome::Reported(error_file::ReportedError {
            class: "ConnectTimeout".into(),
            bases: None,
            message: Some("slow".into()),
        });
        let e = run(Ending::Exited(1), reported, TB, &codes);
        assert_eq!((e.class.as_str(), e.source), ("ConnectTimeout", ErrorSource::ErrorFile));
        assert_eq!(e.bases, ["Exception", "BaseException"]);
        let e = run(Ending::Exited(1), ErrorFileOutcome::Empty, TB, &codes);
        assert_eq!(e.to_string(), "ConnectionResetError(ConnectionError, OSError, Exception, BaseException): reset");
        let e = run(Ending::Exited(1), ErrorFileOutcome::Empty, "plain", &codes);
        assert_eq!(e.to_string(), "Flaky(OSError, Exception, BaseException): exit status 1");
        let e = run(Ending::Exited(2), ErrorFileOutcome::Empty, TB, &codes);
        assert_eq!(e.to_string(), "CalledProcessError(SubprocessError, Exception, BaseException): exit status 2");
    }

    /// Reported bases that leave out BaseException, even none, end with it.
    #[test]
    fn reported_bases_always_end_with_base_exception() {
        let file = |class: &str, bases: &[&str]| {
            ErrorFileOutcome::Reported(error_file::ReportedError {
                class: class.into(),
                bases: Some(bases.iter().map(|b| b.to_string()).collect()),
                message: None,
            })
        };
        let codes = ExitCodes::default();
        let bases = |class: &str, given: &[&str]| run(Ending::Exited(1), file(class, given), "", &codes).bases;
        assert_eq!(bases("Deep", &[]), ["BaseException"]);
        assert_eq!(
            bases("ConnectTimeout", &["TimeoutException", "Exception"]),
            ["TimeoutException", "Exception", "BaseException"]
        );
        assert_eq!(bases("E", &["Exception", "BaseException"]), ["Exception", "BaseException"]);
        assert_eq!(bases("BaseException", &[]), Vec::<String>::new());
    }

    #[test]
    fn signals_and_timeouts() {
        let sig = Signal::parse("SIGKILL").unwrap();
        let e = run(Ending::Signaled(sig), ErrorFileOutcome::Empty, "", &ExitCodes::default());
        assert_eq!(e.to_string(), "ActionExecutionLost(BaseException): killed by signal SIGKILL");
        let mut codes = ExitCodes::default();
        codes.signals.insert("SIGKILL".into(), "Flaky".into());
        assert_eq!(run(Ending::Signaled(sig), ErrorFileOutcome::Empty, "", &codes).class, "Flaky");
        let e = run(Ending::TimedOut(std::time::Duration::from_secs(2)), ErrorFileOutcome::Empty, TB, &codes);
        assert_eq!(e.to_string(), "ActionTimeout(BaseException): timed out after 2s");
    }
}
