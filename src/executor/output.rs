//! Child output on its way to the reporters.
//!
//! Readers copy a child's output to its log file first, then hand whole lines to the dispatcher.
//! Nothing on this path waits for the terminal: a reporter that cannot keep up drops lines from
//! its display (never from the logs), so a stalled terminal slows neither the children nor the
//! dispatcher, and timeouts and signals keep working.

use std::fmt;

/// Whole lines (or a final unterminated line, ended with a newline) a child wrote.
pub(crate) struct Chunk {
    bytes: Vec<u8>,
}

impl Chunk {
    pub(crate) fn new(bytes: Vec<u8>) -> Chunk {
        Chunk { bytes }
    }
}

impl std::ops::Deref for Chunk {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

/// The end of what an attempt wrote to stderr (secrets hidden, as in its log), kept as it passes
/// through the reader, so that its evidence is read from memory rather than from the log file.
#[derive(Default)]
pub(crate) struct StderrTail {
    /// At most `2 * KEEP` bytes, the last `KEEP` of them the ones kept.
    buf: Vec<u8>,
    /// How many bytes came in all.
    total: u64,
}

impl StderrTail {
    /// How much is kept: as much as the evidence reader uses.
    pub(crate) const KEEP: usize = 64 * 1024;

    pub(crate) fn push(&mut self, data: &[u8]) {
        self.total += data.len() as u64;
        if data.len() >= Self::KEEP {
            self.buf.clear();
            self.buf.extend_from_slice(&data[data.len() - Self::KEEP..]);
            return;
        }
        self.buf.extend_from_slice(data);
        if self.buf.len() > 2 * Self::KEEP {
            self.buf.drain(..self.buf.len() - Self::KEEP);
        }
    }

    /// The last `max` bytes (at most `KEEP`), lossily decoded, and whether more came before them
    /// (the tail is cut).
    pub(crate) fn last(&self, max: usize) -> (String, bool) {
        let max = max.min(Self::KEEP);
        let start = self.buf.len().saturating_sub(max);
        (String::from_utf8_lossy(&self.buf[start..]).into_owned(), self.total > max as u64)
    }
}

impl fmt::Debug for StderrTail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StderrTail({} of {} bytes)", self.buf.len().min(Self::KEEP), self.total)
    }
}

impl fmt::Debug for Chunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Chunk({} bytes)", self.bytes.len())
    }
}

#[cfg(test)]
mod tests {
    use super::StderrTail;

    #[test]
    fn the_tail_keeps_the_last_bytes_and_knows_when_it_is_cut() {
        let mut tail = StderrTail::default();
        assert_eq!(tail.last(StderrTail::KEEP), (String::new(), false));
        tail.push(b"first\n");
        tail.push(b"second\n");
        assert_eq!(tail.last(StderrTail::KEEP), ("first\nsecond\n".to_owned(), false));
        assert_eq!(tail.last(7), ("second\n".to_owned(), true));
        // Many small writes, then one larger than what is kept: the last KEEP bytes stay.
        let mut expected = Vec::new();
        for i in 0..50_000u32 {
            let line = format!("{i}\n");
            tail.push(line.as_bytes());
            expected.extend_from_slice(line.as_bytes());
        }
        let (text, cut) = tail.last(StderrTail::KEEP);
        assert!(cut);
        assert_eq!(text.as_bytes(), &expected[expected.len() - StderrTail::KEEP..]);
        let big: Vec<u8> = (0..3 * StderrTail::KEEP).map(|i| b'a' + (i % 26) as u8).collect();
        tail.push(&big);
        assert_eq!(tail.last(StderrTail::KEEP).0.as_bytes(), &big[big.len() - StderrTail::KEEP..]);
    }
}
