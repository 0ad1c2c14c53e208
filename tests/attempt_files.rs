//! The files an attempt leaves: only what it wrote. A log file is created on its stream's first
//! byte; the error and outputs files only by the child; what an earlier execution of a
//! redelivered attempt left at their paths is never taken for the new execution's.

mod common;

use common::{Env, stderr};
use serde_json::Value;
use std::path::Path;

/// Every entry under `dir`, relative to it, sorted; directories end with `/`.
fn tree(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            if std::fs::symlink_metadata(&path).unwrap().is_dir() {
                out.push(format!("{rel}/"));
                walk(root, &path, out);
            } else {
                out.push(rel);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

fn last_run_id(env: &Env) -> String {
    let out = env.cmd(&["history", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let history: Value = serde_json::from_slice(&out.stdout).unwrap();
    history[0]["id"].as_str().unwrap().to_owned()
}

#[test]
fn an_attempt_leaves_a_file_only_for_what_it_wrote() {
    let env = Env::new();
    env.write(
        "flow.toml",
        r#"name = 'files'
[[step]]
name = 'quiet'
shell = 'true'
[[step]]
name = 'talks'
shell = 'echo hello'
[[step]]
name = 'outputs'
shell = 'echo rows=3 >> "$WAYMARK_OUTPUT"'
[[step]]
name = 'reports'
shell = 'printf "{\"type\": \"ConnectionResetError\"}" > "$WAYMARK_ERROR_FILE"; exit 1'
"#,
    );
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("reports: attempt 1/1 failed: ConnectionResetError"), "{}", stderr(&out));
    let id = last_run_id(&env);
    assert_eq!(
        tree(&env.state().join("logs")),
        [
            format!("{id}/"),
            format!("{id}/outputs/"),
            format!("{id}/outputs/attempt-1.outputs"),
            format!("{id}/quiet/"),
            format!("{id}/reports/"),
            format!("{id}/reports/attempt-1.error.json"),
            format!("{id}/talks/"),
            format!("{id}/talks/attempt-1.stdout"),
        ]
    );
    let logs = env.state().join("logs").join(&id);
    assert_eq!(std::fs::read_to_string(logs.join("talks/attempt-1.stdout")).unwrap(), "hello\n");
    assert_eq!(std::fs::read_to_string(logs.join("outputs/attempt-1.outputs")).unwrap(), "rows=3\n");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(logs.join("talks/attempt-1.stdout")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "a log created on its first byte is private");
    let mode = std::fs::metadata(logs.join("quiet")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "a step's log directory is private");
    // `status --json --attempts` gives the path of a log that exists, and null for one that
    // does not: the attempt wrote nothing there.
    let out = env.cmd(&["status", "--json", "--attempts", &id]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    let files: Vec<(&str, Value, Value)> = status["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["step"].as_str().unwrap(), s["attempts"][0]["stdout"].clone(), s["attempts"][0]["stderr"].clone()))
        .collect();
    let talks = logs.join("talks/attempt-1.stdout").display().to_string();
    assert_eq!(
        files,
        [
            ("quiet", Value::Null, Value::Null),
            ("talks", Value::from(talks), Value::Null),
            ("outputs", Value::Null, Value::Null),
            ("reports", Value::Null, Value::Null),
        ]
    );
}

#[test]
fn logs_of_an_attempt_that_wrote_nothing_say_so_and_gc_deletes_all() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'silent'\n[[step]]\nname = 'quiet'\nshell = 'true'\n[[step]]\nname = 'talks'\nshell = 'echo hello'\n",
    );
    env.cmd(&["run", "flow.toml"]).assert().success();
    let id = last_run_id(&env);
    let stem = env.state().join(format!("logs/{id}/quiet/attempt-1"));
    assert!(!stem.with_extension("stdout").exists() && !stem.with_extension("stderr").exists());
    // No header for a log file that does not exist: one line on stderr says there is nothing.
    env.cmd(&["logs", &id, "quiet"])
        .assert()
        .success()
        .stdout("")
        .stderr("waymark: attempt 1 of step `quiet` wrote nothing to stdout or stderr\n");
    for stream in ["stdout", "stderr"] {
        env.cmd(&["logs", &id, "quiet", "--attempt", "1", "--stream", stream])
            .assert()
            .success()
            .stdout("")
            .stderr(format!("waymark: attempt 1 of step `quiet` wrote nothing to {stream}\n"));
    }
    // A step that wrote to stdout only: its log under its header, and a line for stderr.
    let talks = env.state().join(format!("logs/{id}/talks/attempt-1.stdout"));
    env.cmd(&["logs", &id, "talks"])
        .assert()
        .success()
        .stdout(format!("==> {} <==\nhello\n", talks.display()))
        .stderr("waymark: attempt 1 of step `talks` wrote nothing to stderr\n");
    // A log file replaced by a link is refused, not followed, and said so.
    let kept = env.path("kept.stdout");
    std::fs::rename(&talks, &kept).unwrap();
    std::os::unix::fs::symlink(&kept, &talks).unwrap();
    env.cmd(&["logs", &id, "talks"]).assert().code(4).stdout("").stderr(format!(
        "error: {} is a symbolic link (to {}); waymark never follows links inside its state directory: remove it \
         (`rm {}`) and run again\n",
        talks.display(),
        kept.display(),
        talks.display()
    ));
    // Its log directory gone (moved, cleaned up), an attempt is not said to have written nothing.
    let dir = talks.parent().unwrap().to_owned();
    std::fs::rename(&dir, env.path("moved")).unwrap();
    env.cmd(&["logs", &id, "talks"]).assert().code(4).stdout("").stderr(format!(
        "error: cannot show the logs of attempt 1 of step `talks`: its log directory {} is gone (removed or moved \
         since the attempt ran; waymark keeps an attempt's logs there until `waymark gc` deletes its run); `waymark \
         status {id} --attempts` says how it ended\n",
        dir.display()
    ));
    std::fs::rename(env.path("moved"), &dir).unwrap();
    env.cmd(&["gc", "--older-than", "0s"]).assert().success();
    assert_eq!(tree(&env.state().join("logs")), Vec::<String>::new());
}

/// Both logs of an attempt, each under its header: a log that does not end with a newline gets
/// one before the next header, which is always a line of its own.
#[test]
fn logs_put_each_header_on_a_line_of_its_own() {
    let env = Env::new();
    env.write("flow.toml", "[[step]]\nname = 'm'\nshell = 'printf abc; printf def >&2'\n");
    env.cmd(&["run", "-q", "flow.toml"]).assert().success();
    let id = last_run_id(&env);
    let stem = env.state().join(format!("logs/{id}/m/attempt-1"));
    env.cmd(&["logs", &id, "m"]).assert().success().stdout(format!(
        "==> {} <==\nabc\n==> {} <==\ndef",
        stem.with_extension("stdout").display(),
        stem.with_extension("stderr").display()
    ));
    // One stream alone is as written.
    env.cmd(&["logs", &id, "m", "--stream", "stdout"]).assert().success().stdout("abc");
}

#[test]
fn a_redelivered_attempt_does_not_take_an_earlier_executions_error_or_outputs_file() {
    let env = Env::new();
    // The first execution of `s` reports an error and an output, then is lost with its runner
    // (SIGKILL). The redelivered execution writes neither: it must start without those files,
    // fail as a plain exit status, and leave `t` without the old output.
    env.write(
        "flow.toml",
        r#"name = 'stale'
[[step]]
name = 's'
shell = '''
if [ ! -e once ]; then
    touch once
    printf '{"type": "StaleError"}' > "$WAYMARK_ERROR_FILE"
    echo old=1 >> "$WAYMARK_OUTPUT"
    echo $$ > pid
    exec sleep 300
fi
for f in "$WAYMARK_ERROR_FILE" "$WAYMARK_OUTPUT"; do
    if [ -e "$f" ]; then echo present; else echo absent; fi >> seen
done
[ -e second ] && exit 0
touch second
exit 1
'''
retry = { attempts = 2, exception_types = ["SubprocessError"] }
[[step]]
name = 't'
shell = 'echo "[${WAYMARK_OUTPUT_S_OLD-}]" >> t.log'
"#,
    );
    let _ = env.run_until("pid", "KILL");
    let id = last_run_id(&env);
    let stem = env.state().join(format!("logs/{id}/s/attempt-1"));
    assert!(stem.with_extension("error.json").exists() && stem.with_extension("outputs").exists());
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("s: attempt 1/2 failed: CalledProcessError"), "{err}");
    assert!(!err.contains("StaleError"), "{err}");
    // The redelivered attempt 1, and attempt 2 after it, found neither file.
    assert_eq!(env.read("seen"), "absent\nabsent\nabsent\nabsent\n");
    assert_eq!(env.read("t.log"), "[]\n");
    assert!(!stem.with_extension("error.json").exists());
}

#[test]
fn a_failed_attempts_stderr_is_judged_as_it_passed_not_read_back_from_its_log() {
    let env = Env::new();
    // The child prints a traceback, waits until it is in its log, then empties the log and fails:
    // the traceback still names the error (the evidence is what passed through, kept in memory).
    env.write(
        "flow.toml",
        r#"name = 'tail'
[[step]]
name = 's'
shell = '''
printf 'Traceback (most recent call last):\n  File "x", line 1, in <module>\nValueError: from memory\n' >&2
log="$(dirname "$WAYMARK_ERROR_FILE")/attempt-$WAYMARK_ATTEMPT.stderr"
while [ ! -s "$log" ]; do sleep 0.01; done
: > "$log"
exit 1
'''
"#,
    );
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("s: attempt 1/1 failed: ValueError"), "{err}");
}

/// What the step of [`every_byte_is_logged_whatever_the_display`] writes to stdout, with its
/// secret as the log must hold it: a secret split between two of the child's writes, lines far
/// longer than a read, and a last line with no newline.
fn chatty_stdout(secret: &str) -> String {
    let mut out = String::new();
    for i in 0..20_000 {
        out.push_str(&format!("line {i} token={secret}\n"));
    }
    out.push_str(&"x".repeat(300_000));
    out.push('\n');
    out.push_str("no newline at the end");
    out
}

#[test]
fn every_byte_is_logged_whatever_the_display() {
    // Under --quiet, --json and --output none no reporter shows the children's lines, so the
    // readers send the runner none and only write the logs; the logs must not differ.
    let env = Env::new();
    env.write(
        "flow.toml",
        r#"name = 'chatty'
secret_env = ['API_TOKEN']
[[step]]
name = 'talks'
run = ['python3', '-c', '''
import os, sys
t = os.environ["API_TOKEN"]
for i in range(20000):
    sys.stdout.write(f"line {i} token={t[:3]}"); sys.stdout.flush()
    sys.stdout.write(f"{t[3:]}\n")
sys.stdout.write("x" * 300000 + "\n")
sys.stdout.write("no newline at the end")
sys.stderr.write(f"err {t}\n")
''']
"#,
    );
    let expected = chatty_stdout("***");
    for flags in [&["--quiet"][..], &["--json"], &["--output", "none"], &["--output", "all"]] {
        let mut args = vec!["run"];
        args.extend_from_slice(flags);
        args.push("flow.toml");
        let out = env.cmd(&args).env("API_TOKEN", "s3cr3t-value").output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{flags:?}: {}", stderr(&out));
        let logs = env.state().join("logs").join(last_run_id(&env)).join("talks");
        let stdout = std::fs::read_to_string(logs.join("attempt-1.stdout")).unwrap();
        assert!(
            stdout == expected,
            "{flags:?}: the stdout log differs ({} bytes, {} expected)",
            stdout.len(),
            expected.len()
        );
        assert_eq!(std::fs::read_to_string(logs.join("attempt-1.stderr")).unwrap(), "err ***\n", "{flags:?}");
    }
}

/// Every file under `dir` that holds `needle`.
fn files_holding(dir: &Path, needle: &str) -> Vec<String> {
    tree(dir)
        .into_iter()
        .filter(|rel| {
            std::fs::read(dir.join(rel)).is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle.as_bytes()))
        })
        .collect()
}

