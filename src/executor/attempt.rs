//! One attempt of one step: spawn the child in its own process group, copy its output to the log
//! files and to the event loop, enforce the timeout, obey cancellation, and reap the whole group.

use super::Msg;
use super::events::Stream;
use super::unix::{self, ExitKind};
use crate::flow::{Signal, Step};
use std::fs::File;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// Read size for child output: large reads keep the copy close to the cost of a direct write.
const CHUNK: usize = 64 * 1024;

/// Everything needed to start one attempt.
pub struct AttemptSpec {
    pub step_index: usize,
    pub step: Arc<Step>,
    pub env: Vec<(String, String)>,
    pub stdout_log: PathBuf,
    pub stderr_log: PathBuf,
    /// When the attempt was issued: the timeout clock starts here.
    pub issued: Instant,
}

/// What the event loop may ask of a running attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    Run,
    /// Forward this signal to the group, SIGKILL after the grace period.
    Cancel(Signal),
    /// SIGKILL the group now.
    Kill,
}

/// How an attempt that started came to an end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Exited(ExitKind),
    TimedOut,
    Cancelled,
}

/// A spawned attempt, before it is handed to its supervising task.
pub struct Running {
    child: tokio::process::Child,
    pub pid: u32,
    readers: Vec<tokio::task::JoinHandle<std::io::Result<()>>>,
}

/// Why an attempt could not start: the child's fault (retryable) or waymark's own.
#[derive(Debug)]
pub enum SpawnError {
    NotStarted(String),
    Runner(std::io::Error, PathBuf),
}

fn open_log(path: &std::path::Path) -> Result<File, SpawnError> {
    crate::fsutil::open_append_private(path).map_err(|e| SpawnError::Runner(e, path.to_owned()))
}

/// Start the child. Runs on the event loop so the pid is known before anything else happens.
pub fn spawn(spec: &AttemptSpec, events: &mpsc::Sender<Msg>) -> Result<Running, SpawnError> {
    let step = &spec.step;
    let stdout_log = open_log(&spec.stdout_log)?;
    let stderr_log = open_log(&spec.stderr_log)?;
    if !step.workdir.is_dir() {
        return Err(SpawnError::NotStarted(format!(
            "working directory {} does not exist or is not a directory",
            step.workdir.display()
        )));
    }
    let argv = step.command.argv();
    let (out_r, out_w) = std::io::pipe().map_err(|e| SpawnError::Runner(e, "pipe".into()))?;
    let (err_r, err_w) = std::io::pipe().map_err(|e| SpawnError::Runner(e, "pipe".into()))?;
    let mut cmd = tokio::process::Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&step.workdir)
        .stdin(std::process::Stdio::null())
        .stdout(out_w)
        .stderr(err_w)
        .process_group(0)
        .kill_on_drop(false);
    let child = cmd.spawn().map_err(|e| {
        SpawnError::NotStarted(match e.kind() {
            std::io::ErrorKind::NotFound => format!("program `{}` not found (searched PATH)", argv[0]),
            std::io::ErrorKind::PermissionDenied => format!("program `{}` is not executable: {e}", argv[0]),
            _ => format!("cannot start `{}`: {e}", argv[0]),
        })
    })?;
    // `cmd` still holds the write ends; drop it so the readers see EOF when the child exits.
    drop(cmd);
    let pid = child.id().unwrap_or(0);
    let readers = vec![
        copy_output(out_r, stdout_log, Stream::Stdout, spec.step_index, events.clone()),
        copy_output(err_r, stderr_log, Stream::Stderr, spec.step_index, events.clone()),
    ];
    Ok(Running { child, pid, readers })
}

