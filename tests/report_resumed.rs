//! The failure report of a resumed run lists the attempts earlier runners made as fully as its
//! own (start, duration, error and its source), from the store; golden.

mod common;

use common::{Env, finish, golden, have_crash_hook, kill, normalise_times};
use serde_json::Value;

/// `text` with the run id, the state directory and times replaced.
fn normalise(env: &Env, text: &str) -> String {
    let out = env.cmd(&["history", "--json"]).output().unwrap();
    let runs: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut text = text.to_owned();
    for run in runs.as_array().unwrap() {
        text = text.replace(run["id"].as_str().unwrap(), "RUN");
    }
    text = text.replace(&env.state().canonicalize().unwrap().display().to_string(), "STATE");
    normalise_times(&text)
}

/// The plain lines and report `out` printed, normalised, against the golden file `name`.
fn golden_plain(env: &Env, name: &str, out: &std::process::Output) {
    golden(name, &common::normalise_plain(&normalise(env, &common::stderr(out))));
}

/// Attempt 1 fails under a first runner (killed right after recording it), attempt 2 is running
/// when a second runner is killed, and a third runner redelivers attempt 2 and makes attempt 3.
const FLOW: &str = r#"name = "resumed"

[[step]]
name = "flaky"
retry = { attempts = 3 }
shell = '''
echo "attempt $WAYMARK_ATTEMPT" >&2
if [ "$WAYMARK_ATTEMPT" = 2 ] && [ ! -e hung ]; then touch hung; echo $$ > started; exec sleep 300; fi
exit 3
'''
"#;

#[test]
fn a_resumed_runs_report_lists_earlier_runners_attempts_in_full() {
    if !have_crash_hook("a_resumed_runs_report_lists_earlier_runners_attempts_in_full") {
        return;
    }
    let env = Env::new();
    env.write("flow.toml", FLOW);
    let first = env.cmd(&["run", "-q", "flow.toml"]).env("WAYMARK_TEST_CRASH_AFTER", "flaky").output().unwrap();
    assert_eq!(first.status.code(), None, "the first runner was killed by its crash hook");

    let second = env.spawn(&["run", "-q", "flow.toml"]);
    env.wait_for_lines("started", 1);
    kill(second.id(), "KILL");
    let _ = finish(second);

    let third = env.cmd(&["run", "-q", "flow.toml"]).output().unwrap();
    assert_eq!(third.status.code(), Some(1));
    assert_eq!(third.stdout, b"");
    golden("report/quiet-resumed.stderr", &normalise(&env, &common::stderr(&third)));

    // `status --attempts` lists each of them, whichever runner made it, one line each.
    let status = env.cmd(&["status", "--attempts"]).output().unwrap();
    assert_eq!(status.status.code(), Some(0), "{}", common::stderr(&status));
    let text = String::from_utf8(status.stdout).unwrap();
    let flow = env.path("flow.toml").canonicalize().unwrap().display().to_string();
    let text = common::normalise_status_durations(&text.replace(&flow, "FLOW"));
    golden("report/status-attempts.stdout", &normalise(&env, &text));
    let json = env.cmd(&["status", "--attempts", "--json"]).output().unwrap();
    let json: Value = serde_json::from_slice(&json.stdout).unwrap();
    let attempts: Vec<(u64, &str, bool, Option<&str>)> = json["steps"][0]["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["attempt"].as_u64().unwrap(),
                a["outcome"].as_str().unwrap(),
                a["redelivered"] == true,
                a["error"]["class"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        attempts,
        [
            (1, "failed", false, Some("CalledProcessError")),
            (2, "runner_lost", false, None),
            (2, "failed", true, Some("CalledProcessError")),
            (3, "failed", false, Some("CalledProcessError")),
        ]
    );
    // The lost one's end is unknown (the store keeps when the next runner claimed the run).
    let lost = &json["steps"][0]["attempts"][1];
    assert_eq!((lost["ended_at"].is_null(), lost["duration_ms"].is_null()), (true, true), "{lost}");
    let last = &json["steps"][0]["attempts"][3];
    assert!(last["stderr"].as_str().unwrap().ends_with("/flaky/attempt-3.stderr"), "{last}");
    assert_eq!(std::fs::read_to_string(last["stderr"].as_str().unwrap()).unwrap(), "attempt 3\n");
    // Without the flag, neither lists them.
    let plain = env.cmd(&["status", "--json"]).output().unwrap();
    let plain: Value = serde_json::from_slice(&plain.stdout).unwrap();
    assert_eq!(plain["steps"][0].get("attempts"), None);
}

/// A runner killed in its `on_failure` hook leaves a step failed for good in a run not yet
/// finished: the runner that resumes it says so, in its lines and its summary table, where the
/// step was left out.
#[test]
fn a_step_failed_under_an_earlier_runner_is_in_the_resumed_runs_lines_and_summary() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'hooked'\n[hooks]\non_failure = 'if [ -e second ]; then exit 0; fi; echo x > hook-started; exec sleep 60'\n\
         [[step]]\nname = 'a'\nrun = ['true']\n\
         [[step]]\nname = 'b'\nrun = ['false']\nneeds = ['a']\n\
         [[step]]\nname = 'c'\nrun = ['true']\nneeds = ['b']\n",
    );
    let first = env.run_until("hook-started", "KILL");
    assert_eq!(first.status.code(), None, "the first runner was killed in its hook");
    env.write("second", "");
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    golden_plain(&env, "report/resumed-failed-step.stderr", &out);
}

