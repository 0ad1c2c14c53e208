//! What `waymark run` and `waymark resume` print in each mode, exactly: `--quiet` (nothing when
//! the run succeeds, the failure report only when it fails), the failure report of the plain
//! mode, and `--json` (one object per event), against golden files under `tests/fixtures/`
//! with run ids, paths and times normalised. After a deliberate change:
//!
//! ```text
//! WAYMARK_BLESS=1 cargo test --test reporting
//! ```

mod common;

use common::{Env, finish, golden, normalise_plain, normalise_times, stderr};
use serde_json::Value;
use std::process::{Command, Stdio};

fn run_id(env: &Env) -> String {
    let out = env.cmd(&["history", "--json"]).output().unwrap();
    let runs: Value = serde_json::from_slice(&out.stdout).unwrap();
    runs[0]["id"].as_str().unwrap().to_owned()
}

/// `text` with the run ids, the state directory and times replaced.
fn normalise(env: &Env, text: &str) -> String {
    let mut text = text.to_owned();
    let out = env.cmd(&["history", "--json"]).output().unwrap();
    let runs: Value = serde_json::from_slice(&out.stdout).unwrap();
    for run in runs.as_array().unwrap() {
        text = text.replace(run["id"].as_str().unwrap(), "RUN");
    }
    text = text.replace(&env.state().canonicalize().unwrap().display().to_string(), "STATE");
    normalise_times(&text)
}

fn out(o: &std::process::Output) -> (Option<i32>, String, String) {
    (o.status.code(), String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

// ---- --quiet ----

/// A flow that succeeds after a retry, with output on both streams and a warning of its own.
const NOISY_SUCCESS: &str = "\
[[step]]
name = 'noisy'
shell = 'echo out; echo err >&2; echo x >> tries; [ $(wc -l < tries) -ge 2 ]'
retry = { attempts = 3, exception_types = ['CalledProcessError', 'ConectionError'] }
[[step]]
name = 'after'
run = ['echo', 'done']
";

#[test]
fn quiet_prints_nothing_at_all_when_the_run_succeeds() {
    let env = Env::new();
    env.write("flow.toml", NOISY_SUCCESS);
    // The flow has a warning (a misspelled class name): `check` shows it, `--quiet` does not.
    let check = env.cmd(&["check", "flow.toml"]).output().unwrap();
    assert!(String::from_utf8_lossy(&check.stderr).contains("ConectionError"), "{check:?}");
    for args in [["run", "-q", "flow.toml"], ["run", "--quiet", "flow.toml"]] {
        std::fs::remove_file(env.path("tries")).ok();
        let o = env.cmd(&args).args(["--fresh"]).output().unwrap();
        assert_eq!(out(&o), (Some(0), String::new(), String::new()), "waymark {args:?}");
        assert_eq!(env.count("tries"), 2, "it ran, and retried");
    }
    // `resume` of a run that already succeeded has nothing to do, and says nothing.
    let o = env.cmd(&["resume", "--quiet", &run_id(&env)]).output().unwrap();
    assert_eq!(out(&o), (Some(0), String::new(), String::new()));
    // The logs have the output all the same.
    let logs = env.cmd(&["logs", &run_id(&env), "noisy", "--attempt", "1", "--stream", "stderr"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&logs.stdout), "err\n");
}

/// Three steps that run at once and fail for good, each for another reason: an error the policy
/// does not name, a spent budget, and a timeout that needed SIGKILL after the grace period.
const THREE_FAILURES: &str = "\
name = 'nightly'
[[step]]
name = 'fetch'
needs = []
shell = 'echo connecting; echo refused >&2; exit 7'
retry = { attempts = 5, exception_types = ['ConnectionError', 'TimeoutError'] }
[[step]]
name = 'load'
needs = []
shell = 'echo loading $WAYMARK_ATTEMPT; exit 1'
retry = { attempts = 2, backoff_seconds = 0.5 }
[[step]]
name = 'stuck'
needs = []
shell = '''trap '' TERM; echo started; sleep 30'''
timeout = '300ms'
kill_grace = '200ms'
retry = { attempts = 3, exception_types = ['Exception'] }
[[step]]
name = 'report'
run = ['echo', 'never']
";

#[test]
fn quiet_prints_only_the_failure_report_when_the_run_fails() {
    let env = Env::new();
    env.write("flow.toml", THREE_FAILURES);
    let o = env.cmd(&["run", "--quiet", "flow.toml"]).output().unwrap();
    let (code, stdout, stderr) = out(&o);
    assert_eq!((code, stdout.as_str()), (Some(1), ""), "{stderr}");
    golden("report/quiet-three-failures.stderr", &normalise(&env, &stderr));
}

#[test]
fn quiet_says_one_line_when_a_signal_interrupts_the_run() {
    let env = Env::new();
    env.write("flow.toml", "[[step]]\nname = 's'\nshell = 'echo $$ > started; exec sleep 30'\n");
    let runner = env.spawn(&["run", "-q", "flow.toml"]);
    env.wait_for_lines("started", 1);
    common::kill(runner.id(), "TERM");
    let o = finish(runner);
    let run = run_id(&env);
    assert_eq!(
        out(&o),
        (Some(143), String::new(), format!("waymark: run {run} interrupted; `waymark run` again resumes it\n"))
    );
}

// ---- the plain mode ----

/// `text` with run ids and the state directory replaced, and the times, pids and durations of
/// the plain lines.
fn normalise_lines(env: &Env, text: &str) -> String {
    normalise_plain(&normalise(env, text))
}

#[test]
fn the_plain_failure_report_matches_its_golden_file() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "[[step]]\nname = 'setup'\nrun = ['echo', 'ready']\n\
         [[step]]\nname = 'fetch'\n\
         shell = 'for i in $(seq 1 12); do echo line $i; done; echo \"curl: (7) refused\" >&2; exit 7'\n\
         retry = { attempts = 2, exception_types = ['CalledProcessError'] }\n\
         [[step]]\nname = 'load'\nrun = ['echo', 'never']\n",
    );
    let o = env.cmd(&["run", "flow.toml"]).output().unwrap();
    let (code, stdout, stderr) = out(&o);
    assert_eq!(code, Some(1), "{stderr}");
    golden("report/plain-budget-spent.stderr", &normalise_lines(&env, &stderr));
    let fetch: String = (1..=12).map(|i| format!("fetch | line {i}\n")).collect();
    assert_eq!(stdout, format!("setup | ready\n{fetch}{fetch}"));
}

