//! `waymark check` of flows with the workflow structure of issue 9: the dependency structure
//! (needs per step, roots, the order steps become ready), the flow-wide settings, catch handlers
//! and compensation, asserted exactly. Flows without these keys print as before; `tests/run.rs`
//! and `tests/flow_hardening.rs` pin that output.

mod common;

use common::Env;

/// `waymark check flow.toml` with `flow` as the file: its stdout, the temp dir shown as `DIR`.
fn plan(flow: &str) -> String {
    let env = Env::new();
    env.write("flow.toml", flow);
    let path = common::path_with_stubs(env.dir.path(), &["curl", "notify"]);
    let out = env.cmd(&["check", "flow.toml"]).env("NO_COLOR", "1").env("PATH", path).output().unwrap();
    let stderr = common::stderr(&out);
    assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");
    assert_eq!(stderr, "", "no warnings expected");
    assert!(!env.state().exists(), "check runs nothing and writes no state");
    let dir = env.dir.path().canonicalize().unwrap();
    String::from_utf8(out.stdout).unwrap().replace(dir.to_str().unwrap(), "DIR")
}

const NO_TIMEOUT: &str = "     timeout:  none (an attempt may run forever)\n";
const RUNS_ONCE: &str = "     retry:    none: runs once\n";

#[test]
fn fan_out_and_fan_in_with_every_new_key() {
    let flow = r#"name = "etl"
max_parallel = 2
fail_fast = true
timeout = "1h 30m"
env_file = "conf/.env"
secret_env = ["API_TOKEN", "DB_PASSWORD"]

[params]
date = {}
region = "eu-west-1"

[hooks]
on_success = ["notify", "etl done"]
on_failure = "page-oncall \"$WAYMARK_FAILED_STEP\""
on_exit = ["rm", "-rf", "tmp"]

[[step]]
name = "fetch-a"
needs = []
run = ["curl", "-fsS", "-o", "a.json", "https://example.com/a"]
catch = [{ exception_types = ["ActionTimeout"], shell = "cp cache/a.json a.json" }]

[[step]]
name = "fetch-b"
needs = []
run = ["curl", "-fsS", "-o", "b.json", "https://example.com/b"]

[[step]]
name = "load"
needs = ["fetch-a", "fetch-b"]
shell = "python3 load.py"
compensate = "python3 unload.py"
catch = [{ exception_types = ["BadInput", "ValueError"] }]

[[step]]
name = "report"
run = ["true"]
compensate = ["rm", "-f", "report.html"]

[errors]
BadInput = ["ValueError"]
"#;
    assert_eq!(
        plan(flow),
        format!(
            "flow etl (flow.toml): 4 steps, each once the steps it needs have succeeded, at most 2 at once\n\
             \x20 timeout:      1h 30m for the whole run, then it fails with WorkflowTimeout\n\
             \x20 fail_fast:    a step that fails for good cancels the running steps\n\
             \x20 params:       date (required), region = \"eu-west-1\"\n\
             \x20 env_file:     DIR/conf/.env\n\
             \x20 secret_env:   API_TOKEN, DB_PASSWORD (shown as ***)\n\
             \x20 on_success:   notify 'etl done'\n\
             \x20 on_failure:   sh -c 'page-oncall \"$WAYMARK_FAILED_STEP\"'\n\
             \x20 on_exit:      rm -rf tmp\n\
             \x20 1. fetch-a\n\
             \x20    needs:    none: a root, ready at once\n\
             \x20    command:  curl -fsS -o a.json https://example.com/a\n\
             {NO_TIMEOUT}{RUNS_ONCE}\
             \x20    catch:    ActionTimeout -> sh -c 'cp cache/a.json a.json'\n\
             \x20 2. fetch-b\n\
             \x20    needs:    none: a root, ready at once\n\
             \x20    command:  curl -fsS -o b.json https://example.com/b\n\
             {NO_TIMEOUT}{RUNS_ONCE}\
             \x20 3. load\n\
             \x20    needs:    fetch-a, fetch-b\n\
             \x20    command:  sh -c 'python3 load.py'\n\
             {NO_TIMEOUT}{RUNS_ONCE}\
             \x20    catch:    BadInput, ValueError -> nothing: the error is swallowed\n\
             \x20    compensate: sh -c 'python3 unload.py'\n\
             \x20 4. report\n\
             \x20    needs:    load (the step before it)\n\
             \x20    command:  true\n\
             {NO_TIMEOUT}{RUNS_ONCE}\
             \x20    compensate: rm -f report.html\n\
             \x20 ready order: fetch-a, fetch-b; then load; then report\n"
        )
    );
}

