//! Reporters: where everything waymark says while it runs a flow comes from.
//!
//! A reporter implements [`crate::events::Reporter`]: it is handed every [`crate::events::Envelope`]
//! that the executor and the `run`/`resume` commands emit, in order, and owns what it writes to. It
//! never reaches back into the run. Several can be attached to one `Emitter` at once; `run` and
//! `resume` attach one, chosen by their flags:
//!
//! - [`PlainReporter`] (the default): child output behind its step's name, waymark's own lines on
//!   stderr behind `waymark:`, and the failure report. Events that have no line of their own (a
//!   step's turn, start, wait and end) print nothing.
//! - [`LiveReporter`] (`--progress live`, or `auto` on a terminal): a line per running step with
//!   its attempt, time and countdowns, and a done/total bar, drawn by indicatif on stderr; child
//!   output and waymark's own lines scroll above it; the same failure report at the end.
//! - [`QuietReporter`] (`--quiet`): nothing unless the run fails (the failure report) or is
//!   interrupted (one line).
//! - [`JsonReporter`] (`--json`): one JSON object per event on stdout.
//!
//! `report` draws the failure report for the first two; `terminal` owns the standard streams,
//! each written by a thread of its own so that a stalled reader never stalls the run.

mod json;
mod live;
mod plain;
mod quiet;
mod report;
mod terminal;

use crate::events::Reporter;
use json::JsonReporter;
use live::{LiveReporter, OutputChoice};
use plain::PlainReporter;
use quiet::QuietReporter;

/// What `run` and `resume` show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Plain,
    Live,
    Quiet,
    Json,
}

impl Mode {
    /// From the flags of `run` and `resume` (clap keeps them apart).
    /// `--json` wins over `--quiet`, and both over the live display.
    pub(crate) fn from_flags(quiet: bool, json: bool, live: bool) -> Mode {
        match (quiet, json, live) {
            (_, true, _) => Mode::Json,
            (true, false, _) => Mode::Quiet,
            (false, false, true) => Mode::Live,
            (false, false, false) => Mode::Plain,
        }
    }

    /// The reporter that shows a run this way.
    pub(crate) fn reporter(self) -> Box<dyn Reporter> {
        match self {
            Mode::Plain => Box::new(PlainReporter::new()),
            // `--output` is the plain reporter's flag too: the lead wires it here at merge.
            Mode::Live => Box::new(LiveReporter::new(OutputChoice::All)),
            Mode::Quiet => Box::new(QuietReporter::new()),
            Mode::Json => Box::new(JsonReporter::new()),
        }
    }
}
