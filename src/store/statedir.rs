//! Trusting the state directory. It holds the commands waymark will run again on resume, so it
//! must be ours alone, the way ssh treats its key files: the state directory, its database and its
//! `locks` and `logs` directories must be owned by the current user and not writable by group or
//! others, and no symlink below it is ever followed. Only the state directory and what waymark
//! keeps in it are checked, not its parents (a state directory under the sticky, world-writable
//! `/tmp` is fine as long as it is our own); the path *to* the state directory may go through
//! symlinks (a symlinked home), and it is resolved once, so that everything below it is reached
//! without following any.

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
        "cannot open the {what} {path}: {source}; choose another state directory with --state-dir or WAYMARK_STATE_DIR"
    )]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
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
        Err(e) => return Err(TrustError::Io { what, path, source: e.into() }),
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
    let io = |e: Errno| TrustError::Io { what, path: path.clone(), source: e.into() };
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

/// What waymark keeps in the state directory, checked whenever it is opened.
const ENTRIES: [(&str, SFlag, &str); 5] = [
    ("waymark.db", SFlag::S_IFREG, "state database"),
    ("waymark.db-wal", SFlag::S_IFREG, "state database's log"),
    ("waymark.db-shm", SFlag::S_IFREG, "state database's index"),
    ("locks", SFlag::S_IFDIR, "lock directory"),
    ("logs", SFlag::S_IFDIR, "log directory"),
];

/// Make sure the state directory `dir` can be trusted, creating it (mode 0700, and its missing
/// parents) when `create`. Returns its resolved path, under which no component is a symlink, or
/// `None` when it does not exist and `create` is false.
pub(crate) fn prepare(dir: &Path, create: bool) -> Result<Option<PathBuf>, TrustError> {
    let what = "state directory";
    let io = |source| TrustError::Io { what, path: dir.to_owned(), source };
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
    check_owner_and_mode(what, dir, &st)?;
    for (name, want, what) in ENTRIES {
        check_entry(&fd, dir, name, want, what)?;
    }
    let resolved = std::fs::canonicalize(dir).map_err(io)?;
    Ok(Some(resolved))
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
        assert_eq!(prepare(&dir, true).unwrap().unwrap(), dir);
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
        assert_eq!(prepare(&link, false).unwrap().unwrap(), dir, "resolved once");
    }
}
