//! The terminal waymark runs on, put back as a run found it. The steps ignore SIGTTOU, as the
//! runner does (`signals::unblock_inherited_signals`), so a step in its background process group
//! may change the terminal's settings where it used to be stopped for good: `stty -echo` before a
//! password prompt whose read then fails, and the user's shell would be left without echo.

use std::os::fd::AsFd;

/// The settings of the controlling terminal when a run started; dropped, it puts them back if a
/// step changed them, and says so.
pub(crate) struct Kept {
    tty: std::fs::File,
    settings: nix::sys::termios::Termios,
}

impl Kept {
    /// The controlling terminal's settings, if waymark has one (never under cron).
    pub(crate) fn now() -> Option<Kept> {
        use std::os::unix::fs::OpenOptionsExt;
        let tty = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOCTTY).open("/dev/tty").ok()?;
        let settings = nix::sys::termios::tcgetattr(tty.as_fd()).ok()?;
        Some(Kept { tty, settings })
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        use nix::sys::termios::{SetArg, tcgetattr, tcsetattr};
        if tcgetattr(self.tty.as_fd()).is_ok_and(|now| now != self.settings)
            && tcsetattr(self.tty.as_fd(), SetArg::TCSADRAIN, &self.settings).is_ok()
        {
            note!(
                "waymark: a step changed the terminal's settings (`stty -echo`, say); they are put back as the run found them"
            );
        }
    }
}
