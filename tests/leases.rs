//! Owning a run is a lease with a fencing token (schema 4): a runner whose run another runner
//! claimed stops without recording anything, and runs recorded before leases resume.

mod common;

use common::{Env, SCHEMA, UNDO_SCHEMA_9, finish, kill, stderr, wait_until};
use serde_json::Value;

fn json(env: &Env, args: &[&str]) -> Value {
    let out = env.cmd(args).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn db(env: &Env) -> rusqlite::Connection {
    rusqlite::Connection::open(env.state().join("waymark.db")).unwrap()
}

fn user_version(env: &Env) -> i64 {
    db(env).query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap()
}

/// The run's recorded `(lease_owner, lease_token)`.
fn lease(env: &Env, run_id: &str) -> (Option<String>, i64) {
    db(env)
        .query_row("SELECT lease_owner, lease_token FROM runs WHERE id = ?1", [run_id], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
}

/// Each attempt's `(step, attempt, outcome)`, oldest first.
fn attempts(env: &Env) -> Vec<(String, u32, String)> {
    let db = db(env);
    let mut stmt = db.prepare("SELECT step, attempt, outcome FROM attempts ORDER BY row").unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).unwrap().map(Result::unwrap).collect()
}

fn this_host() -> String {
    nix::unistd::gethostname().unwrap().into_string().unwrap()
}

/// Step `a` waits (`ready` says so) until `go` exists; `b` counts its runs.
const FLOW: &str = "name = 'taken'\n\
    [[step]]\nname = 'a'\nshell = 'echo x >> a.log; [ -e go ] || { touch ready; sleep 300; }'\n\
    [[step]]\nname = 'b'\nshell = 'echo x >> b.log'\n";

#[test]
fn a_runner_whose_run_another_runner_took_over_stops_and_records_nothing() {
    let env = Env::new();
    env.write("flow.toml", FLOW);
    let first = env.spawn(&["run", "flow.toml"]);
    wait_until("step a to start", || env.path("ready").exists());
    let run_id = json(&env, &["history", "--json"])[0]["id"].as_str().unwrap().to_owned();
    let (first_owner, first_token) = lease(&env, &run_id);
    let first_owner = first_owner.unwrap();
    assert_eq!(first_token, 1);
    assert!(first_owner.starts_with(&format!("{}:{}:", this_host(), first.id())), "{first_owner}");

    // The lock file deleted under a live runner: a second runner takes a lock of its own, claims
    // the run (it looks like its runner died) and kills the first runner's attempt to redeliver it.
    std::fs::remove_file(env.state().join("locks/taken.lock")).unwrap();
    std::fs::write(env.path("go"), "").unwrap();
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains(&format!("resuming run {run_id}")), "{}", stderr(&out));
    let (second_owner, second_token) = lease(&env, &run_id);
    assert_eq!(second_token, 2);
    assert_ne!(second_owner.as_deref(), Some(first_owner.as_str()));

    // The first runner's write of its attempt's end is refused: it stops with exit 4 and says why.
    let out = finish(first);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains(&format!(
            "run {run_id} in {} was taken over by another runner ({}) while this runner ({first_owner}) was \
             running it; this runner stops: its attempts are killed and their outcomes are not recorded",
            env.state().join("waymark.db").display(),
            second_owner.unwrap()
        )),
        "{err}"
    );
    assert!(err.contains("do not delete the lock files"), "{err}");
    assert!(!err.contains("`waymark run` resumes it"), "not this runner's run to resume: {err}");

    // Nothing of the first runner's was recorded after the takeover: its attempt stays lost with
    // it, `b` ran once (under the second runner), and the run succeeded.
    assert_eq!(
        attempts(&env),
        vec![
            ("a".into(), 1, "runner_lost".into()),
            ("a".into(), 1, "succeeded".into()),
            ("b".into(), 1, "succeeded".into())
        ]
    );
    assert_eq!((env.count("a.log"), env.count("b.log")), (2, 1));
    assert_eq!(json(&env, &["status", "--json"])["status"], "succeeded");
}

