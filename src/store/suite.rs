//! One suite of store behaviour, run against both backends: the embedded SQLite store, and the
//! PostgreSQL store on `$WAYMARK_TEST_PG` (each test in a database of its own). Without
//! PostgreSQL the PostgreSQL half says `SKIPPED` outside CI and fails under CI.

use super::lease::{LeaseTiming, host_id};
use super::postgres::{FlowLease, Leased, PgStore, lease_key};
use super::url::PgConfig;
use super::*;
use std::sync::Arc;
use std::time::Duration;

/// A fresh database on the test server: its config and location, dropped when the value is (so a
/// long-lived server given as `$WAYMARK_TEST_PG` does not fill with test databases); `None`
/// (after a `SKIPPED` line) without a server.
fn fresh_database(test: &str) -> Option<TestDatabase> {
    use std::io::Write;
    let Some(url) = std::env::var("WAYMARK_TEST_PG").ok().filter(|u| !u.is_empty()) else {
        assert!(std::env::var_os("CI").is_none(), "{test} needs PostgreSQL: CI must set WAYMARK_TEST_PG");
        let _ = writeln!(std::io::stderr(), "SKIPPED {test} on PostgreSQL: WAYMARK_TEST_PG is not set");
        return None;
    };
    let admin: ::postgres::Config = url.parse().unwrap();
    let name = format!("waymark_suite_{:016x}", fastrand::u64(..));
    admin.connect(::postgres::NoTls).unwrap().batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
    let mut config = admin.clone();
    config.dbname(&name);
    Some(TestDatabase { config: PgConfig::from(config), location: format!("postgres://test/{name}"), admin, name })
}

struct TestDatabase {
    config: PgConfig,
    location: String,
    admin: ::postgres::Config,
    name: String,
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        // FORCE: a connection of the test's own may not be closed yet.
        let dropped = self
            .admin
            .connect(::postgres::NoTls)
            .and_then(|mut admin| admin.batch_execute(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name)));
        if let Err(e) = dropped {
            let _ = std::io::Write::write_fmt(
                &mut std::io::stderr(),
                format_args!("could not drop test database {}: {e}\n", self.name),
            );
        }
    }
}

/// A store under test, with what the backend needs to hold a flow (its lease).
struct Backend {
    name: &'static str,
    store: Box<dyn Store>,
    /// PostgreSQL: to open a second connection and to take leases (declared after `store`, so
    /// the store's connection closes before the database is dropped).
    pg: Option<TestDatabase>,
    _dir: tempfile::TempDir,
}

impl Backend {
    fn all(test: &str) -> Vec<Backend> {
        let dir = tempfile::tempdir().unwrap();
        let sqlite = SqliteStore::open(&StateDir::create(dir.path()).unwrap()).unwrap();
        let mut out = vec![Backend { name: "sqlite", store: Box::new(sqlite), pg: None, _dir: dir }];
        if let Some(db) = fresh_database(test) {
            let store = PgStore::open(&db.config, &db.location).unwrap();
            let dir = tempfile::tempdir().unwrap();
            out.push(Backend { name: "postgres", store: Box::new(store), pg: Some(db), _dir: dir });
        }
        out
    }

    /// Take flow `key` for `owner` as a runner would: the lease (PostgreSQL); SQLite's lock file
    /// is the command's, not the store's.
    fn hold(&self, key: &FlowKey, owner: &str, ttl: Duration, renew: Duration) -> Option<FlowLease> {
        let db = self.pg.as_ref()?;
        let timing = LeaseTiming { ttl, renew };
        match FlowLease::try_take(&db.config, &db.location, &lease_key(key, host_id()), owner, timing).unwrap() {
            Leased::Taken(lease) => Some(lease),
            Leased::Held(holder) => panic!("{}: the lease is held: {holder}", self.name),
        }
    }

    /// A second connection to the same store.
    fn second(&self) -> Box<dyn Store> {
        match &self.pg {
            Some(db) => Box::new(PgStore::open(&db.config, &db.location).unwrap()),
            None => Box::new(SqliteStore::open(&StateDir::create(self._dir.path()).unwrap()).unwrap()),
        }
    }
}

fn flow(dir: &std::path::Path, text: &str) -> crate::flow::Flow {
    crate::flow::parse(text, &dir.join("f.toml")).unwrap().0
}

fn result(outcome: AttemptOutcome) -> AttemptResult {
    AttemptResult {
        outcome,
        exit_code: Some(1),
        signal: None,
        error: None,
        ended_at: SystemTime::now(),
        killed_after_grace: false,
        outputs: BTreeMap::new(),
    }
}

