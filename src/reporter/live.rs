//! The live display (`--progress live`, or `auto` when stderr is a terminal): one line per running
//! step with a spinner, its attempt, how long it has run and how long it has before its timeout;
//! a step waiting to retry counts down to its next attempt; a `done/total` bar at the bottom.
//! Child output and waymark's own lines scroll above the bars, and the run ends as the plain
//! display ends: the bars are cleared, then the failure report or the run's last line.
//!
//! indicatif keeps the bars and draws them, but never into the terminal itself: it draws into a
//! [`Screen`], which hands whole frames to the stderr writer thread of [`Terminal`], at most
//! [`FRAMES_PER_SECOND`] of them and only while that writer keeps up. So a terminal that stops
//! reading never stalls the run, and the display costs the run nothing it would notice. The screen
//! erases the bars it last sent itself before each frame, so a frame that was never sent cannot
//! leave the display torn.

use super::local_time::LocalTime;
use super::output_filter::{OutputFilter, OutputMode, Pass};
use super::plain::{describe, ending};
use super::report::History;
use super::terminal::{BUDGET, Dropped, Terminal, close_for_run};
use crate::events::{AttemptEnd, Envelope, Event, Reporter, Stream};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle, TermLike};
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

/// Frames sent to the terminal at most, per second.
const FRAMES_PER_SECOND: u8 = 20;
/// How often a spinner turns and a clock moves.
const TICK: Duration = Duration::from_millis(100);
/// Columns of the `done/total` bar when the terminal has room for them.
const BAR_COLUMNS: usize = 30;

/// What the lines of the display are drawn to fit: the terminal's columns (read after each
/// frame), the width of the widest name shown so far, and how many steps under way have no line.
/// No line is wider than the terminal: one that wrapped would take two rows, and indicatif, which
/// stops at the last row, would leave the `done/total` bar out.
#[derive(Debug)]
struct Layout {
    columns: AtomicUsize,
    name_width: AtomicUsize,
    hidden: AtomicUsize,
}

impl Layout {
    /// The names' column: as wide as the longest name shown, but at most two fifths of the
    /// terminal (and no less than 12 columns), so that one long name leaves every line room to
    /// say what its step does; a longer name is cut to it.
    fn name_column(&self) -> usize {
        let cap = (self.columns.load(Ordering::Relaxed) * 2 / 5).max(12);
        self.name_width.load(Ordering::Relaxed).min(cap)
    }

    /// `text` cut to the columns left after `used` of them, ending `…` when it was cut.
    fn fit<'a>(&self, text: &'a str, used: usize) -> std::borrow::Cow<'a, str> {
        match self.columns.load(Ordering::Relaxed).saturating_sub(used) {
            0 => std::borrow::Cow::Borrowed(""),
            room => console::truncate_str(text, room, "…"),
        }
    }
}

/// Columns the display's text leaves free at the right of the terminal. indicatif pads each line
/// to the terminal's width, so that it wraps to the next; the last line's padding is taken off
/// ([`TermLike::flush`]). A last line that ended in the last column would leave the cursor
/// waiting to wrap, and the `^C` the terminal echoes for a Ctrl-C would then start a row below
/// the bars, where the next frame's erase (which counts the rows it drew) does not reach: one line
/// of bars would stay on the screen. With two columns free the echo stays on the bars' last row,
/// and is erased with it.
const ECHO_ROOM: u16 = 2;

/// The columns the display's text takes on a terminal `columns` wide.
fn drawn_columns(columns: u16) -> u16 {
    columns.saturating_sub(ECHO_ROOM).max(1)
}

/// A frame waits while this much is queued for the terminal and not written yet.
const FRAME_BACKLOG: usize = 64 * 1024;

