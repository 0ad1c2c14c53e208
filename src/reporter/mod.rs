//! Reporters: where everything waymark says while it runs a flow comes from.
//!
//! A reporter implements [`crate::events::Reporter`]: it is handed every [`crate::events::Envelope`]
//! that the executor and the `run`/`resume` commands emit, in order, and owns what it writes to. It
//! never reaches back into the run. Several can be attached to one `Emitter` at once; `run` and
//! `resume` attach one, chosen by their flags:
//!
//! - [`PlainReporter`] (the default when stderr is not a terminal, or `--progress plain`): child
//!   output behind its step's name (which of it, `--output` chooses through an
//!   [`output_filter::OutputFilter`]), waymark's own lines on stderr behind the local time and
//!   `waymark:`, one per event, then the summary table and the failure report.
//! - [`LiveReporter`] (`--progress live`, or `auto` on a terminal): a line per running step with
//!   its attempt, time and countdowns, and a done/total bar, drawn by indicatif on stderr; child
//!   output (through the same filter) and waymark's own lines scroll above it; the same summary
//!   table and failure report at the end.
//! - [`QuietReporter`] (`--quiet`): nothing unless the run fails (the failure report) or is
//!   interrupted (one line).
//! - [`JsonReporter`] (`--json`): one JSON object per event on stdout.
//!
//! `report` draws the summary table and the failure report; `output_filter` decides which child
//! output is shown; `local_time` stamps lines; `terminal` owns the standard streams, each written
//! by a thread of its own so that a stalled reader never stalls the run.

mod json;
mod live;
mod local_time;
mod output_filter;
mod plain;
mod quiet;
mod report;
mod terminal;

use crate::events::Reporter;
use json::JsonReporter;
use live::LiveReporter;
pub(crate) use output_filter::OutputMode;
use plain::PlainReporter;
use quiet::QuietReporter;
pub(crate) use report::{attempt_line, before_budget, rest_of_message, short};

/// What `run` and `resume` show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// With whose output is shown.
    Plain(OutputMode),
    Live(OutputMode),
    Quiet,
    Json,
}

impl Mode {
    /// From the flags of `run` and `resume` (clap keeps them apart).
    /// `--json` wins over `--quiet`, and both over the live display.
    pub(crate) fn from_flags(quiet: bool, json: bool, live: bool, output: OutputMode) -> Mode {
        match (quiet, json, live) {
            (_, true, _) => Mode::Json,
            (true, false, _) => Mode::Quiet,
            (false, false, true) => Mode::Live(output),
            (false, false, false) => Mode::Plain(output),
        }
    }

    /// The reporter that shows a run this way.
    pub(crate) fn reporter(self) -> Box<dyn Reporter> {
        match self {
            Mode::Plain(output) => Box::new(PlainReporter::new(output)),
            Mode::Live(output) => Box::new(LiveReporter::new(output)),
            Mode::Quiet => Box::new(QuietReporter::new()),
            Mode::Json => Box::new(JsonReporter::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Mode, OutputMode};
    use crate::events::Emitter;

    #[test]
    fn children_s_lines_reach_the_runner_only_when_the_display_shows_them() {
        let cases = [
            (Mode::Plain(OutputMode::All), true),
            (Mode::Plain(OutputMode::Failed), true),
            (Mode::Plain(OutputMode::None), false),
            (Mode::Live(OutputMode::All), true),
            (Mode::Live(OutputMode::Failed), true),
            (Mode::Live(OutputMode::None), false),
            (Mode::Quiet, false),
            (Mode::Json, false),
        ];
        for (mode, shows) in cases {
            assert_eq!(Emitter::new(vec![mode.reporter()]).shows_output(), shows, "{mode:?}");
        }
    }

    /// A resumed run's earlier attempts are read for every display with a failure report (they
    /// are in it); only the `--json` stream, which has none, goes without.
    #[test]
    fn earlier_attempts_are_read_for_every_display_with_a_failure_report() {
        let cases = [
            (Mode::Plain(OutputMode::All), true),
            (Mode::Plain(OutputMode::None), true),
            (Mode::Live(OutputMode::All), true),
            (Mode::Live(OutputMode::None), true),
            (Mode::Quiet, true),
            (Mode::Json, false),
        ];
        for (mode, wants) in cases {
            assert_eq!(Emitter::new(vec![mode.reporter()]).wants_earlier(), wants, "{mode:?}");
        }
    }
}
