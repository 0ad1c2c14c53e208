//! Regressions for the flow-file defects of issue 7, end to end through the real binary: backoff
//! arithmetic that must stay total (defect 1), class hierarchies that took exponential time or
//! overflowed the stack (defect 3), diagnostics that were quadratic in the number of errors
//! (defect 7), and a flow file read without a size limit (defect 10). The same for `needs` (issue
//! 9): many unknown names, and a graph whose every step closes a cycle as long as the file.
//!
//! No test measures time: the inputs are sized so that the old code would not finish within the
//! harness's patience (`common::PATIENCE`), or would crash.

mod common;

use common::Env;

/// The flow's failure and retry lines (`attempt N/M failed: ...`, `retry now: ...`), in order.
fn failed_lines(stderr: &str) -> Vec<String> {
    common::untimed(stderr)
        .lines()
        .filter(|l| l.contains(" failed: ") || l.contains(": retry "))
        .map(str::to_owned)
        .collect()
}

fn exhausted_without_waiting(attempts: u32) -> Vec<String> {
    let error = "CalledProcessError: exit status 1 [exit status]";
    (1..=attempts)
        .flat_map(|k| {
            let failed = format!("waymark: a: attempt {k}/{attempts} failed: {error}");
            let then = (k < attempts).then(|| format!("waymark: a: retry now: attempt {}/{attempts}", k + 1));
            std::iter::once(failed).chain(then)
        })
        .collect()
}

/// `check` prints the waits `run` sleeps: a zero first wait stays zero however fast it would
/// grow (it was `0 × ∞ = NaN`), growth past 100 years saturates, and a multiplier has no upper
/// bound (1e10 was refused as "must be at least 1.0").
#[test]
fn check_shows_the_backoff_that_run_sleeps() {
    let env = Env::new();
    env.write(
        "flow.toml",
        "[[step]]\nname = 'doubling'\nrun = ['false']\nretry = { attempts = 2000, backoff_multiplier = 2 }\n\
         [[step]]\nname = 'huge'\nrun = ['false']\nretry = { attempts = 40, backoff_multiplier = 1e9, backoff_max_seconds = 3 }\n\
         [[step]]\nname = 'saturating'\nrun = ['false']\nretry = { attempts = 2000, backoff_seconds = 1, backoff_multiplier = 2 }\n\
         [[step]]\nname = 'steep'\nrun = ['false']\nretry = { attempts = 10, backoff_seconds = 0.5, backoff_multiplier = 1e10, backoff_max_seconds = 60 }\n",
    );
    let retry = "retry:    up to";
    env.cmd(&["check", "flow.toml"]).assert().success().stdout(format!(
        "flow flow (flow.toml): 4 steps, run in order\n\
         \x20 1. doubling\n     command:  false\n     timeout:  none (an attempt may run forever)\n     \
         {retry} 2000 attempts on Exception\n     backoff:  none: each retry starts at once\n\
         \x20 2. huge\n     command:  false\n     timeout:  none (an attempt may run forever)\n     \
         {retry} 40 attempts on Exception\n     backoff:  none: each retry starts at once\n\
         \x20 3. saturating\n     command:  false\n     timeout:  none (an attempt may run forever)\n     \
         {retry} 2000 attempts on Exception\n     backoff:  1s, 2s, 4s, 8s, 16s, … 100years at retry 33 to 1999\n\
         \x20 4. steep\n     command:  false\n     timeout:  none (an attempt may run forever)\n     \
         {retry} 10 attempts on Exception\n     backoff:  500ms, 1m, 1m, 1m, 1m, … 1m at retry 6 to 9\n"
    ));
}

/// `backoff_multiplier = 1e9` with no first wait: retry 36 computed `0 × 1e9^35 = NaN` and the
/// runner panicked (exit 101) before recording the attempt, on every resume; with a cap, NaN
/// became a 3 s wait that `check` did not show. Both now run to exhaustion without waiting.
#[test]
fn a_zero_backoff_that_would_overflow_runs_to_exhaustion_without_waiting() {
    for cap in ["", ", backoff_max_seconds = 3"] {
        let env = Env::new();
        env.write(
            "flow.toml",
            &format!(
                "[[step]]\nname = 'a'\nrun = ['false']\nretry = {{ attempts = 40, backoff_multiplier = 1e9{cap} }}\n"
            ),
        );
        let out = env.cmd(&["run", "flow.toml"]).output().unwrap();
        let stderr = common::stderr(&out);
        assert_eq!(out.status.code(), Some(1), "cap {cap:?}: {stderr}");
        assert_eq!(failed_lines(&stderr), exhausted_without_waiting(40), "cap {cap:?}");
    }
}

