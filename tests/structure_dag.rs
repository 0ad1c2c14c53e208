//! Dependencies, parallel steps, failure modes and the workflow deadline, end to end with real
//! processes: steps overlap up to `max_parallel` (or `--max-parallel`) and never beyond, start in
//! file order, wait for their `needs`; the wait for a slot counts against a step's timeout; after a
//! failure for good running steps finish (or, with `fail_fast`, are cancelled and their process
//! groups killed) and the rest is skipped; the deadline stops running attempts, counts across
//! runners and anew for `waymark resume`; a kill -9 with steps in parallel resumes with every
//! finished side effect once; a database held locked by another process does not hold up a
//! timeout.
//!
//! The steps record what they do as lines in a file (`events`) and wait for each other through
//! files, the state database or `waymark status`, never for a fixed time: each wait is bounded
//! (about 40 s), after which the step fails naming what it waited for.

mod common;

use common::{Env, Sweeper, alive, assert_no_survivors, finish, kill, wait_until};
use serde_json::Value;
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, SystemTime};

/// What waymark wrote on stderr: its lines without their times (nor the date line), with pids and
/// durations normalised.
fn stderr(out: &std::process::Output) -> String {
    common::normalise_plain(&common::untimed(&common::stderr(out)))
}

/// Sourced by every step (`. ./lib.sh`).
const LIB: &str = r#"
# mark WHAT: one line `WHAT STEP ATTEMPT` in `events`, in one write, so lines of steps that run at
# once never mix.
mark() { echo "$1 $WAYMARK_STEP $WAYMARK_ATTEMPT" >> events; }
# count WHAT: how many lines of `events` begin with WHAT.
count() { grep -c "^$1 " events || true; }
# await CONDITION: poll the shell condition until it holds; after about 40 s, fail naming it.
await() {
    n=0
    until eval "$1"; do
        n=$((n + 1))
        if [ $n -ge 4000 ]; then echo "gave up waiting for: $1" >&2; exit 99; fi
        sleep 0.01
    done
}
"#;

/// A test's directory with `lib.sh` and an empty `events`.
fn setup() -> Env {
    let env = Env::new();
    env.write("lib.sh", LIB);
    env.write("events", "");
    env
}

/// The lines of `events` as (what, step, attempt).
fn events(env: &Env) -> Vec<(String, String, u32)> {
    env.read("events")
        .lines()
        .map(|line| {
            let mut words = line.split(' ');
            let (what, step, attempt) = (words.next(), words.next(), words.next());
            (what.unwrap().to_owned(), step.unwrap().to_owned(), attempt.unwrap().parse().unwrap())
        })
        .collect()
}

/// How many `what` lines `step` wrote.
fn times(env: &Env, what: &str, step: &str) -> usize {
    events(env).iter().filter(|(w, s, _)| w == what && s == step).count()
}

/// Where the first `what` line of `step` is in `events`.
fn at(env: &Env, what: &str, step: &str) -> usize {
    let found = events(env).iter().position(|(w, s, _)| w == what && s == step);
    found.unwrap_or_else(|| panic!("no `{what} {step}` in events:\n{}", env.read("events")))
}

