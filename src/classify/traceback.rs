//! Finding the error class in a Python traceback at the end of a child's stderr.
//!
//! A Python program that dies of an uncaught exception exits with status 1 after printing
//!
//! ```text
//! Traceback (most recent call last):
//!   File "fetch.py", line 8, in <module>
//!     fetch()
//!     ~~~~~^^
//! requests.exceptions.ConnectionError: boom
//! ```
//!
//! possibly preceded by the tracebacks of the exceptions it chains to. The class is the name on the
//! exception line of the *last* traceback, without its module. Exception groups print their whole
//! display inside a `  | ` margin; their class is the group's own (`ExceptionGroup`), taken from the
//! first unindented line inside the top-level margin.
//!
//! The input is only the tail of stderr, so it may start mid-line. The traceback must be what
//! stderr ends with: output after it means the program went on after printing it, and nothing is
//! reported. The exception line may be followed by more lines when the message has several lines
//! (or the exception has notes); those are accepted unless the exception has no message or they
//! look like log records (`INFO:root:...`, `2024-05-01 ...`) or are not text. A multi-line message
//! and plain output printed after a handled exception cannot be told apart in general; this errs on
//! the side of the message. A traceback Python printed for an exception that did not end the
//! process (a thread's, or one ignored in a destructor) is not taken, whatever follows it.

use std::borrow::Cow;

use super::error_file::is_class_name;

/// The exception a traceback ends with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracebackError {
    /// The bare class name, without its module (`ConnectionError`).
    pub class: String,
    /// The name as the traceback printed it, module and all (`requests.exceptions.ConnectionError`).
    pub printed: String,
    /// The first line of the message; empty if the exception had none.
    pub message: String,
}

const HEADER: &str = "Traceback (most recent call last):";
const GROUP_HEADER: &str = "  + Exception Group Traceback (most recent call last):";
/// The margin of the top-level exception group's own frames and exception line.
const GROUP_MARGIN: &str = "  | ";

/// The exception that `stderr_tail` ends with, if it ends with a Python traceback.
pub fn parse_traceback(stderr_tail: &str) -> Option<TracebackError> {
    // Python 3.13+ colours tracebacks when FORCE_COLOR or PYTHON_COLORS is set.
    let text = strip_ansi(stderr_tail);
    let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
    let end = lines.iter().rposition(|line| !line.is_empty())? + 1;
    let lines = &lines[..end];
    if let Some(error) = syntax_error(lines) {
        return Some(error);
    }

    // Chained exceptions print oldest first, so the last top-level header is the one that counts.
    // Headers inside an exception group are indented behind its margin and do not match.
    let start = lines.iter().rposition(|&line| line == HEADER || line == GROUP_HEADER)?;
    let before = line_before_chain(&lines[..start]);
    if before.is_some_and(not_the_process_s) {
        return None;
    }
    let body = &lines[start + 1..];
    if lines[start] == GROUP_HEADER { parse_group(body) } else { parse_plain(body, before.is_some_and(logs_an_error)) }
}

/// The error of a script Python could not compile, which it prints without a traceback's header:
///
/// ```text
///   File "/srv/job/load.py", line 3
///     x = = 1
///         ^
/// SyntaxError: invalid syntax
/// ```
///
/// Its one frame names no function (`, in f`), as every frame of a traceback does.
fn syntax_error(lines: &[&str]) -> Option<TracebackError> {
    const CLASSES: [&str; 3] = ["SyntaxError", "IndentationError", "TabError"];
    let (&last, before) = lines.split_last()?;
    let error = exception_line(last).filter(|e| CLASSES.contains(&e.printed.as_str()))?;
    let block = before.iter().rev().take_while(|l| is_indented(l)).count();
    let frame = before.get(before.len().checked_sub(block)?)?;
    let line_number = frame.strip_prefix("  File \"").and_then(|f| f.rsplit_once("\", line ")).map(|(_, n)| n);
    let alone =
        (1..=4).contains(&block) && line_number.is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    alone.then_some(error)
}

/// The sentences Python prints between the tracebacks of a chain.
const CHAINED: [&str; 2] = [
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
];

