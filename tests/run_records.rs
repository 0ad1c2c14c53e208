//! What a run records: the versioned run definition (a record written by an earlier version
//! resumes under this one; a newer one is refused) and the states of its steps (an unknown one is
//! corruption, never a default; steps are matched by name).

mod common;

use common::Env;
use std::os::unix::process::ExitStatusExt;

const FLOW: &str = "name = 'nightly'\n[[step]]\nname = 'fetch'\nshell = 'echo toml >> fetch.log'\n\
                    [[step]]\nname = 'report'\nshell = 'echo toml >> report.log'\n";

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A run of [`FLOW`] whose runner died right after `fetch` succeeded; its id.
fn interrupted_run(env: &Env) -> String {
    env.write("flow.toml", FLOW);
    let out = env.cmd(&["run", "flow.toml"]).env("WAYMARK_TEST_CRASH_AFTER", "fetch").output().unwrap();
    assert_eq!(out.status.signal(), Some(9), "{}", stderr(&out));
    assert_eq!((env.count("fetch.log"), env.count("report.log")), (1, 0));
    db(env).query_row("SELECT id FROM runs", [], |r| r.get(0)).unwrap()
}

fn db(env: &Env) -> rusqlite::Connection {
    rusqlite::Connection::open(env.state().join("waymark.db")).unwrap()
}

/// The version 1 fixture, its paths moved into the test's directory.
fn fixture_v1(env: &Env) -> serde_json::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/records/run-definition-v1.json");
    let mut record: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    record["path"] = env.path("flow.toml").display().to_string().into();
    for step in record["steps"].as_array_mut().unwrap() {
        step["workdir"] = env.dir.path().display().to_string().into();
    }
    record
}

fn record_definition(env: &Env, id: &str, definition: &serde_json::Value) {
    let changed = db(env)
        .execute("UPDATE definitions SET definition = ?1 WHERE run_id = ?2", [definition.to_string(), id.to_owned()])
        .unwrap();
    assert_eq!(changed, 1);
}

#[test]
fn a_run_recorded_by_version_1_resumes_under_this_binary() {
    if !common::have_crash_hook("a_run_recorded_by_version_1_resumes_under_this_binary") {
        return;
    }
    let env = Env::new();
    let id = interrupted_run(&env);
    record_definition(&env, &id, &fixture_v1(&env));
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains(&format!("resuming run {id} of nightly: 1 of 2 steps done")), "{}", stderr(&out));
    // The recorded definition ran, with its flow and step environments, not the file's.
    assert_eq!(env.read("report.log"), "report fixture from the recorded definition\n");
    assert_eq!(env.count("fetch.log"), 1, "a succeeded step never runs again");
}

#[test]
fn a_run_recorded_by_a_newer_waymark_is_refused_with_exit_4() {
    if !common::have_crash_hook("a_run_recorded_by_a_newer_waymark_is_refused_with_exit_4") {
        return;
    }
    let env = Env::new();
    let id = interrupted_run(&env);
    let mut newer = fixture_v1(&env);
    newer["version"] = 5.into();
    record_definition(&env, &id, &newer);
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    let db_path = env.state().canonicalize().unwrap().join("waymark.db");
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        format!(
            "error: run {id} in {}: its definition was recorded by a newer waymark (run record version 5; this \
             one reads up to 4); resume it with that waymark, or start the flow anew with `waymark run --fresh FLOW`\n",
            db_path.display()
        )
    );
    assert_eq!(env.count("report.log"), 0, "nothing ran");
    // `--fresh` is the way out named: the newer run is abandoned, a new one runs.
    env.cmd(&["run", "--fresh", "flow.toml"]).assert().success();
    assert_eq!((env.count("fetch.log"), env.count("report.log")), (2, 1));
}

