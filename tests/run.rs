//! `waymark run` on real processes: attempts, filters, timeouts, signals, process groups.

mod common;

use common::{Env, alive, finish, kill, read_pid, untimed, wait_until};
use predicates::prelude::*;

/// What waymark wrote on stderr, its lines without their times.
fn stderr(out: &std::process::Output) -> String {
    untimed(&common::stderr(out))
}

/// A step that appends to `runs` and fails until it has run `ok_after` times (0: always fails).
fn counting(exit: u32, ok_after: u32) -> String {
    format!(
        r#"shell = 'echo x >> runs; n=$(wc -l < runs); echo "attempt $WAYMARK_ATTEMPT of $WAYMARK_MAX_ATTEMPTS" >&2; if [ {ok_after} -gt 0 ] && [ $n -ge {ok_after} ]; then exit 0; fi; exit {exit}'"#
    )
}

fn flow(env: &Env, body: &str) {
    env.write("flow.toml", body);
}

#[test]
fn attempts_count_total_executions_and_failure_is_reported() {
    let env = Env::new();
    flow(&env, &format!("[[step]]\nname = 'flaky'\n{}\nretry = {{ attempts = 3 }}\n", counting(1, 0)));
    env.cmd(&["run", "flow.toml"]).assert().code(1).stderr(
        predicate::str::contains("waymark: run ")
            // Three attempts that failed the same way share one line of the report.
            .and(predicate::str::contains(" failed\n  step flaky:\n    attempts 1 to 3: started "))
            .and(predicate::str::contains(
                ": CalledProcessError(SubprocessError, Exception, BaseException): exit status 1 [exit status]\n    \
                 budget spent: 3 of 3 attempts\n",
            ))
            .and(predicate::str::contains("    stderr of attempt 3, last lines:\n      attempt 3 of 3\n"))
            .and(predicate::str::contains("    logs: ")),
    );
    assert_eq!(env.count("runs"), 3);
}

#[test]
fn a_step_without_retry_runs_once() {
    let env = Env::new();
    flow(
        &env,
        &format!("[[step]]\nname = 'once'\n{}\n[[step]]\nname = 'never'\nrun = ['touch', 'never']\n", counting(1, 0)),
    );
    env.cmd(&["run", "flow.toml"]).assert().code(1);
    assert_eq!(env.count("runs"), 1);
    assert!(!env.path("never").exists(), "a step after a failed one must not run");
}

/// A policy that retries nothing has a budget of one attempt, wherever it is shown: the step and
/// `WAYMARK_MAX_ATTEMPTS` say 1/1, not the 101 of `retry = {}` it can never use.
#[test]
fn a_policy_that_retries_nothing_runs_once_and_says_1_of_1() {
    for retry in ["{ exception_types = [] }", "{ attempts = 5, exception_types = [] }"] {
        let env = Env::new();
        flow(&env, &format!("[[step]]\nname = 'once'\n{}\nretry = {retry}\n", counting(1, 0)));
        let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
        assert_eq!(out.status.code(), Some(1));
        let said = stderr(&out);
        assert_eq!(env.count("runs"), 1, "{retry}: {said}");
        assert!(said.contains("once | attempt 1 of 1\n"), "{retry}: {said}");
        assert!(
            said.contains("waymark: once: attempt 1/1 failed: CalledProcessError: exit status 1"),
            "{retry}: {said}"
        );
    }
}

#[test]
fn default_policy_retries_until_success() {
    // `retry = {}`: 101 attempts on Exception; fails three times, then succeeds on the fourth.
    let env = Env::new();
    flow(&env, &format!("[[step]]\nname = 'flaky'\n{}\nretry = {{}}\n", counting(1, 4)));
    env.cmd(&["run", "flow.toml"]).assert().success().stderr(predicate::str::contains("attempt 4 of 101"));
    assert_eq!(env.count("runs"), 4);
}

