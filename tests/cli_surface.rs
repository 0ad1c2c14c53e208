//! The command line as a user meets it: every argument described, durations read as flow files
//! read them, `--state-dir` only where it applies, and a flow named by its file or its name
//! wherever a command takes one.

mod common;

use clap::CommandFactory;
use common::Env;

/// A flow whose one step prints which time it ran (1, 2, ...).
const FLOW: &str = "[[step]]\nname = 'greet'\nshell = 'echo x >> runs; echo \"hello $(wc -l < runs)\"'\n";

/// `waymark ARGS` as a user at a terminal 100 columns wide, or wider, sees it.
fn cmd(env: &Env, args: &[&str]) -> assert_cmd::Command {
    let mut c = env.cmd(args);
    c.env_remove("COLUMNS");
    c
}

/// The id of the newest run.
fn newest_run(env: &Env) -> String {
    let out = cmd(env, &["history", "--json"]).output().unwrap();
    let runs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    runs[0]["id"].as_str().expect("a run").to_owned()
}

#[test]
fn every_argument_and_command_has_a_description() {
    fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
        for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
            if arg.get_help().is_none_or(|h| h.to_string().trim().is_empty()) {
                missing.push(format!("{path} {}", arg.get_id()));
            }
        }
        for sub in cmd.get_subcommands() {
            let path = format!("{path} {}", sub.get_name());
            if sub.get_about().is_none_or(|h| h.to_string().trim().is_empty()) {
                missing.push(path.clone());
            }
            walk(sub, &path, missing);
        }
    }
    let mut cmd = waymark::cli::Cli::command();
    cmd.build();
    let mut missing = Vec::new();
    walk(&cmd, "waymark", &mut missing);
    assert!(missing.is_empty(), "without a description: {missing:?}");
}

#[test]
fn arguments_are_described_in_help() {
    let env = Env::new();
    cmd(&env, &["logs", "--help"]).assert().success().stdout(
        "Print the output an attempt of a step wrote

Usage: waymark logs [OPTIONS] <RUN> <STEP>

Arguments:
  <RUN>   A run id, or a flow file's path or a flow name for the flow's newest run
  <STEP>  The step's name, as `waymark status RUN` lists it

Options:
      --attempt <ATTEMPT>  Which attempt, from 1 [default: the last one]
      --stream <STREAM>    Only this stream [default: both] [possible values: stdout, stderr]
      --state-dir <DIR>    Where runs and logs are kept [default: $WAYMARK_STATE_DIR, else
                           $XDG_STATE_HOME/waymark, else ~/.local/state/waymark]
      --store <URL>        Where runs are recorded: `sqlite:` (the state directory's database, the
                           default), `sqlite:DIR`, or a PostgreSQL URL
                           `postgres://USER:PASSWORD@HOST:PORT/DB` shared by several hosts [default:
                           $WAYMARK_STORE, else `sqlite:`]
      --color <WHEN>       Color error messages and diagnostics: `auto` if stderr is a terminal and
                           NO_COLOR is unset, `always` (even with NO_COLOR), or `never` [default:
                           auto]
  -h, --help               Print help

Examples:
  waymark logs 4k2m9xq1 fetch
  waymark logs 4k2m9xq1 fetch --attempt 2 --stream stderr
  waymark logs nightly.toml fetch    the newest run of the flow
",
    );
    cmd(&env, &["resume", "--help"])
        .assert()
        .success()
        .stdout(predicates::str::contains("  <RUN_ID>  The run's id, as `waymark history` shows it\n"));
}

