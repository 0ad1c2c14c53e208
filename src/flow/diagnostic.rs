//! Errors and warnings about a flow file, drawn with the offending line and a caret.

use crate::text::visible;
use annotate_snippets::{AnnotationKind, Level, Renderer, Snippet};
use std::cell::Cell;
use std::ops::Range;
use toml::Spanned;
use toml::de::{DeTable, DeValue};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Severity {
    Error,
    Warning,
}

/// One problem in a flow file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub(crate) severity: Severity,
    pub(crate) message: String,
    /// Byte range in the source; `None` for problems of the file as a whole.
    pub(crate) span: Option<Range<usize>>,
    /// The short text under the caret.
    pub(crate) label: String,
    pub(crate) help: Option<String>,
    /// Where the span starts, once `Diagnostic::locate` has run: 1-based line and column, and
    /// the byte offset of that line's start, so rendering needs no scan of the file.
    pub location: Option<Location>,
}

/// A span's start as a user counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    pub line: usize,
    pub column: usize,
    pub(crate) line_start: usize,
}

impl Diagnostic {
    pub(crate) fn error(span: impl Into<Option<Range<usize>>>, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            severity: Severity::Error,
            message: message.into(),
            span: span.into(),
            label: String::new(),
            help: None,
            location: None,
        }
    }

    pub(crate) fn warning(span: impl Into<Option<Range<usize>>>, message: impl Into<String>) -> Diagnostic {
        Diagnostic { severity: Severity::Warning, ..Diagnostic::error(span, message) }
    }

    pub(crate) fn label(mut self, label: impl Into<String>) -> Diagnostic {
        self.label = label.into();
        self
    }

    pub(crate) fn help(mut self, help: impl Into<Option<String>>) -> Diagnostic {
        self.help = help.into();
        self
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }

    /// Record the line and column of the span's start, from an index of `source`'s lines.
    pub(crate) fn locate(&mut self, source: &str, lines: &Lines) {
        self.location = self.span.as_ref().map(|span| {
            let start = floor_char_boundary(source, span.start);
            let (line, column) = lines.line_col(source, start);
            Location { line, column, line_start: lines.starts[line - 1] }
        });
    }

    /// Draw the diagnostic like rustc: `--> flow.toml:3:7`, the line, a caret. Only the lines
    /// the span covers are handed to the renderer, so drawing costs the same in a huge file, and
    /// of a long line only a window around the span.
    pub fn render(&self, path: &str, source: &str, color: bool) -> String {
        self.draw(path, source, color, KEEP_COLUMNS)
    }

    /// `render`, keeping `keep` columns of a long line on either side of the span.
    fn draw(&self, path: &str, source: &str, color: bool, keep: usize) -> String {
        // The header the column is put right in is the line after the title: both of one line.
        let keep = if self.message.contains('\n') || path.contains('\n') { usize::MAX } else { keep };
        let level = match self.severity {
            Severity::Error => Level::ERROR,
            Severity::Warning => Level::WARNING,
        };
        let (message, label) = (visible(&self.message), visible(&self.label));
        let title = level.primary_title(message.as_ref());
        // For a window of a long line: the `:LINE:COLUMN` the renderer writes, and the right one.
        let mut shift = None;
        let group = match &self.span {
            Some(span) => {
                let span = clamp(span.clone(), source);
                let (line, line_start) = match self.location {
                    Some(l) => (l.line, l.line_start),
                    None => {
                        let line_start = source[..span.start].rfind('\n').map_or(0, |i| i + 1);
                        (source[..line_start].matches('\n').count() + 1, line_start)
                    }
                };
                let (from, to) = window(source, line_start, &span, keep);
                let snippet = Snippet::source(&source[from..to])
                    .line_start(line)
                    .path(path)
                    .annotation(AnnotationKind::Primary.span(span.start - from..span.end - from).label(label.as_ref()));
                if from != line_start {
                    // The renderer counts the column from the start of what it is given.
                    let column = match self.location {
                        Some(l) => l.column,
                        None => source[line_start..span.start].chars().count() + 1,
                    };
                    let shown = source[from..span.start].chars().count() + 1;
                    shift = Some((format!(":{line}:{shown}"), format!(":{line}:{column}")));
                }
                title.element(snippet)
            }
            None => title.element(annotate_snippets::Origin::path(path)),
        };
        let group = match &self.help {
            Some(help) => group.element(Level::HELP.message(visible(help))),
            None => group,
        };
        let renderer = if color { Renderer::styled() } else { Renderer::plain() };
        let mut out = renderer.render(&[group]).to_string();
        if let Some((written, column)) = shift {
            // The header (`--> PATH:LINE:COLUMN`) is the second line, the location at its end:
            // the path before it may hold anything.
            let header = out.split_inclusive('\n').next().map(str::len).and_then(|start| {
                let end = out[start..].find('\n').map_or(out.len(), |n| start + n);
                out[start..end].rfind(&written).map(|i| start + i)
            });
            if let Some(at) = header {
                out.replace_range(at..at + written.len(), &column);
            }
        }
        out
    }
}

