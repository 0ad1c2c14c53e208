//! The values of a flow's `secret_env` variables, and their replacement by [`MASK`] wherever
//! waymark prints or stores text: each sink redacts what it is given (the output readers before
//! the log files, the evidence reader before an error is recorded, the outputs reader before
//! outputs are recorded, the emitter before reporters see an event).
//!
//! A secret is a value, matched byte for byte: empty values are not secrets, and a transformed
//! secret (base64 of it, a slice of it, its characters spaced out) is not recognised. Where
//! secrets overlap, all they cover together is replaced, once.

use crate::classify::ErrorValue;
use aho_corasick::{AhoCorasick, AhoCorasickKind, MatchKind};
use std::borrow::Cow;
use std::collections::BTreeSet;
use std::io::{Read, Seek, Write};
use std::path::Path;

/// What a secret's value is replaced by.
pub(crate) const MASK: &str = "***";
/// The most bytes of secret values matched by a DFA (fastest to search, slow to build for long
/// values); more are matched by a contiguous NFA.
const DFA_BYTES: usize = 4096;

/// The secret values of a run, ready to be replaced.
#[derive(Debug, Default)]
pub(crate) struct Secrets {
    /// Distinct, non-empty.
    values: Vec<Vec<u8>>,
    /// `None` when there are no values.
    matcher: Option<AhoCorasick>,
}

impl Secrets {
    /// The secrets among `values`; empty values are dropped (an empty string is not a secret).
    pub(crate) fn new<V: AsRef<[u8]>>(values: impl IntoIterator<Item = V>) -> Secrets {
        let distinct: BTreeSet<Vec<u8>> =
            values.into_iter().map(|v| v.as_ref().to_vec()).filter(|v| !v.is_empty()).collect();
        let values: Vec<Vec<u8>> = distinct.into_iter().collect();
        if values.is_empty() {
            return Secrets::default();
        }
        // Building fails only past the automaton's size limits, far beyond any set of variables an
        // environment can hold; without a matcher nothing would be hidden, so fall back to one
        // value per pattern search rather than to nothing. The crate's own choice, a DFA for up to
        // 100 values, took 90 s to build for one value of 100 KB repeating a byte: past
        // `DFA_BYTES` of values, a contiguous NFA, built in milliseconds for it.
        let total: usize = values.iter().map(Vec::len).sum();
        let kind = (total > DFA_BYTES).then_some(AhoCorasickKind::ContiguousNFA);
        let matcher = AhoCorasick::builder().match_kind(MatchKind::Standard).kind(kind).build(&values).ok();
        Secrets { values, matcher }
    }

    /// Whether `text` is part of a secret's value (a secret given where a name was expected,
    /// `TOKEN` split at its `=`): a message must not repeat it, and `***` would not hide a part.
    pub(crate) fn holds_part(&self, text: &str) -> bool {
        !text.is_empty() && self.values.iter().any(|v| v.windows(text.len()).any(|w| w == text.as_bytes()))
    }

    /// Whether there is nothing to hide.
    pub(crate) fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The stretches of `bytes` that secrets cover, as (start, end) in order: every occurrence of
    /// every secret, those that overlap joined into one (`abcdef` and `defghi` in `abcdefghi`
    /// cover it all), so that no part of a secret stays visible beside another.
    fn matches(&self, bytes: &[u8]) -> Vec<(usize, usize)> {
        let mut found: Vec<(usize, usize)> = match &self.matcher {
            Some(m) => m.find_overlapping_iter(bytes).map(|m| (m.start(), m.end())).collect(),
            // No automaton (see `new`): every value looked for at every place.
            None => (0..bytes.len())
                .flat_map(|at| {
                    let rest = &bytes[at..];
                    self.values.iter().filter(move |v| rest.starts_with(v)).map(move |v| (at, at + v.len()))
                })
                .collect(),
        };
        found.sort_unstable();
        let mut joined: Vec<(usize, usize)> = Vec::with_capacity(found.len());
        for (start, end) in found {
            match joined.last_mut() {
                Some(last) if start < last.1 => last.1 = last.1.max(end),
                _ => joined.push((start, end)),
            }
        }
        joined
    }

