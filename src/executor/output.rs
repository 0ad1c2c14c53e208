//! Child output on its way to the reporters.
//!
//! Readers copy a child's output to its log file first, then hand whole lines to the dispatcher.
//! Nothing on this path waits for a terminal or a pipe: a reporter that cannot keep up drops
//! lines from its display (never from the logs), so a stalled terminal slows neither the children
//! nor the dispatcher, and timeouts and signals keep working. A display written to a regular file
//! drops nothing: it holds the readers back at an [`OutputGate`] instead, as `> file` would.

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use tokio::sync::Notify;

/// Holds the readers of children's output back while a display that must not drop any of it (one
/// written to a regular file, which never stalls for long) is more than `limit` bytes behind, until
/// it is at most half that behind (so that a reader and the display's writer do not wake each
/// other for every chunk). The readers wait before they hand the dispatcher more lines, never the
/// dispatcher itself: while they wait, the children block on their pipes, and timeouts and
/// signals work as ever.
#[derive(Debug)]
pub(crate) struct OutputGate {
    /// Child output queued for such displays and not written yet.
    behind: AtomicUsize,
    /// Bytes written in all: whether the displays are moving.
    written: AtomicU64,
    limit: usize,
    opened: Notify,
}

impl OutputGate {
    pub(crate) fn new(limit: usize) -> OutputGate {
        OutputGate { behind: AtomicUsize::new(0), written: AtomicU64::new(0), limit, opened: Notify::new() }
    }

    /// `n` more bytes are queued.
    pub(crate) fn queued(&self, n: usize) {
        self.behind.fetch_add(n, Ordering::SeqCst);
    }

    /// `n` of the queued bytes are written (or given up on); waiting readers go on once at most
    /// half of `limit` are left.
    pub(crate) fn written(&self, n: usize) {
        self.written.fetch_add(n as u64, Ordering::SeqCst);
        if self.behind.fetch_sub(n, Ordering::SeqCst) - n <= self.limit / 2 {
            self.opened.notify_waiters();
        }
    }

    /// Bytes written in all so far: a reader held at the gate is held by a display that is still
    /// writing, not by a process, while this grows.
    pub(crate) fn progress(&self) -> u64 {
        self.written.load(Ordering::SeqCst)
    }

    /// Go on at once when at most `limit` bytes are queued; otherwise wait until at most half
    /// of `limit` are.
    pub(crate) async fn wait(&self) {
        if self.behind.load(Ordering::SeqCst) <= self.limit {
            return;
        }
        loop {
            // Made before the check, so that a `written` between the two still wakes it.
            let opened = self.opened.notified();
            if self.behind.load(Ordering::SeqCst) <= self.limit / 2 {
                return;
            }
            opened.await;
        }
    }
}

/// Whole lines (or a final unterminated line, ended with a newline) a child wrote.
pub(crate) struct Chunk {
    bytes: Vec<u8>,
}

impl Chunk {
    pub(crate) fn new(bytes: Vec<u8>) -> Chunk {
        Chunk { bytes }
    }
}

#[cfg(test)]
impl Chunk {
    /// The memory its buffer holds.
    pub(crate) fn capacity(&self) -> usize {
        self.bytes.capacity()
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
    use super::{OutputGate, StderrTail};

    #[tokio::test]
    async fn the_gate_holds_readers_while_more_than_its_limit_is_queued() {
        let gate = std::sync::Arc::new(OutputGate::new(10));
        gate.queued(10);
        gate.wait().await; // at the limit: open
        gate.queued(5);
        let waiting = tokio::spawn({
            let gate = std::sync::Arc::clone(&gate);
            async move { gate.wait().await }
        });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!waiting.is_finished(), "15 bytes queued, 10 allowed: the reader waits");
        gate.written(5);
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!waiting.is_finished(), "10 bytes queued: still waiting, until 5 are");
        gate.written(5);
        tokio::time::timeout(std::time::Duration::from_secs(60), waiting)
            .await
            .expect("5 bytes queued: the reader goes on")
            .unwrap();
        gate.queued(5);
        gate.wait().await; // at the limit again, with no reader held back: open
    }

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