/// The last line with text before the first traceback of the chain whose last header follows
/// `before`, if any.
fn line_before_chain<'a>(mut before: &[&'a str]) -> Option<&'a str> {
    loop {
        let at = before.iter().rposition(|l| !l.is_empty())?;
        if !CHAINED.contains(&before[at]) {
            return Some(before[at]);
        }
        // The earlier traceback of the chain: look before its header.
        let header = before[..at].iter().rposition(|&l| l == HEADER || l == GROUP_HEADER)?;
        before = &before[..header];
    }
}

/// Whether `line`, just before a traceback, says that Python printed it for an exception that did
/// not end the process: a thread's (`Exception in thread NAME:`, from `threading.excepthook`), one
/// that could not be raised (`Exception ignored in: ...`, from a destructor or a callback), one
/// asyncio's handler reports (`future: <Task ...>`, `handle: <...>`), or logging's own.
fn not_the_process_s(line: &str) -> bool {
    let thread = line.starts_with("Exception in thread ") && line.ends_with(':');
    let asyncio = line.starts_with("future: <") || line.starts_with("handle: <");
    thread || asyncio || line.starts_with("Exception ignored in") || line == "--- Logging error ---"
}

/// The lines after `Traceback (most recent call last):`: frames, the exception line, and maybe
/// the rest of a multi-line message. `logged`: a log record comes right before the traceback
/// (`logging.exception` writes the two for a handled exception); then lines after the exception
/// line are output that went on after it, not its message.
fn parse_plain(body: &[&str], logged: bool) -> Option<TracebackError> {
    let frames = count_frames(body.iter().copied());
    if frames == 0 {
        return None;
    }
    let (&line, rest) = body[frames..].split_first()?;
    let error = exception_line(line)?;
    let continued = !rest.is_empty();
    let not_message = |l: &&str| looks_like_log_record(l) || !is_text(l);
    if continued && (error.message.is_empty() || logged || rest.iter().any(not_message)) {
        return None;
    }
    Some(error)
}

/// The lines after `  + Exception Group Traceback (most recent call last):`, e.g.
///
/// ```text
///   |   File "eg.py", line 8, in main
///   |     raise ExceptionGroup("many", errs)
///   | ExceptionGroup: many (2 sub-exceptions)
///   +-+---------------- 1 ----------------
///     | ValueError: a
///     +------------------------------------
/// ```
fn parse_group(body: &[&str]) -> Option<TracebackError> {
    let frames = count_frames(body.iter().map_while(|l| l.strip_prefix(GROUP_MARGIN)));
    if frames == 0 {
        return None;
    }
    let error = exception_line(body.get(frames)?.strip_prefix(GROUP_MARGIN)?)?;
    // The display ends with the rule closing the last sub-exception; anything else after it is
    // other output.
    let last = body.last()?.trim_start();
    let closed = last.starts_with("+-") && last.chars().all(|c| c == '+' || c == '-');
    closed.then_some(error)
}

/// How many frame lines `lines` starts with: indented lines, the first of them `File "..."`.
fn count_frames<'a>(lines: impl Iterator<Item = &'a str>) -> usize {
    let mut count = 0;
    for line in lines {
        let first_is_file = count > 0 || line.trim_start().starts_with("File \"");
        if !is_indented(line) || !first_is_file {
            break;
        }
        count += 1;
    }
    count
}

/// Parse an exception line, `pkg.mod.Name: message` or a bare `pkg.mod.Name`.
fn exception_line(line: &str) -> Option<TracebackError> {
    if is_indented(line) {
        return None;
    }
    let (path, message) = match line.split_once(':') {
        Some((path, message)) => (path, message.strip_prefix(' ').unwrap_or(message)),
        None => (line, ""),
    };
    Some(TracebackError {
        class: class_in_path(path)?.to_string(),
        printed: path.to_string(),
        message: message.to_string(),
    })
}

/// The class name at the end of a dotted path such as `requests.exceptions.ConnectionError` or
/// `main.<locals>.MyError` (a class defined in a function).
fn class_in_path(path: &str) -> Option<&str> {
    let mut parts = path.rsplit('.');
    let class = parts.next().filter(|name| is_class_name(name))?;
    parts.all(|part| part == "<locals>" || is_class_name(part)).then_some(class)
}

fn is_indented(line: &str) -> bool {
    line.starts_with([' ', '\t'])
}

/// The levels of log records, as loggers write them.
const LOG_LEVELS: [&str; 7] = ["DEBUG", "INFO", "WARNING", "WARN", "ERROR", "CRITICAL", "FATAL"];

