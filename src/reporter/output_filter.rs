//! `--output all|failed|none`: which of the children's output a reporter shows as it comes. The
//! logs keep all of it whatever is chosen.
//!
//! - `all`: every chunk, as it comes.
//! - `failed`: what an attempt (or a catch handler, a compensation, a hook) writes is held until
//!   it ends, then shown if it failed and dropped if it succeeded or was cancelled. What is held
//!   is bounded, per attempt ([`HELD_PER_ATTEMPT`]) and in all ([`HELD_IN_ALL`]): past the bound
//!   the oldest lines go, and the attempt's output is preceded by a note of how much was not shown
//!   ([`Pass::Omitted`]), so its end, where the error usually is, is what is shown.
//! - `none`: nothing.
//!
//! A reporter hands every event to [`OutputFilter::pass`], in order, and shows what it returns.

use crate::events::{AttemptEnd, Envelope, Event, Stream};
use crate::executor::Chunk;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// Child output held for one attempt, at most.
pub(crate) const HELD_PER_ATTEMPT: usize = 1024 * 1024;
/// Child output held for all the attempts running at once, at most.
pub(crate) const HELD_IN_ALL: usize = 8 * 1024 * 1024;

/// Whose output is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum OutputMode {
    #[default]
    All,
    Failed,
    None,
}

/// What to show of the children's output.
#[derive(Debug)]
pub(crate) enum Pass {
    /// Lines a child wrote (whole lines, or a final unterminated line).
    Chunk { step: String, stream: Stream, chunk: Arc<Chunk> },
    /// The first `lines` lines (`bytes` bytes) that `step`'s failed `attempt` wrote are not shown:
    /// more was held than the bound allows. `attempt` is `None` for a catch handler, a
    /// compensation or a hook.
    Omitted { step: String, attempt: Option<u32>, lines: u64, bytes: u64 },
}

impl Pass {
    /// For [`Pass::Omitted`], waymark's line that says what was not shown and where it is, in
    /// run `run` (newline-terminated); `None` for a chunk.
    pub(crate) fn omitted_line(&self, run: &str) -> Option<String> {
        let Pass::Omitted { step, attempt, lines, bytes } = self else { return None };
        Some(match attempt {
            Some(k) => format!(
                "waymark: {step}: attempt {k}: its first {lines} line(s) ({bytes} bytes) are not shown; \
                 `waymark logs {run} {step} --attempt {k}` has all of them\n"
            ),
            None => format!(
                "waymark: {step}: its first {lines} line(s) ({bytes} bytes) are not shown; its log in the \
                 run's log directory has all of them\n"
            ),
        })
    }
}

/// The output of one attempt (or handler, compensation, hook) held until it ends.
#[derive(Default)]
struct Held {
    attempt: Option<u32>,
    chunks: VecDeque<(Stream, Arc<Chunk>)>,
    bytes: usize,
    dropped_lines: u64,
    dropped_bytes: u64,
}

impl Held {
    /// Drop the oldest chunk; its size, or `None` when nothing is held.
    fn drop_oldest(&mut self) -> Option<usize> {
        let (_, chunk) = self.chunks.pop_front()?;
        self.bytes -= chunk.len();
        self.dropped_bytes += chunk.len() as u64;
        self.dropped_lines += lines(&chunk);
        Some(chunk.len())
    }
}

/// Lines in a chunk (a final unterminated line counts).
fn lines(chunk: &[u8]) -> u64 {
    chunk.split_inclusive(|b| *b == b'\n').count() as u64
}

/// Decides, event by event, which child output is shown.
pub(crate) struct OutputFilter {
    mode: OutputMode,
    /// Under `failed`: what each running attempt wrote, by step (or compensation, or hook) name.
    held: HashMap<String, Held>,
    /// Bytes held in all.
    total: usize,
    per_attempt: usize,
    in_all: usize,
}

impl OutputFilter {
    pub(crate) fn new(mode: OutputMode) -> OutputFilter {
        OutputFilter::bounded(mode, HELD_PER_ATTEMPT, HELD_IN_ALL)
    }

    fn bounded(mode: OutputMode, per_attempt: usize, in_all: usize) -> OutputFilter {
        OutputFilter { mode, held: HashMap::new(), total: 0, per_attempt, in_all }
    }

    /// Whether it may show any child output at all (not under `none`).
    pub(crate) fn shows_any(&self) -> bool {
        self.mode != OutputMode::None
    }

