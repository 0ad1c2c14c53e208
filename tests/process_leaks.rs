//! Process leaks: timeouts, cancels and plain exits of steps that build process trees, ignore
//! SIGTERM, orphan grandchildren, close their output early or daemonise. Afterwards no process of
//! the step is alive (found by the pids the step wrote and by a marker in its environment),
//! except where README.md documents that one survives.
//!
//! Each case runs 3 trials, 9 under `WAYMARK_LONG=1` (108 trials across the 12 cases).

mod common;

use common::{Env, Sweeper, alive, assert_no_survivors, finish, iterations, kill, stderr};

/// How a trial ends.
#[derive(Clone, Copy)]
enum End {
    /// The run ends by itself with this exit status.
    Exit(i32),
    /// Once `ready` exists, this signal goes to the runner, which exits with the status.
    Signal(&'static str, i32),
}

struct Case {
    /// The step's keys after its name.
    step: &'static str,
    end: End,
    /// What waymark's stderr must say.
    says: &'static str,
}

/// A tree: the step's shell, a child shell with two `sleep`s, and a `sleep` of its own.
const TREE: &str = "sh -c 'sleep 300 & echo $! >> pids; sleep 300 & echo $! >> pids; wait' & echo $! >> pids; \
                    sleep 300 & echo $! >> pids; until [ $(wc -l < pids) -ge 4 ]; do sleep 0.01; done; echo ready > ready; wait";

/// Run one trial of a case and check that nothing of the step outlived the run.
fn trial(case: &Case) {
    let env = Env::new();
    let _sweeper = Sweeper(env.mark());
    env.write("flow.toml", &format!("name = 'leak'\n{}[[step]]\nname = 's'\n{}\n", env.mark_env(), case.step));
    let runner = env.spawn(&["run", "flow.toml"]);
    let (out, want) = match case.end {
        End::Exit(code) => (finish(runner), code),
        End::Signal(signal, code) => {
            env.wait_for_lines("ready", 1);
            kill(runner.id(), signal);
            (finish(runner), code)
        }
    };
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(want), "{said}");
    assert!(said.contains(case.says), "stderr lacks {:?}: {said}", case.says);
    let pids: Vec<u32> = env.read("pids").lines().map(|l| l.trim().parse().unwrap()).collect();
    assert!(!pids.is_empty(), "the step wrote no pid: {said}");
    assert_no_survivors(&env.mark(), &pids, &said);
}

fn trials(case: &Case) {
    for _ in 0..iterations(3, 9) {
        trial(case);
    }
}

#[test]
fn a_timeout_kills_a_tree_with_grandchildren() {
    let step = format!("shell = '''{TREE}'''\ntimeout = 1\nkill_grace = '200ms'");
    trials(&Case { step: step.leak(), end: End::Exit(1), says: "ActionTimeout" });
}

#[test]
fn sigint_to_the_runner_kills_a_tree_with_grandchildren() {
    let step = format!("shell = '''{TREE}'''\nkill_grace = '200ms'");
    trials(&Case { step: step.leak(), end: End::Signal("INT", 130), says: "" });
}

#[test]
fn sigterm_to_the_runner_kills_a_tree_with_grandchildren() {
    let step = format!("shell = '''{TREE}'''\nkill_grace = '200ms'");
    trials(&Case { step: step.leak(), end: End::Signal("TERM", 143), says: "" });
}

#[test]
fn a_tree_that_ignores_sigterm_is_killed_after_the_grace_on_timeout() {
    // `trap "" TERM` is inherited: every process of the tree ignores SIGTERM.
    let step = format!("shell = '''trap \"\" TERM; {TREE}'''\ntimeout = 1\nkill_grace = '500ms'");
    trials(&Case { step: step.leak(), end: End::Exit(1), says: "ActionTimeout" });
}

#[test]
fn a_tree_that_ignores_sigterm_is_killed_after_the_grace_on_cancel() {
    let step = format!("shell = '''trap \"\" TERM; {TREE}'''\nkill_grace = '500ms'");
    trials(&Case { step: step.leak(), end: End::Signal("TERM", 143), says: "" });
}

#[test]
fn grandchildren_orphaned_by_a_child_that_exits_are_killed() {
    // The step's shell and a child shell each leave a `sleep` behind in the group and exit.
    let step = "shell = '''sleep 300 & echo $! >> pids; sh -c 'sleep 300 & echo $! >> pids'; exit 0'''";
    trials(&Case { step, end: End::Exit(0), says: "s: succeeded" });
}