#[test]
fn exception_types_match_through_base_classes() {
    let mapped = |types: &str| {
        format!(
            "[exit_codes]\n\"3\" = \"ConnectionResetError\"\n[[step]]\nname = 's'\n{}\nretry = {{ attempts = 3, exception_types = {types} }}\n",
            counting(3, 0)
        )
    };
    for (types, runs) in [(r#"["ConnectionError"]"#, 3), (r#"["OSError"]"#, 3), (r#"["ValueError"]"#, 1), ("[]", 1)] {
        let env = Env::new();
        flow(&env, &mapped(types));
        env.cmd(&["run", "flow.toml"]).assert().code(1).stderr(predicate::str::contains(
            "ConnectionResetError(ConnectionError, OSError, Exception, BaseException)",
        ));
        assert_eq!(env.count("runs"), runs, "exception_types = {types}");
    }
}

#[test]
fn step_exit_codes_win_over_flow_exit_codes() {
    let env = Env::new();
    flow(
        &env,
        &format!(
            "[exit_codes]\n\"3\" = \"ValueError\"\n[[step]]\nname = 's'\n{}\nexit_codes = {{ \"3\" = \"TimeoutError\" }}\nretry = {{ attempts = 2, exception_types = [\"OSError\"] }}\n",
            counting(3, 0)
        ),
    );
    env.cmd(&["run", "flow.toml"]).assert().code(1).stderr(predicate::str::contains("TimeoutError(OSError"));
    assert_eq!(env.count("runs"), 2);
}

#[test]
fn timeouts_are_not_retried_unless_listed() {
    let step = |types: &str| {
        format!(
            "[[step]]\nname = 'slow'\nshell = 'echo x >> runs; exec sleep 30'\ntimeout = 1.5\nkill_grace = 0\nretry = {{ attempts = 3{types} }}\n"
        )
    };
    let env = Env::new();
    flow(&env, &step(""));
    env.cmd(&["run", "flow.toml"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("ActionTimeout(BaseException): timed out after 1s 500ms"));
    assert_eq!(env.count("runs"), 1);

    let env = Env::new();
    flow(&env, &step(", exception_types = [\"ActionTimeout\"]"));
    env.cmd(&["run", "flow.toml"]).assert().code(1);
    assert_eq!(env.count("runs"), 3);
}

#[test]
fn timeout_kills_the_whole_process_group() {
    let env = Env::new();
    flow(
        &env,
        "[[step]]\nname = 'bg'\nshell = 'sleep 300 & echo $! > bgpid; wait'\ntimeout = 2\nkill_grace = '100ms'\n",
    );
    env.cmd(&["run", "flow.toml"]).assert().code(1).stderr(predicate::str::contains("ActionTimeout"));
    let pid = read_pid(&env.path("bgpid"));
    wait_until("the grandchild to die", || !alive(pid));
}

#[test]
fn kill_grace_escalates_to_sigkill() {
    let env = Env::new();
    // The shell ignores SIGTERM; only SIGKILL, a grace period after the timeout, stops it.
    flow(
        &env,
        "[[step]]\nname = 'stubborn'\nshell = 'trap \"\" TERM; echo $$ > pid; while :; do sleep 0.05; done'\ntimeout = 1\nkill_grace = 1.5\n",
    );
    let start = std::time::Instant::now();
    env.cmd(&["run", "flow.toml"]).assert().code(1).stderr(predicate::str::contains("ActionTimeout"));
    // A lower bound only: SIGKILL did not come before the grace period was over.
    assert!(start.elapsed() >= std::time::Duration::from_millis(2500), "{:?}", start.elapsed());
    assert!(!alive(read_pid(&env.path("pid"))));
}

/// A wrapper script that dies of the timeout's SIGTERM at once leaves its worker the rest of
/// `kill_grace` to clean up (the whole group has the grace, not only its leader): the worker's
/// cleanup is done, and the step ends when the worker does, long before the grace is over. A
/// worker that outlives the grace is killed at its end, as ever.
#[test]
fn kill_grace_is_the_whole_group_s_even_after_its_leader_died() {
    for (cleanup, grace, cleaned) in [("sleep 1", "30s", true), ("sleep 300", "1s", false)] {
        let env = Env::new();
        flow(
            &env,
            &format!(
                "[[step]]\nname = 'wrapped'\nshell = '''sh -c 'trap \"{cleanup}; echo done > cleaned; exit 0\" TERM; \
                 echo $$ > worker; sleep 300 & wait' & wait'''\ntimeout = 1\nkill_grace = '{grace}'\n"
            ),
        );
        let start = std::time::Instant::now();
        let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "{said}");
        assert!(said.contains("ActionTimeout"), "{said}");
        assert_eq!(env.path("cleaned").exists(), cleaned, "{cleanup}: {said}");
        // A bound only: the worker's end (about 2 s in), not the 30 s grace's.
        assert!(start.elapsed() < std::time::Duration::from_secs(20), "{cleanup}: {:?}", start.elapsed());
        // Killed after the grace only when the worker outlived it.
        let st = env.cmd(&["status", "--json", "--attempts"]).output().unwrap();
        let st: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
        assert_eq!(st["steps"][0]["attempts"][0]["killed_after_grace"], !cleaned, "{cleanup}: {st}");
        // The attempt ended with the last of its group: its worker's cleanup (1 s) or the grace
        // (1 s) after the timeout, not when its leader died of the signal (lower bounds only).
        let took = st["steps"][0]["attempts"][0]["duration_ms"].as_u64().unwrap();
        assert!(took >= 2_000, "{cleanup}: took {took} ms: {st}");
        assert!(!alive(read_pid(&env.path("worker"))), "{cleanup}");
    }
}

/// The step's first process, dead of the timeout's signal, is not reaped while the rest of its
/// group has the grace: its pid, and so the group's id, stays taken, so that no new process (a
/// step of another run, say, leading a group of the same number once pids go round) can get it
/// before waymark's last signal to the group. The worker sees its leader a zombie throughout.
#[test]
fn a_group_s_leader_is_not_let_go_of_before_the_group_is_done() {
    let env = Env::new();
    env.write(
        "worker.sh",
        "trap 'sleep 0.5; cut -d\" \" -f3 /proc/$(cat leader)/stat > seen 2>&1; exit 0' TERM\nsleep 300 & wait\n",
    );
    // The hook runs once the step is done with, while waymark still runs: the leader is gone
    // by then (waymark reaped it; no one else may).
    flow(
        &env,
        "[hooks]\non_exit = 'if [ -e /proc/$(cat leader) ]; then echo kept > after; else echo gone > after; fi'\n\
         [[step]]\nname = 'wrapped'\nshell = 'echo $$ > leader; sh worker.sh & wait'\ntimeout = 1\nkill_grace = '30s'\n",
    );
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert_eq!(env.read("seen"), "Z\n", "the leader's state during the grace: {said}");
    // Let go of once the group is done: no zombie is left.
    assert_eq!(env.read("after"), "gone\n", "{said}");
}

#[test]
fn a_self_killed_child_is_execution_lost_and_not_retried() {
    let env = Env::new();
    flow(&env, "[[step]]\nname = 'boom'\nshell = 'echo x >> runs; kill -KILL $$'\nretry = { attempts = 3 }\n");
    env.cmd(&["run", "flow.toml"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("ActionExecutionLost(BaseException): killed by signal SIGKILL"));
    assert_eq!(env.count("runs"), 1);

    // Mapped, the same death is an ordinary error and retried.
    let env = Env::new();
    flow(
        &env,
        "[exit_codes]\nSIGKILL = 'ConnectionError'\n[[step]]\nname = 'boom'\nshell = 'echo x >> runs; kill -KILL $$'\nretry = { attempts = 3 }\n",
    );
    env.cmd(&["run", "flow.toml"]).assert().code(1);
    assert_eq!(env.count("runs"), 3);
}

#[test]
fn a_missing_program_s_start_failure_names_the_path_searched() {
    let env = Env::new();
    flow(
        &env,
        "env = { PATH = '/nowhere:/also-nowhere' }\n[[step]]\nname = 'ghost'\nrun = ['no-such-program-waymark']\n",
    );
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    let line = "waymark: ghost: attempt 1/1 failed: ActionExecutionNotStarted: program \
                `no-such-program-waymark` not found in PATH (/nowhere:/also-nowhere) [start failure]";
    assert!(err.lines().any(|l| l == line), "{err}");
}

#[test]
fn a_missing_program_is_not_started_and_retried() {
    let env = Env::new();
    flow(&env, "[[step]]\nname = 'ghost'\nrun = ['no-such-program-waymark']\nretry = { attempts = 2 }\n");
    env.cmd(&["run", "flow.toml"]).assert().code(1).stderr(
        predicate::str::contains(
            "attempt 2/2 failed: ActionExecutionNotStarted: program `no-such-program-waymark` not found",
        )
        .and(predicate::str::contains("attempt 1/2 failed")),
    );
}

#[test]
fn a_missing_workdir_is_not_started() {
    let env = Env::new();
    flow(&env, "[[step]]\nname = 'w'\nrun = ['true']\nworkdir = 'nowhere'\n");
    env.cmd(&["run", "flow.toml"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("ActionExecutionNotStarted").and(predicate::str::contains("nowhere")));
}

#[test]
fn backoff_waits_before_each_retry() {
    let env = Env::new();
    flow(
        &env,
        "[[step]]\nname = 'b'\nshell = 'date +%s.%N >> times; exit 1'\nretry = { attempts = 3, backoff_seconds = 0.4, backoff_multiplier = 2 }\n",
    );
    env.cmd(&["run", "flow.toml"]).assert().code(1);
    let times: Vec<f64> = env.read("times").lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(times.len(), 3);
    // Lower bounds only: a loaded machine may wait longer, never shorter.
    assert!(times[1] - times[0] >= 0.4, "{times:?}");
    assert!(times[2] - times[1] >= 0.8, "{times:?}");
}

#[test]
fn environment_names_the_run_step_and_attempt() {
    let env = Env::new();
    flow(
        &env,
        "name = 'envflow'\nenv = { GREETING = 'hi' }\n[[step]]\nname = 'show'\nshell = 'echo \"$GREETING $LOCAL $WAYMARK_FLOW $WAYMARK_STEP $WAYMARK_ATTEMPT $WAYMARK_MAX_ATTEMPTS $WAYMARK_RUN_ID\"'\nenv = { LOCAL = 'here' }\nretry = { attempts = 2 }\n",
    );
    let out = env.cmd(&["run", "flow.toml"]).assert().success().get_output().stdout.clone();
    let out = String::from_utf8(out).unwrap();
    assert!(out.starts_with("show | hi here envflow show 1 2 "), "{out}");
    let run_id = out.split_whitespace().last().unwrap();
    assert_eq!(run_id.len(), 8);
}

#[test]
fn output_is_prefixed_and_kept_in_logs() {
    let env = Env::new();
    flow(&env, "[[step]]\nname = 'talk'\nshell = 'echo out; echo err >&2; printf partial'\n");
    env.cmd(&["run", "flow.toml"])
        .assert()
        .success()
        .stdout("talk | out\ntalk | partial\n")
        .stderr(predicate::str::contains("talk | err\n"));
    let logs = env.cmd(&["history", "--json"]).output().unwrap().stdout;
    let runs: serde_json::Value = serde_json::from_slice(&logs).unwrap();
    let id = runs[0]["id"].as_str().unwrap().to_owned();
    env.cmd(&["logs", &id, "talk", "--stream", "stdout"]).assert().success().stdout("out\npartial");
    env.cmd(&["logs", &id, "talk", "--stream", "stderr"]).assert().success().stdout("err\n");
}

#[test]
fn sigterm_is_forwarded_and_the_attempt_is_not_retried() {
    let env = Env::new();
    flow(
        &env,
        "[[step]]\nname = 'svc'\nshell = 'trap \"echo got TERM >> got; exit 1\" TERM; echo x >> runs; sleep 300 & echo $! > bgpid; wait'\nretry = { attempts = 5 }\n",
    );
    let out = env.run_until("bgpid", "TERM");
    assert_eq!(out.status.code(), Some(143), "{}", stderr(&out));
    assert_eq!(env.read("got"), "got TERM\n", "the child saw the same signal");
    assert_eq!(env.count("runs"), 1, "a cancelled attempt is never retried");
    wait_until("the grandchild to die", || !alive(read_pid(&env.path("bgpid"))));
    let status = env.cmd(&["status", "--json"]).output().unwrap().stdout;
    let status: serde_json::Value = serde_json::from_slice(&status).unwrap();
    assert_eq!(status["status"], "interrupted");
    assert_eq!(status["steps"][0]["attempts_used"], 0, "a cancelled attempt uses no attempt");
    // Resumed, the step runs attempt 1 again (it is not a failure that used up the budget).
    let _ = std::fs::remove_file(env.path("bgpid"));
    let out = env.run_until("bgpid", "TERM");
    assert!(stderr(&out).contains("svc: attempt 1/5"), "{}", stderr(&out));
    assert_eq!(env.count("runs"), 2);
}

#[test]
fn an_attempt_that_exits_0_after_the_signal_is_still_cancelled_and_runs_again() {
    // Exit 0 on SIGTERM is how many services stop gracefully: it does not say the work was done,
    // so the attempt counts as cancelled and runs again on resume (at least once, never lost).
    let env = Env::new();
    flow(
        &env,
        "[[step]]\nname = 'svc'\nshell = 'echo x >> runs; [ $(wc -l < runs) -ge 2 ] && exit 0; trap \"exit 0\" TERM; echo $$ > pid; sleep 300 & wait'\n",
    );
    let out = env.run_until("pid", "TERM");
    assert_eq!(out.status.code(), Some(143), "{}", stderr(&out));
    env.cmd(&["run", "flow.toml"])
        .assert()
        .success()
        .stderr(predicate::str::contains(" waymark: svc: attempt 1/1 succeeded\n"));
    assert_eq!(env.count("runs"), 2);
}

#[test]
fn a_terminal_that_reads_slowly_loses_no_output() {
    let env = Env::new();
    flow(&env, "[[step]]\nname = 'many'\nshell = 'seq 1 200000'\n");
    let mut child = env.spawn(&["run", "flow.toml"]);
    // Nobody reads stdout until the run has had every chance to overflow a queue.
    env.wait_for_lines_or_exit(&mut child);
    let out = finish(child);
    assert!(out.status.success(), "{}", stderr(&out));
    let shown = String::from_utf8(out.stdout).unwrap();
    assert_eq!(shown.lines().count(), 200_000);
    assert_eq!(shown.lines().last(), Some("many | 200000"));
}

#[test]
fn a_stalled_terminal_does_not_stop_timeouts() {
    let env = Env::new();
    flow(&env, "[[step]]\nname = 'flood'\nshell = 'echo $$ > pid; yes flooding >&2'\ntimeout = 2\nkill_grace = 0\n");
    // The test does not read waymark's stderr until the end: the terminal is stalled.
    let child = env.spawn(&["run", "flow.toml"]);
    env.wait_for_lines("pid", 1);
    let pid = read_pid(&env.path("pid"));
    wait_until("the timed-out attempt to be killed while stderr is not read", || !alive(pid));
    let out = finish(child);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("ActionTimeout"));
}

#[test]
fn waymark_lines_keep_their_place_among_child_lines() {
    let env = Env::new();
    flow(&env, "[[step]]\nname = 'a'\nshell = 'seq 1 30000'\n[[step]]\nname = 'b'\nshell = 'echo last'\n");
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{} run flow.toml 2>&1", assert_cmd::cargo::cargo_bin("waymark").display()))
        .current_dir(env.dir.path())
        .env("WAYMARK_STATE_DIR", env.state())
        .output()
        .unwrap();
    let text = untimed(&String::from_utf8(out.stdout).unwrap());
    let lines: Vec<&str> = text.lines().collect();
    // Child lines, waymark's lines, and the summary table's rows after its heading.
    let table = lines.iter().position(|l| l.starts_with("waymark: steps of run ")).unwrap();
    assert!(
        lines[..table].iter().all(|l| l.starts_with("a | ") || l.starts_with("b | ") || l.starts_with("waymark: "))
    );
    assert!(lines[table + 1..lines.len() - 1].iter().all(|l| l.starts_with("  ")), "{:?}", &lines[table..]);
    let pos = |needle: &str| lines.iter().position(|l| l.contains(needle)).unwrap();
    assert!(pos("a | 30000") < pos("waymark: a: succeeded"));
    assert!(pos("waymark: a: succeeded") < pos("b | last"));
    assert!(lines.last().unwrap().contains("succeeded"), "{:?}", &lines[lines.len() - 3..]);
}

#[test]
fn a_daemon_that_closed_its_output_does_not_survive_a_timeout() {
    let env = Env::new();
    flow(
        &env,
        "[[step]]\nname = 'd'\nshell = 'setsid sh -c \"echo \\$\\$ > esc; exec sleep 300\" > /dev/null 2>&1 & until [ -s esc ]; do sleep 0.01; done; exec sleep 300'\ntimeout = 1\nkill_grace = 0\n",
    );
    env.cmd(&["run", "flow.toml"]).assert().code(1).stderr(predicate::str::contains("ActionTimeout"));
    wait_until("the daemon to die", || !alive(read_pid(&env.path("esc"))));
}

#[test]
fn a_signal_ignored_at_start_stays_ignored() {
    // As under `nohup`: SIGHUP is ignored, so a hang-up does not stop the run.
    let env = Env::new();
    flow(&env, "[[step]]\nname = 'wait'\nshell = 'echo $$ > pid; while [ ! -e release ]; do sleep 0.05; done'\n");
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg(format!("trap '' HUP; exec {} run flow.toml", assert_cmd::cargo::cargo_bin("waymark").display()))
        .current_dir(env.dir.path())
        .env("WAYMARK_STATE_DIR", env.state())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = cmd.spawn().unwrap();
    env.wait_for_lines("pid", 1);
    kill(child.id(), "HUP");
    env.write("release", "");
    let out = finish(child);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn sigint_is_forwarded_and_a_second_signal_kills_at_once() {
    let env = Env::new();
    // The child ignores SIGINT and has a long grace period: only the second signal stops it.
    flow(
        &env,
        "[[step]]\nname = 'deaf'\nshell = 'trap \"echo INT >> got\" INT; echo $$ > pid; while :; do sleep 0.05; done'\nkill_grace = '1h'\n",
    );
    let child = env.spawn(&["run", "flow.toml"]);
    env.wait_for_lines("pid", 1);
    kill(child.id(), "INT");
    env.wait_for_lines("got", 1);
    kill(child.id(), "INT");
    let out = finish(child);
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    assert!(stderr(&out).contains("killing running steps"));
    assert!(!alive(read_pid(&env.path("pid"))));
}

#[test]
fn invalid_command_line_exits_2() {
    let env = Env::new();
    env.cmd(&["run"]).assert().code(2);
    env.cmd(&["frobnicate"]).assert().code(2);
    env.cmd(&["run", "missing.toml"]).assert().code(2).stderr(predicate::str::contains("missing.toml"));
}

#[test]
fn help_has_examples_and_version_prints() {
    let env = Env::new();
    for sub in ["run", "check", "resume", "history", "status", "logs", "gc", "errors", "completions", "man"] {
        env.cmd(&[sub, "--help"]).assert().success().stdout(predicate::str::contains("Examples:"));
    }
    env.cmd(&["--help"]).assert().success().stdout(predicate::str::contains("Exit status"));
    env.cmd(&["--version"]).assert().success().stdout(predicate::str::starts_with("waymark "));
}

#[test]
fn check_prints_the_plan() {
    let env = Env::new();
    flow(
        &env,
        "[policies.net]\nattempts = 4\nexception_types = ['ConnectionError', 'TimeoutError']\nbackoff_seconds = 1\nbackoff_multiplier = 2\nbackoff_max_seconds = 3\n\
         [[step]]\nname = 'fetch'\nrun = ['curl', '-fsS', 'https://example.com']\ntimeout = '30s'\nretry = 'net'\n",
    );
    env.cmd(&["check", "flow.toml"]).assert().success().stdout(
        "flow flow (flow.toml): 1 step, run in order\n  1. fetch\n     command:  curl -fsS https://example.com\n     \
         timeout:  30s per attempt, then SIGTERM, SIGKILL after 10s\n     retry:    up to 4 attempts on ConnectionError, TimeoutError (policy `net`)\n     \
         backoff:  1s, 2s, 3s\n",
    );
    assert!(!env.state().exists(), "check runs nothing and writes no state");
}

#[test]
fn examples_are_valid_and_run() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut seen = 0;
    for entry in std::fs::read_dir(&root).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            seen += 1;
            let env = Env::new();
            env.cmd(&["check", path.to_str().unwrap()]).assert().success();
            if path.ends_with("download.toml") {
                continue; // it needs a server: tests/examples.rs runs it against one
            }
            env.cmd(&["run", "--quiet", path.to_str().unwrap()])
                .env("CRON_DEMO_DIR", env.path("cron-demo"))
                .assert()
                .success();
        }
    }
    assert!(seen >= 8, "examples/ holds the eight flows");
}

