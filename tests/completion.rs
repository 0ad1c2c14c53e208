//! Dynamic completion: the shell calls `waymark -- waymark ARGS...` with `WAYMARK_COMPLETE=SHELL` (the
//! protocol of clap_complete's `CompleteEnv`), and waymark answers with run ids and step names from
//! the state directory.

mod common;

use common::Env;
use serde_json::Value;

/// The candidates waymark gives bash for the last word of `words` (the word being completed), one
/// per line, options left out.
fn complete(env: &Env, words: &[&str]) -> Vec<String> {
    complete_with(env, &[], words)
}

/// [`complete`], with the variables `vars` set too.
fn complete_with(env: &Env, vars: &[(&str, &str)], words: &[&str]) -> Vec<String> {
    let index = words.len().to_string();
    let out = env
        .cmd(&[])
        .envs(vars.iter().copied())
        .env("WAYMARK_COMPLETE", "bash")
        .env("_CLAP_COMPLETE_INDEX", index)
        .env("_CLAP_COMPLETE_COMP_TYPE", "9")
        .env("_CLAP_COMPLETE_SPACE", "true")
        .env("_CLAP_IFS", "\n")
        .args(["--", "waymark"])
        .args(words)
        // A generous bound: a completer that hangs fails the test rather than holding it.
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    String::from_utf8(out.stdout).unwrap().lines().filter(|l| !l.starts_with('-')).map(str::to_owned).collect()
}

fn run_ids(env: &Env) -> Vec<String> {
    let out = env.cmd(&["history", "--json"]).output().unwrap();
    let runs: Value = serde_json::from_slice(&out.stdout).unwrap();
    runs.as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_owned()).collect()
}

#[test]
fn run_ids_of_every_flow_complete_newest_first() {
    let env = Env::new();
    env.write("a.toml", "[[step]]\nname = 'one'\nrun = ['true']\n");
    env.write("b.toml", "[[step]]\nname = 'fetch'\nrun = ['true']\n[[step]]\nname = 'load'\nrun = ['false']\n");
    env.cmd(&["run", "-q", "a.toml"]).assert().success();
    env.cmd(&["run", "-q", "b.toml"]).assert().code(1);
    env.cmd(&["run", "-q", "a.toml"]).assert().success();
    let ids = run_ids(&env);
    assert_eq!(ids.len(), 3);

    assert_eq!(complete(&env, &["resume", ""]), ids);
    // A prefix narrows them down.
    let one = &ids[1];
    let narrowed = complete(&env, &["resume", &one[..3]]);
    assert!(narrowed.contains(one) && narrowed.iter().all(|id| id.starts_with(&one[..3])), "{narrowed:?}");
    // `status` and `logs` take a flow file too: the run ids come first, then the files.
    let mut expected = ids.clone();
    expected.extend(["a.toml", "b.toml", "state/"].map(String::from));
    assert_eq!(complete(&env, &["status", ""]), expected);
}

#[test]
fn step_names_complete_from_the_run_on_the_command_line() {
    let env = Env::new();
    env.write("b.toml", "[[step]]\nname = 'fetch'\nrun = ['true']\n[[step]]\nname = 'load'\nrun = ['false']\n");
    env.cmd(&["run", "-q", "b.toml"]).assert().code(1);
    let id = run_ids(&env).remove(0);
    assert_eq!(complete(&env, &["logs", &id, ""]), ["fetch", "load"]);
    assert_eq!(complete(&env, &["logs", &id, "l"]), ["load"]);
    // A flow name for its newest run, with options before it.
    assert_eq!(complete(&env, &["logs", "--stream", "stderr", "b", ""]), ["fetch", "load"]);
    // An unknown run offers no step, and says nothing.
    assert_eq!(complete(&env, &["logs", "nosuchrun", ""]), Vec::<String>::new());
}