#[test]
fn gc_help_shows_the_duration_forms_without_escapes() {
    let env = Env::new();
    cmd(&env, &["gc", "--help"]).assert().success().stdout(
        "Delete finished runs (succeeded, failed, abandoned) and their logs

Usage: waymark gc [OPTIONS] --older-than <DURATION>

Options:
      --older-than <DURATION>  Delete the runs that ended longer ago than this: seconds (`3600`,
                               `0.5`) or a duration such as `30d`, `12h`, `1h 30m`, as in flow files
      --state-dir <DIR>        Where runs and logs are kept [default: $WAYMARK_STATE_DIR, else
                               $XDG_STATE_HOME/waymark, else ~/.local/state/waymark]
      --store <URL>            Where runs are recorded: `sqlite:` (the state directory's database,
                               the default), `sqlite:DIR`, or a PostgreSQL URL
                               `postgres://USER:PASSWORD@HOST:PORT/DB` shared by several hosts
                               [default: $WAYMARK_STORE, else `sqlite:`]
      --host-id <ID>           The name of this runner's host in leases, attempts and messages
                               [default: $WAYMARK_HOST_ID, else the host name]
      --color <WHEN>           Color error messages and diagnostics: `auto` if stderr is a terminal
                               and NO_COLOR is unset, `always` (even with NO_COLOR), or `never`
                               [default: auto]
  -h, --help                   Print help

Examples:
  waymark gc --older-than 30d
  waymark gc --older-than '2w 3d'
  waymark gc --older-than 0          every finished run
",
    );
}

#[test]
fn gc_older_than_reads_durations_as_flow_files_do() {
    let env = Env::new();
    env.write("flow.toml", FLOW);
    cmd(&env, &["run", "flow.toml"]).assert().success();
    // Said naturally: a year is one only when given as one, and a number and its word are apart.
    for (arg, shown) in [
        ("30", "30s"),
        ("1.5", "1s 500ms"),
        ("2m 30s", "2m 30s"),
        ("1d", "1 day"),
        ("30d", "30 days"),
        ("2.5d", "2 days 12h"),
        ("2w 3d", "17 days"),
        ("365d", "365 days"),
        ("1M", "1 month"),
        ("1y", "1 year"),
        ("100y", "100 years"),
    ] {
        cmd(&env, &["gc", "--older-than", arg])
            .assert()
            .success()
            .stdout("")
            .stderr(format!("waymark: deleted 0 finished run(s) older than {shown}\n"));
    }
    cmd(&env, &["gc", "--older-than", "0"])
        .assert()
        .success()
        .stderr("waymark: deleted 1 finished run(s) older than 0s\n");
}

#[test]
fn gc_older_than_refuses_what_flow_files_refuse_and_says_what_works() {
    let env = Env::new();
    let forms = "write seconds as a number (`90`, `0.5`) or a duration such as `30d`, `12h`, `2m 30s`";
    for (arg, why) in [
        ("30x", format!("invalid duration \"30x\": unknown time unit \"x\", supported units: ns, us/µs, ms, sec, min, hours, days, weeks, months, years (and few variations); {forms}")),
        ("0.0001", "a duration must be 0 or at least 1 ms, got 0.0001 s; waymark counts time in milliseconds; write at least `0.001` or \"1ms\"".to_owned()),
        ("200 years", format!("a duration must be at most 100 years; {forms}")),
        ("inf", format!("a duration must be a finite number of seconds; {forms}")),
        // A negative age is refused the same way, not taken for an option.
        ("-1", format!("a duration cannot be negative, got -1; {forms}")),
        ("-0.5", format!("a duration cannot be negative, got -0.5; {forms}")),
        ("-7d", format!("a duration cannot be negative, got -7d; {forms}")),
        ("-.5", format!("a duration cannot be negative, got -.5; {forms}")),
        ("-2m 30s", format!("a duration cannot be negative, got -2m 30s; {forms}")),
    ] {
        cmd(&env, &["gc", "--older-than", arg]).assert().code(2).stdout("").stderr(format!(
            "error: invalid value '{arg}' for '--older-than <DURATION>': {why}\n\nFor more information, try '--help'.\n"
        ));
    }
    assert!(!env.state().exists(), "a refused gc must not create the state directory");
}

