//! `waymark run` and `waymark resume`: pick the run, take the flow's lock, drive the executor.
//!
//! From the moment the lock is sought, everything these commands say goes through the run's
//! [`Emitter`] (waiting for the lock, abandoning a run, resuming one whose file changed), like the
//! executor's own events; only the flow file's diagnostics come before it.
//!
//! Parameters: a new run's values are `--param`s over the defaults, checked before anything is
//! abandoned or created, and recorded with the run. A resumed run goes on with the values it was
//! started with; a `--param` that differs from them is refused (exit 2, nothing runs) rather than
//! silently ignored or silently applied to half a run. The env file is read (and checked) before a
//! run is created or claimed, by every runner: its contents are never recorded.

use super::{CliError, EXIT_FAILED, EXIT_OK, FlowGuard, open_store, print_warnings};
use crate::events::{AbandonReason, Earlier, EarlierAttempt, Emitter, Event, NoticeKind, RunOutcome};
use crate::executor::environment::{EnvFileError, RunEnv, secrets_written_in};
use crate::executor::{ExecError, LeftRunning, RunSpec, RunnerSignals, kill_leftovers};
use crate::flow::model::shell_word;
use crate::flow::params::ParamError;
use crate::flow::{self, Flow};
use crate::reporter::Mode;
use crate::store::lease::host_id;
use crate::store::record::RunDefinition;
use crate::store::{
    AuxKind, FlowKey, Lease, RunRecord, RunStatus, StateDir, StepRecord, StepState, Store, StoreError, ThreadJournal,
    create_private_dir,
};
use crate::text::shown_path;
use anyhow::Context;
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

/// How `waymark run` starts: its options.
pub(crate) struct Start<'a> {
    /// `--fresh`: abandon an unfinished run.
    pub(crate) fresh: bool,
    /// `--wait`: wait for another runner of the flow.
    pub(crate) wait: bool,
    /// `--strict`: the flow's warnings are errors.
    pub(crate) strict: bool,
    pub(crate) max_parallel: Option<u32>,
    /// The `--param` arguments as given, parsed once the flow is read.
    pub(crate) params: &'a [String],
}

pub(crate) fn run(state_flag: Option<&Path>, flow_path: &Path, mode: Mode, start: Start<'_>) -> Result<i32, CliError> {
    let Start { fresh, wait, strict, max_parallel, params } = start;
    // Before any thread is started (see `RunnerSignals::install`); heard once the lock is held.
    let signals = install_signal_handlers()?;
    // The flow file first: an invalid one is reported as such whatever the state directory.
    let loaded = match super::load_flow(flow_path, strict) {
        Err(CliError::Flow(e, None)) => {
            // Under `--strict`, a file whose only faults are its warnings loads without it.
            let warnings_only = strict && crate::flow::load(flow_path).is_ok();
            return Err(CliError::Flow(e, super::resumable_despite(state_flag, flow_path, warnings_only)));
        }
        loaded => loaded?,
    };
    // A run records its flow's paths as text, to resume it and for `status`.
    if loaded.flow.path.to_str().is_none() {
        return Err(CliError::Usage(format!(
            "{}: the flow's path is not valid UTF-8, and a run records it as text; move or rename the flow to a \
             path that is; nothing ran",
            loaded.flow.path.display()
        )));
    }
    // `--quiet` says nothing unless the run fails (`waymark check` shows the warnings).
    if mode != Mode::Quiet {
        print_warnings(&loaded, &shown_path(flow_path));
    }
    // A parameter the flow does not declare (or one given twice) is wrong whichever run goes on.
    // A required one left out is wrong only for a new run: a resumed run has its values.
    let params = &parse_params(&loaded.flow, params)?;
    let resolved = match flow::params::resolve(&loaded.flow, params) {
        Ok(values) => Ok(values),
        Err(e @ ParamError::Missing { .. }) => Err(e),
        Err(e) => return Err(CliError::Usage(format!("{e}; nothing ran"))),
    };
    // What a new run needs, checked before an old run is abandoned or a new one created: every
    // parameter's value, none holding a secret (the values are recorded), and a readable env file.
    // It takes the loaded flow (not a copy: it may have 10,000 steps) and gives it back with its
    // parameter values.
    // Where the file names its env file, for a message about it; and which one, to tell whether a
    // resumed run's recorded definition names the same.
    let here = EnvFileAt::File { shown: flow_path, source: &loaded.source };
    let env_file_here = loaded.flow.env_file.clone();
    let new_run = |mut flow: Flow| -> Result<(Flow, RunEnv), CliError> {
        let values = resolved.clone().map_err(|e| CliError::Usage(format!("{e}; nothing ran")))?;
        flow.param_values = values;
        let mut env = run_env(&flow, None, here, strict)?;
        if let Some(name) = flow.param_values.iter().find(|(_, v)| env.declared.redact(v) != **v).map(|(k, _)| k) {
            // Given on the command line, or the default the flow file gives it.
            let whose = match params.iter().any(|(given, _)| given == name) {
                true => format!("the value of `--param {name}`"),
                false => format!("the default of parameter `{name}` (`params.{name}` in {})", shown_path(flow_path)),
            };
            return Err(CliError::Usage(format!("{}; nothing ran", secret_in_param(&whose))));
        }
        // The definition a new run records: a secret's value written in it is stored so.
        secrets_in_definition(&flow, &mut env, flow_path, &loaded.source, strict)?;
        Ok((flow, env))
    };
    // A required parameter left out where no run can be resumed (`--fresh`, or the state
    // directory's store without a database yet) is refused before anything is created.
    if let Err(e @ ParamError::Missing { .. }) = &resolved
        && (fresh
            || (!super::shared_store()
                && !crate::store::statedir::has_database_at(&super::configured_state_dir(state_flag)?)))
    {
        return Err(CliError::Usage(format!("{e}; nothing ran")));
    }
    let state = &super::state_dir(state_flag)?;
    let name = loaded.flow.name.clone();
    // Runs, the lock and resume belong to the flow's key: its declared name, else its file.
    let key = FlowKey::of(&loaded.flow);
    let mut events = emitter(mode);
    // Who this runner is, in the lease of the run it creates or claims.
    let owner = Lease::new_owner();
    let lock = take_lock(&mut events, state, &key, &name, &owner, wait)?;
    signals.listen();
    let mut store = open_store(state)?;
    let hash = source_hash(&loaded.source);
    let mut found = store.find_resumable(&key)?;
    // The lock of the key a run of this file was recorded under, if it is resumed from there.
    let mut _sibling_lock = None;
    if found.is_none()
        && let Some(old) = same_flow_under_sibling_key(store.as_ref(), &loaded.flow, &key)?
    {
        // `waymark resume ID` of that run takes its own key's lock: hold it too, then look again.
        _sibling_lock = Some(take_lock(&mut events, state, &old.key, &old.flow, &owner, wait)?);
        let old = store.run(&old.id)?;
        if matches!(old.status, RunStatus::Running | RunStatus::Interrupted) {
            events.set_run(&old.id);
            events.notice(
                NoticeKind::Info,
                None,
                format!(
                    "run {} of {} was recorded under {} (a declared `name` equal to the file's stem and the \
                     default name are the same flow); resuming it",
                    old.id,
                    loaded.flow.path.display(),
                    old.key.as_str()
                ),
            );
            found = Some(old);
        }
    }
    let stale = found.as_ref().and_then(|old| too_old(old, loaded.flow.resume_within));
    let abandoned = |reason| Event::RunAbandoned { flow: name.clone(), file: flow_path.to_owned(), reason };
    let owned = match found {
        Some(old) if fresh => {
            let (flow, env) = new_run(loaded.flow)?;
            abandon(state, store.as_mut(), &mut events, &old, &owner, abandoned(AbandonReason::Fresh))?;
            let (record, lease) = store.create_run(&flow, &hash, &owner)?;
            Owned::new_run(record, lease, flow, env)
        }
        Some(old) if stale.is_some() => {
            let (flow, env) = new_run(loaded.flow)?;
            let (age, limit) = stale.unwrap_or_default();
            let stale = AbandonReason::Stale { age, limit, reopened: old.reopened_at.is_some() };
            abandon(state, store.as_mut(), &mut events, &old, &owner, abandoned(stale))?;
            let (record, lease) = store.create_run(&flow, &hash, &owner)?;
            Owned::new_run(record, lease, flow, env)
        }
        Some(old) => {
            let moved = old.flow_path != loaded.flow.path;
            let here_path = loaded.flow.path.clone();
            let recorded = match as_recorded(loaded.flow, &resolved, &old) {
                Some(flow) => flow,
                None => recorded_flow(&old, store.location())?,
            };
            let recorded = if moved { moved_to(recorded, &here_path) } else { recorded };
            params_differ(&old, &recorded, params, flow_path)?;
            let at = match recorded.env_file == env_file_here {
                true => here,
                false => EnvFileAt::Recorded { run_id: &old.id, flow_path: &old.flow_path },
            };
            let env = run_env(&recorded, Some(&old.id), at, strict)?;
            events.set_run(&old.id);
            if moved {
                events.notice(
                    NoticeKind::Info,
                    None,
                    format!(
                        "run {} of flow `{name}` was started from {}; resuming it with the definition recorded \
                         then, in this file's directory (files that declare the same `name` share runs; use --fresh \
                         to start over with {})",
                        old.id,
                        old.flow_path.display(),
                        flow_path.display()
                    ),
                );
            }
            // Another file than the one it started from is no change of that file: the notice above
            // says whose definition runs.
            if old.source_hash != hash && !moved {
                events.notice(NoticeKind::FlowChanged, None, flow_changed(flow_path, &old.id));
            }
            let lease = store.claim(&old.id, &owner)?;
            Owned { record: old, lease, resumed: true, flow: recorded, steps: None, env }
        }
        None => {
            let (flow, env) = new_run(loaded.flow)?;
            mention_runs_of_this_file_under_another_key(store.as_ref(), &mut events, &flow.path, &key)?;
            mention_runs_of_a_moved_file(store.as_ref(), &mut events, &flow)?;
            let (record, lease) = store.create_run(&flow, &hash, &owner)?;
            Owned::new_run(record, lease, flow, env)
        }
    };
    execute(state, store, lock, signals, events, owned, Schedule { max_parallel, reopened: false })
}