/// Copy a child's stream to its log file and, in whole lines, to the event loop.
fn copy_output(
    mut pipe: std::io::PipeReader,
    mut log: File,
    stream: Stream,
    step: usize,
    events: mpsc::Sender<Msg>,
) -> tokio::task::JoinHandle<std::io::Result<()>> {
    tokio::task::spawn_blocking(move || {
        let mut buf = vec![0u8; CHUNK];
        let mut partial: Vec<u8> = Vec::new();
        let mut log_error = None;
        loop {
            let n = match pipe.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            let data = &buf[..n];
            if log_error.is_none()
                && let Err(e) = log.write_all(data)
            {
                log_error = Some(e);
            }
            // Only the new bytes are searched, so a long line costs linear time.
            let send = |bytes: Vec<u8>| {
                let _ = events.blocking_send(Msg::Output { step, stream, bytes });
            };
            match data.iter().rposition(|b| *b == b'\n') {
                Some(last_nl) => {
                    partial.extend_from_slice(&data[..=last_nl]);
                    send(std::mem::take(&mut partial));
                    partial.extend_from_slice(&data[last_nl + 1..]);
                }
                None => partial.extend_from_slice(data),
            }
            // A line with no end in sight is shown in pieces rather than held in memory.
            if partial.len() >= CHUNK {
                partial.push(b'\n');
                send(std::mem::take(&mut partial));
            }
        }
        if !partial.is_empty() {
            partial.push(b'\n');
            let _ = events.blocking_send(Msg::Output { step, stream, bytes: partial });
        }
        log_error.map_or(Ok(()), Err)
    })
}

impl Running {
    /// Wait for the attempt to end, enforcing `deadline` and obeying `control`. Always leaves the
    /// process group dead and both output streams drained.
    pub async fn supervise(
        mut self,
        step: Arc<Step>,
        deadline: Option<Instant>,
        mut control: watch::Receiver<Control>,
    ) -> (End, std::io::Result<()>) {
        let pgid = self.pid;
        let mut stopping: Option<End> = None;
        let mut kill_at: Option<Instant> = None;
        let far = || Instant::now() + std::time::Duration::from_secs(86_400 * 365);
        let status = loop {
            tokio::select! {
                status = self.child.wait() => break status,
                _ = tokio::time::sleep_until(deadline.unwrap_or_else(far)), if deadline.is_some() && stopping.is_none() => {
                    stopping = Some(End::TimedOut);
                    kill_at = stop_group(pgid, step.kill_signal, step.kill_grace);
                }
                _ = tokio::time::sleep_until(kill_at.unwrap_or_else(far)), if kill_at.is_some() => {
                    unix::kill_group(pgid);
                    kill_at = None;
                }
                changed = control.changed() => {
                    if changed.is_err() {
                        // The event loop is gone; do not leave the child behind.
                        unix::kill_group(pgid);
                        continue;
                    }
                    match *control.borrow_and_update() {
                        Control::Run => {}
                        Control::Cancel(sig) => {
                            if stopping.is_none() {
                                stopping = Some(End::Cancelled);
                                kill_at = stop_group(pgid, sig, step.kill_grace);
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
        // The leader is gone; whatever else is left in its group goes with it.
        unix::kill_group(pgid);
        let mut io_result = Ok(());
        for reader in self.readers {
            match reader.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => io_result = Err(e),
                Err(e) => io_result = Err(std::io::Error::other(e)),
            }
        }
        let end = match (stopping, status) {
            (Some(end), _) => end,
            (None, Ok(status)) => End::Exited(unix::exit_kind(status)),
            (None, Err(e)) => return (End::Exited(ExitKind::Code(-1)), Err(e)),
        };
        (end, io_result)
    }
}

/// Send `sig` to the group and return when to escalate to SIGKILL (grace 0: SIGKILL at once).
fn stop_group(pgid: u32, sig: Signal, grace: std::time::Duration) -> Option<Instant> {
    if grace.is_zero() || sig.0 == nix::sys::signal::Signal::SIGKILL {
        unix::kill_group(pgid);
        None
    } else {
        unix::signal_group(pgid, sig.0);
        Some(Instant::now() + grace)
    }
}