/// A step may need a step written after it, and the ready order follows the needs, not the file.
#[test]
fn needs_may_point_forward_and_the_ready_order_follows_them() {
    let flow = "[[step]]\nname = 'publish'\nneeds = ['build', 'test']\nrun = ['true']\n\
                [[step]]\nname = 'build'\nneeds = []\nrun = ['true']\n\
                [[step]]\nname = 'test'\nrun = ['true']\n\
                [[step]]\nname = 'lint'\nneeds = []\nrun = ['true']\n";
    let step = |n: usize, name: &str, needs: &str| {
        format!("  {n}. {name}\n     needs:    {needs}\n     command:  true\n{NO_TIMEOUT}{RUNS_ONCE}")
    };
    assert_eq!(
        plan(flow),
        format!(
            "flow flow (flow.toml): 4 steps, each once the steps it needs have succeeded, at most 4 at once\n{}{}{}{}\
             \x20 ready order: build, lint; then test; then publish\n",
            step(1, "publish", "build, test"),
            step(2, "build", "none: a root, ready at once"),
            step(3, "test", "build (the step before it)"),
            step(4, "lint", "none: a root, ready at once"),
        )
    );
}

/// A step without `needs` written after a step that needs it would close a cycle: `check`
/// refuses it and says why.
#[test]
fn a_step_without_needs_after_one_that_needs_it_is_a_cycle() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "[[step]]\nname = 'publish'\nneeds = ['build']\nrun = ['true']\n[[step]]\nname = 'build'\nrun = ['true']\n",
    );
    let out = env.cmd(&["check", "flow.toml"]).env("NO_COLOR", "1").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(
        common::stderr(&out)
            .starts_with("error: `step[0].needs[0]`: steps need each other in a cycle: build -> publish -> build\n"),
        "{}",
        common::stderr(&out)
    );
}

/// Without `needs` the header still says "run in order"; the new settings are listed, and a
/// `max_parallel` that cannot matter says why.
#[test]
fn settings_without_needs_keep_the_plan_in_order() {
    let flow = "max_parallel = 8\ntimeout = 60\n[params]\nday = 'mon'\n\
                [[step]]\nname = 'a'\nrun = ['true']\ncompensate = 'echo undo'\n\
                [[step]]\nname = 'b'\nrun = ['true']\ncatch = [{ run = ['echo', 'caught'] }]\n";
    assert_eq!(
        plan(flow),
        format!(
            "flow flow (flow.toml): 2 steps, run in order\n\
             \x20 max_parallel: 8 (no step has `needs`, so each runs after the one before it)\n\
             \x20 timeout:      1m for the whole run, then it fails with WorkflowTimeout\n\
             \x20 params:       day = \"mon\"\n\
             \x20 1. a\n     command:  true\n{NO_TIMEOUT}{RUNS_ONCE}\
             \x20    compensate: sh -c 'echo undo'\n\
             \x20 2. b\n     command:  true\n{NO_TIMEOUT}{RUNS_ONCE}\
             \x20    catch:    Exception -> echo caught\n"
        )
    );
}

