//! Durable runs: SIGKILL the runner at chosen points and resume; locking; resume, --fresh;
//! history, status, logs, gc; bad state.

mod common;

use common::{Env, alive, finish, have_root, iterations, kill, on_tmpfs_state, read_pid, stderr, wait_until};
use predicates::prelude::*;
use serde_json::Value;

fn json(env: &Env, args: &[&str]) -> Value {
    let out = env.cmd(args).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn rfc3339_secs(s: &str) -> f64 {
    let t = humantime::parse_rfc3339(s).unwrap();
    t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64()
}

#[test]
fn sigkill_during_an_attempt_resumes_without_rerunning_finished_steps() {
    let env = Env::new();
    env.write(
        "flow.toml",
        r#"name = "durable"
[[step]]
name = "a"
shell = "echo x >> a.log"
[[step]]
name = "b"
shell = 'echo x >> b.log; if [ $(wc -l < b.log) -ge 2 ]; then exit 0; fi; sleep 300 & echo $! > b.bg; wait'
retry = { attempts = 3 }
[[step]]
name = "c"
shell = "echo x >> c.log"
"#,
    );
    let _ = env.run_until("b.bg", "KILL");
    let orphan = read_pid(&env.path("b.bg"));
    assert!(alive(orphan), "the dead runner's attempt is still running");
    env.cmd(&["status", "durable"]).assert().success().stdout(predicate::str::contains("its runner is gone"));
    assert_eq!(json(&env, &["status", "durable", "--json"])["runner_alive"], false);
    let listed = stdout_of(&env, &["status", "durable", "--attempts"]);
    assert!(
        listed
            .lines()
            .any(|l| l.trim_start().starts_with("attempt 1: started ")
                && l.ends_with(", its runner died before it ended")),
        "{listed}"
    );
    // Its JSON says the same: lost, its end unknown, before a new runner has claimed the run.
    let attempt = &json(&env, &["status", "durable", "--attempts", "--json"])["steps"][1]["attempts"][0];
    assert_eq!((attempt["outcome"].as_str(), attempt["ended_at"].is_null()), (Some("runner_lost"), true), "{attempt}");

    env.cmd(&["run", "flow.toml"]).assert().success().stderr(
        predicate::str::contains("resuming run")
            .and(predicate::str::contains("1 of 3 steps done"))
            .and(predicate::str::contains("killed 2 leftover process(es) of attempt 1"))
            .and(predicate::str::is_match(r"(?m) waymark: b: attempt 1/3 started \(pid \d+, redelivered\)$").unwrap()),
    );
    assert!(!alive(orphan), "the in-flight attempt was killed before it was redelivered");
    assert_eq!((env.count("a.log"), env.count("b.log"), env.count("c.log")), (1, 2, 1));
    let status = json(&env, &["status", "durable", "--json"]);
    assert_eq!(status["status"], "succeeded");
    assert_eq!(status["steps"][1]["attempts_used"], 1, "a redelivered attempt uses no new attempt");
    // The number run again is listed once among those there are.
    let id = status["id"].as_str().unwrap();
    env.cmd(&["logs", id, "b", "--attempt", "2"])
        .assert()
        .code(2)
        .stderr(format!("error: step `b` of run {id} has no attempt 2; it has attempt 1\n"));
}

fn stdout_of(env: &Env, args: &[&str]) -> String {
    let out = env.cmd(args).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    String::from_utf8(out.stdout).unwrap()
}

/// `status --attempts` of a run whose runner lives: its attempt is running.
#[test]
fn status_lists_a_running_attempt_as_running() {
    let env = Env::new();
    env.write("flow.toml", "name = 'live'\n[[step]]\nname = 'a'\nshell = 'touch ready; exec sleep 300'\n");
    let runner = env.spawn(&["run", "flow.toml"]);
    wait_until("the attempt to be recorded as started", || env.path("ready").exists());
    let listed = stdout_of(&env, &["status", "live", "--attempts"]);
    let lines: Vec<&str> = listed.lines().map(str::trim_start).collect();
    assert!(lines.iter().any(|l| l.starts_with("attempt 1: started ") && l.ends_with(", running")), "{listed}");
    let attempts = &json(&env, &["status", "live", "--attempts", "--json"])["steps"][0]["attempts"];
    assert_eq!((attempts[0]["outcome"].as_str(), attempts[0]["ended_at"].is_null()), (Some("running"), true));
    kill(runner.id(), "TERM");
    let _ = finish(runner);
}

/// A step whose attempt was running when its runner was killed is not running: `status` shows it
/// `interrupted` (text and JSON), with a line saying that its attempt did not finish and runs
/// again on resume, as it says of a catch handler stopped with its runner.
#[test]
fn status_shows_a_step_whose_runner_died_mid_attempt_interrupted() {
    let env = Env::new();
    env.write("flow.toml", "name = 'dead'\n[[step]]\nname = 'a'\nshell = 'echo $$ > ready; exec sleep 300'\n");
    let _ = env.run_until("ready", "KILL");
    let leftover = read_pid(&env.path("ready"));
    kill(leftover, "KILL");
    let (text, _) = status_text(&env, "dead");
    let listed = common::normalise_times(&stdout_of(&env, &["status", "dead", "--attempts"]));
    assert_eq!(
        listed.lines().last(),
        Some(format!("{:22} attempt 1: started TIME, its runner died before it ended", "").as_str())
    );
    assert_eq!(
        text,
        format!(
            "run RUN of dead (PATH): running, but its runner is gone (`waymark resume RUN` resumes it), started TIME\n  \
             a                    interrupted  attempts 1/1  Ns\n  \
             {:20} attempt 1 did not finish: its runner died; it runs again on resume\n",
            ""
        )
    );
    let step = &json(&env, &["status", "--json"])["steps"][0];
    assert_eq!((step["state"].as_str(), step["attempts_used"].as_u64()), (Some("interrupted"), Some(1)), "{step}");
    // Resumed, it runs again, and so is running while its new runner lives.
    let runner = env.spawn(&["run", "flow.toml"]);
    wait_until("the attempt to run again", || {
        std::fs::read_to_string(env.path("ready")).is_ok_and(|p| p.trim().parse().is_ok_and(|p: u32| p != leftover))
    });
    assert_eq!(json(&env, &["status", "--json"])["steps"][0]["state"], "running");
    kill(runner.id(), "TERM");
    let _ = finish(runner);
}

/// An attempt made by an earlier runner of a run that a new runner has resumed is not running
/// because the run's runner lives again: until the new runner runs the step again (here it waits
/// for the one slot `--max-parallel 1` leaves, which the step before it in the file takes),
/// `status` shows it `interrupted` (text and JSON), with a line saying that the new runner runs it
/// again; the attempt the new runner started is running.
#[test]
fn status_shows_a_step_whose_attempt_died_with_an_earlier_runner_interrupted_while_the_run_is_resumed() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'resumed'\nmax_parallel = 2\n\
         [[step]]\nname = 'a'\nneeds = []\nshell = 'echo $$ >> a.pids; exec sleep 300'\n\
         [[step]]\nname = 'b'\nneeds = []\nshell = 'echo $$ >> b.pids; exec sleep 300'\n",
    );
    let first = env.spawn(&["run", "flow.toml"]);
    env.wait_for_lines("a.pids", 1);
    env.wait_for_lines("b.pids", 1);
    kill(first.id(), "KILL");
    let _ = finish(first);
    // The new runner runs `a` again, the first in the file, and `b` waits for its slot.
    let runner = env.spawn(&["run", "--max-parallel", "1", "flow.toml"]);
    env.wait_for_lines("a.pids", 2);
    let (text, st) = status_text(&env, "resumed");
    assert_eq!(st["runner_alive"], true, "{st}");
    assert_eq!(
        text,
        format!(
            "run RUN of resumed (PATH): running, started TIME\n  \
             a                    running      attempts 1/1  Ns\n  \
             b                    interrupted  attempts 1/1  Ns\n  \
             {:20} attempt 1 did not finish: its runner died; the run's new runner runs it again\n",
            ""
        )
    );
    let states: Vec<&str> = st["steps"].as_array().unwrap().iter().map(|s| s["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["running", "interrupted"], "{st}");
    let listed = common::normalise_status_durations(&common::normalise_times(&stdout_of(
        &env,
        &["status", "resumed", "--attempts"],
    )));
    assert_eq!(
        listed.lines().skip(1).collect::<Vec<_>>(),
        [
            "  a                    running      attempts 1/1  Ns",
            "                       attempt 1: started TIME, its runner died before it ended",
            "                       attempt 1 (redelivered): started TIME, running",
            "  b                    interrupted  attempts 1/1  Ns",
            "                       attempt 1 did not finish: its runner died; the run's new runner runs it again",
            "                       attempt 1: started TIME, its runner died before it ended",
        ],
        "{listed}"
    );
    kill(runner.id(), "TERM");
    let _ = finish(runner);
    // Stopped by the signal, the run is interrupted: `b` runs again on resume. Its attempt, which
    // died with its runner, still counts, as README says; the signal cancelled `a`'s redelivered
    // attempt, which does not (it runs again under its number). The line under `b` says what ended
    // its attempt, its runner's death, as `status --attempts` and `logs` do, not the interruption
    // of the runner after it (it said `the run was interrupted`).
    let (text, _) = status_text(&env, "resumed");
    assert_eq!(
        text.lines().skip(1).collect::<Vec<_>>(),
        [
            "  a                    interrupted  attempts 0/1  Ns",
            &format!("  {:20} attempt 1 did not finish: it was cancelled; it runs again on resume", ""),
            "  b                    interrupted  attempts 1/1  Ns",
            &format!("  {:20} attempt 1 did not finish: its runner died; it runs again on resume", ""),
        ],
        "{text}"
    );
    let listed = common::normalise_status_durations(&common::normalise_times(&stdout_of(
        &env,
        &["status", "resumed", "--attempts"],
    )));
    assert_eq!(
        listed.lines().skip(1).collect::<Vec<_>>(),
        [
            "  a                    interrupted  attempts 0/1  Ns",
            "                       attempt 1 did not finish: it was cancelled; it runs again on resume",
            "                       attempt 1: started TIME, its runner died before it ended",
            "                       attempt 1 (redelivered): started TIME, took DURATION: cancelled",
            "  b                    interrupted  attempts 1/1  Ns",
            "                       attempt 1 did not finish: its runner died; it runs again on resume",
            "                       attempt 1: started TIME, its runner died before it ended",
        ],
        "{listed}"
    );
}

/// The same for a catch handler: one that died with the first runner (SIGKILL) while its step's
/// new runner waits for a slot is not running, whatever the store says (`catching`): `status`
/// shows the step `interrupted`, its handler to be run again by the new runner; after a signal
/// stops that runner too, the handler still died with its runner.
#[test]
fn status_shows_a_step_whose_catch_handler_died_with_an_earlier_runner_interrupted_while_the_run_is_resumed() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'caught'\nmax_parallel = 2\n\
         [[step]]\nname = 'x'\nneeds = []\nshell = 'echo $$ >> x.pids; exec sleep 300'\n\
         [[step]]\nname = 'a'\nneeds = []\nshell = 'exit 3'\n\
         catch = [{ exception_types = ['CalledProcessError'], shell = 'echo $$ >> h.pids; exec sleep 300' }]\n",
    );
    let first = env.spawn(&["run", "flow.toml"]);
    env.wait_for_lines("x.pids", 1);
    env.wait_for_lines("h.pids", 1);
    kill(first.id(), "KILL");
    let _ = finish(first);
    // The new runner runs `x` again, the first in the file; `a`'s handler waits for the slot.
    let runner = env.spawn(&["run", "--max-parallel", "1", "flow.toml"]);
    env.wait_for_lines("x.pids", 2);
    let (text, st) = status_text(&env, "caught");
    assert_eq!(st["runner_alive"], true, "{st}");
    let error = format!(
        "  {:20} last error: CalledProcessError(SubprocessError, Exception, BaseException): exit status 3 [exit status]",
        ""
    );
    let under = format!("  {:20} its catch handler for CalledProcessError did not finish: its runner died;", "");
    assert_eq!(
        text.lines().skip(1).collect::<Vec<_>>(),
        [
            "  x                    running      attempts 1/1  Ns",
            "  a                    interrupted  attempts 1/1  Ns",
            &error,
            &format!("{under} the run's new runner runs it again"),
        ],
        "{text}"
    );
    let states: Vec<&str> = st["steps"].as_array().unwrap().iter().map(|s| s["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["running", "interrupted"], "{st}");
    kill(runner.id(), "TERM");
    let _ = finish(runner);
    let (text, _) = status_text(&env, "caught");
    assert_eq!(
        text.lines().skip(1).collect::<Vec<_>>(),
        [
            "  x                    interrupted  attempts 0/1  Ns",
            &format!("  {:20} attempt 1 did not finish: it was cancelled; it runs again on resume", ""),
            "  a                    interrupted  attempts 1/1  Ns",
            &error,
            &format!("{under} it runs again on resume"),
        ],
        "{text}"
    );
}

/// A run whose runner was SIGKILLed while steps `a`, `b` (it wrote a line to stdout) and `c` (it
/// wrote nothing) ran, resumed by a new runner with one slot: it runs `a` again, `b` and `c` wait
/// for the slot. Returns that runner, once `a` runs again.
fn resumed_with_two_steps_waiting(env: &Env) -> std::process::Child {
    env.write(
        "flow.toml",
        "name = 'resumed'\nmax_parallel = 3\n\
         [[step]]\nname = 'a'\nneeds = []\nshell = 'echo $$ >> a.pids; exec sleep 300'\n\
         [[step]]\nname = 'b'\nneeds = []\nshell = 'echo b says hi; echo $$ >> b.pids; exec sleep 300'\n\
         [[step]]\nname = 'c'\nneeds = []\nshell = 'echo $$ >> c.pids; exec sleep 300'\n",
    );
    let first = env.spawn(&["run", "flow.toml"]);
    for pids in ["a.pids", "b.pids", "c.pids"] {
        env.wait_for_lines(pids, 1);
    }
    kill(first.id(), "KILL");
    let _ = finish(first);
    let runner = env.spawn(&["run", "--progress", "plain", "--max-parallel", "1", "flow.toml"]);
    env.wait_for_lines("a.pids", 2);
    runner
}

/// `logs` of an attempt that died with an earlier runner of a resumed run says so, as before the
/// run was resumed and as `status` does (`its runner died`), whether the new runner still holds
/// the run or a signal stopped it since: the claim that made the new runner the run's recorded the
/// attempt `runner_lost`, and `logs` said of it only `wrote nothing to stdout or stderr`, as of an
/// attempt that ended. Of an attempt that wrote to one stream, the other one's line says it too.
#[test]
fn logs_of_an_attempt_that_died_with_an_earlier_runner_of_a_resumed_run_say_its_runner_died() {
    let env = Env::new();
    let runner = resumed_with_two_steps_waiting(&env);
    let run_id = json(&env, &["status", "resumed", "--json"])["id"].as_str().unwrap().to_owned();
    let logs = |step: &str, stream: Option<&str>| {
        let mut args = vec!["logs", "resumed", step];
        args.extend(stream.map(|s| ["--stream", s]).into_iter().flatten());
        let out = env.cmd(&args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        let stdout = String::from_utf8(out.stdout.clone()).unwrap();
        let stdout = stdout.replace(&env.state().display().to_string(), "STATE").replace(&run_id, "RUN");
        (stdout, stderr(&out))
    };
    let expected = [
        (
            ("c", None),
            "",
            "waymark: attempt 1 of step `c` wrote nothing to stdout or stderr (it did not finish: its runner died)\n",
        ),
        (
            ("b", None),
            "==> STATE/logs/RUN/b/attempt-1.stdout <==\nb says hi\n",
            "waymark: attempt 1 of step `b` wrote nothing to stderr (it did not finish: its runner died)\n",
        ),
        (("b", Some("stdout")), "b says hi\n", ""),
        (
            ("b", Some("stderr")),
            "",
            "waymark: attempt 1 of step `b` wrote nothing to stderr (it did not finish: its runner died)\n",
        ),
    ];
    let check = |when: &str| {
        for ((step, stream), out, err) in expected {
            assert_eq!(logs(step, stream), (out.to_owned(), err.to_owned()), "{when}: logs {step} {stream:?}");
        }
    };
    check("while the new runner holds the run");
    kill(runner.id(), "TERM");
    assert_eq!(finish(runner).status.code(), Some(143));
    check("once a signal stopped the new runner");
}

/// `logs` of a cancelled attempt that wrote nothing says that it was cancelled, as `status
/// --attempts` does (`took DURATION: cancelled`), and, of the step's last attempt
/// in an interrupted run, that it runs again on resume (it said only `wrote nothing to stdout or
/// stderr`, as of an attempt that ended of itself): `a`'s redelivered attempt in a resumed run
/// that a signal stopped; `b`'s attempt that a signal to the first runner cancelled, while a new
/// runner holds the run (it waits for a slot there) and once a signal stopped that runner too; and
/// one that `fail_fast` cancelled in a run that failed, which never runs again.
#[test]
fn logs_of_a_cancelled_attempt_that_wrote_nothing_say_it_was_cancelled() {
    let logs = |env: &Env, flow: &str, args: &[&str]| {
        let mut all = vec!["logs", flow];
        all.extend(args);
        let out = env.cmd(&all).output().unwrap();
        assert!(out.status.success(), "{all:?}: {}", stderr(&out));
        assert_eq!(String::from_utf8(out.stdout.clone()).unwrap(), "", "{all:?}");
        stderr(&out)
    };
    let env = Env::new();
    let runner = resumed_with_two_steps_waiting(&env);
    kill(runner.id(), "TERM");
    assert_eq!(finish(runner).status.code(), Some(143));
    assert_eq!(
        logs(&env, "resumed", &["a"]),
        "waymark: attempt 1 of step `a` wrote nothing to stdout or stderr (it was cancelled; it runs again on resume)\n"
    );
    assert_eq!(
        logs(&env, "resumed", &["a", "--attempt", "1", "--stream", "stderr"]),
        "waymark: attempt 1 of step `a` wrote nothing to stderr (it was cancelled; it runs again on resume)\n"
    );

    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'cut'\nmax_parallel = 2\n\
         [[step]]\nname = 'a'\nneeds = []\nshell = 'echo $$ >> a.pids; exec sleep 300'\n\
         [[step]]\nname = 'b'\nneeds = []\nshell = 'echo $$ >> b.pids; exec sleep 300'\n",
    );
    let first = env.spawn(&["run", "flow.toml"]);
    env.wait_for_lines("a.pids", 1);
    env.wait_for_lines("b.pids", 1);
    kill(first.id(), "TERM");
    assert_eq!(finish(first).status.code(), Some(143));
    let runner = env.spawn(&["run", "--max-parallel", "1", "flow.toml"]);
    env.wait_for_lines("a.pids", 2);
    // The new runner runs it again once it has a slot: nothing is said of when.
    assert_eq!(
        logs(&env, "cut", &["b"]),
        "waymark: attempt 1 of step `b` wrote nothing to stdout or stderr (it was cancelled)\n"
    );
    kill(runner.id(), "TERM");
    assert_eq!(finish(runner).status.code(), Some(143));
    assert_eq!(
        logs(&env, "cut", &["b"]),
        "waymark: attempt 1 of step `b` wrote nothing to stdout or stderr (it was cancelled; it runs again on resume)\n"
    );

    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'fast'\nfail_fast = true\n\
         [[step]]\nname = 'a'\nneeds = []\nshell = 'for i in $(seq 1200); do [ -s b.pid ] && break; sleep 0.05; done; exit 1'\n\
         [[step]]\nname = 'b'\nneeds = []\nshell = 'echo $$ > b.pid; exec sleep 300'\n",
    );
    assert_eq!(env.cmd(&["run", "flow.toml"]).output().unwrap().status.code(), Some(1));
    assert_eq!(json(&env, &["status", "fast", "--json"])["status"], "failed");
    assert_eq!(
        logs(&env, "fast", &["b"]),
        "waymark: attempt 1 of step `b` wrote nothing to stdout or stderr (it was cancelled)\n"
    );
}

