//! Compensation and hooks, end to end with real processes: a failed run undoes what its steps did
//! in reverse order of completion, then runs its hooks once with the run's outcome in their
//! environment; a run killed after its failure compensates on resume, once; the workflow deadline
//! compensates too; a compensated run cannot be resumed; each is told its step, attempt and budget.

mod common;

use common::Env;

/// What waymark wrote on stderr: its lines without their times (nor the date line), with pids and
/// durations normalised.
fn stderr(out: &std::process::Output) -> String {
    common::normalise_plain(&common::untimed(&common::stderr(out)))
}
use serde_json::Value;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn run_id(env: &Env) -> String {
    let out = env.cmd(&["history", "--json"]).output().unwrap();
    let runs: Value = serde_json::from_slice(&out.stdout).unwrap();
    runs[0]["id"].as_str().unwrap().to_owned()
}

const FLOW: &str = r#"
[hooks]
on_success = ["sh", "-c", "echo success >> hooks"]
on_failure = ["sh", "-c", "echo \"failure $WAYMARK_RUN_STATUS $WAYMARK_FAILED_STEP $WAYMARK_ERROR_TYPE\" >> hooks"]
on_exit = ["sh", "-c", "echo \"exit $WAYMARK_RUN_STATUS\" >> hooks"]

[[step]]
name = "a"
shell = "echo a >> done"
compensate = ["sh", "-c", "echo undo-a >> undone"]

[[step]]
name = "b"
shell = "echo b >> done"
compensate = "echo undo-b >> undone; exit 3"

[[step]]
name = "c"
shell = "echo c >> done; test -z \"$FAIL\""
"#;

#[test]
fn a_failed_run_compensates_in_reverse_order_and_runs_its_hooks_once() {
    let env = Env::new();
    env.write("flow.toml", FLOW);
    let out = env.cmd(&["run", "flow.toml"]).env("FAIL", "1").output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(env.read("done"), "a\nb\nc\n");
    // b's compensation fails: reported, and a's still runs.
    assert_eq!(env.read("undone"), "undo-b\nundo-a\n");
    assert_eq!(env.read("hooks"), "failure failed c CalledProcessError\nexit failed\n");
    let err = stderr(&out);
    for line in [
        "waymark: b: compensating (the run failed)",
        "waymark: warning: b: its compensation failed (exit status 3); it wrote nothing; the other compensations go on",
        "waymark: a: compensating (the run failed)",
        "  step c:",
    ] {
        assert!(err.lines().any(|l| l == line), "missing {line:?} in:\n{err}");
    }
    // A compensated run cannot be resumed: its steps' work was undone, but for b's, whose
    // compensation failed.
    let id = run_id(&env);
    let out = env.cmd(&["resume", &id]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        format!(
            "error: run {id} failed and its compensations ran (but the compensation of `b` did not succeed: what \
             that step did may not be undone; `waymark status {id}` shows how each ended), so it cannot be resumed; \
             `waymark run --fresh {}` starts the flow anew\n",
            env.path("flow.toml").canonicalize().unwrap().display()
        )
    );
    assert_eq!(env.read("done"), "a\nb\nc\n", "nothing ran again");
}

#[test]
fn a_succeeded_run_runs_on_success_and_on_exit_and_compensates_nothing() {
    let env = Env::new();
    env.write("flow.toml", FLOW);
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(env.read("hooks"), "success\nexit succeeded\n");
    assert!(!env.path("undone").exists());
    // The hooks' logs are kept with the run's, in `hooks/`; these hooks print nothing, and a log
    // is created on its first byte, so there is no file.
    let hooks = env.state().join("logs").join(run_id(&env)).join("hooks");
    assert!(hooks.is_dir());
    assert_eq!(std::fs::read_dir(&hooks).unwrap().count(), 0);
}

#[test]
fn a_run_killed_after_its_failure_compensates_on_resume_once() {
    if !common::have_crash_hook("a_run_killed_after_its_failure_compensates_on_resume_once") {
        return;
    }
    let env = Env::new();
    env.write("flow.toml", FLOW);
    // SIGKILLed right after c's failure is committed: before any compensation or hook.
    let out = env.cmd(&["run", "flow.toml"]).env("FAIL", "1").env("WAYMARK_TEST_CRASH_AFTER", "c").output().unwrap();
    assert_eq!(out.status.signal(), Some(9), "{}", stderr(&out));
    assert!(!env.path("undone").exists() && !env.path("hooks").exists());
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(env.read("done"), "a\nb\nc\n", "no step ran again");
    assert_eq!(env.read("undone"), "undo-b\nundo-a\n");
    assert_eq!(env.read("hooks"), "failure failed c CalledProcessError\nexit failed\n");
}

#[test]
fn the_workflow_deadline_compensates_what_succeeded() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "timeout = 1\n[hooks]\non_failure = ['sh', '-c', 'echo \"$WAYMARK_ERROR_TYPE\" > hooks']\n\
                  [[step]]\nname = 'a'\nshell = 'echo a >> done'\ncompensate = 'echo undo-a >> undone'\n\
         [[step]]\nname = 'b'\nshell = 'echo b >> done'\ncompensate = 'echo undo-b >> undone'\n\
         [[step]]\nname = 'c'\nshell = 'exec sleep 60'\nkill_grace = 0\n",
    );
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    // In reverse order of completion: b finished after a.
    assert_eq!(env.read("undone"), "undo-b\nundo-a\n");
    assert_eq!(env.read("hooks"), "WorkflowTimeout\n");
}