    /// `bytes` with every secret replaced by [`MASK`].
    pub(crate) fn redact_bytes<'a>(&self, bytes: &'a [u8]) -> Cow<'a, [u8]> {
        if self.is_empty() {
            return Cow::Borrowed(bytes);
        }
        let found = self.matches(bytes);
        if found.is_empty() {
            return Cow::Borrowed(bytes);
        }
        let mut out = Vec::with_capacity(bytes.len());
        let mut from = 0;
        for (start, end) in found {
            out.extend_from_slice(&bytes[from..start]);
            out.extend_from_slice(MASK.as_bytes());
            from = end;
        }
        out.extend_from_slice(&bytes[from..]);
        Cow::Owned(out)
    }

    /// `text` with every secret replaced by [`MASK`].
    pub(crate) fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        match self.redact_bytes(text.as_bytes()) {
            Cow::Borrowed(_) => Cow::Borrowed(text),
            // A secret that is not UTF-8 may have matched part of a character.
            Cow::Owned(bytes) => Cow::Owned(
                String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
            ),
        }
    }

    /// [`redact`](Self::redact) into an owned string.
    pub(crate) fn redact_string(&self, text: String) -> String {
        match self.redact(&text) {
            Cow::Borrowed(_) => text,
            Cow::Owned(redacted) => redacted,
        }
    }

    /// Hide every secret in an error's class, bases and message (an error file is the step's own
    /// text, all of it).
    pub(crate) fn redact_error(&self, error: &mut ErrorValue) {
        if self.is_empty() {
            return;
        }
        let text = |t: &mut String| *t = self.redact_string(std::mem::take(t));
        text(&mut error.class);
        error.bases.iter_mut().for_each(text);
        text(&mut error.message);
    }

    /// Replace every secret in the file at `path`, under the state directory, by [`MASK`]: a file
    /// a step wrote there itself (its error file, its outputs file), which waymark keeps. Reads it
    /// once to find out whether it holds one, and only then streams it into a new file and renames
    /// that over it: a file without a secret (a huge or sparse one too) is never copied. Never
    /// follows a link; a missing file or one that is not a regular file is left alone.
    pub(crate) fn scrub_file(&self, path: &Path) -> std::io::Result<()> {
        if self.is_empty() {
            return Ok(());
        }
        let mut file = match crate::os::fs::open_read_nofollow(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            other => other?,
        };
        if !file.metadata()?.is_file() {
            return Ok(());
        }
        let mut buf = vec![0u8; 64 * 1024];
        // Through the redactor, each redacted piece to `out`; how many secrets it hid.
        let mut pass = |file: &mut std::fs::File, mut out: Option<&mut std::fs::File>| -> std::io::Result<usize> {
            let mut redactor = StreamRedactor::new(self);
            loop {
                let n = match file.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                };
                let piece = redactor.feed(&buf[..n]);
                if let Some(out) = out.as_deref_mut() {
                    out.write_all(&piece)?;
                }
            }
            let last = redactor.finish();
            if let Some(out) = out {
                out.write_all(&last)?;
            }
            Ok(redactor.replaced)
        };
        if pass(&mut file, None)? == 0 {
            return Ok(());
        }
        replace(path, |out| file.seek(std::io::SeekFrom::Start(0)).and_then(|_| pass(&mut file, Some(out))).map(drop))
    }

    /// [`Secrets::scrub_file`] of a file that may be JSON (an error file): a secret that a string
    /// of it holds written in JSON's escapes (`\u00e9`, `\"`, as Python's `json.dump` writes every
    /// character beyond ASCII), which its bytes do not show, is hidden too. Its bytes are scrubbed
    /// first; then a JSON file of at most `limit` bytes whose strings (or keys) still hold a secret
    /// is written anew from its parsed form, each secret hidden.
    pub(crate) fn scrub_json_file(&self, path: &Path, limit: u64) -> std::io::Result<()> {
        if self.is_empty() {
            return Ok(());
        }
        self.scrub_file(path)?;
        let mut bytes = Vec::new();
        match crate::os::fs::open_read_nofollow(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
            Ok(file) if file.metadata()?.is_file() => {
                file.take(limit + 1).read_to_end(&mut bytes)?;
            }
            Ok(_) => return Ok(()),
        }
        let text = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&bytes);
        if bytes.len() as u64 > limit {
            return Ok(());
        }
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(text) else { return Ok(()) };
        let mut hidden = false;
        let value = self.hide_in_json(value, &mut hidden);
        if !hidden {
            return Ok(());
        }
        replace(path, |out| out.write_all(&serde_json::to_vec(&value).unwrap_or_default()))
    }

    /// `value` with every secret in its strings and keys hidden; `hidden` is set if one was.
    fn hide_in_json(&self, value: serde_json::Value, hidden: &mut bool) -> serde_json::Value {
        use serde_json::Value;
        let text = |t: String, hidden: &mut bool| match self.redact(&t) {
            Cow::Borrowed(_) => t,
            Cow::Owned(masked) => {
                *hidden = true;
                masked
            }
        };
        match value {
            Value::String(t) => Value::String(text(t, hidden)),
            Value::Array(items) => Value::Array(items.into_iter().map(|v| self.hide_in_json(v, hidden)).collect()),
            // (Two keys hidden alike are one: the last one's value is kept.)
            Value::Object(map) => {
                Value::Object(map.into_iter().map(|(k, v)| (text(k, hidden), self.hide_in_json(v, hidden))).collect())
            }
            other => other,
        }
    }

    /// The longest end of `bytes` that is the start (not the whole) of some secret: the bytes
    /// that may turn out to be a secret once more come.
    fn unfinished_tail(&self, bytes: &[u8]) -> usize {
        let mut longest = 0;
        for v in &self.values {
            let most = (v.len() - 1).min(bytes.len());
            // Only where the secret's first byte is can it begin.
            for k in (longest + 1..=most).rev() {
                if bytes[bytes.len() - k] == v[0] && bytes.ends_with(&v[..k]) {
                    longest = k;
                    break;
                }
            }
        }
        longest
    }
}

