//! The flow file: the document read against the schema into raw types (`raw`, or `fast` for a
//! file of the common shape), validation into domain types (`validate`, `model`), and
//! diagnostics that point into the file (`diagnostic`). Every diagnostic but a TOML syntax error
//! is waymark's own wording.

pub(crate) mod diagnostic;
pub mod dotenv;
pub(crate) mod duration;
mod fast;
pub(crate) mod graph;
pub(crate) mod model;
pub mod params;
pub(crate) mod raw;
pub(crate) mod validate;

pub use diagnostic::Diagnostic;
pub use model::Flow;
pub(crate) use model::{ExitCodes, Signal, Step};
pub(crate) use validate::is_identifier;

use std::io::Read;
use std::path::{Path, PathBuf};

/// The largest flow file waymark reads (16 MiB). A flow file is a short text; the limit keeps
/// `waymark check /dev/zero`, a FIFO or a mistaken path from reading until memory runs out.
pub const MAX_FLOW_BYTES: u64 = 16 * 1024 * 1024;

/// A flow that loaded, with the warnings found on the way.
#[derive(Debug)]
pub(crate) struct Loaded {
    pub(crate) flow: Flow,
    pub(crate) source: String,
    pub(crate) warnings: Vec<Diagnostic>,
}

/// Why a flow file could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read flow file {}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error(
        "flow file {} is larger than {} MiB, the most waymark reads; check that it is the flow file you meant",
        path.display(), MAX_FLOW_BYTES / (1024 * 1024)
    )]
    TooLarge { path: PathBuf },
    #[error("{} has {} error(s)", shown, diagnostics.iter().filter(|d| d.is_error()).count())]
    Invalid { shown: String, source_text: String, diagnostics: Vec<Diagnostic> },
}

impl LoadError {
    /// The full report: every diagnostic drawn against the file.
    pub(crate) fn render(&self, color: bool) -> String {
        match self {
            LoadError::Read { .. } | LoadError::TooLarge { .. } => format!("error: {self}\n"),
            LoadError::Invalid { shown, source_text, diagnostics } => {
                let mut out = String::new();
                for d in diagnostics {
                    out.push_str(&d.render(shown, source_text, color));
                    out.push_str("\n\n");
                }
                let errors = diagnostics.iter().filter(|d| d.is_error()).count();
                out.push_str(&format!(
                    "error: {shown} is not a valid flow ({errors} error{}); nothing was run\n",
                    if errors == 1 { "" } else { "s" }
                ));
                out
            }
        }
    }
}

/// `text` as a one-line TOML basic string, as it could be written in a flow file: for a value
/// quoted back in a message or a plan (`"5\u0007s"`, `"a\nb"`; not Rust's `"5\u{7}s"`).
pub(crate) fn toml_quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The bytes of the flow file at `path`, at most [`MAX_FLOW_BYTES`] of them.
pub(crate) fn read_bytes(path: &Path) -> Result<Vec<u8>, LoadError> {
    let mut bytes = Vec::new();
    // One byte more than the limit tells a file at the limit from a larger one, and bounds the
    // read of an endless stream. A regular file is read into a buffer of its size (plus the byte
    // that finds its end), not one doubled as it fills.
    std::fs::File::open(path)
        .and_then(|f| {
            let size = f.metadata().map_or(0, |m| m.len()).min(MAX_FLOW_BYTES);
            bytes.reserve_exact(usize::try_from(size).unwrap_or(0).saturating_add(1));
            f.take(MAX_FLOW_BYTES + 1).read_to_end(&mut bytes)
        })
        .map_err(|source| LoadError::Read { path: path.to_owned(), source })?;
    if bytes.len() as u64 > MAX_FLOW_BYTES {
        return Err(LoadError::TooLarge { path: path.to_owned() });
    }
    Ok(bytes)
}

/// Read, parse and validate the flow file at `path`.
pub(crate) fn load(path: &Path) -> Result<Loaded, LoadError> {
    let read_error = |source| LoadError::Read { path: path.to_owned(), source };
    let bytes = read_bytes(path)?;
    let shown = crate::text::shown_path(path);
    let source = decode(bytes).map_err(|bad| {
        let (source_text, diagnostic) = *bad;
        LoadError::Invalid { shown: shown.clone(), source_text, diagnostics: vec![diagnostic] }
    })?;
    // Canonical, so that the same file reached by another path is recognised as the same flow file.
    let absolute = std::fs::canonicalize(path).or_else(|_| std::path::absolute(path)).map_err(read_error)?;
    let search = validate::ProgramSearch { path: std::env::var_os("PATH") };
    match parse_searching(&source, &absolute, Some(&search)) {
        Ok((flow, warnings)) => Ok(Loaded { flow, source, warnings }),
        Err(diagnostics) => Err(LoadError::Invalid { shown, source_text: source, diagnostics }),
    }
}

/// The 1-based line of the top-level key `key` in the flow text `source`, if it is written
/// there: for a message about that key's value found wrong after loading (an `env_file` that
/// cannot be read when a run starts). Parses the text: call it only for such a message.
pub(crate) fn top_level_key_line(source: &str, key: &str) -> Option<usize> {
    let doc = toml::de::DeTable::parse(source).ok()?;
    let span = doc.get_ref().iter().find(|(k, _)| k.get_ref() == key)?.0.span();
    Some(diagnostic::Lines::new(source).line_of(span.start) + 1)
}

