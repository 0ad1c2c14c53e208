//! Text that reaches a terminal: what a flow or a child wrote, shown so that the terminal shows
//! it and does not act on it.

use std::borrow::Cow;

/// `text` as a terminal can show it: every control character but a newline and a tab (an escape
/// sequence that would recolour or hide what follows, a carriage return that would let a flow or
/// a child write over waymark's own line) as its Unicode control picture (`␛`, `␍`), as the
/// source lines of diagnostics are shown; the C1 controls, which have none, and the bidirectional
/// overrides and isolates (which would show a command's text in another order than it runs) as
/// `�`.
pub(crate) fn visible(text: &str) -> Cow<'_, str> {
    fn hidden(c: char) -> bool {
        (c.is_control() && c != '\n' && c != '\t')
            || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{061c}')
    }
    // Every such character is a control byte or starts with a byte past ASCII; an ASCII text
    // without controls (a 10,000-step plan is a megabyte of it) is told in blocks without an early
    // exit, which the compiler turns into vector instructions.
    let lead = |b: u8| ((b < 0x20) & (b != b'\n') & (b != b'\t')) | (b >= 0x7f);
    let mut blocks = text.as_bytes().chunks_exact(32);
    let maybe = blocks.by_ref().any(|block| block.iter().fold(0u8, |seen, &b| seen | u8::from(lead(b))) != 0);
    if !maybe && !blocks.remainder().iter().any(|&b| lead(b)) {
        return Cow::Borrowed(text);
    }
    if !text.chars().any(hidden) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(
        text.chars()
            .map(|c| match c {
                '\0'..='\x1f' if c != '\n' && c != '\t' => char::from_u32(0x2400 + c as u32).unwrap_or('\u{fffd}'),
                '\x7f' => '\u{2421}',
                c if hidden(c) => '\u{fffd}',
                c => c,
            })
            .collect(),
    )
}

/// A path on one line, as a header or a diagnostic names a flow file: [`visible`], with a
/// newline and a tab shown as their pictures too (`␊`, `␉`), so that a path holding one cannot
/// split the line it is on.
pub(crate) fn shown_path(path: &std::path::Path) -> String {
    let text = path.to_string_lossy();
    visible(&text).replace('\n', "\u{240a}").replace('\t', "\u{2409}")
}

/// `text` and the spaces that take it to `width` columns of a terminal, where a wide character
/// (`日`, most emoji) takes two and a combining mark none: `format!("{:<width$}")` counts
/// characters, and a column of names with such characters would lose its line.
pub(crate) fn padded(text: &str, width: usize) -> String {
    format!("{text}{:pad$}", "", pad = width.saturating_sub(columns(text)))
}

/// The columns of a terminal `text` takes (see [`padded`]).
pub(crate) fn columns(text: &str) -> usize {
    unicode_width::UnicodeWidthStr::width(text)
}

/// [`visible`], owned: `text` itself when nothing in it needs a picture.
pub(crate) fn visible_owned(text: String) -> String {
    match visible(&text) {
        Cow::Borrowed(_) => text,
        Cow::Owned(shown) => shown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_padded_name_takes_its_columns_whatever_its_characters() {
        assert_eq!(padded("ok", 5), "ok   ");
        assert_eq!(padded("日本語", 8), "日本語  ");
        assert_eq!(padded("é", 3), "é  ");
        assert_eq!(padded("toolong", 3), "toolong");
    }

    #[test]
    fn what_a_terminal_would_act_on_is_shown_as_a_picture() {
        assert_eq!(visible("a\u{1b}[2Jb\rc\td\n\u{7f}\u{8}"), "a␛[2Jb␍c\td\n␡␈");
        assert_eq!(visible("rm \u{202e}fdp.exe \u{9b}x"), "rm �fdp.exe �x");
        for plain in ["plain\nlines", "café 30° £5 — “quoted” …", ""] {
            assert!(matches!(visible(plain), Cow::Borrowed(_)), "{plain}");
        }
    }
}