#[test]
fn the_backup_example_undoes_its_copy_when_verification_fails() {
    let env = Env::new();
    let flow = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/backup.toml");
    let dest = env.path("dest");
    let param = format!("dest={}", dest.display());
    let out = env.cmd(&["run", "--fresh", flow.to_str().unwrap(), "--param", &param]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let id = run_id(&env);
    assert_eq!(std::fs::read_to_string(dest.join(&id).join("data")).unwrap(), "data\n");
    assert!(!dest.join(format!("{id}.lock")).exists(), "on_exit removed the lock");
    let out = env
        .cmd(&["run", "--fresh", flow.to_str().unwrap(), "--param", &param])
        .env("BACKUP_FAIL", "1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let id = run_id(&env);
    assert!(!dest.join(&id).exists(), "the partial copy was removed");
    assert!(!dest.join(format!("{id}.lock")).exists());
    assert_eq!(
        stdout(&out),
        "copy | removed the partial copy\non_failure | backup failed at verify: CalledProcessError\n"
    );
}

#[test]
fn a_failed_run_resumed_with_waymark_resume_runs_its_hooks_again_when_it_ends() {
    // No compensations: the failed run may be resumed. Its hooks ran when it failed; the resumed
    // run ends anew, and its hooks run for that ending too (on_exit above all).
    let env = Env::new();
    env.write(
        "flow.toml",
        r#"
[hooks]
on_success = ["sh", "-c", "echo success >> hooks"]
on_failure = ["sh", "-c", "echo failure >> hooks"]
on_exit = ["sh", "-c", "echo \"exit $WAYMARK_RUN_STATUS\" >> hooks"]

[[step]]
name = "a"
shell = "test -e ok"
"#,
    );
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(env.read("hooks"), "failure\nexit failed\n");
    let id = run_id(&env);
    let out = env.cmd(&["resume", &id]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(env.read("hooks"), "failure\nexit failed\nfailure\nexit failed\n");
    env.write("ok", "");
    let out = env.cmd(&["resume", &id]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(env.read("hooks"), "failure\nexit failed\nfailure\nexit failed\nsuccess\nexit succeeded\n");
}

/// The failure report of a compensated run says what the next step is: `waymark resume` refuses
/// such a run, so the report points at `waymark run --fresh`, which runs the flow anew.
#[test]
fn the_report_of_a_compensated_run_points_at_a_fresh_run_not_at_resume() {
    let env = Env::new();
    env.write("flow.toml", FLOW);
    let out = env.cmd(&["run", "--quiet", "flow.toml"]).env("FAIL", "1").output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(
        assert_points_at_a_fresh_run(&env, &out),
        [
            "waymark: warning: b: its compensation failed (exit status 3); it wrote nothing; the other compensations go on"
        ]
    );
    // What it says works: the flow runs anew, and succeeds without FAIL.
    let out = env.cmd(&["run", "--quiet", "--fresh", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(env.read("done"), "a\nb\nc\na\nb\nc\n");
}

/// The same when the compensations ran under an earlier runner: a runner killed during its
/// `on_failure` hook, after compensating, is resumed by one that does not compensate again, and
/// its report still points at a fresh run.
#[test]
fn the_report_of_a_run_compensated_by_an_earlier_runner_points_at_a_fresh_run() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "[hooks]\non_failure = 'if [ -e second ]; then exit 0; fi; echo x > hook-started; exec sleep 60'\n\
         [[step]]\nname = 'a'\nrun = ['true']\ncompensate = ['sh', '-c', 'echo undo >> undone']\n\
         [[step]]\nname = 'b'\nrun = ['false']\n",
    );
    let _ = env.run_until("hook-started", "KILL");
    env.write("second", "");
    let out = env.cmd(&["run", "--quiet", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(env.read("undone"), "undo\n", "compensated once, by the first runner");
    assert_eq!(assert_points_at_a_fresh_run(&env, &out), Vec::<String>::new());
}

/// The last line of a compensated run's failure report: it points at a fresh run of its flow
/// file, not at `waymark resume`; the lines that follow it (its failed compensations' and hooks'),
/// without the run's id, are returned.
fn assert_points_at_a_fresh_run(env: &Env, out: &std::process::Output) -> Vec<String> {
    let id = run_id(env);
    let said = common::stderr(out);
    let mut lines: Vec<&str> = said.lines().collect();
    let prefix = format!("waymark: warning: run {id}: ");
    let mut after = Vec::new();
    while let Some(line) = lines.pop_if(|l| l.starts_with(&prefix)) {
        after.insert(0, line.replacen(&format!("run {id}: "), "", 1));
    }
    assert_eq!(
        lines.last().copied().unwrap_or_default(),
        format!(
            "  run id: {id} (`waymark status {id}` shows it and how each of its compensations ended; a \
             compensated run cannot be resumed: `waymark run --fresh {}` starts the flow anew)",
            env.path("flow.toml").canonicalize().unwrap().display()
        )
    );
    after
}

/// `status` text with the run id, the flow's path, times and durations replaced.
fn status_text(env: &Env) -> String {
    let out = env.cmd(&["status", "--json"]).output().unwrap();
    let st: Value = serde_json::from_slice(&out.stdout).unwrap();
    let out = env.cmd(&["status"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    let text = text.replace(st["id"].as_str().unwrap(), "RUN").replace(st["path"].as_str().unwrap(), "PATH");
    common::normalise_status_durations(&common::normalise_times(&text))
}

/// `status --json`'s `compensated` and its `compensations` as (step, outcome, exit_code), each
/// with its times checked: a finished one has an end and a duration, an unfinished one neither.
fn compensations(env: &Env) -> (bool, Vec<(String, String, Option<i64>)>) {
    let out = env.cmd(&["status", "--json"]).output().unwrap();
    let st: Value = serde_json::from_slice(&out.stdout).unwrap();
    let list = st["compensations"].as_array().unwrap().iter().map(|c| {
        let finished = ["succeeded", "failed", "cancelled"].contains(&c["outcome"].as_str().unwrap());
        assert_eq!((c["ended_at"].is_string(), c["duration_ms"].is_u64()), (finished, finished), "{c}");
        assert!(c["started_at"].is_string(), "{c}");
        (c["step"].as_str().unwrap().to_owned(), c["outcome"].as_str().unwrap().to_owned(), c["exit_code"].as_i64())
    });
    (st["compensated"].as_bool().unwrap(), list.collect())
}

/// `status` of a run whose failure was compensated says so, lists each compensation with how it
/// ended (text and `--json`), and says the run cannot be resumed; one stopped with its runner
/// says it runs again on resume; a run that was not compensated says nothing of it.
#[test]
fn status_says_which_compensations_ran_and_how_they_ended() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "[[step]]\nname = 'a'\nshell = 'true'\ncompensate = 'true'\n\
         [[step]]\nname = 'b'\nshell = 'true'\ncompensate = 'echo cannot undo b >&2; exit 3'\n\
         [[step]]\nname = 'd'\nshell = 'true'\ncompensate = 'exit 4'\n\
         [[step]]\nname = 'c'\nshell = 'exit 1'\n",
    );
    assert_eq!(env.cmd(&["run", "--quiet", "flow.toml"]).output().unwrap().status.code(), Some(1));
    assert_eq!(
        status_text(&env),
        format!(
            "run RUN of flow (PATH): failed, started TIME, ended TIME\n  \
             a                    succeeded  attempts 1/1  Ns\n  \
             b                    succeeded  attempts 1/1  Ns\n  \
             d                    succeeded  attempts 1/1  Ns\n  \
             c                    failed     attempts 1/1  Ns\n  \
             {:20} last error: CalledProcessError(SubprocessError, Exception, BaseException): exit status 1 \
             [exit status]\n\
             compensated: the run failed, so the compensations of its succeeded steps ran, latest step first:\n  \
             d                    failed     exit status 4\n  \
             b                    failed     exit status 3\n  \
             a                    succeeded\n\
             the compensations of `d`, `b` did not succeed, so what they did may not be undone \
             ({}/logs/RUN/b/compensate.stderr says why; `d` wrote nothing to stderr: its line above says how it \
             ended); the run cannot be resumed; `waymark run --fresh PATH` starts the flow anew\n",
            "",
            env.state().display()
        )
    );
    assert_eq!(
        compensations(&env),
        (
            true,
            vec![
                ("d".into(), "failed".into(), Some(4)),
                ("b".into(), "failed".into(), Some(3)),
                ("a".into(), "succeeded".into(), Some(0))
            ]
        )
    );

    // Stopped while compensating, by SIGKILL or a signal: it runs again on resume.
    for (signal, run_status, why, outcome) in [
        (
            "KILL",
            "running, but its runner is gone (`waymark resume RUN` resumes it)",
            "its runner died before it ended",
            "runner_lost",
        ),
        ("TERM", "interrupted", "a signal stopped it", "cancelled"),
    ] {
        let env = Env::new();
        env.write(
            "flow.toml",
            "[[step]]\nname = 'a'\nshell = 'true'\n\
             compensate = 'if [ -e release ]; then exit 0; fi; echo $$ > ready; exec sleep 60'\n\
             [[step]]\nname = 'c'\nshell = 'exit 1'\n",
        );
        let out = env.run_until("ready", signal);
        if signal == "TERM" {
            assert!(
                stderr(&out)
                    .contains("\nwaymark: a: its compensation was cancelled by SIGTERM; it runs again on resume\n"),
                "{}",
                stderr(&out)
            );
        }
        assert_eq!(
            status_text(&env),
            format!(
                "run RUN of flow (PATH): {run_status}, started TIME{}\n  \
                 a                    succeeded  attempts 1/1  Ns\n  \
                 c                    failed     attempts 1/1  Ns\n  \
                 {:20} last error: CalledProcessError(SubprocessError, Exception, BaseException): exit status 1 \
                 [exit status]\n\
                 compensating: the run failed, so the compensations of its succeeded steps run, latest step first:\n  \
                 a                    interrupted  {why}; it runs again on resume\n",
                if signal == "TERM" { ", ended TIME" } else { "" },
                ""
            ),
            "after SIG{signal}"
        );
        assert_eq!(compensations(&env), (true, vec![("a".into(), outcome.into(), None)]), "after SIG{signal}");
        env.write("release", "");
        assert_eq!(env.cmd(&["run", "--quiet", "flow.toml"]).output().unwrap().status.code(), Some(1));
        let (_, list) = compensations(&env);
        assert_eq!(list.last(), Some(&("a".into(), "succeeded".into(), Some(0))), "after SIG{signal}");
        let text = status_text(&env);
        let said: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("compensated:")).collect();
        assert_eq!(
            said,
            [
                "compensated: the run failed, so the compensations of its succeeded steps ran, latest step first:",
                &format!("  a                    interrupted  {}; it ran again", why),
                "  a                    succeeded",
                "what its steps did was undone, so the run cannot be resumed; `waymark run --fresh PATH` starts the \
                 flow anew",
            ],
            "after SIG{signal}"
        );
    }

    // Not compensated: nothing said.
    let env = Env::new();
    env.write("flow.toml", "[[step]]\nname = 'a'\nshell = 'exit 1'\n");
    assert_eq!(env.cmd(&["run", "--quiet", "flow.toml"]).output().unwrap().status.code(), Some(1));
    assert!(!status_text(&env).contains("compensat"), "{}", status_text(&env));
    assert_eq!(compensations(&env), (false, vec![]));
}

/// A compensation that wrote nothing to stderr has no `compensate.stderr` (a log is created on its
/// first byte): `status` says so, and how it ended, instead of pointing at a file that is not there:
/// its step's timeout, or a signal it was killed by, named as a step's error (text and `--json`).
#[test]
fn status_names_no_log_for_a_compensation_that_wrote_nothing_to_stderr() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "[[step]]\nname = 'a'\nshell = 'true'\ntimeout = '1s'\nkill_grace = 0\ncompensate = 'exec sleep 60'\n\
         [[step]]\nname = 'k'\nshell = 'true'\ncompensate = 'echo undoing k; kill -KILL $$'\n\
         [[step]]\nname = 'c'\nshell = 'exit 1'\n",
    );
    assert_eq!(env.cmd(&["run", "--quiet", "flow.toml"]).output().unwrap().status.code(), Some(1));
    assert!(
        !env.state().join("logs").read_dir().unwrap().any(|run| run
            .unwrap()
            .path()
            .join("a/compensate.stderr")
            .exists())
    );
    assert_eq!(
        status_text(&env),
        format!(
            "run RUN of flow (PATH): failed, started TIME, ended TIME\n  \
             a                    succeeded  attempts 1/1  Ns\n  \
             k                    succeeded  attempts 1/1  Ns\n  \
             c                    failed     attempts 1/1  Ns\n  \
             {:20} last error: CalledProcessError(SubprocessError, Exception, BaseException): exit status 1 \
             [exit status]\n\
             compensated: the run failed, so the compensations of its succeeded steps ran, latest step first:\n  \
             k                    failed     ActionExecutionLost(BaseException): killed by signal SIGKILL [signal]\n  \
             a                    failed     ActionTimeout(BaseException): timed out after 1s [timeout]\n\
             the compensations of `k`, `a` did not succeed, so what they did may not be undone (`k`, `a` wrote \
             nothing to stderr: their lines above say how they ended; what `k` wrote to stdout is in \
             {}/logs/RUN/k/compensate.stdout); the run cannot be resumed; `waymark run --fresh PATH` starts the \
             flow anew\n",
            "",
            env.state().display()
        )
    );
    let out = env.cmd(&["status", "--json"]).output().unwrap();
    let st: Value = serde_json::from_slice(&out.stdout).unwrap();
    let errors: Vec<(&str, &str, &str)> = st["compensations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let e = &c["error"];
            (c["step"].as_str().unwrap(), e["class"].as_str().unwrap(), e["source"].as_str().unwrap())
        })
        .collect();
    assert_eq!(errors, [("k", "ActionExecutionLost", "signal"), ("a", "ActionTimeout", "timeout")]);
}

/// A hook that fails does not change how the run ended (exit 0), but `--quiet`, which otherwise
/// prints nothing when the run succeeds, says it on stderr: which hook, how it failed and where
/// its output is (only the logs it wrote: a log is created on its first byte); the plain mode's
/// warning says the same.
#[test]
fn a_failed_hook_is_said_under_quiet_with_how_it_failed_and_its_log() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "[hooks]\non_success = 'echo cannot notify >&2; exit 5'\non_exit = ['/nonexistent/notify']\n\
         [[step]]\nname = 'a'\nrun = ['true']\n",
    );
    let out = env.cmd(&["run", "--quiet", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", common::stderr(&out));
    let id = run_id(&env);
    let log = env.state().join("logs").join(&id).join("hooks").join("on_success.stderr");
    assert_eq!(
        common::stderr(&out),
        format!(
            "waymark: warning: run {id}: hook on_success failed (exit status 5); its output: {}\n\
             waymark: warning: run {id}: hook on_exit failed (it could not start: program `/nonexistent/notify` \
             not found); it wrote nothing\n",
            log.display()
        )
    );
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "cannot notify\n");
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let id = run_id(&env);
    let log = env.state().join("logs").join(&id).join("hooks").join("on_success.stderr");
    let err = stderr(&out);
    for line in [
        format!("waymark: warning: hook on_success failed (exit status 5); its output: {}", log.display()),
        "waymark: warning: hook on_exit failed (it could not start: program `/nonexistent/notify` not found); it \
         wrote nothing"
            .to_owned(),
    ] {
        assert!(err.lines().any(|l| l == line), "missing {line:?} in:\n{err}");
    }
}

/// A failed run's `--quiet` report is followed by its failed hook's line.
#[test]
fn a_failed_hook_of_a_failed_run_follows_the_quiet_failure_report() {
    let env = Env::new();
    env.write("flow.toml", "[hooks]\non_failure = 'exit 7'\n[[step]]\nname = 'a'\nrun = ['false']\n");
    let out = env.cmd(&["run", "--quiet", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", common::stderr(&out));
    let id = run_id(&env);
    let said = common::stderr(&out);
    let lines: Vec<&str> = said.lines().collect();
    assert_eq!(lines[0], format!("waymark: run {id} failed"));
    assert_eq!(
        lines[lines.len() - 2..],
        [
            format!(
                "  run id: {id} (`waymark status {id}` shows it; `waymark resume {id}` runs its failed steps again with a fresh budget)"
            ),
            format!("waymark: warning: run {id}: hook on_failure failed (exit status 7); it wrote nothing"),
        ]
    );
}

/// `status` lists the hooks that ran at the run's end, each with how it ended and the logs it
/// wrote (text and `--json`'s `hooks`); a run without hooks lists none.
#[test]
fn status_says_which_hooks_ran_how_they_ended_and_where_their_output_is() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "[hooks]\non_failure = 'echo notifying; echo cannot notify >&2; exit 5'\n\
         on_exit = ['/nonexistent/notify']\n\
         [[step]]\nname = 'a'\nrun = ['false']\n",
    );
    assert_eq!(env.cmd(&["run", "--quiet", "flow.toml"]).output().unwrap().status.code(), Some(1));
    let logs = env.state().join("logs").join("RUN").join("hooks");
    assert_eq!(
        status_text(&env),
        format!(
            "run RUN of flow (PATH): failed, started TIME, ended TIME\n  \
             a                    failed     attempts 1/1  Ns\n  \
             {:20} last error: CalledProcessError(SubprocessError, Exception, BaseException): exit status 1 \
             [exit status]\n\
             hooks:\n  \
             on_failure           failed     exit status 5; its output: {}, {}\n  \
             on_exit              failed     ActionExecutionNotStarted(Exception, BaseException): program \
             `/nonexistent/notify` not found [start failure]\n",
            "",
            logs.join("on_failure.stdout").display(),
            logs.join("on_failure.stderr").display(),
        )
    );
    let out = env.cmd(&["status", "--json"]).output().unwrap();
    let st: Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = st["id"].as_str().unwrap();
    let logs = env.state().join("logs").join(id).join("hooks");
    let hooks: Vec<_> = st["hooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            assert!(h["started_at"].is_string() && h["ended_at"].is_string() && h["duration_ms"].is_u64(), "{h}");
            let class = h["error"]["class"].clone();
            (
                h["hook"].clone(),
                h["outcome"].clone(),
                h["exit_code"].clone(),
                class,
                h["stdout"].clone(),
                h["stderr"].clone(),
            )
        })
        .collect();
    assert_eq!(
        hooks,
        [
            (
                Value::from("on_failure"),
                Value::from("failed"),
                Value::from(5),
                Value::from("CalledProcessError"),
                Value::from(logs.join("on_failure.stdout").display().to_string()),
                Value::from(logs.join("on_failure.stderr").display().to_string()),
            ),
            (
                Value::from("on_exit"),
                Value::from("failed"),
                Value::Null,
                Value::from("ActionExecutionNotStarted"),
                Value::Null,
                Value::Null
            ),
        ]
    );
    // A run with no hooks: no such section, and an empty list.
    env.write("flow.toml", "[[step]]\nname = 'a'\nrun = ['true']\n");
    assert_eq!(env.cmd(&["run", "--quiet", "flow.toml"]).output().unwrap().status.code(), Some(0));
    assert!(!status_text(&env).contains("hooks"));
    let out = env.cmd(&["status", "--json"]).output().unwrap();
    let st: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(st["hooks"], serde_json::json!([]));
}