pub(crate) struct LiveReporter {
    screen: Screen,
    multi: MultiProgress,
    /// The `done/total` bar, at the bottom.
    overall: ProgressBar,
    /// One bar per step (or compensation, or hook) running or waiting.
    bars: HashMap<String, StepBar>,
    /// The steps whose bars are not on the display, oldest first: more run than the terminal has
    /// rows for beside the overall bar. Each is shown once a shown one goes.
    hidden: Vec<String>,
    /// Steps finished or skipped: the overall bar's position.
    done: HashSet<String>,
    /// The terminal's width, the names' column and the steps without a line.
    layout: Arc<Layout>,
    /// Which child output is shown (`--output`).
    filter: OutputFilter,
    /// The local time, for the retry lines' wake-up times.
    clock: LocalTime,
    run_id: std::sync::Arc<str>,
    /// Child output not shown, per step and stream, since it was last reported.
    dropped: Dropped,
    /// The attempts, for the failure report.
    history: History,
    /// The overall bar is on the display.
    started: bool,
    /// The run ended: the bars are gone for good.
    ended: bool,
}

struct StepBar {
    bar: ProgressBar,
    /// On the display (added to the `MultiProgress`), not kept back for want of rows.
    shown: bool,
    /// The error class of the last failed attempt, for the retry countdown.
    error: Option<String>,
    max_attempts: u32,
}

impl LiveReporter {
    pub(crate) fn new(output: OutputMode) -> LiveReporter {
        let size = terminal_size();
        let layout = Arc::new(Layout {
            columns: AtomicUsize::new(usize::from(drawn_columns(size.1))),
            name_width: AtomicUsize::new(0),
            hidden: AtomicUsize::new(0),
        });
        let screen = Screen::new(Terminal::open(), size, Arc::clone(&layout));
        let target = ProgressDrawTarget::term_like_with_hz(Box::new(screen.clone()), FRAMES_PER_SECOND);
        let multi = MultiProgress::with_draw_target(target);
        let overall = ProgressBar::hidden();
        overall.set_style(overall_style(Arc::clone(&layout)));
        LiveReporter {
            screen,
            multi,
            overall,
            bars: HashMap::new(),
            hidden: Vec::new(),
            done: HashSet::new(),
            layout,
            filter: OutputFilter::new(output),
            clock: LocalTime::system(),
            run_id: std::sync::Arc::default(),
            dropped: Dropped::default(),
            history: History::default(),
            started: false,
            ended: false,
        }
    }

    /// Start the bars for a run of `total` steps.
    fn start(&mut self, total: usize) {
        if self.ended {
            return;
        }
        self.overall.set_length(total as u64);
        self.show_overall();
    }

    fn show_overall(&mut self) {
        if !self.started {
            self.started = true;
            self.overall = self.multi.add(self.overall.clone());
            self.overall.enable_steady_tick(TICK);
        }
    }

    /// The bar of `name`, added above the overall bar if it has none.
    fn bar(&mut self, name: &str) -> Option<&mut StepBar> {
        if self.ended {
            return None;
        }
        if !self.bars.contains_key(name) {
            self.show_overall();
            self.layout.name_width.fetch_max(console::measure_text_width(name), Ordering::Relaxed);
            // Beside the overall bar, as many as the display's rows hold; the others wait, so that
            // the overall bar at the bottom is always drawn.
            let room = usize::from(self.screen.height()).saturating_sub(1).max(1);
            let shown = self.bars.len() - self.hidden.len() < room;
            // Its own style from the start: a bar drawn before its first look would be
            // indicatif's default (an empty bar, `0/0`).
            let blank = Look::Doing(String::new()).style(name, &self.layout);
            let bar = ProgressBar::hidden().with_style(blank);
            let bar = match shown {
                true => self.multi.insert_before(&self.overall, bar),
                false => {
                    self.hidden.push(name.to_owned());
                    bar
                }
            };
            bar.enable_steady_tick(TICK);
            self.bars.insert(name.to_owned(), StepBar { bar, shown, error: None, max_attempts: 1 });
            self.say_hidden();
        }
        self.bars.get_mut(name)
    }