/// The most steps that ran at once by their `start` and `end` lines. A step writes `end` before it
/// exits and waymark starts another only after that: this is never more than what waymark ran.
fn max_overlap(env: &Env) -> usize {
    let (mut now, mut most) = (0usize, 0usize);
    for (what, _, _) in events(env) {
        match what.as_str() {
            "start" => now += 1,
            "end" => now -= 1,
            _ => {}
        }
        most = most.max(now);
    }
    most
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn json_of(env: &Env, args: &[&str]) -> Value {
    let out = env.cmd(args).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The newest run's id.
fn run_id(env: &Env) -> String {
    json_of(env, &["history", "--json"])[0]["id"].as_str().unwrap().to_owned()
}

/// `status --json` of run `id`, its steps as (name, state, attempts used).
fn states(env: &Env, id: &str) -> Vec<(String, String, u64)> {
    let status = json_of(env, &["status", id, "--json"]);
    let steps = status["steps"].as_array().unwrap();
    steps
        .iter()
        .map(|s| {
            let (name, state) = (s["step"].as_str().unwrap(), s["state"].as_str().unwrap());
            (name.to_owned(), state.to_owned(), s["attempts_used"].as_u64().unwrap())
        })
        .collect()
}

fn expect(steps: &[(&str, &str, u64)]) -> Vec<(String, String, u64)> {
    steps.iter().map(|(n, s, a)| ((*n).to_owned(), (*s).to_owned(), *a)).collect()
}

/// The class of the last error of `step` in run `id`.
fn last_error(env: &Env, id: &str, step: &str) -> String {
    let status = json_of(env, &["status", id, "--json"]);
    let found = status["steps"].as_array().unwrap().iter().find(|s| s["step"] == step).cloned();
    found.unwrap()["last_error"]["class"].as_str().unwrap_or("none").to_owned()
}

/// What the state database recorded: each attempt's (step, attempt, outcome), in the order they
/// were issued.
fn attempts(env: &Env) -> Vec<(String, u32, String)> {
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY;
    let db = rusqlite::Connection::open_with_flags(env.state().join("waymark.db"), flags).unwrap();
    let mut stmt = db.prepare("SELECT step, attempt, outcome FROM attempts ORDER BY row").unwrap();
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).unwrap();
    rows.map(Result::unwrap).collect()
}

/// The pids a step wrote, one a line, to `file`.
fn pids(env: &Env, file: &str) -> Vec<u32> {
    env.read(file).lines().map(|l| l.trim().parse().unwrap()).collect()
}

/// A shell step that builds a process tree in its group (a child shell with a `sleep`, and a
/// `sleep` of its own), writes the three pids to `pids`, touches `ready`, and waits; with the file
/// `go` present it just succeeds.
const TREE: &str = ". ./lib.sh\nmark start\n[ -e go ] && { mark end; exit 0; }\n\
    sh -c 'sleep 300 & echo $! >> pids; wait' & echo $! >> pids\nsleep 300 & echo $! >> pids\n\
    await '[ $(wc -l < pids) -ge 3 ]'\ntouch ready\nwait";

/// Six roots, named so that file order is not alphabetical.
const ROOTS: [&str; 6] = ["f", "b", "d", "a", "e", "c"];

/// Six roots in a flow with `max_parallel = 2`, each holding its slot until as many steps run as
/// `LIMIT` (from the environment) says, or all have started: they overlap as far as waymark lets
/// them, however slow the machine; a short hold after that lets a step started beyond the limit
/// be seen running beside them.
fn run_roots(args: &[&str], limit: usize) -> Env {
    let env = setup();
    env.write(
        "par.sh",
        ". ./lib.sh\nmark start\n\
         await '[ $(( $(count start) - $(count end) )) -ge $LIMIT ] || [ $(count start) -ge 6 ]'\n\
         sleep 0.2\nmark end\n",
    );
    let mut flow = "name = 'par'\nmax_parallel = 2\n".to_owned();
    for name in ROOTS {
        flow.push_str(&format!("[[step]]\nname = '{name}'\nneeds = []\nrun = ['sh', 'par.sh']\n"));
    }
    env.write("flow.toml", &flow);
    let mut run = vec!["run", "flow.toml"];
    run.extend_from_slice(args);
    let out = env.cmd(&run).env("LIMIT", limit.to_string()).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    for name in ROOTS {
        assert_eq!((times(&env, "start", name), times(&env, "end", name)), (1, 1), "{name}");
    }
    // The attempts were issued in file order, as slots came free.
    let issued: Vec<String> = attempts(&env).into_iter().map(|(step, _, _)| step).collect();
    assert_eq!(issued, ROOTS);
    env
}

#[test]
fn parallel_steps_overlap_up_to_max_parallel_and_start_in_file_order() {
    let env = run_roots(&[], 2);
    assert_eq!(max_overlap(&env), 2, "events:\n{}", env.read("events"));
}

#[test]
fn max_parallel_on_the_command_line_overrides_the_flow() {
    let env = run_roots(&["--max-parallel", "3"], 3);
    assert_eq!(max_overlap(&env), 3, "events:\n{}", env.read("events"));
}

#[test]
fn needs_fan_out_and_in_a_root_runs_at_once_and_a_step_without_needs_follows_the_one_before() {
    let env = setup();
    // `prepare` and `side` each wait until the other has started: `side` (`needs = []`, written
    // last) runs beside the first step. The fetches wait until all three run. `report`, without
    // `needs`, follows `join`.
    let fetch = "shell = '''. ./lib.sh; mark start; await '[ $(count \"start fetch-.\") -ge 3 ]'; mark end'''";
    env.write(
        "flow.toml",
        &format!(
            "name = 'fan'\n\
             [[step]]\nname = 'prepare'\n\
             shell = '''. ./lib.sh; mark start; await \"grep -q '^start side ' events\"; mark end'''\n\
             [[step]]\nname = 'fetch-a'\nneeds = ['prepare']\n{fetch}\n\
             [[step]]\nname = 'fetch-b'\nneeds = ['prepare']\n{fetch}\n\
             [[step]]\nname = 'fetch-c'\nneeds = ['prepare']\n{fetch}\n\
             [[step]]\nname = 'join'\nneeds = ['fetch-a', 'fetch-b', 'fetch-c']\nshell = '. ./lib.sh; mark start; mark end'\n\
             [[step]]\nname = 'report'\nshell = '. ./lib.sh; mark start; mark end'\n\
             [[step]]\nname = 'side'\nneeds = []\n\
             shell = '''. ./lib.sh; mark start; await \"grep -q '^start prepare ' events\"; mark end'''\n"
        ),
    );
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let order = env.read("events");
    assert!(at(&env, "start", "side") < at(&env, "end", "prepare"), "a root runs at once:\n{order}");
    for fetch in ["fetch-a", "fetch-b", "fetch-c"] {
        assert!(at(&env, "end", "prepare") < at(&env, "start", fetch), "{fetch} after its need:\n{order}");
        assert!(at(&env, "end", fetch) < at(&env, "start", "join"), "join after {fetch}:\n{order}");
        assert_eq!(times(&env, "start", fetch), 1);
    }
    assert!(at(&env, "end", "join") < at(&env, "start", "report"), "report after the step before it:\n{order}");
    assert_eq!((times(&env, "start", "join"), times(&env, "start", "report")), (1, 1));
    let id = run_id(&env);
    let all = ["prepare", "fetch-a", "fetch-b", "fetch-c", "join", "report", "side"];
    let succeeded: Vec<(&str, &str, u64)> = all.iter().map(|s| (*s, "succeeded", 1)).collect();
    assert_eq!(states(&env, &id), expect(&succeeded));
}

#[test]
fn the_wait_for_a_slot_counts_against_the_timeout() {
    let env = setup();
    // One slot: `quick` (issued with `long`) gets it after `long`'s 2 s, past its timeout of 1 s.
    env.write(
        "flow.toml",
        "name = 'queue'\nmax_parallel = 1\n\
         [[step]]\nname = 'long'\nrun = ['sleep', '2']\n\
         [[step]]\nname = 'quick'\nneeds = []\ntimeout = 1\nrun = ['touch', 'quick-did-its-work']\n",
    );
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let id = run_id(&env);
    assert_eq!(states(&env, &id), expect(&[("long", "succeeded", 1), ("quick", "failed", 1)]));
    assert_eq!(last_error(&env, &id, "quick"), "ActionTimeout");
    assert!(
        stderr(&out).contains(
            ": ActionTimeout(BaseException): timed out after 1s before its program was started (the time an attempt \
             waits for a free slot counts against its timeout) [timeout]\n"
        ),
        "{}",
        stderr(&out)
    );
    // Its time was up before it had a slot: it was never started.
    assert!(!env.path("quick-did-its-work").exists(), "a timed-out attempt did its work");
}

/// `bad` fails for good while `slow` runs; `slow`'s first attempt fails only once `status` shows
/// that, so its retry comes after the failure; `queued` had no slot; `after` needs `slow`.
fn finish_flow() -> String {
    let bin = assert_cmd::cargo::cargo_bin("waymark");
    format!(
        "name = 'finish'\nmax_parallel = 2\nenv = {{ WAYMARK_BIN = '{}' }}\n\
         [[step]]\nname = 'bad'\nneeds = []\n\
         shell = '''. ./lib.sh; mark start; [ -e fixed ] && exit 0; await \"grep -q '^start slow 1' events\"; exit 1'''\n\
         [[step]]\nname = 'slow'\nneeds = []\nretry = {{ attempts = 2 }}\n\
         shell = '''\n. ./lib.sh\nmark start\n\
         if [ \"$WAYMARK_ATTEMPT\" = 1 ]; then\n\
           await '\"$WAYMARK_BIN\" status \"$WAYMARK_RUN_ID\" | grep -Eq \"^  bad +failed \"'\n\
           exit 3\n\
         fi\nmark end\n'''\n\
         [[step]]\nname = 'queued'\nneeds = []\nshell = '. ./lib.sh; mark start'\n\
         [[step]]\nname = 'after'\nneeds = ['slow']\nshell = '. ./lib.sh; mark start'\n",
        bin.display(),
    )
}

#[test]
fn after_a_failure_running_steps_finish_with_their_retries_and_the_rest_is_skipped_until_resume() {
    let env = setup();
    env.write("flow.toml", &finish_flow());
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("\n  step bad:\n"), "{}", stderr(&out));
    let id = run_id(&env);
    // `slow` got its retry after `bad` failed, and succeeded; nothing new started.
    assert_eq!((times(&env, "start", "slow"), times(&env, "end", "slow")), (2, 1));
    assert_eq!((times(&env, "start", "queued"), times(&env, "start", "after")), (0, 0));
    assert_eq!(
        states(&env, &id),
        expect(&[("bad", "failed", 1), ("slow", "succeeded", 2), ("queued", "skipped", 0), ("after", "skipped", 0)])
    );
    let status = env.cmd(&["status", &id]).output().unwrap();
    let text = stdout(&status);
    for step in ["queued", "after"] {
        assert!(text.contains(&format!("\n  {step:<20} skipped    attempts 0/1\n")), "{text}");
    }

    // `waymark resume` reopens the failed step and the skipped ones; `slow` stays done.
    env.write("fixed", "");
    let out = env.cmd(&["resume", &id]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        states(&env, &id),
        expect(&[
            ("bad", "succeeded", 2),
            ("slow", "succeeded", 2),
            ("queued", "succeeded", 1),
            ("after", "succeeded", 1)
        ])
    );
    assert_eq!((times(&env, "start", "queued"), times(&env, "start", "after")), (1, 1));
    assert_eq!(times(&env, "start", "slow"), 2);
}