#[test]
fn an_unknown_step_state_is_a_corrupt_or_newer_state_not_a_default() {
    if !common::have_crash_hook("an_unknown_step_state_is_a_corrupt_or_newer_state_not_a_default") {
        return;
    }
    let env = Env::new();
    let id = interrupted_run(&env);
    // `fetch`'s row (`report` has none yet: a step's row is written when it first moves).
    assert_eq!(db(&env).execute("UPDATE steps SET state = 'paused' WHERE name = 'fetch'", []).unwrap(), 1);
    let db_path = env.state().canonicalize().unwrap().join("waymark.db");
    let expected = format!(
        "error: state database {} holds a corrupt or newer state: steps of run {id}: step `fetch`: unknown step \
         state `paused`; if a newer waymark wrote it, use that one; otherwise `waymark run --fresh FLOW` starts \
         the flow anew (or move the database aside)\n",
        db_path.display()
    );
    let out = env.cmd(&["status", "nightly"]).output().unwrap();
    assert_eq!((out.status.code(), stderr(&out)), (Some(4), expected.clone()));
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(stderr(&out).ends_with(&expected), "{}", stderr(&out));
    assert_eq!(
        (env.count("fetch.log"), env.count("report.log")),
        (1, 0),
        "a step in a state waymark does not know is not run as pending, nor the steps after it"
    );
}

#[test]
fn an_unknown_run_status_is_a_corrupt_or_newer_state() {
    if !common::have_crash_hook("an_unknown_run_status_is_a_corrupt_or_newer_state") {
        return;
    }
    let env = Env::new();
    let id = interrupted_run(&env);
    db(&env).execute("UPDATE runs SET status = 'paused'", []).unwrap();
    let out = env.cmd(&["history"]).output().unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("holds a corrupt or newer state: runs of run {id}: unknown run state `paused`")),
        "{}",
        stderr(&out)
    );
}

#[test]
fn recorded_steps_are_matched_to_the_definition_by_name_not_position() {
    if !common::have_crash_hook("recorded_steps_are_matched_to_the_definition_by_name_not_position") {
        return;
    }
    let env = Env::new();
    let id = interrupted_run(&env);
    // The rows of the steps in the other order: fetch (succeeded) second, report (pending) first.
    db(&env).execute_batch(&format!("UPDATE steps SET position = 1 - position WHERE run_id = '{id}';")).unwrap();
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!((env.count("fetch.log"), env.count("report.log")), (1, 1));
}

#[test]
fn a_recorded_step_missing_from_the_definition_stops_the_run() {
    if !common::have_crash_hook("a_recorded_step_missing_from_the_definition_stops_the_run") {
        return;
    }
    let env = Env::new();
    let id = interrupted_run(&env);
    // `fetch`'s row renamed: `fetch` has attempts, and so cannot be read as a step that never moved
    // (which is what a step without a row is).
    assert_eq!(db(&env).execute("UPDATE steps SET name = 'publish' WHERE name = 'fetch'", []).unwrap(), 1);
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!(
            "error: run {id} in {}: step `fetch` of its definition has no recorded state; the database was \
             changed behind waymark's back: `waymark run --fresh` starts the flow anew",
            env.state().canonicalize().unwrap().join("waymark.db").display()
        )),
        "{}",
        stderr(&out)
    );
    assert_eq!(env.count("report.log"), 0);
}

#[test]
fn a_flow_whose_path_is_not_utf8_is_refused_before_anything_is_recorded() {
    use std::os::unix::ffi::OsStrExt;
    let env = Env::new();
    // A run records its flow's path (and its steps' working directories, inside it) as text.
    let dir = env.dir.path().join(std::ffi::OsStr::from_bytes(b"caf\xe9"));
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("flow.toml"), FLOW).unwrap();
    let out = env.cmd(&["run"]).arg(dir.join("flow.toml")).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        format!(
            "error: {}: the flow's path is not valid UTF-8, and a run records it as text; move or rename the flow \
             to a path that is; nothing ran\n",
            dir.canonicalize().unwrap().join("flow.toml").display()
        )
    );
    assert!(!dir.join("fetch.log").exists(), "nothing ran");
    assert!(!env.state().join("waymark.db").exists(), "nothing was recorded");
}