    fn remove(&mut self, name: &str) {
        let Some(step) = self.bars.remove(name) else { return };
        step.bar.finish_and_clear();
        if !step.shown {
            self.hidden.retain(|h| h != name);
        } else {
            self.multi.remove(&step.bar);
            // The oldest kept back takes its row.
            if !self.hidden.is_empty() {
                let next = self.hidden.remove(0);
                if let Some(next) = self.bars.get_mut(&next) {
                    next.bar = self.multi.insert_before(&self.overall, next.bar.clone());
                    next.shown = true;
                }
            }
        }
        self.say_hidden();
    }

    /// Say on the overall bar how many steps under way (running, or waiting for a retry) have no
    /// line for want of rows.
    fn say_hidden(&self) {
        self.layout.hidden.store(self.hidden.len(), Ordering::Relaxed);
    }

    fn finished(&mut self, step: &str) {
        self.remove(step);
        if self.done.insert(step.to_owned()) {
            self.overall.set_position(self.done.len() as u64);
        }
    }

    /// Clear the bars for good: the run's last lines come after them.
    fn end(&mut self) {
        if self.ended {
            return;
        }
        self.ended = true;
        for (_, step) in self.bars.drain() {
            step.bar.finish_and_clear();
        }
        self.hidden.clear();
        self.overall.finish_and_clear();
        let _ = self.multi.clear();
        self.screen.lock().clear();
    }

    /// Show what the output filter lets through now.
    fn pass(&mut self, passed: Vec<Pass>) {
        for pass in passed {
            match pass {
                Pass::Chunk { step, stream, chunk } => self.show(&step, stream, &chunk),
                omitted @ Pass::Omitted { .. } => {
                    if let Some(text) = omitted.omitted_line(&self.run_id) {
                        self.say(text);
                    }
                }
            }
        }
    }

    fn show(&mut self, step: &str, stream: Stream, chunk: &[u8]) {
        if !self.screen.lock().output(stream, super::terminal::behind(step, chunk)) {
            self.dropped.add(step, stream, chunk.len());
        }
    }

    /// Waymark's own text, shown as [`Terminal::say`](super::terminal::Terminal::say) shows it.
    fn say(&self, text: String) {
        self.screen.lock().say(crate::text::visible_owned(text).into_bytes());
    }

    /// Say how much output of `step` (of every step when `None`) was not shown.
    fn report_drops(&mut self, step: Option<&str>) {
        for text in self.dropped.take_warnings(step, &self.run_id) {
            self.say(text);
        }
    }

    /// Keep the bars in step with `event`.
    fn draw(&mut self, envelope: &Envelope) {
        match &envelope.event {
            Event::RunStarted { steps_total, .. } | Event::RunResumed { steps_total, .. } => self.start(*steps_total),
            Event::AttemptStarted { step, attempt, max_attempts, timeout, .. } => {
                let look = Look::Running { attempt: *attempt, max_attempts: *max_attempts, timeout: *timeout };
                let layout = Arc::clone(&self.layout);
                if let Some(bar) = self.bar(step) {
                    bar.max_attempts = *max_attempts;
                    bar.bar.set_style(look.style(step, &layout));
                    bar.bar.reset_elapsed();
                }
            }
            // Cancelled (by fail_fast, or a signal): the step does not go on in this run.
            Event::AttemptFinished { step, outcome: AttemptEnd::Cancelled, .. } => self.remove(step),
            Event::AttemptFinished { step, error, .. } => {
                if let Some(bar) = self.bars.get_mut(step) {
                    bar.error = error.as_ref().map(|e| e.class.clone());
                }
            }
            Event::StepWaiting { step, next_attempt, max_attempts, retry } => {
                let layout = Arc::clone(&self.layout);
                if let Some(bar) = self.bar(step) {
                    let look = Look::Waiting {
                        attempt: *next_attempt,
                        max_attempts: *max_attempts,
                        wake_at: retry.wake_at,
                        after: bar.error.clone(),
                    };
                    bar.bar.set_style(look.style(step, &layout));
                }
            }
            Event::HandlerStarted { step, error, .. } => {
                let layout = Arc::clone(&self.layout);
                if let Some(bar) = self.bar(step) {
                    bar.bar.set_style(Look::Doing(format!("catch handler for {error}")).style(step, &layout));
                    bar.bar.reset_elapsed();
                }
            }
            Event::AuxStarted { kind, name, .. } => {
                let what = match kind {
                    crate::store::AuxKind::Compensate => "compensating",
                    crate::store::AuxKind::Hook => "hook",
                };
                let layout = Arc::clone(&self.layout);
                if let Some(bar) = self.bar(name) {
                    bar.bar.set_style(Look::Doing(what.to_owned()).style(name, &layout));
                    bar.bar.reset_elapsed();
                }
            }
            Event::AuxFinished { name, .. } => self.remove(name),
            Event::StepFinished { step, .. } | Event::StepSkipped { step, .. } => self.finished(step),
            Event::RunFinished { .. } => self.end(),
            _ => {}
        }
    }
}

