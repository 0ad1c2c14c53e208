//! The failure report: what a person (or cron's mail) needs to know about a failed run. For each
//! step that failed for good: every attempt this runner saw (start time, duration, error class
//! and message, its source, whether stopping it took SIGKILL after the grace period), why
//! retrying stopped, the end of the last attempt's stdout and stderr, and its log files; then the
//! run id with what to do next. The plain and quiet reporters print it; JSON mode does not (its
//! events carry all of it).
//!
//! Also the summary table that ends a run shown in plain (or live) mode: a row per step with its
//! status, attempts and duration, and a step that succeeded after failures marked `flaky` with
//! the errors it survived ([`History::summary_table`]).

use crate::classify::ErrorValue;
use crate::events::{
    AttemptEnd, Earlier, EarlierAttempt, Envelope, Event, Failure, RunOutcome, SkipReason, StepOutcome,
};
use std::collections::HashMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// Lines of the last attempt's stdout and stderr repeated in the report.
pub(crate) const TAIL_LINES: usize = 10;

/// A duration for people, to the millisecond; one that is not nothing but under a millisecond is
/// `<1ms`, not `0s` (a quick attempt took some time).
pub(crate) fn human(d: Duration) -> String {
    match d.as_millis() {
        0 if !d.is_zero() => "<1ms".to_owned(),
        ms => humantime::format_duration(Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))).to_string(),
    }
}

/// One attempt as this runner saw it, or as the store recorded an earlier runner's.
struct Row {
    attempt: u32,
    redelivered: bool,
    started: Option<SystemTime>,
    end: Option<RowEnd>,
    /// Made by an earlier runner of the run (it was resumed).
    earlier: bool,
    /// Made on another host (a shared store), whose logs are there: that host, and the stem of
    /// its log files as recorded.
    elsewhere: Option<(String, PathBuf)>,
}

impl Row {
    /// An attempt as the store recorded it; `earlier` when an earlier runner made it.
    fn recorded(a: &EarlierAttempt, earlier: bool) -> Row {
        let end = a.end.map(|(ended, outcome)| RowEnd {
            // Recorded to the millisecond: one that took less is `<1ms`, as this runner says of
            // its own, not `0s`.
            duration: ended.duration_since(a.started).unwrap_or_default().max(Duration::from_nanos(1)),
            outcome,
            error: a.error.clone(),
            killed_after_grace: a.killed_after_grace,
            by_fail_fast: false,
        });
        let elsewhere = a.logs_on.as_ref().map(|h| (h.clone(), a.log_stem.clone()));
        Row { attempt: a.attempt, redelivered: a.redelivered, started: Some(a.started), end, earlier, elsewhere }
    }
}

/// A recorded attempt's line as `waymark status --attempts` lists it: as the failure report's,
/// one per attempt however alike; `unended` says what became of one that has no end.
pub(crate) fn attempt_line(a: &EarlierAttempt, unended: &str) -> String {
    describe_as(&Row::recorded(a, false), unended)
}

struct RowEnd {
    duration: Duration,
    outcome: AttemptEnd,
    error: Option<ErrorValue>,
    killed_after_grace: bool,
    /// Cancelled by `fail_fast` (no signal to the runner; unknown, so false, for an attempt an
    /// earlier runner made).
    by_fail_fast: bool,
}

/// One step as this runner saw it.
struct StepSeen {
    name: String,
    rows: Vec<Row>,
    /// The attempts its budget allows, from its latest attempt (counted from the run's first
    /// attempt, as attempt numbers are).
    max_attempts: Option<u32>,
    /// The attempts used before its current budget began (`waymark resume` of a failed run gave
    /// it a fresh one): as recorded when the run was resumed ([`History::prefill`]), and once it
    /// ended, its attempt number less the attempts of the budget.
    budget_base: u32,
    /// When its first attempt in this runner was issued (or said to start, if earlier).
    started: Option<SystemTime>,
    /// How it ended, and when.
    ended: Option<(StepOutcome, SystemTime)>,
    /// When its last attempt, cancelled, or its catch handler ended in this runner, if nothing of
    /// it ran or waited after: where the time of a step cut short (by a signal, or `fail_fast`)
    /// ends.
    last_end: Option<SystemTime>,
    skipped: Option<SkipReason>,
    /// The error it failed with for good (not retried after it).
    final_error: Option<ErrorValue>,
    /// The error class its catch handler ran for.
    handled: Option<String>,
    /// Its catch handler failed: for the error of which attempt, and why.
    handler_failed: Option<(u32, String)>,
    /// Its catch handler was cancelled by `fail_fast`: its error was left unhandled.
    handler_cut: bool,
    /// A retry was scheduled after its last attempt: a failed last attempt without one is the
    /// step's failure for good, for its catch handler.
    retry_scheduled: bool,
}

/// The steps and their attempts as this runner saw them, kept from the events for the failure
/// report and the summary table.
#[derive(Default)]
pub(crate) struct History {
    /// In the order the steps were first heard of.
    steps: Vec<StepSeen>,
    index: HashMap<String, usize>,
    /// The attempts earlier runners of a resumed run made, per step ([`History::prefill`]); only
    /// the failure report lists them, the summary table is this runner's (but for the count of a
    /// step left under way that this runner did not run again, [`History::under_way`]).
    earlier: HashMap<String, Vec<Row>>,
    /// The steps of a resumed run that earlier runners left under way, with the number of the
    /// last attempt their budget allows, as recorded ([`History::prefill`]): a step that this
    /// runner stopped before it ran it again is `interrupted` in the summary table, with the
    /// attempts it used before, as `waymark status` counts them (it waited for a slot).
    under_way: HashMap<String, u32>,
    /// The attempts used before their current budget by the steps of a resumed run that had
    /// some, as recorded ([`History::prefill`]).
    budget_bases: HashMap<String, u32>,
    /// A compensation started: the run's succeeded steps were undone, and it cannot be resumed.
    compensated: bool,
    /// The run ended interrupted (a signal).
    interrupted: bool,
    /// A step failed for good in this runner.
    failed_for_good: bool,
    /// The flow has `fail_fast` ([`History::set_flow`]).
    fail_fast: bool,
    /// The flow's file, which `waymark run --fresh` runs anew ([`History::set_flow`]).
    flow_file: Option<PathBuf>,
}

/// How the run ended, as far as the summary table's details say.
#[derive(Clone, Copy)]
struct Ending {
    /// Its compensations ran: it cannot be resumed.
    compensated: bool,
    /// A signal interrupted it after a step failed for good under `fail_fast`: its resume runs
    /// what it left (compensations, hooks) and fails it; no step under way goes on.
    can_only_fail: bool,
    /// A signal interrupted it after a step failed for good: its resume starts no step that had
    /// not started (with or without `fail_fast`).
    starts_nothing: bool,
}

impl History {
    fn ending(&self) -> Ending {
        let can_only_fail = self.interrupted && self.fail_fast && self.failed_for_good;
        let starts_nothing = self.interrupted && self.failed_for_good;
        Ending { compensated: self.compensated, can_only_fail, starts_nothing }
    }

