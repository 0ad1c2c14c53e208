//! Reading runs back: `history`, `status`, `logs`, and `gc`.

use super::{CliError, EXIT_OK, read_store};
use crate::classify::ErrorValue;
use crate::cli::StreamArg;
use crate::events::EarlierAttempt;
use crate::flow::Flow;
use crate::flow::model::shell_word;
use crate::reporter::short;
use crate::store::lease::host_id;
use crate::store::lock::FlowLock;
use crate::store::{
    AttemptRecord, AttemptState, AuxKind, AuxRun, FlowKey, RunFilter, RunRecord, RunStatus, StateDir, StepRecord,
    StepState, Store, StoreError,
};
use crate::text::shown_path;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

fn time(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// An error as `status --json` gives it.
fn error_json(e: &ErrorValue) -> Value {
    json!({ "class": e.class, "bases": e.bases, "message": e.message, "source": e.source, "text": e.to_string() })
}

/// How attempt `a` stands as `status --attempts` shows it ([`seen`]).
fn attempt_state(a: &AttemptRecord, runner_alive: bool) -> AttemptState {
    seen(a.outcome, runner_alive)
}

/// A recorded outcome as `status` shows it: an attempt (or a compensation) whose runner died is
/// `runner_lost` whether a new runner has claimed the run yet or not.
fn seen(outcome: AttemptState, runner_alive: bool) -> AttemptState {
    match outcome {
        AttemptState::Running if !runner_alive => AttemptState::RunnerLost,
        outcome => outcome,
    }
}

/// The end and the duration in milliseconds that `--json` gives of an attempt or a compensation
/// with `outcome`: none for one whose runner died (the claim's time, which the store keeps as its
/// end, is not when it ended).
fn end_and_ms(
    outcome: AttemptState,
    started: SystemTime,
    ended: Option<SystemTime>,
) -> (Option<SystemTime>, Option<u64>) {
    let ended = ended.filter(|_| outcome != AttemptState::RunnerLost);
    let took = ended.map(|end| end.duration_since(started).unwrap_or_default());
    (ended, took.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)))
}

/// An attempt as `status --json --attempts` gives it ([`attempt_state`], [`end_and_ms`]).
fn attempt_json(a: &AttemptRecord, runner_alive: bool) -> Value {
    let outcome = attempt_state(a, runner_alive);
    let (ended, took) = end_and_ms(outcome, a.started_at, a.ended_at);
    json!({
        "attempt": a.attempt,
        "outcome": outcome.as_str(),
        "redelivered": a.redelivered,
        "started_at": time(a.started_at),
        "ended_at": opt_time(ended),
        "duration_ms": took,
        "error": a.error.as_ref().map(error_json),
        "killed_after_grace": a.killed_after_grace,
        "host": a.host,
        "stdout": log_file(a, "stdout"),
        "stderr": log_file(a, "stderr"),
    })
}

/// Attempt `a`'s log of `stream` as `status --json --attempts` gives it: its path, or `null` when
/// there is no such file because the attempt wrote nothing to it (a log is created on its first
/// byte). An attempt that ran on another host of a shared store keeps its path: its logs are
/// there.
fn log_file(a: &AttemptRecord, stream: &str) -> Value {
    let path = a.log_stem.with_extension(stream);
    match a.logs_on(super::shared_store()).is_some() || std::fs::symlink_metadata(&path).is_ok() {
        true => json!(path),
        false => Value::Null,
    }
}

fn opt_time(t: Option<SystemTime>) -> Value {
    t.map_or(Value::Null, |t| Value::String(time(t)))
}

fn took(start: SystemTime, end: Option<SystemTime>) -> Duration {
    let end = end.unwrap_or_else(SystemTime::now);
    end.duration_since(start).unwrap_or_default()
}

fn print_json(v: &Value) -> Result<(), CliError> {
    super::output::print(serde_json::to_string_pretty(v).unwrap_or_default() + "\n")
}

/// Where a FLOW argument is looked for, and whether it stands for a RUN (`status`, `logs`): a run
/// id was looked for first.
#[derive(Clone, Copy)]
struct Looking<'a> {
    state: &'a StateDir,
    for_run: bool,
}

/// A flow as the user named it on the command line.
enum Chosen {
    /// A flow file's path (canonical): the runs started from that file.
    File(std::path::PathBuf),
    /// The one flow a name stands for.
    Key(FlowKey),
    /// A name no run has.
    Unknown,
}

impl Chosen {
    /// Why a flow argument that found no runs is not an answer but a mistake: it names a flow
    /// file that does not exist (or, ending in `.toml`, looks like one) and no run was ever started
    /// from such a file.
    fn missing_file(&self, arg: &str) -> Option<String> {
        let what = match self {
            Chosen::File(path) if path.is_dir() => {
                format!("{} is a directory, not a flow file, and no run was started from that path", shown_path(path))
            }
            Chosen::File(path) if !path.is_file() => {
                format!("there is no flow file {}, and no run was started from that path", shown_path(path))
            }
            Chosen::Unknown if arg.ends_with(".toml") => {
                let here = std::env::current_dir().map(|d| format!(" in {}", d.display())).unwrap_or_default();
                format!("there is no flow file `{arg}`{here} and no flow named `{arg}`")
            }
            _ => return None,
        };
        Some(format!(
            "{what}; give the path of the flow file, or the flow's name (`waymark history` lists the runs and \
             their flows)"
        ))
    }

    fn filter<'a>(&'a self, name: &'a str) -> RunFilter<'a> {
        match self {
            Chosen::File(path) => RunFilter::File(path),
            Chosen::Key(key) => RunFilter::Key(key),
            Chosen::Unknown => RunFilter::Name(name),
        }
    }
}

/// What a flow argument means: a path when it holds a `/` or names an existing file, else a flow
/// name. A name that several flows have (same-stem files in different directories, or a declared
/// name that is also a file's stem) is refused with the list of them, never guessed.
fn choose_flow(store: &dyn Store, arg: &str, looked: Looking<'_>) -> Result<Chosen, CliError> {
    let path = Path::new(arg);
    if arg.contains('/') || path.is_file() {
        let canonical = std::fs::canonicalize(path).or_else(|_| std::path::absolute(path));
        let canonical =
            canonical.map_err(|e| CliError::Usage(format!("cannot resolve the flow file path `{arg}`: {e}")))?;
        return Ok(Chosen::File(canonical));
    }
    let flows = store.flows(RunFilter::Name(arg))?;
    // A flow file's stem is its name too, whatever it holds (`nightly backup`).
    if flows.is_empty() && !crate::flow::validate::is_flow_name(arg) {
        let shown = arg.escape_debug();
        let run = match looked.for_run {
            true => format!("no run has the id `{shown}`, and "),
            false => String::new(),
        };
        let listing = super::Looked::at(looked.state).listing.map(|l| format!(" ({l})")).unwrap_or_default();
        return Err(CliError::Usage(format!(
            "{run}`{shown}` is neither the name of a flow with runs here nor a flow file; give the flow's name (its \
             `name`, else its file's name without `.toml`), or the path of its flow file{listing}"
        )));
    }
    match flows.len() {
        0 => Ok(Chosen::Unknown),
        1 => Ok(Chosen::Key(flows.into_iter().next().map(|(k, _)| k).expect("one"))),
        n => {
            let mut message =
                format!("{n} flows are named `{arg}`; name one by its flow file's path (or give a run id) instead:");
            for (key, path) in &flows {
                match key.file() {
                    Some(file) => message.push_str(&format!("\n  {file}")),
                    None => message.push_str(&format!("\n  {} (declares `name = \"{arg}\"`)", shown_path(path))),
                }
            }
            Err(CliError::Usage(message))
        }
    }
}

