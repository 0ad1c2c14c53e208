//! Catch handlers, end to end with real processes: a timed-out step's handler runs with the error
//! in its environment and the steps that need it run; a failing handler fails the step with its
//! own error; a run killed between a step's final error and its handler runs the handler on resume,
//! once.

mod common;

use common::Env;

/// What waymark wrote on stderr: its lines without their times (nor the date line), with pids and
/// durations normalised.
fn stderr(out: &std::process::Output) -> String {
    common::normalise_plain(&common::untimed(&common::stderr(out)))
}
use serde_json::Value;

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn status(env: &Env) -> Value {
    let out = env.cmd(&["status", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn states(env: &Env) -> Vec<String> {
    status(env)["steps"].as_array().unwrap().iter().map(|s| s["state"].as_str().unwrap().to_owned()).collect()
}

const TIMED_OUT: &str = r#"
[[step]]
name = "fetch"
shell = "echo $$ > fetch.pid; exec sleep 60"
timeout = 1
kill_grace = 0
catch = [
    { exception_types = ["ConnectionError"], run = ["touch", "wrong-handler"] },
    { exception_types = ["ActionTimeout"], shell = "printf '%s|%s|%s' \"$WAYMARK_ERROR_TYPE\" \"$WAYMARK_ERROR_BASES\" \"$WAYMARK_ERROR_MESSAGE\" > caught; echo fallback" },
]

[[step]]
name = "load"
run = ["touch", "loaded"]
"#;

#[test]
fn a_timed_out_step_is_caught_by_the_first_matching_handler_and_the_next_step_runs() {
    let env = Env::new();
    env.write("flow.toml", TIMED_OUT);
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(env.read("caught"), "ActionTimeout|BaseException|timed out after 1s");
    assert!(!env.path("wrong-handler").exists(), "only the first handler that matches runs");
    assert!(env.path("loaded").exists());
    // The handler's output is shown like a step's, and kept in its own log.
    assert_eq!(stdout(&out), "fetch | fallback\n");
    let err = stderr(&out);
    // The lines that name the run aside (its id).
    let lines: Vec<&str> =
        err.lines().filter(|l| !l.starts_with("waymark: run ") && !l.starts_with("waymark: steps of run ")).collect();
    assert_eq!(
        lines,
        [
            "waymark: fetch: started",
            "waymark: fetch: attempt 1/1 started (pid PID)",
            "waymark: fetch: attempt 1/1 failed: ActionTimeout: timed out after 1s [timeout]",
            "waymark: fetch: not retried: the step retries no error (it has no `retry`, or an empty `exception_types`)",
            "waymark: fetch: running its catch handler for ActionTimeout",
            "waymark: fetch: error caught; the steps that need it run",
            "waymark: load: started",
            "waymark: load: attempt 1/1 started (pid PID)",
            "waymark: load: attempt 1/1 succeeded",
            "waymark: load: succeeded (1 attempt)",
            "  STEP   STATUS  ATTEMPTS    DURATION  DETAIL",
            "  fetch  caught       1/1    DURATION  caught ActionTimeout",
            "  load   ok           1/1    DURATION",
        ]
    );
    assert_eq!(states(&env), ["caught", "succeeded"]);
    let logs = env.cmd(&["status", "--json"]).output().unwrap();
    let run = serde_json::from_slice::<Value>(&logs.stdout).unwrap()["id"].as_str().unwrap().to_owned();
    let catch_log = env.state().join("logs").join(&run).join("fetch").join("catch-1.stdout");
    assert_eq!(std::fs::read_to_string(catch_log).unwrap(), "fallback\n");
    // The timed-out attempt's process is gone.
    let pid = common::read_pid(&env.path("fetch.pid"));
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "the timed-out attempt's sleep survived");
}

#[test]
fn a_failing_handler_fails_the_step_with_its_own_error() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "[[step]]\nname = 'fetch'\nshell = 'exit 7'\ncatch = [{ exception_types = ['Exception'], shell = 'exit 3' }]\n\
         [[step]]\nname = 'load'\nrun = ['touch', 'loaded']\n",
    );
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.lines().any(|l| l
            == "waymark: warning: fetch: its catch handler failed (exit status 3); it wrote nothing; the step \
                    fails with its error"),
        "{err}"
    );
    // The report is about the step's own error, not the handler's.
    assert!(err.contains("  step fetch:\n    attempt 1: started "), "{err}");
    assert!(
        err.contains(": CalledProcessError(SubprocessError, Exception, BaseException): exit status 7 [exit status]\n"),
        "{err}"
    );
    assert!(!env.path("loaded").exists());
    assert_eq!(states(&env), ["failed", "skipped"]);
}