#[test]
fn a_schema_3_database_is_read_as_it_is_and_its_runs_resume_under_a_lease() {
    let env = Env::new();
    env.write("flow.toml", FLOW);
    // The runner dies during `a`.
    let runner = env.spawn(&["run", "flow.toml"]);
    wait_until("step a to start", || env.path("ready").exists());
    kill(runner.id(), "KILL");
    finish(runner);
    // Back to schema 3, as the binary before leases (and step outputs, from schema 5, the lease index, from schema 8, and the definitions table, from schema 9) wrote it.
    db(&env)
        .execute_batch(&format!(
            "{UNDO_SCHEMA_9} DROP INDEX runs_lease; ALTER TABLE attempts DROP COLUMN kind; ALTER TABLE steps DROP COLUMN outputs; \
             ALTER TABLE runs DROP COLUMN lease_owner; ALTER TABLE runs DROP COLUMN lease_token; \
             PRAGMA user_version = 3;",
        ))
        .unwrap();

    // Looking does not migrate (it writes nothing).
    let status = json(&env, &["status", "--json"]);
    assert_eq!(status["status"], "running");
    let run_id = status["id"].as_str().unwrap().to_owned();
    assert_eq!(user_version(&env), 3);

    // A runner migrates and resumes: the run's first lease is the claim's.
    std::fs::write(env.path("go"), "").unwrap();
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains(&format!("resuming run {run_id}")), "{}", stderr(&out));
    assert_eq!(user_version(&env), SCHEMA);
    let (owner, token) = lease(&env, &run_id);
    assert_eq!(token, 1);
    assert!(owner.unwrap().starts_with(&format!("{}:", this_host())));
    assert_eq!(json(&env, &["status", "--json"])["status"], "succeeded");
    assert_eq!((env.count("a.log"), env.count("b.log")), (2, 1));
}

/// Abandoning a run (`--fresh`, or `resume_within`) takes it from its owner as a claim does: when
/// the lock did not keep the first runner out, its next write is refused, so it runs nothing more
/// of the abandoned run beside the new one.
#[test]
fn a_runner_whose_run_another_runner_abandoned_stops_and_runs_nothing_more() {
    let env = Env::new();
    // `a` is retried after its kill (2 s later, so the retry comes after the abandon).
    let flow = FLOW.replace(
        "sleep 300; }'\n",
        "sleep 300; }'\nretry = { attempts = 3, exception_types = ['BaseException'], backoff_seconds = 2 }\n",
    );
    env.write("flow.toml", &flow);
    let first = env.spawn(&["run", "flow.toml"]);
    wait_until("step a to start", || env.path("ready").exists());
    let old = json(&env, &["history", "--json"])[0]["id"].as_str().unwrap().to_owned();

    // The lock file deleted under a live runner: a second runner starts afresh, killing the first
    // runner's attempt and abandoning its run.
    std::fs::remove_file(env.state().join("locks/taken.lock")).unwrap();
    std::fs::write(env.path("go"), "").unwrap();
    let out = env.cmd(&["run", "--fresh", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains(&format!("abandoned unfinished run {old}")), "{}", stderr(&out));

    let out = finish(first);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains(&format!("run {old} in ")) && err.contains("was taken over by another runner"), "{err}");
    // `a` ran once in each run, `b` only in the new one; the abandoned run got no other attempt.
    assert_eq!((env.count("a.log"), env.count("b.log")), (2, 1));
    let old_attempts =
        db(&env).query_row("SELECT count(*) FROM attempts WHERE run_id = ?1", [&old], |r| r.get::<_, i64>(0)).unwrap();
    assert_eq!(old_attempts, 1);
    let history = json(&env, &["history", "--json"]);
    let status = |id: &str| history.as_array().unwrap().iter().find(|r| r["id"] == id).unwrap()["status"].clone();
    assert_eq!(status(&old), "abandoned");
}