/// The summary table that `out`, the plain output of a runner, ended with: its lines from the
/// header on, normalised as [`common::normalise_plain`] does.
fn summary_table(out: &std::process::Output) -> Vec<String> {
    let text = common::normalise_plain(&stderr(out));
    let table = text.lines().skip_while(|l| !l.contains("waymark: steps of run ")).skip(1);
    table.take_while(|l| l.starts_with("  ")).map(str::to_owned).collect()
}

/// A step that an earlier runner of the run left under way and that the resumed runner did not
/// run again before a signal stopped it (it waited for a slot) is `interrupted` in the runner's
/// summary table with the attempts it used, as `status` counts them: `1/1` for an attempt that
/// died with its runner, `0/1` for one that a signal cancelled (it was `not run` with `-`, while
/// `status` said `interrupted attempts 1/1`).
#[test]
fn the_summary_table_counts_a_step_left_under_way_by_an_earlier_runner_as_status_does() {
    let env = Env::new();
    let runner = resumed_with_two_steps_waiting(&env);
    kill(runner.id(), "TERM");
    let out = finish(runner);
    assert_eq!(out.status.code(), Some(143), "{}", stderr(&out));
    assert_eq!(
        summary_table(&out),
        [
            "  STEP  STATUS       ATTEMPTS    DURATION  DETAIL",
            "  a     interrupted       0/1    DURATION  runs again on resume",
            "  b     interrupted       1/1           -  runs again on resume",
            "  c     interrupted       1/1           -  runs again on resume",
        ]
    );
    let (text, _) = status_text(&env, "resumed");
    assert_eq!(
        text.lines().skip(1).collect::<Vec<_>>(),
        [
            "  a                    interrupted  attempts 0/1  Ns",
            "                       attempt 1 did not finish: it was cancelled; it runs again on resume",
            "  b                    interrupted  attempts 1/1  Ns",
            "                       attempt 1 did not finish: its runner died; it runs again on resume",
            "  c                    interrupted  attempts 1/1  Ns",
            "                       attempt 1 did not finish: its runner died; it runs again on resume",
        ],
        "{text}"
    );

    // Cut short by a signal to the first runner, `b` waits for the slot in the second.
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'cut'\nmax_parallel = 2\n\
         [[step]]\nname = 'a'\nneeds = []\nshell = 'echo $$ >> a.pids; exec sleep 300'\n\
         [[step]]\nname = 'b'\nneeds = []\nretry = { attempts = 3 }\nshell = 'echo $$ >> b.pids; exec sleep 300'\n",
    );
    let first = env.spawn(&["run", "flow.toml"]);
    env.wait_for_lines("a.pids", 1);
    env.wait_for_lines("b.pids", 1);
    kill(first.id(), "TERM");
    assert_eq!(finish(first).status.code(), Some(143));
    let runner = env.spawn(&["run", "--progress", "plain", "--max-parallel", "1", "flow.toml"]);
    env.wait_for_lines("a.pids", 2);
    kill(runner.id(), "TERM");
    let out = finish(runner);
    assert_eq!(out.status.code(), Some(143), "{}", stderr(&out));
    assert_eq!(
        summary_table(&out),
        [
            "  STEP  STATUS       ATTEMPTS    DURATION  DETAIL",
            "  a     interrupted       0/1    DURATION  runs again on resume",
            "  b     interrupted       0/3           -  runs again on resume",
        ]
    );
    let (text, _) = status_text(&env, "cut");
    assert_eq!(
        text.lines().skip(1).collect::<Vec<_>>(),
        [
            "  a                    interrupted  attempts 0/1  Ns",
            "                       attempt 1 did not finish: it was cancelled; it runs again on resume",
            "  b                    interrupted  attempts 0/3  Ns",
            "                       attempt 1 did not finish: it was cancelled; it runs again on resume",
        ],
        "{text}"
    );
}

