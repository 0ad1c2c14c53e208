//! The supervisor of one spawned attempt: copies its output, secrets hidden, to the log files and
//! to the dispatcher, enforces the timeout (whose clock started when the attempt was issued), obeys
//! cancellation, and leaves the attempt's whole process group dead, including processes that left
//! the group, found by the attempt id in their environment.

use super::output::{Chunk, OutputGate, StderrTail};
use super::{Msg, StepRef};
use crate::events::Stream;
use crate::flow::Signal;
use crate::os::process::{self as unix, ExitKind};
use crate::secrets::{Secrets, StreamRedactor};
use std::ffi::OsString;
use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// Read size for child output: large reads keep the copy close to the cost of a direct write.
const CHUNK: usize = 64 * 1024;
/// The read buffer of a stream until a read fills it.
const FIRST_CHUNK: usize = 4 * 1024;

/// How long the output readers may take to reach end-of-file once the attempt's process group is
/// dead, before waymark looks for processes of the attempt that left the group.
const DRAIN: Duration = Duration::from_millis(500);
/// How long to wait for the output after those processes were killed, before giving up on it.
const LAST_DRAIN: Duration = Duration::from_secs(5);

/// What the dispatcher may ask of a running attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Control {
    Run,
    /// Forward this signal to the group, SIGKILL after the grace period.
    Cancel(Signal),
    /// SIGKILL the group now.
    Kill,
    /// The workflow's deadline passed: stop the group as a timeout does.
    Expire,
}

/// How an attempt that started came to an end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    Exited(ExitKind),
    TimedOut,
    /// Stopped because the workflow's deadline passed.
    Expired,
    Cancelled,
}

/// What the supervisor reports when an attempt is over.
#[derive(Debug)]
pub(crate) struct Finished {
    pub(crate) end: End,
    /// The attempt's end (its output is drained after): when its leader exited, or, stopped with a
    /// grace, when the last of its group did (or the grace ran out).
    pub(crate) exited: Instant,
    /// Stopping it took SIGKILL after the grace period (it outlived the first signal).
    pub(crate) killed_after_grace: bool,
    /// For the user.
    pub(crate) notes: Vec<String>,
    /// The end of its stderr as it passed through (`None` when its reader did not finish: the
    /// log file is read instead).
    pub(crate) stderr_tail: Option<StderrTail>,
    /// Its first process, exited and not reaped yet: its pid, its group's number, stays taken
    /// until the dispatcher lets go of the attempt (it may still kill the group by that number
    /// until it has handled the end; see `os::spawn::Child`).
    pub(crate) leader: crate::os::spawn::Child,
}

/// A spawned attempt under supervision.
pub(crate) struct Supervisor {
    child: crate::os::spawn::Child,
    pid: u32,
    attempt_id: String,
    /// What it is, as its notes name it: `this attempt`, `hook on_exit`, `compensation of step `a``
    /// (borrowed for an attempt: nothing is allocated for it).
    what: std::borrow::Cow<'static, str>,
    /// Each output reader sends one message here when it has reached end-of-file: the stderr
    /// reader with the end of what it read.
    readers_done: mpsc::Receiver<Option<StderrTail>>,
    /// The end of the attempt's stderr, once its reader reached end-of-file.
    stderr_tail: Option<StderrTail>,
    /// Readers that have not reached end-of-file yet.
    readers_left: usize,
    /// Set when waymark stops waiting for the readers: they then send nothing more.
    abandoned: Arc<AtomicBool>,
    /// Whether one of the runner's signals had come before it started ([`runner_signalled`]).
    ///
    /// [`runner_signalled`]: crate::os::signals::runner_signalled
    signalled_before: bool,
    /// The gate the readers wait at, if any ([`OutputGate`]), and how many of them wait there now.
    gate: Option<Arc<OutputGate>>,
    gated: Arc<AtomicUsize>,
}

/// One output stream of a child: the pipe it writes and the log it is copied to.
pub(crate) struct Output {
    pub(crate) pipe: std::io::PipeReader,
    pub(crate) log: Log,
    pub(crate) log_path: PathBuf,
    /// Whether its lines go to the runner as well (a reporter shows them), or only to the log.
    pub(crate) lines: bool,
    /// Where its reader waits before it sends more lines ([`OutputGate`]).
    pub(crate) gate: Option<Arc<OutputGate>>,
}

