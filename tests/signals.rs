//! Signals to the runner: every one it listens for during an attempt; SIGINT and SIGTERM as early as possible after start (while the first
//! attempt is being spawned), during an attempt, during a backoff, twice (the second once the
//! first was forwarded), and a SIGKILL of the runner during a cancel's grace period. Each time:
//! the exit status of README's table (130, 143), the run resumable by the next `waymark run`
//! (the cancelled step runs again, succeeded steps do not), and no process of a step left alive.
//!
//! Each case runs once per signal; `WAYMARK_LONG=1` runs the cases five times, and the
//! early-signal sweep 40 moments per signal instead of 12.

mod common;

use common::{Env, Sweeper, assert_no_survivors, finish, iterations, kill, stderr, wait_until};
use serde_json::Value;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

const SIGNALS: [(&str, i32); 2] = [("INT", 130), ("TERM", 143)];

/// Every signal the runner listens for (README): those whose default action would end it.
const ALL_SIGNALS: [(&str, i32); 7] =
    [("INT", 130), ("TERM", 143), ("HUP", 129), ("QUIT", 131), ("USR1", 138), ("USR2", 140), ("ALRM", 142)];

/// Each signal once, five times under `WAYMARK_LONG=1`.
fn rounds() -> Vec<(&'static str, i32)> {
    SIGNALS.repeat(iterations(1, 5))
}

/// A flow of three steps around `mid`: `first` (which takes 50 ms) and `last` append to
/// `first.fx` and `last.fx`; `mid` succeeds (appending to `mid.fx`) once `release` exists.
fn flow(env: &Env, mid: &str) {
    env.write(
        "flow.toml",
        &format!(
            "name = 'sig'\n{}[[step]]\nname = 'first'\nshell = 'echo $$ >> pids; sleep 0.05; echo x >> first.fx'\n\
             [[step]]\nname = 'mid'\n{mid}\n[[step]]\nname = 'last'\nshell = 'echo $$ >> pids; echo x >> last.fx'\n",
            env.mark_env()
        ),
    );
}

fn status(env: &Env) -> Option<Value> {
    let out = env.cmd(&["status", "sig", "--json"]).output().unwrap();
    out.status.success().then(|| serde_json::from_slice(&out.stdout).unwrap())
}

fn pids(env: &Env) -> Vec<u32> {
    env.read("pids").lines().filter_map(|l| l.trim().parse().ok()).collect()
}

/// Release `mid`, run the flow again and check that it finished the one run: every side effect
/// once (`first_runs` for `first`), and nothing left alive.
fn resume_finishes(env: &Env, first_runs: usize, context: &str) -> String {
    env.write("release", "");
    let out = finish(env.spawn(&["run", "flow.toml"]));
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{context}: the resume: {said}");
    assert_eq!(env.count("first.fx"), first_runs, "{context}: {said}");
    assert_eq!((env.count("mid.fx"), env.count("last.fx")), (1, 1), "{context}: {said}");
    let history = env.cmd(&["history", "sig", "--json"]).output().unwrap();
    let history: Value = serde_json::from_slice(&history.stdout).unwrap();
    assert_eq!(history.as_array().unwrap().len(), 1, "{context}: the resume went on with the same run");
    assert_eq!(history[0]["status"], "succeeded", "{context}");
    assert_no_survivors(&env.mark(), &pids(env), context);
    said
}

/// The step under signal: counts its attempts in `mid.att`, reports the signal in `mid.sig` and
/// exits 1, leaves a `sleep` in its group; `ready` once all of that is in place.
fn waiting_step(signal: &str) -> String {
    format!(
        "shell = '''echo \"$WAYMARK_ATTEMPT\" >> mid.att; if [ -e release ]; then echo x >> mid.fx; exit 0; fi; \
         trap 'echo \"$WAYMARK_ATTEMPT\" >> mid.sig; exit 1' {signal}; echo $$ >> pids; sleep 300 & echo $! >> pids; \
         echo ready > ready; wait'''\nretry = {{ attempts = 3 }}\nkill_grace = '1s'"
    )
}

