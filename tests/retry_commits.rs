//! Issue 11: a failed attempt whose retry is due at once (no backoff) commits its outcome in the
//! same transaction as the retry's start, so an attempt retried at once costs two commits of the
//! state database (its start with the outcome before it, and its pid), not three. Counted from
//! the database's write-ahead log, whatever the code path; and a SIGKILL right after that one
//! commit resumes with the retry redelivered, nothing lost and nothing run twice.

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

/// The commits a run of a step that fails `attempts` times (each retried at once) makes, in a
/// state directory of its own.
fn commits_of_a_run(attempts: u32) -> usize {
    let env = Env::new();
    env.write(
        "flow.toml",
        &format!("name = 'fails'\n[[step]]\nname = 'a'\nrun = ['false']\nretry = {{ attempts = {attempts} }}\n"),
    );
    let out = env.cmd(&["run", "--quiet", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    wal_commits(&env.state().join("waymark.db-wal"))
}

#[test]
fn an_attempt_retried_at_once_costs_two_commits() {
    // The run's own commits (schema, run, its end) are the same for both: the difference is the
    // attempts'. Few enough that no checkpoint restarts the log in between.
    let (few, many) = (commits_of_a_run(5), commits_of_a_run(25));
    assert_eq!(many - few, 2 * 20, "commits: {few} for 5 attempts, {many} for 25");
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
    let out = env.cmd(&["run", "flow.toml"]).env("WAYMARK_TEST_CRASH_AT_RETRY", "a").output().unwrap();
    assert_eq!(out.status.signal(), Some(9), "{}", stderr(&out));
    assert_eq!(env.read("a.log"), "1\n", "attempt 2 was not spawned");
    let db = rusqlite::Connection::open(env.state().join("waymark.db")).unwrap();
    let rows = |db: &rusqlite::Connection| -> Vec<(u32, String, bool, bool)> {
        let mut stmt =
            db.prepare("SELECT attempt, outcome, redelivered, pid IS NOT NULL FROM attempts ORDER BY row").unwrap();
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))).unwrap().map(Result::unwrap).collect()
    };
    // Both halves are there: attempt 1's outcome, and attempt 2 in flight without a pid.
    assert_eq!(rows(&db), [(1, "failed".into(), false, true), (2, "running".into(), false, false)]);
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
        rows(&db),
        [
            (1, "failed".into(), false, true),
            (2, "runner_lost".into(), false, false),
            (2, "succeeded".into(), true, true),
            (1, "succeeded".into(), false, true),
        ]
    );
}
