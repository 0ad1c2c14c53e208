//! Storage faults (issue 7): a full filesystem, a read-only state directory, a corrupt database and
//! a state directory owned by another user each stop waymark with exit 4 and a message saying what
//! to do, run nothing, and leave a store that resumes once the cause is gone: every step then runs
//! exactly once. The tmpfs and ownership cases need root (`common::have_root`).

mod common;

use common::{Env, have_root, on_tmpfs_state, stderr};
use std::os::unix::process::ExitStatusExt;

/// Two steps, each counting its executions.
const FLOW: &str =
    "name = 'f'\n[[step]]\nname = 'a'\nshell = 'echo x >> a.log'\n[[step]]\nname = 'b'\nshell = 'echo x >> b.log'\n";

/// `$WAYMARK ARGS` with its stdout, stderr and exit status saved as NAME.out, NAME.err, NAME.code,
/// and how many times step `b` had run by then as NAME.b.
fn step(name: &str, args: &str) -> String {
    format!(
        "$WAYMARK {args} > {name}.out 2> {name}.err; echo $? > {name}.code; cat b.log 2>/dev/null | wc -l > {name}.b; "
    )
}

/// How many times step `b` had run when the command NAME ended.
fn b_runs(env: &Env, name: &str) -> String {
    env.read(&format!("{name}.b")).trim().to_owned()
}

fn code(env: &Env, name: &str) -> String {
    env.read(&format!("{name}.code")).trim().to_owned()
}

/// The crash point every test starts from: step `a` succeeded, the runner died, `b` is pending.
const CRASHED: &str = "WAYMARK_TEST_CRASH_AFTER=a $WAYMARK run flow.toml 2> crash.err; echo $? > crash.code; ";

/// The tmpfs and ownership cases need root and the debug build's crash hook.
fn can_run(test: &str, why_root: &str) -> bool {
    common::have_crash_hook(test) && have_root(test, why_root)
}

fn assert_resumed_once(env: &Env, name: &str) {
    assert_eq!(code(env, name), "0", "{}", env.read(&format!("{name}.err")));
    assert!(env.read(&format!("{name}.err")).contains("resuming run"), "{}", env.read(&format!("{name}.err")));
    assert_eq!((env.count("a.log"), env.count("b.log")), (1, 1), "every step ran exactly once");
}

#[test]
fn a_full_filesystem_exits_4_runs_nothing_and_resumes_once_space_is_back() {
    if !can_run("a_full_filesystem_exits_4_runs_nothing_and_resumes_once_space_is_back", "mounts a tmpfs") {
        return;
    }
    let env = Env::new();
    env.write("flow.toml", FLOW);
    on_tmpfs_state(
        &env,
        &format!(
            "{CRASHED} dd if=/dev/zero of=state/filler bs=4k 2>/dev/null; {} rm state/filler; {}",
            step("full", "run flow.toml"),
            step("again", "run flow.toml")
        ),
    );
    assert_eq!(code(&env, "crash"), "137", "{}", env.read("crash.err"));
    assert_eq!(code(&env, "full"), "4", "{}", env.read("full.err"));
    let err = env.read("full.err");
    assert!(err.contains("database or disk is full"), "{err}");
    assert!(
        err.contains(&format!("hint: check that {} is writable, that its disk has free space", env.state().display())),
        "{err}"
    );
    assert_eq!(b_runs(&env, "full"), "0", "nothing ran on the full disk");
    assert_resumed_once(&env, "again");
}

