//! Issue 11: a failed attempt whose retry is due at once (no backoff) commits its outcome in the
//! same transaction as the retry's start, and a success commits with the start of the step that
//! waited for it, so an attempt costs two commits of the state database (its start with the
//! outcome before it, and its pid), not three. Counted from the database's write-ahead log,
//! whatever the code path; and a SIGKILL right after that one commit resumes with the started
//! attempt redelivered, nothing lost and nothing run twice.

mod common;

use common::{Env, stderr};
use std::os::unix::process::ExitStatusExt;

/// The commits in a SQLite write-ahead log: frames of the current generation (their salts are the
/// header's) whose "database size after commit" field is set, which only a commit's last frame has.
fn wal_commits(wal: &std::path::Path) -> usize {
    let bytes = std::fs::read(wal).unwrap();
    let be = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    assert!(bytes.len() >= 32 && (be(0) & !1) == 0x377f_0682, "{} is not a write-ahead log", wal.display());
    let (page, salts) = (be(8) as usize, (be(16), be(20)));
    let mut commits = 0;
    let mut at = 32;
    while at + 24 + page <= bytes.len() && (be(at + 8), be(at + 12)) == salts {
        commits += usize::from(be(at + 4) != 0);
        at += 24 + page;
    }
    commits
}

/// An attempt's row as the tests compare it: step, attempt, outcome, redelivered, pid recorded.
type Row = (String, u32, String, bool, bool);

fn row(step: &str, attempt: u32, outcome: &str, redelivered: bool, pid: bool) -> Row {
    (step.to_owned(), attempt, outcome.to_owned(), redelivered, pid)
}

/// The attempts recorded in the state database, in the order they were.
fn attempts(db: &rusqlite::Connection) -> Vec<Row> {
    let mut stmt =
        db.prepare("SELECT step, attempt, outcome, redelivered, pid IS NOT NULL FROM attempts ORDER BY row").unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// The commits a run of `flow` makes, in a state directory of its own, and its exit code.
fn commits_of_a_run(flow: &str) -> (usize, Option<i32>) {
    let env = Env::new();
    env.write("flow.toml", flow);
    let out = env.cmd(&["run", "--quiet", "flow.toml"]).output().unwrap();
    (wal_commits(&env.state().join("waymark.db-wal")), out.status.code())
}

/// The commits a run of a step that fails `attempts` times (each retried at once) makes.
fn commits_of_failures(attempts: u32) -> usize {
    let flow = format!("name = 'fails'\n[[step]]\nname = 'a'\nrun = ['false']\nretry = {{ attempts = {attempts} }}\n");
    let (commits, code) = commits_of_a_run(&flow);
    assert_eq!(code, Some(1));
    commits
}

/// The commits a run of `steps` steps that succeed, one after the other, makes.
fn commits_of_successes(steps: u32) -> usize {
    let flow: String = (0..steps).map(|i| format!("[[step]]\nname = 's{i}'\nrun = ['true']\n")).collect();
    let (commits, code) = commits_of_a_run(&format!("name = 'succeeds'\n{flow}"));
    assert_eq!(code, Some(0));
    commits
}

#[test]
fn an_attempt_retried_at_once_costs_two_commits() {
    // The run's own commits (schema, run, its end) are the same for both: the difference is the
    // attempts'. Few enough that no checkpoint restarts the log in between.
    let (few, many) = (commits_of_failures(5), commits_of_failures(25));
    assert_eq!(many - few, 2 * 20, "commits: {few} for 5 attempts, {many} for 25");
}

#[test]
fn a_step_started_after_a_success_costs_two_commits() {
    let (few, many) = (commits_of_successes(5), commits_of_successes(25));
    assert_eq!(many - few, 2 * 20, "commits: {few} for 5 steps, {many} for 25");
}

#[test]
fn a_runner_killed_right_after_committing_an_outcome_with_its_retry_s_start_resumes_it_once() {
    if !common::have_crash_hook(
        "a_runner_killed_right_after_committing_an_outcome_with_its_retry_s_start_resumes_it_once",
    ) {
        return;
    }
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'retried'\n[[step]]\nname = 'a'\nshell = 'echo $WAYMARK_ATTEMPT >> a.log; [ $WAYMARK_ATTEMPT -ge 2 ]'\n\
         retry = { attempts = 3 }\n[[step]]\nname = 'b'\nshell = 'echo x >> b.log'\n",
    );
    // SIGKILL right after attempt 1's failure and attempt 2's start are committed (one
    // transaction), before attempt 2's child is spawned.
    let out = env.cmd(&["run", "flow.toml"]).env("WAYMARK_TEST_CRASH_AT_START", "a").output().unwrap();
    assert_eq!(out.status.signal(), Some(9), "{}", stderr(&out));
    assert_eq!(env.read("a.log"), "1\n", "attempt 2 was not spawned");
    let db = rusqlite::Connection::open(env.state().join("waymark.db")).unwrap();
    // Both halves are there: attempt 1's outcome, and attempt 2 in flight without a pid.
    assert_eq!(attempts(&db), [row("a", 1, "failed", false, true), row("a", 2, "running", false, false)]);
    let (state, used): (String, u32) = db
        .query_row("SELECT state, attempts_used FROM steps WHERE name = 'a'", [], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap();
    assert_eq!((state.as_str(), used), ("running", 1));

    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("resuming run"), "{said}");
    assert!(said.contains("a: attempt 2/3 started (pid "), "{said}");
    assert!(said.contains(", redelivered)"), "the resumed attempt is recognised as redelivered: {said}");
    // Attempt 1 ran once, attempt 2 once (under the second runner), b once.
    assert_eq!((env.read("a.log").as_str(), env.count("b.log")), ("1\n2\n", 1));
    assert_eq!(
        attempts(&db),
        [
            row("a", 1, "failed", false, true),
            row("a", 2, "runner_lost", false, false),
            row("a", 2, "succeeded", true, true),
            row("b", 1, "succeeded", false, true),
        ]
    );
}

#[test]
fn a_runner_killed_right_after_committing_a_success_with_the_next_step_s_start_resumes_it_once() {
    if !common::have_crash_hook(
        "a_runner_killed_right_after_committing_a_success_with_the_next_step_s_start_resumes_it_once",
    ) {
        return;
    }
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'chained'\n[[step]]\nname = 'a'\nshell = 'echo a >> a.log'\n\
         [[step]]\nname = 'b'\nshell = 'echo b >> b.log'\n",
    );
    // SIGKILL right after a's success and b's start are committed (one transaction), before b's
    // child is spawned.
    let out = env.cmd(&["run", "flow.toml"]).env("WAYMARK_TEST_CRASH_AT_START", "b").output().unwrap();
    assert_eq!(out.status.signal(), Some(9), "{}", stderr(&out));
    assert_eq!((env.count("a.log"), env.count("b.log")), (1, 0), "b was not spawned");
    let db = rusqlite::Connection::open(env.state().join("waymark.db")).unwrap();
    // Both halves are there: a's success, and b's attempt in flight without a pid.
    assert_eq!(attempts(&db), [row("a", 1, "succeeded", false, true), row("b", 1, "running", false, false)]);

    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("resuming run"), "{said}");
    // a ran once and is not run again; b once, under the second runner.
    assert_eq!((env.count("a.log"), env.count("b.log")), (1, 1));
    assert_eq!(
        attempts(&db),
        [
            row("a", 1, "succeeded", false, true),
            row("b", 1, "runner_lost", false, false),
            row("b", 1, "succeeded", true, true),
        ]
    );
}