/// Where the `env_file` of the flow a runner runs is written, for a message about the env file.
#[derive(Clone, Copy)]
enum EnvFileAt<'a> {
    /// In the flow file as loaded now: its path as the user gave it, and its text.
    File { shown: &'a Path, source: &'a str },
    /// In the definition run `run_id` recorded when it started from `flow_path` (the file may
    /// have changed since).
    Recorded { run_id: &'a str, flow_path: &'a Path },
}

impl EnvFileAt<'_> {
    /// "FILE:LINE: `env_file`: " (the line of the key, found only now that it is needed), or the
    /// recorded definition's.
    fn prefix(self) -> String {
        match self {
            EnvFileAt::File { shown, source } => match flow::top_level_key_line(source, "env_file") {
                Some(line) => format!("{}:{line}: `env_file`: ", shown.display()),
                None => format!("{}: `env_file`: ", shown.display()),
            },
            EnvFileAt::Recorded { run_id, flow_path } => {
                format!("{}: `env_file` (as recorded when run {run_id} started): ", flow_path.display())
            }
        }
    }
}

/// What this runner gives the run's attempts besides `flow`: its env file, read now, and its
/// secrets. A bad env file is a usage error, named with the `env_file` field that names it
/// (`at`); nothing ran (`resuming`: the run that was to resume). A variable of the file that
/// waymark sets itself is a warning, as in the flow's `env`, and an error under `strict`.
fn run_env(flow: &Flow, resuming: Option<&str>, at: EnvFileAt<'_>, strict: bool) -> Result<RunEnv, CliError> {
    let mut env = read_env(flow, resuming, at)?;
    let shadowed: Vec<String> = env.shadowed().map(|name| format!("`{name}`")).collect();
    if let (Some(path), false) = (&flow.env_file, shadowed.is_empty()) {
        let them = if shadowed.len() == 1 { "it" } else { "them" };
        let what = format!(
            "{}the env file {} sets {}, which waymark sets for every attempt: no step sees the file's value",
            at.prefix(),
            path.display(),
            shadowed.join(", ")
        );
        if strict {
            let then = resuming.map_or_else(|| "run again".to_owned(), |id| format!("run again to resume run {id}"));
            return Err(CliError::Usage(format!(
                "{what} (an error under --strict); nothing ran: remove {them} from the env file, then {then}"
            )));
        }
        let message = format!("{what}; remove {them} from the env file");
        env.warnings.push(message);
    }
    for what in crate::executor::environment::misspelt_secrets(flow, &env.file) {
        if strict {
            return Err(CliError::Usage(format!(
                "{what} (an error under --strict); nothing ran: correct the name in `secret_env`"
            )));
        }
        env.warnings.push(format!("{what} Correct the name in `secret_env`"));
    }
    Ok(env)
}