/// A step that fails twice (with an error of the flow's own) before it succeeds, between two that
/// succeed at once.
const FLAKY: &str = "\
name = 'flaky'
[[step]]
name = 'setup'
run = ['echo', 'ready']
[[step]]
name = 'fetch'
shell = 'echo try; echo x >> tries; [ $(wc -l < tries) -ge 3 ] && exit 0; echo peer reset >&2; exit 104'
exit_codes = { 104 = 'ConnectionResetError' }
retry = { attempts = 4, exception_types = ['ConnectionError'], backoff_seconds = 0.05 }
[[step]]
name = 'load'
run = ['echo', 'loaded']
";

#[test]
fn a_plain_run_says_each_event_on_its_line_and_ends_with_the_summary_table() {
    let env = Env::new();
    env.write("flow.toml", FLAKY);
    // `--color always` colors error messages; plain lines are never colored nor rewritten.
    let o = env.cmd(&["run", "--color", "always", "flow.toml"]).output().unwrap();
    let (code, stdout, stderr) = out(&o);
    assert_eq!(code, Some(0), "{stderr}");
    for (name, bytes) in [("stdout", &o.stdout), ("stderr", &o.stderr)] {
        assert!(!bytes.iter().any(|b| *b == 0x1b || *b == b'\r'), "no ANSI escape nor carriage return on {name}");
    }
    assert_eq!(stdout, "setup | ready\nfetch | try\nfetch | try\nfetch | try\nload | loaded\n");
    golden("report/plain-flaky.stderr", &normalise_lines(&env, &stderr));
}