    fn seen(&mut self, step: &str) -> &mut StepSeen {
        let i = match self.index.get(step) {
            Some(i) => *i,
            None => {
                let budget_base = self.budget_bases.get(step).copied().unwrap_or(0);
                self.steps.push(StepSeen {
                    name: step.to_owned(),
                    rows: Vec::new(),
                    max_attempts: None,
                    budget_base,
                    started: None,
                    ended: None,
                    last_end: None,
                    skipped: None,
                    final_error: None,
                    handled: None,
                    handler_failed: None,
                    handler_cut: false,
                    retry_scheduled: false,
                });
                self.index.insert(step.to_owned(), self.steps.len() - 1);
                self.steps.len() - 1
            }
        };
        &mut self.steps[i]
    }

    /// Whether step `step` has had an attempt, in this runner or an earlier one.
    pub(crate) fn ran(&self, step: &str) -> bool {
        !self.rows(step).is_empty() || self.earlier.get(step).is_some_and(|rows| !rows.is_empty())
    }

    fn rows(&self, step: &str) -> &[Row] {
        self.index.get(step).map(|i| self.steps[*i].rows.as_slice()).unwrap_or_default()
    }

    /// Keep what `envelope` says about a step or an attempt.
    pub(crate) fn record(&mut self, envelope: &Envelope) {
        let at = envelope.at;
        match &envelope.event {
            Event::StepReady { step } => {
                self.seen(step);
            }
            Event::StepStarted { step } => {
                self.seen(step).started.get_or_insert(at);
            }
            Event::StepSkipped { step, reason } => self.seen(step).skipped = Some(*reason),
            Event::AuxStarted { kind: crate::store::AuxKind::Compensate, .. } => self.compensated = true,
            Event::RunFinished { outcome: RunOutcome::Interrupted { .. }, .. } => self.interrupted = true,
            Event::AttemptStarted { step, attempt, max_attempts, redelivered, .. } => {
                let row = Row {
                    attempt: *attempt,
                    redelivered: *redelivered,
                    started: Some(at),
                    end: None,
                    earlier: false,
                    elsewhere: None,
                };
                let seen = self.seen(step);
                seen.max_attempts = Some(*max_attempts);
                seen.rows.push(row);
                seen.retry_scheduled = false;
                seen.last_end = None;
            }
            Event::StepWaiting { step, .. } => self.seen(step).retry_scheduled = true,
            Event::AttemptFinished {
                step,
                attempt,
                max_attempts,
                outcome,
                error,
                duration,
                killed_after_grace,
                signal,
                ..
            } => {
                let seen = self.seen(step);
                seen.max_attempts = Some(*max_attempts);
                // Cut short: the step stopped there. A failed attempt leaves it waiting (for a
                // retry, or its catch handler).
                seen.last_end = (*outcome == AttemptEnd::Cancelled).then_some(at);
                // The step's time counts from its first attempt's issue, as the attempt's duration
                // does: one that waited for a free slot (and timed out there, never started) began
                // then, not when its start was said.
                if let Some(issued) = at.checked_sub(*duration)
                    && seen.started.is_none_or(|started| issued < started)
                {
                    seen.started = Some(issued);
                }
                let end = RowEnd {
                    duration: *duration,
                    outcome: *outcome,
                    error: error.clone(),
                    killed_after_grace: *killed_after_grace,
                    by_fail_fast: *outcome == AttemptEnd::Cancelled && signal.is_none(),
                };
                match seen.rows.last_mut() {
                    Some(row) if row.attempt == *attempt && row.end.is_none() => row.end = Some(end),
                    _ => seen.rows.push(Row {
                        attempt: *attempt,
                        redelivered: false,
                        started: None,
                        end: Some(end),
                        earlier: false,
                        elsewhere: None,
                    }),
                }
            }
            Event::RetryStopped { step, error, .. } => self.seen(step).final_error = Some(error.clone()),
            Event::HandlerStarted { step, error, .. } => {
                let seen = self.seen(step);
                seen.handled = Some(error.clone());
                seen.last_end = None;
            }
            Event::HandlerFinished { step, attempt, outcome, why, signal, .. } => {
                let seen = self.seen(step);
                seen.last_end = Some(at);
                seen.handler_failed =
                    (*outcome == AttemptEnd::Failed).then(|| (*attempt, why.clone().unwrap_or_default()));
                seen.handler_cut = *outcome == AttemptEnd::Cancelled && signal.is_none();
            }
            Event::StepFinished { step, outcome, attempts } => {
                self.failed_for_good |= *outcome == StepOutcome::Failed;
                let seen = self.seen(step);
                seen.ended = Some((*outcome, at));
                // `attempts` counts the current budget's, as the failure report does. A step this
                // runner made no attempt of (a catch handler left to run) keeps what was recorded.
                if let Some(row) = seen.rows.last() {
                    seen.budget_base = row.attempt.saturating_sub(*attempts);
                }
            }
            _ => {}
        }
    }

    /// The flow's file (absolute), named in the report of a run that cannot be resumed, and
    /// whether the flow has `fail_fast`.
    pub(crate) fn set_flow(&mut self, path: &Path, fail_fast: bool) {
        self.flow_file = Some(path.to_owned());
        self.fail_fast = fail_fast;
    }

    /// Keep the attempts earlier runners made of the run, as recorded, so that the report lists
    /// them like this runner's (called before this runner's first attempt).
    pub(crate) fn prefill(&mut self, earlier: &Earlier) {
        self.compensated |= earlier.compensated;
        self.budget_bases.extend(earlier.budget_bases.iter().cloned());
        self.under_way.extend(earlier.under_way.iter().cloned());
        for a in &earlier.attempts {
            self.earlier.entry(a.step.clone()).or_default().push(Row::recorded(a, true));
        }
    }

