//! Reporters: where everything waymark says while it runs a flow comes from.
//!
//! A reporter implements [`crate::events::Reporter`]: it is handed every [`crate::events::Envelope`]
//! that the executor and the `run`/`resume` commands emit, in order, and owns what it writes to. It
//! never reaches back into the run. Several can be attached to one `Emitter` at once.
//!
//! - [`PlainReporter`]: the terminal's lines: child output behind its step's name, waymark's own
//!   lines on stderr behind `waymark:`, and the failure report. Events that have no line of their
//!   own (a step's turn, start, wait and end) print nothing.

mod plain;

pub(crate) use plain::PlainReporter;