/// A run interrupted by a signal during `on_success` has every step succeeded: `status` says,
/// under the run's line, that its hooks are what is left and that resuming runs them (the hook
/// the signal stopped again, and those after it); once resumed, the line is gone.
#[test]
fn status_of_a_run_interrupted_in_its_hooks_says_the_hooks_run_on_resume() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "[hooks]\non_success = 'if [ -e second ]; then exit 0; fi; echo x > hook-started; exec sleep 60'\n\
         on_exit = ['true']\n\
         [[step]]\nname = 'a'\nrun = ['true']\n",
    );
    let out = env.run_until("hook-started", "INT");
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    // The plain mode says it, as it says an attempt's cancel.
    assert!(
        stderr(&out).contains("\nwaymark: hook on_success cancelled by SIGINT; it runs again on resume\n"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        status_text(&env),
        "run RUN of flow (PATH): interrupted, started TIME, ended TIME\n  \
         its steps are done, but its hooks are not: on_success, on_exit run when the run is resumed \
         (`waymark resume RUN`)\n  \
         a                    succeeded  attempts 1/1  Ns\n\
         hooks:\n  \
         on_success           interrupted  a signal stopped it; it runs again on resume\n"
    );
    env.write("second", "");
    let id = run_id(&env);
    let out = env.cmd(&["resume", "--quiet", &id]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        status_text(&env),
        "run RUN of flow (PATH): succeeded, started TIME, ended TIME\n  \
         a                    succeeded  attempts 1/1  Ns\n\
         hooks:\n  \
         on_success           interrupted  a signal stopped it; it ran again\n  \
         on_success           succeeded\n  \
         on_exit              succeeded\n"
    );
}