/// Warn (refuse under `--strict`) when a new run would record a secret's value: written in the
/// flow file shown as `shown` (its text `source`), in a command say, while the secret comes from
/// the environment or the env file.
fn secrets_in_definition(
    flow: &Flow,
    env: &mut RunEnv,
    shown: &Path,
    source: &str,
    strict: bool,
) -> Result<(), CliError> {
    let inherited = |name: &str| std::env::var_os(name);
    for (name, line) in secrets_written_in(flow, &env.file, inherited, source) {
        let at = line.map(|l| format!(":{l}")).unwrap_or_default();
        let what = format!(
            "{}{at}: the value of secret `{name}` is written in the flow file, and every run records the flow's \
             definition in the state database",
            shown_path(shown)
        );
        let fix = format!("let the step read it from its environment (`${name}`) instead");
        if strict {
            return Err(CliError::Usage(format!("{what} (an error under --strict); nothing ran: {fix}")));
        }
        env.warnings.push(format!("{what}, so it is stored there as written; {fix}"));
    }
    Ok(())
}

fn read_env(flow: &Flow, resuming: Option<&str>, at: EnvFileAt<'_>) -> Result<RunEnv, CliError> {
    RunEnv::prepare(flow, |name| std::env::var_os(name)).map_err(|e| {
        let fix = match (&e, resuming) {
            // A resumed run reads the path it recorded, whatever the file says now.
            (EnvFileError::Read { .. }, Some(_)) => "put a readable env file at that path",
            (EnvFileError::Read { .. }, None) => "correct the `env_file` path or make the file readable",
            _ => "fix the env file",
        };
        let e = e.to_string();
        // After a list of bad lines, on a line of its own.
        let sep = if e.contains('\n') { "\n" } else { "; " };
        let then = match resuming {
            Some(id) => format!("nothing ran: {fix}, then run again to resume run {id}"),
            None => format!("nothing ran: {fix}, then run again"),
        };
        CliError::Usage(format!("{}{e}{sep}{then}", at.prefix()))
    })
}

/// The `--param` arguments `args`, each `NAME=VALUE`, parsed for `flow` (exit status 2 for a
/// malformed one). An argument whose name is no parameter's and part of a secret's value (the
/// secret given without its `NAME=`, split at an `=` of its own) is not repeated in the message;
/// the secrets, and so the env file, are read only for such a name.
fn parse_params(flow: &Flow, args: &[String]) -> Result<Vec<(String, String)>, CliError> {
    let declared: Vec<&str> = flow.params.keys().map(String::as_str).collect();
    let named = |arg: &'_ str| arg.split_once('=').map_or(arg, |(name, _)| name).to_owned();
    let unknown: Vec<String> = args.iter().map(|a| named(a)).filter(|n| !declared.contains(&n.as_str())).collect();
    if !unknown.is_empty() {
        let secrets = crate::executor::environment::secrets_to_hide(flow);
        if unknown.iter().any(|name| secrets.holds_part(name)) {
            let list = declared.iter().map(|d| format!("`{d}`")).collect::<Vec<_>>().join(", ");
            let list = if list.is_empty() { "none".to_owned() } else { list };
            return Err(CliError::Usage(format!(
                "an argument of `--param` does not name a parameter of the flow, and is not repeated here: it \
                 holds part of the value of a variable of `secret_env`; write `--param NAME=VALUE` with one of the \
                 flow's parameters ({list}); nothing ran"
            )));
        }
    }
    args.iter()
        .map(|arg| flow::params::parse_arg(arg, &declared))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CliError::Usage(format!("{e}; nothing ran")))
}

/// Why a parameter's value (`whose`: "the value of `--param date`") cannot be a secret's.
pub(super) fn secret_in_param(whose: &str) -> String {
    format!(
        "{whose} holds the value of a variable of `secret_env`; parameter values are recorded with the run (to \
         resume it with them) and a secret never is: let the step read the secret from its environment instead"
    )
}

/// Refuse `--param`s that differ from the values run `old` was started with: it resumes with its
/// own. The same values (or none) are fine. The values are shown with the run's secrets hidden.
fn params_differ(
    old: &RunRecord,
    recorded: &Flow,
    given: &[(String, String)],
    flow_path: &Path,
) -> Result<(), CliError> {
    let secrets = std::cell::OnceCell::new();
    // Each value hidden before it is quoted (quoting rewrites a secret that holds a `'`).
    let args = |values: &mut dyn Iterator<Item = (&String, &String)>| {
        let secrets = &secrets.get_or_init(|| crate::executor::environment::secrets_to_hide(recorded));
        values.map(|(k, v)| format!("--param {k}={}", shell_word(&secrets.redact(v)))).collect::<Vec<_>>().join(" ")
    };
    let differs: Vec<(&String, &String)> = given
        .iter()
        .filter(|(name, value)| recorded.param_values.get(name) != Some(value))
        .map(|(name, value)| (name, value))
        .collect();
    if differs.is_empty() {
        return Ok(());
    }
    let started = match recorded.param_values.is_empty() {
        true => "no parameters".to_owned(),
        false => format!("`{}`", args(&mut recorded.param_values.iter())),
    };
    Err(CliError::Usage(format!(
        "run {} of {} is unfinished and resumes with the values it started with ({started}), but `{}` \
         differs: run without `--param` (or with the same values) to resume it, or add `--fresh` to abandon it \
         and start a new run with the new values; nothing ran",
        old.id,
        flow_path.display(),
        args(&mut differs.into_iter())
    )))
}

/// The run's emitter, with the reporter of `mode`.
fn emitter(mode: Mode) -> Emitter {
    Emitter::new(vec![mode.reporter()])
}