#[test]
fn a_signal_during_an_attempt_cancels_it_and_the_run_resumes() {
    for (signal, code) in ALL_SIGNALS.repeat(iterations(1, 5)) {
        let env = Env::new();
        let _sweeper = Sweeper(env.mark());
        flow(&env, &waiting_step(signal));
        let out = env.run_until("ready", signal);
        let said = stderr(&out);
        assert_eq!(out.status.code(), Some(code), "SIG{signal}: {said}");
        assert_eq!(env.read("mid.sig"), "1\n", "SIG{signal}: the step got the same signal once: {said}");
        assert_no_survivors(&env.mark(), &pids(&env), &format!("SIG{signal}, after the cancel"));
        let st = status(&env).expect("status");
        assert_eq!(st["status"], "interrupted", "SIG{signal}");
        assert_eq!(st["steps"][0]["state"], "succeeded");
        assert_eq!(st["steps"][1]["attempts_used"], 0, "SIG{signal}: a cancelled attempt uses no attempt");

        let said = resume_finishes(&env, 1, &format!("SIG{signal}"));
        assert_eq!(env.read("mid.att"), "1\n1\n", "SIG{signal}: attempt 1 ran again, once: {said}");
        assert!(said.contains("first: already succeeded"), "{said}");
        // A cancelled attempt runs again under its number, and is not a redelivery (README): its
        // runner did not die, it recorded the cancel.
        assert!(said.contains("mid: attempt 1/3 started (pid "), "{said}");
        assert!(!said.contains("redelivered"), "SIG{signal}: {said}");
    }
}

/// A signal after a step failed for good, while another step (started beside it) is under way:
/// the run is interrupted, with or without hooks (which run when it ends), and the next
/// `waymark run` runs the step it cut short again (not the one that had not started), then fails.
#[test]
fn a_signal_after_a_failure_for_good_interrupts_the_run_and_resume_finishes_the_step_under_way() {
    for (signal, code) in rounds() {
        for hooks in ["", "[hooks]\non_exit = 'echo $WAYMARK_RUN_STATUS >> hook.fx'\n"] {
            let env = Env::new();
            let _sweeper = Sweeper(env.mark());
            env.write(
                "flow.toml",
                &format!(
                    "name = 'sig'\nmax_parallel = 2\n{}{hooks}\
                     [[step]]\nname = 'bad'\nneeds = []\nshell = 'exit 3'\n\
                     [[step]]\nname = 'slow'\nneeds = []\n\
                     shell = 'echo $$ >> pids; echo x >> slow.fx; if [ -e release ]; then exit 0; fi; echo x > ready; exec sleep 60'\n\
                     [[step]]\nname = 'later'\nneeds = []\nshell = 'echo x >> later.fx'\n\
                     [[step]]\nname = 'last'\nneeds = ['bad', 'slow']\nshell = 'echo x >> last.fx'\n",
                    env.mark_env()
                ),
            );
            // `bad` fails at once; `slow` waits for the signal, sent once `bad` is recorded failed.
            let runner = env.spawn(&["run", "flow.toml"]);
            env.wait_for_lines("ready", 1);
            wait_until("bad to fail", || status(&env).is_some_and(|st| st["steps"][0]["state"] == "failed"));
            kill(runner.id(), signal);
            let out = finish(runner);
            let context = format!("SIG{signal}, hooks {hooks:?}");
            assert_eq!(out.status.code(), Some(code), "{context}: {}", stderr(&out));
            assert_no_survivors(&env.mark(), &pids(&env), &context);
            assert_eq!(status(&env).expect("status")["status"], "interrupted", "{context}");
            assert!(!env.path("hook.fx").exists(), "{context}: hooks run when the run ends, on resume");

            // Resumed with the failure report (which reads every earlier attempt) and, with hooks,
            // without it (`--json`: only the attempts of the steps that may have been cut short).
            env.write("release", "");
            let json = !hooks.is_empty();
            let out =
                env.cmd(&[&["run", "flow.toml"][..], if json { &["--json"] } else { &[] }].concat()).output().unwrap();
            let said = if json { String::from_utf8_lossy(&out.stdout).into_owned() } else { stderr(&out) };
            assert_eq!(out.status.code(), Some(1), "{context}: {said}");
            let skipped = match json {
                true => said.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()).any(|e| {
                    (&e["event"], &e["step"], &e["reason"])
                        == (&"step.skipped".into(), &"bad".into(), &"already_failed".into())
                }),
                false => said.contains("bad: already failed, not run again"),
            };
            assert!(skipped, "{context}: {said}");
            assert_eq!(env.count("slow.fx"), 2, "{context}: the step cut short ran again: {said}");
            assert!(!env.path("later.fx").exists() && !env.path("last.fx").exists(), "{context}: {said}");
            let st = status(&env).expect("status");
            let states: Vec<&str> = (0..4).map(|i| st["steps"][i]["state"].as_str().unwrap()).collect();
            assert_eq!(
                (st["status"].as_str(), states),
                (Some("failed"), vec!["failed", "succeeded", "skipped", "skipped"])
            );
            if !hooks.is_empty() {
                assert_eq!(env.read("hook.fx"), "failed\n", "{context}");
            }
        }
    }
}