/// The flags of `waymark run` for parameters and parallelism are parsed: a malformed one is a
/// usage error (exit 2) that says how to write it, and nothing runs (what they do:
/// `tests/structure_env.rs`, `tests/structure_dag.rs`).
#[test]
fn run_flags_for_params_and_parallelism_are_checked() {
    let env = Env::new();
    env.write("flow.toml", "[params]\ndate = {}\n[[step]]\nname = 'a'\nrun = ['true']\n");
    let out = env.cmd(&["run", "--param", "date", "flow.toml"]).env("NO_COLOR", "1").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        common::stderr(&out).contains("`date` is not NAME=VALUE: it has no `=`; write `--param date=VALUE`"),
        "{}",
        common::stderr(&out)
    );
    // An argument is never repeated whole: it may hold a secret (here the env file's), given
    // without its name or under a name that is none.
    env.write(".env", "API_TOKEN=s3cr3tT0ken\n");
    env.write(
        "secret.toml",
        "env_file = '.env'\nsecret_env = ['API_TOKEN']\n[params]\ndate = {}\n[[step]]\nname = 'a'\nrun = ['true']\n",
    );
    for (arg, said) in [
        (
            "s3cr3tT0ken",
            "error: an argument of `--param` does not name a parameter of the flow, and is not repeated here: it holds \
             part of the value of a variable of `secret_env`; write `--param NAME=VALUE` with one of the flow's \
             parameters (`date`); nothing ran\n",
        ),
        (
            "tok",
            "error: an argument of `--param` has no `=`: write `--param NAME=VALUE` with one of the flow's parameters: \
             `date`; nothing ran\n",
        ),
        (
            "my-tok=s3cr3tT0ken",
            "error: `my-tok=...` is not NAME=VALUE: `my-tok` is not a parameter name (ASCII letters, digits and `_`, \
             not starting with a digit); give one of the names the flow declares under `[params]`; nothing ran\n",
        ),
        (
            "=s3cr3tT0ken",
            "error: `=...` is not NAME=VALUE: the name before `=` is empty; write `--param NAME=VALUE`, e.g. \
             `--param date=2026-01-31`; nothing ran\n",
        ),
    ] {
        let out = env.cmd(&["run", "--param", arg, "secret.toml"]).env("NO_COLOR", "1").output().unwrap();
        assert_eq!((out.status.code(), common::stderr(&out).as_str()), (Some(2), said), "--param {arg}");
    }
    // A secret with an `=` of its own (base64's padding), given without its `NAME=`, would read
    // as a name: one that is part of a secret is not repeated either.
    env.write("secret2.toml", "secret_env = ['TOK']\n[params]\ndate = {}\n[[step]]\nname = 'a'\nrun = ['true']\n");
    for tok in ["c2VjcmV0X3Rva2VuXzEyMzQ=", "s3cr3t=T0ken"] {
        let out =
            env.cmd(&["run", "--param", tok, "secret2.toml"]).env("TOK", tok).env("NO_COLOR", "1").output().unwrap();
        assert_eq!(
            (out.status.code(), common::stderr(&out)),
            (
                Some(2),
                "error: an argument of `--param` does not name a parameter of the flow, and is not repeated here: it \
                 holds part of the value of a variable of `secret_env`; write `--param NAME=VALUE` with one of the \
                 flow's parameters (`date`); nothing ran\n"
                    .to_owned()
            ),
            "{tok}"
        );
    }
    let out = env.cmd(&["run", "--max-parallel", "0", "flow.toml"]).env("NO_COLOR", "1").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(common::stderr(&out).contains("0 is not in 1..=10000"), "{}", common::stderr(&out));
    assert!(!env.path("state").join("waymark.db").exists(), "nothing ran");
    env.cmd(&["run", "-q", "--max-parallel", "2", "--param", "date=2026-01-31", "flow.toml"]).assert().success();
}

/// Every key of the workflow structure that `check` shows, `run` acts on: nothing is refused any
/// more as "read but not acted on".
#[test]
fn run_acts_on_every_key_it_checks() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "[hooks]\non_exit = ['touch', 'hooked']\n[[step]]\nname = 'a'\nneeds = []\nrun = ['touch', 'ran']\n\
         compensate = 'true'\n",
    );
    env.cmd(&["run", "--quiet", "flow.toml"]).assert().success();
    assert!(env.path("ran").exists() && env.path("hooked").exists());
}

