//! Opening files under the state directory safely. A child can write into its step's log
//! directory (and, running as the same user, anywhere in the state directory), so whatever it
//! planted at the path of a later attempt's file or directory (a symlink to a victim, a directory)
//! is removed or refused, and the runner never follows a link there: directories are walked one
//! component at a time relative to the previous one's descriptor with `O_NOFOLLOW`, and files are
//! opened relative to their directory's descriptor.
//!
//! The paths given here are expected to contain no symlinks at all: the state directory is
//! resolved once (`store::statedir::prepare`) and everything below it is built from that.

use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, AtFlags, OFlag};
use nix::sys::stat::{Mode, SFlag};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path};

/// A system call's failure on a path, naming it (`/tmp: EMFILE: Too many open files`), its errno
/// still there for [`errno`].
#[derive(Debug, thiserror::Error)]
#[error("{path}: {errno}")]
struct AtPath {
    path: String,
    errno: Errno,
}

fn at_path(path: &Path, errno: Errno) -> io::Error {
    io::Error::new(io::Error::from(errno).kind(), AtPath { path: path.display().to_string(), errno })
}

/// The errno of a failed system call, whether `e` is its own or names the path it failed on.
pub(crate) fn errno(e: &io::Error) -> Option<i32> {
    e.raw_os_error().or_else(|| Some(e.get_ref()?.downcast_ref::<AtPath>()?.errno as i32))
}

/// The error for a symbolic link met where waymark allows none.
pub(crate) fn symlink_refused(path: &Path) -> io::Error {
    let target = std::fs::read_link(path).map(|t| format!(" (to {})", t.display())).unwrap_or_default();
    io::Error::other(format!(
        "{} is a symbolic link{target}; waymark never follows links inside its state directory: remove it \
         (`rm {}`) and run again",
        path.display(),
        path.display()
    ))
}

/// Open the directory `path` without following a symlink in any of its components, creating the
/// missing ones (mode 0700) when `create`. An absolute path is walked from `/`, a relative one
/// from the working directory.
pub(crate) fn open_dir_nofollow(path: &Path, create: bool) -> io::Result<OwnedFd> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    // The common case in one syscall: the kernel resolves the whole path and refuses any symlink
    // on the way (Linux 5.6+). Anything else (a missing component to create, a link to name in
    // the error, an older kernel) takes the walk below, one component at a time.
    let how = || nix::fcntl::OpenHow::new().flags(flags).resolve(nix::fcntl::ResolveFlag::RESOLVE_NO_SYMLINKS);
    match nix::fcntl::openat2(AT_FDCWD, path, how()) {
        Ok(fd) => return Ok(fd),
        // A new directory in one that exists (a step's log directory, made by its first
        // attempt): made from its parent's descriptor, where the walk would open every component.
        Err(Errno::ENOENT) if create => {
            if let (Some(parent), Some(Component::Normal(name))) = (path.parent(), path.components().next_back())
                && !parent.as_os_str().is_empty()
                && let Ok(parent) = nix::fcntl::openat2(AT_FDCWD, parent, how())
            {
                match nix::sys::stat::mkdirat(&parent, name, Mode::S_IRWXU) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => {
                        return Err(at_path(path, e));
                    }
                }
                match nix::fcntl::openat(&parent, name, flags, Mode::empty()) {
                    Ok(fd) => return Ok(fd),
                    Err(Errno::ELOOP | Errno::ENOTDIR) if is_symlink_at(&parent, name) => {
                        return Err(symlink_refused(path));
                    }
                    // Anything else: the walk below says what and where.
                    Err(_) => {}
                }
            }
        }
        Err(_) => {}
    }
    let mut dir: Option<OwnedFd> = None;
    let mut walked = std::path::PathBuf::new();
    for component in path.components() {
        walked.push(component);
        let name = match component {
            Component::RootDir => {
                dir = Some(nix::fcntl::open("/", flags, Mode::empty())?);
                continue;
            }
            Component::CurDir => continue,
            Component::Normal(name) => name,
            Component::ParentDir | Component::Prefix(_) => {
                return Err(io::Error::other(format!("{}: `..` is not allowed here", path.display())));
            }
        };
        let mut opened = nix::fcntl::openat(at(&dir), name, flags, Mode::empty());
        if create && matches!(opened, Err(Errno::ENOENT)) {
            match nix::sys::stat::mkdirat(at(&dir), name, Mode::S_IRWXU) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(at_path(&walked, e)),
            }
            opened = nix::fcntl::openat(at(&dir), name, flags, Mode::empty());
        }
        dir = Some(match opened {
            Ok(fd) => fd,
            // O_NOFOLLOW|O_DIRECTORY on a symlink: ELOOP (Linux) or ENOTDIR.
            Err(Errno::ELOOP | Errno::ENOTDIR) if is_symlink_at(at(&dir), name) => {
                return Err(symlink_refused(&walked));
            }
            Err(e) => return Err(at_path(&walked, e)),
        });
    }
    match dir {
        Some(fd) => Ok(fd),
        None => nix::fcntl::open(".", flags, Mode::empty()).map_err(io::Error::from),
    }
}

