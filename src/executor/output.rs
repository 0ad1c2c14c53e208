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

impl fmt::Debug for Chunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Chunk({} bytes)", self.bytes.len())
    }
}
