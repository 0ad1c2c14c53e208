//! Golden files for the diagnostics of bad flow files.
//!
//! Every `tests/diagnostics/NAME.toml` is checked with `waymark check NAME.toml` (run inside
//! `tests/diagnostics`, so the path shown is just `NAME.toml`) and its stderr must equal
//! `NAME.stderr` byte for byte. Files named `warn_*.toml` hold warnings only: `check` must exit 0
//! and print the plan on stdout. Every other case must exit 2 and print nothing on stdout.
//!
//! After changing a message on purpose, rewrite the golden files and review the diff:
//!
//! ```text
//! WAYMARK_BLESS=1 cargo test --test diagnostics
//! ```

mod common;

use std::fmt::Write;
use std::path::{Path, PathBuf};

/// The spec asks for golden files for at least this many diagnostics.
const MIN_CASES: usize = 14;

fn cases_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("diagnostics")
}

/// The `.toml` inputs, sorted by name.
fn cases(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("tests/diagnostics exists")
        .map(|e| e.expect("readable dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A line diff of `expected` against `actual`: `-` lines only in the golden file, `+` lines only
/// in what waymark printed, two spaces for lines in both.
fn diff(expected: &str, actual: &str) -> String {
    let a: Vec<&str> = expected.lines().collect();
    let b: Vec<&str> = actual.lines().collect();
    // lcs[i][j]: length of the longest common subsequence of a[i..] and b[j..].
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] { lcs[i + 1][j + 1] + 1 } else { lcs[i + 1][j].max(lcs[i][j + 1]) };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, String::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            let _ = writeln!(out, "  {}", a[i]);
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            let _ = writeln!(out, "- {}", a[i]);
            i += 1;
        } else {
            let _ = writeln!(out, "+ {}", b[j]);
            j += 1;
        }
    }
    if expected.ends_with('\n') != actual.ends_with('\n') {
        out.push_str("(the two differ in the final newline)\n");
    }
    out
}

#[test]
fn bad_flow_files_match_their_golden_stderr() {
    let dir = cases_dir();
    let bless = std::env::var_os("WAYMARK_BLESS").is_some_and(|v| !v.is_empty() && v != "0");
    let names = cases(&dir);
    let mut failures: Vec<String> = Vec::new();
    let mut blessed: Vec<String> = Vec::new();

    // The cases name `curl`: present or not on this machine, the stub is found.
    let stubs = tempfile::tempdir().unwrap();
    let path = common::path_with_stubs(stubs.path(), &["curl"]);
    for name in &names {
        let flow = format!("{name}.toml");
        let golden = dir.join(format!("{name}.stderr"));
        let out = assert_cmd::Command::cargo_bin("waymark")
            .unwrap()
            .current_dir(&dir)
            .env("NO_COLOR", "1")
            .env("PATH", &path)
            .env_remove("CLICOLOR_FORCE")
            .args(["check", &flow])
            .output()
            .expect("waymark runs");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();

        let warning_only = name.starts_with("warn_");
        let want_code = if warning_only { 0 } else { 2 };
        if out.status.code() != Some(want_code) {
            failures.push(format!(
                "{flow}: expected exit status {want_code}, got {:?}\n--- stderr:\n{stderr}",
                out.status.code()
            ));
        }
        if warning_only && !stdout.starts_with("flow ") {
            failures.push(format!("{flow}: expected the plan on stdout, got:\n{stdout}"));
        }
        if !warning_only && !stdout.is_empty() {
            failures.push(format!("{flow}: expected nothing on stdout for an invalid flow, got:\n{stdout}"));
        }
        if warning_only && !stderr.contains("warning: ") {
            failures.push(format!("{flow}: a warn_* case must print a warning on stderr"));
        }

        if bless {
            if std::fs::read_to_string(&golden).ok().as_deref() != Some(stderr.as_str()) {
                std::fs::write(&golden, &stderr).expect("write golden file");
                blessed.push(golden.file_name().unwrap().to_string_lossy().into_owned());
            }
            continue;
        }
        match std::fs::read_to_string(&golden) {
            Ok(expected) if expected == stderr => {}
            Ok(expected) => failures.push(format!(
                "{flow}: stderr differs from {name}.stderr (- golden, + actual):\n{}",
                diff(&expected, &stderr)
            )),
            Err(e) => failures.push(format!(
                "{flow}: cannot read {name}.stderr ({e}); create it with WAYMARK_BLESS=1\n--- actual stderr:\n{stderr}"
            )),
        }
    }

    // A golden file whose input is gone is stale.
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "stderr") && !path.with_extension("toml").exists() {
            failures.push(format!("{}: golden file without a .toml input", path.display()));
        }
    }

    if !blessed.is_empty() {
        eprintln!("blessed {} golden file(s): {}", blessed.len(), blessed.join(", "));
    }
    assert!(names.len() >= MIN_CASES, "only {} diagnostic cases, want at least {MIN_CASES}", names.len());
    assert!(
        failures.is_empty(),
        "{} of {} diagnostic case(s) failed (rerun with WAYMARK_BLESS=1 to accept new output):\n\n{}",
        failures.len(),
        names.len(),
        failures.join("\n")
    );
}

#[test]
fn unreadable_flow_file_exits_2_naming_the_path() {
    let env = common::Env::new();
    let out = env.cmd(&["check", "missing.toml"]).env("NO_COLOR", "1").output().unwrap();
    let stderr = common::stderr(&out);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(stderr.contains("missing.toml"), "the message should name the path: {stderr}");
    assert!(out.stdout.is_empty());
}