#[test]
fn a_handler_left_to_run_by_a_killed_runner_runs_once_on_resume() {
    if !common::have_crash_hook("a_handler_left_to_run_by_a_killed_runner_runs_once_on_resume") {
        return;
    }
    let env = Env::new();
    env.write(
        "flow.toml",
        "[[step]]\nname = 'fetch'\nshell = 'echo x >> attempts; exit 1'\n\
         catch = [{ exception_types = ['CalledProcessError'], shell = 'echo x >> handled' }]\n\
         [[step]]\nname = 'load'\nshell = 'echo x >> loaded'\n",
    );
    // The runner is SIGKILLed right after fetch's final error is committed, before its handler.
    let out = env.cmd(&["run", "flow.toml"]).env("WAYMARK_TEST_CRASH_AFTER", "fetch").output().unwrap();
    assert_eq!(out.status.signal_number(), Some(9), "{}", stderr(&out));
    assert_eq!(states(&env), ["interrupted", "pending"]);
    assert!(!env.path("handled").exists());
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!((env.count("attempts"), env.count("handled"), env.count("loaded")), (1, 1, 1));
    assert_eq!(states(&env), ["caught", "succeeded"]);
}

trait SignalNumber {
    fn signal_number(&self) -> Option<i32>;
}

impl SignalNumber for std::process::ExitStatus {
    fn signal_number(&self) -> Option<i32> {
        std::os::unix::process::ExitStatusExt::signal(self)
    }
}

/// A step whose error was caught is done, like a succeeded one: a runner killed after it resumes
/// saying so (`steps_done`, a `step.skipped` line, the summary), rather than leaving it out.
#[test]
fn a_resumed_run_counts_and_names_a_step_caught_by_the_runner_before() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "[[step]]\nname = 'a'\nshell = 'exit 3'\ncatch = [{ shell = 'true' }]\n\
         [[step]]\nname = 'b'\nshell = 'if [ -e release ]; then exit 0; fi; echo $$ > ready; exec sleep 60'\n\
         [[step]]\nname = 'c'\nshell = 'true'\n",
    );
    let _ = env.run_until("ready", "KILL");
    env.write("release", "");
    let out = env.cmd(&["run", "--json", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let said: Vec<Value> = stdout(&out).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let resumed = said.iter().find(|e| e["event"] == "run.resumed").expect("run.resumed");
    assert_eq!((resumed["steps_total"].as_u64(), resumed["steps_done"].as_u64()), (Some(3), Some(1)));
    let skipped: Vec<(&str, &str)> = said
        .iter()
        .filter(|e| e["event"] == "step.skipped")
        .map(|e| (e["step"].as_str().unwrap(), e["reason"].as_str().unwrap()))
        .collect();
    assert_eq!(skipped, [("a", "already_caught")]);
    assert_eq!(states(&env), ["caught", "succeeded", "succeeded"]);
}

/// A runner killed while a catch handler runs: the next runner kills the handler's processes
/// first, and says they were the handler's, then runs it again.
#[test]
fn a_catch_handler_left_running_by_a_dead_runner_is_named_when_its_processes_are_killed() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "[[step]]\nname = 'a'\nshell = 'exit 3'\n\
         catch = [{ shell = 'if [ -e release ]; then exit 0; fi; echo $$ > ready; exec sleep 60' }]\n",
    );
    let _ = env.run_until("ready", "KILL");
    env.write("release", "");
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let said = common::untimed(&stderr(&out));
    assert!(
        said.lines().any(|l| l == "waymark: warning: a: killed 1 leftover process(es) of the catch handler of attempt 1 from the previous runner"),
        "{said}"
    );
    assert_eq!(states(&env), ["caught"]);
}