#[test]
fn errors_prints_the_class_tree() {
    let env = Env::new();
    env.cmd(&["errors"]).assert().success().stdout(
        predicate::str::starts_with("BaseException\n")
            .and(predicate::str::contains("│   │   ├── ConnectionError\n"))
            .and(predicate::str::contains("├── ActionTimeout\n")),
    );
    flow(&env, "[errors]\nFlakyDisk = ['OSError']\n[[step]]\nname = 'a'\nrun = ['true']\n");
    env.cmd(&["errors", "--flow", "flow.toml"]).assert().success().stdout(predicate::str::contains("FlakyDisk"));
}

#[test]
fn a_huge_line_without_newline_is_logged_whole_and_shown_in_pieces() {
    let env = Env::new();
    flow(&env, "[[step]]\nname = 'big'\nshell = 'head -c 3000000 /dev/zero | tr \"\\\\000\" a'\n");
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let shown = String::from_utf8(out.stdout).unwrap();
    assert_eq!(shown.matches('a').count(), 3_000_000);
    assert!(shown.lines().count() > 1, "shown in pieces, each with its prefix");
    assert!(shown.lines().all(|l| l.starts_with("big | ")));
    let runs: serde_json::Value =
        serde_json::from_slice(&env.cmd(&["history", "--json"]).output().unwrap().stdout).unwrap();
    let id = runs[0]["id"].as_str().unwrap().to_owned();
    let log = env.state().join("logs").join(id).join("big").join("attempt-1.stdout");
    assert_eq!(std::fs::metadata(log).unwrap().len(), 3_000_000);
}

