//! The process's standard streams as reporters write them: each by a thread of its own, so that a
//! stream that stops reading never stalls the event loop nor the other stream, and a closed one
//! (`| head -1`) is the reader's choice, never an error.

use crate::events::Stream;
use crate::executor::{Chunk, OutputGate};
use std::fs::File;
use std::io::Write;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Bytes of child output that may wait for one terminal stream at once; beyond that its output is
/// dropped from the display (the logs keep all of it) until the stream catches up.
pub(crate) const BUDGET: usize = 8 * 1024 * 1024;
/// How long waymark waits at its end for a terminal stream that takes nothing more.
const STALL_LIMIT: Duration = Duration::from_secs(5);
/// Largest single write, so that progress of a slow reader is seen.
const PIECE: usize = 64 * 1024;

/// What a terminal writer is given, in order.
struct Item {
    text: Text,
    /// How many of the bytes are child output, counted against [`BUDGET`].
    child_bytes: usize,
}

/// Bytes to write as they are, or a child's lines to put behind its step's name first: the writer
/// thread does that, so that the event loop only hands the chunk on.
enum Text {
    Bytes(Vec<u8>),
    Behind { step: String, chunk: Arc<Chunk> },
}

impl Text {
    /// The bytes counted as queued: a chunk counts its own length, without the step's names that
    /// go in front of its lines.
    fn len(&self) -> usize {
        match self {
            Text::Bytes(bytes) => bytes.len(),
            Text::Behind { chunk, .. } => chunk.len(),
        }
    }
}

/// What a writer thread and the reporter share.
#[derive(Default)]
struct Shared {
    /// Child output queued and not written yet.
    queued: AtomicUsize,
    /// Everything queued and not written yet (child output and waymark's own text).
    backlog: AtomicUsize,
    /// Bytes written so far: a reader that takes anything makes progress.
    written: AtomicU64,
    /// The first write error other than a closed pipe (a full disk, say).
    error: Mutex<Option<std::io::Error>>,
}

/// One terminal file (stdout, stderr, or both when they are the same file), written by a thread
/// of its own.
pub(crate) struct Sink {
    name: &'static str,
    tx: Option<Sender<Item>>,
    /// Disconnected when the writer thread has written everything and ended.
    done: Receiver<()>,
    shared: Arc<Shared>,
    /// For a regular file: child output is never dropped; the readers wait at the gate instead.
    gate: Option<Arc<OutputGate>>,
}

impl Sink {
    fn start(name: &'static str, file: Option<impl Write + Send + 'static>, gate: Option<Arc<OutputGate>>) -> Sink {
        let (tx, rx) = channel::<Item>();
        let (done_tx, done) = channel::<()>();
        let shared = Arc::new(Shared::default());
        let state = Arc::clone(&shared);
        let opens = gate.clone();
        let write = move || {
            let _done = done_tx;
            let mut file = file;
            while let Ok(first) = rx.recv() {
                // What is queued already goes in the same write, up to a piece: 5,000 events
                // queued at once (the steps a resumed run skips) are a few writes, not 5,000.
                let (mut text, mut n, mut child_bytes) = (Vec::new(), 0, 0);
                let mut next = Some(first);
                while let Some(item) = next {
                    n += item.text.len();
                    child_bytes += item.child_bytes;
                    match item.text {
                        Text::Bytes(bytes) if text.is_empty() => text = bytes,
                        Text::Bytes(bytes) => text.extend_from_slice(&bytes),
                        Text::Behind { step, chunk } => text = behind_into(std::mem::take(&mut text), &step, &chunk),
                    }
                    next = if text.len() < PIECE { rx.try_recv().ok() } else { None };
                }
                if let Some(f) = &mut file
                    && let Err(e) = write_item(f, &text, &state.written)
                {
                    // A closed pipe (`| head`) is the reader's choice and ends the display
                    // quietly; any other error is said at the end. Neither stops the run.
                    if e.kind() != std::io::ErrorKind::BrokenPipe {
                        *state.error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                    }
                    file = None;
                }
                state.queued.fetch_sub(child_bytes, Ordering::Relaxed);
                state.backlog.fetch_sub(n, Ordering::Relaxed);
                if let Some(gate) = &opens {
                    gate.written(child_bytes);
                }
            }
        };
        let tx = crate::os::signals::spawn_thread(format!("waymark-{name}"), write).ok().map(|_| tx);
        Sink { name, tx, done, shared, gate }
    }

