//! Each attempt records the host it ran on (schema 3), and a database written before that
//! (schema 2) is read as it is and migrated by the next runner, its old attempts without a host.

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

/// Each attempt's `(step, attempt, host)`, oldest first.
fn attempt_hosts(env: &Env) -> Vec<(String, u32, Option<String>)> {
    let db = db(env);
    let mut stmt = db.prepare("SELECT step, attempt, host FROM attempts ORDER BY row").unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).unwrap().map(Result::unwrap).collect()
}

fn this_host() -> String {
    nix::unistd::gethostname().unwrap().into_string().unwrap()
}

#[test]
fn every_attempt_records_the_host_it_ran_on() {
    let env = Env::new();
    // `a` fails once and is retried: both attempts record the host.
    env.write(
        "flow.toml",
        "[[step]]\nname = 'a'\nshell = 'echo x >> a.log; [ $(wc -l < a.log) -ge 2 ]'\nretry = { attempts = 2, backoff_seconds = 0 }\n\
         [[step]]\nname = 'b'\nrun = ['true']\n",
    );
    env.cmd(&["run", "flow.toml"]).assert().success();
    let host = this_host();
    assert_eq!(
        attempt_hosts(&env),
        vec![
            ("a".into(), 1, Some(host.clone())),
            ("a".into(), 2, Some(host.clone())),
            ("b".into(), 1, Some(host.clone()))
        ]
    );
    let status = json(&env, &["status", "--json"]);
    assert_eq!(status["steps"][0]["host"], host.as_str());
    assert_eq!(status["steps"][1]["host"], host.as_str());
    assert_eq!(user_version(&env), SCHEMA);
}

#[test]
fn a_schema_2_database_is_read_as_it_is_and_migrated_by_the_next_runner() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "[[step]]\nname = 'a'\nshell = 'echo x >> a.log'\n\
         [[step]]\nname = 'b'\nshell = 'echo x >> b.log; [ -e go ] || { touch ready; sleep 300; }'\n",
    );
    // The runner dies during `b`: `a` succeeded, `b`'s attempt is in flight.
    let runner = env.spawn(&["run", "flow.toml"]);
    wait_until("step b to start", || env.path("ready").exists());
    kill(runner.id(), "KILL");
    finish(runner);
    // Back to schema 2, as the binary before attempt hosts wrote it (nor leases, from schema 4, nor
    // step outputs, from schema 5, nor the lease index, from schema 8, nor the definitions table, from schema 9).
    db(&env)
        .execute_batch(&format!(
            "{UNDO_SCHEMA_9} DROP INDEX runs_lease; ALTER TABLE attempts DROP COLUMN kind; ALTER TABLE steps DROP COLUMN outputs; \
             ALTER TABLE runs DROP COLUMN lease_owner; ALTER TABLE runs DROP COLUMN lease_token; \
             ALTER TABLE attempts DROP COLUMN host; PRAGMA user_version = 2;",
        ))
        .unwrap();

    // Looking does not migrate (it writes nothing): the attempts have no host.
    let status = json(&env, &["status", "--json"]);
    assert_eq!((status["steps"][0]["host"].clone(), status["steps"][1]["host"].clone()), (Value::Null, Value::Null));
    assert_eq!(user_version(&env), 2);

    // A runner migrates and resumes: the old attempts keep no host, the redelivered one has one.
    std::fs::write(env.path("go"), "").unwrap();
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("resuming run"), "{}", stderr(&out));
    assert_eq!(user_version(&env), SCHEMA);
    let host = this_host();
    assert_eq!(
        attempt_hosts(&env),
        vec![("a".into(), 1, None), ("b".into(), 1, None), ("b".into(), 1, Some(host.clone()))]
    );
    let status = json(&env, &["status", "--json"]);
    assert_eq!(status["status"], "succeeded");
    assert_eq!((status["steps"][0]["host"].clone(), status["steps"][1]["host"].as_str()), (Value::Null, Some(&*host)));
    assert_eq!((env.count("a.log"), env.count("b.log")), (1, 2));
    // Whether an attempt needed SIGKILL after its grace is not known of those recorded before
    // schema 9 (null), and known (false) of the one made since.
    let status = json(&env, &["status", "--attempts", "--json"]);
    let killed = |step: usize, i: usize| status["steps"][step]["attempts"][i]["killed_after_grace"].clone();
    assert_eq!((killed(0, 0), killed(1, 0), killed(1, 1)), (Value::Null, Value::Null, Value::Bool(false)));
}