/// Start `sleep 300` in a session of its own (holding the step's output) and wait until it is
/// out of the step's process group; its pid goes to `esc`.
const ESCAPE: &str =
    r#"setsid sleep 300 & p=$!; echo $p > esc; until [ "$(cut -d" " -f5 /proc/$p/stat)" = $p ]; do sleep 0.01; done"#;

#[test]
fn a_process_that_leaves_the_group_is_found_and_killed() {
    let env = Env::new();
    // `setsid` puts the sleep in a session (and group) of its own, still holding the output pipe.
    flow(&env, &format!("[[step]]\nname = 'escape'\nshell = '{ESCAPE}; echo started'\n"));
    env.cmd(&["run", "flow.toml"])
        .assert()
        .success()
        .stderr(predicate::str::contains("killed 1 process(es) of this attempt that had left its process group"));
    wait_until("the escaped process to die", || !alive(read_pid(&env.path("esc"))));
}

/// The same for a hook (or a compensation): the warning names it, not "this attempt".
#[test]
fn a_process_that_leaves_a_hook_s_group_is_killed_and_the_hook_named() {
    let env = Env::new();
    flow(&env, &format!("[hooks]\non_exit = '{ESCAPE}; echo started'\n[[step]]\nname = 'a'\nrun = ['true']\n"));
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let said = common::untimed(&String::from_utf8_lossy(&out.stderr));
    let warnings: Vec<&str> = said.lines().filter(|l| l.contains("warning:")).collect();
    assert_eq!(warnings, ["waymark: warning: killed 1 process(es) of hook on_exit that had left its process group"]);
    wait_until("the escaped process to die", || !alive(read_pid(&env.path("esc"))));
}