/// `status` text with the run id, the flow's path, times and durations replaced.
fn status_text(env: &Env) -> String {
    let st = status(env);
    let out = env.cmd(&["status"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    let text = text.replace(st["id"].as_str().unwrap(), "RUN").replace(st["path"].as_str().unwrap(), "PATH");
    common::normalise_status_durations(&common::normalise_times(&text))
}

/// A runner stopped while a catch handler runs, by a signal or by SIGKILL: no handler is running,
/// so `status` shows the step `interrupted` (not `catching`), as it shows a step whose attempt a
/// signal cut short, and says that its handler runs again on resume; the resume runs it.
#[test]
fn a_catch_handler_stopped_with_its_runner_shows_interrupted_and_runs_again_on_resume() {
    for (signal, run_status, why) in [
        ("TERM", "interrupted", "the run was interrupted"),
        ("KILL", "running, but its runner is gone (`waymark resume RUN` resumes it)", "its runner died"),
    ] {
        let env = Env::new();
        env.write(
            "flow.toml",
            "[[step]]\nname = 'a'\nshell = 'exit 3'\n\
             catch = [{ shell = 'echo x >> handled; if [ -e release ]; then exit 0; fi; echo $$ > ready; exec sleep 60' }]\n\
             [[step]]\nname = 'b'\nshell = 'true'\n",
        );
        let _ = env.run_until("ready", signal);
        assert_eq!(
            status_text(&env),
            format!(
                "run RUN of flow (PATH): {run_status}, started TIME{}\n  \
                 a                    interrupted  attempts 1/1  Ns\n  \
                 {:20} last error: CalledProcessError(SubprocessError, Exception, BaseException): exit status 3 \
                 [exit status]\n  \
                 {:20} its catch handler for CalledProcessError did not finish: {why}; it runs again on resume\n  \
                 b                    pending      attempts 0/1\n",
                if signal == "TERM" { ", ended TIME" } else { "" },
                "",
                ""
            ),
            "after SIG{signal}"
        );
        assert_eq!(states(&env), ["interrupted", "pending"], "after SIG{signal}");
        env.write("release", "");
        let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert_eq!(env.count("handled"), 2, "after SIG{signal}");
        assert_eq!(states(&env), ["caught", "succeeded"], "after SIG{signal}");
    }
}

/// An attempt that ends without a child, with nothing else running, leaves its step to its catch
/// handler: the handler runs and the run goes on (the runner used to wait forever, for a child's
/// exit that could not come). Two such attempts: one whose program cannot be started, and one whose
/// timeout passed while it waited for the one slot.
#[test]
fn a_step_that_ends_without_a_child_is_caught_when_nothing_else_runs() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "max_parallel = 1\n\
         [[step]]\nname = 'missing'\nrun = ['./no-such-program']\n\
         catch = [{ exception_types = ['ActionExecutionNotStarted'], shell = 'echo caught $WAYMARK_ERROR_TYPE' }]\n\
         [[step]]\nname = 'busy'\nshell = 'sleep 0.2'\n\
         [[step]]\nname = 'queued'\nneeds = ['missing']\nrun = ['true']\ntimeout = '10ms'\n\
         catch = [{ exception_types = ['ActionTimeout'], shell = 'echo caught $WAYMARK_ERROR_TYPE' }]\n",
    );
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "missing | caught ActionExecutionNotStarted\nqueued | caught ActionTimeout\n");
    assert_eq!(states(&env), ["caught", "succeeded", "caught"]);
}

