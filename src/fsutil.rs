//! Opening per-attempt files safely. A child can write into its step's log directory, so whatever
//! it planted at the path of a later attempt's file (a symlink to a victim, a directory) is removed
//! before the runner opens that path, and the runner never follows a link there.

use nix::fcntl::OFlag;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Remove what is at `path` unless it is a regular file (or whatever it is, with `also_files`).
/// Never follows a symlink.
fn remove_entry(path: &Path, also_files: bool) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_file() && !also_files => Ok(()),
        // remove_dir_all does not follow symlinks inside the tree either.
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Remove what is at `path` unless it is a regular file. Never follows a symlink.
pub fn remove_unless_regular(path: &Path) -> io::Result<()> {
    remove_entry(path, false)
}

/// Remove whatever is at `path`: a file, a symlink (never its target), a directory tree.
pub fn remove_any(path: &Path) -> io::Result<()> {
    remove_entry(path, true)
}

/// Open `path` for appending (creating it 0600), refusing to follow a symlink.
pub fn open_append_private(path: &Path) -> io::Result<File> {
    remove_unless_regular(path)?;
    OpenOptions::new().create(true).append(true).mode(0o600).custom_flags(OFlag::O_NOFOLLOW.bits()).open(path)
}

/// Open `path` for reading without following a symlink (ELOOP if it is one). O_NONBLOCK keeps
/// open(2) from hanging on a FIFO a child put there; it does nothing for regular files.
pub fn open_read_nofollow(path: &Path) -> io::Result<File> {
    OpenOptions::new().read(true).custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK).bits()).open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn existing_regular_files_are_appended_to() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attempt-1.stdout");
        std::fs::write(&path, "before\n").unwrap();
        use std::io::Write;
        open_append_private(&path).unwrap().write_all(b"after\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "before\nafter\n");
    }
}
