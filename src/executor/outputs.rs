//! Step outputs: each attempt gets `WAYMARK_OUTPUT`, the path of a file (`attempt-N.outputs`,
//! beside its logs; absent when the child starts, whatever an earlier execution of the attempt
//! left there removed) that the step creates if it writes `key=value` lines.
//! After the step succeeds the file is read here; its outputs are recorded with the success and
//! every step that starts later sees `WAYMARK_OUTPUT_<STEP>_<KEY>`.
//!
//! The syntax, deliberately small: one `key=value` per line; the key is `[A-Za-z_][A-Za-z0-9_]*`,
//! the value is the rest of the line as written (no quotes, no escapes, no trimming; a final `\r`
//! is dropped); blank lines are ignored; a key written again keeps its last value (so do keys that
//! differ only in case: they are one variable). Any other line is reported as a warning and
//! skipped, never fatal. A value cannot span lines: write a file and pass its path.

use crate::flow::validate::MAX_STEP_NAME;
use crate::os::fs;
use crate::secrets::Secrets;
use crate::store::StepRecord;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One step's outputs: key to value.
pub(crate) type StepOutputs = BTreeMap<String, String>;

/// How much of an outputs file is read; the lines after it are reported and skipped.
pub(crate) const MAX_FILE: usize = 1024 * 1024;

/// The longest value output `key` can hand a later step: its `WAYMARK_OUTPUT_<STEP>_<KEY>=VALUE`
/// string, for the longest step name, within what the kernel passes in one string
/// ([`max_arg`](crate::flow::validate::max_arg), 32 of the machine's pages less the NUL; longer,
/// the step could not start). 0 for a key that leaves no room at all.
fn longest_value(key: &str) -> usize {
    crate::flow::validate::max_arg()
        .saturating_sub("WAYMARK_OUTPUT_".len() + MAX_STEP_NAME + "_".len() + key.len() + "=".len())
}

/// The outputs file of the attempt whose files are at `stem`.
pub(crate) fn path(stem: &Path) -> PathBuf {
    stem.with_extension("outputs")
}

/// The files an attempt's child writes itself, if at all, at `stem`: its error file and its
/// outputs file (scrubbed of the secrets when it ends, removed before it runs again).
pub(crate) fn child_files(stem: &Path) -> [PathBuf; 2] {
    [stem.with_extension("error.json"), path(stem)]
}

/// The variable a later step sees output `key` of step `step` as: `WAYMARK_OUTPUT_FETCH_A_ROWS`
/// for key `rows` of step `fetch-a`.
pub(crate) fn env_name(step: &str, key: &str) -> String {
    let upper = |s: &str| -> String {
        s.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect()
    };
    format!("WAYMARK_OUTPUT_{}_{}", upper(step), upper(key))
}

/// The outputs of a succeeded attempt whose outputs file is `path`, with every secret's value
/// replaced by `***` (in the file too, so that it holds none), and warnings for the user: bad
/// lines, a file too large, a file that cannot be read. Never fails: what cannot be read is no
/// output.
pub(crate) fn read(path: &Path, secrets: &Secrets) -> (StepOutputs, Vec<String>) {
    let shown = path.display();
    let mut file = match fs::open_read_nofollow(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (StepOutputs::new(), Vec::new()),
        Err(e) => return (StepOutputs::new(), vec![format!("cannot read the outputs file {shown}: {e}; no outputs")]),
    };
    match file.metadata() {
        Ok(m) if m.is_file() => {}
        Ok(_) => {
            return (StepOutputs::new(), vec![format!("the outputs file {shown} is not a regular file; no outputs")]);
        }
        Err(e) => return (StepOutputs::new(), vec![format!("cannot read the outputs file {shown}: {e}; no outputs")]),
    }
    let mut bytes = Vec::new();
    if let Err(e) = (&mut file).take(MAX_FILE as u64 + 1).read_to_end(&mut bytes) {
        return (StepOutputs::new(), vec![format!("cannot read the outputs file {shown}: {e}; no outputs")]);
    }
    let redacted = secrets.redact_bytes(&bytes);
    let (outputs, warnings) = parse(&redacted);
    let mut warnings: Vec<String> = warnings.into_iter().map(|w| format!("outputs file {shown}: {w}")).collect();
    if redacted[..] != bytes[..]
        && let Err(e) = secrets.scrub_file(path)
    {
        warnings.push(format!("cannot hide the secrets in the outputs file {shown}: {e}"));
    }
    (outputs, warnings)
}