/// A negative count is the option's value, refused as out of range: not taken for an unknown
/// option `-1` with a tip (`use '-- -1'`) that does not work.
#[test]
fn a_negative_count_is_refused_as_the_option_s_value() {
    let env = Env::new();
    env.write("flow.toml", "[[step]]\nname = 'a'\nrun = ['true']\n");
    for (args, option, why) in [
        (
            &["history", "--limit", "-1"][..],
            "--limit <LIMIT>",
            "`-1` is not a count of runs: write a whole number, 1 or more",
        ),
        (
            &["history", "--limit", "many"],
            "--limit <LIMIT>",
            "`many` is not a count of runs: write a whole number, 1 or more",
        ),
        (
            &["history", "--limit", "+5"],
            "--limit <LIMIT>",
            "`+5` is not a count of runs: write a whole number, 1 or more",
        ),
        (
            &["logs", "flow.toml", "a", "--attempt", "-1"],
            "--attempt <ATTEMPT>",
            "`-1` is not an attempt's number: attempts are numbered from 1, as `waymark status RUN --attempts` shows \
             them",
        ),
        (
            &["logs", "flow.toml", "a", "--attempt", "0"],
            "--attempt <ATTEMPT>",
            "`0` is not an attempt's number: attempts are numbered from 1, as `waymark status RUN --attempts` shows \
             them",
        ),
        (&["run", "--max-parallel", "-1", "flow.toml"], "--max-parallel <N>", "-1 is not in 1..=10000"),
    ] {
        let value = args.iter().find(|a| ["many", "+5", "-1", "0"].contains(a)).unwrap();
        cmd(&env, args).assert().code(2).stdout("").stderr(format!(
            "error: invalid value '{value}' for '{option}': {why}\n\nFor more information, try '--help'.\n"
        ));
    }
    assert!(!env.state().exists(), "a refused command must not create the state directory");
    // More than can be counted is every run there is.
    cmd(&env, &["history", "--limit", "99999999999999999999999"]).assert().success();
}

#[test]
fn gc_older_than_followed_by_an_option_or_nothing_says_its_value_is_missing() {
    let env = Env::new();
    let missing = "error: a value is required for '--older-than <DURATION>' but none was supplied\n\nFor more information, try '--help'.\n";
    for args in [
        &["gc", "--older-than"][..],
        &["gc", "--older-than", "--state-dir", "elsewhere"],
        &["gc", "--older-than", "-h"],
        &["gc", "--older-than", "--"],
    ] {
        cmd(&env, args).assert().code(2).stdout("").stderr(missing);
    }
    // After `--` nothing is an option's value, a negative duration neither.
    cmd(&env, &["gc", "--older-than", "--", "-7d"]).assert().code(2).stdout("").stderr(
        "error: unexpected argument '-7d' found\n\nUsage: waymark gc [OPTIONS] --older-than <DURATION>\n\nFor more information, try '--help'.\n",
    );
    assert!(!env.state().exists(), "a refused gc must not create the state directory");
}

#[test]
fn state_dir_is_offered_only_by_the_commands_that_keep_or_read_runs() {
    let env = Env::new();
    let with = ["run", "resume", "history", "status", "logs", "gc"];
    for command in waymark::cli::Cli::command().get_subcommands() {
        let name = command.get_name();
        let help = cmd(&env, &[name, "--help"]).output().unwrap();
        let help = String::from_utf8(help.stdout).unwrap();
        assert_eq!(help.contains("--state-dir"), with.contains(&name), "waymark {name} --help:\n{help}");
    }
    // Given after one that does not take it, it is said so, with where it may go (not clap's tip
    // to pass it after `--`, as a value).
    cmd(&env, &["completions", "--state-dir", "x", "bash"]).assert().code(2).stdout("").stderr(
        "error: `waymark completions` takes no `--state-dir`: only run, resume, history, status, logs and gc do; \
         before the command (`waymark --state-dir ... completions`) every command takes it, and those that keep or \
         read no runs ignore it\n",
    );
}