/// Whether an attempt's process group needed SIGKILL after its grace is recorded with it: `status
/// --attempts` says so (text and JSON), and so does the report of the run resumed by `waymark
/// resume`, of the attempt its earlier runner made.
#[test]
fn a_kill_after_the_grace_is_recorded_and_said_of_an_earlier_runner_s_attempt() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = \"stuck\"\n[[step]]\nname = \"stuck\"\nshell = '''trap '' TERM; sleep 30'''\ntimeout = '300ms'\nkill_grace = '200ms'\n",
    );
    let first = env.cmd(&["run", "-q", "flow.toml"]).output().unwrap();
    assert_eq!(first.status.code(), Some(1), "{}", common::stderr(&first));
    let killed = "ActionTimeout(BaseException): timed out after 300ms [timeout]; still running after the grace \
                  period, so killed with SIGKILL";
    let status = env.cmd(&["status", "--attempts"]).output().unwrap();
    let text = common::normalise_status_durations(&normalise(&env, &String::from_utf8(status.stdout).unwrap()));
    assert_eq!(
        text.lines().last(),
        Some(format!("                       attempt 1: started TIME, took DURATION: {killed}").as_str()),
        "{text}"
    );
    let json = env.cmd(&["status", "--attempts", "--json"]).output().unwrap();
    let json: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(json["steps"][0]["attempts"][0]["killed_after_grace"], true);

    let run = json["id"].as_str().unwrap().to_owned();
    let resumed = env.cmd(&["resume", "-q", &run]).output().unwrap();
    assert_eq!(resumed.status.code(), Some(1));
    let report = normalise(&env, &common::stderr(&resumed));
    let lines: Vec<&str> = report.lines().filter(|l| l.trim_start().starts_with("attempt")).collect();
    assert_eq!(
        lines,
        [
            format!("    attempt 1 (by an earlier runner): started TIME, took DURATION: {killed}"),
            format!("    attempt 2: started TIME, took DURATION: {killed}"),
        ],
        "{report}"
    );
}

/// `waymark resume` of a failed run gives its failed step a fresh budget: the summary table counts
/// the step's attempts of that budget, as the failure report below it does (`budget spent: 2 of 2
/// attempts`) and `waymark status` does, with those before it after; the progress lines number
/// the attempts from the run's first.
#[test]
fn the_summary_of_a_resumed_failed_run_counts_the_fresh_budget_as_the_report_does() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'again'\n\
         [[step]]\nname = 'setup'\nrun = ['true']\n\
         [[step]]\nname = 'gate'\nneeds = ['setup']\nrun = ['false']\nretry = { attempts = 2 }\n\
         [[step]]\nname = 'publish'\nneeds = ['gate']\nrun = ['true']\n",
    );
    assert_eq!(env.cmd(&["run", "--quiet", "flow.toml"]).output().unwrap().status.code(), Some(1));
    let runs: Value = serde_json::from_slice(&env.cmd(&["history", "--json"]).output().unwrap().stdout).unwrap();
    let out = env.cmd(&["resume", runs[0]["id"].as_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    golden_plain(&env, "report/resumed-fresh-budget.stderr", &out);
}

/// The failure report names only the log files the step's last attempt created, here, whatever
/// host id the runner that made it went by (a container restarted on the same volume, say): a
/// store of this host's keeps every log here. (In a store shared by hosts, one made on another
/// host is named with that host: the report's unit tests.)
#[test]
fn the_report_names_the_logs_an_attempt_created_whatever_host_id_its_runner_had() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'hooked'\n[hooks]\non_failure = 'if [ -e second ]; then exit 0; fi; echo $$ > hook-started; exec sleep 60'\n\
         [[step]]\nname = 'b'\nshell = 'echo err >&2; exit 1'\n",
    );
    let first = env.spawn(&["--host-id", "far-away", "run", "flow.toml"]);
    env.wait_for_lines("hook-started", 1);
    kill(first.id(), "KILL");
    assert_eq!(finish(first).status.code(), None, "the first runner was killed in its hook");
    // No runner kills by a pid recorded on another host: the hook is this test's to stop.
    kill(common::read_pid(&env.path("hook-started")), "KILL");
    env.write("second", "");
    // The report of a run of `b` names its one log file.
    let names_the_stderr_log = |out: std::process::Output| {
        assert_eq!(out.status.code(), Some(1));
        let report = normalise(&env, &common::stderr(&out));
        let logs: Vec<&str> =
            report.lines().filter(|l| l.trim_start().starts_with("logs") || l.starts_with("         ")).collect();
        assert_eq!(
            logs,
            ["    logs: STATE/logs/RUN/b/attempt-1.stderr (no stdout log: attempt 1 wrote nothing to stdout)"],
            "{report}"
        );
    };
    names_the_stderr_log(env.cmd(&["run", "--quiet", "flow.toml"]).output().unwrap());
    // Run by this host's id, the same.
    names_the_stderr_log(env.cmd(&["run", "--quiet", "--fresh", "flow.toml"]).output().unwrap());
}