/// Columns of a long line kept on either side of a span: twice the 140 the renderer shows of a
/// line at most, so that what it shows of a window is what it shows of the whole line.
const KEEP_COLUMNS: usize = 280;

/// Most bytes looked through on either side of a span for those columns. Only a run of
/// characters of no width is longer; then the whole line is handed to the renderer.
const MAX_REACH: usize = 64 * 1024;

/// How many columns the renderer gives a character, or fewer (never more: a window counted
/// with it is at least as wide as it needs): a tab is 4.
fn columns(c: char) -> usize {
    if c == '\t' { 4 } else { unicode_width::UnicodeWidthChar::width(c).unwrap_or(0) }
}

/// How many bytes of `chars` hold `keep` columns; `None` when they end first, or go on for more
/// than `MAX_REACH` bytes without.
fn bytes_for_columns(chars: impl Iterator<Item = char>, keep: usize) -> Option<usize> {
    let (mut counted, mut bytes) = (0, 0);
    for c in chars {
        if counted >= keep {
            return Some(bytes);
        }
        if bytes > MAX_REACH {
            return None;
        }
        counted += columns(c);
        bytes += c.len_utf8();
    }
    (counted >= keep).then_some(bytes)
}

/// The part of `span`'s line (from `line_start`) handed to the renderer: all of it, or for a span
/// on a long line, a window from a non-blank character at least `keep` columns before the span
/// to `keep` columns past it. The renderer trims a long line to the span and its label by their
/// distance from each other and from the line's leading blanks, so a window that starts on a
/// non-blank character and is wider than what it shows draws the same text.
fn window(source: &str, line_start: usize, span: &Range<usize>, keep: usize) -> (usize, usize) {
    let end_of_line = |from: usize| source[from..].find('\n').map_or(source.len(), |i| from + i);
    if source[span.clone()].contains('\n') {
        return (line_start, end_of_line(span.end));
    }
    // Past the span: `keep` columns, looked for only so far (a diagnostic costs the same on a
    // line of a megabyte, and thousands of them on one line stay linear); before it, likewise,
    // then back to a non-blank character.
    let to = match bytes_for_columns(source[span.end..].chars().take_while(|&c| c != '\n'), keep) {
        Some(n) => span.end + n,
        None => end_of_line(span.end),
    };
    let from = match bytes_for_columns(source[line_start..span.start].chars().rev(), keep) {
        Some(n) => span.start - n,
        None => line_start,
    };
    match source[line_start..from].char_indices().rev().find(|(_, c)| !c.is_whitespace()) {
        Some((i, _)) => (line_start + i, to),
        None => (line_start, to),
    }
}

/// Keep a span inside the source and on char boundaries, so rendering can never panic.
fn clamp(span: Range<usize>, source: &str) -> Range<usize> {
    floor_char_boundary(source, span.start)..floor_char_boundary(source, span.end.max(span.start))
}