/// An empty `--state-dir` (a variable that was not set) is refused, saying what to give instead,
/// after the command as before it, where only the commands that keep or read runs refuse it (the
/// others ignore it, so an alias may always pass it); nothing is read or written.
#[test]
fn an_empty_state_dir_is_refused_with_the_default_named() {
    let env = Env::new();
    env.write("f.toml", FLOW);
    let said = "error: invalid value '' for '--state-dir <DIR>': an empty path is no directory: give the state \
                directory, or leave the option out for the default ($WAYMARK_STATE_DIR, else \
                $XDG_STATE_HOME/waymark, else ~/.local/state/waymark)\n";
    for args in [&["history", "--state-dir="][..], &["run", "--state-dir", "", "f.toml"]] {
        cmd(&env, args).assert().code(2).stdout("").stderr(format!("{said}\nFor more information, try '--help'.\n"));
    }
    for args in [&["--state-dir", "", "history"][..], &["--state-dir=", "run", "f.toml"]] {
        cmd(&env, args).assert().code(2).stdout("").stderr(said);
    }
    cmd(&env, &["--state-dir", "", "check", "f.toml"]).assert().success();
    assert!(!env.state().exists(), "nothing was written");
}

#[test]
fn store_and_host_id_are_offered_only_by_the_commands_they_apply_to() {
    let env = Env::new();
    let store = ["run", "resume", "history", "status", "logs", "gc"];
    let host = ["run", "resume", "gc"];
    for command in waymark::cli::Cli::command().get_subcommands() {
        let name = command.get_name();
        let help = cmd(&env, &[name, "--help"]).output().unwrap();
        let help = String::from_utf8(help.stdout).unwrap();
        assert_eq!(help.contains("--store"), store.contains(&name), "waymark {name} --help:\n{help}");
        assert_eq!(help.contains("--host-id"), host.contains(&name), "waymark {name} --help:\n{help}");
    }
    cmd(&env, &["graph", "--store=sqlite:x", "f.toml"]).assert().code(2).stdout("").stderr(
        "error: `waymark graph` takes no `--store`: only run, resume, history, status, logs and gc do; before the \
         command (`waymark --store ... graph`) every command takes it, and those that keep or read no runs ignore \
         it\n",
    );
    cmd(&env, &["history", "--host-id", "h1"]).assert().code(2).stdout("").stderr(
        "error: `waymark history` takes no `--host-id`: only run, resume and gc do; before the command (`waymark \
         --host-id ... history`) every command takes it, and those that take no lease ignore it\n",
    );
    // Another unknown option keeps clap's words.
    cmd(&env, &["graph", "--bogus", "f.toml"]).assert().code(2).stdout("").stderr(
        "error: unexpected argument '--bogus' found\n\n  tip: to pass '--bogus' as a value, use '-- --bogus'\n\n\
         Usage: waymark graph [OPTIONS] <FLOW>\n\nFor more information, try '--help'.\n",
    );
    // Before the command, every command takes them; those that keep no runs ignore them, a bad
    // URL and `WAYMARK_STORE` included.
    env.write("flow.toml", FLOW);
    for args in [
        &["--store", "mysql://root:pw@db/x", "--host-id", "h1", "check", "flow.toml"][..],
        &["--store", "mysql://root:pw@db/x", "completions", "bash"],
    ] {
        cmd(&env, args).env("WAYMARK_STORE", "mysql://db/y").assert().success();
    }
    // For the others, the one after the command wins.
    cmd(&env, &["--store", "sqlite:elsewhere", "run", "--store", "sqlite:other", "flow.toml"]).assert().success();
    assert!(env.path("other/waymark.db").exists() && !env.path("elsewhere").exists());
    let out = cmd(&env, &["--store", "sqlite:other", "history", "--json"]).output().unwrap();
    let runs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(runs.as_array().map(Vec::len), Some(1), "{runs}");
    cmd(&env, &["history", "--store", "mysql://root:pw@db/x"]).assert().code(2).stderr(
        "error: store `mysql://root@db/x` is not one waymark knows; give `sqlite:` (the state directory's database, \
         the default), `sqlite:DIR`, or a PostgreSQL URL `postgres://USER:PASSWORD@HOST:PORT/DATABASE`\n",
    );
}