/// Whether `run` is recorded as running but its runner is gone (killed, or the machine rebooted):
/// no runner holds its flow's lock for it (on a shared store: nobody's lease on its flow is live).
/// `status` and `history` say so alike.
pub(super) fn runner_gone(store: &dyn Store, state: &StateDir, run: &RunRecord) -> Result<bool, CliError> {
    if run.status != RunStatus::Running {
        return Ok(false);
    }
    let held = match store.lease_holder(&run.id) {
        Some(holder) => holder?.is_some(),
        None => FlowLock::is_held_for(state, &run.key, &run.id),
    };
    if held {
        return Ok(false);
    }
    // Read again: a runner that ended the run after `run` was read, and let its lock go before
    // the look at the lock, is not gone (monitoring read that as a false alarm).
    match store.run(&run.id) {
        Ok(now) => Ok(now.status == RunStatus::Running),
        // Ended, and deleted by gc since.
        Err(crate::store::StoreError::NoSuchRun(_)) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The last time run `run` recorded anything: its start, or the latest start or end of one of
/// its steps, attempts or compensations. A run whose runner is gone ran until then at least, and
/// nothing says how much longer, so `history` counts its duration up to then rather than to now.
fn last_recorded(store: &dyn Store, run: &RunRecord) -> Result<SystemTime, CliError> {
    let mut times = vec![run.started_at];
    for s in store.steps(&run.id)? {
        times.extend(s.started_at.into_iter().chain(s.ended_at));
    }
    for a in store.attempts(&run.id, None)? {
        times.extend(std::iter::once(a.started_at).chain(a.ended_at));
    }
    for a in store.aux_runs(&run.id)? {
        times.extend(std::iter::once(a.started_at).chain(a.ended_at));
    }
    Ok(times.into_iter().max().unwrap_or(run.started_at))
}

pub(crate) fn history(state: &StateDir, flow: Option<&str>, limit: usize, json: bool) -> Result<i32, CliError> {
    if limit == 0 {
        return Err(CliError::Usage(
            "`--limit 0` would show no runs; give a limit of 1 or more (the default is 20)".into(),
        ));
    }
    let store = read_store(state)?;
    let (runs, others) = match flow {
        None => (store.list_runs(RunFilter::All, limit)?, None),
        Some(f) => {
            let chosen = choose_flow(store.as_ref(), f, Looking { state, for_run: false })?;
            let runs = store.list_runs(chosen.filter(f), limit)?;
            if let Some(mistake) = runs.is_empty().then(|| chosen.missing_file(f)).flatten() {
                return Err(CliError::Usage(mistake));
            }
            // Said only in words, when there are none here.
            let others = match runs.is_empty() && !json {
                true => other_hosts(store.as_ref(), chosen.filter(f))?,
                false => None,
            };
            (runs, others)
        }
    };
    // The runs recorded as running whose runner is gone, as `status` tells them, with the last
    // time each recorded anything: its duration ends there.
    let mut gone = std::collections::HashMap::new();
    for r in &runs {
        if runner_gone(store.as_ref(), state, r)? {
            gone.insert(r.id.as_str(), last_recorded(store.as_ref(), r)?);
        }
    }
    if json {
        let rows: Vec<Value> = runs
            .iter()
            .map(|r| {
                json!({
                    "id": r.id, "flow": r.flow, "path": r.flow_path, "status": r.status.as_str(),
                    "started_at": time(r.started_at), "ended_at": opt_time(r.ended_at),
                    "failed_step": r.failed_step, "pid": r.pid, "host": r.host,
                    "runner_alive": r.status == RunStatus::Running && !gone.contains_key(r.id.as_str()),
                })
            })
            .collect();
        print_json(&Value::Array(rows))?;
        return Ok(EXIT_OK);
    }
    if runs.is_empty() {
        let mut what = format!("no runs yet{}", flow.map(|f| format!(" of flow `{f}`")).unwrap_or_default());
        if others.is_some() {
            what.push_str(&format!(" on this host ({})", host_id()));
        }
        // Where it looked: runs kept elsewhere are the usual reason for none here.
        note!("{}", super::no_runs(&what, others.as_deref(), false, state));
        return Ok(EXIT_OK);
    }
    // The flow column fits the longest name shown with two spaces after it (20 at least).
    let flow_width = runs.iter().map(|r| crate::text::columns(&r.flow) + 1).max().unwrap_or(0).max(20);
    // The start is to the millisecond: 24 columns.
    let mut out = format!(
        "{:<10} {:<flow_width$} {:<12} {:<24} {:>10}  {}\n",
        "RUN", "FLOW", "STATUS", "STARTED", "DURATION", "FAILED STEP"
    );
    for r in &runs {
        out.push_str(&format!(
            "{:<10} {} {:<12} {:<24} {:>10}  {}\n",
            r.id,
            crate::text::padded(&r.flow, flow_width),
            if gone.contains_key(r.id.as_str()) { "runner gone" } else { r.status.as_str() },
            time(r.started_at),
            short(took(r.started_at, r.ended_at.or(gone.get(r.id.as_str()).copied()))),
            r.failed_step.as_deref().unwrap_or("-")
        ));
    }
    super::output::print(crate::text::visible_owned(out))?;
    for r in runs.iter().filter(|r| gone.contains_key(r.id.as_str())) {
        note!("waymark: run {id} is running, but its runner is gone (`waymark resume {id}` resumes it)", id = r.id);
    }
    Ok(EXIT_OK)
}

/// For a flow argument that found no runs of this host's (`filter`): the other hosts of a shared
/// store that have runs of it as a flow without `name` (which is its file on each host), and how
/// to see them; `None` if none has.
fn other_hosts(store: &dyn Store, filter: RunFilter<'_>) -> Result<Option<String>, CliError> {
    let hosts = store.other_hosts(filter)?;
    let named = match hosts.as_slice() {
        [] => return Ok(None),
        [one] => format!("host {one} has runs"),
        [a, b] => format!("hosts {a} and {b} have runs"),
        [a, b, c] => format!("hosts {a}, {b} and {c} have runs"),
        [a, b, rest @ ..] => format!("hosts {a}, {b} and {} more have runs", rest.len()),
    };
    Ok(Some(format!(
        "a flow without `name` is its file on each host, and {named} of their own of it: `waymark history` \
         lists every host's runs (a `name` in the flow makes one flow of them)"
    )))
}

/// A run by id, or the newest run of a flow (by file path or name), or the newest run of all.
pub(super) fn find_run(store: &dyn Store, state: &StateDir, target: Option<&str>) -> Result<RunRecord, CliError> {
    match target {
        Some(t) => match store.run(t) {
            Ok(r) => Ok(r),
            Err(StoreError::NoSuchRun(_)) => {
                let chosen = choose_flow(store, t, Looking { state, for_run: true })?;
                let found = store.list_runs(chosen.filter(t), 1)?.into_iter().next();
                let mistake = found.is_none().then(|| chosen.missing_file(t)).flatten();
                let others = match (&found, &mistake) {
                    (None, None) => other_hosts(store, chosen.filter(t))?,
                    _ => None,
                };
                found.ok_or_else(|| {
                    if let Some(mistake) = mistake {
                        return CliError::Usage(format!("no run has the id `{t}`; {mistake}"));
                    }
                    if let Some(others) = others {
                        // Run ids are every host's: only the flow's runs are this host's.
                        let host = host_id();
                        let what = match chosen {
                            Chosen::File(path) => {
                                format!("no runs of the flow file {} on this host ({host})", shown_path(&path))
                            }
                            _ => {
                                format!("no run with id `{t}`, and no runs on this host ({host}) of a flow named `{t}`")
                            }
                        };
                        return CliError::Usage(super::no_runs(&what, Some(&others), false, state));
                    }
                    match chosen {
                        Chosen::File(path) => CliError::Usage(super::no_runs(
                            &format!("no runs of the flow file {}", shown_path(&path)),
                            Some(&format!("`waymark run{} {}` starts one", super::AGAIN, shell_word(t))),
                            true,
                            state,
                        )),
                        // Where it was looked for, as `resume` says of a run id.
                        _ => {
                            super::not_found(&format!("no run with id `{t}` and no runs of a flow named `{t}`"), state)
                        }
                    }
                })
            }
            Err(e) => Err(e.into()),
        },
        None => store.list_runs(RunFilter::All, 1)?.into_iter().next().ok_or_else(|| {
            CliError::Usage(super::no_runs(
                "there are no runs yet",
                Some(&format!("`waymark run{} FLOW` starts one", super::AGAIN)),
                false,
                state,
            ))
        }),
    }
}

/// What `status` shows as a step's state: its stored state, except that a pending step whose last
/// attempt was cancelled by a signal to the runner is `interrupted` (in a run that failed, a step
/// cancelled by `fail_fast` or the deadline stays `pending`), and so is a step whose attempt or
/// catch handler was running in a run that no runner holds, or whose attempt or catch handler an
/// earlier runner of the run made ([`stopped_with_runner`]): nothing of it is running, whatever
/// the store says.
fn shown_state(step: &StepRecord, attempts: &[&AttemptRecord], run: &RunRecord, runner_alive: bool) -> &'static str {
    match cut_short(step, attempts.last().copied(), run) || stopped_with_runner(step, run, runner_alive, None).is_some()
    {
        true => "interrupted",
        false => step.state.status().as_str(),
    }
}

/// What became of a step left running in a run that no runner holds (its runner was stopped by a
/// signal, or killed, while an attempt of the step ran, or while its catch handler ran or was to
/// run), as the line under its line in `status` says it: `attempt 2 did not finish: its runner
/// died; it runs again on resume`, `its catch handler for CLASS did not finish: ...`. It runs
/// again when the run is resumed, or, in an abandoned run, never. So is a step of a run that a
/// new runner holds whose attempt or catch handler in flight an earlier runner of the run made
/// and the new one has not run again yet (it waits for a slot): the claim that made the new
/// runner the run's recorded everything left running as `runner_lost` ([`StepRecord::lost`])
/// (`attempt 2 did not finish: its runner died; the run's new runner runs it again`, `its catch
/// handler for CLASS did not finish: ...`). If a signal stops that new runner before it runs the
/// step again, what was in flight still died with its runner, as `status --attempts` and `logs`
/// say of it: `its runner died; it runs again on resume`, not `the run was interrupted`. `None`
/// for any other step.
fn stopped_with_runner(
    step: &StepRecord,
    run: &RunRecord,
    runner_alive: bool,
    only_fails: Option<&str>,
) -> Option<String> {
    let (what, again) = match &step.state {
        StepState::InFlight { attempt, .. } => (format!("attempt {attempt}"), " again"),
        StepState::Catching { .. } => {
            let class = step.last_error.as_ref().map(|e| format!(" for {}", e.class)).unwrap_or_default();
            (format!("its catch handler{class}"), "")
        }
        _ => return None,
    };
    if runner_alive {
        return step
            .lost
            .then(|| format!("{what} did not finish: its runner died; the run's new runner runs it again"));
    }
    // Under `fail_fast`, once a step failed for good, or past the workflow's deadline, a resume
    // runs nothing again: it fails.
    let on_resume = match only_fails {
        Some(why) => format!("the run fails when resumed, without running it again: {why}"),
        None => "it runs again on resume".to_owned(),
    };
    let why = match run.status {
        RunStatus::Abandoned => format!("the run was abandoned, so it never runs{again}"),
        RunStatus::Running => format!("its runner died; {on_resume}"),
        // What died with an earlier runner did not end with the interruption of the runner after it.
        RunStatus::Interrupted if step.lost => format!("its runner died; {on_resume}"),
        RunStatus::Interrupted => format!("the run was interrupted; {on_resume}"),
        RunStatus::Succeeded | RunStatus::Failed => return None,
    };
    Some(format!("{what} did not finish: {why}"))
}

/// Whether `step`, whose last attempt is `last`, shows `interrupted` for an attempt cancelled by a
/// signal to the runner (or by `fail_fast` just before one): not in a run that failed, where a step
/// `fail_fast` cancelled stays `pending`.
fn cut_short(step: &StepRecord, last: Option<&AttemptRecord>, run: &RunRecord) -> bool {
    step.cut_short(last) && run.status != RunStatus::Failed
}

/// What becomes of a step whose last attempt was cancelled (by a signal to the runner, or by
/// `fail_fast` just before one) in a run that did not fail, shown `interrupted`, as the line under
/// its line in `status` says it: `attempt 2 did not finish: it was cancelled; it runs again on
/// resume` (under its number), `...; the run fails when resumed, without running it again: WHY`,
/// `...; the run was abandoned, so it never runs again`, or, in a run whose runner lives, `...; the
/// run's runner runs it again` (`does not run it again: WHY` when it fails the run). `None` for
/// any other step.
fn cancelled(
    step: &StepRecord,
    last: Option<&AttemptRecord>,
    run: &RunRecord,
    runner_alive: bool,
    only_fails: Option<&str>,
) -> Option<String> {
    let last = last.filter(|_| cut_short(step, last, run))?;
    let next = match (run.status, only_fails) {
        (RunStatus::Abandoned, _) => "the run was abandoned, so it never runs again".to_owned(),
        // `fail_fast` cancelled it, and the runner goes on to fail the run.
        (RunStatus::Running, Some(why)) if runner_alive => format!("the run's runner does not run it again: {why}"),
        (RunStatus::Running, None) if runner_alive => "the run's runner runs it again".to_owned(),
        (_, Some(why)) => format!("the run fails when resumed, without running it again: {why}"),
        (_, None) => "it runs again on resume".to_owned(),
    };
    Some(format!("attempt {} did not finish: it was cancelled; {next}", last.attempt))
}

/// The time a step's attempts and backoffs took, `None` before its first attempt. Summed: each
/// attempt from its start to its end (one still running, to now while its runner lives; one whose
/// runner died, nothing: its end is unknown), and each backoff, from the end of a failed attempt
/// to the start of the next one, at most the longest wait the step's backoff allows before that
/// retry (a step waiting now: to its wake-up time, or now, or the run's end, whichever is first).
/// The time after a cancelled attempt, or after a runner stopped during a backoff, while the run
/// sat interrupted, is not counted.
fn active_time(
    backoff: Option<&crate::retry::Backoff>,
    step: &StepRecord,
    attempts: &[&AttemptRecord],
    run: &RunRecord,
    runner_alive: bool,
    now: SystemTime,
) -> Option<Duration> {
    let since = |from: SystemTime, to: SystemTime| to.duration_since(from).unwrap_or_default();
    let mut total = Duration::ZERO;
    for (i, a) in attempts.iter().enumerate() {
        total += match (a.outcome, a.ended_at) {
            (AttemptState::Running, _) if runner_alive => since(a.started_at, now),
            (AttemptState::Running | AttemptState::RunnerLost, _) | (_, None) => Duration::ZERO,
            (_, Some(end)) => since(a.started_at, end),
        };
        let (AttemptState::Failed, Some(end)) = (a.outcome, a.ended_at) else { continue };
        total += match (attempts.get(i + 1), &step.state) {
            (Some(next), _) => {
                let gap = since(end, next.started_at);
                // Waits never shrink with the retry number, so the attempt's own number bounds it
                // whether numbers restarted with a fresh budget or not.
                backoff.map_or(gap, |b| gap.min(b.nominal(a.attempt)))
            }
            (None, StepState::Waiting { wake_at, .. }) => {
                let stop = [Some(*wake_at), Some(now), run.ended_at].into_iter().flatten().min().unwrap_or(now);
                since(end, stop)
            }
            (None, _) => Duration::ZERO,
        };
    }
    (!attempts.is_empty()).then_some(total)
}

/// How a compensation or hook of run `run` ended, as `status` says it on its line, unless it
/// failed (each says that its own way): `succeeded`, `running`, or `interrupted` with why and
/// whether it ran again (`again`: a later run of the same one is recorded) or runs again on resume.
fn aux_ended(
    outcome: AttemptState,
    again: bool,
    run: &RunRecord,
    runner_alive: bool,
) -> Option<(&'static str, String)> {
    let unfinished = |why: &str| {
        let next = match (again, run.status) {
            (true, _) => "; it ran again",
            (false, RunStatus::Interrupted | RunStatus::Running) if !runner_alive => "; it runs again on resume",
            (false, RunStatus::Abandoned) => "; the run was abandoned, so it never runs again",
            (false, _) => "",
        };
        format!("{why}{next}")
    };
    Some(match outcome {
        AttemptState::Succeeded => ("succeeded", String::new()),
        AttemptState::Failed => return None,
        AttemptState::Running => ("running", String::new()),
        AttemptState::Cancelled => ("interrupted", unfinished("a signal stopped it")),
        AttemptState::RunnerLost => ("interrupted", unfinished("its runner died before it ended")),
    })
}

/// An error as `status` says it, with where it came from: `ActionTimeout(BaseException): timed
/// out after 5s [timeout]`.
fn failed_with(e: &ErrorValue) -> String {
    format!("{e} [{}]", e.source.describe())
}

/// A compensation of run `run` as `status` shows it: how it ended ([`attempt_state`]: one whose
/// runner died is `runner_lost`), and, when it did not finish, whether it ran again (`again`: a
/// later run of the same step's compensation is recorded) or runs again on resume.
struct Compensation<'a> {
    aux: &'a AuxRun,
    outcome: AttemptState,
    again: bool,
    /// Its `compensate.stderr` is known not to exist: it wrote nothing to stderr (a SQLite state
    /// directory keeps every log on this host; a shared store's may be on another).
    silent: bool,
}