/// A run that failed on a step's own error, interrupted in its `on_failure` hook and resumed after
/// the workflow's deadline, tells the hook that error again, not `WorkflowTimeout`: the deadline
/// passed after the run had failed (as the failure report and `status` say).
#[test]
fn a_hook_run_again_after_the_deadline_is_told_the_error_the_run_failed_on() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "timeout = '4s'\n[hooks]\non_failure = 'echo \"$WAYMARK_FAILED_STEP $WAYMARK_ERROR_TYPE \
         $WAYMARK_ERROR_MESSAGE\" >> told; [ -e second ] || exec sleep 60'\n\
         [[step]]\nname = 'bad'\nshell = 'exit 3'\n",
    );
    let started = std::time::Instant::now();
    let out = env.run_until("told", "INT");
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    // Past the deadline before the resume.
    std::thread::sleep(Duration::from_millis(4500).saturating_sub(started.elapsed()));
    env.write("second", "");
    let out = env.cmd(&["run", "--quiet", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(env.read("told"), "bad CalledProcessError exit status 3\n".repeat(2));
}

/// A compensation that fails leaves undone what its step did: its warning says how it failed and
/// where its output is (only the logs it wrote), and `--quiet` says it after the failure report,
/// in the order the compensations ran, before a failed hook's line.
#[test]
fn a_failed_compensation_names_its_log_and_is_said_under_quiet() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "[hooks]\non_failure = 'exit 7'\n\
         [[step]]\nname = 'a'\nrun = ['true']\ncompensate = ['/nonexistent/undo']\n\
         [[step]]\nname = 'b'\nrun = ['true']\ncompensate = 'echo cannot undo b >&2; exit 3'\n\
         [[step]]\nname = 'c'\nrun = ['false']\n",
    );
    let out = env.cmd(&["run", "--quiet", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", common::stderr(&out));
    let id = run_id(&env);
    let log = env.state().join("logs").join(&id).join("b").join("compensate.stderr");
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "cannot undo b\n");
    let said = common::stderr(&out);
    let (report, after) = said.split_once(&format!("  run id: {id} (")).unwrap();
    assert!(report.starts_with(&format!("waymark: run {id} failed\n")), "{said}");
    let after = after.split_once('\n').unwrap().1;
    assert_eq!(
        after,
        format!(
            "waymark: warning: run {id}: b: its compensation failed (exit status 3); its output: {}; the other \
             compensations go on\n\
             waymark: warning: run {id}: a: its compensation failed (it could not start: program `/nonexistent/undo` \
             not found); it wrote nothing; the other compensations go on\n\
             waymark: warning: run {id}: hook on_failure failed (exit status 7); it wrote nothing\n",
            log.display()
        )
    );
    // The plain mode's warnings say the same, without the run's id.
    let out = env.cmd(&["run", "--fresh", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let id = run_id(&env);
    let log = env.state().join("logs").join(&id).join("b").join("compensate.stderr");
    let warnings: Vec<String> =
        stderr(&out).lines().filter(|l| l.starts_with("waymark: warning: ")).map(str::to_owned).collect();
    assert_eq!(
        warnings,
        [
            format!(
                "waymark: warning: b: its compensation failed (exit status 3); its output: {}; the other compensations \
                 go on",
                log.display()
            ),
            "waymark: warning: a: its compensation failed (it could not start: program `/nonexistent/undo` not found); \
             it wrote nothing; the other compensations go on"
                .to_owned(),
            "waymark: warning: hook on_failure failed (exit status 7); it wrote nothing".to_owned(),
        ]
    );
}

/// Under `--json`, a failed catch handler, compensation or hook is followed by its warning: its
/// `.finished` event, then the `notice` (before the step's own end, for a handler). Why retrying
/// stopped (`retry.stopped`) comes before the catch handler that takes the error.
#[test]
fn the_warning_of_a_failed_handler_compensation_or_hook_follows_its_finished_event() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "[hooks]\non_exit = 'exit 5'\n\
         [[step]]\nname = 'a'\nrun = ['true']\ncompensate = 'exit 3'\n\
         [[step]]\nname = 'c'\nrun = ['false']\ncatch = [{ shell = 'exit 9' }]\n",
    );
    let out = env.cmd(&["run", "--json", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", common::stderr(&out));
    let events: Vec<String> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| !matches!(e["event"].as_str(), Some("step.ready" | "step.started" | "attempt.started")))
        .map(|e| {
            let who = e["step"].as_str().or(e["hook"].as_str()).unwrap_or("-");
            match e["event"].as_str().unwrap() {
                "notice" => format!("notice {who}: {}", e["message"].as_str().unwrap()),
                event => format!("{event} {who}"),
            }
        })
        .collect();
    assert_eq!(
        events,
        [
            "run.started -",
            "attempt.finished a",
            "step.finished a",
            "attempt.finished c",
            "retry.stopped c",
            "catch.started c",
            "catch.finished c",
            "notice c: its catch handler failed (exit status 9); it wrote nothing; the step fails with its error",
            "step.finished c",
            "compensation.started a",
            "compensation.finished a",
            "notice a: its compensation failed (exit status 3); it wrote nothing; the other compensations go on",
            "hook.started on_exit",
            "hook.finished on_exit",
            "notice -: hook on_exit failed (exit status 5); it wrote nothing",
            "run.finished -",
        ]
    );
}

/// A signal that comes while `fail_fast` stops a step leaves the run to its resume, whose
/// compensations it has not run: the step's line, the summary and `logs` say that the run fails
/// when resumed (not that the step runs again), and the resume compensates and fails it without
/// running the step again.
#[test]
fn a_signal_during_fail_fast_leaves_compensations_to_the_resume_which_fails_the_run() {
    let env = Env::new();
    env.write(
        "flow.toml",
        r#"
name = "ffsig"
fail_fast = true
max_parallel = 3

[[step]]
name = "done"
needs = []
run = ["true"]
compensate = ["sh", "-c", "echo undone >> undone"]

[[step]]
name = "slow"
needs = []
kill_grace = "30s"
shell = "trap 'echo >> ready; trap \"\" TERM; while [ ! -e go ]; do sleep 0.05; done; exit 0' TERM; echo >> started; while :; do sleep 0.05; done"

[[step]]
name = "bad"
needs = ["done"]
shell = "while [ ! -e started ]; do sleep 0.02; done; exit 3"
"#,
    );
    // `ready`: fail_fast's SIGTERM reached `slow`, which takes its grace period until `go`, given
    // once the runner said it got the signal.
    let (runner, seen) = env.spawn_watched(&["run", "flow.toml"]);
    env.wait_for_lines("ready", 1);
    common::kill(runner.id(), "TERM");
    common::wait_until("the runner to say it got the signal", || seen.lock().unwrap().contains("waymark: got SIGTERM"));
    env.write("go", "");
    let out = common::finish(runner);
    common::wait_until("the runner's stderr to be read to its end", || std::sync::Arc::strong_count(&seen) == 1);
    let said = common::normalise_plain(&common::untimed(&seen.lock().unwrap()));
    assert_eq!(out.status.code(), Some(143), "{said}");
    // waymark's own lines of `slow` (its child's, `slow | ...`, are what its shell says).
    let lines: Vec<&str> =
        said.lines().filter(|l| l.starts_with("waymark: slow") || l.starts_with("  slow ")).collect();
    assert_eq!(
        lines,
        [
            "waymark: slow: started",
            "waymark: slow: attempt 1/1 started (pid PID)",
            "waymark: slow: attempt 1/1 cancelled by fail_fast",
            "  slow  interrupted       0/1    DURATION  cancelled by fail_fast; the run fails when resumed",
        ],
        "{said}"
    );
    assert!(!env.path("undone").exists(), "the signal left the compensations to the resume");
    let id = run_id(&env);
    // (Its stderr has its shell's word on the `sleep` that fail_fast's signal killed.)
    env.cmd(&["logs", &id, "slow", "--stream", "stdout"]).assert().success().stdout("").stderr(
        "waymark: attempt 1 of step `slow` wrote nothing to stdout (it was cancelled; the run fails when resumed, \
         without running it again: a step failed for good under `fail_fast`)\n",
    );
    let resumed = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(resumed.status.code(), Some(1), "{}", stderr(&resumed));
    assert_eq!((env.count("undone"), env.count("started")), (1, 1), "compensated once, `slow` not run again");
}

/// What a catch handler, a compensation and a hook are told of themselves (README,
/// "Environment"): the handler its step and the attempt whose error it takes, the compensation its
/// step with 1 of 1, the hook its own name with 1 of 1.
#[test]
fn handlers_compensations_and_hooks_see_their_own_step_attempt_and_budget() {
    let env = Env::new();
    let show = "echo \\\"$0 $WAYMARK_STEP $WAYMARK_ATTEMPT/$WAYMARK_MAX_ATTEMPTS\\\" >> seen";
    env.write(
        "flow.toml",
        &format!(
            "name = 'told'\n\
             [hooks]\non_failure = ['sh', '-c', \"{show}\", 'hook']\n\
             [[step]]\nname = 'made'\nretry = {{ attempts = 3 }}\nshell = '[ \"$WAYMARK_ATTEMPT\" = 2 ]'\n\
             compensate = ['sh', '-c', \"{show}\", 'compensation']\n\
             [[step]]\nname = 'broken'\nretry = {{ attempts = 3, exception_types = ['TimeoutError'] }}\n\
             run = ['false']\n\
             catch = [{{ exception_types = ['CalledProcessError'], run = ['sh', '-c', \"{show}; exit 1\", 'handler'] }}]\n"
        ),
    );
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let seen = std::fs::read_to_string(env.dir.path().join("seen")).unwrap();
    // `broken`'s error is not one its policy retries: its handler takes attempt 1 of 3.
    assert_eq!(seen, "handler broken 1/3\ncompensation made 1/1\nhook on_failure 1/1\n");
}

/// The steps of a failed run that will not run are recorded skipped when its compensations begin:
/// a runner stopped among them leaves `status` saying so, not `pending` (as if they might still
/// run), and saying that the compensations and hooks run when the run is resumed.
#[test]
fn status_of_a_run_stopped_in_its_compensations_shows_the_steps_that_will_not_run_skipped() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "[hooks]\non_exit = ['true']\n\
         [[step]]\nname = 'a'\nrun = ['true']\n\
         compensate = 'if [ -e second ]; then exit 0; fi; echo x > undo-started; exec sleep 60'\n\
         [[step]]\nname = 'b'\nrun = ['false']\nneeds = ['a']\n\
         [[step]]\nname = 'c'\nrun = ['touch', 'c-ran']\nneeds = ['b']\n",
    );
    let out = env.run_until("undo-started", "INT");
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    assert_eq!(
        status_text(&env),
        "run RUN of flow (PATH): interrupted, started TIME, ended TIME\n  \
         its steps are done, but its compensations and hooks are not: the compensations, then on_exit, run \
         when the run is resumed (`waymark resume RUN`)\n  \
         a                    succeeded  attempts 1/1  Ns\n  \
         b                    failed     attempts 1/1  Ns\n                       \
         last error: CalledProcessError(SubprocessError, Exception, BaseException): exit status 1 [exit status]\n  \
         c                    skipped    attempts 0/1\n\
         compensating: the run failed, so the compensations of its succeeded steps run, latest step first:\n  \
         a                    interrupted  a signal stopped it; it runs again on resume\n"
    );
    env.write("second", "");
    let out = env.cmd(&["run", "--quiet", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(!env.path("c-ran").exists());
}

/// A runner killed while `fail_fast` stops a step leaves that attempt unfinished: `status` says
/// that the run fails when resumed without running it again (a step failed for good under
/// `fail_fast`), not that it runs again, and the resume does so.
#[test]
fn status_of_a_fail_fast_run_whose_runner_died_says_the_resume_fails_it() {
    let env = Env::new();
    env.write(
        "flow.toml",
        r#"
name = "ffkill"
fail_fast = true
max_parallel = 2

[[step]]
name = "slow"
needs = []
kill_grace = "60s"
shell = "trap 'echo >> ready; trap \"\" TERM; while [ ! -e go ]; do sleep 0.05; done; exit 0' TERM; echo >> started; while :; do sleep 0.05; done"

[[step]]
name = "bad"
needs = []
shell = "while [ ! -e started ]; do sleep 0.02; done; exit 3"
"#,
    );
    let (runner, _seen) = env.spawn_watched(&["run", "flow.toml"]);
    env.wait_for_lines("ready", 1);
    // Killed once `bad`'s failure is recorded (fail_fast's signal may come before its commit).
    common::wait_until("bad's failure to be recorded", || {
        let out = env.cmd(&["status", "--json"]).output().unwrap();
        let st: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        st["steps"].as_array().is_some_and(|s| s.iter().any(|s| s["step"] == "bad" && s["state"] == "failed"))
    });
    common::kill(runner.id(), "KILL");
    let out = common::finish(runner);
    assert_eq!(out.status.signal(), Some(9));
    let text = status_text(&env);
    let slow: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("  slow ")).take(2).collect();
    assert_eq!(
        slow,
        [
            "  slow                 interrupted  attempts 1/1  Ns",
            "                       attempt 1 did not finish: its runner died; the run fails when resumed, without \
             running it again: a step failed for good under `fail_fast`",
        ],
        "{text}"
    );
    env.write("go", "");
    let resumed = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(resumed.status.code(), Some(1), "{}", stderr(&resumed));
    assert_eq!(env.count("started"), 1, "`slow` was not run again");
}

