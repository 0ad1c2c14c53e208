//! Errors and warnings about a flow file, drawn with the offending line and a caret.

use annotate_snippets::{AnnotationKind, Level, Renderer, Snippet};
use std::collections::HashMap;
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
    /// the span covers are handed to the renderer, so drawing costs the same in a huge file.
    pub fn render(&self, path: &str, source: &str, color: bool) -> String {
        let level = match self.severity {
            Severity::Error => Level::ERROR,
            Severity::Warning => Level::WARNING,
        };
        let title = level.primary_title(self.message.as_str());
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
                let line_end = source[span.end..].find('\n').map_or(source.len(), |i| span.end + i);
                title.element(
                    Snippet::source(&source[line_start..line_end]).line_start(line).path(path).annotation(
                        AnnotationKind::Primary
                            .span(span.start - line_start..span.end - line_start)
                            .label(self.label.as_str()),
                    ),
                )
            }
            None => title.element(annotate_snippets::Origin::path(path)),
        };
        let group = match &self.help {
            Some(help) => group.element(Level::HELP.message(help.as_str())),
            None => group,
        };
        let renderer = if color { Renderer::styled() } else { Renderer::plain() };
        renderer.render(&[group]).to_string()
    }
}

/// Keep a span inside the source and on char boundaries, so rendering can never panic.
fn clamp(span: Range<usize>, source: &str) -> Range<usize> {
    floor_char_boundary(source, span.start)..floor_char_boundary(source, span.end.max(span.start))
}

/// Where every key and value of a flow file sits, built by walking the parsed document once, so
/// that naming the key path of a diagnostic costs a hash lookup, not a parse of the file.
#[derive(Debug, Default)]
pub(crate) struct KeyIndex {
    /// Start offset of a key or value → the path of the deepest entry starting there.
    by_start: HashMap<usize, String>,
    /// Every `(span, path)` in document order, for offsets that start no entry.
    all: Vec<(Range<usize>, String)>,
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
            let mut stack: Vec<(&Spanned<DeValue<'_>>, String)> = Vec::new();
            index.table(table, "", &mut stack);
            while let Some((value, path)) = stack.pop() {
                match value.get_ref() {
                    DeValue::Table(t) => index.table(t, &path, &mut stack),
                    DeValue::Array(items) => {
                        let mut pending = Vec::new();
                        for (i, item) in items.iter().enumerate() {
                            let item_path = format!("{path}[{i}]");
                            if matches!(item.get_ref(), DeValue::Table(_)) {
                                index.add(item.span(), &item_path);
                            } else {
                                index.add(item.span(), &path);
                            }
                            pending.push((item, item_path));
                        }
                        stack.extend(pending.into_iter().rev());
                    }
                    _ => {}
                }
            }
        }
        index
    }

    fn table<'a, 'b>(
        &mut self,
        table: &'b DeTable<'a>,
        prefix: &str,
        stack: &mut Vec<(&'b Spanned<DeValue<'a>>, String)>,
    ) {
        let mut pending = Vec::new();
        for (key, value) in table {
            let path =
                if prefix.is_empty() { key.get_ref().to_string() } else { format!("{prefix}.{}", key.get_ref()) };
            self.add(key.span(), &path);
            self.add(value.span(), &path);
            pending.push((value, path));
        }
        // Popped in document order.
        stack.extend(pending.into_iter().rev());
    }

    fn add(&mut self, span: Range<usize>, path: &str) {
        self.by_start.insert(span.start, path.to_owned());
        self.all.push((span, path.to_owned()));
    }

    /// The dotted key path (`step[1].retry.attempts`) of the deepest key or value at `offset`.
    pub(crate) fn path_at(&self, offset: usize) -> Option<&str> {
        if let Some(path) = self.by_start.get(&offset) {
            return Some(path);
        }
        self.all.iter().rev().find(|(span, _)| span.contains(&offset)).map(|(_, path)| path.as_str())
    }
}

/// Line starts of a text, for turning byte offsets into lines and columns without rescanning.
#[derive(Debug)]
pub(crate) struct Lines {
    starts: Vec<usize>,
}

impl Lines {
    pub(crate) fn new(source: &str) -> Lines {
        let starts = std::iter::once(0).chain(source.match_indices('\n').map(|(i, _)| i + 1)).collect();
        Lines { starts }
    }

    /// The 0-based line holding `offset`.
    pub(crate) fn line_of(&self, offset: usize) -> usize {
        self.starts.partition_point(|&s| s <= offset).saturating_sub(1)
    }

    /// 1-based line and column (in characters) of `offset`.
    pub(crate) fn line_col(&self, source: &str, offset: usize) -> (usize, usize) {
        let offset = floor_char_boundary(source, offset);
        let line = self.line_of(offset);
        let column = source[self.starts[line]..offset].chars().count() + 1;
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
        KeyIndex::new(source).path_at(offset).map(str::to_owned)
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
        assert_eq!(index.path_at(y), Some("step[0].run"));
        assert_eq!(index.path_at(y + 1), Some("step[0].run"), "inside a string: no entry starts there");
        assert_eq!(index.path_at(src.find("'B'").unwrap()), Some("step[0].retry.exception_types"));
        assert_eq!(index.path_at(src.find("retry").unwrap()), Some("step[0].retry"));
        assert_eq!(KeyIndex::new("not = [toml").path_at(0), None);
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