    /// The summary table of the steps this runner heard of, in that order, one line each,
    /// indented by two spaces and newline-terminated (empty when there were none):
    ///
    /// ```text
    ///   STEP   STATUS  ATTEMPTS    DURATION  DETAIL
    ///   fetch  flaky        3/4      1s 3ms  ok on attempt 3 after ConnectionResetError x2
    /// ```
    ///
    /// The duration is the step's time in this runner, from its first attempt's issue (its timeout
    /// counts from then, a wait for a free slot included) to its end (backoffs included); for one
    /// that did not end, to its last attempt's (or catch handler's) end, or to the run's end when
    /// it was waiting for a retry then.
    ///
    /// The attempts of a step that `waymark resume` of a failed run gave a fresh budget are those
    /// of that budget, as the failure report (`budget spent: 3 of 3 attempts`) and `waymark
    /// status` count them, with those before it after (`3/3 (+3 before resume)`); the counts of
    /// all rows, and the `-` of a step without one, line up under `ATTEMPTS`.
    pub(crate) fn summary_table(&self, run_ended: SystemTime) -> String {
        let cells: Vec<([String; 5], String)> = self
            .steps
            .iter()
            .map(|s| summary_row(s, self.left_under_way(s), self.ran(&s.name), run_ended, self.ending()))
            .collect();
        if cells.is_empty() {
            return String::new();
        }
        // The attempts column: each count, and its header, right-aligned to the widest of them,
        // then what came before the budget, left-aligned: a count (or a `-`) stands under
        // `ATTEMPTS` whether any row says what came before or not, and every cell of the column,
        // the header's too, is as wide as the widest.
        const ATTEMPTS: &str = "ATTEMPTS";
        let count_width = cells.iter().map(|(r, _)| r[2].chars().count()).chain([ATTEMPTS.len()]).max().unwrap_or(0);
        let before_width = cells.iter().map(|(_, b)| b.chars().count()).max().unwrap_or(0);
        let attempts_cell = |count: &str, before: &str| format!("{count:>count_width$}{before:<before_width$}");
        let rows: Vec<[String; 5]> = cells
            .into_iter()
            .map(|(mut row, before)| {
                row[2] = attempts_cell(&row[2], &before);
                row
            })
            .collect();
        let header = ["STEP", "STATUS", &attempts_cell(ATTEMPTS, ""), "DURATION", "DETAIL"].map(str::to_owned);
        let width = |col: usize, min: usize| {
            std::iter::once(&header).chain(&rows).map(|r| r[col].chars().count()).max().unwrap_or(0).max(min)
        };
        let (w0, w1, w2, w3) = (width(0, 0), width(1, 0), width(2, 0), width(3, 10));
        let mut out = String::new();
        for [step, status, attempts, duration, detail] in std::iter::once(&header).chain(&rows) {
            let line = format!("  {step:<w0$}  {status:<w1$}  {attempts:>w2$}  {duration:>w3$}  {detail}");
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }

    /// The last attempt of step `s`, and the number of the last attempt its budget allows, when an
    /// earlier runner left it under way and this runner made no attempt of it (it stopped first).
    fn left_under_way(&self, s: &StepSeen) -> Option<(&Row, u32)> {
        if !s.rows.is_empty() {
            return None;
        }
        let max = *self.under_way.get(&s.name)?;
        self.earlier.get(&s.name)?.last().map(|row| (row, max))
    }

    /// The report of run `run_id`, which failed with `failures`; newline-terminated.
    pub(crate) fn report(&self, run_id: &str, failures: &[Failure]) -> String {
        let mut out = format!("waymark: run {run_id} failed\n");
        for f in failures {
            self.step(&mut out, run_id, f);
        }
        let next = if self.compensated {
            // `waymark resume` refuses such a run: say what does work, with the flow's file as the
            // shell needs it written (every reporter that shows the report is handed it).
            let file = self
                .flow_file
                .as_deref()
                .map_or_else(|| "FLOW".to_owned(), |p| crate::flow::model::shell_word(&p.to_string_lossy()));
            // Whether they undid everything is theirs to say (one may have failed): `status` says.
            format!(
                "`waymark status {run_id}` shows it and how each of its compensations ended; a compensated run \
                 cannot be resumed: `waymark run --fresh {file}` starts the flow anew"
            )
        } else {
            format!(
                "`waymark status {run_id}` shows it; `waymark resume {run_id}` runs its failed steps again with a \
                 fresh budget"
            )
        };
        let _ = writeln!(out, "  run id: {run_id} ({next})");
        out
    }

    fn step(&self, out: &mut String, run_id: &str, f: &Failure) {
        let _ = writeln!(out, "  step {}:", f.step);
        let earlier = self.earlier.get(&f.step).map(Vec::as_slice).unwrap_or_default();
        let rows: Vec<&Row> = earlier.iter().chain(self.rows(&f.step)).collect();
        // Attempts of an earlier runner of the run that the store did not give (there should be none).
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
        for run in same_failures(&rows) {
            let line = match run {
                [row] => describe(row),
                run => describe_many(run),
            };
            let _ = writeln!(out, "    {line}");
        }
        // The error the step failed with, unless its last attempt's line said it.
        let said = rows.last().and_then(|r| r.end.as_ref()).and_then(|e| e.error.as_ref());
        if said != Some(&f.error) {
            let _ = writeln!(out, "    error: {} [{}]", f.error, f.error.source.describe());
        }
        out.push_str(&rest_of_message(&f.error, 6, &format!("`waymark status --json {run_id}`")));
        let _ = writeln!(out, "    {}", f.stopped.explain(&f.error));
        let exists = |p: &Path| std::fs::symlink_metadata(p).is_ok();
        let seen = self.index.get(&f.step).map(|i| &self.steps[*i]);
        if let Some((class, (attempt, why))) = seen.and_then(|s| s.handled.as_ref().zip(s.handler_failed.as_ref())) {
            let output = crate::store::statedir::output_said(&f.log_dir.join(format!("catch-{attempt}")));
            let _ = writeln!(
                out,
                "    its catch handler for {class} did not succeed ({why}), so the step fails with its error; {output}"
            );
        }
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
        // The latest run of the last attempt: one made on another host has its logs there.
        let last = rows.iter().rev().find(|r| r.attempt == f.last_attempt);
        if let Some((host, stem)) = last.and_then(|r| r.elsewhere.as_ref()) {
            let label = format!("logs (on host `{host}`): ");
            let _ = writeln!(out, "    {label}{}", stem.with_extension("stdout").display());
            let _ =
                writeln!(out, "    {:w$}{}", "", stem.with_extension("stderr").display(), w = label.chars().count());
            return;
        }
        // A log file is created on the first byte the attempt writes to its stream: name only
        // those that exist.
        let n = f.last_attempt;
        let _ = match (exists(&f.stdout_log), exists(&f.stderr_log)) {
            (true, true) => writeln!(out, "    logs: {}\n          {}", f.stdout_log.display(), f.stderr_log.display()),
            (true, false) => writeln!(
                out,
                "    logs: {} (no stderr log: attempt {n} wrote nothing to stderr)",
                f.stdout_log.display()
            ),
            (false, true) => writeln!(
                out,
                "    logs: {} (no stdout log: attempt {n} wrote nothing to stdout)",
                f.stderr_log.display()
            ),
            (false, false) => writeln!(out, "    logs: none (attempt {n} wrote nothing to stdout or stderr)"),
        };
    }
}

/// An error in one short line: its class and message, without its bases
/// (`UpstreamBusy: exit status 75`).
pub(crate) fn brief(e: &ErrorValue) -> String {
    let full = e.to_string();
    let bases = format!("({})", e.bases.join(", "));
    match full.strip_prefix(e.class.as_str()).and_then(|rest| rest.strip_prefix(bases.as_str())) {
        Some(rest) => format!("{}{rest}", e.class),
        None => full,
    }
}

/// Lines of a multi-line error message shown under the line that shows its first.
const MESSAGE_LINES: usize = 10;

/// The rest of `e`'s message when it has more than one line (its first line ends with ` …` where
/// the error is shown), for the failure report and `status`: up to 10 lines, each behind `indent`
/// spaces, then how many more there are and `where_whole` (a command that shows it whole).
pub(crate) fn rest_of_message(e: &ErrorValue, indent: usize, where_whole: &str) -> String {
    let mut out = String::new();
    let mut more = 0;
    for (i, line) in e.further_lines().enumerate() {
        if i < MESSAGE_LINES {
            let _ = writeln!(out, "{:w$}{line}", "", w = if line.is_empty() { 0 } else { indent });
        } else {
            more += 1;
        }
    }
    if more > 0 {
        let lines = if more == 1 { "line" } else { "lines" };
        let _ = writeln!(out, "{:indent$}… {more} more {lines} of the message: {where_whole} shows it whole", "");
    }
    out
}

/// A duration for the summary table, and for `status` and `history`: to the millisecond under a
/// minute, to the second under an hour, to the minute beyond.
pub(crate) fn short(d: Duration) -> String {
    let rounded = match d.as_secs() {
        0..60 => return human(d),
        60..3600 => Duration::from_secs(d.as_secs()),
        s => Duration::from_secs(s - s % 60),
    };
    humantime::format_duration(rounded).to_string()
}

/// A step's row in the summary table: step, status, attempts (of its current budget), duration,
/// detail; and what its attempts before that budget were (` (+3 before resume)`, or nothing).
/// What a step used before its current budget (`waymark resume` of a failed run gave it a fresh
/// one), said after its count of that budget: ` (+3 before resume)`, or nothing.
pub(crate) fn before_budget(base: u32) -> String {
    if base > 0 { format!(" (+{base} before resume)") } else { String::new() }
}

/// A step left under way by an earlier runner and not run again by this one is counted and said
/// from its last attempt (`earlier`, with the number of the last attempt its budget allows).
/// `ending`: how the run ended, as far as the table says.
fn summary_row(
    s: &StepSeen,
    earlier: Option<(&Row, u32)>,
    ran: bool,
    run_ended: SystemTime,
    ending: Ending,
) -> ([String; 5], String) {
    let last = s.rows.last().or(earlier.map(|(row, _)| row));
    let base = s.budget_base;
    let (attempts, before) = match (last, s.max_attempts.or(earlier.map(|(_, max)| max))) {
        (Some(row), Some(max)) => {
            let used = used(row).saturating_sub(base);
            (format!("{used}/{}", max.saturating_sub(base)), before_budget(base))
        }
        _ => ("-".to_owned(), String::new()),
    };
    let duration = match s.started {
        Some(from) => {
            // A step that did not end stopped when its attempt (or handler) was cut short, unless
            // it was waiting for a retry when the run ended.
            let stopped = s.last_end.filter(|_| !s.retry_scheduled);
            let to = s.ended.map(|(_, at)| at).or(stopped).unwrap_or(run_ended);
            short(to.duration_since(from).unwrap_or_default())
        }
        None => "-".to_owned(),
    };
    let last_error = || last.and_then(|r| r.end.as_ref()).and_then(|e| e.error.as_ref());
    let (status, detail) = match (s.ended, s.skipped) {
        (Some((StepOutcome::Succeeded, _)), _) => {
            let failures: Vec<&ErrorValue> = s
                .rows
                .iter()
                .filter_map(|r| r.end.as_ref())
                .filter(|e| e.outcome == AttemptEnd::Failed)
                .filter_map(|e| e.error.as_ref())
                .collect();
            let earlier = s.rows.first().map_or(0, |r| r.attempt.saturating_sub(1));
            if failures.is_empty() && earlier == 0 {
                ("ok", String::new())
            } else {
                let attempt = last.map_or(0, |r| r.attempt);
                let mut survived = survived(&failures);
                if earlier > 0 {
                    let runs = if earlier == 1 { "1 attempt" } else { "attempts" };
                    survived.push(format!("{runs} before this runner"));
                }
                ("flaky", format!("ok on attempt {attempt} after {}", survived.join(", ")))
            }
        }
        (Some((StepOutcome::Caught, _)), _) => {
            let class = s.handled.clone().or_else(|| last_error().map(|e| e.class.clone())).unwrap_or_default();
            ("caught", format!("caught {class}"))
        }
        (Some((StepOutcome::Failed, _)), _) => {
            ("failed", s.final_error.as_ref().or_else(last_error).map(brief).unwrap_or_default())
        }
        (None, Some(SkipReason::AlreadySucceeded)) => ("ok", "succeeded in an earlier runner".to_owned()),
        (None, Some(SkipReason::AlreadyCaught)) => ("caught", "caught in an earlier runner".to_owned()),
        (None, Some(SkipReason::AlreadyFailed)) => ("failed", "failed in an earlier runner".to_owned()),
        // A step that had run (its retry waited, or an earlier runner's attempt did not finish).
        (None, Some(SkipReason::RunFailed)) if s.handler_cut => {
            ("stopped", "its catch handler was cancelled by fail_fast; its error is not handled".to_owned())
        }
        (None, Some(SkipReason::RunFailed)) if ran => ("stopped", "not run again: the run failed first".to_owned()),
        (None, Some(SkipReason::DeadlinePassed)) if ran => {
            ("stopped", "not run again: the workflow's deadline passed".to_owned())
        }
        (None, Some(SkipReason::RunFailed)) => ("not run", "the run failed first".to_owned()),
        (None, Some(SkipReason::DeadlinePassed)) => ("not run", "the workflow's deadline passed".to_owned()),
        (None, None) => match last.map(|r| r.end.as_ref().map(|e| e.outcome)) {
            // Cancelled by `fail_fast` in a run whose compensations then ran: nothing resumes it.
            Some(Some(AttemptEnd::Cancelled)) if ending.compensated => {
                ("interrupted", "cancelled; the run was compensated, so it does not run again".to_owned())
            }
            // A step failed for good under `fail_fast` in a run a signal then interrupted before
            // its compensations or hooks: the resume runs those and fails the run, and no step
            // under way goes on (whichever of the two cancelled it).
            Some(end) if ending.can_only_fail && end != Some(AttemptEnd::Succeeded) => {
                let how = match last.and_then(|r| r.end.as_ref()) {
                    Some(e) if e.by_fail_fast => "cancelled by fail_fast; ",
                    Some(e) if e.outcome == AttemptEnd::Cancelled => "cancelled; ",
                    _ => "",
                };
                ("interrupted", format!("{how}the run fails when resumed"))
            }
            Some(Some(AttemptEnd::Cancelled)) | Some(None) => ("interrupted", "runs again on resume".to_owned()),
            Some(Some(AttemptEnd::Failed)) if s.retry_scheduled => {
                ("interrupted", "was to be retried; resumes with its retry".to_owned())
            }
            // No retry followed its failed attempt: a signal stopped it in or before its catch
            // handler, which runs again on resume.
            Some(Some(AttemptEnd::Failed)) => ("interrupted", "its catch handler runs again on resume".to_owned()),
            Some(Some(AttemptEnd::Succeeded)) => ("ok", String::new()),
            // Ready, but a step had failed for good: the resume starts no new step either.
            None if ending.starts_nothing => {
                ("not run", "a step failed for good first; it does not run on resume".to_owned())
            }
            // Ready, but the run stopped (a signal, waymark's own failure) before it got a slot.
            None => ("not run", "the run stopped before it started; runs on resume".to_owned()),
        },
    };
    ([s.name.clone(), status.to_owned(), attempts, duration, detail], before)
}

/// The attempts a step whose last attempt is `last` used, counted from the run's first as
/// attempt numbers are: `last`'s number, less one when a signal cancelled it, since a cancelled
/// attempt is not counted against the budget (it runs again under its number on resume), as
/// `waymark status` counts it. An attempt whose runner died before it ended counts, whether the
/// step is under way or was then skipped (the workflow's deadline had passed, say): it ran.
fn used(last: &Row) -> u32 {
    match &last.end {
        Some(RowEnd { outcome: AttemptEnd::Cancelled, .. }) => last.attempt.saturating_sub(1),
        _ => last.attempt,
    }
}

/// `ConnectionResetError x2, TimeoutError`: the classes of `errors`, in the order first seen,
/// with how often when more than once.
fn survived(errors: &[&ErrorValue]) -> Vec<String> {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for e in errors {
        match counts.iter_mut().find(|(class, _)| *class == e.class) {
            Some((_, n)) => *n += 1,
            None => counts.push((&e.class, 1)),
        }
    }
    counts.into_iter().map(|(class, n)| if n > 1 { format!("{class} x{n}") } else { class.to_owned() }).collect()
}

/// How many attempts in a row that failed the same way the report gives one line: fewer are
/// listed one by one.
const SAME_IN_A_ROW: usize = 3;

/// `rows` cut into runs: `SAME_IN_A_ROW` or more attempts in a row that failed with the same error
/// the same way (each with a start time, the same redelivered and earlier-runner marks, and
/// SIGKILL after the grace period for all or none) make one run; every other attempt is a run of
/// its own.
fn same_failures<'a, 'r>(rows: &'a [&'r Row]) -> Vec<&'a [&'r Row]> {
    fn key(r: &Row) -> Option<(&ErrorValue, bool, bool, bool)> {
        match &r.end {
            Some(RowEnd { outcome: AttemptEnd::Failed, error: Some(e), killed_after_grace, .. })
                if r.started.is_some() =>
            {
                Some((e, *killed_after_grace, r.redelivered, r.earlier))
            }
            _ => None,
        }
    }
    let mut runs = Vec::new();
    let mut from = 0;
    while from < rows.len() {
        let first = key(rows[from]);
        let mut to = from + 1;
        while first.is_some() && to < rows.len() && key(rows[to]) == first {
            to += 1;
        }
        if to - from >= SAME_IN_A_ROW {
            runs.push(&rows[from..to]);
        } else {
            runs.extend((from..to).map(|i| &rows[i..=i]));
        }
        from = to;
    }
    runs
}

