//! Parameters, the environment, secrets and step outputs, end to end with real processes:
//! `--param` values reach steps (and only through the environment), a resumed run keeps the values
//! and the outputs it started with (after a kill -9 of its runner too), env sources take
//! precedence as documented, a bad env file stops nothing but itself, and a secret's value never
//! reaches the terminal, the logs, `status` or any file under the state directory.

mod common;

use common::{Env, SCHEMA, UNDO_SCHEMA_9};

/// What waymark wrote on stderr: its lines without their times (nor the date line), with pids and
/// durations normalised.
fn stderr(out: &std::process::Output) -> String {
    common::normalise_plain(&common::untimed(&common::stderr(out)))
}
use serde_json::{Value, json};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;

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

/// `text` with the run ids, the state directory and the attempts' durations made stable: `ID`,
/// `STATE` and `in MS`.
fn normalise(env: &Env, text: &str) -> String {
    let mut text = text.to_owned();
    for run in json_of(env, &["history", "--json"]).as_array().unwrap() {
        text = text.replace(run["id"].as_str().unwrap(), "ID");
    }
    text = text.replace(&env.state().canonicalize().unwrap().display().to_string(), "STATE");
    text = text.replace(&env.dir.path().canonicalize().unwrap().display().to_string(), "DIR");
    text = common::normalise_times(&text);
    text.lines()
        .map(|line| match line.rsplit_once(" in ") {
            Some((head, _)) if line.contains(": succeeded on attempt ") => format!("{head} in MS\n"),
            _ => format!("{line}\n"),
        })
        .collect()
}

#[test]
fn parameters_reach_steps_through_the_environment_only() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'nightly'\n[params]\ndate = {}\nregion = 'eu-west-1'\n\
         [[step]]\nname = 'show'\nshell = 'printf \"date=%s region=%s\\n\" \"$WAYMARK_PARAM_DATE\" \"$WAYMARK_PARAM_REGION\"'\n",
    );
    // A value that would run a command if it were spliced into the shell text.
    let value = "2026-01-31 $(touch pwned) `touch pwned`; touch pwned";
    let out = env.cmd(&["run", "flow.toml", "--param", &format!("date={value}")]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), format!("show | date={value} region=eu-west-1\n"));
    assert!(!env.path("pwned").exists(), "a parameter's value is never shell text");
    // `status` shows the values the run was started with, the default's too, each a shell word.
    let status = env.cmd(&["status"]).output().unwrap();
    let line = stdout(&status).lines().nth(1).unwrap_or_default().to_owned();
    assert_eq!(line, format!("  params: date='{value}' region=eu-west-1"));
    let status: Value = serde_json::from_slice(&env.cmd(&["status", "--json"]).output().unwrap().stdout).unwrap();
    assert_eq!(status["params"], json!({ "date": value, "region": "eu-west-1" }));
    // A given value wins over the default; so does an empty one.
    let out = env.cmd(&["run", "flow.toml", "--param", "date=", "--param", "region=us"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "show | date= region=us\n");
}