#[test]
fn plain_lines_have_the_local_time_of_the_time_zone_in_tz() {
    let env = Env::new();
    env.write("flow.toml", "[[step]]\nname = 'a'\nrun = ['true']\n");
    // POSIX: five and a half hours east of UTC, no daylight saving.
    let tz = jiff::tz::TimeZone::posix("WMK-5:30").unwrap();
    let before = jiff::Timestamp::now();
    let o = env.cmd(&["run", "flow.toml"]).env("TZ", "WMK-5:30").output().unwrap();
    let after = jiff::Timestamp::now();
    let (code, _, stderr) = out(&o);
    assert_eq!(code, Some(0), "{stderr}");
    let first = stderr.lines().next().unwrap();
    let (time, rest) = first.split_once(' ').unwrap();
    let date = rest.strip_prefix("waymark: date ").and_then(|d| d.strip_suffix(" (UTC+05:30)"));
    let date = date.unwrap_or_else(|| panic!("the first line is the date with the offset of TZ: {first}"));
    let at: jiff::civil::DateTime = format!("{date}T{time}").parse().unwrap();
    let at = at.to_zoned_datetime(tz).unwrap().timestamp();
    // Milliseconds are truncated on the line.
    let before = before - jiff::SignedDuration::from_millis(1);
    assert!(before <= at && at <= after, "{at} is between {before} and {after}, read in TZ");
}

/// A step whose first attempt fails and second succeeds, each writing on both streams, and a step
/// that succeeds with output of its own.
const TWO_TRIES: &str = "\
[[step]]
name = 'flaky'
shell = 'touch tries; n=$(wc -l < tries); echo x >> tries; echo out $((n + 1)); echo err $((n + 1)) >&2; [ $n -ge 1 ]'
retry = { attempts = 2, exception_types = ['CalledProcessError'] }
[[step]]
name = 'fine'
run = ['echo', 'fine']
";

#[test]
fn output_failed_shows_only_the_lines_of_the_attempt_that_failed() {
    let env = Env::new();
    env.write("flow.toml", TWO_TRIES);
    let o = env.cmd(&["run", "--output", "failed", "flow.toml"]).output().unwrap();
    let (code, stdout, stderr) = out(&o);
    assert_eq!((code, stdout.as_str()), (Some(0), "flaky | out 1\n"), "{stderr}");
    golden("report/plain-output-failed.stderr", &normalise_lines(&env, &stderr));
}