/// A state directory that a `sqlite:DIR` store URL chose and that cannot be used is refused
/// saying what chooses another there: `--state-dir`, or the URL (WAYMARK_STATE_DIR, which the
/// URL overrides, is not offered).
#[test]
fn a_bad_state_directory_a_store_url_chose_names_the_url_to_change() {
    let env = Env::new();
    env.write("flow.toml", FLOW);
    env.write("afile", "");
    let dir = std::fs::canonicalize(env.dir.path()).unwrap();
    let said = |by: &str| {
        format!(
            "error: cannot use {}/afile as the state directory: something other than a directory (a file, a link) is \
             at that path; choose another with --state-dir (or another `sqlite:DIR` in {by})\n",
            dir.display()
        )
    };
    let url = format!("sqlite:{}/afile", dir.display());
    cmd(&env, &["run", "flow.toml"]).env("WAYMARK_STORE", &url).assert().code(4).stderr(said("WAYMARK_STORE"));
    cmd(&env, &["run", "--store", &url, "flow.toml"]).assert().code(4).stderr(said("--store"));
    // Chosen as usual, the usual advice, with a PostgreSQL store too (its URL chooses no directory;
    // the state directory is checked before the store is reached).
    let usual = format!(
        "error: cannot use {}/afile as the state directory: something other than a directory (a file, a link) is at \
         that path; choose another with --state-dir or WAYMARK_STATE_DIR\n",
        dir.display()
    );
    cmd(&env, &["run", "--state-dir", "afile", "flow.toml"]).assert().code(4).stderr(usual.clone());
    cmd(&env, &["run", "flow.toml"])
        .env("WAYMARK_STORE", "postgres://u:p@127.0.0.1:1/db")
        .env("WAYMARK_STATE_DIR", env.path("afile"))
        .assert()
        .code(4)
        .stderr(usual);
}

#[test]
fn state_dir_before_the_command_works_for_every_command_and_the_one_after_wins() {
    let env = Env::new();
    env.write("flow.toml", FLOW);
    cmd(&env, &["run", "--state-dir", "other", "flow.toml"]).assert().success();
    assert!(env.path("other/waymark.db").exists());
    // Not in the default state directory (WAYMARK_STATE_DIR of the test) ...
    cmd(&env, &["history"]).assert().success().stdout("").stderr(format!(
        "no runs yet: the state directory {} does not exist, so no run was ever recorded there; `--state-dir DIR` \
         (or WAYMARK_STATE_DIR) looks in another\n",
        env.state().display()
    ));
    // ... but in the one named before or after the command, the one after winning.
    for args in
        [&["--state-dir", "other", "history"][..], &["--state-dir", "elsewhere", "history", "--state-dir", "other"]]
    {
        let out = cmd(&env, args).assert().success().get_output().stdout.clone();
        assert_eq!(String::from_utf8(out).unwrap().lines().count(), 2, "{args:?}");
    }
    // An alias that always passes it still works with the commands that keep no state.
    cmd(&env, &["--state-dir", "other", "check", "flow.toml"]).assert().success();
    cmd(&env, &["--state-dir", "other", "completions", "bash"]).assert().success();
}