#[test]
fn grandchildren_orphaned_by_failing_attempts_are_killed() {
    let step = "shell = '''sleep 300 & echo $! >> pids; sh -c 'sleep 300 & echo $! >> pids'; exit 3'''\nretry = { attempts = 2 }";
    trials(&Case { step, end: End::Exit(1), says: "budget spent: 2 of 2 attempts" });
}

#[test]
fn a_child_that_closed_its_output_is_killed_on_timeout() {
    let step = "shell = '''exec >&- 2>&-; sleep 300 & echo $! >> pids; echo $$ >> pids; echo ready > ready; exec sleep 300'''\n\
                timeout = 1\nkill_grace = 0";
    trials(&Case { step, end: End::Exit(1), says: "ActionTimeout" });
}

#[test]
fn a_child_that_closed_its_output_is_killed_on_cancel() {
    let step =
        "shell = '''exec >&- 2>&-; sleep 300 & echo $! >> pids; echo $$ >> pids; echo ready > ready; exec sleep 300'''";
    trials(&Case { step, end: End::Signal("INT", 130), says: "" });
}

#[test]
fn a_grandchild_left_by_a_child_that_closed_its_output_is_killed_when_it_exits() {
    // The output reaches end-of-file long before the step exits; its grandchild stays in the group.
    let step = "shell = '''exec >&- 2>&-; sleep 300 & echo $! >> pids; sleep 0.2; exit 0'''";
    trials(&Case { step, end: End::Exit(0), says: "s: succeeded" });
}

/// Double fork: a subshell starts `setsid` and exits at once, so the daemon is an orphan in a
/// session of its own; its pid is written after it left the group. `REDIRECT` goes after it.
const DAEMON: &str = "( setsid sh -c 'echo $$ >> pids; exec sleep 300' REDIRECT & ); until [ -s pids ]; do sleep 0.01; done; echo ready > ready";

fn daemon(redirect: &str, then: &str, keys: &str) -> &'static str {
    format!("shell = '''{}; {then}'''\n{keys}", DAEMON.replace("REDIRECT", redirect)).leak()
}

#[test]
fn a_daemon_that_holds_the_output_is_found_and_killed_after_a_normal_exit() {
    let step = daemon("", "exit 0", "");
    trials(&Case { step, end: End::Exit(0), says: "had left its process group" });
}

#[test]
fn a_daemon_that_closed_its_output_is_killed_on_timeout() {
    let step = daemon("> /dev/null 2>&1", "exec sleep 300", "timeout = 1\nkill_grace = 0");
    trials(&Case { step, end: End::Exit(1), says: "ActionTimeout" });
}

#[test]
fn a_daemon_that_closed_its_output_is_killed_on_cancel() {
    let step = daemon("> /dev/null 2>&1", "exec sleep 300", "");
    trials(&Case { step, end: End::Signal("TERM", 143), says: "" });
}

/// README: "after a normal exit, a daemon the step started on purpose (left the group, closed its
/// output) is left running".
#[test]
fn a_daemon_that_closed_its_output_survives_a_normal_exit_as_documented() {
    for _ in 0..iterations(3, 9) {
        let env = Env::new();
        let _sweeper = Sweeper(env.mark());
        let step = daemon("> /dev/null 2>&1", "exit 0", "");
        env.write("flow.toml", &format!("name = 'leak'\n{}[[step]]\nname = 's'\n{step}\n", env.mark_env()));
        let out = finish(env.spawn(&["run", "flow.toml"]));
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let pid = common::read_pid(&env.path("pids"));
        assert!(alive(pid), "the deliberate daemon was killed: {}", stderr(&out));
        // The sweeper ends it.
    }
}

/// The same daemon beside another process of the step that left the group but holds the output
/// open: that one is found and killed (the run cannot end while it holds the output), and the
/// daemon, which holds nothing of the step's, is still left running.
#[test]
fn a_daemon_that_closed_its_output_survives_beside_an_escaped_process_that_holds_it() {
    for _ in 0..iterations(2, 6) {
        let env = Env::new();
        let _sweeper = Sweeper(env.mark());
        let step = "shell = \'\'\'( setsid sh -c 'echo $$ > daemon; exec sleep 300' > /dev/null 2>&1 & ); \
                    ( setsid sh -c 'echo $$ > holder; exec sleep 300' & ); \
                    until [ -s daemon ] && [ -s holder ]; do sleep 0.01; done; exit 0\'\'\'";
        env.write("flow.toml", &format!("name = 'leak'\n{}[[step]]\nname = 's'\n{step}\n", env.mark_env()));
        let out = finish(env.spawn(&["run", "flow.toml"]));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(0), "{err}");
        assert!(err.contains("killed 1 process(es) of this attempt that had left its process group"), "{err}");
        let (daemon, holder) = (common::read_pid(&env.path("daemon")), common::read_pid(&env.path("holder")));
        common::wait_until("the holder to be gone", || !alive(holder));
        assert!(alive(daemon), "the deliberate daemon was killed: {err}");
        // The sweeper ends it.
    }
}