/// The line of a run of attempts that failed the same way (see [`same_failures`]): from the first
/// to the last, when they started, how long each took, and their error.
fn describe_many(run: &[&Row]) -> String {
    let (Some(first), Some(last)) = (run.first(), run.last()) else { return String::new() };
    let took = || run.iter().filter_map(|r| r.end.as_ref().map(|e| e.duration));
    let (least, most) = (took().min().unwrap_or_default(), took().max().unwrap_or_default());
    let took = if human(least) == human(most) {
        format!("each took {}", human(least))
    } else {
        format!("each took {} to {}", human(least), human(most))
    };
    let when = |r: &Row| r.started.map(humantime::format_rfc3339_seconds).map(|t| t.to_string()).unwrap_or_default();
    let ending = last.end.as_ref().map(ending).unwrap_or_default();
    let started = match (when(first), when(last)) {
        (from, to) if from == to => from,
        (from, to) => format!("{from} to {to}"),
    };
    format!("attempts {} to {}{}: started {started}, {took}: {ending}", first.attempt, last.attempt, again(first))
}

/// What is said of an attempt made again, or by an earlier runner.
fn again(row: &Row) -> &'static str {
    match (row.redelivered, row.earlier) {
        (true, true) => " (redelivered, by an earlier runner)",
        (false, true) => " (by an earlier runner)",
        (true, false) => " (redelivered)",
        (false, false) => "",
    }
}