#[test]
fn an_undeclared_or_missing_parameter_is_exit_2_and_nothing_runs() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'nightly'\n[params]\ndate = {}\nregion = 'eu-west-1'\n[[step]]\nname = 'a'\nrun = ['touch', 'ran']\n",
    );
    let out = env.cmd(&["run", "flow.toml", "--param", "dte=2026-01-31"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "error: flow `nightly` has no parameter `dte`: did you mean `date`? Its parameters: `date`, `region`; \
         nothing ran\n"
    );
    assert!(!env.state().join("waymark.db").exists(), "refused before the state is touched");
    let out = env.cmd(&["run", "flow.toml", "--param", "region=us"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "error: flow `nightly` needs the parameter `date`, which has no default: add `--param date=VALUE`; \
         nothing ran\n"
    );
    // No run can be resumed yet: the state directory is not even created.
    assert!(!env.state().exists(), "refused before the state directory is made");
    let out = env.cmd(&["run", "flow.toml", "--param", "date=1", "--param", "date=2"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(stderr(&out), "error: `--param date` is given twice; give each parameter once; nothing ran\n");
    assert!(!env.path("ran").exists());
    assert_eq!(json_of(&env, &["history", "--json"]), json!([]), "no run was recorded");
}

/// The flow of the resume tests: `fetch-a` writes outputs (one of them from a parameter), `load`
/// records what it sees, and fails until the file `go` exists.
const RESUMED: &str = "name = 'nightly'\n[params]\ndate = {}\n\
    [[step]]\nname = 'fetch-a'\n\
    shell = 'echo x >> fetch.log; printf \"rows=42\\nday=%s\\n\" \"$WAYMARK_PARAM_DATE\" >> \"$WAYMARK_OUTPUT\"'\n\
    [[step]]\nname = 'load'\n\
    shell = 'echo \"$WAYMARK_OUTPUT_FETCH_A_ROWS $WAYMARK_OUTPUT_FETCH_A_DAY $WAYMARK_PARAM_DATE\" >> load.log; [ -e go ]'\n";

/// A value refused because it differs from the unfinished run's is shown with the run's secrets
/// hidden: the check that would refuse it as a secret comes only for a new run.
#[test]
fn a_differing_parameter_that_holds_a_secret_is_not_shown() {
    if !common::have_crash_hook("a_differing_parameter_that_holds_a_secret_is_not_shown") {
        return;
    }
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 's'\nsecret_env = ['TOK']\n[params]\np = 'x'\n[[step]]\nname = 'a'\nrun = ['true']\n",
    );
    let out = env.cmd(&["run", "flow.toml"]).env("WAYMARK_TEST_CRASH_AFTER", "a").output().unwrap();
    assert_eq!(out.status.signal(), Some(9), "{}", stderr(&out));
    // Hidden before quoting: a `'` in a secret would be written `'\''`.
    let out = env.cmd(&["run", "flow.toml", "--param", "p=hunter2's"]).env("TOK", "hunter2's").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        normalise(&env, &stderr(&out)),
        "error: run ID of flow.toml is unfinished and resumes with the values it started with (`--param p=x`), \
         but `--param p='***'` differs: run without `--param` (or with the same values) to resume it, or add \
         `--fresh` to abandon it and start a new run with the new values; nothing ran\n"
    );
}

#[test]
fn parameters_and_outputs_survive_a_kill_9_of_the_runner() {
    if !common::have_crash_hook("parameters_and_outputs_survive_a_kill_9_of_the_runner") {
        return;
    }
    let env = Env::new();
    env.write("flow.toml", RESUMED);
    env.write("go", "");
    // The runner is SIGKILLed right after `fetch-a`'s success (and its outputs) is committed.
    let out = env
        .cmd(&["run", "flow.toml", "--param", "date=2026-01-31"])
        .env("WAYMARK_TEST_CRASH_AFTER", "fetch-a")
        .output()
        .unwrap();
    assert_eq!(out.status.signal(), Some(9), "{}", stderr(&out));
    assert_eq!((env.count("fetch.log"), env.count("load.log")), (1, 0));
    let id = run_id(&env);

    // Another value for the run's parameter is refused: the run resumes with its own.
    let out = env.cmd(&["run", "flow.toml", "--param", "date=2026-02-01"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        normalise(&env, &stderr(&out)),
        "error: run ID of flow.toml is unfinished and resumes with the values it started with (`--param \
         date=2026-01-31`), but `--param date=2026-02-01` differs: run without `--param` (or with the same \
         values) to resume it, or add `--fresh` to abandon it and start a new run with the new values; nothing ran\n"
    );
    assert_eq!(env.count("load.log"), 0, "nothing ran");

    // Resumed without `--param` (the same value would do too): `load` sees the recorded outputs
    // and the value the run started with.
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        normalise(&env, &stderr(&out)),
        "waymark: resuming run ID of nightly: 1 of 2 steps done\n\
         waymark: fetch-a: already succeeded, skipped\n\
         waymark: load: started\n\
         waymark: load: attempt 1/1 started (pid PID)\n\
         waymark: load: attempt 1/1 succeeded\n\
         waymark: load: succeeded (1 attempt)\n\
         waymark: steps of run ID:\n\
         \x20 STEP     STATUS  ATTEMPTS    DURATION  DETAIL\n\
         \x20 fetch-a  ok             -           -  succeeded in an earlier runner\n\
         \x20 load     ok           1/1    DURATION\n\
         waymark: run ID succeeded in DURATION\n"
    );
    assert_eq!(env.read("load.log"), "42 2026-01-31 2026-01-31\n");
    assert_eq!(env.count("fetch.log"), 1, "a succeeded step never runs again");
    let status = json_of(&env, &["status", &id, "--json"]);
    assert_eq!(status["steps"][0]["outputs"], json!({"day": "2026-01-31", "rows": "42"}));
    assert_eq!(status["steps"][1]["outputs"], json!({}));
}

#[test]
fn waymark_resume_of_a_failed_run_keeps_its_parameters_and_outputs() {
    let env = Env::new();
    env.write("flow.toml", RESUMED);
    let out = env.cmd(&["run", "flow.toml", "--param", "date=2026-01-31"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let id = run_id(&env);
    // The flow file now declares a default: the run still has the value it started with.
    env.write("flow.toml", &RESUMED.replace("date = {}", "date = 'today'"));
    env.write("go", "");
    let out = env.cmd(&["resume", &id]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(env.read("load.log"), "42 2026-01-31 2026-01-31\n42 2026-01-31 2026-01-31\n");
    assert_eq!(env.count("fetch.log"), 1);
}

#[test]
fn later_steps_see_the_outputs_of_the_success_and_bad_lines_are_warnings() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'outs'\n\
         [[step]]\nname = 'fetch-a'\nretry = { attempts = 2 }\n\
         shell = '''\n\
         if [ \"$WAYMARK_ATTEMPT\" = 1 ]; then echo stale=first >> \"$WAYMARK_OUTPUT\"; exit 3; fi\n\
         printf 'rows=42\\nnot a pair\\n2x=3\\npath=/tmp/a b.csv\\nrows=43\\n' >> \"$WAYMARK_OUTPUT\"\n\
         '''\n\
         [[step]]\nname = 'quiet'\nrun = ['true']\n\
         [[step]]\nname = 'show'\nshell = 'env | grep ^WAYMARK_OUTPUT | sort'\n",
    );
    // The variables of another run (this runner started by one of its steps) are not this run's.
    let out = env
        .cmd(&["run", "flow.toml"])
        .env("WAYMARK_OUTPUT_OUTER_X", "outer")
        .env("WAYMARK_OUTPUT", "/outer/file")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Only the succeeded attempt's outputs count; `show` gets its own outputs file, not theirs.
    let file = |step: &str| format!("STATE/logs/ID/{step}/attempt-1.outputs");
    assert_eq!(
        normalise(&env, &stdout(&out)),
        format!(
            "show | WAYMARK_OUTPUT={}\n\
             show | WAYMARK_OUTPUT_FETCH_A_PATH=/tmp/a b.csv\n\
             show | WAYMARK_OUTPUT_FETCH_A_ROWS=43\n",
            file("show")
        )
    );
    let outputs2 = "STATE/logs/ID/fetch-a/attempt-2.outputs";
    assert_eq!(
        normalise(&env, &stderr(&out)),
        format!(
            "waymark: run ID of outs: 3 step(s)\n\
             waymark: fetch-a: started\n\
             waymark: fetch-a: attempt 1/2 started (pid PID)\n\
             waymark: fetch-a: attempt 1/2 failed: CalledProcessError: exit status 3 [exit status]\n\
             waymark: fetch-a: retry now: attempt 2/2\n\
             waymark: fetch-a: attempt 2/2 started (pid PID)\n\
             waymark: warning: fetch-a: outputs file {outputs2}: line 2 is not `key=value`; skipped (write \
             `name=value`, one per line)\n\
             waymark: warning: fetch-a: outputs file {outputs2}: line 3: `2x` is not an output name \
             ([A-Za-z_][A-Za-z0-9_]*, no spaces); skipped\n\
             waymark: fetch-a: attempt 2/2 succeeded\n\
             waymark: fetch-a: succeeded (2 attempts)\n\
             waymark: quiet: started\n\
             waymark: quiet: attempt 1/1 started (pid PID)\n\
             waymark: quiet: attempt 1/1 succeeded\n\
             waymark: quiet: succeeded (1 attempt)\n\
             waymark: show: started\n\
             waymark: show: attempt 1/1 started (pid PID)\n\
             waymark: show: attempt 1/1 succeeded\n\
             waymark: show: succeeded (1 attempt)\n\
             waymark: steps of run ID:\n\
             \x20 STEP     STATUS  ATTEMPTS    DURATION  DETAIL\n\
             \x20 fetch-a  flaky        2/2    DURATION  ok on attempt 2 after CalledProcessError\n\
             \x20 quiet    ok           1/1    DURATION\n\
             \x20 show     ok           1/1    DURATION\n\
             waymark: run ID succeeded in DURATION\n"
        )
    );
}

/// A step's outputs are seen by every attempt that starts after its success, a retry of a step
/// that was running beside it included: the runner, which makes a step's environment once for all
/// its attempts, makes it again when the outputs have changed.
#[test]
fn a_retry_sees_the_outputs_of_a_step_that_succeeded_beside_its_first_attempt() {
    let env = Env::new();
    // `marker` needs `fast`, so it starts only once `fast`'s success (and output) is recorded;
    // the first attempt of `retried` waits for it (at most a minute), then fails.
    env.write(
        "flow.toml",
        "name = 'beside'\nmax_parallel = 3\n\
         [[step]]\nname = 'retried'\nneeds = []\nretry = { attempts = 2 }\n\
         shell = '''\n\
         echo \"attempt $WAYMARK_ATTEMPT sees [${WAYMARK_OUTPUT_FAST_X-}]\" >> seen.log\n\
         if [ \"$WAYMARK_ATTEMPT\" = 1 ]; then\n\
         \x20 i=0; while [ ! -e marker ] && [ $i -lt 6000 ]; do sleep 0.01; i=$((i+1)); done; exit 3\n\
         fi\n\
         '''\n\
         [[step]]\nname = 'fast'\nneeds = []\nshell = 'echo x=1 >> \"$WAYMARK_OUTPUT\"'\n\
         [[step]]\nname = 'marker'\nneeds = ['fast']\nrun = ['touch', 'marker']\n",
    );
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let seen = std::fs::read_to_string(env.dir.path().join("seen.log")).unwrap();
    assert_eq!(seen, "attempt 1 sees []\nattempt 2 sees [1]\n");
}

#[test]
fn precedence_is_step_env_then_flow_env_then_env_file_then_inherited() {
    let env = Env::new();
    env.write("conf/.env", "# read when the run starts\nA=file\nB=file\nC=file\nexport D=\"file d\"\n");
    env.write(
        "flow.toml",
        "env_file = 'conf/.env'\nenv = { B = 'flow', C = 'flow' }\n\
         [[step]]\nname = 'show'\nenv = { C = 'step' }\n\
         shell = 'echo \"A=$A B=$B C=$C D=$D E=$E\"'\n",
    );
    let out = env
        .cmd(&["run", "flow.toml"])
        .env("A", "inherited")
        .env("B", "inherited")
        .env("C", "inherited")
        .env("D", "inherited")
        .env("E", "inherited")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "show | A=file B=flow C=step D=file d E=inherited\n");
}

#[test]
fn a_bad_env_file_is_exit_2_naming_the_file_and_line_and_nothing_runs() {
    let env = Env::new();
    env.write("flow.toml", "# the secrets\nenv_file = '.env'\n[[step]]\nname = 'a'\nrun = ['touch', 'ran']\n");
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    // The file and line of the `env_file` that names it, as the path was given.
    assert_eq!(
        normalise(&env, &stderr(&out)),
        "error: flow.toml:2: `env_file`: cannot read the env file DIR/.env: No such file or directory (os error 2); \
         nothing ran: correct the `env_file` path or make the file readable, then run again\n"
    );
    env.write(".env", "GOOD=1\nexport BROKEN LINE\nQUOTED='never closed\n");
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        normalise(&env, &stderr(&out)),
        "error: flow.toml:2: `env_file`: the env file DIR/.env cannot be read as dotenv:\n  \
         DIR/.env:2: `export BROKEN LINE` is not `KEY=value`: write `NAME=value`, or start the line with `#` to \
         make it a comment\n  \
         DIR/.env:3: the closing ' of `QUOTED`'s value is missing: add it where the value ends\n\
         nothing ran: fix the env file, then run again\n"
    );
    assert!(!env.path("ran").exists());
    assert_eq!(json_of(&env, &["history", "--json"]), json!([]), "no run was recorded");
}