/// README: a process that both leaves the group and clears its environment cannot be found, and
/// waymark stops waiting for the output it holds open after about 5 seconds, with a warning.
#[test]
fn an_escaped_process_without_the_marker_does_not_hold_the_run_forever() {
    for _ in 0..iterations(1, 4) {
        let env = Env::new();
        let step = "shell = '''( setsid env -i sh -c 'echo $$ >> pids; exec sleep 300' & ); until [ -s pids ]; do sleep 0.01; done; exit 0'''";
        env.write("flow.toml", &format!("name = 'leak'\n{}[[step]]\nname = 's'\n{step}\n", env.mark_env()));
        let out = finish(env.spawn(&["run", "flow.toml"]));
        let pid = common::read_pid(&env.path("pids"));
        let survived = alive(pid);
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert!(stderr(&out).contains("still holds this attempt's output open"), "{}", stderr(&out));
        assert!(survived, "the unfindable process was found after all: update README.md");
    }
}

/// A resume kills everything its dead predecessor left running, however many steps were under
/// way (all of them at once, one look through `/proc` a round), with one warning per step, and
/// then runs them again.
#[test]
fn a_resume_kills_what_every_step_left_running_and_runs_them_again() {
    let env = Env::new();
    let _sweeper = common::Sweeper(env.mark());
    let steps = 40;
    let mut text = format!("max_parallel = {steps}\n");
    for i in 0..steps {
        text.push_str(&format!(
            "[[step]]\nname = 's{i}'\nneeds = []\nshell = '[ -e go ] && exit 0; sleep 300 & echo $! >> pids; echo $$ >> pids; wait'\n"
        ));
    }
    env.write("flow.toml", &text);
    let first = env.spawn(&["run", "flow.toml"]);
    env.wait_for_lines("pids", 2 * steps);
    common::kill(first.id(), "KILL");
    common::finish(first);
    env.write("go", "");
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    let said = common::untimed(&stderr(&out));
    assert_eq!(out.status.code(), Some(0), "{said}");
    let mut killed: Vec<String> = said.lines().filter(|l| l.contains("leftover")).map(str::to_owned).collect();
    killed.sort();
    let mut expected: Vec<String> = (0..steps)
        .map(|i| format!("waymark: warning: s{i}: killed 2 leftover process(es) of attempt 1 from the previous runner"))
        .collect();
    expected.sort();
    assert_eq!(killed, expected);
    let pids: Vec<u32> = env.read("pids").lines().map(|l| l.trim().parse().unwrap()).collect();
    common::assert_no_survivors(&env.mark(), &pids, &said);
}