/// Where every key and value of a flow file sits, built by walking the parsed document once, so
/// that naming the key path of a diagnostic costs a search, not a parse of the file. A path is
/// kept as its last part and the part above it, and written out only when asked for: the index
/// of a 10,000-step file is built on its first diagnostic, and a string per entry cost 115M
/// instructions there.
#[derive(Debug, Default)]
pub(crate) struct KeyIndex {
    /// The parts of the paths: a key or an array index, under the part above it.
    parts: Vec<Part>,
    /// Every key and value, in the order walked: its span and its path (the last part's index).
    entries: Vec<(Range<usize>, u32)>,
    /// The entries' indices in the order of their spans' starts (then in the order walked).
    by_start: Vec<u32>,
    /// Each item of an array that is not a table (named by its array among `entries`): where it
    /// starts and its own path (`run[1]`), sorted by start.
    items: Vec<(usize, u32)>,
}

#[derive(Debug)]
struct Part {
    above: Option<u32>,
    name: PartName,
}

#[derive(Debug)]
enum PartName {
    Key(String),
    Index(usize),
}

impl KeyIndex {
    /// Index `source`; an unparsable document gives an empty index (no key paths).
    pub(crate) fn new(source: &str) -> KeyIndex {
        DeTable::parse(source).map(|table| KeyIndex::of(table.get_ref())).unwrap_or_default()
    }

    /// Index a parsed document.
    pub(crate) fn of(table: &DeTable<'_>) -> KeyIndex {
        let mut index = KeyIndex::default();
        {
            // An explicit stack instead of recursion: nesting is bounded by the TOML parser's own
            // limit, but the walk need not rely on it.
            let mut stack: Vec<(&Spanned<DeValue<'_>>, u32)> = Vec::new();
            index.table(table, None, &mut stack);
            while let Some((value, path)) = stack.pop() {
                match value.get_ref() {
                    DeValue::Table(t) => index.table(t, Some(path), &mut stack),
                    DeValue::Array(items) => {
                        let mut pending = Vec::new();
                        for (i, item) in items.iter().enumerate() {
                            let item_path = index.part(Some(path), PartName::Index(i));
                            // A table in an array is named by its index; any other item by the array.
                            let named = if matches!(item.get_ref(), DeValue::Table(_)) { item_path } else { path };
                            if named == path {
                                index.items.push((item.span().start, item_path));
                            }
                            index.entries.push((item.span(), named));
                            pending.push((item, item_path));
                        }
                        stack.extend(pending.into_iter().rev());
                    }
                    _ => {}
                }
            }
        }
        let mut by_start: Vec<u32> = (0..index.entries.len() as u32).collect();
        by_start.sort_by_key(|&e| index.entries[e as usize].0.start);
        index.by_start = by_start;
        index.items.sort_unstable();
        index
    }

    fn part(&mut self, above: Option<u32>, name: PartName) -> u32 {
        self.parts.push(Part { above, name });
        (self.parts.len() - 1) as u32
    }

    fn table<'a, 'b>(
        &mut self,
        table: &'b DeTable<'a>,
        above: Option<u32>,
        stack: &mut Vec<(&'b Spanned<DeValue<'a>>, u32)>,
    ) {
        let mut pending = Vec::new();
        for (key, value) in table {
            let path = self.part(above, PartName::Key(key.get_ref().to_string()));
            self.entries.push((key.span(), path));
            self.entries.push((value.span(), path));
            pending.push((value, path));
        }
        // Popped in document order.
        stack.extend(pending.into_iter().rev());
    }

    /// Where the top-level key `key` is written, from its name to the end of its value
    /// (`step = []`), if it is.
    pub(crate) fn top_level(&self, key: &str) -> Option<Range<usize>> {
        let at = self.entries.iter().position(|&(_, path)| {
            let part = &self.parts[path as usize];
            part.above.is_none() && matches!(&part.name, PartName::Key(k) if k == key)
        })?;
        let value = self.entries.get(at + 1).filter(|(_, path)| *path == self.entries[at].1)?;
        Some(self.entries[at].0.start..value.0.end)
    }

    /// [`KeyIndex::path_at`], but an item of a list (of strings, say) that starts at `offset` is
    /// named itself, by its index (`step[2].run[1]`), rather than by its list.
    pub(crate) fn item_path_at(&self, offset: usize) -> Option<String> {
        match self.items.binary_search_by_key(&offset, |&(start, _)| start) {
            Ok(i) => Some(self.write(self.items[i].1)),
            Err(_) => self.path_at(offset),
        }
    }

    /// The dotted key path (`step[1].retry.attempts`) of the deepest key or value at `offset`:
    /// the last walked of the entries that start there, else the last walked that holds it.
    pub(crate) fn path_at(&self, offset: usize) -> Option<String> {
        let starts = self.by_start.partition_point(|&e| self.entries[e as usize].0.start <= offset);
        let path = match starts.checked_sub(1).map(|last| self.by_start[last]) {
            Some(e) if self.entries[e as usize].0.start == offset => self.entries[e as usize].1,
            _ => self.entries.iter().rev().find(|(span, _)| span.contains(&offset))?.1,
        };
        Some(self.write(path))
    }

    fn write(&self, part: u32) -> String {
        let mut parts = Vec::new();
        let mut at = Some(part);
        while let Some(p) = at {
            let part = &self.parts[p as usize];
            parts.push(&part.name);
            at = part.above;
        }
        let mut out = String::new();
        for name in parts.into_iter().rev() {
            match name {
                PartName::Key(key) if out.is_empty() => out.push_str(&key_in_path(key)),
                PartName::Key(key) => {
                    out.push('.');
                    out.push_str(&key_in_path(key));
                }
                PartName::Index(i) => out.push_str(&format!("[{i}]")),
            }
        }
        out
    }
}

/// A key as a message's key path writes it: as the file must write it, quoted with TOML's escapes
/// when it is not bare (`params.""`, `env."C=D"`, `params."a\nb"`).
pub(crate) fn key_in_path(key: &str) -> std::borrow::Cow<'_, str> {
    match !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        true => std::borrow::Cow::Borrowed(key),
        false => std::borrow::Cow::Owned(super::toml_quoted(key)),
    }
}