#[test]
fn output_none_shows_no_child_output_and_the_logs_have_all_of_it() {
    let env = Env::new();
    env.write("flow.toml", TWO_TRIES);
    let o = env.cmd(&["run", "--output", "none", "flow.toml"]).output().unwrap();
    let (code, stdout, stderr) = out(&o);
    assert_eq!((code, stdout.as_str()), (Some(0), ""), "{stderr}");
    assert!(!stderr.lines().any(|l| l.contains(" | ")), "no child line:\n{stderr}");
    let run = run_id(&env);
    let logs = |step: &str, attempt: &str, stream: &str| {
        let o = env.cmd(&["logs", &run, step, "--attempt", attempt, "--stream", stream]).output().unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert_eq!(
        [
            logs("flaky", "1", "stdout"),
            logs("flaky", "1", "stderr"),
            logs("flaky", "2", "stdout"),
            logs("fine", "1", "stdout")
        ],
        ["out 1\n", "err 1\n", "out 2\n", "fine\n"]
    );
}

#[test]
fn resume_takes_output_too() {
    let env = Env::new();
    // Fails on its first run, succeeds when resumed.
    env.write("flow.toml", "[[step]]\nname = 's'\nshell = 'echo try; echo x >> tries; [ $(wc -l < tries) -ge 2 ]'\n");
    let o = env.cmd(&["run", "--output", "failed", "flow.toml"]).output().unwrap();
    assert_eq!((o.status.code(), String::from_utf8_lossy(&o.stdout).as_ref()), (Some(1), "s | try\n"));
    let run = run_id(&env);
    let o = env.cmd(&["resume", "--output", "failed", &run]).output().unwrap();
    let (code, stdout, stderr) = out(&o);
    assert_eq!((code, stdout.as_str()), (Some(0), ""), "the attempt succeeded: its line is not shown\n{stderr}");
    let logs = env.cmd(&["logs", &run, "s", "--attempt", "2", "--stream", "stdout"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&logs.stdout), "try\n");
}

#[test]
fn output_failed_past_its_bound_shows_the_end_and_says_how_much_was_not_shown_and_where() {
    let env = Env::new();
    // About 2.3 MB of numbered lines, more than the 1 MiB held for an attempt, then a failure.
    env.write("flow.toml", "[[step]]\nname = 'big'\nshell = 'seq 1 300000; exit 3'\n");
    let o = env.cmd(&["run", "--output", "failed", "flow.toml"]).output().unwrap();
    let (code, stdout, stderr) = out(&o);
    assert_eq!(code, Some(1), "{stderr}");
    let run = run_id(&env);
    let pattern =
        r"(?m)^\d\d:\d\d:\d\d\.\d{3} waymark: big: attempt 1: its first (\d+) line\(s\) \((\d+) bytes\) are not";
    let note =
        regex::Regex::new(&format!("{pattern} shown; `waymark logs {run} big --attempt 1` has all of them$")).unwrap();
    let c = note.captures(&stderr).unwrap_or_else(|| panic!("no note of what was not shown:\n{stderr}"));
    let (left_out, bytes): (usize, usize) = (c[1].parse().unwrap(), c[2].parse().unwrap());
    let shown: Vec<usize> = stdout.lines().map(|l| l.strip_prefix("big | ").unwrap().parse().unwrap()).collect();
    assert_eq!(shown, (left_out + 1..=300_000).collect::<Vec<_>>(), "the end, every line of it, in order");
    assert!(shown.len() > 1000, "a good part is shown: {}", shown.len());
    let all: usize = (1..=300_000).map(|i: usize| i.to_string().len() + 1).sum();
    let shown_bytes: usize = shown.iter().map(|i| i.to_string().len() + 1).sum();
    assert_eq!(bytes + shown_bytes, all, "the note counts the bytes left out");
}

#[test]
fn output_goes_with_neither_quiet_nor_json() {
    let env = Env::new();
    env.write("flow.toml", "[[step]]\nname = 'a'\nrun = ['true']\n");
    for flag in ["--quiet", "--json"] {
        let o = env.cmd(&["run", flag, "--output", "failed", "flow.toml"]).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{flag}");
        assert!(String::from_utf8_lossy(&o.stderr).contains("cannot be used with"), "{o:?}");
    }
}

// ---- --json ----

/// A sequential flow whose events come in one order: a retry that succeeds, a timeout that
/// needs SIGKILL after its grace and is not retried, and a step skipped after it.
const JSON_FLOW: &str = "\
name = 'wire'
[[step]]
name = 'flaky'
shell = 'echo try; echo x >> tries; [ $(wc -l < tries) -ge 2 ]'
retry = { attempts = 3, exception_types = ['CalledProcessError'], backoff_seconds = 0.05 }
[[step]]
name = 'stuck'
shell = '''trap '' TERM; echo started; sleep 30'''
timeout = '300ms'
kill_grace = '200ms'
retry = { attempts = 2, exception_types = ['ConnectionError'] }
[[step]]
name = 'never'
run = ['true']
";

/// A JSON line with what changes from run to run replaced, its keys in the order written.
fn normalise_json(line: &str, run: &str) -> String {
    let re = |pattern: &str| regex::Regex::new(pattern).unwrap();
    let line = line.replace(run, "RUN");
    let line = re(r#""(ts|wake_at)":"[^"]+""#).replace_all(&line, r#""$1":"TIME""#);
    let line = re(r#""pid":\d+"#).replace_all(&line, r#""pid":"PID""#);
    re(r#""duration_ms":\d+"#).replace_all(&line, r#""duration_ms":"MS""#).into_owned()
}

#[test]
fn json_prints_one_object_per_event_and_nothing_else() {
    let env = Env::new();
    env.write("flow.toml", JSON_FLOW);
    let o = env.cmd(&["run", "--json", "flow.toml"]).output().unwrap();
    let (code, stdout, stderr) = out(&o);
    assert_eq!((code, stderr.as_str()), (Some(1), ""), "nothing but JSON, on stdout only:\n{stdout}");
    let run = run_id(&env);
    let lines: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).expect("each line is JSON")).collect();
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["seq"], i + 1, "numbered without gaps: {line}");
        assert_eq!(line["run_id"], run.as_str());
        let ts = line["ts"].as_str().unwrap();
        assert!(ts.len() == 24 && ts.ends_with('Z') && ts.as_bytes()[19] == b'.', "RFC 3339 with milliseconds: {ts}");
    }
    let stuck = lines.iter().find(|l| l["event"] == "attempt.finished" && l["step"] == "stuck").unwrap();
    assert_eq!(stuck["killed_after_grace"], true, "{stuck}");
    let normalised: String = stdout.lines().map(|l| normalise_json(l, &run) + "\n").collect();
    golden("json/run.jsonl", &normalised);
}