/// The outputs in an outputs file's bytes, and what is wrong with its other lines. Pure.
pub(crate) fn parse(bytes: &[u8]) -> (StepOutputs, Vec<String>) {
    let mut outputs = StepOutputs::new();
    // Each key's variable name (upper-cased) and the key last written for it.
    let mut variables: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    let mut warnings = Vec::new();
    let (text, cut) = if bytes.len() > MAX_FILE { (&bytes[..MAX_FILE], true) } else { (bytes, false) };
    let mut lines: Vec<&[u8]> = text.split(|b| *b == b'\n').collect();
    // A file that ends with a newline has no line after it; a cut file's last line is cut.
    if lines.last().is_some_and(|l| l.is_empty()) || cut {
        lines.pop();
    }
    for (i, line) in lines.iter().enumerate() {
        let number = i + 1;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            continue;
        }
        let Ok(line) = std::str::from_utf8(line) else {
            warnings.push(format!("line {number} is not UTF-8; skipped"));
            continue;
        };
        let Some((key, value)) = line.split_once('=') else {
            warnings.push(format!("line {number} is not `key=value`; skipped (write `name=value`, one per line)"));
            continue;
        };
        if !crate::flow::is_identifier(key) {
            warnings.push(format!(
                "line {number}: `{}` is not an output name ([A-Za-z_][A-Za-z0-9_]*, no spaces); skipped",
                shown(key)
            ));
            continue;
        }
        let most = longest_value(key);
        if value.len() > most || most == 0 {
            warnings.push(format!(
                "line {number}: the value of `{key}` is {} bytes, more than a variable can hand to a later step \
                 (at most {most} bytes under this key); skipped (write it to a file and pass the file's path)",
                value.len()
            ));
            continue;
        }
        if value.contains('\0') {
            warnings
                .push(format!("line {number}: the value of `{key}` holds a NUL byte, which no variable can; skipped"));
            continue;
        }
        // Keys that differ only in case are one variable: the key written last is the one kept,
        // as a key written again is.
        let upper = key.to_ascii_uppercase();
        if let Some(other) = variables.insert(upper, key.to_owned()).filter(|other| other != key) {
            warnings.push(format!(
                "line {number}: `{key}` and `{other}`, written before it, name the same variable (a key is \
                 upper-cased in it); `{key}` is kept, as a key written again is"
            ));
            outputs.remove(&other);
        }
        outputs.insert(key.to_owned(), value.to_owned());
    }
    if cut {
        warnings.push(format!(
            "the file is larger than {} KiB; what follows line {} is skipped",
            MAX_FILE / 1024,
            lines.len()
        ));
    }
    (outputs, warnings)
}

/// At most 40 characters of a bad key, for a message.
fn shown(text: &str) -> String {
    match text.char_indices().nth(40) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// The outputs of the steps that succeeded so far in a run: what an attempt that starts now
/// sees. Kept by step position, so that where two steps' variables meet (step `a` key `b_c`, step
/// `a_b` key `c`: both `WAYMARK_OUTPUT_A_B_C`) the step later in the file wins, whatever the order
/// in which they finished.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RunOutputs {
    by_step: BTreeMap<usize, (String, StepOutputs)>,
    /// Their variables ([`RunOutputs::env`]), made again only when a step's outputs are kept.
    env: Arc<[(String, String)]>,
}

impl RunOutputs {
    /// The outputs recorded for a run's steps (in the flow's order: the position is the index).
    /// A value longer than a variable can hold (recorded by an earlier waymark, which kept it and
    /// so failed every later attempt to start) is left out, with a warning for its step:
    /// `(step, warning)`.
    pub(crate) fn recorded(steps: &[StepRecord]) -> (RunOutputs, Vec<(String, String)>) {
        let mut run = RunOutputs::default();
        let mut warnings = Vec::new();
        for (index, step) in steps.iter().enumerate() {
            let mut outputs = step.outputs.clone();
            outputs.retain(|key, value| {
                let most = longest_value(key);
                let fits = value.len() <= most && most > 0;
                if !fits {
                    warnings.push((
                        step.name.clone(),
                        format!(
                            "its recorded output `{key}` is {} bytes, more than a variable can hand to a later step \
                             (at most {most} bytes under this key); later steps do not see it (to pass it, have the step \
                             write it to a file and output the file's path; `waymark run --fresh` starts the run over)",
                            value.len()
                        ),
                    ));
                }
                fits
            });
            run.insert(index, &step.name, outputs);
        }
        (run, warnings)
    }

