//! One runner per flow: an OS file lock per flow (per [`FlowKey`], named by
//! [`FlowKey::lock_file_name`]), released by the kernel when the holder
//! dies, so there are no stale pid files to clean up.
//!
//! The lock is also what makes a run's lease (see `lease`) exclusive in the SQLite store: a runner
//! takes it before it creates or claims a run, and releases it only after its last write. The
//! lease's token is checked on every write all the same, for when the lock does not hold (its
//! file deleted under a live runner, a file system whose locks do not work).

use super::FlowKey;
use super::statedir::{self, StateDir, TrustError};
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use std::fs::{File, TryLockError};
use std::io::Read;
use std::path::PathBuf;

/// How `waymark gc` says it holds a flow's lock, for the moment it deletes the flow's old runs. A
/// runner that finds the lock held by gc waits for it instead of saying that the flow is running.
const GC_HOLDER: &str = "waymark gc";

/// How long a runner waits for `waymark gc` to let go of its flow's lock before it says so.
const GC_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether a lock's holder, as [`FlowLock::acquire`] tells it to `waiting`, is `waymark gc`.
pub(crate) fn held_by_gc(holder: &str) -> bool {
    holder.starts_with(GC_HOLDER)
}

/// A held lock; dropping it releases the lock.
#[derive(Debug)]
pub(crate) struct FlowLock {
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
    #[error(transparent)]
    Untrusted(#[from] TrustError),
}

/// Open (creating it 0600) the lock file of flow `key` in `state_dir`, without following a symlink:
/// the state directory is resolved, `locks` is opened relative to it and the file relative to
/// `locks`, each with O_NOFOLLOW, and `locks` must be ours and writable by no one else.
fn open_lock_file(state_dir: &StateDir, key: &FlowKey, create: bool) -> Result<Option<File>, LockError> {
    let name = key.lock_file_name();
    let path = state_dir.lock_file(key);
    let root = state_dir.root();
    let io = |source: std::io::Error| LockError::Io { path: path.clone(), source };
    let state = crate::os::fs::open_dir_nofollow(root, false).map_err(io)?;
    let locks = if create {
        statedir::open_subdir(&state, root, statedir::LOCKS, "lock directory")?
    } else {
        statedir::check_entry(&state, root, statedir::LOCKS, nix::sys::stat::SFlag::S_IFDIR, "lock directory")?;
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        match nix::fcntl::openat(&state, statedir::LOCKS, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(nix::errno::Errno::ENOENT) => return Ok(None),
            Err(e) => return Err(io(e.into())),
        }
    };
    // Only looking (`is_held_for`) opens it read-only, which works on a read-only state directory too.
    let flags = OFlag::O_NOFOLLOW
        | OFlag::O_CLOEXEC
        | if create { OFlag::O_RDWR | OFlag::O_CREAT } else { OFlag::O_RDONLY | OFlag::O_NONBLOCK };
    match nix::fcntl::openat(&locks, name.as_str(), flags, Mode::S_IRUSR | Mode::S_IWUSR) {
        Ok(fd) => Ok(Some(File::from(fd))),
        Err(nix::errno::Errno::ENOENT) if !create => Ok(None),
        // Not a file that permissions would fix.
        Err(nix::errno::Errno::EISDIR) => {
            Err(TrustError::WrongKind { what: "lock file", path, found: "a directory" }.into())
        }
        Err(nix::errno::Errno::ELOOP) => {
            let target = std::fs::read_link(&path).map(|t| format!(" (to {})", t.display())).unwrap_or_default();
            Err(TrustError::Symlink { what: "lock file", path, target }.into())
        }
        Err(e) => Err(io(e.into())),
    }
}

impl FlowLock {
    /// Take the lock of flow `key` (shown as `flow`) in `state_dir`, waiting for it if `wait`, and
    /// for `waymark gc` always. Before it waits for another runner, or for gc once [`GC_PATIENCE`]
    /// has passed, `waiting` is told who holds the lock (this module never prints: the command says
    /// so through its reporters).
    pub(crate) fn acquire(
        state_dir: &StateDir,
        key: &FlowKey,
        flow: &str,
        wait: bool,
        waiting: impl FnOnce(&str),
    ) -> Result<FlowLock, LockError> {
        let path = state_dir.lock_file(key);
        let io = |source| LockError::Io { path: path.clone(), source };
        let Some(mut file) = open_lock_file(state_dir, key, true)? else { unreachable!("created") };
        // `waymark status` and `history` probe the lock with a momentary shared lock; try a few times before
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
                waiting(&holder(&mut file));
                file.lock().map_err(io)?
            }
            Err(TryLockError::WouldBlock) => {
                let holder = holder(&mut file);
                if !held_by_gc(&holder) {
                    return Err(LockError::Held { flow: flow.to_owned(), holder });
                }
                // gc holds it only while it deletes finished runs: wait for it, and, if that takes
                // long (a gc stopped, or deleting thousands of runs), say whom it waits for.
                let patience = std::time::Instant::now() + GC_PATIENCE;
                loop {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    match file.try_lock() {
                        Ok(()) => break,
                        Err(TryLockError::WouldBlock) => {
                            // gc let go and a runner took it meanwhile: as for any runner.
                            let now = self::holder(&mut file);
                            if !held_by_gc(&now) {
                                return Err(LockError::Held { flow: flow.to_owned(), holder: now });
                            }
                            if std::time::Instant::now() >= patience {
                                waiting(&now);
                                file.lock().map_err(io)?;
                                break;
                            }
                        }
                        Err(TryLockError::Error(e)) => return Err(io(e)),
                    }
                }
            }
            Err(TryLockError::Error(e)) => return Err(io(e)),
        }
        let mut lock =
            FlowLock { file, since: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string() };
        // Say who holds it at once; the run id follows once the run is chosen.
        lock.write_holder(&format!("pid {} since {}", std::process::id(), lock.since));
        Ok(lock)
    }

    /// Take the lock of flow `key` for `waymark gc` if nobody holds it (`Err` with who does, as
    /// they wrote it, if one does), so that gc never deletes a run that a runner holds or is about
    /// to hold.
    pub(crate) fn try_acquire_for_gc(
        state_dir: &StateDir,
        key: &FlowKey,
    ) -> Result<Result<FlowLock, String>, LockError> {
        let path = state_dir.lock_file(key);
        let not_found = || LockError::Io { path: path.clone(), source: std::io::ErrorKind::NotFound.into() };
        let mut file = open_lock_file(state_dir, key, true)?.ok_or_else(not_found)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Ok(Err(holder(&mut file))),
            Err(TryLockError::Error(source)) => return Err(LockError::Io { path, source }),
        }
        let mut lock =
            FlowLock { file, since: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string() };
        lock.write_holder(&format!("{GC_HOLDER}, pid {} since {}", std::process::id(), lock.since));
        Ok(Ok(lock))
    }

    /// Whether a live runner holds the lock of flow `key` for run `run_id` (checked without
    /// creating or following anything). A runner of another run of the flow (`waymark resume` of
    /// an older one) holds it for its own run, and `waymark gc` for none; a runner that has not
    /// said which run yet counts.
    pub(crate) fn is_held_for(state_dir: &StateDir, key: &FlowKey, run_id: &str) -> bool {
        let Ok(Some(mut file)) = open_lock_file(state_dir, key, false) else { return false };
        if !matches!(file.try_lock_shared(), Err(TryLockError::WouldBlock)) {
            return false;
        }
        let text = holder(&mut file);
        match text.strip_prefix("run ").and_then(|rest| rest.split(',').next()) {
            Some(holder) => holder == run_id,
            None => !text.starts_with(GC_HOLDER),
        }
    }

    /// Say who holds the lock, for a second runner's message.
    pub(crate) fn describe_holder(&mut self, run_id: &str) {
        // Since when this runner holds it: a resumed run began earlier (`waymark status` says).
        let text = format!("run {run_id}, by pid {} since {}", std::process::id(), self.since);
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

/// Who holds a lock, as its holder wrote it (read from its start, each time).
fn holder(file: &mut File) -> String {
    use std::io::Seek;
    let mut text = String::new();
    let _ = file.seek(std::io::SeekFrom::Start(0));
    let _ = file.read_to_string(&mut text);
    match text.trim() {
        "" => "another waymark holds its lock".to_owned(),
        t => t.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flow_lock_is_held_for_the_run_its_holder_names_and_never_for_gc() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::create(dir.path()).unwrap();
        let key = FlowKey::named("f");
        assert!(!FlowLock::is_held_for(&state, &key, "r1"), "no lock file yet");
        let mut lock = FlowLock::acquire(&state, &key, "f", false, |_| {}).unwrap();
        assert!(FlowLock::is_held_for(&state, &key, "r1"), "held before the holder names its run");
        lock.describe_holder("r1");
        assert!(FlowLock::is_held_for(&state, &key, "r1"));
        assert!(!FlowLock::is_held_for(&state, &key, "r2"), "held for another run of the flow");
        drop(lock);
        assert!(!FlowLock::is_held_for(&state, &key, "r1"), "released");
        let gc = FlowLock::try_acquire_for_gc(&state, &key).unwrap().expect("free");
        assert!(!FlowLock::is_held_for(&state, &key, "r1"), "gc runs no run");
        // A second gc is told that a gc holds it, not a runner.
        let held = FlowLock::try_acquire_for_gc(&state, &key).unwrap().expect_err("held");
        assert!(held_by_gc(&held), "{held}");
        drop(gc);
        let mut lock = FlowLock::acquire(&state, &key, "f", false, |_| {}).unwrap();
        lock.describe_holder("r1");
        let held = FlowLock::try_acquire_for_gc(&state, &key).unwrap().expect_err("held");
        assert!(!held_by_gc(&held) && held.starts_with("run r1, by pid "), "{held}");
    }
}