#[test]
fn explain_gives_each_steps_schedule_errors_and_worst_case() {
    let env = Env::new();
    env.write(
        "flow.toml",
        r#"timeout = "1h"
[exit_codes]
75 = "TimeoutError"

[[step]]
name = "fetch"
run = ["true"]
timeout = "30s"
retry = { attempts = 5, exception_types = ["ConnectionError", "TimeoutError"], backoff_seconds = 1, backoff_multiplier = 2 }

[[step]]
name = "many"
run = ["true"]
timeout = "1s"
kill_grace = 0
retry = { attempts = 101, backoff_seconds = 1, backoff_multiplier = 2, backoff_max_seconds = 60, jitter = true }

[[step]]
name = "once"
run = ["true"]
"#,
    );
    let out = env.cmd(&["check", "--explain", "flow.toml"]).env("NO_COLOR", "1").output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", common::stderr(&out));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let explained = &stdout[stdout.find("explain:\n").expect("an explain section")..];
    assert_eq!(
        explained,
        "explain:\n\
         \x20 1. fetch\n\
         \x20    schedule:   at the earliest, if each attempt fails at once: attempt 1 at the start, 2 after 1s, 3 \
         after 3s, 4 after 7s, 5 after 15s\n\
         \x20    retries:    ConnectionError and its subclasses; TimeoutError and its subclasses\n\
         \x20    not:        CalledProcessError (Exception), ActionExecutionNotStarted (Exception), ActionTimeout \
         (BaseException), ActionExecutionLost (BaseException)\n\
         \x20    worst case: 3m 35s (5 attempts of 30s plus 10s before SIGKILL, and 15s of waits)\n\
         \x20 2. many\n\
         \x20    schedule:   at the earliest, if each attempt fails at once (jitter: each wait half its nominal value \
         at the least): attempt 1 at the start, 2 after 500ms, 3 after 1s 500ms, 4 after 3s 500ms, 5 after 7s \
         500ms, 6 after 15s 500ms, …, 101 after 47m 31s 500ms\n\
         \x20    retries:    Exception and its subclasses\n\
         \x20    not:        ActionTimeout (BaseException), ActionExecutionLost (BaseException)\n\
         \x20    worst case: 1h 36m 44s (101 attempts of 1s, and 1h 35m 3s of waits); the flow's timeout ends the run \
         after 1h\n\
         \x20 3. once\n\
         \x20    schedule:   attempt 1 only\n\
         \x20    retries:    nothing: the step runs once\n\
         \x20    not:        TimeoutError (Exception), CalledProcessError (Exception), ActionExecutionNotStarted \
         (Exception), ActionTimeout (BaseException), ActionExecutionLost (BaseException)\n\
         \x20    worst case: unbounded by the step: without a `timeout` an attempt may run forever; the flow's timeout \
         ends the run after 1h, and an attempt it stops up to 10s later (`kill_grace`)\n"
    );
}

/// A flow is reviewed with `check` before it runs: a control character in it (an escape that
/// recolours, a carriage return that writes over the line) is shown as its picture, never sent
/// to the terminal, in the plan as in the diagnostics (`tests/diagnostics/exit_code_class_with_escape.toml`).
#[test]
fn control_characters_in_a_flow_are_shown_never_acted_on() {
    let flow = "[params]\nwho = \"tab\\there\"\n\n[[step]]\nname = \"a\"\nrun = [\"echo\", \"\\u001b[31mhidden\\rX\"]\n\
                retry = { exception_types = [\"ConnectionError\"] }\ncompensate = [\"echo\", \"undo\\u0007\"]\n";
    assert_eq!(
        plan(flow),
        format!(
            "flow flow (flow.toml): 1 step, run in order\n  \
         params:       who = \"tab\\there\"\n  \
         1. a\n     \
         command:  echo '␛[31mhidden␍X'\n\
         {NO_TIMEOUT}     \
         retry:    up to 101 attempts on ConnectionError\n     \
         backoff:  none: each retry starts at once\n     \
         compensate: echo 'undo␇'\n"
        )
    );
}