/// Line starts of a text, for turning byte offsets into lines and columns without rescanning.
#[derive(Debug)]
pub(crate) struct Lines {
    starts: Vec<usize>,
    /// The last offset asked for, with its 0-based line and 1-based column: the next offset on
    /// the same line counts characters from there, so locating thousands of diagnostics on one
    /// long line (in order, as they are located) is linear.
    last: Cell<(usize, usize, usize)>,
}

impl Lines {
    pub(crate) fn new(source: &str) -> Lines {
        let starts = std::iter::once(0).chain(source.match_indices('\n').map(|(i, _)| i + 1)).collect();
        Lines { starts, last: Cell::new((0, 0, 1)) }
    }

    /// The 0-based line holding `offset`.
    pub(crate) fn line_of(&self, offset: usize) -> usize {
        self.starts.partition_point(|&s| s <= offset).saturating_sub(1)
    }

    /// 1-based line and column (in characters) of `offset`.
    pub(crate) fn line_col(&self, source: &str, offset: usize) -> (usize, usize) {
        let offset = floor_char_boundary(source, offset);
        let line = self.line_of(offset);
        let (from, column) = match self.last.get() {
            (last, last_line, column) if last_line == line && last <= offset => (last, column),
            _ => (self.starts[line], 1),
        };
        let column = column + source[from..offset].chars().count();
        self.last.set((offset, line, column));
        (line + 1, column)
    }
}