#[test]
fn steps_go_through_their_states_alike_on_both_backends() {
    for mut b in Backend::all("steps_go_through_their_states_alike_on_both_backends") {
        let dir = tempfile::tempdir().unwrap();
        let name = format!("f{:08x}", fastrand::u32(..));
        let flow = flow(
            dir.path(),
            &format!(
                "name = '{name}'\n[[step]]\nname = 'a'\nrun = ['true']\n[[step]]\nname = 'b'\nrun = ['true']\nretry = {{}}\n"
            ),
        );
        let key = FlowKey::named(&name);
        let _held = b.hold(&key, "host:1:a", Duration::from_secs(30), Duration::from_secs(10));
        let (run, lease) = b.store.create_run(&flow, "hash", "host:1:a").unwrap();
        let store = b.store.as_mut();
        assert_eq!(store.find_resumable(&key).unwrap().unwrap().id, run.id, "{}", b.name);
        let stem = dir.path().join("x");
        let row = store.attempt_starting(&lease, &run.id, "a", 1, false, &stem).unwrap();
        store.attempt_spawned(&lease, row, 4242, Some(7)).unwrap();
        let steps = store.steps(&run.id).unwrap();
        assert_eq!(steps[0].state, StepState::InFlight { attempt: 1, row, pid: Some(4242), proc_start: Some(7) });
        let outputs = BTreeMap::from([("rows".to_owned(), "42".to_owned())]);
        let succeeded = AttemptResult { outputs: outputs.clone(), ..result(AttemptOutcome::Succeeded) };
        store.attempt_finished(&lease, row, &succeeded, &StepUpdate::Succeeded).unwrap();

        let row = store.attempt_starting(&lease, &run.id, "b", 1, false, &stem).unwrap();
        let wake_at = from_millis(to_millis(SystemTime::now()) + 60_000);
        let waiting = StepUpdate::Waiting { next_attempt: 2, wake_at };
        // Its process group needed SIGKILL after the grace: recorded with the outcome.
        let killed = AttemptResult { killed_after_grace: true, ..result(AttemptOutcome::Failed) };
        store.attempt_finished(&lease, row, &killed, &waiting).unwrap();
        let steps = b.second().steps(&run.id).unwrap();
        assert_eq!(steps[0].state, StepState::Succeeded, "{}", b.name);
        assert_eq!(steps[0].outputs, outputs, "{}", b.name);
        assert_eq!(steps[1].state, StepState::Waiting { next_attempt: 2, wake_at }, "{}", b.name);
        assert_eq!(steps[1].attempts_used, 1, "{}", b.name);

        let store = b.store.as_mut();
        // A cancelled attempt does not use up the budget.
        let row = store.attempt_starting(&lease, &run.id, "b", 2, false, &stem).unwrap();
        store.attempt_finished(&lease, row, &result(AttemptOutcome::Cancelled), &StepUpdate::Pending).unwrap();
        assert_eq!(store.steps(&run.id).unwrap()[1].attempts_used, 1, "{}", b.name);
        // An illegal move is refused and changes nothing.
        let err = store.attempt_starting(&lease, &run.id, "a", 2, false, &stem).unwrap_err();
        assert!(
            matches!(&err, StoreError::BadState { what, .. } if what == "step `a` cannot go from succeeded to running"),
            "{}: {err}",
            b.name
        );
        // A failed step reopened gets a fresh budget on top of the attempts it used.
        let row = store.attempt_starting(&lease, &run.id, "b", 2, false, &stem).unwrap();
        store.attempt_finished(&lease, row, &result(AttemptOutcome::Failed), &StepUpdate::Failed).unwrap();
        store.run_finished(&lease, &run.id, RunStatus::Failed, Some("b"), &[]).unwrap();
        assert!(store.find_resumable(&key).unwrap().is_none(), "{}: a failed run is not resumed", b.name);
        let at = from_millis(to_millis(SystemTime::now()));
        store.reopen_failed(&run.id, at).unwrap();
        assert_eq!(store.run(&run.id).unwrap().reopened_at, Some(at), "{}", b.name);
        let s = &store.steps(&run.id).unwrap()[1];
        assert_eq!((s.state.clone(), s.attempts_used, s.budget_base), (StepState::Pending, 2, 2), "{}", b.name);
        let attempts = |step| -> Vec<(String, u32, AttemptState, Option<bool>)> {
            let all = store.attempts(&run.id, step).unwrap().into_iter();
            all.map(|a| (a.step, a.attempt, a.outcome, a.killed_after_grace)).collect()
        };
        let of_b = [
            ("b".into(), 1, AttemptState::Failed, Some(true)),
            ("b".into(), 2, AttemptState::Cancelled, Some(false)),
            ("b".into(), 2, AttemptState::Failed, Some(false)),
        ];
        assert_eq!(
            attempts(None),
            [&[("a".into(), 1, AttemptState::Succeeded, Some(false))][..], &of_b].concat(),
            "{}",
            b.name
        );
        assert_eq!(attempts(Some("b")), of_b, "{}", b.name);
        let listed = store.list_runs(RunFilter::Key(&key), 10).unwrap();
        assert_eq!(listed.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), [run.id.as_str()], "{}", b.name);
        assert_eq!(listed[0].status, RunStatus::Failed, "{}", b.name);
        // A finished run is deleted by gc once it is old enough, and only then.
        store.run_finished(&lease, &run.id, RunStatus::Failed, Some("b"), &[]).unwrap_err();
        let lease2 = store.claim(&run.id, "host:1:a").unwrap();
        store.run_finished(&lease2, &run.id, RunStatus::Failed, Some("b"), &[]).unwrap();
        let past = SystemTime::now() - Duration::from_secs(3600);
        assert!(!store.delete_finished(&run.id, past).unwrap(), "{}", b.name);
        let future = SystemTime::now() + Duration::from_secs(3600);
        assert_eq!(store.finished_before(future).unwrap().len(), 1, "{}", b.name);
        assert!(store.delete_finished(&run.id, future).unwrap(), "{}", b.name);
        assert!(matches!(store.run(&run.id), Err(StoreError::NoSuchRun(_))), "{}", b.name);
    }
}