#[test]
fn a_read_only_state_directory_can_be_looked_at_and_resumes_once_writable() {
    if !can_run("a_read_only_state_directory_can_be_looked_at_and_resumes_once_writable", "mounts a tmpfs") {
        return;
    }
    let env = Env::new();
    env.write("flow.toml", FLOW);
    on_tmpfs_state(
        &env,
        &format!(
            "{CRASHED} ro; {} {} {} rw; {} ro; {} {} rw",
            step("run_ro", "run flow.toml"),
            step("status_ro", "status f --json"),
            step("history_ro", "history --json"),
            step("again", "run flow.toml"),
            // Closed cleanly this time: no -wal or -shm for a reader to use.
            step("status_clean", "status f"),
            step("history_clean", "history"),
        ),
    );
    assert_eq!(code(&env, "run_ro"), "4", "{}", env.read("run_ro.err"));
    let lock = env.state().join("locks/f.lock");
    assert_eq!(
        env.read("run_ro.err"),
        format!(
            "error: cannot lock {}: Read-only file system (os error 30); the state directory must be writable (fix \
             its permissions, or choose another with --state-dir)\n",
            lock.display()
        )
    );
    // Looking works on the read-only directory and sees the state as the dead runner left it.
    assert_eq!(code(&env, "status_ro"), "0", "{}", env.read("status_ro.err"));
    let status: serde_json::Value = serde_json::from_str(&env.read("status_ro.out")).unwrap();
    assert_eq!((status["status"].as_str(), status["runner_alive"].as_bool()), (Some("running"), Some(false)));
    assert_eq!(status["steps"][0]["state"], "succeeded");
    assert_eq!(status["steps"][1]["state"], "pending");
    assert_eq!(code(&env, "history_ro"), "0", "{}", env.read("history_ro.err"));
    let history: serde_json::Value = serde_json::from_str(&env.read("history_ro.out")).unwrap();
    assert_eq!(history.as_array().unwrap().len(), 1);
    assert_eq!(b_runs(&env, "history_ro"), "0", "nothing ran on the read-only state");
    assert_resumed_once(&env, "again");
    for name in ["status_clean", "history_clean"] {
        assert_eq!((code(&env, name), env.read(&format!("{name}.err"))), ("0".to_owned(), String::new()), "{name}");
        assert!(env.read(&format!("{name}.out")).contains("succeeded"), "{}", env.read(&format!("{name}.out")));
    }
}