/// A run abandoned by `--fresh` while an attempt, or a compensation, was in flight: what was in
/// flight is killed, and since only an execution that ends has its files scrubbed of the run's
/// secrets, its error and outputs files are removed. No file under the state directory holds the
/// secret, and nothing is left running.
#[test]
fn an_abandoned_run_leaves_no_secret_and_nothing_running_of_what_was_in_flight() {
    const SECRET: &str = "s3cr3t-VALUE";
    let in_flight = r#"[ -e second ] && exit 0
touch second
echo "{\"type\": \"Boom\", \"message\": \"$TOK\"}" > "$WAYMARK_ERROR_FILE"
echo "k=$TOK" > "$WAYMARK_OUTPUT"
echo $$ > pid
exec sleep 300"#;
    let attempt = format!("[[step]]\nname = 's'\nshell = '''\n{in_flight}\n'''\n");
    let compensation = format!(
        "[[step]]\nname = 'a'\nshell = 'true'\ncompensate = '''\n{in_flight}\n'''\n[[step]]\nname = 'b'\nshell = 'exit 1'\n"
    );
    for (what, steps, code) in [("attempt 1", attempt, 0), ("compensate `a`", compensation, 1)] {
        let env = Env::new();
        env.write(".env", &format!("TOK={SECRET}\n"));
        env.write("flow.toml", &format!("name = 'gone'\nenv_file = '.env'\nsecret_env = ['TOK']\n{steps}"));
        let _ = env.run_until("pid", "KILL");
        let pid = common::read_pid(&env.path("pid"));
        assert!(common::alive(pid), "{what}: in flight after its runner died");
        assert!(!files_holding(&env.state(), SECRET).is_empty(), "{what}: its files hold the secret until it ends");
        let out = env.cmd(&["run", "--fresh", "flow.toml"]).output().unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(code), "{what}: {err}");
        assert!(err.contains(&format!("killed 1 leftover process(es) of {what} from the previous runner")), "{err}");
        assert!(!common::alive(pid), "{what}: killed when its run was abandoned");
        assert_eq!(files_holding(&env.state(), SECRET), Vec::<String>::new(), "{what}");
    }
}