    /// What of the children's output to show now that `envelope` came: under `all`, an output
    /// event's chunk; under `failed`, everything an attempt wrote when it ends failed; under
    /// `none`, nothing.
    pub(crate) fn pass(&mut self, envelope: &Envelope) -> Vec<Pass> {
        match self.mode {
            OutputMode::None => Vec::new(),
            OutputMode::All => match &envelope.event {
                Event::Output { step, stream, chunk } => {
                    vec![Pass::Chunk { step: step.clone(), stream: *stream, chunk: Arc::clone(chunk) }]
                }
                _ => Vec::new(),
            },
            OutputMode::Failed => self.failed_only(&envelope.event),
        }
    }

    fn failed_only(&mut self, event: &Event) -> Vec<Pass> {
        match event {
            Event::AttemptStarted { step, attempt, .. } => {
                self.open(step, Some(*attempt));
                Vec::new()
            }
            Event::HandlerStarted { step, .. } => {
                self.open(step, None);
                Vec::new()
            }
            Event::AuxStarted { name, .. } => {
                self.open(name, None);
                Vec::new()
            }
            Event::Output { step, stream, chunk } => self.hold(step, *stream, chunk),
            Event::AttemptFinished { step, outcome, .. }
            | Event::HandlerFinished { step, outcome, .. }
            | Event::AuxFinished { name: step, outcome, .. } => self.close(step, *outcome == AttemptEnd::Failed),
            _ => Vec::new(),
        }
    }

    fn open(&mut self, name: &str, attempt: Option<u32>) {
        self.close(name, false);
        self.held.insert(name.to_owned(), Held { attempt, ..Held::default() });
    }

    fn hold(&mut self, name: &str, stream: Stream, chunk: &Arc<Chunk>) -> Vec<Pass> {
        let Some(held) = self.held.get_mut(name) else {
            // Output of nothing that started (it cannot happen): shown rather than lost.
            return vec![Pass::Chunk { step: name.to_owned(), stream, chunk: Arc::clone(chunk) }];
        };
        let n = chunk.len();
        // Make room: this attempt's oldest lines go first; when what the others hold fills the
        // bound in all, the new lines themselves are not kept.
        while held.bytes + n > self.per_attempt || self.total + n > self.in_all {
            match held.drop_oldest() {
                Some(freed) => self.total -= freed,
                None => {
                    held.dropped_bytes += n as u64;
                    held.dropped_lines += lines(chunk);
                    return Vec::new();
                }
            }
        }
        held.chunks.push_back((stream, Arc::clone(chunk)));
        held.bytes += n;
        self.total += n;
        Vec::new()
    }