/// An env file that sets a variable waymark sets for every attempt is told, as the flow's `env` is:
/// its value never reaches a step. `--strict` refuses it before anything runs.
#[test]
fn an_env_file_variable_waymark_sets_itself_is_a_warning_and_an_error_under_strict() {
    let env = Env::new();
    env.write(".env", "WAYMARK_STEP=mine\nA=1\nWAYMARK_ATTEMPT=9\n");
    env.write(
        "flow.toml",
        "env_file = '.env'\n[[step]]\nname = 'show'\nshell = 'echo \"$WAYMARK_STEP $WAYMARK_ATTEMPT $A\"'\n",
    );
    let out = env.cmd(&["run", "--strict", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let said = "flow.toml:1: `env_file`: the env file DIR/.env sets `WAYMARK_ATTEMPT`, `WAYMARK_STEP`, which waymark \
                sets for every attempt: no step sees the file's value";
    assert_eq!(
        normalise(&env, &stderr(&out)),
        format!(
            "error: {said} (an error under --strict); nothing ran: remove them from the env file, then run again\n"
        )
    );
    assert_eq!(json_of(&env, &["history", "--json"]), json!([]), "no run was recorded");
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "show | show 1 1\n");
    // Said once, before the run's own lines.
    let said_then = normalise(&env, &stderr(&out));
    let (first, rest) = said_then.split_once('\n').unwrap();
    assert_eq!(first, format!("waymark: warning: {said}; remove them from the env file"));
    assert!(rest.starts_with("waymark: run ID of flow: 1 step(s)\n") && !rest.contains("warning"), "{rest}");
}

/// `waymark resume` reads the env file the run recorded: a missing one is named with the flow
/// file whose `env_file` recorded it, and the run is left as it was.
#[test]
fn a_missing_env_file_on_resume_names_the_recorded_env_file() {
    let env = Env::new();
    env.write(".env", "A=1\n");
    env.write("flow.toml", "env_file = '.env'\n[[step]]\nname = 'a'\nshell = 'test -e ok'\n");
    assert_eq!(env.cmd(&["run", "--quiet", "flow.toml"]).output().unwrap().status.code(), Some(1));
    std::fs::remove_file(env.path(".env")).unwrap();
    let id = json_of(&env, &["history", "--json"])[0]["id"].as_str().unwrap().to_owned();
    let out = env.cmd(&["resume", &id]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        normalise(&env, &stderr(&out)),
        "error: DIR/flow.toml: `env_file` (as recorded when run ID started): cannot read the env file DIR/.env: No \
         such file or directory (os error 2); nothing ran: put a readable env file at that path, then run again to \
         resume run ID\n"
    );
}

/// `waymark run` of a flow whose interrupted run it resumes: a missing env file is named at the
/// file's `env_file` line while the file names the path the run recorded, and by the recorded
/// definition once it names another (the run resumes with the recorded one).
#[test]
fn a_missing_env_file_when_run_resumes_names_the_env_file_line_or_the_recorded_one() {
    if !common::have_crash_hook("a_missing_env_file_when_run_resumes_names_the_env_file_line_or_the_recorded_one") {
        return;
    }
    let env = Env::new();
    env.write(".env", "A=1\n");
    let flow = "name = 'nightly'\nenv_file = '.env'\n[[step]]\nname = 'a'\nrun = ['true']\n\
                [[step]]\nname = 'b'\nneeds = ['a']\nrun = ['touch', 'ran']\n";
    env.write("flow.toml", flow);
    let out = env.cmd(&["run", "flow.toml"]).env("WAYMARK_TEST_CRASH_AFTER", "a").output().unwrap();
    assert_eq!(out.status.signal(), Some(9), "{}", stderr(&out));
    std::fs::remove_file(env.path(".env")).unwrap();
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        normalise(&env, &stderr(&out)),
        "error: flow.toml:2: `env_file`: cannot read the env file DIR/.env: No such file or directory (os error 2); \
         nothing ran: put a readable env file at that path, then run again to resume run ID\n"
    );
    env.write("flow.toml", &flow.replace("'.env'", "'.env.new'"));
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        normalise(&env, &stderr(&out)),
        "error: DIR/flow.toml: `env_file` (as recorded when run ID started): cannot read the env file DIR/.env: No \
         such file or directory (os error 2); nothing ran: put a readable env file at that path, then run again to \
         resume run ID\n"
    );
    assert!(!env.path("ran").exists());
}