/// Take the lock of flow `key` (shown as `flow`), saying so through `events` before waiting for
/// another runner.
fn take_lock(
    events: &mut Emitter,
    state: &StateDir,
    key: &FlowKey,
    flow: &str,
    owner: &str,
    wait: bool,
) -> Result<FlowGuard, CliError> {
    FlowGuard::acquire(state, key, flow, owner, wait, |holder| {
        let message = match crate::store::held_by_gc(holder) {
            true => format!("flow `{flow}` is locked by {holder}, deleting its old runs; waiting for it to finish"),
            false => format!("flow `{flow}` is already running ({holder}); waiting for it to finish"),
        };
        events.notice(NoticeKind::WaitingForLock, None, message);
    })
}

/// An unfinished run of this very file under the other kind of key with the same flow name: the
/// file's `name` key equal to its stem was added or removed since, or the run was recorded by schema
/// 1, which cannot tell a declared name equal to the stem from the default one (and whose migration
/// keys such a run by its file). Either way it is this flow's run: its name and file are this flow's.
fn same_flow_under_sibling_key(store: &dyn Store, flow: &Flow, key: &FlowKey) -> Result<Option<RunRecord>, CliError> {
    let sibling = if key.file().is_some() { FlowKey::named(&flow.name) } else { FlowKey::path(&flow.path) };
    let runs = store.unfinished_runs(crate::store::RunFilter::File(&flow.path), 50)?;
    Ok(runs.into_iter().find(|r| r.key == sibling && r.flow == flow.name))
}

/// Say so when this file has an unfinished run that belongs to another key (the file's `name` key
/// was added, removed or changed since, or the run was recorded before flow identity with a name
/// equal to the file's stem): `waymark run` does not resume it, `waymark resume ID` does.
fn mention_runs_of_this_file_under_another_key(
    store: &dyn Store,
    events: &mut Emitter,
    path: &Path,
    key: &FlowKey,
) -> Result<(), CliError> {
    let runs = store.unfinished_runs(crate::store::RunFilter::File(path), 50)?;
    if let Some(old) = runs.iter().find(|r| r.key != *key) {
        let owner = match old.key.file() {
            Some(_) => "to the file itself (no `name` key)".to_owned(),
            None => format!("to the flow name `{}`", old.flow),
        };
        let message = format!(
            "unfinished run {} of {} belongs {owner}, not to this flow (its `name` key changed since, or the run \
             predates flow identity), so it is not resumed; `waymark resume {}` resumes it",
            old.id,
            path.display(),
            old.id
        );
        events.notice(NoticeKind::Info, None, message);
    }
    Ok(())
}

/// Say so when an unfinished run of a flow of the same name was started from a file that is gone
/// (moved or renamed, perhaps to this one): a flow without a `name` key is its file, so it is not
/// resumed here; `waymark resume ID` resumes it.
fn mention_runs_of_a_moved_file(store: &dyn Store, events: &mut Emitter, flow: &Flow) -> Result<(), CliError> {
    let runs = store.unfinished_runs(crate::store::RunFilter::Name(&flow.name), 50)?;
    let moved = |r: &&RunRecord| r.key.file().is_some() && r.flow_path != flow.path && !r.flow_path.exists();
    for old in runs.iter().filter(moved) {
        let message = format!(
            "unfinished run {} of flow `{}` was started from {}, which is gone; a flow without a `name` key is \
             its file, so it is not resumed here: `waymark resume {}` resumes it (or declare the same `name` in \
             both places to share runs)",
            old.id,
            old.flow,
            old.flow_path.display(),
            old.id
        );
        events.notice(NoticeKind::Info, None, message);
    }
    Ok(())
}

/// Abandon an unfinished run for `owner`'s new one: its dead runner's attempts must not go on
/// beside the new run. Then say so with `abandoned` (a `RunAbandoned`), about the old run.
fn abandon(
    state: &StateDir,
    store: &mut dyn Store,
    events: &mut Emitter,
    old: &RunRecord,
    owner: &str,
    abandoned: Event,
) -> Result<(), CliError> {
    events.set_run(&old.id);
    let aux = store.aux_runs(&old.id)?;
    // What a runner on another host left running is not ours to kill (its pids mean nothing here).
    if old.host == host_id() {
        // Its steps' attempts and catch handlers, and a compensation or hook it was running.
        let steps = store.steps(&old.id)?;
        let (said, error) = kill_leftovers(state, &old.id, &LeftRunning::of(&steps, &aux));
        for (step, message) in said {
            events.warning(step.as_deref(), message);
        }
        if let Some(e) = error {
            return Err(exec_error(e).into());
        }
    } else {
        // Said, as a takeover says it: the user is to stop them there.
        let host = &old.host;
        let steps = store.steps(&old.id)?;
        let left = LeftRunning::of(&steps, &aux);
        let said = |what: String| {
            format!(
                "{what} was running on host {host} when run {} was abandoned; it is not killed from here (waymark \
                 never kills by a pid recorded on another host): stop it there if it still runs",
                old.id
            )
        };
        for step in &left.steps {
            let what = match step.state {
                StepState::Catching { attempt, .. } => format!("the catch handler of attempt {attempt}"),
                StepState::InFlight { attempt, .. } => format!("attempt {attempt}"),
                _ => continue,
            };
            events.warning(Some(&step.name), said(what));
        }
        for (run, _) in &left.aux {
            let what = match run.kind {
                crate::store::AuxKind::Compensate => format!("the compensation of step `{}`", run.name),
                crate::store::AuxKind::Hook => format!("hook {}", run.name),
            };
            events.warning(None, said(what));
        }
    }
    store.abandon(&old.id, owner)?;
    events.emit(abandoned);
    // Its wind-down had begun: what is left of it never runs now.
    if aux.iter().any(|a| a.kind == crate::store::AuxKind::Compensate) {
        events.warning(
            None,
            format!(
                "run {} had begun undoing what its steps did (its compensations) when it stopped; abandoned, it \
                 never finishes them, nor runs its hooks: check by hand what its succeeded steps left (`waymark \
                 status {}` shows which compensations ran)",
                old.id, old.id
            ),
        );
    } else if aux.iter().any(|a| a.kind == crate::store::AuxKind::Hook && !a.finished) {
        events.warning(
            None,
            format!("run {} was running its hooks when it stopped; abandoned, it never finishes them", old.id),
        );
    }
    Ok(())
}