    /// The end of what `name` runs: its output if it failed, else nothing.
    fn close(&mut self, name: &str, failed: bool) -> Vec<Pass> {
        let Some(held) = self.held.remove(name) else { return Vec::new() };
        self.total -= held.bytes;
        if !failed {
            return Vec::new();
        }
        let mut shown = Vec::with_capacity(held.chunks.len() + 1);
        if held.dropped_bytes > 0 {
            shown.push(Pass::Omitted {
                step: name.to_owned(),
                attempt: held.attempt,
                lines: held.dropped_lines,
                bytes: held.dropped_bytes,
            });
        }
        shown.extend(held.chunks.into_iter().map(|(stream, chunk)| Pass::Chunk {
            step: name.to_owned(),
            stream,
            chunk,
        }));
        shown
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    fn envelope(event: Event) -> Envelope {
        Envelope { seq: 1, at: SystemTime::UNIX_EPOCH, run_id: Some("r1".into()), event }
    }

    fn started(step: &str, attempt: u32) -> Event {
        Event::AttemptStarted {
            step: step.into(),
            attempt,
            max_attempts: 3,
            pid: Some(1),
            redelivered: false,
            timeout: None,
        }
    }

    fn output(step: &str, stream: Stream, text: &str) -> Event {
        Event::Output { step: step.into(), stream, chunk: Arc::new(Chunk::new(text.as_bytes().to_vec())) }
    }

    fn finished(step: &str, attempt: u32, outcome: AttemptEnd) -> Event {
        Event::AttemptFinished {
            step: step.into(),
            attempt,
            max_attempts: 3,
            outcome,
            error: None,
            duration: Duration::from_millis(5),
            retry: None,
            stopped: None,
            exit_code: None,
            signal: None,
            killed_after_grace: false,
        }
    }

    /// What a filter shows of `events`, as text: `step/stream: lines`, `omitted ...`.
    fn shown(filter: &mut OutputFilter, events: Vec<Event>) -> Vec<String> {
        let mut out = Vec::new();
        for event in events {
            for pass in filter.pass(&envelope(event)) {
                out.push(match pass {
                    Pass::Chunk { step, stream, chunk } => {
                        format!("{step}/{}: {}", stream.name(), String::from_utf8_lossy(&chunk))
                    }
                    Pass::Omitted { step, attempt, lines, bytes } => {
                        format!("{step}: attempt {attempt:?}: {lines} lines, {bytes} bytes not shown")
                    }
                });
            }
        }
        out
    }

    /// Two steps at once: `a` fails on attempt 1 and succeeds on attempt 2, `b` succeeds.
    fn run() -> Vec<Event> {
        vec![
            started("a", 1),
            started("b", 1),
            output("a", Stream::Stdout, "a1 out\n"),
            output("b", Stream::Stdout, "b1 out\n"),
            output("a", Stream::Stderr, "a1 err\n"),
            finished("a", 1, AttemptEnd::Failed),
            started("a", 2),
            output("a", Stream::Stdout, "a2 out\n"),
            finished("b", 1, AttemptEnd::Succeeded),
            finished("a", 2, AttemptEnd::Succeeded),
        ]
    }

    #[test]
    fn all_shows_every_chunk_as_it_comes() {
        assert_eq!(
            shown(&mut OutputFilter::new(OutputMode::All), run()),
            ["a/stdout: a1 out\n", "b/stdout: b1 out\n", "a/stderr: a1 err\n", "a/stdout: a2 out\n"]
        );
    }

    #[test]
    fn failed_shows_only_the_failed_attempts_output_in_order_when_it_ends() {
        assert_eq!(
            shown(&mut OutputFilter::new(OutputMode::Failed), run()),
            ["a/stdout: a1 out\n", "a/stderr: a1 err\n"]
        );
    }

    #[test]
    fn none_shows_nothing() {
        assert!(shown(&mut OutputFilter::new(OutputMode::None), run()).is_empty());
    }

    #[test]
    fn a_cancelled_attempt_shows_nothing_under_failed() {
        let events = vec![started("a", 1), output("a", Stream::Stdout, "x\n"), finished("a", 1, AttemptEnd::Cancelled)];
        assert!(shown(&mut OutputFilter::new(OutputMode::Failed), events).is_empty());
    }

    #[test]
    fn handlers_and_compensations_are_held_like_attempts() {
        let events = vec![
            Event::HandlerStarted { step: "a".into(), attempt: 1, error: "E".into(), pid: Some(2) },
            output("a", Stream::Stdout, "handling\n"),
            Event::HandlerFinished {
                step: "a".into(),
                attempt: 1,
                outcome: AttemptEnd::Failed,
                duration: Duration::ZERO,
                why: None,
                signal: None,
            },
            Event::AuxStarted { kind: crate::store::AuxKind::Compensate, name: "b".into(), pid: Some(3) },
            output("b", Stream::Stdout, "undoing\n"),
            Event::AuxFinished {
                kind: crate::store::AuxKind::Compensate,
                name: "b".into(),
                outcome: AttemptEnd::Succeeded,
                duration: Duration::ZERO,
                warning: None,
                signal: None,
            },
        ];
        assert_eq!(shown(&mut OutputFilter::new(OutputMode::Failed), events), ["a/stdout: handling\n"]);
    }

    #[test]
    fn held_output_past_the_bound_keeps_the_end_and_says_what_it_left_out() {
        let mut filter = OutputFilter::bounded(OutputMode::Failed, 10, 100);
        let events = vec![
            started("a", 2),
            output("a", Stream::Stdout, "one\ntwo\n"),
            output("a", Stream::Stdout, "three\n"),
            output("a", Stream::Stderr, "four\n"),
            finished("a", 2, AttemptEnd::Failed),
        ];
        assert_eq!(shown(&mut filter, events), ["a: attempt Some(2): 3 lines, 14 bytes not shown", "a/stderr: four\n"]);
        assert_eq!(filter.total, 0, "nothing is held once it ended");
    }

    #[test]
    fn the_bound_in_all_holds_across_attempts_running_at_once() {
        let mut filter = OutputFilter::bounded(OutputMode::Failed, 10, 12);
        let events = vec![
            started("a", 1),
            started("b", 1),
            output("a", Stream::Stdout, "aaaaaaaa\n"),
            // Only 3 bytes are left in all, and b holds nothing to give up: its line is not kept.
            output("b", Stream::Stdout, "bbbb\n"),
            output("b", Stream::Stdout, "bb\n"),
            finished("b", 1, AttemptEnd::Failed),
            finished("a", 1, AttemptEnd::Failed),
        ];
        assert_eq!(
            shown(&mut filter, events),
            ["b: attempt Some(1): 1 lines, 5 bytes not shown", "b/stdout: bb\n", "a/stdout: aaaaaaaa\n"]
        );
        assert_eq!(filter.total, 0);
    }
}