#[test]
fn an_escaped_process_holding_only_one_stream_is_found_too() {
    // stdout reaches end-of-file at once, stderr stays held open by the escaped sleep.
    let env = Env::new();
    flow(
        &env,
        &format!(
            "[[step]]\nname = 'half'\nshell = '{}; echo done'\n",
            ESCAPE.replace("sleep 300 &", "sleep 300 > /dev/null &")
        ),
    );
    env.cmd(&["run", "flow.toml"])
        .assert()
        .success()
        .stdout("half | done\n")
        .stderr(predicate::str::contains("killed 1 process(es) of this attempt that had left its process group"));
    wait_until("the escaped process to die", || !alive(read_pid(&env.path("esc"))));
}

#[test]
fn a_timeout_is_enforced_even_when_an_escaped_process_holds_the_output() {
    let env = Env::new();
    flow(
        &env,
        &format!("[[step]]\nname = 'escape'\nshell = '{ESCAPE}; exec sleep 300'\ntimeout = 1\nkill_grace = 0\n"),
    );
    env.cmd(&["run", "flow.toml"]).assert().code(1).stderr(predicate::str::contains("ActionTimeout"));
    wait_until("the escaped process to die", || !alive(read_pid(&env.path("esc"))));
}

#[test]
fn sighup_is_forwarded_like_sigterm() {
    let env = Env::new();
    flow(&env, "[[step]]\nname = 'held'\nshell = 'echo $$ > pid; exec sleep 300'\n");
    let out = env.run_until("pid", "HUP");
    assert_eq!(out.status.code(), Some(129), "{}", stderr(&out));
    assert!(!alive(read_pid(&env.path("pid"))));
}