#[test]
fn a_step_running_when_its_runner_died_after_a_failure_finishes_on_resume() {
    if !common::have_crash_hook("a_step_running_when_its_runner_died_after_a_failure_finishes_on_resume") {
        return;
    }
    let env = setup();
    let _sweeper = Sweeper(env.mark());
    // The runner SIGKILLs itself right after committing `bad`'s failure, while `slow` runs (until
    // it is killed, unless it ran before: then it finishes).
    env.write(
        "flow.toml",
        &format!(
            "name = 'died'\n{}\
             [[step]]\nname = 'bad'\nneeds = []\n\
             shell = '''. ./lib.sh; mark start; await \"grep -q '^start slow ' events\"; exit 1'''\n\
             [[step]]\nname = 'slow'\nneeds = []\n\
             shell = '''. ./lib.sh; mark start; [ $(count \"start slow\") -ge 2 ] || await '[ -e never ]'; mark end'''\n\
             [[step]]\nname = 'after'\nneeds = ['slow']\nshell = '. ./lib.sh; mark start'\n",
            env.mark_env()
        ),
    );
    let out = env.cmd(&["run", "flow.toml"]).env("WAYMARK_TEST_CRASH_AFTER", "bad").output().unwrap();
    assert_eq!(out.status.signal(), Some(9), "{}", stderr(&out));
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("waymark: slow: attempt 1/1 started (pid PID, redelivered)\n"), "{said}");
    assert!(said.contains("\n  step bad:\n"), "{said}");
    // `slow` was running, so it finishes; nothing new starts.
    assert_eq!((times(&env, "start", "slow"), times(&env, "end", "slow")), (2, 1));
    assert_eq!(times(&env, "start", "after"), 0);
    let id = run_id(&env);
    assert_eq!(states(&env, &id), expect(&[("bad", "failed", 1), ("slow", "succeeded", 1), ("after", "skipped", 0)]));
    assert_no_survivors(&env.mark(), &[], &said);
}