/// How long ago a run started, or was reopened after it failed (whole milliseconds).
fn age(run: &RunRecord) -> std::time::Duration {
    let age = std::time::SystemTime::now().duration_since(run.began()).unwrap_or_default();
    std::time::Duration::from_millis(u64::try_from(age.as_millis()).unwrap_or(u64::MAX))
}

/// The run's age and the flow's `resume_within` if `run` started longer ago than that.
fn too_old(run: &RunRecord, limit: Option<std::time::Duration>) -> Option<(std::time::Duration, std::time::Duration)> {
    let age = age(run);
    limit.filter(|limit| age > *limit).map(|limit| (age, limit))
}

pub(crate) fn resume(state: &StateDir, run_id: &str, wait: bool, mode: Mode) -> Result<i32, CliError> {
    // Before any thread is started (see `RunnerSignals::install`); heard once the lock is held.
    let signals = install_signal_handlers()?;
    let mut events = emitter(mode);
    events.set_run(run_id);
    // A state directory that does not exist, or a directory without a state database (not a state
    // directory), or a shared database without waymark's tables, holds no run, and nothing is
    // created in it to find none.
    let Some(mut store) = super::open_recorded_store(state)? else {
        return Err(super::no_such_run(run_id, state));
    };
    // The run's own key, whichever file started it; `resume_within` does not apply here.
    let run = store.run(run_id).map_err(|e| match e {
        StoreError::NoSuchRun(_) => super::no_such_run(run_id, state),
        e => e.into(),
    })?;
    // Found: its runner keeps the logs of its attempts on this host there.
    let state = &super::create_state_dir(state.root())?;
    // A flow without a `name` is its file on its host: never taken over from another host.
    if super::shared_store() && run.key.file().is_some() && run.host != host_id() {
        return Err(CliError::Usage(format!(
            "run {run_id} belongs to the flow file {} on host {} (the flow declares no `name`), so it is not \
             resumed from host {}; resume it there, or declare a `name` in the flow to share its runs across hosts",
            run.flow_path.display(),
            run.host,
            host_id()
        )));
    }
    let owner = Lease::new_owner();
    let lock = take_lock(&mut events, state, &run.key, &run.flow, &owner, wait)?;
    signals.listen();
    // Decide only under the lock, on one snapshot of the run and its steps: a runner we waited
    // for may have changed it, and `waymark gc` may have deleted it before we held the lock (gc
    // takes the lock too, so it cannot delete it from now on).
    let (mut record, steps) = store.run_and_steps(run_id).map_err(|e| match e {
        StoreError::NoSuchRun(_) => CliError::Usage(format!(
            "run {run_id} is gone: it was deleted (by `waymark gc`?) before it could be resumed; nothing ran"
        )),
        e => e.into(),
    })?;
    no_steps_is_an_error(&record, &steps, store.as_ref())?;
    match record.status {
        RunStatus::Succeeded => {
            events.notice(NoticeKind::Info, None, format!("run {run_id} already succeeded; nothing to do"));
            return Ok(EXIT_OK);
        }
        RunStatus::Abandoned => {
            return Err(CliError::Usage(format!(
                "run {run_id} was abandoned and cannot be resumed; `waymark run` starts a new one"
            )));
        }
        // Its compensations were to undo what its succeeded steps did: resuming it would skip them.
        RunStatus::Failed => {
            let aux = store.aux_runs(run_id)?;
            if compensated(&aux) {
                let undone = match super::inspect::not_undone(&aux).as_slice() {
                    [] => "its compensations ran, undoing what its steps did".to_owned(),
                    names => {
                        let (of, steps) = match names.len() {
                            1 => ("the compensation", "that step"),
                            _ => ("the compensations", "those steps"),
                        };
                        let names = names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ");
                        format!(
                            "its compensations ran (but {of} of {names} did not succeed: what {steps} did may not \
                             be undone; `waymark status {run_id}` shows how each ended)"
                        )
                    }
                };
                return Err(CliError::Usage(format!(
                    "run {run_id} failed and {undone}, so it cannot be resumed; `waymark run --fresh {}` starts \
                     the flow anew",
                    shell_word(&record.flow_path.to_string_lossy())
                )));
            }
        }
        RunStatus::Running | RunStatus::Interrupted => {}
    }
    // Its env file is read before the run is touched: a bad one leaves it as it was.
    let flow = recorded_flow(&record, store.location())?;
    // The run goes on as recorded, whatever its file says now: said, as `waymark run` says it
    // (here after a failure, the file is often what was just fixed).
    let now = read_flow_text(&record.flow_path);
    if now.is_some_and(|text| source_hash(&text) != record.source_hash) {
        events.notice(NoticeKind::FlowChanged, None, flow_changed(&record.flow_path, run_id));
    }
    let env = run_env(&flow, Some(run_id), EnvFileAt::Recorded { run_id, flow_path: &record.flow_path }, false)?;
    if record.status == RunStatus::Failed {
        // As recorded (to the millisecond): its deadline counts from then in this runner and the next.
        let at = crate::store::from_millis(crate::store::to_millis(std::time::SystemTime::now()));
        store.reopen_failed(run_id, at)?;
        record.reopened_at = Some(at);
    }
    let lease = store.claim(run_id, &owner)?;
    let schedule = Schedule { max_parallel: None, reopened: record.status == RunStatus::Failed };
    execute(
        state,
        store,
        lock,
        signals,
        events,
        Owned { record, lease, resumed: true, flow, steps: None, env },
        schedule,
    )
}

/// The runner's signal handlers, installed before it starts any thread and heard
/// ([`RunnerSignals::listen`]) from the moment it holds the lock (waiting for the lock stays
/// interruptible by Ctrl-C), before the run is created or claimed: a signal from then on is
/// handled by the run, which ends `interrupted`, however early it comes.
fn install_signal_handlers() -> Result<RunnerSignals, CliError> {
    RunnerSignals::install().context("cannot install the runner's signal handlers").map_err(CliError::Internal)
}

/// How this runner schedules the run: `--max-parallel` over the flow's `max_parallel`, and
/// whether the run is a failed one reopened by `waymark resume` (whose steps cancelled by
/// `fail_fast` start anew).
struct Schedule {
    max_parallel: Option<u32>,
    reopened: bool,
}