/// The descriptor to resolve the next component against: the last directory, or the working one.
fn at(dir: &Option<OwnedFd>) -> std::os::fd::BorrowedFd<'_> {
    dir.as_ref().map_or(AT_FDCWD, |d| d.as_fd())
}

fn is_symlink_at(dir: impl AsFd, name: &std::ffi::OsStr) -> bool {
    nix::sys::stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
        .is_ok_and(|st| SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK)
}

/// The directory of `path` opened without following links, and the file's name in it.
fn parent_and_name(path: &Path) -> io::Result<(OwnedFd, &std::ffi::OsStr)> {
    let name = path.file_name().ok_or_else(|| io::Error::other(format!("{}: not a file name", path.display())))?;
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    Ok((open_dir_nofollow(parent, false)?, name))
}

/// Create the directory `path` (mode 0700) in its parent, which must exist, never following a
/// symlink: a step's log directory in its run's, made when the run started. A parent that is gone
/// (the state directory deleted or moved while the run ran) is an error that says so, not made
/// again: a tree made again there would hold logs of a run no database has, kept for good.
pub(crate) fn create_dir_in_parent(path: &Path) -> io::Result<()> {
    let (parent, name) = match parent_and_name(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let parent = path.parent().unwrap_or(path);
            return Err(io::Error::new(
                e.kind(),
                format!("{} is gone (the state directory deleted or moved while the run ran?)", parent.display()),
            ));
        }
        parent => parent?,
    };
    match nix::sys::stat::mkdirat(&parent, name, Mode::S_IRWXU) {
        Ok(()) | Err(Errno::EEXIST) => {}
        Err(e) => return Err(at_path(path, e)),
    }
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    match nix::fcntl::openat(&parent, name, flags, Mode::empty()) {
        Ok(_) => Ok(()),
        Err(Errno::ELOOP | Errno::ENOTDIR) if is_symlink_at(&parent, name) => Err(symlink_refused(path)),
        Err(e) => Err(at_path(path, e)),
    }
}

/// Remove what is at `path` unless it is a regular file (or whatever it is, with `also_files`).
/// Never follows a symlink, in `path`'s directories either.
fn remove_entry(path: &Path, also_files: bool) -> io::Result<()> {
    let (dir, name) = parent_and_name(path)?;
    let st = match nix::sys::stat::fstatat(&dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::ENOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    match SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT {
        SFlag::S_IFREG if !also_files => Ok(()),
        // remove_dir_all does not follow symlinks inside the tree; its parents were just checked.
        SFlag::S_IFDIR => std::fs::remove_dir_all(path),
        _ => nix::unistd::unlinkat(&dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir).map_err(io::Error::from),
    }
}

/// Remove what is at `path` unless it is a regular file. Never follows a symlink.
pub(crate) fn remove_unless_regular(path: &Path) -> io::Result<()> {
    remove_entry(path, false)
}

/// Remove whatever is at `path`: a file, a symlink (never its target), a directory tree.
pub(crate) fn remove_any(path: &Path) -> io::Result<()> {
    remove_entry(path, true)
}

/// Open `path` for appending (creating it 0600), refusing to follow a symlink anywhere in it.
pub(crate) fn open_append_private(path: &Path) -> io::Result<File> {
    remove_unless_regular(path)?;
    let (dir, name) = parent_and_name(path)?;
    let flags = OFlag::O_WRONLY | OFlag::O_APPEND | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = nix::fcntl::openat(&dir, name, flags, Mode::S_IRUSR | Mode::S_IWUSR)?;
    Ok(File::from(fd))
}

/// What [`open_existing_log_at`] found at a log's name.
pub(crate) enum ExistingLog {
    /// Nothing: the log is created when the first byte comes ([`create_append_private_at`]).
    Missing,
    /// A regular file (an earlier execution's log), opened for appending, and its length.
    Open(File, u64),
}

/// Open the log `name` in directory `dir` for appending if a regular file is there, without
/// creating it: one `fstatat` when there is none (the common case). Whatever else is there (a
/// symlink, a directory, a FIFO a child planted) is removed, never followed, and counts as missing.
/// `path` is the same file's full path, for messages and the rare removal.
pub(crate) fn open_existing_log_at(dir: impl AsFd, name: &std::ffi::OsStr, path: &Path) -> io::Result<ExistingLog> {
    let st = match nix::sys::stat::fstatat(&dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::ENOENT) => return Ok(ExistingLog::Missing),
        Err(e) => return Err(e.into()),
    };
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        remove_unless_regular(path)?;
        return Ok(ExistingLog::Missing);
    }
    // O_NONBLOCK: should the regular file have been swapped for a FIFO since, the open does not
    // hang; the descriptor is checked to be a regular file again.
    let flags = OFlag::O_WRONLY | OFlag::O_APPEND | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    match nix::fcntl::openat(&dir, name, flags, Mode::empty()) {
        Ok(fd) => {
            let file = File::from(fd);
            let meta = file.metadata()?;
            if !meta.is_file() {
                return Err(io::Error::other(format!("{}: not a regular file", path.display())));
            }
            Ok(ExistingLog::Open(file, meta.len()))
        }
        Err(Errno::ENOENT) => Ok(ExistingLog::Missing),
        Err(e) => Err(e.into()),
    }
}