fn floor_char_boundary(source: &str, mut i: usize) -> usize {
    i = i.min(source.len());
    while !source.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_path_at(source: &str, offset: usize) -> Option<String> {
        KeyIndex::new(source).path_at(offset)
    }

    #[test]
    fn finds_nested_key_paths() {
        let src = "name = 'x'\n[[step]]\nname = 'a'\n[[step]]\nname = 'b'\n[step.retry]\nattempts = 0\n";
        let at = src.find("0\n").unwrap();
        assert_eq!(key_path_at(src, at).as_deref(), Some("step[1].retry.attempts"));
        assert_eq!(key_path_at(src, 1).as_deref(), Some("name"));
    }

    #[test]
    fn the_index_answers_offsets_inside_values_and_arrays() {
        let src = "[[step]]\nname = 'a'\nrun = ['x', 'y']\nretry = { exception_types = ['A', 'B'] }\n";
        let index = KeyIndex::new(src);
        let y = src.find("'y'").unwrap();
        assert_eq!(index.path_at(y).as_deref(), Some("step[0].run"));
        assert_eq!(index.path_at(y + 1).as_deref(), Some("step[0].run"), "inside a string: no entry starts there");
        assert_eq!(index.path_at(src.find("'B'").unwrap()).as_deref(), Some("step[0].retry.exception_types"));
        assert_eq!(index.path_at(src.find("retry").unwrap()).as_deref(), Some("step[0].retry"));
        assert_eq!(KeyIndex::new("not = [toml").path_at(0), None);
        // A key that is not bare is written quoted, with TOML's escapes.
        let src = "[params]\n\"a\\nb\\u0001\\\"\" = 1\n\"x.y\" = 2\nok = 3\n";
        let index = KeyIndex::new(src);
        let at = |needle: &str| index.path_at(src.find(needle).unwrap()).unwrap();
        assert_eq!(at("\"a"), "params.\"a\\nb\\u0001\\\"\"");
        assert_eq!(at("\"x.y"), "params.\"x.y\"");
        assert_eq!(at("ok"), "params.ok");
    }

    #[test]
    fn lines_count_columns_in_characters() {
        let src = "a = 1\nnamé = 'ü'\n\nlast";
        let lines = Lines::new(src);
        assert_eq!(lines.line_col(src, 0), (1, 1));
        assert_eq!(lines.line_col(src, src.find("'ü'").unwrap()), (2, 8));
        assert_eq!(lines.line_col(src, src.find("last").unwrap()), (4, 1));
        assert_eq!(lines.line_col(src, src.len() + 5), (4, 5), "past the end: clamped");
    }

    #[test]
    fn renders_location_line_and_caret() {
        let src = "[[step]]\nname = 'a'\ntimeout = -1\n";
        let start = src.find("-1").unwrap();
        let d = Diagnostic::error(start..start + 2, "bad timeout").label("here");
        let out = d.render("flow.toml", src, false);
        assert!(out.contains("--> flow.toml:3:11"), "{out}");
        assert!(out.contains("timeout = -1"), "{out}");
        assert!(out.contains("^^ here"), "{out}");
    }
}

#[cfg(test)]
mod long_lines {
    use super::*;

    /// Every span of interest in `src`: each quoted item, a zero-width span after the last, and
    /// a span from an item to the end of the file (across lines when there are several).
    fn spans(src: &str) -> Vec<Range<usize>> {
        let quotes: Vec<usize> = src.match_indices('"').map(|(i, _)| i).collect();
        let mut spans: Vec<Range<usize>> = quotes.chunks_exact(2).map(|q| q[0]..q[1] + 1).collect();
        // Every item near the start and near the end, and every eleventh between.
        let n = spans.len();
        spans = spans
            .into_iter()
            .enumerate()
            .filter(|(i, _)| *i < 12 || *i + 12 > n || i % 11 == 0)
            .map(|(_, s)| s)
            .collect();
        let last = spans.last().map_or(0, |s| s.end);
        spans.push(last..last);
        spans.push(quotes[quotes.len() / 2]..src.len());
        spans
    }

    fn line(lead: &str, item: impl Fn(usize) -> String, sep: &str, n: usize) -> String {
        let items: Vec<String> = (0..n).map(item).collect();
        format!("{lead}needs = [{}]", items.join(sep))
    }