fn ladder(levels: usize) -> String {
    let mut src = String::from("[errors]\nA0 = []\nB0 = []\n");
    for i in 1..=levels {
        src.push_str(&format!("A{i} = [\"A{0}\", \"B{0}\"]\nB{i} = [\"A{0}\", \"B{0}\"]\n", i - 1));
    }
    src.push_str(&format!(
        "\n[[step]]\nname = 'a'\nrun = ['true']\nretry = {{ attempts = 2, exception_types = ['A{levels}'] }}\n"
    ));
    src
}

/// `Ai = [A(i-1), B(i-1)]`, `Bi` the same: each level cost 4 times the one before (23 levels took
/// 20 s); 60 levels would take longer than the universe has existed.
#[test]
fn a_sixty_level_ladder_of_error_classes_checks() {
    let env = Env::new();
    env.write("flow.toml", &ladder(60));
    env.cmd(&["check", "flow.toml"]).assert().success().stdout(
        "flow flow (flow.toml): 1 step, run in order\n  1. a\n     command:  true\n     \
         timeout:  none (an attempt may run forever)\n     retry:    up to 2 attempts on A60\n     \
         backoff:  none: each retry starts at once\n",
    );
}

fn chain(classes: usize) -> String {
    let mut src = String::from("[errors]\nC0 = []\n");
    for i in 1..classes {
        src.push_str(&format!("C{i} = [\"C{}\"]\n", i - 1));
    }
    src.push_str("\n[[step]]\nname = 'a'\nrun = ['true']\n");
    src
}

/// A 1,000-class chain took 58 s; it is within the limits and checks.
#[test]
fn a_thousand_class_chain_checks() {
    let env = Env::new();
    env.write(
        "flow.toml",
        &chain(998).replace("run = ['true']", "run = ['true']\nretry = { exception_types = ['C997'] }"),
    );
    env.cmd(&["check", "flow.toml"]).assert().success();
}

/// A 100,000-class chain overflowed the stack (exit 134); it is refused with a diagnostic.
#[test]
fn a_hundred_thousand_class_chain_is_refused_not_crashing() {
    let env = Env::new();
    env.write("flow.toml", &chain(100_000));
    env.cmd(&["check", "flow.toml"]).env("NO_COLOR", "1").assert().code(2).stdout("").stderr(
        "error: `errors.C10000`: [errors] declares 100000 classes, more than the 10000 waymark accepts\n     \
         --> flow.toml:10002:1\n      |\n10002 | C10000 = [\"C9999\"]\n      | ^^^^^^ class number 10001\n      |\n      \
         = help: declare only the classes your steps report or match on\n\n\
         error: flow.toml is not a valid flow (1 error); nothing was run\n",
    );
}