#[test]
fn a_signal_during_a_backoff_stops_the_wait_and_the_run_resumes() {
    for (signal, code) in rounds() {
        let env = Env::new();
        let _sweeper = Sweeper(env.mark());
        // Attempt 1 fails; attempt 2 would come 8 s later, far beyond the moment of the signal.
        flow(
            &env,
            "shell = '''echo $$ >> pids; echo \"$WAYMARK_ATTEMPT\" >> mid.att; [ \"$WAYMARK_ATTEMPT\" -ge 2 ] || exit 3; echo x >> mid.fx'''\n\
             retry = { attempts = 3, backoff_seconds = 8 }",
        );
        let runner = env.spawn(&["run", "flow.toml"]);
        wait_until("attempt 1's failure to be recorded", || {
            status(&env).is_some_and(|s| s["steps"][1]["state"] == "waiting")
        });
        kill(runner.id(), signal);
        let out = finish(runner);
        let said = stderr(&out);
        assert_eq!(out.status.code(), Some(code), "SIG{signal}: {said}");
        assert_eq!(env.read("mid.att"), "1\n", "SIG{signal}: no attempt started after the signal: {said}");
        let st = status(&env).expect("status");
        assert_eq!(st["status"], "interrupted", "SIG{signal}");
        assert_eq!(st["steps"][1]["attempts_used"], 1, "SIG{signal}: the failed attempt stays used");

        let said = resume_finishes(&env, 1, &format!("SIG{signal}"));
        assert_eq!(env.read("mid.att"), "1\n2\n", "SIG{signal}: the resume ran attempt 2: {said}");
    }
}

/// `mid` that survives the forwarded signal (it records it in `mid.sig`), with a grace period of an
/// hour: only what the runner does next ends it. With `release` present it succeeds.
const TRAPPING_STEP: &str = "shell = '''echo \"$WAYMARK_ATTEMPT\" >> mid.att; if [ -e release ]; then echo x >> mid.fx; \
     exit 0; fi; trap 'echo got >> mid.sig' INT TERM; echo $$ >> pids; sleep 300 & echo $! >> pids; \
     echo ready > ready; while :; do sleep 0.05; done'''\nkill_grace = '1h'";

/// Run [`TRAPPING_STEP`], send `first` to the runner once `mid` is ready and `second` once `mid`
/// reported the forwarded signal; how the runner ended.
fn signal_then(env: &Env, first: &str, second: &str) -> std::process::Output {
    flow(env, TRAPPING_STEP);
    let runner = env.spawn(&["run", "flow.toml"]);
    env.wait_for_lines("ready", 1);
    kill(runner.id(), first);
    env.wait_for_lines("mid.sig", 1);
    kill(runner.id(), second);
    finish(runner)
}

#[test]
fn a_second_signal_kills_at_once_and_the_run_resumes() {
    // The second signal is sent once the first was forwarded (the step reported it); a second
    // signal delivered before the runner handled the first is tests/signal_delivery.rs's case.
    for (signal, code) in rounds() {
        // The second is SIGINT after either: a second signal of any kind kills, and the run's
        // exit code is the first's.
        let context = format!("SIG{signal}, then SIGINT");
        let env = Env::new();
        let _sweeper = Sweeper(env.mark());
        // The step survives the forwarded signal, and its grace period is long: only the
        // second signal to the runner ends it.
        let out = signal_then(&env, signal, "INT");
        let said = stderr(&out);
        assert_eq!(out.status.code(), Some(code), "{context}: {said}");
        assert!(said.contains(" waymark: got SIGINT, a second signal: killing running steps\n"), "{context}: {said}");
        assert_no_survivors(&env.mark(), &pids(&env), &context);
        assert_eq!(status(&env).expect("status")["status"], "interrupted", "{context}");

        resume_finishes(&env, 1, &context);
        assert_eq!(env.read("mid.att"), "1\n1\n", "{context}: attempt 1 ran again");
    }
}