/// A stream's log file: open (an earlier execution of the attempt left one), or created when the
/// first byte comes, so that a stream that stays empty leaves no file.
pub(crate) enum Log {
    Open(File),
    /// Not created yet: `name` in the directory `dir`, held open for it (no path is resolved
    /// again, and the directory the attempt was started in is the one written to).
    Deferred {
        dir: Arc<OwnedFd>,
        name: OsString,
    },
}

impl Log {
    /// The open log, created first if it was deferred; `path` is its full path.
    fn file(&mut self, path: &Path) -> std::io::Result<&mut File> {
        if let Log::Deferred { dir, name } = self {
            let file = crate::os::fs::create_append_private_at(&**dir, name, path)?;
            *self = Log::Open(file);
        }
        match self {
            Log::Open(file) => Ok(file),
            Log::Deferred { .. } => Err(std::io::Error::other("log not created")),
        }
    }
}

impl Supervisor {
    /// Whether one of the runner's signals had come before the child was spawned, as the caller
    /// saw it just before the spawn (by default, when [`Supervisor::watch`] was called): a child
    /// that ends once one has, and had started before it, ended of it.
    pub(crate) fn signalled_before(mut self, before: bool) -> Supervisor {
        self.signalled_before = before;
        self
    }

    /// Start copying the child's output (a reader task per stream on the runner's event loop,
    /// tagged with the attempt's step and row, hiding `secrets`) and take charge of it, with
    /// its `WAYMARK_ATTEMPT_ID` and what its notes call it (`this attempt`, `hook on_exit`).
    pub(crate) fn watch(
        child: crate::os::spawn::Child,
        (attempt_id, what): (String, std::borrow::Cow<'static, str>),
        step: usize,
        row: i64,
        [stdout, stderr]: [Output; 2],
        secrets: Arc<Secrets>,
        events: &mpsc::Sender<Msg>,
    ) -> Supervisor {
        let pid = child.id();
        let abandoned = Arc::new(AtomicBool::new(false));
        let gated = Arc::new(AtomicUsize::new(0));
        let gate = stdout.gate.clone();
        let (done, readers_done) = mpsc::channel(2);
        let mut readers_left = 0;
        for (out, stream) in [(stdout, Stream::Stdout), (stderr, Stream::Stderr)] {
            let pipe = match unix::async_pipe(out.pipe) {
                Ok(pipe) => pipe,
                Err(error) => {
                    // Without a reader the child would block on a full pipe (dropping the pipe's
                    // end instead makes its writes fail): report it as a log failure.
                    let _ = events.try_send(Msg::LogFailed { row, path: out.log_path, error });
                    continue;
                }
            };
            let reader = Reader {
                pipe,
                log: out.log,
                log_path: out.log_path,
                lines: out.lines,
                gate: out.gate,
                gated: Arc::clone(&gated),
                stream,
                tail: (stream == Stream::Stderr).then(StderrTail::default),
                step,
                row,
                secrets: Arc::clone(&secrets),
                events: events.clone(),
                abandoned: Arc::clone(&abandoned),
            };
            let done = done.clone();
            readers_left += 1;
            tokio::spawn(async move {
                let tail = reader.copy().await;
                let _ = done.send(tail).await;
            });
        }
        Supervisor {
            child,
            pid,
            attempt_id,
            what,
            readers_done,
            stderr_tail: None,
            readers_left,
            abandoned,
            signalled_before: crate::os::signals::runner_signalled(),
            gate,
            gated,
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }
}

/// Copies one of a child's streams to its log file (created on the first byte) and, in whole lines, to the dispatcher, with
/// every secret replaced by `***` before either sees it (a secret split between two reads too).
/// It runs as a task on the runner's event loop, woken when the pipe has data: no thread per
/// stream. A reader whose pipe a process outside waymark's reach holds open is left behind (it
/// keeps the log and sends nothing more) rather than waited for.
struct Reader {
    pipe: tokio::net::unix::pipe::Receiver,
    log: Log,
    log_path: PathBuf,
    /// Whether whole lines are sent to the runner; when no reporter shows them, only the log
    /// (and the stderr tail) takes what passes.
    lines: bool,
    /// Waited at before lines are sent, while a display that drops nothing is behind.
    gate: Option<Arc<OutputGate>>,
    /// How many of the attempt's readers wait at the gate now.
    gated: Arc<AtomicUsize>,
    stream: Stream,
    /// The end of what passed, kept for the stderr stream.
    tail: Option<StderrTail>,
    step: usize,
    row: i64,
    secrets: Arc<Secrets>,
    events: mpsc::Sender<Msg>,
    abandoned: Arc<AtomicBool>,
}

impl Reader {
    async fn send(&self, mut bytes: Vec<u8>) {
        if self.abandoned.load(Ordering::Relaxed) {
            return;
        }
        // A chunk queued for a display that is behind holds at most twice its bytes, so that
        // the bound on what is queued bounds memory too (a piece of a long line, or the end of
        // a stream, may be left in a larger buffer).
        if bytes.capacity() > 2 * bytes.len() {
            bytes.shrink_to_fit();
        }
        if let Some(gate) = &self.gate {
            self.gated.fetch_add(1, Ordering::SeqCst);
            gate.wait().await;
            self.gated.fetch_sub(1, Ordering::SeqCst);
        }
        // The dispatcher takes output as fast as it comes (the reporter drops what a terminal or a
        // pipe cannot take; a regular file holds the readers at the gate above), so this waits at
        // most for the loop's current step. While it waits nothing is read: past the channel's
        // bound the child blocks on its pipe.
        let chunk = Arc::new(Chunk::new(bytes));
        let _ = self.events.send(Msg::Output { step: self.step, row: self.row, stream: self.stream, chunk }).await;
        if self.gate.is_some() {
            // Let the dispatcher hand the chunk to the display before more is read, so that the
            // gate counts it: otherwise up to the channel's 256 chunks could pass the gate at once.
            tokio::task::yield_now().await;
        }
    }

    /// Copy until end-of-file; returns the end of what passed, for the stderr stream.
    async fn copy(mut self) -> Option<StderrTail> {
        // Without secrets to hide, a read lands in the line buffer itself, after the start of a
        // line not yet ended, and whole lines go to the runner in the buffer they were read into:
        // echoing 200 MiB copied every byte once more (7% of the run's samples, perf). With
        // secrets, a read goes to a buffer of its own and what the redactor lets pass is appended.
        let mut out = Copied { partial: Vec::new(), room: FIRST_CHUNK, logging: true, cut: false };
        let secrets = Arc::clone(&self.secrets);
        let mut redactor = (!secrets.is_empty()).then(|| (StreamRedactor::new(&secrets), Vec::new()));
        loop {
            let read = match &mut redactor {
                None => &mut out.partial,
                Some((_, buf)) => {
                    buf.clear();
                    buf
                }
            };
            // Room for the read, uninitialised: a stream that stays small costs no zeroed 64 KiB
            // (a quarter of a failing attempt's instructions once, callgrind). A read takes at
            // most `room`, however much more the buffer has.
            read.reserve(out.room);
            let n = match self.pipe.try_read_buf(&mut bytes::BufMut::limit(read, out.room)) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => match self.pipe.readable().await {
                    Ok(()) => continue,
                    Err(_) => break,
                },
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            if n >= out.room {
                out.room = CHUNK;
            }
            let start = match &mut redactor {
                None => out.partial.len() - n,
                Some((redactor, buf)) => {
                    let start = out.partial.len();
                    out.partial.extend_from_slice(&redactor.feed(buf));
                    start
                }
            };
            self.pass(&mut out, start, redactor.is_none()).await;
        }
        // The bytes held back in case they began a secret.
        if let Some((mut redactor, _)) = redactor {
            let start = out.partial.len();
            out.partial.extend_from_slice(&redactor.finish());
            self.pass(&mut out, start, false).await;
        }
        if !out.partial.is_empty() {
            out.partial.push(b'\n');
            self.send(out.partial).await;
        }
        self.tail.take()
    }

    /// Write the bytes that just came, `out.partial[start..]` (redacted), to the log, and send the
    /// whole lines they complete; `reads_here` when the next read lands in `out.partial`.
    async fn pass(&mut self, out: &mut Copied, start: usize, reads_here: bool) {
        let data = &out.partial[start..];
        if data.is_empty() {
            return;
        }
        if out.logging
            && let Err(error) = self.log.file(&self.log_path).and_then(|log| log.write_all(data))
        {
            // Output that cannot be kept is waymark's own failure: the loop stops the run.
            out.logging = false;
            let msg = Msg::LogFailed { row: self.row, path: self.log_path.clone(), error };
            let _ = self.events.send(msg).await;
        }
        if let Some(tail) = &mut self.tail {
            tail.push(&out.partial[start..]);
        }
        if !self.lines {
            out.partial.clear();
            return;
        }
        // A line cut into a piece just before its newline ends with that piece: its newline is
        // no line of its own.
        if std::mem::take(&mut out.cut) && start == 0 && out.partial[0] == b'\n' {
            out.partial.remove(0);
        }
        // Only the new bytes are searched, so a long line costs linear time.
        if let Some(last_nl) = memchr::memrchr(b'\n', &out.partial[start..]) {
            let end = start + last_nl + 1;
            let whole = if 2 * end >= out.partial.capacity() {
                // The buffer is mostly whole lines: it goes as it is, and the start of the next
                // line moves to a new one, with room for the next read when it lands there.
                let room = if reads_here { out.room } else { 0 };
                let mut rest = Vec::with_capacity(room + out.partial.len() - end);
                rest.extend_from_slice(&out.partial[end..]);
                out.partial.truncate(end);
                std::mem::replace(&mut out.partial, rest)
            } else {
                // A few short lines in a large buffer: they are copied out (the buffer stays for
                // the next read; `send` would shrink it).
                let whole = out.partial[..end].to_vec();
                out.partial.drain(..end);
                whole
            };
            self.send(whole).await;
        }
        // A line with no end in sight is shown in pieces rather than held in memory.
        if out.partial.len() >= CHUNK {
            out.partial.push(b'\n');
            self.send(std::mem::take(&mut out.partial)).await;
            out.cut = true;
        }
    }
}

/// What a reader carries from one read to the next.
struct Copied {
    /// The start of a line not yet ended; without secrets, the next read lands after it.
    partial: Vec<u8>,
    /// How much room a read gets: [`FIRST_CHUNK`] until a read fills it, then [`CHUNK`].
    room: usize,
    /// Whether the log still takes writes.
    logging: bool,
    /// The last line sent was a piece of a longer one, ended by waymark ([`CHUNK`]).
    cut: bool,
}

impl Supervisor {
    /// Wait, up to `limit`, until every reader has reached end-of-file; true when they did.
    /// Readers never wait for a terminal or a pipe, so only a process holding the output open, or
    /// a regular file taking a burst, can make this take long. A reader held at the
    /// [`OutputGate`] by such a file is not held by a process: while one is, and the file has
    /// taken something since the last look, the wait starts again.
    async fn drain(&mut self, limit: Duration) -> bool {
        let mut deadline = Instant::now() + limit;
        let progress = |s: &Self| s.gate.as_ref().map(|g| g.progress());
        let mut seen = progress(self);
        while self.readers_left > 0 {
            // `recv` is cancel-safe: a timed-out wait loses no end-of-file message.
            match tokio::time::timeout_at(deadline, self.readers_done.recv()).await {
                Ok(Some(tail)) => {
                    self.readers_left -= 1;
                    if tail.is_some() {
                        self.stderr_tail = tail;
                    }
                }
                Ok(None) => return true, // no reader left to wait for
                Err(_) => {
                    let now = progress(self);
                    if self.gated.load(Ordering::SeqCst) == 0 || now == seen {
                        return false;
                    }
                    (seen, deadline) = (now, Instant::now() + limit);
                }
            }
        }
        true
    }

    /// Wait for the attempt to end, enforcing `deadline` and obeying `control`. Always leaves the
    /// process group dead; returns how the attempt ended and notes for the user.
    pub(crate) async fn supervise(
        mut self,
        step: StepRef,
        deadline: Option<Instant>,
        mut control: watch::Receiver<Control>,
    ) -> Finished {
        let pgid = self.pid;
        let mut stopping: Option<End> = None;
        let mut kill_at: Option<Instant> = None;
        // The attempt's processes outside its group that were sent the stop's signal.
        let mut escaped: Vec<(u32, Option<u64>)> = Vec::new();
        let mut killed_after_grace = false;
        let far = || Instant::now() + Duration::from_secs(86_400 * 365);
        let status = loop {
            tokio::select! {
                status = self.child.wait() => break status,
                _ = crate::os::timer::sleep_until(deadline.unwrap_or_else(far)), if deadline.is_some() && stopping.is_none() => {
                    stopping = Some(End::TimedOut);
                    kill_at = stop_group(pgid, step.kill_signal, step.kill_grace);
                    escaped = stop_escaped(&self.attempt_id, pgid, step.kill_signal, kill_at);
                }
                _ = crate::os::timer::sleep_until(kill_at.unwrap_or_else(far)), if kill_at.is_some() => {
                    unix::kill_group(pgid);
                    kill_at = None;
                    killed_after_grace = true;
                }
                changed = control.changed() => {
                    if changed.is_err() {
                        // The dispatcher is gone; do not leave the child behind.
                        unix::kill_group(pgid);
                        continue;
                    }
                    match *control.borrow_and_update() {
                        Control::Run => {}
                        Control::Cancel(sig) => {
                            // A child that already exited before the signal came ended on its own.
                            if let Ok(Some(status)) = self.child.try_wait() {
                                break Ok(status);
                            }
                            if stopping.is_none() {
                                stopping = Some(End::Cancelled);
                                kill_at = stop_group(pgid, sig, step.kill_grace);
                                escaped = stop_escaped(&self.attempt_id, pgid, sig, kill_at);
                            }
                        }
                        Control::Expire => {
                            if let Ok(Some(status)) = self.child.try_wait() {
                                break Ok(status);
                            }
                            if stopping.is_none() {
                                stopping = Some(End::Expired);
                                kill_at = stop_group(pgid, step.kill_signal, step.kill_grace);
                                escaped = stop_escaped(&self.attempt_id, pgid, step.kill_signal, kill_at);
                            }
                        }
                        Control::Kill => {
                            stopping.get_or_insert(End::Cancelled);
                            unix::kill_group(pgid);
                            kill_at = None;
                        }
                    }
                }
            }
        };
        let mut exited = Instant::now();
        // Ended once one of the runner's signals had come, before the runner passed it on
        // (`systemctl stop`, `pkill` signal the steps with their runner: one may exit 0 from its
        // TERM handler, or be killed by the signal, first): it
        // ended of the signal, whatever its exit status says, and is cancelled as the runner's
        // cancel would have. Not one that started after the signal, nor one that ended before.
        if stopping.is_none() && !self.signalled_before && crate::os::signals::runner_signalled() {
            stopping = Some(End::Cancelled);
        }
        // Stopped (a timeout, a cancel, the deadline) and its leader gone within its grace (a
        // wrapper script dies on SIGTERM at once, its worker cleans up): the rest of the group
        // has the rest of the grace, as the whole group does, unless a second signal kills it.
        if let Some(at) = kill_at {
            killed_after_grace = rest_of_the_grace(pgid, &mut escaped, at, &mut control).await;
            // The attempt ends with the last of its group (README), at the grace's end at the latest.
            exited = Instant::now();
        }
        // The leader is gone; whatever else is left in its group goes with it. The leader is not
        // reaped yet, so the group's id is still this attempt's (see `Child`).
        unix::kill_group(pgid);
        let mut notes = Vec::new();
        let (attempt_id, what) = (self.attempt_id.clone(), std::mem::take(&mut self.what));
        let escaped = |notes: &mut Vec<String>, killed: usize| {
            if killed > 0 {
                notes.push(format!("killed {killed} process(es) of {what} that had left its process group"));
            }
        };
        // After a timeout or a cancel nothing of the attempt may survive, not even a daemon that
        // left the group and closed its output: look for its processes by the attempt id.
        if stopping.is_some() {
            escaped(&mut notes, unix::kill_marked(&attempt_id, pgid));
        }
        if !self.drain(DRAIN).await {
            // Something outside the group holds the output open: a process of this attempt that
            // called setsid(), found by the attempt id in its environment. Only those holding the
            // output: a daemon that closed it may stay, as after any normal exit.
            if stopping.is_none() {
                escaped(&mut notes, unix::kill_marked_holding_output(&attempt_id, pgid));
            }
            if !self.drain(LAST_DRAIN).await {
                self.abandoned.store(true, Ordering::Relaxed);
                self.stderr_tail = None;
                notes.push(format!(
                    "a process outside waymark's reach still holds {what}'s output open; the rest of it is not shown"
                ));
            }
        }
        let end = match (stopping, status) {
            (Some(end), _) => end,
            (None, Ok(status)) => End::Exited(unix::exit_kind(status)),
            (None, Err(e)) => {
                notes.push(format!("cannot wait for the child: {e}"));
                End::Exited(ExitKind::Code(-1))
            }
        };
        let stderr_tail = if self.readers_left == 0 { self.stderr_tail.take() } else { None };
        Finished { end, exited, killed_after_grace, notes, stderr_tail, leader: self.child }
    }
}

/// Wait until group `pgid`, whose leader is gone, is empty, or until `kill_at`, or a kill from
/// `control`: whether the grace ran out with processes left in the group. The group is looked at
/// every 10 ms (no event says that the last of a group's processes, none of them waymark's child,
/// has ended).
async fn rest_of_the_grace(
    pgid: u32,
    escaped: &mut Vec<(u32, Option<u64>)>,
    kill_at: Instant,
    control: &mut watch::Receiver<Control>,
) -> bool {
    let mut group = unix::GroupWatch::new(pgid);
    loop {
        if !group.alive() && !unix::alive_of(escaped) {
            return false;
        }
        let now = Instant::now();
        if now >= kill_at {
            return true;
        }
        tokio::select! {
            _ = crate::os::timer::sleep_until(kill_at.min(now + Duration::from_millis(10))) => {}
            changed = control.changed() => {
                if changed.is_err() || matches!(*control.borrow_and_update(), Control::Kill) {
                    return false;
                }
            }
        }
    }
}

/// Send `sig` to the group and return when to escalate to SIGKILL (grace 0: SIGKILL at once).
/// The processes of attempt `attempt_id` that left its group `pgid`, sent `sig` with the group when
/// it is stopped with a grace (`kill_at`): they have the grace too, and are SIGKILLed with the
/// rest of the attempt after it. Without a grace the end's SIGKILL is all they get, as the group.
fn stop_escaped(attempt_id: &str, pgid: u32, sig: Signal, kill_at: Option<Instant>) -> Vec<(u32, Option<u64>)> {
    match kill_at {
        Some(_) => unix::signal_escaped(attempt_id, pgid, sig.0),
        None => Vec::new(),
    }
}

fn stop_group(pgid: u32, sig: Signal, grace: Duration) -> Option<Instant> {
    if grace.is_zero() || sig.0 == nix::sys::signal::Signal::SIGKILL {
        unix::kill_group(pgid);
        None
    } else {
        unix::signal_group(pgid, sig.0);
        Some(Instant::now() + grace)
    }
}

#[cfg(test)]
mod tests {
    use super::{CHUNK, Control, FIRST_CHUNK, Log, Output, OutputGate, Reader, Supervisor};
    use crate::events::Stream;
    use crate::executor::{Msg, StepRef};
    use crate::secrets::Secrets;
    use std::io::Write;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;
    use tokio::sync::{mpsc, watch};

    /// What a reader of a pipe sent, chunk by chunk, and what its log holds, when `secrets` (of the
    /// length of their mask) are hidden and each write is read before the next one is written.
    async fn read_writes(secrets: &[&str], writes: &[&[u8]]) -> (Vec<Vec<u8>>, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let (r, mut w) = std::io::pipe().unwrap();
        // Room for every write: a blocking write would hold the test's only thread.
        nix::fcntl::fcntl(&w, nix::fcntl::FcntlArg::F_SETPIPE_SZ(1024 * 1024)).unwrap();
        let (tx, mut rx) = mpsc::channel(256);
        let log_path = dir.path().join("log");
        let reader = Reader {
            pipe: crate::os::process::async_pipe(r).unwrap(),
            log: Log::Open(std::fs::File::create(&log_path).unwrap()),
            log_path: log_path.clone(),
            lines: true,
            gate: None,
            gated: Arc::default(),
            stream: Stream::Stdout,
            tail: None,
            step: 0,
            row: 1,
            secrets: Arc::new(Secrets::new(secrets)),
            events: tx,
            abandoned: Arc::default(),
        };
        let copying = tokio::spawn(reader.copy());
        let mut chunks: Vec<Vec<u8>> = Vec::new();
        let mut next = async || match tokio::time::timeout(Duration::from_secs(60), rx.recv()).await {
            Ok(Some(Msg::Output { chunk, .. })) => {
                assert!(
                    chunk.capacity() <= 2 * chunk.len(),
                    "{} bytes in a buffer of {}",
                    chunk.len(),
                    chunk.capacity()
                );
                Some(chunk.to_vec())
            }
            Ok(Some(_)) => panic!("only output is sent"),
            Ok(None) => None,
            Err(_) => panic!("no chunk in 60 s"),
        };
        let mut written = 0;
        for write in writes {
            w.write_all(write).unwrap();
            written += write.len();
            while write.ends_with(b"\n") && chunks.iter().map(Vec::len).sum::<usize>() < written {
                chunks.push(next().await.expect("a chunk for the lines written"));
            }
            // The test's runtime has one thread: while this task sleeps, the reader reads all of
            // it (a write that sends nothing, such as the start of a secret, too).
            tokio::time::sleep(Duration::from_millis(1)).await;
            if secrets.is_empty() {
                let logged = std::fs::metadata(&log_path).unwrap().len() as usize;
                assert_eq!(logged, written, "each write is read before the next one");
            }
        }
        drop(w);
        while let Some(chunk) = next().await {
            chunks.push(chunk);
        }
        copying.await.unwrap();
        (chunks, std::fs::read(log_path).unwrap())
    }

    /// `bytes` in runs of the same byte, `y\n` for one and `x*3` for more: a failure stays legible.
    fn runs(bytes: &[u8]) -> String {
        let mut out = String::new();
        for run in bytes.chunk_by(|a, b| a == b) {
            out += &String::from_utf8_lossy(&run[..1]);
            if run.len() > 1 {
                out += &format!("*{} ", run.len());
            }
        }
        out
    }

    /// Whole lines reach the runner as they were written, in chunks that hold at most twice their
    /// bytes in memory however large the read buffer grew: a read that fills the buffer, short
    /// reads after it, a secret split between two reads.
    #[tokio::test]
    async fn lines_are_sent_whole_in_buffers_no_larger_than_twice_their_bytes() {
        let fill = b"y\n".repeat(2048);
        let writes: [&[u8]; 5] = [&fill, b"a\n", b"bc", b"d\ne\n", b"f\n"];
        for secrets in [&[][..], &["bcd"][..]] {
            let (chunks, log) = read_writes(secrets, &writes).await;
            let mut expected = writes.concat();
            if !secrets.is_empty() {
                expected = String::from_utf8(expected).unwrap().replace("bcd", "***").into_bytes();
            }
            let fill = String::from_utf8(fill.clone()).unwrap();
            let shown = |b: &[u8]| String::from_utf8_lossy(b).replace(&fill, "<fill>");
            assert_eq!(shown(&log), shown(&expected), "the log has every byte, secrets hidden");
            assert_eq!(shown(&chunks.concat()), shown(&expected), "every line reached the runner");
            assert!(
                chunks.iter().all(|c| c.ends_with(b"\n")),
                "whole lines only: {:?}",
                chunks.iter().map(|c| runs(c)).collect::<Vec<_>>()
            );
        }
    }

    /// A line longer than a read is sent in pieces of what the reads brought (the first read of a
    /// stream is small; the next ones take up to 64 KiB), each ended by waymark, and a newline that
    /// comes right after a piece ends that piece rather than making an empty line.
    #[tokio::test]
    async fn a_long_line_is_sent_in_pieces_of_what_the_reads_brought() {
        let x = |n| vec![b'x'; n];
        let line = |n| [x(n), b"\n".to_vec()].concat();
        let long = [x(3 * CHUNK), b"\nend".to_vec()].concat();
        let all = |chunks: &[Vec<u8>]| chunks.iter().map(|c| runs(c)).collect::<Vec<_>>();
        let (chunks, log) = read_writes(&[], &[b"start\n", &long]).await;
        assert_eq!(runs(&log), runs(&[&b"start\n"[..], &long].concat()));
        let first = FIRST_CHUNK + CHUNK;
        let last = 3 * CHUNK - first - CHUNK;
        let expected = [b"start\n".to_vec(), line(first), line(CHUNK), line(last), b"end\n".to_vec()];
        assert_eq!(all(&chunks), all(&expected));
        let ended_at_a_piece = [x(first), b"\nend\n".to_vec()].concat();
        let (chunks, _) = read_writes(&[], &[&ended_at_a_piece]).await;
        assert_eq!(all(&chunks), all(&[line(first), b"end\n".to_vec()]));
        // Short reads after a long one leave the buffer larger than a read: a read still takes
        // at most 64 KiB.
        let (fill, b) = ([vec![b'z'; FIRST_CHUNK - 1], b"\n".to_vec()].concat(), vec![b'b'; 100]);
        let (chunks, _) = read_writes(&[], &[&fill, &[&b"a\n"[..], &b].concat(), &line(2 * CHUNK)]).await;
        assert_eq!(all(&chunks), all(&[fill, b"a\n".to_vec(), [b, line(CHUNK)].concat(), line(CHUNK)]));
    }

    /// A child writes 1 MiB into a pipe that takes it all and exits at once, while the display (a
    /// file taking 12 KiB every 100 ms, 8.5 s for it all) holds its reader at the gate: waymark
    /// waits for all of it, longer than the 5.5 s it gives a reader held by a process, and says
    /// nothing of processes holding the output open.
    #[tokio::test]
    async fn a_reader_held_by_a_display_still_writing_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let gate = Arc::new(OutputGate::new(64 * 1024));
        let (out_r, out_w) = std::io::pipe().unwrap();
        let (err_r, err_w) = std::io::pipe().unwrap();
        // A pipe that takes all of it: the child exits with the megabyte still to be read.
        nix::fcntl::fcntl(&out_w, nix::fcntl::FcntlArg::F_SETPIPE_SZ(1024 * 1024)).unwrap();
        let child = crate::os::spawn::Child::spawned(
            std::process::Command::new("sh").args(["-c", "yes | head -c 1048576"]).stdout(out_w).stderr(err_w),
        )
        .unwrap();
        let output = |pipe, name: &str| {
            let log_path = dir.path().join(name);
            let log = Log::Open(std::fs::File::create(&log_path).unwrap());
            Output { pipe, log, log_path, lines: true, gate: Some(Arc::clone(&gate)) }
        };
        let (tx, mut rx) = mpsc::channel(256);
        let outputs = [output(out_r, "stdout"), output(err_r, "stderr")];
        let supervisor =
            Supervisor::watch(child, ("held".to_owned(), "this attempt".into()), 0, 1, outputs, Arc::default(), &tx);
        // The display: a chunk counts as queued when it comes, and is written 12 KiB at a time.
        let (shown, queued) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let display = tokio::spawn({
            let (gate, shown, queued) = (Arc::clone(&gate), Arc::clone(&shown), Arc::clone(&queued));
            async move {
                while let Some(msg) = rx.recv().await {
                    if let Msg::Output { chunk, .. } = msg {
                        shown.fetch_add(chunk.len(), Ordering::SeqCst);
                        queued.fetch_add(chunk.len(), Ordering::SeqCst);
                        gate.queued(chunk.len());
                    }
                }
            }
        });
        let writer = tokio::spawn({
            let (gate, queued) = (Arc::clone(&gate), Arc::clone(&queued));
            async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let n = queued.load(Ordering::SeqCst).min(12 * 1024);
                    queued.fetch_sub(n, Ordering::SeqCst);
                    gate.written(n);
                }
            }
        });
        let (flow, _) =
            crate::flow::parse("[[step]]\nname = 's'\nrun = ['true']\n", std::path::Path::new("/x/flow.toml"))
                .unwrap_or_else(|_| panic!("a valid flow"));
        let (_control, control_rx) = watch::channel(Control::Run);
        let finished = supervisor.supervise(StepRef::InFlow(Arc::new(flow), 0), None, control_rx).await;
        assert!(finished.notes.is_empty(), "{:?}", finished.notes);
        writer.abort();
        drop(tx);
        tokio::time::timeout(Duration::from_secs(60), display).await.expect("the readers are done").unwrap();
        assert_eq!(shown.load(Ordering::SeqCst), 1024 * 1024, "every line reached the display");
        assert_eq!(std::fs::read(dir.path().join("stdout")).unwrap().len(), 1024 * 1024);
    }
}