    /// Queue child output, or return false to drop it when the stream is too far behind. A
    /// regular file's sink drops nothing: the readers wait for it ([`Terminal::output_gate`]).
    pub(crate) fn output(&self, text: Vec<u8>) -> bool {
        self.output_text(Text::Bytes(text))
    }

    /// Queue a child's `chunk` to be shown behind `step`'s name ([`behind`]) by the writer
    /// thread, or return false to drop it as [`Sink::output`] does.
    pub(crate) fn output_behind(&self, step: &str, chunk: Arc<Chunk>) -> bool {
        self.output_text(Text::Behind { step: step.to_owned(), chunk })
    }

    fn output_text(&self, text: Text) -> bool {
        if self.tx.is_none() {
            return true;
        }
        let n = text.len();
        if self.gate.is_none() && self.shared.queued.load(Ordering::Relaxed) + n > BUDGET {
            return false;
        }
        self.send(text, n);
        true
    }

    /// Queue waymark's own text: always kept.
    pub(crate) fn line(&self, text: Vec<u8>) {
        self.queue(text, 0);
    }

    /// Queue `text`, of which `child_bytes` are child output that the caller has already checked
    /// against [`BUDGET`] with [`Sink::child_backlog`]; always kept.
    pub(crate) fn queue(&self, text: Vec<u8>, child_bytes: usize) {
        self.send(Text::Bytes(text), child_bytes);
    }

    fn send(&self, text: Text, child_bytes: usize) {
        let Some(tx) = &self.tx else { return };
        let n = text.len();
        self.shared.queued.fetch_add(child_bytes, Ordering::Relaxed);
        self.shared.backlog.fetch_add(n, Ordering::Relaxed);
        if let Some(gate) = &self.gate {
            gate.queued(child_bytes);
        }
        if tx.send(Item { text, child_bytes }).is_err() {
            self.shared.queued.fetch_sub(child_bytes, Ordering::Relaxed);
            self.shared.backlog.fetch_sub(n, Ordering::Relaxed);
            if let Some(gate) = &self.gate {
                gate.written(child_bytes);
            }
        }
    }

    /// Child output queued and not written yet.
    pub(crate) fn child_backlog(&self) -> usize {
        self.shared.queued.load(Ordering::Relaxed)
    }

    /// Everything queued and not written yet: how far behind the reader is.
    pub(crate) fn backlog(&self) -> usize {
        self.shared.backlog.load(Ordering::Relaxed)
    }

    /// Let the writer finish what is queued; true when it did, false when the stream took
    /// nothing for [`STALL_LIMIT`].
    fn close(&mut self) -> bool {
        if self.tx.take().is_none() {
            return true;
        }
        let mut seen = self.shared.written.load(Ordering::Relaxed);
        let mut since = Instant::now();
        loop {
            match self.done.recv_timeout(Duration::from_millis(50)) {
                Err(RecvTimeoutError::Timeout) => {}
                Ok(()) | Err(RecvTimeoutError::Disconnected) => return true,
            }
            let now = self.shared.written.load(Ordering::Relaxed);
            if now != seen {
                (seen, since) = (now, Instant::now());
            } else if since.elapsed() >= STALL_LIMIT {
                return false;
            }
        }
    }
}

/// Write `text` in pieces, counting progress.
fn write_item(f: &mut impl Write, text: &[u8], written: &AtomicU64) -> std::io::Result<()> {
    for piece in text.chunks(PIECE) {
        f.write_all(piece)?;
        written.fetch_add(piece.len() as u64, Ordering::Relaxed);
    }
    Ok(())
}

/// A handle of our own on a standard stream, so that writing it takes no lock that a blocked
/// writer could hold against the rest of waymark. `None` when the stream is closed.
fn own_handle(fd: std::os::fd::BorrowedFd<'_>) -> Option<File> {
    fd.try_clone_to_owned().ok().map(File::from)
}

