//! The store's share of an attempt, without processes:
//!
//!     cargo bench --bench store [N]
//!
//! Times, per attempt, over N attempts (3000): the three commits of a failing attempt retried
//! after a backoff (start, pid, outcome: synchronous=NORMAL), the two of one retried at once (its
//! start committed with the outcome of the attempt before it, and its pid), and the two of a
//! succeeding step after a success (its start committed with the success of the step before it,
//! synchronous=FULL, and its pid; each of N steps succeeds once), on a database in a temporary
//! directory (set TMPDIR to choose the disk).

use std::time::{Duration, Instant, SystemTime};
use waymark::classify::{ErrorSource, ErrorValue};
use waymark::flow::parse;
use waymark::store::{
    AttemptOutcome, AttemptResult, Lease, NextAttempt, RunLog, SqliteStore, StateDir, StepUpdate, Store,
};

fn main() {
    let n: u32 = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(3000);
    let dir = tempfile::tempdir().expect("temp dir");
    let state = StateDir::create(dir.path()).expect("state directory");
    let mut store = SqliteStore::open(&state).expect("store");
    // Step `s` retries; steps `t0`.. succeed once each.
    let mut source = String::from("[[step]]\nname = 's'\nrun = ['true']\nretry = {}\n");
    for i in 0..n {
        source.push_str(&format!("[[step]]\nname = 't{i}'\nrun = ['true']\n"));
    }
    let (flow, _) = parse(&source, &dir.path().join("bench.toml")).expect("flow");
    let (run, lease) = store.create_run(&flow, "0", &Lease::new_owner()).expect("run");
    let error = ErrorValue {
        class: "CalledProcessError".into(),
        bases: vec!["SubprocessError".into(), "Exception".into(), "BaseException".into()],
        message: "exit status 1".into(),
        source: ErrorSource::ExitStatus,
    };
    let result = |outcome| AttemptResult {
        outcome,
        exit_code: Some(1),
        signal: None,
        error: (outcome == AttemptOutcome::Failed).then(|| error.clone()),
        ended_at: SystemTime::now(),
        killed_after_grace: false,
        outputs: Default::default(),
    };
    let stem = dir.path().join("attempt");
    let wake = StepUpdate::Waiting { next_attempt: 2, wake_at: SystemTime::now() };

    // After a backoff: start, pid, outcome.
    let start = Instant::now();
    for attempt in 1..=n {
        let row = store.attempt_starting(&lease, &run.id, "s", attempt, false, &stem).unwrap();
        store.attempt_spawned(&lease, row, 4242, Some(1)).unwrap();
        store.attempt_finished(&lease, row, &result(AttemptOutcome::Failed), &wake).unwrap();
    }
    let after_backoff = start.elapsed() / n;

    // Retried at once: each attempt's start carries the outcome of the one before it.
    let start = Instant::now();
    let mut row = store.attempt_starting(&lease, &run.id, "s", n + 1, false, &stem).unwrap();
    for attempt in n + 2..=2 * n + 1 {
        store.attempt_spawned(&lease, row, 4242, Some(1)).unwrap();
        let next = NextAttempt { step: "s", attempt, redelivered: false, log_stem: &stem };
        let failed = result(AttemptOutcome::Failed);
        row = store.attempt_finished_then_starting(&lease, &run.id, row, &failed, &wake, &next).unwrap();
    }
    let at_once: Duration = start.elapsed() / n;

    // Succeeding: one attempt of each step `tI`, whose start carries the success of the step
    // before it (synced); the last success is committed alone.
    let start = Instant::now();
    let mut row = store.attempt_starting(&lease, &run.id, "t0", 1, false, &stem).unwrap();
    let succeeded = result(AttemptOutcome::Succeeded);
    for i in 1..n {
        store.attempt_spawned(&lease, row, 4242, Some(1)).unwrap();
        let step = format!("t{i}");
        let next = NextAttempt { step: &step, attempt: 1, redelivered: false, log_stem: &stem };
        row = store
            .attempt_finished_then_starting(&lease, &run.id, row, &succeeded, &StepUpdate::Succeeded, &next)
            .unwrap();
    }
    store.attempt_spawned(&lease, row, 4242, Some(1)).unwrap();
    store.attempt_finished(&lease, row, &succeeded, &StepUpdate::Succeeded).unwrap();
    let succeeding = start.elapsed() / n;
    println!("store bookkeeping per failing attempt, after a backoff (3 commits, NORMAL): {after_backoff:?}");
    println!("store bookkeeping per failing attempt, retried at once (2 commits, NORMAL): {at_once:?}");
    println!("store bookkeeping per succeeding step (1 NORMAL + 1 FULL commit):           {succeeding:?}");
}