#[test]
fn a_signal_right_after_start_leaves_a_resumable_run() {
    // The signal comes as soon as `first` started, or 0 to 120 ms after the runner was started:
    // while it opens its store, starts the run, spawns `first` or `mid`. Whatever it hit, no step
    // is left alive and the run resumes.
    let delays = iterations(12, 40);
    let mut early_deaths = 0;
    // Counts of (died of it, `first` done): how the moments spread.
    let mut outcomes = [0; 4];
    for (signal, code) in SIGNALS {
        for i in 0..delays {
            // Every other trial signals as soon as `first` has written its pid (it was just
            // spawned); the others after a spread of delays.
            let at_spawn = i % 2 == 1;
            let delay = Duration::from_micros(i as u64 * 120_000 / delays as u64 + fastrand::u64(0..5_000));
            let context = if at_spawn {
                format!("SIG{signal} as `first` started")
            } else {
                format!("SIG{signal} {delay:?} after start")
            };
            let env = Env::new();
            let _sweeper = Sweeper(env.mark());
            flow(&env, &waiting_step(signal));
            let runner = env.spawn(&["run", "flow.toml"]);
            if at_spawn {
                wait_until("`first` to start", || !pids(&env).is_empty());
            } else {
                std::thread::sleep(delay);
            }
            kill(runner.id(), signal);
            let out = finish(runner);
            let said = stderr(&out);
            // Before it holds the flow's lock the runner dies of the signal itself, which a shell
            // reports as the same 128+n; from then on (before the run exists) the run handles it.
            let died_of_it = out.status.signal() == Some(if signal == "INT" { 2 } else { 15 });
            if died_of_it {
                early_deaths += 1;
                assert!(status(&env).is_none(), "{context}: the runner died of the signal after it created the run");
            } else {
                assert_eq!(out.status.code(), Some(code), "{context}: {:?}: {said}", out.status);
            }
            assert_no_survivors(&env.mark(), &pids(&env), &context);
            // `first` ran again only if the signal cancelled it: once it succeeded, never.
            let first_done = status(&env).is_some_and(|s| s["steps"][0]["state"] == "succeeded");
            let first_before = env.count("first.fx");
            let said = resume_finishes(&env, if first_done { 1 } else { first_before + 1 }, &context);
            outcomes[usize::from(died_of_it) * 2 + usize::from(first_done)] += 1;
            if first_done {
                assert!(said.contains("first: already succeeded"), "{context}: {said}");
            }
        }
    }
    eprintln!(
        "{early_deaths} of {} early signals came before the runner listened for them; \
         [cancelled before `first` was done, after, died before, -]: {outcomes:?}",
        2 * delays
    );
}

#[test]
fn a_runner_sigkilled_during_a_cancels_grace_period_leaves_a_resumable_run() {
    for (signal, _) in rounds() {
        let context = format!("SIG{signal}, then SIGKILL during the grace period");
        let env = Env::new();
        let _sweeper = Sweeper(env.mark());
        // The step outlives the forwarded signal; the runner dies before its grace period ends.
        let _ = signal_then(&env, signal, "KILL");
        let leftover = pids(&env)[1]; // `first`, then `mid`'s shell
        assert!(common::alive(leftover), "{context}: the step outlived its runner, as a SIGKILL allows");

        let said = resume_finishes(&env, 1, &context);
        assert!(said.contains("leftover process(es)"), "{context}: the resume killed what was left: {said}");
        assert_eq!(env.read("mid.att"), "1\n1\n", "{context}: attempt 1 ran again: {said}");
    }
}