/// The flow text in `bytes`, its line endings LF (a file saved with CRLF would otherwise give
/// its multi-line strings, such as a `shell` script, a CR at the end of each line, which TOML
/// leaves to the reader); for a file that is not UTF-8, the text to draw instead (invalid
/// bytes replaced, everything before the first one unchanged) and the diagnostic pointing at
/// the first invalid byte.
pub fn decode(bytes: Vec<u8>) -> Result<String, Box<(String, Diagnostic)>> {
    let text = String::from_utf8(bytes).map_err(|e| {
        let valid_up_to = e.utf8_error().valid_up_to();
        Box::new(not_utf8(e.as_bytes(), valid_up_to))
    })?;
    // Only a CR before an LF is a line ending; a CR elsewhere is TOML's to refuse.
    Ok(match text.contains("\r\n") {
        true => text.replace("\r\n", "\n"),
        false => text,
    })
}

fn not_utf8(bytes: &[u8], valid_up_to: usize) -> (String, Diagnostic) {
    let text = String::from_utf8_lossy(bytes).into_owned();
    let len = text[valid_up_to..].chars().next().map_or(0, char::len_utf8);
    let mut d = Diagnostic::error(valid_up_to..valid_up_to + len, "the flow file is not valid UTF-8")
        .label("invalid byte")
        .help(Some("save the file as UTF-8".into()));
    d.locate(&text, &diagnostic::Lines::new(&text));
    (text, d)
}

/// Parse and validate flow text; `path` (absolute) names the file and anchors `workdir`.
///
/// The text is parsed once. One walk of the document against the schema (`raw::read`) finds
/// every unknown key and wrongly typed value, validation finds every bad value, and all of them
/// come back together, in the order of the file. A file of the fast path's subset (`fast`) is
/// read straight into the raw types instead, with the same result.
pub fn parse(source: &str, path: &Path) -> Result<(Flow, Vec<Diagnostic>), Vec<Diagnostic>> {
    parse_searching(source, path, None)
}

/// [`parse`], and with `search`, a warning for each step's `run` program that is not on the PATH
/// the step would be run with.
pub(crate) fn parse_searching(
    source: &str,
    path: &Path,
    search: Option<&validate::ProgramSearch>,
) -> Result<(Flow, Vec<Diagnostic>), Vec<Diagnostic>> {
    parse_by(source, path, search, Reader::Fast)
}

/// How [`parse_by`] reads the file into the raw types.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reader {
    /// The fast path (`fast`), and the full reader for what it does not handle.
    Fast,
    /// The `toml` crate and `raw::read` only: what the fast path is compared with.
    #[cfg(test)]
    Full,
}

fn parse_by(
    source: &str,
    path: &Path,
    search: Option<&validate::ProgramSearch>,
    reader: Reader,
) -> Result<(Flow, Vec<Diagnostic>), Vec<Diagnostic>> {
    let locate = |mut diags: Vec<Diagnostic>| {
        if diags.is_empty() {
            return diags; // without indexing the lines of the file
        }
        let lines = diagnostic::Lines::new(source);
        // Stable: diagnostics at the same place keep the order they were found in; those about
        // the file as a whole (no span) come first.
        diags.sort_by_key(|d| d.span.as_ref().map(|s| s.start));
        for d in &mut diags {
            d.locate(source, &lines);
        }
        diags
    };
    // The fast path reads a file of the common shape straight into the raw types; anything else,
    // and every file it is not sure about, is read by the `toml` crate and `raw::read`.
    if reader == Reader::Fast
        && let Some(raw) = fast::read(source)
    {
        return match validate::validate(raw, path, source, None, search) {
            Ok((flow, warnings)) => Ok((flow, locate(warnings))),
            Err(diags) => Err(locate(diags)),
        };
    }
    let doc = toml::de::DeTable::parse(source).map_err(|e| locate(vec![syntax_error(&e, source)]))?;
    let (raw, mut diags) = raw::read(doc.get_ref(), source);
    let shape_errors = !diags.is_empty();
    match validate::validate(raw, path, source, Some(doc.get_ref()), search) {
        Ok((flow, warnings)) if !shape_errors => Ok((flow, locate(warnings))),
        Ok((_, more)) | Err(more) => {
            diags.extend(more);
            Err(locate(diags))
        }
    }
}

/// A TOML syntax error, as the parser words it, at the place it names. The parser names no place
/// for a dotted key nested past its limit: that one points at the deepest dotted key.
fn syntax_error(e: &toml::de::Error, source: &str) -> Diagnostic {
    // A string left open at its line's end is reported where the parser stumbles next, a line
    // further down (`key with no value`): it is named where it opens, which is the mistake.
    if let Some(open) = open_string(source).filter(|open| e.span().is_none_or(|at| open.start <= at.start)) {
        let quote = &source[open.start..open.start + 1];
        return Diagnostic::error(open, "a string in quotes is not closed on its line")
            .label(format!("no closing {quote} on this line"))
            .help(Some(format!(
                "a value of several lines goes in triple quotes ({q}{q}{q}, then the lines, then {q}{q}{q}); \
                 else close it with {quote} before the line ends",
                q = quote
            )));
    }
    let message = e.message().trim().to_owned();
    // A key whose value is not on its line (left out, or written on the next one) is reported
    // where the reader stumbles, often a line further down: it is named where it is.
    if let Some((span, key)) =
        key_without_value(source).filter(|(span, _)| e.span().is_none_or(|at| span.start <= at.start))
    {
        let key = source[key].trim();
        return Diagnostic::error(span, format!("`{key}` has no value on its line")).label("nothing after `=`").help(
            Some(
                "write its value after `=`, on the same line (a list or a table in brackets may then go on over \
                 several lines): a string in quotes, a number, true or false, a list `[...]` or a table `{...}`"
                    .to_owned(),
            ),
        );
    }
    match e.span() {
        Some(span) => {
            let (label, help) = syntax_advice(&message, source, span.clone());
            Diagnostic::error(span, message).label(label).help(help)
        }
        None => {
            let (span, parts) = deepest_dotted_key(source);
            if parts >= DOTTED_KEY_LIMIT {
                Diagnostic::error(span, "a dotted key has too many parts (recursion limit)")
                    .label("nested too deep")
                    .help(Some(format!(
                        "the TOML reader accepts at most {DOTTED_KEY_LIMIT} levels; a flow file needs three or four"
                    )))
            } else {
                // Point at the first line so that the report has a place.
                Diagnostic::error(0..source.find('\n').unwrap_or(source.len()), message)
            }
        }
    }
}

