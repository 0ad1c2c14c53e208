//! Property tests over bad input, in process through the library: mutated flow files, mutated
//! error files and mutated Python tracebacks.
//!
//! - A flow file, however mangled, either loads or is refused with diagnostics that each carry a
//!   line and column, and drawing them never panics.
//! - An error file is reported, ignored as empty, or ignored with a warning that names it; a
//!   reported class is an identifier.
//! - A traceback names an identifier class or nothing.
//!
//! Inputs are bounded in size, so every case is bounded in time. `WAYMARK_LONG=1` runs many more
//! cases (see `common::long_mode`).

mod common;

use proptest::prelude::*;
use proptest::test_runner::Config;
use std::path::Path;
use waymark::classify::error_file::{ErrorFileOutcome, parse_error_file};
use waymark::classify::traceback::parse_traceback;
use waymark::flow::{self, Diagnostic};

fn config(ci: u32, long: u32) -> Config {
    Config { cases: if common::long_mode() { long } else { ci }, ..Config::default() }
}

/// Valid flows to start from: the shipped examples, one that uses every key of the first format,
/// and one with the workflow structure (needs, catch, compensate, hooks, params, ...).
fn seeds() -> Vec<String> {
    let mut seeds: Vec<String> = ["hello", "python", "retry", "timeout", "fanout"]
        .iter()
        .map(|name| {
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples").join(format!("{name}.toml"));
            std::fs::read_to_string(path).expect("example flow")
        })
        .collect();
    seeds.push(
        r#"name = "every-key"
env = { REGION = "eu" }

[defaults]
timeout = "10m"
retry = "net"
kill_signal = "SIGTERM"
kill_grace = "10s"
detect_errors = "auto"

[policies.net]
attempts = 5
exception_types = ["ConnectionError", "Busy"]
backoff_seconds = 1
backoff_multiplier = 2
backoff_max_seconds = 30
jitter = true

[errors]
Busy = ["ConnectionError"]
Bad = []
Both = ["Busy", "Bad"]

[exit_codes]
"75" = "Busy"
"SIGSEGV" = "RuntimeError"

[[step]]
name = "fetch"
run = ["curl", "-fsS", "https://example.com"]

[[step]]
name = "load"
shell = "python3 load.py"
timeout = 90
retry = { attempts = 3, exception_types = ["OSError"], backoff_seconds = 0.5 }
exit_codes = { "3" = "Bad" }
workdir = "jobs"
env = { BATCH = "500" }
"#
        .to_owned(),
    );
    seeds.push(
        r#"name = "structure"
max_parallel = 2
fail_fast = true
timeout = "1h"
env_file = ".env"
secret_env = ["API_TOKEN"]

[params]
date = {}
region = "eu"

[hooks]
on_success = ["notify", "ok"]
on_failure = "page"
on_exit = ["true"]

[[step]]
name = "a"
needs = []
run = ["true"]
catch = [{ exception_types = ["ActionTimeout"], shell = "true" }, {}]

[[step]]
name = "b"
needs = []
run = ["true"]
compensate = ["rm", "b"]

[[step]]
name = "c"
needs = ["a", "b"]
shell = "true"
compensate = "rm c"

[[step.catch]]
exception_types = ["OSError"]
run = ["true"]

[[step]]
name = "d"
run = ["true"]
"#
        .to_owned(),
    );
    seeds
}

/// Values a hostile or careless author might write after any `=`.
const VALUES: &[&str] = &[
    "0",
    "-1",
    "1e-10",
    "1e10",
    "1e308",
    "-1e308",
    "1e400",
    "nan",
    "inf",
    "-inf",
    "9223372036854775807",
    "\"\"",
    "\"\\u0000\"",
    "\"a\\u0000b\"",
    "\"100us\"",
    "\"101years\"",
    "\"SIGFOO\"",
    "[]",
    "[[]]",
    "[{}]",
    "[\"a\"]",
    "[\"a\", \"a\"]",
    "[\"d\", \"c\"]",
    "[\"WorkflowTimeout\"]",
    "[{ run = [] }]",
    "[{ exception_types = [], run = [\"x\"], shell = \"y\" }]",
    "{}",
    "{ attempts = 0 }",
    "{ backoff_multiplier = 1e300, attempts = 1000000 }",
    "true",
    "1979-05-27T07:32:00Z",
    "'''\nmulti\nline'''",
    "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",
];