/// Whether `line` looks like the start of a log record (`INFO:root:...`, `[ERROR] ...`,
/// `2024-05-01 12:00:00,123 ...`): a sign the program kept writing after printing the traceback
/// rather than the continuation of a multi-line message.
fn looks_like_log_record(line: &str) -> bool {
    let line = line.strip_prefix('[').unwrap_or(line);
    let level = LOG_LEVELS.iter().any(|level| {
        line.strip_prefix(level).is_some_and(|rest| !rest.starts_with(|c: char| c.is_alphanumeric() || c == '_'))
    });
    let date = line.as_bytes().get(..10).is_some_and(|date| {
        date.iter().enumerate().all(|(i, b)| match i {
            4 | 7 => *b == b'-',
            _ => b.is_ascii_digit(),
        })
    });
    level || date
}

/// Whether `line` could be part of a message: no byte that is not UTF-8 (read as U+FFFD) and no
/// control character but a tab. Binary output after a traceback is not its message.
fn is_text(line: &str) -> bool {
    !line.chars().any(|c| c == char::REPLACEMENT_CHARACTER || (c.is_control() && c != '\t'))
}

/// Whether `line` is a log record of a level above INFO (`ERROR:root:...`, `2026-05-01 12:00:00
/// WARNING ...`, structlog's `[error    ]`), as `logging.exception` (or `exc_info=True` at any
/// such level) writes before the traceback of an exception it handled. The level is the first
/// word of the record's first few that names one, in any case: a later word (`retrying after
/// ERROR 503`) is the message's.
fn logs_an_error(line: &str) -> bool {
    if !looks_like_log_record(line) {
        return false;
    }
    // The record's fields (a dotted logger name is one), the numbers of a date and time left out.
    let fields = line.split(|c: char| c.is_whitespace() || matches!(c, '[' | ']' | ':' | '|' | '-' | ','));
    let words = fields.filter(|w| !w.is_empty() && !w.bytes().all(|b| b.is_ascii_digit()));
    let level = words.take(6).find(|w| LOG_LEVELS.iter().any(|l| w.eq_ignore_ascii_case(l)));
    level.is_some_and(|l| !l.eq_ignore_ascii_case("DEBUG") && !l.eq_ignore_ascii_case("INFO"))
}