/// A label and help for a TOML syntax error at `span`, for the two mistakes a hand-written flow
/// makes most: a key set twice, and a value left unquoted (what to write instead). None for the
/// others: the reader's message stands alone.
fn syntax_advice(message: &str, source: &str, span: std::ops::Range<usize>) -> (String, Option<String>) {
    let text = source.get(span.clone()).unwrap_or_default().trim();
    if text.is_empty() {
        return (String::new(), None);
    }
    if message == "duplicate key" {
        let line_start = source[..span.start.min(source.len())].rfind('\n').map_or(0, |i| i + 1);
        // A table header: `[...]` or `[[...]]` alone on its line (not an array's next line).
        let line = source[line_start..].lines().next().unwrap_or_default().trim();
        let help = if line.starts_with('[') && line.ends_with(']') && !line.contains('=') {
            format!(
                "`{text}` is set twice: a list written as `{text} = [...]` cannot also have `{line}` tables, nor a \
                 table two headers; write each entry one way"
            )
        } else {
            format!("a key is set once in its table: remove one of the two `{text}`")
        };
        return (format!("`{text}` set again"), Some(help));
    }
    if message.starts_with("string values must be quoted") {
        // In double quotes a `\` starts an escape: text with one goes in single quotes, where it
        // stays as written.
        let quoted = match (text.contains('\\'), text.contains('"'), text.contains('\'')) {
            (false, false, _) => Some(format!("\"{text}\"")),
            (_, _, false) => Some(format!("'{text}'")),
            _ => None,
        };
        return ("not quoted".to_owned(), quoted.map(|q| format!("write it in quotes: `{q}`")));
    }
    (String::new(), None)
}

/// The span of the first one-line string (in `'` or `"`, not tripled) that its line ends before
/// it is closed, found with the TOML lexer, which ends such a string at the line's end.
fn open_string(source: &str) -> Option<std::ops::Range<usize>> {
    use toml_parser::lexer::TokenKind;
    toml_parser::Source::new(source).lex().find_map(|token| {
        let span = token.span();
        let text = source.get(span.start()..span.end())?;
        let quote = match token.kind() {
            TokenKind::BasicString => "\"",
            TokenKind::LiteralString => "'",
            _ => return None,
        };
        let tripled = text.starts_with(&quote.repeat(3));
        // In `"`, a quote behind an odd number of backslashes is escaped: not the closing one.
        let before_last = &text.as_bytes()[..text.len().saturating_sub(1)];
        let escapes = before_last.iter().rev().take_while(|b| **b == b'\\').count();
        let closed = text.len() >= 2 && text.ends_with(quote) && (quote == "'" || escapes % 2 == 0);
        (!tripled && !closed).then(|| span.start()..span.end())
    })
}

/// The first `key =` that begins its line with nothing after it on the line (a comment at most),
/// found with the TOML lexer (a line inside a string of several lines is not one): its span (from
/// the key to the `=`), and the key's.
fn key_without_value(source: &str) -> Option<(std::ops::Range<usize>, std::ops::Range<usize>)> {
    use toml_parser::lexer::TokenKind;
    // The key read on this line so far, the end of its `=` once one follows it, and whether only
    // whitespace came before on the line.
    let (mut key, mut equals): (Option<std::ops::Range<usize>>, Option<usize>) = (None, None);
    let mut fresh = true;
    for token in toml_parser::Source::new(source).lex() {
        let span = token.span();
        match (token.kind(), equals) {
            (TokenKind::Whitespace, _) => continue,
            (TokenKind::Newline | TokenKind::Comment | TokenKind::Eof, Some(end)) => {
                let key = key?;
                return Some((key.start..end, key));
            }
            (TokenKind::Newline, None) => {
                key = None;
                fresh = true;
                continue;
            }
            (TokenKind::Equals, None) => equals = key.as_ref().map(|_| span.end()),
            (TokenKind::Atom | TokenKind::BasicString | TokenKind::LiteralString | TokenKind::Dot, None)
                if fresh || key.is_some() =>
            {
                let start = key.as_ref().map_or(span.start(), |k| k.start);
                key = Some(start..span.end());
            }
            // A value (or anything else): not this mistake, on this line.
            (_, Some(_)) => (key, equals) = (None, None),
            _ => key = None,
        }
        fresh = false;
    }
    None
}

/// The most parts the TOML reader accepts in a dotted key (its recursion limit).
const DOTTED_KEY_LIMIT: usize = 80;