impl Drop for LiveReporter {
    fn drop(&mut self) {
        self.end();
        let Some(mut terminal) = self.screen.lock().terminal.take() else { return };
        close_for_run(&mut terminal, &self.run_id);
    }
}

impl Reporter for LiveReporter {
    fn earlier(&mut self, earlier: &crate::events::Earlier) {
        self.history.prefill(earlier);
    }

    fn flow(&mut self, path: &std::path::Path, fail_fast: bool) {
        self.history.set_flow(path, fail_fast);
    }

    fn shows_output(&self) -> bool {
        self.filter.shows_any()
    }

    fn report(&mut self, envelope: &Envelope) {
        if let Some(run_id) = &envelope.run_id {
            self.run_id.clone_from(run_id);
        }
        self.history.record(envelope);
        // A failed attempt's held output comes before the line that says it failed.
        let passed = self.filter.pass(envelope);
        self.pass(passed);
        if let Event::Output { .. } = &envelope.event {
            return;
        }
        self.draw(envelope);
        match &envelope.event {
            // The bars show the attempt.
            Event::AttemptStarted { .. } => return,
            Event::AttemptFinished { step, outcome: AttemptEnd::Succeeded | AttemptEnd::Failed, .. } => {
                self.report_drops(Some(step));
            }
            Event::RunFinished { outcome, failures, .. } => {
                self.report_drops(None);
                for text in ending(&self.history, &self.run_id, envelope, *outcome, failures) {
                    self.say(text);
                }
                return;
            }
            _ => {}
        }
        if let Some(text) = describe(envelope, &self.clock, &self.history) {
            self.say(text);
        }
    }
}

/// What a step's line shows.
#[derive(Clone)]
enum Look {
    /// `⠙ fetch  attempt 1/3  2.1s  timeout in 27.9s`
    Running { attempt: u32, max_attempts: u32, timeout: Option<Duration> },
    /// `  fetch  retry 2/3 in 4.2s after ConnectionResetError`
    Waiting { attempt: u32, max_attempts: u32, wake_at: SystemTime, after: Option<String> },
    /// `⠙ fetch  catch handler for TimeoutError  1.2s`
    Doing(String),
}

