//! Trusting the state directory. It holds the commands waymark will run again on resume, so it
//! must be ours alone, the way ssh treats its key files: the state directory, its database and its
//! `locks` and `logs` directories must be owned by the current user and not writable by group or
//! others, and no symlink below it is ever followed. Only the state directory and what waymark
//! keeps in it are checked, not its parents (a state directory under the sticky, world-writable
//! `/tmp` is fine as long as it is our own); the path *to* the state directory may go through
//! symlinks (a symlinked home), and it is resolved once, so that everything below it is reached
//! without following any.
//!
//! [`StateDir`] is the checked, resolved state directory, and the one place that knows its layout:
//! every path under it (the database, the lock files, the logs of a run, a step and an attempt) is
//! built by its methods, and no other code joins names onto the state directory.

use super::FlowKey;
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

/// What waymark refuses to use, and why; each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error(
        "refusing to use the {what} {path}: its owner is {owner} (mode {mode:04o}), but you are {me}; \
         waymark keeps the commands it runs there, so it uses only state that you own and no one else can \
         write: choose a state directory of your own with --state-dir or WAYMARK_STATE_DIR, or, if its \
         contents are yours, take it over with `chown -R {me_name} {path}`"
    )]
    Foreign { what: &'static str, path: PathBuf, owner: String, me: String, me_name: String, mode: u32 },
    #[error(
        "refusing to use the {what} {path}: its owner is {owner}, but its mode {mode:04o} lets {who} write to it; \
         waymark keeps the commands it runs there, so no one but you may change it: fix it with \
         `chmod go-w {path}`, or choose another state directory with --state-dir or WAYMARK_STATE_DIR"
    )]
    Writable { what: &'static str, path: PathBuf, owner: String, who: &'static str, mode: u32 },
    #[error(
        "refusing to use the {what} {path}: it is a symbolic link{target}; waymark never follows links \
         inside its state directory: remove it (`rm {path}`), or choose another state directory with \
         --state-dir or WAYMARK_STATE_DIR"
    )]
    Symlink { what: &'static str, path: PathBuf, target: String },
    #[error(
        "refusing to use the {what} {path}: it is {found}; remove it, or choose another state directory \
         with --state-dir or WAYMARK_STATE_DIR"
    )]
    WrongKind { what: &'static str, path: PathBuf, found: &'static str },
    #[error(
        "cannot open the {what} {path}: {error}; choose another state directory with --state-dir or WAYMARK_STATE_DIR"
    )]
    Io {
        what: &'static str,
        path: PathBuf,
        // Said in the message: not also a `source`, which a chain of causes would say again.
        error: std::io::Error,
    },
}

/// A user for messages: `alice (uid 1000)`.
fn user(uid: u32) -> String {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(u)) => format!("{} (uid {uid})", u.name),
        _ => format!("uid {uid}"),
    }
}

fn user_name(uid: u32) -> String {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(u)) => u.name,
        _ => uid.to_string(),
    }
}

fn kind(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT
}

fn kind_name(k: SFlag) -> &'static str {
    match k {
        SFlag::S_IFREG => "a regular file, not a directory",
        SFlag::S_IFDIR => "a directory, not a file",
        SFlag::S_IFIFO => "a FIFO",
        SFlag::S_IFSOCK => "a socket",
        SFlag::S_IFCHR | SFlag::S_IFBLK => "a device",
        _ => "not a regular file or directory",
    }
}

/// Check that what `st` describes is ours and writable by no one else.
/// The logs at `stem` (`STEM.stdout`, `STEM.stderr`) that exist, as a message says them: `its
/// output: A, B`, or `it wrote nothing` (a log is created on its first byte).
pub(crate) fn output_said(stem: &Path) -> String {
    let logs: Vec<String> = ["stdout", "stderr"]
        .into_iter()
        .map(|stream| stem.with_extension(stream))
        .filter(|p| std::fs::symlink_metadata(p).is_ok())
        .map(|p| p.display().to_string())
        .collect();
    match logs.is_empty() {
        true => "it wrote nothing".to_owned(),
        false => format!("its output: {}", logs.join(", ")),
    }
}

