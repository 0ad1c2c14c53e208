//! Errors and warnings about a flow file, drawn with the offending line and a caret.

use annotate_snippets::{AnnotationKind, Level, Renderer, Snippet};
use std::ops::Range;
use toml::Spanned;
use toml::de::{DeTable, DeValue};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Error,
    Warning,
}

/// One problem in a flow file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub severity: Severity,
    pub message: String,
    /// Byte range in the source; `None` for problems of the file as a whole.
    pub span: Option<Range<usize>>,
    /// The short text under the caret.
    pub label: String,
    pub help: Option<String>,
}

impl Diagnostic {
    pub fn error(span: impl Into<Option<Range<usize>>>, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            severity: Severity::Error,
            message: message.into(),
            span: span.into(),
            label: String::new(),
            help: None,
        }
    }

    pub fn warning(span: impl Into<Option<Range<usize>>>, message: impl Into<String>) -> Diagnostic {
        Diagnostic { severity: Severity::Warning, ..Diagnostic::error(span, message) }
    }

    pub fn label(mut self, label: impl Into<String>) -> Diagnostic {
        self.label = label.into();
        self
    }

    pub fn help(mut self, help: impl Into<Option<String>>) -> Diagnostic {
        self.help = help.into();
        self
    }

    /// `did you mean `x`?` when there is a suggestion.
    pub fn did_you_mean(self, suggestion: Option<String>) -> Diagnostic {
        self.help(suggestion.map(|s| format!("did you mean `{s}`?")))
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }

    /// Draw the diagnostic like rustc: `--> flow.toml:3:7`, the line, a caret.
    pub fn render(&self, path: &str, source: &str, color: bool) -> String {
        let level = match self.severity {
            Severity::Error => Level::ERROR,
            Severity::Warning => Level::WARNING,
        };
        let title = level.primary_title(self.message.as_str());
        let group = match &self.span {
            Some(span) => {
                let span = clamp(span.clone(), source);
                title.element(
                    Snippet::source(source)
                        .path(path)
                        .annotation(AnnotationKind::Primary.span(span).label(self.label.as_str())),
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
    let fix = |mut i: usize| {
        i = i.min(source.len());
        while !source.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    fix(span.start)..fix(span.end.max(span.start))
}

/// The dotted key path (`step[1].retry.attempts`) of the deepest key or value at `offset`.
pub fn key_path_at(source: &str, offset: usize) -> Option<String> {
    let table = DeTable::parse(source).ok()?;
    let mut best = None;
    walk_table(table.get_ref(), "", offset, &mut best);
    best
}

fn walk_table(table: &DeTable<'_>, prefix: &str, offset: usize, best: &mut Option<String>) {
    for (key, value) in table {
        let path = if prefix.is_empty() { key.get_ref().to_string() } else { format!("{prefix}.{}", key.get_ref()) };
        if key.span().contains(&offset) || value.span().contains(&offset) {
            *best = Some(path.clone());
        }
        walk_value(value, &path, offset, best);
    }
}

fn walk_value(value: &Spanned<DeValue<'_>>, path: &str, offset: usize, best: &mut Option<String>) {
    match value.get_ref() {
        DeValue::Table(t) => walk_table(t, path, offset, best),
        DeValue::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let path = format!("{path}[{i}]");
                if item.span().contains(&offset) && matches!(item.get_ref(), DeValue::Table(_)) {
                    *best = Some(path.clone());
                }
                walk_value(item, &path, offset, best);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_nested_key_paths() {
        let src = "name = 'x'\n[[step]]\nname = 'a'\n[[step]]\nname = 'b'\n[step.retry]\nattempts = 0\n";
        let at = src.find("0\n").unwrap();
        assert_eq!(key_path_at(src, at).as_deref(), Some("step[1].retry.attempts"));
        assert_eq!(key_path_at(src, 1).as_deref(), Some("name"));
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