#[test]
fn history_and_status_take_a_flow_file_or_a_flow_name() {
    let env = Env::new();
    env.write("flow.toml", FLOW);
    env.write("sub/.keep", "");
    cmd(&env, &["run", "flow.toml"]).assert().success();
    let id = newest_run(&env);
    let here = env.dir.path().canonicalize().unwrap();
    let runs_of = |args: &[&str], dir: &str| {
        let mut c = cmd(&env, args);
        c.current_dir(env.path(dir));
        let out = c.assert().success().get_output().stdout.clone();
        String::from_utf8(out).unwrap().lines().skip(1).map(|l| l[..8].to_owned()).collect::<Vec<_>>()
    };
    assert_eq!(runs_of(&["history", "flow.toml"], "."), [id.as_str()]);
    assert_eq!(runs_of(&["history", "flow"], "."), [id.as_str()]);
    assert_eq!(runs_of(&["history", "../flow.toml"], "sub"), [id.as_str()]);
    assert_eq!(runs_of(&["history", here.join("flow.toml").to_str().unwrap()], "sub"), [id.as_str()]);
    for target in ["flow.toml", "flow", id.as_str()] {
        let out = cmd(&env, &["status", target]).assert().success().get_output().stdout.clone();
        assert!(String::from_utf8(out).unwrap().starts_with(&format!("run {id} of flow (")), "status {target}");
    }

    // A flow file that is not there is a mistake, not a flow without runs.
    let mut c = cmd(&env, &["history", "flow.toml"]);
    c.current_dir(env.path("sub"));
    c.assert().code(2).stdout("").stderr(format!(
        "error: there is no flow file `flow.toml` in {} and no flow named `flow.toml`; give the path of the flow \
         file, or the flow's name (`waymark history` lists the runs and their flows)\n",
        here.join("sub").display()
    ));
    cmd(&env, &["history", "sub/flow.toml", "--json"]).assert().code(2).stdout("").stderr(format!(
        "error: there is no flow file {}, and no run was started from that path; give the path of the flow file, \
         or the flow's name (`waymark history` lists the runs and their flows)\n",
        here.join("sub/flow.toml").display()
    ));
    cmd(&env, &["status", "sub/flow.toml"]).assert().code(2).stdout("").stderr(format!(
        "error: no run has the id `sub/flow.toml`; there is no flow file {}, and no run was started from that \
         path; give the path of the flow file, or the flow's name (`waymark history` lists the runs and their \
         flows)\n",
        here.join("sub/flow.toml").display()
    ));
    // A directory is not a flow file, and is said to be one.
    std::fs::create_dir(env.path("a-dir")).unwrap();
    cmd(&env, &["history", "a-dir/"]).assert().code(2).stdout("").stderr(format!(
        "error: {} is a directory, not a flow file, and no run was started from that path; give the path of the \
         flow file, or the flow's name (`waymark history` lists the runs and their flows)\n",
        here.join("a-dir").display()
    ));
    // A flow file that exists but never ran has no runs yet; so has a name no run has.
    env.write("other.toml", FLOW);
    let dir = std::fs::canonicalize(env.state()).unwrap();
    let place = format!("in the state directory {}", dir.display());
    let elsewhere = "`--state-dir DIR` (or WAYMARK_STATE_DIR) looks in another";
    for flow in ["other.toml", "nightly"] {
        cmd(&env, &["history", flow])
            .assert()
            .success()
            .stdout("")
            .stderr(format!("no runs yet of flow `{flow}` {place}; {elsewhere}\n"));
    }
    // What cannot be a declared name, and is no flow file's name here, is not one with no runs yet.
    let long = "n".repeat(251);
    for (arg, shown) in [("", ""), ("bad\nname", "bad\\nname"), ("two words", "two words"), (&long, &long)] {
        let said = format!(
            "`{shown}` is neither the name of a flow with runs here nor a flow file; give the flow's name (its \
             `name`, else its file's name without `.toml`), or the path of its flow file (`waymark history` lists \
             the runs kept there, `--state-dir DIR` looks in another)\n"
        );
        cmd(&env, &["history", arg]).assert().code(2).stdout("").stderr(format!("error: {said}"));
        // A RUN was looked for as a run id first.
        let said = format!("error: no run has the id `{shown}`, and {said}");
        cmd(&env, &["status", arg]).assert().code(2).stdout("").stderr(said);
    }
    // The command it suggests is written as the shell needs it.
    env.write("my flow's.toml", FLOW);
    cmd(&env, &["status", "my flow's.toml"]).assert().code(2).stdout("").stderr(format!(
        "error: no runs of the flow file {} {place}; `waymark run 'my flow'\\''s.toml'` starts one, `waymark \
         history` lists the runs kept there, `--state-dir DIR` looks in another\n",
        here.join("my flow's.toml").display()
    ));
}