/// A flow file whose path holds a newline or a tab keeps each header and diagnostic on one line:
/// they are shown as their pictures in `check`'s plan and diagnostics, and in `status`.
#[test]
fn a_path_with_a_newline_is_shown_on_one_line() {
    let env = Env::new();
    std::fs::create_dir(env.path("odd\ndir\there")).unwrap();
    env.write("odd\ndir\there/f.toml", "[[step]]\nname = 'a'\nrun = ['true']\n");
    env.write("odd\ndir\there/bad.toml", "x = \n");
    let out = env.cmd(&["check", "odd\ndir\there/f.toml"]).output().unwrap();
    let plan = String::from_utf8(out.stdout).unwrap();
    assert_eq!(plan.lines().next().unwrap(), "flow f (odd␊dir␉here/f.toml): 1 step, run in order");
    let out = env.cmd(&["check", "odd\ndir\there/bad.toml"]).env("NO_COLOR", "1").output().unwrap();
    let said = common::stderr(&out);
    assert_eq!(said.lines().nth(1).unwrap(), " --> odd␊dir␉here/bad.toml:1:1");
    assert_eq!(
        said.lines().last().unwrap(),
        "error: odd␊dir␉here/bad.toml is not a valid flow (1 error); nothing was run"
    );
    let dir = env.path("").canonicalize().unwrap();
    let none = env.cmd(&["status", "odd\ndir\there/f.toml"]).output().unwrap();
    let said = common::stderr(&none);
    let no_runs = format!("error: no runs of the flow file {}/odd␊dir␉here/f.toml: ", dir.display());
    assert!(said.starts_with(&no_runs) && said.lines().count() == 1, "{said}");
    // A secret's value written in the file is warned of with the path on its line.
    env.write("odd\ndir\there/s.toml", "secret_env = ['S']\n[[step]]\nname = 'a'\nrun = ['echo', 'hunter2']\n");
    let out = env.cmd(&["run", "odd\ndir\there/s.toml"]).env("S", "hunter2").output().unwrap();
    let warning =
        common::stderr(&out).lines().find(|l| l.contains("the value of secret")).unwrap_or_default().to_owned();
    assert!(
        warning.contains("waymark: warning: odd␊dir␉here/s.toml:4: the value of secret `S`"),
        "{}",
        common::stderr(&out)
    );
    env.cmd(&["run", "--quiet", "odd\ndir\there/f.toml"]).assert().success();
    let status = env.cmd(&["status", "f"]).output().unwrap();
    let header = String::from_utf8(status.stdout).unwrap().lines().next().unwrap().to_owned();
    assert!(header.contains(&format!(" ({}/odd␊dir␉here/f.toml): succeeded", dir.display())), "{header}");
    // The notice that the file changed since an interrupted run started keeps to its line too.
    env.write(
        "odd\ndir\there/f.toml",
        "[[step]]\nname = 'a'\nshell = '[ -e go ] && exit 0; echo $$ > ready; exec sleep 300'\n",
    );
    let runner = env.spawn(&["run", "--quiet", "--fresh", "odd\ndir\there/f.toml"]);
    env.wait_for_lines("odd\ndir\there/ready", 1);
    common::kill(runner.id(), "TERM");
    common::finish(runner);
    env.write("odd\ndir\there/f.toml", "[[step]]\nname = 'a'\nshell = 'true'\n");
    env.write("odd\ndir\there/go", "");
    let out = env.cmd(&["run", "odd\ndir\there/f.toml"]).output().unwrap();
    let notice = common::stderr(&out).lines().find(|l| l.contains("changed since run")).unwrap_or_default().to_owned();
    assert!(notice.contains("waymark: odd␊dir␉here/f.toml changed since run "), "{}", common::stderr(&out));
    assert!(
        notice.ends_with("(`waymark run --fresh $'odd\\ndir\\there/f.toml'` starts over with the new one)"),
        "{notice}"
    );
}

/// The plan hides the flow's secrets as a run does: a value from the environment, and one
/// written in the file's `env` (which the loader warns of).
#[test]
fn secrets_are_hidden_in_the_plan() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "secret_env = ['TOK', 'KEY']\nenv = { KEY = \"k3y\\nin-file\" }\n[[step]]\nname = 'a'\n\
         run = ['curl', '-H', \"auth: it's-hunter2\", \"k3y\\nin-file\"]\ncompensate = ['echo', \"it's-hunter2\"]\n",
    );
    // Hidden before quoting: a `'` or a newline in a secret would be written another way.
    let out = env.cmd(&["check", "flow.toml"]).env("NO_COLOR", "1").env("TOK", "it's-hunter2").output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", common::stderr(&out));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "flow flow (flow.toml): 1 step, run in order\n  secret_env:   TOK, KEY (shown as ***)\n  1. a\n\
         \x20    command:  curl -H 'auth: ***' '***'\n"
            .to_owned()
            + NO_TIMEOUT
            + RUNS_ONCE
            + "     compensate: echo '***'\n"
    );
}