pub(crate) fn check_owner_and_mode(what: &'static str, path: &Path, st: &FileStat) -> Result<(), TrustError> {
    let me = nix::unistd::geteuid().as_raw();
    let mode = st.st_mode & 0o7777;
    if st.st_uid != me {
        return Err(TrustError::Foreign {
            what,
            path: path.to_owned(),
            owner: user(st.st_uid),
            me: user(me),
            me_name: user_name(me),
            mode,
        });
    }
    if mode & 0o022 != 0 {
        let who = match (mode & 0o020 != 0, mode & 0o002 != 0) {
            (true, true) => "group and others",
            (true, false) => "its group",
            _ => "others",
        };
        return Err(TrustError::Writable { what, path: path.to_owned(), owner: user(st.st_uid), who, mode });
    }
    Ok(())
}

/// Check the entry `name` of the directory `dir` (at `dir_path`) without following it: absent is
/// fine; otherwise it must be of the `want`ed kind, ours, and writable by no one else.
pub(crate) fn check_entry(
    dir: impl AsFd,
    dir_path: &Path,
    name: &str,
    want: SFlag,
    what: &'static str,
) -> Result<(), TrustError> {
    let path = dir_path.join(name);
    let st = match nix::sys::stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::ENOENT) => return Ok(()),
        Err(e) => return Err(TrustError::Io { what, path, error: e.into() }),
    };
    match kind(&st) {
        k if k == want => check_owner_and_mode(what, &path, &st),
        SFlag::S_IFLNK => {
            let target = std::fs::read_link(&path).map(|t| format!(" (to {})", t.display())).unwrap_or_default();
            Err(TrustError::Symlink { what, path, target })
        }
        k => Err(TrustError::WrongKind { what, path, found: kind_name(k) }),
    }
}

/// Open a directory entry `name` of `dir` as a directory, without following a symlink, creating it
/// (mode 0700) if missing; then check that it is ours and writable by no one else.
pub(crate) fn open_subdir(
    dir: impl AsFd,
    dir_path: &Path,
    name: &str,
    what: &'static str,
) -> Result<OwnedFd, TrustError> {
    let path = dir_path.join(name);
    let io = |e: Errno| TrustError::Io { what, path: path.clone(), error: e.into() };
    match nix::sys::stat::mkdirat(dir.as_fd(), name, Mode::S_IRWXU) {
        Ok(()) | Err(Errno::EEXIST) => {}
        Err(e) => return Err(io(e)),
    }
    check_entry(dir.as_fd(), dir_path, name, SFlag::S_IFDIR, what)?;
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = nix::fcntl::openat(dir.as_fd(), name, flags, Mode::empty()).map_err(|e| match e {
        Errno::ELOOP => TrustError::Symlink { what, path: path.clone(), target: String::new() },
        e => io(e),
    })?;
    // Checked again on the descriptor: it may have been swapped since the check by name.
    let st = nix::sys::stat::fstat(&fd).map_err(io)?;
    check_owner_and_mode(what, &path, &st)?;
    Ok(fd)
}

/// The database's file name in the state directory.
const DB: &str = "waymark.db";
/// The directory of the lock files.
pub(crate) const LOCKS: &str = "locks";
/// The directory of the logs.
pub(crate) const LOGS: &str = "logs";

/// What waymark keeps in the state directory, checked whenever it is opened.
const ENTRIES: [(&str, SFlag, &str); 5] = [
    (DB, SFlag::S_IFREG, "state database"),
    ("waymark.db-wal", SFlag::S_IFREG, "state database's log"),
    ("waymark.db-shm", SFlag::S_IFREG, "state database's index"),
    (LOCKS, SFlag::S_IFDIR, "lock directory"),
    (LOGS, SFlag::S_IFDIR, "log directory"),
];