/// The store the command would use is the one read: `--store` (its value skipped as a RUN), else
/// `WAYMARK_STORE`, else the state directory's.
#[test]
fn the_store_on_the_command_line_or_in_the_environment_is_the_one_read() {
    let env = Env::new();
    env.write("a.toml", "[[step]]\nname = 'one'\nrun = ['true']\n");
    env.cmd(&["--store", "sqlite:other", "run", "-q", "a.toml"]).assert().success();
    let other = env.cmd(&["history", "--json", "--store", "sqlite:other"]).output().unwrap();
    let runs: Value = serde_json::from_slice(&other.stdout).unwrap();
    let id = runs[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(complete(&env, &["resume", "--store", "sqlite:other", ""]), vec![id.clone()]);
    assert_eq!(complete(&env, &["logs", "--store", "sqlite:other", &id, ""]), ["one"]);
    assert_eq!(complete(&env, &["--store=sqlite:other", "logs", &id, ""]), ["one"]);
    let from_env = |words: &[&str]| complete_with(&env, &[("WAYMARK_STORE", "sqlite:other")], words);
    assert_eq!(from_env(&["resume", ""]), vec![id.clone()]);
    // `--state-dir` names the directory over the variable's, as for the command itself.
    assert_eq!(from_env(&["resume", "--state-dir", "state", ""]), Vec::<String>::new());
}

#[test]
fn the_state_dir_on_the_command_line_is_the_one_read() {
    let env = Env::new();
    env.write("a.toml", "[[step]]\nname = 'one'\nrun = ['true']\n");
    env.cmd(&["--state-dir", "other", "run", "-q", "a.toml"]).assert().success();
    let other = env.cmd(&["history", "--json", "--state-dir", "other"]).output().unwrap();
    let runs: Value = serde_json::from_slice(&other.stdout).unwrap();
    let id = runs[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(complete(&env, &["resume", ""]), Vec::<String>::new(), "WAYMARK_STATE_DIR has no runs");
    assert_eq!(complete(&env, &["resume", "--state-dir", "other", ""]), vec![id.clone()]);
    assert_eq!(complete(&env, &["--state-dir=other", "logs", &id, ""]), ["one"]);
}

#[test]
fn complete_env_prints_a_registration_script() {
    let env = Env::new();
    let out = env.cmd(&[]).env("WAYMARK_COMPLETE", "bash").output().unwrap();
    assert!(out.status.success());
    let script = String::from_utf8(out.stdout).unwrap();
    assert!(script.contains("_clap_complete_waymark()"), "{script}");
    assert!(script.lines().any(|l| l.trim().starts_with("complete ") && l.ends_with(" waymark")), "{script}");
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let out = env.cmd(&[]).env("WAYMARK_COMPLETE", shell).output().unwrap();
        assert!(out.status.success() && !out.stdout.is_empty(), "WAYMARK_COMPLETE={shell}");
    }
}

#[test]
fn a_generic_complete_variable_in_the_environment_does_not_stop_a_run() {
    let env = Env::new();
    env.write("flow.toml", "[[step]]\nname = \"hello\"\nrun = [\"echo\", \"hi\"]\n");
    let out = env.cmd(&["run", "-q", "flow.toml"]).env("COMPLETE", "bash").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    let logs = env.cmd(&["logs", "flow.toml", "hello", "--stream", "stdout"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&logs.stdout), "hi\n", "the step ran");
}

/// A store that takes the connection and never answers offers nothing, within a generous bound,
/// rather than holding the shell that waits for the answer.
#[test]
fn a_store_that_never_answers_offers_nothing() {
    let env = Env::new();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // Takes every connection, holds it, says nothing.
    std::thread::spawn(move || {
        let held: Vec<std::net::TcpStream> = listener.incoming().map_while(Result::ok).collect();
        drop(held);
    });
    let url = format!("postgres://u:p@127.0.0.1:{port}/db?sslmode=disable");
    assert_eq!(complete_with(&env, &[("WAYMARK_STORE", &url)], &["resume", ""]), Vec::<String>::new());
}