/// Wherever else the plan or the graph shows a value of the flow's, a secret is hidden too (here a
/// class name); a parameter's default holding one, which `run` refuses to take, is a warning of
/// `check`'s (an error under `--strict`).
#[test]
fn secrets_are_hidden_beyond_commands_and_a_default_holding_one_is_refused() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "secret_env = ['TOK']\n[[step]]\nname = 'a'\nrun = ['true']\n\
         retry = { attempts = 2, exception_types = ['zz9topsecret'] }\n",
    );
    let check = env.cmd(&["check", "flow.toml"]).env("NO_COLOR", "1").env("TOK", "zz9topsecret").output().unwrap();
    assert_eq!(check.status.code(), Some(0), "{}", common::stderr(&check));
    let plan = String::from_utf8(check.stdout).unwrap();
    assert!(plan.contains("\n     retry:    up to 2 attempts on ***\n"), "{plan}");
    assert!(!plan.contains("zz9"), "{plan}");
    let graph = env.cmd(&["graph", "flow.toml"]).env("TOK", "zz9topsecret").output().unwrap();
    assert_eq!(
        String::from_utf8(graph.stdout).unwrap(),
        "digraph \"flow\" {\n  rankdir=LR;\n  node [shape=box];\n  \"a\" [label=\"a\\nattempts 2, retries ***\"];\n}\n"
    );
    env.write("p.toml", "secret_env = ['TOK']\n[params]\ntok = 'zz9topsecret'\n[[step]]\nname = 'a'\nrun = ['true']\n");
    let said = "the default of parameter `tok` (`params.tok` in p.toml) holds the value of a variable of \
                `secret_env`; parameter values are recorded with the run (to resume it with them) and a secret never \
                is: let the step read the secret from its environment instead";
    let run_refuses = "; `waymark run` refuses a run that takes it (give `--param tok=...`)";
    let check = env.cmd(&["check", "p.toml"]).env("NO_COLOR", "1").env("TOK", "zz9topsecret").output().unwrap();
    assert_eq!((check.status.code(), common::stderr(&check)), (Some(0), format!("warning: {said}{run_refuses}\n")));
    assert!(!String::from_utf8_lossy(&check.stdout).contains("zz9"), "the plan hides the default");
    let strict = ["check", "--strict", "p.toml"];
    let check = env.cmd(&strict).env("NO_COLOR", "1").env("TOK", "zz9topsecret").output().unwrap();
    assert_eq!(
        (check.status.code(), common::stderr(&check)),
        (Some(2), format!("error: {said}{run_refuses} (an error under --strict)\n"))
    );
    let run = env.cmd(&["run", "p.toml"]).env("NO_COLOR", "1").env("TOK", "zz9topsecret").output().unwrap();
    assert_eq!((run.status.code(), common::stderr(&run)), (Some(2), format!("error: {said}; nothing ran\n")));
    // Given another value, the run takes that one.
    let run = env.cmd(&["run", "-q", "p.toml", "--param", "tok=x"]).env("TOK", "zz9topsecret").output().unwrap();
    assert_eq!(run.status.code(), Some(0), "{}", common::stderr(&run));
}

/// A command of several lines (a `shell` script) keeps its lines in the column of the first, for
/// a step's command, its catch handler and compensation, and a hook. An argument of a `run`
/// command with a newline in it (`python3 -c` code) is shown on one line, as bash reads it.
#[test]
fn a_command_of_several_lines_stays_in_its_column() {
    let script = "'''\necho one\necho two\n'''";
    let flow = format!(
        "name = \"lines\"\n[errors]\n\"Ошибка\" = [\"Exception\"]\n[hooks]\non_exit = {script}\n\
         [[step]]\nname = \"a\"\nshell = {script}\ncompensate = {script}\n\
         catch = [{{ exception_types = [\"Ошибка\"], shell = {script} }}]\n\
         [[step]]\nname = \"b\"\nrun = [\"python3\", \"-c\", \"import sys\\nif True:\\n    print(1)\"]\n"
    );
    assert_eq!(
        plan(&flow),
        "flow lines (flow.toml): 2 steps, run in order
  on_exit:      sh -c 'echo one
                echo two
                '
  1. a
     command:  sh -c 'echo one
               echo two
               '
     timeout:  none (an attempt may run forever)
     retry:    none: runs once
     catch:    Ошибка -> sh -c 'echo one
                         echo two
                         '
     compensate: sh -c 'echo one
                 echo two
                 '
  2. b
     command:  python3 -c $'import sys\\nif True:\\n    print(1)'
     timeout:  none (an attempt may run forever)
     retry:    none: runs once
"
    );
}