/// Every diagnostic re-parsed the whole file: 10,000 invalid steps took 93 s to report.
#[test]
fn ten_thousand_invalid_steps_are_all_reported() {
    let env = Env::new();
    let src: String =
        (0..10_000).map(|i| format!("[[step]]\nname = 's{i}'\nrun = ['true']\nretry = {{ attempts = 0 }}\n")).collect();
    env.write("flow.toml", &src);
    let out = env.cmd(&["check", "flow.toml"]).env("NO_COLOR", "1").output().unwrap();
    let stderr = common::stderr(&out);
    assert_eq!(out.status.code(), Some(2));
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error: `step[")).collect();
    assert_eq!(errors.len(), 10_000);
    assert_eq!(
        errors[9_999],
        "error: `step[9999].retry.attempts`: `attempts` counts total executions and must be at least 1"
    );
    assert!(stderr.contains(" --> flow.toml:40000:22\n"), "the last error points at its line");
    assert!(stderr.ends_with("\nerror: flow.toml is not a valid flow (10000 errors); nothing was run\n"));
}

/// 5,000 warnings on a valid flow delayed `check` and the start of `run` by 40 s.
#[test]
fn five_thousand_warnings_are_all_reported_and_the_flow_checks() {
    let env = Env::new();
    let src: String = (0..5_000)
        .map(|i| format!("[[step]]\nname = 's{i}'\nrun = ['true']\nretry = {{ exception_types = ['Unknown{i}'] }}\n"))
        .collect();
    env.write("flow.toml", &src);
    let out = env.cmd(&["check", "flow.toml"]).env("NO_COLOR", "1").output().unwrap();
    let stderr = common::stderr(&out);
    assert_eq!(out.status.code(), Some(0));
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.starts_with("warning: ")).collect();
    assert_eq!(warnings.len(), 5_000);
    assert_eq!(
        warnings[4_999],
        "warning: `step[4999].retry.exception_types[0]`: no known class is named `Unknown4999`"
    );
}

/// A flow file was read without a limit: `waymark check /dev/zero` read until memory ran out.
#[test]
fn a_flow_file_over_16_mib_is_refused() {
    let env = Env::new();
    let comment = format!("#{}\n", "x".repeat(1022));
    let path = env.write("big.toml", &comment.repeat(16 * 1024));
    // Exactly 16 MiB is read; one byte more is refused.
    env.cmd(&["check", "big.toml"]).assert().code(2).stderr(predicates::str::contains("the flow has no steps"));
    std::fs::write(&path, comment.repeat(16 * 1024) + "\n").unwrap();
    let refused = "error: flow file big.toml is larger than 16 MiB, the most waymark reads; check that it is the \
                   flow file you meant\n";
    env.cmd(&["check", "big.toml"]).assert().code(2).stdout("").stderr(refused);
    env.cmd(&["check", "/dev/zero"]).assert().code(2).stdout("").stderr(refused.replace("big.toml", "/dev/zero"));
}

/// `needs` naming no step, 20,000 times: each is reported, at its place, without looking every
/// name up against every step more than a bounded number of times.
#[test]
fn twenty_thousand_unknown_needs_are_all_reported() {
    let env = Env::new();
    let src: String =
        (0..20_000).map(|i| format!("[[step]]\nname = 's{i}'\nneeds = ['gone{i}']\nrun = ['true']\n")).collect();
    env.write("flow.toml", &src);
    let out = env.cmd(&["check", "flow.toml"]).env("NO_COLOR", "1").output().unwrap();
    let stderr = common::stderr(&out);
    assert_eq!(out.status.code(), Some(2));
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error: `step[")).collect();
    assert_eq!(errors.len(), 20_000);
    assert_eq!(errors[19_999], "error: `step[19999].needs[0]`: no step named `gone19999`");
    assert!(stderr.ends_with("\nerror: flow.toml is not a valid flow (20000 errors); nothing was run\n"));
}

/// Every step needs the next one and the first: each of the 49,999 entries naming the first step
/// closes a cycle as long as the walk to it, which spelled out would be quadratic in time and in
/// output. The first cycles are reported, shortened in the middle.
#[test]
fn fifty_thousand_cycles_report_the_first_ones_shortened() {
    let env = Env::new();
    let n = 50_000;
    let src: String = (0..n)
        .map(|i| {
            let needs = match i {
                0 => "['s1']".to_owned(),
                _ if i + 1 < n => format!("['s{}', 's0']", i + 1),
                _ => "['s0']".to_owned(),
            };
            format!("[[step]]\nname = 's{i}'\nneeds = {needs}\nrun = ['true']\n")
        })
        .collect();
    env.write("flow.toml", &src);
    let out = env.cmd(&["check", "flow.toml"]).env("NO_COLOR", "1").output().unwrap();
    let stderr = common::stderr(&out);
    assert_eq!(out.status.code(), Some(2));
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error: `step[")).collect();
    // In the order of the file: the walk found the last 20 entries first.
    assert_eq!(errors.len(), 20, "{stderr}");
    assert_eq!(
        errors[0],
        "error: `step[49980].needs[1]`: steps need each other in a cycle: s0 -> s1 -> s2 -> s3 -> s4 -> … 49972 more … \
         -> s49977 -> s49978 -> s49979 -> s49980 -> s0"
    );
    assert!(stderr.contains("only the first 20 cycles are reported"), "{stderr}");
}