impl Look {
    /// The style of `name`'s line: its name in the names' column, then what it does, cut to the
    /// terminal's width.
    fn style(self, name: &str, layout: &Arc<Layout>) -> ProgressStyle {
        let (template, spin) = match self {
            Look::Waiting { .. } => ("  {line}", false),
            _ => ("{spinner} {line}", true),
        };
        let (name, layout) = (name.to_owned(), Arc::clone(layout));
        let line = move |state: &ProgressState, w: &mut dyn std::fmt::Write| {
            let elapsed = state.elapsed();
            let width = layout.name_column();
            let name = cut_name(&name, width);
            // `measure_text_width` counts columns, as `{:<width$}` does not.
            let pad = width.saturating_sub(console::measure_text_width(&name));
            let mut text = format!("{name}{:pad$}  ", "");
            let _ = match &self {
                Look::Running { attempt, max_attempts, timeout } => {
                    let left = timeout.map(|t| format!("  timeout in {}", short(t.saturating_sub(elapsed))));
                    write!(text, "attempt {attempt}/{max_attempts}  {}{}", short(elapsed), left.unwrap_or_default())
                }
                Look::Waiting { attempt, max_attempts, wake_at, after } => {
                    let left = wake_at.duration_since(SystemTime::now()).unwrap_or_default();
                    let after =
                        after.as_ref().map(|e| format!(" after {}", crate::text::visible(e))).unwrap_or_default();
                    write!(text, "retry {attempt}/{max_attempts} in {}{after}", short(left))
                }
                Look::Doing(what) => write!(text, "{}  {}", crate::text::visible(what), short(elapsed)),
            };
            let _ = w.write_str(&layout.fit(&text, 2));
        };
        let style = ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_spinner());
        let style = style.with_key("line", line);
        if spin { style.tick_chars("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏ ") } else { style }
    }
}

/// The `done/total` bar: `[====>     ] 3/20 done  4.2s  (+10 more under way)`, its bar narrower
/// (or left out) where the terminal has no room for 30 columns of it.
fn overall_style(layout: Arc<Layout>) -> ProgressStyle {
    let overall = move |state: &ProgressState, w: &mut dyn std::fmt::Write| {
        let (done, total) = (state.pos(), state.len().unwrap_or(0));
        let (more, fewer) = match layout.hidden.load(Ordering::Relaxed) {
            0 => (String::new(), String::new()),
            n => (format!("  (+{n} more under way)"), format!("  +{n} more")),
        };
        let text = format!("{done}/{total} done  {}{more}", short(state.elapsed()));
        let columns = layout.columns.load(Ordering::Relaxed);
        let wide = console::measure_text_width(&text);
        // The bar goes first, then the clock and words: the count of steps without a line stays.
        let _ = match columns.saturating_sub(wide + 3).min(BAR_COLUMNS) {
            width @ 5.. => w.write_str(&format!("[{}] {text}", bar(width, done, total))),
            _ if wide <= columns => w.write_str(&text),
            _ => w.write_str(&layout.fit(&format!("{done}/{total} done{fewer}"), 0)),
        };
    };
    ProgressStyle::with_template("{overall}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .with_key("overall", overall)
}

/// A bar `columns` wide that shows `done` of `total` as indicatif draws `=> `: `====>     `, with
/// no `>` when nothing or everything is done.
fn bar(columns: usize, done: u64, total: u64) -> String {
    if done == 0 || total == 0 {
        return " ".repeat(columns);
    }
    let filled = usize::try_from(done.min(total) * columns as u64 / total).unwrap_or(columns);
    match columns - filled {
        0 => "=".repeat(columns),
        left => format!("{}>{}", "=".repeat(filled), " ".repeat(left - 1)),
    }
}

/// A duration on a line of the display: `4.2s`, `3m05s`, `2h07m`.
fn short(d: Duration) -> String {
    let secs = d.as_secs();
    match secs {
        0..60 => format!("{:.1}s", d.as_secs_f64()),
        60..3600 => format!("{}m{:02}s", secs / 60, secs % 60),
        _ => format!("{}h{:02}m", secs / 3600, secs % 3600 / 60),
    }
}

/// What the terminal shows below the lines that scrolled: the bars. indicatif draws into it; it
/// writes to the terminal through the writer threads of [`Terminal`].
#[derive(Clone)]
struct Screen(Arc<Mutex<ScreenState>>);

impl std::fmt::Debug for Screen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Screen")
    }
}