#[test]
fn logs_take_a_run_id_or_a_flow_for_its_newest_run() {
    let env = Env::new();
    env.write("flow.toml", FLOW);
    cmd(&env, &["run", "flow.toml"]).assert().success();
    let first = newest_run(&env);
    cmd(&env, &["run", "flow.toml"]).assert().success();
    for target in ["flow.toml", "./flow.toml", "flow"] {
        cmd(&env, &["logs", target, "greet", "--stream", "stdout"]).assert().success().stdout("hello 2\n");
    }
    cmd(&env, &["logs", &first, "greet", "--stream", "stdout"]).assert().success().stdout("hello 1\n");
    // Neither a run id nor a flow's name: where it was looked for, and how to list what is
    // there, as `resume` says of an unknown id.
    let dir = std::fs::canonicalize(env.state()).unwrap();
    let unknown = format!(
        "error: no run with id `nightly` and no runs of a flow named `nightly` in the state directory {}; \
         `waymark history` lists the runs kept there, `--state-dir DIR` looks in another\n",
        dir.display()
    );
    cmd(&env, &["logs", "nightly", "greet"]).assert().code(2).stdout("").stderr(unknown.clone());
    cmd(&env, &["status", "nightly"]).assert().code(2).stdout("").stderr(unknown);
    cmd(&env, &["logs", "flow", "grete"]).assert().code(2).stdout("").stderr(format!(
        "error: run {} has no step `grete`; did you mean `greet`? its steps are: greet\n",
        newest_run(&env)
    ));
    cmd(&env, &["logs", "flow", "deploy"])
        .assert()
        .code(2)
        .stdout("")
        .stderr(format!("error: run {} has no step `deploy`; its steps are: greet\n", newest_run(&env)));
    cmd(&env, &["logs", "flow", "greet", "--attempt", "2"])
        .assert()
        .code(2)
        .stdout("")
        .stderr(format!("error: step `greet` of run {} has no attempt 2; it has attempt 1\n", newest_run(&env)));
}

/// `logs` of a step that never ran, because the run failed before its turn came, says so and
/// names the steps that have attempts, not every step (itself among them) as if it were unknown.
#[test]
fn logs_of_a_step_the_failed_run_skipped_says_it_never_ran() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "[[step]]\nname = 'ok'\nrun = ['true']\n[[step]]\nname = 'bad'\nrun = ['false']\n\
         [[step]]\nname = 'after'\nrun = ['true']\n",
    );
    cmd(&env, &["run", "--quiet", "flow.toml"]).assert().code(1);
    cmd(&env, &["logs", "flow", "after"]).assert().code(2).stdout("").stderr(format!(
        "error: step `after` of run {} never ran (the run failed before its turn came), so it has no logs; the steps \
         with attempts: ok, bad\n",
        newest_run(&env)
    ));
}

/// `--color always` colors waymark's own `error:` and `hint:` as it colors a flow's diagnostics
/// (and clap its usage errors); without it, or with `never`, the same text is plain.
#[test]
fn color_always_colors_waymark_s_own_errors_and_hints() {
    let env = Env::new();
    // Nothing listens on port 1: the store cannot be reached, an error with a hint.
    let args = ["history", "--store", "postgres://u@127.0.0.1:1/db?connect_timeout=5"];
    let stderr = |color: &[&str]| {
        let out = cmd(&env, &[color, &args[..]].concat()).env("NO_COLOR", "1").output().unwrap();
        assert_eq!(out.status.code(), Some(4));
        String::from_utf8(out.stderr).unwrap()
    };
    let plain = stderr(&[]);
    assert!(plain.starts_with("error: cannot reach the state database ") && plain.contains("\nhint: "), "{plain}");
    assert_eq!(
        stderr(&["--color", "always"]),
        plain.replacen("error: ", "\x1b[1m\x1b[91merror\x1b[0m\x1b[1m:\x1b[0m ", 1).replacen(
            "\nhint: ",
            "\n\x1b[1m\x1b[96mhint\x1b[0m\x1b[1m:\x1b[0m ",
            1
        )
    );
    assert_eq!(stderr(&["--color", "never"]), plain);
}