/// A flow of 10,000 steps whose last one is wrong: the error names the file, the line (30,002)
/// and the field (`step[9999]`) exactly as for a small flow, and nothing else is said.
#[test]
fn an_error_in_the_last_of_10000_steps_names_its_file_line_and_field() {
    let env = common::Env::new();
    let mut text = String::from("name = \"big\"\n");
    for i in 0..10_000 {
        text.push_str(&format!("[[step]]\nname = \"s{i}\"\nrun = [\"true\"]\n"));
    }
    text.push_str("retry = { attempts = 0 }\n");
    env.write("big.toml", &text);
    let out = env.cmd(&["check", "big.toml"]).env("NO_COLOR", "1").output().unwrap();
    let stderr = common::stderr(&out);
    let expected = r#"error: `step[9999].retry.attempts`: `attempts` counts total executions and must be at least 1
     --> big.toml:30002:22
      |
30002 | retry = { attempts = 0 }
      |                      ^ out of range
      |
      = help: use `attempts = 1` to run once, or `exception_types = []` to retry nothing

error: big.toml is not a valid flow (1 error); nothing was run
"#;
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert!(out.stdout.is_empty());
    assert!(stderr == expected, "stderr differs (- golden, + actual):\n{}", diff(expected, &stderr));
}

#[test]
fn diff_marks_added_and_removed_lines() {
    let d = diff("a\nb\nc\n", "a\nx\nc\n");
    assert_eq!(d, "  a\n- b\n+ x\n  c\n");
}

/// `waymark ARGS` inside `tests/diagnostics` with stderr a pipe and `NO_COLOR` set as given;
/// returns stderr.
fn piped_stderr(args: &[&str], no_color: Option<&str>) -> String {
    let mut cmd = assert_cmd::Command::cargo_bin("waymark").unwrap();
    cmd.current_dir(cases_dir()).env_remove("NO_COLOR").args(args);
    if let Some(v) = no_color {
        cmd.env("NO_COLOR", v);
    }
    String::from_utf8(cmd.output().unwrap().stderr).unwrap()
}

/// `waymark ARGS` inside `tests/diagnostics` under a pseudo-terminal (util-linux `script`), with
/// `NO_COLOR` set as given; returns what the terminal showed, line ends as `\n`.
fn terminal_output(args: &[&str], no_color: Option<&str>) -> String {
    let bin = assert_cmd::cargo::cargo_bin("waymark");
    let line = std::iter::once(bin.to_str().unwrap()).chain(args.iter().copied()).collect::<Vec<_>>().join(" ");
    let mut cmd = std::process::Command::new("script");
    cmd.current_dir(cases_dir()).env_remove("NO_COLOR").args(["-qec", &line, "/dev/null"]);
    cmd.stdin(std::process::Stdio::null());
    if let Some(v) = no_color {
        cmd.env("NO_COLOR", v);
    }
    let out = cmd.output().expect("util-linux `script` runs a command under a pseudo-terminal");
    String::from_utf8(out.stdout).unwrap().replace("\r\n", "\n")
}

fn strip_ansi(text: &str) -> String {
    regex::Regex::new("\x1b\\[[0-9;]*m").unwrap().replace_all(text, "").into_owned()
}

#[test]
fn color_follows_the_flag_then_no_color_then_the_terminal() {
    let plain = std::fs::read_to_string(cases_dir().join("attempts_zero.stderr")).unwrap();
    let check = ["check", "attempts_zero.toml"];
    // Piped: plain by default, with NO_COLOR, and with --color never.
    assert_eq!(piped_stderr(&check, None), plain);
    assert_eq!(piped_stderr(&check, Some("1")), plain);
    assert_eq!(piped_stderr(&["--color", "never", "check", "attempts_zero.toml"], None), plain);
    // --color always colors even a pipe, and wins over NO_COLOR; before or after the command.
    let colored = piped_stderr(&["--color", "always", "check", "attempts_zero.toml"], None);
    assert!(colored.starts_with("\x1b[1m\x1b[91merror\x1b[0m\x1b[1m: `step[0].retry.attempts`"), "{colored:?}");
    assert_eq!(strip_ansi(&colored), plain, "the same text, colored");
    assert_eq!(piped_stderr(&["check", "--color=always", "attempts_zero.toml"], Some("1")), colored);
    // A terminal: colored by default; not with NO_COLOR (any non-empty value) or --color never.
    assert_eq!(terminal_output(&check, None), colored);
    assert_eq!(terminal_output(&check, Some("")), colored, "an empty NO_COLOR is unset");
    assert_eq!(terminal_output(&check, Some("1")), plain);
    assert_eq!(terminal_output(&check, Some("no")), plain);
    assert_eq!(terminal_output(&["--color", "never", "check", "attempts_zero.toml"], None), plain);
}

#[test]
fn color_of_warnings_follows_the_same_choice() {
    let check = |color: &str| piped_stderr(&["--color", color, "check", "warn_unknown_exception_type.toml"], Some("1"));
    let plain = std::fs::read_to_string(cases_dir().join("warn_unknown_exception_type.stderr")).unwrap();
    assert_eq!(check("never"), plain);
    assert_eq!(check("auto"), plain);
    let colored = check("always");
    assert!(colored.starts_with("\x1b[1m\x1b[33mwarning\x1b[0m"), "{colored:?}");
    assert_eq!(strip_ansi(&colored), plain);
}
