//! Reporters own the terminal: they consume executor [`Event`]s and never reach back.

mod plain;

pub(crate) use plain::PlainReporter;

use crate::executor::Event;

pub(crate) trait Reporter {
    fn report(&mut self, event: &Event);
}
