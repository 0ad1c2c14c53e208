//! One runner per flow: an OS file lock per flow name, released by the kernel when the holder
//! dies, so there are no stale pid files to clean up.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// A held lock; dropping it releases the lock.
#[derive(Debug)]
pub struct FlowLock {
    file: File,
    /// When this runner took the lock.
    since: String,
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("flow `{flow}` is already running: {holder}")]
    Held { flow: String, holder: String },
    #[error("cannot lock {}: {source}; the state directory must be writable (fix its permissions, or choose another with --state-dir)", path.display())]
    Io { path: PathBuf, source: std::io::Error },
}

impl FlowLock {
    /// Take the lock of `flow` in `state_dir`, waiting for it if `wait`.
    pub fn acquire(state_dir: &Path, flow: &str, wait: bool) -> Result<FlowLock, LockError> {
        let dir = state_dir.join("locks");
        let path = dir.join(format!("{flow}.lock"));
        let io = |source| LockError::Io { path: path.clone(), source };
        super::create_private_dir(&dir).map_err(io)?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(io)?;
        // `waymark status` probes the lock with a momentary shared lock; try a few times before
        // concluding that a runner holds it.
        let mut result = file.try_lock();
        for _ in 0..5 {
            if !matches!(result, Err(TryLockError::WouldBlock)) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            result = file.try_lock();
        }
        match result {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) if wait => {
                eprintln!(
                    "waymark: flow `{flow}` is already running ({}); waiting for it to finish",
                    holder(&mut file)
                );
                file.lock().map_err(io)?
            }
            Err(TryLockError::WouldBlock) => {
                let holder = holder(&mut file);
                return Err(LockError::Held { flow: flow.to_owned(), holder });
            }
            Err(TryLockError::Error(e)) => return Err(io(e)),
        }
        let mut lock =
            FlowLock { file, since: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string() };
        // Say who holds it at once; the run id follows once the run is chosen.
        lock.write_holder(&format!("pid {}, started {}", std::process::id(), lock.since));
        Ok(lock)
    }

    /// Whether a live runner holds the lock of `flow` (checked without creating anything).
    pub fn is_held(state_dir: &Path, flow: &str) -> bool {
        let path = state_dir.join("locks").join(format!("{flow}.lock"));
        match File::open(path) {
            Ok(file) => matches!(file.try_lock_shared(), Err(TryLockError::WouldBlock)),
            Err(_) => false,
        }
    }

    /// Say who holds the lock, for a second runner's message.
    pub fn describe_holder(&mut self, run_id: &str) {
        let text = format!("run {run_id}, pid {}, started {}", std::process::id(), self.since);
        self.write_holder(&text);
    }

    /// Replace the holder text in place (a reader never finds the file empty).
    fn write_holder(&mut self, text: &str) {
        use std::os::unix::fs::FileExt;
        let text = format!("{text}\n");
        if self.file.write_all_at(text.as_bytes(), 0).is_ok() {
            let _ = self.file.set_len(text.len() as u64);
        }
    }
}

/// Who holds a lock, as its holder wrote it.
fn holder(file: &mut File) -> String {
    let mut text = String::new();
    let _ = file.read_to_string(&mut text);
    match text.trim() {
        "" => "another waymark holds its lock".to_owned(),
        t => t.to_owned(),
    }
}