/// The span of the dotted key with the most parts (`a.b.c`, whitespace and quoted parts
/// included) and its number of parts, found with the TOML lexer; the start of the file if there
/// is none.
fn deepest_dotted_key(source: &str) -> (std::ops::Range<usize>, usize) {
    use toml_parser::lexer::TokenKind;
    let (mut best, mut best_dots) = (0..0, 0);
    let (mut start, mut dots) = (0, 0);
    for token in toml_parser::Source::new(source).lex() {
        let span = token.span();
        match token.kind() {
            TokenKind::Dot => {
                dots += 1;
                if dots > best_dots {
                    (best, best_dots) = (start..span.end(), dots);
                }
            }
            TokenKind::Atom | TokenKind::BasicString | TokenKind::LiteralString => {
                if dots == 0 {
                    start = span.start();
                }
                if dots == best_dots && best.start == start {
                    best.end = span.end();
                }
            }
            TokenKind::Whitespace => {}
            _ => dots = 0,
        }
    }
    (best, best_dots + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A string left open is found whatever its last character: a multi-byte one, an escaped
    /// quote; one closed behind an escaped backslash, and triple-quoted ones, are not open.
    #[test]
    fn a_string_left_open_at_its_lines_end_is_found_where_it_opens() {
        assert_eq!(open_string("a = 'x\n"), Some(4..6));
        fn missing(source: &str) -> Option<(&str, &str)> {
            key_without_value(source).map(|(span, key)| (&source[span], &source[key]))
        }
        assert_eq!(missing("a = 1\nrun =\n  ['x']\n"), Some(("run =", "run")));
        assert_eq!(missing("a.b = # later\n"), Some(("a.b =", "a.b")));
        assert_eq!(missing("x = '''\nk =\n'''\nrun = [\n  'a',\n]\nt = { a = 1 }\n"), None);
        assert_eq!(missing("last ="), Some(("last =", "last")));
        // Not at its line's start: another mistake (two keys on a line, a key on a header's).
        assert_eq!(missing("timeout = \"1s\" x =\n"), None);
        assert_eq!(missing("[[step]] name =\n"), None);
        assert_eq!(open_string("a = \"é\nb = 1\n"), Some(4..7));
        assert_eq!(open_string("a = 'é\n"), Some(4..7));
        assert_eq!(open_string("a = \"x\\\"\n"), Some(4..8));
        assert_eq!(open_string("a = \"x\\\\\"\nb = 'é'\n"), None);
        assert_eq!(open_string("a = '''x\ny'''\nb = \"\"\"\nz\"\"\"\n"), None);
    }

    #[test]
    fn a_value_is_quoted_back_as_one_line_of_toml() {
        assert_eq!(toml_quoted("a\nb\t\"c\"\\\u{7}\u{9b}é"), r#""a\nb\t\"c\"\\\u0007\u009Bé""#);
        assert_eq!(toml_quoted(""), r#""""#);
    }

    fn errors(src: &str) -> Vec<String> {
        parse(src, Path::new("/x/flow.toml")).unwrap_err().into_iter().map(|d| d.message).collect()
    }

    #[test]
    fn shell_variables_in_run_are_found() {
        use validate::shell_variable;
        assert_eq!(shell_variable("${SRC_URL}"), Some("${SRC_URL}"));
        assert_eq!(shell_variable("--out=$HOME/x"), Some("$HOME"));
        assert_eq!(shell_variable("price: $5, $_a1"), Some("$_a1"));
        assert_eq!(shell_variable("a$"), None);
        assert_eq!(shell_variable("${}"), None);
        assert_eq!(shell_variable("${X"), None);
        assert_eq!(shell_variable("^foo$"), None);
    }

    #[test]
    fn minimal_flow_gets_defaults() {
        let (flow, warnings) = parse("[[step]]\nname = 'a'\nrun = ['true']\n", Path::new("/x/demo.toml")).unwrap();
        assert!(warnings.is_empty());
        assert_eq!(flow.name, "demo");
        let step = &flow.steps[0];
        assert_eq!(step.retry.attempts, 1);
        assert_eq!(step.timeout, None);
        assert_eq!(step.kill_grace, std::time::Duration::from_secs(10));
        assert_eq!(&*step.workdir, Path::new("/x"));
    }

    #[test]
    fn retry_table_defaults_to_101_attempts_on_exception() {
        let (flow, _) = parse("[[step]]\nname = 'a'\nrun = ['true']\nretry = {}\n", Path::new("/x/f.toml")).unwrap();
        assert_eq!(flow.steps[0].retry.attempts, 101);
        assert_eq!(flow.steps[0].retry.exception_types, ["Exception"]);
    }

    #[test]
    fn named_policies_and_defaults_apply() {
        let src = "[defaults]\nretry = 'net'\ntimeout = '2m 30s'\n[policies.net]\nattempts = 4\n\
                   [[step]]\nname = 'a'\nrun = ['true']\n";
        let (flow, _) = parse(src, Path::new("/x/f.toml")).unwrap();
        assert_eq!(flow.steps[0].retry.attempts, 4);
        assert_eq!(flow.steps[0].retry_name.as_deref(), Some("net"));
        assert_eq!(flow.steps[0].timeout, Some(std::time::Duration::from_secs(150)));
    }

    #[test]
    fn unknown_keys_name_the_path_and_suggest() {
        let src = "[[step]]\nname = 'a'\nrun = ['true']\n[step.retry]\natempts = 3\n";
        let d = parse(src, Path::new("/x/f.toml")).unwrap_err().remove(0);
        assert_eq!(d.message, "`step[0].retry.atempts`: unknown key");
        assert!(d.help.unwrap().starts_with("did you mean `attempts`?"));
    }

    #[test]
    fn bad_values_are_all_reported() {
        let errs = errors(
            "[[step]]\nname = 'a'\nrun = ['true']\ntimeout = 0\nretry = { attempts = 0, exception_types = ['a.B'] }\n",
        );
        assert_eq!(errs.len(), 3, "{errs:?}");
    }

    #[test]
    fn messages_name_the_real_problem() {
        let step = "[[step]]\nname = 'a'\nrun = ['true']\n";
        let errs = errors(&format!("{step}retry = {{ attempts = 5000000000 }}\n"));
        assert!(errs[0].ends_with("`attempts` must be at most 1000000"), "{errs:?}");
        let errs = errors(&format!("{step}timeout = inf\n"));
        assert!(errs[0].ends_with("a duration must be a finite number of seconds"), "{errs:?}");
        let errs = errors(&format!("[errors]\nA = []\nC = ['B']\nB = ['C']\n{step}"));
        assert_eq!(errs, ["`errors.B`: class `B` inherits from itself: B -> C -> B"]);
        let errs = errors(&format!("defaults = 5\n{step}"));
        assert_eq!(errs, ["`defaults`: expected a table, found an integer"]);
        let d = parse(&format!("[exit_codes]\nsegv = 'ValueError'\n{step}"), Path::new("/x/f.toml")).unwrap_err();
        assert_eq!(d[0].help.as_deref(), Some("did you mean \"SIGSEGV\"?"));
    }

    /// An argument, shell command, environment value or parameter default longer than the kernel
    /// passes in one string (no attempt could ever start) is an error at load, naming the field;
    /// one byte shorter loads.
    #[test]
    fn an_argument_or_script_too_long_to_pass_is_an_error() {
        let most = validate::max_arg();
        let over = "x".repeat(most + 1);
        let errs = errors(&format!("[[step]]\nname = 'a'\nrun = ['echo', '{over}']\n"));
        assert_eq!(
            errs,
            [format!(
                "`step[0].run[1]`: a program or argument is {} bytes, more than the system passes to a program in one \
                 string (at most {most})",
                most + 1
            )]
        );
        let errs = errors(&format!("[[step]]\nname = 'a'\nshell = '{over}'\n"));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(errs[0].starts_with("`step[0].shell`: a shell command is"), "{errs:?}");
        let fits = "x".repeat(most);
        assert!(parse(&format!("[[step]]\nname = 'a'\nshell = '{fits}'\n"), Path::new("/x/f.toml")).is_ok());
        // A variable is passed as `NAME=value`: the name and `=` count too.
        let value = "x".repeat(most - 1);
        let errs = errors(&format!("env = {{ AB = '{value}' }}\n[[step]]\nname = 'a'\nrun = ['true']\n"));
        assert_eq!(
            errs,
            [format!(
                "`env.AB`: an environment value is {} bytes, more than the system passes to a program in one string \
                 (at most {})",
                most - 1,
                most - 3
            )]
        );
        let src = format!("[params]\nday = '{value}'\n[[step]]\nname = 'a'\nrun = ['true']\n");
        let errs = errors(&src);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(errs[0].contains("a parameter's default is"), "{errs:?}");
    }

    /// Of two declared classes equally close to an unknown base, the same one is suggested on
    /// every load (they were taken from a hash set, in an order that changed from run to run).
    #[test]
    fn the_suggested_base_class_does_not_change_from_load_to_load() {
        let src = "[errors]\nB = ['']\nx = []\n[[step]]\nname = 'a'\nrun = ['true']\n";
        for _ in 0..20 {
            let d = parse(src, Path::new("/x/f.toml")).unwrap_err();
            assert_eq!(d[0].help.as_deref(), Some("did you mean `B`?"));
        }
    }

    #[test]
    fn error_classes_are_checked() {
        let errs = errors("[errors]\nValueError = []\nA = ['Nope']\n[[step]]\nname = 'a'\nrun = ['true']\n");
        assert!(errs.iter().any(|e| e.contains("built-in")), "{errs:?}");
        assert!(errs.iter().any(|e| e.contains("unknown base class `Nope`")), "{errs:?}");
    }

    #[test]
    fn every_type_error_and_unknown_key_is_reported_in_file_order() {
        let src = "[[step]]\nname = 'a'\nrun = 'echo hi'\ntimeuot = 5\n\
                   [[step]]\nname = 'b'\nrun = ['true']\nretry = { attempts = '3', jitter = 1 }\n";
        assert_eq!(
            errors(src),
            [
                "`step[0].run`: expected an array of strings, found a string",
                "`step[0].timeuot`: unknown key",
                "`step[1].retry.attempts`: expected an integer, found a string",
                "`step[1].retry.jitter`: expected a boolean, found an integer",
            ]
        );
    }

    #[test]
    fn a_value_of_the_wrong_type_is_reported_once() {
        let step = "[[step]]\nname = 'a'\nrun = ['true']\n";
        // No "step has no name", "nothing to run", "no steps", "unknown policy" or "unknown class"
        // after the type error itself.
        assert_eq!(
            errors("[[step]]\nname = 1\nrun = ['true']\n"),
            ["`step[0].name`: expected a string, found an integer"]
        );
        assert_eq!(
            errors("[[step]]\nname = 'a'\nrun = [1]\n"),
            ["`step[0].run[0]`: expected a string, found an integer"]
        );
        assert_eq!(
            errors("[[step]]\nname = 'a'\nshell = ['x']\n"),
            ["`step[0].shell`: expected a string, found an array"]
        );
        assert_eq!(errors("step = 5\n"), ["`step`: expected an array of tables, found an integer"]);
        assert_eq!(errors("name = 5\n[[step]]\nname = 'a'\nrun = ['true']\n").len(), 1);
        assert_eq!(
            errors(&format!("[policies]\nnet = 5\n{step}retry = 'net'\n")),
            ["`policies.net`: expected a table, found an integer"]
        );
        assert_eq!(
            errors(&format!("[errors]\nBusy = 'Exception'\n[exit_codes]\n3 = 'Busy'\n{step}")),
            ["`errors.Busy`: expected an array of strings, found a string"]
        );
    }

    #[test]
    fn type_errors_say_what_would_work() {
        let help = |src: &str| parse(src, Path::new("/x/f.toml")).unwrap_err().remove(0).help.unwrap_or_default();
        let step = "[[step]]\nname = 'a'\n";
        assert_eq!(
            help(&format!("{step}run = 'echo hi'\n")),
            "use a list of arguments, or `shell = \"...\"`: `run = [\"echo\", \"hi\"]` or `shell = \"echo hi\"`"
        );
        assert_eq!(
            errors(&format!("{step}run = ['true']\nretry = {{ attempts = 99999999999999999999 }}\n")),
            ["`step[0].retry.attempts`: `attempts` must be at most 1000000"],
            "an integer past i64 is out of range, not of the wrong type"
        );
        assert_eq!(help(&format!("{step}run = 'ls | wc'\n")), "use a list of arguments, or `shell = \"...\"`");
        assert!(help(&format!("{step}run = ['true']\ntimeout = []\n")).contains("\"2m 30s\""));
        assert_eq!(
            help(&format!("{step}run = ['true']\nretry = {{ attempts = '3' }}\n")),
            "write the number without quotes: `3`"
        );
        assert_eq!(
            help(&format!("{step}run = ['true']\nkill_signal = 15\n")),
            "write the signal's name: `\"SIGTERM\"`"
        );
        assert_eq!(
            help(&format!("{step}run = ['true']\nretry = {{ backoff_max_seconds = '1m' }}\n")),
            "this key counts seconds as a number: write `60`"
        );
        assert_eq!(
            help(&format!("{step}run = ['true']\nattempts = 3\n")),
            "`attempts` belongs in a retry policy: write `retry = { attempts = ... }`"
        );
    }
    fn load(src: &str) -> Flow {
        parse(src, Path::new("/x/flow.toml")).unwrap_or_else(|d| panic!("{d:?}")).0
    }

    /// `(needs, explicit)` of every step.
    fn needs(flow: &Flow) -> Vec<(Vec<usize>, bool)> {
        flow.steps.iter().map(|s| (s.needs.to_vec(), s.needs_explicit)).collect()
    }

    fn steps(names_and_needs: &[(&str, Option<&str>)]) -> String {
        names_and_needs
            .iter()
            .map(|(name, needs)| {
                let needs = needs.map(|n| format!("needs = {n}\n")).unwrap_or_default();
                format!("[[step]]\nname = '{name}'\n{needs}run = ['true']\n")
            })
            .collect()
    }

    #[test]
    fn without_needs_each_step_needs_the_one_before() {
        let flow = load(&steps(&[("a", None), ("b", None), ("c", None)]));
        assert_eq!(needs(&flow), [(vec![], false), (vec![0], false), (vec![1], false)]);
        assert!(!flow.has_explicit_needs());
    }

    #[test]
    fn needs_resolve_to_indices_in_the_order_written() {
        let flow = load(&steps(&[
            ("fetch-a", Some("[]")),
            ("load", Some("['fetch-b', 'fetch-a']")),
            ("fetch-b", Some("[]")),
            ("report", None),
        ]));
        assert_eq!(needs(&flow), [(vec![], true), (vec![2, 0], true), (vec![], true), (vec![2], false)]);
        assert!(flow.has_explicit_needs());
    }

    #[test]
    fn bad_needs_are_reported_at_the_entry_with_what_to_do() {
        let src = steps(&[("fetch", Some("[]")), ("load", Some("['fetch', 'fecth', 'load', 'fetch', 'zzz']"))]);
        let d = parse(&src, Path::new("/x/f.toml")).unwrap_err();
        let got: Vec<(&str, &str, Option<&str>, usize)> = d
            .iter()
            .map(|d| (d.message.as_str(), d.label.as_str(), d.help.as_deref(), d.location.unwrap().column))
            .collect();
        assert_eq!(
            got,
            [
                ("`step[1].needs[1]`: no step named `fecth`", "unknown step", Some("did you mean `fetch`?"), 19),
                (
                    "`step[1].needs[2]`: step `load` cannot need itself",
                    "its own name",
                    Some(
                        "remove it; without `needs` a step needs the step before it, and `needs = []` makes it a root"
                    ),
                    28
                ),
                ("`step[1].needs[3]`: `fetch` is listed twice", "listed again", Some("remove one of the two"), 36),
                (
                    "`step[1].needs[4]`: no step named `zzz`",
                    "unknown step",
                    Some("`needs` lists the `name`s of other steps of this flow"),
                    45
                ),
            ]
        );
    }

    #[test]
    fn a_cycle_is_named_and_pointed_at_the_entry_that_closes_it() {
        let src = steps(&[("a", Some("['b']")), ("b", Some("['c']")), ("c", Some("['a']")), ("d", Some("[]"))]);
        let d = parse(&src, Path::new("/x/f.toml")).unwrap_err();
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].message, "`step[2].needs[0]`: steps need each other in a cycle: a -> b -> c -> a");
        assert_eq!(d[0].label, "closes the cycle");
        assert_eq!(d[0].location.unwrap().line, src.lines().position(|l| l == "needs = ['a']").unwrap() + 1);
        assert_eq!(
            d[0].help.as_deref(),
            Some("`x -> y` means x needs y, so none of these steps could ever start; remove one of these needs")
        );
    }

    #[test]
    fn a_cycle_through_a_step_without_needs_points_at_a_written_entry() {
        // b has no `needs`, so it needs a; a needs b.
        let d = parse(&steps(&[("a", Some("['b']")), ("b", None)]), Path::new("/x/f.toml")).unwrap_err();
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].message, "`step[0].needs[0]`: steps need each other in a cycle: b -> a -> b");
        assert_eq!(
            d[0].help.as_deref(),
            Some(
                "`b` has no `needs`, so it needs the step before it (`needs = []` makes it a root); `x -> y` means \
                 x needs y, so none of these steps could ever start; remove one of these needs"
            )
        );
    }

    #[test]
    fn two_cycles_are_two_errors() {
        let src = steps(&[("a", Some("['b']")), ("b", Some("['a']")), ("c", Some("['d']")), ("d", Some("['c']"))]);
        assert_eq!(
            errors(&src),
            [
                "`step[1].needs[0]`: steps need each other in a cycle: a -> b -> a",
                "`step[3].needs[0]`: steps need each other in a cycle: c -> d -> c"
            ]
        );
    }

    #[test]
    fn needs_are_checked_against_steps_that_are_themselves_invalid() {
        // `a` has nothing to run: that is the one error, not also "no step named `a`".
        let src = "[[step]]\nname = 'a'\n[[step]]\nname = 'b'\nneeds = ['a']\nrun = ['true']\n";
        assert_eq!(errors(src), ["`step[0]`: step `a` has nothing to run"]);
        // `needs` of the wrong type is reported once, and the step is not taken to need anything.
        assert_eq!(
            errors(&steps(&[("a", None), ("b", Some("'a'"))])),
            ["`step[1].needs`: expected an array of strings, found a string"]
        );
    }

    #[test]
    fn new_top_level_keys_default_to_todays_behaviour() {
        let flow = load(&steps(&[("a", None)]));
        assert_eq!(flow.max_parallel, 4);
        assert!(!flow.fail_fast);
        assert_eq!(flow.timeout, None);
        assert!(flow.params.is_empty() && flow.secret_env.is_empty());
        assert_eq!(flow.env_file, None);
        assert_eq!(flow.hooks, model::Hooks::default());
        assert!(flow.steps[0].catch.is_empty());
        assert_eq!(flow.steps[0].compensate, None);
    }

    #[test]
    fn new_top_level_keys_are_read() {
        let src = format!(
            "max_parallel = 2\nfail_fast = true\ntimeout = '1h'\nenv_file = 'conf/.env'\n\
             secret_env = ['API_TOKEN', 'DB_PASSWORD']\n\
             [params]\ndate = {{}}\nregion = 'eu'\n\
             [hooks]\non_success = ['notify', 'ok']\non_failure = 'page \"$WAYMARK_FAILED_STEP\"'\n{}",
            steps(&[("a", None)])
        );
        let flow = load(&src);
        assert_eq!(flow.max_parallel, 2);
        assert!(flow.fail_fast);
        assert_eq!(flow.timeout, Some(std::time::Duration::from_secs(3600)));
        assert_eq!(flow.env_file.as_deref(), Some(Path::new("/x/conf/.env")));
        assert_eq!(flow.secret_env, ["API_TOKEN", "DB_PASSWORD"]);
        assert_eq!(flow.params["date"], model::Param { default: None });
        assert_eq!(flow.params["region"], model::Param { default: Some("eu".into()) });
        assert_eq!(flow.hooks.on_success, Some(model::Command::Run(vec!["notify".into(), "ok".into()])));
        assert_eq!(flow.hooks.on_failure, Some(model::Command::Shell("page \"$WAYMARK_FAILED_STEP\"".into())));
        assert_eq!(flow.hooks.on_exit, None);
    }

    #[test]
    fn catch_handlers_and_compensation_are_read() {
        let src = "[[step]]\nname = 'a'\nrun = ['true']\ncompensate = ['rm', 'x']\n\
                   catch = [{ exception_types = ['ActionTimeout'], run = ['cp', 'cache', 'x'] }, {}]\n\
                   [[step]]\nname = 'b'\nrun = ['true']\ncompensate = 'rm y'\n\
                   [[step.catch]]\nexception_types = ['OSError', 'ValueError']\nshell = 'echo caught'\n";
        let flow = load(src);
        let a = &flow.steps[0];
        assert_eq!(a.compensate, Some(model::Command::Run(vec!["rm".into(), "x".into()])));
        assert_eq!(
            a.catch,
            [
                model::Catch {
                    exception_types: vec!["ActionTimeout".into()],
                    command: Some(model::Command::Run(vec!["cp".into(), "cache".into(), "x".into()]))
                },
                model::Catch { exception_types: vec!["Exception".into()], command: None },
            ]
        );
        let b = &flow.steps[1];
        assert_eq!(b.compensate, Some(model::Command::Shell("rm y".into())));
        assert_eq!(b.catch[0].exception_types, ["OSError", "ValueError"]);
        assert_eq!(b.catch[0].command, Some(model::Command::Shell("echo caught".into())));
    }

    #[test]
    fn bad_values_of_the_new_keys_are_all_reported() {
        let src = format!(
            "max_parallel = 0\ntimeout = 0\nsecret_env = ['$TOKEN']\nenv_file = ''\n\
             [params]\n'my-date' = 'x'\nzone = 'a'\nZONE = 'b'\n[hooks]\non_exit = []\n{}\
             retry = {{ exception_types = ['WorkflowTimeout'] }}\ncatch = [{{ exception_types = ['WorkflowTimeout'] }}]\n",
            steps(&[("a", None)])
        );
        assert_eq!(
            errors(&src),
            [
                "`max_parallel`: `max_parallel` must be at least 1, got 0",
                "`timeout`: a duration must be at least 1 ms, got 0 s",
                "`secret_env[0]`: `$TOKEN` is not a variable name",
                "`env_file`: the path of the env file is empty",
                "`params.my-date`: `my-date` is not a parameter name: it must start with a letter or `_` and hold \
                 only ASCII letters, digits and `_`",
                "`params.ZONE`: parameters `zone` and `ZONE` would both be `WAYMARK_PARAM_ZONE`",
                "`hooks.on_exit`: a command needs at least a program name",
                "`step[0].retry.exception_types[0]`: `WorkflowTimeout` is never retried: it ends the run when the \
                 flow's `timeout` passes",
                "`step[0].catch[0].exception_types[0]`: `WorkflowTimeout` is never caught: it ends the run when the \
                 flow's `timeout` passes",
            ]
        );
        assert_eq!(
            errors(&format!("max_parallel = 99999999999999999999\n{}", steps(&[("a", None)]))),
            ["`max_parallel`: `max_parallel` must be at most 10000"]
        );
    }

    /// A secret's value written in the flow file is recorded with every run: said, not refused.
    #[test]
    fn a_secret_written_in_an_env_table_is_a_warning() {
        let src =
            format!("secret_env = ['API_TOKEN', 'OTHER']\nenv = {{ API_TOKEN = 'x' }}\n{}", steps(&[("a", None)]));
        let (_, warnings) = parse(&src, Path::new("/x/flow.toml")).unwrap();
        let messages: Vec<&str> = warnings.iter().map(|w| w.message.as_str()).collect();
        assert_eq!(
            messages,
            ["`env.API_TOKEN`: the value of secret `API_TOKEN` is written in this file (the flow's `env`), and every \
                 run records the flow's definition, its `env` tables included, in the state database"]
        );
    }

    /// A step whose `name` has the wrong type is the one error: the step that needs it by that
    /// name is not also said to need an unknown step.
    #[test]
    fn a_name_of_the_wrong_type_does_not_make_its_dependents_unknown() {
        let src = "[[step]]\nname = 2024\nrun = ['true']\n[[step]]\nname = 'b'\nneeds = ['2024']\nrun = ['true']\n";
        let said: Vec<String> =
            parse(src, Path::new("/x/flow.toml")).unwrap_err().into_iter().map(|d| d.message).collect();
        assert_eq!(said, ["`step[0].name`: expected a string, found an integer"]);
    }

    /// A step with errors, named or not, still has its `env` checked for secrets: every problem is
    /// said at once.
    #[test]
    fn a_secret_written_in_a_step_with_errors_is_still_a_warning() {
        let src = "secret_env = ['T', 'U']\n\
                   [[step]]\nrun = ['true']\nenv = { T = 'x' }\n\
                   [[step]]\nname = 'b'\nrun = ['true']\ntimeout = 'soon'\nenv = { U = 'y' }\n";
        let said: Vec<String> =
            parse(src, Path::new("/x/flow.toml")).unwrap_err().into_iter().map(|d| d.message).collect();
        assert_eq!(
            said,
            [
                "`step[0]`: a step has no `name`",
                "`step[0].env.T`: the value of secret `T` is written in this file (the `env` of a step without a \
                 name), and every run records the flow's definition, its `env` tables included, in the state \
                 database",
                "`step[1].timeout`: invalid duration \"soon\": a number was expected where it says `soon`",
                "`step[1].env.U`: the value of secret `U` is written in this file (step `b`'s `env`), and every run \
                 records the flow's definition, its `env` tables included, in the state database",
            ]
        );
    }

    /// A secret listed twice is an error, and its value written in the file is said once.
    #[test]
    fn a_secret_listed_twice_is_an_error_and_its_warning_is_said_once() {
        let src = format!("secret_env = ['T', 'T']\nenv = {{ T = 'x' }}\n{}", steps(&[("a", None)]));
        let said: Vec<String> =
            parse(&src, Path::new("/x/flow.toml")).unwrap_err().into_iter().map(|d| d.message).collect();
        assert_eq!(
            said,
            [
                "`secret_env[1]`: `T` is listed twice",
                "`env.T`: the value of secret `T` is written in this file (the flow's `env`), and every run records \
                 the flow's definition, its `env` tables included, in the state database"
            ]
        );
    }

    /// Parameter values are recorded with the run; a secret never is.
    #[test]
    fn a_parameter_cannot_be_a_secret() {
        let src = format!(
            "secret_env = ['API_TOKEN', 'WAYMARK_PARAM_TOKEN']\n[params]\ntoken = {{}}\n{}",
            steps(&[("a", None)])
        );
        assert_eq!(
            errors(&src),
            ["`secret_env[1]`: `WAYMARK_PARAM_TOKEN` is parameter `token`, which cannot be a secret"]
        );
    }

    #[test]
    fn wrong_types_of_the_new_keys_say_what_would_work() {
        let help = |src: &str| parse(src, Path::new("/x/f.toml")).unwrap_err().remove(0).help.unwrap_or_default();
        let a = steps(&[("a", None)]);
        assert_eq!(help(&format!("max_parallel = '2'\n{a}")), "write the number without quotes: `2`");
        assert_eq!(help(&format!("max_parallel = 2.0\n{a}")), "write a whole number: `2`");
        assert_eq!(help(&format!("fail_fast = 'true'\n{a}")), "write `true` without quotes");
        assert_eq!(help(&format!("secret_env = 'TOKEN'\n{a}")), "write a list: `secret_env = [\"TOKEN\"]`");
        assert_eq!(
            help(&format!("[params]\ndate = 2026\n{a}")),
            "a default is a string: write it in quotes: `\"2026\"`"
        );
        assert_eq!(
            help(&format!("[hooks]\non_exit = 5\n{a}")),
            "write `on_exit = [\"program\", \"arg\"]` to run a program, or `on_exit = \"command line\"` for /bin/sh -c"
        );
        assert_eq!(help(&format!("{a}needs = 'x'\n")), "write a list: `needs = [\"x\"]`");
        assert!(help(&format!("{a}catch = {{ run = ['x'] }}\n")).starts_with("put the handler in a list: "));
        assert_eq!(
            help(&format!("hooks = ['x']\n{a}")),
            "write a `[hooks]` table with keys such as `on_failure = [\"notify\", \"failed\"]`"
        );
        assert!(
            help(&format!("[hooks]\non_fail = ['x']\n{a}"))
                .starts_with("did you mean `on_failure`? valid keys here: `on_success`")
        );
        assert!(
            help(&format!("{a}catch = [{{ exception_type = ['X'] }}]\n"))
                .starts_with("did you mean `exception_types`?")
        );
    }

    /// The flow files in README.md's "Workflow structure" section load.
    #[test]
    fn the_readme_examples_of_the_workflow_structure_load() {
        let readme = include_str!("../../README.md");
        let section = &readme[readme.find("### Workflow structure").unwrap()..readme.find("### Durations").unwrap()];
        let blocks: Vec<&str> = section.split("```toml\n").skip(1).map(|b| &b[..b.find("```").unwrap()]).collect();
        assert_eq!(blocks.len(), 6, "the fan-out, slot wait, catch, parameters, outputs and environment examples");
        for block in blocks {
            parse(block, Path::new("/x/etl.toml")).unwrap_or_else(|d| panic!("{d:?}\n{block}"));
        }
    }
}
