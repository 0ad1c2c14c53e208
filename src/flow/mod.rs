//! The flow file: raw serde types (`raw`), validation into domain types (`validate`, `model`),
//! and diagnostics that point into the file (`diagnostic`).

pub mod diagnostic;
pub mod model;
pub mod raw;
pub mod validate;

pub use diagnostic::Diagnostic;
pub use model::{Command, ExitCodes, Flow, Signal, Step};

use std::io::Read;
use std::path::{Path, PathBuf};

/// The largest flow file waymark reads (16 MiB). A flow file is a short text; the limit keeps
/// `waymark check /dev/zero`, a FIFO or a mistaken path from reading until memory runs out.
pub const MAX_FLOW_BYTES: u64 = 16 * 1024 * 1024;

/// A flow that loaded, with the warnings found on the way.
#[derive(Debug)]
pub struct Loaded {
    pub flow: Flow,
    pub source: String,
    pub warnings: Vec<Diagnostic>,
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
    pub fn render(&self, color: bool) -> String {
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

/// Read, parse and validate the flow file at `path`.
pub fn load(path: &Path) -> Result<Loaded, LoadError> {
    let read_error = |source| LoadError::Read { path: path.to_owned(), source };
    let mut bytes = Vec::new();
    // One byte more than the limit tells a file at the limit from a larger one, and bounds the
    // read of an endless stream.
    std::fs::File::open(path).and_then(|f| f.take(MAX_FLOW_BYTES + 1).read_to_end(&mut bytes)).map_err(read_error)?;
    if bytes.len() as u64 > MAX_FLOW_BYTES {
        return Err(LoadError::TooLarge { path: path.to_owned() });
    }
    let shown = path.display().to_string();
    let source = decode(bytes).map_err(|bad| {
        let (source_text, diagnostic) = *bad;
        LoadError::Invalid { shown: shown.clone(), source_text, diagnostics: vec![diagnostic] }
    })?;
    // Canonical, so that the same file reached by another path is recognised as the same flow file.
    let absolute = std::fs::canonicalize(path).or_else(|_| std::path::absolute(path)).map_err(read_error)?;
    parse(&source, &absolute)
        .map(|(flow, warnings)| Loaded { flow, source: source.clone(), warnings })
        .map_err(|diagnostics| LoadError::Invalid { shown, source_text: source, diagnostics })
}

/// The flow text in `bytes`; for a file that is not UTF-8, the text to draw instead (invalid
/// bytes replaced, everything before the first one unchanged) and the diagnostic pointing at
/// the first invalid byte.
pub fn decode(bytes: Vec<u8>) -> Result<String, Box<(String, Diagnostic)>> {
    String::from_utf8(bytes).map_err(|e| {
        let valid_up_to = e.utf8_error().valid_up_to();
        Box::new(not_utf8(e.as_bytes(), valid_up_to))
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
pub fn parse(source: &str, path: &Path) -> Result<(Flow, Vec<Diagnostic>), Vec<Diagnostic>> {
    let lines = diagnostic::Lines::new(source);
    let locate = |mut diags: Vec<Diagnostic>| {
        for d in &mut diags {
            d.locate(source, &lines);
        }
        diags
    };
    let raw: raw::RawFlow = toml::from_str(source).map_err(|e| locate(vec![serde_diagnostic(&e, source)]))?;
    validate::validate(raw, path, source).map(|(flow, warnings)| (flow, locate(warnings))).map_err(locate)
}

/// Turn a TOML or serde error into a diagnostic, naming the key and suggesting a valid one.
fn serde_diagnostic(e: &toml::de::Error, source: &str) -> Diagnostic {
    let message = e.message().trim().to_owned();
    if e.span().is_none() && message == "recursion limit" {
        // The parser names no place for a dotted key nested too deep: find the deepest key.
        let d = Diagnostic::error(deepest_dotted_key(source), "a dotted key has too many parts (recursion limit)")
            .label("nested too deep")
            .help(Some("the TOML reader accepts at most 80 levels; a flow file needs three or four".into()));
        return d;
    }
    let key = e.span().and_then(|s| diagnostic::key_path_at(source, s.start));
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let quoted: Vec<&str> = rest.split('`').step_by(2).collect();
        let unknown = quoted.first().copied().unwrap_or_default();
        let valid: Vec<&str> = quoted.iter().skip(1).copied().filter(|s| !s.is_empty()).collect();
        let suggestion = crate::suggest::closest(unknown, valid.iter().copied());
        let valid_list = valid.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ");
        let help = match suggestion {
            Some(s) => format!("did you mean `{s}`? valid keys here: {valid_list}"),
            None => format!("valid keys here: {valid_list}"),
        };
        return Diagnostic::error(e.span(), format!("`{}`: unknown key", key.as_deref().unwrap_or(unknown)))
            .label("unknown key")
            .help(Some(help));
    }
    let message = plain_types(&message);
    // A number in quotes, where a number is expected.
    let unquote = message
        .strip_prefix("invalid type: string \"")
        .and_then(|rest| rest.split_once('"'))
        .filter(|(text, expected)| expected.contains("expected a") && text.trim().parse::<f64>().is_ok())
        .map(|(text, _)| format!("write the number without quotes: `{}`", text.trim()));
    let message = match (key, message.as_str()) {
        (Some(k), _) => format!("`{k}`: {message}"),
        (None, "duplicate key") => match e.span().and_then(|s| source.get(s)) {
            Some(k) => format!("duplicate key `{}`", k.trim_matches(['"', '\''])),
            None => message,
        },
        (None, _) => message,
    };
    Diagnostic::error(e.span(), message).help(unquote)
}

/// The span of the dotted key with the most parts (`a.b.c`, whitespace and quoted parts
/// included), found with the TOML lexer; the start of the file if there is none.
fn deepest_dotted_key(source: &str) -> std::ops::Range<usize> {
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
    best
}

/// Serde's type names as a TOML user knows them (`i64` → an integer, a map → a table).
fn plain_types(message: &str) -> String {
    const NAMES: [(&str, &str); 8] = [
        ("expected i64", "expected an integer"),
        ("expected u32", "expected an integer"),
        ("expected f64", "expected a number"),
        ("expected a sequence", "expected an array"),
        ("invalid type: sequence", "invalid type: array"),
        ("invalid type: map", "invalid type: table"),
        ("expected a map", "expected a table"),
        ("floating point `", "float `"),
    ];
    let mut out = NAMES.iter().fold(message.to_owned(), |m, (from, to)| m.replace(from, to));
    // `expected struct RawStep` names one of our types; the user wrote a table there.
    const STRUCT: &str = "expected struct ";
    if let Some(at) = out.find(STRUCT) {
        let name_start = at + STRUCT.len();
        let end = out[name_start..].find(|c: char| !c.is_alphanumeric()).map_or(out.len(), |i| name_start + i);
        out.replace_range(at..end, "expected a table");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(src: &str) -> Vec<String> {
        parse(src, Path::new("/x/flow.toml")).unwrap_err().into_iter().map(|d| d.message).collect()
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
        assert_eq!(step.workdir, Path::new("/x"));
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
        assert!(errs[0].ends_with("invalid type: integer `5`, expected a table"), "{errs:?}");
        let d = parse(&format!("[exit_codes]\nsegv = 'ValueError'\n{step}"), Path::new("/x/f.toml")).unwrap_err();
        assert_eq!(d[0].help.as_deref(), Some("did you mean \"SIGSEGV\"?"));
    }

    #[test]
    fn error_classes_are_checked() {
        let errs = errors("[errors]\nValueError = []\nA = ['Nope']\n[[step]]\nname = 'a'\nrun = ['true']\n");
        assert!(errs.iter().any(|e| e.contains("built-in")), "{errs:?}");
        assert!(errs.iter().any(|e| e.contains("unknown base class `Nope`")), "{errs:?}");
    }
}