/// Parameter values are recorded with the run: one that holds a secret's value is refused.
#[test]
fn a_parameter_holding_a_secret_is_refused() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "secret_env = ['API_TOKEN']\n[params]\nurl = {}\n[[step]]\nname = 'a'\nrun = ['touch', 'ran']\n",
    );
    let out = env
        .cmd(&["run", "flow.toml", "--param", "url=https://me:hunter2@example.com"])
        .env("API_TOKEN", "hunter2")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "error: the value of `--param url` holds the value of a variable of `secret_env`; parameter values are \
         recorded with the run (to resume it with them) and a secret never is: let the step read the secret from \
         its environment instead; nothing ran\n"
    );
    assert!(!env.path("ran").exists());
    assert_eq!(json_of(&env, &["history", "--json"]), json!([]), "no run was recorded");
    // A default that holds it is said to be the default, where the file gives it.
    env.write(
        "flow.toml",
        "secret_env = ['API_TOKEN']\n[params]\nurl = 'https://me:hunter2@example.com'\n\
         [[step]]\nname = 'a'\nrun = ['touch', 'ran']\n",
    );
    // Under `--strict` too: the parameter's own error, not that the file holds the value.
    for args in [&["run", "flow.toml"][..], &["run", "--strict", "flow.toml"]] {
        let out = env.cmd(args).env("API_TOKEN", "hunter2").output().unwrap();
        assert_eq!(out.status.code(), Some(2));
        assert_eq!(
            stderr(&out),
            "error: the default of parameter `url` (`params.url` in flow.toml) holds the value of a variable of \
             `secret_env`; parameter values are recorded with the run (to resume it with them) and a secret never \
             is: let the step read the secret from its environment instead; nothing ran\n"
        );
    }
    assert!(!env.path("ran").exists());
}