    /// Step `index`, named `step`, succeeded with `outputs`. A step without outputs is not
    /// kept: every attempt reads all that is kept.
    pub(crate) fn insert(&mut self, index: usize, step: &str, outputs: StepOutputs) {
        let changed = match outputs.is_empty() {
            true => self.by_step.remove(&index).is_some(),
            false => {
                self.by_step.insert(index, (step.to_owned(), outputs));
                true
            }
        };
        if changed {
            let env = self
                .by_step
                .values()
                .flat_map(|(step, outputs)| outputs.iter().map(|(k, v)| (env_name(step, k), v.clone())));
            self.env = env.collect();
        }
    }

    /// The variables, in step order (so a later step's value wins where two names meet): shared
    /// by every attempt that starts until a step's outputs are kept, which makes new ones.
    pub(crate) fn env(&self) -> Arc<[(String, String)]> {
        Arc::clone(&self.env)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(outputs: &StepOutputs) -> Vec<(&str, &str)> {
        outputs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
    }

    #[test]
    fn lines_are_key_value_taken_as_written() {
        let (outputs, warnings) =
            parse(b"rows=42\npath=/tmp/a b.csv \n\nempty=\neq=a=b\r\nrows=43\n_x1='quoted' # kept\n");
        assert_eq!(
            pairs(&outputs),
            [("_x1", "'quoted' # kept"), ("empty", ""), ("eq", "a=b"), ("path", "/tmp/a b.csv "), ("rows", "43")]
        );
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(pairs(&parse(b"last=no newline").0), [("last", "no newline")]);
    }

    #[test]
    fn bad_lines_are_reported_with_their_number_and_skipped() {
        let (outputs, warnings) =
            parse(b"ok=1\njust words\n1st=x\nmy-key=y\n key=z\nnul=a\0b\n\xff=bad\n# comment\nalso=2\n");
        assert_eq!(pairs(&outputs), [("also", "2"), ("ok", "1")]);
        assert_eq!(
            warnings,
            [
                "line 2 is not `key=value`; skipped (write `name=value`, one per line)",
                "line 3: `1st` is not an output name ([A-Za-z_][A-Za-z0-9_]*, no spaces); skipped",
                "line 4: `my-key` is not an output name ([A-Za-z_][A-Za-z0-9_]*, no spaces); skipped",
                "line 5: ` key` is not an output name ([A-Za-z_][A-Za-z0-9_]*, no spaces); skipped",
                "line 6: the value of `nul` holds a NUL byte, which no variable can; skipped",
                "line 7 is not UTF-8; skipped",
                "line 8 is not `key=value`; skipped (write `name=value`, one per line)",
            ]
        );
    }

    /// `k` and `K` are one variable (`WAYMARK_OUTPUT_STEP_K`): the key written last is kept, as
    /// a key written again is, and said; the one before it is not recorded beside it.
    #[test]
    fn keys_that_differ_only_in_case_are_one_key_written_again() {
        let (outputs, warnings) = parse(b"k=lower-first\nother=1\nK=upper-later\nk=last\n");
        assert_eq!(pairs(&outputs), [("k", "last"), ("other", "1")]);
        assert_eq!(
            warnings,
            [
                "line 3: `K` and `k`, written before it, name the same variable (a key is upper-cased in it); `K` is \
                 kept, as a key written again is",
                "line 4: `k` and `K`, written before it, name the same variable (a key is upper-cased in it); `k` is \
                 kept, as a key written again is",
            ]
        );
    }

    #[test]
    fn a_file_too_large_is_read_up_to_the_limit() {
        let mut text = b"a=1\n".to_vec();
        text.extend(std::iter::repeat_n(b'x', MAX_FILE));
        text.extend(b"\nb=2\n");
        let (outputs, warnings) = parse(&text);
        assert_eq!(pairs(&outputs), [("a", "1")]);
        assert_eq!(warnings, ["the file is larger than 1024 KiB; what follows line 1 is skipped"]);
    }

    #[test]
    fn variables_are_upper_cased_with_other_characters_as_underscores() {
        assert_eq!(env_name("fetch-a", "rows"), "WAYMARK_OUTPUT_FETCH_A_ROWS");
        assert_eq!(env_name("v1.2", "Path_x"), "WAYMARK_OUTPUT_V1_2_PATH_X");
    }

    #[test]
    fn where_two_names_meet_the_step_later_in_the_file_wins() {
        let mut run = RunOutputs::default();
        let one = |k: &str, v: &str| StepOutputs::from([(k.to_owned(), v.to_owned())]);
        run.insert(3, "a_b", one("c", "later step"));
        run.insert(0, "a", one("b_c", "earlier step"));
        let env: BTreeMap<String, String> = run.env().iter().cloned().collect();
        assert_eq!(env["WAYMARK_OUTPUT_A_B_C"], "later step");
    }

    /// An output recorded before values too long to pass as a variable were skipped is left out
    /// when the run is resumed, with a warning naming its step, and the rest are kept.
    #[test]
    fn a_recorded_value_longer_than_a_variable_can_hold_is_left_out_with_a_warning() {
        let most = longest_value("big");
        let mut step = StepRecord::pending("fetch");
        step.outputs =
            StepOutputs::from([("big".to_owned(), "x".repeat(most + 1)), ("rows".to_owned(), "42".to_owned())]);
        let (run, warnings) = RunOutputs::recorded(&[StepRecord::pending("first"), step]);
        assert_eq!(*run.env(), [("WAYMARK_OUTPUT_FETCH_ROWS".to_owned(), "42".to_owned())]);
        assert_eq!(
            warnings,
            [(
                "fetch".to_owned(),
                format!(
                    "its recorded output `big` is {} bytes, more than a variable can hand to a later step (at most \
                     {most} bytes under this key); later steps do not see it (to pass it, have the step write it to \
                     a file and output the file's path; `waymark run --fresh` starts the run over)",
                    most + 1
                )
            )]
        );
    }

    /// A value too long to pass as a variable is skipped with a warning; one just short of it is
    /// kept.
    #[test]
    fn a_value_longer_than_a_variable_can_hold_is_skipped() {
        let most = longest_value("big");
        let text = format!("big={}\nsmall=1\n", "x".repeat(most + 1));
        let (outputs, warnings) = parse(text.as_bytes());
        assert_eq!(pairs(&outputs), [("small", "1")]);
        assert_eq!(
            warnings,
            [format!(
                "line 1: the value of `big` is {} bytes, more than a variable can hand to a later step (at most \
                 130796 bytes under this key); skipped (write it to a file and pass the file's path)",
                most + 1
            )]
        );
        let text = format!("big={}\n", "x".repeat(most));
        assert_eq!(parse(text.as_bytes()).0.get("big").map(String::len), Some(most));
        // A key too long to leave room for any value (no wrap-around of the limit).
        let text = format!("{}=1\n", "k".repeat(crate::flow::validate::max_arg() + 1));
        let (outputs, warnings) = parse(text.as_bytes());
        assert!(outputs.is_empty());
        assert!(
            warnings[0]
                .ends_with("(at most 0 bytes under this key); skipped (write it to a file and pass the file's path)"),
            "{warnings:?}"
        );
    }

    #[test]
    fn reading_hides_secrets_in_the_outputs_and_in_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("attempt-1.outputs");
        std::fs::write(&file, "token=abc-SECRET-def\nrows=3\nbad line\n").unwrap();
        let (outputs, warnings) = read(&file, &Secrets::new(["SECRET"]));
        assert_eq!(pairs(&outputs), [("rows", "3"), ("token", "abc-***-def")]);
        assert_eq!(
            warnings,
            [format!(
                "outputs file {}: line 3 is not `key=value`; skipped (write `name=value`, one per line)",
                file.display()
            )]
        );
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "token=abc-***-def\nrows=3\nbad line\n");
        // A missing file is no outputs, without a word.
        assert_eq!(read(&dir.path().join("none"), &Secrets::default()), (StepOutputs::new(), Vec::new()));
    }

    #[test]
    fn a_planted_link_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("victim"), "x=1\n").unwrap();
        let file = dir.path().join("attempt-1.outputs");
        std::os::unix::fs::symlink(dir.path().join("victim"), &file).unwrap();
        let (outputs, warnings) = read(&file, &Secrets::default());
        assert!(outputs.is_empty());
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].starts_with(&format!("cannot read the outputs file {}", file.display())), "{warnings:?}");
    }
}