/// The state directory, checked and resolved (no component of its path is a symlink), and its
/// layout:
///
/// ```text
/// waymark.db                              db()
/// locks/                                  locks()
/// locks/NAME.lock                         lock_file(key)
/// logs/                                   logs()
/// logs/RUN_ID/                            run_logs(run_id)
/// logs/RUN_ID/STEP/                       step_logs(run_id, step)
/// logs/RUN_ID/STEP/attempt-N              attempt_stem(run_id, step, n), + .stdout, .stderr, .error.json
/// ```
///
/// Made only by [`prepare`] (or [`StateDir::find`], which is `prepare` without creating).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateDir {
    root: PathBuf,
}

/// Whether the directory `dir` holds a state database, looked at without checking or creating it
/// (see [`StateDir::has_database`]).
pub(crate) fn has_database_at(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir.join(DB)).is_ok()
}

impl StateDir {
    /// The state directory `dir`, created if missing, checked and resolved (for a benchmark or a
    /// test; the commands use [`prepare`], which tells why it failed).
    pub fn create(dir: &Path) -> Result<StateDir, TrustError> {
        prepare(dir, true)?.ok_or_else(|| TrustError::Io {
            what: "state directory",
            path: dir.to_owned(),
            error: std::io::ErrorKind::NotFound.into(),
        })
    }

    /// The state directory `dir` for commands that only look: checked and resolved if it exists,
    /// never created; if it does not exist, `dir` as given (absolute), where there is nothing yet.
    pub(crate) fn find(dir: &Path) -> Result<StateDir, TrustError> {
        Ok(prepare(dir, false)?.unwrap_or_else(|| StateDir { root: dir.to_owned() }))
    }

    /// Whether the state directory exists (one that [`StateDir::find`] did not find does not:
    /// nothing was ever recorded there).
    pub(crate) fn exists(&self) -> bool {
        std::fs::symlink_metadata(&self.root).is_ok()
    }

    /// Whether the directory holds a state database (a directory without one is not a state
    /// directory, or one that `run` never recorded a run in: either way it holds no runs).
    pub(crate) fn has_database(&self) -> bool {
        has_database_at(&self.root)
    }

    /// The state directory itself.
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// The SQLite database.
    pub(crate) fn db(&self) -> PathBuf {
        self.root.join(DB)
    }

    /// The directory of the lock files.
    pub(crate) fn locks(&self) -> PathBuf {
        self.root.join(LOCKS)
    }

    /// The lock file of flow `key`.
    pub(crate) fn lock_file(&self, key: &FlowKey) -> PathBuf {
        self.locks().join(key.lock_file_name())
    }

    /// The directory of all logs.
    pub(crate) fn logs(&self) -> PathBuf {
        self.root.join(LOGS)
    }

    /// The logs of run `run_id`.
    pub(crate) fn run_logs(&self, run_id: &str) -> PathBuf {
        self.logs().join(run_id)
    }

    /// The logs of step `step` of run `run_id`.
    pub(crate) fn step_logs(&self, run_id: &str, step: &str) -> PathBuf {
        self.run_logs(run_id).join(step)
    }

    /// The files of an attempt without their extension: `attempt-N`, to which `.stdout`,
    /// `.stderr` and `.error.json` are added.
    pub(crate) fn attempt_stem(&self, run_id: &str, step: &str, attempt: u32) -> PathBuf {
        self.step_logs(run_id, step).join(format!("attempt-{attempt}"))
    }

    /// The files of the catch handler run for the error of attempt `attempt`: `catch-N`, to which
    /// `.stdout` and `.stderr` are added.
    pub(crate) fn handler_stem(&self, run_id: &str, step: &str, attempt: u32) -> PathBuf {
        self.step_logs(run_id, step).join(format!("catch-{attempt}"))
    }

    /// The files of step `name`'s compensation (`STEP/compensate`) or of hook `name`
    /// (`hooks/NAME`), in the run's logs.
    pub(crate) fn aux_stem(&self, run_id: &str, kind: super::AuxKind, name: &str) -> PathBuf {
        match kind {
            super::AuxKind::Compensate => self.step_logs(run_id, name).join("compensate"),
            super::AuxKind::Hook => self.run_logs(run_id).join("hooks").join(name),
        }
    }
}