/// A name of `secret_env` set nowhere while a close one is set (a misspelling) hides nothing: the
/// variable meant would be shown and stored as it is. `check` and `run` warn, naming both, and
/// refuse under `--strict`; an unset name with none one edit away is an optional secret, let be.
#[test]
fn a_misspelt_secret_name_is_a_warning_and_refused_under_strict() {
    let env = Env::new();
    env.write(".env", "API_TOKEN=s3cr3tT0ken\n");
    env.write(
        "flow.toml",
        "env_file = '.env'\nsecret_env = ['API_TOKNE', 'OPTIONAL_KEY']\n[[step]]\nname = 'a'\nrun = ['true']\n",
    );
    let what = "`secret_env` names `API_TOKNE`, which is set nowhere (not in waymark's environment, the env file or \
                an `env` table), so it hides nothing, while `API_TOKEN` is set: did you mean `API_TOKEN`?";
    let out = env.cmd(&["check", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(stderr(&out), format!("warning: {what} Correct the name in `secret_env`\n"));
    let out = env.cmd(&["check", "--strict", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(stderr(&out), format!("error: {what} (an error under --strict): correct the name in `secret_env`\n"));
    let out = env.cmd(&["run", "--quiet", "--strict", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        format!("error: {what} (an error under --strict); nothing ran: correct the name in `secret_env`\n")
    );
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let said: Vec<String> =
        common::untimed(&stderr(&out)).lines().filter(|l| l.contains("warning:")).map(str::to_owned).collect();
    assert_eq!(said, [format!("waymark: warning: {what} Correct the name in `secret_env`")]);
    // Spelt right, nothing is said; nor of an optional secret beside a variable of a similar name
    // (two edits away), in the env file or waymark's environment.
    env.write(".env", "API_TOKEN=s3cr3tT0ken\nDB_PATH=/var/db\n");
    env.write(
        "flow.toml",
        "env_file = '.env'\nsecret_env = ['API_TOKEN', 'DB_PASS', 'GITHUB_TOKEN']\n[[step]]\nname = 'a'\nrun = ['true']\n",
    );
    let out = env.cmd(&["check", "--strict", "flow.toml"]).env("GITLAB_TOKEN", "x").output().unwrap();
    assert_eq!((out.status.code(), stderr(&out)), (Some(0), String::new()));
}

/// A secret's value written in the flow file (here in a command, the secret coming from the
/// environment or the env file) is recorded with the flow's definition: `run` warns, naming the
/// line and the secret, and refuses under `--strict`; a value the file sets in an `env` table is
/// the loader's warning, not said twice.
#[test]
fn a_secret_written_in_a_command_is_a_warning_and_refused_under_strict() {
    let env = Env::new();
    env.write(".env", "DB_PASS=s3cret-pw\n");
    env.write(
        "flow.toml",
        "env_file = '.env'\nsecret_env = ['API_TOKEN', 'DB_PASS']\n[[step]]\nname = 'a'\n\
         shell = 'curl -H \"Authorization: Bearer tkn-8f3a9c\" http://127.0.0.1:9/ || true'\n\
         [[step]]\nname = 'b'\nrun = ['psql', '--password=s3cret-pw']\n",
    );
    let out = env.cmd(&["run", "--quiet", "--strict", "flow.toml"]).env("API_TOKEN", "tkn-8f3a9c").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "error: flow.toml:5: the value of secret `API_TOKEN` is written in the flow file, and every run records the \
         flow's definition in the state database (an error under --strict); nothing ran: let the step read it from \
         its environment (`$API_TOKEN`) instead\n"
    );
    assert_eq!(json_of(&env, &["history", "--json"]), json!([]), "no run was recorded");
    env.write(
        "flow.toml",
        "env_file = '.env'\nsecret_env = ['API_TOKEN', 'DB_PASS']\n[[step]]\nname = 'a'\n\
         shell = 'echo \"Authorization: Bearer tkn-8f3a9c\"'\n\
         [[step]]\nname = 'b'\nshell = 'echo --password=s3cret-pw'\n",
    );
    let out = env.cmd(&["run", "flow.toml"]).env("API_TOKEN", "tkn-8f3a9c").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let warning = |name: &str, line: usize| {
        format!(
            "waymark: warning: flow.toml:{line}: the value of secret `{name}` is written in the flow file, and every \
             run records the flow's definition in the state database, so it is stored there as written; let the \
             step read it from its environment (`${name}`) instead"
        )
    };
    let said: Vec<String> =
        common::untimed(&stderr(&out)).lines().filter(|l| l.contains("warning:")).map(str::to_owned).collect();
    assert_eq!(said, [warning("API_TOKEN", 5), warning("DB_PASS", 8)]);
    // What is recorded is the definition: a comment is not in it; a value written with an escape
    // is, at no line the text shows.
    env.write(
        "flow.toml",
        "# the token is tkn-8f3a9c\nsecret_env = ['API_TOKEN']\n[[step]]\nname = 'a'\nrun = ['true']\n",
    );
    let out = env
        .cmd(&["run", "--quiet", "--strict", "--fresh", "flow.toml"])
        .env("API_TOKEN", "tkn-8f3a9c")
        .output()
        .unwrap();
    assert_eq!((out.status.code(), stderr(&out)), (Some(0), String::new()));
    env.write("flow.toml", "secret_env = ['API_TOKEN']\n[[step]]\nname = 'a'\nshell = \"echo tkn-8f3\\u0061\"\n");
    let out =
        env.cmd(&["run", "--quiet", "--strict", "--fresh", "flow.toml"]).env("API_TOKEN", "tkn-8f3a").output().unwrap();
    assert_eq!(
        (out.status.code(), stderr(&out)),
        (
            Some(2),
            "error: flow.toml: the value of secret `API_TOKEN` is written in the flow file, and every run records the \
             flow's definition in the state database (an error under --strict); nothing ran: let the step read it \
             from its environment (`$API_TOKEN`) instead\n"
                .to_owned()
        )
    );
    // Paths are not looked in: the flow's own directory may hold the value (a user's name).
    env.write("alice/flow.toml", "secret_env = ['DB_USER']\n[[step]]\nname = 'a'\nrun = ['true']\nworkdir = '.'\n");
    let out = env.cmd(&["run", "--quiet", "--strict", "alice/flow.toml"]).env("DB_USER", "alice").output().unwrap();
    assert_eq!((out.status.code(), stderr(&out)), (Some(0), String::new()));
    // The line named is the one that shows the value outside a comment.
    env.write(
        "flow.toml",
        "secret_env = ['API_TOKEN']\n[[step]]\nname = 'a'\nrun = ['true']  # the old token tkn-77x9\n\
         [[step]]\nname = 'b'\nshell = 'echo tkn-77x9'\n",
    );
    let out =
        env.cmd(&["run", "--quiet", "--strict", "--fresh", "flow.toml"]).env("API_TOKEN", "tkn-77x9").output().unwrap();
    assert!(stderr(&out).starts_with("error: flow.toml:7: the value of secret `API_TOKEN`"), "{}", stderr(&out));
    // Set in an `env` table (and inherited alike): the loader's one warning, at the table.
    env.write(
        "flow.toml",
        "secret_env = ['TOKEN']\nenv = { TOKEN = 'abc123' }\n[[step]]\nname = 'a'\nrun = ['true']\n",
    );
    let out = env.cmd(&["run", "--fresh", "flow.toml"]).env("TOKEN", "abc123").output().unwrap();
    let all = stderr(&out);
    let said: Vec<&str> = all.lines().filter(|l| l.contains("is written in")).collect();
    assert_eq!(said.len(), 1, "{all}");
}

/// Every file under `dir`, recursively, as (path, bytes).
fn every_file(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(every_file(&path));
        } else {
            found.push((path.display().to_string(), std::fs::read(&path).unwrap()));
        }
    }
    found
}

fn holds(haystack: &[u8], needle: &str) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[test]
fn secrets_never_reach_the_terminal_the_logs_status_or_the_state_directory() {
    let env = Env::new();
    let (token, password) = ("hunter2-token", "pa55-word");
    env.write(".env", &format!("API_TOKEN={token}\nREGION=eu\n"));
    env.write(
        "flow.toml",
        "name = 'secretive'\nenv_file = '.env'\nsecret_env = ['API_TOKEN', 'DB_PASS', 'EMPTY_ONE']\n\
         [[step]]\nname = 'fetch'\n\
         shell = '''\n\
         printf 'token=%s' \"${API_TOKEN%-token}-\"; sleep 0.3; printf 'token region=%s\\n' \"$REGION\"\n\
         echo \"tok=$API_TOKEN\" >> \"$WAYMARK_OUTPUT\"\n\
         printf '{\"type\": \"Unused\", \"message\": \"%s\", \"escaped\": \"hunter2\\\\u002dtoken\"}' \"$API_TOKEN\" \
         > \"$WAYMARK_ERROR_FILE\"\n\
         '''\n\
         [[step]]\nname = 'load'\nretry = { attempts = 2 }\n\
         shell = '''\n\
         echo \"got $WAYMARK_OUTPUT_FETCH_TOK\"\n\
         if [ \"$WAYMARK_ATTEMPT\" = 1 ]; then\n\
           printf '{\"type\": \"PermissionError\", \"message\": \"login %s refused\"}' \"$DB_PASS\" > \"$WAYMARK_ERROR_FILE\"\n\
           exit 1\n\
         fi\n\
         echo \"unused=$API_TOKEN\" >> \"$WAYMARK_OUTPUT\"\n\
         printf 'Traceback (most recent call last):\\n  File \"load.py\", line 1, in <module>\\nValueError: bad token %s\\n' \"$API_TOKEN\" >&2\n\
         exit 1\n\
         '''\n",
    );
    let out = env.cmd(&["run", "flow.toml"]).env("DB_PASS", password).env("EMPTY_ONE", "").output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let id = run_id(&env);
    // The token was written in two pieces, 0.3 s apart: it is hidden all the same.
    assert_eq!(stdout(&out), "fetch | token=*** region=eu\nload | got ***\nload | got ***\n");
    let load = "STATE/logs/ID/load";
    assert_eq!(
        normalise(&env, &stderr(&out)),
        format!(
            "waymark: run ID of secretive: 2 step(s)\n\
             waymark: fetch: started\n\
             waymark: fetch: attempt 1/1 started (pid PID)\n\
             waymark: fetch: attempt 1/1 succeeded\n\
             waymark: fetch: succeeded (1 attempt)\n\
             waymark: load: started\n\
             waymark: load: attempt 1/2 started (pid PID)\n\
             waymark: load: attempt 1/2 failed: PermissionError: login *** refused [error file]\n\
             waymark: load: retry now: attempt 2/2\n\
             waymark: load: attempt 2/2 started (pid PID)\n\
             load | Traceback (most recent call last):\n\
             load |   File \"load.py\", line 1, in <module>\n\
             load | ValueError: bad token ***\n\
             waymark: load: attempt 2/2 failed: ValueError: bad token *** [traceback]\n\
             waymark: load: budget spent: 2 of 2 attempts\n\
             waymark: load: failed (2 attempts)\n\
             waymark: steps of run ID:\n\
             \x20 STEP   STATUS  ATTEMPTS    DURATION  DETAIL\n\
             \x20 fetch  ok           1/1    DURATION\n\
             \x20 load   failed       2/2    DURATION  ValueError: bad token ***\n\
             waymark: run ID failed\n  \
             step load:\n    \
             attempt 1: started TIME, took DURATION: PermissionError(OSError, Exception, BaseException): login *** \
             refused [error file]\n    \
             attempt 2: started TIME, took DURATION: ValueError(Exception, BaseException): bad token *** \
             [traceback]\n    \
             budget spent: 2 of 2 attempts\n    \
             stdout of attempt 2, last lines:\n      \
             got ***\n    \
             stderr of attempt 2, last lines:\n      \
             Traceback (most recent call last):\n        \
             File \"load.py\", line 1, in <module>\n      \
             ValueError: bad token ***\n    \
             logs: {load}/attempt-2.stdout\n          \
             {load}/attempt-2.stderr\n  \
             run id: ID (`waymark status ID` shows it; `waymark resume ID` runs its failed steps again with a \
             fresh budget)\n"
        )
    );
    // What `logs` and `status` show, and what waymark keeps.
    let mut shown = String::new();
    for args in [
        vec!["logs", &id, "fetch"],
        vec!["logs", &id, "load", "--attempt", "1"],
        vec!["logs", &id, "load"],
        vec!["status", &id, "--json"],
        vec!["status", &id],
        vec!["history", "--json"],
    ] {
        let out = env.cmd(&args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        shown.push_str(&stdout(&out));
        shown.push_str(&stderr(&out));
    }
    assert!(shown.contains("token=*** region=eu") && shown.contains("bad token ***"), "{shown}");
    // The error file the step wrote is kept with the secret hidden; so are the files waymark does
    // not read (a success's error file, a failure's outputs), checked with every file below.
    let error_file = env.state().join(format!("logs/{id}/load/attempt-1.error.json"));
    assert_eq!(
        std::fs::read_to_string(error_file).unwrap(),
        "{\"type\": \"PermissionError\", \"message\": \"login *** refused\"}"
    );
    // A success's error file that holds the token in JSON's escapes too (`\u002d` for its `-`):
    // written anew, with both hidden.
    let unused = env.state().join(format!("logs/{id}/fetch/attempt-1.error.json"));
    assert_eq!(
        std::fs::read_to_string(unused).unwrap(),
        "{\"escaped\":\"***\",\"message\":\"***\",\"type\":\"Unused\"}"
    );
    for secret in [token, password] {
        assert!(!holds(&out.stdout, secret) && !holds(&out.stderr, secret), "{secret} on the terminal");
        assert!(!shown.contains(secret), "{secret} shown by logs or status:\n{shown}");
        for (path, bytes) in every_file(&env.state()) {
            assert!(!holds(&bytes, secret), "{secret} is in {path}");
        }
    }
    let status = json_of(&env, &["status", &id, "--json"]);
    assert_eq!(status["steps"][0]["outputs"], json!({"tok": "***"}));
    assert_eq!(status["steps"][1]["last_error"]["message"], "bad token ***");
    // An empty value is no secret: nothing else was replaced (the region, the step names).
    assert!(shown.contains("region=eu") && !shown.contains("*****"), "{shown}");
}

/// A database written before step outputs (schema 4) is read as it is, and migrated by the next
/// runner; steps recorded before then have no outputs.
#[test]
fn a_schema_4_database_is_read_as_it_is_and_migrated_by_the_next_runner() {
    if !common::have_crash_hook("a_schema_4_database_is_read_as_it_is_and_migrated_by_the_next_runner") {
        return;
    }
    let env = Env::new();
    env.write("flow.toml", RESUMED);
    env.write("go", "");
    let out = env
        .cmd(&["run", "flow.toml", "--param", "date=2026-01-31"])
        .env("WAYMARK_TEST_CRASH_AFTER", "fetch-a")
        .output()
        .unwrap();
    assert_eq!(out.status.signal(), Some(9), "{}", stderr(&out));
    let db = || rusqlite::Connection::open(env.state().join("waymark.db")).unwrap();
    let version = || -> i64 { db().query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap() };
    assert_eq!(version(), SCHEMA);
    db().execute_batch(&format!(
        "{UNDO_SCHEMA_9} ALTER TABLE attempts DROP COLUMN kind; ALTER TABLE steps DROP COLUMN outputs; \
         PRAGMA user_version = 4;",
    ))
    .unwrap();

    // Looking does not migrate (it writes nothing).
    let status = json_of(&env, &["status", "--json"]);
    assert_eq!(status["steps"][0]["outputs"], json!({}));
    assert_eq!(version(), 4);

    // A runner migrates and resumes; `fetch-a` recorded no outputs under schema 4.
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(version(), SCHEMA);
    assert_eq!(env.read("load.log"), "  2026-01-31\n");
}

/// An output value too long for a variable is skipped with a warning (the steps after it start
/// without it), and a program whose arguments are more than the system passes in all (64 of
/// 100,000 bytes, more than the 2 MiB of an 8 MiB stack's limit) is not started, saying why and
/// what to do.
#[test]
fn an_output_too_long_for_a_variable_is_skipped_and_a_too_long_argument_is_said() {
    let env = Env::new();
    let long = vec![format!("'{}'", "x".repeat(100_000)); 64].join(", ");
    env.write(
        "flow.toml",
        &format!(
            "name = 'sizes'\n\
             [[step]]\nname = 'big'\nshell = 'printf \"huge=%0200000d\\nok=1\\n\" 0 >> \"$WAYMARK_OUTPUT\"'\n\
             [[step]]\nname = 'show'\nshell = 'echo \"${{#WAYMARK_OUTPUT_BIG_HUGE}} $WAYMARK_OUTPUT_BIG_OK\"'\n\
             [[step]]\nname = 'long'\nrun = ['true', {long}]\n"
        ),
    );
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(stdout(&out), "show | 0 1\n");
    let said = normalise(&env, &stderr(&out));
    let lines: Vec<&str> =
        said.lines().filter(|l| l.contains("huge") || l.starts_with("waymark: long: attempt 1/1 f")).collect();
    assert_eq!(
        lines,
        [
            "waymark: warning: big: outputs file STATE/logs/ID/big/attempt-1.outputs: line 1: the value of `huge` is \
             200000 bytes, more than a variable can hand to a later step (at most 130795 bytes under this key); \
             skipped (write it to a file and pass the file's path)",
            "waymark: long: attempt 1/1 failed: ActionExecutionNotStarted: cannot start `true`: its arguments and \
             environment are more than the system passes to a program (Argument list too long (os error 7): at most \
             128 KiB in any one of them, and about 2 MiB in all, the outputs of earlier steps (`WAYMARK_OUTPUT_*`) \
             included); pass large values in files [start failure]",
        ],
        "{said}"
    );
}

/// An output value too long for a variable that an older waymark recorded (written into the
/// database here) is left out when the run is resumed, with a warning naming its step: the steps
/// after it start, without it, where they all failed to start before.
#[test]
fn a_recorded_output_too_long_for_a_variable_is_left_out_on_resume_with_a_warning() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'old'\n\
         [[step]]\nname = 'big'\nshell = 'echo huge=small >> \"$WAYMARK_OUTPUT\"; echo ok=1 >> \"$WAYMARK_OUTPUT\"'\n\
         [[step]]\nname = 'show'\nshell = 'test -e go && echo \"${#WAYMARK_OUTPUT_BIG_HUGE} $WAYMARK_OUTPUT_BIG_OK\"'\n",
    );
    let out = env.cmd(&["run", "--quiet", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let db = rusqlite::Connection::open(env.state().join("waymark.db")).unwrap();
    let huge = format!("{{\"huge\":\"{}\",\"ok\":\"1\"}}", "x".repeat(200_000));
    assert_eq!(db.execute("UPDATE steps SET outputs = ?1 WHERE name = 'big'", [&huge]).unwrap(), 1);
    env.write("go", "");

    let out = env.cmd(&["resume", &run_id(&env)]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "show | 0 1\n");
    let said = stderr(&out);
    let warnings: Vec<&str> = said.lines().filter(|l| l.contains("warning")).collect();
    assert_eq!(
        warnings,
        [
            "waymark: warning: big: its recorded output `huge` is 200000 bytes, more than a variable can hand to a later \
          step (at most 130795 bytes under this key); later steps do not see it (to pass it, have the step write it \
          to a file and output the file's path; `waymark run --fresh` starts the run over)"
        ],
        "{said}"
    );
}

/// The password of an inherited `WAYMARK_STORE` is hidden in what steps print, but it is no
/// declared secret: a step's output that holds it is passed on as written (it is data), and the
/// steps after see it whole.
#[test]
fn a_step_output_holding_the_store_password_is_passed_on_as_written() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'data'\n[[step]]\nname = 'a'\nshell = 'echo dir=/srv/world-data >> \"$WAYMARK_OUTPUT\"'\n\
         [[step]]\nname = 'b'\nneeds = ['a']\nshell = 'printf %s \"$WAYMARK_OUTPUT_A_DIR\" > got'\n",
    );
    run_beside_a_store_password(&env);
    assert_eq!(env.read("got"), "/srv/world-data");
}

/// The password of an inherited `WAYMARK_STORE` is hidden in what steps print, but it is no
/// declared secret: a parameter value that holds it is taken, not refused (and shown masked).
#[test]
fn a_parameter_holding_the_store_password_is_taken_and_shown_masked() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'greet'\n[params]\nwho = 'hello world'\n[[step]]\nname = 'show'\nshell = 'echo \"$WAYMARK_PARAM_WHO\"'\n",
    );
    let out = run_beside_a_store_password(&env);
    assert_eq!(stdout(&out), "show | hello ***\n");
}

