//! Real error names from children (issue 4): the error file, Python tracebacks and their
//! precedence, checked by running the real binary on real `python3` scripts and shell steps.
//!
//! Every script appends a line to a side-effect file on each run, so a retry filter is checked
//! through the number of runs, the exit status and the error shown on stderr. The Python scripts
//! live in `tests/fixtures/python/`. `python3` is required: without it these tests fail loudly.

mod common;

use common::{Env, PATIENCE};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

const TRACEBACK: &str = "traceback";
const ERROR_FILE: &str = "error file";
const EXIT_STATUS: &str = "exit status";
const MAPPING: &str = "exit code mapping";

const CALLED_PROCESS_ERROR: &str = "CalledProcessError(SubprocessError, Exception, BaseException)";

/// Panics (never skips) when `python3` cannot run: CI has it, and these tests are about it.
fn require_python3() {
    static VERSION: OnceLock<Result<String, String>> = OnceLock::new();
    let version = VERSION.get_or_init(|| {
        let out = Command::new("python3")
            .args(["-c", "import sys; assert sys.version_info >= (3, 8), sys.version; print(sys.version)"])
            .output()
            .map_err(|e| format!("cannot run python3: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        } else {
            Err(format!("python3 failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr)))
        }
    });
    if let Err(why) = version {
        panic!("these tests need python3 >= 3.8 on PATH; {why}");
    }
}

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The absolute path of a Python fixture script.
fn fixture(name: &str) -> String {
    let path = manifest_dir().join("tests/fixtures/python").join(name);
    assert!(path.is_file(), "missing fixture {}", path.display());
    path.display().to_string()
}

/// The absolute path of `examples/helpers`.
fn helpers_dir() -> PathBuf {
    let dir = manifest_dir().join("examples/helpers");
    assert!(dir.join("waymark_errors.py").is_file() && dir.join("waymark_error.sh").is_file());
    dir
}

/// `s` as a TOML basic string.
fn toml_str(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

/// `s` quoted for `/bin/sh`.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// `run = [...]` for `python3 SCRIPT ARGS...`.
fn python_run(script: &str, args: &[&str]) -> String {
    let argv: Vec<String> = ["python3".to_owned(), fixture(script)]
        .into_iter()
        .chain(args.iter().map(|a| (*a).to_owned()))
        .map(|a| toml_str(&a))
        .collect();
    format!("run = [{}]", argv.join(", "))
}

/// `run = [...]` for `python3 -c script`, the script first counting its run in `runs`.
fn python_c(env: &Env, script: &str) -> String {
    let script = format!("open({:?}, 'a').write('ran\\n')\n{script}", runs_file(env));
    format!("run = [\"python3\", \"-c\", {}]", toml_str(&script))
}

/// A flow with one step `s`: `command` (a `run = ...` or `shell = ...` line), `retry` (an inline
/// policy table) and any `extra` step keys, after `head` (top-level tables such as `[errors]`).
/// Python never writes bytecode next to the fixtures or helpers.
fn one_step(head: &str, command: &str, retry: &str, extra: &str) -> String {
    format!(
        "env = {{ PYTHONDONTWRITEBYTECODE = \"1\" }}\n{head}\n[[step]]\nname = \"s\"\n{command}\nretry = {retry}\n{extra}\n"
    )
}

struct Ran {
    code: i32,
    stderr: String,
    runs: usize,
}

impl Ran {
    /// Panics with the whole stderr unless it contains `needle`.
    fn shows(&self, needle: &str) -> &Ran {
        assert!(self.stderr.contains(needle), "stderr lacks {needle:?}:\n{}", self.stderr);
        self
    }

    fn lacks(&self, needle: &str) -> &Ran {
        assert!(!self.stderr.contains(needle), "stderr should not contain {needle:?}:\n{}", self.stderr);
        self
    }

    /// The per-attempt line `attempt N/MAX failed: CLASS: MESSAGE [SOURCE]` for `error` (as the
    /// report writes it, `CLASS(BASES): MESSAGE`), and whether waymark's next line about the step
    /// is its retry.
    fn attempt_failed(&self, n: u32, max: u32, error: &str, source: &str, retried: bool) -> &Ran {
        let brief = regex::Regex::new(r"^(\w+)\([^)]*\)").unwrap().replace(error, "$1");
        let line = format!("waymark: s: attempt {n}/{max} failed: {brief} [{source}]");
        let lines: Vec<&str> = self.stderr.lines().filter(|l| l.starts_with("waymark: s: ")).collect();
        let at =
            lines.iter().position(|l| *l == line).unwrap_or_else(|| panic!("stderr lacks {line:?}:\n{}", self.stderr));
        let next = lines.get(at + 1).copied().unwrap_or_default();
        assert_eq!(next.starts_with("waymark: s: retry "), retried, "retry decision after {line:?}:\n{}", self.stderr);
        self
    }

    /// The final failure report names this error and source on the line of the last attempt,
    /// attempt `attempts` (its own line, or the last of a run of attempts that failed the same
    /// way, which share one).
    fn reported(&self, error: &str, source: &str, attempts: usize) -> &Ran {
        let report = self
            .stderr
            .split_once("\nwaymark: run ")
            .and_then(|(_, rest)| rest.split_once(" failed\n  step s:\n"))
            .map(|(_, report)| report)
            .unwrap_or_else(|| panic!("no failure report for step s in:\n{}", self.stderr));
        let last = report
            .lines()
            .take_while(|l| l.starts_with("    attempt"))
            .last()
            .unwrap_or_else(|| panic!("the report has no attempt:\n{report}"));
        let one = last.starts_with(&format!("    attempt {attempts}: started "));
        let run = last.starts_with("    attempts ") && last.contains(&format!(" to {attempts}: started "));
        assert!(one || run, "last attempt {attempts}: {last:?}");
        assert!(last.ends_with(&format!(": {error} [{source}]")), "{error} [{source}] in {last:?}");
        self
    }

    /// Warnings printed about step `s`'s error file.
    fn error_file_warnings(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| l.starts_with("waymark: warning: s: ignored the error file: error file "))
            .collect()
    }
}

/// Write `flow` as `flow.toml`, run it, and check the exit status.
fn run(env: &Env, flow: &str, code: i32) -> Ran {
    require_python3();
    env.write("flow.toml", flow);
    let out = env.cmd(&["run", "flow.toml"]).timeout(PATIENCE).output().expect("run waymark");
    let ran = Ran {
        code: out.status.code().unwrap_or(-1),
        stderr: common::untimed(&String::from_utf8_lossy(&out.stderr)),
        runs: env.count("runs"),
    };
    assert_eq!(ran.code, code, "exit status of waymark run; flow:\n{flow}\nstderr:\n{}", ran.stderr);
    ran
}

fn runs_file(env: &Env) -> String {
    env.path("runs").display().to_string()
}

/// A step that raises the built-in `class` (message "boom") under `exception_types = types`.
fn raising(env: &Env, class: &str, types: &str, attempts: u32) -> String {
    one_step(
        "",
        &python_run("raise_builtin.py", &[&runs_file(env), class, "boom"]),
        &format!("{{ attempts = {attempts}, exception_types = {types} }}"),
        "",
    )
}

// 1. ConnectionResetError under ["ConnectionError"].

#[test]
fn connection_reset_error_is_retried_under_connection_error() {
    let env = Env::new();
    let ran = run(&env, &raising(&env, "ConnectionResetError", r#"["ConnectionError"]"#, 3), 1);
    assert_eq!(ran.runs, 3);
    let error = "ConnectionResetError(ConnectionError, OSError, Exception, BaseException): boom";
    ran.attempt_failed(1, 3, error, TRACEBACK, true)
        .attempt_failed(2, 3, error, TRACEBACK, true)
        .attempt_failed(3, 3, error, TRACEBACK, false)
        .reported(error, TRACEBACK, 3)
        // The tail of the last attempt's stderr is the traceback itself.
        .shows("    ConnectionResetError: boom\n");
}

// 2. TimeoutError: an OSError, not a ConnectionError.

#[test]
fn timeout_error_is_retried_under_oserror() {
    let env = Env::new();
    let ran = run(&env, &raising(&env, "TimeoutError", r#"["OSError"]"#, 3), 1);
    assert_eq!(ran.runs, 3);
    let error = "TimeoutError(OSError, Exception, BaseException): boom";
    ran.attempt_failed(1, 3, error, TRACEBACK, true).reported(error, TRACEBACK, 3);
}

#[test]
fn timeout_error_is_not_retried_under_connection_error() {
    let env = Env::new();
    let ran = run(&env, &raising(&env, "TimeoutError", r#"["ConnectionError"]"#, 3), 1);
    assert_eq!(ran.runs, 1);
    let error = "TimeoutError(OSError, Exception, BaseException): boom";
    ran.attempt_failed(1, 3, error, TRACEBACK, false).reported(error, TRACEBACK, 1);
}

// 3. ValueError under ["ConnectionError"].

#[test]
fn value_error_is_not_retried_under_connection_error() {
    let env = Env::new();
    let ran = run(&env, &raising(&env, "ValueError", r#"["ConnectionError"]"#, 3), 1);
    assert_eq!(ran.runs, 1);
    let error = "ValueError(Exception, BaseException): boom";
    ran.attempt_failed(1, 3, error, TRACEBACK, false).reported(error, TRACEBACK, 1);
}

#[test]
fn value_error_is_retried_under_its_own_name_and_exception() {
    for types in [r#"["ValueError"]"#, r#"["Exception"]"#, r#"["KeyError", "ValueError"]"#] {
        let env = Env::new();
        let ran = run(&env, &raising(&env, "ValueError", types, 2), 1);
        assert_eq!(ran.runs, 2, "{types}");
    }
}

// 4. A custom OSError subclass declared in [errors].

#[test]
fn custom_oserror_subclass_declared_in_errors_is_retried_under_oserror() {
    let env = Env::new();
    let flow = one_step(
        "[errors]\nFlakyDisk = [\"OSError\"]",
        &python_run("flaky_disk.py", &[&runs_file(&env)]),
        r#"{ attempts = 3, exception_types = ["OSError"] }"#,
        "",
    );
    let ran = run(&env, &flow, 1);
    assert_eq!(ran.runs, 3);
    let error = "FlakyDisk(OSError, Exception, BaseException): sector 7 unreadable";
    ran.attempt_failed(1, 3, error, TRACEBACK, true).reported(error, TRACEBACK, 3);
}

#[test]
fn custom_class_unknown_to_the_flow_is_only_an_exception() {
    // Without the [errors] entry, a traceback only says "FlakyDisk": waymark cannot know it is
    // an OSError, so ["OSError"] does not retry it (but ["FlakyDisk"] does).
    let env = Env::new();
    let command = python_run("flaky_disk.py", &[&runs_file(&env)]);
    let ran = run(&env, &one_step("", &command, r#"{ attempts = 3, exception_types = ["OSError"] }"#, ""), 1);
    assert_eq!(ran.runs, 1);
    ran.attempt_failed(1, 3, "FlakyDisk(Exception, BaseException): sector 7 unreadable", TRACEBACK, false);

    let env = Env::new();
    let command = python_run("flaky_disk.py", &[&runs_file(&env)]);
    let ran = run(&env, &one_step("", &command, r#"{ attempts = 3, exception_types = ["FlakyDisk"] }"#, ""), 1);
    assert_eq!(ran.runs, 3);
}

/// Tracebacks Python prints for exceptions that did not end the process: a thread's, and a handled
/// one that `logging.exception` logged before the program went on. Neither is the attempt's error:
/// it exited 1 of its own accord, a `CalledProcessError`, which `["ConnectionError"]` does not retry.
#[test]
fn a_thread_s_or_a_logged_handled_exception_s_traceback_is_not_the_attempt_s_error() {
    let scripts = [
        "import sys, threading\n\
         def work(): raise ConnectionResetError('in a thread')\n\
         t = threading.Thread(target=work); t.start(); t.join()\nsys.exit(1)",
        "import logging, sys\n\
         try:\n    raise ConnectionResetError('transient, handled')\n\
         except OSError:\n    logging.exception('handled; continuing')\n\
         print('fatal: bad input file, giving up', file=sys.stderr)\nsys.exit(1)",
    ];
    for script in scripts {
        let env = Env::new();
        let flow =
            one_step("", &python_c(&env, script), r#"{ attempts = 3, exception_types = ["ConnectionError"] }"#, "");
        let ran = run(&env, &flow, 1);
        assert_eq!(ran.runs, 1, "{script}: {}", ran.stderr);
        ran.attempt_failed(1, 3, &format!("{CALLED_PROCESS_ERROR}: exit status 1"), EXIT_STATUS, false);
    }
}

/// A class of Python's standard library that is not built in takes its bases from the name the
/// traceback prints: urllib's URLError is an OSError, asyncio's CancelledError a BaseException
/// only (the default policy does not retry it). A policy may name one of them by its bare name.
#[test]
fn the_standard_library_s_classes_have_their_bases() {
    let cases = [
        (
            "import urllib.error\nraise urllib.error.URLError('refused')",
            r#"["OSError"]"#,
            3,
            "URLError(OSError, Exception, BaseException): <urlopen error refused>",
        ),
        (
            "import asyncio\nraise asyncio.CancelledError('stop')",
            r#"["Exception"]"#,
            1,
            "CancelledError(BaseException): stop",
        ),
        // Listed by its bare name, with no warning: what derives from it matches it too.
        (
            "import urllib.error\nraise urllib.error.HTTPError('http://x', 503, 'busy', None, None)",
            r#"["URLError"]"#,
            3,
            "HTTPError(URLError, OSError, Exception, BaseException): HTTP Error 503: busy",
        ),
    ];
    for (raise, types, runs, error) in cases {
        let env = Env::new();
        let ran = run(
            &env,
            &one_step("", &python_c(&env, raise), &format!("{{ attempts = 3, exception_types = {types} }}"), ""),
            1,
        );
        assert_eq!(ran.runs, runs, "{raise}: {}", ran.stderr);
        ran.attempt_failed(1, 3, error, TRACEBACK, runs > 1).reported(error, TRACEBACK, runs);
        ran.lacks("is not a class waymark knows");
        ran.lacks("no known class");
    }
}

/// A script Python cannot compile prints its SyntaxError without a traceback's header.
#[test]
fn a_script_python_cannot_compile_fails_with_its_syntax_error() {
    let env = Env::new();
    env.write("bad.py", "x = = 1\n");
    let shell = format!("echo ran >> {}; exec python3 bad.py", sh_quote(&runs_file(&env)));
    let flow = one_step(
        "",
        &format!("shell = {}", toml_str(&shell)),
        r#"{ attempts = 2, exception_types = ["SyntaxError"] }"#,
        "",
    );
    let ran = run(&env, &flow, 1);
    assert_eq!(ran.runs, 2, "{}", ran.stderr);
    ran.reported("SyntaxError(Exception, BaseException): invalid syntax", TRACEBACK, 2);
}

/// A class name is a Python identifier, in any script: declared, raised and listed, it matches.
#[test]
fn a_class_named_in_another_script_is_declared_raised_and_matched() {
    let env = Env::new();
    let command = python_c(&env, "class Ошибка(ValueError): pass\nraise Ошибка('плохо')");
    let flow = one_step(
        "[errors]\n\"Ошибка\" = [\"ValueError\"]",
        &command,
        r#"{ attempts = 2, exception_types = ["Ошибка"] }"#,
        "",
    );
    let ran = run(&env, &flow, 1);
    assert_eq!(ran.runs, 2, "{}", ran.stderr);
    ran.reported("Ошибка(ValueError, Exception, BaseException): плохо", TRACEBACK, 2);
}

/// `IOError` is `OSError` in Python 3: listed, it retries every OSError, as `except IOError:` catches it.
#[test]
fn io_error_in_exception_types_is_os_error() {
    let env = Env::new();
    let ran = run(&env, &raising(&env, "FileNotFoundError", r#"["IOError"]"#, 2), 1);
    assert_eq!(ran.runs, 2, "{}", ran.stderr);
    ran.shows("`IOError` is another name of `OSError` in Python 3");
    // And an error a child reports under that name itself (the shell helper may) still matches it.
    let env = Env::new();
    let helper = helpers_dir().join("waymark_error.sh").display().to_string();
    let shell = format!(
        "echo ran >> {runs}; . {helper}; waymark_error IOError 'disk read failed'; exit 1",
        runs = sh_quote(&runs_file(&env)),
        helper = sh_quote(&helper),
    );
    let flow = one_step(
        "",
        &format!("shell = {}", toml_str(&shell)),
        r#"{ attempts = 2, exception_types = ["IOError"] }"#,
        "",
    );
    assert_eq!(run(&env, &flow, 1).runs, 2);
}

/// A class waymark does not know is taken for a plain Exception, and the user is told so, not
/// again for each attempt that repeats it; not at all when the step names the class itself.
#[test]
fn a_class_waymark_does_not_know_is_said_once() {
    let env = Env::new();
    let command = python_run("flaky_disk.py", &[&runs_file(&env)]);
    let ran = run(&env, &one_step("", &command, r#"{ attempts = 3, exception_types = ["FlakyDisk"] }"#, ""), 1);
    assert_eq!(ran.runs, 3);
    ran.lacks("is not a class waymark knows");
    let env = Env::new();
    let command = python_run("flaky_disk.py", &[&runs_file(&env)]);
    let ran = run(&env, &one_step("", &command, r#"{ attempts = 3 }"#, ""), 1);
    assert_eq!(ran.runs, 3);
    let said: Vec<&str> = ran.stderr.lines().filter(|l| l.contains("is not a class waymark knows")).collect();
    assert_eq!(
        said,
        ["waymark: warning: s: FlakyDisk (from the traceback) is not a class waymark knows (built in, of Python's \
          standard library, or in the flow's `[errors]`), so it is taken for a plain Exception; if it derives from \
          another class, declare it in `[errors]` (FlakyDisk = [\"OSError\"], say) or import \
          examples/helpers/waymark_errors.py, which reports its bases"],
        "{}",
        ran.stderr
    );
}

// 5. Chained exceptions: the last one decides.

fn chained(how: &str) {
    // (inner, outer, runs under ["ConnectionError"] with 3 attempts)
    for (inner, outer, runs) in [("ValueError", "ConnectionResetError", 3), ("ConnectionResetError", "ValueError", 1)] {
        let env = Env::new();
        let flow = one_step(
            "",
            &python_run("chained.py", &[&runs_file(&env), how, inner, outer]),
            r#"{ attempts = 3, exception_types = ["ConnectionError"] }"#,
            "",
        );
        let ran = run(&env, &flow, 1);
        assert_eq!(ran.runs, runs, "{how}: {inner} then {outer}\n{}", ran.stderr);
        let bases = if outer == "ValueError" {
            "Exception, BaseException"
        } else {
            "ConnectionError, OSError, Exception, BaseException"
        };
        let error = format!("{outer}({bases}): outer failure");
        ran.attempt_failed(1, 3, &error, TRACEBACK, runs > 1).reported(&error, TRACEBACK, runs);
    }
}

#[test]
fn chained_raise_from_is_classified_by_the_last_exception() {
    chained("from");
}

#[test]
fn chained_during_handling_is_classified_by_the_last_exception() {
    chained("during");
}

// 6. The Python helper: an excepthook that writes the error file with the full MRO.

fn helper_flow(env: &Env, failures: u32, attempts: u32, extra: &str) -> String {
    let helpers = helpers_dir().display().to_string();
    one_step(
        "",
        &python_run("helper_custom_mro.py", &[&runs_file(env), &helpers, &failures.to_string()]),
        &format!(r#"{{ attempts = {attempts}, exception_types = ["TransportError"] }}"#),
        extra,
    )
}

const CONNECT_TIMEOUT: &str = "ConnectTimeout(TimeoutException, TransportError, Exception, BaseException)";

#[test]
fn python_helper_reports_a_custom_mro_through_the_error_file() {
    // Not declared in the flow: only the error file can say that ConnectTimeout is a TransportError.
    let env = Env::new();
    let ran = run(&env, &helper_flow(&env, 100, 3, ""), 1);
    assert_eq!(ran.runs, 3);
    ran.attempt_failed(1, 3, &format!("{CONNECT_TIMEOUT}: connect timed out (run 1)"), ERROR_FILE, true)
        .attempt_failed(2, 3, &format!("{CONNECT_TIMEOUT}: connect timed out (run 2)"), ERROR_FILE, true)
        .attempt_failed(3, 3, &format!("{CONNECT_TIMEOUT}: connect timed out (run 3)"), ERROR_FILE, false)
        .reported(&format!("{CONNECT_TIMEOUT}: connect timed out (run 3)"), ERROR_FILE, 3)
        // The helper still lets Python print the traceback.
        .shows("    ConnectTimeout: connect timed out (run 3)\n");
    assert!(ran.error_file_warnings().is_empty(), "{}", ran.stderr);
}

#[test]
fn python_helper_failing_twice_then_succeeding_ends_with_success() {
    let env = Env::new();
    let ran = run(&env, &helper_flow(&env, 2, 5, ""), 0);
    assert_eq!(ran.runs, 3);
    ran.attempt_failed(2, 5, &format!("{CONNECT_TIMEOUT}: connect timed out (run 2)"), ERROR_FILE, true)
        .shows("waymark: s: attempt 3/5 succeeded\n")
        .lacks("attempt 3/5 failed");
}

#[test]
fn error_file_is_used_even_with_traceback_detection_off() {
    let env = Env::new();
    let ran = run(&env, &helper_flow(&env, 100, 2, "detect_errors = \"none\""), 1);
    assert_eq!(ran.runs, 2);
    ran.reported(&format!("{CONNECT_TIMEOUT}: connect timed out (run 2)"), ERROR_FILE, 2);
}

// 7. The shell helper.

#[test]
fn shell_helper_reports_a_named_error_with_bases() {
    let env = Env::new();
    let helper = helpers_dir().join("waymark_error.sh").display().to_string();
    let shell = format!(
        "echo ran >> {runs}; . {helper}; waymark_error DownloadFailed 'curl failed' ConnectionError OSError Exception; exit 3",
        runs = sh_quote(&runs_file(&env)),
        helper = sh_quote(&helper),
    );
    let flow = one_step(
        "",
        &format!("shell = {}", toml_str(&shell)),
        r#"{ attempts = 3, exception_types = ["ConnectionError"] }"#,
        "",
    );
    let ran = run(&env, &flow, 1);
    assert_eq!(ran.runs, 3);
    let error = "DownloadFailed(ConnectionError, OSError, Exception, BaseException): curl failed";
    ran.attempt_failed(1, 3, error, ERROR_FILE, true)
        .attempt_failed(3, 3, error, ERROR_FILE, false)
        .reported(error, ERROR_FILE, 3);
    assert!(ran.error_file_warnings().is_empty(), "{}", ran.stderr);
}

/// The helpers' documented call names the nearest base only: the bases it has are the class's
/// too, as in Python, so a policy on any of them (the default one, on `Exception`, included)
/// retries it.
#[test]
fn a_reported_base_brings_its_own_bases() {
    let helpers = helpers_dir().display().to_string();
    for types in ["[\"OSError\"]", "[\"Exception\"]"] {
        let env = Env::new();
        let script = format!(
            "import sys; sys.path.insert(0, {helpers:?}); import waymark_errors\n\
             waymark_errors.report('DownloadFailed', 'HTTP 503', bases=['ConnectionError'])\nsys.exit(1)"
        );
        let flow =
            one_step("", &python_c(&env, &script), &format!("{{ attempts = 2, exception_types = {types} }}"), "");
        let ran = run(&env, &flow, 1);
        assert_eq!(ran.runs, 2, "{types}: {}", ran.stderr);
        let error = "DownloadFailed(ConnectionError, OSError, Exception, BaseException): HTTP 503";
        ran.attempt_failed(1, 2, error, ERROR_FILE, true).reported(error, ERROR_FILE, 2);
    }
}

/// The Python helper writes a class's whole chain: taken as it is, even where a library's class
/// has a built-in's name (urllib3's `TimeoutError` derives from its `HTTPError`, not `OSError`),
/// so `["OSError"]` does not retry it.
#[test]
fn a_whole_chain_reported_is_taken_as_it_is() {
    let helpers = helpers_dir().display().to_string();
    let env = Env::new();
    let script = format!(
        "import sys; sys.path.insert(0, {helpers:?}); import waymark_errors\n\
         class HTTPError(Exception): pass\n\
         class TimeoutError(HTTPError): pass\n\
         class ReadTimeoutError(TimeoutError): pass\n\
         raise ReadTimeoutError('read timed out')"
    );
    let flow = one_step("", &python_c(&env, &script), r#"{ attempts = 2, exception_types = ["OSError"] }"#, "");
    let ran = run(&env, &flow, 1);
    assert_eq!(ran.runs, 1, "{}", ran.stderr);
    let error = "ReadTimeoutError(TimeoutError, HTTPError, Exception, BaseException): read timed out";
    ran.attempt_failed(1, 2, error, ERROR_FILE, false);
}

#[test]
fn shell_helper_escapes_awkward_messages() {
    // Quotes, backslashes, a tab and a newline in the message still give valid JSON.
    let env = Env::new();
    let helper = helpers_dir().join("waymark_error.sh").display().to_string();
    let shell = format!(
        "echo ran >> {runs}; . {helper}; waymark_error DownloadFailed \"$(printf 'say \"hi\" \\\\ a\\tb\\nline 2')\" ConnectionError; exit 1",
        runs = sh_quote(&runs_file(&env)),
        helper = sh_quote(&helper),
    );
    let flow = one_step(
        "",
        &format!("shell = {}", toml_str(&shell)),
        r#"{ attempts = 2, exception_types = ["ConnectionError"] }"#,
        "",
    );
    let ran = run(&env, &flow, 1);
    assert_eq!(ran.runs, 2, "{}", ran.stderr);
    // One line on the terminal: the first line of the message, then an ellipsis.
    // ConnectionError brings its own bases.
    let error = "DownloadFailed(ConnectionError, OSError, Exception, BaseException): say \"hi\" \\ a\tb …";
    ran.attempt_failed(1, 2, error, ERROR_FILE, true).reported(error, ERROR_FILE, 2);
    assert!(ran.error_file_warnings().is_empty(), "{}", ran.stderr);
    // The whole message, newline included, is kept in the record.
    let status = env.cmd(&["status", "--json"]).output().unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["steps"][0]["last_error"]["message"], "say \"hi\" \\ a\tb\nline 2");
}

// 8. Precedence: error file, traceback, exit_codes (step, then flow), CalledProcessError.

#[test]
fn error_file_wins_over_a_traceback() {
    let error = "FileReported(ConnectionError, OSError, Exception, BaseException): from the error file";
    for (types, runs) in [(r#"["ConnectionError"]"#, 3), (r#"["ValueError"]"#, 1)] {
        let env = Env::new();
        let flow = one_step(
            "",
            &python_run("file_and_traceback.py", &[&runs_file(&env)]),
            &format!("{{ attempts = 3, exception_types = {types} }}"),
            // Even an exit_codes entry for status 1 comes after the error file.
            "exit_codes = { \"1\" = \"ValueError\" }",
        );
        let ran = run(&env, &flow, 1);
        assert_eq!(ran.runs, runs, "{types}");
        ran.attempt_failed(1, 3, error, ERROR_FILE, runs > 1).reported(error, ERROR_FILE, runs);
    }
}

#[test]
fn detect_errors_none_turns_traceback_detection_off() {
    let step_level = |env: &Env| {
        let mut flow = raising(env, "ConnectionResetError", r#"["ConnectionError"]"#, 3);
        flow.push_str("detect_errors = \"none\"\n");
        flow
    };
    let in_defaults = |env: &Env| {
        raising(env, "ConnectionResetError", r#"["ConnectionError"]"#, 3).replacen(
            "[[step]]",
            "[defaults]\ndetect_errors = \"none\"\n[[step]]",
            1,
        )
    };
    for make in [&step_level as &dyn Fn(&Env) -> String, &in_defaults] {
        let env = Env::new();
        let flow = make(&env);
        let ran = run(&env, &flow, 1);
        assert_eq!(ran.runs, 1, "{flow}");
        let error = format!("{CALLED_PROCESS_ERROR}: exit status 1");
        ran.attempt_failed(1, 3, &error, EXIT_STATUS, false).reported(&error, EXIT_STATUS, 1);
    }
    // "auto" is the default, spelled out.
    let env = Env::new();
    let mut flow = raising(&env, "ConnectionResetError", r#"["ConnectionError"]"#, 2);
    flow.push_str("detect_errors = \"auto\"\n");
    assert_eq!(run(&env, &flow, 1).runs, 2);
}

#[test]
fn a_traceback_with_exit_status_2_is_not_a_traceback_error() {
    let env = Env::new();
    let flow = one_step(
        "",
        &python_run("traceback_exit2.py", &[&runs_file(&env)]),
        r#"{ attempts = 3, exception_types = ["ConnectionError"] }"#,
        "",
    );
    let ran = run(&env, &flow, 1);
    assert_eq!(ran.runs, 1);
    let error = format!("{CALLED_PROCESS_ERROR}: exit status 2");
    ran.attempt_failed(1, 3, &error, EXIT_STATUS, false)
        .reported(&error, EXIT_STATUS, 1)
        // The traceback really is at the end of its stderr.
        .shows("    ConnectionResetError: reset by peer\n");
}

/// A shell step that counts its run and exits with `code` (no error file, no traceback).
fn exiting(env: &Env, code: u32) -> String {
    format!(
        "shell = {}",
        toml_str(&format!("echo ran >> {}; echo plain failure >&2; exit {code}", sh_quote(&runs_file(env))))
    )
}

#[test]
fn exit_codes_map_a_status_when_there_is_no_file_or_traceback() {
    let retry = r#"{ attempts = 3, exception_types = ["ConnectionError"] }"#;
    let mapped = "ConnectionError(OSError, Exception, BaseException): exit status 3";

    // Step level.
    let env = Env::new();
    let ran = run(&env, &one_step("", &exiting(&env, 3), retry, "exit_codes = { \"3\" = \"ConnectionError\" }"), 1);
    assert_eq!(ran.runs, 3);
    ran.attempt_failed(1, 3, mapped, MAPPING, true).reported(mapped, MAPPING, 3);

    // Flow level.
    let env = Env::new();
    let ran = run(&env, &one_step("[exit_codes]\n\"3\" = \"ConnectionError\"", &exiting(&env, 3), retry, ""), 1);
    assert_eq!(ran.runs, 3);
    ran.reported(mapped, MAPPING, 3);

    // The step's mapping comes before the flow's.
    let env = Env::new();
    let flow = one_step(
        "[exit_codes]\n\"3\" = \"ConnectionError\"",
        &exiting(&env, 3),
        retry,
        "exit_codes = { \"3\" = \"ValueError\" }",
    );
    let ran = run(&env, &flow, 1);
    assert_eq!(ran.runs, 1);
    ran.reported("ValueError(Exception, BaseException): exit status 3", MAPPING, 1);

    // Another status is not mapped.
    let env = Env::new();
    let ran = run(&env, &one_step("", &exiting(&env, 4), retry, "exit_codes = { \"3\" = \"ConnectionError\" }"), 1);
    assert_eq!(ran.runs, 1);
    ran.reported(&format!("{CALLED_PROCESS_ERROR}: exit status 4"), EXIT_STATUS, 1);
}

#[test]
fn a_traceback_wins_over_exit_codes() {
    // Status 1 mapped to ConnectionError, but the traceback says ValueError: not retried.
    let env = Env::new();
    let mut flow = raising(&env, "ValueError", r#"["ConnectionError"]"#, 3);
    flow.push_str("exit_codes = { \"1\" = \"ConnectionError\" }\n");
    let ran = run(&env, &flow, 1);
    assert_eq!(ran.runs, 1);
    ran.reported("ValueError(Exception, BaseException): boom", TRACEBACK, 1);

    // With detection off the mapping applies.
    let env = Env::new();
    let mut flow = raising(&env, "ValueError", r#"["ConnectionError"]"#, 3);
    flow.push_str("exit_codes = { \"1\" = \"ConnectionError\" }\ndetect_errors = \"none\"\n");
    let ran = run(&env, &flow, 1);
    assert_eq!(ran.runs, 3);
    ran.reported("ConnectionError(OSError, Exception, BaseException): exit status 1", MAPPING, 3);
}

#[test]
fn a_successful_attempt_ignores_its_error_file() {
    let env = Env::new();
    let shell = format!(
        "echo ran >> {}; echo '{{\"type\": \"ConnectionError\"}}' > \"$WAYMARK_ERROR_FILE\"; exit 0",
        sh_quote(&runs_file(&env))
    );
    let flow = one_step(
        "",
        &format!("shell = {}", toml_str(&shell)),
        r#"{ attempts = 3, exception_types = ["ConnectionError"] }"#,
        "",
    );
    let ran = run(&env, &flow, 0);
    assert_eq!(ran.runs, 1);
    ran.shows("waymark: s: attempt 1/3 succeeded\n").lacks("failed");
}

// 9. Malformed error files never crash the runner and fall back to the next source.

/// Every kind of bad content `bad_error_file.py` writes, with what the warning must say.
const BAD_FILES: [(&str, &str); 10] = [
    ("garbage", "not valid JSON"),
    ("truncated", "not valid JSON"),
    ("huge", "larger than 65536 bytes"),
    ("type-number", r#""type" must be a string, not a number"#),
    ("type-missing", r#""type" is missing"#),
    ("bases-string", r#""bases" must be an array of strings, not a string"#),
    ("bases-number-item", r#""bases" must be an array of strings, but bases[1] is a number"#),
    ("message-object", r#""message" must be a string, not an object"#),
    ("type-not-a-name", r#""type" is not a class name: "Connection Error""#),
    ("array", "must hold a JSON object, not an array"),
];

/// Each warning names the attempt's error file and says what is wrong with it.
fn assert_bad_file_warnings(ran: &Ran, attempts: usize, why: &str) {
    let warnings = ran.error_file_warnings();
    assert_eq!(warnings.len(), attempts, "one warning per attempt:\n{}", ran.stderr);
    for (i, warning) in warnings.iter().enumerate() {
        let file = format!("/s/attempt-{}.error.json: ", i + 1);
        assert!(
            warning.contains(&file) && warning.contains(why),
            "warning {warning:?} should name {file:?} and say {why:?}"
        );
    }
}

#[test]
fn malformed_error_files_fall_back_to_called_process_error() {
    for (kind, why) in BAD_FILES {
        let env = Env::new();
        // Had the file been taken at its word (ConnectionError), the step would be retried.
        let flow = one_step(
            "",
            &python_run("bad_error_file.py", &[&runs_file(&env), kind, "exit"]),
            r#"{ attempts = 3, exception_types = ["ConnectionError"] }"#,
            "",
        );
        let ran = run(&env, &flow, 1);
        assert_eq!(ran.runs, 1, "{kind}:\n{}", ran.stderr);
        let error = format!("{CALLED_PROCESS_ERROR}: exit status 1");
        ran.attempt_failed(1, 3, &error, EXIT_STATUS, false).reported(&error, EXIT_STATUS, 1);
        assert_bad_file_warnings(&ran, 1, why);
    }
}

#[test]
fn malformed_error_files_fall_back_to_the_traceback() {
    for (kind, why) in BAD_FILES {
        let env = Env::new();
        let flow = one_step(
            "",
            &python_run("bad_error_file.py", &[&runs_file(&env), kind, "raise"]),
            r#"{ attempts = 2, exception_types = ["ConnectionError"] }"#,
            "",
        );
        let ran = run(&env, &flow, 1);
        assert_eq!(ran.runs, 2, "{kind}:\n{}", ran.stderr);
        let error = "ConnectionResetError(ConnectionError, OSError, Exception, BaseException): reset by peer";
        ran.attempt_failed(1, 2, error, TRACEBACK, true).reported(error, TRACEBACK, 2);
        assert_bad_file_warnings(&ran, 2, why);
    }
}

/// A victim file outside the run's files, with its contents and mode, to check it is left alone.
struct Victim {
    path: PathBuf,
    contents: Vec<u8>,
    mode: u32,
}

impl Victim {
    /// Holds a valid error report, so following a link to it would also change the classification.
    fn new(env: &Env) -> Victim {
        let path = env.write("victim.json", "{\"type\": \"ConnectionError\", \"message\": \"read through a link\"}\n");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        Victim { contents: std::fs::read(&path).unwrap(), mode: 0o644, path }
    }

    fn assert_untouched(&self) {
        let meta = std::fs::symlink_metadata(&self.path).expect("the victim still exists");
        assert!(meta.is_file(), "the victim is still a regular file");
        assert_eq!(meta.permissions().mode() & 0o7777, self.mode, "the victim's mode is unchanged");
        assert_eq!(std::fs::read(&self.path).unwrap(), self.contents, "the victim's contents are unchanged");
    }
}

fn shell_step(env: &Env, script: &str, retry: &str) -> String {
    let script = format!("echo \"$WAYMARK_ATTEMPT\" >> {}\n{script}", sh_quote(&runs_file(env)));
    one_step("", &format!("shell = {}", toml_str(&script)), retry, "")
}

#[test]
fn an_error_file_replaced_by_a_symlink_is_not_followed() {
    let env = Env::new();
    let victim = Victim::new(&env);
    let script = format!(
        "rm -f \"$WAYMARK_ERROR_FILE\" && ln -s {} \"$WAYMARK_ERROR_FILE\" || exit 99\nexit 1",
        sh_quote(&victim.path.display().to_string())
    );
    // ["Exception"]: CalledProcessError is retried, so a second attempt starts after the first
    // attempt's link is in place; the victim (a ConnectionError report) must not be read either.
    let ran = run(&env, &shell_step(&env, &script, r#"{ attempts = 2, exception_types = ["Exception"] }"#), 1);
    assert_eq!(ran.runs, 2);
    let error = format!("{CALLED_PROCESS_ERROR}: exit status 1");
    ran.attempt_failed(1, 2, &error, EXIT_STATUS, true).reported(&error, EXIT_STATUS, 2);
    assert_bad_file_warnings(&ran, 2, "is a symbolic link, which is not followed");
    victim.assert_untouched();
}

#[test]
fn an_error_file_replaced_by_a_fifo_or_directory_is_ignored() {
    for replace in ["mkfifo \"$WAYMARK_ERROR_FILE\"", "mkdir \"$WAYMARK_ERROR_FILE\""] {
        let env = Env::new();
        let script = format!("rm -f \"$WAYMARK_ERROR_FILE\" && {replace} || exit 99\nexit 1");
        let ran = run(&env, &shell_step(&env, &script, r#"{ attempts = 2, exception_types = ["Exception"] }"#), 1);
        assert_eq!(ran.runs, 2, "{replace}");
        ran.reported(&format!("{CALLED_PROCESS_ERROR}: exit status 1"), EXIT_STATUS, 2);
        assert_bad_file_warnings(&ran, 2, "is not a regular file");
    }
}

#[test]
fn a_symlink_planted_at_the_next_attempts_error_file_is_not_followed() {
    let env = Env::new();
    let victim = Victim::new(&env);
    let kinds = env.path("kinds").display().to_string();
    // Attempt 1 plants a link where attempt 2's error file goes (the same directory, named
    // attempt-2.error.json) and fails. Attempt 2 records what it was given, writes a report
    // through it, and fails: that report must land in a file of its own, not in the victim.
    let script = format!(
        r#"dir=$(dirname "$WAYMARK_ERROR_FILE")
case $WAYMARK_ATTEMPT in
1)
    [ "$(basename "$WAYMARK_ERROR_FILE")" = attempt-1.error.json ] || exit 98
    ln -s {victim} "$dir/attempt-2.error.json" || exit 99
    exit 1 ;;
*)
    [ "$WAYMARK_ERROR_FILE" = "$dir/attempt-$WAYMARK_ATTEMPT.error.json" ] || exit 98
    if [ -L "$WAYMARK_ERROR_FILE" ]; then echo link; elif [ -e "$WAYMARK_ERROR_FILE" ]; then echo exists; else echo absent; fi >> {kinds}
    printf '{{"type": "Planted", "bases": ["ConnectionError"], "message": "attempt %s"}}' "$WAYMARK_ATTEMPT" > "$WAYMARK_ERROR_FILE"
    exit 1 ;;
esac"#,
        victim = sh_quote(&victim.path.display().to_string()),
        kinds = sh_quote(&kinds),
    );
    let ran = run(
        &env,
        &shell_step(&env, &script, r#"{ attempts = 3, exception_types = ["Exception", "ConnectionError"] }"#),
        1,
    );
    assert_eq!(ran.runs, 3, "{}", ran.stderr);
    ran.attempt_failed(1, 3, &format!("{CALLED_PROCESS_ERROR}: exit status 1"), EXIT_STATUS, true)
        .attempt_failed(
            2,
            3,
            "Planted(ConnectionError, OSError, Exception, BaseException): attempt 2",
            ERROR_FILE,
            true,
        )
        .reported("Planted(ConnectionError, OSError, Exception, BaseException): attempt 3", ERROR_FILE, 3);
    assert!(ran.error_file_warnings().is_empty(), "{}", ran.stderr);
    victim.assert_untouched();
    // Each later attempt found nothing at its error file's path (the planted link was removed
    // before it started) and created the file itself.
    assert_eq!(env.read("kinds"), "absent\nabsent\n");
}

#[test]
fn an_error_file_counts_for_a_signal_death_but_not_for_a_timeout() {
    let report = r#"import json, os, signal, sys, time
with open(sys.argv[1], "a") as f:
    f.write("ran\n")
with open(os.environ["WAYMARK_ERROR_FILE"], "w") as f:
    json.dump({"type": "ConnectionResetError", "message": "reported"}, f)
if sys.argv[2] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(600)  # until the step's timeout ends it
"#;
    let retry = r#"{ attempts = 3, exception_types = ["ConnectionError"] }"#;
    let error = "ConnectionResetError(ConnectionError, OSError, Exception, BaseException): reported";

    // Killed by a signal waymark did not send: the error file still names the error.
    let env = Env::new();
    let script = env.write("report.py", report).display().to_string();
    let command = format!("run = [\"python3\", {}, {}, \"kill\"]", toml_str(&script), toml_str(&runs_file(&env)));
    let ran = run(&env, &one_step("", &command, retry, ""), 1);
    assert_eq!(ran.runs, 3);
    ran.attempt_failed(1, 3, error, ERROR_FILE, true).reported(error, ERROR_FILE, 3);

    // A timeout is always ActionTimeout, which ["ConnectionError"] does not retry.
    let env = Env::new();
    let script = env.write("report.py", report).display().to_string();
    let command = format!("run = [\"python3\", {}, {}, \"sleep\"]", toml_str(&script), toml_str(&runs_file(&env)));
    let ran = run(&env, &one_step("", &command, retry, "timeout = 1\nkill_grace = 0"), 1);
    assert_eq!(ran.runs, 1);
    ran.reported("ActionTimeout(BaseException): timed out after 1s", "timeout", 1);
}

#[test]
fn a_symlink_planted_at_the_next_attempts_log_files_is_not_followed() {
    let env = Env::new();
    let victim = Victim::new(&env);
    let script = format!(
        r#"dir=$(dirname "$WAYMARK_ERROR_FILE")
if [ "$WAYMARK_ATTEMPT" = 1 ]; then
    ln -s {victim} "$dir/attempt-2.stdout" && ln -s {victim} "$dir/attempt-2.stderr" || exit 99
fi
echo "stdout of attempt $WAYMARK_ATTEMPT"
echo "stderr of attempt $WAYMARK_ATTEMPT" >&2
exit 1"#,
        victim = sh_quote(&victim.path.display().to_string()),
    );
    let ran = run(&env, &shell_step(&env, &script, r#"{ attempts = 2, exception_types = ["Exception"] }"#), 1);
    assert_eq!(ran.runs, 2);
    victim.assert_untouched();
    // Nor is the victim read back into the failure report as the attempt's stderr.
    ran.lacks("read through a link");
}