#[test]
fn json_goes_on_when_stdout_is_closed() {
    // `waymark run --json flow.toml | head -1`: the reader has what it wanted; the run goes on.
    let env = Env::new();
    env.write("flow.toml", "[[step]]\nname = 'a'\nrun = ['echo', 'a']\n[[step]]\nname = 'b'\nrun = ['touch', 'b']\n");
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let child = Command::new(assert_cmd::cargo::cargo_bin("waymark"))
        .current_dir(env.dir.path())
        .env("WAYMARK_STATE_DIR", env.state())
        .args(["run", "--json", "flow.toml"])
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let o = finish(child);
    assert_eq!((o.status.code(), String::from_utf8_lossy(&o.stderr).as_ref()), (Some(0), ""));
    assert!(env.path("b").exists(), "every step ran");
    let status = env.cmd(&["status", "--json"]).output().unwrap();
    let status: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["status"], "succeeded");
}

#[test]
fn json_and_quiet_do_not_go_together() {
    let env = Env::new();
    env.write("flow.toml", "[[step]]\nname = 'a'\nrun = ['true']\n");
    let o = env.cmd(&["run", "--json", "--quiet", "flow.toml"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot be used with"), "{o:?}");
    assert!(!env.state().join("waymark.db").exists(), "nothing ran");
}

#[test]
fn json_says_a_timeout_needed_no_sigkill_when_the_step_obeyed_its_kill_signal() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "[[step]]\nname = 'polite'\nshell = 'exec sleep 30'\ntimeout = '200ms'\nkill_grace = '30s'\n",
    );
    let o = env.cmd(&["run", "--json", "flow.toml"]).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&o.stdout);
    let finished: Value = stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|l| l["event"] == "attempt.finished")
        .unwrap();
    assert_eq!(
        (&finished["error"]["type"], &finished["killed_after_grace"], &finished["exit_code"]),
        (&Value::from("ActionTimeout"), &Value::from(false), &Value::Null),
        "{finished}"
    );
    assert!(finished["duration_ms"].as_u64().unwrap() < 30_000, "SIGTERM stopped it, not SIGKILL: {finished}");
}