    /// Drawn with a window, a diagnostic reads exactly as drawn from the whole line: the same
    /// location, the same part of the line, the same caret and `...` marks.
    #[test]
    fn a_window_of_a_long_line_draws_what_the_whole_line_draws() {
        let lines = [
            line("", |i| format!("\"u{i}\""), ",", 900),
            line("   ", |i| format!("\"step-{i}\""), ", ", 700),
            line("                              ", |i| format!("\"s{i}\""), ",\t", 900),
            line("\t\t", |i| format!("\"名前{i}\""), ", ", 500),
            line("", |i| format!("\"🦀{i}é\""), ",", 500),
            line(
                "",
                |i| if i % 50 == 49 { format!("{}\"x{i}\"", " ".repeat(1500)) } else { format!("\"x{i}\"") },
                ",",
                300,
            ),
            line("", |i| if i == 200 { format!("\"{}\"", "y".repeat(3000)) } else { format!("\"z{i}\"") }, ",", 400),
            // Runs of characters of no width (combining accents, zero-width spaces) around items.
            line(
                "",
                |i| if i % 40 == 39 { format!("\"{}w{i}\"", "\u{301}".repeat(700)) } else { format!("\"w{i}\"") },
                ",",
                300,
            ),
            line(
                "",
                |i| if i % 40 == 39 { format!("\"v{i}\"{}", "\u{200b}".repeat(700)) } else { format!("\"v{i}\"") },
                ",",
                300,
            ),
        ];
        for (k, line) in lines.iter().enumerate() {
            // After a short line, before one, alone, before another long line (a span across the
            // two), with CRLF line ends.
            for src in [
                format!("name = 'x'\n{line}\n"),
                format!("name = 'x'\n{line}\n[[step]]\nrun = \"a\"\n"),
                line.clone(),
                format!("{line}\n{line}\n"),
                format!("name = 'x'\r\n{line}\r\n"),
            ] {
                let index = Lines::new(&src);
                for (i, span) in spans(&src).into_iter().enumerate() {
                    // A message may quote what the file holds, even what looks like a location.
                    let message = if i % 4 == 1 { "no step named `--> f.toml:2:1:2:9`" } else { "no step named this" };
                    let mut d = Diagnostic::error(span.clone(), message).label("unknown step");
                    d.help = Some("did you mean `a`?".into());
                    // Located, as a loaded flow's diagnostics are, and now and then not.
                    if i % 5 != 0 {
                        d.locate(&src, &index);
                    }
                    let (color, path) = [(false, "flow.toml"), (true, "flow.toml"), (false, "dir:2:40/f.toml")][i % 3];
                    let whole = d.draw(path, &src, color, usize::MAX);
                    assert_eq!(d.draw(path, &src, color, KEEP_COLUMNS), whole, "line {k}, span {span:?}");
                }
            }
        }
    }

    /// What the renderer is handed of a long line is bounded, wherever the span sits: a file
    /// with thousands of diagnostics on one line is drawn in linear time.
    #[test]
    fn only_a_bounded_window_of_a_long_line_is_drawn() {
        let src = line("", |i| format!("\"u{i}\""), ",", 200_000);
        for at in [0, src.len() / 3, src.len() - 20] {
            let start = src[at..].find(",\"").unwrap() + at + 1;
            let span = start..src[start + 1..].find('"').unwrap() + start + 2;
            let (from, to) = window(&src, 0, &span, KEEP_COLUMNS);
            assert!(to - from <= span.len() + 2 * KEEP_COLUMNS + 16, "{at}: {from}..{to}");
            assert!(from <= span.start && span.end <= to);
        }
    }

    /// Columns found from the last one asked for equal columns counted from the line's start,
    /// in order and out of order.
    #[test]
    fn columns_counted_from_the_last_offset_are_right() {
        let src = "ab\n名前 x\t\"🦀\"\n\nlast line é here";
        let index = Lines::new(src);
        let naive = |offset: usize| {
            let offset = floor_char_boundary(src, offset);
            let start = src[..offset].rfind('\n').map_or(0, |i| i + 1);
            (src[..start].matches('\n').count() + 1, src[start..offset].chars().count() + 1)
        };
        let mut offsets: Vec<usize> = (0..=src.len()).collect();
        offsets.extend((0..=src.len()).rev());
        offsets.extend([20, 3, 25, 24, 8, 9, 0, src.len()]);
        for offset in offsets {
            assert_eq!(index.line_col(src, offset), naive(offset), "offset {offset}");
        }
    }
}
