//! The dotenv syntax of a flow's `env_file`: pure parsing, no file access and no expansion.
//!
//! - `KEY=value`, one per line; spaces around `=` and a leading `export ` are allowed. Keys are
//!   `[A-Za-z_][A-Za-z0-9_]*`.
//! - Blank lines and lines whose first non-blank character is `#` are ignored; in an unquoted
//!   value, a `#` after a space or tab starts a comment. An unquoted value is trimmed.
//! - `'single quotes'` keep their text as written; `"double quotes"` read `\n`, `\r`, `\t`,
//!   `\"`, `\\` and `\$` (any other backslash stays as written). Either may span lines. After
//!   the closing quote only blanks and a `# comment` may follow.
//! - `$VAR` is never expanded: values are taken as written.
//! - A key given twice keeps its last value.
//!
//! Every bad line is reported, with its number, in one go.

use std::collections::BTreeMap;

/// A line of a dotenv file that cannot be read, and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct DotenvError {
    /// 1-based.
    pub line: usize,
    pub message: String,
}

/// Longest piece of a line quoted back in a message.
const SHOWN: usize = 40;

fn shown(text: &str) -> String {
    match text.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// The variables of a dotenv text, or every error in it.
pub fn parse(text: &str) -> Result<BTreeMap<String, String>, Vec<DotenvError>> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let lines: Vec<&str> = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l)).collect();
    let mut vars = BTreeMap::new();
    let mut errors = Vec::new();
    let mut next = 0;
    while next < lines.len() {
        let number = next + 1;
        let line = lines[next].trim_start();
        next += 1;
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut error = |line: usize, message: String| errors.push(DotenvError { line, message });
        let rest = line.strip_prefix("export").filter(|r| r.starts_with([' ', '\t'])).map_or(line, str::trim_start);
        let Some((key, after)) = rest.split_once('=') else {
            error(
                number,
                format!(
                    "`{}` is not `KEY=value`: write `NAME=value`, or start the line with `#` to make it a comment",
                    shown(line.trim_end())
                ),
            );
            continue;
        };
        let key = key.trim_end();
        if key.is_empty() {
            error(number, "the name before `=` is empty: write `NAME=value`".into());
            continue;
        }
        if !super::validate::is_identifier(key) {
            error(
                number,
                format!(
                    "`{}` is not a variable name: a name holds ASCII letters, digits and `_` and does not start \
                     with a digit",
                    shown(key)
                ),
            );
            continue;
        }
        let after = after.trim_start_matches([' ', '\t']);
        let value = match after.chars().next() {
            Some(quote @ ('\'' | '"')) => {
                let mut value = String::new();
                let mut body = &after[1..];
                let mut end_line = number;
                let closed = loop {
                    match scan(body, quote, &mut value) {
                        Some(rest) => break Some(rest),
                        None if next < lines.len() => {
                            value.push('\n');
                            body = lines[next];
                            next += 1;
                            end_line = next;
                        }
                        None => break None,
                    }
                };
                let Some(rest) = closed else {
                    error(
                        number,
                        format!("the closing {quote} of `{key}`'s value is missing: add it where the value ends"),
                    );
                    continue;
                };
                let rest = rest.trim_start_matches([' ', '\t']);
                if !rest.is_empty() && !rest.starts_with('#') {
                    error(
                        end_line,
                        format!(
                            "unexpected `{}` after the closing {quote} of `{key}`'s value: quote the whole value, \
                             or start a comment with `#`",
                            shown(rest)
                        ),
                    );
                    continue;
                }
                value
            }
            _ => {
                // A `#` after a blank starts a comment; one inside a word (`a#b`) is part of it.
                let cut =
                    after.char_indices().find(|&(i, c)| c == '#' && (i == 0 || after[..i].ends_with([' ', '\t'])));
                after[..cut.map_or(after.len(), |(i, _)| i)].trim_end().to_owned()
            }
        };
        if value.contains('\0') {
            error(number, format!("`{key}`'s value holds a NUL byte, which no program can receive: remove it"));
            continue;
        }
        vars.insert(key.to_owned(), value);
    }
    if errors.is_empty() { Ok(vars) } else { Err(errors) }
}