/// A step retried 30 times, failing the same way each time, takes one line of the report, not 30.
#[test]
fn attempts_that_failed_the_same_way_share_a_line_of_the_report() {
    let env = Env::new();
    env.write("flow.toml", "[[step]]\nname = 'x'\nrun = ['false']\nretry = { attempts = 30 }\n");
    let o = env.cmd(&["run", "--quiet", "flow.toml"]).output().unwrap();
    let (code, _, stderr) = out(&o);
    assert_eq!(code, Some(1), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    // `false` writes nothing, so the last attempt has no log files to name (one line for them).
    assert_eq!(lines.len(), 8, "{stderr}");
    assert!(lines[2].starts_with("    attempts 1 to 30: started "), "{stderr}");
    assert!(
        lines[2]
            .ends_with(": CalledProcessError(SubprocessError, Exception, BaseException): exit status 1 [exit status]"),
        "{stderr}"
    );
    assert_eq!(lines[3], "    budget spent: 30 of 30 attempts");
}

/// What a child wrote reaches waymark's own lines (an error's message, the failure report's tail
/// of its output, `status`): an escape sequence or a carriage return in it is shown as its picture,
/// so that a child cannot recolour, hide or write over what waymark says.
#[test]
fn a_child_s_control_characters_in_waymark_s_own_lines_are_shown_not_acted_on() {
    let env = Env::new();
    env.write(
        "flow.toml",
        r#"[[step]]
name = "e"
shell = '''printf 'out \033[2J\r\n'; printf '{"type":"Boom","message":"a \\u001b[31mred\\u001b[0m b\\rX"}' > "$WAYMARK_ERROR_FILE"; exit 1'''
"#,
    );
    for args in [&["run", "flow.toml"][..], &["run", "--quiet", "flow.toml"], &["status"]] {
        let out = env.cmd(args).output().unwrap();
        let err = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
        // The step's own output echoed behind its name is the child's (`e | ...`): not waymark's.
        let own: String = err.lines().filter(|l| !l.starts_with("e | ")).map(|l| format!("{l}\n")).collect();
        assert!(!own.contains(['\x1b', '\r']), "{args:?}: {own:?}");
        assert!(own.contains("a ␛[31mred␛[0m b␍X"), "{args:?}: {own}");
        if args.contains(&"--quiet") {
            assert!(own.contains("\n      out ␛[2J\n"), "the report's tail of stdout: {own}");
        }
    }
}

/// An error message of many lines (a child's error file) is shown whole under the line that shows
/// its first, up to ten more lines, in the failure report and in `status`, where it was cut to
/// its first line; the rest is counted and `status --json` named.
#[test]
fn a_multi_line_error_message_is_shown_under_its_first_line_in_the_report_and_status() {
    let env = Env::new();
    // A message of 13 lines, with a blank one, written as JSON by the child.
    let message: Vec<String> = (1..=13).map(|i| if i == 3 { String::new() } else { format!("line {i}") }).collect();
    let json = serde_json::json!({"type": "Boom", "message": message.join("\n")}).to_string();
    env.write("error.json", &json);
    env.write("flow.toml", "[[step]]\nname = 'a'\nshell = 'cp error.json \"$WAYMARK_ERROR_FILE\"; exit 1'\n");
    let o = env.cmd(&["run", "--quiet", "flow.toml"]).output().unwrap();
    let (code, stdout, stderr) = out(&o);
    assert_eq!((code, stdout.as_str()), (Some(1), ""), "{stderr}");
    golden("report/quiet-multi-line-message.stderr", &normalise(&env, &stderr));
    let status = env.cmd(&["status"]).output().unwrap();
    let text = normalise(&env, &String::from_utf8_lossy(&status.stdout));
    let under: String = text.lines().skip(2).map(|l| format!("{l}\n")).collect();
    let rest: String = (4..=11).map(|i| format!("                         line {i}\n")).collect();
    assert_eq!(
        under,
        format!(
            "                       last error: Boom(Exception, BaseException): line 1 … [error file]\n\
             {}line 2\n\n{rest}                         … 2 more lines of the message: `waymark status --json RUN` shows it whole\n",
            " ".repeat(25)
        )
    );
    // `--json` has it whole.
    let json = env.cmd(&["status", "--json"]).output().unwrap();
    let status: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(status["steps"][0]["last_error"]["message"], message.join("\n"));
}

/// `run.aborted` carries waymark's failure with its causes, as the command's message on stderr
/// says it (`...: ENOENT: No such file or directory`), not only its first part. Here an attempt
/// removes its own log directory, so the next attempt's files cannot be made.
#[test]
fn run_aborted_says_the_cause_as_the_error_message_does() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "[[step]]\nname = 'a'\nshell = 'rm -rf \"$(dirname \"$WAYMARK_ERROR_FILE\")\"; exit 1'\nretry = { attempts = 2 }\n",
    );
    let o = env.cmd(&["run", "--json", "flow.toml"]).output().unwrap();
    let (code, stdout, stderr) = out(&o);
    assert_eq!(code, Some(4), "{stderr}");
    let last: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(last["event"], "run.aborted");
    let said = stderr.trim_end().split_once("once the cause is fixed: ").unwrap().1;
    assert_eq!(last["error"], said);
    let dir = env.state().canonicalize().unwrap().join("logs").join(run_id(&env)).join("a");
    // The directory named once: by the cause, which names it.
    assert_eq!(said, format!("cannot write attempt files: {}: ENOENT: No such file or directory", dir.display()));
}