/// The times recorded in `status --attempts --json` of a run (its start, and the starts and ends
/// of its steps and attempts).
fn recorded_times(v: &Value, into: &mut Vec<std::time::SystemTime>) {
    match v {
        Value::Object(map) => {
            for (key, value) in map {
                match value.as_str() {
                    Some(t) if key == "started_at" || key == "ended_at" => {
                        into.push(humantime::parse_rfc3339(t).unwrap())
                    }
                    _ => recorded_times(value, into),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| recorded_times(v, into)),
        _ => {}
    }
}

/// `history`'s duration of a run whose runner died does not grow while it sits without one: it
/// counts up to the last thing the run recorded (here the start of the attempt its runner died
/// in), however long ago that is.
#[test]
fn history_counts_a_run_whose_runner_died_up_to_the_last_thing_it_recorded() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'dead'\n[[step]]\nname = 'a'\nshell = 'sleep 1'\n\
         [[step]]\nname = 'b'\nshell = 'echo $$ > ready; exec sleep 300'\n",
    );
    let _ = env.run_until("ready", "KILL");
    kill(read_pid(&env.path("ready")), "KILL");
    let st = json(&env, &["status", "--attempts", "--json"]);
    let mut times = Vec::new();
    recorded_times(&st, &mut times);
    let start = humantime::parse_rfc3339(st["started_at"].as_str().unwrap()).unwrap();
    let last = times.into_iter().max().unwrap();
    // Long enough after the last record that a duration counted to now would be a second more.
    let later = last + std::time::Duration::from_millis(1500);
    wait_until("1.5s past the last record", || std::time::SystemTime::now() > later);
    let out = env.cmd(&["history"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    // To the millisecond under a minute, as the times are recorded.
    let took = humantime::format_duration(last.duration_since(start).unwrap()).to_string();
    let (id, started) = (st["id"].as_str().unwrap(), st["started_at"].as_str().unwrap());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().nth(1),
        Some(format!("{id:<10} {:<20} {:<12} {started:<21} {took:>10}  -", "dead", "runner gone").as_str())
    );
}

/// A run whose runner died is not made alive by a runner of another run of the same flow
/// holding the flow's lock (`waymark resume` of an older run).
#[test]
fn status_of_an_orphaned_run_says_its_runner_is_gone_while_another_run_of_its_flow_runs() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'two'\n[[step]]\nname = 'a'\nshell = '''\n\
         if [ -e phase3 ]; then echo $$ > p3; exec sleep 300; fi\n\
         if [ -e phase2 ]; then echo $$ > p2; exec sleep 300; fi\n\
         exit 1\n'''\n",
    );
    env.cmd(&["run", "-q", "flow.toml"]).assert().code(1);
    let first = json(&env, &["status", "--json"])["id"].as_str().unwrap().to_owned();
    env.write("phase2", "");
    let _ = env.run_until("p2", "KILL");
    let orphaned = json(&env, &["status", "--json"])["id"].as_str().unwrap().to_owned();
    let leftover = read_pid(&env.path("p2"));
    env.write("phase3", "");
    let resumed = env.spawn(&["resume", &first]);
    env.wait_for_lines("p3", 1);
    let status = json(&env, &["status", &orphaned, "--json"]);
    assert_eq!((status["status"].as_str(), status["runner_alive"].as_bool()), (Some("running"), Some(false)));
    env.cmd(&["status", &orphaned]).assert().success().stdout(predicate::str::contains("its runner is gone"));
    // The run resumed has its runner.
    assert_eq!(json(&env, &["status", &first, "--json"])["runner_alive"], true);
    // `history` says of each what `status` says: newest first, the orphaned run's runner is gone
    // (and stderr says how to resume it), the resumed run is running.
    let out = env.cmd(&["history", "two"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let shown = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<&str> = shown.lines().skip(1).map(|l| &l[..44]).collect();
    assert_eq!(
        rows,
        [
            format!("{orphaned:<10} {:<20} {:<12}", "two", "runner gone"),
            format!("{first:<10} {:<20} {:<12}", "two", "running")
        ],
        "{shown}"
    );
    assert_eq!(
        stderr(&out),
        format!(
            "waymark: run {orphaned} is running, but its runner is gone (`waymark resume {orphaned}` resumes it)\n"
        )
    );
    let listed = json(&env, &["history", "two", "--json"]);
    let alive: Vec<(&str, &str, bool)> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["id"].as_str().unwrap(), r["status"].as_str().unwrap(), r["runner_alive"].as_bool().unwrap()))
        .collect();
    assert_eq!(alive, [(orphaned.as_str(), "running", false), (first.as_str(), "running", true)]);
    kill(resumed.id(), "TERM");
    let _ = finish(resumed);
    kill(leftover, "KILL");
}

#[test]
fn sigkill_between_steps_resumes_at_the_next_step() {
    if !common::have_crash_hook("sigkill_between_steps_resumes_at_the_next_step") {
        return;
    }
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'between'\n[[step]]\nname = 'a'\nshell = 'echo x >> a.log'\n[[step]]\nname = 'b'\nshell = 'echo x >> b.log'\n\
         [[step]]\nname = 'c'\nshell = 'echo x >> c.log'\n",
    );
    // The runner kills itself with SIGKILL right after committing step a's success.
    let out = env.cmd(&["run", "flow.toml"]).env("WAYMARK_TEST_CRASH_AFTER", "a").output().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(9), "{}", stderr(&out));
    assert_eq!((env.count("a.log"), env.count("b.log")), (1, 0));
    env.cmd(&["run", "flow.toml"]).assert().success().stderr(
        predicate::str::contains("1 of 3 steps done")
            .and(predicate::str::contains("a: already succeeded"))
            .and(predicate::str::contains("redelivered").not()),
    );
    assert_eq!((env.count("a.log"), env.count("b.log"), env.count("c.log")), (1, 1, 1));
}

#[test]
fn sigkill_during_backoff_keeps_the_attempt_count_and_wake_up_time() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'backoff'\n[[step]]\nname = 'w'\nshell = 'date +%s.%N >> times; [ $(wc -l < times) -ge 2 ]'\nretry = { attempts = 3, backoff_seconds = 2 }\n",
    );
    let runner = env.spawn(&["run", "flow.toml"]);
    let mut wake = String::new();
    wait_until("the step to wait for its retry", || {
        let out = env.cmd(&["status", "backoff", "--json"]).output().unwrap();
        let Ok(v) = serde_json::from_slice::<Value>(&out.stdout) else { return false };
        if v["steps"][0]["state"] == "waiting" {
            wake = v["steps"][0]["next_retry_at"].as_str().unwrap().to_owned();
            true
        } else {
            false
        }
    });
    kill(runner.id(), "KILL");
    let _ = finish(runner);
    assert_eq!(env.count("times"), 1);

    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    let said = common::untimed(&stderr(&out));
    assert!(out.status.success(), "{said}");
    // The resumed runner's line for the wait it serves gives the budget, as the first one's did.
    assert!(said.lines().any(|l| l.starts_with("waymark: w: retry at ") && l.ends_with("): attempt 2/3")), "{said}");
    assert!(said.contains("w: attempt 2/3 started"), "{said}");
    let times: Vec<f64> = env.read("times").lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(times.len(), 2);
    assert!(times[1] - times[0] >= 2.0, "the backoff survived the runner: {times:?}");
    assert!(times[1] >= rfc3339_secs(&wake), "the retry waited for its recorded wake-up time");
}

const GATED: &str = "name = 'gated'\n[[step]]\nname = 'hold'\nshell = 'echo $$ > started; while [ ! -e release ]; do sleep 0.05; done'\n";

#[test]
fn one_runner_per_flow_exit_3_or_wait() {
    let env = Env::new();
    env.write("flow.toml", GATED);
    let first = env.spawn(&["run", "flow.toml"]);
    env.wait_for_lines("started", 1);
    let pid = first.id().to_string();
    let hint = "hint: give the same command `--wait` to wait for it, or see `waymark status`\n";
    env.cmd(&["run", "flow.toml"]).assert().code(3).stderr(
        predicate::str::contains("flow `gated` is already running: run ")
            .and(predicate::str::contains(format!(", by pid {pid} since ")))
            .and(predicate::str::ends_with(hint)),
    );
    // `waymark resume` of the run says the same: it waits with `--wait` too.
    let run_id = json(&env, &["status", "gated", "--json"])["id"].as_str().unwrap().to_owned();
    env.cmd(&["resume", &run_id]).assert().code(3).stderr(predicate::str::ends_with(hint));
    let (waiter, said) = env.spawn_watched(&["run", "--wait", "flow.toml"]);
    wait_until("the second runner to wait for the lock", || said.lock().unwrap().contains("waiting for it to finish"));
    assert_eq!(env.count("started"), 1, "the waiting runner has not started anything");
    env.write("release", "");
    let out = finish(first);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = finish(waiter);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let runs = json(&env, &["history", "gated", "--json"]);
    assert_eq!(runs.as_array().unwrap().len(), 2);
}

/// A runner that finds `waymark gc` holding its flow's lock waits for it, with or without
/// `--wait`; when gc takes long (stopped, or deleting thousands of runs), it says so after 2 s,
/// naming gc, instead of waiting without a word; once gc lets go, it runs the flow.
#[test]
fn a_runner_held_up_by_gc_says_whom_it_waits_for() {
    let env = Env::new();
    env.write("flow.toml", "name = 'swept'\n[[step]]\nname = 'a'\nshell = 'echo x >> ran'\n");
    env.cmd(&["run", "flow.toml"]).assert().success();
    // The lock as a gc holds it (gc's own lock of the flow, while it deletes its runs).
    let lock = std::fs::OpenOptions::new().write(true).open(env.state().join("locks/swept.lock")).unwrap();
    lock.lock().unwrap();
    std::fs::write(env.state().join("locks/swept.lock"), "waymark gc, pid 4242 since 2026-12-05T00:00:00Z\n").unwrap();
    let (runner, said) = env.spawn_watched(&["run", "flow.toml"]);
    wait_until("the runner to say whom it waits for", || said.lock().unwrap().contains("waiting for it to finish"));
    assert_eq!(env.count("ran"), 1, "nothing ran while gc held the lock");
    drop(lock);
    let out = finish(runner);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(env.count("ran"), 2);
    let said = said.lock().unwrap().clone();
    let line = said.lines().find(|l| l.contains("waiting")).unwrap_or_default();
    assert!(
        line.ends_with(
            "waymark: flow `swept` is locked by waymark gc, pid 4242 since 2026-12-05T00:00:00Z, deleting its old \
             runs; waiting for it to finish"
        ),
        "{said}"
    );
}

/// `waymark gc` killed at any moment leaves no logs that no run owns: it deletes a run's logs
/// before its rows, so what a killed gc left is a run (without some of its logs), which the next
/// gc deletes, never a directory under `logs/` that no gc would find again.
#[test]
fn a_gc_killed_midway_leaves_no_logs_without_a_run() {
    let env = Env::new();
    env.write("flow.toml", "name = 'swept'\n[[step]]\nname = 'a'\nshell = 'echo hi; echo ho >&2'\n");
    for _ in 0..200 {
        env.cmd(&["run", "-q", "flow.toml"]).assert().success();
    }
    let dirs = |state: &std::path::Path| -> Vec<String> {
        let mut dirs: Vec<String> = std::fs::read_dir(state.join("logs"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        dirs.sort();
        dirs
    };
    for trial in 0..iterations(6, 20) {
        let copy = env.path(&format!("copy-{trial}"));
        assert!(std::process::Command::new("cp").arg("-a").arg(env.state()).arg(&copy).status().unwrap().success());
        let in_copy = |args: &[&str]| {
            let mut c = env.cmd(args);
            c.env("WAYMARK_STATE_DIR", &copy);
            c
        };
        let gc = std::process::Command::new(assert_cmd::cargo::cargo_bin("waymark"))
            .args(["gc", "--older-than", "0s"])
            .env("WAYMARK_STATE_DIR", &copy)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(10 + (15 * trial as u64) % 120));
        kill(gc.id(), "KILL");
        let _ = finish(gc);
        let out = in_copy(&["history", "--json", "--limit", "1000"]).output().unwrap();
        let runs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let mut ids: Vec<String> =
            runs.as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_owned()).collect();
        ids.sort();
        let orphans: Vec<String> = dirs(&copy).into_iter().filter(|d| !ids.contains(d)).collect();
        assert!(orphans.is_empty(), "trial {trial}: logs of no run: {orphans:?} ({} runs left)", ids.len());
        // The next gc deletes what is left, logs and all.
        in_copy(&["gc", "--older-than", "0s"]).assert().success();
        assert_eq!(dirs(&copy), Vec::<String>::new(), "trial {trial}");
    }
}