/// Read a quoted value's text from `body` into `value` up to the closing `quote`; the text after
/// it, or `None` when the line ends first.
fn scan<'b>(body: &'b str, quote: char, value: &mut String) -> Option<&'b str> {
    let mut chars = body.char_indices();
    while let Some((i, c)) = chars.next() {
        if c == quote {
            return Some(&body[i + 1..]);
        }
        if c == '\\' && quote == '"' {
            match chars.next() {
                Some((_, 'n')) => value.push('\n'),
                Some((_, 'r')) => value.push('\r'),
                Some((_, 't')) => value.push('\t'),
                Some((_, e @ ('"' | '\\' | '$'))) => value.push(e),
                Some((_, other)) => {
                    value.push('\\');
                    value.push(other);
                }
                None => value.push('\\'),
            }
        } else {
            value.push(c);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(text: &str) -> Vec<(String, String)> {
        parse(text).unwrap_or_else(|e| panic!("{e:?}")).into_iter().collect()
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn errors(text: &str) -> Vec<String> {
        parse(text).unwrap_err().iter().map(ToString::to_string).collect()
    }

    #[test]
    fn plain_assignments_comments_and_blank_lines() {
        let text = "# settings\n\nA=1\n  B = two words  \nexport C=3\nexport\tD=4\nE=\nF=a#b # comment\nG=#no\n";
        assert_eq!(
            vars(text),
            pairs(&[("A", "1"), ("B", "two words"), ("C", "3"), ("D", "4"), ("E", ""), ("F", "a#b"), ("G", "")])
        );
    }

    #[test]
    fn a_key_named_export_and_windows_line_ends() {
        assert_eq!(vars("export=1\r\nexported=2\r\n"), pairs(&[("export", "1"), ("exported", "2")]));
        assert_eq!(vars("\u{feff}A=1"), pairs(&[("A", "1")]), "a byte order mark is not part of the key");
    }

    #[test]
    fn quotes() {
        let text = "S='a $b \\n # c'\nD=\"x\\ty\\n\\\"q\\\" \\$HOME \\\\ \\w\"\nE=\"\" # empty\n";
        assert_eq!(vars(text), pairs(&[("D", "x\ty\n\"q\" $HOME \\ \\w"), ("E", ""), ("S", "a $b \\n # c")]));
    }

    #[test]
    fn a_quoted_value_may_span_lines() {
        let text = "KEY=\"-----BEGIN-----\nabc\n-----END-----\"\nNEXT='x\n\ny'\nLAST=1\n";
        assert_eq!(
            vars(text),
            pairs(&[("KEY", "-----BEGIN-----\nabc\n-----END-----"), ("LAST", "1"), ("NEXT", "x\n\ny")])
        );
    }

    #[test]
    fn the_last_value_of_a_key_wins() {
        assert_eq!(vars("A=1\nA=2\n"), pairs(&[("A", "2")]));
    }

    #[test]
    fn every_bad_line_is_reported_with_its_number() {
        let text = "A=1\nJUST_A_WORD\n1BAD=x\nmy-var=y\nQ=\"ok\" trailing\nOK=fine\nU='never closed\nmore\n";
        assert_eq!(
            errors(text),
            [
                "line 2: `JUST_A_WORD` is not `KEY=value`: write `NAME=value`, or start the line with `#` to make \
                 it a comment",
                "line 3: `1BAD` is not a variable name: a name holds ASCII letters, digits and `_` and does not \
                 start with a digit",
                "line 4: `my-var` is not a variable name: a name holds ASCII letters, digits and `_` and does not \
                 start with a digit",
                "line 5: unexpected `trailing` after the closing \" of `Q`'s value: quote the whole value, or start \
                 a comment with `#`",
                "line 7: the closing ' of `U`'s value is missing: add it where the value ends",
            ]
        );
    }

    #[test]
    fn errors_after_a_multi_line_value_name_the_line_it_ends_on() {
        assert_eq!(
            errors("A=\"one\ntwo\" x\n"),
            [
                "line 2: unexpected `x` after the closing \" of `A`'s value: quote the whole value, or start a comment with `#`"
            ]
        );
        assert_eq!(errors("=x\n"), ["line 1: the name before `=` is empty: write `NAME=value`"]);
    }

    #[test]
    fn a_nul_byte_is_refused_and_long_lines_are_cut_in_messages() {
        assert_eq!(
            errors("A=\"x\0y\"\n"),
            ["line 1: `A`'s value holds a NUL byte, which no program can receive: remove it"]
        );
        let long = "x".repeat(100);
        let msg = &errors(&long)[0];
        assert!(msg.contains(&format!("`{}…`", "x".repeat(40))), "{msg}");
    }

    /// The example in README.md's "Environment files and secrets" means what it says there.
    #[test]
    fn the_readme_example_reads_as_documented() {
        let readme = include_str!("../../README.md");
        let start = readme.find("# a comment; blank lines are ignored").expect("the README's dotenv example");
        let text = &readme[start..start + readme[start..].find("```").expect("the end of the example")];
        assert_eq!(
            vars(text),
            pairs(&[
                ("ESCAPED", "line one\nline two"),
                ("GREETING", "hello world"),
                ("PEM", "-----BEGIN KEY-----\nabc\n-----END KEY-----"),
                ("QUOTED", "kept $AS written"),
                ("REGION", "eu-west-1"),
            ])
        );
    }

    #[test]
    fn empty_text_has_no_variables() {
        assert!(vars("").is_empty());
        assert!(vars("\n\n# only comments\n").is_empty());
    }
}
