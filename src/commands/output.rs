//! What the commands print on stdout goes through here, so that a closed or full stdout is an
//! outcome with a documented exit status instead of a panic.
//!
//! A closed pipe (`waymark history | head -1`: the reader has what it wanted and left) ends the
//! command quietly with exit status 0, as ripgrep does. Any other write error (a full disk,
//! `/dev/full`) is waymark's own failure: exit status 4 and a message.

use super::CliError;
use std::io::{ErrorKind, Read, Write};

/// Write all of `bytes` to stdout and flush them.
pub(crate) fn print(bytes: impl AsRef<[u8]>) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    out.write_all(bytes.as_ref()).and_then(|()| out.flush()).map_err(failed)
}

/// Copy a reader (a log file, possibly larger than memory) to stdout, giving the last byte
/// copied. A read error is the caller's to describe.
pub(crate) fn copy(from: &mut impl Read) -> Result<Result<Option<u8>, std::io::Error>, CliError> {
    let mut out = std::io::stdout().lock();
    let mut buf = vec![0u8; 64 * 1024];
    let mut last = None;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Ok(Err(e)),
        };
        out.write_all(&buf[..n]).map_err(failed)?;
        last = Some(buf[n - 1]);
    }
    out.flush().map_err(failed)?;
    Ok(Ok(last))
}

pub(super) fn failed(e: std::io::Error) -> CliError {
    if e.kind() == ErrorKind::BrokenPipe {
        return CliError::StdoutClosed;
    }
    CliError::Internal(anyhow::anyhow!(
        "cannot write to standard output: {e}; free space where it goes, or redirect it to another file"
    ))
}