/// An escaped process that keeps forking escaped children (`while :; do setsid cmd & done`): the
/// ones it made between waymark's look at `/proc` and its kill are found by the next look, and
/// killed too, on a timeout as on a cancel.
#[test]
fn an_escaped_loop_that_keeps_forking_is_killed_with_all_it_made() {
    let spawner = "( setsid sh -c 'echo $$ >> pids; while :; do setsid sleep 300 > /dev/null 2>&1 & sleep 0.005; done' \
                   > /dev/null 2>&1 & ); until [ -s pids ]; do sleep 0.01; done; sleep 0.3; echo ready > ready; exec sleep 300";
    let timed_out: &'static str = format!("shell = '''{spawner}'''\ntimeout = 1\nkill_grace = 0").leak();
    trials(&Case { step: timed_out, end: End::Exit(1), says: "had left its process group" });
    let cancelled: &'static str = format!("shell = '''{spawner}'''").leak();
    trials(&Case { step: cancelled, end: End::Signal("TERM", 143), says: "had left its process group" });
}

/// A step that runs waymark itself (a nested run), killed at its timeout by SIGKILL: the
/// nested runner dies with it and cannot stop its own steps, which are in groups of their own.
/// They carry the outer attempt's id (`WAYMARK_OUTER_ATTEMPT_IDS`), so the outer runner finds
/// and kills them as processes of its attempt that left its group.
#[test]
fn the_steps_of_a_nested_run_are_killed_with_the_step_that_started_it() {
    let env = Env::new();
    let _sweeper = Sweeper(env.mark());
    // The outer step times out: its group (the nested runner) gets SIGKILL and nothing else.
    let said = nested_timeout(
        &env,
        "shell = 'sleep 300 & echo $! >> pids; echo ready > ready; wait'",
        "timeout = '10s'\nkill_signal = 'SIGKILL'\nkill_grace = 0",
    );
    assert!(said.contains("process(es) of this attempt that had left its process group"), "{said}");
    let pids: Vec<u32> = env.read("pids").lines().map(|l| l.trim().parse().unwrap()).collect();
    assert_no_survivors(&env.mark(), &pids, &said);
}

/// A daemon the attempt started (`setsid`: out of its group) gets the timeout's `kill_signal` with
/// the group, and the grace to clean up in: its handler runs, and the attempt ends when it has.
/// One that ignores the signal is killed at the grace's end, as a member of the group would be.
#[test]
fn a_daemon_gets_the_stop_signal_and_the_grace_with_the_group() {
    for (trap, grace, cleaned) in [("echo done > cleaned; exit 0", "30s", true), ("", "1s", false)] {
        let env = Env::new();
        let _sweeper = Sweeper(env.mark());
        let step = format!(
            "shell = '''( setsid sh -c 'echo $$ >> pids; trap \"{trap}\" TERM; while :; do sleep 0.05; done' \
             > /dev/null 2>&1 & ); until [ -s pids ]; do sleep 0.01; done; exec sleep 300'''\n\
             timeout = 1\nkill_grace = '{grace}'\n"
        );
        env.write("flow.toml", &format!("name = 'leak'\n{}[[step]]\nname = 's'\n{step}", env.mark_env()));
        let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
        let said = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{said}");
        assert!(said.contains("ActionTimeout"), "{said}");
        assert_eq!(env.path("cleaned").exists(), cleaned, "the daemon's handler ran ({trap:?}): {said}");
        let status = env.cmd(&["status", "--json", "--attempts"]).output().unwrap();
        let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
        assert_eq!(status["steps"][0]["attempts"][0]["killed_after_grace"], !cleaned, "{status}");
        let pids: Vec<u32> = env.read("pids").lines().map(|l| l.trim().parse().unwrap()).collect();
        assert_no_survivors(&env.mark(), &pids, &said);
    }
}

/// The steps of a nested run, stopped with a grace at the outer step's timeout, get the signal
/// once: from their runner, which passes it on. The outer runner, which finds them by the outer
/// attempt's id, does not send it to them too (twice, a nested waymark would take it for a second
/// signal, which kills at once; many programs force-quit on a second SIGTERM).
#[test]
fn the_steps_of_a_nested_run_get_a_grace_stop_s_signal_once() {
    let env = Env::new();
    let _sweeper = Sweeper(env.mark());
    // Counts every SIGTERM delivered (a byte each through Python's wakeup fd) for 1 s after the first.
    env.write("count_term.py", COUNT_TERM);
    let said = nested_timeout(
        &env,
        "kill_grace = '30s'\nrun = ['python3', 'count_term.py']",
        "timeout = '2s'\nkill_grace = '30s'",
    );
    assert_eq!(env.read("deliveries"), "1\n", "{said}");
}

/// Run a flow whose step `nest` (with `outer` keys) runs waymark on a flow of one step `deep` (with
/// `inner` keys), which writes `ready` once it runs, until `nest` times out; what the outer runner said.
fn nested_timeout(env: &Env, inner: &str, outer: &str) -> String {
    let waymark = assert_cmd::cargo::cargo_bin("waymark");
    env.write("inner.toml", &format!("name = 'inner'\n[[step]]\nname = 'deep'\n{inner}\n"));
    env.write(
        "flow.toml",
        &format!(
            "name = 'outer'\n{}[[step]]\nname = 'nest'\n{outer}\n\
             run = ['{}', '--state-dir', 'inner-state', 'run', '--quiet', 'inner.toml']\n",
            env.mark_env(),
            waymark.display()
        ),
    );
    let out = finish(env.spawn(&["run", "flow.toml"]));
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("nest: attempt 1/1 failed: ActionTimeout"), "{said}");
    // The nested run's step had started (within the outer step's timeout), or this proves nothing.
    assert!(env.path("ready").exists(), "the nested run's step never started: {said}");
    said
}

const COUNT_TERM: &str = "import os, signal, time
r, w = os.pipe()
os.set_blocking(r, False)
os.set_blocking(w, False)
signal.set_wakeup_fd(w)
signal.signal(signal.SIGTERM, lambda *a: None)
open('ready', 'w').close()
n, first = 0, None
while first is None or time.monotonic() - first < 1.0:
    time.sleep(0.02)
    try:
        got = len(os.read(r, 100))
    except BlockingIOError:
        got = 0
    if got and first is None:
        first = time.monotonic()
    n += got
open('deliveries', 'w').write(f'{n}\\n')
";