/// Keys from every table of the format, and some that are not.
const KEYS: &[&str] = &[
    "name",
    "env",
    "run",
    "shell",
    "timeout",
    "retry",
    "exit_codes",
    "workdir",
    "kill_signal",
    "kill_grace",
    "detect_errors",
    "attempts",
    "exception_types",
    "backoff_seconds",
    "backoff_multiplier",
    "backoff_max_seconds",
    "jitter",
    "needs",
    "catch",
    "compensate",
    "max_parallel",
    "fail_fast",
    "env_file",
    "secret_env",
    "on_success",
    "on_failure",
    "on_exit",
    "date",
    "[hooks]",
    "[params]",
    "[[step.catch]]",
    "[defaults]",
    "[[step]]",
    "[step]",
    "[errors]",
    "[policies.x]",
    "[exit_codes]",
    "atempts",
    "a.b.c",
    "\"\"",
    "'quoted key'",
];

#[derive(Debug, Clone)]
enum Mutation {
    FlipByte {
        at: usize,
        to: u8,
    },
    InsertBytes {
        at: usize,
        bytes: Vec<u8>,
    },
    DeleteRange {
        at: usize,
        len: usize,
    },
    DeleteLine {
        line: usize,
    },
    /// Keep the lines before `line` only: a file cut short (often before its first step).
    TruncateLines {
        line: usize,
    },
    DuplicateLine {
        line: usize,
    },
    SwapLines {
        a: usize,
        b: usize,
    },
    ReplaceValue {
        line: usize,
        value: usize,
    },
    ReplaceKey {
        line: usize,
        key: usize,
    },
    InsertLine {
        line: usize,
        key: usize,
        value: usize,
    },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let at = any::<usize>();
    prop_oneof![
        (at, any::<u8>()).prop_map(|(at, to)| Mutation::FlipByte { at, to }),
        (at, proptest::collection::vec(any::<u8>(), 1..8)).prop_map(|(at, bytes)| Mutation::InsertBytes { at, bytes }),
        (at, 1usize..40).prop_map(|(at, len)| Mutation::DeleteRange { at, len }),
        at.prop_map(|line| Mutation::DeleteLine { line }),
        at.prop_map(|line| Mutation::TruncateLines { line }),
        at.prop_map(|line| Mutation::DuplicateLine { line }),
        (at, at).prop_map(|(a, b)| Mutation::SwapLines { a, b }),
        (at, 0..VALUES.len()).prop_map(|(line, value)| Mutation::ReplaceValue { line, value }),
        (at, 0..KEYS.len()).prop_map(|(line, key)| Mutation::ReplaceKey { line, key }),
        (at, 0..KEYS.len(), 0..VALUES.len()).prop_map(|(line, key, value)| Mutation::InsertLine { line, key, value }),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    let n = bytes.len().max(1);
    match m {
        Mutation::FlipByte { at, to } => {
            if !bytes.is_empty() {
                bytes[at % n] = *to;
            }
        }
        Mutation::InsertBytes { at, bytes: new } => {
            let at = at % (bytes.len() + 1);
            bytes.splice(at..at, new.iter().copied());
        }
        Mutation::DeleteRange { at, len } => {
            let start = at % n.min(bytes.len().max(1));
            let end = (start + len).min(bytes.len());
            if start < end {
                bytes.drain(start..end);
            }
        }
        _ => {
            let text = String::from_utf8_lossy(bytes).into_owned();
            let mut lines: Vec<String> = text.split('\n').map(str::to_owned).collect();
            let count = lines.len();
            match m {
                Mutation::DeleteLine { line } => {
                    lines.remove(line % count);
                }
                Mutation::TruncateLines { line } => lines.truncate(line % count),
                Mutation::DuplicateLine { line } => {
                    let l = lines[line % count].clone();
                    lines.insert(line % count, l);
                }
                Mutation::SwapLines { a, b } => lines.swap(a % count, b % count),
                Mutation::ReplaceValue { line, value } => {
                    let l = &mut lines[line % count];
                    if let Some(eq) = l.find('=') {
                        l.replace_range(eq + 1.., &format!(" {}", VALUES[*value]));
                    }
                }
                Mutation::ReplaceKey { line, key } => {
                    let l = &mut lines[line % count];
                    match l.find('=') {
                        Some(eq) => l.replace_range(..eq, &format!("{} ", KEYS[*key])),
                        None => *l = KEYS[*key].to_owned(),
                    }
                }
                Mutation::InsertLine { line, key, value } => {
                    lines.insert(line % (count + 1), format!("{} = {}", KEYS[*key], VALUES[*value]));
                }
                _ => unreachable!("byte mutations are handled above"),
            }
            *bytes = lines.join("\n").into_bytes();
        }
    }
}

/// Everything `waymark check` does with a file's bytes, in process.
fn check(bytes: Vec<u8>) -> Result<Vec<Diagnostic>, (String, Vec<Diagnostic>)> {
    let source = flow::decode(bytes).map_err(|bad| (bad.0, vec![bad.1]))?;
    match flow::parse(&source, Path::new("/work/flow.toml")) {
        Ok((_, warnings)) => {
            assert_located(&source, &warnings);
            Ok(warnings)
        }
        Err(diags) => Err((source, diags)),
    }
}

fn assert_located(text: &str, diags: &[Diagnostic]) {
    for d in diags {
        let loc = d.location.unwrap_or_else(|| panic!("no line and column: {d:?}\n--- file:\n{text}"));
        assert!(loc.line >= 1 && loc.column >= 1, "{d:?}");
        let drawn = d.render("flow.toml", text, false);
        let arrow = format!("flow.toml:{}:{}", loc.line, loc.column);
        assert!(drawn.contains(&arrow), "the drawing points elsewhere than {arrow}:\n{drawn}");
    }
}

/// Mutations start from valid flows: a seed that stopped loading would test only one error.
#[test]
fn every_seed_loads() {
    for (i, seed) in seeds().iter().enumerate() {
        let loaded = flow::parse(seed, Path::new("/work/flow.toml"));
        assert!(loaded.is_ok(), "seed {i} does not load: {loaded:?}");
    }
}

proptest! {
    #![proptest_config(config(1_500, 50_000))]

    #[test]
    fn mutated_flow_files_load_or_say_where(
        seed in 0usize..7,
        mutations in proptest::collection::vec(mutation(), 1..6),
    ) {
        let mut bytes = seeds()[seed].clone().into_bytes();
        for m in &mutations {
            apply(&mut bytes, m);
        }
        if let Err((text, diags)) = check(bytes) {
            prop_assert!(diags.iter().any(Diagnostic::is_error), "refused without an error: {diags:?}");
            assert_located(&text, &diags);
        }
    }
}

/// A valid error file to start from.
const ERROR_FILE: &str = r#"{"type": "httpx.ConnectTimeout", "bases": ["TimeoutException", "TransportError", "Exception"], "message": "timed out"}"#;

/// JSON fragments to splice in.
const JSON_BITS: &[&str] = &[
    "null",
    "{}",
    "[]",
    "\"\"",
    "\"a.b.\"",
    "\"\\u0000\"",
    "\"\\ud800\"",
    "1e400",
    "-0",
    "true",
    "{\"type\": 1}",
    ",",
    ":",
    "\"type\"",
    "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",
];

fn assert_error_file_outcome(bytes: &[u8]) {
    match parse_error_file(bytes, "e.json") {
        ErrorFileOutcome::Empty => {}
        ErrorFileOutcome::Reported(r) => {
            assert!(
                !r.class.is_empty() && !r.class.contains('.') && !r.class.starts_with(|c: char| c.is_ascii_digit()),
                "not a bare class name: {r:?}"
            );
            for base in r.bases.iter().flatten() {
                assert!(!base.is_empty() && !base.contains('.'), "not a bare class name: {base:?}");
            }
        }
        ErrorFileOutcome::Invalid(why) => assert!(why.starts_with("error file e.json: "), "{why}"),
    }
}

proptest! {
    #![proptest_config(config(2_000, 100_000))]

    #[test]
    fn mutated_error_files_are_reported_or_ignored_with_a_reason(
        edits in proptest::collection::vec((any::<usize>(), 0..JSON_BITS.len() + 2, any::<u8>()), 1..6),
    ) {
        let mut bytes = ERROR_FILE.as_bytes().to_vec();
        for (at, what, byte) in &edits {
            let at = at % (bytes.len() + 1);
            match what {
                0 => bytes.insert(at, *byte),
                1 => { bytes.truncate(at); }
                i => { bytes.splice(at..at, JSON_BITS[i - 2].bytes()); }
            }
        }
        assert_error_file_outcome(&bytes);
    }

    #[test]
    fn arbitrary_bytes_as_an_error_file_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        assert_error_file_outcome(&bytes);
    }
}

