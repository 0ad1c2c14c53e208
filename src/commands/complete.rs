//! Dynamic completion: `WAYMARK_COMPLETE=bash waymark` prints a script that registers waymark with the
//! shell, and the shell then calls `waymark -- waymark ARGS...` with `WAYMARK_COMPLETE` set to complete a
//! word (clap_complete's `CompleteEnv` protocol). Run ids and step names come from the store the
//! command line would use (`--store`, `WAYMARK_STORE`, the state directory), read-only; anything
//! that goes wrong offers nothing rather than printing an error.

use super::{choose_store, find_state_dir, inspect, read_store};
use crate::store::{RunFilter, StateDir, Store};
use clap_complete::engine::{CompletionCandidate, PathCompleter, ValueCompleter};
use std::ffi::OsStr;
use std::path::PathBuf;

/// The most runs offered, newest first.
const MAX_RUNS: usize = 500;

/// The variable the shell sets to ask for completions: waymark's own, not clap_complete's generic
/// `COMPLETE`, which a cron job or a step's environment could carry for another reason and would
/// then turn every `waymark run` into a completer that runs nothing.
const VAR: &str = "WAYMARK_COMPLETE";

/// Answer the shell and exit if it is asking ([`VAR`] set); otherwise return at once.
pub fn complete_if_asked() {
    use clap::CommandFactory;
    clap_complete::CompleteEnv::with_factory(crate::cli::Cli::command).var(VAR).complete();
}

/// The words of the command line being completed: what the shell passes after `--`, without the
/// program's name.
fn words() -> Vec<String> {
    let args: Vec<String> = std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect();
    let start = args.iter().position(|a| a == "--").map_or(args.len(), |i| i + 2);
    args.get(start..).map(<[String]>::to_vec).unwrap_or_default()
}

/// The options of the commands that name a run or a step which take a value.
const VALUED: [&str; 6] = ["--state-dir", "--store", "--host-id", "--attempt", "--stream", "--color"];

/// Option `name` (`--state-dir`) as the command line gives it (the last one wins, as after the
/// command).
fn option_value(words: &[String], name: &str) -> Option<String> {
    let mut value = None;
    for (i, w) in words.iter().enumerate() {
        if w == name {
            value = words.get(i + 1).cloned();
        } else if let Some(v) = w.strip_prefix(name).and_then(|rest| rest.strip_prefix('=')) {
            value = Some(v.to_owned());
        }
    }
    value
}

/// The store of the state directory the command line would use, opened for reading.
fn store(words: &[String]) -> Option<Box<dyn Store>> {
    store_in(words).map(|(_, store)| store)
}

/// The state directory the command line would use, and the store it would use (`--store`, else
/// `WAYMARK_STORE`, else the state directory's), opened for reading.
fn store_in(words: &[String]) -> Option<(StateDir, Box<dyn Store>)> {
    let dir_flag = option_value(words, "--state-dir").map(PathBuf::from);
    let url_dir = choose_store(option_value(words, "--store").as_deref(), dir_flag.as_deref()).ok()?;
    let state = find_state_dir(dir_flag.as_deref().or(url_dir.as_deref())).ok()?;
    let store = read_store(&state).ok()?;
    Some((state, store))
}

/// The ids of the runs (of every flow), newest first, that start with `current`; each with its
/// flow, status and start as help.
fn run_candidates(store: &dyn Store, current: &str) -> Vec<CompletionCandidate> {
    let Ok(runs) = store.list_runs(RunFilter::All, MAX_RUNS) else { return Vec::new() };
    runs.into_iter()
        .filter(|r| r.id.starts_with(current))
        .map(|r| {
            let help = format!("{} {}, {}", r.flow, r.status.as_str(), humantime::format_rfc3339_seconds(r.started_at));
            CompletionCandidate::new(r.id).help(Some(help.into()))
        })
        .collect()
}

/// `answer()`, or nothing if it takes more than a second from a PostgreSQL store: a shell waits
/// for it, and a server that takes the connection and says nothing holds it for good. The thread
/// left waiting ends with the process. A state directory's store is read and answered however
/// long it takes (a loaded machine), as the command itself would be.
fn within_a_second(answer: impl FnOnce() -> Vec<CompletionCandidate> + Send + 'static) -> Vec<CompletionCandidate> {
    let flag = option_value(&words(), "--store");
    if !matches!(crate::store::url::configured(flag.as_deref()), Ok(crate::store::url::StoreUrl::Postgres { .. })) {
        return answer();
    }
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(answer());
    });
    rx.recv_timeout(std::time::Duration::from_secs(1)).unwrap_or_default()
}

/// `resume RUN_ID`: run ids.
pub(crate) fn run_ids(current: &OsStr) -> Vec<CompletionCandidate> {
    let current = current.to_string_lossy().into_owned();
    within_a_second(move || {
        let words = words();
        store(&words).map(|s| run_candidates(s.as_ref(), &current)).unwrap_or_default()
    })
}

/// `status RUN`, `logs RUN`: run ids, then flow files.
pub(crate) fn runs_and_files(current: &OsStr) -> Vec<CompletionCandidate> {
    let mut out = run_ids(current);
    out.extend(PathCompleter::file().complete(current));
    out
}

/// `logs RUN STEP`: the steps of the run the command line names (a run id, or a flow's newest
/// run), in flow order, each with its state as help.
pub(crate) fn steps(current: &OsStr) -> Vec<CompletionCandidate> {
    let current = current.to_os_string();
    within_a_second(move || steps_of(&current))
}

fn steps_of(current: &OsStr) -> Vec<CompletionCandidate> {
    let words = words();
    let Some(at) = words.iter().position(|w| w == "logs") else { return Vec::new() };
    // The first word after `logs` that is neither an option nor an option's value: RUN.
    let mut rest = words[at + 1..].iter();
    let mut target = None;
    while let Some(w) = rest.next() {
        if VALUED.contains(&w.as_str()) {
            rest.next();
        } else if !w.starts_with('-') {
            target = Some(w.clone());
            break;
        }
    }
    let (Some(target), Some((state, store))) = (target, store_in(&words)) else { return Vec::new() };
    let Ok(run) = inspect::find_run(store.as_ref(), &state, Some(&target)) else { return Vec::new() };
    let Ok(steps) = store.steps(&run.id) else { return Vec::new() };
    let current = current.to_string_lossy();
    steps
        .into_iter()
        .filter(|s| s.name.starts_with(&*current))
        .map(|s| {
            let help = s.state.status().as_str().to_owned();
            CompletionCandidate::new(s.name).help(Some(help.into()))
        })
        .collect()
}