impl Compensation<'_> {
    /// Its latest execution did not succeed: what its step did may not be undone.
    fn left_undone(&self) -> bool {
        self.outcome != AttemptState::Succeeded && !self.again
    }

    /// Its state word and what follows it on its line: `succeeded`, `failed  exit status 3`,
    /// `interrupted  a signal stopped it; it runs again on resume`.
    fn text(&self, run: &RunRecord, runner_alive: bool) -> (&'static str, String) {
        aux_ended(self.outcome, self.again, run, runner_alive).unwrap_or_else(|| {
            let how = match (self.aux.exit_code, &self.aux.error, self.silent) {
                (Some(code), ..) => format!("exit status {code}"),
                (None, Some(e), _) => failed_with(e),
                // Recorded by a waymark that did not record how it failed.
                (None, None, false) => "killed, timed out or not started (its compensate.stderr says more)".to_owned(),
                (None, None, true) => "killed, timed out or not started, with nothing on stderr".to_owned(),
            };
            ("failed", how)
        })
    }

    fn json(&self) -> Value {
        let (ended, took) = end_and_ms(self.outcome, self.aux.started_at, self.aux.ended_at);
        json!({
            "step": self.aux.name,
            "outcome": self.outcome.as_str(),
            "started_at": time(self.aux.started_at),
            "ended_at": opt_time(ended),
            "duration_ms": took,
            "exit_code": self.aux.exit_code,
            "error": self.aux.error.as_ref().map(error_json),
        })
    }
}