/// A log that `waymark gc` cannot delete (here an immutable file, `chattr +i`) keeps its run: gc
/// warns, naming the directory and that the run is kept, deletes the other runs, and the next gc,
/// once the file can go, deletes the run and its logs. (It deleted the run and left its logs to
/// no one.)
#[test]
fn a_log_gc_cannot_delete_keeps_its_run_for_the_next_gc() {
    if !have_root("a_log_gc_cannot_delete_keeps_its_run_for_the_next_gc", "chattr +i") {
        return;
    }
    let env = Env::new();
    env.write("flow.toml", "name = 'stuck'\n[[step]]\nname = 'a'\nshell = 'echo hi'\n");
    for _ in 0..2 {
        env.cmd(&["run", "-q", "flow.toml"]).assert().success();
    }
    let history = |env: &Env| -> Vec<String> {
        let out = env.cmd(&["history", "--json"]).output().unwrap();
        let runs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        runs.as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_owned()).collect()
    };
    let ids = history(&env);
    let log = env.state().join(format!("logs/{}/a/attempt-1.stdout", ids[0]));
    let chattr = |flag: &str| std::process::Command::new("chattr").arg(flag).arg(&log).status().unwrap().success();
    assert!(chattr("+i"), "chattr +i {}", log.display());
    let out = env.cmd(&["gc", "--older-than", "0s"]).output().unwrap();
    let said = stderr(&out);
    assert!(chattr("-i"));
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert_eq!(
        said,
        format!(
            "waymark: warning: cannot delete {}: Operation not permitted (os error 1); run {id} is kept, and the next \
             gc deletes it and them once it can\nwaymark: deleted 1 finished run(s) older than 0s\n",
            env.state().join(format!("logs/{}", ids[0])).display(),
            id = ids[0]
        )
    );
    assert_eq!(history(&env), [ids[0].clone()]);
    env.cmd(&["gc", "--older-than", "0s"]).assert().success();
    assert!(history(&env).is_empty());
    assert_eq!(std::fs::read_dir(env.state().join("logs")).unwrap().count(), 0);
}

#[test]
fn fresh_abandons_an_interrupted_run() {
    let env = Env::new();
    env.write("flow.toml", GATED);
    assert_eq!(env.run_until("started", "TERM").status.code(), Some(143));
    env.write("release", "");
    env.cmd(&["run", "--fresh", "flow.toml"])
        .assert()
        .success()
        .stderr(predicate::str::contains("abandoned unfinished run"));
    let runs = json(&env, &["history", "--json"]);
    assert_eq!(runs[0]["status"], "succeeded");
    assert_eq!(runs[1]["status"], "abandoned");
    assert!(runs[1]["ended_at"].is_string());
}

#[test]
fn resume_of_a_failed_run_gives_the_failed_step_a_fresh_budget() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'gate'\n[[step]]\nname = 'first'\nshell = 'echo x >> first.log'\n[[step]]\nname = 'gate'\nshell = 'echo x >> gate.log; [ -e open ]'\nretry = { attempts = 2 }\n",
    );
    env.cmd(&["run", "flow.toml"]).assert().code(1);
    let runs = json(&env, &["history", "--json"]);
    assert_eq!(runs[0]["status"], "failed");
    assert_eq!(runs[0]["failed_step"], "gate");
    let id = runs[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(env.count("gate.log"), 2);

    // A failed run is not resumed by `run`, only by `resume`.
    env.write("open", "");
    env.cmd(&["resume", &id]).assert().success().stderr(predicate::str::contains("gate: attempt 3/4"));
    assert_eq!((env.count("first.log"), env.count("gate.log")), (1, 3));
    let status = json(&env, &["status", &id, "--json"]);
    assert_eq!(status["status"], "succeeded");
    assert_eq!(status["steps"][1]["attempts_used"], 3);
    assert_eq!(status["steps"][1]["attempts_allowed"], 4);
    assert_eq!(status["steps"][1]["attempts_before_budget"], 2);
    env.cmd(&["resume", &id]).assert().success().stderr(predicate::str::contains("already succeeded"));
    // An unknown id: where it was looked for, and how to list what is there.
    let dir = std::fs::canonicalize(env.state()).unwrap();
    env.cmd(&["resume", "nosuchid"]).assert().code(2).stdout("").stderr(format!(
        "error: no run with id `nosuchid` in the state directory {}; `waymark history` lists the runs kept there, \
         `--state-dir DIR` looks in another\n",
        dir.display()
    ));
    // A directory given by an option is named in the command that lists its runs (a state
    // directory: one that holds a database, here an empty one).
    let other = env.path("other");
    std::fs::create_dir(&other).unwrap();
    env.write("other/waymark.db", "");
    let other = std::fs::canonicalize(other).unwrap().display().to_string();
    env.cmd(&["resume", "--state-dir", &other, "nosuchid"]).assert().code(2).stdout("").stderr(format!(
        "error: no run with id `nosuchid` in the state directory {other}; `waymark history --state-dir {other}` \
         lists the runs kept there\n"
    ));
}

/// After `waymark resume` of a failed run, `status` counts the attempts of the step's fresh
/// budget as the failure report does, and says how many came before it.
#[test]
fn status_counts_a_resumed_steps_attempts_of_its_fresh_budget_as_the_report_does() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'again'\n[[step]]\nname = 'gate'\nshell = 'echo x >> gate.log; exit 1'\nretry = { attempts = 2 }\n",
    );
    env.cmd(&["run", "--quiet", "flow.toml"]).assert().code(1);
    let id = json(&env, &["history", "--json"])[0]["id"].as_str().unwrap().to_owned();
    let out = env.cmd(&["resume", "--quiet", &id]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).lines().any(|l| l == "    budget spent: 2 of 2 attempts"), "{}", stderr(&out));
    assert_eq!(env.count("gate.log"), 4);
    let (text, _) = status_text(&env, "again");
    assert_eq!(
        text,
        format!(
            "run RUN of again (PATH): failed, started TIME, ended TIME\n  \
             gate                 failed     attempts 2/2 (+2 before resume)  Ns\n  \
             {:20} last error: CalledProcessError(SubprocessError, Exception, BaseException): exit status 1 [exit \
             status]\n",
            ""
        )
    );
}

#[test]
fn a_changed_flow_file_resumes_with_the_recorded_definition() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'edit'\n[[step]]\nname = 'one'\nshell = 'echo old1 >> out'\n[[step]]\nname = 'two'\nshell = 'echo $$ > started; while [ ! -e release ]; do sleep 0.05; done; echo old2 >> out'\n",
    );
    assert_eq!(env.run_until("started", "INT").status.code(), Some(130));
    env.write("flow.toml", "name = 'edit'\n[[step]]\nname = 'one'\nshell = 'echo new1 >> out'\n[[step]]\nname = 'two'\nshell = 'echo new2 >> out'\n");
    env.write("release", "");
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let id = json(&env, &["history", "--json"])[0]["id"].as_str().unwrap().to_owned();
    let said = common::untimed(&stderr(&out));
    let notices: Vec<&str> = said.lines().filter(|l| l.contains("changed since")).collect();
    // As `waymark resume ID` says it.
    assert_eq!(
        notices,
        [format!(
            "waymark: flow.toml changed since run {id} started; resuming with the definition recorded then (`waymark \
             run --fresh flow.toml` starts over with the new one)"
        )]
    );
    assert_eq!(env.read("out"), "old1\nold2\n");
}

/// `waymark resume ID` of a run whose file was edited since (most often: fixed after the failure
/// that the report said to resume) says so, as `waymark run` does, and goes on as recorded.
#[test]
fn resume_of_a_run_whose_file_changed_says_so_and_goes_on_as_recorded() {
    let env = Env::new();
    env.write("flow.toml", "name = 'fixed'\n[[step]]\nname = 'one'\nshell = 'echo old >> out; exit 4'\n");
    assert_eq!(env.cmd(&["run", "--quiet", "flow.toml"]).output().unwrap().status.code(), Some(1));
    let id = json(&env, &["history", "--json"])[0]["id"].as_str().unwrap().to_owned();
    env.write("flow.toml", "name = 'fixed'\n[[step]]\nname = 'one'\nshell = 'echo new >> out'\n");
    let out = env.cmd(&["resume", &id]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let said = common::untimed(&common::stderr(&out));
    let path = std::fs::canonicalize(env.path("flow.toml")).unwrap();
    let notice = format!(
        "waymark: {} changed since run {id} started; resuming with the definition recorded then (`waymark run \
         --fresh {}` starts over with the new one)\n",
        path.display(),
        path.display()
    );
    assert!(said.contains(&notice), "{said}");
    assert_eq!(env.read("out"), "old\nold\n", "the recorded definition ran");
    // As it was when the run started, nothing is said.
    env.write("flow.toml", "name = 'fixed'\n[[step]]\nname = 'one'\nshell = 'echo old >> out; exit 4'\n");
    let out = env.cmd(&["resume", &id]).output().unwrap();
    assert!(!common::stderr(&out).contains("changed since run"), "{}", common::stderr(&out));
}

/// A flow file saved with CRLF line endings is the same flow as with LF: its multi-line `shell`
/// script has no CR at the end of its lines (it made a directory `out\r` and then failed), `check`
/// prints the same plan, and resuming its run says nothing of an edit that did not happen.
#[test]
fn a_flow_file_with_crlf_line_endings_is_the_flow_it_is_with_lf() {
    let env = Env::new();
    let lf = "name = 'crlf'\n[[step]]\nname = 'a'\nshell = \"\"\"\nmkdir -p out\necho done > out/flag\n\"\"\"\n\
              [[step]]\nname = 'b'\nshell = '[ -e go ]'\n";
    env.write("lf.toml", lf);
    env.write("flow.toml", &lf.replace('\n', "\r\n"));
    let plan = |file: &str| String::from_utf8(env.cmd(&["check", file]).output().unwrap().stdout).unwrap();
    assert_eq!(plan("flow.toml").replace("flow.toml", "F"), plan("lf.toml").replace("lf.toml", "F"));
    assert_eq!(env.cmd(&["run", "--quiet", "flow.toml"]).output().unwrap().status.code(), Some(1));
    assert_eq!(env.read("out/flag"), "done\n");
    let id = json(&env, &["history", "--json"])[0]["id"].as_str().unwrap().to_owned();
    env.write("go", "");
    let out = env.cmd(&["resume", &id]).output().unwrap();
    let said = common::stderr(&out);
    let notices: Vec<&str> = said.lines().filter(|l| l.contains("changed since")).collect();
    assert_eq!((out.status.code(), notices), (Some(0), vec![]), "{said}");
}

#[test]
fn history_status_logs_and_gc() {
    let env = Env::new();
    env.write("flow.toml", "name = 'obs'\n[[step]]\nname = 'say'\nshell = 'echo attempt $WAYMARK_ATTEMPT; echo oops >&2; [ $WAYMARK_ATTEMPT -ge 2 ]'\nretry = { attempts = 2 }\n");
    env.cmd(&["run", "flow.toml"]).assert().success();
    let runs = json(&env, &["history", "--json"]);
    let run = &runs[0];
    for key in ["id", "flow", "status", "started_at", "ended_at", "failed_step"] {
        assert!(run.get(key).is_some(), "history --json has `{key}`");
    }
    let id = run["id"].as_str().unwrap().to_owned();
    env.cmd(&["history"])
        .assert()
        .success()
        .stdout(predicate::str::contains(&id).and(predicate::str::contains("succeeded")));
    env.cmd(&["status", &id]).assert().success().stdout(
        predicate::str::contains("say")
            .and(predicate::str::contains("attempts 2/2"))
            .and(predicate::str::contains("CalledProcessError")),
    );
    env.cmd(&["logs", &id, "say"])
        .assert()
        .success()
        .stdout(predicate::str::contains("attempt 2\n").and(predicate::str::contains("oops")));
    env.cmd(&["logs", &id, "say", "--attempt", "1", "--stream", "stdout"]).assert().success().stdout("attempt 1\n");
    env.cmd(&["logs", &id, "nope"]).assert().code(2).stderr(predicate::str::contains("its steps are: say"));

    // Log files are private; the state directory too.
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&env.state()), 0o700);
    assert_eq!(mode(&env.state().join("logs").join(&id).join("say").join("attempt-1.stdout")), 0o600);

    env.cmd(&["gc", "--older-than", "1h"]).assert().success();
    assert_eq!(json(&env, &["history", "--json"]).as_array().unwrap().len(), 1, "a recent run is kept");
    env.cmd(&["gc", "--older-than", "0s"]).assert().success().stderr(predicate::str::contains("deleted 1"));
    assert_eq!(json(&env, &["history", "--json"]), Value::Array(vec![]));
    assert!(!env.state().join("logs").join(&id).exists());
}