/// A signal mask waymark inherits from its parent (here SIGUSR1 and SIGTERM blocked, by a
/// python3 that then execs waymark) reaches no step, whether its program is found on PATH or is
/// a `shell` step's /bin/sh, and does not keep the runner from hearing SIGTERM.
#[test]
fn a_signal_mask_the_runner_inherited_reaches_no_step_and_does_not_deafen_it() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'mask'\n[[step]]\nname = 'bare'\nrun = ['grep', '^SigBlk', '/proc/self/status']\n\
         [[step]]\nname = 'shell'\nshell = 'grep ^SigBlk /proc/self/status'\n\
         [[step]]\nname = 'wait'\nshell = 'touch started; sleep 30'\n",
    );
    let block = "import os, signal, sys\n\
                 signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGTERM})\n\
                 os.execv(sys.argv[1], sys.argv[1:])\n";
    let runner = std::process::Command::new("python3")
        .args(["-c", block])
        .arg(assert_cmd::cargo::cargo_bin("waymark"))
        .args(["run", "--quiet", "flow.toml"])
        .current_dir(env.dir.path())
        .env("WAYMARK_STATE_DIR", env.state())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("the last step started", || env.path("started").exists());
    kill(runner.id(), "TERM");
    let out = finish(runner);
    assert_eq!(out.status.code(), Some(143), "SIGTERM heard: {}", stderr(&out));
    let logs = |step: &str| env.read(&format!("state/logs/{}/{step}/attempt-1.stdout", run_id(&env)));
    let none = "SigBlk:\t0000000000000000\n";
    assert_eq!((logs("bare").as_str(), logs("shell").as_str()), (none, none));
}

/// The id of the one run in `env`'s state directory.
fn run_id(env: &Env) -> String {
    let history = env.cmd(&["history", "mask", "--json"]).output().unwrap();
    let history: Value = serde_json::from_slice(&history.stdout).unwrap();
    history[0]["id"].as_str().unwrap().to_owned()
}