/// Make sure the state directory `dir` can be trusted, creating it (mode 0700, and its missing
/// parents) when `create`. Returns it resolved, so that no component of its path is a symlink,
/// or `None` when it does not exist and `create` is false.
pub(crate) fn prepare(dir: &Path, create: bool) -> Result<Option<StateDir>, TrustError> {
    let what = "state directory";
    let io = |error| TrustError::Io { what, path: dir.to_owned(), error };
    if create {
        super::create_dir_following(dir).map_err(io)?;
    }
    // The path to the state directory may go through symlinks (a symlinked home); what it
    // resolves to is what gets checked.
    let fd = match nix::fcntl::open(dir, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) if !create => return Ok(None),
        Err(e) => return Err(io(e.into())),
    };
    let st = nix::sys::stat::fstat(&fd).map_err(|e| io(e.into()))?;
    // Messages name what is checked: a `chown -R` of the link would change the link alone.
    let resolved = std::fs::canonicalize(dir).map_err(io)?;
    check_owner_and_mode(what, &resolved, &st)?;
    for (name, want, what) in ENTRIES {
        check_entry(&fd, &resolved, name, want, what)?;
    }
    Ok(Some(StateDir { root: resolved }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path, m: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    }

    #[test]
    fn a_missing_state_directory_is_created_private_or_reported_absent() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b/state");
        assert!(prepare(&dir, false).unwrap().is_none());
        assert!(!dir.exists());
        assert_eq!(prepare(&dir, true).unwrap().unwrap().root(), dir);
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
    }

    #[test]
    fn only_group_or_other_write_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        std::fs::create_dir(&dir).unwrap();
        mode(&dir, 0o755);
        assert!(prepare(&dir, false).unwrap().is_some(), "0755 is fine");
        for (m, who) in [(0o775, "its group"), (0o757, "others"), (0o1777, "group and others")] {
            mode(&dir, m);
            let e = prepare(&dir, false).unwrap_err().to_string();
            assert!(e.contains(&format!("its mode {m:04o} lets {who} write to it")), "{e}");
            assert!(e.contains(&format!("`chmod go-w {}`", dir.display())), "{e}");
        }
    }

    #[test]
    fn symlinked_entries_are_refused_and_the_state_path_may_be_a_link() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        std::fs::create_dir(&dir).unwrap();
        std::fs::create_dir(tmp.path().join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("elsewhere"), dir.join("logs")).unwrap();
        let e = prepare(&dir, false).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!(
                "refusing to use the log directory {}/logs: it is a symbolic link (to ",
                dir.display()
            )),
            "{e}"
        );
        std::fs::remove_file(dir.join("logs")).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert_eq!(prepare(&link, false).unwrap().unwrap().root(), dir, "resolved once");
    }

    #[test]
    fn every_path_under_the_state_directory_is_laid_out_as_documented() {
        let tmp = tempfile::tempdir().unwrap();
        let state = StateDir::create(&tmp.path().join("state")).unwrap();
        let root = state.root().to_owned();
        assert_eq!(state.db(), root.join("waymark.db"));
        assert_eq!(state.locks(), root.join("locks"));
        assert_eq!(state.lock_file(&FlowKey::named("nightly")), root.join("locks/nightly.lock"));
        assert_eq!(state.logs(), root.join("logs"));
        assert_eq!(state.run_logs("r1"), root.join("logs/r1"));
        assert_eq!(state.step_logs("r1", "build"), root.join("logs/r1/build"));
        assert_eq!(state.attempt_stem("r1", "build", 3), root.join("logs/r1/build/attempt-3"));
        let missing = tmp.path().join("nothing/here");
        assert_eq!(StateDir::find(&missing).unwrap().root(), missing, "never created");
        assert!(!missing.exists());
    }
}