#[test]
fn a_corrupt_database_exits_4_and_names_the_file() {
    let env = Env::new();
    env.write("flow.toml", "[[step]]\nname = 'a'\nrun = ['touch', 'ran']\n");
    env.write("state/waymark.db", &"garbage ".repeat(1000));
    env.cmd(&["run", "flow.toml"])
        .assert()
        .code(4)
        .stderr(predicate::str::contains("waymark.db").and(predicate::str::contains("not a waymark database")));
    assert!(!env.path("ran").exists());
    env.cmd(&["history"]).assert().code(4);
}

#[test]
fn a_newer_schema_exits_4() {
    let env = Env::new();
    env.write("flow.toml", "[[step]]\nname = 'a'\nrun = ['true']\n");
    env.cmd(&["run", "flow.toml"]).assert().success();
    let db = rusqlite::Connection::open(env.state().join("waymark.db")).unwrap();
    db.pragma_update(None, "user_version", 99).unwrap();
    drop(db);
    env.cmd(&["run", "flow.toml"]).assert().code(4).stderr(predicate::str::contains("newer waymark"));
}

#[test]
fn an_unusable_state_directory_exits_4() {
    let env = Env::new();
    env.write("flow.toml", "[[step]]\nname = 'a'\nrun = ['touch', 'ran']\n");
    env.write("file", "");
    env.cmd(&["--state-dir", "file/state", "run", "flow.toml"]).assert().code(4).stderr(
        predicate::str::contains("cannot create the state directory").and(predicate::str::contains("--state-dir")),
    );
    assert!(!env.path("ran").exists());
}

/// A state directory that is a file: `run` says so, and the commands that read one name the error
/// once (the system's words are not repeated after the advice).
#[test]
fn a_state_directory_that_is_a_file_is_said_once_and_plainly() {
    let env = Env::new();
    env.write("flow.toml", "[[step]]\nname = 'a'\nrun = ['touch', 'ran']\n");
    env.write("file", "");
    let dir = env.dir.path().canonicalize().unwrap();
    let said = |args: &[&str]| {
        let out = env.cmd(args).output().unwrap();
        (out.status.code(), stderr(&out).replace(dir.to_str().unwrap(), "DIR"))
    };
    assert_eq!(
        said(&["--state-dir", "file", "run", "flow.toml"]),
        (
            Some(4),
            "error: cannot use DIR/file as the state directory: something other than a directory (a file, a link) \
             is at that path; choose another with --state-dir or WAYMARK_STATE_DIR\n"
                .to_owned()
        )
    );
    let unusable = "error: cannot open the state directory DIR/file: Not a directory (os error 20); choose another \
                    state directory with --state-dir or WAYMARK_STATE_DIR\n";
    for command in ["history", "status"] {
        assert_eq!(said(&["--state-dir", "file", command]), (Some(4), unusable.to_owned()), "{command}");
    }
    assert!(!env.path("ran").exists());
}

/// Makes a directory tree read-only, even for root (with `chattr +i`), until dropped.
struct ReadOnly(Vec<std::path::PathBuf>);

impl ReadOnly {
    fn new(root: &std::path::Path) -> ReadOnly {
        let mut paths = vec![root.to_owned()];
        let mut i = 0;
        while i < paths.len() {
            if paths[i].is_dir() {
                for e in std::fs::read_dir(&paths[i]).unwrap() {
                    paths.push(e.unwrap().path());
                }
            }
            i += 1;
        }
        let is_root = std::process::Command::new("id").arg("-u").output().unwrap().stdout == b"0\n";
        for p in paths.iter().rev() {
            let ok = if is_root {
                std::process::Command::new("chattr").arg("+i").arg(p).status().unwrap().success()
            } else {
                let mode = if p.is_dir() { "0500" } else { "0400" };
                std::process::Command::new("chmod").arg(mode).arg(p).status().unwrap().success()
            };
            assert!(ok, "cannot make {} read-only", p.display());
        }
        ReadOnly(paths)
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::process::Command::new("chattr").arg("-i").arg(p).status();
            let _ = std::process::Command::new("chmod").arg("u+w").arg(p).status();
        }
    }
}

#[test]
fn a_read_only_state_directory_exits_4_and_runs_nothing() {
    let env = Env::new();
    env.write("flow.toml", "name = 'ro'\n[[step]]\nname = 'a'\nshell = 'echo x >> ran'\n");
    env.cmd(&["run", "flow.toml"]).assert().success();
    let guard = ReadOnly::new(&env.state());
    let out = env.cmd(&["run", "--fresh", "flow.toml"]).output().unwrap();
    drop(guard);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(stderr(&out).contains(env.state().to_str().unwrap()), "{}", stderr(&out));
    assert_eq!(env.count("ran"), 1, "nothing ran");
    // Once writable again, the state is intact and usable.
    env.cmd(&["history", "ro", "--json"]).assert().success().stdout(predicate::str::contains("succeeded"));
}

#[test]
fn a_full_disk_stops_the_run_with_4_and_it_resumes_once_space_is_back() {
    if !have_root("a_full_disk_stops_the_run_with_4_and_it_resumes_once_space_is_back", "mounts a tmpfs") {
        return;
    }
    let env = Env::new();
    // The first attempt of `fill` fills the state directory's disk; its outcome cannot be
    // recorded, so waymark stops with 4. With space back, the run resumes: `fill` is redelivered
    // (its outcome was never committed), `two` runs once.
    env.write(
        "flow.toml",
        "name = 'full'\n[[step]]\nname = 'fill'\nshell = 'echo x >> fill.log; if [ $(wc -l < fill.log) -eq 1 ]; then dd if=/dev/zero of=\"$WAYMARK_STATE_DIR/filler\" bs=4k 2>/dev/null; fi; true'\n\
         [[step]]\nname = 'two'\nshell = 'echo x >> two.log'\n",
    );
    on_tmpfs_state(
        &env,
        "$WAYMARK run flow.toml 2> first.err; echo $? > first.code; \
         rm -f state/filler; $WAYMARK run flow.toml 2> second.err; echo $? > second.code",
    );
    assert_eq!(env.read("first.code").trim(), "4", "{}", env.read("first.err"));
    assert!(env.read("first.err").contains("free space"), "{}", env.read("first.err"));
    assert_eq!(env.read("second.code").trim(), "0", "{}", env.read("second.err"));
    assert!(env.read("second.err").contains("resuming run"), "{}", env.read("second.err"));
    assert_eq!((env.count("fill.log"), env.count("two.log")), (2, 1));
}

#[test]
fn a_database_locked_for_too_long_exits_4() {
    let env = Env::new();
    env.write("flow.toml", "name = 'busy'\n[[step]]\nname = 'a'\nshell = 'echo x >> ran'\n");
    env.cmd(&["run", "flow.toml"]).assert().success();
    let db = rusqlite::Connection::open(env.state().join("waymark.db")).unwrap();
    db.execute_batch("BEGIN EXCLUSIVE").unwrap();
    // waymark waits (10 s) for the write lock, then gives up without running anything.
    env.cmd(&["run", "flow.toml"])
        .assert()
        .code(4)
        .stderr(predicate::str::contains("database is locked").and(predicate::str::contains("holds")));
    db.execute_batch("ROLLBACK").unwrap();
    assert_eq!(env.count("ran"), 1);
    env.cmd(&["run", "flow.toml"]).assert().success();
    assert_eq!(env.count("ran"), 2);
}

/// Only `run` creates the state directory: the commands that find nothing in one that does not
/// exist (`resume` and `gc` too, which write) create nothing, and say that it does not exist.
#[test]
fn looking_creates_no_state() {
    let env = Env::new();
    let nowhere =
        format!("the state directory {} does not exist, so no run was ever recorded there", env.state().display());
    let elsewhere = "`--state-dir DIR` (or WAYMARK_STATE_DIR) looks in another";
    env.cmd(&["history"]).assert().success().stdout("").stderr(format!("no runs yet: {nowhere}; {elsewhere}\n"));
    env.cmd(&["history", "nightly"])
        .assert()
        .success()
        .stdout("")
        .stderr(format!("no runs yet of flow `nightly`: {nowhere}; {elsewhere}\n"));
    env.cmd(&["history", "--json"]).assert().success().stdout("[]\n");
    env.cmd(&["status"])
        .assert()
        .code(2)
        .stdout("")
        .stderr(format!("error: there are no runs yet: {nowhere}; `waymark run FLOW` starts one, {elsewhere}\n"));
    let flow = env.write("flow.toml", "[[step]]\nname = 'a'\nrun = ['true']\n");
    env.cmd(&["status", "flow.toml"]).assert().code(2).stdout("").stderr(format!(
        "error: no runs of the flow file {}: {nowhere}; `waymark run flow.toml` starts one, {elsewhere}\n",
        flow.display()
    ));
    // A state directory an option chose: the run it suggests is in that directory too.
    let other = env.path("other");
    env.cmd(&["status", "flow.toml", "--state-dir", "other"]).assert().code(2).stdout("").stderr(format!(
        "error: no runs of the flow file {}: the state directory {dir} does not exist, so no run was ever recorded \
         there; `waymark run --state-dir {dir} flow.toml` starts one, {elsewhere}\n",
        flow.display(),
        dir = other.display()
    ));
    let missing = |what: &str| {
        format!(
            "error: {what}: the state directory {} does not exist, so no run was ever recorded there; `--state-dir \
             DIR` (or WAYMARK_STATE_DIR) looks in another\n",
            env.state().display()
        )
    };
    let unknown = missing("no run with id `abc` and no runs of a flow named `abc`");
    env.cmd(&["logs", "abc", "s"]).assert().code(2).stdout("").stderr(unknown.clone());
    env.cmd(&["status", "abc"]).assert().code(2).stdout("").stderr(unknown);
    env.cmd(&["resume", "abc"]).assert().code(2).stdout("").stderr(missing("no run with id `abc`"));
    env.cmd(&["gc", "--older-than", "0s"]).assert().success().stdout("").stderr(format!(
        "waymark: deleted no runs: the state directory {} does not exist, so no run was ever recorded there\n",
        env.state().display()
    ));
    assert!(!env.state().exists());
}