/// Create the file `name` in directory `dir` for appending (mode 0600), never following a link:
/// O_CREAT|O_EXCL, so nothing already there is opened. When something is (a child wrote or
/// planted something at its own log's name meanwhile), `path` (the same file's full path) is
/// opened as [`open_append_private`] does: a regular file is appended to, anything else removed.
pub(crate) fn create_append_private_at(dir: impl AsFd, name: &std::ffi::OsStr, path: &Path) -> io::Result<File> {
    let flags =
        OFlag::O_WRONLY | OFlag::O_APPEND | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    match nix::fcntl::openat(&dir, name, flags, Mode::S_IRUSR | Mode::S_IWUSR) {
        Ok(fd) => Ok(File::from(fd)),
        Err(Errno::EEXIST) => open_append_private(path),
        Err(e) => Err(e.into()),
    }
}

/// Remove whatever is at `name` in directory `dir` (a file, a symlink, never its target, a
/// directory tree); nothing there is no error. One `unlinkat` in the common cases; `path` is the
/// same entry's full path, for removing a directory a child planted there.
pub(crate) fn remove_any_at(dir: impl AsFd, name: &std::ffi::OsStr, path: &Path) -> io::Result<()> {
    match nix::unistd::unlinkat(&dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        // A directory (EISDIR on Linux, EPERM where POSIX says so).
        Err(Errno::EISDIR | Errno::EPERM) => remove_any(path),
        Err(e) => Err(e.into()),
    }
}

