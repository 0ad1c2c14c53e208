//! waymark and the files its output goes to: a stdout that stops reading (defect 4 of issue 7)
//! and a stdout that is closed or full (defect 6).
//!
//! A stalled stdout is a pipe whose read end the test keeps open and never reads. The step writes
//! 10 MB (more than the 8 MiB waymark queues for the display), then its pid and its grandchild's,
//! then sleeps: timeouts, their bookkeeping and the runner's signals must work all the same, the
//! log must get every byte, and no process of the step may survive.

mod common;

use common::{Env, PATIENCE, alive, finish, kill, read_pid, wait_until};
use std::io::PipeReader;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

/// Lines of 99 `x` and a newline the step writes: 10 MB.
const LINES: usize = 100_000;

/// A step that (unless `ok` exists) writes [`LINES`] lines, records its pid and its grandchild's,
/// says `written`, and sleeps. `prelude` runs first (a trap, say).
fn stalled_flow(env: &Env, prelude: &str, extra: &str) {
    env.write(
        "flow.toml",
        &format!(
            "[[step]]\nname = 'big'\nshell = '''\n{prelude}\nif [ -e ok ]; then exit 0; fi\n\
             sleep 3600 & echo $! > grandchild\necho $$ > pid\n\
             python3 -c \"import sys; sys.stdout.write(('x' * 99 + '\\\\n') * {LINES})\"\n\
             echo done > written\nsleep 3600\n'''\n{extra}"
        ),
    );
}

/// `waymark ARGS` with stdout on a pipe that is never read (its read end is returned: keep it),
/// and stderr collected as it comes.
fn spawn_stalled(env: &Env, args: &[&str]) -> (Child, PipeReader, Arc<Mutex<String>>) {
    let (reader, writer) = std::io::pipe().unwrap();
    let mut child = Command::new(assert_cmd::cargo::cargo_bin("waymark"))
        .current_dir(env.dir.path())
        .env("WAYMARK_STATE_DIR", env.state())
        .args(args)
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let seen = common::watch_stderr(&mut child);
    (child, reader, seen)
}