#[test]
fn fail_fast_cancels_running_attempts_kills_their_groups_and_resume_runs_them_again() {
    let env = setup();
    let _sweeper = Sweeper(env.mark());
    env.write(
        "flow.toml",
        &format!(
            "name = 'ff'\nfail_fast = true\nmax_parallel = 2\n{}\
             [[step]]\nname = 'bad'\nneeds = []\n\
             shell = '''. ./lib.sh; mark start; [ -e go ] && exit 0; await '[ -e ready ]'; exit 1'''\n\
             [[step]]\nname = 'victim'\nneeds = []\nshell = '''{TREE}'''\n\
             [[step]]\nname = 'later'\nneeds = []\nshell = '. ./lib.sh; mark start'\n",
            env.mark_env()
        ),
    );
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("\n  step bad:\n"), "{}", stderr(&out));
    let tree = pids(&env, "pids");
    assert_eq!(tree.len(), 3, "the victim's tree was running");
    assert_no_survivors(&env.mark(), &tree, &stderr(&out));
    let id = run_id(&env);
    // Cancelled as a signal cancels: recorded, not counted, the step pending; `later` skipped.
    let recorded: Vec<(String, u32, String)> = attempts(&env).into_iter().filter(|a| a.0 == "victim").collect();
    assert_eq!(recorded, [("victim".to_owned(), 1, "cancelled".to_owned())]);
    assert_eq!(states(&env, &id), expect(&[("bad", "failed", 1), ("victim", "pending", 0), ("later", "skipped", 0)]));
    assert_eq!(times(&env, "start", "later"), 0);

    // Resumed, the cancelled attempt runs again under its number, and `later` runs.
    env.write("go", "");
    let out = env.cmd(&["resume", &id]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let victim: Vec<u32> =
        events(&env).into_iter().filter(|e| e.0 == "start" && e.1 == "victim").map(|e| e.2).collect();
    assert_eq!(victim, [1, 1]);
    assert_eq!(times(&env, "start", "later"), 1);
    assert_eq!(
        states(&env, &id),
        expect(&[("bad", "succeeded", 2), ("victim", "succeeded", 1), ("later", "succeeded", 1)])
    );
}