/// `waymark run flow.toml` in the state directory's store, with a `WAYMARK_STORE` of password
/// `world` in its environment (which its steps inherit); it succeeds.
fn run_beside_a_store_password(env: &Env) -> std::process::Output {
    let out = env
        .cmd(&["run", "--store", "sqlite:", "flow.toml"])
        .env("WAYMARK_STORE", "postgres://u:world@127.0.0.1:1/d")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    out
}

/// A secret that is part of the error class a step reports, by its error file or an exit code
/// mapping: its retry policy and catch handlers match the class as the step reported it (each is
/// retried, the right handler runs, the report says the budget was spent), and the class is
/// recorded and shown with the secret hidden. A traceback is read from stderr as its log keeps it,
/// the secret hidden: its class is not one (`***BusyError`), and the exit status is the error.
#[test]
fn a_secret_inside_an_error_class_does_not_change_what_the_policy_retries() {
    let env = Env::new();
    env.write(
        "flow.toml",
        r#"secret_env = ['TENANT']
[errors]
AcmeBusyError = ['ConnectionError']
[[step]]
name = 'file'
retry = { attempts = 2, exception_types = ['AcmeBusyError'] }
shell = '''printf '{"type": "AcmeBusyError", "message": "busy"}' > "$WAYMARK_ERROR_FILE"; exit 1'''
[[step]]
name = 'code'
needs = []
exit_codes = { "75" = "AcmeBusyError" }
retry = { attempts = 2, exception_types = ['AcmeBusyError'] }
shell = 'exit 75'
catch = [
  { exception_types = ['AcmeBusyError'], run = ['touch', 'caught-as-acme'] },
  { exception_types = ['Exception'], run = ['touch', 'caught-as-exception'] },
]
[[step]]
name = 'trace'
needs = []
retry = { attempts = 2, exception_types = ['AcmeBusyError'] }
shell = '''printf 'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\nAcmeBusyError: busy\n' >&2; exit 1'''
"#,
    );
    let out = env.cmd(&["run", "--quiet", "flow.toml"]).env("TENANT", "Acme").output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let status = json_of(&env, &["status", "--json", "--attempts"]);
    for (i, step) in ["file", "code"].into_iter().enumerate() {
        let attempts = status["steps"][i]["attempts"].as_array().unwrap();
        let classes: Vec<&Value> = attempts.iter().map(|a| &a["error"]["class"]).collect();
        assert_eq!(classes, [&json!("***BusyError"), &json!("***BusyError")], "{step}: {status}");
    }
    let traced = status["steps"][2]["attempts"].as_array().unwrap();
    let classes: Vec<&Value> = traced.iter().map(|a| &a["error"]["class"]).collect();
    assert_eq!(classes, [&json!("CalledProcessError")], "{status}");
    assert_eq!(status["steps"][1]["state"], "caught", "{status}");
    assert!(env.path("caught-as-acme").exists() && !env.path("caught-as-exception").exists());
    // The failure report says why each that failed stopped, as the live lines did.
    assert_eq!(err.matches("    budget spent: 2 of 2 attempts\n").count(), 1, "{err}");
    assert!(
        err.contains("    not retried: CalledProcessError is not in exception_types [\"AcmeBusyError\"]\n"),
        "{err}"
    );
    assert!(!err.contains("not retried: ***"), "{err}");
    let id = run_id(&env);
    let kept = std::fs::read_to_string(env.state().join(format!("logs/{id}/file/attempt-1.error.json"))).unwrap();
    assert_eq!(kept, "{\"type\": \"***BusyError\", \"message\": \"busy\"}");
}