/// Whether two handles are the same file (a terminal, or `2>&1`): one writer then keeps their
/// lines in order.
fn same_file(a: &File, b: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (a.metadata(), b.metadata()) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

/// Stdout and stderr, each with its writer (one for both when they are the same file).
pub(crate) struct Terminal {
    out: Sink,
    err: Option<Sink>,
    /// Where the readers wait for the streams that are regular files, if any is.
    gate: Option<Arc<OutputGate>>,
}

impl Terminal {
    /// Both streams drop child output they are too far behind to take.
    pub(crate) fn open() -> Terminal {
        Terminal::open_with(false)
    }

    /// A stream that is a regular file drops nothing: the readers wait for it at
    /// [`Terminal::output_gate`], which the reporter must hand to the runner. A terminal or a
    /// pipe drops what it is too far behind to take, as [`Terminal::open`]'s.
    pub(crate) fn open_holding() -> Terminal {
        Terminal::open_with(true)
    }

    fn open_with(holding: bool) -> Terminal {
        let out = own_handle(std::io::stdout().as_fd());
        let err = own_handle(std::io::stderr().as_fd());
        let shared = match (&out, &err) {
            (Some(o), Some(e)) => same_file(o, e),
            _ => false,
        };
        let is_file =
            |f: &Option<File>| holding && f.as_ref().and_then(|f| f.metadata().ok()).is_some_and(|m| m.is_file());
        let (out_holds, err_holds) = (is_file(&out), is_file(&err));
        let gate = (out_holds || err_holds).then(|| Arc::new(OutputGate::new(BUDGET / 2)));
        let gate_if = |holds: bool| if holds { gate.clone() } else { None };
        if shared {
            Terminal { out: Sink::start("stdout and stderr", out, gate_if(out_holds)), err: None, gate }
        } else {
            let out = Sink::start("stdout", out, gate_if(out_holds));
            let err = Some(Sink::start("stderr", err, gate_if(err_holds)));
            Terminal { out, err, gate }
        }
    }

    /// Where the readers of children's output wait while a stream that is a regular file is more
    /// than half of [`BUDGET`] behind ([`Terminal::open_holding`]); `None` when no stream holds.
    pub(crate) fn output_gate(&self) -> Option<Arc<OutputGate>> {
        self.gate.clone()
    }

    pub(crate) fn sink(&self, stream: Stream) -> &Sink {
        match (stream, &self.err) {
            (Stream::Stderr, Some(err)) => err,
            _ => &self.out,
        }
    }

    /// Whether stdout and stderr are the same file (a terminal, or `2>&1`), written by one writer.
    pub(crate) fn shared(&self) -> bool {
        self.err.is_none()
    }

    /// Queue waymark's own text for stderr, with what a child or a flow put in it (an error's
    /// message, a tail of output in the failure report) shown, never acted on by the terminal.
    pub(crate) fn say(&self, text: String) {
        self.sink(Stream::Stderr).line(crate::text::visible_owned(text).into_bytes());
    }

    /// Deliver what is queued before the process exits. A stream that takes nothing for
    /// [`STALL_LIMIT`] is given up on, and stderr says so when it can: `waymark: warning: NAME
    /// took nothing for 5s; STALLED`, or for a write error `waymark: warning: cannot write to
    /// NAME: ERROR; FAILED`.
    pub(crate) fn close(&mut self, stalled: &str, failed: &str) {
        let mut notes = Vec::new();
        // Whether stderr is a file of its own that took everything: only then is it told.
        let mut stderr_ok = self.err.is_some();
        // stderr first, so that its lines are out before a stalled stdout is waited for.
        let sinks = self.err.iter_mut().map(|s| (s, true)).chain(std::iter::once((&mut self.out, false)));
        for (sink, is_stderr) in sinks {
            let finished = sink.close();
            let error = sink.shared.error.lock().unwrap_or_else(|p| p.into_inner()).take();
            if is_stderr {
                stderr_ok = finished && error.is_none();
            }
            if !finished {
                let secs = STALL_LIMIT.as_secs();
                notes.push(format!("waymark: warning: {} took nothing for {secs}s; {stalled}\n", sink.name));
            }
            if let Some(e) = error {
                notes.push(format!("waymark: warning: cannot write to {}: {e}; {failed}\n", sink.name));
            }
        }
        // Written directly: the stderr writer is done.
        if !notes.is_empty()
            && stderr_ok
            && let Some(mut f) = own_handle(std::io::stderr().as_fd())
        {
            let _ = f.write_all(notes.concat().as_bytes());
        }
    }
}

/// Child output a terminal stream was too far behind to take, per step and stream, since it was
/// last said: the plain and live reporters keep one and say it as warnings.
#[derive(Default)]
pub(crate) struct Dropped(std::collections::BTreeMap<(String, &'static str), u64>);

impl Dropped {
    pub(crate) fn add(&mut self, step: &str, stream: Stream, bytes: usize) {
        *self.0.entry((step.to_owned(), stream.name())).or_default() += bytes as u64;
    }

    /// The warnings (newline-terminated) for what was not shown of `step` (of every step when
    /// `None`) in run `run`, forgotten once returned.
    pub(crate) fn take_warnings(&mut self, step: Option<&str>, run: &str) -> Vec<String> {
        let keys: Vec<(String, &'static str)> =
            self.0.keys().filter(|(s, _)| step.is_none_or(|name| name == s)).cloned().collect();
        keys.into_iter()
            .filter_map(|key| {
                let bytes = self.0.remove(&key)?;
                let (step, stream) = key;
                Some(format!(
                    "waymark: warning: {step}: {bytes} bytes of its {stream} not shown: {stream} was not being read \
                     fast enough; the log has all of it (`waymark logs {run} {step} --stream {stream}`)\n"
                ))
            })
            .collect()
    }
}

/// A child's `chunk` as the terminal shows it: each of its lines (the last one perhaps without its
/// newline) behind its step's name, `step | line`. The plain and the live display both show
/// output so.
pub(crate) fn behind(step: &str, chunk: &[u8]) -> Vec<u8> {
    behind_into(Vec::new(), step, chunk)
}

/// [`behind`], appended to `text` (a write of several chunks copies none of them twice).
fn behind_into(mut text: Vec<u8>, step: &str, chunk: &[u8]) -> Vec<u8> {
    let prefix = [step.as_bytes(), b" | "].concat();
    let sparse = |sample: &[u8]| count_newlines(sample) < 2;
    let (head, tail) = (&chunk[..chunk.len().min(SAMPLE)], &chunk[chunk.len().saturating_sub(SAMPLE)..]);
    if prefix.len() > PREFIX || sparse(head) && sparse(tail) {
        // A long step name, or long lines: one line at a time, each end found by `memchr`, which
        // passes over a long line many times faster than the word-wise search below.
        text.reserve(chunk.len() + 2 * prefix.len());
        let mut from = 0;
        let ends = memchr::memchr_iter(b'\n', chunk).map(|nl| nl + 1);
        let unended = !chunk.is_empty() && !chunk.ends_with(b"\n");
        for end in ends.chain(unended.then_some(chunk.len())) {
            text.extend_from_slice(&prefix);
            text.extend_from_slice(&chunk[from..end]);
            from = end;
        }
        return text;
    }
    let mut wide = [0; PREFIX];
    wide[..prefix.len()].copy_from_slice(&prefix);
    let newlines = count_newlines(chunk);
    // The last line may have no newline.
    let lines = newlines + usize::from(!chunk.is_empty() && !chunk.ends_with(b"\n"));
    // Room for every line behind its prefix, and the slack of the last fixed-size copy.
    let (start, room) = (text.len(), chunk.len() + lines * prefix.len() + PREFIX);
    match start {
        0 => text = vec![0; room],
        _ => text.resize(start + room, 0),
    }
    let mut out = Behind { chunk, wide, prefix_len: prefix.len(), text, at: start, from: 0 };
    // Eight bytes at a time, a mask of their newlines read bit by bit: as fast as `memchr`
    // through long lines, and many times faster through short ones, where `memchr` is a call
    // per line.
    const WORD: usize = 8;
    let mut blocks = chunk.chunks_exact(WORD);
    let mut base = 0;
    for block in &mut blocks {
        let mut mask = newline_bits(u64::from_le_bytes(block.try_into().expect("chunks_exact gives whole words")));
        while mask != 0 {
            out.line(base + mask.trailing_zeros() as usize / 8 + 1);
            mask &= mask - 1;
        }
        base += WORD;
    }
    for (i, b) in blocks.remainder().iter().enumerate() {
        if *b == b'\n' {
            out.line(base + i + 1);
        }
    }
    if lines > newlines {
        out.line(chunk.len());
    }
    out.text.truncate(out.at);
    out.text
}

/// The longest prefix (`step | `) that [`Behind`] copies at a fixed width; a longer one is copied
/// line by line at its own length.
const PREFIX: usize = 32;
/// Lines this short are copied at a fixed width of this many bytes.
const SHORT: usize = 16;
/// How many bytes at each end of a chunk tell short lines from long ones: with fewer than two
/// newlines in either, its lines are found by `memchr`.
const SAMPLE: usize = 256;

/// A chunk's lines copied behind a prefix of at most [`PREFIX`] bytes, one line at a time.
///
/// The prefix and short lines (`yes`) cost one copy of a fixed size each: a copy of a size known
/// when compiling is a few stores, where one of a length known only at run time is a call. What
/// such a copy writes past its own bytes is overwritten by the next one, and the last one's
/// lands in the slack cut off at the end.
struct Behind<'a> {
    chunk: &'a [u8],
    /// The prefix, padded to PREFIX bytes, and its own length.
    wide: [u8; PREFIX],
    prefix_len: usize,
    text: Vec<u8>,
    /// Where the next line goes in `text`, and where it starts in `chunk`.
    at: usize,
    from: usize,
}

impl Behind<'_> {
    /// Copy the next line, which ends just before `end`.
    #[inline(always)]
    fn line(&mut self, end: usize) {
        let (at, from) = (self.at, self.from);
        self.text[at..at + PREFIX].copy_from_slice(&self.wide);
        let at = at + self.prefix_len;
        let n = end - from;
        if n <= SHORT && from + SHORT <= self.chunk.len() {
            self.text[at..at + SHORT].copy_from_slice(&self.chunk[from..from + SHORT]);
        } else {
            self.text[at..at + n].copy_from_slice(&self.chunk[from..end]);
        }
        (self.at, self.from) = (at + n, end);
    }
}

/// How many newlines `chunk` has, counted eight bytes at a time.
fn count_newlines(chunk: &[u8]) -> usize {
    let words = chunk.chunks_exact(8);
    let rest = words.remainder().iter().filter(|b| **b == b'\n').count();
    words
        .map(|w| newline_bits(u64::from_le_bytes(w.try_into().expect("whole words"))).count_ones() as usize)
        .sum::<usize>()
        + rest
}

/// The high bit of each byte of `word` that is a newline, and no other bit.
fn newline_bits(word: u64) -> u64 {
    const ONES: u64 = u64::from_le_bytes([1; 8]);
    const LOW7: u64 = u64::from_le_bytes([0x7f; 8]);
    // Zero where a newline was; adding LOW7 to the low seven bits carries into the high bit of
    // every byte but the zero ones, and no carry crosses into the next byte.
    let x = word ^ (ONES * u64::from(b'\n'));
    !(((x & LOW7) + LOW7) | x | LOW7)
}

/// Deliver what is queued for `terminal` and say, for run `run`, what could not be shown.
pub(crate) fn close_for_run(terminal: &mut Terminal, run: &str) {
    terminal.close(
        &format!(
            "the rest of the steps' output was not shown there (the logs have all of it: `waymark logs {run} STEP`)"
        ),
        &format!("what was to be shown there is in the logs (`waymark logs {run} STEP`)"),
    );
}

#[cfg(test)]
mod tests {
    use super::{BUDGET, Sink, behind, behind_into};
    use crate::executor::{Chunk, OutputGate};
    use std::sync::mpsc::{Receiver, channel};
    use std::sync::{Arc, Mutex};

    /// A stream that takes nothing until it is told to, then everything.
    struct Held {
        go: Receiver<()>,
        open: bool,
        took: Arc<Mutex<Vec<u8>>>,
    }

    impl std::io::Write for Held {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if !self.open {
                let _ = self.go.recv();
                self.open = true;
            }
            self.took.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A sink writing a stream that takes nothing for now, with `gate` (a regular file's) or
    /// without (a terminal's or a pipe's); the sender that lets it take, and what it took.
    fn held_sink(gate: Option<Arc<OutputGate>>) -> (Sink, std::sync::mpsc::Sender<()>, Arc<Mutex<Vec<u8>>>) {
        let (go_tx, go) = channel();
        let took = Arc::new(Mutex::new(Vec::new()));
        let sink = Sink::start("stdout", Some(Held { go, open: false, took: Arc::clone(&took) }), gate);
        (sink, go_tx, took)
    }

    /// Three times [`BUDGET`] of child output in 64 KiB chunks of one line each, behind `s`.
    fn flood(sink: &Sink) -> (usize, Vec<u8>) {
        let (mut taken, mut shown) = (0, Vec::new());
        for i in 0..3 * BUDGET / 65536 {
            let mut line = vec![b'a' + (i % 26) as u8; 65535];
            line.push(b'\n');
            shown.extend_from_slice(&behind("s", &line));
            taken += usize::from(sink.output_behind("s", Arc::new(Chunk::new(line))));
        }
        (taken, shown)
    }

    #[test]
    fn a_stream_that_falls_behind_drops_child_output_but_a_regular_file_holds_the_readers_instead() {
        // A terminal or a pipe: past the budget, chunks are dropped.
        let (mut sink, go, took) = held_sink(None);
        let (taken, _) = flood(&sink);
        assert_eq!(taken, BUDGET / 65536, "only the budget's worth is queued");
        go.send(()).unwrap();
        assert!(sink.close());
        assert_eq!(took.lock().unwrap().len(), BUDGET / 65536 * (65536 + 4));

        // A regular file: nothing is dropped, and the readers' gate is shut until it catches up.
        let gate = Arc::new(OutputGate::new(BUDGET / 2));
        let (mut sink, go, took) = held_sink(Some(Arc::clone(&gate)));
        let (taken, shown) = flood(&sink);
        assert_eq!(taken, 3 * BUDGET / 65536, "every chunk is queued");
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        rt.block_on(async {
            let waiting = tokio::spawn({
                let gate = Arc::clone(&gate);
                async move { gate.wait().await }
            });
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
            assert!(!waiting.is_finished(), "the readers wait while the file is behind");
            go.send(()).unwrap();
            tokio::time::timeout(std::time::Duration::from_secs(60), waiting)
                .await
                .expect("the readers go on once the file has caught up")
                .unwrap();
        });
        assert!(sink.close());
        assert!(*took.lock().unwrap() == shown, "the file has every line, in order");
    }

    #[test]
    fn every_line_of_a_chunk_is_shown_behind_its_step_the_last_one_even_without_its_newline() {
        assert_eq!(behind("fetch", b"a\nbb\nc"), b"fetch | a\nfetch | bb\nfetch | c");
        assert_eq!(behind("s", b"\n\ny\n"), b"s | \ns | \ns | y\n");
        assert_eq!(behind("s", b"no newline"), b"s | no newline");
        assert_eq!(behind("s", b""), b"");
    }

    /// Line by line, as `behind` was first written: what its copies of a fixed width must equal.
    fn plainly(step: &str, chunk: &[u8]) -> Vec<u8> {
        let mut text = Vec::new();
        for line in chunk.split_inclusive(|b| *b == b'\n') {
            text.extend_from_slice(step.as_bytes());
            text.extend_from_slice(b" | ");
            text.extend_from_slice(line);
        }
        text
    }

    #[test]
    fn lines_of_every_length_around_the_copy_width_come_out_as_written() {
        let mut rng = fastrand::Rng::with_seed(11);
        // Steps whose prefix fits the fixed-width copy, fills it exactly, and does not.
        for step in ["s", "a_name_of_29_characters_xxxxx", "a_name_of_30_characters_xxxxxx"] {
            for _ in 0..500 {
                let mut chunk = Vec::new();
                for _ in 0..rng.usize(0..12) {
                    let len = match rng.u8(0..4) {
                        0 => rng.usize(0..4),
                        1 => rng.usize(12..20),
                        2 => rng.usize(0..70),
                        // Long lines, found one by one by memchr, short ones after them or not.
                        _ => rng.usize(120..600),
                    };
                    chunk.extend((0..len).map(|_| rng.alphanumeric() as u8));
                    chunk.push(b'\n');
                }
                if rng.bool() {
                    chunk.truncate(rng.usize(0..=chunk.len()));
                }
                assert_eq!(
                    behind(step, &chunk),
                    plainly(step, &chunk),
                    "{step}: {:?}",
                    String::from_utf8_lossy(&chunk)
                );
                // Behind what a write already holds (the writer puts what is queued in one):
                // the same lines after it, it unchanged.
                let held = rng.usize(1..40);
                let before: Vec<u8> = (0..held).map(|_| rng.alphanumeric() as u8).collect();
                let appended = behind_into(before.clone(), step, &chunk);
                assert_eq!(appended, [before, plainly(step, &chunk)].concat(), "{step}");
            }
        }
    }
}