#[test]
fn a_corrupt_database_exits_4_naming_the_file_and_a_fresh_one_works() {
    let env = Env::new();
    env.write("flow.toml", FLOW);
    env.write("state/waymark.db", &"garbage ".repeat(1000));
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(env.state(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let db = env.state().join("waymark.db");
    let expected = format!(
        "error: state database {}: the file is not a waymark database (or is corrupt); move it aside to start afresh\n",
        db.display()
    );
    for args in
        [&["run", "flow.toml"][..], &["status"], &["history"], &["resume", "abcdefgh"], &["gc", "--older-than", "1d"]]
    {
        let out = env.cmd(args).output().unwrap();
        assert_eq!((out.status.code(), stderr(&out)), (Some(4), expected.clone()), "{args:?}");
    }
    assert_eq!(env.count("a.log"), 0, "nothing ran");
    assert_eq!(std::fs::read_to_string(&db).unwrap(), "garbage ".repeat(1000), "the file was left as it was");
    std::fs::rename(&db, env.path("waymark.db.broken")).unwrap();
    env.cmd(&["run", "flow.toml"]).assert().success();
    assert_eq!((env.count("a.log"), env.count("b.log")), (1, 1));
}

/// A test directory whose state holds one finished run of [`FLOW`], and the path of its database.
fn a_finished_run() -> (Env, std::path::PathBuf) {
    let env = Env::new();
    env.write("flow.toml", FLOW);
    env.cmd(&["run", "flow.toml"]).assert().success();
    let db = env.state().join("waymark.db");
    (env, db)
}

/// A database rebuilt from sqlite3's `.dump` has waymark's tables but no `user_version` (the dump
/// does not carry it): every command refuses it with exit 4, saying how to set the version back,
/// instead of a looking command seeing no runs and a runner failing to create tables that exist.
/// Set back as told, the runs are there again.
#[test]
fn a_database_without_its_schema_version_exits_4_saying_how_to_set_it_back() {
    let (env, db) = a_finished_run();
    let set_version = |v: i64| {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.pragma_update(None, "user_version", v).unwrap();
    };
    set_version(0);
    let expected = format!(
        "error: state database {0} holds tables but no schema version (its `PRAGMA user_version` is 0), so waymark \
         cannot tell what they hold and neither reads nor writes it; a copy made with sqlite3's `.dump` loses the \
         version: if it is a copy of a database this waymark last wrote (schema {1}), set the version back with \
         `sqlite3 {0} 'PRAGMA user_version = {1}'` (a copy of one an older waymark wrote needs that waymark's \
         version, or it is read wrong), otherwise move it aside to start afresh\n",
        db.display(),
        common::SCHEMA
    );
    for args in [&["run", "flow.toml"][..], &["status"], &["history"], &["gc", "--older-than", "1d"]] {
        let out = env.cmd(args).output().unwrap();
        assert_eq!((out.status.code(), stderr(&out)), (Some(4), expected.clone()), "{args:?}");
    }
    assert_eq!((env.count("a.log"), env.count("b.log")), (1, 1), "nothing ran again");
    set_version(common::SCHEMA);
    let history = env.cmd(&["history", "--json"]).output().unwrap();
    let history: serde_json::Value = serde_json::from_slice(&history.stdout).unwrap();
    assert_eq!(history.as_array().map(Vec::len), Some(1), "the run is there again");
}

/// Values no waymark writes, put in by hand or by damage, never make a command panic: a time past
/// year 9999 (or before 1970) is shown at the end of what a timestamp can print, and a count
/// that cannot be one is a corrupt database (exit 4), not a bare SQLite message with a hint about
/// free space.
#[test]
fn a_damaged_value_in_the_database_is_shown_or_refused_never_a_panic() {
    let (env, db) = a_finished_run();
    let edit = |sql: &str| rusqlite::Connection::open(&db).unwrap().execute_batch(sql).unwrap();
    for (started, shown) in
        [(253_402_300_800_000_i64, "9999-12-31T23:59:59.999Z"), (i64::MIN, "1970-01-01T00:00:00.000Z")]
    {
        edit(&format!("UPDATE runs SET started_at = {started}"));
        for args in [&["history"][..], &["history", "--json"], &["status"], &["status", "--json"]] {
            let out = env.cmd(args).output().unwrap();
            assert_eq!((out.status.code(), stderr(&out)), (Some(0), String::new()), "{args:?} with {started}");
            assert!(String::from_utf8_lossy(&out.stdout).contains(shown), "{args:?} with {started}");
        }
    }
    edit("UPDATE steps SET attempts_used = -3");
    let out = env.cmd(&["status"]).output().unwrap();
    assert_eq!(
        (out.status.code(), stderr(&out)),
        (
            Some(4),
            format!(
                "error: state database {}: the file is not a waymark database (or is corrupt); move it aside to start \
                 afresh\n",
                db.display()
            )
        )
    );
}

#[test]
fn a_state_directory_owned_by_another_user_exits_4_and_resumes_once_it_is_ours() {
    if !can_run("a_state_directory_owned_by_another_user_exits_4_and_resumes_once_it_is_ours", "chown to another user")
    {
        return;
    }
    let env = Env::new();
    env.write("flow.toml", FLOW);
    let out = env.cmd(&["run", "flow.toml"]).env("WAYMARK_TEST_CRASH_AFTER", "a").output().unwrap();
    assert_eq!(out.status.signal(), Some(9), "{}", stderr(&out));
    std::os::unix::fs::chown(env.state(), Some(65534), None).unwrap();
    for args in [&["run", "flow.toml"][..], &["status"], &["gc", "--older-than", "0s"]] {
        let out = env.cmd(args).output().unwrap();
        assert_eq!(out.status.code(), Some(4), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).starts_with(&format!(
                "error: refusing to use the state directory {}: its owner is ",
                env.state().display()
            )),
            "{}",
            stderr(&out)
        );
    }
    assert_eq!(env.count("b.log"), 0, "nothing ran");
    std::os::unix::fs::chown(env.state(), Some(0), None).unwrap();
    env.cmd(&["run", "flow.toml"]).assert().success().stderr(predicates::str::contains("resuming run"));
    assert_eq!((env.count("a.log"), env.count("b.log")), (1, 1), "every step ran exactly once");
}

/// A state directory deleted while a runner uses it takes the database with it: the runner's next
/// write would go to a file nobody will read, and the flow's lock no longer keeps a second runner
/// out. The runner stops at that write with exit 4, saying so, kills the attempt still running
/// beside it and starts no further step.
#[test]
fn a_state_directory_deleted_under_a_runner_stops_it_with_exit_4() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'f'\n[[step]]\nname = 'a'\nneeds = []\nshell = 'touch a.started; while [ ! -e go ]; do sleep 0.05; done'\n\
         [[step]]\nname = 'b'\nneeds = []\nshell = 'echo $$ > b.pid; exec sleep 300'\n\
         [[step]]\nname = 'c'\nneeds = ['a']\nshell = 'touch c.ran'\n",
    );
    let child = env.spawn(&["run", "--quiet", "flow.toml"]);
    common::wait_until("step a to start and b to run", || env.path("a.started").exists() && env.count("b.pid") == 1);
    let b = common::read_pid(&env.path("b.pid"));
    std::fs::remove_dir_all(env.state()).unwrap();
    std::fs::write(env.path("go"), "").unwrap();
    let out = common::finish(child);
    let dir = env.dir.path().canonicalize().unwrap();
    let db = format!("{}/state/waymark.db", dir.display());
    assert_eq!(
        (out.status.code(), stderr(&out).replace(&db, "DB").replace(dir.to_str().unwrap(), "DIR")),
        (
            Some(4),
            "error: state database DB was deleted or moved while waymark was using it (its state directory \
             removed?): nothing written to it reaches a later runner, and the flow's lock no longer keeps a second \
             runner out; waymark stops here (a runner kills its attempts first)\n\
             hint: do not delete or move a state directory while a runner uses it; the next `waymark run` starts \
             the flow anew in DIR/state (what was recorded went with the file)\n"
                .to_owned()
        )
    );
    assert!(!common::alive(b), "the attempt running beside is killed");
    assert!(!env.path("c.ran").exists(), "no step starts after the database is gone");
    // Nor is any of the state directory made again (a log directory of a run no database has).
    assert!(!env.state().exists(), "{:?}", walkdir(&env.state()));
}