/// The run this runner goes on with: created or claimed, with the lease that gave it, its flow
/// (read from its record once, or for a new run the flow just loaded, validated and recorded),
/// and what the runner adds to its definition.
struct Owned {
    record: RunRecord,
    lease: Lease,
    resumed: bool,
    flow: Flow,
    /// A new run's steps as just recorded (all pending); `None`: read them from the store.
    steps: Option<Vec<StepRecord>>,
    env: RunEnv,
}

impl Owned {
    /// A run just created from `flow`: it runs `flow` itself, not the flow read back from its
    /// record (the same flow, but megabytes of JSON to parse for a large one), and its steps are
    /// all pending, as `create_run` recorded them: given as no records (see [`RunSpec::steps`]),
    /// where a record made for each step was 1.4 MB of new memory for 10,000 steps.
    fn new_run(record: RunRecord, lease: Lease, flow: Flow, env: RunEnv) -> Owned {
        Owned { record, lease, resumed: false, flow, steps: Some(Vec::new()), env }
    }
}

fn execute(
    state: &StateDir,
    store: Box<dyn Store>,
    mut lock: FlowGuard,
    signals: RunnerSignals,
    mut events: Emitter,
    owned: Owned,
    schedule: Schedule,
) -> Result<i32, CliError> {
    let Owned { record, lease, resumed, flow, steps, env } = owned;
    let record = &record;
    events.set_run(&record.id);
    // From here on every event hides the run's secrets.
    events.set_secrets(Arc::clone(&env.secrets));
    for message in &env.warnings {
        events.warning(None, message.as_str());
    }
    if let FlowGuard::File(lock) = &mut lock {
        lock.describe_holder(&record.id);
    }
    // Read again: `resume` of a failed run has just reopened its failed step. A run with no steps
    // (the flow has at least one) fails the match.
    let steps = match steps {
        // Made from the flow's steps, in their order: nothing to match.
        Some(steps) => steps,
        None => match_steps(&flow, store.steps(&record.id)?).map_err(|what| {
            CliError::Internal(anyhow::anyhow!(
                "run {} in {}: {what}; the database was changed behind waymark's back: `waymark run --fresh` \
                 starts the flow anew",
                record.id,
                store.location(),
            ))
        })?,
    };
    // The compensation and hooks of the run recorded so far, read once: the report of a resumed
    // run needs whether a compensation ran, and the dispatcher needs them all.
    let aux = store.aux_runs(&record.id)?;
    // The attempts of earlier runners, read once, when something needs them: the failure report
    // lists them (`--json` has none), and a step a signal cut short, which only a pending step
    // that started can be, goes on as a step under way (only its attempts are read if nothing
    // else needs them). A failed run reopened by `waymark resume` has none: its steps that
    // `fail_fast` cancelled start anew.
    let started_pending: Vec<&StepRecord> = match resumed && !schedule.reopened {
        true => steps.iter().filter(|s| s.state == StepState::Pending && s.started_at.is_some()).collect(),
        false => Vec::new(),
    };
    let reported = resumed && events.wants_earlier();
    let attempts = match reported {
        true => store.attempts(&record.id, None)?,
        false => Vec::new(),
    };
    let interrupted = cut_short(store.as_ref(), &record.id, &steps, &started_pending, reported.then_some(&attempts))?;
    if reported {
        let shared = super::shared_store();
        let earlier_attempts = attempts.iter().map(|a| EarlierAttempt::of(a, shared)).collect();
        let budget_bases =
            steps.iter().filter(|s| s.budget_base > 0).map(|s| (s.name.clone(), s.budget_base)).collect();
        // Left under way: in flight (its runner died), waiting for a retry or for its catch
        // handler, or cut short by a signal.
        let under_way = flow
            .steps
            .iter()
            .zip(&steps)
            .enumerate()
            .filter(|(i, (_, rec))| {
                matches!(rec.state, StepState::InFlight { .. } | StepState::Waiting { .. } | StepState::Catching { .. })
                    || interrupted.contains(i)
            })
            .map(|(_, (step, rec))| (rec.name.clone(), rec.budget_base.saturating_add(step.retry.attempts)))
            .collect();
        events.earlier(&Earlier {
            attempts: earlier_attempts,
            compensated: compensated(&aux),
            budget_bases,
            under_way,
        });
    }
    let log_dir = state.run_logs(&record.id);
    create_private_dir(&log_dir).with_context(|| format!("cannot create the log directory {}", log_dir.display()))?;
    let max_parallel = schedule.max_parallel.unwrap_or(flow.max_parallel);
    // From the run's start, or from when `waymark resume` reopened it after it failed.
    let deadline = flow.timeout.map(|t| record.began() + t);
    let mut max_parallel = usize::try_from(max_parallel).unwrap_or(usize::MAX);
    if let Err((fits, message)) = crate::os::process::allow_open_files_for(max_parallel.min(flow.steps.len())) {
        events.warning(None, message);
        max_parallel = fits;
    }
    let spec = RunSpec {
        flow: Arc::new(flow),
        run_id: record.id.clone(),
        steps,
        resumed,
        max_parallel,
        deadline,
        env: Arc::new(env),
        aux,
        interrupted,
        // The runner the run is taken over from (its record was read before the claim).
        elsewhere: (resumed && record.host != host_id()).then(|| record.host.clone()),
    };
    // Its blocking threads leave the runner's signals to the main thread (see `deafen_this_thread`).
    let runtime = (tokio::runtime::Builder::new_current_thread().enable_all())
        .on_thread_start(crate::os::signals::deafen_this_thread)
        .build()
        .context("cannot start the runtime")?;
    // From here on the run is written by the journal's thread, which owns the store connection;
    // the dispatcher drops the journal when it is done, which waits until every write sent is made.
    let location = store.location().to_owned();
    let clock = match &lock {
        FlowGuard::Lease(lease) => Some(lease.clock()),
        FlowGuard::File(_) => None,
    };
    let mut store = store;
    if let Some(clock) = &clock {
        store.fenced_by(Arc::clone(clock));
    }
    let journal = ThreadJournal::start_fenced(store, location, record.id.clone(), lease, clock)
        .context("cannot start the thread that writes the run's state")?;
    let outcome = runtime.block_on(crate::executor::execute(spec, state.clone(), journal, signals, &mut events));
    if let Err(e) = &outcome {
        // With its causes, as the command's own message says it (`: No space left on device`).
        let mut error = e.to_string();
        let mut cause = std::error::Error::source(e);
        while let Some(c) = cause {
            error = format!("{error}: {c}");
            cause = c.source();
        }
        events.emit(Event::RunAborted { error });
    }
    // Only once the runtime (and every attempt task in it) is gone may another runner take over.
    drop(runtime);
    drop(lock);
    // From here on a signal ends waymark at once, even while the last output is written.
    crate::executor::restore_default_signals();
    // The reporters deliver what they still hold.
    drop(events);
    match outcome {
        Ok(RunOutcome::Succeeded) => Ok(EXIT_OK),
        Ok(RunOutcome::Failed) => Ok(EXIT_FAILED),
        Ok(RunOutcome::Interrupted { signal }) => Ok(128 + signal),
        // Another runner owns the run now, or the run went with its deleted database, or it is in
        // a corrupt one (only moving it aside starts afresh): resuming it is not this runner's to
        // suggest.
        Err(e @ ExecError::Store(StoreError::LeaseLost { .. } | StoreError::Fenced { .. }))
        | Err(
            e @ ExecError::Store(StoreError::Failed {
                kind: crate::store::StoreErrorKind::Deleted | crate::store::StoreErrorKind::Corrupt,
                ..
            }),
        ) => Err(CliError::Internal(exec_error(e))),
        Err(e) => {
            let context = format!("run {} stopped; `waymark run` resumes it once the cause is fixed", record.id);
            Err(CliError::Internal(exec_error(e).context(context)))
        }
    }
}