struct ScreenState {
    /// Taken at the end, to deliver what is queued.
    terminal: Option<Terminal>,
    /// The terminal's rows and columns, read after each frame.
    size: (u16, u16),
    /// Where the lines learn the columns.
    layout: Arc<Layout>,
    /// The frame indicatif is drawing, and whether it has begun writing its lines (what comes
    /// before is its erasing of the previous frame, which the screen does itself).
    frame: Vec<u8>,
    in_frame: bool,
    /// The latest frame: the bars as they are now, and how many lines of the terminal they take.
    bars: Vec<u8>,
    bars_lines: usize,
    /// How many lines of bars the terminal shows, and whether they are [`ScreenState::bars`].
    shown_lines: usize,
    shown_current: bool,
    /// Lines to print above the bars, not sent yet, and how many of their bytes are child output.
    text: Vec<u8>,
    text_child: usize,
    last_sent: Option<Instant>,
}

impl Screen {
    fn new(terminal: Terminal, size: (u16, u16), layout: Arc<Layout>) -> Screen {
        Screen(Arc::new(Mutex::new(ScreenState {
            terminal: Some(terminal),
            size,
            layout,
            frame: Vec::new(),
            in_frame: false,
            bars: Vec::new(),
            bars_lines: 0,
            shown_lines: 0,
            shown_current: true,
            text: Vec::new(),
            text_child: 0,
            last_sent: None,
        })))
    }

    fn lock(&self) -> MutexGuard<'_, ScreenState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn terminal_size() -> (u16, u16) {
    let (rows, cols) = console::Term::stderr().size();
    (rows.max(1), cols.max(1))
}

impl ScreenState {
    /// Child output for `stream`: printed above the bars with the next frame when it goes to
    /// the terminal they are on, else queued for its own file. False when it was dropped because
    /// the terminal is too far behind.
    fn output(&mut self, stream: Stream, text: Vec<u8>) -> bool {
        let Some(terminal) = &self.terminal else { return true };
        if stream == Stream::Stdout && !terminal.shared() {
            return terminal.sink(stream).output(text);
        }
        let sink = terminal.sink(Stream::Stderr);
        if sink.child_backlog() + self.text_child + text.len() > BUDGET {
            return false;
        }
        self.text_child += text.len();
        self.push_text(text);
        true
    }

    /// Waymark's own text: printed above the bars at once, always.
    fn say(&mut self, text: Vec<u8>) {
        self.push_text(text);
        self.send(true);
    }

    fn push_text(&mut self, text: Vec<u8>) {
        self.text.extend_from_slice(&text);
        if self.text.last().is_some_and(|b| *b != b'\n') {
            self.text.push(b'\n');
        }
    }

    /// Take the bars off the terminal for good (what is left to print is printed).
    fn clear(&mut self) {
        self.bars.clear();
        self.bars_lines = 0;
        self.shown_current = false;
        self.send(true);
    }

    /// Send the text waiting and the latest bars, in place of the bars shown; unless `now`, only
    /// when there is something new, the last frame is not too recent and the terminal keeps up.
    fn send(&mut self, now: bool) {
        let Some(terminal) = &self.terminal else { return };
        let sink = terminal.sink(Stream::Stderr);
        if !now
            && ((self.text.is_empty() && self.shown_current)
                || sink.backlog() > FRAME_BACKLOG
                || self.last_sent.is_some_and(|t| t.elapsed() < Duration::from_secs(1) / u32::from(FRAMES_PER_SECOND)))
        {
            return;
        }
        if self.text.is_empty() && self.shown_current {
            return;
        }
        let mut out = Vec::with_capacity(self.text.len() + self.bars.len() + 16 + 8 * self.shown_lines);
        erase_lines(&mut out, self.shown_lines);
        out.append(&mut self.text);
        out.extend_from_slice(&self.bars);
        sink.queue(out, std::mem::take(&mut self.text_child));
        self.shown_lines = self.bars_lines;
        self.shown_current = true;
        self.last_sent = Some(Instant::now());
    }
}