/// How a compensation or hook ended is read back as it was written, with the error that says how
/// it failed (what `status` shows of it).
#[test]
fn how_a_compensation_or_hook_ended_is_read_back_alike_on_both_backends() {
    for mut b in Backend::all("how_a_compensation_or_hook_ended_is_read_back_alike_on_both_backends") {
        let dir = tempfile::tempdir().unwrap();
        let name = format!("f{:08x}", fastrand::u32(..));
        let flow = flow(dir.path(), &format!("name = '{name}'\n[[step]]\nname = 'a'\nrun = ['true']\n"));
        let _held = b.hold(&FlowKey::named(&name), "host:1:a", Duration::from_secs(30), Duration::from_secs(10));
        let (run, lease) = b.store.create_run(&flow, "hash", "host:1:a").unwrap();
        let store = b.store.as_mut();
        let stem = dir.path().join("x");
        let error = crate::classify::ErrorValue {
            class: "ActionTimeout".into(),
            bases: vec!["BaseException".into()],
            message: "timed out after 1s".into(),
            source: crate::classify::ErrorSource::Timeout,
        };
        let row = store.aux_starting(&lease, &run.id, AuxKind::Compensate, "a", &stem, &[]).unwrap();
        let timed_out = AttemptResult { exit_code: None, error: Some(error.clone()), ..result(AttemptOutcome::Failed) };
        store.aux_finished(&lease, row, &timed_out).unwrap();
        let row = store.aux_starting(&lease, &run.id, AuxKind::Hook, "on_exit", &stem, &[]).unwrap();
        store.aux_finished(&lease, row, &result(AttemptOutcome::Succeeded)).unwrap();
        let read: Vec<_> =
            b.second().aux_runs(&run.id).unwrap().into_iter().map(|a| (a.kind, a.exit_code, a.error)).collect();
        assert_eq!(read, [(AuxKind::Compensate, None, Some(error)), (AuxKind::Hook, Some(1), None)], "{}", b.name);
    }
}

/// A catch handler's end is read back as it was written, with its own error, and its step keeps
/// the error it failed with (the handler's does not take its place).
#[test]
fn a_catch_handler_s_end_is_read_back_and_its_step_keeps_its_error_on_both_backends() {
    for mut b in Backend::all("a_catch_handler_s_end_is_read_back_and_its_step_keeps_its_error_on_both_backends") {
        let dir = tempfile::tempdir().unwrap();
        let name = format!("f{:08x}", fastrand::u32(..));
        let flow = flow(
            dir.path(),
            &format!("name = '{name}'\n[[step]]\nname = 'a'\nrun = ['false']\ncatch = [{{ run = ['true'] }}]\n"),
        );
        let _held = b.hold(&FlowKey::named(&name), "host:1:a", Duration::from_secs(30), Duration::from_secs(10));
        let (run, lease) = b.store.create_run(&flow, "hash", "host:1:a").unwrap();
        let store = b.store.as_mut();
        let error = |message: &str| crate::classify::ErrorValue {
            class: "CalledProcessError".into(),
            bases: vec!["SubprocessError".into(), "Exception".into(), "BaseException".into()],
            message: message.into(),
            source: crate::classify::ErrorSource::ExitStatus,
        };
        let row = store.attempt_starting(&lease, &run.id, "a", 1, false, &dir.path().join("attempt-1")).unwrap();
        let failed = AttemptResult { error: Some(error("exit status 1")), ..result(AttemptOutcome::Failed) };
        store.attempt_finished(&lease, row, &failed, &StepUpdate::Catching).unwrap();
        let stem = dir.path().join("catch-1");
        let row = store.handler_starting(&lease, &run.id, "a", 1, &stem).unwrap();
        let handler =
            AttemptResult { exit_code: Some(3), error: Some(error("exit status 3")), ..result(AttemptOutcome::Failed) };
        store.attempt_finished(&lease, row, &handler, &StepUpdate::Failed).unwrap();
        let second = b.second();
        let expected = HandlerRun {
            step: "a".into(),
            attempt: 1,
            outcome: AttemptState::Failed,
            exit_code: Some(3),
            error: Some(error("exit status 3")),
            log_stem: stem,
            host: Some(host_id().to_owned()),
        };
        assert_eq!(second.handlers(&run.id).unwrap(), [expected], "{}", b.name);
        let step = &second.steps(&run.id).unwrap()[0];
        assert_eq!(
            (&step.state, step.last_error.as_deref()),
            (&StepState::Failed, Some(&error("exit status 1"))),
            "{}",
            b.name
        );
        // A handler is no attempt.
        assert_eq!(second.attempts(&run.id, None).unwrap().len(), 1, "{}", b.name);
    }
}