/// `s` without ANSI CSI sequences (`ESC [ params final`), such as colours.
fn strip_ansi(s: &str) -> Cow<'_, str> {
    if !s.contains('\x1b') {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\x1b' || chars.peek() != Some(&'[') {
            out.push(c);
            continue;
        }
        chars.next();
        // Parameter and intermediate bytes, then one final byte; stop early at anything else so
        // a broken sequence cannot swallow the following lines.
        while let Some(&c) = chars.peek() {
            if !(' '..='~').contains(&c) {
                break;
            }
            chars.next();
            if c >= '@' {
                break;
            }
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error a traceback printed as `printed: message` gives.
    fn found(printed: &str, message: &str) -> Option<TracebackError> {
        let class = printed.rsplit('.').next().unwrap().to_string();
        Some(TracebackError { class, printed: printed.to_string(), message: message.to_string() })
    }

    const VALUE_ERROR: &str = r#"Traceback (most recent call last):
  File "/srv/job/load.py", line 12, in <module>
    main()
  File "/srv/job/load.py", line 9, in main
    int(row["count"])
ValueError: invalid literal for int() with base 10: 'abc'
"#;

    #[test]
    fn simple_value_error() {
        assert_eq!(parse_traceback(VALUE_ERROR), found("ValueError", "invalid literal for int() with base 10: 'abc'"));
    }

    #[test]
    fn output_before_and_trailing_blank_lines() {
        let text = format!("starting\nloaded 3 rows\n{VALUE_ERROR}\n\n  \n");
        assert_eq!(parse_traceback(&text).unwrap().class, "ValueError");
    }

    #[test]
    fn crlf_line_endings() {
        let text = VALUE_ERROR.replace('\n', "\r\n");
        assert_eq!(parse_traceback(&text), found("ValueError", "invalid literal for int() with base 10: 'abc'"));
    }

    #[test]
    fn connection_reset_with_errno() {
        let text = r#"Traceback (most recent call last):
  File "/usr/lib/python3.12/socketserver.py", line 318, in _handle_request_noblock
    self.process_request(request, client_address)
  File "/srv/sync.py", line 40, in pull
    data = sock.recv(4096)
           ^^^^^^^^^^^^^^^
ConnectionResetError: [Errno 104] Connection reset by peer
"#;
        assert_eq!(parse_traceback(text), found("ConnectionResetError", "[Errno 104] Connection reset by peer"));
    }

    #[test]
    fn dotted_module_class() {
        let text = r#"Traceback (most recent call last):
  File "/srv/fetch.py", line 5, in <module>
    requests.get("http://localhost:1")
  File "/venv/lib/python3.11/site-packages/requests/api.py", line 73, in get
    return request("get", url, params=params, **kwargs)
requests.exceptions.ConnectionError: HTTPConnectionPool(host='localhost', port=1): Max retries exceeded
"#;
        assert_eq!(
            parse_traceback(text),
            found(
                "requests.exceptions.ConnectionError",
                "HTTPConnectionPool(host='localhost', port=1): Max retries exceeded"
            )
        );
    }

    #[test]
    fn chained_during_handling() {
        let text = r#"Traceback (most recent call last):
  File "/srv/job.py", line 4, in fetch
    return cache["key"]
           ~~~~~^^^^^^^
KeyError: 'key'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/srv/job.py", line 9, in <module>
    fetch()
  File "/srv/job.py", line 6, in fetch
    raise TimeoutError("upstream timed out")
TimeoutError: upstream timed out
"#;
        assert_eq!(parse_traceback(text), found("TimeoutError", "upstream timed out"));
    }

    #[test]
    fn chained_direct_cause_with_multiline_message() {
        // Real Python 3.13 output of `raise MyError("line1\nline2") from e`.
        let text = r#"Traceback (most recent call last):
  File "/srv/job/chain.py", line 5, in f
    {}["k"]
    ~~^^^^^
KeyError: 'k'

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/srv/job/chain.py", line 8, in <module>
    f()
    ~^^
  File "/srv/job/chain.py", line 7, in f
    raise MyError("line1\nline2") from e
MyError: line1
line2
"#;
        assert_eq!(parse_traceback(text), found("MyError", "line1"));
    }

    #[test]
    fn custom_class_in_main_and_in_function() {
        let text = r#"Traceback (most recent call last):
  File "/srv/job.py", line 3, in <module>
    raise MyError("disk quota exceeded")
MyError: disk quota exceeded
"#;
        assert_eq!(parse_traceback(text), found("MyError", "disk quota exceeded"));
        let text = text.replace("\nMyError", "\nmain.<locals>.MyError");
        assert_eq!(parse_traceback(&text), found("main.<locals>.MyError", "disk quota exceeded"));
    }

    #[test]
    fn caret_lines_and_repeated_frames() {
        let text = r#"Traceback (most recent call last):
  File "/srv/job/rec.py", line 2, in <module>
    f(0)
  File "/srv/job/rec.py", line 1, in f
    def f(n): return f(n+1)
                     ^^^^^^
  [Previous line repeated 996 more times]
RecursionError: maximum recursion depth exceeded
"#;
        assert_eq!(parse_traceback(text), found("RecursionError", "maximum recursion depth exceeded"));
    }

    #[test]
    fn syntax_error_in_imported_module() {
        let text = r#"Traceback (most recent call last):
  File "/srv/job/sx.py", line 4, in <module>
    import badmod
  File "/srv/job/badmod.py", line 1
    def f(:
          ^
SyntaxError: invalid syntax
"#;
        assert_eq!(parse_traceback(text), found("SyntaxError", "invalid syntax"));
    }

    #[test]
    fn exception_without_message() {
        let text = r#"Traceback (most recent call last):
  File "/srv/loop.py", line 7, in <module>
    time.sleep(60)
KeyboardInterrupt
"#;
        assert_eq!(parse_traceback(text), found("KeyboardInterrupt", ""));
    }

    #[test]
    fn multiline_message_with_indented_continuation() {
        let text = r#"Traceback (most recent call last):
  File "/srv/db.py", line 3, in <module>
    conn = psycopg2.connect(dsn)
psycopg2.OperationalError: connection to server at "db" (10.0.0.5), port 5432 failed: Connection refused
	Is the server running on that host and accepting TCP/IP connections?
"#;
        assert_eq!(
            parse_traceback(text),
            found(
                "psycopg2.OperationalError",
                r#"connection to server at "db" (10.0.0.5), port 5432 failed: Connection refused"#
            )
        );
    }

    #[test]
    fn output_after_traceback() {
        let logged = format!("ERROR:root:sync failed\n{VALUE_ERROR}INFO:root:shutting down\n");
        assert_eq!(parse_traceback(&logged), None);
        let timestamped = format!("{VALUE_ERROR}2024-05-01 12:00:00,123 retrying later\n");
        assert_eq!(parse_traceback(&timestamped), None);
        let bracketed = format!("{VALUE_ERROR}[WARN] giving up\n");
        assert_eq!(parse_traceback(&bracketed), None);
        // After a message-less exception, further lines cannot be its message.
        let text = "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nKeyboardInterrupt\ncleaning up\n";
        assert_eq!(parse_traceback(text), None);
    }

    #[test]
    fn a_thread_s_or_an_ignored_exception_s_traceback_is_not_the_process_s() {
        let thread = format!("Exception in thread Thread-1 (work):\n{VALUE_ERROR}");
        assert_eq!(parse_traceback(&thread), None);
        let ignored = format!("Exception ignored in: <function Conn.__del__ at 0x7f>\n{VALUE_ERROR}");
        assert_eq!(parse_traceback(&ignored), None);
        let logging = format!("--- Logging error ---\n{VALUE_ERROR}");
        assert_eq!(parse_traceback(&logging), None);
        // The marker comes before the first traceback of a chain.
        let chain = format!(
            "Exception in thread Thread-1 (work):\n{VALUE_ERROR}\n{}\n\n{}",
            CHAINED[0],
            VALUE_ERROR.replace("ValueError", "KeyError")
        );
        assert_eq!(parse_traceback(&chain), None);
        // The process's own, after a thread's: taken.
        let after = format!(
            "Exception in thread Thread-1 (work):\n{VALUE_ERROR}done\n{}",
            VALUE_ERROR.replace("ValueError", "KeyError")
        );
        assert_eq!(parse_traceback(&after).unwrap().class, "KeyError");
        // Output that merely mentions a thread is no marker.
        let text = format!("Exception in thread pool, retrying\n{VALUE_ERROR}");
        assert_eq!(parse_traceback(&text).unwrap().class, "ValueError");
    }

    #[test]
    fn a_logged_traceback_followed_by_more_output_is_a_handled_exception() {
        let handled = format!("ERROR:root:handled; continuing\n{VALUE_ERROR}fatal: bad input file, giving up\n");
        assert_eq!(parse_traceback(&handled), None);
        // Logged and then the end: the process may have died of it, and the class is kept.
        let last = format!("ERROR:root:handled; continuing\n{VALUE_ERROR}");
        assert_eq!(parse_traceback(&last).unwrap().class, "ValueError");
        // A record of another level before it: the program logged as it went, then died of an
        // exception whose message has two lines (SQLAlchemy's end with a link).
        let died = format!(
            "INFO:root:connecting\n{VALUE_ERROR}(Background on this error at: https://sqlalche.me/e/20/e3q8)\n"
        );
        assert_eq!(parse_traceback(&died).unwrap().class, "ValueError");
        let dated = format!("2026-05-01 12:00:00,123 INFO connecting\n{VALUE_ERROR}more\n");
        assert_eq!(parse_traceback(&dated).unwrap().class, "ValueError");
        let dated = format!("2026-05-01 12:00:00,123 ERROR sync failed\n{VALUE_ERROR}more\n");
        assert_eq!(parse_traceback(&dated), None);
        // A warning logged with `exc_info=True`, structlog's lowercase level: handled too.
        for record in ["WARNING:root:using the cache", "2026-05-01T12:00:00Z [error    ] fetch failed"] {
            assert_eq!(parse_traceback(&format!("{record}\n{VALUE_ERROR}going on\n")), None, "{record}");
        }
        // A long dotted logger name is one field.
        let named = format!("2026-05-01 12:00:00,123 - a.b.c.d.e.f - WARNING - cache stale\n{VALUE_ERROR}going on\n");
        assert_eq!(parse_traceback(&named), None);
        // The level is the record's, not a word of its message.
        for record in ["INFO:root:retrying after ERROR 503", "2026-05-01 12:00:00,123 INFO loading ERROR_CODES"] {
            let text = format!("{record}\n{VALUE_ERROR}second line\n");
            assert_eq!(parse_traceback(&text).unwrap().class, "ValueError", "{record}");
        }
        // asyncio's handler, for a task nobody awaited.
        let task = format!("Task exception was never retrieved\nfuture: <Task finished name='Task-2'>\n{VALUE_ERROR}");
        assert_eq!(parse_traceback(&task), None);
    }

    #[test]
    fn a_class_named_in_another_script() {
        let text = VALUE_ERROR.replace("\nValueError", "\nmodul.Ошибка");
        assert_eq!(parse_traceback(&text), found("modul.Ошибка", "invalid literal for int() with base 10: 'abc'"));
    }

    /// Real Python 3.11 output of `python3 bad.py` for a script it cannot compile.
    #[test]
    fn a_script_python_cannot_compile() {
        let syntax = "  File \"/srv/bad.py\", line 1\n    x = = 1\n        ^\nSyntaxError: invalid syntax\n";
        assert_eq!(parse_traceback(syntax), found("SyntaxError", "invalid syntax"));
        let indent = "  File \"/srv/ind.py\", line 2\n    x=1\nIndentationError: unexpected indent\n";
        assert_eq!(parse_traceback(&format!("started\n{indent}")), found("IndentationError", "unexpected indent"));
        // After a handled traceback, the script that could not be compiled is what ended.
        assert_eq!(parse_traceback(&format!("{VALUE_ERROR}{syntax}")), found("SyntaxError", "invalid syntax"));
        // A frame of a traceback names its function: without the header, it is not one.
        let framed = "  File \"/srv/bad.py\", line 1, in <module>\n    x()\nSyntaxError: invalid syntax\n";
        assert_eq!(parse_traceback(framed), None);
        // Another class, or no frame: not a compile error.
        assert_eq!(parse_traceback(&syntax.replace("SyntaxError", "ValueError")), None);
        assert_eq!(parse_traceback("SyntaxError: invalid syntax\n"), None);
    }

    #[test]
    fn binary_output_after_the_traceback_is_not_its_message() {
        let text = format!("{VALUE_ERROR}\u{fffd}\u{fffd}PK\u{3}\u{4}\n");
        assert_eq!(parse_traceback(&text), None);
        let tabbed = format!("{VALUE_ERROR}\tcolumn\tvalue\n");
        assert_eq!(parse_traceback(&tabbed).unwrap().class, "ValueError");
    }

    #[test]
    fn plain_output_after_message_is_taken_as_its_continuation() {
        // The known ambiguity: this could be a two-line message, so the class is kept.
        for after in ["retrying in 5 seconds\n", "\nfetch.sh: line 3: curl: command not found\n"] {
            let text = format!("{VALUE_ERROR}{after}");
            assert_eq!(parse_traceback(&text).unwrap().class, "ValueError");
        }
    }

    #[test]
    fn not_python() {
        assert_eq!(parse_traceback(""), None);
        assert_eq!(parse_traceback("\n\n"), None);
        assert_eq!(parse_traceback("curl: (7) Failed to connect to localhost port 1: Connection refused\n"), None);
        assert_eq!(parse_traceback("Error: something went wrong\n"), None);
        // A header with no frames, or frames without an exception line.
        assert_eq!(parse_traceback("Traceback (most recent call last):\nValueError: x\n"), None);
        assert_eq!(parse_traceback("Traceback (most recent call last):\n  File \"x.py\", line 1\n"), None);
        // The exception line must start with a class name.
        let text = VALUE_ERROR.replace("ValueError:", "something bad:");
        assert_eq!(parse_traceback(&text), None);
    }

    #[test]
    fn truncated_head() {
        // The tail starts in the middle of the first traceback of a chain.
        let text = r#"ne 5, in f
    {}["k"]
    ~~^^^^^
KeyError: 'k'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/srv/job/chain.py", line 8, in <module>
    f()
RuntimeError: lookup failed
"#;
        assert_eq!(parse_traceback(text), found("RuntimeError", "lookup failed"));
        // Cut inside the last traceback's header: nothing to go on.
        assert_eq!(parse_traceback("k (most recent call last):\n  File \"x.py\", line 1\nValueError: x\n"), None);
    }

    #[test]
    fn exception_group() {
        // Real Python 3.13 output.
        let text = r#"  + Exception Group Traceback (most recent call last):
  |   File "/srv/job/eg.py", line 9, in <module>
  |     main()
  |     ~~~~^^
  |   File "/srv/job/eg.py", line 8, in main
  |     raise ExceptionGroup("many", errs)
  | ExceptionGroup: many (2 sub-exceptions)
  +-+---------------- 1 ----------------
    | Traceback (most recent call last):
    |   File "/srv/job/eg.py", line 4, in main
    |     raise ValueError("a")
    | ValueError: a
    +---------------- 2 ----------------
    | TypeError: b
    +------------------------------------
"#;
        assert_eq!(parse_traceback(text), found("ExceptionGroup", "many (2 sub-exceptions)"));
        assert_eq!(parse_traceback(&format!("{text}done\n")), None);
    }

    #[test]
    fn exception_group_chained_after_plain_traceback() {
        // Real Python 3.11 output: a note, and a sub-exception message line without its margin.
        let text = r#"Traceback (most recent call last):
  File "/srv/job/ml.py", line 7, in <module>
    g()
  File "/srv/job/ml.py", line 5, in g
    raise e
g.<locals>.Inner: x
a note

During handling of the above exception, another exception occurred:

  + Exception Group Traceback (most recent call last):
  |   File "/srv/job/ml.py", line 9, in <module>
  |     raise ExceptionGroup("outer", [ValueError("v\nw")])
  | ExceptionGroup: outer (1 sub-exception)
  +-+---------------- 1 ----------------
    | ValueError: v
w
    +------------------------------------
"#;
        assert_eq!(parse_traceback(text), found("ExceptionGroup", "outer (1 sub-exception)"));
        // The first traceback alone, with its note.
        let first = text.split("\n\nDuring").next().unwrap();
        assert_eq!(parse_traceback(first), found("g.<locals>.Inner", "x"));
    }

    #[test]
    fn colored_output() {
        // Python 3.13 with FORCE_COLOR=1.
        let text = "Traceback (most recent call last):\n  File \x1b[35m\"/srv/job/c.py\"\x1b[0m, line \x1b[35m7\x1b[0m, in \x1b[35mf\x1b[0m\n    raise MyError(\"x\")\n\x1b[1;35mMyError\x1b[0m: \x1b[35mline1\nline2\x1b[0m\n";
        assert_eq!(parse_traceback(text), found("MyError", "line1"));
    }

    #[test]
    fn garbage_never_panics() {
        let samples = [
            "Traceback (most recent call last):",
            "Traceback (most recent call last):\n",
            "Traceback (most recent call last):\n  File \"é\", line 1\n",
            "Traceback (most recent call last):\n  File \"x\"\n€rreur: ü\n",
            "Traceback (most recent call last):\n  File \"x\"\n:\n",
            "Traceback (most recent call last):\n  File \"x\"\n.:\n",
            "Traceback (most recent call last):\n  File \"x\"\n\x1b[\n",
            "  + Exception Group Traceback (most recent call last):\n",
            "  + Exception Group Traceback (most recent call last):\n  |   File \"x\"\n",
            "  + Exception Group Traceback (most recent call last):\n  |\n  +-\n",
            "\x1b",
            "\x1b[",
            "\x1b[31",
            "\r\n\r\n\r",
            "\u{0}\u{7f}\u{fffd}日本語",
        ];
        for sample in samples {
            assert_eq!(parse_traceback(sample), None, "{sample:?}");
        }
        // A class named in another script is a class.
        let text = "Traceback (most recent call last):\n  File \"x\"\nÉrreur: ü\n";
        assert_eq!(parse_traceback(text), found("Érreur", "ü"));
        // Non-ASCII in the message is kept as is.
        let text = VALUE_ERROR.replace("'abc'", "'日本語'");
        assert_eq!(parse_traceback(&text).unwrap().message, "invalid literal for int() with base 10: '日本語'");
    }

    #[test]
    fn strip_ansi_keeps_text() {
        assert_eq!(strip_ansi("plain"), "plain");
        assert_eq!(strip_ansi("\x1b[1;35mA\x1b[0m: b"), "A: b");
        // A broken sequence stops at the line break instead of eating the next line.
        assert_eq!(strip_ansi("a\x1b[3\nb"), "a\nb");
    }
}