/// The log directory of a run whose runner died with an attempt in flight, deleted by hand (to
/// free space, say): the next runner still makes sure the attempt is dead and runs it again.
#[test]
fn a_run_whose_log_directory_was_deleted_still_resumes() {
    let env = Env::new();
    env.write("flow.toml", "name = 'nologs'\n[[step]]\nname = 's'\nshell = '''[ -e second ] && exit 0\ntouch second\necho $$ > pid\nexec sleep 300'''\n");
    let _ = env.run_until("pid", "KILL");
    let pid = common::read_pid(&env.path("pid"));
    std::fs::remove_dir_all(env.state().join("logs").join(last_run_id(&env))).unwrap();
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("killed 1 leftover process(es) of attempt 1 from the previous runner"), "{err}");
    assert!(!common::alive(pid));
}

/// A state directory moved (or restored elsewhere) keeps its logs: they are read where the
/// database now is, not at the paths recorded when the attempts ran; and a copy's logs are the
/// copy's, never those of the directory it was copied from.
#[test]
fn a_moved_or_copied_state_directory_reads_its_own_logs() {
    let env = Env::new();
    env.write("flow.toml", "[[step]]\nname = 'm'\nshell = 'echo out; echo err >&2'\n");
    env.cmd(&["run", "-q", "flow.toml"]).assert().success();
    let id = last_run_id(&env);
    let moved = env.path("moved");
    std::fs::rename(env.state(), &moved).unwrap();
    let stem = moved.join(format!("logs/{id}/m/attempt-1"));
    let in_dir = |dir: &Path, args: &[&str]| {
        let mut c = env.cmd(args);
        c.env("WAYMARK_STATE_DIR", dir);
        c
    };
    in_dir(&moved, &["logs", &id, "m"])
        .assert()
        .success()
        .stdout(format!("==> {stem}.stdout <==\nout\n==> {stem}.stderr <==\nerr\n", stem = stem.display()));
    let out = in_dir(&moved, &["status", &id, "--json", "--attempts"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    let attempt = &status["steps"][0]["attempts"][0];
    assert_eq!(
        (&attempt["stdout"], &attempt["stderr"]),
        (&Value::from(format!("{}.stdout", stem.display())), &Value::from(format!("{}.stderr", stem.display()))),
        "{status}"
    );
    // A copy whose step logs were removed: they are gone from it, not read from `moved`.
    let copy = env.path("copy");
    assert!(std::process::Command::new("cp").arg("-a").arg(&moved).arg(&copy).status().unwrap().success());
    let dir = copy.join(format!("logs/{id}/m"));
    std::fs::remove_dir_all(&dir).unwrap();
    in_dir(&copy, &["logs", &id, "m"]).assert().code(4).stdout("").stderr(format!(
        "error: cannot show the logs of attempt 1 of step `m`: its log directory {} is gone (removed or moved since \
         the attempt ran; waymark keeps an attempt's logs there until `waymark gc` deletes its run); `waymark status \
         {id} --attempts` says how it ended\n",
        dir.display()
    ));
}