#[test]
fn an_invalid_flow_is_reported_before_the_state_directory_is_touched() {
    let env = Env::new();
    flow(&env, "[[step]]\nname = 'a'\n");
    env.write("file", "");
    env.cmd(&["--state-dir", "file/state", "run", "flow.toml"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("has nothing to run"));
}

#[test]
fn a_relative_state_dir_still_gives_children_a_usable_error_file() {
    let env = Env::new();
    env.write(
        "sub/flow.toml",
        "[[step]]\nname = 'report'\nshell = 'echo \"{\\\"type\\\": \\\"ConnectionResetError\\\"}\" > \"$WAYMARK_ERROR_FILE\"; exit 1'\n",
    );
    env.cmd(&["--state-dir", "relstate", "run", "sub/flow.toml"]).assert().code(1).stderr(
        predicate::str::contains("ConnectionResetError(ConnectionError").and(predicate::str::contains("[error file]")),
    );
}

#[test]
fn a_script_whose_interpreter_is_missing_says_so() {
    let env = Env::new();
    env.write("job.sh", "#!/no/such/interpreter\necho hi\n");
    std::process::Command::new("chmod").args(["+x", env.path("job.sh").to_str().unwrap()]).status().unwrap();
    flow(&env, "[[step]]\nname = 'job'\nrun = ['./job.sh']\n");
    env.cmd(&["run", "flow.toml"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("cannot execute `./job.sh`: its #! interpreter"));
    // Relative to the step's working directory.
    std::fs::create_dir(env.path("sub")).unwrap();
    std::fs::rename(env.path("job.sh"), env.path("sub/job.sh")).unwrap();
    flow(&env, "[[step]]\nname = 'job'\nrun = ['./job.sh']\nworkdir = 'sub'\n");
    env.cmd(&["run", "flow.toml"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("cannot execute `./job.sh`: its #! interpreter"));
}

#[test]
fn descriptors_leaked_to_waymark_do_not_reach_the_steps() {
    let env = Env::new();
    let check = "if [ -e /proc/self/fd/7 ]; then echo leaked; else echo closed; fi >> result";
    flow(&env, &format!("[[step]]\nname = 'fds'\nshell = '{check}'\n"));
    // The caller leaks fd 7 (opened without close-on-exec); a plain child of it does see it.
    let leaking = |inner: &str| {
        std::process::Command::new("bash")
            .arg("-c")
            .arg(format!("exec 7>leaked-file; {inner}"))
            .current_dir(env.dir.path())
            .env("WAYMARK_STATE_DIR", env.state())
            .output()
            .unwrap()
    };
    assert!(leaking(&format!("sh -c '{check}'")).status.success());
    assert_eq!(env.read("result"), "leaked\n");
    let out = leaking(&format!("exec {} run flow.toml", assert_cmd::cargo::cargo_bin("waymark").display()));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(env.read("result"), "leaked\nclosed\n");
}

#[test]
fn a_traceback_longer_than_the_stderr_tail_is_said_to_be_cut() {
    let env = Env::new();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/python/huge_traceback.py");
    flow(&env, &format!("[[step]]\nname = 'deep'\nrun = ['python3', '{}']\n", script.display()));
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let message = "exit status 1 (the traceback may be cut: stderr tail is 64 KiB; use an error file)";
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("waymark: deep: attempt 1")).collect();
    let warning = err.lines().find(|l| l.starts_with("waymark: warning: deep: ")).unwrap_or_default();
    assert_eq!(
        [warning, lines[1]],
        [
            "waymark: warning: deep: attempt 1: stderr ends like a Python traceback longer than the 64 KiB that \
             waymark reads, so its error class was not recognised; report the error through WAYMARK_ERROR_FILE \
             (examples/helpers/waymark_errors.py does it for Python)",
            &format!("waymark: deep: attempt 1/1 failed: CalledProcessError: {message} [exit status]"),
        ],
        "{err}"
    );
    // The attempt's record says so too.
    let status = env.cmd(&["status", "--json"]).output().unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["steps"][0]["last_error"]["message"], message);
}

/// A program named without a `/` is found on PATH and sees its own name as `argv[0]`, at every
/// attempt, as `execvp` gives it.
#[test]
fn a_program_found_on_path_keeps_its_name_as_argv0() {
    let env = Env::new();
    let script = r#"tr '\0' '\n' < /proc/$$/cmdline | head -1 >> names; exit 1"#;
    flow(&env, &format!("[[step]]\nname = 'named'\nrun = ['sh', '-c', '''{script}''']\nretry = {{ attempts = 2 }}\n"));
    env.cmd(&["run", "flow.toml"]).assert().code(1);
    assert_eq!(env.read("names"), "sh\nsh\n");
}

/// A program removed from the PATH directory it was found in during the run is looked up again:
/// the next attempt runs the copy in a later directory of the PATH instead of failing to start.
#[test]
fn a_program_moved_between_attempts_is_found_again_on_path() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new();
    let tool = "#!/bin/sh\necho \"$0\" >> ran\nrm -f first/tool\nexit 1\n";
    for dir in ["first", "second"] {
        let path = env.write(&format!("{dir}/tool"), tool);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let dir = env.path("");
    let path = format!("{}first:{}second:/usr/bin:/bin", dir.display(), dir.display());
    flow(
        &env,
        &format!("[[step]]\nname = 'moved'\nrun = ['tool']\nenv = {{ PATH = '{path}' }}\nretry = {{ attempts = 2 }}\n"),
    );
    env.cmd(&["run", "flow.toml"]).assert().code(1).stderr(predicate::str::contains("not found").not());
    let ran = env.read("ran").replace(&dir.display().to_string(), "DIR/");
    assert_eq!(ran, "DIR/first/tool\nDIR/second/tool\n");
}

/// Many steps at once under the usual soft limit on open files: waymark raises its own soft limit
/// as far as `max_parallel` needs (about 200 attempts at once stopped a run at 1024 with `Too many
/// open files`), and says what to do when the hard limit is too low for it.
#[test]
fn many_steps_at_once_get_the_open_files_they_need_within_the_hard_limit() {
    use std::io::Write;
    let test = "many_steps_at_once_get_the_open_files_they_need_within_the_hard_limit";
    let (_, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
    if hard < 1000 {
        assert!(std::env::var_os("CI").is_none(), "{test} needs a hard limit of 1000 open files, and CI must run it");
        let _ = writeln!(std::io::stderr(), "SKIPPED {test}: needs a hard limit of 1000 open files (`ulimit -Hn`)");
        return;
    }
    let env = Env::new();
    let mut body = String::from("name = 'fd'\nmax_parallel = 60\n");
    for i in 0..60 {
        body += &format!("[[step]]\nname = 's{i}'\nneeds = []\nshell = 'echo out; echo err >&2; sleep 2'\n");
    }
    env.write("fd.toml", &body);
    // The same, each step holding its descriptors a shorter while.
    env.write("short.toml", &body.replace("sleep 2", "sleep 0.2"));
    let under = |limits: &str, mode: &str, file: &str| {
        let waymark = assert_cmd::cargo::cargo_bin("waymark");
        let script = format!("{limits} && exec \"$0\" run {mode} {file}");
        std::process::Command::new("sh")
            .args(["-c", &script])
            .arg(waymark)
            .current_dir(env.path(""))
            .env("WAYMARK_STATE_DIR", env.state())
            .output()
            .unwrap()
    };
    // 60 attempts at once hold about 300 descriptors: past a soft limit of 200, within the hard one.
    let out = under("ulimit -Sn 200", "--quiet", "fd.toml");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stderr(&out), "");
    // A hard limit of 300 cannot be raised: waymark warns before the first step starts, and starts
    // no more steps at once than it allows (60 at once would run out of descriptors).
    let out = under("ulimit -Sn 300 && ulimit -Hn 300", "--json", "short.toml");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let events: Vec<serde_json::Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let warnings: Vec<&str> =
        events.iter().filter(|e| e["kind"] == "warning").map(|e| e["message"].as_str().unwrap()).collect();
    // What the runner holds itself is counted when it starts: the figures depend on it.
    let said = regex::Regex::new(
        "^60 steps at once may need about ([0-9]+) open files, and this process may open at most 300 \
         \\(`ulimit -Hn`\\): this runner starts at most ([0-9]+) at once \\(the others wait for a slot, and a \
         step's timeout counts that wait\\); raise the hard limit to run more side by side$",
    )
    .unwrap();
    let [warning] = warnings[..] else { panic!("one warning expected: {warnings:?}") };
    let figures = said.captures(warning).unwrap_or_else(|| panic!("{warning}"));
    let (need, fits): (usize, usize) = (figures[1].parse().unwrap(), figures[2].parse().unwrap());
    // 8 files a step beside the runner's own (a few dozen, more if whoever started it leaked some).
    assert!(need > 300 && need - 60 * 8 < 250, "{warning}");
    assert_eq!(fits, (300 - (need - 60 * 8)) / 8, "{warning}");
    let (mut running, mut most, mut succeeded) = (0, 0, 0);
    for e in &events {
        match e["event"].as_str().unwrap() {
            "attempt.started" => running += 1,
            "attempt.finished" => running -= 1,
            "step.finished" if e["status"] == "succeeded" => succeeded += 1,
            _ => {}
        }
        most = most.max(running);
    }
    assert_eq!((most, succeeded), (fits, 60));
}

/// Out of file descriptors, an attempt does not start: it fails with `ActionExecutionNotStarted`
/// (retried as its policy says) rather than stop the run as waymark's own failure would (exit 4).
/// The limit is lowered one descriptor at a time from where waymark cannot even start to where the
/// step succeeds, so that every point between falls on one of waymark's descriptors.
#[test]
fn an_attempt_without_descriptors_fails_as_not_started_and_the_run_goes_on() {
    let env = Env::new();
    env.write("fd.toml", "name = 'fd'\n[[step]]\nname = 's'\nrun = ['true']\nretry = { attempts = 2 }\n");
    let waymark = assert_cmd::cargo::cargo_bin("waymark");
    let not_started = "cannot start `true`: no file descriptor left to start it with (its log directory, pipes, \
                       stdin), waymark's own limit (`ulimit -n`) is reached; fewer steps at once (`max_parallel`) \
                       or a higher limit leaves room";
    let mut starved = 0;
    for limit in 8..=256 {
        let _ = std::fs::remove_dir_all(env.state());
        let out = std::process::Command::new("sh")
            .args(["-c", &format!("ulimit -n {limit} && exec \"$0\" run --json fd.toml")])
            .arg(&waymark)
            .current_dir(env.path(""))
            .env("WAYMARK_STATE_DIR", env.state())
            .output()
            .unwrap();
        let events: Vec<serde_json::Value> =
            String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        // Too few to read the flow, open the store or start the runtime: refused before the run.
        if !events.iter().any(|e| e["event"] == "run.started") {
            assert!(matches!(out.status.code(), Some(2 | 4)), "limit {limit}: {}", stderr(&out));
            continue;
        }
        let errors: Vec<(&str, &str)> = events
            .iter()
            .filter(|e| e["event"] == "attempt.finished" && !e["error"].is_null())
            .map(|e| (e["error"]["type"].as_str().unwrap(), e["error"]["message"].as_str().unwrap()))
            .collect();
        match out.status.code() {
            Some(0) => {
                assert!(errors.is_empty(), "limit {limit}: {errors:?}");
                break;
            }
            Some(1) => {
                assert_eq!(errors, [("ActionExecutionNotStarted", not_started); 2], "limit {limit}");
                starved += 1;
            }
            code => panic!("limit {limit}: exit status {code:?} once the run started: {}", stderr(&out)),
        }
    }
    // At least the step's log directory, its two pipes and its logs' directory lie between.
    assert!(starved >= 3, "{starved} limits left the step without descriptors");
}