/// The steps (by index) that a signal to the runner cut short ([`StepRecord::cut_short`]): they
/// were under way. Only a pending step that started can be one (`candidates`); their attempts are
/// read from `all`, the run's attempts oldest first, when it was read for a report, else step by
/// step (they are few: a run's other steps, done or not started, cost nothing).
fn cut_short(
    store: &dyn Store,
    run_id: &str,
    steps: &[StepRecord],
    candidates: &[&StepRecord],
    all: Option<&[crate::store::AttemptRecord]>,
) -> Result<BTreeSet<usize>, CliError> {
    if candidates.is_empty() {
        return Ok(BTreeSet::new());
    }
    let own;
    let attempts = match all {
        Some(all) => all,
        None => {
            let each = candidates.iter().map(|s| store.attempts(run_id, Some(&s.name)));
            own = each.collect::<Result<Vec<_>, _>>()?.concat();
            &own
        }
    };
    let mut last = std::collections::HashMap::new();
    for a in attempts {
        last.insert(a.step.as_str(), a);
    }
    let cut = steps.iter().enumerate().filter(|(_, s)| s.cut_short(last.get(s.name.as_str()).copied()));
    Ok(cut.map(|(i, _)| i).collect())
}

/// Whether a compensation ran, of a run whose compensations and hooks are `aux`: its steps' work
/// was undone, so it cannot be resumed.
fn compensated(aux: &[crate::store::AuxRun]) -> bool {
    aux.iter().any(|a| a.kind == AuxKind::Compensate)
}

/// The loaded flow, with the parameter values a new run would get, if it records as exactly the
/// text run `old` recorded: then it is the flow that record reads back as (a record reads back as
/// the flow it was written from, tested for every version's fixture and for every step field),
/// and the record (megabytes of JSON for 10,000 steps) need not be parsed. Else `None`: the
/// definition recorded then is read, as ever (a changed file, other `--param`s, another version).
fn as_recorded(
    mut flow: Flow,
    values: &Result<std::collections::BTreeMap<String, String>, ParamError>,
    old: &RunRecord,
) -> Option<Flow> {
    if !RunDefinition::is_current(&old.definition) {
        return None;
    }
    flow.param_values = values.as_ref().ok()?.clone();
    RunDefinition::records_as(&flow, &old.definition).then_some(flow)
}

/// The flow a run recorded, resumed from a file at another path `to` (another host's checkout, the
/// next release's directory, a file moved): what lay under the recorded file's directory (the
/// steps' working directories, the env file) is taken under `to`'s, and the hooks run there, as
/// they would from a run started there; a path elsewhere stays as recorded (and, from a file in
/// `/`, every path but that directory itself).
fn moved_to(mut flow: Flow, to: &Path) -> Flow {
    let (Some(from), Some(dir)) = (flow.path.parent().map(Path::to_owned), to.parent()) else { return flow };
    // Under `/` lies every absolute path: a file there moved takes only its own directory along.
    let under = |path: &Path| path == from || from.parent().is_some();
    let rebased = |path: &Path| path.strip_prefix(&from).ok().filter(|_| under(path)).map(|rest| dir.join(rest));
    for step in &mut flow.steps {
        if let Some(workdir) = rebased(&step.workdir) {
            step.workdir = workdir.into();
        }
    }
    if let Some(env_file) = flow.env_file.as_deref().and_then(rebased) {
        flow.env_file = Some(env_file);
    }
    flow.path = to.to_owned();
    flow
}

/// The flow a run recorded when it started, through its versioned record.
fn recorded_flow(record: &RunRecord, location: &str) -> Result<Flow, CliError> {
    RunDefinition::parse(&record.definition)
        .and_then(RunDefinition::into_flow)
        .map_err(|error| StoreError::Record { location: location.to_owned(), run_id: record.id.clone(), error }.into())
}

/// The recorded steps in the definition's order, matched by name (never by position): every step
/// of the definition must have exactly one record, and every record a step.
fn match_steps(flow: &Flow, records: Vec<StepRecord>) -> Result<Vec<StepRecord>, String> {
    // The store gives the records in the order of their positions, which is the definition's
    // order: then record i is step i's, and the match below would return the records as they
    // are (a record's name is unique in the table). Checking that in one pass over the names
    // skips hashing 10,000 names and moving every record twice for a large run.
    if records.len() == flow.steps.len() && records.iter().zip(&flow.steps).all(|(r, s)| r.name == s.name) {
        return Ok(records);
    }
    // By name through a map of the names borrowed: a 10,000-step run is matched in linear time,
    // copying no name. (Names are unique in the table; a second record of a name would be left
    // over, as one not in the definition.)
    let mut by_name = std::collections::HashMap::with_capacity(records.len());
    for (i, record) in records.iter().enumerate().rev() {
        by_name.insert(record.name.as_str(), i);
    }
    let mut order = Vec::with_capacity(flow.steps.len());
    let mut taken = vec![false; records.len()];
    for step in &flow.steps {
        match by_name.get(step.name.as_str()) {
            Some(&i) if !taken[i] => {
                taken[i] = true;
                order.push(i);
            }
            _ => return Err(format!("step `{}` of its definition has no recorded state", step.name)),
        }
    }
    let mut left: Vec<Option<StepRecord>> = records.into_iter().map(Some).collect();
    let matched = order.into_iter().filter_map(|i| left[i].take()).collect();
    if let Some(extra) = left.iter().flatten().next() {
        return Err(format!("step `{}` has a recorded state but is not in its definition", extra.name));
    }
    Ok(matched)
}