/// The end of an attempt whose step is in a state it cannot leave that way (here made final
/// behind the runner's back) is refused, says why, and records nothing of the attempt's end; so is
/// skipping a step that already ended.
#[test]
fn a_move_the_step_s_state_forbids_is_refused_and_changes_nothing_on_both_backends() {
    for mut b in Backend::all("a_move_the_step_s_state_forbids_is_refused_and_changes_nothing_on_both_backends") {
        let flow = flow(b._dir.path(), "name = 'f'\n[[step]]\nname = 'a'\nrun = ['true']\n");
        let _held = b.hold(&FlowKey::named("f"), "host:1:a", Duration::from_secs(30), Duration::from_secs(10));
        let store = b.store.as_mut();
        let (run, lease) = store.create_run(&flow, "hash", "host:1:a").unwrap();
        let row = store.attempt_starting(&lease, &run.id, "a", 1, false, &b._dir.path().join("x")).unwrap();
        let caught = "SET state = 'caught'";
        match &b.pg {
            Some(db) => {
                let mut admin = db.config.connect(::postgres::NoTls).unwrap();
                admin.execute(&format!("UPDATE waymark_steps {caught}"), &[]).unwrap();
            }
            None => {
                let db = StateDir::create(b._dir.path()).unwrap().db();
                rusqlite::Connection::open(db).unwrap().execute(&format!("UPDATE steps {caught}"), []).unwrap();
            }
        }
        let refused = |err: StoreError, to: &str| {
            let want = format!("step `a` cannot go from caught to {to}");
            assert!(
                matches!(&err, StoreError::BadState { table: "steps", what, .. } if *what == want),
                "{}: {err}",
                b.name
            );
        };
        let store = b.store.as_mut();
        refused(
            store.attempt_finished(&lease, row, &result(AttemptOutcome::Failed), &StepUpdate::Failed).unwrap_err(),
            "failed",
        );
        assert_eq!(store.attempts(&run.id, None).unwrap()[0].outcome, AttemptState::Running, "{}", b.name);
        let skipped = ["a".to_owned()];
        refused(store.run_finished(&lease, &run.id, RunStatus::Failed, Some("a"), &skipped).unwrap_err(), "skipped");
        assert_eq!(store.run(&run.id).unwrap().status, RunStatus::Running, "{}", b.name);
        assert_eq!(store.steps(&run.id).unwrap()[0].state, StepState::Caught, "{}", b.name);
    }
}

/// `create_run` returns the run as it recorded it, without reading it back: exactly what `run`
/// reads, and steps exactly as [`StepRecord::pending`] describes them, in order.
#[test]
fn a_new_run_is_what_create_run_returned_on_both_backends() {
    for mut b in Backend::all("a_new_run_is_what_create_run_returned_on_both_backends") {
        let dir = tempfile::tempdir().unwrap();
        let name = format!("f{:08x}", fastrand::u32(..));
        let mut text = format!("name = '{name}'\n");
        for i in 0..300 {
            text.push_str(&format!("[[step]]\nname = 's{i}'\nrun = ['true']\n"));
        }
        let flow = flow(dir.path(), &text);
        let _held = b.hold(&FlowKey::named(&name), "host:1:a", Duration::from_secs(30), Duration::from_secs(10));
        let (run, _) = b.store.create_run(&flow, "hash", "host:1:a").unwrap();
        assert_eq!(b.store.run(&run.id).unwrap(), run, "{}", b.name);
        let steps: Vec<(String, StepState, u32, u32)> = b
            .store
            .steps(&run.id)
            .unwrap()
            .into_iter()
            .map(|s| (s.name, s.state, s.attempts_used, s.budget_base))
            .collect();
        let pending: Vec<(String, StepState, u32, u32)> = flow
            .steps
            .iter()
            .map(|s| StepRecord::pending(&s.name))
            .map(|s| (s.name, s.state, s.attempts_used, s.budget_base))
            .collect();
        assert_eq!(steps, pending, "{}", b.name);
    }
}

#[test]
fn a_later_owner_fences_off_the_earlier_one_on_both_backends() {
    for mut b in Backend::all("a_later_owner_fences_off_the_earlier_one_on_both_backends") {
        let dir = tempfile::tempdir().unwrap();
        let name = format!("f{:08x}", fastrand::u32(..));
        let flow = flow(dir.path(), &format!("name = '{name}'\n[[step]]\nname = 'a'\nrun = ['true']\n"));
        let key = FlowKey::named(&name);
        // The first owner's lease is short and not renewed: it expires, as a dead host's does.
        let first_lease = b.hold(&key, "host-a:1:first", Duration::from_millis(300), Duration::from_secs(3600));
        let (run, old) = b.store.create_run(&flow, "hash", "host-a:1:first").unwrap();
        let stem = dir.path().join("x");
        let row = b.store.attempt_starting(&old, &run.id, "a", 1, false, &stem).unwrap();
        if let Some(lease) = first_lease {
            // The host is gone: it never gives its lease up (its renewer waits an hour).
            std::mem::forget(lease);
            std::thread::sleep(Duration::from_millis(800));
        }
        let mut second = b.second();
        let _second_lease = b.hold(&key, "host-b:2:second", Duration::from_secs(30), Duration::from_secs(10));
        let new = second.claim(&run.id, "host-b:2:second").unwrap();
        assert!(new.token > old.token, "{}: the token grows", b.name);
        // Every write of the first owner is refused and changes nothing.
        let refused = |e: StoreError| matches!(e, StoreError::LeaseLost { .. } | StoreError::Fenced { .. });
        let e = b.store.attempt_finished(&old, row, &result(AttemptOutcome::Succeeded), &StepUpdate::Succeeded);
        assert!(refused(e.unwrap_err()), "{}", b.name);
        assert!(refused(b.store.attempt_starting(&old, &run.id, "a", 2, false, &stem).unwrap_err()), "{}", b.name);
        assert!(
            refused(b.store.run_finished(&old, &run.id, RunStatus::Succeeded, None, &[]).unwrap_err()),
            "{}",
            b.name
        );
        assert_eq!(second.run(&run.id).unwrap().status, RunStatus::Running, "{}", b.name);
        let attempts = second.attempts(&run.id, None).unwrap();
        assert_eq!(attempts.len(), 1, "{}", b.name);
        assert_eq!(attempts[0].outcome, AttemptState::RunnerLost, "{}: the claim closed it", b.name);
        // The step is still in flight with the earlier owner's attempt until the new owner runs it
        // again: its attempt being `runner_lost` is how `status` tells that it is not the new
        // owner's (it shows the step `interrupted` though the run's runner lives).
        let in_flight = |store: &dyn Store| match store.steps(&run.id).unwrap()[0].state {
            StepState::InFlight { attempt, row, .. } => Some((attempt, row)),
            _ => None,
        };
        assert_eq!(in_flight(second.as_ref()), Some((1, row)), "{}", b.name);
        // The second owner's writes go through.
        let row = second.attempt_starting(&new, &run.id, "a", 1, true, &stem).unwrap();
        assert_eq!(in_flight(second.as_ref()), Some((1, row)), "{}: its own attempt now", b.name);
        let outcomes: Vec<_> = second.attempts(&run.id, None).unwrap().iter().map(|a| a.outcome).collect();
        assert_eq!(outcomes, [AttemptState::RunnerLost, AttemptState::Running], "{}", b.name);
        second.attempt_finished(&new, row, &result(AttemptOutcome::Succeeded), &StepUpdate::Succeeded).unwrap();
        assert_eq!(b.store.steps(&run.id).unwrap()[0].state, StepState::Succeeded, "{}", b.name);
    }
}