/// `resume` and `gc` in a directory that is not a state directory (one without a state database:
/// empty, or holding other files) say so and create nothing in it; `run` makes it one.
#[test]
fn a_directory_that_is_not_a_state_directory_is_left_as_it_was() {
    let env = Env::new();
    env.write("state/notes.txt", "mine\n");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(env.state(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let dir = std::fs::canonicalize(env.state()).unwrap();
    let not_one = format!(
        "{} is not a state directory (it holds no waymark.db), so no run was ever recorded there",
        dir.display()
    );
    env.cmd(&["resume", "abcdefgh"]).assert().code(2).stdout("").stderr(format!(
        "error: no run with id `abcdefgh`: {not_one}; `--state-dir DIR` (or WAYMARK_STATE_DIR) looks in another\n"
    ));
    env.cmd(&["gc", "--older-than", "0"])
        .assert()
        .success()
        .stdout("")
        .stderr(format!("waymark: deleted no runs: {not_one}\n"));
    env.cmd(&["status"]).assert().code(2).stdout("").stderr(format!(
        "error: there are no runs yet: {not_one}; `waymark run FLOW` starts one, `--state-dir DIR` (or \
         WAYMARK_STATE_DIR) looks in another\n"
    ));
    let entries = || -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(env.state()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        names
    };
    assert_eq!(entries(), ["notes.txt"], "nothing created");
    env.write("flow.toml", "[[step]]\nname = 'a'\nrun = ['true']\n");
    env.cmd(&["run", "flow.toml"]).assert().success();
    assert!(entries().contains(&"waymark.db".to_owned()), "run makes it a state directory: {:?}", entries());
    env.cmd(&["gc", "--older-than", "0"])
        .assert()
        .success()
        .stderr("waymark: deleted 1 finished run(s) older than 0s\n");
}

/// A state directory chosen by the store URL (`WAYMARK_STORE=sqlite:DIR`) is named with what
/// chose it, and WAYMARK_STATE_DIR, which it overrides, is not offered to look elsewhere.
#[test]
fn a_state_directory_chosen_by_the_store_url_says_so() {
    let env = Env::new();
    let chosen = env.path("chosen");
    let url = format!("sqlite:{}", chosen.display());
    env.cmd(&["status"]).env("WAYMARK_STORE", &url).assert().code(2).stdout("").stderr(format!(
        "error: there are no runs yet: the state directory {} (chosen by WAYMARK_STORE) does not exist, so no run \
         was ever recorded there; `waymark run FLOW` starts one, `--state-dir DIR` looks in another\n",
        chosen.display()
    ));
    env.cmd(&["history", "--store", &url]).assert().success().stdout("").stderr(format!(
        "no runs yet: the state directory {} (chosen by --store) does not exist, so no run was ever recorded \
         there; `--state-dir DIR` looks in another\n",
        chosen.display()
    ));
    // A `--state-dir` wins over the store URL: the message is the usual one.
    env.cmd(&["history", "--state-dir", "other"]).env("WAYMARK_STORE", &url).assert().success().stderr(format!(
        "no runs yet: the state directory {} does not exist, so no run was ever recorded there; `--state-dir DIR` \
         (or WAYMARK_STATE_DIR) looks in another\n",
        env.path("other").display()
    ));
}

#[test]
fn resume_kills_a_dead_runners_processes_that_left_their_group() {
    let env = Env::new();
    env.write(
        "flow.toml",
        r#"name = 'escaped'
[[step]]
name = 'b'
shell = 'echo x >> b.log; if [ $(wc -l < b.log) -ge 2 ]; then exit 0; fi; setsid sleep 300 & p=$!; echo $p > esc; until [ "$(cut -d" " -f5 /proc/$p/stat)" = $p ]; do sleep 0.01; done; echo ready > ready; wait'
"#,
    );
    let _ = env.run_until("ready", "KILL");
    let escaped = read_pid(&env.path("esc"));
    assert!(alive(escaped));
    env.cmd(&["run", "flow.toml"])
        .assert()
        .success()
        .stderr(predicate::str::contains("killed 2 leftover process(es) of attempt 1 from the previous runner"));
    assert!(!alive(escaped), "found by its WAYMARK_ATTEMPT_ID although it left the process group");
}

#[test]
fn fresh_kills_the_abandoned_runs_attempt() {
    let env = Env::new();
    env.write("flow.toml", "name = 'fresh'\n[[step]]\nname = 's'\nshell = 'if [ -e pid ]; then exit 0; fi; echo $$ > pid; exec sleep 300'\n");
    let _ = env.run_until("pid", "KILL");
    let old = read_pid(&env.path("pid"));
    assert!(alive(old));
    env.cmd(&["run", "--fresh", "flow.toml"])
        .assert()
        .success()
        .stderr(predicate::str::contains("killed 1 leftover process(es)").and(predicate::str::contains("abandoned")));
    assert!(!alive(old));
}

#[test]
fn a_redelivered_attempt_is_judged_by_its_own_output_only() {
    let env = Env::new();
    // The first execution prints a traceback and is lost with its runner; the redelivered one
    // exits 1 silently, which must not be taken for the old ValueError. The first says it is
    // ready (`pid`) only once its traceback is in its log: a runner killed before it read the pipe
    // would lose it, and a loaded machine may take a while to read it.
    env.write(
        "flow.toml",
        r#"name = 'redeliver'
[[step]]
name = 's'
shell = 'if [ ! -e once ]; then touch once; printf "Traceback (most recent call last):\n  File \"x\", line 1, in <module>\nValueError: old\n" >&2; log="${WAYMARK_ERROR_FILE%.error.json}.stderr"; n=0; until grep -qs "ValueError: old" "$log" || [ $n -ge 600 ]; do sleep 0.05; n=$((n+1)); done; echo $$ > pid; exec sleep 300; fi; exit 1'
retry = { attempts = 2, exception_types = ["SubprocessError"] }
"#,
    );
    let _ = env.run_until("pid", "KILL");
    env.cmd(&["run", "flow.toml"]).assert().code(1).stderr(
        predicate::str::contains("s: attempt 1/2 failed: CalledProcessError")
            .and(predicate::str::contains("s: attempt 2/2 failed: CalledProcessError"))
            .and(predicate::str::contains("ValueError").not()),
    );
    let run = json(&env, &["history", "--json"])[0]["id"].as_str().unwrap().to_owned();
    env.cmd(&["logs", &run, "s", "--attempt", "1", "--stream", "stderr"])
        .assert()
        .success()
        .stdout(predicate::str::contains("ValueError: old\n\n==> waymark: attempt 1 redelivered at "));
}

#[test]
fn output_that_cannot_be_logged_stops_the_run_with_4() {
    if !have_root("output_that_cannot_be_logged_stops_the_run_with_4", "mounts a tmpfs") {
        return;
    }
    let env = Env::new();
    // The step writes only once its pid is recorded (the one write of the runner between a spawn
    // and the attempt's end), so the full disk is met by its log, not by the state database.
    env.write(
        "flow.toml",
        r#"name = 'loud'
[[step]]
name = 'loud'
run = ['python3', '-c', '''
import os, sqlite3, sys, time
db = sqlite3.connect(os.environ["WAYMARK_STATE_DIR"] + "/waymark.db")
while db.execute("SELECT count(*) FROM attempts WHERE pid = ?", (os.getpid(),)).fetchone()[0] == 0:
    time.sleep(0.01)
db.close()
sys.stdout.buffer.write(bytes(4000000))
''']
"#,
    );
    on_tmpfs_state(
        &env,
        "$WAYMARK run --quiet flow.toml 2> first.err; echo $? > first.code; $WAYMARK status loud --json > status.json",
    );
    assert_eq!(env.read("first.code").trim(), "4", "{}", env.read("first.err"));
    assert!(env.read("first.err").contains("cannot write attempt files at"), "{}", env.read("first.err"));
    let status: Value = serde_json::from_str(&env.read("status.json")).unwrap();
    // The attempt stays in flight, to be redelivered: its runner is gone, so it shows interrupted.
    assert_eq!(
        (status["steps"][0]["state"].as_str(), status["runner_alive"].as_bool()),
        (Some("interrupted"), Some(false)),
        "{status}"
    );
}

/// A flow whose one step fails (attempts 1) unless `gate` exists, in which case it waits for
/// `release` and succeeds. Every execution adds a line to `s.log`.
const FAILING: &str = "name = 'v'\n[[step]]\nname = 's'\nshell = 'echo x >> s.log; if [ -e gate ]; then echo $$ > started; while [ ! -e release ]; do sleep 0.05; done; exit 0; fi; exit 1'\n";

fn newest_run(env: &Env) -> String {
    json(env, &["history", "--limit", "1", "--json"])[0]["id"].as_str().unwrap().to_owned()
}

fn sql(env: &Env, statements: &str) {
    let db = rusqlite::Connection::open(env.state().join("waymark.db")).unwrap();
    db.execute_batch(statements).unwrap();
}

#[test]
fn resume_of_a_run_with_no_steps_is_an_error_not_a_success() {
    let env = Env::new();
    env.write("flow.toml", FAILING);
    env.cmd(&["run", "flow.toml"]).assert().code(1);
    let id = newest_run(&env);
    sql(&env, &format!("DELETE FROM steps WHERE run_id = '{id}'"));
    let out = env.cmd(&["resume", &id]).output().unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        format!(
            "error: run {id} in {} has no steps recorded, so it cannot be resumed (its steps were deleted behind \
             waymark's back); nothing ran: `waymark run --fresh {}` starts the flow anew\n",
            env.state().join("waymark.db").display(),
            env.path("flow.toml").canonicalize().unwrap().display()
        )
    );
    assert_eq!(env.count("s.log"), 1, "nothing ran");
}

#[test]
fn resume_of_a_run_deleted_while_it_waited_for_the_lock_is_an_error() {
    let env = Env::new();
    env.write("flow.toml", FAILING);
    env.cmd(&["run", "flow.toml"]).assert().code(1);
    let id = newest_run(&env);
    // A second run of the flow holds its lock while `resume --wait` waits for it.
    env.write("gate", "");
    let holder = env.spawn(&["run", "flow.toml"]);
    env.wait_for_lines("started", 1);
    let (resume, said) = env.spawn_watched(&["resume", "--wait", &id]);
    wait_until("resume to wait for the lock", || said.lock().unwrap().contains("waiting for it to finish"));
    // What gc would have done had it come first.
    sql(
        &env,
        &format!(
            "DELETE FROM attempts WHERE run_id = '{id}'; DELETE FROM steps WHERE run_id = '{id}'; DELETE FROM runs WHERE id = '{id}'"
        ),
    );
    env.write("release", "");
    assert_eq!(finish(holder).status.code(), Some(0));
    let out = finish(resume);
    assert_eq!(out.status.code(), Some(2), "{}", said.lock().unwrap());
    let said = said.lock().unwrap().clone();
    assert!(
        said.ends_with(&format!(
            "waiting for it to finish\nerror: run {id} is gone: it was deleted (by `waymark gc`?) before it could be \
             resumed; nothing ran\n"
        )),
        "{said}"
    );
    assert_eq!(env.count("s.log"), 2, "only the other run ran");
}

#[test]
fn gc_racing_resume_never_turns_a_failed_run_into_a_success() {
    let env = Env::new();
    env.write("flow.toml", FAILING);
    let (mut resumed, mut deleted) = (0, 0);
    for i in 0..common::iterations(50, 500) {
        env.cmd(&["run", "flow.toml"]).assert().code(1);
        let id = newest_run(&env);
        let before = env.count("s.log");
        let resume = env.spawn(&["resume", &id]);
        let gc = env.spawn(&["gc", "--older-than", "0s"]);
        let (resume, gc) = (finish(resume), finish(gc));
        assert_eq!(gc.status.code(), Some(0), "iteration {i}: {}", stderr(&gc));
        match resume.status.code() {
            // Resumed first: the step ran again and failed again.
            Some(1) => {
                assert_eq!(env.count("s.log"), before + 1, "iteration {i}: {}", stderr(&resume));
                resumed += 1;
            }
            // Deleted first: nothing ran, and resume says why.
            Some(2) => {
                let e = stderr(&resume);
                let dir = std::fs::canonicalize(env.state()).unwrap();
                assert!(
                    e == format!(
                        "error: no run with id `{id}` in the state directory {}; `waymark history` lists the runs \
                         kept there, `--state-dir DIR` looks in another\n",
                        dir.display()
                    ) || e
                        == format!(
                            "error: run {id} is gone: it was deleted (by `waymark gc`?) before it could be resumed; nothing ran\n"
                        ),
                    "iteration {i}: {e}"
                );
                assert_eq!(env.count("s.log"), before, "iteration {i}");
                deleted += 1;
            }
            other => panic!("iteration {i}: resume exited {other:?}: {}", stderr(&resume)),
        }
    }
    eprintln!("gc racing resume: resumed first {resumed} times, deleted first {deleted} times");
}

#[test]
fn history_limit_0_is_refused() {
    let env = Env::new();
    env.write("flow.toml", "name = 'l'\n[[step]]\nname = 'a'\nrun = ['true']\n");
    env.cmd(&["run", "flow.toml"]).assert().success();
    env.cmd(&["history", "--limit", "0"])
        .assert()
        .code(2)
        .stderr("error: `--limit 0` would show no runs; give a limit of 1 or more (the default is 20)\n");
    env.cmd(&["history", "--limit", "1"]).assert().success().stdout(predicate::str::contains("succeeded"));
}

#[test]
fn looking_at_an_empty_database_file_writes_nothing() {
    let env = Env::new();
    env.write("state/waymark.db", "");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(env.state(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let place = format!("in the state directory {}", std::fs::canonicalize(env.state()).unwrap().display());
    let elsewhere = "`--state-dir DIR` (or WAYMARK_STATE_DIR) looks in another";
    env.cmd(&["status"])
        .assert()
        .code(2)
        .stderr(format!("error: there are no runs yet {place}; `waymark run FLOW` starts one, {elsewhere}\n"));
    env.cmd(&["history"]).assert().success().stderr(format!("no runs yet {place}; {elsewhere}\n"));
    env.cmd(&["history", "--json"]).assert().success().stdout("[]\n");
    assert_eq!(std::fs::metadata(env.state().join("waymark.db")).unwrap().len(), 0, "still 0 bytes");
    let mut entries: Vec<String> =
        std::fs::read_dir(env.state()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    entries.sort();
    assert_eq!(entries, ["waymark.db"], "no -wal, -shm, locks or logs");
}

/// `status` as text, with the run id, the flow's path, the times and the steps' durations
/// replaced (`RUN`, `PATH`, `TIME`, `Ns`); the durations are checked through `--json`.
fn status_text(env: &Env, flow: &str) -> (String, Value) {
    let st = json(env, &["status", flow, "--json"]);
    let out = env.cmd(&["status", flow]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    let text = text.replace(st["id"].as_str().unwrap(), "RUN").replace(st["path"].as_str().unwrap(), "PATH");
    (common::normalise_status_durations(&common::normalise_times(&text)), st)
}

/// `status`'s step column and `history`'s flow column fit the longest name shown (20 wide at
/// least, so short names look as they did): a long name does not push the rest of its row out
/// of line with the others, nor the lines under it.
#[test]
fn status_and_history_columns_fit_a_long_step_or_flow_name() {
    let env = Env::new();
    env.write("short.toml", "name = 'short'\n[[step]]\nname = 'one'\nrun = ['true']\n");
    env.write(
        "long.toml",
        "name = 'nightly-warehouse-refresh-eu'\n[[step]]\nname = 'extract'\nrun = ['true']\n\
         [[step]]\nname = 'load-customers-into-warehouse'\nrun = ['false']\nneeds = ['extract']\n",
    );
    env.cmd(&["run", "--quiet", "short.toml"]).assert().success();
    env.cmd(&["run", "--quiet", "long.toml"]).assert().code(1);
    let (text, _) = status_text(&env, "nightly-warehouse-refresh-eu");
    assert_eq!(
        text,
        "run RUN of nightly-warehouse-refresh-eu (PATH): failed, started TIME, ended TIME\n  \
         extract                        succeeded  attempts 1/1  Ns\n  \
         load-customers-into-warehouse  failed     attempts 1/1  Ns\n  \
         \x20                              last error: CalledProcessError(SubprocessError, Exception, BaseException): \
         exit status 1 [exit status]\n"
    );
    let (text, _) = status_text(&env, "short");
    assert_eq!(
        text,
        "run RUN of short (PATH): succeeded, started TIME, ended TIME\n  one                  succeeded  attempts 1/1  Ns\n"
    );
    let out = env.cmd(&["history"]).output().unwrap();
    let mut text = String::from_utf8(out.stdout).unwrap();
    // Each duration ends where its header does (the start, to the millisecond, fits its column).
    let end_of = |line: &str, what: &str| line.find(what).map(|i| i + what.len());
    let header_end = end_of(text.lines().next().unwrap(), "DURATION");
    let duration = regex::Regex::new(r"(?:<1ms|\d+(?:ms|s)(?: \d+ms)?)  ").unwrap();
    for line in text.lines().skip(1) {
        // After the start (a run id, random, can end like a duration: `2ettb22s`).
        let value = duration.find_at(line, line.find("Z ").unwrap()).unwrap();
        assert_eq!(Some(value.end() - 2), header_end, "{text}");
    }
    for run in json(&env, &["history", "--json"]).as_array().unwrap() {
        text = text.replace(run["id"].as_str().unwrap(), "RUNIDXYZ");
    }
    let text = regex::Regex::new(r"  +(?:<1ms|\d+(?:ms|s)(?: \d+ms)?)  ")
        .unwrap()
        .replace_all(&common::normalise_times(&text), "  Ns  ")
        .into_owned();
    assert_eq!(
        text,
        "RUN        FLOW                          STATUS       STARTED                    DURATION  FAILED STEP\n\
         RUNIDXYZ   nightly-warehouse-refresh-eu  failed       TIME  Ns  load-customers-into-warehouse\n\
         RUNIDXYZ   short                         succeeded    TIME  Ns  -\n"
    );
}

#[test]
fn status_counts_a_running_attempt_and_shows_an_interrupted_step_without_the_time_it_sat() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'st'\n[[step]]\nname = 'slow'\nshell = '[ -e go ] && exit 0; echo started >> started; sleep 300'\n\
         [[step]]\nname = 'next'\nrun = ['true']\nneeds = ['slow']\n",
    );
    let began = std::time::Instant::now();
    let runner = env.spawn(&["run", "flow.toml"]);
    env.wait_for_lines("started", 1);
    let (text, st) = status_text(&env, "st");
    assert_eq!(
        text,
        "run RUN of st (PATH): running, started TIME\n  \
         slow                 running    attempts 1/1  Ns\n  \
         next                 pending    attempts 0/1\n"
    );
    assert_eq!(
        (st["steps"][0]["state"].as_str(), st["steps"][0]["attempts_used"].as_u64()),
        (Some("running"), Some(1))
    );
    kill(runner.id(), "TERM");
    assert_eq!(finish(runner).status.code(), Some(143));

    let (text, st) = status_text(&env, "st");
    assert_eq!(
        text,
        "run RUN of st (PATH): interrupted, started TIME, ended TIME\n  \
         slow                 interrupted  attempts 0/1  Ns\n  \
         \x20                    attempt 1 did not finish: it was cancelled; it runs again on resume\n  \
         next                 pending      attempts 0/1\n",
        "the state column fits `interrupted`"
    );
    assert_eq!(st["steps"][0]["state"], "interrupted");
    assert_eq!(st["steps"][0]["attempts_used"], 0, "a cancelled attempt uses no attempt");
    // The run sits interrupted for 3 s; that time is not the step's.
    std::thread::sleep(std::time::Duration::from_secs(3));
    env.write("go", "");
    env.cmd(&["run", "flow.toml"]).assert().success();
    let (text, st) = status_text(&env, "st");
    assert_eq!(
        text,
        "run RUN of st (PATH): succeeded, started TIME, ended TIME\n  \
         slow                 succeeded  attempts 1/1  Ns\n  \
         next                 succeeded  attempts 1/1  Ns\n"
    );
    // Whole seconds, rounded down: were the 3 s counted, the step would have taken as long as
    // the whole test so far; however slow this machine, at least 2 s of it are left out.
    let took = st["steps"][0]["duration_seconds"].as_u64().unwrap();
    let elapsed = began.elapsed().as_secs();
    assert!(took + 2 <= elapsed, "the 3 s the run sat interrupted were counted: {took} s of {elapsed} s");
    // The same time to the millisecond, which the text shows under a minute (`1s 4ms`).
    let ms = st["steps"][0]["duration_ms"].as_u64().unwrap();
    assert_eq!(ms / 1000, took);
    let shown = humantime::format_duration(std::time::Duration::from_millis(ms)).to_string();
    let line = env.cmd(&["status", "st"]).output().unwrap().stdout;
    assert!(
        String::from_utf8_lossy(&line).lines().nth(1).unwrap().ends_with(&format!("attempts 1/1  {shown}")),
        "{}",
        String::from_utf8_lossy(&line)
    );
}

/// A retry waiting for its backoff is made by the run's runner: once the run is interrupted,
/// `status` says the retry waits for the run to be resumed, not that it comes at its time.
#[test]
fn status_of_an_interrupted_run_says_its_waiting_retry_is_held_until_resume() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'held'\n[[step]]\nname = 'w'\nshell = 'echo x >> runs; exit 1'\nretry = { attempts = 2, backoff_seconds = 600 }\n",
    );
    let runner = env.spawn(&["run", "flow.toml"]);
    env.wait_for_lines("runs", 1);
    wait_until("the step to wait for its retry", || {
        json(&env, &["status", "held", "--json"])["steps"][0]["state"] == "waiting"
    });
    let error = "CalledProcessError(SubprocessError, Exception, BaseException): exit status 1 [exit status]";
    let (text, st) = status_text(&env, "held");
    assert_eq!(
        text,
        format!(
            "run RUN of held (PATH): running, started TIME\n  \
             w                    waiting    attempts 1/2  Ns  next retry at TIME\n  {:20} last error: {error}\n",
            ""
        )
    );
    let wake = st["steps"][0]["next_retry_at"].clone();
    assert!(wake.is_string(), "{st}");
    assert_eq!(st["steps"][0]["next_retry_held"], false, "its runner waits for it");
    kill(runner.id(), "TERM");
    assert_eq!(finish(runner).status.code(), Some(143));

    let (text, st) = status_text(&env, "held");
    assert_eq!(
        text,
        format!(
            "run RUN of held (PATH): interrupted, started TIME, ended TIME\n  \
             w                    waiting    attempts 1/2  Ns  retry due at TIME, held until the run is resumed\n  \
             {:20} last error: {error}\n",
            ""
        )
    );
    assert_eq!(st["steps"][0]["next_retry_at"], wake, "the recorded time is kept");
    assert_eq!(st["steps"][0]["next_retry_held"], true);
    assert_eq!(env.count("runs"), 1, "nothing retried it");

    // Abandoned for a new run (`--fresh`), it is never resumed: no retry is held for it.
    let old = st["id"].as_str().unwrap().to_owned();
    env.write("flow.toml", "name = 'held'\n[[step]]\nname = 'w'\nshell = 'true'\n");
    env.cmd(&["run", "--fresh", "flow.toml"]).assert().success();
    let (text, st) = status_text(&env, &old);
    assert_eq!(
        text,
        format!(
            "run RUN of held (PATH): abandoned, started TIME, ended TIME\n  \
             w                    waiting    attempts 1/2  Ns  no retry (it was due at TIME): the run was abandoned\n  \
             {:20} last error: {error}\n",
            ""
        )
    );
    assert_eq!(st["steps"][0]["next_retry_held"], false, "an abandoned run is never resumed");
}

#[test]
fn status_duration_counts_a_backoff_but_not_a_runner_stopped_during_it() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'bo'\n[[step]]\nname = 'w'\nshell = 'echo x >> runs; [ $(wc -l < runs) -ge 2 ]'\nretry = { attempts = 2, backoff_seconds = 1 }\n",
    );
    // Stopped while it waits 1 s for its retry; resumed 3 s later.
    let began = std::time::Instant::now();
    let runner = env.spawn(&["run", "flow.toml"]);
    env.wait_for_lines("runs", 1);
    wait_until("the step to wait for its retry", || {
        json(&env, &["status", "bo", "--json"])["steps"][0]["state"] == "waiting"
    });
    kill(runner.id(), "TERM");
    assert_eq!(finish(runner).status.code(), Some(143));
    std::thread::sleep(std::time::Duration::from_secs(3));
    env.cmd(&["run", "flow.toml"]).assert().success();
    let (text, st) = status_text(&env, "bo");
    assert_eq!(
        text,
        format!(
            "run RUN of bo (PATH): succeeded, started TIME, ended TIME\n  w                    succeeded  attempts 2/2  Ns\n  \
         {:20} retried after: CalledProcessError(SubprocessError, Exception, BaseException): exit status 1 [exit status]\n",
            ""
        )
    );
    // The backoff counts (1 s); of the 3 s the runner was stopped, at least 2 s do not, however slow
    // this machine (whole seconds, rounded down).
    let took = st["steps"][0]["duration_seconds"].as_u64().unwrap();
    let elapsed = began.elapsed().as_secs();
    assert!(took >= 1, "the 1 s backoff was not counted: {took} s");
    assert!(took < elapsed, "the time the runner was stopped was counted: {took} s of {elapsed} s");
}