/// Erase the `lines` rows of bars the cursor ends (from the end of their last row), leaving it at
/// the start of their first. Row by row (erase in line), not by erasing the screen below: tmux
/// takes an erase from the top left corner (bars at the top of an empty screen) for a clearing of
/// the screen and keeps what it shows in the scrollback.
fn erase_lines(out: &mut Vec<u8>, lines: usize) {
    if lines == 0 {
        return;
    }
    out.push(b'\r');
    let up = |out: &mut Vec<u8>| {
        if lines > 1 {
            let _ = write!(Bytes(out), "\x1b[{}A", lines - 1);
        }
    };
    up(out);
    for row in 0..lines {
        out.extend_from_slice(b"\x1b[2K");
        if row + 1 < lines {
            out.extend_from_slice(b"\x1b[B");
        }
    }
    up(out);
}

/// `name` in at most `width` columns: a longer one keeps its start and its end, around `…`, where
/// the names of steps alike differ (`fetch-t…stream-3`).
fn cut_name(name: &str, width: usize) -> std::borrow::Cow<'_, str> {
    let chars = name.chars().count();
    if chars <= width || width < 3 {
        return console::truncate_str(name, width, "…");
    }
    let head = (width - 1) / 2;
    let tail = width - 1 - head;
    let start: String = name.chars().take(head).collect();
    let end: String = name.chars().skip(chars - tail).collect();
    std::borrow::Cow::Owned(format!("{start}…{end}"))
}

/// `write!` into bytes.
struct Bytes<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for Bytes<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// Lines of a terminal `width` columns wide that `text` takes (indicatif pads each line to the
/// width, so that the cursor ends on the last one).
fn lines_of(text: &[u8], width: usize) -> usize {
    let text = String::from_utf8_lossy(text);
    let mut lines = 0;
    let mut parts = text.split('\n').peekable();
    while let Some(part) = parts.next() {
        let w = console::measure_text_width(part);
        let last = parts.peek().is_none();
        lines += if last { w.div_ceil(width) } else { w.div_ceil(width).max(1) };
    }
    lines
}

impl TermLike for Screen {
    fn width(&self) -> u16 {
        self.lock().size.1
    }

    /// One row less than the terminal has: indicatif draws no more lines than this, and a frame
    /// that filled every row would leave a copy of itself in the scrollback at each redraw below
    /// new lines.
    fn height(&self) -> u16 {
        self.lock().size.0.saturating_sub(1).max(1)
    }

    // indicatif erases its previous frame before it writes the lines of the next: the screen
    // erases what it sent itself, so moves and clears before the first line are left out.
    fn move_cursor_up(&self, n: usize) -> std::io::Result<()> {
        self.lock().escape(n, 'A');
        Ok(())
    }

    fn move_cursor_down(&self, n: usize) -> std::io::Result<()> {
        self.lock().escape(n, 'B');
        Ok(())
    }

    fn move_cursor_right(&self, n: usize) -> std::io::Result<()> {
        self.lock().escape(n, 'C');
        Ok(())
    }

    fn move_cursor_left(&self, n: usize) -> std::io::Result<()> {
        self.lock().escape(n, 'D');
        Ok(())
    }

    fn write_line(&self, s: &str) -> std::io::Result<()> {
        let mut state = self.lock();
        state.in_frame = true;
        state.frame.extend_from_slice(s.as_bytes());
        state.frame.push(b'\n');
        Ok(())
    }

    fn write_str(&self, s: &str) -> std::io::Result<()> {
        let mut state = self.lock();
        state.in_frame = true;
        state.frame.extend_from_slice(s.as_bytes());
        Ok(())
    }

    fn clear_line(&self) -> std::io::Result<()> {
        let mut state = self.lock();
        if state.in_frame {
            state.frame.extend_from_slice(b"\r\x1b[2K");
        }
        Ok(())
    }