/// A run without steps is never "all steps succeeded": its steps were deleted behind waymark's
/// back (every flow has at least one step).
fn no_steps_is_an_error(record: &RunRecord, steps: &[StepRecord], store: &dyn Store) -> Result<(), CliError> {
    if steps.is_empty() {
        return Err(CliError::Internal(anyhow::anyhow!(
            "run {} in {} has no steps recorded, so it cannot be resumed (its steps were deleted behind \
             waymark's back); nothing ran: `waymark run --fresh {}` starts the flow anew",
            record.id,
            store.location(),
            shell_word(&record.flow_path.to_string_lossy())
        )));
    }
    Ok(())
}

/// An executor error for the user; a store error is kept itself in the chain, so that the hint
/// about the state directory applies.
fn exec_error(e: ExecError) -> anyhow::Error {
    match e {
        ExecError::Store(store) => anyhow::Error::new(store),
        other => anyhow::Error::new(other),
    }
}

/// The text of the flow file at `path` now, as loading reads it, if it is a regular file of at
/// most the size a flow file may have, in UTF-8 (never a FIFO waited on, nor a huge file read
/// whole).
fn read_flow_text(path: &Path) -> Option<String> {
    // Looked at before it is opened: opening a FIFO waits for a writer.
    if !std::fs::metadata(path).ok()?.is_file() {
        return None;
    }
    flow::decode(flow::read_bytes(path).ok()?).ok()
}

/// What `run` and `resume` say when they resume run `run_id` with the definition it recorded
/// although its file at `path` changed since.
fn flow_changed(path: &Path, run_id: &str) -> String {
    format!(
        "{} changed since run {run_id} started; resuming with the definition recorded then (`waymark run --fresh \
         {}` starts over with the new one)",
        shown_path(path),
        shell_word(&path.to_string_lossy())
    )
}

/// A stable fingerprint of the flow file's text (FNV-1a), to notice edits between runs.
fn source_hash(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow_of(names: &[&str]) -> Flow {
        let source: String = names.iter().map(|n| format!("[[step]]\nname = \"{n}\"\nrun = [\"true\"]\n")).collect();
        flow::parse(&source, Path::new("/tmp/flow.toml")).unwrap_or_else(|_| panic!("a valid flow")).0
    }

    /// A run resumed from a file at another path runs in the new file's directory: what lay under
    /// the old one's moves along, what lay elsewhere stays; from a file in `/`, only `/` itself.
    #[test]
    fn a_moved_flow_takes_what_lay_under_its_directory_along() {
        let source = "env_file = '.env'\n[[step]]\nname = 'a'\nrun = ['true']\n[[step]]\nname = 'b'\n\
                      workdir = 'sub'\nrun = ['true']\n[[step]]\nname = 'c'\nworkdir = '/data'\nrun = ['true']\n";
        let flow = flow::parse(source, Path::new("/srv/r1/flow.toml")).unwrap_or_else(|_| panic!("valid")).0;
        let moved = moved_to(flow, Path::new("/srv/r2/flow.toml"));
        let dirs: Vec<&Path> = moved.steps.iter().map(|s| &*s.workdir).collect();
        assert_eq!(dirs, [Path::new("/srv/r2"), Path::new("/srv/r2/sub"), Path::new("/data")]);
        assert_eq!(moved.env_file.as_deref(), Some(Path::new("/srv/r2/.env")));
        assert_eq!(moved.path, Path::new("/srv/r2/flow.toml"));
        let source = "env_file = '/etc/app.env'\n[[step]]\nname = 'a'\nrun = ['true']\n[[step]]\nname = 'c'\n\
                      workdir = '/data'\nrun = ['true']\n";
        let flow = flow::parse(source, Path::new("/flow.toml")).unwrap_or_else(|_| panic!("valid")).0;
        let moved = moved_to(flow, Path::new("/app/flow.toml"));
        let dirs: Vec<&Path> = moved.steps.iter().map(|s| &*s.workdir).collect();
        assert_eq!(dirs, [Path::new("/app"), Path::new("/data")]);
        assert_eq!(moved.env_file.as_deref(), Some(Path::new("/etc/app.env")));
    }

    fn records(names: &[&str]) -> Vec<StepRecord> {
        names.iter().map(|n| StepRecord::pending(n)).collect()
    }

    fn names(records: &[StepRecord]) -> Vec<&str> {
        records.iter().map(|r| r.name.as_str()).collect()
    }

    #[test]
    fn steps_are_matched_by_name_whatever_their_order() {
        let flow = flow_of(&["a", "b", "c"]);
        // In the definition's order (the store's usual one) and in any other.
        assert_eq!(names(&match_steps(&flow, records(&["a", "b", "c"])).unwrap()), ["a", "b", "c"]);
        assert_eq!(names(&match_steps(&flow, records(&["c", "a", "b"])).unwrap()), ["a", "b", "c"]);
    }

    #[test]
    fn a_step_without_a_record_or_a_record_without_a_step_is_refused() {
        let flow = flow_of(&["a", "b", "c"]);
        assert_eq!(
            match_steps(&flow, records(&["a", "b"])).unwrap_err(),
            "step `c` of its definition has no recorded state"
        );
        assert_eq!(
            match_steps(&flow, records(&["a", "x", "c"])).unwrap_err(),
            "step `b` of its definition has no recorded state"
        );
        assert_eq!(
            match_steps(&flow, records(&["a", "b", "c", "d"])).unwrap_err(),
            "step `d` has a recorded state but is not in its definition"
        );
        assert!(match_steps(&flow, Vec::new()).is_err());
    }
}