/// The failure report's lines of the last attempt's stdout, with their indent.
fn stdout_tail(report: &str) -> Vec<&str> {
    let after = report.split_once("stdout of attempt 1, last lines:\n").map_or("", |(_, after)| after);
    after.lines().take_while(|l| l.starts_with("      ")).collect()
}

/// The report shows the end of a long last line (the last 4 KiB of the attempt's output) behind
/// `…`, so that it does not read as the whole line.
#[test]
fn the_report_marks_a_line_cut_to_its_last_4_kib() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "[[step]]\nname = 'l'\nshell = 'printf BEGIN; head -c 10000 /dev/zero | tr \"\\\\0\" x; echo END; exit 1'\n",
    );
    let o = env.cmd(&["run", "--quiet", "flow.toml"]).output().unwrap();
    let (code, _, stderr) = out(&o);
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(stdout_tail(&stderr)[0], format!("      …{}END", "x".repeat(4092)));
    // A cut that falls where a line ends marks nothing (8 lines of 511 bytes and their newlines
    // after `HEAD`), nor one that falls on the newline of a line left out (`HEAD`, then 7 lines of
    // 511 and one of 510 bytes): the tail is whole lines, the first one 511 bytes long.
    for sizes in [[511; 8], [511, 511, 511, 511, 511, 511, 511, 510]] {
        let lines: Vec<String> =
            sizes.iter().map(|n| format!("head -c {n} /dev/zero | tr \"\\\\0\" 1; echo")).collect();
        env.write("flow.toml", &format!("[[step]]\nname = 'l'\nshell = 'echo HEAD; {}; exit 1'\n", lines.join("; ")));
        let o = env.cmd(&["run", "--quiet", "--fresh", "flow.toml"]).output().unwrap();
        let (_, _, stderr) = out(&o);
        let tail = stdout_tail(&stderr);
        let shown: Vec<usize> = tail.iter().map(|l| l.len() - 6).collect();
        assert_eq!(shown, sizes, "{stderr}");
        assert!(tail.iter().all(|l| !l.contains('…')), "{stderr}");
    }
    // A cut inside a character of two bytes shows no half of it, and one that leaves only the
    // rest of a character before a newline shows no line of `…` alone.
    for (script, first) in [
        ("printf %s \"$(head -c 5000 /dev/zero | tr \"\\\\0\" x | sed s/x/é/g)\"; echo", "…éé"),
        (
            "head -c 5000 /dev/zero | tr \"\\\\0\" a; printf \"é\\\\n\"; head -c 4093 /dev/zero | tr \"\\\\0\" b; echo",
            "bbb",
        ),
    ] {
        env.write("flow.toml", &format!("[[step]]\nname = 'l'\nshell = '{script}; exit 1'\n"));
        let o = env.cmd(&["run", "--quiet", "--fresh", "flow.toml"]).output().unwrap();
        let (_, _, stderr) = out(&o);
        let shown = stdout_tail(&stderr)[0];
        assert!(shown.starts_with(&format!("      {first}")) && !shown.contains('\u{fffd}'), "{script}: {shown}");
    }
}