/// A live lease on a flow holds the run it was taken for, not every run of the flow: a run left
/// running by a runner that died is not held by the runner of another run of the same flow, nor
/// by `waymark gc` (as the embedded store's lock file tells it).
#[test]
fn a_lease_holds_its_own_run_and_not_the_other_runs_of_its_flow() {
    let Some(db) = fresh_database("a_lease_holds_its_own_run_and_not_the_other_runs_of_its_flow") else {
        return;
    };
    let (config, location) = (&db.config, &db.location);
    let dir = tempfile::tempdir().unwrap();
    let flow = flow(dir.path(), "name = 'twice'\n[[step]]\nname = 'a'\nrun = ['true']\n");
    let key = lease_key(&FlowKey::named("twice"), host_id());
    let timing = LeaseTiming { ttl: Duration::from_secs(30), renew: Duration::from_secs(10) };
    let take = |owner: &str| match FlowLease::try_take(config, location, &key, owner, timing).unwrap() {
        Leased::Taken(lease) => lease,
        Leased::Held(holder) => panic!("the lease is held: {holder}"),
    };
    let mut store = PgStore::open(config, location).unwrap();
    // The first run's runner dies: its run stays recorded as running, and its lease is given up.
    let first_lease = take("h:1:first");
    let (first, _) = store.create_run(&flow, "hash", "h:1:first").unwrap();
    drop(first_lease);
    assert_eq!(store.run_lease_holder(&first.id).unwrap(), None);
    // A runner of the same flow takes the lease for a second run: it holds that one only.
    let second_lease = take("h:2:second");
    let (second, _) = store.create_run(&flow, "hash", "h:2:second").unwrap();
    assert_eq!(store.run(&first.id).unwrap().status, RunStatus::Running);
    let holder = store.run_lease_holder(&second.id).unwrap().expect("the second run is held");
    assert!(holder.starts_with(&format!("run {} on host {}, pid ", second.id, host_id())), "{holder}");
    assert_eq!(store.run_lease_holder(&first.id).unwrap(), None, "the first run is not the lease's");
    drop(second_lease);
    // A lease taken but not yet given a run (a runner about to claim one) holds every run of the
    // flow; one that `gc` holds, none.
    let _runner = take("h:3:third");
    assert!(store.run_lease_holder(&first.id).unwrap().is_some());
    drop(_runner);
    let _gc = take(&format!("{}h:4", super::postgres::GC_OWNER));
    assert_eq!(store.run_lease_holder(&first.id).unwrap(), None, "gc holds no run");
    // A runner that finds gc holding the lease is told so, not of a runner starting.
    let Leased::Held(holder) = FlowLease::try_take(config, location, &key, "h:5:fifth", timing).unwrap() else {
        panic!("gc holds the lease")
    };
    assert!(
        holder.starts_with(&format!("`waymark gc` (deleting finished runs) on host {}, pid ", host_id())),
        "{holder}"
    );
}

