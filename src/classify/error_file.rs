//! The error-file protocol.
//!
//! Every attempt gets `WAYMARK_ERROR_FILE`, the path of a file that does not exist when the child
//! starts (whatever an earlier execution of the attempt left there is removed first), in the
//! attempt's private (0700) log directory. A child that fails may create it and write one JSON
//! object there:
//!
//! ```json
//! {"type": "ConnectTimeout", "bases": ["TimeoutException", "TransportError", "Exception"], "message": "..."}
//! ```
//!
//! `type` is required (a non-empty string); `bases` (an array of strings, nearest first) and
//! `message` (a string) are optional, and `null` counts as absent. Other keys are ignored. Names
//! may be dotted (`httpx.ConnectTimeout`); only the last part is kept, and it must look like an
//! identifier. An empty or whitespace-only file means "nothing reported"; anything else that does
//! not fit is ignored with a warning saying what is wrong.

use std::io::{self, Read};
use std::path::Path;

use nix::errno::Errno;
use serde_json::{Map, Value};

/// The largest error file that is read; a bigger one is ignored with a warning.
pub(crate) const MAX_ERROR_FILE_BYTES: u64 = 64 * 1024;

/// An error a child reported through its error file, with names reduced to bare class names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportedError {
    pub class: String,
    pub bases: Option<Vec<String>>,
    pub message: Option<String>,
}

/// What an attempt's error file said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorFileOutcome {
    /// Missing, empty or whitespace only: nothing was reported.
    Empty,
    Reported(ReportedError),
    /// Unusable; the string is a warning for the user saying why.
    Invalid(String),
}

/// Read and parse the file after a failed attempt. Opens with O_NOFOLLOW (a symlink put there by the child
/// is Invalid with a warning, never followed), refuses non-regular files, reads at most MAX_ERROR_FILE_BYTES+1
/// bytes (so a huge file is detected without reading it all), never panics. A missing file is Empty.
pub(crate) fn read_error_file(path: &Path) -> ErrorFileOutcome {
    let shown = path.display().to_string();
    let invalid = |what: String| ErrorFileOutcome::Invalid(format!("error file {shown}: {what}"));

    let file = match crate::os::fs::open_read_nofollow(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return ErrorFileOutcome::Empty,
        Err(e) if e.raw_os_error() == Some(Errno::ELOOP as i32) => {
            return invalid("is a symbolic link, which is not followed".to_string());
        }
        Err(e) => return invalid(format!("cannot open: {e}")),
    };
    match file.metadata() {
        Ok(meta) if meta.is_file() => {}
        Ok(_) => return invalid("is not a regular file".to_string()),
        Err(e) => return invalid(format!("cannot stat: {e}")),
    }
    // One byte over the limit is enough to tell that the file is too big.
    let mut bytes = Vec::new();
    if let Err(e) = file.take(MAX_ERROR_FILE_BYTES + 1).read_to_end(&mut bytes) {
        return invalid(format!("cannot read: {e}"));
    }
    parse_error_file(&bytes, &shown)
}

/// Parse the bytes (pure, for unit tests). `shown_path` is used in warnings.
pub fn parse_error_file(bytes: &[u8], shown_path: &str) -> ErrorFileOutcome {
    match parse(bytes) {
        Ok(Some(reported)) => ErrorFileOutcome::Reported(reported),
        Ok(None) => ErrorFileOutcome::Empty,
        Err(what) => ErrorFileOutcome::Invalid(format!("error file {shown_path}: {what}")),
    }
}