/// A run abandoned (`--fresh`) while its compensations were under way never runs them again: the
/// abandon warns so, and `status` of it says so under the one a signal stopped, not that it runs
/// again on resume.
#[test]
fn status_of_a_run_abandoned_in_its_compensations_says_they_never_run_again() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "[[step]]\nname = 'a'\nrun = ['true']\n\
         compensate = 'if [ -e second ]; then exit 0; fi; echo x > undo-started; exec sleep 60'\n\
         [[step]]\nname = 'b'\nrun = ['false']\nneeds = ['a']\n",
    );
    let out = env.run_until("undo-started", "INT");
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    let id = run_id(&env);
    env.write("second", "");
    let out = env.cmd(&["run", "--fresh", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    // The abandon says what it leaves undone.
    let said = stderr(&out);
    assert!(
        said.contains(&format!(
            "waymark: warning: run {id} had begun undoing what its steps did (its compensations) when it stopped; \
             abandoned, it never finishes them, nor runs its hooks: check by hand what its succeeded steps left \
             (`waymark status {id}` shows which compensations ran)\n"
        )),
        "{said}"
    );
    let text = stdout(&env.cmd(&["status", &id]).output().unwrap());
    assert!(
        text.contains(
            "\n  a                    interrupted  a signal stopped it; the run was abandoned, so it never runs again\n"
        ),
        "{text}"
    );
}

/// A run whose compensations all succeeded is refused on resume as undone.
#[test]
fn a_run_undone_by_its_compensations_is_not_resumed() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "[[step]]\nname = 'a'\nrun = ['true']\ncompensate = ['true']\n[[step]]\nname = 'b'\nrun = ['false']\n",
    );
    let out = env.cmd(&["run", "-q", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let id = run_id(&env);
    let out = env.cmd(&["resume", &id]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        format!(
            "error: run {id} failed and its compensations ran, undoing what its steps did, so it cannot be resumed; \
             `waymark run --fresh {}` starts the flow anew\n",
            env.path("flow.toml").canonicalize().unwrap().display()
        )
    );
}

/// A run stopped in its hooks has run its compensations: `status` says they ran, not that they
/// run.
#[test]
fn status_of_a_run_stopped_in_its_hooks_says_its_compensations_ran() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "[hooks]\non_failure = 'echo x > hook-started; exec sleep 60'\n\
         [[step]]\nname = 'a'\nrun = ['true']\ncompensate = ['true']\n\
         [[step]]\nname = 'b'\nrun = ['false']\nneeds = ['a']\n",
    );
    let out = env.run_until("hook-started", "INT");
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    let text = status_text(&env);
    let said: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("compensat")).take(2).collect();
    assert_eq!(
        said,
        [
            "compensated: the run failed, so the compensations of its succeeded steps ran, latest step first:",
            "  a                    succeeded",
        ],
        "{text}"
    );
}