/// `logs` of an attempt whose runner died says what `status` says of it: it is not running (status:
/// `interrupted`, `attempt 1 did not finish: its runner died`), so its silent streams are not
/// `written nothing ... so far`, as of an attempt still running (review2: fails on e568fa3, which
/// says `attempt 1 of step `a` has written nothing to stdout or stderr so far`).
#[test]
fn logs_of_an_attempt_whose_runner_died_do_not_call_it_running() {
    let env = Env::new();
    env.write("flow.toml", "name = 'dead'\n[[step]]\nname = 'a'\nshell = 'echo $$ > ready; exec sleep 300'\n");
    let _ = env.run_until("ready", "KILL");
    kill(read_pid(&env.path("ready")), "KILL");
    let step = &json(&env, &["status", "--json"])["steps"][0];
    assert_eq!(step["state"], "interrupted", "{step}");
    let out = env.cmd(&["logs", "dead", "a"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        "waymark: attempt 1 of step `a` wrote nothing to stdout or stderr (it did not finish: its runner died)\n"
    );
}

/// Wait until the workflow deadline of `secs` seconds of the run `st` (its `status --json`) has
/// passed, counted from the run's recorded start.
fn wait_past_deadline(st: &Value, secs: u64) {
    let deadline = humantime::parse_rfc3339(st["started_at"].as_str().unwrap()).unwrap()
        + std::time::Duration::from_secs(secs)
        + std::time::Duration::from_millis(50);
    wait_until("the deadline to pass", || std::time::SystemTime::now() > deadline);
}

/// Run `flow.toml` (flow `flow`, whose `timeout` is `secs` seconds) until its steps are in
/// `states`, in file order; stop its runner with SIGTERM, then wait until the deadline has passed.
fn interrupt_in_states_past_deadline(env: &Env, flow: &str, states: &[&str], secs: u64) {
    let runner = env.spawn(&["run", "--quiet", "flow.toml"]);
    wait_until(&format!("the steps to be {states:?}"), || {
        let out = env.cmd(&["status", flow, "--json"]).output().unwrap();
        serde_json::from_slice::<Value>(&out.stdout)
            .is_ok_and(|st| states.iter().enumerate().all(|(i, s)| st["steps"][i]["state"] == *s))
    });
    kill(runner.id(), "TERM");
    assert_eq!(finish(runner).status.code(), Some(143));
    let (_, st) = status_text(env, flow);
    wait_past_deadline(&st, secs);
}

/// Waymark's own lines about step `step` in `out`'s stderr, without their times.
fn step_lines(out: &std::process::Output, step: &str) -> Vec<String> {
    let prefix = format!("waymark: {step}:");
    common::untimed(&stderr(out)).lines().filter(|l| l.starts_with(&prefix)).map(str::to_owned).collect()
}

/// A step whose attempt a signal cancelled shows `interrupted` with a line under it saying what the
/// next resume does with it: run it again, or, past the workflow's deadline, fail the run without
/// running it; in a run abandoned since (`--fresh`), nothing.
#[test]
fn status_says_what_becomes_of_a_step_a_signal_cancelled() {
    let env = Env::new();
    env.write("flow.toml", "name = 'cut'\ntimeout = 5\n[[step]]\nname = 'a'\nshell = '[ -e go ] && exit 0; echo $$ > ready; exec sleep 300'\n");
    let out = env.run_until("ready", "TERM");
    assert_eq!(out.status.code(), Some(143), "{}", stderr(&out));
    let (_, st) = status_text(&env, "cut");
    let id = st["id"].as_str().unwrap().to_owned();
    wait_past_deadline(&st, 5);
    let line = |id: &str| {
        let (text, _) = status_text(&env, id);
        text.lines().nth(2).map(str::to_owned).unwrap_or_default()
    };
    assert_eq!(
        line(&id),
        format!(
            "  {:20} attempt 1 did not finish: it was cancelled; the run fails when resumed, without running it \
             again: the workflow's `timeout` (5s) passed",
            ""
        )
    );
    env.write("go", "");
    env.cmd(&["run", "--quiet", "--fresh", "flow.toml"]).assert().success();
    assert_eq!(
        line(&id),
        format!(
            "  {:20} attempt 1 did not finish: it was cancelled; the run was abandoned, so it never runs again",
            ""
        )
    );
}

/// A step waiting out its backoff when a signal stopped the run, looked at past the workflow's
/// deadline: `status` says that the resume fails the run without the retry, and the resume says no
/// `retry now` for it before it says that it does not run it again.
#[test]
fn a_retry_held_past_the_deadline_is_said_not_to_come() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'held'\ntimeout = 5\n[[step]]\nname = 'bk'\nshell = 'exit 1'\nretry = { attempts = 3, backoff_seconds = 30 }\n",
    );
    interrupt_in_states_past_deadline(&env, "held", &["waiting"], 5);
    let (text, _) = status_text(&env, "held");
    assert_eq!(
        text.lines().nth(1).unwrap(),
        "  bk                   waiting    attempts 1/3  Ns  no retry (due at TIME): the run fails when resumed: the \
         workflow's `timeout` (5s) passed"
    );
    // `--json` alike: no retry is held for the resume.
    assert_eq!(json(&env, &["status", "held", "--json"])["steps"][0]["next_retry_held"], false);
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let said = step_lines(&out, "bk");
    assert_eq!(said, ["waymark: bk: not run again: the workflow's deadline passed"]);
}

