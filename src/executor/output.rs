//! Child output on its way to the reporters, under a byte budget.
//!
//! Readers take budget before they hand a chunk on and the budget comes back when the last
//! reporter is done with the chunk. A terminal that stops reading therefore stops the readers,
//! and with them the child (on its full pipe), as in any shell pipeline, while the event loop
//! itself never waits for the terminal: timeouts and signals keep working.

use std::fmt;
use std::sync::{Arc, Condvar, Mutex};

/// Bytes of child output that may be on their way to the terminal at once.
pub const BUDGET: usize = 8 * 1024 * 1024;
/// The largest chunk a reader hands on (its read size, plus a newline).
const CHUNK_HINT: usize = 64 * 1024 + 1;

#[derive(Default)]
pub struct Budget {
    used: Mutex<usize>,
    freed: Condvar,
}

impl Budget {
    pub fn new() -> Arc<Budget> {
        Arc::new(Budget::default())
    }

    /// Wrap `bytes` in a chunk, first waiting (on a reader's thread) until the budget has room.
    /// A chunk larger than the whole budget still goes through once nothing else is in flight.
    pub fn take(self: &Arc<Self>, bytes: Vec<u8>) -> Arc<Chunk> {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        while *used > 0 && *used + bytes.len() > BUDGET {
            used = self.freed.wait(used).unwrap_or_else(|e| e.into_inner());
        }
        *used += bytes.len();
        Arc::new(Chunk { bytes, budget: Arc::clone(self) })
    }

    /// Whether a reader may be waiting for room (the terminal is behind).
    pub fn is_full(&self) -> bool {
        let used = *self.used.lock().unwrap_or_else(|e| e.into_inner());
        used + CHUNK_HINT > BUDGET
    }

    fn give_back(&self, n: usize) {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        *used = used.saturating_sub(n);
        self.freed.notify_all();
    }
}

/// Whole lines (or a final unterminated line, ended with a newline) a child wrote. The bytes
/// count against the budget until the chunk is dropped.
pub struct Chunk {
    bytes: Vec<u8>,
    budget: Arc<Budget>,
}

impl std::ops::Deref for Chunk {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes.len());
    }
}

impl fmt::Debug for Chunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Chunk({} bytes)", self.bytes.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_budget_waits_until_a_chunk_is_dropped() {
        let budget = Budget::new();
        let big = budget.take(vec![b'x'; BUDGET - 10]);
        let waiter = {
            let budget = Arc::clone(&budget);
            std::thread::spawn(move || budget.take(vec![b'y'; 100]).len())
        };
        // The second chunk cannot fit while the first is held.
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!waiter.is_finished());
        drop(big);
        assert_eq!(waiter.join().unwrap(), 100);
        // An oversized chunk goes through alone.
        assert_eq!(budget.take(vec![0; BUDGET * 2]).len(), BUDGET * 2);
    }
}
