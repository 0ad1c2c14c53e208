//! Warnings about a flow file that loads, and `--strict` (on `check` and `run`), which makes each
//! of them an error: exit 2, nothing runs. Asserted exactly.

mod common;

use common::Env;

const MISSPELLED: &str = r#"[[step]]
name = "fetch"
run = ["touch", "ran"]
retry = { attempts = 3, exception_types = ["ConectionError"] }
"#;

const DRAWN: &str = " --> flow.toml:4:44
  |
4 | retry = { attempts = 3, exception_types = [\"ConectionError\"] }
  |                                            ^^^^^^^^^^^^^^^^ matches only errors children report with this name
  |
  = help: did you mean `ConnectionError`?
";

/// `waymark ARGS` in `env`: exit status, stdout, stderr.
fn waymark(env: &Env, args: &[&str]) -> (Option<i32>, String, String) {
    let out = env.cmd(args).env("NO_COLOR", "1").output().unwrap();
    (out.status.code(), String::from_utf8(out.stdout.clone()).unwrap(), common::stderr(&out))
}

#[test]
fn a_misspelled_class_is_a_warning_naming_the_closest_class() {
    let env = Env::new();
    env.write("flow.toml", MISSPELLED);
    let (code, stdout, stderr) = waymark(&env, &["check", "flow.toml"]);
    assert_eq!(code, Some(0));
    assert!(stdout.starts_with("flow flow (flow.toml): 1 step, run in order\n"), "{stdout}");
    assert_eq!(
        stderr,
        format!("warning: `step[0].retry.exception_types[0]`: no known class is named `ConectionError`\n{DRAWN}\n")
    );
}

#[test]
fn strict_check_makes_the_warning_an_error() {
    let env = Env::new();
    env.write("flow.toml", MISSPELLED);
    let (code, stdout, stderr) = waymark(&env, &["check", "--strict", "flow.toml"]);
    assert_eq!(code, Some(2));
    assert_eq!(stdout, "");
    assert_eq!(
        stderr,
        format!(
            "error: `step[0].retry.exception_types[0]`: no known class is named `ConectionError` (an error under \
             --strict)\n{DRAWN}\nerror: flow.toml is not a valid flow (1 error); nothing was run\n"
        )
    );
}

#[test]
fn strict_run_runs_nothing() {
    let env = Env::new();
    env.write("flow.toml", MISSPELLED);
    let (code, stdout, stderr) = waymark(&env, &["run", "--strict", "flow.toml"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(stdout, "");
    assert!(stderr.ends_with("error: flow.toml is not a valid flow (1 error); nothing was run\n"), "{stderr}");
    assert!(!env.path("ran").exists(), "the step ran");
    assert!(!env.state().exists(), "a strict run that fails writes no state");
}

#[test]
fn strict_accepts_a_flow_without_warnings() {
    let env = Env::new();
    env.write("flow.toml", "[[step]]\nname = 'a'\nrun = ['touch', 'ran']\n");
    let (code, _, stderr) = waymark(&env, &["check", "--strict", "flow.toml"]);
    assert_eq!((code, stderr.as_str()), (Some(0), ""));
    let (code, _, stderr) = waymark(&env, &["run", "--strict", "--quiet", "flow.toml"]);
    assert_eq!((code, stderr.as_str()), (Some(0), ""));
    assert!(env.path("ran").exists());
}

#[test]
fn a_program_on_no_path_is_a_warning_naming_that_path() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new();
    let bin = env.path("bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::write(bin.join("present"), "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(bin.join("present"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(bin.join("not-executable"), "").unwrap();
    env.write(
        "flow.toml",
        r#"[[step]]
name = "a"
run = ["present"]

[[step]]
name = "b"
run = ["not-executable"]

[[step]]
name = "c"
run = ["present"]
env = { PATH = "/nonexistent" }

[[step]]
name = "d"
run = ["./bin/present"]
"#,
    );
    let out = env.cmd(&["check", "flow.toml"]).env("NO_COLOR", "1").env("PATH", "bin").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let help = "  = help: install it, write its full path (`run = [\"/path/to/{}\", ...]`), or set PATH in the \
                step's `env`; cron and services start with a short PATH\n";
    assert_eq!(
        common::stderr(&out),
        format!(
            "warning: `step[1].run[0]`: program `not-executable` is not on the PATH a run would search: bin (waymark's \
             environment)\n\
             \x20--> flow.toml:7:8\n  |\n7 | run = [\"not-executable\"]\n  |        ^^^^^^^^^^^^^^^^ not found\n  |\n{}\n\
             warning: `step[2].run[0]`: program `present` is not on the PATH a run would search: /nonexistent (the \
             step's `env`)\n\
             \x20\x20--> flow.toml:11:8\n   |\n11 | run = [\"present\"]\n   |        ^^^^^^^^^ not found\n   |\n{}\n",
            help.replace("{}", "not-executable"),
            help.replace("{}", "present").replacen("  =", "   =", 1),
        )
    );
}

#[test]
fn programs_of_catch_handlers_compensations_and_hooks_are_searched_too() {
    let env = Env::new();
    env.write(
        "flow.toml",
        r#"[hooks]
on_failure = ["notify-missing", "failed"]
on_exit = "notify-missing too"        # a shell line: /bin/sh finds its programs, not checked

[[step]]
name = "a"
run = ["true"]
catch = [{ run = ["catch-missing"] }, { shell = "also-missing" }]
compensate = ["undo-missing", "a"]
"#,
    );
    let out = env.cmd(&["check", "flow.toml"]).env("NO_COLOR", "1").env("PATH", "/usr/bin:/bin").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let warning = |key: &str, program: &str, line: usize, col: usize, text: &str, whose: &str| {
        let caret = format!("{}{}", " ".repeat(col - 1), "^".repeat(program.len() + 2));
        format!(
            "warning: `{key}`: program `{program}` is not on the PATH a run would search: /usr/bin:/bin (waymark's \
             environment)\n --> flow.toml:{line}:{col}\n  |\n{line} | {text}\n  | {caret} not found\n  |\n  = help: \
             install it, write its full path (`run = [\"/path/to/{program}\", ...]`), or set PATH in the {whose} \
             `env`; cron and services start with a short PATH\n\n"
        )
    };
    assert_eq!(
        common::stderr(&out),
        [
            warning(
                "hooks.on_failure[0]",
                "notify-missing",
                2,
                15,
                r#"on_failure = ["notify-missing", "failed"]"#,
                "flow's"
            ),
            warning(
                "step[0].catch[0].run[0]",
                "catch-missing",
                8,
                19,
                r#"catch = [{ run = ["catch-missing"] }, { shell = "also-missing" }]"#,
                "step's"
            ),
            warning("step[0].compensate[0]", "undo-missing", 9, 15, r#"compensate = ["undo-missing", "a"]"#, "step's"),
        ]
        .concat()
    );
    // `--strict` refuses such a flow, as it does a step's own missing program.
    let out = env.cmd(&["check", "--strict", "flow.toml"]).env("PATH", "/usr/bin:/bin").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// A step whose command is wrong (here both `run` and `shell`) still has its catch handlers'
/// programs searched: the warning comes with the error, not after it is fixed.
#[test]
fn a_step_with_a_bad_command_still_has_its_catch_handlers_programs_searched() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "[[step]]\nname = \"a\"\nrun = [\"true\"]\nshell = \"true\"\ncatch = [{ run = [\"catch-missing\"] }]\n",
    );
    let out = env.cmd(&["check", "flow.toml"]).env("NO_COLOR", "1").env("PATH", "/usr/bin:/bin").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let said = common::stderr(&out);
    assert!(said.contains("error: `step[0].run`: a step takes exactly one of `run` and `shell`, not both\n"), "{said}");
    assert!(
        said.contains(
            "warning: `step[0].catch[0].run[0]`: program `catch-missing` is not on the PATH a run would search: \
             /usr/bin:/bin (waymark's environment)\n"
        ),
        "{said}"
    );
}

/// A variable waymark sets for every attempt, given in an `env` table, never reaches a step: a
/// warning naming it where it is written, in the flow's `env` and in a step's.
#[test]
fn an_env_entry_waymark_sets_itself_is_a_warning() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "env = { WAYMARK_STEP = \"x\" }\n[[step]]\nname = \"a\"\nrun = [\"true\"]\nenv = { OK = \"1\", WAYMARK_ATTEMPT = \"9\" }\n",
    );
    let (code, _, stderr) = waymark(&env, &["check", "flow.toml"]);
    assert_eq!(code, Some(0));
    let help = "  = help: remove it: waymark's own variables (README, \"Environment\") are set over `env`\n";
    assert_eq!(
        stderr,
        format!(
            "warning: `env.WAYMARK_STEP`: `WAYMARK_STEP` is set by waymark for every attempt\n \
             --> flow.toml:1:9\n  |\n1 | env = {{ WAYMARK_STEP = \"x\" }}\n  |         ^^^^^^^^^^^^ no step sees this \
             value\n  |\n{help}\n\
             warning: `step[0].env.WAYMARK_ATTEMPT`: `WAYMARK_ATTEMPT` is set by waymark for every attempt\n \
             --> flow.toml:5:19\n  |\n5 | env = {{ OK = \"1\", WAYMARK_ATTEMPT = \"9\" }}\n  |                   \
             ^^^^^^^^^^^^^^^ no step sees this value\n  |\n{help}\n"
        )
    );
}
