//! The store's share of an attempt, without processes:
//!
//!     cargo bench --bench store
//!
//! Times the three commits of a failing attempt (start, pid, outcome: synchronous=NORMAL) and of
//! a succeeding one (its outcome commit is synchronous=FULL), on a database in a temporary
//! directory (set TMPDIR to choose the disk).

use std::time::{Duration, Instant, SystemTime};
use waymark::classify::{ErrorSource, ErrorValue};
use waymark::flow::parse;
use waymark::store::{AttemptOutcome, AttemptResult, Lease, RunLog, SqliteStore, StateDir, StepUpdate, Store};

fn main() {
    let n: u32 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(3000);
    let dir = tempfile::tempdir().expect("temp dir");
    let state = StateDir::create(dir.path()).expect("state directory");
    let mut store = SqliteStore::open(&state).expect("store");
    let source = "[[step]]\nname = 's'\nrun = ['true']\nretry = {}\n";
    let (flow, _) = parse(source, &dir.path().join("bench.toml")).expect("flow");
    let (run, lease) = store.create_run(&flow, "0", &Lease::new_owner()).expect("run");
    let error = ErrorValue {
        class: "CalledProcessError".into(),
        bases: vec!["SubprocessError".into(), "Exception".into(), "BaseException".into()],
        message: "exit status 1".into(),
        source: ErrorSource::ExitStatus,
    };
    let stem = dir.path().join("attempt");
    let mut time = |update: &StepUpdate, outcome: AttemptOutcome| -> Duration {
        let start = Instant::now();
        for attempt in 1..=n {
            let row = store.attempt_starting(&lease, &run.id, "s", attempt, false, &stem).unwrap();
            store.attempt_spawned(&lease, row, 4242, Some(1)).unwrap();
            let result = AttemptResult {
                outcome,
                exit_code: Some(1),
                signal: None,
                error: Some(error.clone()),
                ended_at: SystemTime::now(),
                outputs: Default::default(),
            };
            store.attempt_finished(&lease, row, &result, update).unwrap();
        }
        start.elapsed() / n
    };
    let wake = StepUpdate::Waiting { next_attempt: 2, wake_at: SystemTime::now() };
    let failing = time(&wake, AttemptOutcome::Failed);
    let succeeding = time(&StepUpdate::Succeeded, AttemptOutcome::Succeeded);
    println!("store bookkeeping per failing attempt (3 commits, NORMAL):             {failing:?}");
    println!("store bookkeeping per succeeding attempt (2 NORMAL + 1 FULL commit):   {succeeding:?}");
}