/// Open `path` for reading without following a symlink, in its directories either: a link at the
/// file itself is ELOOP, one at a directory the error of `open_dir_nofollow`. O_NONBLOCK keeps
/// open(2) from hanging on a FIFO a child put there; it does nothing for regular files.
pub(crate) fn open_read_nofollow(path: &Path) -> io::Result<File> {
    let (dir, name) = parent_and_name(path)?;
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    Ok(File::from(nix::fcntl::openat(&dir, name, flags, Mode::empty())?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn planted_links_and_directories_are_removed_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let link = dir.path().join("attempt-2.stdout");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        use std::io::Write;
        open_append_private(&link).unwrap().write_all(b"output").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert_eq!(std::fs::read_to_string(&link).unwrap(), "output");

        let planted = dir.path().join("attempt-3.stderr");
        std::fs::create_dir_all(planted.join("sub")).unwrap();
        std::os::unix::fs::symlink(&victim, planted.join("sub/link")).unwrap();
        open_append_private(&planted).unwrap();
        assert!(planted.is_file());
        assert!(victim.exists());
    }

    #[test]
    fn directories_are_created_private_and_a_planted_link_on_the_way_is_refused_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777;
        // In a directory that exists (from its descriptor), then several levels at once (the walk).
        let step = dir.path().join("step");
        open_dir_nofollow(&step, true).unwrap();
        assert_eq!(mode(&step), 0o700);
        open_dir_nofollow(&step, true).unwrap(); // already there: opened
        let deep = dir.path().join("a/b/c");
        open_dir_nofollow(&deep, true).unwrap();
        assert_eq!((mode(&dir.path().join("a")), mode(&deep)), (0o700, 0o700));
        // A link planted at the new directory's name, or at a directory on the way, to a
        // directory elsewhere: refused, and nothing is made in its target.
        let elsewhere = tempfile::tempdir().unwrap();
        let link = dir.path().join("planted");
        std::os::unix::fs::symlink(elsewhere.path(), &link).unwrap();
        let e = open_dir_nofollow(&link, true).unwrap_err();
        assert!(e.to_string().starts_with(&format!("{} is a symbolic link", link.display())), "{e}");
        let e = open_dir_nofollow(&link.join("step"), true).unwrap_err();
        assert!(e.to_string().starts_with(&format!("{} is a symbolic link", link.display())), "{e}");
        assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
        // A file where the directory should be.
        std::fs::write(dir.path().join("file"), "").unwrap();
        let e = open_dir_nofollow(&dir.path().join("file"), true).unwrap_err();
        assert_eq!(e.to_string(), format!("{}/file: ENOTDIR: Not a directory", dir.path().display()));
    }

    #[test]
    fn existing_regular_files_are_appended_to() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attempt-1.stdout");
        std::fs::write(&path, "before\n").unwrap();
        use std::io::Write;
        open_append_private(&path).unwrap().write_all(b"after\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "before\nafter\n");
    }

    #[test]
    fn reading_never_follows_a_link_at_a_directory_either() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("real")).unwrap();
        std::fs::write(dir.path().join("real/attempt-1.stderr"), "planted").unwrap();
        std::os::unix::fs::symlink(dir.path().join("real"), dir.path().join("step")).unwrap();
        let e = open_read_nofollow(&dir.path().join("step/attempt-1.stderr")).unwrap_err();
        assert!(e.to_string().starts_with(&format!("{}/step is a symbolic link", dir.path().display())), "{e}");
        let e = open_read_nofollow(&dir.path().join("real/missing")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        std::os::unix::fs::symlink(dir.path().join("real/attempt-1.stderr"), dir.path().join("real/link")).unwrap();
        let e = open_read_nofollow(&dir.path().join("real/link")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(Errno::ELOOP as i32));
    }

    #[test]
    fn stale_entries_are_removed_relative_to_their_directory_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let fd = open_dir_nofollow(dir.path(), false).unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let at = |name: &str| (std::ffi::OsString::from(name), dir.path().join(name));
        let (name, path) = at("attempt-1.error.json");
        remove_any_at(&fd, &name, &path).unwrap(); // nothing there: no error
        std::fs::write(&path, "stale").unwrap();
        remove_any_at(&fd, &name, &path).unwrap();
        assert!(std::fs::symlink_metadata(&path).is_err());
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        remove_any_at(&fd, &name, &path).unwrap();
        assert!(std::fs::symlink_metadata(&path).is_err());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        std::fs::create_dir_all(path.join("sub")).unwrap();
        remove_any_at(&fd, &name, &path).unwrap();
        assert!(std::fs::symlink_metadata(&path).is_err());
    }

    #[test]
    fn a_log_is_created_only_when_asked_and_an_existing_one_is_appended_to() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let fd = open_dir_nofollow(dir.path(), false).unwrap();
        let (name, path) = (std::ffi::OsString::from("attempt-1.stdout"), dir.path().join("attempt-1.stdout"));
        assert!(matches!(open_existing_log_at(&fd, &name, &path).unwrap(), ExistingLog::Missing));
        assert!(std::fs::symlink_metadata(&path).is_err(), "looking creates nothing");
        create_append_private_at(&fd, &name, &path).unwrap().write_all(b"first\n").unwrap();
        assert_eq!(std::fs::symlink_metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        // Created already (a second creation appends rather than truncates).
        create_append_private_at(&fd, &name, &path).unwrap().write_all(b"second\n").unwrap();
        let ExistingLog::Open(mut file, len) = open_existing_log_at(&fd, &name, &path).unwrap() else { panic!() };
        assert_eq!(len, 13);
        file.write_all(b"third\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "first\nsecond\nthird\n");
        // A planted link is removed, its target untouched, and counts as no log.
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let (name, path) = (std::ffi::OsString::from("attempt-2.stdout"), dir.path().join("attempt-2.stdout"));
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        assert!(matches!(open_existing_log_at(&fd, &name, &path).unwrap(), ExistingLog::Missing));
        assert!(std::fs::symlink_metadata(&path).is_err());
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        create_append_private_at(&fd, &name, &path).unwrap().write_all(b"out").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "out");
    }
}