/// Put what `write` writes in place of the file at `path`: written beside it, then renamed over it
/// (a reader never finds it half written); nothing is left beside it if writing fails.
fn replace(path: &Path, write: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>) -> std::io::Result<()> {
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(".scrubbed");
    let temp = path.with_file_name(name);
    crate::os::fs::remove_any(&temp)?;
    let written = crate::os::fs::open_append_private(&temp).and_then(|mut out| write(&mut out));
    if let Err(e) = written.and_then(|()| std::fs::rename(&temp, path)) {
        let _ = std::fs::remove_file(&temp);
        return Err(e);
    }
    Ok(())
}

/// Redacts a stream that arrives in pieces: a secret split across two pieces is still replaced.
/// The bytes that may be the start of a secret are held back until the next piece (or
/// [`finish`](Self::finish)) says whether they are.
#[derive(Debug)]
pub(crate) struct StreamRedactor<'s> {
    secrets: &'s Secrets,
    held: Vec<u8>,
    /// How many of the held bytes a mask already sent stands for: the end of a secret that may
    /// go on into another one, which then adds no second mask.
    covered: usize,
    /// How many masks were sent so far.
    replaced: usize,
}

impl<'s> StreamRedactor<'s> {
    pub(crate) fn new(secrets: &'s Secrets) -> StreamRedactor<'s> {
        StreamRedactor { secrets, held: Vec::new(), covered: 0, replaced: 0 }
    }

    /// The redacted bytes that `piece` (after what was held back) makes final.
    pub(crate) fn feed<'a>(&mut self, piece: &'a [u8]) -> Cow<'a, [u8]> {
        if self.secrets.is_empty() {
            return Cow::Borrowed(piece);
        }
        let mut buf = std::mem::take(&mut self.held);
        buf.extend_from_slice(piece);
        let safe = buf.len() - self.secrets.unfinished_tail(&buf);
        Cow::Owned(self.pass(buf, safe))
    }

    /// What was held back, redacted: the stream has ended.
    pub(crate) fn finish(&mut self) -> Vec<u8> {
        let held = std::mem::take(&mut self.held);
        let end = held.len();
        self.pass(held, end)
    }

    /// `buf` (what was held, then what came) redacted up to `safe`, where what may be the start
    /// of a secret begins: that end is held back, with how much of it a mask sent covers.
    fn pass(&mut self, buf: Vec<u8>, safe: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(buf.len());
        // The covered bytes went out as a mask already.
        let (covered, mut from) = (self.covered, self.covered);
        for (start, end) in self.secrets.matches(&buf) {
            // A match that starts in the held-back end may be part of a longer secret.
            if start >= safe {
                break;
            }
            if start < covered {
                // It goes on from the mask sent: that mask stands for it too.
                from = from.max(end);
                continue;
            }
            out.extend_from_slice(&buf[from..start]);
            out.extend_from_slice(MASK.as_bytes());
            from = end;
            self.replaced += 1;
        }
        if from <= safe {
            out.extend_from_slice(&buf[from..safe]);
        }
        self.covered = from.saturating_sub(safe);
        self.held = buf[safe..].to_vec();
        out
    }

    /// How many bytes are held back at most: one less than the longest secret.
    #[cfg(test)]
    fn most_held(&self) -> usize {
        self.secrets.values.iter().map(Vec::len).max().unwrap_or(0).saturating_sub(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::ErrorSource;

    fn secrets(values: &[&str]) -> Secrets {
        Secrets::new(values.iter().map(|v| v.as_bytes()))
    }

    #[test]
    fn every_occurrence_is_replaced_and_empty_values_are_not_secrets() {
        let s = secrets(&["hunter2", "", "s3cr3t"]);
        assert_eq!(s.redact("token=hunter2 and hunter2hunter2, s3cr3t."), "token=*** and ******, ***.");
        assert_eq!(s.redact("nothing here"), "nothing here");
        assert!(matches!(s.redact("nothing here"), Cow::Borrowed(_)));
        assert!(secrets(&["", ""]).is_empty());
        assert_eq!(secrets(&[""]).redact("a b"), "a b", "an empty value hides nothing");
    }

    /// A long value of one repeated byte (a token padded with `=`, say) is hidden like any other,
    /// and its matcher is built in a moment: the crate's default DFA took 90 s for 100 KB in a
    /// release build, so a run sat that long before its first step.
    #[test]
    fn a_long_repetitive_secret_is_ready_at_once_and_hidden() {
        let value = format!("{}x", "=".repeat(99_999));
        let (tx, rx) = std::sync::mpsc::channel();
        let build = value.clone();
        std::thread::spawn(move || tx.send(Secrets::new([build])).unwrap());
        // A bound generous for a loaded machine: the contiguous NFA takes milliseconds.
        let s = rx.recv_timeout(std::time::Duration::from_secs(60)).expect("the matcher built within 60 s");
        assert_eq!(s.redact(&format!("a {value} b ={value}")), "a *** b =***");
    }

    #[test]
    fn secrets_that_overlap_are_replaced_with_all_they_cover() {
        let s = secrets(&["abc", "abcdef", "cde"]);
        assert_eq!(s.redact("xabcdefx"), "x***x");
        assert_eq!(s.redact("xabcdex"), "x***x");
        // Side by side, not overlapping: one mask each.
        assert_eq!(s.redact("abcabc"), "******");
        let s = secrets(&["abcdef", "defghi"]);
        assert_eq!(s.redact("abcdefghi defghi abcdefgh"), "*** *** ***gh");
    }

    #[test]
    fn an_error_is_redacted_in_every_part() {
        let s = secrets(&["Tok"]);
        let e = ErrorValue {
            class: "Tok".into(),
            bases: vec!["Exception".into()],
            message: "bad Tok in Tokyo".into(),
            source: ErrorSource::ErrorFile,
        };
        let mut e = e;
        s.redact_error(&mut e);
        assert_eq!((e.class.as_str(), e.message.as_str()), ("***", "bad *** in ***yo"));
        assert_eq!(e.bases, ["Exception"]);
    }

    /// Every way of cutting a text into two or three pieces gives the same result as redacting it
    /// whole, and nothing is held back longer than a secret could need.
    #[test]
    fn a_secret_split_across_pieces_is_still_replaced() {
        let s = secrets(&["hunter2", "hunt", "PEM\nkey"]);
        let text = b"say hunter2 hunt hunter hunter2! PEM\nkey end hunte";
        let whole = s.redact_bytes(text).into_owned();
        assert_eq!(String::from_utf8_lossy(&whole), "say *** *** ***er ***! *** end ***e");
        streamed_as_whole(&s, text, &whole);
    }

    /// `text` fed in three pieces, cut at every two places, gives `whole`, holding back no more
    /// than a secret could need.
    fn streamed_as_whole(s: &Secrets, text: &[u8], whole: &[u8]) {
        for i in 0..=text.len() {
            for j in i..=text.len() {
                let mut r = StreamRedactor::new(s);
                let mut out = Vec::new();
                for piece in [&text[..i], &text[i..j], &text[j..]] {
                    out.extend_from_slice(&r.feed(piece));
                    assert!(r.held.len() <= r.most_held(), "held {} bytes", r.held.len());
                }
                out.extend(r.finish());
                assert_eq!(String::from_utf8_lossy(&out), String::from_utf8_lossy(whole), "cut at {i} and {j}");
            }
        }
    }

    /// Secrets that overlap, cut anywhere: the stream gives what the whole text gives, one mask
    /// for a chain of overlapping secrets however the pieces fall, none of their bytes shown.
    #[test]
    fn overlapping_secrets_split_across_pieces_are_replaced_whole() {
        let s = secrets(&["abcdef", "defghi", "ghijkl", "aa"]);
        let text = b"1 abcdefghijkl 2 abcdefghi 3 abcdefgh 4 defghijk 5 aaaaa 6 abcdef";
        let whole = s.redact_bytes(text).into_owned();
        assert_eq!(String::from_utf8_lossy(&whole), "1 *** 2 *** 3 ***gh 4 ***jk 5 *** 6 ***");
        streamed_as_whole(&s, text, &whole);
    }

    #[test]
    fn without_secrets_a_stream_passes_through_untouched() {
        let s = Secrets::default();
        let mut r = StreamRedactor::new(&s);
        assert!(matches!(r.feed(b"abc"), Cow::Borrowed(b"abc")));
        assert!(r.finish().is_empty());
    }

    #[test]
    fn without_an_automaton_the_scan_finds_the_same() {
        let mut s = secrets(&["abc", "abcdef", "cde"]);
        s.matcher = None;
        assert_eq!(s.redact("xabcdefx xabcdex abcabc"), "x***x x***x ******");
    }

    /// A file without a secret is only read: nothing is written beside it (a step's 3 GB sparse
    /// outputs file was copied in full, to be thrown away). What sits where the copy would go
    /// shows it: it is left alone.
    #[test]
    fn a_file_without_a_secret_is_never_copied() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attempt-1.outputs");
        std::fs::write(&path, "k=v\n".repeat(100_000)).unwrap();
        let beside = dir.path().join("attempt-1.outputs.scrubbed");
        std::fs::create_dir(&beside).unwrap();
        std::fs::write(beside.join("mark"), "").unwrap();
        secrets(&["hunter2"]).scrub_file(&path).unwrap();
        assert!(beside.join("mark").exists(), "no copy was begun");
        std::fs::write(&path, "k=hunter2\n").unwrap();
        secrets(&["hunter2"]).scrub_file(&path).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "k=***\n");
        assert!(!beside.exists(), "the copy is renamed over the file");
    }

    #[test]
    fn a_file_is_scrubbed_only_when_it_holds_a_secret() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attempt-1.error.json");
        let s = secrets(&["hunter2"]);
        std::fs::write(&path, "{\"message\": \"token hunter2 refused\"}").unwrap();
        s.scrub_file(&path).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"message\": \"token *** refused\"}");
        let clean = dir.path().join("clean");
        std::fs::write(&clean, "nothing").unwrap();
        let before = std::fs::metadata(&clean).unwrap().modified().unwrap();
        s.scrub_file(&clean).unwrap();
        assert_eq!(std::fs::metadata(&clean).unwrap().modified().unwrap(), before, "left as it was");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 2, "no temporary file left: {names:?}");
        s.scrub_file(&dir.path().join("missing")).unwrap();
        // A link is not followed: its target keeps its text.
        std::os::unix::fs::symlink(&clean, dir.path().join("link")).unwrap();
        std::fs::write(&clean, "hunter2").unwrap();
        assert!(s.scrub_file(&dir.path().join("link")).is_err());
        assert_eq!(std::fs::read_to_string(&clean).unwrap(), "hunter2");
    }

    /// A secret that an error file's JSON holds in escapes (as Python's `json.dump` writes any
    /// character beyond ASCII, and a `"` always) is hidden in the file too; a file that is not JSON
    /// is scrubbed as bytes.
    #[test]
    fn a_secret_written_in_json_escapes_is_hidden_in_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attempt-1.error.json");
        let s = secrets(&["pässwörd", "a\"b", "hunter2"]);
        let written = r#"{"class": "AuthError", "message": "p\u00e4ssw\u00f6rd and a\"b refused", "n": 42,
            "bases": ["Exception"], "detail": {"hunter2": ["hunter2"]}}"#;
        std::fs::write(&path, written).unwrap();
        s.scrub_json_file(&path, 64 * 1024).unwrap();
        let kept: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(
            kept,
            serde_json::json!({"class": "AuthError", "message": "*** and *** refused", "n": 42,
                "bases": ["Exception"], "detail": {"***": ["***"]}})
        );
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 1, "no temporary file left: {names:?}");
        // A secret written as it is: the bytes are scrubbed, the file keeps its form.
        std::fs::write(&path, "{\"message\": \"hunter2\"}").unwrap();
        s.scrub_json_file(&path, 64 * 1024).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"message\": \"***\"}");
        // Not JSON, or larger than the limit: its bytes are scrubbed.
        std::fs::write(&path, "{\"message\": \"hunter2 and p\\u00e4ssw\\u00f6rd").unwrap();
        s.scrub_json_file(&path, 64 * 1024).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"message\": \"*** and p\\u00e4ssw\\u00f6rd");
        std::fs::write(&path, written).unwrap();
        s.scrub_json_file(&path, 16).unwrap();
        assert!(std::fs::read_to_string(&path).unwrap().contains(r#"p\u00e4ssw\u00f6rd and a\"b"#));
    }

    #[test]
    fn a_secret_that_is_not_utf8_leaves_valid_text() {
        let s = Secrets::new([vec![0xa9u8]]);
        assert_eq!(s.redact("café"), "caf\u{fffd}***");
    }
}