/// A flow with a deadline of `timeout` seconds: `hang` builds a [`TREE`] (or, with `go`,
/// succeeds), and `other` follows it.
fn deadline_flow(env: &Env, timeout: u32) -> String {
    format!(
        "name = 'deadline'\ntimeout = {timeout}\n{}\
         [[step]]\nname = 'hang'\nkill_grace = '200ms'\nshell = '''{TREE}'''\n\
         [[step]]\nname = 'other'\nshell = '. ./lib.sh; mark start'\n",
        env.mark_env()
    )
}

#[test]
fn the_workflow_deadline_stops_running_attempts_skips_the_rest_and_resume_counts_anew() {
    let env = setup();
    let _sweeper = Sweeper(env.mark());
    env.write("flow.toml", &deadline_flow(&env, 4));
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(env.path("ready").exists(), "hang ran when the deadline passed: {}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains("\n  step hang:\n")
            && said.contains(": WorkflowTimeout(BaseException): the workflow's timeout of 4s passed [timeout]\n"),
        "{said}"
    );
    assert_no_survivors(&env.mark(), &pids(&env, "pids"), &said);
    let id = run_id(&env);
    let status = json_of(&env, &["status", &id, "--json"]);
    assert_eq!((status["status"].as_str(), status["failed_step"].as_str()), (Some("failed"), Some("hang")));
    assert_eq!(states(&env, &id), expect(&[("hang", "failed", 1), ("other", "skipped", 0)]));
    assert_eq!(last_error(&env, &id, "hang"), "WorkflowTimeout");
    let text = stdout(&env.cmd(&["status", &id]).output().unwrap());
    assert!(text.contains("last error: WorkflowTimeout(BaseException): the workflow's timeout of 4s passed"), "{text}");
    assert!(text.contains(&format!("\n  {:<20} skipped    attempts 0/1\n", "other")), "{text}");
    // A step that failed of the deadline says so in its last error, not in a line of its own.
    assert!(!text.contains("the run failed on it"), "{text}");

    // `waymark resume` of the failed run: the deadline counts anew from now. The old one has
    // passed, yet `hang` runs again, and the new one stops it.
    std::fs::remove_file(env.path("pids")).unwrap();
    let out = env.cmd(&["resume", &id]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(times(&env, "start", "hang"), 2);
    assert!(stderr(&out).contains("WorkflowTimeout"), "{}", stderr(&out));
    assert_no_survivors(&env.mark(), &pids(&env, "pids"), &stderr(&out));
    // Once `hang` can succeed, the skipped step runs too.
    env.write("go", "");
    let out = env.cmd(&["resume", &id]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(states(&env, &id), expect(&[("hang", "succeeded", 3), ("other", "succeeded", 1)]));
    assert_eq!(times(&env, "start", "other"), 1);
}

#[test]
fn a_run_killed_and_resumed_after_its_deadline_fails_at_once_and_waymark_resume_gives_it_a_new_one() {
    let env = setup();
    let _sweeper = Sweeper(env.mark());
    env.write("flow.toml", &deadline_flow(&env, 4));
    let runner = env.spawn(&["run", "flow.toml"]);
    wait_until("hang to run", || env.path("ready").exists());
    kill(runner.id(), "KILL");
    let out = finish(runner);
    assert_eq!(out.status.signal(), Some(9), "the runner was killed before the deadline: {}", stderr(&out));
    let tree = pids(&env, "pids");
    assert!(tree.iter().all(|&p| alive(p)), "the dead runner's attempt still runs");
    // The deadline counts from the run's start, whoever runs it: wait until it has passed.
    let id = run_id(&env);
    let started = json_of(&env, &["status", &id, "--json"])["started_at"].as_str().unwrap().to_owned();
    let deadline = humantime::parse_rfc3339(&started).unwrap() + Duration::from_secs(4);
    wait_until("the deadline to pass", || SystemTime::now() > deadline + Duration::from_millis(50));
    // Before the resume, `status` says what it will do: fail the run, not run `hang` again.
    let text = stdout(&env.cmd(&["status", &id]).output().unwrap());
    assert!(
        text.contains(&format!(
            "\n  {:<20} attempt 1 did not finish: its runner died; the run fails when resumed, without running it \
             again: the workflow's `timeout` (4s) passed\n",
            ""
        )),
        "{text}"
    );

    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.starts_with(&format!("waymark: resuming run {id} of deadline: 0 of 2 steps done\n")), "{said}");
    assert!(said.contains("WorkflowTimeout(BaseException): the workflow's timeout of 4s passed [timeout]\n"), "{said}");
    // The report's logs are those of the attempt the dead runner left, which did not run again
    // (it wrote nothing, so it has no log files).
    assert!(said.contains("    logs: none (attempt 1 wrote nothing to stdout or stderr)\n"), "{said}");
    // Nothing ran; the dead runner's attempt was killed.
    assert_eq!((times(&env, "start", "hang"), times(&env, "start", "other")), (1, 0));
    assert_no_survivors(&env.mark(), &tree, &said);
    let status = json_of(&env, &["status", &id, "--json"]);
    assert_eq!((status["status"].as_str(), status["failed_step"].as_str()), (Some("failed"), Some("hang")));
    assert_eq!(status["steps"][1]["state"], "skipped");
    // The dead runner's attempt was not run again: `hang` is skipped, yet the run failed on it,
    // of the deadline, and `status` says so under it, as the failure report does; the attempt it
    // made counts as used.
    assert_eq!(
        (status["steps"][0]["state"].as_str(), status["steps"][0]["attempts_used"].as_u64()),
        (Some("skipped"), Some(1))
    );
    assert_eq!(status["steps"][0]["run_failed_with"]["class"], "WorkflowTimeout");
    assert_eq!(status["steps"][1]["run_failed_with"], Value::Null);
    let text = stdout(&env.cmd(&["status", &id]).output().unwrap());
    let lines: Vec<&str> = text.lines().collect();
    let hang = lines.iter().position(|l| l.starts_with("  hang ")).expect("a line for hang");
    assert_eq!(
        lines.get(hang + 1).copied(),
        Some(format!(
            "  {:<20} the run failed on it: WorkflowTimeout(BaseException): the workflow's timeout of 4s passed [timeout]",
            ""
        ))
        .as_deref(),
        "{text}"
    );

    // `waymark resume` gives the failed run a new deadline: the skipped step runs.
    env.write("go", "");
    let out = env.cmd(&["resume", &id]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!((times(&env, "start", "hang"), times(&env, "start", "other")), (2, 1));
    assert_eq!(json_of(&env, &["status", &id, "--json"])["status"], "succeeded");
}

#[test]
fn a_kill_9_while_steps_run_in_parallel_resumes_with_every_finished_side_effect_once() {
    if !common::have_crash_hook("a_kill_9_while_steps_run_in_parallel_resumes_with_every_finished_side_effect_once") {
        return;
    }
    let env = setup();
    let _sweeper = Sweeper(env.mark());
    // `left` and `right` run until they are killed, unless they ran before (redelivered);
    // `quick` succeeds while both run, and the runner SIGKILLs itself right after committing it.
    let pair = "shell = '''. ./lib.sh; mark start; echo $$ >> \"$WAYMARK_STEP.pid\"\n\
                [ $(count \"start $WAYMARK_STEP\") -ge 2 ] || await '[ -e never ]'\nmark end'''";
    env.write(
        "flow.toml",
        &format!(
            "name = 'durable'\n{}\
             [[step]]\nname = 'left'\nneeds = []\n{pair}\n\
             [[step]]\nname = 'right'\nneeds = []\n{pair}\n\
             [[step]]\nname = 'quick'\nneeds = []\n\
             shell = '''. ./lib.sh; await '[ $(count \"start left\") -ge 1 ] && [ $(count \"start right\") -ge 1 ]'; mark start'''\n\
             [[step]]\nname = 'join'\nneeds = ['left', 'right', 'quick']\nshell = '. ./lib.sh; mark start'\n",
            env.mark_env()
        ),
    );
    let out = env.cmd(&["run", "flow.toml"]).env("WAYMARK_TEST_CRASH_AFTER", "quick").output().unwrap();
    assert_eq!(out.status.signal(), Some(9), "{}", stderr(&out));
    let first: Vec<u32> = ["left.pid", "right.pid"].iter().flat_map(|f| pids(&env, f)).collect();
    assert_eq!(first.len(), 2);
    assert!(first.iter().all(|&p| alive(p)), "both attempts were in flight when the runner died");

    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    for line in [
        "waymark: resuming run ",
        "of durable: 1 of 4 steps done\n",
        "waymark: quick: already succeeded, skipped\n",
        "waymark: left: attempt 1/1 started (pid PID, redelivered)\n",
        "waymark: right: attempt 1/1 started (pid PID, redelivered)\n",
    ] {
        assert!(said.contains(line), "{line:?} not in:\n{said}");
    }
    // The first executions were killed before their attempts ran again.
    assert!(first.iter().all(|&p| !alive(p)), "{said}");
    // What finished happened once: `quick` before the kill, the others after.
    assert_eq!(times(&env, "start", "quick"), 1);
    assert_eq!((times(&env, "start", "left"), times(&env, "end", "left")), (2, 1));
    assert_eq!((times(&env, "start", "right"), times(&env, "end", "right")), (2, 1));
    assert_eq!(times(&env, "start", "join"), 1);
    assert!(
        at(&env, "end", "left") < at(&env, "start", "join") && at(&env, "end", "right") < at(&env, "start", "join")
    );
    let id = run_id(&env);
    let done =
        [("left", "succeeded", 1), ("right", "succeeded", 1), ("quick", "succeeded", 1), ("join", "succeeded", 1)];
    assert_eq!(states(&env, &id), expect(&done));
    assert_no_survivors(&env.mark(), &[], &said);
}

/// Holds the state database locked (`BEGIN EXCLUSIVE`) from the moment both other steps' pids
/// are recorded until `victim`'s process group is gone (at most 8 s, less than the runner's 10 s
/// wait for a locked database), and says what it saw in `report`: whether `victim` still ran when
/// the lock was taken, and when it saw it gone (ms since the epoch).
const HOLDER: &str = r#"
import os, sqlite3, sys, time

def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

db = sqlite3.connect(os.path.join(os.environ["WAYMARK_STATE_DIR"], "waymark.db"), timeout=30, isolation_level=None)
run = os.environ["WAYMARK_RUN_ID"]

def pid(step):
    row = db.execute(
        "SELECT pid FROM attempts WHERE run_id = ? AND step = ? AND pid IS NOT NULL", (run, step)
    ).fetchone()
    return row and row[0]

give_up = time.monotonic() + 40
while not (pid("victim") and pid("writer") and os.path.exists("victim.child")):
    if time.monotonic() > give_up:
        sys.exit("the other steps did not start")
    time.sleep(0.01)
group = [pid("victim"), int(open("victim.child").read())]
db.execute("BEGIN EXCLUSIVE")
report = ["alive when locked" if all(alive(p) for p in group) else "gone before the lock"]
open("locked", "w").close()
until = time.monotonic() + 8
while any(alive(p) for p in group) and time.monotonic() < until:
    time.sleep(0.01)
gone = not any(alive(p) for p in group)
report.append(f"gone at {int(time.time() * 1000)}" if gone else "still alive after 8 s")
with open("report", "w") as f:
    f.write("\n".join(report) + "\n")
db.execute("COMMIT")
"#;

#[test]
fn a_timeout_fires_on_time_while_the_runner_waits_for_a_locked_database() {
    let env = setup();
    let _sweeper = Sweeper(env.mark());
    env.write("holder.py", HOLDER);
    // `writer` ends once the database is locked: recording its end waits for the lock, and so
    // does the dispatcher. `victim`'s timeout passes during that wait.
    env.write(
        "flow.toml",
        &format!(
            "name = 'locked'\n{}\
             [[step]]\nname = 'holder'\nneeds = []\nrun = ['python3', 'holder.py']\n\
             [[step]]\nname = 'writer'\nneeds = []\nshell = '''. ./lib.sh; await '[ -e locked ]' '''\n\
             [[step]]\nname = 'victim'\nneeds = []\ntimeout = 4\nkill_grace = '100ms'\n\
             shell = '''sleep 300 & echo $! > victim.child; wait'''\n",
            env.mark_env()
        ),
    );
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    let report = env.read("report");
    let mut lines = report.lines();
    assert_eq!(lines.next(), Some("alive when locked"), "the lock came too late to test anything: {said}");
    let gone: u64 = match lines.next().and_then(|l| l.strip_prefix("gone at ")) {
        Some(ms) => ms.parse().unwrap(),
        None => panic!("victim's process group outlived its timeout while the database was locked: {report}\n{said}"),
    };
    // `writer`'s end was being recorded (its time is taken before the write) when `victim` was
    // killed: the dispatcher was waiting for the database, the timeout was not.
    let id = run_id(&env);
    let status = json_of(&env, &["status", &id, "--json"]);
    let ended = status["steps"][1]["ended_at"].as_str().unwrap();
    let ended = humantime::parse_rfc3339(ended).unwrap().duration_since(SystemTime::UNIX_EPOCH).unwrap();
    assert!(ended.as_millis() <= u128::from(gone), "writer ended at {ended:?}, victim gone at {gone} ms");
    // Once the lock was released, the run went on to its end.
    assert_eq!(
        states(&env, &id),
        expect(&[("holder", "succeeded", 1), ("writer", "succeeded", 1), ("victim", "failed", 1)])
    );
    assert_eq!(last_error(&env, &id, "victim"), "ActionTimeout");
    assert_no_survivors(&env.mark(), &[], &said);
}

/// A step that was ready but waiting for a slot when a signal stopped the run says, in the summary
/// table, that it runs on resume (its detail was empty).
#[test]
fn a_ready_step_still_waiting_for_a_slot_at_a_signal_says_it_runs_on_resume() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "max_parallel = 1\n[[step]]\nname = 'busy'\nneeds = []\nshell = 'echo $$ > ready; exec sleep 60'\n\
         [[step]]\nname = 'queued'\nneeds = []\nrun = ['true']\n",
    );
    let out = env.run_until("ready", "TERM");
    assert_eq!(out.status.code(), Some(143), "{}", stderr(&out));
    let err = stderr(&out);
    let table: Vec<&str> =
        err.lines().skip_while(|l| !l.starts_with("waymark: steps of run ")).skip(1).take(3).collect();
    assert_eq!(
        table,
        [
            "  STEP    STATUS       ATTEMPTS    DURATION  DETAIL",
            "  busy    interrupted       0/1    DURATION  runs again on resume",
            "  queued  not run             -           -  the run stopped before it started; runs on resume",
        ],
        "{err}"
    );
}