/// A run that had failed (a step failed for good) before its deadline passed, resumed after it:
/// the step still waiting for its retry is not run again because the run failed first, as the
/// run's end says, not because of the deadline.
#[test]
fn a_step_skipped_on_resume_after_the_run_failed_first_says_so() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'first'\ntimeout = 5\n\
         [[step]]\nname = 'bad'\nneeds = []\nshell = 'exit 3'\n\
         [[step]]\nname = 'bk'\nneeds = []\nshell = 'exit 1'\nretry = { attempts = 3, backoff_seconds = 30 }\n",
    );
    interrupt_in_states_past_deadline(&env, "first", &["failed", "waiting"], 5);
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let said = step_lines(&out, "bk");
    assert_eq!(said, ["waymark: bk: not run again: the run failed first"]);
}

/// A step whose attempt died with its runner, skipped by a resume past the workflow's deadline,
/// counts that attempt as used: it ran (`skipped attempts 0/1` said it never did).
#[test]
fn a_step_skipped_after_its_runner_died_counts_the_attempt_it_made() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'lost'\ntimeout = 5\n[[step]]\nname = 'a'\nshell = 'echo $$ > ready; exec sleep 300'\n",
    );
    let out = env.run_until("ready", "KILL");
    assert_eq!(out.status.code(), None);
    let (_, st) = status_text(&env, "lost");
    wait_past_deadline(&st, 5);
    let out = env.cmd(&["run", "--quiet", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let (text, st) = status_text(&env, "lost");
    assert_eq!(
        (st["steps"][0]["state"].as_str(), st["steps"][0]["attempts_used"].as_u64()),
        (Some("skipped"), Some(1))
    );
    assert_eq!(text.lines().nth(1).unwrap(), "  a                    skipped    attempts 1/1  Ns");
}

/// While the runner of a `fail_fast` run winds it down (here in its `on_failure` hook), a step that
/// `fail_fast` cancelled is not said to be run again by that runner: it fails the run.
#[test]
fn status_during_a_fail_fast_wind_down_says_the_runner_does_not_run_the_cancelled_step_again() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'ff'\nfail_fast = true\n[hooks]\non_failure = 'touch hook; while [ ! -e go ]; do sleep 0.02; done'\n\
         [[step]]\nname = 'a'\nneeds = []\nshell = 'while [ ! -e b-started ]; do sleep 0.02; done; exit 3'\n\
         [[step]]\nname = 'b'\nneeds = []\nshell = 'touch b-started; exec sleep 300'\n",
    );
    let runner = env.spawn(&["run", "--quiet", "flow.toml"]);
    wait_until("the on_failure hook to run", || env.path("hook").exists());
    let (text, _) = status_text(&env, "ff");
    let b = text.lines().skip_while(|l| !l.starts_with("  b ")).take(2).collect::<Vec<_>>();
    assert_eq!(
        b,
        [
            "  b                    interrupted  attempts 0/1  Ns",
            "                       attempt 1 did not finish: it was cancelled; the run's runner does not run it \
             again: a step failed for good under `fail_fast`",
        ],
        "{text}"
    );
    env.write("go", "");
    assert_eq!(finish(runner).status.code(), Some(1));
}

/// A flow file made invalid while a run of it is unfinished: `waymark run` refuses it (exit 2)
/// and says that `waymark resume ID` still resumes the run with the flow it recorded, which it
/// does; with no unfinished run there is no such line, and no state directory is made.
#[test]
fn an_invalid_flow_file_with_an_unfinished_run_says_resume_still_works() {
    let env = Env::new();
    let flow =
        "name = 'broken'\n[[step]]\nname = 'a'\nshell = '[ -e go ] && exit 0; echo $$ > ready; exec sleep 300'\n";
    env.write("flow.toml", flow);
    let out = env.run_until("ready", "TERM");
    assert_eq!(out.status.code(), Some(143), "{}", stderr(&out));
    let id = json(&env, &["status", "broken", "--json"])["id"].as_str().unwrap().to_owned();
    env.write("flow.toml", &format!("{flow}nonsense = 1\n"));
    let out = env.cmd(&["run", "flow.toml"]).env("NO_COLOR", "1").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let said = stderr(&out);
    let (_, last) = said.trim_end().rsplit_once('\n').unwrap();
    assert_eq!(
        last,
        format!(
            "hint: run {id} of this flow file is unfinished: `waymark resume {id}` resumes it with the flow it \
             recorded when it started; `waymark run` resumes it once the file is valid again and names the flow \
             `broken`"
        )
    );
    // Under `--strict` too, of a file with an error: it is to be made valid.
    let out = env.cmd(&["run", "--strict", "flow.toml"]).env("NO_COLOR", "1").output().unwrap();
    assert_eq!(stderr(&out).trim_end().rsplit_once('\n').unwrap().1, last);
    // Under `--strict`, of a file whose only fault is a warning: what works then.
    env.write("flow.toml", &flow.replace("shell = '", "retry = { exception_types = ['ConectionError'] }\nshell = '"));
    let out = env.cmd(&["run", "--strict", "flow.toml"]).env("NO_COLOR", "1").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).trim_end().ends_with(&format!(
            "`waymark resume {id}` resumes it with the flow it recorded when it started; `waymark run` without \
             `--strict` resumes it, or with it once the warnings are fixed"
        )),
        "{}",
        stderr(&out)
    );
    env.write("go", "");
    env.cmd(&["resume", "--quiet", &id]).assert().success();
    // A run whose runner lives goes on with its flow: no hint.
    env.write("flow.toml", "name = 'broken'\n[[step]]\nname = 'a'\nshell = 'echo $$ > running; exec sleep 300'\n");
    let runner = env.spawn(&["run", "--quiet", "flow.toml"]);
    env.wait_for_lines("running", 1);
    env.write("flow.toml", "name = 'broken'\nnonsense = 1\n[[step]]\nname = 'a'\nrun = ['true']\n");
    let out = env.cmd(&["run", "flow.toml"]).env("NO_COLOR", "1").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(!stderr(&out).contains("hint:"), "{}", stderr(&out));
    kill(runner.id(), "TERM");
    finish(runner);
    // Without an unfinished run: the diagnostics alone, and nothing is created.
    let fresh = Env::new();
    fresh.write("flow.toml", &format!("{flow}nonsense = 1\n"));
    let out = fresh.cmd(&["run", "flow.toml"]).env("NO_COLOR", "1").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(!stderr(&out).contains("hint:"), "{}", stderr(&out));
    assert!(!fresh.state().exists());
}
