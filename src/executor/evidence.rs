//! The evidence reader: turns an attempt that ended badly into an error, from what it left
//! behind (its error file, the tail of its stderr) and how it ended. The classification itself is
//! `classify`'s; this part reads the files, no-follow, and never fails: what cannot be read is
//! no evidence. The tail of stderr comes from memory (kept by the output reader as it passed)
//! when the reader finished; the log is read only when it did not. The error it returns is as the
//! step reported it: the dispatcher matches it against the retry policy and the catch handlers,
//! then hides the run's secrets in it before it is recorded and shown (an error file that reports
//! an error was read before it was scrubbed, when the attempt ended; the stderr log and its tail
//! never held them).

use super::output::StderrTail;
use crate::classify::{self, Ending, ErrorSource, ErrorValue, Evidence, error_file};
use crate::flow::{Flow, Step};
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// How much of an attempt's stderr is kept for tracebacks and the failure report.
const STDERR_TAIL: u64 = StderrTail::KEEP as u64;
/// How much of it the failure report repeats at most.
const REPORT_TAIL: u64 = 4096;

/// The error of attempt `attempt` of `step`, whose files are at `stem` and whose stderr starts at
/// `stderr_from` in its log, as the step reported it (the caller hides the run's secrets in it
/// once its retry policy and catch handlers have matched it), and warnings for the user about the
/// evidence.
/// What `left` holds (the end of its stderr as it passed, its error file as it ended) is taken
/// as it is; the rest is read from the files.
#[allow(clippy::too_many_arguments)]
pub(crate) fn read(
    flow: &Flow,
    step: &Step,
    attempt: u32,
    ending: &Ending,
    stem: &Path,
    stderr_from: u64,
    left: super::Left,
) -> (ErrorValue, Vec<String>) {
    let (stderr_tail, stderr_cut) = match &left.stderr_tail {
        Some(tail) => tail.last(STDERR_TAIL as usize),
        None => read_tail(&stem.with_extension("stderr"), stderr_from, STDERR_TAIL),
    };
    let evidence = Evidence {
        classes: &flow.classes,
        step_codes: &step.exit_codes,
        flow_codes: &flow.exit_codes,
        detect_tracebacks: step.detect_tracebacks,
        error_file: match left.error_file {
            Some(read) => *read,
            None => error_file::read_error_file(&stem.with_extension("error.json")),
        },
        stderr_tail: &stderr_tail,
        named: &|class| {
            let names = |list: &[String]| list.iter().any(|n| n == class);
            names(&step.retry.exception_types) || step.catch.iter().any(|c| names(&c.exception_types))
        },
    };
    let (mut error, mut warnings) = classify::classify(ending, evidence);
    // A traceback longer than the tail has lost its header and is not recognised: say so rather
    // than report a plain exit status as if nothing were there.
    if stderr_cut
        && step.detect_tracebacks
        && *ending == Ending::Exited(1)
        && matches!(error.source, ErrorSource::ExitStatus | ErrorSource::ExitCodeMapping)
        && ends_with_cut_traceback(&stderr_tail)
    {
        let kib = STDERR_TAIL / 1024;
        error.message.push_str(&format!(" (the traceback may be cut: stderr tail is {kib} KiB; use an error file)"));
        warnings.push(format!(
            "attempt {attempt}: stderr ends like a Python traceback longer than the {kib} KiB that waymark reads, \
             so its error class was not recognised; report the error through WAYMARK_ERROR_FILE \
             (examples/helpers/waymark_errors.py does it for Python)"
        ));
    }
    (error, warnings)
}

/// The error of a run whose deadline (its top-level `timeout`) passed.
pub(crate) fn workflow_timeout(flow: &Flow) -> ErrorValue {
    let limit = flow.timeout.unwrap_or_default();
    let class = crate::classify::classes::WORKFLOW_TIMEOUT;
    ErrorValue {
        class: class.to_owned(),
        bases: flow.classes.bases(class).unwrap_or_default(),
        message: format!("the workflow's timeout of {} passed", humantime::format_duration(limit)),
        source: ErrorSource::Timeout,
    }
}

/// The end of an attempt's stderr, for the failure report.
pub(crate) fn report_tail(stem: &Path, stderr_from: u64) -> String {
    marked_tail(&stem.with_extension("stderr"), stderr_from)
}

/// The end of an attempt's stdout, for the failure report. Where an earlier execution of the same
/// attempt left output (a redelivered attempt), it precedes, before the line that marks where this
/// execution begins.
pub(crate) fn report_stdout_tail(stem: &Path) -> String {
    marked_tail(&stem.with_extension("stdout"), 0)
}

/// The last [`REPORT_TAIL`] bytes of a file after offset `from`, for the report: when the cut
/// falls inside a line, that line's end starts with `…`, so that it does not read as whole; when
/// it falls at a line's end, the tail starts with the next line. Empty if it cannot be read.
fn marked_tail(path: &Path, from: u64) -> String {
    let Ok(mut f) = crate::os::fs::open_read_nofollow(path) else { return String::new() };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    // A cut tail is read with the byte before it, which says whether the tail starts a line.
    let cut = len.saturating_sub(from) > REPORT_TAIL;
    let start = if cut { len - REPORT_TAIL - 1 } else { from };
    let mut buf = Vec::new();
    if f.seek(SeekFrom::Start(start)).is_err() || f.take(REPORT_TAIL + 1).read_to_end(&mut buf).is_err() {
        return String::new();
    }
    if !cut {
        return String::from_utf8_lossy(&buf).into_owned();
    }
    let (before, tail) = buf.split_first().map_or((b'\n', &[][..]), |(b, t)| (*b, t));
    if before == b'\n' {
        return String::from_utf8_lossy(tail).into_owned();
    }
    // A character the cut split: the rest of it is not shown (up to 3 continuation bytes).
    let split = tail.iter().take(3).take_while(|&&b| b & 0xC0 == 0x80).count();
    match &tail[split..] {
        // The cut line's own newline starts the tail: nothing of it is left to show.
        [b'\n', rest @ ..] => String::from_utf8_lossy(rest).into_owned(),
        tail => format!("…{}", String::from_utf8_lossy(tail)),
    }
}

/// The last `max` bytes of a file after offset `from`, lossily decoded, and whether there were
/// more than `max` after `from` (the tail is cut); empty if it cannot be read.
fn read_tail(path: &Path, from: u64, max: u64) -> (String, bool) {
    let Ok(mut f) = crate::os::fs::open_read_nofollow(path) else { return (String::new(), false) };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let cut = len.saturating_sub(from) > max;
    let start = len.saturating_sub(max).max(from);
    if f.seek(SeekFrom::Start(start)).is_err() {
        return (String::new(), cut);
    }
    let mut buf = Vec::new();
    let _ = f.take(max).read_to_end(&mut buf);
    (String::from_utf8_lossy(&buf).into_owned(), cut)
}

/// Whether `tail` ends like a Python traceback whose header was cut off: from its first frame
/// line on, it parses as a traceback once the header is put back.
fn ends_with_cut_traceback(tail: &str) -> bool {
    let Some(frame) = tail.find("\n  File \"") else { return false };
    let rebuilt = format!("Traceback (most recent call last):{}", &tail[frame..]);
    classify::traceback::parse_traceback(&rebuilt).is_some()
}