/// A hook of run `run` as `status` shows it: how it ended ([`seen`]), whether a later run of the
/// same hook is recorded (`again`), and its logs that exist (a log is created on its first byte).
struct HookRun<'a> {
    aux: &'a AuxRun,
    outcome: AttemptState,
    again: bool,
    stdout: Option<PathBuf>,
    stderr: Option<PathBuf>,
}

impl HookRun<'_> {
    /// Its state word and what follows it on its line: `succeeded`, `failed  exit status 5; its
    /// output: .../hooks/on_success.stderr`, `interrupted  a signal stopped it; it runs again on
    /// resume`.
    fn text(&self, run: &RunRecord, runner_alive: bool) -> (&'static str, String) {
        let (word, mut detail) = aux_ended(self.outcome, self.again, run, runner_alive).unwrap_or_else(|| {
            // A hook has no timeout: without an exit status it was killed, or never started.
            let how = match (self.aux.exit_code, &self.aux.error, self.aux.pid) {
                (Some(code), ..) => format!("exit status {code}"),
                (None, Some(e), _) => failed_with(e),
                // Recorded by a waymark that did not record how it failed.
                (None, None, Some(_)) => "killed by a signal".to_owned(),
                (None, None, None) => "it could not start".to_owned(),
            };
            ("failed", how)
        });
        let logs: Vec<String> =
            [&self.stdout, &self.stderr].into_iter().flatten().map(|p| p.display().to_string()).collect();
        if !logs.is_empty() {
            let sep = if detail.is_empty() { "" } else { "; " };
            detail.push_str(&format!("{sep}its output: {}", logs.join(", ")));
        }
        (word, detail)
    }

    fn json(&self) -> Value {
        let (ended, took) = end_and_ms(self.outcome, self.aux.started_at, self.aux.ended_at);
        json!({
            "hook": self.aux.name,
            "outcome": self.outcome.as_str(),
            "started_at": time(self.aux.started_at),
            "ended_at": opt_time(ended),
            "duration_ms": took,
            "exit_code": self.aux.exit_code,
            "error": self.aux.error.as_ref().map(error_json),
            "stdout": self.stdout,
            "stderr": self.stderr,
        })
    }
}

/// The hooks recorded of a run's ending, in the order they started ([`HookRun`]).
fn hook_runs<'a>(aux: &'a [AuxRun], runner_alive: bool, stem: &dyn Fn(&str) -> PathBuf) -> Vec<HookRun<'a>> {
    let mine: Vec<&AuxRun> = aux.iter().filter(|a| a.kind == AuxKind::Hook).collect();
    let log = |name: &str, stream: &str| Some(stem(name).with_extension(stream)).filter(|p| p.exists());
    mine.iter()
        .enumerate()
        .map(|(i, a)| HookRun {
            aux: a,
            outcome: seen(a.outcome, runner_alive),
            again: mine[i + 1..].iter().any(|b| b.name == a.name),
            stdout: log(&a.name, "stdout"),
            stderr: log(&a.name, "stderr"),
        })
        .collect()
}

/// Of a run that no runner holds (interrupted, or its runner gone) whose steps are all done but
/// whose hooks are not: what its resume runs, as the runner decides it (the compensations of a
/// run that fails, then `on_failure` or `on_success`, then `on_exit`, each unless it finished).
/// Its steps all show done, so this is what says the run is not.
fn hooks_left(
    run: &RunRecord,
    runner_alive: bool,
    flow: Option<&Flow>,
    steps: &[StepRecord],
    aux: &[AuxRun],
) -> Option<String> {
    if runner_alive || !matches!(run.status, RunStatus::Interrupted | RunStatus::Running) {
        return None;
    }
    let done = |s: &StepRecord| {
        matches!(s.state, StepState::Succeeded | StepState::Caught | StepState::Failed | StepState::Skipped)
    };
    if steps.is_empty() || !steps.iter().all(done) {
        return None;
    }
    let flow = flow?;
    let finished = |kind: AuxKind, name: &str| aux.iter().any(|a| a.kind == kind && a.name == name && a.finished);
    let failed = steps.iter().any(|s| s.state == StepState::Failed);
    let hooks = &flow.hooks;
    let first = if failed { ("on_failure", &hooks.on_failure) } else { ("on_success", &hooks.on_success) };
    let left: Vec<&str> = [first, ("on_exit", &hooks.on_exit)]
        .into_iter()
        .filter(|(name, command)| command.is_some() && !finished(AuxKind::Hook, name))
        .map(|(name, _)| name)
        .collect();
    if left.is_empty() {
        return None;
    }
    let compensating = failed
        && steps.iter().any(|s| {
            s.state == StepState::Succeeded
                && flow.steps.iter().any(|f| f.name == s.name && f.compensate.is_some())
                && !finished(AuxKind::Compensate, &s.name)
        });
    let verb = if left.len() == 1 && !compensating { "runs" } else { "run" };
    let what = match compensating {
        true => format!("its compensations and hooks are not: the compensations, then {}, {verb}", left.join(", ")),
        false => format!("its hooks are not: {} {verb}", left.join(", ")),
    };
    Some(format!("its steps are done, but {what} when the run is resumed (`waymark resume {}`)", run.id))
}

/// The compensations recorded of a run, in the order they started ([`Compensation`]);
/// `silent`: whether one is known to have written nothing to stderr.
/// The steps whose compensation did not succeed (as its latest execution ended), in the order
/// the compensations ran: what `resume` of a compensated run names.
pub(super) fn not_undone(aux: &[AuxRun]) -> Vec<&str> {
    let all = compensations(aux, false, &|_| false);
    all.iter().filter(|c| c.left_undone()).map(|c| c.aux.name.as_str()).collect()
}

fn compensations<'a>(aux: &'a [AuxRun], runner_alive: bool, silent: &dyn Fn(&AuxRun) -> bool) -> Vec<Compensation<'a>> {
    let mine: Vec<&AuxRun> = aux.iter().filter(|a| a.kind == AuxKind::Compensate).collect();
    mine.iter()
        .enumerate()
        .map(|(i, a)| Compensation {
            aux: a,
            outcome: seen(a.outcome, runner_alive),
            again: mine[i + 1..].iter().any(|b| b.name == a.name),
            silent: silent(a),
        })
        .collect()
}