/// A step waiting out its backoff when `fail_fast` stops the run had run: its line and the
/// summary say that it is not run again (`stopped`), not that it was not run, and its attempt is
/// counted.
#[test]
fn a_step_waiting_for_its_retry_when_the_run_fails_is_said_not_run_again() {
    let env = setup();
    // `bad` fails only once `status` shows `retrier` waiting for its retry (its failure recorded).
    env.write(
        "flow.toml",
        &format!(
            "fail_fast = true\nenv = {{ WAYMARK_BIN = '{}' }}\n\
             [[step]]\nname = 'retrier'\nneeds = []\nshell = 'exit 1'\n\
             retry = {{ attempts = 5, backoff_seconds = 60 }}\n\
             [[step]]\nname = 'bad'\nneeds = []\n\
             shell = '''. ./lib.sh; await '\"$WAYMARK_BIN\" status \"$WAYMARK_RUN_ID\" | grep -Eq \"^  retrier +waiting \"'; exit 3'''\n",
            assert_cmd::cargo::cargo_bin("waymark").display()
        ),
    );
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let said = stderr(&out);
    let retrier: Vec<&str> = said.lines().filter(|l| l.contains("retrier")).collect();
    assert!(retrier.contains(&"waymark: retrier: not run again: the run failed first"), "{said}");
    let row = retrier.iter().find(|l| l.starts_with("  retrier ")).unwrap_or_else(|| panic!("{said}"));
    let row: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(row[..3], ["retrier", "stopped", "1/5"], "{said}");
    assert_eq!(row[4..].join(" "), "not run again: the run failed first", "{said}");
}