/// An error file the step wrote that reports no usable error (a `type` that is no class name),
/// holding a secret: the warning that quotes it, cut to 60 characters, shows no part of the
/// secret (it quotes the file scrubbed).
#[test]
fn the_warning_about_a_bad_error_file_shows_no_part_of_a_secret() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "secret_env = ['TOKEN']\n[[step]]\nname = 'a'\n\
         shell = '''printf '{\"type\": \"%s-%s\"}' \"$(printf 'x%.0s' $(seq 50))\" \"$TOKEN\" > \"$WAYMARK_ERROR_FILE\"; exit 1'''\n",
    );
    let out = env.cmd(&["run", "flow.toml"]).env("TOKEN", "SuperSecretToken123").output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("ignored the error file"), "{err}");
    assert!(!err.contains("SuperSe") && !err.contains("Token123"), "{err}");
}

/// A secret whose value ends in a newline (a mounted secret file's), in the message of a traceback
/// the step prints: the message is recorded with it hidden (the traceback is read from stderr with
/// the secret already hidden, before its lines are trimmed).
#[test]
fn a_secret_ending_in_a_newline_is_hidden_in_a_traceback_s_message() {
    let env = Env::new();
    env.write(
        "flow.toml",
        r#"secret_env = ['TOKEN']
[[step]]
name = 'a'
shell = '''printf 'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\nValueError: bad token %s' "$TOKEN" >&2; exit 1'''
"#,
    );
    let out = env.cmd(&["run", "flow.toml"]).env("TOKEN", "abc123\n").output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let status = json_of(&env, &["status", "--json"]);
    assert_eq!(status["steps"][0]["last_error"]["class"], "ValueError", "{status}");
    assert_eq!(status["steps"][0]["last_error"]["message"], "bad token ***", "{status}");
    for (path, bytes) in every_file(&env.state()) {
        assert!(!holds(&bytes, "abc123"), "the secret is in {path}");
    }
}