/// The summary table's row of `step` in `out`'s stderr, from its status on, spaces squeezed and
/// the duration left out (`interrupted 2/5 runs again on resume`), and `status`'s line of it from
/// its state on, likewise (`interrupted attempts 2/5`).
fn table_and_status_rows(env: &Env, step: &str, out: &std::process::Output) -> (String, String) {
    let squeeze = |text: &str| {
        let words = text.lines().map(|l| l.split_whitespace().collect::<Vec<_>>()).find(|w| w.first() == Some(&step));
        let words = words.unwrap_or_else(|| panic!("no line of {step} in {text}"));
        words[1..].iter().filter(|w| !["DURATION", "Ns"].contains(w)).copied().collect::<Vec<_>>().join(" ")
    };
    let status = env.cmd(&["status"]).output().unwrap();
    let status = common::normalise_status_durations(&String::from_utf8(status.stdout).unwrap());
    (squeeze(&common::normalise_plain(&common::stderr(out))), squeeze(&status))
}

/// A run interrupted, resumed and interrupted again: a cancelled attempt is not counted against
/// the budget (it runs again under its number), so the summary table counts the attempts the
/// step used, as `status` does, not the number of the attempt the signal cancelled; and after
/// `waymark resume` of a failed run, a step interrupted in its fresh budget is counted of that
/// budget in both.
#[test]
fn an_interrupted_step_counts_the_same_attempts_in_the_summary_table_and_in_status() {
    let env = Env::new();
    // Odd runs of the command fail, even ones wait for the signal.
    env.write(
        "flow.toml",
        "name = 'twice'\n[[step]]\nname = 'work'\nretry = { attempts = 5 }\n\
         shell = 'echo x >> runs; if [ $(($(wc -l < runs) % 2)) = 1 ]; then exit 3; fi; echo $$ >> ready; exec sleep 60'\n",
    );
    let out = env.run_until("ready", "TERM");
    assert_eq!(
        table_and_status_rows(&env, "work", &out),
        ("interrupted 1/5 runs again on resume".to_owned(), "interrupted attempts 1/5".to_owned())
    );
    // Resumed: attempt 2 runs again and fails, attempt 3 is cancelled.
    let runner = env.spawn(&["run", "flow.toml"]);
    env.wait_for_lines("ready", 2);
    kill(runner.id(), "TERM");
    let out = finish(runner);
    assert_eq!(out.status.code(), Some(143));
    assert_eq!(
        table_and_status_rows(&env, "work", &out),
        ("interrupted 2/5 runs again on resume".to_owned(), "interrupted attempts 2/5".to_owned())
    );

    // A failed run given a fresh budget by `waymark resume`, interrupted in it, resumed and
    // interrupted again.
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'fresh'\n[[step]]\nname = 'work'\nretry = { attempts = 2 }\n\
         shell = 'echo x >> runs; if [ $(wc -l < runs) -le 2 ]; then exit 3; fi; echo $$ >> ready; exec sleep 60'\n",
    );
    assert_eq!(env.cmd(&["run", "--quiet", "flow.toml"]).output().unwrap().status.code(), Some(1));
    let runs: Value = serde_json::from_slice(&env.cmd(&["history", "--json"]).output().unwrap().stdout).unwrap();
    let id = runs[0]["id"].as_str().unwrap().to_owned();
    for (args, ready) in [(vec!["resume", id.as_str()], 1), (vec!["run", "flow.toml"], 2)] {
        let runner = env.spawn(&args);
        env.wait_for_lines("ready", ready);
        kill(runner.id(), "TERM");
        let out = finish(runner);
        assert_eq!(out.status.code(), Some(143));
        assert_eq!(
            table_and_status_rows(&env, "work", &out),
            (
                "interrupted 0/2 (+2 before resume) runs again on resume".to_owned(),
                "interrupted attempts 0/2 (+2 before resume)".to_owned()
            ),
            "{args:?}"
        );
    }
}