pub(crate) fn status(state: &StateDir, target: Option<&str>, json: bool, list_attempts: bool) -> Result<i32, CliError> {
    let store = read_store(state)?;
    let run = find_run(store.as_ref(), state, target)?;
    // The attempts allowed are shown as `?` when the definition cannot be read (a newer record):
    // `status` still shows what it can.
    let flow: Option<Flow> =
        crate::store::record::RunDefinition::parse(&run.definition).and_then(|d| d.into_flow()).ok();
    let steps = store.steps(&run.id)?;
    let attempts = store.attempts(&run.id, None)?;
    // The host a step's last attempt ran on (none before any attempt, or before hosts were recorded).
    // Each step's attempts, oldest first, grouped once (a run of 10,000 steps has as many).
    let mut by_step: std::collections::HashMap<&str, Vec<&AttemptRecord>> = std::collections::HashMap::new();
    for a in &attempts {
        by_step.entry(a.step.as_str()).or_default().push(a);
    }
    let of_step = |name: &str| by_step.get(name).map_or(&[][..], Vec::as_slice);
    let host = |name: &str| of_step(name).last().and_then(|a| a.host.clone());
    let orphaned = runner_gone(store.as_ref(), state, &run)?;
    let policy = |name: &str| flow.as_ref().and_then(|f| f.steps.iter().find(|s| s.name == name)).map(|s| &s.retry);
    let allowed = |name: &str| policy(name).map(|r| r.attempts);
    let runner_alive = run.status == RunStatus::Running && !orphaned;
    let now = SystemTime::now();
    // Why a resume would fail the run without running again what did not finish: a step failed
    // for good under `fail_fast`, or the workflow's deadline passed (counted, as a resume counts
    // it, from the run's start or from when `waymark resume` reopened it after it failed).
    let fail_fast = flow.as_ref().is_some_and(|f| f.fail_fast) && steps.iter().any(|s| s.state == StepState::Failed);
    let deadline = flow.as_ref().and_then(|f| f.timeout).filter(|t| run.began() + *t <= now);
    let only_fails = match (fail_fast, deadline) {
        (true, _) => Some("a step failed for good under `fail_fast`".to_owned()),
        (false, Some(t)) => Some(format!("the workflow's `timeout` ({}) passed", humantime::format_duration(t))),
        (false, None) => None,
    };
    // The step a failed run failed on is skipped only when the workflow's deadline passed while
    // it did not run (a retry waiting out its backoff, an attempt of a dead runner not run again):
    // the deadline is what the run failed of there, as the failure report says.
    let run_failed_with = |s: &StepRecord| {
        let on_it = run.status == RunStatus::Failed
            && run.failed_step.as_deref() == Some(s.name.as_str())
            && s.state == StepState::Skipped;
        flow.as_ref().filter(|_| on_it).map(crate::executor::workflow_timeout)
    };
    // The time each step's attempts and backoffs took: shown to the millisecond under a minute.
    let active: Vec<Option<Duration>> = steps
        .iter()
        .map(|s| active_time(policy(&s.name).map(|r| &r.backoff), s, of_step(&s.name), &run, runner_alive, now))
        .collect();
    // Each step's latest catch handler run, if any.
    let handlers = store.handlers(&run.id)?;
    let latest: std::collections::HashMap<&str, &crate::store::HandlerRun> =
        handlers.iter().map(|h| (h.step.as_str(), h)).collect();
    let handled = |name: &str| latest.get(name).copied();
    let rows: Vec<Value> = steps
        .iter()
        .zip(&active)
        .map(|(s, active)| {
            let mine = of_step(&s.name);
            let state = shown_state(s, mine, &run, runner_alive);
            // An attempt counts as used from its start (the store counts it when it ends).
            // So does one whose runner died, when no runner ran it again (a resume past the
            // deadline skipped the step): it ran.
            let lost = s.state == StepState::Skipped
                && mine.last().is_some_and(|a| a.outcome == AttemptState::RunnerLost && a.attempt > s.attempts_used);
            let used = s.attempts_used + u32::from(matches!(s.state, StepState::InFlight { .. }) || lost);
            let next = match &s.state {
                StepState::Waiting { wake_at, .. } => Some(*wake_at),
                _ => None,
            };
            let mut row = json!({
                "step": s.name,
                "state": state,
                "attempts_used": used,
                "attempts_allowed": allowed(&s.name).map(|a| a.saturating_add(s.budget_base)),
                // Used before the current budget began (`waymark resume` of a failed run): the
                // failure report counts the budget without them.
                "attempts_before_budget": s.budget_base,
                "last_error": s.last_error.as_deref().map(error_json),
                "started_at": opt_time(s.started_at),
                "ended_at": opt_time(s.ended_at),
                "duration_seconds": active.map(|d| d.as_secs()),
                "duration_ms": active.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                "next_retry_at": opt_time(next),
                // No runner holds the run (interrupted, or its runner gone): nothing retries the
                // step until the run is resumed. An abandoned run never is, and a resume that can
                // only fail the run retries nothing: no retry is held.
                "next_retry_held": next.is_some()
                    && !runner_alive
                    && run.status != RunStatus::Abandoned
                    && only_fails.is_none(),
                "host": host(&s.name),
                "outputs": s.outputs,
                "run_failed_with": run_failed_with(s).as_ref().map(error_json),
                "catch": handled(&s.name).map(|h| json!({
                    "attempt": h.attempt,
                    "outcome": seen(h.outcome, runner_alive).as_str(),
                    "exit_code": h.exit_code,
                    "error": h.error.as_ref().map(error_json),
                })),
            });
            if list_attempts {
                row["attempts"] = mine.iter().map(|a| attempt_json(a, runner_alive)).collect();
            }
            row
        })
        .collect();
    let aux = store.aux_runs(&run.id)?;
    let stderr = |name: &str| state.aux_stem(&run.id, AuxKind::Compensate, name).with_extension("stderr");
    // A SQLite state directory keeps every log on this host: no file is nothing written. A shared
    // store keeps the end of what each wrote: an empty one recorded is nothing written (of one
    // that ran here; one that ran on another host has its stem there, and is not known silent).
    let silent = |a: &AuxRun| match super::shared_store() {
        false => !stderr(&a.name).exists(),
        true => {
            let stem = state.aux_stem(&run.id, AuxKind::Compensate, &a.name);
            store.attempt_tail(&run.id, &stem, "stderr").ok().flatten().is_some_and(|tail| tail.is_empty())
        }
    };
    let compensations = compensations(&aux, runner_alive, &silent);
    let hook_stem = |name: &str| state.aux_stem(&run.id, AuxKind::Hook, name);
    let hooks = hook_runs(&aux, runner_alive, &hook_stem);
    if json {
        print_json(&json!({
            "id": run.id, "flow": run.flow, "path": run.flow_path, "status": run.status.as_str(),
            "started_at": time(run.started_at), "ended_at": opt_time(run.ended_at),
            "reopened_at": opt_time(run.reopened_at),
            "failed_step": run.failed_step, "pid": run.pid, "host": run.host,
            "runner_alive": runner_alive,
            // The values the run was started with (a parameter's default included); null when
            // its definition cannot be read.
            "params": flow.as_ref().map(|f| &f.param_values),
            "steps": rows,
            "compensated": !compensations.is_empty(),
            "compensations": compensations.iter().map(Compensation::json).collect::<Vec<_>>(),
            "hooks": hooks.iter().map(HookRun::json).collect::<Vec<_>>(),
        }))?;
        return Ok(EXIT_OK);
    }
    let status = if orphaned {
        // This run exactly, as `history` says it (`waymark run FLOW` resumes the flow's newest).
        format!("running, but its runner is gone (`waymark resume {}` resumes it)", run.id)
    } else {
        run.status.as_str().to_owned()
    };
    let mut out = format!(
        "run {} of {} ({}): {status}, started {}{}\n",
        run.id,
        run.flow,
        shown_path(&run.flow_path),
        time(run.started_at),
        run.ended_at.map(|e| format!(", ended {}", time(e))).unwrap_or_default()
    );
    // What it runs with: a resume of it takes these, whatever `--param` says.
    if let Some(values) = flow.as_ref().map(|f| &f.param_values).filter(|v| !v.is_empty()) {
        let values: Vec<String> =
            values.iter().map(|(k, v)| format!("{k}={}", crate::flow::model::shell_word(v))).collect();
        out.push_str(&format!("  params: {}\n", values.join(" ")));
    }
    if let Some(line) = hooks_left(&run, runner_alive, flow.as_ref(), &steps, &aux) {
        out.push_str(&format!("  {line}\n"));
    }
    // The state column fits the longest state shown (`interrupted`) with two spaces after it.
    let state_width = rows.iter().map(|r| r["state"].as_str().map_or(1, str::len) + 1).max().unwrap_or(0).max(10);
    // So does the step column (20 at least), and the lines under a step's line start below its state.
    let name_width = steps.iter().map(|s| s.name.chars().count() + 1).max().unwrap_or(0).max(20);
    let whole = format!("`waymark status --json {}`", run.id);
    for (i, (s, row)) in steps.iter().zip(&rows).enumerate() {
        // Of the current budget, as the failure report counts (`budget spent: 3 of 3 attempts`),
        // with the attempts of the budgets before it after them.
        let base = u64::from(s.budget_base);
        let used = row["attempts_used"].as_u64().unwrap_or(0).saturating_sub(base);
        let allowed = row["attempts_allowed"].as_u64().map_or("?".to_owned(), |a| a.saturating_sub(base).to_string());
        let before = crate::reporter::before_budget(s.budget_base);
        out.push_str(&format!(
            "  {:<name_width$} {:<state_width$} attempts {used}/{allowed}{before}",
            s.name,
            row["state"].as_str().unwrap_or("?"),
        ));
        if let Some(d) = active[i] {
            out.push_str(&format!("  {}", short(d)));
        }
        // Where it last ran, in a store shared by hosts (in one of this host's, here).
        if let Some(host) = row["host"].as_str().filter(|_| super::shared_store()) {
            out.push_str(&format!("  on {host}"));
        }
        if let StepState::Waiting { wake_at, .. } = s.state {
            let when = time(wake_at);
            out.push_str(&match (runner_alive, run.status, only_fails.as_deref()) {
                (true, ..) => format!("  next retry at {when}"),
                (false, RunStatus::Abandoned, _) => format!("  no retry (it was due at {when}): the run was abandoned"),
                // As a resume does: it fails the run without the retry.
                (false, _, Some(why)) => format!("  no retry (due at {when}): the run fails when resumed: {why}"),
                (false, ..) => format!("  retry due at {when}, held until the run is resumed"),
            });
        }
        out.push('\n');
        if let Some(e) = &s.last_error {
            // A step that succeeded in the end had this error before its last retry: not its end.
            let label = if s.state == StepState::Succeeded { "retried after" } else { "last error" };
            out.push_str(&format!("  {:<name_width$} {label}: {}\n", "", failed_with(e)));
            out.push_str(&crate::reporter::rest_of_message(e, name_width + 5, &whole));
        }
        // Why its catch handler did not catch the error the step failed with: how it failed, and
        // where its output is. (A handler of an earlier budget's error is not this one's.)
        let last = of_step(&s.name).last().map(|a| a.attempt);
        let failed_handler = handled(&s.name)
            .filter(|h| s.state == StepState::Failed && h.outcome == AttemptState::Failed && Some(h.attempt) == last);
        if let Some(h) = failed_handler {
            let handled_error =
                of_step(&s.name).iter().rev().find(|a| a.attempt == h.attempt).and_then(|a| a.error.as_ref());
            let class = handled_error.map(|e| format!(" for {}", e.class)).unwrap_or_default();
            let how = match (&h.error, h.exit_code) {
                (Some(e), _) => failed_with(e),
                (None, Some(code)) => format!("exit status {code}"),
                // Recorded by a waymark that did not record how it failed.
                (None, None) => "it was killed, timed out or could not start".to_owned(),
            };
            // In a store shared by hosts, one that ran on another host has its output there.
            let here = crate::store::lease::host_id();
            let output = match h.host.as_deref().filter(|host| super::shared_store() && *host != here) {
                Some(host) => format!("; its logs are on host {host}"),
                None => format!("; {}", crate::store::statedir::output_said(&h.log_stem)),
            };
            out.push_str(&format!("  {:<name_width$} its catch handler{class} failed: {how}{output}\n", ""));
        }
        let under = stopped_with_runner(s, &run, runner_alive, only_fails.as_deref())
            .or_else(|| cancelled(s, of_step(&s.name).last().copied(), &run, runner_alive, only_fails.as_deref()));
        if let Some(what) = under {
            out.push_str(&format!("  {:<name_width$} {what}\n", ""));
        }
        if let Some(e) = run_failed_with(s) {
            out.push_str(&format!("  {:<name_width$} the run failed on it: {}\n", "", failed_with(&e)));
            out.push_str(&crate::reporter::rest_of_message(&e, name_width + 5, &whole));
        }
        if list_attempts {
            for a in of_step(&s.name) {
                let unended = match attempt_state(a, runner_alive) {
                    AttemptState::Running => "running",
                    _ => "its runner died before it ended",
                };
                let line = crate::reporter::attempt_line(&EarlierAttempt::of(a, super::shared_store()), unended);
                out.push_str(&format!("  {:<name_width$} {line}\n", ""));
            }
        }
    }
    if !compensations.is_empty() {
        // Over once the run failed, or once a hook began (hooks run after every compensation).
        let over = run.status == RunStatus::Failed || aux.iter().any(|a| a.kind == AuxKind::Hook);
        let (verb, tense) = if over { ("compensated", "ran") } else { ("compensating", "run") };
        out.push_str(&format!(
            "{verb}: the run failed, so the compensations of its succeeded steps {tense}, latest step first:\n"
        ));
        let texts: Vec<_> = compensations.iter().map(|c| c.text(&run, runner_alive)).collect();
        let state_width = texts.iter().map(|(word, _)| word.len() + 1).max().unwrap_or(0).max(10);
        for (c, (word, detail)) in compensations.iter().zip(&texts) {
            let line = format!("  {:<name_width$} {word:<state_width$} {detail}", c.aux.name);
            out.push_str(line.trim_end());
            out.push('\n');
        }
        if run.status == RunStatus::Failed {
            // Only what a compensation that succeeded undid is undone.
            let undone: Vec<&Compensation> = compensations.iter().filter(|c| c.left_undone()).collect();
            let what = match undone.as_slice() {
                [] => "what its steps did was undone, so the run cannot be resumed".to_owned(),
                all => {
                    let quoted = |c: &&Compensation| format!("`{}`", c.aux.name);
                    // A log is named only if it exists: one that wrote nothing to stderr has none.
                    let paths: Vec<String> =
                        all.iter().filter(|c| !c.silent).map(|c| stderr(&c.aux.name).display().to_string()).collect();
                    let silent: Vec<String> = all.iter().filter(|c| c.silent).map(quoted).collect();
                    let mut why = match paths.as_slice() {
                        [] => Vec::new(),
                        [one] => vec![format!("{one} says why")],
                        many => vec![format!("their compensate.stderr says why: {}", many.join(", "))],
                    };
                    match silent.as_slice() {
                        [] => {}
                        [_] if all.len() == 1 => {
                            why.push("it wrote nothing to stderr: its line above says how it ended".to_owned());
                        }
                        [one] => why.push(format!("{one} wrote nothing to stderr: its line above says how it ended")),
                        many => why.push(format!(
                            "{} wrote nothing to stderr: their lines above say how they ended",
                            many.join(", ")
                        )),
                    }
                    // What one of them wrote to stdout may say more (a log exists only if it did).
                    for c in all.iter().filter(|c| c.silent) {
                        let stdout = stderr(&c.aux.name).with_extension("stdout");
                        if stdout.exists() {
                            why.push(format!("what {} wrote to stdout is in {}", quoted(c), stdout.display()));
                        }
                    }
                    let names: Vec<String> = all.iter().map(quoted).collect();
                    match names.as_slice() {
                        [one] => format!(
                            "the compensation of {one} did not succeed, so what it did may not be undone ({}); the \
                             run cannot be resumed",
                            why.join("; ")
                        ),
                        _ => format!(
                            "the compensations of {} did not succeed, so what they did may not be undone ({}); the \
                             run cannot be resumed",
                            names.join(", "),
                            why.join("; ")
                        ),
                    }
                }
            };
            out.push_str(&format!(
                "{what}; `waymark run --fresh {}` starts the flow anew\n",
                shell_word(&run.flow_path.to_string_lossy())
            ));
        }
    }
    if !hooks.is_empty() {
        out.push_str("hooks:\n");
        let texts: Vec<_> = hooks.iter().map(|h| h.text(&run, runner_alive)).collect();
        let state_width = texts.iter().map(|(word, _)| word.len() + 1).max().unwrap_or(0).max(10);
        for (h, (word, detail)) in hooks.iter().zip(&texts) {
            let line = format!("  {:<name_width$} {word:<state_width$} {detail}", h.aux.name);
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
    super::output::print(crate::text::visible_owned(out))?;
    Ok(EXIT_OK)
}

/// The output of an attempt of `step`, in the run `target` names: a run id, or a flow (file or
/// name) for its newest run.
pub(crate) fn logs(
    state: &StateDir,
    target: &str,
    step: &str,
    attempt: Option<u32>,
    stream: Option<StreamArg>,
) -> Result<i32, CliError> {
    let store = read_store(state)?;
    let run = find_run(store.as_ref(), state, Some(target))?;
    let run_id = run.id.as_str();
    let attempts = store.attempts(run_id, Some(step))?;
    if attempts.is_empty() {
        let steps = store.steps(run_id)?;
        let Some(this) = steps.iter().find(|s| s.name == step) else {
            let names: Vec<&str> = steps.iter().map(|s| s.name.as_str()).collect();
            let guess = crate::suggest::closest(step, names.iter().copied())
                .map_or_else(String::new, |name| format!("did you mean `{name}`? "));
            return Err(CliError::Usage(format!(
                "run {run_id} has no step `{step}`; {guess}its steps are: {}",
                names.join(", ")
            )));
        };
        // The steps that have logs, rather than all of them (this one among them).
        let all = store.attempts(run_id, None)?;
        let ran: Vec<&str> =
            steps.iter().filter(|s| all.iter().any(|a| a.step == s.name)).map(|s| s.name.as_str()).collect();
        let what = if this.state == StepState::Skipped {
            format!("step `{step}` of run {run_id} never ran (the run failed before its turn came), so it has no logs")
        } else {
            format!("step `{step}` of run {run_id} has no attempts yet, so it has no logs")
        };
        let others = match ran.as_slice() {
            [] => "no step of the run has run yet".to_owned(),
            names => format!("the steps with attempts: {}", names.join(", ")),
        };
        return Err(CliError::Usage(format!("{what}; {others}")));
    }
    let chosen = match attempt {
        Some(n) => attempts.iter().rev().find(|a| a.attempt == n).ok_or_else(|| {
            // A number run again (redelivered, or after a cancel) is listed once.
            let mut have: Vec<u32> = attempts.iter().map(|a| a.attempt).collect();
            have.dedup();
            let have: Vec<String> = have.iter().map(u32::to_string).collect();
            CliError::Usage(format!(
                "step `{step}` of run {run_id} has no attempt {n}; it has {} {}",
                if have.len() == 1 { "attempt" } else { "attempts" },
                have.join(", ")
            ))
        })?,
        None => attempts.last().expect("not empty"),
    };
    let streams: &[&str] = match stream {
        Some(StreamArg::Stdout) => &["stdout"],
        Some(StreamArg::Stderr) => &["stderr"],
        None => &["stdout", "stderr"],
    };
    // A log file is created on its stream's first byte: a stream that has none gets no header,
    // and one line on stderr says that the attempt wrote nothing to it.
    // A log that does not end with a newline has one put after it before the next header, so
    // that the header is a line of its own, as `tail` does.
    let mut open_line = false;
    let header = |path: &Path, open_line: &mut bool| match streams.len() > 1 {
        true => super::output::print(format!(
            "{}==> {} <==\n",
            if std::mem::take(open_line) { "\n" } else { "" },
            path.display()
        )),
        false => Ok(()),
    };
    let mut silent: Vec<&str> = Vec::new();
    // Ran on another host: its logs are there, whatever a file at the same path here holds (an
    // earlier execution's, on hosts that lay out their state directories alike).
    let elsewhere = chosen.logs_on(super::shared_store());
    for name in streams {
        let path = chosen.log_stem.with_extension(name);
        let opened = match elsewhere {
            Some(_) => Err(std::io::ErrorKind::NotFound.into()),
            None => crate::os::fs::open_read_nofollow(&path),
        };
        match opened {
            Ok(mut file) => {
                header(&path, &mut open_line)?;
                // Streamed: a log may be far larger than memory.
                match super::output::copy(&mut file)? {
                    Ok(last) => open_line = last.is_some_and(|b| b != b'\n'),
                    Err(e) => {
                        return Err(CliError::Internal(anyhow::anyhow!("cannot read {}: {e}", path.display())));
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // Ran on another host: the end of its output is in the shared store.
                // A stream that stayed empty left no file, here or there.
                match store.attempt_tail(run_id, &chosen.log_stem, name)? {
                    Some(tail) if !tail.is_empty() => {
                        header(&path, &mut open_line)?;
                        let kib = crate::store::postgres::TAIL_BYTES / 1024;
                        match elsewhere {
                            Some(host) => {
                                note!(
                                    "waymark: the full log is on host {host} at {}; here are its last {kib} KiB, as \
                                     recorded",
                                    path.display()
                                );
                            }
                            // This host's, and gone from here (removed, or a new disk).
                            None => note!(
                                "waymark: the log {} is gone from this host; here are its last {kib} KiB, as recorded",
                                path.display()
                            ),
                        }
                        // Byte for byte, as a log file here is copied: output need not be UTF-8.
                        super::output::print(&tail)?;
                        open_line = !tail.ends_with(b"\n");
                    }
                    None if elsewhere.is_some() => {
                        let host = elsewhere.unwrap_or_default();
                        // Recorded when the attempt ends, unless its log directory there was gone
                        // by then, or its runner died first.
                        // Still running only while its runner lives (the run's status is
                        // `running` until another runner claims it).
                        let live = run.status == RunStatus::Running && !runner_gone(store.as_ref(), state, &run)?;
                        let end = match chosen.outcome {
                            AttemptState::Running if live => "its end is recorded here when the attempt ends",
                            AttemptState::Running | AttemptState::RunnerLost => {
                                "its end was not recorded here: the attempt's runner died"
                            }
                            _ => {
                                "its end was not recorded here: its log could not be read there when the attempt \
                                  ended (its directory was gone, say)"
                            }
                        };
                        note!(
                            "waymark: the {name} log of attempt {} of step `{step}` is on host {host} at {}; {end}",
                            chosen.attempt,
                            path.display()
                        );
                    }
                    // The store recorded its end, empty.
                    Some(_) => silent.push(name),
                    // Its log directory gone (removed, moved), with no end of it recorded: the
                    // attempt may have written, so nothing here says that it did not.
                    None if path.parent().is_some_and(|dir| std::fs::symlink_metadata(dir).is_err()) => {
                        return Err(CliError::Internal(anyhow::anyhow!(
                            "cannot show the logs of attempt {} of step `{step}`: its log directory {} is gone \
                             (removed or moved since the attempt ran; waymark keeps an attempt's logs there until \
                             `waymark gc` deletes its run); `waymark status {run_id} --attempts` says how it ended",
                            chosen.attempt,
                            path.parent().unwrap_or(&path).display()
                        )));
                    }
                    _ => silent.push(name),
                }
            }
            Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) => {
                return Err(CliError::Internal(crate::os::fs::symlink_refused(&path).into()));
            }
            Err(e) => return Err(CliError::Internal(anyhow::anyhow!("cannot read {}: {e}", path.display()))),
        }
    }
    if !silent.is_empty() {
        let (n, streams) = (chosen.attempt, silent.join(" or "));
        match chosen.outcome {
            // Running for as long as its runner is: one that died ended it, as `status` says,
            // whether the run has no runner yet or a new runner took it over (which recorded the
            // attempt `runner_lost`).
            AttemptState::Running if !runner_gone(store.as_ref(), state, &run)? => {
                note!("waymark: attempt {n} of step `{step}` has written nothing to {streams} so far")
            }
            AttemptState::Running | AttemptState::RunnerLost => note!(
                "waymark: attempt {n} of step `{step}` wrote nothing to {streams} (it did not finish: its runner died)"
            ),
            // Cancelled, as `status --attempts` says, and not an attempt that ended of itself. The
            // step's last attempt in an interrupted run is run again, under its number, on resume,
            // unless a step failed for good under `fail_fast`: that run can only fail, and its
            // resume runs what it left (compensations, hooks) and fails it.
            AttemptState::Cancelled => {
                let last = attempts.last().is_some_and(|a| std::ptr::eq(a, chosen));
                let again = match last && run.status == RunStatus::Interrupted {
                    true if can_only_fail(store.as_ref(), &run)? => {
                        "; the run fails when resumed, without running it again: a step failed for good under \
                         `fail_fast`"
                    }
                    true => "; it runs again on resume",
                    false => "",
                };
                note!("waymark: attempt {n} of step `{step}` wrote nothing to {streams} (it was cancelled{again})")
            }
            _ => note!("waymark: attempt {n} of step `{step}` wrote nothing to {streams}"),
        }
    }
    Ok(EXIT_OK)
}

/// Whether run `run` can only fail when resumed: its flow has `fail_fast` and a step of it failed
/// for good.
fn can_only_fail(store: &dyn Store, run: &RunRecord) -> Result<bool, CliError> {
    let fail_fast = crate::store::record::RunDefinition::parse(&run.definition)
        .and_then(|d| d.into_flow())
        .is_ok_and(|flow| flow.fail_fast);
    Ok(fail_fast && store.steps(&run.id)?.iter().any(|s| s.state == StepState::Failed))
}

/// Delete finished runs that ended before the cutoff, with their logs. Each run is deleted while
/// holding its flow's lock, in a transaction that checks again that it is finished: a run that a
/// runner holds (`waymark resume` of a failed run) or is about to hold is kept.
pub(crate) fn gc(state: &StateDir, older_than: Duration) -> Result<i32, CliError> {
    // A state directory that does not exist, or a directory without a state database (not a state
    // directory), or a shared database without waymark's tables, holds no run to delete, and
    // nothing is created in it for that.
    let Some(mut store) = super::open_recorded_store(state)? else {
        note!("waymark: deleted no runs{}", super::Looked::at(state).place);
        return Ok(EXIT_OK);
    };
    let cutoff = SystemTime::now().checked_sub(older_than).unwrap_or(SystemTime::UNIX_EPOCH);
    let candidates = store.finished_before(cutoff)?;
    let mut flows: Vec<(&FlowKey, &str)> = candidates.iter().map(|r| (&r.key, r.flow.as_str())).collect();
    flows.sort_unstable();
    flows.dedup_by_key(|(key, _)| *key);
    let mut deleted: std::collections::HashSet<&str> = std::collections::HashSet::new();
    for (key, flow) in flows {
        let runs = candidates.iter().filter(|r| r.key == *key);
        // A flow without a `name` is its file on its host: its lease carries that host.
        let host = candidates.iter().find(|r| r.key == *key).map_or("", |r| r.host.as_str());
        let lock = match super::FlowGuard::for_gc(state, key, host)? {
            Ok(lock) => lock,
            Err(super::GcHeld::ByRunner) => {
                let n = runs.count();
                note!(
                    "waymark: kept {n} finished run(s) of flow `{flow}`: a runner holds its lock; run gc again later"
                );
                continue;
            }
            Err(super::GcHeld::ByGc) => {
                let n = runs.count();
                note!("waymark: left {n} finished run(s) of flow `{flow}` to another waymark gc, which holds its lock");
                continue;
            }
        };
        for run in runs {
            // Its logs first, then its rows: a gc stopped in between (killed, or a log it cannot
            // delete) leaves a run that the next gc deletes, never logs that no run owns, which no
            // gc would find. So first, under the lock, that it is still to be deleted (a resume
            // may have reopened it, and ended it again, since the list was read).
            let now = match store.run(&run.id) {
                Ok(now) => now,
                Err(crate::store::StoreError::NoSuchRun(_)) => continue,
                Err(e) => return Err(e.into()),
            };
            let still = matches!(now.status, RunStatus::Succeeded | RunStatus::Failed | RunStatus::Abandoned)
                && now.ended_at.is_some_and(|ended| ended < cutoff);
            let kept = || format!("run {} is kept, and the next gc deletes it and them once it can", run.id);
            if !still || !remove_logs(state, &run.id, kept) {
                continue;
            }
            if store.delete_finished(&run.id, cutoff)? {
                deleted.insert(&run.id);
            }
        }
        drop(lock);
    }
    // A shared store: the logs this host keeps of runs that gc deleted on another host.
    // (Not those of the runs this gc deleted: their logs were deleted with them, or a warning
    // said why not.)
    let kept: Vec<String> = match std::fs::read_dir(state.logs()) {
        Ok(entries) => entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|id| !deleted.contains(id.as_str()))
            .collect(),
        Err(_) => Vec::new(),
    };
    let orphans = if kept.is_empty() { Vec::new() } else { store.deleted_elsewhere(&kept)? };
    let removed = orphans.iter().filter(|id| remove_logs(state, id, || "the next gc tries again".into())).count();
    let elsewhere = match removed {
        0 => String::new(),
        n => format!(", and the logs of {n} run(s) deleted by gc on another host"),
    };
    note!("waymark: deleted {} finished run(s) older than {}{elsewhere}", deleted.len(), age(older_than));
    Ok(EXIT_OK)
}

/// Delete the logs this host keeps of run `id`, saying so if they cannot be (then `what_then`);
/// whether they are gone.
fn remove_logs(state: &StateDir, id: &str, what_then: impl FnOnce() -> String) -> bool {
    let dir = state.run_logs(id);
    match crate::os::fs::remove_any(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            note!("waymark: warning: cannot delete {}: {e}; {}", dir.display(), what_then());
            false
        }
        _ => true,
    }
}

/// An age as `gc` says it: whole years or months in words when it is a whole number of them (as
/// `1y` and `1M` read: 365.25 and 30.44 days), else days in words and the rest as humantime writes
/// it (`365 days`, `2 days 12h`, `1h 30m`, `0s`), never a year that is not one (humantime writes
/// `365d` as `11months 30days 3h 50m 24s`).
fn age(d: Duration) -> String {
    const DAY: u64 = 86_400;
    const MONTH: u64 = 2_630_016;
    const YEAR: u64 = 31_557_600;
    let words = |n: u64, unit: &str| format!("{n} {unit}{}", if n == 1 { "" } else { "s" });
    let secs = d.as_secs();
    if secs > 0 && d.subsec_nanos() == 0 {
        if secs.is_multiple_of(YEAR) {
            return words(secs / YEAR, "year");
        }
        if secs.is_multiple_of(MONTH) {
            return words(secs / MONTH, "month");
        }
    }
    let rest = Duration::new(secs % DAY, d.subsec_nanos());
    match secs / DAY {
        0 => humantime::format_duration(rest).to_string(),
        days if rest.is_zero() => words(days, "day"),
        days => format!("{} {}", words(days, "day"), humantime::format_duration(rest)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{RunLog, SqliteStore};

    /// A run read while it ran, whose runner ended it and let its lock go before the look at the
    /// lock, is not said to have lost its runner (`history` and `status` said so, and `--json` had
    /// `runner_alive: false`, for a run that was about to succeed).
    #[test]
    fn a_run_that_ended_after_it_was_read_has_not_lost_its_runner() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::create(dir.path()).unwrap();
        let mut store = SqliteStore::open(&state).unwrap();
        let toml = "[[step]]\nname = 'a'\nrun = ['true']\n";
        let (flow, _) = crate::flow::parse(toml, &dir.path().join("f.toml")).unwrap();
        let (run, lease) = store.create_run(&flow, "hash", "test:1:a").unwrap();
        assert!(runner_gone(&store, &state, &run).unwrap(), "running, and no runner holds its lock");
        store.run_finished(&lease, &run.id, RunStatus::Succeeded, None, &[]).unwrap();
        assert_eq!(run.status, RunStatus::Running);
        assert!(!runner_gone(&store, &state, &run).unwrap(), "it ended since it was read");
    }
}