#[test]
fn a_live_lease_keeps_a_second_runner_out_and_a_newer_schema_is_refused() {
    let Some(db) = fresh_database("a_live_lease_keeps_a_second_runner_out_and_a_newer_schema_is_refused") else {
        return;
    };
    let (config, location) = (&db.config, &db.location);
    let timing = LeaseTiming { ttl: Duration::from_secs(30), renew: Duration::from_secs(10) };
    let key = lease_key(&FlowKey::named("x"), "h");
    let Leased::Taken(held) = FlowLease::try_take(config, location, &key, "h:1:a", timing).unwrap() else {
        panic!("free")
    };
    let Leased::Held(holder) = FlowLease::try_take(config, location, &key, "h:2:b", timing).unwrap() else {
        panic!("taken twice")
    };
    // Its own holder may take a lease again (a `--wait` that lost the answer to the statement that
    // took it, with its connection, tries again), with a new token: the one it never learnt is
    // done. Anyone else is kept out still.
    let store = PgStore::open(config, location).unwrap();
    let other = lease_key(&FlowKey::named("y"), "h");
    assert_eq!(store.try_lease(&other, "h:3:c", timing.ttl).unwrap().map(|(token, _)| token), Ok(1));
    assert_eq!(store.try_lease(&other, "h:3:c", timing.ttl).unwrap().map(|(token, _)| token), Ok(2));
    assert!(store.try_lease(&other, "h:4:d", timing.ttl).unwrap().is_err(), "held by h:3:c");
    drop(store);
    assert!(
        holder.starts_with(&format!(
            "a runner starting (its run not chosen yet) on host {}, pid {}, its lease expires at ",
            host_id(),
            std::process::id()
        )),
        "{holder}"
    );
    // Given up when dropped: the next runner takes it at once.
    drop(held);
    assert!(matches!(FlowLease::try_take(config, location, &key, "h:2:b", timing).unwrap(), Leased::Taken(_)));

    let mut admin = config.connect(::postgres::NoTls).unwrap();
    admin.execute("UPDATE waymark_schema SET version = 99", &[]).unwrap();
    let err = PgStore::open(config, location).err().expect("refused");
    assert_eq!(err.kind(), Some(StoreErrorKind::NewerSchema));
    assert!(err.to_string().contains("(schema 99, this one knows 4)"), "{err}");
    // Chosen by its URL, not a state directory: the way to another store is named.
    assert!(
        err.to_string().ends_with("; upgrade waymark or choose another store with --store or WAYMARK_STORE"),
        "{err}"
    );
    let err = PgStore::open_for_reading(config, location).err().expect("refused to a looking command too");
    assert_eq!(err.kind(), Some(StoreErrorKind::NewerSchema));

    // A schema-1 database (attempts without `killed`, no deleted runs, runs without a time of
    // reopening) is read as it is by a looking command, which leaves it so (older waymarks of
    // other hosts go on using it), and brought up to date by the next runner's open.
    admin
        .batch_execute(
            "UPDATE waymark_schema SET version = 1; ALTER TABLE waymark_attempts DROP COLUMN killed; \
             DROP TABLE waymark_deleted_runs; ALTER TABLE waymark_runs DROP COLUMN reopened_at",
        )
        .unwrap();
    let version = |admin: &mut ::postgres::Client| -> i64 {
        admin.query_one("SELECT version FROM waymark_schema", &[]).unwrap().get(0)
    };
    let looking = PgStore::open_for_reading(config, location).unwrap().expect("a schema-1 database is read");
    assert!(looking.attempts("nosuch", None).unwrap().is_empty());
    assert_eq!(version(&mut admin), 1);
    PgStore::open(config, location).unwrap();
    assert_eq!(version(&mut admin), 4);
    admin.query_one("SELECT count(*) FROM waymark_attempts WHERE killed", &[]).unwrap();
    admin.query_one("SELECT count(*) FROM waymark_deleted_runs", &[]).unwrap();
    admin.query_one("SELECT count(reopened_at) FROM waymark_runs", &[]).unwrap();
}

/// A runner's connection lost between two writes (the server restarted, a proxy cut it): the
/// next write is made on a new connection, with the runner's statements prepared anew there.
#[test]
fn a_write_after_the_connection_was_lost_is_made_on_a_new_one() {
    let Some(db) = fresh_database("a_write_after_the_connection_was_lost_is_made_on_a_new_one") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let flow =
        flow(dir.path(), "name = 'cut'\n[[step]]\nname = 'a'\nrun = ['true']\n[[step]]\nname = 'b'\nrun = ['true']\n");
    let timing = LeaseTiming { ttl: Duration::from_secs(30), renew: Duration::from_secs(10) };
    let key = lease_key(&FlowKey::named("cut"), host_id());
    let Leased::Taken(_held) = FlowLease::try_take(&db.config, &db.location, &key, "h:1:a", timing).unwrap() else {
        panic!("free")
    };
    let mut store = PgStore::open(&db.config, &db.location).unwrap();
    let (run, lease) = store.create_run(&flow, "hash", "h:1:a").unwrap();
    let stem = dir.path().join("x");
    let row = store.attempt_starting(&lease, &run.id, "a", 1, false, &stem).unwrap();
    let mut admin = db.config.connect(::postgres::NoTls).unwrap();
    let cut = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
               WHERE datname = current_database() AND pid <> pg_backend_pid()";
    admin.execute(cut, &[]).unwrap();
    // Without a runner's lease clock the write that finds the connection gone fails (a runner's
    // journal retries it); the next one reconnects.
    let succeeded = result(AttemptOutcome::Succeeded);
    let next = NextAttempt { step: "b", attempt: 1, redelivered: false, log_stem: &stem };
    let mut write =
        || store.attempt_finished_then_starting(&lease, &run.id, row, &succeeded, &StepUpdate::Succeeded, &next);
    let row = match write() {
        Ok(row) => row,
        Err(e) => {
            assert_eq!(e.kind(), Some(StoreErrorKind::Unreachable), "{e}");
            write().unwrap()
        }
    };
    store.attempt_finished(&lease, row, &succeeded, &StepUpdate::Succeeded).unwrap();
    let states: Vec<_> = store.steps(&run.id).unwrap().into_iter().map(|s| s.state).collect();
    assert_eq!(states, [StepState::Succeeded, StepState::Succeeded]);
}