/// `waymark resume` of a failed run gives it a new deadline, from the reopening, and records when:
/// a runner that goes on with it after the resuming runner died counts from then too (it counted
/// from the run's start, long past, and failed the run at once without running anything); so
/// does `resume_within` (the run was abandoned as too old).
#[test]
fn a_reopened_run_keeps_its_new_deadline_when_its_runner_dies() {
    let env = setup();
    let _sweeper = Sweeper(env.mark());
    env.write(
        "flow.toml",
        "name = 'reopened'\ntimeout = 8\nresume_within = '7s'\n[[step]]\nname = 'hang'\n\
         shell = '[ -e go ] && exit 0; [ -e fail ] && exit 3; echo $$ > pid; touch ready; exec sleep 300'\n",
    );
    env.write("fail", "");
    assert_eq!(env.cmd(&["run", "flow.toml"]).output().unwrap().status.code(), Some(1));
    let id = run_id(&env);
    let started = json_of(&env, &["status", &id, "--json"])["started_at"].as_str().unwrap().to_owned();
    let deadline = humantime::parse_rfc3339(&started).unwrap() + Duration::from_secs(8);
    wait_until("the run's first deadline to pass", || SystemTime::now() > deadline + Duration::from_millis(50));
    std::fs::remove_file(env.path("fail")).unwrap();
    let runner = env.spawn(&["resume", &id]);
    wait_until("hang to run again", || env.path("ready").exists());
    kill(runner.id(), "KILL");
    finish(runner);
    let status = json_of(&env, &["status", &id, "--json"]);
    let reopened = humantime::parse_rfc3339(status["reopened_at"].as_str().unwrap()).unwrap();
    assert!(reopened > deadline, "reopened at {reopened:?}, before the first deadline");
    let text = stdout(&env.cmd(&["status", &id]).output().unwrap());
    assert!(text.contains("did not finish: its runner died; it runs again on resume\n"), "{text}");
    env.write("go", "");
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!((out.status.code(), run_id(&env)), (Some(0), id), "{}", stderr(&out));
    assert_no_survivors(&env.mark(), &[env.read("pid").trim().parse().unwrap()], &stderr(&out));
}