#[test]
fn help_given_to_the_help_command_shows_the_help_asked_for() {
    let env = Env::new();
    let help_of_help = cmd(&env, &["help", "help"]).output().unwrap();
    assert!(help_of_help.status.success());
    let run_help = cmd(&env, &["run", "--help"]).output().unwrap();
    assert!(run_help.status.success());
    for (args, expected) in [
        (&["help", "--help"][..], &help_of_help.stdout),
        (&["help", "-h"], &help_of_help.stdout),
        (&["--color", "never", "help", "--help"], &help_of_help.stdout),
        (&["--state-dir", "help", "help", "--help"], &help_of_help.stdout),
        (&["help", "run", "--help"], &run_help.stdout),
        (&["help", "-h", "run"], &run_help.stdout),
    ] {
        let out = cmd(&env, args).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "waymark {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(expected), "waymark {args:?}");
    }
    assert!(String::from_utf8_lossy(&help_of_help.stdout).starts_with("Print this message or the help of the given"));
    // A command that does not exist is still an error.
    cmd(&env, &["help", "nosuch", "--help"]).assert().code(2);
}

/// `history` keeps its columns in line when a flow's name (its file's, without a `name` key) has
/// characters that take two columns of a terminal.
#[test]
fn history_keeps_its_columns_with_wide_characters_in_a_flow_name() {
    let env = Env::new();
    let one_step = "[[step]]\nname = 'a'\nrun = ['true']\n";
    env.write("日本語 🎉 flow.toml", one_step);
    env.write("ok.toml", one_step);
    for flow in ["日本語 🎉 flow.toml", "ok.toml"] {
        cmd(&env, &["run", "-q", flow]).assert().success();
    }
    let out = cmd(&env, &["history"]).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    // The display column where STATUS starts, on each line: the same.
    let status_at = |line: &str, word: &str| {
        let at = line.find(word).unwrap_or_else(|| panic!("{word} in {line:?}"));
        line[..at].chars().map(|c| if c == '日' || c == '本' || c == '語' || c == '🎉' { 2 } else { 1 }).sum::<usize>()
    };
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    let columns = [status_at(lines[0], "STATUS"), status_at(lines[1], "succeeded"), status_at(lines[2], "succeeded")];
    assert_eq!(columns, [columns[0]; 3], "{text}");
}

/// Every option whose value is not a path says so to the shells' completions (a hint other than
/// the default, which bash takes for a file name): completing `--max-parallel ` offers no files.
#[test]
fn options_whose_values_are_not_paths_are_not_completed_with_file_names() {
    fn walk(cmd: &clap::Command, path: &str, wrong: &mut Vec<String>) {
        for arg in cmd.get_arguments().filter(|a| a.get_long().is_some() && a.get_action().takes_values()) {
            let listed = !arg.get_possible_values().is_empty();
            if !listed && arg.get_value_hint() == clap::ValueHint::Unknown {
                wrong.push(format!("{path} --{}", arg.get_long().unwrap_or_default()));
            }
        }
        for sub in cmd.get_subcommands() {
            walk(sub, &format!("{path} {}", sub.get_name()), wrong);
        }
    }
    let mut wrong = Vec::new();
    walk(&waymark::cli::Cli::command(), "waymark", &mut wrong);
    assert!(wrong.is_empty(), "options completed with file names: {wrong:?}");
}