/// The files under `dir`, for a message.
fn walkdir(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            todo.push(entry.path());
            found.push(entry.path());
        }
    }
    found
}

/// The database's write-ahead log deleted while a runner uses it (a clean-up of `*-wal` files):
/// it holds every write since the last checkpoint, all of them in a new state directory, and the
/// next runner would have found none of them and run the finished steps again. The runner copies
/// what the log held into the database (SQLite still reads the deleted file), stops with exit 4
/// saying so, and the next `waymark run` resumes the run: no step that succeeded runs again.
#[test]
fn a_write_ahead_log_deleted_under_a_runner_is_saved_and_the_run_resumes() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'f'\n[[step]]\nname = 'a'\nshell = 'echo x >> a.log'\n\
         [[step]]\nname = 'b'\nshell = 'echo x >> b.log; touch b.started; while [ ! -e go ]; do sleep 0.05; done'\n",
    );
    let child = env.spawn(&["run", "--quiet", "flow.toml"]);
    // Once b's pid is recorded (read with a connection of the test's own, closed at once): the
    // next write is b's end.
    common::wait_until("step b's pid to be recorded", || {
        let Ok(db) = rusqlite::Connection::open_with_flags(
            env.state().join("waymark.db"),
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        ) else {
            return false;
        };
        let pid: Option<i64> =
            db.query_row("SELECT pid FROM attempts WHERE step = 'b'", [], |r| r.get(0)).unwrap_or(None);
        pid.is_some()
    });
    std::fs::remove_file(env.state().join("waymark.db-wal")).unwrap();
    std::fs::write(env.path("go"), "").unwrap();
    let out = common::finish(child);
    let db = env.state().join("waymark.db");
    let db = db.display();
    assert_eq!(
        (out.status.code(), stderr(&out)),
        (
            Some(4),
            format!(
                "error: state database {db}: its write-ahead log {db}-wal was deleted or replaced while waymark was \
                 using it; what was recorded is saved in the database (copied from the deleted log through the \
                 descriptor SQLite still had), so nothing is lost; waymark stops here (a runner kills its attempts \
                 first)\n\
                 hint: do not delete or replace the files of a state directory while a runner uses it; the next \
                 `waymark run` resumes the run from what was saved\n"
            )
        )
    );
    // Both succeeded, b's success the write that found the log gone: saved with the rest, the
    // resume runs neither again, and ends the one run.
    env.cmd(&["run", "--quiet", "flow.toml"]).assert().success();
    assert_eq!((env.count("a.log"), env.count("b.log")), (1, 1), "no step ran twice");
    let out = env.cmd(&["history", "--json"]).output().unwrap();
    let runs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((runs.as_array().map(Vec::len), runs[0]["status"].as_str()), (Some(1), Some("succeeded")));
}