/// How an attempt ended: its error and where the class came from, and whether it needed SIGKILL.
fn ending(end: &RowEnd) -> String {
    let mut text = match (&end.outcome, &end.error) {
        (AttemptEnd::Failed, Some(e)) => format!("{e} [{}]", e.source.describe()),
        (AttemptEnd::Failed, None) => "failed".to_owned(),
        (AttemptEnd::Succeeded, _) => "succeeded".to_owned(),
        (AttemptEnd::Cancelled, _) => "cancelled".to_owned(),
    };
    if end.killed_after_grace {
        text.push_str("; still running after the grace period, so killed with SIGKILL");
    }
    text
}

/// An attempt's line in the report.
fn describe(row: &Row) -> String {
    describe_as(row, if row.earlier { "its runner died before it ended" } else { "did not end in this runner" })
}

/// An attempt's line, `unended` saying what became of it when it has no end.
fn describe_as(row: &Row, unended: &str) -> String {
    let mut text = format!("attempt {}{}:", row.attempt, again(row));
    if let Some(at) = row.started {
        let _ = write!(text, " started {},", humantime::format_rfc3339_seconds(at));
    }
    let Some(end) = &row.end else {
        let _ = write!(text, " {unended}");
        return text;
    };
    let _ = write!(text, " took {}: {}", human(end.duration), ending(end));
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

    /// An attempt quicker than a millisecond took `<1ms` in the report and in the summary alike,
    /// never `0s` in one and `1ms` in the other; nothing at all is still `0s`.
    #[test]
    fn a_duration_under_a_millisecond_reads_as_under_one_in_the_report_and_the_summary() {
        let quick = Duration::from_micros(700);
        assert_eq!((human(quick), short(quick)), ("<1ms".to_owned(), "<1ms".to_owned()));
        assert_eq!((human(Duration::ZERO), short(Duration::ZERO)), ("0s".to_owned(), "0s".to_owned()));
        let some = Duration::from_micros(12_900);
        assert_eq!((human(some), short(some)), ("12ms".to_owned(), "12ms".to_owned()));
        assert_eq!(short(Duration::from_millis(61_500)), "1m 1s");
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
        // Attempt 2 wrote to stdout only: its stdout log exists, its stderr log does not.
        let logs = tempfile::tempdir().unwrap();
        let mut f = failure("fetch", timeout, stopped, 2);
        (f.stdout_log, f.stderr_log) = (logs.path().join("attempt-2.stdout"), logs.path().join("attempt-2.stderr"));
        std::fs::write(&f.stdout_log, "row 12\n").unwrap();
        let report = history.report("r1", &[f]).replace(&logs.path().display().to_string(), "/s/logs/r1/fetch");
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
             logs: /s/logs/r1/fetch/attempt-2.stdout (no stderr log: attempt 2 wrote nothing to stderr)\n  \
             run id: r1 (`waymark status r1` shows it; `waymark resume r1` runs its failed steps again with a \
             fresh budget)\n"
        );
    }

    /// Three or more attempts in a row that failed the same way share a line; two, or a different
    /// error or ending between them, are listed one by one.
    #[test]
    fn attempts_that_failed_the_same_way_in_a_row_share_a_line() {
        let mut history = History::default();
        let status = error("CalledProcessError", "exit status 1", ErrorSource::ExitStatus);
        let other = error("CalledProcessError", "exit status 7", ErrorSource::ExitStatus);
        let timeout = error("ActionTimeout", "timed out after 1s", ErrorSource::Timeout);
        // 1-4 exit 1; 5 exit 7; 6-7 exit 1 (two); 8-10 time out, 10 needing SIGKILL (another ending).
        let ends = [
            (&status, false),
            (&status, false),
            (&status, false),
            (&status, false),
            (&other, false),
            (&status, false),
            (&status, false),
            (&timeout, false),
            (&timeout, false),
            (&timeout, true),
        ];
        for (i, (e, killed)) in ends.into_iter().enumerate() {
            let (attempt, ms) = (i as u32 + 1, i as u64 * 1000);
            history.record(&envelope(ms, started("x", attempt, false)));
            history.record(&envelope(ms + 5 + i as u64, finished("x", attempt, e.clone(), 5 + i as u64, killed)));
        }
        let stopped = RetryStop {
            reason: StopReason::Exhausted,
            exception_types: vec!["Exception".into()],
            attempts: 10,
            attempts_allowed: 10,
        };
        let report = history.report("r1", &[failure("x", timeout, stopped, 10)]);
        let body: Vec<&str> = report.lines().skip(2).take(7).collect();
        assert_eq!(
            body,
            [
                "    attempts 1 to 4: started 2026-01-02T03:04:05Z to 2026-01-02T03:04:08Z, each took 5ms to 8ms: \
                 CalledProcessError(SubprocessError, Exception, BaseException): exit status 1 [exit status]",
                "    attempt 5: started 2026-01-02T03:04:09Z, took 9ms: CalledProcessError(SubprocessError, Exception, \
                 BaseException): exit status 7 [exit status]",
                "    attempt 6: started 2026-01-02T03:04:10Z, took 10ms: CalledProcessError(SubprocessError, Exception, \
                 BaseException): exit status 1 [exit status]",
                "    attempt 7: started 2026-01-02T03:04:11Z, took 11ms: CalledProcessError(SubprocessError, Exception, \
                 BaseException): exit status 1 [exit status]",
                "    attempt 8: started 2026-01-02T03:04:12Z, took 12ms: ActionTimeout(BaseException): timed out after \
                 1s [timeout]",
                "    attempt 9: started 2026-01-02T03:04:13Z, took 13ms: ActionTimeout(BaseException): timed out after \
                 1s [timeout]",
                "    attempt 10: started 2026-01-02T03:04:14Z, took 14ms: ActionTimeout(BaseException): timed out after \
                 1s [timeout]; still running after the grace period, so killed with SIGKILL",
            ]
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

    /// The report names only the log files the last attempt created (a log is created on the
    /// first byte written to its stream); one made on another host keeps its recorded paths,
    /// with the host they are on.
    #[test]
    fn the_report_names_the_log_files_that_exist_or_the_host_they_are_on() {
        let value = error("ValueError", "bad", ErrorSource::Traceback);
        let stopped =
            RetryStop { reason: StopReason::NotRetryable, exception_types: vec![], attempts: 1, attempts_allowed: 1 };
        let logs = tempfile::tempdir().unwrap();
        let dir = logs.path().display().to_string();
        let lines = |history: &History, wrote: &[&str]| {
            let mut f = failure("load", value.clone(), stopped.clone(), 1);
            (f.stdout_log, f.stderr_log) = (logs.path().join("attempt-1.stdout"), logs.path().join("attempt-1.stderr"));
            for stream in ["stdout", "stderr"] {
                let path = logs.path().join(format!("attempt-1.{stream}"));
                match wrote.contains(&stream) {
                    true => std::fs::write(&path, "x\n").unwrap(),
                    false => drop(std::fs::remove_file(&path)),
                }
            }
            let report = history.report("r1", &[f]).replace(&dir, "DIR");
            let from_logs = report.lines().skip_while(|l| !l.starts_with("    logs"));
            from_logs.take_while(|l| !l.starts_with("  run id")).map(str::to_owned).collect::<Vec<_>>()
        };
        let mut here = History::default();
        here.record(&envelope(0, started("load", 1, false)));
        here.record(&envelope(5, finished("load", 1, value.clone(), 5, false)));
        assert_eq!(
            lines(&here, &["stdout", "stderr"]),
            ["    logs: DIR/attempt-1.stdout", "          DIR/attempt-1.stderr"]
        );
        assert_eq!(
            lines(&here, &["stdout"]),
            ["    logs: DIR/attempt-1.stdout (no stderr log: attempt 1 wrote nothing to stderr)"]
        );
        assert_eq!(
            lines(&here, &["stderr"]),
            ["    logs: DIR/attempt-1.stderr (no stdout log: attempt 1 wrote nothing to stdout)"]
        );
        assert_eq!(lines(&here, &[]), ["    logs: none (attempt 1 wrote nothing to stdout or stderr)"]);
        // Made by an earlier runner on another host: its logs are there, whatever is here.
        let mut elsewhere = History::default();
        elsewhere.prefill(&earlier_failure(&value, 5, Some("far-away")));
        assert_eq!(
            lines(&elsewhere, &[]),
            [
                "    logs (on host `far-away`): /far/logs/r1/load/attempt-1.stdout",
                "                               /far/logs/r1/load/attempt-1.stderr"
            ]
        );
    }

    /// Attempt 1 of step `load` by an earlier runner, failed with `error` after `took_ms`, on host
    /// `far` (its logs there) or here.
    fn earlier_failure(error: &ErrorValue, took_ms: u64, far: Option<&str>) -> Earlier {
        let stem = if far.is_some() { "/far/logs/r1/load/attempt-1" } else { "/logs/r1/load/attempt-1" };
        Earlier {
            attempts: vec![EarlierAttempt {
                step: "load".into(),
                attempt: 1,
                redelivered: false,
                started: at(0),
                end: Some((at(took_ms), AttemptEnd::Failed)),
                error: Some(error.clone()),
                killed_after_grace: false,
                log_stem: stem.into(),
                logs_on: far.map(str::to_owned),
            }],
            compensated: false,
            budget_bases: Vec::new(),
            under_way: Vec::new(),
        }
    }

    /// An earlier runner's attempt recorded as ending in the millisecond it started took `<1ms`,
    /// as this runner says of its own, not `0s`.
    #[test]
    fn an_earlier_attempt_quicker_than_a_millisecond_took_under_one() {
        let value = error("ValueError", "bad", ErrorSource::Traceback);
        let mut history = History::default();
        history.prefill(&earlier_failure(&value, 0, None));
        let stopped =
            RetryStop { reason: StopReason::NotRetryable, exception_types: vec![], attempts: 1, attempts_allowed: 1 };
        let report = history.report("r1", &[failure("load", value, stopped, 1)]);
        assert_eq!(
            report.lines().nth(2),
            Some(
                "    attempt 1 (by an earlier runner): started 2026-01-02T03:04:05Z, took <1ms: ValueError(Exception, \
                 BaseException): bad [traceback]"
            ),
            "{report}"
        );
    }

    /// `waymark resume` refuses a run whose compensations ran: its report names the flow's own
    /// file for `waymark run --fresh`, written as the shell needs it.
    #[test]
    fn the_report_of_a_compensated_run_names_its_flow_file_for_a_fresh_run() {
        let value = error("ValueError", "bad", ErrorSource::Traceback);
        let stopped =
            RetryStop { reason: StopReason::NotRetryable, exception_types: vec![], attempts: 1, attempts_allowed: 1 };
        let undo = Event::AuxStarted { kind: crate::store::AuxKind::Compensate, name: "a".into(), pid: None };
        for (file, shown) in [
            ("/srv/etl/nightly.toml", "/srv/etl/nightly.toml"),
            ("/srv/my flows/it's.toml", r"'/srv/my flows/it'\''s.toml'"),
        ] {
            let mut history = History::default();
            history.set_flow(Path::new(file), false);
            history.record(&envelope(0, started("load", 1, false)));
            history.record(&envelope(5, finished("load", 1, value.clone(), 5, false)));
            history.record(&envelope(6, undo.clone()));
            let report = history.report("r1", &[failure("load", value.clone(), stopped.clone(), 1)]);
            assert_eq!(
                report.lines().last(),
                Some(
                    format!(
                        "  run id: r1 (`waymark status r1` shows it and how each of its compensations ended; a \
                         compensated run cannot be resumed: `waymark run --fresh {shown}` starts the flow anew)"
                    )
                    .as_str()
                )
            );
        }
    }

    fn ok(step: &str, attempt: u32, ms: u64) -> Event {
        Event::AttemptFinished {
            step: step.into(),
            attempt,
            max_attempts: 3,
            outcome: AttemptEnd::Succeeded,
            error: None,
            duration: Duration::from_millis(ms),
            retry: None,
            stopped: None,
            exit_code: None,
            signal: None,
            killed_after_grace: false,
        }
    }

    fn step_event(step: &str, outcome: StepOutcome, attempts: u32) -> Event {
        Event::StepFinished { step: step.into(), outcome, attempts }
    }

    /// An attempt that waited 300 ms for a free slot and timed out there, never started: its step
    /// took those 300 ms, as the attempt's duration and the failure report say, not the instant
    /// between its start being said and its end.
    #[test]
    fn a_step_that_timed_out_waiting_for_a_slot_took_the_time_it_waited() {
        let mut history = History::default();
        let timeout =
            error("ActionTimeout", "timed out after 300ms before its program was started", ErrorSource::Timeout);
        let stop =
            RetryStop { reason: StopReason::NotRetryable, exception_types: vec![], attempts: 1, attempts_allowed: 1 };
        let events = [
            envelope(1000, Event::StepStarted { step: "ping".into() }),
            envelope(1000, started("ping", 1, false)),
            envelope(1000, finished("ping", 1, timeout.clone(), 300, false)),
            envelope(1000, Event::RetryStopped { step: "ping".into(), attempt: 1, error: timeout, stop }),
            envelope(1000, step_event("ping", StepOutcome::Failed, 1)),
        ];
        for e in &events {
            history.record(e);
        }
        assert_eq!(
            history.summary_table(at(1000)),
            "  STEP  STATUS  ATTEMPTS    DURATION  DETAIL
  ping  failed       1/3       300ms  ActionTimeout: timed out after 300ms before its program was started
"
        );
    }

    #[test]
    fn the_summary_table_marks_a_step_that_succeeded_after_failures_flaky_with_what_it_survived() {
        let mut history = History::default();
        let reset = error("ConnectionResetError", "peer reset", ErrorSource::Traceback);
        let busy = error("TimeoutError", "busy", ErrorSource::ExitCodeMapping);
        let value = error("ValueError", "bad row 7\nmore", ErrorSource::Traceback);
        let stop =
            RetryStop { reason: StopReason::NotRetryable, exception_types: vec![], attempts: 1, attempts_allowed: 3 };
        let events = [
            envelope(0, Event::StepSkipped { step: "setup".into(), reason: SkipReason::AlreadySucceeded }),
            envelope(0, Event::StepStarted { step: "fetch".into() }),
            envelope(0, started("fetch", 1, false)),
            envelope(10, finished("fetch", 1, reset.clone(), 10, false)),
            envelope(200, started("fetch", 2, false)),
            envelope(210, finished("fetch", 2, busy, 10, false)),
            envelope(600, started("fetch", 3, false)),
            envelope(610, finished("fetch", 3, reset, 10, false)),
            envelope(1000, started("fetch", 4, false)),
            envelope(1003, ok("fetch", 4, 3)),
            envelope(1003, step_event("fetch", StepOutcome::Succeeded, 4)),
            envelope(1003, Event::StepStarted { step: "quick".into() }),
            envelope(1003, started("quick", 1, false)),
            envelope(1020, ok("quick", 1, 17)),
            envelope(1020, step_event("quick", StepOutcome::Succeeded, 1)),
            envelope(1020, Event::StepStarted { step: "load".into() }),
            envelope(1020, started("load", 1, false)),
            envelope(1040, finished("load", 1, value.clone(), 20, false)),
            envelope(1040, Event::RetryStopped { step: "load".into(), attempt: 1, error: value, stop }),
            envelope(1040, step_event("load", StepOutcome::Failed, 1)),
            envelope(1041, Event::StepSkipped { step: "report".into(), reason: SkipReason::RunFailed }),
        ];
        for e in &events {
            history.record(e);
        }
        assert_eq!(
            history.summary_table(at(1041)),
            "  STEP    STATUS   ATTEMPTS    DURATION  DETAIL
  setup   ok              -           -  succeeded in an earlier runner
  fetch   flaky         4/3      1s 3ms  ok on attempt 4 after ConnectionResetError x2, TimeoutError
  quick   ok            1/3        17ms
  load    failed        1/3        20ms  ValueError: bad row 7 …
  report  not run         -           -  the run failed first
"
        );
    }

    /// After `waymark resume` of a failed run, a step's attempts are those of its fresh budget
    /// (as the failure report's `budget spent: 2 of 2 attempts` counts them), those before it
    /// after; every row's count (or `-`) lines up under `ATTEMPTS`, and a table without such a
    /// step is as it was.
    #[test]
    fn the_summary_table_counts_a_resumed_steps_attempts_of_its_fresh_budget() {
        let mut history = History::default();
        let value = error("ValueError", "bad", ErrorSource::Traceback);
        let stop =
            RetryStop { reason: StopReason::Exhausted, exception_types: vec![], attempts: 2, attempts_allowed: 2 };
        let with_max = |e: Event, max: u32| match e {
            Event::AttemptStarted { step, attempt, pid, redelivered, timeout, .. } => {
                Event::AttemptStarted { step, attempt, max_attempts: max, pid, redelivered, timeout }
            }
            Event::AttemptFinished { step, attempt, outcome, error, duration, killed_after_grace, .. } => {
                Event::AttemptFinished {
                    step,
                    attempt,
                    max_attempts: max,
                    outcome,
                    error,
                    duration,
                    retry: None,
                    stopped: None,
                    exit_code: None,
                    signal: None,
                    killed_after_grace,
                }
            }
            e => e,
        };
        let events = [
            envelope(0, Event::StepStarted { step: "load".into() }),
            envelope(0, with_max(started("load", 13, false), 14)),
            envelope(10, with_max(finished("load", 13, value.clone(), 10, false), 14)),
            envelope(10, with_max(started("load", 14, false), 14)),
            envelope(20, with_max(finished("load", 14, value.clone(), 10, false), 14)),
            envelope(20, Event::RetryStopped { step: "load".into(), attempt: 14, error: value, stop }),
            envelope(20, step_event("load", StepOutcome::Failed, 2)),
            envelope(20, Event::StepStarted { step: "fetch".into() }),
            envelope(20, with_max(started("fetch", 4, false), 5)),
            envelope(25, with_max(ok("fetch", 4, 5), 5)),
            envelope(25, step_event("fetch", StepOutcome::Succeeded, 1)),
            envelope(25, Event::StepStarted { step: "quick".into() }),
            envelope(25, started("quick", 1, false)),
            envelope(30, ok("quick", 1, 5)),
            envelope(30, step_event("quick", StepOutcome::Succeeded, 1)),
            envelope(30, Event::StepSkipped { step: "report".into(), reason: SkipReason::RunFailed }),
        ];
        for e in &events {
            history.record(e);
        }
        assert_eq!(
            history.summary_table(at(30)),
            "  STEP    STATUS   ATTEMPTS                        DURATION  DETAIL
  load    failed        2/2 (+12 before resume)        20ms  ValueError: bad
  fetch   flaky         1/2 (+3 before resume)          5ms  ok on attempt 4 after attempts before this runner
  quick   ok            1/3                             5ms
  report  not run         -                               -  the run failed first
"
        );
    }

    /// A step whose attempt's runner died (no end recorded), not run again because the workflow's
    /// deadline passed first, is counted as `waymark status` counts it once skipped: `1/1`, the
    /// attempt it made (as while such a step is under way).
    #[test]
    fn a_step_left_under_way_by_a_dead_runner_counts_its_unended_attempt_as_status_does() {
        let mut history = History::default();
        history.prefill(&Earlier {
            attempts: vec![EarlierAttempt {
                step: "slow".into(),
                attempt: 1,
                redelivered: false,
                started: at(0),
                end: None,
                error: None,
                killed_after_grace: false,
                log_stem: "/logs/r1/slow/attempt-1".into(),
                logs_on: None,
            }],
            compensated: false,
            budget_bases: Vec::new(),
            under_way: vec![("slow".into(), 1)],
        });
        history
            .record(&envelope(3_000, Event::StepSkipped { step: "slow".into(), reason: SkipReason::DeadlinePassed }));
        assert_eq!(
            history.summary_table(at(3_000)),
            "  STEP  STATUS   ATTEMPTS    DURATION  DETAIL\n  slow  stopped       1/1           -  not run again: the \
             workflow's deadline passed\n"
        );
        // Its line says so too: it ran, in an earlier runner.
        let line = super::super::plain::describe(
            &envelope(3_000, Event::StepSkipped { step: "slow".into(), reason: SkipReason::DeadlinePassed }),
            &crate::reporter::local_time::LocalTime::new(jiff::tz::TimeZone::UTC),
            &history,
        );
        assert_eq!(line.as_deref(), Some("waymark: slow: not run again: the workflow's deadline passed\n"));
    }

    #[test]
    fn the_summary_table_says_what_an_interruption_left() {
        let mut history = History::default();
        history.record(&envelope(0, Event::StepStarted { step: "slow".into() }));
        history.record(&envelope(0, started("slow", 2, true)));
        let table = history.summary_table(at(61_500));
        assert_eq!(table.lines().nth(1), Some("  slow  interrupted       2/3       1m 1s  runs again on resume"));
        assert_eq!(History::default().summary_table(at(0)), "", "no steps, no table");
        // An attempt a signal cancelled is not counted against the budget (it runs again under
        // its number on resume): attempt 2 cancelled is 1 attempt used, as `status` counts it.
        let cancelled = |signal: Option<&str>| Event::AttemptFinished {
            step: "slow".into(),
            attempt: 2,
            max_attempts: 3,
            outcome: AttemptEnd::Cancelled,
            error: None,
            duration: Duration::from_millis(61_500),
            retry: None,
            stopped: None,
            exit_code: None,
            signal: signal.map(str::to_owned),
            killed_after_grace: false,
        };
        history.record(&envelope(61_500, cancelled(None)));
        let table = history.summary_table(at(61_500));
        assert_eq!(table.lines().nth(1), Some("  slow  interrupted       1/3       1m 1s  runs again on resume"));
        // The run ended later (another step's kill grace): the step's time is its own, to its
        // attempt's end; a step waiting for a retry when the run ended, to the run's end.
        let table = history.summary_table(at(64_500));
        assert_eq!(table.lines().nth(1), Some("  slow  interrupted       1/3       1m 1s  runs again on resume"));
        let mut waiting = History::default();
        waiting.record(&envelope(0, started("slow", 1, true)));
        let failed = Event::AttemptFinished {
            step: "slow".into(),
            attempt: 1,
            max_attempts: 3,
            outcome: AttemptEnd::Failed,
            error: None,
            duration: Duration::from_millis(61_500),
            retry: None,
            stopped: None,
            exit_code: Some(1),
            signal: None,
            killed_after_grace: false,
        };
        waiting.record(&envelope(61_500, failed));
        let retry = crate::events::RetryPlan { delay: Duration::from_secs(10), wake_at: at(71_500) };
        waiting.record(&envelope(
            61_500,
            Event::StepWaiting { step: "slow".into(), next_attempt: 2, max_attempts: 3, retry },
        ));
        let table = waiting.summary_table(at(64_500));
        assert!(table.lines().nth(1).is_some_and(|l| l.contains("  1m 4s  ")), "{table}");
        // A step failed for good under `fail_fast`, and a signal interrupted the run before its
        // compensations or hooks: the resume runs those and fails the run, and runs this step no
        // more, whether `fail_fast` cancelled it (no signal) or the signal came first. Without
        // `fail_fast`, the step the signal cancelled runs again.
        let interrupted = Event::RunFinished {
            outcome: RunOutcome::Interrupted { signal: 15 },
            duration: Duration::from_millis(61_500),
            failures: Vec::new(),
        };
        for (fail_fast, signal, detail) in [
            (true, None, "cancelled by fail_fast; the run fails when resumed"),
            (true, Some("SIGTERM"), "cancelled; the run fails when resumed"),
            (false, Some("SIGTERM"), "runs again on resume"),
        ] {
            let mut history = History::default();
            history.set_flow(Path::new("/x/flow.toml"), fail_fast);
            history.record(&envelope(0, Event::StepStarted { step: "slow".into() }));
            history.record(&envelope(0, started("slow", 2, true)));
            history.record(&envelope(10, step_event("bad", StepOutcome::Failed, 1)));
            history.record(&envelope(61_500, cancelled(signal)));
            history.record(&envelope(61_500, interrupted.clone()));
            let table = history.summary_table(at(61_500));
            assert_eq!(
                table.lines().nth(1),
                Some(format!("  slow  interrupted       1/3       1m 1s  {detail}").as_str())
            );
        }
        // A step that was ready but never started, in a run a signal interrupted after a step
        // failed for good: the resume starts no new step, with or without `fail_fast`.
        for fail_fast in [true, false] {
            let mut history = History::default();
            history.set_flow(Path::new("/x/flow.toml"), fail_fast);
            history.record(&envelope(0, Event::StepReady { step: "later".into() }));
            history.record(&envelope(10, step_event("bad", StepOutcome::Failed, 1)));
            history.record(&envelope(61_500, interrupted.clone()));
            let table = history.summary_table(at(61_500));
            let row = table.lines().find(|l| l.starts_with("  later ")).unwrap_or_default().to_owned();
            assert!(row.ends_with("  a step failed for good first; it does not run on resume"), "{table}");
        }
        // Unless the run's compensations ran (`fail_fast` cancelled it): the run cannot be resumed.
        history.compensated = true;
        let table = history.summary_table(at(61_500));
        assert_eq!(
            table.lines().nth(1),
            Some(
                "  slow  interrupted       1/3       1m 1s  cancelled; the run was compensated, so it does not run again"
            )
        );
        // A step whose catch handler a signal stopped, or which it stopped before its handler
        // started (no retry followed the failed attempt), is not waiting for a retry: its handler
        // runs again. With a retry scheduled, it waited for the retry.
        let handler = Event::HandlerStarted { step: "load".into(), attempt: 1, error: "ValueError".into(), pid: None };
        let plan = crate::events::RetryPlan { delay: Duration::from_secs(60), wake_at: at(60_010) };
        let waiting = Event::StepWaiting { step: "load".into(), next_attempt: 2, max_attempts: 3, retry: plan };
        for (then, detail) in [
            (Some(handler), "its catch handler runs again on resume"),
            (None, "its catch handler runs again on resume"),
            (Some(waiting), "was to be retried; resumes with its retry"),
        ] {
            let mut history = History::default();
            let value = error("ValueError", "bad row", ErrorSource::Traceback);
            history.record(&envelope(0, Event::StepStarted { step: "load".into() }));
            history.record(&envelope(0, started("load", 1, false)));
            history.record(&envelope(10, finished("load", 1, value, 10, false)));
            if let Some(then) = then {
                history.record(&envelope(10, then));
            }
            let table = history.summary_table(at(500));
            assert_eq!(
                table.lines().nth(1),
                Some(format!("  load  interrupted       1/3       500ms  {detail}").as_str())
            );
        }
    }
}