/// A signal that comes while the runner sets the run up without awaiting (a resume killing what
/// its dead predecessor left running, say; here the debug build's stall hook) stops the run before
/// any step starts: it was seen only once the runtime had polled for it, after the first start.
#[test]
fn a_signal_while_the_runner_sets_the_run_up_stops_it_before_any_step_starts() {
    if !common::have_crash_hook("a_signal_while_the_runner_sets_the_run_up_stops_it_before_any_step_starts") {
        return;
    }
    let env = Env::new();
    env.write("flow.toml", "name = 'setup'\n[[step]]\nname = 'a'\nshell = 'touch ran'\n");
    let mut runner = std::process::Command::new(assert_cmd::cargo::cargo_bin("waymark"))
        .current_dir(env.dir.path())
        .env("WAYMARK_STATE_DIR", env.state())
        .env("WAYMARK_TEST_STALL_AT_START", "5000")
        .args(["run", "--progress", "plain", "flow.toml"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let seen = common::watch_stderr(&mut runner);
    wait_until("the run to start", || seen.lock().unwrap().contains(" waymark: run "));
    kill(runner.id(), "TERM");
    let out = finish(runner);
    let said = common::untimed(&seen.lock().unwrap());
    assert_eq!(out.status.code(), Some(143), "{said}");
    assert!(!env.path("ran").exists(), "{said}");
    let lines: Vec<&str> = said.lines().filter(|l| !l.starts_with("waymark: run ") && !l.starts_with("  ")).collect();
    assert_eq!(lines, ["waymark: got SIGTERM, stopping running steps (send it again to kill them)"], "{said}");
}

/// A signal heard while the run is set up, the set-up stuck in a store call (here the state
/// database's write lock held by another process, which waymark waits up to 10 s for; a
/// PostgreSQL server that stopped answering would hold it for good), stops the runner a few
/// seconds later with 128 + the signal, before any step started, rather than when the store
/// gives up, if ever.
#[test]
fn a_signal_while_the_set_up_is_stuck_on_the_store_stops_the_runner() {
    let env = Env::new();
    env.write("flow.toml", "name = 'stuck'\n[[step]]\nname = 'a'\nshell = 'touch ran'\n");
    // The state database, made by a first run.
    let out = env.cmd(&["run", "--quiet", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    std::fs::remove_file(env.path("ran")).unwrap();
    let db = env.state().join("waymark.db");
    let lock = "import sqlite3, sys, time\n\
                c = sqlite3.connect(sys.argv[1], isolation_level=None)\n\
                c.execute('BEGIN EXCLUSIVE')\nprint('locked', flush=True)\ntime.sleep(120)\n";
    let mut locker = std::process::Command::new("python3")
        .args(["-c", lock])
        .arg(&db)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(locker.stdout.take().unwrap()), &mut said).unwrap();
    assert_eq!(said, "locked\n");
    let runner = std::process::Command::new(assert_cmd::cargo::cargo_bin("waymark"))
        .current_dir(env.dir.path())
        .env("WAYMARK_STATE_DIR", env.state())
        .args(["run", "--quiet", "flow.toml"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // It has the database open once it listens for signals (it opens it right after).
    let has_db = || {
        std::fs::read_dir(format!("/proc/{}/fd", runner.id()))
            .map(|fds| fds.flatten().any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t == db)))
            .unwrap_or(false)
    };
    wait_until("the runner to open its database", has_db);
    kill(runner.id(), "TERM");
    let out = finish(runner);
    kill(locker.id(), "KILL");
    let _ = locker.wait();
    assert_eq!(
        (out.status.code(), stderr(&out).as_str()),
        (
            Some(143),
            "waymark: SIGTERM came 3s ago while the run was being set up, which has not finished (is the state \
             database answering?); stopped before any step started, and nothing is lost: run it again once the \
             database answers\n"
        )
    );
    assert!(!env.path("ran").exists());
}

/// A signal sent to the runner and its steps at once, as `systemctl stop` sends SIGTERM to every
/// process of the service and a terminal's Ctrl-C to its foreground group: steps that end of it
/// before the runner has passed the cancel on (here, for sure: the runner is stopped meanwhile),
/// one with status 0 from a TERM handler, one killed by the signal, are cancelled all the same,
/// not recorded succeeded or failed; the run is interrupted, and the next `waymark run` runs both
/// again, then the step that needs them.
#[test]
fn steps_signalled_with_their_runner_are_cancelled_whatever_they_exit_with() {
    for round in 0..iterations(3, 10) {
        let env = Env::new();
        let _sweeper = Sweeper(env.mark());
        env.write(
            "flow.toml",
            &format!(
                "name = 'sig'\nmax_parallel = 2\n{}\
                 [[step]]\nname = 'clean'\nneeds = []\n\
                 shell = '''echo x >> clean.fx; [ -e release ] && exit 0; trap 'exit 0' TERM; echo $$ >> pids; \
                 echo ready >> ready; sleep 300 & wait'''\n\
                 [[step]]\nname = 'plain'\nneeds = []\n\
                 shell = '''echo x >> plain.fx; [ -e release ] && exit 0; echo $$ >> pids; echo ready >> ready; \
                 exec sleep 300'''\n\
                 [[step]]\nname = 'after'\nneeds = ['clean', 'plain']\nshell = 'echo x >> after.fx'\n",
                env.mark_env()
            ),
        );
        let runner = env.spawn(&["run", "flow.toml"]);
        env.wait_for_lines("ready", 2);
        // The steps end of the signal before the runner gets to it, for sure: the runner is
        // stopped while it is sent to all three, and goes on once both steps have ended.
        let steps = pids(&env);
        kill(runner.id(), "STOP");
        kill(runner.id(), "TERM");
        for pid in &steps {
            kill(*pid, "TERM");
        }
        wait_until("both steps to end", || steps.iter().all(|pid| !common::alive(*pid)));
        kill(runner.id(), "CONT");
        let out = finish(runner);
        let context = format!("round {round}: {}", stderr(&out));
        assert_eq!(out.status.code(), Some(143), "{context}");
        let st = status(&env).expect("status");
        let states: Vec<&str> = (0..3).map(|i| st["steps"][i]["state"].as_str().unwrap()).collect();
        let cut_short = vec!["interrupted", "interrupted", "pending"];
        assert_eq!((st["status"].as_str(), states), (Some("interrupted"), cut_short), "{context}");
        env.write("release", "");
        let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{context}; the resume: {}", stderr(&out));
        assert_eq!((env.count("clean.fx"), env.count("plain.fx"), env.count("after.fx")), (2, 2, 1), "{context}");
        assert_no_survivors(&env.mark(), &pids(&env), &context);
    }
}