/// `Ok(None)` for "nothing reported"; `Err` says what is wrong, without the path.
fn parse(bytes: &[u8]) -> Result<Option<ReportedError>, String> {
    if bytes.len() as u64 > MAX_ERROR_FILE_BYTES {
        return Err(format!("larger than {MAX_ERROR_FILE_BYTES} bytes"));
    }
    // Tolerate a UTF-8 byte order mark, which some tools write and serde_json rejects.
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let value: Value = serde_json::from_slice(bytes).map_err(|e| format!("not valid JSON: {e}"))?;
    let Value::Object(mut object) = value else {
        return Err(format!("must hold a JSON object, not {}", kind(&value)));
    };

    let class = match object.get("type") {
        None => return Err(r#""type" is missing"#.to_string()),
        Some(Value::String(s)) if s.is_empty() => {
            return Err(r#""type" must not be empty"#.to_string());
        }
        Some(Value::String(s)) => class_name("type", s)?,
        Some(other) => return Err(format!(r#""type" must be a string, not {}"#, kind(other))),
    };
    // The run's own error when the flow's `timeout` passes: no attempt fails with it.
    if class == super::classes::WORKFLOW_TIMEOUT {
        return Err(format!(
            r#""type" is {class}, which only waymark reports when the flow's `timeout` passes: report a class of your own"#
        ));
    }
    let bases = bases(&object)?;
    let message = match object.remove("message") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s),
        Some(other) => {
            let kind = kind(&other);
            return Err(format!(r#""message" must be a string, not {kind}"#));
        }
    };
    Ok(Some(ReportedError { class, bases, message }))
}

/// The optional `bases` array, each name reduced to a bare class name.
fn bases(object: &Map<String, Value>) -> Result<Option<Vec<String>>, String> {
    const WRONG: &str = r#""bases" must be an array of strings"#;
    let items = match object.get("bases") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(items)) => items,
        Some(other) => return Err(format!("{WRONG}, not {}", kind(other))),
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::String(s) => class_name(&format!("bases[{i}]"), s),
            other => Err(format!("{WRONG}, but bases[{i}] is {}", kind(other))),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// The bare class name in `name`: its last dotted part, which must be an identifier.
/// `field` names the JSON field in the error.
fn class_name(field: &str, name: &str) -> Result<String, String> {
    let bare = name.rsplit('.').next().unwrap_or(name);
    if is_class_name(bare) {
        Ok(bare.to_string())
    } else {
        Err(format!(r#""{field}" is not a class name: {}"#, quoted(name)))
    }
}

/// Whether `s` is a Python identifier, as a class name is: a letter (of any script) or `_`, then
/// letters, digits and `_` (Unicode's XID_Start and XID_Continue, as Python has them).
pub(crate) fn is_class_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| unicode_ident::is_xid_start(c) || c == '_')
        && chars.all(unicode_ident::is_xid_continue)
}

/// `s` quoted and escaped for a warning, cut short if long.
fn quoted(s: &str) -> String {
    const MAX_CHARS: usize = 60;
    if s.chars().count() <= MAX_CHARS {
        format!("{s:?}")
    } else {
        let head: String = s.chars().take(MAX_CHARS).collect();
        format!("{head:?}...")
    }
}

/// A JSON value's kind, for warnings ("must be a string, not a number").
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;
    use std::path::PathBuf;

    const P: &str = "/x/y";

    fn parse_str(s: &str) -> ErrorFileOutcome {
        parse_error_file(s.as_bytes(), P)
    }

    fn reported(class: &str, bases: Option<&[&str]>, message: Option<&str>) -> ErrorFileOutcome {
        ErrorFileOutcome::Reported(ReportedError {
            class: class.to_string(),
            bases: bases.map(|b| b.iter().map(|s| s.to_string()).collect()),
            message: message.map(str::to_string),
        })
    }

    fn invalid(what: &str) -> ErrorFileOutcome {
        ErrorFileOutcome::Invalid(format!("error file {P}: {what}"))
    }

    #[test]
    fn workflow_timeout_is_waymark_s_own_and_no_child_reports_it() {
        assert_eq!(
            parse_str(r#"{"type": "mod.WorkflowTimeout", "message": "deadline"}"#),
            invalid(
                r#""type" is WorkflowTimeout, which only waymark reports when the flow's `timeout` passes: report a class of your own"#
            )
        );
        // A class of that name in a child's bases is only a base.
        assert_eq!(
            parse_str(r#"{"type": "Late", "bases": ["WorkflowTimeout"]}"#),
            reported("Late", Some(&["WorkflowTimeout"]), None)
        );
    }

    /// A fresh, empty directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> TempDir {
            let dir = std::env::temp_dir().join(format!(
                "waymark-error-file-{name}-{}-{}",
                std::process::id(),
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
            ));
            fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn full_object() {
        let json = r#"{"type": "ConnectTimeout", "bases": ["TimeoutException", "TransportError",
            "Exception", "BaseException"], "message": "timed out", "extra": [1, {"x": 2}]}"#;
        assert_eq!(
            parse_str(json),
            reported(
                "ConnectTimeout",
                Some(&["TimeoutException", "TransportError", "Exception", "BaseException"]),
                Some("timed out"),
            )
        );
    }

    #[test]
    fn minimal_object() {
        assert_eq!(parse_str(r#"{"type":"MyError"}"#), reported("MyError", None, None));
        assert_eq!(parse_str(r#"{"type":"_E2","bases":[],"message":""}"#), reported("_E2", Some(&[]), Some("")));
        assert_eq!(parse_str(r#"{"type":"E","bases":null,"message":null}"#), reported("E", None, None));
    }

    #[test]
    fn dotted_names_keep_last_part() {
        let json = r#"{"type": "httpx.ConnectTimeout", "bases": ["httpx.TimeoutException", "builtins.Exception"]}"#;
        assert_eq!(parse_str(json), reported("ConnectTimeout", Some(&["TimeoutException", "Exception"]), None));
    }

    #[test]
    fn bad_names() {
        assert_eq!(parse_str(r#"{"type":"httpx."}"#), invalid(r#""type" is not a class name: "httpx.""#));
        assert_eq!(parse_str(r#"{"type":"Bad Name"}"#), invalid(r#""type" is not a class name: "Bad Name""#));
        assert_eq!(
            parse_str(r#"{"type":"E","bases":["Exception","9x"]}"#),
            invalid(r#""bases[1]" is not a class name: "9x""#)
        );
        // Python's identifiers: letters of any script, not a digit of any script first.
        assert_eq!(parse_str(r#"{"type":"Ошибка","bases":["Fehlerü"]}"#), reported("Ошибка", Some(&["Fehlerü"]), None));
        assert_eq!(parse_str(r#"{"type":"٣x"}"#), invalid(r#""type" is not a class name: "٣x""#));
        assert_eq!(parse_str(r#"{"type":"a€b"}"#), invalid(r#""type" is not a class name: "a€b""#));
        let long = format!(r#"{{"type":"{}-"}}"#, "A".repeat(100));
        assert_eq!(parse_str(&long), invalid(&format!(r#""type" is not a class name: "{}"..."#, "A".repeat(60))));
    }

    #[test]
    fn empty_and_whitespace_mean_nothing_reported() {
        assert_eq!(parse_str(""), ErrorFileOutcome::Empty);
        assert_eq!(parse_str(" \n\t\r\n "), ErrorFileOutcome::Empty);
        assert_eq!(parse_str("\u{feff}\n"), ErrorFileOutcome::Empty);
    }

    #[test]
    fn byte_order_mark_is_tolerated() {
        assert_eq!(parse_str("\u{feff}{\"type\":\"E\"}"), reported("E", None, None));
    }

    #[test]
    fn garbage_is_invalid() {
        for bytes in [&b"ConnectTimeout"[..], b"{\"type\": ", b"\xff\xfe{}", b"{\"type\":\"E\"} x"] {
            match parse_error_file(bytes, P) {
                ErrorFileOutcome::Invalid(w) => {
                    assert!(w.starts_with("error file /x/y: not valid JSON: "), "{w}")
                }
                other => panic!("{bytes:?} gave {other:?}"),
            }
        }
        // Deep nesting hits serde_json's recursion limit instead of overflowing the stack.
        let deep = "[".repeat(10_000);
        assert!(matches!(parse_str(&deep), ErrorFileOutcome::Invalid(_)));
    }

    #[test]
    fn huge_is_invalid() {
        let pad = " ".repeat(MAX_ERROR_FILE_BYTES as usize);
        assert_eq!(parse_str(&format!(r#"{{"type":"E"}}{pad}"#)), invalid("larger than 65536 bytes"));
        // Exactly at the limit is fine.
        let json = r#"{"type":"E"}"#;
        let at_limit = format!("{json}{}", " ".repeat(MAX_ERROR_FILE_BYTES as usize - json.len()));
        assert_eq!(parse_str(&at_limit), reported("E", None, None));
    }

    #[test]
    fn non_object_json() {
        assert_eq!(parse_str("[]"), invalid("must hold a JSON object, not an array"));
        assert_eq!(parse_str(r#""E""#), invalid("must hold a JSON object, not a string"));
        assert_eq!(parse_str("null"), invalid("must hold a JSON object, not null"));
        assert_eq!(parse_str("42"), invalid("must hold a JSON object, not a number"));
    }

    #[test]
    fn wrong_type_field() {
        assert_eq!(parse_str("{}"), invalid(r#""type" is missing"#));
        assert_eq!(parse_str(r#"{"type":null}"#), invalid(r#""type" must be a string, not null"#));
        assert_eq!(parse_str(r#"{"type":""}"#), invalid(r#""type" must not be empty"#));
        assert_eq!(parse_str(r#"{"type":1}"#), invalid(r#""type" must be a string, not a number"#));
        assert_eq!(parse_str(r#"{"type":["E"]}"#), invalid(r#""type" must be a string, not an array"#));
    }

    #[test]
    fn wrong_bases_field() {
        assert_eq!(
            parse_str(r#"{"type":"E","bases":"Exception"}"#),
            invalid(r#""bases" must be an array of strings, not a string"#)
        );
        assert_eq!(
            parse_str(r#"{"type":"E","bases":{"a":1}}"#),
            invalid(r#""bases" must be an array of strings, not an object"#)
        );
        assert_eq!(
            parse_str(r#"{"type":"E","bases":["Exception",3]}"#),
            invalid(r#""bases" must be an array of strings, but bases[1] is a number"#)
        );
    }

    #[test]
    fn wrong_message_field() {
        assert_eq!(parse_str(r#"{"type":"E","message":5}"#), invalid(r#""message" must be a string, not a number"#));
        assert_eq!(
            parse_str(r#"{"type":"E","message":{"text":"x"}}"#),
            invalid(r#""message" must be a string, not an object"#)
        );
    }

    #[test]
    fn read_round_trip_and_missing() {
        let dir = TempDir::new("read");
        let path = dir.0.join("err.json");
        assert_eq!(read_error_file(&path), ErrorFileOutcome::Empty);
        fs::write(&path, "{\"type\":\"requests.ConnectionError\",\"message\":\"boom\"}\n").unwrap();
        assert_eq!(read_error_file(&path), reported("ConnectionError", None, Some("boom")));
    }

    #[test]
    fn read_refuses_symlink() {
        let dir = TempDir::new("readlink");
        let target = dir.0.join("target.json");
        let path = dir.0.join("err.json");
        fs::write(&target, r#"{"type":"Planted"}"#).unwrap();
        symlink(&target, &path).unwrap();
        let shown = path.display();
        assert_eq!(
            read_error_file(&path),
            ErrorFileOutcome::Invalid(format!("error file {shown}: is a symbolic link, which is not followed"))
        );
        assert_eq!(fs::read_to_string(&target).unwrap(), r#"{"type":"Planted"}"#);
    }

    #[test]
    fn read_refuses_non_regular_files() {
        let dir = TempDir::new("dir");
        let path = dir.0.join("err.json");
        fs::create_dir(&path).unwrap();
        assert_eq!(
            read_error_file(&path),
            ErrorFileOutcome::Invalid(format!("error file {}: is not a regular file", path.display()))
        );
        // A FIFO would block a plain open(2); it must be refused at once.
        let fifo = dir.0.join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(matches!(read_error_file(&fifo), ErrorFileOutcome::Invalid(w) if w.ends_with("is not a regular file")));
    }

    #[test]
    fn read_detects_huge_file() {
        let dir = TempDir::new("huge");
        let path = dir.0.join("err.json");
        fs::write(&path, vec![b' '; 10 * MAX_ERROR_FILE_BYTES as usize]).unwrap();
        assert_eq!(
            read_error_file(&path),
            ErrorFileOutcome::Invalid(format!("error file {}: larger than 65536 bytes", path.display()))
        );
    }
}