/// Wait for the runner to exit (bounded by [`PATIENCE`]); its exit code.
fn exit_code(child: &mut Child) -> Option<i32> {
    let start = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        if start.elapsed() > PATIENCE {
            kill(child.id(), "KILL");
            panic!("waymark did not exit while its stdout was stalled");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Wait until the collected stderr has `needle`.
fn wait_for_stderr(seen: &Mutex<String>, needle: &str) {
    wait_until(&format!("stderr to say `{needle}`"), || seen.lock().unwrap().contains(needle));
}

fn status_json(env: &Env) -> serde_json::Value {
    let out = env.cmd(&["status", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The step's stdout log holds exactly what it wrote, and no process of the step is alive.
fn assert_logged_and_gone(env: &Env, run: &str) {
    let log = std::fs::read(env.state().join("logs").join(run).join("big/attempt-1.stdout")).unwrap();
    assert_eq!(log.len(), LINES * 100, "the log must have every byte the step wrote");
    assert!(log.chunks(100).all(|line| line[..99].iter().all(|b| *b == b'x') && line[99] == b'\n'));
    for name in ["pid", "grandchild"] {
        let pid = read_pid(&env.path(name));
        wait_until(&format!("the step's {name} ({pid}) to be gone"), || !alive(pid));
    }
}

/// The warning about the display lines that were dropped, whatever their number.
fn assert_dropped_said(stderr: &str, run: &str) {
    let stderr = common::untimed(stderr);
    let line = stderr
        .lines()
        .find(|l| l.starts_with("waymark: warning: big: ") && l.contains(" bytes of its stdout not shown"))
        .unwrap_or_else(|| panic!("no warning about output not shown in:\n{stderr}"));
    let bytes: usize = line["waymark: warning: big: ".len()..].split(' ').next().unwrap().parse().unwrap();
    assert!(bytes > 0 && bytes < LINES * 100, "{line}");
    assert!(line.ends_with(&format!(
        " bytes of its stdout not shown: stdout was not being read fast enough; the log has all of it \
         (`waymark logs {run} big --stream stdout`)"
    )));
}

#[test]
fn a_timeout_is_recorded_while_stdout_is_stalled_and_the_log_gets_everything() {
    let env = Env::new();
    // Generous: the 10 MB must be written and logged before the timeout, even on a loaded machine.
    stalled_flow(&env, "", "timeout = 20\nkill_grace = 0\n");
    let (mut child, _unread, seen) = spawn_stalled(&env, &["run", "flow.toml"]);
    assert_eq!(exit_code(&mut child), Some(1), "{}", seen.lock().unwrap());
    assert!(env.path("written").exists(), "the step could not write its output before its timeout");
    let status = status_json(&env);
    let run = status["id"].as_str().unwrap().to_owned();
    assert_eq!(status["status"], "failed");
    assert_eq!(status["steps"][0]["last_error"]["class"], "ActionTimeout");
    let history = env.cmd(&["history", "--json"]).output().unwrap();
    let history: serde_json::Value = serde_json::from_slice(&history.stdout).unwrap();
    assert_eq!((history[0]["status"].as_str(), history[0]["failed_step"].as_str()), (Some("failed"), Some("big")));
    assert_logged_and_gone(&env, &run);
    let stderr = common::untimed(&seen.lock().unwrap());
    assert!(
        stderr.contains("waymark: big: attempt 1/1 failed: ActionTimeout: timed out after 20s [timeout]\n"),
        "{stderr}"
    );
    assert_dropped_said(&stderr, &run);
    assert!(stderr.ends_with(&format!(
        "waymark: warning: stdout took nothing for 5s; the rest of the steps' output was not shown there \
         (the logs have all of it: `waymark logs {run} STEP`)\n"
    )));
}

/// A signal to the runner while its stdout is stalled: the run is cancelled with `code`, then
/// resumes and succeeds.
fn signal_during_a_stall(signal: &str, code: i32) {
    let env = Env::new();
    stalled_flow(&env, "", "");
    let (mut child, _unread, seen) = spawn_stalled(&env, &["run", "flow.toml"]);
    wait_until("the step to have written its output", || env.path("written").exists());
    kill(child.id(), signal);
    assert_eq!(exit_code(&mut child), Some(code), "{}", seen.lock().unwrap());
    let status = status_json(&env);
    let run = status["id"].as_str().unwrap().to_owned();
    assert_eq!(status["status"], "interrupted");
    assert_eq!(status["steps"][0]["state"], "interrupted");
    assert_logged_and_gone(&env, &run);
    let stderr = common::untimed(&seen.lock().unwrap());
    assert!(
        stderr.contains(&format!("waymark: got {signal}, stopping running steps (send it again to kill them)\n")),
        "{stderr}"
    );
    assert!(stderr.contains(&format!("waymark: run {run} interrupted; `waymark run` again resumes it\n")), "{stderr}");
    assert_dropped_said(&stderr, &run);
    // Resumable: the next run picks the step up again.
    env.write("ok", "");
    let out = finish(env.spawn(&["run", "flow.toml"]));
    let stderr = common::untimed(&String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.starts_with(&format!("waymark: resuming run {run} of flow: 0 of 1 steps done\n")), "{stderr}");
}

#[test]
fn sigint_while_stdout_is_stalled_cancels_the_run() {
    signal_during_a_stall("SIGINT", 130);
}

#[test]
fn sigterm_while_stdout_is_stalled_cancels_the_run() {
    signal_during_a_stall("SIGTERM", 143);
}

#[test]
fn a_second_sigint_while_stdout_is_stalled_kills_the_step() {
    let env = Env::new();
    // The step and its grandchild ignore SIGINT, and the grace period is long: only the second
    // signal can stop them.
    stalled_flow(&env, "trap '' INT", "kill_grace = '1h'\n");
    let (mut child, _unread, seen) = spawn_stalled(&env, &["run", "flow.toml"]);
    wait_until("the step to have written its output", || env.path("written").exists());
    kill(child.id(), "INT");
    wait_for_stderr(&seen, "waymark: got SIGINT, stopping running steps");
    assert!(alive(read_pid(&env.path("pid"))), "the step ignores SIGINT");
    kill(child.id(), "INT");
    assert_eq!(exit_code(&mut child), Some(130), "{}", seen.lock().unwrap());
    let run = status_json(&env)["id"].as_str().unwrap().to_owned();
    assert_logged_and_gone(&env, &run);
    assert!(seen.lock().unwrap().contains("waymark: got SIGINT, a second signal: killing running steps\n"));
}

// ---- a closed or full stdout ----

const FULL: &str = "error: cannot write to standard output: No space left on device (os error 28); free space where it goes, \
     or redirect it to another file\n";

/// A state directory with one finished run of `flow.toml`, whose step `s` printed a line.
fn env_with_a_run() -> Env {
    let env = Env::new();
    env.write("flow.toml", "[[step]]\nname = 's'\nshell = 'echo hello'\n");
    env.cmd(&["run", "flow.toml"]).assert().success();
    env
}

fn run_id(env: &Env) -> String {
    status_json(env)["id"].as_str().unwrap().to_owned()
}

/// Every command that prints on stdout, with arguments for [`env_with_a_run`].
fn printing_commands(env: &Env) -> Vec<Vec<String>> {
    let run = run_id(env);
    let commands: [&[&str]; 13] = [
        &["check", "flow.toml"],
        &["--help"],
        &["run", "--help"],
        &["help", "run"],
        &["--version"],
        &["history"],
        &["history", "--json"],
        &["status"],
        &["status", "--json"],
        &["logs", &run, "s"],
        &["errors"],
        &["errors", "--flow", "flow.toml"],
        &["completions", "bash"],
    ];
    commands.iter().map(|c| c.iter().map(|s| s.to_string()).collect()).collect()
}

fn run_with_stdout(env: &Env, args: &[String], stdout: impl Into<Stdio>) -> std::process::Output {
    let child = Command::new(assert_cmd::cargo::cargo_bin("waymark"))
        .current_dir(env.dir.path())
        .env("WAYMARK_STATE_DIR", env.state())
        .args(args)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    finish(child)
}

/// A pipe whose reader is gone: every write to it fails with EPIPE.
fn closed_pipe() -> std::io::PipeWriter {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    writer
}

#[test]
fn commands_end_quietly_when_stdout_is_a_closed_pipe() {
    let env = env_with_a_run();
    for args in printing_commands(&env) {
        let out = run_with_stdout(&env, &args, closed_pipe());
        assert_eq!(
            (out.status.code(), String::from_utf8_lossy(&out.stderr).as_ref()),
            (Some(0), ""),
            "waymark {args:?}"
        );
    }
}

#[test]
fn commands_fail_with_exit_4_when_stdout_is_full() {
    let env = env_with_a_run();
    for args in printing_commands(&env) {
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
        let out = run_with_stdout(&env, &args, full);
        assert_eq!(
            (out.status.code(), String::from_utf8_lossy(&out.stderr).as_ref()),
            (Some(4), FULL),
            "waymark {args:?}"
        );
    }
}

/// waymark's stderr with the one elapsed time in it replaced by `TIME`.
/// Waymark's lines without their times (nor the date line), pids and durations normalised.
fn normalized(stderr: &[u8]) -> String {
    common::normalise_plain(&common::untimed(&String::from_utf8_lossy(stderr)))
}

/// `--help` on a full stdout is an error like any command's, colored as `--color` says.
#[test]
fn help_on_a_full_stdout_is_an_error_colored_as_color_says() {
    let env = Env::new();
    let help = |color: &str| {
        let args = ["--color".to_owned(), color.to_owned(), "--help".to_owned()];
        let out = run_with_stdout(&env, &args, std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap());
        assert_eq!(out.status.code(), Some(4));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let plain = help("never");
    assert_eq!(plain, FULL);
    assert_eq!(help("always"), plain.replacen("error: ", "\x1b[1m\x1b[91merror\x1b[0m\x1b[1m:\x1b[0m ", 1));
}

#[test]
fn a_run_goes_on_when_stdout_is_closed_or_full() {
    let args = ["run".to_owned(), "flow.toml".to_owned()];
    for full in [false, true] {
        let env = Env::new();
        env.write("flow.toml", "[[step]]\nname = 's'\nshell = 'seq 1 3'\n");
        let out = if full {
            run_with_stdout(&env, &args, std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap())
        } else {
            run_with_stdout(&env, &args, closed_pipe())
        };
        let status = status_json(&env);
        let run = status["id"].as_str().unwrap();
        assert_eq!(status["status"], "succeeded");
        let log = env.state().join("logs").join(run).join("s/attempt-1.stdout");
        assert_eq!(std::fs::read_to_string(log).unwrap(), "1\n2\n3\n");
        let mut expected = format!(
            "waymark: run {run} of flow: 1 step(s)\n\
             waymark: s: started\n\
             waymark: s: attempt 1/1 started (pid PID)\n\
             waymark: s: attempt 1/1 succeeded\n\
             waymark: s: succeeded (1 attempt)\n\
             waymark: steps of run {run}:\n\
             \x20 STEP  STATUS  ATTEMPTS    DURATION  DETAIL\n\
             \x20 s     ok           1/1    DURATION\n\
             waymark: run {run} succeeded in DURATION\n"
        );
        if full {
            // A closed pipe is the reader's choice and ends the display quietly; a full disk is said.
            expected.push_str(&format!(
                "waymark: warning: cannot write to stdout: No space left on device (os error 28); what was to be \
                 shown there is in the logs (`waymark logs {run} STEP`)\n"
            ));
        }
        assert_eq!((out.status.code(), normalized(&out.stderr)), (Some(0), expected), "full: {full}");
    }
}

#[test]
fn commands_end_quietly_when_stdout_and_stderr_are_one_closed_pipe() {
    // `waymark ... 2>&1 | head -0`: waymark's own messages on stderr must not crash it either.
    let env = env_with_a_run();
    let mut commands = printing_commands(&env);
    commands.push(vec!["gc".into(), "--older-than".into(), "1h".into()]);
    commands.push(vec!["run".into(), "flow.toml".into(), "--fresh".into()]);
    for args in commands {
        let pipe = closed_pipe();
        let child = Command::new(assert_cmd::cargo::cargo_bin("waymark"))
            .current_dir(env.dir.path())
            .env("WAYMARK_STATE_DIR", env.state())
            .args(&args)
            .stdin(Stdio::null())
            .stderr(pipe.try_clone().unwrap())
            .stdout(pipe)
            .spawn()
            .unwrap();
        assert_eq!(finish(child).status.code(), Some(0), "waymark {args:?}");
    }
    assert_eq!(status_json(&env)["status"], "succeeded");
}

/// Lines of 999 characters and a newline the step of
/// [`a_stdout_that_is_a_regular_file_gets_every_line_however_fast_they_come`] writes: 64 MiB,
/// eight times what a terminal or a pipe may have waiting before lines are left out.
const FILE_LINES: usize = 64 * 1024 * 1024 / 1000;

#[test]
fn a_stdout_that_is_a_regular_file_gets_every_line_however_fast_they_come() {
    let env = Env::new();
    let line = "0123456789".repeat(100)[..999].to_owned();
    env.write("flow.toml", &format!("[[step]]\nname = 'big'\nshell = 'yes {line} | head -n {FILE_LINES}'\n"));
    let file = std::fs::File::create(env.path("out.txt")).unwrap();
    let out = run_with_stdout(&env, &["run".to_owned(), "flow.toml".to_owned()], file);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("not shown"), "nothing is left out of a regular file: {stderr}");
    let shown = std::fs::read(env.path("out.txt")).unwrap();
    let expected = format!("big | {line}\n").repeat(FILE_LINES);
    assert!(shown == expected.as_bytes(), "{} bytes shown of {}", shown.len(), expected.len());
}

/// A line longer than 64 KiB is shown in pieces of at least 64 KiB, each on a line behind the
/// step's name, and nothing else: the newline that ends it right after a piece is no empty line of
/// its own. Its log has it whole.
#[test]
fn a_line_longer_than_64_kib_is_shown_in_pieces_and_no_empty_line() {
    let env = Env::new();
    // 66,000 bytes in three writes, then its newline alone; then a line of 200,000 bytes at once.
    env.write(
        "flow.toml",
        "[[step]]\nname = 'l'\nrun = ['python3', '-c', '''\nimport sys, time\nfor i in range(3):\n    \
         sys.stdout.write(\"x\" * 22000); sys.stdout.flush(); time.sleep(0.05)\nsys.stdout.write(\"\\n\"); \
         sys.stdout.flush(); time.sleep(0.05)\nsys.stdout.write(\"y\" * 200000 + \"\\n\")\n''']\n",
    );
    let out = run_with_stdout(&env, &["run".to_owned(), "flow.toml".to_owned()], Stdio::piped());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let shown = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines[0], format!("l | {}", "x".repeat(66_000)));
    let pieces: Vec<&str> = lines[1..].iter().map(|l| l.strip_prefix("l | ").expect("behind the name")).collect();
    assert!(
        pieces.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b == b'y')),
        "only pieces of the line: {pieces:?}"
    );
    assert!(pieces[..pieces.len() - 1].iter().all(|p| p.len() >= 64 * 1024), "{:?}", pieces.iter().map(|p| p.len()));
    assert_eq!(pieces.concat().len(), 200_000);
    let log = env.cmd(&["logs", "flow.toml", "l", "--stream", "stdout"]).output().unwrap();
    assert_eq!(String::from_utf8(log.stdout).unwrap(), format!("{}\n{}\n", "x".repeat(66_000), "y".repeat(200_000)));
}

/// A step has no terminal, as under cron: it runs in a session of its own. One that would read
/// the terminal (a password prompt) fails at once, where it was stopped by SIGTTIN for good and
/// the run hung; one that would change its settings (`stty -echo`) cannot, and the user's shell
/// keeps its echo; a shell's job control (`set -m`) is turned off, not spinning or stopped; and
/// the step's first process leads its session and group. `script` (util-linux) gives waymark a
/// terminal with SIGTTIN at its default action, as a shell's prompt does (tmux's panes ignore it).
#[test]
fn a_step_has_no_terminal_to_read_stop_on_or_change() {
    use std::io::Write;
    if Command::new("script").arg("--version").output().is_err() {
        assert!(std::env::var_os("CI").is_none(), "script (util-linux) is required under CI");
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED a_step_has_no_terminal_to_read_stop_on_or_change: `script` is not installed"
        );
        return;
    }
    let env = Env::new();
    let _sweeper = common::Sweeper(env.mark());
    env.write(
        "flow.toml",
        "[[step]]\nname = 'ask'\nneeds = []\nrun = ['cat', '/dev/tty']\n\
         [[step]]\nname = 'noecho'\nneeds = []\nshell = 'stty -echo < /dev/tty'\n\
         [[step]]\nname = 'jobs'\nneeds = []\nshell = 'set -m; echo job control off'\n\
         [[step]]\nname = 'leads'\nneeds = []\n\
         run = ['python3', '-c', 'import os; print(os.getsid(0) == os.getpid(), os.getpgrp() == os.getpid())']\n",
    );
    let waymark = assert_cmd::cargo::cargo_bin("waymark");
    let after = "stty -a | tr ' ' '\\n' | grep -x -- '-\\?echo' > echo-after";
    let child = Command::new("script")
        .args(["-qefc", &format!("'{}' run --progress plain flow.toml; {after}", waymark.display()), "/dev/null"])
        .current_dir(env.dir.path())
        .env("WAYMARK_STATE_DIR", env.state())
        .env(common::MARK, env.mark())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = finish(child);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("ask | cat: /dev/tty: No such device or address"), "{said}");
    assert!(said.contains("ask: attempt 1/1 failed: CalledProcessError: exit status 1 [exit status]"), "{said}");
    let line = |prefix: &str, end: &str| said.lines().any(|l| l.starts_with(prefix) && l.ends_with(end));
    assert!(line("noecho | ", "/dev/tty: No such device or address"), "{said}");
    assert!(said.contains("jobs | job control off"), "{said}");
    assert!(said.contains("leads | True True"), "{said}");
    assert_eq!(env.read("echo-after"), "echo\n", "{said}");
}