/// The failure report (all that `--quiet` prints, as under cron) says that the step's catch
/// handler ran and why it did not succeed, with its log when it wrote one: without it, a handler
/// that failed, or that the workflow's deadline stopped, left no trace in the report.
#[test]
fn the_failure_report_says_why_the_catch_handler_did_not_succeed() {
    for (flow, said) in [
        (
            "[[step]]\nname = 'fetch'\nshell = 'exit 7'\n\
             catch = [{ shell = 'echo no cache either >&2; exit 3' }]\n",
            "its catch handler for CalledProcessError did not succeed (exit status 3), so the step fails with its \
             error; its output: LOGS/catch-1.stderr",
        ),
        (
            "timeout = '1s'\n[[step]]\nname = 'fetch'\nshell = 'exit 7'\ncatch = [{ shell = 'exec sleep 60' }]\n",
            "its catch handler for CalledProcessError did not succeed (the workflow's deadline passed), so the step \
             fails with its error; it wrote nothing",
        ),
    ] {
        let env = Env::new();
        env.write("flow.toml", flow);
        let out = env.cmd(&["run", "--quiet", "flow.toml"]).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let id = status(&env)["id"].as_str().unwrap().to_owned();
        let logs = env.state().join("logs").join(&id).join("fetch");
        let report = common::normalise_times(&common::stderr(&out))
            .replace(&logs.display().to_string(), "LOGS")
            .replace(&id, "RUN");
        assert_eq!(
            report,
            format!(
                "waymark: run RUN failed\n  \
                 step fetch:\n    \
                 attempt 1: started TIME, took DURATION: CalledProcessError(SubprocessError, Exception, \
                 BaseException): exit status 7 [exit status]\n    \
                 not retried: the step retries no error (it has no `retry`, or an empty `exception_types`)\n    \
                 {said}\n    \
                 stdout of attempt 1: nothing\n    \
                 stderr of attempt 1: nothing\n    \
                 logs: none (attempt 1 wrote nothing to stdout or stderr)\n  \
                 run id: RUN (`waymark status RUN` shows it; `waymark resume RUN` runs its failed steps again with a \
                 fresh budget)\n"
            )
        );
    }
}

/// A failed handler's warning says where its output is: the logs it wrote (a log is created on its
/// first byte), as a failed hook's does; and one that could not start says so.
#[test]
fn a_failed_handler_warning_names_its_logs() {
    let env = Env::new();
    let warnings = |flow: &str| {
        env.write("flow.toml", flow);
        let out = env.cmd(&["run", "--fresh", "flow.toml"]).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let warnings: Vec<String> =
            stderr(&out).lines().filter(|l| l.starts_with("waymark: warning: ")).map(str::to_owned).collect();
        let history: Value = serde_json::from_slice(&env.cmd(&["history", "--json"]).output().unwrap().stdout).unwrap();
        (history[0]["id"].as_str().unwrap().to_owned(), warnings)
    };
    let (run, said) = warnings(
        "[[step]]\nname = 'fetch'\nshell = 'exit 7'\n\
         catch = [{ exception_types = ['Exception'], shell = 'echo trying; echo no cache >&2; exit 3' }]\n",
    );
    let logs = env.state().join("logs").join(&run).join("fetch");
    assert_eq!(
        said,
        [format!(
            "waymark: warning: fetch: its catch handler failed (exit status 3); its output: {}, {}; the step fails \
             with its error",
            logs.join("catch-1.stdout").display(),
            logs.join("catch-1.stderr").display()
        )]
    );
    let (_, said) =
        warnings("[[step]]\nname = 'load'\nshell = 'exit 7'\ncatch = [{ run = ['/nonexistent/handler'] }]\n");
    assert_eq!(
        said,
        ["waymark: warning: load: its catch handler failed (it could not start: program `/nonexistent/handler` \
             not found); it wrote nothing; the step fails with its error",]
    );
}