    /// A frame is complete.
    fn flush(&self) -> std::io::Result<()> {
        let mut state = self.lock();
        if state.terminal.is_none() {
            return Ok(());
        }
        state.in_frame = false;
        state.bars = std::mem::take(&mut state.frame);
        // The last line's padding: the cursor stays after its text (see `ECHO_ROOM`).
        let text = state.bars.iter().rposition(|b| *b != b' ').map_or(0, |i| i + 1);
        state.bars.truncate(text);
        state.bars_lines = lines_of(&state.bars, usize::from(state.size.1));
        state.shown_current = false;
        state.size = terminal_size();
        state.layout.columns.store(usize::from(drawn_columns(state.size.1)), Ordering::Relaxed);
        state.send(false);
        Ok(())
    }
}

impl ScreenState {
    fn escape(&mut self, n: usize, code: char) {
        if self.in_frame && n > 0 {
            let _ = write!(Bytes(&mut self.frame), "\x1b[{n}{code}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_on_a_line_are_short() {
        assert_eq!(short(Duration::from_millis(4_230)), "4.2s");
        assert_eq!(short(Duration::ZERO), "0.0s");
        assert_eq!(short(Duration::from_secs(185)), "3m05s");
        assert_eq!(short(Duration::from_secs(2 * 3600 + 7 * 60 + 5)), "2h07m");
    }

    #[test]
    fn the_done_bar_is_drawn_as_indicatif_draws_it_at_any_width() {
        assert_eq!(bar(10, 0, 20), "          ");
        assert_eq!(bar(10, 1, 20), ">         ");
        assert_eq!(bar(10, 9, 20), "====>     ");
        assert_eq!(bar(10, 20, 20), "==========");
        assert_eq!(bar(5, 3, 0), "     ");
    }

    #[test]
    fn a_long_name_is_cut_to_two_fifths_of_the_terminal_and_leaves_the_others_their_room() {
        let layout =
            Layout { columns: AtomicUsize::new(80), name_width: AtomicUsize::new(50), hidden: AtomicUsize::new(0) };
        assert_eq!(layout.name_column(), 32);
        layout.name_width.store(9, Ordering::Relaxed);
        assert_eq!(layout.name_column(), 9, "short names keep their own width");
        layout.columns.store(20, Ordering::Relaxed);
        layout.name_width.store(50, Ordering::Relaxed);
        assert_eq!(layout.name_column(), 12, "at least 12 columns");
        assert_eq!(cut_name("fetch-the-orders-from-upstream-3", 16), "fetch-t…stream-3");
        assert_eq!(cut_name("fetch", 16), "fetch");
        assert_eq!(cut_name("fetch-orders", 12), "fetch-orders");
    }

    #[test]
    fn a_line_is_cut_to_the_terminal_s_width() {
        let layout =
            Layout { columns: AtomicUsize::new(12), name_width: AtomicUsize::new(0), hidden: AtomicUsize::new(0) };
        assert_eq!(layout.fit("fetch  attempt 1/3", 2), "fetch  at…");
        assert_eq!(layout.fit("fetch", 2), "fetch");
        assert_eq!(layout.fit("fetch  attempt 1/3", 20), "");
    }

    #[test]
    fn the_bars_are_erased_row_by_row_leaving_the_cursor_at_their_start() {
        let erased = |lines| {
            let mut out = Vec::new();
            erase_lines(&mut out, lines);
            String::from_utf8(out).unwrap()
        };
        assert_eq!(erased(0), "");
        assert_eq!(erased(1), "\r\x1b[2K");
        assert_eq!(erased(3), "\r\x1b[2A\x1b[2K\x1b[B\x1b[2K\x1b[B\x1b[2K\x1b[2A");
    }

    #[test]
    fn padded_lines_are_counted_as_the_terminal_wraps_them() {
        assert_eq!(lines_of(b"", 10), 0);
        assert_eq!(lines_of(b"abcdefghij", 10), 1);
        assert_eq!(lines_of(b"abcdefghijabcdefghij", 10), 2);
        assert_eq!(lines_of(b"\x1b[1mabc\x1b[0m       ", 10), 1, "escapes take no room");
        assert_eq!(lines_of(b"abc\n", 10), 1);
    }
}