#[test]
fn the_variables_of_an_outer_runs_hook_or_catch_handler_reach_no_command_of_a_nested_run() {
    let env = Env::new();
    let show = "env | grep -E '^WAYMARK_(RUN_STATUS|FAILED_STEP|ERROR_)' | grep -v ERROR_FILE | sort";
    env.write(
        "flow.toml",
        &format!("name = 'nest'\n[hooks]\non_exit = \"{show}\"\n[[step]]\nname = 'show'\nshell = \"{show}; true\"\n"),
    );
    // As a hook or catch handler of an outer run that starts `waymark run` has them.
    let out = env
        .cmd(&["run", "flow.toml"])
        .env("WAYMARK_RUN_STATUS", "failed")
        .env("WAYMARK_FAILED_STEP", "outer")
        .env("WAYMARK_ERROR_TYPE", "OuterError")
        .env("WAYMARK_ERROR_BASES", "Exception")
        .env("WAYMARK_ERROR_MESSAGE", "outer")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // The step sees none of them; the hook sees its own run's.
    assert_eq!(
        stdout(&out),
        "on_exit | WAYMARK_ERROR_MESSAGE=\non_exit | WAYMARK_ERROR_TYPE=\non_exit | WAYMARK_FAILED_STEP=\n\
         on_exit | WAYMARK_RUN_STATUS=succeeded\n"
    );
}

/// `WAYMARK_OUTER_ATTEMPT_IDS` is waymark's own: set only in a nested run's steps, never from a
/// flow's `env` (which `check` warns of) or an env file.
#[test]
fn a_flow_cannot_set_the_outer_attempt_ids() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "name = 'own'\nenv = { WAYMARK_OUTER_ATTEMPT_IDS = 'forged' }\n\
         [[step]]\nname = 'show'\nshell = 'echo \"[${WAYMARK_OUTER_ATTEMPT_IDS-unset}]\"'\n",
    );
    let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "show | [unset]\n");
}