/// A chained traceback to start from.
const TRACEBACK: &str = "INFO:root:starting\n\
Traceback (most recent call last):\n  File \"a.py\", line 3, in <module>\n    f()\nKeyError: 'x'\n\n\
During handling of the above exception, another exception occurred:\n\n\
Traceback (most recent call last):\n  File \"a.py\", line 5, in <module>\n    g()\n    ~^^\n\
requests.exceptions.ConnectionError: HTTPSConnectionPool(host='example.com', port=443)\n";

const TRACEBACK_BITS: &[&str] = &[
    "Traceback (most recent call last):",
    "  + Exception Group Traceback (most recent call last):",
    "  | ",
    "  | ExceptionGroup: many (2 sub-exceptions)",
    "  +-+---------------- 1 ----------------",
    "\x1b[1;35mValueError\x1b[0m: \x1b[35mbad\x1b[0m",
    "\x1b[",
    "ValueError",
    "a.b.: x",
    ".: x",
    "1Error: x",
    "    raise",
    "\r",
    "\u{feff}",
    "ÿ",
    "",
];

proptest! {
    #![proptest_config(config(2_000, 100_000))]

    #[test]
    fn mutated_tracebacks_name_an_identifier_or_nothing(
        edits in proptest::collection::vec((any::<usize>(), 0..TRACEBACK_BITS.len() + 3, any::<char>()), 1..8),
    ) {
        let mut lines: Vec<String> = TRACEBACK.split('\n').map(str::to_owned).collect();
        for (at, what, ch) in &edits {
            let line = at % lines.len();
            match what {
                0 => { lines.remove(line); if lines.is_empty() { lines.push(String::new()); } }
                1 => {
                    // Cut a line at a char boundary, as a 64 KiB tail may start mid-line.
                    let l = &mut lines[line];
                    let cut = (0..=l.len()).filter(|i| l.is_char_boundary(*i)).nth(at % (l.chars().count() + 1)).unwrap_or(0);
                    l.truncate(cut);
                }
                2 => { let pos = at % (lines[line].chars().count() + 1); let byte = lines[line].char_indices().nth(pos).map_or(lines[line].len(), |(i, _)| i); lines[line].insert(byte, *ch); }
                i => lines.insert(line, TRACEBACK_BITS[i - 3].to_owned()),
            }
        }
        let text = lines.join("\n");
        if let Some(found) = parse_traceback(&text) {
            prop_assert!(
                !found.class.is_empty()
                    && found.class.chars().all(|c| c.is_alphanumeric() || c == '_')
                    && !found.class.starts_with(|c: char| c.is_ascii_digit()),
                "not an identifier: {found:?} from\n{text}"
            );
        }
    }

    #[test]
    fn arbitrary_text_as_stderr_never_panics(text in "(?s).{0,400}") {
        let _ = parse_traceback(&text);
    }
}