/// `fail_fast` cancels a running catch handler as it cancels attempts: a line says so, and the
/// summary table says that its step's error was left unhandled, where it said only that the step
/// was not run again.
#[test]
fn a_catch_handler_cancelled_by_fail_fast_is_said_and_its_error_left_unhandled() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "fail_fast = true\n\
         [[step]]\nname = 'a'\nneeds = []\nshell = 'exit 2'\n\
         catch = [{ shell = 'touch handling; exec sleep 60' }]\n\
         [[step]]\nname = 'b'\nneeds = []\nshell = 'while [ ! -e handling ]; do sleep 0.02; done; exit 3'\n",
    );
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let said = stderr(&out);
    let lines: Vec<&str> = said.lines().filter(|l| l.contains("a: ") || l.starts_with("  a ")).collect();
    assert_eq!(
        lines[lines.len() - 3..],
        [
            "waymark: a: its catch handler was cancelled by fail_fast; its error is not handled",
            "waymark: a: not run again: the run failed first",
            "  a     stopped       1/1    DURATION  its catch handler was cancelled by fail_fast; its error is not handled",
        ],
        "{said}"
    );
}

/// A signal cancels a running catch handler: a line says so and that it runs again on resume.
#[test]
fn a_catch_handler_cancelled_by_a_signal_is_said_to_run_again_on_resume() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "[[step]]\nname = 'a'\nshell = 'exit 2'\ncatch = [{ shell = 'echo x > handling; exec sleep 60' }]\n",
    );
    let out = env.run_until("handling", "TERM");
    assert_eq!(out.status.code(), Some(143), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("\nwaymark: a: its catch handler was cancelled by SIGTERM; it runs again on resume\n"),
        "{}",
        stderr(&out)
    );
}

/// `status` says how a step's catch handler failed, under the step's own error, and where its
/// output is; `--json` gives it as `catch`. A handler of an earlier budget's error is not said of
/// the step once it ran again.
#[test]
fn status_says_how_a_catch_handler_failed_and_where_its_output_is() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'hf'\n\
         [[step]]\nname = 'a'\nneeds = []\nshell = '[ -e ok ] && exit 0; exit 2'\n\
         catch = [{ shell = 'echo nope >&2; exit 3' }]\n\
         [[step]]\nname = 'b'\nneeds = []\nshell = '[ -e ok ] && exec sleep 60; exit 4'\ntimeout = '1s'\n\
         kill_grace = 0\ncatch = [{ exception_types = ['CalledProcessError'], shell = 'exec sleep 60' }]\n",
    );
    let out = env.cmd(&["run", "--quiet", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let st = status(&env);
    let id = st["id"].as_str().unwrap().to_owned();
    let text = env.cmd(&["status"]).output().unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("catch handler")).collect();
    let log = env.state().join(format!("logs/{id}/a/catch-1.stderr"));
    assert_eq!(
        lines,
        [
            format!(
                "                       its catch handler for CalledProcessError failed: CalledProcessError(SubprocessError, \
                 Exception, BaseException): exit status 3 [exit status]; its output: {}",
                log.display()
            ),
            "                       its catch handler for CalledProcessError failed: ActionTimeout(BaseException): timed \
             out after 1s [timeout]; it wrote nothing"
                .to_owned(),
        ],
        "{text}"
    );
    assert_eq!(st["steps"][0]["last_error"]["message"], "exit status 2");
    assert_eq!(st["steps"][0]["catch"]["exit_code"], 3);
    assert_eq!(st["steps"][0]["catch"]["outcome"], "failed");
    assert_eq!(st["steps"][1]["catch"]["error"]["class"], "ActionTimeout");
    assert_eq!(st["steps"][1]["last_error"]["message"], "exit status 4");
    // Resumed with a fresh budget: `a` succeeds, and `b` times out, which its handler does not
    // take: neither is said to have had its handler fail.
    env.write("ok", "");
    let out = env.cmd(&["resume", "--quiet", &id]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = String::from_utf8(env.cmd(&["status"]).output().unwrap().stdout).unwrap();
    assert!(!text.contains("catch handler"), "{text}");
    assert!(text.contains("last error: ActionTimeout(BaseException): timed out after 1s [timeout]"), "{text}");
}