#[test]
fn the_ends_of_an_attempts_output_are_recorded_for_other_hosts() {
    let Some(db) = fresh_database("the_ends_of_an_attempts_output_are_recorded_for_other_hosts") else {
        return;
    };
    let (config, location) = (&db.config, &db.location);
    let dir = tempfile::tempdir().unwrap();
    let flow = flow(dir.path(), "name = 'tails'\n[[step]]\nname = 'a'\nrun = ['true']\n");
    let key = FlowKey::named("tails");
    let timing = LeaseTiming { ttl: Duration::from_secs(30), renew: Duration::from_secs(10) };
    let _lease = FlowLease::try_take(config, location, &lease_key(&key, host_id()), "h:1:a", timing).unwrap();
    let mut store = PgStore::open(config, location).unwrap();
    let (run, lease) = store.create_run(&flow, "hash", "h:1:a").unwrap();
    let stem = dir.path().join("attempt-1");
    let big: Vec<u8> = (0..200_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    std::fs::write(stem.with_extension("stdout"), &big).unwrap();
    std::fs::write(stem.with_extension("stderr"), b"oops\n").unwrap();
    let row = store.attempt_starting(&lease, &run.id, "a", 1, false, &stem).unwrap();
    store.attempt_finished(&lease, row, &result(AttemptOutcome::Succeeded), &StepUpdate::Succeeded).unwrap();
    let out = store.attempt_tail(&run.id, &stem, "stdout").unwrap().unwrap();
    assert_eq!(out, big[big.len() - 64 * 1024..]);
    assert_eq!(store.attempt_tail(&run.id, &stem, "stderr").unwrap().unwrap(), b"oops\n");
}

/// Issue 11: a failed attempt's outcome and its retry's start, written together, are one
/// transaction: both are recorded, or (here the start is refused) neither is; and a runner
/// whose lease was taken writes neither.
#[test]
fn an_outcome_and_its_retry_s_start_commit_together_or_not_at_all_on_both_backends() {
    for mut b in Backend::all("an_outcome_and_its_retry_s_start_commit_together_or_not_at_all_on_both_backends") {
        let dir = tempfile::tempdir().unwrap();
        let name = format!("f{:08x}", fastrand::u32(..));
        let flow = flow(dir.path(), &format!("name = '{name}'\n[[step]]\nname = 'a'\nrun = ['false']\nretry = {{}}\n"));
        let key = FlowKey::named(&name);
        let held = b.hold(&key, "host:1:a", Duration::from_secs(30), Duration::from_secs(10));
        let (run, lease) = b.store.create_run(&flow, "hash", "host:1:a").unwrap();
        let store = b.store.as_mut();
        let stem = dir.path().join("x");
        let first = store.attempt_starting(&lease, &run.id, "a", 1, false, &stem).unwrap();
        store.attempt_spawned(&lease, first, 4242, Some(7)).unwrap();
        let failed = result(AttemptOutcome::Failed);
        let waiting = StepUpdate::Waiting { next_attempt: 2, wake_at: SystemTime::now() };
        let next = NextAttempt { step: "a", attempt: 2, redelivered: false, log_stem: &stem };
        let second = store.attempt_finished_then_starting(&lease, &run.id, first, &failed, &waiting, &next).unwrap();
        let reader = b.second();
        let outcomes = |s: &dyn Store| -> Vec<(u32, AttemptState)> {
            s.attempts(&run.id, None).unwrap().into_iter().map(|a| (a.attempt, a.outcome)).collect()
        };
        let both = [(1, AttemptState::Failed), (2, AttemptState::Running)];
        assert_eq!(outcomes(reader.as_ref()), both, "{}", b.name);
        let step = &reader.steps(&run.id).unwrap()[0];
        let in_flight = StepState::InFlight { attempt: 2, row: second, pid: None, proc_start: None };
        assert_eq!((&step.state, step.attempts_used), (&in_flight, 1), "{}", b.name);

        // The start half is refused (no such step): the outcome half, made first in the same
        // transaction, is rolled back with it.
        let store = b.store.as_mut();
        let waiting = StepUpdate::Waiting { next_attempt: 3, wake_at: SystemTime::now() };
        let nowhere = NextAttempt { step: "nosuch", ..next };
        let err = store.attempt_finished_then_starting(&lease, &run.id, second, &failed, &waiting, &nowhere);
        assert!(matches!(err, Err(StoreError::BadState { .. })), "{}: {err:?}", b.name);
        assert_eq!(outcomes(reader.as_ref()), both, "{}", b.name);
        let step = &reader.steps(&run.id).unwrap()[0];
        assert_eq!((&step.state, step.attempts_used), (&in_flight, 1), "{}", b.name);
        // Nor is an attempt of another run finished under this run's lease.
        let third = NextAttempt { attempt: 3, ..next };
        let err = store.attempt_finished_then_starting(&lease, "nosuchrun", second, &failed, &waiting, &third);
        assert!(err.is_err(), "{}", b.name);
        assert_eq!(outcomes(reader.as_ref()), both, "{}", b.name);

        // A runner whose lease another took writes neither half.
        drop(held);
        let _taken = b.hold(&key, "host:2:b", Duration::from_secs(30), Duration::from_secs(10));
        let new = b.second().claim(&run.id, "host:2:b").unwrap();
        let store = b.store.as_mut();
        let err = store.attempt_finished_then_starting(&lease, &run.id, second, &failed, &waiting, &third).unwrap_err();
        assert!(matches!(err, StoreError::LeaseLost { .. } | StoreError::Fenced { .. }), "{}: {err}", b.name);
        let lost = [(1, AttemptState::Failed), (2, AttemptState::RunnerLost)];
        assert_eq!(outcomes(reader.as_ref()), lost, "{}: only the claim changed it", b.name);
        assert!(new.token > lease.token, "{}", b.name);
    }
}

/// A column that another host's newer waymark adds to `waymark_steps` (its migration) while this
/// store's connection is open does not break this store's next read of the steps: a prepared
/// `SELECT s.*` would ("cached plan must not change result type").
#[test]
fn a_column_another_host_adds_does_not_break_reading_the_steps() {
    let Some(db) = fresh_database("a_column_another_host_adds_does_not_break_reading_the_steps") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let flow = flow(dir.path(), "name = 'mig'\n[[step]]\nname = 'a'\nrun = ['true']\n");
    let timing = LeaseTiming { ttl: Duration::from_secs(30), renew: Duration::from_secs(10) };
    let key = lease_key(&FlowKey::named("mig"), host_id());
    let Leased::Taken(_held) = FlowLease::try_take(&db.config, &db.location, &key, "h:1:a", timing).unwrap() else {
        panic!("free")
    };
    let mut store = PgStore::open(&db.config, &db.location).unwrap();
    let (run, _lease) = store.create_run(&flow, "hash", "h:1:a").unwrap();
    assert_eq!(store.steps(&run.id).unwrap().len(), 1);
    let mut admin = db.config.connect(::postgres::NoTls).unwrap();
    admin.batch_execute("ALTER TABLE waymark_steps ADD COLUMN added_by_a_newer_waymark TEXT").unwrap();
    let steps = store.steps(&run.id);
    assert!(steps.is_ok(), "{}", steps.unwrap_err());
}

/// A lease about to expire is over, by the database's clock, even while nobody has taken it yet:
/// a write or a renewal that reaches the database with less left than the margin at which its
/// runner fences itself off (held up on its way by a connection that stopped answering, or a
/// runner that was stopped) is refused and changes nothing, instead of writing for a runner that
/// stopped, or bringing its lease back.
#[test]
fn a_write_or_renewal_that_arrives_when_the_lease_is_about_to_expire_is_refused() {
    let Some(db) = fresh_database("a_write_or_renewal_that_arrives_when_the_lease_is_about_to_expire_is_refused")
    else {
        return;
    };
    let (config, location) = (&db.config, &db.location);
    let dir = tempfile::tempdir().unwrap();
    let flow = flow(dir.path(), "name = 'late'\n[[step]]\nname = 'a'\nrun = ['true']\n");
    let key = lease_key(&FlowKey::named("late"), host_id());
    // A margin of 7.5 s.
    let timing = LeaseTiming { ttl: Duration::from_secs(30), renew: Duration::from_millis(100) };
    let Leased::Taken(held) = FlowLease::try_take(config, location, &key, "h:1:late", timing).unwrap() else {
        panic!("free")
    };
    let mut store = PgStore::open(config, location).unwrap();
    let (run, lease) = store.create_run(&flow, "hash", "h:1:late").unwrap();
    // The runner's own clock, just renewed, still holds: only the database can refuse.
    store.fenced_by(Arc::new(super::lease::LeaseClock::new(timing, std::time::Instant::now())));
    let mut admin = {
        let mut own = db.admin.clone();
        own.dbname(&db.name);
        own.connect(::postgres::NoTls).unwrap()
    };
    // 5 s left: less than the margin.
    admin.execute("UPDATE waymark_leases SET expires_at = clock_timestamp() + interval '5 seconds'", &[]).unwrap();
    let err = store.attempt_starting(&lease, &run.id, "a", 1, false, &dir.path().join("x")).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "run {id} in {location}: this runner (h:1:late) could not write in time: its lease was about to expire \
             when the write reached the database; it stopped, killing any attempt it had running, and nothing more \
             of the run is recorded by it; another runner may take the run over (`waymark status {id}` shows it)",
            id = run.id
        )
    );
    assert!(store.attempts(&run.id, None).unwrap().is_empty(), "nothing was written");
    // The renewer finds its lease about to expire: it does not bring it back, and the runner is
    // fenced off.
    common_wait("the renewer to find its lease about to expire", || held.clock().fenced().is_some());
    assert_eq!(
        held.clock().fenced().as_deref(),
        Some("could not renew its lease in time: it was about to expire when the renewal reached the database")
    );
    let left: f64 = admin
        .query_one("SELECT extract(epoch FROM expires_at - clock_timestamp())::float8 FROM waymark_leases", &[])
        .unwrap()
        .get(0);
    assert!(left < 5.0, "the late renewal did not bring the lease back: {left} s left");
}

fn common_wait(what: &str, mut done: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(60), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
